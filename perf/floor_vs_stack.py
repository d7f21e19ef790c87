"""Issue 11: the real stack measured against the bare-asyncio floor, side by side, by one harness.

Starts one fake LLM (`nemo_gym.testing.fake_openai_server`, default script: a `get_weather` call, then a message),
then the floor (`perf/floor_stack.py`: agent, model proxy, resources on bare `asyncio.Protocol`), the first floor
(`perf/floor_stack_streams.py`: the same on asyncio streams, a second column for comparison; `--no-streams-floor`
skips it), with `--validated-floor` the validated floor (`perf/floor_validated.py`: the floor plus exactly the
pydantic work the API contract asks for, so stack / validated floor is our framework's own overhead) and the real
stack (`ng_run` of example_single_tool_call + openai_model + simple_agent), all pointed at
that LLM. For each in-flight level it drives each of them in turn with the same load generator (`drive` from
`rollout_throughput.py`: `/run` calls with the first row of example.jsonl) and prints one table:

- CPU ms per rollout = user + system CPU seconds of the three server processes (not the fake LLM, not the load
  generator) / rollouts, for the floor, the streams floor and the stack, and the ratios stack / floor (the
  reference) and stack / each other floor;
- rollouts per second (wall) of each, and the ratio floor / stack;
- the stack's CPU ms per rollout per process (agent, model proxy, resources), and for reference the fake LLM's
  and the load generator's under each (on 2 cores they bound the floor's rollouts/s).

Each floor's servers count the exchanges they make (`/_floor/stats`): every floor run is checked to have made 8 per
rollout, and the script exits 1 if one did not. Runs alternate between the floors and the stack so all see the same
background load, `--repeats` times per level; the
table shows each figure's median, and the spread of the runs' totals is printed below it. The 2 cores are shared by the
servers, the fake LLM and the load generator, so rollouts/s is a lower bound on a busy machine; CPU per rollout is
the steadier figure.

    python perf/floor_vs_stack.py --in-flight 1,16,256,1024 --rollouts 2000 --repeats 3
    python perf/floor_vs_stack.py --no-streams-floor --validated-floor --rollouts 1500 --sequential 300 --repeats 2
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import statistics
import sys
import time
from pathlib import Path
from typing import Iterator

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent))
import floor_stack_streams
from floor_stack import floor_exchanges, start_floor, stop_floor
from rollout_throughput import AGENT, CONFIGS, REPO, drive, load_row

from nemo_gym.testing.stack import (
    FakeLLMBackend,
    NgRunStack,
    cpu_seconds,
    fake_llm_overrides,
    free_port,
    server_instances,
)


EXCHANGES_PER_ROLLOUT = 8  # /run, seed, model x2, LLM x2, get_weather, verify


def measure(procs: dict, backend: psutil.Process, url: str, row: dict, total: int, level: int,
            floor: dict | None = None) -> dict:
    """Drive `total` rollouts at `level` in flight; CPU ms per rollout of each of `procs` and of the backend. For a
    floor, also the exchanges it made per rollout (read outside the measured window)."""
    exchanges0 = floor_exchanges(floor) if floor else 0
    before = {name: cpu_seconds(p) for name, p in procs.items()}
    backend0, me, driver0 = cpu_seconds(backend), psutil.Process(), cpu_seconds(psutil.Process())
    wall, _, failures = asyncio.run(drive(url, row, total, level))
    cpu = {name: (cpu_seconds(p) - before[name]) * 1000 / total for name, p in procs.items()}
    result = {"rps": total / wall, "cpu": sum(cpu.values()), "per_process": cpu, "failures": failures,
              "llm": (cpu_seconds(backend) - backend0) * 1000 / total, "driver": (cpu_seconds(me) - driver0) * 1000 / total}
    if floor:
        result["exchanges"] = (floor_exchanges(floor) - exchanges0) / total
    return result


def median_run(runs: list[dict]) -> dict:
    """Each figure's median over repeated runs (per process too): one noisy run does not decide a ratio."""
    middle = statistics.median
    return {"rps": middle(r["rps"] for r in runs), "cpu": middle(r["cpu"] for r in runs),
            "per_process": {k: middle(r["per_process"][k] for r in runs) for k in runs[0]["per_process"]},
            "failures": sum(r["failures"] for r in runs), "llm": middle(r["llm"] for r in runs),
            "driver": middle(r["driver"] for r in runs), "spread": (min(r["cpu"] for r in runs), max(r["cpu"] for r in runs)),
            "exchanges": sorted({r["exchanges"] for r in runs if "exchanges" in r})}


def times(a: float, b: float) -> str:
    """a / b as "2.9x"; "-" when b is 0 (CPU times come in 10 ms ticks: a short run can read 0)."""
    return f"{a / b:.1f}x" if b else "-"


def role(process_name: str) -> str:
    return "agent" if process_name == AGENT else "model" if "model" in process_name else "resources"


@contextlib.contextmanager
def running_stack(backend: FakeLLMBackend) -> Iterator[dict[str, dict]]:
    """The real stack (`ng_run` of CONFIGS) against the fake LLM `backend`, ready; yields the head server's record
    (url, pid, ...) of each server by role ("agent", "model", "resources"), and stops the stack on exit."""
    head_port = free_port()
    stack = NgRunStack(fake_llm_overrides(CONFIGS, backend.base_url, head_port), cwd=REPO)
    try:
        stack.wait_for("servers ready!", timeout=180)
        yield {role(i["process_name"]): i for i in server_instances(head_port)}
    finally:
        stack.stop(timeout=60)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--in-flight", default="1,16,256,1024")
    parser.add_argument("--rollouts", type=int, default=2000, help="rollouts per level (at least the level)")
    parser.add_argument("--sequential", type=int, default=None, help="rollouts at 1 in flight (default: --rollouts)")
    parser.add_argument("--latency-ms", type=float, default=0.0, help="fake LLM latency per call")
    parser.add_argument("--pool", type=int, default=64, help="floors: keep-alive connections per peer, at most")
    parser.add_argument("--no-streams-floor", action="store_true",
                        help="skip the first floor (perf/floor_stack_streams.py, asyncio streams): saves a third of the time")
    parser.add_argument("--validated-floor", action="store_true",
                        help="also measure the validated floor (perf/floor_validated.py: the floor plus the contract's "
                             "pydantic work), so stack / validated floor shows the framework's own overhead")
    parser.add_argument("--repeats", type=int, default=3,
                        help="runs per level, floor and stack alternating; the table shows medians")
    args = parser.parse_args()
    levels = [int(x) for x in args.in_flight.split(",") if x]

    row = load_row()
    with FakeLLMBackend("--tool-args", '{"city": "Oslo"}', "--latency-ms", str(args.latency_ms)) as backend:
        backend_proc = psutil.Process(backend.proc.pid)
        floors = {"floor": start_floor(backend.url, pool=args.pool)}
        try:
            if not args.no_streams_floor:
                floors["streams"] = start_floor(backend.url, pool=args.pool, script=floor_stack_streams.__file__)
            if args.validated_floor:
                floors["validated"] = start_floor(backend.url, pool=args.pool, validate=True)
            with running_stack(backend) as servers:
                runs = {name: (f["url"], {n: psutil.Process(f[n].proc.pid) for n in ("agent", "model", "resources")}, f)
                        for name, f in floors.items()}
                runs["stack"] = (servers["agent"]["url"] + "/run",
                                 {name: psutil.Process(s["pid"]) for name, s in servers.items()}, None)
                for url, _, _ in runs.values():  # warm-up
                    asyncio.run(drive(url, row, 200, 16))
                results = []
                for level in levels:
                    total = max(args.sequential or args.rollouts, 1) if level == 1 else max(args.rollouts, level)
                    samples: dict = {name: [] for name in runs}
                    for _ in range(args.repeats):
                        for name, (url, procs, floor) in runs.items():
                            samples[name].append(measure(procs, backend_proc, url, row, total, level, floor))
                            time.sleep(0.5)
                    results.append({"level": level, "total": total, **{n: median_run(s) for n, s in samples.items()}})
                    print(f"  done: {level} in flight", file=sys.stderr, flush=True)
        finally:
            for floor in floors.values():
                stop_floor(floor)

    extras = [name for name in floors if name != "floor"]  # columns beside the reference floor
    short = {"streams": "str", "validated": "val"}
    print(f"fake LLM latency {args.latency_ms:g} ms; CPU = ms per rollout, user+system, of the 3 server processes; "
          f"medians of {args.repeats} runs per level; floor = perf/floor_stack.py (asyncio.Protocol, the reference)"
          + ("; streams = perf/floor_stack_streams.py (asyncio streams)" if "streams" in floors else "")
          + ("; validated = the floor plus the contract's pydantic work (perf/floor_validated.py)"
             if "validated" in floors else ""))
    print(f"{'in flight':>9} {'rollouts':>8} | {'floor CPU':>9}" + "".join(f" {n:>9}" for n in extras)
          + f" {'stack CPU':>9} {'ratio':>6}" + "".join(f" {'vs ' + short[n]:>6}" for n in extras)
          + f" | {'floor r/s':>9}" + "".join(f" {short[n] + ' r/s':>7}" for n in extras)
          + f" {'stack r/s':>9} {'ratio':>6} | {'agent':>6} {'model':>6} {'resrc':>6} | {'LLM f/s':>11} "
          f"{'driver f/s':>11} {'fail f/s':>8}" + "".join(f" {'fail ' + short[n]:>8}" for n in extras))
    for r in results:
        f, s = r["floor"], r["stack"]
        p = s["per_process"]
        print(f"{r['level']:>9} {r['total']:>8} | {f['cpu']:>9.2f}" + "".join(f" {r[n]['cpu']:>9.2f}" for n in extras)
              + f" {s['cpu']:>9.2f} {times(s['cpu'], f['cpu']):>6}" + "".join(f" {times(s['cpu'], r[n]['cpu']):>6}" for n in extras)
              + f" | {f['rps']:>9.0f}" + "".join(f" {r[n]['rps']:>7.0f}" for n in extras)
              + f" {s['rps']:>9.0f} {times(f['rps'], s['rps']):>6} | {p['agent']:>6.2f} {p['model']:>6.2f} "
              f"{p['resources']:>6.2f} | {f['llm']:>5.2f}/{s['llm']:<5.2f} {f['driver']:>5.2f}/{s['driver']:<5.2f} "
              f"{f['failures']:>4}/{s['failures']:<3}" + "".join(f" {r[n]['failures']:>8}" for n in extras))
    for name in ("floor", *extras):
        label = "floor" if name == "floor" else f"{name} floor"
        print(f"per process, {label} -> stack (CPU ms per rollout), and the spread of the runs' totals:")
        for r in results:
            e, s = r[name]["per_process"], r["stack"]["per_process"]
            print(f"{r['level']:>9} | " + "  ".join(f"{n} {e[n]:.2f} -> {s[n]:.2f} ({times(s[n], e[n])})"
                                                    for n in ("agent", "model", "resources"))
                  + f" | {name} {r[name]['spread'][0]:.2f}..{r[name]['spread'][1]:.2f}"
                  + (f", stack {r['stack']['spread'][0]:.2f}..{r['stack']['spread'][1]:.2f}" if name == "floor" else ""))
    print("ratio: stack CPU / floor CPU, floor rollouts/s / stack rollouts/s" + "".join(
          f"; vs {short[n]}: stack CPU / {n} floor CPU" for n in extras) + "; agent/model/resrc: the stack's CPU per "
          "process; LLM, driver: CPU ms per rollout of the fake LLM and of the load generator under floor / stack")
    wrong = [(name, r["level"], r[name]["exchanges"]) for r in results for name in floors
             if r[name]["exchanges"] != [EXCHANGES_PER_ROLLOUT]]
    for name, level, seen in wrong:
        print(f"ERROR: the {name} floor made {seen} HTTP exchanges per rollout at {level} in flight, not "
              f"{EXCHANGES_PER_ROLLOUT}: a rollout was lost or its calls changed; see perf/floor_stack.py", file=sys.stderr)
    if wrong:
        sys.exit(1)
    print(f"exchanges: every floor run made {EXCHANGES_PER_ROLLOUT} HTTP exchanges per rollout "
          f"({', '.join(floors)}; counted by the floors' servers)")

if __name__ == "__main__":
    main()
