"""Unit tests of ng_run's supervision decisions (restart policy, backoff) and of ng_status's columns. The restart
budget, spent on a real exited process, is in tests/integration/test_self_healing.py."""

from __future__ import annotations

import io

import pytest
from omegaconf import OmegaConf

from nemo_gym.config.known_keys import GlobalKeys
from nemo_gym.config.types import RestartPolicy, ServerImplConfig, ServerInstanceSpec
from nemo_gym.errors import NeMoGymConfigError
from nemo_gym.runtime.launcher import restart_delay, restart_policy_for
from nemo_gym.runtime.status import print_status


def spec(config: dict) -> ServerInstanceSpec:
    return ServerInstanceSpec(server_id="srv", server_type="resources_servers", impl="impl", config=config)


def test_restart_policy_is_on_by_default_and_a_global_key():
    policy = GlobalKeys().restart_policy
    assert policy == RestartPolicy() and policy.max_restarts > 0
    assert "restart_policy" in GlobalKeys.parameter_keys()


def test_server_block_keys_override_the_global_policy_key_by_key():
    cfg = OmegaConf.create({"restart_policy": {"max_restarts": 2, "window_s": 60}})
    policy = restart_policy_for(cfg, spec({"entrypoint": "app.py", "restart_policy": {"max_restarts": 0}}))
    assert (policy.max_restarts, policy.window_s, policy.backoff_s) == (0, 60, RestartPolicy().backoff_s)
    assert restart_policy_for(OmegaConf.create({}), spec({"entrypoint": "app.py"})) == RestartPolicy()


def test_a_bad_restart_policy_names_the_server_and_key():
    with pytest.raises(NeMoGymConfigError, match="srv"):
        restart_policy_for(OmegaConf.create({}), spec({"restart_policy": {"max_restarts": -1}}))
    with pytest.raises(NeMoGymConfigError, match="max_restart"):
        restart_policy_for(OmegaConf.create({"restart_policy": {"max_restart": 1}}), spec({}))


def test_server_blocks_accept_restart_policy():
    block = ServerImplConfig.model_validate({"entrypoint": "app.py", "restart_policy": {"max_restarts": 1}})
    assert block.restart_policy.max_restarts == 1


def test_backoff_doubles_and_is_capped():
    policy = RestartPolicy(backoff_s=0.5, backoff_max_s=3)
    assert [restart_delay(policy, n) for n in range(5)] == [0.5, 1.0, 2.0, 3.0, 3.0]


def test_status_table_shows_state_restarts_last_exit_and_uptime():
    out = io.StringIO()
    base = {"server_type": "resources_servers", "name": "impl", "url": "http://h:1", "pid": 7}
    print_status(
        [
            {**base, "process_name": "ok", "healthy": True, "state": "ready", "restarts": 2, "last_exit_code": -9,
             "uptime": "0d 0h 0m 1.0s"},
            {**base, "process_name": "dead", "healthy": False, "state": "failed", "restarts": 5,
             "last_exit_code": 1, "uptime": "-"},
        ],
        out,
    )
    text = out.getvalue()
    assert "restarts" in text and "last exit" in text and "-9" in text
    assert "2 servers found (1 healthy, 1 unhealthy)" in text and "failed (restart budget spent" in text and "dead" in text
