"""instruction_following: IFEval-style verifiable instructions ("answer in fewer than 50 words", "no commas",
"wrap the answer in JSON", ...), each checked by code, no judge model.

There are no tools. A row lists its instructions (`instruction_id_list`) with an aligned list of arguments
(`kwargs`); `verify` takes the model's final answer and runs one checker per instruction (see
`instructions.py`, where `INSTRUCTION_REGISTRY` maps each id to its checker class).

reward, by `grading_mode`:
  - `binary` (default): 1.0 iff every instruction is followed, else 0.0;
  - `fraction`: the fraction of instructions followed.
An unknown instruction id or kwargs a checker does not accept make the request invalid (422 over HTTP; a
validation error naming the row, the id and the closest known id in `ng_prepare_data` and `ng_test`, which check
data rows with this request model): a misconfigured row never grades as a silent 0. A checker that fails while
checking counts as not followed, with the reason in `instruction_errors`. A row with no instructions scores 0.0.

This is the pattern for a verifier made of many small independent checks: a registry of checkers, one result per
check in the response (`follow_instruction_list`) next to the aggregated reward, and the configuration of every
check validated with the request.
"""

from typing import Any, Literal, Optional, Union

from fastapi import FastAPI
from pydantic import model_validator

from nemo_gym.base_resources_server import (
    BaseResourcesServerConfig,
    BaseRunRequest,
    BaseVerifyRequest,
    BaseVerifyResponse,
    SimpleResourcesServer,
)
from resources_servers.instruction_following.instructions import (
    INSTRUCTION_REGISTRY,
    check_instruction,
    validate_instructions,
)

__all__ = [
    "INSTRUCTION_REGISTRY",
    "InstructionFollowingResourcesServer",
    "InstructionFollowingResourcesServerConfig",
    "InstructionFollowingRunRequest",
    "InstructionFollowingVerifyRequest",
    "InstructionFollowingVerifyResponse",
    "final_answer_text",
]


class InstructionFollowingResourcesServerConfig(BaseResourcesServerConfig):
    pass


class InstructionFollowingRunRequest(BaseRunRequest):
    id: Optional[Union[int, str]] = None  # the row's id, carried along
    instruction_id_list: list[str]  # e.g. ["punctuation:no_comma", "length_constraints:number_words"]
    # One entry per instruction id, in the same order: that checker's arguments, or null when it takes none.
    # Null values inside an entry are dropped (IFEval exports list every kwarg name with null for unused ones).
    # A missing list, or a list shorter than the ids, means null for the instructions without an entry.
    kwargs: Optional[list[Optional[dict[str, Any]]]] = None
    prompt: Optional[str] = None  # the prompt text as given to the model; carried along, not graded
    grading_mode: Literal["binary", "fraction"] = "binary"

    @model_validator(mode="after")
    def _instructions_can_be_built(self):
        # Every id must be known and its kwargs accepted by its checker: raises a ValueError naming each problem.
        validate_instructions(self.instruction_id_list, self.kwargs, self.id)
        return self


class InstructionFollowingVerifyRequest(InstructionFollowingRunRequest, BaseVerifyRequest):
    pass


class InstructionFollowingVerifyResponse(InstructionFollowingVerifyRequest, BaseVerifyResponse):
    follow_all_instructions: bool
    follow_instruction_list: list[bool]  # aligned with instruction_id_list
    # Aligned with instruction_id_list: null when the instruction was checked, otherwise why it could not be.
    instruction_errors: list[Optional[str]]


def final_answer_text(body: BaseVerifyRequest) -> str:
    """The text of the last assistant message in `response.output`: its `output_text` parts joined, or its
    content when that is a plain string. Empty when there is no assistant message (e.g. only reasoning or tool
    calls). Earlier messages are drafts; reasoning, refusals and tool traffic are never graded."""
    for item in reversed(body.response.output):
        if getattr(item, "type", None) != "message" or getattr(item, "role", None) != "assistant":
            continue
        content = item.content
        if isinstance(content, str):
            return content
        texts = []
        for part in content:
            part_type = part.get("type") if isinstance(part, dict) else getattr(part, "type", None)
            if part_type == "output_text":
                texts.append(part["text"] if isinstance(part, dict) else part.text)
        return "".join(texts)
    return ""


def grade(
    instruction_ids: list[str], kwargs_list: Optional[list[Optional[dict[str, Any]]]], text: str
) -> tuple[list[bool], list[Optional[str]]]:
    """One (followed, error) pair per instruction id."""
    kwargs_list = kwargs_list or []
    followed: list[bool] = []
    errors: list[Optional[str]] = []
    for index, instruction_id in enumerate(instruction_ids):
        kwargs = kwargs_list[index] if index < len(kwargs_list) else None
        ok, error = check_instruction(instruction_id, kwargs, text)
        followed.append(ok)
        errors.append(error)
    return followed, errors


def reward_for(followed: list[bool], grading_mode: str) -> float:
    if not followed:
        return 0.0
    if grading_mode == "fraction":
        return sum(followed) / len(followed)
    return 1.0 if all(followed) else 0.0


class InstructionFollowingResourcesServer(SimpleResourcesServer):
    config: InstructionFollowingResourcesServerConfig

    def setup_webserver(self) -> FastAPI:
        return super().setup_webserver()  # no tools: the answer is in the text

    async def verify(self, body: InstructionFollowingVerifyRequest) -> InstructionFollowingVerifyResponse:
        followed, errors = grade(body.instruction_id_list, body.kwargs, final_answer_text(body))
        return InstructionFollowingVerifyResponse(
            **body.model_dump(),
            reward=reward_for(followed, body.grading_mode),
            follow_all_instructions=bool(followed) and all(followed),
            follow_instruction_list=followed,
            instruction_errors=errors,
        )


if __name__ == "__main__":
    InstructionFollowingResourcesServer.run_webserver()
