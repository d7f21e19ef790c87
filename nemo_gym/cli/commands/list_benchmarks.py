"""`ng_list_benchmarks` / `ng list-benchmarks` and `ng_list_environments` / `ng list-environments`: the benchmark and
environment definitions found under the search roots (`nemo_gym.rollouts.benchmarks`), as a table or JSON, or one
of them in detail."""

from __future__ import annotations

import json
from typing import Any, Optional

from pydantic import Field

from nemo_gym.cli.command import Command
from nemo_gym.config.types import BaseNeMoGymCLIConfig


class ListBenchmarksConfig(BaseNeMoGymCLIConfig):
    """List the benchmarks: every YAML under `benchmarks/` of the search roots (NEMO_GYM_EXTRA_ROOTS, the current
    directory, the install root) that declares a `type: benchmark` dataset. With a name, show that one."""

    name: Optional[str] = Field(default=None, description="Show this benchmark in detail instead of the list.")
    query: Optional[str] = Field(
        default=None,
        description="List only the benchmarks whose name, description or domain matches (fuzzy: `gym search QUERY`).",
    )
    json_format: bool = Field(default=False, alias="json", description="Print JSON instead of text.")


class ListEnvironmentsConfig(BaseNeMoGymCLIConfig):
    """List the environments: every `environments/<name>/config.yaml` of the search roots (NEMO_GYM_EXTRA_ROOTS,
    the current directory, the install root). With a name, show that one."""

    name: Optional[str] = Field(default=None, description="Show this environment in detail instead of the list.")
    json_format: bool = Field(default=False, alias="json", description="Print JSON instead of text.")


def _table(rows: list[list[str]], headers: list[str]) -> str:
    widths = [max(len(str(r[i])) for r in [headers, *rows]) for i in range(len(headers))]
    lines = ["  ".join(str(h).ljust(w) for h, w in zip(headers, widths)).rstrip()]
    lines += ["  ".join(str(c).ljust(w) for c, w in zip(row, widths)).rstrip() for row in rows]
    return "\n".join(lines)


def _details(document: dict[str, Any]) -> str:
    lines = []
    for key, value in document.items():
        if isinstance(value, dict):
            lines.append(f"{key}:")
            lines += [f"  {k}: {v}" for k, v in value.items()]
        elif isinstance(value, list):
            lines.append(f"{key}: {', '.join(map(str, value)) or '-'}")
        else:
            lines.append(f"{key}: {'-' if value is None else value}")
    return "\n".join(lines)


def _benchmark_document(benchmark) -> dict[str, Any]:
    document = benchmark.to_json()
    from nemo_gym.rollouts.benchmarks import resolve_component_path

    path = resolve_component_path(benchmark.dataset.jsonl_fpath)
    document["prepared"] = path.is_file()
    return document


def run_benchmarks(config: ListBenchmarksConfig) -> int:
    from nemo_gym.rollouts.benchmarks import discover_benchmarks, find_benchmark

    if config.name:
        document = _benchmark_document(find_benchmark(config.name))
        print(json.dumps(document, indent=2) if config.json_format else _details(document))
        return 0
    found = discover_benchmarks()
    if config.query:
        from nemo_gym.cli.gym import search_rows

        matching = search_rows(config.query, [b.to_json() for b in found.values()])
        found = {row["name"]: found[row["name"]] for row in matching}
    if config.json_format:
        print(json.dumps([_benchmark_document(b) for b in found.values()], indent=2))
        return 0
    if not found:
        matching = f" matching `{config.query}`" if config.query else ""
        print(f"No benchmarks{matching} found under benchmarks/ of the search roots.")
        return 0
    rows = [[b.name, b.domain or "-", b.config_relpath, b.description or ""] for b in found.values()]
    print(_table(rows, ["NAME", "DOMAIN", "CONFIG", "DESCRIPTION"]))
    return 0


def run_environments(config: ListEnvironmentsConfig) -> int:
    from nemo_gym.rollouts.benchmarks import discover_environments, find_environment

    if config.name:
        document = find_environment(config.name).to_json()
        print(json.dumps(document, indent=2) if config.json_format else _details(document))
        return 0
    found = discover_environments()
    if config.json_format:
        print(json.dumps([e.to_json() for e in found.values()], indent=2))
        return 0
    if not found:
        print("No environments found under environments/ of the search roots.")
        return 0
    rows = [[e.name, e.domain or "-", e.config_relpath, e.description or ""] for e in found.values()]
    print(_table(rows, ["NAME", "DOMAIN", "CONFIG", "DESCRIPTION"]))
    return 0


COMMAND = Command(
    name="list_benchmarks",
    verb="list-benchmarks",
    summary="List the benchmark definitions (benchmarks/ under the search roots), or show one.",
    model=ListBenchmarksConfig,
    run=run_benchmarks,
    reads_config_files=False,
    positionals=("name",),
    flags={"--json": "json_format"},
    examples=("ng_list_benchmarks", "ng_list_benchmarks arithmetic", "ng_list_benchmarks --json"),
)

ENVIRONMENTS = Command(
    name="list_environments",
    verb="list-environments",
    summary="List the environment definitions (environments/ under the search roots), or show one.",
    model=ListEnvironmentsConfig,
    run=run_environments,
    reads_config_files=False,
    positionals=("name",),
    flags={"--json": "json_format"},
    examples=("ng_list_environments", "ng_list_environments frozen_lake --json"),
)
