"""nemo_gym.runtime.venvs: shared by default, isolated uv venvs on request, cached by hash: the modes and inputs.
Real builds (uv, locked, rebuilt if half-built) are tests/integration/test_venvs_processes.py."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from nemo_gym import PARENT_DIR, __version__
from nemo_gym.errors import NeMoGymConfigError
from nemo_gym.runtime import venvs
from nemo_gym.runtime.venvs import (
    effective_requirements,
    effective_venv_mode,
    is_framework_requirement,
    read_server_requirements,
    server_python_command,
    venv_hash,
)


def make_server(root: Path, requirements: str | None = "-e nemo-gym[dev] @ ../../\n", *, pyproject: str | None = None,
                server_type: str = "resources_servers", impl: str = "tiny") -> Path:
    d = root / server_type / impl
    d.mkdir(parents=True, exist_ok=True)
    (d / "app.py").write_text("print('hi')\n")
    if requirements is not None:
        (d / "requirements.txt").write_text(requirements)
    if pyproject is not None:
        (d / "pyproject.toml").write_text(pyproject)
    return d


@pytest.fixture
def gcfg(tmp_path):
    """A global config for fast, offline-friendly isolated builds (no framework install)."""
    return OmegaConf.create(
        {
            "venv_mode": "isolated",
            "venv_install_framework": False,
            "uv_venv_dir": str(tmp_path / "venvroot"),
            "uv_cache_dir": str(tmp_path / "uvcache"),
        }
    )


# ------------------------------------------------------------------------------------------ mode and inputs


def test_venv_mode_default_global_and_per_server_override():
    assert effective_venv_mode({}, {}) == "shared"
    assert effective_venv_mode({"venv_mode": "isolated"}, {}) == "isolated"
    assert effective_venv_mode({"venv_mode": "isolated"}, {"venv_mode": "shared"}) == "shared"
    assert effective_venv_mode({}, {"venv_mode": "isolated"}) == "isolated"
    with pytest.raises(NeMoGymConfigError, match="venv_mode"):
        effective_venv_mode({"venv_mode": "conda"}, {})


def test_shared_mode_is_current_interpreter_and_needs_no_requirements(tmp_path):
    d = make_server(tmp_path, requirements=None)
    assert server_python_command(d, {}, {"entrypoint": "app.py"}) == [sys.executable]
    assert server_python_command(d, {"venv_mode": "isolated"}, {"venv_mode": "shared"}) == [sys.executable]


def test_both_or_neither_requirement_files_are_config_errors(tmp_path, gcfg):
    both = make_server(tmp_path, pyproject="[project]\nname='x'\n", impl="both")
    with pytest.raises(NeMoGymConfigError, match="both requirements.txt and pyproject.toml"):
        server_python_command(both, gcfg, {})
    neither = make_server(tmp_path, requirements=None, impl="neither")
    with pytest.raises(NeMoGymConfigError) as info:
        server_python_command(neither, gcfg, {})
    assert str(neither) in str(info.value) and "requirements.txt" in str(info.value)


@pytest.mark.parametrize(
    "line,expected",
    [
        ("-e nemo-gym[dev] @ ../../", True),
        ("nemo-gym", True),
        ("nemo_gym>=0.2", True),
        ("-e ../..", True),
        ("Nemo.Gym[dev]", True),
        ("nemo-gym-extras", False),
        ("six==1.17.0", False),
        ("# nemo-gym", False),
        ("", False),
    ],
)
def test_framework_requirement_detection(line, expected):
    assert is_framework_requirement(line) is expected


def test_effective_requirements_replace_framework_lines(tmp_path):
    d = make_server(tmp_path, "-e nemo-gym[dev] @ ../../\nsix==1.17.0\n")
    reqs = read_server_requirements(d)
    text = effective_requirements(reqs, d, install_framework=True, head_server_deps=["ray[default]==9.9", "openai==1.0"])
    lines = [ln for ln in text.splitlines() if ln and not ln.startswith("#")]
    if (PARENT_DIR / "pyproject.toml").exists():
        assert lines[0] == f"-e {PARENT_DIR}[dev]"
    else:
        assert lines[0] == f"nemo-gym[dev]=={__version__}"
    assert lines[1:] == ["ray[default]==9.9", "openai==1.0", "six==1.17.0"]
    assert "../../" not in "\n".join(lines)

    # Not installing the framework: the framework line disappears and no pins are added.
    text = effective_requirements(reqs, d, install_framework=False, head_server_deps=["ray==9.9"])
    assert [ln for ln in text.splitlines() if ln and not ln.startswith("#")] == ["six==1.17.0"]

    # A pyproject server installs itself (editable) after the framework and pins.
    p = make_server(tmp_path, requirements=None, pyproject="[project]\nname='p'\n", impl="pp")
    text = effective_requirements(read_server_requirements(p), p, install_framework=True, head_server_deps=["openai==1"])
    lines = text.splitlines()
    assert lines[-1] == f"-e {p}" and "openai==1" in lines and lines[0].startswith(("-e ", "nemo-gym"))


def test_hash_covers_requirements_python_and_pins(tmp_path):
    d = make_server(tmp_path, "six\n")
    reqs = read_server_requirements(d)
    base = dict(python_version="3.11.7", head_server_deps=["ray==1"], install_framework=True)
    h = venv_hash(reqs, **base)
    assert len(h) == 12 and h == venv_hash(reqs, **base)
    assert venv_hash(reqs, **{**base, "python_version": "3.12.1"}) != h
    assert venv_hash(reqs, **{**base, "head_server_deps": ["ray==2"]}) != h
    assert venv_hash(reqs, **{**base, "install_framework": False}) != h
    (d / "requirements.txt").write_text("six\nattrs\n")
    assert venv_hash(read_server_requirements(d), **base) != h


def test_default_head_server_deps_pin_parent_versions():
    from importlib import metadata

    deps = venvs.default_head_server_deps()
    assert f"ray[default]=={metadata.version('ray')}" in deps
    assert f"openai=={metadata.version('openai')}" in deps

