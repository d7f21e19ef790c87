"""Rollouts that come back HTTP 200 but say they failed (NeMo Gym v0.5 failure keys).

An agent's `/run` answer may carry, beside or instead of a reward:

- `_ng_failure_class` (e.g. `"judge_failed"`, set by `judge_failsafe` when the judge call failed): the reward is not
  a score. The rollout is rerun (with `_ng_attempt_index` = the attempt number in its `/run` body) up to
  `NEMO_GYM_MAX_ROLLOUT_ATTEMPTS` attempts in all, then recorded in `<stem>_failures.jsonl`, never in the output;
- `_ng_failure_terminal: true` with a class: record the failure at once, do not rerun;
- `_ng_no_persist: true`: the answer must not be kept (e.g. the process was being killed); rerun like a failure.

Such rollouts are failures like a transport error: counted by class in the summary, excluded from the output, the
reward profile and the aggregate metrics, and run again on resume.
"""

from __future__ import annotations

import os
import sys
from typing import Any, Mapping, Optional

__all__ = [
    "NG_FAILURE_CLASS_KEY",
    "NG_NO_PERSIST_KEY",
    "NG_TERMINAL_KEY",
    "NG_FAILURE_JUDGE_ERROR_KEY",
    "JUDGE_FAILED_CLASS",
    "ATTEMPT_INDEX_KEY_NAME",
    "MAX_ROLLOUT_ATTEMPTS_ENV_VAR_NAME",
    "DEFAULT_MAX_ROLLOUT_ATTEMPTS",
    "get_max_rollout_attempts",
    "declared_failure",
]

NG_FAILURE_CLASS_KEY = "_ng_failure_class"
NG_NO_PERSIST_KEY = "_ng_no_persist"
NG_TERMINAL_KEY = "_ng_failure_terminal"
NG_FAILURE_JUDGE_ERROR_KEY = "_ng_failure_judge_error"  # what the judge call's failure said (verifiers/judge.py)
JUDGE_FAILED_CLASS = "judge_failed"
ATTEMPT_INDEX_KEY_NAME = "_ng_attempt_index"
MAX_ROLLOUT_ATTEMPTS_ENV_VAR_NAME = "NEMO_GYM_MAX_ROLLOUT_ATTEMPTS"
DEFAULT_MAX_ROLLOUT_ATTEMPTS = 3
_NO_PERSIST_CLASS = "no_persist"


def get_max_rollout_attempts() -> int:
    """`NEMO_GYM_MAX_ROLLOUT_ATTEMPTS` (a positive int; default 3). A bad value is reported and 3 is used."""
    raw = os.environ.get(MAX_ROLLOUT_ATTEMPTS_ENV_VAR_NAME)
    if raw is None or not raw.strip():
        return DEFAULT_MAX_ROLLOUT_ATTEMPTS
    try:
        value = int(raw)
        if value < 1:
            raise ValueError
    except ValueError:
        sys.stderr.write(
            f"Warning: {MAX_ROLLOUT_ATTEMPTS_ENV_VAR_NAME}={raw!r} is not a positive integer; using "
            f"{DEFAULT_MAX_ROLLOUT_ATTEMPTS}.\n"
        )
        return DEFAULT_MAX_ROLLOUT_ATTEMPTS
    return value


def declared_failure(result: Mapping[str, Any]) -> Optional[tuple[str, bool]]:
    """`(failure class, terminal)` when a `/run` answer says it failed, else None."""
    failure_class = result.get(NG_FAILURE_CLASS_KEY)
    if failure_class is not None:
        return str(failure_class), bool(result.get(NG_TERMINAL_KEY))
    if result.get(NG_NO_PERSIST_KEY):
        return _NO_PERSIST_CLASS, False
    return None
