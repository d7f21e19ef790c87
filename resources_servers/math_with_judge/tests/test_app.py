import time
from typing import Callable, Optional

import httpx
import pytest
from fastapi.testclient import TestClient

from nemo_gym.isolation.worker_pool import WorkerPool
from nemo_gym.judge import JudgeError
from nemo_gym.testing.judge import FakeJudge
from nemo_gym.testing.responses import function_call, function_call_output, make_response, message, reasoning
from nemo_gym.testing.servers import Verifier, example_rows, make_server
from resources_servers.math_with_judge.app import (
    EQUAL_LABEL,
    NOT_EQUAL_LABEL,
    MathWithJudgeResourcesServer,
    MathWithJudgeVerifyRequest,
    judge_verdict,
)
from resources_servers.math_with_judge.grading import (
    ExpectedAnswerUnreadable,
    grade_with_math_verify,
    strip_math_delimiters,
)

QUESTION = "Solve for x: 2x + 6 = 20."
PARAMS = {"input": [{"role": "user", "content": QUESTION + " Put the final answer in \\boxed{}."}]}
# math-verify needs > 5 s on this (its own comparison timeout); the hard limit in the timeout tests is 1 s.
PATHOLOGICAL = r"\boxed{10^{10^{9}}}"


# ----------------------------------------------------------------------------------------------- helpers


def new_server(judge: Optional[FakeJudge] = None, **config) -> MathWithJudgeResourcesServer:
    config.setdefault("should_use_judge", judge is not None)
    return make_server(
        MathWithJudgeResourcesServer,
        name="math_with_judge",
        server_client=(judge or FakeJudge()).client(),
        domain="math",
        judge_model_server=FakeJudge.server_ref,
        **config,
    )


VERIFY = Verifier(new_server, MathWithJudgeVerifyRequest, PARAMS, question=QUESTION)


@pytest.fixture(scope="module")
def pool():
    """One worker pool shared by the tests below (a worker takes about a second to start)."""
    shared = WorkerPool(num_workers=2, timeout_s=60.0, preload=[grade_with_math_verify.__module__])
    yield shared
    shared.close()


@pytest.fixture
def run_verify(pool) -> Callable:
    def run(*output, judge: Optional[FakeJudge] = None, expected_answer: str = "7", server=None, **config):
        if server is None:  # a server of its own is built with its own pool (see the timeout tests)
            server = new_server(judge, **config)
            server._pool = pool
        return VERIFY(*output, server=server, expected_answer=expected_answer)

    return run


# ----------------------------------------------------------------------------------------------- math-verify


@pytest.mark.parametrize(
    "raw, stripped",
    [
        (r"\(x^2\)", "x^2"),
        ("$5\\sqrt{2}$", "5\\sqrt{2}"),
        ("$$7$$", "7"),
        (r" \( $3$ \) ", "3"),  # \( \) first, then $ $
        ("7", "7"),
        ("$", "$"),
        (r"\(", r"\("),
        ("$a$ and $b$", "a$ and $b"),  # only the outer pair
    ],
)
def test_strip_math_delimiters(raw, stripped):
    assert strip_math_delimiters(raw) == stripped


@pytest.mark.parametrize(
    "expected, text, reward, extracted",
    [
        ("7", r"2x = 14, so x = \boxed{7}.", 1.0, "7"),
        ("7", "x = 7", 1.0, "7"),  # plain expression, no box
        (r"\frac{7}{8}", r"The cake needs \boxed{0.875} cups.", 1.0, "0.875000000000000"),  # decimal vs fraction
        (r"\frac{7}{8}", r"\boxed{\frac{14}{16}}", 1.0, "7/8"),
        (r"$5\sqrt{2}$", r"\boxed{\sqrt{50}}", 1.0, "sqrt(50)"),  # $...$ stripped from the gold
        (r"\(x^2 + 4x + 4\)", r"\boxed{(x+2)^2}", 1.0, "(x + 2)**2"),  # \(...\) stripped, symbolic equality
        (r"\{1, 2\}", r"\boxed{\{2, 1\}}", 1.0, "{1, 2}"),  # sets in any order
        ("7", r"\boxed{8}", 0.0, "8"),  # wrong: the extracted answer is still reported
        ("7", r"First \boxed{8}, no wait: \boxed{7}", 0.0, "{7, 8}"),  # every box counts: {8, 7} is not 7
        ("9", "There are nine of them.", 0.0, None),  # words: nothing to extract
        ("7", "", 0.0, None),  # empty output
        ("7", r"\boxed{", 0.0, None),  # malformed LaTeX
        ("7", "}}}{{{ \\frac{", 0.0, None),
    ],
)
def test_grade_with_math_verify(expected, text, reward, extracted):
    assert grade_with_math_verify(expected, text) == (reward, extracted)


def test_unreadable_expected_answer_raises():
    with pytest.raises(ExpectedAnswerUnreadable):
        grade_with_math_verify("", "7")


# ----------------------------------------------------------------------------------------------- verify, library path


def test_correct_answer(run_verify):
    result = run_verify(r"So x = \boxed{7}.")
    assert result.reward == 1.0 and result.library_reward == 1.0 and result.extracted_answer == "7"
    assert result.judge_evaluations is None and result.judge_error is None
    assert result.math_verify_timed_out is False and result.math_verify_error is None
    assert result.expected_answer == "7" and result.question == QUESTION  # echoed


def test_wrong_answer_without_judge(run_verify):
    result = run_verify(r"\boxed{8}")
    assert result.reward == 0.0 and result.library_reward == 0.0 and result.extracted_answer == "8"
    assert result.judge_evaluations is None


@pytest.mark.parametrize("output", [(), ("",), ("I am not sure.",), (r"\boxed{",)])
def test_empty_and_malformed_output_score_zero(run_verify, output):
    result = run_verify(*output)
    assert result.reward == 0.0 and result.extracted_answer is None


def test_text_is_every_assistant_output_text_concatenated(run_verify):
    output = [
        reasoning(r"maybe \boxed{8}"),
        function_call("calc", {"q": "\\boxed{9}"}, call_id="c1"),
        function_call_output(r"\boxed{10}", call_id="c1"),
        message(r"x = \boxed{", "7}", msg_id="msg_2"),  # concatenated with no separator: one box
    ]
    result = run_verify(*output)
    assert result.reward == 1.0 and result.extracted_answer == "7"


def test_unreadable_expected_answer_scores_zero_with_the_reason(run_verify):
    result = run_verify(r"\boxed{7}", expected_answer="   ")
    assert result.reward == 0.0 and result.library_reward == 0.0
    assert "could not read the expected answer" in result.math_verify_error
    assert result.math_verify_timed_out is False


def test_missing_expected_answer_is_a_validation_error():
    with pytest.raises(ValueError):
        MathWithJudgeVerifyRequest(responses_create_params=PARAMS, response=make_response("7"))


# ----------------------------------------------------------------------------------------------- verify, judge path


def test_judge_not_called_when_library_says_equal(run_verify):
    judge = FakeJudge()
    result = run_verify(r"\boxed{7}", judge=judge)
    assert result.reward == 1.0 and judge.calls == [] and result.judge_evaluations is None


def test_judge_equal_both_ways(run_verify):
    judge = FakeJudge(f"Both say seven. {EQUAL_LABEL}", f"Same value. {EQUAL_LABEL}")
    result = run_verify("x is seven", judge=judge)
    assert result.library_reward == 0.0 and result.reward == 1.0
    assert [e.verdict_label for e in result.judge_evaluations] == [EQUAL_LABEL, EQUAL_LABEL]
    # First call: expected answer as A, the model's text as B; the second swaps them.
    first, second = judge.prompt(0), judge.prompt(1)
    assert "<answer_a>\n7\n</answer_a>" in first and "<answer_b>\nx is seven\n</answer_b>" in first
    assert "<answer_a>\nx is seven\n</answer_a>" in second and "<answer_b>\n7\n</answer_b>" in second
    assert f"<problem>\n{QUESTION}\n</problem>" in first
    assert judge.calls[0]["input"][0]["role"] == "system" and judge.calls[0]["input"][1]["role"] == "user"
    # The recorded evaluation holds what was sent and what came back.
    assert result.judge_evaluations[0].responses_create_params.input[-1].content == first
    assert result.judge_evaluations[1].response.output_text == f"Same value. {EQUAL_LABEL}"


def test_judge_says_not_equal(run_verify):
    judge = FakeJudge(f"Seven and eight differ. {NOT_EQUAL_LABEL}")
    result = run_verify(r"\boxed{8}", judge=judge)
    assert result.reward == 0.0 and len(judge.calls) == 1
    assert [e.verdict_label for e in result.judge_evaluations] == [NOT_EQUAL_LABEL]


def test_swap_check_failure(run_verify):
    judge = FakeJudge(EQUAL_LABEL, NOT_EQUAL_LABEL)  # a judge that favours one position
    result = run_verify(r"\boxed{8}", judge=judge)
    assert result.reward == 0.0 and len(judge.calls) == 2
    assert [e.verdict_label for e in result.judge_evaluations] == [EQUAL_LABEL, NOT_EQUAL_LABEL]


def test_judge_without_a_verdict_is_a_judge_error_by_default(run_verify):
    with pytest.raises(JudgeError, match="holds no verdict"):
        run_verify(r"\boxed{8}", judge=FakeJudge("They look similar, I suppose."))


def test_judge_without_a_verdict_means_not_equal_with_judge_unparseable_verdict_zero(run_verify):
    judge = FakeJudge("They look similar, I suppose.")
    result = run_verify(r"\boxed{8}", judge=judge, judge_unparseable_verdict="zero")
    assert result.reward == 0.0 and result.judge_evaluations[0].verdict_label is None and len(judge.calls) == 1


def test_judge_disagreement_between_labels_first_one_wins(run_verify):
    judge = FakeJudge(f"{NOT_EQUAL_LABEL}, although one could argue {EQUAL_LABEL}")
    result = run_verify(r"\boxed{8}", judge=judge)
    assert result.reward == 0.0 and result.judge_evaluations[0].verdict_label == NOT_EQUAL_LABEL


def test_judge_ending_in_reasoning_has_no_verdict(run_verify):
    reasoning_only = make_response(message(EQUAL_LABEL), reasoning()).model_dump(mode="json")
    with pytest.raises(JudgeError, match="holds no verdict"):
        run_verify(r"\boxed{8}", judge=FakeJudge(reasoning_only))
    result = run_verify(r"\boxed{8}", judge=FakeJudge(reasoning_only), judge_unparseable_verdict="zero")
    assert result.reward == 0.0 and result.judge_evaluations[0].verdict_label is None


@pytest.mark.parametrize(
    "failure, message_part",
    [
        (500, "HTTP 500"),
        ({"not": "a response"}, "ValidationError"),
        (httpx.ConnectError("connection refused"), "ConnectError"),
    ],
)
def test_a_failed_judge_call_is_a_judge_error_not_a_score(run_verify, failure, message_part):
    # verify does not catch it: judge_failsafe around /verify answers judge_failed.
    with pytest.raises(JudgeError, match=message_part):
        run_verify(r"\boxed{8}", judge=FakeJudge(failure))


def test_judge_error_on_the_swap_call_is_a_judge_error(run_verify):
    with pytest.raises(JudgeError, match="HTTP 503"):
        run_verify(r"\boxed{8}", judge=FakeJudge(EQUAL_LABEL, 503))


def test_a_failed_judge_call_over_http_is_a_judge_failed_answer(pool):
    server = new_server(FakeJudge(500))
    server._pool = pool
    with TestClient(server.build_app()) as client:
        answer = client.post("/verify", json=VERIFY.body(r"\boxed{8}", expected_answer="7"))
    assert answer.status_code == 200 and answer.json()["_ng_failure_class"] == "judge_failed"
    assert "HTTP 500" in answer.json()["_ng_failure_judge_error"] and answer.json()["reward"] == 0.0


def test_empty_output_is_not_sent_to_the_judge(run_verify):
    judge = FakeJudge()
    result = run_verify("  ", judge=judge)
    assert result.reward == 0.0 and judge.calls == [] and result.judge_evaluations is None


def test_judge_params_come_from_the_config(run_verify):
    judge = FakeJudge(NOT_EQUAL_LABEL)
    run_verify(
        r"\boxed{8}",
        judge=judge,
        judge_responses_create_params={"input": [], "temperature": 0.0, "max_output_tokens": 64},
        judge_system_message=None,
        judge_prompt_template="Q={question} A={first_answer} B={second_answer}",
    )
    call = judge.calls[0]
    assert call["temperature"] == 0.0 and call["max_output_tokens"] == 64
    assert call["input"] == [{"role": "user", "content": "Q=" + QUESTION + r" A=7 B=\boxed{8}"}]


def test_broken_judge_template_fails_at_start_up():
    with pytest.raises(ValueError, match="literal braces must be doubled"):
        new_server(judge_prompt_template=r"\frac{1}{2} {question}")


def test_judge_verdict_reads_the_last_text_part_of_the_last_item():
    assert judge_verdict(make_response(message("intro", EQUAL_LABEL))) == EQUAL_LABEL
    assert judge_verdict(make_response(message(EQUAL_LABEL, "no verdict here"))) is None
    assert judge_verdict(make_response()) is None


# ----------------------------------------------------------------------------------------------- timeouts


def test_pathological_answer_times_out_and_the_next_one_is_graded(run_verify):
    server = new_server(math_verify_timeout_seconds=1.0, math_verify_num_workers=1)
    try:
        started = time.monotonic()
        result = run_verify(PATHOLOGICAL, expected_answer="5", server=server)
        assert time.monotonic() - started < 4.5  # math-verify alone would need > 5 s
        assert result.reward == 0.0 and result.library_reward == 0.0 and result.extracted_answer is None
        assert result.math_verify_timed_out is True and "timed out" in result.math_verify_error
        assert result.judge_evaluations is None
        # The killed worker is replaced: the same server keeps grading.
        assert run_verify(r"\boxed{7}", server=server).reward == 1.0
    finally:
        server.pool.close()


def test_timeout_still_asks_the_judge_when_enabled(run_verify):
    judge = FakeJudge(EQUAL_LABEL, EQUAL_LABEL)
    server = new_server(judge, math_verify_timeout_seconds=1.0, math_verify_num_workers=1)
    try:
        result = run_verify(PATHOLOGICAL, expected_answer="5", server=server)
        assert result.math_verify_timed_out is True and result.reward == 1.0 and len(judge.calls) == 2
    finally:
        server.pool.close()


def test_http_server_keeps_serving_after_a_timeout():
    server = new_server(math_verify_timeout_seconds=1.0, math_verify_num_workers=1)

    def body(text: str, expected: str) -> dict:
        return VERIFY.body(text, expected_answer=expected)

    try:
        with TestClient(server.build_app()) as client:
            slow = client.post("/verify", json=body(PATHOLOGICAL, "5"))
            assert slow.status_code == 200
            assert slow.json()["reward"] == 0.0 and slow.json()["math_verify_timed_out"] is True
            fine = client.post("/verify", json=body(r"\boxed{7}", "7"))
            assert fine.status_code == 200 and fine.json()["reward"] == 1.0
            assert client.post("/verify", json={"responses_create_params": PARAMS}).status_code == 422
    finally:
        server.pool.close()


# ----------------------------------------------------------------------------------------------- the worker pool

# The pool's own mechanics (timeouts, crashes, concurrency) are tested in tests/integration/test_worker_pool.py.


def test_workers_start_lazily():
    server = new_server()
    assert server._pool is None
    assert server.pool.worker_pids() == []


# ----------------------------------------------------------------------------------------------- data


def test_example_rows_validate_and_reward_ideal_answers(pool):
    rows = example_rows(__file__)
    assert len(rows) == 5
    server = new_server()
    server._pool = pool
    for row in rows:
        answer = strip_math_delimiters(row["expected_answer"])
        result = VERIFY.verify_row(row, rf"The answer is \boxed{{{answer}}}.", server=server)
        assert result.reward == 1.0, row["question"]
