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
    Shows each server's state (ready, restarting, failed), restarts, last exit code and uptime, then NeMo Gym's
    count line `N servers found (H healthy, U unhealthy)` (job scripts wait for `0 unhealthy`).
    Exits 1 when a server is unhealthy or failed, or no server is found (`No NeMo Gym servers found running.`)."""

    head_server: HeadServerKeys = Field(
        default_factory=HeadServerKeys,
        description="The stack's head server: +head_server.host=... +head_server.port=...",
    )
    json_output: bool = Field(
        default=False, alias="json", description="Print the servers as a JSON array instead of a table."
    )


def run(config: StatusConfig) -> int:
    from nemo_gym.runtime.status import NO_SERVERS_LINE, fetch_status, print_status

    try:
        instances = fetch_status(config.head_server.host, config.head_server.port)
    except ConnectionError:  # stdout says what NeMo Gym says; the error line on stderr gives the hint, exit 1
        print("[]" if config.json_output else NO_SERVERS_LINE)
        raise
    if config.json_output:
        print(json.dumps(instances, indent=2, default=str))
    elif instances:
        print_status(instances, sys.stdout)
    else:  # a head server without servers: no count line, which a job script would take for a ready stack
        print(NO_SERVERS_LINE)
    return 0 if instances and all(i["healthy"] for i in instances) else 1


COMMAND = Command(
    name="status",
    verb="status",
    summary="Show the servers of a running stack and their health (asks the head server).",
    model=StatusConfig,
    run=run,
    examples=("ng_status", "ng_status +head_server.port=12000"),
)
