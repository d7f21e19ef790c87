"""math_with_judge: math answers checked for symbolic equivalence, with an optional LLM judge as a second opinion.

There are no tools: the model answers in text and `verify` grades it in two stages.

1. **Library** (always): HuggingFace's `math-verify` extracts the final answer from the text (a `\\boxed{}`, an
   "answer is ..." phrase, or else a LaTeX or plain expression) and compares it with `expected_answer`
   symbolically, so `0.5`, `\\frac{2}{4}` and `1/2` all match `\\frac{1}{2}`. The result is `library_reward`
   (0 or 1); the math itself lives in `grading.py`.
2. **Judge** (only when `should_use_judge` is true and the library said "not equal"): a judge model compares the
   expected answer and the model's text with a prompt that ends in `[[A=B]]` or `[[A!=B]]`. If it says equal, it
   is asked again with the two answers swapped (a judge that favours one position is caught); reward 1.0 only if
   both calls say equal. A judge that fails (HTTP error, unreadable reply, no answer within `judge_timeout_s`, or a
   reply with neither label unless `judge_unparseable_verdict: zero`) is not a wrong answer: `/verify` answers
   `judge_failed` (rerun by the collector, then recorded in the failures file), as NeMo Gym v0.5's server does.

What it teaches: using the real library built for the job, running it where a pathological input cannot hang the
server (a worker process with a hard time limit, see `nemo_gym/isolation/worker_pool.py`), and calling another server of the stack
(the judge model) from a verifier by its server id.
"""

from __future__ import annotations

from typing import Any, Optional

from fastapi import FastAPI
from pydantic import Field, PrivateAttr

from nemo_gym.base_resources_server import (
    BaseResourcesServerConfig,
    BaseRunRequest,
    BaseVerifyRequest,
    BaseVerifyResponse,
    SimpleResourcesServer,
)
from nemo_gym.config_types import ModelServerRef
from nemo_gym.openai_utils import NeMoGymResponse, NeMoGymResponseCreateParamsNonStreaming
from nemo_gym.isolation.worker_pool import WorkerPool, WorkerTimeout
from nemo_gym.verifiers import llm_judge
from nemo_gym.verifiers.judge import JudgeSettings
from nemo_gym.verifiers.llm_judge import JudgeEvaluation

from resources_servers.math_with_judge.grading import grade_with_math_verify

EQUAL_LABEL = "[[A=B]]"
NOT_EQUAL_LABEL = "[[A!=B]]"

JUDGE_SYSTEM_MESSAGE = (
    "You grade mathematical answers. You compare two answers to the same problem and decide whether they state "
    "the same final result. You are strict about values and lenient about presentation."
)

# Placeholders: {question}, {first_answer}, {second_answer}.
JUDGE_PROMPT_TEMPLATE = """\
Compare the final results of the two answers below. Both answer the same problem.

How to decide:
- Look only at the final result each answer commits to; ignore the working, the wording and the formatting.
- The results are EQUAL when they are mathematically the same: equivalent forms such as 1/2, 0.5 and \\frac{{2}}{{4}}, \
terms or list items in another order, the same set or interval written differently, or the same quantity with or \
without units the problem already implies.
- The results are DIFFERENT when their values differ, when one gives only part of what the other gives (for \
example one of two solutions), or when an answer commits to no final result.
- Do not work out which answer is correct. Only compare them.

<problem>
{question}
</problem>

<answer_a>
{first_answer}
</answer_a>

<answer_b>
{second_answer}
</answer_b>

Explain the comparison in a few sentences. Then end your reply with the verdict on a line of its own: [[A=B]] if \
the two results are equal, [[A!=B]] if they are different. Write no other verdict anywhere in your reply.
"""


class MathWithJudgeResourcesServerConfig(BaseResourcesServerConfig, JudgeSettings):
    # JudgeSettings: `judge_timeout_s`, `judge_unparseable_verdict` (nemo_gym/verifiers/judge.py).
    judge_model_server: ModelServerRef
    # Base parameters of every judge call (model settings such as temperature, max_output_tokens); `input` is
    # replaced by the judge prompt.
    judge_responses_create_params: NeMoGymResponseCreateParamsNonStreaming = Field(
        default_factory=lambda: NeMoGymResponseCreateParamsNonStreaming(input=[])
    )
    should_use_judge: bool = True
    judge_system_message: Optional[str] = JUDGE_SYSTEM_MESSAGE
    judge_prompt_template: str = JUDGE_PROMPT_TEMPLATE
    # math-verify runs in worker processes: how many, and the hard limit for one check (then the worker is killed).
    math_verify_num_workers: int = Field(default=2, ge=1)
    math_verify_timeout_seconds: float = Field(default=20.0, gt=0)


class MathWithJudgeRunRequest(BaseRunRequest):
    question: Optional[str] = None  # shown to the judge
    expected_answer: str


class MathWithJudgeVerifyRequest(MathWithJudgeRunRequest, BaseVerifyRequest):
    pass


class MathWithJudgeVerifyResponse(MathWithJudgeVerifyRequest, BaseVerifyResponse):
    extracted_answer: Optional[str]  # math-verify's reading of the model's answer, None if it found none
    library_reward: float
    judge_evaluations: Optional[list[JudgeEvaluation]] = None  # None when the judge was not asked
    math_verify_timed_out: bool = False
    math_verify_error: Optional[str] = None  # why math-verify gave no result (timeout, unreadable expected answer)
    judge_error: Optional[str] = None  # always null: a failed judge call is a `judge_failed` answer now


# ------------------------------------------------------------------------------------------------------ text


def generated_text(response: NeMoGymResponse) -> str:
    """Every `output_text` part of every assistant message, concatenated with no separator (reasoning items,
    tool calls and refusals are not read)."""
    return response.output_text


# ------------------------------------------------------------------------------------------------------ judge


def judge_verdict(response: NeMoGymResponse) -> Optional[str]:
    """EQUAL_LABEL, NOT_EQUAL_LABEL or None, read as `nemo_gym.verifiers.llm_judge.verdict_label` does."""
    return llm_judge.verdict_label(response, EQUAL_LABEL, NOT_EQUAL_LABEL)


class MathWithJudgeResourcesServer(SimpleResourcesServer):
    config: MathWithJudgeResourcesServerConfig

    _pool: Optional[WorkerPool] = PrivateAttr(default=None)

    def model_post_init(self, context: Any) -> None:
        super().model_post_init(context)
        try:  # a broken template fails at start-up, not once per rollout
            self.config.judge_prompt_template.format(question="", first_answer="", second_answer="")
        except (KeyError, IndexError, ValueError) as exc:
            raise ValueError(
                f"judge_prompt_template is not a valid format string ({type(exc).__name__}: {exc}); the placeholders "
                "are {question}, {first_answer}, {second_answer} and literal braces must be doubled"
            ) from None

    def setup_webserver(self) -> FastAPI:
        return super().setup_webserver()  # no tools: the answer is in the text

    @property
    def pool(self) -> WorkerPool:
        if self._pool is None:  # workers start on first use, not when the server object is built
            self._pool = WorkerPool(
                num_workers=self.config.math_verify_num_workers,
                timeout_s=self.config.math_verify_timeout_seconds,
                preload=[grade_with_math_verify.__module__],
            )
        return self._pool

    async def verify(self, body: MathWithJudgeVerifyRequest) -> MathWithJudgeVerifyResponse:
        text = generated_text(body.response)
        fields: dict[str, Any] = {}

        try:
            library_reward, extracted = await self.pool.run(grade_with_math_verify, body.expected_answer, text)
        except WorkerTimeout as exc:
            library_reward, extracted = 0.0, None
            fields.update(math_verify_timed_out=True, math_verify_error=f"math-verify timed out: {exc}")
        except Exception as exc:  # an unreadable expected answer, a crashed worker: no library verdict
            library_reward, extracted = 0.0, None
            fields.update(math_verify_error=str(exc))

        reward = library_reward
        if self.config.should_use_judge and library_reward <= 0.5 and text.strip():
            evaluations: list[JudgeEvaluation] = []
            # A failed judge call raises JudgeError: judge_failsafe around /verify answers judge_failed.
            reward = await self.judge_twice(body.question or "", body.expected_answer, text, evaluations)
            fields["judge_evaluations"] = evaluations

        return MathWithJudgeVerifyResponse(
            **body.model_dump(), reward=reward, library_reward=library_reward, extracted_answer=extracted, **fields
        )

    async def judge_twice(self, question: str, expected: str, generated: str, evaluations: list) -> float:
        """Expected answer as A, the model's as B; if equal, again with the two swapped. 1.0 iff both say equal."""
        for first, second in ((expected, generated), (generated, expected)):
            evaluation = await self.ask_judge(question, first, second)
            evaluations.append(evaluation)
            if evaluation.verdict_label != EQUAL_LABEL:
                return 0.0
        return 1.0

    async def ask_judge(self, question: str, first_answer: str, second_answer: str) -> JudgeEvaluation:
        prompt = self.config.judge_prompt_template.format(
            question=question, first_answer=first_answer, second_answer=second_answer
        )
        return await llm_judge.ask_judge(
            self.server_client,
            self.config.judge_model_server.name,
            self.config.judge_responses_create_params,
            prompt,
            system_message=self.config.judge_system_message,
            equal_label=EQUAL_LABEL,
            not_equal_label=NOT_EQUAL_LABEL,
            timeout_s=self.config.judge_timeout_s,
            unparseable_verdict=self.config.judge_unparseable_verdict,
        )


if __name__ == "__main__":
    MathWithJudgeResourcesServer.run_webserver()
