"""v0.5 schema pieces in `nemo_gym.openai_utils`: `NeMoGymResponse` as a superset of the installed OpenAI SDK's
`Response` (v0.5 tests build expected responses with `conversation`, `prompt_cache_key`, `safety_identifier` and
compare whole dumps), `RoutedExperts` on training items, hosted-MCP output items and image parts in chat user
messages. Must pass on the newest openai and on the lowest one pyproject.toml allows."""

import types
import typing

import pytest
from openai.types.responses import Response as SDKResponse
from pydantic import BaseModel

from nemo_gym.openai_utils import (
    NeMoGymChatCompletionContentPartImageParam,
    NeMoGymChatCompletionCreateParamsNonStreaming,
    NeMoGymChatCompletionUserMessageParam,
    NeMoGymResponse,
    NeMoGymResponseCreateParamsNonStreaming,
    NeMoGymResponseMcpApprovalRequest,
    NeMoGymResponseMcpCall,
    NeMoGymResponseMcpListTools,
    NeMoGymResponseOutputMessageForTraining,
    RoutedExperts,
)

MESSAGE = {
    "id": "msg_1",
    "type": "message",
    "role": "assistant",
    "status": "completed",
    "content": [{"type": "output_text", "text": "It is 4.", "annotations": []}],
}
BASE = {
    "id": "resp_1",
    "created_at": 1700000000,
    "model": "policy",
    "object": "response",
    "output": [MESSAGE],
    "parallel_tool_calls": True,
    "tool_choice": "auto",
    "tools": [],
}


def test_expected_responses_built_with_the_new_fields_compare_equal_as_whole_dumps():
    expected = NeMoGymResponse(**BASE, conversation=None, prompt_cache_key=None, safety_identifier=None)
    actual = NeMoGymResponse.model_validate(BASE)  # what a server answered, without those keys
    assert actual.model_dump() == expected.model_dump()
    assert actual.model_dump(mode="json") == expected.model_dump(mode="json")
    for name in ("conversation", "prompt_cache_key", "safety_identifier"):
        assert name in actual.model_dump() and actual.model_dump()[name] is None


def test_the_new_fields_round_trip_with_values():
    response = NeMoGymResponse(
        **BASE, conversation={"id": "conv_9"}, prompt_cache_key="cache-key", safety_identifier="user-hash"
    )
    dumped = response.model_dump(mode="json")
    assert dumped["conversation"] == {"id": "conv_9"}
    assert dumped["prompt_cache_key"] == "cache-key" and dumped["safety_identifier"] == "user-hash"
    assert NeMoGymResponse.model_validate(dumped).model_dump(mode="json") == dumped
    assert NeMoGymResponse.model_validate_json(response.model_dump_json()).model_dump() == response.model_dump()


def test_every_field_of_the_installed_sdk_response_is_accepted_and_kept():
    sdk = SDKResponse.model_validate(BASE)
    sdk_dump = sdk.model_dump(mode="json")
    assert set(sdk_dump) == set(SDKResponse.model_fields)  # a dump names every field of this SDK version
    ours = NeMoGymResponse.model_validate(sdk_dump).model_dump(mode="json")
    missing = [name for name in SDKResponse.model_fields if name not in ours]
    assert not missing, f"NeMoGymResponse drops {missing}"
    changed = [name for name in SDKResponse.model_fields if ours[name] != sdk_dump[name]]
    assert not changed, f"NeMoGymResponse changes {changed}"
    # The SDK object itself validates too (attributes are read), keeping what it has set.
    assert NeMoGymResponse.model_validate(sdk).output_text == "It is 4."


# A value each known optional field takes (the SDK must accept it too); fields a newer SDK adds are tried with
# the generic candidates below.
SAMPLES = {
    "background": True,
    "completed_at": 1700000009,
    "conversation": {"id": "conv_1"},
    "error": {"code": "server_error", "message": "boom"},
    "incomplete_details": {"reason": "max_output_tokens"},
    "instructions": "Be brief.",
    "max_output_tokens": 256,
    "max_tool_calls": 3,
    "metadata": {"run": "7"},
    "previous_response_id": "resp_0",
    "prompt": {"id": "pmpt_1", "version": "2"},
    "prompt_cache_key": "cache-key",
    "prompt_cache_retention": "24h",
    "reasoning": {"effort": "low"},
    "safety_identifier": "user-hash",
    "service_tier": "default",
    "status": "completed",
    "temperature": 0.7,
    "text": {"format": {"type": "text"}},
    "top_logprobs": 2,
    "top_p": 0.9,
    "truncation": "disabled",
    "usage": {
        "input_tokens": 5, "input_tokens_details": {"cached_tokens": 1},
        "output_tokens": 3, "output_tokens_details": {"reasoning_tokens": 0}, "total_tokens": 8,
    },
    "user": "u-1",
}


def example_of(annotation, depth: int = 0):
    """A JSON value of type `annotation` (an SDK field's type): required fields of models filled in, the first
    member of unions and literals. Used for fields a newer SDK adds, which SAMPLES cannot know."""
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if depth > 6:
        return None
    if origin is typing.Annotated:
        return example_of(args[0], depth + 1)
    if origin is typing.Literal:
        return args[0]
    if origin in (typing.Union, types.UnionType):
        for member in args:
            if member is not type(None):
                value = example_of(member, depth + 1)
                if value is not None:
                    return value
        return None
    if origin in (list, typing.List):
        item = example_of(args[0], depth + 1) if args else "x"
        return [] if item is None else [item]
    if origin in (dict, typing.Dict) or annotation is dict:
        value = example_of(args[1], depth + 1) if len(args) == 2 else "v"
        return {} if value is None else {"k": value}
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return {
            name: example_of(field.annotation, depth + 1)
            for name, field in annotation.model_fields.items()
            if field.is_required()
        }
    return {str: "x", int: 1, float: 0.5, bool: True, object: "x"}.get(annotation)


def _sdk_accepts(name, value) -> bool:
    try:
        SDKResponse.model_validate({**BASE, name: value})
    except Exception:
        return False
    return True


@pytest.mark.parametrize("name", sorted(set(SDKResponse.model_fields) - set(BASE)))
def test_each_optional_sdk_field_given_a_value_round_trips(name):
    candidates = [SAMPLES.get(name), example_of(SDKResponse.model_fields[name].annotation)]
    value = next((v for v in candidates if v is not None and _sdk_accepts(name, v)), None)
    assert value is not None, f"no value of the SDK's field {name!r} could be built for the test"
    response = NeMoGymResponse.model_validate({**BASE, name: value})
    dumped = response.model_dump(mode="json")
    assert dumped[name] == value
    assert NeMoGymResponse.model_validate(dumped).model_dump(mode="json") == dumped


def test_routed_experts_ride_on_training_items_and_are_omitted_while_unset():
    tokens = {"prompt_token_ids": [1, 2], "generation_token_ids": [3], "generation_log_probs": [-0.5]}
    experts: RoutedExperts = [[[0, 5], [2, 7]]]  # [token][moe_layer][top_k]
    for value in (experts, "opaque-envelope=="):
        item = {**MESSAGE, **tokens, "routed_experts": value}
        response = NeMoGymResponse.model_validate({**BASE, "output": [item]})
        assert isinstance(response.output[0], NeMoGymResponseOutputMessageForTraining)
        assert response.output[0].routed_experts == value
        assert response.model_dump()["output"][0]["routed_experts"] == value
        # Sent back unchanged on the item it came on, in the next request's input.
        params = NeMoGymResponseCreateParamsNonStreaming.model_validate({"input": response.model_dump()["output"]})
        assert params.model_dump()["input"][0]["routed_experts"] == value
    plain = NeMoGymResponse.model_validate({**BASE, "output": [{**MESSAGE, **tokens}]})
    assert "routed_experts" not in plain.model_dump()["output"][0]


def test_hosted_mcp_items_validate_with_or_without_id_and_server_label():
    output = [
        {"type": "mcp_list_tools", "server_label": "weather",
         "tools": [{"name": "forecast", "input_schema": {"type": "object"}}]},
        {"type": "mcp_approval_request", "name": "forecast", "arguments": "{}"},
        {"type": "mcp_call", "id": "mcp_1", "server_label": "weather", "name": "forecast",
         "arguments": '{"city": "Paris"}', "output": "sunny", "status": "completed"},
        MESSAGE,
    ]
    response = NeMoGymResponse.model_validate({**BASE, "output": output})
    kinds = [type(item) for item in response.output[:3]]
    assert kinds == [NeMoGymResponseMcpListTools, NeMoGymResponseMcpApprovalRequest, NeMoGymResponseMcpCall]
    assert response.output[0].id is None and response.output[1].server_label is None
    assert response.output[2].output == "sunny"
    assert response.output_text == "It is 4."
    again = NeMoGymResponse.model_validate(response.model_dump(mode="json"))
    assert again.model_dump(mode="json") == response.model_dump(mode="json")


def test_sdk_mcp_call_objects_validate():
    from openai.types.responses.response_output_item import McpCall

    sdk_item = McpCall(id="mcp_2", server_label="s", name="n", arguments="{}", type="mcp_call")
    response = NeMoGymResponse.model_validate({**BASE, "output": [sdk_item]})
    assert isinstance(response.output[0], NeMoGymResponseMcpCall) and response.output[0].server_label == "s"


def test_image_parts_in_chat_user_messages():
    part: NeMoGymChatCompletionContentPartImageParam = {
        "type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA", "detail": "low"},
    }
    params = NeMoGymChatCompletionCreateParamsNonStreaming.model_validate({
        "messages": [{"role": "user", "content": [{"type": "text", "text": "What is this?"}, part]}],
    })
    message = params.messages[0]
    assert isinstance(message, NeMoGymChatCompletionUserMessageParam)
    assert message.content[1] == part
    with pytest.raises(Exception):
        NeMoGymChatCompletionCreateParamsNonStreaming.model_validate(
            {"messages": [{"role": "user", "content": [{"type": "image_url"}]}]}
        )
