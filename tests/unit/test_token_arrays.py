"""Token arrays (issue 36 item 2, design decision 34): checked once, kept by reference, dumped as pydantic dumps them.

Environment code still sees plain `list[int]` / `list[float]`; a malformed element is a 422 naming it; the verify
idiom `Response(**body.model_dump(), reward=...)` shares the arrays instead of copying them; and every dump is the
dict pydantic's own `model_dump` makes."""

from __future__ import annotations

import math
from typing import Any

import httpx
import orjson
import pytest
from fastapi import FastAPI
from pydantic import BaseModel, ValidationError

from nemo_gym.api.schemas import (
    NeMoGymChatCompletionCreateParamsNonStreaming,
    NeMoGymResponse,
    NeMoGymResponseCreateParamsNonStreaming,
    NeMoGymResponseFunctionToolCallForTraining,
    NeMoGymResponseOutputMessageForTraining,
)
from nemo_gym.base_resources_server import (
    BaseResourcesServerConfig,
    BaseVerifyRequest,
    BaseVerifyResponse,
    SimpleResourcesServer,
)
from nemo_gym.servers.base import serving_app
from nemo_gym.serving.private_api import NeMoGymHttpProtocol
from nemo_gym.testing.live_server import live_server

TOKEN_FIELDS = ("prompt_token_ids", "generation_token_ids", "generation_log_probs")


def tool_call(n: int, start: int = 0) -> dict:
    return {
        "type": "function_call", "name": "get_weather", "arguments": '{"city": "Oslo"}', "call_id": "call_1",
        "id": "fc_1", "status": "completed",
        "prompt_token_ids": list(range(100, 120)),
        "generation_token_ids": [1000 + (start + k) * 7919 % 150_000 for k in range(n)],
        "generation_log_probs": [-((start + k) % 97 + 1) / 97.0 for k in range(n)],
        "routed_experts": "opaque",
    }


def final_message(n: int) -> dict:
    return {
        "id": "msg_2", "type": "message", "role": "assistant", "status": "completed",
        "content": [{"type": "output_text", "text": "It is -4 in Oslo.", "annotations": []}],
        "prompt_token_ids": list(range(100, 140)),
        "generation_token_ids": list(range(5, 5 + n)),
        "generation_log_probs": [-0.5] * n,
        "token_trajectory": "exact",  # an extra key a training item carries (decision 29)
        "token_trajectory_reason": None,
    }


def response(n: int = 50) -> dict:
    output = [tool_call(n), {"type": "function_call_output", "call_id": "call_1", "output": "-4"}, final_message(n)]
    return {"id": "resp_1", "created_at": 1, "model": "policy", "object": "response", "output": output}


ROW = {"responses_create_params": {"input": [{"role": "user", "content": "Weather in Oslo?"}]}, "city": "Oslo"}


class RowVerifyRequest(BaseVerifyRequest):
    city: str


class RowVerifyResponse(RowVerifyRequest, BaseVerifyResponse):
    n_generated: int


def pydantic_dump(model: BaseModel, **kwargs: Any) -> dict:
    """The dump pydantic itself makes (no sharing)."""
    return BaseModel.model_dump(model, **kwargs)


# ------------------------------------------------------------------------------------------ what code sees


def test_environment_code_sees_plain_lists_of_ints_and_floats_from_json():
    body = RowVerifyRequest.model_validate_json(orjson.dumps({**ROW, "response": response()}))
    last = body.response.output[-1]
    assert type(last) is NeMoGymResponseOutputMessageForTraining
    assert type(last.generation_token_ids) is list and all(type(t) is int for t in last.generation_token_ids)
    assert type(last.prompt_token_ids) is list and last.prompt_token_ids == list(range(100, 140))
    assert type(last.generation_log_probs) is list and all(type(x) is float for x in last.generation_log_probs)
    assert type(body.response.output[0]) is NeMoGymResponseFunctionToolCallForTraining
    assert last.token_trajectory == "exact"
    assert body.response.output[0].routed_experts == "opaque"


def test_lists_given_from_python_are_kept_as_they_are_and_other_inputs_converted():
    ids, log_probs = [3, 1, 2], [-0.25, -1.0]
    item = NeMoGymResponseOutputMessageForTraining(
        id="m", content=[], prompt_token_ids=ids, generation_token_ids=(7, 8), generation_log_probs=log_probs
    )
    assert item.prompt_token_ids is ids and item.generation_log_probs is log_probs
    assert item.generation_token_ids == [7, 8] and type(item.generation_token_ids) is list  # a tuple is converted
    lax = NeMoGymResponseOutputMessageForTraining(
        id="m", content=[], prompt_token_ids=["3", 4.0], generation_token_ids=[], generation_log_probs=["-0.5", 1]
    )
    assert lax.prompt_token_ids == [3, 4] and all(type(t) is int for t in lax.prompt_token_ids)  # pydantic's lax rules
    assert lax.generation_log_probs == [-0.5, 1.0]


@pytest.mark.parametrize(
    "field, bad, error_type",
    [
        ("generation_token_ids", "seven", "int_parsing"),
        ("generation_token_ids", 1.5, "int_from_float"),
        ("prompt_token_ids", None, "int_type"),
        ("generation_log_probs", "x", "float_parsing"),
        ("generation_log_probs", [0.5], "float_type"),
    ],
)
def test_a_malformed_element_is_an_error_naming_it_from_json_and_from_python(field, bad, error_type):
    good = final_message(6)
    values = list(good[field])
    values[3] = bad
    item = {**good, field: values}
    from_json = RowVerifyRequest.model_validate_json
    for validate in (lambda d: from_json(orjson.dumps(d)), RowVerifyRequest.model_validate):
        with pytest.raises(ValidationError) as caught:
            validate({**ROW, "response": {**response(), "output": [item]}})
        (error,) = caught.value.errors()
        assert error["loc"] == ("response", "output", 0, "output_message_train", field, 3)
        assert error["type"] == error_type


def test_many_malformed_elements_give_one_error():
    """The arrays stop at their first bad element (design decision 28's `fail_fast`), from JSON and from Python."""
    item = {**final_message(1), "generation_token_ids": ["x"] * 100_000, "generation_log_probs": [None] * 100_000}
    for validate in (lambda d: NeMoGymResponse.model_validate_json(orjson.dumps(d)), NeMoGymResponse.model_validate):
        with pytest.raises(ValidationError) as caught:
            validate({**response(), "output": [item]})
        assert caught.value.error_count() == 2  # one per array
        assert {e["loc"][-1] for e in caught.value.errors()} == {0}


def test_nan_and_infinity_are_judged_by_the_models_own_rule():
    """The fast path keeps only finite log probs; NaN / infinities go through pydantic's check, which follows the
    model's config (items accept them, as before; the request params' own floats refuse them)."""
    values = [-0.5, math.inf, -math.inf]
    item = NeMoGymResponseOutputMessageForTraining(
        id="m", content=[], prompt_token_ids=[], generation_token_ids=[], generation_log_probs=values
    )
    assert item.generation_log_probs == values
    with pytest.raises(ValidationError):
        NeMoGymResponseCreateParamsNonStreaming.model_validate({"input": "hi", "temperature": math.nan})


# ------------------------------------------------------------------------------------------ the verify idiom


def test_the_verify_idiom_shares_the_arrays_and_answers_what_pydantic_would():
    raw = orjson.dumps({**ROW, "response": response(200)})
    body = RowVerifyRequest.model_validate_json(raw)
    dumped = body.model_dump()
    assert dumped == pydantic_dump(body)
    for ours, theirs in zip(dumped["response"]["output"], pydantic_dump(body)["response"]["output"]):
        assert list(ours) == list(theirs)  # the same keys in the same order
    for item, as_dict in zip(body.response.output, dumped["response"]["output"]):
        for field in TOKEN_FIELDS:
            if field in as_dict:
                assert as_dict[field] is getattr(item, field)
    answer = RowVerifyResponse(**dumped, reward=1.0, n_generated=len(body.response.output[-1].generation_token_ids))
    assert answer.response.output[-1].generation_token_ids is body.response.output[-1].generation_token_ids
    answered = orjson.loads(answer.model_dump_json())
    assert answered["response"] == pydantic_dump(body, mode="json")["response"]
    for sent, got in zip(orjson.loads(raw)["response"]["output"], answered["response"]["output"]):
        assert all(got.get(field) == sent.get(field) for field in TOKEN_FIELDS)


def test_dumps_with_options_are_pydantics_own():
    body = RowVerifyRequest.model_validate({**ROW, "response": response()})
    for kwargs in (
        {"exclude_unset": True},
        {"exclude_none": True},
        {"exclude_defaults": True},
        {"mode": "json"},
        {"by_alias": True},
        {"include": {"response"}},
        {"exclude": {"city": True}},
        {"exclude": {"response": {"output": {0: {"generation_log_probs"}}}}},
    ):
        assert body.model_dump(**kwargs) == pydantic_dump(body, **kwargs), kwargs
    assert body.response.model_dump() == pydantic_dump(body.response)
    assert body.response.model_dump()["output"][0]["generation_token_ids"] is body.response.output[0].generation_token_ids


def test_the_model_servers_request_dump_shares_the_arrays_of_earlier_calls():
    params = {"input": [*ROW["responses_create_params"]["input"], *response(100)["output"]], "temperature": 0.5}
    body = NeMoGymResponseCreateParamsNonStreaming.model_validate_json(orjson.dumps(params))
    assert body.model_dump(exclude_unset=True) == pydantic_dump(body, exclude_unset=True)
    assert orjson.loads(orjson.dumps(body.model_dump(exclude_unset=True))) == orjson.loads(
        body.model_dump_json(exclude_unset=True)
    )
    dumped = body.model_dump(exclude_unset=True)
    assert dumped["input"][1]["generation_token_ids"] is body.input[1].generation_token_ids
    assert body.model_dump() == pydantic_dump(body)


def test_chat_params_share_the_assistant_messages_arrays():
    message = {"role": "assistant", "content": "hi", "prompt_token_ids": [1, 2], "generation_token_ids": [3],
               "generation_log_probs": [-0.1]}
    body = NeMoGymChatCompletionCreateParamsNonStreaming.model_validate_json(
        orjson.dumps({"messages": [{"role": "user", "content": "x"}, message, {"role": "custom", "content": "y"}]})
    )
    dumped = body.model_dump(exclude_unset=True)
    assert dumped == pydantic_dump(body, exclude_unset=True)
    assert dumped["messages"][1]["prompt_token_ids"] is body.messages[1].prompt_token_ids


def test_an_environments_own_item_subclass_is_dumped_by_pydantic():
    class Annotated(NeMoGymResponseOutputMessageForTraining):
        note: str = "kept"

    item = Annotated(**final_message(3))
    body = NeMoGymResponse.model_validate({**response(), "output": [item]})
    assert body.model_dump() == pydantic_dump(body) and body.model_dump()["output"][0]["note"] == "kept"


# ------------------------------------------------------------------------------------------ a real server


class TokenReadingServer(SimpleResourcesServer):
    """Reads the last item's generated ids, as an environment that trains on them does."""

    config: BaseResourcesServerConfig
    seen: list = []

    def setup_webserver(self) -> FastAPI:
        return super().setup_webserver()

    async def verify(self, body: RowVerifyRequest) -> RowVerifyResponse:
        ids = body.response.output[-1].generation_token_ids
        self.seen.append((type(ids), all(type(t) is int for t in ids), len(ids)))
        return RowVerifyResponse(**body.model_dump(), reward=1.0, n_generated=len(ids))


@pytest.fixture(scope="module")
def resources_url():
    config = BaseResourcesServerConfig(host="127.0.0.1", port=0, entrypoint="app.py", name="tokens")
    server = TokenReadingServer(config=config, server_client=None)
    app = serving_app(server.build_app())  # served as ng_run serves it: the direct path
    with live_server(app, http=NeMoGymHttpProtocol, proxy_headers=False, start_timeout=10) as url:
        yield url, server


def test_verify_on_a_real_server_returns_the_arrays_and_reads_them_as_lists(resources_url):
    url, server = resources_url
    body = {**ROW, "response": response(20_000)}
    answer = httpx.post(f"{url}/verify", content=orjson.dumps(body), headers={"content-type": "application/json"})
    assert answer.status_code == 200, answer.text[:500]
    result = answer.json()
    assert server.seen[-1] == (list, True, 20_000)
    assert result["n_generated"] == 20_000 and result["reward"] == 1.0
    for sent, got in zip(body["response"]["output"], result["response"]["output"]):
        for field in TOKEN_FIELDS:
            assert got.get(field) == sent.get(field)


def test_a_bad_token_on_a_real_server_is_a_short_422_naming_it(resources_url):
    url, _ = resources_url
    bad = final_message(50_000)
    bad["generation_token_ids"] = ["not a token"] * 50_000  # a 750 KB array of bad elements
    body = {**ROW, "response": {**response(), "output": [bad]}}
    answer = httpx.post(f"{url}/verify", content=orjson.dumps(body), headers={"content-type": "application/json"})
    assert answer.status_code == 422
    assert len(answer.content) < 2_000  # one error, its input cut to an excerpt
    (error,) = answer.json()["detail"]
    assert error["loc"] == ["body", "response", "output", 0, "output_message_train", "generation_token_ids", 0]
