"""Config ids as NeMo Gym v0.5 (issue 35): the bundled servers carry v0.5's ids, so v0.5-shaped benchmark configs
(`tests/fixtures/v05_benchmarks/`) and v0.5's documented overrides work on our tree, with the real config parser;
and our old ids (`mcqa_resources_server`) still name the same servers where that is cheap."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from omegaconf import DictConfig

from nemo_gym.config.global_config import get_first_server_config_dict, load_server_config, parse_global_config
from nemo_gym.config.types import parse_dataset_config
from nemo_gym.errors import NeMoGymConfigError
from nemo_gym.rollouts.data_prep import POLICY_PLACEHOLDERS
from tests.conftest import REPO_ROOT

MODEL_CONFIG = "responses_api_models/openai_model/configs/openai_model.yaml"
FIXTURES = "tests/fixtures/v05_benchmarks"
PORT = "++mcqa.resources_servers.mcqa.port=1"  # the parser reserves no ports here; a server config needs one

# v0.5 keeps the `_resources_server` suffix on these servers' blocks (read in NVIDIA-NeMo/Gym's configs).
V05_SUFFIXED = {
    "arc_agi",
    "example_multi_step",
    "example_session_state_mgmt",
    "single_step_tool_use_with_argument_comparison",
}
# The licenses NeMo Gym v0.5's DatasetConfig accepts.
V05_LICENSES = (
    "Apache 2.0",
    "MIT",
    "Creative Commons Attribution 4.0 International",
    "Creative Commons Attribution-ShareAlike 4.0 International",
    "CC BY-SA 4.0",
    "CC BY-NC 3.0",
    "NVIDIA Internal Use Only, Do Not Distribute",
    "NVIDIA Evaluation Dataset License Agreement",
    "TBD",
    "GNU General Public License v3.0",
)


def _parse(*config_paths: str, overrides: tuple[str, ...] = (), cwd: Path = REPO_ROOT):
    return parse_global_config(
        [f"+config_paths=[{','.join([*config_paths, MODEL_CONFIG])}]", *overrides],
        cwd=cwd,
        allocate_ports=False,
        initial_global_config_dict=POLICY_PLACEHOLDERS,
        load_env_yaml=False,
    )


def _servers(cfg) -> set[str]:
    kinds = ("resources_servers", "responses_api_agents")
    return {k for k, v in cfg.items() if isinstance(v, DictConfig) and any(t in v for t in kinds)}


def _bundled_server_configs() -> list[Path]:
    return sorted(
        p for p in (REPO_ROOT / "resources_servers").glob("*/configs/*.yaml") if p.stem == p.parent.parent.name
    )


# ------------------------------------------------------------------------------------------------ the ids


@pytest.mark.parametrize("config", _bundled_server_configs(), ids=lambda p: p.stem)
def test_each_bundled_server_block_carries_v05s_id(config):
    name = config.stem
    blocks = yaml.safe_load(config.read_text())
    resources = [k for k, v in blocks.items() if isinstance(v, dict) and "resources_servers" in v]
    agents = [k for k, v in blocks.items() if isinstance(v, dict) and "responses_api_agents" in v]
    expected = f"{name}_resources_server" if name in V05_SUFFIXED else name
    assert resources == [expected]
    for agent in agents:
        assert agent.startswith(f"{name}_") and agent.endswith("_agent")
        impl = next(iter(blocks[agent]["responses_api_agents"].values()))
        assert impl["resources_server"]["name"] == expected


def test_no_repo_file_names_a_renamed_server_by_its_old_id():
    renamed = [p.stem for p in _bundled_server_configs() if p.stem not in V05_SUFFIXED]
    old_ids = {f"{name}_resources_server" for name in renamed}
    offenders = []
    alias_module = REPO_ROOT / "nemo_gym" / "config" / "legacy_ids.py"  # names the old spelling on purpose
    for folder in ("resources_servers", "benchmarks", "configs", "environments", "perf", "nemo_gym"):
        for path in (REPO_ROOT / folder).rglob("*"):
            if path.suffix in (".yaml", ".py", ".tmpl") and path.is_file() and path != alias_module:
                words = set(path.read_text(errors="replace").replace("`", " ").split())
                offenders += [f"{path.relative_to(REPO_ROOT)}: {w}" for w in old_ids & words]
    assert offenders == []


# ------------------------------------------------------------------------------------- v0.5 benchmark configs


def test_a_v05_mcqa_benchmark_builds_on_mcqa_and_mcqa_simple_agent():
    cfg = _parse(f"{FIXTURES}/number_facts/config.yaml")
    assert _servers(cfg) == {"number_facts_mcqa_resources_server", "number_facts_mcqa_simple_agent"}
    agent = get_first_server_config_dict(cfg, "number_facts_mcqa_simple_agent")
    assert agent.resources_server.name == "number_facts_mcqa_resources_server"
    assert agent.entrypoint == "app.py"  # inherited from mcqa_simple_agent
    (dataset,) = agent.datasets
    parsed = parse_dataset_config(dict(dataset))
    assert (parsed.type, parsed.num_repeats, parsed.license) == ("benchmark", 2, "TBD")
    assert parsed.prepare_script == "tests.fixtures.v05_benchmarks.number_facts.prepare"
    server = get_first_server_config_dict(cfg, "number_facts_mcqa_resources_server")
    assert (server.entrypoint, server.domain) == ("app.py", "knowledge")


def test_a_v05_math_benchmark_repoints_a_field_of_math_with_judge():
    cfg = _parse(f"{FIXTURES}/word_sums/config.yaml")
    assert _servers(cfg) == {"word_sums_math_with_judge_resources_server", "word_sums_math_with_judge_simple_agent"}
    server = get_first_server_config_dict(cfg, "word_sums_math_with_judge_resources_server")
    assert server.should_use_judge is False
    assert server.judge_model_server.name == "policy_model"  # the rest comes from math_with_judge
    agent = get_first_server_config_dict(cfg, "word_sums_math_with_judge_simple_agent")
    assert agent.datasets[0].num_repeats == 4


def test_a_v05_benchmark_that_inherits_only_the_agent_keeps_the_bundled_server():
    cfg = _parse(f"{FIXTURES}/short_instructions/config.yaml")
    assert _servers(cfg) == {"instruction_following", "short_instructions_instruction_following_simple_agent"}
    agent = get_first_server_config_dict(cfg, "short_instructions_instruction_following_simple_agent")
    assert agent.resources_server.name == "instruction_following"


# ------------------------------------------------------------------------------------- v0.5's override


def test_v05s_documented_mcqa_override_reaches_the_mcqa_server_config():
    from resources_servers.mcqa.app import MCQAResourcesServerConfig

    cfg = _parse("resources_servers/mcqa/configs/mcqa.yaml",
                 overrides=("++mcqa.resources_servers.mcqa.grading_mode=lenient_boxed", PORT))
    assert _servers(cfg) == {"mcqa", "mcqa_simple_agent"}  # applied to the block, not a new one
    assert load_server_config(MCQAResourcesServerConfig, "mcqa", cfg).grading_mode == "lenient_boxed"


def test_the_mcqa_override_reaches_a_benchmark_built_on_mcqa():
    cfg = _parse(f"{FIXTURES}/number_facts/config.yaml",
                 overrides=("++mcqa.resources_servers.mcqa.grading_mode=lenient_boxed",))
    server = get_first_server_config_dict(cfg, "number_facts_mcqa_resources_server")
    assert server.grading_mode == "lenient_boxed"


def test_an_mcqa_grading_mode_v05_does_not_know_is_refused_naming_the_server():
    from resources_servers.mcqa.app import MCQAResourcesServerConfig

    cfg = _parse("resources_servers/mcqa/configs/mcqa.yaml",
                 overrides=("++mcqa.resources_servers.mcqa.grading_mode=lenient", PORT))
    with pytest.raises(NeMoGymConfigError, match="mcqa"):
        load_server_config(MCQAResourcesServerConfig, "mcqa", cfg)


# ------------------------------------------------------------------------------------------------ licenses


@pytest.mark.parametrize("license_", V05_LICENSES)
@pytest.mark.parametrize("dataset_type", ["train", "validation", "example", "benchmark"])
def test_every_license_v05_accepts_is_accepted(license_, dataset_type):
    raw = {"name": "d", "type": dataset_type, "jsonl_fpath": "d.jsonl", "license": license_}
    if dataset_type == "benchmark":
        raw["prepare_script"] = "benchmarks/d/prepare.py"
    assert parse_dataset_config(raw).license == license_


def test_a_license_v05_refuses_is_refused():
    with pytest.raises(ValueError, match="license"):
        parse_dataset_config({"name": "d", "type": "train", "jsonl_fpath": "d.jsonl", "license": "Public domain"})


# ------------------------------------------------------------------------------------------------ old ids


def _write(tmp_path: Path, text: str) -> str:
    path = tmp_path / "mine.yaml"
    path.write_text(text)
    return str(path)


def test_an_old_id_in_a_server_reference_names_the_renamed_server(tmp_path):
    mine = _write(tmp_path, """
my_agent:
  responses_api_agents:
    simple_agent:
      entrypoint: app.py
      resources_server: {type: resources_servers, name: mcqa_resources_server}
      model_server: {type: responses_api_models, name: policy_model}
""")
    cfg = _parse(f"{REPO_ROOT}/resources_servers/mcqa/configs/mcqa.yaml", mine)
    assert get_first_server_config_dict(cfg, "my_agent").resources_server.name == "mcqa"
    assert "mcqa_resources_server" not in cfg


def test_inherit_from_an_old_id_builds_on_the_renamed_block(tmp_path):
    mine = _write(tmp_path, """
my_mcqa:
  _inherit_from: mcqa_resources_server
  resources_servers:
    mcqa:
      grading_mode: lenient_answer_colon
""")
    cfg = _parse(f"{REPO_ROOT}/resources_servers/mcqa/configs/mcqa.yaml", mine,
                 overrides=("++mcqa_simple_agent.responses_api_agents.simple_agent.resources_server.name=my_mcqa",))
    assert "mcqa" not in cfg  # moved, as `_inherit_from: mcqa` would
    server = get_first_server_config_dict(cfg, "my_mcqa")
    assert (server.entrypoint, server.grading_mode) == ("app.py", "lenient_answer_colon")


def test_an_override_under_the_old_id_applies_to_the_renamed_block():
    cfg = _parse("resources_servers/mcqa/configs/mcqa.yaml",
                 overrides=("+mcqa_resources_server.resources_servers.mcqa.grading_mode=lenient_boxed",))
    assert _servers(cfg) == {"mcqa", "mcqa_simple_agent"}
    assert get_first_server_config_dict(cfg, "mcqa").grading_mode == "lenient_boxed"


def test_a_lookup_by_the_old_id_finds_the_renamed_server():
    cfg = _parse("resources_servers/mcqa/configs/mcqa.yaml")
    assert get_first_server_config_dict(cfg, "mcqa_resources_server").entrypoint == "app.py"


def test_the_short_id_names_a_server_v05_keeps_suffixed(tmp_path):
    mine = _write(tmp_path, """
my_arc:
  _inherit_from: arc_agi
""")
    cfg = _parse(f"{REPO_ROOT}/resources_servers/arc_agi/configs/arc_agi.yaml", mine,
                 overrides=("++arc_agi_simple_agent.responses_api_agents.simple_agent.resources_server.name=my_arc",))
    assert "arc_agi_resources_server" not in cfg
    assert get_first_server_config_dict(cfg, "my_arc").entrypoint == "app.py"


def test_a_block_of_both_spellings_is_two_servers(tmp_path):
    """The alias is only for an id no block has: a complete block under the old id stays a server of its own."""
    mine = _write(tmp_path, """
mcqa_resources_server:
  resources_servers:
    mcqa: {entrypoint: app.py, domain: knowledge}
""")
    cfg = _parse(f"{REPO_ROOT}/resources_servers/mcqa/configs/mcqa.yaml", mine)
    assert {"mcqa", "mcqa_resources_server"} <= _servers(cfg)


def test_an_unknown_id_is_still_an_error_with_a_suggestion(tmp_path):
    mine = _write(tmp_path, """
my_agent:
  responses_api_agents:
    simple_agent:
      entrypoint: app.py
      resources_server: {type: resources_servers, name: mcqa_resource_server}
      model_server: {type: responses_api_models, name: policy_model}
""")
    with pytest.raises(NeMoGymConfigError, match="mcqa_resource_server"):
        _parse(f"{REPO_ROOT}/resources_servers/mcqa/configs/mcqa.yaml", mine)
