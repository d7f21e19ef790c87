"""`ng_e2e_collect_rollouts` / `ng e2e-collect`: prepare data, start the stack, collect and profile, stop."""

from __future__ import annotations

from nemo_gym.cli.command import Command
from nemo_gym.rollouts.data_prep import POLICY_PLACEHOLDERS


def run(config) -> int:
    from nemo_gym.rollouts.e2e import e2e_collect_rollouts

    return e2e_collect_rollouts(config, config.global_config)


COMMAND = Command(
    name="e2e_collect_rollouts",
    verb="e2e-collect",
    summary="Start the stack, prepare data, collect rollouts, profile, stop.",
    model="nemo_gym.rollouts.e2e:E2ERolloutCollectionConfig",
    run=run,
    allocate_ports=True,
    initial_config=POLICY_PLACEHOLDERS,
)
