"""Reading size limits from config: one reader for every byte-count key, so each refuses bad values the same way."""

import pytest

from nemo_gym.config.values import byte_count
from nemo_gym.errors import NeMoGymConfigError
from nemo_gym.http.response import DEFAULT_MAX_RESPONSE_BODY_BYTES, max_response_body_bytes


@pytest.mark.parametrize("value, expected", [(None, 99), ("", 99), ("  ", 99), (" 12 ", 12), (5, 5), ("4096", 4096)])
def test_a_positive_count_or_nothing_reads(value, expected):
    assert byte_count({"limit_key": value}, "limit_key", 99, limits="what it limits") == expected
    assert byte_count({}, "limit_key", 99, limits="what it limits") == 99
    assert byte_count(None, "limit_key", 99, limits="what it limits") == 99


@pytest.mark.parametrize("value", [0, -1, "0", "-3", "lots", 2.5, True, [1]])
def test_anything_else_is_refused_naming_the_key_and_what_it_limits(value):
    with pytest.raises(NeMoGymConfigError, match=r"`limit_key` must be a positive whole number of bytes \(what it "
                       r"limits\).*Remove it for the default \(99 bytes\)"):
        byte_count({"limit_key": value}, "limit_key", 99, limits="what it limits")


def test_the_response_cap_uses_it():
    assert max_response_body_bytes({}) == DEFAULT_MAX_RESPONSE_BODY_BYTES
    with pytest.raises(NeMoGymConfigError, match="http_client_max_response_body_bytes.*response body"):
        max_response_body_bytes({"http_client_max_response_body_bytes": "-1"})


# -- seconds and a server's request limits (serving/limits.py) --------------------------------------------


def test_seconds_reads_numbers_and_numeric_text_and_refuses_the_rest():
    from nemo_gym.config.values import seconds

    assert seconds({}, "t", 60.0, limits="x") == 60.0
    assert seconds({"t": None}, "t", 60.0, limits="x") == 60.0
    assert seconds({"t": 2}, "t", 60.0, limits="x") == 2.0
    assert seconds({"t": " 0.5 "}, "t", 60.0, limits="x") == 0.5
    for bad in (0, -1, "soon", True, float("inf"), float("nan"), [1]):
        with pytest.raises(NeMoGymConfigError, match=r"`t` must be a positive number of seconds \(x\)"):
            seconds({"t": bad}, "t", 60.0, limits="x")


def test_request_limits_come_from_the_server_block_then_the_global_config_then_the_defaults(monkeypatch):
    from nemo_gym.config.types import BaseRunServerInstanceConfig
    from nemo_gym.serving.limits import (
        DEFAULT_MAX_REQUEST_BODY_BYTES,
        DEFAULT_MAX_REQUEST_HEAD_BYTES,
        DEFAULT_REQUEST_BODY_TIMEOUT_S,
        DEFAULT_REQUEST_HEAD_TIMEOUT_S,
        DEFAULT_RESPONSE_SEND_TIMEOUT_S,
        RequestLimits,
        request_limits,
    )

    defaults = RequestLimits(DEFAULT_MAX_REQUEST_BODY_BYTES, DEFAULT_MAX_REQUEST_HEAD_BYTES,
                             DEFAULT_REQUEST_HEAD_TIMEOUT_S, DEFAULT_REQUEST_BODY_TIMEOUT_S,
                             DEFAULT_RESPONSE_SEND_TIMEOUT_S)
    assert request_limits(None, None) == defaults
    glob = {"max_request_body_bytes": 1000, "max_request_head_bytes": "2000", "request_head_timeout_s": "3",
            "request_body_timeout_s": 4, "response_send_timeout_s": 5}
    assert request_limits(glob, None) == RequestLimits(1000, 2000, 3.0, 4.0, 5.0)
    block = BaseRunServerInstanceConfig(host="h", port=1, entrypoint="app.py", name="s", max_request_head_bytes=500,
                                        request_body_timeout_s=9, response_send_timeout_s=7)
    assert request_limits(glob, block) == RequestLimits(1000, 500, 3.0, 9.0, 7.0)
    assert request_limits(glob, {"request_head_timeout_s": 0.25}) == RequestLimits(1000, 2000, 0.25, 4.0, 5.0)
    with pytest.raises(NeMoGymConfigError, match="max_request_head_bytes"):
        request_limits({"max_request_head_bytes": "64k"}, None)
    with pytest.raises(NeMoGymConfigError, match="request_head_timeout_s"):
        request_limits({"request_head_timeout_s": -5}, None)
    with pytest.raises(NeMoGymConfigError, match="response_send_timeout_s"):
        request_limits({"response_send_timeout_s": "never"}, None)

    # A parent hands its limits to the uvicorn workers it starts through the environment.
    for name in ("NEMO_GYM_MAX_REQUEST_BODY_BYTES", "NEMO_GYM_MAX_REQUEST_HEAD_BYTES", "NEMO_GYM_REQUEST_HEAD_TIMEOUT_S",
                 "NEMO_GYM_REQUEST_BODY_TIMEOUT_S", "NEMO_GYM_RESPONSE_SEND_TIMEOUT_S"):
        monkeypatch.setenv(name, "")  # recorded, so what export_to_env sets is undone after the test
    assert RequestLimits.from_env() == defaults
    RequestLimits(1000, 500, 3.0, 0.5, 2.5).export_to_env()
    assert RequestLimits.from_env() == RequestLimits(1000, 500, 3.0, 0.5, 2.5)


def test_protocol_with_limits_sets_every_limit_on_the_protocol_and_for_its_workers(monkeypatch):
    from dataclasses import fields

    from nemo_gym.serving.limits import RequestLimits
    from nemo_gym.serving.private_api import NeMoGymHttpProtocol, protocol_with_limits

    attribute = {"max_body": "max_body", "max_head": "max_head", "head_timeout_s": "head_timeout",
                 "body_timeout_s": "body_timeout", "send_timeout_s": "send_timeout"}
    assert set(attribute) == {f.name for f in fields(RequestLimits)}  # a new limit must be mapped here too
    for name in attribute.values():  # recorded, so the class is as it was after the test
        monkeypatch.setattr(NeMoGymHttpProtocol, name, getattr(NeMoGymHttpProtocol, name))
    for name in ("NEMO_GYM_MAX_REQUEST_BODY_BYTES", "NEMO_GYM_MAX_REQUEST_HEAD_BYTES", "NEMO_GYM_REQUEST_HEAD_TIMEOUT_S",
                 "NEMO_GYM_REQUEST_BODY_TIMEOUT_S", "NEMO_GYM_RESPONSE_SEND_TIMEOUT_S"):
        monkeypatch.setenv(name, "")
    limits = RequestLimits(11, 22, 3.5, 4.5, 5.5)
    assert protocol_with_limits(limits) is NeMoGymHttpProtocol
    assert {field: getattr(NeMoGymHttpProtocol, name) for field, name in attribute.items()} == {
        "max_body": 11, "max_head": 22, "head_timeout_s": 3.5, "body_timeout_s": 4.5, "send_timeout_s": 5.5}
    assert RequestLimits.from_env() == limits
