"""NeMo Gym v0.2/v0.5 import path for `BaseServer` / `SimpleServer`, `SESSION_ID_KEY`, the HTTP helpers and the names
trainers import from it when they start a stack in their own process (`HEAD_SERVER_KEY_NAME`, `BaseServerConfig`,
`get_global_config_dict`, the global aiohttp client's setup).

The code lives in `nemo_gym.servers.base` (servers, `raise_for_status`, `get_response_json`,
`is_nemo_gym_fastapi_entrypoint`), `nemo_gym.http.client` (`get_server_url`), `nemo_gym.http.external` (v0.5's
`request`, `setup_server_client` and the global aiohttp client), `nemo_gym.config.global_config` (the config names
v0.5's module imported and so exposed) and `nemo_gym.servers.rollout_context` (`rollout_path_prefix`,
`apply_rollout_prefix`).
"""

from nemo_gym.servers.base import *  # noqa: F401,F403
from nemo_gym.servers import base as _base
from nemo_gym.config.global_config import (
    DEFAULT_HEAD_SERVER_PORT,
    DRY_RUN_KEY_NAME,
    HEAD_SERVER_KEY_NAME,
    NEMO_GYM_CONFIG_DICT_ENV_VAR_NAME,
    NEMO_GYM_CONFIG_PATH_ENV_VAR_NAME,
    RAY_HEAD_NODE_ADDRESS_KEY_NAME,
    GlobalConfigDictParser,
    GlobalConfigDictParserConfig,
    get_first_server_config_dict,
    get_global_config_dict,
)
from nemo_gym.http.client import get_server_url
from nemo_gym.http.external import (
    MAX_NUM_TRIES,
    GlobalAIOHTTPAsyncClientConfig,
    get_global_aiohttp_client,
    global_aiohttp_client_exit,
    is_global_aiohttp_client_request_debug_enabled,
    is_global_aiohttp_client_setup,
    request,
    set_global_aiohttp_client,
    setup_server_client,
)
from nemo_gym.servers.rollout_context import apply_rollout_prefix, rollout_path_prefix

__all__ = [
    *_base.__all__,
    "DEFAULT_HEAD_SERVER_PORT",
    "DRY_RUN_KEY_NAME",
    "HEAD_SERVER_KEY_NAME",
    "NEMO_GYM_CONFIG_DICT_ENV_VAR_NAME",
    "NEMO_GYM_CONFIG_PATH_ENV_VAR_NAME",
    "RAY_HEAD_NODE_ADDRESS_KEY_NAME",
    "GlobalConfigDictParser",
    "GlobalConfigDictParserConfig",
    "get_first_server_config_dict",
    "get_global_config_dict",
    "get_server_url",
    "MAX_NUM_TRIES",
    "request",
    "setup_server_client",
    "GlobalAIOHTTPAsyncClientConfig",
    "set_global_aiohttp_client",
    "is_global_aiohttp_client_setup",
    "get_global_aiohttp_client",
    "is_global_aiohttp_client_request_debug_enabled",
    "global_aiohttp_client_exit",
    "rollout_path_prefix",
    "apply_rollout_prefix",
]
