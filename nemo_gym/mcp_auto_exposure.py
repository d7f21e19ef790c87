"""NeMo Gym v0.5 import path for serving a resources server's tools over MCP (`maybe_auto_expose`,
`install_auto_exposure`, `TOKEN_HEADER`, ...).

The code lives in `nemo_gym.servers.mcp_exposure`.
"""

from nemo_gym.servers.mcp_exposure import *  # noqa: F401,F403
from nemo_gym.servers import mcp_exposure as _mcp_exposure

__all__ = [*_mcp_exposure.__all__]
