"""The compact per-row bookkeeping of a collection (`nemo_gym.rollouts.row_keys`): the task-index map that spills
to SQLite, and the finished-rollouts bitmap used on resume."""

from __future__ import annotations

import hashlib
import json
import random
from pathlib import Path
from typing import Any

import orjson
import pytest

from nemo_gym.rollouts.collection import (
    CollectionPaths,
    RolloutCollectionConfig,
    rollout_key,
    iter_materialized_rows,
    iter_pending_rows,
    read_finished_keys,
    run_from_config,
)
from nemo_gym.rollouts.row_keys import FinishedRollouts, RolloutKeySpace, TaskIndexMap

T, R = "_ng_task_index", "_ng_rollout_index"


def digest(i: int) -> bytes:
    return hashlib.blake2b(str(i).encode(), digest_size=16).digest()


class ReferenceMap:
    """The plain-dict behaviour the map must keep."""

    def __init__(self) -> None:
        self.task: dict[bytes, int] = {}
        self.next: list[int] = []

    def claim(self, d: bytes, n: int) -> tuple[int, int]:
        if d not in self.task:
            self.task[d] = len(self.next)
            self.next.append(0)
        t = self.task[d]
        first = self.next[t]
        self.next[t] += n
        return t, first


@pytest.mark.parametrize("spill_after", [0, 1, 7, 100, 10_000])
def test_task_map_matches_a_plain_dict_before_and_after_spilling(spill_after):
    rng = random.Random(spill_after)
    ref = ReferenceMap()
    ids = list(range(300))
    seq = [rng.choice(ids[: 20 + i // 3]) for i in range(1500)]  # duplicates before and after the spill point
    with TaskIndexMap(spill_after=spill_after) as m:
        for i in seq:
            n = rng.choice([0, 1, 1, 3])
            assert m.claim(digest(i), n) == ref.claim(digest(i), n)
            assert len(m) == len(ref.next)
        assert m.spilled == (len(ref.next) > spill_after)
    assert not m.spilled  # closed


def test_task_map_keys_are_whole_digests_not_prefixes_or_hashes():
    base = bytes(16)
    near = [base[:15] + bytes([i]) for i in range(5)] + [bytes([1]) + base[1:], base[:8] + bytes([255]) * 8]
    for spill_after in (0, 3, 100):
        with TaskIndexMap(spill_after=spill_after) as m:
            assert [m.claim(d, 1)[0] for d in near] == list(range(len(near)))
            assert [m.claim(d, 2) for d in near] == [(i, 1) for i in range(len(near))]
            assert [m.claim(d, 1) for d in reversed(near)] == [(i, 3) for i in reversed(range(len(near)))]


def _lines(texts):
    return [json.dumps({"responses_create_params": {"input": t}}) for t in texts]


def test_materialized_indices_are_the_same_whether_or_not_the_map_spilled():
    rng = random.Random(5)
    texts = [f"q{rng.randrange(40)}" for _ in range(200)]
    kw = dict(agent_name="g", num_repeats=2, num_repeats_add_seed=True, validate_params=False)
    small = [(r[T], r[R], r["responses_create_params"]["seed"]) for r in iter_materialized_rows(_lines(texts), **kw)]
    spilled = [
        (r[T], r[R], r["responses_create_params"]["seed"])
        for r in iter_materialized_rows(_lines(texts), spill_after=3, **kw)
    ]
    assert small == spilled
    # v0.2 numbering: first distinct line 0, the next 1, ...; a repeated line continues its task's rollouts.
    order = list(dict.fromkeys(texts))
    seen: dict[str, int] = {}
    expected = []
    for t in texts:
        for _ in range(2):
            expected.append((order.index(t), seen.get(t, 0), seen.get(t, 0)))
            seen[t] = seen.get(t, 0) + 1
    assert small == expected


# ------------------------------------------------------------------------------------------ key space, bitmap


def space_of(pairs):
    return RolloutKeySpace.from_pairs(lambda: iter(pairs))


def test_regular_materialization_needs_no_per_task_state_and_maps_rows_one_to_one():
    pairs = [(t, r) for t in range(4) for r in range(3)]
    space = space_of(pairs)
    assert (space.layout, space.size, space.tasks, space.offsets) == ("uniform", 12, 4, None)
    assert sorted(space.position(t, r) for t, r in pairs) == list(range(12))
    for t, r in [(0, 3), (4, 0), (-1, 0), (0, -1), (1 << 20, 1)]:
        assert space.position(t, r) is None
    assert space_of([(0, i) for i in range(5)]).layout == "uniform"
    assert space_of([]).size == 0


@pytest.mark.parametrize(
    "pairs",
    [
        [(0, 0), (0, 1), (1, 0), (1, 1), (0, 2), (0, 3), (2, 0), (2, 1)],  # a duplicate line of task 0
        [(0, 0), (0, 1), (1, 0)],  # short last task
        [(0, 0), (1, 0), (0, 1), (1, 1)],  # same counts, other order
        [(0, 0), (1, 0), (1, 1), (2, 0), (1, 2)],
    ],
)
def test_irregular_materialization_uses_offsets_and_keeps_keys_apart(pairs):
    space = space_of(pairs)
    assert space.layout == "offsets"
    positions = [space.position(t, r) for t, r in pairs]
    assert None not in positions and len(set(positions)) == len(pairs)
    assert all(0 <= p < space.size for p in positions)
    counts: dict[int, int] = {}
    for t, r in pairs:
        counts[t] = max(counts.get(t, 0), r + 1)
    for t, c in counts.items():
        assert space.position(t, c) is None  # would alias into the next task's bits
    assert space.position(max(counts) + 1, 0) is None


@pytest.mark.parametrize("pairs", [[(0, 0), (5, 0)], [(0, -1), (0, 0)], [(-2, 0)]])
def test_indices_that_no_materialization_writes_fall_back_to_a_set(pairs):
    space = space_of(pairs)
    assert space.layout == "sparse"
    finished = FinishedRollouts(space)
    for t, r in pairs:
        finished.add(rollout_key(t, r))
    assert all(rollout_key(t, r) in finished for t, r in pairs) and len(finished) == len(set(pairs))


@pytest.mark.parametrize(
    "pairs",
    [
        [(t, r) for t in range(50) for r in range(4)],
        [(0, 0), (0, 1), (1, 0), (1, 1), (0, 2), (0, 3), (2, 0), (2, 1)],
    ],
)
def test_finished_bitmap_behaves_like_the_set_of_keys_of_these_rows(pairs):
    rng = random.Random(1)
    finished = FinishedRollouts(space_of(pairs))
    chosen = {rollout_key(t, r) for t, r in pairs if rng.random() < 0.5}
    for k in list(chosen) * 2:  # added twice: counted once
        finished.add(k)
    finished.add(rollout_key(999, 0))  # not a row: ignored
    finished.add(rollout_key(0, 999))
    assert len(finished) == len(chosen) and bool(finished) == bool(chosen)
    assert set(finished) == chosen
    assert [rollout_key(t, r) in finished for t, r in pairs] == [rollout_key(t, r) in chosen for t, r in pairs]
    assert rollout_key(999, 0) not in finished and "x" not in finished


def test_pending_rows_with_the_bitmap_are_those_with_the_set(tmp_path):
    rows = [{T: t, R: r, "x": i} for i, (t, r) in enumerate([(0, 0), (0, 1), (1, 0), (0, 2), (2, 0), (1, 1)])]
    mat = tmp_path / "m.jsonl"
    mat.write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in rows))
    out = tmp_path / "o.jsonl"
    out.write_text("".join(json.dumps({T: t, R: r}) + "\n" for t, r in [(0, 1), (2, 0), (0, 2), (7, 7)]) + "not json\n")
    as_set, bad_set = read_finished_keys(out)
    space = RolloutKeySpace.from_pairs(lambda: ((r[T], r[R]) for r in rows))
    as_bits, bad_bits = read_finished_keys(out, into=FinishedRollouts(space))
    assert bad_set == bad_bits == 1
    assert [r["x"] for r in iter_pending_rows(mat, as_bits)] == [r["x"] for r in iter_pending_rows(mat, as_set)] == [0, 2, 5]


# ------------------------------------------------------------------------------------------ resume end to end


class _Answer:
    status_code = 200

    def __init__(self, content: bytes) -> None:
        self.content = content


class _Agent:
    def __init__(self) -> None:
        self.calls: list[tuple[int, int]] = []
        self.failing: set[int] = set()
        self.global_config_dict = {"agent": {"responses_api_agents": {"x": {}}}}

    async def post(self, server_name: str, path: str, json: Any = None, **_: Any) -> Any:
        self.calls.append((json[T], json[R]))
        if json[T] in self.failing:
            answer = _Answer(b"down")
            answer.status_code = 400
            return answer
        return _Answer(orjson.dumps({"reward": 1.0}))


def test_resume_with_duplicate_lines_runs_exactly_the_missing_rollouts(tmp_path):
    texts = ["a", "b", "a", "c", "b", "d"]  # tasks a=0 (4 rollouts), b=1 (4), c=2 (2), d=3 (2)
    (tmp_path / "in.jsonl").write_text("\n".join(_lines(texts)) + "\n")
    cfg = dict(input_jsonl_fpath=str(tmp_path / "in.jsonl"), output_jsonl_fpath=str(tmp_path / "out.jsonl"),
               agent_name="agent", num_repeats=2, progress_bar=False, max_attempts=1,
               disable_aggregation=True)  # the fake agent answers /run only
    agent = _Agent()
    agent.failing = {1}
    assert run_from_config(RolloutCollectionConfig(**cfg), server_client=agent, profile=False) == 1
    everything = {(t, r) for t, n in [(0, 4), (1, 4), (2, 2), (3, 2)] for r in range(n)}
    assert set(agent.calls) == everything
    out = CollectionPaths(Path(cfg["output_jsonl_fpath"])).output
    kept = [line for line in out.read_text().splitlines() if (json.loads(line)[T], json.loads(line)[R]) != (0, 3)]
    out.write_text("\n".join(kept) + "\n")  # (0, 3) "lost"
    agent.calls.clear()
    agent.failing = set()
    assert run_from_config(RolloutCollectionConfig(**cfg, resume_from_cache=True), server_client=agent, profile=False) == 0
    assert sorted(agent.calls) == [(0, 3), (1, 0), (1, 1), (1, 2), (1, 3)]
    final = [json.loads(line) for line in out.read_text().splitlines()]
    assert sorted((r[T], r[R]) for r in final) == sorted(everything)


def test_finished_keys_cost_a_bit_per_row_not_a_set_entry():
    import tracemalloc

    rows = 200_000
    space = RolloutKeySpace.from_pairs(lambda: ((i // 2, i % 2) for i in range(rows)))
    tracemalloc.start()
    try:
        finished = FinishedRollouts(space)
        for i in range(rows):
            finished.add(rollout_key(i // 2, i % 2))
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert len(finished) == rows
    # A set of 200k packed ints takes about 18 MB; the bitmap 25 KB.
    assert peak < 100_000, peak
