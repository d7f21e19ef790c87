"""`ng_e2e_collect_rollouts` in one command: prepare the example split, start the stack, collect, profile, stop."""

import json
import subprocess
import sys

import psutil

from tests.conftest import REPO_ROOT, free_port

CONFIGS = (
    "resources_servers/example_single_tool_call/configs/example_single_tool_call.yaml,"
    "responses_api_models/openai_model/configs/openai_model.yaml"
)


def test_e2e_collects_profiles_and_leaves_nothing_running(tmp_path):
    backend_port = free_port()
    backend = subprocess.Popen(
        [sys.executable, "-m", "nemo_gym.testing.fake_openai_server", "--port", str(backend_port),
         "--tool-args", '{"city": "Oslo"}'],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    try:
        out = tmp_path / "run" / "rollouts.jsonl"
        result = subprocess.run(
            [sys.executable, "-c", "from nemo_gym.cli import e2e_collect_rollouts; e2e_collect_rollouts()",
             f"+config_paths=[{CONFIGS}]", "+split=example", f"+output_jsonl_fpath={out}",
             f"+policy_base_url=http://127.0.0.1:{backend_port}/v1", "+policy_api_key=x",
             "+policy_model_name=fake", f"+head_server.port={free_port()}", "+num_repeats=2"],
            cwd=REPO_ROOT, capture_output=True, text=True, timeout=600,
        )
    finally:
        backend.terminate()
        backend.wait(timeout=10)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert sorted((r["_ng_task_index"], r["_ng_rollout_index"]) for r in rows) == [(t, k) for t in range(5) for k in range(2)]
    assert all(r["reward"] == 1.0 for r in rows)
    assert (tmp_path / "run" / "preprocessed_datasets" / "example.jsonl").exists()
    metrics = json.loads((tmp_path / "run" / "rollouts_agent_metrics.json").read_text())
    assert metrics[0]["agent_ref"]["name"] == "example_single_tool_call_simple_agent"
    assert metrics[0]["mean/reward"] == 1.0
    assert "Stopping 3 server(s)" in result.stdout
    # The stack is gone: none of the server PIDs from the ready table survives.
    pids = [int(line.split()[-1]) for line in result.stdout.splitlines()
            if "http://127.0.0.1:" in line and line.split()[-1].isdigit()]
    assert len(pids) == 4  # three servers and the head server (this process, now exited)
    assert not [p for p in pids if psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE]
