"""Which names a request may use to reach a server: its `Host` header and, when present, its `Origin` header.

Why: a web page on another site can point its own name at 127.0.0.1 (DNS rebinding) and then talk to a stack's
servers from a browser on the same machine: spend model calls, seed and verify rollouts, call tools over `/mcp`,
read the head server's config. Such a request names the page's site in `Host` (`evil.example`), and, being
cross-origin, in `Origin`; our own clients (and the `openai` / `mcp` SDKs) name the address they connect to and
send no `Origin`. So every server refuses a `Host` that is not one of its names (421, as the MCP SDK answers), and
an `Origin` that is present and whose host is not one of them (403, as the MCP specification asks of local
servers); a request without `Origin` passes.

A server's names (`host_policy`): the loopback names and every loopback address; the address it listens on; every
host the global config names (`default_host`, `head_server.host`, `ray_bind_host`, each server block's `host`),
since that is what its peers call it by; when it listens on every interface (`0.0.0.0` / `::`), also this
machine's hostname and the addresses of its interfaces; and the entries of `allowed_hosts` (global key): names
or addresses, `*.example.com` for a domain's subdomains, `*` for any (no check at all). Ports are not compared:
an SSH tunnel or a port-forward changes the port, not the name.

On the direct path (`HotRoutes.answer`) the check is a scan of the request's headers and one dict lookup of each
`Host` / `Origin` value already judged; the verdict for a new value is worked out once and remembered (up to
`_MAX_REMEMBERED` values, so a client cycling names cannot grow a server)."""

from __future__ import annotations

import ipaddress
import logging
import os
import re
import socket
from typing import Any, Iterable, Optional

import orjson

from nemo_gym.config.values import config_get, is_mapping
from nemo_gym.errors import NeMoGymConfigError

__all__ = [
    "ALLOWED_HOSTS_KEY_NAME",
    "ANY_HOST",
    "LOOPBACK_HOSTS",
    "HostPolicy",
    "HostCheck",
    "host_policy",
    "parse_allowed_hosts",
    "send_refusal",
]

ALLOWED_HOSTS_KEY_NAME = "allowed_hosts"
ANY_HOST = "*"
LOOPBACK_HOSTS = ("localhost", "127.0.0.1", "::1")
WILDCARD_BINDS = frozenset({"0.0.0.0", "::", ""})
# Hands a server's policy to its uvicorn workers (`num_workers > 1`), which build their app in a fresh process.
ENV_VAR_NAME = "NEMO_GYM_ALLOWED_HOSTS"
_MAX_REMEMBERED = 1024
_SHOWN_CHARS = 200
_LOGGER = logging.getLogger("uvicorn.error")


# A host name as it may appear in `Host` (letters, digits, `-`, `_`, dot-separated labels), lower case.
_HOST_NAME_RE = re.compile(r"[a-z0-9_-]+(?:\.[a-z0-9_-]+)*")


def _address(text: str) -> Optional[str]:
    """`text` as a canonical IP address, or None when it is not one."""
    try:
        return str(ipaddress.ip_address(text))
    except ValueError:
        return None


def _name_of(text: str) -> Optional[str]:
    """The host of a `Host` value or an origin's authority (`name`, `name:port`, `[v6]:port`): lower case, without
    port, brackets or a final dot, an address in its canonical form; None when it is not a host."""
    text = text.strip().lower()
    if text.startswith("["):
        end = text.find("]")
        rest = text[end + 1:]
        if end < 0 or (rest and not (rest[0] == ":" and rest[1:].isdigit())):
            return None
        return _address(text[1:end])
    name, sep, port = text.partition(":")
    if sep and not port.isdigit():
        return None
    name = name.rstrip(".")
    return _address(name) or (name if _HOST_NAME_RE.fullmatch(name) else None)


def _is_loopback_address(name: str) -> bool:
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False


def _entry(value: Any) -> str:
    """One `allowed_hosts` entry, normalised: a name or address, `*.domain`, or `*`. ValueError when it is none."""
    text = str(value).strip()
    if text == ANY_HOST:
        return ANY_HOST
    wildcard = text.startswith("*.")
    body = text[2:] if wildcard else text
    address = _address(body[1:-1] if body.startswith("[") and body.endswith("]") else body)
    if address is not None and not wildcard:
        return address
    name = body.lower().rstrip(".")
    if address is None and _HOST_NAME_RE.fullmatch(name):
        return "*." + name if wildcard else name
    raise ValueError(
        f"{text!r} is not a host name or address: give the name alone (e.g. "
        f"node1.example.com, 10.0.0.5, *.example.com), without scheme, port or path; '*' allows any host"
    )


def parse_allowed_hosts(value: Any) -> list[str]:
    """The entries of `allowed_hosts` (a list, or one string), normalised. ValueError naming the first entry that
    is not a host name or address, `*.domain` or `*`."""
    if value is None:
        return []
    if isinstance(value, (str, bytes)) or not hasattr(value, "__iter__"):
        value = [value]
    return [_entry(entry) for entry in value]


class HostPolicy:
    """The names one server answers to (see the module docstring); `refusal(headers)` judges a request."""

    __slots__ = ("names", "suffixes", "any_host", "_hosts", "_origins")

    def __init__(self, hosts: Iterable[str] = LOOPBACK_HOSTS) -> None:
        entries = parse_allowed_hosts(list(hosts))
        self.any_host = ANY_HOST in entries
        self.names = frozenset(e for e in entries if not e.startswith("*"))
        self.suffixes = tuple(e[1:] for e in entries if e.startswith("*."))  # ".example.com"
        self._hosts: dict[bytes, bool] = {}  # verdicts on header values seen
        self._origins: dict[bytes, bool] = {}

    def allows(self, name: Optional[str]) -> bool:
        """Whether `name` (as `_name_of` gives it) is one of this server's names."""
        if name is None:
            return False
        return (
            self.any_host or name in self.names or _is_loopback_address(name)
            or any(name.endswith(suffix) for suffix in self.suffixes)
        )

    def refusal(self, headers: Iterable[tuple[bytes, bytes]]) -> Optional[tuple[int, list, bytes]]:
        """(status, headers, body) refusing a request with these ASGI headers (lower-case names), or None."""
        if self.any_host:
            return None
        hosts, origins = self._hosts, self._origins
        for name, value in headers:
            if name == b"host":
                ok = hosts.get(value)
                if ok is None:
                    ok = self._judge(hosts, value, "Host", self._host_ok)
                if not ok:
                    return _answer(421, f"Host {_shown(value)} is not a name of this server")
            elif name == b"origin":
                ok = origins.get(value)
                if ok is None:
                    ok = self._judge(origins, value, "Origin", self._origin_ok)
                if not ok:
                    return _answer(403, f"Origin {_shown(value)} is a page on a site that is not this server")
        return None

    def _judge(self, seen: dict, value: bytes, header: str, rule: Any) -> bool:
        ok = rule(value.decode("latin-1"))
        if len(seen) < _MAX_REMEMBERED:  # a new value is said once (the next ones come from `seen`)
            seen[value] = ok
            if not ok:
                _LOGGER.warning(
                    "Refusing requests with %s %s: not one of this server's names (%s in the global config adds "
                    "names).", header, _shown(value), ALLOWED_HOSTS_KEY_NAME,
                )
        return ok

    def _host_ok(self, text: str) -> bool:
        return self.allows(_name_of(text))

    def _origin_ok(self, text: str) -> bool:
        """`scheme://host[:port]` whose host is one of ours (`null`, sent by sandboxed and file pages, is not)."""
        scheme, sep, authority = text.strip().partition("://")
        if not sep or not scheme or "/" in authority or "@" in authority:
            return False
        return self.allows(_name_of(authority))

    # -- handing the policy to uvicorn workers -----------------------------------------------------------------

    def entries(self) -> list[str]:
        if self.any_host:
            return [ANY_HOST]
        return sorted(self.names) + ["*" + suffix for suffix in self.suffixes]

    def export_to_env(self) -> None:
        """For the uvicorn workers this process starts next (they read `from_env`)."""
        os.environ[ENV_VAR_NAME] = ",".join(self.entries())

    @classmethod
    def from_env(cls) -> Optional["HostPolicy"]:
        """The policy a parent process exported, or None when it exported none."""
        text = os.environ.get(ENV_VAR_NAME)
        return None if text is None else cls(e for e in text.split(",") if e)


def _shown(value: bytes) -> str:
    """A header value as a refusal quotes it: JSON-quoted, cut to a few hundred characters."""
    text = value.decode("latin-1")
    return orjson.dumps(text[:_SHOWN_CHARS] + ("..." if len(text) > _SHOWN_CHARS else "")).decode()


def _answer(status: int, what: str) -> tuple[int, list, bytes]:
    body = orjson.dumps({
        "detail": f"{what}: refused against DNS rebinding (add the name to {ALLOWED_HOSTS_KEY_NAME} in the global "
                  f"config to allow it; '*' allows any host)"
    })
    return status, [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())], body


def host_policy(global_config_dict: Any = None, bind_host: Optional[str] = None) -> HostPolicy:
    """The policy of a server listening on `bind_host` in a stack with this global config (module docstring).
    `NeMoGymConfigError` naming `allowed_hosts` when one of its entries is not a host."""
    try:
        names = set(parse_allowed_hosts(config_get(global_config_dict, ALLOWED_HOSTS_KEY_NAME)))
    except ValueError as exc:
        raise NeMoGymConfigError(f"{ALLOWED_HOSTS_KEY_NAME}: {exc}") from None
    names.update(LOOPBACK_HOSTS)
    bind = (bind_host or "").strip().strip("[]")
    candidates = {bind, *_config_hosts(global_config_dict)}
    if bind in WILDCARD_BINDS:
        candidates.update(_machine_hosts())
    for candidate in candidates:
        try:
            names.add(_entry(candidate))
        except ValueError:  # not a host (e.g. an unresolved interpolation): nobody can name it
            pass
    return HostPolicy(names)


def _config_hosts(cfg: Any) -> set[str]:
    """Every host the global config names: `default_host`, `head_server.host`, `ray_bind_host` and each server
    block's `host` (`<id>: <type>: <impl>: host`)."""
    if not is_mapping(cfg):
        return set()
    found = [config_get(cfg, "default_host"), config_get(config_get(cfg, "head_server"), "host"),
             config_get(cfg, "ray_bind_host")]
    for key in list(cfg.keys()):
        block = config_get(cfg, key)
        if not is_mapping(block):
            continue
        for server_type in list(block.keys()):
            impls = config_get(block, server_type)
            if not is_mapping(impls):
                continue
            for impl in list(impls.keys()):
                config = config_get(impls, impl)
                if is_mapping(config):
                    found.append(config_get(config, "host"))
    return {str(h).strip().strip("[]").lower() for h in found if isinstance(h, str) and h.strip()}


def _machine_hosts() -> set[str]:
    """This machine's hostname and the addresses of its interfaces (for a server listening on all of them)."""
    found = {socket.gethostname().lower()}
    try:
        import psutil

        for addresses in psutil.net_if_addrs().values():
            for address in addresses:
                if address.family in (socket.AF_INET, socket.AF_INET6):
                    found.add(address.address.split("%", 1)[0])
    except Exception:  # noqa: BLE001 - no interface list: the config's hosts and allowed_hosts still apply
        pass
    return found


async def send_refusal(scope: dict, send: Any, refused: tuple[int, list, bytes]) -> None:
    """Answer a refused request (a websocket is closed before it is accepted, which its client sees as a 403)."""
    if scope["type"] == "websocket":
        await send({"type": "websocket.close", "code": 1008})
        return
    status, headers, body = refused
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


class HostCheck:
    """Pure-ASGI middleware that refuses what `policy` refuses, for apps served without `HotRoutes` (which checks
    itself): the head server, the rollout viewer, servers with `NEMO_GYM_HOT_ROUTES=0`."""

    def __init__(self, app: Any, policy: HostPolicy) -> None:
        self.app = app
        self.policy = policy

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "lifespan":
            refused = self.policy.refusal(scope["headers"])
            if refused is not None:
                await send_refusal(scope, send, refused)
                return
        await self.app(scope, receive, send)
