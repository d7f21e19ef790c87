"""A training stack (`ng_run`: vllm_model in training mode, the gated counter, simple_agent) in front of a backend
that answers as NeMo RL's vLLM HTTP server does: the token bundle on `choices[0].message` and no per-token logprobs
list (the fake backend's `--message-token-bundle`). vllm_model reads the bundle as given (before this, it answered
such a backend with HTTP 500, "no per-token logprobs"); every rollout carries the bundle's ids on each call's last
output item, and its token trajectory joins."""

from __future__ import annotations

from nemo_gym.testing.stack import FakeLLMBackend
from nemo_gym.training import RolloutClient
from tests.conftest import FIXTURE_STACK
from tests.integration.test_training_api import FAST_RETRY, SCRIPT, TRAINING_STACK, row


async def test_rollouts_read_nemo_rl_message_token_bundle(tmp_path):
    config = tmp_path / "training_stack.yaml"
    config.write_text(TRAINING_STACK)
    with FakeLLMBackend("--script", str(SCRIPT), "--message-token-bundle") as backend:
        overrides = [f"+policy_base_url={backend.base_url}", "+policy_api_key=dummy", "+policy_model_name=fake-model"]
        async with RolloutClient.start([str(config)], overrides, cwd=FIXTURE_STACK, max_in_flight=4,
                                       ready_timeout_s=300, **FAST_RETRY) as client:
            groups = [g async for g in client.rollouts([row(1, 0), row(2, 5)], num_repeats=2)]
    assert sorted(g.task_index for g in groups) == [0, 1]
    for group in groups:
        assert group.rewards == [1.0, 1.0], group
        for rollout in group.rollouts:
            calls = [item for item in rollout.response["output"] if "prompt_token_ids" in item]
            assert [c["type"] for c in calls] == ["function_call", "message"], rollout.response["output"]
            call, answer = calls
            # The fake's bundle: prompt ids 100 + k per message; generated ids 1000 + k per word of the text.
            assert call["prompt_token_ids"] == [100] and answer["prompt_token_ids"] == [100, 101, 102]
            assert call["generation_token_ids"] == call["generation_log_probs"] == []  # a tool call: no text words
            words = answer["content"][0]["text"].split()
            assert answer["generation_token_ids"] == [1000 + k for k in range(len(words))]
            assert answer["generation_log_probs"] == [-0.5] * len(words)
            assert rollout.trajectory is not None, rollout.token_problem
            assert rollout.trajectory.num_model_calls == 2
