"""Rollouts grouped by task on disk, for the exports that compare the repeats of a task (DPO pairs, SFT best-of-k).

Rows arrive in file order, the repeats of one task anywhere in the files; grouping them in memory would hold every
row until the end. Each row is stored instead in a private temporary SQLite database (the bounded scratch database
reward profiling uses, deleted when closed) with its group, its reward and its payload (the bytes the export will
write); `groups()` then hands out one group at a time (rewards only) and `payloads()` the rows chosen from it. So
memory holds one task's rewards (and SQLite's bounded page cache), and disk about the size of the payloads.

A group is named by `task_key`: the row's `_ng_task_index` together with a digest of what the model was given
(`instructions`, `input`, `tools`). The index alone is not enough when several files are exported together (two
runs number their tasks from 0 alike); the digest alone would merge two tasks that share a prompt but have
different expected answers.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any, Iterator, Mapping, Optional

import orjson

from nemo_gym.rollouts.collection import TASK_INDEX_KEY_NAME
from nemo_gym.rollouts.row_keys import scratch_db

__all__ = ["task_key", "Member", "Group", "TaskGroups"]


def task_key(rollout: Mapping[str, Any]) -> bytes:
    """16 bytes naming the task a rollout belongs to (see the module docstring)."""
    params = rollout.get("responses_create_params")
    params = params if isinstance(params, Mapping) else {}
    prompt = {key: params.get(key) for key in ("instructions", "input", "tools")}
    task = rollout.get(TASK_INDEX_KEY_NAME)
    text = orjson.dumps([task, prompt], option=orjson.OPT_SORT_KEYS | orjson.OPT_NON_STR_KEYS)
    return hashlib.blake2b(text, digest_size=16).digest()


@dataclass(frozen=True)
class Member:
    seq: int  # the order the row was added in
    reward: Optional[float]


@dataclass(frozen=True)
class Group:
    gid: int
    shared: Optional[bytes]  # what the first row of the group passed as `shared`
    members: list[Member]


class TaskGroups:
    """`add` rows, then walk `groups()` in order of each group's first row and fetch the chosen `payloads`."""

    def __init__(self) -> None:
        self._db = scratch_db()
        self._db.execute("CREATE TABLE g(gid INTEGER PRIMARY KEY, key BLOB NOT NULL UNIQUE, shared BLOB)")
        self._db.execute(
            "CREATE TABLE r(gid INTEGER NOT NULL, seq INTEGER NOT NULL, reward REAL, payload BLOB NOT NULL, "
            "PRIMARY KEY (gid, seq)) WITHOUT ROWID"
        )
        self._tasks = 0
        self._seq = 0

    def __len__(self) -> int:
        return self._seq

    @property
    def tasks(self) -> int:
        return self._tasks

    def add(self, key: bytes, reward: Optional[float], payload: bytes, shared: Optional[bytes] = None) -> None:
        found = self._db.execute("SELECT gid FROM g WHERE key = ?", (key,)).fetchone()
        if found is not None:
            gid = found[0]
        else:
            gid, self._tasks = self._tasks, self._tasks + 1
            self._db.execute("INSERT INTO g(key, gid, shared) VALUES (?, ?, ?)", (key, gid, shared))
        self._db.execute(
            "INSERT INTO r(gid, seq, reward, payload) VALUES (?, ?, ?, ?)", (gid, self._seq, reward, payload)
        )
        self._seq += 1

    def groups(self) -> Iterator[Group]:
        cursor = self._db.execute("SELECT gid, seq, reward FROM r ORDER BY gid, seq")
        current: Optional[int] = None
        members: list[Member] = []
        for gid, seq, reward in cursor:
            if gid != current:
                if current is not None:
                    yield self._group(current, members)
                current, members = gid, []
            members.append(Member(seq, reward))
        if current is not None:
            yield self._group(current, members)

    def _group(self, gid: int, members: list[Member]) -> Group:
        (shared,) = self._db.execute("SELECT shared FROM g WHERE gid = ?", (gid,)).fetchone() or (None,)
        return Group(gid, shared, members)

    def payloads(self, gid: int, seqs: list[int]) -> dict[int, bytes]:
        """The payloads of these rows of group `gid`, by seq."""
        out: dict[int, bytes] = {}
        for seq in seqs:
            row = self._db.execute("SELECT payload FROM r WHERE gid = ? AND seq = ?", (gid, seq)).fetchone()
            if row is not None:
                out[seq] = row[0]
        return out

    def close(self) -> None:
        self._db.close()

    def __enter__(self) -> "TaskGroups":
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()
