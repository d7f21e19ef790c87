"""The replicas of one server as a `ServerClient` sees them (docs/design.md, decisions 22 and 24): their
addresses, this client's requests in flight to each, which are out for a moment, and which one a call goes to
(the one its session cookie pins, else the least loaded, ties round-robin). `ServerClient` builds them from
`replica_ports` or, for Ray actor replicas, from the head server's `/server_instances`.
"""

from __future__ import annotations

from time import monotonic as _monotonic
from typing import Any, Optional

import aiohttp
import httpx
from yarl import URL

from nemo_gym.http.response import CookiesLike
from nemo_gym.serving.sessions import replica_of_cookie

__all__ = ["Replicas", "REPLICA_DOWN_S", "REPLICA_REFRESH_S"]

# A replica that refused or dropped a connection is not chosen for this long (unless all are out).
REPLICA_DOWN_S = 2.0
# Ray actor replicas: re-read their addresses from the head server at most this often while one is out.
REPLICA_REFRESH_S = 0.5
# Errors after which a replica counts as gone (its process died or is restarting).
_REPLICA_GONE_ERRORS: tuple[type[BaseException], ...] = (
    httpx.ConnectError, httpx.ConnectTimeout, httpx.ReadError, httpx.WriteError, httpx.RemoteProtocolError,
    aiohttp.ClientConnectorError, aiohttp.ServerDisconnectedError, aiohttp.ClientOSError,
)


class Replicas:
    """The replicas of one server (a block with several `replica_ports`, or Ray actors) as one `ServerClient`
    sees them: their base URLs (None: a Ray actor replica with no address now), this client's requests in flight
    to each, which are out for a moment, and how a call picks one (`choose`)."""

    __slots__ = ("bases", "in_flight", "suffix", "_next", "_urls", "_sticky", "down_until", "dynamic", "refreshed_at")

    def __init__(self, server_name: str, bases: list[Optional[str]], *, dynamic: bool = False) -> None:
        self.bases = bases
        self.in_flight = [0] * len(bases)
        self.suffix = "___" + str(server_name)  # the end of this server's session cookie name
        self._next = 0
        self._urls: list[dict[str, URL]] = [{} for _ in bases]
        self._sticky: dict[Any, Optional[int]] = {}  # cookie value -> replica in its payload (bounded)
        self.down_until = [0.0] * len(bases)
        self.dynamic = dynamic  # addresses come from the head server (Ray actors)
        self.refreshed_at = 0.0

    def __len__(self) -> int:
        return len(self.bases)

    def _out(self, i: int, now: float) -> bool:
        return self.bases[i] is None or self.down_until[i] > now

    def least_loaded(self) -> int:
        """The replica with the fewest requests in flight from this client; among equals, the first after the
        one chosen last, so ties go round-robin. Replicas that are out (no address, or failed a moment ago) are
        skipped while another is in."""
        in_flight = self.in_flight
        n = len(in_flight)
        best = start = self._next
        if self.dynamic or any(self.down_until):  # the slower path: some replica may be out
            now = _monotonic()
            best_key = (self._out(start, now), in_flight[start])
            for k in range(1, n):
                i = start + k if start + k < n else start + k - n
                key = (self._out(i, now), in_flight[i])
                if key < best_key:
                    best, best_key = i, key
            if self.bases[best] is None:  # no replica has an address: any with one, else this one
                best = next((i for i in range(n) if self.bases[i] is not None), best)
        else:
            best_load = in_flight[start]
            for k in range(1, n):
                i = start + k
                if i >= n:
                    i -= n
                if in_flight[i] < best_load:
                    best, best_load = i, in_flight[i]
        self._next = best + 1 if best + 1 < n else 0
        return best

    def mark_down(self, replica: int) -> None:
        self.down_until[replica] = _monotonic() + REPLICA_DOWN_S

    def stale(self) -> bool:
        """A Ray actor replica is out and its address was not re-read for a moment."""
        if not self.dynamic:
            return False
        now = _monotonic()
        return now - self.refreshed_at > REPLICA_REFRESH_S and any(self._out(i, now) for i in range(len(self.bases)))

    def update(self, bases: list[Optional[str]]) -> None:
        """New addresses (from the head server): a replica at a new address is in again."""
        self.refreshed_at = _monotonic()
        for i, base in enumerate(bases[: len(self.bases)]):
            if base != self.bases[i]:
                self.bases[i] = base
                self._urls[i] = {}
                self.down_until[i] = 0.0

    def pinned(self, cookies: CookiesLike) -> Optional[int]:
        """The replica named by this server's session cookie among `cookies`, or None (no such cookie, or one
        without a usable `_replica`)."""
        suffix = self.suffix
        if isinstance(cookies, httpx.Cookies):
            pairs: Any = ((c.name, c.value) for c in cookies.jar)
        elif hasattr(cookies, "items"):
            pairs = cookies.items()
        else:
            return None
        for name, value in pairs:
            if not isinstance(name, str) or not name.endswith(suffix):
                continue
            key = value if isinstance(value, (str, bytes)) else getattr(value, "value", None)
            replica = self._sticky.get(key, -1) if key is not None else -1
            if replica == -1:
                replica = replica_of_cookie(value)
                if key is not None:
                    if len(self._sticky) >= 4096:
                        self._sticky.clear()
                    self._sticky[key] = replica
            if replica is not None and replica < len(self.bases):
                return replica
        return None

    def choose(self, cookies: CookiesLike) -> int:
        """The replica a call goes to: the one its session cookie pins, else the least loaded."""
        if cookies:
            replica = self.pinned(cookies)
            if replica is not None:
                return replica
        return self.least_loaded()

    def url(self, replica: int, url_path: str) -> URL:
        urls = self._urls[replica]
        url = urls.get(url_path)
        if url is None:
            path = url_path if not url_path or url_path.startswith("/") else "/" + url_path
            base = self.bases[replica]
            if base is None:  # a Ray actor replica without an address (restarting): a refused connection
                base = "http://127.0.0.1:1"
            url = URL(base + path)
            if len(urls) >= 4096:
                urls.clear()
            urls[url_path] = url
        return url
