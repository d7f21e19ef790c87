"""xlam_fc: function calling scored by matching the calls the model made against the expected calls.

Each row offers some tools (`responses_create_params.tools`) and lists the calls a correct answer makes
(`expected_answers`, in the xLAM function-calling format: `{"name": ..., "arguments": {...}}`). The server
implements none of the tools: `verify` only compares the `function_call` items in the model's output.

Matching is greedy: each expected call, in order, takes the first not-yet-used predicted call with the same name
whose arguments contain every expected argument with an equal value (extra predicted arguments are tolerated).
reward = 1.0 iff every expected call was matched and the model made no other calls.

What it teaches: scoring tool calls without executing them, and treating every malformed call as a wrong call
rather than an error.

Note for rollouts with simple_agent: the agent still posts each call to this server, which answers 404 (the tool
does not exist here); the model gets an error as the tool output, and the episode ends when it writes a message.
"""

import json
from typing import Any

from fastapi import FastAPI
from pydantic import field_validator

from nemo_gym.base_resources_server import (
    BaseResourcesServerConfig,
    BaseRunRequest,
    BaseVerifyRequest,
    BaseVerifyResponse,
    SimpleResourcesServer,
)


class XlamFcResourcesServerConfig(BaseResourcesServerConfig):
    pass


def parse_arguments(arguments: Any) -> dict[str, Any]:
    """Call arguments as a dict: a dict is used as is, a JSON object string is parsed. Anything else (invalid
    JSON, a JSON array or number, null) counts as no arguments at all."""
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments)
        except (ValueError, RecursionError):
            return {}
    return arguments if isinstance(arguments, dict) else {}


class XlamFcRunRequest(BaseRunRequest):
    # [{"name": "get_weather", "arguments": {"city": "Oslo"}}, ...]; arguments may also be a JSON object string.
    expected_answers: list[dict[str, Any]] = []

    @field_validator("expected_answers")
    @classmethod
    def _check_expected_answers(cls, answers: list[dict[str, Any]]) -> list[dict[str, Any]]:
        # A typo in the dataset should fail loudly (422, and in data validation), not silently score 0 forever.
        for index, answer in enumerate(answers):
            if not isinstance(answer.get("name"), str):
                raise ValueError(f"expected_answers[{index}] needs a string 'name'")
            arguments = answer.get("arguments", {})
            if isinstance(arguments, str):
                try:
                    arguments = json.loads(arguments)
                except ValueError as error:
                    raise ValueError(f"expected_answers[{index}].arguments is not valid JSON: {error}") from None
            if not isinstance(arguments, dict):
                raise ValueError(f"expected_answers[{index}].arguments must be a JSON object")
        return answers


class XlamFcVerifyRequest(XlamFcRunRequest, BaseVerifyRequest):
    pass


class XlamFcVerifyResponse(XlamFcVerifyRequest, BaseVerifyResponse):
    num_expected: int
    num_predicted: int
    num_correct: int
    predicted_calls: list[dict[str, Any]]  # every call the model made, arguments parsed


def json_equal(a: Any, b: Any) -> bool:
    """Equality of JSON values: like `==`, except that a boolean never equals a number (`True == 1` in Python)."""
    if isinstance(a, bool) or isinstance(b, bool):
        return isinstance(a, bool) and isinstance(b, bool) and a == b
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(json_equal(a[key], b[key]) for key in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(json_equal(x, y) for x, y in zip(a, b))
    return a == b


def call_matches(predicted: dict[str, Any], expected: dict[str, Any]) -> bool:
    """Same name, and every expected argument present in the prediction with an equal value."""
    if predicted["name"] != expected["name"]:
        return False
    predicted_arguments = predicted["arguments"]
    return all(
        key in predicted_arguments and json_equal(predicted_arguments[key], value)
        for key, value in parse_arguments(expected.get("arguments", {})).items()
    )


def count_matches(predicted: list[dict[str, Any]], expected: list[dict[str, Any]]) -> int:
    """Greedy one-to-one matching: each expected call takes the first unused predicted call that matches it."""
    used: set[int] = set()
    for expected_call in expected:
        for index, predicted_call in enumerate(predicted):
            if index not in used and call_matches(predicted_call, expected_call):
                used.add(index)
                break
    return len(used)


class XlamFcResourcesServer(SimpleResourcesServer):
    config: XlamFcResourcesServerConfig

    def setup_webserver(self) -> FastAPI:
        return super().setup_webserver()  # the tools are only described to the model, never run

    async def verify(self, body: XlamFcVerifyRequest) -> XlamFcVerifyResponse:
        predicted = [
            {"name": item.name, "arguments": parse_arguments(item.arguments)}
            for item in body.response.output
            if item.type == "function_call"
        ]
        expected = body.expected_answers
        num_correct = count_matches(predicted, expected)
        # All expected calls matched and nothing else called (with nothing expected: no call at all).
        reward = 1.0 if num_correct == len(expected) == len(predicted) else 0.0
        return XlamFcVerifyResponse(
            **body.model_dump(),
            reward=reward,
            num_expected=len(expected),
            num_predicted=len(predicted),
            num_correct=num_correct,
            predicted_calls=predicted,
        )


if __name__ == "__main__":
    XlamFcResourcesServer.run_webserver()
