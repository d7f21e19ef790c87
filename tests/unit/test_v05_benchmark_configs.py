"""NeMo Gym v0.5's benchmark configs for environments we ship, unchanged (`tests/fixtures/v05_benchmarks/<name>/`,
same keys and values as v0.5's `benchmarks/<name>/config*.yaml`), resolved from a folder laid out like a v0.5
checkout: `benchmarks/` in the working directory, the bundled `resources_servers/...` configs they chain to found
in the install folder.

Two checks per config, both as `ng_run` would meet it: `ng_validate`'s whole-config check, and each server block
(after `_inherit_from` / `_swap_key` / `${swap_key:}`) validated into the config class of the server that would
start, so a value a server refuses (e.g. an unknown `grading_mode`) fails here rather than at start."""

from __future__ import annotations

import importlib
import inspect
from pathlib import Path

import pytest
from omegaconf import DictConfig

from nemo_gym.cli.commands.validate import validate_config
from nemo_gym.config.global_config import find_server_instances, parse_global_config, resolve_server_config
from nemo_gym.config.types import validate_server_config
from nemo_gym.errors import NeMoGymConfigError
from nemo_gym.rollouts.data_prep import POLICY_PLACEHOLDERS
from tests.conftest import REPO_ROOT

FIXTURES = REPO_ROOT / "tests/fixtures/v05_benchmarks"
MODEL_CONFIG = "responses_api_models/openai_model/configs/openai_model.yaml"
JUDGE_SETTINGS = ("+judge_base_url=http://127.0.0.1:1/v1", "+judge_api_key=x", "+judge_model_name=judge")

# config file(s) under benchmarks/ -> (command-line extras, the benchmark's blocks: {id: server type}).
V05_BENCHMARK_CONFIGS = {
    "aime24": (("aime24/config.yaml",), (), {
        "aime24_math_with_judge_resources_server": "resources_servers",
        "aime24_math_with_judge_simple_agent": "responses_api_agents",
    }),
    "aime24+judge_remote": (("aime24/config.yaml", "aime24/judge_remote.yaml"), JUDGE_SETTINGS, {
        "aime24_math_with_judge_resources_server": "resources_servers",
        "aime24_math_with_judge_simple_agent": "responses_api_agents",
        "judge_model": "responses_api_models",
    }),
    "aime25": (("aime25/config.yaml",), (), {
        "aime24_math_with_judge_resources_server": "resources_servers",
        "aime24_math_with_judge_simple_agent": "responses_api_agents",
    }),
    "gpqa": (("gpqa/config.yaml",), (), {
        "gpqa_mcqa_resources_server": "resources_servers",
        "gpqa_mcqa_simple_agent": "responses_api_agents",
    }),
    "mmlu": (("mmlu/config.yaml",), (), {
        "mmlu_mcqa_resources_server": "resources_servers",
        "mmlu_mcqa_simple_agent": "responses_api_agents",
    }),
    "mmlu_pro": (("mmlu_pro/config.yaml",), (), {
        "mmlu_pro_mcqa_resources_server": "resources_servers",
        "mmlu_pro_mcqa_simple_agent": "responses_api_agents",
    }),
    "ifeval": (("ifeval/config.yaml",), (), {
        "instruction_following": "resources_servers",
        "ifeval_instruction_following_simple_agent": "responses_api_agents",
    }),
    "ifbench": (("ifbench/config.yaml",), (), {
        "ifbench_instruction_following_resources_server": "resources_servers",
        "ifbench_instruction_following_simple_agent": "responses_api_agents",
    }),
    "hle": (("hle/config.yaml",), (), {
        "hle_equivalence_llm_judge_resources_server": "resources_servers",
        "hle_equivalence_llm_judge_simple_agent": "responses_api_agents",
    }),
    "livecodebench": (("livecodebench/config.yaml",), (), {
        "code_gen": "resources_servers",
        "code_gen_simple_agent": "responses_api_agents",
    }),
    "livecodebench/v5_2408_2502": (("livecodebench/v5_2408_2502/config.yaml",), (), {
        "lcbv5_code_gen_resources_server": "resources_servers",
        "lcbv5_code_gen_simple_agent": "responses_api_agents",
    }),
    "livecodebench/v5_2408_2502/cascade": (("livecodebench/v5_2408_2502/cascade.yaml",), (), {
        "livecodebench_v5_cascade_code_gen_resources_server": "resources_servers",
        "livecodebench_v5_cascade_code_gen_simple_agent": "responses_api_agents",
    }),
    "livecodebench/v6_2408_2505": (("livecodebench/v6_2408_2505/config.yaml",), (), {
        "lcbv6_code_gen_resources_server": "resources_servers",
        "lcbv6_code_gen_simple_agent": "responses_api_agents",
    }),
    "comp_math_24_25": (("comp_math_24_25/config.yaml",), (), {
        "comp_math_24_25_math_with_judge_resources_server": "resources_servers",
        "comp_math_24_25_math_with_judge_simple_agent": "responses_api_agents",
    }),
    "hmmt_nov25": (("hmmt_nov25/config.yaml",), (), {
        "hmmt_nov25_math_with_judge_resources_server": "resources_servers",
        "hmmt_nov25_math_with_judge_simple_agent": "responses_api_agents",
    }),
}


@pytest.fixture
def v05_tree(tmp_path: Path) -> Path:
    """A working directory laid out like a v0.5 checkout: `benchmarks/` holds the fixtures."""
    (tmp_path / "benchmarks").symlink_to(FIXTURES, target_is_directory=True)
    return tmp_path


def _args(files, extras) -> list[str]:
    paths = ",".join([*(f"benchmarks/{f}" for f in files), MODEL_CONFIG])
    return [f"+config_paths=[{paths}]", *extras]


def _server_class(server_type: str, impl: str) -> type:
    """The server class `<server_type>/<impl>/app.py` runs (the one whose `config` field is its config model)."""
    module = importlib.import_module(f"{server_type}.{impl}.app")
    found = [
        cls for _, cls in inspect.getmembers(module, inspect.isclass)
        if cls.__module__ == module.__name__ and "config" in getattr(cls, "model_fields", {})
    ]
    assert found, f"no server class in {module.__name__}"
    return found[-1]


@pytest.mark.parametrize("name", V05_BENCHMARK_CONFIGS)
def test_ng_validate_accepts_v05s_benchmark_config(v05_tree, name):
    files, extras, blocks = V05_BENCHMARK_CONFIGS[name]
    report = validate_config(_args(files, extras), cwd=v05_tree)
    assert report.ok, "\n".join(str(p) for p in report.problems)
    assert set(blocks) <= set(report.server_ids), report.server_ids


@pytest.mark.parametrize("name", V05_BENCHMARK_CONFIGS)
def test_each_block_of_v05s_benchmark_config_is_accepted_by_its_server(v05_tree, name):
    files, extras, blocks = V05_BENCHMARK_CONFIGS[name]
    cfg = parse_global_config(
        _args(files, extras), cwd=v05_tree, allocate_ports=False, initial_global_config_dict=POLICY_PLACEHOLDERS,
        load_env_yaml=False,
    )
    specs = {spec.server_id: spec for spec in find_server_instances(cfg)}
    for server_id, server_type in blocks.items():
        spec = specs[server_id]
        assert spec.server_type == server_type
        data = {"host": "127.0.0.1", "port": 1, **resolve_server_config(cfg, server_id)}
        config_cls = _server_class(spec.server_type, spec.impl).model_fields["config"].annotation
        validate_server_config(config_cls, data, server_id=server_id)


def test_the_benchmark_servers_keep_v05s_settings(v05_tree):
    """What each v0.5 benchmark sets on its server reaches the validated config (not only the YAML)."""
    from resources_servers.equivalence_llm_judge.app import LLMJudgeResourcesServerConfig
    from resources_servers.mcqa.app import MCQAResourcesServerConfig

    def block(files, server_id, extras=()):
        cfg = parse_global_config(
            _args(files, extras), cwd=v05_tree, allocate_ports=False,
            initial_global_config_dict=POLICY_PLACEHOLDERS, load_env_yaml=False,
        )
        return {"host": "127.0.0.1", "port": 1, **resolve_server_config(cfg, server_id)}

    for name in ("gpqa", "mmlu", "mmlu_pro"):
        data = block((f"{name}/config.yaml",), f"{name}_mcqa_resources_server")
        config = validate_server_config(MCQAResourcesServerConfig, data, server_id=name)
        assert config.grading_mode == "lenient_answer_colon_md", name
    hle = validate_server_config(
        LLMJudgeResourcesServerConfig,
        block(("hle/config.yaml",), "hle_equivalence_llm_judge_resources_server"),
        server_id="hle",
    )
    assert (hle.judge_equal_label, hle.judge_not_equal_label) == ("Judgement: yes", "Judgement: no")
    assert hle.judge_prompt_template_fpath == "benchmarks/hle/prompts/judge.txt"
    assert (hle.use_per_record_regex, hle.check_twice_swap, hle.judge_system_message) == (False, False, "")


def test_a_grading_mode_mcqa_does_not_have_is_refused_before_start(v05_tree):
    """The check above can fail: an mcqa grading mode that does not exist is refused with the server named."""
    from resources_servers.mcqa.app import MCQAResourcesServerConfig

    cfg = parse_global_config(
        _args(("mmlu_pro/config.yaml",), ("++mmlu_pro_mcqa_resources_server.resources_servers.mcqa.grading_mode=x",)),
        cwd=v05_tree, allocate_ports=False, initial_global_config_dict=POLICY_PLACEHOLDERS, load_env_yaml=False,
    )
    data = {"host": "127.0.0.1", "port": 1, **resolve_server_config(cfg, "mmlu_pro_mcqa_resources_server")}
    with pytest.raises(NeMoGymConfigError, match="mmlu_pro_mcqa_resources_server"):
        validate_server_config(MCQAResourcesServerConfig, data, server_id="mmlu_pro_mcqa_resources_server")


def test_v05s_nooa_variant_of_mmlu_names_the_agent_we_do_not_ship(v05_tree):
    report = validate_config(_args(("mmlu/config_nooa.yaml",), ()), cwd=v05_tree)
    assert not report.ok
    assert "nooa_agent" in str(report.error())


def test_the_benchmarks_datasets_keep_v05s_fields(v05_tree):
    cfg = parse_global_config(
        _args(("gpqa/config.yaml",), ()), cwd=v05_tree, allocate_ports=False,
        initial_global_config_dict=POLICY_PLACEHOLDERS, load_env_yaml=False,
    )
    agent = resolve_server_config(cfg, "gpqa_mcqa_simple_agent")
    (dataset,) = agent["datasets"]
    assert dataset["type"] == "benchmark" and dataset["num_repeats"] == 8
    assert dataset["prompt_config"] == "benchmarks/gpqa/prompts/default.yaml"
    assert agent["resources_server"]["name"] == "gpqa_mcqa_resources_server"
    assert isinstance(cfg, DictConfig)
