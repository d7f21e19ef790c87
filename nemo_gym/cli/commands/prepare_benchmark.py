"""`ng_prepare_benchmark` / `ng prepare-benchmark`: write the data of the benchmark datasets in the config by running
their prepare scripts (`nemo_gym.rollouts.benchmarks.prepare_benchmarks`).

No model is called, so a benchmark definition alone is enough (`gym eval prepare --benchmark NAME`, as in NeMo Gym
v0.5): when the config refers to a `policy_model` it does not define, the never-started stand-in of `ng_validate`
fills in for it.
"""

from __future__ import annotations

import dataclasses

from nemo_gym.cli.command import Command
from nemo_gym.errors import NeMoGymConfigError
from nemo_gym.rollouts.data_prep import POLICY_PLACEHOLDERS


def run(config) -> int:
    from nemo_gym.rollouts.benchmarks import prepare_benchmarks

    paths = prepare_benchmarks(config, config.global_config)
    print(f"{len(paths)} benchmark dataset(s) ready: {', '.join(str(p) for p in paths)}")
    return 0


def _lacks_policy_model(err: NeMoGymConfigError) -> bool:
    text = str(err)
    return "`policy_model`" in text and "does not exist" in text


@dataclasses.dataclass(frozen=True)
class _PrepareCommand(Command):
    """A `Command` that retries a config lacking only its policy model with a placeholder model block."""

    def _main(self, args: list[str]) -> int:
        try:
            return super()._main(args)
        except NeMoGymConfigError as err:
            if not _lacks_policy_model(err):
                raise
            from nemo_gym.cli.commands.validate import placeholder_policy_model

            started: list[bool] = []

            def run_with_stand_in(config) -> int:
                started.append(True)
                return self.run(config)

            stand_in = dataclasses.replace(
                self, initial_config={**POLICY_PLACEHOLDERS, **placeholder_policy_model()}, run=run_with_stand_in
            )
            try:
                return Command._main(stand_in, args)
            except NeMoGymConfigError:
                if started:  # the config was fine with the stand-in: this error is about the benchmarks
                    raise
                raise err from None  # the first error is the one about the user's own config


COMMAND = _PrepareCommand(
    name="prepare_benchmark",
    verb="prepare-benchmark",
    summary="Write the data of the config's benchmark datasets (their prepare scripts).",
    model="nemo_gym.rollouts.benchmarks:PrepareBenchmarkConfig",
    run=run,
    initial_config=POLICY_PLACEHOLDERS,  # no model is called: the policy_* keys the model configs read are blank
    examples=(
        'ng_prepare_benchmark "+config_paths=[benchmarks/arithmetic/config.yaml]"',
        'ng_prepare_benchmark "+config_paths=[benchmarks/arithmetic/config.yaml]" +use_cached_prepared_benchmarks=true '
        "+prepare_script_args={num_rows: 50}",
    ),
)
