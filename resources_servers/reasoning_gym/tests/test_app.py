import asyncio
import json
import math
import os
import signal
import time
from pathlib import Path

import pytest
import reasoning_gym
from fastapi.testclient import TestClient
from pydantic import ValidationError

from nemo_gym.isolation.worker_pool import WorkerPool, WorkerTimeout
from nemo_gym.testing.responses import function_call, function_call_output, make_response, message, reasoning
from nemo_gym.testing.servers import Verifier, make_server
from resources_servers.reasoning_gym.app import (
    ReasoningGymResourcesServer,
    ReasoningGymVerifyRequest,
    answer_tag_content,
    extract_final_answer,
    first_boxed_content,
)
from resources_servers.reasoning_gym.scoring import SCORING_PRELOAD, score_answer

DATA_PATH = Path(__file__).resolve().parents[1] / "data" / "example.jsonl"
ROWS = {json.loads(line)["metadata"]["source_dataset"]: json.loads(line) for line in DATA_PATH.read_text().splitlines()}
LEGS = ROWS["leg_counting"]  # gold "500"; the default scorer: partial credit when the gold is inside the answer
BACKWARD = ROWS["spell_backward"]  # gold "noremopyh"; credit per leading letter right
SORTING = ROWS["word_sorting"]  # 9 words; credit per word in the right place
KNIGHTS = ROWS["knights_knaves"]  # 0.3 + 0.7 x (fraction of people right) when not all are right


def new_server(**config) -> ReasoningGymResourcesServer:
    return make_server(ReasoningGymResourcesServer, name="reasoning_gym", domain="other", **config)


@pytest.fixture(scope="module")
def server():
    server = new_server()
    yield server
    server.pool.close()


VERIFY = Verifier(new_server, ReasoningGymVerifyRequest)
request = VERIFY.row_request


def verify(server, row: dict, *output):
    return VERIFY.verify_row(row, *output, server=server)


def with_metadata(row: dict, **changes) -> dict:
    row = json.loads(json.dumps(row))
    row["metadata"].update(changes)
    return row


# ------------------------------------------------------------------------------------------------ extraction


@pytest.mark.parametrize(
    "text, expected",
    [
        ("<answer>500</answer>", "500"),
        ("<answer> 500 \n</answer>", "500"),
        ("<answer>\n  multi\n  line\n</answer>", "multi\n  line"),
        ("<answer>1</answer> no wait <answer>2</answer> done", "2"),  # the last pair
        ("<answer></answer>", ""),  # an empty answer is still an answer
        ("<answer>500", None),  # unclosed
        ("500</answer>", None),
        ("no tags", None),
    ],
)
def test_answer_tag_content(text, expected):
    assert answer_tag_content(text) == expected


@pytest.mark.parametrize(
    "text, expected",
    [
        (r"so \boxed{500}.", "500"),
        (r"\boxed{ 500 }", "500"),
        (r"\boxed{\frac{1}{2}}", r"\frac{1}{2}"),  # nested braces are kept whole
        (r"\boxed{1} then \boxed{2}", "1"),  # the first box
        (r"\boxed{ \boxed{2}", "2"),  # the first box that is closed
        (r"\boxed{}", ""),
        (r"\boxed{500", None),
        (r"\boxed 500", None),
        ("500", None),
    ],
)
def test_first_boxed_content(text, expected):
    assert first_boxed_content(text) == expected


@pytest.mark.parametrize(
    "text, expected",
    [
        (r"\boxed{1} <answer>2</answer>", "2"),  # a tag beats a box
        (r"<answer>2 \boxed{1}", "1"),  # an unclosed tag is not a tag
        (r"The answer: \boxed{1}", "1"),  # a box beats the raw text
        ("  just 500 \n", "just 500"),  # else the whole text, stripped
        ("", ""),
    ],
)
def test_extract_final_answer_order(text, expected):
    assert extract_final_answer(text) == expected


def test_extraction_is_linear_on_degenerate_output():
    started = time.perf_counter()
    assert answer_tag_content("<answer>" * 200_000) is None
    assert answer_tag_content("<answer>" * 100_000 + "x</answer>" + "<answer>" * 100_000) == "<answer>" * 99_999 + "x"
    assert first_boxed_content("\\boxed{" * 200_000) is None
    assert first_boxed_content("\\boxed{" * 100_000 + "}") == ""
    assert extract_final_answer("{" * 200_000 + "<answer>" * 100_000) == "{" * 200_000 + "<answer>" * 100_000
    assert time.perf_counter() - started < 5.0


# ------------------------------------------------------------------------------------------------ scoring


def test_correct_answer_in_answer_tags(server):
    result = verify(server, LEGS, "4 legs each for most... total <answer>500</answer>")
    assert result.reward == 1.0 and result.score == 1.0
    assert result.task_name == "leg_counting" and result.extracted_answer == "500" and result.score_error is None


def test_wrong_answer(server):
    result = verify(server, LEGS, "<answer>499</answer>")
    assert result.reward == 0.0 and result.extracted_answer == "499" and result.score_error is None


def test_boxed_answer(server):
    result = verify(server, BACKWARD, r"Reversed: \boxed{noremopyh}")
    assert result.reward == 1.0 and result.extracted_answer == "noremopyh"


def test_raw_answer(server):
    result = verify(server, BACKWARD, "  noremopyh\n")
    assert result.reward == 1.0 and result.extracted_answer == "noremopyh"


@pytest.mark.parametrize(
    "row, answer, score",
    [
        (LEGS, "500 legs", 3 / 8),  # the default scorer: len(gold) / len(answer) when the gold is inside
        (BACKWARD, "noremopyx", 8 / 9),  # 8 of 9 leading letters
        (SORTING, "Hart, find, inform, necessarily, profit, received, subscribers, undertaking, tax", 7 / 9),
        (KNIGHTS, "Victoria is a knave, and Jacob is a knave.", 0.3 + 0.7 * 1 / 2),
        (KNIGHTS, "Victoria is a knave, and Jacob is a knight.", 0.0),
    ],
)
def test_partial_credit_is_the_task_scorer_verbatim(server, row, answer, score):
    result = verify(server, row, f"<answer>{answer}</answer>")
    assert result.reward == pytest.approx(score) and result.score == result.reward and result.score_error is None
    entry = {"question": row["question"], "answer": row["answer"], "metadata": row["metadata"]}
    assert result.reward == reasoning_gym.get_score_answer_fn(row["metadata"]["source_dataset"])(answer, entry)


def test_task_without_a_gold_answer_is_scored_by_checking_the_solution(server):
    item = json.loads(json.dumps(reasoning_gym.create_dataset("graph_color", seed=0, size=1)[0]))
    assert item["answer"] is None
    row = {"responses_create_params": {"input": item["question"]}, **item}
    coloring = dict(item["metadata"]["possible_answer"])
    assert verify(server, row, f"<answer>{json.dumps(coloring)}</answer>").reward == 1.0
    u, v = item["metadata"]["puzzle"]["edges"][0]
    coloring[str(v)] = coloring[str(u)]  # two neighbours share a color
    assert verify(server, row, f"<answer>{json.dumps(coloring)}</answer>").reward == 0.01  # the task's own value


def test_unknown_task_scores_zero_with_a_reason(server):
    result = verify(server, with_metadata(LEGS, source_dataset="leg_countin"), "<answer>500</answer>")
    assert result.reward == 0.0 and result.task_name == "leg_countin"
    assert "unknown reasoning-gym task 'leg_countin'" in result.score_error


def test_scorer_error_scores_zero_with_a_reason(server):
    row = json.loads(json.dumps(SORTING))
    del row["metadata"]["sorted_words"]  # the word_sorting scorer reads it
    result = verify(server, row, "<answer>Hart</answer>")
    assert result.reward == 0.0 and result.score_error == "word_sorting: KeyError: 'sorted_words'"
    # `composite` is registered but is not a task of its own: its scorer cannot be built.
    result = verify(server, with_metadata(LEGS, source_dataset="composite"), "<answer>500</answer>")
    assert result.reward == 0.0 and result.score_error.startswith("composite: ")


def test_non_finite_score_becomes_zero(server, monkeypatch):
    async def nan_score(*args, **kwargs):
        return math.nan

    monkeypatch.setattr(server.pool, "run", nan_score)
    result = verify(server, LEGS, "<answer>500</answer>")
    assert result.reward == 0.0 and "nan" in result.score_error


def test_slow_scorer_times_out_and_the_server_carries_on():
    server = new_server(num_scoring_workers=1, score_timeout_seconds=2)
    try:
        item = json.loads(json.dumps(reasoning_gym.create_dataset("simple_integration", seed=0, size=1)[0]))
        row = {"responses_create_params": {"input": item["question"]}, **item}
        assert verify(server, row, f"<answer>{item['answer']}</answer>").reward == 1.0  # the worker is up
        # sympy evaluates 9**9**9 for hours in one C call: only a killed process stops it.
        started = time.perf_counter()
        slow = verify(server, row, "<answer>x**(9**9**9)</answer>")
        assert slow.reward == 0.0 and "did not finish within 2 s" in slow.score_error
        assert time.perf_counter() - started < 12
        assert verify(server, row, f"<answer>{item['answer']}</answer>").reward == 1.0  # a new worker took over
    finally:
        server.pool.close()


def test_concurrent_verifies(server):
    cases = [(LEGS, "<answer>500</answer>", 1.0), (LEGS, "<answer>1</answer>", 0.0), (BACKWARD, "noremopyh", 1.0)] * 4

    async def run_all():
        return await asyncio.gather(*(server.verify(request(row, text)) for row, text, _ in cases))

    assert [result.reward for result in asyncio.run(run_all())] == [reward for _, _, reward in cases]


# ------------------------------------------------------------------------------------------------ malformed output


def test_empty_output_scores_zero(server):
    result = verify(server, LEGS)
    assert result.reward == 0.0 and result.extracted_answer == ""


def test_only_non_message_items_are_ignored(server):
    output = [
        reasoning("<answer>500</answer>"),
        function_call("calc", {"x": "<answer>500</answer>"}, call_id="c1"),
        function_call_output("<answer>500</answer>", call_id="c1"),
        {
            "id": "msg_0",
            "type": "message",
            "role": "assistant",
            "status": "completed",
            "content": [{"type": "refusal", "refusal": "<answer>500</answer>"}],
        },
    ]
    result = verify(server, LEGS, *output)
    assert result.reward == 0.0 and result.extracted_answer == ""


def test_all_assistant_messages_are_read(server):
    first, second = message("<answer>12</answer>", msg_id="m1"), message("<answer>500</answer>", msg_id="m2")
    result = verify(server, LEGS, first, second)
    assert result.extracted_answer == "500" and result.reward == 1.0
    plain = {"type": "message", "role": "assistant", "content": "<answer>500</answer>"}
    assert verify(server, LEGS, plain).reward == 1.0


def test_unclosed_tag_falls_back_to_the_raw_text(server):
    # No tag pair and no box: the whole text is the answer, and the default scorer gives the
    # len(gold) / len(answer) partial credit because "500" is inside it.
    result = verify(server, LEGS, "<answer>500")
    assert result.extracted_answer == "<answer>500" and result.reward == pytest.approx(3 / 11)


def test_garbage_output_scores_zero(server):
    for text in ["\x00\x01\ufffd", "}{" * 1000, "<answer><answer></answer>", "\\boxed{" * 1000]:
        assert verify(server, KNIGHTS, text).reward == 0.0


# ------------------------------------------------------------------------------------------------ request model


def test_request_needs_metadata_with_the_task_name():
    row = json.loads(json.dumps(LEGS))
    del row["metadata"]
    with pytest.raises(ValidationError, match="metadata"):
        request(row, "x")
    for metadata in [{}, {"source_dataset": ""}, {"source_dataset": 3}, {"source_dataset": None}]:
        with pytest.raises(ValidationError, match="source_dataset"):
            request({**LEGS, "metadata": metadata}, "x")


def test_answer_is_nullable_and_question_required():
    assert request({**LEGS, "answer": None}, "x").answer is None
    row = dict(LEGS)
    del row["answer"]
    assert request(row, "x").answer is None
    del row["question"]
    with pytest.raises(ValidationError, match="question"):
        request(row, "x")


def test_request_fields_are_echoed(server):
    result = verify(server, LEGS, "<answer>500</answer>")
    assert result.question == LEGS["question"] and result.answer == "500" and result.metadata == LEGS["metadata"]


def test_http_verify(server):
    with TestClient(server.build_app()) as client:
        body = {**LEGS, "response": make_response("<answer>500</answer>").model_dump(mode="json")}
        ok = client.post("/verify", json=body)
        assert ok.status_code == 200
        assert ok.json()["reward"] == 1.0 and ok.json()["task_name"] == "leg_counting"
        missing = client.post("/verify", json={key: value for key, value in body.items() if key != "metadata"})
        assert missing.status_code == 422 and "metadata" in missing.text
        nameless = client.post("/verify", json={**body, "metadata": {"source_index": 0}})
        assert nameless.status_code == 422 and "source_dataset" in nameless.text
        unknown = client.post("/verify", json={**body, "metadata": {"source_dataset": "nope"}})
        assert unknown.status_code == 200 and unknown.json()["reward"] == 0.0


# ------------------------------------------------------------------------------------------------ scoring pool


def test_pool_replaces_a_worker_that_died_while_idle():
    pool = WorkerPool(num_workers=1, timeout_s=30, preload=SCORING_PRELOAD)
    try:
        entry = {"question": LEGS["question"], "answer": "500", "metadata": LEGS["metadata"]}
        assert asyncio.run(pool.run(score_answer, "leg_counting", "500", entry)) == 1.0
        (worker_pid,) = pool.worker_pids()
        os.kill(worker_pid, signal.SIGKILL)
        deadline = time.monotonic() + 10
        while pool.worker_pids() and time.monotonic() < deadline:  # until it is dead (and reaped)
            time.sleep(0.05)
        assert pool.worker_pids() == []
        assert asyncio.run(pool.run(score_answer, "leg_counting", "500", entry)) == 1.0
    finally:
        pool.close()


def test_pool_timeout_is_reported():
    pool = WorkerPool(num_workers=1, timeout_s=1, preload=SCORING_PRELOAD)
    try:
        item = json.loads(json.dumps(reasoning_gym.create_dataset("simple_integration", seed=0, size=1)[0]))
        with pytest.raises(WorkerTimeout):
            asyncio.run(pool.run(score_answer, "simple_integration", "x**(9**9**9)", item))
    finally:
        pool.close()


# ------------------------------------------------------------------------------------------------ example data


def ideal_answer(row: dict) -> str:
    return f"<answer>{row['answer']}</answer>"


def test_example_rows_validate_and_cover_several_tasks():
    lines = DATA_PATH.read_text().splitlines()
    assert len(lines) == 5
    requests = [request(json.loads(line), "x") for line in lines]
    assert len({r.metadata["source_dataset"] for r in requests}) == 5
    for line in lines:
        assert json.loads(line)["agent_ref"] == {"type": "responses_api_agents", "name": "reasoning_gym_simple_agent"}


def test_example_rows_reward_ideal_answers(server):
    for row in ROWS.values():
        assert verify(server, row, ideal_answer(row)).reward == 1.0, row["metadata"]["source_dataset"]
