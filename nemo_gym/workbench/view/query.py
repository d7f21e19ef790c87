"""What the viewer asks of its rollout files: pages of the table (sorted, filtered), single rows, the repeats of a
task, the run summary. Answered from the indexes (`index.py`), one read connection with each file's database
attached, so a filter or a sort over a million rows is one SQL query and never a pass over the JSONL.

Only the text search reads the files: it streams the indexed lines and keeps the offsets that match in a
temporary table, per search text, and on later calls scans only the lines indexed since (live files).

Outcomes are counted as `nemo_gym.rollouts.outcome` says everywhere: ok / incomplete / failed, a failed rollout once
per (file, task, rollout) however many failure lines (attempts) it has. A line that is not a JSON object is no
rollout (`unreadable`, counted apart, if an index holds any)."""

from __future__ import annotations

import json
import sqlite3
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any, Iterable, Optional

import orjson

from nemo_gym.rollouts.outcome import FAILED, INCOMPLETE, OK, Outcome, OutcomeCounts
from nemo_gym.rollouts.reward_profile import pass_at_k
from nemo_gym.workbench.view.index import FAILURES, ROLLOUTS, UNREADABLE, RolloutIndex

__all__ = ["RolloutQuery", "TableFilter", "SORT_COLUMNS", "STATUSES", "TooManyFiles"]

SORT_COLUMNS = (
    "file", "line", "task", "rollout", "agent", "reward", "turns", "tool_calls", "tokens", "status", "trajectory",
)  # fmt: skip
_SUMMARY_COLUMNS = (
    "file", "id", "source", "line", "task", "rollout", "agent", "reward", "turns", "tool_calls", "tokens", "status",
    "error_type", "preview", "trajectory", "trajectory_reason",
)  # fmt: skip
STATUSES = (OK, INCOMPLETE, FAILED, UNREADABLE)  # the `status` column: an outcome, or a line that is not JSON
# One failed rollout, however many failure lines (attempts) it has: its (file, task, repeat), else the line itself.
_ROLLOUT_KEY = (
    "CASE WHEN task IS NULL OR rollout IS NULL THEN 'line:' || file || ':' || source || ':' || offset "
    "ELSE file || ':' || task || ':' || rollout END"
)
# Failed rollouts per error type, each under the type of its first line (the rollouts file, then the failures file in
# file order), as the reward profile counts them: SQLite takes the bare `error_type` from the row with the MIN.
_FAILED_BY_TYPE = (
    "SELECT error_type, COUNT(*) AS n FROM (SELECT error_type, MIN(source * 1099511627776 + offset) FROM all_rows "
    f"WHERE status = 'failed' GROUP BY {_ROLLOUT_KEY}) GROUP BY error_type ORDER BY n DESC, error_type"
)
_LISTING_COLUMNS = (
    "file", "id", "source", "line", "task", "rollout", "agent", "reward", "status", "error_type", "message",
)  # fmt: skip
_SEARCH_CACHE = 8
_HISTOGRAM_BINS = 20
_SLOW_SUMMARY_S = 0.5  # a summary that took longer is reused for a while when the files grow


class TooManyFiles(ValueError):
    """More files than SQLite can attach to one connection."""


@dataclass(frozen=True)
class TableFilter:
    """The table's filters; None / False / "" means no filter. `status`: one of `STATUSES`; `failed_only` is
    `status="failed"`."""

    min_reward: Optional[float] = None
    max_reward: Optional[float] = None
    agent: Optional[str] = None
    failed_only: bool = False
    text: str = ""
    file: Optional[int] = None
    task: Optional[int] = None
    status: Optional[str] = None


@dataclass
class _Search:
    """The lines of every file that contain one search text, up to the offsets scanned so far."""

    table: str
    scanned: dict[tuple[int, int], tuple[int, int]] = field(default_factory=dict)  # (file, source) -> (gen, end)


def _needles(text: str) -> list[bytes]:
    """The byte strings to look for, lower-cased: the text itself and as it reads inside a JSON string, with
    non-ASCII characters as they are (orjson, our files) or as `\\u` escapes (Python's json module)."""
    low = text.lower()
    forms = [low.encode("utf-8"), orjson.dumps(low)[1:-1], json.dumps(low)[1:-1].encode("ascii").lower()]
    return list(dict.fromkeys(forms))


class RolloutQuery:
    """Read-only queries over the indexes of one or more rollout files (`file` is the position in `indexes`).

    Thread-safe: the web app calls it from its worker threads; the indexes are updated by another thread and
    every query sees what was committed before it started."""

    def __init__(self, indexes: list[RolloutIndex]) -> None:
        self.indexes = indexes
        self._db = sqlite3.connect(":memory:", isolation_level=None, check_same_thread=False)
        limit = self._db.getlimit(sqlite3.SQLITE_LIMIT_ATTACHED)
        if len(indexes) > limit:
            raise TooManyFiles(
                f"ng view opens at most {limit} files at once (got {len(indexes)}); merge the shards into one "
                "file first, or view them in groups"
            )
        for i, ix in enumerate(indexes):
            self._db.execute(f"ATTACH DATABASE ? AS f{i}", (str(ix.db_path),))
        union = " UNION ALL ".join(f"SELECT {i} AS file, * FROM f{i}.rows" for i in range(len(indexes)))
        self._db.execute(f"CREATE TEMP VIEW all_rows AS {union}")
        self._lock = threading.Lock()
        self._search_lock = threading.Lock()
        self._searches: OrderedDict[str, _Search] = OrderedDict()
        self._search_count = 0
        self._memo: dict[Any, tuple[tuple, float, float, Any]] = {}

    def close(self) -> None:
        with self._lock:
            self._db.close()

    def _all(self, sql: str, params: Iterable[Any] = ()) -> list[tuple]:
        with self._lock:
            return self._db.execute(sql, tuple(params)).fetchall()

    # ------------------------------------------------------------------------------------------------ status
    def version(self) -> tuple:
        """Changes whenever any file's index gained rows or was started afresh (the page's refresh signal)."""
        return tuple(
            (s.rows, s.generation, s.end_offset)
            for ix in self.indexes
            for s in sorted(ix.state().values(), key=lambda s: s.source)
        )

    def files(self) -> list[dict]:
        out = []
        for i, ix in enumerate(self.indexes):
            state = ix.state()
            rollouts, failures = state.get(ROLLOUTS), state.get(FAILURES)
            indexed = sum(s.end_offset for s in state.values())
            size = sum(s.size for s in state.values())
            out.append(
                {
                    "file": i,
                    "path": str(ix.path),
                    "name": ix.path.name,
                    "rollouts": rollouts.rows if rollouts else 0,
                    "failures": failures.rows if failures else 0,
                    "bytes": size,
                    "indexed_bytes": indexed,
                }
            )
        return out

    def has_token_data(self) -> bool:
        """Whether any rollout of the files carries token ids (an index lookup, cheap enough to poll)."""
        return bool(self._all("SELECT EXISTS (SELECT 1 FROM all_rows WHERE trajectory IS NOT NULL)")[0][0])

    def agents(self) -> list[str]:
        return [a for (a,) in self._all("SELECT DISTINCT agent FROM all_rows WHERE agent IS NOT NULL ORDER BY agent")]

    # ------------------------------------------------------------------------------------------------ search
    def _search_table(self, text: str) -> str:
        """The temp table of the rows that contain `text` (case-insensitive), brought up to date."""
        with self._search_lock:
            search = self._searches.get(text)
            if search is None:
                self._search_count += 1
                name = f"hits_{self._search_count}"
                with self._lock:
                    columns = "file, source, offset, PRIMARY KEY (file, source, offset)"
                    self._db.execute(f"CREATE TEMP TABLE IF NOT EXISTS {name} ({columns})")
                    self._db.execute(f"DELETE FROM {name}")
                search = self._searches[text] = _Search(name)
                while len(self._searches) > _SEARCH_CACHE:
                    _, old = self._searches.popitem(last=False)
                    with self._lock:
                        self._db.execute(f"DROP TABLE IF EXISTS {old.table}")
            self._searches.move_to_end(text)
            needles = _needles(text)
            for file, ix in enumerate(self.indexes):
                for source, state in ix.state().items():
                    gen, start = search.scanned.get((file, source), (state.generation, 0))
                    if gen != state.generation:  # the file was indexed afresh: its old hits mean nothing
                        with self._lock:
                            stale = f"DELETE FROM {search.table} WHERE file = ? AND source = ?"
                            self._db.execute(stale, (file, source))
                        start = 0
                    hits = []
                    for offset, line in ix.iter_lines(source, start, state.end_offset):
                        low = line.lower()
                        if any(n in low for n in needles):
                            hits.append((file, source, offset))
                            if len(hits) >= 10_000:
                                with self._lock:
                                    self._db.executemany(f"INSERT OR IGNORE INTO {search.table} VALUES (?, ?, ?)", hits)
                                hits.clear()
                    if hits:
                        with self._lock:
                            self._db.executemany(f"INSERT OR IGNORE INTO {search.table} VALUES (?, ?, ?)", hits)
                    search.scanned[(file, source)] = (state.generation, max(start, state.end_offset))
            return search.table

    # ------------------------------------------------------------------------------------------------ table
    def _where(self, flt: TableFilter) -> tuple[str, list[Any]]:
        clauses, params = [], []
        if flt.min_reward is not None:
            clauses.append("reward >= ?")
            params.append(flt.min_reward)
        if flt.max_reward is not None:
            clauses.append("reward <= ?")
            params.append(flt.max_reward)
        if flt.agent:
            clauses.append("agent = ?")
            params.append(flt.agent)
        if flt.status is not None and flt.status not in STATUSES:
            raise ValueError(f"no status `{flt.status}`; statuses: {', '.join(STATUSES)}")
        for status in {flt.status, FAILED if flt.failed_only else None} - {None}:
            clauses.append("status = ?")
            params.append(status)
        if flt.file is not None:
            clauses.append("file = ?")
            params.append(flt.file)
        if flt.task is not None:
            clauses.append("task = ?")
            params.append(flt.task)
        if flt.text.strip():
            table = self._search_table(flt.text.strip())
            clauses.append(f"(file, source, offset) IN (SELECT file, source, offset FROM {table})")
        return (" WHERE " + " AND ".join(clauses)) if clauses else "", params

    def rows(
        self, flt: TableFilter = TableFilter(), *, sort: str = "line", descending: bool = False, offset: int = 0,
        limit: int = 50,
    ) -> dict:
        """One page of the table: `{"total": n, "rows": [...]}` with the summary fields of each row."""
        if sort not in SORT_COLUMNS:
            raise ValueError(f"cannot sort by `{sort}`; sortable columns: {', '.join(SORT_COLUMNS)}")
        where, params = self._where(flt)
        # Ties in file order (reversed with the sort), the way the indexes (`index.py`) are laid out, so that
        # SQLite reads a page straight from an index. Rows without a value (a failure's reward) sort lowest.
        keys = {"line": [], "task": ["task", "rollout"]}.get(sort, [sort])
        if len(self.indexes) > 1:
            keys.append("file")
        direction = " DESC" if descending else ""
        order = ", ".join(k + direction for k in (*keys, "source", "offset"))
        total = self._all(f"SELECT COUNT(*) FROM all_rows{where}", params)[0][0]
        got = self._all(
            f"SELECT {', '.join(_SUMMARY_COLUMNS)} FROM all_rows{where} ORDER BY {order} LIMIT ? OFFSET ?",
            [*params, max(1, min(int(limit), 1000)), max(0, int(offset))],
        )
        return {"total": total, "rows": [dict(zip(_SUMMARY_COLUMNS, r)) for r in got]}

    def row(self, file: int, row_id: int) -> Optional[tuple[dict, bytes]]:
        """(summary, raw line) of one row, or None when it is not (or no longer) in the index."""
        if not 0 <= file < len(self.indexes):
            return None
        got = self._all(
            f"SELECT {', '.join(_SUMMARY_COLUMNS)}, offset, length, message FROM all_rows WHERE file = ? AND id = ?",
            (file, row_id),
        )
        if not got:
            return None
        *summary, offset, length, message = got[0]
        info = dict(zip(_SUMMARY_COLUMNS, summary), message=message)
        return info, self.indexes[file].read_line(info["source"], offset, length)

    def task_rows(self, file: int, task: int, *, all_files: bool = False, limit: int = 32) -> dict:
        """The rollouts of one task, best reward first, then the worst, then the others by reward."""
        where = "task = ? AND source = ?" + ("" if all_files else " AND file = ?")
        params: list[Any] = [task, ROLLOUTS] + ([] if all_files else [file])
        ids = self._all(
            f"SELECT file, id FROM all_rows WHERE {where} ORDER BY reward IS NULL, reward DESC, file, rollout", params
        )
        if len(ids) > 2:
            ids = [ids[0], ids[-1], *ids[1:-1]]
        rows = []
        for f, i in ids[:limit]:
            got = self.row(f, i)
            if got is not None:
                rows.append(got)
        return {"total": len(ids), "rows": rows}

    def listing(self, status: str, *, offset: int = 0, limit: int = 100) -> dict:
        """The rows of one status (the Incomplete and Failed tabs), with their reasons and messages: `{"total":
        rows, "rollouts": distinct rollouts, "rows": [...]}`; failure lines first, then file order."""
        if status not in STATUSES:
            raise ValueError(f"no status `{status}`; statuses: {', '.join(STATUSES)}")
        total, rollouts = self._all(
            f"SELECT COUNT(*), COUNT(DISTINCT {_ROLLOUT_KEY}) FROM all_rows WHERE status = ?", (status,)
        )[0]
        got = self._all(
            f"SELECT {', '.join(_LISTING_COLUMNS)} FROM all_rows WHERE status = ? ORDER BY file, source DESC, line "
            "LIMIT ? OFFSET ?",
            (status, max(1, min(int(limit), 1000)), max(0, int(offset))),
        )
        return {"total": total, "rollouts": rollouts, "rows": [dict(zip(_LISTING_COLUMNS, r)) for r in got]}

    def failures(self, *, offset: int = 0, limit: int = 100) -> dict:
        """The failed rows: lines of `_failures.jsonl` and rollouts whose response failed (`listing("failed")`)."""
        return self.listing(FAILED, offset=offset, limit=limit)

    def outcomes(self) -> dict:
        """ok / incomplete / failed over every file (`OutcomeCounts.as_dict()`, with `text`, the sentence the
        collector prints), `unreadable` lines apart and `failure_lines` (a failed rollout may have several)."""
        return self._cached("outcomes", self._count_outcomes)

    def _count_outcomes(self) -> dict:
        counts = OutcomeCounts()
        by_status = dict(self._all("SELECT status, COUNT(*) FROM all_rows GROUP BY status"))
        counts.ok = by_status.get(OK, 0)
        for reason, n in self._all(
            "SELECT error_type, COUNT(*) FROM all_rows WHERE status = 'incomplete' GROUP BY error_type"
        ):
            counts.add(Outcome(INCOMPLETE, reason), n)
        for reason, n in self._all(_FAILED_BY_TYPE):  # each failed rollout once, under one type
            counts.add(Outcome(FAILED, reason), n)
        return {**counts.as_dict(), UNREADABLE: by_status.get(UNREADABLE, 0), "failure_lines": by_status.get(FAILED, 0)}

    def _cached(self, key: Any, compute: Any) -> Any:
        """`compute()`, reused until the indexes change; while a big file keeps growing, a result that took long
        (seconds on a million rows) is recomputed at most every ten times as long, so live polling cannot keep
        SQLite busy."""
        version = self.version()
        got = self._memo.get(key)
        if got is not None:
            cached_version, done_at, took, value = got
            if cached_version == version or (took > _SLOW_SUMMARY_S and time.monotonic() - done_at < 10 * took):
                return value
        started = time.monotonic()
        value = compute()
        now = time.monotonic()
        self._memo[key] = (version, now, now - started, value)
        return value

    # ------------------------------------------------------------------------------------------------ summary
    def summary(self, pass_threshold: float = 1.0) -> dict:
        """Reward histogram, per-agent counts, mean reward and pass@k, the outcome counts, failed rollouts by error
        type and incomplete ones by reason (cached like `outcomes`)."""
        return self._cached(("summary", pass_threshold), lambda: self._summarize(pass_threshold))

    def _summarize(self, pass_threshold: float) -> dict:
        return {
            "histogram": self._histogram(),
            "agents": self._agent_stats(pass_threshold),
            "outcomes": self.outcomes(),
            "failures": [
                {"error_type": t or "unknown", "status": FAILED, "count": n}
                for t, n in self._all(_FAILED_BY_TYPE)
            ],
            "incomplete": [
                {"reason": r or "no reason given", "status": INCOMPLETE, "count": n}
                for r, n in self._all(
                    "SELECT error_type, COUNT(*) AS n FROM all_rows WHERE status = 'incomplete' "
                    "GROUP BY error_type ORDER BY n DESC, error_type"
                )
            ],
            "pass_threshold": pass_threshold,
            "trajectories": self._trajectories(),
        }

    def _trajectories(self) -> Optional[dict]:
        """The drift check over the rollouts (`nemo_gym.workbench.tokens`): `{"exact": n, "retokenized": n,
        "unusable": n, "reasons": {reason: n}}`, rollouts without token ids counted as unusable `no_token_data`;
        None when no rollout has token ids."""
        got = self._all(
            "SELECT trajectory, trajectory_reason, COUNT(*) FROM all_rows WHERE source = 0 AND status != 'unreadable' "
            "GROUP BY trajectory, trajectory_reason"
        )
        if not any(kind is not None for kind, _, _ in got):
            return None
        out: dict[str, Any] = {"exact": 0, "retokenized": 0, "unusable": 0, "reasons": {}}
        for kind, reason, n in got:
            if kind is None:
                kind, reason = "unusable", "no_token_data"
            out[kind] = out.get(kind, 0) + n
            if kind == "unusable":
                out["reasons"][reason or "unknown"] = out["reasons"].get(reason or "unknown", 0) + n
        out["reasons"] = dict(sorted(out["reasons"].items(), key=lambda kv: (-kv[1], kv[0])))
        return out

    def _histogram(self) -> dict:
        lo, hi, n = self._all("SELECT MIN(reward), MAX(reward), COUNT(reward) FROM all_rows WHERE source = 0")[0]
        if not n:
            return {"bins": [], "count": 0}
        values = self._all(
            f"SELECT reward, COUNT(*) FROM (SELECT reward FROM all_rows WHERE reward IS NOT NULL AND source = 0) "
            f"GROUP BY reward ORDER BY reward LIMIT {_HISTOGRAM_BINS + 1}"
        )
        if len(values) <= _HISTOGRAM_BINS:  # few distinct rewards (0/1, a grading scale): one bar each
            return {"bins": [{"lo": v, "hi": v, "count": c} for v, c in values], "count": n, "discrete": True}
        width = (hi - lo) / _HISTOGRAM_BINS
        counts = dict(
            self._all(
                "SELECT MIN(CAST((reward - ?) / ? AS INTEGER), ?) AS b, COUNT(*) FROM all_rows "
                "WHERE reward IS NOT NULL AND source = 0 GROUP BY b",
                (lo, width, _HISTOGRAM_BINS - 1),
            )
        )
        bins = [
            {"lo": lo + b * width, "hi": lo + (b + 1) * width, "count": counts.get(b, 0)}
            for b in range(_HISTOGRAM_BINS)
        ]
        return {"bins": bins, "count": n, "discrete": False}

    def _agent_stats(self, pass_threshold: float) -> list[dict]:
        """Per agent (per file when several files are open): rollouts, failures, mean reward and tokens, pass@k
        for k = 1 .. the most rewarded rollouts of a task (averaged over the tasks that have at least k)."""
        label = "agent" if len(self.indexes) == 1 else "file || ':' || COALESCE(agent, '')"
        stats: dict[str, dict] = {}
        # The outcome counts (`nemo_gym.rollouts.outcome`), as the reward profile's num_ok / num_incomplete /
        # num_failed: "rollouts" are the rows of the rollouts file (ok and incomplete ones have a reward); a failed
        # rollout is counted once however many failure lines it has; unreadable lines are no rollout of any agent.
        for name, rollouts, ok, incomplete, mean, tokens in self._all(
            f"SELECT {label} AS a, SUM(source = 0), SUM(status = 'ok'), SUM(status = 'incomplete'), "
            f"AVG(CASE WHEN source = 0 THEN reward END), AVG(tokens) FROM all_rows WHERE status != 'unreadable' "
            "GROUP BY a ORDER BY a"
        ):
            stats[name] = {
                "agent": self._label(name), "rollouts": rollouts, "ok": ok, "incomplete": incomplete, "failed": 0,
                "mean_reward": mean, "mean_tokens": tokens, "tasks": 0, "pass_at_k": [],
            }  # fmt: skip
        for name, failed in self._all(
            f"SELECT {label} AS a, COUNT(DISTINCT {_ROLLOUT_KEY}) FROM all_rows WHERE status = 'failed' GROUP BY a"
        ):
            if name in stats:
                stats[name]["failed"] = failed
        # pass@k from (n rewarded, c passed) per task, counted in SQL: few distinct (n, c) pairs even for 1M rows.
        sums: dict[str, dict[int, list[float]]] = {}
        for name, n, c, tasks in self._all(
            f"SELECT a, n, c, COUNT(*) FROM (SELECT {label} AS a, COUNT(reward) AS n, SUM(reward >= ?) AS c "
            "FROM all_rows WHERE source = 0 AND reward IS NOT NULL GROUP BY a, file, task) GROUP BY a, n, c",
            (pass_threshold,),
        ):
            if name not in stats or not n:
                continue
            stats[name]["tasks"] += tasks
            per_k = sums.setdefault(name, {})
            for k in range(1, n + 1):
                entry = per_k.setdefault(k, [0.0, 0])
                entry[0] += pass_at_k(n, c, k) * tasks
                entry[1] += tasks
        for name, per_k in sums.items():
            stats[name]["pass_at_k"] = [{"k": k, "value": s / t, "tasks": t} for k, (s, t) in sorted(per_k.items())]
        return list(stats.values())

    def _label(self, name: Any) -> str:
        if len(self.indexes) == 1:
            return name if name is not None else "(no agent)"
        file, _, agent = str(name).partition(":")
        return f"{self.indexes[int(file)].path.name}: {agent or '(no agent)'}"
