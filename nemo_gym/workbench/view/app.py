"""The viewer's web app: the page (`static/`, shipped in the package, nothing fetched from elsewhere) and the JSON
API it reads, over a `RolloutQuery`. A `Watcher` thread keeps the indexes up to date, so a file that
`ng_collect_rollouts` is still writing shows its new rows on the page's next poll.

The API only ever reads the files it was started with, by their position (`file`) and index row (`id`).

Bad lines (not JSON objects) are no rows: `ng view` refuses files that hold any unless `--skip-bad-lines`; a bad
line that appears while a file is followed is skipped, named on stderr and counted in `/api/status` (`bad_lines`
of each file), which the page shows."""

from __future__ import annotations

import sys
import threading
from pathlib import Path
from typing import Optional, Sequence

import orjson
from fastapi import FastAPI, HTTPException, Path as PathParam, Query
from fastapi.responses import FileResponse, Response
from fastapi.staticfiles import StaticFiles

from nemo_gym.serving.host_check import HostCheck, HostPolicy
from nemo_gym.workbench.view.index import RolloutIndex
from nemo_gym.workbench.view.query import SORT_COLUMNS, STATUSES, RolloutQuery, TableFilter

__all__ = ["STATIC_DIR", "Watcher", "create_app"]

STATIC_DIR = Path(__file__).parent / "static"
_UPDATE_BATCH = 20_000  # rows indexed per file before the watcher moves on to the next file
# The numbers the API takes are SQLite integers and finite floats: anything else is a 422 naming the parameter
# (a bigger integer would overflow SQLite's binding, NaN would compare false everywhere), never a 500.
_INT64 = 2**63 - 1
_ID = {"ge": 0, "le": _INT64}  # a file position, a row id, an offset
_TASK = {"ge": -_INT64 - 1, "le": _INT64}
_FINITE = {"allow_inf_nan": False}


def _json(data: object) -> Response:
    return Response(orjson.dumps(data), media_type="application/json")


class Watcher:
    """A daemon thread that indexes the files, then looks for growth every `interval_s` seconds. Bad lines found on
    the way are named on stderr (the first few of each round, then their count)."""

    def __init__(self, indexes: list[RolloutIndex], interval_s: float = 1.0) -> None:
        self.indexes = indexes
        self.interval_s = interval_s
        self.errors: dict[int, str] = {}
        self.bad_lines_seen = [ix.bad_lines(first=0)[0] for ix in indexes]  # those reported when the viewer started
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="ng-view-indexer", daemon=True)

    def start(self) -> "Watcher":
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)

    def _loop(self) -> None:
        while not self._stop.is_set():
            busy = False
            for i, ix in enumerate(self.indexes):
                try:
                    busy |= ix.update(max_rows=_UPDATE_BATCH) >= _UPDATE_BATCH
                    self.errors.pop(i, None)
                    self._report_new_bad_lines(i, ix)
                except (OSError, ValueError) as exc:  # unreadable file: shown on the page, retried next round
                    self.errors[i] = f"{type(exc).__name__}: {exc}"
            if not busy:
                self._stop.wait(self.interval_s)

    def _report_new_bad_lines(self, i: int, ix: RolloutIndex) -> None:
        count, new = ix.bad_lines(after=self.bad_lines_seen[i])
        if count <= self.bad_lines_seen[i]:
            return
        more = count - self.bad_lines_seen[i] - len(new)
        self.bad_lines_seen[i] = count
        lines = [f"warning: ng_view: skipped a bad line that appeared while viewing: {bad}" for bad in new]
        if more > 0:
            lines.append(f"warning: ng_view: ... and {more} more")
        sys.stderr.write("\n".join(lines) + "\n")
        sys.stderr.flush()


def create_app(
    query: RolloutQuery,
    *,
    watcher: Optional[Watcher] = None,
    pass_threshold: float = 1.0,
    allowed_hosts: Sequence[str] = ("127.0.0.1", "localhost"),
) -> FastAPI:
    """The viewer app over `query`; `watcher` (when given) reports indexing errors on `/api/status`.

    Requests must name one of `allowed_hosts` (or a loopback address) in their Host header, and a page that
    sends an Origin must be on one of them: a web page elsewhere that points its own domain at 127.0.0.1 (DNS
    rebinding) gets nothing. `("*",)` allows any (serving on a non-loopback address). The rule is every server's
    (`serving/host_check.py`)."""
    app = FastAPI(title="nemo_gym rollout viewer", docs_url=None, redoc_url=None, openapi_url=None)
    app.add_middleware(HostCheck, policy=HostPolicy(allowed_hosts))
    app.mount("/static", StaticFiles(directory=STATIC_DIR), name="static")

    @app.get("/")
    def page() -> FileResponse:
        return FileResponse(STATIC_DIR / "index.html", headers={"Cache-Control": "no-store"})

    @app.get("/favicon.ico")
    def favicon() -> Response:
        return Response(status_code=204)

    @app.get("/api/status")
    def status() -> Response:
        files = query.files()
        for f, ix in zip(files, query.indexes):
            f["error"] = watcher.errors.get(f["file"]) if watcher else None
            f["bad_lines"] = ix.bad_lines(first=0)[0]  # skipped: not rows of the table
        return _json(
            {
                "version": str(hash(query.version())),
                "files": files,
                "agents": query.agents(),
                "token_data": query.has_token_data(),
                "outcomes": query.outcomes(),
            }
        )

    @app.get("/api/rows")
    def rows(
        sort: str = "line",
        desc: bool = False,
        offset: int = Query(0, **_ID),
        limit: int = Query(50, ge=1, le=1000),
        min_reward: Optional[float] = Query(None, **_FINITE),
        max_reward: Optional[float] = Query(None, **_FINITE),
        agent: Optional[str] = None,
        failed: bool = False,
        q: str = "",
        file: Optional[int] = Query(None, **_ID),
        task: Optional[int] = Query(None, **_TASK),
        status: Optional[str] = None,
    ) -> Response:
        if sort not in SORT_COLUMNS:
            raise HTTPException(400, f"cannot sort by `{sort}`; sortable columns: {', '.join(SORT_COLUMNS)}")
        if status and status not in STATUSES:
            raise HTTPException(400, f"no status `{status}`; statuses: {', '.join(STATUSES)}")
        flt = TableFilter(min_reward, max_reward, agent or None, failed, q, file, task, status or None)
        return _json(query.rows(flt, sort=sort, descending=desc, offset=offset, limit=limit))

    def _one(file: int, row_id: int) -> tuple[dict, bytes]:
        got = query.row(file, row_id)
        if got is None:
            raise HTTPException(404, f"no row {row_id} in file {file} (the file may have been rewritten; reload)")
        return got

    @app.get("/api/rollout/{file}/{row_id}")
    def rollout(file: int = PathParam(**_ID), row_id: int = PathParam(**_ID)) -> Response:
        return Response(_info_and_row(*_one(file, row_id)), media_type="application/json")

    @app.get("/api/raw/{file}/{row_id}")
    def raw(file: int = PathParam(**_ID), row_id: int = PathParam(**_ID)) -> Response:
        """The line exactly as it is in the file."""
        return Response(_one(file, row_id)[1], media_type="application/json")

    @app.get("/api/task/{file}/{task}")
    def task(file: int = PathParam(**_ID), task: int = PathParam(**_TASK), all_files: bool = False) -> Response:
        got = query.task_rows(file, task, all_files=all_files)
        body = b",".join(_info_and_row(info, line) for info, line in got["rows"])
        return Response(b'{"total":%d,"rows":[%s]}' % (got["total"], body), media_type="application/json")

    @app.get("/api/summary")
    def summary(threshold: Optional[float] = Query(None, **_FINITE)) -> Response:
        return _json(query.summary(pass_threshold if threshold is None else threshold))

    @app.get("/api/failures")
    def failures(
        offset: int = Query(0, **_ID), limit: int = Query(100, ge=1, le=1000), status: str = "failed"
    ) -> Response:
        """The failed rows (the Failed tab), or those of another status (`status=incomplete`: the Incomplete tab)."""
        if status not in STATUSES:
            raise HTTPException(400, f"no status `{status}`; statuses: {', '.join(STATUSES)}")
        return _json(query.listing(status, offset=offset, limit=limit))

    return app


def _info_and_row(info: dict, line: bytes) -> bytes:
    """`{"info": <index fields>, "row": <the line>}`, the line passed through as it is in the file."""
    return b'{"info":' + orjson.dumps(info) + b',"row":' + _as_json(line) + b"}"


def _as_json(line: bytes) -> bytes:
    """A stored line as a JSON value: the line itself when it parses, else the text as a JSON string."""
    try:
        orjson.loads(line)
        return line
    except orjson.JSONDecodeError:
        return orjson.dumps(line.decode("utf-8", errors="replace"))
