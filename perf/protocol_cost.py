"""What our protocol (`nemo_gym/serving/private_api.py`) costs per small request, this tree against a git revision.

In one process, no sockets: a keep-alive connection of `NeMoGymHttpProtocol` over a stub transport, fed one small
`POST` to a hot route (a pydantic body, a dict answer: the shape of `/seed_session` or a tool call) at a time and
run until it is answered. Both protocol classes (this tree's module and the one at `--base`, loaded from git under
another name) are driven in alternating rounds so both see the same machine load; printed: the median process CPU
microseconds per request of each, and the difference. Also the bare cost of what a request does differently now
(`loop.time()` per read instead of a counter; the size checks; letting go of the answered request).

    python perf/protocol_cost.py --requests 20000 --rounds 9 --base HEAD
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

import uvicorn  # noqa: E402
from fastapi import FastAPI  # noqa: E402
from pydantic import BaseModel  # noqa: E402
from uvicorn.server import ServerState  # noqa: E402

from nemo_gym.serving import private_api  # noqa: E402
from nemo_gym.serving.runner import serving_app  # noqa: E402

REQUEST = (b"POST /tool HTTP/1.1\r\nHost: 127.0.0.1:23456\r\nContent-Type: application/json\r\n"
           b"Content-Length: 15\r\n\r\n{\"city\":\"Oslo\"}")


class Stub:
    """The socket transport: counts answers."""

    def __init__(self) -> None:
        self.answers = 0
        self.closing = False

    def write(self, data: bytes) -> None:
        self.answers += 1

    def is_closing(self) -> bool:
        return self.closing

    def get_write_buffer_size(self) -> int:
        return 0

    def close(self) -> None:
        self.closing = True

    def get_extra_info(self, name: str, default=None):
        return ("127.0.0.1", 1) if name in ("peername", "sockname") else default

    def pause_reading(self) -> None: ...

    def resume_reading(self) -> None: ...


class City(BaseModel):
    city: str


def build_app() -> FastAPI:
    app = FastAPI()

    @app.post("/tool")
    async def tool(body: City) -> dict:
        return {"city": body.city, "weather": "cold"}

    return app


def module_at(revision: str):
    """`nemo_gym/serving/private_api.py` as it is at `revision`, imported under another name."""
    source = subprocess.run(["git", "show", f"{revision}:nemo_gym/serving/private_api.py"], cwd=REPO,
                            capture_output=True, text=True, check=True).stdout
    path = Path(tempfile.mkdtemp()) / "private_api_base.py"
    path.write_text(source)
    spec = importlib.util.spec_from_file_location("private_api_base", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules["private_api_base"] = module  # (its dataclasses look themselves up there)
    spec.loader.exec_module(module)  # type: ignore[union-attr]
    return module


async def run(protocol_class, app, requests: int) -> float:
    """Process CPU seconds per request for `requests` requests on one keep-alive connection."""
    loop = asyncio.get_running_loop()
    config = uvicorn.Config(app, log_level="warning", access_log=False, timeout_keep_alive=30)
    config.load()
    protocol = protocol_class(config=config, server_state=ServerState(), app_state={}, _loop=loop)
    transport = Stub()
    protocol.connection_made(transport)
    started = time.process_time()
    for _ in range(requests):
        protocol.data_received(REQUEST)
        while protocol.tasks:
            await asyncio.sleep(0)
        await asyncio.sleep(0)  # the coalesced write
    took = time.process_time() - started
    assert transport.answers >= requests, transport.answers
    protocol.connection_lost(None)
    return took / requests


def bare_costs(n: int = 1_000_000) -> dict:
    """Nanoseconds of the single operations a request now does differently (a uvloop loop)."""
    import uvloop

    loop = uvloop.new_event_loop()

    class P:
        reads = 0
        read_at = 0.0

    p = P()
    out = {}
    started = time.perf_counter()
    for _ in range(n):
        p.reads += 1
    out["reads += 1"] = (time.perf_counter() - started) / n * 1e9
    started = time.perf_counter()
    for _ in range(n):
        p.read_at = loop.time()
    out["read_at = loop.time()"] = (time.perf_counter() - started) / n * 1e9
    loop.close()
    return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--requests", type=int, default=20000)
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--base", default="HEAD")
    args = parser.parse_args()
    import uvloop

    base = module_at(args.base)
    app = serving_app(build_app())
    classes = {"base": base.NeMoGymHttpProtocol, "this tree": private_api.NeMoGymHttpProtocol}
    results: dict[str, list[float]] = {name: [] for name in classes}

    async def rounds() -> None:
        for name, cls in classes.items():  # warm-up
            await run(cls, app, 2000)
        for _ in range(args.rounds):
            for name, cls in classes.items():
                results[name].append(await run(cls, app, args.requests))

    uvloop.run(rounds())
    medians = {name: statistics.median(values) * 1e6 for name, values in results.items()}
    for name, value in medians.items():
        spread = [round(v * 1e6, 2) for v in sorted(results[name])]
        print(f"{name:10s} {value:7.2f} us CPU per request (rounds: {spread})")
    print(f"difference {medians['this tree'] - medians['base']:+.2f} us per request")
    for what, ns in bare_costs().items():
        print(f"{what:24s} {ns:6.1f} ns")


if __name__ == "__main__":
    main()
