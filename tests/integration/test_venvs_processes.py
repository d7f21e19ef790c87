"""nemo_gym.runtime.venvs with real builds: isolated uv venvs built, reused, rebuilt if half-built, built once under
concurrent callers, a failed build's command and output; and a real package from PyPI (skipped when PyPI cannot be
reached). The modes and inputs are tests/unit/test_venvs.py."""

from __future__ import annotations

import subprocess
import sys
import threading
from dataclasses import dataclass
from pathlib import Path

import pytest

from nemo_gym.errors import NeMoGymConfigError
from nemo_gym.runtime import venvs
from nemo_gym.runtime.venvs import READY_MARKER, VenvBuildError, ensure_server_venv, prebuild_all, server_python_command
from tests.unit.test_venvs import gcfg, make_server  # noqa: F401  (gcfg: fixture)


NETWORK_HINTS = (
    "network", "connect", "dns", "resolve host", "timed out", "timeout", "failed to fetch", "request failed",
    "tls", "certificate", "offline", "error sending request", "temporary failure", "name or service",
)


def logs():
    lines: list[str] = []
    return lines, lines.append


def test_isolated_build_then_reuse(tmp_path, gcfg):
    d = make_server(tmp_path)  # only the framework line, which is dropped: an empty install
    lines, log = logs()
    result = ensure_server_venv(d, gcfg, {"entrypoint": "app.py"}, log=log)
    assert result.action == "built"
    venv_dir = result.venv_dir
    assert venv_dir.parent == Path(gcfg.uv_venv_dir) / ".venvs"
    assert venv_dir.name.startswith("resources_servers__tiny-") and len(venv_dir.name.split("-")[-1]) == 12
    marker = venv_dir / READY_MARKER
    assert marker.is_file()
    assert (Path(gcfg.uv_cache_dir)).is_dir()
    out = subprocess.run([result.python, "-c", "import sys; print(sys.prefix)"], capture_output=True, text=True)
    assert out.returncode == 0 and Path(out.stdout.strip()) == venv_dir
    assert any("building venv" in ln for ln in lines)

    mtime = marker.stat().st_mtime_ns
    lines2, log2 = logs()
    cmd = server_python_command(d, gcfg, {"entrypoint": "app.py"}, log=log2)
    assert cmd == [str(venv_dir / "bin" / "python")]
    assert marker.stat().st_mtime_ns == mtime
    assert any(ln.startswith("reusing venv") for ln in lines2)
    assert not any("building venv" in ln for ln in lines2)

    # Per-server override: this server alone back on the shared interpreter.
    assert server_python_command(d, gcfg, {"venv_mode": "shared"}) == [sys.executable]


def test_half_built_venv_is_rebuilt_and_changed_requirements_get_a_new_venv(tmp_path, gcfg):
    d = make_server(tmp_path)
    first = ensure_server_venv(d, gcfg, {}, log=lambda m: None)
    (first.venv_dir / READY_MARKER).unlink()  # as if the build was interrupted before the marker
    lines, log = logs()
    again = ensure_server_venv(d, gcfg, {}, log=log)
    assert again.action == "built" and again.venv_dir == first.venv_dir
    assert (first.venv_dir / READY_MARKER).is_file()

    (d / "requirements.txt").write_text("-e nemo-gym[dev] @ ../../\n# pinned something else\n")
    changed = ensure_server_venv(d, gcfg, {}, log=lambda m: None)
    assert changed.action == "built" and changed.venv_dir != first.venv_dir

    # skip_venv_if_present: any ready venv of this server is taken without checking the hash.
    (d / "requirements.txt").write_text("-e nemo-gym[dev] @ ../../\n# a third variant\n")
    gcfg.skip_venv_if_present = True
    lines, log = logs()
    skipped = ensure_server_venv(d, gcfg, {}, log=log)
    assert skipped.action == "reused" and skipped.venv_dir in (first.venv_dir, changed.venv_dir)
    assert any("reusing venv" in ln for ln in lines)


def test_failed_build_raises_with_command_and_output_and_leaves_no_marker(tmp_path, gcfg):
    d = make_server(tmp_path, "./no-such-local-package\n", impl="broken")
    with pytest.raises(VenvBuildError) as info:
        server_python_command(d, gcfg, {}, log=lambda m: None)
    err = info.value
    assert isinstance(err, RuntimeError)
    msg = str(err)
    assert "resources_servers/broken" in msg
    assert "pip install" in msg and "no-such-local-package" in msg
    assert len(err.output_tail) <= venvs.ERROR_TAIL_LINES
    root = Path(gcfg.uv_venv_dir) / ".venvs"
    assert not list(root.glob(f"*/{READY_MARKER}"))


def test_concurrent_builds_of_one_venv_build_once(tmp_path, gcfg):
    d = make_server(tmp_path)
    results, lines = [], []
    lock = threading.Lock()

    def log(msg):
        with lock:
            lines.append(msg)

    def run():
        results.append(ensure_server_venv(d, gcfg, {}, log=log))

    threads = [threading.Thread(target=run) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(results) == 3 and len({r.venv_dir for r in results}) == 1
    assert sorted(r.action for r in results).count("built") == 1
    assert sum("building venv" in ln for ln in lines) == 1


@dataclass
class _Spec:
    server_id: str
    server_type: str
    impl: str
    config: dict


def test_prebuild_all_summary(tmp_path, gcfg):
    iso = make_server(tmp_path, impl="iso")
    shared = make_server(tmp_path, requirements=None, impl="plain")
    specs = [
        (_Spec("a", "resources_servers", "iso", {"entrypoint": "app.py"}), iso),
        (_Spec("b", "resources_servers", "plain", {"entrypoint": "app.py", "venv_mode": "shared"}), shared),
    ]
    lines, log = logs()
    summary = prebuild_all(specs, gcfg, log=log)
    assert [row["server_id"] for row in summary] == ["a", "b"]
    assert summary[0]["action"] == "built" and summary[0]["mode"] == "isolated"
    assert summary[1]["action"] == "shared" and summary[1]["python"] == sys.executable
    assert all(ln.startswith(("(a) ", "(b) ")) for ln in lines)
    assert prebuild_all(specs, gcfg, log=log)[0]["action"] == "reused"

    bad = make_server(tmp_path, requirements=None, impl="bad")
    with pytest.raises(NeMoGymConfigError):
        prebuild_all([(_Spec("c", "resources_servers", "bad", {}), bad)] + specs, gcfg, log=lambda m: None)


def test_real_package_from_pypi_installs_and_is_reused(tmp_path, gcfg):
    d = make_server(tmp_path, "-e nemo-gym[dev] @ ../../\nsix==1.17.0\n", impl="withsix")
    try:
        result = ensure_server_venv(d, gcfg, {}, log=lambda m: None)
    except VenvBuildError as exc:
        text = str(exc).lower()
        if any(hint in text for hint in NETWORK_HINTS):
            pytest.skip(f"PyPI not reachable from uv, cannot install a real package: {str(exc).splitlines()[0]} ...")
        raise
    code = "import six, sys; print(six.__version__, sys.prefix)"
    out = subprocess.run([result.python, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    version, prefix = out.stdout.split()
    assert version == "1.17.0" and Path(prefix) == result.venv_dir
    # The venv has it; the build did not touch the parent interpreter's environment.
    marker = result.venv_dir / READY_MARKER
    mtime = marker.stat().st_mtime_ns
    again = ensure_server_venv(d, gcfg, {}, log=lambda m: None)
    assert again.action == "reused" and again.venv_dir == result.venv_dir
    assert marker.stat().st_mtime_ns == mtime
