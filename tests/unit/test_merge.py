"""Sharded collections and `ng merge`: which rows a shard runs, a sharded `run_from_config` (an in-process stand-in
for the agent server), merging with duplicates and failures, refusing shards of different runs, and the CLI."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import orjson
import pytest

from nemo_gym.cli import find_command
from nemo_gym.errors import NeMoGymConfigError
from nemo_gym.rollouts.collection import (
    CollectionPaths,
    RolloutCollectionConfig,
    iter_pending_rows,
    materialize_input_file,
    run_from_config,
)
from nemo_gym.rollouts.jsonl import BadLinesRefused
from nemo_gym.rollouts.merge import Shard, merge_shards, parse_shard
from nemo_gym.rollouts.reward_profile import profile_rollouts

T, R = "_ng_task_index", "_ng_rollout_index"
AGENT = "agent"


def write_tasks(path: Path, n: int) -> Path:
    path.write_text("".join(json.dumps({"responses_create_params": {"input": f"q{i}"}, "x": i}) + "\n" for i in range(n)))
    return path


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def by_key(rows: list[dict]) -> list[dict]:
    return sorted(rows, key=lambda r: (r[T], r[R]))


@dataclass
class _Answer:
    status_code: int
    content: bytes


class ScoringAgent:
    """Stands in for an agent server's /run: reward 1 when x + rollout index is even; rows listed in `fail` get 503."""

    def __init__(self, fail: frozenset = frozenset()) -> None:
        self.global_config_dict = {AGENT: {"responses_api_agents": {"simple_agent": {}}}}
        self.fail = fail
        self.seen: list[tuple[int, int]] = []

    async def post(self, server_name, path, json=None, **_):
        key = (json[T], json[R])
        self.seen.append(key)
        if key in self.fail:
            return _Answer(503, b"overloaded")
        return _Answer(200, orjson.dumps({"reward": float((json["x"] + json[R]) % 2 == 0), "x": json["x"]}))


def collect(tmp_path: Path, out: Path, agent: ScoringAgent, **options) -> int:
    config = RolloutCollectionConfig(
        input_jsonl_fpath=str(tmp_path / "tasks.jsonl"),
        output_jsonl_fpath=str(out),
        agent_name=AGENT,
        num_repeats=3,
        progress_bar=False,
        max_attempts=1,
        disable_aggregation=True,  # the fake agent answers /run only; aggregation is tested on its own
        **options,
    )
    return run_from_config(config, server_client=agent)


# ------------------------------------------------------------------------------------------------ shards


def test_parse_shard_and_membership():
    assert parse_shard(None) is None
    shard = parse_shard(" 2 / 3 ")
    assert shard == Shard(2, 3) and str(shard) == "2/3"
    assert [t for t in range(9) if t in shard] == [1, 4, 7]
    for bad in ("0/2", "3/2", "1/0", "a/b", "2", "-1/2"):
        with pytest.raises(ValueError, match=r"\+shard="):
            parse_shard(bad)


def test_a_bad_shard_is_a_config_error_naming_the_key():
    with pytest.raises(Exception, match=r"shard"):
        RolloutCollectionConfig(input_jsonl_fpath="a.jsonl", output_jsonl_fpath="b.jsonl", shard="5/4")
    assert RolloutCollectionConfig(input_jsonl_fpath="a", output_jsonl_fpath="b", shard="1/2").shard == "1/2"


def test_iter_pending_rows_keeps_the_shards_tasks_with_their_unsharded_indices(tmp_path):
    mat = tmp_path / "m.jsonl"
    materialize_input_file(write_tasks(tmp_path / "tasks.jsonl", 5), mat, agent_name=AGENT, num_repeats=2)
    got = [(r[T], r[R]) for r in iter_pending_rows(mat, shard=Shard(2, 2))]
    assert got == [(1, 0), (1, 1), (3, 0), (3, 1)]
    assert [(r[T], r[R]) for r in iter_pending_rows(mat, {(3 << 32) | 1}, Shard(2, 2))] == [(1, 0), (1, 1), (3, 0)]


def test_sharded_collections_merge_into_the_unsharded_run(tmp_path, capsys):
    write_tasks(tmp_path / "tasks.jsonl", 7)
    assert collect(tmp_path, tmp_path / "full" / "r.jsonl", ScoringAgent()) == 0
    shard_outs = []
    for i in (1, 2, 3):
        agent = ScoringAgent()
        out = tmp_path / f"s{i}" / "r.jsonl"
        assert collect(tmp_path, out, agent, shard=f"{i}/3") == 0
        assert sorted({t for t, _ in agent.seen}) == [t for t in range(7) if t % 3 == i - 1]
        shard_outs.append(out)
    assert "Shard 2/3: 6 of the 21 rollouts" in capsys.readouterr().err

    report = merge_shards(shard_outs, tmp_path / "merged" / "r.jsonl")
    assert report.complete and (report.rollouts, report.total_rows, report.duplicates) == (21, 21, 0)
    full, merged = CollectionPaths(tmp_path / "full" / "r.jsonl"), CollectionPaths(tmp_path / "merged" / "r.jsonl")
    assert by_key(read_jsonl(merged.output)) == by_key(read_jsonl(full.output))
    assert merged.materialized_inputs.read_bytes() == full.materialized_inputs.read_bytes()
    assert read_jsonl(merged.reward_profiling) == read_jsonl(full.reward_profiling)
    assert json.loads(merged.agent_metrics.read_text()) == json.loads(full.agent_metrics.read_text())
    assert not merged.failures.exists()


def test_duplicates_are_dropped_and_failures_that_succeeded_elsewhere_go(tmp_path):
    write_tasks(tmp_path / "tasks.jsonl", 4)
    # Shard 1 fails (0, 1) and (2, 2); a rerun of the whole of shard 1 as "shard 1b" succeeds for (0, 1) only.
    a, b, c = (tmp_path / n / "r.jsonl" for n in ("a", "b", "c"))
    assert collect(tmp_path, a, ScoringAgent(frozenset({(0, 1), (2, 2)})), shard="1/2") == 1
    assert collect(tmp_path, b, ScoringAgent(frozenset({(2, 2)})), shard="1/2") == 1
    assert collect(tmp_path, c, ScoringAgent(), shard="2/2") == 0

    out = tmp_path / "m" / "r.jsonl"
    report = merge_shards([a, b, c], out)
    assert report.rollouts == 11 and report.total_rows == 12
    assert report.duplicates == 4  # b repeats the four successes of a; (0, 1) is new in b
    assert report.duplicate_examples[0].startswith(f"{b}:")
    assert (report.failures, report.failures_succeeded_elsewhere, report.failure_duplicates) == (1, 1, 1)
    assert report.missing == 0 and not report.complete
    keys = sorted((r[T], r[R]) for r in read_jsonl(out))
    assert keys == sorted({(t, r) for t in range(4) for r in range(3)} - {(2, 2)})
    failures = read_jsonl(CollectionPaths(out).failures)
    assert [(f[T], f[R], f["error_type"]) for f in failures] == [(2, 2, "HTTPError")]
    text = "\n".join(report.lines())
    assert "Dropped 4 duplicate rollout(s)" in text and "1 rollout(s) failed" in text

    # Without shard b's rerun and shard c, (0, 1) failed and tasks 1 and 3 are missing.
    report = merge_shards([a], tmp_path / "m2" / "r.jsonl")
    assert (report.rollouts, report.failures, report.missing) == (4, 2, 6)
    assert "6 rollout(s) of the materialized inputs are in no shard" in "\n".join(report.lines())


def test_merged_profile_is_the_profile_of_the_merged_file(tmp_path):
    write_tasks(tmp_path / "tasks.jsonl", 5)
    outs = [tmp_path / f"s{i}" / "r.jsonl" for i in (1, 2)]
    for i, out in enumerate(outs, start=1):
        collect(tmp_path, out, ScoringAgent(), shard=f"{i}/2")
    merged = CollectionPaths(tmp_path / "m" / "r.jsonl")
    merge_shards(outs, merged.output, pass_threshold=0.5)
    summary = profile_rollouts(
        merged.materialized_inputs, merged.output, pass_threshold=0.5,
        reward_profiling_path=tmp_path / "p.jsonl", agent_metrics_path=tmp_path / "p.json",
    )
    assert summary.num_tasks == 5 and summary.num_rollouts == 15
    assert (tmp_path / "p.jsonl").read_bytes() == merged.reward_profiling.read_bytes()
    assert (tmp_path / "p.json").read_bytes() == merged.agent_metrics.read_bytes()


# ------------------------------------------------------------------------------------------------ refusals


def test_shards_of_different_runs_are_refused_with_the_first_differing_line(tmp_path):
    write_tasks(tmp_path / "tasks.jsonl", 4)
    a, b = tmp_path / "a" / "r.jsonl", tmp_path / "b" / "r.jsonl"
    collect(tmp_path, a, ScoringAgent(), shard="1/2")
    write_tasks(tmp_path / "tasks.jsonl", 5)  # a different input for the "second shard"
    collect(tmp_path, b, ScoringAgent(), shard="2/2")
    out = tmp_path / "m" / "r.jsonl"
    with pytest.raises(NeMoGymConfigError, match=r"not shards of one run: their materialized inputs differ at line 13"):
        merge_shards([a, b], out)
    assert not out.exists()


def test_a_rollout_that_is_not_a_row_of_the_run_is_refused_naming_its_line(tmp_path):
    write_tasks(tmp_path / "tasks.jsonl", 2)
    a = tmp_path / "a" / "r.jsonl"
    collect(tmp_path, a, ScoringAgent())
    with open(a, "ab") as f:
        f.write(orjson.dumps({T: 9, R: 0, "reward": 1.0}) + b"\n")
    with pytest.raises(NeMoGymConfigError, match=rf"{a}:7: rollout \(task 9, rollout 0\) is not a row of"):
        merge_shards([a], tmp_path / "m" / "r.jsonl")
    assert not (tmp_path / "m" / "r.jsonl").exists()


def test_missing_files_and_bad_outputs_are_refused(tmp_path):
    write_tasks(tmp_path / "tasks.jsonl", 2)
    a = tmp_path / "a" / "r.jsonl"
    collect(tmp_path, a, ScoringAgent())
    with pytest.raises(NeMoGymConfigError, match="Shard file not found"):
        merge_shards([a, tmp_path / "nope.jsonl"], tmp_path / "m.jsonl")
    with pytest.raises(NeMoGymConfigError, match="given twice"):
        merge_shards([a, a], tmp_path / "m.jsonl")
    with pytest.raises(NeMoGymConfigError, match="would overwrite"):
        merge_shards([a], a)
    lone = tmp_path / "lone.jsonl"
    lone.write_bytes(a.read_bytes())
    with pytest.raises(NeMoGymConfigError, match="lone_materialized_inputs.jsonl not found"):
        merge_shards([lone], tmp_path / "m.jsonl")


def test_a_torn_last_line_is_refused_or_skipped_with_the_flag(tmp_path):
    write_tasks(tmp_path / "tasks.jsonl", 2)
    a = tmp_path / "a" / "r.jsonl"
    collect(tmp_path, a, ScoringAgent())
    with open(a, "ab") as f:
        f.write(b'{"_ng_task_index": 1, "rew')
    out = tmp_path / "m" / "r.jsonl"
    with pytest.raises(BadLinesRefused) as info:
        merge_shards([a], out)
    assert str(info.value).startswith(f"{a}:7: not valid JSON (unexpected end of data")
    assert "the last line has no newline" in str(info.value) and "--skip-bad-lines" in str(info.value)
    assert not out.parent.exists() or not list(out.parent.iterdir())  # nothing written, no temporary file left

    report = merge_shards([a], out, skip_bad_lines=True)
    assert report.rollouts == 6 and report.bad_lines.count == 1 and report.complete
    assert "6 / 6 rollouts; skipped 1 bad line." in report.lines()[0]


def test_rows_without_indices_are_skipped_and_shards_without_rollouts_write_nothing(tmp_path):
    write_tasks(tmp_path / "tasks.jsonl", 2)
    a = tmp_path / "a" / "r.jsonl"
    collect(tmp_path, a, ScoringAgent())
    with open(a, "ab") as f:
        f.write(b'{"note": "added by hand"}\n')
    report = merge_shards([a], tmp_path / "m" / "r.jsonl")
    assert report.rollouts == 6 and report.unkeyed_rows == 1 and report.complete
    assert f"without `_ng_task_index` / `_ng_rollout_index`, so not rollouts of a collection (the first: {a}:7)" in (
        "\n".join(report.lines())
    )

    empty = tmp_path / "e" / "r.jsonl"
    empty.parent.mkdir()
    empty.write_text("")
    (tmp_path / "e" / "r_materialized_inputs.jsonl").write_bytes(CollectionPaths(a).materialized_inputs.read_bytes())
    out = tmp_path / "n" / "r.jsonl"
    report = merge_shards([empty], out)
    assert not report.written and not report.complete and not list(out.parent.iterdir())
    assert report.lines()[0].startswith("Nothing merged: the 1 shard(s) hold no rollout (0 failed)")


# ------------------------------------------------------------------------------------------------ CLI


def test_merge_command(tmp_path, capsys, monkeypatch):
    write_tasks(tmp_path / "tasks.jsonl", 3)
    a, b = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    collect(tmp_path, a, ScoringAgent(), shard="1/2")
    collect(tmp_path, b, ScoringAgent(), shard="2/2")
    capsys.readouterr()
    monkeypatch.chdir(tmp_path)
    merge = find_command("merge")
    assert merge.main(["a.jsonl", "b.jsonl", "-o", "out/all.jsonl"]) == 0
    printed = capsys.readouterr().out
    assert "Merged 2 shard(s) into out/all.jsonl: 9 / 9 rollouts." in printed and "Reward profile" in printed
    assert (tmp_path / "out" / "all_agent_metrics.json").exists()
    assert (tmp_path / "out" / "all_reward_profiling.jsonl").exists()

    assert merge.main(["+input_jsonl_fpath=a.jsonl", "+output_jsonl_fpath=part.jsonl"]) == 1  # shard 2 missing
    assert "in no shard" in capsys.readouterr().out
    assert merge.main(["a.jsonl", "missing.jsonl", "-o", "x.jsonl"]) == 2
    assert "error: ng_merge: Shard file not found: missing.jsonl" in capsys.readouterr().err

    bad_line = len(b.read_text().splitlines()) + 1
    with open(b, "a") as f:
        f.write("[1, 2]\n")  # a bad line: refused, the earlier merge left as it was
    before = (tmp_path / "out" / "all.jsonl").read_bytes()
    assert merge.main(["a.jsonl", "b.jsonl", "-o", "out/all.jsonl"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: ng_merge: b.jsonl:{bad_line}: a JSON list, not an object\n1 bad line")
    assert (tmp_path / "out" / "all.jsonl").read_bytes() == before
    assert merge.main(["a.jsonl", "b.jsonl", "-o", "out/all.jsonl", "--skip-bad-lines"]) == 0
    captured = capsys.readouterr()
    assert "9 / 9 rollouts; skipped 1 bad line." in captured.out
    assert "warning: ng_merge: skipped 1 bad line (--skip-bad-lines):\n  b.jsonl:" in captured.err
    assert find_command("ng_merge") is merge and find_command("nemo_gym_merge") is merge
