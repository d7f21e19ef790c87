"""example_llm_judge: verdicts, prompt and judge failures.

Two kinds of test: `verify` called directly with the judge scripted at the HTTP transport (`FakeJudge`: each call
is a real request built by the server's real `ServerClient`), and the server over HTTP with a real judge model
server (`openai_model`) in front of the fake LLM backend, which is where a judge failure must come back as the
`judge_failed` answer of `/verify`.
"""

from __future__ import annotations

import asyncio
from typing import Iterator, Optional

import httpx
import pytest

from nemo_gym.judge import JudgeError
from nemo_gym.testing.fake_openai_server import build_app as build_fake_llm
from nemo_gym.testing.judge import FakeJudge
from nemo_gym.testing.live_server import live_server, live_servers
from nemo_gym.testing.responses import function_call, make_response, message, reasoning
from nemo_gym.testing.script import answer_rule
from nemo_gym.testing.servers import Verifier, example_rows, make_server, make_server_client
from resources_servers.example_llm_judge.app import (
    DEFAULT_JUDGE_PROMPT_TEMPLATE,
    PLACEHOLDERS,
    ExampleLLMJudgeResourcesServer,
    ExampleLLMJudgeVerifyRequest,
    read_verdict,
)
from responses_api_models.openai_model.app import SimpleModelServer

QUESTION = "What is the capital city of Canada?"
PARAMS = {"input": [{"role": "user", "content": QUESTION}]}


def new_server(judge: Optional[FakeJudge] = None, handler=None, **config) -> ExampleLLMJudgeResourcesServer:
    return make_server(
        ExampleLLMJudgeResourcesServer,
        name="example_llm_judge",
        server_client=(judge or FakeJudge()).client(handler),
        domain="knowledge",
        judge_model_server=FakeJudge.server_ref,
        **config,
    )


VERIFY = Verifier(new_server, ExampleLLMJudgeVerifyRequest, PARAMS, question=QUESTION, expected_answer="Ottawa")


def verify(*output, judge: FakeJudge, config: Optional[dict] = None, **fields):
    return VERIFY(*output, server=new_server(judge, **(config or {})), **fields)


# ----------------------------------------------------------------------------------------------- verdict reading


@pytest.mark.parametrize(
    "text, verdict",
    [
        ("Both name Ottawa.\nVERDICT: CORRECT", "correct"),
        ("Toronto is not Ottawa.\nVERDICT: INCORRECT", "incorrect"),
        ("verdict: correct", "correct"),  # any case
        ("**VERDICT:** **CORRECT**", "correct"),  # markdown emphasis
        ("__Verdict__: incorrect", "incorrect"),
        ("The verdict is correct.", None),  # the line, not the word
        ("I would write VERDICT: INCORRECT, but no.\nVERDICT: CORRECT", "correct"),  # the last one counts
        ("The answer is correct.", None),  # no verdict line
        ("VERDICT: CORRECTED", None),  # a whole word only
        ("", None),
    ],
)
def test_read_verdict(text, verdict):
    assert read_verdict(text) == verdict


# ----------------------------------------------------------------------------------------------- verify


def test_correct_verdict_scores_one_and_is_recorded():
    judge = FakeJudge("Both name Ottawa.\nVERDICT: CORRECT")
    result = verify("The capital of Canada is Ottawa.", judge=judge)
    assert result.reward == 1.0 and result.judge_verdict == "correct"
    assert result.model_answer == "The capital of Canada is Ottawa."
    assert result.judge_text == "Both name Ottawa.\nVERDICT: CORRECT"
    assert result.question == QUESTION and result.expected_answer == "Ottawa"  # the request is echoed
    assert len(judge.calls) == 1


def test_incorrect_verdict_scores_zero():
    result = verify("Toronto.", judge=FakeJudge("Different cities.\nVERDICT: INCORRECT"))
    assert result.reward == 0.0 and result.judge_verdict == "incorrect"


def test_unreadable_verdict_is_a_judge_error_by_default():
    with pytest.raises(JudgeError, match="holds no verdict.*judge_unparseable_verdict: failure"):
        verify("Ottawa.", judge=FakeJudge("Hmm, hard to say."))


def test_unreadable_verdict_scores_zero_with_judge_unparseable_verdict_zero():
    result = verify("Ottawa.", judge=FakeJudge("Hmm, hard to say."), config={"judge_unparseable_verdict": "zero"})
    assert result.reward == 0.0 and result.judge_verdict is None and result.judge_text == "Hmm, hard to say."


def test_judge_unparseable_verdict_takes_only_failure_or_zero():
    with pytest.raises(ValueError, match="judge_unparseable_verdict"):
        new_server(judge_unparseable_verdict="ignore")


def test_a_judge_slower_than_judge_timeout_s_is_a_judge_error():
    async def never_answers(request):
        await asyncio.sleep(30)

    with pytest.raises(JudgeError, match="judge server `judge` gave no answer within 0.2 s \\(judge_timeout_s"):
        verify("Ottawa.", judge=FakeJudge(), config={"judge_timeout_s": 0.2, "handler": never_answers})


REASONING_ONLY = make_response(reasoning("thinking only")).model_dump(mode="json")


@pytest.mark.parametrize("judge_reply", ["", "   \n ", REASONING_ONLY])
def test_empty_judge_reply_is_a_judge_error(judge_reply):
    with pytest.raises(JudgeError, match="^empty judge response$"):
        verify("Ottawa.", judge=FakeJudge(judge_reply))


@pytest.mark.parametrize(
    "failure, message_part",
    [
        (500, "HTTP 500"),
        ({"id": "x", "output": "not a list"}, "ValidationError"),
        (httpx.ReadTimeout("timed out"), "ReadTimeout"),
    ],
)
def test_failed_judge_call_raises_judge_error_from_verify(failure, message_part):
    # verify does not catch it: judge_failsafe around /verify turns it into the judge_failed answer (below).
    with pytest.raises(JudgeError, match=message_part):
        verify("Ottawa.", judge=FakeJudge(failure))


@pytest.mark.parametrize("output", [(), ("  ",), (reasoning("Ottawa"),), (function_call("lookup", "{}"),)])
def test_no_answer_scores_zero_without_asking_the_judge(output):
    judge = FakeJudge()
    result = verify(*output, judge=judge)
    assert result.reward == 0.0 and result.model_answer is None and result.judge_verdict is None
    assert judge.calls == []


# ----------------------------------------------------------------------------------------------- prompt and params


def test_prompt_holds_question_reference_and_answer():
    judge = FakeJudge("VERDICT: CORRECT")
    verify(message("It is", " Ottawa."), judge=judge)
    prompt = judge.prompt(0)
    assert f"Question: {QUESTION}\n" in prompt
    assert "Reference answer: Ottawa\n" in prompt
    assert "Candidate answer: It is\n Ottawa.\n" in prompt  # every text part, one per line
    assert prompt.rstrip().endswith('"VERDICT: CORRECT" or "VERDICT: INCORRECT".')
    call = judge.calls[0]
    assert [m["role"] for m in call["input"]] == ["user"] and call["temperature"] == 0.0


def test_system_message_template_and_params_from_config():
    judge = FakeJudge("VERDICT: CORRECT")
    config = {
        "judge_system_message": "You grade quizzes.",
        "judge_prompt_template": "{question} | {expected_answer} | {model_answer} | {{braces}}",
        "judge_responses_create_params": {"input": [], "max_output_tokens": 64},
    }
    verify("Ottawa", judge=judge, config=config)
    call = judge.calls[0]
    assert call["input"] == [
        {"role": "system", "content": "You grade quizzes."},
        {"role": "user", "content": f"{QUESTION} | Ottawa | Ottawa | {{braces}}"},
    ]
    assert call["max_output_tokens"] == 64 and "temperature" not in call


def test_braces_in_answers_are_not_format_fields():
    judge = FakeJudge("VERDICT: CORRECT")
    verify(r"\boxed{Ottawa}", judge=judge, expected_answer="{Ottawa}")
    assert "Reference answer: {Ottawa}\n" in judge.prompt(0) and "Candidate answer: \\boxed{Ottawa}" in judge.prompt(0)


@pytest.mark.parametrize("template", ["{answer}", "{question", "{0}", r"\frac{1}{2} {question}"])
def test_broken_template_is_refused_when_the_server_is_built(template):
    with pytest.raises(ValueError, match="judge_prompt_template cannot be filled"):
        new_server(judge_prompt_template=template)


def test_default_template_has_every_placeholder():
    for name in PLACEHOLDERS:
        assert "{" + name + "}" in DEFAULT_JUDGE_PROMPT_TEMPLATE


def test_config_declares_stateless_reverify():
    from fastapi.testclient import TestClient

    with TestClient(new_server().build_app()) as client:
        assert client.get("/reverify_mode").json() == "stateless"


# ----------------------------------------------------------------------------------------------- over HTTP, real judge

# The fake LLM answers the judge by the candidate answer in the prompt (each test uses its own answer).
JUDGE_SCRIPT = [
    answer_rule("Candidate answer: Ottawa is the capital", "Same city.\nVERDICT: CORRECT"),
    answer_rule("Candidate answer: Maybe Toronto", "Not sure what to say."),
    answer_rule("Candidate answer: judge returns nothing", ""),
    {"name": "judge down", "match": {"last_user_contains": "Candidate answer: judge is down"}, "status": 500,
     "error_message": "scripted: backend crashed"},
]
SERVE = {"stop_timeout": 15, "timeout_graceful_shutdown": 1}


@pytest.fixture(scope="module")
def judge_stack() -> Iterator[str]:
    """fake LLM <- openai_model `judge_model` (retries the backend once) <- example_llm_judge; yields its URL."""
    global_config: dict = {}
    client = make_server_client(global_config)
    with live_server(build_fake_llm(script=JUDGE_SCRIPT), **SERVE) as backend:
        judge_model = make_server(
            SimpleModelServer, name="judge_model", server_client=client,
            openai_base_url=backend + "/v1", openai_api_key="dummy", openai_model="fake-model", max_attempts=2,
        )
        resources = make_server(
            ExampleLLMJudgeResourcesServer, name="example_llm_judge", server_client=client, domain="knowledge",
            judge_model_server={"type": "responses_api_models", "name": "judge_model"},
        )
        servers = {"judge_model": judge_model, "example_llm_judge": resources}
        with live_servers(servers, global_config, **SERVE) as urls:
            yield urls["example_llm_judge"]


def post_verify(url: str, answer: str) -> httpx.Response:
    return httpx.post(url + "/verify", json=VERIFY.body(answer), timeout=60)


def test_real_judge_verdict(judge_stack):
    answer = post_verify(judge_stack, "Ottawa is the capital of Canada.")
    assert answer.status_code == 200, answer.text
    data = answer.json()
    assert data["reward"] == 1.0 and data["judge_verdict"] == "correct"
    assert data["judge_text"] == "Same city.\nVERDICT: CORRECT"
    assert "_ng_failure_class" not in data


@pytest.mark.parametrize(
    "answer, error_part",
    [("judge is down", "HTTP 500"), ("judge returns nothing", "empty judge response"),
     ("Maybe Toronto?", "holds no verdict")],
)
def test_judge_failure_is_a_judge_failed_answer(judge_stack, answer, error_part):
    reply = post_verify(judge_stack, answer)
    assert reply.status_code == 200, reply.text
    data = reply.json()
    assert data["reward"] == 0.0
    assert data["_ng_failure_class"] == "judge_failed"
    assert error_part in data["_ng_failure_judge_error"]
    assert "_ng_failure_terminal" not in data  # retryable
    # The request's fields come back; this server's own answer fields do not.
    assert data["question"] == QUESTION and data["expected_answer"] == "Ottawa"
    assert data["response"]["output"][0]["content"][0]["text"] == answer
    assert not {"judge_verdict", "judge_text", "model_answer"} & set(data)


def test_bad_verify_body_is_still_a_422(judge_stack):
    reply = httpx.post(judge_stack + "/verify", json={"question": QUESTION}, timeout=60)
    assert reply.status_code == 422 and "expected_answer" in reply.text


# ----------------------------------------------------------------------------------------------- data


def test_example_rows_validate():
    rows = example_rows(__file__)
    assert len(rows) == 5
    for row in rows:
        request = VERIFY.row_request(row, message("placeholder"))
        assert request.question and request.expected_answer
        # The question the judge sees is the one the model was asked.
        assert request.responses_create_params.input[-1].content == request.question


def test_verify_of_every_example_row_asks_the_judge_once():
    judge = FakeJudge(*["VERDICT: CORRECT"] * 5)
    server = new_server(judge)
    rows = example_rows(__file__)
    results = [asyncio.run(server.verify(VERIFY.row_request(row, "an answer"))) for row in rows]
    assert [r.reward for r in results] == [1.0] * 5 and len(judge.calls) == 5
    for i, row in enumerate(rows):
        assert f"Question: {row['question']}\nReference answer: {row['expected_answer']}\n" in judge.prompt(i)
