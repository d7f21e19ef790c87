"""Reward profiling: per-task and per-agent statistics of collected rollouts (`ng_reward_profile`).

Files (NeMo Gym v0.2 names and keys, section 5.5 of the reference):

- `<rollouts stem>_reward_profiling.jsonl`: one line per task, in task order, with `mean/F`, `max/F`, `min/F`,
  `median/F` and `std/F` for every numeric field F of its rollouts, and `sample` (the task's materialized input
  row without `_ng_task_index` / `_ng_rollout_index`). We add `_ng_task_index` and `num_rollouts`.
- `<rollouts stem>_agent_metrics.json`: a JSON array, one object per agent: the same statistics over all of the
  agent's rollouts, `agent_ref: {"name": ...}`, plus `num_tasks` and `num_rollouts`.

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

Memory: rollouts are read as a stream and only their numeric fields are kept, in columns of 8-byte floats; input
rows are streamed from the materialized-inputs file and each task's line is written as soon as it is reached.
"""

from __future__ import annotations

import math
import statistics
import sys
from array import array
from bisect import bisect_left, bisect_right
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping, Optional

import orjson
from pydantic import Field

from nemo_gym.rollouts.jsonl import iter_jsonl_objects
from nemo_gym.config.types import BaseNeMoGymCLIConfig

__all__ = [
    "RewardProfileConfig",
    "ProfileSummary",
    "STATS",
    "rollout_numeric_fields",
    "summary_stats",
    "pass_at_k",
    "compute_profile",
    "profile_rollouts",
    "print_profile_table",
]

TASK_INDEX_KEY_NAME = "_ng_task_index"
ROLLOUT_INDEX_KEY_NAME = "_ng_rollout_index"
INDEX_KEYS = (TASK_INDEX_KEY_NAME, ROLLOUT_INDEX_KEY_NAME)
STATS = ("mean", "max", "min", "median", "std")
REWARD_KEY = "reward"
_NAN = float("nan")


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


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def rollout_numeric_fields(rollout: Mapping[str, Any]) -> dict[str, float]:
    """The numeric fields of one rollout: top-level numbers and bools (as 0/1) plus the top-level numbers of
    `response.usage`; nested values and the index keys are dropped."""
    merged: dict[str, Any] = dict(rollout)
    response = rollout.get("response")
    if isinstance(response, Mapping):
        usage = response.get("usage")
        if isinstance(usage, Mapping):
            merged.update(usage)
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
# Columnar store of the rollouts' numeric fields


class _Columns:
    """Numeric fields of every rollout as columns of 8-byte floats (NaN = absent), plus the task index."""

    def __init__(self) -> None:
        self.tasks = array("q")
        self.cols: dict[str, array] = {}

    def __len__(self) -> int:
        return len(self.tasks)

    def add(self, task: int, values: Mapping[str, float]) -> None:
        n = len(self.tasks)
        self.tasks.append(task)
        cols = self.cols
        for name, value in values.items():
            col = cols.get(name)
            if col is None:
                col = cols[name] = array("d", [_NAN]) * n
            col.append(value)
        if len(values) < len(cols):
            for col in cols.values():
                if len(col) == n:
                    col.append(_NAN)


def _group_values(col: array, idx: Iterable[int]) -> list[float]:
    out = []
    for i in idx:
        v = col[i]
        if v == v:  # not NaN
            out.append(v)
    return out


def _stat_keys(stats_by_field: Mapping[str, Mapping[str, float]]) -> dict[str, float]:
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


@dataclass
class _AgentAccumulator:
    values: dict[str, array] = field(default_factory=dict)
    num_tasks: int = 0
    num_rollouts: int = 0
    pass_sums: dict[int, list[float]] = field(default_factory=dict)  # k -> [sum of pass@k, sum of mean@k, n]

    def add(
        self,
        field_values: Mapping[str, list[float]],
        num_rollouts: int,
        pass_mean: Mapping[int, tuple[float, float]],
    ) -> None:
        self.num_tasks += 1
        self.num_rollouts += num_rollouts
        for name, vals in field_values.items():
            col = self.values.get(name)
            if col is None:
                col = self.values[name] = array("d")
            col.extend(vals)
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


def _profile_core(
    materialized_rows: Iterable[Mapping[str, Any]],
    rollouts: Iterable[Mapping[str, Any]],
    *,
    pass_threshold: float,
    write_task_line: Callable[[dict], None],
    summary: ProfileSummary,
) -> None:
    # 1. Rollouts -> numeric columns.
    columns = _Columns()
    for rollout in rollouts:
        task = rollout.get(TASK_INDEX_KEY_NAME)
        if not isinstance(task, int) or isinstance(task, bool):
            summary.unreadable_lines += 1
            continue
        columns.add(task, rollout_numeric_fields(rollout))
    n = len(columns)
    summary.num_rollouts = n
    if n == 0:
        return

    # 2. Group by task: a permutation sorted by task index, searched with bisect.
    tasks = columns.tasks
    order = array("q", sorted(range(n), key=tasks.__getitem__))
    sorted_tasks = array("q", (tasks[i] for i in order))
    reward_col = columns.cols.get(REWARD_KEY)

    # 3. File-wide facts needed before the first line: the most rewarded rollouts of a task (pass@k range) and
    #    the fields whose std is defined somewhere (the std rule).
    max_k = 0
    std_defined: set[str] = set()
    lo = 0
    while lo < n:
        hi = bisect_right(sorted_tasks, sorted_tasks[lo], lo)
        idx = order[lo:hi]
        if reward_col is not None:
            max_k = max(max_k, len(_group_values(reward_col, idx)))
        for name, col in columns.cols.items():
            if name not in std_defined and len(_group_values(col, idx)) >= 2:
                std_defined.add(name)
        lo = hi
    summary.max_rollouts_per_task = max_k
    task_std_zero = set(columns.cols) - std_defined
    ks = range(1, max_k + 1) if max_k >= 2 else range(0)

    # 4. Stream the inputs; each task's line is written at its first row.
    emitted = bytearray(sorted_tasks[-1] + 1)
    agents: dict[Optional[str], _AgentAccumulator] = {}
    matched = 0
    for row in materialized_rows:
        task = row.get(TASK_INDEX_KEY_NAME)
        if not isinstance(task, int) or task < 0 or task >= len(emitted) or emitted[task]:
            continue
        emitted[task] = 1
        lo = bisect_left(sorted_tasks, task)
        hi = bisect_right(sorted_tasks, task, lo)
        if lo == hi:
            continue
        idx = order[lo:hi]
        matched += hi - lo
        field_values = {name: _group_values(col, idx) for name, col in columns.cols.items()}
        field_values = {name: vals for name, vals in field_values.items() if vals}
        metrics: dict[str, Any] = {TASK_INDEX_KEY_NAME: task, "num_rollouts": hi - lo}
        metrics.update(_stat_keys({name: summary_stats(vals) for name, vals in field_values.items()}))
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
            acc = agents[agent] = _AgentAccumulator()
        acc.add(field_values, hi - lo, pass_mean)
    summary.unmatched_rollouts = n - matched

    # 5. Per-agent metrics (the std rule again, across agents).
    raw: list[dict[str, Any]] = []
    agent_std_defined: set[str] = set()
    for agent, acc in agents.items():
        stats = {name: summary_stats(vals) for name, vals in acc.values.items()}
        agent_std_defined.update(name for name, s in stats.items() if not math.isnan(s["std"]))
        metrics = {"agent_ref": {"name": agent}, "num_tasks": acc.num_tasks, "num_rollouts": acc.num_rollouts}
        metrics.update(_stat_keys(stats))
        for k in sorted(acc.pass_sums):
            metrics[f"pass@{k}"] = acc.pass_sums[k][0] / acc.pass_sums[k][2]
        for k in sorted(acc.pass_sums):
            metrics[f"mean@{k}"] = acc.pass_sums[k][1] / acc.pass_sums[k][2]
        raw.append(metrics)
    all_fields = set().union(*(acc.values.keys() for acc in agents.values())) if agents else set()
    agent_std_zero = all_fields - agent_std_defined
    summary.agent_metrics = [_drop_undefined(m, agent_std_zero) for m in raw]


def compute_profile(
    materialized_rows: Iterable[Mapping[str, Any]],
    rollouts: Iterable[Mapping[str, Any]],
    *,
    pass_threshold: float = 1.0,
) -> tuple[list[dict], list[dict]]:
    """In memory: (per-task lines, per-agent metrics) for materialized input rows and rollout rows."""
    lines: list[dict] = []
    summary = ProfileSummary()
    _profile_core(
        materialized_rows, rollouts, pass_threshold=pass_threshold, write_task_line=lines.append, summary=summary
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
) -> ProfileSummary:
    """Profile files: write `<rollouts stem>_reward_profiling.jsonl` and `<rollouts stem>_agent_metrics.json`."""
    materialized_inputs_path = Path(materialized_inputs_path)
    rollouts_path = Path(rollouts_path)
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


# --------------------------------------------------------------------------------------------------------
# Output


def _fmt(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.4g}" if abs(value) >= 1000 else f"{value:.3f}"
    return str(value)


def print_profile_table(summary: ProfileSummary, console: Any = None) -> None:
    """A short per-agent table: tasks, rollouts, mean/median/std reward, pass@1 and pass@k, mean tokens."""
    from rich.console import Console
    from rich.table import Table

    if console is None:
        console = Console()
        if not console.is_terminal:  # logs and pipes: do not squeeze the table into 80 columns
            console = Console(width=160)
    table = Table(title="Reward profile", title_justify="left")
    k = summary.max_rollouts_per_task
    headers = ["agent", "tasks", "rollouts", "mean reward", "median", "std"]
    if k >= 2:
        headers += ["pass@1", f"pass@{k}"]
    has_tokens = any("mean/total_tokens" in m for m in summary.agent_metrics)
    if has_tokens:
        headers.append("mean tokens")
    for i, h in enumerate(headers):
        table.add_column(h, justify="left" if i == 0 else "right")
    for m in summary.agent_metrics:
        cells = [
            str(m["agent_ref"]["name"]),
            str(m["num_tasks"]),
            str(m["num_rollouts"]),
            _fmt(m.get(f"mean/{REWARD_KEY}")),
            _fmt(m.get(f"median/{REWARD_KEY}")),
            _fmt(m.get(f"std/{REWARD_KEY}")),
        ]
        if k >= 2:
            cells += [_fmt(m.get("pass@1")), _fmt(m.get(f"pass@{k}"))]
        if has_tokens:
            cells.append(_fmt(m.get("mean/total_tokens")))
        table.add_row(*cells)
    if not summary.agent_metrics:
        console.print("Reward profile: no rollouts to profile.")
        return
    console.print(table)

