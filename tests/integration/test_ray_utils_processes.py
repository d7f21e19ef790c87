"""nemo_gym.runtime.ray with real processes: no-Ray stacks never import ray (checked in a fresh interpreter), a given
address is remembered without starting Ray, and `ng_run`'s side starts a real local cluster that a child process
joins and runs a task on. One real cluster start for the whole module (about 10 s). Detection and a child's
decisions with the Ray calls stubbed are tests/unit/test_ray_utils.py."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap

import pytest
from omegaconf import OmegaConf

from nemo_gym import PARENT_DIR
from nemo_gym.runtime.ray import RayHandle, shutdown_ray, start_or_join_ray_for_launch
from tests.unit.test_ray_utils import block


def child_env(**extra):
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(PARENT_DIR), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    env.pop("RAY_ADDRESS", None)
    env.update(extra)
    return env


def test_given_address_is_remembered_without_starting_or_importing_ray():
    code = textwrap.dedent(
        """
        import sys
        from nemo_gym.runtime.ray import start_or_join_ray_for_launch, shutdown_ray
        cfg = {"ray_head_node_address": "10.1.2.3:6379", "a": {"resources_servers": {"x": {"entrypoint": "app.py", "ray": True}}}}
        h = start_or_join_ray_for_launch(cfg)
        assert h.address == "10.1.2.3:6379" and h.started is False, h
        shutdown_ray(h)  # not ours: nothing to stop
        assert "ray" not in sys.modules
        print("OK")
        """
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=child_env(), timeout=60)
    assert out.returncode == 0 and out.stdout.strip() == "OK", out.stderr


def test_no_ray_stack_never_imports_ray():
    """Parent and child paths of a stack without `ray: true` leave ray unimported (no ~1 s import, no cluster)."""
    code = textwrap.dedent(
        """
        import sys
        from nemo_gym.runtime.ray import initialize_ray, start_or_join_ray_for_launch
        from omegaconf import OmegaConf
        cfg = OmegaConf.create({"a": {"resources_servers": {"x": {"entrypoint": "app.py"}}},
                                "b": {"responses_api_models": {"m": {"entrypoint": "app.py", "ray": False}}}})
        assert start_or_join_ray_for_launch(cfg) is None
        assert "ray_head_node_address" not in cfg
        assert initialize_ray(cfg) is None
        assert initialize_ray() is None  # child path: config from NEMO_GYM_CONFIG_DICT
        assert "ray" not in sys.modules, "ray was imported"
        print("OK")
        """
    )
    config_yaml = OmegaConf.to_yaml(
        OmegaConf.create({"a": {"resources_servers": {"x": {"entrypoint": "app.py", "host": "127.0.0.1", "port": 1}}}})
    )
    env = child_env(NEMO_GYM_CONFIG_DICT=config_yaml, NEMO_GYM_CONFIG_PATH="a")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=60)
    assert out.returncode == 0 and out.stdout.strip() == "OK", out.stdout + out.stderr


# --------------------------------------------------------------------------------------- one real cluster


@pytest.fixture(scope="module")
def launched():
    """The ng_run side: a stack with one `ray: true` server starts a local cluster in this process."""
    cfg = OmegaConf.create({"a": block(), "b": block(ray=True, impl="needs_ray")})
    sentinel = lambda signum, frame: None  # noqa: E731  ng_run's own handler must survive ray.init
    previous = signal.signal(signal.SIGTERM, sentinel)
    try:
        handle = start_or_join_ray_for_launch(cfg)
        term_handler_after = signal.getsignal(signal.SIGTERM)
    finally:
        signal.signal(signal.SIGTERM, previous)
    try:
        yield cfg, handle, term_handler_after is sentinel
    finally:
        shutdown_ray(handle)


def test_launch_starts_local_ray_and_writes_gcs_address(launched):
    cfg, handle, kept_handler = launched
    assert isinstance(handle, RayHandle) and handle.started
    host, _, port = handle.address.rpartition(":")
    assert host and port.isdigit()
    assert cfg.ray_head_node_address == handle.address
    assert kept_handler, "ray.init replaced the caller's SIGTERM handler"
    # The serialized config (what children receive) carries the address.
    assert f"ray_head_node_address: {handle.address}" in OmegaConf.to_yaml(cfg)


def test_child_process_joins_and_runs_a_task(launched):
    cfg, handle, _ = launched
    code = textwrap.dedent(
        """
        import ray
        from nemo_gym.runtime.ray import initialize_ray, ensure_ray

        address = initialize_ray()  # reads NEMO_GYM_CONFIG_DICT like a server child
        assert ensure_ray() == address  # already connected: no second cluster

        @ray.remote
        def double(x):
            return 2 * x

        print("ADDRESS", address)
        print("RESULT", ray.get(double.remote(21)))
        print("NODES", len(ray.nodes()))
        """
    )
    env = child_env(NEMO_GYM_CONFIG_DICT=OmegaConf.to_yaml(cfg), NEMO_GYM_CONFIG_PATH="a")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=180)
    assert out.returncode == 0, out.stdout + out.stderr[-3000:]
    lines = dict(line.split(" ", 1) for line in out.stdout.splitlines() if " " in line)
    assert lines["ADDRESS"] == handle.address
    assert lines["RESULT"] == "42"
    assert lines["NODES"] == "1"  # joined the parent's cluster, did not start its own
