"""Bad input on purpose, through the real commands (child processes), as a user would meet it.

Every case must end with a non-zero exit code, no Python traceback, and a first line of stderr
(`error: ng_<command>: ...`) that names the file and line, the key or the server at fault. The collector cases share
one running stack (`ng_run` of tests/fixtures/stack/configs/collect.yaml in front of the fake LLM); a refused
collection must leave an earlier run's files byte for byte as they were. docs/errors.md describes the behaviour.

Cases already covered elsewhere are not repeated: a missing config file for ng_dump_config, a misspelled server
kind or implementation, an unset interpolation and a config with no server (tests/integration/test_cli_processes.py);
every kind of bad input line in-process (tests/unit/test_rollout_collection.py, tests/unit/test_train_data_utils.py).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from nemo_gym.testing.stack import FakeLLMBackend, NgRunStack, free_port
from tests.conftest import FIXTURE_STACK, REPO_ROOT
from tests.integration.test_collect_rollouts import TOOLS

SCRIPTS = {
    "ng_run": "run",
    "ng_collect_rollouts": "collect_rollouts",
    "ng_prepare_data": "prepare_data",
    "ng_test": "test",
    "ng_test_all": "test_all",
}
AGENT = "counter_simple_agent"


def ng(script: str, *args: str, cwd: Path) -> subprocess.CompletedProcess:
    code = f"from nemo_gym.cli import {SCRIPTS[script]} as main; main()"
    return subprocess.run(
        [sys.executable, "-c", code, *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )


def assert_one_line_error(result: subprocess.CompletedProcess, script: str, code: int, *names: str) -> str:
    """Exit `code`, no traceback, and a first stderr line `error: <script>: ...` holding every one of `names`."""
    shown = f"exit {result.returncode}\n--- stderr\n{result.stderr}\n--- stdout\n{result.stdout[-3000:]}"
    assert result.returncode == code, shown
    assert "Traceback" not in result.stderr + result.stdout, shown
    first = result.stderr.splitlines()[0] if result.stderr else ""
    assert first.startswith(f"error: {script}: "), shown
    for name in names:
        assert name in first, f"{name!r} not in the first line:\n{shown}"
    return first


# ------------------------------------------------------------------------------------------ config files


SERVER = """\
my_res:
  resources_servers:
    example_single_tool_call:
{fields}
"""
FILES = {
    "syntax.yaml": "foo:\n  bar: 1\n  baz: [1, 2\nqux: 3\n",
    "port_not_int.yaml": SERVER.format(fields="      entrypoint: app.py\n      domain: agent\n      port: abc"),
    "no_entrypoint.yaml": SERVER.format(fields="      domain: agent"),
    "missing_entrypoint_file.yaml": SERVER.format(fields="      entrypoint: nope.py\n      domain: agent"),
    "good_server.yaml": SERVER.format(fields="      entrypoint: app.py\n      domain: agent"),
    "unknown_ref.yaml": SERVER.format(fields="      entrypoint: app.py\n      domain: agent")
    + """\
my_agent:
  responses_api_agents:
    simple_agent:
      entrypoint: app.py
      resources_server: {type: resources_servers, name: my_ress}
      model_server: {type: responses_api_models, name: policy_model}
""",
    "crashing.yaml": """\
broken_res:
  resources_servers:
    broken:
      entrypoint: app.py
      domain: agent
""",
    "resources_servers/broken/app.py": "this is not python(\n",
    "resources_servers/broken/README.md": "broken on purpose\n",
}


@pytest.fixture(scope="module")
def workdir(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("bad_inputs")
    for name, text in FILES.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    return root


@dataclass(frozen=True)
class Case:
    id: str
    script: str
    args: tuple[str, ...]
    names: tuple[str, ...]  # each must appear in the first line of stderr
    code: int = 2


def head() -> str:
    return f"+head_server.port={free_port()}"


COLLECT_PARAMS = ("+agent_name=a", "+input_jsonl_fpath=in.jsonl", "+output_jsonl_fpath=out.jsonl")
CONFIG_CASES = [
    Case("yaml syntax error", "ng_run", ("+config_paths=[syntax.yaml]",), ("syntax.yaml", "line 4")),
    Case(
        "missing config file (collect)",
        "ng_collect_rollouts",
        ("+config_paths=[missing.yaml]", *COLLECT_PARAMS),
        ("`missing.yaml` not found",),
    ),
    Case(
        "server port not an int",
        "ng_run",
        ("+config_paths=[port_not_int.yaml]",),
        ("Server `my_res`", "port", "(got 'abc')"),
    ),
    Case(
        "head port out of range", "ng_run", ("+config_paths=[good_server.yaml]", "+head_server.port=99999"),
        ("`head_server.port`", "99999"),
    ),
    Case("num_repeats not an int", "ng_collect_rollouts", (*COLLECT_PARAMS, "+num_repeats=abc"), ("`+num_repeats`", "'abc'")),
    Case(
        "num_samples_in_parallel negative",
        "ng_collect_rollouts",
        (*COLLECT_PARAMS, "+num_samples_in_parallel=-1"),
        ("`+num_samples_in_parallel`", "-1"),
    ),
    Case(
        "server block without entrypoint",
        "ng_run",
        ("+config_paths=[no_entrypoint.yaml]",),
        ("`my_res.resources_servers.example_single_tool_call` has no `entrypoint`", "entrypoint: app.py"),
    ),
    Case(
        "entrypoint file missing",
        "ng_run",
        ("+config_paths=[missing_entrypoint_file.yaml]",),
        ("Server 'my_res'", "'nope.py' not found", "resources_servers/example_single_tool_call"),
    ),
    Case(
        "reference to an unknown server",
        "ng_run",
        ("+config_paths=[unknown_ref.yaml]",),
        ("`my_agent`", "`my_ress`", "Did you mean `my_res`?"),
    ),
    Case(
        "server crashes while starting",
        "ng_run",
        ("+config_paths=[crashing.yaml]",),
        ("Server 'broken_res'", "exited with code 1"),
        code=1,
    ),
    Case(
        "no stack on the head server port",
        "ng_collect_rollouts",
        (*COLLECT_PARAMS, "+head_server.port=PORT"),
        ("Could not reach the NeMo Gym head server", "ng_run"),
        code=1,
    ),
    Case("ng_test on a missing folder", "ng_test", ("+entrypoint=resources_servers/nope",), ("resources_servers/nope",)),
    Case("ng_test_all on a missing server", "ng_test_all", ("+include=[nope_server]",), ("'nope_server'",)),
]


@pytest.mark.parametrize("case", CONFIG_CASES, ids=[c.id for c in CONFIG_CASES])
def test_config_mistake_is_one_line_naming_the_culprit(case: Case, workdir: Path):
    args = [a.replace("PORT", str(free_port())) for a in case.args]
    if case.script == "ng_run" and not any(a.startswith("+head_server.port") for a in args):
        args.append(head())
    result = ng(case.script, *args, cwd=workdir)
    assert_one_line_error(result, case.script, case.code, *case.names)
    assert "servers ready" not in result.stdout


def test_prepare_data_bad_line_names_file_line_and_dataset(tmp_path):
    shutil.copytree(REPO_ROOT / "tests" / "fixtures" / "prepare_data", tmp_path, dirs_exist_ok=True)
    data = tmp_path / "data" / "qa_example.jsonl"
    lines = data.read_text().splitlines()
    data.write_text("\n".join([lines[0], "{broken", *lines[1:]]) + "\n")
    result = ng(
        "ng_prepare_data", "+config_paths=[configs/qa.yaml]", "+output_dirpath=out", "+mode=example_validation",
        cwd=tmp_path,
    )
    assert_one_line_error(result, "ng_prepare_data", 2, "data/qa_example.jsonl:2:", "dataset 'example'", "not valid JSON")
    assert not (tmp_path / "out").exists()


# ------------------------------------------------------------------------------------------ collection inputs


def row(text: str, initial: int, expected: int, **extra) -> dict:
    return {
        "responses_create_params": {"input": text, "tools": TOOLS},
        "initial_count": initial,
        "expected_count": expected,
        **extra,
    }


GOOD = [json.dumps(row("please add 2", 1, 3)), json.dumps(row("please add 1", 0, 5))]
INPUTS = {
    "good.jsonl": GOOD,
    "empty.jsonl": [],
    "not_json.jsonl": [GOOD[0], "{not json", GOOD[1]],
    "not_object.jsonl": [GOOD[0], "[1, 2]", GOOD[1]],
    "no_params.jsonl": [GOOD[0], json.dumps({"question": "no params"}), GOOD[1]],
    "unknown_agent.jsonl": [
        GOOD[0],
        json.dumps(row("please add 1", 0, 5, agent_ref={"type": "responses_api_agents", "name": "nope_agent"})),
    ],
}


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    """The collect stack, one for the module, plus a folder with the input files; yields (head port, folder)."""
    folder = tmp_path_factory.mktemp("collect_inputs")
    for name, lines in INPUTS.items():
        (folder / name).write_text("".join(line + "\n" for line in lines))
    (folder / "a_file").write_text("not a folder\n")
    (folder / "a_folder").mkdir()
    head_port = free_port()
    with FakeLLMBackend("--script", str(FIXTURE_STACK / "scripts" / "collect.jsonl")) as backend:
        ng_run = NgRunStack(
            [
                "+config_paths=[configs/collect.yaml]",
                f"+policy_base_url={backend.base_url}",
                "+policy_api_key=dummy",
                "+policy_model_name=fake-model",
                f"+head_server.port={head_port}",
            ],
            cwd=FIXTURE_STACK,
        )
        try:
            ng_run.wait_for("All 4 / 4 servers ready!", timeout=180)
            yield head_port, folder
        finally:
            ng_run.stop()


def collect(head_port: int, folder: Path, input_name: str, output: str = "out/rollouts.jsonl", *extra: str):
    return ng(
        "ng_collect_rollouts",
        f"+head_server.port={head_port}",
        f"+agent_name={AGENT}",
        f"+input_jsonl_fpath={input_name}",
        f"+output_jsonl_fpath={output}",
        "+progress_bar=false",
        *extra,
        cwd=folder,
    )


COLLECT_CASES = [
    # (id, input, output, extra args, names in the first line)
    ("missing input file", "missing.jsonl", None, (), ("missing.jsonl", "+input_jsonl_fpath")),
    ("input is a folder", "a_folder", None, (), ("+input_jsonl_fpath=a_folder", "is a folder")),
    ("empty input file", "empty.jsonl", None, (), ("empty.jsonl has no rows",)),
    ("line is not JSON", "not_json.jsonl", None, (), ("not_json.jsonl:2: invalid JSON", "no rollout was started")),
    ("line is not an object", "not_object.jsonl", None, (), ("not_object.jsonl:2: expected a JSON object, got list",)),
    ("row without responses_create_params", "no_params.jsonl", None, (), ("no_params.jsonl:2: missing `responses_create_params`",)),
    (
        "row names an agent that is not running",
        "unknown_agent.jsonl",
        None,
        (),
        ("unknown_agent.jsonl:2: unknown agent `nope_agent`", "counter_simple_agent, other_counter_agent"),
    ),
    (
        "+agent_name that is not running",
        "good.jsonl",
        None,
        (f"+agent_name={AGENT}x",),
        (f"`+agent_name={AGENT}x`", "counter_simple_agent, other_counter_agent", f"Did you mean `{AGENT}`?"),
    ),
    ("output is a folder", "good.jsonl", "a_folder", (), ("+output_jsonl_fpath=a_folder is a folder",)),
    ("output under a file", "good.jsonl", "a_file/rollouts.jsonl", (), ("a_file is a file, not a folder",)),
    ("output is the input", "good.jsonl", "good.jsonl", (), ("would overwrite the input file good.jsonl",)),
]


def snapshot(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


EARLIER_OUTPUT = "new/sub/rollouts.jsonl"


@pytest.fixture(scope="module")
def earlier_run(stack):
    """A good collection into a folder that did not exist (it is created); returns the files as they are after it.
    Every refused run targets the same output (unless the case is about the output path): nothing may change."""
    head_port, folder = stack
    result = collect(head_port, folder, "good.jsonl", EARLIER_OUTPUT)
    assert result.returncode == 0, result.stderr + result.stdout
    assert len((folder / EARLIER_OUTPUT).read_text().splitlines()) == 2
    return snapshot(folder)


@pytest.mark.parametrize("case", COLLECT_CASES, ids=[c[0] for c in COLLECT_CASES])
def test_bad_collect_input_is_refused_up_front_naming_file_line_or_key(case, stack, earlier_run):
    head_port, folder = stack
    _, input_name, output, extra, names = case
    result = collect(head_port, folder, input_name, output or EARLIER_OUTPUT, *extra)
    assert_one_line_error(result, "ng_collect_rollouts", 2, *names)
    assert snapshot(folder) == earlier_run, "a refused run changed or removed files"
