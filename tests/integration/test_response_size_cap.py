"""The cap on response bodies (`http_client_max_response_body_bytes`) against a real peer process that answers far
more than the cap: through each transport (lean, aiohttp, httpx) the client fails with the clear error (server,
URL, size seen, the key to raise) after one attempt, and its memory does not grow by the body."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

from nemo_gym.testing.stack import free_port, wait_http_ok

BODY = 512 * 1024 * 1024  # what the peer offers: far over the cap, and over anything the client may buffer
CAP = 1024 * 1024

PEER = textwrap.dedent(
    """
    import sys
    import uvicorn
    from fastapi import FastAPI
    from fastapi.responses import Response, StreamingResponse

    app = FastAPI()
    CHUNK = b"x" * 65536

    @app.get("/health")
    async def health():
        return {"ok": True}

    @app.get("/huge")
    async def huge(declared: bool = False):
        n = int(sys.argv[2])
        async def parts():
            for _ in range(n // len(CHUNK)):
                yield CHUNK
        headers = {"content-length": str(n)} if declared else None
        return StreamingResponse(parts(), media_type="application/octet-stream", headers=headers)

    uvicorn.run(app, host="127.0.0.1", port=int(sys.argv[1]), log_level="warning")
    """
)

CLIENT = textwrap.dedent(
    """
    import asyncio, json, resource, sys
    from nemo_gym.http.client import ResponseTooLargeError, ServerClient, close_global_client

    port, transport, cap = int(sys.argv[1]), sys.argv[2], int(sys.argv[3])
    cfg = {
        "http_client_transport": transport,
        "http_client_max_response_body_bytes": cap,
        "peer": {"resources_servers": {"peer": {"host": "127.0.0.1", "port": port}}},
    }

    def rss_kib():
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss

    async def main():
        client = ServerClient(global_config_dict=cfg)
        await client.get("peer", "/health")  # warm: the shared transport exists before measuring
        results = []
        for declared in (False, True):
            before = rss_kib()
            try:
                await client.get("peer", "/huge?declared=" + ("true" if declared else "false"))
                results.append({"declared": declared, "error": None})
            except ResponseTooLargeError as exc:
                results.append({"declared": declared, "error": str(exc), "attempts": exc.attempts, "size": exc.size,
                                "server": exc.server_name, "grew_kib": rss_kib() - before})
        await close_global_client()
        print(json.dumps(results))

    asyncio.run(main())
    """
)


@pytest.fixture(scope="module")
def peer():
    port = free_port()
    process = subprocess.Popen([sys.executable, "-c", PEER, str(port), str(BODY)])
    try:
        wait_http_ok(f"http://127.0.0.1:{port}/health", timeout=60)
        yield port
    finally:
        process.terminate()
        process.wait(10)


@pytest.mark.parametrize("transport", ["lean", "aiohttp", "httpx"])
def test_a_body_over_the_cap_is_refused_without_being_buffered(peer, transport):
    run = subprocess.run(
        [sys.executable, "-c", CLIENT, str(peer), transport, str(CAP)], capture_output=True, text=True, timeout=300
    )
    assert run.returncode == 0, run.stderr
    results = json.loads(run.stdout.strip().splitlines()[-1])
    for result in results:
        message = result["error"]
        assert message is not None, f"{transport}: a {BODY}-byte body was read whole under a {CAP}-byte cap"
        assert result["attempts"] == 1 and result["server"] == "peer"
        assert f"GET http://127.0.0.1:{peer}/huge" in message and "server `peer`" in message
        assert "http_client_max_response_body_bytes" in message
        if result["declared"]:
            assert result["size"] == BODY and f"Content-Length {BODY}" in message
        else:
            assert CAP < result["size"] < BODY and "at least" in message
        # Memory: the peak grew by far less than the body (at most the cap and some read buffers).
        assert result["grew_kib"] < 64 * 1024, f"{transport}: peak RSS grew by {result['grew_kib']} KiB"
