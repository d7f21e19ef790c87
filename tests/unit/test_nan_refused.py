"""Non-finite numbers (`NaN`, `Infinity`, `-Infinity`) in a model server's request are refused, naming the field.

JSON has no such numbers, but Python's `json` (which FastAPI parses with) and pydantic's JSON parser take the
literals, so `temperature: NaN` used to reach the backend. The request schemas refuse them
(`allow_inf_nan=False`, `nemo_gym/api/schemas.py`): 422 on `/v1/responses` and `/v1/chat/completions`, streamed or
not; `/v1/messages` answers 400 in Anthropic's shape, as for every request it cannot take. In-process: the app as
`ng_run` serves it (hot routes included) through `TestClient`; the fake backend (a thread) answers the finite ones.
"""

from __future__ import annotations

import json

import pytest
from fastapi.testclient import TestClient

from nemo_gym.api.schemas import NeMoGymChatCompletionCreateParamsNonStreaming, NeMoGymResponseCreateParamsNonStreaming
from nemo_gym.servers.base import serving_app
from nemo_gym.testing.fake_openai_server import build_app
from nemo_gym.testing.live_server import live_server
from nemo_gym.testing.servers import make_server
from responses_api_models.openai_model.app import SimpleModelServer

LITERALS = ["NaN", "Infinity", "-Infinity"]
BODIES = {
    "/v1/responses": '{"model": "m", "input": "hi", "FIELD": VALUE STREAM}',
    "/v1/chat/completions": '{"model": "m", "messages": [{"role": "user", "content": "hi"}], "FIELD": VALUE STREAM}',
    "/v1/messages": '{"model": "m", "max_tokens": 16, "messages": [{"role": "user", "content": "hi"}], '
                    '"FIELD": VALUE STREAM}',
}
FIELDS = {
    "/v1/responses": ["temperature", "top_p", "max_output_tokens", "top_logprobs"],
    "/v1/chat/completions": ["temperature", "top_p", "max_tokens", "max_completion_tokens", "frequency_penalty",
                             "presence_penalty"],
    "/v1/messages": ["temperature", "top_p", "max_tokens"],
}
CASES = [(path, field) for path, fields in FIELDS.items() for field in fields]


@pytest.fixture(scope="module")
def client():
    with live_server(build_app()) as upstream:
        server = make_server(SimpleModelServer, name="policy_model", openai_base_url=f"{upstream}/v1",
                             openai_api_key="k", openai_model="served-model", max_attempts=1)
        with TestClient(serving_app(server.build_app()), raise_server_exceptions=False) as test_client:
            yield test_client


def _post(client: TestClient, path: str, field: str, value: str, stream: bool):
    body = BODIES[path].replace("FIELD", field).replace("VALUE", value).replace(
        " STREAM", ', "stream": true' if stream else "")
    return client.post(path, content=body.encode(), headers={"content-type": "application/json"})


def _names_the_field(path: str, answer, field: str) -> bool:
    data = answer.json()
    if path == "/v1/messages":
        return data["type"] == "error" and field in data["error"]["message"]
    if "detail" in data:  # FastAPI's 422, as NeMo Gym v0.2 answers a non-streamed request that fails validation
        return any(error["loc"][-1] == field for error in data["detail"])
    return data["error"]["param"] == field and field in data["error"]["message"]


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
@pytest.mark.parametrize("literal", LITERALS)
@pytest.mark.parametrize("path,field", CASES)
def test_a_non_finite_number_is_refused_naming_the_field(client, path, field, literal, stream):
    answer = _post(client, path, field, literal, stream)
    assert answer.status_code == (400 if path == "/v1/messages" else 422), answer.text
    assert _names_the_field(path, answer, field), answer.text


@pytest.mark.parametrize("path", list(BODIES))
def test_finite_numbers_still_pass(client, path):
    """The control: the same requests with a finite number are answered (so the refusals above are the number's)."""
    for stream in (False, True):
        answer = _post(client, path, "temperature", "0.5", stream)
        assert answer.status_code == 200, answer.text


def test_a_non_finite_number_nested_in_a_streamed_request_is_refused_not_sent_as_null(client):
    """A streamed request is re-encoded before it goes on, which would turn NaN into null: refused, with its path."""
    body = {"model": "m", "input": "hi", "stream": True, "text": {"format": {"type": "json_schema", "name": "x",
                                                                             "schema": {"minimum": "NAN"}}}}
    answer = client.post("/v1/responses", content=json.dumps(body).replace('"NAN"', "NaN").encode(),
                         headers={"content-type": "application/json"})
    assert answer.status_code == 422, answer.text
    assert answer.json()["error"]["param"] == "text.format.schema.minimum"


def test_the_schemas_refuse_non_finite_numbers():
    """The validation itself (what the hot routes run on the raw bytes, without FastAPI)."""
    for model, body in ((NeMoGymResponseCreateParamsNonStreaming, b'{"input": "hi", "top_p": Infinity}'),
                        (NeMoGymChatCompletionCreateParamsNonStreaming,
                         b'{"messages": [{"role": "user", "content": "hi"}], "top_p": Infinity}')):
        with pytest.raises(ValueError, match="top_p"):
            model.model_validate_json(body)
        assert model.model_validate_json(body.replace(b"Infinity", b"0.9")).top_p == 0.9
