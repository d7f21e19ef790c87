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
