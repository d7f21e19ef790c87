"""The command line: `ng <verb>`, `ng_<name>` and `nemo_gym_<name>`.

Where things are:
- `command.py`: what a command is (`Command`: config model + `run(config) -> exit code`) and everything every
  command does the same way: help, config parsing, the unknown-key check, errors and exit codes.
- `commands/`: one module per command, and the registry (`commands/__init__.py`) that lists them. A new command
  goes there.
- `ng.py`: the typer app `ng`, one subcommand per registered command, with shell completion.
- this module: the console-script targets of pyproject.toml (`nemo_gym.cli:<name>`), made from the registry.
"""

from __future__ import annotations

from nemo_gym.cli.command import Command
from nemo_gym.cli.commands import BY_NAME, COMMANDS, find_command
from nemo_gym.cli.ng import app

__all__ = ["Command", "COMMANDS", "BY_NAME", "find_command", "app", "RunHelper", "GlobalConfigDictParserConfig"]

# `nemo_gym.cli:<name>` for every command: run, collect_rollouts, status, ...
globals().update({command.name: command.console_script() for command in COMMANDS})

# Targets under the names NeMo Gym v0.2's pyproject.toml used.
display_help = BY_NAME["help"].console_script()
e2e_rollout_collection = BY_NAME["e2e_collect_rollouts"].console_script()

# Trainers (NeMo RL, TRL's in-process example) start a stack in their own process with
# `from nemo_gym.cli import GlobalConfigDictParserConfig, RunHelper`; looked up on first use, so a command's start
# does not pay for the launcher.
_IN_PROCESS_NAMES = {
    "RunHelper": "nemo_gym.runtime.launcher",
    "GlobalConfigDictParserConfig": "nemo_gym.config.global_config",
}


def __getattr__(name: str):
    module = _IN_PROCESS_NAMES.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(module), name)
