"""`ng_dump_config` / `ng dump-config`: print the merged, resolved global config with secrets masked."""

from __future__ import annotations

import sys

from nemo_gym.cli.command import Command
from nemo_gym.config.types import BaseNeMoGymCLIConfig


class DumpConfigConfig(BaseNeMoGymCLIConfig):
    """Merge the config files, env.yaml and the command line exactly as ng_run would, resolve every
    interpolation, and print the result as YAML, with secrets (keys ending in key, token, secret, password)
    masked. Ports that the config leaves unset are shown unset: ng_run chooses them at launch."""


def run(config: DumpConfigConfig) -> int:
    from nemo_gym.config.global_config import dump_config_yaml

    sys.stdout.write(dump_config_yaml(config.global_config, resolve=True, mask=True))
    return 0


COMMAND = Command(
    name="dump_config",
    verb="dump-config",
    summary="Print the merged, resolved global config with secrets masked.",
    model=DumpConfigConfig,
    run=run,
    examples=('ng_dump_config "+config_paths=[configs/quickstart.yaml]"',),
)
