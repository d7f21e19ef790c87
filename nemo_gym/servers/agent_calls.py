"""What an agent does with the answers of its inner calls (model, resources server): keep the session cookies
they set, turn an error status into the rollout's failure naming the server, read JSON, add up token usage.

simple_agent and gymnasium_agent share these; an agent of your own can use them too.
"""

from __future__ import annotations

from typing import Any, Optional

import orjson

from nemo_gym.http.client import NeMoGymHTTPError, ServerResponse

__all__ = ["update_cookies", "raise_for_inner_status", "parse_inner_json", "add_usage", "inner_text"]

_ERROR_DETAIL_CHARS = 2000


def inner_text(response: ServerResponse) -> str:
    return response.content.decode("utf-8", errors="replace")


def update_cookies(cookies: dict[str, str], response: ServerResponse) -> None:
    """Take the `Set-Cookie`s of one inner response (name=value only; a Max-Age=0 deletes)."""
    for header in response.headers.getall("set-cookie", ()):
        pair, _, attributes = header.partition(";")
        name, eq, value = pair.partition("=")
        name = name.strip()
        if not eq or not name:
            continue
        if "max-age" in attributes.lower() and _expires_now(attributes):
            cookies.pop(name, None)
        else:
            cookies[name] = value.strip()


def _expires_now(attributes: str) -> bool:
    for attribute in attributes.split(";"):
        key, _, value = attribute.partition("=")
        if key.strip().lower() == "max-age":
            try:
                return int(value.strip()) <= 0
            except ValueError:
                return False
    return False


def raise_for_inner_status(response: ServerResponse, who: str, path: str) -> None:
    """An inner server's HTTP error fails the rollout: 500 from our exception middleware, naming the server."""
    status = response.status
    if status < 400:
        return
    text = inner_text(response)
    if len(text) > _ERROR_DETAIL_CHARS:
        text = text[:_ERROR_DETAIL_CHARS] + "...[truncated]"
    content = f"{who} answered POST {path} with HTTP {status}: {text}"
    raise NeMoGymHTTPError(
        content,
        response=response,
        response_content=content,
        server_name=response.server_name,
        attempts=response.attempts,
        status=status,
        method=response.method,
        url=response.url,
    )


def parse_inner_json(response: ServerResponse, who: str, path: str) -> Any:
    try:
        return orjson.loads(response.content)
    except orjson.JSONDecodeError as exc:
        raise RuntimeError(
            f"{who} answered POST {path} with a body that is not JSON ({exc}): {inner_text(response)[:1000]!r}"
        ) from None


def _count(value: Any) -> int:
    try:
        return int(value or 0)
    except (TypeError, ValueError):
        return 0


def add_usage(total: Optional[dict], usage: Any) -> Optional[dict]:
    """Add one model call's usage to the running total (None until a call reports usage)."""
    if not isinstance(usage, dict):
        return total
    n_in = _count(usage.get("input_tokens"))
    n_out = _count(usage.get("output_tokens"))
    n_total = usage.get("total_tokens")
    n_total = n_in + n_out if n_total is None else _count(n_total)
    in_details = usage.get("input_tokens_details")
    out_details = usage.get("output_tokens_details")
    cached = _count(in_details.get("cached_tokens")) if isinstance(in_details, dict) else 0
    reasoning = _count(out_details.get("reasoning_tokens")) if isinstance(out_details, dict) else 0
    if total is None:
        return {
            "input_tokens": n_in,
            "input_tokens_details": {"cached_tokens": cached},
            "output_tokens": n_out,
            "output_tokens_details": {"reasoning_tokens": reasoning},
            "total_tokens": n_total,
        }
    total["input_tokens"] += n_in
    total["input_tokens_details"]["cached_tokens"] += cached
    total["output_tokens"] += n_out
    total["output_tokens_details"]["reasoning_tokens"] += reasoning
    total["total_tokens"] += n_total
    return total
