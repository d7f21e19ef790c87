"""Asking a judge model whether two answers agree, from a resources server's verifier.

A judge call is one `/v1/responses` request to a model server of the stack (named by its server id): an optional
system message, then the verifier's filled-in prompt as the user message, on top of the verifier's base model
parameters. The prompt asks the judge to end its reply with one of two labels; the label written first in the
last `output_text` part of the judge's last output item is the verdict. A reply whose last item is not a message
(the judge ran out of tokens while reasoning) or that holds neither label has no verdict (None).

Every call comes back as a `JudgeEvaluation` (what was sent, what came back, the verdict), so verifiers can put
the calls next to the reward and a score can be audited. A call that fails (HTTP error, unreadable reply, no
answer within the judge timeout) raises `JudgeError`, and so does a reply without a verdict unless the server's
`judge_unparseable_verdict` is `zero` (`nemo_gym.verifiers.judge`): `/verify` then answers `judge_failed`.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Optional

from pydantic import BaseModel

from nemo_gym.api.schemas import NeMoGymEasyInputMessage, NeMoGymResponse, NeMoGymResponseCreateParamsNonStreaming
from nemo_gym.http.client import ServerClient, get_response_json, raise_for_status
from nemo_gym.verifiers.judge import bounded_judge_call, judge_timeout_s, no_verdict

__all__ = ["JudgeEvaluation", "verdict_label", "ask_judge"]


class JudgeEvaluation(BaseModel):
    """One judge call: what was sent, what came back, and the label read from it (None: neither label)."""

    responses_create_params: NeMoGymResponseCreateParamsNonStreaming
    response: NeMoGymResponse
    verdict_label: Optional[str] = None


def verdict_label(response: NeMoGymResponse, equal_label: str, not_equal_label: str) -> Optional[str]:
    """The label that appears first in the last `output_text` part of the judge's last output item; None when
    neither appears or the last item is not a message."""
    if not response.output:
        return None
    last = response.output[-1]
    if getattr(last, "type", None) != "message":
        return None
    content = last.content
    if isinstance(content, str):
        text = content
    else:
        texts = [
            part.get("text", "") if isinstance(part, dict) else part.text
            for part in content
            if (part.get("type") if isinstance(part, dict) else part.type) == "output_text"
        ]
        text = texts[-1] if texts else ""
    found = [(text.find(label), label) for label in (equal_label, not_equal_label) if label in text]
    return min(found)[1] if found else None


async def ask_judge(
    server_client: ServerClient,
    judge_server: str,
    base_params: NeMoGymResponseCreateParamsNonStreaming,
    prompt: str,
    *,
    system_message: Optional[str],
    equal_label: str,
    not_equal_label: str,
    semaphore: Optional[asyncio.Semaphore] = None,
    timeout_s: Optional[float] = None,
    unparseable_verdict: str = "failure",
) -> JudgeEvaluation:
    """One judge call with `prompt` (`base_params` with `input` replaced), bounded by `semaphore` when given.

    `JudgeError` when the call fails or takes longer than `timeout_s` (None: `judge_timeout_s(server_client)`;
    waiting for the semaphore does not count), and when the reply holds neither label unless
    `unparseable_verdict` is `zero` (then the evaluation's `verdict_label` is None)."""
    messages = []
    if system_message:
        messages.append(NeMoGymEasyInputMessage(role="system", content=system_message))
    messages.append(NeMoGymEasyInputMessage(role="user", content=prompt))
    params = base_params.model_copy(deep=True, update={"input": messages})

    async def call() -> NeMoGymResponse:
        sent = await server_client.post(judge_server, "/v1/responses", json=params)
        await raise_for_status(sent)
        return NeMoGymResponse.model_validate(await get_response_json(sent))

    bound = judge_timeout_s(server_client, timeout_s)
    async with semaphore if semaphore is not None else contextlib.nullcontext():
        response = await bounded_judge_call(call(), judge_server, bound)
    label = verdict_label(response, equal_label, not_equal_label)
    if label is None:
        no_verdict(unparseable_verdict, judge_server, f"neither {equal_label} nor {not_equal_label}")
    return JudgeEvaluation(responses_create_params=params, response=response, verdict_label=label)
