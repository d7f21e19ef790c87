"""Agent code written the NeMo Gym v0.5 way runs unchanged (spec §7.1, §15, §3.2).

The agents are test fixtures written against the v0.5 surface only (tests/fixtures/stack/responses_api_agents):
- `v05_simple_agent`: `Body` from `nemo_gym.base_responses_api_agent`; `/run` seeds its resources server, then calls
  its OWN `/v1/responses` over HTTP at `self.url_path_for_run(...)` (the `/ng-rollout/<id>/v1/responses` twin route
  with observability on), whose handler calls the model at `self.url_path_for_request(...)`; `raise_for_status` /
  `get_response_json` from `nemo_gym.server_utils`; `/aggregate_metrics` proxied to the resources server;
- `v05_sdk_agent`: the official `openai` SDK (`AsyncOpenAI`) on `self.base_url_for_run(...)` /
  `self.resolve_model_base_url(...)`.

They run on real processes: `ng_run` (configs/v05_agents.yaml: openai_model in front of the scripted fake LLM,
example_single_tool_call and the v0.5-style judged verifier as resources servers), then `ng_collect_rollouts`.
With observability off nothing is prefixed or captured; with it on every model call of a rollout (the twin route's,
the SDK's, the judge's during `/verify`) lands in `<dir>/<task>-<rollout>.capture.jsonl`, and each output line
carries `ng_model_call_capture` with its number of calls.
"""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi.testclient import TestClient
from starlette.requests import Request

from nemo_gym.testing.fake_openai_server import build_app as build_fake_backend
from nemo_gym.testing.live_server import live_server, live_servers
from nemo_gym.testing.script import answer_rule, step, steps_rule, tool_call
from nemo_gym.testing.servers import make_server, make_server_client
from nemo_gym.testing.stack import ChildProcess, FakeLLMBackend, NgRunStack, fake_llm_overrides, server_instances
from responses_api_models.openai_model.app import SimpleModelServer
from tests.conftest import FIXTURE_STACK, free_port

COLLECT = [sys.executable, "-c", "from nemo_gym.cli import collect_rollouts; collect_rollouts()"]
MODEL = "policy_model"
WEATHER_RS, JUDGED_RS = "weather_resources_server", "judged_resources_server"
SIMPLE_WEATHER, SIMPLE_JUDGED, SDK_WEATHER = "v05_weather_agent", "v05_judged_agent", "v05_sdk_weather_agent"
ALL_SERVERS = [MODEL, WEATHER_RS, JUDGED_RS, SIMPLE_WEATHER, SIMPLE_JUDGED, SDK_WEATHER]
RESOURCES_OF = {SIMPLE_WEATHER: WEATHER_RS, SIMPLE_JUDGED: JUDGED_RS, SDK_WEATHER: WEATHER_RS}
NUM_REPEATS = 2
# Rollouts the tests send to the agents' twin routes themselves (no dataset row), and a plain call's text.
TWIN_ROLLOUTS = {SIMPLE_WEATHER: "900-0", SDK_WEATHER: "901-0"}
PLAIN_CALL_TEXT = "hello from a test, no rollout"

TOOLS = [
    {"type": "function", "name": "get_weather", "description": "Look up the current weather in a city.",
     "strict": False,
     "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}},
]

# The fake LLM's script: Oslo takes one tool call (2 model calls), Lima two (3 model calls); each question of the
# judged task one policy call plus the judge's call during /verify.
SCRIPT = [
    steps_rule("weather in Oslo", step(tool_call("get_weather", {"city": "Oslo"})), step("Wear a coat.")),
    steps_rule(
        "weather in Lima",
        step(tool_call("get_weather", {"city": "Lima"})),
        step(tool_call("get_weather", {"city": "Cusco"})),
        step("Wear a coat in both."),
    ),
    answer_rule("JUDGE: Rome || Rome", "YES"),
    answer_rule("JUDGE: Bonn || Berlin", "NO"),
    answer_rule("Q: Italy", "Rome"),
    answer_rule("Q: Germany", "Bonn"),
    answer_rule("from a test", "test says: {{last_user}}"),
]


def weather_row(agent: str, city: str) -> dict:
    return {
        "responses_create_params": {
            "input": [{"role": "user", "content": f"What is the weather in {city}? Do I need a coat?"}],
            "tools": TOOLS,
        },
        "agent_ref": {"type": "responses_api_agents", "name": agent},
    }


def judged_row(question: str, expected: str) -> dict:
    return {
        "responses_create_params": {"input": [{"role": "user", "content": question}]},
        "expected_answer": expected,
        "agent_ref": {"type": "responses_api_agents", "name": SIMPLE_JUDGED},
    }


# task index -> (row, model calls per rollout, reward)
TASKS = {
    0: (weather_row(SIMPLE_WEATHER, "Oslo"), 2, 1.0),
    1: (weather_row(SIMPLE_WEATHER, "Lima"), 3, 1.0),
    2: (weather_row(SDK_WEATHER, "Oslo"), 2, 1.0),
    3: (weather_row(SDK_WEATHER, "Lima"), 3, 1.0),
    4: (judged_row("Q: Italy", "Rome"), 2, 1.0),
    5: (judged_row("Q: Germany", "Berlin"), 2, 0.0),
}
ROLLOUT_IDS = [f"{task}-{rollout}" for task in TASKS for rollout in range(NUM_REPEATS)]


def agent_of(task: int) -> str:
    return TASKS[task][0]["agent_ref"]["name"]


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def write_jsonl(path: Path, rows: list) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def access_lines(output: str, server: str) -> list[str]:
    """The uvicorn access lines of one server of the stack (`(<server>) INFO: ... "POST /path HTTP/1.1" 200 OK`)."""
    return [line for line in output.splitlines() if line.startswith(f"({server}) ") and " HTTP/1.1\" " in line]


def posted(output: str, server: str, path: str) -> int:
    """How many times `server` answered `POST <path>` (exact path)."""
    return sum(f'"POST {path} HTTP/1.1"' in line for line in access_lines(output, server))


def stripped_for_aggregation(result: dict) -> dict:
    """A result as spec §3.3 says the collector sends it to `/aggregate_metrics`."""
    out = {k: v for k, v in result.items()
           if k not in ("response", "responses_create_params", "ng_agent_observations", "ng_model_call_capture")}
    if (result.get("response") or {}).get("usage") is not None:
        out["response"] = {"usage": result["response"]["usage"]}
    return out


def collect_on_a_stack(tmp: Path, *stack_overrides: str, call_twin_routes: bool) -> dict:
    """Start the stack, collect every task `NUM_REPEATS` times, probe the running servers, stop the stack.

    Everything the tests look at is recorded here, after the stack stopped, so its output holds every access line.
    `call_twin_routes`: also call the agents' `/ng-rollout/<id>/v1/responses` directly (`TWIN_ROLLOUTS`)."""
    script = write_jsonl(tmp / "script.jsonl", SCRIPT)
    write_jsonl(tmp / "tasks.jsonl", [row for row, _, _ in TASKS.values()])
    head_port = free_port()
    seen: dict[str, Any] = {"tmp": tmp}
    with FakeLLMBackend("--script", str(script)) as backend:
        overrides = fake_llm_overrides(["configs/v05_agents.yaml"], backend.base_url, head_port)
        stack = NgRunStack([*overrides, "+uvicorn_logging_show_200_ok=true", *stack_overrides], cwd=FIXTURE_STACK)
        try:
            stack.wait_for(f"All {len(ALL_SERVERS)} / {len(ALL_SERVERS)} servers ready!", timeout=300)
            collect = ChildProcess(
                [
                    *COLLECT,
                    f"+head_server.port={head_port}",
                    f"+input_jsonl_fpath={tmp / 'tasks.jsonl'}",
                    f"+output_jsonl_fpath={tmp / 'rollouts.jsonl'}",
                    f"+num_repeats={NUM_REPEATS}",
                    "+progress_bar=false",
                ],
                cwd=tmp,
            )
            seen["collect_code"], seen["collect_output"] = collect.wait(timeout=600), collect.output
            seen["urls"] = urls = {i["process_name"]: i["url"] for i in server_instances(head_port)}
            seen["liveness"] = {name: _answer(httpx.get(urls[name] + "/", timeout=30)) for name in ALL_SERVERS}
            seen["aggregate"] = _aggregate_through_agents_and_resources(tmp / "rollouts.jsonl", urls)
            seen["twin"] = {
                agent: _answer(httpx.post(f"{urls[agent]}/ng-rollout/{rollout_id}/v1/responses",
                                          json={"input": f"{PLAIN_CALL_TEXT} ({agent})"}, timeout=120))
                for agent, rollout_id in TWIN_ROLLOUTS.items()
                if call_twin_routes
            }
            seen["plain"] = _answer(httpx.post(f"{urls[SIMPLE_WEATHER]}/v1/responses",
                                               json={"input": PLAIN_CALL_TEXT}, timeout=120))
        finally:
            seen["stop_code"] = stack.stop(timeout=60)
            seen["stack_output"] = stack.output
    return seen


def _answer(response: httpx.Response) -> tuple[int, Any]:
    try:
        return response.status_code, response.json()
    except ValueError:
        return response.status_code, response.text


def _aggregate_through_agents_and_resources(rollouts: Path, urls: dict) -> dict:
    """POST each proxying agent's stripped results to its `/aggregate_metrics` and to its resources server's."""
    results = read_jsonl(rollouts) if rollouts.exists() else []
    answers = {}
    for agent in (SIMPLE_WEATHER, SIMPLE_JUDGED):
        mine = sorted((r for r in results if r.get("agent_ref", {}).get("name") == agent),
                      key=lambda r: (r["_ng_task_index"], r["_ng_rollout_index"]))
        body = {"verify_responses": [stripped_for_aggregation(r) for r in mine]}
        answers[agent] = {
            "agent": _answer(httpx.post(urls[agent] + "/aggregate_metrics", json=body, timeout=60)),
            "resources": _answer(httpx.post(urls[RESOURCES_OF[agent]] + "/aggregate_metrics", json=body, timeout=60)),
        }
    return answers


# --------------------------------------------------------------------------------------------------------------
# observability off


@pytest.fixture(scope="module")
def off(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("v05_agents_off")
    # The capture dir is set but observability is off: nothing may be written there.
    seen = collect_on_a_stack(tmp, f"++model_call_capture_dir={tmp / 'captures'}", call_twin_routes=False)
    assert seen["stop_code"] == 0, seen["stack_output"][-5000:]
    return seen


def test_with_observability_off_v05_agents_collect_and_nothing_is_prefixed_or_captured(off):
    assert off["collect_code"] == 0, off["collect_output"]
    rollouts = read_jsonl(off["tmp"] / "rollouts.jsonl")
    assert sorted(f"{r['_ng_task_index']}-{r['_ng_rollout_index']}" for r in rollouts) == sorted(ROLLOUT_IDS)
    for rollout in rollouts:
        task = rollout["_ng_task_index"]
        assert rollout["reward"] == TASKS[task][2], rollout
        assert rollout["agent_ref"]["name"] == agent_of(task)
        assert "ng_model_call_capture" not in rollout

    output = off["stack_output"]
    assert "/ng-rollout/" not in output
    assert not (off["tmp"] / "captures").exists()
    # The self-calls went to the plain route, and every model call was made (2 or 3 per weather rollout, policy
    # and judge per judged rollout, one for the plain call of the test).
    assert posted(output, SIMPLE_WEATHER, "/v1/responses") == 2 * NUM_REPEATS + 1
    assert posted(output, SIMPLE_JUDGED, "/v1/responses") == 2 * NUM_REPEATS
    assert posted(output, MODEL, "/v1/responses") == sum(calls for _, calls, _ in TASKS.values()) * NUM_REPEATS + 1
    assert posted(output, WEATHER_RS, "/get_weather") == (1 + 2) * NUM_REPEATS * 2
    assert off["plain"][0] == 200 and off["plain"][1]["output"][-1]["content"][0]["text"].startswith("test says:")


def test_every_server_of_the_stack_answers_liveness_on_the_root(off):
    assert off["liveness"] == {name: (200, {"status": "ok"}) for name in ALL_SERVERS}


# --------------------------------------------------------------------------------------------------------------
# observability on


@pytest.fixture(scope="module")
def on(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("v05_agents_on")
    seen = collect_on_a_stack(
        tmp, "+observability_enabled=true", f"+model_call_capture_dir={tmp / 'captures'}", call_twin_routes=True
    )
    assert seen["stop_code"] == 0, seen["stack_output"][-5000:]
    assert seen["collect_code"] == 0, seen["collect_output"]
    return seen


def test_every_model_call_of_a_rollout_is_captured_under_its_id(on):
    captures = on["tmp"] / "captures"
    expected_files = [*ROLLOUT_IDS, *TWIN_ROLLOUTS.values()]
    assert sorted(p.name for p in captures.iterdir()) == sorted(f"{i}.capture.jsonl" for i in expected_files)

    for rollout_id in ROLLOUT_IDS:
        task = int(rollout_id.split("-")[0])
        row, calls, _ = TASKS[task]
        lines = read_jsonl(captures / f"{rollout_id}.capture.jsonl")
        seen = [(e["dialect"], e["status_code"], e["error_category"], e["model_ref"], e["rollout_id"]) for e in lines]
        assert seen == [("responses", 200, None, MODEL, rollout_id)] * calls, rollout_id
        question = row["responses_create_params"]["input"][0]["content"]
        if agent_of(task) == SIMPLE_JUDGED:  # the policy's call, then the judge's (made by /verify)
            assert question in json.dumps(lines[0]["request"]["input"])
            assert "JUDGE: " in json.dumps(lines[1]["request"]["input"])
        else:  # each call of the tool loop sent everything before it
            assert all(question in json.dumps(e["request"]["input"]) for e in lines)
            sizes = [len(e["request"]["input"]) for e in lines]
            assert sizes == sorted(set(sizes)) and sizes[0] == 1, sizes

    # The calls the test made on the agents' twin routes directly: filed under the route's id.
    for agent, rollout_id in TWIN_ROLLOUTS.items():
        assert on["twin"][agent][0] == 200, on["twin"][agent]
        [line] = read_jsonl(captures / f"{rollout_id}.capture.jsonl")
        assert f"{PLAIN_CALL_TEXT} ({agent})" in json.dumps(line["request"]["input"])


def test_each_output_line_carries_its_capture_summary(on):
    rollouts = read_jsonl(on["tmp"] / "rollouts.jsonl")
    assert len(rollouts) == len(ROLLOUT_IDS)
    for rollout in rollouts:
        task, rollout_id = rollout["_ng_task_index"], f"{rollout['_ng_task_index']}-{rollout['_ng_rollout_index']}"
        assert rollout["reward"] == TASKS[task][2], rollout
        summary = rollout["ng_model_call_capture"]
        assert summary["rollout_id"] == rollout_id and "gaps" not in summary, summary
        assert summary["metrics"]["num_calls"] == TASKS[task][1], (rollout_id, summary)
        assert [c["call_index"] for c in summary["calls"]] == list(range(TASKS[task][1]))


def test_rollout_calls_carry_the_prefix_on_the_wire(on):
    output = on["stack_output"]
    for rollout_id in ROLLOUT_IDS:
        task = int(rollout_id.split("-")[0])
        agent, calls = agent_of(task), TASKS[task][1]
        resources = RESOURCES_OF[agent]
        assert posted(output, resources, f"/ng-rollout/{rollout_id}/seed_session") == 1, rollout_id
        assert posted(output, resources, f"/ng-rollout/{rollout_id}/verify") == 1, rollout_id
        assert posted(output, MODEL, f"/ng-rollout/{rollout_id}/v1/responses") == calls, rollout_id
        if agent == SDK_WEATHER:  # tools called inside /run: the framework prefixes them
            assert posted(output, WEATHER_RS, f"/ng-rollout/{rollout_id}/get_weather") == calls - 1, rollout_id
        else:  # v05_simple_agent: /run called its own twin route
            assert posted(output, agent, f"/ng-rollout/{rollout_id}/v1/responses") == 1, rollout_id
    # Nothing of a rollout went unprefixed to the model: the one plain call is the test's own.
    assert posted(output, MODEL, "/v1/responses") == 1
    assert posted(output, SIMPLE_WEATHER, "/v1/responses") == 1
    assert on["plain"][0] == 200, on["plain"]


def test_tool_calls_made_inside_the_twin_route_carry_the_prefix(on):
    output = on["stack_output"]
    for rollout_id in ROLLOUT_IDS:
        task = int(rollout_id.split("-")[0])
        if agent_of(task) == SIMPLE_WEATHER:
            assert posted(output, WEATHER_RS, f"/ng-rollout/{rollout_id}/get_weather") == TASKS[task][1] - 1, rollout_id
    assert posted(output, WEATHER_RS, "/get_weather") == 0


def test_aggregate_metrics_through_the_agent_are_the_resources_servers(on):
    aggregate = on["aggregate"]
    for agent in (SIMPLE_WEATHER, SIMPLE_JUDGED):
        (agent_status, through_agent) = aggregate[agent]["agent"]
        (rs_status, from_resources) = aggregate[agent]["resources"]
        assert (agent_status, rs_status) == (200, 200), aggregate[agent]
        assert set(through_agent) == {"group_level_metrics", "agent_metrics", "key_metrics"}
        assert through_agent == from_resources
    judged = aggregate[SIMPLE_JUDGED]["agent"][1]
    # The judged server's own hooks answered (pass@k, majority@k): the agent's default aggregation has neither.
    assert judged["agent_metrics"]["mean/reward"] == pytest.approx(0.5)
    assert judged["agent_metrics"]["pass@1/accuracy"] == pytest.approx(50.0)
    assert set(judged["key_metrics"]) == {"mean/reward", "pass@2/accuracy", "majority@2/accuracy"}
    assert [g["_ng_task_index"] for g in judged["group_level_metrics"]] == [4, 5]

    # ng_collect_rollouts asked each agent the same after the run.
    written = json.loads((on["tmp"] / "rollouts_aggregate_metrics.json").read_text())
    entries = {e["agent_ref"]["name"]: e for e in written}
    assert set(entries) == {SIMPLE_WEATHER, SIMPLE_JUDGED, SDK_WEATHER}
    assert entries[SIMPLE_JUDGED]["key_metrics"] == judged["key_metrics"]
    assert entries[SIMPLE_JUDGED]["agent_metrics"] == judged["agent_metrics"]


def test_liveness_with_observability_on(on):
    assert on["liveness"] == {name: (200, {"status": "ok"}) for name in ALL_SERVERS}


# --------------------------------------------------------------------------------------------------------------
# the agent helpers, on the real app in this process


def load_fixture_agent(impl: str, class_name: str) -> type:
    path = FIXTURE_STACK / "responses_api_agents" / impl / "app.py"
    spec = importlib.util.spec_from_file_location(f"_v05_fixture_{impl}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return getattr(module, class_name)


def agent_refs() -> dict:
    return {
        "resources_server": {"type": "resources_servers", "name": "unused_resources_server"},
        "model_server": {"type": "responses_api_models", "name": MODEL},
    }


def request_with(path_params: dict) -> Request:
    return Request({"type": "http", "method": "POST", "path": "/", "headers": [], "path_params": path_params})


def test_url_path_for_request_reapplies_only_an_inbound_rollout_id():
    agent = make_server(load_fixture_agent("v05_simple_agent", "V05SimpleAgent"), name="agent", **agent_refs())
    assert agent.url_path_for_request("/v1/responses", request_with({})) == "/v1/responses"
    inbound = request_with({"rollout_id": "3-1"})
    assert agent.url_path_for_request("/v1/responses", inbound) == "/ng-rollout/3-1/v1/responses"
    assert agent.url_path_for_request("/ng-rollout/3-1/v1/responses", inbound) == "/ng-rollout/3-1/v1/responses"


@pytest.mark.parametrize("observability", [True, False])
def test_run_helpers_follow_the_observability_flag(observability):
    global_config = {
        MODEL: {"responses_api_models": {"openai_model": {"host": "127.0.0.1", "port": 18123, "entrypoint": "app.py"}}},
        "observability_enabled": observability,
    }
    agent = make_server(load_fixture_agent("v05_sdk_agent", "V05SdkAgent"), name="agent",
                        server_client=make_server_client(global_config), **agent_refs())
    body = {"_ng_task_index": 3, "_ng_rollout_index": 1, "responses_create_params": {"input": "hi"}}
    retry = {**body, "_ng_attempt_index": 2}
    prefix = "/ng-rollout/3-1" if observability else ""
    assert agent.rollout_id_from_run(body) == ("3-1" if observability else None)
    assert agent.rollout_id_from_run(retry) == ("3-1-a2" if observability else None)
    assert agent.rollout_id_from_run({"responses_create_params": {"input": "hi"}}) is None
    assert agent.url_path_for_run("/v1/responses", body) == f"{prefix}/v1/responses"
    assert agent.resolve_model_base_url(MODEL) == "http://127.0.0.1:18123/v1"
    assert agent.resolve_model_base_url(MODEL, "3-1") == "http://127.0.0.1:18123/ng-rollout/3-1/v1"
    assert agent.base_url_for_run(agent.resolve_model_base_url(MODEL), body) == f"http://127.0.0.1:18123{prefix}/v1"


def test_the_twin_route_is_captured_and_the_plain_route_is_not(tmp_path):
    """The real agent app (TestClient) over a real model server (openai_model in front of the fake LLM) in this
    process, capture on: a call on the plain route reaches the model unprefixed, one on the twin route under its id."""
    global_config: dict = {"observability_enabled": True, "model_call_capture_dir": str(tmp_path / "captures")}
    agent_cls = load_fixture_agent("v05_simple_agent", "V05SimpleAgent")
    with live_server(build_fake_backend(script=SCRIPT)) as backend:
        model = make_server(SimpleModelServer, name=MODEL, server_client=make_server_client(global_config),
                            openai_base_url=f"{backend}/v1", openai_api_key="dummy", openai_model="fake-model")
        with live_servers({MODEL: model}, global_config):
            client_of_agent = make_server_client(global_config)
            agent = make_server(agent_cls, name="agent", server_client=client_of_agent, **agent_refs())
            with TestClient(agent.build_app()) as client:
                plain = client.post("/v1/responses", json={"input": "plain call from a test"})
                twin = client.post("/ng-rollout/7-1/v1/responses", json={"input": "twin call from a test"})
    assert plain.status_code == 200, plain.text
    assert plain.json()["output"][-1]["content"][0]["text"] == "test says: plain call from a test"
    assert twin.status_code == 200, twin.text
    assert [p.name for p in (tmp_path / "captures").iterdir()] == ["7-1.capture.jsonl"]
    [line] = read_jsonl(tmp_path / "captures" / "7-1.capture.jsonl")
    assert line["rollout_id"] == "7-1" and line["model_ref"] == MODEL
    assert "twin call from a test" in json.dumps(line["request"]["input"])
    assert "plain call" not in json.dumps(line)


def test_non_executing_simple_agent_has_v05s_names_and_config_shape():
    """v0.5's own test builds the agent this way (names imported from its app module, a mocked client); its
    behaviour over real servers is tested in responses_api_agents/non_executing_simple_agent/tests."""
    from unittest.mock import MagicMock

    from nemo_gym.server_utils import ServerClient
    from responses_api_agents.non_executing_simple_agent.app import (
        ModelServerRef,
        NonExecutingSimpleAgent,
        NonExecutingSimpleAgentConfig,
        NonExecutingSimpleAgentRunRequest,
        NonExecutingSimpleAgentVerifyRequest,
        NonExecutingSimpleAgentVerifyResponse,
        ResourcesServerRef,
    )

    config = NonExecutingSimpleAgentConfig(
        host="0.0.0.0", port=8080, entrypoint="", name="non_executing_agent",
        resources_server=ResourcesServerRef(type="resources_servers", name="resource"),
        model_server=ModelServerRef(type="responses_api_models", name="model"),
    )
    agent = NonExecutingSimpleAgent(config=config, server_client=MagicMock(spec=ServerClient))
    assert {route.path for route in agent.build_app().routes} >= {"/v1/responses", "/run", "/aggregate_metrics"}
    row = NonExecutingSimpleAgentRunRequest(responses_create_params={"input": "hello"}, task_id="t1")
    assert row.model_extra == {"task_id": "t1"}
    assert "response" in NonExecutingSimpleAgentVerifyRequest.model_fields
