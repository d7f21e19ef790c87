from typing import Literal, Optional

import pytest
from omegaconf import OmegaConf
from pydantic import Field, TypeAdapter, ValidationError

from nemo_gym.config.types import (
    SERVER_TYPES,
    AgentServerRef,
    BaseNeMoGymCLIConfig,
    BaseRunServerConfig,
    BaseRunServerInstanceConfig,
    BaseServerConfig,
    DatasetConfig,
    Domain,
    ModelServerRef,
    ResourcesServerInstanceConfig,
    ResourcesServerRef,
    ResponsesAPIAgentServerInstanceConfig,
    ResponsesAPIModelServerInstanceConfig,
    ServerInstanceConfig,
    ServerInstanceSpec,
    ServerRef,
    is_server_ref,
    validate_server_config,
    wants_help,
)
from nemo_gym.errors import NeMoGymConfigError
from nemo_gym.testing.asserts import error_message


def test_server_types():
    assert SERVER_TYPES == ("responses_api_models", "resources_servers", "responses_api_agents")


def test_server_refs():
    ta = TypeAdapter(ServerRef)
    assert isinstance(ta.validate_python({"type": "responses_api_models", "name": "m"}), ModelServerRef)
    assert isinstance(ta.validate_python({"type": "resources_servers", "name": "r"}), ResourcesServerRef)
    assert isinstance(ta.validate_python({"type": "responses_api_agents", "name": "a"}), AgentServerRef)
    with pytest.raises(ValidationError):
        ModelServerRef(type="resources_servers", name="x")
    assert is_server_ref({"type": "resources_servers", "name": "x"})
    assert is_server_ref(OmegaConf.create({"type": "resources_servers", "name": "x"}))
    assert not is_server_ref({"type": "train", "name": "x"})
    assert not is_server_ref({"type": "resources_servers", "name": "x", "jsonl_fpath": "y"})
    assert not is_server_ref("resources_servers")


def test_domain_values():
    assert [d.value for d in Domain] == [
        "math", "coding", "agent", "knowledge", "instruction_following", "long_context",
        "safety", "games", "translation", "e2e", "rlhf", "other",
    ]
    assert Domain("math") == "math"


def test_dataset_license_required_for_train_and_validation():
    for split in ("train", "validation"):
        with pytest.raises(ValidationError, match="A license is required for my_data"):
            DatasetConfig(name="my_data", type=split, jsonl_fpath="x.jsonl")
    ok = DatasetConfig(name="ex", type="example", jsonl_fpath="x.jsonl")
    assert ok.num_repeats == 1 and ok.license is None
    full = DatasetConfig(
        name="t", type="train", jsonl_fpath="t.jsonl", license="MIT", num_repeats=3,
        huggingface_identifier={"repo_id": "org/ds"},
        gitlab_identifier={"dataset_name": "d", "version": "0.0.1", "artifact_fpath": "t.jsonl"},
    )
    assert full.huggingface_identifier.artifact_fpath is None
    with pytest.raises(ValidationError):
        DatasetConfig(name="t", type="train", jsonl_fpath="t.jsonl", license="WTFPL")
    with pytest.raises(ValidationError):
        DatasetConfig(name="e", type="example", jsonl_fpath="e.jsonl", num_repeats=0)
    with pytest.raises(ValidationError):
        DatasetConfig(name="e", type="test", jsonl_fpath="e.jsonl")


def test_server_config_models():
    class MyConfig(BaseRunServerInstanceConfig):
        judge: str = "j"

    cfg = MyConfig(host="0.0.0.0", port=8080, entrypoint="", name="")
    assert cfg.num_workers is None and cfg.domain is None and cfg.datasets is None
    assert cfg.venv_mode is None and cfg.ray is False
    extra = BaseRunServerConfig(host="h", port=1, entrypoint="app.py", anything={"x": 1})
    assert extra.model_extra == {"anything": {"x": 1}}
    with pytest.raises(ValidationError):
        BaseServerConfig(host="h")
    with pytest.raises(ValidationError):
        BaseRunServerConfig(host="h", port=1, entrypoint="app.py", venv_mode="sometimes")


def test_block_shape_models():
    ta = TypeAdapter(ServerInstanceConfig)
    model = ta.validate_python({"responses_api_models": {"openai_model": {"entrypoint": "app.py"}}})
    assert isinstance(model, ResponsesAPIModelServerInstanceConfig)
    agent = ta.validate_python({"responses_api_agents": {"simple_agent": {"entrypoint": "app.py", "x": 1}}})
    assert isinstance(agent, ResponsesAPIAgentServerInstanceConfig)
    res = ta.validate_python({"resources_servers": {"mcqa": {"entrypoint": "app.py", "domain": "knowledge"}}})
    assert isinstance(res, ResourcesServerInstanceConfig)
    assert res.resources_servers["mcqa"].domain == Domain.KNOWLEDGE

    with pytest.raises(ValidationError, match="A domain is required for resources servers."):
        ResourcesServerInstanceConfig.model_validate({"resources_servers": {"mcqa": {"entrypoint": "app.py"}}})
    with pytest.raises(ValidationError):  # two implementations
        ResponsesAPIModelServerInstanceConfig.model_validate(
            {"responses_api_models": {"a": {"entrypoint": "app.py"}, "b": {"entrypoint": "app.py"}}}
        )
    with pytest.raises(ValidationError):  # no implementation
        ResponsesAPIModelServerInstanceConfig.model_validate({"responses_api_models": {}})
    with pytest.raises(ValidationError):  # two server types in one block
        ResponsesAPIModelServerInstanceConfig.model_validate(
            {"responses_api_models": {"a": {"entrypoint": "app.py"}}, "resources_servers": {}}
        )
    with pytest.raises(ValidationError):  # entrypoint is required
        ResponsesAPIModelServerInstanceConfig.model_validate({"responses_api_models": {"a": {"host": "h"}}})


def test_server_instance_spec():
    spec = ServerInstanceSpec("my_res", "resources_servers", "mcqa", OmegaConf.create({"entrypoint": "app.py"}))
    assert spec.dir_relpath == "resources_servers/mcqa"


def test_validate_server_config_names_server_and_field():
    class JudgeConfig(BaseRunServerInstanceConfig):
        judge_model_server: ModelServerRef

    message = error_message(
        NeMoGymConfigError,
        validate_server_config,
        JudgeConfig,
        {"host": "h", "port": 1, "entrypoint": "app.py", "name": "my_judge"},
        server_id="my_judge",
        key_path="my_judge.resources_servers.judge",
    )
    assert "Server `my_judge`" in message
    assert "missing required field `judge_model_server`" in message
    assert "+my_judge.resources_servers.judge.judge_model_server=..." in message


# --------------------------------------------------------------------------------------------------
# CLI configs
# --------------------------------------------------------------------------------------------------


class RolloutsConfig(BaseNeMoGymCLIConfig):
    """Collect rollouts from a running stack into a JSONL file."""

    output_jsonl_fpath: str = Field(description="Where to write the rollouts.")
    limit: Optional[int] = Field(default=None, description="Read at most this many input rows.")
    mode: Literal["a", "b"] = Field(default="a", description="A choice.")
    resume_from_cache: bool = Field(default=False, description="Skip rollouts already in the output.")
    responses_create_params: dict = Field(default_factory=dict, description="Merged into every row.")
    json_format: bool = Field(default=False, alias="json", description="Print JSON.")


def test_help_text_format():
    text = RolloutsConfig.help_text("ng_collect_rollouts")
    lines = text.splitlines()
    assert lines[0] == "Usage: ng_collect_rollouts [+name=value ...]"
    assert "Collect rollouts from a running stack into a JSONL file." in text
    header = next(line for line in lines if line.startswith("Parameter "))
    assert header.split() == ["Parameter", "Type", "Default", "Description"]

    def row(name):
        return next(line for line in lines if line.startswith(f"+{name} "))

    assert row("output_jsonl_fpath").split()[:3] == ["+output_jsonl_fpath", "str", "[required]"]
    assert row("output_jsonl_fpath").endswith("Where to write the rollouts.")
    assert row("limit").split()[:3] == ["+limit", "Optional[int]", "null"]
    assert "Literal['a', 'b']" in row("mode") and "'a'" in row("mode")
    assert row("resume_from_cache").split()[:3] == ["+resume_from_cache", "bool", "false"]
    assert "[default: {}]" in row("responses_create_params")
    assert row("json").split()[:3] == ["+json", "bool", "false"]


def test_help_text_without_params():
    class NoParams(BaseNeMoGymCLIConfig):
        """Start every server."""

    text = NoParams.help_text("ng_run")
    assert "Start every server." in text
    assert "no parameters of its own" in text


def test_from_global_config_ignores_other_keys_and_resolves():
    cfg = OmegaConf.create(
        {
            "output_jsonl_fpath": "${out_dir}/rollouts.jsonl",
            "out_dir": "results",
            "limit": 3,
            "json": True,
            "policy_model": {"responses_api_models": {"x": {"entrypoint": "app.py", "u": "${missing}"}}},
            "responses_create_params": {"temperature": 0.5},
        }
    )
    parsed = RolloutsConfig.from_global_config(cfg)
    assert parsed.output_jsonl_fpath == "results/rollouts.jsonl"
    assert parsed.limit == 3
    assert parsed.json_format is True
    assert parsed.responses_create_params == {"temperature": 0.5}
    # Plain dicts work too.
    assert RolloutsConfig.from_global_config({"output_jsonl_fpath": "o.jsonl"}).limit is None


def test_from_global_config_missing_required_with_did_you_mean():
    message = error_message(
        NeMoGymConfigError,
        RolloutsConfig.from_global_config,
        {"output_jsonl_fpth": "o.jsonl", "policy_base_url": "x"},
    )
    assert "missing required parameter `+output_jsonl_fpath=...`" in message
    assert "did you mean `+output_jsonl_fpath`" in message
    assert "`+output_jsonl_fpth`" in message
    assert "Where to write the rollouts." in message


def test_from_global_config_missing_without_near_miss():
    with pytest.raises(NeMoGymConfigError) as info:
        RolloutsConfig.from_global_config({"something_else": 1})
    assert "missing required parameter `+output_jsonl_fpath=...`" in str(info.value)
    assert "did you mean" not in str(info.value)


def test_from_global_config_invalid_value():
    message = error_message(
        NeMoGymConfigError, RolloutsConfig.from_global_config, {"output_jsonl_fpath": "o", "limit": "many", "mode": "c"}
    )
    assert "invalid parameter `+limit`" in message and "'many'" in message
    assert "invalid parameter `+mode`: Must be one of: 'a' or 'b'" in message


@pytest.mark.parametrize(
    "arg, expected",
    [
        (["+h=true"], True),
        (["+help=true"], True),
        (["++h=True"], True),
        (["h=1"], True),
        (["+h=false"], False),
        (["+config_paths=[a.yaml]"], False),
        ([], False),
        ({"h": True}, True),
        ({"help": "true"}, True),
        ({"h": False}, False),
        (OmegaConf.create({"help": True}), True),
        (OmegaConf.create({"x": 1}), False),
        (None, False),
    ],
)
def test_wants_help(arg, expected):
    assert wants_help(arg) is expected
