"""example_multi_reward: one rollout scored on several named rewards at once (NeMo Gym v0.5 multi-objective rewards).

The task: a short arithmetic word problem, to be answered with brief working and a last line `Answer: <integer>`.
Three things about an answer can be judged separately, and they genuinely disagree:

* `correctness` (0 or 1): the number the model gave equals `expected_answer`. Read leniently - the last
  `Answer:` line if there is one, else the last number anywhere - so a right answer in the wrong form still counts.
* `format` (0 or 1): the last line is exactly `Answer: <integer>`.
* `brevity` (0 to 1): 1 up to the row's `max_words`, then falling linearly to 0 at twice that.

What it teaches:

* The verify response is a `BaseMultiRewardVerifyResponse`: `reward_components` holds the three scores (the same
  names for every task) and `reward` is still the one scalar training uses - here their weighted sum
  (`reward_weights` in the config).
* Reward profiling and `/aggregate_metrics` read top-level numbers only, so each component is *also* a top-level
  field (`correctness`, `format`, `brevity`): that is what makes `mean/correctness` etc. appear.
* `compute_metrics` / `get_key_metrics` (the `/aggregate_metrics` hooks): pass@k, pass@1[avg-of-k] and majority@k
  per component, with `nemo_gym.reward_profile.compute_pass_majority_metrics` and `highest_k_metrics`.
"""

from __future__ import annotations

import re
from typing import Any, ClassVar, Optional

from fastapi import FastAPI
from pydantic import Field, field_validator

from nemo_gym.base_resources_server import (
    BaseMultiRewardVerifyResponse,
    BaseResourcesServerConfig,
    BaseRunRequest,
    BaseVerifyRequest,
    ReverifyMode,
    SimpleResourcesServer,
)
from nemo_gym.reward_profile import compute_pass_majority_metrics, highest_k_metrics

COMPONENTS = ("correctness", "format", "brevity")

ANSWER_LINE = re.compile(r"^Answer:\s*(-?\d+)\s*$")  # the required last line, exactly
LOOSE_ANSWER = re.compile(r"answer\s*(?:is|:)?\s*(-?\d[\d,]*(?:\.\d+)?)", re.IGNORECASE)
NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?")


class ExampleMultiRewardResourcesServerConfig(BaseResourcesServerConfig):
    # Verify reads nothing but its request: stored rollouts can be re-scored.
    REVERIFY_MODE: ClassVar[ReverifyMode] = ReverifyMode.STATELESS

    # reward = sum of weight * component; one weight per component, no other names.
    reward_weights: dict[str, float] = Field(
        default_factory=lambda: {"correctness": 1.0, "format": 0.5, "brevity": 0.5}
    )

    @field_validator("reward_weights")
    @classmethod
    def one_weight_per_component(cls, weights: dict[str, float]) -> dict[str, float]:
        if set(weights) != set(COMPONENTS):
            missing = sorted(set(COMPONENTS) - set(weights))
            unknown = sorted(set(weights) - set(COMPONENTS))
            raise ValueError(
                f"reward_weights must give exactly one weight per component ({', '.join(COMPONENTS)}); "
                f"missing: {missing or 'none'}, unknown: {unknown or 'none'}"
            )
        return weights


class ExampleMultiRewardRunRequest(BaseRunRequest):
    expected_answer: int
    max_words: int = Field(default=40, ge=1)  # the answer's word budget for full brevity


class ExampleMultiRewardVerifyRequest(ExampleMultiRewardRunRequest, BaseVerifyRequest):
    pass


class ExampleMultiRewardVerifyResponse(ExampleMultiRewardVerifyRequest, BaseMultiRewardVerifyResponse):
    # The components again as top-level numbers, so reward profiling and /aggregate_metrics see them.
    correctness: float
    format: float
    brevity: float
    extracted_answer: Optional[str] = None  # the number read for correctness (majority@k groups by it)
    word_count: int


# ------------------------------------------------------------------------------------------------------ scoring


def _as_number(text: str) -> Optional[float]:
    try:
        return float(text.replace(",", ""))
    except ValueError:
        return None


def extract_answer(text: str) -> Optional[str]:
    """The number the answer settles on: the last `Answer: N` / `answer is N`, else the last number in the text
    (commas removed; None when there is no number)."""
    for pattern in (LOOSE_ANSWER, NUMBER):
        found = pattern.findall(text)
        if found:
            return found[-1].replace(",", "").rstrip(".") or None
    return None


def format_score(text: str) -> float:
    """1.0 when the last non-empty line is exactly `Answer: <integer>`."""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return 1.0 if lines and ANSWER_LINE.match(lines[-1]) else 0.0


def brevity_score(word_count: int, max_words: int) -> float:
    """1.0 up to `max_words` words, then linearly down to 0.0 at twice as many."""
    if word_count <= max_words:
        return 1.0
    return max(0.0, 1.0 - (word_count - max_words) / max_words)


def score_components(text: str, expected_answer: int, max_words: int) -> tuple[dict[str, float], Optional[str]]:
    """(the three component scores, the extracted answer). No text at all scores 0 on every component."""
    if not text:
        return dict.fromkeys(COMPONENTS, 0.0), None
    extracted = extract_answer(text)
    value = None if extracted is None else _as_number(extracted)
    components = {
        "correctness": 1.0 if value is not None and value == expected_answer else 0.0,
        "format": format_score(text),
        "brevity": brevity_score(len(text.split()), max_words),
    }
    return components, extracted


def component_scores(result: dict) -> dict[str, float]:
    """A verify response's components for the pass@k helpers (`reward_components`, else the top-level copies)."""
    components = result.get("reward_components") or {}
    return {name: float(components.get(name, result.get(name, 0.0))) for name in COMPONENTS}


# ------------------------------------------------------------------------------------------------------ server


class ExampleMultiRewardResourcesServer(SimpleResourcesServer):
    config: ExampleMultiRewardResourcesServerConfig

    def setup_webserver(self) -> FastAPI:
        return super().setup_webserver()  # no tools: the answer is in the text

    async def verify(self, body: ExampleMultiRewardVerifyRequest) -> ExampleMultiRewardVerifyResponse:
        text = "\n".join(body.response.assistant_texts()).strip()
        components, extracted = score_components(text, body.expected_answer, body.max_words)
        reward = sum(self.config.reward_weights[name] * score for name, score in components.items())
        return ExampleMultiRewardVerifyResponse(
            **body.model_dump(),
            reward=reward,
            reward_components=components,
            **components,
            extracted_answer=extracted,
            word_count=len(text.split()),
        )

    # -- /aggregate_metrics hooks ---------------------------------------------------------------------------

    def compute_metrics(self, tasks: list[list[dict]]) -> dict[str, Any]:
        """pass@k, pass@1[avg-of-k] and majority@k (by extracted answer) of every component, in percent."""
        metrics, *_ = compute_pass_majority_metrics(tasks, score_fn=component_scores, answer_key="extracted_answer")
        return metrics

    def get_key_metrics(self, agent_metrics: dict[str, Any]) -> dict[str, Any]:
        """The mean reward, tokens and components, and each metric family at its largest k."""
        means = ["mean/reward", *(f"mean/{name}" for name in COMPONENTS), "mean/input_tokens", "mean/output_tokens"]
        key_metrics = {name: agent_metrics[name] for name in means if name in agent_metrics}
        for pattern in ("pass@{k}", "pass@1[avg-of-{k}]", "majority@{k}"):
            key_metrics.update(highest_k_metrics(agent_metrics, pattern, exclude_names=["no_answer"]))
        return key_metrics


if __name__ == "__main__":
    ExampleMultiRewardResourcesServer.run_webserver()
