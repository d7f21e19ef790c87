"""A streaming backend cannot make a model server's memory grow without bound: one server-sent event, and an error
answer read for its message, are held to `http_client_max_response_body_bytes`; a long stream of small events is
not (a real backend app served on a thread, both transports)."""

import asyncio

import pytest
from starlette.applications import Starlette
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route

from nemo_gym.http.openai_client import NeMoGymOpenAIError
from nemo_gym.http.response import ResponseTooLargeError
from nemo_gym.http.sse_client import upstream_sse
from nemo_gym.http.transports import close_global_client
from nemo_gym.testing.live_server import live_server

CAP = 64 * 1024


async def endless_line(request):
    async def body():
        yield b"data: "
        for _ in range(10_000):  # 10 MB with no line end, unless the client stops reading
            yield b"x" * 1024

    return StreamingResponse(body(), media_type="text/event-stream")


async def many_small_events(request):
    async def body():
        for i in range(2_000):  # 2,000 events of ~70 bytes: far more than CAP in all
            yield b'data: {"i": %d, "pad": "%s"}\n\n' % (i, b"y" * 48)
        yield b"data: [DONE]\n\n"

    return StreamingResponse(body(), media_type="text/event-stream")


async def huge_error(request):
    return Response(b"e" * (8 * 1024 * 1024), status_code=500, media_type="text/plain")


APP = Starlette(routes=[Route("/endless", endless_line, methods=["POST"]),
                        Route("/many", many_small_events, methods=["POST"]),
                        Route("/error", huge_error, methods=["POST"])])


@pytest.fixture(scope="module")
def backend():
    with live_server(APP) as url:
        yield url


@pytest.fixture(params=["lean", "aiohttp", "httpx"])
def config(request):
    return {"http_client_max_response_body_bytes": CAP, "http_client_transport": request.param}


def _events(url, config):
    async def run():
        try:
            return [event async for event in upstream_sse(url, {"stream": True}, global_config=config)]
        finally:
            await close_global_client()

    return asyncio.run(run())


def test_an_event_that_never_ends_is_cut_at_the_cap(backend, config):
    with pytest.raises(ResponseTooLargeError, match="http_client_max_response_body_bytes") as caught:
        _events(f"{backend}/endless", config)
    assert CAP < caught.value.size < CAP + 1024 * 1024  # within one read of the cap (10 MB were on offer)


def test_a_long_stream_of_small_events_is_not_cut(backend, config):
    if config["http_client_transport"] == "httpx":
        pytest.skip("the httpx transport caps every body as a whole, streams included (transports.CappedHTTPTransport)")
    events = _events(f"{backend}/many", config)
    assert len(events) == 2_001 and events[0][1]["i"] == 0


def test_an_error_answer_is_read_only_up_to_the_cap(backend, config):
    if config["http_client_transport"] == "httpx":  # it refuses a declared length over the cap before the status
        with pytest.raises(ResponseTooLargeError, match="declared Content-Length"):
            _events(f"{backend}/error", config)
        return
    with pytest.raises(NeMoGymOpenAIError) as caught:
        _events(f"{backend}/error", config)
    assert caught.value.response.status_code == 500
    assert 0 < len(caught.value.response.content) <= CAP
