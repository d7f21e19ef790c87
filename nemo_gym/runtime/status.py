"""`ng_status`: ask the head server which servers run, then check each one's `/health`.

Besides health it shows what `ng_run`'s supervision did: the server's state (ready, restarting, failed), how often
it was restarted, the exit code of its last process, and the uptime of its current process. A block started with
`num_replicas` > 1 has one row per replica, named `<server id>[<replica>]`, each with its own address and pid.
Two columns show each server's concurrency: the requests in flight it reports in its `/health` answer (`in_flight`;
`-` when it does not report one), and its in-flight limit toward any one other server: the connection limit per
peer of its HTTP client (`client_limit_per_host` when its `/health` reports one, else the stack's
`global_aiohttp_connector_limit_per_host` from the config the head server serves, default 1024; `none` for 0, no
limit). An agent with N rollouts in flight sends at most that many requests at once to its model server. When some
servers run as Ray actors (docs/design.md, decision 24), a column shows the Ray node id of each actor replica."""

from __future__ import annotations

import http.cookiejar
import time
from typing import Any, Optional, TextIO

import httpx


class NoCookies(http.cookiejar.CookieJar):
    """A cookie jar that keeps nothing. Health checks go to several servers on one host, and cookies are not
    kept apart by port: a session cookie set by one replica of a resources server and sent to another would be
    refused there with 409 (docs/design.md, decisions 6 and 22)."""

    def set_cookie(self, cookie: Any) -> None:
        return None

    def extract_cookies(self, response: Any, request: Any) -> None:
        return None


def health_client(**kwargs: Any) -> httpx.Client:
    """An `httpx.Client` for health checks: no proxies from the environment, no cookies kept."""
    return httpx.Client(trust_env=False, cookies=NoCookies(), **kwargs)


# The shared client's default (`DEFAULT_CONNECTOR_LIMIT_PER_HOST` in nemo_gym/http/client.py; not imported: it
# loads aiohttp, and ng_status stays light).
LIMIT_PER_HOST_KEY = "global_aiohttp_connector_limit_per_host"
DEFAULT_LIMIT_PER_HOST = 1024


def stack_limit_per_host(client: httpx.Client, head: str) -> Optional[int]:
    """The stack's `global_aiohttp_connector_limit_per_host` (the default when unset), or None when the head server
    does not serve its config."""
    try:
        answer = client.get(f"{head}/global_config_dict_yaml", params={"raw": "true"})
        if answer.status_code != 200:
            return None
        import yaml

        config = yaml.safe_load(answer.text)
        value = config.get(LIMIT_PER_HOST_KEY) if isinstance(config, dict) else None
        return DEFAULT_LIMIT_PER_HOST if value is None else int(value)
    except Exception:  # no config, not YAML, a value that is not a number: unknown
        return None


def format_limit(limit: Any) -> str:
    if limit is None:
        return "-"
    return "none" if int(limit) <= 0 else str(int(limit))


def format_uptime(seconds: float) -> str:
    seconds = max(0.0, seconds)
    days, rem = divmod(seconds, 86400)
    hours, rem = divmod(rem, 3600)
    minutes, secs = divmod(rem, 60)
    return f"{int(days)}d {int(hours)}h {int(minutes)}m {secs:.1f}s"


def fetch_status(head_host: str, head_port: int) -> list[dict[str, Any]]:
    """Instances from the head server, each with `healthy` (bool), `uptime` (`-` for a failed server), `in_flight`
    and `limit_per_host` (see the module docstring; None when unknown) added.

    Raises ConnectionError with a hint when the head server does not answer."""
    head = f"http://{head_host}:{head_port}"
    with health_client(timeout=httpx.Timeout(5.0, connect=2.0)) as client:
        try:
            instances = client.get(f"{head}/server_instances").raise_for_status().json()
        except httpx.HTTPError as exc:
            raise ConnectionError(
                f"No head server answered at {head} ({type(exc).__name__}). Start the stack with ng_run, "
                f"or point at it with +head_server.host=... +head_server.port=..."
            ) from None
        stack_limit = stack_limit_per_host(client, head)
        now = time.time()
        for inst in instances:
            failed = inst.get("state") == "failed" or not inst.get("url")
            inst["in_flight"] = None
            inst["limit_per_host"] = None if failed else stack_limit
            try:
                answer = None if failed else client.get(f"{inst['url']}/health", timeout=2.0)
                inst["healthy"] = answer is not None and answer.status_code == 200
                if inst["healthy"]:
                    body = answer.json()
                    if isinstance(body, dict):
                        inst["in_flight"] = body.get("in_flight")
                        if isinstance(body.get("client_limit_per_host"), int):  # the server's own word wins
                            inst["limit_per_host"] = body["client_limit_per_host"]
            except (httpx.HTTPError, ValueError):
                inst["healthy"] = False
            inst["uptime"] = "-" if failed else format_uptime(now - float(inst.get("start_time") or now))
    return instances


def instance_label(inst: dict[str, Any]) -> str:
    """The server id, with `[i]` for a replica of a block with several (head servers before replicas existed
    send no `num_replicas`)."""
    name = str(inst.get("process_name"))
    if int(inst.get("num_replicas") or 1) > 1:
        return f"{name}[{inst.get('replica', 0)}]"
    return name


# What ng_status prints when no head server answers, and the count line below its table: NeMo Gym v0.2/v0.5's
# wording, which job scripts grep for (they start the next step once the count line says `0 unhealthy`).
NO_SERVERS_LINE = "No NeMo Gym servers found running."


def summary_line(instances: list[dict[str, Any]]) -> str:
    """`N servers found (H healthy, U unhealthy)`, one server per replica."""
    healthy = sum(1 for i in instances if i["healthy"])
    return f"{len(instances)} servers found ({healthy} healthy, {len(instances) - healthy} unhealthy)"


def print_status(instances: list[dict[str, Any]], out: TextIO) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(show_edge=False)
    ray = any(inst.get("node_id") or inst.get("ray_actor") for inst in instances)
    columns = ["", "server", "kind", "implementation", "URL", "PID", "state", "restarts", "last exit", "uptime"]
    for col in columns + ["in flight", "limit/peer"] + (["Ray node"] if ray else []):
        table.add_column(col)
    for inst in instances:
        mark = "[green]✓[/green]" if inst["healthy"] else "[red]✗[/red]"
        last_exit = inst.get("last_exit_code")
        in_flight = inst.get("in_flight")
        extra = ["-" if in_flight is None else str(in_flight), format_limit(inst.get("limit_per_host"))]
        extra += [str(inst.get("node_id") or "-")] if ray else []
        table.add_row(
            mark,
            instance_label(inst),
            str(inst.get("server_type")),
            str(inst.get("name")),
            str(inst.get("url")),
            str(inst.get("pid")),
            str(inst.get("state", "-")),
            str(inst.get("restarts", 0)),
            "-" if last_exit is None else str(last_exit),
            inst["uptime"],
            *extra,
        )
    console = Console(file=out, width=340 if ray else 240)  # wide enough that no server name or URL is cut
    console.print(table)
    failed = [instance_label(i) for i in instances if i.get("state") == "failed"]
    if failed:
        console.print(f"failed (restart budget spent, stays down until ng_run is restarted): {', '.join(failed)}")
    limits = {inst.get("limit_per_host") for inst in instances if inst.get("limit_per_host") is not None}
    if limits:
        shown = ", ".join(format_limit(limit) for limit in sorted(limits))
        console.print(
            f"limit/peer: requests a server sends at once to any one other server ({shown}; "
            f"{LIMIT_PER_HOST_KEY}, set when starting ng_run); ng_collect_rollouts raises its own to "
            f"+num_samples_in_parallel"
        )
    console.print(summary_line(instances), highlight=False)  # last, as in NeMo Gym
