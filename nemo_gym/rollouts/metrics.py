"""Metrics over verify responses: pass@k, majority@k, subsets, and `/aggregate_metrics` (NeMo Gym v0.5 names).

The helpers take *tasks*: `tasks[i]` is the list of results (verify responses) of task i in rollout order. Each
result is scored by `score_fn(result) -> {name: number or bool}` (default `{"accuracy": result["reward"]}`; bools
count 0/1). Accuracy-like metrics are percentages (0-100), keyed `<metric>/<score name>`:

- `pass@{k}/N`: per task with at least k values, the unbiased pass@k estimate over *all* its n values when they
  are all 0 or 1 (`reward_profile.pass_at_k`, the one estimator of the project), else the best of the first k;
- `pass@1[avg-of-{k}]/N`: per task, the mean of its first k values (fewer if it has fewer);
- `majority@{k}/N` (with `answer_key`): among the first k rollouts, those with an answer; the most frequent
  (answer, score) pair wins (ties: the mean of the tied pairs' scores; no answer at all: 0);
- `per_sample_aggregate`: per score name, the mean of rollout i over the tasks that have it, for each i;
- `pass@1[avg-of-{k}]/N/std_dev_across_runs` and `.../std_err_across_runs`: the spread of those run means.

`compute_aggregate_metrics` is the body of `POST /aggregate_metrics`: the reward profile of the responses
(`reward_profile.RewardProfiler`) plus the server's own `compute_metrics`. Answers never hold NaN or infinities
(the NaN rule of `reward_profile`; what a custom `compute_metrics` returns is cleaned the same way), so they are
valid JSON.
"""

from __future__ import annotations

import asyncio
import json
import math
import re
import statistics
from collections import Counter
from typing import Any, Callable, Hashable, Mapping, Optional, Sequence, Union

from nemo_gym.config.types import AggregateMetrics, AggregateMetricsRequest
from nemo_gym.rollouts.reward_profile import (
    REWARD_KEY,
    ROLLOUT_INDEX_KEY_NAME,
    TASK_INDEX_KEY_NAME,
    RewardProfiler,
    pass_at_k,
    rollout_numeric_fields,
)

__all__ = [
    "AggregateMetricsMixin",
    "compute_aggregate_metrics",
    "compute_pass_majority_metrics",
    "add_avg_sample_std_dev",
    "compute_subset_metrics",
    "highest_k_metrics",
    "default_key_metrics",
]

ScoreFn = Callable[[dict], Mapping[str, Union[float, int, bool]]]
Tasks = Sequence[Sequence[Mapping[str, Any]]]

NO_ANSWER = "no_answer"
PER_SAMPLE_AGGREGATE = "per_sample_aggregate"
PER_TASK_METRICS = "per_task_metrics"
# The `sample` of every group row: `/aggregate_metrics` sees verify responses, not input rows.
AGENT_NAME = "agent"
_SPREAD_SUFFIXES = ("std_dev_across_runs", "std_err_across_runs", "avg_sample_std_dev")
# Fewer verify responses than this are aggregated on the event loop (a thread costs more than the work).
_INLINE_ROLLOUTS = 2000


# --------------------------------------------------------------------------------------------------------
# Scores


def _default_score(result: Mapping[str, Any]) -> dict[str, Any]:
    if REWARD_KEY not in result:
        raise ValueError(
            f"a result has no '{REWARD_KEY}' (its keys: {sorted(result)}); pass score_fn= to score results without one"
        )
    return {"accuracy": result[REWARD_KEY]}


def _as_score(name: str, value: Any) -> float:
    if isinstance(value, bool):
        return 1.0 if value else 0.0
    if isinstance(value, (int, float)):
        return float(value)
    raise TypeError(f"score {name!r} is a {type(value).__name__} ({value!r}); score_fn must return numbers or bools")


def _score_dict(result: Mapping[str, Any], score_fn: Optional[ScoreFn], answer_key: Optional[str]) -> dict[str, float]:
    scores = {name: _as_score(name, v) for name, v in (score_fn or _default_score)(result).items()}
    if answer_key is not None:
        scores[NO_ANSWER] = 1.0 if result.get(answer_key) is None else 0.0
    return scores


def _values(task_scores: Sequence[Mapping[str, float]], name: str) -> list[float]:
    """One task's values of one score, in rollout order (rollouts whose score_fn left the name out skipped)."""
    return [scores[name] for scores in task_scores if name in scores]


def _percent_mean(values: list[float]) -> Optional[float]:
    return 100.0 * statistics.fmean(values) if values else None


# --------------------------------------------------------------------------------------------------------
# Per-task estimates


def _task_pass_at_k(values: list[float], k: int) -> float:
    """pass@k of one task with at least k values: unbiased over all of them for 0/1 scores, else best of first k."""
    if all(v in (0.0, 1.0) for v in values):
        return pass_at_k(len(values), sum(1 for v in values if v == 1.0), k)
    return max(values[:k])


def _answer_key(answer: Any) -> Hashable:
    """The answer as a dict key (lists and dicts compared by their JSON)."""
    try:
        hash(answer)
        return answer
    except TypeError:
        return json.dumps(answer, sort_keys=True, default=str)


def _majority_score(answers: Sequence[Any], task_scores: Sequence[Mapping[str, float]], name: str, k: int) -> float:
    """majority@k of one task: the first k rollouts that have an answer vote with their (answer, score) pair."""
    pairs = [
        (_answer_key(answer), scores[name])
        for answer, scores in zip(answers[:k], task_scores[:k])
        if answer is not None and name in scores
    ]
    if not pairs:
        return 0.0
    counts = Counter(pairs)
    top = max(counts.values())
    return statistics.fmean(score for (_, score), count in counts.items() if count == top)


# --------------------------------------------------------------------------------------------------------
# pass@k / majority@k over tasks


def compute_pass_majority_metrics(
    tasks: Tasks, score_fn: Optional[ScoreFn] = None, answer_key: Optional[str] = None
) -> tuple[dict[str, Any], list[list[dict[str, float]]], list[str], int]:
    """(metrics, all_score_dicts, score_names, max_k): the metrics of the module docstring for k = 1 .. max_k (the
    most rollouts of a task); `all_score_dicts[i][j]` = the scores of rollout j of task i (with `answer_key`, plus
    `no_answer`: 1 when the result's answer is None). No tasks: `({}, [], [], 0)`."""
    if not tasks:
        return {}, [], [], 0
    all_score_dicts = [[_score_dict(result, score_fn, answer_key) for result in task] for task in tasks]
    score_names = sorted({name for task in all_score_dicts for scores in task for name in scores})
    max_k = max(len(task) for task in tasks)
    if max_k == 0:
        return {}, all_score_dicts, score_names, 0
    values = {name: [_values(task, name) for task in all_score_dicts] for name in score_names}
    answers = [[result.get(answer_key) for result in task] for task in tasks] if answer_key is not None else None

    metrics: dict[str, Any] = {}
    for k in range(1, max_k + 1):
        for name in score_names:
            per_task = values[name]
            _put(metrics, f"pass@{k}/{name}", _percent_mean([_task_pass_at_k(v, k) for v in per_task if len(v) >= k]))
            _put(metrics, f"pass@1[avg-of-{k}]/{name}", _percent_mean([statistics.fmean(v[:k]) for v in per_task if v]))
            if answers is not None:
                majority = [_majority_score(a, s, name, k) for a, s in zip(answers, all_score_dicts)]
                metrics[f"majority@{k}/{name}"] = 100.0 * statistics.fmean(majority)
    per_sample = _per_sample_aggregate(values, max_k)
    metrics[PER_SAMPLE_AGGREGATE] = per_sample
    _add_spread_across_runs(metrics, per_sample, max_k)
    return metrics, all_score_dicts, score_names, max_k


def _put(metrics: dict[str, Any], key: str, value: Optional[float]) -> None:
    if value is not None:
        metrics[key] = value


def _per_sample_aggregate(values: Mapping[str, list[list[float]]], max_k: int) -> dict[str, list[float]]:
    """Per score name, run i = 100 x the mean of value i over the tasks that have one (names with no run left out)."""
    out: dict[str, list[float]] = {}
    for name, per_task in values.items():
        runs = [_percent_mean([v[i] for v in per_task if len(v) > i]) for i in range(max_k)]
        runs = [run for run in runs if run is not None]
        if runs:
            out[name] = runs
    return out


def _add_spread_across_runs(metrics: dict[str, Any], per_sample: Mapping[str, list[float]], max_k: int) -> None:
    """For k = 2 .. max_k: the sample std of the first k run means, and that over sqrt(number of runs)."""
    for k in range(2, max_k + 1):
        for name, runs in per_sample.items():
            runs = runs[:k]
            if len(runs) >= 2:
                std = statistics.stdev(runs)
                metrics[f"pass@1[avg-of-{k}]/{name}/std_dev_across_runs"] = std
                metrics[f"pass@1[avg-of-{k}]/{name}/std_err_across_runs"] = std / math.sqrt(len(runs))


def add_avg_sample_std_dev(
    metrics: dict[str, Any],
    all_score_dicts: Sequence[Sequence[Mapping[str, float]]],
    score_names: Sequence[str],
    max_k: int,
) -> None:
    """In place, for k = 2 .. max_k: `pass@1[avg-of-{k}]/N/avg_sample_std_dev` = the mean, over tasks with at least
    2 values among their first k rollouts, of the sample std of those values. Raw score units (not percent)."""
    for k in range(2, max_k + 1):
        for name in score_names:
            firsts = [_values(task[:k], name) for task in all_score_dicts]
            stds = [statistics.stdev(v) for v in firsts if len(v) >= 2]
            if stds:
                metrics[f"pass@1[avg-of-{k}]/{name}/avg_sample_std_dev"] = statistics.fmean(stds)


def compute_subset_metrics(
    tasks: Tasks, subset_key: str, score_fn: Optional[ScoreFn] = None, answer_key: Optional[str] = None
) -> dict[str, Any]:
    """`compute_pass_majority_metrics` per subset (the value of `subset_key` in a task's first result; tasks where it
    is missing or falsy are left out), keys prefixed `"<value>/"`, without `per_sample_aggregate`."""
    subsets: dict[Any, list[Sequence[Mapping[str, Any]]]] = {}
    for task in tasks:
        value = task[0].get(subset_key) if task else None
        if value:
            subsets.setdefault(_answer_key(value), []).append(task)
    out: dict[str, Any] = {}
    for value, subset in subsets.items():
        metrics = compute_pass_majority_metrics(subset, score_fn=score_fn, answer_key=answer_key)[0]
        metrics.pop(PER_SAMPLE_AGGREGATE, None)
        out.update({f"{value}/{key}": metric for key, metric in metrics.items()})
    return out


def highest_k_metrics(
    agent_metrics: Mapping[str, Any],
    pattern: str,
    score_names: Optional[Sequence[str]] = None,
    exclude_names: Optional[Sequence[str]] = None,
) -> dict[str, Any]:
    """The entries `<pattern with k = digits>/<name>` of the largest k present, e.g. `pattern="pass@{k}"` -> every
    `pass@5/<name>` when 5 is the largest k. Spread entries (std_dev/std_err across runs, avg_sample_std_dev) are
    skipped; `score_names` keeps only those names, `exclude_names` drops names. Subset-prefixed keys never match."""
    regex = _k_pattern(pattern)
    found: dict[str, tuple[int, Any]] = {}
    for key, value in agent_metrics.items():
        match = regex.fullmatch(key)
        if match is None:
            continue
        name = match.group("name")
        if name.endswith(_SPREAD_SUFFIXES):
            continue
        if score_names is not None and name not in score_names:
            continue
        if exclude_names is not None and name in exclude_names:
            continue
        found[key] = (int(match.group("k")), value)
    if not found:
        return {}
    top = max(k for k, _ in found.values())
    return {key: value for key, (k, value) in found.items() if k == top}


def _k_pattern(pattern: str) -> re.Pattern[str]:
    """`pattern` as an anchored regex: `{k}` -> digits (the same digits wherever it repeats), then `/<name>`."""
    parts = pattern.split("{k}")
    if len(parts) < 2:
        raise ValueError(f"highest_k_metrics: pattern {pattern!r} has no '{{k}}' placeholder (e.g. 'pass@{{k}}')")
    body = re.escape(parts[0]) + r"(?P<k>\d+)" + re.escape(parts[1])
    body += "".join(r"(?P=k)" + re.escape(part) for part in parts[2:])
    return re.compile(body + r"/(?P<name>.+)")


# --------------------------------------------------------------------------------------------------------
# POST /aggregate_metrics


def default_key_metrics(agent_metrics: Mapping[str, Any]) -> dict[str, Any]:
    """The metrics printed by default: every `mean/*`."""
    return {key: value for key, value in agent_metrics.items() if key.startswith("mean/")}


def compute_aggregate_metrics(
    verify_responses: Sequence[Mapping[str, Any]],
    compute_metrics_fn: Optional[Callable[[list[list[dict]]], dict]] = None,
    get_key_metrics_fn: Optional[Callable[[dict], dict]] = None,
) -> AggregateMetrics:
    """The `/aggregate_metrics` answer for verify responses (each with `_ng_task_index` / `_ng_rollout_index`, 0
    when missing; a pair may occur once, else `ValueError`):

    - `agent_metrics`: `mean/max/min/median/std` of every numeric field over all responses, then what
      `compute_metrics_fn(tasks)` returns (it wins on equal keys), less its `per_task_metrics`;
    - `group_level_metrics`: one row per task, in task order: the same statistics over its rollouts, `sample`,
      completion counts, `rollout_infos` and `_ng_task_index`, updated with its `per_task_metrics` entry;
    - `key_metrics = get_key_metrics_fn(agent_metrics)` (default: every `mean/*`)."""
    if not verify_responses:
        return AggregateMetrics()
    tasks = _group_by_task(verify_responses)
    per_task_stats, overall = RewardProfiler().profile(
        {task: [response for _, response in rollouts] for task, rollouts in tasks.items()}
    )
    groups = [_group_row(task, rollouts, per_task_stats[task]) for task, rollouts in tasks.items()]
    agent_metrics: dict[str, Any] = dict(overall)
    if compute_metrics_fn is not None:
        custom = dict(compute_metrics_fn([[dict(r) for _, r in rollouts] for rollouts in tasks.values()]) or {})
        _merge_per_task_metrics(groups, custom.pop(PER_TASK_METRICS, None))
        agent_metrics.update(custom)
    agent_metrics = _finite_only(agent_metrics)
    key_metrics = (get_key_metrics_fn or default_key_metrics)(agent_metrics)
    return AggregateMetrics(
        group_level_metrics=_finite_only(groups), agent_metrics=agent_metrics, key_metrics=_finite_only(key_metrics)
    )


def _index(response: Mapping[str, Any], key: str, position: int) -> int:
    value = response.get(key)
    if value is None:
        return 0
    if not isinstance(value, int) or isinstance(value, bool):
        raise ValueError(f"verify_responses[{position}] has {key}={value!r}; it must be an integer (or absent: 0)")
    return value


def _group_by_task(verify_responses: Sequence[Mapping[str, Any]]) -> dict[int, list[tuple[int, Mapping[str, Any]]]]:
    """{task: [(rollout, response), ...] in rollout order}, in task order; each (task, rollout) key once."""
    seen: dict[tuple[int, int], int] = {}
    tasks: dict[int, list[tuple[int, Mapping[str, Any]]]] = {}
    for position, response in enumerate(verify_responses):
        if not isinstance(response, Mapping):
            raise ValueError(f"verify_responses[{position}] is a {type(response).__name__}, not a JSON object")
        key = (_index(response, TASK_INDEX_KEY_NAME, position), _index(response, ROLLOUT_INDEX_KEY_NAME, position))
        if key in seen:
            raise ValueError(
                f"verify_responses[{seen[key]}] and verify_responses[{position}] have the same key "
                f"({TASK_INDEX_KEY_NAME}={key[0]}, {ROLLOUT_INDEX_KEY_NAME}={key[1]}); each verify response needs "
                f"its own pair of indices (a missing index counts as 0)"
            )
        seen[key] = position
        tasks.setdefault(key[0], []).append((key[1], response))
    return {task: sorted(tasks[task], key=lambda pair: pair[0]) for task in sorted(tasks)}


def _group_row(task: int, rollouts: list[tuple[int, Mapping[str, Any]]], stats: Mapping[str, float]) -> dict[str, Any]:
    """One task's row. The rows profiled are the responses themselves, so every expected rollout is there."""
    row: dict[str, Any] = dict(stats)
    row["sample"] = {"agent_ref": {"name": AGENT_NAME}}
    row["num_rollouts"] = len(rollouts)
    row["expected_num_rollouts"] = len(rollouts)
    row["missing_num_rollouts"] = 0
    row["reward_profile_completion_pct"] = 100.0
    row["rollout_infos"] = [_rollout_info(task, rollout, response) for rollout, response in rollouts]
    row[TASK_INDEX_KEY_NAME] = task
    return row


def _rollout_info(task: int, rollout: int, response: Mapping[str, Any]) -> dict[str, Any]:
    """`rollout_id` `"<task>:<rollout>"`, the indices, `reward`, then the other numeric fields (usage included)."""
    numbers = rollout_numeric_fields(response, reward_components=False)
    info: dict[str, Any] = {"rollout_id": f"{task}:{rollout}", TASK_INDEX_KEY_NAME: task}
    info[ROLLOUT_INDEX_KEY_NAME] = rollout
    if REWARD_KEY in numbers:
        info[REWARD_KEY] = numbers.pop(REWARD_KEY)
    info.update(numbers)
    return info


def _merge_per_task_metrics(groups: list[dict[str, Any]], entries: Any) -> None:
    """Update each task's row with its `per_task_metrics` entry (`compute_metrics`' per-task output)."""
    if entries is None:
        return
    if not isinstance(entries, (list, tuple)):
        raise ValueError(
            f"compute_metrics returned {PER_TASK_METRICS} as a {type(entries).__name__}; it must be a list of dicts "
            f"that each carry {TASK_INDEX_KEY_NAME}"
        )
    by_task = {group[TASK_INDEX_KEY_NAME]: group for group in groups}
    for position, entry in enumerate(entries):
        task = entry.get(TASK_INDEX_KEY_NAME) if isinstance(entry, Mapping) else None
        if task not in by_task:
            raise ValueError(
                f"compute_metrics returned {PER_TASK_METRICS}[{position}] = {entry!r:.200}, which names no task of "
                f"this request by {TASK_INDEX_KEY_NAME} (tasks: {sorted(by_task)[:20]})"
            )
        by_task[task].update(entry)


def _non_finite(value: Any) -> bool:
    return isinstance(value, float) and not math.isfinite(value)


def _finite_only(value: Any) -> Any:
    """`value` without NaN or infinities: dropped from dicts (the NaN rule), None in lists (positions matter)."""
    kind = type(value)
    if kind in (str, int, float, bool) or value is None:  # the common leaves, before the slower ABC checks
        return value
    if kind is dict or isinstance(value, Mapping):
        return {key: _finite_only(item) for key, item in value.items() if not _non_finite(item)}
    if isinstance(value, (list, tuple)):
        return [None if _non_finite(item) else _finite_only(item) for item in value]
    return value


# --------------------------------------------------------------------------------------------------------
# The server hooks


class AggregateMetricsMixin:
    """The `/aggregate_metrics` hooks of resources servers and agents: override `compute_metrics` (tasks =
    verify responses grouped per task, in rollout order) and `get_key_metrics` (which metrics to print)."""

    def compute_metrics(self, tasks: list[list[dict]]) -> dict:
        """Metrics of this environment's own (e.g. `compute_pass_majority_metrics(tasks)[0]`); may hold
        `per_task_metrics`: a list of dicts with `_ng_task_index`, merged into those tasks' rows."""
        return {}

    def get_key_metrics(self, agent_metrics: dict) -> dict:
        """The metrics worth printing (default: every `mean/*`)."""
        return default_key_metrics(agent_metrics)

    async def aggregate_metrics(self, body: AggregateMetricsRequest) -> AggregateMetrics:
        """`POST /aggregate_metrics`: `compute_aggregate_metrics` with this server's hooks, in a worker thread when
        the rollouts are many (minutes at 250,000), so the server still answers `/health` and its other routes."""
        args = (body.verify_responses, self.compute_metrics, self.get_key_metrics)
        if len(body.verify_responses) < _INLINE_ROLLOUTS:
            return compute_aggregate_metrics(*args)
        return await asyncio.to_thread(compute_aggregate_metrics, *args)
