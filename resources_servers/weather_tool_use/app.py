"""weather_tool_use: a weather question the model can only answer well by calling the tool and reading its answer.

The model gets a travel question about one city and a `get_weather` tool. The tool answers with a fixed, made-up
report per city (`{"city", "temperature_c", "condition"}`, e.g. Oslo: -4 °C and freezing fog), so a right answer
cannot be guessed: it has to come from the tool's output. The reward is 1 only when all three hold:

* `called_tool`: the model called `get_weather`;
* `right_city`: one of those calls asked for the city the question is about (`expected_city`; case, spaces and
  a ", Country" suffix do not matter), not another city the question mentions;
* `used_tool_output`: the final answer (the assistant text after the last tool result) states the temperature or
  the condition of a report the tool returned in this rollout.

The three are also returned as v0.5 `reward_components` (and as top-level numbers, so reward profiling averages
them and the viewer shows which one failed). Verify reads only its request (the tool is deterministic), so saved
rollouts can be re-scored with `ng reverify`.
"""

from __future__ import annotations

import hashlib
import re
from typing import Any, ClassVar

from fastapi import FastAPI
from pydantic import BaseModel, ValidationError

from nemo_gym.base_resources_server import (
    BaseMultiRewardVerifyResponse,
    BaseResourcesServerConfig,
    BaseRunRequest,
    BaseVerifyRequest,
    ReverifyMode,
    SimpleResourcesServer,
)
from nemo_gym.openai_utils import NeMoGymResponse
from nemo_gym.reward_profile import compute_pass_majority_metrics, highest_k_metrics

TOOL_NAME = "get_weather"
COMPONENTS = ("called_tool", "right_city", "used_tool_output")


class WeatherToolUseResourcesServerConfig(BaseResourcesServerConfig):
    # Verify reads nothing but its request: stored rollouts can be re-scored.
    REVERIFY_MODE: ClassVar[ReverifyMode] = ReverifyMode.STATELESS


# ------------------------------------------------------------------------------------------------------ the tool


class GetWeatherRequest(BaseModel):
    city: str


class WeatherReport(BaseModel):
    city: str
    temperature_c: int
    condition: str


# Made-up reports, distinct per city (no two share a temperature or a condition), so an answer that states one
# can only have read it from the tool. Other cities get a report derived from their name (`weather_for`).
REPORTS: dict[str, tuple[int, str]] = {
    "oslo": (-4, "freezing fog"),
    "nairobi": (23, "thunderstorms"),
    "lima": (17, "drizzle"),
    "reykjavik": (2, "sleet"),
    "cairo": (36, "sandstorm"),
    "hanoi": (31, "monsoon rain"),
    "montreal": (-12, "blowing snow"),
    "lisbon": (19, "sea mist"),
}
OTHER_CONDITIONS = ("light snow", "dense fog", "hailstorm", "heavy rain", "strong wind", "clear skies")


def normalize_city(name: str) -> str:
    """The comparable form of a city name: before any comma ("Oslo, Norway"), casefolded, spaces collapsed."""
    return " ".join(name.split(",", 1)[0].casefold().split())


def weather_for(city: str) -> WeatherReport:
    """The tool's answer: the table's report, else one derived from the city's name (the same every time)."""
    key = normalize_city(city)
    if key in REPORTS:
        temperature, condition = REPORTS[key]
    else:
        digest = hashlib.sha256(key.encode("utf-8")).digest()
        temperature, condition = digest[0] % 41 - 10, OTHER_CONDITIONS[digest[1] % len(OTHER_CONDITIONS)]
    return WeatherReport(city=city, temperature_c=temperature, condition=condition)


# ------------------------------------------------------------------------------------------------------ verify


class WeatherToolUseRunRequest(BaseRunRequest):
    expected_city: str  # the city the question is about


class WeatherToolUseVerifyRequest(WeatherToolUseRunRequest, BaseVerifyRequest):
    pass


class WeatherToolUseVerifyResponse(WeatherToolUseVerifyRequest, BaseMultiRewardVerifyResponse):
    # The components again as top-level numbers, so reward profiling and /aggregate_metrics see them.
    called_tool: float
    right_city: float
    used_tool_output: float
    called_cities: list[str]  # the `city` of each get_weather call, in order (calls with bad arguments left out)


def _called_cities(response: NeMoGymResponse) -> tuple[int, list[str], set[str]]:
    """(number of get_weather calls, the city of each call with valid arguments, their call ids)."""
    calls, cities, call_ids = 0, [], set()
    for item in response.output:
        if item.type != "function_call" or item.name != TOOL_NAME:
            continue
        calls += 1
        call_ids.add(item.call_id)
        try:
            cities.append(GetWeatherRequest.model_validate_json(item.arguments).city)
        except ValidationError:
            continue
    return calls, cities, call_ids


def _returned_reports(response: NeMoGymResponse, call_ids: set[str]) -> list[WeatherReport]:
    """The reports the tool returned to the model in this rollout (tool errors and other tools' results skipped)."""
    reports = []
    for item in response.output:
        if item.type == "function_call_output" and item.call_id in call_ids:
            try:
                reports.append(WeatherReport.model_validate_json(item.output))
            except ValidationError:
                continue
    return reports


def final_answer(response: NeMoGymResponse) -> str:
    """The assistant text after the last tool result (the whole assistant text when there is none)."""
    results = [i for i, item in enumerate(response.output) if item.type == "function_call_output"]
    after = response.output[results[-1] + 1:] if results else response.output
    return "\n".join(response.model_copy(update={"output": after}).assistant_texts()).strip()


def states_temperature(text: str, temperature_c: int) -> bool:
    """Whether `text` gives this temperature as a number of its own ("17°C", "-4 degrees", "minus 4"): not part of
    another number ("170", "0.6" for 0), and a negative one with its sign."""
    digits = str(abs(temperature_c))
    sign = r"(?:-|\u2212|minus\s*)" if temperature_c < 0 else r"(?<![-\u2212])\+?"
    return re.search(rf"(?<![\d.]){sign}{digits}(?![\d]|[.,]\d)", text, flags=re.IGNORECASE) is not None


def uses_report(text: str, report: WeatherReport) -> bool:
    """Whether `text` states the report's temperature or its condition."""
    return states_temperature(text, report.temperature_c) or report.condition.casefold() in text.casefold()


def score_components(body: WeatherToolUseVerifyRequest) -> tuple[dict[str, float], list[str]]:
    """(the three component scores, the cities the model asked for)."""
    calls, cities, call_ids = _called_cities(body.response)
    answer = final_answer(body.response)
    expected = normalize_city(body.expected_city)
    components = {
        "called_tool": 1.0 if calls else 0.0,
        "right_city": 1.0 if any(normalize_city(city) == expected for city in cities) else 0.0,
        "used_tool_output": 1.0
        if answer and any(uses_report(answer, r) for r in _returned_reports(body.response, call_ids))
        else 0.0,
    }
    return components, cities


def component_scores(result: dict) -> dict[str, float]:
    """A verify response's reward and components, for the pass@k helpers."""
    components = result.get("reward_components") or {}
    scores = {name: float(components.get(name, result.get(name, 0.0))) for name in COMPONENTS}
    return {"reward": float(result.get("reward") or 0.0), **scores}


# ------------------------------------------------------------------------------------------------------ server


class WeatherToolUseResourcesServer(SimpleResourcesServer):
    config: WeatherToolUseResourcesServerConfig

    def setup_webserver(self) -> FastAPI:
        app = super().setup_webserver()  # /seed_session and /verify
        app.post(f"/{TOOL_NAME}")(self.get_weather)
        return app

    async def get_weather(self, body: GetWeatherRequest) -> WeatherReport:
        return weather_for(body.city)

    async def verify(self, body: WeatherToolUseVerifyRequest) -> WeatherToolUseVerifyResponse:
        components, cities = score_components(body)
        return WeatherToolUseVerifyResponse(
            **body.model_dump(),
            reward=1.0 if all(components.values()) else 0.0,
            reward_components=components,
            **components,
            called_cities=cities,
        )

    # -- /aggregate_metrics hooks ---------------------------------------------------------------------------

    def compute_metrics(self, tasks: list[list[dict]]) -> dict[str, Any]:
        """pass@k and pass@1[avg-of-k] of the reward and of every component, in percent."""
        metrics, *_ = compute_pass_majority_metrics(tasks, score_fn=component_scores)
        return metrics

    def get_key_metrics(self, agent_metrics: dict[str, Any]) -> dict[str, Any]:
        """The mean reward, components and tokens, and pass@k at the largest k."""
        means = ["mean/reward", *(f"mean/{name}" for name in COMPONENTS), "mean/input_tokens", "mean/output_tokens"]
        key_metrics = {name: agent_metrics[name] for name in means if name in agent_metrics}
        key_metrics.update(highest_k_metrics(agent_metrics, "pass@{k}"))
        return key_metrics


if __name__ == "__main__":
    WeatherToolUseResourcesServer.run_webserver()
