import json

import pytest
from fastapi.testclient import TestClient
from pydantic import ValidationError

from nemo_gym.testing.responses import function_call as call
from nemo_gym.testing.responses import function_call_output, make_response, message
from nemo_gym.testing.servers import Verifier, example_rows, make_server
from resources_servers.xlam_fc.app import XlamFcResourcesServer, XlamFcVerifyRequest, json_equal, parse_arguments

PARAMS = {"input": [{"role": "user", "content": "Weather in Lisbon and Porto?"}]}
LISBON = {"name": "get_weather", "arguments": {"city": "Lisbon", "unit": "celsius"}}
PORTO = {"name": "get_weather", "arguments": {"city": "Porto", "unit": "celsius"}}


def new_server() -> XlamFcResourcesServer:
    return make_server(XlamFcResourcesServer, name="xlam_fc", domain="agent")


VERIFY = Verifier(new_server, XlamFcVerifyRequest, PARAMS)


def verify(*output: dict, expected=(LISBON, PORTO)):
    return VERIFY(*output, expected_answers=list(expected))


# ----------------------------------------------------------------------------------------------- helpers


@pytest.mark.parametrize(
    "arguments, parsed",
    [
        ('{"a": 1}', {"a": 1}),
        ({"a": 1}, {"a": 1}),
        ("{not json", {}),
        ("[1, 2]", {}),
        ("null", {}),
        ("3", {}),
        (None, {}),
        ("[" * 100_000, {}),
    ],
    ids=["json-object", "dict", "invalid", "array", "null", "number", "none", "too-deep"],
)
def test_parse_arguments(arguments, parsed):
    assert parse_arguments(arguments) == parsed


def test_json_equal_keeps_booleans_apart_from_numbers():
    assert json_equal(1, 1.0)
    assert not json_equal(True, 1) and not json_equal(0, False)
    assert json_equal({"a": [1, True]}, {"a": [1.0, True]})
    assert not json_equal({"a": [1, True]}, {"a": [1, 1]})
    assert not json_equal([1, 2], [2, 1]) and not json_equal({"a": 1}, {"a": 1, "b": 2})


# ----------------------------------------------------------------------------------------------- verify branches


def test_all_expected_calls_and_nothing_else_gets_reward_one():
    result = verify(call("get_weather", PORTO["arguments"], "c2"), call("get_weather", LISBON["arguments"], "c1"))
    assert result.reward == 1.0  # order does not matter
    assert (result.num_expected, result.num_predicted, result.num_correct) == (2, 2, 2)
    assert result.predicted_calls == [PORTO, LISBON]
    assert result.expected_answers == [LISBON, PORTO]  # echoed


def test_extra_predicted_arguments_are_tolerated():
    result = verify(call("get_weather", {**LISBON["arguments"], "days": 1}), call("get_weather", PORTO["arguments"]))
    assert result.reward == 1.0


def test_missing_call_scores_zero():
    result = verify(call("get_weather", LISBON["arguments"]))
    assert result.reward == 0.0 and result.num_correct == 1 and result.num_predicted == 1


def test_extra_call_scores_zero():
    result = verify(
        call("get_weather", LISBON["arguments"]),
        call("get_weather", PORTO["arguments"]),
        call("get_weather", {"city": "Faro"}),
    )
    assert result.reward == 0.0 and result.num_correct == 2 and result.num_predicted == 3


def test_duplicate_call_cannot_match_twice():
    result = verify(call("get_weather", LISBON["arguments"]), call("get_weather", LISBON["arguments"]))
    assert result.reward == 0.0 and result.num_correct == 1


@pytest.mark.parametrize(
    "wrong_call",
    [
        call("get_forecast", PORTO["arguments"]),  # wrong name
        call("get_weather", {"city": "Porto"}),  # expected argument missing
        call("get_weather", {"city": "porto", "unit": "celsius"}),  # different value (case matters)
        call("get_weather", {"city": ["Porto"], "unit": "celsius"}),  # different type
    ],
    ids=["name", "missing-argument", "value", "type"],
)
def test_a_wrong_call_scores_zero(wrong_call):
    result = verify(call("get_weather", LISBON["arguments"]), wrong_call)
    assert result.reward == 0.0 and result.num_correct == 1


@pytest.mark.parametrize("arguments", ["{not json", "[1]", "null", ""])
def test_malformed_arguments_count_as_no_arguments(arguments):
    # Wrong whenever arguments were expected...
    result = verify(call("get_weather", arguments), expected=[LISBON])
    assert result.reward == 0.0 and result.predicted_calls == [{"name": "get_weather", "arguments": {}}]
    # ...and harmless when none were.
    assert verify(call("get_time", arguments), expected=[{"name": "get_time", "arguments": {}}]).reward == 1.0


def test_booleans_do_not_match_numbers():
    expected = [{"name": "set_alarm", "arguments": {"enabled": True, "volume": 1}}]
    assert verify(call("set_alarm", {"enabled": True, "volume": 1.0}), expected=expected).reward == 1.0
    assert verify(call("set_alarm", {"enabled": 1, "volume": 1}), expected=expected).reward == 0.0
    assert verify(call("set_alarm", {"enabled": True, "volume": True}), expected=expected).reward == 0.0


def test_expected_arguments_may_be_a_json_string_or_missing():
    expected = [{"name": "get_weather", "arguments": json.dumps(LISBON["arguments"])}, {"name": "get_time"}]
    result = verify(call("get_weather", LISBON["arguments"]), call("get_time", {"zone": "UTC"}), expected=expected)
    assert result.reward == 1.0


def test_no_expected_calls():
    assert verify(message("Ottawa."), expected=[]).reward == 1.0
    result = verify(call("search_flights", {}), message("Ottawa."), expected=[])
    assert result.reward == 0.0 and result.num_predicted == 1


def test_only_function_calls_count_as_predictions():
    result = verify(
        message('{"name": "get_weather", "arguments": {"city": "Lisbon"}}'),
        function_call_output({}, call_id="c1"),
        expected=[LISBON],
    )
    assert result.reward == 0.0 and result.num_predicted == 0


@pytest.mark.parametrize(
    "expected",
    [
        [{"arguments": {}}],  # no name
        [{"name": "f", "arguments": "{oops"}],  # arguments not JSON
        [{"name": "f", "arguments": "[1]"}],  # arguments not an object
        [{"name": "f", "arguments": 3}],
    ],
    ids=["no-name", "invalid-json", "json-array", "number"],
)
def test_malformed_expected_answers_are_rejected(expected):
    with pytest.raises(ValidationError):
        XlamFcVerifyRequest(responses_create_params=PARAMS, response=make_response(), expected_answers=expected)


# ----------------------------------------------------------------------------------------------- over HTTP


def test_http_verify_and_unknown_tools():
    with TestClient(new_server().build_app()) as client:
        body = VERIFY.body(call("get_weather", LISBON["arguments"]), expected_answers=[LISBON])
        verified = client.post("/verify", json=body)
        assert verified.status_code == 200
        assert verified.json()["reward"] == 1.0 and verified.json()["num_correct"] == 1
        # The tools are not implemented here: an agent posting a call gets a 404 to show the model.
        assert client.post("/get_weather", json={"city": "Lisbon"}).status_code == 404
        assert client.post("/verify", json={**body, "expected_answers": [{"arguments": {}}]}).status_code == 422


# ----------------------------------------------------------------------------------------------- data


def test_example_rows_validate():
    rows = example_rows(__file__)
    assert len(rows) == 5
    for row in rows:
        request = VERIFY.row_request(row, message("placeholder"))
        offered = {tool["name"] for tool in request.responses_create_params.tools}
        assert {answer["name"] for answer in request.expected_answers} <= offered


def test_example_rows_reward_the_expected_calls():
    server = new_server()
    for row in example_rows(__file__):
        calls = [call(a["name"], a["arguments"], f"c{i}") for i, a in enumerate(row["expected_answers"])]
        assert VERIFY.verify_row(row, *calls, message("Done."), server=server).reward == 1.0
