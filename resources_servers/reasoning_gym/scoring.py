"""The function reasoning_gym's scoring workers run (see `nemo_gym/isolation/worker_pool.py`).

Why a worker process: some scorers hand the model's answer to sympy, and an answer such as `x**(9**9**9)` makes that
run for hours inside one C call that holds the GIL. In the server it would freeze every request, and a thread could
not be interrupted; a worker that overruns is killed and replaced, and only that one answer scores 0.

Why a module of its own: a worker imports only this and reasoning-gym (not the server), and keeps one scorer per
task for as long as it lives (the `lru_cache` below lives in the worker).

    pool = WorkerPool(num_workers=2, timeout_s=10.0, preload=SCORING_PRELOAD)
    score = await pool.run(score_answer, "leg_counting", "146", {"question": ..., "answer": "146", "metadata": {...}})
"""

from __future__ import annotations

import functools
from typing import Any, Callable, Optional

__all__ = ["SCORING_PRELOAD", "score_answer"]

# Imported by a new worker before it takes calls, so the import (matplotlib, sympy, ...) never counts against one.
SCORING_PRELOAD = ("reasoning_gym", __name__)


@functools.lru_cache(maxsize=None)
def _scorer(task_name: str) -> Callable[[Optional[str], dict[str, Any]], float]:
    """The task's `score_answer`, bound to a dataset with the task's default configuration (what
    `reasoning_gym.get_score_answer_fn` returns). Built once per task: some take a second to build."""
    import reasoning_gym

    return reasoning_gym.get_score_answer_fn(task_name)


def score_answer(task_name: str, answer: Optional[str], entry: dict[str, Any]) -> float:
    """The task's own score for `answer` given the row `entry` (`question`, `answer`, `metadata`)."""
    return float(_scorer(task_name)(answer, entry))
