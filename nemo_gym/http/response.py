"""What comes back from another server, and what is sent to it: `ServerResponse` (a fully read response with NeMo
Gym v0.2's aiohttp contract), `NeMoGymHTTPError` and the helpers `raise_for_status` / `get_response_json`; the
encoding of request bodies (JSON) and cookies; and reading a response body under the cap on response sizes
(`http_client_max_response_body_bytes`, `ResponseTooLargeError`).

Importable from `nemo_gym.http.client` as before (see its module docstring for the contract).
"""

from __future__ import annotations

import functools
import http.cookiejar
import inspect
from http.cookies import SimpleCookie
from typing import Any, Mapping, Optional, Union

import aiohttp
import httpx
import orjson
from yarl import URL

__all__ = [
    "ServerResponse",
    "NeMoGymHTTPError",
    "ResponseTooLargeError",
    "raise_for_status",
    "get_response_json",
    "encode_json_body",
    "encode_cookie_header",
    "CookiesLike",
    "MAX_RESPONSE_BODY_KEY",
    "DEFAULT_MAX_RESPONSE_BODY_BYTES",
    "max_response_body_bytes",
    "read_aiohttp_body",
    "read_httpx_body",
]

_JSON_HEADERS = {"Content-Type": "application/json"}

# --------------------------------------------------------------------------------------------------------
# The response, errors and response helpers


def _request_info(url: Any, method: str) -> Any:
    """An `aiohttp.RequestInfo` for errors (v0.2 code reads `e.request_info`)."""
    import aiohttp
    from multidict import CIMultiDict, CIMultiDictProxy
    from yarl import URL

    url = url if isinstance(url, URL) else URL(str(url or ""))
    return aiohttp.RequestInfo(url, method or "", CIMultiDictProxy(CIMultiDict()), url)


class NeMoGymHTTPError(httpx.HTTPStatusError, aiohttp.ClientResponseError):
    """An HTTP error status from another server.

    `response_content` is the response body as text (the exception middleware relays it), `status` /
    `status_code` the status, `server_name` the server id (when known), `attempts` how many tries were made,
    `response` the response it was raised for. Subclasses `httpx.HTTPStatusError` and
    `aiohttp.ClientResponseError` (so `except ClientResponseError as e: e.status` works as in v0.2).
    """

    def __init__(
        self,
        message: str,
        *,
        response: Any = None,
        response_content: str = "",
        server_name: Optional[str] = None,
        attempts: Optional[int] = None,
        status: Optional[int] = None,
        method: str = "",
        url: Any = None,
    ) -> None:
        Exception.__init__(self, message)
        self.response = response  # type: ignore[assignment]
        self._request = _request_of(response) if isinstance(response, httpx.Response) else None
        self.response_content = response_content
        self.server_name = server_name
        self.attempts = attempts
        if status is None:
            status = _status_of(response) if response is not None else 0
        self.status = status
        self.status_code = status
        self.message = message
        self.headers = getattr(response, "headers", None)
        self.history = ()
        self._method = method
        self._url = url
        self.args = (message,)

    @property
    def request(self) -> Any:  # httpx's attribute; None when the response did not come from httpx
        return self._request

    @request.setter
    def request(self, value: Any) -> None:
        self._request = value

    @property
    def request_info(self) -> Any:  # aiohttp's attribute, built on first use
        return _request_info(self._url, self._method)

    @request_info.setter
    def request_info(self, value: Any) -> None:
        pass

    def __str__(self) -> str:
        return self.message

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.message!r})"

    def __reduce__(self) -> Any:
        # The response and its header proxies cannot be pickled; what a caller reads of the error can, so it crosses
        # a process boundary (a trainer's Ray actor) with its status and body.
        url = None if self._url is None else str(self._url)
        rebuild = functools.partial(
            type(self), self.message, response_content=self.response_content, server_name=self.server_name,
            attempts=self.attempts, status=self.status, method=self._method, url=url,
        )  # fmt: skip
        return rebuild, ()


class ServerResponse:
    """A fully read response from `ServerClient`, with NeMo Gym v0.2's (aiohttp's) contract.

    aiohttp-style: `status`, `reason`, `ok`, `headers` (a case-insensitive `multidict`), `cookies` (a
    `SimpleCookie` of this response's `Set-Cookie`s), `url`, `method`, `content_type`, `charset`,
    `await read()`, `await text()`, `await json()`, `raise_for_status()`, `release()`, `close()`,
    `async with`. Plus, without awaiting: `status_code`, `reason_phrase` and `content`/`body` (the bytes),
    and `server_name` / `attempts` (which server answered, after how many tries). The body is already in
    memory, so nothing here does I/O and releasing is a no-op.
    """

    __slots__ = ("status", "reason", "headers", "_body", "url", "method", "server_name", "attempts", "_cookies")

    def __init__(
        self,
        status: int,
        reason: Optional[str],
        headers: Any,
        body: bytes,
        url: Any = None,
        method: str = "",
        server_name: Optional[str] = None,
        attempts: int = 1,
    ) -> None:
        self.status = status
        self.reason = reason
        self.headers = headers
        self._body = body
        self.url = url
        self.method = method
        self.server_name = server_name
        self.attempts = attempts
        self._cookies: Optional[SimpleCookie] = None

    @classmethod
    def from_httpx(
        cls, response: httpx.Response, url: Any = None, method: str = "", body: Optional[bytes] = None
    ) -> "ServerResponse":
        """Wrap an `httpx.Response` (the `httpx` transport, or a transport a test passed in): read, or its `body`
        given (read by `read_httpx_body`)."""
        from multidict import CIMultiDict, CIMultiDictProxy

        headers = CIMultiDictProxy(CIMultiDict(response.headers.multi_items()))
        content = response.content if body is None else body
        return cls(response.status_code, response.reason_phrase, headers, content, url, method)

    # -- without awaiting -----------------------------------------------------------------------------------

    @property
    def status_code(self) -> int:
        return self.status

    @property
    def reason_phrase(self) -> str:
        return self.reason or ""

    @property
    def ok(self) -> bool:
        return self.status < 400

    @property
    def content(self) -> bytes:
        return self._body

    @property
    def body(self) -> bytes:
        return self._body

    @property
    def real_url(self) -> Any:
        return self.url

    @property
    def history(self) -> tuple:
        return ()

    @property
    def content_type(self) -> str:
        value = self.headers.get("content-type") or "application/octet-stream"
        return value.partition(";")[0].strip().lower()

    @property
    def charset(self) -> Optional[str]:
        _, _, params = (self.headers.get("content-type") or "").partition(";")
        for param in params.split(";"):
            key, _, value = param.partition("=")
            if key.strip().lower() == "charset":
                return value.strip().strip('"') or None
        return None

    @property
    def cookies(self) -> SimpleCookie:
        if self._cookies is None:
            jar: SimpleCookie = SimpleCookie()
            for header in self.headers.getall("set-cookie", ()):
                try:
                    jar.load(header)
                except Exception:  # a malformed Set-Cookie is skipped, as aiohttp does
                    continue
            self._cookies = jar
        return self._cookies

    @property
    def request_info(self) -> Any:
        return _request_info(self.url, self.method)

    def get_encoding(self) -> str:
        return self.charset or "utf-8"

    def raise_for_status(self) -> None:
        if self.status >= 400:
            raise _http_error(self, self._body)

    def release(self) -> None:
        pass

    def close(self) -> None:
        pass

    # -- awaited, as in aiohttp -----------------------------------------------------------------------------

    async def read(self) -> bytes:
        return self._body

    async def text(self, encoding: Optional[str] = None, errors: str = "strict") -> str:
        return self._body.decode(encoding or self.get_encoding(), errors)

    async def json(self, *, encoding: Optional[str] = None, loads: Any = None, content_type: Any = None) -> Any:
        """The body parsed as JSON (orjson unless `loads` is given); an empty body is None, as in aiohttp. The
        content type is not checked (`content_type` is accepted for compatibility)."""
        body = self._body
        if not body.strip():
            return None
        if loads is not None:
            return loads(body.decode(encoding or self.get_encoding()))
        return orjson.loads(body)

    async def __aenter__(self) -> "ServerResponse":
        return self

    async def __aexit__(self, *exc_info: Any) -> None:
        pass

    def __repr__(self) -> str:
        return f"<ServerResponse({self.url}) [{self.status} {self.reason or ''}]>"


def _request_of(response: httpx.Response) -> Optional[httpx.Request]:
    """The request an httpx response answers, or None for a response built by hand (httpx raises then)."""
    try:
        return response.request
    except RuntimeError:
        return None


def _status_of(response: Any) -> int:
    status = getattr(response, "status", None)
    if not isinstance(status, int):
        status = getattr(response, "status_code", 0)
    return int(status)


async def _read_body(response: Any) -> bytes:
    """The body of a ServerResponse, an `aiohttp.ClientResponse`, an `httpx.Response` or any response with
    `.content` bytes (e.g. an `httpx2.Response` from starlette's TestClient)."""
    if isinstance(response, ServerResponse):
        return response._body
    if isinstance(response, httpx.Response):
        try:
            return response.content
        except httpx.ResponseNotRead:
            return await response.aread()
    if not isinstance(response, aiohttp.ClientResponse):
        content = getattr(response, "content", None)
        if isinstance(content, (bytes, bytearray)):
            return bytes(content)
    body = response.read()  # aiohttp.ClientResponse (reads once, then serves the cached body)
    return await body if inspect.isawaitable(body) else body


def _attr(obj: Any, name: str, kind: Any, default: Any = None) -> Any:
    """`obj.name` when it is of `kind`, else `default` (test doubles answer every attribute with a mock)."""
    value = getattr(obj, name, None)
    return value if isinstance(value, kind) else default


def _http_error(response: Any, body: bytes) -> NeMoGymHTTPError:
    text = body.decode("utf-8", errors="replace") if isinstance(body, (bytes, bytearray)) else str(body)
    status = _status_of(response)
    server_name = _attr(response, "server_name", str)
    attempts = _attr(response, "attempts", int)
    if isinstance(response, httpx.Response):
        request = _request_of(response)  # None for hand-built responses
        method, url = (request.method, request.url) if request is not None else ("", None)
        reason = response.reason_phrase
    else:
        method, url = _attr(response, "method", str, ""), _attr(response, "url", (str, URL))
        reason = _attr(response, "reason", str, "")
    where = f"{method} {url}" if method and url is not None else "request"
    if server_name:
        where += f" (server `{server_name}`)"
    tries = f" after {attempts} attempts" if attempts and attempts > 1 else ""
    preview = text if len(text) <= 2000 else text[:2000] + "...[truncated]"
    message = f"{where} failed with HTTP {status} {reason}{tries}: {preview}"
    return NeMoGymHTTPError(
        message,
        response=response,
        response_content=text,
        server_name=server_name,
        attempts=attempts,
        status=status,
        method=method,
        url=url,
    )


async def raise_for_status(response: Any) -> None:
    """Raise `NeMoGymHTTPError` (body text attached as `response_content`) unless `response.ok` (else: the status
    is below 400); the body is read first. Takes a
    `ServerResponse`, an `aiohttp.ClientResponse` or an `httpx.Response`."""
    ok = getattr(response, "ok", None)  # v0.5 reads `.ok` (aiohttp's and ours); httpx has none
    if not isinstance(ok, bool):
        ok = _status_of(response) < 400
    if ok:
        return
    raise _http_error(response, await _read_body(response))


async def get_response_json(response: Any) -> Any:
    """Parse the body as JSON with orjson (`ServerResponse`, `aiohttp.ClientResponse` or `httpx.Response`)."""
    return orjson.loads(await _read_body(response))



# --------------------------------------------------------------------------------------------------------
# The cap on response bodies

# The global config key that bounds the body of one response read from another server or a backend.
MAX_RESPONSE_BODY_KEY = "http_client_max_response_body_bytes"
# 256 MiB. A rollout's largest legitimate answers are a few MB (a long-context model response with token ids and
# log probabilities, a `/run` with a many-turn transcript); a very long agentic episode that returns every
# turn's prompt token ids reaches tens of MB. 256 MiB leaves an order of magnitude above that, yet stops a
# broken or hostile peer (a runaway generation, a server streaming a file) from taking a process's memory: one
# such body, not thousands, is what a cap can stop.
DEFAULT_MAX_RESPONSE_BODY_BYTES = 256 * 1024 * 1024


def max_response_body_bytes(cfg: Any) -> int:
    """The cap on response bodies from `cfg` (`http_client_max_response_body_bytes`; absent or null: the default,
    256 MiB). Anything but a positive integer is a `NeMoGymConfigError` (a `ValueError`) naming the key."""
    from nemo_gym.config.values import byte_count

    return byte_count(cfg, MAX_RESPONSE_BODY_KEY, DEFAULT_MAX_RESPONSE_BODY_BYTES,
                      limits="the largest response body the HTTP client reads from another server")


def _size_text(n: int) -> str:
    return f"{n} bytes ({n / 1048576:.1f} MiB)" if n >= 1048576 else f"{n} bytes"


class ResponseTooLargeError(httpx.TransportError):
    """A response body over the cap (`http_client_max_response_body_bytes`): reading stopped there and the
    connection was closed. Not retried (a second answer would be as large). `size`: the bytes the peer declared
    (`Content-Length`, `declared` True) or read so far (a lower bound); `limit` the cap; `url`, `server_name`
    (None when not known where it was raised) and `attempts` as on the client's other final errors."""

    def __init__(
        self,
        message: Optional[str] = None,
        *,
        size: int = 0,
        limit: int = 0,
        declared: bool = False,
        url: Any = None,
        method: str = "",
        server_name: Optional[str] = None,
        attempts: int = 1,
    ) -> None:
        self.size, self.limit, self.declared = size, limit, declared
        self.url = None if url is None else str(url)
        self.method, self.server_name, self.attempts = method, server_name, attempts
        super().__init__(message or self._message())

    def _message(self) -> str:
        where = f"{self.method} {self.url}" if self.method and self.url else (self.url or "A request")
        if self.server_name:
            where += f" (server `{self.server_name}`)"
        seen = (
            f"it declared Content-Length {_size_text(self.size)}"
            if self.declared
            else f"at least {_size_text(self.size)} arrived before reading stopped"
        )
        return (
            f"{where}: the response body is over the {_size_text(self.limit)} cap on response bodies ({seen}); the "
            f"connection was closed. If answers this large are expected, raise the global config key "
            f"`{MAX_RESPONSE_BODY_KEY}` (e.g. `+{MAX_RESPONSE_BODY_KEY}={self.limit * 4}`)."
        )

    def named(self, *, method: str, url: Any, server_name: Optional[str], attempts: int) -> "ResponseTooLargeError":
        """The same error, its message naming the request and server (`ServerClient` knows them, a transport not)."""
        return ResponseTooLargeError(
            size=self.size, limit=self.limit, declared=self.declared, url=url, method=method,
            server_name=server_name, attempts=attempts,
        )


def _declared_length(value: Optional[str], method: str = "", status: int = 200) -> Optional[int]:
    """The body size a `Content-Length` declares; None without one, or when no body follows whatever it says (an
    answer to HEAD, a 204 or a 304)."""
    if value is None or method == "HEAD" or status in (204, 304):
        return None
    try:
        return int(value)
    except ValueError:
        return None


async def read_aiohttp_body(resp: aiohttp.ClientResponse, limit: int, method: str = "") -> bytes:
    """The whole body of an aiohttp response, reading no further than `limit` bytes (aiohttp's public API only):
    a declared `Content-Length` over it fails before anything is read; otherwise the bytes are counted as they
    arrive. Over the cap: `ResponseTooLargeError`, the connection closed. The caller releases `resp`."""
    length = resp.content_length if method != "HEAD" and resp.status not in (204, 304) else None
    if length is not None and length > limit:
        resp.close()
        raise ResponseTooLargeError(size=length, limit=limit, declared=True, url=resp.url, method=method)
    if length is not None and "Content-Encoding" not in resp.headers:
        return await resp.read()  # at most Content-Length bytes: aiohttp's parser stops there
    # No length, or a compressed body aiohttp decompresses: count what is buffered.
    chunks = []
    size = 0
    async for chunk in resp.content.iter_any():
        size += len(chunk)
        if size > limit:
            resp.close()
            raise ResponseTooLargeError(size=size, limit=limit, url=resp.url, method=method)
        chunks.append(chunk)
    return b"".join(chunks)


async def read_httpx_body(response: httpx.Response, limit: int, url: Any = None, method: str = "") -> bytes:
    """The whole (decoded) body of an unread `httpx.Response`, reading no further than `limit` bytes; over the cap:
    `ResponseTooLargeError`. The caller closes `response`."""
    length = _declared_length(response.headers.get("content-length"), method, response.status_code)
    if length is not None and length > limit:
        raise ResponseTooLargeError(size=length, limit=limit, declared=True, url=url, method=method)
    chunks = []
    size = 0
    async for chunk in response.aiter_bytes():
        size += len(chunk)
        if size > limit:
            raise ResponseTooLargeError(size=size, limit=limit, url=url, method=method)
        chunks.append(chunk)
    return b"".join(chunks)


# --------------------------------------------------------------------------------------------------------
# Body and cookie encoding


def _orjson_default(obj: Any) -> Any:
    dump = getattr(obj, "model_dump", None)
    if dump is not None:
        return dump(mode="json", exclude_unset=True)
    try:
        from omegaconf import DictConfig, ListConfig, OmegaConf

        if isinstance(obj, (DictConfig, ListConfig)):
            return OmegaConf.to_container(obj, resolve=True)
    except ImportError:  # pragma: no cover
        pass
    if isinstance(obj, (set, frozenset, tuple)):
        return list(obj)
    raise TypeError(f"Object of type {type(obj).__name__} is not JSON serializable")


_ORJSON_OPTS = orjson.OPT_SERIALIZE_NUMPY | orjson.OPT_NON_STR_KEYS


def encode_json_body(obj: Any) -> bytes:
    """Bytes of a JSON body: pydantic models with `exclude_unset=True`, everything else with orjson."""
    dump_json = getattr(obj, "model_dump_json", None)
    if dump_json is not None and not isinstance(obj, type):
        return dump_json(exclude_unset=True).encode()
    return orjson.dumps(obj, default=_orjson_default, option=_ORJSON_OPTS)


CookiesLike = Union[Mapping[str, Any], httpx.Cookies, SimpleCookie, None]


def encode_cookie_header(cookies: CookiesLike) -> Optional[str]:
    """One `Cookie` header value from a dict, `httpx.Cookies` or `SimpleCookie` (domains ignored: the
    caller decided to send them)."""
    if not cookies:
        return None
    if isinstance(getattr(cookies, "jar", None), http.cookiejar.CookieJar):  # httpx.Cookies, httpx2.Cookies
        pairs = [f"{c.name}={c.value}" for c in cookies.jar]
    elif isinstance(cookies, SimpleCookie):
        pairs = [f"{name}={morsel.coded_value}" for name, morsel in cookies.items()]
    else:
        pairs = []
        for name, value in cookies.items():
            coded = getattr(value, "coded_value", None)  # a Morsel
            pairs.append(f"{name}={coded if coded is not None else value}")
    return "; ".join(pairs) if pairs else None


