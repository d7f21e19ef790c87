"""The authoring workflow: `ng_init_resources_server` (scaffold), `ng_test` (+ example data checks), `ng_test_all`.

Servers under test live in tmp folders laid out like a project (`<tmp>/resources_servers/<name>`); their tests run
in real pytest subprocesses. The only fake is the LLM (the end-to-end test of the scaffold)."""

import importlib.util
import json
import os
import re
import stat
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import yaml

from nemo_gym import PARENT_DIR, cli
from nemo_gym.authoring import scaffold
from nemo_gym.authoring import server_tests as st
from nemo_gym.runtime.venvs import VenvResult


@pytest.fixture(autouse=True)
def _fast_pytest_subprocesses(monkeypatch):
    # The fixture servers' tests need no plugins; skipping plugin autoload makes each pytest run ~4x faster.
    monkeypatch.setenv("PYTEST_DISABLE_PLUGIN_AUTOLOAD", "1")


def ng(name: str, cwd: Path, *args: str) -> int:
    """Run the command `ng_<name> args...` (in this process) from the folder `cwd`; returns its exit code."""
    previous = os.getcwd()
    os.chdir(cwd)
    try:
        return cli.find_command(name).main(list(args))
    finally:
        os.chdir(previous)


def init(tmp_path: Path, *args: str) -> int:
    return ng("init_resources_server", tmp_path, *args)


# ------------------------------------------------------------------------------------------------ fixtures


TINY_APP = '''
from nemo_gym.servers.resources_server import (
    BaseResourcesServerConfig, BaseRunRequest, BaseVerifyRequest, BaseVerifyResponse, SimpleResourcesServer,
)


class TinyRunRequest(BaseRunRequest):
    expected_answer: int


class TinyVerifyRequest(TinyRunRequest, BaseVerifyRequest):
    pass


class TinyVerifyResponse(TinyVerifyRequest, BaseVerifyResponse):
    pass


class TinyResourcesServer(SimpleResourcesServer):
    config: BaseResourcesServerConfig

    async def verify(self, body: TinyVerifyRequest) -> TinyVerifyResponse:
        return TinyVerifyResponse(**body.model_dump(), reward=1.0)
'''

PASSING_TEST = "def test_ok():\n    assert 1 + 1 == 2\n"
FAILING_TEST = "def test_broken():\n    assert 1 + 1 == 3, 'arithmetic is off'\n"


def row(answer: int = 1) -> str:
    return json.dumps({"responses_create_params": {"input": f"question {answer}"}, "expected_answer": answer})


def make_server(
    root: Path,
    name: str,
    *,
    server_type: str = "resources_servers",
    test: str | None = PASSING_TEST,
    rows: list[str] | None = None,
    metrics: int | None = 5,
    readme: bool = True,
    venv_mode: str | None = None,
) -> Path:
    """A tiny server folder: app.py, configs/<name>.yaml, README.md, tests/test_x.py, data/example.jsonl + metrics."""
    server = root / server_type / name
    (server / "tests").mkdir(parents=True)
    (server / "data").mkdir()
    (server / "configs").mkdir()
    (server / "app.py").write_text(TINY_APP)
    (server / "requirements.txt").write_text("-e nemo-gym @ ../../\n")
    impl = {"entrypoint": "app.py", "domain": "other"}
    if venv_mode:
        impl["venv_mode"] = venv_mode
    config = {
        f"{name}_resources_server": {server_type: {name: impl}},
        f"{name}_simple_agent": {
            "responses_api_agents": {
                "simple_agent": {
                    "entrypoint": "app.py",
                    "resources_server": {"type": "resources_servers", "name": f"{name}_resources_server"},
                    "model_server": {"type": "responses_api_models", "name": "policy_model"},
                    "datasets": [
                        {"name": "example", "type": "example", "license": "Apache 2.0",
                         "jsonl_fpath": f"{server_type}/{name}/data/example.jsonl"},
                    ],
                }
            }
        },
    }
    (server / "configs" / f"{name}.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
    if readme:
        (server / "README.md").write_text(f"# {name}\n")
    if test is not None:
        (server / "tests" / "test_x.py").write_text(test)
    lines = rows if rows is not None else [row(i) for i in range(5)]
    (server / "data" / "example.jsonl").write_text("".join(line + "\n" for line in lines))
    if metrics is not None:
        document = {"name": "example", "Number of examples": metrics}
        (server / "data" / "example_metrics.json").write_text(json.dumps(document))
    return server


# ================================================================================================ scaffold


def test_title_case():
    assert scaffold.title_case("my_env") == "MyEnv"
    assert scaffold.title_case("mcqa") == "Mcqa"
    assert scaffold.title_case("my2_env_v3") == "My2EnvV3"
    assert scaffold.title_case("xmlParser_tool") == "XmlParserTool"


def test_scaffold_writes_a_complete_server(tmp_path, capsys):
    assert init(tmp_path, "+entrypoint=resources_servers/word_game") == 0
    server = tmp_path / "resources_servers" / "word_game"
    expected = {
        "__init__.py", "app.py", "README.md", "requirements.txt", "configs/word_game.yaml", "data/example.jsonl",
        "data/example_metrics.json", "data/.gitignore", "tests/__init__.py", "tests/test_app.py", "tests/test_e2e.py",
    }
    written = {str(p.relative_to(server)) for p in server.rglob("*") if p.is_file()}
    assert written == expected
    assert (tmp_path / "resources_servers" / "__init__.py").is_file()  # so `resources_servers.word_game` imports
    for path in server.rglob("*"):
        if path.is_file():
            assert "@@" not in path.read_text(), path

    app = (server / "app.py").read_text()
    for cls in ("WordGameResourcesServerConfig", "WordGameRunRequest", "WordGameVerifyRequest",
                "WordGameVerifyResponse", "WordGameResourcesServer(SimpleResourcesServer)"):
        assert f"class {cls}" in app
    assert 'app.post("/get_word_length")' in app and "async def verify" in app

    config = yaml.safe_load((server / "configs" / "word_game.yaml").read_text())
    resources = config["word_game_resources_server"]["resources_servers"]["word_game"]
    assert resources["entrypoint"] == "app.py" and resources["domain"] == "other"
    agent = config["word_game_simple_agent"]["responses_api_agents"]["simple_agent"]
    assert agent["resources_server"] == {"type": "resources_servers", "name": "word_game_resources_server"}
    assert agent["model_server"] == {"type": "responses_api_models", "name": "policy_model"}
    assert agent["datasets"] == [
        {"name": "example", "type": "example", "jsonl_fpath": "resources_servers/word_game/data/example.jsonl",
         "license": "Apache 2.0"}
    ]

    rows = [json.loads(line) for line in (server / "data" / "example.jsonl").read_text().splitlines()]
    assert len(rows) == 5
    assert all(r["agent_ref"]["name"] == "word_game_simple_agent" for r in rows)
    assert json.loads((server / "data" / "example_metrics.json").read_text())["Number of examples"] == 5
    ignored = (server / "data" / ".gitignore").read_text().split()
    assert {"train*.jsonl", "validation*.jsonl", "*_prepare.jsonl"} <= set(ignored)
    # Outside the checkout, the requirement points at the checkout by absolute path.
    assert (server / "requirements.txt").read_text().strip() == f"-e nemo-gym @ {PARENT_DIR.as_posix()}"
    assert "word_game" in (server / "README.md").read_text()

    out = capsys.readouterr().out
    assert "Created resources server `word_game`" in out
    assert "ng_test +entrypoint=resources_servers/word_game" in out and "ng_run" in out


def test_requirement_line(monkeypatch, tmp_path):
    inside = PARENT_DIR / "resources_servers" / "some_env"
    assert scaffold.framework_requirement_line(inside) == "-e nemo-gym @ ../../"
    outside = tmp_path / "resources_servers" / "x"
    assert scaffold.framework_requirement_line(outside) == f"-e nemo-gym @ {PARENT_DIR.as_posix()}"
    monkeypatch.setattr(scaffold, "PARENT_DIR", tmp_path)  # no pyproject.toml: installed from a wheel
    assert scaffold.framework_requirement_line(inside) == "nemo-gym"


def test_scaffold_refuses_an_existing_folder(tmp_path, capsys):
    existing = tmp_path / "resources_servers" / "taken"
    existing.mkdir(parents=True)
    (existing / "keep.txt").write_text("mine")
    assert init(tmp_path, "+entrypoint=resources_servers/taken") == 2
    err = capsys.readouterr().err
    assert "already exists" in err and "never overwrites" in err and str(existing) in err
    assert [p.name for p in existing.iterdir()] == ["keep.txt"]
    (tmp_path / "resources_servers" / "a_file").write_text("x")
    assert init(tmp_path, "+entrypoint=resources_servers/a_file") == 2
    assert "already exists" in capsys.readouterr().err


@pytest.mark.parametrize("name", ["my-env", "1env", "class", "has space", "ünï-code!"])
def test_scaffold_rejects_names_that_are_not_identifiers(tmp_path, capsys, name):
    assert init(tmp_path, f"+entrypoint=resources_servers/{name}") == 2
    err = capsys.readouterr().err
    assert "Invalid server name" in err and "Python identifier" in err
    assert not (tmp_path / "resources_servers").exists()


def test_scaffold_place_and_parameters(tmp_path, capsys):
    assert init(tmp_path, "+entrypoint=elsewhere/my_env") == 2
    assert "resources_servers/my_env" in capsys.readouterr().err
    assert init(tmp_path) == 2
    assert "+entrypoint" in capsys.readouterr().err
    # A bare name goes under resources_servers/ of the current folder.
    assert init(tmp_path, "+entrypoint=bare_env") == 0
    assert (tmp_path / "resources_servers" / "bare_env" / "app.py").is_file()
    assert init(tmp_path, "+h=true") == 0
    assert "+entrypoint" in capsys.readouterr().out


def test_scaffold_inside_the_checkout_uses_the_relative_requirement(tmp_path, monkeypatch):
    # Pretend tmp_path is the checkout: the server is inside it, so the line is the usual `../../`.
    (tmp_path / "pyproject.toml").write_text("[project]\nname = 'x'\n")
    monkeypatch.setattr(scaffold, "PARENT_DIR", tmp_path)
    assert init(tmp_path, "+entrypoint=resources_servers/inner") == 0
    assert (tmp_path / "resources_servers/inner/requirements.txt").read_text().strip() == "-e nemo-gym @ ../../"


def test_scaffold_own_tests_pass(tmp_path):
    assert init(tmp_path, "+entrypoint=resources_servers/my_env") == 0
    server = tmp_path / "resources_servers" / "my_env"
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-rs"], cwd=server, capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    passed = int(re.search(r"(\d+) passed", proc.stdout).group(1))
    assert passed >= 9 and "failed" not in proc.stdout
    # The end-to-end test needs the server inside the nemo_gym install folder; here it says so and skips.
    assert "1 skipped" in proc.stdout and "not under" in proc.stdout


def test_scaffold_passes_ng_test_with_data_validation(tmp_path, capsys):
    assert init(tmp_path, "+entrypoint=resources_servers/my_env") == 0
    capsys.readouterr()
    code = ng("test", tmp_path, "+entrypoint=resources_servers/my_env", "+should_validate_data=true")
    out = capsys.readouterr().out
    assert code == 0, out
    assert "tests passed" in out and "example data OK" in out and "MyEnvVerifyRequest" in out


def test_scaffold_metrics_equal_what_ng_prepare_data_writes(tmp_path):
    from nemo_gym.config.global_config import parse_global_config
    from nemo_gym.rollouts.data_prep import POLICY_PLACEHOLDERS, TrainDataProcessorConfig, prepare_data

    assert init(tmp_path, "+entrypoint=resources_servers/my_env") == 0
    metrics = tmp_path / "resources_servers/my_env/data/example_metrics.json"
    before = metrics.read_text()
    cfg = parse_global_config(
        [f"+config_paths=[resources_servers/my_env/configs/my_env.yaml,{st.MODEL_CONFIG}]"],
        initial_global_config_dict=dict(POLICY_PLACEHOLDERS),
        cwd=tmp_path,
        allocate_ports=False,
    )
    config = TrainDataProcessorConfig(output_dirpath=str(tmp_path / "prepared"), mode="example_validation")
    prepare_data(config, cfg, cwd=tmp_path)  # raises on a metrics conflict
    assert metrics.read_text() == before
    assert not list(metrics.parent.glob("*conflict*"))


def test_scaffold_runs_end_to_end_with_ng_run_and_ng_collect_rollouts(tmp_path):
    """The scaffold as a real stack (ng_run from the project folder) with the scaffold's own fake-LLM script."""
    from nemo_gym.testing.e2e import collect_examples_e2e

    assert init(tmp_path, "+entrypoint=resources_servers/my_env") == 0
    e2e_file = tmp_path / "resources_servers/my_env/tests/test_e2e.py"
    spec = importlib.util.spec_from_file_location("scaffold_e2e", e2e_file)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    rows = collect_examples_e2e("my_env", tmp_path, script=module.fake_llm_script(), project_dir=tmp_path)
    assert [r["reward"] for r in rows] == [1.0] * 5
    assert [r["extracted_answer"] for r in rows] == [r["expected_answer"] for r in rows] == [6, 8, 7, 8, 14]
    assert all(r["called_tool"] for r in rows)


def test_cli_wiring(tmp_path, capsys):
    assert ng("init_resources_server", tmp_path, "+entrypoint=resources_servers/via_cli") == 0
    assert (tmp_path / "resources_servers/via_cli/app.py").is_file()
    assert ng("init_resources_server", tmp_path, "+entrypoint=resources_servers/via_cli") == 2
    for command, text in (("test", "+should_validate_data"), ("test_all", "+fail_on_total_and_test_mismatch")):
        assert ng(command, tmp_path, "+h=true") == 0
        assert text in capsys.readouterr().out


def test_ng_init_typer_subcommand(tmp_path, monkeypatch):
    from typer.testing import CliRunner

    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(cli.app, ["init", "+entrypoint=resources_servers/typer_env"])
    assert result.exit_code == 0, result.output
    assert (tmp_path / "resources_servers/typer_env/configs/typer_env.yaml").is_file()


# ================================================================================================== ng_test


def test_ng_test_passing_server(tmp_path, capsys):
    make_server(tmp_path, "good")
    assert ng("test", tmp_path, "+entrypoint=resources_servers/good") == 0
    out = capsys.readouterr().out
    assert "1 passed" in out  # pytest's own output is shown
    assert "resources_servers/good: tests passed" in out and sys.executable in out


def test_ng_test_failing_server_says_which_and_how_to_rerun(tmp_path, capsys):
    server = make_server(tmp_path, "bad", test=FAILING_TEST)
    assert ng("test", tmp_path, f"+entrypoint={server}") == 1  # pytest's exit code
    captured = capsys.readouterr()
    assert "arithmetic is off" in captured.out
    assert "resources_servers/bad: tests FAILED (pytest exit code 1)" in captured.err
    assert f"cd {server} && {sys.executable} -m pytest" in captured.err


def test_ng_test_server_without_tests(tmp_path, capsys):
    make_server(tmp_path, "empty", test=None)
    assert ng("test", tmp_path, "+entrypoint=resources_servers/empty") == 5
    assert "no tests were collected" in capsys.readouterr().err


def test_ng_test_unknown_folder(tmp_path, capsys):
    make_server(tmp_path, "good")
    assert ng("test", tmp_path, "+entrypoint=resources_servers/nope") == 2
    assert "No server folder resources_servers/nope" in capsys.readouterr().err
    assert ng("test", tmp_path, "+entrypoint=good") == 2
    assert "Did you mean +entrypoint=resources_servers/good?" in capsys.readouterr().err
    assert ng("test", tmp_path) == 2
    assert "missing required parameter `+entrypoint=...`" in capsys.readouterr().err


def test_ng_test_falls_back_to_the_install_folder(tmp_path):
    # Nothing under the current folder: resources_servers/<name> is looked up in the install folder.
    found = st.resolve_server_dir("resources_servers/example_single_tool_call", tmp_path)
    assert found == PARENT_DIR / "resources_servers" / "example_single_tool_call"


def _fake_venv_python(tmp_path: Path) -> tuple[Path, Path]:
    """A `python` that records its arguments and runs this interpreter: stands in for an isolated venv's python."""
    calls = tmp_path / "venv_calls.txt"
    python = tmp_path / "venv" / "bin" / "python"
    python.parent.mkdir(parents=True)
    python.write_text(f'#!/bin/sh\necho "$@" >> {calls}\nexec {sys.executable} "$@"\n')
    python.chmod(python.stat().st_mode | stat.S_IEXEC)
    return python, calls


@pytest.mark.parametrize("where", ["server_block", "global"])
def test_ng_test_uses_the_isolated_venv(tmp_path, monkeypatch, capsys, where):
    python, calls = _fake_venv_python(tmp_path)
    seen = {}

    def fake_ensure(server_dir, global_config, server_config, *, log=print):
        from nemo_gym.runtime.venvs import effective_venv_mode

        seen["mode"] = effective_venv_mode(global_config, server_config)
        return VenvResult(server=str(server_dir), mode=seen["mode"], python=str(python), action="reused")

    monkeypatch.setattr("nemo_gym.runtime.venvs.ensure_server_venv", fake_ensure)
    make_server(tmp_path, "iso", venv_mode="isolated" if where == "server_block" else None)
    args = ["+entrypoint=resources_servers/iso", "+should_validate_data=true"]
    if where == "global":
        args.append("+venv_mode=isolated")
    assert ng("test", tmp_path, *args) == 0, capsys.readouterr()
    assert seen["mode"] == "isolated"
    recorded = calls.read_text()
    assert "-m pytest" in recorded  # the tests ran with the venv's python
    assert "--check-rows" in recorded  # and so did the row check
    out = capsys.readouterr().out
    assert f"its isolated venv: {python}" in out and "example data OK" in out


def test_ng_test_isolated_venv_without_pytest(tmp_path, monkeypatch, capsys):
    python, _ = _fake_venv_python(tmp_path)
    failing_uv = tmp_path / "uv"
    failing_uv.write_text("#!/bin/sh\necho 'No solution found: network unreachable' >&2\nexit 1\n")
    failing_uv.chmod(0o755)
    monkeypatch.setattr(
        "nemo_gym.runtime.venvs.ensure_server_venv",
        lambda *a, **k: VenvResult(server="x", mode="isolated", python=str(python), action="reused"),
    )
    monkeypatch.setattr("nemo_gym.runtime.venvs.find_uv", lambda: str(failing_uv))
    monkeypatch.setattr(st, "_has_pytest", lambda python: False)
    make_server(tmp_path, "nopytest")
    assert ng("test", tmp_path, "+entrypoint=resources_servers/nopytest") == 1
    err = capsys.readouterr().err
    assert "resources_servers/nopytest" in err and "network unreachable" in err
    assert "Add `pytest` to the server's requirements.txt" in err


# ============================================================================================ data validation


def test_data_validation_passes(tmp_path):
    check = st.validate_example_data(make_server(tmp_path, "tiny"), cwd=tmp_path)
    assert check.passed, check.problems
    assert any("5 row(s)" in line and "TinyVerifyRequest" in line for line in check.ok)
    assert any("example_rollouts.jsonl (optional" in note and "ng_collect_rollouts" in note for note in check.notes)


@pytest.mark.parametrize("count", [4, 6])
def test_data_validation_wrong_row_count(tmp_path, count):
    server = make_server(tmp_path, "tiny", rows=[row(i) for i in range(count)], metrics=count)
    problems = st.validate_example_data(server, cwd=tmp_path).problems
    assert any(f"resources_servers/tiny/data/example.jsonl: {count} row(s)" in p and "exactly 5" in p for p in problems)
    assert any('"Number of examples": ' + str(count) in p and "+mode=example_validation" in p for p in problems)


def test_data_validation_invalid_row_names_the_line(tmp_path):
    rows = [row(0), row(1), json.dumps({"responses_create_params": {"input": "q"}}), row(3), "{not json"]
    problems = st.validate_example_data(make_server(tmp_path, "tiny", rows=rows), cwd=tmp_path).problems
    assert len(problems) == 2, problems
    assert "resources_servers/tiny/data/example.jsonl line 3" in problems[0]
    assert "TinyVerifyRequest" in problems[0] and "expected_answer" in problems[0]
    assert "line 5" in problems[1] and "not valid JSON" in problems[1]


def test_data_validation_missing_metrics_gives_the_command(tmp_path):
    server = make_server(tmp_path, "tiny", metrics=None)
    (problem,) = st.validate_example_data(server, cwd=tmp_path).problems
    assert problem.startswith("resources_servers/tiny/data/example_metrics.json is missing. Create it with: ")
    assert problem.endswith(
        'ng_prepare_data "+config_paths=[resources_servers/tiny/configs/tiny.yaml,'
        'responses_api_models/openai_model/configs/openai_model.yaml]" '
        "+output_dirpath=results/example_validation/tiny +mode=example_validation"
    )
    # From another folder, the command starts with a cd to the project folder.
    (elsewhere := tmp_path / "elsewhere").mkdir()
    (problem,) = st.validate_example_data(server, cwd=elsewhere).problems
    assert f"cd {tmp_path} && ng_prepare_data" in problem


def test_data_validation_hint_command_really_creates_the_metrics(tmp_path):
    """Run the hinted ng_prepare_data command as printed; then the check passes."""
    server = make_server(tmp_path, "tiny", metrics=None)
    (problem,) = st.validate_example_data(server, cwd=tmp_path).problems
    command = problem.split("Create it with: ", 1)[1]
    import shlex

    script, *args = shlex.split(command)
    assert script == "ng_prepare_data"
    assert ng("prepare_data", tmp_path, *args) == 0
    assert st.validate_example_data(server, cwd=tmp_path).passed


def test_data_validation_conflict_file(tmp_path):
    server = make_server(tmp_path, "tiny")
    (server / "data" / "example_metrics_conflict.json").write_text("{}")
    (problem,) = st.validate_example_data(server, cwd=tmp_path).problems
    assert problem.startswith("resources_servers/tiny/data/example_metrics_conflict.json:")
    assert "+overwrite_metrics_conflicts=true" in problem


def test_data_validation_optional_rollouts(tmp_path):
    server = make_server(tmp_path, "tiny")
    rollouts = server / "data" / "example_rollouts.jsonl"
    rollouts.write_text("".join(json.dumps({"reward": 1.0, "_ng_task_index": i}) + "\n" for i in range(5)))
    check = st.validate_example_data(server, cwd=tmp_path)
    assert check.passed and not check.notes
    assert any("5 rollouts" in line for line in check.ok)
    rollouts.write_text(json.dumps({"reward": 1.0}) + "\n" + json.dumps({"no": "reward"}) + "\n")
    problems = st.validate_example_data(server, cwd=tmp_path).problems
    assert any("2 line(s), expected 5" in p for p in problems)
    assert any("example_rollouts.jsonl line 2: not a rollout" in p for p in problems)


def test_data_validation_unloadable_verify_model(tmp_path):
    server = make_server(tmp_path, "tiny")
    (server / "app.py").write_text("import a_module_that_is_not_installed\n")
    problems = st.validate_example_data(server, cwd=tmp_path).problems
    assert any("cannot check the rows" in p and "a_module_that_is_not_installed" in p for p in problems)


def test_ng_test_data_failure_exit_code_and_message(tmp_path, capsys):
    rows = [row(0), row(1), json.dumps({"responses_create_params": {"input": "q"}, "expected_answer": "x"})]
    make_server(tmp_path, "tiny", rows=rows, metrics=None)
    code = ng("test", tmp_path, "+entrypoint=resources_servers/tiny", "+should_validate_data=true")
    assert code == 1
    captured = capsys.readouterr()
    assert "resources_servers/tiny: tests passed" in captured.out  # tests ran and passed; the data did not
    assert "resources_servers/tiny: example data check FAILED (3 problem(s))" in captured.err
    assert "example.jsonl: 3 row(s)" in captured.err
    assert "example.jsonl line 3" in captured.err and "expected_answer" in captured.err
    assert "example_metrics.json is missing. Create it with: ng_prepare_data" in captured.err


def test_ng_test_data_validation_is_for_resources_servers_only(tmp_path, capsys):
    make_server(tmp_path, "agent_x", server_type="responses_api_agents", metrics=None)
    args = ["+entrypoint=responses_api_agents/agent_x", "+should_validate_data=true"]
    assert ng("test", tmp_path, *args) == 0
    assert "applies to resources servers only" in capsys.readouterr().out


# ================================================================================================ ng_test_all


LOGS = "+log_dir=logs"  # relative to the current folder (tmp_path): keeps the pytest logs out of /tmp


def _table_row(out: str, label: str) -> str:
    return next(line for line in out.splitlines() if label in line and "│" in line)


def test_ng_test_all_table_and_exit_code(tmp_path, capsys):
    make_server(tmp_path, "good")
    make_server(tmp_path, "bad_data", metrics=None)
    make_server(tmp_path, "broken", server_type="responses_api_agents", test=FAILING_TEST)
    make_server(tmp_path, "untested", server_type="responses_api_models", test=None)
    make_server(tmp_path, "no_readme", readme=False)

    assert ng("test_all", tmp_path, LOGS) == 1
    out = capsys.readouterr().out
    assert "4 server(s) under" in out and str(tmp_path) in out
    progress = [line for line in out.splitlines() if re.match(r"\[\d/4\] \S+: ", line)]  # one per server when done
    assert [line.split("]")[0] for line in progress] == ["[1/4", "[2/4", "[3/4", "[4/4"]
    assert sorted(line.split()[1].rstrip(":") for line in progress) == [
        "resources_servers/bad_data", "resources_servers/good", "responses_api_agents/broken",
        "responses_api_models/untested",
    ]
    assert "data validation failed" in _table_row(out, "resources_servers/bad_data")
    assert "passed" in _table_row(out, "resources_servers/good")
    assert "failed" in _table_row(out, "responses_api_agents/broken")
    assert "missing tests" in _table_row(out, "responses_api_models/untested")
    assert "no_readme" not in "".join(line for line in out.splitlines() if "│" in line)
    for category in ("passed", "failed", "missing tests", "data validation failed"):
        assert re.search(rf"│ {category}\s+│\s+1 │\s+25\.0% │", out), category
    assert re.search(r"│ total\s+│\s+4 │\s+100\.0% │", out)
    # Failures say why, with the tail of pytest's output and how to rerun.
    assert "arithmetic is off" in out and "rerun by hand: cd " in out
    assert "data: resources_servers/bad_data/data/example_metrics.json is missing" in out
    assert "skipped (no README.md): resources_servers/no_readme" in out
    assert "arithmetic is off" in (tmp_path / "logs" / "responses_api_agents__broken.log").read_text()


def test_ng_test_all_include_exclude(tmp_path, capsys):
    make_server(tmp_path, "good")
    make_server(tmp_path, "broken", test=FAILING_TEST)
    assert ng("test_all", tmp_path, "+include=[good]", LOGS) == 0
    out = capsys.readouterr().out
    assert "1 server(s)" in out and "broken" not in out
    assert re.search(r"│ passed\s+│\s+1 │\s+100\.0% │", out)
    assert ng("test_all", tmp_path, "+exclude=[resources_servers/broken]", LOGS) == 0
    capsys.readouterr()
    assert ng("test_all", tmp_path, "+include=[godo]", LOGS) == 2
    assert "did you mean 'good'?" in capsys.readouterr().err


def test_ng_test_all_fail_fast(tmp_path, capsys):
    make_server(tmp_path, "a_broken", test=FAILING_TEST)
    make_server(tmp_path, "b_good")
    assert ng("test_all", tmp_path, "+fail_fast=true", LOGS) == 1
    out = capsys.readouterr().out
    assert "stopping at the first failure" in out
    assert "not run" in _table_row(out, "resources_servers/b_good")
    assert "[2/2]" not in out


def test_ng_test_all_total_and_test_mismatch(tmp_path, capsys):
    make_server(tmp_path, "good")
    make_server(tmp_path, "no_readme", readme=False)
    assert ng("test_all", tmp_path, LOGS) == 0
    assert "1 tested of 2 server folders" in capsys.readouterr().out
    assert ng("test_all", tmp_path, "+fail_on_total_and_test_mismatch=true", LOGS) == 1
    err = capsys.readouterr().err
    assert "1 tested of 2 server folders" in err and "resources_servers/no_readme" in err


def test_ng_test_all_discovers_cwd_first_then_install_folder(tmp_path):
    make_server(tmp_path, "good")
    root, found, _ = st.discover_servers(tmp_path)
    assert root == tmp_path and [p.name for p in found] == ["good"]
    (empty := tmp_path / "empty").mkdir()
    root, found, _ = st.discover_servers(empty)
    assert root == PARENT_DIR
    assert PARENT_DIR / "resources_servers" / "example_single_tool_call" in found
    assert all(p.parent.name in ("resources_servers", "responses_api_models", "responses_api_agents") for p in found)


def test_server_block_prefers_the_one_that_sets_venv_mode(tmp_path):
    server = make_server(tmp_path, "tiny")
    (server / "configs" / "zz_isolated.yaml").write_text(
        textwrap.dedent(
            """\
            other_id:
              resources_servers:
                tiny: {entrypoint: app.py, domain: other, venv_mode: isolated}
            """
        )
    )
    assert st.server_block(server)["venv_mode"] == "isolated"
    assert [sid for _, sid, _ in st.server_config_blocks(server)] == ["tiny_resources_server", "other_id"]
