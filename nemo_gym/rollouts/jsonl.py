"""Reading JSONL files of rows (inputs, rollouts) that may hold bad lines: a torn last line after a crash, a
hand-edited row.

A *bad line* is a non-empty line that is not valid JSON or not a JSON object (`parse_row` decides, for every reader);
a blank line is skipped silently. Two ways to meet one:

- The commands that read rollouts files (`ng view`, `ng export`, `ng reverify`, `ng merge`, `ng aggregate`) share
  one policy, `BadLines`: by default they refuse (exit 2 before any output is written, naming each `file:line` and
  the parse error); with `--skip-bad-lines` they skip the lines, list them on stderr and count them in their summary.
  Why refuse by default: a skipped line is a rollout that silently goes missing from the training data, the merge,
  the metrics or the re-scoring. `read_rows` reads files under that policy.
- Readers of the framework's own files (the collector's resume, reward profiling, its aggregation) skip and count them
  (`iter_jsonl_objects`), warning with the first `file:line`.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Callable, Iterable, Iterator, Optional, Union

import orjson

from nemo_gym.errors import NeMoGymConfigError

__all__ = [
    "SKIP_BAD_LINES_FLAG",
    "SKIP_BAD_LINES_HELP",
    "BadLine",
    "BadLines",
    "BadLinesRefused",
    "NotAnObject",
    "Row",
    "iter_jsonl_objects",
    "parse_row",
    "read_rows",
]

SKIP_BAD_LINES_FLAG = "--skip-bad-lines"
SKIP_BAD_LINES_HELP = (
    "Skip lines of the input that are not JSON objects (bad JSON, a torn last line), listing each as file:line on "
    "stderr, instead of refusing the whole run (the default: exit 2, nothing written)."
)
_SHOWN = 5  # bad lines listed by name; the others are counted
_JSON_TYPES = {list: "list", str: "string", int: "number", float: "number", bool: "boolean", type(None): "null"}
_NO_NEWLINE = "the last line has no newline: cut off while it was being written?"


class NotAnObject(ValueError):
    """A line that is not a row: `reason` says which way (not JSON, another JSON type), `detail` the parser's words."""

    def __init__(self, reason: str, detail: str = "") -> None:
        super().__init__(f"{reason} ({detail})" if detail else reason)
        self.reason = reason
        self.detail = detail


def parse_row(line: Union[bytes, str]) -> dict:
    """The JSON object on one (non-blank) line; `NotAnObject` when it is not one."""
    try:
        row = orjson.loads(line)
    except orjson.JSONDecodeError as exc:
        raise NotAnObject("not valid JSON", str(exc)) from None
    if not isinstance(row, dict):
        raise NotAnObject(f"a JSON {_JSON_TYPES.get(type(row), type(row).__name__)}, not an object")
    return row


@dataclass(frozen=True)
class BadLine:
    """One bad line: where it is and why it is not a row."""

    path: str
    line: int
    reason: str
    detail: str = ""

    @property
    def problem(self) -> str:
        """The reason with the parser's detail."""
        return f"{self.reason} ({self.detail})" if self.detail else self.reason

    def where(self) -> str:
        """`file:line: reason`, without the parser's detail."""
        return f"{self.path}:{self.line}: {self.reason}"

    def __str__(self) -> str:
        return f"{self.path}:{self.line}: {self.problem}"


class BadLinesRefused(NeMoGymConfigError):
    """Bad lines in the input of a command run without `--skip-bad-lines` (exit 2, nothing written)."""


def _plural(count: int, word: str) -> str:
    return f"{count} {word}" + ("" if count == 1 else "s")


@dataclass
class BadLines:
    """The bad lines a command met and its policy for them: refuse (default) or skip (`--skip-bad-lines`).

    `not_done` completes the refusal ("nothing was written", "the viewer was not started")."""

    skip: bool = False
    not_done: str = "nothing was written"
    count: int = 0
    first: list[BadLine] = field(default_factory=list)

    def add(self, bad: BadLine) -> None:
        self.count += 1
        if len(self.first) < _SHOWN:
            self.first.append(bad)

    def add_counted(self, first: Iterable[BadLine], count: int) -> None:
        """Bad lines found elsewhere (the viewer's index): the first ones by name and how many in all."""
        named = 0
        for bad in first:
            self.add(bad)
            named += 1
        self.count += max(0, count - named)

    @property
    def refusing(self) -> bool:
        """True once a bad line was met under the default policy: the command must not go on."""
        return bool(self.count) and not self.skip

    def listing(self, indent: str = "  ") -> list[str]:
        lines = [f"{indent}{bad}" for bad in self.first]
        if self.count > len(self.first):
            lines.append(f"{indent}... and {self.count - len(self.first)} more")
        return lines

    def refusal(self) -> BadLinesRefused:
        """The error that refuses the run: the first bad line on the first line, then the others, then what to do."""
        first, *others = self.listing(indent="")
        them = "it" if self.count == 1 else "them"
        kind = "a line that is not a JSON object" if self.count == 1 else "lines that are not JSON objects"
        return BadLinesRefused(
            "\n".join(
                [
                    first,
                    *(f"  {line}" for line in others),
                    f"{_plural(self.count, 'bad line')} ({kind}): {self.not_done}. Fix or delete {them}, or pass "
                    f"{SKIP_BAD_LINES_FLAG} to skip {them}.",
                ]
            )
        )

    def check(self) -> None:
        """Raise the refusal when refusing; nothing otherwise."""
        if self.refusing:
            raise self.refusal()

    def summary(self) -> str:
        """`skipped 2 bad lines` for a command's summary ("" when there were none)."""
        return f"skipped {_plural(self.count, 'bad line')}" if self.count else ""

    def warn_skipped(self, command: str, stream: Optional[IO[str]] = None) -> None:
        """List the skipped lines on stderr (the first ones, then the count)."""
        if not self.count:
            return
        out = stream or sys.stderr
        sys.stdout.flush()
        out.write(f"warning: {command}: {self.summary()} ({SKIP_BAD_LINES_FLAG}):\n" + "\n".join(self.listing()) + "\n")
        out.flush()


@dataclass(frozen=True)
class Row:
    """One row of a file read by `read_rows`: where it is, the object, and the line as it is (stripped)."""

    path: Path
    line: int
    row: dict
    text: bytes


def read_rows(
    paths: Iterable[Path], bad_lines: BadLines, *, limit: Optional[int] = None, settle: bool = True
) -> Iterator[Row]:
    """The rows of `paths`, in order, under the policy of `bad_lines` (which learns every bad line met).

    Skipping, bad lines are left out. Refusing, the first bad line ends the rows: the rest of the files is only
    scanned (so the refusal can say how many there are) and the refusal is raised at the end; the caller's output,
    written to a temporary file, is then dropped. `settle=False` yields every row either way and leaves the refusal
    to the caller (`bad_lines.check()`), for a caller that checks all rows first and reports every problem at once.
    `limit` stops after that many rows (bad lines do not count)."""
    rows = 0
    for path, lineno, raw, text, parsed in _parsed_lines(paths):
        if isinstance(parsed, NotAnObject):
            detail = parsed.detail if raw.endswith(b"\n") else "; ".join(filter(None, (parsed.detail, _NO_NEWLINE)))
            bad_lines.add(BadLine(str(path), lineno, parsed.reason, detail))
            continue
        if settle and bad_lines.refusing:
            continue
        yield Row(path, lineno, parsed, text)
        rows += 1
        if limit is not None and rows >= limit:
            break
    if settle:
        bad_lines.check()


def _parsed_lines(paths: Iterable[Path]) -> Iterator[tuple[Path, int, bytes, bytes, Union[dict, NotAnObject]]]:
    """(path, line number, the line, stripped, its row or why it is not one) for each non-blank line of `paths`."""
    for path in paths:
        with open(path, "rb") as f:
            for lineno, raw in enumerate(f, start=1):
                text = raw.strip()
                if not text:
                    continue
                try:
                    yield path, lineno, raw, text, parse_row(text)
                except NotAnObject as exc:
                    yield path, lineno, raw, text, exc


def iter_jsonl_objects(
    path: Path, on_bad: Callable[[], None], on_bad_line: Optional[Callable[[str], None]] = None
) -> Iterator[dict]:
    """The JSON objects of a JSONL file, in order, skipping bad lines: each calls `on_bad()` (and
    `on_bad_line("<path>:<line>: <reason>")`). For the framework's own files; the rollouts commands use `read_rows`."""
    for _, lineno, _, _, parsed in _parsed_lines([path]):
        if isinstance(parsed, NotAnObject):
            on_bad()
            if on_bad_line is not None:
                on_bad_line(BadLine(str(path), lineno, parsed.reason).where())
            continue
        yield parsed
