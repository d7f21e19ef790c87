"""Issue 24, item 1: our uvicorn adapter against granian, on one real server app, side by side.

The app is the quickstart's resources server (resources_servers/example_single_tool_call), built as
`run_webserver` builds it (`build_app()`), each engine serving it in its own process on 127.0.0.1:

- `ours`: `nemo_gym.serving.runner.serve` as every server runs: uvicorn + uvloop + our `NeMoGymHttpProtocol`
  (`serving/private_api.py`) with the direct path for hot routes, app = `serving_app(app)` (HotRoutes).
- `plain`: the same `serve` with `NEMO_GYM_HOT_ROUTES=0`: uvicorn's own "httptools" protocol, plain FastAPI
  (behind `BodyLimit`).
- `granian-<st|mt>-<h1|auto>`: granian 2.x, 1 worker, `interface=asgi`, `loop=uvloop`, runtime mode `st`/`mt`,
  `http=1`/`auto`, serving `serving_app(app)` (the HotRoutes ASGI app), gc tuned as `serve` tunes it.
- `granian-fastapi`: granian (st, http 1) serving plain FastAPI (`NEMO_GYM_HOT_ROUTES=0`, as `plain`).
- on request only (`--engines`): `granian-<st|mt>-h1-rust`, granian's Rust task implementation (`task_impl=rust`).

Load: the exchanges a rollout makes against a resources server: `POST /seed_session`, `POST /get_weather`, `POST
/verify` (the first row of the server's data/example.jsonl plus a response made as its tests make one: the
`get_weather` call, its output, the final message), the session cookie of the first answer carried to the other
two, over keep-alive connections of our `LeanClient`, from this process (the load generator), with `--in-flight`
rollouts at once. Before each measured run `--warmup` rollouts open the connections. For each engine the table
shows the SERVER's CPU milliseconds per rollout (user + system of the server process and its children, e.g.
granian's worker; `psutil`) and rollouts per second (wall), the median of `--repeats` runs (min-max below); the
engines alternate within each repeat, in a rotated order, so the shared machine's noise hits all of them alike.
The load generator's own CPU per rollout is shown too (it shares the 2 cores, so it bounds rollouts/s).

Answers are checked: every engine's first rollout must give the same status, content type and body for all three
calls (the session id inside the cookie is random, so cookies are not compared), and every measured rollout must
answer 200 three times and the same `/verify` body byte for byte; the script exits 1 otherwise.

    python perf/server_engines.py --in-flight 1,16,256 --rollouts 2000 --repeats 3
    python perf/server_engines.py --engines ours,granian-st-h1 --in-flight 16 --rollouts 500 --repeats 1
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

PERF = Path(__file__).resolve().parent
ROOT = PERF.parent
for _path in (str(ROOT), str(PERF)):
    if _path not in sys.path:
        sys.path.insert(0, _path)

ENGINES = ["ours", "plain", "granian-st-h1", "granian-st-auto", "granian-mt-h1", "granian-mt-auto", "granian-fastapi"]
EXTRA_ENGINES = ["granian-st-h1-rust", "granian-mt-h1-rust"]  # granian's Rust task implementation (Python < 3.12)
# A fixed signing secret for every engine, so their cookies are minted alike (the session id stays random).
SESSION_SECRET_HEX = "ab" * 32


# ------------------------------------------------------------------------------------------------ server side


def build_resources_app() -> Any:
    """The quickstart's resources server app, as `run_webserver` builds it (`build_app()`)."""
    from nemo_gym.testing.servers import make_server
    from resources_servers.example_single_tool_call.app import ExampleSingleToolCallResourcesServer

    server = make_server(ExampleSingleToolCallResourcesServer, name="example_single_tool_call", domain="agent")
    return server.build_app()


def granian_app() -> Any:
    """granian's factory (runs in its worker): the app wrapped as `serve` wraps it (HotRoutes, or plain FastAPI
    behind `BodyLimit` with `NEMO_GYM_HOT_ROUTES=0`), gc tuned as `serve` tunes it."""
    from nemo_gym.serving.runner import DEFAULT_MAX_REQUEST_BODY_BYTES, serving_app, tune_gc_for_serving

    app = serving_app(build_resources_app(), DEFAULT_MAX_REQUEST_BODY_BYTES)
    tune_gc_for_serving()
    return app


def run_server(engine: str, port: int) -> None:
    """The child process: serve the app under `engine` until SIGTERM."""
    if engine in ("ours", "plain"):
        from nemo_gym.serving.runner import serve

        serve(build_resources_app(), host="127.0.0.1", port=port)
        return
    from granian import Granian

    if engine == "granian-fastapi":
        mode, http, task = "st", "1", "asyncio"
    else:
        _, mode, http, *rest = engine.split("-")
        http = "1" if http == "h1" else "auto"
        task = rest[0] if rest else "asyncio"
    Granian(
        target="server_engines:granian_app",
        factory=True,
        address="127.0.0.1",
        port=port,
        interface="asgi",
        workers=1,
        loop="uvloop",
        runtime_mode=mode,
        http=http,
        task_impl=task,
        log_level="warning",
        log_access=False,
        working_dir=PERF,
    ).serve()


def start_server(engine: str) -> tuple[subprocess.Popen, int]:
    from nemo_gym.testing.stack import free_port

    port = free_port()
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), str(PERF), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    env["NEMO_GYM_SESSION_SECRET"] = SESSION_SECRET_HEX
    env["NEMO_GYM_HOT_ROUTES"] = "0" if engine in ("plain", "granian-fastapi") else "1"
    env["PYTHONUNBUFFERED"] = "1"
    log = open(Path(tempfile.gettempdir()) / f"server_engines_{engine}_{port}.log", "w")
    proc = subprocess.Popen([sys.executable, __file__, "--serve", engine, "--port", str(port)], env=env,
                            stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    deadline = time.monotonic() + 90
    while True:
        if proc.poll() is not None:
            raise SystemExit(f"{engine} server exited with {proc.returncode} before answering; see {log.name}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as answer:
                if answer.status == 200:
                    return proc, port
        except OSError:
            pass
        if time.monotonic() > deadline:
            proc.terminate()
            raise SystemExit(f"{engine} server did not answer GET /health within 90 s; see {log.name}")
        time.sleep(0.2)


def server_cpu(proc: subprocess.Popen) -> float:
    """User + system CPU seconds of the server process and its live children (granian's worker)."""
    import psutil

    root = psutil.Process(proc.pid)
    total = 0.0
    for p in [root, *root.children(recursive=True)]:
        try:
            t = p.cpu_times()
            total += t.user + t.system
        except psutil.NoSuchProcess:
            pass
    return total


# ------------------------------------------------------------------------------------------------ load side


def verify_body() -> bytes:
    """The first example row plus a finished response, as the server's tests build one."""
    from nemo_gym.testing.responses import function_call, function_call_output, make_response, message

    row = json.loads((ROOT / "resources_servers/example_single_tool_call/data/example.jsonl").read_text().splitlines()[0])
    response = make_response(
        function_call("get_weather", '{"city": "Oslo"}'),
        function_call_output({"city": "Oslo", "weather_description": "The weather in Oslo is cold."}),
        message("It is cold in Oslo: bring a coat."),
    )
    return json.dumps({**row, "response": response.model_dump(mode="json")}).encode()


JSON = {"Content-Type": "application/json"}
TIMEOUT = {"connect": 60.0, "read": 120.0, "pool": None}
SEED, WEATHER = b"{}", b'{"city": "Oslo"}'


async def rollout(client: Any, port: int, verify: bytes) -> list[Any]:
    """seed_session, get_weather, verify; the cookie of the first answer carried to the others."""
    first = await client.request("POST", "127.0.0.1", port, "/seed_session", JSON, SEED, TIMEOUT)
    cookie = first.headers.get("set-cookie", "").split(";", 1)[0]
    headers = {**JSON, "Cookie": cookie} if cookie else JSON
    second = await client.request("POST", "127.0.0.1", port, "/get_weather", headers, WEATHER, TIMEOUT)
    third = await client.request("POST", "127.0.0.1", port, "/verify", headers, verify, TIMEOUT)
    return [first, second, third]


async def first_answers(port: int, verify: bytes) -> list[tuple]:
    from nemo_gym.http.lean_client import LeanClient

    client = LeanClient()
    try:
        answers = await rollout(client, port, verify)
    finally:
        await client.aclose()
    return [(r.status, r.headers.get("content-type"), r.body, "set-cookie" in r.headers) for r in answers]


async def drive(port: int, verify: bytes, expected: bytes, warmup: int, total: int, level: int,
                proc: subprocess.Popen) -> dict:
    """`warmup` rollouts (not measured) then `total`, `level` at once, on one LeanClient."""
    import psutil

    from nemo_gym.http.lean_client import LeanClient

    client = LeanClient()
    me = psutil.Process()
    failures = 0

    async def batch(count: int) -> None:
        remaining = count

        async def worker() -> None:
            nonlocal remaining, failures
            while remaining > 0:
                remaining -= 1
                try:
                    answers = await rollout(client, port, verify)
                except Exception:  # noqa: BLE001 - counted, the run is then reported as failed
                    failures += 1
                    continue
                if any(r.status != 200 for r in answers) or answers[2].body != expected:
                    failures += 1

        await asyncio.gather(*(worker() for _ in range(min(level, count))))

    try:
        await batch(warmup)
        failures = 0
        cpu0, mine0, t0 = server_cpu(proc), sum(me.cpu_times()[:2]), time.perf_counter()
        await batch(total)
        wall = time.perf_counter() - t0
        cpu, mine = server_cpu(proc) - cpu0, sum(me.cpu_times()[:2]) - mine0
    finally:
        await client.aclose()
    return {"cpu_ms": cpu * 1000 / total, "rps": total / wall, "client_ms": mine * 1000 / total, "failures": failures}


def run_async(coro: Any) -> Any:
    try:
        import uvloop

        return uvloop.run(coro)
    except ImportError:  # pragma: no cover
        return asyncio.run(coro)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--serve", help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--engines", default=",".join(ENGINES), help=f"from {','.join(ENGINES + EXTRA_ENGINES)}")
    parser.add_argument("--in-flight", default="1,16,256")
    parser.add_argument("--rollouts", type=int, default=2000, help="measured rollouts per run (a third at 1 in flight)")
    parser.add_argument("--warmup", type=int, default=300, help="unmeasured rollouts before each run")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    if args.serve:
        run_server(args.serve, args.port)
        return

    engines = [e.strip() for e in args.engines.split(",") if e.strip()]
    unknown = [e for e in engines if e not in ENGINES + EXTRA_ENGINES]
    if unknown:
        raise SystemExit(f"--engines: unknown {unknown}; choose from {ENGINES + EXTRA_ENGINES}")
    levels = [int(x) for x in args.in_flight.split(",")]
    verify = verify_body()

    servers: dict[str, tuple[subprocess.Popen, int]] = {}
    results: dict[tuple[int, str], list[dict]] = {}

    def results_of(engine: str) -> list[dict]:
        return [r for (_, e), runs in results.items() if e == engine for r in runs]

    try:
        for engine in engines:
            servers[engine] = start_server(engine)
            print(f"# {engine}: pid {servers[engine][0].pid}, port {servers[engine][1]}", flush=True)

        # Same answers everywhere.
        answers = {e: run_async(first_answers(port, verify)) for e, (_, port) in servers.items()}
        reference = answers[engines[0]]
        mismatched = False
        for engine, got in answers.items():
            for path, ref, mine in zip(("/seed_session", "/get_weather", "/verify"), reference, got):
                if ref != mine:
                    mismatched = True
                    print(f"ANSWER MISMATCH {engine} {path}: {mine[:2]} {mine[2][:200]!r} vs {engines[0]}: "
                          f"{ref[:2]} {ref[2][:200]!r}", flush=True)
        print(f"# answers identical across engines: {not mismatched} (/verify: status {reference[2][0]}, "
              f"{len(reference[2][2])} bytes, cookie set on every answer: {all(a[3] for a in reference)})", flush=True)
        expected = reference[2][2]

        for level in levels:
            total = max(200, args.rollouts // 3) if level == 1 else args.rollouts
            warmup = min(args.warmup, total)
            for repeat in range(args.repeats):
                order = engines[repeat % len(engines):] + engines[:repeat % len(engines)]
                for engine in order:
                    proc, port = servers[engine]
                    r = run_async(drive(port, verify, expected, warmup, total, level, proc))
                    results.setdefault((level, engine), []).append(r)
                    print(f"  level {level:>4} repeat {repeat} {engine:<16} cpu {r['cpu_ms']:.3f} ms/rollout  "
                          f"{r['rps']:7.0f} rollouts/s  client {r['client_ms']:.3f} ms  failures {r['failures']}",
                          flush=True)
    finally:
        for proc, _ in servers.values():
            proc.terminate()
        for proc, _ in servers.values():
            try:
                proc.wait(15)
            except subprocess.TimeoutExpired:
                proc.kill()
        for engine, (proc, port) in servers.items():  # keep a server's log only when its runs failed
            if not any(r["failures"] for r in results_of(engine)):
                Path(tempfile.gettempdir(), f"server_engines_{engine}_{port}.log").unlink(missing_ok=True)

    failed = sum(r["failures"] for runs in results.values() for r in runs)
    print()
    print(f"{'in flight':>9} | {'engine':<16} | {'server CPU ms/rollout':>21} | {'(min-max)':>13} | "
          f"{'rollouts/s':>10} | {'(min-max)':>11} | {'client ms':>9} | vs ours CPU")
    for level in levels:
        base = statistics.median(r["cpu_ms"] for r in results[(level, engines[0])])
        for engine in engines:
            runs = results[(level, engine)]
            cpu = [r["cpu_ms"] for r in runs]
            rps = [r["rps"] for r in runs]
            med = statistics.median(cpu)
            print(f"{level:>9} | {engine:<16} | {med:>21.3f} | {min(cpu):>6.3f}-{max(cpu):<6.3f} | "
                  f"{statistics.median(rps):>10.0f} | {min(rps):>5.0f}-{max(rps):<5.0f} | "
                  f"{statistics.median(r['client_ms'] for r in runs):>9.3f} | {med / base:.2f}x")
    print(f"\nfailed rollouts: {failed}; answers identical: {not mismatched}")
    if failed or mismatched:
        raise SystemExit(1)


if __name__ == "__main__":
    main()
