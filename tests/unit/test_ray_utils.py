"""nemo_gym.runtime.ray: Ray only when a server asks for it, and a child's decisions (join, start, nothing) with the
Ray calls stubbed. A real cluster, children joining it and no-Ray stacks never importing ray are
tests/integration/test_ray_utils_processes.py."""

from __future__ import annotations

import pytest
from omegaconf import OmegaConf

from nemo_gym.runtime.ray import server_wants_ray


def block(ray=None, server_type="resources_servers", impl="x"):
    impl_cfg = {"entrypoint": "app.py", "domain": "other"}
    if ray is not None:
        impl_cfg["ray"] = ray
    return {server_type: {impl: impl_cfg}}


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
