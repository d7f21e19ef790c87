"""`ng_materialize_prompts` / `ng materialize-prompts IN.jsonl PROMPT.yaml -o OUT.jsonl`: render a prompt template
into every row of a JSONL file, offline (NeMo Gym v0.5's `gym dataset render`).

Every row is checked before anything is written, and every bad row is reported at once as `file:line: problem`
(not JSON, not an object, already carrying its own input, or lacking a field the template uses), so one run
shows the whole clean-up. The rendering itself is `nemo_gym.rollouts.prompts.materialize_prompts`.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from nemo_gym.cli.command import Command
from nemo_gym.errors import NeMoGymConfigError

# How many bad rows the error lists; the rest are counted.
MAX_ROW_PROBLEMS_SHOWN = 20


def row_problems(input_path: Path, cfg) -> list[str]:
    """`file:line: problem` for every row of `input_path` that the template cannot be rendered into."""
    from nemo_gym.rollouts.prompts import fill_prompt, has_input

    problems: list[str] = []
    with input_path.open("r", encoding="utf-8") as handle:
        for number, line in enumerate(handle, start=1):
            if not line.strip():
                continue
            where = f"{input_path}:{number}"
            try:
                row = json.loads(line)
            except json.JSONDecodeError as err:
                problems.append(f"{where}: not valid JSON ({err.msg} at column {err.colno}).")
                continue
            if not isinstance(row, dict):
                problems.append(f"{where}: a row must be a JSON object, got {type(row).__name__}.")
                continue
            if has_input(row):
                problems.append(
                    f"{where}: the row already has a non-empty `responses_create_params.input`; the template writes "
                    f"the input, so remove the row's own input (keep the fields the template uses)."
                )
                continue
            try:
                fill_prompt(cfg, row)
            except (KeyError, ValueError) as err:
                problems.append(f"{where}: {err.args[0] if err.args else err}")
    return problems


def run(config) -> int:
    from nemo_gym.rollouts.prompts import load_prompt_config, materialize_prompts, resolve_prompt_config_path

    cfg = load_prompt_config(config.prompt_config)
    source = resolve_prompt_config_path(config.input_jsonl_fpath, what="input JSONL file")
    problems = row_problems(source, cfg)
    if problems:
        shown = problems[:MAX_ROW_PROBLEMS_SHOWN]
        more = len(problems) - len(shown)
        tail = f"\n  ... and {more} more bad row(s)" if more else ""
        raise NeMoGymConfigError(
            f"{len(problems)} row(s) of {source} cannot be rendered with the prompt config {cfg.source}; nothing "
            f"was written. Fix these rows:\n" + "\n".join(f"  {p}" for p in shown) + tail
        )
    output = materialize_prompts(source, cfg, config.output_jsonl_fpath)
    rows = sum(1 for line in output.open("r", encoding="utf-8") if line.strip())
    sys.stdout.write(f"Rendered {rows} row(s) of {source} with {cfg.source} into {output}\n")
    return 0


COMMAND = Command(
    name="materialize_prompts",
    verb="materialize-prompts",
    summary="Render a prompt template into every row of a JSONL file (offline; v0.5 `gym dataset render`).",
    model="nemo_gym.rollouts.prompts:MaterializePromptsConfig",
    run=run,
    reads_config_files=False,
    positionals=("input_jsonl_fpath", "prompt_config"),
    flags={"-o": "output_jsonl_fpath"},
    examples=(
        "ng materialize-prompts data/questions.jsonl benchmarks/prompts/generic/math.yaml -o data/rendered.jsonl",
        "ng_materialize_prompts +input_jsonl_fpath=data/questions.jsonl "
        "+prompt_config=benchmarks/prompts/generic/math.yaml +output_jsonl_fpath=data/rendered.jsonl",
    ),
)
