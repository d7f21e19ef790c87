import asyncio
import json
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from nemo_gym.openai_utils import NeMoGymResponse
from nemo_gym.server_utils import ServerClient
from resources_servers.example_multi_step.app import (
    ExampleMultiStepResourcesServer,
    ExampleMultiStepResourcesServerConfig,
    ExampleMultiStepVerifyRequest,
    synonym_value,
)

DATA_PATH = Path(__file__).resolve().parents[1] / "data" / "example.jsonl"
PARAMS = {"input": [{"role": "user", "content": "Glossary: Hot: Scorching, Sweltering. Which words mean hot?"}]}
EXPECTED = [928, 1060]  # Scorching, Sweltering


def make_server() -> ExampleMultiStepResourcesServer:
    config = ExampleMultiStepResourcesServerConfig(
        host="127.0.0.1", port=0, entrypoint="app.py", name="example_multi_step", domain="instruction_following"
    )
    return ExampleMultiStepResourcesServer(
        config=config, server_client=ServerClient(head_server_config=None, global_config_dict={})
    )


def make_response(*output: dict) -> NeMoGymResponse:
    return NeMoGymResponse(id="resp_1", created_at=0, model="test-model", output=list(output))


def message(text: str) -> dict:
    return {
        "id": "msg_1",
        "type": "message",
        "role": "assistant",
        "status": "completed",
        "content": [{"type": "output_text", "text": text, "annotations": []}],
    }


def call(name: str, arguments, call_id: str = "call_1") -> dict:
    if not isinstance(arguments, str):
        arguments = json.dumps(arguments)
    return {"type": "function_call", "name": name, "arguments": arguments, "call_id": call_id}


def extract(values) -> dict:
    return call("extract_synonym_values", {"synonym_values": values}, call_id="call_extract")


def verify(response: NeMoGymResponse, expected=EXPECTED, **fields):
    fields.setdefault("minefield_label", "Hot")
    fields.setdefault("minefield_label_value", 299)
    body = ExampleMultiStepVerifyRequest(
        responses_create_params=PARAMS, response=response, expected_synonym_values=expected, **fields
    )
    return asyncio.run(make_server().verify(body))


def test_synonym_value_is_the_sum_of_code_points():
    assert synonym_value("Warm") == ord("W") + ord("a") + ord("r") + ord("m") == 407
    assert synonym_value("") == 0


# ----------------------------------------------------------------------------------------------- verify branches


def test_exact_list_after_lookups_gets_reward_one():
    result = verify(
        make_response(
            call("get_synonym_value", {"synonym": "Scorching"}),
            {"type": "function_call_output", "call_id": "call_1", "output": '{"synonym_value": 928}'},
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
    with TestClient(make_server().build_app()) as client:
        assert client.post("/get_synonym_value", json={"synonym": "Warm"}).json() == {"synonym_value": 407}
        assert client.post("/extract_synonym_values", json={"synonym_values": [407]}).json() == {"success": True}
        assert client.post("/get_synonym_value", json={}).status_code == 422

        response = make_response(extract([928, 1060]), message("Done."))
        verified = client.post(
            "/verify",
            json={
                "responses_create_params": PARAMS,
                "response": response.model_dump(mode="json"),
                "expected_synonym_values": EXPECTED,
                "expected_synonyms": ["Scorching", "Sweltering"],
                "minefield_label": "Hot",
                "minefield_label_value": 299,
                "agent_ref": {"name": "not echoed"},
            },
        )
        assert verified.status_code == 200
        body = verified.json()
        assert body["reward"] == 1.0 and body["accuracy"] is True
        assert body["expected_synonyms"] == ["Scorching", "Sweltering"]
        assert "agent_ref" not in body


# ----------------------------------------------------------------------------------------------- data


def load_rows() -> list[dict]:
    return [json.loads(line) for line in DATA_PATH.read_text().splitlines()]


def test_example_rows_validate_and_are_consistent():
    rows = load_rows()
    assert len(rows) == 5
    placeholder = make_response(message("placeholder")).model_dump(mode="json")
    for row in rows:
        request = ExampleMultiStepVerifyRequest.model_validate({**row, "response": placeholder})
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
    server = make_server()
    for row in load_rows():
        ideal = make_response(
            *[
                call("get_synonym_value", {"synonym": synonym}, call_id=f"c{i}")
                for i, synonym in enumerate(row["expected_synonyms"])
            ],
            extract(row["expected_synonym_values"]),
            message("Done."),
        )
        body = ExampleMultiStepVerifyRequest.model_validate({**row, "response": ideal.model_dump(mode="json")})
        assert asyncio.run(server.verify(body)).reward == 1.0
