"""Trainers start NeMo Gym inside their own process (NeMo RL's environment actor, TRL's in-process example): Ray
initialized by the trainer, `RunHelper().start(GlobalConfigDictParserConfig(initial_global_config_dict=DictConfig(..),
skip_load_from_cli=True))`, `RolloutCollectionHelper().run_examples(...)`, `poll()`, `shutdown()`. The trainer here
is a script written as such an integration is (tests/fixtures/trainers/nemo_rl_style.py), run as its own process,
with a list `policy_base_url` (two fake vLLM ranks), token ids on, and the trainer's own argv beside ours."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from nemo_gym.testing.stack import FakeLLMBackend
from tests.conftest import REPO_ROOT, free_port

pytest.importorskip("ray")

TRAINER = REPO_ROOT / "tests" / "fixtures" / "trainers" / "nemo_rl_style.py"
CONFIG_PATHS = [
    "resources_servers/weather_tool_use/configs/weather_tool_use.yaml",
    "responses_api_models/vllm_model/configs/vllm_model_for_training.yaml",
]
AGENT = "weather_tool_use_simple_agent"


def script_for(rank: str) -> list[dict]:
    """A fake inference rank: calls the tool for Lisbon, then answers with the tool's output and its rank's name."""
    return [
        {"name": "boom", "match": {"last_user_contains": "BOOM"}, "status": 500, "error_message": "rank exploded"},
        {"name": "call", "match": {"step": 1, "tool_outputs": 0},
         "output": [{"type": "function_call", "name": "get_weather", "arguments": {"city": "Lisbon"}}]},
        {"name": "answer", "match": {"tool_outputs": 1},
         "output": [f"[{rank}] In Lisbon it is {{{{last_tool_output}}}}"]},
    ]


def weather_row(user_text: str, **extra) -> dict:
    row = json.loads((REPO_ROOT / "resources_servers/weather_tool_use/data/example.jsonl").read_text().splitlines()[0])
    row["responses_create_params"]["input"][-1]["content"] = user_text
    row["agent_ref"] = {"type": "responses_api_agents", "name": AGENT}
    row.update(extra)
    return row


def test_a_trainer_starts_the_stack_in_its_own_process_and_reads_what_trainers_read(tmp_path):
    backends = []
    for rank in ("rank0", "rank1"):
        script = tmp_path / f"{rank}.json"
        script.write_text(json.dumps(script_for(rank)))
        backends.append(FakeLLMBackend("--script", str(script), "--chat-prompt-token-ids").__enter__())
    try:
        rows = [weather_row("Tell me the current weather in Lisbon.", expected_city="Lisbon") for _ in range(4)]
        rows += [weather_row("What's the weather like in Oslo right now?", expected_city="Oslo") for _ in range(2)]
        spec = {
            "config_paths": CONFIG_PATHS,
            "policy_base_urls": [b.base_url for b in backends],
            "port_range": [20100, 20999],
            "head_port": free_port(),
            "scratch": str(tmp_path),
            "rows": rows,
            "failing_rows": [weather_row("BOOM", expected_city="Lisbon")],
            "bad_rows": [{"agent_ref": {"type": "responses_api_agents", "name": AGENT},
                          "responses_create_params": {"input": 42}}],
            # The resources server runs as a Ray actor on the trainer's own cluster.
            "server_overrides": {
                "weather_tool_use": {"resources_servers": {"weather_tool_use": {"ray_actor_options": {"num_cpus": 0}}}}
            },
        }
        # The trainer's own argv follows: it must not be read as config overrides.
        done = subprocess.run(
            [sys.executable, str(TRAINER), json.dumps(spec), "--config", "grpo.yaml", "+not_a_gym_key=1"],
            cwd=tmp_path, capture_output=True, text=True, timeout=600,
        )
    finally:
        for backend in backends:
            backend.stop()
    output = done.stdout + done.stderr
    assert done.returncode == 0, output[-6000:]
    report = json.loads(next(line for line in done.stdout.splitlines() if line.startswith("TRAINER_RESULT "))[15:])

    rollouts = report["rollouts"]
    assert len(rollouts) == 6
    for rollout in rollouts:
        assert len(rollout["calls"]) == 2, rollout  # the tool call, then the answer
        # (The fake's ids are made up: one per word of the text, none for a tool call; contiguity is not checked.)
        for call in rollout["calls"]:
            assert call["prompt_token_ids"] and isinstance(call["generation_token_ids"], list)
            assert len(call["generation_token_ids"]) == len(call["generation_log_probs"])
        assert rollout["calls"][-1]["generation_token_ids"]
        assert set(rollout["reward_components"]) >= {"called_tool", "right_city", "used_tool_output"}
        expected = 1.0 if "Lisbon" in rollout["task"] else 0.0
        assert rollout["reward"] == expected, rollout
    # A list policy_base_url spreads rollouts over the ranks; each rollout's calls stay on one rank.
    ranks = [r["final_text"].split("]")[0].lstrip("[") for r in rollouts]
    assert set(ranks) == {"rank0", "rank1"}, ranks

    assert report["server_error"]["client_response_error"], report["server_error"]  # aiohttp's, as v0.5 raises
    assert report["server_error"]["status"] == 500, report["server_error"]
    assert "rank exploded" in report["server_error"]["response_content"], report["server_error"]
    assert 400 <= report["bad_row"]["status"] < 500, report["bad_row"]

    assert report["ray_still_initialized_before_shutdown"] and report["trainer_ray_connected_after_shutdown"]
    assert len(report["server_pids"]) == 2 and report["server_groups_alive_after_shutdown"] == []
    assert report["ray_actor_servers"] == ["weather_tool_use"]
    for host, port in report["server_addresses"]:  # default_host and the port range the trainer chose
        assert host == "127.0.0.1" and 20100 <= port <= 20999, report["server_addresses"]
    assert report["actors_left_on_the_trainers_cluster"] == []
    assert "not_a_gym_key" not in output


# ------------------------------------------------------------------------------------------------------------------
# The lifecycle inside this very process: poll() names a server that is gone for good; dry_run starts nothing.

COUNTER_ONLY = {
    "restart_counter_resources_server": {
        "resources_servers": {"restart_counter": {"entrypoint": "app.py", "domain": "agent"}}
    },
}


@pytest.fixture
def in_process(monkeypatch):
    """A trainer's process: the server folders are found from its working directory; its argv is pytest's."""
    from nemo_gym.config.global_config import reset_global_config_dict_cache
    from tests.conftest import FIXTURE_STACK

    monkeypatch.chdir(FIXTURE_STACK)
    helpers = []
    yield helpers
    for helper in helpers:
        helper.shutdown()
    reset_global_config_dict_cache()


def start_in_process(helpers: list, **extra):
    from omegaconf import DictConfig

    from nemo_gym.cli import GlobalConfigDictParserConfig, RunHelper

    config = {**COUNTER_ONLY, "head_server": {"host": "127.0.0.1", "port": free_port()}, **extra}
    helper = RunHelper()
    helpers.append(helper)
    helper.start(GlobalConfigDictParserConfig(initial_global_config_dict=DictConfig(config), skip_load_from_cli=True))
    return helper


def test_poll_raises_naming_a_server_that_is_gone_for_good_and_shutdown_leaves_nothing(in_process):
    import os
    import signal
    import time

    from nemo_gym.server_utils import get_global_config_dict

    helper = start_in_process(in_process, restart_policy={"max_restarts": 0})
    assert get_global_config_dict().head_server.host == "127.0.0.1"  # installed as this process's config
    helper.poll()
    (server,) = helper.servers
    pid = server.popen.pid
    os.killpg(pid, signal.SIGKILL)
    deadline = time.monotonic() + 60
    while True:
        try:
            helper.poll()
        except RuntimeError as exc:
            assert "restart_counter_resources_server" in str(exc), exc
            break
        assert time.monotonic() < deadline, "poll() never reported the killed server"
        time.sleep(0.2)
    helper.shutdown()
    helper.shutdown()  # a second call does nothing
    with pytest.raises(ProcessLookupError):
        os.killpg(pid, 0)


def test_dry_run_prepares_and_starts_nothing(in_process):
    helper = start_in_process(in_process, dry_run=True)
    assert helper.head is None
    assert [s.popen for s in helper.servers] == [None]
    helper.poll()  # nothing to report
