"""Tasks to /run bodies: each task is checked as `ng_collect_rollouts` checks an input line (the collector's
`RowPreprocessor`: a JSON object with `responses_create_params` that the strict Responses model accepts, an agent the
stack has), then copied once per repeat with the task's position as `_ng_task_index` and the repeat as
`_ng_rollout_index` (the indices every result carries back)."""

from __future__ import annotations

from typing import Any, AsyncIterator, Iterable, Mapping, Optional, Union, AsyncIterable

import orjson

from nemo_gym.rollouts.collection import (
    ROLLOUT_INDEX_KEY_NAME,
    TASK_INDEX_KEY_NAME,
    RowPreprocessor,
    _RowProblem,
    agent_name_of,
)

__all__ = ["InvalidTask", "TaskChecker", "iter_tasks"]

Tasks = Union[Iterable[Mapping[str, Any]], AsyncIterable[Mapping[str, Any]]]


class InvalidTask(ValueError):
    """A task refused before any /run (the message says what is wrong with it)."""


class TaskChecker:
    """Checks tasks and turns a checked one into its repeats' /run bodies.

    `agent`: the agent of tasks that name none in `agent_ref.name`; `known_agents`: the stack's agents (a task naming
    another is refused); `responses_create_params`: merged over every task's (these win)."""

    def __init__(
        self,
        *,
        agent: Optional[str],
        known_agents: Optional[Iterable[str]],
        responses_create_params: Optional[Mapping[str, Any]] = None,
    ) -> None:
        self.agent = agent
        self._pre = RowPreprocessor(
            agent_name=agent,
            known_agents=known_agents,
            responses_create_params=responses_create_params,
        )

    def check(self, task: Any) -> dict:
        """The task as a /run body (a fresh dict, the agent filled in); `InvalidTask` when it cannot run."""
        if hasattr(task, "model_dump") and not isinstance(task, Mapping):  # a pydantic model
            task = task.model_dump(mode="json", exclude_unset=True)
        if not isinstance(task, Mapping):
            raise InvalidTask(f"a task must be a dict (a JSON object), got {type(task).__name__}")
        try:
            line = orjson.dumps(dict(task), option=orjson.OPT_SERIALIZE_NUMPY | orjson.OPT_NON_STR_KEYS)
        except TypeError as exc:
            raise InvalidTask(f"the task is not JSON-serializable: {exc}") from None
        try:
            row = self._pre.check_line(line)
        except _RowProblem as exc:
            text = str(exc).replace("pass +agent_name=<agent server id>", "pass agent=<agent server id>")
            raise InvalidTask(text) from None
        row.pop(TASK_INDEX_KEY_NAME, None)
        row.pop(ROLLOUT_INDEX_KEY_NAME, None)
        return row

    def agent_of(self, task: Any) -> Optional[str]:
        """The agent a (possibly invalid) task would go to, for its failure records."""
        if isinstance(task, Mapping):
            return agent_name_of(task) or self.agent
        return self.agent

    @staticmethod
    def repeats(row: dict, task_index: int, num_repeats: int) -> Iterable[dict]:
        """`num_repeats` independent /run bodies of a checked task (the first is `row` itself)."""
        for i in range(num_repeats):
            copy = row if i == 0 else orjson.loads(orjson.dumps(row))
            copy[TASK_INDEX_KEY_NAME] = task_index
            copy[ROLLOUT_INDEX_KEY_NAME] = i
            yield copy

    def close(self) -> None:
        self._pre.close()


async def iter_tasks(tasks: Tasks) -> AsyncIterator[tuple[int, Any]]:
    """(index, task) of a sync or async iterable, pulled one at a time."""
    index = 0
    if hasattr(tasks, "__aiter__"):
        async for task in tasks:  # type: ignore[union-attr]
            yield index, task
            index += 1
    else:
        for task in tasks:  # type: ignore[union-attr]
            yield index, task
            index += 1
