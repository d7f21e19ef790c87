"""`ng_init_resources_server` / `ng init`: scaffold a new resources server that passes its tests from the start."""

from __future__ import annotations

import sys
from pathlib import Path

from nemo_gym.cli.command import Command


def run(config) -> int:
    from nemo_gym.authoring.scaffold import next_steps, scaffold_resources_server

    target = scaffold_resources_server(config.entrypoint)
    sys.stdout.write(next_steps(target, Path.cwd()))
    return 0


COMMAND = Command(
    name="init_resources_server",
    verb="init",
    summary="Scaffold a new resources server.",
    model="nemo_gym.authoring.scaffold:InitResourcesServerConfig",
    run=run,
    reads_config_files=False,  # only its own parameter: a new server needs no config files (nor env.yaml)
)
