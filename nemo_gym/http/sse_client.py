"""The client side of streaming: POST to an OpenAI-compatible backend and read its server-sent events as they arrive.

Why here: it is an HTTP call like `NeMoGymAsyncOpenAI`'s, over the process's shared transport and retry policy, with
the same errors (`NeMoGymOpenAIError` for an error status, httpx's transport errors for a broken connection). The
streaming pass-through of model servers (`serving/stream_adapter.py`) is its user.
"""

from __future__ import annotations

from typing import Any, AsyncIterator, Optional

import aiohttp
import httpx
import orjson

from nemo_gym.api.streaming import BackendDoesNotStream, SSEDecoder

__all__ = ["upstream_sse"]

async def upstream_sse(
    url: str,
    body: dict,
    *,
    api_key: Optional[str] = None,
    retry_policy: Any = None,
    global_config: Any = None,
    connect_timeout: float = 60.0,
) -> AsyncIterator[tuple]:
    """POST `body` to `url` (an OpenAI-compatible streaming endpoint) and yield its server-sent events as
    `(event name, payload)` (payload parsed JSON, or `DONE`), as they arrive, over the process's shared HTTP
    transport. A 429/5xx or a failed connection is retried by `retry_policy` before the stream starts; an error
    status raises `NeMoGymOpenAIError` (as a non-streamed call would). Closing the generator (or cancelling
    its consumer) closes the connection, which tells the backend to stop."""
    from nemo_gym.http.client import AiohttpTransport, get_global_transport
    from nemo_gym.http.openai_client import NeMoGymOpenAIError
    from nemo_gym.http.response import ResponseTooLargeError, max_response_body_bytes
    from nemo_gym.http.retry import RetryPolicy

    max_body = max_response_body_bytes(global_config)

    content = orjson.dumps(body)
    headers = {"Content-Type": "application/json", "Accept": "text/event-stream"}
    if api_key:
        headers["Authorization"] = f"Bearer {api_key}"
    policy = retry_policy or RetryPolicy(max_attempts=1)
    transport = await get_global_transport(global_config)
    label = f"POST {url} (stream)"

    if isinstance(transport, AiohttpTransport):
        timeout = aiohttp.ClientTimeout(total=None, sock_connect=connect_timeout)

        async def open_aiohttp() -> _Opened:
            resp = await transport.session.request("POST", url, data=content, headers=headers,
                                                   allow_redirects=False, timeout=timeout)
            opened = _Opened(resp.status, resp.headers, resp)
            if resp.status >= 400:
                try:
                    opened.error_body = await _read_at_most(resp.content.iter_any(), max_body)
                finally:
                    resp.close()
            return opened

        outcome = await policy.run(open_aiohttp, idempotent=True, label=label)
    else:
        client = httpx.AsyncClient(transport=transport, timeout=httpx.Timeout(None, connect=connect_timeout))

        async def open_httpx() -> _Opened:
            resp = await client.send(client.build_request("POST", url, content=content, headers=headers), stream=True)
            opened = _Opened(resp.status_code, resp.headers, resp)
            if resp.status_code >= 400:
                try:
                    opened.error_body = await _read_at_most(resp.aiter_bytes(), max_body)
                finally:
                    await resp.aclose()
            return opened

        outcome = await policy.run(open_httpx, idempotent=True, label=label)
    if outcome.error is not None:
        from nemo_gym.http.client import _remap_aiohttp_error

        remapped = _remap_aiohttp_error(outcome.error, httpx.Request("POST", url))
        if remapped is not None:
            raise remapped from outcome.error
        raise outcome.error
    opened = outcome.result
    if opened.status_code >= 400:
        request = httpx.Request("POST", url, headers=headers, content=content)
        response = httpx.Response(opened.status_code, content=opened.error_body, request=request)
        raise NeMoGymOpenAIError(request=request, response=response, attempts=outcome.attempts)
    resp = opened.response
    kind = opened.headers.get("content-type", "")
    if not kind.startswith("text/event-stream"):
        if isinstance(resp, aiohttp.ClientResponse):
            resp.close()
        else:
            await resp.aclose()
        raise BackendDoesNotStream(f"POST {url} was asked to stream but answered {kind or 'no content type'}, not server-sent "
                           f"events: the backend does not stream")
    chunks = resp.content.iter_any() if isinstance(resp, aiohttp.ClientResponse) else resp.aiter_bytes()
    decoder = SSEDecoder()
    pending = bytearray()  # the line being received
    event_size = 0  # bytes of the event being received, its complete lines so far
    finished = False
    try:
        try:
            async for chunk in chunks:
                pending += chunk
                end = pending.rfind(b"\n")
                if end >= 0:
                    lines = bytes(pending[:end]).split(b"\n")
                    del pending[: end + 1]
                    for line in lines:
                        event = decoder.line(line.rstrip(b"\r").decode("utf-8"))
                        event_size = 0 if not line.strip() else event_size + len(line) + 1
                        if event is not None:
                            yield event
                # One event may not hold more than a whole response may (a stream of events may go on).
                if event_size + len(pending) > max_body:
                    raise ResponseTooLargeError(size=event_size + len(pending), limit=max_body, declared=False,
                                                url=url, method="POST")
        except (aiohttp.ClientError, httpx.TransportError) as exc:
            if isinstance(exc, ResponseTooLargeError):
                raise
            raise httpx.ReadError(f"POST {url}: the backend's stream broke off: {type(exc).__name__}: {exc}") from exc
        for line in (bytes(pending), b""):
            event = decoder.line(line.rstrip(b"\r").decode("utf-8"))
            if event is not None:
                yield event
        finished = True
    finally:
        if isinstance(resp, aiohttp.ClientResponse):
            resp.release() if finished else resp.close()
        else:
            await resp.aclose()


async def _read_at_most(chunks: AsyncIterator[bytes], limit: int) -> bytes:
    """The first `limit` bytes of a body (an error answer is read for its message, never whole; a transport that
    caps bodies itself may stop it sooner)."""
    from nemo_gym.http.response import ResponseTooLargeError

    body = bytearray()
    try:
        async for chunk in chunks:
            body += chunk[: limit - len(body)]
            if len(body) >= limit:
                break
    except ResponseTooLargeError:
        pass
    return bytes(body)


class _Opened:
    """A backend's answer whose body is not read yet (`status_code` and `headers` for the retry policy)."""

    __slots__ = ("status_code", "headers", "response", "error_body")

    def __init__(self, status_code: int, headers: Any, response: Any) -> None:
        self.status_code = status_code
        self.headers = headers
        self.response = response
        self.error_body = b""
