"""`ChatTokenizer`s (`nemo_gym.api.token_continuation`): a backend's tokenizer and chat template on our side, and the
Hermes tool-call text format for models whose answers are parsed here.

One implementation today:

* `LlamaChatTokenizer`: a llama-cpp-python model (a full one, as local_llama_model loads it, or a GGUF opened
  `vocab_only` for its tokenizer alone, `load_gguf_chat_tokenizer`): the GGUF's own chat template rendered by
  llama-cpp-python's Jinja2 formatter (the Transformers-compatible sandbox), tokenized with special tokens parsed
  and no BOS added.

`load_chat_tokenizer(path)` picks the implementation from the path (a `.gguf` file). A local Hugging Face
tokenizer folder (`tokenizer.json` + `tokenizer_config.json`) is not supported yet: it is refused with a message.

`bind(tokenizer, tools=..., template_kwargs=...)` gives a `ChatTokenizer` whose `render` passes a request's tool
list and chat-template kwargs (`enable_thinking`, ...) to the template, as HF `apply_chat_template(tools=...,
**kwargs)` does.

Hermes tool calls (`format_hermes_tool_calls`, `parse_hermes_tool_calls`): the format of Qwen2.5/Qwen3, Hermes and
many other open models, i.e. one block per call::

    <tool_call>
    {"name": "get_weather", "arguments": {"city": "Oslo"}}
    </tool_call>

`template_messages` prepares chat messages for a template: text content as a string, and for templates that do not
render `tool_calls` / `tools` themselves (e.g. SmolLM2's plain ChatML) the calls written into the assistant content
in that format and the tools described in the system message, so that what the model generates and what a later
prompt replays are the same text.
"""

from __future__ import annotations

import json
import re
import threading
from pathlib import Path
from typing import Any, Mapping, Optional, Sequence

from nemo_gym.errors import NeMoGymConfigError

__all__ = [
    "LlamaChatTokenizer",
    "BoundChatTokenizer",
    "bind",
    "load_gguf_chat_tokenizer",
    "load_chat_tokenizer",
    "template_supports",
    "template_messages",
    "format_hermes_tool_calls",
    "parse_hermes_tool_calls",
    "hermes_tools_system_text",
]


class LlamaChatTokenizer:
    """`nemo_gym.api.token_continuation.ChatTokenizer` for a llama-cpp-python model: the GGUF's chat template
    rendered by llama-cpp-python's own Jinja2 formatter, tokenized the way its chat handler tokenizes a prompt
    (special tokens parsed; no BOS added, the template writes what it needs). Works on a `vocab_only` model.

    `owner`: who needs it, named in errors (`local_llama_model`, `vllm_model tokenizer=...`)."""

    def __init__(self, llama: Any, owner: str = "local_llama_model") -> None:
        from llama_cpp import llama_chat_format

        template = llama.metadata.get("tokenizer.chat_template")
        if not template or llama.chat_format not in (None, "chat_template.default"):
            raise NeMoGymConfigError(
                f"{owner}: token-in/token-out prompts need the GGUF's own chat template, but chat_format is "
                f"{llama.chat_format!r} and the GGUF has {'a' if template else 'no'} `tokenizer.chat_template`. "
                f"Unset `chat_format`, or use a GGUF that ships a chat template."
            )
        self._llama = llama
        self.template = template
        eos, bos = llama.token_eos(), llama.token_bos()
        self.eos_id = int(eos)
        eos_text = llama._model.token_get_text(eos) if eos != -1 else ""
        bos_text = llama._model.token_get_text(bos) if bos != -1 else ""
        self._formatters = {
            flag: llama_chat_format.Jinja2ChatFormatter(
                template=template, eos_token=eos_text, bos_token=bos_text, add_generation_prompt=flag
            )
            for flag in (True, False)
        }
        self.vocab_size = int(llama.n_vocab())
        self._lock = threading.Lock()  # llama.cpp's tokenizer calls share buffers: one at a time

    def render(self, messages: Any, add_generation_prompt: bool, **template_kwargs: Any) -> str:
        return self._formatters[bool(add_generation_prompt)](messages=list(messages), **template_kwargs).prompt

    def tokenize(self, text: str) -> list[int]:
        if not text:
            return []
        with self._lock:
            return list(self._llama.tokenize(text.encode("utf-8"), add_bos=False, special=True))

    def prompt_start_ids(self) -> list[int]:
        return []  # Jinja2ChatFormatter reports added_special=True: the chat handler adds no BOS

    def detokenize(self, ids: Any) -> str:
        with self._lock:
            return self._llama.detokenize(list(ids), special=True).decode("utf-8", errors="replace")

    def is_end_of_generation(self, token_id: int) -> bool:
        import llama_cpp

        return bool(llama_cpp.llama_vocab_is_eog(self._llama._model.vocab, token_id))


class BoundChatTokenizer:
    """A `ChatTokenizer` whose `render` passes one request's `tools` and chat-template kwargs to the template."""

    def __init__(self, inner: Any, tools: Optional[list] = None, template_kwargs: Optional[Mapping] = None) -> None:
        self.inner = inner
        self.vocab_size = inner.vocab_size
        self._kwargs = dict(template_kwargs or {})
        if tools:
            self._kwargs["tools"] = tools

    def render(self, messages: Sequence[Mapping[str, Any]], add_generation_prompt: bool) -> str:
        return self.inner.render(messages, add_generation_prompt, **self._kwargs)

    def tokenize(self, text: str) -> list[int]:
        return self.inner.tokenize(text)

    def prompt_start_ids(self) -> list[int]:
        return self.inner.prompt_start_ids()

    def detokenize(self, ids: Sequence[int]) -> str:
        return self.inner.detokenize(ids)

    def is_end_of_generation(self, token_id: int) -> bool:
        return self.inner.is_end_of_generation(token_id)


def bind(
    tokenizer: Any, *, tools: Optional[list] = None, template_kwargs: Optional[Mapping] = None
) -> BoundChatTokenizer:
    return BoundChatTokenizer(tokenizer, tools, template_kwargs)


_GGUF_CACHE: dict[str, LlamaChatTokenizer] = {}
_GGUF_LOCK = threading.Lock()


def load_gguf_chat_tokenizer(path: str | Path, owner: str = "tokenizer") -> LlamaChatTokenizer:
    """The tokenizer and chat template of a GGUF file, opened `vocab_only` (no weights; ~3 s for SmolLM2), once
    per process and path."""
    try:
        import llama_cpp
    except ImportError as err:
        raise NeMoGymConfigError(
            f"{owner}: reading the GGUF tokenizer {str(path)!r} needs llama-cpp-python, which is not importable "
            f"({err}). Install the local-model extra: pip install -e \".[local]\"."
        ) from None
    resolved = str(Path(path).expanduser().resolve())
    with _GGUF_LOCK:
        cached = _GGUF_CACHE.get(resolved)
        if cached is None:
            llama = llama_cpp.Llama(model_path=resolved, vocab_only=True, verbose=False)
            cached = _GGUF_CACHE[resolved] = LlamaChatTokenizer(llama, owner)
        return cached


def load_chat_tokenizer(path: Optional[str], owner: str = "tokenizer") -> LlamaChatTokenizer:
    """The `ChatTokenizer` at a local `path`: a `.gguf` file. No downloads: a hub name is refused."""
    if not path:
        raise NeMoGymConfigError(f"{owner}: no tokenizer path given; set it to a local .gguf file.")
    where = Path(path).expanduser()
    if where.is_file() and where.suffix.lower() == ".gguf":
        return load_gguf_chat_tokenizer(where, owner)
    if where.is_dir():
        raise NeMoGymConfigError(
            f"{owner}: {str(path)!r} is a folder; Hugging Face tokenizer folders are not supported yet. Point it at "
            f"a GGUF file of the same model (its tokenizer and chat template are read without the weights)."
        )
    raise NeMoGymConfigError(
        f"{owner}: {str(path)!r} is not a local .gguf file (tokenizers are read from local files only, nothing is "
        f"downloaded). Set it to the path of the model's GGUF file."
    )


# ----------------------------------------------------------------------------------------------- templates


def template_supports(tokenizer: Any) -> tuple[bool, bool]:
    """(renders `tool_calls` of assistant messages, renders the `tools` list), read from the template's text; an
    implementation without a `template` attribute is assumed to do both."""
    inner = getattr(tokenizer, "inner", tokenizer)
    template = getattr(inner, "template", None)
    if not isinstance(template, str):
        return True, True
    return "tool_calls" in template, re.search(r"\btools\b", template) is not None


def _text(content: Any, where: str) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        texts = []
        for part in content:
            if isinstance(part, str):
                texts.append(part)
            elif isinstance(part, dict) and isinstance(part.get("text"), str):
                texts.append(part["text"])
            else:
                kind = part.get("type") if isinstance(part, dict) else type(part).__name__
                raise ValueError(f"{where}: content part of type {kind!r} cannot be rendered (text only)")
        return "".join(texts)
    raise ValueError(f"{where}: content must be a string or a list of text parts")


def _calls(tool_calls: Any) -> list[tuple[str, Any]]:
    out = []
    for call in tool_calls or ():
        function = (call or {}).get("function") or {}
        arguments = function.get("arguments")
        if isinstance(arguments, str):
            try:
                arguments = json.loads(arguments) if arguments.strip() else {}
            except ValueError:
                pass  # sent as the string it is
        out.append((function.get("name") or "", {} if arguments is None else arguments))
    return out


def template_messages(
    messages: Sequence[Mapping[str, Any]], tokenizer: Any, tools: Optional[list]
) -> tuple[list[dict], Optional[list]]:
    """Chat `messages` ready for `tokenizer`'s template, and the tools to pass to it (None when the template does not
    read them: they are then described in the system message, `hermes_tools_system_text`).

    Content becomes a string (text parts joined); token bookkeeping keys stay (token_continuation strips them).
    For a template that does not render `tool_calls`, each assistant message's calls are written after its text
    in the Hermes format (`format_hermes_tool_calls`), the way such a model generates them."""
    renders_calls, renders_tools = template_supports(tokenizer)
    out: list[dict] = []
    for index, message in enumerate(messages):
        item = dict(message)
        item["content"] = _text(message.get("content"), f"messages[{index}]")
        if not renders_calls and item.get("tool_calls"):
            item["content"] = format_hermes_tool_calls(item["content"], item.pop("tool_calls"))
        out.append(item)
    if tools and not renders_tools:
        text = hermes_tools_system_text(tools)
        if out and out[0].get("role") == "system":
            out[0] = {**out[0], "content": f"{out[0]['content']}\n\n{text}" if out[0]["content"] else text}
        else:
            out.insert(0, {"role": "system", "content": text})
        tools = None
    return out, (tools or None)


def format_hermes_tool_calls(text: Optional[str], tool_calls: Any) -> str:
    """`text` followed by one `<tool_call>` block per chat tool call (arguments as JSON objects)."""
    blocks = [
        "<tool_call>\n" + json.dumps({"name": name, "arguments": arguments}, ensure_ascii=False) + "\n</tool_call>"
        for name, arguments in _calls(tool_calls)
    ]
    pieces = ([text] if text else []) + blocks
    return "\n".join(pieces)


_TOOL_CALL = re.compile(r"<tool_call>\s*(.*?)\s*</tool_call>", re.DOTALL)


def parse_hermes_tool_calls(text: str) -> tuple[str, list[tuple[str, str]]]:
    """(the text outside the `<tool_call>` blocks, stripped; [(name, arguments as a JSON string)]). A block whose
    body is not a JSON object with a string `name` stays in the text (a malformed call is the model's answer, not
    a call); an unclosed block too."""
    calls: list[tuple[str, str]] = []
    kept: list[str] = []
    position = 0
    for found in _TOOL_CALL.finditer(text):
        try:
            body = json.loads(found.group(1))
        except ValueError:
            body = None
        if not isinstance(body, dict) or not isinstance(body.get("name"), str):
            continue
        arguments = body.get("arguments", body.get("parameters", {}))
        kept.append(text[position:found.start()])
        position = found.end()
        if not isinstance(arguments, str):
            arguments = json.dumps(arguments, ensure_ascii=False)
        calls.append((body["name"], arguments))
    kept.append(text[position:])
    return "".join(kept).strip() if calls else text, calls


def hermes_tools_system_text(tools: list) -> str:
    """The tool list for a template that does not render `tools` (Qwen2.5's wording of the Hermes format)."""
    lines = []
    for tool in tools:
        function = tool.get("function", tool) if isinstance(tool, dict) else tool
        lines.append(json.dumps({"type": "function", "function": function}, ensure_ascii=False))
    return (
        "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
        "You are provided with function signatures within <tools></tools> XML tags:\n<tools>\n"
        + "\n".join(lines)
        + "\n</tools>\n\nFor each function call, return a json object with function name and arguments within "
        "<tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": <args-json-object>}"
        "\n</tool_call>"
    )
