import pytest
from fastapi.testclient import TestClient

from nemo_gym.openai_utils import NeMoGymResponse
from nemo_gym.testing.responses import function_call as call
from nemo_gym.testing.responses import function_call_output, make_response, message
from nemo_gym.testing.servers import Verifier, example_rows, make_server
from resources_servers.example_multi_step.app import (
    ExampleMultiStepResourcesServer,
    ExampleMultiStepVerifyRequest,
    synonym_value,
)

PARAMS = {"input": [{"role": "user", "content": "Glossary: Hot: Scorching, Sweltering. Which words mean hot?"}]}
EXPECTED = [928, 1060]  # Scorching, Sweltering


def new_server() -> ExampleMultiStepResourcesServer:
    return make_server(ExampleMultiStepResourcesServer, name="example_multi_step", domain="instruction_following")


VERIFY = Verifier(new_server, ExampleMultiStepVerifyRequest, PARAMS, minefield_label="Hot", minefield_label_value=299)


def extract(values) -> dict:
    return call("extract_synonym_values", {"synonym_values": values}, call_id="call_extract")


def verify(response: NeMoGymResponse, expected=EXPECTED, **fields):
    return VERIFY(response=response, expected_synonym_values=expected, **fields)


def test_synonym_value_is_the_sum_of_code_points():
    assert synonym_value("Warm") == ord("W") + ord("a") + ord("r") + ord("m") == 407
    assert synonym_value("") == 0


# ----------------------------------------------------------------------------------------------- verify branches


def test_exact_list_after_lookups_gets_reward_one():
    result = verify(
        make_response(
            call("get_synonym_value", {"synonym": "Scorching"}),
            function_call_output({"synonym_value": 928}),
            extract([928, 1060]),
            message("Done."),
        )
    )
    assert result.reward == 1.0
    assert result.accuracy is True
    assert result.parsed_synonym_values == [928, 1060]
    assert result.set_overlap == 1.0
    assert result.original_term_minefield_hit is False
    assert result.order_instruction_following_failure is False
    assert result.expected_synonym_values == EXPECTED  # dataset fields are echoed


def test_wrong_order_is_an_order_failure():
    result = verify(make_response(extract([1060, 928])))
    assert result.reward == 0.0
    assert result.set_overlap == 1.0
    assert result.order_instruction_following_failure is True


def test_partial_list_and_minefield_hit():
    result = verify(make_response(extract([928, 299])))
    assert result.reward == 0.0
    assert result.set_overlap == 0.5
    assert result.original_term_minefield_hit is True
    assert result.order_instruction_following_failure is False


def test_only_the_last_extract_call_counts():
    result = verify(make_response(extract([1, 2]), extract([928, 1060])))
    assert result.reward == 1.0
    result = verify(make_response(extract([928, 1060]), extract([1, 2])))
    assert result.reward == 0.0 and result.parsed_synonym_values == [1, 2]


def test_no_extract_call_reports_nothing():
    result = verify(make_response(call("get_synonym_value", {"synonym": "Scorching"}), message("928, 1060")))
    assert result.reward == 0.0
    assert result.parsed_synonym_values == []
    assert result.set_overlap == 0.0


@pytest.mark.parametrize(
    "arguments",
    [
        "{not json",  # not JSON at all
        '{"values": [928, 1060]}',  # wrong key
        '{"synonym_values": "928, 1060"}',  # not a list
        '{"synonym_values": [928, "a lot"]}',  # not integers
        "[928, 1060]",  # not an object
    ],
)
def test_malformed_last_extract_call_scores_zero_without_error(arguments):
    result = verify(make_response(extract([928, 1060]), call("extract_synonym_values", arguments)))
    assert result.reward == 0.0
    assert result.parsed_synonym_values == []


def test_empty_expected_list():
    # Nothing expected: an empty report (or none at all) is exact, and nothing is missing.
    result = verify(make_response(message("No term matches.")), expected=[])
    assert result.reward == 1.0 and result.set_overlap == 1.0
    result = verify(make_response(extract([5])), expected=[])
    assert result.reward == 0.0 and result.set_overlap == 1.0


def test_minefield_fields_are_optional():
    result = verify(make_response(extract([928, 1060])), minefield_label=None, minefield_label_value=None)
    assert result.reward == 1.0 and result.original_term_minefield_hit is False


# ----------------------------------------------------------------------------------------------- over HTTP


def test_http_tools_and_verify():
    with TestClient(new_server().build_app()) as client:
        assert client.post("/get_synonym_value", json={"synonym": "Warm"}).json() == {"synonym_value": 407}
        assert client.post("/extract_synonym_values", json={"synonym_values": [407]}).json() == {"success": True}
        assert client.post("/get_synonym_value", json={}).status_code == 422

        body = VERIFY.body(
            extract([928, 1060]), message("Done."), expected_synonym_values=EXPECTED,
            expected_synonyms=["Scorching", "Sweltering"], agent_ref={"name": "not echoed"},
        )
        verified = client.post("/verify", json=body)
        assert verified.status_code == 200
        body = verified.json()
        assert body["reward"] == 1.0 and body["accuracy"] is True
        assert body["expected_synonyms"] == ["Scorching", "Sweltering"]
        assert "agent_ref" not in body


# ----------------------------------------------------------------------------------------------- data


def test_example_rows_validate_and_are_consistent():
    rows = example_rows(__file__)
    assert len(rows) == 5
    for row in rows:
        request = VERIFY.row_request(row, message("placeholder"))
        # The expected values are the tool's values of the expected synonyms, and those synonyms are in the prompt.
        assert request.expected_synonym_values == [synonym_value(s) for s in request.expected_synonyms]
        assert request.minefield_label_value == synonym_value(request.minefield_label)
        prompt = request.responses_create_params.input[-1].content
        assert f"- {request.minefield_label}: {', '.join(request.expected_synonyms)}" in prompt
        assert {tool["name"] for tool in request.responses_create_params.tools} == {
            "get_synonym_value",
            "extract_synonym_values",
        }


def test_example_rows_reward_the_ideal_trajectory():
    server = new_server()
    for row in example_rows(__file__):
        lookups = [
            call("get_synonym_value", {"synonym": synonym}, call_id=f"c{i}")
            for i, synonym in enumerate(row["expected_synonyms"])
        ]
        ideal = [*lookups, extract(row["expected_synonym_values"]), message("Done.")]
        assert VERIFY.verify_row(row, *ideal, server=server).reward == 1.0
