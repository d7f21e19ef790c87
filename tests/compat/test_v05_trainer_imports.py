"""The names a trainer's NeMo Gym integration imports (NeMo RL's environment actor, TRL's in-process example, other
trainer forks and tools), imported exactly as they import them, with NeMo Gym v0.5's meaning: the global-config
parser object and its no-model config, the head-server key, the path constants, `run_examples`' signature.
(`RunHelper` and the in-process start are tested in tests/integration/test_trainer_in_process.py.)"""

from __future__ import annotations

import inspect
import sys
from pathlib import Path

import pytest
from omegaconf import DictConfig, OmegaConf

import nemo_gym
from nemo_gym import config_types
from nemo_gym.config import ports
from nemo_gym.config.global_config import loaded_global_config_dict
from nemo_gym.global_config import GlobalConfigDictParser, GlobalConfigDictParserConfig
from nemo_gym.rollout_collection import RolloutCollectionHelper
from nemo_gym.server_utils import (
    HEAD_SERVER_KEY_NAME,
    BaseServerConfig,
    GlobalAIOHTTPAsyncClientConfig,
    get_global_config_dict,
    is_global_aiohttp_client_setup,
    set_global_aiohttp_client,
)

WEATHER_CONFIG = "resources_servers/weather_tool_use/configs/weather_tool_use.yaml"
VLLM_CONFIG = "responses_api_models/vllm_model/configs/vllm_model_for_training.yaml"


def test_the_imported_names_are_v05s():
    assert HEAD_SERVER_KEY_NAME == "head_server"
    head = BaseServerConfig(host="10.0.0.7", port=5123)
    assert (head.host, head.port) == ("10.0.0.7", 5123)
    assert config_types.BaseServerConfig is BaseServerConfig
    assert Path(nemo_gym.PARENT_DIR) / "nemo_gym" == Path(nemo_gym.__file__).parent
    assert callable(get_global_config_dict) and callable(set_global_aiohttp_client)
    assert callable(is_global_aiohttp_client_setup) and GlobalAIOHTTPAsyncClientConfig().global_aiohttp_connector_limit
    parameters = inspect.signature(RolloutCollectionHelper.run_examples).parameters
    assert list(parameters)[1:] == ["examples", "head_server_config", "semaphore"]
    assert parameters["head_server_config"].default is None and parameters["semaphore"].default is None


def test_the_no_model_config_lets_a_config_with_agents_parse_without_a_model():
    """As benchmark discovery and data preparation use it: merged under an environment's config, then parsed."""
    no_model = GlobalConfigDictParserConfig.NO_MODEL_GLOBAL_CONFIG_DICT
    assert isinstance(no_model, DictConfig)
    assert (no_model.policy_base_url, no_model.policy_api_key, no_model.policy_model_name) == ("", "", "")
    held = ports.reserved_ports()
    cfg = GlobalConfigDictParser().parse_no_environment(
        initial_global_config_dict=OmegaConf.merge(no_model, {"config_paths": [WEATHER_CONFIG]})
    )
    assert {"weather_tool_use", "weather_tool_use_simple_agent", "policy_model"} <= set(cfg)
    assert cfg.weather_tool_use_simple_agent.responses_api_agents.simple_agent.model_server.name == "policy_model"
    assert isinstance(cfg.policy_model.responses_api_models.dummy_model.port, int)
    assert ports.reserved_ports() == held  # a parse gives free ports, it holds none for a launcher
    assert "policy_model" not in GlobalConfigDictParserConfig.NO_MODEL_GLOBAL_CONFIG_DICT.policy_model.keys()


def test_parse_takes_the_options_trainers_pass(tmp_path, monkeypatch):
    """`skip_load_from_cli` leaves the trainer's own argv alone; a `dotenv_path` that does not exist is skipped;
    `hide_secrets` masks the key; the result is not installed as this process's config."""
    monkeypatch.setattr(sys, "argv", ["train.py", "++policy_model_name=from-the-trainers-argv", "--lr=3e-4"])
    monkeypatch.delenv("PYTEST_CURRENT_TEST", raising=False)
    monkeypatch.chdir(tmp_path)
    initial = DictConfig({
        "config_paths": [str(Path(nemo_gym.PARENT_DIR) / path) for path in (WEATHER_CONFIG, VLLM_CONFIG)],
        "policy_base_url": ["http://10.0.0.1:8000/v1", "http://10.0.0.2:8000/v1"],
        "policy_api_key": "sk-trainer-secret",
        "policy_model_name": "policy",
        HEAD_SERVER_KEY_NAME: {"host": "0.0.0.0", "port": 5999},
    })  # fmt: skip
    options = GlobalConfigDictParserConfig(
        dotenv_path=tmp_path / "nemo_gym_env.yaml", initial_global_config_dict=initial, skip_load_from_cli=True,
        hide_secrets=True,
    )  # fmt: skip
    installed_before = loaded_global_config_dict()
    cfg = GlobalConfigDictParser().parse(options)
    assert loaded_global_config_dict() is installed_before
    assert cfg.policy_model_name == "policy"
    assert list(cfg.policy_base_url) == ["http://10.0.0.1:8000/v1", "http://10.0.0.2:8000/v1"]
    assert cfg.policy_api_key != "sk-trainer-secret"
    assert cfg[HEAD_SERVER_KEY_NAME].port == 5999
    assert "policy_model" in cfg


def test_the_cli_overrides_alone(monkeypatch):
    monkeypatch.setattr(sys, "argv", ["ng_run", "+policy_model_name=m", "+head_server.port=5001"])
    monkeypatch.delenv("PYTEST_CURRENT_TEST", raising=False)
    cfg = GlobalConfigDictParser().parse_global_config_dict_from_cli()
    assert OmegaConf.to_container(cfg) == {"policy_model_name": "m", "head_server": {"port": 5001}}


def test_a_bad_initial_config_is_a_clear_error():
    with pytest.raises(ValueError, match="config_paths"):
        GlobalConfigDictParser().parse_no_environment({"config_paths": ["no/such/config.yaml"]})


def test_get_global_config_dict_takes_the_callers_parser_class(monkeypatch):
    """v0.5's `get_global_config_dict(global_config_dict_parser_cls=...)`: a caller's subclass builds the config."""
    from nemo_gym.config.global_config import reset_global_config_dict_cache

    class TrainerParser(GlobalConfigDictParser):
        def parse(self, parse_config=None):
            return OmegaConf.create({"built_by": "trainer", "skip_cli": parse_config.skip_load_from_cli})

    monkeypatch.delenv("NEMO_GYM_CONFIG_DICT", raising=False)
    reset_global_config_dict_cache()
    try:
        cfg = get_global_config_dict(GlobalConfigDictParserConfig(skip_load_from_cli=True), TrainerParser)
        assert (cfg.built_by, cfg.skip_cli) == ("trainer", True)
        assert get_global_config_dict() is cfg  # cached as this process's config, as any other
    finally:
        reset_global_config_dict_cache()
