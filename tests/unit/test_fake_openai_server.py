"""The scripted fake LLM backend: default mode, rule matching, replies, replay, Chat Completions conversion, and
script errors."""

from __future__ import annotations

import json

import pytest
from starlette.testclient import TestClient

from nemo_gym.testing.fake_openai_server import ScriptError, build_app, load_rules, main


def client(**kwargs) -> TestClient:
    return TestClient(build_app(**kwargs))


def responses(c: TestClient, **body):
    return c.post("/v1/responses", json=body)


def chat(c: TestClient, **body):
    return c.post("/v1/chat/completions", json=body)


TOOL = {"type": "function", "name": "add", "parameters": {"type": "object"}}
CHAT_TOOL = {"type": "function", "function": {"name": "add", "parameters": {"type": "object"}}}


def test_default_mode_is_unchanged():
    c = client(tool_args='{"count": 2}')
    first = responses(c, input="hi", tools=[TOOL]).json()
    assert first["output"][0]["type"] == "function_call" and first["output"][0]["arguments"] == '{"count": 2}'
    items = [{"role": "user", "content": "hi"}, first["output"][0],
             {"type": "function_call_output", "call_id": first["output"][0]["call_id"], "output": "{}"}]
    second = responses(c, input=items, tools=[TOOL]).json()
    assert second["output"][0]["content"][0]["text"] == "echo: hi"
    assert chat(c, messages=[{"role": "user", "content": "yo"}]).json()["choices"][0]["message"]["content"] == "echo: yo"


def test_rules_match_on_text_step_tool_outputs_metadata_and_params():
    rules = [
        {"name": "meta", "match": {"metadata": {"case": "m"}}, "output": ["metadata rule"]},
        {"name": "params", "match": {"params": {"temperature": 0.25}}, "output": ["params rule"]},
        {"name": "regex", "match": {"last_user_regex": "^count to \\d+$", "step": 1}, "output": [
            {"type": "function_call", "name": "add", "arguments": "{\"n\": {{step}}"}]},
        {"name": "second", "match": {"step": 2, "tool_outputs": {"min": 1}, "last_tool_output_contains": "ok"},
         "output": ["step {{step}} saw {{tool_outputs}} result(s): {{last_tool_output}} for {{last_user}}"]},
        {"name": "any-input", "match": {"input_contains": "needle", "tools_include": "add", "has_tools": True}, "output": ["found"]},
    ]
    c = client(script=rules)
    assert responses(c, input="x", metadata={"case": "m"}).json()["output"][0]["content"][0]["text"] == "metadata rule"
    assert responses(c, input="x", temperature=0.25).json()["output"][0]["content"][0]["text"] == "params rule"

    first = responses(c, input="count to 3")
    assert first.headers["x-fake-rule"] == "regex"
    fc = first.json()["output"][0]
    assert fc["arguments"] == '{"n": 1' and fc["call_id"] and fc["id"]  # verbatim, malformed on purpose
    items = [{"role": "user", "content": "count to 3"}, fc, {"type": "function_call_output", "call_id": fc["call_id"], "output": "ok!"}]
    text = responses(c, input=items).json()["output"][0]["content"][0]["text"]
    assert text == "step 2 saw 1 result(s): ok! for count to 3"

    history = [{"role": "system", "content": "the needle is here"}, {"role": "user", "content": "look"}]
    assert responses(c, input=history, tools=[TOOL]).json()["output"][0]["content"][0]["text"] == "found"
    miss = responses(c, input=history)  # has_tools false: nothing matches
    assert miss.status_code == 400
    assert "no script rule matched" in miss.json()["error"]["message"] and '"step":1' in miss.json()["error"]["message"]


def test_step_counts_model_turns_after_the_last_user_message():
    c = client(script=[{"match": {"step": 3}, "output": ["third"]}, {"output": ["other"]}])
    turn = [{"type": "reasoning", "id": "r", "summary": []}, {"type": "function_call", "name": "a", "arguments": "{}", "call_id": "1"},
            {"type": "function_call_output", "call_id": "1", "output": "x"}]
    two_turns = [{"role": "user", "content": "q"}, *turn, *turn]
    assert responses(c, input=two_turns).json()["output"][0]["content"][0]["text"] == "third"
    # an earlier exchange (before the last user message) does not count
    earlier = [{"role": "user", "content": "q0"}, {"role": "assistant", "content": "a0"}, *two_turns]
    assert responses(c, input=earlier).json()["output"][0]["content"][0]["text"] == "third"
    chat_two = [{"role": "user", "content": "q"}, {"role": "assistant", "content": None, "tool_calls": []},
                {"role": "tool", "content": "x"}, {"role": "assistant", "content": "hm"}]
    assert chat(c, messages=chat_two).json()["choices"][0]["message"]["content"] == "third"


def test_replies_usage_incomplete_errors_and_times():
    rules = [
        {"name": "once", "match": {"last_user_contains": "flaky"}, "times": 1, "status": 503, "error_message": "busy"},
        {"name": "steps", "match": {"last_user_contains": "flaky"}, "replies": [
            {"output": [{"type": "reasoning", "text": "hmm"}], "usage": None},
            {"output": ["cut"], "incomplete_details": {"reason": "max_output_tokens"},
             "usage": {"input_tokens": 7, "output_tokens": 3, "total_tokens": 10}},
        ]},
        {"match": {"last_user_contains": "raw"}, "status": 418, "body": {"teapot": True}},
    ]
    c = client(script=rules)
    busy = responses(c, input="flaky")
    assert busy.status_code == 503 and busy.json()["error"]["message"] == "busy"
    first = responses(c, input="flaky").json()
    assert first["usage"] is None and first["output"][0]["type"] == "reasoning"
    assert first["output"][0]["summary"] == [{"type": "summary_text", "text": "hmm"}]
    items = [{"role": "user", "content": "flaky"}, first["output"][0]]
    second = responses(c, input=items).json()
    assert second["status"] == "incomplete" and second["incomplete_details"] == {"reason": "max_output_tokens"}
    third = responses(c, input=[*items, second["output"][0]])
    assert third.status_code == 400 and "has 2 replies" in third.json()["error"]["message"]
    # Chat side: length finish, usage converted
    answer = chat(c, messages=[{"role": "user", "content": "flaky"}, {"role": "assistant", "content": "x"}]).json()
    assert answer["choices"][0]["finish_reason"] == "length"
    assert answer["usage"] == {"prompt_tokens": 7, "completion_tokens": 3, "total_tokens": 10}
    teapot = responses(c, input="raw")
    assert teapot.status_code == 418 and teapot.json() == {"teapot": True}


def test_chat_conversion_of_calls_and_reasoning():
    rules = [{"output": [{"type": "reasoning", "text": "plan"}, {"type": "function_call", "name": "nope", "arguments": "{bad", "call_id": "c1"}]}]
    answer = chat(client(script=rules), messages=[{"role": "user", "content": "go"}], tools=[CHAT_TOOL]).json()
    choice = answer["choices"][0]
    assert choice["finish_reason"] == "tool_calls"
    assert choice["message"] == {
        "role": "assistant", "content": None, "reasoning_content": "plan",
        "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "nope", "arguments": "{bad"}}],
    }


def test_replay_serves_lines_by_step(tmp_path):
    path = tmp_path / "replay.jsonl"
    whole = {"id": "resp_fixed", "object": "response", "created_at": 1, "model": "recorded", "status": "completed",
             "output": [{"type": "message", "id": "m1", "role": "assistant", "status": "completed",
                         "content": [{"type": "output_text", "text": "recorded answer", "annotations": []}]}],
             "usage": {"input_tokens": 1, "output_tokens": 1, "total_tokens": 2}}
    lines = [{"output": [{"type": "function_call", "name": "add", "arguments": {"n": 1}}]}, whole]
    path.write_text("\n".join(json.dumps(line) for line in lines) + "\n\n")
    c = client(replay=str(path))
    first = responses(c, input="a").json()
    assert first["output"][0]["arguments"] == '{"n":1}'
    items = [{"role": "user", "content": "a"}, first["output"][0],
             {"type": "function_call_output", "call_id": first["output"][0]["call_id"], "output": "1"}]
    second = responses(c, input=items).json()
    assert second["id"] == "resp_fixed" and second["model"] == "recorded" and second["output"] == whole["output"]
    # another conversation starts again at line 1
    assert responses(c, input="b").json()["output"][0]["type"] == "function_call"


@pytest.mark.parametrize(
    "rules, message",
    [
        ([{"match": {"last_user": "x"}}], "unknown match keys ['last_user']"),
        ([{"ouput": []}], "unknown rule keys ['ouput']"),
        ([{"status": 200}], "expected an HTTP error status"),
        ([{"match": {"step": "one"}}], "expected an int"),
        ([{"match": {"last_user_regex": "("}}], "bad regular expression"),
        ([{"replies": [{"output": []}], "output": []}], "either `replies` or reply keys"),
        ([{"replies": [{"outputs": []}]}], "replies[0]: unknown reply keys ['outputs']"),
        ([{"times": 0}], "positive int"),
    ],
)
def test_script_errors_name_the_rule_and_key(rules, message):
    with pytest.raises(ScriptError) as err:
        load_rules(rules)
    assert message in str(err.value) and "rule 1" in str(err.value)


def test_script_files_json_and_jsonl(tmp_path):
    as_json = tmp_path / "rules.json"
    as_json.write_text(json.dumps({"rules": [{"output": ["a"]}]}))
    assert len(load_rules(str(as_json))) == 1
    bad = tmp_path / "rules.jsonl"
    bad.write_text('{"output": ["a"]}\n\n{"output": [\n')
    with pytest.raises(ScriptError, match=r"rules.jsonl:3: not valid JSON"):
        load_rules(str(bad))
    with pytest.raises(SystemExit, match="rules.jsonl:3"):
        main(["--script", str(bad)])


def sse(response) -> list:
    """The (event, payload) pairs of a server-sent-events body."""
    from nemo_gym.api.streaming import SSEDecoder

    decoder = SSEDecoder()
    events = [decoder.line(line) for line in response.text.split("\n")]
    return [event for event in events if event is not None]


STREAM_RULES = [
    {"name": "call", "match": {"has_tools": True}, "chunk_delay_ms": 1,
     "output": [{"type": "function_call", "name": "add", "arguments": {"numbers": [1, 2, 3], "note": "sum them"}}]},
    {"name": "think", "match": {"last_user_contains": "think"},
     "output": [{"type": "reasoning", "text": "let me see"}, "The answer is four."]},
    {"name": "broken", "match": {"last_user_contains": "break"}, "status": 503, "error_message": "busy"},
    {"name": "text", "output": ["one two three four"]},
]


def test_streamed_chat_completions_split_text_and_arguments_into_chunks():
    from nemo_gym.api.streaming import DONE

    c = client(script=STREAM_RULES)
    unstreamed = chat(c, messages=[{"role": "user", "content": "hi"}]).json()["choices"][0]["message"]["content"]
    answer = chat(c, messages=[{"role": "user", "content": "hi"}], stream=True)
    assert answer.headers["content-type"].startswith("text/event-stream") and answer.headers["x-fake-rule"] == "text"
    events = sse(answer)
    assert events[-1] == (None, DONE)
    chunks = [payload for _, payload in events[:-1]]
    assert all(chunk["object"] == "chat.completion.chunk" for chunk in chunks)
    texts = [ch["choices"][0]["delta"].get("content") for ch in chunks if ch["choices"]]
    assert texts[0] == "" and len([t for t in texts if t]) == 4 and "".join(t or "" for t in texts) == unstreamed
    assert chunks[-1]["choices"][0]["finish_reason"] == "stop" and "usage" not in chunks[-1]  # usage not asked

    events = sse(chat(c, messages=[{"role": "user", "content": "hi"}], tools=[CHAT_TOOL], stream=True,
                      stream_options={"include_usage": True}))
    chunks = [payload for _, payload in events[:-1]]
    calls = [call for ch in chunks if ch["choices"] for call in ch["choices"][0]["delta"].get("tool_calls") or ()]
    assert calls[0]["id"] and calls[0]["function"]["name"] == "add"
    arguments = [call["function"]["arguments"] for call in calls[1:]]
    assert len(arguments) > 1 and json.loads("".join(arguments)) == {"numbers": [1, 2, 3], "note": "sum them"}
    assert [ch["choices"][0]["finish_reason"] for ch in chunks if ch["choices"]][-1] == "tool_calls"
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"] == {"prompt_tokens": 10, "completion_tokens": 5,
                                                                   "total_tokens": 15}
    app = c.app
    assert [(r["rule"], r["state"], r["endpoint"]) for r in app.state.streams.records] == [
        ("text", "completed", "chat_completions"), ("call", "completed", "chat_completions")]
    again = sse(chat(c, messages=[{"role": "user", "content": "hi"}], stream=True))
    assert app.state.streams.records[0]["sent"] == len(again)


def test_streamed_responses_are_the_responses_event_sequence():
    c = client(script=STREAM_RULES)
    events = sse(responses(c, input="think hard", stream=True))
    kinds = [name for name, _ in events]
    assert all(name == payload["type"] for name, payload in events)
    assert [payload["sequence_number"] for _, payload in events] == list(range(len(events)))
    assert kinds[:3] == ["response.created", "response.in_progress", "response.output_item.added"]
    assert kinds[-1] == "response.completed"
    assert kinds.count("response.reasoning_summary_text.delta") == 3 and kinds.count("response.output_text.delta") == 4
    final = events[-1][1]["response"]
    text = "".join(p["delta"] for name, p in events if name == "response.output_text.delta")
    assert text == final["output"][1]["content"][0]["text"] == "The answer is four."
    assert final["output"][0]["summary"] == [{"type": "summary_text", "text": "let me see"}]
    done = [p["item"] for name, p in events if name == "response.output_item.done"]
    assert done == final["output"]  # the items as streamed are the final ones

    events = sse(responses(c, input="x", tools=[TOOL], stream=True))
    pieces = [p["delta"] for name, p in events if name == "response.function_call_arguments.delta"]
    assert len(pieces) > 1 and json.loads("".join(pieces)) == {"numbers": [1, 2, 3], "note": "sum them"}
    assert events[-1][1]["response"]["output"][0]["arguments"] == "".join(pieces)


def test_a_streamed_error_is_plain_json_with_its_status():
    c = client(script=STREAM_RULES)
    answer = responses(c, input="break", stream=True)
    assert answer.status_code == 503 and answer.json()["error"]["message"] == "busy"
    assert c.app.state.streams.records == []
    with pytest.raises(ScriptError, match=r"unknown rule keys \['chunk_delay'\]"):
        load_rules([{"output": ["x"], "chunk_delay": 5}])
    with pytest.raises(ScriptError, match="pause_after_chunks: expected"):
        load_rules([{"output": ["x"], "pause_after_chunks": "soon"}])
