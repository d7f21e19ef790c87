"""`ng_e2e_collect_rollouts`: one command from configs to scored rollouts.

Prepares the chosen split of the agents' datasets (`ng_prepare_data`), starts the stack (`ng_run`), collects
rollouts over the prepared rows (`ng_collect_rollouts`, with profiling), and stops the stack, whatever happens.

`+split=benchmark` (NeMo Gym v0.5) runs the benchmark datasets: their data is made first by their prepare scripts
when the file is not there yet (`ng_prepare_benchmark` in cached mode; our benchmark data is generated offline), then
collated alone (only the benchmark datasets, so a config that also lists training data need not have it).
`+reuse_existing_data_preparation=true` skips preparation when `<output dir>/preprocessed_datasets/<split>.jsonl`
already exists.
"""

from __future__ import annotations

import signal
from pathlib import Path
from typing import Any, Literal, Optional, Union

from pydantic import Field

from nemo_gym.config.types import BaseNeMoGymCLIConfig
from nemo_gym.rollouts.data_prep import TrainDataProcessorConfig
from nemo_gym.errors import NeMoGymConfigError, NeMoGymStackError


class E2ERolloutCollectionConfig(BaseNeMoGymCLIConfig):
    """Start the stack, prepare a dataset split, collect and profile rollouts, stop the stack.

    Example: ng_e2e_collect_rollouts "+config_paths=[configs/quickstart.yaml]" +split=example
    +output_jsonl_fpath=results/quickstart.jsonl

    A benchmark (ng_list_benchmarks lists them; its data is prepared first when missing):
    ng_e2e_collect_rollouts "+config_paths=[benchmarks/arithmetic/config.yaml,
    responses_api_models/local_llama_model/configs/local_llama_model.yaml]" +split=benchmark
    +output_jsonl_fpath=results/arithmetic/rollouts.jsonl"""

    output_jsonl_fpath: str = Field(description="Where to write the rollouts (JSONL).")
    split: Literal["train", "validation", "example", "benchmark"] = Field(
        description="Which datasets to run: the agents' `train`, `validation`, `example` or `benchmark` datasets."
    )
    reuse_existing_data_preparation: bool = Field(
        default=False,
        description="Skip data preparation when <output dir>/preprocessed_datasets/<split>.jsonl already exists.",
    )
    num_repeats: Optional[Union[int, dict[str, int]]] = Field(
        default=None, description="Rollouts per row (null = 1), or per agent: {agent_name: n, _default: n}."
    )
    num_repeats_add_seed: bool = Field(
        default=False, description="Set responses_create_params.seed to the rollout index of each repeat."
    )
    num_samples_in_parallel: Optional[int] = Field(default=None, description="Maximum rollouts in flight.")
    responses_create_params: dict[str, Any] = Field(
        default_factory=dict, description="Merged over every row's responses_create_params."
    )
    limit: Optional[int] = Field(default=None, description="Use only the first `limit` rows.")


def _interrupt(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt


class _BenchmarkDataConfig(TrainDataProcessorConfig):
    """Collation of the benchmark datasets only (the `train_preparation` mode would also want the training files)."""

    @property
    def in_scope_dataset_types(self) -> tuple[str, ...]:
        return ("benchmark",)


def prepare_split(params: E2ERolloutCollectionConfig, cfg: Any) -> Path:
    """The collated rows of `params.split` (`<output dir>/preprocessed_datasets/<split>.jsonl`), prepared now unless
    `reuse_existing_data_preparation` finds them already there."""
    from nemo_gym.rollouts.data_prep import prepare_data

    prepared_dir = Path(params.output_jsonl_fpath).parent / "preprocessed_datasets"
    existing = prepared_dir / f"{params.split}.jsonl"
    if params.reuse_existing_data_preparation and existing.is_file():
        print(f"Reusing the prepared {params.split} data: {existing}")
        return existing
    if params.split == "benchmark":
        from nemo_gym.rollouts.benchmarks import PrepareBenchmarkConfig, prepare_benchmarks

        prepare_benchmarks(PrepareBenchmarkConfig(use_cached_prepared_benchmarks=True), cfg)
        data_config: TrainDataProcessorConfig = _BenchmarkDataConfig(
            output_dirpath=str(prepared_dir), mode="train_preparation"
        )
    else:
        mode = "example_validation" if params.split == "example" else "train_preparation"
        data_config = TrainDataProcessorConfig(output_dirpath=str(prepared_dir), mode=mode)
    prepared = prepare_data(data_config, cfg)
    if params.split not in prepared:
        raise NeMoGymConfigError(
            f"No `{params.split}` datasets in the configured agents (found: {', '.join(sorted(prepared)) or 'none'})."
        )
    print(f"Prepared {params.split} data: {prepared[params.split]}")
    return prepared[params.split]


def e2e_collect_rollouts(params: E2ERolloutCollectionConfig, cfg: Any) -> int:
    """Prepare, start, collect, stop; returns the exit code. `cfg` is the global config (ports allocated)."""
    from nemo_gym.config.global_config import get_head_server_config
    from nemo_gym.runtime.launcher import RunHelper, ServerCrashed
    from nemo_gym.rollouts.collection import RolloutCollectionConfig, run_from_config

    output = Path(params.output_jsonl_fpath)
    input_path = prepare_split(params, cfg)

    helper = RunHelper(cfg)
    # SIGTERM ends the run like Ctrl-C: the stack is stopped in `finally`.
    previous = signal.signal(signal.SIGTERM, _interrupt)
    try:
        helper.start()  # ng_run's start: every server healthy, and each model server's backend answering
        collection = RolloutCollectionConfig(
            input_jsonl_fpath=str(input_path),
            output_jsonl_fpath=str(output),
            num_repeats=params.num_repeats,
            num_repeats_add_seed=params.num_repeats_add_seed,
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
