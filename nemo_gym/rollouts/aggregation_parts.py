"""`POST /aggregate_metrics` in bounded parts: any number of rollouts under every server's request-size limit.

NeMo Gym v0.5 sends all of an agent's verify responses in one request. Every server of ours refuses a body over
`max_request_body_bytes` (32 MiB by default) with a 413, which one request reaches at about 60,000 small rollouts,
so the caller (the collector, `ng_aggregate_rollouts`, an agent passing the request on to its resources server)
splits the verify responses into parts of bounded size, and the server puts them back together: when the last part
arrives it calls its own `aggregate_metrics(AggregateMetricsRequest)` once, with every verify response in the order
sent. An override written for v0.5 (`aggregate_metrics`, `compute_metrics`, `get_key_metrics`) therefore sees
exactly what v0.5 gives it: it can rely on the whole list, never on a chunk.

Wire format: a part is `{"verify_responses": [...], "ng_aggregation_part": {"upload": <id>, "index": i, "last":
bool}}`; a part that is not the last is answered `{"ng_aggregation_part": {"upload", "received_parts",
"received_rows"}}`, the last with the metrics. Verify responses that fit in one part go as one plain v0.5 body, which
every server answers, ours and older ones. A server that answers a first part with metrics instead of the
acknowledgement does not know parts (a custom route): that is an error naming it, never metrics over a part.

The parts of one upload must reach one process: the caller sends them one after another on the session cookie the
first answer set (which pins a replica, decision 22). A part for an upload this process does not hold (another
uvicorn worker got the first ones, the server restarted, or the upload sat idle past `UPLOAD_IDLE_S`) is a 409
that says so. The server holds one upload's verify responses until its last part: memory in proportion to the
rollouts, as v0.5's single request, but never one body over the limit.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from dataclasses import dataclass, field
from typing import Any, Optional, Sequence, Union

import orjson
from fastapi import HTTPException
from pydantic import BaseModel
from starlette.responses import Response

from nemo_gym.config.types import AggregateMetrics, AggregateMetricsRequest

__all__ = [
    "PART_KEY",
    "DEFAULT_PART_BYTES",
    "UPLOAD_IDLE_S",
    "AggregationFailed",
    "AggregationPart",
    "AggregateMetricsPartRequest",
    "AggregationUploads",
    "aggregate_metrics_route",
    "part_budget",
    "post_aggregate_metrics",
]

PART_KEY = "ng_aggregation_part"
# At most this much JSON per part (or half the server's limit, if lower): small enough to be parsed quickly, large
# enough that 250,000 rollouts take a few dozen requests.
DEFAULT_PART_BYTES = 8 * 1024 * 1024
# An upload whose next part has not come for this long is dropped (its caller died half-way).
UPLOAD_IDLE_S = 600.0
_ENVELOPE_BYTES = 256  # `{"verify_responses":[...],"ng_aggregation_part":{...}}` around the rows


class AggregationFailed(Exception):
    """A server gave no metrics; the message says which and why, in one line."""


# --------------------------------------------------------------------------------------------------------
# The server side


class AggregationPart(BaseModel):
    upload: str
    index: int
    last: bool


class AggregateMetricsPartRequest(AggregateMetricsRequest):
    """The route's body: a v0.5 `AggregateMetricsRequest`, or one part of one (`ng_aggregation_part`)."""

    ng_aggregation_part: Optional[AggregationPart] = None


@dataclass
class _Upload:
    rows: list[dict] = field(default_factory=list)
    parts: int = 0
    touched: float = field(default_factory=time.monotonic)


class AggregationUploads:
    """The uploads one server process is receiving, keyed by upload id."""

    def __init__(self, idle_s: float = UPLOAD_IDLE_S):
        self.idle_s = idle_s
        self._uploads: dict[str, _Upload] = {}

    def __len__(self) -> int:
        return len(self._uploads)

    def add(self, part: AggregationPart, rows: list[dict]) -> Optional[list[dict]]:
        """Take one part: every verify response of the upload when it was the last, else None. A part out of
        order, or for an upload this process does not hold, raises `LookupError` saying which."""
        now = time.monotonic()
        for upload_id in [u for u, up in self._uploads.items() if now - up.touched > self.idle_s]:
            del self._uploads[upload_id]
        upload = self._uploads.get(part.upload)
        if upload is None and part.index == 0:
            upload = self._uploads[part.upload] = _Upload()
        received = upload.parts if upload is not None else 0
        if upload is None or part.index != received:
            raise LookupError(
                f"/aggregate_metrics part {part.index} of upload {part.upload} arrived, but this process holds "
                f"{received} part(s) of it: parts must come in order to one process (another worker or replica got "
                f"the others, the server restarted, or the upload sat idle over {self.idle_s:.0f} s); send them all again"
            )
        upload.rows.extend(rows)
        upload.parts += 1
        upload.touched = now
        if not part.last:
            return None
        del self._uploads[part.upload]
        return upload.rows

    def received(self, upload_id: str) -> tuple[int, int]:
        upload = self._uploads.get(upload_id)
        return (upload.parts, len(upload.rows)) if upload is not None else (0, 0)


def _encode_answer(answer: Any) -> bytes:
    if type(answer) is AggregateMetrics:  # its fields are plain JSON values already: no model_dump walk
        answer = {"group_level_metrics": answer.group_level_metrics, "agent_metrics": answer.agent_metrics,
                  "key_metrics": answer.key_metrics}  # fmt: skip
    elif isinstance(answer, BaseModel):
        answer = answer.model_dump(mode="json")
    return orjson.dumps(answer, option=orjson.OPT_SERIALIZE_NUMPY)


async def _json_answer(answer: Any) -> Any:
    """The handler's answer as JSON bytes: orjson (FastAPI's encoder takes seconds over 250,000 rollouts' rows), in a
    worker thread when large, so the server still answers `/health` meanwhile."""
    if isinstance(answer, Response):
        return answer
    if isinstance(answer, AggregateMetrics) and len(answer.group_level_metrics) > 1000:
        body = await asyncio.to_thread(_encode_answer, answer)
    else:
        body = _encode_answer(answer)
    return Response(body, media_type="application/json")


def aggregate_metrics_route(server: Any) -> Any:
    """The `POST /aggregate_metrics` handler of `server`: a plain body goes to `server.aggregate_metrics` as is;
    parts are gathered and the whole goes to it when the last arrives."""
    uploads = AggregationUploads()

    async def aggregate_metrics(body: AggregateMetricsPartRequest) -> AggregateMetrics:
        part = body.ng_aggregation_part
        rows = body.verify_responses
        if part is not None:
            try:
                rows = uploads.add(part, rows)
            except LookupError as exc:
                raise HTTPException(status_code=409, detail=str(exc)) from None
            if rows is None:
                parts, count = uploads.received(part.upload)
                return await _json_answer({PART_KEY: {"upload": part.upload, "received_parts": parts, "received_rows": count}})
        request = AggregateMetricsRequest.model_construct(verify_responses=rows)
        return await _json_answer(await server.aggregate_metrics(request))

    aggregate_metrics.__doc__ = "NeMo Gym v0.5's `/aggregate_metrics`, whole or in parts (`nemo_gym.rollouts.aggregation_parts`)."
    return aggregate_metrics


# --------------------------------------------------------------------------------------------------------
# The caller side

Row = Union[bytes, dict]


def part_budget(server_client: Any, server: str) -> tuple[int, Optional[int]]:
    """(bytes of JSON per part, the server's body limit or None): `DEFAULT_PART_BYTES`, or half the limit when that
    is lower. The limit is the server block's `max_request_body_bytes`, else the global one, else 32 MiB."""
    from nemo_gym.config.global_config import get_first_server_config_dict
    from nemo_gym.serving.limits import request_limits

    try:
        global_config = getattr(server_client, "global_config_dict", None)
    except Exception:  # a client without a config (tests): the defaults
        global_config = None
    try:
        block = get_first_server_config_dict(global_config, server) if global_config is not None else None
    except Exception:
        block = None
    limit = request_limits(global_config, block).max_body
    budget = DEFAULT_PART_BYTES if limit is None else max(1024, min(DEFAULT_PART_BYTES, limit // 2))
    return budget, limit


def _encoded(row: Row) -> bytes:
    return row if isinstance(row, bytes) else orjson.dumps(row, option=orjson.OPT_SERIALIZE_NUMPY)


def _parts(rows: Sequence[Row], budget: int, limit: Optional[int], server: str) -> Any:
    """Lists of encoded rows, each list at most `budget` bytes of JSON (a row larger than that alone, if it fits
    under `limit`)."""
    part: list[bytes] = []
    size = 0
    for position, row in enumerate(rows):
        data = _encoded(row)
        if limit is not None and len(data) + _ENVELOPE_BYTES > limit:
            raise AggregationFailed(
                f"verify response {position} is {len(data)} bytes of JSON after stripping, over `{server}`'s "
                f"max_request_body_bytes ({limit}); raise that limit in its config block"
            )
        if part and size + len(data) + 1 > budget:
            yield part
            part, size = [], 0
        part.append(data)
        size += len(data) + 1
    yield part


def _body(rows: list[bytes], part: Optional[dict]) -> bytes:
    out = b'{"verify_responses":[' + b",".join(rows) + b"]"
    if part is not None:
        out += b',"' + PART_KEY.encode() + b'":' + orjson.dumps(part)
    return out + b"}"


async def _post(server_client: Any, server: str, body: bytes, cookies: Any) -> Any:
    """POST one body; the answer's JSON, or `AggregationFailed` with the status and the start of its body."""
    from nemo_gym.http.client import get_response_json

    try:
        response = await server_client.post(
            server, "/aggregate_metrics", content=body, headers={"content-type": "application/json"}, cookies=cookies
        )
        status = getattr(response, "status", None) or getattr(response, "status_code", 0)
        if status >= 400:
            raw = await response.read() if hasattr(response, "read") else response.content
            text = raw.decode("utf-8", errors="replace") if isinstance(raw, bytes) else str(raw)
            raise AggregationFailed(f"HTTP {status}: {' '.join(text.split())[:500]}")
        return response, await get_response_json(response)
    except AggregationFailed:
        raise
    except Exception as exc:
        raise AggregationFailed(f"{type(exc).__name__}: {' '.join(str(exc).split())[:500]}") from None


async def post_aggregate_metrics(
    server_client: Any, server: str, rows: Sequence[Row], *, part_bytes: Optional[int] = None
) -> dict:
    """`server`'s `/aggregate_metrics` answer over `rows` (verify responses, as dicts or as their JSON bytes), sent
    in one plain request when they fit in one part, else in parts. Any failure is `AggregationFailed`."""
    budget, limit = part_budget(server_client, server)
    if part_bytes is not None:
        budget = part_bytes
    parts = _parts(rows, budget, limit, server)
    current, upcoming = next(parts), next(parts, None)
    if upcoming is None:
        _, answer = await _post(server_client, server, _body(current, None), None)
        return _metrics(answer, server)
    upload = uuid.uuid4().hex
    index, cookies, sent = 0, None, 0
    while True:
        last = upcoming is None
        body = _body(current, {"upload": upload, "index": index, "last": last})
        response, answer = await _post(server_client, server, body, cookies)
        if last:
            return _metrics(answer, server)
        sent += len(current)
        ack = answer.get(PART_KEY) if isinstance(answer, dict) else None
        if not isinstance(ack, dict) or ack.get("received_rows") != sent:
            raise AggregationFailed(
                f"it does not take /aggregate_metrics in parts (its answer to part {index} was not an "
                f"acknowledgement of {sent} rows: {str(answer)[:200]}), and the verify responses are more than one "
                f"request of {budget} bytes; serve it with nemo_gym's base classes, or aggregate fewer rollouts"
            )
        cookies = cookies or getattr(response, "cookies", None)
        current, upcoming, index = upcoming, next(parts, None), index + 1


def _metrics(answer: Any, server: str) -> dict:
    if not isinstance(answer, dict):
        raise AggregationFailed(f"its answer is a {type(answer).__name__}, not the JSON object of AggregateMetrics")
    return answer
