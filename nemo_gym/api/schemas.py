"""Responses API and Chat Completions schemas: the ``NeMoGym*`` models.

Environment code imports these names from ``nemo_gym.openai_utils`` (which re-exports this module) exactly as it did with NeMo Gym v0.2.
What they describe:

* Responses API items that can appear in a request's ``input`` and in a response's ``output``
  (``NeMoGymResponseInputItem`` and ``NeMoGymResponseOutputItem`` are the same union), their ``...ForTraining``
  variants carrying token ids and log-probs for RL training, and ``RESPONSES_TO_TRAIN`` mapping one to the other.
* ``NeMoGymResponseCreateParamsNonStreaming``: the strict request body (unknown keys are errors), and
  ``NeMoGymResponse``: a response whose ``output`` holds the item union and whose unknown keys pass through.
* The Chat Completions side used by model servers that talk to Chat-only backends (vLLM and friends).

Performance notes (the reference spent most of its CPU re-validating whole responses at every hop):

* The models are lean. Only what the framework reads is modelled; configuration echoes that nothing inspects
  (``reasoning``, ``text``, ``prompt``, annotations, log-probs, ...) are plain dicts/lists, which validate at
  near zero cost and dump back unchanged.
* Unions are discriminated by a small Python function looking at ``type`` / ``role`` (and at
  ``prompt_token_ids`` for training variants), so each item is validated against exactly one model instead of
  trying every union member.
* Item lists serialize "as any": every item dumps with its own runtime class, so subclasses (training variants,
  environment-specific item subclasses) keep all their fields without a second discriminator pass.
* OpenAI SDK objects are accepted where v0.2's SDK-based models took them (items, tools, usage, a whole
  ``Response``): models read them with ``from_attributes``, which costs nothing for dict input, and the few
  plain-dict fields of a response (``reasoning``, ``text``, ``prompt``, ``error``, a dict ``tool_choice``) and
  the request's ``tools`` list pass through one small function that turns an SDK object into its dict.
* Token arrays (``prompt_token_ids``, ``generation_token_ids``, ``generation_log_probs``: megabytes per training
  rollout) are checked once and then passed by reference: lists given from Python are kept as they are after one
  C-level pass over them, and the dumps of requests and responses share them instead of copying (``TokenIds``,
  ``ShareTokenArraysOnDump``; design decision 34). Item lists are turned into Python objects once when validated
  from JSON (``_items``), not once per union function and again for validation.
* Prefer ``Model.model_validate(dict)`` on parsed JSON. Passing already-validated model instances into another
  model does not re-validate them (pydantic's ``revalidate_instances="never"``), so build responses from
  instances or dicts, never from ``model_dump()`` of something you just validated. Nothing here deep-copies.

Differences from the reference that are deliberate (see docs): ``seed`` is accepted by the Responses create
params (it is left out of dumps while unset, so rows look like the reference's), a reasoning item's ``status``
is accepted on input but never dumped (OpenAI rejects it when the item is sent back).
"""

import math
from typing import Any, ClassVar, Literal, Mapping, Optional, Union

from openai.types.responses.response_reasoning_item import Summary as _SDKSummary
from pydantic import BaseModel, BeforeValidator, ConfigDict, Discriminator, Field, SerializeAsAny, Tag, with_config
from pydantic_core import core_schema
from typing_extensions import Annotated, Required, TypedDict

__all__ = [
    # content parts (Responses)
    "NeMoGymResponseInputText",
    "NeMoGymResponseInputImage",
    "NeMoGymResponseInputFile",
    "NeMoGymResponseOutputTextParam",
    "NeMoGymResponseOutputRefusalParam",
    "NeMoGymResponseInputContent",
    "NeMoGymResponseInputMessageContentList",
    # items
    "RoutedExperts",
    "TokenIDLogProbMixin",
    "NeMoGymEasyInputMessage",
    "NeMoGymMessage",
    "NeMoGymResponseOutputText",
    "NeMoGymResponseOutputRefusal",
    "NeMoGymResponseOutputMessage",
    "NeMoGymResponseFunctionToolCall",
    "NeMoGymFunctionCallOutput",
    "NeMoGymSummary",
    "NeMoGymResponseReasoningItem",
    "NeMoGymResponseMcpCall",
    "NeMoGymResponseMcpListTools",
    "NeMoGymResponseMcpApprovalRequest",
    "NeMoGymEasyInputMessageForTraining",
    "NeMoGymMessageForTraining",
    "NeMoGymResponseOutputMessageForTraining",
    "NeMoGymResponseFunctionToolCallForTraining",
    "NeMoGymResponseReasoningItemForTraining",
    "RESPONSES_TO_TRAIN",
    "NeMoGymResponseInputItem",
    "NeMoGymResponseOutputItem",
    "NeMoGymResponseInput",
    # Responses request / response
    "NeMoGymFunctionToolParam",
    "NeMoGymToolParam",
    "NeMoGymResponseCreateParamsNonStreaming",
    "NeMoGymFunctionTool",
    "NeMoGymIncompleteDetails",
    "NeMoGymResponseInputTokensDetails",
    "NeMoGymResponseOutputTokensDetails",
    "NeMoGymResponseUsage",
    "NeMoGymResponse",
    # Chat Completions
    "NeMoGymChatCompletionContentPartTextParam",
    "NeMoGymChatCompletionContentPartImageParam",
    "NeMoGymChatCompletionContentPartInputAudioParam",
    "NeMoGymChatCompletionContentPartFileParam",
    "NeMoGymChatCompletionContentPartRefusalParam",
    "NeMoGymChatCompletionContentPartParam",
    "NeMoGymChatCompletionMessageToolCallFunctionParam",
    "NeMoGymChatCompletionMessageToolCallParam",
    "NeMoGymChatCompletionSystemMessageParam",
    "NeMoGymChatCompletionDeveloperMessageParam",
    "NeMoGymChatCompletionUserMessageParam",
    "NeMoGymChatCompletionAssistantMessageParam",
    "NeMoGymChatCompletionAssistantMessageForTrainingParam",
    "NeMoGymChatCompletionToolMessageParam",
    "NeMoGymChatCompletionMessageParam",
    "NeMoGymFunctionDefinition",
    "NeMoGymChatCompletionToolParam",
    "NeMoGymChatCompletionCreateParamsNonStreaming",
    "NeMoGymFunction",
    "NeMoGymChatCompletionMessageToolCall",
    "NeMoGymChatCompletionMessage",
    "NeMoGymChatCompletionMessageForTraining",
    "NeMoGymChoice",
    "NeMoGymCompletionUsage",
    "NeMoGymChatCompletion",
]


def _is_none(value: Any) -> bool:
    return value is None


def _list(item: Any) -> Any:
    """`list[item]` that stops at its first bad item. pydantic otherwise reports every bad item, and a request's
    lists are as long as its sender likes: a 2 MB body of a million bad items took 4.7 s of a server's event loop to
    refuse (a 32 MiB one over a minute), and its 422 listed a million errors."""
    return Annotated[list[item], Field(fail_fast=True)]


def _parsed_once(value: Any) -> Any:
    return value


def _items(item: Any) -> Any:
    """`_list(item)` for lists of Responses items or chat messages, whose union is told apart by a Python function
    (``type`` / ``role`` / token fields): from JSON, pydantic would turn each item into Python objects to call that
    function and then validate the JSON again, so a 64k-token item was built twice (plus once more for ``input``'s
    own str-or-list function). The list is turned into Python objects once (a no-op ``BeforeValidator``) and
    validated from them; what is accepted and every error are as before (FastAPI's 422 path validates Python
    input anyway)."""
    return Annotated[list[item], Field(fail_fast=True), BeforeValidator(_parsed_once)]


# ------------------------------------------------------------------------------------------ token arrays
# A training-mode rollout carries, on the last item of each model call, its prompt ids, generated ids and log probs:
# at 64k generated tokens 3-4 MB of JSON per rollout, through every hop. They are checked once and then passed on by
# reference (design decision 34):
# * from JSON, pydantic-core checks them while parsing (`list[int]` / `list[float]`, stopping at the first bad
#   element);
# * from Python (a body parsed once as above, the verify idiom `Response(**body.model_dump(), reward=...)`, items
#   built by environment code), a plain list is kept as it is, the same object, when one C-level pass over it
#   (`sum`) shows every element is an int (for log probs: a finite real number); anything else (strings, None,
#   floats among ids, NaN, a tuple, a numpy array) goes through pydantic's own list check, which converts or
#   answers a 422 naming the first bad element (`...generation_token_ids.17`);
# * the dumps of the models that carry items share the lists instead of copying them element by element
#   (`ShareTokenArraysOnDump.model_dump`), and JSON is written once, by pydantic-core.
# Environment code sees plain `list[int]` / `list[float]`, as v0.5 types them.


def _ints_as_given(value: Any, check: Any) -> Any:
    if type(value) is list:
        try:
            if type(sum(value)) is int:  # every element an int (bools count, as pydantic's lax mode has it)
                return value
        except TypeError:
            pass
    return check(value)


def _reals_as_given(value: Any, check: Any) -> Any:
    if type(value) is list:
        try:
            if math.isfinite(sum(value, 0.0)):  # every element an int or a float, none NaN or infinite
                return value
        except (TypeError, OverflowError):
            pass
    return check(value)


class _TokenArray:
    """`list[int]` / `list[float]` checked once and kept by reference (see above)."""

    def __init__(self, element: type):
        self.element = element

    def __get_pydantic_core_schema__(self, source: Any, handler: Any) -> core_schema.CoreSchema:
        checked = handler(list[self.element])
        checked["fail_fast"] = True
        as_given = _ints_as_given if self.element is int else _reals_as_given
        return core_schema.json_or_python_schema(
            json_schema=checked,
            python_schema=core_schema.no_info_wrap_validator_function(as_given, checked),
            serialization=checked.get("serialization"),
        )


TokenIds = Annotated[list[int], _TokenArray(int)]
TokenLogProbs = Annotated[list[float], _TokenArray(float)]


def _sdk_to_dict(value: Any) -> Any:
    """An OpenAI SDK object (any pydantic model) as the plain dict it stands for; anything else unchanged."""
    if isinstance(value, BaseModel):
        return value.model_dump(mode="json", by_alias=True, exclude_unset=True)
    return value


def _sdk_list_to_dicts(value: Any) -> Any:
    """A list whose items may be SDK objects, for fields modelled as plain dicts (one check per list)."""
    if isinstance(value, list) and any(isinstance(item, BaseModel) for item in value):
        return [_sdk_to_dict(item) for item in value]
    return value


# A JSON object kept as a plain dict; an OpenAI SDK object given instead (``Reasoning``, ``ResponseTextConfig``,
# ``ToolChoiceFunction``, ...) is accepted and stored as its dict, as v0.2's SDK-based models accepted them.
_SDKDict = Annotated[dict[str, Any], BeforeValidator(_sdk_to_dict)]


def _type_union(
    members: Mapping[str, Any], *, fallback: Any = None, what: str
) -> Any:
    """A union discriminated by the ``type`` key (or attribute).

    Unknown or missing ``type`` goes to ``fallback`` when one is given (lenient unions), and is an error naming
    the accepted types otherwise.
    """
    tags = frozenset(members)

    def tag_of(value: Any) -> Optional[str]:
        t = value.get("type") if isinstance(value, dict) else getattr(value, "type", None)
        if t in tags:
            return t
        return "__other__" if fallback is not None else None

    choices = [Annotated[model, Tag(tag)] for tag, model in members.items()]
    if fallback is not None:
        choices.append(Annotated[fallback, Tag("__other__")])
    return Annotated[
        Union[tuple(choices)],
        Discriminator(
            tag_of,
            custom_error_type=f"invalid_{what.replace(' ', '_')}",
            custom_error_message=f"Unknown {what}: 'type' must be one of {sorted(tags)}",
        ),
    ]


# =====================================================================================================
# Responses API: content parts of input messages (plain dicts, as in the OpenAI SDK's *Param TypedDicts)
# =====================================================================================================


@with_config(ConfigDict(extra="allow"))
class NeMoGymResponseInputText(TypedDict, total=False):
    text: Required[str]
    type: Required[Literal["input_text"]]


@with_config(ConfigDict(extra="allow"))
class NeMoGymResponseInputImage(TypedDict, total=False):
    type: Required[Literal["input_image"]]
    detail: str
    file_id: Optional[str]
    image_url: Optional[str]


@with_config(ConfigDict(extra="allow"))
class NeMoGymResponseInputFile(TypedDict, total=False):
    type: Required[Literal["input_file"]]
    file_data: str
    file_id: Optional[str]
    file_url: str
    filename: str


@with_config(ConfigDict(extra="allow"))
class NeMoGymResponseOutputTextParam(TypedDict, total=False):
    """An ``output_text`` part inside an assistant message given as input."""

    text: Required[str]
    type: Required[Literal["output_text"]]
    annotations: list[Any]
    logprobs: Optional[list[Any]]


@with_config(ConfigDict(extra="allow"))
class NeMoGymResponseOutputRefusalParam(TypedDict, total=False):
    refusal: Required[str]
    type: Required[Literal["refusal"]]


NeMoGymResponseInputContent = _type_union(
    {
        "input_text": NeMoGymResponseInputText,
        "input_image": NeMoGymResponseInputImage,
        "input_file": NeMoGymResponseInputFile,
        "output_text": NeMoGymResponseOutputTextParam,
        "refusal": NeMoGymResponseOutputRefusalParam,
    },
    what="content part",
)
NeMoGymResponseInputMessageContentList = _list(NeMoGymResponseInputContent)


# =====================================================================================================
# Responses API: items
# =====================================================================================================

_ITEM_CONFIG = ConfigDict(extra="allow", from_attributes=True)
_ItemStatus = Literal["in_progress", "completed", "incomplete"]


# Which experts a mixture-of-experts model routed each token to, for training (NeMo Gym v0.5): an opaque string
# envelope, or ints indexed [token][moe_layer][top_k]. The framework never looks inside; clients send it back
# unchanged on the item it came on.
RoutedExperts = Union[str, _list(_list(_list(int)))]


class TokenIDLogProbMixin(BaseModel):
    """Token information a training-mode model server attaches to generated items (the last output item of each
    model call). ``routed_experts`` is optional and left out of dumps while unset."""

    prompt_token_ids: TokenIds
    generation_token_ids: TokenIds
    generation_log_probs: TokenLogProbs
    routed_experts: Optional[RoutedExperts] = Field(default=None, exclude_if=_is_none)


_TOKEN_ARRAY_FIELDS = ("prompt_token_ids", "generation_token_ids", "generation_log_probs")


class ShareTokenArraysOnDump(BaseModel):
    """A model whose ``model_dump()`` hands out its items' token arrays as they are, not element-by-element copies.

    pydantic's Python-mode dump rebuilds every list, which for a 64k-token rollout was most of the verify idiom
    ``Response(**body.model_dump(), reward=...)`` (then the constructor, given the same lists back, keeps them:
    see `_ints_as_given`). So the dump leaves the token fields of the training items out and puts the model's own
    lists back in their place, in the same key order: the dict is the one pydantic makes, with the token lists
    shared (treat them as read-only, as the model's own). Items are found in the fields named by
    ``_token_item_fields`` and, one level down, in fields holding such models (a verify request's ``response`` and
    ``responses_create_params``). Dumps with ``include``/``exclude``, by alias or in JSON mode are pydantic's own."""

    _token_item_fields: ClassVar[tuple[str, ...]] = ()

    def model_dump(self, **kwargs: Any) -> dict[str, Any]:
        if (
            kwargs.get("mode", "python") != "python"
            or kwargs.get("include") is not None
            or kwargs.get("exclude") is not None
            or kwargs.get("by_alias")
        ):
            return super().model_dump(**kwargs)
        sites: list[tuple[tuple[Any, ...], BaseModel]] = []
        exclude: dict[Any, Any] = {}
        _token_sites(self, (), exclude, sites, nested=True)
        if not sites:
            return super().model_dump(**kwargs)
        dumped = super().model_dump(exclude=exclude, **kwargs)
        only_set = kwargs.get("exclude_unset", False)
        for path, item in sites:
            parent = dumped
            for key in path[:-1]:
                parent = parent[key]
            given = parent[path[-1]]
            values = item.__dict__
            chosen = item.model_fields_set if only_set else values
            whole = {}
            for name in type(item).model_fields:
                if name in _TOKEN_ARRAY_FIELDS:
                    if name in values and name in chosen:
                        whole[name] = values[name]
                elif name in given:
                    whole[name] = given[name]
            for key, value in given.items():  # extras (`token_trajectory`, ...), after the fields, as pydantic has them
                whole.setdefault(key, value)
            parent[path[-1]] = whole
        return dumped


def _token_sites(
    model: BaseModel, path: tuple[Any, ...], exclude: dict, sites: list, *, nested: bool
) -> None:
    """The training items of `model` (see `ShareTokenArraysOnDump`): their paths in its dump, gathered in `sites`,
    and the `exclude` tree that leaves their token fields out."""
    values = model.__dict__
    for field in getattr(model, "_token_item_fields", ()):
        items = values.get(field)
        if type(items) is not list:
            continue
        for index, item in enumerate(items):
            if type(item) in _SHARED_ITEM_CLASSES:
                exclude.setdefault(field, {})[index] = _TOKEN_ARRAY_FIELDS
                sites.append((path + (field, index), item))
    if nested:
        for field, value in values.items():
            if isinstance(value, ShareTokenArraysOnDump):
                inner: dict[Any, Any] = {}
                _token_sites(value, path + (field,), inner, sites, nested=False)
                if inner:
                    exclude[field] = inner


class NeMoGymEasyInputMessage(BaseModel):
    """A message given as input: ``content`` is a string or a list of content parts."""

    model_config = _ITEM_CONFIG

    content: Union[str, NeMoGymResponseInputMessageContentList]
    role: Literal["user", "assistant", "system", "developer"]
    type: Literal["message"] = "message"


class NeMoGymMessage(BaseModel):
    """An input message with a content-part list and a ``status``."""

    model_config = _ITEM_CONFIG

    content: NeMoGymResponseInputMessageContentList
    role: Literal["user", "system", "developer"]
    status: Optional[_ItemStatus] = "completed"
    type: Literal["message"] = "message"


class NeMoGymResponseOutputText(BaseModel):
    model_config = _ITEM_CONFIG

    annotations: list[Any] = Field(default_factory=list)
    text: str
    type: Literal["output_text"] = "output_text"
    logprobs: Optional[list[Any]] = None


class NeMoGymResponseOutputRefusal(BaseModel):
    model_config = _ITEM_CONFIG

    refusal: str
    type: Literal["refusal"] = "refusal"


_OutputMessageContent = Annotated[
    Union[NeMoGymResponseOutputText, NeMoGymResponseOutputRefusal], Field(discriminator="type")
]


class NeMoGymResponseOutputMessage(BaseModel):
    """An assistant message generated by the model (has an ``id``)."""

    model_config = _ITEM_CONFIG

    id: str
    content: _list(_OutputMessageContent)
    role: Literal["assistant"] = "assistant"
    status: _ItemStatus = "completed"
    type: Literal["message"] = "message"


class NeMoGymResponseFunctionToolCall(BaseModel):
    model_config = _ITEM_CONFIG

    arguments: str
    call_id: str
    name: str
    type: Literal["function_call"] = "function_call"
    id: Optional[str] = None
    status: Optional[_ItemStatus] = None


class NeMoGymFunctionCallOutput(BaseModel):
    """A tool result sent back to the model. ``output`` is normally a string (often JSON)."""

    model_config = _ITEM_CONFIG

    call_id: str
    output: Union[str, _list(dict[str, Any])]
    type: Literal["function_call_output"] = "function_call_output"
    id: Optional[str] = None
    status: Optional[_ItemStatus] = None


class NeMoGymSummary(_SDKSummary):
    """One reasoning summary part: the OpenAI SDK's ``Summary`` (as in v0.2), so SDK summaries are instances of the
    same type. ``type`` may be left out here (it can only be ``summary_text``)."""

    model_config = _ITEM_CONFIG

    text: str
    type: Literal["summary_text"] = "summary_text"


class NeMoGymResponseReasoningItem(BaseModel):
    """Reasoning summary. ``status`` is accepted but never dumped: OpenAI rejects it when the item is re-sent."""

    model_config = _ITEM_CONFIG

    id: str
    summary: _list(NeMoGymSummary)
    type: Literal["reasoning"] = "reasoning"
    encrypted_content: Optional[str] = None
    status: Optional[_ItemStatus] = Field(default=None, exclude=True)


class NeMoGymResponseMcpCall(BaseModel):
    """A call a hosted MCP server ran for the model (an output item of upstreams with hosted MCP tools). ``id``
    and ``server_label`` may be missing (some upstreams leave them out)."""

    model_config = _ITEM_CONFIG

    arguments: str
    name: str
    type: Literal["mcp_call"] = "mcp_call"
    id: Optional[str] = None
    server_label: Optional[str] = None
    approval_request_id: Optional[str] = None
    error: Any = None
    output: Optional[str] = None
    status: Optional[str] = None


class NeMoGymResponseMcpListTools(BaseModel):
    """The tools a hosted MCP server offered (``tools``: ``{name, input_schema, description?, annotations?}``)."""

    model_config = _ITEM_CONFIG

    tools: _list(dict[str, Any]) = Field(default_factory=list)
    type: Literal["mcp_list_tools"] = "mcp_list_tools"
    id: Optional[str] = None
    server_label: Optional[str] = None
    error: Optional[str] = None


class NeMoGymResponseMcpApprovalRequest(BaseModel):
    """A hosted MCP call waiting for the caller's approval."""

    model_config = _ITEM_CONFIG

    arguments: str
    name: str
    type: Literal["mcp_approval_request"] = "mcp_approval_request"
    id: Optional[str] = None
    server_label: Optional[str] = None


class NeMoGymEasyInputMessageForTraining(NeMoGymEasyInputMessage, TokenIDLogProbMixin):
    pass


class NeMoGymMessageForTraining(NeMoGymMessage, TokenIDLogProbMixin):
    pass


class NeMoGymResponseOutputMessageForTraining(NeMoGymResponseOutputMessage, TokenIDLogProbMixin):
    pass


class NeMoGymResponseFunctionToolCallForTraining(NeMoGymResponseFunctionToolCall, TokenIDLogProbMixin):
    pass


class NeMoGymResponseReasoningItemForTraining(NeMoGymResponseReasoningItem, TokenIDLogProbMixin):
    pass


RESPONSES_TO_TRAIN: dict[type[BaseModel], type[BaseModel]] = {
    NeMoGymEasyInputMessage: NeMoGymEasyInputMessageForTraining,
    NeMoGymMessage: NeMoGymMessageForTraining,
    NeMoGymResponseOutputMessage: NeMoGymResponseOutputMessageForTraining,
    NeMoGymResponseFunctionToolCall: NeMoGymResponseFunctionToolCallForTraining,
    NeMoGymResponseReasoningItem: NeMoGymResponseReasoningItemForTraining,
}

_ITEM_MODELS: dict[str, type[BaseModel]] = {
    "easy_message": NeMoGymEasyInputMessage,
    "message": NeMoGymMessage,
    "output_message": NeMoGymResponseOutputMessage,
    "function_call": NeMoGymResponseFunctionToolCall,
    "function_call_output": NeMoGymFunctionCallOutput,
    "reasoning": NeMoGymResponseReasoningItem,
    "mcp_call": NeMoGymResponseMcpCall,
    "mcp_list_tools": NeMoGymResponseMcpListTools,
    "mcp_approval_request": NeMoGymResponseMcpApprovalRequest,
}
for _tag, _model in list(_ITEM_MODELS.items()):
    if _model in RESPONSES_TO_TRAIN:
        _ITEM_MODELS[_tag + "_train"] = RESPONSES_TO_TRAIN[_model]
del _tag, _model
_ITEM_TAG_BY_CLASS: dict[type, str] = {model: tag for tag, model in _ITEM_MODELS.items()}
_TRAINABLE_TAGS = frozenset(tag + "_train" for tag in _ITEM_MODELS if tag + "_train" in _ITEM_MODELS)
_NON_MESSAGE_TYPES = frozenset(
    {"function_call", "function_call_output", "reasoning", "mcp_call", "mcp_list_tools", "mcp_approval_request"}
)


def _classify_item(
    type_: Any, role: Any, has_id: bool, content: Any, has_status: bool, has_tokens: bool
) -> Optional[str]:
    if type_ is None or type_ == "message":
        if role is None:
            return None
        if role == "assistant":
            tag = "output_message" if has_id and isinstance(content, list) else "easy_message"
        elif has_status and isinstance(content, list):
            tag = "message"
        else:
            # user/system/developer (an unknown role fails on the easy message's role literal, with a clear error)
            tag = "easy_message"
    elif type_ in _NON_MESSAGE_TYPES:
        tag = type_
    else:
        return None
    if has_tokens and tag + "_train" in _TRAINABLE_TAGS:
        return tag + "_train"
    return tag


_JSON_NON_OBJECTS = (str, int, float, list, type(None))  # bool is an int


def _response_item_tag(value: Any) -> Optional[str]:
    if isinstance(value, dict):
        get = value.get
        return _classify_item(
            get("type"),
            get("role"),
            "id" in value,
            get("content"),
            "status" in value,
            "prompt_token_ids" in value,
        )
    if isinstance(value, _JSON_NON_OBJECTS):  # never an item: refused at once, not after six attribute lookups
        return None
    tag = _ITEM_TAG_BY_CLASS.get(type(value))
    if tag is not None:
        return tag
    for klass in type(value).__mro__[1:]:
        tag = _ITEM_TAG_BY_CLASS.get(klass)
        if tag is not None:
            return tag
    # A foreign object (e.g. an OpenAI SDK model): classify from its attributes.
    return _classify_item(
        getattr(value, "type", None),
        getattr(value, "role", None),
        getattr(value, "id", None) is not None,
        getattr(value, "content", None),
        getattr(value, "status", None) is not None,
        getattr(value, "prompt_token_ids", None) is not None,
    )


NeMoGymResponseInputItem = Annotated[
    Union[tuple(Annotated[model, Tag(tag)] for tag, model in _ITEM_MODELS.items())],
    Discriminator(
        _response_item_tag,
        custom_error_type="invalid_response_item",
        custom_error_message=(
            "Unknown Responses item: expected a message (a 'role', with 'type' missing or 'message') or an item "
            "whose 'type' is one of function_call, function_call_output, reasoning, mcp_call, mcp_list_tools, "
            "mcp_approval_request"
        ),
    ),
]
NeMoGymResponseOutputItem = NeMoGymResponseInputItem
NeMoGymResponseInput = _items(SerializeAsAny[NeMoGymResponseInputItem])

# ``input`` is a string or an item list; tagging the two keeps error locations short ("input.items.0...").
_ResponseInputField = Annotated[
    Union[Annotated[str, Tag("text")], Annotated[NeMoGymResponseInput, Tag("items")]],
    Discriminator(
        lambda v: "text" if isinstance(v, str) else "items",
    ),
    BeforeValidator(_parsed_once),  # from JSON, the items are made Python objects once (see `_items`)
]


# =====================================================================================================
# Responses API: request body
# =====================================================================================================


@with_config(ConfigDict(extra="allow"))
class NeMoGymFunctionToolParam(TypedDict, total=False):
    """A Responses-style function tool: ``{type: function, name, description, parameters, strict}``."""

    type: Required[Literal["function"]]
    name: Required[str]
    description: Optional[str]
    parameters: Optional[dict[str, Any]]
    strict: Optional[bool]


# Function tools are checked; hosted tools (web_search, mcp, ...) pass through as dicts.
NeMoGymToolParam = _type_union({"function": NeMoGymFunctionToolParam}, fallback=dict[str, Any], what="tool")
# SDK tool objects (``FunctionTool``, ``WebSearchTool``, ...) in a request become the dicts they stand for.
_ToolParamList = Annotated[_list(NeMoGymToolParam), BeforeValidator(_sdk_list_to_dicts)]


class NeMoGymResponseCreateParamsNonStreaming(ShareTokenArraysOnDump):
    """Body of ``POST /v1/responses``. Unknown keys are rejected, naming the key.

    Unlike the reference, ``seed`` is accepted (``num_repeats_add_seed`` sets it); it is left out of dumps while
    unset. Numbers must be finite: ``NaN`` / ``Infinity`` literals (which JSON lacks but lenient parsers take) are
    refused, naming the field (HTTP 422).
    """

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)
    _token_item_fields: ClassVar[tuple[str, ...]] = ("input",)

    background: Optional[bool] = None
    include: Optional[_list(str)] = None
    input: _ResponseInputField
    instructions: Optional[str] = None
    max_output_tokens: Optional[int] = None
    max_tool_calls: Optional[int] = None
    metadata: Optional[dict[str, str]] = None
    model: Optional[str] = None
    parallel_tool_calls: Optional[bool] = True
    previous_response_id: Optional[str] = None
    prompt: Optional[dict[str, Any]] = None
    reasoning: Optional[dict[str, Any]] = None
    service_tier: Optional[str] = None
    store: Optional[bool] = None
    temperature: Optional[float] = None
    text: Optional[dict[str, Any]] = None
    tool_choice: Union[Literal["none", "auto", "required"], dict[str, Any]] = "auto"
    tools: _ToolParamList = Field(default_factory=list)
    top_logprobs: Optional[int] = None
    top_p: Optional[float] = None
    truncation: Optional[Literal["auto", "disabled"]] = None
    user: Optional[str] = None
    stream: Optional[Literal[False]] = None
    seed: Optional[int] = Field(default=None, exclude_if=_is_none)


# =====================================================================================================
# Responses API: response
# =====================================================================================================


class NeMoGymFunctionTool(BaseModel):
    """A function tool as echoed in a Response's ``tools`` (the SDK's ``FunctionTool`` validates from its
    attributes)."""

    model_config = ConfigDict(extra="allow", from_attributes=True)

    name: str
    type: Literal["function"] = "function"
    description: Optional[str] = None
    parameters: Optional[dict[str, Any]] = None
    strict: Optional[bool] = None


NeMoGymResponseTool = _type_union({"function": NeMoGymFunctionTool}, fallback=_SDKDict, what="tool")


# Response-side models also validate from the SDK's objects (``ResponseUsage``, ``IncompleteDetails``, a whole
# ``openai.types.responses.Response``) by reading their attributes; dicts take the usual fast path.
_SDK_CONFIG = ConfigDict(extra="allow", from_attributes=True)


class NeMoGymIncompleteDetails(BaseModel):
    model_config = _SDK_CONFIG

    reason: Optional[str] = None


class NeMoGymResponseInputTokensDetails(BaseModel):
    model_config = _SDK_CONFIG

    cached_tokens: int = 0


class NeMoGymResponseOutputTokensDetails(BaseModel):
    model_config = _SDK_CONFIG

    reasoning_tokens: int = 0


class NeMoGymResponseUsage(BaseModel):
    model_config = _SDK_CONFIG

    input_tokens: int
    input_tokens_details: NeMoGymResponseInputTokensDetails = Field(
        default_factory=NeMoGymResponseInputTokensDetails
    )
    output_tokens: int
    output_tokens_details: NeMoGymResponseOutputTokensDetails = Field(
        default_factory=NeMoGymResponseOutputTokensDetails
    )
    total_tokens: int


class NeMoGymResponse(ShareTokenArraysOnDump):
    """A Responses API response whose ``output`` holds the Gym item union.

    Fields the upstream sends that are not declared here are kept (``extra="allow"``) and dumped back. An SDK
    ``Response`` validates too (``NeMoGymResponse.model_validate(sdk_response)``), as do SDK items and tools in
    its fields.
    """

    model_config = _SDK_CONFIG
    _token_item_fields: ClassVar[tuple[str, ...]] = ("output",)

    id: str
    created_at: Union[int, float]
    model: str
    object: Literal["response"] = "response"
    output: _items(SerializeAsAny[NeMoGymResponseOutputItem])
    parallel_tool_calls: Optional[bool] = True
    tool_choice: Union[str, _SDKDict] = "auto"
    tools: _list(NeMoGymResponseTool) = Field(default_factory=list)
    error: Optional[_SDKDict] = None
    incomplete_details: Optional[NeMoGymIncompleteDetails] = None
    instructions: Union[str, list[Any], None] = None
    metadata: Optional[dict[str, Any]] = None
    temperature: Optional[float] = None
    top_p: Optional[float] = None
    background: Optional[bool] = None
    max_output_tokens: Optional[int] = None
    max_tool_calls: Optional[int] = None
    previous_response_id: Optional[str] = None
    prompt: Optional[_SDKDict] = None
    reasoning: Optional[_SDKDict] = None
    service_tier: Optional[str] = None
    status: Optional[str] = None
    text: Optional[_SDKDict] = None
    top_logprobs: Optional[int] = None
    truncation: Optional[str] = None
    usage: Optional[NeMoGymResponseUsage] = None
    user: Optional[str] = None
    # Newer fields of the OpenAI SDK's ``Response`` that v0.5 tests build expected responses with. Other fields an
    # SDK version adds are kept as extras (and dumped back) all the same.
    conversation: Optional[_SDKDict] = None
    prompt_cache_key: Optional[str] = None
    safety_identifier: Optional[str] = None

    @property
    def output_text(self) -> str:
        """The text of every ``output_text`` part of the assistant messages in ``output``, joined (as the SDK)."""
        return "".join(self.assistant_texts())

    def assistant_texts(self) -> list[str]:
        """Each ``output_text`` part of each assistant message in ``output``, in order (reasoning, tool calls and
        refusals are not text). Verifiers join these as their grading rule says, e.g. ``"\n".join(...)``."""
        texts: list[str] = []
        for item in self.output:
            if getattr(item, "type", None) != "message" or getattr(item, "role", None) != "assistant":
                continue
            content = item.content
            if isinstance(content, str):
                texts.append(content)
                continue
            for part in content:
                if isinstance(part, dict):
                    if part.get("type") == "output_text":
                        texts.append(part["text"])
                elif part.type == "output_text":
                    texts.append(part.text)
        return texts


# =====================================================================================================
# Chat Completions: request side
# =====================================================================================================

_PARAM_CONFIG = ConfigDict(extra="allow", from_attributes=True)


@with_config(ConfigDict(extra="allow"))
class NeMoGymChatCompletionContentPartTextParam(TypedDict, total=False):
    text: Required[str]
    type: Required[Literal["text"]]


@with_config(ConfigDict(extra="allow"))
class NeMoGymChatCompletionContentPartImageParam(TypedDict, total=False):
    image_url: Required[dict[str, Any]]
    type: Required[Literal["image_url"]]


@with_config(ConfigDict(extra="allow"))
class NeMoGymChatCompletionContentPartInputAudioParam(TypedDict, total=False):
    input_audio: Required[dict[str, Any]]
    type: Required[Literal["input_audio"]]


@with_config(ConfigDict(extra="allow"))
class NeMoGymChatCompletionContentPartFileParam(TypedDict, total=False):
    file: Required[dict[str, Any]]
    type: Required[Literal["file"]]


@with_config(ConfigDict(extra="allow"))
class NeMoGymChatCompletionContentPartRefusalParam(TypedDict, total=False):
    refusal: Required[str]
    type: Required[Literal["refusal"]]


# Known part types are checked; others (video_url, audio_url, ... that some backends accept) pass through.
NeMoGymChatCompletionContentPartParam = _type_union(
    {
        "text": NeMoGymChatCompletionContentPartTextParam,
        "image_url": NeMoGymChatCompletionContentPartImageParam,
        "input_audio": NeMoGymChatCompletionContentPartInputAudioParam,
        "file": NeMoGymChatCompletionContentPartFileParam,
        "refusal": NeMoGymChatCompletionContentPartRefusalParam,
    },
    fallback=dict[str, Any],
    what="chat content part",
)
_ChatContent = Union[str, _list(NeMoGymChatCompletionContentPartParam)]


class NeMoGymChatCompletionMessageToolCallFunctionParam(BaseModel):
    model_config = _PARAM_CONFIG

    arguments: str
    name: str


class NeMoGymChatCompletionMessageToolCallParam(BaseModel):
    model_config = _PARAM_CONFIG

    id: str
    function: NeMoGymChatCompletionMessageToolCallFunctionParam
    type: Literal["function"] = "function"


class NeMoGymChatCompletionSystemMessageParam(BaseModel):
    model_config = _PARAM_CONFIG

    content: _ChatContent
    role: Literal["system"] = "system"
    name: Optional[str] = None


class NeMoGymChatCompletionDeveloperMessageParam(BaseModel):
    model_config = _PARAM_CONFIG

    content: _ChatContent
    role: Literal["developer"] = "developer"
    name: Optional[str] = None


class NeMoGymChatCompletionUserMessageParam(BaseModel):
    model_config = _PARAM_CONFIG

    content: _ChatContent
    role: Literal["user"] = "user"
    name: Optional[str] = None


class NeMoGymChatCompletionAssistantMessageParam(BaseModel):
    model_config = _PARAM_CONFIG

    role: Literal["assistant"] = "assistant"
    content: Optional[_ChatContent] = None
    audio: Optional[dict[str, Any]] = None
    function_call: Optional[dict[str, Any]] = None
    name: Optional[str] = None
    refusal: Optional[str] = None
    tool_calls: Optional[_list(NeMoGymChatCompletionMessageToolCallParam)] = None


class NeMoGymChatCompletionAssistantMessageForTrainingParam(
    NeMoGymChatCompletionAssistantMessageParam, TokenIDLogProbMixin
):
    pass


class NeMoGymChatCompletionToolMessageParam(BaseModel):
    model_config = _PARAM_CONFIG

    content: _ChatContent
    tool_call_id: str
    role: Literal["tool"] = "tool"


_CHAT_MESSAGE_MODELS: dict[str, type[BaseModel]] = {
    "system": NeMoGymChatCompletionSystemMessageParam,
    "developer": NeMoGymChatCompletionDeveloperMessageParam,
    "user": NeMoGymChatCompletionUserMessageParam,
    "assistant": NeMoGymChatCompletionAssistantMessageParam,
    "assistant_train": NeMoGymChatCompletionAssistantMessageForTrainingParam,
    "tool": NeMoGymChatCompletionToolMessageParam,
}
_CHAT_TAG_BY_CLASS: dict[type, str] = {model: tag for tag, model in _CHAT_MESSAGE_MODELS.items()}


def _chat_message_tag(value: Any) -> Optional[str]:
    if isinstance(value, dict):
        role = value.get("role")
        has_tokens = "prompt_token_ids" in value
    else:
        for klass in type(value).__mro__:
            tag = _CHAT_TAG_BY_CLASS.get(klass)
            if tag is not None:
                return tag
        role = getattr(value, "role", None)
        has_tokens = getattr(value, "prompt_token_ids", None) is not None
    if role == "assistant":
        return "assistant_train" if has_tokens else "assistant"
    if role in _CHAT_MESSAGE_MODELS:
        return role
    # Custom roles (some chat templates define their own) pass through untouched.
    return "__other__" if isinstance(role, str) else None


NeMoGymChatCompletionMessageParam = Annotated[
    Union[
        tuple(Annotated[model, Tag(tag)] for tag, model in _CHAT_MESSAGE_MODELS.items())
        + (Annotated[dict[str, Any], Tag("__other__")],)
    ],
    Discriminator(
        _chat_message_tag,
        custom_error_type="invalid_chat_message",
        custom_error_message="A chat message needs a string 'role'",
    ),
]


class NeMoGymFunctionDefinition(BaseModel):
    model_config = _PARAM_CONFIG

    name: str
    description: Optional[str] = None
    parameters: Optional[dict[str, Any]] = None
    strict: Optional[bool] = None


class NeMoGymChatCompletionToolParam(BaseModel):
    model_config = _PARAM_CONFIG

    function: NeMoGymFunctionDefinition
    type: Literal["function"] = "function"


class NeMoGymChatCompletionCreateParamsNonStreaming(ShareTokenArraysOnDump):
    """Body of ``POST /v1/chat/completions``. Unknown keys are dropped (the reference's behaviour). Numbers must be
    finite (``NaN`` / ``Infinity`` are refused, naming the field: HTTP 422)."""

    model_config = ConfigDict(extra="ignore", allow_inf_nan=False)
    _token_item_fields: ClassVar[tuple[str, ...]] = ("messages",)

    messages: _items(SerializeAsAny[NeMoGymChatCompletionMessageParam])
    model: Optional[str] = None
    audio: Optional[dict[str, Any]] = None
    frequency_penalty: Optional[float] = None
    logit_bias: Optional[dict[str, int]] = None
    logprobs: Optional[bool] = None
    max_completion_tokens: Optional[int] = None
    max_tokens: Optional[int] = None
    metadata: Optional[dict[str, str]] = None
    modalities: Optional[_list(str)] = None
    n: Optional[int] = None
    parallel_tool_calls: Optional[bool] = None
    prediction: Optional[dict[str, Any]] = None
    presence_penalty: Optional[float] = None
    reasoning_effort: Optional[str] = None
    response_format: Optional[dict[str, Any]] = None
    seed: Optional[int] = None
    service_tier: Optional[str] = None
    stop: Union[str, _list(str), None] = None
    store: Optional[bool] = None
    stream_options: Optional[dict[str, Any]] = None
    temperature: Optional[float] = None
    tool_choice: Union[str, dict[str, Any], None] = None
    tools: Optional[_list(NeMoGymChatCompletionToolParam)] = None
    top_logprobs: Optional[int] = None
    top_p: Optional[float] = None
    user: Optional[str] = None
    web_search_options: Optional[dict[str, Any]] = None
    stream: Optional[Literal[False]] = None


# =====================================================================================================
# Chat Completions: response side
# =====================================================================================================

_RESULT_CONFIG = ConfigDict(extra="allow", from_attributes=True)


class NeMoGymFunction(BaseModel):
    model_config = _RESULT_CONFIG

    arguments: str
    name: str


class NeMoGymChatCompletionMessageToolCall(BaseModel):
    model_config = _RESULT_CONFIG

    id: str
    function: NeMoGymFunction
    type: Literal["function"] = "function"


class NeMoGymChatCompletionMessage(BaseModel):
    """The assistant message of a choice. Backend extras (``reasoning_content``, ...) are kept."""

    model_config = _RESULT_CONFIG

    content: Optional[str] = None
    refusal: Optional[str] = None
    role: Literal["assistant"] = "assistant"
    annotations: Optional[list[Any]] = None
    audio: Optional[dict[str, Any]] = None
    function_call: Optional[dict[str, Any]] = None
    tool_calls: Optional[list[NeMoGymChatCompletionMessageToolCall]] = None


class NeMoGymChatCompletionMessageForTraining(NeMoGymChatCompletionMessage, TokenIDLogProbMixin):
    pass


def _chat_result_message_tag(value: Any) -> str:
    if isinstance(value, dict):
        return "train" if "prompt_token_ids" in value else "plain"
    if isinstance(value, NeMoGymChatCompletionMessageForTraining):
        return "train"
    return "train" if getattr(value, "prompt_token_ids", None) is not None else "plain"


_ChatResultMessage = Annotated[
    Union[
        Annotated[NeMoGymChatCompletionMessage, Tag("plain")],
        Annotated[NeMoGymChatCompletionMessageForTraining, Tag("train")],
    ],
    Discriminator(_chat_result_message_tag),
]


class NeMoGymChoice(BaseModel):
    """One choice. ``logprobs`` stays the backend's plain dict (``{"content": [{token, logprob, ...}]}``)."""

    model_config = _RESULT_CONFIG

    finish_reason: Optional[str] = None
    index: int = 0
    logprobs: Optional[dict[str, Any]] = None
    message: SerializeAsAny[_ChatResultMessage]


class NeMoGymCompletionUsage(BaseModel):
    model_config = _RESULT_CONFIG

    completion_tokens: int = 0
    prompt_tokens: int = 0
    total_tokens: int = 0
    completion_tokens_details: Optional[dict[str, Any]] = None
    prompt_tokens_details: Optional[dict[str, Any]] = None


class NeMoGymChatCompletion(BaseModel):
    model_config = _RESULT_CONFIG

    id: str
    choices: list[NeMoGymChoice]
    created: int
    model: str
    object: str = "chat.completion"
    service_tier: Optional[str] = None
    system_fingerprint: Optional[str] = None
    usage: Optional[NeMoGymCompletionUsage] = None


# Training items whose token arrays `ShareTokenArraysOnDump` shares (exact classes: a subclass an environment defines
# may dump differently, so its items are dumped by pydantic as they are).
_SHARED_ITEM_CLASSES = frozenset(
    [*RESPONSES_TO_TRAIN.values(), NeMoGymChatCompletionAssistantMessageForTrainingParam]
)
