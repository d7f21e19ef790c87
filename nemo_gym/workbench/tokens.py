"""The token-level trajectory of a rollout, for RL trainers: one prompt, one generation, a log prob and a loss-mask
bit per generated position.

A model server in training mode (vllm_model with `return_token_id_information: true`) puts three fields on the last
output item of every model call: `prompt_token_ids` (the whole prompt of that call, as the backend tokenized it),
`generation_token_ids` and `generation_log_probs`. A multi-step episode has one such item per call, and the prompt
of call k+1 is the prompt of call k, its generation and then what came back in between (tool outputs, chat-template
glue). The trajectory joins them into one sequence:

    prompt_token_ids      = prompt of call 1
    generation_token_ids  = gen 1 + between(1, 2) + gen 2 + ...
    generation_log_probs  = the model's log probs on generated tokens, 0.0 on the tokens in between
    loss_mask             = 1 on generated tokens, 0 on the tokens in between

That only works when each prompt starts with everything before it (`tokens_not_contiguous` otherwise, e.g. when
the chat template re-renders earlier turns differently); every model output must carry its token data
(`token_data_mismatch` otherwise), and a rollout without any is `no_token_data`.

**Drift check.** `classify_trajectory` puts every rollout in one of three classes, the one place the export
(`ng export tokens`), the viewer (`ng view`) and the collector's end summary take it from:

- `exact`: every call's prompt continues the previous prompt + generation token for token, and no call says its
  prompt was re-tokenized;
- `retokenized`: joinable into one trajectory, but some model call says `token_trajectory: "retokenized"` on its
  token item (the model server rebuilt that prompt from text as a fallback instead of from the previous call's
  ids; the ids still line up, but the model did not necessarily see them that way in training);
- `unusable`: with the reason (`no_token_data`, `token_data_mismatch`, `tokens_not_contiguous`, ...).

The flag `token_trajectory` (`"exact"` | `"retokenized"`) sits on the same output item as the token ids. NeMo Gym
v0.5 has no such field (its token metadata is only the three id fields and `routed_experts`, "no separate prefix
field"), so the name is ours. Data without it (older servers, v0.5) is classified from contiguity alone, as
before. The flag of the first call is not read (nothing comes before it to continue), and a value other than the
two is taken as `retokenized` (not shown to be exact) with the value named in the detail.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Mapping, Optional

from nemo_gym.api.chat_conversion import TOKEN_FIELDS
from nemo_gym.workbench.conversation import Unusable, response_output

__all__ = [
    "TRAJECTORY_FLAG",
    "TRAJECTORY_CLASSES",
    "TokenTrajectory",
    "TrajectoryClass",
    "TrajectoryCounts",
    "classify_trajectory",
    "has_token_data",
    "token_trajectory",
]

# The key on a model call's token item that says how its prompt was built; also the marker of an exported row.
TRAJECTORY_FLAG = "token_trajectory"
EXACT, RETOKENIZED, UNUSABLE = "exact", "retokenized", "unusable"
TRAJECTORY_CLASSES = (EXACT, RETOKENIZED, UNUSABLE)

# Items a model call produces; a run of them ends with the item that carries the call's token data.
_MODEL_ITEM_TYPES = frozenset({"reasoning", "function_call"})


@dataclass
class TokenTrajectory:
    prompt_token_ids: list[int]
    generation_token_ids: list[int]
    generation_log_probs: list[float]
    loss_mask: list[int]
    num_model_calls: int
    # The model calls (1-based) whose prompt the model server says it re-tokenized (or flagged with a value it
    # should not have: `flag_notes`); empty for an exact trajectory.
    retokenized_calls: list[int] = field(default_factory=list)
    flag_notes: list[str] = field(default_factory=list)

    @property
    def kind(self) -> str:
        return RETOKENIZED if self.retokenized_calls else EXACT


def _is_model_item(item: Mapping[str, Any]) -> bool:
    kind = item.get("type")
    return kind in _MODEL_ITEM_TYPES or (kind in (None, "message") and item.get("role") == "assistant")


def _ints(value: Any, name: str, call: int) -> list[int]:
    if not isinstance(value, list) or not all(isinstance(v, int) and not isinstance(v, bool) for v in value):
        raise Unusable("token_data_mismatch", f"model call {call}: `{name}` is not a list of integers")
    return value


def _floats(value: Any, name: str, call: int) -> list[float]:
    if not isinstance(value, list) or not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in value):
        raise Unusable("token_data_mismatch", f"model call {call}: `{name}` is not a list of numbers")
    return [float(v) for v in value]


def token_trajectory(rollout: Mapping[str, Any]) -> TokenTrajectory:
    """The joined token sequence of a rollout's model calls; `Unusable` when there is none or it cannot be joined."""
    output = response_output(rollout)
    calls: list[Mapping[str, Any]] = []
    uncovered = False  # a model item seen since the last item with token data
    missing = 0  # model outputs that ended (a tool output came next) without token data
    for item in output:
        if not isinstance(item, Mapping):
            continue
        if any(key in item for key in TOKEN_FIELDS):
            calls.append(item)
            uncovered = False
        elif _is_model_item(item):
            uncovered = True
        elif uncovered:
            missing += 1
            uncovered = False
    missing += uncovered
    if not calls:
        raise Unusable("no_token_data", "no output item carries prompt_token_ids / generation_token_ids")
    if missing:
        raise Unusable("token_data_mismatch", f"{missing} model output(s) without token data next to {len(calls)} with")

    prompt: list[int] = []
    generation: list[int] = []
    log_probs: list[float] = []
    mask: list[int] = []
    seen: list[int] = []  # prompt + everything after it so far
    retokenized: list[int] = []
    notes: list[str] = []
    for number, item in enumerate(calls, start=1):
        call_prompt = _ints(item.get("prompt_token_ids"), "prompt_token_ids", number)
        call_gen = _ints(item.get("generation_token_ids"), "generation_token_ids", number)
        call_lps = _floats(item.get("generation_log_probs"), "generation_log_probs", number)
        if len(call_gen) != len(call_lps):
            raise Unusable(
                "token_data_mismatch",
                f"model call {number}: {len(call_gen)} generated tokens but {len(call_lps)} log probs",
            )
        if number == 1:
            prompt = list(call_prompt)
            seen = list(call_prompt)
        else:
            flag = item.get(TRAJECTORY_FLAG)
            if call_prompt[: len(seen)] != seen:
                said = f" (the model server flagged it {TRAJECTORY_FLAG}={flag!r})" if flag is not None else ""
                raise Unusable(
                    "tokens_not_contiguous",
                    f"the prompt of model call {number} does not start with the tokens of the calls before it{said}",
                )
            if flag is not None and flag != EXACT:
                retokenized.append(number)
                if flag != RETOKENIZED:
                    notes.append(f"model call {number}: {TRAJECTORY_FLAG}={flag!r} (expected 'exact' or 'retokenized')")
            between = call_prompt[len(seen):]
            generation.extend(between)
            log_probs.extend([0.0] * len(between))
            mask.extend([0] * len(between))
            seen.extend(between)
        generation.extend(call_gen)
        log_probs.extend(call_lps)
        mask.extend([1] * len(call_gen))
        seen.extend(call_gen)
    return TokenTrajectory(prompt, generation, log_probs, mask, len(calls), retokenized, notes)


# ------------------------------------------------------------------------------------------------ drift check


def has_token_data(rollout: Mapping[str, Any]) -> bool:
    """Whether any output item of the rollout's response carries token ids (never raises)."""
    response = rollout.get("response") if isinstance(rollout, Mapping) else None
    output = response.get("output") if isinstance(response, Mapping) else None
    if not isinstance(output, list):
        return False
    return any(isinstance(item, Mapping) and any(key in item for key in TOKEN_FIELDS) for item in output)


@dataclass(frozen=True)
class TrajectoryClass:
    """The drift check of one rollout: `kind` is `exact`, `retokenized` or `unusable`; `reason` the `Unusable`
    reason of an unusable one; `detail` what was seen; `trajectory` the joined tokens when usable."""

    kind: str
    reason: Optional[str] = None
    detail: str = ""
    trajectory: Optional[TokenTrajectory] = None
    token_data: bool = True  # False: no output item carries token ids (reason `no_token_data`, or not a rollout)

    @property
    def usable(self) -> bool:
        return self.kind != UNUSABLE

    @property
    def label(self) -> str:
        """`exact`, `retokenized` or `unusable: <reason>`."""
        return f"{UNUSABLE}: {self.reason}" if self.kind == UNUSABLE else self.kind


def classify_trajectory(rollout: Mapping[str, Any]) -> TrajectoryClass:
    """The one classification of a rollout's token trajectory (see the module docstring). Never raises."""
    data = has_token_data(rollout)
    try:
        trajectory = token_trajectory(rollout)
    except Unusable as exc:
        return TrajectoryClass(UNUSABLE, exc.reason, exc.detail, token_data=data)
    detail = ""
    if trajectory.retokenized_calls:
        calls = ", ".join(map(str, trajectory.retokenized_calls))
        detail = "; ".join([f"the model server re-tokenized the prompt of model call(s) {calls}", *trajectory.flag_notes])
    return TrajectoryClass(trajectory.kind, None, detail, trajectory, token_data=True)


@dataclass
class TrajectoryCounts:
    """Running counts of `classify_trajectory` results (one rollout at a time, nothing else kept): exact,
    re-tokenized, unusable per reason, and the first detail of each."""

    exact: int = 0
    retokenized: int = 0
    unusable: Counter = field(default_factory=Counter)
    with_token_data: int = 0
    examples: dict[str, str] = field(default_factory=dict)

    def add(self, result: TrajectoryClass) -> TrajectoryClass:
        self.with_token_data += result.token_data
        if result.kind == EXACT:
            self.exact += 1
        elif result.kind == RETOKENIZED:
            self.retokenized += 1
            self.examples.setdefault(RETOKENIZED, result.detail)
        else:
            key = result.reason or "unknown"
            self.unusable[key] += 1
            if result.detail:
                self.examples.setdefault(key, result.detail)
        return result

    @property
    def total(self) -> int:
        return self.exact + self.retokenized + sum(self.unusable.values())

    def summary(self) -> str:
        """`token trajectories: 5 exact, 1 re-tokenized, 2 unusable (tokens_not_contiguous 1, no_token_data 1)`."""
        text = f"token trajectories: {self.exact} exact, {self.retokenized} re-tokenized, "
        text += f"{sum(self.unusable.values())} unusable"
        if self.unusable:
            ranked = sorted(self.unusable.items(), key=lambda kv: (-kv[1], kv[0]))  # the same order every run
            text += " (" + ", ".join(f"{reason} {n}" for reason, n in ranked) + ")"
        return text
