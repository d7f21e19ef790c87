"""`python -m nemo_gym.cli <verb> ...`: the `ng` command, for when the console scripts are not on PATH."""

from nemo_gym.cli.ng import app

app(prog_name="ng")
