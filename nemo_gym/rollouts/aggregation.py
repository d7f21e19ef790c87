"""After a collection: ask each agent for `/aggregate_metrics` over its rollouts (NeMo Gym v0.5, spec §3.3).

The agent computes them (by default itself, or proxied to its resources server, whose `compute_metrics` hook
knows the task: pass@k, majority@k, subsets...). We send the collected rollouts of that agent, stripped of the
large payloads (`response` but its `usage`, `responses_create_params`, observation and capture data), and write
`<stem>_aggregate_metrics.json`: a JSON array of `{agent_ref: {name}, agent_metrics, key_metrics,
group_level_metrics}`, one entry per agent.

`ng_aggregate_rollouts` (`gym eval aggregate`, `RolloutAggregationConfig`) does the same step later, over the shards
a glob names, against a running stack. It reads the shards under the rollouts commands' bad-lines policy
(`nemo_gym.rollouts.jsonl`): a line that is not a JSON object refuses the run (exit 2, nothing merged) unless
`--skip-bad-lines`.

Only successful rollouts (the output file) are aggregated: failures, judge failures included, are not scores.
An agent that cannot aggregate (an old agent without the route, an error in a custom `compute_metrics`) costs
its entry and one line naming it and the reason, never the collected rollouts; the command then exits 1, as
metrics were asked for and are missing.

Scale: the verify responses go in bounded parts (`nemo_gym.rollouts.aggregation_parts`), so no request is over a
server's body limit however many rollouts there are; the server still hands its `aggregate_metrics` the whole list
(v0.5's contract). A string over `MAX_STRING_CHARS` (a 40 MB judge transcript) is cut to its start plus its length
and digest: no metric reads such text, and answers still compare equal exactly when they are equal (majority@k).
The collector keeps the stripped rows as JSON bytes until they are sent, a few hundred bytes per rollout.
"""

from __future__ import annotations

import hashlib
import json
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping, Optional, Union

from pydantic import Field, field_validator

from nemo_gym.config.types import BaseNeMoGymCLIConfig
from nemo_gym.rollouts.aggregation_parts import AggregationFailed, post_aggregate_metrics
from nemo_gym.rollouts.jsonl import SKIP_BAD_LINES_HELP, BadLines, iter_jsonl_objects, read_rows

__all__ = [
    "RolloutAggregationConfig",
    "AggregationInputs",
    "expand_input_globs",
    "load_sorted_rollouts",
    "aggregate_rollouts_from_config",
    "STRIPPED_KEYS",
    "MAX_STRING_CHARS",
    "TooManyToAggregate",
    "stripped_for_aggregation",
    "read_results_grouped",
    "read_results_by_agent",
    "aggregate_by_agent",
    "write_aggregate_metrics",
    "print_key_metrics",
]

STRIPPED_KEYS = ("response", "responses_create_params", "ng_agent_observations", "ng_model_call_capture")
# Strings longer than this reach /aggregate_metrics cut (see the module docstring).
MAX_STRING_CHARS = 64 * 1024


def _cut_long_strings(value: Any) -> Any:
    """`value` with every string over `MAX_STRING_CHARS` (at any depth) replaced by its start, length and digest."""
    if isinstance(value, str):
        if len(value) <= MAX_STRING_CHARS:
            return value
        digest = hashlib.sha256(value.encode("utf-8", "surrogatepass")).hexdigest()[:32]
        return f"{value[:MAX_STRING_CHARS]}...[cut for /aggregate_metrics: {len(value)} chars, sha256 {digest}]"
    if isinstance(value, Mapping):
        return {k: _cut_long_strings(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_cut_long_strings(v) for v in value]
    return value


def stripped_for_aggregation(result: Mapping[str, Any]) -> dict:
    """`result` without the large payloads; `response` is kept as `{"usage": ...}` when it has usage; strings over
    `MAX_STRING_CHARS` cut."""
    out = {k: _cut_long_strings(v) for k, v in result.items() if k not in STRIPPED_KEYS}
    response = result.get("response")
    if isinstance(response, Mapping) and response.get("usage") is not None:
        out["response"] = {"usage": response["usage"]}
    return out


def _agent_of(result: Mapping[str, Any], default: Optional[str]) -> Optional[str]:
    ref = result.get("agent_ref")
    if isinstance(ref, Mapping) and isinstance(ref.get("name"), str):
        return ref["name"]
    return default


class TooManyToAggregate(Exception):
    """More rollouts than `aggregation_max_rollouts`: the agent would hold them all in memory at once."""


def _sort_key(result: Mapping[str, Any]) -> tuple:
    task, rollout = result.get("_ng_task_index", 0), result.get("_ng_rollout_index", 0)
    return (task if isinstance(task, int) else 0, rollout if isinstance(rollout, int) else 0)


def read_results_grouped(
    path: Path,
    group_of: Callable[[Mapping[str, Any]], Optional[str]],
    *,
    max_rollouts: Optional[int] = None,
    encoded: bool = False,
) -> dict[str, list]:
    """The stripped results of a rollouts file, grouped by `group_of(result)` (None: left out), each group sorted by
    (task, rollout) index; with `encoded`, as their JSON bytes (a fraction of the memory of dicts). More than
    `max_rollouts` grouped rows raise `TooManyToAggregate` as soon as the file shows it."""
    import orjson

    keyed: dict[str, list[tuple[tuple, Any]]] = {}
    count = 0
    for result in iter_jsonl_objects(path, on_bad=lambda: None):  # a torn line was reported by whoever wrote it
        group = group_of(result)
        if group is not None:
            count += 1
            if max_rollouts is not None and count > max_rollouts:
                raise TooManyToAggregate(f"more than {max_rollouts} rollouts in {path}")
            row = stripped_for_aggregation(result)
            keyed.setdefault(group, []).append(
                (_sort_key(result), orjson.dumps(row, option=orjson.OPT_SERIALIZE_NUMPY) if encoded else row)
            )
    groups: dict[str, list] = {}
    for group, rows in keyed.items():
        rows.sort(key=lambda pair: pair[0])
        groups[group] = [row for _, row in rows]
    return groups


def read_results_by_agent(
    path: Path, default_agent: Optional[str] = None, *, max_rollouts: Optional[int] = None, encoded: bool = False
) -> dict[str, list]:
    """`read_results_grouped` by `agent_ref.name` (rows without one go to `default_agent`, or are left out)."""
    return read_results_grouped(
        path, lambda result: _agent_of(result, default_agent), max_rollouts=max_rollouts, encoded=encoded
    )


async def aggregate_by_agent(server_client: Any, groups: Mapping[str, list]) -> tuple[list[dict], list[str]]:
    """POST each group (stripped verify responses, as dicts or JSON bytes) to `/aggregate_metrics` of the server it
    is keyed by (an agent; a resources server for reverify), in parts when they are many. Returns (entries,
    problems): one entry per server that answered, one line per one that did not, naming it and the reason."""
    entries: list[dict] = []
    problems: list[str] = []
    for agent, rows in groups.items():
        try:
            data = await post_aggregate_metrics(server_client, agent, rows)
        except AggregationFailed as exc:
            problems.append(f"`{agent}` gave no metrics for its {len(rows)} rollout(s) at POST /aggregate_metrics: {exc}")
            continue
        entries.append(
            {
                "agent_ref": {"name": agent},
                "agent_metrics": data.get("agent_metrics", {}),
                "key_metrics": data.get("key_metrics", {}),
                "group_level_metrics": data.get("group_level_metrics", []),
            }
        )
    return entries, problems


def write_aggregate_metrics(path: Path, entries: list[dict]) -> None:
    """Write the entries as an indented JSON array (to a temporary file renamed into place)."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(entries, indent=2, allow_nan=False, default=str) + "\n")
    tmp.replace(path)


def print_key_metrics(entries: list[dict], out: Any = None) -> None:
    """One block per agent with its key metrics (numbers with 4 significant decimals)."""
    out = out or sys.stdout
    for entry in entries:
        key_metrics = entry.get("key_metrics") or {}
        if not key_metrics:
            continue
        out.write(f"Key metrics of `{entry['agent_ref']['name']}`:\n")
        width = max(len(k) for k in key_metrics)
        for name, value in key_metrics.items():
            shown = f"{value:.4f}" if isinstance(value, float) else str(value)
            out.write(f"  {name:<{width}}  {shown}\n")
    out.flush()


# --------------------------------------------------------------------------------------------------------
# ng_aggregate_rollouts: the same step over files written earlier (v0.5's `gym eval aggregate`)

# Files a collection writes beside its output: a glob such as `results/*.jsonl` matches them too, but they hold no
# rollouts (or, for the failures sidecar, no scores), so they are never aggregated.
_COMPANION_SUFFIXES = ("_materialized_inputs.jsonl", "_failures.jsonl", "_reward_profiling.jsonl")


class RolloutAggregationConfig(BaseNeMoGymCLIConfig):
    """Aggregate rollouts collected earlier (e.g. the shards of one run): load every file `input_glob` matches,
    sort the rollouts by (task, rollout) index, write them as one file (`merge_shards`), and ask each agent of the
    running stack for `/aggregate_metrics` over its rollouts, written to <output stem>_aggregate_metrics.json.
    Needs the servers running (`ng_run`), like ng_collect_rollouts.
    Example: ng_aggregate_rollouts "+input_glob=results/shard*.jsonl" +output_jsonl_fpath=results/all.jsonl"""

    input_glob: Union[str, list[str]] = Field(
        description="A glob, several comma-separated globs, or a list; files matched twice are read once. The "
        "collection's companion files (_failures, _materialized_inputs, _reward_profiling) are skipped."
    )
    output_jsonl_fpath: str = Field(
        description="The merged rollouts file (with merge_shards) and the stem of <stem>_aggregate_metrics.json."
    )
    merge_shards: bool = Field(default=True, description="Write the sorted concatenation to output_jsonl_fpath.")
    skip_bad_lines: bool = Field(default=False, description=SKIP_BAD_LINES_HELP)

    @field_validator("input_glob", mode="before")
    @classmethod
    def _globs(cls, value: Any) -> Any:
        if hasattr(value, "__iter__") and not isinstance(value, (str, bytes, Mapping)):
            return [str(v) for v in value]
        return value


def expand_input_globs(input_glob: Union[str, list[str]], *, exclude: Optional[Path] = None) -> tuple[list[Path], list[Path]]:
    """(rollout files, skipped companion files) of comma-separated globs or a list of them, each file once, in glob
    order and sorted within a glob. `exclude` (the output file, when it already exists) is never read.
    Nothing matched -> `ConfigPathNotFoundError`."""
    import glob as globlib

    from nemo_gym.errors import ConfigPathNotFoundError

    patterns = [input_glob] if isinstance(input_glob, str) else list(input_glob)
    patterns = [p.strip() for text in patterns for p in str(text).split(",") if p.strip()]
    if not patterns:
        raise ConfigPathNotFoundError("+input_glob is empty: give a glob of rollout files, e.g. results/*.jsonl")
    seen: set[Path] = set()
    files: list[Path] = []
    skipped: list[Path] = []
    excluded = exclude.resolve() if exclude is not None and exclude.exists() else None
    for pattern in patterns:
        for name in sorted(globlib.glob(str(Path(pattern).expanduser()), recursive=True)):
            path = Path(name)
            real = path.resolve()
            if real in seen or not path.is_file() or real == excluded:
                continue
            seen.add(real)
            (skipped if path.name.endswith(_COMPANION_SUFFIXES) else files).append(path)
    if not files:
        what = " (only companion files: " + ", ".join(map(str, skipped)) + ")" if skipped else ""
        raise ConfigPathNotFoundError(
            f"+input_glob={','.join(patterns)} matches no rollout file{what}. Check the path (relative to "
            f"{Path.cwd()}); quote the glob so the shell does not expand it."
        )
    return files, skipped


@dataclass
class AggregationInputs:
    """The rollouts read for an aggregation (sorted by agent-independent (task, rollout) key) and what was left out."""

    rollouts: list[dict]
    files: list[Path]
    skipped_files: list[Path]
    duplicates: int = 0
    declared_failures: int = 0
    unindexed: int = 0
    bad_lines: BadLines = field(default_factory=BadLines)

    @property
    def unreadable(self) -> int:
        """Lines that are not JSON objects (skipped under `--skip-bad-lines`; otherwise the read was refused)."""
        return self.bad_lines.count


def load_sorted_rollouts(
    files: list[Path], skipped_files: Optional[list[Path]] = None, *, skip_bad_lines: bool = False
) -> AggregationInputs:
    """Every rollout of `files`, sorted by (task, rollout) index; a (agent, task, rollout) seen in an earlier file is a
    duplicate and dropped (its agent's /aggregate_metrics would refuse it); lines without both indices are counted
    and dropped (v0.5's aggregation needs them). A line that is not a JSON object refuses the read
    (`BadLinesRefused`, exit 2, naming `file:line`) unless `skip_bad_lines`, as `ng merge` and `ng export` do: a shard's
    torn line would otherwise be a rollout silently missing from the merged file and from the metrics."""
    inputs = AggregationInputs(
        rollouts=[], files=files, skipped_files=list(skipped_files or []),
        bad_lines=BadLines(skip=skip_bad_lines, not_done="nothing was merged or aggregated"),
    )
    seen: set[tuple] = set()

    for path in files:
        for found in read_rows([path], inputs.bad_lines, settle=False):
            row = found.row
            task, rollout = row.get("_ng_task_index"), row.get("_ng_rollout_index")
            if not isinstance(task, int) or not isinstance(rollout, int):
                inputs.unindexed += 1
                continue
            if row.get("_ng_failure_class") is not None or row.get("_ng_no_persist"):
                inputs.declared_failures += 1  # its reward is not a score
                continue
            key = (_agent_of(row, None), task, rollout)
            if key in seen:
                inputs.duplicates += 1
                continue
            seen.add(key)
            inputs.rollouts.append(row)
    inputs.bad_lines.check()  # every file read, so the refusal names all bad lines
    inputs.rollouts.sort(key=lambda r: (r["_ng_task_index"], r["_ng_rollout_index"]))
    return inputs


def aggregate_rollouts_from_config(
    config: RolloutAggregationConfig, *, server_client: Any = None, connect: Optional[Callable[[], Any]] = None
) -> int:
    """The body of ng_aggregate_rollouts; returns the exit code (1 when some agent gave no metrics). The client of the
    running stack is `server_client`, or made by `connect()` once the files have been read (so bad input is refused
    without a stack, and a missing stack is reported before anything is written)."""
    import asyncio

    import orjson

    from nemo_gym.errors import NeMoGymConfigError

    output = Path(config.output_jsonl_fpath).expanduser()
    if output.is_dir():
        raise NeMoGymConfigError(f"+output_jsonl_fpath={output} is a folder; give a file path, e.g. {output / 'all.jsonl'}.")
    files, skipped = expand_input_globs(config.input_glob, exclude=output if config.merge_shards else None)
    inputs = load_sorted_rollouts(files, skipped, skip_bad_lines=config.skip_bad_lines)
    out = sys.stdout
    out.write(f"Read {len(inputs.rollouts)} rollouts from {len(files)} file(s).\n")
    if skipped:
        out.write(f"Skipped {len(skipped)} companion file(s): {', '.join(map(str, skipped))}.\n")
    for count, what in (
        (inputs.duplicates, "duplicate rollout(s) (same agent, task and rollout index as an earlier line) dropped"),
        (inputs.declared_failures, "result(s) that declare a failure (_ng_failure_class) left out: not scores"),
        (inputs.unindexed, "line(s) without _ng_task_index / _ng_rollout_index dropped"),
    ):
        if count:
            sys.stderr.write(f"Warning: {count} {what}.\n")
    inputs.bad_lines.warn_skipped("ng_aggregate_rollouts")
    if not inputs.rollouts:
        raise NeMoGymConfigError(
            f"no rollouts to aggregate in {', '.join(map(str, files))}: the files hold no line with "
            "_ng_task_index and _ng_rollout_index."
        )
    if server_client is None:
        server_client = connect()
    output.parent.mkdir(parents=True, exist_ok=True)
    if config.merge_shards:
        tmp = output.with_name(output.name + ".tmp")
        with open(tmp, "wb") as f:
            for row in inputs.rollouts:
                f.write(orjson.dumps(row, option=orjson.OPT_SERIALIZE_NUMPY) + b"\n")
        tmp.replace(output)
        out.write(f"Merged rollouts:   {output}\n")
    groups: dict[str, list[bytes]] = {}
    unnamed = 0
    for row in inputs.rollouts:
        agent = _agent_of(row, None)
        if agent is None:
            unnamed += 1
            continue
        groups.setdefault(agent, []).append(orjson.dumps(stripped_for_aggregation(row), option=orjson.OPT_SERIALIZE_NUMPY))
    if unnamed:
        sys.stderr.write(f"Warning: {unnamed} rollout(s) without agent_ref.name are not aggregated.\n")
    entries, problems = asyncio.run(aggregate_by_agent(server_client, groups))
    for problem in problems:
        sys.stderr.write(f"error: no aggregate metrics: {problem}\n")
    metrics_path = output.with_name(f"{output.stem}_aggregate_metrics.json")
    if entries:
        write_aggregate_metrics(metrics_path, entries)
        out.write(f"Aggregate metrics: {metrics_path}\n")
        print_key_metrics(entries, out)
    out.flush()
    return 1 if problems else 0
