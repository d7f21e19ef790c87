"""Where the stack's CPU goes compared with the floor's, by library: the kernel, the Python interpreter, pydantic-core.

`floor_vs_stack.py` says how much more CPU the stack spends per rollout than the bare-asyncio floor; this says in
which part of each process the difference lies. It starts the same fake LLM, the floor (`perf/floor_stack.py`) and
the real stack (`ng_run`: example_single_tool_call + openai_model + simple_agent), drives `--rollouts` `/run` calls
at `--in-flight` through each in turn, and samples every server process with Linux `perf record` (CPU-clock
samples, no call graphs) while it does. Each sample is counted for the shared object it fell in, and each process's
measured CPU time per rollout is split in those proportions:

- kernel: system calls and the loopback TCP path (what the floor's syscall-lean design is about);
- interpreter: libpython (bytecode, objects, dicts, the allocator) and libc (malloc, memcpy) - Python code;
- pydantic-core, uvloop, httptools, orjson, hashlib/OpenSSL, other: the compiled libraries by name.

The table gives ms of CPU per rollout for the floor and the stack, per area and in total, summed over the three
processes, and each process's own row. Needs `perf` (linux-tools) and a `perf_event_paranoid` that lets this user
record its own processes (2 or lower).

    python perf/cpu_by_library.py --in-flight 16 --rollouts 2000
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent))
from floor_stack import start_floor, stop_floor
from floor_vs_stack import running_stack
from rollout_throughput import drive, load_row

from nemo_gym.testing.stack import FakeLLMBackend, cpu_seconds

# (area, substring of perf's shared-object name); the first match wins.
AREAS = [
    ("kernel", "[kernel"),
    ("interpreter", "libpython"),
    ("interpreter", "python3"),  # a statically linked interpreter
    ("interpreter", "libc.so"),
    ("pydantic-core", "_pydantic_core"),
    ("uvloop", "uvloop"),
    ("uvloop", "loop.cpython"),
    ("httptools", "parser.cpython"),
    ("httptools", "url_parser"),
    ("orjson", "orjson"),
    ("hashlib/OpenSSL", "libcrypto"),
    ("hashlib/OpenSSL", "_hashlib"),
]
ORDER = ["kernel", "interpreter", "pydantic-core", "uvloop", "httptools", "orjson", "hashlib/OpenSSL", "other"]
PROCESSES = ("agent", "model", "resources")


def area_of(dso: str) -> str:
    for area, needle in AREAS:
        if needle in dso:
            return area
    return "other"


def shares(data: Path) -> dict[str, float]:
    """The share of one `perf record` file's samples in each area."""
    report = subprocess.run(
        ["perf", "report", "-i", str(data), "--sort", "dso", "--stdio", "-g", "none", "--percent-limit", "0"],
        capture_output=True, text=True, check=True,
    ).stdout
    counts: collections.Counter = collections.Counter()
    for line in report.splitlines():
        line = line.strip()
        if not line or line.startswith("#") or "%" not in line:
            continue
        percent, _, dso = line.partition("%")
        try:
            counts[area_of(dso.strip())] += float(percent)
        except ValueError:
            continue
    total = sum(counts.values()) or 1.0
    return {area: counts[area] / total for area in ORDER}


def record(name: str, url: str, procs: dict[str, psutil.Process], row: dict, total: int, level: int,
           out_dir: Path) -> dict[str, dict[str, float]]:
    """{process: {area: CPU ms per rollout}} for one system (floor or stack) under `total` rollouts at `level`."""
    asyncio.run(drive(url, row, 300, level))  # warm-up
    spies = {
        proc: subprocess.Popen(
            ["perf", "record", "-F", "999", "-p", str(p.pid), "-o", str(out_dir / f"{name}_{proc}.data")],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )
        for proc, p in procs.items()
    }
    time.sleep(1.0)  # perf attaches
    before = {proc: cpu_seconds(p) for proc, p in procs.items()}
    asyncio.run(drive(url, row, total, level))
    cpu = {proc: (cpu_seconds(p) - before[proc]) * 1000 / total for proc, p in procs.items()}
    for spy in spies.values():
        spy.send_signal(signal.SIGINT)
    for spy in spies.values():
        spy.wait(timeout=60)
    return {proc: {area: share * cpu[proc] for area, share in shares(out_dir / f"{name}_{proc}.data").items()}
            for proc in procs}


def table(floor: dict, stack: dict) -> str:
    lines = [f"{'area':<16} {'floor':>7} {'stack':>7} {'ratio':>6} | " + " ".join(f"{p:>16}" for p in PROCESSES),
             f"{'':<16} {'':>7} {'':>7} {'':>6} | " + " ".join(f"{'floor -> stack':>16}" for _ in PROCESSES)]
    for area in [*ORDER, "total"]:
        def cell(system: dict, proc: str) -> float:
            values = system[proc]
            return sum(values.values()) if area == "total" else values[area]

        f_sum = sum(cell(floor, p) for p in PROCESSES)
        s_sum = sum(cell(stack, p) for p in PROCESSES)
        ratio = f"{s_sum / f_sum:.1f}x" if f_sum >= 0.005 else "-"
        lines.append(f"{area:<16} {f_sum:>7.3f} {s_sum:>7.3f} {ratio:>6} | "
                     + " ".join(f"{cell(floor, p):>7.3f} -> {cell(stack, p):<5.3f}" for p in PROCESSES))
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--in-flight", type=int, default=16)
    parser.add_argument("--rollouts", type=int, default=2000)
    parser.add_argument("--keep", type=Path, default=None, help="directory to keep the perf.data files in")
    args = parser.parse_args()
    if shutil.which("perf") is None:
        sys.exit("perf is not installed (Debian: apt install linux-perf)")
    out_dir = args.keep or Path(tempfile.mkdtemp(prefix="ng_cpu_by_library_"))
    out_dir.mkdir(parents=True, exist_ok=True)

    row = load_row()
    with FakeLLMBackend("--tool-args", '{"city": "Oslo"}') as backend:
        floor = start_floor(backend.url)
        try:
            floor_procs = {p: psutil.Process(floor[p].proc.pid) for p in PROCESSES}
            floor_result = record("floor", floor["url"], floor_procs, row, args.rollouts, args.in_flight, out_dir)
        finally:
            stop_floor(floor)
        with running_stack(backend) as servers:
            stack_procs = {name: psutil.Process(server["pid"]) for name, server in servers.items()}
            stack_result = record("stack", servers["agent"]["url"] + "/run", stack_procs, row, args.rollouts,
                                  args.in_flight, out_dir)
    print(f"{args.rollouts} rollouts at {args.in_flight} in flight; CPU ms per rollout (user+system of each server "
          f"process, split by where perf's samples fell); floor = perf/floor_stack.py")
    print(table(floor_result, stack_result))
    if args.keep:
        print(f"perf.data files in {out_dir} (perf report -i FILE)")


if __name__ == "__main__":
    main()
