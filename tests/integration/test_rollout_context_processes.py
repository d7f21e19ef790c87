"""Model-call capture files (`CaptureStore`, NeMo Gym v0.5 §7.2) written by several processes at once: each line
stays whole. The rest of rollout correlation and capture is tests/unit/test_rollout_context.py."""

from __future__ import annotations

import subprocess
import sys

from tests.unit.test_rollout_context import read_lines

APPENDER = """
import sys
from nemo_gym.servers.model_call_capture import CaptureStore
root, writer = sys.argv[1], sys.argv[2]
store = CaptureStore(root)
for i in range(25):
    assert store.append("0-0", {"writer": writer, "i": i, "pad": writer * 100_000})
"""


def test_concurrent_appends_from_several_processes_keep_whole_lines(tmp_path):
    writers = [subprocess.Popen([sys.executable, "-c", APPENDER, str(tmp_path), w]) for w in "abcd"]
    assert [w.wait(timeout=120) for w in writers] == [0, 0, 0, 0]
    lines = read_lines(tmp_path / "0-0.capture.jsonl")
    assert sorted((e["writer"], e["i"]) for e in lines) == sorted((w, i) for w in "abcd" for i in range(25))
    assert all(e["pad"] == e["writer"] * 100_000 for e in lines)
