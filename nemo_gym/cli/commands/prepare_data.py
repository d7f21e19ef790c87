"""`ng_prepare_data` / `ng prepare-data`: validate the agents' datasets, measure them, write collated data."""

from __future__ import annotations

from nemo_gym.cli.command import Command
from nemo_gym.rollouts.data_prep import POLICY_PLACEHOLDERS


def run(config) -> int:
    from nemo_gym.rollouts.data_prep import prepare_data

    prepare_data(config, config.global_config)
    return 0


COMMAND = Command(
    name="prepare_data",
    verb="prepare-data",
    summary="Validate datasets and write collated training data.",
    model="nemo_gym.rollouts.data_prep:TrainDataProcessorConfig",
    run=run,
    initial_config=POLICY_PLACEHOLDERS,  # no model is needed: the policy_* keys the model configs read are blank
)
