"""The viewer's index (`nemo_gym/workbench/view/index.py`) and its queries (`query.py`) on real files: offsets
that read back the right lines, growth picked up incrementally, rewritten files indexed afresh, a big file indexed
and queried in bounded memory, and the table / repeats / summary answers checked against the rows written."""

from __future__ import annotations

import json
import os
import random
import sqlite3
import tracemalloc
from pathlib import Path

import pytest

from nemo_gym.rollouts.collection import RolloutResult
from nemo_gym.rollouts.reward_profile import pass_at_k
from nemo_gym.testing.responses import function_call, function_call_output, make_response, reasoning
from nemo_gym.workbench.view.index import FAILURES, ROLLOUTS, RolloutIndex, summarize_rollout
from nemo_gym.workbench.view.query import RolloutQuery, TableFilter

USAGE = {
    "input_tokens": 20, "input_tokens_details": {"cached_tokens": 0}, "output_tokens": 10,
    "output_tokens_details": {"reasoning_tokens": 0}, "total_tokens": 30,
}  # fmt: skip


def rollout(task: int, repeat: int, reward: float, agent: str = "agent_a", text: str = "please add 1", pad=0) -> dict:
    """A rollout line as ng_collect_rollouts writes it: the row, the agent's response, reward, verifier fields."""
    response = make_response(
        reasoning("adding"),
        function_call("increment_counter", {"count": 1}),
        function_call_output({"count": 3}),
        "done: 3" + "x" * pad,
        usage=USAGE,
        status="completed",
    )
    return {
        "responses_create_params": {
            "input": [{"role": "system", "content": "be brief"}, {"role": "user", "content": text}]
        },
        "agent_ref": {"type": "responses_api_agents", "name": agent},
        "_ng_task_index": task,
        "_ng_rollout_index": repeat,
        "response": response.model_dump(mode="json"),
        "reward": reward,
        "expected_count": 3,
    }


def write(path: Path, rows: list, mode: str = "w") -> None:
    with open(path, mode) as f:
        for row in rows:
            f.write((row if isinstance(row, str) else json.dumps(row)) + "\n")


@pytest.fixture
def cache(tmp_path: Path) -> Path:
    return tmp_path / "cache"


def indexed_rows(ix: RolloutIndex) -> list[tuple]:
    db = sqlite3.connect(ix.db_path)
    try:
        sql = "SELECT source, offset, length, line, task, rollout, reward FROM rows ORDER BY source, offset"
        return db.execute(sql).fetchall()
    finally:
        db.close()


def test_summary_fields_of_a_rollout():
    fields = summarize_rollout(rollout(4, 1, 0.5, text="please   add\n1"))
    assert fields["task"] == 4 and fields["rollout"] == 1 and fields["agent"] == "agent_a"
    assert fields["reward"] == 0.5 and fields["tokens"] == 30 and fields["status"] == "ok"
    # reasoning + call, then (after the tool output) the answer: two model turns, one tool call
    assert (fields["turns"], fields["tool_calls"]) == (2, 1)
    assert fields["preview"] == "please add 1"
    incomplete = rollout(0, 0, 0.0)
    incomplete["response"].update(status="incomplete", incomplete_details={"reason": "max_output_tokens"})
    assert summarize_rollout(incomplete)["status"] == "incomplete"
    assert summarize_rollout(incomplete)["error_type"] == "max_output_tokens"
    assert summarize_rollout([1, 2])["status"] == "unreadable"


def test_offsets_read_back_each_line_and_blank_lines_keep_line_numbers(tmp_path, cache):
    path = tmp_path / "rollouts.jsonl"
    rows = [rollout(t, r, float(r % 2)) for t in range(3) for r in range(2)]
    write(path, [rows[0], "", rows[1], "{not json", *rows[2:]])
    ix = RolloutIndex(path, cache)
    assert ix.update() == 6  # 6 rollouts; the blank line and the bad line are no rows
    got = indexed_rows(ix)
    assert [g[3] for g in got] == [1, 3, 5, 6, 7, 8]  # physical line numbers
    for source, offset, length, line, *_ in got:
        text = ix.read_line(source, offset, length)
        assert text == path.read_text().splitlines()[line - 1].encode()
    count, (bad,) = ix.bad_lines()  # kept apart, for ng view's bad-lines policy
    assert count == 1 and bad.where() == f"{ix.path}:4: not valid JSON" and "char 1" in bad.detail
    query = RolloutQuery([ix])
    assert query.rows(TableFilter(status="unreadable"))["total"] == 0
    assert query.rows(TableFilter(failed_only=True))["total"] == 0  # a line that is not JSON is no failed rollout
    outcomes = query.outcomes()
    assert (outcomes["ok"], outcomes["incomplete"], outcomes["failed"]) == (6, 0, 0)
    assert ix.update() == 0  # nothing new: nothing read
    with open(path, "a") as f:
        f.write("[1, 2]\n" + json.dumps(rows[0])[:30])  # a new bad line, then a line still being written
    assert ix.update() == 0
    assert [(b.line, b.reason) for b in ix.bad_lines(after=1)[1]] == [(9, "a JSON list, not an object")]
    write(path, rows[:2])  # rewritten: indexed afresh, bad lines too
    assert ix.update() == 2 and ix.bad_lines() == (0, [])


def test_growth_is_indexed_incrementally_and_a_line_being_written_waits(tmp_path, cache):
    path = tmp_path / "rollouts.jsonl"
    write(path, [rollout(0, 0, 1.0), rollout(0, 1, 0.0)])
    ix = RolloutIndex(path, cache)
    assert ix.update() == 2
    before = indexed_rows(ix)
    line = json.dumps(rollout(1, 0, 1.0))
    with open(path, "a") as f:
        f.write(line[:40])  # the collector is half way through a line
    assert ix.update() == 0
    with open(path, "a") as f:
        f.write(line[40:] + "\n" + json.dumps(rollout(1, 1, 0.5)))  # the next one: complete, without newline yet
    assert ix.update() == 2
    after = indexed_rows(ix)
    assert after[:2] == before  # the old rows were not touched
    assert [(r[4], r[5], r[6]) for r in after] == [(0, 0, 1.0), (0, 1, 0.0), (1, 0, 1.0), (1, 1, 0.5)]
    with open(path, "a") as f:
        f.write("\n" + json.dumps(rollout(2, 0, 1.0)) + "\n")
    assert ix.update() == 1
    assert ix.state()[ROLLOUTS].generation == 0 and ix.state()[ROLLOUTS].rows == 5


def test_a_rewritten_or_shrunk_or_deleted_file_is_indexed_afresh(tmp_path, cache):
    path = tmp_path / "rollouts.jsonl"
    write(path, [rollout(0, r, 1.0) for r in range(4)])
    ix = RolloutIndex(path, cache)
    ix.update()
    write(path, [rollout(7, r, 0.0, agent="agent_b") for r in range(5)])  # a new run over the same name, longer
    assert ix.update() == 5
    assert ix.state()[ROLLOUTS].generation == 1
    assert {(r[4], r[6]) for r in indexed_rows(ix)} == {(7, 0.0)}
    write(path, [rollout(9, 0, 1.0)])  # shorter
    assert ix.update() == 1 and ix.state()[ROLLOUTS].generation == 2
    path.unlink()
    ix.update()
    assert indexed_rows(ix) == [] and ix.state()[ROLLOUTS].rows == 0


def test_the_index_is_reused_by_the_next_viewer_and_an_interrupted_build_resumes(tmp_path, cache):
    path = tmp_path / "rollouts.jsonl"
    write(path, [rollout(t, 0, 1.0) for t in range(5000)])
    first = RolloutIndex(path, cache)
    assert first.update(max_rows=2500) == 2500  # stopped part way (rows are committed in batches)
    first.close()
    second = RolloutIndex(path, cache)
    assert second.db_path == first.db_path
    assert second.update() == 2500  # only the rest
    assert [r[4] for r in indexed_rows(second)] == list(range(5000))
    second.close()
    third = RolloutIndex(path, cache)
    assert third.update() == 0
    db = sqlite3.connect(third.db_path)  # an index written by another version of the module is not trusted
    db.execute("UPDATE info SET value = '0' WHERE key = 'version'")
    db.commit()
    db.close()
    third.close()
    assert RolloutIndex(path, cache).update() == 5000


def test_failures_file_beside_the_rollouts_is_part_of_the_table(tmp_path, cache):
    path = tmp_path / "rollouts.jsonl"
    write(path, [rollout(0, 0, 1.0), rollout(1, 0, 0.0)])
    materialized = {**rollout(2, 0, 0.0), "response": None}
    failure = RolloutResult(
        materialized, error_type="HTTPError", message="POST /run on agent `agent_a` answered HTTP 503: busy",
        status_code=503, server="agent_a", agent_name="agent_a", attempts=3,
    ).failure_record()  # fmt: skip
    write(tmp_path / "rollouts_failures.jsonl", [failure])
    ix = RolloutIndex(path, cache)
    ix.update()
    query = RolloutQuery([ix])
    failed = query.rows(TableFilter(failed_only=True))["rows"]
    got = [(r["source"], r["task"], r["status"], r["error_type"]) for r in failed]
    assert got == [(FAILURES, 2, "failed", "HTTPError")]
    listed = query.failures()["rows"]
    assert listed[0]["message"].endswith("answered HTTP 503: busy")
    info, line = query.row(0, failed[0]["id"])
    assert json.loads(line)["status_code"] == 503 and info["agent"] == "agent_a"
    assert query.summary()["failures"] == [{"error_type": "HTTPError", "status": "failed", "count": 1}]


def test_table_sort_filter_search_repeats_and_summary(tmp_path, cache):
    path = tmp_path / "rollouts.jsonl"
    rewards = {0: [1.0, 0.0, 1.0], 1: [0.0, 0.0, 0.0], 2: [0.5, 1.0, 0.25]}
    rows = [rollout(t, r, rw, agent="agent_a" if t < 2 else "agent_b", text=f"task number {t}")
            for t, rws in rewards.items() for r, rw in enumerate(rws)]  # fmt: skip
    write(path, rows)
    ix = RolloutIndex(path, cache)
    ix.update()
    query = RolloutQuery([ix])
    page = query.rows(sort="reward", descending=True, limit=4)
    assert page["total"] == 9 and [r["reward"] for r in page["rows"]] == [1.0, 1.0, 1.0, 0.5]
    assert query.rows(TableFilter(min_reward=0.25, max_reward=0.5))["total"] == 2
    assert query.rows(TableFilter(agent="agent_b"))["total"] == 3
    hits = query.rows(TableFilter(text="TASK NUMBER 1"))["rows"]  # case-insensitive, in the conversation
    assert {(r["task"], r["rollout"]) for r in hits} == {(1, 0), (1, 1), (1, 2)}
    # tool arguments are JSON inside a JSON string (`{\"count\": 1}` in the file): found as the page shows them
    assert query.rows(TableFilter(text='{"count": 1}'))["total"] == 9
    assert query.rows(TableFilter(text='{"count": 2}'))["total"] == 0
    with pytest.raises(ValueError, match="cannot sort by"):
        query.rows(sort="reward; DROP TABLE rows")

    repeats = query.task_rows(0, 2)["rows"]
    assert [info["reward"] for info, _ in repeats] == [1.0, 0.25, 0.5]  # best, worst, then the rest
    assert all(json.loads(line)["_ng_task_index"] == 2 for _, line in repeats)

    summary = query.summary(pass_threshold=1.0)
    agents = {a["agent"]: a for a in summary["agents"]}
    assert agents["agent_a"]["tasks"] == 2 and agents["agent_a"]["mean_reward"] == pytest.approx(2 / 6)
    want = (pass_at_k(3, 2, 2) + pass_at_k(3, 0, 2)) / 2
    assert agents["agent_a"]["pass_at_k"][1] == {"k": 2, "value": pytest.approx(want), "tasks": 2}
    assert {b["lo"]: b["count"] for b in summary["histogram"]["bins"]} == {0.0: 4, 0.25: 1, 0.5: 1, 1.0: 3}

    # the file grows: the next search only scans the new lines and still finds them
    write(path, [rollout(1, 3, 1.0, text="task number 1")], mode="a")
    ix.update()
    assert query.rows(TableFilter(text="task number 1"))["total"] == 4
    assert [a["rollouts"] for a in query.summary()["agents"]] == [7, 3]  # the cached summary was recomputed


def test_a_big_file_is_indexed_and_queried_without_loading_it(tmp_path, cache):
    path = tmp_path / "big.jsonl"
    rng = random.Random(7)
    n = 20_000
    template = json.dumps(rollout(0, 0, 0.0, pad=1500))  # about 3 kB a line: a 60 MB file
    with open(path, "w") as f:
        for i in range(n):
            line = template.replace('"_ng_task_index": 0', f'"_ng_task_index": {i // 4}')
            line = line.replace('"_ng_rollout_index": 0', f'"_ng_rollout_index": {i % 4}')
            reward = 1.0 if i == 12_345 else round(rng.random() * 0.9, 3)
            line = line.replace('"reward": 0.0', f'"reward": {reward}')
            if i == 17_777:
                line = line.replace("please add 1", "the needle in the haystack")
            f.write(line + "\n")
    size = os.path.getsize(path)
    assert size > 50_000_000
    ix = RolloutIndex(path, cache)
    tracemalloc.start()
    try:
        assert ix.update() == n
        query = RolloutQuery([ix])
        top = query.rows(sort="reward", descending=True, limit=1)["rows"][0]
        found = query.rows(TableFilter(text="needle in the HAYSTACK"))
        last_page = query.rows(offset=n - 10, limit=10)["rows"]
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 10_000_000, f"indexing and querying a {size} byte file peaked at {peak} bytes of Python memory"
    assert (top["task"], top["rollout"], top["reward"]) == (12_345 // 4, 12_345 % 4, 1.0)
    assert found["total"] == 1 and found["rows"][0]["line"] == 17_778
    assert [r["line"] for r in last_page] == list(range(n - 9, n + 1))
    _, line = query.row(0, last_page[-1]["id"])
    assert json.loads(line)["_ng_task_index"] == (n - 1) // 4


def test_several_files_in_one_table_and_a_failures_file_on_its_own(tmp_path, cache):
    a, b = tmp_path / "model_a.jsonl", tmp_path / "model_b.jsonl"
    write(a, [rollout(0, r, rw) for r, rw in enumerate([1.0, 0.0])])
    write(b, [rollout(0, r, rw) for r, rw in enumerate([0.5, 0.5, 0.0])])
    failure = RolloutResult(rollout(1, 0, 0.0), error_type="Timeout", message="/run did not answer", attempts=3)
    write(tmp_path / "model_b_failures.jsonl", [failure.failure_record()])
    indexes = [RolloutIndex(p, cache) for p in (a, b, tmp_path / "model_b_failures.jsonl")]
    for ix in indexes:
        ix.update()
    assert indexes[0].db_path != indexes[1].db_path
    query = RolloutQuery(indexes)
    page = query.rows(sort="reward", descending=True)
    assert page["total"] == 2 + 3 + 1 + 1  # the failure is in b's table and in the failures file's own
    assert [(r["file"], r["reward"]) for r in page["rows"][:3]] == [(0, 1.0), (1, 0.5), (1, 0.5)]
    assert query.rows(TableFilter(file=2))["rows"][0]["error_type"] == "Timeout"
    assert query.task_rows(0, 0)["total"] == 2
    both = query.task_rows(0, 0, all_files=True)["rows"]
    assert [(info["file"], info["reward"]) for info, _ in both] == [(0, 1.0), (1, 0.0), (1, 0.5), (1, 0.5), (0, 0.0)]
    agents = {s["agent"]: s for s in query.summary()["agents"]}
    assert agents["model_a.jsonl: agent_a"]["mean_reward"] == 0.5
    assert agents["model_b.jsonl: agent_a"]["rollouts"] == 3 and agents["model_b.jsonl: agent_a"]["failed"] == 1


def test_search_finds_non_ascii_text_however_the_file_wrote_it(tmp_path, cache):
    path = tmp_path / "rollouts.jsonl"
    escaped = json.dumps(rollout(0, 0, 1.0, text="Crème brûlée"))  # \u00e8 escapes (Python's json)
    raw = json.dumps(rollout(1, 0, 1.0, text="crème brûlée"), ensure_ascii=False)  # UTF-8 as it is (orjson)
    write(path, [escaped, raw, rollout(2, 0, 1.0, text="creme brulee")])
    ix = RolloutIndex(path, cache)
    ix.update()
    hits = RolloutQuery([ix]).rows(TableFilter(text="crème BRÛLÉE".lower()))["rows"]
    assert sorted(r["task"] for r in hits) == [0, 1]


def test_a_response_cut_short_counts_as_incomplete_not_failed(tmp_path, cache):
    """A response that stopped at max_output_tokens still has its reward: the summary counts it apart from the
    rollouts that have none (a failures-file row)."""
    path = tmp_path / "rollouts.jsonl"
    cut = rollout(0, 1, 1.0)
    cut["response"]["status"] = "incomplete"
    cut["response"]["incomplete_details"] = {"reason": "max_output_tokens"}
    write(path, [rollout(0, 0, 1.0), cut])
    failure = RolloutResult(rollout(1, 0, 0.0), error_type="Timeout", message="/run did not answer", attempts=3)
    write(tmp_path / "rollouts_failures.jsonl", [failure.failure_record()])
    index = RolloutIndex(path, cache)
    index.update()
    (agent,) = RolloutQuery([index]).summary()["agents"]
    assert (agent["rollouts"], agent["failed"], agent["incomplete"], agent["mean_reward"]) == (2, 1, 1, 1.0)


def with_token_ids(row: dict, second_prompt: list, flag=None) -> dict:
    """`row` with token ids on its two model calls (the call, then the answer after the tool output)."""
    output = row["response"]["output"]
    output[1].update(prompt_token_ids=[1, 2], generation_token_ids=[5], generation_log_probs=[-0.5])
    output[3].update(prompt_token_ids=second_prompt, generation_token_ids=[9], generation_log_probs=[-0.5])
    if flag is not None:
        output[3]["token_trajectory"] = flag
    return row


def test_the_token_trajectory_drift_check_is_a_column_and_counted_in_the_summary(tmp_path, cache):
    """The same classification as `ng export tokens` (`classify_trajectory`): per row, and counted."""
    path = tmp_path / "rollouts.jsonl"
    write(path, [rollout(0, 0, 1.0)])  # no token ids anywhere: no column, no counts
    ix = RolloutIndex(path, cache)
    ix.update()
    query = RolloutQuery([ix])
    assert query.has_token_data() is False and query.summary()["trajectories"] is None
    assert query.rows()["rows"][0]["trajectory"] is None

    write(path, [
        with_token_ids(rollout(0, 1, 1.0), [1, 2, 5, 7]),  # contiguous, no flag: exact
        with_token_ids(rollout(0, 2, 1.0), [1, 2, 5, 7], flag="retokenized"),
        with_token_ids(rollout(0, 3, 0.0), [1, 3, 5, 7], flag="retokenized"),  # does not continue: unusable
    ], mode="a")  # fmt: skip
    ix.update()
    assert query.has_token_data() is True
    got = {r["rollout"]: (r["trajectory"], r["trajectory_reason"]) for r in query.rows()["rows"]}
    assert got == {0: (None, None), 1: ("exact", None), 2: ("retokenized", None),
                   3: ("unusable", "tokens_not_contiguous")}  # fmt: skip
    assert query.summary()["trajectories"] == {
        "exact": 1, "retokenized": 1, "unusable": 2, "reasons": {"no_token_data": 1, "tokens_not_contiguous": 1}
    }  # fmt: skip
    ranked = query.rows(sort="trajectory", descending=True)["rows"]
    assert [r["trajectory"] for r in ranked] == ["unusable", "retokenized", "exact", None]
    info, _ = query.row(0, ranked[1]["id"])
    assert info["trajectory"] == "retokenized"  # the detail pane gets it too


def test_a_bad_line_that_appears_while_following_a_file_is_named_on_stderr(tmp_path, cache, capsys):
    from nemo_gym.workbench.view.app import Watcher

    path = tmp_path / "rollouts.jsonl"
    write(path, [rollout(0, 0, 1.0), "{torn"])
    ix = RolloutIndex(path, cache)
    ix.update()
    watcher = Watcher([ix])  # not started: one round by hand
    assert watcher.bad_lines_seen == [1]  # reported when the viewer started
    write(path, [rollout(0, 1, 0.0), "7"], mode="a")
    ix.update()
    watcher._report_new_bad_lines(0, ix)
    err = capsys.readouterr().err
    appeared = "warning: ng_view: skipped a bad line that appeared while viewing"
    assert err == f"{appeared}: {ix.path}:4: a JSON number, not an object\n"
    watcher._report_new_bad_lines(0, ix)
    assert capsys.readouterr().err == ""  # each one once


def test_the_viewer_counts_outcomes_in_the_words_and_numbers_of_the_reward_profile(tmp_path, cache):
    """ok / incomplete / failed (`nemo_gym.rollouts.outcome`): a response cut at max_output_tokens is incomplete
    (not a failure: it keeps its reward), a response with an `error` is failed, and a rollout with two failure lines
    (two attempts) is one failed rollout, under its first line's error type. The viewer's counts, lists and
    sentence are the reward profile's for the same files."""
    from nemo_gym.rollouts.reward_profile import profile_rollouts

    path = tmp_path / "rollouts.jsonl"
    cut = rollout(1, 0, 1.0)
    cut["response"].update(status="incomplete", incomplete_details={"reason": "max_output_tokens"})
    errored = rollout(1, 1, 0.0)
    errored["response"].update(status="failed", error={"code": "server_error", "message": "the model crashed"})
    write(path, [rollout(0, 0, 1.0), rollout(0, 1, 0.0), cut, errored])
    attempt = RolloutResult(rollout(2, 0, 0.0), error_type="HTTPError", message="503", agent_name="agent_a", attempts=1)
    again = RolloutResult(rollout(2, 0, 0.0), error_type="Timeout", message="slow", agent_name="agent_a", attempts=1)
    other = RolloutResult(rollout(2, 1, 0.0), error_type="Timeout", message="slow", agent_name="agent_a", attempts=1)
    write(tmp_path / "rollouts_failures.jsonl", [r.failure_record() for r in (attempt, again, other)])
    ix = RolloutIndex(path, cache)
    ix.update()
    query = RolloutQuery([ix])

    outcomes = query.outcomes()
    assert (outcomes["ok"], outcomes["incomplete"], outcomes["failed"], outcomes["failure_lines"]) == (2, 1, 3, 4)
    assert outcomes["text"] == "6 rollouts: 2 ok, 1 incomplete (max_output_tokens), 3 failed (1 HTTPError, 1 Timeout, 1 server_error)"
    assert outcomes["phrases"] == {"ok": "2 ok", "incomplete": "1 incomplete (max_output_tokens)",
                                   "failed": "3 failed (1 HTTPError, 1 Timeout, 1 server_error)"}  # fmt: skip
    incomplete = query.listing("incomplete")
    assert [(r["task"], r["rollout"], r["reward"], r["error_type"]) for r in incomplete["rows"]] == [(1, 0, 1.0, "max_output_tokens")]
    failed = query.failures()
    assert (failed["total"], failed["rollouts"]) == (4, 3)  # 4 lines of 3 rollouts
    assert query.rows(TableFilter(status="incomplete"))["total"] == 1 and query.rows(TableFilter(failed_only=True))["total"] == 4
    with pytest.raises(ValueError, match="no status `error`"):
        query.rows(TableFilter(status="error"))
    summary = query.summary()
    assert summary["incomplete"] == [{"reason": "max_output_tokens", "status": "incomplete", "count": 1}]
    assert {f["error_type"]: f["count"] for f in summary["failures"]} == {"HTTPError": 1, "Timeout": 1, "server_error": 1}
    (agent,) = summary["agents"]
    assert (agent["rollouts"], agent["ok"], agent["incomplete"], agent["failed"]) == (4, 2, 1, 3)

    materialized = tmp_path / "rollouts_materialized_inputs.jsonl"
    write(materialized, [{**rollout(t, r, 0.0), "response": None} for t in range(3) for r in range(2)])
    profile = profile_rollouts(materialized, path)
    assert profile.outcomes.as_dict() == {k: v for k, v in outcomes.items() if k not in ("unreadable", "failure_lines")}
    (metrics,) = profile.agent_metrics
    assert (metrics["num_rollouts"], metrics["num_ok"], metrics["num_incomplete"], metrics["num_failed"]) == (4, 2, 1, 3)
