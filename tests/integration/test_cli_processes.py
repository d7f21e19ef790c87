"""The CLI as a user meets it, as real processes: the installed console scripts (`ng`, `ng_<name>`) run through their
pyproject.toml targets in a child interpreter, as a shell runs them: the same help, `ng help`, unknown keys refused
with a did-you-mean, exit codes without tracebacks, `ng_run` refusing a config before it starts anything, shell
completion. The same commands called in this process are tests/unit/test_cli.py."""

import json
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from typer.testing import CliRunner

from nemo_gym import cli
from tests.unit.test_cli import REPO, SCRIPTS

NG = "from nemo_gym.cli import app; app(prog_name='ng')"


def run_script(name: str, *args: str, cwd: Path | None = None, env: dict | None = None) -> subprocess.CompletedProcess:
    """A console script as installed: `ng` or `ng_<name>`, run through its pyproject.toml target."""
    module, func = SCRIPTS[name].split(":")
    code = NG if name == "ng" else f"from {module} import {func}; {func}()"
    return subprocess.run(
        [sys.executable, "-c", code, *args],
        cwd=cwd or REPO,
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, **(env or {})},
    )


# ------------------------------------------------------------------------------------------------- help


def test_the_same_help_from_the_installed_scripts():
    """Real processes, as a shell runs them."""
    forms = [("ng", "collect", "--help"), ("ng_collect_rollouts", "+h=true"), ("ng", "help", "collect")]
    with ThreadPoolExecutor(max_workers=3) as pool:
        results = list(pool.map(lambda form: run_script(*form), forms))
    for result in results:
        assert result.returncode == 0, result.stderr
        assert result.stdout == cli.find_command("collect").help_text()


def test_ng_help_lists_every_command():
    for result in (run_script("ng", "help"), run_script("ng_help")):
        assert result.returncode == 0, result.stderr
        for command in cli.COMMANDS:
            assert f"ng {command.verb} " in result.stdout and f"ng_{command.name}" in result.stdout
            assert command.summary in result.stdout


# --------------------------------------------------------------------------------------------- unknown keys


COLLECT_ARGS = ("+agent_name=x", "+input_jsonl_fpath=a.jsonl", "+output_jsonl_fpath=b.jsonl")


def test_misspelled_key_of_collect_rollouts_fails_with_a_suggestion(tmp_path):
    for script in ("ng_collect_rollouts", "ng"):
        args = ("collect",) if script == "ng" else ()
        result = run_script(script, *args, "+num_repeat=3", *COLLECT_ARGS, cwd=tmp_path)
        assert result.returncode == 2, result.stderr
        assert result.stderr.startswith("error: ng_collect_rollouts: unknown key `+num_repeat`. ")
        assert "Did you mean `+num_repeats`?" in result.stderr
        assert "`++num_repeat=...`" in result.stderr  # how to pass it anyway
        assert "Traceback" not in result.stderr and result.stdout == ""
    assert not list(tmp_path.iterdir())  # nothing ran


def test_misspelled_keys_of_run_and_reward_profile_fail_with_a_suggestion(capsys):
    from tests.conftest import FIXTURE_STACK, free_port

    # policy_base_url is known because the stack's model config interpolates it.
    result = run_script("ng_run", "+config_paths=[configs/stack.yaml]", f"+head_server.port={free_port()}",
                        "+dry_rn=true", "+policy_base_ur=http://x", cwd=FIXTURE_STACK)
    assert result.returncode == 2
    assert "error: ng_run: unknown keys" in result.stderr
    assert "  - `+dry_rn`. Did you mean `+dry_run`?\n" in result.stderr
    assert "  - `+policy_base_ur`. Did you mean `+policy_base_url`?\n" in result.stderr
    assert "servers ready" not in result.stdout and "Traceback" not in result.stderr

    profile = cli.find_command("reward_profile")
    args = ["+materialized_inputs_jsonl_fpath=m.jsonl", "+rollouts_jsonl_fpath=r.jsonl", "+pass_treshold=0.5"]
    assert profile.main(args) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ng_reward_profile: unknown key `+pass_treshold`. Did you mean `+pass_threshold`?")


# ------------------------------------------------------------------------------------ errors and exit codes


def test_ng_subcommand_runs_the_same_handler():
    """In this process, but `ng version` starts one: it reads the platform (`uname -p`)."""
    result = CliRunner().invoke(cli.app, ["version", "+json=true"])
    assert result.exit_code == 0, result.output
    info = json.loads(result.stdout)
    assert set(info) == {"nemo_gym", "python", "python_path", "installation_path", "dependencies", "system"}
    assert info["dependencies"]["fastapi"]


def test_dump_config_resolves_and_masks(tmp_path):
    (tmp_path / "c.yaml").write_text(
        "policy_model:\n"
        "  responses_api_models:\n"
        "    openai_model:\n"
        "      entrypoint: app.py\n"
        "      openai_api_key: ${policy_api_key}\n"
        "      max_output_tokens: 77\n"
    )
    result = run_script("ng_dump_config", "+config_paths=[c.yaml]", "+policy_api_key=sk-secret", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert "sk-secret" not in result.stdout
    assert "****" in result.stdout
    assert "max_output_tokens: 77" in result.stdout


def test_config_mistakes_exit_2_without_traceback(tmp_path):
    result = run_script("ng_dump_config", "+config_paths=[does_not_exist.yaml]", cwd=tmp_path)
    assert result.returncode == 2
    assert "does_not_exist.yaml" in result.stderr
    assert "Traceback" not in result.stderr + result.stdout

    (tmp_path / "bad.yaml").write_text("a: [1, 2\nb: 3\n")
    result = run_script("ng_run", "+config_paths=[bad.yaml]", cwd=tmp_path)
    assert result.returncode == 2
    assert "bad.yaml" in result.stderr
    assert "Traceback" not in result.stderr + result.stdout


def test_status_without_a_head_server_gives_a_hint(tmp_path):
    from tests.conftest import free_port

    result = run_script("ng_status", f"+head_server.port={free_port()}", cwd=tmp_path)
    assert result.returncode == 1
    assert result.stderr.startswith("error: ng_status: No head server answered") and "ng_run" in result.stderr


# ---------------------------------------------------------------------------------------------------- ng_run


def test_ng_run_without_servers_fails_at_once(tmp_path):
    from tests.conftest import free_port

    result = run_script("ng_run", f"+head_server.port={free_port()}", cwd=tmp_path)
    assert result.returncode == 2
    assert result.stderr.startswith("error: ng_run: nothing to start: no config files were given")
    assert '"+config_paths=[' in result.stderr

    (tmp_path / "empty.yaml").write_text("some_setting: 1\n")
    result = run_script("ng", "run", "+config_paths=[empty.yaml]", f"+head_server.port={free_port()}", cwd=tmp_path)
    assert result.returncode == 2
    assert "the config files (empty.yaml) define no server block" in result.stderr
    assert "servers ready" not in result.stdout


def test_ng_run_with_a_misspelled_kind_or_implementation_fails_with_a_suggestion(tmp_path):
    from tests.conftest import free_port

    block = "my_env:\n  {kind}:\n    {impl}:\n      entrypoint: app.py\n      domain: knowledge\n"
    (tmp_path / "kind.yaml").write_text(block.format(kind="resources_serverz", impl="mcqa"))
    result = run_script("ng_run", "+config_paths=[kind.yaml]", f"+head_server.port={free_port()}", cwd=tmp_path)
    assert result.returncode == 2
    assert "`my_env.resources_serverz`: unknown server kind. Did you mean `resources_servers`?" in result.stderr
    (tmp_path / "impl.yaml").write_text(block.format(kind="resources_servers", impl="mcqaa"))
    result = run_script("ng_run", "+config_paths=[impl.yaml]", f"+head_server.port={free_port()}", cwd=tmp_path)
    assert result.returncode == 2
    assert "no folder for implementation 'mcqaa' of resources_servers. Did you mean `mcqa`?" in result.stderr
    assert "servers ready" not in result.stdout and "Traceback" not in result.stderr


def test_ng_run_with_an_unset_interpolation_fails_before_starting_anything():
    from tests.conftest import FIXTURE_STACK, free_port

    result = run_script("ng_run", "+config_paths=[configs/stack.yaml]", f"+head_server.port={free_port()}",
                        cwd=FIXTURE_STACK)
    assert result.returncode == 2
    assert "policy_base_url" in result.stderr and "+policy_base_url=" in result.stderr
    assert "servers ready" not in result.stdout
    assert "Traceback" not in result.stderr + result.stdout


# ------------------------------------------------------------------------------------------ shell completion


def test_shell_completion():
    script = run_script("ng", "--show-completion", "bash")
    assert script.returncode == 0 and "_NG_COMPLETE=complete_bash" in script.stdout
    complete = {"_NG_COMPLETE": "complete_bash", "COMP_WORDS": "ng collect +num", "COMP_CWORD": "2"}
    words = run_script("ng", env=complete)
    assert words.stdout.split() == ["+num_repeats=", "+num_repeats_add_seed=", "+num_samples_in_parallel="]
    verbs = run_script("ng", env={"_NG_COMPLETE": "complete_bash", "COMP_WORDS": "ng pro", "COMP_CWORD": "1"})
    assert verbs.stdout.split() == ["profile"]
