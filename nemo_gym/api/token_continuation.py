"""Token-in/token-out prompts for multi-turn RL: the prompt ids of model call k+1 built from call k's exact ids.

An RL trainer learns from token ids and log probs. If the prompt of call k+1 were rendered from messages and
tokenized again, the tokens of call k's answer could differ from the ones the model generated (a generation cut off
mid-word, tokens whose text tokenizes differently, an answer the server re-formats before replaying it), and the
trainer would train on tokens the policy never produced. So the prompt of call k+1 is built as

    prompt ids(k+1) = prompt_token_ids(k) + generation_token_ids(k) + tokenize(what came after)

where "what came after" is the text the chat template renders after the previous assistant turn: the template's
glue closing that turn, tool results, new user messages, and the generation prompt. It is found by rendering the
whole conversation with the previous assistant turn's content replaced by a unique sentinel and keeping the text
after the sentinel; an end-of-generation token the model generated (`<|im_end|>`) and that the template writes
right after the content is dropped from that text (it is already among the generated ids). Only that suffix is
tokenized; earlier turns never are.

Where the previous ids come from: the chat messages of call k+1, as an OpenAI-style converter builds them from a
Responses `input` (`nemo_gym.api.chat_conversion.responses_input_to_chat_messages(training=True)`): the assistant
message of each earlier model call carries that call's `prompt_token_ids` / `generation_token_ids` (the fields a
training-mode model server put on the call's last output item, sent back unchanged by the agent). The last such
assistant message is the previous call.

When there is no usable previous call, the whole prompt is rendered and tokenized ("retokenized") and the reason
is given; the caller puts both on its output (`TOKEN_TRAJECTORY_KEY`, `TOKEN_TRAJECTORY_REASON_KEY`) so that a
trainer or an export can tell exact trajectories from approximate ones. A first call (no assistant turn in the
prompt) is "exact": nothing generated is in its prompt.

The backend side is the `ChatTokenizer` protocol (render with the backend's own chat template, tokenize text with
special tokens, detokenize, recognise end-of-generation tokens); local_llama_model implements it with
llama-cpp-python, and an HF-tokenizer implementation fits vllm_model the same way.
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass
from typing import Any, Mapping, Optional, Protocol, Sequence, runtime_checkable

__all__ = [
    "ChatTokenizer",
    "PromptIds",
    "PreviousCall",
    "TokenContinuationError",
    "EXACT",
    "RETOKENIZED",
    "TOKEN_TRAJECTORY_KEY",
    "TOKEN_TRAJECTORY_REASON_KEY",
    "PREVIOUS_TOKEN_FIELDS",
    "previous_call",
    "full_prompt_ids",
    "continuation_prompt_ids",
    "trajectory_ids_and_loss_mask",
]

# Put on the item that carries a call's token data: how its `prompt_token_ids` were obtained.
TOKEN_TRAJECTORY_KEY = "token_trajectory"
# ... and, when not exact, why (one of the REASONS below, with details).
TOKEN_TRAJECTORY_REASON_KEY = "token_trajectory_reason"
EXACT = "exact"
RETOKENIZED = "retokenized"

PREVIOUS_TOKEN_FIELDS = ("prompt_token_ids", "generation_token_ids")
# Every key a message may carry for token bookkeeping; none of them is given to the chat template.
_BOOKKEEPING_KEYS = frozenset(
    {"prompt_token_ids", "generation_token_ids", "generation_log_probs", "routed_experts",
     TOKEN_TRAJECTORY_KEY, TOKEN_TRAJECTORY_REASON_KEY}
)

REASONS = {
    "no_previous_token_ids": "assistant turns in the prompt carry no prompt_token_ids / generation_token_ids "
    "(the agent did not send the previous output items back unchanged, or they came from a server not in "
    "training mode)",
    "malformed_previous_token_ids": "the previous call's token ids are not lists of token ids of this vocabulary",
    "previous_prompt_mismatch": "the previous call's prompt ids do not start with this conversation's beginning as "
    "rendered now (a different system prompt, tool list or first message)",
    "template_not_splittable": "the chat template did not render the previous assistant turn's content verbatim",
    "caller": "the model server found the previous turn unusable",
}


@runtime_checkable
class ChatTokenizer(Protocol):
    """The tokenizer and chat template of one backend, exactly as it builds prompts."""

    vocab_size: int

    def render(self, messages: Sequence[Mapping[str, Any]], add_generation_prompt: bool) -> str:
        """The chat template applied to `messages` (role/content dicts), as text."""
        ...

    def tokenize(self, text: str) -> list[int]:
        """Token ids of `text` alone: special-token text (`<|im_start|>`) becomes the special token, and nothing is
        added (no BOS)."""
        ...

    def prompt_start_ids(self) -> list[int]:
        """Ids the backend puts before a whole rendered prompt (a BOS the template does not write), else []."""
        ...

    def detokenize(self, ids: Sequence[int]) -> str:
        """The text of `ids`, special tokens written out."""
        ...

    def is_end_of_generation(self, token_id: int) -> bool:
        """True for the tokens that end a generation (EOS, end of turn)."""
        ...


class TokenContinuationError(ValueError):
    """Token ids that cannot be joined (`trajectory_ids_and_loss_mask`)."""


@dataclass(frozen=True)
class PreviousCall:
    message_index: int  # the assistant message in the chat messages
    prompt_token_ids: list[int]
    generation_token_ids: list[int]


@dataclass(frozen=True)
class PromptIds:
    ids: list[int]
    mode: str  # EXACT | RETOKENIZED
    reason: Optional[str] = None  # a key of REASONS, then ": " and details
    reused: int = 0  # leading ids copied from the previous call (its prompt and generation)

    def annotations(self) -> dict[str, str]:
        """The fields the caller puts next to the token data on its output item."""
        out = {TOKEN_TRAJECTORY_KEY: self.mode}
        if self.reason:
            out[TOKEN_TRAJECTORY_REASON_KEY] = self.reason
        return out


def _strip(message: Mapping[str, Any]) -> dict:
    return {k: v for k, v in message.items() if k not in _BOOKKEEPING_KEYS}


def _is_id_list(value: Any, vocab_size: int) -> bool:
    return isinstance(value, list) and all(
        isinstance(v, int) and not isinstance(v, bool) and 0 <= v < vocab_size for v in value
    )


def previous_call(messages: Sequence[Mapping[str, Any]]) -> Optional[PreviousCall]:
    """The last assistant message that carries token ids (the previous model call), or None."""
    for index in range(len(messages) - 1, -1, -1):
        message = messages[index]
        if message.get("role") == "assistant" and message.get("prompt_token_ids") is not None:
            return PreviousCall(index, message.get("prompt_token_ids"), message.get("generation_token_ids"))
    return None


def full_prompt_ids(tokenizer: ChatTokenizer, messages: Sequence[Mapping[str, Any]]) -> list[int]:
    """The whole prompt rendered and tokenized (the non-token-in way; also a first call's prompt)."""
    text = tokenizer.render([_strip(m) for m in messages], True)
    return list(tokenizer.prompt_start_ids()) + tokenizer.tokenize(text)


def _retokenized(tokenizer: ChatTokenizer, messages: Sequence[Mapping[str, Any]], reason: str) -> PromptIds:
    return PromptIds(full_prompt_ids(tokenizer, messages), RETOKENIZED, reason)


def continuation_prompt_ids(
    tokenizer: ChatTokenizer,
    messages: Sequence[Mapping[str, Any]],
    *,
    fallback_reason: Optional[str] = None,
) -> PromptIds:
    """The prompt ids for a call whose chat `messages` may hold earlier calls' token ids (module docstring).

    `fallback_reason`: the caller already knows the previous turn is unusable (e.g. its server merged content the
    model did not generate into that turn): re-tokenize and report this reason."""
    plain = [_strip(m) for m in messages]
    if fallback_reason:
        return _retokenized(tokenizer, messages, f"caller: {fallback_reason}")
    prev = previous_call(messages)
    if prev is None:
        if any(m.get("role") == "assistant" for m in messages):
            return _retokenized(tokenizer, messages, "no_previous_token_ids")
        return PromptIds(full_prompt_ids(tokenizer, messages), EXACT)

    prompt, generation = prev.prompt_token_ids, prev.generation_token_ids
    if not (_is_id_list(prompt, tokenizer.vocab_size) and prompt and _is_id_list(generation, tokenizer.vocab_size)):
        return _retokenized(
            tokenizer, messages, f"malformed_previous_token_ids: on the assistant message {prev.message_index}"
        )

    # The previous prompt must be about this conversation: its text starts with the conversation's head (all
    # messages before the first assistant turn, then the generation prompt) as rendered now. A text comparison:
    # nothing is tokenized again.
    first_assistant = next(i for i, m in enumerate(messages) if m.get("role") == "assistant")
    if first_assistant > 0:
        head = tokenizer.render(plain[:first_assistant], True)
        start = list(tokenizer.prompt_start_ids())
        body = prompt[len(start):] if start and prompt[: len(start)] == start else prompt
        if not tokenizer.detokenize(body).startswith(head):
            return _retokenized(
                tokenizer, messages, f"previous_prompt_mismatch: before the assistant message {first_assistant}"
            )

    sentinel = f"\u2063ng-turn-{secrets.token_hex(8)}\u2063"
    marked = list(plain)
    marked[prev.message_index] = {**plain[prev.message_index], "content": sentinel}
    rendered = tokenizer.render(marked, True)
    if rendered.count(sentinel) != 1:
        return _retokenized(tokenizer, messages, f"template_not_splittable: {rendered.count(sentinel)} sentinels")
    after = rendered.split(sentinel, 1)[1]
    if generation and tokenizer.is_end_of_generation(generation[-1]):
        closing = tokenizer.detokenize(generation[-1:])
        if closing and after.startswith(closing):
            after = after[len(closing):]
    reused = len(prompt) + len(generation)
    return PromptIds(list(prompt) + list(generation) + tokenizer.tokenize(after), EXACT, None, reused)


def trajectory_ids_and_loss_mask(
    calls: Sequence[tuple[Sequence[int], Sequence[int]]],
) -> tuple[list[int], list[int]]:
    """One sequence for a whole trajectory and its loss mask: 1 exactly on generated tokens, 0 on the first prompt
    and on every token in between (template glue, tool results, user messages, generation prompts).

    `calls`: (prompt_token_ids, generation_token_ids) of each model call, in order. Each prompt must start with
    everything before it (prompt and generation of the call before), else `TokenContinuationError`."""
    ids: list[int] = []
    mask: list[int] = []
    for number, (prompt, generation) in enumerate(calls, start=1):
        prompt, generation = list(prompt), list(generation)
        if prompt[: len(ids)] != ids:
            raise TokenContinuationError(
                f"model call {number}: its prompt_token_ids do not start with the ids of the calls before it "
                f"(a re-rendered history); only token-in/token-out prompts can be joined"
            )
        between = prompt[len(ids):]
        ids.extend(between)
        mask.extend([0] * len(between))
        ids.extend(generation)
        mask.extend([1] * len(generation))
    return ids, mask
