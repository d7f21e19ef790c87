"""Building a server under test and calling its `verify` directly, the way `resources_servers/*/tests` do.

    from nemo_gym.testing.servers import Verifier, make_server

    def new_server() -> MCQAResourcesServer:
        return make_server(MCQAResourcesServer, name="mcqa", domain="knowledge")

    verify = Verifier(new_server, MCQAVerifyRequest, PARAMS, options=OPTIONS, expected_answer="B")

    def test_boxed_letter():
        assert verify(r"\\boxed{B}").reward == 1.0
        assert verify(r"\\boxed{B}", expected_answer="A").reward == 0.0

The server is real (its own config class, a real `ServerClient`); only what the test hands it is made up.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any, Callable, Optional, TypeVar, Union

from nemo_gym.server_utils import ServerClient
from nemo_gym.testing.responses import make_response

__all__ = ["Verifier", "example_rows", "make_server", "make_server_client", "server_config"]

ServerT = TypeVar("ServerT")


def make_server_client(global_config: Optional[dict] = None) -> ServerClient:
    """A real ServerClient that finds servers in `global_config` only (no head server). By default the config is
    empty: for a server that calls no other; pass the dict `live_servers` fills to reach servers a test serves."""
    return ServerClient(head_server_config=None, global_config_dict={} if global_config is None else global_config)


def server_config(config_cls: type, name: str, **fields: Any) -> Any:
    """`config_cls` as a test builds it: host 127.0.0.1, port 0, entrypoint app.py, `name`, then `fields`."""
    return config_cls(host="127.0.0.1", port=0, entrypoint="app.py", name=name, **fields)


def make_server(
    server_cls: type[ServerT], *, name: str, server_client: Optional[ServerClient] = None, **config_fields: Any
) -> ServerT:
    """`server_cls` with a minimal config of its own config class (see `server_config`; `config_fields` are the
    server's fields, e.g. `domain`) and `server_client` (default: `make_server_client()`)."""
    config_cls = server_cls.model_fields["config"].annotation
    return server_cls(
        config=server_config(config_cls, name, **config_fields),
        server_client=server_client or make_server_client(),
    )


def example_rows(test_file: Union[str, Path], file_name: str = "example.jsonl") -> list[dict]:
    """The rows of a server's `data/<file_name>`, found from one of its test modules (`__file__`)."""
    path = Path(test_file).resolve().parents[1] / "data" / file_name
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


class Verifier:
    """Scores model output with a server's `verify`, called directly (no HTTP).

    `new_server` builds the server for a call that names none; `request_cls` is the server's verify request;
    `params` are the rows' `responses_create_params` (None: only whole rows are verified, see `verify_row`) and
    `defaults` the other row fields, which a call's own fields override. The output items of a call become the response as in `make_response` (a string is an
    assistant message)."""

    def __init__(self, new_server: Callable[[], Any], request_cls: type, params: Optional[dict] = None, **defaults):
        self.new_server = new_server
        self.request_cls = request_cls
        self.params = params
        self.defaults = defaults

    def fields(self, *output: Any, **fields: Any) -> dict:
        """The request's fields: params, the response made of `output` (unless `response` is given), the defaults,
        then `fields`."""
        merged = {} if self.params is None else {"responses_create_params": self.params}
        merged.update(self.defaults)
        merged.update(fields)
        if "response" not in merged:
            merged["response"] = make_response(*output)
        return merged

    def request(self, *output: Any, **fields: Any) -> Any:
        """The verify request (a `request_cls`) of `fields(*output, **fields)`."""
        return self.request_cls.model_validate(self.fields(*output, **fields))

    def body(self, *output: Any, **fields: Any) -> dict:
        """The same as JSON, for `POST /verify` (not validated, so a test can send a broken one)."""
        return json.loads(json.dumps(self.fields(*output, **fields), default=_dump))

    def row_request(self, row: dict, *output: Any) -> Any:
        """A dataset row (as in `data/*.jsonl`) as the verify request, with a response made of `output`."""
        return self.request_cls.model_validate({**row, "response": make_response(*output)})

    def __call__(self, *output: Any, server: Any = None, **fields: Any) -> Any:
        """`verify` of `server` (default: a new one) on `request(*output, **fields)`."""
        return self.run(self.request(*output, **fields), server)

    def verify_row(self, row: dict, *output: Any, server: Any = None) -> Any:
        """`verify` of `server` (default: a new one) on `row_request(row, *output)`."""
        return self.run(self.row_request(row, *output), server)

    def run(self, request: Any, server: Any = None) -> Any:
        """`verify` of `server` (default: a new one) on a request already built."""
        return asyncio.run((server or self.new_server()).verify(request))


def _dump(value: Any) -> Any:
    if hasattr(value, "model_dump"):
        return value.model_dump(mode="json")
    raise TypeError(f"not JSON serializable: {value!r}")
