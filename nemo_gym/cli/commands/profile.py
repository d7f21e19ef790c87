"""`ng_reward_profile` / `ng profile`: reward statistics of a rollouts file, per task and per agent."""

from __future__ import annotations

from pathlib import Path

from nemo_gym.cli.command import Command
from nemo_gym.errors import NeMoGymConfigError


def _existing_file(path_str: str, key: str) -> Path:
    path = Path(path_str).expanduser()
    if not path.is_file():
        raise NeMoGymConfigError(f"File not found: {path} (+{key}).")
    return path


def run(config) -> int:
    from nemo_gym.rollouts.reward_profile import print_profile_table, profile_rollouts

    materialized = _existing_file(config.materialized_inputs_jsonl_fpath, "materialized_inputs_jsonl_fpath")
    rollouts = _existing_file(config.rollouts_jsonl_fpath, "rollouts_jsonl_fpath")
    summary = profile_rollouts(materialized, rollouts, pass_threshold=config.pass_threshold)
    print_profile_table(summary)
    print(f"Reward profiling: {summary.reward_profiling_path}")
    print(f"Agent metrics:    {summary.agent_metrics_path}")
    return 0


COMMAND = Command(
    name="reward_profile",
    verb="profile",
    summary="Compute per-task and per-agent reward statistics from rollouts.",
    model="nemo_gym.rollouts.reward_profile:RewardProfileConfig",
    run=run,
    examples=(
        "ng_reward_profile +materialized_inputs_jsonl_fpath=results/rollouts_materialized_inputs.jsonl "
        "+rollouts_jsonl_fpath=results/rollouts.jsonl",
    ),
)
