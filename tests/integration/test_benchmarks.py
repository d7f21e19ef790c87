"""Every shipped benchmark definition runs end to end with one command on the embedded model (SmolLM2-135M):
its data is generated offline by its prepare script, collated, rolled out on a real stack and scored by its real
resources server. Run from an empty directory, so the definitions and their data are found in the install root."""

import json
import math
import subprocess
import sys

import pytest

from nemo_gym.rollouts.benchmarks import discover_benchmarks
from tests.conftest import REPO_ROOT, free_port

pytest.importorskip("llama_cpp", reason='the embedded model needs the local extra: pip install -e ".[local]"')

MODEL_CONFIG = "responses_api_models/local_llama_model/configs/local_llama_model.yaml"
SHIPPED = sorted(b.name for b in discover_benchmarks([REPO_ROOT]).values())


def test_at_least_five_benchmarks_ship():
    assert len(SHIPPED) >= 5, SHIPPED


@pytest.mark.parametrize("name", SHIPPED)
def test_benchmark_runs_end_to_end_on_the_embedded_model(name, tmp_path, monkeypatch):
    monkeypatch.delenv("NEMO_GYM_EXTRA_ROOTS", raising=False)
    out = tmp_path / "run" / "rollouts.jsonl"
    result = subprocess.run(
        [sys.executable, "-c", "from nemo_gym.cli import e2e_collect_rollouts; e2e_collect_rollouts()",
         f"+config_paths=[benchmarks/{name}/config.yaml,{MODEL_CONFIG}]", "+split=benchmark",
         f"+output_jsonl_fpath={out}", "+limit=2", f"+head_server.port={free_port()}",
         "+responses_create_params.max_output_tokens=64"],
        cwd=tmp_path, capture_output=True, text=True, timeout=900,
    )
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-4000:]
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(rows) == 2
    for row in rows:
        reward = row["reward"]
        assert isinstance(reward, (int, float)) and not isinstance(reward, bool) and math.isfinite(reward), row
        assert row["agent_ref"]["name"] == discover_benchmarks([REPO_ROOT])[name].agent_name
        assert row["response"]["output"], row
    collated = tmp_path / "run" / "preprocessed_datasets" / "benchmark.jsonl"
    assert len(collated.read_text().splitlines()) >= 20  # the whole benchmark was prepared, the run took 2 rows
    assert (tmp_path / "run" / "rollouts_agent_metrics.json").exists()
    assert (tmp_path / "run" / "rollouts_materialized_inputs.jsonl").exists()
