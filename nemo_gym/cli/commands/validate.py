"""`ng_validate` / `ng validate`: check a whole config the way `ng_run` would build it, without starting anything
(NeMo Gym v0.5's `gym env validate`).

Why a command of its own: `ng_run` stops at the first mistake, and only after it has begun starting things; a user
fixing a config wants every mistake in one list, in a second, with no Ray, venv or server involved. The policy
model's settings (`policy_base_url`, `policy_api_key`, `policy_model_name`) are filled with blanks, and a config
that has no `policy_model` block at all (a resources server's config alone) gets a never-started placeholder one,
so a config that only lacks its model still validates.

What is checked, in order:
1. every file in `config_paths`, nested ones included: found, readable, valid YAML (all reported together), and
   keys given on the command line that nothing reads (the usual did-you-mean check); broken files end the check
   here, since everything after needs them;
2. the merge and the server blocks, exactly as `ng_run` parses them (almost-servers all together; otherwise the
   parser's first error, which ends the check);
3. per server: every `${...}` resolves, the implementation folder and its entrypoint exist inside the server roots
   (no `..`, absolute path or outside link: config/server_paths.py); at least one server.
Exit 0 when the config is fine, 2 with every problem listed otherwise.
"""

from __future__ import annotations

import contextlib
import io
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Optional

from nemo_gym.cli.command import Command
from nemo_gym.config.types import BaseNeMoGymCLIConfig, wants_help
from nemo_gym.errors import (
    ConfigInterpolationError,
    ConfigPathNotFoundError,
    MalformedConfigPathsError,
    NeMoGymConfigError,
    NoServerInstancesError,
)
from nemo_gym.rollouts.data_prep import POLICY_PLACEHOLDERS

POLICY_MODEL_KEY = "policy_model"
PLACEHOLDER_POLICY_MODEL_CONFIG = "responses_api_models/openai_model/configs/openai_model.yaml"


class ValidateConfig(BaseNeMoGymCLIConfig):
    """Build the global config from the config files, env.yaml and the command line exactly as ng_run would, with
    a blank policy model, and report every problem found at once: missing or broken config files, server blocks
    that fail validation, references to servers that do not exist, unset required values, interpolations that do
    not resolve, keys nothing reads, server folders or entrypoints that are not there. Nothing is started (no Ray,
    no venvs, no servers). Exits 0 when the config is fine, 2 otherwise."""


@dataclass
class ValidationReport:
    """What `validate_config` found: the problems (each a config error naming file/key/server), the warnings the
    parser printed, and the config and server ids when the config could be built."""

    problems: list[NeMoGymConfigError] = field(default_factory=list)
    warnings: str = ""
    config: Any = None
    server_ids: list[str] = field(default_factory=list)
    placeholder_policy_model: bool = False  # the config has no `policy_model`; a never-started stand-in was used

    @property
    def ok(self) -> bool:
        return not self.problems

    def error(self) -> NeMoGymConfigError:
        """One error for all problems: the problem itself when there is one (its class kept), else a list."""
        if len(self.problems) == 1:
            return self.problems[0]
        listed = "\n".join(f"  {i}. {_indent(str(p))}" for i, p in enumerate(self.problems, start=1))
        return NeMoGymConfigError(f"{len(self.problems)} problems in the config:\n{listed}")


def _indent(text: str) -> str:
    return text.replace("\n", "\n     ")


# ------------------------------------------------------------------------------------------------ the files


@dataclass
class ConfigFiles:
    """What walking env.yaml and every `config_paths` file found, without merging anything."""

    keys: set[str] = field(default_factory=set)  # top-level keys of env.yaml and the files
    loaded: list[str] = field(default_factory=list)  # the `config_paths` entries that were read
    contents: list[Any] = field(default_factory=list)  # each file as plain data, interpolations unresolved
    problems: list[NeMoGymConfigError] = field(default_factory=list)


def walk_config_files(args: list[str], cwd: Optional[Path] = None) -> ConfigFiles:
    """Read env.yaml and every config file the command line (else env.yaml) lists, nested `config_paths` included,
    collecting every file that is missing, unreadable or not valid YAML and every `config_paths` that is not a list
    of paths. Unlike the parser this does not stop at the first problem."""
    from omegaconf import OmegaConf

    from nemo_gym.config.global_config import _as_path_list, _find_env_yaml, _load_yaml_file, _resolve_config_path
    from nemo_gym.config.overrides import overrides_to_dict, parse_overrides

    cwd = Path(cwd) if cwd is not None else Path.cwd()
    found = ConfigFiles()

    def read(path: Path, listed_by: str) -> Any:
        file_cfg = _load_yaml_file(path, listed_by)
        found.keys.update(str(k) for k in file_cfg.keys())
        found.contents.append(OmegaConf.to_container(file_cfg, resolve=False))
        return file_cfg

    given = overrides_to_dict([ov for ov in parse_overrides(args) if not ov.is_delete])
    top, source = given.get("config_paths"), "the command line"
    try:
        env_path = _find_env_yaml(cwd)
        if env_path is not None:
            env_cfg = read(env_path, "env.yaml")
            if "config_paths" not in given and "config_paths" in env_cfg:
                top, source = env_cfg.get("config_paths"), f"env.yaml ({env_path})"
        queue = [(p, source) for p in _as_path_list(top, source)]
    except NeMoGymConfigError as err:
        found.problems.append(_as_class(err, MalformedConfigPathsError) if "config_paths" in str(err) else err)
        return found
    seen: set[str] = set()
    while queue:
        path_str, listed_by = queue.pop(0)
        if path_str in seen:
            continue
        seen.add(path_str)
        try:
            path = _resolve_config_path(path_str, cwd, listed_by)
        except NeMoGymConfigError as err:
            found.problems.append(_as_class(err, ConfigPathNotFoundError))
            continue
        try:
            file_cfg = read(path, listed_by)
        except NeMoGymConfigError as err:
            found.problems.append(err)
            continue
        found.loaded.append(path_str)
        if "config_paths" in file_cfg:
            try:
                nested = file_cfg.get("config_paths")
                queue.extend((p, f"config_paths in {path}") for p in _as_path_list(nested, str(path)))
            except NeMoGymConfigError as err:
                found.problems.append(_as_class(err, MalformedConfigPathsError))
            except Exception as err:  # an unresolvable interpolation in config_paths
                found.problems.append(ConfigInterpolationError(f"In {path}: cannot resolve `config_paths`: {err}"))
    return found


def unknown_key_problems(
    overrides: list, files: ConfigFiles, initial: dict, command_name: str, cwd: Optional[Path]
) -> list[NeMoGymConfigError]:
    """The usual unknown-key check (with did-you-mean), run on what the files define and refer to, so it works even
    when the config cannot be built."""
    from omegaconf import OmegaConf

    from nemo_gym.config.known_keys import check_known_keys

    what_files_define = OmegaConf.create({"config_paths": files.loaded, "file_contents": files.contents})
    try:
        check_known_keys(
            overrides,
            command_name=command_name,
            parameters=ValidateConfig.parameter_keys(),
            global_config=what_files_define,
            initial_config=initial,
            cwd=cwd,
        )
    except NeMoGymConfigError as err:
        return [err]
    return []


def placeholder_policy_model() -> dict:
    """The `policy_model` block validation stands in when the config has none (a resources server's config alone
    refers to `policy_model` but leaves the choice of model to the run): the OpenAI-compatible model server,
    pointed at the blank policy_* settings. Never started."""
    from omegaconf import OmegaConf

    from nemo_gym import PARENT_DIR
    from nemo_gym.config.global_config import _load_yaml_file

    path = Path(PARENT_DIR) / PLACEHOLDER_POLICY_MODEL_CONFIG
    block = _load_yaml_file(path, "ng_validate's placeholder policy model")[POLICY_MODEL_KEY]
    return {POLICY_MODEL_KEY: OmegaConf.to_container(block, resolve=False)}


def _as_class(err: NeMoGymConfigError, cls: type[NeMoGymConfigError]) -> NeMoGymConfigError:
    """`err` as the more specific v0.5 class `cls`, same message and attributes."""
    if isinstance(err, cls):
        return err
    typed = cls(str(err))
    typed.__dict__.update(err.__dict__)
    return typed


# ------------------------------------------------------------------------------------------------ the servers


def server_problems(
    cfg: Any, cwd: Optional[Path] = None, placeholders: Iterable[str] = ()
) -> tuple[list[str], list[NeMoGymConfigError]]:
    """(server ids, problems) of a built config: interpolations that do not resolve (in server blocks and in the
    other top-level keys), missing implementation folders or entrypoints, and a config with no server at all."""
    from omegaconf import DictConfig, ListConfig, OmegaConf

    from nemo_gym.config.global_config import (
        _explain_resolution_error,
        blocks_without_entrypoint,
        find_server_instances,
        no_entrypoint_hint,
        resolve_server_config,
    )
    from nemo_gym.config.server_paths import locate_server

    cwd = Path(cwd) if cwd is not None else Path.cwd()
    problems: list[NeMoGymConfigError] = []
    specs = find_server_instances(cfg)
    for spec in specs:
        try:
            resolve_server_config(cfg, spec.server_id)
        except NeMoGymConfigError as err:
            problems.append(_as_class(err, ConfigInterpolationError))
        try:
            locate_server(spec, cwd)  # folder and entrypoint exist, inside the server roots
        except NeMoGymConfigError as err:
            problems.append(err)
    all_ids = [spec.server_id for spec in specs]
    server_ids = [sid for sid in all_ids if sid not in set(placeholders)]
    for key in cfg.keys():
        if key in all_ids:
            continue
        try:
            value = cfg[key]
            if isinstance(value, (DictConfig, ListConfig)):
                OmegaConf.to_container(value, resolve=True)
        except Exception as err:
            problems.append(ConfigInterpolationError(_explain_resolution_error(err, str(key))))
    if not server_ids:
        hints = [no_entrypoint_hint(path) for path in blocks_without_entrypoint(cfg)]
        why = f" ({'; '.join(hints)})" if hints else ""
        problems.append(
            NoServerInstancesError(
                f"The config defines no servers{why}, so ng_run would start nothing. Load the server configs with "
                f'"+config_paths=[a.yaml,b.yaml]" (or list them in env.yaml).'
            )
        )
    return server_ids, problems


# ------------------------------------------------------------------------------------------------ all stages


def validate_config(args: list[str], cwd: Optional[Path] = None, command_name: str = "ng_validate") -> ValidationReport:
    """Check the config that `args` (Hydra-style overrides) describe; never raises for config mistakes."""
    from nemo_gym.config.global_config import parse_global_config
    from nemo_gym.config.overrides import parse_overrides

    report = ValidationReport()
    try:
        overrides = parse_overrides(args)
    except NeMoGymConfigError as err:
        report.problems.append(err)
        return report

    files = walk_config_files(args, cwd)
    initial = dict(POLICY_PLACEHOLDERS)
    cli_keys = {ov.key_path[0] for ov in overrides if not ov.is_delete}
    if POLICY_MODEL_KEY not in files.keys | cli_keys:
        initial.update(placeholder_policy_model())
        report.placeholder_policy_model = True
    report.problems.extend(files.problems)
    report.problems.extend(unknown_key_problems(overrides, files, initial, command_name, cwd))
    if files.problems:  # the parser would stop at the first of these, and everything after needs the files
        return report

    held = io.StringIO()
    try:
        with contextlib.redirect_stderr(held):
            cfg = parse_global_config(args, initial_global_config_dict=initial, cwd=cwd, allocate_ports=False)
    except NeMoGymConfigError as err:
        report.warnings = held.getvalue().replace(err.already_reported, "") if err.already_reported else held.getvalue()
        report.problems.append(err)
        return report
    report.warnings = held.getvalue()
    report.config = cfg

    placeholders = [POLICY_MODEL_KEY] if report.placeholder_policy_model else []
    report.server_ids, problems = server_problems(cfg, cwd, placeholders)
    report.problems.extend(problems)
    from nemo_gym.config.block_keys import nested_key_errors  # misspelled keys inside server blocks

    report.problems.extend(nested_key_errors(cfg, overrides, command_name=command_name, cwd=cwd, cli_sections=False))
    return report


@dataclass(frozen=True)
class ValidateCommand(Command):
    """A command that builds the config itself: the shared path stops at the first mistake, this one lists all."""

    def _main(self, args: list[str]) -> int:
        if wants_help(args):
            sys.stdout.write(self.help_text())
            return 0
        report = validate_config(args, command_name=self.script)
        if not report.ok:
            error = report.error()
            if report.warnings.strip():  # after the error line: the first line of stderr says what is wrong
                error.deferred_warnings = report.warnings
            raise error
        if report.warnings:
            sys.stderr.write(report.warnings)
        servers = ", ".join(report.server_ids)
        stand_in = (
            f" (and a placeholder `{POLICY_MODEL_KEY}`: the config defines none, so the run must supply one)"
            if report.placeholder_policy_model
            else ""
        )
        sys.stdout.write(
            f"Config OK: {len(report.server_ids)} server(s): {servers}{stand_in}. Nothing was started.\n"
        )
        return 0


def run(config: ValidateConfig) -> int:
    """For a caller that already built the config (`COMMAND.run(config)`): the per-server checks."""
    _, problems = server_problems(config.global_config)
    if problems:
        raise ValidationReport(problems=problems).error()
    return 0


COMMAND = ValidateCommand(
    name="validate",
    verb="validate",
    summary="Check a whole config as ng_run would build it, list every problem at once; starts nothing.",
    model=ValidateConfig,
    run=run,
    initial_config=POLICY_PLACEHOLDERS,
    examples=(
        'ng_validate "+config_paths=[configs/quickstart.yaml]"',
        'ng validate "+config_paths=[resources_servers/example_single_tool_call/configs/'
        'example_single_tool_call.yaml]"',
    ),
)
