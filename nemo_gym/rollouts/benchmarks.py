"""Benchmarks and environments as data (NeMo Gym v0.5's `benchmarks/` and `environments/` folders).

A **benchmark** is any YAML file below a search root's `benchmarks/` folder that declares a dataset of
`type: benchmark` (`BenchmarkDatasetConfig`) on an agent block. Its name is its path relative to `benchmarks/`
without `.yaml`, and `<x>/config.yaml` is named `<x>`. The dataset's JSONL is not committed: its `prepare_script`
(a dotted module path) has `prepare(**args)`, which writes the file and returns its path (`prepare_benchmarks`,
the `ng_prepare_benchmark` command). Collation (`ng_prepare_data`, `ng_e2e_collect_rollouts +split=benchmark`)
then renders the dataset's `prompt_config` into every row and copies each row `num_repeats` times.

An **environment** is `environments/<name>/config.yaml`: a complete composition (resources server + agent +
datasets). Listings read `domain` / `description` / `value` from its resources server blocks.

Search roots (`component_search_roots`): `NEMO_GYM_EXTRA_ROOTS` (os.pathsep list), then the current directory,
then the install root; an earlier root wins, so a user's own `benchmarks/<name>` shadows a shipped one.

Why discovery reads the YAML directly instead of building the global config: listing must work without a model
config and without validating server references, and one broken definition must not hide the others (it is
reported and skipped).
"""

from __future__ import annotations

import concurrent.futures
import importlib
import importlib.util
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Mapping, Optional, Sequence

import yaml
from omegaconf import DictConfig, OmegaConf
from pydantic import BaseModel, Field, ValidationError

from nemo_gym.config.types import (
    AGENT_SERVER_TYPE,
    RESOURCES_SERVER_TYPE,
    BaseNeMoGymCLIConfig,
    BenchmarkDatasetConfig,
    format_validation_errors,
    parse_dataset_config,
)
from nemo_gym.errors import NeMoGymConfigError, did_you_mean
from nemo_gym.rollouts.prompts import EXTRA_ROOTS_ENV_VAR_NAME, prompt_search_roots

__all__ = [
    "EXTRA_ROOTS_ENV_VAR_NAME",
    "BENCHMARKS_DIRNAME",
    "ENVIRONMENTS_DIRNAME",
    "component_search_roots",
    "resolve_component_path",
    "BenchmarkConfig",
    "EnvironmentConfig",
    "discover_benchmarks",
    "discover_environments",
    "find_benchmark",
    "find_environment",
    "listing_of_config_file",
    "BenchmarkToPrepare",
    "benchmark_datasets_in",
    "PrepareBenchmarkConfig",
    "prepare_benchmarks",
]

BENCHMARKS_DIRNAME = "benchmarks"
ENVIRONMENTS_DIRNAME = "environments"
DEFINITION_FILENAME = "config.yaml"
LISTING_FIELDS = ("domain", "description", "value")


# --------------------------------------------------------------------------------------------------------
# Search roots


def component_search_roots() -> list[Path]:
    """Where config files, data, prompts and definitions are looked up, earliest (winning) first:
    `NEMO_GYM_EXTRA_ROOTS`, the current directory, the install root. (One list for everything: the prompt loader
    uses the same.)"""
    return prompt_search_roots()


def resolve_component_path(path: str | os.PathLike, roots: Optional[Sequence[Path]] = None) -> Path:
    """An absolute path for `path`. Absolute paths are kept. A relative one is taken in the first root that has
    the file; when none has it yet (a file a prepare script is about to write), in the root that holds the
    deepest existing part of its directory (ties: the earlier root), so `benchmarks/x/data/x.jsonl` lands next to
    the `benchmarks/x` it belongs to."""
    candidate = Path(os.path.expanduser(os.fspath(path)))
    if candidate.is_absolute():
        return candidate
    roots = list(roots) if roots is not None else component_search_roots()
    for root in roots:
        if (root / candidate).is_file():
            return root / candidate
    best, best_depth = roots[0] / candidate, 0
    for root in roots:
        parents = list(candidate.parents)[:-1]  # deepest first, without "."
        for depth_from_top, parent in enumerate(reversed(parents), start=1):
            if not (root / parent).is_dir():
                break
            if depth_from_top > best_depth:
                best, best_depth = root / candidate, depth_from_top
    return best


# --------------------------------------------------------------------------------------------------------
# Reading definitions


def _warn(message: str) -> None:
    print(f"WARNING: {message}", file=sys.stderr, flush=True)


def _load_yaml(path: Path) -> dict:
    """The YAML file as a dict; `NeMoGymConfigError` naming the file when it does not parse or is not a mapping."""
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError) as err:
        raise NeMoGymConfigError(f"{path}: cannot read it as YAML: {str(err).splitlines()[0]}") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise NeMoGymConfigError(f"{path}: expected a mapping of config keys at the top, got {type(data).__name__}.")
    return data


def _server_blocks(data: Mapping, server_type: str) -> Iterable[tuple[str, str, Mapping]]:
    """(server id, implementation, implementation dict) of every top-level block of `server_type`."""
    for server_id, block in data.items():
        if not isinstance(block, Mapping) or not isinstance(block.get(server_type), Mapping):
            continue
        for impl, impl_cfg in block[server_type].items():
            if isinstance(impl_cfg, Mapping):
                yield str(server_id), str(impl), impl_cfg


def _listing(data: Mapping) -> dict[str, Optional[str]]:
    """`domain`, `description` and `value` of the first resources server block that sets each."""
    found: dict[str, Optional[str]] = {key: None for key in LISTING_FIELDS}
    for _, _, impl_cfg in _server_blocks(data, RESOURCES_SERVER_TYPE):
        for key in LISTING_FIELDS:
            if found[key] is None and impl_cfg.get(key) is not None:
                found[key] = str(impl_cfg.get(key))
    return found


def listing_of_config_file(path: Path) -> dict[str, Optional[str]]:
    """The listing fields of one config file (e.g. a resources server's `configs/<name>.yaml`), for `gym list` and
    `gym search`; a file that does not parse lists none."""
    try:
        return _listing(_load_yaml(path))
    except NeMoGymConfigError:
        return {key: None for key in LISTING_FIELDS}


class _Definition(BaseModel):
    """What benchmarks and environments share: a name, the YAML that defines it, and its listing fields."""

    name: str
    config_path: Path  # the definition YAML (absolute)
    root: Path  # the search root it was found under
    resources_servers: list[str] = Field(default_factory=list)  # implementation names, e.g. ["mcqa"]
    domain: Optional[str] = None
    description: Optional[str] = None
    value: Optional[str] = None

    @property
    def config_relpath(self) -> str:
        """The definition's path relative to its root, what `+config_paths=[...]` takes."""
        return self.config_path.relative_to(self.root).as_posix()

    def to_json(self) -> dict[str, Any]:
        data = self.model_dump(mode="json", exclude_none=False)
        data["config_path"] = self.config_relpath
        return data


class BenchmarkConfig(_Definition):
    """One discovered benchmark: its name, where its definition is, and the `type: benchmark` dataset."""

    agent_name: str  # the agent block that carries the dataset
    dataset: BenchmarkDatasetConfig

    def to_json(self) -> dict[str, Any]:
        data = super().to_json()
        data["agent"] = data.pop("agent_name")
        data["dataset"] = self.dataset.model_dump(mode="json", exclude_none=True)
        return data


class EnvironmentConfig(_Definition):
    """One discovered environment (`environments/<name>/config.yaml`)."""

    agents: list[str] = Field(default_factory=list)  # agent block ids
    dataset_types: list[str] = Field(default_factory=list)


def _benchmark_datasets(data: Mapping, where: str) -> list[tuple[str, BenchmarkDatasetConfig]]:
    """(agent id, dataset) of every `type: benchmark` dataset; a malformed one is a `NeMoGymConfigError`."""
    found = []
    for server_id, _, impl_cfg in _server_blocks(data, AGENT_SERVER_TYPE):
        datasets = impl_cfg.get("datasets") or []
        if not isinstance(datasets, list):
            continue
        for index, raw in enumerate(datasets):
            if not isinstance(raw, Mapping) or raw.get("type") != "benchmark":
                continue
            try:
                found.append((server_id, BenchmarkDatasetConfig.model_validate(dict(raw))))
            except ValidationError as err:
                lines = "; ".join(format_validation_errors(err))
                raise NeMoGymConfigError(
                    f"{where}: `{server_id}` datasets[{index}] (type benchmark) is invalid: {lines}"
                ) from None
    return found


def _benchmark_name(relative: Path) -> str:
    """`aime24/config.yaml` -> `aime24`; `gpqa/diamond.yaml` -> `gpqa/diamond`; `x.yaml` -> `x`."""
    parts = list(relative.with_suffix("").parts)
    if len(parts) > 1 and relative.name == DEFINITION_FILENAME:
        parts = parts[:-1]
    return "/".join(parts)


def discover_benchmarks(roots: Optional[Sequence[Path]] = None) -> dict[str, BenchmarkConfig]:
    """Every benchmark under `<root>/benchmarks/` of the search roots, by name (sorted). A name found in an
    earlier root shadows the same name in a later one. A YAML that does not parse, or declares a malformed
    benchmark dataset, is reported on stderr and skipped; YAML files without a benchmark dataset (shared prompt
    templates, say) are not benchmarks."""
    found: dict[str, BenchmarkConfig] = {}
    for root in roots if roots is not None else component_search_roots():
        root = Path(root).resolve()
        folder = root / BENCHMARKS_DIRNAME
        if not folder.is_dir():
            continue
        for path in sorted(folder.rglob("*.yaml")):
            relative = path.relative_to(folder)
            if any(part.startswith((".", "_")) or part == "__pycache__" for part in relative.parts[:-1]):
                continue
            name = _benchmark_name(relative)
            if name in found:
                continue
            try:
                data = _load_yaml(path)
                datasets = _benchmark_datasets(data, str(path))
            except NeMoGymConfigError as err:
                _warn(f"skipping benchmark definition {path}: {err}")
                continue
            if not datasets:
                continue
            if len(datasets) > 1:
                agents = ", ".join(agent for agent, _ in datasets)
                _warn(f"skipping benchmark definition {path}: it declares {len(datasets)} benchmark datasets "
                      f"({agents}); a benchmark has exactly one.")
                continue
            agent, dataset = datasets[0]
            found[name] = BenchmarkConfig(
                name=name,
                config_path=path,
                root=root,
                agent_name=agent,
                dataset=dataset,
                resources_servers=[impl for _, impl, _ in _server_blocks(data, RESOURCES_SERVER_TYPE)],
                **_listing(data),
            )
    return dict(sorted(found.items()))


def discover_environments(roots: Optional[Sequence[Path]] = None) -> dict[str, EnvironmentConfig]:
    """Every `environments/<name>/config.yaml` of the search roots, by name (sorted; earlier roots shadow later
    ones). A file that does not parse is reported on stderr and skipped."""
    found: dict[str, EnvironmentConfig] = {}
    for root in roots if roots is not None else component_search_roots():
        root = Path(root).resolve()
        folder = root / ENVIRONMENTS_DIRNAME
        if not folder.is_dir():
            continue
        for path in sorted(folder.glob(f"*/{DEFINITION_FILENAME}")):
            name = path.parent.name
            if name in found or name.startswith((".", "_")):
                continue
            try:
                data = _load_yaml(path)
            except NeMoGymConfigError as err:
                _warn(f"skipping environment definition {path}: {err}")
                continue
            agents = list(_server_blocks(data, AGENT_SERVER_TYPE))
            types = []
            for _, _, impl_cfg in agents:
                for raw in impl_cfg.get("datasets") or []:
                    if isinstance(raw, Mapping) and raw.get("type") and raw["type"] not in types:
                        types.append(str(raw["type"]))
            found[name] = EnvironmentConfig(
                name=name,
                config_path=path,
                root=root,
                resources_servers=[impl for _, impl, _ in _server_blocks(data, RESOURCES_SERVER_TYPE)],
                agents=[server_id for server_id, _, _ in agents],
                dataset_types=types,
                **_listing(data),
            )
    return dict(sorted(found.items()))


def _find(kind: str, name: str, known: Mapping[str, Any]) -> Any:
    if name in known:
        return known[name]
    roots = ", ".join(str(r) for r in component_search_roots())
    hint = did_you_mean(name, list(known)) or ""
    listing = ", ".join(known) if known else "(none)"
    raise NeMoGymConfigError(
        f"No {kind} named `{name}` under {kind}s/ of the search roots ({roots}).{hint} Known: {listing}. "
        f"Add a root with {EXTRA_ROOTS_ENV_VAR_NAME} if it lives elsewhere."
    )


def find_benchmark(name: str, roots: Optional[Sequence[Path]] = None) -> BenchmarkConfig:
    """The benchmark called `name`; `NeMoGymConfigError` with the known names (and a did-you-mean) otherwise."""
    return _find("benchmark", name, discover_benchmarks(roots))


def find_environment(name: str, roots: Optional[Sequence[Path]] = None) -> EnvironmentConfig:
    return _find("environment", name, discover_environments(roots))


# --------------------------------------------------------------------------------------------------------
# Preparing benchmark data


class PrepareBenchmarkConfig(BaseNeMoGymCLIConfig):
    """Write the JSONL of every benchmark dataset in the config by calling its `prepare_script`'s
    `prepare(**prepare_script_args)`, which must return the dataset's `jsonl_fpath`. All scripts are imported and
    checked before any runs.

    Example: ng_prepare_benchmark "+config_paths=[benchmarks/arithmetic/config.yaml,
    responses_api_models/local_llama_model/configs/local_llama_model.yaml]" +use_cached_prepared_benchmarks=true
    """

    use_cached_prepared_benchmarks: bool = Field(
        default=False, description="Skip a benchmark whose JSONL already exists instead of preparing it again."
    )
    num_prepare_benchmark_processes: int = Field(
        default=1, ge=1, description="How many benchmarks are prepared at once (separate processes)."
    )
    prepare_script_args: dict[str, Any] = Field(
        default_factory=dict, description="Keyword arguments passed to every `prepare(...)`."
    )


@dataclass
class BenchmarkToPrepare:
    """One agent block's benchmark dataset, with its file resolved over the search roots."""

    agent_name: str
    dataset: BenchmarkDatasetConfig
    path: Path  # absolute
    module_file: Optional[Path] = None  # the prepare script's file when found under a search root
    prepare: Any = field(default=None, repr=False)  # the imported `prepare` callable


def _as_plain(node: Any) -> Any:
    if isinstance(node, DictConfig) or OmegaConf.is_list(node):
        return OmegaConf.to_container(node, resolve=True)
    return node


def benchmark_datasets_in(global_config: Any) -> list[BenchmarkToPrepare]:
    """The `type: benchmark` dataset of every agent block of the (global) config, in config order. An agent
    with more than one is a `NeMoGymConfigError` (a benchmark has exactly one dataset)."""
    data = global_config
    found: list[BenchmarkToPrepare] = []
    for server_id in list(data.keys()):
        try:
            block = data.get(server_id)
        except Exception:  # an unrelated key that does not resolve is not our business
            continue
        if not isinstance(block, (Mapping, DictConfig)) or AGENT_SERVER_TYPE not in block:
            continue
        for impl, impl_cfg in block[AGENT_SERVER_TYPE].items():
            if not isinstance(impl_cfg, (Mapping, DictConfig)) or impl_cfg.get("datasets") is None:
                continue
            try:
                raw_datasets = _as_plain(impl_cfg.get("datasets")) or []
            except Exception as err:
                raise NeMoGymConfigError(f"Agent `{server_id}`: cannot resolve `datasets`: {err}") from None
            mine = []
            for index, raw in enumerate(raw_datasets):
                if not isinstance(raw, Mapping) or raw.get("type") != "benchmark":
                    continue
                try:
                    mine.append(parse_dataset_config(raw))
                except ValidationError as err:
                    lines = "; ".join(format_validation_errors(err))
                    raise NeMoGymConfigError(
                        f"Agent `{server_id}`: datasets[{index}] (type benchmark) is invalid: {lines}"
                    ) from None
            if len(mine) > 1:
                names = ", ".join(d.name for d in mine)
                raise NeMoGymConfigError(
                    f"Agent `{server_id}` has {len(mine)} benchmark datasets ({names}); a benchmark agent has exactly "
                    "one. Split them into one agent block (or one benchmark definition) each."
                )
            for dataset in mine:
                found.append(BenchmarkToPrepare(str(server_id), dataset, resolve_component_path(dataset.jsonl_fpath)))
    return found


def _module_file(dotted: str) -> Optional[Path]:
    """The file of module `dotted` under the first search root that has it (`a.b` -> `a/b.py` or
    `a/b/__init__.py`)."""
    relative = Path(*dotted.split("."))
    for root in component_search_roots():
        for candidate in (root / relative.with_suffix(".py"), root / relative / "__init__.py"):
            if candidate.is_file():
                return candidate.resolve()
    return None


def _import_prepare(dotted: str, module_file: Optional[Path]):
    """The module's `prepare` callable. A module found under a search root is loaded from that file (so a user's
    `benchmarks.x.prepare` wins over a shipped one of the same name); anything else is imported normally."""
    if module_file is not None:
        loaded = sys.modules.get(dotted)
        if loaded is not None and Path(getattr(loaded, "__file__", "") or "").resolve() == module_file:
            module = loaded
        else:
            spec = importlib.util.spec_from_file_location(dotted, module_file)
            module = importlib.util.module_from_spec(spec)
            sys.modules[dotted] = module
            try:
                spec.loader.exec_module(module)
            except BaseException:
                sys.modules.pop(dotted, None)
                raise
    else:
        module = importlib.import_module(dotted)
    return getattr(module, "prepare", None)


def _validate_scripts(items: list[BenchmarkToPrepare]) -> None:
    """Import every prepare script and check it has a callable `prepare`; all problems in one error."""
    problems = []
    for item in items:
        dotted = item.dataset.prepare_script
        where = f"agent `{item.agent_name}`, dataset `{item.dataset.name}`: prepare_script `{dotted}`"
        if not dotted or any(not part.isidentifier() for part in dotted.split(".")):
            problems.append(f"{where} is not a dotted module path (e.g. benchmarks.my_bench.prepare)")
            continue
        item.module_file = _module_file(dotted)
        try:
            item.prepare = _import_prepare(dotted, item.module_file)
        except ModuleNotFoundError as err:
            roots = ", ".join(str(r) for r in component_search_roots())
            problems.append(f"{where} cannot be imported ({err}); it is neither under the search roots ({roots}) "
                            "nor an installed module")
            continue
        except Exception as err:
            problems.append(f"{where} fails on import: {type(err).__name__}: {err}")
            continue
        if not callable(item.prepare):
            problems.append(f"{where} ({item.module_file or dotted}) has no function `prepare(**kwargs)`")
    if problems:
        body = "\n".join(f"  - {p}" for p in problems)
        raise NeMoGymConfigError(f"{len(problems)} benchmark prepare script(s) unusable, nothing was prepared:\n{body}")


def _run_prepare(dotted: str, module_file: Optional[str], args: dict[str, Any]) -> str:
    """Call one `prepare(**args)` (also in a worker process, hence the plain arguments)."""
    fn = _import_prepare(dotted, Path(module_file) if module_file else None)
    result = fn(**args)
    return os.fspath(result) if result is not None else ""


def _check_result(item: BenchmarkToPrepare, returned: str) -> None:
    if not returned:
        raise NeMoGymConfigError(
            f"Benchmark dataset `{item.dataset.name}` (agent `{item.agent_name}`): {item.dataset.prepare_script}."
            f"prepare() returned nothing; it must return the path it wrote, {item.dataset.jsonl_fpath}."
        )
    got = resolve_component_path(returned).resolve()
    if got != item.path.resolve():
        raise NeMoGymConfigError(
            f"Benchmark dataset `{item.dataset.name}` (agent `{item.agent_name}`): {item.dataset.prepare_script}."
            f"prepare() returned {got}, but the dataset's jsonl_fpath `{item.dataset.jsonl_fpath}` is {item.path}. "
            "Make the script write where the config says, or fix jsonl_fpath."
        )
    if not item.path.is_file():
        raise NeMoGymConfigError(
            f"Benchmark dataset `{item.dataset.name}`: {item.dataset.prepare_script}.prepare() returned {got} "
            "but did not write that file."
        )


def prepare_benchmarks(config: PrepareBenchmarkConfig, global_config: Any) -> list[Path]:
    """Prepare every benchmark dataset of the config; returns their JSONL paths (in config order). With
    `use_cached_prepared_benchmarks`, a dataset whose file exists is left as is. Raises `NeMoGymConfigError` when
    the config has no benchmark dataset, a script is unusable (all are checked first), or a script returns
    another path than its `jsonl_fpath`."""
    items = benchmark_datasets_in(global_config)
    if not items:
        raise NeMoGymConfigError(
            "No benchmark dataset (`type: benchmark` on an agent block) in the config. Load a benchmark definition: "
            '"+config_paths=[benchmarks/<name>/config.yaml]" (ng_list_benchmarks lists them).'
        )
    todo = [i for i in items if not (config.use_cached_prepared_benchmarks and i.path.is_file())]
    for item in items:
        if item not in todo:
            print(f"{item.dataset.name}: using the prepared {item.path}", flush=True)
    if not todo:
        return [i.path for i in items]
    _validate_scripts(todo)
    args = dict(config.prepare_script_args)
    jobs = [(i.dataset.prepare_script, str(i.module_file) if i.module_file else None, args) for i in todo]

    def report(item: BenchmarkToPrepare, returned: str) -> None:
        _check_result(item, returned)
        print(f"{item.dataset.name}: prepared {item.path}", flush=True)

    if config.num_prepare_benchmark_processes > 1 and len(todo) > 1:
        workers = min(config.num_prepare_benchmark_processes, len(todo))
        with concurrent.futures.ProcessPoolExecutor(max_workers=workers) as pool:
            futures = [pool.submit(_run_prepare, *job) for job in jobs]
            for item, future in zip(todo, futures):
                report(item, _checked(item, future.result))
    else:
        for item, job in zip(todo, jobs):
            report(item, _checked(item, lambda job=job: _run_prepare(*job)))
    return [i.path for i in items]


def _checked(item: BenchmarkToPrepare, call) -> str:
    """Run one prepare; a script's own error names the benchmark (an offline failure keeps its message)."""
    try:
        return call()
    except NeMoGymConfigError:
        raise
    except Exception as err:
        raise NeMoGymConfigError(
            f"Benchmark dataset `{item.dataset.name}` (agent `{item.agent_name}`): "
            f"{item.dataset.prepare_script}.prepare() failed: {type(err).__name__}: {err}"
        ) from None
