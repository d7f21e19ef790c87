"""Gymnasium-style (reset / step) environments: the base server and its request models (`base.py`)."""

from resources_servers.gymnasium.base import (
    EnvResetRequest,
    EnvResetResponse,
    EnvStepRequest,
    EnvStepResponse,
    GymnasiumServer,
    extract_text,
    tool_output,
)

__all__ = [
    "EnvResetRequest",
    "EnvResetResponse",
    "EnvStepRequest",
    "EnvStepResponse",
    "GymnasiumServer",
    "extract_text",
    "tool_output",
]
