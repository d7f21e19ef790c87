"""The 5 examples through a real stack (ng_run + ng_collect_rollouts), with a scripted fake LLM.

Every rollout looks values up with get_synonym_value, one call per model step, then reports them with
extract_synonym_values and ends with a message. Rows 0, 1 and 3 report the right list (row 3 only after a first
extract call with malformed arguments, which the agent answers with an error); row 2 reports the right values in
the wrong order, and row 4 looks up the term itself instead of its first synonym.
"""

import json

from nemo_gym.testing.e2e import collect_examples_e2e
from nemo_gym.testing.script import step, steps_rule, tool_call


def call(name, arguments):
    return step(tool_call(name, arguments))


def lookup(synonym):
    return call("get_synonym_value", {"synonym": synonym})


def report(values):
    return call("extract_synonym_values", {"synonym_values": values})


DONE = step("I have reported the values.")


# One rule per row: the row's question picks it, the model step number picks the reply.
SCRIPT = [
    steps_rule("40 degrees Celsius", lookup("Scorching"), lookup("Sweltering"), report([928, 1060]), DONE),
    steps_rule(
        "awake for thirty hours",
        lookup("Weary"), lookup("Drowsy"), lookup("Sleepy"), report([520, 648, 626]), DONE,
    ),
    # Right values, wrong order.
    steps_rule("four thousand years ago", lookup("Ancient"), lookup("Aged"), report([369, 706]), DONE),
    # A cut-off extract call first (not JSON: the agent makes no call and returns an error), then the right one.
    steps_rule(
        "no wind and no waves",
        lookup("Serene"), lookup("Tranquil"),
        call("extract_synonym_values", '{"synonym_values": [610, 848'),
        report([610, 848]), DONE,
    ),
    # The minefield: the term "Wet" itself instead of its synonym "Moist".
    steps_rule(
        "pulled out of the bathtub",
        lookup("Wet"), lookup("Damp"), lookup("Soaked"), report([304, 386, 599]), DONE,
    ),
]


def test_examples_end_to_end(tmp_path):
    rows = collect_examples_e2e("example_multi_step", tmp_path, script=SCRIPT)
    assert len(rows) == 5
    assert [r["reward"] for r in rows] == [1.0, 1.0, 0.0, 1.0, 0.0]
    assert [r["parsed_synonym_values"] for r in rows] == [
        [928, 1060],
        [520, 648, 626],
        [369, 706],
        [610, 848],
        [304, 386, 599],
    ]
    assert [r["order_instruction_following_failure"] for r in rows] == [False, False, True, False, False]
    assert [r["original_term_minefield_hit"] for r in rows] == [False, False, False, False, True]
    assert rows[4]["set_overlap"] == 2 / 3

    # The tools really ran: each lookup's output is the synonym's value computed by the server.
    first = rows[0]["response"]["output"]
    assert [item["type"] for item in first] == ["function_call", "function_call_output"] * 3 + ["message"]
    assert [json.loads(item["output"]) for item in first if item["type"] == "function_call_output"] == [
        {"synonym_value": 928},
        {"synonym_value": 1060},
        {"success": True},
    ]

    # Row 3: the malformed call got an error output, the corrected call a success; only the last one counts.
    outputs = [item["output"] for item in rows[3]["response"]["output"] if item["type"] == "function_call_output"]
    assert "not valid JSON" in json.loads(outputs[2])["error"]
    assert json.loads(outputs[3]) == {"success": True}
