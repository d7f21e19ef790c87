"""What one small exchange costs on each side, ours against the floor's: the server's CPU per request and the client's.

`floor_vs_stack.py` compares whole rollouts (8 exchanges, three processes); this isolates one exchange so the two
halves of the gap can be told apart:

- server side: the same load generator (the floor's keep-alive client) posts `/get_weather` and `/seed_session` to
  the floor's resources server (`perf/floor_stack.py`) and to the stack's (example_single_tool_call under `ng_run`),
  1 and 16 in flight; printed: the server process's CPU per request;
- client side: this process posts `/get_weather` to the floor's resources server, one at a time, with the floor's
  client (`floor_stack.Pool`), our `LeanClient` alone, and `ServerClient.post` (name lookup, retries, cookies, the
  `ServerResponse`), with and without a session cookie; printed: this process's CPU per call.

CPU times come from the kernel's 10 ms ticks: use enough `--requests` (4,000 gives 2.5 us resolution).

    python perf/per_exchange.py --requests 4000
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from pathlib import Path

import orjson
import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent))
from floor_stack import Pool
from floor_vs_stack import running_stack

from nemo_gym.http.client import ServerClient
from nemo_gym.http.lean_client import LeanClient
from nemo_gym.testing.stack import ChildProcess, FakeLLMBackend, cpu_seconds, free_port

WEATHER = orjson.dumps({"city": "Oslo"})
COOKIE = {"ExampleServer___res": "eyJzZXNzaW9uX2lkIjoiMTIzNDU2Nzg5MGFiY2RlZjEyMzQ1Njc4OTBhYmNkZWYifQ."
          "abcdefghijklmnopqrstuvwxyz0123456789ABCDEFG"}


async def server_side(targets: dict[str, tuple[str, psutil.Process]], requests: int) -> list[str]:
    lines = []
    for path, body in ((b"/get_weather", WEATHER), (b"/seed_session", b"{}")):
        for level in (1, 16):
            cells = []
            for url, proc in targets.values():
                pool = Pool(url, 16)
                for _ in range(300):  # warm-up
                    await pool.post(path, body)

                async def worker(n: int) -> None:
                    for _ in range(n):
                        await pool.post(path, body)

                before = cpu_seconds(proc)
                await asyncio.gather(*(worker(requests // level) for _ in range(level)))
                cells.append((cpu_seconds(proc) - before) / requests * 1e6)
            floor, ours = cells
            ratio = f"  ({ours / floor:.1f}x)" if floor else ""  # a short run can read 0 CPU ticks
            lines.append(f"server  {path.decode():<14} {level:>3} in flight | floor {floor:6.1f}  ours {ours:6.1f} us{ratio}")
    return lines


async def client_side(port: int, requests: int) -> list[str]:
    pool = Pool(f"http://127.0.0.1:{port}", 4)
    lean = LeanClient()
    client = ServerClient(
        head_server_config=None,
        global_config_dict={"res": {"resources_servers": {"x": {"host": "127.0.0.1", "port": port}}}},
    )
    calls = {
        "floor client (floor_stack.Pool)": lambda: pool.post(b"/get_weather", WEATHER),
        "LeanClient.request": lambda: lean.request("POST", "127.0.0.1", port, "/get_weather",
                                                   {"Content-Type": "application/json"}, WEATHER, {}),
        "ServerClient.post": lambda: client.post("res", "/get_weather", json={"city": "Oslo"}),
        "ServerClient.post, a cookie": lambda: client.post("res", "/get_weather", json={"city": "Oslo"}, cookies=COOKIE),
    }
    lines = []
    for name, call in calls.items():
        for _ in range(300):
            await call()
        before = time.process_time()
        for _ in range(requests):
            await call()
        lines.append(f"client  {name:<32} | {(time.process_time() - before) / requests * 1e6:6.1f} us per call")
    await lean.aclose()
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=4000)
    args = parser.parse_args()
    try:
        import uvloop

        uvloop.install()  # as our servers and the floor's run
    except ImportError:
        pass
    port = free_port()
    floor = ChildProcess([sys.executable, str(Path(__file__).parent / "floor_stack.py"), "resources", "--port", str(port)],
                         name="floor resources")
    try:
        floor.wait_for("floor server ready", timeout=30)
        with FakeLLMBackend() as backend, running_stack(backend) as servers:
            resources = servers["resources"]
            targets = {"floor": (f"http://127.0.0.1:{port}", psutil.Process(floor.proc.pid)),
                       "ours": (resources["url"], psutil.Process(resources["pid"]))}
            lines = asyncio.run(server_side(targets, args.requests))
        lines += asyncio.run(client_side(port, args.requests))
    finally:
        floor.stop()
    print(f"{args.requests} requests each; CPU per request of the server process (server lines) or of this process "
          "(client lines, one in flight, against the floor's resources server)")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
