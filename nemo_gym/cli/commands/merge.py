"""`ng_merge` / `ng merge SHARD.jsonl... -o OUT.jsonl`: merge the shards of one ng_collect_rollouts run."""

from __future__ import annotations

from nemo_gym.cli.command import Command


def run(config) -> int:
    from nemo_gym.rollouts.merge import merge_shards

    inputs = [config.input_jsonl_fpath] if isinstance(config.input_jsonl_fpath, str) else config.input_jsonl_fpath
    report = merge_shards(
        inputs, config.output_jsonl_fpath, pass_threshold=config.pass_threshold, skip_bad_lines=config.skip_bad_lines
    )
    print("\n".join(report.lines()), flush=True)
    report.bad_lines.warn_skipped(COMMAND.script)
    if not report.written:
        COMMAND.error(f"nothing merged: no rollout in the shards; no file was written ({report.output}).")
    return 0 if report.complete else 1


COMMAND = Command(
    name="merge",
    verb="merge",
    summary="Merge the shard outputs of one ng_collect_rollouts run (+shard=i/n) into one file and one profile.",
    model="nemo_gym.rollouts.merge:MergeConfig",
    run=run,
    reads_config_files=False,
    positionals=("input_jsonl_fpath",),
    flags={"-o": "output_jsonl_fpath"},
    examples=(
        "ng merge results/shard1.jsonl results/shard2.jsonl -o results/rollouts.jsonl",
        "ng_merge \"+input_jsonl_fpath=[results/shard1.jsonl,results/shard2.jsonl]\" +output_jsonl_fpath=results/rollouts.jsonl",
    ),
)
