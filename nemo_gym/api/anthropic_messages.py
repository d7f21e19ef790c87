"""Anthropic Messages API <-> Responses API, as pure functions on plain dicts.

Every model server answers `POST /v1/messages` (the shared base, `servers/model_server.py`): the Messages request
is turned into Responses create params, the server's own `responses` runs, and its Response is turned back into
a Message. Nothing here validates; the base validates the converted params with the Responses request schema.

Request direction, :func:`messages_to_responses_params`:

* `system` (a string or text blocks) -> `instructions`;
* each message's content (a string or blocks): `text` -> an input or output text message part (user or assistant),
  `image` (base64 or url source) -> `input_image`, `tool_use` -> a `function_call` item (`call_id` = the block's
  `id`, `arguments` = its `input` as JSON), `tool_result` -> a `function_call_output` item (its text; `is_error`
  prefixes "Error: "), `thinking` -> a `reasoning` item with the thinking as its summary; `redacted_thinking` is
  dropped;
* `tools` (`name`, `description`, `input_schema`) -> function tools; `tool_choice` `auto` / `any` / `tool` /
  `none` -> `auto` / `required` / that function / `none`;
* `max_tokens` -> `max_output_tokens`; `temperature`, `top_p` carry over; `metadata.user_id` -> `user`;
* `stop_sequences` and `top_k` have no Responses field: they are returned as unmapped names, which the base reports
  in a warning header and the log (never silently).

Response direction, :func:`response_to_message`: `reasoning` -> `thinking` blocks, output text -> `text` blocks,
`function_call` -> `tool_use` (arguments parsed back to an object); `stop_reason` is `tool_use` when the model
called a tool, `max_tokens` when the Response is incomplete for that reason, else `end_turn`; usage carries input
and output token counts. Token fields (`prompt_token_ids`, `generation_token_ids`, `generation_log_probs`) of an
output item stay on the block made from it, as they stay on the item in Responses.
"""

from __future__ import annotations

from typing import Any, Optional

import orjson

from nemo_gym.api.chat_conversion import TOKEN_FIELDS

__all__ = [
    "MessagesConversionError",
    "messages_to_responses_params",
    "response_to_message",
    "anthropic_error",
    "ANTHROPIC_ERROR_TYPES",
]

_CARRIED = ("temperature", "top_p")
# The fields of a Messages request this module reads; anything else is reported as unmapped.
_KNOWN = {"model", "messages", "system", "max_tokens", "tools", "tool_choice", "metadata", "stream", *_CARRIED}

# HTTP status -> the `error.type` Anthropic's API uses for it (the SDKs pick their exception by status).
ANTHROPIC_ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    422: "invalid_request_error",
    429: "rate_limit_error",
    500: "api_error",
    529: "overloaded_error",
}


class MessagesConversionError(ValueError):
    """The Messages request cannot be expressed as a Responses request (answered as HTTP 400)."""


def anthropic_error(status: int, message: str) -> dict:
    """An error body in Anthropic's shape."""
    kind = ANTHROPIC_ERROR_TYPES.get(status) or ("api_error" if status >= 500 else "invalid_request_error")
    return {"type": "error", "error": {"type": kind, "message": message}}


def _text_of(content: Any, where: str) -> str:
    """The text of a string or of a list of text blocks."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for block in content:
            if isinstance(block, dict) and block.get("type") == "text":
                parts.append(str(block.get("text", "")))
            elif isinstance(block, dict) and block.get("type") == "image":
                parts.append("[image]")
            else:
                raise MessagesConversionError(f"{where}: only text blocks are supported here, got {block!r:.200}")
        return "".join(parts)
    if content is None:
        return ""
    raise MessagesConversionError(f"{where}: expected a string or a list of blocks, got {type(content).__name__}")


def _image_part(block: dict, where: str) -> dict:
    source = block.get("source") or {}
    kind = source.get("type")
    if kind == "base64":
        url = f"data:{source.get('media_type', 'image/png')};base64,{source.get('data', '')}"
    elif kind == "url":
        url = source.get("url", "")
    else:
        raise MessagesConversionError(f"{where}: image source type {kind!r} is not supported (base64 or url)")
    return {"type": "input_image", "image_url": url, "detail": "auto"}


def _convert_message(message: Any, index: int, items: list) -> None:
    where = f"messages[{index}]"
    if not isinstance(message, dict):
        raise MessagesConversionError(f"{where}: expected an object with `role` and `content`")
    role = message.get("role")
    if role not in ("user", "assistant"):
        raise MessagesConversionError(f"{where}: role must be `user` or `assistant`, got {role!r}")
    content = message.get("content")
    if isinstance(content, str):
        content = [{"type": "text", "text": content}]
    if not isinstance(content, list):
        raise MessagesConversionError(f"{where}: content must be a string or a list of blocks")

    parts: list = []  # text/image parts of the current message, flushed before a tool item

    def flush() -> None:
        if parts:
            items.append({"type": "message", "role": role, "content": list(parts)})
            parts.clear()

    text_type = "input_text" if role == "user" else "output_text"
    for number, block in enumerate(content):
        block_where = f"{where}.content[{number}]"
        kind = block.get("type") if isinstance(block, dict) else None
        if kind == "text":
            part: dict = {"type": text_type, "text": str(block.get("text", ""))}
            if role == "assistant":
                part["annotations"] = []
            parts.append(part)
        elif kind == "image":
            if role != "user":
                raise MessagesConversionError(f"{block_where}: images are only supported in user messages")
            parts.append(_image_part(block, block_where))
        elif kind == "tool_use":
            flush()
            items.append({
                "type": "function_call",
                "call_id": str(block.get("id", "")),
                "name": str(block.get("name", "")),
                "arguments": orjson.dumps(block.get("input") or {}).decode(),
            })
        elif kind == "tool_result":
            flush()
            output = _text_of(block.get("content"), f"{block_where}.content")
            if block.get("is_error"):
                output = f"Error: {output}"
            items.append({"type": "function_call_output", "call_id": str(block.get("tool_use_id", "")), "output": output})
        elif kind == "thinking":
            flush()
            items.append({"type": "reasoning", "summary": [{"type": "summary_text", "text": str(block.get("thinking", ""))}]})
        elif kind == "redacted_thinking":
            continue
        else:
            raise MessagesConversionError(f"{block_where}: block type {kind!r} is not supported")
    flush()


def _tool_choice(choice: Any) -> Any:
    if not isinstance(choice, dict):
        raise MessagesConversionError(f"tool_choice: expected an object with `type`, got {choice!r:.100}")
    kind = choice.get("type")
    if kind == "auto":
        return "auto"
    if kind == "any":
        return "required"
    if kind == "none":
        return "none"
    if kind == "tool":
        return {"type": "function", "name": str(choice.get("name", ""))}
    raise MessagesConversionError(f"tool_choice: type {kind!r} is not supported (auto, any, tool, none)")


def messages_to_responses_params(body: Any) -> tuple[dict, list[str]]:
    """(Responses create params, names of request fields that had to be dropped) for a Messages request."""
    if not isinstance(body, dict):
        raise MessagesConversionError("the request body must be a JSON object")
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise MessagesConversionError("messages: a non-empty list is required")
    if not isinstance(body.get("max_tokens"), int) or body["max_tokens"] < 1:
        raise MessagesConversionError("max_tokens: a positive integer is required")

    items: list = []
    for index, message in enumerate(messages):
        _convert_message(message, index, items)
    params: dict = {"input": items, "max_output_tokens": body["max_tokens"]}
    if body.get("model"):
        params["model"] = body["model"]
    system = body.get("system")
    if system:
        params["instructions"] = _text_of(system, "system")
    for key in _CARRIED:
        if body.get(key) is not None:
            params[key] = body[key]
    tools = body.get("tools")
    if tools:
        converted = []
        for number, tool in enumerate(tools):
            if not isinstance(tool, dict) or "name" not in tool:
                raise MessagesConversionError(f"tools[{number}]: expected an object with `name` and `input_schema`")
            if tool.get("type") not in (None, "custom"):
                raise MessagesConversionError(f"tools[{number}]: server tool type {tool.get('type')!r} is not supported")
            converted.append({
                "type": "function",
                "name": tool["name"],
                "description": tool.get("description") or "",
                "parameters": tool.get("input_schema") or {"type": "object", "properties": {}},
                "strict": False,
            })
        params["tools"] = converted
    if body.get("tool_choice") is not None:
        choice = body["tool_choice"]
        params["tool_choice"] = _tool_choice(choice)
        if isinstance(choice, dict) and choice.get("disable_parallel_tool_use"):
            params["parallel_tool_calls"] = False
    metadata = body.get("metadata")
    if isinstance(metadata, dict) and metadata.get("user_id"):
        params["user"] = str(metadata["user_id"])
    dropped = [key for key in body if key not in _KNOWN and body[key] is not None]
    return params, dropped


def _block_tokens(item: dict, block: dict) -> dict:
    for key in TOKEN_FIELDS:
        if key in item:
            block[key] = item[key]
    return block


def response_to_message(response: dict, model: Optional[str] = None) -> dict:
    """A Messages API `message` for a Responses API Response (both plain dicts); `model` names the model when the
    Response does not."""
    content: list = []
    called_tool = False
    for item in response.get("output") or ():
        if not isinstance(item, dict):
            continue
        kind = item.get("type")
        if kind == "reasoning":
            text = "".join(str(part.get("text", "")) for part in item.get("summary") or () if isinstance(part, dict))
            if not text:
                text = "".join(str(part.get("text", "")) for part in item.get("content") or () if isinstance(part, dict))
            content.append(_block_tokens(item, {"type": "thinking", "thinking": text, "signature": ""}))
        elif kind == "function_call":
            called_tool = True
            try:
                arguments = orjson.loads(item.get("arguments") or "{}")
            except orjson.JSONDecodeError:
                arguments = {"_raw_arguments": item.get("arguments")}
            if not isinstance(arguments, dict):
                arguments = {"_raw_arguments": item.get("arguments")}
            content.append(_block_tokens(item, {
                "type": "tool_use", "id": item.get("call_id") or item.get("id") or "", "name": item.get("name", ""),
                "input": arguments,
            }))
        elif kind == "message" or (kind is None and item.get("role") == "assistant"):
            text = "".join(
                str(part.get("text", "")) for part in item.get("content") or ()
                if isinstance(part, dict) and part.get("type") in ("output_text", "text")
            )
            refusal = "".join(
                str(part.get("refusal", "")) for part in item.get("content") or ()
                if isinstance(part, dict) and part.get("type") == "refusal"
            )
            content.append(_block_tokens(item, {"type": "text", "text": text or refusal}))
    incomplete = response.get("incomplete_details") or {}
    if called_tool:
        stop_reason = "tool_use"
    elif isinstance(incomplete, dict) and incomplete.get("reason") == "max_output_tokens":
        stop_reason = "max_tokens"
    else:
        stop_reason = "end_turn"
    usage = response.get("usage") or {}
    response_id = str(response.get("id") or "")
    return {
        "id": response_id if response_id.startswith("msg_") else f"msg_{response_id}",
        "type": "message",
        "role": "assistant",
        "model": response.get("model") or model or "",
        "content": content,
        "stop_reason": stop_reason,
        "stop_sequence": None,
        "usage": {"input_tokens": int(usage.get("input_tokens") or 0), "output_tokens": int(usage.get("output_tokens") or 0)},
    }
