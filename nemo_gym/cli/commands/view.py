"""`ng_view` / `ng view FILE...`: look at rollout files in the browser (a local web app, `nemo_gym/workbench/view`)."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Optional, Union

from pydantic import Field

from nemo_gym.cli.command import Command
from nemo_gym.config.types import BaseNeMoGymCLIConfig
from nemo_gym.errors import NeMoGymConfigError
from nemo_gym.rollouts.jsonl import SKIP_BAD_LINES_HELP, BadLines

_LOOPBACK = ("127.0.0.1", "localhost", "::1")


class ViewConfig(BaseNeMoGymCLIConfig):
    """Serve a page on this machine that shows rollout files: a table of rollouts to sort and filter, each
    rollout as a conversation with its tool calls and reward, the repeats of a task side by side, the run's
    reward histogram, pass@k and failures, and the <stem>_failures.jsonl rows. Files still being written by
    ng_collect_rollouts refresh live. Each file is indexed once into a cache (big files are never loaded whole)
    before the page is served. A line that is not a JSON object refuses the files (exit 2) unless --skip-bad-lines;
    one that appears while a file is followed is skipped and named on stderr. Runs until Ctrl-C."""

    input_jsonl_fpath: Union[str, list[str]] = Field(
        description="Rollout file(s) written by ng_collect_rollouts (their _failures.jsonl is read too)."
    )
    host: str = Field(default="127.0.0.1", description="Address to serve on (loopback by default).")
    port: Optional[int] = Field(default=None, ge=0, le=65535, description="Port to serve on (null = a free one).")
    browser: bool = Field(default=True, description="Open the page in a web browser (--no-browser: don't).")
    pass_threshold: float = Field(default=1.0, description="A rollout passes when reward >= this (for pass@k).")
    refresh_s: float = Field(default=1.0, gt=0, description="How often to look for new lines in the files.")
    cache_dir: Optional[str] = Field(
        default=None, description="Where the indexes go (null = NEMO_GYM_VIEW_CACHE, else ~/.cache/nemo_gym/view)."
    )
    skip_bad_lines: bool = Field(default=False, description=SKIP_BAD_LINES_HELP)


def _input_paths(value: Union[str, list[str]]) -> list[Path]:
    names = [value] if isinstance(value, str) else list(value)
    if not names:
        raise NeMoGymConfigError("No rollout file given: ng view ROLLOUTS.jsonl [MORE.jsonl ...]")
    paths = []
    for name in names:
        path = Path(str(name)).expanduser()
        if not path.is_file():
            raise NeMoGymConfigError(
                f"Rollout file not found: {path} (+input_jsonl_fpath). Pass the output_jsonl_fpath of an "
                "ng_collect_rollouts run."
            )
        paths.append(path)
    return paths


def _open_browser(url: str) -> None:
    """Open `url` in a graphical browser. Without a display (a server over ssh) nothing is opened: Python's
    `webbrowser` would otherwise start a text browser in this terminal and hold it."""
    if sys.platform.startswith("linux") and not (os.environ.get("DISPLAY") or os.environ.get("WAYLAND_DISPLAY")):
        print("No display here: open the address above in a browser (with ssh -L to forward the port).")
        return
    import webbrowser

    try:
        webbrowser.open(url)
    except Exception:  # no usable browser: the address is printed above
        pass


_BIG_BYTES = 64 << 20  # files with more than this left to index get a note while the viewer starts


def _index_now(indexes: list, skip_bad_lines: bool) -> None:
    """Bring every index up to date before serving, so bad lines are known: refused (`BadLinesRefused`, exit 2)
    unless `skip_bad_lines`, in which case they are listed on stderr. An index from an earlier `ng view` is reused."""
    bad_lines = BadLines(skip=skip_bad_lines, not_done="the viewer was not started")
    for ix in indexes:
        state = ix.state()
        left = sum(
            max(0, (path.stat().st_size if path.exists() else 0) - (state[s].end_offset if s in state else 0))
            for s, path in ix.sources.items()
        )
        if left > _BIG_BYTES:
            note = f"{left / 2**20:.0f} MB to read; the next ng view reuses the index"
            print(f"Indexing {ix.path} ({note}) ...", flush=True)
        ix.update()
        count, first = ix.bad_lines()
        bad_lines.add_counted(first, count)
    bad_lines.check()
    bad_lines.warn_skipped(COMMAND.script)


def run(config: ViewConfig) -> int:
    import uvicorn

    from nemo_gym.config.ports import reserve_port, take_reserved_socket
    from nemo_gym.workbench.view.app import Watcher, create_app
    from nemo_gym.workbench.view.index import RolloutIndex
    from nemo_gym.workbench.view.query import RolloutQuery, TooManyFiles

    paths = _input_paths(config.input_jsonl_fpath)
    indexes = [RolloutIndex(p, config.cache_dir) for p in paths]
    try:
        query = RolloutQuery(indexes)
    except TooManyFiles as exc:
        raise NeMoGymConfigError(str(exc)) from None
    try:
        _index_now(indexes, config.skip_bad_lines)
    except BaseException:
        query.close()
        for ix in indexes:
            ix.close()
        raise
    port = reserve_port(config.host, port=config.port) if config.port else reserve_port(config.host)
    sock = take_reserved_socket(config.host, port)
    watcher = Watcher(indexes, config.refresh_s).start()
    loopback_names = ("127.0.0.1", "localhost")
    app = create_app(
        query,
        watcher=watcher,
        pass_threshold=config.pass_threshold,
        allowed_hosts=loopback_names if config.host in loopback_names else ("*",),
    )
    shown_host = f"[{config.host}]" if ":" in config.host else config.host
    url = f"http://{shown_host}:{port}/"
    print(f"Viewing {', '.join(str(p) for p in paths)}")
    print(f"Viewer: {url}  (Ctrl-C stops it)", flush=True)
    if config.host not in _LOOPBACK:
        print(
            f"warning: serving on {config.host}: anyone who can reach this address can read these rollouts "
            "(the viewer has no login)",
            file=sys.stderr,
        )
    if config.browser:
        _open_browser(url)
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", access_log=False))
    try:
        server.run(sockets=[sock])
    finally:
        watcher.stop()
        query.close()
        for ix in indexes:
            ix.close()
    return 0


COMMAND = Command(
    name="view",
    verb="view",
    summary="Look at rollout files in the browser: table, conversations, repeats, summary plots, failures.",
    model=ViewConfig,
    run=run,
    reads_config_files=False,
    positionals=("input_jsonl_fpath",),
    examples=(
        "ng view results/rollouts.jsonl",
        "ng view results/model_a.jsonl results/model_b.jsonl --port 8080 --no-browser",
        "ng_view +input_jsonl_fpath=results/rollouts.jsonl",
    ),
)
