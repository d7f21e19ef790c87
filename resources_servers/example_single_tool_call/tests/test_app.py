import asyncio
import json
from pathlib import Path

from fastapi.testclient import TestClient

from nemo_gym.base_resources_server import BaseVerifyRequest
from nemo_gym.openai_utils import NeMoGymResponse
from nemo_gym.server_utils import ServerClient
from resources_servers.example_single_tool_call.app import (
    ExampleSingleToolCallResourcesServer,
    ExampleSingleToolCallResourcesServerConfig,
    GetWeatherRequest,
)

DATA_PATH = Path(__file__).resolve().parents[1] / "data" / "example.jsonl"
PARAMS = {"input": [{"role": "user", "content": "What is the weather in Oslo?"}]}


def make_server() -> ExampleSingleToolCallResourcesServer:
    config = ExampleSingleToolCallResourcesServerConfig(
        host="127.0.0.1", port=0, entrypoint="app.py", name="example_single_tool_call", domain="agent"
    )
    return ExampleSingleToolCallResourcesServer(
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


def function_call(name: str, arguments: str, call_id: str = "call_1") -> dict:
    return {"type": "function_call", "name": name, "arguments": arguments, "call_id": call_id}


def verify(server, response: NeMoGymResponse):
    body = BaseVerifyRequest(responses_create_params=PARAMS, response=response)
    return asyncio.run(server.verify(body))


# ----------------------------------------------------------------------------------------------- verify


def test_verify_rewards_a_rollout_that_called_the_tool():
    result = verify(
        make_server(),
        make_response(
            function_call("get_weather", '{"city": "Oslo"}'),
            {"type": "function_call_output", "call_id": "call_1", "output": '{"city": "Oslo"}'},
            message("It is cold in Oslo: bring a coat."),
        ),
    )
    assert result.reward == 1.0
    assert result.called_get_weather is True
    # The request is echoed back.
    assert result.responses_create_params.input[0].content == "What is the weather in Oslo?"
    assert result.response.output[-1].content[0].text == "It is cold in Oslo: bring a coat."


def test_verify_answers_one_even_without_the_tool_and_reports_it():
    result = verify(make_server(), make_response(message("I cannot check the weather.")))
    assert result.reward == 1.0
    assert result.called_get_weather is False


def test_verify_only_counts_the_weather_tool():
    result = verify(make_server(), make_response(function_call("get_time", "{}")))
    assert result.called_get_weather is False


def test_verify_accepts_malformed_and_empty_output():
    # Unparseable arguments and an empty trajectory are still scored (this verifier never inspects them).
    assert verify(make_server(), make_response(function_call("get_weather", "{not json"))).reward == 1.0
    result = verify(make_server(), make_response())
    assert result.reward == 1.0 and result.called_get_weather is False


# ----------------------------------------------------------------------------------------------- tool


def test_get_weather_tool():
    answer = asyncio.run(make_server().get_weather(GetWeatherRequest(city="Lima")))
    assert answer.city == "Lima"
    assert answer.weather_description == "The weather in Lima is cold."


# ----------------------------------------------------------------------------------------------- over HTTP


def test_http_tool_route_and_verify():
    with TestClient(make_server().build_app()) as client:
        tool = client.post("/get_weather", json={"city": "Oslo"})
        assert tool.status_code == 200
        assert tool.json() == {"city": "Oslo", "weather_description": "The weather in Oslo is cold."}

        # Arguments that do not fit the tool come back as a 422 the model can read.
        bad = client.post("/get_weather", json={"town": "Oslo"})
        assert bad.status_code == 422 and "city" in bad.text

        seeded = client.post("/seed_session", json={"responses_create_params": PARAMS})
        assert seeded.status_code == 200 and seeded.json() == {}

        response = make_response(function_call("get_weather", '{"city": "Oslo"}'), message("Cold."))
        verified = client.post(
            "/verify", json={"responses_create_params": PARAMS, "response": response.model_dump(mode="json")}
        )
        assert verified.status_code == 200
        assert verified.json()["reward"] == 1.0
        assert verified.json()["called_get_weather"] is True


# ----------------------------------------------------------------------------------------------- data


def test_example_rows_validate():
    rows = [json.loads(line) for line in DATA_PATH.read_text().splitlines()]
    assert len(rows) == 5
    placeholder = make_response(message("placeholder")).model_dump(mode="json")
    for row in rows:
        request = BaseVerifyRequest.model_validate({**row, "response": placeholder})
        assert [tool["name"] for tool in request.responses_create_params.tools] == ["get_weather"]
