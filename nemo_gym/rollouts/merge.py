"""Sharded collections: which rows a shard runs (`ng_collect_rollouts +shard=i/n`) and merging the shards' files
into the files of one run (`ng merge` / `ng_merge`).

Sharding: shard i of n (1-based) runs the rows whose task index mod n is i - 1. Every shard materializes the whole
input, so task and rollout indices are those of the unsharded run, and all repeats of a task land in one shard
(its per-task profile and pass@k are whole). Interleaving, rather than contiguous ranges, spreads easy and hard
stretches of a dataset evenly over the shards.

Merging `SHARD.jsonl...` into `OUT.jsonl` (bounded memory: one bit per materialized row):
- the shards must come from one run: their `<stem>_materialized_inputs.jsonl` files are byte-identical (same input,
  limit, repeats, seeds and overrides), and every rollout's (task, rollout) is one of its rows; otherwise nothing is
  written and the error names the first differing line or the foreign row;
- rollout lines are copied verbatim, shard after shard; a (task, rollout) already copied from an earlier shard is
  a duplicate: dropped and reported;
- `<stem>_failures.jsonl` rows are merged the same way, minus those whose rollout succeeded in some shard; every
  line of a failed rollout from the shard that ran it is kept (they are its attempts: v0.5's `_ng_attempt_index`,
  `_ng_failure_class` and `_ng_failure_terminal` stay, and a resume from the merged file counts them);
- `OUT_materialized_inputs.jsonl`, `OUT_reward_profiling.jsonl` and `OUT_agent_metrics.json` are then written as
  `ng_collect_rollouts` writes them at its end, so the merged folder looks like that of one unsharded run (rows in a
  different order, which no reader depends on: lines are in completion order there too).
"""

from __future__ import annotations

import os
import re
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator, Optional, Union

import orjson
from pydantic import Field

from nemo_gym.config.types import BaseNeMoGymCLIConfig
from nemo_gym.errors import NeMoGymConfigError

__all__ = ["Shard", "parse_shard", "MergeConfig", "MergeReport", "merge_shards"]

_SHARD = re.compile(r"^\s*(\d+)\s*/\s*(\d+)\s*$")
_MAX_EXAMPLES = 5


@dataclass(frozen=True)
class Shard:
    """Shard `index` (1-based) of `count`: the rows whose task index mod `count` is `index - 1`."""

    index: int
    count: int

    def __contains__(self, task: int) -> bool:
        return task % self.count == self.index - 1

    def __str__(self) -> str:
        return f"{self.index}/{self.count}"


def parse_shard(text: Union[str, int, None]) -> Optional[Shard]:
    """`"i/n"` -> `Shard(i, n)` (None for None); a clear `ValueError` for anything else."""
    if text is None:
        return None
    match = _SHARD.match(str(text))
    if not match:
        raise ValueError(f"+shard={text}: expected i/n, e.g. +shard=1/4 for the first of 4 shards")
    index, count = int(match.group(1)), int(match.group(2))
    if count < 1 or not 1 <= index <= count:
        raise ValueError(f"+shard={text}: i must be between 1 and n (n >= 1), e.g. +shard=1/{max(count, 2)}")
    return Shard(index, count)


class MergeConfig(BaseNeMoGymCLIConfig):
    """Merge the outputs of one ng_collect_rollouts run split into shards (+shard=i/n, or runs over the same
    materialized inputs) into one rollouts file: duplicates (same task and rollout index) are dropped and reported,
    failures that succeeded in another shard are dropped, and the merged file gets its materialized inputs, reward
    profile and agent metrics as one unsharded run would. Exits 1 when the merged run still has failed or missing
    rollouts."""

    input_jsonl_fpath: Union[str, list[str]] = Field(
        description="The shards' rollout files (each with its _materialized_inputs.jsonl beside it)."
    )
    output_jsonl_fpath: str = Field(description="The merged rollouts file (its companion files go beside it).")
    pass_threshold: float = Field(default=1.0, description="A rollout passes when reward >= this (for pass@k).")


@dataclass
class MergeReport:
    """What a merge did."""

    output: Path
    shards: int = 0
    rollouts: int = 0
    total_rows: int = 0
    duplicates: int = 0
    duplicate_examples: list[str] = field(default_factory=list)
    failures: int = 0
    failures_succeeded_elsewhere: int = 0
    failure_duplicates: int = 0
    unreadable_lines: int = 0
    first_unreadable: Optional[str] = None
    missing: int = 0

    @property
    def complete(self) -> bool:
        return self.failures == 0 and self.missing == 0

    def lines(self) -> list[str]:
        out = [f"Merged {self.shards} shard(s) into {self.output}: {self.rollouts} / {self.total_rows} rollouts."]
        if self.duplicates:
            out.append(
                f"Dropped {self.duplicates} duplicate rollout(s) (a task and rollout index already merged from an "
                f"earlier shard), e.g. " + "; ".join(self.duplicate_examples)
            )
        if self.failures_succeeded_elsewhere or self.failure_duplicates:
            out.append(
                f"Dropped {self.failures_succeeded_elsewhere} failure record(s) whose rollout succeeded in a shard"
                + (f" and {self.failure_duplicates} duplicate failure record(s)" if self.failure_duplicates else "")
                + "."
            )
        if self.unreadable_lines:
            out.append(f"Skipped {self.unreadable_lines} unreadable line(s) (the first: {self.first_unreadable}).")
        if self.failures:
            from nemo_gym.rollouts.collection import CollectionPaths

            failures = CollectionPaths(self.output).failures
            out.append(f"{self.failures} rollout(s) failed in every shard that ran them; details in {failures}.")
        if self.missing:
            out.append(
                f"{self.missing} rollout(s) of the materialized inputs are in no shard: a shard is missing or "
                "unfinished (rerun it with +resume_from_cache=true, then merge again)."
            )
        return out


def _input_paths(names: Union[str, list[str]]) -> list[Path]:
    names = [names] if isinstance(names, str) else list(names)
    if not names:
        raise NeMoGymConfigError("+input_jsonl_fpath names no file: pass the shards' rollout files.")
    paths = [Path(str(n)).expanduser() for n in names]
    seen: dict[Path, Path] = {}
    for path in paths:
        if not path.is_file():
            raise NeMoGymConfigError(f"Shard file not found: {path} (+input_jsonl_fpath).")
        real = path.resolve()
        if real in seen:
            raise NeMoGymConfigError(f"{path} is given twice (+input_jsonl_fpath); name each shard once.")
        seen[real] = path
    return paths


def _check_same_run(materialized: list[Path], shards: list[Path]) -> None:
    """Refuse shards whose materialized inputs differ from the first shard's, naming the first differing line."""
    first = materialized[0]
    for other, shard in zip(materialized[1:], shards[1:]):
        with open(first, "rb") as a, open(other, "rb") as b:
            lineno = 0
            while True:
                la, lb = a.readline(), b.readline()
                lineno += 1
                if la != lb:
                    raise NeMoGymConfigError(
                        f"{shards[0]} and {shard} are not shards of one run: their materialized inputs differ at "
                        f"line {lineno} ({first}:{lineno} vs {other}:{lineno}), so the input file, limit, repeats or "
                        "overrides were not the same. Merge only the shards of one ng_collect_rollouts run (the "
                        "same arguments but +shard)."
                    )
                if not la:
                    break


class _RowKeys:
    """Which (task, rollout) keys are rows of the materialized inputs, and sets of them (one bit per row)."""

    def __init__(self, materialized: Path) -> None:
        from nemo_gym.rollouts.collection import (
            iter_materialized_keys,
            iter_materialized_pairs,
        )
        from nemo_gym.rollouts.row_keys import RolloutKeySpace

        self.materialized = materialized
        self.space = RolloutKeySpace.from_pairs(lambda: iter_materialized_pairs(materialized))
        # Files that are not a materialization ("sparse": negative indices, more tasks than rows) keep a set.
        self._known = set(iter_materialized_keys(materialized)) if self.space.layout == "sparse" else None

    def new_set(self) -> Any:
        from nemo_gym.rollouts.row_keys import FinishedRollouts

        return FinishedRollouts(self.space)

    def is_row(self, key: int) -> bool:
        if self._known is not None:
            return key in self._known
        return self.space.position(key >> 32, key & 0xFFFFFFFF) is not None


def _keyed_lines(
    path: Path, report: MergeReport
) -> Iterator[tuple[int, int, int, bytes]]:
    """(line number, task, rollout, stripped line) of every line of a shard file that has both indices; others are
    counted as unreadable."""
    from nemo_gym.rollouts.collection import ROLLOUT_INDEX_KEY_NAME, TASK_INDEX_KEY_NAME

    with open(path, "rb") as f:
        for lineno, line in enumerate(f, start=1):
            line = line.strip()
            if not line:
                continue
            problem = None
            try:
                row = orjson.loads(line)
            except orjson.JSONDecodeError:
                row, problem = None, "not valid JSON (a torn last line of an interrupted run?)"
            if problem is None:
                task = row.get(TASK_INDEX_KEY_NAME) if isinstance(row, dict) else None
                rollout = row.get(ROLLOUT_INDEX_KEY_NAME) if isinstance(row, dict) else None
                if type(task) is int and type(rollout) is int and task >= 0 and rollout >= 0:
                    yield lineno, task, rollout, line
                    continue
                problem = f"no `{TASK_INDEX_KEY_NAME}` / `{ROLLOUT_INDEX_KEY_NAME}`"
            report.unreadable_lines += 1
            if report.first_unreadable is None:
                report.first_unreadable = f"{path}:{lineno}: {problem}"


def _foreign(path: Path, lineno: int, task: int, rollout: int, materialized: Path) -> NeMoGymConfigError:
    return NeMoGymConfigError(
        f"{path}:{lineno}: rollout (task {task}, rollout {rollout}) is not a row of {materialized}, so {path} is not "
        "a shard of the same run as the others (or was edited). Merge only the shards of one ng_collect_rollouts run."
    )


def _merge_lines(
    shards: list[Path],
    out_path: Path,
    keys: _RowKeys,
    report: MergeReport,
    on_line: Callable[[Path, int, int, int], bool],
) -> int:
    """Copy the keyed lines of `shards` that `on_line(path, lineno, task, rollout)` accepts to `out_path`."""
    written = 0
    with open(out_path, "wb") as out:
        for path in shards:
            if not path.exists():
                continue
            for lineno, task, rollout, line in _keyed_lines(path, report):
                if not keys.is_row((task << 32) | rollout):
                    raise _foreign(path, lineno, task, rollout, keys.materialized)
                if on_line(path, lineno, task, rollout):
                    out.write(line + b"\n")
                    written += 1
    return written


def merge_shards(
    inputs: list[Path], output: Path, *, pass_threshold: float = 1.0, profile: bool = True
) -> MergeReport:
    """Merge shard rollout files into `output` (and its companion files); see the module docstring."""
    from nemo_gym.rollouts.collection import CollectionPaths, iter_materialized_keys

    inputs = _input_paths([str(p) for p in inputs])
    out = CollectionPaths(Path(output).expanduser())
    shard_paths = [CollectionPaths(p) for p in inputs]
    written_by_us = (out.output, out.failures, out.materialized_inputs, out.reward_profiling, out.agent_metrics)
    for sp in shard_paths:
        for mine in written_by_us:
            if mine.exists() and any(
                p.exists() and os.path.samefile(p, mine) for p in (sp.output, sp.failures, sp.materialized_inputs)
            ):
                raise NeMoGymConfigError(
                    f"-o {out.output} would overwrite {mine}, a file of the shard {sp.output}; choose another output."
                )
    if out.output.is_dir():
        raise NeMoGymConfigError(f"-o {out.output} is a folder; give a file path in it, e.g. {out.output / 'rollouts.jsonl'}.")
    materialized = [sp.materialized_inputs for sp in shard_paths]
    for sp in shard_paths:
        if not sp.materialized_inputs.is_file():
            raise NeMoGymConfigError(
                f"{sp.materialized_inputs} not found: merging needs the _materialized_inputs.jsonl that "
                f"ng_collect_rollouts writes next to each shard's output ({sp.output})."
            )
    _check_same_run(materialized, inputs)

    report = MergeReport(output=out.output, shards=len(inputs))
    keys = _RowKeys(materialized[0])
    out.output.parent.mkdir(parents=True, exist_ok=True)
    tmp = {p: p.with_name(p.name + f".tmp{os.getpid()}") for p in (out.output, out.failures, out.materialized_inputs)}
    try:
        succeeded = keys.new_set()

        def take_rollout(path: Path, lineno: int, task: int, rollout: int) -> bool:
            key = (task << 32) | rollout
            if key in succeeded:
                report.duplicates += 1
                if len(report.duplicate_examples) < _MAX_EXAMPLES:
                    report.duplicate_examples.append(f"{path}:{lineno} (task {task}, rollout {rollout})")
                return False
            succeeded.add(key)
            return True

        report.rollouts = _merge_lines(inputs, tmp[out.output], keys, report, take_rollout)

        failed: dict[int, Path] = {}  # failed key -> the shard whose lines are kept

        def take_failure(path: Path, lineno: int, task: int, rollout: int) -> bool:
            # One shard's lines of a key are its attempts (v0.5 writes one line per attempt; resume counts them):
            # all are kept. The same key failing in another shard too is a duplicate.
            key = (task << 32) | rollout
            if key in succeeded:
                report.failures_succeeded_elsewhere += 1
                return False
            owner = failed.setdefault(key, path)
            if owner != path:
                report.failure_duplicates += 1
                return False
            return True

        _merge_lines([sp.failures for sp in shard_paths], tmp[out.failures], keys, report, take_failure)
        report.failures = len(failed)
        shutil.copyfile(materialized[0], tmp[out.materialized_inputs])

        for key in iter_materialized_keys(materialized[0]):
            report.total_rows += 1
            if key not in succeeded and key not in failed:
                report.missing += 1

        os.replace(tmp[out.materialized_inputs], out.materialized_inputs)
        os.replace(tmp[out.output], out.output)
        if report.failures:
            os.replace(tmp[out.failures], out.failures)
        else:
            out.failures.unlink(missing_ok=True)
    finally:
        for path in tmp.values():
            path.unlink(missing_ok=True)

    if profile:
        from nemo_gym.rollouts.reward_profile import profile_collection

        profile_collection(out, pass_threshold=pass_threshold)
    return report
