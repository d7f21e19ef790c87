"""Gymnasium-style environments (NeMo Gym v0.5 §10).

1. `GymnasiumServer`'s routes through its real app: `/reset`, `/step`, `/aggregate_metrics`, sessions, the rollout
   prefix, the hooks (`reset`, `step`, `close_session`) and what they are given; no `/seed_session`, `/verify` or
   `/reverify_mode`.
2. End to end through real processes: `ng_run` with frozen_lake (built on the `gymnasium` package), gymnasium_agent
   and openai_model in front of the scripted fake LLM, then `ng_collect_rollouts` on frozen_lake's example data.
   The rewards are the games' real outcomes: winning players get 1, losing ones 0.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from typing import Any, Optional

import httpx
import pytest
from fastapi.testclient import TestClient
from pydantic import Field

from nemo_gym import PARENT_DIR
from nemo_gym.base_resources_server import BaseResourcesServerConfig
from nemo_gym.errors import NeMoGymConfigError
from nemo_gym.openai_utils import NeMoGymResponse
from nemo_gym.servers.rollout_context import current_rollout_id
from nemo_gym.testing.e2e import OPENAI_MODEL_CONFIG
from nemo_gym.testing.responses import function_call, make_response, message, reasoning
from nemo_gym.testing.servers import example_rows, make_server
from nemo_gym.testing.stack import FakeLLMBackend, NgRunStack, fake_llm_overrides, free_port, server_instances
from resources_servers.frozen_lake.tests.player import stubborn_player, tool_player, winning_moves
from resources_servers.gymnasium import (
    EnvResetRequest,
    EnvResetResponse,
    EnvStepRequest,
    EnvStepResponse,
    GymnasiumServer,
    extract_text,
    tool_output,
)

# ------------------------------------------------------------------------------------------------------------
# 1. The server's routes


class CountingEnv(GymnasiumServer):
    """Counts steps per session; ends the episode at the row's `end_at` step, as `end_how` says."""

    config: BaseResourcesServerConfig
    seen: list[dict] = Field(default_factory=list)
    closed: list[str] = Field(default_factory=list)

    async def reset(self, metadata: dict[str, Any], session_id: str):
        self.seen.append({"hook": "reset", "metadata": metadata, "session": session_id, "rollout": current_rollout_id()})
        self.session_state[session_id] = 0
        return f"start {metadata.get('label')}", {"label": metadata.get("label")}

    async def step(self, action: NeMoGymResponse, metadata: dict[str, Any], session_id: str):
        self.seen.append({"hook": "step", "metadata": metadata, "session": session_id, "action": action,
                          "rollout": current_rollout_id()})
        n = self.session_state[session_id] = self.session_state[session_id] + 1
        ended = n == metadata.get("end_at")
        how = metadata.get("end_how", "terminated")
        return f"step {n}", 0.25, ended and how == "terminated", ended and how == "truncated", {"n": n}

    async def close_session(self, session_id: str) -> None:
        self.closed.append(session_id)
        await super().close_session(session_id)


class StepOnlyEnv(GymnasiumServer):
    config: BaseResourcesServerConfig

    async def step(self, action, metadata, session_id):
        return None, 1.0, True, False, {}


PARAMS = {"input": "play"}


def counting_env() -> tuple[CountingEnv, TestClient]:
    env = make_server(CountingEnv, name="counting", domain="games")
    return env, TestClient(env.build_app())


def action(*items: Any) -> dict:
    return make_response(*items).model_dump()


def test_the_routes_are_reset_step_and_aggregate_metrics_only():
    env, client = counting_env()
    posts = {r.path for r in env.build_app().router.routes if "POST" in (getattr(r, "methods", None) or ())}
    assert posts == {"/reset", "/step", "/aggregate_metrics"}
    assert client.post("/seed_session", json={"responses_create_params": PARAMS}).status_code == 404
    assert client.post("/verify", json={"responses_create_params": PARAMS}).status_code == 404
    assert client.get("/reverify_mode").status_code == 404
    assert client.get("/health").status_code == 200 and client.get("/").json() == {"status": "ok"}


def test_a_server_needs_step_but_not_verify():
    with pytest.raises(TypeError, match="step"):
        make_server(GymnasiumServer, name="bare", domain="games")
    env = make_server(StepOnlyEnv, name="step_only", domain="games")  # no verify of its own
    client = TestClient(env.build_app())
    reset = client.post("/reset", json={"responses_create_params": PARAMS})
    assert reset.status_code == 200 and reset.json() == {"observation": None, "info": {}}  # the default reset
    stepped = client.post("/step", json={"responses_create_params": PARAMS, "response": action("hi")})
    assert stepped.json() == {"observation": None, "reward": 1.0, "terminated": True, "truncated": False, "info": {}}


def test_the_hooks_get_the_row_fields_the_action_and_one_session_per_client():
    env, client = counting_env()
    row = {"responses_create_params": PARAMS, "label": "a", "end_at": 2, "nested": {"x": [1, None]}}
    reset = client.post("/reset", json=row)
    assert reset.status_code == 200, reset.text
    assert reset.json() == {"observation": "start a", "info": {"label": "a"}}
    response = action(reasoning("hm"), message("go ", "left"), function_call("move", {"d": "left"}, call_id="c1"))
    first = client.post("/step", json={**row, "response": response})
    assert first.json() == {"observation": "step 1", "reward": 0.25, "terminated": False, "truncated": False,
                            "info": {"n": 1}}
    fields = {"label": "a", "end_at": 2, "nested": {"x": [1, None]}}
    assert [s["metadata"] for s in env.seen] == [fields, fields]  # no responses_create_params, no response
    step_action = env.seen[1]["action"]
    assert isinstance(step_action, NeMoGymResponse) and extract_text(step_action) == "go left"
    assert env.seen[0]["session"] == env.seen[1]["session"]  # the session cookie ties reset and step together

    other = TestClient(client.app)  # another rollout: its own cookie, its own session
    other.post("/reset", json={**row, "label": "b"})
    assert env.seen[-1]["session"] != env.seen[0]["session"]
    assert client.post("/step", json={**row, "response": response}).json()["info"] == {"n": 2}


@pytest.mark.parametrize("how", ["terminated", "truncated"])
def test_the_session_is_closed_after_the_step_that_ends_the_episode(how):
    env, client = counting_env()
    row = {"responses_create_params": PARAMS, "end_at": 2, "end_how": how}
    client.post("/reset", json=row)
    client.post("/step", json={**row, "response": action("one")})
    assert env.closed == [] and len(env.session_state) == 1
    last = client.post("/step", json={**row, "response": action("two")}).json()
    assert last[how] is True
    assert env.closed == [env.seen[0]["session"]] and env.session_state == {}


def test_prefixed_calls_are_served_in_their_rollout():
    env, client = counting_env()
    row = {"responses_create_params": PARAMS, "label": "p"}
    assert client.post("/ng-rollout/3-1/reset", json=row).status_code == 200
    assert client.post("/ng-rollout/3-1/step", json={**row, "response": action("x")}).status_code == 200
    assert client.post("/step", json={**row, "response": action("y")}).status_code == 200
    assert [s["rollout"] for s in env.seen] == ["3-1", "3-1", None]
    assert env.seen[0]["session"] == env.seen[2]["session"]


def test_bad_bodies_are_422():
    _, client = counting_env()
    assert client.post("/reset", json={"label": "no params"}).status_code == 422
    assert client.post("/step", json={"responses_create_params": PARAMS}).status_code == 422  # no response
    bad = client.post("/step", json={"responses_create_params": PARAMS, "response": {"output": "nope"}})
    assert bad.status_code == 422


def test_a_step_out_of_order_is_a_409_and_a_bad_limit_stops_the_server():
    env, client = counting_env()
    row = {"responses_create_params": PARAMS, "end_at": 1}
    before = client.post("/step", json={**row, "response": action("x")})
    assert before.status_code == 409 and "no episode" in before.json()["detail"]
    client.post("/reset", json=row)
    assert client.post("/step", json={**row, "response": action("x")}).json()["terminated"]
    after = client.post("/step", json={**row, "response": action("x")})
    assert after.status_code == 409 and "ended at step 1 (terminated)" in after.json()["detail"]
    assert [s["hook"] for s in env.seen] == ["reset", "step"]  # the refused steps never reached the hook

    with pytest.raises(NeMoGymConfigError, match="`max_live_games` must be a positive whole number"):
        make_server(CountingEnv, name="counting", domain="games", max_live_games=0).build_app()


def test_idle_games_are_closed_without_further_requests():
    """The server's timer closes a game left unplayed for `game_idle_timeout_s`, with nothing else coming in."""
    env = make_server(CountingEnv, name="counting", domain="games", game_idle_timeout_s=0.2)
    with TestClient(env.build_app()) as client:  # its event loop runs until the block ends
        row = {"responses_create_params": PARAMS}
        assert client.post("/reset", json=row).status_code == 200
        deadline = time.monotonic() + 60  # an upper bound for the timer, never a measured time
        while not env.closed:
            assert time.monotonic() < deadline, "the idle game was never closed"
            time.sleep(0.05)
        assert env.session_state == {} and env.closed == [env.seen[0]["session"]]
        gone = client.post("/step", json={**row, "response": action("x")})
        assert gone.status_code == 410 and "unplayed for 0.2 s (game_idle_timeout_s)" in gone.json()["detail"]


def test_aggregate_metrics_over_the_environments_results():
    _, client = counting_env()
    body = {"verify_responses": [
        {"_ng_task_index": 0, "_ng_rollout_index": 0, "reward": 1.0, "terminated": True},
        {"_ng_task_index": 0, "_ng_rollout_index": 1, "reward": 0.0, "terminated": False},
    ]}
    answer = client.post("/aggregate_metrics", json=body)
    assert answer.status_code == 200, answer.text
    metrics = answer.json()
    assert metrics["agent_metrics"]["mean/reward"] == 0.5 and metrics["agent_metrics"]["mean/terminated"] == 0.5
    assert metrics["key_metrics"]["mean/reward"] == 0.5


def test_the_helpers_and_models():
    call = function_call("move", {"d": 1}, call_id="call_9")
    assert tool_output(call, {"ok": True}) == {"call_id": "call_9", "output": '{"ok": true}'}
    model_call = make_response(call).output[0]
    assert tool_output(model_call, "text") == {"call_id": "call_9", "output": '"text"'}
    with pytest.raises(ValueError, match="call_id"):
        tool_output({"name": "move"}, 1)

    response = make_response(reasoning("think"), message("a", "b"), call, message("c", msg_id="msg_2"))
    assert extract_text(response) == "abc"
    assert extract_text(response.model_dump()) == "abc"  # a plain dict too
    assert extract_text(make_response(call)) == ""

    assert EnvResetResponse().model_dump() == {"observation": None, "info": {}}
    assert EnvStepResponse().model_dump() == {"observation": None, "reward": 0.0, "terminated": False,
                                              "truncated": False, "info": {}}
    request = EnvStepRequest.model_validate({"responses_create_params": PARAMS, "response": action("x"), "seed": 4})
    assert request.model_extra == {"seed": 4} and isinstance(request, EnvResetRequest)


# ------------------------------------------------------------------------------------------------------------
# 2. End to end: ng_run + ng_collect_rollouts on frozen_lake's example data

FROZEN_LAKE_CONFIG = "resources_servers/frozen_lake/configs/frozen_lake.yaml"
AGENT = "frozen_lake_gymnasium_agent"
RESOURCES = "frozen_lake"
ROWS = example_rows(PARENT_DIR / "resources_servers" / "frozen_lake" / "tests" / "test_e2e.py")

# Rows 1, 2 and 4 are played perfectly; row 0 steps right into the hole next to the start; row 3 walks into the
# top edge every turn until gymnasium_agent's max_steps (20 in the config) ends the episode.
SCRIPT = [
    *tool_player(ROWS[0], ["right"]),
    *tool_player(ROWS[1], winning_moves(ROWS[1])),
    *tool_player(ROWS[2], winning_moves(ROWS[2])),
    *stubborn_player(ROWS[3], "up"),
    *tool_player(ROWS[4], winning_moves(ROWS[4])),
]


@pytest.fixture(scope="module")
def collected(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("gymnasium_e2e")
    script = tmp / "script.json"
    script.write_text(json.dumps(SCRIPT))
    head_port = free_port()
    output = tmp / "rollouts.jsonl"
    with FakeLLMBackend("--script", str(script)) as backend:
        stack = NgRunStack(
            fake_llm_overrides([FROZEN_LAKE_CONFIG, OPENAI_MODEL_CONFIG], backend.base_url, head_port), cwd=PARENT_DIR
        )
        try:
            stack.wait_for("All 3 / 3 servers ready!", timeout=180)
            collect = subprocess.run(
                [sys.executable, "-c", "from nemo_gym.cli import collect_rollouts; collect_rollouts()",
                 f"+agent_name={AGENT}", f"+input_jsonl_fpath={PARENT_DIR / 'resources_servers/frozen_lake/data/example.jsonl'}",
                 f"+output_jsonl_fpath={output}", f"+head_server.port={head_port}", "+progress_bar=false"],
                cwd=tmp, capture_output=True, text=True, env={**os.environ, "PYTHONUNBUFFERED": "1"}, timeout=600,
            )
            assert collect.returncode == 0, f"{collect.stdout}\n{collect.stderr}\n{stack.tail(80)}"
            urls = {i["process_name"]: i["url"] for i in server_instances(head_port)}
            rows = sorted((json.loads(line) for line in output.read_text().splitlines() if line.strip()),
                          key=lambda r: r["_ng_task_index"])
            yield {"rows": rows, "urls": urls, "output": output}
        finally:
            assert stack.stop(timeout=60) == 0, stack.tail(80)


def test_the_rewards_are_the_games_outcomes(collected):
    rows = collected["rows"]
    assert [r["reward"] for r in rows] == [0.0, 1.0, 1.0, 0.0, 1.0]
    assert [r["info"]["status"] for r in rows] == ["lost", "won", "won", "playing", "won"]
    assert [(r["terminated"], r["truncated"]) for r in rows] == [
        (True, False), (True, False), (True, False), (False, True), (True, False)
    ]
    assert [r["info"]["moves"] for r in rows] == [1, 6, 6, 20, 8]
    assert [r["agent_ref"]["name"] for r in rows] == [AGENT] * 5
    assert [r["map_seed"] for r in rows] == [row["map_seed"] for row in ROWS]


def test_the_trajectory_is_the_whole_conversation(collected):
    won = collected["rows"][1]
    output = won["response"]["output"]
    assert output[0]["role"] == "user" and "map seed 11." in output[0]["content"]
    calls = [o for o in output if o["type"] == "function_call"]
    results = [json.loads(o["output"]) for o in output if o["type"] == "function_call_output"]
    assert [json.loads(c["arguments"])["direction"] for c in calls] == winning_moves(ROWS[1])
    assert [r["moves"] for r in results] == [1, 2, 3, 4, 5]  # the winning move's result ends the episode unread
    assert results[-1]["board"][-1].endswith("G") and won["info"]["position"] == [3, 3]
    assert won["response"]["usage"]["total_tokens"] == 6 * 15  # six model calls, summed
    # The truncated one made exactly max_steps model calls.
    assert sum(o["type"] == "function_call" for o in collected["rows"][3]["response"]["output"]) == 20


def test_aggregate_metrics_come_from_the_environment(collected):
    written = json.loads(collected["output"].with_name("rollouts_aggregate_metrics.json").read_text())
    assert [entry["agent_ref"]["name"] for entry in written] == [AGENT]
    assert written[0]["agent_metrics"]["mean/reward"] == pytest.approx(0.6)
    assert written[0]["agent_metrics"]["mean/truncated"] == pytest.approx(0.2)

    # the agent answers with what the resources server answers
    body = {"verify_responses": [{k: r[k] for k in ("_ng_task_index", "_ng_rollout_index", "reward", "terminated")}
                                 for r in collected["rows"]]}
    via_agent = httpx.post(collected["urls"][AGENT] + "/aggregate_metrics", json=body, timeout=60)
    direct = httpx.post(collected["urls"][RESOURCES] + "/aggregate_metrics", json=body, timeout=60)
    assert via_agent.status_code == 200 and direct.status_code == 200, (via_agent.text, direct.text)
    assert via_agent.json() == direct.json()
    assert via_agent.json()["agent_metrics"]["mean/terminated"] == pytest.approx(0.8)
