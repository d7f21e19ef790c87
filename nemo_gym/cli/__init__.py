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

__all__ = ["Command", "COMMANDS", "BY_NAME", "find_command", "app"]

# `nemo_gym.cli:<name>` for every command: run, collect_rollouts, status, ...
globals().update({command.name: command.console_script() for command in COMMANDS})

# Targets under the names NeMo Gym v0.2's pyproject.toml used.
display_help = BY_NAME["help"].console_script()
e2e_rollout_collection = BY_NAME["e2e_collect_rollouts"].console_script()
