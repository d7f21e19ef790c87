"""Tests for nemo_gym.openai_utils: the NeMoGym* schemas and the async OpenAI-compatible client."""

import asyncio
import json
import socket
import threading
import warnings
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx
import pytest
from pydantic import ValidationError

from nemo_gym.http import retry
from nemo_gym.openai_utils import (
    RESPONSES_TO_TRAIN,
    RETRY_STATUSES,
    NeMoGymAsyncOpenAI,
    NeMoGymChatCompletion,
    NeMoGymChatCompletionAssistantMessageForTrainingParam,
    NeMoGymChatCompletionAssistantMessageParam,
    NeMoGymChatCompletionCreateParamsNonStreaming,
    NeMoGymChatCompletionDeveloperMessageParam,
    NeMoGymChatCompletionMessage,
    NeMoGymChatCompletionMessageForTraining,
    NeMoGymChatCompletionMessageToolCall,
    NeMoGymChatCompletionMessageToolCallFunctionParam,
    NeMoGymChatCompletionMessageToolCallParam,
    NeMoGymChatCompletionSystemMessageParam,
    NeMoGymChatCompletionToolMessageParam,
    NeMoGymChatCompletionToolParam,
    NeMoGymChatCompletionUserMessageParam,
    NeMoGymChoice,
    NeMoGymEasyInputMessage,
    NeMoGymEasyInputMessageForTraining,
    NeMoGymFunction,
    NeMoGymFunctionCallOutput,
    NeMoGymFunctionDefinition,
    NeMoGymFunctionTool,
    NeMoGymMessage,
    NeMoGymMessageForTraining,
    NeMoGymOpenAIError,
    NeMoGymResponse,
    NeMoGymResponseCreateParamsNonStreaming,
    NeMoGymResponseFunctionToolCall,
    NeMoGymResponseFunctionToolCallForTraining,
    NeMoGymResponseInputTokensDetails,
    NeMoGymResponseOutputMessage,
    NeMoGymResponseOutputMessageForTraining,
    NeMoGymResponseOutputRefusal,
    NeMoGymResponseOutputText,
    NeMoGymResponseOutputTokensDetails,
    NeMoGymResponseReasoningItem,
    NeMoGymResponseReasoningItemForTraining,
    NeMoGymResponseUsage,
    NeMoGymSummary,
    TokenIDLogProbMixin,
)
from tests.unit.test_retry import slept  # noqa: F401  (fixture)

TOKENS = {"prompt_token_ids": [1, 2, 3], "generation_token_ids": [4, 5], "generation_log_probs": [-0.1, -0.2]}

WEATHER_TOOL = {
    "type": "function",
    "name": "get_weather",
    "description": "Weather for a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    "strict": True,
}


# ------------------------------------------------------------------------------------------------ items

ITEM_CASES = [
    ({"role": "user", "content": "hello"}, NeMoGymEasyInputMessage),
    ({"role": "system", "content": "be brief", "type": "message"}, NeMoGymEasyInputMessage),
    ({"role": "developer", "content": [{"type": "input_text", "text": "x"}]}, NeMoGymEasyInputMessage),
    ({"role": "assistant", "content": "earlier answer"}, NeMoGymEasyInputMessage),
    (
        {"role": "assistant", "content": [{"type": "output_text", "text": "earlier", "annotations": []}]},
        NeMoGymEasyInputMessage,
    ),
    (
        {
            "role": "user",
            "content": [
                {"type": "input_text", "text": "what is this?"},
                {"type": "input_image", "image_url": "data:image/png;base64,AAAA", "detail": "auto"},
                {"type": "input_file", "file_id": "file-1"},
            ],
            "status": "completed",
            "type": "message",
        },
        NeMoGymMessage,
    ),
    (
        {
            "id": "msg_1",
            "type": "message",
            "role": "assistant",
            "status": "completed",
            "content": [
                {"type": "output_text", "text": "Hi", "annotations": []},
                {"type": "refusal", "refusal": "no"},
            ],
        },
        NeMoGymResponseOutputMessage,
    ),
    (
        {"type": "function_call", "arguments": '{"city": "Paris"}', "call_id": "call_1", "name": "get_weather"},
        NeMoGymResponseFunctionToolCall,
    ),
    (
        {"type": "function_call_output", "call_id": "call_1", "output": '{"temp": 20}'},
        NeMoGymFunctionCallOutput,
    ),
    (
        {"type": "reasoning", "id": "rs_1", "summary": [{"type": "summary_text", "text": "thinking"}]},
        NeMoGymResponseReasoningItem,
    ),
]


def _validate_items(items):
    return NeMoGymResponseCreateParamsNonStreaming.model_validate({"input": items}).input


@pytest.mark.parametrize("item, cls", ITEM_CASES, ids=[f"{c.__name__}-{i}" for i, (_, c) in enumerate(ITEM_CASES)])
def test_every_item_type_validates_from_plain_dicts(item, cls):
    (validated,) = _validate_items([item])
    assert type(validated) is cls
    # Nothing given is lost, and role-only messages gain type "message".
    dumped = validated.model_dump(exclude_unset=True)
    assert dumped == item
    full = validated.model_dump()
    assert full["type"] == item.get("type", "message")
    # The same items also validate as Response output.
    response = NeMoGymResponse.model_validate({"id": "r", "created_at": 1, "model": "m", "output": [item]})
    assert type(response.output[0]) is cls


def test_output_message_content_parts_are_models_and_input_parts_are_dicts():
    out, easy = _validate_items([ITEM_CASES[6][0], ITEM_CASES[5][0]])
    assert isinstance(out.content[0], NeMoGymResponseOutputText)
    assert isinstance(out.content[1], NeMoGymResponseOutputRefusal)
    assert out.content[0].text == "Hi"
    assert isinstance(easy.content[0], dict)
    assert easy.content[0]["text"] == "what is this?"


def test_items_without_type_or_role_and_unknown_types_are_rejected():
    with pytest.raises(ValidationError, match="Unknown Responses item"):
        _validate_items([{"content": "no role"}])
    with pytest.raises(ValidationError, match="Unknown Responses item"):
        _validate_items([{"type": "not_a_thing"}])
    with pytest.raises(ValidationError, match="role"):
        _validate_items([{"role": "tool", "content": "x"}])
    with pytest.raises(ValidationError, match="content part"):
        _validate_items([{"role": "user", "content": [{"type": "bogus_part"}]}])


def test_a_long_list_of_bad_items_stops_at_the_first_one():
    # pydantic reports every bad item otherwise: a million of them took seconds to refuse (issue 24).
    for bad in ([1] * 10_000, [{"role": "user", "content": "fine"}] * 3 + [{"type": "not_a_thing"}] * 10_000):
        with pytest.raises(ValidationError) as caught:
            NeMoGymResponseCreateParamsNonStreaming.model_validate({"input": bad})
        errors = caught.value.errors()
        assert len(errors) <= 2, errors[:5]  # the first bad item (per member of the string-or-items union)
        assert any(error["loc"][:3] == ("input", "items", len(bad) - 10_000) for error in errors), errors
    for field, value in (("tools", [{"type": "function"}] * 10_000), ("include", [1] * 10_000)):
        with pytest.raises(ValidationError) as caught:
            NeMoGymResponseCreateParamsNonStreaming.model_validate({"input": "hi", field: value})
        assert caught.value.error_count() <= 2
    with pytest.raises(ValidationError) as caught:
        NeMoGymChatCompletionCreateParamsNonStreaming.model_validate({"messages": [1] * 10_000})
    assert caught.value.error_count() <= 2


def test_items_from_model_instances_are_kept_without_revalidation():
    call = NeMoGymResponseFunctionToolCall(arguments="{}", call_id="c", name="f")
    out = NeMoGymResponseOutputMessage(id="m", content=[NeMoGymResponseOutputText(text="x")])
    params = NeMoGymResponseCreateParamsNonStreaming(input=[call, out])
    assert params.input[0] is call
    assert params.input[1] is out


def test_openai_sdk_objects_are_accepted_as_items():
    from openai.types.responses import ResponseFunctionToolCall

    sdk_call = ResponseFunctionToolCall(arguments="{}", call_id="c", name="f", type="function_call")
    (item,) = _validate_items([sdk_call])
    assert type(item) is NeMoGymResponseFunctionToolCall
    assert item.call_id == "c"


def test_function_call_output_round_trip():
    item = {
        "type": "function_call_output",
        "call_id": "call_9",
        "output": '{"ok": true}',
        "id": "fco_1",
        "status": "completed",
    }
    (validated,) = _validate_items([item])
    assert validated.model_dump() == item
    assert validated.model_dump(exclude_none=True) == item
    assert json.loads(validated.model_dump_json()) == item


def test_reasoning_item_round_trip_and_status_dropped():
    item = {
        "type": "reasoning",
        "id": "rs_2",
        "summary": [{"type": "summary_text", "text": "a"}, {"type": "summary_text", "text": "b"}],
        "encrypted_content": "gAAAA",
        "content": [{"type": "reasoning_text", "text": "raw"}],
    }
    (validated,) = _validate_items([dict(item, status="completed")])
    assert isinstance(validated.summary[0], NeMoGymSummary)
    assert validated.status == "completed"  # readable ...
    assert validated.model_dump(exclude_none=True) == item  # ... but never sent back
    assert "status" not in validated.model_dump()
    assert NeMoGymSummary(text="t").model_dump() == {"text": "t", "type": "summary_text"}


def test_unknown_item_fields_pass_through():
    item = {"type": "function_call", "arguments": "{}", "call_id": "c", "name": "f", "namespace": "tools"}
    (validated,) = _validate_items([item])
    assert validated.model_dump(exclude_unset=True) == item


# ------------------------------------------------------------------------------------------------ training


@pytest.mark.parametrize(
    "item, cls",
    [
        ({"role": "user", "content": "x"}, NeMoGymEasyInputMessageForTraining),
        (
            {"role": "user", "content": [{"type": "input_text", "text": "x"}], "status": "completed"},
            NeMoGymMessageForTraining,
        ),
        (ITEM_CASES[6][0], NeMoGymResponseOutputMessageForTraining),
        (ITEM_CASES[7][0], NeMoGymResponseFunctionToolCallForTraining),
        (ITEM_CASES[9][0], NeMoGymResponseReasoningItemForTraining),
    ],
)
def test_training_variants_are_chosen_when_token_fields_are_present(item, cls):
    (validated,) = _validate_items([dict(item, **TOKENS)])
    assert type(validated) is cls
    assert isinstance(validated, TokenIDLogProbMixin)
    assert validated.generation_log_probs == [-0.1, -0.2]
    dumped = validated.model_dump()
    assert {k: dumped[k] for k in TOKENS} == TOKENS
    # Response output keeps the subclass fields when dumped.
    response = NeMoGymResponse.model_validate(
        {"id": "r", "created_at": 1, "model": "m", "output": [dict(item, **TOKENS)]}
    )
    assert response.model_dump()["output"][0]["prompt_token_ids"] == [1, 2, 3]


def test_responses_to_train_map_and_token_coercion():
    assert set(RESPONSES_TO_TRAIN) == {
        NeMoGymEasyInputMessage,
        NeMoGymMessage,
        NeMoGymResponseOutputMessage,
        NeMoGymResponseFunctionToolCall,
        NeMoGymResponseReasoningItem,
    }
    for base, train in RESPONSES_TO_TRAIN.items():
        assert issubclass(train, base) and issubclass(train, TokenIDLogProbMixin)
        assert train.__name__ == base.__name__ + "ForTraining"
    # vLLM reports generated tokens as strings ("token_id:123" with the prefix removed): coerced to ints.
    item = RESPONSES_TO_TRAIN[NeMoGymResponseFunctionToolCall].model_validate(
        dict(ITEM_CASES[7][0], prompt_token_ids=[1], generation_token_ids=["42", "7"], generation_log_probs=[0])
    )
    assert item.generation_token_ids == [42, 7]
    with pytest.raises(ValidationError):
        NeMoGymResponseFunctionToolCallForTraining.model_validate(ITEM_CASES[7][0])  # token fields required


def test_subclassed_items_keep_their_fields_in_dumps():
    class TaggedMessage(NeMoGymResponseOutputMessage):
        policy_epoch: int = 0

    msg = TaggedMessage(id="m", content=[{"type": "output_text", "text": "x", "annotations": []}], policy_epoch=3)
    response = NeMoGymResponse(id="r", created_at=1, model="m", output=[msg])
    assert response.output[0] is msg
    assert response.model_dump()["output"][0]["policy_epoch"] == 3


# ------------------------------------------------------------------------------------------------ create params


def test_create_params_reject_unknown_keys_naming_them():
    with pytest.raises(ValidationError) as info:
        NeMoGymResponseCreateParamsNonStreaming.model_validate({"input": "hi", "not_a_param": 1})
    errors = info.value.errors()
    assert [e["loc"] for e in errors] == [("not_a_param",)]
    assert errors[0]["type"] == "extra_forbidden"
    assert "not_a_param" in str(info.value)


def test_create_params_accept_seed_and_hide_it_when_unset():
    params = NeMoGymResponseCreateParamsNonStreaming.model_validate({"input": "hi", "seed": 7})
    assert params.seed == 7
    assert params.model_dump()["seed"] == 7
    unset = NeMoGymResponseCreateParamsNonStreaming.model_validate({"input": "hi"})
    assert unset.seed is None
    assert "seed" not in unset.model_dump()


def test_create_params_string_input_and_defaults():
    params = NeMoGymResponseCreateParamsNonStreaming.model_validate({"input": "What is 2+2?"})
    assert params.input == "What is 2+2?"
    assert params.tools == []
    assert params.tool_choice == "auto"
    assert params.parallel_tool_calls is True
    assert params.stream is None
    assert params.model_dump(exclude_unset=True) == {"input": "What is 2+2?"}
    dumped = params.model_dump()
    for key in ("temperature", "max_output_tokens", "instructions", "metadata", "model", "reasoning", "truncation"):
        assert dumped[key] is None


def test_create_params_item_list_input_with_tools():
    row = {
        "input": [
            {"role": "system", "content": "You are helpful."},
            {"role": "user", "content": "Weather in Paris?"},
            ITEM_CASES[9][0],
            ITEM_CASES[7][0],
            ITEM_CASES[8][0],
        ],
        "tools": [WEATHER_TOOL, {"type": "web_search"}],
        "temperature": 0.5,
        "max_output_tokens": 256,
        "metadata": {"k": "v"},
        "tool_choice": {"type": "function", "name": "get_weather"},
        "parallel_tool_calls": False,
        "reasoning": {"effort": "low"},
    }
    params = NeMoGymResponseCreateParamsNonStreaming.model_validate(row)
    assert [type(i) for i in params.input] == [
        NeMoGymEasyInputMessage,
        NeMoGymEasyInputMessage,
        NeMoGymResponseReasoningItem,
        NeMoGymResponseFunctionToolCall,
        NeMoGymFunctionCallOutput,
    ]
    assert params.tools[0] == WEATHER_TOOL  # tools stay plain dicts, like the SDK's TypedDicts
    assert params.tools[1] == {"type": "web_search"}
    assert params.model_dump(exclude_unset=True) == row
    dumped = params.model_dump()
    assert [i["type"] for i in dumped["input"]] == [
        "message",
        "message",
        "reasoning",
        "function_call",
        "function_call_output",
    ]


def test_create_params_reject_streaming_and_bad_values():
    with pytest.raises(ValidationError, match="stream"):
        NeMoGymResponseCreateParamsNonStreaming.model_validate({"input": "x", "stream": True})
    assert NeMoGymResponseCreateParamsNonStreaming.model_validate({"input": "x", "stream": False}).stream is False
    with pytest.raises(ValidationError, match="input"):
        NeMoGymResponseCreateParamsNonStreaming.model_validate({})
    with pytest.raises(ValidationError, match="name"):
        NeMoGymResponseCreateParamsNonStreaming.model_validate({"input": "x", "tools": [{"type": "function"}]})
    with pytest.raises(ValidationError):
        NeMoGymResponseCreateParamsNonStreaming.model_validate({"input": "x", "metadata": {"k": 1}})


def test_create_params_json_schema_builds():
    # FastAPI builds the OpenAPI document from these.
    for model in (
        NeMoGymResponseCreateParamsNonStreaming,
        NeMoGymResponse,
        NeMoGymChatCompletionCreateParamsNonStreaming,
        NeMoGymChatCompletion,
    ):
        assert model.model_json_schema()["type"] == "object"


# ------------------------------------------------------------------------------------------------ response


def _response_dict(output=None, **overrides):
    d = {
        "id": "resp_abc",
        "created_at": 1735000000,
        "model": "policy",
        "object": "response",
        "output": output
        if output is not None
        else [
            {"type": "reasoning", "id": "rs_1", "summary": [{"type": "summary_text", "text": "hmm"}]},
            {
                "id": "msg_1",
                "type": "message",
                "role": "assistant",
                "status": "completed",
                "content": [{"type": "output_text", "text": "Let me check.", "annotations": [], "logprobs": []}],
            },
            {
                "type": "function_call",
                "arguments": '{"city":"Paris"}',
                "call_id": "call_1",
                "name": "get_weather",
                "id": "call_1",
                "status": "completed",
            },
            {"type": "function_call_output", "call_id": "call_1", "output": "20C"},
            {
                "id": "msg_2",
                "type": "message",
                "role": "assistant",
                "status": "completed",
                "content": [{"type": "output_text", "text": " It is 20C.", "annotations": []}],
            },
        ],
        "parallel_tool_calls": True,
        "tool_choice": "auto",
        "tools": [WEATHER_TOOL],
        "temperature": 1.0,
        "top_p": 1.0,
        "incomplete_details": None,
        "instructions": None,
        "metadata": {"session": "s1"},
        "max_output_tokens": 512,
        "reasoning": {"effort": "low", "summary": "auto"},
        "text": {"format": {"type": "text"}},
        "truncation": "disabled",
        "status": "completed",
        "usage": {
            "input_tokens": 100,
            "input_tokens_details": {"cached_tokens": 10},
            "output_tokens": 20,
            "output_tokens_details": {"reasoning_tokens": 5},
            "total_tokens": 120,
        },
        "user": None,
        "store": False,  # not declared: passes through
        "some_new_upstream_field": {"nested": [1, 2]},
    }
    d.update(overrides)
    return d


def test_response_round_trip_with_usage():
    d = _response_dict()
    response = NeMoGymResponse.model_validate(d)
    assert isinstance(response.usage, NeMoGymResponseUsage)
    assert response.usage.input_tokens_details.cached_tokens == 10
    assert response.usage.output_tokens_details.reasoning_tokens == 5
    assert isinstance(response.tools[0], NeMoGymFunctionTool)
    assert response.tools[0].name == "get_weather"
    assert response.store is False and response.some_new_upstream_field == {"nested": [1, 2]}

    full = response.model_dump()
    assert set(d) <= set(full)
    assert all(full[k] == d[k] for k in d if k != "output")
    assert response.model_dump(exclude_unset=True) == d
    assert json.loads(response.model_dump_json(exclude_unset=True)) == d
    # exclude_none keeps every field that has a value (at every depth)
    no_none = response.model_dump(exclude_none=True)

    def strip_none(obj):
        if isinstance(obj, dict):
            return {k: strip_none(v) for k, v in obj.items() if v is not None}
        if isinstance(obj, list):
            return [strip_none(v) for v in obj]
        return obj

    assert no_none == strip_none(d)
    # created_at stays an int; re-validating a dump gives the same dump.
    assert no_none["created_at"] == 1735000000 and isinstance(no_none["created_at"], int)
    assert NeMoGymResponse.model_validate(response.model_dump()).model_dump() == response.model_dump()


def test_response_built_from_kwargs_like_model_servers_do():
    usage = NeMoGymResponseUsage(
        input_tokens=3,
        input_tokens_details=NeMoGymResponseInputTokensDetails(cached_tokens=0),
        output_tokens=4,
        output_tokens_details=NeMoGymResponseOutputTokensDetails(reasoning_tokens=0),
        total_tokens=7,
    )
    params = NeMoGymResponseCreateParamsNonStreaming.model_validate({"input": "x", "tools": [WEATHER_TOOL]})
    response = NeMoGymResponse(
        id="resp_1",
        created_at=1,
        model="m",
        output=[NeMoGymResponseOutputMessage(id="msg", content=[NeMoGymResponseOutputText(text="hi")]).model_dump()],
        tool_choice=params.tool_choice,
        parallel_tool_calls=params.parallel_tool_calls,
        tools=params.tools,
        incomplete_details={"reason": "max_output_tokens"},
        usage=usage,
    )
    assert response.object == "response"
    assert response.incomplete_details.reason == "max_output_tokens"
    assert response.output_text == "hi"
    assert response.model_dump()["usage"]["total_tokens"] == 7
    minimal = NeMoGymResponseUsage(input_tokens=1, output_tokens=1, total_tokens=2)
    assert minimal.model_dump()["input_tokens_details"] == {"cached_tokens": 0}


def test_output_text_joins_assistant_text_only():
    response = NeMoGymResponse.model_validate(_response_dict())
    assert response.output_text == "Let me check. It is 20C."
    empty = NeMoGymResponse.model_validate(_response_dict(output=[ITEM_CASES[7][0]]))
    assert empty.output_text == ""
    mixed = NeMoGymResponse.model_validate(
        _response_dict(output=[{"role": "user", "content": "ignored"}, {"role": "assistant", "content": "plain"}])
    )
    assert mixed.output_text == "plain"


def test_response_with_200_output_items_validates():
    items = []
    for i in range(50):
        items.append({"type": "reasoning", "id": f"rs_{i}", "summary": [{"type": "summary_text", "text": "t" * 200}]})
        items.append(
            {
                "id": f"msg_{i}",
                "type": "message",
                "role": "assistant",
                "status": "completed",
                "content": [{"type": "output_text", "text": "x" * 500, "annotations": []}],
                **TOKENS,
            }
        )
        items.append(
            {"type": "function_call", "arguments": "{}", "call_id": f"c{i}", "name": "f", "status": "completed"}
        )
        items.append({"type": "function_call_output", "call_id": f"c{i}", "output": "y" * 300})
    d = _response_dict(output=items)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no serializer fallbacks/warnings
        response = NeMoGymResponse.model_validate(d)
        assert len(response.output) == 200
        assert type(response.output[1]) is NeMoGymResponseOutputMessageForTraining
        assert response.model_dump(exclude_unset=True) == d


# ------------------------------------------------------------------------------------------------ chat


def test_chat_params_ignore_unknown_keys_and_type_messages_per_role():
    body = {
        "model": "policy",
        "messages": [
            {"role": "system", "content": "sys"},
            {"role": "developer", "content": [{"type": "text", "text": "dev"}]},
            {
                "role": "user",
                "content": [{"type": "text", "text": "hi"}, {"type": "image_url", "image_url": {"url": "data:,"}}],
            },
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [{"id": "call_1", "type": "function", "function": {"name": "f", "arguments": "{}"}}],
                "reasoning_content": "kept as an extra",
            },
            {"role": "tool", "content": "20C", "tool_call_id": "call_1"},
            {"role": "assistant", "content": "done", **TOKENS},
            {"role": "response_1", "content": "custom roles pass through"},
        ],
        "tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}],
        "seed": 3,
        "max_tokens": 100,
        "logprobs": True,
        "instructions": "dropped",  # Responses-only keys are ignored (reference behaviour)
        "chat_template_kwargs": {"enable_thinking": False},
    }
    params = NeMoGymChatCompletionCreateParamsNonStreaming.model_validate(body)
    assert [type(m) for m in params.messages] == [
        NeMoGymChatCompletionSystemMessageParam,
        NeMoGymChatCompletionDeveloperMessageParam,
        NeMoGymChatCompletionUserMessageParam,
        NeMoGymChatCompletionAssistantMessageParam,
        NeMoGymChatCompletionToolMessageParam,
        NeMoGymChatCompletionAssistantMessageForTrainingParam,
        dict,
    ]
    assert params.seed == 3
    assert not hasattr(params, "instructions") and not hasattr(params, "chat_template_kwargs")
    assert isinstance(params.messages[3].tool_calls[0], NeMoGymChatCompletionMessageToolCallParam)
    assert isinstance(params.tools[0].function, NeMoGymFunctionDefinition)
    dumped = params.model_dump(exclude_unset=True)
    expected = {k: v for k, v in body.items() if k not in ("instructions", "chat_template_kwargs")}
    assert dumped == expected
    assert dumped["messages"][5]["prompt_token_ids"] == [1, 2, 3]


def test_chat_params_built_from_models_like_the_converter_does():
    params = NeMoGymChatCompletionCreateParamsNonStreaming(
        messages=[
            NeMoGymChatCompletionUserMessageParam(content="hi", role="user"),
            NeMoGymChatCompletionAssistantMessageForTrainingParam(
                content=None,
                role="assistant",
                tool_calls=[
                    NeMoGymChatCompletionMessageToolCallParam(
                        id="c1",
                        type="function",
                        function=NeMoGymChatCompletionMessageToolCallFunctionParam(name="f", arguments="{}"),
                    )
                ],
                **TOKENS,
            ),
            NeMoGymChatCompletionToolMessageParam(content="out", role="tool", tool_call_id="c1"),
        ],
        tools=[
            NeMoGymChatCompletionToolParam(
                type="function",
                function=NeMoGymFunctionDefinition(**{k: v for k, v in WEATHER_TOOL.items() if k != "type"}),
            )
        ],
        max_tokens=10,
    )
    dumped = params.model_dump(exclude_unset=True)
    assert dumped["messages"][1]["tool_calls"][0]["function"] == {"name": "f", "arguments": "{}"}
    assert dumped["messages"][1]["generation_token_ids"] == [4, 5]
    assert dumped["tools"][0]["function"]["name"] == "get_weather"


def test_chat_params_reject_messages_without_role():
    with pytest.raises(ValidationError, match="role"):
        NeMoGymChatCompletionCreateParamsNonStreaming.model_validate({"messages": [{"content": "x"}]})
    with pytest.raises(ValidationError):
        NeMoGymChatCompletionCreateParamsNonStreaming.model_validate({"messages": [{"role": "tool", "content": "x"}]})


def test_chat_completion_parse_with_tool_calls():
    d = {
        "id": "chatcmpl-1",
        "object": "chat.completion",
        "created": 1735000000,
        "model": "policy",
        "choices": [
            {
                "index": 0,
                "finish_reason": "tool_calls",
                "logprobs": None,
                "message": {
                    "role": "assistant",
                    "content": "<think>need weather</think>",
                    "reasoning_content": None,
                    "tool_calls": [
                        {
                            "id": "chatcmpl-tool-1",
                            "type": "function",
                            "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
                        }
                    ],
                },
                "stop_reason": None,
            }
        ],
        "usage": {"prompt_tokens": 50, "completion_tokens": 10, "total_tokens": 60, "prompt_tokens_details": None},
        "prompt_logprobs": None,
        "kv_transfer_params": None,
    }
    completion = NeMoGymChatCompletion.model_validate(d)
    choice = completion.choices[0]
    assert isinstance(choice, NeMoGymChoice)
    assert type(choice.message) is NeMoGymChatCompletionMessage
    call = choice.message.tool_calls[0]
    assert isinstance(call, NeMoGymChatCompletionMessageToolCall) and isinstance(call.function, NeMoGymFunction)
    assert call.function.name == "get_weather" and json.loads(call.function.arguments) == {"city": "Paris"}
    assert completion.usage.prompt_tokens == 50
    assert completion.model_dump(exclude_unset=True) == d


def test_chat_completion_training_message_and_constructors():
    d = {
        "id": "c",
        "created": 1,
        "model": "m",
        "choices": [
            {"index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": "hi", **TOKENS}}
        ],
    }
    completion = NeMoGymChatCompletion.model_validate(d)
    assert type(completion.choices[0].message) is NeMoGymChatCompletionMessageForTraining
    assert completion.model_dump()["choices"][0]["message"]["prompt_token_ids"] == [1, 2, 3]
    built = NeMoGymChatCompletion(
        id="x",
        object="chat.completion",
        created=1,
        model="m",
        choices=[
            NeMoGymChoice(
                index=0,
                finish_reason="stop",
                message=NeMoGymChatCompletionMessage(role="assistant", content=None, tool_calls=None),
            ),
            NeMoGymChoice(
                index=1,
                finish_reason="length",
                message=NeMoGymChatCompletionMessage(role="assistant", content="x", **TOKENS),
            ),
        ],
    )
    # extra token fields on the plain message class are kept too (extra="allow")
    assert built.model_dump()["choices"][1]["message"]["generation_log_probs"] == [-0.1, -0.2]


# ------------------------------------------------------------------------------------------------ client


class _ScriptedServer:
    """A real HTTP server on 127.0.0.1 answering from a per-path script of (status, body[, headers]) replies."""

    def __init__(self):
        self.scripts: dict[str, list[tuple]] = {}
        self.requests: list[dict] = []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def _answer(self):
                length = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(length) if length else b""
                outer.requests.append(
                    {
                        "method": self.command,
                        "path": self.path,
                        # HTTP header names are case-insensitive; transports differ in the case they send.
                        "headers": {k.lower(): v for k, v in self.headers.items()},
                        "body": json.loads(raw) if raw else None,
                    }
                )
                script = outer.scripts.get(self.path) or [(404, {"error": "no script"})]
                status, body, *headers = script.pop(0) if len(script) > 1 else script[0]
                data = body.encode() if isinstance(body, str) else json.dumps(body).encode()
                self.send_response(status)
                for name, value in (headers[0] if headers else {}).items():
                    self.send_header(name, value)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            do_GET = do_POST = _answer

            def log_message(self, *args):
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.base_url = f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"
        self.thread = threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True)
        self.thread.start()

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def server():
    s = _ScriptedServer()
    yield s
    s.close()


def _client(server, **kwargs):
    kwargs.setdefault("backoff_base", 0.01)
    return NeMoGymAsyncOpenAI(base_url=server.base_url + "/", api_key="sk-test", **kwargs)


async def test_client_success_on_every_endpoint(server):
    completion = {"id": "c", "object": "chat.completion", "created": 1, "model": "m", "choices": []}
    server.scripts["/v1/chat/completions"] = [(200, completion)]
    server.scripts["/v1/responses"] = [(200, _response_dict())]
    server.scripts["/v1/models"] = [(200, {"object": "list", "data": [{"id": "m"}]})]
    server.scripts["/tokenize"] = [(200, {"tokens": [1, 2, 3], "count": 3})]
    async with _client(server) as client:
        messages = [{"role": "user", "content": "hi"}]
        assert await client.create_chat_completion(model="m", messages=messages, logit_bias={5: 1}) == completion
        assert NeMoGymResponse.model_validate(await client.create_response(model="m", input="hi")).output_text
        assert (await client.create_models())["data"][0]["id"] == "m"
        assert (await client.create_tokenize(model="m", messages=[]))["tokens"] == [1, 2, 3]
        first_http = client._http
        await client.create_models()
        assert client._http is first_http  # one httpx.AsyncClient reused
    assert [(r["method"], r["path"]) for r in server.requests] == [
        ("POST", "/v1/chat/completions"),
        ("POST", "/v1/responses"),
        ("GET", "/v1/models"),
        ("POST", "/tokenize"),
        ("GET", "/v1/models"),
    ]
    first = server.requests[0]
    assert first["headers"]["authorization"] == "Bearer sk-test"
    assert first["body"] == {"model": "m", "messages": [{"role": "user", "content": "hi"}], "logit_bias": {"5": 1}}


async def test_client_serializes_pydantic_models_in_the_body(server):
    server.scripts["/v1/chat/completions"] = [(200, {"ok": True})]
    async with _client(server) as client:
        await client.create_chat_completion(messages=[NeMoGymChatCompletionUserMessageParam(content="hi")])
    assert server.requests[0]["body"] == {"messages": [{"content": "hi", "role": "user"}]}


async def test_client_retries_after_503_then_succeeds(server):
    server.scripts["/v1/chat/completions"] = [(503, {"error": "overloaded"}), (200, {"id": "ok"})]
    async with _client(server) as client:
        assert await client.create_chat_completion(model="m", messages=[]) == {"id": "ok"}
    assert len(server.requests) == 2


async def test_client_waits_as_long_as_retry_after_asks_up_to_its_cap(server, slept):
    server.scripts["/v1/responses"] = [
        (503, {"error": "loading"}, {"Retry-After": "4"}),
        (429, {"error": "rate limited"}, {"Retry-After": "600"}),
        (200, _response_dict()),
    ]
    async with _client(server, backoff_max=0.01, max_retry_after=20.0) as client:
        assert (await client.create_response(input="hi"))["id"]
    assert len(server.requests) == 3
    assert slept == [4.0, 20.0]


async def test_client_gives_up_after_n_500s_with_status_and_body(server):
    server.scripts["/v1/responses"] = [(500, "upstream exploded: CUDA OOM")]
    async with _client(server, max_attempts=4) as client:
        with pytest.raises(NeMoGymOpenAIError) as info:
            await client.create_response(input="hi")
    err = info.value
    assert len(server.requests) == 4
    assert err.status == err.status_code == 500
    assert err.body == "upstream exploded: CUDA OOM"
    assert err.response_content == b"upstream exploded: CUDA OOM"
    assert err.attempts == 4
    assert "HTTP 500" in str(err) and "CUDA OOM" in str(err) and "4 attempts" in str(err)
    assert isinstance(err, httpx.HTTPStatusError) and err.response.status_code == 500


@pytest.mark.parametrize("status", [400, 404, 501])
async def test_client_does_not_retry_permanent_errors(server, status, slept):
    server.scripts["/v1/chat/completions"] = [(status, {"error": {"message": "maximum context length is 4096 tokens"}})]
    async with _client(server) as client:
        with pytest.raises(NeMoGymOpenAIError) as info:
            await client.create_chat_completion(messages=[])
    assert len(server.requests) == 1 and slept == []
    assert info.value.status == status and "context length" in info.value.body


async def test_client_retries_connection_errors_then_raises():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    client = NeMoGymAsyncOpenAI(f"http://127.0.0.1:{port}/v1", "k", max_attempts=2, backoff_base=0.01)
    with pytest.raises(httpx.ConnectError) as info:
        await client.create_models()
    assert any("2 attempts" in note for note in getattr(info.value, "__notes__", []))
    await client.aclose()


def test_retry_statuses_and_argument_checks():
    # The one set of nemo_gym.http.retry (model calls are idempotent, so all of it applies). Compared with this
    # client's own set before: 408 and 529 and Cloudflare's 521-524 were added on purpose (never processed, or
    # overload in front of hosted APIs).
    assert RETRY_STATUSES is retry.RETRY_STATUSES
    assert {429, 500, 502, 503, 504, 520} <= RETRY_STATUSES
    client = NeMoGymAsyncOpenAI("http://127.0.0.1:1/v1", "k", max_attempts=5, backoff_base=0.1, backoff_max=1.0, max_retry_after=7)
    assert client.retry_policy == retry.RetryPolicy(5, 0.1, 1.0, 7)
    assert (client.max_attempts, client.backoff_base, client.backoff_max, client.max_retry_after) == (5, 0.1, 1.0, 7)
    with pytest.raises(ValueError):
        NeMoGymAsyncOpenAI("http://127.0.0.1:1/v1", "k", max_attempts=0)


def test_client_works_across_event_loops(server):
    server.scripts["/v1/models"] = [(200, {"data": []})]
    client = _client(server)
    assert asyncio.run(client.create_models()) == {"data": []}
    assert asyncio.run(client.create_models()) == {"data": []}  # a fresh loop gets a fresh httpx client


def test_discriminator_checks_one_union_member_only():
    # A broken function_call is reported against the function_call model alone, not against every union member.
    with pytest.raises(ValidationError) as info:
        _validate_items([{"type": "function_call", "call_id": "c"}])
    locs = [e["loc"] for e in info.value.errors()]
    assert locs == [("input", "items", 0, "function_call", "arguments"), ("input", "items", 0, "function_call", "name")]


def test_assistant_texts_lists_each_output_text_part_in_order():
    response = NeMoGymResponse.model_validate(
        {
            "id": "r", "created_at": 0, "model": "m", "object": "response", "parallel_tool_calls": True,
            "tool_choice": "auto", "tools": [],
            "output": [
                {"type": "reasoning", "id": "rs", "summary": [{"type": "summary_text", "text": "thinking"}]},
                {"type": "message", "id": "m1", "role": "assistant", "status": "completed",
                 "content": [{"type": "output_text", "text": "a", "annotations": []},
                             {"type": "refusal", "refusal": "no"},
                             {"type": "output_text", "text": "b", "annotations": []}]},
                {"type": "function_call", "call_id": "c", "name": "f", "arguments": "{}"},
                {"type": "message", "id": "m2", "role": "assistant", "status": "completed",
                 "content": [{"type": "output_text", "text": "c", "annotations": []}]},
            ],
        }
    )
    assert response.assistant_texts() == ["a", "b", "c"]
    assert response.output_text == "abc"


@pytest.mark.parametrize("transport", ["lean", "aiohttp", "httpx"])
async def test_every_transport_answers_retries_and_fails_alike(server, monkeypatch, transport):
    """The lean client (default), aiohttp directly and httpx: same answers, retries and errors."""
    monkeypatch.setenv("NEMO_GYM_HTTP_CLIENT_TRANSPORT", transport)
    server.scripts["/v1/responses"] = [(503, {"error": "overloaded"}), (200, _response_dict())]
    server.scripts["/v1/chat/completions"] = [(400, {"error": {"message": "bad request"}})]
    async with _client(server) as client:
        assert NeMoGymResponse.model_validate(await client.create_response(model="m", input="hi")).output_text
        with pytest.raises(NeMoGymOpenAIError) as caught:
            await client.create_chat_completion(model="m", messages=[])
    assert caught.value.status == 400 and "bad request" in caught.value.body
    assert caught.value.response.request.url.path == "/v1/chat/completions"
    assert [r["path"] for r in server.requests] == ["/v1/responses", "/v1/responses", "/v1/chat/completions"]
