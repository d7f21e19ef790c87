"""nemo_gym.runtime.ray: Ray only when a server asks for it; children join the parent's cluster; no-Ray stacks
never import ray. One real cluster start for the whole module (about 10 s)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap

import pytest
from omegaconf import OmegaConf

from nemo_gym import PARENT_DIR
from nemo_gym.runtime.ray import RayHandle, server_wants_ray, shutdown_ray, start_or_join_ray_for_launch


def block(ray=None, server_type="resources_servers", impl="x"):
    impl_cfg = {"entrypoint": "app.py", "domain": "other"}
    if ray is not None:
        impl_cfg["ray"] = ray
    return {server_type: {impl: impl_cfg}}


def child_env(**extra):
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(PARENT_DIR), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    env.pop("RAY_ADDRESS", None)
    env.update(extra)
    return env


# ---------------------------------------------------------------------------------------------- detection


@pytest.mark.parametrize("as_omegaconf", [False, True])
def test_server_wants_ray_detection(as_omegaconf):
    def wrap(d):
        return OmegaConf.create(d) if as_omegaconf else d

    assert not server_wants_ray(wrap({}))
    assert not server_wants_ray(wrap({"a": block(), "b": block(ray=False), "head_server": {"host": "h", "port": 1}}))
    assert server_wants_ray(wrap({"a": block(), "b": block(ray=True, server_type="responses_api_models")}))
    assert server_wants_ray(wrap({"a": block(), "ray": True}))
    # A dict that is not a server block (no entrypoint) does not count, even with `ray: true` inside.
    assert not server_wants_ray(wrap({"misc": {"x": {"y": {"ray": True}}}}))
    # The flag may come from an interpolation.
    assert server_wants_ray(OmegaConf.create({"use_ray": True, "a": block(ray="${use_ray}")}))


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


def test_child_side_decisions(monkeypatch):
    """initialize_ray / ensure_ray branches, with the Ray calls stubbed (no cluster start)."""
    from nemo_gym.runtime import ray as ray_utils

    calls = []
    monkeypatch.setattr(ray_utils, "_current_address", lambda: None)
    monkeypatch.setattr(ray_utils, "_join", lambda address, **kw: calls.append(("join", address)) or address)
    monkeypatch.setattr(
        ray_utils, "_start_local", lambda cfg, **kw: calls.append(("start", None)) or "127.0.0.1:7777"
    )

    # Address given: join it.
    assert ray_utils.initialize_ray({"ray_head_node_address": "1.2.3.4:5"}) == "1.2.3.4:5"
    assert calls.pop() == ("join", "1.2.3.4:5")

    # No address, this server does not want Ray: nothing.
    monkeypatch.setenv("NEMO_GYM_CONFIG_PATH", "a")
    cfg = OmegaConf.create({"a": block(), "b": block(ray=True, impl="other")})
    assert ray_utils.initialize_ray(cfg) is None and not calls

    # No address, this server wants Ray (started by hand, not under ng_run): start locally, record the address.
    monkeypatch.setenv("NEMO_GYM_CONFIG_PATH", "b")
    assert ray_utils.initialize_ray(cfg) == "127.0.0.1:7777"
    assert calls.pop() == ("start", None) and cfg.ray_head_node_address == "127.0.0.1:7777"

    # ensure_ray: whatever the flags say, join the recorded address or start one.
    assert ray_utils.ensure_ray(cfg) == "127.0.0.1:7777" and calls.pop() == ("join", "127.0.0.1:7777")
    fresh = {"a": block()}
    assert ray_utils.ensure_ray(fresh) == "127.0.0.1:7777" and calls.pop() == ("start", None)
    assert fresh["ray_head_node_address"] == "127.0.0.1:7777"
