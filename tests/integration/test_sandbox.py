"""nemo_gym.isolation.sandbox: what a sandboxed program can and cannot do.

The full sandbox needs root (namespaces, a dedicated uid); those tests are skipped otherwise. Every test runs on
each backend available (bwrap, namespaces: see `sandbox_backends`); the escape table is test_sandbox_escapes.py.
Resource-exhaustion tests use low caps (8 processes, 256 MiB) so that even a failure of the sandbox could not hurt
the machine much.
"""

import os
import signal
import socket
import sys
import threading
import time
from pathlib import Path

import pytest

from nemo_gym.isolation.sandbox import (
    BACKEND_ENV,
    UID_POOL_BASE,
    UID_POOL_SIZE,
    Sandbox,
    SandboxError,
    SandboxLimits,
    SandboxSetupError,
    run_python,
)
from nemo_gym.testing.sandbox import requires_root, sandbox_backends, sandbox_uid_processes, uid_of

SMALL = SandboxLimits(cpu_seconds=5, memory_bytes=256 << 20, max_processes=8, wall_seconds=20)
REPO_ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True, params=sandbox_backends())
def backend(request, monkeypatch):
    """Every test runs on each isolation backend available here (bwrap, namespaces)."""
    monkeypatch.setenv(BACKEND_ENV, request.param)
    return request.param


def run(code: str, limits: SandboxLimits = SMALL, **kwargs):
    return run_python(code, limits=limits, **kwargs)


# --------------------------------------------------------------------------------------------------- basics


def test_runs_a_program_with_stdin_files_and_exit_code():
    result = run(
        "import sys\nprint(sys.stdin.read().upper(), open('data.txt').read())\nsys.exit(3)",
        stdin=b"hello",
        files={"data.txt": "from a file"},
    )
    assert result.stdout == b"HELLO from a file\n"
    assert result.returncode == 3 and result.signal is None
    assert not result.timed_out and not result.output_truncated
    assert result.duration > 0


def test_environment_is_scrubbed_and_python_is_isolated():
    probe = (
        "import os, sys\n"
        "print(sorted(os.environ), os.environ['HOME'] == os.getcwd(), sys.flags.isolated, sys.flags.no_site,\n"
        "      os.environ['PATH'], os.listdir('.'))"
    )
    os.environ["NEMO_GYM_TEST_SECRET"] = "s3cret"
    try:
        result = run(probe)
    finally:
        del os.environ["NEMO_GYM_TEST_SECRET"]
    assert result.stdout.decode() == (
        "['HOME', 'LANG', 'PATH'] True 1 1 /usr/local/bin:/usr/bin:/bin ['main.py']\n"
    )


def test_the_scratch_directory_is_fresh_and_removed_afterwards():
    with Sandbox(SMALL) as sandbox:
        program = "open('left', 'w').write('x')\nimport os\nprint(os.getcwd())"
        result = sandbox.run(sandbox.python_argv("main.py"), files={"main.py": program})
        workdir = sandbox.workdir
        assert result.stdout.decode().strip() == workdir
    assert not os.path.exists(workdir)
    assert not os.path.exists(os.path.dirname(workdir))


def test_a_killing_signal_is_reported():
    result = run("import os, signal\nos.kill(os.getpid(), signal.SIGSEGV)")
    assert result.returncode is None and result.signal == signal.SIGSEGV


def test_invalid_file_names_are_refused():
    with pytest.raises(ValueError):
        run("print(1)", files={"../escape": "x"})


# ---------------------------------------------------------------------------------------------------- limits


def test_wall_clock_limit_kills_a_sleeping_program():
    started = time.monotonic()
    result = run("import time\nprint('started', flush=True)\ntime.sleep(3600)", SandboxLimits(wall_seconds=1.5))
    assert result.timed_out and result.returncode is None
    assert result.stdout == b"started\n"
    assert time.monotonic() - started < 10


def test_cpu_limit_stops_a_busy_loop():
    result = run("while True:\n    pass", SandboxLimits(cpu_seconds=1, wall_seconds=30))
    assert not result.timed_out
    assert result.signal in (signal.SIGXCPU, signal.SIGKILL)


def test_memory_limit():
    result = run("chunks = []\nwhile True:\n    chunks.append(bytearray(32 << 20))")
    assert result.returncode == 1 and b"MemoryError" in result.stderr


def test_file_size_limit():
    result = run("open('big', 'wb').write(b'x' * (4 << 20))", SandboxLimits(max_file_bytes=1 << 20))
    assert result.returncode == 1 and b"File too large" in result.stderr


def test_open_files_limit():
    result = run("files = [open('f%d' % i, 'w') for i in range(100)]", SandboxLimits(max_open_files=32))
    assert result.returncode == 1 and b"Too many open files" in result.stderr


def test_output_is_capped():
    result = run("while True:\n    print('y' * 1000)", SandboxLimits(max_output_bytes=10_000, wall_seconds=20))
    assert result.output_truncated and len(result.stdout) == 10_000 and result.returncode is None


def test_stderr_is_captured():
    result = run("import sys\nsys.stderr.write('oops')\nprint('out')")
    assert result.stdout == b"out\n" and result.stderr == b"oops"


# ------------------------------------------------------------------------------------------ isolation (root)


@requires_root
def test_runs_as_a_dedicated_unprivileged_uid_with_no_new_privileges():
    result = run("import os\nprint(os.getuid(), os.getgid(), os.getgroups())\nprint(open('/proc/self/status').read())")
    first, status = result.stdout.decode().split("\n", 1)
    uid, gid, groups = first.split(" ", 2)
    assert UID_POOL_BASE <= int(uid) < UID_POOL_BASE + UID_POOL_SIZE and gid == uid and groups == "[]"
    assert "NoNewPrivs:\t1" in status
    assert result.enforced["dedicated_uid"] and result.enforced["dropped_privileges"]
    assert result.enforced["network_namespace"] and result.enforced["mount_namespace"]
    assert result.enforced["pid_namespace"] and result.enforced["private_proc"]


@requires_root
def test_concurrent_sandboxes_get_different_uids():
    barrier = threading.Barrier(3)
    uids = []

    def one():
        with Sandbox(SMALL) as sandbox:
            program = "import os\nprint(os.getuid(), flush=True)\ninput()"
            process = sandbox.start(sandbox.python_argv("main.py"), files={"main.py": program})
            uids.append(int(process.read_line(timeout=20)))
            barrier.wait(timeout=20)
            process.send(b"\n")
            process.wait(timeout=20)

    threads = [threading.Thread(target=one) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert len(set(uids)) == 3


@requires_root
def test_no_network_at_all():
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    unix_path = f"/tmp/nemo_gym_sandbox_test_{os.getpid()}.sock"  # /tmp is masked in the sandbox
    unix_listener = socket.socket(socket.AF_UNIX)
    unix_listener.bind(unix_path)
    unix_listener.listen()
    code = f"""
import socket
for family, address in ((socket.AF_INET, ("127.0.0.1", {listener.getsockname()[1]})), (socket.AF_INET, ("8.8.8.8", 53)),
                        (socket.AF_UNIX, {unix_path!r})):
    s = socket.socket(family)
    s.settimeout(2)
    try:
        s.connect(address)
        print("CONNECTED", address)
    except OSError as err:
        print(err.errno)
"""
    try:
        result = run(code)
    finally:
        listener.close()
        unix_listener.close()
        os.unlink(unix_path)
    loopback, external, unix = result.stdout.decode().split()
    # The namespace backend leaves loopback down (ENETUNREACH), bwrap brings up a private one (ECONNREFUSED);
    # the unix socket's path does not exist in the view (ENOENT).
    assert (loopback, external, unix) in (("101", "101", "2"), ("111", "101", "2"))
    assert not result.enforced["python_network_guard"]


@requires_root
def test_cannot_write_outside_its_directory():
    targets = ["/tmp/x", "/var/tmp/x", "/dev/shm/x", "/root/x", "/etc/x", "/x", str(REPO_ROOT / "x"), "../x",
               os.path.join(sys.base_prefix, "x")]
    code = "import os\n" + "\n".join(
        f"try:\n    open({t!r}, 'w').write('x')\n    print('WROTE {t}')\nexcept OSError as err:\n    print(err.errno)"
        for t in targets
    )
    result = run(code)
    lines = result.stdout.decode().split()
    assert not any(line == "WROTE" for line in lines), lines
    assert all(code in ("13", "30", "2") for code in lines), lines  # EACCES, EROFS, ENOENT
    for target in targets[:-2]:
        assert not os.path.exists(target)


@requires_root
def test_the_view_holds_only_the_interpreter_devices_proc_and_scratch(backend):
    code = (
        "import os, json\n"
        f"repo_visible = os.path.exists({str(REPO_ROOT / 'nemo_gym')!r})\n"
        "pids = len([p for p in os.listdir('/proc') if p.isdigit()])\n"
        "import decimal, sqlite3, ssl, zlib\n"  # extension modules and the system libraries they link
        "print(json.dumps([repo_visible, sorted(os.listdir('/')), os.path.exists('/etc/passwd'), pids]))"
    )
    result = run(code)
    exists, top, passwd, pids = __import__("json").loads(result.stdout)
    assert exists is False and passwd is False
    allowed = {"dev", "proc", "usr", "lib", "lib64", "lib32", "bin", "root", "home", "opt", "tmp", "var", "nix"}
    assert set(top) <= allowed, top  # only what leads to the interpreter, its libraries and the scratch dir
    assert "etc" not in top and "sys" not in top
    assert pids <= 3  # init, the program (and nothing of the host)
    assert result.enforced["backend"] == backend
    assert result.enforced["view"][-1].endswith(("/work", "launcher.py"))


@requires_root
def test_scratch_space_is_bounded():
    result = run(
        "chunk = b'x' * (1 << 20)\nfor i in range(64):\n    open('f%d' % i, 'wb').write(chunk)",
        SandboxLimits(scratch_bytes=8 << 20, max_file_bytes=4 << 20),
    )
    assert result.returncode == 1 and b"No space left on device" in result.stderr


@requires_root
def test_fork_bomb_is_contained_and_fully_killed():
    bomb = "import os, time\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        time.sleep(0.01)"
    started = time.monotonic()
    with Sandbox(SandboxLimits(cpu_seconds=5, max_processes=8, wall_seconds=3)) as sandbox:
        process = sandbox.start(sandbox.python_argv("main.py"), files={"main.py": bomb})
        uid = sandbox.enforced["uid"]
        time.sleep(1.0)
        live = [pid for pid in sandbox_uid_processes() if uid_of(pid) == uid]
        assert 1 <= len(live) <= 8  # RLIMIT_NPROC holds it at the cap
        assert not process.wait()  # never ends by itself: killed at the wall-clock limit
    assert time.monotonic() - started < 15
    assert [pid for pid in sandbox_uid_processes() if uid_of(pid) == uid] == []


@requires_root
def test_children_that_leave_the_process_group_are_killed_too():
    code = "import os, time\nif os.fork() == 0:\n    os.setsid()\n    time.sleep(3600)\nprint('parent exits')"
    with Sandbox(SMALL) as sandbox:
        result = sandbox.run(sandbox.python_argv("main.py"), files={"main.py": code})
        uid = sandbox.enforced["uid"]
    assert result.returncode == 0 and result.stdout == b"parent exits\n"
    assert [pid for pid in sandbox_uid_processes() if uid_of(pid) == uid] == []


# -------------------------------------------------------------------------------------------- conversation


def test_interactive_protocol():
    echo = "import sys\nfor line in sys.stdin:\n    print(line.strip()[::-1], flush=True)"
    with Sandbox(SMALL) as sandbox:
        process = sandbox.start(sandbox.python_argv("main.py"), files={"main.py": echo})
        process.send(b"abc\n")
        assert process.read_line(timeout=20) == b"cba"
        process.send_json({"k": 1})
        assert process.read_line(timeout=20) == b"}1 :\"k\"{"
        with pytest.raises(TimeoutError):
            process.read_line(timeout=0.3)
        process.close_stdin()
        assert process.read_line(timeout=20) is None
        assert process.wait(timeout=20)
        assert sandbox.exit_status() == (0, None)


def test_long_lines_are_refused():
    with Sandbox(SandboxLimits(max_output_bytes=1000, wall_seconds=20)) as sandbox:
        process = sandbox.start(sandbox.python_argv("main.py"), files={"main.py": "print('z' * 5000)"})
        with pytest.raises(SandboxError):
            process.read_line(timeout=20)


def test_a_sandbox_runs_one_program():
    with Sandbox(SMALL) as sandbox:
        sandbox.run(sandbox.python_argv("main.py"), files={"main.py": "pass"})
        with pytest.raises(SandboxError):
            sandbox.run(sandbox.python_argv("main.py"), files={"main.py": "pass"})


# ---------------------------------------------------------------------------------------------- fallbacks


def test_without_namespaces_the_python_network_guard_blocks_sockets():
    code = "import socket\ntry:\n    socket.socket()\nexcept PermissionError as err:\n    print('blocked', err)"
    result = run(code, namespaces=False, drop_privileges=False)
    assert result.stdout.startswith(b"blocked")
    assert result.enforced["python_network_guard"] and not result.enforced["network_namespace"]
    assert not result.enforced["mount_namespace"] and not result.enforced["pid_namespace"]


@requires_root
def test_without_a_mount_namespace_an_unreachable_interpreter_is_a_clear_setup_error():
    blocked = any(
        not os.stat(prefix).st_mode & 0o001
        for prefix in (str(p) for p in Path(os.path.realpath(sys.executable)).parents if str(p) != "/")
    )
    if not blocked:
        pytest.skip("this interpreter is readable by every user")
    with pytest.raises(SandboxSetupError, match="cannot reach this interpreter"):
        run("print(1)", namespaces=False)


# ------------------------------------------------------------------------------------------- no orphans

_STARTS_A_SANDBOX_THEN_WAITS = """
import sys, threading, time
from nemo_gym.isolation.sandbox import Sandbox, SandboxLimits

def start():  # from a thread that ends at once: the sandbox must not depend on the thread that started it
    box = Sandbox(SandboxLimits(wall_seconds=300, cpu_seconds=300, max_processes=8))
    box.__enter__()
    proc = box.start([sys.executable, "-c", "import time; time.sleep(300)"])
    print(proc.pid, flush=True)

thread = threading.Thread(target=start)
thread.start()
thread.join()
time.sleep(300)
"""


@requires_root
def test_a_sandbox_dies_with_the_process_that_started_it_however_it_dies(backend):
    """The server holding a sandbox is SIGKILLed (its ng_run died, or a crash): the launcher, the sandbox's init and
    the program are gone within a bounded wait, not left running until the program ends."""
    import subprocess

    starter = subprocess.Popen([sys.executable, "-c", _STARTS_A_SANDBOX_THEN_WAITS], stdout=subprocess.PIPE,
                               cwd=REPO_ROOT, text=True)
    try:
        launcher = int(starter.stdout.readline())
        time.sleep(1.0)  # the thread that started it has ended: the sandbox is still running
        assert os.path.exists(f"/proc/{launcher}") and sandbox_uid_processes()
        starter.kill()
        starter.wait(timeout=10)
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline and (os.path.exists(f"/proc/{launcher}") or sandbox_uid_processes()):
            time.sleep(0.1)
        assert not os.path.exists(f"/proc/{launcher}"), "the sandbox's launcher outlived the process that started it"
        assert sandbox_uid_processes() == [], "the sandboxed program outlived the process that started it"
    finally:
        starter.kill()
