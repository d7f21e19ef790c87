"""`ChatTokenizer`s (`nemo_gym.api.token_continuation`): a backend's tokenizer and chat template on our side, and the
Hermes tool-call text format for models whose answers are parsed here.

Two implementations:

* `LlamaChatTokenizer`: a llama-cpp-python model (a full one, as local_llama_model loads it, or a GGUF opened
  `vocab_only` for its tokenizer alone, `load_gguf_chat_tokenizer`): the GGUF's own chat template rendered by
  llama-cpp-python's Jinja2 formatter (the Transformers-compatible sandbox), tokenized with special tokens parsed
  and no BOS added.
* `HFChatTokenizer`: a local Hugging Face tokenizer folder (`load_hf_chat_tokenizer`), i.e. what a vLLM user
  has: `tokenizer.json` read by the `tokenizers` package (the `tokens` extra) and the chat template of
  `tokenizer_config.json` (or `chat_template.jinja`) rendered the way Transformers' `apply_chat_template` renders
  it (a sandboxed Jinja2 environment with `trim_blocks` / `lstrip_blocks`, `raise_exception`, `strftime_now`,
  a `tojson` that does not escape HTML, the special tokens as variables); tokenized with
  `add_special_tokens=False`, as `apply_chat_template(tokenize=True)` and vLLM's chat route do. Local files only:
  nothing is downloaded.

`load_chat_tokenizer(path)` picks the implementation from the path (a `.gguf` file, or a folder).

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
    "HFChatTokenizer",
    "ChatTemplateError",
    "load_hf_chat_tokenizer",
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


class ChatTemplateError(ValueError):
    """The chat template refused the conversation (its `raise_exception(...)`) or could not be rendered."""


def _special_token_text(value: Any) -> Optional[str]:
    """A special token of tokenizer_config.json: a string, or an AddedToken written as a dict (`content`)."""
    if isinstance(value, str):
        return value
    if isinstance(value, dict) and isinstance(value.get("content"), str):
        return value["content"]
    return None


def _compile_hf_template(template: str, where: str) -> Any:
    """`template` compiled as Transformers' `apply_chat_template` compiles it (`_compile_jinja_template`)."""
    import datetime

    import jinja2
    from jinja2.ext import Extension, loopcontrols
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    class GenerationBlock(Extension):
        """`{% generation %}...{% endgeneration %}` (Transformers' assistant-mask marker): renders its body."""

        tags = {"generation"}

        def parse(self, parser: Any) -> Any:
            lineno = next(parser.stream).lineno
            body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
            return jinja2.nodes.CallBlock(self.call_method("_body"), [], [], body).set_lineno(lineno)

        def _body(self, caller: Any) -> str:
            return caller()

    def raise_exception(message: Any) -> None:
        raise ChatTemplateError(str(message))

    def tojson(x: Any, ensure_ascii: bool = False, indent: Any = None, separators: Any = None,
               sort_keys: bool = False) -> str:
        # Jinja's own tojson escapes HTML characters; Transformers replaces it with plain json.dumps.
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    def strftime_now(format: str) -> str:
        return datetime.datetime.now().strftime(format)

    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[GenerationBlock, loopcontrols]
    )
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    try:
        return env.from_string(template)
    except jinja2.TemplateSyntaxError as err:
        raise NeMoGymConfigError(f"{where}: the chat template does not compile (line {err.lineno}: {err}).") from None


class HFChatTokenizer:
    """`nemo_gym.api.token_continuation.ChatTokenizer` for a local Hugging Face tokenizer folder: `tokenizer.json`
    (the fast tokenizer, read by the `tokenizers` package) and `tokenizer_config.json` (the chat template and the
    special tokens; a `chat_template.jinja` file beside it wins, as in Transformers). The template is rendered as
    `apply_chat_template(tokenize=False)` renders it; text is tokenized without added special tokens (the template
    writes the BOS it needs), and end-of-generation tokens are the EOS plus `generation_config.json`'s
    `eos_token_id`s when that file is there. Use `load_hf_chat_tokenizer` (cached per folder)."""

    def __init__(self, folder: str | Path, owner: str = "tokenizer") -> None:
        folder = Path(folder)
        where = f"{owner}: the tokenizer folder {str(folder)!r}"
        try:
            from tokenizers import Tokenizer
        except ImportError as err:
            raise NeMoGymConfigError(
                f"{where} needs the `tokenizers` package, which is not importable ({err}). Install the tokens "
                f"extra: pip install -e \".[tokens]\" (or pip install 'tokenizers>=0.20,<1')."
            ) from None
        tokenizer_file, config_file = folder / "tokenizer.json", folder / "tokenizer_config.json"
        missing = [f.name for f in (tokenizer_file, config_file) if not f.is_file()]
        if missing:
            hint = ""
            if "tokenizer.json" in missing and (folder / "tokenizer.model").is_file():
                hint = (" It has only a SentencePiece tokenizer.model (a slow tokenizer); save the fast one there: "
                        "AutoTokenizer.from_pretrained(FOLDER).save_pretrained(FOLDER).")
            raise NeMoGymConfigError(
                f"{where} has no {' and no '.join(missing)} (files are read locally, nothing is downloaded).{hint} "
                f"Point `tokenizer` at the folder of the model's Hugging Face tokenizer files."
            )
        try:
            self._tokenizer = Tokenizer.from_file(str(tokenizer_file))
        except Exception as err:  # the Rust loader raises its own exception type
            raise NeMoGymConfigError(f"{where}: {tokenizer_file} cannot be read by `tokenizers`: {err}") from None
        try:
            config = json.loads(config_file.read_text(encoding="utf-8"))
        except ValueError as err:
            raise NeMoGymConfigError(f"{where}: {config_file} is not valid JSON: {err}") from None
        if not isinstance(config, dict):
            raise NeMoGymConfigError(f"{where}: {config_file} must hold a JSON object.")

        template: Any = config.get("chat_template")
        jinja_file = folder / "chat_template.jinja"
        if jinja_file.is_file():
            template = jinja_file.read_text(encoding="utf-8")
        if isinstance(template, list):  # named templates: [{"name": "default", "template": ...}, ...]
            named = {t.get("name"): t.get("template") for t in template if isinstance(t, dict)}
        elif isinstance(template, str) and template:
            named = {"default": template}
        else:
            named = {}
        named = {name: text for name, text in named.items() if isinstance(text, str) and text}
        if "default" not in named and "tool_use" not in named:
            raise NeMoGymConfigError(
                f"{where} has no chat template (neither `chat_template` in tokenizer_config.json nor "
                f"chat_template.jinja); token-in/token-out prompts are rendered with the model's own template. Add "
                f"the model's template there."
            )
        self.template = named.get("default") or named["tool_use"]
        self._templates = {name: _compile_hf_template(text, f"{where}, template {name!r}")
                           for name, text in named.items()}

        # The special tokens as template variables (Transformers passes its special_tokens_map).
        self.special_tokens: dict[str, Any] = {}
        for key in ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token"):
            text = _special_token_text(config.get(key))
            if text is not None:
                self.special_tokens[key] = text
        extra = config.get("additional_special_tokens")
        if isinstance(extra, list):
            self.special_tokens["additional_special_tokens"] = [
                t for t in (_special_token_text(v) for v in extra) if t is not None
            ]

        self.vocab_size = int(self._tokenizer.get_vocab_size(with_added_tokens=True))
        end_ids: list[int] = []
        eos_text = self.special_tokens.get("eos_token")
        if eos_text is not None:
            eos_id = self._tokenizer.token_to_id(eos_text)
            if eos_id is None:
                raise NeMoGymConfigError(f"{where}: eos_token {eos_text!r} of {config_file} is not in tokenizer.json.")
            end_ids.append(int(eos_id))
        generation_file = folder / "generation_config.json"
        if generation_file.is_file():
            try:
                listed = json.loads(generation_file.read_text(encoding="utf-8")).get("eos_token_id")
            except (ValueError, AttributeError):
                listed = None
            for value in listed if isinstance(listed, list) else [listed]:
                if isinstance(value, int) and not isinstance(value, bool) and value not in end_ids:
                    end_ids.append(value)
        if not end_ids:
            raise NeMoGymConfigError(
                f"{where}: no end-of-generation token (no `eos_token` in tokenizer_config.json, no `eos_token_id` in "
                f"generation_config.json). Add the model's eos_token to tokenizer_config.json."
            )
        self.eos_id = end_ids[0]
        self._end_ids = frozenset(end_ids)

    def render(self, messages: Any, add_generation_prompt: bool, **template_kwargs: Any) -> str:
        import jinja2

        variables: dict[str, Any] = {"tools": None, "documents": None, **self.special_tokens, **template_kwargs}
        template = self._templates.get("tool_use") if variables.get("tools") else None
        template = template or self._templates.get("default") or self._templates["tool_use"]
        try:
            return template.render(
                messages=list(messages), add_generation_prompt=bool(add_generation_prompt), **variables
            )
        except jinja2.TemplateError as err:
            raise ChatTemplateError(f"the chat template failed: {type(err).__name__}: {err}") from None

    def tokenize(self, text: str) -> list[int]:
        if not text:
            return []
        return list(self._tokenizer.encode(text, add_special_tokens=False).ids)

    def prompt_start_ids(self) -> list[int]:
        return []  # as apply_chat_template(tokenize=True) and vLLM's chat route: the template writes the BOS

    def detokenize(self, ids: Any) -> str:
        return self._tokenizer.decode(list(ids), skip_special_tokens=False)

    def is_end_of_generation(self, token_id: int) -> bool:
        return token_id in self._end_ids


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


_HF_CACHE: dict[str, HFChatTokenizer] = {}


def load_hf_chat_tokenizer(path: str | Path, owner: str = "tokenizer") -> HFChatTokenizer:
    """The tokenizer and chat template of a local Hugging Face tokenizer folder, once per process and folder."""
    resolved = str(Path(path).expanduser().resolve())
    with _GGUF_LOCK:
        cached = _HF_CACHE.get(resolved)
        if cached is None:
            cached = _HF_CACHE[resolved] = HFChatTokenizer(resolved, owner)
        return cached


def load_chat_tokenizer(path: Optional[str], owner: str = "tokenizer") -> Any:
    """The `ChatTokenizer` at a local `path`: a `.gguf` file, or a Hugging Face tokenizer folder (`tokenizer.json`
    + `tokenizer_config.json`; the path of one of those two files means its folder). Local files only: a hub name
    is refused, nothing is downloaded."""
    if not path:
        raise NeMoGymConfigError(
            f"{owner}: no tokenizer path given; set it to a local .gguf file or a Hugging Face tokenizer folder."
        )
    where = Path(path).expanduser()
    if where.is_file() and where.suffix.lower() == ".gguf":
        return load_gguf_chat_tokenizer(where, owner)
    if where.is_file() and where.name in ("tokenizer.json", "tokenizer_config.json"):
        where = where.parent
    if where.is_dir():
        return load_hf_chat_tokenizer(where, owner)
    hub = ""
    if not where.exists() and str(path).count("/") == 1 and not str(path).startswith((".", "/", "~")):
        hub = (f" It looks like a Hugging Face hub name: download the tokenizer files first (e.g. "
               f"`huggingface-cli download {path} --include 'tokenizer*' 'generation_config.json' --local-dir DIR`) "
               f"and set it to DIR.")
    raise NeMoGymConfigError(
        f"{owner}: {str(path)!r} is neither a local .gguf file nor a local tokenizer folder (tokenizers are read "
        f"from local files only, nothing is downloaded).{hub} Set it to the model's GGUF file or to the folder "
        f"holding its tokenizer.json and tokenizer_config.json."
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
