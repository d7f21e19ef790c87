"""example_multi_step: a task that takes several tool calls, scored from the calls themselves.

The prompt gives a glossary (terms, each with a list of synonyms) and a question that points at one term. The model
must look up the value of each of that term's synonyms with `get_synonym_value` (one call per synonym), then report
all the values, in the listed order, in a single `extract_synonym_values` call. A synonym's value is the sum of its
characters' code points, so the model cannot guess it: it has to call the tool.

What it teaches:

* several tools on one server, and a tool whose only purpose is to carry the final answer
  (`extract_synonym_values` does nothing; `verify` reads its arguments from the trajectory);
* reading `function_call` items out of `response.output` in `verify`, and parsing their arguments with the very
  model the tool route uses, so the verifier and the tool agree on what a valid call is;
* per-row dataset fields (`expected_synonym_values`, ...) declared on the run request;
* metrics besides the reward (`accuracy`, `set_overlap`, ...).
"""

from typing import Optional, Union

from fastapi import FastAPI
from pydantic import BaseModel, ValidationError

from nemo_gym.base_resources_server import (
    BaseResourcesServerConfig,
    BaseRunRequest,
    BaseVerifyRequest,
    BaseVerifyResponse,
    SimpleResourcesServer,
)


class ExampleMultiStepResourcesServerConfig(BaseResourcesServerConfig):
    pass


# --------------------------------------------------------------------------------------------------------- tools


class GetSynonymValueRequest(BaseModel):
    synonym: str


class GetSynonymValueResponse(BaseModel):
    synonym_value: int


class ExtractSynonymValuesRequest(BaseModel):
    synonym_values: list[int]


class ExtractSynonymValuesResponse(BaseModel):
    success: bool


def synonym_value(synonym: str) -> int:
    """The value of a word: the sum of the code points of its characters (`"Warm"` -> 407)."""
    return sum(ord(char) for char in synonym)


# -------------------------------------------------------------------------------------------------------- verify


class ExampleMultiStepRunRequest(BaseRunRequest):
    """The dataset row. Only `expected_synonym_values` decides the reward; the rest feeds the metrics."""

    id: Optional[Union[int, str]] = None
    expected_synonym_values: list[int]
    expected_synonyms: list[str] = []
    # The term the question points at. Reporting its own value instead of its synonyms' is a typical mistake.
    minefield_label: Optional[str] = None
    minefield_label_value: Optional[int] = None


class ExampleMultiStepVerifyRequest(ExampleMultiStepRunRequest, BaseVerifyRequest):
    pass


class ExampleMultiStepVerifyResponse(ExampleMultiStepVerifyRequest, BaseVerifyResponse):
    parsed_synonym_values: list[int]  # what the last extract_synonym_values call reported ([] if none)
    accuracy: bool  # same values, same order
    set_overlap: float  # share of the distinct expected values that were reported
    original_term_minefield_hit: bool  # the term's own value was reported
    order_instruction_following_failure: bool  # every expected value present, yet not the exact list


EXTRACT_TOOL_NAME = "extract_synonym_values"


def last_reported_values(body: BaseVerifyRequest) -> list[int]:
    """The values of the *last* `extract_synonym_values` call in the trajectory.

    A rollout without that call, or whose last call has arguments the tool would reject (not JSON, no
    `synonym_values`, not a list of integers), reported nothing: `[]`.
    """
    for item in reversed(body.response.output):
        if item.type == "function_call" and item.name == EXTRACT_TOOL_NAME:
            try:
                return ExtractSynonymValuesRequest.model_validate_json(item.arguments).synonym_values
            except ValidationError:
                return []
    return []


class ExampleMultiStepResourcesServer(SimpleResourcesServer):
    config: ExampleMultiStepResourcesServerConfig

    def setup_webserver(self) -> FastAPI:
        app = super().setup_webserver()
        app.post("/get_synonym_value")(self.get_synonym_value)
        app.post(f"/{EXTRACT_TOOL_NAME}")(self.extract_synonym_values)
        return app

    async def get_synonym_value(self, body: GetSynonymValueRequest) -> GetSynonymValueResponse:
        return GetSynonymValueResponse(synonym_value=synonym_value(body.synonym))

    async def extract_synonym_values(self, body: ExtractSynonymValuesRequest) -> ExtractSynonymValuesResponse:
        # Nothing to do: the call's arguments are the answer, and verify reads them from the trajectory.
        return ExtractSynonymValuesResponse(success=True)

    async def verify(self, body: ExampleMultiStepVerifyRequest) -> ExampleMultiStepVerifyResponse:
        expected = body.expected_synonym_values
        reported = last_reported_values(body)

        accuracy = reported == expected
        distinct_expected = set(expected)
        if distinct_expected:
            set_overlap = len(distinct_expected & set(reported)) / len(distinct_expected)
        else:  # nothing was expected, so nothing is missing
            set_overlap = 1.0
        minefield_hit = body.minefield_label_value is not None and body.minefield_label_value in reported

        return ExampleMultiStepVerifyResponse(
            **body.model_dump(),
            reward=float(accuracy),
            parsed_synonym_values=reported,
            accuracy=accuracy,
            set_overlap=set_overlap,
            original_term_minefield_hit=minefield_hit,
            order_instruction_following_failure=not accuracy and set_overlap == 1.0,
        )


if __name__ == "__main__":
    ExampleMultiStepResourcesServer.run_webserver()
