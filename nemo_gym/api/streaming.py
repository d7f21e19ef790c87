"""Server-sent events for a finished answer, in each API's official event sequence.

Model servers whose backend answers whole (every server in the repo today) still serve `"stream": true`: the
answer is computed, then sent as the events a streaming backend would have sent, so SDK clients that stream (the
`openai` SDK's `stream=True` / `responses.stream()`, the `anthropic` SDK's `messages.stream()`) work unchanged.
Each function takes the complete answer (a plain dict) and yields `(event name or None, payload dict)`;
:func:`encode_sse` turns one into wire bytes.

- Responses: `response.created`, `response.in_progress`, then per output item `response.output_item.added`,
  for a message per text part `response.content_part.added`, `response.output_text.delta`,
  `response.output_text.done`, `response.content_part.done`, for a function call
  `response.function_call_arguments.delta` and `.done`, then `response.output_item.done`; last
  `response.completed` (or `response.incomplete`) with the whole Response. Every event has a `sequence_number`.
- Chat Completions: `chat.completion.chunk`s: the role, the content, each tool call (name, then arguments), a
  last chunk with `finish_reason`, a usage chunk when `stream_options.include_usage` asked for one, then `[DONE]`.
- Messages: `message_start`, per content block `content_block_start` / `content_block_delta` (`text_delta`,
  `input_json_delta`, `thinking_delta`) / `content_block_stop`, `message_delta` (stop reason, output tokens),
  `message_stop`.
"""

from __future__ import annotations

from typing import Any, Iterator, Optional

import orjson

__all__ = ["encode_sse", "responses_events", "chat_completion_chunks", "messages_events", "DONE"]

DONE = object()  # the Chat Completions stream's closing `data: [DONE]`

Event = tuple[Optional[str], Any]


def encode_sse(event: Optional[str], payload: Any) -> bytes:
    if payload is DONE:
        return b"data: [DONE]\n\n"
    head = f"event: {event}\n".encode() if event else b""
    return head + b"data: " + orjson.dumps(payload) + b"\n\n"


def responses_events(response: dict) -> Iterator[Event]:
    sequence = 0

    def event(kind: str, **fields: Any) -> Event:
        nonlocal sequence
        payload = {"type": kind, **fields, "sequence_number": sequence}
        sequence += 1
        return kind, payload

    started = {**response, "status": "in_progress", "output": [], "usage": None}
    yield event("response.created", response=started)
    yield event("response.in_progress", response=started)
    for index, item in enumerate(response.get("output") or ()):
        kind = item.get("type")
        item_id = item.get("id") or f"item_{index}"
        if kind == "message":
            yield event("response.output_item.added", output_index=index,
                        item={**item, "content": [], "status": "in_progress"})
            for part_index, part in enumerate(item.get("content") or ()):
                where = {"item_id": item_id, "output_index": index, "content_index": part_index}
                if part.get("type") == "output_text":
                    yield event("response.content_part.added", **where, part={**part, "text": ""})
                    text = part.get("text", "")
                    yield event("response.output_text.delta", **where, delta=text, logprobs=[])
                    yield event("response.output_text.done", **where, text=text, logprobs=[])
                else:
                    yield event("response.content_part.added", **where, part=part)
                yield event("response.content_part.done", **where, part=part)
        elif kind == "function_call":
            yield event("response.output_item.added", output_index=index,
                        item={**item, "arguments": "", "status": "in_progress"})
            arguments = item.get("arguments", "")
            yield event("response.function_call_arguments.delta", item_id=item_id, output_index=index, delta=arguments)
            yield event("response.function_call_arguments.done", item_id=item_id, output_index=index,
                        arguments=arguments, name=item.get("name"))
        else:
            yield event("response.output_item.added", output_index=index, item=item)
        yield event("response.output_item.done", output_index=index, item=item)
    final = "response.incomplete" if response.get("status") == "incomplete" else "response.completed"
    yield event(final, response=response)


def chat_completion_chunks(completion: dict, include_usage: bool = False) -> Iterator[Event]:
    base = {
        "id": completion.get("id", ""), "object": "chat.completion.chunk", "created": completion.get("created", 0),
        "model": completion.get("model", ""),
    }
    if completion.get("system_fingerprint") is not None:
        base["system_fingerprint"] = completion["system_fingerprint"]

    def chunk(index: int, delta: dict, finish_reason: Optional[str] = None, logprobs: Any = None) -> Event:
        choice = {"index": index, "delta": delta, "finish_reason": finish_reason, "logprobs": logprobs}
        return None, {**base, "choices": [choice]}

    for choice in completion.get("choices") or ():
        index = choice.get("index", 0)
        message = choice.get("message") or {}
        yield chunk(index, {"role": message.get("role", "assistant"), "content": ""})
        for key in ("reasoning_content", "reasoning"):
            if message.get(key):
                yield chunk(index, {key: message[key]})
        if message.get("content"):
            yield chunk(index, {"content": message["content"]}, logprobs=choice.get("logprobs"))
        for number, call in enumerate(message.get("tool_calls") or ()):
            function = call.get("function") or {}
            yield chunk(index, {"tool_calls": [{"index": number, "id": call.get("id"), "type": "function",
                                                "function": {"name": function.get("name"), "arguments": ""}}]})
            yield chunk(index, {"tool_calls": [{"index": number, "function": {"arguments": function.get("arguments", "")}}]})
        yield chunk(index, {}, finish_reason=choice.get("finish_reason") or "stop")
    if include_usage:
        yield None, {**base, "choices": [], "usage": completion.get("usage")}
    yield None, DONE


def messages_events(message: dict) -> Iterator[Event]:
    usage = message.get("usage") or {}
    start = {**message, "content": [], "stop_reason": None, "stop_sequence": None,
             "usage": {"input_tokens": usage.get("input_tokens", 0), "output_tokens": 0}}
    yield "message_start", {"type": "message_start", "message": start}
    for index, block in enumerate(message.get("content") or ()):
        kind = block.get("type")
        if kind == "text":
            opened, delta = {"type": "text", "text": ""}, {"type": "text_delta", "text": block.get("text", "")}
        elif kind == "tool_use":
            opened = {"type": "tool_use", "id": block.get("id"), "name": block.get("name"), "input": {}}
            delta = {"type": "input_json_delta", "partial_json": orjson.dumps(block.get("input") or {}).decode()}
        elif kind == "thinking":
            opened = {"type": "thinking", "thinking": "", "signature": ""}
            delta = {"type": "thinking_delta", "thinking": block.get("thinking", "")}
        else:
            opened, delta = block, None
        yield "content_block_start", {"type": "content_block_start", "index": index, "content_block": opened}
        if delta is not None:
            yield "content_block_delta", {"type": "content_block_delta", "index": index, "delta": delta}
        yield "content_block_stop", {"type": "content_block_stop", "index": index}
    yield "message_delta", {
        "type": "message_delta",
        "delta": {"stop_reason": message.get("stop_reason"), "stop_sequence": message.get("stop_sequence")},
        "usage": {"output_tokens": usage.get("output_tokens", 0)},
    }
    yield "message_stop", {"type": "message_stop"}
