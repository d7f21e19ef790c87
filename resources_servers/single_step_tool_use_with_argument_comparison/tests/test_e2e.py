"""The 5 examples through a real stack (ng_run + ng_collect_rollouts), with a scripted fake LLM.

The agent block sets `max_steps: 1`, so each rollout is exactly one model call; a tool call in that step is still
sent to the server (which has no tools: an "unknown tool" error output), but the model gets no second turn.
Rows 0 and 1 start alike ("Where is my order 58213?"); row 1 already holds the lookup and its result, so the
script tells them apart by the tool results in the input. Row 2's search query is a paraphrase that
shares enough words with the expert's; row 3 passes the order id as a number instead of a string (0.0).
"""

from nemo_gym.testing.e2e import collect_examples_e2e
from nemo_gym.testing.script import rule
from nemo_gym.testing.script import tool_call as call


def step(match, item):
    return rule(item, **match)


SCRIPT = [
    step(
        {"last_user_contains": "Where is my order 58213?", "tool_outputs": 0},
        call("lookup_order", {"order_id": "58213"}),
    ),
    step(
        {"last_user_contains": "Where is my order 58213?", "last_tool_output_contains": "estimated_delivery"},
        "Good news: order 58213 has shipped and should arrive on 2 May.",
    ),
    step(
        {"last_user_contains": "change the password", "tool_outputs": 0},
        call("search_help_articles", {"query": "how to change password in mobile app"}),
    ),
    step(
        {"last_user_contains": "cancel order 77120", "tool_outputs": 0},
        call("cancel_order", {"order_id": 77120, "reason": "picked the wrong size"}),
    ),
    step(
        {"last_user_contains": "real person", "tool_outputs": 0},
        "Hello! I'm the shop's automated assistant. What can I do for you?",
    ),
    # Reached only if the agent asked the model for a second step, which max_steps: 1 forbids.
    rule("a second step", name="second step", tool_outputs={"min": 1}),
]


def test_examples_end_to_end(tmp_path):
    rows = collect_examples_e2e("single_step_tool_use_with_argument_comparison", tmp_path, script=SCRIPT)
    assert len(rows) == 5
    assert [r["reward"] for r in rows] == [1.0, 1.0, 1.0, 0.0, 1.0]
    assert [r["category"] for r in rows] == [
        "A tool call that matches the expected tool call was found",
        "A chat message was found as expected",
        "A tool call that matches the expected tool call was found",
        "The type of an argument value in a tool call is different than the expected type",
        "A chat message was found as expected",
    ]
    types = [[item["type"] for item in row["response"]["output"]] for row in rows]
    # One model step: the calls ran (and failed: no such tool here), and nothing came after them.
    assert types == [
        ["function_call", "function_call_output"],
        ["message"],
        ["function_call", "function_call_output"],
        ["function_call", "function_call_output"],
        ["message"],
    ]
    assert "unknown tool" in rows[0]["response"]["output"][1]["output"]
