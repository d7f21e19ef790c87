"""Command line: the typer app `ng` (`ng run`, `ng status`, ...) and the reference's `ng_*` commands.

Both forms take the same Hydra-style overrides (`+key=value`, `++key=value`, `key=value`, `~key`) and build the
same global config. Config mistakes print one message and exit 2, with no traceback.
"""

from __future__ import annotations

import functools
import json
import os
import platform
import sys
from importlib import metadata
from typing import Callable, Optional

import typer

from nemo_gym import __version__
from nemo_gym.errors import NeMoGymConfigError

HELP_FLAGS = {"--help", "-h", "+h=true", "+help=true", "++h=true", "++help=true", "h=true", "help=true"}

# name -> (one-line summary, longer help). The order is the order `ng --help` and `ng_help` list them in.
COMMANDS: dict[str, tuple[str, str]] = {
    "run": (
        "Start the head server and every configured server, wait until all are healthy, supervise them.",
        "Example: ng_run \"+config_paths=[configs/quickstart.yaml]\"\n\n"
        "Keys: config_paths (YAML files to merge), default_host (127.0.0.1), head_server.host/port "
        "(127.0.0.1:11000), port_range_low/high (10001/20000), venv_mode (shared | isolated), "
        "skip_venv_if_present, uv_cache_dir, uv_venv_dir, ray_head_node_address, dry_run (build environments "
        "and exit), ready_timeout_s (600). Ctrl-C or SIGTERM stops every server.",
    ),
    "collect_rollouts": ("Run an agent over a JSONL file of tasks and write rollouts with rewards.", ""),
    "e2e_collect_rollouts": ("Start the stack, prepare data, collect rollouts, profile, stop.", ""),
    "status": (
        "Show the servers of a running stack and their health (asks the head server).",
        "Keys: head_server.host, head_server.port (default 127.0.0.1:11000).",
    ),
    "dump_config": (
        "Print the merged, resolved global config with secrets masked.",
        "Ports that the config leaves unset are shown unset: ng_run chooses them at launch.",
    ),
    "help": ("List the ng_* commands.", ""),
    "version": ("Print versions of nemo_gym, Python and key dependencies.", "Keys: json=true for JSON output."),
    "test": (
        "Run one server's tests in its environment.",
        "Example: ng_test +entrypoint=resources_servers/mcqa +should_validate_data=true",
    ),
    "test_all": (
        "Run every server's tests and print a pass/fail table.",
        "Keys: include=[a,b], exclude=[...], fail_fast, show_output, log_dir, fail_on_total_and_test_mismatch.",
    ),
    "init_resources_server": (
        "Scaffold a new resources server.",
        "Example: ng_init_resources_server +entrypoint=resources_servers/my_env",
    ),
    "reward_profile": ("Compute per-task and per-agent reward statistics from rollouts.", ""),
    "prepare_data": ("Validate datasets and write collated training data.", ""),
}

# command -> where it will come from; commands listed here answer "not available yet".
NOT_AVAILABLE: dict[str, str] = {}


def _err(message: str) -> None:
    sys.stderr.write(f"error: {message}\n")
    sys.stderr.flush()


def cli_errors(command: str) -> Callable:
    """Turn user mistakes into one message and an exit code instead of a traceback."""

    def wrap(fn: Callable[[list[str]], int]) -> Callable[[list[str]], int]:
        @functools.wraps(fn)
        def inner(args: list[str]) -> int:
            try:
                return fn(args)
            except NeMoGymConfigError as exc:
                _err(f"ng_{command}: {exc}")
                return exc.exit_code
            except KeyboardInterrupt:
                return 130

        return inner

    return wrap


def wants_help(args: list[str]) -> bool:
    return any(a.strip().lower() in HELP_FLAGS for a in args)


def print_command_help(command: str) -> None:
    summary, details = COMMANDS[command]
    print(f"ng_{command} (also: ng {command.replace('_', '-')}): {summary}")
    print("\nUsage: ng_" + command + " [+key=value | ++key=value | key=value | ~key]...")
    if details:
        print("\n" + details)
    print("\nOverrides: lists as \"+config_paths=[a.yaml,b.yaml]\" (quote for the shell), nested keys with dots.")


def _global_config(args: list[str], *, allocate_ports: bool = True):
    from nemo_gym.config.global_config import parse_global_config

    return parse_global_config(args, allocate_ports=allocate_ports)


def _simple_overrides(args: list[str]) -> dict:
    """Only the CLI overrides, for commands that need no config files."""
    from nemo_gym.config.overrides import overrides_to_dict, parse_overrides

    return overrides_to_dict(parse_overrides(args))


# ------------------------------------------------------------------------------------------------ commands
@cli_errors("run")
def _run(args: list[str]) -> int:
    if wants_help(args):
        print_command_help("run")
        return 0
    from nemo_gym.runtime.launcher import run_stack

    cfg = _global_config(args)
    return run_stack(cfg)


@cli_errors("status")
def _status(args: list[str]) -> int:
    if wants_help(args):
        print_command_help("status")
        return 0
    from nemo_gym.runtime.status import fetch_status, print_status

    cfg = _global_config(args, allocate_ports=False)
    try:
        instances = fetch_status(str(cfg.head_server.host), int(cfg.head_server.port))
    except ConnectionError as exc:
        _err(str(exc))
        return 1
    print_status(instances, sys.stdout)
    return 0 if all(i["healthy"] for i in instances) else 1


@cli_errors("dump_config")
def _dump_config(args: list[str]) -> int:
    if wants_help(args):
        print_command_help("dump_config")
        return 0
    from nemo_gym.config.global_config import dump_config_yaml

    cfg = _global_config(args, allocate_ports=False)
    sys.stdout.write(dump_config_yaml(cfg, resolve=True, mask=True))
    return 0


def version_info() -> dict:
    import psutil

    deps = {}
    for name in ("fastapi", "uvicorn", "httpx", "pydantic", "omegaconf", "typer", "openai", "ray", "orjson"):
        try:
            deps[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            deps[name] = None
    from nemo_gym import PARENT_DIR

    return {
        "nemo_gym": __version__,
        "python": platform.python_version(),
        "python_path": sys.executable,
        "installation_path": str(PARENT_DIR),
        "dependencies": deps,
        "system": {
            "os": platform.system(),
            "platform": platform.platform(),
            "architecture": platform.machine(),
            "processor": platform.processor(),
            "cpu_count": os.cpu_count(),
            "memory_gb": round(psutil.virtual_memory().total / 1024**3, 1),
        },
    }


@cli_errors("version")
def _version(args: list[str]) -> int:
    if wants_help(args):
        print_command_help("version")
        return 0
    overrides = _simple_overrides(args)
    info = version_info()
    if overrides.get("json") or overrides.get("json_format"):
        print(json.dumps(info, indent=2))
        return 0
    print(f"nemo_gym {info['nemo_gym']}")
    print(f"Python {info['python']} ({info['python_path']})")
    print(f"Installed at {info['installation_path']}")
    for name, ver in info["dependencies"].items():
        print(f"  {name:<10} {ver or 'not installed'}")
    sysinfo = info["system"]
    print(f"{sysinfo['platform']} {sysinfo['architecture']}, {sysinfo['cpu_count']} CPUs, {sysinfo['memory_gb']} GB")
    return 0


@cli_errors("help")
def _display_help(args: list[str]) -> int:
    print("nemo_gym commands (each also as `ng <name>`; pass +h=true or --help to any for its options):\n")
    for name, (summary, _) in COMMANDS.items():
        marker = "" if name not in NOT_AVAILABLE else "  [not available yet]"
        print(f"  ng_{name:<24} {summary}{marker}")
    return 0


def _not_available(command: str) -> Callable[[list[str]], int]:
    @cli_errors(command)
    def inner(args: list[str]) -> int:
        if wants_help(args):
            print_command_help(command)
        _err(f"ng_{command} is not available yet in nemo_gym {__version__}; it arrives with {NOT_AVAILABLE[command]}.")
        return 1

    return inner


@cli_errors("prepare_data")
def _prepare_data(args: list[str]) -> int:
    from nemo_gym.rollouts.data_prep import prepare_data_main

    return prepare_data_main(args)


@cli_errors("collect_rollouts")
def _collect_rollouts(args: list[str]) -> int:
    from nemo_gym.rollouts.collection import collect_rollouts_main

    return collect_rollouts_main(args)


@cli_errors("reward_profile")
def _reward_profile(args: list[str]) -> int:
    from nemo_gym.rollouts.reward_profile import reward_profile_main

    return reward_profile_main(args)


@cli_errors("e2e_collect_rollouts")
def _e2e_collect_rollouts(args: list[str]) -> int:
    from nemo_gym.rollouts.e2e import e2e_collect_rollouts_main

    return e2e_collect_rollouts_main(args)


@cli_errors("test")
def _test(args: list[str]) -> int:
    from nemo_gym.authoring.server_tests import ng_test_main

    return ng_test_main(args)


@cli_errors("test_all")
def _test_all(args: list[str]) -> int:
    from nemo_gym.authoring.server_tests import ng_test_all_main

    return ng_test_all_main(args)


@cli_errors("init_resources_server")
def _init_resources_server(args: list[str]) -> int:
    from nemo_gym.authoring.scaffold import init_resources_server_main

    return init_resources_server_main(args)


HANDLERS: dict[str, Callable[[list[str]], int]] = {
    "test": _test,
    "test_all": _test_all,
    "init_resources_server": _init_resources_server,
    "e2e_collect_rollouts": _e2e_collect_rollouts,
    "collect_rollouts": _collect_rollouts,
    "reward_profile": _reward_profile,
    "prepare_data": _prepare_data,
    "run": _run,
    "status": _status,
    "dump_config": _dump_config,
    "version": _version,
    "help": _display_help,
}
for _name in NOT_AVAILABLE:
    HANDLERS.setdefault(_name, _not_available(_name))


# ------------------------------------------------------------------------------------- ng_* console scripts
def _entry(command: str) -> Callable[[], None]:
    def main() -> None:
        sys.exit(HANDLERS[command](sys.argv[1:]))

    main.__name__ = command
    return main


run = _entry("run")
collect_rollouts = _entry("collect_rollouts")
e2e_collect_rollouts = _entry("e2e_collect_rollouts")
status = _entry("status")
dump_config = _entry("dump_config")
display_help = _entry("help")
version = _entry("version")
test = _entry("test")
test_all = _entry("test_all")
init_resources_server = _entry("init_resources_server")
reward_profile = _entry("reward_profile")
prepare_data = _entry("prepare_data")


# ------------------------------------------------------------------------------------------- typer app `ng`
app = typer.Typer(
    name="ng",
    help="nemo_gym: build, run and score RL environments for LLMs. Every command takes +key=value overrides.",
    no_args_is_help=True,
    add_completion=False,
)

TYPER_NAMES = {
    "run": "run",
    "collect_rollouts": "collect",
    "e2e_collect_rollouts": "e2e-collect",
    "status": "status",
    "dump_config": "dump-config",
    "version": "version",
    "test": "test",
    "test_all": "test-all",
    "init_resources_server": "init",
    "reward_profile": "profile",
    "prepare_data": "prepare-data",
}


def _register(command: str, typer_name: str) -> None:
    summary, details = COMMANDS[command]

    def cmd(
        overrides: Optional[list[str]] = typer.Argument(None, help="+key=value overrides", show_default=False),
    ) -> None:
        raise typer.Exit(HANDLERS[command](list(overrides or [])))

    cmd.__doc__ = f"{summary}\n\n{details}" if details else summary
    app.command(
        typer_name,
        context_settings={"ignore_unknown_options": True, "allow_extra_args": False},
    )(cmd)


for _command, _typer_name in TYPER_NAMES.items():
    _register(_command, _typer_name)


if __name__ == "__main__":  # pragma: no cover
    app()
