"""The official MCP client against a running server, for tests of `expose_tools_over_mcp` (ours and yours).

mcp 1.x and 2.x build the streamable-HTTP transport differently (2.x on httpx2, 1.x on httpx; releases before
1.2x only take `headers=`), and name result attributes differently; these two helpers hide both.
"""

from __future__ import annotations

from contextlib import asynccontextmanager
from importlib.metadata import version
from typing import Any, AsyncIterator, Optional

from nemo_gym.servers.mcp_exposure import TOKEN_HEADER

__all__ = ["mcp_session", "wire"]


@asynccontextmanager
async def mcp_session(url: str, token: Optional[str] = None) -> AsyncIterator[Any]:
    """An initialised `mcp.ClientSession` over streamable HTTP at `url`, sending `token` in the session token
    header (what a resources server's `/seed_session` answer hands out under `mcp`)."""
    from mcp import ClientSession
    from mcp.client import streamable_http

    headers = {TOKEN_HEADER: token} if token else {}
    if not hasattr(streamable_http, "streamable_http_client"):
        transport = streamable_http.streamablehttp_client(url, headers=headers)
    else:
        http = __import__("httpx2" if int(version("mcp").split(".")[0]) >= 2 else "httpx")
        client = http.AsyncClient(headers=headers, timeout=30)
        transport = streamable_http.streamable_http_client(url, http_client=client)
    async with transport as streams:
        async with ClientSession(streams[0], streams[1]) as session:
            await session.initialize()
            yield session


def wire(result: Any) -> dict:
    """An MCP result as its JSON-RPC fields."""
    return result.model_dump(by_alias=True, exclude_none=True, mode="json")
