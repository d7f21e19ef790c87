"""The 5 examples through a real stack (ng_run + ng_collect_rollouts), with a scripted fake LLM.

The 5 rollouts run at the same time against one server, each with its own counter seeded from its row's
`initial_count`. Rows 2 and 4 read the counter first, and their next step is scripted on the value they read, so
a rollout that saw another rollout's counter (or an unseeded one) would find no rule and fail. Row 3 increments
only twice instead of three times (reward 0.0); row 4 first sends a cut-off increment_counter call, which the
agent answers with an error without calling the tool, then the right one.
"""

import json

from nemo_gym.testing.e2e import collect_examples_e2e
from nemo_gym.testing.script import answer_rule, step, steps_rule, tool_call


def increment(count):
    return tool_call("increment_counter", {"count": count})


READ = tool_call("get_counter_value", {})
ROW_2, ROW_4 = "ends at exactly 20", "Double the counter"

# The row's request picks the rule; in a steps_rule the model step number picks the reply.
SCRIPT = [
    steps_rule(
        "Add 3 to the counter, then add 4.", step(increment(3)), step(increment(4)), step("The counter is now 17.")
    ),
    steps_rule("Subtract 5 from the counter once.", step(increment(-5)), step("The counter is now -3.")),
    # Row 2 (seeded with 13): read, then add what the read value says is missing.
    answer_rule(ROW_2, READ, tool_outputs=0),
    answer_rule(ROW_2, increment(7), last_tool_output_contains='"count":13'),
    answer_rule(ROW_2, "The counter is now 20.", tool_outputs=2),
    # Row 3: one increment short.
    steps_rule(
        "Add 1 to the counter three times", step(increment(1)), step(increment(1)), step("Done, I added 1 three times.")
    ),
    # Row 4 (seeded with 21): read, a cut-off call, the right call on the value read, read again, answer.
    answer_rule(ROW_4, READ, tool_outputs=0),
    answer_rule(ROW_4, tool_call("increment_counter", '{"count": 2'), last_tool_output_contains='"count":21'),
    answer_rule(ROW_4, increment(21), last_tool_output_contains="not valid JSON"),
    answer_rule(ROW_4, READ, last_tool_output_contains='"success":true'),
    answer_rule(ROW_4, "The counter is now 42.", last_tool_output_contains='"count":42'),
]


def test_examples_end_to_end(tmp_path):
    rows = collect_examples_e2e("example_session_state_mgmt", tmp_path, script=SCRIPT)
    assert len(rows) == 5
    assert [r["reward"] for r in rows] == [1.0, 1.0, 1.0, 0.0, 1.0]
    assert [r["final_count"] for r in rows] == [17, -3, 20, 2, 42]
    assert [r["expected_count"] for r in rows] == [17, -3, 20, 3, 42]

    outputs = [
        [json.loads(item["output"]) for item in row["response"]["output"] if item["type"] == "function_call_output"]
        for row in rows
    ]
    assert outputs[0] == [{"success": True}, {"success": True}]
    assert outputs[2] == [{"count": 13}, {"success": True}]  # the seeded value, not another rollout's
    assert outputs[4][0] == {"count": 21}
    assert "not valid JSON" in outputs[4][1]["error"]
    assert outputs[4][2:] == [{"success": True}, {"count": 42}]
    assert rows[4]["response"]["output"][-1]["type"] == "message"
