"""Isolated uv venvs per server, only for servers that ask for one.

By default (`venv_mode: shared`) every server runs on the interpreter that runs `ng_run`: no venv, no
install, fast start. With `venv_mode: isolated` (global key, or the same key in one server's
implementation config, which wins) a server gets its own uv venv built from its folder's
`requirements.txt` or `pyproject.toml`.

Venvs are cached: `<uv_venv_dir>/.venvs/<server_type>__<impl>-<hash12>`, where the hash covers the
requirements/pyproject text, the Python version, `head_server_deps`, the nemo_gym version (and, for an
editable checkout, the framework's own pyproject.toml). A `.nemo_gym_ready` marker is written only after
every install step succeeded, so a venv without it (interrupted build) is rebuilt. Builds of the same venv
by two `ng_run` (or two threads) are serialised with `fcntl.flock` on `<venv>.lock`; the second one finds
the marker and reuses the venv.

Requirement lines that point at the framework itself (`-e nemo-gym[dev] @ ../../`, `nemo-gym`, anything with
`../..`) are replaced by an install of this nemo_gym (editable `-e <PARENT_DIR>` for a checkout, else
`nemo-gym==<version>`) plus the pinned `head_server_deps` (ray/openai at the parent's versions, so the
Ray cluster and the schemas agree across venvs). The framework is installed even when the requirements
do not name it, because every server's entrypoint imports nemo_gym; `venv_install_framework: false`
turns this off (tests, or servers that bring their own copy).
"""

from __future__ import annotations

import collections
import fcntl
import hashlib
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping, Optional

from nemo_gym.config.values import config_get, truthy
from nemo_gym import PARENT_DIR, WORKING_DIR, __version__
from nemo_gym.errors import NeMoGymConfigError

VENV_MODES = ("shared", "isolated")
READY_MARKER = ".nemo_gym_ready"
VENVS_SUBDIR = ".venvs"
EFFECTIVE_REQUIREMENTS_NAME = "nemo_gym_requirements.txt"
ERROR_TAIL_LINES = 30
HASH_LEN = 12

Log = Callable[[str], None]


class VenvBuildError(RuntimeError):
    """Building a server's isolated venv failed. The message names the server, the command and the last
    lines of uv's output; no ready marker is left behind, so the next run builds again."""

    def __init__(self, server: str, command: list[str] | str, output_tail: Iterable[str], *, log_path=None):
        self.server = server
        self.command = command if isinstance(command, str) else " ".join(_quote(c) for c in command)
        self.output_tail = list(output_tail)
        self.log_path = log_path
        tail = "\n".join(f"    {line}" for line in self.output_tail) or "    (no output)"
        where = f"\n  Full log: {log_path}" if log_path else ""
        super().__init__(
            f"Building the isolated venv for server {server} failed.\n"
            f"  Command: {self.command}\n"
            f"  Last {len(self.output_tail)} lines of uv's output:\n{tail}{where}\n"
            f"  Fix the requirement (or the network / index settings), then run again; "
            f"or use venv_mode=shared to run this server on the current interpreter."
        )


@dataclass
class VenvResult:
    """What `ensure_server_venv` did for one server."""

    server: str
    mode: str  # "shared" | "isolated"
    python: str
    venv_dir: Optional[Path] = None
    action: str = "shared"  # "shared" | "built" | "reused"
    seconds: float = 0.0

    def as_dict(self) -> dict[str, Any]:
        return {
            "server": self.server,
            "mode": self.mode,
            "python": self.python,
            "venv_dir": str(self.venv_dir) if self.venv_dir else None,
            "action": self.action,
            "seconds": round(self.seconds, 3),
        }


# ------------------------------------------------------------------------------------------------ config


def effective_venv_mode(global_config: Mapping | None, server_config: Mapping | None) -> str:
    """Per-server `venv_mode` wins over the global one; default `shared`."""
    mode = config_get(server_config, "venv_mode") or config_get(global_config, "venv_mode") or "shared"
    mode = str(mode).strip().lower()
    if mode not in VENV_MODES:
        raise NeMoGymConfigError(f"venv_mode must be one of {', '.join(VENV_MODES)}; got {mode!r}.")
    return mode


def default_head_server_deps() -> list[str]:
    """`ray[default]==<parent ray>` and `openai==<parent openai>`, read from package metadata (no import)."""
    from importlib import metadata

    deps = []
    for dist, spec in (("ray", "ray[default]"), ("openai", "openai")):
        try:
            deps.append(f"{spec}=={metadata.version(dist)}")
        except metadata.PackageNotFoundError:
            pass
    return deps


def _head_server_deps(global_config: Mapping | None) -> list[str]:
    deps = config_get(global_config, "head_server_deps")
    if deps is None:
        return default_head_server_deps()
    if isinstance(deps, str):
        return [deps]
    return [str(d) for d in deps]


def _python_version(global_config: Mapping | None) -> str:
    return str(config_get(global_config, "python_version") or platform.python_version())


def _python_request(version: str) -> str:
    """What to pass to `uv venv --python`: this very interpreter when the versions agree (no discovery,
    never a download), else the version string for uv to find."""
    current = platform.python_version()
    major_minor = ".".join(current.split(".")[:2])
    if version in (current, major_minor):
        return sys.executable
    return version


def _uv_venv_root(global_config: Mapping | None) -> Path:
    return Path(str(config_get(global_config, "uv_venv_dir") or WORKING_DIR)).expanduser() / VENVS_SUBDIR


def _uv_cache_dir(global_config: Mapping | None) -> Path:
    return Path(str(config_get(global_config, "uv_cache_dir") or (WORKING_DIR / "cache" / "uv"))).expanduser()


def find_uv() -> str:
    """The uv binary: the one shipped with the `uv` Python package, else `uv` on PATH."""
    try:
        import uv  # the pip package ships the binary

        return uv.find_uv_bin()
    except Exception:
        pass
    found = shutil.which("uv")
    if found:
        return found
    raise NeMoGymConfigError(
        "venv_mode=isolated needs uv, which was not found. Install it (`pip install uv`) or use venv_mode=shared."
    )


# ---------------------------------------------------------------------------------------- requirements

_NAME_RE = re.compile(r"^\s*(?:(?:-e|--editable)(?:\s+|=))?\s*([A-Za-z0-9][A-Za-z0-9._-]*)\s*(\[[^\]]*\])?")


def _normalize(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def is_framework_requirement(line: str) -> bool:
    """A requirements line that installs nemo_gym itself: names `nemo-gym`/`nemo_gym`, or points at `../..`."""
    text = line.split(" #", 1)[0].strip()
    if not text or text.startswith("#"):
        return False
    if "../.." in text.replace("\\", "/"):
        return True
    m = _NAME_RE.match(text)
    return bool(m and _normalize(m.group(1)) == "nemo-gym")


def _framework_extras(lines: Iterable[str]) -> list[str]:
    extras: list[str] = []
    for line in lines:
        m = _NAME_RE.match(line.split(" #", 1)[0])
        if m and _normalize(m.group(1)) == "nemo-gym" and m.group(2):
            for extra in m.group(2).strip("[]").split(","):
                extra = extra.strip()
                if extra and extra not in extras:
                    extras.append(extra)
    return extras


def framework_requirement(extras: Iterable[str] = ()) -> str:
    """This nemo_gym: editable checkout when the repo's pyproject.toml is there, else the released version."""
    extras = list(extras)
    suffix = f"[{','.join(extras)}]" if extras else ""
    if (PARENT_DIR / "pyproject.toml").exists():
        return f"-e {PARENT_DIR}{suffix}"
    return f"nemo-gym{suffix}=={__version__}"


@dataclass
class ServerRequirements:
    kind: str  # "requirements" | "pyproject"
    path: Path
    text: str


def read_server_requirements(server_dir: Path) -> ServerRequirements:
    req = server_dir / "requirements.txt"
    pyproject = server_dir / "pyproject.toml"
    if req.exists() and pyproject.exists():
        raise NeMoGymConfigError(
            f"{server_dir} has both requirements.txt and pyproject.toml; an isolated venv is built from exactly "
            f"one of them. Remove one (keep pyproject.toml if the server is a package)."
        )
    if req.exists():
        return ServerRequirements("requirements", req, req.read_text())
    if pyproject.exists():
        return ServerRequirements("pyproject", pyproject, pyproject.read_text())
    raise NeMoGymConfigError(
        f"{server_dir} has neither requirements.txt nor pyproject.toml, so its isolated venv cannot be built. "
        f"Add a requirements.txt listing the server's dependencies (a first line `-e nemo-gym[dev] @ ../../` "
        f"installs the framework), or run it with venv_mode=shared."
    )


def effective_requirements(
    reqs: ServerRequirements,
    server_dir: Path,
    *,
    install_framework: bool,
    head_server_deps: list[str],
) -> str:
    """The requirements text actually handed to `uv pip install -r -` (run with cwd = the server dir)."""
    out: list[str] = []
    if reqs.kind == "requirements":
        lines = reqs.text.splitlines()
        framework_lines = [ln for ln in lines if is_framework_requirement(ln)]
        if install_framework:
            out.append("# nemo_gym itself and the pinned head-server deps (added by nemo_gym.runtime.venvs)")
            out.append(framework_requirement(_framework_extras(framework_lines)))
            out.extend(head_server_deps)
        for line in lines:
            if is_framework_requirement(line):
                out.append(f"# replaced: {line.strip()}")
            else:
                out.append(line)
    else:
        if install_framework:
            out.append(framework_requirement())
            out.extend(head_server_deps)
        out.append(f"-e {server_dir}")
    return "\n".join(out) + "\n"


def venv_hash(
    reqs: ServerRequirements,
    *,
    python_version: str,
    head_server_deps: list[str],
    install_framework: bool,
) -> str:
    framework_pyproject = ""
    if install_framework and (PARENT_DIR / "pyproject.toml").exists():
        framework_pyproject = (PARENT_DIR / "pyproject.toml").read_text()
    payload = {
        "kind": reqs.kind,
        "text": reqs.text,
        "python_version": python_version,
        "head_server_deps": list(head_server_deps) if install_framework else [],
        "nemo_gym_version": __version__,
        "install_framework": install_framework,
        "framework": framework_requirement() if install_framework else None,
        "framework_pyproject": framework_pyproject,
    }
    blob = json.dumps(payload, sort_keys=True).encode()
    return hashlib.sha256(blob).hexdigest()[:HASH_LEN]


# ------------------------------------------------------------------------------------------------ build


def _quote(arg: str) -> str:
    import shlex

    return shlex.quote(str(arg))


def _venv_python(venv_dir: Path) -> Path:
    return venv_dir / "bin" / "python"


def is_ready(venv_dir: Path) -> bool:
    return (venv_dir / READY_MARKER).is_file() and _venv_python(venv_dir).exists()


def _latest_ready_venv(root: Path, prefix: str) -> Optional[Path]:
    if not root.is_dir():
        return None
    ready = [p for p in root.glob(f"{prefix}-*") if p.is_dir() and is_ready(p)]
    if not ready:
        return None
    return max(ready, key=lambda p: (p / READY_MARKER).stat().st_mtime)


class _FileLock:
    """Exclusive `fcntl.flock` on a lock file; blocks, telling the user when it has to wait."""

    def __init__(self, path: Path, log: Log, what: str):
        self.path = path
        self.log = log
        self.what = what
        self.fd: Optional[int] = None

    def __enter__(self) -> "_FileLock":
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(self.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            self.log(f"waiting for another build of {self.what} to finish ...")
            fcntl.flock(self.fd, fcntl.LOCK_EX)
        return self

    def __exit__(self, *exc) -> None:
        if self.fd is not None:
            try:
                fcntl.flock(self.fd, fcntl.LOCK_UN)
            finally:
                os.close(self.fd)
                self.fd = None


def _run_logged(
    cmd: list[str],
    *,
    server: str,
    env: Mapping[str, str],
    cwd: Path,
    log_file,
    log: Log,
    verbose: bool,
    stdin_text: Optional[str] = None,
) -> None:
    """Run one build command, appending its output to the build log; raise VenvBuildError on failure."""
    tail: collections.deque[str] = collections.deque(maxlen=ERROR_TAIL_LINES)
    log_file.write(f"$ {' '.join(_quote(c) for c in cmd)}\n")
    log_file.flush()
    try:
        proc = subprocess.Popen(
            cmd,
            cwd=str(cwd),
            env=dict(env),
            stdin=subprocess.PIPE if stdin_text is not None else subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            errors="replace",
        )
    except OSError as exc:
        raise VenvBuildError(server, cmd, [f"could not start: {exc}"], log_path=getattr(log_file, "name", None))
    if stdin_text is not None:
        assert proc.stdin is not None
        try:
            proc.stdin.write(stdin_text)
        except BrokenPipeError:
            pass
        finally:
            proc.stdin.close()
    assert proc.stdout is not None
    for line in proc.stdout:
        line = line.rstrip("\n")
        tail.append(line)
        log_file.write(line + "\n")
        if verbose:
            log(line)
    proc.stdout.close()
    code = proc.wait()
    log_file.flush()
    if code != 0:
        tail.append(f"(exit code {code})")
        raise VenvBuildError(server, cmd, tail, log_path=getattr(log_file, "name", None))


def _build(
    venv_dir: Path,
    *,
    server: str,
    server_dir: Path,
    requirements_text: str,
    python_request: str,
    global_config: Mapping | None,
    marker_info: dict,
    log: Log,
) -> None:
    uv = find_uv()
    verbose = truthy(config_get(global_config, "pip_install_verbose", False))
    cache_dir = _uv_cache_dir(global_config)
    cache_dir.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ)
    env["UV_CACHE_DIR"] = str(cache_dir)
    env.pop("VIRTUAL_ENV", None)  # uv must target the --python we give it, not an activated venv
    env.setdefault("UV_NO_PROGRESS", "1")

    if venv_dir.exists():  # half-built (no marker) or stale: start clean
        shutil.rmtree(venv_dir, ignore_errors=True)
    log_path = venv_dir.with_name(venv_dir.name + ".build.log")
    python = _venv_python(venv_dir)
    install = [uv, "pip", "install", "--python", str(python)]
    if verbose:
        install.append("-v")
    if truthy(os.environ.get("NEMO_GYM_ALLOW_PRERELEASE", "")):
        install += ["--prerelease", "allow"]
    install += ["-r", "-"]
    try:
        with open(log_path, "w") as log_file:
            _run_logged(
                [uv, "venv", "--python", python_request, str(venv_dir)],
                server=server, env=env, cwd=server_dir, log_file=log_file, log=log, verbose=verbose,
            )
            (venv_dir / EFFECTIVE_REQUIREMENTS_NAME).write_text(requirements_text)
            _run_logged(
                install,
                server=server, env=env, cwd=server_dir, log_file=log_file, log=log, verbose=verbose,
                stdin_text=requirements_text,
            )
    except BaseException:
        shutil.rmtree(venv_dir, ignore_errors=True)
        raise
    # The marker goes last and atomically: its presence means "every step above succeeded".
    tmp = venv_dir / (READY_MARKER + ".tmp")
    tmp.write_text(json.dumps(marker_info, indent=2, sort_keys=True) + "\n")
    os.replace(tmp, venv_dir / READY_MARKER)


def ensure_server_venv(
    server_dir: Path,
    global_config: Mapping | None,
    server_config: Mapping | None,
    *,
    log: Log = print,
) -> VenvResult:
    """Decide shared vs isolated for one server; for isolated, reuse or build its venv."""
    server_dir = Path(server_dir).resolve()
    server_type, impl = server_dir.parent.name, server_dir.name
    server = f"{server_type}/{impl}"
    mode = effective_venv_mode(global_config, server_config)
    if mode == "shared":
        return VenvResult(server=server, mode=mode, python=sys.executable)

    started = time.monotonic()
    reqs = read_server_requirements(server_dir)
    install_framework = truthy(config_get(global_config, "venv_install_framework", True))
    if server_config is not None and config_get(server_config, "venv_install_framework") is not None:
        install_framework = truthy(config_get(server_config, "venv_install_framework"))
    head_deps = _head_server_deps(global_config) if install_framework else []
    python_version = _python_version(global_config)
    digest = venv_hash(
        reqs, python_version=python_version, head_server_deps=head_deps, install_framework=install_framework
    )
    root = _uv_venv_root(global_config)
    prefix = f"{server_type}__{impl}"
    venv_dir = root / f"{prefix}-{digest}"

    def reused(path: Path, note: str = "") -> VenvResult:
        log(f"reusing venv {path}{note}")
        return VenvResult(server, mode, str(_venv_python(path)), path, "reused", time.monotonic() - started)

    if truthy(config_get(global_config, "skip_venv_if_present", False)):
        if is_ready(venv_dir):
            return reused(venv_dir)
        other = _latest_ready_venv(root, prefix)
        if other is not None:
            return reused(other, " (skip_venv_if_present: requirements not re-checked)")
    if is_ready(venv_dir):  # fast path: the marker is written last, so its presence means complete
        return reused(venv_dir)

    with _FileLock(root / f"{venv_dir.name}.lock", log, server):
        if is_ready(venv_dir):  # someone else built it while we waited
            return reused(venv_dir)
        log(f"building venv {venv_dir} from {reqs.path.name} (python {python_version}) ...")
        text = effective_requirements(
            reqs, server_dir, install_framework=install_framework, head_server_deps=head_deps
        )
        marker_info = {
            "server": server,
            "server_dir": str(server_dir),
            "hash": digest,
            "source": reqs.kind,
            "python_version": python_version,
            "head_server_deps": head_deps,
            "install_framework": install_framework,
            "nemo_gym_version": __version__,
            "built_at": time.time(),
        }
        _build(
            venv_dir,
            server=server,
            server_dir=server_dir,
            requirements_text=text,
            python_request=_python_request(python_version),
            global_config=global_config,
            marker_info=marker_info,
            log=log,
        )
    seconds = time.monotonic() - started
    log(f"venv ready in {seconds:.1f}s: {venv_dir}")
    return VenvResult(server, mode, str(_venv_python(venv_dir)), venv_dir, "built", seconds)


def server_python_command(
    server_dir: Path,
    global_config: Mapping,
    server_config: Mapping,
    *,
    log: Log = print,
) -> list[str]:
    """The argv prefix that runs the server's entrypoint: `[sys.executable]` in shared mode, else the python of
    the server's (built or reused) isolated venv."""
    return [ensure_server_venv(server_dir, global_config, server_config, log=log).python]


# ----------------------------------------------------------------------------------------------- dry run


def _spec_server_dir(spec: Any, cwd: Path) -> tuple[Any, Path]:
    """Accept a ServerInstanceSpec, an object with `.spec` and `.server_dir` (the launcher's ServerProcess), or a
    `(spec, server_dir)` pair."""
    if isinstance(spec, tuple) and len(spec) == 2:
        return spec[0], Path(spec[1])
    if hasattr(spec, "server_dir") and hasattr(spec, "spec"):
        return spec.spec, Path(spec.server_dir)
    if hasattr(spec, "server_dir"):
        return spec, Path(spec.server_dir)
    from nemo_gym.config.server_paths import locate_server  # confined to the server roots

    return spec, locate_server(spec, cwd).server_dir


def prebuild_all(
    specs: Iterable[Any],
    global_config: Mapping,
    *,
    cwd: Optional[Path] = None,
    log: Log = print,
) -> list[dict[str, Any]]:
    """Build (or reuse) every server's environment, one after another (the `dry_run` path). Returns one summary
    dict per server. All servers are attempted; afterwards the first failure is raised (several: a
    VenvBuildError listing them)."""
    cwd = Path(cwd or os.getcwd())
    summary: list[dict[str, Any]] = []
    failures: list[tuple[str, BaseException]] = []
    for item in specs:
        spec, server_dir = _spec_server_dir(item, cwd)
        server_id = str(getattr(spec, "server_id", server_dir.name))
        config = getattr(spec, "config", None)
        prefixed: Log = lambda msg, sid=server_id: log(f"({sid}) {msg}")
        try:
            result = ensure_server_venv(server_dir, global_config, config, log=prefixed)
        except (VenvBuildError, NeMoGymConfigError) as exc:
            failures.append((server_id, exc))
            summary.append({"server_id": server_id, "server": str(server_dir), "action": "failed", "error": str(exc)})
            prefixed(f"FAILED: {str(exc).splitlines()[0]}")
            continue
        row = result.as_dict()
        row["server_id"] = server_id
        summary.append(row)
        if result.mode == "shared":
            prefixed(f"shared venv (current interpreter {sys.executable})")
    if len(failures) == 1:
        raise failures[0][1]
    if failures:
        raise VenvBuildError(
            ", ".join(sid for sid, _ in failures),
            "(several builds, see below)",
            [line for sid, exc in failures for line in (f"[{sid}]", *str(exc).splitlines())][-ERROR_TAIL_LINES:],
        )
    return summary
