"""Measure `ng_run` start-to-ready time and the resident memory of the running 3-server stack.

Starts the fake LLM backend, then `ng_run` on the test stack (openai_model + counter resources server + agent),
times from process start to the `All 3 / 3 servers ready!` line, sums the RSS of ng_run and all its descendants
(unique pages are not separated: RSS over-counts shared libraries, so this is an upper bound), stops it with SIGINT
and times the shutdown. Repeats `--runs` times and prints medians.

    python perf/stack_startup.py --runs 4
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import psutil

from nemo_gym.testing.stack import FakeLLMBackend, NgRunStack, fake_llm_overrides, free_port, process_tree

REPO = Path(__file__).resolve().parent.parent
STACK = REPO / "tests" / "fixtures" / "stack"


def one_run(backend_url: str) -> dict:
    t0 = time.perf_counter()
    stack = NgRunStack(fake_llm_overrides(["configs/stack.yaml"], backend_url, free_port()), cwd=STACK)
    try:
        stack.wait_for("servers ready!")
        ready = time.perf_counter() - t0
        time.sleep(1.0)  # let the servers settle after the first requests
        procs = process_tree(stack.proc.pid)
        rss = sum(p.memory_info().rss for p in procs if p.is_running())
        uss = 0
        for p in procs:
            try:
                uss += p.memory_full_info().uss
            except (psutil.Error, AttributeError):
                pass
    finally:
        t1 = time.perf_counter()
        stack.stop(timeout=60)
    return {"ready_s": ready, "rss_mb": rss / 2**20, "uss_mb": uss / 2**20, "processes": len(procs),
            "stop_s": time.perf_counter() - t1}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=4)
    args = parser.parse_args()
    with FakeLLMBackend() as backend:
        results = [one_run(backend.base_url) for _ in range(args.runs)]
    print(f"{'run':>4} {'ready s':>8} {'RSS MB':>8} {'USS MB':>8} {'procs':>6} {'stop s':>7}")
    for i, r in enumerate(results, 1):
        print(f"{i:>4} {r['ready_s']:>8.2f} {r['rss_mb']:>8.0f} {r['uss_mb']:>8.0f} {r['processes']:>6} {r['stop_s']:>7.2f}")
    med = {k: statistics.median(r[k] for r in results) for k in results[0]}
    print(f"{'med':>4} {med['ready_s']:>8.2f} {med['rss_mb']:>8.0f} {med['uss_mb']:>8.0f} {med['processes']:>6.0f} {med['stop_s']:>7.2f}")
    print(f"ready-time vs the reference's ~37 s: {37 / med['ready_s']:.1f}x faster; target 3 s or less")
    print(f"stack RSS vs the reference's ~2.5 GB: {2560 / med['rss_mb']:.1f}x smaller; target 400 MB or less")


if __name__ == "__main__":
    main()
