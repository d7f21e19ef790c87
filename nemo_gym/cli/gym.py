"""The `gym` command tree of NeMo Gym v0.5 (`gym <group> <action> [flags] [+key=value ...]`) over our commands.

`gym` is one more front over the registered `Command` objects (`nemo_gym/cli/commands/`), like `ng <verb>` and
`ng_<name>`: `translate(argv)` turns the words into a registered command name and its `+key=value` overrides, and
`main` hands those to `Command.main`. No command's logic lives here. The few v0.5 actions that have no command of
their own (`env packages`, `dev test`, `list environments|agents|models|resources-servers`, `search` over those)
are small enough to be done here; a mapped command this install does not have yet fails with a clear message.

Flags: value flags become `+key=value`, bool flags `+key=true`; `--config` (repeatable) and the asset selectors
(`--benchmark`, `--environment`, `--resources-server`, `--model-type`) merge into one `+config_paths=[...]`;
bare words pass through as overrides; an unknown flag is an error with a did-you-mean.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, NamedTuple, Optional, Sequence

from nemo_gym import EXTRA_ROOTS_ENV_VAR_NAME
from nemo_gym.cli.command import _literal
from nemo_gym.errors import did_you_mean

USAGE_EXIT = 2  # a mistake on the command line (like argparse and our commands' config errors)
MISSING_EXIT = 1  # the mapped command is not in this install; no command given


class GymUsageError(Exception):
    """A mistake in the `gym` words themselves (unknown group, action or flag; a flag without its value)."""


# ---------------------------------------------------------------------------------------------------- the table


@dataclass(frozen=True)
class Flag:
    """One flag. `kind`: `value` (`+key=VALUE`), `bool` (`+key=true`), `config` (adds to config_paths),
    `asset` (an asset selector; `key` is the asset kind), `search_dir`, `switch` (read by the action itself),
    `dropped` (accepted for v0.5 compatibility, not needed here; `help` says why)."""

    names: tuple[str, ...]
    key: str = ""
    kind: str = "value"
    help: str = ""
    metavar: str = "VALUE"

    @property
    def name(self) -> str:
        return self.names[0]


def _value(names, key, help, metavar="VALUE") -> Flag:
    names = (names,) if isinstance(names, str) else tuple(names)
    return Flag(names, key, "value", help, metavar)


def _bool(names, key, help) -> Flag:
    names = (names,) if isinstance(names, str) else tuple(names)
    return Flag(names, key, "bool", help)


SHARED_FLAGS: tuple[Flag, ...] = (
    Flag(("--config",), "config_paths", "config", "A config file to merge (repeatable).", "PATH"),
    Flag(("--search-dir",), "", "search_dir", f"A folder to look up configs and assets in (repeatable; goes before "
         f"{EXTRA_ROOTS_ENV_VAR_NAME}).", "DIR"),
    _value(("--model", "-m"), "policy_model_name", "The policy model name (policy_model_name).", "NAME"),
    _value("--model-url", "policy_base_url", "The policy model's base URL (policy_base_url).", "URL"),
    _value("--model-api-key", "policy_api_key", "The policy model's API key (policy_api_key).", "KEY"),
    _bool("--json", "json", "Print JSON."),
    Flag(("--verbose", "-v"), "verbose", "verbose", "Debug logging (+verbose=true)."),
    Flag(("--benchmark",), "benchmark", "asset", "benchmarks/NAME/(FLAVOR|config).yaml", "NAME[/FLAVOR]"),
    Flag(("--environment",), "environment", "asset", "environments/NAME/(FLAVOR|config).yaml", "NAME[/FLAVOR]"),
    Flag(("--resources-server",), "resources_server", "asset", "resources_servers/NAME/configs/(FLAVOR|NAME).yaml",
         "NAME[/FLAVOR]"),
    Flag(("--model-type",), "model_type", "asset", "responses_api_models/NAME/configs/(FLAVOR|NAME).yaml",
         "NAME[/FLAVOR]"),
)

ENTRYPOINT_FLAGS: tuple[Flag, ...] = (
    Flag(("--resources-server",), "entrypoint", "entrypoint", "The server (resources_servers/NAME).", "NAME"),
    _value("--entrypoint", "entrypoint", "The server's folder (resources_servers/NAME).", "DIR"),
)

RESPONSES = "responses_create_params"


@dataclass(frozen=True)
class Action:
    """`gym <group> <action>`: the registered command it runs (`command`, or `pick(switches, overrides)` when it
    depends on the flags), its own flags, and `local` for the few actions done here without a command."""

    group: str
    name: str
    summary: str
    command: Optional[str] = None
    flags: tuple[Flag, ...] = ()
    pick: Optional[Callable[[set, list], str]] = None
    local: Optional[str] = None
    fixed: tuple[str, ...] = ()  # overrides always added (env prefetch: +dry_run=true)
    positionals: tuple[str, ...] = ()  # bare words that are not overrides (list NAME, search TYPE QUERY)
    unavailable: str = ""  # why this v0.5 action cannot work here

    @property
    def words(self) -> str:
        return f"{self.group} {self.name}".strip()

    def all_flags(self) -> tuple[Flag, ...]:
        own = {n for f in self.flags for n in f.names}
        shared = tuple(f for f in SHARED_FLAGS if not own.intersection(f.names))
        return (*self.flags, *shared)


def _env_test_command(switches: set, overrides: list) -> str:
    has_entrypoint = any(o.lstrip("+").startswith("entrypoint=") for o in overrides)
    return "test" if has_entrypoint else "test_all"


def _eval_run_command(switches: set, overrides: list) -> str:
    return "collect_rollouts" if "no_serve" in switches else "e2e_collect_rollouts"


_OFFLINE = "it moves datasets to or from a remote hub (GitLab / Hugging Face); this install works offline and has no " \
           "such command. Copy the files yourself and point +input_jsonl_fpath / jsonl_fpath at them."

ACTIONS: tuple[Action, ...] = (
    # env
    Action("env", "init", "Scaffold a new resources server.", "init_resources_server", ENTRYPOINT_FLAGS),
    Action("env", "resolve", "Print the merged, resolved config (secrets masked).", "dump_config"),
    Action("env", "validate", "Parse the whole config with a dummy policy model; start nothing.", "validate"),
    Action("env", "packages", "List the Python packages of this environment (or of a server's venv).",
           flags=ENTRYPOINT_FLAGS, local="packages"),
    Action("env", "test", "Run one server's tests (with --resources-server / +entrypoint), else every server's.",
           flags=ENTRYPOINT_FLAGS, pick=_env_test_command),
    Action("env", "start", "Start the head server and every configured server; supervise them.", "run"),
    Action("env", "prefetch", "Build every server's environment; start nothing (+dry_run=true).", "run",
           fixed=("+dry_run=true",)),
    Action("env", "status", "Show the servers of a running stack and their health.", "status"),
    # eval
    Action("eval", "prepare", "Run the benchmark's prepare script to write its JSONL.", "prepare_benchmark"),
    Action(
        "eval",
        "run",
        "Collect rollouts: start the stack, collect, stop (E2E); with --no-serve on servers already running.",
        flags=(
            Flag(("--no-serve",), "no_serve", "switch", "Use the running servers (collect_rollouts)."),
            _bool("--resume", "resume_from_cache", "Keep the output's rows and run only the missing ones."),
            _value(("--agent", "-a"), "agent_name", "The agent server to run.", "NAME"),
            _value(("--input", "-i"), "input_jsonl_fpath", "Tasks JSONL.", "PATH"),
            _value(("--output", "-o"), "output_jsonl_fpath", "Rollouts JSONL to write.", "PATH"),
            _value("--limit", "limit", "Only the first N tasks.", "N"),
            _value("--num-repeats", "num_repeats", "Rollouts per task.", "N"),
            _value("--prompt-config", "prompt_config", "Prompt template YAML applied to each row.", "PATH"),
            _value("--concurrency", "num_samples_in_parallel", "Rollouts in flight at once.", "N"),
            _value("--split", "split", "Dataset split (train, validation, benchmark).", "SPLIT"),
            _value("--temperature", f"{RESPONSES}.temperature", "Sampling temperature.", "T"),
            _value("--top-p", f"{RESPONSES}.top_p", "Nucleus sampling.", "P"),
            _value("--max-output-tokens", f"{RESPONSES}.max_output_tokens", "Output token cap.", "N"),
            _bool("--disable-aggregation", "disable_aggregation", "Skip /aggregate_metrics at the end."),
        ),
        pick=_eval_run_command,
    ),
    Action(
        "eval",
        "aggregate",
        "Aggregate metrics of rollout files through the running servers.",
        "aggregate_rollouts",
        flags=(
            _value("--input-glob", "input_glob", "Rollout files (glob, or comma-separated globs).", "GLOB"),
            _value(("--output", "-o"), "output_jsonl_fpath", "Merged rollouts JSONL.", "PATH"),
        ),
    ),
    Action(
        "eval",
        "reverify",
        "Re-score saved rollouts with the current verifiers.",
        "reverify",
        flags=(
            Flag(("--inputs",), "materialized_inputs_jsonl_fpath", "dropped",
                 "Accepted and not needed: the rollouts file carries each task.", "PATH"),
            _value("--rollouts", "input_jsonl_fpath", "Rollouts JSONL to re-score.", "PATH"),
            _value(("--output", "-o"), "output_jsonl_fpath", "Re-scored rollouts JSONL.", "PATH"),
            _value("--concurrency", "num_samples_in_parallel", "Requests in flight at once.", "N"),
            _value("--limit", "limit", "Only the first N rollouts.", "N"),
            _bool("--force", "force", "Re-score even when the verifier declares it unsafe."),
            _bool("--overwrite", "overwrite", "Overwrite the output."),
            _bool("--resume", "resume_from_cache", "Keep the output's rows, do the rest."),
            _bool("--disable-aggregation", "disable_aggregation", "Skip /aggregate_metrics at the end."),
            _bool("--judge-failed-only", "judge_failed_only", "Only rows whose judge failed."),
            _bool("--append", "append", "Append to the output."),
        ),
    ),
    Action(
        "eval",
        "profile",
        "Per-task and per-agent reward statistics of a rollouts file.",
        "reward_profile",
        flags=(
            _value("--inputs", "materialized_inputs_jsonl_fpath", "The run's materialized inputs JSONL.", "PATH"),
            _value("--rollouts", "rollouts_jsonl_fpath", "The run's rollouts JSONL.", "PATH"),
        ),
    ),
    # list / search
    Action("list", "benchmarks", "List benchmark definitions (or show one).", "list_benchmarks", positionals=("name",)),
    Action("list", "environments", "List environments/<name>/ definitions (or show one).", local="list",
           positionals=("name",)),
    Action("list", "agents", "List agent servers (responses_api_agents/).", local="list", positionals=("name",)),
    Action("list", "models", "List model servers (responses_api_models/).", local="list", positionals=("name",)),
    Action("list", "resources-servers", "List resources servers (resources_servers/).", local="list",
           positionals=("name",)),
    Action("", "search", "Fuzzy-find benchmarks (default), environments, agents, models or resources-servers.",
           local="search", positionals=("type", "query")),
    # dataset
    Action(
        "dataset",
        "render",
        "Render a prompt template into a tasks JSONL (offline).",
        "materialize_prompts",
        flags=(
            _value(("--input", "-i"), "input_jsonl_fpath", "Tasks JSONL.", "PATH"),
            _value("--prompt-config", "prompt_config", "Prompt template YAML.", "PATH"),
            _value(("--output", "-o"), "output_jsonl_fpath", "Rendered JSONL to write.", "PATH"),
        ),
    ),
    Action(
        "dataset",
        "collate",
        "Validate the agents' datasets and write collated data.",
        "prepare_data",
        flags=(
            _value("--mode", "mode", "train_preparation or example_validation.", "MODE"),
            _value("--output-dir", "output_dirpath", "Where the collated files go.", "DIR"),
            _bool("--download", "should_download", "Download missing datasets (needs network)."),
        ),
    ),
    *(Action("dataset", name, f"v0.5 `gym dataset {name}`: not available here.", unavailable=_OFFLINE)
      for name in ("upload", "download", "rm", "migrate")),
    # dev
    Action("dev", "test", "Run the repository's unit tests (pytest; extra words go to pytest).", local="dev_test"),
)

GROUPS: dict[str, str] = {
    "env": "Environments: scaffold, resolve, validate, test, start and inspect a stack.",
    "eval": "Evaluation: prepare benchmarks, collect rollouts, aggregate, reverify, profile.",
    "list": "List benchmarks, environments, agents, models, resources servers.",
    "search": "Fuzzy-find benchmarks (default) or other components by name.",
    "dataset": "Datasets: render prompts, collate.",
    "dev": "Development helpers.",
}


def find_action(group: str, name: str) -> Optional[Action]:
    return next((a for a in ACTIONS if a.group == group and a.name == name), None)


def group_actions(group: str) -> list[Action]:
    return [a for a in ACTIONS if a.group == group]


# ---------------------------------------------------------------------------------------------------- translation


class Translation(NamedTuple):
    """What `gym ...` means: the registered command (or a local action `gym:<name>`) and its overrides.
    `search_dirs` go in front of NEMO_GYM_EXTRA_ROOTS; `words` are an action's bare words (list NAME, search,
    dev test's pytest arguments); `notes` are printed to stderr before running."""

    command_name: str
    overrides: list[str]
    search_dirs: list[str] = []
    words: list[str] = []
    notes: list[str] = []
    action: Optional[Action] = None


def search_roots(search_dirs: Sequence[str] = ()) -> list[Path]:
    """Earliest first: --search-dir folders, NEMO_GYM_EXTRA_ROOTS, the current folder, the install root."""
    from nemo_gym import PARENT_DIR

    roots = [Path(d).expanduser() for d in search_dirs]
    roots += [Path(p).expanduser() for p in os.environ.get(EXTRA_ROOTS_ENV_VAR_NAME, "").split(os.pathsep) if p]
    roots += [Path.cwd(), Path(PARENT_DIR)]
    unique: list[Path] = []
    for root in roots:
        if root.resolve() not in [u.resolve() for u in unique]:
            unique.append(root)
    return unique


_ASSET_LAYOUT = {  # kind -> (path pattern, flavor when none is given (None: the name))
    "benchmark": ("benchmarks/{name}/{flavor}.yaml", "config"),
    "environment": ("environments/{name}/{flavor}.yaml", "config"),
    "resources_server": ("resources_servers/{name}/configs/{flavor}.yaml", None),
    "model_type": ("responses_api_models/{name}/configs/{flavor}.yaml", None),
}


def asset_candidates(kind: str, selector: str) -> list[str]:
    """The relative config paths an asset selector (`name` or `name/flavor`) may mean, first choice first."""
    pattern, default_flavor = _ASSET_LAYOUT[kind]
    selector = selector.strip().strip("/")
    out = []
    if "/" in selector:
        name, flavor = selector.rsplit("/", 1)
        out.append(pattern.format(name=name, flavor=flavor))
    out.append(pattern.format(name=selector, flavor=default_flavor or selector.rsplit("/", 1)[-1]))
    if kind == "benchmark":  # a benchmark's name is its YAML's path below benchmarks/ without .yaml
        out.append(f"benchmarks/{selector}.yaml")
    return out


def resolve_asset(kind: str, selector: str, search_dirs: Sequence[str] = ()) -> str:
    """The absolute path of the asset's config: the first candidate found over the search roots."""
    candidates = asset_candidates(kind, selector)
    tried = []
    for root in search_roots(search_dirs):
        for rel in candidates:
            path = root / rel
            if path.is_file():
                return str(path.resolve())
            tried.append(str(path))
    flag = "--" + kind.replace("_", "-")
    raise GymUsageError(
        f"{flag} {selector}: no config found. Looked for {', '.join(candidates)} in: "
        f"{', '.join(str(r) for r in search_roots(search_dirs))}. Check the name (`gym list "
        f"{_LIST_KIND_OF_ASSET[kind]}`), or add its root with --search-dir."
    )


_LIST_KIND_OF_ASSET = {
    "benchmark": "benchmarks",
    "environment": "environments",
    "resources_server": "resources-servers",
    "model_type": "models",
}


def _config_paths_of(override: str) -> Optional[list[str]]:
    """The list of a bare `+config_paths=[a,b]` / `config_paths=a` override, to merge with --config."""
    key, eq, value = override.partition("=")
    if not eq or key.lstrip("+") != "config_paths":
        return None
    value = value.strip()
    if value.startswith("[") and value.endswith("]"):
        value = value[1:-1]
    return [v.strip().strip("'\"") for v in value.split(",") if v.strip()]


def _parse_action_words(argv: list[str]) -> tuple[Action, list[str]]:
    if not argv:
        raise GymUsageError("no command given")
    if argv[0].startswith("-"):
        top = ["--version", "--help", "--verbose", "--completion"]
        raise GymUsageError(f"unknown option `{argv[0]}` before the command.{did_you_mean(argv[0], top)} "
                            f"Usage: gym <group> <action> [flags]; `gym --help` lists the commands.")
    group = argv[0]
    if group == "search":
        return find_action("", "search"), argv[1:]
    if group not in GROUPS:
        raise GymUsageError(f"unknown command `{group}`.{did_you_mean(group, GROUPS)} Commands: {', '.join(GROUPS)}.")
    names = [a.name for a in group_actions(group)]
    if len(argv) < 2 or argv[1].startswith("-"):
        raise GymUsageError(f"`gym {group}` needs an action: {', '.join(names)}.")
    action = find_action(group, argv[1])
    if action is None:
        raise GymUsageError(
            f"unknown action `gym {group} {argv[1]}`.{did_you_mean(argv[1], names)} Actions: {', '.join(names)}."
        )
    return action, argv[2:]


def translate(argv: Sequence[str]) -> Translation:
    """`gym` arguments (without the program name) -> the command to run and its overrides. Pure apart from
    looking up asset config files. Raises `GymUsageError` for a mistake in the words or flags."""
    argv = list(argv)
    verbose = any(a in ("-v", "--verbose") for a in argv[: _first_word(argv)])
    argv = [a for i, a in enumerate(argv) if not (i < _first_word(argv) and a in ("-v", "--verbose"))]
    if argv and argv[0] == "--version":
        rest = argv[1:]
        bad = [a for a in rest if a != "--json"]
        if bad:
            raise GymUsageError(f"`gym --version` takes only --json, not {bad[0]}")
        return Translation("version", ["+json=true"] if rest else [])
    action, rest = _parse_action_words(argv)
    if action.local == "dev_test":
        return Translation("gym:dev_test", [], words=rest, action=action)

    flags = {n: f for f in action.all_flags() for n in f.names}
    overrides: list[str] = []
    config_paths: list[str] = []
    assets: list[tuple[str, str]] = []
    search_dirs: list[str] = []
    switches: set[str] = set()
    words: list[str] = []
    notes: list[str] = []
    i = 0
    while i < len(rest):
        arg = rest[i]
        i += 1
        if not arg.startswith("-") or arg.startswith("--") and len(arg) == 2:
            if arg == "--":
                continue
            paths = _config_paths_of(arg)
            if paths is not None:
                config_paths += paths
            elif action.positionals and "=" not in arg and not arg.startswith(("+", "~")):
                words.append(arg)
            else:
                overrides.append(arg)
            continue
        name, has_value, value = arg.partition("=") if arg.startswith("--") else (arg, "", "")
        flag = flags.get(name)
        if flag is None:
            known = sorted(flags)
            raise GymUsageError(
                f"unknown flag `{name}` for `gym {action.words}`.{did_you_mean(name, known)} "
                f"`gym {action.words} --help` lists its flags."
            )
        if flag.kind in ("bool", "switch", "verbose"):
            if has_value:
                raise GymUsageError(f"{name} takes no value (drop `={value}`)")
        elif not has_value:
            if i >= len(rest):
                raise GymUsageError(f"{name} needs a value ({name} {flag.metavar})")
            value, i = rest[i], i + 1
        if flag.kind == "value":
            overrides.append(f"+{flag.key}={_literal(value)}")
        elif flag.kind == "bool":
            overrides.append(f"+{flag.key}=true")
        elif flag.kind == "switch":
            switches.add(flag.key)
        elif flag.kind == "verbose":
            verbose = True
        elif flag.kind == "config":
            config_paths.append(value)
        elif flag.kind == "search_dir":
            search_dirs.append(value)
        elif flag.kind == "asset":
            assets.append((flag.key, value))
        elif flag.kind == "entrypoint":
            overrides.append(f"+entrypoint={_literal('resources_servers/' + value.strip('/'))}")
        elif flag.kind == "dropped":
            notes.append(f"gym: {name} is not needed here: {flag.help}")
    config_paths += [resolve_asset(kind, sel, search_dirs) for kind, sel in assets]
    if config_paths:
        overrides.insert(0, f"+config_paths=[{','.join(_literal(p) for p in config_paths)}]")
    if verbose:
        overrides.append(verbose_override())
    overrides += list(action.fixed)

    if action.local:
        return Translation(f"gym:{action.local}", overrides, search_dirs, words, notes, action)
    if action.unavailable:
        return Translation("gym:unavailable", overrides, search_dirs, words, notes, action)
    command = action.pick(switches, overrides) if action.pick else action.command
    if command == "e2e_collect_rollouts" and any(kind == "benchmark" for kind, _ in assets):
        if not any(o.startswith("+split=") for o in overrides):  # `--benchmark X` runs X's benchmark dataset
            overrides.append("+split=benchmark")
    if action.command == "list_benchmarks" and words:
        overrides.append(f"+name={_literal(words[0])}")
        words = []
    return Translation(command, overrides, search_dirs, words, notes, action)


def verbose_override() -> str:
    """`+verbose=true` where `verbose` is a global key; `++verbose=true` (never refused) on an install without it."""
    from nemo_gym.config.known_keys import FRAMEWORK_KEYS

    return "+verbose=true" if "verbose" in FRAMEWORK_KEYS else "++verbose=true"


def _first_word(argv: list[str]) -> int:
    """Index of the first word that is not a top-level flag (`-v`, `--verbose`)."""
    for i, a in enumerate(argv):
        if a not in ("-v", "--verbose"):
            return i
    return len(argv)


# ---------------------------------------------------------------------------------------------------- help


def _flag_lines(flags: Sequence[Flag]) -> list[str]:
    lines = []
    for f in flags:
        shown = ", ".join(f.names) + ("" if f.kind in ("bool", "switch", "verbose") else f" {f.metavar}")
        target = {
            "value": f"+{f.key}=…",
            "bool": f"+{f.key}=true",
            "config": "+config_paths=[…]",
            "asset": "+config_paths=[…]",
            "entrypoint": "+entrypoint=resources_servers/NAME",
        }.get(f.kind, "")
        lines.append(f"  {shown:<34} {f.help}" + (f"  [{target}]" if target else ""))
    return lines


def top_help() -> str:
    lines = [
        "gym: NeMo Gym v0.5's command tree over nemo_gym's commands (the same commands as `ng <verb>` / `ng_<name>`).",
        "",
        "Usage: gym <group> <action> [flags] [+key=value ...]",
        "       gym --version [--json]",
        "",
        "Groups:",
        *(f"  {g:<9} {d}" for g, d in GROUPS.items()),
        "",
        "Actions:",
    ]
    for a in ACTIONS:
        lines.append(f"  gym {a.words:<26} {a.summary}")
    lines += [
        "",
        "`gym <group> <action> --help` lists an action's flags and the parameters of the command it runs.",
        "Shell completion (bash): eval \"$(gym --completion bash)\"",
    ]
    return "\n".join(lines) + "\n"


def group_help(group: str) -> str:
    lines = [f"gym {group}: {GROUPS[group]}", "", f"Usage: gym {group} <action> [flags] [+key=value ...]", ""]
    lines += [f"  {a.name:<18} {a.summary}" for a in group_actions(group)]
    return "\n".join(lines) + "\n"


def action_help(action: Action) -> str:
    words = "".join(f" [{p.upper()}]" for p in action.positionals)
    lines = [f"gym {action.words}: {action.summary}", "", f"Usage: gym {action.words}{words} [flags] [+key=value ...]"]
    if action.unavailable:
        return "\n".join(lines + ["", f"Not available: {action.unavailable}"]) + "\n"
    runs = {
        _env_test_command: "ng_test (with an entrypoint), else ng_test_all",
        _eval_run_command: "ng_e2e_collect_rollouts, or ng_collect_rollouts with --no-serve",
    }.get(action.pick, f"ng_{action.command}" if action.command else "")
    if runs:
        lines.append(f"Runs: {runs}")
    if action.local != "dev_test":
        lines += ["", "Flags:", *_flag_lines(action.all_flags())]
    lines += ["", "Words not starting with - pass through as +key=value overrides."]
    from nemo_gym.cli.commands import BY_NAME

    command = BY_NAME.get(action.command or "")
    if command is not None:
        lines += ["", "-" * 100, command.help_text().rstrip("\n")]
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------------------------------------------- completion


def completion_words(words: Sequence[str]) -> list[str]:
    """Candidates after `words` (the words typed so far, without `gym` and without the one being completed)."""
    words = [w for w in words if w not in ("-v", "--verbose")]
    if not words:
        return [*GROUPS, "--version", "--help"]
    if words[0] in GROUPS and words[0] != "search" and len(words) == 1:
        return [a.name for a in group_actions(words[0])]
    try:
        action, _ = _parse_action_words(list(words[:2]) if words[0] != "search" else ["search"])
    except GymUsageError:
        return []
    if action.local == "dev_test":
        return []
    names = [n for f in action.all_flags() for n in f.names if n.startswith("--")]
    if action.name == "search" and len([w for w in words[1:] if not w.startswith("-")]) == 0:
        names = ["benchmarks", "environments", "agents", "models", "resources-servers", *names]
    return names


BASH_COMPLETION = """# gym shell completion (bash; zsh: autoload bashcompinit && bashcompinit first)
_gym_complete() {
    local IFS=$'\\n'
    COMPREPLY=( $(compgen -W "$(gym --complete "${COMP_WORDS[@]:1:$((COMP_CWORD-1))}" 2>/dev/null)" \\
        -- "${COMP_WORDS[COMP_CWORD]}") )
}
complete -o default -F _gym_complete gym
"""


# ---------------------------------------------------------------------------------------------------- local actions


_LIST_FOLDERS = {
    "environments": "environments",
    "agents": "responses_api_agents",
    "models": "responses_api_models",
    "resources-servers": "resources_servers",
}


def list_components(kind: str, search_dirs: Sequence[str] = ()) -> list[dict]:
    """The components of one kind found over the search roots (an earlier root wins a name): name, path and
    config files. A server folder counts when it has configs/, requirements.txt or pyproject.toml; an
    environment when it has config.yaml."""
    if kind == "environments":
        try:  # the one discovery of environments (with domain / description / value), where this install has it
            from nemo_gym.rollouts.benchmarks import discover_environments
        except ImportError:
            pass
        else:
            found_envs = discover_environments(search_roots(search_dirs))
            return [{**env.to_json(), "path": str(env.config_path.parent), "configs": [env.config_relpath]}
                    for env in found_envs.values()]
    found: dict[str, dict] = {}
    for root in search_roots(search_dirs):
        base = root / _LIST_FOLDERS[kind]
        if not base.is_dir():
            continue
        for folder in sorted(p for p in base.iterdir() if p.is_dir() and not p.name.startswith((".", "_"))):
            if folder.name in found:
                continue
            if kind == "environments":
                if not (folder / "config.yaml").is_file():
                    continue
                configs = sorted(str(p.relative_to(root)) for p in folder.glob("*.yaml"))
            else:
                if not any((folder / m).exists() for m in ("configs", "requirements.txt", "pyproject.toml")):
                    continue
                configs = sorted(str(p.relative_to(root)) for p in (folder / "configs").glob("*.yaml"))
            found[folder.name] = {"name": folder.name, "path": str(folder), "configs": configs}
            if kind == "resources-servers":
                found[folder.name].update(_server_listing(root, configs))
    return list(found.values())


def _server_listing(root: Path, configs: Sequence[str]) -> dict:
    """`domain` and `description` of a resources server, from the first of its config files that sets each."""
    from nemo_gym.rollouts.benchmarks import listing_of_config_file

    listing = {"domain": None, "description": None}
    for config in configs:
        for key, value in listing_of_config_file(root / config).items():
            if key in listing and listing[key] is None:
                listing[key] = value
    return listing


def _print_components(kind: str, rows: list[dict], as_json: bool, query: Optional[str] = None) -> None:
    if as_json:
        print(json.dumps(rows, indent=2))
        return
    if not rows:
        print(f"No {kind} match `{query}`." if query else f"No {kind} found.")
        return
    width = max(len(r["name"]) for r in rows) + 2
    for r in rows:
        about = "".join(f"  {text}" for text in (r.get("domain") and f"({r['domain']})", r.get("description")) if text)
        print(f"{r['name']:<{width}}{', '.join(r['configs']) or r['path']}{about}")


SEARCH_FIELDS = ("name", "description", "domain")  # what `gym search` matches, as v0.5: names, descriptions, metadata


def _close_to(query: str, text: str) -> bool:
    """`query` is close to `text` or to one of its words (difflib ratio >= 0.7), so a typo still finds it."""
    import difflib
    import re

    words = [w for w in re.split(r"[^0-9a-z]+", text) if w]
    return bool(difflib.get_close_matches(query, [text, *words], n=1, cutoff=0.7))


def _letters_in_order(query: str, name: str) -> bool:
    it = iter(name)
    return all(c in it for c in query)


def search_rank(query: str, row: dict) -> Optional[int]:
    """How well `row` matches `query`, 0 best, or None when it does not. As v0.5's `gym search`, a field matches when
    the query (case-insensitive) is part of it or close to it or to one of its words; a name also matches when it
    holds the query's letters in order. A name match ranks before a description or domain match."""
    q = query.strip().lower()
    if not q:
        return 0
    name = str(row.get("name") or "").lower()
    if q in name:
        return 0
    if _close_to(q, name) or _letters_in_order(q, name):
        return 1
    for key in SEARCH_FIELDS[1:]:
        text = str(row.get(key) or "").lower()
        if text and (q in text or _close_to(q, text)):
            return 2
    return None


def search_rows(query: str, rows: Sequence[dict]) -> list[dict]:
    """The rows matching `query` over SEARCH_FIELDS, best first (then the name closest to the query)."""
    import difflib

    q = query.strip().lower()
    ranked = [(rank, row) for row in rows if (rank := search_rank(query, row)) is not None]

    def order(item: tuple[int, dict]) -> tuple:
        rank, row = item
        name = str(row.get("name") or "")
        return rank, -difflib.SequenceMatcher(None, q, name.lower()).ratio(), name

    return [row for _, row in sorted(ranked, key=order)]


def fuzzy_filter(query: str, names: Sequence[str]) -> list[str]:
    """The names matching `query` (`search_rank` on the name alone), best first."""
    return [row["name"] for row in search_rows(query, [{"name": n} for n in names])]


def _local(t: Translation) -> int:
    as_json = "+json=true" in t.overrides
    action = t.action
    if action.local == "packages":
        return _pip_list(t, as_json)
    if action.local == "dev_test":
        from nemo_gym import PARENT_DIR

        tests = Path(PARENT_DIR) / "tests" / "unit"
        args = t.words or [str(tests)]
        return subprocess.call([sys.executable, "-m", "pytest", *args])
    if action.local == "list":
        rows = list_components(action.name, t.search_dirs)
        if t.words:
            row = next((r for r in rows if r["name"] == t.words[0]), None)
            if row is None:
                names = [r["name"] for r in rows]
                _error(f"no {action.name} named `{t.words[0]}`.{did_you_mean(t.words[0], names)} "
                       f"`gym list {action.name}` lists them.")
                return 1
            rows = [row]
        _print_components(action.name, rows, as_json)
        return 0
    if action.local == "search":
        words = list(t.words)
        if not words:
            _error("`gym search [TYPE] QUERY` needs a query.")
            return USAGE_EXIT
        kinds = ["benchmarks", *_LIST_FOLDERS]
        kind = words.pop(0) if len(words) > 1 else "benchmarks"
        if kind not in kinds:
            _error(f"unknown type `{kind}`.{did_you_mean(kind, kinds)} Types: {', '.join(kinds)}.")
            return USAGE_EXIT
        query = " ".join(words)
        if kind == "benchmarks":
            return _run_command("list_benchmarks", [*t.overrides, f"+query={_literal(query)}"], action)
        _print_components(kind, search_rows(query, list_components(kind, t.search_dirs)), as_json, query)
        return 0
    raise AssertionError(action.local)


def _pip_list(t: Translation, as_json: bool) -> int:
    """`python -m pip list` of this Python, or of the newest built venv of the server named by +entrypoint."""
    python = sys.executable
    entry = next((o.split("=", 1)[1].strip("'\"") for o in t.overrides if o.lstrip("+").startswith("entrypoint=")),
                 None)
    if entry:
        from nemo_gym import WORKING_DIR

        server_type, _, name = entry.strip("/").partition("/")
        venvs = sorted(
            (Path(WORKING_DIR) / ".venvs").glob(f"{server_type}__{name}-*/bin/python"),
            key=lambda p: p.stat().st_mtime,
        )
        if not venvs:
            _error(f"no built venv for {entry} under {Path(WORKING_DIR) / '.venvs'}: a server has its own venv "
                   f"only with venv_mode=isolated (build it with `gym env prefetch --config ... "
                   f"+venv_mode=isolated`). Without --resources-server this lists the packages of {sys.executable}.")
            return 1
        python = str(venvs[-1])
    return subprocess.call([python, "-m", "pip", "list", *(["--format=json"] if as_json else [])])


# ---------------------------------------------------------------------------------------------------- running


def _error(message: str) -> None:
    sys.stdout.flush()
    sys.stderr.write(f"error: gym: {message}\n")
    sys.stderr.flush()


def _run_command(name: str, overrides: list[str], action: Optional[Action]) -> int:
    from nemo_gym.cli.commands import BY_NAME

    command = BY_NAME.get(name)
    words = f"gym {action.words}" if action else "gym"
    if command is None:
        _error(f"`{words}` needs the `{name}` command, which this install does not have.")
        return MISSING_EXIT
    if "+json=true" in overrides and "json" not in command.config_model.parameter_keys():
        _error(f"`{words}` has no --json output here (ng_{name} takes no `json` parameter).")
        return MISSING_EXIT
    return command.main(overrides)


def _help_requested(argv: list[str]) -> Optional[str]:
    """The help text to print when `argv` asks for help (--help / -h anywhere, or just a group)."""
    wants = any(a in ("-h", "--help") for a in argv)
    words = [a for a in argv if not a.startswith("-")]
    if not words or words[0] not in GROUPS:
        return top_help() if wants else None
    if words[0] == "search":
        return action_help(find_action("", "search")) if wants else None
    action = find_action(words[0], words[1]) if len(words) > 1 else None
    if action is None:
        return group_help(words[0]) if wants or len(words) == 1 else None
    if action.local == "dev_test":  # its --help is pytest's
        return None
    return action_help(action) if wants else None


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Run `gym` with `argv` (default: the process's arguments); returns the exit code."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["--complete"]:
        print("\n".join(completion_words(argv[1:])))
        return 0
    if argv[:1] == ["--completion"]:
        shell = argv[1] if len(argv) > 1 else "bash"
        if shell not in ("bash", "zsh"):
            _error(f"completion for {shell} is not available (bash, or zsh with bashcompinit).")
            return USAGE_EXIT
        sys.stdout.write(BASH_COMPLETION)
        return 0
    if not [a for a in argv if a not in ("-v", "--verbose")]:
        sys.stderr.write(top_help())
        return MISSING_EXIT
    try:
        text = _help_requested(argv)
    except Exception:  # help is best effort; the translation below reports the mistake
        text = None
    if text is not None:
        sys.stdout.write(text)
        return 0
    try:
        t = translate(argv)
    except GymUsageError as exc:
        _error(str(exc))
        if str(exc) == "no command given":
            sys.stderr.write(top_help())
            return MISSING_EXIT
        return USAGE_EXIT
    for note in t.notes:
        sys.stderr.write(note + "\n")
    if t.search_dirs:
        previous = os.environ.get(EXTRA_ROOTS_ENV_VAR_NAME, "")
        os.environ[EXTRA_ROOTS_ENV_VAR_NAME] = os.pathsep.join([*t.search_dirs, *([previous] if previous else [])])
    if t.command_name == "gym:unavailable":
        _error(f"`gym {t.action.words}` is not available: {t.action.unavailable}")
        return MISSING_EXIT
    if t.command_name.startswith("gym:"):
        return _local(t)
    return _run_command(t.command_name, t.overrides, t.action)

