"""The registry: every command of the CLI, one module each, in the order `ng help` lists them.

To add a command: write `nemo_gym/cli/commands/<verb>.py` with its config model, a `run(config) -> exit code` and a
`COMMAND = Command(...)`, list it in `COMMANDS` below, and add `ng_<name>` / `nemo_gym_<name>` to
`[project.scripts]` in pyproject.toml (target `nemo_gym.cli:<name>`). `ng <verb>`, the help and the checks follow.
"""

from __future__ import annotations

from typing import Optional

from nemo_gym.cli.command import Command
from nemo_gym.cli.commands import (
    aggregate_rollouts,
    collect,
    dump_config,
    e2e_collect,
    export,
    help,
    init,
    list_benchmarks,
    materialize_prompts,
    merge,
    prepare_benchmark,
    prepare_data,
    profile,
    reverify,
    run,
    status,
    test,
    validate,
    version,
    view,
)

COMMANDS: tuple[Command, ...] = (
    run.COMMAND,
    collect.COMMAND,
    e2e_collect.COMMAND,
    status.COMMAND,
    dump_config.COMMAND,
    help.COMMAND,
    version.COMMAND,
    test.TEST,
    test.TEST_ALL,
    init.COMMAND,
    profile.COMMAND,
    aggregate_rollouts.COMMAND,
    merge.COMMAND,
    prepare_data.COMMAND,
    materialize_prompts.COMMAND,
    validate.COMMAND,
    list_benchmarks.COMMAND,
    list_benchmarks.ENVIRONMENTS,
    prepare_benchmark.COMMAND,
    reverify.COMMAND,
    export.COMMAND,
    view.COMMAND,
)

BY_NAME: dict[str, Command] = {c.name: c for c in COMMANDS}


def find_command(word: str) -> Optional[Command]:
    """A command by its verb (`collect`), name (`collect_rollouts`) or script (`ng_collect_rollouts`)."""
    word = word.strip()
    for prefix in ("ng_", "nemo_gym_"):
        if word.startswith(prefix) and word[len(prefix) :] in BY_NAME:
            return BY_NAME[word[len(prefix) :]]
    return BY_NAME.get(word) or next((c for c in COMMANDS if c.verb == word), None)
