"""run_webserver (nemo_gym/serving/runner.py) in a real child process, as `ng_run` starts a server: the listening
socket handed down via pass_fds + NEMO_GYM_LISTEN_FD (or bound by the child itself), several workers sharing it and
the session secret, SIGINT/SIGTERM -> exit 0, a bad config -> exit 2 with a prefixed message, every output line
prefixed, 200 access lines hidden; and the garbage collector tuned for serving, in a fresh interpreter. SimpleServer
in this process is tests/unit/test_server_utils.py."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
import sys
import textwrap
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest
import yaml

from nemo_gym.http.transports import DEFAULT_CONNECTOR_LIMIT_PER_HOST

REPO_ROOT = Path(__file__).resolve().parents[2]

SERVER_APP = textwrap.dedent(
    """
    import os, sys, threading, time
    from fastapi import FastAPI, Request
    from nemo_gym.servers.resources_server import BaseResourcesServerConfig, BaseVerifyRequest, BaseVerifyResponse
    from nemo_gym.servers.resources_server import SimpleResourcesServer
    from nemo_gym.servers.base import SESSION_ID_KEY, is_nemo_gym_fastapi_entrypoint

    print("importing the entrypoint", flush=True)


    class ChildConfig(BaseResourcesServerConfig):
        greeting: str


    class ChildServer(SimpleResourcesServer):
        config: ChildConfig

        def setup_webserver(self) -> FastAPI:
            app = super().setup_webserver()
            app.post("/hello")(self.hello)
            app.post("/fail")(self.fail)
            app.post("/block")(self.block)
            app.post("/wait")(self.wait)
            return app

        async def wait(self) -> dict:
            import asyncio
            await asyncio.sleep(1.5)  # keeps the event loop free: /health answers meanwhile
            return {}

        async def block(self, request: Request) -> dict:
            time.sleep(0.5)  # blocks this worker's event loop: a call arriving meanwhile goes to the other worker
            return {"pid": os.getpid(), "session_id": request.session[SESSION_ID_KEY]}

        async def hello(self, request: Request) -> dict:
            print(f"hello from {request.session[SESSION_ID_KEY]}")
            sys.stderr.write("stderr line one\\nstderr line two\\n")
            return {"greeting": self.config.greeting, "session_id": request.session[SESSION_ID_KEY]}

        async def fail(self) -> dict:
            raise ZeroDivisionError("no luck")

        async def verify(self, body: BaseVerifyRequest) -> BaseVerifyResponse:
            return BaseVerifyResponse(**body.model_dump(), reward=1.0)


    if __name__ == "__main__":
        ChildServer.run_webserver()
    elif MODULE_LEVEL_APP and is_nemo_gym_fastapi_entrypoint(__file__):
        app = ChildServer.run_webserver()
    """
)


class ChildProcess:
    def __init__(self, tmp_path: Path, *, num_workers: int = 1, pass_socket: bool = True, module_level_app=False,
                 impl: dict | None = None, top: dict | None = None):
        app_dir = tmp_path / "child_server"
        app_dir.mkdir(exist_ok=True)
        (app_dir / "app.py").write_text(SERVER_APP.replace("MODULE_LEVEL_APP", str(module_level_app)))
        self.sock = None
        if pass_socket:
            self.sock = socket.socket()
            self.sock.bind(("127.0.0.1", 0))
            self.sock.listen(128)
            port = self.sock.getsockname()[1]
        else:
            with socket.socket() as probe:
                probe.bind(("127.0.0.1", 0))
                port = probe.getsockname()[1]
        self.port = port
        block = {"entrypoint": "app.py", "domain": "other", "host": "127.0.0.1", "port": port, "greeting": "${greeting}"}
        if num_workers > 1:
            block["num_workers"] = num_workers
        block.update(impl or {})
        cfg = {
            "greeting": "bonjour",
            "head_server": {"host": "127.0.0.1", "port": 11000},
            "my_child": {"resources_servers": {"child_impl": block}},
            **(top or {}),
        }
        env = {
            **os.environ,
            "NEMO_GYM_CONFIG_DICT": yaml.safe_dump(cfg),
            "NEMO_GYM_CONFIG_PATH": "my_child",
            "PYTHONPATH": os.pathsep.join([str(REPO_ROOT), os.environ.get("PYTHONPATH", "")]),
            "PYTHONUNBUFFERED": "1",
        }
        for key in ("NEMO_GYM_LISTEN_FD", "IS_NEMO_GYM_FASTAPI_WORKER", "PYTEST_CURRENT_TEST"):
            env.pop(key, None)
        if self.sock is not None:
            env["NEMO_GYM_LISTEN_FD"] = str(self.sock.fileno())
        self.proc = subprocess.Popen(
            [sys.executable, "app.py"],
            cwd=app_dir,
            env=env,
            pass_fds=(self.sock.fileno(),) if self.sock is not None else (),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
        )
        if self.sock is not None:
            self.sock.close()  # the child holds its own copy
        self.lines: list[str] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()
        self.url = f"http://127.0.0.1:{port}"

    def _read(self) -> None:
        for line in self.proc.stdout:
            self.lines.append(line.rstrip("\n"))

    @property
    def output(self) -> str:
        return "\n".join(self.lines)

    def wait_ready(self, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            assert self.proc.poll() is None, f"child exited early ({self.proc.returncode}):\n{self.output}"
            try:
                if httpx.get(f"{self.url}/health", timeout=1).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.05)
        raise AssertionError(f"child not ready:\n{self.output}")

    def stop(self, sig: int = signal.SIGINT, group: bool = False, timeout: float = 30) -> int:
        if self.proc.poll() is None:
            if group:
                os.killpg(self.proc.pid, sig)
            else:
                self.proc.send_signal(sig)
        try:
            code = self.proc.wait(timeout=timeout)
        finally:
            if self.proc.poll() is None:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        self._reader.join(timeout=5)
        return code


@pytest.fixture
def child(tmp_path):
    started: list[ChildProcess] = []

    def start(**kwargs) -> ChildProcess:
        c = ChildProcess(tmp_path, **kwargs)
        started.append(c)
        return c

    yield start
    for c in started:
        if c.proc.poll() is None:
            c.stop(signal.SIGKILL, group=True)


def test_run_webserver_serves_on_the_passed_socket_and_exits_0_on_sigint(child):
    c = child()
    c.wait_ready()
    health = httpx.get(f"{c.url}/health").json()
    # No other request is being answered; the client's per-peer limit is the default (the config sets none).
    assert health == {"status": "ok", "name": "my_child", "in_flight": 0,
                      "client_limit_per_host": DEFAULT_CONNECTOR_LIMIT_PER_HOST}
    # Three slow requests at once: /health counts them (ng_status's "in flight" per replica), then none again.
    with ThreadPoolExecutor(3) as pool:
        waits = [pool.submit(httpx.post, f"{c.url}/wait", json={}, timeout=30) for _ in range(3)]
        counts = set()
        while not all(w.done() for w in waits):
            counts.add(httpx.get(f"{c.url}/health").json()["in_flight"])
        assert all(w.result().status_code == 200 for w in waits)
    assert 3 in counts and counts <= {0, 1, 2, 3}, counts
    assert httpx.get(f"{c.url}/health").json()["in_flight"] == 0

    first = httpx.post(f"{c.url}/hello", json={})
    assert first.status_code == 200
    cookie_name = "ChildServer___my_child"
    assert cookie_name in first.cookies
    assert first.json()["greeting"] == "bonjour"  # interpolation resolved in the child
    second = httpx.post(f"{c.url}/hello", json={}, cookies={cookie_name: first.cookies[cookie_name]})
    assert second.json()["session_id"] == first.json()["session_id"]

    failed = httpx.post(f"{c.url}/fail", json={})
    assert failed.status_code == 500 and failed.json() == "ZeroDivisionError: no luck"
    assert httpx.post(f"{c.url}/hello", json=[]).status_code == 200  # no body model: any JSON is fine
    assert httpx.post(f"{c.url}/verify", json={"bad": 1}).status_code == 422

    assert c.stop(signal.SIGINT) == 0
    out = c.output
    assert "Traceback" not in out.split("ZeroDivisionError")[-1]  # no KeyboardInterrupt traceback at exit
    assert "KeyboardInterrupt" not in out
    # Every line the server printed (prints, stderr, uvicorn, tracebacks) carries the prefix.
    after_import = [line for line in c.lines if "importing the entrypoint" not in line]
    assert after_import and all(line.startswith("(my_child) ") for line in after_import), out
    assert f"(my_child) hello from {first.json()['session_id']}" in c.lines
    assert "(my_child) stderr line one" in c.lines and "(my_child) stderr line two" in c.lines
    assert any("Unhandled exception in ChildServer___my_child" in line for line in c.lines)
    # 200 access lines are hidden; the 500 and 422 ones are shown.
    assert not any('"POST /hello HTTP/1.1" 200' in line for line in c.lines)
    assert any('"POST /fail HTTP/1.1" 500' in line for line in c.lines)
    assert any('"POST /verify HTTP/1.1" 422' in line for line in c.lines)


def test_run_webserver_exits_0_on_sigterm_and_can_show_200_lines(child):
    c = child(top={"uvicorn_logging_show_200_ok": True})
    c.wait_ready()
    assert httpx.post(f"{c.url}/hello", json={}).status_code == 200
    assert c.stop(signal.SIGTERM) == 0
    assert any('"POST /hello HTTP/1.1" 200' in line for line in c.lines), c.output


def test_run_webserver_binds_host_port_itself_without_listen_fd(child):
    c = child(pass_socket=False)
    c.wait_ready()
    assert httpx.get(f"{c.url}/health").json()["name"] == "my_child"
    assert c.stop(signal.SIGINT, group=True) == 0  # ng_run signals the whole process group


def test_run_webserver_with_bad_config_exits_2_with_a_prefixed_message(child):
    c = child(impl={"greeting": None, "port": "not-a-port"})
    code = c.proc.wait(timeout=60)
    c._reader.join(timeout=5)
    assert code == 2, c.output
    assert "(my_child) Server `my_child` has an invalid config" in c.output
    assert "Traceback" not in c.output


@pytest.mark.parametrize("module_level_app", [False, True])
def test_run_webserver_multiple_workers_share_the_socket_and_session_secret(child, module_level_app):
    c = child(num_workers=2, module_level_app=module_level_app)
    c.wait_ready(timeout=90)
    cookie_name = "ChildServer___my_child"
    first = httpx.post(f"{c.url}/hello", json={})
    session_id = first.json()["session_id"]
    cookies = {cookie_name: first.cookies[cookie_name]}

    async def blocked_calls() -> list[dict]:
        # A worker whose loop is blocked cannot accept, so staggered calls spread over both workers. Timing
        # on a loaded machine is not guaranteed, so keep going (bounded) until both workers have answered.
        async def call(delay: float) -> dict:
            await asyncio.sleep(delay)
            async with httpx.AsyncClient(timeout=60, cookies=cookies) as client:
                return (await client.post(f"{c.url}/block", json={})).json()

        results: list[dict] = []
        for _ in range(10):
            results += await asyncio.gather(*(call(0.15 * i) for i in range(4)))
            if len({r["pid"] for r in results}) == 2:
                break
        return results

    results = asyncio.run(blocked_calls())
    assert len({r["pid"] for r in results}) == 2, results
    assert {r["session_id"] for r in results} == {session_id}  # both workers accept the same cookie
    started = {line.split("[")[1].split("]")[0] for line in c.lines if "Started server process" in line}
    assert len(started) == 2, c.output
    assert c.stop(signal.SIGINT, group=True) == 0
    assert "KeyboardInterrupt" not in c.output
    assert not any('" 200' in line for line in c.lines), c.output  # workers hide 200 access lines too
    assert any("Started server process" in line and line.startswith("(my_child) ") for line in c.lines)


def test_serving_processes_freeze_start_up_objects_and_collect_young_ones_rarely():
    """In a fresh interpreter (the collector's state is process-wide): start-up objects frozen, gen0 threshold raised,
    and a cycle made afterwards is still collected."""
    code = (
        "import gc, weakref\n"
        "from nemo_gym.servers.base import tune_gc_for_serving\n"
        "tune_gc_for_serving()\n"
        "class Node: pass\n"
        "a, b = Node(), Node(); a.b, b.a = b, a; ref = weakref.ref(a); del a, b\n"
        "gc.collect()\n"
        "print(gc.get_threshold()[0], gc.get_freeze_count() > 1000, ref() is None)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    assert out == ["100000", "True", "True"]
