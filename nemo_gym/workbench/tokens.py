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
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

from nemo_gym.api.chat_conversion import TOKEN_FIELDS
from nemo_gym.workbench.conversation import Unusable, response_output

__all__ = ["TokenTrajectory", "token_trajectory"]

# Items a model call produces; a run of them ends with the item that carries the call's token data.
_MODEL_ITEM_TYPES = frozenset({"reasoning", "function_call"})


@dataclass
class TokenTrajectory:
    prompt_token_ids: list[int]
    generation_token_ids: list[int]
    generation_log_probs: list[float]
    loss_mask: list[int]
    num_model_calls: int


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
            if call_prompt[: len(seen)] != seen:
                raise Unusable(
                    "tokens_not_contiguous",
                    f"the prompt of model call {number} does not start with the tokens of the calls before it",
                )
            between = call_prompt[len(seen):]
            generation.extend(between)
            log_probs.extend([0.0] * len(between))
            mask.extend([0] * len(between))
            seen.extend(between)
        generation.extend(call_gen)
        log_probs.extend(call_lps)
        mask.extend([1] * len(call_gen))
        seen.extend(call_gen)
    return TokenTrajectory(prompt, generation, log_probs, mask, len(calls))
