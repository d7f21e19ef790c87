"""`ng_status`: ask the head server which servers run, then check each one's `/health`.

Besides health it shows what `ng_run`'s supervision did: the server's state (ready, restarting, failed), how often
it was restarted, the exit code of its last process, and the uptime of its current process."""

from __future__ import annotations

import time
from typing import Any, TextIO

import httpx


def format_uptime(seconds: float) -> str:
    seconds = max(0.0, seconds)
    days, rem = divmod(seconds, 86400)
    hours, rem = divmod(rem, 3600)
    minutes, secs = divmod(rem, 60)
    return f"{int(days)}d {int(hours)}h {int(minutes)}m {secs:.1f}s"


def fetch_status(head_host: str, head_port: int) -> list[dict[str, Any]]:
    """Instances from the head server, each with `healthy` (bool) and `uptime` added (`-` for a failed server).

    Raises ConnectionError with a hint when the head server does not answer."""
    head = f"http://{head_host}:{head_port}"
    with httpx.Client(timeout=httpx.Timeout(5.0, connect=2.0), trust_env=False) as client:
        try:
            instances = client.get(f"{head}/server_instances").raise_for_status().json()
        except httpx.HTTPError as exc:
            raise ConnectionError(
                f"No head server answered at {head} ({type(exc).__name__}). Start the stack with ng_run, "
                f"or point at it with +head_server.host=... +head_server.port=..."
            ) from None
        now = time.time()
        for inst in instances:
            failed = inst.get("state") == "failed"
            try:
                inst["healthy"] = not failed and client.get(f"{inst['url']}/health", timeout=2.0).status_code == 200
            except httpx.HTTPError:
                inst["healthy"] = False
            inst["uptime"] = "-" if failed else format_uptime(now - float(inst.get("start_time") or now))
    return instances


def print_status(instances: list[dict[str, Any]], out: TextIO) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(show_edge=False)
    for col in ("", "server", "kind", "implementation", "URL", "PID", "state", "restarts", "last exit", "uptime"):
        table.add_column(col)
    for inst in instances:
        mark = "[green]✓[/green]" if inst["healthy"] else "[red]✗[/red]"
        last_exit = inst.get("last_exit_code")
        table.add_row(
            mark,
            str(inst.get("process_name")),
            str(inst.get("server_type")),
            str(inst.get("name")),
            str(inst.get("url")),
            str(inst.get("pid")),
            str(inst.get("state", "-")),
            str(inst.get("restarts", 0)),
            "-" if last_exit is None else str(last_exit),
            inst["uptime"],
        )
    console = Console(file=out, width=200)  # wide enough that no server name or URL is cut
    console.print(table)
    healthy = sum(1 for i in instances if i["healthy"])
    console.print(f"{healthy} / {len(instances)} servers healthy")
    failed = [str(i.get("process_name")) for i in instances if i.get("state") == "failed"]
    if failed:
        console.print(f"failed (restart budget spent, stays down until ng_run is restarted): {', '.join(failed)}")
