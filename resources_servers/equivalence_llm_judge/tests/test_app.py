import asyncio
from typing import Optional

import httpx
import pytest
from fastapi.testclient import TestClient

from nemo_gym.judge import JudgeError
from nemo_gym.openai_utils import NeMoGymResponseCreateParamsNonStreaming
from nemo_gym.testing.judge import FakeJudge
from nemo_gym.testing.responses import function_call, function_call_output, make_response, message, reasoning
from nemo_gym.testing.servers import Verifier, example_rows, make_server
from resources_servers.equivalence_llm_judge.app import (
    DEFAULT_JUDGE_PROMPT_TEMPLATE,
    LLMJudgeResourcesServer,
    LLMJudgeVerifyRequest,
    last_assistant_text,
    last_match,
    last_user_text,
    verdict_of,
)

EQ, NEQ = "[[A=B]]", "[[A!=B]]"
QUESTION = "What is the capital city of Australia?"
PARAMS = {"input": [{"role": "user", "content": QUESTION}]}
ANSWER_REGEX = r"Answer:\s*([^\n]+)"
ROW_REGEX = {"output_regex": ANSWER_REGEX}


# ----------------------------------------------------------------------------------------------- helpers


def new_server(judge: Optional[FakeJudge] = None, handler=None, **config) -> LLMJudgeResourcesServer:
    return make_server(
        LLMJudgeResourcesServer,
        name="equivalence_llm_judge",
        server_client=(judge or FakeJudge()).client(handler),
        domain="knowledge",
        judge_model_server=FakeJudge.server_ref,
        **config,
    )


VERIFY = Verifier(new_server, LLMJudgeVerifyRequest, PARAMS, expected_answer="Canberra")


def verify(*output, judge: FakeJudge, params=PARAMS, config: Optional[dict] = None, **fields):
    return VERIFY(*output, server=new_server(judge, **(config or {})), responses_create_params=params, **fields)


def labels(result) -> list:
    return [evaluation.verdict_label for evaluation in result.judge_evaluations]


# ----------------------------------------------------------------------------------------------- text helpers


@pytest.mark.parametrize(
    "pattern, text, found",
    [
        (ANSWER_REGEX, "Answer: Paris\nAnswer: Canberra", "Canberra"),  # the last match
        (r"Answer:\s*(\w+)|Final:\s*(\w+)", "Final: Canberra", "Canberra"),  # the first non-empty group
        (r"Answer:\s*()(\w*)", "Answer: Canberra", "Canberra"),  # empty groups are skipped
        (r"Canberra", "It is Canberra.", "Canberra"),  # no groups: the whole match
        (r"Answer:\s*(.+)", "Answer: a\nb", "a\nb"),  # dot matches newlines
        (r"^Answer: (\w+)$", "x\nAnswer: Canberra\ny", "Canberra"),  # multiline anchors
        (ANSWER_REGEX, "No answer line", None),
        ("(", "Answer: Canberra", None),  # an invalid pattern extracts nothing
        (None, "Answer: Canberra", None),
        ("", "Answer: Canberra", None),
    ],
)
def test_last_match(pattern, text, found):
    assert last_match(pattern, text) == found


def test_last_assistant_text_reads_only_the_last_message():
    response = make_response(
        message("first message", msg_id="m1"),
        function_call("f", {}, call_id="c1"),
        function_call_output("tool says Sydney", call_id="c1"),
        message("part one", " part two ", msg_id="m2"),
        reasoning("thinking"),
    )
    assert last_assistant_text(response) == "part one\n part two"
    assert last_assistant_text(make_response()) == ""
    assert last_assistant_text(make_response({"type": "message", "role": "assistant", "content": " hi "})) == "hi"


def test_last_user_text():
    assert last_user_text(NeMoGymResponseCreateParamsNonStreaming(input=" plain ")) == "plain"
    params = NeMoGymResponseCreateParamsNonStreaming(
        input=[
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": "first question"},
            {"role": "assistant", "content": "an answer"},
            {
                "role": "user",
                "content": [{"type": "input_text", "text": "second"}, {"type": "input_text", "text": "question"}],
            },
        ]
    )
    assert last_user_text(params) == "second\nquestion"
    assert last_user_text(NeMoGymResponseCreateParamsNonStreaming(input=[{"role": "system", "content": "x"}])) == ""


def test_verdict_of():
    assert verdict_of(make_response(f"same {EQ}"), EQ, NEQ) == EQ
    assert verdict_of(make_response(f"{NEQ} though maybe {EQ}"), EQ, NEQ) == NEQ  # the first label wins
    assert verdict_of(make_response("no label"), EQ, NEQ) is None
    assert verdict_of(make_response(message(EQ, "no label in the last part")), EQ, NEQ) is None
    assert verdict_of(make_response(message(EQ), reasoning(item_id="r")), EQ, NEQ) is None
    assert verdict_of(make_response(), EQ, NEQ) is None
    assert verdict_of(make_response("<<yes>>"), "<<yes>>", "<<no>>") == "<<yes>>"


# ----------------------------------------------------------------------------------------------- verdicts


def test_equal():
    judge = FakeJudge(f"Both name Canberra. {EQ}")
    result = verify("It is Canberra.", judge=judge)
    assert result.reward == 1.0 and result.failure_reason is None and result.judge_error is None
    assert labels(result) == [EQ] and len(judge.calls) == 1
    assert result.expected_answer == "Canberra" and result.extracted_answer == "It is Canberra."
    prompt = judge.prompt(0)
    assert f"<question>\n{QUESTION}\n</question>" in prompt
    assert "<answer_a>\nCanberra\n</answer_a>" in prompt and "<answer_b>\nIt is Canberra.\n</answer_b>" in prompt
    assert f"{EQ} if the answers are equivalent, {NEQ} if they are not" in prompt
    assert [m["role"] for m in judge.calls[0]["input"]] == ["user"]  # no system message by default
    assert result.judge_evaluations[0].response.output_text == f"Both name Canberra. {EQ}"


def test_not_equal():
    result = verify("It is Sydney.", judge=FakeJudge(f"Different cities. {NEQ}"))
    assert result.reward == 0.0 and result.failure_reason == "not_equal" and labels(result) == [NEQ]


def test_no_verdict_is_a_judge_error_by_default():
    with pytest.raises(JudgeError, match=r"holds no verdict \(neither \[\[A=B\]\] nor \[\[A!=B\]\]\)"):
        verify("It is Canberra.", judge=FakeJudge("I cannot decide."))


def test_no_verdict_is_not_equal_and_recorded_with_judge_unparseable_verdict_zero():
    result = verify("It is Canberra.", judge=FakeJudge("I cannot decide."), config={"judge_unparseable_verdict": "zero"})
    assert result.reward == 0.0 and result.failure_reason == "no_verdict" and labels(result) == [None]


def test_no_verdict_on_the_swap_call_is_a_judge_error_by_default():
    with pytest.raises(JudgeError, match="holds no verdict"):
        verify("It is Canberra.", judge=FakeJudge(EQ, "hmm"), config={"check_twice_swap": True})


def test_first_label_wins():
    result = verify("It is Canberra.", judge=FakeJudge(f"{NEQ}... on reflection {EQ}"))
    assert result.reward == 0.0 and result.failure_reason == "not_equal"


def test_custom_labels():
    judge = FakeJudge("SAME")
    result = verify("Canberra", judge=judge, config={"judge_equal_label": "SAME", "judge_not_equal_label": "DIFF"})
    assert result.reward == 1.0 and "SAME if the answers are equivalent, DIFF if they are not" in judge.prompt(0)


# ----------------------------------------------------------------------------------------------- swap check


def test_swap_check_passes():
    judge = FakeJudge(EQ, EQ)
    result = verify("It is Canberra.", judge=judge, config={"check_twice_swap": True})
    assert result.reward == 1.0 and labels(result) == [EQ, EQ]
    assert "<answer_a>\nIt is Canberra.\n</answer_a>" in judge.prompt(1)  # swapped
    assert "<answer_b>\nCanberra\n</answer_b>" in judge.prompt(1)


def test_swap_check_failure_scores_reward_if_swap_fails():
    config = {"check_twice_swap": True, "reward_if_swap_fails": -1.0}
    result = verify("It is Sydney.", judge=FakeJudge(EQ, NEQ), config=config)
    assert result.reward == -1.0 and result.failure_reason == "swap_check_failed" and labels(result) == [EQ, NEQ]


def test_swap_check_is_not_run_after_not_equal():
    judge = FakeJudge(NEQ)
    result = verify("It is Sydney.", judge=judge, config={"check_twice_swap": True})
    assert result.reward == 0.0 and len(judge.calls) == 1


# ----------------------------------------------------------------------------------------------- malformed output


@pytest.mark.parametrize(
    "output",
    [
        (),
        ("   ",),
        (reasoning("Canberra"),),
        (function_call("lookup", '{"city"', call_id="c1"),),
        ({"id": "m", "type": "message", "role": "assistant", "content": [{"type": "refusal", "refusal": "no"}]},),
    ],
)
def test_no_answer_scores_zero_without_calling_the_judge(output):
    judge = FakeJudge()
    result = verify(*output, judge=judge)
    assert result.reward == 0.0 and result.failure_reason == "no_answer" and judge.calls == []
    assert result.extracted_answer is None and result.judge_evaluations == []


def test_missing_expected_answer():
    judge = FakeJudge()
    result = verify("Canberra", judge=judge, expected_answer=None)
    assert result.reward == 0.0 and result.failure_reason == "no_expected_answer" and judge.calls == []
    assert result.expected_answer == ""


def test_expected_answer_from_metadata():
    result = verify("Canberra", judge=FakeJudge(EQ), expected_answer=None, metadata={"expected_answer": "Canberra"})
    assert result.reward == 1.0 and result.expected_answer == "Canberra"


# ----------------------------------------------------------------------------------------------- extraction


def test_server_regex_extracts_the_answer():
    judge = FakeJudge(EQ)
    result = verify("Let me think.\nAnswer: Canberra", judge=judge, config={"response_extract_regex": ANSWER_REGEX})
    assert result.reward == 1.0 and result.extracted_answer == "Canberra" and result.extraction_failed is False
    assert "<answer_b>\nCanberra\n</answer_b>" in judge.prompt(0)


def test_regex_without_a_match_judges_the_whole_answer():
    judge = FakeJudge(EQ)
    result = verify("Canberra, I think.", judge=judge, config={"response_extract_regex": ANSWER_REGEX})
    assert result.reward == 1.0 and result.extraction_failed is True
    assert "<answer_b>\nCanberra, I think.\n</answer_b>" in judge.prompt(0)


def test_row_regex_overrides_the_server_regex():
    judge = FakeJudge(EQ)
    config = {"response_extract_regex": r"Final:\s*(\w+)"}
    text = "Final: Sydney\nAnswer: Canberra"
    result = verify(text, judge=judge, config=config, template_metadata={"output_regex": ANSWER_REGEX})
    assert result.extracted_answer == "Canberra"
    judge = FakeJudge(EQ)
    config["use_per_record_regex"] = False
    result = verify(text, judge=judge, config=config, template_metadata={"output_regex": ANSWER_REGEX})
    assert result.extracted_answer == "Sydney"


def test_question_extract_regex():
    judge = FakeJudge(EQ)
    params = {"input": [{"role": "user", "content": f"Answer briefly.\nQuestion: {QUESTION}\nThanks."}]}
    verify("Canberra", judge=judge, params=params, config={"question_extract_regex": r"Question:\s*([^\n]+)"})
    assert f"<question>\n{QUESTION}\n</question>" in judge.prompt(0)


# ----------------------------------------------------------------------------------------------- full-generation retry


def test_full_generation_retry_gives_partial_credit():
    judge = FakeJudge(NEQ, EQ)
    text = "The capital is Canberra (not Sydney).\nAnswer: Sydney is not it"
    result = verify(text, judge=judge, template_metadata={"output_regex": ANSWER_REGEX})
    assert result.reward == 0.5 and result.failure_reason is None and labels(result) == [NEQ, EQ]
    assert "<answer_b>\nSydney is not it\n</answer_b>" in judge.prompt(0)
    assert f"<answer_b>\n{text}\n</answer_b>" in judge.prompt(1)


def test_full_generation_retry_also_not_equal():
    judge = FakeJudge(NEQ, NEQ)
    result = verify("Answer: Sydney", judge=judge, template_metadata={"output_regex": ANSWER_REGEX})
    assert result.reward == 0.0 and result.failure_reason == "not_equal" and len(judge.calls) == 2


def test_full_generation_retry_needs_a_row_regex_and_is_configurable():
    # Only the server's regex: no retry.
    judge = FakeJudge(NEQ)
    verify("Answer: Sydney", judge=judge, config={"response_extract_regex": ANSWER_REGEX})
    assert len(judge.calls) == 1
    # Turned off.
    judge = FakeJudge(NEQ)
    config = {"check_full_generation_on_fail": False}
    verify("Answer: Sydney", judge=judge, config=config, template_metadata={"output_regex": ANSWER_REGEX})
    assert len(judge.calls) == 1
    # The regex did not match, so the whole answer was already judged: no second call.
    judge = FakeJudge(NEQ)
    result = verify("Sydney", judge=judge, template_metadata={"output_regex": ANSWER_REGEX})
    assert len(judge.calls) == 1 and result.extraction_failed is True


def test_long_expected_answer_is_compared_with_the_whole_answer():
    expected = "Canberra, which was purpose-built as a compromise between Sydney and Melbourne. " * 2
    config = {"check_twice_swap": True, "extraction_length_threshold": 50}
    text = "Long story.\nAnswer: Canberra"
    judge = FakeJudge(EQ)  # no swap check either
    result = verify(text, judge=judge, config=config, expected_answer=expected, template_metadata=ROW_REGEX)
    assert result.reward == 1.0 and len(judge.calls) == 1 and result.extracted_answer == text
    judge = FakeJudge(NEQ)  # no full-generation retry
    result = verify(text, judge=judge, config=config, expected_answer=expected, template_metadata=ROW_REGEX)
    assert result.reward == 0.0 and len(judge.calls) == 1
    # With no limit the row regex applies.
    judge = FakeJudge(EQ, EQ)
    config["extraction_length_threshold"] = None
    result = verify(text, judge=judge, config=config, expected_answer=expected, template_metadata=ROW_REGEX)
    assert result.extracted_answer == "Canberra" and len(judge.calls) == 2


# ----------------------------------------------------------------------------------------------- judge errors


@pytest.mark.parametrize(
    "failure, message_part",
    [
        (500, "HTTP 500"),
        (404, "HTTP 404"),
        ({"id": "x", "output": "not a list"}, "ValidationError"),
        (httpx.ConnectError("connection refused"), "ConnectError"),
        (httpx.ReadTimeout("timed out"), "ReadTimeout"),
    ],
)
def test_a_failed_judge_call_is_a_judge_error_not_a_score(failure, message_part):
    # verify does not catch it: judge_failsafe around /verify answers judge_failed (test_http_verify).
    with pytest.raises(JudgeError, match=message_part):
        verify("It is Canberra.", judge=FakeJudge(failure))


def test_judge_returning_non_json_is_a_judge_error():
    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, content=b"<html>gateway</html>")

    with pytest.raises(JudgeError):
        VERIFY("Canberra", server=new_server(handler=handler))


def test_judge_error_on_the_swap_call_is_a_judge_error():
    with pytest.raises(JudgeError, match="HTTP 503"):
        verify("It is Canberra.", judge=FakeJudge(EQ, 503), config={"check_twice_swap": True})


def test_a_judge_slower_than_judge_timeout_s_is_a_judge_error():
    async def never_answers(request):
        await asyncio.sleep(30)

    server = new_server(handler=never_answers, judge_timeout_s=0.2)
    with pytest.raises(JudgeError, match=r"judge server `judge` gave no answer within 0.2 s \(judge_timeout_s"):
        VERIFY("Canberra", server=server)


# ----------------------------------------------------------------------------------------------- prompt and params


def test_prompt_template_system_message_and_params_from_config():
    judge = FakeJudge(EQ)
    config = {
        "judge_system_message": "You are a careful grader.",
        "judge_prompt_template": "Q: {question}\nGold: {expected_answer}\nGot: {generated_answer}\n{{literal}}",
        "judge_responses_create_params": {"input": [], "temperature": 0.0, "max_output_tokens": 32},
    }
    verify("Canberra.", judge=judge, config=config)
    call = judge.calls[0]
    assert call["temperature"] == 0.0 and call["max_output_tokens"] == 32
    assert call["input"] == [
        {"role": "system", "content": "You are a careful grader."},
        {"role": "user", "content": f"Q: {QUESTION}\nGold: Canberra\nGot: Canberra.\n{{literal}}"},
    ]


def test_prompt_template_from_a_file(tmp_path):
    template = tmp_path / "judge.txt"
    template.write_text("A={expected_answer} B={generated_answer}")
    judge = FakeJudge(EQ)
    verify("Canberra", judge=judge, config={"judge_prompt_template_fpath": str(template)})
    assert judge.prompt(0) == "A=Canberra B=Canberra"
    with pytest.raises(FileNotFoundError, match="judge_prompt_template_fpath"):
        new_server(judge_prompt_template_fpath="no/such/template.txt")


def test_a_relative_template_path_is_found_in_the_search_roots(tmp_path, monkeypatch):
    # A v0.5 benchmark names its template from the checkout's root (`benchmarks/hle/prompts/judge.txt`); ng_run
    # puts the folder it was started in on NEMO_GYM_EXTRA_ROOTS for its servers, which run in their own folder.
    template = tmp_path / "benchmarks/quiz/prompts/judge.txt"
    template.parent.mkdir(parents=True)
    template.write_text("Gold={expected_answer} Got={generated_answer}")
    monkeypatch.setenv("NEMO_GYM_EXTRA_ROOTS", str(tmp_path))
    judge = FakeJudge(EQ)
    verify("Canberra", judge=judge, config={"judge_prompt_template_fpath": "benchmarks/quiz/prompts/judge.txt"})
    assert judge.prompt(0) == "Gold=Canberra Got=Canberra"
    monkeypatch.delenv("NEMO_GYM_EXTRA_ROOTS")
    with pytest.raises(FileNotFoundError, match="benchmarks/quiz/prompts/judge.txt"):
        new_server(judge_prompt_template_fpath="benchmarks/quiz/prompts/judge.txt")


@pytest.mark.parametrize("template", ["{answer}", r"\frac{1}{2} {question}", "{0}", "{question"])
def test_broken_templates_fail_at_start_up(template):
    with pytest.raises(ValueError, match="literal braces must be doubled"):
        new_server(judge_prompt_template=template)


def test_braces_in_answers_are_not_format_fields():
    judge = FakeJudge(EQ)
    verify(r"\boxed{x}", judge=judge, expected_answer="{x}")
    assert "<answer_a>\n{x}\n</answer_a>" in judge.prompt(0)
    assert "<answer_b>\n\\boxed{x}\n</answer_b>" in judge.prompt(0)


def test_default_template_has_every_placeholder():
    for name in ("question", "expected_answer", "generated_answer", "equal_label", "not_equal_label"):
        assert "{" + name + "}" in DEFAULT_JUDGE_PROMPT_TEMPLATE


def test_judge_calls_are_bounded_by_max_concurrency():
    in_flight = peak = 0

    async def handler(request: httpx.Request) -> httpx.Response:
        nonlocal in_flight, peak
        in_flight += 1
        peak = max(peak, in_flight)
        await asyncio.sleep(0.05)
        in_flight -= 1
        return httpx.Response(200, json=make_response(EQ).model_dump(mode="json"))

    server = new_server(handler=handler, judge_endpoint_max_concurrency=2)
    body = VERIFY.request("Canberra")

    async def many():
        return await asyncio.gather(*(server.verify(body) for _ in range(8)))

    results = asyncio.run(many())
    assert [r.reward for r in results] == [1.0] * 8 and peak == 2


# ----------------------------------------------------------------------------------------------- echo and HTTP


def test_row_fields_are_echoed():
    result = verify(
        "Canberra", judge=FakeJudge(EQ), uuid="q-7", options=[{"A": "Canberra"}], metadata={"source": "test"},
        category="geography",  # not declared: kept as well
    )
    dumped = result.model_dump()
    assert dumped["uuid"] == "q-7" and dumped["options"] == [{"A": "Canberra"}]
    assert dumped["metadata"] == {"source": "test"} and dumped["category"] == "geography"


def test_http_verify():
    judge = FakeJudge(EQ, 500)
    with TestClient(new_server(judge).build_app()) as client:
        body = VERIFY.body("Canberra")
        ok = client.post("/verify", json=body)
        assert ok.status_code == 200 and ok.json()["reward"] == 1.0
        assert ok.json()["judge_evaluations"][0]["verdict_label"] == EQ
        failed = client.post("/verify", json=body)  # the judge answers 500: a judge_failed answer, not a score
        assert failed.status_code == 200 and failed.json()["_ng_failure_class"] == "judge_failed"
        assert "HTTP 500" in failed.json()["_ng_failure_judge_error"]
        assert client.post("/verify", json={"expected_answer": "x"}).status_code == 422


# ----------------------------------------------------------------------------------------------- data


def test_example_rows_validate():
    rows = example_rows(__file__)
    assert len(rows) == 5
    requests = [VERIFY.row_request(row, "placeholder") for row in rows]
    assert all(request.expected_answer for request in requests)
    assert any(request.template_metadata for request in requests)
