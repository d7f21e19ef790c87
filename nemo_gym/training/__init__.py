"""The Python API for RL trainers (docs/training.md).

    from nemo_gym.training import RolloutClient

    client = await RolloutClient.attach("http://127.0.0.1:11000", max_in_flight=64)
    async for group in client.rollouts(tasks, num_repeats=8):
        rewards = group.rewards                      # one per repeat (None for a failed rollout)
        for rollout in group.rollouts:
            rollout.trajectory                       # prompt_ids, completion_ids, logprobs, loss_mask (training mode)
    await client.aclose()

`SyncRolloutClient` is the same for synchronous trainers. Modules: `client` (the async client), `sync` (the
synchronous one), `rollout` (what comes back), `tasks` (checking tasks), `stack` (ng_run as a child process).
"""

from nemo_gym.training.client import DEFAULT_HEAD_SERVER, DEFAULT_MAX_IN_FLIGHT, RolloutClient
from nemo_gym.training.rollout import Rollout, RolloutFailure, RolloutGroup, Trajectory
from nemo_gym.training.sync import SyncRolloutClient
from nemo_gym.training.tasks import InvalidTask

__all__ = [
    "RolloutClient",
    "SyncRolloutClient",
    "Rollout",
    "RolloutGroup",
    "RolloutFailure",
    "Trajectory",
    "InvalidTask",
    "DEFAULT_HEAD_SERVER",
    "DEFAULT_MAX_IN_FLIGHT",
]
