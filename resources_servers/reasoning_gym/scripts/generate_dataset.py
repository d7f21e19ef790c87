"""Generate a reasoning_gym dataset offline with the `reasoning-gym` package's own task generators.

    python resources_servers/reasoning_gym/scripts/generate_dataset.py \\
        --tasks leg_counting,spell_backward,word_sorting --n 300 --seed 0 --out data/train.jsonl

Rows go round-robin over the tasks (row i is task i mod k), each task drawing its items from its own generator
created with `--seed` and the task's default configuration. Every row is one JSON line that the reasoning_gym
resources server can verify:

    {"responses_create_params": {"input": [{"role": "system", ...}, {"role": "user", "content": <question>}]},
     "question": ..., "answer": ..., "metadata": {"source_dataset": <task>, ...},
     "agent_ref": {"type": "responses_api_agents", "name": "reasoning_gym_simple_agent"}}

Reproducible: the same arguments give the same file. Some generators iterate over sets of strings, whose order
depends on Python's hash seed, so the script runs itself with `PYTHONHASHSEED=0` when it is not already set to
that. (`list_functions` is not reproducible at all: it ignores the seed.)

Before writing, each row's own gold answer is scored with the task's scorer against the row as it will be read
back from JSON. A task whose gold answer does not score 1.0 there (its scorer compares Python tuples that JSON
turns into lists, e.g. `arc_agi` and `rearc`) cannot be graded from a JSONL file, so the script stops with an
error; `--skip-gold-check` writes the rows anyway. Tasks whose rows have no single gold answer (`answer: null`,
scored by checking the model's solution, e.g. `propositional_logic`) are not checked.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any, Optional, Sequence

HASH_SEED = "0"

SYSTEM_PROMPT = (
    "Solve the problem you are given. Reason step by step first. Then write only the final answer between "
    "<answer> and </answer> tags, with no explanation inside the tags. If the problem shows how the answer must be "
    "formatted, use exactly that format inside the tags."
)
DEFAULT_AGENT_NAME = "reasoning_gym_simple_agent"
NOT_REPRODUCIBLE = {"list_functions"}  # its generator ignores the seed (reasoning-gym 0.1.25)


def available_tasks() -> list[str]:
    """The task names reasoning-gym registers, except `composite` (a mixer of other tasks, not a task)."""
    from reasoning_gym.factory import DATASETS

    return sorted(name for name in DATASETS if name != "composite")


def parse_tasks(text: str) -> list[str]:
    """`a, b,a` -> [a, b]: comma-separated, blanks and repeats dropped, order kept."""
    tasks: list[str] = []
    for name in text.split(","):
        name = name.strip()
        if name and name not in tasks:
            tasks.append(name)
    return tasks


def build_row(item: dict[str, Any], system_prompt: str, agent_name: Optional[str]) -> dict[str, Any]:
    """One dataset row from one reasoning-gym item (`question`, `answer`, `metadata`)."""
    messages = []
    if system_prompt:
        messages.append({"role": "system", "content": system_prompt})
    messages.append({"role": "user", "content": item["question"]})
    row: dict[str, Any] = {
        "responses_create_params": {"input": messages},
        "question": item["question"],
        "answer": item["answer"],
        "metadata": item["metadata"],
    }
    if agent_name:
        row["agent_ref"] = {"type": "responses_api_agents", "name": agent_name}
    return row


def generate_rows(
    tasks: Sequence[str],
    n: int,
    seed: int,
    *,
    system_prompt: str = SYSTEM_PROMPT,
    agent_name: Optional[str] = DEFAULT_AGENT_NAME,
) -> list[dict[str, Any]]:
    """`n` rows, round-robin over `tasks`. Rows are JSON round-tripped, so they are exactly what a reader of the
    file gets. Raises ValueError for an unknown task or metadata that JSON cannot hold."""
    import reasoning_gym

    known = set(available_tasks())
    unknown = [name for name in tasks if name not in known]
    if unknown:
        raise ValueError(f"unknown reasoning-gym task(s): {', '.join(unknown)}; --list-tasks shows the names")
    if not tasks:
        raise ValueError("no tasks given")

    counts = {name: len(range(index, n, len(tasks))) for index, name in enumerate(tasks)}
    datasets = {
        name: reasoning_gym.create_dataset(name, seed=seed, size=count) for name, count in counts.items() if count
    }
    rows = []
    for i in range(n):
        name = tasks[i % len(tasks)]
        item = datasets[name][i // len(tasks)]
        try:
            text = json.dumps(build_row(item, system_prompt, agent_name), ensure_ascii=False)
        except TypeError as exc:
            raise ValueError(f"task {name}: an item holds a value JSON cannot store ({exc})") from exc
        rows.append(json.loads(text))
    return rows


def gold_check_failures(rows: Sequence[dict[str, Any]]) -> dict[str, float]:
    """{task: lowest score} for tasks where some row's own gold answer scores below 1.0 (rows with no gold answer
    are skipped)."""
    import reasoning_gym

    failures: dict[str, float] = {}
    scorers: dict[str, Any] = {}
    for row in rows:
        if row["answer"] is None:
            continue
        name = row["metadata"]["source_dataset"]
        if name not in scorers:
            scorers[name] = reasoning_gym.get_score_answer_fn(name)
        entry = {"question": row["question"], "answer": row["answer"], "metadata": row["metadata"]}
        score = float(scorers[name](row["answer"], entry))
        if score < 1.0:
            failures[name] = min(score, failures.get(name, 1.0))
    return failures


def write_jsonl(rows: Sequence[dict[str, Any]], path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", encoding="utf-8") as f:
        for row in rows:
            f.write(json.dumps(row, ensure_ascii=False) + "\n")


def parse_args(argv: Optional[Sequence[str]] = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description="Generate a reasoning_gym JSONL dataset offline with reasoning-gym's task generators."
    )
    parser.add_argument("--tasks", help="comma-separated task names, e.g. leg_counting,spell_backward")
    parser.add_argument("--n", type=int, default=100, help="number of rows (default 100), round-robin over tasks")
    parser.add_argument("--seed", type=int, default=0, help="generator seed (default 0)")
    parser.add_argument("--out", type=Path, help="output JSONL file (overwritten)")
    parser.add_argument("--system-prompt", default=SYSTEM_PROMPT, help="system message ('' for none)")
    parser.add_argument(
        "--agent-name",
        default=DEFAULT_AGENT_NAME,
        help=f"agent_ref.name written into every row ('' for no agent_ref; default {DEFAULT_AGENT_NAME})",
    )
    parser.add_argument(
        "--skip-gold-check", action="store_true", help="write rows even if a task's gold answers do not score 1.0"
    )
    parser.add_argument("--list-tasks", action="store_true", help="print the available task names and exit")
    args = parser.parse_args(argv)
    if not args.list_tasks:
        if not args.tasks or args.out is None:
            parser.error("--tasks and --out are required")
        if args.n < 1:
            parser.error("--n must be at least 1")
    return args


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = parse_args(argv)
    if args.list_tasks:
        print("\n".join(available_tasks()))
        return 0

    tasks = parse_tasks(args.tasks)
    try:
        rows = generate_rows(
            tasks, args.n, args.seed, system_prompt=args.system_prompt, agent_name=args.agent_name or None
        )
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    for name in sorted(NOT_REPRODUCIBLE & set(tasks)):
        print(f"warning: {name} ignores the seed: its rows change from run to run", file=sys.stderr)

    if not args.skip_gold_check:
        failures = gold_check_failures(rows)
        if failures:
            for name, score in sorted(failures.items()):
                print(
                    f"error: {name}: a row's own gold answer scores {score:g} once read back from JSON, so its rows "
                    "cannot be graded from a file (use --skip-gold-check to write them anyway)",
                    file=sys.stderr,
                )
            return 2

    write_jsonl(rows, args.out)
    print(f"wrote {len(rows)} rows ({', '.join(tasks)}; seed {args.seed}) to {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    if os.environ.get("PYTHONHASHSEED") != HASH_SEED:  # make set iteration order, and so the output, reproducible
        os.environ["PYTHONHASHSEED"] = HASH_SEED
        os.execv(sys.executable, [sys.executable, *sys.argv])
    sys.exit(main())
