"""The judge settings of resources servers (nemo_gym/verifiers/judge.py): `judge_timeout_s` and
`judge_unparseable_verdict` (issue 37). The servers' own tests cover each server's use of them."""

from __future__ import annotations

import asyncio

import pytest
from pydantic import ValidationError

from nemo_gym.config.known_keys import GlobalKeys
from nemo_gym.judge import JudgeError
from nemo_gym.verifiers.judge import (
    DEFAULT_JUDGE_TIMEOUT_S,
    JudgeSettings,
    bounded_judge_call,
    judge_timeout_s,
    no_verdict,
)


class Client:
    def __init__(self, config):
        self.global_config_dict = config


def test_defaults_fail_on_a_missing_verdict_and_bound_calls_at_300_s():
    settings = JudgeSettings()
    assert settings.judge_unparseable_verdict == "failure" and settings.judge_timeout_s is None
    assert DEFAULT_JUDGE_TIMEOUT_S == 300.0 == GlobalKeys.model_fields["judge_timeout_s"].default


@pytest.mark.parametrize("value", ["ignore", "", None])
def test_unparseable_verdict_takes_failure_or_zero(value):
    with pytest.raises(ValidationError, match="judge_unparseable_verdict"):
        JudgeSettings(judge_unparseable_verdict=value)


@pytest.mark.parametrize("value", [0, -1])
def test_judge_timeout_must_be_positive(value):
    with pytest.raises(ValidationError, match="judge_timeout_s"):
        JudgeSettings(judge_timeout_s=value)


@pytest.mark.parametrize(
    "own, config, expected",
    [
        (5, {"judge_timeout_s": 60}, 5.0),  # the server block wins
        (None, {"judge_timeout_s": 60}, 60.0),  # then the global key
        (None, {"judge_timeout_s": "45"}, 45.0),  # as a command line gives it
        (None, {}, DEFAULT_JUDGE_TIMEOUT_S),
        (None, None, DEFAULT_JUDGE_TIMEOUT_S),
        (None, {"judge_timeout_s": "soon"}, DEFAULT_JUDGE_TIMEOUT_S),  # unreadable: the default
    ],
)
def test_judge_timeout_resolution(own, config, expected):
    assert judge_timeout_s(Client(config), own) == expected


def test_a_client_without_a_config_gets_the_default():
    assert judge_timeout_s(object()) == DEFAULT_JUDGE_TIMEOUT_S


def test_no_verdict_raises_with_failure_and_names_the_server_and_the_key():
    with pytest.raises(JudgeError, match=r"judge server `judge_model` holds no verdict \(no label\).*"
                                         r"judge_unparseable_verdict: failure; set it to zero"):
        no_verdict("failure", "judge_model", "no label")
    assert no_verdict("zero", "judge_model", "no label") is None


def test_bounded_judge_call_expiry_is_a_judge_error_and_cancels_the_call():
    cancelled = []

    async def hung_call():
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            cancelled.append(True)
            raise

    with pytest.raises(JudgeError, match=r"judge server `j` gave no answer within 0.1 s \(judge_timeout_s; set it"):
        asyncio.run(bounded_judge_call(hung_call(), "j", 0.1))
    assert cancelled == [True]


def test_bounded_judge_call_turns_other_failures_into_judge_errors():
    async def failing():
        raise ValueError("bad body")

    with pytest.raises(JudgeError, match="ValueError: bad body"):
        asyncio.run(bounded_judge_call(failing(), "j", 5))
    assert asyncio.run(bounded_judge_call(asyncio.sleep(0, result=7), "j", 5)) == 7
