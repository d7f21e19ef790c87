"""`gym` as real processes: `gym env start` brings up a stack (openai_model in front of the scripted fake LLM, the
gated_counter resources server and two simple_agents of tests/fixtures/stack/configs/collect.yaml), `gym env
status`, `gym eval run --no-serve` collects against it, `gym eval reverify` re-scores it, `gym eval profile` profiles
the result; `gym eval run` end to end with asset selectors; plus `gym env resolve`, `gym env init`, `gym env
packages`, `gym --version --json`, a misspelled flag, bash completion and the legacy `ng_*` entry point, each as a
real process through the `gym` console entry point."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from nemo_gym.cli.commands import BY_NAME
from nemo_gym.cli.legacy import dispatch, script_name
from nemo_gym.testing.stack import ChildProcess, FakeLLMBackend
from tests.conftest import FIXTURE_STACK, REPO_ROOT, free_port

GYM = [sys.executable, "-c", "from nemo_gym.cli.main import main; main()"]
SCRIPT = FIXTURE_STACK / "scripts" / "collect.jsonl"
T, R = "_ng_task_index", "_ng_rollout_index"
TOOLS = [
    {
        "type": "function",
        "name": "increment_counter",
        "description": "add to the counter",
        "parameters": {"type": "object", "properties": {"count": {"type": "integer"}}, "required": ["count"]},
        "strict": False,
    }
]


def gym(*args: str, cwd: Path = FIXTURE_STACK, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([*GYM, *args], cwd=cwd, capture_output=True, text=True, timeout=timeout)


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def test_env_start_status_eval_run_and_profile_against_a_real_stack(tmp_path):
    tasks = tmp_path / "tasks.jsonl"
    rows = [
        {"responses_create_params": {"input": "please add 2", "tools": TOOLS}, "initial_count": 1, "expected_count": 3},
        {"responses_create_params": {"input": "please add 1", "tools": TOOLS}, "initial_count": 0, "expected_count": 5},
    ]
    tasks.write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = tmp_path / "out" / "rollouts.jsonl"
    head_port = free_port()
    head = f"+head_server.port={head_port}"
    with FakeLLMBackend("--script", str(SCRIPT)) as backend:
        stack = ChildProcess(
            [*GYM, "env", "start", "--config", "configs/collect.yaml", "--model-url", backend.base_url,
             "--model-api-key", "dummy-key", "-m", "fake-model", head],
            cwd=FIXTURE_STACK,
            name="gym env start",
        )
        try:
            stack.wait_for("All 4 / 4 servers ready!", timeout=180)

            status = gym("env", "status", head)
            assert status.returncode == 0, status.stdout + status.stderr
            for server in ("policy_model", "gated_counter_resources_server", "counter_simple_agent"):
                assert server in status.stdout

            as_json = gym("env", "status", "--json", head)
            if "json" in BY_NAME["status"].config_model.parameter_keys():
                assert as_json.returncode == 0, as_json.stderr
                names = json.dumps(json.loads(as_json.stdout))
                assert "counter_simple_agent" in names
            else:  # until ng_status has a `json` parameter: a clear refusal, not a wrong output
                assert as_json.returncode == 1 and "has no --json output" in as_json.stderr, as_json.stderr

            run = gym("eval", "run", "--no-serve", "-a", "counter_simple_agent", "-i", str(tasks), "-o", str(out),
                      "--num-repeats", "2", "--concurrency", "2", "--temperature", "0.5", head, cwd=tmp_path)
            assert run.returncode == 0, run.stdout + run.stderr

            reverified = tmp_path / "out" / "reverified.jsonl"
            reverify = gym("eval", "reverify", "--inputs", str(out.parent / "rollouts_materialized_inputs.jsonl"),
                           "--rollouts", str(out), "-o", str(reverified), "--concurrency", "2", head, cwd=tmp_path)
            assert reverify.returncode == 0, reverify.stdout + reverify.stderr
            assert "--inputs is not needed here" in reverify.stderr

            aggregate = gym("eval", "aggregate", "--input-glob", str(out), "-o", str(tmp_path / "agg" / "all.jsonl"),
                            head, cwd=tmp_path)
            assert aggregate.returncode == 0, aggregate.stdout + aggregate.stderr
            entries = json.loads((tmp_path / "agg" / "all_aggregate_metrics.json").read_text())
            assert entries[0]["agent_ref"] == {"name": "counter_simple_agent"}
            assert entries[0]["agent_metrics"]["mean/reward"] == 0.5
        finally:
            assert stack.stop(timeout=60) == 0, stack.output

    rollouts = read_jsonl(out)
    got = sorted((r[T], r[R], r["reward"], r["final_count"]) for r in rollouts)
    assert got == [(0, 0, 1.0, 3), (0, 1, 1.0, 3), (1, 0, 0.0, 1), (1, 1, 0.0, 1)]
    assert all(r["responses_create_params"]["temperature"] == 0.5 for r in rollouts)
    assert {r["agent_ref"]["name"] for r in rollouts} == {"counter_simple_agent"}

    again = read_jsonl(out.parent / "reverified.jsonl")
    assert sorted((r[T], r[R], r["_ng_previous_reward"]) for r in again) == [
        (t, k, reward) for t, k, reward, _ in got
    ]

    materialized = out.parent / "rollouts_materialized_inputs.jsonl"
    profile_dir = tmp_path / "profile"
    profile_dir.mkdir()
    profile = gym("eval", "profile", "--inputs", str(materialized), "--rollouts", str(out), cwd=profile_dir)
    assert profile.returncode == 0, profile.stdout + profile.stderr
    profiled = read_jsonl(out.parent / "rollouts_reward_profiling.jsonl")
    assert [(p[T], p["num_rollouts"], p["mean/reward"]) for p in profiled] == [(0, 2, 1.0), (1, 2, 0.0)]


def test_env_resolve_prints_the_merged_config_with_the_model_flags():
    result = gym("env", "resolve", "--config", "configs/collect.yaml", "-m", "my-model",
                 "--model-url", "http://127.0.0.1:9/v1", "--model-api-key", "sk-secret-value")
    assert result.returncode == 0, result.stderr
    assert "openai_model: my-model" in result.stdout
    assert "openai_base_url: http://127.0.0.1:9/v1" in result.stdout
    assert "counter_simple_agent:" in result.stdout
    assert "sk-secret-value" not in result.stdout  # masked, as ng_dump_config does


def test_misspelled_flag_fails_with_a_suggestion_and_runs_nothing(tmp_path):
    result = gym("eval", "run", "--no-serv", "-a", "x", "-o", str(tmp_path / "o.jsonl"), cwd=tmp_path)
    assert result.returncode == 2
    assert "unknown flag `--no-serv`" in result.stderr and "Did you mean `--no-serve`" in result.stderr
    assert "Traceback" not in result.stderr and not (tmp_path / "o.jsonl").exists()


def test_version_json_and_no_command(tmp_path):
    result = gym("--version", "--json", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    info = json.loads(result.stdout)
    assert info["nemo_gym"] and info["python"]
    bare = gym(cwd=tmp_path)
    assert bare.returncode == 1 and "Usage: gym" in bare.stderr


def test_legacy_dispatches_by_script_name(capsys):
    """`dispatch` in this process; `ng_version` starts one (it reads the platform: `uname -p`)."""
    assert script_name("/venv/bin/nemo_gym_collect_rollouts") == "collect_rollouts"
    assert dispatch("/venv/bin/ng_version", ["+json=true"]) == 0
    out, err = capsys.readouterr()
    assert "nemo_gym" in json.loads(out) and "deprecated" not in err
    assert dispatch("ng_no_such_thing", []) == 1
    assert "no such command" in capsys.readouterr().err


@pytest.mark.parametrize("script", ["ng_version", "nemo_gym_version"])
def test_legacy_entry_point_runs_the_command_of_its_script_name_without_deprecation_noise(script, tmp_path):
    code = f"import sys; sys.argv[0] = {script!r}; from nemo_gym.cli.legacy import main; main()"
    result = subprocess.run([sys.executable, "-c", code, "+json=true"], cwd=tmp_path, capture_output=True,
                            text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["nemo_gym"] and "deprecat" not in result.stderr.lower()


def test_eval_run_end_to_end_with_asset_selectors_from_the_install_root(tmp_path):
    """`gym eval run` without --no-serve: the E2E command, with configs chosen by --resources-server and
    --model-type. Run from the repository root: dataset paths in server configs are read relative to the working
    folder."""
    out = tmp_path / "run" / "rollouts.jsonl"
    with FakeLLMBackend("--tool-args", '{"city": "Oslo"}') as backend:
        result = gym("eval", "run", "--resources-server", "example_single_tool_call", "--model-type", "openai_model",
                     "--split", "example", "-o", str(out), "--num-repeats", "2", "--model-url", backend.base_url,
                     "--model-api-key", "x", "-m", "fake", f"+head_server.port={free_port()}", cwd=REPO_ROOT,
                     timeout=600)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    rows = read_jsonl(out)
    assert sorted((r[T], r[R]) for r in rows) == [(t, k) for t in range(5) for k in range(2)]
    assert all(r["reward"] == 1.0 for r in rows)
    assert {r["agent_ref"]["name"] for r in rows} == {"example_single_tool_call_simple_agent"}


def test_bash_completion_script_completes_groups_actions_and_flags(tmp_path):
    script = tmp_path / "complete.sh"
    script.write_text(
        f'gym() {{ {sys.executable} -c "from nemo_gym.cli.main import main; main()" "$@"; }}\n'
        'eval "$(gym --completion bash)"\n'
        "COMP_WORDS=(gym ev); COMP_CWORD=1; _gym_complete; echo \"${COMPREPLY[*]}\"\n"
        "COMP_WORDS=(gym env st); COMP_CWORD=2; _gym_complete; echo \"${COMPREPLY[*]}\"\n"
        "COMP_WORDS=(gym eval run --no); COMP_CWORD=3; _gym_complete; echo \"${COMPREPLY[*]}\"\n"
    )
    result = subprocess.run(["bash", str(script)], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == ["eval", "start status", "--no-serve"]


def test_env_init_scaffolds_a_server_and_env_packages_lists_this_python(tmp_path):
    init = gym("env", "init", "--resources-server", "my_counter", cwd=tmp_path)
    assert init.returncode == 0, init.stdout + init.stderr
    assert (tmp_path / "resources_servers" / "my_counter" / "app.py").is_file()

    packages = gym("env", "packages", "--json", cwd=tmp_path)
    assert packages.returncode == 0, packages.stderr
    names = {p["name"].lower().replace("_", "-") for p in json.loads(packages.stdout)}
    assert {"nemo-gym", "fastapi", "pydantic"} <= names
    missing = gym("env", "packages", "--resources-server", "my_counter", cwd=tmp_path)
    assert missing.returncode == 1 and "no built venv for resources_servers/my_counter" in missing.stderr


def test_list_search_validate_render_and_prepare_without_a_stack(tmp_path):
    """The offline actions, each a real `gym` process: they run the registered commands."""
    listed = gym("list", "benchmarks", "--json", cwd=tmp_path)
    assert listed.returncode == 0, listed.stderr
    names = {b["name"] for b in json.loads(listed.stdout)}
    assert {"arithmetic", "multiple_choice", "reasoning_gym_mini"} <= names

    found = gym("search", "arithm", cwd=tmp_path)
    assert found.returncode == 0 and "arithmetic" in found.stdout, found.stdout + found.stderr
    envs = gym("list", "environments", cwd=tmp_path)
    assert envs.returncode == 0 and "frozen_lake" in envs.stdout, envs.stdout + envs.stderr

    ok = gym("env", "validate", "--config", "configs/quickstart.yaml", cwd=REPO_ROOT)
    assert ok.returncode == 0 and "Config OK" in ok.stdout, ok.stdout + ok.stderr
    (tmp_path / "bad.yaml").write_text("agent:\n  responses_api_agents:\n    simple_agent:\n      entrypoint: app.py\n"
                                      "      resources_server: {type: resources_servers, name: nope}\n"
                                      "      model_server: {type: responses_api_models, name: policy_model}\n")
    bad = gym("env", "validate", "--config", str(tmp_path / "bad.yaml"), cwd=tmp_path)
    assert bad.returncode == 2 and "nope" in bad.stdout + bad.stderr

    (tmp_path / "q.jsonl").write_text(json.dumps({"question": "2 + 2"}) + "\n")
    (tmp_path / "p.yaml").write_text("user: 'Q: {question}'\n")
    render = gym("dataset", "render", "-i", "q.jsonl", "--prompt-config", "p.yaml", "-o", "r.jsonl", cwd=tmp_path)
    assert render.returncode == 0, render.stdout + render.stderr
    rendered = read_jsonl(tmp_path / "r.jsonl")[0]
    assert rendered["responses_create_params"]["input"] == [{"role": "user", "content": "Q: 2 + 2"}]

    prepared = gym("eval", "prepare", "--benchmark", "multiple_choice", cwd=tmp_path)
    assert prepared.returncode == 0, prepared.stdout + prepared.stderr
    data = REPO_ROOT / "benchmarks" / "multiple_choice" / "data" / "multiple_choice_benchmark.jsonl"
    assert data.exists() and len(read_jsonl(data)) >= 5
