"""NeMo Gym v0.5's config directives (`_inherit_from`, `_copy`, `_delete_key`, `${inherit_from:}`, `${copy:}`) through
the real config parser, on YAML files as a v0.5 benchmark definition writes them."""

from __future__ import annotations

import pytest
from omegaconf import OmegaConf

from nemo_gym.config.global_config import parse_global_config
from nemo_gym.config_types import ConfigError, InheritPathNotFoundError

GENERIC = """
policy_model:
  responses_api_models:
    openai_model: {entrypoint: app.py, openai_base_url: http://127.0.0.1:1/v1, openai_api_key: k, openai_model: m}
math_resources_server:
  resources_servers:
    math_with_judge:
      entrypoint: app.py
      domain: math
      should_use_judge: false
      judge_model_server: {type: responses_api_models, name: policy_model}
      judge_responses_create_params: {input: [], temperature: 0.0}
"""


def parse(tmp_path, text: str, *extra: str):
    (tmp_path / "generic.yaml").write_text(GENERIC)
    (tmp_path / "bench.yaml").write_text(text)
    overrides = [f"+config_paths=[{tmp_path / 'generic.yaml'},{tmp_path / 'bench.yaml'}]", *extra]
    cfg = parse_global_config(overrides, cwd=tmp_path, allocate_ports=False, load_env_yaml=False)
    return OmegaConf.to_container(cfg, resolve=False)


def test_inherit_from_builds_on_a_block_moves_it_and_merges_the_own_keys_deeply(tmp_path):
    data = parse(tmp_path, """
bench_resources_server:
  _inherit_from: math_resources_server
  resources_servers:
    math_with_judge:
      should_use_judge: true
      judge_responses_create_params: {temperature: 0.5}
""")
    assert "math_resources_server" not in data  # moved
    impl = data["bench_resources_server"]["resources_servers"]["math_with_judge"]
    assert impl["should_use_judge"] is True and impl["domain"] == "math"
    assert impl["judge_responses_create_params"] == {"input": [], "temperature": 0.5}


def test_swap_key_is_inherit_from_as_later_nemo_gym_benchmark_configs_write_it(tmp_path):
    data = parse(tmp_path, """
aime_math_resources_server:
  _swap_key: math_resources_server
  resources_servers:
    math_with_judge:
      datasets:
      - {name: validation, type: validation, jsonl_fpath: data/aime.jsonl, num_repeats: 32, license: TBD}
""")
    assert "math_resources_server" not in data  # moved, as `_inherit_from` does
    impl = data["aime_math_resources_server"]["resources_servers"]["math_with_judge"]
    assert impl["domain"] == "math" and impl["datasets"][0]["num_repeats"] == 32


def test_copy_keeps_the_source_and_delete_key_removes_keys_after_the_merge(tmp_path):
    data = parse(tmp_path, """
copied:
  _copy: math_resources_server.resources_servers.math_with_judge
  _delete_key: "judge_model_server, judge_responses_create_params"
  note: mine
moved_value: ${inherit_from:copied.note}
also: ${copy:math_resources_server.resources_servers.math_with_judge.domain}
""")
    assert "math_resources_server" in data  # copied, not moved
    assert data["copied"] == {"entrypoint": "app.py", "domain": "math", "should_use_judge": False}  # note moved out
    assert data["moved_value"] == "mine" and data["also"] == "math"


@pytest.mark.parametrize(
    "text, names",
    [
        ("b:\n  _inherit_from: nope_server\n", ["b._inherit_from", "nope_server"]),
        ("b: ${copy:math_resources_server.nope}\n", ["`b`", "math_resources_server.nope"]),
        ("b:\n  _copy: math_resources_server\n  _delete_key: typo\n", ["b._delete_key", "typo"]),
        ("a: {_copy: b}\nb: {_copy: a}\n", ["leads back to itself"]),
    ],
)
def test_a_bad_directive_names_the_key_and_the_path(tmp_path, text, names):
    with pytest.raises(InheritPathNotFoundError) as err:
        parse(tmp_path, text)
    assert isinstance(err.value, ConfigError)
    for name in names:
        assert name in str(err.value)
