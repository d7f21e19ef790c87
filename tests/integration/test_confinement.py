"""A config cannot run code from outside the server roots (issue 37, item 4): `ng_run` with an entrypoint that
climbs out with `..`, or an implementation name that does, exits with the reason and starts nothing; so does the
same through a command-line override; `ng_validate` reports it. Every script here, inside the roots or out, would
write a marker file if it ever ran, so "nothing ran" is checked on disk, not inferred from the exit code."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from nemo_gym.testing.stack import NgRunStack, free_port

RS = "resources_servers"
MARKER_SCRIPT = "from pathlib import Path\nPath({path!r}).write_text('ran')\n"


def _script(path: Path, marker: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(MARKER_SCRIPT.format(path=str(marker)))


@pytest.fixture
def tree(tmp_path: Path) -> dict:
    """tmp/work is where ng_run runs (a root, holding resources_servers/my_env); tmp/outside/x.py and tmp/dir/app.py
    lie outside it. Each script writes its own marker under tmp/markers when run."""
    work = tmp_path / "work"
    markers = tmp_path / "markers"
    markers.mkdir()
    my_env = work / RS / "my_env"
    _script(my_env / "app.py", markers / "my_env")
    (my_env / "requirements.txt").write_text("")
    _script(tmp_path / "outside" / "x.py", markers / "outside_x")
    _script(tmp_path / "dir" / "app.py", markers / "dir_app")
    (tmp_path / "dir" / "requirements.txt").write_text("")
    return {"work": work, "markers": markers}


def _config(work: Path, name: str, impl: str, entrypoint: str) -> str:
    # A good block beside the bad one: it must not start either.
    (work / name).write_text(
        f"good:\n  {RS}:\n    my_env:\n      entrypoint: app.py\n      domain: other\n"
        f"evil:\n  {RS}:\n    {impl!r}:\n      entrypoint: {entrypoint!r}\n      domain: other\n"
    )
    return name


def _ng_run(work: Path, *overrides: str) -> tuple[int, str]:
    with NgRunStack([*overrides, f"+head_server.port={free_port()}"], cwd=work) as stack:
        code = stack.wait(timeout=120)
        return code, stack.output


CASES = {
    "dotdot_entrypoint": ("my_env", "../../../outside/x.py", "`evil.resources_servers.my_env.entrypoint`"),
    "dotdot_implementation": ("../../dir", "app.py", "implementation name '../../dir' under `evil.resources_servers`"),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_ng_run_refuses_code_outside_the_roots_and_runs_nothing(tree, case):
    impl, entrypoint, named = CASES[case]
    work, markers = tree["work"], tree["markers"]
    config = _config(work, "evil.yaml", impl, entrypoint)
    code, output = _ng_run(work, f"+config_paths=[{config}]")
    assert code == 2, output
    assert "Traceback" not in output, output
    assert named in output and "`..`" in output and "nemo_gym runs server code only from inside" in output, output
    assert sorted(p.name for p in markers.iterdir()) == [], output


def test_ng_run_refuses_an_override_that_climbs_out(tree):
    work, markers = tree["work"], tree["markers"]
    config = _config(work, "fine.yaml", "my_env", "app.py")  # `evil` is fine in the file...
    code, output = _ng_run(
        work, f"+config_paths=[{config}]", "+evil.resources_servers.my_env.entrypoint=../../../outside/x.py"
    )  # ...until the command line points it outside
    assert code == 2, output
    assert "`evil.resources_servers.my_env.entrypoint` ('../../../outside/x.py') climbs out with `..`" in output
    assert sorted(p.name for p in markers.iterdir()) == [], output


def test_ng_validate_reports_it(tree):
    work = tree["work"]
    config = _config(work, "evil.yaml", "my_env", "../../../outside/x.py")
    result = subprocess.run(
        [sys.executable, "-c", "from nemo_gym.cli import validate; validate()", f"+config_paths=[{config}]"],
        cwd=work, capture_output=True, text=True, timeout=120,
    )
    assert result.returncode == 2, result.stderr
    assert "`evil.resources_servers.my_env.entrypoint` ('../../../outside/x.py') climbs out with `..`" in result.stderr
    assert sorted(p.name for p in tree["markers"].iterdir()) == []
