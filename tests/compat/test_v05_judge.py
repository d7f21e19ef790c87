"""Judge calls written the NeMo Gym v0.5 way (`nemo_gym.judge`) run unchanged.

The environment code below is ours, written from the v0.5 contract: a short-answer QA verifier that asks a judge
model through `call_judge` (on `/v1/responses` or `/v1/chat/completions`), raises `JudgeError("empty judge
response")` for an empty verdict, and leaves every call failure to the `judge_failsafe` that `SimpleResourcesServer`
puts around `/verify`. It runs against a real judge model server (`openai_model`) in front of the fake LLM backend,
all served by uvicorn on loopback.

Covered: `reraise_judge_errors` (pass-through, wrapping as "<ExcClassName>: <str>", chaining); `call_judge` for a
good verdict, an HTTP 500 / 401 from the backend (an HTTP error, not a schema error), a body that is not the
expected schema, a body that is not JSON, an unknown judge server; `judge_failsafe` (the `judge_failed` answer,
locating the body, `RuntimeError` without one, other errors untouched, the signature kept, an explicit wrap on a
re-registered `/verify`); and environment tests written the v0.5 way, with a mocked `server_client.post` that
reads the judge prompt back from the request model `call_judge` hands it.
"""

from __future__ import annotations

import asyncio
import inspect
from typing import Any, Iterator, Optional
from unittest.mock import AsyncMock, MagicMock

import httpx
import orjson
import pytest
from fastapi import FastAPI, Request
from fastapi.responses import PlainTextResponse
from pydantic import BaseModel

from nemo_gym.base_resources_server import (
    BaseResourcesServerConfig,
    BaseRunRequest,
    BaseVerifyRequest,
    BaseVerifyResponse,
    SimpleResourcesServer,
)
from nemo_gym.config_types import ModelServerRef
from nemo_gym.http.response import encode_json_body
from nemo_gym.judge import JudgeError, call_judge, judge_failsafe, reraise_judge_errors
from nemo_gym.openai_utils import (
    NeMoGymChatCompletion,
    NeMoGymEasyInputMessage,
    NeMoGymResponse,
    NeMoGymResponseCreateParamsNonStreaming,
)
from nemo_gym.server_utils import ServerClient
from nemo_gym.testing.fake_openai_server import build_app as build_fake_llm
from nemo_gym.testing.live_server import live_server, live_servers, server_block
from nemo_gym.testing.responses import make_response
from nemo_gym.testing.servers import make_server, make_server_client
from responses_api_models.openai_model.app import SimpleModelServer

# ------------------------------------------------------------------------------------------------------------
# v0.5-style environment code


class QAJudgeConfig(BaseResourcesServerConfig):
    judge_model_server: ModelServerRef
    judge_url_path: str = "/v1/responses"


class QARunRequest(BaseRunRequest):
    question: str
    expected_answer: str


class QAVerifyRequest(QARunRequest, BaseVerifyRequest):
    pass


class QAVerifyResponse(QAVerifyRequest, BaseVerifyResponse):
    judge_grade: Optional[str] = None


def judge_prompt(body: QAVerifyRequest) -> str:
    predicted = body.response.output_text
    return (
        f"Question: {body.question}\nGold target: {body.expected_answer}\nPredicted answer: {predicted}\n"
        "Grade the predicted answer. Reply with GRADE: A if it is correct, GRADE: B if it is not."
    )


class QAJudgeServer(SimpleResourcesServer):
    config: QAJudgeConfig

    async def judge_text(self, prompt: str) -> str:
        messages = [{"role": "user", "content": prompt}]
        if self.config.judge_url_path == "/v1/chat/completions":
            completion = await call_judge(
                self.server_client,
                server_name=self.config.judge_model_server.name,
                url_path="/v1/chat/completions",
                json={"messages": messages},
                response_model=NeMoGymChatCompletion,
            )
            return completion.choices[0].message.content or ""
        response = await call_judge(
            self.server_client,
            server_name=self.config.judge_model_server.name,
            url_path="/v1/responses",
            json=NeMoGymResponseCreateParamsNonStreaming(input=messages),
            response_model=NeMoGymResponse,
        )
        return response.output_text

    async def verify(self, body: QAVerifyRequest) -> QAVerifyResponse:
        text = await self.judge_text(judge_prompt(body))
        if not text.strip():
            raise JudgeError("empty judge response")
        grade = "A" if "GRADE: A" in text else ("B" if "GRADE: B" in text else None)  # no grade: scored 0
        return QAVerifyResponse(**body.model_dump(), reward=1.0 if grade == "A" else 0.0, judge_grade=grade)


EXPLICIT_VERIFY_PATHS: list[str] = []  # what ExplicitFailsafeServer's own handler saw


class ExplicitFailsafeServer(QAJudgeServer):
    """A server that registers its own `/verify` (with the Request too) and so wraps it in judge_failsafe itself."""

    def setup_webserver(self) -> FastAPI:
        app = super().setup_webserver()
        app.router.routes = [r for r in app.router.routes if getattr(r, "path", None) != "/verify"]
        app.post("/verify")(judge_failsafe(self.verify_with_request))
        return app

    async def verify_with_request(self, request: Request, body: QAVerifyRequest) -> QAVerifyResponse:
        EXPLICIT_VERIFY_PATHS.append(request.url.path)
        return await self.verify(body)


# ------------------------------------------------------------------------------------------------------------
# The stack: fake LLM <- openai_model `judge_model` <- the QA servers; plus a judge endpoint answering HTML.

RULES = [
    {"name": "good", "match": {"last_user_contains": "[good]"}, "output": ["Matches the gold target. GRADE: A"]},
    {"name": "wrong", "match": {"last_user_contains": "[wrong]"}, "output": ["Different. GRADE: B"]},
    {"name": "no grade", "match": {"last_user_contains": "[no-grade]"}, "output": ["I am not sure."]},
    {"name": "empty", "match": {"last_user_contains": "[empty]"}, "output": [""]},
    {"name": "500", "match": {"last_user_contains": "[500]"}, "status": 500, "error_message": "backend exploded"},
    {"name": "401", "match": {"last_user_contains": "[401]"}, "status": 401, "error_message": "bad api key"},
    {"name": "not a response", "match": {"last_user_contains": "[malformed]"}, "response": {"output": "not a list"}},
]
SERVE = {"stop_timeout": 15, "timeout_graceful_shutdown": 1}


def html_gateway() -> FastAPI:
    """A judge address that answers 200 with an HTML page (a proxy in front of a judge that is not there)."""
    app = FastAPI()

    @app.post("/v1/responses")
    async def page() -> PlainTextResponse:
        return PlainTextResponse("<html><body>Service temporarily moved</body></html>", media_type="text/html")

    return app


class Stack:
    def __init__(self, urls: dict[str, str], global_config: dict):
        self.urls = urls
        self.global_config = global_config

    def verify(self, tag: str, server: str = "qa", **extra: Any) -> httpx.Response:
        body = {
            "responses_create_params": {"input": [{"role": "user", "content": f"{tag} What is 2 + 2?"}]},
            "question": f"{tag} What is 2 + 2?",
            "expected_answer": "4",
            "response": make_response("It is 4.").model_dump(mode="json"),
            **extra,
        }
        return httpx.post(self.urls[server] + "/verify", json=body, timeout=60)

    def call_judge(self, tag: str, *, server_name: str = "judge_model", url_path: str = "/v1/responses",
                   response_model: type = NeMoGymResponse) -> Any:
        """`call_judge` from this test with a ServerClient of the stack's config."""
        client = make_server_client(self.global_config)
        if url_path == "/v1/chat/completions":
            payload: Any = {"messages": [{"role": "user", "content": f"{tag} grade this"}]}
        else:
            payload = NeMoGymResponseCreateParamsNonStreaming(input=[{"role": "user", "content": f"{tag} grade this"}])
        return asyncio.run(
            call_judge(client, server_name=server_name, url_path=url_path, json=payload, response_model=response_model)
        )


@pytest.fixture(scope="module")
def stack() -> Iterator[Stack]:
    global_config: dict = {}
    client = make_server_client(global_config)
    judge_ref = {"type": "responses_api_models", "name": "judge_model"}
    with live_server(build_fake_llm(script=RULES), **SERVE) as backend, live_server(html_gateway(), **SERVE) as html:
        global_config["html_gateway"] = server_block("responses_api_models", html)
        servers = {
            # The model server retries a backend 5xx once, then answers with the backend's status.
            "judge_model": make_server(
                SimpleModelServer, name="judge_model", server_client=client, openai_base_url=backend + "/v1",
                openai_api_key="dummy", openai_model="fake-model", max_attempts=2,
            ),
            "qa": make_server(QAJudgeServer, name="qa", server_client=client, domain="knowledge",
                              judge_model_server=judge_ref),
            "qa_chat": make_server(QAJudgeServer, name="qa_chat", server_client=client, domain="knowledge",
                                   judge_model_server=judge_ref, judge_url_path="/v1/chat/completions"),
            "qa_html": make_server(QAJudgeServer, name="qa_html", server_client=client, domain="knowledge",
                                   judge_model_server={"type": "responses_api_models", "name": "html_gateway"}),
            "qa_explicit": make_server(ExplicitFailsafeServer, name="qa_explicit", server_client=client,
                                       domain="knowledge", judge_model_server=judge_ref),
        }
        with live_servers(servers, global_config, **SERVE) as urls:
            yield Stack(urls, global_config)


def assert_judge_failed(answer: httpx.Response, error_part: str) -> dict:
    """The judge_failed answer: HTTP 200, reward 0, the failure class and message, retryable, request fields only."""
    assert answer.status_code == 200, answer.text
    data = answer.json()
    assert data["reward"] == 0.0
    assert data["_ng_failure_class"] == "judge_failed"
    assert error_part in data["_ng_failure_judge_error"], data["_ng_failure_judge_error"]
    assert "_ng_failure_terminal" not in data
    assert data["expected_answer"] == "4" and data["question"].endswith("What is 2 + 2?")
    assert data["response"]["output"][0]["content"][0]["text"] == "It is 4."
    assert "judge_grade" not in data  # the server's own answer fields are absent
    return data


# ------------------------------------------------------------------------------------------------------------
# reraise_judge_errors


async def _raise(exc: BaseException) -> None:
    raise exc


async def _value() -> int:
    return 42


def test_reraise_returns_the_value():
    assert asyncio.run(reraise_judge_errors(_value())) == 42


@pytest.mark.parametrize(
    "exc, message",
    [
        (ValueError("no verdict field"), "ValueError: no verdict field"),
        (httpx.ReadTimeout("timed out"), "ReadTimeout: timed out"),
        (KeyError("choices"), "KeyError: 'choices'"),  # str() of the exception, as Python gives it
        (RuntimeError(), "RuntimeError: "),
    ],
)
def test_reraise_wraps_other_exceptions_with_class_name_and_chains(exc, message):
    with pytest.raises(JudgeError) as info:
        asyncio.run(reraise_judge_errors(_raise(exc)))
    assert str(info.value) == message
    assert info.value.__cause__ is exc
    assert isinstance(info.value, Exception)


def test_reraise_lets_judge_errors_through_unchanged():
    class GraderDown(JudgeError):
        pass

    for original in (JudgeError("empty judge response"), GraderDown("grader down")):
        with pytest.raises(JudgeError) as info:
            asyncio.run(reraise_judge_errors(_raise(original)))
        assert info.value is original and info.value.__cause__ is None


def test_reraise_does_not_touch_cancellation():
    with pytest.raises(asyncio.CancelledError):
        asyncio.run(reraise_judge_errors(_raise(asyncio.CancelledError())))


# ------------------------------------------------------------------------------------------------------------
# call_judge against the real judge model server


def test_good_verdict_through_verify(stack):
    answer = stack.verify("[good]")
    assert answer.status_code == 200, answer.text
    data = answer.json()
    assert data["reward"] == 1.0 and data["judge_grade"] == "A" and "_ng_failure_class" not in data
    assert stack.verify("[wrong]").json()["reward"] == 0.0


def test_call_judge_returns_the_response_model(stack):
    response = stack.call_judge("[good]")
    assert isinstance(response, NeMoGymResponse)
    assert response.output_text == "Matches the gold target. GRADE: A"


def test_call_judge_on_chat_completions(stack):
    completion = stack.call_judge("[good]", url_path="/v1/chat/completions", response_model=NeMoGymChatCompletion)
    assert isinstance(completion, NeMoGymChatCompletion)
    assert completion.choices[0].message.content == "Matches the gold target. GRADE: A"
    answer = stack.verify("[good]", server="qa_chat")
    assert answer.status_code == 200 and answer.json()["reward"] == 1.0


def test_a_reply_without_a_verdict_is_scored_not_failed(stack):
    data = stack.verify("[no-grade]").json()
    assert data["reward"] == 0.0 and data["judge_grade"] is None and "_ng_failure_class" not in data


def test_backend_500_is_a_judge_failed_answer(stack):
    data = assert_judge_failed(stack.verify("[500]"), "HTTP 500")
    assert "backend exploded" in data["_ng_failure_judge_error"]
    assert_judge_failed(stack.verify("[500]", server="qa_chat"), "HTTP 500")


def test_backend_500_from_call_judge_is_a_chained_http_error(stack):
    with pytest.raises(JudgeError) as info:
        stack.call_judge("[500]")
    cause = info.value.__cause__
    assert getattr(cause, "status", None) == 500
    assert str(info.value) == f"{type(cause).__name__}: {cause}"


def test_401_reports_as_an_http_error_not_a_schema_error(stack):
    # The status is checked before the body is parsed: the error body would not validate as a Response either.
    with pytest.raises(JudgeError) as info:
        stack.call_judge("[401]")
    assert getattr(info.value.__cause__, "status", None) == 401
    assert "ValidationError" not in str(info.value) and "401" in str(info.value)


def test_empty_judge_text_is_a_judge_failed_answer(stack):
    data = assert_judge_failed(stack.verify("[empty]"), "empty judge response")
    assert data["_ng_failure_judge_error"] == "empty judge response"


def test_schema_mismatch_is_a_judge_error(stack):
    # A body that is not a Response at all...
    with pytest.raises(JudgeError, match=r"^ValidationError: ") as info:
        stack.call_judge("[malformed]")
    assert isinstance(info.value.__cause__, ValueError)  # pydantic's ValidationError
    assert_judge_failed(stack.verify("[malformed]"), "ValidationError")
    # ...and a good Response read as the wrong model.
    with pytest.raises(JudgeError, match=r"^ValidationError: "):
        stack.call_judge("[good]", response_model=NeMoGymChatCompletion)


def test_a_body_that_is_not_json_is_a_judge_error(stack):
    with pytest.raises(JudgeError) as info:
        stack.call_judge("[good]", server_name="html_gateway")
    assert isinstance(info.value.__cause__, ValueError)  # a JSON decode error
    assert_judge_failed(stack.verify("[good]", server="qa_html"), type(info.value.__cause__).__name__)


def test_an_unknown_judge_server_is_a_judge_error(stack):
    with pytest.raises(JudgeError, match="no_such_judge"):
        stack.call_judge("[good]", server_name="no_such_judge")


def test_explicit_failsafe_on_a_re_registered_verify(stack):
    EXPLICIT_VERIFY_PATHS.clear()
    assert stack.verify("[good]", server="qa_explicit").json()["reward"] == 1.0
    assert_judge_failed(stack.verify("[500]", server="qa_explicit"), "HTTP 500")
    assert EXPLICIT_VERIFY_PATHS == ["/verify", "/verify"]  # the server's own handler answered both


def test_the_answer_holds_only_declared_request_fields(stack):
    data = assert_judge_failed(stack.verify("[500]", note="not declared"), "HTTP 500")
    assert "note" not in data


def test_bad_requests_are_still_rejected_before_verify(stack):
    answer = httpx.post(stack.urls["qa"] + "/verify", json={"question": "[500] x"}, timeout=30)
    assert answer.status_code == 422


# ------------------------------------------------------------------------------------------------------------
# judge_failsafe, called directly


def verify_request(tag: str = "[x]") -> QAVerifyRequest:
    return QAVerifyRequest(
        responses_create_params={"input": [{"role": "user", "content": tag}]},
        question=tag,
        expected_answer="4",
        response=make_response("It is 4."),
    )


async def _failing_verify(body: QAVerifyRequest) -> QAVerifyResponse:
    raise JudgeError("judge timed out")


def _answer_of(result: Any) -> dict:
    import json

    assert result.status_code == 200
    return json.loads(result.body)


def test_failsafe_finds_the_body_keyword():
    result = asyncio.run(judge_failsafe(_failing_verify)(body=verify_request("[kw]")))
    data = _answer_of(result)
    assert data["question"] == "[kw]" and data["reward"] == 0.0
    assert data["_ng_failure_class"] == "judge_failed" and data["_ng_failure_judge_error"] == "judge timed out"
    assert "_ng_failure_terminal" not in data


def test_failsafe_finds_the_first_model_argument_with_a_response():
    class Settings(BaseModel):  # a pydantic argument without `response` is not the body
        strict: bool = True

    async def verify(request: object, settings: Settings, body: QAVerifyRequest, other: QAVerifyRequest) -> None:
        raise JudgeError("no verdict service")

    arguments = (object(), Settings(), verify_request("[first]"), verify_request("[2nd]"))
    result = asyncio.run(judge_failsafe(verify)(*arguments))
    assert _answer_of(result)["question"] == "[first]"


def test_failsafe_on_a_method():
    server = make_server(QAJudgeServer, name="qa", domain="knowledge",
                         judge_model_server={"type": "responses_api_models", "name": "judge_model"})

    async def verify(self: QAJudgeServer, body: QAVerifyRequest) -> QAVerifyResponse:
        raise JudgeError("down")

    # The server object is a pydantic model too, but has no `response`: the body is still found.
    result = asyncio.run(judge_failsafe(verify)(server, verify_request("[method]")))
    assert _answer_of(result)["question"] == "[method]"


def test_failsafe_without_a_body_raises_runtime_error():
    async def verify(request: object, note: str) -> None:
        raise JudgeError("down")

    with pytest.raises(RuntimeError):
        asyncio.run(judge_failsafe(verify)(object(), "no body here"))
    with pytest.raises(RuntimeError):
        asyncio.run(judge_failsafe(verify)(request=object(), note="still none"))


def test_failsafe_passes_results_and_other_errors_through():
    async def ok(body: QAVerifyRequest) -> str:
        return "scored"

    async def buggy(body: QAVerifyRequest) -> None:
        raise ZeroDivisionError("a bug in the scoring code")

    assert asyncio.run(judge_failsafe(ok)(body=verify_request())) == "scored"
    with pytest.raises(ZeroDivisionError):
        asyncio.run(judge_failsafe(buggy)(body=verify_request()))


def test_failsafe_keeps_the_signature():
    async def verify(request: Request, body: QAVerifyRequest) -> QAVerifyResponse:
        raise JudgeError("down")

    wrapped = judge_failsafe(verify)
    assert inspect.signature(wrapped) == inspect.signature(verify, eval_str=True)  # annotations resolved for FastAPI
    assert wrapped.__name__ == "verify"


# ------------------------------------------------------------------------------------------------------------
# Environment tests written the v0.5 way: the server is built with `MagicMock(spec=ServerClient)`, `post` is an
# AsyncMock answering an object with `read()`, and the test reads the judge prompt back from
# `post.call_args.kwargs["json"].input[0].content`: `call_judge` must hand `post` the request model itself.


class ParamsJudgeConfig(BaseResourcesServerConfig):
    judge_model_server: ModelServerRef
    judge_responses_create_params: NeMoGymResponseCreateParamsNonStreaming


class ParamsJudgeServer(SimpleResourcesServer):
    """The v0.5 judge pattern: the config's judge params, copied with the prompt as `input`."""

    config: ParamsJudgeConfig

    async def verify(self, body: QAVerifyRequest) -> QAVerifyResponse:
        params = self.config.judge_responses_create_params.model_copy(
            update={"input": [NeMoGymEasyInputMessage(role="user", content=judge_prompt(body))]}, deep=True
        )
        judged = await call_judge(
            self.server_client,
            server_name=self.config.judge_model_server.name,
            url_path="/v1/responses",
            json=params,
            response_model=NeMoGymResponse,
        )
        grade = "A" if "GRADE: A" in judged.output_text else "B"
        return QAVerifyResponse(**body.model_dump(), reward=1.0 if grade == "A" else 0.0, judge_grade=grade)


def _mocked_judge_server(judge_text: str) -> ParamsJudgeServer:
    config = ParamsJudgeConfig(
        host="0.0.0.0", port=8080, entrypoint="", name="",
        judge_model_server=ModelServerRef(type="responses_api_models", name="judge_model"),
        judge_responses_create_params=NeMoGymResponseCreateParamsNonStreaming(input=[], temperature=0.0),
    )
    server = ParamsJudgeServer(config=config, server_client=MagicMock(spec=ServerClient))
    post_mock = MagicMock()
    post_mock.read = AsyncMock(return_value=make_response(judge_text).model_dump_json())
    server.server_client.post = AsyncMock(return_value=post_mock)
    return server


def test_a_mocked_post_gets_the_request_model_as_v05_tests_read_it():
    server = _mocked_judge_server("Same number. GRADE: A")
    result = asyncio.run(server.verify(verify_request("[mocked]")))
    assert result.reward == 1.0 and result.judge_grade == "A"

    sent = server.server_client.post.call_args.kwargs["json"]
    assert isinstance(sent, NeMoGymResponseCreateParamsNonStreaming)
    assert "Question: [mocked]\nGold target: 4\nPredicted answer: It is 4." in sent.input[0].content
    assert sent.temperature == 0.0  # the judge config's parameters travel with the prompt
    assert server.server_client.post.call_args.kwargs["server_name"] == "judge_model"


def test_the_request_model_reaches_the_wire_as_its_set_fields(stack):
    """Through the real ServerClient the model is serialized once, without the fields nobody set."""
    seen: list[dict] = []

    class Recording:
        async def post(self, **kwargs: Any) -> Any:
            seen.append(orjson.loads(encode_json_body(kwargs["json"])))
            return await make_server_client(stack.global_config).post(**kwargs)

    params = NeMoGymResponseCreateParamsNonStreaming(input=[], temperature=0.0).model_copy(
        update={"input": [NeMoGymEasyInputMessage(role="user", content="[good] grade this")]}, deep=True
    )
    judged = asyncio.run(call_judge(Recording(), server_name="judge_model", url_path="/v1/responses", json=params,
                                    response_model=NeMoGymResponse))
    assert judged.output_text == "Matches the gold target. GRADE: A"
    assert seen == [{"input": [{"role": "user", "content": "[good] grade this"}], "temperature": 0.0}]
