"""Model-call capture: every model call a rollout made, filed under its rollout id (NeMo Gym v0.5, spec §7.2).

With the global `observability_enabled: true`, calls made for a rollout reach a model server as
`/ng-rollout/<rollout id>/v1/...` (`servers/rollout_context.py`). `ModelCallCaptureMiddleware`, which every model
server has, strips that prefix (always, so a prefixed call never 404s) and, when `model_call_capture_dir` is set,
appends one line per exchange on `/v1/responses` (dialect `responses`), `/v1/chat/completions` (`chat`) and
`/v1/messages` (`messages`) to `<dir>/<rollout id>.capture.jsonl`. The bytes go to the client unchanged; the line is
written and fsynced before the last part of the answer (for a stream: from its terminal event on) is sent, so a
rollout whose answer has arrived has all its calls on disk. Several requests and several replicas may append to one
file: each line is written whole under a file lock (`CaptureStore`).

The collector reads a rollout's file back as `ModelCallRecord`s (usage, finish reason, tool calls, latency, per
dialect) and adds their summary to the rollout's result (`merge_model_call_capture_into_record`), joining the
agent's own observations (`ng_agent_observations`) with those calls on the way; it deletes the files of rows it is
about to dispatch (`clear_capture`), so a rerun starts clean.

Only prefixed requests are touched. Those are never hot routes (`serving/hot_routes.py`), so the middleware says
`hot_routes_transparent` and unprefixed calls keep the fast path without passing through it. The model server does
not make the rollout id current while it answers: a model server that forwards to another model server of the
stack would otherwise have the same call captured twice.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
import uuid
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Mapping, Optional, Union

import orjson
from pydantic import BaseModel, ConfigDict, ValidationError, model_validator

from nemo_gym.api.streaming import DONE, ChatChunkAccumulator, SSEDecoder
from nemo_gym.errors import NeMoGymConfigError
from nemo_gym.rollouts.agent_observations import (
    AGENT_OBSERVATION_JOIN_FAILED,
    AGENT_OBSERVATIONS_KEY,
    join_agent_observations,
)
from nemo_gym.serving.body import read_body, replay_body
from nemo_gym.servers.rollout_context import (
    OBSERVABILITY_ENABLED_KEY_NAME,
    ROLLOUT_PATH_PREFIX,
    maybe_rollout_id_from_run_body,
    split_rollout_prefix,
    unprefixed_scope,
)

try:  # POSIX; elsewhere appends rely on O_APPEND alone
    import fcntl
except ImportError:  # pragma: no cover
    fcntl = None  # type: ignore[assignment]

logger = logging.getLogger(__name__)

__all__ = [
    "MODEL_CALL_CAPTURE_DIR_KEY_NAME",
    "MODEL_CALL_CAPTURE_KEY",
    "CAPTURED_DIALECTS",
    "ERROR_CATEGORIES",
    "ModelCallCaptureConfig",
    "CaptureStore",
    "CaptureReadout",
    "ModelCallRecord",
    "ModelCallCaptureMiddleware",
    "install_model_call_capture",
    "merge_model_call_capture_into_record",
    "summarize_model_call_capture",
    "clear_capture",
]

MODEL_CALL_CAPTURE_DIR_KEY_NAME = "model_call_capture_dir"
MODEL_CALL_CAPTURE_KEY = "ng_model_call_capture"  # the field a collected result gets

# The routes whose exchanges are captured, by the dialect name a capture line carries.
CAPTURED_DIALECTS: dict[str, str] = {
    "/v1/responses": "responses",
    "/v1/chat/completions": "chat",
    "/v1/messages": "messages",
}

ERROR_CATEGORIES = (
    "timeout", "rate_limit", "auth", "not_found", "client_error", "upstream_error", "incomplete",
    "stream_truncated", "capture_parse_error", "connection", "exception",
)

_PREFIX = f"/{ROLLOUT_PATH_PREFIX}/"
_CAPTURE_SUFFIX = ".capture.jsonl"
_INCOMPLETE_SUFFIX = ".capture.incomplete"
_RAW_LIMIT = 65536  # characters of an unparsable body kept as `request_raw` / `response_raw`


# --------------------------------------------------------------------------------------------------------
# Config


class ModelCallCaptureConfig(BaseModel):
    """The global keys that turn capture on: `observability_enabled` and `model_call_capture_dir` (required, and
    an absolute path, when observability is on: every server process must mean the same folder)."""

    model_config = ConfigDict(extra="ignore", protected_namespaces=())

    observability_enabled: bool = False
    model_call_capture_dir: Optional[str] = None

    @model_validator(mode="after")
    def _dir_required_when_enabled(self) -> "ModelCallCaptureConfig":
        if not self.observability_enabled:
            return self
        folder = self.model_call_capture_dir
        if not folder:
            raise ValueError(
                f"`{OBSERVABILITY_ENABLED_KEY_NAME}: true` needs `{MODEL_CALL_CAPTURE_DIR_KEY_NAME}`, the folder where "
                f"model servers write each rollout's model calls: add `+{MODEL_CALL_CAPTURE_DIR_KEY_NAME}=/absolute/path` "
                f"(or set `{OBSERVABILITY_ENABLED_KEY_NAME}: false`)."
            )
        if not os.path.isabs(folder):
            raise ValueError(
                f"`{MODEL_CALL_CAPTURE_DIR_KEY_NAME}` must be an absolute path (servers run in other folders), got "
                f"{folder!r}: use e.g. `+{MODEL_CALL_CAPTURE_DIR_KEY_NAME}={os.path.abspath(folder)}`."
            )
        return self

    @property
    def capturing(self) -> bool:
        """Whether model servers write capture files."""
        return self.observability_enabled and bool(self.model_call_capture_dir)

    @classmethod
    def from_global_config(cls, global_config: Any = None) -> "ModelCallCaptureConfig":
        """The two keys of `global_config` (this process's global config when None); a bad combination raises
        `NeMoGymConfigError` saying what to set."""
        from nemo_gym.config.values import config_get

        if global_config is None:
            from nemo_gym.config.global_config import get_global_config_dict

            global_config = get_global_config_dict()
        values = {
            OBSERVABILITY_ENABLED_KEY_NAME: config_get(global_config, OBSERVABILITY_ENABLED_KEY_NAME, False),
            MODEL_CALL_CAPTURE_DIR_KEY_NAME: config_get(global_config, MODEL_CALL_CAPTURE_DIR_KEY_NAME),
        }
        if values[MODEL_CALL_CAPTURE_DIR_KEY_NAME] is not None:
            values[MODEL_CALL_CAPTURE_DIR_KEY_NAME] = str(values[MODEL_CALL_CAPTURE_DIR_KEY_NAME])
        try:
            return cls.model_validate(values)
        except ValidationError as exc:
            messages = "; ".join(str(e.get("ctx", {}).get("error") or e["msg"]) for e in exc.errors())
            raise NeMoGymConfigError(f"Global config: {messages}") from None


# --------------------------------------------------------------------------------------------------------
# The files


class CaptureReadout(BaseModel):
    """What one rollout's capture file holds: its exchanges (file order), how many lines could not be read, and
    whether a write failed (`incomplete`, with the marker's text) or the file is missing."""

    exchanges: list[dict] = []
    unreadable_lines: int = 0
    incomplete: Optional[str] = None
    missing: bool = False


class CaptureStore:
    """`<root>/<rollout id>.capture.jsonl`: one JSON exchange per line, appended whole under an exclusive file lock
    and fsynced (concurrent requests and replicas share the file). A failed write leaves the file as it was and
    drops a `<rollout id>.capture.incomplete` marker, so the collector reports a gap instead of a short count."""

    def __init__(self, root: Union[str, os.PathLike]) -> None:
        self.root = Path(root)
        self._root_made = False

    def path(self, rollout_id: str) -> Path:
        return self.root / f"{_checked_id(rollout_id)}{_CAPTURE_SUFFIX}"

    def incomplete_marker(self, rollout_id: str) -> Path:
        return self.root / f"{_checked_id(rollout_id)}{_INCOMPLETE_SUFFIX}"

    def append(self, rollout_id: str, exchange: Mapping[str, Any]) -> bool:
        """Write one exchange (blocking: call it in a thread from async code); False if it could not be written
        (logged, and the incomplete marker set)."""
        try:
            line = orjson.dumps(exchange, default=str) + b"\n"
            if not self._root_made:
                self.root.mkdir(parents=True, exist_ok=True)
                self._root_made = True
            _append_locked(self.path(rollout_id), line)
            return True
        except Exception as exc:  # capture must never fail the model call itself
            logger.warning("model-call capture for rollout %s failed: %s", rollout_id, exc)
            self._mark_incomplete(rollout_id, f"{type(exc).__name__}: {exc}")
            return False

    def _mark_incomplete(self, rollout_id: str, detail: str) -> None:
        try:
            with open(self.incomplete_marker(rollout_id), "a", encoding="utf-8") as marker:
                marker.write(detail + "\n")
        except Exception:  # nothing more we can do; the warning above was logged
            pass

    def read(self, rollout_id: str) -> CaptureReadout:
        """The rollout's exchanges; raises OSError when the file exists but cannot be read."""
        readout = CaptureReadout()
        marker = self.incomplete_marker(rollout_id)
        if marker.exists():
            readout.incomplete = marker.read_text(encoding="utf-8", errors="replace").strip() or "a write failed"
        path = self.path(rollout_id)
        if not path.exists():
            readout.missing = True
            return readout
        for raw in path.read_bytes().splitlines():
            if not raw.strip():
                continue
            try:
                exchange = orjson.loads(raw)
            except orjson.JSONDecodeError:
                readout.unreadable_lines += 1
                continue
            if isinstance(exchange, dict):
                readout.exchanges.append(exchange)
            else:
                readout.unreadable_lines += 1
        return readout

    def clear(self, rollout_id: str) -> None:
        """Delete the rollout's capture file and marker (before the rollout is run, or run again)."""
        for path in (self.path(rollout_id), self.incomplete_marker(rollout_id)):
            try:
                path.unlink()
            except FileNotFoundError:
                pass


def _checked_id(rollout_id: str) -> str:
    prefix_id, _ = split_rollout_prefix(f"{_PREFIX}{rollout_id}/")
    if prefix_id != rollout_id:
        raise ValueError(f"not a rollout id: {rollout_id!r} (allowed characters: letters, digits, '.', '_', '-')")
    return rollout_id


def _append_locked(path: Path, line: bytes) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        if fcntl is not None:
            fcntl.flock(fd, fcntl.LOCK_EX)
        size = os.fstat(fd).st_size
        try:
            view = memoryview(line)
            while view:
                view = view[os.write(fd, view):]
            os.fsync(fd)
        except BaseException:
            os.ftruncate(fd, size)  # no half line for the next writer to follow
            raise
    finally:
        os.close(fd)  # releases the lock


def clear_capture(capture_dir: Union[str, os.PathLike, None], rollout_id: Optional[str]) -> None:
    """Delete one rollout's capture file (the collector calls this for rows it is about to dispatch)."""
    if capture_dir and rollout_id:
        CaptureStore(capture_dir).clear(rollout_id)


# --------------------------------------------------------------------------------------------------------
# Records: one exchange read back, per dialect


class ModelCallRecord(BaseModel):
    """One captured model call, normalised across the three dialects. `finish_reason` uses Chat Completions'
    words (`stop`, `length`, `tool_calls`, `content_filter`; other values as the API gave them); tokens are None
    when the answer had no usage."""

    model_config = ConfigDict(extra="ignore", protected_namespaces=())

    model_call_id: str
    rollout_id: Optional[str] = None
    call_index: int = 0
    model_ref: Optional[str] = None
    model: Optional[str] = None
    dialect: str
    stream: bool = False
    status_code: Optional[int] = None
    finish_reason: Optional[str] = None
    started_at: Optional[str] = None
    completed_at: Optional[str] = None
    tokens_in: Optional[int] = None
    tokens_out: Optional[int] = None
    tokens_reasoning: Optional[int] = None
    tokens_total: Optional[int] = None
    tokens_cache_read: Optional[int] = None
    tokens_cache_write: Optional[int] = None
    tool_calls: list[dict] = []
    reasoning_content: Optional[str] = None
    error_category: Optional[str] = None
    latency_total_ms: Optional[float] = None
    latency_ttft_ms: Optional[float] = None
    request: Any = None
    response: Any = None
    request_raw: Optional[str] = None
    response_raw: Optional[str] = None

    @classmethod
    def from_exchange(cls, exchange: Mapping[str, Any], call_index: int = 0) -> "ModelCallRecord":
        dialect = str(exchange.get("dialect") or "")
        request = exchange.get("request")
        response = exchange.get("response")
        fields = _DIALECT_READERS.get(dialect, _read_nothing)(response if isinstance(response, dict) else {})
        model = fields.pop("model", None) or (request.get("model") if isinstance(request, dict) else None)
        return cls(
            model_call_id=str(exchange.get("model_call_id") or ""),
            rollout_id=exchange.get("rollout_id"),
            call_index=call_index,
            model_ref=exchange.get("model_ref"),
            model=model,
            dialect=dialect,
            stream=bool(exchange.get("stream")),
            status_code=exchange.get("status_code"),
            started_at=exchange.get("started_at"),
            completed_at=exchange.get("completed_at"),
            error_category=exchange.get("error_category"),
            latency_total_ms=exchange.get("latency_ms"),
            latency_ttft_ms=exchange.get("latency_ttft_ms"),
            request=request,
            response=response,
            request_raw=exchange.get("request_raw"),
            response_raw=exchange.get("response_raw"),
            **fields,
        )

    def without_payloads(self) -> dict:
        return self.model_dump(mode="json", exclude=_PAYLOAD_FIELDS)


_PAYLOAD_FIELDS = {"request", "response", "request_raw", "response_raw"}


def _int(value: Any) -> Optional[int]:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _dig(data: Any, *keys: str) -> Any:
    for key in keys:
        if not isinstance(data, dict):
            return None
        data = data.get(key)
    return data


def _read_nothing(response: dict) -> dict:
    return {}


def _read_responses(response: dict) -> dict:
    usage = response.get("usage") or {}
    tool_calls, reasoning = [], []
    for item in response.get("output") or ():
        if not isinstance(item, dict):
            continue
        if item.get("type") == "function_call":
            tool_calls.append({"call_id": item.get("call_id"), "name": item.get("name"), "arguments": item.get("arguments")})
        elif item.get("type") == "reasoning":
            for part in [*(item.get("summary") or ()), *(item.get("content") or ())]:
                if isinstance(part, dict) and isinstance(part.get("text"), str):
                    reasoning.append(part["text"])
    status = response.get("status")
    if status == "incomplete":
        reason = _dig(response, "incomplete_details", "reason")
        finish = {"max_output_tokens": "length", "content_filter": "content_filter"}.get(reason, reason or "incomplete")
    elif status == "completed":
        finish = "tool_calls" if tool_calls else "stop"
    else:
        finish = status
    tokens_in, tokens_out = _int(usage.get("input_tokens")), _int(usage.get("output_tokens"))
    return {
        "model": response.get("model"),
        "finish_reason": finish,
        "tokens_in": tokens_in,
        "tokens_out": tokens_out,
        "tokens_reasoning": _int(_dig(usage, "output_tokens_details", "reasoning_tokens")),
        "tokens_total": _int(usage.get("total_tokens")) or _sum(tokens_in, tokens_out),
        "tokens_cache_read": _int(_dig(usage, "input_tokens_details", "cached_tokens")),
        "tool_calls": tool_calls,
        "reasoning_content": "\n".join(reasoning) or None,
    }


def _read_chat(response: dict) -> dict:
    usage = response.get("usage") or {}
    choices = response.get("choices") or [{}]
    choice = choices[0] if isinstance(choices[0], dict) else {}
    message = choice.get("message") or {}
    tool_calls = [
        {"call_id": call.get("id"), "name": _dig(call, "function", "name"), "arguments": _dig(call, "function", "arguments")}
        for call in message.get("tool_calls") or ()
        if isinstance(call, dict)
    ]
    reasoning = message.get("reasoning_content") or message.get("reasoning")
    tokens_in, tokens_out = _int(usage.get("prompt_tokens")), _int(usage.get("completion_tokens"))
    return {
        "model": response.get("model"),
        "finish_reason": choice.get("finish_reason"),
        "tokens_in": tokens_in,
        "tokens_out": tokens_out,
        "tokens_reasoning": _int(_dig(usage, "completion_tokens_details", "reasoning_tokens")),
        "tokens_total": _int(usage.get("total_tokens")) or _sum(tokens_in, tokens_out),
        "tokens_cache_read": _int(_dig(usage, "prompt_tokens_details", "cached_tokens")),
        "tool_calls": tool_calls,
        "reasoning_content": reasoning if isinstance(reasoning, str) and reasoning else None,
    }


_MESSAGES_STOP = {"end_turn": "stop", "stop_sequence": "stop", "max_tokens": "length", "tool_use": "tool_calls",
                  "refusal": "content_filter"}


def _read_messages(response: dict) -> dict:
    usage = response.get("usage") or {}
    tool_calls, thinking = [], []
    for block in response.get("content") or ():
        if not isinstance(block, dict):
            continue
        if block.get("type") == "tool_use":
            arguments = block.get("input")
            tool_calls.append({"call_id": block.get("id"), "name": block.get("name"),
                               "arguments": arguments if isinstance(arguments, str) else orjson.dumps(arguments or {}).decode()})
        elif block.get("type") == "thinking" and isinstance(block.get("thinking"), str):
            thinking.append(block["thinking"])
    stop = response.get("stop_reason")
    tokens_in, tokens_out = _int(usage.get("input_tokens")), _int(usage.get("output_tokens"))
    return {
        "model": response.get("model"),
        "finish_reason": _MESSAGES_STOP.get(stop, stop),
        "tokens_in": tokens_in,
        "tokens_out": tokens_out,
        "tokens_total": _sum(tokens_in, tokens_out),
        "tokens_cache_read": _int(usage.get("cache_read_input_tokens")),
        "tokens_cache_write": _int(usage.get("cache_creation_input_tokens")),
        "tool_calls": tool_calls,
        "reasoning_content": "\n".join(thinking) or None,
    }


def _sum(*values: Optional[int]) -> Optional[int]:
    present = [v for v in values if v is not None]
    return sum(present) if present else None


_DIALECT_READERS = {"responses": _read_responses, "chat": _read_chat, "messages": _read_messages}


# --------------------------------------------------------------------------------------------------------
# The collector's side


_GAP_NO_RECORDS = "model_call_capture_no_records"
_GAP_RECORDS_UNREADABLE = "model_call_capture_records_unreadable"
_GAP_INCOMPLETE = "model_call_capture_incomplete"
_GAP_UNREADABLE = "model_call_capture_unreadable"


def summarize_model_call_capture(capture_dir: Union[str, os.PathLike], rollout_id: str) -> dict:
    """`{rollout_id, metrics, calls, gaps?}` for one rollout's capture file (calls in start order, without
    request/response payloads)."""
    records, gaps = _read_capture(capture_dir, rollout_id)
    return _summary(rollout_id, records, gaps)


def _read_capture(capture_dir: Union[str, os.PathLike], rollout_id: str) -> tuple[list[ModelCallRecord], list[dict]]:
    """The rollout's calls as records (with payloads, in start order) and the gaps met reading them."""
    gaps: list[dict] = []
    records: list[ModelCallRecord] = []
    store = CaptureStore(capture_dir)
    try:
        readout = store.read(rollout_id)
    except OSError as exc:
        readout = None
        gaps.append({"code": _GAP_UNREADABLE, "detail": f"{type(exc).__name__}: {exc}"})
        if store.incomplete_marker(rollout_id).exists():
            gaps.append({"code": _GAP_INCOMPLETE, "detail": "a write failed"})
    if readout is not None:
        exchanges = sorted(readout.exchanges, key=lambda e: str(e.get("started_at") or ""))
        for index, exchange in enumerate(exchanges):
            try:
                records.append(ModelCallRecord.from_exchange(exchange, index))
            except ValidationError:
                readout.unreadable_lines += 1
        if readout.incomplete is not None:
            gaps.append({"code": _GAP_INCOMPLETE, "detail": readout.incomplete})
        if readout.unreadable_lines:
            gaps.append({"code": _GAP_RECORDS_UNREADABLE, "detail": f"{readout.unreadable_lines} unreadable line(s)"})
        if not records and not readout.unreadable_lines and readout.incomplete is None:
            gaps.append({"code": _GAP_NO_RECORDS})
    return records, gaps


def _summary(rollout_id: str, records: list[ModelCallRecord], gaps: list[dict]) -> dict:
    metrics = {
        "tokens_in": sum(r.tokens_in or 0 for r in records),
        "tokens_out": sum(r.tokens_out or 0 for r in records),
        "tokens_reasoning": sum(r.tokens_reasoning or 0 for r in records),
        "tokens_total": sum(r.tokens_total or 0 for r in records),
        "latency_total_ms": round(sum(r.latency_total_ms or 0.0 for r in records), 3),
        "num_calls": len(records),
    }
    summary: dict = {"rollout_id": rollout_id, "metrics": metrics, "calls": [r.without_payloads() for r in records]}
    if gaps:
        summary["gaps"] = gaps
    return summary


def merge_model_call_capture_into_record(record: Any, capture_dir: Union[str, os.PathLike, None]) -> Any:
    """Add `ng_model_call_capture` (`summarize_model_call_capture`) to a collected result (a dict, changed in
    place and returned). Nothing happens without a capture dir or without `_ng_task_index` / `_ng_rollout_index`
    in the record. A result with `ng_agent_observations` has that bundle joined with the captured calls and
    rewritten with their ids (`rollouts/agent_observations.py`); what cannot be joined is an
    `agent_observation_join_failed` gap of the summary, never an error. Every other field (reward, response, ...)
    is left as it is."""
    if not capture_dir or not isinstance(record, dict):
        return record
    rollout_id = maybe_rollout_id_from_run_body(record)
    if rollout_id is None:
        return record
    records, gaps = _read_capture(capture_dir, rollout_id)
    if record.get(AGENT_OBSERVATIONS_KEY) is not None:
        gaps.extend(_join_observations(record, records, rollout_id))
    record[MODEL_CALL_CAPTURE_KEY] = _summary(rollout_id, records, gaps)
    return record


def _join_observations(record: dict, records: list[ModelCallRecord], rollout_id: str) -> list[dict]:
    """Rewrite the result's bundle with the captured call ids; the join's gaps (an unexpected error too) as dicts."""
    try:
        join = join_agent_observations(record[AGENT_OBSERVATIONS_KEY], records, rollout_id=rollout_id)
    except Exception as exc:  # a result is never lost over its observations
        logger.warning("joining the agent observations of rollout %s failed: %r", rollout_id, exc)
        detail = f"the join failed, bundle kept as sent: {type(exc).__name__}: {exc}"
        return [{"code": AGENT_OBSERVATION_JOIN_FAILED, "detail": detail[:2000]}]
    record[AGENT_OBSERVATIONS_KEY] = join.bundle
    return [gap.model_dump(mode="json", exclude_none=True) for gap in join.gaps]


# --------------------------------------------------------------------------------------------------------
# The middleware


def install_model_call_capture(app: Any, *, model_ref: Optional[str], config: ModelCallCaptureConfig) -> None:
    """Add `ModelCallCaptureMiddleware` as the app's outermost layer (once), so a capture line holds exactly the
    bytes the client got, error answers of the exception middleware included."""
    if any(getattr(m, "cls", None) is ModelCallCaptureMiddleware for m in app.user_middleware):
        return
    store = CaptureStore(config.model_call_capture_dir) if config.capturing else None
    app.add_middleware(ModelCallCaptureMiddleware, model_ref=model_ref, store=store)


class ModelCallCaptureMiddleware:
    """Pure ASGI: `/ng-rollout/<id>/<rest>` is served as `/<rest>`; with a `store`, POSTs to the three dialect
    routes are captured under `<id>`. Everything else passes with one string check."""

    # Only prefixed paths are touched, and those are never hot routes (serving/hot_routes.py).
    hot_routes_transparent = True

    def __init__(self, app: Any, model_ref: Optional[str] = None, store: Optional[CaptureStore] = None) -> None:
        self.app = app
        self.model_ref = model_ref
        self.store = store

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        unprefixed = unprefixed_scope(scope)
        if unprefixed is None:
            await self.app(scope, receive, send)
            return
        rollout_id, scope = unprefixed
        rest = scope["path"]
        dialect = CAPTURED_DIALECTS.get(rest) if self.store is not None and scope["method"] == "POST" else None
        if dialect is None:
            await self.app(scope, receive, send)
            return
        await _CapturedExchange(self, rollout_id, dialect).run(scope, receive, send)


class _CapturedExchange:
    """One captured request/answer: forwards every message, watches the bytes, writes the line before the end."""

    def __init__(self, middleware: ModelCallCaptureMiddleware, rollout_id: str, dialect: str) -> None:
        self.middleware = middleware
        self.rollout_id = rollout_id
        self.dialect = dialect
        self.started_at = _now()
        self.t0 = time.perf_counter()
        self.ttft: Optional[float] = None
        self.status: Optional[int] = None
        self.sse = False
        self.body: list[bytes] = []
        self.stream: Optional[_SSEReassembler] = None
        self.holding = False
        self.held: list[dict] = []
        self.written = False
        self.disconnected = False
        self.request_bytes = b""

    async def run(self, scope: dict, receive: Any, send: Any) -> None:
        self.request_bytes = await read_body(receive)
        replay = replay_body(self.request_bytes, receive)

        async def watched_receive() -> dict:
            message = await replay()
            if message["type"] == "http.disconnect":
                self.disconnected = True
            return message

        async def watched_send(message: dict) -> None:
            kind = message["type"]
            if kind == "http.response.start":
                self.status = message["status"]
                self.sse = _is_event_stream(message.get("headers") or ())
                if self.sse:
                    self.stream = _SSEReassembler(self.dialect)
                await send(message)
                return
            if kind != "http.response.body":
                await send(message)
                return
            chunk = message.get("body", b"")
            if chunk and self.ttft is None:
                self.ttft = time.perf_counter()
            if self.stream is not None:
                self.stream.feed(chunk)
                self.holding = self.holding or self.stream.terminal_seen
            else:
                self.body.append(chunk)
            if message.get("more_body", False):
                if self.holding:  # the terminal event waits until its call is on disk
                    self.held.append(message)
                else:
                    await send(message)
                return
            await self._write(None)
            held, self.held = self.held, []
            for part in held:
                await send(part)
            await send(message)

        try:
            await self.middleware.app(scope, watched_receive, watched_send)
        except BaseException:
            if not self.written:
                category = "connection" if self.disconnected else "exception"
                await asyncio.shield(self._write(category))
                await self._send_held(send)
            raise
        if not self.written:  # the app stopped without the answer's last part (e.g. the client hung up)
            await self._write("connection" if self.disconnected else ("stream_truncated" if self.sse else "exception"))
            await self._send_held(send)

    async def _send_held(self, send: Any) -> None:
        """What was held back goes out after all when the app ended without its last message (best effort: the
        client may be gone)."""
        held, self.held = self.held, []
        try:
            for message in held:
                await send(message)
        except Exception:
            pass

    async def _write(self, forced_category: Optional[str]) -> None:
        if self.written:
            return
        self.written = True
        exchange = self._exchange(forced_category)
        await asyncio.to_thread(self.middleware.store.append, self.rollout_id, exchange)

    def _exchange(self, forced_category: Optional[str]) -> dict:
        now = time.perf_counter()
        exchange: dict = {
            "model_call_id": uuid.uuid4().hex,
            "rollout_id": self.rollout_id,
            "dialect": self.dialect,
            "model_ref": self.middleware.model_ref,
            "stream": self.sse,
            "started_at": self.started_at,
            "completed_at": _now(),
            "latency_ms": round((now - self.t0) * 1000, 3),
            "latency_ttft_ms": round((self.ttft - self.t0) * 1000, 3) if self.sse and self.ttft is not None else None,
            "status_code": self.status,
            "error_category": None,
        }
        try:
            exchange["request"] = orjson.loads(self.request_bytes)
        except orjson.JSONDecodeError:
            exchange["request"] = None
            exchange["request_raw"] = _raw(self.request_bytes)
        parse_failed = False
        stream_category = None
        if self.stream is not None:
            response, stream_category = self.stream.result()
            parse_failed = self.stream.parse_failed
            exchange["response"] = response
            if parse_failed or response is None:
                exchange["response_raw"] = self.stream.raw()
        else:
            raw = b"".join(self.body)
            try:
                exchange["response"] = orjson.loads(raw) if raw else None
            except orjson.JSONDecodeError:
                exchange["response"] = None
                exchange["response_raw"] = _raw(raw)
                parse_failed = True
        exchange["error_category"] = forced_category or _category(
            self.status, exchange["response"], stream_category, parse_failed, self.dialect
        )
        return exchange


def _category(status: Optional[int], response: Any, stream_category: Optional[str], parse_failed: bool, dialect: str) -> Optional[str]:
    if status is not None and status >= 400:
        if status in (408, 504):
            return "timeout"
        if status == 429:
            return "rate_limit"
        if status in (401, 403):
            return "auth"
        if status == 404:
            return "not_found"
        return "client_error" if status < 500 else "upstream_error"
    if stream_category is not None:
        return stream_category
    if parse_failed:
        return "capture_parse_error"
    if isinstance(response, dict):
        finish = _DIALECT_READERS[dialect](response).get("finish_reason")
        if dialect == "responses" and response.get("status") == "failed":
            return "upstream_error"
        if finish == "length" or (dialect == "responses" and response.get("status") == "incomplete"):
            return "incomplete"
    return None


def _is_event_stream(headers: Any) -> bool:
    for key, value in headers:
        if key.lower() == b"content-type":
            return value.split(b";", 1)[0].strip().lower() == b"text/event-stream"
    return False


def _now() -> str:
    return datetime.now(timezone.utc).isoformat()


def _raw(data: bytes) -> str:
    text = data.decode("utf-8", errors="replace")
    return text if len(text) <= _RAW_LIMIT else text[:_RAW_LIMIT] + "...[truncated]"


# --------------------------------------------------------------------------------------------------------
# Streams put back together


_TERMINAL_RESPONSES_EVENTS = {"response.completed", "response.incomplete", "response.failed"}


class _SSEReassembler:
    """A dialect's server-sent events read as they pass, and put back together into the answer a non-streamed
    call would have got: the final Response (Responses), the merged chat completion (Chat Completions), the
    Message (Messages). `terminal_seen` turns true with the event that ends the stream."""

    def __init__(self, dialect: str) -> None:
        self.dialect = dialect
        self.decoder = SSEDecoder()
        self.pending = b""
        self.chunks: list[bytes] = []
        self.terminal_seen = False
        self.parse_failed = False
        self.error: Any = None
        self.response: Any = None  # responses: the final Response
        self.chat = ChatChunkAccumulator() if dialect == "chat" else None
        self.message: Optional[dict] = None  # messages
        self.blocks: dict[int, dict] = {}
        self.partial_json: dict[int, str] = {}

    def feed(self, chunk: bytes) -> None:
        if not chunk:
            return
        self.chunks.append(chunk)
        data = self.pending + chunk
        lines = data.split(b"\n")
        self.pending = lines.pop()
        for line in lines:
            try:
                event = self.decoder.line(line.rstrip(b"\r").decode("utf-8"))
            except (UnicodeDecodeError, orjson.JSONDecodeError):
                self.parse_failed = True
                continue
            if event is not None:
                self._event(*event)

    def _event(self, name: Optional[str], payload: Any) -> None:
        if payload is DONE:
            self.terminal_seen = self.terminal_seen or self.dialect == "chat"
            return
        if not isinstance(payload, dict):
            return
        kind = payload.get("type") or name
        if kind == "error" or (self.dialect == "chat" and "error" in payload and "choices" not in payload):
            self.error = payload
            self.terminal_seen = True
            return
        if self.dialect == "responses":
            if kind in _TERMINAL_RESPONSES_EVENTS:
                self.response = payload.get("response")
                self.terminal_seen = True
            elif kind == "response.created" and self.response is None:
                self.response = payload.get("response")
        elif self.dialect == "chat":
            self.chat.add(payload)
        else:
            self._message_event(kind, payload)

    def _message_event(self, kind: Optional[str], payload: dict) -> None:
        if kind == "message_start":
            self.message = dict(payload.get("message") or {})
            self.message["content"] = []
        elif kind == "content_block_start":
            self.blocks[payload.get("index", len(self.blocks))] = dict(payload.get("content_block") or {})
        elif kind == "content_block_delta":
            index = payload.get("index", 0)
            block = self.blocks.setdefault(index, {})
            delta = payload.get("delta") or {}
            kind_of_delta = delta.get("type")
            if kind_of_delta == "text_delta":
                block["text"] = block.get("text", "") + delta.get("text", "")
            elif kind_of_delta == "thinking_delta":
                block["thinking"] = block.get("thinking", "") + delta.get("thinking", "")
            elif kind_of_delta == "signature_delta":
                block["signature"] = block.get("signature", "") + delta.get("signature", "")
            elif kind_of_delta == "input_json_delta":
                self.partial_json[index] = self.partial_json.get(index, "") + delta.get("partial_json", "")
        elif kind == "message_delta" and self.message is not None:
            self.message.update({k: v for k, v in (payload.get("delta") or {}).items()})
            usage = dict(self.message.get("usage") or {})
            usage.update(payload.get("usage") or {})
            self.message["usage"] = usage
        elif kind == "message_stop":
            self.terminal_seen = True

    def result(self) -> tuple[Any, Optional[str]]:
        """(the reassembled answer, the error category the stream itself shows or None)."""
        if self.error is not None:
            return self.error, "upstream_error"
        truncated = None if self.terminal_seen else "stream_truncated"
        if self.dialect == "responses":
            if self.terminal_seen and isinstance(self.response, dict) and self.response.get("status") == "failed":
                return self.response, "upstream_error"
            return self.response, truncated
        if self.dialect == "chat":
            return (self.chat.completion() if self.chat.head is not None else None), truncated
        if self.message is None:
            return None, truncated
        for index, text in self.partial_json.items():
            try:
                self.blocks.setdefault(index, {})["input"] = orjson.loads(text) if text else {}
            except orjson.JSONDecodeError:
                self.blocks.setdefault(index, {})["input"] = text
        return {**self.message, "content": [self.blocks[i] for i in sorted(self.blocks)]}, truncated

    def raw(self) -> str:
        return _raw(b"".join(self.chunks))
