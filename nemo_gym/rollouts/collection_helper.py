"""`RolloutCollectionHelper`: the collector as an object, for code that drives collections itself (NeMo Gym's
driver-style agents and scripts import it from `nemo_gym.rollout_collection`).

It adds no behaviour of its own: `run_from_config` is `ng_collect_rollouts`, `run_examples` is `iter_rollouts`
(retries, failure routing and bounded parallelism included) presented as awaitables of `(row, result)`.
"""

from __future__ import annotations

import asyncio
from typing import Any, AsyncIterator, Iterable, Optional

from pydantic import BaseModel, ConfigDict

from nemo_gym.rollouts.collection import RolloutCollectionConfig, RolloutResult, iter_rollouts, run_from_config

__all__ = ["RolloutCollectionHelper"]

_DRIVERS: set = set()


class RolloutCollectionHelper(BaseModel):
    """Run collections from Python. `server_client` defaults to the running stack's (`ServerClient.load_from_global_config`)."""

    model_config = ConfigDict(arbitrary_types_allowed=True)

    server_client: Any = None

    def _client(self, head_server_config: Any = None) -> Any:
        if self.server_client is None:
            from nemo_gym.http.client import ServerClient

            self.server_client = ServerClient.load_from_global_config(head_server_config)
        return self.server_client

    async def run_from_config(self, config: RolloutCollectionConfig) -> int:
        """Collect as `ng_collect_rollouts` does (files, resume, aggregation) and return its exit code. The
        collection runs in a worker thread with a loop of its own, so this can be awaited from a running loop."""
        return await asyncio.to_thread(run_from_config, config, server_client=self.server_client)

    async def iter_results(
        self, examples: Iterable[dict], head_server_config: Any = None, **options: Any
    ) -> AsyncIterator[RolloutResult]:
        """`RolloutResult`s in completion order (failures included; see `iter_rollouts` for `options`)."""
        async for result in iter_rollouts(examples, server_client=self._client(head_server_config), **options):
            yield result

    def run_examples(
        self, examples: list[dict], head_server_config: Any = None, **options: Any
    ) -> Iterable["asyncio.Future[tuple[dict, Optional[dict]]]"]:
        """One awaitable per example, in completion order (iterate inside a running loop, as with
        `asyncio.as_completed`); each gives `(row, result)`, where result is the agent's answer, or None when the
        rollout failed after retries."""
        loop = asyncio.get_running_loop()
        futures = [loop.create_future() for _ in examples]

        async def drive() -> None:
            position = 0
            try:
                async for result in self.iter_results(examples, head_server_config, **options):
                    futures[position].set_result((result.row, result.result if result.ok else None))
                    position += 1
            except BaseException as exc:  # hand the error to whoever awaits next
                for future in futures[position:]:
                    if not future.done():
                        future.set_exception(exc)
                if not isinstance(exc, Exception):
                    raise

        task = loop.create_task(drive())
        _DRIVERS.add(task)  # the loop keeps only a weak reference to tasks
        task.add_done_callback(_DRIVERS.discard)
        return iter(futures)
