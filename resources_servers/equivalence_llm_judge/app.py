"""equivalence_llm_judge: a judge model decides whether the model's answer says the same as the expected answer.

There are no tools: the model answers in text, and `verify` sends the question, the expected answer and the model's
answer to a judge model server (`judge_model_server`, any Responses API model server of the stack) with a prompt
that asks for `[[A=B]]` (equivalent) or `[[A!=B]]` (not). For free-form answers (names, short phrases, claims)
where no rule-based check exists.

Options, all in the server config:

* answer extraction: `response_extract_regex`, or per row `template_metadata.output_regex` (when
  `use_per_record_regex`): the last match, its first non-empty group. No match -> the whole answer is judged.
* `check_twice_swap`: after an "equal" verdict, ask again with the two answers swapped; a judge that favours one
  position is caught. A disagreement scores `reward_if_swap_fails`.
* `check_full_generation_on_fail`: when a row's own regex extracted something the judge rejected, judge the whole
  answer once more; "equal" then scores `reward_if_full_generation_succeeds` (partial credit for a bad format).

A judge that fails is not a wrong answer: a failed judge call (HTTP failure, unreadable response, no answer within
`judge_timeout_s`) makes `/verify` answer `judge_failed` (the collector reruns the rollout, then records it in the
failures file), and so does a reply with neither label unless `judge_unparseable_verdict: zero`, which scores it as
"not equal" (`failure_reason: no_verdict`, NeMo Gym v0.5's behaviour).

What it teaches: calling another server of the stack from a verifier by its server id (the call itself is
`nemo_gym/verifiers/llm_judge.py`, shared with math_with_judge), bounding the calls with a semaphore, and recording
every judge call (`judge_evaluations`) next to the reward so a score can be audited.
"""

from __future__ import annotations

import asyncio
import re
from pathlib import Path
from typing import Any, Optional, Union

from fastapi import FastAPI
from pydantic import ConfigDict, Field, PrivateAttr

from nemo_gym.base_resources_server import (
    BaseResourcesServerConfig,
    BaseRunRequest,
    BaseVerifyRequest,
    BaseVerifyResponse,
    SimpleResourcesServer,
)
from nemo_gym.config_types import ModelServerRef
from nemo_gym.openai_utils import NeMoGymResponse, NeMoGymResponseCreateParamsNonStreaming
from nemo_gym.verifiers.judge import JudgeSettings
from nemo_gym.verifiers.llm_judge import JudgeEvaluation, ask_judge
from nemo_gym.verifiers.llm_judge import verdict_label as verdict_of  # this server's name for the verdict reader

SERVER_DIR = Path(__file__).resolve().parent

# Placeholders: {question}, {expected_answer}, {generated_answer}, and the labels {equal_label}, {not_equal_label}.
# Literal braces must be doubled ({{ }}), as in any `str.format` template.
DEFAULT_JUDGE_PROMPT_TEMPLATE = """\
Two answers to the same question are shown below. Decide whether they say the same thing.

<question>
{question}
</question>

<answer_a>
{expected_answer}
</answer_a>

<answer_b>
{generated_answer}
</answer_b>

How to decide:
- The answers are EQUIVALENT when they give the same answer to the question: the same entity, value, choice or \
claim, even if it is worded, abbreviated, formatted or rounded differently in a way the question allows.
- They are NOT EQUIVALENT when they name different things or give different values, when one is vaguer or broader \
than the other or matches it only in part, or when either one gives no answer.
- Compare only the answers themselves; ignore explanations, working and tone. Do not decide which one is correct.

Give one or two sentences of reasoning. Then end with the verdict on a line of its own: {equal_label} if the \
answers are equivalent, {not_equal_label} if they are not. Do not write either verdict anywhere else.
"""


_PLACEHOLDERS = ("question", "expected_answer", "generated_answer", "equal_label", "not_equal_label")


class LLMJudgeResourcesServerConfig(BaseResourcesServerConfig, JudgeSettings):
    # JudgeSettings: `judge_timeout_s`, `judge_unparseable_verdict` (nemo_gym/verifiers/judge.py).
    judge_model_server: ModelServerRef
    # Base parameters of every judge call (temperature, max_output_tokens, ...); `input` is replaced by the prompt.
    judge_responses_create_params: NeMoGymResponseCreateParamsNonStreaming = Field(
        default_factory=lambda: NeMoGymResponseCreateParamsNonStreaming(input=[])
    )
    judge_endpoint_max_concurrency: Optional[int] = Field(default=64, ge=1)  # None: no limit

    judge_system_message: Optional[str] = None
    # The prompt: inline, or a file (relative paths: this server's folder first, then the working directory).
    # Neither set: DEFAULT_JUDGE_PROMPT_TEMPLATE.
    judge_prompt_template: Optional[str] = None
    judge_prompt_template_fpath: Optional[str] = None
    judge_equal_label: str = "[[A=B]]"
    judge_not_equal_label: str = "[[A!=B]]"

    # Regexes over the last user message (the question shown to the judge) and the last assistant message (the
    # answer): the last match, its first non-empty group (else the whole match). No match -> the whole text.
    question_extract_regex: Optional[str] = None
    response_extract_regex: Optional[str] = None

    check_twice_swap: bool = False
    reward_if_swap_fails: float = 0.0

    # Per-row answer regex from `template_metadata.output_regex`, overriding `response_extract_regex`.
    use_per_record_regex: bool = True
    # With a per-row regex: an expected answer longer than this is compared with the whole answer (no regex, no
    # swap check, no second try). None: no limit.
    extraction_length_threshold: Optional[int] = Field(default=120, ge=0)
    # With a per-row regex: if the extracted answer is judged not equal, judge the whole answer once more.
    check_full_generation_on_fail: bool = True
    reward_if_full_generation_succeeds: float = 0.5


class LLMJudgeRunRequest(BaseRunRequest):
    # Other row fields (e.g. from multiple-choice datasets) are kept and echoed back.
    model_config = ConfigDict(extra="allow")

    uuid: Optional[Union[str, int]] = None
    expected_answer: Optional[str] = None  # falls back to metadata.expected_answer
    options: Optional[list[dict[str, Any]]] = None
    metadata: Optional[dict[str, Any]] = None
    template_metadata: Optional[dict[str, Any]] = None  # `output_regex`: this row's answer pattern


class LLMJudgeVerifyRequest(LLMJudgeRunRequest, BaseVerifyRequest):
    pass


class LLMJudgeVerifyResponse(LLMJudgeVerifyRequest, BaseVerifyResponse):
    expected_answer: str
    extracted_answer: Optional[str] = None  # what the first judge call compared with the expected answer
    extraction_failed: bool = False  # an answer regex was set and did not match: the whole answer was judged
    judge_evaluations: list[JudgeEvaluation] = Field(default_factory=list)
    # None when the answer was judged equivalent; else `no_answer` (no assistant text: judge not called),
    # `no_expected_answer` (judge not called), `not_equal`, `no_verdict` (the judge wrote neither label;
    # `judge_unparseable_verdict: zero` only), or `swap_check_failed`.
    failure_reason: Optional[str] = None
    judge_error: Optional[str] = None  # always null: a failed judge call is a `judge_failed` answer now


# Request fields the response echoes unchanged.
_ECHOED = set(LLMJudgeVerifyRequest.model_fields) - {"expected_answer"}


# ------------------------------------------------------------------------------------------------------ text


def last_match(pattern: Optional[str], text: str) -> Optional[str]:
    """The last match of `pattern` (multiline, dot matches newlines): its first non-empty group, else the whole
    match; stripped. None when there is no pattern, no match, or the pattern is invalid."""
    if not pattern:
        return None
    try:
        matches = list(re.finditer(pattern, text, flags=re.MULTILINE | re.DOTALL))
    except re.error:
        return None
    if not matches:
        return None
    match = matches[-1]
    for group in match.groups():
        if group and group.strip():
            return group.strip()
    return match.group(0).strip()


def _content_text(content: Any) -> str:
    if isinstance(content, str):
        return content
    texts = []
    for part in content or ():
        part_type = part.get("type") if isinstance(part, dict) else getattr(part, "type", None)
        text = part.get("text") if isinstance(part, dict) else getattr(part, "text", None)
        if part_type in ("input_text", "output_text", "text") and isinstance(text, str):
            texts.append(text)
    return "\n".join(texts)


def last_assistant_text(response: NeMoGymResponse) -> str:
    """The text parts of the **last** assistant message, joined with newlines and stripped ("" if none)."""
    for item in reversed(response.output):
        if getattr(item, "type", None) == "message" and getattr(item, "role", None) == "assistant":
            return _content_text(item.content).strip()
    return ""


def last_user_text(params: NeMoGymResponseCreateParamsNonStreaming) -> str:
    """The text of the last user message of the model's input (the question), stripped."""
    if isinstance(params.input, str):
        return params.input.strip()
    for item in reversed(params.input):
        if getattr(item, "role", None) == "user":
            return _content_text(item.content).strip()
    return ""


# ------------------------------------------------------------------------------------------------------ server


class LLMJudgeResourcesServer(SimpleResourcesServer):
    config: LLMJudgeResourcesServerConfig

    _prompt_template: str = PrivateAttr(default=DEFAULT_JUDGE_PROMPT_TEMPLATE)
    _semaphore: Optional[asyncio.Semaphore] = PrivateAttr(default=None)

    def model_post_init(self, context: Any) -> None:
        super().model_post_init(context)
        self._prompt_template = self.load_prompt_template()
        if self.config.judge_endpoint_max_concurrency is not None:
            self._semaphore = asyncio.Semaphore(self.config.judge_endpoint_max_concurrency)

    def load_prompt_template(self) -> str:
        """The judge prompt template, checked once here so a broken template fails at start-up, not per rollout."""
        template = self._read_prompt_template()
        try:
            template.format(**dict.fromkeys(_PLACEHOLDERS, ""))
        except (KeyError, IndexError, ValueError) as exc:
            raise ValueError(
                f"judge prompt template is not a valid format string ({type(exc).__name__}: {exc}); the placeholders "
                f"are {', '.join('{' + name + '}' for name in _PLACEHOLDERS)} and literal braces must be doubled"
            ) from None
        return template

    def _read_prompt_template(self) -> str:
        if self.config.judge_prompt_template is not None:
            return self.config.judge_prompt_template
        if self.config.judge_prompt_template_fpath is None:
            return DEFAULT_JUDGE_PROMPT_TEMPLATE
        path = Path(self.config.judge_prompt_template_fpath)
        # Relative: this server's folder, then the search roots (NEMO_GYM_EXTRA_ROOTS, which holds the folder
        # ng_run was started in, the current folder, the install root): a v0.5 benchmark names its template from
        # the checkout's root (`benchmarks/hle/prompts/judge.txt`).
        from nemo_gym.rollouts.benchmarks import component_search_roots

        roots = [SERVER_DIR, *component_search_roots()]
        candidates = [path] if path.is_absolute() else list(dict.fromkeys(root / path for root in roots))
        for candidate in candidates:
            if candidate.is_file():
                return candidate.read_text()
        raise FileNotFoundError(
            f"judge_prompt_template_fpath {str(path)!r} not found (looked in: {', '.join(map(str, candidates))})"
        )

    def setup_webserver(self) -> FastAPI:
        return super().setup_webserver()  # no tools: the answer is in the text

    async def verify(self, body: LLMJudgeVerifyRequest) -> LLMJudgeVerifyResponse:
        cfg = self.config
        expected = body.expected_answer or (body.metadata or {}).get("expected_answer") or ""
        expected = str(expected)
        question = last_user_text(body.responses_create_params)
        question = last_match(cfg.question_extract_regex, question) or question
        full_answer = last_assistant_text(body.response)

        # Which regex reads the answer: the row's own, else the server's; a long expected answer with a row
        # regex is compared with the whole answer instead.
        row_regex = (body.template_metadata or {}).get("output_regex") if cfg.use_per_record_regex else None
        row_regex = row_regex if isinstance(row_regex, str) and row_regex else None
        threshold = cfg.extraction_length_threshold
        long_expected = bool(row_regex and threshold is not None and len(expected) > threshold)
        regex = None if long_expected else (row_regex or cfg.response_extract_regex)
        extracted = last_match(regex, full_answer)
        judged = extracted if extracted is not None else full_answer

        result: dict[str, Any] = {
            "expected_answer": expected,
            "extracted_answer": judged or None,
            "extraction_failed": bool(regex) and extracted is None and bool(full_answer),
        }
        evaluations: list[JudgeEvaluation] = []

        def finish(reward: float, failure_reason: Optional[str] = None, **extra: Any) -> LLMJudgeVerifyResponse:
            # The request echoed back (extra row fields too), minus anything this response sets itself.
            payload = body.model_dump(exclude=set(result) | set(LLMJudgeVerifyResponse.model_fields) - _ECHOED)
            return LLMJudgeVerifyResponse(
                **payload, **result, reward=reward, judge_evaluations=evaluations, failure_reason=failure_reason,
                **extra,
            )

        if not full_answer:
            return finish(0.0, "no_answer")
        if not expected.strip():
            return finish(0.0, "no_expected_answer")

        # A failed judge call raises JudgeError: judge_failsafe around /verify answers judge_failed.
        first = await self.judge(question, expected, judged)
        evaluations.append(first)
        if first.verdict_label == cfg.judge_equal_label:
            if not cfg.check_twice_swap or long_expected:
                return finish(1.0)
            swapped = await self.judge(question, judged, expected)
            evaluations.append(swapped)
            if swapped.verdict_label == cfg.judge_equal_label:
                return finish(1.0)
            return finish(cfg.reward_if_swap_fails, "swap_check_failed")

        # Not equal. If the row's regex picked out something other than the whole answer, judge the whole.
        if cfg.check_full_generation_on_fail and row_regex and not long_expected and judged != full_answer:
            rescue = await self.judge(question, expected, full_answer)
            evaluations.append(rescue)
            if rescue.verdict_label == cfg.judge_equal_label:
                return finish(cfg.reward_if_full_generation_succeeds)
        last_label = evaluations[-1].verdict_label
        return finish(0.0, "no_verdict" if last_label is None else "not_equal")

    async def judge(self, question: str, expected_answer: str, generated_answer: str) -> JudgeEvaluation:
        """One judge call; `expected_answer` is shown as answer A and `generated_answer` as answer B."""
        cfg = self.config
        prompt = self._prompt_template.format(
            question=question,
            expected_answer=expected_answer,
            generated_answer=generated_answer,
            equal_label=cfg.judge_equal_label,
            not_equal_label=cfg.judge_not_equal_label,
        )
        return await ask_judge(
            self.server_client,
            cfg.judge_model_server.name,
            cfg.judge_responses_create_params,
            prompt,
            system_message=cfg.judge_system_message,
            equal_label=cfg.judge_equal_label,
            not_equal_label=cfg.judge_not_equal_label,
            semaphore=self._semaphore,
            timeout_s=cfg.judge_timeout_s,
            unparseable_verdict=cfg.judge_unparseable_verdict,
        )


if __name__ == "__main__":
    LLMJudgeResourcesServer.run_webserver()
