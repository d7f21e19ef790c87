"""Smoke test of perf/payload_scaling.py: the smallest sizes run end to end and the table is printed.

A benchmark script, not a timing test: nothing here asserts a time or a ratio, only that the floor and the real
stack (weather_tool_use + vllm_model in training mode + simple_agent, against the fake backend's NeMo RL token
bundle) both ran every case without failures and that the table and its check lines came out.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_payload_scaling_prints_its_table() -> None:
    run = subprocess.run(
        [sys.executable, str(REPO / "perf" / "payload_scaling.py"), "--sizes", "100", "--in-flight", "1,2",
         "--rollouts", "2", "--repeats", "1", "--multi-turn-size", "100", "--multi-turn-calls", "4",
         "--settle", "0"],
        cwd=REPO, capture_output=True, text=True, timeout=240,
    )
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-3000:]
    out = run.stdout
    assert "floor CPU" in out and "stack CPU" in out and "stack RSS peak/after" in out
    rows = [line.split() for line in out.splitlines() if line.strip().startswith("100 ") and "|" in line]
    rows = [r for r in rows if r[1].isdigit()]  # the table's rows, not the per-process lines below it
    assert [(r[1], r[2]) for r in rows] == [("2", "1"), ("2", "2"), ("4", "1"), ("4", "2")], out
    assert "no failures" in out
