"""Benchmark definitions (NeMo Gym v0.5 layout): one folder per benchmark with `config.yaml` and `prepare.py`.

`ng_list_benchmarks` lists them; `ng_prepare_benchmark` writes their data; `ng_e2e_collect_rollouts
"+config_paths=[benchmarks/<name>/config.yaml,<model config>]" +split=benchmark +output_jsonl_fpath=...` runs one.
"""
