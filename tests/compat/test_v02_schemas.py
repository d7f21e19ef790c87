"""v0.2's schema models were built on the openai SDK's types, so SDK objects validate where v0.2 took them."""

from openai.types.responses import (
    FunctionTool,
    Response,
    ResponseFunctionToolCall,
    ResponseOutputMessage,
    ResponseOutputText,
    ResponseReasoningItem,
    ResponseUsage,
)
from openai.types.responses.response_reasoning_item import Summary
from openai.types.responses.response_usage import InputTokensDetails, OutputTokensDetails

from nemo_gym.base_resources_server import BaseVerifyRequest
from nemo_gym.openai_utils import (
    NeMoGymResponse,
    NeMoGymResponseCreateParamsNonStreaming,
    NeMoGymResponseFunctionToolCall,
    NeMoGymResponseOutputMessage,
    NeMoGymResponseReasoningItem,
    NeMoGymSummary,
)

TOOL = FunctionTool(
    type="function", name="get_weather", description="weather of a city",
    parameters={"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}, strict=True,
)


def sdk_items() -> list:
    return [
        ResponseReasoningItem(id="rs_1", type="reasoning", summary=[Summary(type="summary_text", text="think")]),
        ResponseFunctionToolCall(type="function_call", call_id="call_1", name="get_weather", arguments='{"city": "Paris"}'),
        ResponseOutputMessage(
            id="msg_1", type="message", role="assistant", status="completed",
            content=[ResponseOutputText(type="output_text", text="It is cold.", annotations=[])],
        ),
    ]


def sdk_usage() -> ResponseUsage:
    # model_construct: newer SDKs add required detail fields (cache_write_tokens) that older ones lack.
    return ResponseUsage.model_construct(
        input_tokens=3, output_tokens=4, total_tokens=7,
        input_tokens_details=InputTokensDetails.model_construct(cached_tokens=0),
        output_tokens_details=OutputTokensDetails.model_construct(reasoning_tokens=1),
    )


def test_response_takes_sdk_tools_items_and_usage():
    response = NeMoGymResponse(
        id="resp_1", created_at=1.0, model="m", object="response", output=sdk_items(),
        parallel_tool_calls=True, tool_choice="auto", tools=[TOOL], usage=sdk_usage(),
    )
    assert [type(o) for o in response.output] == [
        NeMoGymResponseReasoningItem, NeMoGymResponseFunctionToolCall, NeMoGymResponseOutputMessage,
    ]
    assert response.output_text == "It is cold."
    assert response.tools[0].name == "get_weather"
    assert response.usage.total_tokens == 7 and response.usage.output_tokens_details.reasoning_tokens == 1
    dumped = response.model_dump(mode="json")
    assert dumped["tools"][0]["parameters"]["required"] == ["city"]
    assert dumped["output"][0] == {"id": "rs_1", "summary": [{"text": "think", "type": "summary_text"}],
                                   "type": "reasoning", "encrypted_content": None}
    assert dumped["output"][1]["arguments"] == '{"city": "Paris"}'


def test_a_whole_sdk_response_validates():
    sdk = Response(
        id="resp_2", created_at=2.0, model="m", object="response", output=sdk_items(), parallel_tool_calls=True,
        tool_choice="auto", tools=[TOOL], usage=sdk_usage(),
    )
    response = NeMoGymResponse.model_validate(sdk)
    assert response.id == "resp_2" and len(response.output) == 3 and response.tools[0].name == "get_weather"
    assert NeMoGymResponse.model_validate(sdk.model_dump(mode="json")).output_text == "It is cold."


def test_create_params_take_sdk_tools_and_items():
    params = NeMoGymResponseCreateParamsNonStreaming(input=sdk_items(), tools=[TOOL])
    dumped = params.model_dump(mode="json", exclude_unset=True)
    assert dumped["tools"][0]["name"] == "get_weather" and dumped["tools"][0]["strict"] is True
    assert [o["type"] for o in dumped["input"]] == ["reasoning", "function_call", "message"]


def test_summary_is_the_sdk_summary():
    summary = NeMoGymSummary(type="summary_text", text="t")
    assert isinstance(summary, Summary)
    assert summary.model_dump() == {"text": "t", "type": "summary_text"}
    item = NeMoGymResponseReasoningItem(id="rs", type="reasoning", summary=[Summary(type="summary_text", text="s")])
    assert item.summary[0].text == "s" and isinstance(item.summary[0], Summary)


def test_verify_request_from_sdk_objects():
    request = BaseVerifyRequest(
        responses_create_params=NeMoGymResponseCreateParamsNonStreaming(input="weather?", tools=[TOOL]),
        response=NeMoGymResponse(
            id="resp_3", created_at=3, model="m", object="response", output=sdk_items(), parallel_tool_calls=True,
            tool_choice="auto", tools=[TOOL],
        ),
    )
    assert request.response.output[1].name == "get_weather"
    assert BaseVerifyRequest.model_validate(request.model_dump(mode="json")).response.output_text == "It is cold."
