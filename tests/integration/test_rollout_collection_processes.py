"""Rollout collection in a real child process: Ctrl-C (SIGINT) in the middle of a collection stops it cleanly, with
exit code 130 and a resume hint, after the materialized inputs were written. The rest of collection, against an
in-process agent, is tests/unit/test_rollout_collection.py."""

from __future__ import annotations

import signal
import subprocess
import sys

from tests.unit.test_rollout_collection import make_input

INTERRUPTIBLE = """
import asyncio, sys, httpx
from nemo_gym.rollouts.collection import RolloutCollectionConfig, run_from_config
from nemo_gym.http.client import ServerClient

async def handler(request):
    print("started", flush=True)
    await asyncio.Event().wait()

cfg = {"agent": {"responses_api_agents": {"impl": {"host": "127.0.0.1", "port": 9}}}}
client = ServerClient(global_config_dict=cfg, transport=httpx.MockTransport(handler))
config = RolloutCollectionConfig(
    input_jsonl_fpath=sys.argv[1], output_jsonl_fpath=sys.argv[2], agent_name="agent", progress_bar=False
)
sys.exit(run_from_config(config, server_client=client))
"""


def test_ctrl_c_stops_cleanly_with_exit_code_130_and_a_resume_hint(tmp_path):
    make_input(tmp_path, 3)
    proc = subprocess.Popen(
        [sys.executable, "-c", INTERRUPTIBLE, str(tmp_path / "in.jsonl"), str(tmp_path / "o.jsonl")],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout.readline().strip() == "started"
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, err
    assert "Interrupted" in err and "resume_from_cache=true" in err and "Traceback" not in err
    assert (tmp_path / "o_materialized_inputs.jsonl").exists()
