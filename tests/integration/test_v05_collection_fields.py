"""NeMo Gym v0.5's collection fields and policy on real processes: `ng_run` (openai_model in front of the scripted
fake LLM, the v0.5-style judged verifier of tests/fixtures/stack, a simple_agent), `ng_collect_rollouts`,
`ng_aggregate_rollouts` and `ng reverify` as child processes.

What it pins down:
- `num_repeats` as a mapping per agent, and a clear refusal when an agent has no entry;
- the resume policy: declared failures are attempts, counted from the failures sidecar across runs (appended, never
  rewritten); re-dispatched rows carry `_ng_attempt_index`; a rollout that failed `NEMO_GYM_MAX_ROLLOUT_ATTEMPTS`
  times is not run again and is reported;
- `ng_aggregate_rollouts` over shards gives the metrics the collector wrote for the whole run;
- `ng reverify` keeps the v0.5 fields of the rows it re-scores;
- `nemo_gym_log_dir` gets one log per server; `model_endpoint_readiness_timeout_seconds` stops a stack whose model
  endpoint never answers, naming the url and its key (and 0 skips the wait).
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
AGGREGATE = [sys.executable, "-c", "import sys; from nemo_gym.cli.commands.aggregate_rollouts import COMMAND; "
             "sys.exit(COMMAND.main(sys.argv[1:]))"]
NG = [sys.executable, "-m", "nemo_gym.cli"]
T, R, A = "_ng_task_index", "_ng_rollout_index", "_ng_attempt_index"
MAX_ENV = "NEMO_GYM_MAX_ROLLOUT_ATTEMPTS"

# question -> (the policy's answer, the expected answer, whether the judge call fails every time)
QUESTIONS = {
    "Q: Italy": ("Rome", "Rome", False),
    "Q: Germany": ("Bonn", "Berlin", False),
    "Q: Spain": ("Madrid", "Madrid", True),
}


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def question_of(row: dict) -> str:
    return row["responses_create_params"]["input"][0]["content"]


def script_rules() -> list[dict]:
    rules = []
    for question, (answer, expected, judge_fails) in QUESTIONS.items():
        prompt = f"JUDGE: {answer} || {expected}"
        if judge_fails:
            rules.append({"name": f"{question} judge", "match": {"last_user_contains": prompt}, "status": 400,
                          "error_message": "judge backend down"})
        else:
            rules.append(answer_rule(prompt, "YES" if answer == expected else "NO", name=f"{question} judge"))
        rules.append(answer_rule(question, answer, name=question))
    return rules


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("v05fields")
    script = write_jsonl(tmp / "script.jsonl", script_rules())
    write_jsonl(tmp / "tasks.jsonl", [
        {"responses_create_params": {"input": [{"role": "user", "content": q}]}, "expected_answer": expected}
        for q, (_, expected, _) in QUESTIONS.items()
    ])
    head_port = free_port()
    with FakeLLMBackend("--script", str(script)) as backend:
        overrides = fake_llm_overrides(["configs/v05_judged.yaml"], backend.base_url, head_port)
        ng_run = NgRunStack([*overrides, f"+nemo_gym_log_dir={tmp / 'logs'}"], cwd=FIXTURE_STACK)
        try:
            ng_run.wait_for("All 3 / 3 servers ready!", timeout=180)
            yield tmp, head_port, backend.base_url
        finally:
            assert ng_run.stop(timeout=60) == 0, ng_run.tail()


def collect(tmp: Path, head_port: int, *extra: str, attempts: int, output: str = "rollouts.jsonl") -> ChildProcess:
    process = ChildProcess(
        [*COLLECT, f"+head_server.port={head_port}", "+agent_name=judged_agent",
         f"+input_jsonl_fpath={tmp / 'tasks.jsonl'}", f"+output_jsonl_fpath={tmp / output}",
         "+num_samples_in_parallel=2", "+progress_bar=false", *extra],
        cwd=tmp, env={MAX_ENV: str(attempts)},
    )
    process.wait(timeout=300)
    return process


def test_each_server_logs_to_nemo_gym_log_dir(stack):
    tmp, _, _ = stack
    logs = tmp / "logs"
    for server in ("policy_model", "judged_resources_server", "judged_agent"):
        text = (logs / f"{server}.log").read_text()
        assert text.strip(), f"{server}.log is empty"


def test_per_agent_repeats_and_the_resume_policy_across_runs(stack):
    tmp, head_port, _ = stack
    first = collect(tmp, head_port, "+num_repeats={judged_agent:2}", attempts=1)
    assert first.proc.returncode == 1, first.output
    rows = read_jsonl(tmp / "rollouts.jsonl")
    assert sorted(question_of(r) for r in rows) == sorted(["Q: Italy", "Q: Germany"] * 2)
    failures = read_jsonl(tmp / "rollouts_failures.jsonl")
    assert sorted((question_of(f["row"]), f[R]) for f in failures) == [("Q: Spain", 0), ("Q: Spain", 1)]
    assert all(f["_ng_failure_class"] == "judge_failed" and A not in f["row"] for f in failures)

    # A bigger budget: each Spain rollout is sent once more, as attempt 1; its new record is appended.
    second = collect(tmp, head_port, "+num_repeats={judged_agent:2}", "+resume_from_cache=true", attempts=2)
    assert second.proc.returncode == 1, second.output
    after = read_jsonl(tmp / "rollouts_failures.jsonl")
    assert after[:2] == failures
    assert sorted((f[R], f[A], f["row"][A], f["result"][A]) for f in after[2:]) == [(0, 1, 1, 1), (1, 1, 1, 1)]
    assert len(read_jsonl(tmp / "rollouts.jsonl")) == 4  # nothing that succeeded ran again

    # The budget is spent: nothing runs, and the run says why.
    third = collect(tmp, head_port, "+resume_from_cache=true", attempts=2)
    assert third.proc.returncode == 1, third.output
    assert "Not run again: 0 rollout(s) whose failure is terminal" in third.output
    assert "2 that already failed 2 time(s)" in third.output
    assert read_jsonl(tmp / "rollouts_failures.jsonl") == after


def test_an_agent_missing_from_num_repeats_is_refused_by_name(stack):
    tmp, head_port, _ = stack
    refused = collect(tmp, head_port, "+num_repeats={other_agent:2}", attempts=1, output="refused.jsonl")
    assert refused.proc.returncode == 2, refused.output
    assert "agent `judged_agent` has no entry in +num_repeats" in refused.output
    assert "`other_agent`" in refused.output and "not an agent of the running stack" in refused.output
    assert not (tmp / "refused.jsonl").exists()


def test_aggregate_rollouts_over_shards_matches_the_collectors_metrics(stack, tmp_path):
    tmp, head_port, _ = stack
    collected = collect(tmp, head_port, "+num_repeats=2", attempts=1, output="whole.jsonl")
    assert collected.proc.returncode == 1, collected.output  # Spain's judge fails
    rows = read_jsonl(tmp / "whole.jsonl")
    write_jsonl(tmp_path / "shards" / "s1.jsonl", rows[::2])
    write_jsonl(tmp_path / "shards" / "s2.jsonl", rows[1::2])
    write_jsonl(tmp_path / "shards" / "s1_failures.jsonl", [{"_ng_failure_class": "judge_failed", T: 9, R: 0}])

    aggregate = ChildProcess(
        [*AGGREGATE, f"+head_server.port={head_port}", f"+input_glob={tmp_path / 'shards'}/*.jsonl",
         f"+output_jsonl_fpath={tmp_path / 'all.jsonl'}"],
        cwd=tmp_path,
    )
    assert aggregate.wait(timeout=300) == 0, aggregate.output
    merged = read_jsonl(tmp_path / "all.jsonl")
    assert [(r[T], r[R]) for r in merged] == sorted((r[T], r[R]) for r in rows)
    ours = json.loads((tmp_path / "all_aggregate_metrics.json").read_text())
    theirs = json.loads((tmp / "whole_aggregate_metrics.json").read_text())
    assert [e["agent_ref"] for e in ours] == [{"name": "judged_agent"}]
    assert ours[0]["agent_metrics"] == theirs[0]["agent_metrics"]
    assert ours[0]["key_metrics"] == theirs[0]["key_metrics"]
    assert "Skipped 1 companion file(s)" in aggregate.output

    # A shard torn mid-line (its writer died): refused by default, naming the line, with nothing merged; with
    # --skip-bad-lines, the line is named on stderr and the rest aggregates as before.
    before = (tmp_path / "all.jsonl").read_bytes()
    shard = tmp_path / "shards" / "s2.jsonl"
    with open(shard, "a") as f:
        f.write('{"_ng_task_index": 7, "_ng_rollout_index": 0, "rew')
    torn_line = len(shard.read_text().splitlines())
    common = [*AGGREGATE, f"+head_server.port={head_port}", f"+input_glob={tmp_path / 'shards'}/*.jsonl",
              f"+output_jsonl_fpath={tmp_path / 'all.jsonl'}"]
    refused = ChildProcess(common, cwd=tmp_path)
    assert refused.wait(timeout=300) == 2, refused.output
    assert f"{shard}:{torn_line}: not valid JSON" in refused.output
    assert "nothing was merged or aggregated" in refused.output and "--skip-bad-lines" in refused.output
    assert (tmp_path / "all.jsonl").read_bytes() == before
    skipped = ChildProcess([*common, "--skip-bad-lines"], cwd=tmp_path)
    assert skipped.wait(timeout=300) == 0, skipped.output
    assert f"{shard}:{torn_line}" in skipped.output and "skipped 1 bad line" in skipped.output
    assert [(r[T], r[R]) for r in read_jsonl(tmp_path / "all.jsonl")] == [(r[T], r[R]) for r in merged]

    missing = ChildProcess([*AGGREGATE, f"+head_server.port={head_port}", f"+input_glob={tmp_path}/nope*.jsonl",
                            f"+output_jsonl_fpath={tmp_path / 'x.jsonl'}"], cwd=tmp_path)
    assert missing.wait(timeout=120) == 2, missing.output
    assert "matches no rollout file" in missing.output


def test_reverify_keeps_the_v05_fields(stack, tmp_path):
    tmp, head_port, _ = stack
    collected = collect(tmp, head_port, attempts=1, output="for_reverify.jsonl")
    assert collected.proc.returncode == 1, collected.output
    rows = read_jsonl(tmp / "for_reverify.jsonl")
    skills = {"path": "skills", "hash": "0123456789ab", "skills": [{"name": "geo"}]}
    v05_rows = [{**r, A: 1, "skills_ref": skills} for r in rows]
    write_jsonl(tmp_path / "v05.jsonl", v05_rows)
    reverify = ChildProcess([*NG, "reverify", str(tmp_path / "v05.jsonl"), "-o", str(tmp_path / "re.jsonl"),
                             f"+head_server.port={head_port}", "--no-progress-bar"], cwd=tmp_path)
    assert reverify.wait(timeout=300) == 0, reverify.output
    out = read_jsonl(tmp_path / "re.jsonl")
    assert len(out) == len(rows)
    for row in out:
        assert row[A] == 1 and row["skills_ref"] == skills and row["agent_ref"] == {"name": "judged_agent"}


def test_a_model_endpoint_that_never_answers_stops_the_stack_naming_it(tmp_path):
    dead = f"http://127.0.0.1:{free_port()}/v1"
    common = [*fake_llm_overrides(["configs/v05_judged.yaml"], dead, free_port()), "+verbose=true"]
    stopped = NgRunStack([*common, "+model_endpoint_readiness_timeout_seconds=2"], cwd=FIXTURE_STACK)
    assert stopped.wait(timeout=240) != 0, stopped.tail()
    assert dead in stopped.output
    assert "policy_model.responses_api_models.openai_model.openai_base_url" in stopped.output
    assert "model_endpoint_readiness_timeout_seconds" in stopped.output

    skipped = NgRunStack([*fake_llm_overrides(["configs/v05_judged.yaml"], dead, free_port()),
                          "+model_endpoint_readiness_timeout_seconds=0"], cwd=FIXTURE_STACK)
    try:
        skipped.wait_for("All 3 / 3 servers ready!", timeout=180)
    finally:
        assert skipped.stop(timeout=60) == 0, skipped.tail()
