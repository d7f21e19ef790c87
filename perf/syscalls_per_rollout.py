"""System calls per rollout of each server process, the floor's against the stack's, counted by `strace -c`.

Why: CPU per rollout (`floor_vs_stack.py`) moves with the machine's load; a syscall count does not. It tells whether
the stack's extra CPU is in the kernel (more reads, writes and wake-ups than the floor's 8 exchanges need) or in
Python. Starts the fake LLM, the floor (`floor_stack.py`) and the stack as `floor_vs_stack.py` does, warms both up,
then attaches strace to each server process while `ROLLOUTS` rollouts run at `IN_FLIGHT`. Needs Debian's strace.

    python perf/syscalls_per_rollout.py [IN_FLIGHT=1] [ROLLOUTS=300]
"""

import asyncio
import re
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from floor_stack import start_floor, stop_floor
from floor_vs_stack import role
from rollout_throughput import AGENT, CONFIGS, REPO, drive, load_row
from nemo_gym.testing.stack import FakeLLMBackend, NgRunStack, fake_llm_overrides, free_port, server_instances

level = int(sys.argv[1]) if len(sys.argv) > 1 else 1
total = int(sys.argv[2]) if len(sys.argv) > 2 else 300

def trace(procs, url, row):
    tracers = {}
    for name, pid in procs.items():
        out = f"{tempfile.mkdtemp()}/strace_{name}.txt"
        tracers[name] = (subprocess.Popen(["strace", "-c", "-f", "-o", out, "-p", str(pid)], stderr=subprocess.DEVNULL), out)
    time.sleep(1.0)
    asyncio.run(drive(url, row, total, level))
    for p, _ in tracers.values():
        p.send_signal(signal.SIGINT)
    res = {}
    for name, (p, out) in tracers.items():
        p.wait(timeout=30)
        counts = {}
        for line in Path(out).read_text().splitlines():
            m = re.match(r"\s*[\d.]+\s+[\d.]+\s+\d+\s+(\d+)\s+(?:\d+\s+)?(\w+)$", line)
            if m and m.group(2) != "total":
                counts[m.group(2)] = int(m.group(1))
        res[name] = counts
    return res

row = load_row()
head_port = free_port()
with FakeLLMBackend("--tool-args", '{"city": "Oslo"}') as backend:
    floor = start_floor(backend.url, pool=64)
    stack = NgRunStack(fake_llm_overrides(CONFIGS, backend.base_url, head_port), cwd=REPO)
    try:
        stack.wait_for("servers ready!", timeout=180)
        inst = server_instances(head_port)
        stack_url = next(i["url"] for i in inst if i["process_name"] == AGENT) + "/run"
        stack_procs = {role(i["process_name"]): i["pid"] for i in inst}
        floor_procs = {n: floor[n].proc.pid for n in ("agent", "model", "resources")}
        for url in (floor["url"], stack_url):
            asyncio.run(drive(url, row, 200, 16))
        for label, url, procs in (("floor", floor["url"], floor_procs), ("stack", stack_url, stack_procs)):
            res = trace(procs, url, row)
            for name, counts in res.items():
                tot = sum(counts.values())
                top = sorted(counts.items(), key=lambda kv: -kv[1])[:8]
                print(f"{label:5} {name:9} {tot/total:6.1f}/rollout  " + " ".join(f"{k}={v/total:.1f}" for k, v in top))
    finally:
        stop_floor(floor)
        stack.stop(timeout=60)
