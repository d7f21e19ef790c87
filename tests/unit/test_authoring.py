"""The authoring workflow: `ng_init_resources_server` (scaffold), `ng_test` (+ example data checks), `ng_test_all`,
in this process. Servers under test live in tmp folders laid out like a project (`<tmp>/resources_servers/<name>`).
What runs their tests in real pytest subprocesses (and the scaffold end to end) is
tests/integration/test_authoring_processes.py."""

import json
import os
import textwrap
from pathlib import Path

import pytest
import yaml

from nemo_gym import PARENT_DIR, cli
from nemo_gym.authoring import scaffold
from nemo_gym.authoring import server_tests as st


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


def prepare_my_env_example(tmp_path) -> None:
    """`ng_prepare_data +mode=example_validation` of the scaffolded `my_env`, in-process; raises on a conflict."""
    from nemo_gym.config.global_config import parse_global_config
    from nemo_gym.rollouts.data_prep import POLICY_PLACEHOLDERS, TrainDataProcessorConfig, prepare_data

    cfg = parse_global_config(
        [f"+config_paths=[resources_servers/my_env/configs/my_env.yaml,{st.MODEL_CONFIG}]"],
        initial_global_config_dict=dict(POLICY_PLACEHOLDERS),
        cwd=tmp_path,
        allocate_ports=False,
    )
    config = TrainDataProcessorConfig(output_dirpath=str(tmp_path / "prepared"), mode="example_validation")
    prepare_data(config, cfg, cwd=tmp_path)


def test_scaffold_metrics_equal_what_ng_prepare_data_writes(tmp_path):
    assert init(tmp_path, "+entrypoint=resources_servers/my_env") == 0
    metrics = tmp_path / "resources_servers/my_env/data/example_metrics.json"
    before = metrics.read_text()
    prepare_my_env_example(tmp_path)  # raises on a metrics conflict
    assert metrics.read_text() == before
    assert not list(metrics.parent.glob("*conflict*"))


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


def test_ng_prepare_data_replaces_the_scaffolds_placeholder_metrics_once_the_rows_change(tmp_path):
    """The v0.5 tutorials replace the scaffold's rows, then run ng_prepare_data: no conflict with the placeholder
    metrics; real metrics written over them still conflict when the rows change again."""
    assert init(tmp_path, "+entrypoint=resources_servers/my_env") == 0
    server = tmp_path / "resources_servers/my_env"
    rows = [json.loads(line) for line in (server / "data/example.jsonl").read_text().splitlines()]
    for row in rows:
        row["expected_answer"] = 100 + row["expected_answer"]
    (server / "data/example.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    prepare_my_env_example(tmp_path)  # raises on a metrics conflict
    metrics = json.loads((server / "data/example_metrics.json").read_text())
    assert "Placeholder data" not in metrics and not list((server / "data").glob("*conflict*"))
    assert st.validate_example_data(server, cwd=tmp_path).passed

    rows[0]["expected_answer"] = 7
    (server / "data/example.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    with pytest.raises(Exception, match="conflict"):
        prepare_my_env_example(tmp_path)


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


# ================================================================================================ ng_test_all


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
