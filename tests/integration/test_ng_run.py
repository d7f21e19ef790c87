"""`ng_run` as a user runs it: a real 3-server stack (resources server with per-session state, openai_model in
front of the fake LLM backend, an agent), a `/run` through all of it, Ctrl-C, crash reporting, two stacks at once.
"""

import os
import signal
import subprocess
import sys

import httpx
import psutil

from nemo_gym.testing.stack import NgRunStack, server_instances
from tests.conftest import FIXTURE_STACK, free_port


class Stack(NgRunStack):
    """`ng_run` run from the fixture stack directory, where configs/*.yaml resolve."""

    def __init__(self, args: list[str]):
        super().__init__(args, cwd=FIXTURE_STACK)


def stack_args(backend_url: str, head_port: int) -> list[str]:
    return [
        "+config_paths=[configs/stack.yaml]",
        f"+policy_base_url={backend_url}",
        "+policy_api_key=dummy-key",
        "+policy_model_name=fake-model",
        f"+head_server.port={head_port}",
    ]


def port_is_free(port: int) -> bool:
    import socket

    with socket.socket() as s:
        # SO_REUSEADDR as servers use it: connections in TIME_WAIT do not count, a listener does.
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
            return True
        except OSError:
            return False


def test_stack_starts_runs_a_rollout_and_stops_cleanly_on_sigint(fake_backend):
    head_port = free_port()
    stack = Stack(stack_args(fake_backend, head_port))
    try:
        stack.wait_for("All 3 / 3 servers ready!")
        servers = {i["process_name"]: i for i in server_instances(head_port)}
        assert set(servers) == {"policy_model", "counter_resources_server", "counter_agent"}
        for info in servers.values():
            assert httpx.get(info["url"] + "/health", timeout=5).status_code == 200

        row = {
            "responses_create_params": {
                "input": "add two please",
                "tools": [
                    {
                        "type": "function",
                        "name": "increment_counter",
                        "description": "add to the counter",
                        "parameters": {"type": "object", "properties": {"count": {"type": "integer"}}},
                        "strict": False,
                    }
                ],
            },
            "initial_count": 1,
            "expected_count": 3,
        }
        result = httpx.post(servers["counter_agent"]["url"] + "/run", json=row, timeout=60).json()
        assert result["reward"] == 1.0, result
        assert result["final_count"] == 3
        outputs = result["response"]["output"]
        assert [o["type"] for o in outputs] == ["function_call", "function_call_output", "message"]
        assert outputs[-1]["content"][0]["text"] == "echo: add two please"

        # The masked config is served by the head server, api keys hidden.
        config_text = httpx.get(f"http://127.0.0.1:{head_port}/global_config_dict_yaml?raw=true", timeout=5).text
        assert "dummy-key" not in config_text and "****" in config_text

        # External clients find every server through the head server alone.
        from nemo_gym.http.client import ServerClient

        client = ServerClient.load_from_global_config({"host": "127.0.0.1", "port": head_port})
        assert client.global_config_dict["counter_agent"]["responses_api_agents"]["loop_agent"]["port"] == (
            servers["counter_agent"]["port"]
        )

        status = subprocess.run(
            [sys.executable, "-c", "from nemo_gym.cli import status; status()", f"+head_server.port={head_port}"],
            capture_output=True, text=True, timeout=60,
        )
        assert status.returncode == 0, status.stderr
        assert "3 servers found (3 healthy, 0 unhealthy)" in status.stdout
        assert "counter_resources_server" in status.stdout

        pids = [info["pid"] for info in servers.values()]
        ports = [info["port"] for info in servers.values()]
    finally:
        code = stack.stop()
    assert code == 0, stack.output
    for pid in pids:
        assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    for port in [*ports, head_port]:
        assert port_is_free(port), f"port {port} still bound after shutdown"


def test_sigterm_also_stops_everything(fake_backend):
    head_port = free_port()
    stack = Stack(stack_args(fake_backend, head_port))
    try:
        stack.wait_for("All 3 / 3 servers ready!")
        pids = [i["pid"] for i in server_instances(head_port)]
    finally:
        code = stack.stop(signal.SIGTERM)
    assert code == 0, stack.output
    assert not any(psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE for p in pids)


def test_server_crash_at_start_is_reported_and_exits_nonzero():
    head_port = free_port()
    stack = Stack(["+config_paths=[configs/crashing.yaml]", f"+head_server.port={head_port}"])
    code = stack.wait(timeout=60)
    assert code == 1, stack.output
    assert "Server 'crashing_server'" in stack.output
    assert "simulated start-up failure" in stack.output
    assert port_is_free(head_port)


def test_server_crash_after_ready_without_restarts_marks_it_failed_and_exits_1(fake_backend):
    # Restarts are tested in test_self_healing.py; with none allowed the crash is reported and ng_run exits 1.
    head_port = free_port()
    stack = Stack([*stack_args(fake_backend, head_port), "+restart_policy.max_restarts=0"])
    try:
        stack.wait_for("All 3 / 3 servers ready!")
        victim = next(i for i in server_instances(head_port) if i["process_name"] == "counter_resources_server")
        os.kill(victim["pid"], signal.SIGKILL)
        stack.wait_for("Restart budget spent", timeout=60)
    finally:
        code = stack.stop()
    assert code == 1
    assert "Server 'counter_resources_server'" in stack.output
    assert "exited with code -9" in stack.output


def test_two_stacks_at_once_get_different_ports(fake_backend):
    head_a, head_b = free_port(), free_port()
    a = Stack(stack_args(fake_backend, head_a))
    b = Stack(stack_args(fake_backend, head_b))
    try:
        a.wait_for("All 3 / 3 servers ready!")
        b.wait_for("All 3 / 3 servers ready!")
        ports_a = {i["port"] for i in server_instances(head_a)}
        ports_b = {i["port"] for i in server_instances(head_b)}
        assert len(ports_a) == 3 and len(ports_b) == 3
        assert not ports_a & ports_b
    finally:
        assert a.stop() == 0, a.output
        assert b.stop() == 0, b.output


def test_head_port_in_use_is_a_clear_error():
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        busy = s.getsockname()[1]
        stack = Stack(["+config_paths=[configs/crashing.yaml]", f"+head_server.port={busy}"])
        code = stack.wait(timeout=60)
    assert code == 2, stack.output
    assert str(busy) in stack.output
    assert "Traceback" not in stack.output


def test_a_server_that_asks_for_ray_gets_a_cluster_shared_with_ng_run():
    head_port = free_port()
    stack = Stack(["+config_paths=[configs/ray.yaml]", f"+head_server.port={head_port}"])
    try:
        stack.wait_for("All 1 / 1 servers ready!", timeout=180)
        config = httpx.get(f"http://127.0.0.1:{head_port}/global_config_dict_yaml?raw=true", timeout=5).text
        address = next(line.split(":", 1)[1].strip() for line in config.splitlines() if line.startswith("ray_head_node_address:"))
        server = server_instances(head_port)[0]
        result = httpx.post(server["url"] + "/square", json={"x": 7}, timeout=120).json()
        assert result["value"] == 49
        assert result["gcs_address"] == address
    finally:
        code = stack.stop(timeout=60)
    assert code == 0, stack.output


def test_stack_without_ray_never_starts_it(fake_backend):
    head_port = free_port()
    stack = Stack(stack_args(fake_backend, head_port))
    try:
        stack.wait_for("All 3 / 3 servers ready!")
        config = httpx.get(f"http://127.0.0.1:{head_port}/global_config_dict_yaml?raw=true", timeout=5).text
        assert "ray_head_node_address" not in config
        tree = psutil.Process(stack.proc.pid).children(recursive=True)
        assert not any("ray" in " ".join(p.cmdline()) for p in tree if p.is_running())
    finally:
        assert stack.stop() == 0


def test_isolated_venv_server_runs_from_its_own_venv(fake_backend, tmp_path):
    head_port = free_port()
    args = stack_args(fake_backend, head_port) + [
        "+counter_resources_server.resources_servers.counter_resources.venv_mode=isolated",
        f"+uv_venv_dir={tmp_path}",
    ]
    stack = Stack(args)
    try:
        stack.wait_for("All 3 / 3 servers ready!", timeout=600)
        servers = {i["process_name"]: i for i in server_instances(head_port)}
        isolated = psutil.Process(servers["counter_resources_server"]["pid"]).cmdline()[0]
        shared = psutil.Process(servers["counter_agent"]["pid"]).cmdline()[0]
        assert isolated.startswith(str(tmp_path)), isolated
        assert not shared.startswith(str(tmp_path))
        row = {"responses_create_params": {"input": "hi"}, "initial_count": 4, "expected_count": 4}
        assert httpx.post(servers["counter_agent"]["url"] + "/run", json=row, timeout=60).json()["reward"] == 1.0
    finally:
        assert stack.stop() == 0, stack.output


def test_dry_run_prepares_and_starts_nothing():
    head_port = free_port()
    stack = Stack(["+config_paths=[configs/crashing.yaml]", "+dry_run=true", f"+head_server.port={head_port}"])
    code = stack.wait(timeout=120)
    assert code == 0, stack.output
    assert "Dry run" in stack.output
    assert "simulated start-up failure" not in stack.output  # the server itself never ran
    assert port_is_free(head_port)
