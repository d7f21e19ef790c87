"""Rollout throughput of a full stack: example_single_tool_call + openai_model + simple_agent over a fake LLM.

What it measures (the DESIGN.md section 3 figures):
- start-up: `ng_run` process start to `All 3 / 3 servers ready!`;
- framework milliseconds per rollout at 1 in flight (wall time per `/run`, the fake model answers at once);
- rollouts per second at 16 / 256 / 1024 in flight;
- CPU milliseconds per rollout per process (agent, resources server, model server; the fake backend and the
  load generator are reported apart: they are not the stack);
- peak resident memory of the stack.

Each rollout is one `/run`: seed, model call -> get_weather tool call, model call -> message, verify.

    python perf/rollout_throughput.py --rollouts 2000 --latency-ms 0
    python perf/rollout_throughput.py --in-flight 16,256 --latency-ms 50

Run it on a quiet machine: the 2 cores are shared by the stack, the fake LLM and the load generator.
`perf/floor_vs_stack.py` runs the same load against this stack and the bare-asyncio floor side by side.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time
from pathlib import Path

import httpx
import psutil

from nemo_gym.testing.stack import (
    FakeLLMBackend,
    NgRunStack,
    cpu_seconds,
    fake_llm_overrides,
    free_port,
    process_tree,
    server_instances,
)

REPO = Path(__file__).resolve().parent.parent
CONFIGS = [
    "resources_servers/example_single_tool_call/configs/example_single_tool_call.yaml",
    "responses_api_models/openai_model/configs/openai_model.yaml",
]
AGENT = "example_single_tool_call_simple_agent"
REFERENCE = {"ready_s": 37.0, "rps_1": 34.0, "rps_256": 73.0, "cpu_ms": 22.5, "rss_mb": 2560.0}


def load_row() -> dict:
    path = REPO / "resources_servers/example_single_tool_call/data/example.jsonl"
    return json.loads(path.read_text().splitlines()[0])


async def drive(url: str, row: dict, total: int, in_flight: int) -> tuple[float, list[float], int]:
    """Send `total` /run calls with at most `in_flight` at once; returns wall seconds, latencies, failures.
    The load generator shares the machine with what it measures, so it uses the cheapest client we have (the
    lean keep-alive client that `ng_collect_rollouts` uses too), with its default connection limit per server
    (1024: beyond that, rollouts wait in the load generator, as they do in the collector)."""
    from yarl import URL

    from nemo_gym.http.client import DEFAULT_CONNECTOR_LIMIT_PER_HOST
    from nemo_gym.http.lean_client import LeanClient

    target = URL(url)
    client = LeanClient(limit_per_host=DEFAULT_CONNECTOR_LIMIT_PER_HOST)
    body = json.dumps(row).encode()
    headers = {"Content-Type": "application/json"}
    timeout = {"connect": 60.0, "read": None, "pool": None}
    latencies: list[float] = []
    failures = 0
    next_index = 0

    async def worker() -> None:
        nonlocal next_index, failures
        while next_index < total:
            next_index += 1
            t0 = time.perf_counter()
            try:
                r = await client.request("POST", target.host, target.port, target.raw_path_qs, headers, body, timeout)
                if r.status != 200 or json.loads(r.body).get("reward") is None:
                    failures += 1
            except httpx.HTTPError:
                failures += 1
            latencies.append(time.perf_counter() - t0)

    t0 = time.perf_counter()
    try:
        await asyncio.gather(*(worker() for _ in range(min(in_flight, total))))
    finally:
        await client.aclose()
    return time.perf_counter() - t0, latencies, failures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rollouts", type=int, default=1000, help="rollouts per concurrency level")
    parser.add_argument("--sequential", type=int, default=300, help="rollouts for the 1-in-flight figure")
    parser.add_argument("--in-flight", default="16,256,1024")
    parser.add_argument("--latency-ms", type=float, default=0.0, help="fake LLM latency per call")
    args = parser.parse_args()

    head_port = free_port()
    with FakeLLMBackend("--tool-args", '{"city": "Oslo"}', "--latency-ms", str(args.latency_ms)) as backend:
        t_start = time.perf_counter()
        stack = NgRunStack(fake_llm_overrides(CONFIGS, backend.base_url, head_port), cwd=REPO)
        try:
            stack.wait_for("servers ready!")
            ready_s = time.perf_counter() - t_start
            instances = server_instances(head_port)
            procs = {i["process_name"]: psutil.Process(i["pid"]) for i in instances}
            agent_url = next(i["url"] for i in instances if i["process_name"] == AGENT) + "/run"
            backend_proc = psutil.Process(backend.proc.pid)
            me = psutil.Process()
            row = load_row()
            peak_rss = 0.0

            def stack_rss() -> float:
                return sum(p.memory_info().rss for p in process_tree(stack.proc.pid)) / 2**20

            asyncio.run(drive(agent_url, row, 50, 8))  # warm-up

            results = []
            levels = [1] + [int(x) for x in args.in_flight.split(",") if x]
            for level in levels:
                total = args.sequential if level == 1 else max(args.rollouts, level)
                cpu0 = {name: cpu_seconds(p) for name, p in procs.items()}
                b0, m0 = cpu_seconds(backend_proc), cpu_seconds(me)
                wall, lat, failures = asyncio.run(drive(agent_url, row, total, level))
                cpu = {name: (cpu_seconds(p) - cpu0[name]) * 1000 / total for name, p in procs.items()}
                peak_rss = max(peak_rss, stack_rss())
                results.append({
                    "in_flight": level, "rollouts": total, "wall_s": wall, "rps": total / wall,
                    "p50_ms": statistics.median(lat) * 1000, "failures": failures, "cpu_ms": cpu,
                    "backend_cpu_ms": (cpu_seconds(backend_proc) - b0) * 1000 / total,
                    "driver_cpu_ms": (cpu_seconds(me) - m0) * 1000 / total,
                })
        finally:
            stack.stop(timeout=60)

    names = sorted(results[0]["cpu_ms"])
    short = {n: n.replace("example_single_tool_call_", "") for n in names}
    print(f"fake LLM latency: {args.latency_ms:.0f} ms; start-up to all-ready: {ready_s:.2f} s "
          f"(reference ~{REFERENCE['ready_s']:.0f} s: {REFERENCE['ready_s'] / ready_s:.1f}x)")
    header = f"{'in flight':>9} {'rollouts':>8} {'rollouts/s':>10} {'p50 ms':>8} {'fail':>5} " + " ".join(
        f"{short[n][:16]:>16}" for n in names) + f" {'stack CPU':>9} {'fake LLM':>8} {'driver':>7}"
    print("CPU columns are milliseconds per rollout")
    print(header)
    for r in results:
        stack_cpu = sum(r["cpu_ms"].values())
        print(f"{r['in_flight']:>9} {r['rollouts']:>8} {r['rps']:>10.1f} {r['p50_ms']:>8.2f} {r['failures']:>5} "
              + " ".join(f"{r['cpu_ms'][n]:>16.2f}" for n in names)
              + f" {stack_cpu:>9.2f} {r['backend_cpu_ms']:>8.2f} {r['driver_cpu_ms']:>7.2f}")
    seq = results[0]
    print(f"framework ms per rollout at 1 in flight: {1000 / seq['rps']:.2f} ms "
          f"({seq['rps']:.0f} rollouts/s; reference ~{REFERENCE['rps_1']:.0f}/s: {seq['rps'] / REFERENCE['rps_1']:.1f}x)")
    for r in results[1:]:
        if r["in_flight"] == 256:
            print(f"256 in flight: {r['rps']:.0f} rollouts/s (reference ~{REFERENCE['rps_256']:.0f}/s: "
                  f"{r['rps'] / REFERENCE['rps_256']:.1f}x)")
    best_cpu = min(sum(r["cpu_ms"].values()) for r in results)
    print(f"whole-stack CPU per rollout (best level): {best_cpu:.2f} ms (reference 21-24 ms; target <= 5 ms)")
    print(f"peak stack RSS: {peak_rss:.0f} MB (reference ~2.5 GB; target <= 400 MB)")


if __name__ == "__main__":
    main()
