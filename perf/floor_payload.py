"""The payload floor (issue 36): `perf/floor_stack.py`'s floor doing the training-mode weather task's relaying.

The same 3 bare `asyncio.Protocol` servers, HTTP client pool and GC tuning as `floor_stack.py` (imported from it);
only the routes differ, so that the floor moves the same bytes over the same hops as the stack of
`perf/payload_scaling.py` (weather_tool_use + vllm_model in training mode + simple_agent) and does nothing else:

- model proxy `/v1/responses`: parses the request (on the second call it holds the first call's token arrays, as
  the stack's does), turns its input into chat messages and its tools into chat tools, asks the backend's
  `/v1/chat/completions` for the token data (`logprobs`, `return_tokens_as_token_ids`, `return_token_ids`), parses
  the answer once and builds the Response: a reasoning / message / function_call item per part of the chat
  message, the token arrays (NeMo RL's bundle on the message; else the engine's top-level `prompt_token_ids` +
  `choices[0].token_ids` with the log probs of `logprobs.content`) attached by reference to the last item;
  serialized once;
- agent `/run`: `floor_stack.agent_routes` as it is (seed, model call, tool calls, ..., `/verify` with the whole
  rollout, answer `{**row, **verified}`);
- resources `/get_weather`: weather_tool_use's report for the city; `/verify`: parses the rollout once, scores it
  the way weather_tool_use does (called the tool, for the right city, the final text states the report) and
  answers the rollout with the reward fields, serialized once.

Served by `floor_stack.py --payload`; `start_floor(..., payload=True)` starts it.
"""

from __future__ import annotations

import time

import orjson

from floor_stack import Pool
from floor_stack import agent_routes as lean_agent_routes

REPORTS = {"oslo": (-4, "freezing fog"), "nairobi": (23, "thunderstorms"), "lima": (17, "drizzle"),
           "reykjavik": (2, "sleet"), "cairo": (36, "sandstorm"), "hanoi": (31, "monsoon rain"),
           "montreal": (-12, "blowing snow"), "lisbon": (19, "sea mist")}
_TOKEN_KEYS = ("prompt_token_ids", "generation_token_ids", "generation_log_probs")


def _text(content) -> str:
    if isinstance(content, str):
        return content
    return "".join(part.get("text") or "" for part in content or ())


def chat_messages(items) -> list:
    """Responses input items as chat messages: consecutive generated items (message, reasoning, function calls)
    become one assistant message; function_call_output -> a tool message; token fields are left behind."""
    if isinstance(items, str):
        return [{"role": "user", "content": items}]
    messages, assistant = [], None
    for item in items:
        kind = item.get("type")
        if kind == "function_call":
            if assistant is None:
                assistant = {"role": "assistant", "content": None}
                messages.append(assistant)
            assistant.setdefault("tool_calls", []).append(
                {"id": item["call_id"], "type": "function",
                 "function": {"name": item["name"], "arguments": item["arguments"]}})
        elif kind == "reasoning":
            if assistant is None:
                assistant = {"role": "assistant", "content": None}
                messages.append(assistant)
            assistant["reasoning_content"] = "".join(s.get("text") or "" for s in item.get("summary") or ())
        elif kind == "function_call_output":
            assistant = None
            messages.append({"role": "tool", "tool_call_id": item["call_id"], "content": item["output"]})
        elif item.get("role") == "assistant":
            if assistant is None:
                assistant = {"role": "assistant", "content": None}
                messages.append(assistant)
            assistant["content"] = (assistant["content"] or "") + _text(item.get("content"))
        else:
            assistant = None
            messages.append({"role": item.get("role", "user"), "content": _text(item.get("content"))})
    return messages


def response_of(completion: dict, model: str, n: int) -> dict:
    """The Response of a chat completion, with its token arrays on the last output item (not copied)."""
    choice = completion["choices"][0]
    message = choice["message"]
    output = []
    if message.get("reasoning_content"):
        output.append({"type": "reasoning", "id": f"rs_{n}", "summary": [
            {"type": "summary_text", "text": message["reasoning_content"]}]})
    if message.get("content"):
        output.append({"type": "message", "id": f"msg_{n}", "role": "assistant", "status": "completed",
                       "content": [{"type": "output_text", "text": message["content"], "annotations": []}]})
    for call in message.get("tool_calls") or ():
        output.append({"type": "function_call", "id": call["id"], "call_id": call["id"], "status": "completed",
                       "name": call["function"]["name"], "arguments": call["function"]["arguments"]})
    last = output[-1]
    if "generation_token_ids" in message:  # NeMo RL's bundle
        for key in _TOKEN_KEYS:
            last[key] = message[key]
    else:  # vLLM's engine ids and its logprobs list
        last["prompt_token_ids"] = completion["prompt_token_ids"]
        last["generation_token_ids"] = choice["token_ids"]
        last["generation_log_probs"] = [entry["logprob"] for entry in choice["logprobs"]["content"]]
    usage = completion.get("usage") or {}
    return {"id": f"resp_{n}", "object": "response", "created_at": int(time.time()), "model": model,
            "status": "completed", "output": output,
            "usage": {"input_tokens": usage.get("prompt_tokens", 0), "output_tokens": usage.get("completion_tokens", 0),
                      "total_tokens": usage.get("total_tokens", 0)}}


def model_routes(upstream: str, model_name: str, pool: int) -> tuple[dict, Pool]:
    llm = Pool(upstream, pool, b"Authorization: Bearer dummy\r\n")
    counter = iter(range(1, 1 << 62))

    async def responses(body) -> bytes:
        params = orjson.loads(body)
        chat = {"model": model_name, "messages": chat_messages(params["input"]),
                "logprobs": True, "return_tokens_as_token_ids": True, "return_token_ids": True}
        tools = [{"type": "function", "function": {k: t[k] for k in ("name", "description", "parameters", "strict")
                                                   if k in t}} for t in params.get("tools") or ()]
        if tools:
            chat["tools"] = tools
        completion = orjson.loads(await llm.post(b"/v1/chat/completions", orjson.dumps(chat)))
        return orjson.dumps(response_of(completion, model_name, next(counter)))

    return {b"/v1/responses": responses}, llm


def resources_routes() -> dict:
    def seed_session(body) -> bytes:
        return b"{}"

    def get_weather(body) -> bytes:
        city = orjson.loads(body)["city"]
        temperature, condition = REPORTS.get(city.casefold(), (10, "clear skies"))
        return orjson.dumps({"city": city, "temperature_c": temperature, "condition": condition})

    def verify(body) -> bytes:
        rollout = orjson.loads(body)
        expected = rollout.get("expected_city", "").casefold()
        cities, final = [], ""
        for item in rollout["response"]["output"]:
            kind = item.get("type")
            if kind == "function_call" and item.get("name") == "get_weather":
                cities.append(orjson.loads(item["arguments"]).get("city", ""))
                final = ""
            elif kind == "message":
                final += _text(item.get("content"))
        report = REPORTS.get(expected, (10, "clear skies"))
        components = {"called_tool": float(bool(cities)),
                      "right_city": float(any(c.casefold() == expected for c in cities)),
                      "used_tool_output": float(report[1] in final or str(report[0]) in final)}
        reward = 1.0 if all(components.values()) else 0.0
        return orjson.dumps({**rollout, "reward": reward, "reward_components": components, **components,
                             "called_cities": cities})

    return {b"/seed_session": seed_session, b"/get_weather": get_weather, b"/verify": verify}


def agent_routes(model_url: str, resources_url: str, pool: int) -> dict:
    return lean_agent_routes(model_url, resources_url, pool)
