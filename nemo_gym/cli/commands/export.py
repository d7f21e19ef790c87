"""`ng_export` / `ng export {sft,dpo,tokens} FILE... -o OUT.jsonl|OUT.parquet`: rollouts -> training data."""

from __future__ import annotations

from nemo_gym.cli.command import Command


def run(config) -> int:
    from nemo_gym.workbench.export import export_rollouts

    report = export_rollouts(config)
    print("\n".join(report.lines()), flush=True)
    report.bad_lines.warn_skipped(COMMAND.script)
    if not report.written:
        dropped = sum(report.dropped.values())
        reasons = ", ".join(f"{n} {reason}" for reason, n in report.dropped.most_common())
        skipped = f" ({report.bad_lines.summary()})" if report.bad_lines.count else ""
        why = f"{dropped} dropped ({reasons})" if dropped else f"the input holds no rollout{skipped}"
        COMMAND.error(f"no row kept: {why}; no file was written ({report.output}). See the reasons above.")
        return 1
    return 0


COMMAND = Command(
    name="export",
    verb="export",
    summary="Turn rollout files into SFT, DPO or token-level training data (JSONL or Parquet).",
    model="nemo_gym.workbench.export:ExportConfig",
    run=run,
    reads_config_files=False,
    positionals=("kind", "input_jsonl_fpath"),
    flags={"-o": "output_fpath"},
    examples=(
        "ng export sft results/rollouts.jsonl -o sft.parquet --min-reward 1",
        "ng export sft results/rollouts.jsonl -o sft.jsonl --best-of-k 1 --reasoning drop",
        "ng export dpo results/a.jsonl results/b.jsonl -o dpo.parquet --min-margin 0.5",
        "ng export tokens results/rollouts.jsonl -o tokens.parquet",
        "ng_export +kind=sft +input_jsonl_fpath=results/rollouts.jsonl +output_fpath=sft.jsonl +min_reward=1",
    ),
)
