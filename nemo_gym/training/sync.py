"""`SyncRolloutClient`: `RolloutClient` for synchronous trainers. The async client runs on an event loop of its own
in a background thread; every method blocks until its answer is there."""

from __future__ import annotations

import asyncio
import contextlib
import os
import threading
from typing import Any, Iterator, Mapping, Optional, Sequence, Union

from nemo_gym.training.client import DEFAULT_HEAD_SERVER, RolloutClient
from nemo_gym.training.rollout import RolloutGroup
from nemo_gym.training.tasks import Tasks

__all__ = ["SyncRolloutClient"]


class _LoopThread:
    """An event loop running forever in a daemon thread."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self._run, name="nemo-gym-rollout-client", daemon=True)
        self.thread.start()

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.run_forever()

    def call(self, coro: Any) -> Any:
        """Run `coro` on the loop and wait for it; Ctrl-C (or any exception here) cancels it."""
        future = asyncio.run_coroutine_threadsafe(coro, self.loop)
        try:
            return future.result()
        except BaseException:
            if not future.done():
                future.cancel()
                with contextlib.suppress(BaseException):
                    future.result(timeout=30)
            raise

    def stop(self) -> None:
        if self.loop.is_closed():
            return

        async def shutdown() -> None:
            tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            await self.loop.shutdown_asyncgens()

        with contextlib.suppress(Exception):
            asyncio.run_coroutine_threadsafe(shutdown(), self.loop).result(timeout=30)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(timeout=30)
        if not self.thread.is_alive():
            self.loop.close()


class SyncRolloutClient:
    """The synchronous `RolloutClient`: `SyncRolloutClient(head_server, max_in_flight=64, ...)` attaches to a running
    stack (the options of `RolloutClient.attach`); `with SyncRolloutClient.start(config_paths, overrides) as
    client:` starts one. `client.rollouts(tasks, num_repeats, agent)` returns the list of groups (completion
    order); `client.iter_rollouts(...)` yields them as they complete (closing the generator early cancels the
    batch). Close with `client.close()` or use it as a context manager."""

    def __init__(self, head_server: str = DEFAULT_HEAD_SERVER, **options: Any) -> None:
        self._loop = _LoopThread()
        try:
            self._client: RolloutClient = self._loop.call(RolloutClient.attach(head_server, **options))
        except BaseException:
            self._loop.stop()
            raise
        self._owned_stack: Any = None

    @classmethod
    def attach(cls, head_server: str = DEFAULT_HEAD_SERVER, **options: Any) -> "SyncRolloutClient":
        """The same as `SyncRolloutClient(head_server, **options)`."""
        return cls(head_server, **options)

    @classmethod
    @contextlib.contextmanager
    def start(
        cls,
        config_paths: Union[str, os.PathLike, Sequence[Union[str, os.PathLike]]],
        overrides: Sequence[str] = (),
        **options: Any,
    ) -> Iterator["SyncRolloutClient"]:
        """`RolloutClient.start`, blocking: starts ng_run, waits until it is ready, stops it on exit."""
        self = cls.__new__(cls)
        self._loop = _LoopThread()
        manager = RolloutClient.start(config_paths, overrides, **options)
        try:
            self._client = self._loop.call(manager.__aenter__())
        except BaseException:
            self._loop.stop()
            raise
        try:
            yield self
        except BaseException as exc:
            self._loop.call(manager.__aexit__(type(exc), exc, exc.__traceback__))
            self._loop.stop()
            raise
        else:
            self._loop.call(manager.__aexit__(None, None, None))
            self._loop.stop()

    # --------------------------------------------------------------------------------------------- delegation

    @property
    def client(self) -> RolloutClient:
        """The async client underneath (use it only through this object's loop)."""
        return self._client

    @property
    def agents(self) -> list[str]:
        return self._client.agents

    @property
    def head_server(self) -> str:
        return self._client.head_server

    @property
    def in_flight(self) -> int:
        return self._client.in_flight

    @property
    def stack_log(self) -> Optional[os.PathLike]:
        return self._client.stack_log

    def rollouts(
        self,
        tasks: Tasks,
        num_repeats: int = 1,
        agent: Optional[str] = None,
        *,
        responses_create_params: Optional[Mapping[str, Any]] = None,
    ) -> list[RolloutGroup]:
        """Every group of the batch (see `RolloutClient.rollouts`), in completion order, once all are done.
        Ctrl-C cancels the batch."""
        batch = self._client.rollouts(tasks, num_repeats, agent, responses_create_params=responses_create_params)

        async def collect() -> list[RolloutGroup]:
            try:
                return [group async for group in batch]
            finally:
                await batch.aclose()

        return self._loop.call(collect())

    def iter_rollouts(
        self,
        tasks: Tasks,
        num_repeats: int = 1,
        agent: Optional[str] = None,
        *,
        responses_create_params: Optional[Mapping[str, Any]] = None,
    ) -> Iterator[RolloutGroup]:
        """The groups as they complete (see `RolloutClient.rollouts`); leaving the loop early (or `close()` on the
        generator) cancels the rest of the batch."""
        batch = self._client.rollouts(tasks, num_repeats, agent, responses_create_params=responses_create_params)
        try:
            while True:
                try:
                    group = self._loop.call(batch.__anext__())
                except StopAsyncIteration:
                    return
                yield group
        finally:
            if not self._loop.loop.is_closed():
                self._loop.call(batch.aclose())

    def close(self) -> None:
        """Cancel the batches still running, close the client and stop its event loop thread."""
        if self._loop.loop.is_closed():
            return
        with contextlib.suppress(Exception):
            self._loop.call(self._client.aclose())
        self._loop.stop()

    def __enter__(self) -> "SyncRolloutClient":
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self.close()
