"""A scripted judge model for the tests of judge-based resources servers (an LLM judge is a model server).

    judge = FakeJudge("Both say seven. [[A=B]]", 500)
    server = make_server(MyJudgeServer, name="my_env", server_client=judge.client(),
                         judge_model_server=FakeJudge.server_ref)
    ...
    assert "<answer_a>" in judge.prompt(0) and len(judge.calls) == 2

The resources server's real `ServerClient` calls the judge; only the model behind it is scripted (at the HTTP
transport, so each call is a real request the server built and each reply goes through the client as usual).
"""

from __future__ import annotations

import json
from typing import Any, Callable, Optional

import httpx

from nemo_gym.server_utils import ServerClient
from nemo_gym.testing.responses import make_response

__all__ = ["FakeJudge"]


class FakeJudge:
    """The judge model server `judge` (`FakeJudge.server_ref`): scripted replies, recorded calls.

    A reply is a string (the judge's message text), a dict (a whole Responses object), an int (an HTTP error
    status) or an Exception (raised by the transport). `calls` holds the JSON body of every call, in order."""

    name = "judge"
    server_ref = {"type": "responses_api_models", "name": name}

    def __init__(self, *replies: Any) -> None:
        self.replies = list(replies)
        self.calls: list[dict] = []

    def handler(self, request: httpx.Request) -> httpx.Response:
        """Answer one call to `/v1/responses` with the next reply."""
        assert request.url.path == "/v1/responses"
        self.calls.append(json.loads(request.content))
        reply = self.replies.pop(0)
        if isinstance(reply, Exception):
            raise reply
        if isinstance(reply, int):
            return httpx.Response(reply, json={"error": {"message": "judge overloaded"}})
        if isinstance(reply, str):
            reply = make_response(reply).model_dump(mode="json")
        return httpx.Response(200, json=reply)

    def client(self, handler: Optional[Callable[[httpx.Request], Any]] = None) -> ServerClient:
        """A ServerClient (one attempt per call) that reaches the judge; `handler` replaces the scripted one."""
        config = {self.name: {"responses_api_models": {"openai_model": {"host": "127.0.0.1", "port": 9}}}}
        transport = httpx.MockTransport(handler or self.handler)
        return ServerClient(global_config_dict=config, transport=transport, max_attempts=1)

    def prompt(self, index: int) -> str:
        """The last input message's content of call `index`."""
        return self.calls[index]["input"][-1]["content"]
