"""vllm_model with `use_completions_api` (+ `render_chat_template`): token-in/token-out prompts to /v1/completions,
Hermes tool calls parsed from the generated text, the fallbacks. In-process servers (threads): vllm_model in front
of the fake backend's /v1/completions, which uses the real SmolLM2 tokenizer (GGUF, vocab only)."""

from __future__ import annotations

import contextlib
from typing import Any, Iterator

import httpx
import pytest

pytest.importorskip("llama_cpp", reason='the real tokenizer needs the local extra: pip install -e ".[local]"')

from nemo_gym.api.chat_tokenizers import (  # noqa: E402
    bind,
    format_hermes_tool_calls,
    load_chat_tokenizer,
    load_gguf_chat_tokenizer,
    parse_hermes_tool_calls,
    template_messages,
)
from nemo_gym.api.token_continuation import EXACT, full_prompt_ids  # noqa: E402
from nemo_gym.errors import NeMoGymConfigError  # noqa: E402
from nemo_gym.testing.fake_openai_server import build_app  # noqa: E402
from nemo_gym.testing.live_server import live_server  # noqa: E402
from nemo_gym.testing.servers import make_server  # noqa: E402
from responses_api_models.local_llama_model.app import default_model_path  # noqa: E402
from responses_api_models.vllm_model.app import VLLMModel, _token_prompt  # noqa: E402

WEATHER_TOOL = {
    "type": "function", "name": "get_weather", "description": "Current weather of a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
}
SCRIPT = [
    {"match": {"endpoint": "completions", "step": 1, "last_user_contains": "Oslo"},
     "output": ["Let me check.", {"type": "function_call", "name": "get_weather", "arguments": {"city": "Oslo"}}]},
    {"match": {"endpoint": "completions"}, "output": ["Answer: {{last_tool_output}}"]},
]


@pytest.fixture(scope="module")
def tokenizer():
    return load_gguf_chat_tokenizer(default_model_path())


@pytest.fixture(scope="module", params=["gguf", "hf_folder"])
def tokenizer_path(request, tmp_path_factory) -> str:
    """Where `tokenizer:` points: the SmolLM2 GGUF, or a real Hugging Face folder built here (the tokens extra)."""
    if request.param == "gguf":
        return str(default_model_path())
    pytest.importorskip("tokenizers", reason='HF tokenizer folders need the tokens extra: pip install -e ".[tokens]"')
    from nemo_gym.testing.tiny_tokenizer import make_tokenizer_folder

    return str(make_tokenizer_folder(tmp_path_factory.mktemp("hf") / "chatml"))


@contextlib.contextmanager
def stack(refuse: bool = False, tokenizer_path: str = "", **fields: Any) -> Iterator[tuple[str, Any]]:
    tokenizer_path = tokenizer_path or str(default_model_path())
    fake = build_app(script=SCRIPT, completions_tokenizer=tokenizer_path, refuse_token_prompts=refuse)
    with live_server(fake) as up:
        fields.setdefault("return_token_id_information", True)
        server = make_server(
            VLLMModel, name="policy_model", base_url=f"{up}/v1", model="served", uses_reasoning_parser=False,
            use_completions_api=True, **{"render_chat_template": True, "tokenizer": tokenizer_path, **fields},
        )
        with live_server(server.build_app()) as url:
            yield url, fake


def test_two_calls_exact_with_parsed_tool_call_and_text(tokenizer_path):
    """With either kind of tokenizer: call 2's prompt continues call 1's ids, the tool call is parsed, both exact."""
    tokenizer = load_chat_tokenizer(tokenizer_path)
    with stack(tokenizer_path=tokenizer_path) as (url, fake):
        r1 = httpx.post(f"{url}/v1/responses", json={"input": "Weather in Oslo?", "tools": [WEATHER_TOOL]},
                        timeout=60).json()
        message, call = r1["output"]
        assert message["content"][0]["text"] == "Let me check."
        assert (call["type"], call["name"], call["arguments"]) == ("function_call", "get_weather", '{"city": "Oslo"}')
        assert call["token_trajectory"] == EXACT and "routed_experts" not in call
        assert tokenizer.detokenize(call["generation_token_ids"]).endswith("</tool_call><|im_end|>")
        assert "<tools>" in tokenizer.detokenize(call["prompt_token_ids"])  # plain ChatML: tools in the system text
        r2 = httpx.post(f"{url}/v1/responses", json={
            "input": [{"role": "user", "content": "Weather in Oslo?"}, *r1["output"],
                      {"type": "function_call_output", "call_id": call["call_id"], "output": "-5C"}],
            "tools": [WEATHER_TOOL]}, timeout=60).json()
        last = r2["output"][-1]
        assert last["content"][0]["text"] == "Answer: -5C"
        assert last["token_trajectory"] == EXACT
        head = call["prompt_token_ids"] + call["generation_token_ids"]
        assert last["prompt_token_ids"][: len(head)] == head
        assert tokenizer.detokenize(last["prompt_token_ids"][len(head):]).startswith("\n<|im_start|>tool\n-5C<|im_end|>")
        assert [c["prompt_kind"] for c in fake.state.completions] == ["ids", "ids"]


def test_chat_route_and_inference_mode(tokenizer):
    with stack(return_token_id_information=False) as (url, fake):
        chat = httpx.post(f"{url}/v1/chat/completions", json={
            "messages": [{"role": "user", "content": "Weather in Oslo?"}],
            "tools": [{"type": "function", "function": {k: v for k, v in WEATHER_TOOL.items() if k != "type"}}]},
            timeout=60).json()
        choice = chat["choices"][0]
        assert choice["finish_reason"] == "tool_calls"
        assert choice["message"]["content"] == "Let me check."
        assert choice["message"]["tool_calls"][0]["function"]["name"] == "get_weather"
        assert "prompt_token_ids" not in choice["message"]  # not training: no token data


def test_refused_token_ids_fall_back_to_text_marked_retokenized():
    with stack(refuse=True) as (url, fake):
        for _ in range(2):
            r = httpx.post(f"{url}/v1/responses", json={"input": "hi"}, timeout=60).json()
            last = r["output"][-1]
            assert last["token_trajectory"] == "retokenized"
            assert "refused a token-id prompt" in last["token_trajectory_reason"]
            assert last["content"][0]["text"] == "Answer: "
        # Asked once with ids, then text only.
        assert [(c["prompt_kind"], c["refused"]) for c in fake.state.completions] == [
            ("ids", True), ("text", False), ("text", False)]


def test_native_tool_template_keeps_the_previous_turn_once(tokenizer):
    """A template that renders `tool_calls` after the content (Qwen-like): the previous call's generated turn is its
    ids alone, its tool calls are not written a second time after them."""
    from llama_cpp import llama_chat_format

    template = (
        "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}"
        "{% for c in m.tool_calls or [] %}<tool_call>\n{{ c.function | tojson }}\n</tool_call>{% endfor %}"
        "<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
        "{# tools #}"
    )

    class QwenLike:
        vocab_size = tokenizer.vocab_size
        tokenize, detokenize = tokenizer.tokenize, tokenizer.detokenize
        prompt_start_ids, is_end_of_generation = tokenizer.prompt_start_ids, tokenizer.is_end_of_generation

        def __init__(self):
            self.template = template
            self.fmt = llama_chat_format.Jinja2ChatFormatter(template=template, eos_token="", bos_token="")

        def render(self, messages, add_generation_prompt, **kwargs):
            assert add_generation_prompt
            return self.fmt(messages=list(messages), **kwargs).prompt

    qwen = QwenLike()
    first = [{"role": "user", "content": "Weather?"}]
    prompt1 = full_prompt_ids(qwen, first)
    generated = tokenizer.tokenize('<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo"}}\n</tool_call>')
    generated.append(tokenizer.eos_id)
    calls = [{"id": "c", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Oslo"}'}}]
    messages = first + [
        {"role": "assistant", "content": None, "tool_calls": calls, "prompt_token_ids": prompt1,
         "generation_token_ids": generated},
        {"role": "tool", "tool_call_id": "c", "content": "-5C"},
    ]
    plain, tools = template_messages(messages, qwen, [WEATHER_TOOL])
    assert "tool_calls" in plain[1] and tools == [WEATHER_TOOL]  # the template renders both itself
    prompt = _token_prompt(bind(qwen, tools=tools), plain)
    assert prompt.mode == EXACT
    after = tokenizer.detokenize(prompt.ids[len(prompt1) + len(generated):])
    assert after == "\n<|im_start|>tool\n-5C<|im_end|>\n<|im_start|>assistant\n"


def test_hermes_format_round_trip_and_malformed_blocks():
    calls = [{"function": {"name": "f", "arguments": '{"a": 1}'}}, {"function": {"name": "g", "arguments": "{}"}}]
    text = format_hermes_tool_calls("Sure.", calls)
    assert parse_hermes_tool_calls(text) == ("Sure.", [("f", '{"a": 1}'), ("g", "{}")])
    assert parse_hermes_tool_calls("no calls") == ("no calls", [])
    broken = "x <tool_call>{not json}</tool_call> <tool_call>{\"name\": \"f\"}"
    assert parse_hermes_tool_calls(broken) == (broken, [])


def test_completion_to_chat_passes_routed_experts_and_engine_ids():
    server = make_server(VLLMModel, name="p", base_url="http://127.0.0.1:9/v1", model="m",
                         return_token_id_information=True, uses_reasoning_parser=False, use_completions_api=True)
    completion = {"choices": [{"text": "hi", "finish_reason": "stop", "token_ids": [5, 6],
                               "prompt_token_ids": [1, 2, 3], "routed_experts": "opaque",
                               "logprobs": {"tokens": ["token_id:5", "token_id:6"], "token_logprobs": [-0.5, -0.25]}}]}
    message = server._completion_to_chat(completion, None, False, False)["choices"][0]["message"]
    assert message["prompt_token_ids"] == [1, 2, 3] and message["generation_token_ids"] == [5, 6]
    assert message["generation_log_probs"] == [-0.5, -0.25]
    assert message["routed_experts"] == "opaque" and message["token_trajectory"] == EXACT
    completion["choices"][0]["routed_experts"] = None
    assert "routed_experts" not in server._completion_to_chat(completion, None, False, False)["choices"][0]["message"]
    completion["choices"][0]["logprobs"] = None
    with pytest.raises(ValueError, match="no per-token logprobs"):
        server._completion_to_chat(completion, None, False, False)


def test_config_checks():
    with pytest.raises(ValueError, match="use_completions_api: true as well"):
        make_server(VLLMModel, name="p", base_url="http://x/v1", model="m", return_token_id_information=True,
                    uses_reasoning_parser=False, render_chat_template=True)
    server = make_server(VLLMModel, name="p", base_url="http://x/v1", model="Qwen/Qwen3-4B",
                         return_token_id_information=True, uses_reasoning_parser=False, use_completions_api=True,
                         render_chat_template=True)
    with pytest.raises(NeMoGymConfigError, match="neither a local .gguf file nor a local tokenizer folder"):
        server.setup_webserver()


def test_raw_completions_mode_sends_text_and_reports_the_engine_prompt_ids(tokenizer):
    with stack(render_chat_template=False) as (url, fake):
        r = httpx.post(f"{url}/v1/responses", json={"input": "hi", "instructions": "Be brief."}, timeout=60).json()
        last = r["output"][-1]
        assert last["prompt_token_ids"] == tokenizer.tokenize("Be brief.\n\nhi")
        assert last["token_trajectory"] == EXACT
        assert fake.state.completions[-1]["prompt_kind"] == "text"
        refused = httpx.post(f"{url}/v1/responses", json={"input": "hi", "tools": [WEATHER_TOOL]}, timeout=60)
        assert refused.status_code == 400 and "render_chat_template" in refused.text


def test_fake_backend_serves_completions_only_when_asked():
    from starlette.testclient import TestClient

    assert TestClient(build_app()).post("/v1/completions", json={"prompt": [1, 2]}).status_code == 404
