"""Which servers a collection needs that `ng_run` has given up on, as the stack's head server says.

`ng_run` restarts a server that crashes, and once its restart budget is spent (`restart_policy.max_restarts` within
`window_s`) marks it `failed`: its socket is closed and it stays down until `ng_run` is restarted. The head server
lists every server process with its `state` on `GET /server_instances` (`nemo_gym/runtime/launcher.py`,
`instance_record`). Retrying rollouts against such a server only burns the retry budget of every row, so
`ng_collect_rollouts` asks here before it starts and whenever a `/run` attempt fails in a way that a dead server
explains (a connection error, a timeout, HTTP 5xx), and stops with one message when a server its agents need has
failed (`StackServerFailed`).

- **Needed servers**: the agents of the collection and every server their blocks reference (`{type, name}` server
  references, followed transitively: an agent's resources server, that server's judge model, ...).
- **Failed**: every process of a server id (all replicas of a `num_replicas` block, all Ray actor replicas) is in
  state `failed`. A server that is restarting is not failed: its rows are retried as usual.
- **Cheap and bounded**: one `GET /server_instances` on the head server (loopback) at a time, its answer reused for
  `cache_s` (1 s); connect timeout 1 s, whole request 3 s. A head server that does not answer says nothing: the
  collection goes on with its usual retries (the lookup never stops a collection by itself).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any, Iterable, Mapping, Optional

from nemo_gym.config.types import SERVER_TYPES, is_server_ref
from nemo_gym.http.head_view import LOOKUP_TIMEOUT_S, HeadServerView, head_base_url

__all__ = [
    "FAILED_STATE",
    "FailedServer",
    "StackHealth",
    "StackServerFailed",
    "needed_servers",
    "status_hint",
]

FAILED_STATE = "failed"  # `ServerProcess.state` / `RayReplica.state` of a server ng_run gave up on
DEFAULT_CACHE_S = 1.0
# After a failed attempt an answer at most this old is trusted: fast retries (a collection's /run answered 500 at
# once by an agent that already knows) must not all reuse an "all well" from just before the server failed.
AFTER_FAILURE_MAX_AGE_S = 0.2


def _items(node: Any) -> Iterable[tuple[Any, Any]]:
    try:
        return list(node.items())
    except Exception:
        return ()


def _refs_in(node: Any, depth: int = 0) -> Iterable[str]:
    """Server ids named by `{type, name}` references anywhere inside a config node (lists included)."""
    if depth > 20:
        return
    if is_server_ref(node):
        name = node.get("name")
        if isinstance(name, str) and name:
            yield name
        return
    if isinstance(node, (str, bytes, int, float, bool)) or node is None:
        return
    children = [v for _, v in _items(node)] if hasattr(node, "items") else None
    if children is None:
        try:
            children = list(node)
        except TypeError:
            return
    for child in children:
        yield from _refs_in(child, depth + 1)


def needed_servers(global_config: Any, agents: Iterable[str]) -> dict[str, str]:
    """Server id -> the agent that needs it, for `agents` and every server their blocks reference (transitively)."""
    needed: dict[str, str] = {}
    todo = [(str(agent), str(agent)) for agent in agents]
    while todo:
        server, agent = todo.pop()
        if server in needed:
            continue
        needed[server] = agent
        try:
            block = global_config.get(server) if global_config is not None else None
        except Exception:
            block = None
        for server_type, impls in _items(block):
            if server_type not in SERVER_TYPES:
                continue
            for _impl, impl_cfg in _items(impls):
                todo.extend((ref, agent) for ref in _refs_in(impl_cfg) if ref not in needed)
    return needed


def status_hint(head_host: str, head_port: int) -> str:
    """The `ng_status` command line that shows this stack."""
    host = "" if head_host in ("127.0.0.1", "localhost", "0.0.0.0", "::", "") else f" +head_server.host={head_host}"
    return f"ng_status{host} +head_server.port={head_port}"


@dataclass(frozen=True)
class FailedServer:
    """A needed server whose every process `ng_run` marked failed."""

    server: str
    needed_by: str  # the agent of the collection that needs it (the server itself when it is an agent)
    restarts: int = 0
    last_exit_code: Optional[int] = None
    processes: int = 1

    def describe(self) -> str:
        if not self.needed_by:
            role = "called by this server"
        elif self.server == self.needed_by:
            role = "an agent of this collection"
        else:
            role = f"needed by agent `{self.needed_by}`"
        what = f"{self.processes} processes" if self.processes > 1 else "its process"
        exit_code = "" if self.last_exit_code is None else f", last exit code {self.last_exit_code}"
        return (
            f"server `{self.server}` ({role}) has failed: ng_run gave up restarting {what} (restart budget spent, "
            f"{self.restarts} restart(s){exit_code}) and it stays down until ng_run is restarted"
        )


class StackServerFailed(Exception):
    """A server the collection needs has failed (not retried: retrying cannot help). `failed`: which ones."""

    def __init__(self, failed: list[FailedServer], hint: str) -> None:
        self.failed = failed
        self.hint = hint
        super().__init__("; ".join(f.describe() for f in failed))

    def message(self, what_happened: str, resume: bool = True) -> str:
        """One message: which server, what the collection did, and what to do (`resume`: rerun with
        +resume_from_cache=true, because rollouts of this output are kept)."""
        rerun = "rerun this command with +resume_from_cache=true to run the rest" if resume else "rerun this command"
        return (
            f"{self}. {what_happened} See `{self.hint}` and the server's lines in ng_run's output; fix the server, "
            f"restart ng_run, then {rerun}."
        )


def failed_among(instances: Any, needed: Mapping[str, str]) -> list[FailedServer]:
    """The needed servers whose every instance on `/server_instances` is failed, in the order of `needed`."""
    by_server: dict[str, list[dict]] = {}
    if isinstance(instances, list):
        for inst in instances:
            if isinstance(inst, dict) and inst.get("process_name") in needed:
                by_server.setdefault(str(inst["process_name"]), []).append(inst)
    failed = []
    for server, agent in needed.items():
        insts = by_server.get(server)
        if not insts or any(i.get("state") != FAILED_STATE for i in insts):
            continue
        codes = [i.get("last_exit_code") for i in insts if isinstance(i.get("last_exit_code"), int)]
        failed.append(
            FailedServer(
                server=server,
                needed_by=agent,
                restarts=sum(int(i.get("restarts") or 0) for i in insts),
                last_exit_code=codes[-1] if codes else None,
                processes=len(insts),
            )
        )
    return failed


class StackHealth:
    """The head server's view of the needed servers, looked up at most once per `cache_s` (one lookup at a time,
    through a `HeadServerView` that a `ServerClient` may share for its replica addresses).

    `check()` (blocking) is for before the collection starts; `raise_if_failed()` (async, the lookup in a thread)
    for a failed attempt. `last_error` holds why the last lookup got no answer (None when it got one)."""

    def __init__(
        self,
        head_host: str,
        head_port: int,
        needed: Mapping[str, str],
        *,
        cache_s: float = DEFAULT_CACHE_S,
        timeout_s: float = LOOKUP_TIMEOUT_S,
        view: Optional[HeadServerView] = None,
    ) -> None:
        self.view = view if view is not None else HeadServerView(head_base_url(head_host, head_port), timeout_s=timeout_s)
        self.url = self.view.url
        self.hint = status_hint(head_host, int(head_port))
        self.needed = dict(needed)
        self.cache_s = cache_s

    @property
    def lookups(self) -> int:
        return self.view.lookups

    @property
    def last_error(self) -> Optional[str]:
        return self.view.last_error

    @classmethod
    def for_collection(cls, server_client: Any, agents: Iterable[str], **kwargs: Any) -> Optional["StackHealth"]:
        """The health view of the stack `server_client` was loaded from (`ServerClient.load_from_global_config`
        keeps the head server's address), or None when the client does not say where its head server is. Shares
        the client's `HeadServerView` when it has one."""
        head = getattr(server_client, "head_server_config", None)
        if head is None:
            return None

        def field_of(name: str) -> Any:
            return head.get(name) if isinstance(head, Mapping) or hasattr(head, "get") else getattr(head, name, None)

        try:
            host, port = field_of("host") or "127.0.0.1", int(field_of("port") or 11000)
        except (TypeError, ValueError):
            return None
        config = getattr(server_client, "global_config_dict", None)
        head_view = getattr(server_client, "head_view", None)
        if callable(head_view) and "view" not in kwargs and "timeout_s" not in kwargs:
            kwargs["view"] = head_view()
        return cls(str(host), port, needed_servers(config, agents), **kwargs)

    def check(self, max_age: Optional[float] = None) -> list[FailedServer]:
        """The needed servers that have failed (a lookup no older than `max_age`, default `cache_s`)."""
        instances = self.view.instances(self.cache_s if max_age is None else max_age)
        return failed_among(instances, self.needed) if instances is not None else []

    def close(self) -> None:
        self.view.close()

    def raise_if_failed_now(self, max_age: Optional[float] = None) -> None:
        """Raise `StackServerFailed` when a needed server has failed (blocking lookup)."""
        failed = self.check(max_age)
        if failed:
            raise StackServerFailed(failed, self.hint)

    async def raise_if_failed(self, server: Optional[str] = None) -> None:
        """Raise `StackServerFailed` when a needed server (or, given one, `server`) has failed. Called after a
        failed attempt, so an answer older than `AFTER_FAILURE_MAX_AGE_S` is looked up again (an older "all well"
        may predate the failure); a fresh one is used without a thread."""
        if self.view.fresh(AFTER_FAILURE_MAX_AGE_S):
            failed = self.check(AFTER_FAILURE_MAX_AGE_S)
        else:
            failed = await asyncio.to_thread(self.check, AFTER_FAILURE_MAX_AGE_S)
        if server is not None:
            failed = [f for f in failed if f.server == server]
        if failed:
            raise StackServerFailed(failed, self.hint)
