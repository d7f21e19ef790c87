"""No orphans (docs/design.md, decision 15): servers, and whatever they started, die with their `ng_run` however
it dies (SIGKILL included), in shared and isolated venv mode and after a restart by the supervision thread; a
new `ng_run` that finds its ports held by a stack left behind names it, and stops it when asked to.

Real processes throughout; the only fake is the LLM backend.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import psutil
import pytest
import yaml

from nemo_gym.runtime.supervisor_watch import SUPERVISOR_PID_ENV_VAR_NAME, watch_supervisor
from nemo_gym.testing.stack import NG_RUN, NgRunStack, free_port, server_instances, wait_http_ok
from tests.conftest import FIXTURE_STACK

GONE_TIMEOUT_S = 30.0

SPAWNER_APP = textwrap.dedent(
    """
    # A resources server that starts a child of its own (a long sleep) before serving; its pid goes to a file.
    import os
    import subprocess
    import sys
    from pathlib import Path

    from nemo_gym.testing.counter_server import CounterResourcesServer

    if __name__ == "__main__":
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
        Path(os.environ["NO_ORPHANS_DIR"], os.environ["NEMO_GYM_CONFIG_PATH"] + ".child").write_text(str(child.pid))
        CounterResourcesServer.run_webserver()
    """
)

SPAWNER_CONFIG = textwrap.dedent(
    """
    spawner_server:
      resources_servers:
        spawner:
          entrypoint: app.py
          domain: agent
          num_workers: 2
    """
)


def alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def port_is_free(port: int) -> bool:
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
            return True
        except OSError:
            return False


def wait_until(condition, timeout: float = GONE_TIMEOUT_S) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.1)
    return condition()


def descendants(pid: int) -> list[int]:
    return [p.pid for p in psutil.Process(pid).children(recursive=True)]


def sigkill_and_check(stack: NgRunStack, pids: list[int], ports: list[int]) -> None:
    """SIGKILL `ng_run`; within GONE_TIMEOUT_S every pid must be gone and every port free."""
    assert pids and all(alive(p) for p in pids), (pids, stack.output)
    os.kill(stack.proc.pid, signal.SIGKILL)
    stack.wait(timeout=30)
    gone = wait_until(lambda: not any(alive(p) for p in pids) and all(port_is_free(p) for p in ports))
    survivors = [(p, psutil.Process(p).cmdline()) for p in pids if alive(p)]
    for pid, _ in survivors:  # clean up before failing
        os.kill(pid, signal.SIGKILL)
    assert gone, f"alive after ng_run was SIGKILLed: {survivors}; busy ports: {[p for p in ports if not port_is_free(p)]}"


@pytest.fixture
def spawner_dir(tmp_path: Path) -> Path:
    server = tmp_path / "resources_servers" / "spawner"
    server.mkdir(parents=True)
    (server / "app.py").write_text(SPAWNER_APP)
    (server / "requirements.txt").write_text("")
    (tmp_path / "configs").mkdir()
    (tmp_path / "configs" / "spawner.yaml").write_text(SPAWNER_CONFIG)
    (tmp_path / "pids").mkdir()
    return tmp_path


def start_spawner_stack(spawner_dir: Path, head_port: int, *extra: str) -> NgRunStack:
    return NgRunStack(
        ["+config_paths=[configs/spawner.yaml]", f"+head_server.port={head_port}", *extra],
        cwd=spawner_dir,
        env={"NO_ORPHANS_DIR": str(spawner_dir / "pids")},
    )


def child_pid(spawner_dir: Path, server_id: str = "spawner_server") -> int:
    path = spawner_dir / "pids" / f"{server_id}.child"
    assert wait_until(path.exists, 30), f"{path} was not written"
    return int(path.read_text())


# ------------------------------------------------------------------------------------------ SIGKILL ng_run


def test_sigkill_of_ng_run_takes_every_server_along_even_one_restarted_by_the_supervision_thread(fake_backend):
    head_port = free_port()
    stack = NgRunStack(
        [
            "+config_paths=[configs/stack.yaml]",
            f"+policy_base_url={fake_backend}",
            "+policy_api_key=dummy-key",
            "+policy_model_name=fake-model",
            f"+head_server.port={head_port}",
        ],
        cwd=FIXTURE_STACK,
    )
    try:
        stack.wait_for("All 3 / 3 servers ready!")
        servers = {i["process_name"]: i for i in server_instances(head_port)}
        # A restart forks from the supervision thread: the restarted server must live on (a parent-death
        # signal tied to a short-lived thread would kill it) and still die with ng_run.
        os.kill(servers["counter_resources_server"]["pid"], signal.SIGKILL)
        stack.wait_for("Server 'counter_resources_server' restarted and healthy again", timeout=60)
        servers = {i["process_name"]: i for i in server_instances(head_port)}
        time.sleep(1.5)  # longer than the spawner thread's lifetime would be if it were per call
        assert alive(servers["counter_resources_server"]["pid"]), stack.output
        pids = descendants(stack.proc.pid)
        ports = [i["port"] for i in servers.values()] + [head_port]
    except BaseException:
        stack.stop()
        raise
    sigkill_and_check(stack, pids, ports)


def test_sigkill_of_ng_run_takes_along_what_a_server_started(spawner_dir):
    head_port = free_port()
    stack = start_spawner_stack(spawner_dir, head_port)
    try:
        stack.wait_for("All 1 / 1 servers ready!")
        server = server_instances(head_port)[0]
        child = child_pid(spawner_dir)
        pids = descendants(stack.proc.pid)
        # the server, its sleeping child and its two uvicorn workers (grandchildren of ng_run) at least
        assert server["pid"] in pids and child in pids and len(pids) >= 4, pids
        assert psutil.Process(child).ppid() == server["pid"]
    except BaseException:
        stack.stop()
        raise
    sigkill_and_check(stack, pids, [server["port"], head_port])


def test_sigkill_of_ng_run_takes_along_a_server_in_an_isolated_venv(spawner_dir):
    head_port = free_port()
    stack = start_spawner_stack(
        spawner_dir, head_port, "+venv_mode=isolated", f"+uv_venv_dir={spawner_dir / 'venvs'}"
    )
    try:
        stack.wait_for("All 1 / 1 servers ready!", timeout=600)
        server = server_instances(head_port)[0]
        # what ng_run execs in isolated mode: the venv's python itself (no `uv run` or shell wrapper), so the
        # server is ng_run's direct child
        assert psutil.Process(server["pid"]).cmdline()[0].startswith(str(spawner_dir / "venvs"))
        assert psutil.Process(server["pid"]).ppid() == stack.proc.pid
        pids = descendants(stack.proc.pid)
        assert child_pid(spawner_dir) in pids
    except BaseException:
        stack.stop()
        raise
    sigkill_and_check(stack, pids, [server["port"], head_port])


# --------------------------------------------------------------------------------------- the watcher itself


def test_watch_supervisor_is_a_no_op_without_the_env_var(monkeypatch):
    monkeypatch.delenv(SUPERVISOR_PID_ENV_VAR_NAME, raising=False)
    assert watch_supervisor() is False
    monkeypatch.setenv(SUPERVISOR_PID_ENV_VAR_NAME, "not-a-pid")
    assert watch_supervisor() is False


def test_a_watched_process_kills_its_group_when_its_supervisor_dies():
    """The supervisor here is not the parent (pdeathsig cannot help): the watcher alone must act."""
    supervisor = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    code = (
        "import subprocess, sys, time\n"
        "from nemo_gym.runtime.supervisor_watch import watch_supervisor\n"
        "assert watch_supervisor() and watch_supervisor()\n"  # idempotent
        "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)'])\n"
        "print(child.pid, flush=True)\n"
        "time.sleep(600)\n"
    )
    watched = subprocess.Popen(
        [sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env={**os.environ, SUPERVISOR_PID_ENV_VAR_NAME: str(supervisor.pid), "NEMO_GYM_CONFIG_PATH": "watched"},
        start_new_session=True,
    )
    try:
        child = int(watched.stdout.readline())
        time.sleep(1.5)  # a live supervisor is left alone
        assert alive(watched.pid) and alive(child)
        supervisor.kill()
        supervisor.wait()
        assert wait_until(lambda: not alive(child) and watched.poll() is not None), "watched process survived"
        assert f"ng_run (pid {supervisor.pid}) is gone" in watched.stderr.read()
    finally:
        for proc in (watched, supervisor):
            if proc.poll() is None:
                proc.kill()


# ------------------------------------------------------------------------------------------- stale stacks


def start_stale_server(spawner_dir: Path, port: int, head_port: int, supervisor_pid: int) -> subprocess.Popen:
    """A spawner server started as ng_run starts one, except that its `NEMO_GYM_SUPERVISOR_PID` names a live
    process that is not its parent: its watcher leaves it alone and pdeathsig cannot reach it, so it outlives
    its "ng_run" - a stack left behind."""
    config = yaml.safe_load(SPAWNER_CONFIG)
    config["spawner_server"]["resources_servers"]["spawner"].update(host="127.0.0.1", port=port)
    config.update(config_paths=["configs/spawner.yaml"], head_server={"host": "127.0.0.1", "port": head_port})
    env = {
        **os.environ,
        "NEMO_GYM_CONFIG_DICT": yaml.safe_dump(config),
        "NEMO_GYM_CONFIG_PATH": "spawner_server",
        SUPERVISOR_PID_ENV_VAR_NAME: str(supervisor_pid),
        "NO_ORPHANS_DIR": str(spawner_dir / "pids"),
        "PYTHONPATH": os.pathsep.join([str(spawner_dir / "resources_servers" / "spawner"), os.environ.get("PYTHONPATH", "")]),
    }
    return subprocess.Popen(
        [sys.executable, "app.py"], cwd=spawner_dir / "resources_servers" / "spawner", env=env,
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
    )


def run_ng_run(args: list[str], cwd: Path, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run(
        [*NG_RUN, *args], cwd=cwd, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=timeout,
        env={**os.environ, "NO_ORPHANS_DIR": str(cwd / "pids")},
    )


def test_a_stale_stack_on_our_ports_is_named_and_stopped_with_the_flag(spawner_dir):
    head_port, port = free_port(), free_port()
    dummy = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    stale = start_stale_server(spawner_dir, port, head_port, dummy.pid)
    stack = None
    try:
        wait_http_ok(f"http://127.0.0.1:{port}/health", timeout=60)
        stale_child = child_pid(spawner_dir)
        stale_pids = [stale.pid, *descendants(stale.pid)]
        args = ["+config_paths=[configs/spawner.yaml]", f"+head_server.port={head_port}",
                f"+spawner_server.resources_servers.spawner.port={port}"]

        # Not a terminal and no flag: ng_run names the stack and says how, and touches nothing.
        refused = run_ng_run(args, spawner_dir)
        text = refused.stdout + refused.stderr
        assert refused.returncode != 0, text
        assert "stale nemo_gym stack" in text, text
        assert f"ng_run pid {dummy.pid}" in text and f"pid {stale.pid}" in text, text
        assert f"server 'spawner_server' 127.0.0.1:{port}" in text and "configs/spawner.yaml" in text, text
        assert "+stop_stale_stack=true" in text, text
        assert alive(stale.pid) and alive(stale_child)

        # With the flag: stopped (the server, its child and its workers), then this stack starts on the port.
        stack = NgRunStack([*args, "+stop_stale_stack=true"], cwd=spawner_dir,
                           env={"NO_ORPHANS_DIR": str(spawner_dir / "pids")})
        stack.wait_for("All 1 / 1 servers ready!", timeout=120)
        assert "Stale stack stopped." in stack.output
        assert not any(alive(p) for p in [*stale_pids, stale_child])
        assert server_instances(head_port)[0]["port"] == port

        # A second ng_run on the same head port meets a live stack: named, never stopped from here.
        live = run_ng_run(["+config_paths=[configs/spawner.yaml]", f"+head_server.port={head_port}",
                           "+stop_stale_stack=true"], spawner_dir)
        text = live.stdout + live.stderr
        assert live.returncode != 0, text
        assert f"taken by a running ng_run (pid {stack.proc.pid}" in text and "configs/spawner.yaml" in text, text
        assert stack.proc.poll() is None
    finally:
        if stack is not None:
            assert stack.stop() == 0, stack.output
        for proc in (stale, dummy):
            if proc.poll() is None:
                try:
                    os.killpg(proc.pid, signal.SIGKILL) if proc is stale else proc.kill()
                except ProcessLookupError:
                    pass


def test_on_a_terminal_ng_run_asks_before_stopping_a_stale_stack(spawner_dir):
    import pty
    import threading

    head_port, port = free_port(), free_port()
    dummy = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    stale = start_stale_server(spawner_dir, port, head_port, dummy.pid)
    master, slave = pty.openpty()
    proc = None
    try:
        wait_http_ok(f"http://127.0.0.1:{port}/health", timeout=60)
        proc = subprocess.Popen(
            [*NG_RUN, "+config_paths=[configs/spawner.yaml]", f"+head_server.port={head_port}",
             f"+spawner_server.resources_servers.spawner.port={port}"],
            cwd=spawner_dir, stdin=slave, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
            env={**os.environ, "PYTHONUNBUFFERED": "1", "NO_ORPHANS_DIR": str(spawner_dir / "pids")},
        )
        watchdog = threading.Timer(180, proc.kill)  # a hung prompt fails the test instead of hanging it
        watchdog.start()
        lines = []
        for line in proc.stdout:
            lines.append(line)
            if "stale nemo_gym stack" in line:
                os.write(master, b"y\n")
            if "All 1 / 1 servers ready!" in line:
                break
        watchdog.cancel()
        output = "".join(lines)
        assert "All 1 / 1 servers ready!" in output, output
        assert "Stale stack stopped." in output, output
        assert not alive(stale.pid)
    finally:
        if proc is not None and proc.poll() is None:
            proc.send_signal(signal.SIGINT)
            assert proc.wait(timeout=30) == 0
        os.close(master)
        os.close(slave)
        for p in (stale, dummy):
            if p.poll() is None:
                p.kill()
