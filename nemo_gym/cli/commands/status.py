"""`ng_status` / `ng status`: which servers a running stack has, and whether each answers /health."""

from __future__ import annotations

import json
import sys

from pydantic import Field

from nemo_gym.cli.command import Command
from nemo_gym.config.known_keys import HeadServerKeys
from nemo_gym.config.types import BaseNeMoGymCLIConfig


class StatusConfig(BaseNeMoGymCLIConfig):
    """Ask the head server of a running stack for its servers, check each one's /health and print a table.
    Shows each server's state (ready, restarting, failed), restarts, last exit code and uptime.
    Exits 1 when a server is unhealthy or failed, or no head server answers."""

    head_server: HeadServerKeys = Field(
        default_factory=HeadServerKeys,
        description="The stack's head server: +head_server.host=... +head_server.port=...",
    )
    json_output: bool = Field(
        default=False, alias="json", description="Print the servers as a JSON array instead of a table."
    )


def run(config: StatusConfig) -> int:
    from nemo_gym.runtime.status import fetch_status, print_status

    instances = fetch_status(config.head_server.host, config.head_server.port)  # ConnectionError: exit 1 with a hint
    if config.json_output:
        print(json.dumps(instances, indent=2, default=str))
    else:
        print_status(instances, sys.stdout)
    return 0 if all(i["healthy"] for i in instances) else 1


COMMAND = Command(
    name="status",
    verb="status",
    summary="Show the servers of a running stack and their health (asks the head server).",
    model=StatusConfig,
    run=run,
    examples=("ng_status", "ng_status +head_server.port=12000"),
)
