"""`RolloutClient`: submit batches of tasks to a running NeMo Gym stack from a trainer and get each task's group of
rollouts back as soon as it is complete.

Every /run goes through the collector's own runner (`nemo_gym.rollouts.collection.iter_rollouts`): the same retry
policy (connection errors, timeouts, HTTP 429/5xx retried with jittered backoff up to `max_attempts`), the same
failure routing (an answer declaring `_ng_failure_class` is rerun up to `NEMO_GYM_MAX_ROLLOUT_ATTEMPTS`), the same
stop when `ng_run` has given up on a server the agents need (raised here as `NeMoGymStackError`). Replicas (one
machine or a Ray cluster) are the shared `ServerClient`'s business: nothing here changes with them.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from typing import Any, AsyncIterator, Mapping, Optional, Sequence, Union
from urllib.parse import urlsplit

from nemo_gym.errors import NeMoGymConfigError, NeMoGymStackError, did_you_mean
from nemo_gym.http.client import ServerClient
from nemo_gym.http.stack_health import StackHealth, StackServerFailed
from nemo_gym.rollouts.collection import RolloutResult, agent_names_in_config, fit_connection_limits, iter_rollouts
from nemo_gym.training.rollout import Rollout, RolloutGroup, invalid_task_rollout, rollout_from_result
from nemo_gym.training.stack import DEFAULT_READY_TIMEOUT_S, LocalStack
from nemo_gym.training.tasks import InvalidTask, TaskChecker, Tasks, iter_tasks

__all__ = ["RolloutClient", "DEFAULT_HEAD_SERVER", "DEFAULT_MAX_IN_FLIGHT"]

DEFAULT_HEAD_SERVER = "http://127.0.0.1:11000"
DEFAULT_MAX_IN_FLIGHT = 64


def parse_head_server(head_server: str) -> dict:
    """`http://host:port`, `host:port` or a port -> `{"host": ..., "port": ...}`."""
    text = str(head_server).strip()
    if text.isdigit():
        return {"host": "127.0.0.1", "port": int(text)}
    parts = urlsplit(text if "://" in text else f"http://{text}")
    try:
        port = parts.port or 11000
    except ValueError:
        port = None
    if not parts.hostname or port is None:
        raise ValueError(f"head_server={head_server!r}: expected http://<host>:<port>, e.g. {DEFAULT_HEAD_SERVER}")
    return {"host": parts.hostname, "port": port}


class _RunClient(ServerClient):
    """The collector's `ServerClient`, with the client-wide bound on /run calls in flight (across batches)."""

    def bound(self, max_in_flight: int) -> None:
        self.max_in_flight = max_in_flight
        self.in_flight = 0
        self._slots: Optional[asyncio.Semaphore] = None

    async def post(self, server_name: str, url_path: str, **kwargs: Any) -> Any:
        if self._slots is None:
            self._slots = asyncio.Semaphore(self.max_in_flight)
        async with self._slots:
            self.in_flight += 1
            try:
                return await super().post(server_name, url_path, **kwargs)
            finally:
                self.in_flight -= 1


class _Done:
    pass


class _Failed:
    def __init__(self, exc: BaseException) -> None:
        self.exc = exc


_DONE = _Done()


class RolloutClient:
    """A trainer's client of one NeMo Gym stack (async). Make one with `await RolloutClient.attach(...)` (a running
    stack) or `async with RolloutClient.start(config_paths) as client` (a stack of its own); close it with
    `await client.aclose()` (or use it as an async context manager).

    `max_in_flight`: at most this many /run calls at once over all batches of this client. `max_attempts`,
    `request_timeout_s`, `retry_backoff_s`, `retry_backoff_max_s`: the collector's retry policy per rollout (see
    `ng_collect_rollouts`)."""

    def __init__(
        self,
        server_client: _RunClient,
        *,
        head_server: str,
        max_in_flight: int,
        max_attempts: int,
        request_timeout_s: Optional[float],
        retry_backoff_s: float,
        retry_backoff_max_s: float,
    ) -> None:
        self._server_client = server_client
        self.head_server = head_server
        self.max_in_flight = max_in_flight
        self.max_attempts = max_attempts
        self.request_timeout_s = request_timeout_s
        self.retry_backoff_s = retry_backoff_s
        self.retry_backoff_max_s = retry_backoff_max_s
        self.agents: list[str] = sorted(agent_names_in_config(server_client.global_config_dict))
        self._batches: set[asyncio.Task] = set()
        self._closed = False

    # ---------------------------------------------------------------------------------------------- making one

    @classmethod
    async def attach(
        cls,
        head_server: str = DEFAULT_HEAD_SERVER,
        *,
        max_in_flight: int = DEFAULT_MAX_IN_FLIGHT,
        max_attempts: int = 3,
        request_timeout_s: Optional[float] = None,
        retry_backoff_s: float = 1.0,
        retry_backoff_max_s: float = 30.0,
    ) -> "RolloutClient":
        """A client of the stack whose head server is at `head_server` (`http://host:port`; `ng_run` prints it and
        `+head_server.port` sets it). `NeMoGymStackError` when no head server answers there."""
        if int(max_in_flight) < 1:
            raise ValueError(f"max_in_flight={max_in_flight}: must be >= 1")
        if int(max_attempts) < 1:
            raise ValueError(f"max_attempts={max_attempts}: must be >= 1")
        head = parse_head_server(head_server)
        try:
            server_client = await asyncio.to_thread(_RunClient.load_from_global_config, head)
        except ValueError as exc:
            raise NeMoGymStackError(f"RolloutClient.attach({head_server!r}): {exc}") from None
        server_client.bound(int(max_in_flight))
        fit_connection_limits(server_client, int(max_in_flight))
        return cls(
            server_client,
            head_server=f"http://{head['host']}:{head['port']}",
            max_in_flight=int(max_in_flight),
            max_attempts=int(max_attempts),
            request_timeout_s=request_timeout_s,
            retry_backoff_s=float(retry_backoff_s),
            retry_backoff_max_s=float(retry_backoff_max_s),
        )

    @classmethod
    @contextlib.asynccontextmanager
    async def start(
        cls,
        config_paths: Union[str, os.PathLike, Sequence[Union[str, os.PathLike]]],
        overrides: Sequence[str] = (),
        *,
        cwd: Union[str, os.PathLike, None] = None,
        ready_timeout_s: float = DEFAULT_READY_TIMEOUT_S,
        log_path: Union[str, os.PathLike, None] = None,
        env: Optional[dict] = None,
        **client_options: Any,
    ) -> AsyncIterator["RolloutClient"]:
        """`async with RolloutClient.start(["configs/my_stack.yaml"], ["+policy_base_url=..."]) as client:` starts
        `ng_run` with those config paths and overrides (Hydra syntax, as on the command line; relative paths
        resolve against `cwd`, default the current directory) as a child process, waits until every server is
        ready, attaches (`client_options`: those of `attach`) and on exit closes the client and stops the stack.
        The head server takes a free port unless an override gives `+head_server.port`. ng_run's output goes to
        `log_path` (default: a temporary file; `client.stack_log` names it)."""
        stack = LocalStack(config_paths, overrides, cwd=cwd, log_path=log_path, env=env)
        stack.start()
        try:
            await stack.wait_ready(ready_timeout_s)
            client = await cls.attach(stack.head_server, **client_options)
            client.stack_log = stack.log_path
            try:
                yield client
            finally:
                await client.aclose()
        finally:
            await asyncio.to_thread(stack.stop)

    stack_log: Optional[os.PathLike] = None

    # ------------------------------------------------------------------------------------------------- state

    @property
    def in_flight(self) -> int:
        """The /run calls of this client in flight right now."""
        return self._server_client.in_flight

    @property
    def server_client(self) -> ServerClient:
        """The `ServerClient` the /run calls go through (the stack's config is its `global_config_dict`)."""
        return self._server_client

    async def aclose(self) -> None:
        """Cancel every batch still running (their iterators raise `RuntimeError`) and close the client."""
        self._closed = True
        batches = list(self._batches)
        for task in batches:
            task.cancel()
        if batches:
            await asyncio.gather(*batches, return_exceptions=True)

    async def __aenter__(self) -> "RolloutClient":
        return self

    async def __aexit__(self, *exc_info: Any) -> None:
        await self.aclose()

    # ----------------------------------------------------------------------------------------------- batches

    def _agent_for(self, agent: Optional[str]) -> Optional[str]:
        if agent is None:
            return self.agents[0] if len(self.agents) == 1 else None
        if self.agents and agent not in self.agents:
            raise NeMoGymConfigError(
                f"agent={agent!r} is not an agent of the stack at {self.head_server} (agents: "
                f"{', '.join(self.agents)}).{did_you_mean(agent, self.agents)}"
            )
        return agent

    def rollouts(
        self,
        tasks: Tasks,
        num_repeats: int = 1,
        agent: Optional[str] = None,
        *,
        responses_create_params: Optional[Mapping[str, Any]] = None,
    ) -> AsyncIterator[RolloutGroup]:
        """Run every task `num_repeats` times and yield one `RolloutGroup` per task as its last rollout finishes
        (completion order; `group.task_index` is the task's position in `tasks`).

        `tasks`: an iterable or async iterable of dicts shaped like the lines of an `ng_collect_rollouts` input
        (`responses_create_params` with `input`, plus the fields the resources server reads), pulled lazily: at most
        about 2 x `max_in_flight` /run bodies are read ahead of the calls. A slow source should be an async
        iterable (a sync one is read on the event loop). `agent`: the agent of tasks without `agent_ref.name`
        (default: the stack's only agent). `responses_create_params`: merged over every task's (these win).

        A rollout that fails (after the retry policy) is a `Rollout` with `failure`; a task that cannot run
        (no `responses_create_params`, an unknown agent, ...) is a group whose rollouts all fail with
        `InvalidTask`. Neither stops the batch. A server the agents need that ng_run marked failed stops it with
        `NeMoGymStackError`. Leaving the iteration early (`break`, `aclose()`, cancelling the task) cancels the
        batch's /run calls in flight and starts no more."""
        if self._closed:
            raise RuntimeError("RolloutClient.rollouts: the client is closed")
        if isinstance(num_repeats, bool) or not isinstance(num_repeats, int) or num_repeats < 1:
            raise ValueError(f"num_repeats={num_repeats!r}: must be an integer >= 1")
        checker = TaskChecker(
            agent=self._agent_for(agent), known_agents=self.agents or None, responses_create_params=responses_create_params
        )
        return self._batch(tasks, num_repeats, checker)

    async def _batch(self, tasks: Tasks, num_repeats: int, checker: TaskChecker) -> AsyncIterator[RolloutGroup]:
        queue: asyncio.Queue = asyncio.Queue(maxsize=self.max_in_flight)
        pending: dict[int, Any] = {}  # task index -> the task, until its group is yielded
        health = StackHealth.for_collection(
            self._server_client, [checker.agent] if checker.agent else self.agents
        )

        async def rows() -> AsyncIterator[dict]:
            async for index, task in iter_tasks(tasks):
                try:
                    row = checker.check(task)
                except InvalidTask as exc:
                    agent = checker.agent_of(task)
                    failed = [invalid_task_rollout(index, i, agent, str(exc)) for i in range(num_repeats)]
                    await queue.put(RolloutGroup(index, task, failed))
                    continue
                pending[index] = task
                for body in checker.repeats(row, index, num_repeats):
                    yield body

        async def pump() -> None:
            results = iter_rollouts(
                rows(),
                server_client=self._server_client,
                num_samples_in_parallel=self.max_in_flight,
                max_attempts=self.max_attempts,
                request_timeout_s=self.request_timeout_s,
                retry_backoff_s=self.retry_backoff_s,
                retry_backoff_max_s=self.retry_backoff_max_s,
                stack_health=health,
            )
            try:
                if health is not None:
                    await asyncio.to_thread(health.raise_if_failed_now, 0)
                async for result in results:
                    await queue.put(result)
                await queue.put(_DONE)
            except asyncio.CancelledError:
                _put_last(queue, _Failed(RuntimeError("RolloutClient: the client was closed during this batch")))
                raise
            except BaseException as exc:  # StackServerFailed, or an exception raised by `tasks`
                await queue.put(_Failed(exc))
            finally:
                await results.aclose()

        worker = asyncio.ensure_future(pump())
        self._batches.add(worker)
        partial: dict[int, list[Rollout]] = {}
        yielded = 0
        try:
            while True:
                item = await queue.get()
                if isinstance(item, RolloutResult):
                    rollout = rollout_from_result(item)
                    group = partial.setdefault(rollout.task_index, [])
                    group.append(rollout)
                    if len(group) == num_repeats:
                        del partial[rollout.task_index]
                        group.sort(key=lambda r: r.repeat_index)
                        yielded += 1
                        yield RolloutGroup(rollout.task_index, pending.pop(rollout.task_index, None), group)
                elif isinstance(item, RolloutGroup):
                    yielded += 1
                    yield item
                elif item is _DONE:
                    return
                elif isinstance(item, _Failed):
                    exc = item.exc
                    if isinstance(exc, StackServerFailed):
                        raise NeMoGymStackError(
                            f"{exc}. The batch stopped after {yielded} group(s): the rollouts in flight were "
                            f"cancelled and the rest not started. See `{exc.hint}` and the server's lines in ng_run's "
                            "output; fix the server and restart ng_run before the next batch."
                        ) from None
                    raise exc
        finally:
            if not worker.done():
                worker.cancel()
            await asyncio.gather(worker, return_exceptions=True)
            self._batches.discard(worker)
            checker.close()
            if health is not None:
                health.close()


def _put_last(queue: asyncio.Queue, item: Any) -> None:
    """Put `item` without waiting, dropping the oldest entry when full (the batch is over: nobody needs it)."""
    while True:
        try:
            queue.put_nowait(item)
            return
        except asyncio.QueueFull:
            queue.get_nowait()
