"""`ng_materialize_prompts` (v0.5 `gym dataset render`) and `ng_validate` (v0.5 `gym env validate`) as a user runs
them: real child processes on real files and on the repo's own configs. Nothing is started by either command, so no
stack is needed."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from nemo_gym.cli.commands import materialize_prompts, validate
from nemo_gym.config_types import ConfigInterpolationError, ConfigPathNotFoundError, NoServerInstancesError
from tests.conftest import REPO_ROOT

EXAMPLE_RS_CONFIG = "resources_servers/example_single_tool_call/configs/example_single_tool_call.yaml"
AGENT = "weather_tool_use_simple_agent.responses_api_agents.simple_agent"  # the quickstart's agent


def command(module: str, *args: str, cwd: Path) -> subprocess.CompletedProcess:
    """The command as its console script runs it (`Command.console_script`), in a child process."""
    code = f"from nemo_gym.cli.commands.{module} import COMMAND; COMMAND.console_script()()"
    return subprocess.run(
        [sys.executable, "-c", code, *args], cwd=cwd, capture_output=True, text=True, timeout=120
    )


def write_jsonl(path: Path, lines: list[str]) -> Path:
    path.write_text("".join(line + "\n" for line in lines))
    return path


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


# ------------------------------------------------------------------------------------------- ng_materialize_prompts


@pytest.fixture
def prompt_yaml(tmp_path: Path) -> Path:
    path = tmp_path / "prompts" / "math.yaml"
    path.parent.mkdir()
    path.write_text('system: "Answer with a number."\nuser: "Question: {question} (in {{braces}})"\nnotes: ignored\n')
    return path


def test_render_writes_every_row_with_the_template_and_its_path(tmp_path, prompt_yaml):
    rows = [
        {"question": "2+2", "id": 1},
        {"question": "3*3", "id": 2, "responses_create_params": {"temperature": 0.2}},
    ]
    write_jsonl(tmp_path / "questions.jsonl", [json.dumps(rows[0]), "", json.dumps(rows[1])])

    result = command(
        "materialize_prompts", "questions.jsonl", "prompts/math.yaml", "-o", "out/rendered.jsonl", cwd=tmp_path
    )

    assert result.returncode == 0, result.stderr
    out = read_jsonl(tmp_path / "out" / "rendered.jsonl")
    assert [row["id"] for row in out] == [1, 2]
    for row, source in zip(out, rows):
        assert row["prompt_config_used"] == str(prompt_yaml.resolve())
        assert row["question"] == source["question"]
        assert row["responses_create_params"]["input"] == [
            {"role": "system", "content": "Answer with a number."},
            {"role": "user", "content": f"Question: {source['question']} (in {{braces}})"},
        ]
    assert out[1]["responses_create_params"]["temperature"] == 0.2
    assert "Rendered 2 row(s)" in result.stdout


def test_render_with_the_v05_keys(tmp_path, prompt_yaml):
    write_jsonl(tmp_path / "q.jsonl", [json.dumps({"question": "1+1"})])
    result = command(
        "materialize_prompts",
        f"+input_jsonl_fpath={tmp_path / 'q.jsonl'}",
        f"+prompt_config={prompt_yaml}",
        f"+output_jsonl_fpath={tmp_path / 'r.jsonl'}",
        cwd=REPO_ROOT,
    )
    assert result.returncode == 0, result.stderr
    (row,) = read_jsonl(tmp_path / "r.jsonl")
    assert row["responses_create_params"]["input"][-1]["content"] == "Question: 1+1 (in {braces})"


def test_render_reports_every_bad_row_as_file_and_line_and_writes_nothing(tmp_path, prompt_yaml):
    source = write_jsonl(
        tmp_path / "questions.jsonl",
        [
            json.dumps({"question": "fine"}),
            "{not json",
            json.dumps({"prompt": "no question field"}),
            json.dumps({"question": "x", "responses_create_params": {"input": "own input"}}),
            json.dumps(["a", "list"]),
            json.dumps({"question": "also fine"}),
        ],
    )

    result = command("materialize_prompts", "questions.jsonl", str(prompt_yaml), "-o", "out.jsonl", cwd=tmp_path)

    assert result.returncode == 2
    assert "Traceback" not in result.stderr
    first, *rest = result.stderr.splitlines()
    assert first.startswith("error: ng_materialize_prompts: 4 row(s) of ")
    bad_lines = [line.strip() for line in rest if line.strip().startswith(f"{source}:")]
    assert [line.split(":")[1] for line in bad_lines] == ["2", "3", "4", "5"]
    assert "not valid JSON" in bad_lines[0]
    assert "{question}" in bad_lines[1] and "prompt" in bad_lines[1]
    assert "responses_create_params.input" in bad_lines[2]
    assert "JSON object" in bad_lines[3]
    assert not (tmp_path / "out.jsonl").exists()


def test_render_names_a_missing_input_or_template(tmp_path, prompt_yaml, capsys):
    write_jsonl(tmp_path / "q.jsonl", [json.dumps({"question": "1"})])
    assert materialize_prompts.COMMAND.main([str(tmp_path / "nope.jsonl"), str(prompt_yaml), "-o", "o.jsonl"]) == 2
    assert "nope.jsonl" in capsys.readouterr().err
    assert materialize_prompts.COMMAND.main([str(tmp_path / "q.jsonl"), "no/such/template.yaml", "-o", "o.jsonl"]) == 2
    assert "no/such/template.yaml" in capsys.readouterr().err


# ------------------------------------------------------------------------------------------- ng_validate


def test_validate_the_quickstart_config(tmp_path):
    result = command("validate", "+config_paths=[configs/quickstart.yaml]", cwd=REPO_ROOT)
    assert result.returncode == 0, result.stderr
    assert "Config OK: 3 server(s)" in result.stdout
    servers = ("policy_model", "weather_tool_use", "weather_tool_use_simple_agent")
    for server in servers:
        assert server in result.stdout
    assert "placeholder" not in result.stdout


def test_validate_a_resources_server_config_alone_stands_in_a_policy_model(tmp_path):
    result = command("validate", f"+config_paths=[{EXAMPLE_RS_CONFIG}]", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert "Config OK: 2 server(s)" in result.stdout
    assert "placeholder `policy_model`" in result.stdout


def test_validate_reports_a_misspelled_server_ref_with_the_right_name(tmp_path):
    result = command(
        "validate",
        "+config_paths=[configs/quickstart.yaml]",
        f"+{AGENT}.resources_server.name=weather_tool_use_resource_server",
        cwd=REPO_ROOT,
    )
    assert result.returncode == 2
    assert "Traceback" not in result.stderr
    first = result.stderr.splitlines()[0]
    assert first.startswith("error: ng_validate: ")
    assert "`weather_tool_use_resource_server`" in first
    assert "Did you mean `weather_tool_use`?" in first


def test_validate_lists_every_missing_or_broken_file_and_unknown_key_at_once(tmp_path):
    (tmp_path / "broken.yaml").write_text("servers: [unclosed\n")
    (tmp_path / "nested.yaml").write_text("config_paths: [also_missing.yaml]\n")
    result = command(
        "validate",
        f"+config_paths=[missing.yaml,{EXAMPLE_RS_CONFIG},broken.yaml,nested.yaml]",
        "+polcy_model_name=x",
        cwd=tmp_path,
    )
    assert result.returncode == 2
    assert result.stderr.startswith("error: ng_validate: 4 problems in the config:")
    expected_problems = (
        "`missing.yaml` not found",
        "YAML syntax error in",
        "`also_missing.yaml` not found",
        "Did you mean `+policy_model_name`?",
    )
    for expected in expected_problems:
        assert expected in result.stderr, expected
    assert str(tmp_path / "broken.yaml") in result.stderr


def test_validate_lists_every_server_problem_at_once(tmp_path, monkeypatch):
    monkeypatch.delenv("NG_VALIDATE_TEST_UNSET", raising=False)
    (tmp_path / "extra.yaml").write_text(
        "second_resources_server:\n"
        "  resources_servers:\n"
        "    example_single_tool_call:\n"
        "      entrypoint: not_there.py\n"
        "      domain: agent\n"
        "third_resources_server:\n"
        "  resources_servers:\n"
        "    example_single_tool_call:\n"
        "      entrypoint: app.py\n"
        "      domain: agent\n"
        "      api_token: ${oc.env:NG_VALIDATE_TEST_UNSET}\n"
    )
    args = [f"+config_paths=[configs/quickstart.yaml,{tmp_path / 'extra.yaml'}]"]
    report = validate.validate_config(args, cwd=REPO_ROOT)
    messages = [str(p) for p in report.problems]
    assert len(messages) == 2, messages
    assert "second_resources_server" in messages[0] and "not_there.py" in messages[0]
    assert isinstance(report.problems[1], ConfigInterpolationError)
    assert "third_resources_server" in messages[1] and "NG_VALIDATE_TEST_UNSET" in messages[1]


def test_validate_problems_carry_the_v05_classes(tmp_path):
    missing = validate.validate_config(["+config_paths=[missing.yaml]"], cwd=tmp_path)
    assert [type(p) for p in missing.problems] == [ConfigPathNotFoundError]
    nothing = validate.validate_config([], cwd=tmp_path)
    assert [type(p) for p in nothing.problems] == [NoServerInstancesError]


def test_validate_refuses_a_config_without_servers(tmp_path):
    result = command("validate", cwd=tmp_path)
    assert result.returncode == 2
    assert "defines no servers" in result.stderr.splitlines()[0]


def test_validate_help(tmp_path):
    result = command("validate", "+h=true", cwd=tmp_path)
    assert result.returncode == 0
    assert result.stdout.startswith("ng_validate: ")
