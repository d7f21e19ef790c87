"""single_step_tool_use_with_argument_comparison: is the model's next step the expert's next step?

Each row is a conversation cut at one point of an expert trajectory (earlier turns, tool calls and tool outputs are
in `responses_create_params.input`) plus the action the expert took next (`expected_action`): either a chat
message or one tool call. The model produces one step; `verify` compares it with the expert's:

* expert wrote a message: any text message from the model earns 1.0, a tool call earns 0.0;
* expert called a tool: the model must call the same tool, with arguments that match the expert's value by value.
  Strings of two words or more only need enough words in common (`word_count_similarity_threshold`), so a search
  query phrased a little differently still counts; numbers match within `floating_point_comparison_threshold`.

Every verdict comes with a `category` that says why, e.g. "The tool in a tool call is not the expected tool",
which makes reward profiles easy to read.

What it teaches: an all-or-nothing yet tolerant comparison of structured values, and a label for every outcome.
"""

import json
from collections import Counter
from enum import Enum
from typing import Annotated, Any, Literal, Optional, Union

from fastapi import FastAPI
from pydantic import BaseModel, Field, field_validator

from nemo_gym.base_resources_server import (
    BaseResourcesServerConfig,
    BaseRunRequest,
    BaseVerifyRequest,
    BaseVerifyResponse,
    SimpleResourcesServer,
)

# ------------------------------------------------------------------------------------------------------ config


class ToolCallComparatorConfig(BaseModel):
    # A pair of strings (each of 2+ words) matches when |common words| / (|words A| + |words B|) >= this.
    # The score is at most 0.5 (identical word multisets), so useful thresholds lie between 0.0 and 0.5.
    word_count_similarity_threshold: float
    # Two numbers match when they differ by less than this (when either is fractional).
    floating_point_comparison_threshold: float = 1e-6


class SingleStepToolUseArgumentComparisonResourcesServerConfig(BaseResourcesServerConfig):
    tool_call_comparator_config: ToolCallComparatorConfig


# ------------------------------------------------------------------------------------------------------ request


class ExpectedMessage(BaseModel):
    type: Literal["message"]
    content: str


class ExpectedFunctionCall(BaseModel):
    type: Literal["function_call"]
    name: str
    arguments: str  # a JSON object, as text (the way the Responses API carries call arguments)

    @field_validator("arguments")
    @classmethod
    def _must_be_a_json_object(cls, arguments: str) -> str:
        try:
            parsed = json.loads(arguments)
        except ValueError as error:
            raise ValueError(f"expected_action.arguments is not valid JSON: {error}") from None
        if not isinstance(parsed, dict):
            raise ValueError("expected_action.arguments must be a JSON object")
        return arguments


ExpectedAction = Annotated[Union[ExpectedMessage, ExpectedFunctionCall], Field(discriminator="type")]


class SingleStepToolUseArgumentComparisonRunRequest(BaseRunRequest):
    expected_action: ExpectedAction


class SingleStepToolUseArgumentComparisonVerifyRequest(
    SingleStepToolUseArgumentComparisonRunRequest, BaseVerifyRequest
):
    pass


class StepRewardCategory(str, Enum):
    """Why a step got its reward. The texts are the reference's, so reward profiles group the same way."""

    NO_ACTION_FOUND = "No tool call or chat message was found in the response"
    NO_EXPECTED_TOOL_CALL = "No tool call was found when one was expected"
    EXPECTED_CHAT_MESSAGE_FOUND = "A chat message was found as expected"
    NO_EXPECTED_CHAT_MESSAGE = "A tool call was executed when a chat message was expected"
    UNEXPECTED_TOOL = "The tool in a tool call is not the expected tool"
    ARGUMENTS_DECODE_ERROR = "An error occurred when decoding the arguments string in a tool call as a JSON object"
    ARGUMENT_VALUE_TYPE_DIFFERENT = "The type of an argument value in a tool call is different than the expected type"
    ARGUMENT_OBJECT_KEYS_DIFFERENT = (
        "The keys in an object in an argument value in a tool call are different than the keys in the expected object"
    )
    ARGUMENT_LIST_LENGTH_DIFFERENT = (
        "A list in an argument value in a tool call has a different length than the expected list"
    )
    ARGUMENT_VALUE_DIFFERENT = "An argument value in a tool call is different than the expected value"
    EXPECTED_TOOL_CALL = "A tool call that matches the expected tool call was found"


class SingleStepToolUseArgumentComparisonVerifyResponse(
    SingleStepToolUseArgumentComparisonVerifyRequest, BaseVerifyResponse
):
    category: StepRewardCategory


# ------------------------------------------------------------------------------------------------------ comparison


def first_action(body: BaseVerifyRequest) -> Optional[Any]:
    """The model's step: its first tool call anywhere in the output; failing that, the first text part of its
    first assistant message (as an `ExpectedMessage`-like object); None if there is neither."""
    for item in body.response.output:
        if item.type == "function_call":
            return item
    for item in body.response.output:
        if item.type == "message" and item.role == "assistant":
            if isinstance(item.content, str):
                return ExpectedMessage(type="message", content=item.content)
            for part in item.content:
                part_type = part.get("type") if isinstance(part, dict) else part.type
                if part_type == "output_text":
                    text = part["text"] if isinstance(part, dict) else part.text
                    return ExpectedMessage(type="message", content=text)
            return None  # the first assistant message has no text (e.g. only a refusal)
    return None


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def compare_values(expected: Any, actual: Any, config: ToolCallComparatorConfig) -> Optional[StepRewardCategory]:
    """None when `actual` matches `expected`, else the category of the first difference found."""
    if _is_number(expected):
        # JSON has one number type: 2 and 2.0 are the same value.
        if not _is_number(actual):
            return StepRewardCategory.ARGUMENT_VALUE_TYPE_DIFFERENT
        if isinstance(expected, float) or isinstance(actual, float):
            close = abs(actual - expected) < config.floating_point_comparison_threshold
            return None if close else StepRewardCategory.ARGUMENT_VALUE_DIFFERENT
        return None if actual == expected else StepRewardCategory.ARGUMENT_VALUE_DIFFERENT

    if type(actual) is not type(expected):  # bool vs number, str vs list, dict vs null, ...
        return StepRewardCategory.ARGUMENT_VALUE_TYPE_DIFFERENT

    if isinstance(expected, dict):
        if expected.keys() != actual.keys():
            return StepRewardCategory.ARGUMENT_OBJECT_KEYS_DIFFERENT
        for key, expected_value in expected.items():
            category = compare_values(expected_value, actual[key], config)
            if category is not None:
                return category
        return None

    if isinstance(expected, list):
        if len(expected) != len(actual):
            return StepRewardCategory.ARGUMENT_LIST_LENGTH_DIFFERENT
        for expected_item, actual_item in zip(expected, actual):
            category = compare_values(expected_item, actual_item, config)
            if category is not None:
                return category
        return None

    if isinstance(expected, str):
        expected_words = Counter(expected.strip().lower().split())
        actual_words = Counter(actual.strip().lower().split())
        expected_total, actual_total = expected_words.total(), actual_words.total()
        if expected_total < 2 or actual_total < 2:
            # A single word (or nothing) leaves no room for paraphrase: exact match.
            return None if actual == expected else StepRewardCategory.ARGUMENT_VALUE_DIFFERENT
        common = (expected_words & actual_words).total()
        similarity = common / (expected_total + actual_total)
        if similarity >= config.word_count_similarity_threshold:
            return None
        return StepRewardCategory.ARGUMENT_VALUE_DIFFERENT

    # booleans and null
    return None if actual == expected else StepRewardCategory.ARGUMENT_VALUE_DIFFERENT


def compare_action(expected: Any, actual: Any, config: ToolCallComparatorConfig) -> tuple[float, StepRewardCategory]:
    if actual is None:
        return 0.0, StepRewardCategory.NO_ACTION_FOUND

    if isinstance(expected, ExpectedMessage):
        if isinstance(actual, ExpectedMessage):
            return 1.0, StepRewardCategory.EXPECTED_CHAT_MESSAGE_FOUND
        return 0.0, StepRewardCategory.NO_EXPECTED_CHAT_MESSAGE

    if isinstance(actual, ExpectedMessage):
        return 0.0, StepRewardCategory.NO_EXPECTED_TOOL_CALL
    if actual.name != expected.name:
        return 0.0, StepRewardCategory.UNEXPECTED_TOOL
    try:
        actual_arguments = json.loads(actual.arguments)
    except (ValueError, RecursionError):
        return 0.0, StepRewardCategory.ARGUMENTS_DECODE_ERROR
    category = compare_values(json.loads(expected.arguments), actual_arguments, config)
    if category is not None:
        return 0.0, category
    return 1.0, StepRewardCategory.EXPECTED_TOOL_CALL


class SingleStepToolUseArgumentComparisonResourcesServer(SimpleResourcesServer):
    config: SingleStepToolUseArgumentComparisonResourcesServerConfig

    def setup_webserver(self) -> FastAPI:
        return super().setup_webserver()  # one step only: the tools are never run

    async def verify(
        self, body: SingleStepToolUseArgumentComparisonVerifyRequest
    ) -> SingleStepToolUseArgumentComparisonVerifyResponse:
        reward, category = compare_action(
            body.expected_action, first_action(body), self.config.tool_call_comparator_config
        )
        return SingleStepToolUseArgumentComparisonVerifyResponse(**body.model_dump(), reward=reward, category=category)


if __name__ == "__main__":
    SingleStepToolUseArgumentComparisonResourcesServer.run_webserver()
