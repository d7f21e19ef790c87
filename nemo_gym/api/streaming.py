"""Server-sent events in each API's official event sequence, from a finished answer or from deltas as they come.

Two ways to stream (`nemo_gym/serving/stream_adapter.py` picks one per server and route):

- **Buffered**: the whole answer is computed, then sent as the events a streaming backend would have sent
  (:func:`responses_events`, :func:`chat_completion_chunks`, :func:`messages_events`).
- **Passed through**: a model server whose backend streams yields Responses events or chat chunks as they arrive.
  :class:`ResponsesStreamWriter` is the one place that turns deltas (text, reasoning, tool-call arguments) into
  Responses events, the buffered :func:`responses_events` included; :class:`ChatToResponses` feeds it from a Chat
  Completions backend's chunks; :class:`ResponsesToMessages` turns Responses events into Anthropic Messages events.

Every function or method yields / returns `(event name or None, payload dict)`; :func:`encode_sse` turns one into
wire bytes and :class:`SSEDecoder` reads a backend's stream back. A backend asked to stream that answers whole
(JSON, not server-sent events) is :class:`BackendDoesNotStream`: the stream adapter then sends the buffered events.

- Responses: `response.created`, `response.in_progress`, then per output item `response.output_item.added`,
  for a message per text part `response.content_part.added`, `response.output_text.delta`,
  `response.output_text.done`, `response.content_part.done`, for a function call
  `response.function_call_arguments.delta` and `.done`, for streamed reasoning
  `response.reasoning_summary_part.added`, `response.reasoning_summary_text.delta` / `.done`,
  `response.reasoning_summary_part.done`, then `response.output_item.done`; last `response.completed` (or
  `response.incomplete`) with the whole Response. Every event has a `sequence_number`.
- Chat Completions: `chat.completion.chunk`s: the role, the content, each tool call (name, then arguments), a
  last chunk with `finish_reason`, a usage chunk when `stream_options.include_usage` asked for one, then `[DONE]`.
- Messages: `message_start`, per content block `content_block_start` / `content_block_delta` (`text_delta`,
  `input_json_delta`, `thinking_delta`) / `content_block_stop`, `message_delta` (stop reason, usage),
  `message_stop`.
"""

from __future__ import annotations

from typing import Any, Callable, Iterator, Optional

import orjson

from nemo_gym.api.anthropic_messages import anthropic_error, response_to_message
from nemo_gym.api.chat_conversion import TOKEN_FIELDS, ThinkSplitter, _output_logprobs, new_item_id

__all__ = [
    "encode_sse",
    "SSEDecoder",
    "responses_events",
    "chat_completion_chunks",
    "messages_events",
    "ResponsesStreamWriter",
    "ChatChunkAccumulator",
    "ChatToResponses",
    "ResponsesToMessages",
    "DONE",
    "BackendDoesNotStream",
    "does_not_stream",
]

DONE = object()  # the Chat Completions stream's closing `data: [DONE]`

Event = tuple[Optional[str], Any]

NOT_STREAMING = "the backend does not stream"  # the end of the message of the error below


class BackendDoesNotStream(RuntimeError):
    """A backend asked to stream (`"stream": true`) answered whole (JSON, not server-sent events). Raised (before
    any event) by a model server's streaming hook, the stream adapter answers the request from the server's
    non-streamed route instead, as the buffered events. Its message should end with :data:`NOT_STREAMING`."""


def does_not_stream(exc: BaseException) -> bool:
    """Whether `exc` (or what it was raised from) says the backend answered a streamed request whole: a
    :class:`BackendDoesNotStream`, or the `RuntimeError` ending with :data:`NOT_STREAMING` that
    `nemo_gym/http/sse_client.py`'s `upstream_sse` raises."""
    seen = 0
    while exc is not None and seen < 8:
        if isinstance(exc, BackendDoesNotStream) or (
            type(exc) is RuntimeError and str(exc).rstrip().endswith(NOT_STREAMING)
        ):
            return True
        exc, seen = exc.__cause__ or exc.__context__, seen + 1
    return False


def encode_sse(event: Optional[str], payload: Any) -> bytes:
    if payload is DONE:
        return b"data: [DONE]\n\n"
    head = f"event: {event}\n".encode() if event else b""
    return head + b"data: " + orjson.dumps(payload) + b"\n\n"


class SSEDecoder:
    """Server-sent events back from lines (without their line ending): :meth:`line` returns `(event, payload)`
    when a blank line ends an event, the payload parsed JSON or :data:`DONE` for `[DONE]`."""

    def __init__(self) -> None:
        self._event: Optional[str] = None
        self._data: list[str] = []

    def line(self, line: str) -> Optional[Event]:
        if not line:
            if not self._data:
                self._event = None
                return None
            data, event = "\n".join(self._data), self._event
            self._data, self._event = [], None
            return event, DONE if data.strip() == "[DONE]" else orjson.loads(data)
        if line.startswith(":"):
            return None
        field, _, value = line.partition(":")
        value = value[1:] if value.startswith(" ") else value
        if field == "event":
            self._event = value
        elif field == "data":
            self._data.append(value)
        return None


# --------------------------------------------------------------------------------------------------------
# Responses


class ResponsesStreamWriter:
    """Responses events for one response, from deltas as they come (:meth:`text`, :meth:`reasoning`,
    :meth:`tool_call`) or whole items (:meth:`item_events`); :meth:`finish` closes what is open with the final
    Response's items and sends `response.completed`. `stub` is the Response as known at the start (id, model,
    created_at, the echoed request fields); the final Response gets its id and creation time. Item ids come from
    `new_id(prefix)`; :meth:`final_id` hands the same ids to the code that builds the final Response, so streamed
    and final items match (the SDKs check)."""

    def __init__(self, stub: dict, new_id: Callable[[str], str] = new_item_id) -> None:
        self.stub = stub
        self.sequence = 0
        self.new_id = new_id
        self.count = 0  # output items opened so far
        self.streamed: dict[tuple, int] = {}  # identity of each streamed item -> its output index
        self._open: Optional[dict] = None  # {"index", "item", "key", "summary_index"}
        self._ids: dict[str, list[str]] = {}

    def event(self, kind: str, **fields: Any) -> Event:
        payload = {"type": kind, **fields, "sequence_number": self.sequence}
        self.sequence += 1
        return kind, payload

    def final_id(self, prefix: str) -> str:
        """The id of the next streamed item made with `prefix` (in order), else a new one."""
        ids = self._ids.get(prefix)
        return ids.pop(0) if ids else self.new_id(prefix)

    def start(self) -> list[Event]:
        started = {**self.stub, "status": "in_progress", "output": [], "usage": None}
        return [self.event("response.created", response=started), self.event("response.in_progress", response=started)]

    def _open_item(self, item: dict, prefix: str, key: Any = None) -> list[Event]:
        events = self.close()
        index = self.count
        self.count += 1
        self._ids.setdefault(prefix, []).append(item["id"])
        self._open = {"index": index, "item": item, "key": key, "summary_index": -1}
        self.streamed[_identity(item)] = index
        added = {**item, **{name: [] for name in ("content", "summary") if name in item}}
        events.append(self.event("response.output_item.added", output_index=index, item=added))
        return events

    def text(self, delta: str, logprobs: Optional[list] = None) -> list[Event]:
        events: list[Event] = []
        if self._open is None or self._open["item"]["type"] != "message":
            item = {"id": self.new_id("msg"), "type": "message", "role": "assistant", "status": "in_progress",
                    "content": []}
            events += self._open_item(item, "msg")
            where = self._where(0)
            events.append(self.event("response.content_part.added", **where,
                                     part={"type": "output_text", "text": "", "annotations": [], "logprobs": []}))
            item["content"].append({"type": "output_text", "text": "", "annotations": [], "logprobs": []})
        part = self._open["item"]["content"][0]
        part["text"] += delta
        part["logprobs"] += logprobs or []
        events.append(self.event("response.output_text.delta", **self._where(0), delta=delta, logprobs=logprobs or []))
        return events

    def reasoning(self, delta: str, new_part: bool = False) -> list[Event]:
        events: list[Event] = []
        if self._open is None or self._open["item"]["type"] != "reasoning":
            events += self._open_item({"id": self.new_id("rs"), "type": "reasoning", "summary": []}, "rs")
            new_part = True
        opened = self._open
        if new_part:
            events += self._close_summary_part()
            opened["summary_index"] += 1
            opened["item"]["summary"].append({"type": "summary_text", "text": ""})
            events.append(self.event("response.reasoning_summary_part.added", **self._summary_where(),
                                     part={"type": "summary_text", "text": ""}))
        opened["item"]["summary"][-1]["text"] += delta
        events.append(self.event("response.reasoning_summary_text.delta", **self._summary_where(), delta=delta))
        return events

    def tool_call(self, key: Any, call_id: Optional[str], name: Optional[str], arguments: str,
                  item_id: Optional[str] = None) -> list[Event]:
        """A piece of tool call `key` (the backend's tool-call index): its call id, name (and item id, else the
        call id) come with the first piece."""
        events: list[Event] = []
        if self._open is None or self._open["item"]["type"] != "function_call" or self._open["key"] != key:
            call_id = call_id or self.new_id("call")
            item = {"id": item_id or call_id, "type": "function_call", "call_id": call_id, "name": name or "",
                    "arguments": "", "status": "in_progress"}
            events += self._open_item(item, "call", key)
        item = self._open["item"]
        if name and not item["name"]:
            item["name"] = name
        if arguments:
            item["arguments"] += arguments
            events.append(self.event("response.function_call_arguments.delta", item_id=item["id"],
                                     output_index=self._open["index"], delta=arguments))
        return events

    @property
    def open_call_id(self) -> Optional[str]:
        """The call id of the function call being streamed, if one is."""
        if self._open is not None and self._open["item"]["type"] == "function_call":
            return self._open["item"]["call_id"]
        return None

    def close(self, final: Optional[dict] = None) -> list[Event]:
        """Close the item being streamed; `final` is the finished item to report (else what was streamed)."""
        opened, self._open = self._open, None
        if opened is None:
            return []
        index, item = opened["index"], opened["item"]
        done = final if final is not None else {**item, "status": "completed"} if "status" in item else item
        events: list[Event] = []
        kind = item["type"]
        if kind == "message":
            part = next((p for p in done.get("content") or () if p.get("type") == "output_text"), item["content"][0])
            where = self._where(0, index, item["id"])
            events.append(self.event("response.output_text.done", **where, text=part.get("text", ""),
                                     logprobs=part.get("logprobs") or []))
            events.append(self.event("response.content_part.done", **where, part=part))
        elif kind == "reasoning":
            self._open = opened
            events += self._close_summary_part(done)
            self._open = None
        elif kind == "function_call":
            events.append(self.event("response.function_call_arguments.done", item_id=item["id"], output_index=index,
                                     arguments=done.get("arguments", ""), name=done.get("name")))
        events.append(self.event("response.output_item.done", output_index=index, item=done))
        return events

    def item_events(self, item: dict) -> list[Event]:
        """All the events of a finished output item, at the next output index (one delta per text)."""
        events = self.close()
        index = self.count
        self.count += 1
        self.streamed[_identity(item)] = index
        kind = item.get("type")
        item_id = item.get("id") or f"item_{index}"
        if kind == "message":
            events.append(self.event("response.output_item.added", output_index=index,
                                     item={**item, "content": [], "status": "in_progress"}))
            for part_index, part in enumerate(item.get("content") or ()):
                where = {"item_id": item_id, "output_index": index, "content_index": part_index}
                if part.get("type") == "output_text":
                    events.append(self.event("response.content_part.added", **where, part={**part, "text": ""}))
                    text = part.get("text", "")
                    events.append(self.event("response.output_text.delta", **where, delta=text, logprobs=[]))
                    events.append(self.event("response.output_text.done", **where, text=text, logprobs=[]))
                else:
                    events.append(self.event("response.content_part.added", **where, part=part))
                events.append(self.event("response.content_part.done", **where, part=part))
        elif kind == "function_call":
            events.append(self.event("response.output_item.added", output_index=index,
                                     item={**item, "arguments": "", "status": "in_progress"}))
            arguments = item.get("arguments", "")
            events.append(self.event("response.function_call_arguments.delta", item_id=item_id, output_index=index,
                                     delta=arguments))
            events.append(self.event("response.function_call_arguments.done", item_id=item_id, output_index=index,
                                     arguments=arguments, name=item.get("name")))
        else:
            events.append(self.event("response.output_item.added", output_index=index, item=item))
        events.append(self.event("response.output_item.done", output_index=index, item=item))
        return events

    def finish(self, response: dict) -> list[Event]:
        """Close the open item with its final version, send the final items that were not streamed, then
        `response.completed` (or `response.incomplete`) with `response` (given the stub's id and created_at)."""
        response = {**response, **{key: self.stub[key] for key in ("id", "created_at") if key in self.stub}}
        output = response.get("output") or []
        by_identity = {_identity(item): item for item in output if isinstance(item, dict)}
        events: list[Event] = []
        if self._open is not None:
            events += self.close(by_identity.get(_identity(self._open["item"])))
        for item in output:
            if isinstance(item, dict) and _identity(item) not in self.streamed:
                events += self.item_events(item)
        final = "response.incomplete" if response.get("status") == "incomplete" else "response.completed"
        events.append(self.event(final, response=response))
        return events

    def error(self, message: str, code: str = "server_error") -> list[Event]:
        """An `error` event (the SDKs raise on it): the stream cannot go on."""
        return [self.event("error", code=code, message=message, param=None,
                           error={"type": code, "code": code, "message": message})]

    # -- helpers

    def _where(self, content_index: int, index: Optional[int] = None, item_id: Optional[str] = None) -> dict:
        if index is None:
            index, item_id = self._open["index"], self._open["item"]["id"]
        return {"item_id": item_id, "output_index": index, "content_index": content_index}

    def _summary_where(self) -> dict:
        opened = self._open
        return {"item_id": opened["item"]["id"], "output_index": opened["index"],
                "summary_index": opened["summary_index"]}

    def _close_summary_part(self, done: Optional[dict] = None) -> list[Event]:
        opened = self._open
        if opened is None or opened["summary_index"] < 0:
            return []
        summary = (done or opened["item"]).get("summary") or opened["item"]["summary"]
        position = min(opened["summary_index"], len(summary) - 1)
        part = summary[position] if position >= 0 else {"type": "summary_text", "text": ""}
        return [
            self.event("response.reasoning_summary_text.done", **self._summary_where(), text=part.get("text", "")),
            self.event("response.reasoning_summary_part.done", **self._summary_where(), part=part),
        ]


def _identity(item: dict) -> tuple:
    """What identifies an output item across a stream (the SDKs' rule: function calls by call id)."""
    if item.get("type") == "function_call":
        return "function_call", item.get("call_id")
    return item.get("type"), item.get("id")


def responses_events(response: dict) -> Iterator[Event]:
    """The events of a finished Response (buffered streaming)."""
    writer = ResponsesStreamWriter(response)
    yield from writer.start()
    for item in response.get("output") or ():
        yield from writer.item_events(item)
    yield from writer.finish(response)


# --------------------------------------------------------------------------------------------------------
# Chat Completions


def chat_completion_chunks(
    completion: dict, include_usage: bool = False, pieces: Callable[[str], list[str]] = lambda text: [text]
) -> Iterator[Event]:
    """The chunks of a finished chat completion (buffered streaming); `pieces` splits a text (content, reasoning,
    tool-call arguments) into the deltas to send, by default one."""
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
                for piece in pieces(message[key]):
                    yield chunk(index, {key: piece})
        if message.get("content"):
            texts = pieces(message["content"])
            for number, piece in enumerate(texts):  # per-token logprobs cannot be split: they go with the last
                last = number == len(texts) - 1
                yield chunk(index, {"content": piece}, logprobs=choice.get("logprobs") if last else None)
        for number, call in enumerate(message.get("tool_calls") or ()):
            function = call.get("function") or {}
            yield chunk(index, {"tool_calls": [{"index": number, "id": call.get("id"), "type": "function",
                                                "function": {"name": function.get("name"), "arguments": ""}}]})
            for piece in pieces(function.get("arguments", "")):
                yield chunk(index, {"tool_calls": [{"index": number, "function": {"arguments": piece}}]})
        yield chunk(index, {}, finish_reason=choice.get("finish_reason") or "stop")
    if include_usage:
        yield None, {**base, "choices": [], "usage": completion.get("usage")}
    yield None, DONE


class ChatChunkAccumulator:
    """Chat completion chunks merged into the chat completion a non-streamed call would have returned: content and
    reasoning fields concatenated, tool calls merged by index, per-token logprobs joined, the last finish reason
    and usage."""

    def __init__(self) -> None:
        self.head: Optional[dict] = None
        self.usage: Any = None
        self.choices: dict[int, dict] = {}

    def add(self, chunk: dict) -> None:
        if self.head is None:
            self.head = {"id": chunk.get("id", ""), "object": "chat.completion", "created": chunk.get("created", 0),
                         "model": chunk.get("model", "")}
            if chunk.get("system_fingerprint") is not None:
                self.head["system_fingerprint"] = chunk["system_fingerprint"]
        if chunk.get("usage"):
            self.usage = chunk["usage"]
        for choice in chunk.get("choices") or ():
            index = choice.get("index", 0)
            state = self.choices.get(index)
            if state is None:
                state = self.choices[index] = {"message": {"role": "assistant", "content": None}, "calls": {},
                                               "logprobs": None, "finish_reason": None}
            message = state["message"]
            for key, value in (choice.get("delta") or {}).items():
                if key == "tool_calls":
                    for call in value or ():
                        merged = state["calls"].setdefault(call.get("index", len(state["calls"])), {
                            "id": None, "type": "function", "function": {"name": "", "arguments": ""}})
                        if call.get("id"):
                            merged["id"] = call["id"]
                        function = call.get("function") or {}
                        if function.get("name"):
                            merged["function"]["name"] += function["name"]
                        if function.get("arguments"):
                            merged["function"]["arguments"] += function["arguments"]
                elif key in ("content", "reasoning_content", "reasoning", "refusal") and isinstance(value, str):
                    message[key] = (message.get(key) or "") + value
                elif key == "role" and value:
                    message["role"] = value
            logprobs = choice.get("logprobs")
            if isinstance(logprobs, dict) and isinstance(logprobs.get("content"), list):
                if state["logprobs"] is None:
                    state["logprobs"] = {"content": []}
                state["logprobs"]["content"] += logprobs["content"]
            if choice.get("finish_reason") is not None:
                state["finish_reason"] = choice["finish_reason"]

    def completion(self) -> dict:
        choices = []
        for index in sorted(self.choices):
            state = self.choices[index]
            message = dict(state["message"])
            if state["calls"]:
                message["tool_calls"] = [state["calls"][key] for key in sorted(state["calls"])]
            choices.append({"index": index, "message": message, "finish_reason": state["finish_reason"] or "stop",
                            "logprobs": state["logprobs"]})
        return {**(self.head or {"id": "", "object": "chat.completion", "created": 0, "model": ""}),
                "choices": choices, "usage": self.usage}


class ChatToResponses:
    """A Chat Completions backend's chunks as Responses events, as they come (first choice): reasoning fields and,
    with `split_think`, `<think>` blocks in the content as reasoning, the content as output text (with per-token
    logprobs when `output_logprobs`), tool calls as function calls. Whitespace before any text is held back until
    text follows (the final Response drops a whitespace-only message). :attr:`chunks` accumulates the completion;
    :meth:`finish` takes the final Response built from it with ids from :meth:`final_id`."""

    def __init__(self, stub: dict, *, split_think: bool, output_logprobs: bool = False,
                 new_id: Callable[[str], str] = new_item_id) -> None:
        self.writer = ResponsesStreamWriter(stub, new_id)
        self.chunks = ChatChunkAccumulator()
        self.splitter = ThinkSplitter() if split_think else None
        self.output_logprobs = output_logprobs
        self._held = ""
        self._texted = False

    def start(self) -> list[Event]:
        return self.writer.start()

    def final_id(self, prefix: str) -> str:
        return self.writer.final_id(prefix)

    def feed(self, chunk: dict) -> list[Event]:
        self.chunks.add(chunk)
        choice = next((c for c in chunk.get("choices") or () if c.get("index", 0) == 0), None)
        if choice is None:
            return []
        delta = choice.get("delta") or {}
        events: list[Event] = []
        reasoning = delta.get("reasoning_content") or delta.get("reasoning")
        if isinstance(reasoning, str) and reasoning:
            events += self.writer.reasoning(reasoning)
        content = delta.get("content")
        if isinstance(content, str) and content:
            logprobs = _output_logprobs(choice.get("logprobs")) if self.output_logprobs else None
            runs = self.splitter.feed(content) if self.splitter is not None else [("text", content, False)]
            for kind, text, starts_block in runs:
                if kind == "reasoning":
                    events += self.writer.reasoning(text, new_part=starts_block)
                else:
                    events += self._text(text, logprobs)
        for call in delta.get("tool_calls") or ():
            function = call.get("function") or {}
            events += self.writer.tool_call(call.get("index", 0), call.get("id"), function.get("name"),
                                            function.get("arguments") or "")
            merged = self.chunks.choices[0]["calls"].get(call.get("index", 0))
            if merged is not None and merged["id"] is None:  # the final Response must use the streamed id
                merged["id"] = self.writer.open_call_id
        return events

    def _text(self, text: str, logprobs: Optional[list]) -> list[Event]:
        if not self._texted and not (self._held + text).strip():
            self._held += text
            return []
        text, self._held, self._texted = self._held + text, "", True
        return self.writer.text(text, logprobs)

    def finish(self, response: dict) -> list[Event]:
        events: list[Event] = []
        if self.splitter is not None:
            for kind, text, starts_block in self.splitter.flush():
                events += self.writer.reasoning(text, starts_block) if kind == "reasoning" else self._text(text, None)
        return events + self.writer.finish(response)

    def error(self, message: str, code: str = "server_error") -> list[Event]:
        return self.writer.error(message, code)


# --------------------------------------------------------------------------------------------------------
# Anthropic Messages


def messages_events(message: dict) -> Iterator[Event]:
    """The events of a finished Message (buffered streaming)."""
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


class ResponsesToMessages:
    """Responses events (streamed by a model server) as Anthropic Messages events, as they come: output text ->
    `text` blocks, function calls -> `tool_use` blocks (arguments as `input_json_delta`), reasoning -> `thinking`
    blocks; the stop reason and usage from the final Response (as :func:`response_to_message` sets them). Token
    fields of a finished output item go on its block's `content_block_stop` event. `model` names the model when
    the Response does not."""

    def __init__(self, model: Optional[str] = None) -> None:
        self.model = model
        self.blocks = 0
        self._open: Optional[dict] = None  # {"index", "kind", "streamed"}
        self._started = False

    def feed(self, event: dict) -> list[Event]:
        kind = event.get("type")
        out: list[Event] = []
        if kind in ("response.created", "response.in_progress"):
            if not self._started:
                self._started = True
                response = event.get("response") or {}
                message = response_to_message({**response, "output": []}, self.model)
                out.append(("message_start", {"type": "message_start", "message": {
                    **message, "content": [], "stop_reason": None, "stop_sequence": None}}))
        elif kind == "response.output_item.added":
            item = event.get("item") or {}
            if item.get("type") == "function_call":
                out += self._start({"type": "tool_use", "id": item.get("call_id") or item.get("id") or "",
                                    "name": item.get("name", ""), "input": {}}, "tool_use")
            elif item.get("type") == "reasoning":
                out += self._start({"type": "thinking", "thinking": "", "signature": ""}, "thinking")
        elif kind == "response.content_part.added":
            part = event.get("part") or {}
            if part.get("type") in ("output_text", "refusal"):
                out += self._start({"type": "text", "text": ""}, "text")
        elif kind == "response.output_text.delta":
            out += self._delta("text", {"type": "text_delta", "text": event.get("delta", "")})
        elif kind in ("response.reasoning_summary_text.delta", "response.reasoning_text.delta"):
            out += self._delta("thinking", {"type": "thinking_delta", "thinking": event.get("delta", "")})
        elif kind == "response.function_call_arguments.delta":
            out += self._delta("tool_use", {"type": "input_json_delta", "partial_json": event.get("delta", "")})
        elif kind == "response.content_part.done":
            # The text block stays open until its item is done, whose token fields go on the block's stop.
            part = event.get("part") or {}
            if self._open is not None and self._open["kind"] == "text" and not self._open["streamed"]:
                text = part.get("text") if part.get("type") == "output_text" else part.get("refusal")
                out += self._delta("text", {"type": "text_delta", "text": text or ""})
        elif kind == "response.output_item.done":
            item = event.get("item") or {}
            if self._open is not None and self._open["kind"] in ("tool_use", "thinking") and not self._open["streamed"]:
                block = response_to_message({"output": [item]})["content"]
                if block and block[0]["type"] == "tool_use":
                    out += self._delta("tool_use", {"type": "input_json_delta",
                                                    "partial_json": orjson.dumps(block[0]["input"]).decode()})
                elif block and block[0]["type"] == "thinking":
                    out += self._delta("thinking", {"type": "thinking_delta", "thinking": block[0]["thinking"]})
            out += self._stop(item)
        elif kind in ("response.completed", "response.incomplete", "response.failed"):
            out += self._stop()
            message = response_to_message(event.get("response") or {}, self.model)
            out.append(("message_delta", {"type": "message_delta",
                                          "delta": {"stop_reason": message["stop_reason"], "stop_sequence": None},
                                          "usage": message["usage"]}))
            out.append(("message_stop", {"type": "message_stop"}))
        elif kind == "error":
            out.append(("error", anthropic_error(500, str(event.get("message") or "the stream failed"))))
        return out

    def _start(self, block: dict, kind: str) -> list[Event]:
        out = self._stop()
        self._open = {"index": self.blocks, "kind": kind, "streamed": False}
        self.blocks += 1
        out.append(("content_block_start", {"type": "content_block_start", "index": self._open["index"],
                                            "content_block": block}))
        return out

    def _delta(self, kind: str, delta: dict) -> list[Event]:
        if self._open is None or self._open["kind"] != kind:
            return []
        if delta.get("text") == "" or delta.get("partial_json") == "" or delta.get("thinking") == "":
            return []
        self._open["streamed"] = True
        return [("content_block_delta", {"type": "content_block_delta", "index": self._open["index"], "delta": delta})]

    def _stop(self, item: Optional[dict] = None) -> list[Event]:
        opened, self._open = self._open, None
        if opened is None:
            return []
        tokens = {key: item[key] for key in TOKEN_FIELDS if item is not None and key in item}
        return [("content_block_stop", {"type": "content_block_stop", "index": opened["index"], **tokens})]
