"""Where a Ray cluster started by `ng_run` listens (issue 37): loopback unless `ray_node_ip_address` names a node
address, and where actor servers listen then; the loopback switch is undone when the cluster stops. With real
processes (listeners, `kill -9`): tests/integration/test_ray_loopback.py."""

from __future__ import annotations

import os
import sys
import types

import pytest
from omegaconf import OmegaConf

from nemo_gym.runtime import ray as ray_mod
from nemo_gym.runtime.ray import LOOPBACK_RAY_ENV, is_loopback, local_node_ip
from nemo_gym.runtime.ray_actors import NODE_IP, bind_host_for


@pytest.mark.parametrize("host", ["127.0.0.1", "127.0.1.1", "::1", "localhost"])
def test_loopback_names(host):
    assert is_loopback(host)


@pytest.mark.parametrize("host", ["10.0.0.5", "0.0.0.0", "::", "node1.example.com", "192.0.2.2"])
def test_not_loopback(host):
    assert not is_loopback(host)


def test_node_address_of_a_cluster_started_here():
    assert local_node_ip({}) is None
    assert local_node_ip(OmegaConf.create({"ray_node_ip_address": None})) is None
    assert local_node_ip({"ray_node_ip_address": "127.0.0.1"}) is None  # loopback, as by default
    assert local_node_ip({"ray_node_ip_address": "10.0.0.5"}) == "10.0.0.5"


def test_actor_servers_follow_the_node_address():
    assert bind_host_for({}, joined_cluster=False) == "127.0.0.1"
    assert bind_host_for({"ray_node_ip_address": "127.0.0.1"}, joined_cluster=False) == "127.0.0.1"
    # Other machines can join a cluster started on a node address: replicas there must be reachable.
    assert bind_host_for({"ray_node_ip_address": "10.0.0.5"}, joined_cluster=False) == NODE_IP
    assert bind_host_for({"ray_node_ip_address": "10.0.0.5", "ray_bind_host": "127.0.0.1"}, False) == "127.0.0.1"


def test_loopback_switch_is_undone_when_the_cluster_stops(monkeypatch):
    for key in LOOPBACK_RAY_ENV:
        monkeypatch.delenv(key, raising=False)
    constants = types.SimpleNamespace(ENABLE_RAY_CLUSTER=True)
    fake_ray = types.SimpleNamespace(_private=types.SimpleNamespace(ray_constants=constants))
    monkeypatch.setitem(sys.modules, "ray", fake_ray)
    ray_mod._on_loopback(fake_ray)
    assert os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] == "0" and constants.ENABLE_RAY_CLUSTER is False
    ray_mod._off_loopback()
    assert not any(key in os.environ for key in LOOPBACK_RAY_ENV)
    assert constants.ENABLE_RAY_CLUSTER is True
