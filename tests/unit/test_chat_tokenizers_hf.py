"""`HFChatTokenizer` (nemo_gym/api/chat_tokenizers.py): a local Hugging Face tokenizer folder as a `ChatTokenizer`,
checked with a REAL tokenizer trained here (a tiny byte-level BPE made with the `tokenizers` package, ChatML special
tokens, a ChatML chat template in tokenizer_config.json): rendering as Transformers' apply_chat_template renders,
tokenize / detokenize, a token-in/token-out continuation that keeps generated ids which re-tokenize differently, the
loader's errors (vllm_model in completions mode with such a folder as `tokenizer` is tested in
responses_api_models/vllm_model/tests/test_completions_mode.py)."""

from __future__ import annotations

import datetime
import json
from pathlib import Path

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
from nemo_gym.testing.tiny_tokenizer import make_tokenizer_folder  # noqa: E402

# The variables apply_chat_template gives a template besides `messages`.
VARIABLES = (
    "{{ bos_token }}|{{ eos_token }}|{{ tools | tojson }}|{{ strftime_now('%Y') }}|{{ enable_thinking }}|"
    "{% generation %}gen{% endgeneration %}|{% for i in range(3) %}{% if i == 1 %}{% break %}{% endif %}{{ i }}"
    "{% endfor %}|{{ add_generation_prompt }}"
)

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


WEATHER_TOOL = {
    "type": "function", "name": "get_weather", "description": "Current weather of a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
}


def test_template_messages_with_the_hf_tokenizer(tok):
    plain, tools = template_messages([{"role": "user", "content": [{"type": "text", "text": "hi"}]}], tok,
                                     [WEATHER_TOOL])
    assert tools is None and plain[0]["role"] == "system" and "get_weather" in plain[0]["content"]
    assert plain[1] == {"role": "user", "content": "hi"}
