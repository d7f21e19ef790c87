"""`ng_help` / `ng help [command]`: list every command, or print one command's help."""

from __future__ import annotations

import sys
from typing import Optional

from pydantic import Field

from nemo_gym.cli.command import Command
from nemo_gym.config.types import BaseNeMoGymCLIConfig
from nemo_gym.errors import NeMoGymConfigError, did_you_mean


class HelpConfig(BaseNeMoGymCLIConfig):
    """Without a command: every command with its summary. With one: that command's help, the same text as
    `ng_<name> +h=true` and `ng <verb> --help`."""

    command: Optional[str] = Field(
        default=None, description="A command, by its ng verb (collect) or name (collect_rollouts, ng_collect_rollouts)."
    )


def listing() -> str:
    """Every command in registry order: its `ng` verb, its `ng_` script and its summary."""
    from nemo_gym.cli.commands import COMMANDS

    lines = [
        "nemo_gym commands. Each runs as `ng <verb>`, `ng_<name>` or `nemo_gym_<name>`; pass +h=true or --help to any",
        "of them (or run `ng help <verb>`) for its parameters.",
        "",
    ]
    verb_w = max(len(c.verb) for c in COMMANDS) + 3
    script_w = max(len(c.script) for c in COMMANDS)
    lines += [f"  ng {c.verb:<{verb_w}}{c.script:<{script_w}}  {c.summary}" for c in COMMANDS]
    lines += ["", "Shell completion for ng: ng --install-completion (or ng --show-completion to see the script)."]
    return "\n".join(lines) + "\n"


def run(config: HelpConfig) -> int:
    from nemo_gym.cli.commands import COMMANDS, find_command

    if config.command is None:
        sys.stdout.write(listing())
        return 0
    command = find_command(config.command)
    if command is None:
        verbs = [c.verb for c in COMMANDS]
        raise NeMoGymConfigError(
            f"no command `{config.command}`.{did_you_mean(config.command, verbs)} Commands: {', '.join(verbs)}."
        )
    sys.stdout.write(command.help_text())
    return 0


COMMAND = Command(
    name="help",
    verb="help",
    summary="List the commands, or show one command's parameters (ng help collect).",
    model=HelpConfig,
    run=run,
    reads_config_files=False,
    positionals=("command",),
    examples=("ng help", "ng help collect", "ng_help collect_rollouts"),
)
