"""`ng_reverify` / `ng reverify`: re-score saved rollouts with the current resources servers (no model calls)."""

from __future__ import annotations

from nemo_gym.cli.command import Command
from nemo_gym.rollouts.data_prep import POLICY_PLACEHOLDERS


def run(config) -> int:
    from nemo_gym.workbench.reverify import reverify_from_config

    return reverify_from_config(config)


COMMAND = Command(
    name="reverify",
    verb="reverify",
    summary="Re-score saved rollouts with the current verifiers (/verify only, no model calls) and show the diff.",
    model="nemo_gym.workbench.reverify:ReverifyConfig",
    run=run,
    allocate_ports=True,  # for the servers it starts from +config_paths
    initial_config=POLICY_PLACEHOLDERS,  # the policy model is never started: its settings may stay unset
    examples=(
        'ng reverify results/rollouts.jsonl -o results/reverified.jsonl "+config_paths=[configs/quickstart.yaml]"',
        "ng_reverify +input_jsonl_fpath=results/rollouts.jsonl +output_jsonl_fpath=results/reverified.jsonl "
        "+head_server.port=11000",
    ),
    positionals=("input_jsonl_fpath",),
    flags={"-o": "output_jsonl_fpath"},
)
