"""`ng_status`: ask the head server which servers run, then check each one's `/health`."""

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
    """Instances from the head server, each with `healthy` (bool) and `uptime` added.

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
            try:
                inst["healthy"] = client.get(f"{inst['url']}/health", timeout=2.0).status_code == 200
            except httpx.HTTPError:
                inst["healthy"] = False
            inst["uptime"] = format_uptime(now - float(inst.get("start_time") or now))
    return instances


def print_status(instances: list[dict[str, Any]], out: TextIO) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(show_edge=False)
    for col in ("", "server", "kind", "implementation", "URL", "PID", "uptime"):
        table.add_column(col)
    for inst in instances:
        mark = "[green]✓[/green]" if inst["healthy"] else "[red]✗[/red]"
        table.add_row(
            mark,
            str(inst.get("process_name")),
            str(inst.get("server_type")),
            str(inst.get("name")),
            str(inst.get("url")),
            str(inst.get("pid")),
            inst["uptime"],
        )
    console = Console(file=out, width=140)
    console.print(table)
    healthy = sum(1 for i in instances if i["healthy"])
    console.print(f"{healthy} / {len(instances)} servers healthy")
