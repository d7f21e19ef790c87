"""The index of a rollouts file: where each line starts, and the few fields the viewer's table sorts and filters on.

A rollouts file can hold a million lines of several kB each, so the viewer never loads it. It reads it once,
line by line, and writes one SQLite row per line: byte offset and length (to read that line again with one seek),
task and repeat indices, agent, reward, turns, tool calls, tokens, status (the rollout's outcome, ok / incomplete /
failed as `nemo_gym.rollouts.outcome` defines them, or `unreadable` for a line that is not a JSON object, which is no
outcome), a short preview of the prompt and, for a
rollout with token ids, the drift check of its token trajectory (`trajectory`: exact / retokenized / unusable and
`trajectory_reason`, from `nemo_gym.workbench.tokens.classify_trajectory`, as `ng export tokens` decides). The
`<stem>_failures.jsonl` written beside it is indexed into the same database (`source` 1), so failed rollouts are
rows of the same table.

The database lives in a cache directory, one file per rollouts file, and is reused by the next `ng view`:

- **Growth** (the collector is still appending): only the new bytes are read. Only lines that end with a newline
  are indexed, so a line being written is picked up on a later update (a last line without newline counts only
  when it is a whole JSON object).
- **Bad lines** (`nemo_gym.rollouts.jsonl`: a non-empty line that is not a JSON object) are no rows: they go to the
  `bad_lines` table (`RolloutIndex.bad_lines`), and `ng view` refuses or skips them as every rollouts command does.
  A last line without newline is never one: the collector may still be writing it.
- **Invalidation**: the bytes the index was built from are fingerprinted (the first and the last 4 KiB). A file
  that shrank or whose fingerprint changed (rewritten by a new run) is indexed afresh; `generation` counts these.
- **Resumable**: rows are committed in batches together with the position reached, so an interrupted build
  continues where it stopped.
"""

from __future__ import annotations

import hashlib
import os
import sqlite3
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator, Optional, Union

from nemo_gym.rollouts.jsonl import BadLine, NotAnObject, parse_row
from nemo_gym.rollouts.outcome import FAILURES_SUFFIX, failure_agent, failure_outcome, failures_path_for, rollout_outcome
from nemo_gym.workbench.tokens import classify_trajectory, has_token_data

__all__ = [
    "INDEX_VERSION",
    "ROLLOUTS",
    "FAILURES",
    "UNREADABLE",
    "RolloutIndex",
    "SourceState",
    "default_cache_dir",
    "failures_path_for",
    "summarize_rollout",
    "summarize_failure",
    "prompt_preview",
]

INDEX_VERSION = 5  # 4: status is the outcome (ok / incomplete / failed; `error` became failed) or unreadable
# 5: bad lines are not rows but `bad_lines`
ROLLOUTS, FAILURES = 0, 1  # the `source` column: the rollouts file itself, or its `_failures.jsonl`
UNREADABLE = "unreadable"  # a line that is not a JSON object: no rollout outcome
_FINGERPRINT_BYTES = 4096
_BATCH_ROWS = 2000
_PREVIEW_CHARS = 160
_MESSAGE_CHARS = 2000

# Output items the model produced; everything else in `response.output` (tool outputs) comes from the tools.
_TOOL_OUTPUT_TYPES = frozenset({"function_call_output", "custom_tool_call_output", "mcp_call_output"})

_SCHEMA = """
CREATE TABLE IF NOT EXISTS info (key TEXT PRIMARY KEY, value TEXT);
CREATE TABLE IF NOT EXISTS sources (
    source INTEGER PRIMARY KEY, path TEXT, end_offset INTEGER, next_line INTEGER, rows INTEGER,
    head BLOB, tail BLOB, size INTEGER, mtime_ns INTEGER, inode INTEGER, generation INTEGER);
CREATE TABLE IF NOT EXISTS rows (
    id INTEGER PRIMARY KEY, source INTEGER NOT NULL, offset INTEGER NOT NULL, length INTEGER NOT NULL,
    line INTEGER NOT NULL, task INTEGER, rollout INTEGER, agent TEXT, reward REAL, turns INTEGER,
    tool_calls INTEGER, tokens INTEGER, status TEXT NOT NULL, error_type TEXT, message TEXT, preview TEXT,
    trajectory TEXT, trajectory_reason TEXT);
CREATE UNIQUE INDEX IF NOT EXISTS rows_at ON rows(source, offset);
CREATE TABLE IF NOT EXISTS bad_lines (
    source INTEGER NOT NULL, offset INTEGER NOT NULL, line INTEGER NOT NULL, reason TEXT NOT NULL, detail TEXT,
    PRIMARY KEY (source, offset));
CREATE INDEX IF NOT EXISTS rows_task ON rows(task, rollout, source, offset);
CREATE INDEX IF NOT EXISTS rows_reward ON rows(reward, source, offset);
CREATE INDEX IF NOT EXISTS rows_agent ON rows(agent, source, offset);
CREATE INDEX IF NOT EXISTS rows_status ON rows(status, source, offset);
CREATE INDEX IF NOT EXISTS rows_tokens ON rows(tokens, source, offset);
CREATE INDEX IF NOT EXISTS rows_trajectory ON rows(trajectory, source, offset);
"""

ROW_COLUMNS = (
    "source", "offset", "length", "line", "task", "rollout", "agent", "reward", "turns", "tool_calls", "tokens",
    "status", "error_type", "message", "preview", "trajectory", "trajectory_reason",
)  # fmt: skip
_INSERT = f"INSERT OR REPLACE INTO rows ({', '.join(ROW_COLUMNS)}) VALUES ({', '.join('?' * len(ROW_COLUMNS))})"


def default_cache_dir() -> Path:
    """`NEMO_GYM_VIEW_CACHE`, else the user's cache directory (`$XDG_CACHE_HOME` or `~/.cache`, never the current
    directory) under `nemo_gym/view`, else a per-user temp dir when that is not writable."""
    env = os.environ.get("NEMO_GYM_VIEW_CACHE")
    if env:
        return Path(env).expanduser()
    candidate = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "nemo_gym" / "view"
    try:
        candidate.mkdir(parents=True, exist_ok=True)
        if os.access(candidate, os.W_OK):
            return candidate
    except OSError:
        pass
    return Path(tempfile.gettempdir()) / f"nemo_gym_view_{os.getuid() if hasattr(os, 'getuid') else 'user'}"


# --------------------------------------------------------------------------------------------------------
# What one line contributes to the table


def _text_of(content: Any) -> str:
    """The text of a message's `content`: a string, or a list of parts with `text` (or `refusal`)."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for part in content:
            if isinstance(part, dict):
                text = part.get("text", part.get("refusal"))
                if isinstance(text, str):
                    parts.append(text)
            elif isinstance(part, str):
                parts.append(part)
        return " ".join(parts)
    return ""


def prompt_preview(params: Any, limit: int = _PREVIEW_CHARS) -> Optional[str]:
    """The last user message of `responses_create_params.input`, on one line and cut to `limit` characters."""
    if not isinstance(params, dict):
        return None
    items = params.get("input")
    text = ""
    if isinstance(items, str):
        text = items
    elif isinstance(items, list):
        for item in items:
            if isinstance(item, dict) and item.get("role") == "user":
                text = _text_of(item.get("content")) or text
    text = " ".join(text.split())
    return text[: limit - 1] + "…" if len(text) > limit else (text or None)


def _number(value: Any) -> Optional[float]:
    if isinstance(value, bool):
        return float(value)
    return float(value) if isinstance(value, (int, float)) else None


def _int(value: Any) -> Optional[int]:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _agent(row: dict) -> Optional[str]:
    ref = row.get("agent_ref")
    name = ref.get("name") if isinstance(ref, dict) else None
    return name if isinstance(name, str) else None


def summarize_rollout(row: Any) -> dict:
    """The table fields of one rollout line (a dict as `ng_collect_rollouts` writes it).

    turns: model turns, i.e. runs of model-made output items between tool outputs; tool calls: output items
    whose type is `function_call` or ends in `_call`; tokens: `usage.total_tokens` (else input + output);
    status: the outcome (`nemo_gym.rollouts.outcome`: ok, incomplete or failed, its reason as `error_type`), or
    `unreadable` (not a JSON object); trajectory: `exact` / `retokenized` / `unusable` (with `trajectory_reason`)
    when any output item carries token ids, else None."""
    if not isinstance(row, dict):
        return {"status": UNREADABLE, "error_type": "NotAnObject"}
    response = row.get("response") if isinstance(row.get("response"), dict) else {}
    output = response.get("output") if isinstance(response.get("output"), list) else []
    turns = tool_calls = 0
    in_turn = False
    for item in output:
        kind = item.get("type") if isinstance(item, dict) else None
        if kind in _TOOL_OUTPUT_TYPES:
            in_turn = False
            continue
        if not in_turn:
            turns += 1
            in_turn = True
        if isinstance(kind, str) and kind.endswith("_call"):
            tool_calls += 1
    usage = response.get("usage") if isinstance(response.get("usage"), dict) else {}
    tokens = _int(usage.get("total_tokens"))
    if tokens is None and (_int(usage.get("input_tokens")) is not None or _int(usage.get("output_tokens")) is not None):
        tokens = (_int(usage.get("input_tokens")) or 0) + (_int(usage.get("output_tokens")) or 0)
    outcome = rollout_outcome(row)
    trajectory = classify_trajectory(row) if has_token_data(row) else None
    return {
        "task": _int(row.get("_ng_task_index")),
        "rollout": _int(row.get("_ng_rollout_index")),
        "agent": _agent(row),
        "reward": _number(row.get("reward")),
        "turns": turns,
        "tool_calls": tool_calls,
        "tokens": tokens,
        "status": outcome.kind,
        "error_type": outcome.reason,
        "message": None if outcome.message is None else outcome.message[:_MESSAGE_CHARS],
        "preview": prompt_preview(row.get("responses_create_params")),
        "trajectory": trajectory.kind if trajectory else None,
        "trajectory_reason": trajectory.reason if trajectory else None,
    }


def summarize_failure(record: Any) -> dict:
    """The table fields of one `_failures.jsonl` line: status `failed`, its error type and message
    (`nemo_gym.rollouts.outcome.failure_outcome`).

    Two shapes: our failure records (`error_type`, `message`, `agent_name`, the input as `row`) and NeMo Gym
    v0.5's sidecar lines, which are the agent's result itself with `_ng_failure_class` (one line per attempt)."""
    if not isinstance(record, dict):
        return {"status": UNREADABLE, "error_type": "NotAnObject"}
    row = record.get("row") if isinstance(record.get("row"), dict) else record
    outcome = failure_outcome(record)
    return {
        "task": _int(record.get("_ng_task_index", row.get("_ng_task_index"))),
        "rollout": _int(record.get("_ng_rollout_index", row.get("_ng_rollout_index"))),
        "agent": failure_agent(record),
        "reward": _number(record.get("reward")) if row is record else None,
        "status": outcome.kind,
        "error_type": outcome.reason,
        "message": None if outcome.message is None else outcome.message[:_MESSAGE_CHARS],
        "preview": prompt_preview(row.get("responses_create_params")),
    }


# --------------------------------------------------------------------------------------------------------
# The index


@dataclass(frozen=True)
class SourceState:
    """How far one source file is indexed."""

    source: int
    path: str
    end_offset: int  # bytes read; lines past it are not in the index yet
    rows: int
    size: int  # the file's size when last looked at (0 when missing)
    generation: int  # +1 each time the index of this file was started afresh

    @property
    def complete(self) -> bool:
        return self.end_offset >= self.size


def _fingerprint(f: Any, start: int, end: int) -> bytes:
    f.seek(start)
    return hashlib.blake2b(f.read(max(0, end - start)), digest_size=16).digest()


class RolloutIndex:
    """The index of one rollouts file and its `_failures.jsonl` (or of a failures file given on its own).

    `update()` brings it up to date with the files (call it again and again while they grow; it is cheap when
    nothing changed). Reading happens elsewhere: `db_path` is a SQLite database with the `rows` table."""

    def __init__(self, path: Union[str, Path], cache_dir: Union[str, Path, None] = None) -> None:
        self.path = Path(path).expanduser().resolve()
        if self.path.stem.endswith(FAILURES_SUFFIX):
            self.sources = {FAILURES: self.path}
        else:
            self.sources = {ROLLOUTS: self.path, FAILURES: failures_path_for(self.path)}
        cache = Path(cache_dir).expanduser() if cache_dir is not None else default_cache_dir()
        cache.mkdir(parents=True, exist_ok=True)
        digest = hashlib.blake2b(str(self.path).encode(), digest_size=8).hexdigest()
        self.db_path = cache / f"{self.path.stem[:60]}-{digest}.sqlite"
        self._lock = threading.Lock()  # one writer at a time (the watcher thread, or a test calling update)
        self._db = self._open()

    def _open(self) -> sqlite3.Connection:
        db = sqlite3.connect(self.db_path, isolation_level=None, check_same_thread=False, timeout=30)
        db.execute("PRAGMA journal_mode=WAL")
        db.execute("PRAGMA synchronous=NORMAL")
        version = None
        try:
            got = db.execute("SELECT value FROM info WHERE key = 'version'").fetchone()
            version = got and got[0]
        except sqlite3.OperationalError:
            pass
        if version != str(INDEX_VERSION):  # an index written by another version of this module: start afresh
            for table in ("rows", "bad_lines", "sources", "info"):
                db.execute(f"DROP TABLE IF EXISTS {table}")
        db.executescript(_SCHEMA)
        db.execute("INSERT OR REPLACE INTO info VALUES ('version', ?)", (str(INDEX_VERSION),))
        return db

    def close(self) -> None:
        with self._lock:
            self._db.close()

    # ------------------------------------------------------------------------------------------------ state
    def state(self) -> dict[int, SourceState]:
        """How far each source is indexed (a source never indexed yet is missing)."""
        with self._lock:
            got = self._db.execute("SELECT source, path, end_offset, rows, size, generation FROM sources").fetchall()
        return {s: SourceState(s, p, e, r, z, g) for s, p, e, r, z, g in got}

    def _source_row(self, source: int) -> Optional[tuple]:
        return self._db.execute(
            "SELECT end_offset, next_line, rows, head, tail, size, mtime_ns, inode, generation FROM sources "
            "WHERE source = ?",
            (source,),
        ).fetchone()

    # ------------------------------------------------------------------------------------------------ update
    def update(self, max_rows: Optional[int] = None) -> int:
        """Index what was added to the files since the last call (everything the first time); start afresh where
        a file was replaced or shrank. Returns the number of rows added. `max_rows` stops early (the rest comes
        with the next call), so a caller can interleave other work."""
        added = 0
        with self._lock:
            for source, path in self.sources.items():
                added += self._update_source(source, path, None if max_rows is None else max_rows - added)
                if max_rows is not None and added >= max_rows:
                    break
        return added

    def _reset(self, source: int, path: Path, generation: int) -> None:
        self._db.execute("BEGIN IMMEDIATE")
        self._db.execute("DELETE FROM rows WHERE source = ?", (source,))
        self._db.execute("DELETE FROM bad_lines WHERE source = ?", (source,))
        self._db.execute(
            "INSERT OR REPLACE INTO sources VALUES (?, ?, 0, 1, 0, NULL, NULL, 0, 0, 0, ?)",
            (source, str(path), generation),
        )
        self._db.execute("COMMIT")

    def _update_source(self, source: int, path: Path, budget: Optional[int]) -> int:
        known = self._source_row(source)
        try:
            st = path.stat()
        except FileNotFoundError:
            if known is not None and (known[2] or known[5]):  # the file went away: so do its rows
                self._reset(source, path, known[8] + 1)
            elif known is None:
                self._reset(source, path, 0)
            return 0
        if known is None:
            self._reset(source, path, 0)
            known = self._source_row(source)
        end, next_line, rows, head, tail, size, mtime_ns, inode, generation = known
        if (st.st_size, st.st_mtime_ns, st.st_ino) == (size, mtime_ns, inode) and end >= st.st_size:
            return 0
        with open(path, "rb") as f:
            if end and (
                st.st_size < end
                or _fingerprint(f, 0, min(end, _FINGERPRINT_BYTES)) != head
                or _fingerprint(f, max(0, end - _FINGERPRINT_BYTES), end) != tail
            ):
                generation += 1
                self._reset(source, path, generation)
                end, next_line, rows = 0, 1, 0
            return self._extend(source, f, st, end, next_line, rows, budget)

    def _extend(self, source: int, f: Any, st: os.stat_result, end: int, line_no: int, rows: int, budget) -> int:
        f.seek(end)
        batch: list[tuple] = []
        bad: list[tuple] = []
        added = 0

        def commit() -> None:
            head = _fingerprint(f, 0, min(end, _FINGERPRINT_BYTES))
            tail = _fingerprint(f, max(0, end - _FINGERPRINT_BYTES), end)
            self._db.execute("BEGIN IMMEDIATE")
            self._db.executemany(_INSERT, batch)
            self._db.executemany("INSERT OR REPLACE INTO bad_lines VALUES (?, ?, ?, ?, ?)", bad)
            self._db.execute(
                "UPDATE sources SET end_offset = ?, next_line = ?, rows = ?, head = ?, tail = ?, size = ?, "
                "mtime_ns = ?, inode = ? WHERE source = ?",
                (end, line_no, rows, head, tail, st.st_size, st.st_mtime_ns, st.st_ino, source),
            )
            self._db.execute("COMMIT")
            batch.clear()
            bad.clear()

        while budget is None or added < budget:
            line = f.readline()
            if not line:
                break
            stripped = line.strip()
            if stripped:
                try:
                    row = parse_row(stripped)
                except NotAnObject as exc:
                    if not line.endswith(b"\n"):  # a line still being written: indexed once it is whole
                        break
                    bad.append((source, end, line_no, exc.reason, exc.detail))
                else:
                    fields = summarize_failure(row) if source == FAILURES else summarize_rollout(row)
                    batch.append((source, end, len(line), line_no, *(fields.get(c) for c in ROW_COLUMNS[4:])))
                    rows += 1
                    added += 1
            elif not line.endswith(b"\n"):
                break
            end += len(line)
            line_no += 1
            if len(batch) >= _BATCH_ROWS:
                pos = f.tell()
                commit()
                f.seek(pos)
        commit()  # stopped before the end (budget, a line being written): the next update goes on from `end`
        return added

    def bad_lines(self, first: int = 5, after: int = 0) -> tuple[int, list[BadLine]]:
        """How many bad lines the files hold (as far as indexed), and `first` of them in file order, from the
        `after`-th on (the failures file's after the rollouts file's)."""
        with self._lock:
            count = self._db.execute("SELECT COUNT(*) FROM bad_lines").fetchone()[0]
            got = self._db.execute(
                "SELECT source, line, reason, detail FROM bad_lines ORDER BY source, offset LIMIT ? OFFSET ?",
                (first, after),
            ).fetchall()
        return count, [BadLine(str(self.sources[s]), n, r, d or "") for s, n, r, d in got]

    # ------------------------------------------------------------------------------------------------ reading
    def read_line(self, source: int, offset: int, length: int) -> bytes:
        """The bytes of one indexed line (without its newline)."""
        with open(self.sources[source], "rb") as f:
            f.seek(offset)
            return f.read(length).rstrip(b"\r\n")

    def iter_lines(self, source: int, start: int, end: int) -> Iterator[tuple[int, bytes]]:
        """(offset, line) for the lines between byte offsets `start` and `end`, streamed (text search)."""
        path = self.sources[source]
        if end <= start or not path.exists():
            return
        with open(path, "rb", buffering=1 << 20) as f:
            f.seek(start)
            offset = start
            while offset < end:
                line = f.readline()
                if not line:
                    return
                yield offset, line
                offset += len(line)
