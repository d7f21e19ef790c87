"""The authoring workflow with real processes: the servers' own tests run by `ng_test` and `ng_test_all` in real
pytest subprocesses, the scaffold's tests, and the scaffold end to end as a real stack (`ng_run`, then
`ng_collect_rollouts`; the only fake is the LLM). The in-process side (scaffold contents, parameters, the example
data checks) is tests/unit/test_authoring.py, whose helpers build the servers under test here."""

import importlib.util
import json
import re
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from nemo_gym.authoring import server_tests as st
from nemo_gym.runtime.venvs import VenvResult
from tests.unit.test_authoring import init, make_server, ng, row


@pytest.fixture(autouse=True)
def _fast_pytest_subprocesses(monkeypatch):
    # The fixture servers' tests need no plugins; skipping plugin autoload makes each pytest run ~4x faster.
    monkeypatch.setenv("PYTEST_DISABLE_PLUGIN_AUTOLOAD", "1")


FAILING_TEST = "def test_broken():\n    assert 1 + 1 == 3, 'arithmetic is off'\n"


# ================================================================================================ scaffold


def test_scaffold_own_tests_pass(tmp_path):
    assert init(tmp_path, "+entrypoint=resources_servers/my_env") == 0
    server = tmp_path / "resources_servers" / "my_env"
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-rs"], cwd=server, capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    passed = int(re.search(r"(\d+) passed", proc.stdout).group(1))
    assert passed >= 10 and "failed" not in proc.stdout
    # The end-to-end test runs too, outside the nemo_gym checkout (ng_run starts in the project folder).
    assert "skipped" not in proc.stdout


def test_scaffold_passes_ng_test_with_data_validation(tmp_path, capsys):
    assert init(tmp_path, "+entrypoint=resources_servers/my_env") == 0
    capsys.readouterr()
    code = ng("test", tmp_path, "+entrypoint=resources_servers/my_env", "+should_validate_data=true")
    out = capsys.readouterr().out
    assert code == 0, out
    assert "tests passed" in out and "example data OK" in out and "MyEnvVerifyRequest" in out


def test_scaffold_runs_end_to_end_with_ng_run_and_ng_collect_rollouts(tmp_path):
    """The scaffold as a real stack (ng_run from the project folder) with the scaffold's own fake-LLM script, which
    knows nothing of the placeholder task (it calls each row's first tool) and still gets every reward."""
    from nemo_gym.testing.e2e import collect_examples_e2e

    assert init(tmp_path, "+entrypoint=resources_servers/my_env") == 0
    e2e_file = tmp_path / "resources_servers/my_env/tests/test_e2e.py"
    spec = importlib.util.spec_from_file_location("scaffold_e2e", e2e_file)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    rows = collect_examples_e2e("my_env", tmp_path, script=module.fake_llm_script(module.example_rows()),
                                project_dir=tmp_path)
    assert [r["reward"] for r in rows] == [1.0] * 5
    assert [r["extracted_answer"] for r in rows] == [r["expected_answer"] for r in rows] == [6, 8, 7, 8, 14]
    assert all(r["called_tool"] for r in rows)


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
