"""Typos one level down, as a user meets them: real `ng_run`, `ng_validate` and `ng_collect_rollouts` processes
refuse a misspelled key inside a server block (config file or command line) or a framework section, exit 2, say it
once with a did-you-mean, and start nothing; `++` still adds any key."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import FIXTURE_STACK, free_port

TYPO_BLOCK = """\
counter_resources_server:
  resources_servers:
    counter_resources:
      num_worker: 1
      my_own_setting: kept
"""


def ng(script: str, *args: str, cwd: Path = FIXTURE_STACK) -> subprocess.CompletedProcess:
    """`ng_<script>` as its console script runs it, in a child process (bounded wait)."""
    code = f"from nemo_gym.cli import {script}; {script}()"
    return subprocess.run([sys.executable, "-c", code, *args], cwd=cwd, capture_output=True, text=True, timeout=180)


def stack_args(head_port: int, *more: str, typo_file: Path | None = None) -> list[str]:
    paths = "configs/stack.yaml" + (f",{typo_file}" if typo_file else "")
    return [f"+config_paths=[{paths}]", "+policy_base_url=http://127.0.0.1:9", "+policy_api_key=k",
            "+policy_model_name=m", f"+head_server.port={head_port}", *more]


@pytest.fixture
def typo_file(tmp_path) -> Path:
    """An override file for configs/stack.yaml with a misspelled field (and a free extra key)."""
    path = tmp_path / "typo.yaml"
    path.write_text(TYPO_BLOCK)
    return path


@pytest.fixture
def typo_stack(tmp_path) -> Path:
    """The whole fixture stack in one file, with the misspelled field written in the block itself."""
    text = (FIXTURE_STACK / "configs" / "stack.yaml").read_text()
    anchor = "      domain: agent\n"
    assert anchor in text
    path = tmp_path / "typo_stack.yaml"
    path.write_text(text.replace(anchor, anchor + "      num_worker: 1\n      my_own_setting: kept\n", 1))
    return path


def assert_started_nothing(result: subprocess.CompletedProcess) -> None:
    output = result.stdout + result.stderr
    for sign in ("shared venv", "servers ready", "Dry run", "Traceback"):
        assert sign not in output, output


def test_ng_run_refuses_a_typo_in_a_server_block_of_a_config_file_once_before_starting(typo_stack):
    args = stack_args(free_port())
    args[0] = f"+config_paths=[{typo_stack}]"
    result = ng("run", *args)
    assert result.returncode == 2, result.stdout + result.stderr
    first = result.stderr.splitlines()[0]
    assert first == (
        f"error: ng_run: unknown key `counter_resources_server.resources_servers.counter_resources.num_worker` in "
        f"{typo_stack}: not a key of server `counter_resources_server` (BaseResourcesServerConfig, nemo_gym). "
        "Did you mean `num_workers`? If the server really reads a key of that name, declare it as a field of its "
        "config class."
    ), first
    assert (result.stdout + result.stderr).count("num_worker`") == 1  # once: not once per server process
    assert "my_own_setting" not in result.stderr  # an extra key nothing resembles is kept
    assert_started_nothing(result)


def test_ng_run_refuses_nested_command_line_typos_once(typo_file):
    head_port = free_port()
    result = ng("run", *stack_args(head_port)[:-1], f"+head_server.prot={head_port}",
                "+counter_agent.responses_api_agents.loop_agent.max_step=3")
    assert result.returncode == 2, result.stdout + result.stderr
    err = result.stderr
    assert err.startswith("error: ng_run: unknown keys (likely typos):\n")
    assert "  - `+head_server.prot` (command line): not a key of `head_server` (keys: host, port). Did you mean " \
           "`+head_server.port`?\n" in err
    assert "  - `+counter_agent.responses_api_agents.loop_agent.max_step` (command line): not a key of server " \
           "`counter_agent` (LoopAgentConfig, " in err
    assert "Did you mean `+counter_agent.responses_api_agents.loop_agent.max_steps`?\n" in err
    assert "write it with ++ (e.g. `++head_server.prot=...`)" in err
    assert err.count("+head_server.prot`") == 1 and err.count("loop_agent.max_step`") == 1
    assert_started_nothing(result)


def test_ng_run_accepts_the_same_keys_with_plus_plus():
    result = ng("run", *stack_args(free_port()), "+dry_run=true",
                "++counter_resources_server.resources_servers.counter_resources.num_worker=1",
                "++counter_agent.responses_api_agents.loop_agent.max_step=3")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "Dry run: environments for 3 server(s) are ready; nothing started." in result.stdout


def test_ng_validate_lists_every_nested_typo_once(typo_file):
    result = ng("validate", *stack_args(free_port(), "+restart_policy.max_restart=2", typo_file=typo_file))
    assert result.returncode == 2, result.stdout + result.stderr
    err = result.stderr
    assert err.startswith("error: ng_validate: 2 problems in the config:\n")
    assert f"`counter_resources_server.resources_servers.counter_resources.num_worker` in {typo_file}" in err
    assert "Did you mean `num_workers`?" in err
    assert "`+restart_policy.max_restart` (command line): not a key of `restart_policy`" in err
    assert "Did you mean `+restart_policy.max_restarts`?" in err
    assert err.count("num_worker`") == 1 and err.count("max_restart`") == 1
    assert "Config OK" not in result.stdout


def test_ng_collect_rollouts_refuses_a_typo_before_looking_for_a_stack(tmp_path, typo_file):
    (tmp_path / "in.jsonl").write_text('{"responses_create_params": {"input": "hi"}}\n')
    result = ng("collect_rollouts", *stack_args(free_port(), typo_file=typo_file), "+agent_name=counter_agent",
                f"+input_jsonl_fpath={tmp_path / 'in.jsonl'}", f"+output_jsonl_fpath={tmp_path / 'out.jsonl'}")
    # Exit 2 (a config mistake), not 1 (no head server on that port): the check ran first.
    assert result.returncode == 2, result.stdout + result.stderr
    # (after the warning that typo.yaml redefines a block of stack.yaml, which the command prints first)
    assert f"error: ng_collect_rollouts: unknown key `counter_resources_server.resources_servers.counter_resources." \
           f"num_worker` in {typo_file}: " in result.stderr
    assert "Did you mean `num_workers`?" in result.stderr
    assert result.stderr.count("num_worker`") == 1
    assert not (tmp_path / "out.jsonl").exists()
