"""NeMo Gym v0.2/v0.5 import path for `BaseServer` / `SimpleServer`, `SESSION_ID_KEY` and the HTTP helpers.

The code lives in `nemo_gym.servers.base` (servers, `raise_for_status`, `get_response_json`,
`is_nemo_gym_fastapi_entrypoint`), `nemo_gym.http.client` (`get_server_url`), `nemo_gym.http.external` (v0.5's
`request`, `setup_server_client` and the global aiohttp client) and `nemo_gym.servers.rollout_context`
(`rollout_path_prefix`, `apply_rollout_prefix`).
"""

from nemo_gym.servers.base import *  # noqa: F401,F403
from nemo_gym.servers import base as _base
from nemo_gym.http.client import get_server_url
from nemo_gym.http.external import (
    get_global_aiohttp_client,
    global_aiohttp_client_exit,
    is_global_aiohttp_client_request_debug_enabled,
    request,
    setup_server_client,
)
from nemo_gym.servers.rollout_context import apply_rollout_prefix, rollout_path_prefix

__all__ = [
    *_base.__all__,
    "get_server_url",
    "request",
    "setup_server_client",
    "get_global_aiohttp_client",
    "is_global_aiohttp_client_request_debug_enabled",
    "global_aiohttp_client_exit",
    "rollout_path_prefix",
    "apply_rollout_prefix",
]
