"""`nemo_gym.cli.main:main`: NeMo Gym v0.5's entry point for its `gym` script, here the `gym` router
(`nemo_gym/cli/gym.py`). Our `ng` stays the typer app of `nemo_gym/cli/ng.py`."""

from __future__ import annotations

import sys

from nemo_gym.cli.gym import main as gym_main

__all__ = ["main"]


def main() -> None:
    """The `gym` console script: run the router on the process's arguments and exit with its code."""
    sys.exit(gym_main(sys.argv[1:]))


if __name__ == "__main__":
    main()
