"""Responses API <-> Chat Completions conversion, as pure functions on plain dicts.

Used by model servers whose backend speaks only Chat Completions: ``vllm_model`` (vLLM, SGLang, llama.cpp,
Ollama, ...) and the in-process local model. Everything here works on plain JSON-like dicts (what a request body
parses into, what an upstream returns) and never validates: callers validate at their edges (the request schema
on the way in, the upstream's JSON on the way out) so a conversation is not re-validated at every step.
Inputs are never mutated; outputs may share leaf values (strings, token lists) with the inputs.

Request direction, :func:`responses_to_chat_params`:

* ``input`` (a string, or a list of items) becomes ``messages``; ``instructions`` becomes a leading system message.
* Assistant-side items between two non-assistant items (reasoning, assistant messages, function calls) merge into
  one assistant message: reasoning summaries become ``<think>...</think>`` text in the content, function calls
  become ``tool_calls``. ``function_call_output`` items become ``tool`` messages.
* With ``uses_reasoning_parser`` the ``<think>`` text of assistant messages goes into ``reasoning_content`` and
  ``reasoning`` instead (what vLLM's reasoning parsers read back), see :func:`prepare_chat_messages`.
* With ``training``, the token fields (``prompt_token_ids``, ``generation_token_ids``, ``generation_log_probs``)
  of the last assistant-side item ride on the assistant message it merges into, so a training backend can replay
  the exact tokens of earlier steps.
* ``max_output_tokens`` -> ``max_tokens``, function tools -> chat tools, ``tool_choice``, ``text.format`` ->
  ``response_format``, ``reasoning.effort`` -> ``reasoning_effort``, ``top_logprobs`` / the logprobs include ->
  ``logprobs``; ``temperature``, ``top_p``, ``seed``, ``user``, ``store``, ``service_tier``, ``metadata`` and
  ``parallel_tool_calls`` carry over. Anything else that would change the generation is returned in the list of
  unmapped field names so the caller can report it (the reference dropped those silently).

Response direction, :func:`chat_completion_to_response_output` and :func:`build_response`:

* ``<think>...</think>`` blocks of the content become one ``reasoning`` item (one summary per block), the rest of
  the text one assistant ``message`` (always present when there is nothing else, so an empty generation still
  yields a message), each tool call one ``function_call`` item; in that order.
* Token fields on the chat message go on the last output item (its ``...ForTraining`` shape).
* :func:`build_response` wraps the items in a Response that echoes the request's parameters (including its real
  ``tool_choice``), maps ``finish_reason`` ``length`` to ``incomplete_details: {reason: max_output_tokens}`` and
  the usage counts.
"""

from __future__ import annotations

import itertools
import operator
import os
import re
import time
from typing import Any, Callable, Iterable, Iterator, Optional

import orjson

__all__ = [
    "TOKEN_FIELDS",
    "OUTPUT_LOGPROBS_INCLUDE",
    "ChatConversionError",
    "extract_think",
    "wrap_think",
    "ThinkSplitter",
    "new_item_id",
    "responses_input_to_chat_messages",
    "responses_tools_to_chat_tools",
    "responses_to_chat_params",
    "prepare_chat_messages",
    "fold_reasoning_into_content",
    "wants_output_logprobs",
    "generation_tokens_from_logprobs",
    "token_ids_of_logprobs",
    "log_probs_of_logprobs",
    "logprob_tokens_match",
    "chat_completion_to_response_output",
    "usage_to_responses",
    "incomplete_details_for",
    "build_response",
    "chat_completion_to_response",
    "is_context_length_error",
    "empty_chat_completion",
]

TOKEN_FIELDS = ("prompt_token_ids", "generation_token_ids", "generation_log_probs")
OUTPUT_LOGPROBS_INCLUDE = "message.output_text.logprobs"

_THINK_OPEN = "<think>"
_THINK_RE = re.compile(r"<think>(.*?)</think>", re.DOTALL)
_TOKEN_ID_PREFIX = "token_id:"


class ChatConversionError(ValueError):
    """The request cannot be expressed in the other API (a model server answers it with HTTP 400)."""


# ----------------------------------------------------------------------------------------------------------
# <think> helpers


def extract_think(text: str) -> tuple[list[str], str]:
    """The texts of all ``<think>...</think>`` blocks in ``text`` (non-greedy, across lines) and ``text`` with the
    blocks removed. An unclosed ``<think>`` is left in the text."""
    if not text or _THINK_OPEN not in text:
        return [], text
    blocks = _THINK_RE.findall(text)
    if not blocks:
        return [], text
    return blocks, _THINK_RE.sub("", text)


def wrap_think(reasoning: str) -> str:
    return f"{_THINK_OPEN}{reasoning}</think>"


class ThinkSplitter:
    """:func:`extract_think` for text that arrives in pieces (a streamed chat content): :meth:`feed` each piece,
    get back `(kind, text, starts_block)` runs, `kind` `"text"` or `"reasoning"` (inside `<think>...</think>`;
    `starts_block` on the first run of each block). A tag split across pieces is held back until it is whole;
    :meth:`flush` hands out what is held at the end. Unlike :func:`extract_think`, an unclosed `<think>` streams as
    reasoning (the final answer, built from the whole text, keeps it as text)."""

    _TAGS = (_THINK_OPEN, "</think>")

    def __init__(self) -> None:
        self.inside = False
        self._held = ""
        self._new_block = False

    def feed(self, text: str) -> list[tuple[str, str, bool]]:
        runs: list[tuple[str, str, bool]] = []
        buffer, self._held = self._held + text, ""
        while buffer:
            tag = self._TAGS[self.inside]
            found = buffer.find(tag)
            if found >= 0:
                self._emit(runs, buffer[:found])
                buffer = buffer[found + len(tag):]
                self.inside = not self.inside
                self._new_block = self.inside
                continue
            keep = next((n for n in range(min(len(tag) - 1, len(buffer)), 0, -1) if tag.startswith(buffer[-n:])), 0)
            self._emit(runs, buffer[: len(buffer) - keep])
            self._held = buffer[len(buffer) - keep:]
            break
        return runs

    def flush(self) -> list[tuple[str, str, bool]]:
        runs: list[tuple[str, str, bool]] = []
        self._emit(runs, self._held)
        self._held = ""
        return runs

    def _emit(self, runs: list, text: str) -> None:
        if text:
            runs.append(("reasoning" if self.inside else "text", text, self._new_block))
            self._new_block = False


# Item ids need to be unique, not secret: a random per-process prefix plus a counter is as unique as uuid4 and
# costs a fraction of it (uuid4 reads the OS RNG on every call).
def _reseed_ids() -> None:
    global _ID_PREFIX, _id_counter
    _ID_PREFIX = os.urandom(8).hex()
    _id_counter = itertools.count(int.from_bytes(os.urandom(4), "big"))


_reseed_ids()
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_reseed_ids)  # a forked worker must not repeat its parent's ids


def new_item_id(prefix: str) -> str:
    """``<prefix>_<32 hex>``: ``rs`` (reasoning), ``msg`` (message), ``call`` (a tool call without an id),
    ``resp`` (a response), ``chatcmpl`` (a synthetic chat completion). Unique across processes and calls."""
    return f"{prefix}_{_ID_PREFIX}{next(_id_counter) & 0xFFFFFFFFFFFFFFFF:016x}"


# ----------------------------------------------------------------------------------------------------------
# Responses -> Chat Completions


def _text_of_part(part: Any) -> Optional[str]:
    if isinstance(part, str):
        return part
    if isinstance(part, dict):
        text = part.get("text")
        if isinstance(text, str):
            return text
    return None


def _chat_content_part(part: Any, where: str) -> dict:
    """One Responses input content part as a Chat Completions content part."""
    if not isinstance(part, dict):
        raise ChatConversionError(f"{where}: a content part must be an object, got {type(part).__name__}")
    ptype = part.get("type")
    if ptype in ("input_text", "output_text", "text"):
        return {"type": "text", "text": part.get("text", "")}
    if ptype == "input_image":
        url = part.get("image_url")
        if not url:
            raise ChatConversionError(
                f"{where}: an input_image needs an image_url (data: URL or http URL); file_id images cannot be "
                f"sent to a Chat Completions backend"
            )
        image: dict[str, Any] = {"url": url}
        if part.get("detail"):
            image["detail"] = part["detail"]
        return {"type": "image_url", "image_url": image}
    if ptype == "input_file":
        file: dict[str, Any] = {k: part[k] for k in ("file_data", "file_id", "filename") if part.get(k) is not None}
        if not file:
            raise ChatConversionError(f"{where}: an input_file needs file_data or file_id")
        return {"type": "file", "file": file}
    if ptype == "refusal":
        return {"type": "text", "text": part.get("refusal", "")}
    if ptype in ("image_url", "input_audio", "file"):  # already a chat part
        return part
    raise ChatConversionError(f"{where}: content part type {ptype!r} has no Chat Completions equivalent")


def _chat_content(content: Any, where: str) -> Any:
    if content is None or isinstance(content, str):
        return content
    if isinstance(content, list):
        return [_chat_content_part(part, f"{where}.content[{i}]") for i, part in enumerate(content)]
    raise ChatConversionError(f"{where}: content must be a string or a list of parts")


class _AssistantBuffer:
    """Assistant-side items waiting to become one assistant message."""

    __slots__ = ("texts", "tool_calls", "refusal", "tokens", "pending")

    def __init__(self) -> None:
        self.texts: list[str] = []
        self.tool_calls: list[dict] = []
        self.refusal: Optional[str] = None
        self.tokens: Optional[dict] = None
        self.pending = False

    def flush_into(self, messages: list[dict], training: bool) -> None:
        if self.pending:
            message: dict[str, Any] = {"role": "assistant", "content": "".join(self.texts) if self.texts else None}
            if self.tool_calls:
                message["tool_calls"] = self.tool_calls
            if self.refusal is not None:
                message["refusal"] = self.refusal
            if training and self.tokens is not None:
                message.update(self.tokens)
            messages.append(message)
            self.texts = []
            self.tool_calls = []
            self.refusal = None
            self.pending = False
        self.tokens = None


def _token_fields(item: dict) -> Optional[dict]:
    if "prompt_token_ids" not in item:
        return None
    return {key: item.get(key) for key in TOKEN_FIELDS}


def responses_input_to_chat_messages(
    items: Any,
    *,
    training: bool = False,
    replace_developer_role_with_system: bool = False,
) -> list[dict]:
    """Convert a Responses ``input`` (string or item list) into chat ``messages`` (``<think>`` stays in content)."""
    if isinstance(items, str):
        return [{"role": "user", "content": items}]
    if not isinstance(items, list):
        raise ChatConversionError("input must be a string or a list of items")

    messages: list[dict] = []
    buf = _AssistantBuffer()
    for index, item in enumerate(items):
        where = f"input[{index}]"
        if not isinstance(item, dict):
            raise ChatConversionError(f"{where}: an item must be an object, got {type(item).__name__}")
        itype = item.get("type")
        if itype is None or itype == "message":
            role = item.get("role")
            if role == "assistant":
                content = item.get("content")
                if isinstance(content, str):
                    buf.texts.append(content)
                elif isinstance(content, list):
                    for part in content:
                        if isinstance(part, dict) and part.get("type") == "refusal":
                            buf.refusal = (buf.refusal or "") + str(part.get("refusal", ""))
                            continue
                        text = _text_of_part(part)
                        if text is None:
                            raise ChatConversionError(
                                f"{where}: assistant content part {part!r} is not text or refusal"
                            )
                        buf.texts.append(text)
                elif content is not None:
                    raise ChatConversionError(f"{where}: content must be a string or a list of parts")
                buf.pending = True
                tokens = _token_fields(item) if training else None
                if tokens is not None:
                    buf.tokens = tokens
                continue
            if role in ("user", "system", "developer"):
                buf.flush_into(messages, training)
                if role == "developer" and replace_developer_role_with_system:
                    role = "system"
                messages.append({"role": role, "content": _chat_content(item.get("content"), where)})
                continue
            if role is None:
                raise ChatConversionError(f"{where}: a message needs a role")
            # Custom roles (some chat templates define their own) pass through as they are.
            buf.flush_into(messages, training)
            messages.append({"role": role, "content": _chat_content(item.get("content"), where)})
            continue
        if itype == "reasoning":
            texts = [s.get("text", "") for s in item.get("summary") or () if isinstance(s, dict)]
            if not texts:
                # Newer Responses items carry the raw reasoning as `content` parts of type reasoning_text.
                texts = [c.get("text", "") for c in item.get("content") or () if isinstance(c, dict)]
            for text in texts:
                buf.texts.append(wrap_think(text))
            buf.pending = True
        elif itype == "function_call":
            arguments = item.get("arguments", "")
            if not isinstance(arguments, str):
                arguments = orjson.dumps(arguments).decode()
            buf.tool_calls.append(
                {
                    "id": item.get("call_id") or item.get("id"),
                    "type": "function",
                    "function": {"name": item.get("name"), "arguments": arguments},
                }
            )
            buf.pending = True
        elif itype == "function_call_output":
            buf.flush_into(messages, training)
            output = item.get("output")
            if isinstance(output, list):
                output = _chat_content(output, where)
            elif output is not None and not isinstance(output, str):
                output = orjson.dumps(output).decode()
            messages.append({"role": "tool", "tool_call_id": item.get("call_id"), "content": output})
            continue
        else:
            raise ChatConversionError(f"{where}: item type {itype!r} has no Chat Completions equivalent")
        if training:
            tokens = _token_fields(item)
            if tokens is not None:
                buf.tokens = tokens
    buf.flush_into(messages, training)
    return messages


def responses_tools_to_chat_tools(tools: Iterable[Any], unmapped: Optional[list[str]] = None) -> list[dict]:
    """Responses function tools ``{type, name, description, parameters, strict}`` -> chat tools. Other tool types
    (hosted tools) have no chat equivalent: they are skipped and named in ``unmapped``."""
    out: list[dict] = []
    for tool in tools:
        if not isinstance(tool, dict):
            raise ChatConversionError("tools: a tool must be an object")
        ttype = tool.get("type", "function")
        if ttype != "function":
            if unmapped is not None:
                unmapped.append(f"tools[type={ttype}]")
            continue
        if "function" in tool and isinstance(tool["function"], dict):  # already chat-shaped
            out.append({"type": "function", "function": tool["function"]})
            continue
        function: dict[str, Any] = {"name": tool.get("name")}
        for key in ("description", "parameters", "strict"):
            value = tool.get(key)
            if value is not None:
                function[key] = value
        out.append({"type": "function", "function": function})
    return out


def _chat_tool_choice(tool_choice: Any, unmapped: list[str]) -> Any:
    if isinstance(tool_choice, str):
        return tool_choice
    if isinstance(tool_choice, dict):
        if tool_choice.get("type") == "function":
            name = tool_choice.get("name") or (tool_choice.get("function") or {}).get("name")
            if name:
                return {"type": "function", "function": {"name": name}}
        unmapped.append("tool_choice")
    return None


def _response_format(fmt: Any, unmapped: list[str]) -> Optional[dict]:
    if not isinstance(fmt, dict):
        return None
    ftype = fmt.get("type")
    if ftype == "text" or ftype is None:
        return None
    if ftype == "json_object":
        return {"type": "json_object"}
    if ftype == "json_schema":
        schema: dict[str, Any] = {"name": fmt.get("name") or "response"}
        for key in ("schema", "strict", "description"):
            if fmt.get(key) is not None:
                schema[key] = fmt[key]
        return {"type": "json_schema", "json_schema": schema}
    unmapped.append(f"text.format[type={ftype}]")
    return None


def _mapped_sub_field(params: dict, name: str, mapped: str, unmapped: list[str]) -> Iterator[Any]:
    """Walk the set sub-fields of ``params[name]`` (a dict) in order: yield the value of ``mapped``, name every
    other one in ``unmapped`` as ``<name>.<key>``. A generator, so ``unmapped`` keeps the order of the fields."""
    block = params.get(name)
    if not isinstance(block, dict):
        return
    for key, value in block.items():
        if value is None:
            continue
        if key == mapped:
            yield value
        else:
            unmapped.append(f"{name}.{key}")


# Fields copied as they are (same name, same meaning in Chat Completions).
_COPIED = ("temperature", "top_p", "seed", "user", "store", "service_tier", "metadata")
# Fields handled elsewhere, or that change nothing about the generation.
_HANDLED = frozenset(
    {
        "input", "instructions", "model", "stream", "tools", "tool_choice", "parallel_tool_calls",
        "max_output_tokens", "top_logprobs", "include", "reasoning", "text", "truncation", "background",
    }
)


def wants_output_logprobs(params: dict) -> bool:
    """Whether the caller asked for per-token logprobs on ``output_text`` parts."""
    include = params.get("include") or ()
    return params.get("top_logprobs") is not None or OUTPUT_LOGPROBS_INCLUDE in include


def responses_to_chat_params(
    params: dict,
    *,
    training: bool = False,
    replace_developer_role_with_system: bool = False,
    uses_reasoning_parser: bool = False,
) -> tuple[dict, list[str]]:
    """Convert a Responses create-params dict (the keys the caller set) into Chat Completions params.

    Returns ``(chat_params, unmapped)`` where ``unmapped`` names the Responses fields (or sub-fields) that were set
    but have no Chat Completions equivalent and were left out, e.g. ``previous_response_id``, ``reasoning.summary``,
    ``truncation``. ``model`` is not copied (the model server decides it). Raises :class:`ChatConversionError`
    for content that cannot be expressed (an unknown item type, an image given only by file id, ...).
    """
    unmapped: list[str] = []
    messages = responses_input_to_chat_messages(
        params.get("input", ()),
        training=training,
        replace_developer_role_with_system=replace_developer_role_with_system,
    )
    instructions = params.get("instructions")
    if instructions:
        if not isinstance(instructions, str):
            raise ChatConversionError("instructions must be a string")
        messages.insert(0, {"role": "system", "content": instructions})
    if uses_reasoning_parser:
        messages = prepare_chat_messages(messages, uses_reasoning_parser=True)

    chat: dict[str, Any] = {"messages": messages}
    for key in _COPIED:
        value = params.get(key)
        if value is not None:
            chat[key] = value
    max_output_tokens = params.get("max_output_tokens")
    if max_output_tokens is not None:
        chat["max_tokens"] = max_output_tokens

    tools = responses_tools_to_chat_tools(params.get("tools") or (), unmapped)
    if tools:
        chat["tools"] = tools
        tool_choice = params.get("tool_choice")
        if tool_choice is not None:
            choice = _chat_tool_choice(tool_choice, unmapped)
            if choice is not None:
                chat["tool_choice"] = choice
        if params.get("parallel_tool_calls") is not None:
            chat["parallel_tool_calls"] = params["parallel_tool_calls"]

    if params.get("top_logprobs") is not None:
        chat["logprobs"] = True
        chat["top_logprobs"] = params["top_logprobs"]
    for value in params.get("include") or ():
        if value == OUTPUT_LOGPROBS_INCLUDE:
            chat["logprobs"] = True
        else:
            unmapped.append(f"include[{value}]")

    for effort in _mapped_sub_field(params, "reasoning", "effort", unmapped):
        chat["reasoning_effort"] = effort
    for fmt in _mapped_sub_field(params, "text", "format", unmapped):
        response_format = _response_format(fmt, unmapped)
        if response_format is not None:
            chat["response_format"] = response_format

    if params.get("truncation") not in (None, "disabled"):
        unmapped.append("truncation")
    if params.get("background"):
        unmapped.append("background")
    for key, value in params.items():
        if key in _HANDLED or key in _COPIED or value is None:
            continue
        unmapped.append(key)
    return chat, unmapped


def prepare_chat_messages(
    messages: list[dict],
    *,
    replace_developer_role_with_system: bool = False,
    uses_reasoning_parser: bool = False,
) -> list[dict]:
    """Backend-facing adjustments of chat messages; returns a new list (changed messages are copies).

    * ``replace_developer_role_with_system``: ``developer`` -> ``system``.
    * ``uses_reasoning_parser``: the ``<think>`` blocks of an assistant message's content (a string, or each text
      part) move into ``reasoning_content`` and ``reasoning`` (the field names of vLLM before and after 0.16),
      blocks joined by a newline; the rest stays in the content.
    """
    out: list[dict] = []
    for message in messages:
        role = message.get("role")
        if role == "developer" and replace_developer_role_with_system:
            message = {**message, "role": "system"}
        elif role == "assistant" and uses_reasoning_parser:
            content = message.get("content")
            if isinstance(content, str) and _THINK_OPEN in content:
                blocks, rest = extract_think(content)
                if blocks:
                    joined = "\n".join(blocks)
                    message = {**message, "content": rest, "reasoning_content": joined, "reasoning": joined}
            elif isinstance(content, list):
                blocks_all: list[str] = []
                parts: list[Any] = []
                changed = False
                for part in content:
                    text = part.get("text") if isinstance(part, dict) else None
                    if isinstance(text, str) and _THINK_OPEN in text:
                        blocks, rest = extract_think(text)
                        if blocks:
                            blocks_all.extend(blocks)
                            part = {**part, "text": rest}
                            changed = True
                    parts.append(part)
                if changed:
                    joined = "\n".join(blocks_all)
                    message = {**message, "content": parts, "reasoning_content": joined, "reasoning": joined}
        out.append(message)
    return out


# ----------------------------------------------------------------------------------------------------------
# Chat Completions -> Responses


def fold_reasoning_into_content(message: dict) -> tuple[dict, bool]:
    """A copy of an upstream chat message whose ``reasoning_content`` / ``reasoning`` (reasoning-parser output) is
    moved back into the content as a ``<think>...</think>`` prefix. Returns ``(message, folded)``; the message is
    returned unchanged when it has no reasoning."""
    reasoning = message.get("reasoning_content") or message.get("reasoning")
    if not reasoning and "reasoning_content" not in message and "reasoning" not in message:
        return message, False
    out = {k: v for k, v in message.items() if k not in ("reasoning_content", "reasoning")}
    if not reasoning:
        return out, False
    content = out.get("content")
    if isinstance(content, list):
        content = "".join(_text_of_part(p) or "" for p in content)
    out["content"] = wrap_think(reasoning) + (content or "")
    return out, True


def generation_tokens_from_logprobs(logprobs: Any) -> tuple[list[int], list[float]]:
    """Token ids and logprobs of a choice's ``logprobs`` (``{"content": [{"token": "token_id:N", "logprob": x}]}``,
    as vLLM returns them with ``return_tokens_as_token_ids``)."""
    content = logprobs.get("content") if isinstance(logprobs, dict) else None
    if not isinstance(content, list):
        raise ValueError(
            "The upstream returned no per-token logprobs (choice.logprobs.content); training mode needs a backend "
            "that honours `logprobs: true` and `return_tokens_as_token_ids: true` (vLLM)."
        )
    return token_ids_of_logprobs(content), log_probs_of_logprobs(content)


_LOGPROB = operator.itemgetter("logprob")
_TOKEN = operator.itemgetter("token")


def log_probs_of_logprobs(content: list) -> list[float]:
    """The ``logprob`` of every entry of a choice's ``logprobs.content``, in one C-level pass (no Python loop per
    token: at 64k tokens this is the hot path of a training call)."""
    try:
        return list(map(_LOGPROB, content))
    except (KeyError, TypeError):
        for index, entry in enumerate(content):
            if not isinstance(entry, dict) or "logprob" not in entry:
                raise ValueError(
                    f"choice.logprobs.content[{index}] has no `logprob` (got {entry!r:.200}): the upstream's per-token "
                    f"logprobs are malformed."
                ) from None
        raise


def token_ids_of_logprobs(content: list) -> list[int]:
    """The ids of a choice's ``logprobs.content`` tokens (``token_id:N``, vLLM's ``return_tokens_as_token_ids``).
    The tokens are joined and read as one JSON array (a few C-level passes instead of a Python loop per token); a
    token not of that form is found by the slow path, which names it."""
    try:
        joined = ",".join(map(_TOKEN, content))
    except (KeyError, TypeError):
        joined = None
    if joined is not None and joined.count(_TOKEN_ID_PREFIX) == len(content):
        try:
            ids = orjson.loads("[" + joined.replace(_TOKEN_ID_PREFIX, "") + "]")
        except orjson.JSONDecodeError:
            ids = None
        if ids is not None and len(ids) == len(content) and set(map(type, ids)) <= {int}:
            return ids
    return _token_ids_one_by_one(content)


def logprob_tokens_match(content: list, ids: list) -> bool:
    """Whether the tokens of a choice's ``logprobs.content`` are exactly ``token_id:<id>`` for ``ids``, in order:
    one comparison of two joined strings (vLLM sends the generated ids twice with ``return_token_ids``; this checks
    that the two agree without a Python loop per token)."""
    if len(content) != len(ids):
        return False
    if not ids:
        return True
    try:
        joined = ",".join(map(_TOKEN, content))
        expected = orjson.dumps(ids)[1:-1].decode().replace(",", "," + _TOKEN_ID_PREFIX)
    except (KeyError, TypeError, orjson.JSONEncodeError):
        return False
    return joined == _TOKEN_ID_PREFIX + expected


def _token_ids_one_by_one(content: list) -> list[int]:
    """:func:`token_ids_of_logprobs` token by token (tokens given as ints, or an error naming the bad token)."""
    ids: list[int] = []
    n = len(_TOKEN_ID_PREFIX)
    for entry in content:
        token = entry.get("token") if isinstance(entry, dict) else None
        if isinstance(token, str) and token.startswith(_TOKEN_ID_PREFIX) and token[n:].isdigit():
            ids.append(int(token[n:]))
        elif isinstance(token, int) and not isinstance(token, bool):
            ids.append(token)
        else:
            raise ValueError(
                f"Token {token!r} is not of the form 'token_id:<int>': the upstream ignored "
                f"`return_tokens_as_token_ids: true` (training mode needs vLLM)."
            )
    return ids


def _output_logprobs(logprobs: Any) -> Optional[list[dict]]:
    content = logprobs.get("content") if isinstance(logprobs, dict) else None
    if not isinstance(content, list):
        return None
    out = []
    for entry in content:
        out.append(
            {
                "token": entry.get("token", ""),
                "logprob": entry.get("logprob", 0.0),
                "bytes": entry.get("bytes") or [],
                "top_logprobs": [
                    {"token": t.get("token", ""), "logprob": t.get("logprob", 0.0), "bytes": t.get("bytes") or []}
                    for t in entry.get("top_logprobs") or ()
                ],
            }
        )
    return out


def chat_completion_to_response_output(
    choice_message: dict,
    *,
    logprobs: Any = None,
    new_id: Callable[[str], str] = new_item_id,
) -> list[dict]:
    """Output items for one chat choice's message: reasoning (from ``<think>`` blocks), message, function calls.

    ``logprobs``: the choice's logprobs, put on the ``output_text`` part when given. ``new_id(prefix)`` makes item
    ids (``rs``, ``msg``, ``call``); pass a deterministic one in tests. Token fields on the message go on the last
    item.
    """
    content = choice_message.get("content")
    if isinstance(content, list):
        content = "".join(_text_of_part(p) or "" for p in content)
    blocks, rest = extract_think(content) if content else ([], content or "")
    tool_calls = choice_message.get("tool_calls") or []
    if not tool_calls and isinstance(choice_message.get("function_call"), dict):  # legacy single function call
        tool_calls = [{"id": None, "function": choice_message["function_call"]}]
    refusal = choice_message.get("refusal")

    output: list[dict] = []
    if blocks:
        output.append(
            {"id": new_id("rs"), "type": "reasoning", "summary": [{"type": "summary_text", "text": b} for b in blocks]}
        )
    has_text = bool(rest.strip()) if (blocks or tool_calls or refusal) else True
    if has_text or refusal:
        parts: list[dict] = []
        if has_text:
            part: dict[str, Any] = {"type": "output_text", "text": rest, "annotations": []}
            if logprobs is not None:
                part["logprobs"] = _output_logprobs(logprobs) or []
            parts.append(part)
        if refusal:
            parts.append({"type": "refusal", "refusal": refusal})
        output.append(
            {"id": new_id("msg"), "type": "message", "role": "assistant", "status": "completed", "content": parts}
        )
    for call in tool_calls:
        function = call.get("function") or {}
        arguments = function.get("arguments")
        if arguments is None:
            arguments = ""
        elif not isinstance(arguments, str):
            arguments = orjson.dumps(arguments).decode()
        call_id = call.get("id") or new_id("call")
        output.append(
            {
                "type": "function_call",
                "id": call_id,
                "call_id": call_id,
                "name": function.get("name", ""),
                "arguments": arguments,
                "status": "completed",
            }
        )
    if "prompt_token_ids" in choice_message:
        last = output[-1]
        for key in TOKEN_FIELDS:
            last[key] = choice_message.get(key)
    return output


def usage_to_responses(usage: Any) -> Optional[dict]:
    """Chat ``usage`` -> Responses ``usage`` (cached / reasoning token details when the upstream gives them)."""
    if not isinstance(usage, dict):
        return None
    prompt = usage.get("prompt_tokens") or 0
    completion = usage.get("completion_tokens") or 0
    total = usage.get("total_tokens")
    cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0
    reasoning = (usage.get("completion_tokens_details") or {}).get("reasoning_tokens") or 0
    return {
        "input_tokens": prompt,
        "input_tokens_details": {"cached_tokens": cached},
        "output_tokens": completion,
        "output_tokens_details": {"reasoning_tokens": reasoning},
        "total_tokens": total if total is not None else prompt + completion,
    }


_INCOMPLETE_REASONS = {"length": "max_output_tokens", "content_filter": "content_filter"}


def incomplete_details_for(finish_reason: Optional[str]) -> Optional[dict]:
    reason = _INCOMPLETE_REASONS.get(finish_reason or "")
    return {"reason": reason} if reason else None


# Request fields echoed on the Response when the caller set them (None otherwise).
_ECHOED = (
    "instructions", "metadata", "temperature", "top_p", "background", "max_output_tokens", "max_tool_calls",
    "previous_response_id", "prompt", "reasoning", "service_tier", "text", "top_logprobs", "truncation", "user",
)


def build_response(
    params: dict,
    output: list[dict],
    *,
    model: str,
    finish_reason: Optional[str] = None,
    usage: Optional[dict] = None,
    response_id: Optional[str] = None,
    created_at: Optional[int] = None,
) -> dict:
    """A Responses API response dict for ``output`` that echoes the request ``params``.

    ``tool_choice`` is the request's own (default ``"auto"``); ``incomplete_details`` / ``status`` follow
    ``finish_reason`` (``length`` -> ``max_output_tokens``, ``content_filter``); ``usage`` is the chat usage dict
    (mapped here) or None.
    """
    incomplete = incomplete_details_for(finish_reason)
    response: dict[str, Any] = {
        "id": response_id or new_item_id("resp"),
        "object": "response",
        "created_at": created_at if created_at is not None else int(time.time()),
        "model": model,
        "status": "incomplete" if incomplete else "completed",
        "error": None,
        "incomplete_details": incomplete,
        "output": output,
        "parallel_tool_calls": params.get("parallel_tool_calls", True),
        "tool_choice": params.get("tool_choice", "auto"),
        "tools": params.get("tools") or [],
    }
    for key in _ECHOED:
        response[key] = params.get(key)
    if params.get("seed") is not None:
        response["seed"] = params["seed"]
    response["usage"] = usage_to_responses(usage)
    return response


def chat_completion_to_response(
    params: dict,
    completion: dict,
    *,
    model: str,
    new_id: Callable[[str], str] = new_item_id,
) -> dict:
    """Both halves together: the first choice of a chat completion as a Response for the request ``params``."""
    choice = (completion.get("choices") or [{}])[0]
    output = chat_completion_to_response_output(
        choice.get("message") or {},
        logprobs=choice.get("logprobs") if wants_output_logprobs(params) else None,
        new_id=new_id,
    )
    return build_response(
        params, output, model=model, finish_reason=choice.get("finish_reason"), usage=completion.get("usage")
    )


# ----------------------------------------------------------------------------------------------------------
# Upstream error handling helpers


_CONTEXT_MARKERS = ("context length", "context_length", "context window", "max_tokens", "max_completion_tokens")


def is_context_length_error(status: int, body: str) -> bool:
    """An upstream HTTP 400 saying the prompt (plus the requested output) does not fit the context window.

    vLLM says "This model's maximum context length is N tokens ..." or, when the prompt leaves no room for output,
    "max_tokens must be at least 1, got -N"; SGLang "... longer than the model's context length ...".
    """
    if status != 400 or not body:
        return False
    lowered = body.lower()
    return any(marker in lowered for marker in _CONTEXT_MARKERS)


def empty_chat_completion(model: str, finish_reason: str = "length") -> dict:
    """A synthetic chat completion with one empty assistant message (becomes an empty message in Responses)."""
    return {
        "id": new_item_id("chatcmpl").replace("_", "-", 1),
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": [
            {
                "index": 0,
                "finish_reason": finish_reason,
                "logprobs": None,
                "message": {"role": "assistant", "content": None},
            }
        ],
        "usage": None,
    }
