import asyncio

from fastapi.testclient import TestClient

from nemo_gym.base_resources_server import BaseVerifyRequest
from nemo_gym.testing.responses import function_call, function_call_output, make_response, message
from nemo_gym.testing.servers import Verifier, example_rows, make_server
from resources_servers.example_single_tool_call.app import ExampleSingleToolCallResourcesServer, GetWeatherRequest

PARAMS = {"input": [{"role": "user", "content": "What is the weather in Oslo?"}]}


def new_server() -> ExampleSingleToolCallResourcesServer:
    return make_server(ExampleSingleToolCallResourcesServer, name="example_single_tool_call", domain="agent")


VERIFY = Verifier(new_server, BaseVerifyRequest, PARAMS)


def verify(server, response):
    return VERIFY(response=response, server=server)


# ----------------------------------------------------------------------------------------------- verify


def test_verify_rewards_a_rollout_that_called_the_tool():
    result = verify(
        new_server(),
        make_response(
            function_call("get_weather", '{"city": "Oslo"}'),
            function_call_output({"city": "Oslo"}),
            message("It is cold in Oslo: bring a coat."),
        ),
    )
    assert result.reward == 1.0
    assert result.called_get_weather is True
    # The request is echoed back.
    assert result.responses_create_params.input[0].content == "What is the weather in Oslo?"
    assert result.response.output[-1].content[0].text == "It is cold in Oslo: bring a coat."


def test_verify_answers_one_even_without_the_tool_and_reports_it():
    result = verify(new_server(), make_response(message("I cannot check the weather.")))
    assert result.reward == 1.0
    assert result.called_get_weather is False


def test_verify_only_counts_the_weather_tool():
    result = verify(new_server(), make_response(function_call("get_time", "{}")))
    assert result.called_get_weather is False


def test_verify_accepts_malformed_and_empty_output():
    # Unparseable arguments and an empty trajectory are still scored (this verifier never inspects them).
    assert verify(new_server(), make_response(function_call("get_weather", "{not json"))).reward == 1.0
    result = verify(new_server(), make_response())
    assert result.reward == 1.0 and result.called_get_weather is False


# ----------------------------------------------------------------------------------------------- tool


def test_get_weather_tool():
    answer = asyncio.run(new_server().get_weather(GetWeatherRequest(city="Lima")))
    assert answer.city == "Lima"
    assert answer.weather_description == "The weather in Lima is cold."


# ----------------------------------------------------------------------------------------------- over HTTP


def test_http_tool_route_and_verify():
    with TestClient(new_server().build_app()) as client:
        tool = client.post("/get_weather", json={"city": "Oslo"})
        assert tool.status_code == 200
        assert tool.json() == {"city": "Oslo", "weather_description": "The weather in Oslo is cold."}

        # Arguments that do not fit the tool come back as a 422 the model can read.
        bad = client.post("/get_weather", json={"town": "Oslo"})
        assert bad.status_code == 422 and "city" in bad.text

        seeded = client.post("/seed_session", json={"responses_create_params": PARAMS})
        assert seeded.status_code == 200 and seeded.json() == {}

        response = make_response(function_call("get_weather", '{"city": "Oslo"}'), message("Cold."))
        verified = client.post("/verify", json=VERIFY.body(response=response))
        assert verified.status_code == 200
        assert verified.json()["reward"] == 1.0
        assert verified.json()["called_get_weather"] is True


# ----------------------------------------------------------------------------------------------- data


def test_example_rows_validate():
    rows = example_rows(__file__)
    assert len(rows) == 5
    for row in rows:
        request = VERIFY.row_request(row, message("placeholder"))
        assert [tool["name"] for tool in request.responses_create_params.tools] == ["get_weather"]
