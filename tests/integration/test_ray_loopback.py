"""A stack with Ray stays on this machine and ends with `ng_run` (issue 37, item 6), with real processes.

`ng_run` runs tests/fixtures/stack/configs/ray.yaml with the block made a Ray actor: `ng_run` starts a local Ray
cluster and is a driver of it, the server runs under a Ray actor and (`ray: true`) joins the cluster as a driver
too, and its `/square` runs a Ray task, so a task worker starts. Checked on that whole process tree (Ray's GCS,
raylet, dashboard agent, runtime-env agent, monitor, workers, the server, `ng_run`): no socket listens outside
loopback. Then `kill -9` of `ng_run`: every process of the tree, Ray's agents included, is gone within a
bounded wait (they outlived it by a minute before). One stack for the module (a cluster start is ~10 s)."""

from __future__ import annotations

import ipaddress
import signal
import time

import httpx
import psutil
import pytest

from nemo_gym.testing.stack import NgRunStack, process_tree, server_instances
from tests.conftest import FIXTURE_STACK, free_port

pytest.importorskip("ray")

BLOCK = "ray_resources_server.resources_servers.ray_resources"
GONE_WITHIN_S = 15.0  # Ray's agents lived 61 s after ng_run before the fix


def is_loopback(ip: str) -> bool:
    address = ipaddress.ip_address(ip.split("%")[0])
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped
    return address.is_loopback


def listeners(procs: list) -> list[tuple]:
    """(pid, name, ip, port) of every TCP listener and bound UDP socket of `procs`."""
    found = []
    for proc in procs:
        try:
            name = proc.name()
            for conn in proc.net_connections(kind="inet"):
                listening = conn.status == psutil.CONN_LISTEN or (conn.type == 2 and not conn.raddr)  # 2: UDP
                if listening and conn.laddr:
                    found.append((proc.pid, name, conn.laddr.ip, conn.laddr.port))
        except psutil.Error:
            pass
    return found


def alive(known: list[tuple]) -> list[str]:
    """Those of `known` (pid, start time, name) that still run as the same process."""
    left = []
    for pid, start, name in known:
        try:
            proc = psutil.Process(pid)
            if proc.create_time() == start and proc.status() != psutil.STATUS_ZOMBIE:
                left.append(f"{pid} {name}")
        except psutil.Error:
            pass
    return left


@pytest.fixture(scope="module")
def ray_stack():
    head_port = free_port()
    stack = NgRunStack(
        ["+config_paths=[configs/ray.yaml]", f"+head_server.port={head_port}",
         f"+{BLOCK}.ray_actor_options.num_cpus=0"],  # the block runs as a Ray actor
        cwd=FIXTURE_STACK,
    )
    known: list[tuple] = []
    try:
        stack.wait_for("All 1 / 1 servers ready!", timeout=240)
        server = server_instances(head_port)[0]
        assert httpx.post(server["url"] + "/square", json={"x": 7}, timeout=120).json()["value"] == 49
        yield stack, known
    finally:
        if stack.proc.poll() is None:
            stack.stop(timeout=60)
        for pid, start, _ in known:  # whatever a failed check left behind
            try:
                proc = psutil.Process(pid)
                if proc.create_time() == start:
                    proc.kill()
            except psutil.Error:
                pass


def test_nothing_of_the_stack_listens_beyond_loopback(ray_stack):
    stack, known = ray_stack
    tree = process_tree(stack.proc.pid)
    names = " ".join(p.name() for p in tree)
    assert "raylet" in names and "gcs_server" in names, names
    found = listeners(tree)
    assert any(name == "raylet" for _, name, _, _ in found), found  # the check sees Ray's sockets at all
    outside = [entry for entry in found if not is_loopback(entry[2])]
    assert not outside, f"listening beyond loopback: {outside}"


def test_kill_9_of_ng_run_takes_its_ray_session_along(ray_stack):
    stack, known = ray_stack
    for proc in process_tree(stack.proc.pid)[1:]:
        try:
            known.append((proc.pid, proc.create_time(), proc.name()))
        except psutil.Error:
            pass
    assert any("Agent" in name for _, _, name in known), known
    stack.proc.send_signal(signal.SIGKILL)
    stack.wait(timeout=30)
    deadline = time.monotonic() + GONE_WITHIN_S
    while alive(known) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not alive(known), f"still running {GONE_WITHIN_S} s after kill -9 of ng_run: {alive(known)}"
