"""What one request may take of a server: the size of its body, the size of its head (request line and headers),
how long its head may take to arrive, how long its body may stop arriving, and how long its client may stop
reading the answer.

Why each limit: a body or a head is held in memory whole before anything looks at it, so without a cap one client
can make a server grow without bound; and httptools gathers a header arriving in many reads by joining the pieces,
so a 200 MB header kept a server's event loop busy for 47 s (every other request waited). A head or a body that
never finishes (a client sending a byte now and then, or nothing more) holds a connection and its memory for ever:
uvicorn starts no timer until a first answer has gone out. So does an answer its client stopped reading: uvicorn
waits for the socket to drain for ever, and a streaming model server kept its call to the backend open.

The limits come from the server's config block, else the global config, else the defaults here. `ng_run` starts
each server with its own; a multi-worker server hands them to its uvicorn workers in the environment
(`export_to_env` / `RequestLimits.from_env`), which is how the workers, importing the protocol afresh, read them.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Optional

from nemo_gym.config.values import byte_count, config_get, is_mapping, seconds

__all__ = [
    "RequestLimits",
    "request_limits",
    "too_large_body",
    "head_too_large_body",
    "head_too_slow_body",
    "body_too_slow_body",
    "MAX_REQUEST_BODY_BYTES_KEY_NAME",
    "MAX_REQUEST_HEAD_BYTES_KEY_NAME",
    "REQUEST_HEAD_TIMEOUT_KEY_NAME",
    "REQUEST_BODY_TIMEOUT_KEY_NAME",
    "DEFAULT_MAX_REQUEST_BODY_BYTES",
    "DEFAULT_MAX_REQUEST_HEAD_BYTES",
    "DEFAULT_REQUEST_HEAD_TIMEOUT_S",
    "DEFAULT_REQUEST_BODY_TIMEOUT_S",
    "RESPONSE_SEND_TIMEOUT_KEY_NAME",
    "DEFAULT_RESPONSE_SEND_TIMEOUT_S",
]

MAX_REQUEST_BODY_BYTES_KEY_NAME = "max_request_body_bytes"
MAX_REQUEST_HEAD_BYTES_KEY_NAME = "max_request_head_bytes"
REQUEST_HEAD_TIMEOUT_KEY_NAME = "request_head_timeout_s"
REQUEST_BODY_TIMEOUT_KEY_NAME = "request_body_timeout_s"
RESPONSE_SEND_TIMEOUT_KEY_NAME = "response_send_timeout_s"

# Larger than any rollout we have seen (a long multi-turn trajectory with token ids and log probs is a few MB), small
# enough that a stray upload cannot take a server's memory.
DEFAULT_MAX_REQUEST_BODY_BYTES = 32 * 1024 * 1024
# Our clients send a few hundred bytes of head (a session cookie per server is about 150); nginx takes 32 KB at most
# by default, h11 16 KB. 64 KiB leaves room for many cookies and long proxy headers.
DEFAULT_MAX_REQUEST_HEAD_BYTES = 64 * 1024
# nginx's client_header_timeout. A head is sent in one write by every client we know; a minute is generous.
DEFAULT_REQUEST_HEAD_TIMEOUT_S = 60.0
# nginx's client_body_timeout: the longest a body may stop arriving (between two reads, not for the whole body).
DEFAULT_REQUEST_BODY_TIMEOUT_S = 60.0
# nginx's send_timeout: the longest a client may read nothing of an answer once the socket's buffers are full (a
# stream it stopped reading held the answer, and a model server's call to its backend, for ever).
DEFAULT_RESPONSE_SEND_TIMEOUT_S = 60.0

_ENV_VARS = {
    "max_body": "NEMO_GYM_MAX_REQUEST_BODY_BYTES",
    "max_head": "NEMO_GYM_MAX_REQUEST_HEAD_BYTES",
    "head_timeout_s": "NEMO_GYM_REQUEST_HEAD_TIMEOUT_S",
    "body_timeout_s": "NEMO_GYM_REQUEST_BODY_TIMEOUT_S",
    "send_timeout_s": "NEMO_GYM_RESPONSE_SEND_TIMEOUT_S",
}


@dataclass(frozen=True)
class RequestLimits:
    """The limits one server holds every request to (None: no limit)."""

    max_body: Optional[int] = DEFAULT_MAX_REQUEST_BODY_BYTES
    max_head: Optional[int] = DEFAULT_MAX_REQUEST_HEAD_BYTES
    head_timeout_s: Optional[float] = DEFAULT_REQUEST_HEAD_TIMEOUT_S
    body_timeout_s: Optional[float] = DEFAULT_REQUEST_BODY_TIMEOUT_S
    send_timeout_s: Optional[float] = DEFAULT_RESPONSE_SEND_TIMEOUT_S

    @classmethod
    def from_env(cls) -> "RequestLimits":
        """The limits a parent process exported (`export_to_env`); the default for each one it did not."""
        values: dict[str, Any] = {}
        for field, name in _ENV_VARS.items():
            text = os.environ.get(name, "")
            try:
                if text:
                    values[field] = float(text) if field.endswith("_s") else int(text)
            except ValueError:
                pass
        return cls(**values)

    def export_to_env(self) -> None:
        """Hand these limits to the uvicorn workers this process starts next (they read `from_env`)."""
        for field, name in _ENV_VARS.items():
            value = getattr(self, field)
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = str(value)


# Each limit: its RequestLimits field, its config key, how the key's value reads, its default, what it limits.
_KEYS = (
    ("max_body", MAX_REQUEST_BODY_BYTES_KEY_NAME, byte_count, DEFAULT_MAX_REQUEST_BODY_BYTES,
     "the largest request body a server reads"),
    ("max_head", MAX_REQUEST_HEAD_BYTES_KEY_NAME, byte_count, DEFAULT_MAX_REQUEST_HEAD_BYTES,
     "the largest request line and headers a server reads"),
    ("head_timeout_s", REQUEST_HEAD_TIMEOUT_KEY_NAME, seconds, DEFAULT_REQUEST_HEAD_TIMEOUT_S,
     "how long a server waits for a request's headers"),
    ("body_timeout_s", REQUEST_BODY_TIMEOUT_KEY_NAME, seconds, DEFAULT_REQUEST_BODY_TIMEOUT_S,
     "how long a request's body may stop arriving"),
    ("send_timeout_s", RESPONSE_SEND_TIMEOUT_KEY_NAME, seconds, DEFAULT_RESPONSE_SEND_TIMEOUT_S,
     "how long a client may read nothing of an answer"),
)


def request_limits(global_config_dict: Any = None, server_config: Any = None) -> RequestLimits:
    """The limits of one server: its own block's keys, else the global config's, else the defaults. A value that
    is not a positive number is a config error naming the key."""

    def pick(key: str) -> Any:
        own = config_get(server_config, key) if is_mapping(server_config) else getattr(server_config, key, None)
        return own if own is not None else config_get(global_config_dict, key)

    return RequestLimits(**{
        field: read({key: pick(key)}, key, default, limits=what) for field, key, read, default, what in _KEYS
    })


def _refusal(reason: str, key: str) -> bytes:
    """A refusal's JSON body: one line that says what was refused and which key changes the limit."""
    return f'{{"detail":"{reason} ({key} in the server\'s config block, or globally)"}}'.encode()


def too_large_body(size: str, limit: int) -> bytes:
    """The 413 answer's JSON body."""
    return _refusal(f"request body too large: {size} over this server's limit of {limit} bytes",
                    MAX_REQUEST_BODY_BYTES_KEY_NAME)


def head_too_large_body(limit: int) -> bytes:
    """The 431 answer's JSON body."""
    return _refusal(f"request line and headers too large: more than this server's limit of {limit} bytes",
                    MAX_REQUEST_HEAD_BYTES_KEY_NAME)


def head_too_slow_body(timeout_s: float) -> bytes:
    """The 408 answer's JSON body when a request's headers did not arrive in time."""
    return _refusal(f"request headers not complete within {timeout_s:g} s", REQUEST_HEAD_TIMEOUT_KEY_NAME)


def body_too_slow_body(timeout_s: float) -> bytes:
    """The 408 answer's JSON body when a request body stopped arriving."""
    return _refusal(f"request body stopped arriving for {timeout_s:g} s", REQUEST_BODY_TIMEOUT_KEY_NAME)
