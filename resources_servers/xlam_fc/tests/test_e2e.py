"""The 5 examples through a real stack (ng_run + ng_collect_rollouts), with a scripted fake LLM.

The model makes its calls in its first step; the server implements none of the tools, so the agent hands back an
"unknown tool" error for each, and the model's second step is a closing message. Row 1 makes two calls in one step,
row 3 (no tool needed) answers directly, row 4 adds an optional argument (tolerated). Row 2's call has cut-off
arguments, which count as no arguments: no match, reward 0.0.
"""

import json

from nemo_gym.testing.e2e import collect_examples_e2e
from nemo_gym.testing.script import answer_rule, rule
from nemo_gym.testing.script import tool_call as call


def first_step(request_part, *items):
    """The model's first step for the row whose request contains `request_part`."""
    return answer_rule(request_part, *items, tool_outputs=0)


SCRIPT = [
    first_step(
        "250 euros in Japanese yen",
        call("convert_currency", {"amount": 250, "from_currency": "EUR", "to_currency": "JPY"}),
    ),
    first_step(
        "in Lisbon and in Porto",
        call("get_weather", {"city": "Lisbon", "unit": "celsius"}),
        call("get_weather", {"city": "Porto", "unit": "celsius"}),
    ),
    # Arguments cut off mid-list: not JSON.
    first_step(
        "Quarterly review",
        call("create_event", '{"title": "Quarterly review", "date": "2025-06-30", "attendees": ["Pri'),
    ),
    first_step("capital of Canada", "The capital of Canada is Ottawa."),
    first_step(
        "Vietnamese restaurant in Melbourne",
        call("search_restaurants", {"cuisine": "Vietnamese", "city": "Melbourne", "max_price": 2}),
    ),
    # Every rollout that called something: one closing message once the tool results are in.
    rule("I could not complete that.", name="after the calls", tool_outputs={"min": 1}),
]


def test_examples_end_to_end(tmp_path):
    rows = collect_examples_e2e("xlam_fc", tmp_path, script=SCRIPT)
    assert len(rows) == 5
    assert [r["reward"] for r in rows] == [1.0, 1.0, 0.0, 1.0, 1.0]
    assert [(r["num_expected"], r["num_predicted"], r["num_correct"]) for r in rows] == [
        (1, 1, 1),
        (2, 2, 2),
        (1, 1, 0),
        (0, 0, 0),
        (1, 1, 1),
    ]
    assert rows[2]["predicted_calls"] == [{"name": "create_event", "arguments": {}}]
    assert rows[4]["predicted_calls"][0]["arguments"]["max_price"] == 2

    types = [[item["type"] for item in row["response"]["output"]] for row in rows]
    assert types[1] == ["function_call", "function_call", "function_call_output", "function_call_output", "message"]
    assert types[3] == ["message"]
    first_output = json.loads(rows[0]["response"]["output"][1]["output"])
    assert first_output["tool"] == "convert_currency" and "unknown tool" in first_output["error"]
