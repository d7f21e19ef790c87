"""What a server writes to its terminal: access lines, and every output line prefixed with the server's id.

`ng_run` forwards each child's output with the server id in front; a server started by hand prefixes its own
lines (`prefix_process_output`). 200 access lines are hidden unless `uvicorn_logging_show_200_ok: true`: at
hundreds of requests per second they drown everything else.
"""

from __future__ import annotations

import logging
import sys
import threading
from typing import Any, Optional

__all__ = [
    "ACCESS_LOGGER_NAME",
    "log_access",
    "HideOkAccessLogFilter",
    "install_access_log_filter",
    "LinePrefixingWriter",
    "prefix_process_output",
]

ACCESS_LOGGER_NAME = "nemo_gym.access"


def log_access(scope: dict, status: int) -> None:
    """One access line, as uvicorn writes it (`client - "METHOD /path HTTP/1.1" status`)."""
    client = scope.get("client")
    client_addr = f"{client[0]}:{client[1]}" if client else ""
    path = scope.get("root_path", "") + scope.get("path", "")
    if scope.get("query_string"):
        path += "?" + scope["query_string"].decode("ascii", errors="replace")
    logging.getLogger(ACCESS_LOGGER_NAME).info(
        '%s - "%s %s HTTP/%s" %d', client_addr, scope.get("method", ""), path, scope.get("http_version", "1.1"), status
    )


class HideOkAccessLogFilter(logging.Filter):
    """Drops uvicorn access-log records whose status is 200 (errors and other statuses stay visible)."""

    def filter(self, record: logging.LogRecord) -> bool:
        args = record.args
        return not (isinstance(args, tuple) and len(args) >= 5 and args[4] == 200)


def install_access_log_filter(show_200_ok: bool = False) -> None:
    """Hide `200 OK` access lines unless `show_200_ok` (config `uvicorn_logging_show_200_ok: true`)."""
    access = logging.getLogger("uvicorn.access")
    for existing in [f for f in access.filters if isinstance(f, HideOkAccessLogFilter)]:
        access.removeFilter(existing)
    if not show_200_ok:
        access.addFilter(HideOkAccessLogFilter())


class LinePrefixingWriter:
    """A text stream wrapper that writes `prefix` at the start of every output line.

    Whole lines: text is buffered per thread until a newline, so lines written by different threads never
    interleave mid-line (`print` writes the text and the newline in two calls). A partial line is written
    out on `flush()` (e.g. `print(..., end="", flush=True)`). Every write that completes lines flushes the
    underlying stream. Other attributes (`fileno`, `isatty`, `encoding`, `buffer`, ...) are the wrapped
    stream's.
    """

    def __init__(self, stream: Any, prefix: str) -> None:
        self._stream = stream
        self._prefix = prefix
        self._lock = threading.RLock()
        self._pending: dict[int, str] = {}
        self._mid_line_owner: Optional[int] = None  # thread whose partial line is on screen

    @property
    def wrapped(self) -> Any:
        return self._stream

    @property
    def prefix(self) -> str:
        return self._prefix

    def write(self, s: str) -> int:
        if not isinstance(s, str):
            raise TypeError(f"write() argument must be str, not {type(s).__name__}")
        if not s:
            return 0
        tid = threading.get_ident()
        with self._lock:
            pending = self._pending.pop(tid, None)
            text = pending + s if pending else s
            cut = text.rfind("\n") + 1
            if cut == 0:
                self._pending[tid] = text
                return len(s)
            if cut < len(text):
                self._pending[tid] = text[cut:]
            self._emit_lines(text[:cut], tid)
            self._stream.flush()
        return len(s)

    def _emit_lines(self, complete: str, tid: int) -> None:
        prefix = self._prefix
        lines = complete.split("\n")
        lines.pop()  # `complete` ends with "\n"
        head = ""
        owner = self._mid_line_owner
        if owner is not None:
            self._mid_line_owner = None
            if owner == tid:  # this thread continues its partial line: no prefix on the first line
                head = lines.pop(0) + "\n"
            else:  # another thread's partial line is open: end it first
                head = "\n"
        self._stream.write(head + "".join(prefix + line + "\n" for line in lines))

    def writelines(self, lines: Any) -> None:
        for line in lines:
            self.write(line)

    def flush(self) -> None:
        tid = threading.get_ident()
        with self._lock:
            pending = self._pending.pop(tid, None)
            if pending:
                owner = self._mid_line_owner
                if owner is None:
                    out = self._prefix + pending
                elif owner == tid:
                    out = pending
                else:
                    out = "\n" + self._prefix + pending
                self._mid_line_owner = tid
                self._stream.write(out)
            self._stream.flush()

    def flush_all(self) -> None:
        """Write out the partial lines of every thread (at exit)."""
        with self._lock:
            try:
                for tid, pending in list(self._pending.items()):
                    del self._pending[tid]
                    if not pending:
                        continue
                    owner = self._mid_line_owner
                    if owner == tid:
                        out = pending + "\n"
                    elif owner is None:
                        out = self._prefix + pending + "\n"
                    else:
                        out = "\n" + self._prefix + pending + "\n"
                    self._mid_line_owner = None
                    self._stream.write(out)
                if self._mid_line_owner is not None:
                    self._mid_line_owner = None
                    self._stream.write("\n")
                self._stream.flush()
            except Exception:  # pragma: no cover - the stream may be closed at exit
                pass

    def isatty(self) -> bool:
        return self._stream.isatty()

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):  # not set up (e.g. during copy/unpickling): no recursion through _stream
            raise AttributeError(name)
        return getattr(self._stream, name)


def prefix_process_output(prefix: str) -> None:
    """Wrap `sys.stdout`/`sys.stderr` in `LinePrefixingWriter`s (idempotent) and re-point logging stream
    handlers that already write to the raw streams (uvicorn's, when logging was configured first)."""
    import atexit

    replaced: dict[int, LinePrefixingWriter] = {}
    for name in ("stdout", "stderr"):
        stream = getattr(sys, name)
        if stream is None or isinstance(stream, LinePrefixingWriter):
            continue
        writer = LinePrefixingWriter(stream, prefix)
        setattr(sys, name, writer)
        replaced[id(stream)] = writer
        atexit.register(writer.flush_all)
    if not replaced:
        return
    loggers = [logging.getLogger()] + [
        lg for lg in logging.Logger.manager.loggerDict.values() if isinstance(lg, logging.Logger)
    ]
    for lg in loggers:
        for handler in lg.handlers:
            stream = getattr(handler, "stream", None)
            if isinstance(handler, logging.StreamHandler) and id(stream) in replaced:
                handler.setStream(replaced[id(stream)])


