"""weather_tool_use: the tool, the three reward components, their conjunction, and the `/aggregate_metrics` hooks."""

from __future__ import annotations

import asyncio

import httpx
import pytest
from fastapi.testclient import TestClient

from nemo_gym.base_resources_server import BaseMultiRewardVerifyResponse
from nemo_gym.testing.live_server import live_server
from nemo_gym.testing.responses import function_call, function_call_output, make_response, message, reasoning
from nemo_gym.testing.servers import Verifier, example_rows, make_server
from resources_servers.weather_tool_use.app import (
    COMPONENTS,
    REPORTS,
    GetWeatherRequest,
    WeatherToolUseResourcesServer,
    WeatherToolUseVerifyRequest,
    final_answer,
    normalize_city,
    states_temperature,
    weather_for,
)

QUESTION = "I'm leaving Oslo for Cairo. Check the weather in Cairo, please."
PARAMS = {"input": [{"role": "user", "content": QUESTION}]}
CAIRO = {"city": "Cairo", "temperature_c": 36, "condition": "sandstorm"}
OSLO = {"city": "Oslo", "temperature_c": -4, "condition": "freezing fog"}


def new_server() -> WeatherToolUseResourcesServer:
    return make_server(WeatherToolUseResourcesServer, name="weather_tool_use", domain="agent")


VERIFY = Verifier(new_server, WeatherToolUseVerifyRequest, PARAMS, expected_city="Cairo")


def lookup(city: str, report: dict, call_id: str = "call_1") -> tuple[dict, dict]:
    """A get_weather call and the tool's answer to it."""
    return function_call("get_weather", {"city": city}, call_id=call_id), function_call_output(report, call_id=call_id)


def components(result) -> tuple:
    return tuple(result.reward_components[name] for name in COMPONENTS)


# ----------------------------------------------------------------------------------------------- the tool


def test_the_table_gives_each_city_its_own_report():
    assert weather_for("Oslo").model_dump() == OSLO
    assert len({t for t, _ in REPORTS.values()}) == len({c for _, c in REPORTS.values()}) == len(REPORTS)


def test_city_names_compare_without_case_spaces_or_country():
    assert normalize_city("  cairo ,  Egypt") == normalize_city("CAIRO") == "cairo"
    assert normalize_city("New   York") == "new york"
    assert weather_for("cairo, Egypt").temperature_c == 36
    assert weather_for("cairo, Egypt").city == "cairo, Egypt"  # echoed as written


def test_other_cities_get_a_report_derived_from_their_name():
    first, again = weather_for("Kenia"), weather_for("kenia")
    assert (first.temperature_c, first.condition) == (again.temperature_c, again.condition)
    assert -10 <= first.temperature_c <= 30
    assert first.condition not in {c for _, c in REPORTS.values()}


def test_get_weather_route_method():
    answer = asyncio.run(new_server().get_weather(GetWeatherRequest(city="Lima")))
    assert answer.model_dump() == {"city": "Lima", "temperature_c": 17, "condition": "drizzle"}


# ----------------------------------------------------------------------------------------------- the pieces


@pytest.mark.parametrize(
    "text, temperature, stated",
    [
        ("It is 36°C.", 36, True),
        ("36 degrees and a sandstorm", 36, True),
        ("It's 36, hot.", 36, True),
        ("+36 C", 36, True),
        ("It is -4 °C", -4, True),
        ("It is \u22124 °C", -4, True),
        ("minus 4 degrees", -4, True),
        ("It is 4 °C", -4, False),  # a negative temperature needs its sign
        ("It is -36 °C", 36, False),
        ("136 km away", 36, False),
        ("2036", 36, False),
        ("36.5 degrees", 36, False),
        ("0.6 Celsius", 0, False),
        ("no number", 36, False),
    ],
)
def test_states_temperature(text, temperature, stated):
    assert states_temperature(text, temperature) is stated


def test_final_answer_is_the_text_after_the_last_tool_result():
    call, result = lookup("Cairo", CAIRO)
    response = make_response(message("Let me check."), call, result, message("Sandstorm in Cairo.", msg_id="msg_2"))
    assert final_answer(response) == "Sandstorm in Cairo."
    assert final_answer(make_response(call, result)) == ""
    assert final_answer(make_response("No tool here.")) == "No tool here."


# ----------------------------------------------------------------------------------------------- verify


def test_a_right_answer_scores_one_on_every_component():
    result = VERIFY(*lookup("Cairo", CAIRO), "It is 36°C with a sandstorm in Cairo.")
    assert components(result) == (1.0, 1.0, 1.0)
    assert result.reward == 1.0
    assert result.called_cities == ["Cairo"]


@pytest.mark.parametrize("answer", ["Expect 36 degrees.", "A SANDSTORM is blowing.", "Sandstorm, 36 C."])
def test_the_temperature_or_the_condition_is_enough(answer):
    assert VERIFY(*lookup("cairo, Egypt", CAIRO), answer).reward == 1.0


def test_each_failure_names_its_component():
    no_tool = VERIFY("Cairo is hot and sunny, around 36 degrees.")  # right number, but guessed
    wrong_city = VERIFY(*lookup("Oslo", OSLO), "Oslo has freezing fog at -4 °C.")
    ignored = VERIFY(*lookup("Cairo", CAIRO), "Have a nice trip to Cairo!")
    assert components(no_tool) == (0.0, 0.0, 0.0)
    assert components(wrong_city) == (1.0, 0.0, 1.0)  # it used the output, of the wrong city
    assert components(ignored) == (1.0, 1.0, 0.0)
    assert [r.reward for r in (no_tool, wrong_city, ignored)] == [0.0, 0.0, 0.0]


def test_any_call_with_the_right_city_counts():
    wrong, _ = lookup("Oslo", OSLO, call_id="call_1")
    right, report = lookup("Cairo", CAIRO, call_id="call_2")
    result = VERIFY(wrong, function_call_output(OSLO, call_id="call_1"), right, report, "36°C in Cairo.")
    assert result.reward == 1.0 and result.called_cities == ["Oslo", "Cairo"]


def test_text_before_the_tool_result_is_not_the_answer():
    call, report = lookup("Cairo", CAIRO)
    result = VERIFY(message("A sandstorm, 36 degrees?"), call, report)
    assert components(result) == (1.0, 1.0, 0.0)


def test_malformed_calls_and_tool_errors_give_nothing_to_use():
    bad_args = VERIFY(function_call("get_weather", "{not json"), "Sandstorm, 36 °C.")
    assert components(bad_args) == (1.0, 0.0, 0.0) and bad_args.called_cities == []
    error = VERIFY(
        function_call("get_weather", {"town": "Cairo"}), function_call_output('{"detail": "city: Field required"}'),
        "Sandstorm, 36 °C.",
    )
    assert components(error) == (1.0, 0.0, 0.0)
    other_tool = VERIFY(function_call("get_time", {"city": "Cairo"}), function_call_output(CAIRO), "36 °C.")
    assert components(other_tool) == (0.0, 0.0, 0.0)


@pytest.mark.parametrize("output", [(), (reasoning("36 °C, sandstorm"),)])
def test_no_answer_scores_zero(output):
    result = VERIFY(*output)
    assert components(result) == (0.0, 0.0, 0.0) and result.reward == 0.0


def test_response_is_a_multi_reward_response_with_top_level_copies():
    result = VERIFY(*lookup("Cairo", CAIRO), "Sandstorm.")
    assert isinstance(result, BaseMultiRewardVerifyResponse)
    assert set(result.reward_components) == set(COMPONENTS)
    for name in COMPONENTS:
        assert getattr(result, name) == result.reward_components[name]
    assert result.expected_city == "Cairo"  # the request is echoed
    assert result.responses_create_params.input[0].content == QUESTION


# ----------------------------------------------------------------------------------------------- over HTTP


def test_http_tool_route_verify_and_reverify_mode():
    with TestClient(new_server().build_app()) as client:
        tool = client.post("/get_weather", json={"city": "Cairo"})
        assert tool.status_code == 200 and tool.json() == CAIRO
        bad = client.post("/get_weather", json={"town": "Cairo"})
        assert bad.status_code == 422 and "city" in bad.text

        response = make_response(*lookup("Cairo", CAIRO), "36 degrees.")
        verified = client.post("/verify", json=VERIFY.body(response=response))
        assert verified.status_code == 200, verified.text
        data = verified.json()
        assert data["reward"] == 1.0
        assert data["reward_components"] == {"called_tool": 1.0, "right_city": 1.0, "used_tool_output": 1.0}
        assert client.get("/reverify_mode").json() == "stateless"

        missing = client.post("/verify", json={**VERIFY.body(response=response), "expected_city": None})
        assert missing.status_code == 422 and "expected_city" in missing.text


# ----------------------------------------------------------------------------------------------- /aggregate_metrics


def test_aggregate_metrics_give_pass_at_k_of_the_reward_and_each_component():
    answers = {  # (task, rollout) -> output items
        (0, 0): (*lookup("Cairo", CAIRO), "36 °C."),  # right
        (0, 1): (*lookup("Oslo", OSLO), "-4 °C."),  # wrong city
        (1, 0): ("No idea.",),  # no tool
        (1, 1): (*lookup("Cairo", CAIRO), "Have fun."),  # ignored the output
    }
    with TestClient(new_server().build_app()) as client:
        results = []
        for (task, rollout), output in answers.items():
            answer = client.post("/verify", json=VERIFY.body(*output))
            assert answer.status_code == 200, answer.text
            results.append({**answer.json(), "_ng_task_index": task, "_ng_rollout_index": rollout})
    with live_server(new_server().build_app()) as url:
        metrics = httpx.post(url + "/aggregate_metrics", json={"verify_responses": results}, timeout=30).json()
    agent = metrics["agent_metrics"]
    assert agent["mean/reward"] == pytest.approx(0.25)
    assert agent["mean/called_tool"] == pytest.approx(0.75)
    assert agent["pass@1/reward"] == pytest.approx(25.0)
    assert agent["pass@2/reward"] == pytest.approx(50.0)
    assert agent["pass@2/right_city"] == pytest.approx(100.0)
    assert agent["pass@2/used_tool_output"] == pytest.approx(50.0)
    key = metrics["key_metrics"]
    assert key["pass@2/reward"] == agent["pass@2/reward"]
    assert {"mean/reward", *(f"mean/{name}" for name in COMPONENTS)} <= set(key)
    assert "pass@1/reward" not in key  # only the largest k


# ----------------------------------------------------------------------------------------------- data


def test_example_rows_validate_and_score():
    rows = example_rows(__file__)
    assert len(rows) == 5
    server = new_server()
    for row in rows:
        request = VERIFY.row_request(row, message("placeholder"))
        assert [tool["name"] for tool in request.responses_create_params.tools] == ["get_weather"]
        city = row["expected_city"]
        report = weather_for(city)
        right = (*lookup(city, report.model_dump()), f"It is {report.temperature_c} °C in {city}.")
        assert VERIFY.verify_row(row, *right, server=server).reward == 1.0
        assert VERIFY.verify_row(row, f"{city} is lovely.", server=server).reward == 0.0
