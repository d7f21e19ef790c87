"""Rollout collection: preprocessing, validation, the rollout iterator (retries, failures, bounded work), resume,
and the command itself against an in-process agent (httpx.MockTransport behind the real ServerClient)."""

from __future__ import annotations

import asyncio
import json
import tracemalloc
from pathlib import Path
from typing import Any, Callable

import httpx
import orjson
import pytest
from fastapi import FastAPI, Request, Response

from nemo_gym.cli import find_command
from nemo_gym.errors import NeMoGymConfigError
from nemo_gym.rollouts.collection import (
    ROLLOUT_INDEX_KEY_NAME,
    TASK_INDEX_KEY_NAME,
    CollectionPaths,
    InputValidationError,
    RolloutCollectionConfig,
    agent_names_in_config,
    iter_materialized_rows,
    iter_pending_rows,
    iter_rollouts,
    materialize_input_file,
    read_finished_keys,
    repair_jsonl_tail,
    run_from_config,
)
from nemo_gym.http.client import ServerClient
from nemo_gym.testing.live_server import live_server
from tests.unit.test_retry import slept  # noqa: F401  (fixture)

T, R = TASK_INDEX_KEY_NAME, ROLLOUT_INDEX_KEY_NAME


def line(**row: Any) -> str:
    return json.dumps(row)


def params(text: str = "hi", **extra: Any) -> dict:
    return {"input": text, **extra}


def keys(rows) -> list[tuple[int, int]]:
    return [(r[T], r[R]) for r in rows]


def write_jsonl(path: Path, rows: list) -> Path:
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return path


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()]


# ------------------------------------------------------------------------------------------- preprocessing


def test_limit_and_repeats_give_task_major_order_with_exact_rows():
    lines = [line(responses_create_params=params(f"q{i}"), expected=i) for i in range(5)]
    rows = list(iter_materialized_rows(lines, limit=3, num_repeats=2, agent_name="agent"))
    assert keys(rows) == [(0, 0), (0, 1), (1, 0), (1, 1), (2, 0), (2, 1)]
    assert rows[0] == {
        "responses_create_params": {"input": "q0"},
        "expected": 0,
        "agent_ref": {"name": "agent"},
        T: 0,
        R: 0,
    }
    assert rows[5] == {
        "responses_create_params": {"input": "q2"},
        "expected": 2,
        "agent_ref": {"name": "agent"},
        T: 2,
        R: 1,
    }


def test_defaults_one_rollout_per_line_and_no_seed():
    lines = [line(responses_create_params=params(f"q{i}")) for i in range(3)]
    rows = list(iter_materialized_rows(lines, agent_name="a"))
    assert keys(rows) == [(0, 0), (1, 0), (2, 0)]
    assert all("seed" not in r["responses_create_params"] for r in rows)


def test_num_repeats_add_seed_sets_the_rollout_index_as_seed():
    lines = [line(responses_create_params=params("a", seed=99)), line(responses_create_params=params("b"))]
    rows = list(iter_materialized_rows(lines, agent_name="a", num_repeats=3, num_repeats_add_seed=True))
    assert [(r[T], r[R], r["responses_create_params"]["seed"]) for r in rows] == [
        (0, 0, 0), (0, 1, 1), (0, 2, 2), (1, 0, 0), (1, 1, 1), (1, 2, 2),
    ]


def test_overrides_are_merged_shallowly_over_each_rows_params():
    lines = [line(responses_create_params=params("a", temperature=1.0, max_output_tokens=5, top_p=0.9))]
    (row,) = iter_materialized_rows(
        lines, agent_name="a", responses_create_params={"temperature": 0.2, "max_output_tokens": 64}
    )
    assert row["responses_create_params"] == {"input": "a", "temperature": 0.2, "max_output_tokens": 64, "top_p": 0.9}


def test_agent_name_only_fills_rows_without_an_agent():
    lines = [
        line(responses_create_params=params("a"), agent_ref={"type": "responses_api_agents", "name": "theirs"}),
        line(responses_create_params=params("b")),
        line(responses_create_params=params("c"), agent_ref={"type": "responses_api_agents"}),
    ]
    rows = list(iter_materialized_rows(lines, agent_name="mine"))
    assert [r["agent_ref"] for r in rows] == [
        {"type": "responses_api_agents", "name": "theirs"},
        {"name": "mine"},
        {"type": "responses_api_agents", "name": "mine"},
    ]


def test_row_without_any_agent_is_an_error_naming_the_line():
    lines = [line(responses_create_params=params("a"), agent_ref={"name": "x"}), line(responses_create_params=params("b"))]
    with pytest.raises(InputValidationError) as err:
        list(iter_materialized_rows(lines, source="data.jsonl"))
    assert "data.jsonl:2: no agent" in str(err.value)
    assert isinstance(err.value, ValueError)  # the reference raised ValueError


def test_identical_lines_share_a_task_index_and_continue_its_rollout_numbering():
    a = line(responses_create_params=params("same"), x=1)
    b = line(responses_create_params=params("other"))
    rows = list(iter_materialized_rows([a, b, "  " + a + "  ", b, a], agent_name="g", num_repeats=2))
    assert keys(rows) == [(0, 0), (0, 1), (1, 0), (1, 1), (0, 2), (0, 3), (1, 2), (1, 3), (0, 4), (0, 5)]
    # A line that differs in any byte is a different task.
    c = line(responses_create_params=params("same"), x=2)
    assert keys(iter_materialized_rows([a, c], agent_name="g")) == [(0, 0), (1, 0)]


def test_blank_lines_are_skipped_and_do_not_count_toward_the_limit():
    lines = ["", line(responses_create_params=params("a")), "   ", line(responses_create_params=params("b")), line(responses_create_params=params("c"))]
    rows = list(iter_materialized_rows(lines, agent_name="g", limit=2))
    assert [r["responses_create_params"]["input"] for r in rows] == ["a", "b"]


def test_repeats_are_independent_copies():
    lines = [line(responses_create_params=params("a", metadata={"k": "v"}), nested={"list": [1]})]
    first, second = iter_materialized_rows(lines, agent_name="g", num_repeats=2)
    first["nested"]["list"].append(2)
    first["responses_create_params"]["metadata"]["k"] = "changed"
    assert second["nested"] == {"list": [1]}
    assert second["responses_create_params"]["metadata"] == {"k": "v"}


# ---------------------------------------------------------------------------------------------- validation


def test_every_bad_line_is_reported_with_file_and_line_before_anything_is_written(tmp_path):
    good = {"responses_create_params": params("ok"), "agent_ref": {"name": "simple_agent"}}
    src = write_jsonl(
        tmp_path / "in.jsonl",
        [
            good,  # 1
            '{"responses_create_params": {"input": "x"',  # 2 malformed
            {"question": "no params"},  # 3
            {"responses_create_params": params("a"), "agent_ref": {"type": "responses_api_agents"}},  # 4: no agent name
            {"responses_create_params": params("a"), "agent_ref": {"name": "simple_agnet"}},  # 5 unknown agent
            "[1, 2]",  # 6 not an object
            {"responses_create_params": {"input": "a", "temprature": 0.5}},  # 7 strict params
            {"responses_create_params": "just text"},  # 8
        ],
    )
    out = tmp_path / "out_materialized_inputs.jsonl"
    with pytest.raises(InputValidationError) as err:
        materialize_input_file(src, out, known_agents={"simple_agent"}, agent_name=None)
    message = str(err.value)
    assert err.value.total == 7
    assert [p.line for p in err.value.problems] == [2, 3, 4, 5, 6, 7, 8]
    assert f"{src}:2: invalid JSON" in message
    assert f"{src}:3: missing `responses_create_params`" in message
    assert f"{src}:4: no agent" in message
    assert f"{src}:5: unknown agent `simple_agnet`" in message and "Did you mean `simple_agent`?" in message
    assert f"{src}:6: expected a JSON object" in message
    assert f"{src}:7: invalid responses_create_params" in message and "temprature" in message
    assert f"{src}:8: `responses_create_params` must be an object" in message
    assert not out.exists()
    assert not list(tmp_path.glob("*.tmp*"))


def test_lines_after_the_limit_are_not_validated(tmp_path):
    src = write_jsonl(tmp_path / "in.jsonl", [{"responses_create_params": params("a")}, "not json"])
    out = tmp_path / "m.jsonl"
    stats = materialize_input_file(src, out, limit=1, agent_name="g", known_agents={"g"})
    assert (stats.num_lines, stats.num_tasks, stats.num_rows) == (1, 1, 1)
    assert keys(read_jsonl(out)) == [(0, 0)]


def test_missing_input_file_is_a_config_error(tmp_path):
    with pytest.raises(NeMoGymConfigError, match="Input file not found"):
        materialize_input_file(tmp_path / "nope.jsonl", tmp_path / "m.jsonl", agent_name="g")


def test_agent_names_come_from_agent_blocks_of_the_config():
    cfg = {
        "policy_model": {"responses_api_models": {"openai_model": {"host": "h", "port": 1}}},
        "my_agent": {"responses_api_agents": {"simple_agent": {"host": "h", "port": 2}}},
        "res": {"resources_servers": {"x": {}}},
        "head_server": {"host": "127.0.0.1", "port": 11000},
        "config_paths": ["a.yaml"],
    }
    assert agent_names_in_config(cfg) == ["my_agent"]


# ----------------------------------------------------------------------------------------- bounded memory


def _tiny_rows(n: int):
    for i in range(n):
        yield orjson.dumps(
            {
                "responses_create_params": {"input": [{"role": "user", "content": f"What is {i} + {i}?"}]},
                "expected_answer": str(2 * i),
                "metadata": {"source": "synthetic", "id": i, "tags": ["math", "easy"]},
            }
        )


def _tinier_rows(n: int):
    for i in range(n):
        yield b'{"responses_create_params": {"input": "What is %d + %d?"}, "expected_answer": "%d"}' % (i, i, 2 * i)


def _peak_bytes(fn: Callable[[], None]) -> int:
    tracemalloc.start()
    try:
        fn()
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def test_preprocessing_streams_with_memory_flat_in_the_input_size():
    counted = {}

    def consume(n: int) -> Callable[[], None]:
        def run() -> None:
            count = 0
            # Params validation is left out only to keep the test quick under tracemalloc; it keeps no state.
            for row in iter_materialized_rows(_tinier_rows(n), agent_name="g", num_repeats=2, validate_params=False):
                count += 1
            counted[n] = count

        return run

    small = _peak_bytes(consume(10_000))
    big = _peak_bytes(consume(100_000))
    assert counted == {10_000: 20_000, 100_000: 200_000}
    # The only per-line state is the task-index map (a 16-byte digest and an int per distinct line, about
    # 150 bytes). Holding the two materialized rows of a line (three dicts each) would cost over 1.5 KB.
    per_line = (big - small) / 90_000
    assert per_line < 300, f"{per_line:.0f} bytes per input line"


class _Answer:
    status_code = 200

    def __init__(self, content: bytes) -> None:
        self.content = content


class _InstantAgent:
    """A minimal duck-typed client: answers every /run at once with a reward."""

    def __init__(self) -> None:
        self.in_flight = 0
        self.max_in_flight = 0
        self.global_config_dict = {"g": {"responses_api_agents": {"x": {}}}}

    async def post(self, server_name: str, path: str, json: Any = None, **_: Any) -> httpx.Response:
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        await asyncio.sleep(0)
        self.in_flight -= 1
        return _Answer(orjson.dumps({"reward": 1.0, "echo": json["expected_answer"]}))


def test_whole_pipeline_file_to_file_keeps_memory_flat(tmp_path):
    def run(n: int) -> Callable[[], None]:
        def go() -> None:
            src = tmp_path / f"in{n}.jsonl"
            with open(src, "wb") as f:
                for raw in _tiny_rows(n):
                    f.write(raw + b"\n")
            paths = CollectionPaths(tmp_path / f"out{n}.jsonl")
            materialize_input_file(
                src, paths.materialized_inputs, agent_name="g", known_agents={"g"}, validate_params=False
            )
            client = _InstantAgent()

            async def collect() -> None:
                with open(paths.output, "wb") as out:
                    async for res in iter_rollouts(
                        iter_pending_rows(paths.materialized_inputs), server_client=client, num_samples_in_parallel=32
                    ):
                        assert res.ok
                        out.write(orjson.dumps(res.result) + b"\n")

            asyncio.run(collect())
            assert client.max_in_flight <= 32
            assert sum(1 for _ in open(paths.output, "rb")) == n

        return go

    small = _peak_bytes(run(1_000))
    big = _peak_bytes(run(10_000))
    per_line = (big - small) / 9_000
    assert per_line < 300, f"{per_line:.0f} bytes per input line"


# ------------------------------------------------------------------------------------------ iter_rollouts


def mock_client(handler, agents=("agent",)) -> ServerClient:
    cfg = {name: {"responses_api_agents": {"impl": {"host": "127.0.0.1", "port": 9, "entrypoint": "app.py"}}} for name in agents}
    return ServerClient(global_config_dict=cfg, transport=httpx.MockTransport(handler))


async def collect_all(rows, client, **kw) -> list:
    return [r async for r in iter_rollouts(rows, server_client=client, **{"retry_backoff_s": 0.001, **kw})]


async def test_results_arrive_in_completion_order_with_indices_and_bounded_parallelism():
    in_flight = {"now": 0, "max": 0}
    release: dict[int, asyncio.Event] = {}

    async def handler(request: httpx.Request) -> httpx.Response:
        row = orjson.loads(request.content)
        in_flight["now"] += 1
        in_flight["max"] = max(in_flight["max"], in_flight["now"])
        # Task 0 waits until task 2 has finished: completion order differs from input order.
        if row[T] == 0:
            await release.setdefault(0, asyncio.Event()).wait()
        if row[T] == 2:
            release.setdefault(0, asyncio.Event()).set()
        in_flight["now"] -= 1
        return httpx.Response(200, json={"reward": float(row[T]), "seen_row": row["x"]})

    rows = [{"responses_create_params": params(), "agent_ref": {"name": "agent"}, "x": i, T: i, R: 0} for i in range(6)]
    results = await collect_all(rows, mock_client(handler), num_samples_in_parallel=3)
    order = [r.task_index for r in results]
    assert sorted(order) == list(range(6))
    assert order.index(2) < order.index(0)
    assert in_flight["max"] <= 3
    first = next(r for r in results if r.task_index == 4)
    assert first.ok and first.attempts == 1 and first.agent_name == "agent"
    assert first.result == {"reward": 4.0, "seen_row": 4, T: 4, R: 0, "agent_ref": {"name": "agent"}}  # stamped as v0.5 does


async def test_agent_name_is_used_for_rows_without_agent_ref_and_rows_are_not_mutated():
    seen = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request.url.port)
        return httpx.Response(200, json={"reward": 0.0})

    client = mock_client(handler, agents=("agent", "other"))
    client.global_config_dict["other"]["responses_api_agents"]["impl"]["port"] = 10
    rows = [{"responses_create_params": params()}, {"responses_create_params": params(), "agent_ref": {"name": "other"}}]
    snapshot = json.loads(json.dumps(rows))
    results = await collect_all(rows, client, agent_name="agent")
    assert sorted(seen) == [9, 10]
    assert {r.agent_name for r in results} == {"agent", "other"}
    assert rows == snapshot


async def test_transient_errors_are_retried_then_succeed():
    calls = {"n": 0}

    def handler(request: httpx.Request) -> httpx.Response:
        calls["n"] += 1
        if calls["n"] == 1:
            raise httpx.ConnectError("connection refused", request=request)
        if calls["n"] == 2:
            return httpx.Response(503, text="busy")
        if calls["n"] == 3:
            return httpx.Response(429, text="slow down")
        return httpx.Response(200, json={"reward": 1.0})

    (res,) = await collect_all([{"responses_create_params": params(), T: 0, R: 0}], mock_client(handler), agent_name="agent", max_attempts=4)
    assert res.ok and res.attempts == 4 and res.reward == 1.0


async def test_persistent_5xx_becomes_a_failure_record_after_max_attempts():
    calls = {"n": 0}

    def handler(request: httpx.Request) -> httpx.Response:
        calls["n"] += 1
        return httpx.Response(
            500, text="POST http://127.0.0.1:5/verify (server `math_resources`) failed after 4 attempts: ConnectError"
        )

    row = {"responses_create_params": params(), "agent_ref": {"name": "agent"}, T: 3, R: 1}
    (res,) = await collect_all([row], mock_client(handler), max_attempts=3)
    assert calls["n"] == 3
    assert not res.ok and res.result is None
    record = res.failure_record()
    assert record[T] == 3 and record[R] == 1
    assert record["error_type"] == "HTTPError" and record["status_code"] == 500
    assert record["attempts"] == 3 and record["agent_name"] == "agent"
    assert record["server"] == "math_resources"  # the innermost server the error names
    assert "HTTP 500" in record["message"]
    assert record["row"] == row


async def test_client_errors_are_not_retried():
    calls = {"n": 0}

    def handler(request: httpx.Request) -> httpx.Response:
        calls["n"] += 1
        return httpx.Response(422, json={"detail": "bad"})

    (res,) = await collect_all([{"responses_create_params": params()}], mock_client(handler), agent_name="agent")
    assert calls["n"] == 1 and res.error_type == "HTTPError" and res.status_code == 422 and res.attempts == 1


async def test_connection_errors_exhaust_attempts_and_name_the_agent():
    def handler(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("connection refused", request=request)

    (res,) = await collect_all([{"responses_create_params": params()}], mock_client(handler), agent_name="agent", max_attempts=2)
    assert res.error_type == "ConnectError" and res.attempts == 2 and res.server == "agent"


async def test_a_non_json_answer_and_a_row_without_agent_are_failures_not_exceptions():
    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, text="<html>")

    results = await collect_all(
        [{"responses_create_params": params(), "agent_ref": {"name": "agent"}}, {"responses_create_params": params()}],
        mock_client(handler),
    )
    assert sorted(r.error_type for r in results) == ["InvalidResponse", "NoAgent"]


async def test_request_timeout_is_a_retryable_failure():
    calls = {"n": 0}

    async def handler(request: httpx.Request) -> httpx.Response:
        calls["n"] += 1
        await asyncio.Event().wait()  # never answers
        raise AssertionError

    (res,) = await collect_all(
        [{"responses_create_params": params()}], mock_client(handler), agent_name="agent", request_timeout_s=0.05, max_attempts=2
    )
    assert res.error_type == "Timeout" and res.attempts == 2 and calls["n"] == 2


async def test_retries_follow_the_shared_policy_against_a_real_agent(slept):
    """A real HTTP agent: a 503 with Retry-After is retried after the time it asks for, a 500 is retried (a /run
    is rerun whole, so it counts as idempotent), 422 and 501 are not. Before the shared policy every 5xx was
    retried, 501 included, and Retry-After was ignored."""
    calls: dict[int, int] = {}
    # Per task, the reply to each call (the last one repeats); None is a finished rollout.
    replies = {0: [(503, {"Retry-After": "3"}), None], 1: [(500, {}), (500, {}), None], 2: [(422, {})], 3: [(501, {})]}
    app = FastAPI()

    @app.post("/run")
    async def run(request: Request):
        task = (await request.json())[T]
        calls[task] = calls.get(task, 0) + 1
        reply = replies[task][min(calls[task], len(replies[task])) - 1]
        if reply is None:
            return {"reward": 1.0}
        status, headers = reply
        return Response(f"reply {status}", status_code=status, headers=headers)

    with live_server(app) as url:
        port = int(url.rsplit(":", 1)[1])
        cfg = {"agent": {"responses_api_agents": {"impl": {"host": "127.0.0.1", "port": port}}}}
        rows = [{"responses_create_params": params(), T: t, R: 0} for t in range(4)]
        client = ServerClient(global_config_dict=cfg)
        results = {r.task_index: r for r in await collect_all(rows, client, agent_name="agent", max_attempts=4)}
    assert calls == {0: 2, 1: 3, 2: 1, 3: 1}
    assert [results[t].attempts for t in range(4)] == [2, 3, 1, 1]
    assert results[0].ok and results[1].ok
    assert (results[2].status_code, results[3].status_code) == (422, 501) and results[3].error_type == "HTTPError"
    # One wait for the 503, as long as it asked; two backoffs for the 500s (retry_backoff_s=0.001: at most 0.002 s).
    assert sorted(slept)[-1] == 3.0 and len(slept) == 3 and all(d <= 0.002 for d in sorted(slept)[:2])


async def test_async_iterable_input_and_empty_input():
    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, json={"reward": 0.5})

    async def rows():
        for i in range(4):
            await asyncio.sleep(0)
            yield {"responses_create_params": params(), T: i, R: 0}

    results = await collect_all(rows(), mock_client(handler), agent_name="agent")
    assert sorted(r.task_index for r in results) == [0, 1, 2, 3]
    assert await collect_all([], mock_client(handler), agent_name="agent") == []


async def test_an_error_in_the_row_source_propagates():
    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, json={"reward": 0.5})

    def rows():
        yield {"responses_create_params": params()}
        raise RuntimeError("source broke")

    with pytest.raises(RuntimeError, match="source broke"):
        await collect_all(rows(), mock_client(handler), agent_name="agent")


async def test_closing_the_iterator_early_cancels_rollouts_in_flight():
    started, cancelled = [], []

    async def handler(request: httpx.Request) -> httpx.Response:
        row = orjson.loads(request.content)
        if row[T] == 0:
            return httpx.Response(200, json={"reward": 1.0})
        started.append(row[T])
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            cancelled.append(row[T])
            raise
        raise AssertionError

    rows = [{"responses_create_params": params(), T: i, R: 0} for i in range(4)]
    gen = iter_rollouts(rows, server_client=mock_client(handler), agent_name="agent")
    first = await gen.__anext__()
    assert first.task_index == 0
    await gen.aclose()
    assert sorted(cancelled) == sorted(started)


# ------------------------------------------------------------------------------------------------- resume


def test_repair_cuts_only_a_torn_last_line(tmp_path):
    p = tmp_path / "o.jsonl"
    p.write_bytes(b'{"a": 1}\n{"b": 2}\n{"c": ')
    assert repair_jsonl_tail(p) == len(b'{"c": ')
    assert p.read_bytes() == b'{"a": 1}\n{"b": 2}\n'
    assert repair_jsonl_tail(p) == 0
    p.write_bytes(b'{"only": "torn')
    repair_jsonl_tail(p)
    assert p.read_bytes() == b""
    assert repair_jsonl_tail(tmp_path / "missing.jsonl") == 0


def test_finished_keys_ignore_unreadable_lines(tmp_path):
    p = write_jsonl(tmp_path / "o.jsonl", [{T: 0, R: 0}, "garbage", {T: 1, R: 2}, {"no": "index"}])
    found, bad = read_finished_keys(p)
    assert bad == 2 and len(found) == 2


class FakeStack:
    """An in-process agent: /run answers with the row's `expected` as reward, or fails for chosen tasks."""

    def __init__(self) -> None:
        self.failing: set[int] = set()
        self.calls: list[tuple[int, int]] = []

    def handler(self, request: httpx.Request) -> httpx.Response:
        row = orjson.loads(request.content)
        self.calls.append((row[T], row[R]))
        if row[T] in self.failing:
            return httpx.Response(500, text="resources server unreachable")
        return httpx.Response(200, json={"reward": row["expected"], "correct": row["expected"] == 1.0, "seed": row["responses_create_params"].get("seed")})

    def client(self) -> ServerClient:
        return mock_client(self.handler, agents=("agent",))


def config(tmp_path: Path, **overrides: Any) -> RolloutCollectionConfig:
    base = dict(
        input_jsonl_fpath=str(tmp_path / "in.jsonl"),
        output_jsonl_fpath=str(tmp_path / "out" / "rollouts.jsonl"),
        agent_name="agent",
        retry_backoff_s=0.001,
        progress_bar=False,
        disable_aggregation=True,  # the fake agent answers /run only; aggregation is tested on its own
    )
    return RolloutCollectionConfig(**{**base, **overrides})


def make_input(tmp_path: Path, n: int = 4) -> None:
    write_jsonl(tmp_path / "in.jsonl", [{"responses_create_params": params(f"q{i}"), "expected": float(i % 2)} for i in range(n)])


def test_collection_writes_every_file_and_resume_reruns_failed_and_torn_rollouts_only(tmp_path, capsys):
    make_input(tmp_path)
    stack = FakeStack()
    stack.failing = {1}
    cfg = config(tmp_path, num_repeats=2, num_repeats_add_seed=True, max_attempts=2)
    paths = CollectionPaths(Path(cfg.output_jsonl_fpath))

    assert run_from_config(cfg, server_client=stack.client()) == 1
    out = read_jsonl(paths.output)
    assert sorted(keys(out)) == [(0, 0), (0, 1), (2, 0), (2, 1), (3, 0), (3, 1)]
    assert {(r[T], r[R]): r["seed"] for r in out} == {(0, 0): 0, (0, 1): 1, (2, 0): 0, (2, 1): 1, (3, 0): 0, (3, 1): 1}
    failures = read_jsonl(paths.failures)
    assert sorted((f[T], f[R]) for f in failures) == [(1, 0), (1, 1)]
    assert all(f["attempts"] == 2 and f["status_code"] == 500 and f["row"]["expected"] == 1.0 for f in failures)
    assert keys(read_jsonl(paths.materialized_inputs)) == [(t, r) for t in range(4) for r in range(2)]
    assert paths.reward_profiling.exists() and paths.agent_metrics.exists()
    assert "2 rollout(s) failed" in capsys.readouterr().err

    # The process died while writing a line: a torn tail. One finished rollout is also "lost" from the file.
    kept = [json.dumps(r) for r in out if (r[T], r[R]) != (3, 1)]
    paths.output.write_text("\n".join(kept) + "\n" + '{"reward": 1.0, "_ng_task_index": 3, "_ng_rol')
    stack.failing = set()
    stack.calls.clear()
    assert run_from_config(config(tmp_path, num_repeats=2, num_repeats_add_seed=True, resume_from_cache=True), server_client=stack.client()) == 0
    assert sorted(stack.calls) == [(1, 0), (1, 1), (3, 1)]  # nothing finished ran again
    final = read_jsonl(paths.output)  # every line parses: the torn tail was cut
    assert sorted(keys(final)) == [(t, r) for t in range(4) for r in range(2)]
    assert not paths.failures.exists()
    metrics = json.loads(paths.agent_metrics.read_text())
    assert metrics[0]["agent_ref"] == {"name": "agent"} and metrics[0]["num_rollouts"] == 8
    assert metrics[0]["mean/reward"] == 0.5 and metrics[0]["pass@1"] == 0.5 and metrics[0]["pass@2"] == 0.5
    assert len(read_jsonl(paths.reward_profiling)) == 4


def test_resume_without_an_output_file_starts_fresh_and_a_fresh_run_truncates(tmp_path):
    make_input(tmp_path, 2)
    stack = FakeStack()
    cfg = config(tmp_path, resume_from_cache=True)
    assert run_from_config(config(tmp_path, resume_from_cache=True, progress_bar=True), server_client=stack.client()) == 0
    assert len(stack.calls) == 2
    assert run_from_config(config(tmp_path), server_client=stack.client()) == 0  # not resuming: starts over
    assert len(read_jsonl(CollectionPaths(Path(cfg.output_jsonl_fpath)).output)) == 2
    assert len(stack.calls) == 4
    assert run_from_config(cfg, server_client=stack.client()) == 0  # resuming a complete file: no calls
    assert len(stack.calls) == 4


def test_resume_reuses_the_materialized_inputs_of_the_first_run(tmp_path):
    make_input(tmp_path, 3)
    stack = FakeStack()
    stack.failing = {2}
    assert run_from_config(config(tmp_path, max_attempts=1), server_client=stack.client()) == 1
    make_input(tmp_path, 5)  # the input changed since: the resumed run finishes the original job
    stack.failing = set()
    assert run_from_config(config(tmp_path, resume_from_cache=True), server_client=stack.client()) == 0
    assert sorted(keys(read_jsonl(tmp_path / "out" / "rollouts.jsonl"))) == [(0, 0), (1, 0), (2, 0)]


def test_bad_input_fails_before_any_rollout_and_keeps_the_old_output(tmp_path):
    write_jsonl(tmp_path / "in.jsonl", [{"responses_create_params": params("a")}, {"responses_create_params": params("b"), "agent_ref": {"name": "nope"}}])
    out = tmp_path / "out" / "rollouts.jsonl"
    out.parent.mkdir()
    out.write_text('{"old": true}\n')
    stack = FakeStack()
    with pytest.raises(InputValidationError, match=r"in\.jsonl:2: unknown agent `nope`"):
        run_from_config(config(tmp_path), server_client=stack.client())
    assert stack.calls == []
    assert out.read_text() == '{"old": true}\n'


def test_unreachable_head_server_is_exit_code_1(tmp_path, capsys):
    make_input(tmp_path, 1)
    from tests.conftest import free_port

    code = run_from_config(config(tmp_path), head_server_config={"host": "127.0.0.1", "port": free_port()})
    assert code == 1
    assert "head server" in capsys.readouterr().err


# ------------------------------------------------------------------------------------------------ command


def test_help_lists_every_parameter(capsys):
    assert find_command("collect_rollouts").main(["+h=true"]) == 0
    text = capsys.readouterr().out
    for name in (
        "agent_name", "input_jsonl_fpath", "output_jsonl_fpath", "limit", "num_repeats", "num_repeats_add_seed",
        "num_samples_in_parallel", "responses_create_params", "resume_from_cache", "max_attempts", "request_timeout_s",
    ):
        assert f"+{name}" in text


def test_missing_parameters_are_a_config_error_with_exit_code_2(capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert find_command("collect_rollouts").main(["+input_jsonl_fpath=x.jsonl"]) == 2
    assert "output_jsonl_fpath" in capsys.readouterr().err


def test_config_parses_overrides_from_the_command_line(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    from nemo_gym.config.global_config import parse_global_config

    cfg = parse_global_config(
        [
            "+input_jsonl_fpath=in.jsonl",
            "+output_jsonl_fpath=out.jsonl",
            "+num_repeats=3",
            "+num_repeats_add_seed=true",
            "+responses_create_params.temperature=0.6",
            "+responses_create_params.max_output_tokens=128",
        ],
        allocate_ports=False,
    )
    c = RolloutCollectionConfig.from_global_config(cfg)
    assert c.num_repeats == 3 and c.num_repeats_add_seed is True
    assert c.responses_create_params == {"temperature": 0.6, "max_output_tokens": 128}
    assert c.max_attempts == 3 and c.num_samples_in_parallel is None and c.resume_from_cache is False


def test_a_mistyped_agent_name_is_an_error_even_when_rows_name_their_agent(tmp_path):
    from nemo_gym.rollouts.collection import RolloutCollectionConfig, run_from_config

    rows = [{"responses_create_params": params(), "agent_ref": {"name": "weather_agent"}}]
    config = RolloutCollectionConfig(
        input_jsonl_fpath=str(write_jsonl(tmp_path / "in.jsonl", rows)),
        output_jsonl_fpath=str(tmp_path / "out.jsonl"),
        agent_name="weather_agnt",
    )
    stack = {"weather_agent": {"responses_api_agents": {"simple_agent": {"host": "127.0.0.1", "port": 1}}}}
    client = ServerClient(global_config_dict=stack)
    with pytest.raises(NeMoGymConfigError, match=r"weather_agnt.*Did you mean `weather_agent`"):
        run_from_config(config, server_client=client)
    assert not (tmp_path / "out.jsonl").exists()


def test_prompt_config_writes_every_rows_input_before_repeats_and_refuses_rows_it_cannot_render(tmp_path):
    """`+prompt_config` (NeMo Gym v0.5): the template renders each row's input from its top-level fields into the
    materialized inputs; a row that brings its own input, or lacks a field the template uses, is a file:line
    problem like any other; a missing template file fails before any row is read."""
    template = tmp_path / "math.yaml"
    template.write_text("system: 'Answer with a number.'\nuser: 'What is {a} + {b}? Use {{braces}}.'\n")
    rows = [{"a": 1, "b": 2, "agent_ref": {"name": "agent"}}, {"a": 3, "b": 4, "responses_create_params": {"temperature": 0.5}}]
    src = write_jsonl(tmp_path / "in.jsonl", rows)
    out = tmp_path / "out_materialized_inputs.jsonl"
    materialize_input_file(src, out, agent_name="agent", num_repeats=2, prompt_config=str(template))
    written = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(written) == 4
    first = written[0]["responses_create_params"]["input"]
    assert first == [
        {"role": "system", "content": "Answer with a number."},
        {"role": "user", "content": "What is 1 + 2? Use {braces}."},
    ]
    assert written[2]["responses_create_params"] == {
        "temperature": 0.5,
        "input": [{"role": "system", "content": "Answer with a number."}, {"role": "user", "content": "What is 3 + 4? Use {braces}."}],
    }

    bad = write_jsonl(
        tmp_path / "bad.jsonl",
        [{"a": 1, "b": 2}, {"a": 1, "responses_create_params": {"input": "own"}}, {"a": 1}],
    )
    with pytest.raises(InputValidationError) as err:
        materialize_input_file(bad, tmp_path / "bad_out.jsonl", agent_name="agent", prompt_config=str(template))
    assert [p.line for p in err.value.problems] == [2, 3]
    message = str(err.value)
    assert f"{bad}:2: has a non-empty `responses_create_params.input`" in message
    assert f"{bad}:3:" in message and "{b}" in message

    with pytest.raises(NeMoGymConfigError) as missing:
        materialize_input_file(src, out, agent_name="agent", prompt_config=str(tmp_path / "nope.yaml"))
    assert "nope.yaml" in str(missing.value)


def test_the_end_summary_counts_token_trajectories_only_when_rollouts_carry_token_ids(tmp_path, capsys):
    """The collector classifies each rollout as it writes it (`classify_trajectory`, as `ng export tokens` does)
    and prints exact / re-tokenized / unusable at the end; without token ids it prints nothing about them."""
    make_input(tmp_path, 4)

    def tokened(request: httpx.Request) -> httpx.Response:
        row = orjson.loads(request.content)
        task = row[T]
        call = {"type": "function_call", "name": "add", "arguments": "{}", "call_id": "c1",
                "prompt_token_ids": [1, 2], "generation_token_ids": [5], "generation_log_probs": [-0.1]}
        answer = {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "3"}],
                  "prompt_token_ids": [1, 2, 5, 7] if task != 2 else [1, 9], "generation_token_ids": [8],
                  "generation_log_probs": [-0.2]}  # fmt: skip
        if task == 1:
            answer["token_trajectory"] = "retokenized"
        output = [call, {"type": "function_call_output", "call_id": "c1", "output": "3"}, answer]
        if task == 3:
            output = [{"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "3"}]}]
        return httpx.Response(200, json={"reward": 1.0, "response": {"output": output}})

    assert run_from_config(config(tmp_path), server_client=mock_client(tokened)) == 0
    out = capsys.readouterr().out
    assert (
        "Token data of the 4 new rollouts: token trajectories: 1 exact, 1 re-tokenized, 2 unusable "
        "(no_token_data 1, tokens_not_contiguous 1)."
    ) in out, out

    assert run_from_config(config(tmp_path), server_client=FakeStack().client()) == 0  # no token ids at all
    out = capsys.readouterr().out
    assert "Collected 4 / 4 rollouts" in out and "token trajectories" not in out.lower(), out


def test_the_end_summary_counts_ok_incomplete_and_failed_rollouts(tmp_path, capsys):
    """One vocabulary (`rollouts/outcome.py`): a response cut at max_output_tokens is incomplete (verified, kept in
    the output with its reward), a rollout that failed after its retries is failed; the summary, the progress
    counts and the reward profile say so with the same words."""
    make_input(tmp_path, 5)

    def answers(request: httpx.Request) -> httpx.Response:
        row = orjson.loads(request.content)
        if row[T] == 4:
            return httpx.Response(500, text="resources server unreachable")
        response = {"status": "completed", "output": []}
        if row[T] in (1, 2):
            response = {"status": "incomplete", "incomplete_details": {"reason": "max_output_tokens"}, "output": []}
        return httpx.Response(200, json={"reward": row["expected"], "response": response})

    cfg = config(tmp_path, max_attempts=1)
    paths = CollectionPaths(Path(cfg.output_jsonl_fpath))
    assert run_from_config(cfg, server_client=mock_client(answers)) == 1
    printed = capsys.readouterr()
    assert "Collected 4 / 5 rollouts" in printed.out
    assert "5 rollouts: 2 ok, 2 incomplete (max_output_tokens), 1 failed (HTTPError)." in printed.out
    assert "they have a reward and are kept in the output" in printed.out
    assert printed.out.count("5 rollouts: ") == 1  # the profile table leaves the sentence to the collector
    assert "1 rollout(s) failed after retries" in printed.err
    assert len(read_jsonl(paths.output)) == 4  # the incomplete ones are kept
    (metrics,) = json.loads(paths.agent_metrics.read_text())
    assert (metrics["num_rollouts"], metrics["num_ok"], metrics["num_incomplete"], metrics["num_failed"]) == (4, 2, 2, 1)

    # Resume runs the failed one: the summary counts the new rollouts of this run.
    assert run_from_config(config(tmp_path, resume_from_cache=True), server_client=FakeStack().client()) == 0
    out = capsys.readouterr().out
    assert "1 new rollout: 1 ok, 0 incomplete, 0 failed." in out
    (metrics,) = json.loads(paths.agent_metrics.read_text())
    assert (metrics["num_ok"], metrics["num_incomplete"], metrics["num_failed"]) == (3, 2, 0)


def test_the_progress_display_counts_each_outcome():
    from nemo_gym.rollouts.collection import ProgressDisplay, RolloutResult

    display = ProgressDisplay(total=3, already_done=0, enabled=False)
    cut = {"reward": 0.0, "response": {"status": "incomplete", "incomplete_details": {"reason": "max_output_tokens"}}}
    display.update(RolloutResult({}, result={"reward": 1.0, "response": {"status": "completed"}}))
    display.update(RolloutResult({}, result=cut))
    display.update(RolloutResult({}, error_type="Timeout", message="/run did not answer"))
    assert display.outcomes.describe() == "3 rollouts: 1 ok, 1 incomplete (max_output_tokens), 1 failed (Timeout)"
    assert (display.done, display.failed, display.mean_reward) == (2, 1, 0.5)
