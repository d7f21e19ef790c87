"""Misspelled keys inside server blocks and framework sections (`nemo_gym.config.block_keys`): refused with a
did-you-mean naming the file or override, the full key path and the field meant; free-form sections and keys nothing
resembles stay accepted; `++` adds anything. No process is started."""

from __future__ import annotations

import glob
import io
import textwrap
from contextlib import redirect_stderr
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from nemo_gym.config import global_config as gc
from nemo_gym.config import ports
from nemo_gym.config.block_keys import (
    SERVER_TYPES,
    _framework_table,
    _walk,
    close_field,
    nested_key_problems,
    server_config_schema,
)
from nemo_gym.config.global_config import parse_global_config
from nemo_gym.config.known_keys import check_known_keys
from nemo_gym.config.overrides import parse_overrides
from nemo_gym.errors import NeMoGymConfigError, NestedKeyTypoError

REPO = Path(__file__).resolve().parents[2]

APP = '''
from typing import Any, ClassVar, Optional
from pydantic import BaseModel, ConfigDict, Field
from nemo_gym.base_resources_server import BaseResourcesServerConfig, SimpleResourcesServer
from nemo_gym.config_types import ModelServerRef
from .common import SharedSettings


class Comparator(BaseModel):
    threshold: float = 0.5
    mode: str = "strict"


class MyEnvConfig(SharedSettings, BaseResourcesServerConfig):
    LIMIT: ClassVar[int] = 3
    max_turns: int = 4
    judge_model_server: Optional[ModelServerRef] = None
    comparator: Optional[Comparator] = None
    extra_request_params: dict[str, Any] = Field(default_factory=dict)
    temperature_value: float = Field(default=1.0, alias="temperature")
    _private: int = 0


class MyEnvServer(SimpleResourcesServer):
    config: MyEnvConfig


if __name__ == "__main__":
    MyEnvServer.run_webserver()
'''

COMMON = '''
from pydantic import BaseModel


class SharedSettings(BaseModel):
    dataset_folder: str = "data"
'''

STACK = """
my_env:
  resources_servers:
    my_env:
      entrypoint: app.py
      domain: other
      {extra}
"""


@pytest.fixture(autouse=True)
def workdir(tmp_path, monkeypatch):
    """A folder holding a server `resources_servers/my_env` (config class MyEnvConfig) and an empty install dir."""
    install = tmp_path / "install"
    install.mkdir()
    monkeypatch.setattr(gc, "PARENT_DIR", install)
    server = tmp_path / "resources_servers" / "my_env"
    server.mkdir(parents=True)
    (server / "requirements.txt").write_text("")
    (server / "app.py").write_text(APP)
    (server / "common.py").write_text(COMMON)
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv(gc.NEMO_GYM_CONFIG_DICT_ENV_VAR_NAME, raising=False)
    gc.reset_global_config_dict_cache()
    yield tmp_path
    gc.reset_global_config_dict_cache()
    ports.release_all()


def write_stack(tmp_path: Path, extra: str, name: str = "stack.yaml") -> Path:
    body = textwrap.dedent(STACK).replace("{extra}", textwrap.indent(textwrap.dedent(extra), " " * 6).lstrip())
    path = tmp_path / name
    path.write_text(body)
    return path


def check(tmp_path: Path, *args: str, extra: str = "") -> None:
    """What every command does: build the config, then refuse unknown keys (top level, then nested)."""
    if extra or not any("config_paths" in a for a in args):
        write_stack(tmp_path, extra)
        args = ("+config_paths=[stack.yaml]", *args)
    with redirect_stderr(io.StringIO()):
        cfg = parse_global_config(list(args), cwd=tmp_path, allocate_ports=False)
    check_known_keys(parse_overrides(list(args)), command_name="ng_run", parameters=(), global_config=cfg, cwd=tmp_path)


# ------------------------------------------------------------------------------------------------ closeness


def test_close_field_rules():
    fields = ["verified", "verified_url", "port", "host", "num_workers", "ray", "max_turns", "domain"]
    assert close_field("verifed", fields) == "verified"  # a letter missing
    assert close_field("prot", fields) == "port"  # two letters swapped
    assert close_field("num_worker", fields) == "num_workers"
    assert close_field("NUM-WORKERS", fields) == "num_workers"  # case and separators
    assert close_field("max_trun", fields) == "max_turns"  # 8+ characters: two edits
    assert close_field("rag", fields) is None  # under 4 characters: only case/separator differences count
    assert close_field("hots", fields) == "host"
    for free in ("verified_by", "description", "my_own_setting", "timeout", "domains_list"):
        assert close_field(free, fields) is None, free


# ------------------------------------------------------------------------------------------------ reading the class


def test_the_config_class_is_read_without_importing_the_server(workdir):
    schema = server_config_schema("resources_servers", "my_env", "app.py", workdir)
    assert schema is not None and schema.name == "MyEnvConfig"
    # own fields, an alias, a base in a sibling module (relative import), framework fields, conventional metadata
    assert {"max_turns", "temperature", "temperature_value", "dataset_folder", "entrypoint", "num_workers",
            "expose_tools_over_mcp", "verified", "description", "value", "name"} <= schema.fields
    assert "LIMIT" not in schema.fields and "_private" not in schema.fields  # ClassVar and private attributes
    assert schema.nested["comparator"].fields == {"threshold", "mode"}
    assert schema.nested["judge_model_server"].name == "ModelServerRef"
    assert "extra_request_params" not in schema.nested  # a dict: free-form
    assert "my_env" not in __import__("sys").modules


def test_a_thin_entrypoint_and_an_absolute_import_are_followed(workdir):
    server = workdir / "resources_servers" / "my_env"
    (server / "server.py").write_text(APP.replace("from .common", "from resources_servers.my_env.common"))
    (server / "run.py").write_text("from resources_servers.my_env.server import MyEnvServer\nMyEnvServer.run_webserver()\n")
    schema = server_config_schema("resources_servers", "my_env", "run.py", workdir)
    assert schema is not None and {"max_turns", "dataset_folder"} <= schema.fields


def test_a_class_that_cannot_be_read_leaves_the_block_unchecked(workdir):
    server = workdir / "resources_servers" / "my_env"
    (server / "app.py").write_text(APP.replace("class MyEnvConfig(SharedSettings,", "from thirdparty import Mixin\n\n\nclass MyEnvConfig(Mixin,"))
    assert server_config_schema("resources_servers", "my_env", "app.py", workdir) is None
    check(workdir, extra="max_turn: 3\n")  # would be a typo of max_turns, but the class is not fully known


def test_the_framework_table_matches_the_real_classes():
    from nemo_gym.base_resources_server import BaseResourcesServerConfig
    from nemo_gym.base_responses_api_agent import BaseResponsesAPIAgentConfig
    from nemo_gym.base_responses_api_model import BaseResponsesAPIModelConfig

    table = _framework_table()
    for cls in (BaseResourcesServerConfig, BaseResponsesAPIAgentConfig, BaseResponsesAPIModelConfig):
        assert table[cls.__name__].fields == set(cls.model_fields), cls.__name__


# ------------------------------------------------------------------------------------------------ config files


def test_a_typo_in_a_server_block_of_a_config_file_is_refused(workdir):
    with pytest.raises(NestedKeyTypoError) as err:
        check(workdir, extra="verifed: false\nmax_turn: 3\n")
    message = str(err.value)
    assert message.startswith("unknown keys (likely typos):\n")
    assert f"`my_env.resources_servers.my_env.verifed` in {workdir / 'stack.yaml'}: not a key of server `my_env` " \
           "(MyEnvConfig, resources_servers/my_env/app.py). Did you mean `verified`?" in message
    assert "`my_env.resources_servers.my_env.max_turn` in" in message and "Did you mean `max_turns`?" in message
    assert "declare it as a field of its config class" in message
    assert isinstance(err.value, NeMoGymConfigError) and err.value.exit_code == 2


def test_the_file_named_is_the_one_that_wrote_the_key(workdir):
    (workdir / "override.yaml").write_text("my_env:\n  resources_servers:\n    my_env:\n      num_worker: 2\n")
    write_stack(workdir, "")
    with pytest.raises(NestedKeyTypoError, match=r"`my_env\.resources_servers\.my_env\.num_worker` in .*override\.yaml.*"
                                                 r"Did you mean `num_workers`\?"):
        check(workdir, "+config_paths=[stack.yaml,override.yaml]")


def test_nested_models_and_dataset_entries_are_checked(workdir):
    with pytest.raises(NestedKeyTypoError, match=r"`my_env\.resources_servers\.my_env\.comparator\.treshold` in .*"
                                                 r"not a key of `my_env\.resources_servers\.my_env\.comparator` "
                                                 r"\(Comparator\)\. Did you mean `threshold`\?"):
        check(workdir, extra="comparator: {treshold: 0.3}\n")
    with pytest.raises(NestedKeyTypoError, match=r"datasets\.0\.num_repeat` in .*Did you mean `num_repeats`\?"):
        check(workdir, extra="datasets: [{name: d, type: example, jsonl_fpath: d.jsonl, num_repeat: 2}]\n")


def test_free_form_sections_and_unrelated_extra_keys_stay_accepted(workdir):
    check(
        workdir,
        extra="""\
        verified: true
        verified_url: https://example.org
        description: an environment
        value: teaches tools
        my_own_setting: 1
        temperature: 0.5
        extra_request_params: {temprature: 1, max_tokns: 3}
        ray_actor_options: {num_gpu: 1}
        comparator: {threshold: 0.1, custom_thing: 2}
        datasets: [{name: d, type: example, jsonl_fpath: d.jsonl, my_tag: x}]
        """,
    )


def test_typos_in_yaml_framework_sections_are_refused(workdir):
    (workdir / "env.yaml").write_text("head_server: {host: 127.0.0.1, prot: 12000}\n")
    with pytest.raises(NestedKeyTypoError, match=r"`head_server\.prot` in .*env\.yaml: .*Did you mean `port`\?"):
        check(workdir)


# ------------------------------------------------------------------------------------------------ command line


def test_nested_command_line_typos_are_refused_with_the_override_spelled_right(workdir):
    with pytest.raises(NestedKeyTypoError) as err:
        check(workdir, "+head_server.prot=12000")
    assert str(err.value) == (
        "unknown key `+head_server.prot` (command line): not a key of `head_server` (keys: host, port). Did you mean "
        "`+head_server.port`? To pass a key nemo_gym does not know, write it with ++ (e.g. `++head_server.prot=...`)."
    )
    with pytest.raises(NestedKeyTypoError, match=r"`\+my_env\.resources_servers\.my_env\.verifed` \(command line\): "
                                                 r"not a key of server `my_env` .*Did you mean "
                                                 r"`\+my_env\.resources_servers\.my_env\.verified`\?"):
        check(workdir, "+my_env.resources_servers.my_env.verifed=false", extra=" ")
    with pytest.raises(NestedKeyTypoError, match=r"`restart_policy\.max_restart` .*`restart_policy\.max_restarts`"):
        check(workdir, "restart_policy.max_restart=3")


def test_a_framework_section_is_strict_on_the_command_line(workdir):
    with pytest.raises(NestedKeyTypoError, match=r"`\+head_server\.bogus` \(command line\): not a key of `head_server` "
                                                 r"\(keys: host, port\)\. To pass"):
        check(workdir, "+head_server.bogus=1")
    check(workdir, "+my_env.resources_servers.my_env.bogus=1", extra=" ")  # server blocks keep extra keys


def test_plus_plus_is_the_escape_hatch_at_any_depth(workdir):
    check(workdir, "++head_server.prot=12000", "++head_server.bogus=1",
          "++my_env.resources_servers.my_env.verifed=false", "++my_env={resources_servers: {my_env: {max_turn: 1}}}",
          extra=" ")


def test_a_dict_value_on_the_command_line_is_checked_too(workdir):
    with pytest.raises(NestedKeyTypoError, match=r"`\+my_env\.resources_servers\.my_env\.max_turn` \(command line\)"):
        check(workdir, "+my_env.resources_servers.my_env={max_turn: 1}", extra=" ")


def test_top_level_typos_are_reported_first_and_unchanged(workdir):
    with pytest.raises(NeMoGymConfigError, match=r"^unknown key `\+dry_rn`\. Did you mean `\+dry_run`\?") as err:
        check(workdir, "+dry_rn=true", "+head_server.prot=1")
    assert not isinstance(err.value, NestedKeyTypoError)


# ------------------------------------------------------------------------------------------------ ng_validate


def test_ng_validate_lists_nested_typos_once(workdir):
    from nemo_gym.cli.commands.validate import validate_config

    write_stack(workdir, "verifed: false\n")
    report = validate_config(["+config_paths=[stack.yaml]", "+head_server.prot=1"], cwd=workdir)
    text = str(report.error())
    assert text.count("head_server.prot") == 2  # the key and its ++ example, in one problem
    assert text.count("my_env.resources_servers.my_env.verifed") == 1
    assert "Did you mean `+head_server.port`?" in text and "Did you mean `verified`?" in text


# ------------------------------------------------------------------------------------------------ our own configs


SHIPPED = ["resources_servers/*/configs/**/*.yaml", "responses_api_models/*/configs/**/*.yaml",
           "responses_api_agents/*/configs/**/*.yaml", "configs/**/*.yaml", "benchmarks/**/*.yaml",
           "environments/**/*.yaml", "tests/fixtures/**/*.yaml"]


def test_no_shipped_config_is_refused(monkeypatch):
    monkeypatch.setattr(gc, "PARENT_DIR", REPO)
    files = sorted({p for pat in SHIPPED for p in glob.glob(str(REPO / pat), recursive=True)})
    blocks, refused = 0, []
    for f in files:
        data = OmegaConf.to_container(OmegaConf.load(f), resolve=False) or {}
        for sid, block in data.items():
            for server_type in SERVER_TYPES:
                impls = block.get(server_type) if isinstance(block, dict) else None
                for impl, impl_cfg in (impls or {}).items():
                    if not isinstance(impl_cfg, dict):
                        continue
                    root = Path(f).parent if "tests/fixtures" in f else REPO
                    root = next((p for p in Path(f).parents if (p / server_type / impl).is_dir()), root)
                    schema = server_config_schema(server_type, impl, str(impl_cfg.get("entrypoint") or "app.py"), root)
                    if schema is None:
                        continue
                    blocks += 1
                    _walk(impl_cfg, schema, f"{sid}.{server_type}.{impl}", schema.name, False, refused)
    assert blocks >= 50
    assert refused == []
    assert nested_key_problems({}, parse_overrides(["+a.b=1"])) == []
