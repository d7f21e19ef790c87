"""local_llama_model with `return_token_id_information: true` (real SmolLM2-135M): token ids and log probs on the
output, prompts token-in/token-out. A few short generations (max 24 tokens each)."""

from __future__ import annotations

import math

import httpx
import pytest

pytest.importorskip(
    "llama_cpp",
    reason='llama-cpp-python is not installed; install the local-model extra with `pip install -e ".[local]"`',
)

from nemo_gym.testing.live_server import live_server  # noqa: E402
from nemo_gym.testing.servers import make_server  # noqa: E402
from responses_api_models.local_llama_model.app import LocalLlamaModel  # noqa: E402

EOS = 2  # <|im_end|>


@pytest.fixture(scope="module")
def server() -> LocalLlamaModel:
    return make_server(LocalLlamaModel, name="policy_model", temperature=0.0, seed=7, return_token_id_information=True)


@pytest.fixture(scope="module")
def http(server):
    with live_server(server.build_app(), start_timeout=20) as url, httpx.Client(base_url=url, timeout=120) as client:
        yield client


def post(http: httpx.Client, path: str, body: dict) -> dict:
    response = http.post(path, json=body)
    assert response.status_code == 200, response.text
    return response.json()


def assert_token_data(item: dict, usage_completion: int) -> None:
    gen, lps = item["generation_token_ids"], item["generation_log_probs"]
    assert item["prompt_token_ids"] and len(gen) == len(lps) == usage_completion > 0
    assert all(math.isfinite(lp) and lp <= 0.0 for lp in lps)


def test_second_call_continues_the_first_calls_ids_and_a_stripped_turn_is_retokenized(http, server):
    first = post(http, "/v1/responses", {"input": "Say hello.", "max_output_tokens": 24})
    (message,) = first["output"]
    assert message["token_trajectory"] == "exact" and "token_trajectory_reason" not in message
    assert_token_data(message, first["usage"]["output_tokens"])
    tok = server.loaded.chat_tokenizer
    assert tok.detokenize(message["prompt_token_ids"]).endswith("<|im_start|>user\nSay hello.<|im_end|>\n"
                                                                "<|im_start|>assistant\n")

    follow = {"role": "user", "content": "Again."}
    second = post(http, "/v1/responses", {"input": [{"role": "user", "content": "Say hello."}, message, follow],
                                          "max_output_tokens": 24})
    item = second["output"][-1]
    assert item["token_trajectory"] == "exact"
    prefix = message["prompt_token_ids"] + message["generation_token_ids"]
    assert item["prompt_token_ids"][: len(prefix)] == prefix
    glue = item["prompt_token_ids"][len(prefix):]
    expected = "<|im_start|>user\nAgain.<|im_end|>\n<|im_start|>assistant\n"
    if message["generation_token_ids"][-1] != EOS:  # cut off at the limit: the template closes the turn
        expected = "<|im_end|>\n" + expected
    else:
        expected = "\n" + expected
    assert tok.detokenize(glue) == expected

    # The same previous message without its ids (an agent that dropped them): re-tokenized, and said so.
    stripped = {k: v for k, v in message.items() if k not in ("prompt_token_ids", "generation_token_ids")}
    third = post(http, "/v1/responses", {"input": [{"role": "user", "content": "Say hello."}, stripped, follow],
                                         "max_output_tokens": 8})
    item = third["output"][-1]
    assert item["token_trajectory"] == "retokenized"
    assert item["token_trajectory_reason"].startswith("no_previous_token_ids")


def test_chat_completions_carry_token_data_on_the_message(http):
    body = post(http, "/v1/chat/completions", {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 8})
    message = body["choices"][0]["message"]
    assert message["token_trajectory"] == "exact"
    assert_token_data(message, body["usage"]["completion_tokens"])
