"""`ng_prepare_benchmark` with several processes (`num_prepare_benchmark_processes`): real worker processes, so
here and not among the unit tests of benchmark discovery (tests/unit/test_benchmark_discovery.py)."""

from nemo_gym.rollouts.benchmarks import PrepareBenchmarkConfig, prepare_benchmarks
from tests.unit.test_benchmark_discovery import _config_of, _make_benchmark, roots  # noqa: F401  (fixture)


def test_benchmarks_can_be_prepared_in_separate_processes(roots):
    first, _, _ = roots
    one, two = _make_benchmark(first, "iota"), _make_benchmark(first, "kappa")
    config = PrepareBenchmarkConfig(num_prepare_benchmark_processes=2, prepare_script_args={"num_rows": 5})
    paths = prepare_benchmarks(config, _config_of(first, one, two))
    assert [p.name for p in paths] == ["iota_benchmark.jsonl", "kappa_benchmark.jsonl"]
    assert [len(p.read_text().splitlines()) for p in paths] == [5, 5]
