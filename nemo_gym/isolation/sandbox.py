"""Run untrusted code (e.g. programs written by the policy model) in a sandboxed subprocess.

One `Sandbox` is one execution: a fresh scratch directory, a launcher process that sets up the isolation, and
the program. Use it as a context manager; `close()` kills whatever is left and removes the scratch directory.

    with Sandbox(SandboxLimits(cpu_seconds=5, wall_seconds=10)) as sandbox:
        result = sandbox.run(sandbox.python_argv("main.py"), files={"main.py": code}, stdin=b"1 2\\n")
    result.returncode, result.stdout, result.timed_out, result.enforced

`run_python(code, stdin=...)` is the one-line version. For a conversation with the program (send a request,
read a reply, decide whether to go on) use `sandbox.start(argv, files=...)` and the returned `SandboxProcess`.

What is enforced, and where
---------------------------
The parent (this module, in the calling process) creates the scratch directory, picks the sandbox user, starts
the launcher (`python -I -S nemo_gym/isolation/sandbox.py <config>`, stdlib only, in a new session) and enforces the
wall-clock limit: on timeout it SIGKILLs the launcher's whole process group. The launcher then, in order:

1. **Namespaces** (needs root; `unshare(2)` through ctypes since `os.unshare` is Python 3.12+): a new network
   namespace (only a loopback interface that is down: every connect fails, nothing on the host is reachable,
   not even 127.0.0.1), a new mount namespace and a new PID namespace. The launcher forks an init process
   (PID 1 of the new namespace) that reaps zombies and forks the program; when init dies the kernel kills
   every process left in the namespace, so "kill the launcher" kills the program *and all its descendants*,
   including ones that called `setsid()` to leave the process group.
2. **Filesystem view** (in the mount namespace): a size-limited tmpfs (`scratch_bytes`) owned by the sandbox
   user is mounted on the scratch directory; it is the program's cwd and `$HOME`. Read-only empty tmpfs are
   mounted over `/tmp`, `/var/tmp`, `/dev/shm`, `/run`, `/root`, `/home`, the repository root and the caller's
   working directory (so neither the datasets with the expected answers, nor Ray's unix sockets in `/tmp/ray`,
   nor credentials under `/root` or `/run/secrets` are visible); the interpreter's install tree is bound back
   read-only where the masks would hide it. A fresh `/proc` shows only the sandbox's processes.
3. **Limits** (setrlimit in the program's process, inherited by its children): RLIMIT_CPU, RLIMIT_AS
   (memory), RLIMIT_NPROC (processes *and threads* of the sandbox user), RLIMIT_FSIZE (largest file, which
   also caps output written to files), RLIMIT_NOFILE, RLIMIT_CORE=0.
4. **User**: when the caller is root, the program runs as a dedicated unprivileged uid/gid taken from a pool
   (`UID_POOL_BASE` + slot; one slot per concurrent sandbox, held with a lock file). It owns no file on the
   host, so besides its scratch tmpfs it could only write to world-writable places, and the usual ones
   (`/tmp`, `/var/tmp`, `/dev/shm`, `/run`) are masked read-only; it cannot signal or trace anything outside the
   sandbox, and RLIMIT_NPROC counts only this sandbox's processes (it is
   per uid, and root ignores it: that is why root never runs the program). `PR_SET_NO_NEW_PRIVS` stops
   set-uid binaries from regaining privileges.
5. **Environment**: only `PATH`, `LANG` and `HOME` (= the scratch directory). Python programs run with
   `-I` (isolated: no `PYTHON*` variables, no user site, no script directory on `sys.path`) and, unless
   `site_packages=True`, `-S` (standard library only).

Output is capped: `run()` keeps at most `max_output_bytes` of stdout and of stderr and kills the program when it
writes more; `SandboxProcess.read_line()` refuses longer lines.

Degraded modes (reported in `enforced`, never silent): without root (or when `unshare` is refused) there are
no namespaces; network access is then blocked only at the Python level (the `socket` module is replaced by a
startup hook in `python_argv`; native code can still open sockets), other processes of the user stay visible,
and a child that leaves the process group is not killed with it. Without root the program runs as the caller's
user (RLIMIT_NPROC is set to the user's current task count plus `max_processes`) and can write wherever that
user can.
"""

from __future__ import annotations

import marshal
import os
import sys

_SYSTEM_DIRS = ("/usr", "/lib", "/lib32", "/lib64", "/bin", "/sbin", "/etc", "/dev", "/proc", "/sys")


def _is_under(path: str, parent: str) -> bool:
    return path == parent or path.startswith(parent.rstrip("/") + "/")


# ================================================================================================ launcher
# This half runs in the launcher process (`python -I -S sandbox.py <config>`). It comes first and imports only
# builtin modules, so the launcher starts without paying for the parent half's imports (see the end of it).
# Config and reports travel as `marshal` data (builtin, no import cost), written by the trusted parent/launcher.

_CLONE_NEWNS = 0x00020000
_CLONE_NEWPID = 0x20000000
_CLONE_NEWNET = 0x40000000
_MS_RDONLY = 1
_MS_NOSUID = 2
_MS_NODEV = 4
_MS_NOEXEC = 8
_MS_REMOUNT = 32
_MS_BIND = 4096
_MS_REC = 16384
_MS_PRIVATE = 1 << 18
_PR_SET_PDEATHSIG = 1
_PR_SET_NO_NEW_PRIVS = 38
_SIGKILL = 9  # (the `signal` module costs the launcher 10 ms of imports)

_libc = None


def _c():
    global _libc
    if _libc is None:
        import ctypes

        _libc = ctypes.CDLL(None, use_errno=True)
        _libc.mount.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong, ctypes.c_char_p]
        _libc.unshare.argtypes = [ctypes.c_int]
        _libc.prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong]
    return _libc


def _check(result: int, what: str) -> None:
    if result != 0:
        import ctypes

        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")


def _unshare(flags: int) -> None:
    _check(_c().unshare(flags), "unshare")


def _mount(source: Optional[str], target: str, fstype: Optional[str], flags: int, data: Optional[str] = None) -> None:
    enc = lambda s: None if s is None else s.encode()  # noqa: E731
    _check(_c().mount(enc(source), enc(target), enc(fstype), flags, enc(data)), f"mount {target}")


def _prctl(option: int, arg: int) -> None:
    _check(_c().prctl(option, arg, 0, 0, 0), "prctl")


def _report(fd: int, obj: dict) -> None:
    """One record on the report pipe: 4-byte length, then the marshalled dict."""
    data = marshal.dumps(obj)
    try:
        os.write(fd, len(data).to_bytes(4, "little") + data)
    except OSError:
        pass


def _masks(cfg: dict, exposes: list[str]) -> list[str]:
    """The directories to hide: the configured ones, plus the top-most directory that the sandbox user cannot
    traverse on the way to the interpreter (e.g. /root for a pyenv install); deepest-last."""
    candidates = set()
    for path in cfg["hidden"]:
        if not path:
            continue
        real = os.path.realpath(path)
        if os.path.isdir(real):
            candidates.add(real)
    if cfg["uid"] is not None:
        for path in exposes:
            parts = path.strip("/").split("/")
            for i in range(1, len(parts)):
                prefix = "/" + "/".join(parts[:i])
                try:
                    if not os.stat(prefix).st_mode & 0o001:
                        candidates.add(prefix)
                        break
                except OSError:
                    break
    masks = []
    for m in candidates:
        if m == "/" or any(_is_under(s, m) for s in _SYSTEM_DIRS) or m in exposes:
            continue
        masks.append(m)
    return sorted(masks, key=lambda p: (p.count("/"), p))


def _setup_mounts(cfg: dict, enforced: dict) -> None:
    """In the new mount namespace: scratch tmpfs, masks over hidden directories, interpreter re-exposed, /proc."""
    _mount(None, "/", None, _MS_REC | _MS_PRIVATE)
    uid = cfg["uid"] if cfg["uid"] is not None else os.getuid()
    gid = cfg["gid"] if cfg["gid"] is not None else os.getgid()
    workdir = cfg["workdir"]
    exposes: list[str] = []
    for path in sorted({os.path.realpath(p) for p in cfg["expose"] if os.path.isdir(p)}):
        if not any(_is_under(path, e) for e in exposes):  # nested ones come along with their parent
            exposes.append(path)
    handles = {p: os.open(p, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC) for p in exposes}
    masks = _masks(cfg, exposes)
    mounted: list[str] = []
    for mask in masks:
        # Inside an earlier mask it is already hidden, unless it sits in a directory bound back into view.
        if any(_is_under(mask, m) for m in mounted) and not any(_is_under(mask, e) for e in exposes):
            continue
        if not os.path.isdir(mask):
            continue
        _mount("tmpfs", mask, "tmpfs", _MS_NOSUID | _MS_NODEV, "size=1m,mode=0755")
        mounted.append(mask)
        for path in exposes:
            if _is_under(path, mask) and path != mask:
                os.makedirs(path, mode=0o755, exist_ok=True)
                _mount(f"/proc/self/fd/{handles[path]}", path, None, _MS_BIND | _MS_REC)
                _mount(None, path, None, _MS_REMOUNT | _MS_BIND | _MS_RDONLY | _MS_NOSUID | _MS_NODEV)
        if _is_under(workdir, mask):
            os.makedirs(workdir, mode=0o755, exist_ok=True)
    limits = cfg["limits"]
    _mount(
        "tmpfs", workdir, "tmpfs", _MS_NOSUID | _MS_NODEV,
        f"size={int(limits['scratch_bytes'])},mode=0700,uid={uid},gid={gid}",
    )
    for mask in mounted:
        _mount(None, mask, None, _MS_REMOUNT | _MS_RDONLY | _MS_NOSUID | _MS_NODEV)
    for fd in handles.values():
        os.close(fd)
    enforced["hidden_paths"] = mounted
    enforced["scratch_tmpfs_bytes"] = int(limits["scratch_bytes"])
    try:
        _mount("proc", "/proc", "proc", _MS_NOSUID | _MS_NODEV | _MS_NOEXEC)
        enforced["private_proc"] = True
    except OSError:
        enforced["private_proc"] = False


def _rlimits(cfg: dict) -> dict[str, int]:
    limits = cfg["limits"]
    return {
        "cpu_seconds": max(1, int(limits["cpu_seconds"])),
        "memory_bytes": int(limits["memory_bytes"]),
        "max_processes": int(limits["max_processes"]),
        "max_file_bytes": int(limits["max_file_bytes"]),
        "max_open_files": int(limits["max_open_files"]),
        "core_bytes": 0,
    }


def _set_limits(cfg: dict) -> None:
    """setrlimit in the program's own process (inherited by everything it starts)."""
    import resource

    values = _rlimits(cfg)
    cpu, nproc = values["cpu_seconds"], values["max_processes"]
    if cfg["uid"] is None and os.geteuid() != 0:
        # RLIMIT_NPROC counts every task of the (shared) user: allow this many *more* than it has now.
        nproc += sum(1 for _ in _threads_of_current_user())
    settings = [
        (resource.RLIMIT_CPU, (cpu, cpu + 1)),  # SIGXCPU at the soft limit, SIGKILL at the hard one
        (resource.RLIMIT_AS, (values["memory_bytes"],) * 2),
        (resource.RLIMIT_NPROC, (nproc, nproc)),
        (resource.RLIMIT_FSIZE, (values["max_file_bytes"],) * 2),
        (resource.RLIMIT_NOFILE, (values["max_open_files"],) * 2),
        (resource.RLIMIT_CORE, (0, 0)),
    ]
    for which, (soft, hard) in settings:
        if os.geteuid() != 0:  # an unprivileged process cannot raise its hard limits
            _, current_hard = resource.getrlimit(which)
            if current_hard != resource.RLIM_INFINITY:
                hard = min(hard, current_hard)
                soft = min(soft, hard)
        resource.setrlimit(which, (soft, hard))


def _threads_of_current_user():
    uid = os.getuid()
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/status") as f:
                status = f.read()
        except OSError:
            continue
        fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
        try:
            if int(fields["Uid"].split()[0]) == uid:
                for _ in range(int(fields.get("Threads", "1"))):
                    yield entry
        except (KeyError, ValueError):
            continue


def _exec_program(cfg: dict, enforced: dict, report_fd: int) -> None:
    """Become the program: limits, cwd, unprivileged user, then execve. Never returns."""
    try:
        os.chdir(cfg["workdir"])
        _set_limits(cfg)
        if cfg["uid"] is not None:
            os.setgroups([])
            os.setgid(cfg["gid"])
            os.setuid(cfg["uid"])
        _prctl(_PR_SET_PDEATHSIG, _SIGKILL)  # after setuid, which clears it
        _prctl(_PR_SET_NO_NEW_PRIVS, 1)
        os.umask(0o077)
        argv = list(cfg["argv"])
        if cfg["net_guard_index"] is not None:
            argv[cfg["net_guard_index"]] = "0" if enforced.get("network_namespace") else "1"
        os.execve(argv[0], argv, cfg["env"])
    except BaseException as err:  # noqa: BLE001 - report anything, then die
        message = f"{type(err).__name__}: {err}"
        if isinstance(err, PermissionError) and cfg["uid"] is not None and not enforced.get("mount_namespace"):
            message += (
                " (the sandbox user cannot reach this interpreter and there is no mount namespace to expose it:"
                " pass an interpreter every user can read, e.g. Sandbox(python='/usr/bin/python3'))"
            )
        _report(report_fd, {"error": message})
    os._exit(127)


def _launcher_main(config_hex: str) -> None:
    cfg = marshal.loads(bytes.fromhex(config_hex))
    report_fd = cfg["report_fd"]
    _c()  # load ctypes now: after dropping privileges the interpreter's own tree may be unreadable
    os.set_inheritable(report_fd, False)
    os.umask(0o022)
    root = os.geteuid() == 0
    enforced: dict[str, Any] = {
        "network_namespace": False,
        "mount_namespace": False,
        "pid_namespace": False,
        "python_network_guard": False,
        "uid": cfg["uid"] if cfg["uid"] is not None else os.getuid(),
        "dedicated_uid": bool(cfg["dedicated_uid"]),
        "dropped_privileges": cfg["uid"] is not None,
        "no_new_privs": True,
        "env": sorted(cfg["env"]),
        "wall_seconds": cfg["limits"]["wall_seconds"],
        "max_output_bytes": cfg["limits"]["max_output_bytes"],
    }
    if cfg["namespaces"] and root:
        try:
            _unshare(_CLONE_NEWNS | _CLONE_NEWPID | _CLONE_NEWNET)
            enforced.update(network_namespace=True, mount_namespace=True, pid_namespace=True)
        except OSError:
            try:
                _unshare(_CLONE_NEWNET)
                enforced["network_namespace"] = True
            except OSError:
                pass
    enforced["python_network_guard"] = not enforced["network_namespace"] and cfg["net_guard_index"] is not None

    if enforced["pid_namespace"]:
        init_pid = os.fork()
        if init_pid:  # the launcher: wait for init, then leave with its status
            os.close(report_fd)
            for fd in (0, 1):
                os.close(fd)
            _, status = os.waitpid(init_pid, 0)
            os._exit(os.waitstatus_to_exitcode(status) & 0xFF if os.WIFEXITED(status) else 128 + os.WTERMSIG(status))
        _prctl(_PR_SET_PDEATHSIG, _SIGKILL)  # init dies with the launcher (and takes the namespace along)

    try:
        files = {}
        for name in cfg["files"]:
            with open(os.path.join(cfg["files_dir"], name), "rb") as f:
                files[name] = f.read()
        if enforced["mount_namespace"]:
            _setup_mounts(cfg, enforced)
        workdir = cfg["workdir"]
        for name, data in files.items():
            path = os.path.join(workdir, name)
            with open(path, "wb") as f:
                f.write(data)
            if cfg["uid"] is not None:
                os.chown(path, cfg["uid"], cfg["gid"])
        enforced["rlimits"] = _rlimits(cfg)
    except BaseException as err:  # noqa: BLE001
        _report(report_fd, {"error": f"sandbox setup failed: {type(err).__name__}: {err}"})
        os._exit(125)

    _report(report_fd, {"setup": enforced})
    if not enforced["pid_namespace"]:
        _exec_program(cfg, enforced, report_fd)

    program_pid = os.fork()
    if program_pid == 0:
        _exec_program(cfg, enforced, report_fd)
    # init (PID 1): keep no pipe of the program open, reap every orphan, exit when the program exits. Our exit
    # makes the kernel kill whatever is still running in the namespace.
    devnull = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(devnull, fd)
    while True:
        try:
            pid, status = os.wait()
        except ChildProcessError:
            os._exit(125)
        if pid == program_pid:
            break
    if os.WIFSIGNALED(status):
        _report(report_fd, {"exit": {"code": None, "signal": os.WTERMSIG(status)}})
        os._exit(128 + os.WTERMSIG(status))
    code = os.waitstatus_to_exitcode(status)
    _report(report_fd, {"exit": {"code": code, "signal": None}})
    os._exit(code & 0xFF)


if __name__ == "__main__":
    _launcher_main(sys.argv[1])  # never returns: it execs the program or exits


# ================================================================================================== parent
# The calling process's half. Its imports come here, after the launcher has already branched off.

import fcntl  # noqa: E402
import json  # noqa: E402
import select  # noqa: E402
import shutil  # noqa: E402
import signal  # noqa: E402
import subprocess  # noqa: E402
import tempfile  # noqa: E402
import threading  # noqa: E402
import time  # noqa: E402
from dataclasses import asdict, dataclass, field  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any, Optional, Sequence  # noqa: E402

__all__ = [
    "SandboxLimits",
    "SandboxResult",
    "Sandbox",
    "SandboxProcess",
    "SandboxError",
    "SandboxSetupError",
    "run_python",
    "UID_POOL_BASE",
    "UID_POOL_SIZE",
]

# Dedicated uids for sandboxed programs when the caller is root: UID_POOL_BASE .. UID_POOL_BASE+UID_POOL_SIZE-1
# (gid = uid). High enough to collide with no account on a normal system, below 2**31 to avoid signed-int bugs.
UID_POOL_BASE = 1_900_000_000
UID_POOL_SIZE = 64
NOBODY_UID = 65534

SAFE_PATH = "/usr/local/bin:/usr/bin:/bin"

# Directories that are masked (hidden behind an empty read-only tmpfs) in the mount namespace, on top of the
# repository root and the caller's working directory.
DEFAULT_HIDDEN_PATHS = ("/tmp", "/var/tmp", "/dev/shm", "/run", "/root", "/home")
# Never masked, and nothing that contains them is masked either: `_SYSTEM_DIRS` (launcher half).

_NET_GUARD_PLACEHOLDER = "@NEMO_GYM_NET_GUARD@"

# Installed before the program's script when the launcher could not create a network namespace. Python-level
# only: it replaces the socket constructors.
_PYTHON_BOOTSTRAP = """\
import sys
if sys.argv[1] == "1":
    import _socket, socket
    def _no_network(*args, **kwargs):
        raise PermissionError(1, "network access is disabled in this sandbox")
    class _BlockedSocket:
        def __new__(cls, *args, **kwargs):
            _no_network()
    for _module in (_socket, socket):
        for _name in ("socket", "SocketType", "socketpair", "fromfd", "create_connection", "create_server"):
            if hasattr(_module, _name):
                setattr(_module, _name, _BlockedSocket if _name in ("socket", "SocketType") else _no_network)
del sys.argv[1]
sys.argv = sys.argv[1:]
with open(sys.argv[0], "rb") as _file:
    _code = compile(_file.read(), sys.argv[0], "exec")
del _file
_main = {"__name__": "__main__", "__file__": sys.argv[0], "__builtins__": __builtins__}
exec(_code, _main)
"""


class SandboxError(RuntimeError):
    """The sandbox could not run the program (not the program's own failure)."""


class SandboxSetupError(SandboxError):
    """The launcher failed to set up the isolation or to start the program."""


@dataclass(frozen=True)
class SandboxLimits:
    """Resource limits of one sandboxed execution (per process where the kernel counts per process)."""

    cpu_seconds: int = 10  # RLIMIT_CPU of each process
    memory_bytes: int = 1 << 30  # RLIMIT_AS of each process (virtual memory)
    max_processes: int = 16  # RLIMIT_NPROC: processes + threads of the sandbox user
    max_file_bytes: int = 16 << 20  # RLIMIT_FSIZE: the largest file a process may write
    max_open_files: int = 64  # RLIMIT_NOFILE
    scratch_bytes: int = 64 << 20  # size of the scratch tmpfs (mount namespace only)
    wall_seconds: float = 30.0  # wall clock of the whole execution, enforced by the parent
    max_output_bytes: int = 1 << 20  # stdout/stderr kept by `run()`, longest line for `read_line()`


@dataclass
class SandboxResult:
    returncode: Optional[int]  # exit code, None when killed by a signal or by the wall-clock limit
    signal: Optional[int]  # the signal that ended the program, if any
    stdout: bytes
    stderr: bytes
    timed_out: bool  # the wall-clock limit was hit and the sandbox killed
    output_truncated: bool  # more than max_output_bytes was written (and the program killed)
    duration: float
    enforced: dict = field(default_factory=dict)


def _repo_root() -> str:
    return str(Path(__file__).resolve().parents[2])


def _interpreter_paths(python: str) -> list[str]:
    """The directories a Python interpreter needs to start (its prefixes and the directory of its binary)."""
    real = os.path.realpath(python)
    paths = {os.path.dirname(real), os.path.dirname(os.path.dirname(real))}
    if os.path.realpath(sys.executable) == real or os.path.abspath(python) == os.path.abspath(sys.executable):
        paths.update(os.path.realpath(p) for p in (sys.prefix, sys.exec_prefix, sys.base_prefix, sys.base_exec_prefix))
        paths.add(os.path.dirname(os.path.abspath(sys.executable)))
    return sorted(p for p in paths if p and p != "/" and os.path.isdir(p))


def _uid_is_mapped(uid: int) -> bool:
    """Can this process setuid() to `uid`? (Inside a user namespace only mapped uids exist.)"""
    try:
        with open("/proc/self/uid_map") as f:
            for line in f:
                inside, _outside, count = (int(x) for x in line.split())
                if inside <= uid < inside + count:
                    return True
        return False
    except OSError:
        return True


def _tasks_of_uid(uid: int) -> list[int]:
    """PIDs (host view) of the processes whose real uid is `uid`."""
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/status") as f:
                for line in f:
                    if line.startswith("Uid:"):
                        if int(line.split()[1]) == uid:
                            pids.append(int(entry))
                        break
        except (OSError, ValueError):
            continue
    return pids


class _Slot:
    """A dedicated uid, held through an flock'ed file: one per concurrently running sandbox, across processes.

    The lock file holds b"1" while the slot is in use and is emptied on a clean release; a holder that crashed
    leaves the "1", and the next holder first kills whatever still runs under that uid."""

    def __init__(self, uid: int, fd: Optional[int]):
        self.uid = uid
        self.gid = uid
        self._fd = fd

    @property
    def dedicated(self) -> bool:
        return self._fd is not None

    def release(self, clean: bool = True) -> None:
        if self._fd is not None:
            if clean:
                os.ftruncate(self._fd, 0)
            os.close(self._fd)  # drops the flock
            self._fd = None


def _acquire_slot(base_dir: Path, deadline: float) -> _Slot:
    if not _uid_is_mapped(UID_POOL_BASE + UID_POOL_SIZE - 1):
        return _Slot(NOBODY_UID, None)  # e.g. inside a user namespace with 65536 uids: share `nobody`
    lock_dir = base_dir / "slots"
    lock_dir.mkdir(mode=0o700, exist_ok=True)
    start = (os.getpid() * 7 + threading.get_ident()) % UID_POOL_SIZE  # spread the callers over the pool
    while True:
        for i in range(UID_POOL_SIZE):
            slot = (start + i) % UID_POOL_SIZE
            fd = os.open(lock_dir / f"{slot}.lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                continue
            uid = UID_POOL_BASE + slot
            if os.pread(fd, 1, 0) == b"1":  # the previous holder died without cleaning up
                _kill_all_of_uid(uid)
            os.pwrite(fd, b"1", 0)
            return _Slot(uid, fd)
        if time.monotonic() > deadline:
            raise SandboxError(f"all {UID_POOL_SIZE} sandbox slots are busy")
        time.sleep(0.01)


def _kill_all_of_uid(uid: int, timeout: float = 5.0) -> None:
    """SIGKILL every process of `uid` (root only): a helper becomes `uid` and calls kill(-1, SIGKILL) until
    nothing is left, which also catches processes that left the process group."""
    code = (
        "import os, signal, time\n"
        f"os.setgroups([]); os.setgid({uid}); os.setuid({uid})\n"
        "for _ in range(1000):\n"
        "    try:\n"
        "        os.kill(-1, signal.SIGKILL)\n"
        "    except ProcessLookupError:\n"
        "        break\n"
        "    time.sleep(0.002)\n"
    )
    deadline = time.monotonic() + timeout
    while _tasks_of_uid(uid) and time.monotonic() < deadline:
        subprocess.run([sys.executable, "-I", "-S", "-c", code], env={"PATH": SAFE_PATH}, timeout=timeout, check=False)
        time.sleep(0.01)


def _base_dir() -> Path:
    """Where scratch directories and slot locks live. For root it is always /tmp/nemo_gym_sandbox, whatever
    TMPDIR says: every process on the machine (servers, Ray workers) must see the same slot locks, or two
    sandboxes could share a uid."""
    if os.geteuid() == 0:
        base = Path("/tmp/nemo_gym_sandbox")
    else:
        base = Path(tempfile.gettempdir()) / f"nemo_gym_sandbox_{os.geteuid()}"
    base.mkdir(mode=0o711, exist_ok=True)
    st = base.lstat()
    if st.st_uid != os.geteuid() or not os.path.isdir(base) or os.path.islink(base):
        raise SandboxError(f"{base} is not a directory owned by this user")
    os.chmod(base, 0o711)
    return base


def _read_some(fd: int, limit: int = 1 << 16) -> Optional[bytes]:
    """Up to `limit` bytes from a non-blocking fd: b"" at end of file, None when nothing is available yet."""
    try:
        return os.read(fd, limit)
    except BlockingIOError:
        return None


def _wait_fds(readers: Sequence[int], writers: Sequence[int], timeout: float) -> tuple[set[int], set[int]]:
    """Like `select`, but for any fd number (a busy server has fds above FD_SETSIZE)."""
    poller = select.poll()
    for fd in readers:
        poller.register(fd, select.POLLIN)
    for fd in writers:
        poller.register(fd, select.POLLOUT)
    readable, writable = set(), set()
    for fd, events in poller.poll(max(0, int(timeout * 1000) + 1)):
        if fd in readers and events & (select.POLLIN | select.POLLHUP | select.POLLERR):
            readable.add(fd)
        if fd in writers and events & (select.POLLOUT | select.POLLHUP | select.POLLERR):
            writable.add(fd)
    return readable, writable


class SandboxProcess:
    """The running program: its stdin and stdout are pipes; stderr goes to a file (`stderr_tail()`)."""

    def __init__(self, popen: subprocess.Popen, sandbox: "Sandbox"):
        self.popen = popen
        self._sandbox = sandbox
        self._buffer = bytearray()
        self._eof = False
        os.set_blocking(popen.stdout.fileno(), False)
        os.set_blocking(popen.stdin.fileno(), False)

    @property
    def pid(self) -> int:
        return self.popen.pid

    def send(self, data: bytes, timeout: Optional[float] = None) -> None:
        """Write all of `data` to the program's stdin (BrokenPipeError if it is gone)."""
        deadline = self._sandbox._deadline(timeout)
        fd = self.popen.stdin.fileno()
        view = memoryview(data)
        while view:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError("the sandboxed program does not read its input")
            _, writable = _wait_fds([], [fd], remaining)
            if writable:
                try:
                    view = view[os.write(fd, view[: 1 << 16]) :]
                except BlockingIOError:
                    pass

    def send_json(self, obj: Any, timeout: Optional[float] = None) -> None:
        self.send(json.dumps(obj).encode() + b"\n", timeout)

    def read_line(self, timeout: Optional[float] = None, max_bytes: Optional[int] = None) -> Optional[bytes]:
        """The next line of stdout (without its newline), or None at the end of the output.

        TimeoutError when no full line arrives in time (the sandbox's wall-clock limit always applies);
        SandboxError for a line longer than `max_bytes` (default: `limits.max_output_bytes`)."""
        limit = max_bytes if max_bytes is not None else self._sandbox.limits.max_output_bytes
        deadline = self._sandbox._deadline(timeout)
        fd = self.popen.stdout.fileno()
        while True:
            newline = self._buffer.find(b"\n", 0, limit + 1)
            if newline >= 0:
                line = bytes(self._buffer[:newline])
                del self._buffer[: newline + 1]
                return line
            if len(self._buffer) > limit:
                raise SandboxError(f"the sandboxed program wrote a line longer than {limit} bytes")
            if self._eof:
                line, self._buffer = bytes(self._buffer), bytearray()
                return line or None
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError("no reply from the sandboxed program in time")
            readable, _ = _wait_fds([fd], [], remaining)
            if readable:
                chunk = _read_some(fd)
                if chunk == b"":
                    self._eof = True
                elif chunk:
                    self._buffer += chunk

    def read_json(self, timeout: Optional[float] = None, max_bytes: Optional[int] = None) -> Any:
        line = self.read_line(timeout, max_bytes)
        return None if line is None else json.loads(line)

    def close_stdin(self) -> None:
        try:
            self.popen.stdin.close()
        except OSError:
            pass

    def wait(self, timeout: Optional[float] = None) -> bool:
        """Wait (at most until the wall-clock limit) for the program to end; False if it had to be killed."""
        if self._sandbox._wait_unreaped(self._sandbox._deadline(timeout)):
            return True
        self.kill()
        return False

    def kill(self) -> None:
        self._sandbox.kill()

    def stderr_tail(self, max_bytes: int = 4096) -> bytes:
        return self._sandbox._stderr_tail(max_bytes)


class Sandbox:
    """One sandboxed execution (not reusable: create one per program run)."""

    def __init__(
        self,
        limits: Optional[SandboxLimits] = None,
        *,
        python: Optional[str] = None,
        site_packages: bool = False,
        namespaces: bool = True,
        drop_privileges: bool = True,
        hidden_paths: Optional[Sequence[str]] = None,
    ):
        """
        - `python`: the interpreter for `python_argv` (default: this one).
        - `site_packages`: let Python programs import installed packages (default: standard library only).
        - `namespaces`: use network/mount/PID namespaces when possible (root); False only to test the fallback.
        - `drop_privileges`: when root, run the program as a dedicated unprivileged uid (strongly recommended).
        - `hidden_paths`: directories to mask in the mount namespace (default: `DEFAULT_HIDDEN_PATHS`, the
          repository root and the current working directory).
        """
        self.limits = limits or SandboxLimits()
        python = python or sys.executable
        self.python = python if os.path.isabs(python) else (shutil.which(python) or python)
        self.site_packages = site_packages
        self.namespaces = namespaces
        self.drop_privileges = drop_privileges
        if hidden_paths is None:
            hidden_paths = [*DEFAULT_HIDDEN_PATHS, _repo_root()]
            try:
                hidden_paths.append(os.getcwd())
            except OSError:  # the working directory was deleted
                pass
        self.hidden_paths = list(hidden_paths)
        self.enforced: dict = {}
        self._popen: Optional[subprocess.Popen] = None
        self._process: Optional[SandboxProcess] = None
        self._slot: Optional[_Slot] = None
        self._job_dir: Optional[Path] = None
        self._report_fd: Optional[int] = None
        self._report_buffer = b""
        self._started_at = 0.0
        self._wall_deadline = float("inf")
        self._killed = False
        self._closed = False
        self._lock = threading.Lock()

    def __enter__(self) -> "Sandbox":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # -- commands -------------------------------------------------------------------------------------------

    def python_argv(self, script: str, *args: str) -> list[str]:
        """argv that runs `script` (a file in the scratch directory) with this sandbox's interpreter, isolated."""
        flags = ["-I", "-B"] if self.site_packages else ["-I", "-S", "-B"]
        return [self.python, *flags, "-c", _PYTHON_BOOTSTRAP, _NET_GUARD_PLACEHOLDER, script, *args]

    @property
    def workdir(self) -> Optional[str]:
        """The program's cwd and $HOME (the same path inside and outside the sandbox)."""
        return str(self._job_dir / "work") if self._job_dir else None

    @property
    def killed(self) -> bool:
        """True when the sandbox had to kill the program (wall-clock limit, too much output, `kill()`)."""
        return self._killed

    @property
    def deadline(self) -> float:
        """The wall-clock deadline of this execution (`time.monotonic()` scale)."""
        return self._wall_deadline

    def _deadline(self, timeout: Optional[float]) -> float:
        if timeout is None:
            return self._wall_deadline
        return min(self._wall_deadline, time.monotonic() + timeout)

    # -- start ----------------------------------------------------------------------------------------------

    def start(self, argv: Sequence[str], *, files: Optional[dict[str, Any]] = None) -> SandboxProcess:
        """Start `argv` in the sandbox after writing `files` (name -> str or bytes) into the scratch directory.

        Returns once the isolation is in place; raises SandboxSetupError when it cannot be."""
        if self._popen is not None or self._closed:
            raise SandboxError("a Sandbox runs one program; create a new one")
        self._started_at = time.monotonic()
        self._wall_deadline = self._started_at + self.limits.wall_seconds
        root = os.geteuid() == 0
        try:
            base = _base_dir()
            if root and self.drop_privileges:
                self._slot = _acquire_slot(base, self._wall_deadline)
            self._job_dir = Path(tempfile.mkdtemp(prefix="run-", dir=base))
            os.chmod(self._job_dir, 0o711)  # the sandbox user may pass through to its workdir, nothing else
            files_dir = self._job_dir / "files"
            files_dir.mkdir(mode=0o700)
            names = []
            for name, content in (files or {}).items():
                if not name or "/" in name or name in (".", ".."):
                    raise ValueError(f"invalid sandbox file name {name!r}")
                (files_dir / name).write_bytes(content.encode() if isinstance(content, str) else bytes(content))
                names.append(name)
            work = self._job_dir / "work"
            work.mkdir(mode=0o700)
            if self._slot is not None:
                os.chown(work, self._slot.uid, self._slot.gid)
            stderr_fd = os.open(self._job_dir / "stderr", os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)

            argv = list(argv)
            config = {
                "argv": argv,
                "net_guard_index": argv.index(_NET_GUARD_PLACEHOLDER) if _NET_GUARD_PLACEHOLDER in argv else None,
                "env": {"PATH": SAFE_PATH, "LANG": "C.UTF-8", "HOME": str(work)},
                "workdir": str(work),
                "files_dir": str(files_dir),
                "files": names,
                "uid": self._slot.uid if self._slot else None,
                "gid": self._slot.gid if self._slot else None,
                "dedicated_uid": bool(self._slot and self._slot.dedicated),
                "namespaces": self.namespaces,
                "hidden": self.hidden_paths,
                "expose": _interpreter_paths(argv[0]) if argv else [],
                "limits": asdict(self.limits),
            }
            read_fd, write_fd = os.pipe2(os.O_CLOEXEC)
            self._report_fd = read_fd
            config["report_fd"] = write_fd
            try:
                self._popen = subprocess.Popen(
                    [sys.executable, "-I", "-S", os.path.abspath(__file__), marshal.dumps(config).hex()],
                    stdin=subprocess.PIPE,
                    stdout=subprocess.PIPE,
                    stderr=stderr_fd,
                    pass_fds=(write_fd,),
                    start_new_session=True,  # its own process group: the wall-clock kill takes the group
                    cwd=str(self._job_dir),
                    env={"PATH": SAFE_PATH, "LANG": "C.UTF-8"},
                )
            finally:
                os.close(write_fd)
                os.close(stderr_fd)
            self._process = SandboxProcess(self._popen, self)
            record = self._read_report_record(min(self._wall_deadline, time.monotonic() + 30))
            if record is None or "setup" not in record:
                detail = (record or {}).get("error") or self._stderr_tail(2000).decode(errors="replace")
                raise SandboxSetupError(f"the sandbox could not be set up: {detail or 'the launcher died'}")
            self.enforced = record["setup"]
            return self._process
        except BaseException:
            self.close()
            raise

    def _read_report_record(self, deadline: float) -> Optional[dict]:
        """The next record of the launcher's report pipe (see `_report`); None at its end or at the deadline."""
        while len(self._report_buffer) < 4 or len(self._report_buffer) < 4 + int.from_bytes(
            self._report_buffer[:4], "little"
        ):
            remaining = deadline - time.monotonic()
            if remaining <= 0 or self._report_fd is None:
                return None
            readable, _ = _wait_fds([self._report_fd], [], remaining)
            if readable:
                chunk = os.read(self._report_fd, 1 << 16)
                if not chunk:
                    return None
                self._report_buffer += chunk
        size = int.from_bytes(self._report_buffer[:4], "little")
        data, self._report_buffer = self._report_buffer[4 : 4 + size], self._report_buffer[4 + size :]
        try:
            record = marshal.loads(data)
        except (ValueError, EOFError, TypeError):
            return {"error": "unreadable report from the sandbox launcher"}
        return record if isinstance(record, dict) else {"error": "unreadable report from the sandbox launcher"}

    def _stderr_tail(self, max_bytes: int) -> bytes:
        if self._job_dir is None:
            return b""
        try:
            with open(self._job_dir / "stderr", "rb") as f:
                size = f.seek(0, os.SEEK_END)
                f.seek(max(0, size - max_bytes))
                return f.read()
        except OSError:
            return b""

    # -- one-shot run ---------------------------------------------------------------------------------------

    def run(self, argv: Sequence[str], *, files: Optional[dict[str, Any]] = None, stdin: bytes = b"") -> SandboxResult:
        """Run `argv` to completion with `stdin`; collect stdout and stderr (each capped)."""
        process = self.start(argv, files=files)
        cap = self.limits.max_output_bytes
        out = bytearray()
        truncated = timed_out = False
        stdin_fd, out_fd = process.popen.stdin.fileno(), process.popen.stdout.fileno()
        pending = memoryview(stdin)
        if not pending:
            process.close_stdin()
        while True:
            remaining = self._wall_deadline - time.monotonic()
            if remaining <= 0:
                timed_out = True
                break
            writers = [stdin_fd] if pending else []
            readable, writable = _wait_fds([out_fd], writers, remaining)
            if writable:
                try:
                    pending = pending[os.write(stdin_fd, pending[: 1 << 16]) :]
                except BlockingIOError:
                    pass
                except BrokenPipeError:
                    pending = memoryview(b"")
                if not pending:
                    process.close_stdin()
            if readable:
                chunk = _read_some(out_fd)
                if chunk == b"":
                    break
                if chunk:
                    out += chunk
                    if len(out) > cap:
                        del out[cap:]
                        truncated = True
                        break
        if not timed_out and not truncated:
            timed_out = not self._wait_unreaped(self._wall_deadline)
        if timed_out or truncated:
            self.kill()
        else:
            self._killpg()  # stragglers left in the group (without a PID namespace)
        self._popen.wait()
        returncode, sig = self.exit_status()
        stderr = self._stderr_tail(cap + 1)
        if len(stderr) > cap:
            stderr, truncated = stderr[-cap:], True
        return SandboxResult(
            returncode=None if (timed_out or truncated) else returncode,
            signal=sig,
            stdout=bytes(out),
            stderr=stderr,
            timed_out=timed_out,
            output_truncated=truncated,
            duration=time.monotonic() - self._started_at,
            enforced=dict(self.enforced),
        )

    def _wait_unreaped(self, deadline: float) -> bool:
        """Wait for the launcher to exit *without reaping it* (its pid, which is also the process group id, cannot
        be reused until it is reaped, so killing the group afterwards is safe). True if it exited in time."""
        pid = self._popen.pid
        delay = 0.0005
        while True:
            if self._popen.returncode is not None:
                return True
            try:
                info = os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
            except ChildProcessError:
                return True
            if info is not None:
                return True
            if time.monotonic() >= deadline:
                return False
            time.sleep(min(delay, max(0.0, deadline - time.monotonic())))
            delay = min(delay * 2, 0.02)

    def exit_status(self) -> tuple[Optional[int], Optional[int]]:
        """After the program ended: its (exit code, terminating signal), reported by the init process when there
        is a PID namespace, else the launcher's own status (the launcher became the program). Raises
        SandboxSetupError when the program could not be started at all."""
        while True:
            record = self._read_report_record(time.monotonic() + 1.0)
            if record is None:
                break
            if "exit" in record:
                return record["exit"].get("code"), record["exit"].get("signal")
            if "error" in record:
                raise SandboxSetupError(f"the sandboxed program could not start: {record['error']}")
        code = self._popen.returncode if self._popen is not None else None
        if code is None or self.enforced.get("pid_namespace"):
            return None, (-code if code is not None and code < 0 else None)
        return (None, -code) if code < 0 else (code, None)

    # -- teardown -------------------------------------------------------------------------------------------

    def kill(self) -> None:
        """SIGKILL the launcher's process group: with a PID namespace that kills every process of the program,
        without one the processes that stayed in the group."""
        if self._popen is not None and self._popen.returncode is None:
            self._killed = True
        self._killpg()

    def _killpg(self) -> None:
        with self._lock:
            if self._popen is None or self._popen.returncode is not None:
                return  # reaped: its pid (= the group id) may belong to someone else by now
            try:
                os.killpg(self._popen.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass

    def close(self) -> None:
        """Kill what is left, sweep the sandbox uid, remove the scratch directory, release the uid slot."""
        if self._closed:
            return
        self._closed = True
        try:
            if self._popen is not None:
                if self._popen.returncode is None and not self._wait_unreaped(time.monotonic()):
                    self._killed = True  # still running when closed
                self._killpg()
                self._popen.wait()
                for stream in (self._popen.stdin, self._popen.stdout):
                    try:
                        stream.close()
                    except (OSError, AttributeError):
                        pass
            clean_exit = self.enforced.get("pid_namespace") and self._popen is not None and not self._killed
            if self._slot is not None and self._slot.dedicated and not clean_exit:
                # Without a PID namespace stragglers may have left the group; after a kill the namespace may
                # still be tearing down. A clean exit of init means the kernel already killed everything.
                _kill_all_of_uid(self._slot.uid)
        finally:
            if self._report_fd is not None:
                os.close(self._report_fd)
                self._report_fd = None
            if self._job_dir is not None:
                shutil.rmtree(self._job_dir, ignore_errors=True)
            if self._slot is not None:
                self._slot.release()


def run_python(
    code: str,
    *,
    stdin: bytes = b"",
    limits: Optional[SandboxLimits] = None,
    files: Optional[dict[str, Any]] = None,
    **sandbox_options: Any,
) -> SandboxResult:
    """Run a Python program (source text) in a fresh sandbox; `sandbox_options` go to `Sandbox`."""
    with Sandbox(limits, **sandbox_options) as sandbox:
        return sandbox.run(sandbox.python_argv("main.py"), files={**(files or {}), "main.py": code}, stdin=stdin)


