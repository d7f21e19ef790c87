"""Reward profiling: per-task and per-agent statistics of collected rollouts (`ng_reward_profile`).

Files (NeMo Gym v0.2 names and keys, section 5.5 of the reference):

- `<rollouts stem>_reward_profiling.jsonl`: one line per task, in task order, with `mean/F`, `max/F`, `min/F`,
  `median/F` and `std/F` for every numeric field F of its rollouts, and `sample` (the task's materialized input
  row without `_ng_task_index` / `_ng_rollout_index`). We add `_ng_task_index` and `num_rollouts`.
- `<rollouts stem>_agent_metrics.json`: a JSON array, one object per agent: the same statistics over all of the
  agent's rollouts, `agent_ref: {"name": ...}`, plus `num_tasks` and `num_rollouts`, and the outcome counts
  (`nemo_gym.rollouts.outcome`) `num_ok`, `num_incomplete` and `num_failed`.

Outcomes: `num_rollouts` counts the rollouts of the file (ok and incomplete ones: both were verified and have a
reward, so both are in the statistics). `num_failed` adds the rollouts of `<rollouts stem>_failures.jsonl` (read when
it exists; one per (task, rollout) however many attempt lines it has; the agent each line names) to any rollout of
the file whose response failed. An agent whose rollouts all failed has no statistics and no entry in the file; the
printed table shows its counts.

Numeric fields of a rollout: its top-level numbers, with the keys of `response.usage` merged in (`input_tokens`,
`output_tokens`, `total_tokens`); bools count as 0/1; nested values (dicts, lists) and the two index keys are
left out. A field missing from some rollouts is averaged over the rollouts that have it.

`std/F` is the sample standard deviation (n - 1). It is undefined for a single value; as in the reference, if
*every* `std/F` of a file is undefined (e.g. one rollout per task) they are written as 0, otherwise the undefined
ones are left out of their line. Undefined statistics are never written as NaN.

pass@k and mean@k (ours; only when some task has 2 or more rollouts, for k = 1 .. the most rollouts of a task):
- a rollout *passes* when `reward >= pass_threshold` (default 1.0, i.e. fully solved for 0/1 rewards);
- per task with n rewarded rollouts of which c passed, for k <= n: `pass@k = 1 - C(n-c, k) / C(n, k)`, the
  unbiased estimate of "at least one of k independent rollouts passes" (Chen et al., 2021);
- `mean@k` is the unbiased estimate of the mean reward of k rollouts, which is the task's mean reward for every
  k <= n (reported beside pass@k so tools can read both the same way);
- per agent, both are the mean over its tasks that have at least k rewarded rollouts.

Memory is flat from 1k to 1M+ rollouts. Rollouts are read as a stream and only their numeric fields are kept (an
array of 8-byte floats per rollout), grouped by task: in a dict for up to `DEFAULT_SPILL_AFTER` (16k) rollouts, then
in a private temporary SQLite table clustered by task (a 2 MB page cache; deleted at the end), the way
`row_keys.TaskIndexMap` spills. Input rows are streamed from the materialized-inputs file and each task's line is
written when its first row is reached (a read of the table in task order alongside). Per-agent statistics come
from per-agent counts of each distinct value (dicts, flushed to SQLite past 16k distinct values): the median is
read off the sorted counts and the mean and std stream through `statistics.fmean` / `statistics.stdev`, so every
number is the one a list of all values would give. The outcome counts take a 4-byte count per task and outcome
(`_TaskOutcomes`), and the failed rollouts' (task, rollout) keys a set. (One difference: a -0.0 and a 0.0 of one agent's field count
as one value, so the sign of a zero agent-level min/max/median may differ from the first rollout's.)

`RewardProfiler` computes the same statistics for rollouts already in memory (NeMo Gym v0.5's
`/aggregate_metrics`, see `nemo_gym.rollouts.metrics`).
"""

from __future__ import annotations

import math
import sqlite3
import statistics
import sys
from array import array
from dataclasses import dataclass, field
from itertools import chain, groupby, repeat
from operator import itemgetter
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, Mapping, Optional

import orjson
from pydantic import Field

from nemo_gym.config.types import BaseNeMoGymCLIConfig
from nemo_gym.rollouts.jsonl import iter_jsonl_objects
from nemo_gym.rollouts.outcome import (
    FAILED,
    INCOMPLETE,
    INCOMPLETE_NOTE,
    OK,
    OUTCOMES,
    OutcomeCounts,
    failure_agent,
    failure_key,
    failure_outcome,
    failures_path_for,
    rollout_outcome,
)
from nemo_gym.rollouts.row_keys import scratch_db

__all__ = [
    "RewardProfileConfig",
    "ProfileSummary",
    "STATS",
    "rollout_numeric_fields",
    "summary_stats",
    "counted_stats",
    "pass_at_k",
    "stat_keys",
    "drop_undefined_stats",
    "RewardProfiler",
    "compute_profile",
    "profile_rollouts",
    "profile_collection",
    "print_profile_table",
]

TASK_INDEX_KEY_NAME = "_ng_task_index"
ROLLOUT_INDEX_KEY_NAME = "_ng_rollout_index"
INDEX_KEYS = (TASK_INDEX_KEY_NAME, ROLLOUT_INDEX_KEY_NAME)
STATS = ("mean", "max", "min", "median", "std")
REWARD_KEY = "reward"
_NAN = float("nan")
# Rollouts kept in memory before the per-task store moves to a temporary SQLite file (about 2 MB of arrays); the
# per-agent value counts flush to SQLite past as many distinct values.
DEFAULT_SPILL_AFTER = 1 << 14
# SQLite page cache of a spilled store, in KiB.
_SQLITE_CACHE_KIB = 2048


class RewardProfileConfig(BaseNeMoGymCLIConfig):
    """Compute per-task and per-agent reward statistics (mean/max/min/median/std of every numeric field, pass@k,
    mean@k) from a rollouts file and its materialized inputs. Writes <rollouts stem>_reward_profiling.jsonl and
    <rollouts stem>_agent_metrics.json next to the rollouts and prints a summary table."""

    materialized_inputs_jsonl_fpath: str = Field(
        description="The <stem>_materialized_inputs.jsonl written by ng_collect_rollouts."
    )
    rollouts_jsonl_fpath: str = Field(description="The rollouts JSONL written by ng_collect_rollouts.")
    pass_threshold: float = Field(default=1.0, description="A rollout passes when reward >= this (for pass@k).")


# --------------------------------------------------------------------------------------------------------
# Per-rollout values and statistics


REWARD_COMPONENTS_KEY = "reward_components"


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def rollout_numeric_fields(rollout: Mapping[str, Any], *, reward_components: bool = True) -> dict[str, float]:
    """The numeric fields of one rollout: top-level numbers and bools (as 0/1), the top-level numbers of
    `response.usage`, and each `reward_components` entry as `reward_components.<name>` (our profile's addition;
    `reward_components=False` leaves them out, as v0.5's `/aggregate_metrics` baseline does); other nested values
    and the index keys are dropped."""
    merged: dict[str, Any] = dict(rollout)
    response = rollout.get("response")
    if isinstance(response, Mapping):
        usage = response.get("usage")
        if isinstance(usage, Mapping):
            merged.update(usage)
    components = rollout.get(REWARD_COMPONENTS_KEY) if reward_components else None
    if isinstance(components, Mapping):  # a multi-reward verifier's parts, each profiled on its own
        merged.update({f"{REWARD_COMPONENTS_KEY}.{name}": value for name, value in components.items()})
    out: dict[str, float] = {}
    for key, value in merged.items():
        if key in INDEX_KEYS:
            continue
        if isinstance(value, bool):
            out[key] = 1.0 if value else 0.0
        elif _is_number(value):
            out[key] = float(value)
    return out


def summary_stats(values: Iterable[float]) -> dict[str, float]:
    """mean, max, min, median and sample std of the non-NaN values (std NaN with fewer than 2 values; all NaN
    with none)."""
    vals = [v for v in values if not math.isnan(v)]
    if not vals:
        return {name: _NAN for name in STATS}
    return {
        "mean": statistics.fmean(vals),
        "max": max(vals),
        "min": min(vals),
        "median": statistics.median(vals),
        "std": statistics.stdev(vals) if len(vals) >= 2 else _NAN,
    }


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k from n samples with c passing: 1 - C(n-c, k) / C(n, k)."""
    if not 0 < k <= n:
        raise ValueError(f"pass@k needs 0 < k <= n (k={k}, n={n})")
    if n - c < k:
        return 1.0
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)


# --------------------------------------------------------------------------------------------------------
# Bounded stores: the rollouts grouped by task, and per-agent value counts



class _TaskRollouts:
    """The numeric fields of every rollout, grouped by task. `fields` names them in order of first appearance; a
    rollout is an `array("d")` over them (NaN = absent, shorter when the later fields are absent). A dict of task ->
    rollouts for up to `spill_after` rollouts, then a temporary SQLite table clustered by (task, file order)."""

    _FLUSH_EVERY = 4096

    def __init__(self, spill_after: int) -> None:
        self.spill_after = max(0, int(spill_after))
        self.fields: list[str] = []
        self.field_ids: dict[str, int] = {}
        self.count = 0
        self.max_task = -1
        self._mem: Optional[dict[int, list[array]]] = {}
        self._db: Optional[sqlite3.Connection] = None
        self._pending: list[tuple[int, int, bytes]] = []
        self._scan: Optional[Iterator[tuple[int, list[array]]]] = None
        self._ahead: Optional[tuple[int, list[array]]] = None

    @property
    def spilled(self) -> bool:
        return self._db is not None

    def add(self, task: int, values: Mapping[str, float]) -> None:
        ids = self.field_ids
        for name in values:
            if name not in ids:
                ids[name] = len(self.fields)
                self.fields.append(name)
        row = array("d", [_NAN]) * len(self.fields)
        for name, value in values.items():
            row[ids[name]] = value
        self.count += 1
        if task > self.max_task:
            self.max_task = task
        if self._mem is not None:
            group = self._mem.get(task)
            if group is None:
                self._mem[task] = [row]
            else:
                group.append(row)
            if self.count > self.spill_after:
                self._spill()
            return
        self._pending.append((task, self.count, row.tobytes()))
        if len(self._pending) >= self._FLUSH_EVERY:
            self._flush()

    def _spill(self) -> None:
        db = scratch_db(_SQLITE_CACHE_KIB)
        db.execute("CREATE TABLE r(t INTEGER NOT NULL, s INTEGER NOT NULL, v BLOB NOT NULL, PRIMARY KEY(t, s)) WITHOUT ROWID")
        assert self._mem is not None
        seq = iter(range(self.count))  # file order within a task is the list order
        db.executemany(
            "INSERT INTO r(t, s, v) VALUES (?, ?, ?)",
            ((t, next(seq), row.tobytes()) for t, rows in self._mem.items() for row in rows),
        )
        self._db = db
        self._mem = None

    def _flush(self) -> None:
        if self._pending:
            assert self._db is not None
            self._db.executemany("INSERT INTO r(t, s, v) VALUES (?, ?, ?)", self._pending)
            self._pending = []

    def groups(self) -> Iterator[tuple[int, list[array]]]:
        """(task, its rollouts in file order), in task order."""
        if self._mem is not None:
            for task in sorted(self._mem):
                yield task, self._mem[task]
            return
        self._flush()
        assert self._db is not None
        rows = self._db.execute("SELECT t, v FROM r ORDER BY t, s")
        for task, group in groupby(rows, key=itemgetter(0)):
            yield task, [_row_from_bytes(v) for _, v in group]

    def lookup(self, task: int) -> list[array]:
        """The rollouts of `task` (file order); cheapest when called in increasing task order."""
        if self._mem is not None:
            return self._mem.get(task, [])
        if self._scan is None:  # a read in task order alongside the callers, who mostly ask in that order
            self._scan = self.groups()
            self._ahead = next(self._scan, None)
        while self._ahead is not None and self._ahead[0] < task:
            self._ahead = next(self._scan, None)
        if self._ahead is not None and self._ahead[0] == task:
            return self._ahead[1]
        assert self._db is not None
        return [_row_from_bytes(v) for (v,) in self._db.execute("SELECT v FROM r WHERE t = ? ORDER BY s", (task,))]

    def close(self) -> None:
        self._scan = self._ahead = None
        if self._db is not None:
            self._db.close()
            self._db = None
        self._mem = {}
        self._pending = []


def _row_from_bytes(data: bytes) -> array:
    row = array("d")
    row.frombytes(data)
    return row


def _field_values(rows: list[array], fields: list[str]) -> dict[str, list[float]]:
    """Per field (in `fields` order), its values in these rollouts; fields without any value are left out."""
    out: dict[str, list[float]] = {}
    for i, name in enumerate(fields):
        vals = [row[i] for row in rows if i < len(row) and row[i] == row[i]]  # not NaN
        if vals:
            out[name] = vals
    return out


class _ValueCounts:
    """How often each value occurs, per key (here (agent, field)): exact per-agent statistics, the median included,
    without a list of every rollout's value. Dicts while they hold at most `spill_after` distinct entries in all,
    then the counts are added to a temporary SQLite table and the dicts start again (rewards, flags and token counts
    take few distinct values, so most runs never touch the disk)."""

    def __init__(self, spill_after: int) -> None:
        self.spill_after = max(0, int(spill_after))
        self._mem: dict[tuple[int, int], dict[float, int]] = {}
        self._entries = 0
        self._db: Optional[sqlite3.Connection] = None

    @property
    def spilled(self) -> bool:
        return self._db is not None

    def add(self, key: tuple[int, int], values: Iterable[float]) -> None:
        counts = self._mem.get(key)
        if counts is None:
            counts = self._mem[key] = {}
        before = len(counts)
        for v in values:
            counts[v] = counts.get(v, 0) + 1
        self._entries += len(counts) - before
        if self._entries > self.spill_after:
            self._flush()

    def _flush(self) -> None:
        if self._db is None:
            self._db = scratch_db(_SQLITE_CACHE_KIB)
            self._db.execute(
                "CREATE TABLE c(a INTEGER NOT NULL, f INTEGER NOT NULL, v REAL NOT NULL, n INTEGER NOT NULL, "
                "PRIMARY KEY(a, f, v)) WITHOUT ROWID"
            )
        self._db.executemany(
            "INSERT INTO c(a, f, v, n) VALUES (?, ?, ?, ?) ON CONFLICT(a, f, v) DO UPDATE SET n = n + excluded.n",
            ((a, f, v, n) for (a, f), counts in self._mem.items() for v, n in counts.items()),
        )
        self._mem = {}
        self._entries = 0

    def sorted_counts(self, key: tuple[int, int]) -> Callable[[], Iterable[tuple[float, int]]]:
        """A function returning (value, count) pairs in increasing value order (it can be called several times)."""
        if self._db is None:
            items = sorted(self._mem.get(key, {}).items())
            return lambda: items
        if self._mem:
            self._flush()
        db = self._db
        return lambda: ((float(v), n) for v, n in db.execute("SELECT v, n FROM c WHERE a = ? AND f = ? ORDER BY v", key))

    def close(self) -> None:
        if self._db is not None:
            self._db.close()
            self._db = None
        self._mem = {}


def counted_stats(sorted_counts: Callable[[], Iterable[tuple[float, int]]]) -> dict[str, float]:
    """`summary_stats` of a multiset given as (value, count) pairs in increasing value order (non-NaN values): the
    same numbers as `summary_stats` of the expanded list (the mean and std stream through `statistics` exactly as
    for a list), in memory that does not grow with the counts."""
    n = 0
    lowest = highest = _NAN
    for value, count in sorted_counts():
        if n == 0:
            lowest = value
        highest = value
        n += count
    if n == 0:
        return {name: _NAN for name in STATS}
    half = n // 2
    seen = 0
    prev = below = middle = _NAN
    for value, count in sorted_counts():
        if seen + count > half:
            middle = value
            below = value if half - 1 >= seen else prev
            break
        seen += count
        prev = value

    def expanded() -> Iterator[float]:
        return chain.from_iterable(repeat(v, c) for v, c in sorted_counts())

    return {
        "mean": statistics.fmean(expanded()),
        "max": highest,
        "min": lowest,
        "median": middle if n % 2 else (below + middle) / 2,
        "std": statistics.stdev(expanded()) if n >= 2 else _NAN,
    }


def stat_keys(stats_by_field: Mapping[str, Mapping[str, float]]) -> dict[str, float]:
    """`{stat}/{field}` keys, grouped by statistic (mean/*, max/*, ...), NaN entries kept for now."""
    out: dict[str, float] = {}
    for stat in STATS:
        for name, stats in stats_by_field.items():
            out[f"{stat}/{name}"] = stats[stat]
    return out


def _drop_undefined(metrics: dict[str, Any], std_zero_fields: set[str]) -> dict[str, Any]:
    """Apply the std rule (0 when every std of that field in the file is undefined) and drop NaN entries."""
    out = {}
    for key, value in metrics.items():
        if isinstance(value, float) and math.isnan(value):
            if key.startswith("std/") and key[4:] in std_zero_fields:
                out[key] = 0.0
            continue
        out[key] = value
    return out


def _is_nan(value: Any) -> bool:
    return isinstance(value, float) and math.isnan(value)


def drop_undefined_stats(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The NaN rule over the stat rows of one file (or one answer): a field whose `std/F` is undefined in every row
    that has it gets `std/F = 0` everywhere; every other NaN entry is dropped."""
    with_std = {key[4:] for row in rows for key in row if key.startswith("std/")}
    defined = {key[4:] for row in rows for key, value in row.items() if key.startswith("std/") and not _is_nan(value)}
    return [_drop_undefined(row, with_std - defined) for row in rows]


class RewardProfiler:
    """The reward profile of rollouts held in memory and already grouped by task: what `/aggregate_metrics` starts
    from (`nemo_gym.rollouts.metrics`). The same statistics as the file profile (`compute_profile`, which streams
    and spills for files of any size): `summary_stats` of every `rollout_numeric_fields` field, keyed `{stat}/F`,
    with the NaN rule applied across the tasks and, separately, to the statistics over all rollouts."""

    def profile(
        self, tasks: Mapping[int, Iterable[Mapping[str, Any]]]
    ) -> tuple[dict[int, dict[str, float]], dict[str, float]]:
        """({task: its stat keys}, stat keys over every rollout), tasks in the mapping's order."""
        per_task_values = {task: self._field_values(rollouts) for task, rollouts in tasks.items()}
        overall_values: dict[str, list[float]] = {}
        for values in per_task_values.values():
            for name, vals in values.items():
                overall_values.setdefault(name, []).extend(vals)
        task_rows = drop_undefined_stats([self._stats(values) for values in per_task_values.values()])
        (overall,) = drop_undefined_stats([self._stats(overall_values)])
        return dict(zip(per_task_values, task_rows)), overall

    @staticmethod
    def _field_values(rollouts: Iterable[Mapping[str, Any]]) -> dict[str, list[float]]:
        out: dict[str, list[float]] = {}
        for rollout in rollouts:
            # v0.5's baseline ignores nested dicts: a component is a metric only if also emitted top-level.
            for name, value in rollout_numeric_fields(rollout, reward_components=False).items():
                out.setdefault(name, []).append(value)
        return out

    @staticmethod
    def _stats(values: Mapping[str, list[float]]) -> dict[str, float]:
        return stat_keys({name: summary_stats(vals) for name, vals in values.items()})


class _TaskOutcomes:
    """ok / incomplete / failed rollouts per task: a 4-byte count per task and outcome (arrays indexed by task, 12 MB
    for 1M tasks), a dict for task indices too large or negative for an array."""

    _MAX_INDEX = 1 << 26

    def __init__(self) -> None:
        self._arrays = {kind: array("I") for kind in OUTCOMES}
        self._other: dict[tuple[int, str], int] = {}

    def add(self, task: int, kind: str) -> None:
        if not 0 <= task < self._MAX_INDEX:
            self._other[(task, kind)] = self._other.get((task, kind), 0) + 1
            return
        counts = self._arrays[kind]
        if task >= len(counts):
            counts.extend(repeat(0, task + 1 - len(counts)))
        counts[task] += 1

    def get(self, task: int) -> dict[str, int]:
        if not 0 <= task < self._MAX_INDEX:
            return {kind: self._other.get((task, kind), 0) for kind in OUTCOMES}
        return {kind: counts[task] if task < len(counts) else 0 for kind, counts in self._arrays.items()}


@dataclass
class _AgentAccumulator:
    index: int
    counts: dict[str, int] = field(default_factory=dict)  # field -> number of values, in order of appearance
    num_tasks: int = 0
    num_rollouts: int = 0
    outcomes: dict[str, int] = field(default_factory=lambda: dict.fromkeys(OUTCOMES, 0))
    pass_sums: dict[int, list[float]] = field(default_factory=dict)  # k -> [sum of pass@k, sum of mean@k, n]

    def add(
        self,
        field_values: Mapping[str, list[float]],
        num_rollouts: int,
        pass_mean: Mapping[int, tuple[float, float]],
        values: _ValueCounts,
        field_ids: Mapping[str, int],
    ) -> None:
        self.num_tasks += 1
        self.num_rollouts += num_rollouts
        for name, vals in field_values.items():
            self.counts[name] = self.counts.get(name, 0) + len(vals)
            values.add((self.index, field_ids[name]), vals)
        for k, (p, m) in pass_mean.items():
            acc = self.pass_sums.setdefault(k, [0.0, 0.0, 0])
            acc[0] += p
            acc[1] += m
            acc[2] += 1


@dataclass
class ProfileSummary:
    """What a profiling run computed: the agent metrics objects and counts."""

    agent_metrics: list[dict] = field(default_factory=list)
    num_tasks: int = 0
    num_rollouts: int = 0
    max_rollouts_per_task: int = 0
    unmatched_rollouts: int = 0
    unreadable_lines: int = 0
    reward_profiling_path: Optional[Path] = None
    agent_metrics_path: Optional[Path] = None
    # ok / incomplete / failed over the whole file and its failures sidecar, with the reasons.
    outcomes: OutcomeCounts = field(default_factory=OutcomeCounts)
    # Per agent (its name, None for rows without one): ok / incomplete / failed; agents whose rollouts all failed
    # are here and not in `agent_metrics`.
    agent_outcomes: dict[Optional[str], dict[str, int]] = field(default_factory=dict)


def _profile_core(
    materialized_rows: Iterable[Mapping[str, Any]],
    rollouts: Iterable[Mapping[str, Any]],
    *,
    pass_threshold: float,
    write_task_line: Callable[[dict], None],
    summary: ProfileSummary,
    spill_after: int = DEFAULT_SPILL_AFTER,
    failures: Iterable[Mapping[str, Any]] = (),
) -> None:
    store = _TaskRollouts(spill_after)
    values = _ValueCounts(spill_after)
    try:
        _profile_stores(
            materialized_rows, rollouts, pass_threshold, write_task_line, summary, store, values, failures
        )
    finally:
        store.close()
        values.close()


def _profile_stores(
    materialized_rows: Iterable[Mapping[str, Any]],
    rollouts: Iterable[Mapping[str, Any]],
    pass_threshold: float,
    write_task_line: Callable[[dict], None],
    summary: ProfileSummary,
    store: _TaskRollouts,
    values: _ValueCounts,
    failures: Iterable[Mapping[str, Any]] = (),
) -> None:
    # 1. Rollouts -> their numeric fields, grouped by task, and their outcomes; then the failures sidecar's.
    outcomes = _TaskOutcomes()
    failed_keys: set[tuple[int, int]] = set()  # a failed rollout is counted once, here or in the sidecar
    for rollout in rollouts:
        task = rollout.get(TASK_INDEX_KEY_NAME)
        if not isinstance(task, int) or isinstance(task, bool):
            summary.unreadable_lines += 1
            continue
        store.add(task, rollout_numeric_fields(rollout))
        outcome = rollout_outcome(rollout)
        summary.outcomes.add(outcome)
        outcomes.add(task, outcome.kind)
        key = failure_key(rollout) if outcome.kind == FAILED else None
        if key is not None:
            failed_keys.add(key)
    failed_by_agent = _count_failures(failures, summary, failed_keys)
    summary.agent_outcomes = {agent: {**dict.fromkeys(OUTCOMES, 0), FAILED: k} for agent, k in failed_by_agent.items()}
    n = store.count
    summary.num_rollouts = n
    if n == 0:
        return
    fields = store.fields

    # 2. File-wide facts needed before the first line, in one pass over the tasks: the most rewarded rollouts of a
    #    task (pass@k range) and the fields whose std is defined somewhere (the std rule).
    reward_id = store.field_ids.get(REWARD_KEY)
    max_k = 0
    std_defined: set[str] = set()
    for _, rows in store.groups():
        counts = [0] * len(fields)
        for row in rows:
            for i, v in enumerate(row):
                if v == v:  # not NaN
                    counts[i] += 1
        if reward_id is not None:
            max_k = max(max_k, counts[reward_id])
        std_defined.update(fields[i] for i, c in enumerate(counts) if c >= 2)
    summary.max_rollouts_per_task = max_k
    task_std_zero = set(fields) - std_defined
    ks = range(1, max_k + 1) if max_k >= 2 else range(0)

    # 3. Stream the inputs; each task's line is written at its first row.
    emitted = _TaskSet(store.max_task + 1)
    agents: dict[Optional[str], _AgentAccumulator] = {}
    matched = 0
    for row in materialized_rows:
        task = row.get(TASK_INDEX_KEY_NAME)
        if not isinstance(task, int) or task < 0 or task > store.max_task or task in emitted:
            continue
        emitted.add(task)
        rows = store.lookup(task)
        if not rows:
            continue
        matched += len(rows)
        field_values = _field_values(rows, fields)
        metrics: dict[str, Any] = {TASK_INDEX_KEY_NAME: task, "num_rollouts": len(rows)}
        metrics.update(stat_keys({name: summary_stats(vals) for name, vals in field_values.items()}))
        pass_mean: dict[int, tuple[float, float]] = {}
        rewards = field_values.get(REWARD_KEY, [])
        if ks and rewards:
            passed = sum(1 for r in rewards if r >= pass_threshold)
            mean_reward = statistics.fmean(rewards)
            for k in ks:
                if k <= len(rewards):
                    pass_mean[k] = (pass_at_k(len(rewards), passed, k), mean_reward)
            for k, (p, _) in pass_mean.items():
                metrics[f"pass@{k}"] = p
            for k, (_, m) in pass_mean.items():
                metrics[f"mean@{k}"] = m
        metrics["sample"] = {k: v for k, v in row.items() if k not in INDEX_KEYS}
        write_task_line(_drop_undefined(metrics, task_std_zero))
        summary.num_tasks += 1

        ref = row.get("agent_ref")
        agent = ref.get("name") if isinstance(ref, Mapping) else None
        acc = agents.get(agent)
        if acc is None:
            acc = agents[agent] = _AgentAccumulator(len(agents))
        acc.add(field_values, len(rows), pass_mean, values, store.field_ids)
        for kind, count in outcomes.get(task).items():
            acc.outcomes[kind] += count
    summary.unmatched_rollouts = n - matched

    # 4. Per-agent metrics (the std rule again, across agents).
    raw: list[dict[str, Any]] = []
    agent_std_defined: set[str] = set()
    for agent, acc in agents.items():
        stats = {name: counted_stats(values.sorted_counts((acc.index, store.field_ids[name]))) for name in acc.counts}
        agent_std_defined.update(name for name, s in stats.items() if not math.isnan(s["std"]))
        metrics = {"agent_ref": {"name": agent}, "num_tasks": acc.num_tasks, "num_rollouts": acc.num_rollouts}
        acc.outcomes[FAILED] += failed_by_agent.get(agent, 0)
        metrics.update({f"num_{kind}": acc.outcomes[kind] for kind in OUTCOMES})
        metrics.update(stat_keys(stats))
        for k in sorted(acc.pass_sums):
            metrics[f"pass@{k}"] = acc.pass_sums[k][0] / acc.pass_sums[k][2]
        for k in sorted(acc.pass_sums):
            metrics[f"mean@{k}"] = acc.pass_sums[k][1] / acc.pass_sums[k][2]
        raw.append(metrics)
    all_fields = set().union(*(acc.counts.keys() for acc in agents.values())) if agents else set()
    agent_std_zero = all_fields - agent_std_defined
    summary.agent_metrics = [_drop_undefined(m, agent_std_zero) for m in raw]
    summary.agent_outcomes.update({agent: dict(acc.outcomes) for agent, acc in agents.items()})


def _count_failures(
    failures: Iterable[Mapping[str, Any]], summary: ProfileSummary, seen: set[tuple[int, int]]
) -> dict[Optional[str], int]:
    """Count the failures sidecar's rollouts into `summary.outcomes`, once per (task, rollout) however many attempt
    lines it has (the first line's error type) and not again when `seen` (counted already); returns them per agent
    (the one each line names)."""
    by_agent: dict[Optional[str], int] = {}
    for record in failures:
        key = failure_key(record)
        if key is not None:
            if key in seen:
                continue
            seen.add(key)
        summary.outcomes.add(failure_outcome(record))
        agent = failure_agent(record)
        by_agent[agent] = by_agent.get(agent, 0) + 1
    return by_agent


class _TaskSet:
    """The task indices 0..size-1 already written: one bit each (a set for absurd index ranges)."""

    _MAX_BITS = 1 << 27  # 16 MB

    def __init__(self, size: int) -> None:
        self._bits = bytearray((max(0, size) + 7) // 8) if size <= self._MAX_BITS else None
        self._set: set[int] = set()

    def __contains__(self, task: int) -> bool:
        if self._bits is None:
            return task in self._set
        return bool(self._bits[task >> 3] & (1 << (task & 7)))

    def add(self, task: int) -> None:
        if self._bits is None:
            self._set.add(task)
        else:
            self._bits[task >> 3] |= 1 << (task & 7)


def compute_profile(
    materialized_rows: Iterable[Mapping[str, Any]],
    rollouts: Iterable[Mapping[str, Any]],
    *,
    pass_threshold: float = 1.0,
    spill_after: int = DEFAULT_SPILL_AFTER,
    failures: Iterable[Mapping[str, Any]] = (),
) -> tuple[list[dict], list[dict]]:
    """(per-task lines, per-agent metrics) for materialized input rows and rollout rows (and the lines of a failures
    sidecar, for `num_failed`), as lists. `spill_after`: rollouts kept in memory before they move to a temporary
    SQLite file (see the module's Memory note)."""
    lines: list[dict] = []
    summary = ProfileSummary()
    _profile_core(
        materialized_rows,
        rollouts,
        pass_threshold=pass_threshold,
        write_task_line=lines.append,
        summary=summary,
        spill_after=spill_after,
        failures=failures,
    )
    return lines, summary.agent_metrics


def _default_path(rollouts_path: Path, suffix: str, ext: str) -> Path:
    return rollouts_path.with_name(f"{rollouts_path.stem}{suffix}{ext}")


def profile_rollouts(
    materialized_inputs_path: Path,
    rollouts_path: Path,
    *,
    pass_threshold: float = 1.0,
    reward_profiling_path: Optional[Path] = None,
    agent_metrics_path: Optional[Path] = None,
    spill_after: int = DEFAULT_SPILL_AFTER,
    failures_path: Optional[Path] = None,
) -> ProfileSummary:
    """Profile files: write `<rollouts stem>_reward_profiling.jsonl` and `<rollouts stem>_agent_metrics.json`. The
    failed rollouts are read from `failures_path` (default `<rollouts stem>_failures.jsonl`) when it exists."""
    materialized_inputs_path = Path(materialized_inputs_path)
    rollouts_path = Path(rollouts_path)
    failures_path = Path(failures_path or failures_path_for(rollouts_path))
    reward_profiling_path = Path(reward_profiling_path or _default_path(rollouts_path, "_reward_profiling", ".jsonl"))
    agent_metrics_path = Path(agent_metrics_path or _default_path(rollouts_path, "_agent_metrics", ".json"))
    summary = ProfileSummary(reward_profiling_path=reward_profiling_path, agent_metrics_path=agent_metrics_path)

    def bad() -> None:
        summary.unreadable_lines += 1

    first_bad: list[str] = []

    def bad_at(where: str) -> None:
        if not first_bad:
            first_bad.append(where)

    with open(reward_profiling_path, "wb") as out:

        def write(line: dict) -> None:
            out.write(orjson.dumps(line, option=orjson.OPT_SERIALIZE_NUMPY) + b"\n")

        _profile_core(
            iter_jsonl_objects(materialized_inputs_path, bad, bad_at),
            iter_jsonl_objects(rollouts_path, bad, bad_at),
            pass_threshold=pass_threshold,
            write_task_line=write,
            summary=summary,
            spill_after=spill_after,
            failures=iter_jsonl_objects(failures_path, bad, bad_at) if failures_path.is_file() else (),
        )
    agent_metrics_path.write_bytes(orjson.dumps(summary.agent_metrics, option=orjson.OPT_INDENT_2) + b"\n")
    if summary.unreadable_lines:
        first = f" (the first: {first_bad[0]})" if first_bad else ""
        sys.stderr.write(
            f"Warning: {summary.unreadable_lines} unreadable line(s) were skipped while profiling{first}.\n"
        )
    if summary.unmatched_rollouts:
        sys.stderr.write(
            f"Warning: {summary.unmatched_rollouts} rollout(s) have no input row in {materialized_inputs_path}; "
            f"they are not in the profile.\n"
        )
    return summary


def profile_collection(paths: Any, *, pass_threshold: float = 1.0, describe: bool = True) -> ProfileSummary:
    """The profile a collection ends with (`ng_collect_rollouts`, and `ng merge` for merged shards): profile
    `paths.output` (and `paths.failures`) against `paths.materialized_inputs` into `paths.reward_profiling` and
    `paths.agent_metrics` (a `collection.CollectionPaths`) and print the table (`describe`: and the outcome
    sentence under it; the collector prints its own)."""
    summary = profile_rollouts(
        paths.materialized_inputs,
        paths.output,
        pass_threshold=pass_threshold,
        reward_profiling_path=paths.reward_profiling,
        agent_metrics_path=paths.agent_metrics,
        failures_path=paths.failures,
    )
    print_profile_table(summary, describe=describe)
    return summary


# --------------------------------------------------------------------------------------------------------
# Output


def _fmt(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.4g}" if abs(value) >= 1000 else f"{value:.3f}"
    return str(value)


def print_profile_table(summary: ProfileSummary, console: Any = None, *, describe: bool = True) -> None:
    """A short per-agent table: tasks, rollouts, the outcome counts (ok / incomplete / failed), mean/median/std
    reward, pass@1 and pass@k, mean tokens; with `describe`, the outcome sentence under it (`OutcomeCounts`)."""
    from rich.console import Console
    from rich.table import Table

    if console is None:
        console = Console()
        if not console.is_terminal:  # logs and pipes: do not squeeze the table into 80 columns
            console = Console(width=160)
    if not summary.agent_metrics and not summary.agent_outcomes:
        console.print("Reward profile: no rollouts to profile.")
        return
    table = Table(title="Reward profile", title_justify="left")
    k = summary.max_rollouts_per_task
    headers = ["agent", "tasks", "rollouts", OK, INCOMPLETE, FAILED, "mean reward", "median", "std"]
    if k >= 2:
        headers += ["pass@1", f"pass@{k}"]
    has_tokens = any("mean/total_tokens" in m for m in summary.agent_metrics)
    if has_tokens:
        headers.append("mean tokens")
    for i, h in enumerate(headers):
        table.add_column(h, justify="left" if i == 0 else "right")
    profiled = set()
    for m in summary.agent_metrics:
        name = m["agent_ref"]["name"]
        profiled.add(name)
        counts = summary.agent_outcomes.get(name) or {kind: m.get(f"num_{kind}") for kind in OUTCOMES}
        cells = [
            str(name),
            str(m["num_tasks"]),
            str(m["num_rollouts"]),
            *(_fmt(counts.get(kind)) for kind in OUTCOMES),
            _fmt(m.get(f"mean/{REWARD_KEY}")),
            _fmt(m.get(f"median/{REWARD_KEY}")),
            _fmt(m.get(f"std/{REWARD_KEY}")),
        ]
        if k >= 2:
            cells += [_fmt(m.get("pass@1")), _fmt(m.get(f"pass@{k}"))]
        if has_tokens:
            cells.append(_fmt(m.get("mean/total_tokens")))
        table.add_row(*cells)
    for name, counts in summary.agent_outcomes.items():  # agents whose rollouts all failed: counts, no statistics
        if name not in profiled:
            cells = [str(name), "0", "0", *(_fmt(counts.get(kind)) for kind in OUTCOMES)]
            table.add_row(*cells, *["-"] * (len(headers) - len(cells)))
    console.print(table)
    if describe:
        console.print(summary.outcomes.describe() + ".", highlight=False)
        if summary.outcomes.incomplete:
            console.print(INCOMPLETE_NOTE, highlight=False)
