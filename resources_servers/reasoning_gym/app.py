"""reasoning_gym: tasks from the `reasoning-gym` package, scored by each task's own scorer.

reasoning-gym generates procedural reasoning tasks (arithmetic, puzzles, logic, string manipulation, ...) and
ships a scorer per task. A row carries what the generator produced: `question`, `answer` (null for tasks without a
single gold answer, whose scorer checks the solution itself) and `metadata`, whose `source_dataset` names the task.
`scripts/generate_dataset.py` writes such rows.

`verify` reads the model's final answer from its text (the last `<answer>...</answer>`, else the first
`\\boxed{...}`, else the whole text), hands it to the task's scorer together with the row, and uses the score
(a float in [0, 1], partial credit for some tasks) as the reward. Scorer errors score 0.

This is the pattern for wrapping an existing task library: let the library generate and grade, and keep the
server to reading the answer out of the response and reporting what it read. Scorers run in worker processes
with a time limit (`nemo_gym/isolation/worker_pool.py` running `scoring.py`), because a scorer fed an adversarial answer can run for hours.
"""

from __future__ import annotations

import logging
import math
from typing import Any, Optional

from fastapi import FastAPI
from pydantic import Field, PrivateAttr, field_validator
from reasoning_gym.factory import DATASETS
from reasoning_gym.utils import extract_answer

from nemo_gym.base_resources_server import (
    BaseResourcesServerConfig,
    BaseRunRequest,
    BaseVerifyRequest,
    BaseVerifyResponse,
    SimpleResourcesServer,
)
from nemo_gym.isolation.worker_pool import WorkerPool
from nemo_gym.verifiers.latex_answers import boxed_contents
from resources_servers.reasoning_gym.scoring import SCORING_PRELOAD, score_answer

LOG = logging.getLogger(__name__)


class ReasoningGymResourcesServerConfig(BaseResourcesServerConfig):
    # Scorers run in this many worker processes; one that takes longer than the limit is killed and scores 0.
    num_scoring_workers: int = Field(default=2, ge=1)
    score_timeout_seconds: float = Field(default=20.0, gt=0)


class ReasoningGymRunRequest(BaseRunRequest):
    question: str
    answer: Optional[str] = None  # the gold answer; null when the task has none and its scorer checks the solution
    metadata: dict[str, Any]  # the generator's metadata; `source_dataset` is the task name

    @field_validator("metadata")
    @classmethod
    def _names_the_task(cls, metadata: dict[str, Any]) -> dict[str, Any]:
        name = metadata.get("source_dataset")
        if not isinstance(name, str) or not name.strip():
            raise ValueError(
                "metadata.source_dataset must name the reasoning-gym task that generated the row (e.g. "
                "'leg_counting'); rows written by scripts/generate_dataset.py have it"
            )
        return metadata


class ReasoningGymVerifyRequest(ReasoningGymRunRequest, BaseVerifyRequest):
    pass


class ReasoningGymVerifyResponse(ReasoningGymVerifyRequest, BaseVerifyResponse):
    task_name: str
    score: float
    extracted_answer: str  # what was handed to the scorer
    score_error: Optional[str] = None  # why the score is 0 without being judged (unknown task, scorer error, timeout)


# ------------------------------------------------------------------------------------------------------ answer


def assistant_text(body: BaseVerifyRequest) -> str:
    """Every `output_text` part of every assistant message, one per line (reasoning, tool calls and refusals are
    not read)."""
    return "\n".join(body.response.assistant_texts())


def answer_tag_content(text: str) -> Optional[str]:
    """The content of the last `<answer>...</answer>`, stripped, read by reasoning-gym's own `extract_answer`.
    None when there is no complete tag pair.

    The text is first cut after the last `</answer>`: nothing after it can be part of a tag pair, and without the
    cut a long run of unclosed `<answer>` tags would make the helper's lazy pattern scan quadratically."""
    end = text.rfind("</answer>")
    if end == -1:
        return None
    return extract_answer(text[: end + len("</answer>")])


def first_boxed_content(text: str) -> Optional[str]:
    """The content of the first `\\boxed{...}` that is closed, braces balanced (`\\boxed{\\frac{1}{2}}` ->
    `\\frac{1}{2}`), stripped. None when there is none. One pass over the text, however many boxes are unclosed."""
    return next((content.strip() for content in boxed_contents(text) if content is not None), None)


def extract_final_answer(text: str) -> str:
    """The last `<answer>` tag's content, else the first `\\boxed{}`'s, else the whole text; always stripped."""
    tagged = answer_tag_content(text)
    if tagged is not None:
        return tagged
    boxed = first_boxed_content(text)
    if boxed is not None:
        return boxed
    return text.strip()


# ------------------------------------------------------------------------------------------------------ server


class ReasoningGymResourcesServer(SimpleResourcesServer):
    config: ReasoningGymResourcesServerConfig

    _pool: Optional[WorkerPool] = PrivateAttr(default=None)
    _warned_tasks: set[str] = PrivateAttr(default_factory=set)

    def setup_webserver(self) -> FastAPI:
        return super().setup_webserver()  # no tools: the answer is in the text

    @property
    def pool(self) -> WorkerPool:
        if self._pool is None:  # the worker processes themselves start on first use
            self._pool = WorkerPool(
                num_workers=self.config.num_scoring_workers,
                timeout_s=self.config.score_timeout_seconds,
                preload=SCORING_PRELOAD,
            )
        return self._pool

    async def score(self, task_name: str, answer: str, entry: dict[str, Any]) -> tuple[float, Optional[str]]:
        """(score, None), or (0.0, why) when the task cannot score this answer."""
        if task_name not in DATASETS:
            error = f"unknown reasoning-gym task {task_name!r} (not among the {len(DATASETS)} tasks of reasoning-gym)"
            if task_name not in self._warned_tasks:
                self._warned_tasks.add(task_name)
                LOG.warning("%s: its rows score 0", error)
            return 0.0, error
        try:
            score = await self.pool.run(score_answer, task_name, answer, entry)
        except Exception as exc:  # the scorer raised, timed out, or its worker died: this answer scores 0
            return 0.0, f"{task_name}: {exc}"
        if not math.isfinite(score):
            return 0.0, f"{task_name}: the scorer returned {score}"
        return score, None

    async def verify(self, body: ReasoningGymVerifyRequest) -> ReasoningGymVerifyResponse:
        extracted = extract_final_answer(assistant_text(body))
        task_name = body.metadata["source_dataset"]
        entry = {"question": body.question, "answer": body.answer, "metadata": body.metadata}
        score, error = await self.score(task_name, extracted, entry)
        return ReasoningGymVerifyResponse(
            **body.model_dump(),
            reward=score,
            task_name=task_name,
            score=score,
            extracted_answer=extracted,
            score_error=error,
        )


if __name__ == "__main__":
    ReasoningGymResourcesServer.run_webserver()
