"""A fake LLM backend: a real OpenAI-compatible HTTP server with scripted, deterministic replies.

The LLM is the only part tests may fake (no model is reachable here), and it is faked behind real HTTP so every
framework part in front of it runs for real. Behaviour, for both `/v1/responses` and `/v1/chat/completions`:

- if the request offers tools and the conversation has no tool result yet, call the first tool with the arguments
  given by `--tool-args` (JSON, default `{}`);
- otherwise answer with the message `<reply-prefix><last user text>`.

`--latency-ms` adds a fixed delay per call (for benchmarks). Run: `python -m nemo_gym.testing.fake_openai_server
--port 8000` and point a model server at `http://127.0.0.1:8000/v1`.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import time
from typing import Any

import orjson
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

_ids = itertools.count(1)


def _json(data: Any, status: int = 200) -> Response:
    return Response(orjson.dumps(data), status_code=status, media_type="application/json")


def _last_user_text_responses(items: Any) -> str:
    if isinstance(items, str):
        return items
    for item in reversed(items or []):
        if item.get("role") == "user":
            content = item.get("content")
            if isinstance(content, str):
                return content
            return "".join(part.get("text", "") for part in content or [])
    return ""


def _has_tool_result_responses(items: Any) -> bool:
    return not isinstance(items, str) and any(i.get("type") == "function_call_output" for i in items or [])


def _usage_responses(n_in: int, n_out: int) -> dict:
    return {
        "input_tokens": n_in,
        "input_tokens_details": {"cached_tokens": 0},
        "output_tokens": n_out,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": n_in + n_out,
    }


def build_app(*, tool_args: str = "{}", reply_prefix: str = "echo: ", latency_ms: float = 0.0) -> Starlette:
    delay = latency_ms / 1000.0

    async def responses(request: Request) -> Response:
        body = orjson.loads(await request.body())
        if delay:
            await asyncio.sleep(delay)
        n = next(_ids)
        items = body.get("input")
        tools = [t for t in body.get("tools") or [] if t.get("type") == "function"]
        if tools and not _has_tool_result_responses(items):
            output = [
                {
                    "type": "function_call",
                    "id": f"fc_{n}",
                    "call_id": f"call_{n}",
                    "name": tools[0]["name"],
                    "arguments": tool_args,
                    "status": "completed",
                }
            ]
        else:
            text = reply_prefix + _last_user_text_responses(items)
            output = [
                {
                    "type": "message",
                    "id": f"msg_{n}",
                    "role": "assistant",
                    "status": "completed",
                    "content": [{"type": "output_text", "text": text, "annotations": []}],
                }
            ]
        return _json(
            {
                "id": f"resp_{n}",
                "object": "response",
                "created_at": int(time.time()),
                "model": body.get("model") or "fake-model",
                "output": output,
                "parallel_tool_calls": True,
                "tool_choice": body.get("tool_choice", "auto"),
                "tools": body.get("tools") or [],
                "status": "completed",
                "usage": _usage_responses(10, 5),
            }
        )

    async def chat_completions(request: Request) -> Response:
        body = orjson.loads(await request.body())
        if delay:
            await asyncio.sleep(delay)
        n = next(_ids)
        messages = body.get("messages") or []
        tools = [t for t in body.get("tools") or [] if t.get("type") == "function"]
        has_tool_result = any(m.get("role") == "tool" for m in messages)
        if tools and not has_tool_result:
            message = {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": f"call_{n}",
                        "type": "function",
                        "function": {"name": tools[0]["function"]["name"], "arguments": tool_args},
                    }
                ],
            }
            finish = "tool_calls"
        else:
            last_user = next((m for m in reversed(messages) if m.get("role") == "user"), {})
            content = last_user.get("content") or ""
            if not isinstance(content, str):
                content = "".join(p.get("text", "") for p in content)
            message = {"role": "assistant", "content": reply_prefix + content}
            finish = "stop"
        return _json(
            {
                "id": f"chatcmpl-{n}",
                "object": "chat.completion",
                "created": int(time.time()),
                "model": body.get("model") or "fake-model",
                "choices": [{"index": 0, "message": message, "finish_reason": finish, "logprobs": None}],
                "usage": {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15},
            }
        )

    async def models(request: Request) -> Response:
        return _json({"object": "list", "data": [{"id": "fake-model", "object": "model", "owned_by": "nemo_gym"}]})

    async def health(request: Request) -> Response:
        return _json({"status": "ok"})

    return Starlette(
        routes=[
            Route("/v1/responses", responses, methods=["POST"]),
            Route("/v1/chat/completions", chat_completions, methods=["POST"]),
            Route("/v1/models", models, methods=["GET"]),
            Route("/health", health, methods=["GET"]),
        ]
    )


def main() -> None:
    import uvicorn

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--tool-args", default="{}")
    parser.add_argument("--reply-prefix", default="echo: ")
    parser.add_argument("--latency-ms", type=float, default=0.0)
    args = parser.parse_args()
    app = build_app(tool_args=args.tool_args, reply_prefix=args.reply_prefix, latency_ms=args.latency_ms)
    uvicorn.run(app, host=args.host, port=args.port, log_level="warning", access_log=False)


if __name__ == "__main__":
    main()
