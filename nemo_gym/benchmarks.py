"""NeMo Gym v0.5 import path for benchmark discovery (`BenchmarkConfig`, `discover_benchmarks`).

The code lives in `nemo_gym.rollouts.benchmarks`.
"""

from nemo_gym.rollouts.benchmarks import *  # noqa: F401,F403
from nemo_gym.rollouts import benchmarks as _benchmarks

__all__ = [*_benchmarks.__all__]
