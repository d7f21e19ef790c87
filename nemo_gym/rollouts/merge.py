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
- bad lines (not JSON objects, e.g. a torn last line of an interrupted shard) follow the policy of every rollouts
  command (`nemo_gym.rollouts.jsonl`): refused by default (exit 2, nothing written), skipped and listed with
  `skip_bad_lines=true` (`--skip-bad-lines`);
- `<stem>_failures.jsonl` rows are merged the same way, minus those whose rollout succeeded in some shard; every
  line of a failed rollout from the shard that ran it is kept (they are its attempts: v0.5's `_ng_attempt_index`,
  `_ng_failure_class` and `_ng_failure_terminal` stay, and a resume from the merged file counts them);
- `OUT_materialized_inputs.jsonl`, `OUT_reward_profiling.jsonl` and `OUT_agent_metrics.json` are then written as
  `ng_collect_rollouts` writes them at its end, so the merged folder looks like that of one unsharded run (rows in a
  different order, which no reader depends on: lines are in completion order there too).

Every file is written to a temporary name and renamed at the end; shards that hold no rollout give no file at all.
"""

from __future__ import annotations

import os
import re
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator, Optional, Union

from pydantic import Field

from nemo_gym.config.types import BaseNeMoGymCLIConfig
from nemo_gym.errors import NeMoGymConfigError
from nemo_gym.rollouts.jsonl import SKIP_BAD_LINES_HELP, BadLines, read_rows

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
    rollouts, or when the shards hold no rollout (then no file is written). A line that is not a JSON object
    refuses the merge (exit 2) unless --skip-bad-lines."""

    input_jsonl_fpath: Union[str, list[str]] = Field(
        description="The shards' rollout files (each with its _materialized_inputs.jsonl beside it)."
    )
    output_jsonl_fpath: str = Field(description="The merged rollouts file (its companion files go beside it).")
    pass_threshold: float = Field(default=1.0, description="A rollout passes when reward >= this (for pass@k).")
    skip_bad_lines: bool = Field(default=False, description=SKIP_BAD_LINES_HELP)


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
    unkeyed_rows: int = 0  # JSON objects without task and rollout indices: not rollouts of a collection
    first_unkeyed: Optional[str] = None
    missing: int = 0
    bad_lines: BadLines = field(default_factory=BadLines)
    written: bool = False  # False when the shards hold no rollout: no file was written

    @property
    def complete(self) -> bool:
        return self.written and self.failures == 0 and self.missing == 0

    def lines(self) -> list[str]:
        skipped = f"; {self.bad_lines.summary()}" if self.bad_lines.count else ""
        if not self.written:
            return [
                f"Nothing merged: the {self.shards} shard(s) hold no rollout ({self.failures} failed{skipped}); "
                f"no file was written ({self.output})."
            ]
        out = [
            f"Merged {self.shards} shard(s) into {self.output}: {self.rollouts} / {self.total_rows} rollouts{skipped}."
        ]
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
        if self.unkeyed_rows:
            out.append(
                f"Skipped {self.unkeyed_rows} row(s) without `_ng_task_index` / `_ng_rollout_index`, so not "
                f"rollouts of a collection (the first: {self.first_unkeyed})."
            )
        if self.failures:
            from nemo_gym.rollouts.collection import CollectionPaths

            failures = CollectionPaths(self.output).failures
            out.append(f"{self.failures} rollout(s) failed in every shard that ran them; details in {failures}.")
        if self.missing:
            on_bad = " or on a skipped bad line" if self.bad_lines.count else ""
            out.append(
                f"{self.missing} rollout(s) of the materialized inputs are in no shard{on_bad}: a shard is missing or "
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


def _keyed_rows(paths: list[Path], report: MergeReport) -> Iterator[tuple[Path, int, int, int, bytes]]:
    """(file, line number, task, rollout, stripped line) of every row of `paths` that has both indices, in order;
    other rows are counted, bad lines follow `report.bad_lines`."""
    from nemo_gym.rollouts.collection import ROLLOUT_INDEX_KEY_NAME, TASK_INDEX_KEY_NAME

    for line in read_rows(paths, report.bad_lines):
        task, rollout = line.row.get(TASK_INDEX_KEY_NAME), line.row.get(ROLLOUT_INDEX_KEY_NAME)
        if type(task) is int and type(rollout) is int and task >= 0 and rollout >= 0:
            yield line.path, line.line, task, rollout, line.text
            continue
        report.unkeyed_rows += 1
        if report.first_unkeyed is None:
            report.first_unkeyed = f"{line.path}:{line.line}"


def _foreign(path: Path, lineno: int, task: int, rollout: int, materialized: Path) -> NeMoGymConfigError:
    return NeMoGymConfigError(
        f"{path}:{lineno}: rollout (task {task}, rollout {rollout}) is not a row of {materialized}, so {path} is not "
        "a shard of the same run as the others (or was edited). Merge only the shards of one ng_collect_rollouts run."
    )


def merge_shards(
    inputs: list[Path],
    output: Path,
    *,
    pass_threshold: float = 1.0,
    profile: bool = True,
    skip_bad_lines: bool = False,
) -> MergeReport:
    """Merge shard rollout files into `output` (and its companion files); see the module docstring. Bad lines raise
    `BadLinesRefused` unless `skip_bad_lines`; nothing is written then, nor when no shard holds a rollout
    (`report.written` False)."""
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

    report = MergeReport(output=out.output, shards=len(inputs), bad_lines=BadLines(skip=skip_bad_lines))
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

        # One pass over every file, the shards' rollouts first (so `succeeded` is whole when the failures come):
        # a bad line anywhere refuses the merge before anything is renamed into place.
        failure_files = [sp.failures for sp in shard_paths if sp.failures.exists()]
        is_failure_file = {id(p) for p in failure_files}  # `read_rows` gives back the very objects it was given
        with open(tmp[out.output], "wb") as rollouts_out, open(tmp[out.failures], "wb") as failures_out:
            for path, lineno, task, rollout, line in _keyed_rows([*inputs, *failure_files], report):
                if not keys.is_row((task << 32) | rollout):
                    raise _foreign(path, lineno, task, rollout, keys.materialized)
                if id(path) in is_failure_file:
                    if take_failure(path, lineno, task, rollout):
                        failures_out.write(line + b"\n")
                elif take_rollout(path, lineno, task, rollout):
                    rollouts_out.write(line + b"\n")
                    report.rollouts += 1
        report.failures = len(failed)
        if not report.rollouts:
            return report  # nothing to merge: no file written (the temporary ones go below)
        shutil.copyfile(materialized[0], tmp[out.materialized_inputs])

        for key in iter_materialized_keys(materialized[0]):
            report.total_rows += 1
            if key not in succeeded and key not in failed:
                report.missing += 1

        os.replace(tmp[out.materialized_inputs], out.materialized_inputs)
        os.replace(tmp[out.output], out.output)
        report.written = True
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
