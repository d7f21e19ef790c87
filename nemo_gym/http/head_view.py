"""The head server's list of server instances (`GET /server_instances`), as one client process sees it.

Two things in a client read that list: which servers `ng_run` has given up on (`stack_health.py`) and where the
Ray actor replicas of a server are now (`ServerClient`, `replicas.py`). Both go through one `HeadServerView` per
client, so they share one connection, one lookup at a time and one cached answer.

The lookup is blocking (a sync `httpx.Client`: callers on an event loop run it in a thread), bounded by a short
connect timeout and a whole-request timeout, and never raises: a head server that does not answer gives `None`,
with the reason in `last_error`.
"""

from __future__ import annotations

import threading
import time
from typing import TYPE_CHECKING, Any, Optional

if TYPE_CHECKING:  # httpx is imported on the first lookup: importing the collector stays light
    import httpx

__all__ = ["HeadServerView", "head_base_url"]

LOOKUP_TIMEOUT_S = 3.0  # read / write timeout of one `/server_instances` request
LOOKUP_CONNECT_TIMEOUT_S = 1.0


def head_base_url(host: Any, port: Any) -> str:
    """`http://host:port` of a head server bound to `host` (a wildcard bind address is reached on loopback; an IPv6
    address is bracketed). Defaults: 127.0.0.1:11000."""
    host = str(host or "127.0.0.1")
    if host in ("0.0.0.0", "::"):
        host = "127.0.0.1"
    if ":" in host and not host.startswith("["):
        host = f"[{host}]"
    return f"http://{host}:{int(port or 11000)}"


class HeadServerView:
    """`/server_instances` of one head server, looked up at most once per `max_age` (one lookup at a time; the
    callers waiting meanwhile reuse its answer). `lookups` counts the requests made; `last_error` says why the last
    one got no answer (None when it got one)."""

    def __init__(self, base_url: str, *, timeout_s: float = LOOKUP_TIMEOUT_S) -> None:
        self.url = base_url.rstrip("/") + "/server_instances"
        self._timeout_s = timeout_s
        self._lock = threading.Lock()
        self._client: Optional["httpx.Client"] = None  # used under `_lock` only
        self._answer: Optional[list] = None
        self._looked_at: Optional[float] = None
        self.lookups = 0
        self.last_error: Optional[str] = None

    def fresh(self, max_age: float) -> bool:
        """Whether the last answer is at most `max_age` seconds old."""
        return self._looked_at is not None and time.monotonic() - self._looked_at < max_age

    def cached(self) -> Optional[list]:
        """The last answer, however old (None: none yet, or the head server did not answer)."""
        return self._answer

    def instances(self, max_age: float) -> Optional[list]:
        """The instance records, from a lookup at most `max_age` seconds old (0: a new one), or None when the head
        server did not answer."""
        if self.fresh(max_age):
            return self._answer
        with self._lock:
            if self.fresh(max_age):  # another caller looked meanwhile
                return self._answer
            self._answer = self._lookup()
            self._looked_at = time.monotonic()
            return self._answer

    def _lookup(self) -> Optional[list]:
        import httpx

        self.lookups += 1
        if self._client is None:
            timeout = httpx.Timeout(self._timeout_s, connect=min(LOOKUP_CONNECT_TIMEOUT_S, self._timeout_s))
            self._client = httpx.Client(timeout=timeout, trust_env=False)
        try:
            answer = self._client.get(self.url).raise_for_status().json()
        except (httpx.HTTPError, ValueError) as exc:
            self.last_error = f"{type(exc).__name__}: {exc}"
            return None
        if not isinstance(answer, list):
            self.last_error = f"the head server answered {type(answer).__name__}, not a list"
            return None
        self.last_error = None
        return answer

    def close(self) -> None:
        with self._lock:
            if self._client is not None:
                self._client.close()
                self._client = None
