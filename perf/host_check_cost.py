"""What the Host / Origin check (`nemo_gym/serving/host_check.py`) adds to a request on the direct path.

In one process, no sockets: a resources server's hot route (`/seed_session` of example_single_tool_call's server
class) answered by `HotRoutes.answer` with a stub responder, once with the check off (`hosts=None`) and once on
(the policy `serve` builds for a loopback stack), the two alternating in rounds so both see the same machine load;
and the check alone (`HostPolicy.refusal` over the headers our lean client sends). Prints the median CPU microseconds
per request of each (process time: steadier than wall time on a shared machine) and the difference.

    python perf/host_check_cost.py --requests 20000 --rounds 11
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from nemo_gym.http.client import ServerClient  # noqa: E402
from nemo_gym.serving.host_check import host_policy  # noqa: E402
from nemo_gym.serving.hot_routes import HotRoutes  # noqa: E402
from nemo_gym.serving.runner import serving_app  # noqa: E402

# What `LeanClient` sends to a peer (a session cookie included), as uvicorn hands it to the app.
HEADERS = [
    (b"host", b"127.0.0.1:23456"),
    (b"content-type", b"application/json"),
    (b"content-length", b"2"),
    (b"cookie", b"nemo_gym_session=" + b"x" * 150),
]
STACK = {
    "default_host": "127.0.0.1",
    "head_server": {"host": "127.0.0.1", "port": 11000},
    "policy_model": {"responses_api_models": {"openai_model": {"host": "127.0.0.1", "port": 1}}},
}


class _Responder:
    """What `_DirectCycle` offers `HotRoutes.answer`: the whole answer in one call."""

    __slots__ = ("status",)

    def __init__(self) -> None:
        self.status = 0

    def respond(self, status: int, headers: list, body: bytes) -> None:
        self.status = status

    async def receive(self) -> dict:
        return {"type": "http.request", "body": b"{}", "more_body": False}

    async def asgi(self, app) -> None:  # pragma: no cover - not reached for this route
        raise AssertionError("the request left the direct path")


def _server_app():
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "resources_servers" / "example_single_tool_call"))
    from app import ExampleSingleToolCallResourcesServer, ExampleSingleToolCallResourcesServerConfig

    config = ExampleSingleToolCallResourcesServerConfig(host="127.0.0.1", port=0, entrypoint="app.py", name="r", domain="agent")
    return ExampleSingleToolCallResourcesServer(
        config=config, server_client=ServerClient(head_server_config=None, global_config_dict={})
    ).build_app()


async def _answer_us(hot: HotRoutes, count: int) -> float:
    route = hot.route_for(b"/seed_session")
    responder = _Responder()
    start = time.process_time()
    for _ in range(count):
        scope = {"type": "http", "method": "POST", "path": "/seed_session", "raw_path": b"/seed_session",
                 "query_string": b"", "headers": list(HEADERS), "http_version": "1.1", "scheme": "http",
                 "client": ("127.0.0.1", 5555), "server": ("127.0.0.1", 23456), "root_path": ""}
        responder.status = 0
        await hot.answer(route, scope, b"{}", responder)
        assert responder.status == 200, responder.status
    return (time.process_time() - start) / count * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=20000)
    parser.add_argument("--rounds", type=int, default=11)
    args = parser.parse_args()

    policy = host_policy(STACK, "127.0.0.1")
    off = serving_app(_server_app(), hosts=None)
    on = serving_app(_server_app(), hosts=policy)
    assert isinstance(off, HotRoutes) and isinstance(on, HotRoutes) and on.route_for(b"/seed_session") is not None

    async def run() -> tuple[list[float], list[float]]:
        await _answer_us(off, 500)
        await _answer_us(on, 500)  # warm: the Host value is judged once, then remembered
        times_off, times_on = [], []
        for _ in range(args.rounds):
            times_off.append(await _answer_us(off, args.requests))
            times_on.append(await _answer_us(on, args.requests))
        return times_off, times_on

    times_off, times_on = asyncio.run(run())
    alone = []
    for _ in range(args.rounds):
        start = time.process_time()
        for _ in range(args.requests):
            policy.refusal(HEADERS)
        alone.append((time.process_time() - start) / args.requests * 1e6)
    med_off, med_on = statistics.median(times_off), statistics.median(times_on)
    print(f"direct path, check off: {med_off:7.2f} us/request (runs {min(times_off):.2f}-{max(times_off):.2f})")
    print(f"direct path, check on:  {med_on:7.2f} us/request (runs {min(times_on):.2f}-{max(times_on):.2f})")
    print(f"difference:             {med_on - med_off:+7.2f} us/request ({(med_on - med_off) / med_off:+.1%})")
    print(f"the check alone:        {statistics.median(alone):7.3f} us/request (4 headers, Host remembered)")


if __name__ == "__main__":
    main()
