"""Golden tests of nemo_gym.api.chat_conversion: plain dict in, exact dict out, both directions."""

import copy
import itertools

import pytest
from openai.types.chat import ChatCompletion
from openai.types.responses import Response as OpenAIResponse

from nemo_gym.api.chat_conversion import (
    ChatConversionError,
    build_response,
    chat_completion_to_response,
    chat_completion_to_response_output,
    empty_chat_completion,
    extract_think,
    fold_reasoning_into_content,
    generation_tokens_from_logprobs,
    logprob_tokens_match,
    token_ids_of_logprobs,
    is_context_length_error,
    prepare_chat_messages,
    responses_to_chat_params,
    usage_to_responses,
    wants_output_logprobs,
    wrap_think,
)
from nemo_gym.openai_utils import NeMoGymChatCompletionCreateParamsNonStreaming, NeMoGymResponse


def ids():
    """Deterministic item ids: rs_1, msg_2, call_3, ..."""
    counter = itertools.count(1)
    return lambda prefix: f"{prefix}_{next(counter)}"


def openai_validate(response: dict) -> None:
    """Validate with the openai SDK's own Response model. Its installed version wants usage details that OpenAI
    added later (cache_write_tokens); the SDK's client parses leniently, so check usage with our model instead."""
    OpenAIResponse.model_validate({**response, "usage": None})


def to_chat(params, **kw):
    kw.setdefault("training", False)
    before = copy.deepcopy(params)
    result = responses_to_chat_params(params, **kw)
    assert params == before, "the converter must not mutate its input"
    return result


TOOL = {"type": "function", "name": "get_weather", "description": "Weather of a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}, "strict": True}
CHAT_TOOL = {"type": "function", "function": {"name": "get_weather", "description": "Weather of a city",
             "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}, "strict": True}}
TOKENS_A = {"prompt_token_ids": [1, 2], "generation_token_ids": [3, 4], "generation_log_probs": [-0.5, -0.25]}
TOKENS_B = {"prompt_token_ids": [1, 2, 3, 4, 5], "generation_token_ids": [6], "generation_log_probs": [-1.0]}


# ----------------------------------------------------------------------------------------------------------
# Responses -> Chat Completions


def test_string_input_and_copied_params():
    chat, unmapped = to_chat(
        {"input": "What is 2+2?", "model": "ignored", "temperature": 0.7, "top_p": 0.9, "max_output_tokens": 64,
         "seed": 3, "user": "u1", "metadata": {"k": "v"}, "store": False, "stream": False, "parallel_tool_calls": True,
         "tool_choice": "auto", "tools": []}
    )
    assert chat == {
        "messages": [{"role": "user", "content": "What is 2+2?"}],
        "temperature": 0.7, "top_p": 0.9, "seed": 3, "user": "u1", "metadata": {"k": "v"}, "store": False,
        "max_tokens": 64,
    }
    assert unmapped == []
    NeMoGymChatCompletionCreateParamsNonStreaming.model_validate(chat)


def test_instructions_developer_and_system():
    params = {
        "instructions": "You are terse.",
        "input": [
            {"role": "system", "content": "System rules."},
            {"role": "developer", "content": [{"type": "input_text", "text": "Dev note."}]},
            {"role": "user", "content": "Hi", "type": "message"},
        ],
    }
    chat, _ = to_chat(params)
    assert chat["messages"] == [
        {"role": "system", "content": "You are terse."},
        {"role": "system", "content": "System rules."},
        {"role": "developer", "content": [{"type": "text", "text": "Dev note."}]},
        {"role": "user", "content": "Hi"},
    ]
    chat, _ = to_chat(params, replace_developer_role_with_system=True)
    assert [m["role"] for m in chat["messages"]] == ["system", "system", "system", "user"]


def test_reasoning_round_trip_to_think_text_and_to_parser_fields():
    params = {
        "input": [
            {"role": "user", "content": "q"},
            {"type": "reasoning", "id": "rs_1", "summary": [{"type": "summary_text", "text": "first"},
                                                            {"type": "summary_text", "text": "second"}]},
            {"type": "message", "id": "msg_1", "role": "assistant", "status": "completed",
             "content": [{"type": "output_text", "text": "answer", "annotations": []}]},
            {"role": "user", "content": "again"},
        ]
    }
    chat, _ = to_chat(params)
    assert chat["messages"][1] == {"role": "assistant", "content": "<think>first</think><think>second</think>answer"}
    chat, _ = to_chat(params, uses_reasoning_parser=True)
    assert chat["messages"] == [
        {"role": "user", "content": "q"},
        {"role": "assistant", "content": "answer", "reasoning_content": "first\nsecond", "reasoning": "first\nsecond"},
        {"role": "user", "content": "again"},
    ]


def test_several_tool_calls_in_one_step_and_their_outputs():
    params = {
        "input": [
            {"role": "user", "content": "Weather in Paris and Rome?"},
            {"type": "reasoning", "id": "rs_1", "summary": [{"type": "summary_text", "text": "two calls"}]},
            {"type": "function_call", "id": "fc_1", "call_id": "call_a", "name": "get_weather",
             "arguments": '{"city": "Paris"}', "status": "completed"},
            {"type": "function_call", "call_id": "call_b", "name": "get_weather", "arguments": '{"city": "Rome"}'},
            {"type": "function_call_output", "call_id": "call_a", "output": '{"temp": 20}'},
            {"type": "function_call_output", "call_id": "call_b", "output": '{"temp": 25}'},
            {"role": "assistant", "content": "Paris 20, Rome 25."},
        ],
        "tools": [TOOL],
        "tool_choice": "auto",
        "parallel_tool_calls": True,
    }
    chat, unmapped = to_chat(params)
    assert chat == {
        "messages": [
            {"role": "user", "content": "Weather in Paris and Rome?"},
            {
                "role": "assistant",
                "content": "<think>two calls</think>",
                "tool_calls": [
                    {"id": "call_a", "type": "function",
                     "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}},
                    {"id": "call_b", "type": "function",
                     "function": {"name": "get_weather", "arguments": '{"city": "Rome"}'}},
                ],
            },
            {"role": "tool", "tool_call_id": "call_a", "content": '{"temp": 20}'},
            {"role": "tool", "tool_call_id": "call_b", "content": '{"temp": 25}'},
            {"role": "assistant", "content": "Paris 20, Rome 25."},
        ],
        "tools": [CHAT_TOOL],
        "tool_choice": "auto",
        "parallel_tool_calls": True,
    }
    assert unmapped == []
    NeMoGymChatCompletionCreateParamsNonStreaming.model_validate(chat)


def test_function_call_without_text_has_null_content():
    chat, _ = to_chat({"input": [
        {"role": "user", "content": "x"},
        {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "c1", "output": "ok"},
    ]})
    assert chat["messages"][1] == {
        "role": "assistant", "content": None,
        "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}],
    }


def test_training_token_fields_replay_previous_steps():
    params = {
        "input": [
            {"role": "user", "content": "q"},
            # step 1 output: reasoning + a call; the last item carries the step's tokens
            {"type": "reasoning", "id": "rs_1", "summary": [{"type": "summary_text", "text": "r"}]},
            {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}", **TOKENS_A},
            {"type": "function_call_output", "call_id": "c1", "output": "ok"},
            # step 2 output: a message with its own tokens
            {"type": "message", "id": "msg_2", "role": "assistant", "status": "completed",
             "content": [{"type": "output_text", "text": "done", "annotations": []}], **TOKENS_B},
            {"role": "user", "content": "thanks"},
        ]
    }
    chat, _ = to_chat(params, training=True)
    assert chat["messages"] == [
        {"role": "user", "content": "q"},
        {"role": "assistant", "content": "<think>r</think>",
         "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}], **TOKENS_A},
        {"role": "tool", "tool_call_id": "c1", "content": "ok"},
        {"role": "assistant", "content": "done", **TOKENS_B},
        {"role": "user", "content": "thanks"},
    ]
    # Validates as the training variant of the assistant message.
    NeMoGymChatCompletionCreateParamsNonStreaming.model_validate(chat)
    # Not in training mode: no token fields go upstream.
    chat, _ = to_chat(params, training=False)
    assert all("prompt_token_ids" not in m for m in chat["messages"])
    # Training + reasoning parser: tokens and parser fields together.
    chat, _ = to_chat(params, training=True, uses_reasoning_parser=True)
    assert chat["messages"][1] == {
        "role": "assistant", "content": "",
        "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}],
        **TOKENS_A, "reasoning_content": "r", "reasoning": "r",
    }


def test_tokens_of_the_last_item_of_a_merged_assistant_turn_win():
    chat, _ = to_chat({"input": [
        {"role": "user", "content": "q"},
        {"type": "reasoning", "id": "rs_1", "summary": [{"type": "summary_text", "text": "r"}], **TOKENS_A},
        {"role": "assistant", "content": "a", **TOKENS_B},
    ]}, training=True)
    assert chat["messages"][1] == {"role": "assistant", "content": "<think>r</think>a", **TOKENS_B}


def test_tool_choice_text_format_logprobs_and_reasoning_effort():
    chat, unmapped = to_chat({
        "input": "x",
        "tools": [TOOL, {"type": "web_search"}],
        "tool_choice": {"type": "function", "name": "get_weather"},
        "text": {"format": {"type": "json_schema", "name": "answer", "schema": {"type": "object"}, "strict": True}},
        "include": ["message.output_text.logprobs"],
        "top_logprobs": 2,
        "reasoning": {"effort": "high"},
    })
    assert chat == {
        "messages": [{"role": "user", "content": "x"}],
        "tools": [CHAT_TOOL],
        "tool_choice": {"type": "function", "function": {"name": "get_weather"}},
        "logprobs": True,
        "top_logprobs": 2,
        "reasoning_effort": "high",
        "response_format": {"type": "json_schema",
                            "json_schema": {"name": "answer", "schema": {"type": "object"}, "strict": True}},
    }
    assert unmapped == ["tools[type=web_search]"]
    chat, _ = to_chat({"input": "x", "text": {"format": {"type": "json_object"}}})
    assert chat["response_format"] == {"type": "json_object"}
    chat, _ = to_chat({"input": "x", "text": {"format": {"type": "text"}}, "tool_choice": "required"})
    assert chat == {"messages": [{"role": "user", "content": "x"}]}


def test_unmappable_fields_are_reported_not_silently_dropped():
    chat, unmapped = to_chat({
        "input": "x",
        "previous_response_id": "resp_1",
        "truncation": "auto",
        "background": True,
        "max_tool_calls": 2,
        "prompt": {"id": "pmpt_1"},
        "reasoning": {"effort": None, "summary": "auto"},
        "text": {"verbosity": "low"},
        "include": ["reasoning.encrypted_content"],
        "prompt_cache_key": "abc",
    })
    assert chat == {"messages": [{"role": "user", "content": "x"}]}
    assert sorted(unmapped) == sorted([
        "previous_response_id", "truncation", "background", "max_tool_calls", "prompt", "reasoning.summary",
        "text.verbosity", "include[reasoning.encrypted_content]", "prompt_cache_key",
    ])
    # Defaults that change nothing are not reported.
    _, unmapped = to_chat({"input": "x", "truncation": "disabled", "background": False, "stream": False})
    assert unmapped == []


def test_content_parts_images_files_and_tool_output_lists():
    chat, _ = to_chat({"input": [
        {"role": "user", "content": [
            {"type": "input_text", "text": "look"},
            {"type": "input_image", "image_url": "data:image/png;base64,AAAA", "detail": "low"},
            {"type": "input_file", "file_data": "data:application/pdf;base64,BBBB", "filename": "a.pdf"},
        ]},
        {"type": "function_call", "call_id": "c", "name": "f", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "c", "output": [{"type": "input_text", "text": "r"}]},
    ]})
    assert chat["messages"][0]["content"] == [
        {"type": "text", "text": "look"},
        {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA", "detail": "low"}},
        {"type": "file", "file": {"file_data": "data:application/pdf;base64,BBBB", "filename": "a.pdf"}},
    ]
    assert chat["messages"][2] == {"role": "tool", "tool_call_id": "c", "content": [{"type": "text", "text": "r"}]}


def test_inexpressible_input_is_a_conversion_error():
    with pytest.raises(ChatConversionError, match="item_reference"):
        to_chat({"input": [{"type": "item_reference", "id": "x"}]})
    with pytest.raises(ChatConversionError, match="file_id"):
        to_chat({"input": [{"role": "user", "content": [{"type": "input_image", "file_id": "f1"}]}]})
    with pytest.raises(ChatConversionError, match="needs a role"):
        to_chat({"input": [{"content": "no role"}]})


def test_prepare_chat_messages_list_content_and_developer():
    messages = [
        {"role": "developer", "content": "d"},
        {"role": "assistant", "content": [{"type": "text", "text": "<think>a</think>x"},
                                          {"type": "text", "text": "<think>b</think>y"}]},
        {"role": "assistant", "content": "plain"},
    ]
    before = copy.deepcopy(messages)
    out = prepare_chat_messages(messages, replace_developer_role_with_system=True, uses_reasoning_parser=True)
    assert messages == before
    assert out == [
        {"role": "system", "content": "d"},
        {"role": "assistant", "content": [{"type": "text", "text": "x"}, {"type": "text", "text": "y"}],
         "reasoning_content": "a\nb", "reasoning": "a\nb"},
        {"role": "assistant", "content": "plain"},
    ]
    assert out[2] is messages[2]  # unchanged messages are not copied


# ----------------------------------------------------------------------------------------------------------
# Chat Completions -> Responses


def test_think_extraction_helpers():
    assert extract_think("no tags") == ([], "no tags")
    assert extract_think("<think>a\nb</think>x<think>c</think>y") == (["a\nb", "c"], "xy")
    assert extract_think("<think>unclosed") == ([], "<think>unclosed")
    assert wrap_think("r") == "<think>r</think>"


def test_plain_message():
    assert chat_completion_to_response_output({"role": "assistant", "content": "Hello"}, new_id=ids()) == [
        {"id": "msg_1", "type": "message", "role": "assistant", "status": "completed",
         "content": [{"type": "output_text", "text": "Hello", "annotations": []}]},
    ]


def test_multiple_think_blocks_and_several_tool_calls():
    message = {
        "role": "assistant",
        "content": "<think>plan A</think>Checking both.<think>plan B</think>",
        "tool_calls": [
            {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city":"Paris"}'}},
            {"id": "call_2", "type": "function", "function": {"name": "get_weather", "arguments": {"city": "Rome"}}},
        ],
    }
    assert chat_completion_to_response_output(message, new_id=ids()) == [
        {"id": "rs_1", "type": "reasoning",
         "summary": [{"type": "summary_text", "text": "plan A"}, {"type": "summary_text", "text": "plan B"}]},
        {"id": "msg_2", "type": "message", "role": "assistant", "status": "completed",
         "content": [{"type": "output_text", "text": "Checking both.", "annotations": []}]},
        {"type": "function_call", "id": "call_1", "call_id": "call_1", "name": "get_weather",
         "arguments": '{"city":"Paris"}', "status": "completed"},
        {"type": "function_call", "id": "call_2", "call_id": "call_2", "name": "get_weather",
         "arguments": '{"city":"Rome"}', "status": "completed"},
    ]


def test_reasoning_only_whitespace_remainder_and_empty_generation():
    assert chat_completion_to_response_output({"role": "assistant", "content": "<think>hmm</think>\n\n"},
                                              new_id=ids()) == [
        {"id": "rs_1", "type": "reasoning", "summary": [{"type": "summary_text", "text": "hmm"}]},
    ]
    # Nothing generated at all still gives one (empty) message.
    assert chat_completion_to_response_output({"role": "assistant", "content": None}, new_id=ids()) == [
        {"id": "msg_1", "type": "message", "role": "assistant", "status": "completed",
         "content": [{"type": "output_text", "text": "", "annotations": []}]},
    ]


def test_training_fields_go_on_the_last_item():
    message = {"role": "assistant", "content": "<think>r</think>ok",
               "tool_calls": [{"id": "c9", "type": "function", "function": {"name": "f", "arguments": "{}"}}],
               **TOKENS_A}
    out = chat_completion_to_response_output(message, new_id=ids())
    assert out == [
        {"id": "rs_1", "type": "reasoning", "summary": [{"type": "summary_text", "text": "r"}]},
        {"id": "msg_2", "type": "message", "role": "assistant", "status": "completed",
         "content": [{"type": "output_text", "text": "ok", "annotations": []}]},
        {"type": "function_call", "id": "c9", "call_id": "c9", "name": "f", "arguments": "{}",
         "status": "completed", **TOKENS_A},
    ]
    response = NeMoGymResponse.model_validate(build_response({"input": "x"}, out, model="m", created_at=1,
                                                             response_id="resp_1"))
    assert type(response.output[-1]).__name__ == "NeMoGymResponseFunctionToolCallForTraining"
    assert type(response.output[0]).__name__ == "NeMoGymResponseReasoningItem"


def test_refusal_missing_tool_call_id_and_legacy_function_call():
    out = chat_completion_to_response_output(
        {"role": "assistant", "content": None, "refusal": "I can't."}, new_id=ids())
    assert out == [{"id": "msg_1", "type": "message", "role": "assistant", "status": "completed",
                    "content": [{"type": "refusal", "refusal": "I can't."}]}]
    out = chat_completion_to_response_output(
        {"role": "assistant", "content": "", "function_call": {"name": "f", "arguments": "{}"}}, new_id=ids())
    assert out == [{"type": "function_call", "id": "call_1", "call_id": "call_1", "name": "f", "arguments": "{}",
                    "status": "completed"}]


def test_round_trip_output_back_to_the_same_chat_message():
    original = {"role": "assistant", "content": "<think>r</think>text",
                "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}]}
    out = chat_completion_to_response_output(original, new_id=ids())
    chat, _ = to_chat({"input": [{"role": "user", "content": "q"}, *out]})
    assert chat["messages"][1] == original


def test_build_response_echo_incomplete_usage():
    params = {
        "input": "x", "instructions": "be brief", "tools": [TOOL], "tool_choice": "required",
        "parallel_tool_calls": False, "temperature": 0.2, "top_p": 0.5, "max_output_tokens": 5,
        "metadata": {"a": "b"}, "reasoning": {"effort": "low"}, "text": {"format": {"type": "text"}}, "seed": 7,
    }
    output = chat_completion_to_response_output({"role": "assistant", "content": "trunc"}, new_id=ids())
    usage = {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15,
             "prompt_tokens_details": {"cached_tokens": 4}}
    response = build_response(params, output, model="served", finish_reason="length", usage=usage,
                              response_id="resp_x", created_at=123)
    assert response == {
        "id": "resp_x", "object": "response", "created_at": 123, "model": "served", "status": "incomplete",
        "error": None, "incomplete_details": {"reason": "max_output_tokens"}, "output": output,
        "parallel_tool_calls": False, "tool_choice": "required", "tools": [TOOL],
        "instructions": "be brief", "metadata": {"a": "b"}, "temperature": 0.2, "top_p": 0.5, "background": None,
        "max_output_tokens": 5, "max_tool_calls": None, "previous_response_id": None, "prompt": None,
        "reasoning": {"effort": "low"}, "service_tier": None, "text": {"format": {"type": "text"}},
        "top_logprobs": None, "truncation": None, "user": None, "seed": 7,
        "usage": {"input_tokens": 10, "input_tokens_details": {"cached_tokens": 4}, "output_tokens": 5,
                  "output_tokens_details": {"reasoning_tokens": 0}, "total_tokens": 15},
    }
    NeMoGymResponse.model_validate(response)
    openai_validate(response)
    # tool_choice defaults to "auto" only when the request did not set it; a named tool is echoed as given.
    assert build_response({"input": "x"}, output, model="m")["tool_choice"] == "auto"
    named = {"type": "function", "name": "get_weather"}
    assert build_response({"input": "x", "tool_choice": named}, output, model="m")["tool_choice"] == named
    done = build_response({"input": "x"}, output, model="m", finish_reason="stop")
    assert done["status"] == "completed" and done["incomplete_details"] is None and done["usage"] is None
    assert build_response({"input": "x"}, output, model="m", finish_reason="content_filter")[
        "incomplete_details"] == {"reason": "content_filter"}


def test_usage_mapping():
    assert usage_to_responses(None) is None
    assert usage_to_responses({"prompt_tokens": 3, "completion_tokens": 2,
                               "completion_tokens_details": {"reasoning_tokens": 1}}) == {
        "input_tokens": 3, "input_tokens_details": {"cached_tokens": 0}, "output_tokens": 2,
        "output_tokens_details": {"reasoning_tokens": 1}, "total_tokens": 5,
    }


def test_chat_completion_to_response_with_output_logprobs():
    completion = {
        "id": "chatcmpl-1", "object": "chat.completion", "created": 1, "model": "m",
        "choices": [{"index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": "Hi"},
                     "logprobs": {"content": [{"token": "Hi", "logprob": -0.1, "bytes": [72, 105],
                                               "top_logprobs": [{"token": "Hi", "logprob": -0.1, "bytes": None}]}]}}],
        "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
    }
    params = {"input": "x", "top_logprobs": 1}
    assert wants_output_logprobs(params) and not wants_output_logprobs({"input": "x"})
    response = chat_completion_to_response(params, completion, model="m")
    assert response["output"][0]["content"][0]["logprobs"] == [
        {"token": "Hi", "logprob": -0.1, "bytes": [72, 105],
         "top_logprobs": [{"token": "Hi", "logprob": -0.1, "bytes": []}]}
    ]
    openai_validate(response)
    plain = chat_completion_to_response({"input": "x"}, completion, model="m")
    assert "logprobs" not in plain["output"][0]["content"][0]


# ----------------------------------------------------------------------------------------------------------
# Upstream helpers


def test_fold_reasoning_into_content():
    message = {"role": "assistant", "content": "answer", "reasoning_content": "why", "reasoning": "why"}
    folded, did = fold_reasoning_into_content(message)
    assert did and folded == {"role": "assistant", "content": "<think>why</think>answer"}
    assert message["content"] == "answer"  # not mutated
    folded, did = fold_reasoning_into_content({"role": "assistant", "content": None, "reasoning": "only"})
    assert did and folded == {"role": "assistant", "content": "<think>only</think>"}
    folded, did = fold_reasoning_into_content({"role": "assistant", "content": "x", "reasoning_content": None})
    assert not did and folded == {"role": "assistant", "content": "x"}
    plain = {"role": "assistant", "content": "x"}
    assert fold_reasoning_into_content(plain) == (plain, False)


def test_generation_tokens_from_logprobs():
    logprobs = {"content": [{"token": "token_id:15", "logprob": -0.5}, {"token": "token_id:7", "logprob": 0.0}]}
    assert generation_tokens_from_logprobs(logprobs) == ([15, 7], [-0.5, 0.0])
    with pytest.raises(ValueError, match="return_tokens_as_token_ids"):
        generation_tokens_from_logprobs({"content": [{"token": "Hi", "logprob": -0.5}]})
    with pytest.raises(ValueError, match="no per-token logprobs"):
        generation_tokens_from_logprobs(None)


@pytest.mark.parametrize("token", ["Hi", "token_id:1.5", "token_id:true", "token_id:1,token_id:2", "token_id:",
                                   "token_id:[1]", None])
def test_token_ids_of_logprobs_names_a_token_not_of_the_token_id_form(token):
    content = [{"token": "token_id:3", "logprob": -0.1}, {"token": token, "logprob": -0.2}]
    with pytest.raises(ValueError, match="is not of the form 'token_id:<int>'"):
        token_ids_of_logprobs(content)


def test_token_ids_of_logprobs_and_matching_without_a_loop_per_token():
    content = [{"token": f"token_id:{i}", "logprob": -0.5} for i in (7, 150_000, 0)]
    assert token_ids_of_logprobs(content) == [7, 150_000, 0] and token_ids_of_logprobs([]) == []
    assert token_ids_of_logprobs([{"token": 9, "logprob": 0.0}]) == [9]  # ints as some servers send them
    assert logprob_tokens_match(content, [7, 150_000, 0]) and logprob_tokens_match([], [])
    assert not logprob_tokens_match(content, [7, 150_000, 1])
    assert not logprob_tokens_match(content, [7, 150_000])
    assert not logprob_tokens_match(content, ["7", 150_000, 0])
    assert not logprob_tokens_match([{"token": "7"}, {"token": "150000"}, {"token": "0"}], [7, 150_000, 0])


def test_context_length_detection_and_empty_completion():
    assert is_context_length_error(400, '{"message":"This model\'s maximum context length is 4096 tokens."}')
    assert is_context_length_error(400, "max_tokens must be at least 1, got -20.")
    assert is_context_length_error(400, "The input (5000 tokens) is longer than the model's context length")
    assert not is_context_length_error(400, "invalid tool_choice")
    assert not is_context_length_error(500, "maximum context length")
    empty = empty_chat_completion("m", "length")
    ChatCompletion.model_validate(empty)
    response = chat_completion_to_response({"input": "x"}, empty, model="m")
    assert response["incomplete_details"] == {"reason": "max_output_tokens"}
    assert [item["content"][0]["text"] for item in response["output"]] == [""]
