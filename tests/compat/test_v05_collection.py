"""A collection over a resources server written the NeMo Gym v0.5 way (tests/fixtures/stack/resources_servers/
v05_judged: `call_judge`, `compute_pass_majority_metrics`, `highest_k_metrics`, `REVERIFY_MODE`), run on real
processes: `ng_run` with openai_model in front of the scripted fake LLM (the policy and the judge), simple_agent,
then `ng_collect_rollouts` and `ng reverify`.

What it pins down:
- a judge call that fails is never a zero reward: the rollout is rerun with `_ng_attempt_index`, and when the judge
  keeps failing it lands in `<stem>_failures.jsonl` as `judge_failed` (with the agent's answer), counted apart;
- after the run the agent's `/aggregate_metrics` (simple_agent proxies it to its resources server, whose hooks
  compute pass@k / majority@k) is written to `<stem>_aggregate_metrics.json` with v0.5's key names;
- `GET /reverify_mode` drives `ng reverify`: `stateless` re-scores, `unsupported` is refused unless `--force`.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from nemo_gym.testing.script import answer_rule
from nemo_gym.testing.stack import ChildProcess, FakeLLMBackend, NgRunStack, fake_llm_overrides
from tests.conftest import FIXTURE_STACK, free_port

COLLECT = [sys.executable, "-c", "from nemo_gym.cli import collect_rollouts; collect_rollouts()"]
NG = [sys.executable, "-m", "nemo_gym.cli"]
T, R = "_ng_task_index", "_ng_rollout_index"
JUDGED = "judged_resources_server.resources_servers.v05_judged"

# question -> (the policy's answer, the expected answer, what the judge does)
QUESTIONS = {
    "Q: Italy": ("Rome", "Rome", "yes"),
    "Q: Germany": ("Bonn", "Berlin", "no"),
    "Q: France": ("Paris", "Paris", "fails once"),
    "Q: Spain": ("Madrid", "Madrid", "always fails"),
}


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def question_of(row: dict) -> str:
    return row["responses_create_params"]["input"][0]["content"]


def script_rules() -> list[dict]:
    rules = []
    for question, (answer, expected, judge) in QUESTIONS.items():
        prompt = f"JUDGE: {answer} || {expected}"
        if judge == "fails once":  # a 400 from the backend: the model server does not retry it
            rules.append({"name": f"{question} judge once", "match": {"last_user_contains": prompt}, "times": 1,
                          "status": 400, "error_message": "judge backend hiccup"})
        if judge == "always fails":
            rules.append({"name": f"{question} judge", "match": {"last_user_contains": prompt}, "status": 400,
                          "error_message": "judge backend down"})
        else:
            rules.append(answer_rule(prompt, "YES" if answer == expected else "NO", name=f"{question} judge"))
        rules.append(answer_rule(question, answer, name=question))
    return rules


@pytest.fixture(scope="module")
def collected(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("v05")
    script = write_jsonl(tmp / "script.jsonl", script_rules())
    tasks = [
        {"responses_create_params": {"input": [{"role": "user", "content": q}]}, "expected_answer": expected}
        for q, (_, expected, _) in QUESTIONS.items()
    ]
    write_jsonl(tmp / "tasks.jsonl", tasks)
    head_port = free_port()
    with FakeLLMBackend("--script", str(script)) as backend:
        overrides = fake_llm_overrides(["configs/v05_judged.yaml"], backend.base_url, head_port)
        stack = NgRunStack(overrides, cwd=FIXTURE_STACK)
        try:
            stack.wait_for("All 3 / 3 servers ready!", timeout=180)
            collect = ChildProcess(
                [
                    *COLLECT,
                    f"+head_server.port={head_port}",
                    "+agent_name=judged_agent",
                    f"+input_jsonl_fpath={tmp / 'tasks.jsonl'}",
                    f"+output_jsonl_fpath={tmp / 'rollouts.jsonl'}",
                    "+num_repeats=2",
                    "+num_samples_in_parallel=1",  # so the France judge fails on the first rollout, not on both
                    "+progress_bar=false",
                ],
                cwd=tmp,
            )
            code = collect.wait(timeout=300)
            yield tmp, code, collect.output, head_port, backend.base_url
        finally:
            assert stack.stop(timeout=60) == 0, stack.tail()


def test_judge_failures_are_retried_then_recorded_apart_never_scored(collected):
    tmp, code, output, _, _ = collected
    assert code == 1, output  # two rollouts failed
    rows = read_jsonl(tmp / "rollouts.jsonl")
    assert sorted(question_of(r) for r in rows) == sorted(["Q: Italy", "Q: Germany", "Q: France"] * 2)
    for row in rows:
        answer, expected, _ = QUESTIONS[question_of(row)]
        assert row["reward"] == float(answer == expected), row
        assert "_ng_failure_class" not in row
        assert row["agent_ref"] == {"name": "judged_agent"}
    retried = [r for r in rows if r.get("_ng_attempt_index")]
    assert [(question_of(r), r["_ng_attempt_index"]) for r in retried] == [("Q: France", 1)]

    failures = read_jsonl(tmp / "rollouts_failures.jsonl")
    assert len(failures) == 2
    for record in failures:
        assert question_of(record["row"]) == "Q: Spain"
        assert record["_ng_failure_class"] == "judge_failed" and record["_ng_failure_terminal"] is False
        assert record["error_type"] == "judge_failed" and record["attempts"] == 3
        assert record["row"]["_ng_attempt_index"] == 2
        assert record["result"]["reward"] == 0.0
        assert "judge backend down" in record["result"]["_ng_failure_judge_error"]
        assert "judge backend down" in record["message"]
    assert "2 rollout(s) failed after retries (2 judge_failed)" in output


def test_aggregate_metrics_come_from_the_servers_hooks_with_v05_key_names(collected):
    tmp, _, output, _, _ = collected
    entries = json.loads((tmp / "rollouts_aggregate_metrics.json").read_text())
    assert [e["agent_ref"] for e in entries] == [{"name": "judged_agent"}]
    entry = entries[0]
    # Only the 6 successful rollouts count: Italy 1,1; Germany 0,0; France 1,1.
    assert entry["agent_metrics"]["mean/reward"] == pytest.approx(4 / 6)
    assert entry["agent_metrics"]["pass@1/accuracy"] == pytest.approx(200 / 3, abs=0.01)
    assert entry["key_metrics"]["pass@2/accuracy"] == pytest.approx(200 / 3, abs=0.01)
    assert entry["key_metrics"]["majority@2/accuracy"] == pytest.approx(200 / 3, abs=0.01)
    assert "pass@1/accuracy" not in entry["key_metrics"]  # only the highest k
    groups = entry["group_level_metrics"]
    assert len(groups) == 3 and all(g["num_rollouts"] == 2 for g in groups)
    assert "Aggregate metrics:" in output and "pass@2/accuracy" in output


def test_reverify_mode_decides_whether_ng_reverify_rescores(collected, tmp_path):
    tmp, _, _, head_port, _ = collected
    rollouts = tmp / "rollouts.jsonl"
    ok = ChildProcess(
        [*NG, "reverify", str(rollouts), "-o", str(tmp_path / "same.jsonl"), f"+head_server.port={head_port}",
         "--no-progress-bar"],
        cwd=tmp_path,
    )
    assert ok.wait(timeout=300) == 0, ok.output
    assert "Rewards changed in 0 of 6 rollouts." in ok.output
    assert "does not say whether its verify" not in ok.output  # stateless: no note
    assert json.loads((tmp_path / "same_aggregate_metrics.json").read_text())[0]["resources_server_ref"] == {
        "name": "judged_resources_server"
    }


def test_an_unsupported_reverify_mode_is_refused_unless_forced(collected, tmp_path):
    tmp, _, _, _, base_url = collected
    common = [
        "reverify", str(tmp / "rollouts.jsonl"), "+config_paths=[configs/v05_judged.yaml]", f"+{JUDGED}.reverify_unsupported=true",
        f"+policy_base_url={base_url}", "+policy_api_key=fake", "+policy_model_name=fake", "--no-progress-bar",
    ]
    refused = ChildProcess([*NG, *common, "-o", str(tmp_path / "refused.jsonl")], cwd=FIXTURE_STACK)
    assert refused.wait(timeout=300) != 0, refused.output
    assert "judged_resources_server" in refused.output and "unsupported" in refused.output
    assert "--force" in refused.output
    assert not (tmp_path / "refused.jsonl").exists() or read_jsonl(tmp_path / "refused.jsonl") == []

    forced = ChildProcess([*NG, *common, "-o", str(tmp_path / "forced.jsonl"), "--force"], cwd=FIXTURE_STACK)
    assert forced.wait(timeout=300) == 0, forced.output
    assert len(read_jsonl(tmp_path / "forced.jsonl")) == 6


# ------------------------------------------------------------------------------------------------------------
# v0.5's other `nemo_gym.rollout_collection` names, as its drivers, remote agents and scripts use them


def test_v05_rollout_collection_names_import():
    from nemo_gym.rollout_collection import (  # noqa: F401  (v0.5 remote agents and the gdpval driver)
        _DEFAULT_MAX_ROLLOUT_ATTEMPTS,
        AGENT_REF_KEY_NAME,
        NG_FAILURE_CLASS_KEY,
        NG_NO_PERSIST_KEY,
        NG_TERMINAL_KEY,
        RESPONSES_CREATE_PARAMS_KEY_NAME,
        ROLLOUT_INDEX_KEY_NAME,
        SKILLS_REF_KEY_NAME,
        TASK_INDEX_KEY_NAME,
        E2ERolloutCollectionConfig,
        RolloutAggregationConfig,
        RolloutAggregationHelper,
        RolloutCollectionConfig,
        RolloutCollectionHelper,
        SharedRolloutCollectionConfig,
        _failures_path_for,
        _get_max_rollout_attempts,
        loads_jsonl_line,
    )

    assert (NG_FAILURE_CLASS_KEY, NG_NO_PERSIST_KEY, NG_TERMINAL_KEY) == (
        "_ng_failure_class", "_ng_no_persist", "_ng_failure_terminal")
    assert (AGENT_REF_KEY_NAME, RESPONSES_CREATE_PARAMS_KEY_NAME, SKILLS_REF_KEY_NAME) == (
        "agent_ref", "responses_create_params", "skills_ref")
    assert _DEFAULT_MAX_ROLLOUT_ATTEMPTS == 3
    assert _failures_path_for(Path("out/rollouts.jsonl")) == Path("out/rollouts_failures.jsonl")


def test_max_rollout_attempts_reads_the_environment(monkeypatch):
    from nemo_gym.rollout_collection import _get_max_rollout_attempts

    monkeypatch.setenv("NEMO_GYM_MAX_ROLLOUT_ATTEMPTS", "5")
    assert _get_max_rollout_attempts() == 5
    monkeypatch.setenv("NEMO_GYM_MAX_ROLLOUT_ATTEMPTS", "zero")
    assert _get_max_rollout_attempts() == 3


def test_a_driver_config_subclasses_the_shared_collection_config():
    """v0.5's gdpval driver subclasses SharedRolloutCollectionConfig for its own run config."""
    from pydantic import ValidationError

    from nemo_gym.rollout_collection import RolloutCollectionConfig, SharedRolloutCollectionConfig

    class MultiStageRunConfig(SharedRolloutCollectionConfig):
        stages: int = 1

    config = MultiStageRunConfig(output_jsonl_fpath="out.jsonl", num_samples_in_parallel=4, stages=2)
    assert (config.output_jsonl_fpath, config.num_samples_in_parallel, config.stages) == ("out.jsonl", 4, 2)
    assert config.responses_create_params == {} and config.disable_aggregation is False
    assert config.upload_rollouts_to_wandb is True
    ours = RolloutCollectionConfig.model_fields
    for name in ("num_samples_in_parallel", "responses_create_params", "disable_aggregation"):
        assert MultiStageRunConfig.model_fields[name].description == ours[name].description
    with pytest.raises(ValidationError, match="output_jsonl_fpath"):
        MultiStageRunConfig()


def test_loads_jsonl_line_names_the_file_and_line(tmp_path):
    from nemo_gym.config_types import ConfigError
    from nemo_gym.rollout_collection import loads_jsonl_line

    assert loads_jsonl_line('{"a": 1}', tmp_path / "in.jsonl", 1) == {"a": 1}
    assert loads_jsonl_line(b"[1, 2]", "in.jsonl", 2) == [1, 2]
    with pytest.raises(ConfigError, match=r"Malformed JSON in '.*in\.jsonl' at line 7"):
        loads_jsonl_line('{"a": ', tmp_path / "in.jsonl", 7)


def test_the_cli_entry_points_are_still_reachable_with_a_deprecation_warning():
    import nemo_gym.cli
    import nemo_gym.rollout_collection as rollout_collection

    with pytest.warns(DeprecationWarning, match="ng_collect_rollouts"):
        assert rollout_collection.collect_rollouts is nemo_gym.cli.collect_rollouts
    with pytest.warns(DeprecationWarning, match="ng_aggregate_rollouts"):
        assert rollout_collection.aggregate_rollouts is nemo_gym.cli.aggregate_rollouts
    with pytest.raises(AttributeError):
        rollout_collection.no_such_name  # noqa: B018


def test_the_aggregation_helper_aggregates_shards_from_python(collected, tmp_path):
    """`await RolloutAggregationHelper().run_from_config(config)` over the collection's rollouts file, split in two
    shards, against the running stack: the same metrics as the collector wrote, and the merged file."""
    import asyncio

    from nemo_gym.http.client import ServerClient
    from nemo_gym.rollout_collection import RolloutAggregationConfig, RolloutAggregationHelper

    tmp, _, _, head_port, _ = collected
    rollouts = read_jsonl(tmp / "rollouts.jsonl")
    write_jsonl(tmp_path / "shard-a.jsonl", rollouts[:3])
    write_jsonl(tmp_path / "shard-b.jsonl", rollouts[3:])
    config = RolloutAggregationConfig(input_glob=str(tmp_path / "shard-*.jsonl"),
                                      output_jsonl_fpath=str(tmp_path / "all.jsonl"))
    client = ServerClient.load_from_global_config({"host": "127.0.0.1", "port": head_port})

    metrics_path = asyncio.run(RolloutAggregationHelper(server_client=client).run_from_config(config))

    assert metrics_path == tmp_path / "all_aggregate_metrics.json"
    ours = json.loads(metrics_path.read_text())
    collectors = json.loads((tmp / "rollouts_aggregate_metrics.json").read_text())
    assert [e["agent_ref"] for e in ours] == [{"name": "judged_agent"}]
    assert ours[0]["key_metrics"] == collectors[0]["key_metrics"]
    assert len(read_jsonl(tmp_path / "all.jsonl")) == len(rollouts) == 6
