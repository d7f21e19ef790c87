"""`RolloutCollectionHelper`: the collector as an object, for code that drives collections itself (trainers, NeMo
Gym's driver-style agents and scripts import it from `nemo_gym.rollout_collection`).

Two ways in, with two error contracts:

- `run_from_config` is `ng_collect_rollouts` (files, resume, retries, failure routing; a failed rollout is a
  record, never the end of the collection) and `iter_results` is its engine, `iter_rollouts`, yielding every
  `RolloutResult`, failures included.
- `run_examples` is NeMo Gym v0.5's lower-level interface, which trainers call (NeMo RL, TRL's in-process example):
  one `/run` per example, and a `/run` answered with an error status raises aiohttp's `ClientResponseError`
  (`.status`, the body as `.response_content`) where the result is awaited. It does not retry or swallow
  failures, because the trainer's own policy decides (NeMo RL: 5xx is a transport error to retry, 4xx a data
  failure). Our client still resends what never reached the agent (connection refused, 429, 503; see
  `nemo_gym.http.retry`), as v0.5's resends what failed to connect.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any, AsyncIterator, Iterable, Iterator, Optional

from pydantic import BaseModel, ConfigDict, PrivateAttr

from nemo_gym.http.response import get_response_json, raise_for_status
from nemo_gym.rollouts.collection import (
    RolloutCollectionConfig,
    RolloutResult,
    agent_name_of,
    iter_rollouts,
    run_from_config,
)

__all__ = ["RolloutCollectionHelper"]


def _head_key(head_server_config: Any) -> Optional[tuple]:
    """(host, port) of a head server config given as a model or a mapping; None for None."""
    if head_server_config is None:
        return None
    if isinstance(head_server_config, dict):
        return head_server_config.get("host"), head_server_config.get("port")
    return getattr(head_server_config, "host", None), getattr(head_server_config, "port", None)


class RolloutCollectionHelper(BaseModel):
    """Run collections from Python. `server_client` defaults to the running stack's, read from its head server
    (`head_server_config`, else this process's `head_server`) on first use and kept for later calls."""

    model_config = ConfigDict(arbitrary_types_allowed=True)

    server_client: Any = None
    _loaded_from: Optional[tuple] = PrivateAttr(default=None)  # the head server our own client was loaded from
    _loaded: bool = PrivateAttr(default=False)

    def _client(self, head_server_config: Any = None) -> Any:
        """The client to call agents with: the one given, else one loaded from the head server, as v0.5's
        `setup_server_client` does (which also sizes the global aiohttp client from that config); loaded again
        when a call names another head server."""
        if self.server_client is not None and not self._loaded:
            return self.server_client
        key = _head_key(head_server_config)
        if self.server_client is None or (key is not None and key != self._loaded_from):
            from nemo_gym.http.external import setup_server_client

            self.server_client = setup_server_client(head_server_config)
            self._loaded, self._loaded_from = True, key
        return self.server_client

    async def run_from_config(self, config: RolloutCollectionConfig) -> int:
        """Collect as `ng_collect_rollouts` does (files, resume, aggregation) and return its exit code. The
        collection runs in a worker thread with a loop of its own, so this can be awaited from a running loop."""
        return await asyncio.to_thread(run_from_config, config, server_client=self.server_client)

    async def iter_results(
        self, examples: Iterable[dict], head_server_config: Any = None, **options: Any
    ) -> AsyncIterator[RolloutResult]:
        """`RolloutResult`s in completion order, with the collector's retries (failures are results, never
        raised; see `iter_rollouts` for `options`)."""
        async for result in iter_rollouts(examples, server_client=self._client(head_server_config), **options):
            yield result

    def run_examples(
        self,
        examples: list[dict],
        head_server_config: Any = None,
        semaphore: Optional[Any] = None,
    ) -> Iterator["asyncio.Future[tuple[dict, dict]]"]:
        """Start one `/run` per example now (on the agent its `agent_ref.name` names) and return awaitables in
        completion order (as `asyncio.as_completed`); each gives `(row, the agent's JSON answer)`, or raises: a
        `/run` answered with an error status raises `aiohttp.ClientResponseError` (ours, `NeMoGymHTTPError`)
        with `.status` and the body as `.response_content`; a server that cannot be reached, the client's error.
        One failure leaves the other examples running. Call it inside a running event loop. `semaphore`: an
        `asyncio.Semaphore` (or any async context manager) bounding how many run at once; None: no bound."""
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            raise RuntimeError(
                "RolloutCollectionHelper.run_examples() starts its rollouts on the running event loop: call it "
                "from async code (e.g. inside `async def` run with asyncio.run())."
            ) from None
        agents = []
        for index, row in enumerate(examples):
            agent = agent_name_of(row)
            if not agent:
                raise ValueError(
                    f"run_examples: example {index} names no agent. Give every row `agent_ref: {{name: <agent "
                    "server id>}}`, the agent server that runs it."
                )
            agents.append(agent)
        server_client = self._client(head_server_config)
        bound = semaphore if semaphore is not None else contextlib.nullcontext()

        async def run(row: dict, agent: str) -> tuple[dict, dict]:
            async with bound:
                response = await server_client.post(agent, "/run", json=row)
                await raise_for_status(response)
                return row, await get_response_json(response)

        tasks = [loop.create_task(run(row, agent)) for row, agent in zip(examples, agents)]
        return asyncio.as_completed(tasks)
