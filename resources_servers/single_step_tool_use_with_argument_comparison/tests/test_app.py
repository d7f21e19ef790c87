import json

import pytest
from fastapi.testclient import TestClient
from pydantic import ValidationError

from nemo_gym.testing.responses import function_call as call
from nemo_gym.testing.responses import make_response, message, reasoning
from nemo_gym.testing.servers import Verifier, example_rows, make_server, server_config
from resources_servers.single_step_tool_use_with_argument_comparison.app import (
    SingleStepToolUseArgumentComparisonResourcesServer as Server,
)
from resources_servers.single_step_tool_use_with_argument_comparison.app import (
    SingleStepToolUseArgumentComparisonResourcesServerConfig as Config,
)
from resources_servers.single_step_tool_use_with_argument_comparison.app import (
    SingleStepToolUseArgumentComparisonVerifyRequest as VerifyRequest,
)
from resources_servers.single_step_tool_use_with_argument_comparison.app import StepRewardCategory as Category

PARAMS = {"input": [{"role": "user", "content": "Please cancel order 77120, I picked the wrong size."}]}
CANCEL = {"order_id": "77120", "reason": "picked the wrong size"}


def new_server(threshold: float = 0.2, float_threshold: float = 1e-6) -> Server:
    comparator = {"word_count_similarity_threshold": threshold, "floating_point_comparison_threshold": float_threshold}
    return make_server(
        Server, name="single_step_tool_use_with_argument_comparison", domain="agent",
        tool_call_comparator_config=comparator,
    )


def expected_call(name: str, arguments: dict) -> dict:
    return {"type": "function_call", "name": name, "arguments": json.dumps(arguments)}


EXPECTED_CANCEL = expected_call("cancel_order", CANCEL)
EXPECTED_MESSAGE = {"type": "message", "content": "Your order has been cancelled."}
VERIFY = Verifier(new_server, VerifyRequest, PARAMS, expected_action=EXPECTED_CANCEL)


def verify(*output: dict, expected=None, server=None):
    result = VERIFY(*output, server=server, expected_action=expected or EXPECTED_CANCEL)
    return result.reward, result.category


def compare(expected_arguments: dict, actual_arguments, **server_options):
    return verify(
        call("f", actual_arguments),
        expected=expected_call("f", expected_arguments),
        server=new_server(**server_options),
    )


# ----------------------------------------------------------------------------------------------- which action


@pytest.mark.parametrize(
    "output",
    [
        [],
        [reasoning("thinking")],
        [{"id": "m", "type": "message", "role": "assistant", "content": [{"type": "refusal", "refusal": "no"}]}],
    ],
    ids=["empty", "reasoning-only", "refusal-only"],
)
def test_no_action_found(output):
    assert verify(*output) == (0.0, Category.NO_ACTION_FOUND)
    assert verify(*output, expected=EXPECTED_MESSAGE) == (0.0, Category.NO_ACTION_FOUND)


def test_expected_message_any_text_counts():
    assert verify(message("Done, it's cancelled!"), expected=EXPECTED_MESSAGE) == (
        1.0,
        Category.EXPECTED_CHAT_MESSAGE_FOUND,
    )
    plain = {"type": "message", "role": "assistant", "content": "ok"}
    assert verify(plain, expected=EXPECTED_MESSAGE) == (1.0, Category.EXPECTED_CHAT_MESSAGE_FOUND)


def test_expected_message_but_tool_call():
    result = verify(message("Let me check."), call("cancel_order", CANCEL), expected=EXPECTED_MESSAGE)
    assert result == (0.0, Category.NO_EXPECTED_CHAT_MESSAGE)  # a tool call anywhere is the action


def test_expected_tool_call_but_message():
    assert verify(message("Sure, I'll cancel it.")) == (0.0, Category.NO_EXPECTED_TOOL_CALL)


def test_only_the_first_tool_call_counts():
    assert verify(call("cancel_order", CANCEL), call("lookup_order", {"order_id": "1"})) == (
        1.0,
        Category.EXPECTED_TOOL_CALL,
    )
    assert verify(call("lookup_order", {"order_id": "1"}), call("cancel_order", CANCEL)) == (
        0.0,
        Category.UNEXPECTED_TOOL,
    )


def test_undecodable_arguments():
    for arguments in ("{not json", "", "[" * 100_000):
        assert verify(call("cancel_order", arguments)) == (0.0, Category.ARGUMENTS_DECODE_ERROR)


# ----------------------------------------------------------------------------------------------- argument values


def test_exact_and_paraphrased_arguments_match():
    assert verify(call("cancel_order", CANCEL)) == (1.0, Category.EXPECTED_TOOL_CALL)
    # Same words, other case and spacing: 4 / (4 + 4) = 0.5 >= 0.2
    assert verify(call("cancel_order", {"order_id": "77120", "reason": "Picked  the WRONG size"}))[0] == 1.0
    # 3 common words, one extra: 3 / (4 + 4) = 0.375 >= 0.2
    rephrased = {"order_id": "77120", "reason": "ordered the wrong size"}
    assert verify(call("cancel_order", rephrased)) == (1.0, Category.EXPECTED_TOOL_CALL)


@pytest.mark.parametrize(
    "expected, actual, category",
    [
        ({"q": "wrong size"}, {"q": "bad colour"}, Category.ARGUMENT_VALUE_DIFFERENT),  # 0 common words
        ({"id": "77120"}, {"id": "77121"}, Category.ARGUMENT_VALUE_DIFFERENT),  # one word: exact match
        ({"id": "Paris"}, {"id": "paris"}, Category.ARGUMENT_VALUE_DIFFERENT),  # ... case included
        ({"q": "wrong size"}, {"q": "size"}, Category.ARGUMENT_VALUE_DIFFERENT),  # one side has one word
        ({"n": 3}, {"n": 4}, Category.ARGUMENT_VALUE_DIFFERENT),
        ({"x": 1.5}, {"x": 1.6}, Category.ARGUMENT_VALUE_DIFFERENT),
        ({"flag": True}, {"flag": False}, Category.ARGUMENT_VALUE_DIFFERENT),
        ({"tags": ["a", "b"]}, {"tags": ["a", "c"]}, Category.ARGUMENT_VALUE_DIFFERENT),
        ({"n": 3}, {"n": "3"}, Category.ARGUMENT_VALUE_TYPE_DIFFERENT),
        ({"n": 1}, {"n": True}, Category.ARGUMENT_VALUE_TYPE_DIFFERENT),  # a boolean is not a number
        ({"flag": True}, {"flag": 1}, Category.ARGUMENT_VALUE_TYPE_DIFFERENT),
        ({"id": "7"}, {"id": None}, Category.ARGUMENT_VALUE_TYPE_DIFFERENT),
        ({"id": None}, {"id": "7"}, Category.ARGUMENT_VALUE_TYPE_DIFFERENT),
        ({"a": {"b": 1}}, {"a": [1]}, Category.ARGUMENT_VALUE_TYPE_DIFFERENT),
        ({"id": "7"}, ["7"], Category.ARGUMENT_VALUE_TYPE_DIFFERENT),  # the arguments are not an object
        ({"id": "7"}, {"id": "7", "extra": 1}, Category.ARGUMENT_OBJECT_KEYS_DIFFERENT),
        ({"id": "7", "reason": "x y"}, {"id": "7"}, Category.ARGUMENT_OBJECT_KEYS_DIFFERENT),
        ({"a": {"b": 1}}, {"a": {"c": 1}}, Category.ARGUMENT_OBJECT_KEYS_DIFFERENT),
        ({"tags": ["a", "b"]}, {"tags": ["a"]}, Category.ARGUMENT_LIST_LENGTH_DIFFERENT),
    ],
)
def test_argument_mismatches(expected, actual, category):
    assert compare(expected, actual) == (0.0, category)


@pytest.mark.parametrize(
    "expected, actual",
    [
        ({"x": 1.5}, {"x": 1.5000000001}),  # within the float threshold
        ({"x": 2.0}, {"x": 2}),  # JSON numbers: 2 and 2.0 are the same value
        ({"n": 2}, {"n": 2.0}),
        ({"flag": False, "none": None}, {"flag": False, "none": None}),
        ({"a": {"b": [1, {"c": "two words"}]}}, {"a": {"b": [1, {"c": "two  WORDS"}]}}),
        ({}, {}),
    ],
)
def test_argument_matches(expected, actual):
    assert compare(expected, actual) == (1.0, Category.EXPECTED_TOOL_CALL)


def test_thresholds_come_from_the_config():
    # 1 common word of 2 + 2: similarity 0.25
    assert compare({"q": "wrong size"}, {"q": "wrong colour"}, threshold=0.25) == (1.0, Category.EXPECTED_TOOL_CALL)
    assert compare({"q": "wrong size"}, {"q": "wrong colour"}, threshold=0.26) == (
        0.0,
        Category.ARGUMENT_VALUE_DIFFERENT,
    )
    # With threshold 0, any two strings of two words or more match.
    assert compare({"q": "wrong size"}, {"q": "bad colour"}, threshold=0.0) == (1.0, Category.EXPECTED_TOOL_CALL)
    # The similarity is at most 0.5: a threshold above it rejects even identical multi-word strings.
    assert compare({"q": "wrong size"}, {"q": "wrong size"}, threshold=0.6) == (0.0, Category.ARGUMENT_VALUE_DIFFERENT)
    # Single words are compared exactly, whatever the threshold.
    assert compare({"q": "size"}, {"q": "size"}, threshold=0.6) == (1.0, Category.EXPECTED_TOOL_CALL)
    assert compare({"x": 1.0}, {"x": 1.05}, float_threshold=0.1) == (1.0, Category.EXPECTED_TOOL_CALL)


# ----------------------------------------------------------------------------------------------- request + config


@pytest.mark.parametrize(
    "expected_action",
    [
        {"type": "function_call", "name": "f", "arguments": "{oops"},
        {"type": "function_call", "name": "f", "arguments": "[1]"},
        {"type": "function_call", "name": "f"},
        {"type": "tool", "name": "f", "arguments": "{}"},
        {"type": "message"},
    ],
    ids=["invalid-json", "json-array", "no-arguments", "unknown-type", "no-content"],
)
def test_malformed_expected_actions_are_rejected(expected_action):
    with pytest.raises(ValidationError):
        VerifyRequest(responses_create_params=PARAMS, response=make_response(), expected_action=expected_action)


def test_config_requires_the_word_threshold():
    with pytest.raises(ValidationError):
        server_config(Config, "x", domain="agent", tool_call_comparator_config={})
    comparator = {"word_count_similarity_threshold": 0.1}
    config = server_config(Config, "x", domain="agent", tool_call_comparator_config=comparator)
    assert config.tool_call_comparator_config.floating_point_comparison_threshold == 1e-6


def test_verify_response_echoes_the_expected_action():
    result = VERIFY(call("cancel_order", CANCEL))
    assert result.expected_action.name == "cancel_order"
    assert result.model_dump(mode="json")["category"] == Category.EXPECTED_TOOL_CALL.value


# ----------------------------------------------------------------------------------------------- over HTTP


def test_http_verify():
    with TestClient(new_server().build_app()) as client:
        body = VERIFY.body(call("cancel_order", CANCEL))
        verified = client.post("/verify", json=body)
        assert verified.status_code == 200
        assert verified.json()["reward"] == 1.0
        assert verified.json()["category"] == "A tool call that matches the expected tool call was found"
        bad = {**body, "expected_action": {"type": "function_call", "name": "f", "arguments": "{oops"}}
        assert client.post("/verify", json=bad).status_code == 422


# ----------------------------------------------------------------------------------------------- data


def test_example_rows_validate():
    rows = example_rows(__file__)
    assert len(rows) == 5
    kinds = set()
    for row in rows:
        request = VERIFY.row_request(row, message("placeholder"))
        kinds.add(request.expected_action.type)
        if request.expected_action.type == "function_call":
            assert request.expected_action.name in {tool["name"] for tool in request.responses_create_params.tools}
    assert kinds == {"message", "function_call"}


def test_example_rows_reward_the_expert_action():
    server = new_server()
    for row in example_rows(__file__):
        action = row["expected_action"]
        if action["type"] == "message":
            step = message(action["content"])
        else:
            step = call(action["name"], action["arguments"])
        result = VERIFY.verify_row(row, step, server=server)
        assert result.reward == 1.0, result.category
