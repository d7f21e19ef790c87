import math

import pytest
from omegaconf import OmegaConf

from nemo_gym.errors import NeMoGymConfigError
from nemo_gym.config.overrides import (
    Override,
    apply_overrides,
    deletions,
    overrides_to_dict,
    parse_override,
    parse_overrides,
    parse_value,
)


@pytest.mark.parametrize(
    "text, kind, key",
    [
        ("+a=1", "add", "a"),
        ("++a=1", "force_add", "a"),
        ("a=1", "set", "a"),
        ("~a", "delete", "a"),
        ("~a=1", "delete", "a"),
        ("+a.b.c=1", "add", "a.b.c"),
        ("  +padded=1", "add", "padded"),
        ("+with-dash_and_digits9=1", "add", "with-dash_and_digits9"),
    ],
)
def test_kinds_and_keys(text, kind, key):
    ov = parse_override(text)
    assert ov.kind == kind
    assert ov.key == key
    assert ov.key_path == tuple(key.split("."))


@pytest.mark.parametrize(
    "value_text, expected",
    [
        ("1", 1),
        ("-5", -5),
        ("1_000", 1000),
        ("0", 0),
        ("007", "007"),
        ("1.5", 1.5),
        (".5", 0.5),
        ("1.", 1.0),
        ("1e3", 1000.0),
        ("-1.5e-2", -0.015),
        ("true", True),
        ("True", True),
        ("FALSE", False),
        ("null", None),
        ("NULL", None),
        ("hello", "hello"),
        ("  hello world  ", "hello world"),
        ("v1.2.3", "v1.2.3"),
        ("http://localhost:8000/v1", "http://localhost:8000/v1"),
        ("a=b", "a=b"),
        ("", ""),
        ("'quoted, with comma'", "quoted, with comma"),
        ('"double"', "double"),
        ("'it\\'s'", "it's"),
        ('"say \\"hi\\""', 'say "hi"'),
        ("'back\\\\slash'", "back\\slash"),
        ("'true'", "true"),
        ("'123'", "123"),
        ("[]", []),
        ("[a,b]", ["a", "b"]),
        ("[ a , b ]", ["a", "b"]),
        ("[1,2.5,true,null]", [1, 2.5, True, None]),
        ("[a,[b,[c]]]", ["a", ["b", ["c"]]]),
        ("['x,y',z]", ["x,y", "z"]),
        ("{}", {}),
        ("{a:1,b:[x,y]}", {"a": 1, "b": ["x", "y"]}),
        ("{a: {b: c}}", {"a": {"b": "c"}}),
        ("{url: http://h:80}", {"url": "http://h:80"}),
        ("[{name: a, type: train}]", [{"name": "a", "type": "train"}]),
        ("${policy_base_url}", "${policy_base_url}"),
        ("${oc.env:HOME,/tmp}", "${oc.env:HOME,/tmp}"),
        ("${swap_key:a.b}", "${swap_key:a.b}"),
        ("${oc.select:a.b,{}}", "${oc.select:a.b,{}}"),
        ("prefix-${x}-suffix", "prefix-${x}-suffix"),
        ("[${oc.env:A,b},c]", ["${oc.env:A,b}", "c"]),
        ("{k: ${oc.env:A,1}}", {"k": "${oc.env:A,1}"}),
    ],
)
def test_values(value_text, expected):
    assert parse_override(f"+k={value_text}").value == expected


def test_special_floats():
    assert parse_value("inf") == math.inf
    assert parse_value("-inf") == -math.inf
    assert math.isnan(parse_value("nan"))


def test_delete_with_and_without_value():
    assert parse_override("~a").has_value is False
    ov = parse_override("~a=[1,2]")
    assert ov.has_value is True and ov.value == [1, 2]


@pytest.mark.parametrize(
    "text, fragment",
    [
        ("+a=[1,2", "missing closing `]`"),
        ("+a={b:1", "missing closing `}`"),
        ("+a=a,b", "unbracketed `,`"),
        ("+config_paths=a.yaml,b.yaml", "key=[a,b]"),
        ("+a='abc", "unclosed quote"),
        ("+a=${x", "unclosed interpolation"),
        ("+a=[1,,2]", "empty list element"),
        ("+a=[x]y", "unexpected `y`"),
        ("+a={b}", "expected `:`"),
        ("+=1", "missing key"),
        ("+a..b=1", "empty key segment"),
        ("+a b=1", "invalid character ` `"),
        ("foo", "missing `=`"),
        ("--verbose", "flags are not overrides"),
    ],
)
def test_bad_syntax(text, fragment):
    with pytest.raises(NeMoGymConfigError) as info:
        parse_override(text)
    message = str(info.value)
    assert message.startswith(f"Bad override `{text}`")
    assert fragment in message


def test_bad_syntax_points_at_the_problem():
    with pytest.raises(NeMoGymConfigError) as info:
        parse_override("+a=[1,,2]")
    lines = str(info.value).splitlines()
    assert lines[1].strip() == "+a=[1,,2]"
    # The caret sits under the second comma.
    assert lines[2].index("^") == lines[1].index("+") + len("+a=[1,")


def test_overrides_to_dict_nests_and_later_wins():
    ovs = parse_overrides(["+a.b=1", "++a.c=[x]", "d=2", "+a.b=3", "~d"])
    assert overrides_to_dict(ovs) == {"a": {"b": 3, "c": ["x"]}}
    assert [o.key for o in deletions(ovs)] == ["d"]


def test_parse_overrides_empty():
    assert parse_overrides(None) == []
    assert parse_overrides([]) == []


def test_apply_overrides_merges_dicts_and_replaces_scalars():
    cfg = OmegaConf.create({"a": {"x": 1, "y": "${b}"}, "b": 2, "c": 5, "l": [1, 2]})
    apply_overrides(cfg, ["+a={z:3}", "++c.d=1", "l=[9]", "+new.deep.key=v"])
    assert OmegaConf.to_container(cfg) == {
        "a": {"x": 1, "y": "${b}", "z": 3},
        "b": 2,
        "c": {"d": 1},
        "l": [9],
        "new": {"deep": {"key": "v"}},
    }


def test_apply_overrides_deletes_in_order():
    cfg = OmegaConf.create({"a": {"x": 1}, "b": 2})
    apply_overrides(cfg, ["~a", "+a.q=1", "~b"])
    assert OmegaConf.to_container(cfg) == {"a": {"q": 1}}


def test_delete_missing_key_names_it():
    cfg = OmegaConf.create({"a": {"x": 1}})
    with pytest.raises(NeMoGymConfigError, match=r"key `a\.y` is not in the config"):
        apply_overrides(cfg, ["~a.y"])
    with pytest.raises(NeMoGymConfigError, match=r"key `nope\.x` is not in the config"):
        apply_overrides(cfg, ["~nope.x"])


def test_delete_with_value_must_match():
    cfg = OmegaConf.create({"a": [1]})
    with pytest.raises(NeMoGymConfigError, match=r"`a` is \[1\], not \[2\]"):
        apply_overrides(cfg, ["~a=[2]"])
    apply_overrides(cfg, [Override(text="~a=[1]", kind="delete", key="a", value=[1])])
    assert "a" not in cfg
