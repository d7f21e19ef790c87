"""`HFChatTokenizer` (nemo_gym/api/chat_tokenizers.py): a local Hugging Face tokenizer folder as a `ChatTokenizer`,
checked with a REAL tokenizer trained here (a tiny byte-level BPE made with the `tokenizers` package, ChatML special
tokens, a ChatML chat template in tokenizer_config.json): rendering as Transformers' apply_chat_template renders,
tokenize / detokenize, a token-in/token-out continuation that keeps generated ids which re-tokenize differently, the
loader's errors, and vllm_model in completions mode with that folder as `tokenizer` in front of the fake backend
(in-process servers on threads; no process is started)."""

from __future__ import annotations

import datetime
import json
from pathlib import Path

import httpx
import pytest

pytest.importorskip("tokenizers", reason='HF tokenizer folders need the tokens extra: pip install -e ".[tokens]"')

from nemo_gym.api.chat_tokenizers import (  # noqa: E402
    ChatTemplateError,
    HFChatTokenizer,
    bind,
    load_chat_tokenizer,
    template_messages,
    template_supports,
)
from nemo_gym.api.token_continuation import (  # noqa: E402
    EXACT,
    ChatTokenizer,
    continuation_prompt_ids,
    full_prompt_ids,
)
from nemo_gym.errors import NeMoGymConfigError  # noqa: E402

# ChatML as many HF tokenizer_config.json files write it: one block tag per line, so the output is right only with
# trim_blocks (the newline after a block tag dropped) and lstrip_blocks (the indentation before one dropped).
CHATML = (
    "{% for message in messages %}\n"
    "  {% if message['role'] == 'system' and not loop.first %}\n"
    "{{ raise_exception('a system message must come first') }}\n"
    "  {% endif %}\n"
    "<|im_start|>{{ message['role'] }}\n"
    "{{ message['content'] }}<|im_end|>\n"
    "{% endfor %}\n"
    "{% if add_generation_prompt %}\n"
    "<|im_start|>assistant\n"
    "{% endif %}"
)
# The variables apply_chat_template gives a template besides `messages`.
VARIABLES = (
    "{{ bos_token }}|{{ eos_token }}|{{ tools | tojson }}|{{ strftime_now('%Y') }}|{{ enable_thinking }}|"
    "{% generation %}gen{% endgeneration %}|{% for i in range(3) %}{% if i == 1 %}{% break %}{% endif %}{{ i }}"
    "{% endfor %}|{{ add_generation_prompt }}"
)

WORDS = ("hello world the weather in oslo is cold today user assistant system tool call answer let me check "
         "what is sunny rain snow city temperature degrees please thanks sure here you are a helpful").split()


def _corpus() -> list[str]:
    lines = []
    for k in range(400):
        words = [WORDS[(k * 7 + j * 3) % len(WORDS)] for j in range(6 + k % 5)]
        lines.append(" ".join(words) + ("." if k % 3 else "?"))
        if k % 4 == 0:
            lines.append('<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo"}}\n</tool_call>')
    return lines


def make_tokenizer_folder(folder: Path, template: str = CHATML, **config: object) -> Path:
    """A real HF tokenizer folder: a byte-level BPE trained on a few hundred lines, ChatML special tokens."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    folder.mkdir(parents=True, exist_ok=True)
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=700, special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False,
    )
    tokenizer.train_from_iterator(_corpus(), trainer)
    tokenizer.save(str(folder / "tokenizer.json"))
    settings = {"chat_template": template, "bos_token": "<|endoftext|>",
                "eos_token": {"content": "<|im_end|>", "__type": "AddedToken"}, "pad_token": "<|endoftext|>",
                "additional_special_tokens": ["<|im_start|>", "<|im_end|>"], **config}
    (folder / "tokenizer_config.json").write_text(json.dumps(settings), encoding="utf-8")
    return folder


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> Path:
    return make_tokenizer_folder(tmp_path_factory.mktemp("hf") / "chatml")


@pytest.fixture(scope="module")
def tok(folder) -> HFChatTokenizer:
    return load_chat_tokenizer(str(folder), owner="test")


def test_loads_as_a_chat_tokenizer_once_per_folder(folder, tok):
    assert isinstance(tok, HFChatTokenizer) and isinstance(tok, ChatTokenizer)
    assert load_chat_tokenizer(str(folder)) is tok
    assert load_chat_tokenizer(str(folder / "tokenizer.json")) is tok  # a file of the folder means the folder
    assert 259 < tok.vocab_size <= 700  # 256 bytes, 3 special tokens, the merges learnt
    assert tok.prompt_start_ids() == []
    assert tok.detokenize([tok.eos_id]) == "<|im_end|>"
    assert tok.is_end_of_generation(tok.eos_id) and not tok.is_end_of_generation(tok.tokenize("hello")[0])
    assert template_supports(tok) == (False, False)  # plain ChatML renders neither tool_calls nor tools


def test_render_as_apply_chat_template(tok):
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi"}]
    assert tok.render(messages, True) == (
        "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    )
    assert tok.render(messages, False).endswith("hi<|im_end|>\n")
    with pytest.raises(ChatTemplateError, match="a system message must come first") as err:
        tok.render(messages[::-1], True)
    assert isinstance(err.value, ValueError)  # what vllm_model turns into an HTTP 400


def test_template_variables(tmp_path, folder):
    other = tmp_path / "vars"
    other.mkdir()
    (other / "tokenizer.json").write_bytes((folder / "tokenizer.json").read_bytes())
    (other / "tokenizer_config.json").write_text(json.dumps(
        {"chat_template": VARIABLES, "bos_token": "<|endoftext|>", "eos_token": "<|im_end|>"}))
    (other / "generation_config.json").write_text(json.dumps({"eos_token_id": [1, 2, 0]}))
    hf = load_chat_tokenizer(str(other))
    tools = [{"type": "function", "function": {"name": "f", "description": "<b>&'é"}}]
    year = datetime.datetime.now().strftime("%Y")
    text = bind(hf, tools=tools, template_kwargs={"enable_thinking": False}).render([], True)
    assert text == (f"<|endoftext|>|<|im_end|>|{json.dumps(tools, ensure_ascii=False)}|{year}|False|gen|0|True")
    assert hf.render([], False) == f"<|endoftext|>|<|im_end|>|null|{year}||gen|0|False"
    assert [t for t in range(hf.vocab_size) if hf.is_end_of_generation(t)] == [0, 1, 2]  # eos + generation_config
    assert template_supports(hf) == (False, True)


def test_tokenize_and_detokenize(tok):
    text = "<|im_start|>user\nWeather in Oslo? héllo 🌧<|im_end|>\n"
    ids = tok.tokenize(text)
    assert ids[0] == tok.tokenize("<|im_start|>")[0] and len(tok.tokenize("<|im_start|>")) == 1
    assert tok.tokenize("<|im_end|>") == [tok.eos_id]
    assert tok.detokenize(ids) == text
    assert tok.tokenize("") == []
    assert tok.tokenize("hello")[0] != tok.tokenize("<|endoftext|>")[0]  # no BOS added


def test_continuation_keeps_generated_ids_that_retokenize_differently(tok):
    first = [{"role": "user", "content": "hi"}]
    prompt1 = full_prompt_ids(tok, first)
    assert tok.detokenize(prompt1) == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    # The model generated "hello world" one byte-level character at a time: the same text, other ids than the
    # merged ones the tokenizer would give.
    generated = [tok._tokenizer.token_to_id(c) for c in "hello\u0120world"] + [tok.eos_id]
    assert None not in generated
    assert tok.tokenize("hello world") != generated[:-1]
    messages = first + [
        {"role": "assistant", "content": "hello world", "prompt_token_ids": prompt1, "generation_token_ids": generated},
        {"role": "user", "content": "again"},
    ]
    prompt = continuation_prompt_ids(tok, messages)
    assert prompt.mode == EXACT and prompt.reused == len(prompt1) + len(generated)
    assert prompt.ids[: prompt.reused] == prompt1 + generated
    assert tok.detokenize(prompt.ids[prompt.reused:]) == "\n<|im_start|>user\nagain<|im_end|>\n<|im_start|>assistant\n"
    # The same text as the whole conversation rendered, but not the ids a re-tokenization gives.
    plain = [{k: v for k, v in m.items() if k in ("role", "content")} for m in messages]
    assert tok.detokenize(prompt.ids) == tok.render(plain, True)
    assert full_prompt_ids(tok, messages) != prompt.ids


def test_loader_errors_name_the_path(tmp_path, folder):
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(NeMoGymConfigError, match="has no tokenizer.json and no tokenizer_config.json") as err:
        load_chat_tokenizer(str(empty), owner="vllm_model 'p': `tokenizer`")
    assert str(empty) in str(err.value) and "vllm_model 'p'" in str(err.value)
    (empty / "tokenizer.model").write_bytes(b"x")
    with pytest.raises(NeMoGymConfigError, match="SentencePiece"):
        load_chat_tokenizer(str(empty))

    no_template = tmp_path / "no_template"
    no_template.mkdir()
    (no_template / "tokenizer.json").write_bytes((folder / "tokenizer.json").read_bytes())
    (no_template / "tokenizer_config.json").write_text(json.dumps({"eos_token": "<|im_end|>"}))
    with pytest.raises(NeMoGymConfigError, match="has no chat template"):
        load_chat_tokenizer(str(no_template))
    (no_template / "chat_template.jinja").write_text("{% for m in messages %}{{ m.content }}{% endfor %}")
    assert load_chat_tokenizer(str(no_template)).render([{"role": "user", "content": "x"}], True) == "x"

    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "tokenizer.json").write_text("{not json")
    (broken / "tokenizer_config.json").write_text("{}")
    with pytest.raises(NeMoGymConfigError, match="cannot be read by `tokenizers`"):
        load_chat_tokenizer(str(broken))

    with pytest.raises(NeMoGymConfigError, match="hub name.*nothing is downloaded|nothing is downloaded.*hub name"):
        load_chat_tokenizer("Qwen/Qwen3-4B-not-here")
    with pytest.raises(NeMoGymConfigError, match="no tokenizer path given"):
        load_chat_tokenizer(None)


# ---------------------------------------------------------------------------------------------------------------
# vllm_model, completions mode, with the folder as `tokenizer`, against the fake backend's /v1/completions


WEATHER_TOOL = {
    "type": "function", "name": "get_weather", "description": "Current weather of a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
}
SCRIPT = [
    {"match": {"endpoint": "completions", "step": 1, "last_user_contains": "Oslo"},
     "output": ["Let me check.", {"type": "function_call", "name": "get_weather", "arguments": {"city": "Oslo"}}]},
    {"match": {"endpoint": "completions"}, "output": ["Answer: {{last_tool_output}}"]},
]


def test_vllm_model_completions_mode_with_an_hf_tokenizer_folder(folder, tok):
    from nemo_gym.testing.fake_openai_server import build_app
    from nemo_gym.testing.live_server import live_server
    from nemo_gym.testing.servers import make_server
    from responses_api_models.vllm_model.app import VLLMModel

    fake = build_app(script=SCRIPT, completions_tokenizer=str(folder))
    with live_server(fake) as up:
        server = make_server(
            VLLMModel, name="policy_model", base_url=f"{up}/v1", model="served", uses_reasoning_parser=False,
            return_token_id_information=True, use_completions_api=True, render_chat_template=True,
            tokenizer=str(folder),
        )
        with live_server(server.build_app()) as url:
            r1 = httpx.post(f"{url}/v1/responses", json={"input": "Weather in Oslo?", "tools": [WEATHER_TOOL]},
                            timeout=60).json()
            message, call = r1["output"]
            assert message["content"][0]["text"] == "Let me check."
            assert (call["name"], call["arguments"]) == ("get_weather", '{"city": "Oslo"}')
            assert call["token_trajectory"] == EXACT
            assert tok.detokenize(call["generation_token_ids"]).endswith("</tool_call><|im_end|>")
            # The tools were described in the system message (plain ChatML does not render `tools`).
            assert "<tools>" in tok.detokenize(call["prompt_token_ids"])
            r2 = httpx.post(f"{url}/v1/responses", json={
                "input": [{"role": "user", "content": "Weather in Oslo?"}, *r1["output"],
                          {"type": "function_call_output", "call_id": call["call_id"], "output": "-5C"}],
                "tools": [WEATHER_TOOL]}, timeout=60).json()
    last = r2["output"][-1]
    assert last["content"][0]["text"] == "Answer: -5C"
    assert last["token_trajectory"] == EXACT
    head = call["prompt_token_ids"] + call["generation_token_ids"]
    assert last["prompt_token_ids"][: len(head)] == head
    assert tok.detokenize(last["prompt_token_ids"][len(head):]).startswith("\n<|im_start|>tool\n-5C<|im_end|>")
    assert [c["prompt_kind"] for c in fake.state.completions] == ["ids", "ids"]


def test_template_messages_with_the_hf_tokenizer(tok):
    plain, tools = template_messages([{"role": "user", "content": [{"type": "text", "text": "hi"}]}], tok,
                                     [WEATHER_TOOL])
    assert tools is None and plain[0]["role"] == "system" and "get_weather" in plain[0]["content"]
    assert plain[1] == {"role": "user", "content": "hi"}
