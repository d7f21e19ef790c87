"""Signed-cookie sessions as one pure-ASGI middleware.

Every HTTP request that passes `SessionCookieMiddleware` gets `scope["session"]`, a plain dict, so FastAPI
handlers read and write `request.session[...]` exactly as with Starlette's `SessionMiddleware`. The session
always holds `session_id` (a uuid4 hex string) - resources servers key per-rollout state by it.

Wire format. The session lives in the cookie itself: `<payload>.<signature>`, where `payload` is the
session dict as compact JSON in unpadded base64url and `signature` is the unpadded base64url HMAC-SHA256 of
`<cookie name> "|" <payload>` under the secret. Binding the cookie name into the MAC means a cookie minted
for one server cannot be replayed under another server's name even if both used the same secret.

Differences from the reference (NeMo Gym v0.2):

* The reference signs with a key equal to the cookie name (`<ClassName>___<server_id>`), which anybody can
  read off a response, so cookies could be forged. We sign with a **random secret chosen once per launch**
  (`get_session_secret()`), shared with a server's own uvicorn workers through an environment variable that
  the workers remove on start-up.
* A cookie that fails verification (forged, tampered, truncated, signed by a previous launch or by
  another server) is treated as absent: the request gets a fresh session. A stateful server (resources
  servers) can instead ask for `refuse_unknown_cookies`: every path but the seeding ones then answers 409,
  because such a cookie means the rollout's state lived in a process that is gone (the server restarted),
  and continuing on an empty session would grade half a rollout. The caller reruns the rollout from its
  seed.
* The `Set-Cookie` header is sent on **every** HTTP response (the reference needs an extra middleware that
  rewrites `session_id` on each request to get the same effect), so callers that thread cookies by hand
  (`cookies=response.cookies`) always keep the session.

* Replicas (docs/design.md, decision 22): a server started as several processes (`num_replicas`) tells its
  middleware its replica index (`replica=`, from `NEMO_GYM_REPLICA`); the index is written into every session
  it mints or re-signs under `REPLICA_KEY` (`_replica`), so `ServerClient` can read the (signed but plain
  base64url JSON) payload and send the rest of the rollout to the replica that holds its state
  (`replica_of_cookie`). A server with one replica writes no such key.

Cost per request: parse one header, one HMAC over ~100 bytes and one orjson decode on the way in; one orjson
encode on the way out. When the handler did not change the session, the incoming cookie value is re-sent
as is (no second HMAC).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import os
import secrets
import threading
from typing import Any, Optional

import orjson

__all__ = [
    "SESSION_ID_KEY",
    "SESSION_SECRET_ENV_VAR_NAME",
    "DEFAULT_SESSION_MAX_AGE",
    "SessionCookieMiddleware",
    "get_session_secret",
    "set_session_secret",
    "export_session_secret_to_env",
    "encode_session_cookie",
    "decode_session_cookie",
    "REPLICA_KEY",
    "REPLICA_ENV_VAR_NAME",
    "replica_of_cookie",
]

SESSION_ID_KEY = "session_id"
# The serving replica's index in a session payload, and the env var `ng_run` sets in each replica's process
# (only for servers with `num_replicas` > 1).
REPLICA_KEY = "_replica"
REPLICA_ENV_VAR_NAME = "NEMO_GYM_REPLICA"
# Used only to hand one launch's secret from a server's main process to its own uvicorn workers.
SESSION_SECRET_ENV_VAR_NAME = "NEMO_GYM_SESSION_SECRET"
# Same lifetime as Starlette's SessionMiddleware default (14 days); a relaunch invalidates cookies anyway.
DEFAULT_SESSION_MAX_AGE = 14 * 24 * 60 * 60

_secret: Optional[bytes] = None
_secret_lock = threading.Lock()


def get_session_secret() -> bytes:
    """This launch's signing secret: taken (and removed) from `NEMO_GYM_SESSION_SECRET` when a parent process
    handed one down, else 32 random bytes chosen on first use."""
    global _secret
    if _secret is None:
        with _secret_lock:
            if _secret is None:
                handed_down = os.environ.pop(SESSION_SECRET_ENV_VAR_NAME, None)
                secret = None
                if handed_down:
                    try:
                        secret = bytes.fromhex(handed_down)
                    except ValueError:
                        secret = None
                _secret = secret if secret else secrets.token_bytes(32)
    return _secret


def set_session_secret(secret: Optional[bytes]) -> None:
    """Replace this process's secret (`None`: pick a new random one on next use). For tests and embedding."""
    global _secret
    with _secret_lock:
        _secret = secret


def export_session_secret_to_env() -> None:
    """Put this launch's secret into the environment so uvicorn workers spawned next share it (each worker
    must accept cookies minted by its siblings). Workers drop it from their environment on first use."""
    os.environ[SESSION_SECRET_ENV_VAR_NAME] = get_session_secret().hex()


def new_session_id() -> str:
    """A random version-4 UUID as 32 hex digits (what `uuid4().hex` gives, without building a `UUID`)."""
    data = bytearray(os.urandom(16))
    data[6] = (data[6] & 0x0F) | 0x40
    data[8] = (data[8] & 0x3F) | 0x80
    return data.hex()


def _b64encode(data: bytes) -> bytes:
    return base64.urlsafe_b64encode(data).rstrip(b"=")


def _b64decode(data: bytes) -> bytes:
    return base64.urlsafe_b64decode(data + b"=" * (-len(data) % 4))


class _HmacSha256:
    """HMAC-SHA256 (RFC 2104) with the key schedule done once: the inner and outer hash states after the
    padded key are kept and copied per message. Same output as `hmac.digest(key, msg, "sha256")` at about a
    third of its cost, which matters because every request verifies one cookie."""

    __slots__ = ("_inner", "_outer")

    def __init__(self, key: bytes) -> None:
        if len(key) > 64:  # the SHA-256 block size
            key = hashlib.sha256(key).digest()
        key = key.ljust(64, b"\0")
        self._inner = hashlib.sha256(bytes(b ^ 0x36 for b in key))
        self._outer = hashlib.sha256(bytes(b ^ 0x5C for b in key))

    def digest(self, message: bytes) -> bytes:
        inner = self._inner.copy()
        inner.update(message)
        outer = self._outer.copy()
        outer.update(inner.digest())
        return outer.digest()


_macs: dict[bytes, _HmacSha256] = {}


def _mac(secret: bytes) -> _HmacSha256:
    mac = _macs.get(secret)
    if mac is None:
        if len(_macs) > 64:  # only tests use many secrets
            _macs.clear()
        mac = _macs[secret] = _HmacSha256(secret)
    return mac


def _sign(secret: bytes, name: bytes, payload: bytes) -> bytes:
    return _b64encode(_mac(secret).digest(name + b"|" + payload))


def encode_session_cookie(session: dict, cookie_name: str, secret: Optional[bytes] = None) -> str:
    """The signed cookie value for `session` (JSON-serializable dict)."""
    secret = get_session_secret() if secret is None else secret
    payload = _b64encode(orjson.dumps(session))
    return (payload + b"." + _sign(secret, cookie_name.encode("latin-1"), payload)).decode("ascii")


def decode_session_cookie(value: str | bytes, cookie_name: str, secret: Optional[bytes] = None) -> Optional[dict]:
    """The session dict in a cookie value, or None when it is not a valid cookie of ours."""
    secret = get_session_secret() if secret is None else secret
    try:
        raw = value.encode("ascii") if isinstance(value, str) else value
    except UnicodeEncodeError:  # our cookies are pure ASCII
        return None
    result = _verify(raw, cookie_name.encode("latin-1"), _mac(secret))
    return None if result is None else result[0]


def replica_of_cookie(value: Any) -> Optional[int]:
    """The replica index (`_replica`) in a session cookie value, read without checking the signature (the
    server checks it; a client only needs to know where to send the request), or None when there is none."""
    if isinstance(value, bytes):
        value = value.decode("ascii", "replace")
    elif not isinstance(value, str):
        value = getattr(value, "value", None)  # a Morsel
        if not isinstance(value, str):
            return None
    if len(value) >= 2 and value[0] == value[-1] == '"':
        value = value[1:-1]
    payload, dot, _ = value.rpartition(".")
    if not dot or not payload:
        return None
    try:
        session = orjson.loads(_b64decode(payload.encode("ascii")))
    except (binascii.Error, ValueError, UnicodeEncodeError):
        return None
    if not isinstance(session, dict):
        return None
    replica = session.get(REPLICA_KEY)
    return replica if type(replica) is int and replica >= 0 else None


def _verify(raw: bytes, name: bytes, mac: _HmacSha256) -> Optional[tuple[dict, bytes]]:
    """(session, decoded JSON bytes) for a valid cookie value, else None."""
    payload, dot, signature = raw.rpartition(b".")
    if not dot or not payload or not signature:
        return None
    if not hmac.compare_digest(signature, _b64encode(mac.digest(name + b"|" + payload))):
        return None
    try:
        data = _b64decode(payload)
        session = orjson.loads(data)
    except (binascii.Error, ValueError):
        return None
    if not isinstance(session, dict):
        return None
    return session, data


class SessionCookieMiddleware:
    """Pure-ASGI middleware: `scope["session"]` from a signed cookie, re-sent on every response.

    `cookie_name` is `<ClassName>___<server_id>` for NeMo Gym servers (unique per server, so one cookie dict
    can carry the sessions of several servers). `secret` defaults to this launch's random secret.
    """

    direct_role = "session"  # HotRoutes.answer does this layer's work itself with `open` and `cookie`

    def __init__(
        self,
        app: Any,
        cookie_name: str,
        secret: Optional[bytes] = None,
        *,
        max_age: Optional[int] = DEFAULT_SESSION_MAX_AGE,
        path: str = "/",
        same_site: str = "lax",
        https_only: bool = False,
        refuse_unknown_cookies: bool = False,
        seed_paths: tuple[str, ...] = ("/seed_session",),
        replica: Optional[int] = None,
    ) -> None:
        self.app = app
        # This process's replica index, written into every session it sends (None: a single-process server).
        self.replica = replica
        self.refuse_unknown_cookies = refuse_unknown_cookies
        self.seed_paths = frozenset(seed_paths)
        self.cookie_name = cookie_name
        self.secret = get_session_secret() if secret is None else secret
        self._mac = _HmacSha256(self.secret)
        self._name = cookie_name.encode("latin-1")
        self._name_eq = self._name + b"="
        attrs = f"; path={path}"
        if max_age is not None:
            attrs += f"; Max-Age={int(max_age)}"
        attrs += "; httponly"
        if same_site:
            attrs += f"; samesite={same_site}"
        if https_only:
            attrs += "; secure"
        self._attrs = attrs.encode("latin-1")
        self._delete_value = self._name + b"=null; path=" + path.encode("latin-1") + (
            b"; expires=Thu, 01 Jan 1970 00:00:00 GMT; Max-Age=0; httponly"
        )

    def _load(self, headers: Any) -> tuple[dict, Optional[bytes], Optional[bytes], bool]:
        """(session, raw cookie value, its decoded JSON, whether a cookie of this name failed verification)
        from the request headers."""
        name_eq = self._name_eq
        unknown = False
        for key, value in headers:
            if key != b"cookie" or name_eq not in value:
                continue
            for part in value.split(b";"):
                part = part.strip()
                if part.startswith(name_eq):
                    raw = part[len(name_eq) :]
                    if len(raw) >= 2 and raw[0] == raw[-1] == 0x22:  # a quoted cookie value
                        raw = raw[1:-1]
                    found = _verify(raw, self._name, self._mac)
                    if found is not None:
                        return found[0], raw, found[1], False
                    unknown = True
        return {}, None, None, unknown

    def open(self, scope: dict) -> Optional[tuple[Optional[bytes], Optional[bytes]]]:
        """Put the request's session into `scope["session"]` (a new one with a fresh `session_id` when the request
        has no valid cookie). Returns what `cookie` needs (the raw cookie value and its decoded JSON), or None
        when the request must be refused (see `_refuse`)."""
        session, raw, data, unknown = self._load(scope["headers"])
        if unknown and self.refuse_unknown_cookies and scope["type"] == "http" and scope["path"] not in self.seed_paths:
            return None
        if SESSION_ID_KEY not in session:
            session[SESSION_ID_KEY] = new_session_id()
        scope["session"] = session
        return raw, data

    def cookie(self, session: dict, opened: tuple[Optional[bytes], Optional[bytes]]) -> bytes:
        """The `Set-Cookie` value for `session` as the handler left it (`opened`: what `open` returned)."""
        if not session:  # the handler cleared the session
            return self._delete_value
        raw, data = opened
        if self.replica is not None and session.get(REPLICA_KEY) != self.replica:
            session[REPLICA_KEY] = self.replica
        dumped = orjson.dumps(session)
        if raw is not None and dumped == data:
            value = raw  # unchanged: re-send the cookie we got, no second signature
        else:
            payload = _b64encode(dumped)
            value = payload + b"." + _b64encode(self._mac.digest(self._name + b"|" + payload))
        return self._name_eq + value + self._attrs

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        scope_type = scope["type"]
        if scope_type != "http" and scope_type != "websocket":
            await self.app(scope, receive, send)
            return

        opened = self.open(scope)
        if opened is None:
            await self._refuse(send)
            return
        if scope_type != "http":
            await self.app(scope, receive, send)
            return

        await self.app(scope, receive, self.cookie_sender(scope, opened, send))

    def cookie_sender(self, scope: dict, opened: tuple[Optional[bytes], Optional[bytes]], send: Any) -> Any:
        """`send` with the session's `Set-Cookie` added to the response start (`opened`: what `open` returned)."""

        async def send_with_cookie(message: dict) -> None:
            if message["type"] == "http.response.start":
                headers = list(message.get("headers", ()))
                headers.append((b"set-cookie", self.cookie(scope["session"], opened)))
                message["headers"] = headers
            await send(message)

        return send_with_cookie

    def refusal(self) -> tuple[int, list, bytes]:
        """(status, headers, body) of the 409 for a cookie this process never issued (see the module docstring)."""
        body = orjson.dumps(
            {
                "detail": f"session cookie {self.cookie_name!r} was not issued by this server process (it restarted "
                "since the rollout was seeded, or the cookie belongs to another launch); its session state is "
                "gone, so start the rollout again from /seed_session"
            }
        )
        return 409, [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())], body

    async def _refuse(self, send: Any) -> None:
        status, headers, body = self.refusal()
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": body})
