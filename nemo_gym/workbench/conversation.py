"""A collected rollout as OpenAI chat-format messages, the shape SFT and DPO trainers read.

A rollout line holds the task's `responses_create_params` (instructions, input, tools) and the agent's final
`response`, whose `output` lists every item of the episode (reasoning, assistant messages, function calls, tool
outputs). Turning Responses items into chat messages is the job of `nemo_gym.api.chat_conversion` (the model
servers use it to talk to Chat Completions backends); this module only adds what a training file needs on top:

- content is always a plain string (or null next to tool calls): a Parquet column has one type, and chat templates
  expect text; a rollout with image or file parts is refused (`non_text_content`);
- reasoning is kept as `<think>...</think>` in the assistant content (`think`, the form the model servers replay),
  moved to a `reasoning_content` field (`field`, what reasoning-parser chat templates read) or left out (`drop`);
- the shared prompt (instructions + input) and the completion (the output items) can be taken apart for DPO.

Every way a rollout cannot be used raises `Unusable` with a short reason key; the export counts them per key.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping, Optional

from nemo_gym.api.chat_conversion import ChatConversionError, responses_to_chat_params, responses_tools_to_chat_tools

__all__ = ["REASONING_MODES", "ChatOptions", "Unusable", "response_output", "full_conversation", "prompt_messages",
           "completion_messages", "chat_tools"]

REASONING_MODES = ("think", "field", "drop")


class Unusable(Exception):
    """A rollout that cannot become a row: `reason` is the key it is counted under, `detail` says what was seen."""

    def __init__(self, reason: str, detail: str = "") -> None:
        super().__init__(f"{reason}: {detail}" if detail else reason)
        self.reason = reason
        self.detail = detail


@dataclass(frozen=True)
class ChatOptions:
    reasoning: str = "think"  # one of REASONING_MODES
    developer_as_system: bool = False


def response_output(rollout: Mapping[str, Any]) -> list:
    """The output items of a rollout's response. A line of a `_failures.jsonl` file (ours, or NeMo Gym v0.5's: the
    agent's result with `_ng_failure_class`, whose reward is not a score), or any row without a response
    (materialized inputs, a truncated write), is `Unusable`."""
    failure_class = rollout.get("_ng_failure_class")
    if failure_class is not None or rollout.get("_ng_no_persist"):
        raise Unusable("failed_rollout", f"_ng_failure_class {failure_class or 'no_persist'}")
    response = rollout.get("response")
    if not isinstance(response, Mapping):
        if "error_type" in rollout and "row" in rollout:
            raise Unusable("failed_rollout", str(rollout.get("error_type")))
        raise Unusable("no_response", "the row has no `response` object")
    output = response.get("output")
    if not isinstance(output, list):
        raise Unusable("no_response", "`response.output` is not a list")
    return output


def _params(rollout: Mapping[str, Any]) -> Mapping[str, Any]:
    params = rollout.get("responses_create_params")
    if not isinstance(params, Mapping):
        raise Unusable("no_prompt", "the row has no `responses_create_params` object")
    return params


def _without_reasoning(items: Any, options: ChatOptions) -> Any:
    if options.reasoning != "drop" or not isinstance(items, list):
        return items
    return [item for item in items if not (isinstance(item, Mapping) and item.get("type") == "reasoning")]


def _to_chat(items: Any, instructions: Any, options: ChatOptions) -> list[dict]:
    request: dict[str, Any] = {"input": _without_reasoning(items, options)}
    if instructions:
        request["instructions"] = instructions
    try:
        chat, _ = responses_to_chat_params(
            request,
            replace_developer_role_with_system=options.developer_as_system,
            uses_reasoning_parser=options.reasoning == "field",
        )
    except ChatConversionError as exc:
        raise Unusable("unconvertible", str(exc)) from None
    return [_plain(message, options) for message in chat["messages"]]


def _plain(message: dict, options: ChatOptions) -> dict:
    """A message with string content (text parts joined), a refusal as its text and, in `field` mode, the
    reasoning under `reasoning_content` only."""
    out = dict(message)
    content = out.get("content")
    if isinstance(content, list):
        texts = []
        for part in content:
            if not (isinstance(part, Mapping) and part.get("type") == "text"):
                kind = part.get("type") if isinstance(part, Mapping) else type(part).__name__
                raise Unusable("non_text_content", f"a {out.get('role')} message has a {kind!r} part")
            texts.append(str(part.get("text") or ""))
        out["content"] = "".join(texts)
    refusal = out.pop("refusal", None)
    if refusal and not out.get("content"):
        out["content"] = refusal
    out.pop("reasoning", None)  # prepare_chat_messages writes both names; reasoning_content is the one kept
    if options.reasoning != "field":
        out.pop("reasoning_content", None)
    return out


def full_conversation(rollout: Mapping[str, Any], options: ChatOptions) -> list[dict]:
    """Instructions, input and output of the rollout as one list of chat messages (the SFT `messages`)."""
    params = _params(rollout)
    output = response_output(rollout)
    items = params.get("input")
    items = [{"role": "user", "content": items}] if isinstance(items, str) else list(items or ())
    return _to_chat(items + output, params.get("instructions"), options)


def prompt_messages(rollout: Mapping[str, Any], options: ChatOptions) -> list[dict]:
    """The task's side: instructions and input as chat messages (DPO's shared `prompt`)."""
    params = _params(rollout)
    return _to_chat(params.get("input") or [], params.get("instructions"), options)


def completion_messages(rollout: Mapping[str, Any], options: ChatOptions) -> list[dict]:
    """The episode's side: the output items as assistant and tool messages (DPO's `chosen` / `rejected`)."""
    messages = _to_chat(response_output(rollout), None, options)
    if not messages:
        raise Unusable("empty_output", "the response has no output items")
    return messages


def chat_tools(rollout: Mapping[str, Any]) -> Optional[list[dict]]:
    """The function tools offered to the model, in chat form (`{type: function, function: {...}}`), or None."""
    tools = _params(rollout).get("tools")
    if not tools:
        return None
    try:
        converted = responses_tools_to_chat_tools(tools)
    except ChatConversionError as exc:
        raise Unusable("unconvertible", str(exc)) from None
    return converted or None
