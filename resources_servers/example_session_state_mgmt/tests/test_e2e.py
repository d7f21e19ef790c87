"""The 5 examples through a real stack (ng_run + ng_collect_rollouts), with a scripted fake LLM.

The 5 rollouts run at the same time against one server, each with its own counter seeded from its row's
`initial_count`. Rows 2 and 4 read the counter first, and their next step is scripted on the value they read, so
a rollout that saw another rollout's counter (or an unseeded one) would find no rule and fail. Row 3 increments
only twice instead of three times (reward 0.0); row 4 first sends a cut-off increment_counter call, which the
agent answers with an error without calling the tool, then the right one.
"""

import json

from nemo_gym.testing.e2e import collect_examples_e2e


def call(name, arguments):
    return {"output": [{"type": "function_call", "name": name, "arguments": arguments}]}


def increment(count):
    return call("increment_counter", {"count": count})


READ = call("get_counter_value", {})


def say(text):
    return {"output": [text]}


def rollout(request_part, *steps):
    """The row's request picks the rule, the model step number picks the reply."""
    return {"name": request_part, "match": {"last_user_contains": request_part}, "replies": list(steps)}


SCRIPT = [
    rollout("Add 3 to the counter, then add 4.", increment(3), increment(4), say("The counter is now 17.")),
    rollout("Subtract 5 from the counter once.", increment(-5), say("The counter is now -3.")),
    # Row 2 (seeded with 13): read, then add what the read value says is missing.
    {"match": {"last_user_contains": "ends at exactly 20", "tool_outputs": 0}, **READ},
    {"match": {"last_user_contains": "ends at exactly 20", "last_tool_output_contains": '"count":13'}, **increment(7)},
    {"match": {"last_user_contains": "ends at exactly 20", "tool_outputs": 2}, **say("The counter is now 20.")},
    # Row 3: one increment short.
    rollout("Add 1 to the counter three times", increment(1), increment(1), say("Done, I added 1 three times.")),
    # Row 4 (seeded with 21): read, a cut-off call, the right call on the value read, read again, answer.
    {"match": {"last_user_contains": "Double the counter", "tool_outputs": 0}, **READ},
    {
        "match": {"last_user_contains": "Double the counter", "last_tool_output_contains": '"count":21'},
        **call("increment_counter", '{"count": 2'),
    },
    {
        "match": {"last_user_contains": "Double the counter", "last_tool_output_contains": "not valid JSON"},
        **increment(21),
    },
    {"match": {"last_user_contains": "Double the counter", "last_tool_output_contains": '"success":true'}, **READ},
    {
        "match": {"last_user_contains": "Double the counter", "last_tool_output_contains": '"count":42'},
        **say("The counter is now 42."),
    },
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
