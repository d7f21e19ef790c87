"""The CLI as a user meets it, in this process: every command as `ng_<name>`, `nemo_gym_<name>` and `ng <verb>`, the
same help on every form, `ng help`, unknown keys refused with a did-you-mean, one error path, completions. The
installed scripts as real processes (and `ng_run` refusing bad configs) are tests/integration/test_cli_processes.py."""

import io
import json
import os
import pkgutil
import sys
import tomllib
from contextlib import contextmanager, redirect_stdout
from importlib import import_module
from pathlib import Path

import pytest
from typer.testing import CliRunner

from nemo_gym import cli
from nemo_gym.cli import commands as commands_package
from nemo_gym.cli.command import Command
from nemo_gym.cli.ng import completions
from nemo_gym.config.known_keys import FRAMEWORK_KEYS, GlobalKeys, check_known_keys, referenced_keys
from nemo_gym.config.overrides import parse_overrides
from nemo_gym.config.types import BaseNeMoGymCLIConfig
from nemo_gym.errors import NeMoGymConfigError

REPO = Path(__file__).resolve().parents[2]
SCRIPTS = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["scripts"]


# ------------------------------------------------------------------------------------------- the registry


def test_every_command_has_every_form():
    names = [c.name for c in cli.COMMANDS]
    verbs = [c.verb for c in cli.COMMANDS]
    assert len(set(names)) == len(names) and len(set(verbs)) == len(verbs)
    for command in cli.COMMANDS:
        for script in (f"ng_{command.name}", f"nemo_gym_{command.name}"):
            module, func = SCRIPTS[script].split(":")
            assert getattr(import_module(module), func).__name__ == command.name, script
        assert issubclass(command.config_model, BaseNeMoGymCLIConfig), command.name
        assert cli.find_command(command.verb) is cli.find_command(command.name) is command
        assert cli.find_command(command.script) is command
    result = CliRunner().invoke(cli.app, ["--help"])
    assert result.exit_code == 0
    for verb in verbs:
        assert verb in result.stdout


def test_every_console_script_has_a_twin_and_an_importable_target():
    for name, target in SCRIPTS.items():
        module, func = target.split(":")
        assert callable(getattr(import_module(module), func)), name
        if name.startswith("ng_"):
            assert SCRIPTS["nemo_gym_" + name[3:]] == target
    # NeMo Gym v0.2's target names.
    for func in ("run", "status", "dump_config", "display_help", "version", "test", "test_all",
                 "init_resources_server", "e2e_rollout_collection"):
        assert callable(getattr(cli, func)), func
    assert cli.e2e_rollout_collection.__name__ == "e2e_collect_rollouts"


def test_every_command_module_is_registered():
    """A command written under nemo_gym/cli/commands/ but left out of the registry would be unreachable."""
    for info in pkgutil.iter_modules(commands_package.__path__):
        module = import_module(f"{commands_package.__name__}.{info.name}")
        defined = [v for v in vars(module).values() if isinstance(v, Command)]
        assert defined, info.name
        assert all(c in cli.COMMANDS for c in defined), info.name


# ------------------------------------------------------------------------------------------------- help


def call_script(name: str, *args: str) -> tuple[int, str]:
    """A console script's pyproject.toml target called in this process (`ng` through typer's runner):
    (exit code, stdout)."""
    if name == "ng":
        result = CliRunner().invoke(cli.app, list(args))
        return result.exit_code, result.stdout
    module, func = SCRIPTS[name].split(":")
    saved, sys.argv = sys.argv, [name, *args]
    try:
        with pytest.raises(SystemExit) as exited, redirect_stdout(io.StringIO()) as out:
            getattr(import_module(module), func)()
    finally:
        sys.argv = saved
    return exited.value.code, out.getvalue()


def test_the_same_help_on_every_form_of_every_command():
    for command in cli.COMMANDS:
        forms = [
            ("ng", command.verb, "--help"),
            ("ng", command.verb, "+h=true"),
            ("ng", "help", command.verb),
            (f"ng_{command.name}", "+h=true"),
            (f"nemo_gym_{command.name}", "--help"),
            (f"ng_{command.name}", "-h"),
        ]
        for form in forms:
            assert call_script(*form) == (0, command.help_text()), form
        text = command.help_text()
        assert text.startswith(f"ng_{command.name}: {command.summary}\n")
        assert f"ng {command.verb}" in text and "++key=value" in text
        for name, field in command.config_model.model_fields.items():
            assert f"+{field.alias or name}" in text, (command.name, name)


def test_help_of_run_describes_the_global_keys():
    text = cli.find_command("run").help_text()
    for key in ("+config_paths", "+default_host", "+head_server.host", "+head_server.port", "+port_range_low",
                "+venv_mode", "+skip_venv_if_present", "+uv_cache_dir", "+ray_head_node_address", "+dry_run",
                "+ready_timeout_s"):
        assert key in text, key
    assert 'ng_run "+config_paths=[configs/quickstart.yaml]"' in text


def test_ng_help_of_an_unknown_command_suggests_one(capsys):
    assert cli.find_command("help").main(["colect"]) == 2
    assert "error: ng_help: no command `colect`. Did you mean `collect`?" in capsys.readouterr().err


# --------------------------------------------------------------------------------------------- unknown keys


def test_several_unknown_keys_are_reported_together(capsys):
    assert cli.find_command("version").main(["+jsn=true", "colour=red"]) == 2
    err = capsys.readouterr().err
    assert "unknown keys" in err and "`+jsn`. Did you mean `+json`?" in err and "`colour`." in err


def test_keys_from_config_files_interpolations_and_plus_plus_are_accepted(tmp_path, capsys):
    (tmp_path / "c.yaml").write_text("my_setting: 1\nuses: ${my_ref}\n")
    (tmp_path / "env.yaml").write_text("from_env: 2\n")
    dump = cli.find_command("dump_config")
    os.chdir(tmp_path)
    try:
        args = ["+config_paths=[c.yaml]", "+my_setting=5", "+my_ref=x", "+from_env=3", "++brand_new=1",
                "+head_server.port=12345", "+h_not_help=1"]
        assert dump.main(args[:-1]) == 0, capsys.readouterr().err
        out = capsys.readouterr().out
        assert "my_setting: 5" in out and "uses: x" in out and "from_env: 3" in out and "brand_new: 1" in out
        assert dump.main(args) == 2  # the last one is unknown
        assert "unknown key `+h_not_help`" in capsys.readouterr().err
    finally:
        os.chdir(REPO)


def test_check_known_keys_rules():
    def check(*args, params=(), cfg=None):
        check_known_keys(parse_overrides(list(args)), command_name="ng_x", parameters=params, global_config=cfg)

    check("+a=1", "a.b=2", params=["a"])  # nested keys under a known key are not checked
    check("+h=true", "+config_paths=[]", "+policy_api_key=k", "+venv_mode=isolated", "+entrypoint=x")
    check("++anything=1", "~gone")
    with pytest.raises(NeMoGymConfigError, match=r"unknown key `alpah`\. Did you mean `alpha`\?.*of ng_x or a"):
        check("alpah=1", params=["alpha"])


JOB_SCRIPT_EXTRAS = [
    "+agent_name=a", "+num_samples_in_parallel=4", "+num_repeats=2", "+limit=3", "+prompt_config=p.yaml",
    "+resume_from_cache=true", "+responses_create_params.temperature=0.5", "+input_jsonl_fpath=in.jsonl",
    "+output_jsonl_fpath=out.jsonl", "+split=example",
]


def test_ng_run_accepts_every_key_of_the_collection_commands_and_refuses_the_rest(tmp_path, capsys, monkeypatch):
    """Job scripts hand ng_run the same extra keys as ng_collect_rollouts (NeMo Gym's ng_run takes them silently);
    a key that no command knows is still refused, with a did-you-mean that may name a collection key."""
    from nemo_gym.config import ports

    run = cli.find_command("run")
    for other in ("collect_rollouts", "e2e_collect_rollouts"):
        assert set(cli.find_command(other).config_model.parameter_keys()) <= run.accepted_keys()
    monkeypatch.chdir(tmp_path)
    try:
        # Past the key check, ng_run stops at the missing config files (it starts nothing in this process).
        assert run.main(JOB_SCRIPT_EXTRAS) == 2
        err = capsys.readouterr().err
        assert err.startswith("error: ng_run: nothing to start") and "unknown key" not in err, err
        assert run.main([*JOB_SCRIPT_EXTRAS, "+num_repeat=2"]) == 2
        err = capsys.readouterr().err
        assert err.startswith("error: ng_run: unknown key `+num_repeat`. Did you mean `+num_repeats`?"), err
    finally:
        ports.release_all()
    help_text = " ".join(run.help_text().split())
    assert "the parameters of ng_collect_rollouts, ng_e2e_collect_rollouts" in help_text
    assert "+agent_name" not in help_text  # accepted, not listed among ng_run's own parameters
    # The other commands stay strict.
    assert cli.find_command("status").main(["+num_repeats=2"]) == 2
    assert "unknown key `+num_repeats`" in capsys.readouterr().err


def test_referenced_keys():
    cfg = {"a": "${x}", "b": ["${y.z}", {"c": "pre ${w[0]} ${oc.env:HOME} ${oc.select:v.q,1} ${.rel}"}]}
    assert referenced_keys(cfg) == {"x", "y", "w", "v"}


def test_global_keys_defaults_match_the_code():
    from nemo_gym.config.global_config import NEMO_GYM_RESERVED_TOP_LEVEL_KEYS
    from nemo_gym.http.client import DEFAULT_CONNECTOR_LIMIT, DEFAULT_CONNECTOR_LIMIT_PER_HOST
    from nemo_gym.runtime.launcher import DEFAULT_READY_TIMEOUT_S

    fields = GlobalKeys.model_fields
    assert fields["ready_timeout_s"].default == DEFAULT_READY_TIMEOUT_S
    assert fields["global_aiohttp_connector_limit"].default == DEFAULT_CONNECTOR_LIMIT
    assert fields["global_aiohttp_connector_limit_per_host"].default == DEFAULT_CONNECTOR_LIMIT_PER_HOST
    assert set(NEMO_GYM_RESERVED_TOP_LEVEL_KEYS) <= FRAMEWORK_KEYS


# ------------------------------------------------------------------------------------ errors and exit codes


def _command(run) -> Command:
    return Command(name="demo", verb="demo", summary="A demo.", model=BaseNeMoGymCLIConfig, run=run,
                   reads_config_files=False)


def test_one_error_path(capsys):
    def config_error(config):
        raise NeMoGymConfigError("bad value")

    def interrupted(config):
        raise KeyboardInterrupt

    def missing_file(config):
        open("/nonexistent/file.jsonl")

    assert _command(config_error).main([]) == 2
    assert capsys.readouterr().err == "error: ng_demo: bad value\n"
    assert _command(interrupted).main([]) == 130
    assert _command(missing_file).main([]) == 1
    err = capsys.readouterr().err
    assert err == "error: ng_demo: cannot access /nonexistent/file.jsonl: No such file or directory\n"
    assert _command(lambda config: 7).main([]) == 7
    result = CliRunner().invoke(cli.app, ["version", "+jsn=true"])
    assert result.exit_code == 2 and "error: ng_version: unknown key" in result.output


# ------------------------------------------------------------------------------------------------ ng_status


@contextmanager
def head_server_listing(instances: list):
    """A real head server (the one ng_run runs) whose `/server_instances` lists `instances`; yields its port."""
    import socket

    from nemo_gym.runtime.head_server import HeadServer
    from tests.conftest import free_port

    port = free_port()
    head = HeadServer("{}", lambda: [dict(i) for i in instances])
    head.start(socket.create_server(("127.0.0.1", port)))
    try:
        yield port
    finally:
        head.stop()


def _instance(name: str, url: str) -> dict:
    return {"process_name": name, "server_type": "resources_servers", "name": "impl", "url": url, "pid": 1,
            "state": "ready", "start_time": 0}


def test_ng_status_prints_nemo_gyms_count_line_and_json_stays_json(capsys):
    """Job scripts poll ng_status until its output says `0 unhealthy` (NeMo Gym v0.2/v0.5's wording)."""
    from tests.conftest import free_port

    status = cli.find_command("status")
    with head_server_listing([]) as port:
        head = f"http://127.0.0.1:{port}"  # the head server answers /health: a healthy server to list
        healthy = [_instance("a", head), _instance("b", head)]
        with head_server_listing(healthy) as ready_port:
            assert status.main([f"+head_server.port={ready_port}"]) == 0
            out = capsys.readouterr().out
            assert out.rstrip().splitlines()[-1] == "2 servers found (2 healthy, 0 unhealthy)"
            assert status.main([f"+head_server.port={ready_port}", "+json=true"]) == 0
            assert [i["process_name"] for i in json.loads(capsys.readouterr().out)] == ["a", "b"]
        with head_server_listing([*healthy, _instance("down", f"http://127.0.0.1:{free_port()}")]) as mixed_port:
            assert status.main([f"+head_server.port={mixed_port}"]) == 1
            assert "3 servers found (2 healthy, 1 unhealthy)" in capsys.readouterr().out
        # A head server that lists no server yet: no count line (`0 unhealthy` would read as a ready stack).
        assert status.main([f"+head_server.port={port}"]) == 1
        assert capsys.readouterr().out == "No NeMo Gym servers found running.\n"


def test_ng_status_without_a_stack_says_so_on_stdout_and_gives_the_hint_on_stderr(capsys):
    from tests.conftest import free_port

    status = cli.find_command("status")
    port = free_port()
    assert status.main([f"+head_server.port={port}"]) == 1
    captured = capsys.readouterr()
    assert captured.out == "No NeMo Gym servers found running.\n"
    assert captured.err.startswith(f"error: ng_status: No head server answered at http://127.0.0.1:{port}")
    assert status.main([f"+head_server.port={port}", "+json=true"]) == 1
    assert json.loads(capsys.readouterr().out) == []


# ------------------------------------------------------------------------------------------ shell completion


def test_completions_of_parameters_and_verbs():
    collect, help_command = cli.find_command("collect"), cli.find_command("help")
    assert [c for c, _ in completions(collect, "++resume")] == ["++resume_from_cache="]
    assert completions(collect, "+limit=3") == []
    assert [c for c, _ in completions(cli.find_command("version"), "+")] == ["+json="]
    assert [c for c, _ in completions(help_command, "te")] == ["test", "test-all"]


class _FilesConfig(BaseNeMoGymCLIConfig):
    kind: str = "sft"
    input_jsonl_fpath: "str | list[str]"
    output_fpath: str
    min_reward: "float | None" = None
    browser: bool = True


def _files_command(seen: list) -> Command:
    return Command(
        name="files", verb="files", summary="Test command.", model=_FilesConfig, run=lambda c: seen.append(c) or 0,
        reads_config_files=False, positionals=("kind", "input_jsonl_fpath"), flags={"-o": "output_fpath"},
    )


def test_bare_words_and_flags_become_parameters():
    seen: list = []
    argv = ["dpo", "a.jsonl", "b c,[d].jsonl", "-o", "it's.parquet", "--min-reward", "-0.5", "--no-browser"]
    assert _files_command(seen).main(argv) == 0
    config = seen[-1]
    assert (config.kind, config.input_jsonl_fpath, config.output_fpath) == ("dpo", ["a.jsonl", "b c,[d].jsonl"], "it's.parquet")
    assert (config.min_reward, config.browser) == (-0.5, False)
    # One file stays a string; `--name=value` and a bare boolean flag; overrides still work beside them.
    assert _files_command(seen).main(["sft", "x.jsonl", "--output-fpath=o.jsonl", "--browser", "+min_reward=1"]) == 0
    assert (seen[-1].input_jsonl_fpath, seen[-1].output_fpath, seen[-1].browser, seen[-1].min_reward) == ("x.jsonl", "o.jsonl", True, 1.0)


def test_a_flag_without_its_value_or_an_unknown_flag_is_a_clear_error(capsys):
    seen: list = []
    assert _files_command(seen).main(["sft", "a.jsonl", "-o"]) == 2
    assert "-o needs a value" in capsys.readouterr().err
    assert _files_command(seen).main(["sft", "a.jsonl", "--colour", "red"]) == 2
    assert "colour" in capsys.readouterr().err and not seen


def test_a_missing_parameter_names_its_short_form(capsys):
    assert _files_command([]).main(["sft"]) == 2
    err = capsys.readouterr().err
    assert "`+input_jsonl_fpath=...` (or the second bare word)" in err and "`+output_fpath=...` (or `-o VALUE`)" in err


def test_usage_shows_positionals_and_flags():
    assert "Usage: ng_files [kind] [input_jsonl_fpath...] [-o output_fpath] [+key=value ...]" in _files_command([]).help_text()
