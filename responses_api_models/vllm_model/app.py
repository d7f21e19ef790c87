"""vllm_model: the Responses API in front of any Chat Completions server (vLLM, SGLang, llama.cpp, Ollama, ...).

`POST /v1/responses` converts the request to Chat Completions (`nemo_gym.api.chat_conversion`), calls the upstream's
`/chat/completions` and converts the answer back; `POST /v1/chat/completions` calls the upstream with the same
preparation (model name, developer role, `<think>` handling, chat-template kwargs, training token data). With
`is_responses_native: true` `/v1/responses` is forwarded to the upstream's own `/responses` instead.

Behaviour in short (details and the differences from NeMo Gym v0.2 are in README.md):

* `base_url` may list several upstreams: a session (the caller's cookie, i.e. one rollout) sticks to one of them,
  new sessions are spread round robin.
* `instructions` becomes a leading system message; Responses fields with no Chat Completions equivalent are
  logged once per field name.
* Reasoning: `<think>...</think>` text <-> reasoning items; with `uses_reasoning_parser` the upstream's
  `reasoning_content` / `reasoning` fields are used in both directions.
* Training (`return_token_id_information`): the upstream is asked for `logprobs` with
  `return_tokens_as_token_ids` and for `return_token_ids`; the last output item carries `prompt_token_ids`,
  `generation_token_ids`, `generation_log_probs` and the upstream's `routed_experts` if any, read in NeMo Gym
  v0.5's order (`nemo_gym.api.token_sources`: NeMo RL's bundle on the message; the engine's `prompt_token_ids` +
  `token_ids`; the `token_id:N` logprobs + a `POST /tokenize` of the prompt, asked after the generation). Partial
  or conflicting token data is HTTP 502; `n` > 1 is HTTP 400.
* Token-in/token-out (`use_completions_api` + `render_chat_template` + `tokenizer`, a local GGUF or Hugging Face
  tokenizer folder): the chat template
  is rendered here and the upstream's `/v1/completions` gets a token-id prompt built by
  `nemo_gym.api.token_continuation` (previous prompt + generated ids + only the tokens after them); tool calls are
  parsed from the generated text (Hermes `<tool_call>` blocks); `token_trajectory` says exact / retokenized.
* An upstream HTTP 400 about the context length becomes an empty assistant message with
  `incomplete_details: {reason: max_output_tokens}`; other upstream errors come back with the upstream's status
  and message; an unreachable upstream is HTTP 502.
* Streaming (`"stream": true`, `stream_responses` / `stream_chat_completions`): the upstream is called with
  `stream: true` and its chunks go to the client as they come: as Responses events (`ChatToResponses`), as chat
  chunks (post-processed per chunk like the whole answer), or as Messages events; a client that hangs up closes
  the upstream stream. The final event carries what the non-streamed call would have answered.
"""

from __future__ import annotations

import asyncio
import http.cookiejar
import logging
from collections import OrderedDict
from collections.abc import Mapping
from typing import Any, AsyncIterator, Optional, Union

import httpx
import orjson
from fastapi import Body, Request
from fastapi.responses import Response
from omegaconf import DictConfig
from pydantic import PrivateAttr, model_validator

from nemo_gym.api.chat_conversion import (
    ChatConversionError,
    build_response,
    chat_completion_to_response,
    empty_chat_completion,
    extract_think,
    fold_reasoning_into_content,
    generation_tokens_from_logprobs,
    is_context_length_error,
    new_item_id,
    prepare_chat_messages,
    responses_to_chat_params,
    wants_output_logprobs,
)
from nemo_gym.api.chat_tokenizers import bind, load_chat_tokenizer, parse_hermes_tool_calls, template_messages
from nemo_gym.api.streaming import DONE, BackendDoesNotStream, ChatToResponses, chat_completion_chunks
from nemo_gym.api.token_sources import TokenBundle, TokenSourceError, TokenSources
from nemo_gym.api.token_continuation import (
    EXACT,
    RETOKENIZED,
    TOKEN_TRAJECTORY_KEY,
    TOKEN_TRAJECTORY_REASON_KEY,
    PromptIds,
    continuation_prompt_ids,
    full_prompt_ids,
    previous_call,
)
from nemo_gym.base_responses_api_model import (
    BaseResponsesAPIModelConfig,
    SimpleResponsesAPIModel,
)
from nemo_gym.http.client import DEFAULT_TIMEOUT, get_global_transport
from nemo_gym.openai_utils import (
    NeMoGymAsyncOpenAI,
    NeMoGymChatCompletionCreateParamsNonStreaming,
    NeMoGymOpenAIError,
    NeMoGymResponseCreateParamsNonStreaming,
)
from nemo_gym.server_utils import SESSION_ID_KEY
from nemo_gym.http.sse_client import upstream_sse
from nemo_gym.serving.stream_adapter import StreamRefused

LOG = logging.getLogger("nemo_gym.vllm_model")

# Sessions remembered for stickiness (least recently used first out); a forgotten session is simply re-assigned.
MAX_STICKY_SESSIONS = 100_000
# Keys of the chat request that the upstream's /tokenize needs to render the same prompt.
_TOKENIZE_KEYS = (
    "model", "messages", "tools", "chat_template", "chat_template_kwargs", "add_generation_prompt",
    "continue_final_message", "documents", "mm_processor_kwargs",
)
# Per-request overrides carried in Responses `metadata` (its values are strings, so these are JSON strings).
_METADATA_OVERRIDES = ("chat_template_kwargs", "extra_body")


class VLLMConverter:
    """The Responses -> Chat Completions conversion this server applies, usable on its own (NeMo Gym v0.5 agents
    import it from here, e.g. to render a request as chat messages and count its prompt tokens with the backend's
    `/tokenize`). A thin front over `nemo_gym.api.chat_conversion.responses_to_chat_params`; the flags mean what
    this server's config keys of the same names mean."""

    def __init__(
        self,
        return_token_id_information: bool = False,
        *,
        uses_reasoning_parser: bool = False,
        replace_developer_role_with_system: bool = False,
    ) -> None:
        self.return_token_id_information = return_token_id_information
        self.uses_reasoning_parser = uses_reasoning_parser
        self.replace_developer_role_with_system = replace_developer_role_with_system

    def responses_to_chat_completion_create_params(
        self, body: Union[NeMoGymResponseCreateParamsNonStreaming, Mapping[str, Any]]
    ) -> NeMoGymChatCompletionCreateParamsNonStreaming:
        """The Chat Completions request for Responses request `body` (a model or a dict of the keys set): messages
        (instructions as a leading system message), tools, sampling fields. Fields with no Chat Completions
        equivalent are left out. Raises `ChatConversionError` for input that cannot be expressed."""
        if isinstance(body, NeMoGymResponseCreateParamsNonStreaming):
            params = body.model_dump(exclude_unset=True)
        else:
            params = NeMoGymResponseCreateParamsNonStreaming.model_validate(dict(body)).model_dump(exclude_unset=True)
        chat, _unmapped = responses_to_chat_params(
            params,
            training=self.return_token_id_information,
            replace_developer_role_with_system=self.replace_developer_role_with_system,
            uses_reasoning_parser=self.uses_reasoning_parser,
        )
        if params.get("model") is not None:
            chat.setdefault("model", params["model"])
        return NeMoGymChatCompletionCreateParamsNonStreaming.model_validate(chat)


class VLLMModelConfig(BaseResponsesAPIModelConfig):
    base_url: Union[str, list[str]]
    api_key: Optional[str] = None
    model: str
    return_token_id_information: bool
    uses_reasoning_parser: bool
    replace_developer_role_with_system: bool = False
    sequential_reasoning_allowed: bool = True
    is_responses_native: bool = False
    chat_template_kwargs: Optional[dict[str, Any]] = None
    extra_body: Optional[dict[str, Any]] = None
    # Ours: upstream requests per call (429/5xx and connection errors are retried with backoff).
    max_attempts: int = 3
    # NeMo Gym v0.5: the upstream's /v1/completions instead of /v1/chat/completions; with render_chat_template the
    # chat template is rendered here with `tokenizer` (a local .gguf file or Hugging Face tokenizer folder; null:
    # `model` as a path) and the prompt
    # is sent as token ids built token-in/token-out (README "Token-in/token-out").
    use_completions_api: bool = False
    render_chat_template: bool = False
    tokenizer: Optional[str] = None

    @model_validator(mode="after")
    def _check(self) -> "VLLMModelConfig":
        if not self.base_urls:
            raise ValueError("base_url must name at least one upstream (e.g. http://127.0.0.1:8000/v1)")
        if self.is_responses_native:
            unsupported = [
                name
                for name, on in (
                    ("return_token_id_information: true", self.return_token_id_information),
                    ("sequential_reasoning_allowed: false", not self.sequential_reasoning_allowed),
                )
                if on
            ]
            if unsupported:
                raise ValueError(
                    f"is_responses_native: true forwards /v1/responses to the upstream as is, so "
                    f"{' and '.join(unsupported)} cannot be applied; use the Chat Completions path "
                    f"(is_responses_native: false) for that."
                )
        return self

    @model_validator(mode="after")
    def _check_completions(self) -> "VLLMModelConfig":
        if self.render_chat_template and not self.use_completions_api:
            raise ValueError(
                "render_chat_template: true renders the prompt here and sends it to the upstream's /v1/completions; "
                "set use_completions_api: true as well (the chat route renders on the upstream)."
            )
        if self.use_completions_api and self.is_responses_native:
            raise ValueError(
                "use_completions_api: true and is_responses_native: true exclude each other (one upstream route); "
                "unset one of them."
            )
        return self

    @property
    def base_urls(self) -> list[str]:
        return [self.base_url] if isinstance(self.base_url, str) else list(self.base_url)


def _json_response(data: Any, status_code: int = 200) -> Response:
    return Response(orjson.dumps(data), status_code=status_code, media_type="application/json")


def _error_response(exc: BaseException) -> Response:
    if isinstance(exc, NeMoGymOpenAIError):
        return _json_response(
            {"error": {"upstream_status": exc.status, "message": exc.body, "type": "upstream_error"}}, exc.status
        )
    if isinstance(exc, ChatConversionError):
        return _json_response({"error": {"message": str(exc), "type": "invalid_request_error"}}, 400)
    if isinstance(exc, TokenSourceError):  # the upstream's answer is unusable for training: a bad gateway
        return _json_response({"error": {"message": str(exc), "type": "upstream_error"}}, 502)
    if isinstance(exc, httpx.TransportError):
        where = ""
        try:
            where = f" {exc.request.url}"
        except RuntimeError:
            pass
        message = f"upstream{where} unreachable: {type(exc).__name__}: {exc}"
        return _json_response({"error": {"message": message, "type": "upstream_error"}}, 502)
    raise exc


def _json_object(text: Any, where: str) -> dict:
    if text is None or text == "":
        return {}
    if isinstance(text, dict):
        return text
    try:
        value = orjson.loads(text)
    except orjson.JSONDecodeError as exc:
        raise ChatConversionError(f"{where} must be a JSON object encoded as a string: {exc}") from None
    if not isinstance(value, dict):
        raise ChatConversionError(f"{where} must be a JSON object encoded as a string, got {text!r}")
    return value


def _ends_with_bare_assistant(messages: list[dict]) -> bool:
    """The last message is an assistant message with no tool call and no text besides reasoning."""
    if not messages:
        return False
    last = messages[-1]
    if last.get("role") != "assistant" or last.get("tool_calls"):
        return False
    content = last.get("content")
    if isinstance(content, list):
        content = "".join(p.get("text", "") for p in content if isinstance(p, dict))
    if not content:
        return True
    return not extract_think(content)[1].strip()


class _BufferedAsyncClient(httpx.AsyncClient):
    """An httpx client over the process's shared transport whose requests are read in one go: the shared aiohttp
    transport then skips its per-chunk streaming layers (the `nemo_gym_buffered` extension, as ServerClient uses).
    It never closes the shared transport (nothing here calls `aclose`) and keeps no cookies (an upstream's session
    cookie must not leak from one rollout into another)."""

    def build_request(self, *args: Any, **kwargs: Any) -> httpx.Request:
        request = super().build_request(*args, **kwargs)
        request.extensions["nemo_gym_buffered"] = True
        return request


class VLLMModel(SimpleResponsesAPIModel):
    config: VLLMModelConfig

    _clients: list[NeMoGymAsyncOpenAI] = PrivateAttr(default_factory=list)
    _clients_loop: Any = PrivateAttr(default=None)
    _session_client: "OrderedDict[str, int]" = PrivateAttr(default_factory=OrderedDict)
    _next_client: int = PrivateAttr(default=0)
    _reported: set[str] = PrivateAttr(default_factory=set)
    _chat_tokenizer: Any = PrivateAttr(default=None)
    # Upstreams (base URLs) that refused a token-id prompt: sent the rendered text from then on.
    _token_prompts_refused: set[str] = PrivateAttr(default_factory=set)

    def setup_webserver(self) -> Any:
        # A missing or unusable tokenizer fails at start-up, not on the first request.
        if self.config.use_completions_api and self.config.render_chat_template:
            _ = self.chat_tokenizer
        return super().setup_webserver()

    @property
    def chat_tokenizer(self) -> Any:
        """The tokenizer and chat template of `render_chat_template` (loaded once)."""
        if self._chat_tokenizer is None:
            cfg = self.config
            owner = f"vllm_model {cfg.name!r}: `tokenizer`"
            if not cfg.tokenizer:
                owner += " (unset, so `model` was tried)"
            self._chat_tokenizer = load_chat_tokenizer(cfg.tokenizer or cfg.model, owner)
        return self._chat_tokenizer

    async def _upstream_clients(self) -> list[NeMoGymAsyncOpenAI]:
        """One client per base_url, over the process's shared HTTP transport of the running loop (aiohttp by
        default: it sends a request's headers and body in one write, where httpcore needs two)."""
        loop = asyncio.get_running_loop()
        if self._clients_loop is not loop:
            shared = _BufferedAsyncClient(
                transport=await get_global_transport(self._global_config()),
                cookies=http.cookiejar.CookieJar(policy=http.cookiejar.DefaultCookiePolicy(allowed_domains=[])),
                timeout=DEFAULT_TIMEOUT,
                follow_redirects=False,
                trust_env=False,
            )
            self._clients = [
                NeMoGymAsyncOpenAI(
                    base_url=url, api_key=self.config.api_key, max_attempts=self.config.max_attempts, http_client=shared
                )
                for url in self.config.base_urls
            ]
            self._clients_loop = loop
        return self._clients

    def _global_config(self) -> Any:
        """The global config (for the shared transport's settings), when this server has one."""
        try:
            cfg = self.server_client.global_config_dict if self.server_client is not None else None
        except Exception:  # a ServerClient outside a server process may have no config to load
            return None
        return cfg if isinstance(cfg, (Mapping, DictConfig)) else None

    # -- routes ---------------------------------------------------------------------------------------------

    async def responses(self, request: Request, body: NeMoGymResponseCreateParamsNonStreaming = Body()) -> Response:
        params = body.model_dump(exclude_unset=True)
        session_id = _session_id(request)
        try:
            if self.config.is_responses_native:
                return _json_response(await self.create_native_response_dict(params, session_id=session_id))
            return _json_response(await self.create_response_dict(params, session_id=session_id))
        except (NeMoGymOpenAIError, ChatConversionError, TokenSourceError, httpx.TransportError) as exc:
            return _error_response(exc)

    async def chat_completions(
        self, request: Request, body: NeMoGymChatCompletionCreateParamsNonStreaming = Body()
    ) -> Response:
        params = body.model_dump(exclude_unset=True)
        try:
            return _json_response(await self.create_chat_completion_dict(params, session_id=_session_id(request)))
        except (NeMoGymOpenAIError, ChatConversionError, TokenSourceError, httpx.TransportError) as exc:
            return _error_response(exc)

    # -- streaming (`"stream": true`; serving/stream_adapter.py calls these) ----------------------------------

    async def stream_responses(
        self, body: NeMoGymResponseCreateParamsNonStreaming, request: Request
    ) -> AsyncIterator[dict]:
        """Responses events as the upstream streams: its chat chunks turned into events as they come
        (`ChatToResponses`), or with `is_responses_native` the upstream's own Responses events. The final
        `response.completed` carries the Response a non-streamed call would have returned (token data included)."""
        cfg = self.config
        if cfg.use_completions_api:
            raise BackendDoesNotStream(_COMPLETIONS_WHOLE)
        params = body.model_dump(exclude_unset=True)
        session_id = _session_id(request)
        if cfg.is_responses_native:
            try:
                native = await self._native_body(params)
            except ChatConversionError as exc:
                raise StreamRefused(_error_response(exc)) from None
            client = await self._client_for(session_id)
            async for payload in self._refusing(self._upstream_stream(client, "responses", native)):
                yield payload
            return
        try:
            chat, unmapped = responses_to_chat_params(
                params,
                training=cfg.return_token_id_information,
                replace_developer_role_with_system=cfg.replace_developer_role_with_system,
                uses_reasoning_parser=cfg.uses_reasoning_parser,
            )
        except ChatConversionError as exc:
            raise StreamRefused(_error_response(exc)) from None
        if unmapped:
            self._report_once(unmapped)
        chat["stream_options"] = {"include_usage": True}
        chunks, token_data = await self._open_chat_stream(chat, session_id, prepared=True)
        stub = build_response(params, [], model=cfg.model)
        translator = ChatToResponses(stub, split_think=True, output_logprobs=wants_output_logprobs(params))
        try:
            for _, payload in translator.start():
                yield payload
            async for chunk in chunks:
                if token_data is not None:
                    token_data.observe(chunk)
                for _, payload in translator.feed(chunk):
                    yield payload
            completion = translator.chunks.completion()
            tokens = await token_data.bundle() if token_data is not None else None
            completion = self._postprocess_completion(completion, tokens, chat.get("messages"))
            final = _carry_token_annotations(
                chat_completion_to_response(params, completion, model=cfg.model, new_id=translator.final_id),
                completion,
            )
            for _, payload in translator.finish(final):
                yield payload
        finally:
            await chunks.aclose()

    async def stream_chat_completions(
        self, body: NeMoGymChatCompletionCreateParamsNonStreaming, request: Request
    ) -> AsyncIterator[dict]:
        """The upstream's chunks as they come, with what the non-streamed route does to its answer done per chunk:
        reasoning fields folded into `<think>` content, and in training mode each chunk's generated tokens as
        `generation_token_ids` / `generation_log_probs` on its delta (from the chunk's best token source:
        `nemo_gym.api.token_sources`; the finishing chunk's delta also gets `prompt_token_ids`, `token_trajectory`
        and `routed_experts` when the upstream sent them), so the deltas add up to the non-streamed message. The
        upstream's own prompt ids are used when it streams them (vLLM does on its first chunk); else the
        upstream's /tokenize is asked when the finishing chunk arrives."""
        cfg = self.config
        if cfg.use_completions_api:
            raise BackendDoesNotStream(_COMPLETIONS_WHOLE)
        raw = body.model_dump(exclude_unset=True)
        chunks, token_data = await self._open_chat_stream(raw, _session_id(request))
        thinking: set[int] = set()  # choices inside a folded <think> block
        try:
            async for chunk in chunks:
                if token_data is not None:
                    token_data.observe(chunk)
                for choice in chunk.get("choices") or ():
                    delta = choice.get("delta")
                    if not isinstance(delta, dict):
                        continue
                    index = choice.get("index", 0)
                    reasoning = delta.pop("reasoning_content", None) or delta.pop("reasoning", None)
                    delta.pop("reasoning", None)
                    if reasoning:
                        if not cfg.uses_reasoning_parser:
                            self._report_once(
                                ["upstream reasoning fields"],
                                "{name}: the upstream returned reasoning_content/reasoning although "
                                "uses_reasoning_parser is false; it was kept as <think> text. Set "
                                "uses_reasoning_parser: true for this upstream.",
                            )
                        opening = "" if index in thinking else "<think>"
                        thinking.add(index)
                        delta["content"] = opening + reasoning + (delta.get("content") or "")
                    elif index in thinking and (delta.get("content") or delta.get("tool_calls")
                                                or choice.get("finish_reason")):
                        thinking.discard(index)
                        delta["content"] = "</think>" + (delta.get("content") or "")
                    if token_data is not None:
                        generated = token_data.chunk_generation()
                        choice.pop("logprobs", None)
                        if generated is not None:
                            delta["generation_token_ids"], delta["generation_log_probs"] = generated
                        if choice.get("finish_reason") is not None:
                            tokens = await token_data.bundle()
                            delta["prompt_token_ids"] = tokens.prompt_token_ids
                            delta.update(_chat_route_annotations(raw.get("messages")))
                            if tokens.routed_experts is not None:
                                delta["routed_experts"] = tokens.routed_experts
                yield chunk
        finally:
            await chunks.aclose()

    async def _open_chat_stream(
        self, body: dict, session_id: Optional[str], prepared: bool = False
    ) -> tuple[AsyncIterator[dict], Optional["_ChatTokenData"]]:
        """The upstream's chunks for chat params `body` (prepared as for a non-streamed call) and, in training
        mode, the `_ChatTokenData` that the caller shows every chunk, once the upstream has started to answer;
        errors before that raise `StreamRefused` with the answer the non-streamed route would give (a
        context-length error streams the same empty completion)."""
        try:
            body, early = self._prepare_chat_body(body, prepared)
        except ChatConversionError as exc:
            raise StreamRefused(_error_response(exc)) from None
        if early is not None:
            return _chunks_of(early), None
        client = await self._client_for(session_id)
        token_data = (_ChatTokenData(self, client, body, streamed=True)
                      if self.config.return_token_id_information else None)
        chunks = self._upstream_stream(client, "chat/completions", body)
        try:
            first = await chunks.__anext__()
        except StopAsyncIteration:
            first = None
        except NeMoGymOpenAIError as exc:
            if is_context_length_error(exc.status, exc.body):
                return _chunks_of(empty_chat_completion(self.config.model, "length")), None
            raise StreamRefused(_error_response(exc)) from None
        except (ChatConversionError, httpx.TransportError) as exc:
            raise StreamRefused(_error_response(exc)) from None
        if first is None:
            return _chunks_of(empty_chat_completion(self.config.model, "stop")), token_data
        return _prepend(first, chunks), token_data

    def _upstream_stream(self, client: NeMoGymAsyncOpenAI, route: str, body: dict) -> AsyncIterator[dict]:
        """The payloads of the upstream's streamed answer on `route` (with `stream: true`)."""
        return _payloads(upstream_sse(
            f"{client.base_url}/{route}", {**body, "stream": True}, api_key=self.config.api_key,
            retry_policy=client.retry_policy, global_config=self._global_config(),
        ))

    async def _refusing(self, payloads: AsyncIterator[dict]) -> AsyncIterator[dict]:
        """`payloads`, an upstream error before the first one raised as `StreamRefused`."""
        try:
            try:
                first = await payloads.__anext__()
            except StopAsyncIteration:
                return
            except (NeMoGymOpenAIError, httpx.TransportError) as exc:
                raise StreamRefused(_error_response(exc)) from None
            yield first
            async for payload in payloads:
                yield payload
        finally:
            await payloads.aclose()

    # -- the work, on plain dicts (subclasses and in-process callers use these) -------------------------------

    async def create_response_dict(self, params: dict, *, session_id: Optional[str] = None) -> dict:
        """Responses create params (the keys the caller set) -> Response dict, through the chat path."""
        cfg = self.config
        chat, unmapped = responses_to_chat_params(
            params,
            training=cfg.return_token_id_information,
            replace_developer_role_with_system=cfg.replace_developer_role_with_system,
            uses_reasoning_parser=cfg.uses_reasoning_parser,
        )
        if unmapped:
            self._report_once(unmapped)
        completion = await self.create_chat_completion_dict(chat, session_id=session_id, prepared=True)
        return _carry_token_annotations(chat_completion_to_response(params, completion, model=cfg.model), completion)

    async def create_chat_completion_dict(
        self, body: dict, *, session_id: Optional[str] = None, prepared: bool = False
    ) -> dict:
        """Chat Completions params -> chat completion dict from the upstream (post-processed).

        ``prepared``: the messages already had the developer-role and reasoning-parser adjustments (the Responses
        path does them while converting)."""
        if self.config.use_completions_api:
            return await self._completion_as_chat_dict(body, session_id=session_id, prepared=prepared)
        body, early = self._prepare_chat_body(body, prepared)
        if early is not None:
            return early
        client = await self._client_for(session_id)
        try:
            completion = await client.create_chat_completion(**body)
        except NeMoGymOpenAIError as exc:
            if is_context_length_error(exc.status, exc.body):
                return empty_chat_completion(self.config.model, "length")
            raise
        tokens = None
        if self.config.return_token_id_information:
            token_data = _ChatTokenData(self, client, body)
            token_data.observe(completion)
            tokens = await token_data.bundle()
        return self._postprocess_completion(completion, tokens, body.get("messages"))

    def _prepare_chat_body(self, body: dict, prepared: bool) -> tuple[dict, Optional[dict]]:
        """The upstream's chat request for `body`, or (when the call must not reach the upstream) the completion
        to answer with instead."""
        cfg = self.config
        body = dict(body)
        if not prepared and (cfg.replace_developer_role_with_system or cfg.uses_reasoning_parser):
            body["messages"] = prepare_chat_messages(
                body.get("messages") or [],
                replace_developer_role_with_system=cfg.replace_developer_role_with_system,
                uses_reasoning_parser=cfg.uses_reasoning_parser,
            )
        body["model"] = cfg.model
        body, extra_body = self._apply_overrides(body)
        if cfg.return_token_id_information:
            if body.get("n") not in (None, 1):
                raise ChatConversionError(
                    f"{cfg.name}: training mode (return_token_id_information: true) reads the token data of exactly "
                    f"one choice per call; this request asks n={body['n']!r}. Send n=1 (or leave n out) and make "
                    f"several calls for several samples."
                )
            body["logprobs"] = True
            body["return_tokens_as_token_ids"] = True
            # vLLM >= 0.10.2 then answers with the prompt's ids (no /tokenize needed); others ignore the key.
            body["return_token_ids"] = True
        if "top_logprobs" in body and body["top_logprobs"] is None:
            # vLLM reads an explicit null as "no logprobs at all".
            del body["top_logprobs"]
        if extra_body:
            body = {**extra_body, **body}

        if not cfg.sequential_reasoning_allowed and _ends_with_bare_assistant(body.get("messages") or []):
            # The previous step produced only reasoning and this model may not reason twice in a row.
            return body, empty_chat_completion(cfg.model, "content_filter")
        return body, None

    async def _tokenized_prompt(self, client: NeMoGymAsyncOpenAI, body: dict) -> list:
        """Training mode, for an answer without the engine's prompt ids: the upstream's /tokenize of the prompt."""
        try:
            answer = await client.create_tokenize(**{k: body[k] for k in _TOKENIZE_KEYS if k in body})
        except NeMoGymOpenAIError as exc:
            raise RuntimeError(
                f"{self.config.name}: training mode (return_token_id_information: true) needs the prompt's token "
                f"ids; the upstream's answer had no prompt_token_ids (vLLM >= 0.10.2 returns them when asked with "
                f"return_token_ids) and its POST /tokenize (a vLLM route) answered HTTP {exc.status}: "
                f"{exc.body[:500]}"
            ) from None
        tokens = answer.get("tokens") if isinstance(answer, dict) else None
        if not isinstance(tokens, list):
            raise ValueError(f"The upstream's /tokenize returned no token list (got {tokens!r}).")
        return tokens

    def _postprocess_completion(
        self, completion: dict, tokens: Optional[TokenBundle], messages: Optional[list] = None
    ) -> dict:
        """The upstream's completion as this server answers it: reasoning fields folded into `<think>` content,
        training token data (`tokens`, already taken off the upstream's answer) on the message, with
        `token_trajectory` (the chat route re-tokenizes every prompt, so a call with an earlier assistant turn in
        its prompt is `retokenized`)."""
        cfg = self.config
        for choice in completion.get("choices") or ():
            message = choice.get("message")
            if not isinstance(message, dict):
                continue
            message, folded = fold_reasoning_into_content(message)
            if folded and not cfg.uses_reasoning_parser:
                self._report_once(
                    ["upstream reasoning fields"],
                    "{name}: the upstream returned reasoning_content/reasoning although uses_reasoning_parser is "
                    "false; it was kept as <think> text. Set uses_reasoning_parser: true for this upstream.",
                )
            if tokens is not None:
                message["prompt_token_ids"] = tokens.prompt_token_ids
                message["generation_token_ids"] = tokens.generation_token_ids
                message["generation_log_probs"] = tokens.generation_log_probs
                message.update(_chat_route_annotations(messages))
                if tokens.routed_experts is not None:
                    message["routed_experts"] = tokens.routed_experts
                choice.pop("logprobs", None)
            choice["message"] = message
        return completion

    # -- /v1/completions (use_completions_api; token-in/token-out with render_chat_template) -------------------

    async def _completion_as_chat_dict(
        self, body: dict, *, session_id: Optional[str] = None, prepared: bool = False
    ) -> dict:
        """Chat Completions params -> a chat completion dict, generated by the upstream's `/v1/completions`.

        With `render_chat_template` the chat template is rendered here and the prompt sent as token ids built by
        `token_continuation` (the previous call's prompt + generated ids + only what came after); tool calls are
        parsed from the generated text (Hermes `<tool_call>` blocks). Without it (raw mode) the prompt is the text
        of a `[user]` or `[system, user]` conversation. In training mode the message carries the token data and
        `token_trajectory`."""
        cfg = self.config
        user_logprobs = bool(body.get("logprobs"))
        body, early = self._prepare_chat_body(body, prepared)
        if early is not None:
            return early
        messages = body.get("messages") or []
        tools = body.get("tools") or None
        prompt: Optional[PromptIds] = None
        bound = plain = None
        try:
            if cfg.render_chat_template:
                plain, template_tools = template_messages(messages, self.chat_tokenizer, tools)
                bound = bind(
                    self.chat_tokenizer, tools=template_tools, template_kwargs=body.get("chat_template_kwargs")
                )
                prompt = _token_prompt(bound, plain)
                upstream_prompt: Any = prompt.ids
            else:
                upstream_prompt = _raw_prompt(messages, tools)
        except ValueError as exc:  # content the template cannot take, a template error (raise_exception)
            raise ChatConversionError(f"{cfg.name}: cannot render the chat template: {exc}") from None
        request = _completions_request(body, upstream_prompt, cfg.return_token_id_information)
        client = await self._client_for(session_id)
        if isinstance(upstream_prompt, list) and client.base_url in self._token_prompts_refused:
            request["prompt"] = bound.render(plain, True)
            prompt = PromptIds(full_prompt_ids(bound, plain), RETOKENIZED, _refused_reason(client.base_url, None))
        try:
            completion = await client.create_completion(**request)
        except NeMoGymOpenAIError as exc:
            if is_context_length_error(exc.status, exc.body):
                return empty_chat_completion(cfg.model, "length")
            if not (isinstance(request["prompt"], list) and exc.status in (400, 422)):
                raise
            # Maybe an upstream that takes no token-id prompt: the rendered text instead (an error again is
            # the request's own and is raised).
            request["prompt"] = bound.render(plain, True)
            try:
                completion = await client.create_completion(**request)
            except NeMoGymOpenAIError as again:
                if is_context_length_error(again.status, again.body):
                    return empty_chat_completion(cfg.model, "length")
                raise
            self._token_prompts_refused.add(client.base_url)
            LOG.warning(
                "%s: the upstream %s refused a token-id prompt (HTTP %s: %s) and took the rendered text; prompts "
                "to it are sent as text and re-tokenized from now on (token_trajectory: retokenized).",
                cfg.name, client.base_url, exc.status, exc.body[:300],
            )
            prompt = PromptIds(full_prompt_ids(bound, plain), RETOKENIZED, _refused_reason(client.base_url, exc))
        if cfg.return_token_id_information and prompt is None:  # raw mode without the engine's prompt ids
            prompt = await self._raw_prompt_ids(client, completion, request["prompt"])
        return self._completion_to_chat(completion, prompt, bool(tools), user_logprobs)

    async def _raw_prompt_ids(self, client: NeMoGymAsyncOpenAI, completion: dict, text: str) -> Optional[PromptIds]:
        choice = (completion.get("choices") or [{}])[0]
        if isinstance(choice.get("prompt_token_ids"), list):
            return None  # the engine's own ids are used
        try:
            tokens = (await client.create_tokenize(model=self.config.model, prompt=text)).get("tokens")
        except NeMoGymOpenAIError as exc:
            raise RuntimeError(
                f"{self.config.name}: training mode with use_completions_api needs the prompt's token ids; the "
                f"upstream returned none (vLLM >= 0.10.2 does with return_token_ids) and its POST /tokenize answered "
                f"HTTP {exc.status}: {exc.body[:300]}"
            ) from None
        return PromptIds(list(tokens or []), EXACT)

    def _completion_to_chat(
        self, completion: dict, prompt: Optional[PromptIds], parse_tools: bool, user_logprobs: bool
    ) -> dict:
        """An upstream text completion as the chat completion this server answers: Hermes tool calls parsed out of
        the text (when tools were offered), token data and `token_trajectory` on the message in training mode."""
        cfg = self.config
        choice = (completion.get("choices") or [{}])[0]
        text = choice.get("text") or ""
        calls: list[tuple[str, str]] = []
        if parse_tools:
            text, calls = parse_hermes_tool_calls(text)
        message: dict[str, Any] = {"role": "assistant", "content": text if (text or not calls) else None}
        if calls:
            message["tool_calls"] = [
                {"id": new_item_id("call"), "type": "function", "function": {"name": name, "arguments": arguments}}
                for name, arguments in calls
            ]
        finish = choice.get("finish_reason") or "stop"
        if calls and finish == "stop":
            finish = "tool_calls"
        logprobs = _chat_logprobs(choice.get("logprobs"))
        if cfg.return_token_id_information:
            ids, log_probs = generation_tokens_from_logprobs(logprobs)  # raises when the upstream sent none
            engine_ids = choice.get("token_ids")
            if isinstance(engine_ids, list):
                if len(engine_ids) != len(log_probs):
                    raise RuntimeError(
                        f"{cfg.name}: the upstream returned {len(engine_ids)} token_ids but {len(log_probs)} logprobs "
                        f"for one completion; training mode needs one log prob per generated token."
                    )
                ids = engine_ids
            engine_prompt = choice.get("prompt_token_ids", completion.get("prompt_token_ids"))
            if prompt is None:
                prompt = PromptIds(list(engine_prompt), EXACT)
            elif isinstance(engine_prompt, list) and engine_prompt != prompt.ids:
                # The engine read other ids than the ones sent (or tokenized the text differently): report its own.
                reason = prompt.reason or "caller: the upstream reports prompt_token_ids other than the ones sent"
                prompt = PromptIds(list(engine_prompt), RETOKENIZED, reason)
            message["prompt_token_ids"] = prompt.ids
            message["generation_token_ids"] = ids
            message["generation_log_probs"] = log_probs
            message.update(prompt.annotations())
            routed = choice.get("routed_experts", completion.get("routed_experts"))
            if routed is not None:
                message["routed_experts"] = routed
        out_choice: dict[str, Any] = {"index": 0, "message": message, "finish_reason": finish}
        if user_logprobs:
            out_choice["logprobs"] = logprobs
        return {
            "id": completion.get("id") or new_item_id("chatcmpl"),
            "object": "chat.completion",
            "created": completion.get("created") or 0,
            "model": cfg.model,
            "choices": [out_choice],
            "usage": completion.get("usage"),
        }

    async def create_native_response_dict(self, params: dict, *, session_id: Optional[str] = None) -> dict:
        """`is_responses_native`: forward to the upstream's /responses (model, developer role, overrides applied)."""
        body = await self._native_body(params)
        return await (await self._client_for(session_id)).create_response(**body)

    async def _native_body(self, params: dict) -> dict:
        """The upstream /responses request for `params` (`is_responses_native`)."""
        cfg = self.config
        body = dict(params)
        body["model"] = cfg.model
        if cfg.replace_developer_role_with_system and isinstance(body.get("input"), list):
            body["input"] = [
                {**item, "role": "system"} if isinstance(item, dict) and item.get("role") == "developer" else item
                for item in body["input"]
            ]
        body, extra_body = self._apply_overrides(body)
        if extra_body:
            body = {**extra_body, **body}
        return body

    # -- helpers --------------------------------------------------------------------------------------------

    def _apply_overrides(self, body: dict) -> tuple[dict, dict]:
        """`chat_template_kwargs` (config, updated by `metadata.chat_template_kwargs`) set on the body, and the
        extra body (config, updated by `metadata.extra_body`) to merge under it. The two metadata keys are not
        forwarded."""
        cfg = self.config
        chat_template_kwargs = dict(cfg.chat_template_kwargs or {})
        extra_body = dict(cfg.extra_body or {})
        metadata = body.get("metadata")
        if isinstance(metadata, dict) and any(key in metadata for key in _METADATA_OVERRIDES):
            metadata = dict(metadata)
            chat_template_kwargs.update(
                _json_object(metadata.pop("chat_template_kwargs", None), "metadata.chat_template_kwargs")
            )
            extra_body.update(_json_object(metadata.pop("extra_body", None), "metadata.extra_body"))
            if metadata:
                body["metadata"] = metadata
            else:
                del body["metadata"]
        if chat_template_kwargs:
            body["chat_template_kwargs"] = chat_template_kwargs
        return body, extra_body

    async def _client_for(self, session_id: Optional[str]) -> NeMoGymAsyncOpenAI:
        """Sticky per session; new sessions (and calls without one) go round robin."""
        clients = self._clients if self._clients_loop is asyncio.get_running_loop() else await self._upstream_clients()
        if len(clients) == 1:
            return clients[0]
        if session_id is None:
            index = self._next_client
            self._next_client = (index + 1) % len(clients)
            return clients[index]
        sessions = self._session_client
        index = sessions.get(session_id)
        if index is None:
            index = self._next_client
            self._next_client = (index + 1) % len(clients)
            sessions[session_id] = index
            if len(sessions) > MAX_STICKY_SESSIONS:
                sessions.popitem(last=False)
        else:
            sessions.move_to_end(session_id)
        return clients[index]

    def _report_once(self, names: list[str], template: Optional[str] = None) -> None:
        for name in names:
            if name in self._reported:
                continue
            self._reported.add(name)
            if template is not None:
                LOG.warning(template.format(name=self.config.name))
            else:
                LOG.warning(
                    "%s: the Responses field %r has no Chat Completions equivalent and is ignored "
                    "(reported once per field).",
                    self.config.name,
                    name,
                )


_COMPLETIONS_WHOLE = (
    "use_completions_api: the upstream's /v1/completions is called without streaming (token data and tool calls "
    "are read from the whole answer)"
)
# Chat-only keys of a prepared chat body, not sent to /v1/completions (everything else goes, extra_body included).
_CHAT_ONLY_KEYS = frozenset(
    {"messages", "tools", "tool_choice", "parallel_tool_calls", "chat_template", "chat_template_kwargs",
     "add_generation_prompt", "continue_final_message", "documents", "mm_processor_kwargs", "logprobs",
     "top_logprobs", "return_tokens_as_token_ids", "reasoning_effort", "metadata", "store", "service_tier",
     "stream", "stream_options", "max_completion_tokens", "max_tokens", "response_format", "n"}
)


def _completions_request(body: dict, prompt: Any, training: bool) -> dict:
    """The upstream /v1/completions request for a prepared chat `body` and its `prompt` (token ids or text)."""
    request = {k: v for k, v in body.items() if k not in _CHAT_ONLY_KEYS}
    request["prompt"] = prompt
    max_tokens = body.get("max_completion_tokens", body.get("max_tokens"))
    # Unset: null, i.e. up to the context window (vLLM's completions route would otherwise stop at 16 tokens).
    request["max_tokens"] = max_tokens
    if body.get("response_format") is not None:
        request["response_format"] = body["response_format"]
    top = body.get("top_logprobs")
    if training or body.get("logprobs"):
        request["logprobs"] = int(top) if isinstance(top, int) else 0  # 0: the sampled token's log prob only
    if training:
        request["return_tokens_as_token_ids"] = True
        request["return_token_ids"] = True
    return request


def _token_prompt(tokenizer: Any, messages: list[dict]) -> PromptIds:
    """`continuation_prompt_ids` on `messages`, the previous call's assistant message reduced to its content (the
    sentinel that stands for its generated ids): a template that renders `tool_calls` / `reasoning_content` after
    the content would otherwise write that call's tool calls a second time after its ids. A re-tokenized prompt
    is rendered from the messages as they are."""
    prev = previous_call(messages)
    if prev is None:
        return continuation_prompt_ids(tokenizer, messages)
    reduced = list(messages)
    reduced[prev.message_index] = {
        k: v for k, v in messages[prev.message_index].items()
        if k not in ("tool_calls", "reasoning_content", "reasoning")
    }
    prompt = continuation_prompt_ids(tokenizer, reduced)
    if prompt.mode != EXACT:
        return PromptIds(full_prompt_ids(tokenizer, messages), prompt.mode, prompt.reason)
    return prompt


def _raw_prompt(messages: list[dict], tools: Any) -> str:
    """use_completions_api without render_chat_template: the text of `[user]` or `[system, user]`, blank-line
    joined (as NeMo Gym v0.5)."""
    roles = [m.get("role") for m in messages]
    if tools or roles not in (["user"], ["system", "user"]):
        raise ChatConversionError(
            f"use_completions_api without render_chat_template sends the text of a [user] or [system, user] "
            f"conversation without tools; this request has roles {roles}{' and tools' if tools else ''}. Set "
            f"render_chat_template: true (and tokenizer) to render any conversation with the chat template."
        )
    texts = []
    for index, message in enumerate(messages):
        content = message.get("content")
        if isinstance(content, list):
            if any(not (isinstance(p, dict) and isinstance(p.get("text"), str)) for p in content):
                raise ChatConversionError(f"messages[{index}]: only text content can be sent as a completions prompt")
            content = "".join(p["text"] for p in content)
        texts.append(content or "")
    return "\n\n".join(texts)


def _refused_reason(base_url: str, exc: Optional[NeMoGymOpenAIError]) -> str:
    said = f" (HTTP {exc.status}: {exc.body[:200]})" if exc is not None else ""
    return (
        f"caller: the upstream {base_url} refused a token-id prompt{said}; the rendered text was sent and "
        f"tokenized again"
    )


def _chat_logprobs(logprobs: Any) -> Optional[dict]:
    """A completions choice's logprobs (`tokens`, `token_logprobs`, `top_logprobs`) in the chat form
    (`{"content": [{"token", "logprob", "top_logprobs"}]}`)."""
    if not isinstance(logprobs, dict):
        return None
    if isinstance(logprobs.get("content"), list):
        return logprobs
    tokens, values = logprobs.get("tokens"), logprobs.get("token_logprobs")
    if not isinstance(tokens, list) or not isinstance(values, list):
        return None
    tops = logprobs.get("top_logprobs") or [None] * len(tokens)
    content = []
    for token, value, top in zip(tokens, values, tops):
        content.append({
            "token": token,
            "logprob": value,
            "bytes": None,
            "top_logprobs": [{"token": t, "logprob": lp, "bytes": None} for t, lp in (top or {}).items()],
        })
    return {"content": content}


def _chat_route_annotations(messages: Optional[list]) -> dict:
    """`token_trajectory` of a chat-route call: its prompt ids come from the upstream's /tokenize of the whole
    conversation, so with an earlier assistant turn in it the prompt is re-tokenized."""
    if not any(isinstance(m, dict) and m.get("role") == "assistant" for m in messages or ()):
        return {TOKEN_TRAJECTORY_KEY: EXACT}
    return {
        TOKEN_TRAJECTORY_KEY: RETOKENIZED,
        TOKEN_TRAJECTORY_REASON_KEY: "caller: the chat route re-renders and re-tokenizes the whole conversation "
        "(POST /tokenize); use_completions_api + render_chat_template build it token-in/token-out",
    }


_CARRIED = (TOKEN_TRAJECTORY_KEY, TOKEN_TRAJECTORY_REASON_KEY, "routed_experts")


def _carry_token_annotations(response: dict, completion: dict) -> dict:
    """The message's `token_trajectory` (+ reason) and `routed_experts` onto the Response's last output item,
    next to the token ids the conversion put there."""
    choices = completion.get("choices") or ()
    message = choices[0].get("message") if choices and isinstance(choices[0], dict) else None
    output = response.get("output") or []
    if isinstance(message, dict) and output and "prompt_token_ids" in output[-1]:
        for key in _CARRIED:
            if message.get(key) is not None:
                output[-1][key] = message[key]
    return response


class _ChatTokenData:
    """Training mode on the chat route: the token data of the upstream's answer (a whole completion, or each streamed
    chunk in turn, `observe`), read in NeMo Gym v0.5's order by `nemo_gym.api.token_sources.TokenSources`; the
    prompt's ids from the upstream's POST /tokenize only when the answer carries none (asked then, once)."""

    def __init__(self, model: "VLLMModel", client: NeMoGymAsyncOpenAI, body: dict, *, streamed: bool = False) -> None:
        self._model, self._client, self._body = model, client, body
        self._sources = TokenSources(model.config.name, streamed=streamed)
        self._bundle: Optional[TokenBundle] = None

    def observe(self, payload: dict) -> None:
        """Take the token data off `payload` (an upstream completion or chunk); the caller puts it on the message
        itself, so the upstream's copies are not sent to the client a second time."""
        self._sources.take(payload)

    def chunk_generation(self) -> Optional[tuple[list, list]]:
        return self._sources.chunk_generation()

    async def bundle(self) -> TokenBundle:
        if self._bundle is None:
            tokens = self._sources.resolve()
            if tokens.prompt_token_ids is None:
                tokens.prompt_token_ids = await self._model._tokenized_prompt(self._client, self._body)
            self._bundle = tokens
        return self._bundle


async def _chunks_of(completion: dict) -> AsyncIterator[dict]:
    """A whole chat completion as chunks (a call answered without the upstream)."""
    for _, chunk in chat_completion_chunks(completion, include_usage=True):
        if chunk is not DONE:
            yield chunk


async def _prepend(first: dict, rest: AsyncIterator[dict]) -> AsyncIterator[dict]:
    try:
        yield first
        async for chunk in rest:
            yield chunk
    finally:
        await rest.aclose()


async def _payloads(events: AsyncIterator[tuple]) -> AsyncIterator[dict]:
    """The JSON payloads of an upstream's server-sent events, up to `[DONE]`."""
    try:
        async for _, payload in events:
            if payload is DONE:
                break
            if isinstance(payload, dict) and "error" in payload and "type" not in payload and "choices" not in payload:
                error = payload["error"]
                message = error.get("message") if isinstance(error, dict) else error
                raise RuntimeError(f"the upstream's stream failed: {message}")
            if isinstance(payload, dict):
                yield payload
    finally:
        await events.aclose()


def _session_id(request: Request) -> Optional[str]:
    session = request.scope.get("session")
    return session.get(SESSION_ID_KEY) if isinstance(session, dict) else None


if __name__ == "__main__":
    VLLMModel.run_webserver()
