"""Reading JSONL files of rows (inputs, rollouts) that may hold damaged lines: a partial last line after a crash,
a hand-edited row. Readers skip such lines and count them instead of failing the whole file."""

from pathlib import Path
from typing import Callable, Iterator

import orjson


def iter_jsonl_objects(path: Path, on_bad: Callable[[], None]) -> Iterator[dict]:
    """The JSON objects of a JSONL file, in order; blank lines are skipped, and a line that is not a JSON object
    calls `on_bad()` and is skipped."""
    with open(path, "rb") as f:
        for line in f:
            line = line.strip()
            if not line:
                continue
            try:
                row = orjson.loads(line)
            except orjson.JSONDecodeError:
                on_bad()
                continue
            if isinstance(row, dict):
                yield row
            else:
                on_bad()
