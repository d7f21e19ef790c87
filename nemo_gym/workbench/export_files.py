"""Writing exported training rows as JSONL or Parquet (chosen by the output file's suffix), row by row, so memory
stays flat, and complete or not at all: rows go to `<name>.partial` beside the output, renamed over it at the end.
A writer that got no row, or that stopped on an error, leaves no file (and an earlier file at that path as it was).

Parquet needs pyarrow (`pip install 'nemo-gym[parquet]'`), imported only when a `.parquet` file is written. A
Parquet column has one type for all rows, so every kind has a fixed schema here (a message is a struct of role,
content, tool_calls, tool_call_id and, in reasoning `field` mode, reasoning_content; a key a message lacks is
null), and `tools` is stored as JSON text: the parameter schemas of different tools have different shapes, which
no single struct type holds. JSONL rows are written as they are (`tools` a list of objects).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Optional

import orjson

from nemo_gym.errors import NeMoGymConfigError

__all__ = ["FORMATS", "output_format", "require_pyarrow", "arrow_schema", "RowWriter", "open_rows"]

FORMATS = {".jsonl": "jsonl", ".parquet": "parquet"}
JSON_TEXT_COLUMNS = ("tools",)  # Parquet stores these as JSON text
_PARQUET_BATCH_ROWS = 512


def output_format(path: Path, key: str = "output_fpath") -> str:
    """`jsonl` or `parquet` from the suffix of `path`; a config error naming `+key` otherwise."""
    fmt = FORMATS.get(path.suffix.lower())
    if fmt is None:
        raise NeMoGymConfigError(
            f"+{key}={path}: the output format comes from the file's suffix; use .jsonl or .parquet "
            f"(got {path.suffix or 'no suffix'!r})."
        )
    return fmt


def require_pyarrow() -> Any:
    """The pyarrow module, or a config error that says how to install it."""
    try:
        import pyarrow
        import pyarrow.parquet  # noqa: F401
    except ImportError:
        raise NeMoGymConfigError(
            "writing .parquet needs pyarrow, which is not installed: pip install 'nemo-gym[parquet]' "
            "(or pip install pyarrow), or write JSONL instead (-o OUT.jsonl)."
        ) from None
    return pyarrow


def arrow_schema(kind: str, reasoning_field: bool = False) -> Any:
    """The Parquet schema of an export kind (`sft`, `dpo`, `tokens`)."""
    pa = require_pyarrow()
    function = pa.struct([("name", pa.string()), ("arguments", pa.string())])
    tool_call = pa.struct([("id", pa.string()), ("type", pa.string()), ("function", function)])
    message_fields = [("role", pa.string()), ("content", pa.string())]
    if reasoning_field:
        message_fields.append(("reasoning_content", pa.string()))
    message_fields += [("tool_calls", pa.list_(tool_call)), ("tool_call_id", pa.string())]
    messages = pa.list_(pa.struct(message_fields))
    common = [("agent_name", pa.string()), ("_ng_task_index", pa.int64())]
    if kind == "sft":
        fields = [("messages", messages), ("tools", pa.string()), ("reward", pa.float64()), *common,
                  ("_ng_rollout_index", pa.int64())]
    elif kind == "dpo":
        fields = [("prompt", messages), ("chosen", messages), ("rejected", messages), ("tools", pa.string()),
                  ("chosen_reward", pa.float64()), ("rejected_reward", pa.float64()), *common,
                  ("chosen_rollout_index", pa.int64()), ("rejected_rollout_index", pa.int64())]
    elif kind == "tokens":
        fields = [("prompt_token_ids", pa.list_(pa.int64())), ("generation_token_ids", pa.list_(pa.int64())),
                  ("generation_log_probs", pa.list_(pa.float64())), ("loss_mask", pa.list_(pa.int8())),
                  ("num_model_calls", pa.int64()), ("token_trajectory", pa.string()), ("reward", pa.float64()), *common, ("_ng_rollout_index", pa.int64())]
    else:
        raise ValueError(f"unknown export kind {kind!r}")
    return pa.schema(fields)


class RowWriter:
    """Rows in, one file out. `close()` makes the file appear at its path (when it got rows: `written`); `abort()`
    leaves nothing behind."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.partial = path.with_name(path.name + ".partial")
        self.rows = 0
        self.written = False

    def write(self, row: dict) -> None:
        raise NotImplementedError

    def _finish(self, keep: bool) -> None:
        raise NotImplementedError

    def close(self) -> None:
        if not self.rows:  # nothing to write: no (empty) file
            self.abort()
            return
        self._finish(keep=True)
        os.replace(self.partial, self.path)
        self.written = True

    def abort(self) -> None:
        try:
            self._finish(keep=False)
        finally:
            self.partial.unlink(missing_ok=True)

    def __enter__(self) -> "RowWriter":
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is None:
            self.close()
        else:
            self.abort()


class _JsonlWriter(RowWriter):
    def __init__(self, path: Path) -> None:
        super().__init__(path)
        self._file = open(self.partial, "wb")

    def write(self, row: dict) -> None:
        self._file.write(orjson.dumps(row) + b"\n")
        self.rows += 1

    def _finish(self, keep: bool) -> None:
        if not self._file.closed:
            self._file.close()


class _ParquetWriter(RowWriter):
    def __init__(self, path: Path, schema: Any) -> None:
        super().__init__(path)
        import pyarrow.parquet as pq

        self._pa = require_pyarrow()
        self._schema = schema
        self._writer: Optional[Any] = pq.ParquetWriter(str(self.partial), schema)
        self._buffer: list[dict] = []

    def write(self, row: dict) -> None:
        for column in JSON_TEXT_COLUMNS:
            value = row.get(column)
            if value is not None and not isinstance(value, str):
                row = {**row, column: orjson.dumps(value).decode()}
        self._buffer.append(row)
        self.rows += 1
        if len(self._buffer) >= _PARQUET_BATCH_ROWS:
            self._flush()

    def _flush(self) -> None:
        if self._buffer and self._writer is not None:
            self._writer.write_table(self._pa.Table.from_pylist(self._buffer, schema=self._schema))
        self._buffer = []

    def _finish(self, keep: bool) -> None:
        if self._writer is None:
            return
        try:
            if keep:
                self._flush()
        finally:
            self._writer.close()
            self._writer = None


def open_rows(path: Path, kind: str, reasoning_field: bool = False) -> RowWriter:
    """A writer for `path` in the format its suffix names (parent folders are created)."""
    fmt = output_format(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    if fmt == "parquet":
        return _ParquetWriter(path, arrow_schema(kind, reasoning_field))
    return _JsonlWriter(path)
