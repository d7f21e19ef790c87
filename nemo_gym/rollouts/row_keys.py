"""Compact per-row bookkeeping of a collection, so memory stays flat from 1k to 1M+ input rows.

- `TaskIndexMap`: line digest -> (task index, next rollout index). A plain dict while the input has few distinct
  lines (fast, and nothing touches the disk for small inputs); past `spill_after` distinct lines everything moves
  to a private temporary SQLite database (a bounded 4 MB page cache; the file, about 50 bytes per distinct line,
  is in SQLite's temp folder - `SQLITE_TMPDIR`, `TMPDIR`, /var/tmp or /tmp - and is deleted when the map is
  closed), so the memory it holds no longer grows with the input. About 3 us per new line once spilled.
- `RolloutKeySpace` / `FinishedRollouts`: the (task, rollout) keys already in an output file, on resume, as one
  bit per row of the materialized inputs instead of a `set` of ints (about 90 bytes per key). When the
  materialized file has the regular shape `materialize_input_file` writes for distinct lines (task t holds
  rollouts 0..R-1, rows in order), a key's bit is `t * R + r` and no per-task state is kept; otherwise (duplicate
  lines) a per-task offsets array (4 bytes a task); a file whose indices are not those of a materialization
  (negative, or more tasks than rows) falls back to a set.

`FinishedRollouts` answers `packed_key in finished` for the packed keys of `collection._key` (task << 32 |
rollout), like the set it replaces; keys outside the materialized rows are ignored (they never match a row).
"""

from __future__ import annotations

import sqlite3
from array import array
from typing import Callable, Iterable, Iterator, Optional

__all__ = ["TaskIndexMap", "RolloutKeySpace", "FinishedRollouts", "DEFAULT_SPILL_AFTER"]

# Distinct lines kept in a dict before moving to SQLite: about 2 MB of dict.
DEFAULT_SPILL_AFTER = 1 << 14
# SQLite page cache of the spilled map, in KiB (negative = KiB for the pragma).
_SQLITE_CACHE_KIB = 4096

_INSERT_NEW = "INSERT OR IGNORE INTO m(d, t, n) VALUES (?, ?, ?)"
_UPSERT = (
    "INSERT INTO m(d, t, n) VALUES (?, ?, ?) ON CONFLICT(d) DO UPDATE SET n = n + excluded.n RETURNING t, n"
)



def scratch_db(cache_kib: int = _SQLITE_CACHE_KIB) -> sqlite3.Connection:
    """A private temporary SQLite database for data that outgrows memory: on disk in SQLite's temp folder (the
    name "" makes it private and deleted when closed), no journal, no syncs, a page cache of `cache_kib`, and one
    transaction for the whole run, since nothing in it ever needs to survive the process."""
    db = sqlite3.connect("", isolation_level=None, check_same_thread=False)
    db.execute("PRAGMA journal_mode=OFF")
    db.execute("PRAGMA synchronous=OFF")
    db.execute(f"PRAGMA cache_size=-{int(cache_kib)}")
    db.execute("BEGIN")
    return db

class TaskIndexMap:
    """Line digest (bytes) -> task index, with a running rollout counter per task.

    `claim(digest, n)` returns `(task, first)`: the digest's task index (the next free one, 0, 1, 2, ..., for a
    digest never seen) and the first of the `n` rollout indices it hands out for this line (the task's rollouts
    so far), and counts those `n`."""

    def __init__(self, spill_after: int = DEFAULT_SPILL_AFTER) -> None:
        self.spill_after = max(0, int(spill_after))
        self._mem: Optional[dict[bytes, int]] = {}
        self._next = array("q")
        self._db: Optional[sqlite3.Connection] = None
        self._cur: Optional[sqlite3.Cursor] = None
        self._count = 0

    def __len__(self) -> int:
        return self._count

    @property
    def spilled(self) -> bool:
        return self._db is not None

    def claim(self, digest: bytes, n: int = 1) -> tuple[int, int]:
        mem = self._mem
        if mem is not None:
            task = mem.get(digest)
            if task is not None:
                first = self._next[task]
                self._next[task] = first + n
                return task, first
            if self._count < self.spill_after:
                task = self._count
                mem[digest] = task
                self._next.append(n)
                self._count += 1
                return task, 0
            self._spill()
        cur = self._cur
        assert cur is not None
        task = self._count
        if cur.execute(_INSERT_NEW, (digest, task, n)).rowcount == 1:  # the common case of a new line: 1 statement
            self._count += 1
            return task, 0
        task, after = cur.execute(_UPSERT, (digest, task, n)).fetchone()
        return task, after - n

    def _spill(self) -> None:
        db = scratch_db(_SQLITE_CACHE_KIB)
        db.execute("CREATE TABLE m(d BLOB PRIMARY KEY, t INTEGER NOT NULL, n INTEGER NOT NULL) WITHOUT ROWID")
        assert self._mem is not None
        nxt = self._next
        db.executemany("INSERT INTO m(d, t, n) VALUES (?, ?, ?)", ((d, t, nxt[t]) for d, t in self._mem.items()))
        self._db = db
        self._cur = db.cursor()
        self._mem = None
        self._next = array("q")

    def close(self) -> None:
        """Free the map (the temporary database file is deleted)."""
        if self._db is not None:
            self._db.close()
            self._db = self._cur = None
        self._mem = None
        self._next = array("q")

    def __enter__(self) -> "TaskIndexMap":
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()


_MASK32 = (1 << 32) - 1


class RolloutKeySpace:
    """Where the bit of each (task, rollout) of a materialized-inputs file is: `position(task, rollout)` is in
    0..size-1, or None for a key that is not one of the file's rows (or, in the offsets layout, past the task's
    highest rollout). `layout` is "uniform" (no per-task state), "offsets" (4 bytes a task) or "sparse"
    (no bitmap: `FinishedRollouts` uses a set)."""

    def __init__(self, layout: str, size: int, tasks: int, per_task: int = 0, offsets: Optional[array] = None):
        self.layout = layout
        self.size = size
        self.tasks = tasks
        self.per_task = per_task
        self.offsets = offsets

    @classmethod
    def from_pairs(cls, pairs: Callable[[], Iterable[tuple[int, int]]]) -> "RolloutKeySpace":
        """Build from `pairs()`, an iterable of the (task, rollout) of every row in file order; it is called once,
        or twice for files with duplicate lines (a second pass counts the rollouts per task)."""
        total = 0
        per_task = 0  # R of the regular shape, once known
        uniform = True
        max_task = -1
        negative = False
        for task, rollout in pairs():
            if task < 0 or rollout < 0:
                negative = True
            if task > max_task:
                max_task = task
            if uniform:
                if per_task == 0:
                    if task == 0 and rollout == total:
                        total += 1
                        continue
                    if total == 0 or task != 1 or rollout != 0:
                        uniform = False
                    else:
                        per_task = total
                if uniform and (task != total // per_task or rollout != total % per_task):
                    uniform = False
            total += 1
        if uniform:
            if per_task == 0:  # only task 0 (or nothing)
                per_task = total
            if per_task == 0 or total % per_task == 0:
                tasks = total // per_task if per_task else 0
                return cls("uniform", tasks * per_task, tasks, per_task=per_task)
        if negative or max_task >= total:
            return cls("sparse", 0, max_task + 1)
        counts = array("I", bytes(4 * (max_task + 1)))
        for task, rollout in pairs():
            if rollout >= counts[task]:
                if rollout >= _MASK32:
                    return cls("sparse", 0, max_task + 1)
                counts[task] = rollout + 1
        running = 0
        try:
            for i, c in enumerate(counts):
                counts[i] = running
                running += c
            counts.append(running)
        except OverflowError:  # 2**32 bits or more: not a materialization this process could have written
            return cls("sparse", 0, max_task + 1)
        return cls("offsets", running, max_task + 1, offsets=counts)

    def position(self, task: int, rollout: int) -> Optional[int]:
        if task < 0 or rollout < 0 or task >= self.tasks:
            return None
        if self.layout == "uniform":
            return task * self.per_task + rollout if rollout < self.per_task else None
        if self.layout == "offsets":
            offsets = self.offsets
            assert offsets is not None
            start = offsets[task]
            pos = start + rollout
            return pos if pos < offsets[task + 1] else None
        return None


class FinishedRollouts:
    """The finished (task, rollout) keys of a resumed collection, one bit per materialized row. Behaves like the
    set of packed keys it replaces for `add(key)`, `key in finished`, `len` and truth; keys that are not rows of
    the materialized inputs are not kept (they could never match a row)."""

    def __init__(self, space: RolloutKeySpace) -> None:
        self.space = space
        self._set: Optional[set[int]] = set() if space.layout == "sparse" else None
        self._bits = bytearray((space.size + 7) // 8) if self._set is None else bytearray()
        self._count = 0

    def _pos(self, key: int) -> Optional[int]:
        return self.space.position(key >> 32, key & _MASK32)

    def add(self, key: int) -> None:
        if self._set is not None:
            self._set.add(key)
            return
        pos = self._pos(key)
        if pos is None:
            return
        byte, bit = pos >> 3, 1 << (pos & 7)
        if not self._bits[byte] & bit:
            self._bits[byte] |= bit
            self._count += 1

    def __contains__(self, key: object) -> bool:
        if not isinstance(key, int):
            return False
        if self._set is not None:
            return key in self._set
        pos = self._pos(key)
        return pos is not None and bool(self._bits[pos >> 3] & (1 << (pos & 7)))

    def __len__(self) -> int:
        return len(self._set) if self._set is not None else self._count

    def __bool__(self) -> bool:
        return len(self) > 0

    def __iter__(self) -> Iterator[int]:
        if self._set is not None:
            yield from self._set
            return
        space = self.space
        if space.layout == "uniform":
            for pos in self._iter_set_bits():
                task, rollout = divmod(pos, space.per_task)
                yield (task << 32) | rollout
            return
        offsets = space.offsets
        assert offsets is not None
        task = 0
        for pos in self._iter_set_bits():
            while offsets[task + 1] <= pos:
                task += 1
            yield (task << 32) | (pos - offsets[task])

    def _iter_set_bits(self) -> Iterator[int]:
        for byte_index, byte in enumerate(self._bits):
            if byte:
                for bit in range(8):
                    if byte & (1 << bit):
                        yield byte_index * 8 + bit
