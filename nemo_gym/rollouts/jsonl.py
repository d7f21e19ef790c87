"""Reading JSONL files of rows (inputs, rollouts) that may hold damaged lines: a partial last line after a crash,
a hand-edited row. Readers skip such lines and count them instead of failing the whole file; `on_bad_line`, when
given, also learns where each one is (`file:line: reason`), so a warning can point at the first."""

from pathlib import Path
from typing import Callable, Iterator, Optional

import orjson


def iter_jsonl_objects(
    path: Path, on_bad: Callable[[], None], on_bad_line: Optional[Callable[[str], None]] = None
) -> Iterator[dict]:
    """The JSON objects of a JSONL file, in order; blank lines are skipped, and a line that is not a JSON object
    calls `on_bad()` (and `on_bad_line("<path>:<line>: <reason>")`) and is skipped."""
    with open(path, "rb") as f:
        for lineno, line in enumerate(f, start=1):
            line = line.strip()
            if not line:
                continue
            try:
                row = orjson.loads(line)
            except orjson.JSONDecodeError:
                on_bad()
                if on_bad_line is not None:
                    on_bad_line(f"{path}:{lineno}: not valid JSON")
                continue
            if isinstance(row, dict):
                yield row
            else:
                on_bad()
                if on_bad_line is not None:
                    on_bad_line(f"{path}:{lineno}: a JSON {type(row).__name__}, not an object")
