"""`ng_e2e_collect_rollouts`: one command from configs to scored rollouts.

Prepares the chosen split of the agents' datasets (`ng_prepare_data`), starts the stack (`ng_run`), collects
rollouts over the prepared rows (`ng_collect_rollouts`, with profiling), and stops the stack, whatever happens.
"""

from __future__ import annotations

import signal
from pathlib import Path
from typing import Any, Literal, Optional

from pydantic import Field

from nemo_gym.config.types import BaseNeMoGymCLIConfig
from nemo_gym.errors import NeMoGymConfigError, NeMoGymStackError


class E2ERolloutCollectionConfig(BaseNeMoGymCLIConfig):
    """Start the stack, prepare a dataset split, collect and profile rollouts, stop the stack.

    Example: ng_e2e_collect_rollouts "+config_paths=[configs/quickstart.yaml]" +split=example
    +output_jsonl_fpath=results/quickstart.jsonl"""

    output_jsonl_fpath: str = Field(description="Where to write the rollouts (JSONL).")
    split: Literal["train", "validation", "example"] = Field(
        description="Which datasets to run: the agents' `train`, `validation` or `example` datasets."
    )
    num_repeats: Optional[int] = Field(default=None, description="Rollouts per row (null = 1).")
    num_samples_in_parallel: Optional[int] = Field(default=None, description="Maximum rollouts in flight.")
    responses_create_params: dict[str, Any] = Field(
        default_factory=dict, description="Merged over every row's responses_create_params."
    )
    limit: Optional[int] = Field(default=None, description="Use only the first `limit` rows.")


def _interrupt(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt


def e2e_collect_rollouts(params: E2ERolloutCollectionConfig, cfg: Any) -> int:
    """Prepare, start, collect, stop; returns the exit code. `cfg` is the global config (ports allocated)."""
    from nemo_gym.config.global_config import get_head_server_config
    from nemo_gym.runtime.launcher import RunHelper, ServerCrashed
    from nemo_gym.rollouts.collection import RolloutCollectionConfig, run_from_config
    from nemo_gym.rollouts.data_prep import TrainDataProcessorConfig, prepare_data

    output = Path(params.output_jsonl_fpath)
    prepared_dir = output.parent / "preprocessed_datasets"
    mode = "example_validation" if params.split == "example" else "train_preparation"
    prepared = prepare_data(TrainDataProcessorConfig(output_dirpath=str(prepared_dir), mode=mode), cfg)
    if params.split not in prepared:
        raise NeMoGymConfigError(
            f"No `{params.split}` datasets in the configured agents (found: {', '.join(sorted(prepared)) or 'none'})."
        )
    input_path = prepared[params.split]
    print(f"Prepared {params.split} data: {input_path}")

    helper = RunHelper(cfg)
    # SIGTERM ends the run like Ctrl-C: the stack is stopped in `finally`.
    previous = signal.signal(signal.SIGTERM, _interrupt)
    try:
        helper.prepare()
        helper.reserve_head_port()
        helper.start_ray()
        helper.start_servers()
        helper.start_head()
        helper.print_ready_table(helper.wait_until_ready())
        collection = RolloutCollectionConfig(
            input_jsonl_fpath=str(input_path),
            output_jsonl_fpath=str(output),
            num_repeats=params.num_repeats,
            num_samples_in_parallel=params.num_samples_in_parallel,
            responses_create_params=params.responses_create_params,
            limit=params.limit,
        )
        return run_from_config(collection, head_server_config=get_head_server_config(cfg))
    except ServerCrashed as exc:
        print(f"ERROR: {exc}", flush=True)
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else "a server crashed"
        raise NeMoGymStackError(f"{first} The full report is above.") from None
    except KeyboardInterrupt:
        return 130
    finally:
        helper.shutdown()
        signal.signal(signal.SIGTERM, previous)
