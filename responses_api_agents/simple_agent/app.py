"""simple_agent: the default multi-step tool-calling loop (NeMo Gym v0.2 `simple_agent`, with its quirks fixed).

`POST /v1/responses` runs one episode and answers with one Responses object whose `output` holds every item the
model generated plus every tool result, and whose `usage` is the sum over the model calls. `POST /run` takes one
dataset row: `/seed_session` on the resources server with the whole row, the episode, `/verify` with the row plus
`response`; the answer is the verifier's JSON with every row field it did not echo merged back in.

The loop, per step (one model call):

1. POST `<model_server>/v1/responses` with the request's parameters and `input` = the original input (a string
   becomes one user message) + everything generated and returned so far.
2. Append the response's `output` items; add its `usage` (once; a missing or null usage adds nothing).
3. Stop if the response has any `incomplete_details` (e.g. `max_output_tokens`); its function calls, possibly
   cut off, are not executed.
4. Collect the step's `function_call` items. None: stop if the step produced an assistant message or nothing at
   all; otherwise (reasoning only) go on to the next step.
5. Run every function call in order: POST `<resources_server>/<name>` with the parsed JSON arguments and the
   rollout's cookies, append `{"type": "function_call_output", "call_id", "output"}`. A successful reply's body
   text is the output. Malformed arguments, an unknown tool, a tool answering 4xx/5xx and a tool timeout become
   an error output the model can read (`{"error": ..., "tool": ..., "status": ...}`); the episode goes on.
6. If `max_steps` is set and this was model call number `max_steps`: stop. Checked after the tool calls ran, so
   the final step's tool calls take effect and their results are in `output`, but the model gets no turn to read
   them.

Cookies: one dict per rollout, filled from every `Set-Cookie` of every inner call (cookie names are unique per
server, so the resources server's and the model server's sessions travel together) and sent with every inner call.
`/v1/responses` hands the collected cookies back on its own response; `/run` threads them into `/verify`.

`POST /aggregate_metrics` is passed on to the resources server (NeMo Gym v0.5), whose hooks know the task.

Hot path: inner replies are parsed once with orjson and handled as plain dicts; nothing is re-validated with
pydantic here (the resources server's `/verify` validates the final response once). `/run` runs the episode
in-process instead of calling its own `/v1/responses` over HTTP.
"""

from __future__ import annotations

import re
from typing import Any, Optional

import httpx
import orjson
from fastapi import Body, Request
from fastapi.responses import Response
from pydantic import Field

from nemo_gym.base_responses_api_agent import (
    AggregateMetrics,
    AggregateMetricsRequest,
    AgentRunRequest,
    AgentVerifyResponse,
    BaseResponsesAPIAgentConfig,
    SimpleResponsesAPIAgent,
)
from nemo_gym.config_types import ModelServerRef, ResourcesServerRef
from nemo_gym.openai_utils import NeMoGymResponse, NeMoGymResponseCreateParamsNonStreaming
from nemo_gym.http.client import NeMoGymHTTPError  # noqa: F401  (importable from here, as before)
from nemo_gym.rollouts.aggregation_parts import AggregationFailed, post_aggregate_metrics
from nemo_gym.servers.agent_calls import add_usage, inner_text, parse_inner_json, raise_for_inner_status, update_cookies

__all__ = ["SimpleAgentConfig", "SimpleAgentRunRequest", "SimpleAgentVerifyResponse", "SimpleAgent"]

# Routes every resources server has that are not tools: a model must not reach them by naming a "tool".
RESERVED_ROUTE_NAMES = frozenset({"seed_session", "verify", "health", "aggregate_metrics", "docs", "redoc", "openapi.json"})
# A tool name becomes one URL path segment.
_TOOL_NAME_RE = re.compile(r"^[A-Za-z0-9_:\-][A-Za-z0-9_.:\-]{0,255}$")
_ERROR_DETAIL_CHARS = 2000
_TOOL_CONNECT_TIMEOUT = 10.0


class SimpleAgentConfig(BaseResponsesAPIAgentConfig):
    """`resources_server` and `model_server` are server references; `datasets` is inherited.

    `max_steps`: at most this many model calls per episode (None: until the model stops by itself).
    `tool_timeout_seconds`: a tool call that has not answered after this long becomes an error output
    (None: wait as long as it takes, like the reference)."""

    resources_server: ResourcesServerRef
    model_server: ModelServerRef
    max_steps: Optional[int] = Field(default=None, ge=1)
    tool_timeout_seconds: Optional[float] = Field(default=None, gt=0)


class SimpleAgentRunRequest(AgentRunRequest):
    """A `/run` body: `responses_create_params` plus every other field of the dataset row (all kept)."""


class SimpleAgentVerifyResponse(AgentVerifyResponse):
    """A `/run` answer: the verifier's fields plus the row's fields the verifier did not echo."""


class SimpleAgent(SimpleResponsesAPIAgent):
    config: SimpleAgentConfig

    # -- routes ----------------------------------------------------------------------------------------------

    async def responses(
        self, request: Request, body: NeMoGymResponseCreateParamsNonStreaming = Body()
    ) -> NeMoGymResponse:
        # FastAPI validated the body (strict: unknown keys are a 422); work on the JSON it already parsed.
        params = orjson.loads(await request.body())
        cookies = dict(request.cookies)
        result = await self.run_episode(params, cookies)
        response = _json_response(result)
        own = self.get_session_cookie_name()  # the session middleware sets ours
        for name, value in cookies.items():
            if name != own:
                response.set_cookie(name, value)
        return response

    async def run(self, request: Request, body: SimpleAgentRunRequest) -> SimpleAgentVerifyResponse:
        row = orjson.loads(await request.body())
        cookies = dict(request.cookies)
        resources = self.config.resources_server.name
        client = self.server_client

        seeded = await client.post(resources, "/seed_session", json=row, cookies=cookies)
        raise_for_inner_status(seeded, f"resources server `{resources}`", "/seed_session")
        update_cookies(cookies, seeded)

        if type(self).responses is SimpleAgent.responses:
            response = await self.run_episode(row["responses_create_params"], cookies)
        else:  # a subclass customised /v1/responses: go through it, as the reference always does
            answered = await client.post(self.config.name, "/v1/responses", json=row["responses_create_params"], cookies=cookies)
            raise_for_inner_status(answered, f"agent `{self.config.name}`", "/v1/responses")
            update_cookies(cookies, answered)
            response = parse_inner_json(answered, f"agent `{self.config.name}`", "/v1/responses")

        verified = await client.post(resources, "/verify", json={**row, "response": response}, cookies=cookies)
        raise_for_inner_status(verified, f"resources server `{resources}`", "/verify")
        result = parse_inner_json(verified, f"resources server `{resources}`", "/verify")
        if not isinstance(result, dict):
            raise RuntimeError(f"resources server `{resources}` answered /verify with a non-object: {inner_text(verified)[:500]}")
        # Output rows keep every input field: the verifier's values win, row fields it dropped come back.
        return _json_response({**row, **result})

    async def aggregate_metrics(self, body: AggregateMetricsRequest) -> AggregateMetrics:
        """`/aggregate_metrics` is the resources server's: it knows the task (pass@k, majority@k, ...)."""
        resources = self.config.resources_server.name
        try:  # in parts when they are many: one request of them all could be over the server's body limit
            answer = await post_aggregate_metrics(self.server_client, resources, body.verify_responses)
        except AggregationFailed as exc:
            raise RuntimeError(f"resources server `{resources}` gave no /aggregate_metrics: {exc}") from None
        return _json_response(answer)

    # -- the episode -----------------------------------------------------------------------------------------

    async def run_episode(self, params: dict, cookies: dict[str, str]) -> dict:
        """Run the loop for these Responses create params (a plain dict). `cookies` is updated in place with
        every inner server's session cookie. Returns the final Responses object as a dict."""
        max_steps = self.config.max_steps
        original = input_items(params)
        new_outputs: list = []
        usage: Optional[dict] = None
        step = 0
        last: dict = {}

        while True:
            step += 1
            last = await self.call_model({**params, "input": original + new_outputs}, cookies)
            output = last["output"]
            new_outputs.extend(output)
            usage = add_usage(usage, last.get("usage"))

            if last.get("incomplete_details"):
                break
            calls = []
            answered = False
            for item in output:
                if not isinstance(item, dict):
                    continue
                kind = item.get("type")
                if kind == "function_call":
                    calls.append(item)
                elif item.get("role") == "assistant" and kind in (None, "message"):
                    answered = True
            if not calls:
                if answered or not output:  # an empty output would be asked again identically: stop
                    break
            else:
                for call in calls:
                    new_outputs.append(await self.call_tool(call, cookies))
            if max_steps is not None and step >= max_steps:
                break

        result = dict(last)
        result["output"] = new_outputs
        result["usage"] = usage
        return result

    async def call_model(self, params: dict, cookies: dict[str, str]) -> dict:
        """One model call: POST `params` to the model server's `/v1/responses` with the rollout's cookies (updated
        in place); returns the Responses object as a dict, checked to hold an `output` list."""
        model = self.config.model_server.name
        sent = await self.server_client.post(model, "/v1/responses", json=params, cookies=cookies)
        raise_for_inner_status(sent, f"model server `{model}`", "/v1/responses")
        update_cookies(cookies, sent)
        answer = parse_inner_json(sent, f"model server `{model}`", "/v1/responses")
        if not isinstance(answer, dict) or not isinstance(answer.get("output"), list):
            raise RuntimeError(
                f"model server `{model}` answered /v1/responses without an `output` list: {inner_text(sent)[:1000]}"
            )
        return answer

    async def call_tool(self, call: dict, cookies: dict[str, str]) -> dict:
        """Run one function call against the resources server; always returns a `function_call_output`."""
        name = call.get("name")
        call_id = call.get("call_id") or call.get("id") or ""

        def error(message: str, status: Optional[int] = None, detail: Any = None) -> dict:
            payload: dict = {"error": message, "tool": name}
            if status is not None:
                payload["status"] = status
            if detail is not None:
                payload["detail"] = detail
            return {"type": "function_call_output", "call_id": call_id, "output": orjson.dumps(payload).decode()}

        if not isinstance(name, str) or not _TOOL_NAME_RE.match(name) or name in RESERVED_ROUTE_NAMES:
            return error(f"unknown tool {name!r}: not a tool name this environment accepts")

        arguments = call.get("arguments")
        if isinstance(arguments, str):
            if not arguments.strip():
                payload: Any = {}
            else:
                try:
                    payload = orjson.loads(arguments)
                except orjson.JSONDecodeError as exc:
                    return error(f"the arguments are not valid JSON ({exc}); no call was made")
        elif arguments is None:
            payload = {}
        else:
            payload = arguments
        if not isinstance(payload, dict):
            return error(f"the arguments must be a JSON object, got {type(payload).__name__}; no call was made")

        resources = self.config.resources_server.name
        kwargs: dict = {"json": payload, "cookies": cookies}
        timeout = self.config.tool_timeout_seconds
        if timeout is not None:
            kwargs["timeout"] = httpx.Timeout(connect=_TOOL_CONNECT_TIMEOUT, read=timeout, write=timeout, pool=None)
        try:
            reply = await self.server_client.post(resources, "/" + name, **kwargs)
        except (httpx.ReadTimeout, httpx.WriteTimeout) as exc:
            return error(f"the tool did not answer within {timeout} s ({type(exc).__name__})")
        update_cookies(cookies, reply)

        status = reply.status
        text = inner_text(reply)
        if status < 400:
            return {"type": "function_call_output", "call_id": call_id, "output": text}
        detail = _error_detail(text)
        if status == 405 or (status == 404 and detail == {"detail": "Not Found"}):  # no such route
            return error(f"unknown tool {name!r}: the resources server has no such tool", status)
        if status == 422:
            return error("invalid arguments for this tool", status, detail)
        return error(f"the tool failed with HTTP {status}", status, detail)


# --------------------------------------------------------------------------------------------------------
# Helpers


def input_items(params: dict) -> list:
    """The request's `input` as a list of items (a string is one user message)."""
    original = params.get("input")
    if isinstance(original, str):
        return [{"role": "user", "content": original}]
    if not isinstance(original, list):
        return list(original or ())
    return original


def _json_response(data: Any) -> Response:
    return Response(orjson.dumps(data), media_type="application/json")


def _error_detail(text: str) -> Any:
    try:
        detail = orjson.loads(text)
    except orjson.JSONDecodeError:
        detail = text
    if len(text) > _ERROR_DETAIL_CHARS:
        return text[:_ERROR_DETAIL_CHARS] + "...[truncated]"
    return detail


if __name__ == "__main__":
    SimpleAgent.run_webserver()
