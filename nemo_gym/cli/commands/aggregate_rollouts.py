"""`ng_aggregate_rollouts` / `ng aggregate` (v0.5's `gym eval aggregate`): aggregate metrics of rollout files written
earlier, from the agents of a running stack."""

from __future__ import annotations

from nemo_gym.cli.command import Command


def run(config) -> int:
    from nemo_gym.config.global_config import get_head_server_config
    from nemo_gym.errors import NeMoGymStackError
    from nemo_gym.http.client import ServerClient
    from nemo_gym.rollouts.aggregation import aggregate_rollouts_from_config

    def connect() -> ServerClient:
        try:
            return ServerClient.load_from_global_config(get_head_server_config(config.global_config))
        except ValueError as exc:  # no stack on that port: one line, exit 1
            raise NeMoGymStackError(str(exc)) from None

    return aggregate_rollouts_from_config(config, connect=connect)


COMMAND = Command(
    name="aggregate_rollouts",
    verb="aggregate",
    summary="Ask each agent of the running stack for /aggregate_metrics over rollout files (shards) written earlier.",
    model="nemo_gym.rollouts.aggregation:RolloutAggregationConfig",
    run=run,
    examples=(
        'ng_aggregate_rollouts "+input_glob=results/shard*.jsonl" +output_jsonl_fpath=results/all.jsonl',
        'ng aggregate "+input_glob=results/a/*.jsonl,results/b/*.jsonl" +output_jsonl_fpath=results/all.jsonl '
        "+merge_shards=false",
    ),
)
