"""Which argv a process reads as its config overrides: pytest's own process none, every other process its own."""

from __future__ import annotations


def test_a_script_started_by_a_test_reads_its_own_argv(tmp_path):
    """Only pytest's own process ignores argv: a script a test starts inherits PYTEST_CURRENT_TEST and must still read
    its `+key=value` overrides (it used to fall back silently to the defaults, e.g. head port 11000)."""
    import os
    import subprocess
    import sys

    code = (
        "from nemo_gym.config.global_config import get_global_config_dict; "
        "print('MARKER', get_global_config_dict(allocate_ports=False).get('marker'))"
    )
    env = {**os.environ, "PYTEST_CURRENT_TEST": "tests/x.py::test (call)"}
    done = subprocess.run([sys.executable, "-c", code, "+marker=7"], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=120)
    assert "MARKER 7" in done.stdout, done.stdout + done.stderr
