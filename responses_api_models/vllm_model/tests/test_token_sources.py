"""vllm_model's training mode reads every token source NeMo Gym v0.5 reads, in its order: NeMo RL's bundle on
`choices[0].message`; vLLM's top-level `prompt_token_ids` with `choices[0].token_ids` (log probs from the logprobs);
`choices[0].logprobs.content` (`token_id:<n>`) with `/tokenize` last. Partial or conflicting sources are refused
(HTTP 502 naming the fields), as is `n` > 1 (HTTP 400).

Real servers in threads: vllm_model in front of the fake backend (`message_token_bundle`), or in front of a small
vLLM-like upstream that answers each test's shape as given (the refusals need answers no well-behaved backend
sends), called over HTTP on `/v1/responses` and `/v1/chat/completions`, whole and streamed."""

from __future__ import annotations

import contextlib
import copy
from typing import Any, Iterator, Optional

import httpx
import openai
import orjson
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from nemo_gym.servers.base import serving_app
from nemo_gym.testing.fake_openai_server import build_app
from nemo_gym.testing.live_server import live_server
from nemo_gym.testing.servers import make_server
from responses_api_models.vllm_model.app import VLLMModel

PROMPT = [5, 6, 7]
IDS = [40, 41, 42]
LOG_PROBS = [-0.25, -0.5, -0.75]
LOGPROB_FLOATS = [-1.25, -1.5, -1.75]  # the logprobs list's own floats, other than the bundle's (shows who won)
TOKENIZED = [900, 901]  # what /tokenize answers


@contextlib.contextmanager
def vllm_model_before(upstream: Any) -> Iterator[str]:
    with live_server(upstream) as upstream_url:
        server = make_server(VLLMModel, name="policy_model", base_url=f"{upstream_url}/v1", api_key="k",
                             model="served", return_token_id_information=True, uses_reasoning_parser=False,
                             max_attempts=1)
        with live_server(serving_app(server.build_app())) as url:
            yield url


def four_calls(url: str) -> list[dict]:
    """Responses and chat, whole and streamed (the official client); the token data each call ends with."""
    client = openai.OpenAI(base_url=f"{url}/v1", api_key="k", max_retries=0, timeout=30)
    messages = [{"role": "user", "content": "Hello there friend"}]
    got = [client.responses.create(model="m", input="Hello there friend").output[-1].model_extra]
    with client.responses.stream(model="m", input="Hello there friend") as stream:
        got.append(stream.get_final_response().output[-1].model_extra)
    chat = client.chat.completions.create(model="m", messages=messages)
    assert not {"prompt_token_ids", "routed_experts"} & set(chat.model_extra or {})
    assert not {"token_ids", "routed_experts"} & set(chat.choices[0].model_extra or {})
    assert chat.choices[0].logprobs is None
    got.append(chat.choices[0].message.model_extra)
    chunks = list(client.chat.completions.create(model="m", messages=messages, stream=True))
    assert all("prompt_token_ids" not in (c.model_extra or {}) for c in chunks)
    deltas = [c.choices[0].delta.model_extra or {} for c in chunks if c.choices]
    finishing = [d for d in deltas if "prompt_token_ids" in d]
    assert len(finishing) == 1
    got.append({**finishing[0],
                "generation_token_ids": [i for d in deltas for i in d.get("generation_token_ids", ())],
                "generation_log_probs": [x for d in deltas for x in d.get("generation_log_probs", ())]})
    return got


# ------------------------------------------------------------------------------------------------------------
# Source 1 through the fake backend: NeMo RL's bundle on the message


@pytest.mark.parametrize("engine_ids_too", [False, True], ids=["bundle-only", "bundle-and-engine-ids"])
def test_nemo_rl_message_bundle_is_read_without_tokenize(engine_ids_too):
    backend = build_app(message_token_bundle=True, chat_prompt_token_ids=engine_ids_too)
    with vllm_model_before(backend) as url:
        calls = four_calls(url)
    for data in calls:
        assert data["prompt_token_ids"] == [100]  # the fake's made-up ids for one message
        assert data["generation_token_ids"] == [1000, 1001, 1002, 1003]  # "echo: Hello there friend", by word
        assert data["generation_log_probs"] == [-0.5] * 4
        assert data["token_trajectory"] == "exact"
    assert backend.state.tokenize_requests == []


# ------------------------------------------------------------------------------------------------------------
# A vLLM-like upstream answering each test's shape


class ShapedUpstream:
    """Answers every chat completion with `completion` (a whole answer; streamed: as three chunks, the token data
    spread as vLLM spreads it: top-level `prompt_token_ids` on the first, each piece's `token_ids`, `logprobs` and
    bundle fields on its own chunk). Counts `/tokenize` calls."""

    def __init__(self) -> None:
        self.completion: dict = {}
        self.chunks: Optional[list] = None
        self.tokenized = 0
        self.requests: list[dict] = []
        self.app = Starlette(routes=[Route("/v1/chat/completions", self._chat, methods=["POST"]),
                                     Route("/tokenize", self._tokenize, methods=["POST"])])

    async def _chat(self, request: Request) -> Response:
        body = orjson.loads(await request.body())
        self.requests.append(body)
        if not body.get("stream"):
            return Response(orjson.dumps(self.completion), media_type="application/json")
        chunks = self.chunks if self.chunks is not None else split_into_chunks(self.completion)
        text = "".join(f"data: {orjson.dumps(c).decode()}\n\n" for c in chunks) + "data: [DONE]\n\n"
        return Response(text, media_type="text/event-stream")

    async def _tokenize(self, request: Request) -> Response:
        self.tokenized += 1
        return Response(orjson.dumps({"tokens": TOKENIZED}), media_type="application/json")


def completion(*, bundle: Optional[dict] = None, prompt: Optional[list] = None, token_ids: Optional[list] = None,
               tokens: Optional[list] = None, floats: Optional[list] = None, choices: int = 1) -> dict:
    """A chat completion "ok ok ok" carrying the given token data (`tokens`: the `token_id:<n>` logprobs' ids)."""
    choice: dict[str, Any] = {"index": 0, "message": {"role": "assistant", "content": "ok ok ok", **(bundle or {})},
                              "finish_reason": "stop", "logprobs": None}
    if tokens is not None:
        choice["logprobs"] = {"content": [
            {"token": f"token_id:{t}", "logprob": lp, "bytes": None, "top_logprobs": []}
            for t, lp in zip(tokens, floats or LOGPROB_FLOATS)
        ]}
    if token_ids is not None:
        choice["token_ids"] = token_ids
    out: dict[str, Any] = {"id": "chatcmpl-1", "object": "chat.completion", "created": 1, "model": "served",
                           "choices": [{**copy.deepcopy(choice), "index": k} for k in range(choices)], "usage": None}
    if prompt is not None:
        out["prompt_token_ids"] = prompt
    return out


def split_into_chunks(whole: dict) -> list[dict]:
    """`whole` as vLLM streams it: a role chunk (with the top-level prompt ids), one chunk per generated token
    (its content word, token id, logprob entry and bundle slice), the finishing chunk (with the bundle's prompt)."""
    base = {"id": whole["id"], "object": "chat.completion.chunk", "created": 1, "model": "served"}
    choice = whole["choices"][0]
    message = choice["message"]
    first = {**base, "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": None}]}
    if "prompt_token_ids" in whole:
        first["prompt_token_ids"] = whole["prompt_token_ids"]
    chunks = [first]
    entries = (choice.get("logprobs") or {}).get("content")
    words = message["content"].split(" ")
    for k, word in enumerate(words):
        piece: dict[str, Any] = {"index": 0, "delta": {"content": word + (" " if k < len(words) - 1 else "")},
                                 "finish_reason": None}
        if entries is not None:
            piece["logprobs"] = {"content": entries[k:k + 1]}
        if "token_ids" in choice:
            piece["token_ids"] = choice["token_ids"][k:k + 1]
        for field in ("generation_token_ids", "generation_log_probs"):
            if field in message:
                piece["delta"][field] = message[field][k:k + 1]
        chunks.append({**base, "choices": [piece]})
    last: dict[str, Any] = {"index": 0, "delta": {}, "finish_reason": "stop"}
    if "prompt_token_ids" in message:
        last["delta"]["prompt_token_ids"] = message["prompt_token_ids"]
    return chunks + [{**base, "choices": [last]}]


@pytest.fixture(scope="module")
def shaped_server() -> Iterator[tuple[ShapedUpstream, str]]:
    upstream = ShapedUpstream()
    with vllm_model_before(upstream.app) as url:
        yield upstream, url


@pytest.fixture
def shaped(shaped_server) -> tuple[ShapedUpstream, str]:
    upstream, url = shaped_server
    upstream.chunks, upstream.tokenized, upstream.requests = None, 0, []
    return upstream, url


BUNDLE = {"prompt_token_ids": PROMPT, "generation_token_ids": IDS, "generation_log_probs": LOG_PROBS}


@pytest.mark.parametrize("shape, expected, tokenized", [
    # 1. the bundle wins over everything else the answer carries (its log probs, not the logprobs list's)
    (dict(bundle=BUNDLE, prompt=PROMPT, token_ids=IDS, tokens=IDS), (PROMPT, IDS, LOG_PROBS), 0),
    (dict(bundle=BUNDLE), (PROMPT, IDS, LOG_PROBS), 0),
    # 2. vLLM's engine ids: the ids from token_ids, the log probs from the logprobs list, no /tokenize
    (dict(prompt=PROMPT, token_ids=IDS, tokens=IDS), (PROMPT, IDS, LOGPROB_FLOATS), 0),
    # 3. last: the token_id:<n> logprobs, the prompt from /tokenize
    (dict(tokens=IDS), (TOKENIZED, IDS, LOGPROB_FLOATS), 4),
], ids=["bundle-first", "bundle-alone", "engine-ids", "logprobs-and-tokenize"])
def test_sources_are_read_in_v05_order(shaped, shape, expected, tokenized):
    upstream, url = shaped
    upstream.completion = completion(**shape)
    for data in four_calls(url):
        assert (data["prompt_token_ids"], data["generation_token_ids"], data["generation_log_probs"]) == expected
    assert upstream.tokenized == tokenized
    assert all(r["return_token_ids"] and r["logprobs"] and r["return_tokens_as_token_ids"] for r in upstream.requests)


def test_message_routed_experts_pass_through(shaped):
    upstream, url = shaped
    upstream.completion = completion(bundle={**BUNDLE, "routed_experts": [[[1, 2]]] * 3})
    body = httpx.post(f"{url}/v1/responses", json={"input": "x"}, timeout=30).json()
    assert body["output"][-1]["routed_experts"] == [[[1, 2]]] * 3


PARTIAL = {k: v for k, v in BUNDLE.items() if k != "generation_log_probs"}


@pytest.mark.parametrize("shape, says", [
    (dict(bundle=PARTIAL), ["partial token bundle", "choices[0].message.generation_log_probs"]),
    (dict(bundle={**BUNDLE, "generation_log_probs": [-0.1]}), ["3 choices[0].message.generation_token_ids but 1"]),
    (dict(bundle=BUNDLE, prompt=PROMPT, token_ids=[40, 41, 99], tokens=IDS),
     ["disagree", "choices[0].token_ids (3 ids) is not choices[0].message.generation_token_ids"]),
    (dict(bundle=BUNDLE, prompt=[5, 6], token_ids=IDS), ["disagree", "prompt_token_ids (2 ids)"]),
    (dict(bundle=BUNDLE, prompt=PROMPT), ["prompt_token_ids but not choices[0].token_ids", "partial engine"]),
    (dict(prompt=PROMPT, tokens=IDS), ["prompt_token_ids but not choices[0].token_ids"]),
    (dict(token_ids=IDS, tokens=IDS), ["choices[0].token_ids but not the top-level prompt_token_ids"]),
    (dict(prompt=PROMPT, token_ids=[40, 41, 99], tokens=IDS), ["token_ids disagree with the tokens"]),
    (dict(prompt=PROMPT, token_ids=[40, 41], tokens=IDS), ["2 choices[0].token_ids but 3 choices[0].logprobs"]),
    (dict(prompt=PROMPT, token_ids=IDS), ["3 choices[0].token_ids but no choices[0].logprobs.content"]),
    (dict(bundle={**BUNDLE, "generation_token_ids": "40 41 42"}), ["generation_token_ids must be a list"]),
    (dict(tokens=IDS, choices=2), ["choice index [0, 1]", "exactly one choice"]),
    (dict(), ["carries no token data"]),
], ids=["partial-bundle", "bundle-lengths", "bundle-vs-engine-generation", "bundle-vs-engine-prompt",
        "bundle-with-partial-engine", "prompt-without-token-ids", "token-ids-without-prompt", "engine-vs-token-strings",
        "engine-vs-logprobs-lengths", "engine-without-logprobs", "not-a-list", "two-choices", "nothing"])
def test_partial_or_conflicting_sources_are_refused(shaped, shape, says):
    upstream, url = shaped
    upstream.completion = completion(**shape)
    for route, body in (("responses", {"input": "x"}), ("chat/completions", {"messages": [{"role": "user",
                                                                                           "content": "x"}]})):
        answer = httpx.post(f"{url}/v1/{route}", json=body, timeout=30)
        assert answer.status_code == 502, (route, answer.text)
        message = answer.json()["error"]["message"]
        assert message.startswith("policy_model: ") and all(s in message for s in says), message
    assert upstream.tokenized == 0


def test_streamed_refusal_ends_the_stream_with_an_error(shaped):
    upstream, url = shaped
    upstream.completion = completion(bundle=PARTIAL)  # the deltas carry the generated ids, no log probs
    client = openai.OpenAI(base_url=f"{url}/v1", api_key="k", max_retries=0, timeout=30)
    with pytest.raises(openai.APIError, match="partial token bundle.*choices\\[0\\].delta.generation_log_probs"):
        list(client.chat.completions.create(model="m", messages=[{"role": "user", "content": "x"}], stream=True))
    with pytest.raises(Exception, match="partial token bundle"):
        with client.responses.stream(model="m", input="x") as stream:
            stream.get_final_response()


def test_a_stream_may_carry_the_prompt_ids_without_token_ids(shaped):
    """Streamed, vLLM's prompt ids without `token_ids` chunks (older vLLM) are used; the generated ids come from
    the logprobs."""
    upstream, url = shaped
    upstream.completion = completion(prompt=PROMPT, tokens=IDS)
    chunks = split_into_chunks(upstream.completion)
    upstream.chunks = chunks
    client = openai.OpenAI(base_url=f"{url}/v1", api_key="k", max_retries=0, timeout=30)
    with client.responses.stream(model="m", input="x") as stream:
        final = stream.get_final_response().output[-1].model_extra
    assert (final["prompt_token_ids"], final["generation_token_ids"]) == (PROMPT, IDS)
    assert upstream.tokenized == 0


def test_more_than_one_choice_is_refused_before_the_upstream_is_called(shaped):
    upstream, url = shaped
    upstream.completion = completion(tokens=IDS)
    answer = httpx.post(f"{url}/v1/chat/completions", json={"messages": [{"role": "user", "content": "x"}], "n": 2},
                        timeout=30)
    assert answer.status_code == 400, answer.text
    assert "policy_model: training mode" in answer.text and "n=2" in answer.text and "n=1" in answer.text
    assert upstream.requests == []
