"""The 5 examples through a real stack (ng_run + ng_collect_rollouts), with a scripted fake LLM.

The resources server runs with `expose_tools_over_mcp: true` as in its config, so its `/seed_session` and
`/verify` are the wrapped ones; simple_agent calls the tools over HTTP. Row 1 answers from what check_stock read,
row 3 first asks for more plums than there are (a 409 the agent hands back to the model) and ships what the error
says is left, and row 4's answer names the wrong number (reward 0.0 although the stock is right).
"""

import json

from nemo_gym.testing.e2e import collect_examples_e2e
from nemo_gym.testing.script import answer_rule, step, steps_rule, tool_call


def move(tool, item, quantity):
    return tool_call(tool, {"item": item, "quantity": quantity})


PLUMS = "Ship 5 plums"
PEARS = "How many pears"

SCRIPT = [
    steps_rule("Ship 4 apples", step(move("ship", "apples", 4)), step("There are 8 apples left.")),
    answer_rule(PEARS, tool_call("check_stock", {"item": "pears"}), tool_outputs=0),
    answer_rule(PEARS, "We have 7 pears.", last_tool_output_contains='"quantity":7'),
    steps_rule(
        "Restock 10 bananas",
        step(move("restock", "bananas", 10)),
        step(move("ship", "bananas", 6)),
        step("6 bananas remain."),
    ),
    answer_rule(PLUMS, move("ship", "plums", 5), tool_outputs=0),
    answer_rule(PLUMS, move("ship", "plums", 3), last_tool_output_contains="only 3 plums in stock"),
    answer_rule(PLUMS, "None are left: 0 plums.", last_tool_output_contains='"remaining":0'),
    steps_rule(
        "Ship 2 cherries",
        step(move("ship", "cherries", 2)),
        step(move("restock", "lemons", 3)),
        step("We now have 3 lemons."),
    ),
]


def test_examples_end_to_end(tmp_path):
    rows = collect_examples_e2e("example_mcp_tools", tmp_path, script=SCRIPT)
    assert [r["reward"] for r in rows] == [1.0, 1.0, 1.0, 1.0, 0.0]
    assert [r["stock_ok"] for r in rows] == [True] * 5
    assert [r["reported_quantity"] for r in rows] == [8, 7, 6, 0, 4]
    assert rows[4]["answer_ok"] is False
    assert [r["tool_calls"] for r in rows] == [
        ["ship"],
        ["check_stock"],
        ["restock", "ship"],
        ["ship", "ship"],
        ["ship", "restock"],
    ]
    plum_outputs = [
        json.loads(item["output"]) for item in rows[3]["response"]["output"] if item["type"] == "function_call_output"
    ]
    assert plum_outputs[0]["status"] == 409 and "only 3 plums" in json.dumps(plum_outputs[0])
    assert plum_outputs[1] == {"item": "plums", "shipped": 3, "remaining": 0}
