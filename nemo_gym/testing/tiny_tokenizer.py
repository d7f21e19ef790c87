"""A real Hugging Face tokenizer folder built offline for tests: a tiny byte-level BPE trained on a few hundred lines
with the `tokenizers` package, ChatML special tokens, and a ChatML chat template in tokenizer_config.json (what
`HFChatTokenizer` in nemo_gym/api/chat_tokenizers.py reads). Nothing is downloaded."""

from __future__ import annotations

import json
from pathlib import Path

__all__ = ["CHATML", "make_tokenizer_folder"]

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
