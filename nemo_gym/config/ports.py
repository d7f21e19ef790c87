"""Race-free port reservation.

The reference probed a random port by binding and closing a socket, then let uvicorn bind it later
(a race: two `ng_run` could pick the same port, #941 upstream). Here a chosen port stays bound *and
listening* in a module registry until the launcher hands the socket to the server child
(`take_reserved_socket`, passed via `pass_fds` + `NEMO_GYM_LISTEN_FD`). While we hold it, no other
process can bind it, so two processes can never be given the same port.
"""

from __future__ import annotations

import errno
import ipaddress
import random
import socket
import threading
from typing import Iterable, Optional

from nemo_gym.errors import NeMoGymConfigError

DEFAULT_PORT_RANGE_LOW = 10001
DEFAULT_PORT_RANGE_HIGH = 20000
MAX_ATTEMPTS = 50
LISTEN_BACKLOG = 2048

_RESERVED: dict[tuple[str, int], socket.socket] = {}
_LOCK = threading.Lock()


def _bind_address(host: str, port: int) -> tuple[int, tuple]:
    """(address family, sockaddr) to bind `host:port`. Literal IPs are used as is; a hostname such
    as `localhost` is resolved, preferring IPv4 like uvicorn does."""
    if host in ("", "0.0.0.0"):
        return socket.AF_INET, (host, port)
    try:
        ip = ipaddress.ip_address(host.strip("[]"))
    except ValueError:
        ip = None
    if ip is not None:
        if ip.version == 6:
            return socket.AF_INET6, (str(ip), port, 0, 0)
        return socket.AF_INET, (str(ip), port)
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except socket.gaierror as err:
        raise NeMoGymConfigError(
            f"Cannot resolve host `{host}` to reserve a port ({err.strerror}). "
            "Use an IP address or a resolvable hostname for `host` / `default_host`."
        ) from None
    infos.sort(key=lambda info: 0 if info[0] == socket.AF_INET else 1)
    family, _, _, _, sockaddr = infos[0]
    return family, sockaddr


def _try_bind(host: str, port: int) -> Optional[socket.socket]:
    """A listening socket on host:port, or None when the port is taken. Other failures (an address
    that is not on this machine, a bad host) raise NeMoGymConfigError."""
    family, sockaddr = _bind_address(host, port)
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        # SO_REUSEADDR only lets us reuse ports in TIME_WAIT; it never allows two listeners.
        # (SO_REUSEPORT would, so it is deliberately not set.)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if family == socket.AF_INET6:
            sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
        sock.bind(sockaddr)
        sock.listen(LISTEN_BACKLOG)
        return sock
    except OverflowError:  # a port outside 0-65535 that no config check caught
        sock.close()
        raise NeMoGymConfigError(f"Cannot bind {host}:{port}: a port number must be from 0 to 65535.") from None
    except OSError as err:
        sock.close()
        if err.errno in (errno.EADDRINUSE, errno.EACCES):
            return None
        if err.errno == errno.EADDRNOTAVAIL:
            raise NeMoGymConfigError(
                f"Cannot bind `{host}`: it is not an address of this machine. "
                "Set `host` (or `default_host`) to 127.0.0.1, 0.0.0.0 or one of this machine's IPs."
            ) from None
        raise NeMoGymConfigError(f"Cannot bind {host}:{port}: {err.strerror or err}") from None


def reserve_port(
    host: str,
    *,
    port: Optional[int] = None,
    low: int = DEFAULT_PORT_RANGE_LOW,
    high: int = DEFAULT_PORT_RANGE_HIGH,
    disallowed: Iterable[int] = (),
) -> int:
    """Bind and listen on `host:port` (or a random free port in [low, high] not in `disallowed`)
    and keep the socket until `take_reserved_socket` / `release_all`. Returns the port."""
    if port is not None:
        port = int(port)
        with _LOCK:
            if (host, port) in _RESERVED:
                return port
            sock = _try_bind(host, port)
            if sock is None:
                raise NeMoGymConfigError(
                    f"Port {host}:{port} is already in use; pick another port or stop the process using it."
                )
            _RESERVED[(host, port)] = sock
            return port

    low, high = int(low), int(high)
    if low > high:
        raise NeMoGymConfigError(f"Empty port range: port_range_low={low} > port_range_high={high}.")
    blocked = {int(p) for p in disallowed}
    with _LOCK:
        blocked |= {p for (_, p) in _RESERVED}
        span = high - low + 1
        if span <= 4 * MAX_ATTEMPTS:
            candidates = [p for p in range(low, high + 1) if p not in blocked]
            random.shuffle(candidates)
            candidates = candidates[:MAX_ATTEMPTS]
        else:
            candidates = []
            seen: set[int] = set()
            for _ in range(MAX_ATTEMPTS * 20):
                p = random.randint(low, high)
                if p not in blocked and p not in seen:
                    seen.add(p)
                    candidates.append(p)
                    if len(candidates) == MAX_ATTEMPTS:
                        break
        for candidate in candidates:
            sock = _try_bind(host, candidate)
            if sock is not None:
                _RESERVED[(host, candidate)] = sock
                return candidate
    raise NeMoGymConfigError(
        f"Could not reserve a free port on {host} in the range {low}-{high} after "
        f"{len(candidates)} attempt(s): the range is exhausted (ports in use or disallowed). "
        "Widen it with +port_range_low=... / +port_range_high=..., or free some ports."
    )


def take_reserved_socket(host: str, port: int) -> Optional[socket.socket]:
    """Remove and return the listening socket held for host:port (the caller now owns it), or None."""
    with _LOCK:
        return _RESERVED.pop((host, int(port)), None)


def is_reserved(host: str, port: int) -> bool:
    with _LOCK:
        return (host, int(port)) in _RESERVED


reserved_socket_exists = is_reserved


def reserved_ports() -> list[tuple[str, int]]:
    """(host, port) pairs currently held by this process."""
    with _LOCK:
        return list(_RESERVED)


def release_port(host: str, port: int) -> None:
    """Close the socket held for host:port, if any."""
    sock = take_reserved_socket(host, port)
    if sock is not None:
        sock.close()


def release_all() -> None:
    """Close every held socket (tests, shutdown)."""
    with _LOCK:
        socks = list(_RESERVED.values())
        _RESERVED.clear()
    for sock in socks:
        sock.close()
