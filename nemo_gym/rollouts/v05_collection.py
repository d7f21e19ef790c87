"""NeMo Gym v0.5's `nemo_gym.rollout_collection` names that our collector spells differently, so that code written
against v0.5 (driver-style resources servers and agents that subclass its configs, scripts that aggregate shards
from Python, its CLI's lazy names) runs unchanged. Each is a thin face over our own code:

- `SharedRolloutCollectionConfig`: v0.5's base of the collection configs (output file, parallelism, create-params
  overrides, aggregation switch) for configs of one's own; its fields are `RolloutCollectionConfig`'s.
- `loads_jsonl_line(raw, fpath, line_no)`: one JSONL line, or a `ConfigError` naming the file and line.
- `RolloutAggregationHelper().run_from_config(config)`: `ng_aggregate_rollouts` awaited from Python; returns the
  `<stem>_aggregate_metrics.json` it wrote.
- `collect_rollouts` / `aggregate_rollouts`: v0.5 moved these entry points to its CLI and left a deprecated lazy
  name behind; ours are the CLI's console scripts.
"""

from __future__ import annotations

import asyncio
import warnings
from pathlib import Path
from typing import Any, Optional, Union

import orjson
from pydantic import BaseModel, ConfigDict, Field
from pydantic.fields import FieldInfo

from nemo_gym.config.types import BaseNeMoGymCLIConfig
from nemo_gym.errors import ConfigError
from nemo_gym.rollouts.aggregation import RolloutAggregationConfig, aggregate_rollouts_from_config
from nemo_gym.rollouts.collection import RolloutCollectionConfig

__all__ = ["SharedRolloutCollectionConfig", "loads_jsonl_line", "RolloutAggregationHelper", "moved_to_cli"]


def _collection_field(name: str) -> FieldInfo:
    """`RolloutCollectionConfig`'s field (default and description), so the two configs never drift apart."""
    return RolloutCollectionConfig.model_fields[name]


class SharedRolloutCollectionConfig(BaseNeMoGymCLIConfig):
    """The settings every rollout collection has (NeMo Gym v0.5's base class of its collection configs): subclass it
    for a collection driver's own config. `upload_rollouts_to_wandb` is accepted for v0.5 configs; nemo_gym uploads
    nothing to W&B."""

    output_jsonl_fpath: str = _collection_field("output_jsonl_fpath")
    num_samples_in_parallel: Optional[int] = _collection_field("num_samples_in_parallel")
    responses_create_params: dict[str, Any] = _collection_field("responses_create_params")
    disable_aggregation: bool = _collection_field("disable_aggregation")
    upload_rollouts_to_wandb: bool = Field(
        default=True, description="Accepted as in NeMo Gym v0.5; nemo_gym does not upload rollouts to W&B."
    )


def loads_jsonl_line(raw: Union[str, bytes], fpath: Any, line_no: int) -> Any:
    """The JSON value on one line of a JSONL file; a line that is not JSON raises `ConfigError` naming the file and
    the line, so a hand-edited input row is found at once."""
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise ConfigError(f"Malformed JSON in '{fpath}' at line {line_no}: {exc}. Fix or remove that line.") from None


class RolloutAggregationHelper(BaseModel):
    """Aggregate rollout shards from Python, as `ng_aggregate_rollouts` does: merge them (`merge_shards`) and ask each
    agent of the running stack for `/aggregate_metrics`. `server_client` defaults to the running stack's."""

    model_config = ConfigDict(arbitrary_types_allowed=True)

    server_client: Any = None

    async def run_from_config(self, config: RolloutAggregationConfig) -> Optional[Path]:
        """Run the aggregation (in a worker thread, so it can be awaited from a running loop) and return the
        `<stem>_aggregate_metrics.json` written, or None when no agent gave metrics. An agent that failed to answer
        raises `RuntimeError` (the command's stderr names it), as v0.5's helper raises for its HTTP error."""

        def connect() -> Any:
            from nemo_gym.http.client import ServerClient

            return ServerClient.load_from_global_config()

        exit_code = await asyncio.to_thread(
            aggregate_rollouts_from_config, config, server_client=self.server_client, connect=connect
        )
        output = Path(config.output_jsonl_fpath).expanduser()
        metrics_path = output.with_name(f"{output.stem}_aggregate_metrics.json")
        if exit_code != 0:
            raise RuntimeError(
                f"aggregating {config.input_glob} gave no metrics for some agent (see the errors above); "
                f"check that the stack that collected these rollouts is running"
            )
        return metrics_path if metrics_path.exists() else None


def moved_to_cli(name: str) -> Any:
    """v0.5's `nemo_gym.rollout_collection.<name>` for an entry point that now lives in the CLI: the CLI's console
    script, with the `DeprecationWarning` v0.5 gives."""
    from nemo_gym import cli

    warnings.warn(
        f"nemo_gym.rollout_collection.{name} is deprecated: use the `ng_{name}` command (nemo_gym.cli.{name})",
        DeprecationWarning,
        stacklevel=3,
    )
    return getattr(cli, name)
