"""What a trainer gets back: one `Rollout` per /run (reward, the agent's answer, the token trajectory, or the failure)
and one `RolloutGroup` per task (its repeats: a GRPO group).

A rollout is built from the collector's `RolloutResult` (`nemo_gym.rollouts.collection`), so the reward, the
failure routing (`_ng_failure_class`, ...) and the attempt count are those `ng_collect_rollouts` would record; the
token trajectory is `nemo_gym.workbench.tokens.classify_trajectory`'s, the same one `ng export tokens` writes.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping, Optional

from nemo_gym.rollouts.collection import ROLLOUT_INDEX_KEY_NAME, TASK_INDEX_KEY_NAME, RolloutResult

__all__ = ["Rollout", "RolloutFailure", "RolloutGroup", "Trajectory", "rollout_from_result"]


@dataclass(frozen=True)
class Trajectory:
    """The token-level trajectory of a rollout's model calls, joined into one sequence (`workbench/tokens.py`).

    `prompt_ids`: the prompt of the first model call. `completion_ids`: everything after it - generated tokens and
    the tokens in between calls (tool outputs, chat-template glue). `logprobs`: the model's log prob per completion
    token (0.0 on tokens in between). `loss_mask`: 1 on generated tokens, 0 on tokens in between.
    `drift`: `"exact"` (every call continued the previous one token for token) or `"retokenized"` (the model server
    rebuilt some prompt from text; `retokenized_calls` says which, 1-based)."""

    prompt_ids: list[int]
    completion_ids: list[int]
    logprobs: list[float]
    loss_mask: list[int]
    drift: str
    num_model_calls: int
    retokenized_calls: list[int] = field(default_factory=list)


@dataclass(frozen=True)
class RolloutFailure:
    """Why a rollout has no usable result, after the collector's retry policy.

    `error_type`: `HTTPError`, `Timeout`, a transport error's name (`ConnectError`, ...), `InvalidResponse`, the
    failure class an agent declared (`judge_failed`, ...; then `failure_class` is set too), or `InvalidTask` (the
    task was refused before any /run: `message` says why). `attempts`: /run calls made. `server`: the innermost
    server the error names. `terminal`: the agent said not to retry."""

    error_type: str
    message: str
    attempts: int
    status_code: Optional[int] = None
    server: Optional[str] = None
    failure_class: Optional[str] = None
    terminal: bool = False


@dataclass(frozen=True)
class Rollout:
    """One rollout of a task.

    `result`: the agent's whole /run answer (`response`, `reward`, the verifier's fields, ...: the line
    `ng_collect_rollouts` would write; for a failure the agent declared, its answer; None when there was no
    answer), and `response` its Responses API object (`output` items, `usage`, ...). `reward` is None for a failed
    rollout (never a score). `reward_components`: a multi-reward verifier's named rewards, else None. `trajectory`:
    the joined token trajectory when the model server runs in training mode, else None; `token_problem` says why a
    rollout that carries token data has no usable trajectory (`unusable: tokens_not_contiguous: ...`), else None.
    `failure`: set when the rollout failed (the batch goes on)."""

    task_index: int
    repeat_index: int
    agent: Optional[str]
    reward: Optional[float]
    reward_components: Optional[dict[str, float]]
    result: Optional[dict]
    trajectory: Optional[Trajectory]
    failure: Optional[RolloutFailure] = None
    attempts: int = 0
    token_problem: Optional[str] = None

    @property
    def ok(self) -> bool:
        return self.failure is None

    @property
    def response(self) -> Optional[dict]:
        """The Responses API object of the agent's answer (`result["response"]`), or None."""
        value = self.result.get("response") if self.result is not None else None
        return value if isinstance(value, dict) else None


@dataclass(frozen=True)
class RolloutGroup:
    """The rollouts of one task (its `num_repeats` repeats, sorted by `repeat_index`), yielded when the last one
    finished. `task_index`: the task's position in the iterable given to `rollouts()`; `task`: that task as given."""

    task_index: int
    task: Any
    rollouts: list[Rollout]

    @property
    def rewards(self) -> list[Optional[float]]:
        return [r.reward for r in self.rollouts]

    @property
    def succeeded(self) -> list[Rollout]:
        """The rollouts that succeeded."""
        return [r for r in self.rollouts if r.ok]

    @property
    def failed(self) -> list[Rollout]:
        """The rollouts that failed (each with its `failure`)."""
        return [r for r in self.rollouts if not r.ok]

    def __len__(self) -> int:
        return len(self.rollouts)

    def __iter__(self):
        return iter(self.rollouts)


def _reward_components(result: Optional[Mapping[str, Any]]) -> Optional[dict[str, float]]:
    components = result.get("reward_components") if result is not None else None
    if not isinstance(components, Mapping):
        return None
    return {str(k): float(v) for k, v in components.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}


def _trajectory(result: Optional[Mapping[str, Any]]) -> tuple[Optional[Trajectory], Optional[str]]:
    """The rollout's `Trajectory` (None without token data) and, when token data is there but cannot be joined, why."""
    if result is None:
        return None, None
    from nemo_gym.workbench.tokens import classify_trajectory, has_token_data

    if not has_token_data(result):  # the common case off training mode: skip the classification
        return None, None
    checked = classify_trajectory(result)
    joined = checked.trajectory
    if joined is None:
        return None, checked.label + (f": {checked.detail}" if checked.detail else "")
    return (
        Trajectory(
            prompt_ids=joined.prompt_token_ids,
            completion_ids=joined.generation_token_ids,
            logprobs=joined.generation_log_probs,
            loss_mask=joined.loss_mask,
            drift=checked.kind,
            num_model_calls=joined.num_model_calls,
            retokenized_calls=list(joined.retokenized_calls),
        ),
        None,
    )


def rollout_from_result(result: RolloutResult) -> Rollout:
    """The `Rollout` of one of the collector's `RolloutResult`s."""
    row = result.row
    failure = None
    if not result.ok:
        failure = RolloutFailure(
            error_type=str(result.error_type),
            message=result.message or "",
            attempts=result.attempts,
            status_code=result.status_code,
            server=result.server,
            failure_class=result.failure_class,
            terminal=result.terminal,
        )
    answer = result.result
    trajectory, problem = _trajectory(answer) if result.ok else (None, None)
    return Rollout(
        task_index=int(row.get(TASK_INDEX_KEY_NAME) or 0),
        repeat_index=int(row.get(ROLLOUT_INDEX_KEY_NAME) or 0),
        agent=result.agent_name,
        reward=result.reward if result.ok else None,
        reward_components=_reward_components(answer) if result.ok else None,
        result=answer,
        trajectory=trajectory,
        failure=failure,
        attempts=result.attempts,
        token_problem=problem,
    )


def invalid_task_rollout(task_index: int, repeat_index: int, agent: Optional[str], message: str) -> Rollout:
    """A rollout of a task refused before any /run (`InvalidTask`)."""
    return Rollout(
        task_index=task_index,
        repeat_index=repeat_index,
        agent=agent,
        reward=None,
        reward_components=None,
        result=None,
        trajectory=None,
        failure=RolloutFailure(error_type="InvalidTask", message=message, attempts=0),
    )
