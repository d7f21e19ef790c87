"""`NeMoGymAsyncOpenAI`: a small async client for OpenAI-compatible backends (OpenAI, vLLM, SGLang, ...).

Model servers use it to call their upstream. It returns parsed JSON dicts, shares the process-wide transport of
`nemo_gym.http.client`, and retries by `nemo_gym.http.retry` (model calls are idempotent: sampling again is
harmless, so a 500 or a dropped connection is retried too).
"""

import asyncio
from types import MappingProxyType
from typing import Any, Mapping, Optional, Union

import httpx
import orjson
from pydantic import BaseModel
from yarl import URL

from nemo_gym.http.retry import RETRY_STATUSES, RetryingClient, RetryPolicy

__all__ = ["RETRY_STATUSES", "NeMoGymOpenAIError", "NeMoGymAsyncOpenAI"]

_ERROR_BODY_PREVIEW = 2000


class NeMoGymOpenAIError(httpx.HTTPStatusError):
    """An OpenAI-compatible backend answered with an error status (after retries, when the status is retryable).

    ``status`` / ``status_code`` is the HTTP status, ``body`` the response text, ``response_content`` the raw
    bytes, ``attempts`` how many requests were made.
    """

    def __init__(self, *, request: httpx.Request, response: httpx.Response, attempts: int):
        self.status = self.status_code = response.status_code
        self.response_content = response.content
        self.body = response.text
        self.method = request.method
        self.url = str(request.url)
        self.attempts = attempts
        preview = self.body if len(self.body) <= _ERROR_BODY_PREVIEW else self.body[:_ERROR_BODY_PREVIEW] + "..."
        tries = f" after {attempts} attempts" if attempts > 1 else ""
        message = f"{self.method} {self.url} failed with HTTP {self.status}{tries}: {preview}"
        super().__init__(message, request=request, response=response)


def _json_default(obj: Any) -> Any:
    if isinstance(obj, BaseModel):
        return obj.model_dump(mode="json", exclude_none=True)
    if isinstance(obj, (set, frozenset)):
        return list(obj)
    raise TypeError(f"Object of type {type(obj).__name__} is not JSON serializable")


def _dumps(body: Any) -> bytes:
    return orjson.dumps(body, default=_json_default, option=orjson.OPT_NON_STR_KEYS | orjson.OPT_SERIALIZE_NUMPY)


class _SharedTransport(httpx.AsyncBaseTransport):
    """Borrows the process-wide transport; closing a client that uses it must not close it for everyone."""

    def __init__(self, inner: httpx.AsyncBaseTransport):
        self._inner = inner

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        return await self._inner.handle_async_request(request)

    async def aclose(self) -> None:
        pass


class NeMoGymAsyncOpenAI(RetryingClient):
    """Minimal async client for OpenAI-compatible servers (OpenAI, vLLM, SGLang, ...). Returns parsed JSON dicts.

    Retries responses with a status in ``RETRY_STATUSES`` and connection failures and timeouts (the idempotent
    rules of ``nemo_gym.http.retry``), up to ``max_attempts`` requests in total; a ``Retry-After`` header is
    honoured (capped at ``max_retry_after`` seconds). Then, or at once for any other error status, it raises ``NeMoGymOpenAIError`` with the status and body (transport errors re-raise the last
    httpx exception). One ``httpx.AsyncClient`` is reused per instance and event loop.

    ``internal`` is kept for signature compatibility with the reference (where it meant "retry connection errors
    forever"); here every retry budget is bounded.
    """

    # The extra headers sent with every request (v0.5 reads them off the client).
    default_headers: Mapping[str, str] = MappingProxyType({})

    def __init__(
        self,
        base_url: str,
        api_key: Optional[str] = None,
        internal: bool = False,
        *,
        max_attempts: int = 3,
        backoff_base: float = 0.5,
        backoff_max: float = 8.0,
        max_retry_after: float = 60.0,
        timeout: Union[float, httpx.Timeout, None] = None,
        connect_timeout: float = 60.0,
        default_headers: Optional[Mapping[str, str]] = None,
        limits: Optional[httpx.Limits] = None,
        transport: Optional[httpx.AsyncBaseTransport] = None,
        http_client: Optional[httpx.AsyncClient] = None,
    ):
        self.retry_policy = RetryPolicy(max_attempts, backoff_base, backoff_max, max_retry_after)
        self.base_url = base_url.rstrip("/")
        self.api_key = api_key
        self.internal = internal
        if not isinstance(timeout, httpx.Timeout):
            timeout = httpx.Timeout(timeout, connect=connect_timeout)
        self._timeout = timeout
        # No queueing inside the pool: with max_connections=None every request gets a connection right away.
        self._limits = limits or httpx.Limits(max_connections=None, max_keepalive_connections=1024)
        self._transport = transport
        self._headers = {"Content-Type": "application/json", "Accept": "application/json"}
        if api_key:
            self._headers["Authorization"] = f"Bearer {api_key}"
        if default_headers:
            self._headers.update(default_headers)
        self.default_headers: dict[str, str] = dict(default_headers or {})  # v0.5 exposes what it was given
        self._http: Optional[httpx.AsyncClient] = http_client
        self._owns_http = http_client is None
        self._http_loop: Optional[asyncio.AbstractEventLoop] = None
        self._parsed_urls: dict[str, URL] = {}

    # ---------------------------------------------------------------- endpoints

    async def create_chat_completion(self, **kwargs: Any) -> dict:
        return await self._request("POST", f"{self.base_url}/chat/completions", kwargs)

    async def create_completion(self, **kwargs: Any) -> dict:
        """`POST {base}/completions` (text completions: a `prompt` of text or token ids)."""
        return await self._request("POST", f"{self.base_url}/completions", kwargs)

    async def create_response(self, **kwargs: Any) -> dict:
        return await self._request("POST", f"{self.base_url}/responses", kwargs)

    async def create_models(self) -> dict:
        return await self._request("GET", f"{self.base_url}/models", None)

    async def create_tokenize(self, **kwargs: Any) -> dict:
        root = self.base_url[: -len("/v1")] if self.base_url.endswith("/v1") else self.base_url
        return await self._request("POST", f"{root}/tokenize", kwargs)

    # ---------------------------------------------------------------- plumbing

    def _client(self) -> httpx.AsyncClient:
        if not self._owns_http:
            return self._http  # type: ignore[return-value]
        loop = asyncio.get_running_loop()
        if self._http is None or self._http_loop is not loop or self._http.is_closed:
            # A client's connections belong to the loop that opened them; a new loop gets a new client.
            transport = self._transport
            if transport is None:
                # The process-wide aiohttp-backed transport: far less CPU per call than httpcore's pool.
                from nemo_gym.http.client import _get_state

                transport = _SharedTransport(_get_state().transport)
            self._http = httpx.AsyncClient(
                headers=self._headers, timeout=self._timeout, limits=self._limits, transport=transport
            )
            self._http_loop = loop
        return self._http

    async def _request(self, method: str, url: str, body: Any) -> dict:
        content = _dumps(body) if body is not None else None
        state = self._shared_state()
        if state is not None and state.lean is not None and url.startswith("http://"):
            outcome = await self._send_lean(state.lean, method, url, content)
        elif state is not None and state.session is not None:
            outcome = await self._send_direct(state.session, method, url, content)
        else:
            client = self._client()
            headers = self._headers if not self._owns_http else None
            outcome = await self.retry_policy.run(
                lambda: client.request(method, url, content=content, headers=headers),
                idempotent=True,
                label=f"{method} {url}",
            )
        if outcome.error is not None:
            tries = f"{outcome.attempts} attempt{'s' if outcome.attempts != 1 else ''}"
            outcome.error.add_note(f"{method} {url}: failed after {tries}")
            raise outcome.error
        response = outcome.result
        status = response.status_code
        if status >= 400:
            if not isinstance(response, httpx.Response):
                response = httpx.Response(
                    status, headers=list(response.headers.items()), content=response.content,
                    request=httpx.Request(method, url, headers=self._headers, content=content),
                )
            raise NeMoGymOpenAIError(request=response.request, response=response, attempts=outcome.attempts)
        if not response.content:
            return {}
        try:
            return orjson.loads(response.content)
        except orjson.JSONDecodeError as exc:
            text = response.content.decode("utf-8", errors="replace")
            raise ValueError(
                f"{method} {url} returned HTTP {status} with a body that is not JSON: {text[:_ERROR_BODY_PREVIEW]}"
            ) from exc

    def _shared_state(self) -> Any:
        """The process-wide client state when this client uses the shared transport (the default): calls then go
        through the lean client (plain http) or aiohttp directly, without httpx request and response objects."""
        if not self._owns_http or self._transport is not None:
            return None
        from nemo_gym.http.client import _get_state

        return _get_state()

    def _timeouts(self) -> dict:
        timeout = self._timeout
        return {"connect": timeout.connect, "read": timeout.read, "pool": timeout.pool}

    async def _send_lean(self, lean: Any, method: str, url: str, content: Optional[bytes]) -> Any:
        from nemo_gym.http.client import ServerResponse

        parsed = self._parsed_urls.get(url)
        if parsed is None:
            parsed = URL(url)
            if len(self._parsed_urls) < 64:
                self._parsed_urls[url] = parsed
        host, port, target = parsed.host, parsed.port, parsed.raw_path_qs
        headers, timeouts = self._headers, self._timeouts()

        async def send() -> ServerResponse:
            answer = await lean.request(method, host, port, target, headers, content, timeouts)
            return ServerResponse(answer.status, answer.reason, answer.headers, answer.body, parsed, method)

        return await self.retry_policy.run(send, idempotent=True, label=f"{method} {url}")

    async def _send_direct(self, session: Any, method: str, url: str, content: Optional[bytes]) -> Any:
        from nemo_gym.http.client import ServerResponse, _client_timeout, aiohttp_exchange

        client_timeout = _client_timeout(self._timeouts())
        headers = self._headers

        async def send() -> ServerResponse:
            resp, body = await aiohttp_exchange(session, method, url, data=content, headers=headers, timeout=client_timeout)
            return ServerResponse(resp.status, resp.reason, resp.headers, body, resp.url, method)

        return await self.retry_policy.run(send, idempotent=True, label=f"{method} {url}")

    async def aclose(self) -> None:
        if self._http is not None and self._owns_http:
            await self._http.aclose()
            self._http = None

    async def __aenter__(self) -> "NeMoGymAsyncOpenAI":
        return self

    async def __aexit__(self, *exc_info: Any) -> None:
        await self.aclose()

    def __repr__(self) -> str:
        return f"NeMoGymAsyncOpenAI(base_url={self.base_url!r}, internal={self.internal})"
