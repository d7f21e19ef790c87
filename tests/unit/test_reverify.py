"""`ng_reverify`'s pure parts: which resources server scores a row, the input check (file:line), which servers a
run starts, and the diff of a re-verified file. The HTTP side runs for real in tests/integration/test_reverify.py."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from nemo_gym.errors import NeMoGymConfigError
from nemo_gym.rollouts.collection import InputValidationError
from nemo_gym.rollouts.jsonl import BadLinesRefused
from nemo_gym.workbench.reverify import (
    VerifierRouting,
    check_rollouts_file,
    reward_diff,
    servers_needed,
)

T, R, PREV = "_ng_task_index", "_ng_rollout_index", "_ng_previous_reward"


def stack_config(**extra_blocks) -> OmegaConf:
    def resources(**fields):
        return {"resources_servers": {"impl": {"entrypoint": "app.py", "domain": "other", **fields}}}

    def agent(resources_server: str):
        return {
            "responses_api_agents": {
                "simple_agent": {
                    "entrypoint": "app.py",
                    "resources_server": {"type": "resources_servers", "name": resources_server},
                    "model_server": {"type": "responses_api_models", "name": "policy"},
                }
            }
        }

    return OmegaConf.create(
        {
            "policy": {"responses_api_models": {"openai_model": {"entrypoint": "app.py"}}},
            "judge": {"responses_api_models": {"openai_model": {"entrypoint": "app.py"}}},
            "math": resources(judge_model_server={"type": "responses_api_models", "name": "judge"}),
            "code": resources(),
            "math_agent": agent("math"),
            "code_agent": agent("code"),
            **extra_blocks,
        }
    )


def rollout(task: int, rollout_index: int, reward=1.0, agent="math_agent", **extra) -> dict:
    row = {
        "responses_create_params": {"input": "q"},
        "response": {"output": []},
        "reward": reward,
        T: task,
        R: rollout_index,
        **extra,
    }
    if agent is not None:
        row["agent_ref"] = {"name": agent}
    return row


def write(path: Path, rows: list) -> Path:
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return path


def test_routing_by_agent_by_name_and_by_the_only_resources_server():
    cfg = stack_config()
    routing = VerifierRouting(cfg)
    assert routing.server_for(rollout(0, 0, agent="math_agent")) == "math"
    assert routing.server_for(rollout(0, 0, agent="code_agent")) == "code"
    assert VerifierRouting(cfg, resources_server_name="code").server_for(rollout(0, 0)) == "code"
    assert VerifierRouting(cfg, agent_name="code_agent").server_for(rollout(0, 0, agent=None)) == "code"
    with pytest.raises(Exception, match="pass \\+agent_name=<agent> or \\+resources_server_name"):
        routing.server_for(rollout(0, 0, agent=None))  # two resources servers: no guessing
    with pytest.raises(Exception, match="agent `mat_agent` is not in the stack.*Did you mean `math_agent`"):
        routing.server_for(rollout(0, 0, agent="mat_agent"))
    with pytest.raises(NeMoGymConfigError, match="Did you mean `math`"):
        VerifierRouting(cfg, resources_server_name="maths")

    only = OmegaConf.create({"math": stack_config()["math"], "judge": stack_config()["judge"]})
    assert VerifierRouting(only).server_for(rollout(0, 0, agent=None)) == "math"


def test_a_resources_server_only_config_routes_every_row_to_it():
    """v0.5's tutorials reverify with a config of the resources server alone: the rows' agents are not in it."""
    only = OmegaConf.create({"math": stack_config()["math"], "judge": stack_config()["judge"]})
    assert VerifierRouting(only).server_for(rollout(0, 0, agent="math_agent")) == "math"
    both = OmegaConf.create({"math": stack_config()["math"], "code": stack_config()["code"]})
    with pytest.raises(NeMoGymConfigError, match=r"no agent blocks.*2 resources servers \(math, code\).*"
                                                 r"\+resources_server_name=<one of them>"):
        VerifierRouting(both)
    assert VerifierRouting(both, resources_server_name="code").server_for(rollout(0, 0)) == "code"


def test_check_reports_every_bad_line_with_file_and_line(tmp_path):
    rows = [
        rollout(0, 0),
        "{not json",
        rollout(0, 1, response=None),
        rollout(1, 0, **{T: -1}),
        rollout(1, 1, reward="high"),
        rollout(0, 0),  # the same (task, rollout) as line 1
        rollout(2, 0, agent="nobody"),
    ]
    path = write(tmp_path / "r.jsonl", rows)
    with pytest.raises(InputValidationError) as info:
        check_rollouts_file(path, VerifierRouting(stack_config()))
    messages = [str(p) for p in info.value.problems]
    assert [m.split(": ", 1)[0] for m in messages] == [f"{path}:{n}" for n in (2, 3, 4, 5, 7)]
    assert "not valid JSON (unexpected character" in messages[0]
    assert "no saved `response` object" in messages[1]
    assert "`_ng_task_index` must be a non-negative integer, got -1" in messages[2]
    assert "`reward` must be a number or null" in messages[3]
    assert "agent `nobody` is not in the stack" in messages[4]
    assert str(info.value).startswith(f"{path}:2: not valid JSON")
    assert "1 of them are bad lines (not JSON objects), which --skip-bad-lines skips" in str(info.value)

    # Duplicates are found once every line is otherwise fine.
    path = write(tmp_path / "dup.jsonl", [rollout(0, 0), rollout(0, 1), rollout(0, 0, agent="code_agent")])
    same = r"dup.jsonl:3: the same `_ng_task_index`=0, `_ng_rollout_index`=0 as line 1"
    with pytest.raises(InputValidationError, match=same):
        check_rollouts_file(path, VerifierRouting(stack_config()))

    with pytest.raises(NeMoGymConfigError, match="has no rows"):
        check_rollouts_file(write(tmp_path / "empty.jsonl", []), VerifierRouting(stack_config()))


def test_bad_lines_alone_are_refused_or_skipped_with_the_flag(tmp_path):
    path = write(tmp_path / "r.jsonl", [rollout(0, 0), "{not json", rollout(0, 1), "[1]", "", rollout(1, 0)])
    with pytest.raises(BadLinesRefused) as info:
        check_rollouts_file(path, VerifierRouting(stack_config()))
    text = str(info.value)
    assert text.startswith(f"{path}:2: not valid JSON (")
    assert f"  {path}:4: a JSON list, not an object" in text
    assert "2 bad lines (lines that are not JSON objects): nothing was re-verified." in text
    assert "--skip-bad-lines" in text

    checked = check_rollouts_file(path, VerifierRouting(stack_config()), skip_bad_lines=True)
    assert list(checked.pairs()) == [(0, 0), (0, 1), (1, 0)]
    assert checked.bad_lines.count == 2 and checked.bad_lines.summary() == "skipped 2 bad lines"
    limited = check_rollouts_file(path, VerifierRouting(stack_config()), skip_bad_lines=True, limit=2)
    assert list(limited.pairs()) == [(0, 0), (0, 1)]  # bad lines do not count toward the limit

    only_bad = write(tmp_path / "bad.jsonl", ["{", "2"])
    with pytest.raises(NeMoGymConfigError, match=r"has no rows \(skipped 2 bad lines\)"):
        check_rollouts_file(only_bad, VerifierRouting(stack_config()), skip_bad_lines=True)


def test_check_collects_the_servers_and_honours_limit(tmp_path):
    path = write(tmp_path / "r.jsonl", [rollout(0, 0), rollout(1, 0, agent="code_agent"), rollout(2, 0), "{bad"])
    checked = check_rollouts_file(path, VerifierRouting(stack_config()), limit=3)  # line 4 is never used
    assert checked.num_rows == 3 and checked.servers == {"math", "code"}
    assert list(checked.pairs()) == [(0, 0), (1, 0), (2, 0)]


def test_servers_needed_follows_references_but_not_agents_or_the_policy():
    cfg = stack_config()
    assert servers_needed(cfg, {"math"}) == ["judge", "math"]  # the judge `math` refers to, in config order
    assert servers_needed(cfg, {"code"}) == ["code"]


def test_reward_diff_counts_changes_means_and_first_changed_rows(tmp_path):
    rows = [
        {T: 3, R: 1, PREV: 0.0, "reward": 1.0},
        {T: 0, R: 0, PREV: 1.0, "reward": 1.0},
        {T: 1, R: 0, PREV: 1.0, "reward": 0.0},
        {T: 2, R: 0, PREV: None, "reward": 0.5},  # had no reward: changed, left out of the mean before
        {T: 0, R: 1, PREV: 0.0, "reward": 1.0},
    ]
    path = write(tmp_path / "re.jsonl", rows)
    diff = reward_diff(path, show=3)
    assert (diff.rows, diff.changed) == (5, 4)
    assert diff.mean_before == pytest.approx(2.0 / 4) and diff.mean_after == pytest.approx(3.5 / 5)
    assert diff.first_changed == [(0, 1, 0.0, 1.0), (1, 0, 1.0, 0.0), (2, 0, None, 0.5)]
    assert reward_diff(path, show=0).first_changed == []
