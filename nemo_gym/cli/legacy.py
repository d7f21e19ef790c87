"""`nemo_gym.cli.legacy:main`: NeMo Gym v0.5's one entry point for every `ng_*` / `nemo_gym_*` script.

It picks the command by the name the script was started as (argv[0]) and runs it with the same arguments, with no
deprecation notice: on this framework the `ng_*` scripts are not deprecated. A name with no command of its own but
a `gym` action (`ng_pip_list`, `ng_dev_test`, the dataset hub scripts) re-enters the `gym` router.
"""

from __future__ import annotations

import os
import sys
from typing import Optional, Sequence

# v0.5 script names (without ng_ / nemo_gym_) that are `gym` actions rather than registered commands.
GYM_ALIASES: dict[str, list[str]] = {
    "pip_list": ["env", "packages"],
    "dev_test": ["dev", "test"],
    "upload_dataset_to_gitlab": ["dataset", "upload"],
    "download_dataset_from_gitlab": ["dataset", "download"],
    "upload_dataset_to_hf": ["dataset", "upload"],
    "download_dataset_from_hf": ["dataset", "download"],
    "gitlab_to_hf_dataset": ["dataset", "migrate"],
    "delete_dataset_from_gitlab": ["dataset", "rm"],
}


def script_name(argv0: str) -> str:
    """`/venv/bin/ng_run` -> `run`; `nemo_gym_collect_rollouts` -> `collect_rollouts`."""
    name = os.path.basename(argv0)
    for prefix in ("ng_", "nemo_gym_"):
        if name.startswith(prefix):
            return name[len(prefix):]
    return name


def dispatch(argv0: str, args: Sequence[str]) -> int:
    """Run the command the script `argv0` stands for with `args`; returns the exit code."""
    from nemo_gym.cli.commands import BY_NAME
    from nemo_gym.cli.gym import main as gym_main

    name = script_name(argv0)
    if name in BY_NAME:
        return BY_NAME[name].main(list(args))
    if name in GYM_ALIASES:
        return gym_main([*GYM_ALIASES[name], *args])
    from nemo_gym.errors import did_you_mean

    known = [f"ng_{k}" for k in (*BY_NAME, *GYM_ALIASES)]
    sys.stderr.write(
        f"error: {os.path.basename(argv0)}: no such command here.{did_you_mean('ng_' + name, known)} "
        f"Commands: {', '.join(known)}; or run `gym --help`.\n"
    )
    return 1


def main(argv: Optional[Sequence[str]] = None) -> None:
    """The console script: the command is chosen by the script's own name."""
    argv = list(sys.argv if argv is None else argv)
    sys.exit(dispatch(argv[0] if argv else "", argv[1:]))
