"""`ng_export` / `ng export {sft,dpo,tokens} FILE... -o OUT.jsonl|OUT.parquet`: rollouts -> training data."""

from __future__ import annotations

from nemo_gym.cli.command import Command


def run(config) -> int:
    from nemo_gym.workbench.export import export_rollouts

    report = export_rollouts(config)
    print("\n".join(report.lines()), flush=True)
    if report.kept == 0:
        COMMAND.error(f"nothing was exported ({report.output} has no rows); see the reasons above.")
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
