"""`ng_reverify` against real processes. Rollouts are collected once (`ng_run` with openai_model in front of the
scripted fake LLM, simple_agent, and the answer checker of tests/fixtures/stack/resources_servers/answer_check,
which grades case-sensitively), then re-verified:

- with the checker's config changed (case-insensitive, empty answers refused) and "+config_paths=[...]", so
  `ng reverify` starts the resources server itself (and nothing else: no policy model settings are given): the
  rewards change, the diff says so, the refused rows are failures as data, and a resumed run keeps the rows
  already in the output, drops a torn line and re-verifies the rest;
- against the running collection stack (`+head_server.port`): the unchanged verifier gives the same rewards, every
  row is seeded on its own session (the checker grades against the seeded answer), and a bad input line is
  refused up front with its file:line.
"""

from __future__ import annotations

import json
import sys

import pytest

from nemo_gym.testing.stack import ChildProcess
from tests.conftest import FIXTURE_STACK
from tests.integration.answer_stack import collected_answers, read_jsonl

REVERIFY = [sys.executable, "-c", "from nemo_gym.cli import reverify; reverify()"]
NG = [sys.executable, "-m", "nemo_gym.cli"]
T, R, PREV = "_ng_task_index", "_ng_rollout_index", "_ng_previous_reward"
CHECKER = "answer_resources_server.resources_servers.answer_check"

# question -> (the fake model's answer, the expected answer)
QUESTIONS = {
    "capital of Italy": ("Rome", "Rome"),  # right either way
    "capital of France": ("PARIS", "Paris"),  # right only when case is ignored
    "capital of Spain": ("madrid", "Madrid"),  # right only when case is ignored
    "say nothing": ("", "anything"),  # empty: reward 0, or refused with refuse_empty
    "capital of Germany": ("Bonn", "Berlin"),  # wrong either way
}


def question_of(row: dict) -> str:
    return row["responses_create_params"]["input"][0]["content"]


@pytest.fixture(scope="module")
def collected(tmp_path_factory):
    """Rollouts collected with the strict checker; yields (rollouts path, head port of the still running stack)."""
    with collected_answers(tmp_path_factory.mktemp("reverify"), QUESTIONS) as found:
        yield found


def test_collected_rewards_are_case_sensitive(collected):
    rollouts = read_jsonl(collected[0])
    assert len(rollouts) == 10
    for row in rollouts:
        answer, expected = QUESTIONS[question_of(row)]
        assert row["reward"] == float(answer == expected), row
        assert row["graded_ignoring_case"] is False


def test_changed_verifier_started_from_config_paths_diff_failures_and_resume(collected, tmp_path):
    rollouts_path, _ = collected
    source = read_jsonl(rollouts_path)
    out = tmp_path / "re" / "reverified.jsonl"
    failures = tmp_path / "re" / "reverified_failures.jsonl"
    changed_config = [
        "+config_paths=[configs/reverify.yaml]",
        f"+{CHECKER}.ignore_case=true",
        "--num-samples-in-parallel",
        "3",
        "--no-progress-bar",
        "+retry_backoff_s=0.01",
    ]
    first = ChildProcess(
        [*NG, "reverify", str(rollouts_path), "-o", str(out), *changed_config, f"+{CHECKER}.refuse_empty=true"],
        cwd=FIXTURE_STACK,
    )
    assert first.wait(timeout=300) == 1, first.output  # the refused rows failed
    assert "Started answer_resources_server for the re-verification" in first.output
    assert "policy_model" not in first.output  # no model server was started: no model calls possible

    rows = read_jsonl(out)
    assert len(rows) == 8
    by_key = {(r[T], r[R]): r for r in source}
    for row in rows:
        answer, expected = QUESTIONS[question_of(row)]
        old = by_key[(row[T], row[R])]
        assert row[PREV] == old["reward"] == float(answer == expected)
        assert row["reward"] == float(answer.lower() == expected.lower())
        assert row["graded_ignoring_case"] is True and row["extracted_answer"] == answer
        for name in ("response", "responses_create_params", "agent_ref", "expected_answer"):
            assert row[name] == old[name], name  # the saved rollout is kept as it was
    assert sorted(question_of(r) for r in rows if r["reward"] != r[PREV]) == ["capital of France"] * 2 + [
        "capital of Spain"
    ] * 2

    failed = read_jsonl(failures)
    assert len(failed) == 2
    for record in failed:
        assert question_of(record["row"]) == "say nothing"
        assert record["error_type"] == "HTTPError" and record["status_code"] == 400
        assert record["server"] == "answer_resources_server"
        assert "refusing to grade an empty answer" in record["message"]

    # The diff: 4 of 8 changed (France and Spain, 0 -> 1); mean over the same 8 rows 2/8 before, 6/8 after.
    assert "Rewards changed in 4 of 8 rollouts." in first.output
    assert "Mean reward: 0.2500 before, 0.7500 after (+0.5000)." in first.output
    france_task = next(r[T] for r in rows if question_of(r) == "capital of France")
    assert f"task {france_task}, rollout 0: 0.0000 -> 1.0000" in first.output
    assert f"task {france_task}, rollout 1: 0.0000 -> 1.0000" in first.output
    assert "2 rollout(s) could not be re-verified (2 HTTPError)" in first.output
    assert "10 rollouts: 8 ok, 0 incomplete, 2 failed (HTTPError)." in first.output  # the collector's words

    # Resume with empty answers graded again: keep 5 rows (marked), drop 3, leave a torn line.
    kept, dropped = rows[:5], rows[5:]
    for row in kept:
        row["kept_from_first_run"] = True
    out.write_text("".join(json.dumps(r) + "\n" for r in kept) + json.dumps(dropped[0])[:40])
    second = ChildProcess([*NG, "reverify", str(rollouts_path), "-o", str(out), *changed_config], cwd=FIXTURE_STACK)
    assert second.wait(timeout=300) == 0, second.output
    assert "Removed a torn last line" in second.output
    assert "Re-verified 10 / 10 rollouts" in second.output and "5 from an earlier run, 5 new" in second.output
    assert "5 new rollouts: 5 ok, 0 incomplete, 0 failed." in second.output
    final = read_jsonl(out)
    assert sorted((r[T], r[R]) for r in final) == sorted(by_key)  # every row once, none twice
    assert sum(1 for r in final if r.get("kept_from_first_run")) == 5
    for row in final:
        answer, expected = QUESTIONS[question_of(row)]
        assert row["reward"] == float(answer.lower() == expected.lower())
    assert not failures.exists()  # nothing failed this time
    assert "Rewards changed in 4 of 10 rollouts." in second.output
    assert "Mean reward: 0.2000 before, 0.6000 after (+0.4000)." in second.output

    # Run again: everything is in the output already, so no server is started and nothing is sent.
    third = ChildProcess([*NG, "reverify", str(rollouts_path), "-o", str(out), *changed_config], cwd=FIXTURE_STACK)
    assert third.wait(timeout=300) == 0, third.output
    assert "Re-verified 10 / 10 rollouts" in third.output and "10 from an earlier run, 0 new" in third.output
    assert "Started" not in third.output and "Rewards changed in 4 of 10 rollouts." in third.output
    assert " ok, " not in third.output  # nothing re-verified in this run: no outcome line
    assert read_jsonl(out) == final


def test_running_stack_unchanged_verifier_sessions_and_bad_input(collected, tmp_path):
    rollouts_path, head_port = collected
    source = read_jsonl(rollouts_path)
    out = tmp_path / "same.jsonl"
    base = [*REVERIFY, f"+head_server.port={head_port}", f"+input_jsonl_fpath={rollouts_path}", "+progress_bar=false"]

    same = ChildProcess([*base, f"+output_jsonl_fpath={out}", "+num_samples_in_parallel=10"], cwd=tmp_path)
    assert same.wait(timeout=300) == 0, same.output
    rows = read_jsonl(out)
    assert len(rows) == 10
    assert all(r["reward"] == r[PREV] for r in rows)  # each row graded against its own seeded answer
    assert "Rewards changed in 0 of 10 rollouts." in same.output
    assert "Mean reward: 0.2000 before, 0.2000 after (+0.0000)." in same.output

    # Without /seed_session the checker has no seeded answer: every row fails, as data, with the reason.
    unseeded = ChildProcess(
        [*base, f"+output_jsonl_fpath={tmp_path / 'unseeded.jsonl'}", "+seed_session=false"], cwd=tmp_path
    )
    assert unseeded.wait(timeout=300) == 1, unseeded.output
    failed = read_jsonl(tmp_path / "unseeded_failures.jsonl")
    assert len(failed) == 10 and all("never seeded" in f["message"] for f in failed)
    assert not (tmp_path / "unseeded.jsonl").exists()  # no row re-verified: no output file

    # A broken line and a row without `response`: refused before anything is sent, each with its file:line.
    bad = tmp_path / "bad.jsonl"
    broken = dict(source[2])
    del broken["response"]
    bad.write_text(json.dumps(source[0]) + "\n" + json.dumps(source[1])[:-3] + "\n" + json.dumps(broken) + "\n")
    refused = ChildProcess(
        [*REVERIFY, str(bad), "-o", str(tmp_path / "x.jsonl"), f"+head_server.port={head_port}"],
        cwd=tmp_path,
    )
    assert refused.wait(timeout=120) == 2, refused.output
    first_line = refused.output.strip().splitlines()[0]
    assert first_line.startswith(f"error: ng_reverify: {bad}:2: not valid JSON"), refused.output
    assert f"{bad}:3: no saved `response` object" in refused.output
    assert not (tmp_path / "x.jsonl").exists()
