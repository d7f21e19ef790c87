"""How the server-to-server HTTP client copes with many requests in flight at once.

Starts a local uvicorn server (subprocess, uvloop + httptools) on 127.0.0.1 whose POST endpoint sleeps
`--latency-ms` and returns a small JSON, then, for each transport, fires `--requests` requests through
`nemo_gym.http.client.ServerClient` with `--concurrency` of them in flight at once (all at once via
`asyncio.gather` when concurrency >= requests) and prints one table row per transport.

Transports:
  default      httpx.AsyncHTTPTransport() - httpcore pool, 100 connections, waiting queue rescanned per request
  sized        httpx.AsyncHTTPTransport(limits=Limits(max_connections=LIMIT, max_keepalive=LIMIT_PER_HOST))
  aiohttp      ServerClient's default: aiohttp's ClientSession directly, over
               aiohttp.TCPConnector(limit=LIMIT, limit_per_host=LIMIT_PER_HOST) (the nemo_gym default)
  aiohttp_raw  plain aiohttp.ClientSession, no httpx (a floor for the client's own overhead; optional)

Each transport runs in its own client process (and against a fresh server), so a stalled run can be aborted
cleanly: after `--timeout-s` the run is cancelled and reported as "stalled" (with how many completed); if
cancelling hangs, the process is killed.

Example:
    python perf/client_concurrency.py --requests 16000 --concurrency 16000 --latency-ms 50
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import resource
import socket
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

TRANSPORTS = ("default", "sized", "aiohttp", "aiohttp_raw")


def raise_nofile_limit() -> int:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and soft < hard:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
            soft = hard
        except (ValueError, OSError):
            pass
    return soft


# ----------------------------------------------------------------------------------------------- server


def serve(fd: int, latency_s: float) -> None:
    """Child: a raw ASGI app on uvicorn (uvloop + httptools) serving on the inherited listening socket."""
    raise_nofile_limit()
    import uvicorn

    body_ok = b'{"ok":true,"message":"pong"}'
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body_ok)).encode())]

    async def app(scope, receive, send):
        if scope["type"] == "lifespan":
            while True:
                message = await receive()
                if message["type"] == "lifespan.startup":
                    await send({"type": "lifespan.startup.complete"})
                elif message["type"] == "lifespan.shutdown":
                    await send({"type": "lifespan.shutdown.complete"})
                    return
        more = True
        while more:
            message = await receive()
            more = message.get("more_body", False)
        if scope["method"] == "POST" and latency_s > 0:
            await asyncio.sleep(latency_s)
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await send({"type": "http.response.body", "body": body_ok})

    sock = socket.socket(fileno=fd)
    config = uvicorn.Config(
        app,
        loop="uvloop",
        http="httptools",
        lifespan="on",
        log_level="warning",
        access_log=False,
        backlog=65535,
        timeout_keep_alive=60,
    )
    server = uvicorn.Server(config)
    server.run(sockets=[sock])


def start_server(latency_s: float) -> tuple[subprocess.Popen, int]:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    sock.listen(65535)
    port = sock.getsockname()[1]
    fd = sock.fileno()
    proc = subprocess.Popen(
        [sys.executable, __file__, "--_serve", str(fd), "--latency-ms", str(latency_s * 1000)],
        pass_fds=(fd,),
    )
    sock.close()
    import httpx

    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health", timeout=2, trust_env=False).status_code == 200:
                return proc, port
        except httpx.HTTPError:
            time.sleep(0.05)
    proc.kill()
    raise RuntimeError("benchmark server did not start")


def stop_server(proc: subprocess.Popen) -> None:
    proc.terminate()
    try:
        proc.wait(10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


# ----------------------------------------------------------------------------------------------- client


def percentile(sorted_values: list[float], q: float) -> float:
    if not sorted_values:
        return float("nan")
    k = min(len(sorted_values) - 1, max(0, math.ceil(q * len(sorted_values)) - 1))
    return sorted_values[k]


async def client_run(transport_name: str, port: int, n: int, concurrency: int, timeout_s: float,
                     limit: int, limit_per_host: int, gc_threshold: str = "") -> dict:
    import httpx

    from nemo_gym.http.client import ServerClient, build_transport, close_global_client

    raw_session = None
    if transport_name == "default":
        transport = httpx.AsyncHTTPTransport()
    elif transport_name == "sized":
        transport = build_transport("httpx", limit, limit_per_host)
    elif transport_name == "aiohttp":
        transport = None  # ServerClient's own default: aiohttp directly, the shared session of this loop
    elif transport_name == "aiohttp_raw":
        import aiohttp

        transport = None
        raw_session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=limit, limit_per_host=limit_per_host),
            cookie_jar=aiohttp.DummyCookieJar(),
            timeout=aiohttp.ClientTimeout(total=None, sock_connect=10),
        )
    else:
        raise SystemExit(f"unknown transport {transport_name}")

    cfg = {
        "bench_server": {"resources_servers": {"bench": {"host": "127.0.0.1", "port": port}}},
        "global_aiohttp_connector_limit": limit,
        "global_aiohttp_connector_limit_per_host": limit_per_host,
        "http_client_transport": "aiohttp",
    }
    # max_attempts=1: count failures instead of hiding them behind retries.
    client = None if raw_session is not None else ServerClient(global_config_dict=cfg, transport=transport, max_attempts=1)
    url = f"http://127.0.0.1:{port}/echo"
    payload = {"input": [{"role": "user", "content": "hello"}], "temperature": 0.0}

    latencies: list[float] = []
    failures: list[str] = []

    async def one() -> None:
        t0 = time.perf_counter()
        try:
            if client is not None:
                response = await client.post("bench_server", "/echo", json=payload)
                status = response.status
                await response.json()
            else:
                import orjson

                async with raw_session.post(url, data=orjson.dumps(payload),
                                            headers={"Content-Type": "application/json"}) as r:
                    status = r.status
                    orjson.loads(await r.read())
            if status != 200:
                failures.append(f"HTTP {status}")
                return
            latencies.append(time.perf_counter() - t0)
        except Exception as exc:  # noqa: BLE001
            failures.append(f"{type(exc).__name__}: {exc}"[:200])

    async def worker(count: int) -> None:
        for _ in range(count):
            await one()

    # Warm up (imports, first connection); not measured.
    await asyncio.gather(*(one() for _ in range(8)))
    latencies.clear()
    failures.clear()

    if gc_threshold:
        import gc

        gc.freeze()
        gc.set_threshold(*(int(x) for x in gc_threshold.split(",")))
    rusage0 = resource.getrusage(resource.RUSAGE_SELF)
    t0 = time.perf_counter()
    if concurrency >= n:
        coros = [one() for _ in range(n)]
    else:
        per, extra = divmod(n, concurrency)
        coros = [worker(per + (1 if i < extra else 0)) for i in range(concurrency)]
    task = asyncio.ensure_future(asyncio.gather(*coros))
    stalled = False
    try:
        await asyncio.wait_for(asyncio.shield(task), timeout_s)
    except asyncio.TimeoutError:
        stalled = True
    wall = time.perf_counter() - t0
    rusage1 = resource.getrusage(resource.RUSAGE_SELF)
    cpu = (rusage1.ru_utime - rusage0.ru_utime) + (rusage1.ru_stime - rusage0.ru_stime)
    done = len(latencies)
    result = {
        "transport": transport_name,
        "requests": n,
        "completed": done,
        "failures": len(failures),
        "failure_sample": failures[:3],
        "wall_s": wall,
        "cpu_s": cpu,
        "stalled": stalled,
    }
    latencies.sort()
    result["p50_ms"] = percentile(latencies, 0.50) * 1000
    result["p99_ms"] = percentile(latencies, 0.99) * 1000
    print("RESULT " + json.dumps(result), flush=True)
    if stalled:
        # Cancelling thousands of httpcore waiters can itself take very long; the parent kills us if so.
        task.cancel()
        os._exit(0)
    if transport is not None:
        await transport.aclose()
    elif client is not None:
        await close_global_client()
    if raw_session is not None:
        await raw_session.close()
    return result


def run_client_process(args, transport_name: str, port: int) -> dict:
    cmd = [
        sys.executable, __file__, "--_client", transport_name, "--_port", str(port),
        "--requests", str(args.requests), "--concurrency", str(args.concurrency),
        "--timeout-s", str(args.timeout_s), "--loop", args.loop,
        "--limit", str(args.limit), "--limit-per-host", str(args.limit_per_host),
    ]
    if args.gc_threshold:
        cmd += ["--gc-threshold", args.gc_threshold]
    t0 = time.monotonic()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)
    killed = False
    try:
        out, _ = proc.communicate(timeout=args.timeout_s + 60)
    except subprocess.TimeoutExpired:
        # The client's event loop was too busy (or blocked) to even notice its own timeout.
        proc.kill()
        killed = True
        out, _ = proc.communicate()
    elapsed = time.monotonic() - t0
    for line in out.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[len("RESULT "):])
    why = f"killed after {elapsed:.0f} s: event loop never got back to its timeout" if killed else (
        f"client process exited with {proc.returncode}")
    return {"transport": transport_name, "requests": args.requests, "completed": None, "failures": None,
            "failure_sample": [why], "wall_s": elapsed, "cpu_s": float("nan"), "stalled": True,
            "killed": killed, "p50_ms": float("nan"), "p99_ms": float("nan")}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=16000)
    parser.add_argument("--concurrency", type=int, default=16000)
    parser.add_argument("--latency-ms", type=float, default=50.0)
    parser.add_argument("--transports", default="default,sized,aiohttp")
    parser.add_argument("--timeout-s", type=float, default=120.0)
    parser.add_argument("--loop", choices=("uvloop", "asyncio"), default="uvloop")
    parser.add_argument("--limit", type=int, default=102400, help="global_aiohttp_connector_limit")
    parser.add_argument("--limit-per-host", type=int, default=1024, help="global_aiohttp_connector_limit_per_host")
    parser.add_argument("--gc-threshold", default="",
                        help="client only: gc.freeze() after warm-up and gc.set_threshold(A,B,C), e.g. 20000,50,1000 "
                             "(thousands of live tasks make the default thresholds rescan the heap constantly)")
    parser.add_argument("--_serve", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--_client", help=argparse.SUPPRESS)
    parser.add_argument("--_port", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()

    nofile = raise_nofile_limit()
    latency_s = args.latency_ms / 1000.0

    if args._serve is not None:
        serve(args._serve, latency_s)
        return
    if args._client:
        if args.loop == "uvloop":
            import uvloop

            uvloop.install()
        asyncio.run(client_run(args._client, args._port, args.requests, args.concurrency, args.timeout_s,
                               args.limit, args.limit_per_host, args.gc_threshold))
        return

    names = [t.strip() for t in args.transports.split(",") if t.strip()]
    for name in names:
        if name not in TRANSPORTS:
            parser.error(f"unknown transport {name!r}; choose from {', '.join(TRANSPORTS)}")
    if nofile < min(args.concurrency, args.requests) + 100:
        print(f"warning: RLIMIT_NOFILE is {nofile}; {args.concurrency} connections may hit it", file=sys.stderr)

    in_flight = min(args.concurrency, args.requests)
    waves = math.ceil(args.requests / in_flight)
    ideal_wall = waves * latency_s
    ideal_rate = args.requests / ideal_wall if ideal_wall > 0 else float("inf")
    print(f"{args.requests} requests, {in_flight} in flight, {args.latency_ms:g} ms server latency, "
          f"{os.cpu_count()} CPUs, client loop {args.loop}, RLIMIT_NOFILE {nofile}, "
          f"gc {args.gc_threshold or 'python defaults'}")
    print(f"latency-bound ideal: {ideal_wall:.3f} s wall, {ideal_rate:,.0f} req/s "
          f"(aiohttp/sized pools cap one host at limit_per_host={args.limit_per_host} connections: "
          f"ideal {min(in_flight, args.limit_per_host) / latency_s if latency_s else float('inf'):,.0f} req/s)")
    print()
    header = (f"{'transport':<12} {'requests':>8} {'done':>6} {'wall s':>8} {'req/s':>8} {'p50 ms':>8} "
              f"{'p99 ms':>8} {'fail':>5} {'cpu ms/req':>10} {'vs ideal':>8}  status")
    print(header)
    print("-" * len(header))
    results = []
    for name in names:
        proc, port = start_server(latency_s)
        try:
            r = run_client_process(args, name, port)
        finally:
            stop_server(proc)
        results.append(r)
        done = r["completed"] or 0
        rate = done / r["wall_s"] if r["wall_s"] else 0.0
        cpu_per = (r["cpu_s"] / max(1, done) * 1000) if r["cpu_s"] == r["cpu_s"] else float("nan")
        if r.get("killed"):
            status = "STALLED (killed, no result)"
        elif r["stalled"]:
            status = "STALLED (aborted at timeout)"
        else:
            status = "ok"
        done_s = "?" if r["completed"] is None else str(done)
        fail_s = "?" if r["failures"] is None else str(r["failures"])
        print(f"{name:<12} {r['requests']:>8} {done_s:>6} {r['wall_s']:>8.2f} {rate:>8.0f} "
              f"{r['p50_ms']:>8.1f} {r['p99_ms']:>8.1f} {fail_s:>5} {cpu_per:>10.3f} "
              f"{rate / ideal_rate:>8.1%}  {status}", flush=True)
        if r["failure_sample"]:
            print(f"    failures e.g.: {r['failure_sample']}")


if __name__ == "__main__":
    main()
