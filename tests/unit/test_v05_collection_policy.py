"""NeMo Gym v0.5's collection policy on our collector (spec §11): per-agent `num_repeats`, the resume policy over the
failures sidecar (attempts, terminal failures, `NEMO_GYM_MAX_ROLLOUT_ATTEMPTS`, `_ng_attempt_index`), `_ng_no_persist`
answers kept nowhere, and v0.5-shaped files read by merge, the viewer's index, export and `ng_aggregate_rollouts`.

The agent here is a real HTTP server (FastAPI on uvicorn, `live_server`) that answers from a script per task, so
the collector's own client, retries and files are exercised as in a run.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from fastapi import FastAPI, Request

from nemo_gym.config.known_keys import GlobalKeys
from nemo_gym.errors import ConfigPathNotFoundError
from nemo_gym.rollouts.aggregation import RolloutAggregationConfig, expand_input_globs, load_sorted_rollouts
from nemo_gym.rollouts.collection import (
    CollectionPaths,
    InputValidationError,
    RolloutCollectionConfig,
    RowPreprocessor,
    iter_materialized_rows,
    iter_pending_rows,
    read_failure_history,
    rollout_key,
    run_from_config,
)
from nemo_gym.http.client import ServerClient
from nemo_gym.rollouts.jsonl import BadLinesRefused
from nemo_gym.rollouts.merge import merge_shards
from nemo_gym.testing.live_server import live_server
from nemo_gym.workbench.export import ExportConfig, export_rollouts
from nemo_gym.workbench.view.index import summarize_failure

T, R, A = "_ng_task_index", "_ng_rollout_index", "_ng_attempt_index"
MAX_ENV = "NEMO_GYM_MAX_ROLLOUT_ATTEMPTS"


def params(text: str) -> dict:
    return {"input": [{"role": "user", "content": text}]}


def write_jsonl(path: Path, rows: list) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


# ------------------------------------------------------------------------------------------ num_repeats per agent


def test_num_repeats_is_an_int_or_a_mapping_per_agent_with_default():
    lines = [
        json.dumps({"responses_create_params": params("a"), "agent_ref": {"name": "alpha"}}),
        json.dumps({"responses_create_params": params("b"), "agent_ref": {"name": "beta"}}),
    ]
    rows = list(iter_materialized_rows(lines, num_repeats={"alpha": 3, "_default": 2}, known_agents=["alpha", "beta"]))
    per_agent = {}
    for row in rows:
        per_agent.setdefault(row["agent_ref"]["name"], []).append((row[T], row[R]))
    assert per_agent == {"alpha": [(0, 0), (0, 1), (0, 2)], "beta": [(1, 0), (1, 1)]}
    assert len(list(iter_materialized_rows(lines, num_repeats=2))) == 4
    assert RolloutCollectionConfig(output_jsonl_fpath="o.jsonl", input_jsonl_fpath="i.jsonl",
                                   num_repeats={"alpha": 2}).num_repeats == {"alpha": 2}


def test_an_agent_without_entry_or_default_is_refused_naming_it(tmp_path):
    lines = [json.dumps({"responses_create_params": params("b"), "agent_ref": {"name": "beta"}})]
    with pytest.raises(InputValidationError) as err:
        list(iter_materialized_rows(lines, num_repeats={"alpha": 3}))
    assert "`beta`" in str(err.value) and "_default" in str(err.value) and "alpha" in str(err.value)


@pytest.mark.parametrize("bad", [0, -1, True, "three", {"alpha": 0}, {}, {"alpha": "x"}])
def test_bad_num_repeats_values_say_what_was_given(bad):
    with pytest.raises(ValueError, match="num_repeats"):
        RolloutCollectionConfig(output_jsonl_fpath="o.jsonl", input_jsonl_fpath="i.jsonl", num_repeats=bad)


def test_unknown_agent_names_in_num_repeats_are_warned_about(capsys):
    RowPreprocessor(num_repeats={"alpah": 2, "_default": 1}, known_agents=["alpha"])
    err = capsys.readouterr().err
    assert "`alpah`" in err and "not an agent" in err and "alpha" in err


# ------------------------------------------------------------------------------------------ the failures history


def v05_line(task: int, rollout: int, attempt: int | None, cls: str = "transient", terminal: bool = False) -> dict:
    """A line of a NeMo Gym v0.5 failures sidecar: the agent's result itself, with the failure keys."""
    line = {T: task, R: rollout, "reward": 0.0, "response": {"output": []}, "agent_ref": {"name": "agent"},
            "responses_create_params": params("q"), "_ng_failure_class": cls, "_ng_failure_terminal": terminal}
    if attempt:
        line[A] = attempt
    return line


def test_failure_history_counts_v05_lines_and_our_records(tmp_path):
    sidecar = write_jsonl(tmp_path / "x_failures.jsonl", [
        v05_line(0, 0, None), v05_line(0, 0, 1),                      # two attempts
        v05_line(1, 0, None, "timeout_exceeded", terminal=True),     # terminal at once
        # ours: one record for the last of 3 in-run attempts
        {T: 2, R: 0, "error_type": "judge_failed", "row": {A: 2}, "_ng_failure_class": "judge_failed",
         "_ng_failure_terminal": False, A: 2, "result": {"reward": 0.0}},
        # a transport failure: not the agent's verdict, not an attempt
        {T: 3, R: 0, "error_type": "HTTPError", "status_code": 500, "row": {}},
    ])
    history = read_failure_history(sidecar)
    assert history.attempts == {rollout_key(0, 0): 2, rollout_key(1, 0): 1, rollout_key(2, 0): 3}
    assert history.terminal == {rollout_key(1, 0)}
    assert history.recorded == {rollout_key(t, 0) for t in range(4)}
    assert history.skip_reason(rollout_key(1, 0), 3) == "terminal"
    assert history.skip_reason(rollout_key(2, 0), 3) == "exhausted"
    assert history.skip_reason(rollout_key(0, 0), 3) is None
    assert history.skip_reason(rollout_key(0, 0), 2) == "exhausted"

    materialized = write_jsonl(tmp_path / "x_materialized_inputs.jsonl", [
        {"responses_create_params": params("q"), "agent_ref": {"name": "agent"}, T: t, R: 0} for t in range(5)
    ])
    pending = list(iter_pending_rows(materialized, None, None, history, 3))
    assert [(r[T], r.get(A)) for r in pending] == [(0, 2), (3, None), (4, None)]


# ------------------------------------------------------------------------------------------ runs against an agent


class ScriptedAgent:
    """A real HTTP agent whose `/run` answer for a task is given by `answers[task]` (a dict merged into the reply)."""

    def __init__(self) -> None:
        self.answers: dict[int, dict] = {}
        self.calls: list[tuple[int, int, Any]] = []
        self.app = FastAPI()

        @self.app.post("/run")
        async def run(request: Request) -> dict:
            row = await request.json()
            self.calls.append((row[T], row[R], row.get(A)))
            return {"reward": 1.0, "response": {"output": []}, **self.answers.get(row[T], {})}

    def client(self, url: str) -> ServerClient:
        port = int(url.rsplit(":", 1)[1])
        return ServerClient(global_config_dict={
            "agent": {"responses_api_agents": {"impl": {"host": "127.0.0.1", "port": port}}}
        })


def config(tmp_path: Path, **overrides: Any) -> RolloutCollectionConfig:
    base = dict(input_jsonl_fpath=str(tmp_path / "in.jsonl"), output_jsonl_fpath=str(tmp_path / "out" / "r.jsonl"),
                agent_name="agent", retry_backoff_s=0.001, progress_bar=False, disable_aggregation=True)
    return RolloutCollectionConfig(**{**base, **overrides})


def test_resume_counts_attempts_skips_terminal_and_exhausted_and_appends(tmp_path, monkeypatch, capsys):
    write_jsonl(tmp_path / "in.jsonl", [{"responses_create_params": params(f"q{i}")} for i in range(4)])
    agent = ScriptedAgent()
    agent.answers = {
        1: {"_ng_failure_class": "transient"},
        2: {"_ng_failure_class": "timeout_exceeded", "_ng_failure_terminal": True},
        3: {"_ng_failure_class": "kill_shaped", "_ng_no_persist": True},
    }
    paths = CollectionPaths(tmp_path / "out" / "r.jsonl")
    with live_server(agent.app) as url:
        client = agent.client(url)
        monkeypatch.setenv(MAX_ENV, "1")
        assert run_from_config(config(tmp_path), server_client=client) == 1
        assert [r[T] for r in read_jsonl(paths.output)] == [0]
        first = read_jsonl(paths.failures)
        # The kill-shaped answer is nowhere: not in the output, not in the sidecar.
        assert sorted((f[T], f["_ng_failure_class"], f["_ng_failure_terminal"]) for f in first) == [
            (1, "transient", False), (2, "timeout_exceeded", True)]
        assert "marked _ng_no_persist are recorded nowhere" in capsys.readouterr().err

        # Resume with a bigger budget: task 1 gets the 2 attempts left, starting at index 1; the terminal task 2 is
        # not run; the kill-shaped task 3 runs again from scratch (and is rerun in the run, like any declared failure).
        monkeypatch.setenv(MAX_ENV, "3")
        agent.calls.clear()
        assert run_from_config(config(tmp_path, resume_from_cache=True), server_client=client) == 1
        assert sorted(agent.calls, key=str) == [(1, 0, 1), (1, 0, 2), (3, 0, 1), (3, 0, 2), (3, 0, None)]
        second = read_jsonl(paths.failures)
        assert second[:2] == first  # appended, never rewritten
        assert [(f[T], f[A], f["attempts"]) for f in second[2:]] == [(1, 2, 2)]
        err = capsys.readouterr().err
        assert "Not run again: 1 rollout(s) whose failure is terminal" in err

        # Once more: task 1 has failed 3 times, task 2 is terminal; only the kill-shaped task runs. It now succeeds.
        agent.answers.pop(3)
        agent.calls.clear()
        assert run_from_config(config(tmp_path, resume_from_cache=True), server_client=client) == 1
        assert agent.calls == [(3, 0, None)]
        assert sorted(r[T] for r in read_jsonl(paths.output)) == [0, 3]
        assert "1 that already failed 3 time(s)" in capsys.readouterr().err

        # A fixed agent and a raised budget: task 1 runs (attempt index 3) and succeeds; its failure lines go.
        agent.answers.pop(1)
        agent.calls.clear()
        monkeypatch.setenv(MAX_ENV, "5")
        assert run_from_config(config(tmp_path, resume_from_cache=True), server_client=client) == 1
        assert agent.calls == [(1, 0, 3)]
        out = {r[T]: r for r in read_jsonl(paths.output)}
        assert sorted(out) == [0, 1, 3] and out[1][A] == 3
        assert [f[T] for f in read_jsonl(paths.failures)] == [2]  # only the terminal one is left

        # Without resume the sidecar starts afresh.
        monkeypatch.setenv(MAX_ENV, "1")
        agent.answers = {}
        assert run_from_config(config(tmp_path), server_client=client) == 0
        assert not paths.failures.exists()


def test_resume_reads_a_v05_sidecar(tmp_path, monkeypatch):
    """A run started on NeMo Gym v0.5 (its output, materialized inputs and sidecar) is resumed by our collector."""
    paths = CollectionPaths(tmp_path / "out" / "r.jsonl")
    rows = [{"responses_create_params": params(f"q{t}"), "agent_ref": {"name": "agent"}, T: t, R: 0,
             "skills_ref": {"path": "skills", "hash": "abc123def456", "skills": []}} for t in range(4)]
    write_jsonl(paths.materialized_inputs, rows)
    write_jsonl(paths.output, [{**rows[0], "reward": 1.0, "response": {"output": []}}])
    write_jsonl(paths.failures, [v05_line(1, 0, None), v05_line(1, 0, 1), v05_line(2, 0, None, "skipped", True)])
    write_jsonl(tmp_path / "in.jsonl", [{"responses_create_params": params("unused")}])
    agent = ScriptedAgent()
    monkeypatch.setenv(MAX_ENV, "3")
    with live_server(agent.app) as url:
        assert run_from_config(config(tmp_path, resume_from_cache=True), server_client=agent.client(url)) == 1
    assert sorted(agent.calls) == [(1, 0, 2), (3, 0, None)]
    out = {r[T]: r for r in read_jsonl(paths.output)}
    assert sorted(out) == [0, 1, 3]
    assert out[1][A] == 2 and out[1]["skills_ref"]["hash"] == "abc123def456" and out[1]["agent_ref"] == {"name": "agent"}
    # The recovered task's v0.5 lines are gone; the terminal one's stays as it was written.
    assert read_jsonl(paths.failures) == [v05_line(2, 0, None, "skipped", True)]


# ------------------------------------------------------------------------------------------ v0.5 files elsewhere


def v05_run(folder: Path, tasks: range, *, failures: list[dict]) -> Path:
    """A v0.5-shaped run (materialized inputs of 6 tasks; rollouts of `tasks`; a sidecar) in `folder`."""
    rows = [{"responses_create_params": params(f"q{t}"), "agent_ref": {"name": "agent"}, T: t, R: 0} for t in range(6)]
    output = folder / "r.jsonl"
    write_jsonl(CollectionPaths(output).materialized_inputs, rows)
    write_jsonl(output, [
        {**rows[t], "reward": 1.0, A: 1, "skills_ref": {"path": "s", "hash": "h", "skills": []},
         "response": {"output": [{"type": "message", "role": "assistant",
                                  "content": [{"type": "output_text", "text": "ok"}]}]}}
        for t in tasks
    ])
    write_jsonl(CollectionPaths(output).failures, failures)
    return output


def test_merge_keeps_every_attempt_line_and_the_v05_fields(tmp_path):
    a = v05_run(tmp_path / "a", range(0, 6, 2), failures=[v05_line(1, 0, None), v05_line(1, 0, 1)])
    b = v05_run(tmp_path / "b", range(3, 6, 2), failures=[v05_line(1, 0, None)])
    report = merge_shards([a, b], tmp_path / "m" / "r.jsonl", profile=False)
    merged = CollectionPaths(tmp_path / "m" / "r.jsonl")
    rows = read_jsonl(merged.output)
    assert len(rows) == 5 and all(r[A] == 1 and r["skills_ref"]["hash"] == "h" for r in rows)
    failures = read_jsonl(merged.failures)
    assert failures == [v05_line(1, 0, None), v05_line(1, 0, 1)]  # shard a's two attempts; b's copy is a duplicate
    assert report.failures == 1 and report.failure_duplicates == 1 and report.missing == 0
    assert read_failure_history(merged.failures).attempts == {rollout_key(1, 0): 2}


def test_viewer_index_reads_v05_failure_lines():
    line = {**v05_line(4, 1, 2, "judge_failed"), "_ng_failure_judge_error": "judge backend down"}
    summary = summarize_failure(line)
    assert summary["task"] == 4 and summary["rollout"] == 1 and summary["agent"] == "agent"
    assert summary["status"] == "failed" and summary["error_type"] == "judge_failed"
    assert summary["message"] == "judge backend down" and summary["preview"]


def test_export_never_takes_a_declared_failure_for_training_data(tmp_path):
    out = v05_run(tmp_path, range(2), failures=[])
    with open(out, "a") as f:  # a v0.5 sidecar line pasted into a rollouts file: it has a response and a reward
        f.write(json.dumps({**v05_line(2, 0, None), "response": {"output": [
            {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "?"}]}]}}) + "\n")
    report = export_rollouts(ExportConfig(kind="sft", input_jsonl_fpath=str(out), output_fpath=str(tmp_path / "s.jsonl")))
    assert report.kept == 2 and report.dropped["failed_rollout"] == 1
    exported = read_jsonl(tmp_path / "s.jsonl")
    assert sorted(r[T] for r in exported) == [0, 1]


def test_aggregation_inputs_globs_dedup_and_companions(tmp_path):
    a = v05_run(tmp_path / "a", range(0, 6, 2), failures=[v05_line(1, 0, None)])
    b = v05_run(tmp_path / "b", range(1, 6, 2), failures=[])
    files, skipped = expand_input_globs(f"{tmp_path}/a/*.jsonl, {tmp_path}/*/r.jsonl")
    assert files == [a, b]
    assert {p.name for p in skipped} == {"r_materialized_inputs.jsonl", "r_failures.jsonl"}
    inputs = load_sorted_rollouts(files + [a])  # a file named twice is read once by the glob; here: duplicates
    assert [r[T] for r in inputs.rollouts] == list(range(6)) and inputs.duplicates == 3
    with pytest.raises(ConfigPathNotFoundError, match="matches no rollout file"):
        expand_input_globs(str(tmp_path / "nothing*.jsonl"))
    assert RolloutAggregationConfig(input_glob=["x", "y"], output_jsonl_fpath="o.jsonl").merge_shards is True


def test_new_global_keys_and_per_server_num_workers_are_accepted():
    from nemo_gym.config.types import ServerImplConfig
    from nemo_gym.runtime.launcher import DEFAULT_MODEL_ENDPOINT_READINESS_TIMEOUT_S

    fields = GlobalKeys.model_fields
    assert fields["model_endpoint_readiness_timeout_seconds"].default == DEFAULT_MODEL_ENDPOINT_READINESS_TIMEOUT_S
    for key in ("verbose", "nemo_gym_log_dir", "model_endpoint_readiness_timeout_seconds"):
        assert key in GlobalKeys.parameter_keys()
    assert ServerImplConfig.model_validate({"entrypoint": "app.py", "num_workers": 2}).num_workers == 2


# ------------------------------------------------------------------------------------------ skills


def make_skills(root: Path) -> Path:
    (root / "geo").mkdir(parents=True)
    (root / "geo" / "SKILL.md").write_text(
        "---\nname: geography\ndescription: Capitals of countries\nmetadata:\n  version: 1.2\n---\nUse an atlas.\n")
    (root / "geo" / "notes.txt").write_text("Rome, Berlin\n")
    (root / "math").mkdir()
    (root / "math" / "SKILL.md").write_text("---\nname: arithmetic\n---\nAdd carefully.\n")
    return root


def test_load_skill_directory_reads_front_matter_and_hashes_the_content(tmp_path):
    from nemo_gym.skills import SkillMetadata, load_skill_directory, stage_skills

    root = make_skills(tmp_path / "skills")
    ref = load_skill_directory(root)
    assert ref.path == str(root)
    assert ref.skills == [SkillMetadata(name="geography", description="Capitals of countries", version="1.2"),
                          SkillMetadata(name="arithmetic")]
    assert len(ref.hash) == 12 and int(ref.hash, 16) >= 0
    assert load_skill_directory(root).hash == ref.hash
    (root / "geo" / "notes.txt").write_text("Rome, Berlin, Paris\n")
    assert load_skill_directory(root).hash != ref.hash

    staged = stage_skills(root, tmp_path / "runtime" / "skills")
    assert (staged / "geo" / "SKILL.md").read_text() == (root / "geo" / "SKILL.md").read_text()
    assert (staged / "math" / "SKILL.md").is_file()


@pytest.mark.parametrize("content, problem", [
    (None, "has no SKILL.md"),
    ("no front matter\n", "no YAML front matter"),
    ("---\ndescription: x\n---\n", "needs a `name`"),
    ("---\nname: [unclosed\n---\n", "invalid YAML"),
])
def test_a_bad_skill_folder_is_a_value_error_naming_the_file(tmp_path, content, problem):
    from nemo_gym.skills import load_skill_directory

    (tmp_path / "s" / "bad").mkdir(parents=True)
    if content is not None:
        (tmp_path / "s" / "bad" / "SKILL.md").write_text(content)
    with pytest.raises(ValueError, match=problem) as err:
        load_skill_directory(tmp_path / "s")
    assert "bad" in str(err.value)


def test_rows_and_results_carry_the_skills_ref(tmp_path):
    root = make_skills(tmp_path / "skills")
    write_jsonl(tmp_path / "in.jsonl", [{"responses_create_params": params("q")}])
    agent = ScriptedAgent()
    paths = CollectionPaths(tmp_path / "out" / "r.jsonl")
    with live_server(agent.app) as url:
        code = run_from_config(config(tmp_path, skills={"path": str(root)}), server_client=agent.client(url))
    assert code == 0
    [row] = read_jsonl(paths.materialized_inputs)
    [result] = read_jsonl(paths.output)
    assert row["skills_ref"]["hash"] == result["skills_ref"]["hash"] and len(row["skills_ref"]["hash"]) == 12
    assert [s["name"] for s in result["skills_ref"]["skills"]] == ["geography", "arithmetic"]

    with pytest.raises(Exception, match=r"\+skills.path=.*not a folder"):
        run_from_config(config(tmp_path, skills={"path": str(tmp_path / "none")}), server_client=agent.client(url))


def test_viewer_indexes_a_v05_run_and_shows_its_lines_unchanged(tmp_path):
    from nemo_gym.workbench.view.index import FAILURES, ROLLOUTS, RolloutIndex
    from nemo_gym.workbench.view.query import RolloutQuery, TableFilter

    out = v05_run(tmp_path / "run", range(2), failures=[v05_line(3, 0, None, "judge_failed"),
                                                       v05_line(3, 0, 1, "judge_failed")])
    ix = RolloutIndex(out, tmp_path / "cache")
    ix.update()
    query = RolloutQuery([ix])
    failed = query.rows(TableFilter(failed_only=True))["rows"]
    assert [(r["source"], r["task"], r["agent"], r["error_type"]) for r in failed] == [
        (FAILURES, 3, "agent", "judge_failed")] * 2
    ok = [r for r in query.rows()["rows"] if r["source"] == ROLLOUTS]
    assert sorted(r["task"] for r in ok) == [0, 1]
    info, line = query.row(0, ok[0]["id"])
    shown = json.loads(line)
    assert shown[A] == 1 and shown["skills_ref"]["hash"] == "h" and shown["agent_ref"] == {"name": "agent"}
    _, failure_line = query.row(0, failed[1]["id"])
    assert json.loads(failure_line)["_ng_failure_terminal"] is False


def test_aggregation_refuses_a_torn_shard_line_unless_told_to_skip_it(tmp_path):
    a = v05_run(tmp_path / "a", range(0, 4), failures=[])
    with open(a, "a") as f:
        f.write('{"_ng_task_index": 9, "_ng_rollout_index": 0, "reward"')  # torn: the writer died mid-line
    with pytest.raises(BadLinesRefused) as refused:
        load_sorted_rollouts([a])
    message = str(refused.value)
    assert message.startswith(f"{a}:5: not valid JSON"), message
    assert "nothing was merged or aggregated" in message and "--skip-bad-lines" in message
    inputs = load_sorted_rollouts([a], skip_bad_lines=True)
    assert [r[T] for r in inputs.rollouts] == [0, 1, 2, 3] and inputs.unreadable == 1
