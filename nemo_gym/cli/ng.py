"""The `ng` command (`ng run`, `ng collect`, `ng help collect`, ...), built from the registry.

Each subcommand hands its arguments untouched to its `Command`, so `ng <verb> ...` and `ng_<name> ...` behave the
same, `--help` included (typer's own per-command help is switched off for that). Typer adds shell completion:
`ng --install-completion`; the overrides of a subcommand complete from its parameters (`ng collect +num<TAB>`).
"""

from __future__ import annotations

from typing import Optional

import typer

from nemo_gym.cli.command import Command
from nemo_gym.cli.commands import COMMANDS

app = typer.Typer(
    name="ng",
    help="nemo_gym: build, run and score RL environments for LLMs. Every command takes +key=value overrides; "
    "`ng help <command>` or `ng <command> --help` shows its parameters.",
    no_args_is_help=True,
    add_completion=True,
)


def completions(command: Command, incomplete: str) -> list[tuple[str, str]]:
    """Candidates for the word being typed: `+name=` for the command's parameters (keeping `++`), or, for a
    command that takes a bare word (`ng help`), the command verbs."""
    if command.positionals and not incomplete.startswith(("+", "~")):
        return [(c.verb, c.summary) for c in COMMANDS if c.verb.startswith(incomplete)]
    if "=" in incomplete:
        return []
    prefix = "++" if incomplete.startswith("++") else "+"
    typed = incomplete.lstrip("+")
    rows = command.config_model.parameter_rows()
    return [(f"{prefix}{key}=", description) for key, _, _, description in rows if key.startswith(typed)]


def _add_subcommand(command: Command) -> None:
    def subcommand(
        overrides: Optional[list[str]] = typer.Argument(
            None,
            metavar="[+key=value]...",
            show_default=False,
            autocompletion=lambda incomplete: completions(command, incomplete),
        ),
    ) -> None:
        raise typer.Exit(command.main(list(overrides or [])))

    app.command(
        command.verb,
        help=command.summary,
        add_help_option=False,  # `--help` goes to the command, which prints the same help as `ng_<name> --help`
        context_settings={"ignore_unknown_options": True},
    )(subcommand)


for _command in COMMANDS:
    _add_subcommand(_command)
