"""`ng_collect_rollouts` / `ng collect`: run an agent over a JSONL file of tasks on a running stack."""

from __future__ import annotations

from nemo_gym.cli.command import Command


def run(config) -> int:
    from nemo_gym.config.global_config import get_head_server_config
    from nemo_gym.errors import NeMoGymStackError
    from nemo_gym.http.client import ServerClient
    from nemo_gym.rollouts.collection import run_from_config

    try:
        client = ServerClient.load_from_global_config(get_head_server_config(config.global_config))
    except ValueError as exc:  # no stack on that port: one line, exit 1
        raise NeMoGymStackError(str(exc)) from None
    return run_from_config(config, server_client=client)


COMMAND = Command(
    name="collect_rollouts",
    verb="collect",
    summary="Run an agent over a JSONL file of tasks and write rollouts with rewards.",
    model="nemo_gym.rollouts.collection:RolloutCollectionConfig",
    run=run,
)
