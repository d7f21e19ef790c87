"""Ray actor replicas (docs/design.md, decision 24) with real processes: a single-machine stack with replicas never
imports ray (checked in a fresh interpreter), and one actor replica on a real local Ray reports its address, is
restarted by Ray and then marked failed. The rest without a Ray cluster is tests/unit/test_ray_actors.py; the
multi-node cluster is tests/integration/test_ray_cluster.py."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

from nemo_gym import PARENT_DIR
from tests.conftest import FIXTURE_STACK


def test_single_machine_stack_with_replicas_never_imports_ray():
    """Local replicas and single servers: preparing the stack, its Ray decision, the children's environment and
    the head server's records leave ray unimported (importing it alone costs about a second)."""
    code = textwrap.dedent(
        """
        import io, sys
        from nemo_gym.config.global_config import parse_global_config
        from nemo_gym.runtime.launcher import RunHelper
        from omegaconf import OmegaConf
        cfg = parse_global_config(["+config_paths=[configs/replicas.yaml]", "+policy_base_url=http://127.0.0.1:1/v1",
                                   "+policy_api_key=x", "+policy_model_name=m"], load_env_yaml=False)
        helper = RunHelper(cfg, out=io.StringIO())
        helper.prepare()
        helper.start_ray()
        assert helper.ray_handle is None and not helper.ray_replicas
        assert len(helper.instances()) == 5
        helper._child_env(helper.servers[0], OmegaConf.to_yaml(cfg), None)
        from nemo_gym.http.client import ServerClient
        assert ServerClient(global_config_dict=cfg).replicas("replica_counter_resources_server") is not None
        assert "ray" not in sys.modules, "ray was imported"
        print("OK")
        """
    )
    env = {"PYTHONPATH": str(PARENT_DIR), "PATH": "/usr/bin:/bin"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=FIXTURE_STACK, env=env,
                         timeout=120)
    assert out.returncode == 0 and out.stdout.strip().endswith("OK"), out.stdout + out.stderr


# A stand-in server command: serves GET /health on the socket ng_run (here: the actor) hands it.
TINY_SERVER = """
import http.server, os, socket, socketserver
sock = socket.socket(fileno=int(os.environ.pop("NEMO_GYM_LISTEN_FD")))
class Health(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200); self.end_headers(); self.wfile.write(b"ok")
    def log_message(self, *args):
        pass
server = socketserver.TCPServer(("127.0.0.1", 0), Health, bind_and_activate=False)
server.socket = sock
print("serving replica", os.environ.get("NEMO_GYM_REPLICA"), flush=True)
server.serve_forever()
"""


def test_an_actor_replica_reports_its_address_is_restarted_by_ray_and_then_marked_failed(tmp_path):
    """A real (single-node, local) Ray: the actor binds a free port, starts the command on it, and reports node,
    host, port and pid. Killing the server process makes Ray restart the actor (new pid and port, `restarts`
    1); once `max_restarts` (1) is spent, the replica is `failed`. Ray runs in a child process of the test."""
    code = textwrap.dedent(
        f"""
        import os, signal, sys, time, types
        from nemo_gym.runtime.ray import _start_local
        from nemo_gym.runtime.ray_actors import RayReplica, actor_options, remote_actor_class
        _start_local({{"ray_num_cpus": 1}}, log_to_driver=False)
        spec = types.SimpleNamespace(server_id="svc", server_type="resources_servers", impl="tiny",
                                     config={{"entrypoint": "x"}})
        replica = RayReplica(spec=spec, server_dir={str(tmp_path)!r}, replica=1, num_replicas=2, max_restarts=1)
        env = {{**os.environ, "NEMO_GYM_REPLICA": "1"}}
        replica.start(remote_actor_class(), [sys.executable, "-c", {TINY_SERVER!r}], env, "127.0.0.1",
                      actor_options({{"ray_actor_options": {{}}}}, max_restarts=1))

        def until(state, what, restarts=0):
            deadline = time.monotonic() + 120
            while True:
                replica.poll()
                if replica.state == state and replica.restarts == restarts:
                    return
                assert time.monotonic() < deadline, (what, replica.state, replica.info)
                time.sleep(0.1)

        until("ready", "first start")
        first = dict(replica.info)
        record = replica.display()
        assert record["host"] == "127.0.0.1" and record["port"] > 0 and record["node_id"], record
        assert record["url"] == f"http://127.0.0.1:{{record['port']}}" and record["replica"] == 1
        os.kill(first["pid"], signal.SIGKILL)
        until("ready", "restart", restarts=1)
        assert replica.restarts == 1 and replica.info["pid"] != first["pid"], (replica.restarts, replica.info)
        os.kill(replica.info["pid"], signal.SIGKILL)
        until("failed", "restarts spent", restarts=1)
        assert replica.display()["url"] is None
        print("OK")
        """
    )
    env = {**os.environ, "PYTHONPATH": str(PARENT_DIR)}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
    assert out.returncode == 0 and "OK" in out.stdout.splitlines(), out.stdout[-3000:] + out.stderr[-3000:]
