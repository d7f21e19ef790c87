"""`ng_prepare_data`: validate the datasets listed on agent blocks, measure them, and collate them.

Flow (reference section 3 / 5.6, with the decisions below):

1. Find the agent blocks with `datasets` and keep the entries whose `type` is in scope for the mode:
   `example` for `example_validation`, `train` + `validation` + `benchmark` for `train_preparation` (NeMo Gym
   v0.5 collates benchmark datasets with the training data; their relative `jsonl_fpath` is looked up in the
   search roots, `nemo_gym.rollouts.benchmarks.resolve_component_path`, since definitions can live in any). An agent whose
   datasets are all out of scope contributes nothing (the reference kept all of them: Appendix A.9).
2. Every in-scope file must exist (relative paths are taken from the current directory). Downloads are
   not supported offline: with `should_download=true` a missing file is an error that says where the
   file would have come from and where to put it.
3. Stream every file (once to check and measure, once more to write): each non-blank line must parse as
   a JSON object, hold `responses_create_params` with `input`, and fit the verify request model of the
   agent's resources server. All invalid lines of all datasets are reported together (dataset, agent, file, line; past
   the first 100, the full list goes to `<output_dirpath>/prepare_data_errors.txt`), then the command
   exits 2. Nothing else is written in that case. (The reference skipped bad lines silently in
   the metrics and still copied them into the prepared files: Appendix A.9.)
4. Per dataset `X.jsonl`: `X_metrics.json` next to it (the dataset's config fields + aggregates), then
   `X_prepare.jsonl` next to it (each line `num_repeats` times, `agent_ref` set); per type:
   `<output_dirpath>/<type>.jsonl` (the prepared lines of every dataset of that type, in config order)
   and `<output_dirpath>/<type>_metrics.json` (aggregates over those datasets, prefixed with the first
   dataset's config fields).
5. A metrics file that already exists and differs beyond the tolerance is a conflict: the new metrics go
   to `X_metrics_conflict.json` and the command fails, unless `overwrite_metrics_conflicts=true`. One
   that matches within the tolerance is left untouched; a stale conflict file is removed once resolved.
   A file marked `PLACEHOLDER_METRICS_KEY` (the metrics `ng_init_resources_server` writes for its placeholder
   rows) is no baseline: once the rows differ it is replaced without a conflict, as the v0.5 tutorials expect
   (they replace the placeholder rows, then run this command).

Decisions:

- Verify-model check: the row is validated together with a placeholder `response` (a minimal valid
  Response with no output), because that is exactly the body `/verify` receives after a rollout. Errors
  located under `response` are ignored (they would be about the placeholder, not the row). A row's own
  `response` key, if any, is replaced by the placeholder for the check only.
- The verify model is found by importing `<type>/<impl>/<entrypoint>` of the agent's `resources_server`
  (the current directory first, then the nemo_gym install directory), taking its `SimpleResourcesServer`
  subclass and the model annotated on `verify`'s `body`. When the module cannot be imported in this
  interpreter (missing dependencies), or has no such annotation, a warning is printed and rows are
  validated against `BaseRunRequest` instead. Agents without a resources server reference get
  `BaseRunRequest` validation too.
- Metrics are running aggregates (count, mean and M2 by Welford's method, min, max): memory does not grow
  with the number of rows, except for string fields, whose distinct values are counted with a set of
  their hashes. Standard deviation is the sample one (n-1); 0 for fewer than two values.
- Per-row figures: `Number of tools` = len(tools) when non-empty; `Json-dumped number of words` = number
  of whitespace-separated words of `json.dumps(responses_create_params)`; `Number of turns` = number of
  `role: user` items of the input (1 for a string input), absent when 0; `Temperature` when set. Other
  top-level fields: numbers and booleans (booleans as 0/1) and the numeric elements of lists feed a
  numeric aggregate; strings and the string elements of lists feed `{unique_count, total_count}`; a field
  that has both gets both sets of keys; nulls, objects and nested lists are not measured.
- Values are rounded to 2 decimals when |x| >= 1, else 3. Conflicts compare recursively: numbers with an
  absolute tolerance of 5e-3 when |x| >= 1 else 5e-4, lists as multisets, and a key missing on one side
  equals null on the other (so files written before a field existed don't conflict).
- Blank lines are skipped (not counted, not copied).
- A file listed by several in-scope dataset entries gets one set of side outputs per entry, named
  `X_<agent>_metrics.json` / `X_<agent>_prepare.jsonl`, since each carries its own `agent_ref`.
- All outputs are written to a temporary file and renamed into place.
- A dataset entry with `prompt_config` (NeMo Gym v0.5 declares it on benchmark datasets) has its template
  (`nemo_gym.rollouts.prompts`) rendered into every row's `responses_create_params.input` before the row is
  checked, measured and written, so the prepared files hold the rendered input. Its rows must not bring an input
  of their own (reported like any other invalid line).
"""

from __future__ import annotations

import hashlib
import importlib.util
import inspect
import json
import math
import os
import re
import shutil
import sys
import tempfile
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator, Literal, Optional, TextIO

from omegaconf import DictConfig, OmegaConf
from pydantic import BaseModel, Field, ValidationError

from nemo_gym import PARENT_DIR
from nemo_gym.config.types import (
    AGENT_SERVER_TYPE,
    RESOURCES_SERVER_TYPE,
    BaseNeMoGymCLIConfig,
    DatasetConfig,
    format_validation_errors,
    parse_dataset_config,
)
from nemo_gym.errors import NeMoGymConfigError
from nemo_gym.rollouts.prompts import PromptConfig, apply_prompt_to_row, load_prompt_config

__all__ = [
    "TrainDataProcessorConfig",
    "PrepareDataError",
    "DatasetToPrepare",
    "NumericAggregate",
    "StringAggregate",
    "DatasetMetricsAccumulator",
    "RowError",
    "RowErrorCollector",
    "find_datasets_in_scope",
    "check_dataset_files",
    "load_verify_request_model",
    "validate_and_measure",
    "compare_metrics",
    "round_metric",
    "prepare_data",
    "POLICY_PLACEHOLDERS",
]

# Display names of the built-in aggregates (the reference's, so existing metrics files compare equal).
NUMBER_OF_EXAMPLES = "Number of examples"
NUMBER_OF_TOOLS = "Number of tools"
NUMBER_OF_WORDS = "Json-dumped number of words (proxy for token count)"
NUMBER_OF_TURNS = "Number of turns"
TEMPERATURE = "Temperature"
TOTAL_NON_NULL = "Total # non-null values"
AVERAGE = "Average"
MIN = "Min"
MAX = "Max"
STD = "Standard deviation"
UNIQUE_COUNT = "unique_count"
TOTAL_COUNT = "total_count"

MODE_TYPES: dict[str, tuple[str, ...]] = {
    # Benchmark datasets (NeMo Gym v0.5) are collated with the training data, as v0.5 does.
    "train_preparation": ("train", "validation", "benchmark"),
    "example_validation": ("example",),
}

# `ng_prepare_data` needs no model: the policy_* values are seeded empty so model configs resolve.
POLICY_PLACEHOLDERS = {"policy_base_url": "", "policy_api_key": "", "policy_model_name": ""}

# How many invalid lines the error message lists; the rest are counted (and written to a report file).
MAX_ERRORS_IN_MESSAGE = 100
ERROR_REPORT_FILENAME = "prepare_data_errors.txt"

_PLACEHOLDER_RESPONSE = {
    "id": "ng_prepare_data_placeholder",
    "created_at": 0,
    "model": "placeholder",
    "object": "response",
    "output": [],
}


class PrepareDataError(NeMoGymConfigError):
    """Invalid rows, missing files or metric conflicts: printed without traceback, exit 2."""


# --------------------------------------------------------------------------------------------------
# Parameters
# --------------------------------------------------------------------------------------------------


class TrainDataProcessorConfig(BaseNeMoGymCLIConfig):
    """Validate the datasets listed on agent blocks (`datasets:`), write per-dataset metrics
    (`X_metrics.json`) and prepared copies (`X_prepare.jsonl`, with `agent_ref` and `num_repeats`
    applied) next to each file, and the collated `<type>.jsonl` + `<type>_metrics.json` in
    `output_dirpath`. Every row must parse, hold `responses_create_params.input` and fit the verify
    request of its resources server; all invalid lines are reported with file and line number.

    Example: ng_prepare_data "+config_paths=[resources_servers/mcqa/configs/mcqa.yaml]"
    +output_dirpath=data/mcqa +mode=example_validation"""

    output_dirpath: str = Field(description="Directory for the collated <type>.jsonl and <type>_metrics.json.")
    mode: Literal["train_preparation", "example_validation"] = Field(
        description="train_preparation: the train and validation datasets; example_validation: the example datasets."
    )
    should_download: bool = Field(
        default=False,
        description="Download missing dataset files. Not supported offline: a missing file is reported with "
        "its source and the path to put it at.",
    )
    data_source: Literal["gitlab", "huggingface"] = Field(
        default="huggingface", description="Source to name when a dataset has both a gitlab and a huggingface identifier."
    )
    overwrite_metrics_conflicts: bool = Field(
        default=False,
        description="Overwrite an existing metrics file that differs, instead of writing <name>_metrics_conflict.json "
        "and failing.",
    )

    @property
    def in_scope_dataset_types(self) -> tuple[str, ...]:
        return MODE_TYPES[self.mode]


# --------------------------------------------------------------------------------------------------
# Finding the datasets
# --------------------------------------------------------------------------------------------------


@dataclass
class DatasetToPrepare:
    """One in-scope `datasets` entry of one agent block."""

    agent_name: str
    dataset: DatasetConfig
    path: Path  # absolute
    resources_server_name: Optional[str] = None
    shared: bool = False  # the same file is listed by another in-scope entry
    prompt_config: Optional[PromptConfig] = None  # rendered into each row's input (`prompt_config` of the entry)

    @property
    def label(self) -> str:
        return f"dataset '{self.dataset.name}' (type {self.dataset.type}, agent '{self.agent_name}')"

    def _side_path(self, suffix: str) -> Path:
        stem = self.path.stem
        if self.shared:
            stem = f"{stem}_{self.agent_name}"
        return self.path.with_name(f"{stem}{suffix}")

    @property
    def metrics_path(self) -> Path:
        return self._side_path("_metrics.json")

    @property
    def conflict_path(self) -> Path:
        return self._side_path("_metrics_conflict.json")

    @property
    def prepare_path(self) -> Path:
        return self._side_path("_prepare.jsonl")


def _as_plain(node: Any) -> Any:
    if isinstance(node, DictConfig) or OmegaConf.is_list(node):
        return OmegaConf.to_container(node, resolve=True)
    return node


def _resources_server_ref(agent_cfg: DictConfig) -> Optional[str]:
    """The server id an agent's `resources_server` ref points at (or its only first-level resources ref)."""
    candidates: list[tuple[str, str]] = []
    for key in agent_cfg.keys():
        try:
            value = agent_cfg.get(key)
        except Exception:  # an unrelated field that doesn't resolve is not our business
            continue
        if isinstance(value, DictConfig) and value.get("type") == RESOURCES_SERVER_TYPE and "name" in value:
            candidates.append((str(key), str(value.get("name"))))
    for key, name in candidates:
        if key == "resources_server":
            return name
    return candidates[0][1] if candidates else None


def find_datasets_in_scope(
    config: TrainDataProcessorConfig, global_config: DictConfig, *, cwd: Optional[Path] = None
) -> list[DatasetToPrepare]:
    """The in-scope dataset entries of every agent block, in config order. Agents whose datasets are all
    out of scope contribute nothing. Raises when nothing is in scope."""
    from nemo_gym.config.global_config import find_server_instances

    cwd = Path(cwd) if cwd is not None else Path.cwd()
    in_scope = config.in_scope_dataset_types
    found: list[DatasetToPrepare] = []
    agents_with_datasets: list[str] = []
    for spec in find_server_instances(global_config):
        if spec.server_type != AGENT_SERVER_TYPE or spec.config.get("datasets") is None:
            continue
        try:
            raw_datasets = _as_plain(spec.config.datasets) or []
        except Exception as err:
            raise NeMoGymConfigError(f"Agent `{spec.server_id}`: cannot resolve `datasets`: {err}") from None
        agents_with_datasets.append(spec.server_id)
        resources_name = _resources_server_ref(spec.config)
        for index, raw in enumerate(raw_datasets):
            try:
                dataset = parse_dataset_config(raw)
            except ValidationError as err:
                lines = "; ".join(format_validation_errors(err))
                raise NeMoGymConfigError(f"Agent `{spec.server_id}`: datasets[{index}] is invalid: {lines}") from None
            if dataset.type not in in_scope:
                continue
            if dataset.type == "benchmark":
                # Benchmark definitions live under any search root (benchmarks/<name>/...), so their data does too.
                from nemo_gym.rollouts.benchmarks import resolve_component_path

                path = resolve_component_path(dataset.jsonl_fpath)
            else:
                path = Path(os.path.expanduser(dataset.jsonl_fpath))
                if not path.is_absolute():
                    path = cwd / path
            prompt = _dataset_prompt_config(spec.server_id, index, dataset, raw)
            found.append(DatasetToPrepare(spec.server_id, dataset, path, resources_name, prompt_config=prompt))

    if not found:
        wanted = " or ".join(in_scope)
        if agents_with_datasets:
            where = f"the agents with datasets ({', '.join(agents_with_datasets)}) list none of type {wanted}"
        else:
            where = "no agent block in the config has `datasets`"
        raise NeMoGymConfigError(
            f"Nothing to prepare in mode {config.mode}: {where}. Load the agent configs with "
            f'"+config_paths=[...]", or pick the other +mode.'
        )

    counts: dict[Path, int] = {}
    for item in found:
        counts[item.path] = counts.get(item.path, 0) + 1
    for item in found:
        item.shared = counts[item.path] > 1
    return found


def _dataset_prompt_config(agent: str, index: int, dataset: DatasetConfig, raw: Any) -> Optional[PromptConfig]:
    """The template named by a dataset entry's `prompt_config`, loaded once (None without one)."""
    path = getattr(dataset, "prompt_config", None)
    if path is None and isinstance(raw, dict):
        path = raw.get("prompt_config")
    if path is None:
        return None
    try:
        return load_prompt_config(path)
    except NeMoGymConfigError as err:
        raise NeMoGymConfigError(f"Agent `{agent}`: datasets[{index}] ({dataset.name}): {err}") from None


def check_dataset_files(config: TrainDataProcessorConfig, datasets: list[DatasetToPrepare]) -> None:
    """Every in-scope file must exist locally; all missing ones are reported in one error."""
    problems: list[str] = []
    for item in datasets:
        if item.path.is_file():
            continue
        ds = item.dataset
        where = f"{item.label}: file {ds.jsonl_fpath} not found (looked at {item.path})"
        if ds.type == "benchmark":
            problems.append(
                f"{where}. Benchmark data is written by its prepare_script ({getattr(ds, 'prepare_script', '?')}): "
                'run ng_prepare_benchmark "+config_paths=[<the benchmark config>,<model config>]" first, or let '
                "ng_e2e_collect_rollouts +split=benchmark prepare it."
            )
        elif config.should_download and ds.type != "example":
            source = _download_source(config, ds)
            if source is None:
                problems.append(
                    f"{where}; it has no huggingface_identifier or gitlab_identifier to download it from. "
                    f"Put the file at {item.path}."
                )
            else:
                problems.append(
                    f"{where}; downloading it from {source} is not supported offline (no network access). "
                    f"Fetch it yourself and put it at {item.path}."
                )
        elif ds.type == "example":
            problems.append(f"{where}. Example datasets are never downloaded: add the file to the repository.")
        else:
            source = _download_source(config, ds)
            origin = f" It comes from {source};" if source else ""
            problems.append(
                f"{where}.{origin} put the file there (downloads are not supported offline, so "
                "+should_download=true would not help)."
            )
    if problems:
        if len(problems) == 1:
            raise PrepareDataError(f"1 dataset file(s) missing: {problems[0]}")
        body = "\n".join(f"  - {p}" for p in problems)
        raise PrepareDataError(
            f"{len(problems)} dataset file(s) missing, the first: {problems[0]} (all listed below)\n{body}"
        )


def _download_source(config: TrainDataProcessorConfig, ds: DatasetConfig) -> Optional[str]:
    hf, gl = ds.huggingface_identifier, ds.gitlab_identifier
    if hf is not None and (gl is None or config.data_source == "huggingface"):
        artifact = f", file {hf.artifact_fpath}" if hf.artifact_fpath else f", split {ds.type}"
        return f"Hugging Face dataset {hf.repo_id}{artifact}"
    if gl is not None:
        return f"GitLab/MLflow dataset {gl.dataset_name} version {gl.version}, file {gl.artifact_fpath}"
    return None


# --------------------------------------------------------------------------------------------------
# The verify request model of a resources server
# --------------------------------------------------------------------------------------------------


@dataclass
class VerifyModel:
    model: type[BaseModel]
    description: str  # for messages: "MyVerifyRequest (resources_servers/foo/app.py)" or "BaseRunRequest"
    warning: Optional[str] = None
    with_response: bool = True  # validate with the placeholder `response`


def _base_run_request(warning: Optional[str], why: str) -> VerifyModel:
    from nemo_gym.servers.resources_server import BaseRunRequest

    return VerifyModel(BaseRunRequest, f"BaseRunRequest ({why})", warning, with_response=False)


def _server_file(spec: Any, cwd: Path) -> Optional[Path]:
    """The entrypoint file ng_run would run, or None when it is missing; one outside the server roots is refused
    (config/server_paths.py), since importing it runs it."""
    from nemo_gym.config.server_paths import OutsideServerRootsError, locate_server

    try:
        location = locate_server(spec, cwd)
    except OutsideServerRootsError:
        raise
    except NeMoGymConfigError:
        return None
    return location.server_dir / location.entrypoint


def _import_file(path: Path, module_name: str):
    """Import `path` as `module_name` with its folder first on sys.path. Top-level modules that the file
    pulls in from its own folder are dropped from sys.modules afterwards, so a second server with a
    sibling module of the same name gets its own."""
    folder = str(path.parent)
    before = set(sys.modules)
    sys.path.insert(0, folder)
    try:
        spec = importlib.util.spec_from_file_location(module_name, path)
        if spec is None or spec.loader is None:
            raise ImportError(f"cannot load {path}")
        module = importlib.util.module_from_spec(spec)
        sys.modules[module_name] = module
        try:
            spec.loader.exec_module(module)
        except BaseException:
            sys.modules.pop(module_name, None)
            raise
        return module
    finally:
        try:
            sys.path.remove(folder)
        except ValueError:
            pass
        for name in set(sys.modules) - before:
            if name == module_name:
                continue
            file = getattr(sys.modules.get(name), "__file__", None) or ""
            if file and Path(file).resolve().is_relative_to(Path(folder).resolve()):
                sys.modules.pop(name, None)


def _verify_body_model(cls: type) -> Optional[type[BaseModel]]:
    verify = getattr(cls, "verify", None)
    if verify is None:
        return None
    try:
        hints = typing.get_type_hints(verify)
    except Exception:
        hints = {}
    try:
        params = list(inspect.signature(verify).parameters)
    except (TypeError, ValueError):
        params = []
    names = (["body"] if "body" in params else []) + [p for p in params if p not in ("self", "body")]
    for name in names:
        hint = hints.get(name)
        if isinstance(hint, type) and issubclass(hint, BaseModel):
            return hint
    return None


def load_verify_request_model(
    global_config: DictConfig, resources_server_name: Optional[str], *, cwd: Optional[Path] = None
) -> VerifyModel:
    """The model `/verify` of `resources_server_name` validates its body with, or `BaseRunRequest`
    (with a warning) when it can't be determined in this interpreter."""
    from nemo_gym.servers.resources_server import SimpleResourcesServer
    from nemo_gym.config.global_config import find_server_instances

    if resources_server_name is None:
        return _base_run_request(None, "the agent has no resources_server reference")
    cwd = Path(cwd) if cwd is not None else Path.cwd()
    spec = next(
        (s for s in find_server_instances(global_config) if s.server_id == resources_server_name), None
    )
    if spec is None or spec.server_type != RESOURCES_SERVER_TYPE:
        return _base_run_request(
            f"resources server `{resources_server_name}` is not a valid server block; rows are checked against "
            "BaseRunRequest only.",
            "resources server not found",
        )
    entrypoint = str(spec.config.get("entrypoint") or "app.py")
    rel = f"{spec.server_type}/{spec.impl}/{entrypoint}"
    path = _server_file(spec, cwd)
    if path is None:
        return _base_run_request(
            f"cannot find {rel} (looked in {cwd} and {PARENT_DIR}) for resources server `{resources_server_name}`; "
            "rows are checked against BaseRunRequest only, not its verify request.",
            f"{rel} not found",
        )
    # One module per file (not per server id): two configs naming the same folder share the import.
    digest = hashlib.sha1(str(path.resolve()).encode()).hexdigest()[:12]
    module_name = f"_ng_prepare_data_{re.sub(r'[^0-9A-Za-z_]', '_', spec.impl)}_{digest}"
    try:
        module = sys.modules.get(module_name) or _import_file(path, module_name)
    except BaseException as err:  # missing deps, syntax errors, sys.exit at import...
        if isinstance(err, KeyboardInterrupt):
            raise
        return _base_run_request(
            f"cannot import {rel} in this interpreter ({type(err).__name__}: {err}); rows of the datasets that use "
            f"resources server `{resources_server_name}` are checked against BaseRunRequest only, not its verify "
            "request. Install the server's requirements here to check them fully.",
            f"{rel} not importable",
        )

    classes = [
        obj
        for obj in vars(module).values()
        if isinstance(obj, type) and issubclass(obj, SimpleResourcesServer) and obj is not SimpleResourcesServer
    ]
    own = [c for c in classes if c.__module__ == module.__name__] or classes
    # The most derived ones: drop classes that another candidate subclasses.
    leaves = [c for c in own if not any(o is not c and issubclass(o, c) for o in own)]
    for cls in leaves:
        model = _verify_body_model(cls)
        if model is not None:
            return VerifyModel(model, f"{model.__name__} ({rel}, {cls.__name__}.verify)")
    what = "no SimpleResourcesServer subclass" if not leaves else "no pydantic model annotated on verify's body"
    return _base_run_request(
        f"{rel} has {what}; rows are checked against BaseRunRequest only.", f"{rel}: {what}"
    )


# --------------------------------------------------------------------------------------------------
# Metrics
# --------------------------------------------------------------------------------------------------


def round_metric(value: float) -> float:
    """2 decimals when |x| >= 1, else 3."""
    value = float(value)
    if not math.isfinite(value):
        return value
    return round(value, 2 if abs(value) >= 1 else 3)


@dataclass
class NumericAggregate:
    """Count, mean and M2 (Welford), min and max of a stream of numbers; mergeable."""

    count: int = 0
    mean: float = 0.0
    m2: float = 0.0
    min: float = math.inf
    max: float = -math.inf

    def add(self, value: float) -> None:
        value = float(value)
        self.count += 1
        delta = value - self.mean
        self.mean += delta / self.count
        self.m2 += delta * (value - self.mean)
        if value < self.min:
            self.min = value
        if value > self.max:
            self.max = value

    def merge(self, other: "NumericAggregate") -> None:
        if other.count == 0:
            return
        if self.count == 0:
            self.count, self.mean, self.m2, self.min, self.max = other.count, other.mean, other.m2, other.min, other.max
            return
        total = self.count + other.count
        delta = other.mean - self.mean
        self.m2 += other.m2 + delta * delta * self.count * other.count / total
        self.mean += delta * other.count / total
        self.count = total
        self.min = min(self.min, other.min)
        self.max = max(self.max, other.max)

    @property
    def std(self) -> float:
        """Sample standard deviation (n-1); 0 for fewer than two values."""
        if self.count < 2:
            return 0.0
        return math.sqrt(max(self.m2, 0.0) / (self.count - 1))

    def to_dict(self) -> dict[str, Any]:
        if self.count == 0:
            return {TOTAL_NON_NULL: 0, AVERAGE: 0.0, MIN: 0.0, MAX: 0.0, STD: 0.0}
        return {
            TOTAL_NON_NULL: self.count,
            AVERAGE: round_metric(self.mean),
            MIN: round_metric(self.min),
            MAX: round_metric(self.max),
            STD: round_metric(self.std),
        }


@dataclass
class StringAggregate:
    """Total and distinct count of a stream of strings (distinct by hash, so long strings cost no memory)."""

    total: int = 0
    hashes: set[int] = field(default_factory=set)

    def add(self, value: str) -> None:
        self.total += 1
        self.hashes.add(hash(value))

    def merge(self, other: "StringAggregate") -> None:
        self.total += other.total
        self.hashes |= other.hashes

    def to_dict(self) -> dict[str, Any]:
        return {UNIQUE_COUNT: len(self.hashes), TOTAL_COUNT: self.total}


_MAX_FLOAT_INT = int(sys.float_info.max)


def _is_number(value: Any) -> bool:
    """int, float or bool; NaN, infinities and ints beyond float range are not measurable and are left out."""
    if isinstance(value, float):
        return math.isfinite(value)
    return isinstance(value, int) and abs(value) <= _MAX_FLOAT_INT


@dataclass
class DatasetMetricsAccumulator:
    """Running aggregates over the rows of one dataset (or, merged, of several)."""

    examples: int = 0
    tools: NumericAggregate = field(default_factory=NumericAggregate)
    words: NumericAggregate = field(default_factory=NumericAggregate)
    turns: NumericAggregate = field(default_factory=NumericAggregate)
    temperature: NumericAggregate = field(default_factory=NumericAggregate)
    numeric_fields: dict[str, NumericAggregate] = field(default_factory=dict)
    string_fields: dict[str, StringAggregate] = field(default_factory=dict)
    field_order: dict[str, None] = field(default_factory=dict)

    def add_row(self, row: dict) -> None:
        self.examples += 1
        params = row.get("responses_create_params")
        if isinstance(params, dict):
            tools = params.get("tools")
            if isinstance(tools, list) and tools:
                self.tools.add(len(tools))
            self.words.add(len(json.dumps(params).split()))
            turns = _count_user_turns(params.get("input"))
            if turns:
                self.turns.add(turns)
            temperature = params.get("temperature")
            if _is_number(temperature) and not isinstance(temperature, bool):
                self.temperature.add(temperature)
        for key, value in row.items():
            if key == "responses_create_params":
                continue
            values = value if isinstance(value, list) else [value]
            for item in values:
                if isinstance(item, str):
                    self._strings(key).add(item)
                elif _is_number(item):  # bools are ints: True -> 1, False -> 0
                    self._numbers(key).add(item)

    def _numbers(self, key: str) -> NumericAggregate:
        self.field_order.setdefault(key, None)
        agg = self.numeric_fields.get(key)
        if agg is None:
            agg = self.numeric_fields[key] = NumericAggregate()
        return agg

    def _strings(self, key: str) -> StringAggregate:
        self.field_order.setdefault(key, None)
        agg = self.string_fields.get(key)
        if agg is None:
            agg = self.string_fields[key] = StringAggregate()
        return agg

    def merge(self, other: "DatasetMetricsAccumulator") -> None:
        self.examples += other.examples
        self.tools.merge(other.tools)
        self.words.merge(other.words)
        self.turns.merge(other.turns)
        self.temperature.merge(other.temperature)
        for key in other.field_order:
            if key in other.numeric_fields:
                self._numbers(key).merge(other.numeric_fields[key])
            if key in other.string_fields:
                self._strings(key).merge(other.string_fields[key])

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            NUMBER_OF_EXAMPLES: self.examples,
            NUMBER_OF_TOOLS: self.tools.to_dict(),
            NUMBER_OF_WORDS: self.words.to_dict(),
            NUMBER_OF_TURNS: self.turns.to_dict(),
            TEMPERATURE: self.temperature.to_dict(),
        }
        for key in self.field_order:
            if key in out:  # a row field named like a built-in aggregate can't replace it
                continue
            entry: dict[str, Any] = {}
            if key in self.numeric_fields:
                entry.update(self.numeric_fields[key].to_dict())
            if key in self.string_fields:
                entry.update(self.string_fields[key].to_dict())
            out[key] = entry
        return out


def _count_user_turns(items: Any) -> int:
    if isinstance(items, str):
        return 1
    if not isinstance(items, list):
        return 0
    return sum(1 for item in items if isinstance(item, dict) and item.get("role") == "user")


def metrics_document(dataset: DatasetConfig, accumulator: DatasetMetricsAccumulator) -> dict[str, Any]:
    """The contents of a metrics file: the dataset's config fields, then the aggregates. A `source` block is left
    out: it is mirrored into the `*_identifier` field it spells, so files written before it existed still compare."""
    return {**dataset.model_dump(mode="json", exclude={"source"}), **accumulator.to_dict()}


# --------------------------------------------------------------------------------------------------
# Validating rows
# --------------------------------------------------------------------------------------------------


@dataclass
class RowError:
    dataset: DatasetToPrepare
    line: int
    message: str

    def __str__(self) -> str:
        return f"{self.dataset.dataset.jsonl_fpath}:{self.line}: {self.dataset.label}: {self.message}"


def _iter_lines(path: Path) -> Iterator[tuple[int, str]]:
    with path.open("r", encoding="utf-8", errors="surrogateescape") as handle:
        for number, line in enumerate(handle, start=1):
            if line.strip():
                yield number, line


def _check_row(
    line: str, verify: VerifyModel, prompt: Optional[PromptConfig] = None
) -> tuple[Optional[dict], Optional[str]]:
    """(row, None) when the line is a valid row (with `prompt` rendered into its input), else (None, reason)."""
    try:
        row = json.loads(line)
    except json.JSONDecodeError as err:
        return None, f"not valid JSON ({err.msg} at column {err.colno})"
    if not isinstance(row, dict):
        return None, f"a row must be a JSON object, got {type(row).__name__ if row is not None else 'null'}"
    if prompt is not None:
        row, reason = _render_prompt(row, prompt)
        if reason is not None:
            return None, reason
    params = row.get("responses_create_params")
    if params is None:
        return None, "missing `responses_create_params` (the model call parameters, with `input`)"
    if not isinstance(params, dict):
        return None, "`responses_create_params` must be an object with `input`"
    if "input" not in params:
        return None, "`responses_create_params` has no `input` (the prompt: a string or a list of messages)"
    body = {**row, "response": _PLACEHOLDER_RESPONSE} if verify.with_response else row
    try:
        verify.model.model_validate(body)
    except ValidationError as err:
        errors = [e for e in err.errors() if not (e.get("loc") and e["loc"][0] == "response")]
        if errors:
            details = "; ".join(format_validation_errors(errors))
            return None, f"does not fit {verify.description}: {details}"
    except Exception as err:  # a custom validator that raised something else
        return None, f"does not fit {verify.description}: {type(err).__name__}: {err}"
    return row, None


def _render_prompt(row: dict, prompt: PromptConfig) -> tuple[Optional[dict], Optional[str]]:
    params = row.get("responses_create_params")
    if isinstance(params, dict) and params.get("input") not in (None, "", []):
        return None, (
            f"has its own `responses_create_params.input`, but the dataset's prompt_config ({prompt.source}) writes "
            "the input; remove the row's input or the prompt_config"
        )
    try:
        return apply_prompt_to_row(row, prompt), None
    except KeyError as err:
        return None, str(err.args[0] if err.args else err)
    except ValueError as err:
        return None, str(err)


def validate_and_measure(
    item: DatasetToPrepare, verify: VerifyModel, errors: "list[RowError] | RowErrorCollector"
) -> DatasetMetricsAccumulator:
    """Stream one file: append every invalid line to `errors`, return the aggregates of the valid ones."""
    accumulator = DatasetMetricsAccumulator()
    for number, line in _iter_lines(item.path):
        row, reason = _check_row(line, verify, item.prompt_config)
        if reason is not None:
            errors.append(RowError(item, number, reason))
            continue
        accumulator.add_row(row)
    return accumulator


# --------------------------------------------------------------------------------------------------
# Conflicts
# --------------------------------------------------------------------------------------------------


def _tolerance(a: float, b: float) -> float:
    return 5e-3 if max(abs(a), abs(b)) >= 1 else 5e-4


def _equal(a: Any, b: Any) -> bool:
    return not compare_metrics(a, b)


def compare_metrics(existing: Any, new: Any, path: str = "") -> list[str]:
    """Differences between two metrics documents, one line per differing key path (empty = same).

    Numbers compare with an absolute tolerance (5e-3 when |x| >= 1, else 5e-4), lists as multisets, and a
    key missing on one side equals null on the other."""
    where = path or "(top level)"
    if isinstance(existing, bool) or isinstance(new, bool):
        return [] if existing is new or existing == new and type(existing) is type(new) else [
            f"{where}: {existing!r} != {new!r}"
        ]
    if _is_number(existing) and _is_number(new):
        if abs(float(existing) - float(new)) <= _tolerance(float(existing), float(new)) + 1e-12:
            return []
        return [f"{where}: {existing!r} != {new!r}"]
    if isinstance(existing, dict) and isinstance(new, dict):
        diffs: list[str] = []
        for key in list(existing) + [k for k in new if k not in existing]:
            sub = f"{path}.{key}" if path else str(key)
            diffs += compare_metrics(existing.get(key), new.get(key), sub)
        return diffs
    if isinstance(existing, list) and isinstance(new, list):
        remaining = list(new)
        unmatched = []
        for item in existing:
            for index, candidate in enumerate(remaining):
                if _equal(item, candidate):
                    del remaining[index]
                    break
            else:
                unmatched.append(item)
        if unmatched or remaining:
            return [f"{where}: lists differ (only in existing: {unmatched!r}; only in new: {remaining!r})"]
        return []
    if existing == new:
        return []
    return [f"{where}: {existing!r} != {new!r}"]


@dataclass
class _MetricsOutput:
    what: str  # for messages
    path: Path
    conflict_path: Path
    document: dict
    differences: list[str] = field(default_factory=list)
    unchanged: bool = False


PLACEHOLDER_METRICS_KEY = "Placeholder data"  # `true` in metrics measured on placeholder rows (a scaffold's)


def _check_conflict(output: _MetricsOutput) -> None:
    if not output.path.exists():
        return
    try:
        existing = json.loads(output.path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as err:
        output.differences = [f"the existing file can't be read as JSON ({err})"]
        return
    placeholder = isinstance(existing, dict) and existing.pop(PLACEHOLDER_METRICS_KEY, None) is True
    differences = compare_metrics(existing, output.document)
    output.differences = [] if placeholder else differences
    output.unchanged = not differences


# --------------------------------------------------------------------------------------------------
# Writing
# --------------------------------------------------------------------------------------------------


def _tmp_path(path: Path) -> Path:
    return path.with_name(f".{path.name}.tmp-{os.getpid()}")


def _write_json_atomic(path: Path, document: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = _tmp_path(path)
    tmp.write_text(json.dumps(document, indent=4) + "\n", encoding="utf-8")
    os.replace(tmp, path)


def _agent_ref(agent_name: str) -> dict[str, str]:
    return {"type": AGENT_SERVER_TYPE, "name": agent_name}


def _write_prepared(item: DatasetToPrepare, prepare_out: TextIO, collated_out: TextIO) -> int:
    """Copy the file's rows with `agent_ref` set (and the dataset's prompt rendered), each `num_repeats` times,
    into both outputs."""
    ref = _agent_ref(item.agent_name)
    ref_suffix = ', "agent_ref": ' + json.dumps(ref) + "}\n"
    prompt = item.prompt_config
    written = 0
    for _, line in _iter_lines(item.path):
        body = line.rstrip()
        if prompt is not None:
            row = apply_prompt_to_row(json.loads(line), prompt)
            row["agent_ref"] = ref
            text = json.dumps(row) + "\n"
        elif '"agent_ref"' not in body and body.endswith("}"):
            # Fast path (pass 1 proved the line is a JSON object without agent_ref): append the key in place.
            text = body[:-1].rstrip() + ref_suffix
        else:
            row = json.loads(line)
            row["agent_ref"] = ref
            text = json.dumps(row) + "\n"
        for _ in range(item.dataset.num_repeats):
            prepare_out.write(text)
            collated_out.write(text)
            written += 1
    return written


# --------------------------------------------------------------------------------------------------
# The whole command
# --------------------------------------------------------------------------------------------------


def _say(message: str) -> None:
    print(message, flush=True)


def _warn(message: str) -> None:
    sys.stderr.write(f"warning: {message}\n")
    sys.stderr.flush()


class RowErrorCollector:
    """Collects invalid lines without holding them all: the first `MAX_ERRORS_IN_MESSAGE` stay in memory
    for the message, every one is streamed to a temporary report file (moved into `output_dirpath` when the
    message can't show them all)."""

    def __init__(self) -> None:
        self.count = 0
        self.shown: list[RowError] = []
        self.per_dataset: dict[str, int] = {}
        self._report: Optional[TextIO] = None

    def __len__(self) -> int:
        return self.count

    def append(self, error: RowError) -> None:
        self.count += 1
        label = error.dataset.label
        self.per_dataset[label] = self.per_dataset.get(label, 0) + 1
        if len(self.shown) < MAX_ERRORS_IN_MESSAGE:
            self.shown.append(error)
        if self._report is None:
            self._report = tempfile.NamedTemporaryFile(
                "w", encoding="utf-8", prefix="ng_prepare_data_errors_", suffix=".txt", delete=False
            )
        self._report.write(f"{error}\n")

    def close(self) -> Optional[Path]:
        """Close the report; its path (None when nothing was collected)."""
        if self._report is None:
            return None
        self._report.close()
        return Path(self._report.name)

    def to_error(self, output_dir: Path, checked: int) -> PrepareDataError:
        report = self.close()
        summary = ", ".join(f"{label}: {count}" for label, count in self.per_dataset.items())
        # The first line names the first bad line (`file:line: dataset: problem`), so a one-line reader sees it.
        head = f"{self.count} invalid line(s) in {len(self.per_dataset)} of {checked} dataset(s)"
        if self.count == 1 and self.shown:
            if report is not None:
                report.unlink(missing_ok=True)
            return PrepareDataError(f"{head}: {self.shown[0]} (fix or remove the line; nothing was written)")
        first = f", the first at {self.shown[0]}" if self.shown else ""
        text = f"{head}{first} (per dataset: {summary}; all listed below):\n"
        text += "\n".join(f"  {error}" for error in self.shown)
        hidden = self.count - len(self.shown)
        if hidden > 0 and report is not None:
            target = output_dir / ERROR_REPORT_FILENAME
            try:
                output_dir.mkdir(parents=True, exist_ok=True)
                shutil.move(str(report), target)
                text += f"\n  ... and {hidden} more; all of them are listed in {target}"
            except OSError:
                text += f"\n  ... and {hidden} more; all of them are listed in {report}"
        else:
            if report is not None:
                report.unlink(missing_ok=True)
        text += "\nFix or remove these lines; nothing was written."
        return PrepareDataError(text)


def prepare_data(
    config: TrainDataProcessorConfig, global_config: DictConfig, *, cwd: Optional[Path] = None
) -> dict[str, Path]:
    """Validate, measure and collate the in-scope datasets. Returns `{type: <output_dirpath>/<type>.jsonl}`.

    Raises `PrepareDataError` (a `NeMoGymConfigError`) for missing files, invalid lines (all of them,
    with file and line) and metric conflicts; nothing but conflict files is written in those cases."""
    cwd = Path(cwd) if cwd is not None else Path.cwd()
    output_dir = Path(os.path.expanduser(config.output_dirpath))
    if not output_dir.is_absolute():
        output_dir = cwd / output_dir

    datasets = find_datasets_in_scope(config, global_config, cwd=cwd)
    check_dataset_files(config, datasets)

    types = list(dict.fromkeys(item.dataset.type for item in datasets))
    collated_paths = {t: output_dir / f"{t}.jsonl" for t in types}
    inputs = {item.path.resolve() for item in datasets}
    for t, path in collated_paths.items():
        if path.resolve() in inputs:
            raise NeMoGymConfigError(
                f"The collated output {path} would overwrite an input dataset file. "
                "Choose another +output_dirpath."
            )

    # Pass 1: validate every row of every dataset and measure the valid ones.
    verify_models: dict[Optional[str], VerifyModel] = {}
    errors = RowErrorCollector()
    accumulators: list[DatasetMetricsAccumulator] = []
    for item in datasets:
        if item.resources_server_name not in verify_models:
            verify = load_verify_request_model(global_config, item.resources_server_name, cwd=cwd)
            if verify.warning:
                _warn(verify.warning)
            verify_models[item.resources_server_name] = verify
        verify = verify_models[item.resources_server_name]
        accumulators.append(validate_and_measure(item, verify, errors))
    if errors.count:
        raise errors.to_error(output_dir, len(datasets))

    # Metrics documents, per dataset and per type, and their conflicts with existing files.
    outputs: list[_MetricsOutput] = []
    for item, acc in zip(datasets, accumulators):
        outputs.append(
            _MetricsOutput(item.label, item.metrics_path, item.conflict_path, metrics_document(item.dataset, acc))
        )
    for t in types:
        members = [(item, acc) for item, acc in zip(datasets, accumulators) if item.dataset.type == t]
        merged = DatasetMetricsAccumulator()
        for _, acc in members:
            merged.merge(acc)
        outputs.append(
            _MetricsOutput(
                f"collated {t} metrics",
                output_dir / f"{t}_metrics.json",
                output_dir / f"{t}_metrics_conflict.json",
                metrics_document(members[0][0].dataset, merged),
            )
        )
    for output in outputs:
        _check_conflict(output)

    conflicts = [o for o in outputs if o.differences]
    if conflicts and not config.overwrite_metrics_conflicts:
        parts = []
        for o in conflicts:
            _write_json_atomic(o.conflict_path, o.document)
            shown = "\n".join(f"      {d}" for d in o.differences[:20])
            more = f"\n      ... and {len(o.differences) - 20} more" if len(o.differences) > 20 else ""
            parts.append(f"  - {o.what}: {o.path} differs; new metrics written to {o.conflict_path}\n{shown}{more}")
        raise PrepareDataError(
            f"{len(conflicts)} metrics file(s) differ from what the data gives now:\n"
            + "\n".join(parts)
            + "\nIf the data changed on purpose, pass +overwrite_metrics_conflicts=true (or delete the old files)."
        )

    for output in outputs:
        if not output.unchanged:
            if output.differences:
                _warn(f"overwriting {output.path} ({len(output.differences)} difference(s)): {output.what}")
            _write_json_atomic(output.path, output.document)
        if output.conflict_path.exists():
            output.conflict_path.unlink()  # resolved: a stale conflict file would fail data checks

    # Pass 2: the prepared copies and the collated files.
    output_dir.mkdir(parents=True, exist_ok=True)
    collated_tmp = {t: _tmp_path(p) for t, p in collated_paths.items()}
    handles = {t: tmp.open("w", encoding="utf-8") for t, tmp in collated_tmp.items()}
    counts: dict[str, int] = {t: 0 for t in types}
    try:
        for item, acc in zip(datasets, accumulators):
            tmp = _tmp_path(item.prepare_path)
            with tmp.open("w", encoding="utf-8") as prepare_out:
                written = _write_prepared(item, prepare_out, handles[item.dataset.type])
            os.replace(tmp, item.prepare_path)
            counts[item.dataset.type] += written
            _say(
                f"{item.label}: {acc.examples} row(s) valid, {written} prepared "
                f"(x{item.dataset.num_repeats}) -> {item.prepare_path}"
            )
    except BaseException:
        for t, handle in handles.items():
            handle.close()
            collated_tmp[t].unlink(missing_ok=True)
        raise
    for t, handle in handles.items():
        handle.close()
        os.replace(collated_tmp[t], collated_paths[t])
        _say(f"{t}: {counts[t]} row(s) -> {collated_paths[t]} (metrics: {output_dir / f'{t}_metrics.json'})")
    return collated_paths

