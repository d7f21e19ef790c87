"""example_llm_judge: short-answer questions graded by a judge model, with NeMo Gym v0.5's judge-failure routing.

The model answers a quiz question in text ("What is the capital of Canada?", "How many millilitres are in a
litre?"). No rule can check every wording of a right answer ("1000 mL", "one thousand", "a litre is 1,000 ml"),
so `verify` asks a judge model - any model server of the stack, named in the config as `judge_model_server` -
whether the answer says the same as the row's `expected_answer`.

What it teaches, the v0.5 way of calling a judge:

* `nemo_gym.judge.call_judge` posts the judge prompt to the judge's model server and parses the reply into a
  `NeMoGymResponse`. Every way the *call* can fail (HTTP error, timeout, a body that is not a Response) raises
  `JudgeError`.
* A `JudgeError` is not a wrong answer. `SimpleResourcesServer` wraps `/verify` in `judge_failsafe`, which turns it
  into an HTTP 200 answer with `reward: 0.0`, `_ng_failure_class: "judge_failed"` and the error message, so the
  rollout is recorded as failed and retryable instead of as a zero score. Nothing here catches it.
* A judge that answers without a readable verdict has not judged the answer: by default that is a judge failure
  too (`judge_unparseable_verdict: failure`); `zero` scores it 0 (`judge_verdict: null`), as NeMo Gym v0.5 did.
  An empty judge reply is always a failed call (`JudgeError("empty judge response")`).
* A judge call that takes longer than `judge_timeout_s` (default: the global key, else 300 s) is a failed call.
* The verify depends on nothing but its request (and the judge), so the config class declares
  `REVERIFY_MODE = STATELESS`: `ng reverify` may re-judge stored rollouts.
"""

from __future__ import annotations

import re
from typing import Any, ClassVar, Literal, Optional

from fastapi import FastAPI
from pydantic import Field, field_validator

from nemo_gym.base_resources_server import (
    BaseResourcesServerConfig,
    BaseRunRequest,
    BaseVerifyRequest,
    BaseVerifyResponse,
    ReverifyMode,
    SimpleResourcesServer,
)
from nemo_gym.config_types import ModelServerRef
from nemo_gym.judge import JudgeError, call_judge
from nemo_gym.verifiers.judge import JudgeSettings, no_verdict
from nemo_gym.openai_utils import NeMoGymResponse, NeMoGymResponseCreateParamsNonStreaming

# Placeholders: {question}, {expected_answer}, {model_answer}. Literal braces are doubled, as in `str.format`.
DEFAULT_JUDGE_PROMPT_TEMPLATE = """\
You are grading one answer to a short quiz question against the reference answer.

Question: {question}
Reference answer: {expected_answer}
Candidate answer: {model_answer}

The candidate is CORRECT when it gives the same answer as the reference, however it is worded: a different \
phrasing, an abbreviation, a unit written out or abbreviated, an equal number written another way, or extra \
explanation around the answer are all fine. It is INCORRECT when it gives a different answer, names several \
answers without settling on one, or does not answer.

Write one short sentence of reasoning. Then write a last line that is exactly "VERDICT: CORRECT" or \
"VERDICT: INCORRECT".
"""

PLACEHOLDERS = ("question", "expected_answer", "model_answer")

# The verdict line the prompt asks for (markdown emphasis around it is allowed); the last one in the reply counts,
# since reasoning may quote the format first.
VERDICT_PATTERN = re.compile(r"(?<![a-z])VERDICT[*_]*\s*:[\s*_]*(CORRECT|INCORRECT)\b", re.IGNORECASE)

Verdict = Literal["correct", "incorrect"]


class ExampleLLMJudgeResourcesServerConfig(BaseResourcesServerConfig, JudgeSettings):
    # JudgeSettings: `judge_timeout_s`, `judge_unparseable_verdict` (nemo_gym/verifiers/judge.py).
    # Verify reads only its request (and asks the judge): stored rollouts can be re-judged.
    REVERIFY_MODE: ClassVar[ReverifyMode] = ReverifyMode.STATELESS

    judge_model_server: ModelServerRef
    # Parameters of every judge call (temperature, max_output_tokens, ...); `input` is replaced by the prompt.
    judge_responses_create_params: NeMoGymResponseCreateParamsNonStreaming = Field(
        default_factory=lambda: NeMoGymResponseCreateParamsNonStreaming(input=[], temperature=0.0)
    )
    judge_system_message: Optional[str] = None
    judge_prompt_template: str = DEFAULT_JUDGE_PROMPT_TEMPLATE

    @field_validator("judge_prompt_template")
    @classmethod
    def template_fills(cls, template: str) -> str:
        """A broken template fails when the server starts, not once per rollout."""
        try:
            template.format(**dict.fromkeys(PLACEHOLDERS, ""))
        except (KeyError, IndexError, ValueError) as exc:
            names = ", ".join("{" + name + "}" for name in PLACEHOLDERS)
            raise ValueError(
                f"judge_prompt_template cannot be filled ({type(exc).__name__}: {exc}); its placeholders are "
                f"{names}, and literal braces must be doubled ({{{{ and }}}})"
            ) from None
        return template


class ExampleLLMJudgeRunRequest(BaseRunRequest):
    question: str  # shown to the judge (the model sees it in `responses_create_params`)
    expected_answer: str


class ExampleLLMJudgeVerifyRequest(ExampleLLMJudgeRunRequest, BaseVerifyRequest):
    pass


class ExampleLLMJudgeVerifyResponse(ExampleLLMJudgeVerifyRequest, BaseVerifyResponse):
    model_answer: Optional[str] = None  # the assistant's text, None when it wrote none (the judge is not asked)
    judge_verdict: Optional[Verdict] = None  # None: not asked, or no readable verdict in its reply
    judge_text: Optional[str] = None  # the judge's whole reply, so a score can be audited


def read_verdict(judge_text: str) -> Optional[Verdict]:
    """The last `VERDICT: CORRECT|INCORRECT` in the judge's reply (any case), or None when there is none."""
    matches = VERDICT_PATTERN.findall(judge_text)
    return matches[-1].lower() if matches else None  # type: ignore[return-value]


class ExampleLLMJudgeResourcesServer(SimpleResourcesServer):
    config: ExampleLLMJudgeResourcesServerConfig

    def setup_webserver(self) -> FastAPI:
        return super().setup_webserver()  # no tools; /verify is already wrapped in judge_failsafe

    async def verify(self, body: ExampleLLMJudgeVerifyRequest) -> ExampleLLMJudgeVerifyResponse:
        model_answer = "\n".join(body.response.assistant_texts()).strip()
        if not model_answer:
            return ExampleLLMJudgeVerifyResponse(**body.model_dump(), reward=0.0)

        judge_text = await self.ask_judge(body.question, body.expected_answer, model_answer)
        verdict = read_verdict(judge_text)
        if verdict is None:
            no_verdict(self.config.judge_unparseable_verdict, self.config.judge_model_server.name,
                       'no "VERDICT: CORRECT" or "VERDICT: INCORRECT" line')
        return ExampleLLMJudgeVerifyResponse(
            **body.model_dump(),
            reward=1.0 if verdict == "correct" else 0.0,
            model_answer=model_answer,
            judge_verdict=verdict,
            judge_text=judge_text,
        )

    def judge_request(self, question: str, expected_answer: str, model_answer: str) -> dict[str, Any]:
        """The judge call's body: the configured parameters with the filled prompt as `input`."""
        cfg = self.config
        prompt = cfg.judge_prompt_template.format(
            question=question, expected_answer=expected_answer, model_answer=model_answer
        )
        messages = [{"role": "system", "content": cfg.judge_system_message}] if cfg.judge_system_message else []
        messages.append({"role": "user", "content": prompt})
        return {**cfg.judge_responses_create_params.model_dump(exclude_unset=True), "input": messages}

    async def ask_judge(self, question: str, expected_answer: str, model_answer: str) -> str:
        """The judge's reply text. A failed call, and an empty reply, raise `JudgeError` (-> `judge_failed`)."""
        reply = await call_judge(
            self.server_client,
            server_name=self.config.judge_model_server.name,
            url_path="/v1/responses",
            json=self.judge_request(question, expected_answer, model_answer),
            response_model=NeMoGymResponse,
            timeout_s=self.config.judge_timeout_s,
        )
        judge_text = "\n".join(reply.assistant_texts()).strip()
        if not judge_text:
            raise JudgeError("empty judge response")
        return judge_text


if __name__ == "__main__":
    ExampleLLMJudgeResourcesServer.run_webserver()
