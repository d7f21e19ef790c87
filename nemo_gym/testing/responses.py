"""Builders for Responses API data in tests: the items of a model's output and whole responses.

    from nemo_gym.testing.responses import function_call, make_response, message

    response = make_response(function_call("get_weather", {"city": "Oslo"}), "It is cold in Oslo.")

Items are the plain dicts a model server returns and a verify request carries (tool outputs too); a plain string
given to `make_response` stands for an assistant message with that text. The ids are fixed (`msg_1`, `call_1`,
`rs_1`, `resp_1`) unless given, so tests can compare whole dicts.
"""

from __future__ import annotations

import json
from typing import Any, Union

from nemo_gym.openai_utils import NeMoGymResponse

__all__ = [
    "function_call",
    "function_call_output",
    "make_response",
    "message",
    "reasoning",
]


def _json_text(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value)


def message(*texts: str, msg_id: str = "msg_1") -> dict:
    """An assistant output message with one `output_text` part per text."""
    return {
        "id": msg_id,
        "type": "message",
        "role": "assistant",
        "status": "completed",
        "content": [{"type": "output_text", "text": text, "annotations": []} for text in texts],
    }


def function_call(name: str, arguments: Any, call_id: str = "call_1") -> dict:
    """A function call item; `arguments` is sent verbatim when it is a string (malformed JSON too), else as JSON."""
    return {"type": "function_call", "name": name, "arguments": _json_text(arguments), "call_id": call_id}


def function_call_output(output: Any, call_id: str = "call_1") -> dict:
    """A tool result item; `output` is sent verbatim when it is a string, else as JSON."""
    return {"type": "function_call_output", "call_id": call_id, "output": _json_text(output)}


def reasoning(*texts: str, item_id: str = "rs_1") -> dict:
    """A reasoning item with one `summary_text` part per text (no text: an empty summary)."""
    return {"id": item_id, "type": "reasoning", "summary": [{"type": "summary_text", "text": text} for text in texts]}


def make_response(
    *output: Union[str, dict], response_id: str = "resp_1", model: str = "test-model", **fields: Any
) -> NeMoGymResponse:
    """A finished `NeMoGymResponse` with these output items; a string is an assistant message (`message(text)`).
    `fields` are further response fields (`usage`, `incomplete_details`, ...)."""
    items = [message(item) if isinstance(item, str) else item for item in output]
    return NeMoGymResponse(id=response_id, created_at=0, model=model, output=items, **fields)
