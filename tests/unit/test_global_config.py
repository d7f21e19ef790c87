import re
import socket
import sys
import textwrap
from pathlib import Path

import pytest
import yaml
from omegaconf import DictConfig, OmegaConf

from nemo_gym import WORKING_DIR
from nemo_gym.config import ports
from nemo_gym.config import global_config as gc
from nemo_gym.config.types import BaseRunServerInstanceConfig, ModelServerRef
from nemo_gym.errors import NeMoGymConfigError
from nemo_gym.testing.asserts import error_message
from nemo_gym.testing.stack import free_port_block
from nemo_gym.config.global_config import (
    NEMO_GYM_CONFIG_DICT_ENV_VAR_NAME,
    NEMO_GYM_CONFIG_PATH_ENV_VAR_NAME,
    dump_config_yaml,
    find_server_instances,
    get_first_server_config_dict,
    get_global_config_dict,
    is_secret_key,
    mask_secrets,
    parse_global_config,
    resolve_server_config,
)


@pytest.fixture(autouse=True)
def isolated(tmp_path, monkeypatch):
    """Each test runs in its own cwd with its own fake install dir (PARENT_DIR)."""
    install = tmp_path / "install"
    work = tmp_path / "work"
    install.mkdir()
    work.mkdir()
    monkeypatch.setattr(gc, "PARENT_DIR", install)
    monkeypatch.chdir(work)
    monkeypatch.delenv(NEMO_GYM_CONFIG_DICT_ENV_VAR_NAME, raising=False)
    monkeypatch.delenv(NEMO_GYM_CONFIG_PATH_ENV_VAR_NAME, raising=False)
    gc.reset_global_config_dict_cache()
    yield
    gc.reset_global_config_dict_cache()
    ports.release_all()


def write(path, text: str) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(text))
    return path


def plain(cfg) -> dict:
    return OmegaConf.to_container(cfg, resolve=False)


MODEL = """
policy_model:
  responses_api_models:
    openai_model:
      entrypoint: app.py
      openai_base_url: ${policy_base_url}
      openai_api_key: ${policy_api_key}
      openai_model: ${policy_model_name}
"""

RESOURCES = """
my_res:
  resources_servers:
    mcqa:
      entrypoint: app.py
      domain: knowledge
"""

AGENT = """
my_agent:
  responses_api_agents:
    simple_agent:
      entrypoint: app.py
      resources_server:
        type: resources_servers
        name: my_res
      model_server:
        type: responses_api_models
        name: policy_model
      datasets:
      - name: example
        type: example
        jsonl_fpath: data/example.jsonl
"""


def stack(tmp_path=None) -> list[str]:
    write("stack.yaml", MODEL + RESOURCES + AGENT)
    return ["+config_paths=[stack.yaml]"]


# --------------------------------------------------------------------------------------------------
# Defaults
# --------------------------------------------------------------------------------------------------


def test_defaults_dict_exact_content():
    cfg = parse_global_config([], allocate_ports=False)
    v = sys.version_info
    assert plain(cfg) == {
        "config_paths": [],
        "default_host": "127.0.0.1",
        "head_server": {"host": "127.0.0.1", "port": 11000},
        "port_range_low": 10001,
        "port_range_high": 20000,
        "dry_run": False,
        "skip_venv_if_present": False,
        "python_version": f"{v.major}.{v.minor}.{v.micro}",
        "head_server_deps": gc.head_server_deps(),
        "uv_cache_dir": str(WORKING_DIR / "cache" / "uv"),
        "uv_venv_dir": str(WORKING_DIR),
        "error_on_almost_servers": True,
        "venv_mode": "shared",
        "disallowed_ports": [11000],
    }
    deps = gc.head_server_deps()
    assert all(re.fullmatch(r"(ray\[default\]|openai)==[\w.]+", d) for d in deps)


def test_forced_and_overridable_defaults():
    cfg = parse_global_config(
        [
            "+python_version=2.7",
            "+head_server_deps=[x]",
            "+default_host=0.0.0.0",
            "+port_range_low=12000",
            "+dry_run=true",
            "+venv_mode=isolated",
        ],
        allocate_ports=False,
    )
    assert cfg.python_version != "2.7"  # forced to the running interpreter
    assert list(cfg.head_server_deps) == gc.head_server_deps()
    assert cfg.head_server == {"host": "0.0.0.0", "port": 11000}
    assert cfg.port_range_low == 12000 and cfg.dry_run is True and cfg.venv_mode == "isolated"


def test_head_server_only_filled_if_absent():
    cfg = parse_global_config(["+head_server={host: 0.0.0.0, port: 12345}"], allocate_ports=False)
    assert cfg.head_server == {"host": "0.0.0.0", "port": 12345}
    assert list(cfg.disallowed_ports) == [12345]


def test_use_absolute_ip(monkeypatch):
    monkeypatch.setattr(gc.socket, "gethostbyname", lambda name: "10.1.2.3")
    cfg = parse_global_config(["+use_absolute_ip=true"], allocate_ports=False)
    assert cfg.default_host == "10.1.2.3"
    assert cfg.head_server.host == "10.1.2.3"


# --------------------------------------------------------------------------------------------------
# Sources and precedence
# --------------------------------------------------------------------------------------------------


def test_merge_order():
    write("a.yaml", "a: 1\nb: 1\nc: 1\nd: 1\ne: 1\n")
    write("b.yaml", "b: 2\nc: 2\nd: 2\ne: 2\n")
    write("env.yaml", "config_paths: [a.yaml, b.yaml]\nc: 3\nd: 3\ne: 3\n")
    cfg = parse_global_config(["+e=5"], initial_global_config_dict={"d": 4, "e": 4}, allocate_ports=False)
    assert [cfg.a, cfg.b, cfg.c, cfg.d, cfg.e] == [1, 2, 3, 4, 5]
    assert list(cfg.config_paths) == ["a.yaml", "b.yaml"]


def test_nested_dicts_merge_deeply():
    write("a.yaml", "blk:\n  x: 1\n  inner: {p: 1, q: 1}\n")
    write("b.yaml", "blk:\n  inner: {q: 2}\n")
    cfg = parse_global_config(["+config_paths=[a.yaml,b.yaml]", "+blk.inner.r=3"], allocate_ports=False)
    assert plain(cfg.blk) == {"x": 1, "inner": {"p": 1, "q": 2, "r": 3}}


def test_cli_config_paths_replace_env_yaml_ones():
    write("a.yaml", "from_a: 1\n")
    write("b.yaml", "from_b: 1\n")
    write("env.yaml", "config_paths: [a.yaml]\n")
    cfg = parse_global_config(["+config_paths=[b.yaml]"], allocate_ports=False)
    assert "from_a" not in cfg and cfg.from_b == 1


def test_config_paths_through_interpolation():
    write("a.yaml", "from_a: 1\n")
    write("env.yaml", "my_stack: [a.yaml]\n")
    cfg = parse_global_config(["+config_paths=${my_stack}"], allocate_ports=False)
    assert cfg.from_a == 1


@pytest.mark.parametrize("prefix", ["+", "++", ""])
def test_override_forms_set_over_files(prefix):
    write("a.yaml", "x: 1\nblk: {k: 1}\n")
    cfg = parse_global_config(["+config_paths=[a.yaml]", f"{prefix}x=2", f"{prefix}blk.k=[a,'b,c']"], allocate_ports=False)
    assert cfg.x == 2 and list(cfg.blk.k) == ["a", "b,c"]


def test_delete_override_applies_to_the_merged_config():
    write("a.yaml", "x: 1\nblk: {k: 1, j: 2}\n")
    cfg = parse_global_config(["+config_paths=[a.yaml]", "~x", "~blk.k"], allocate_ports=False)
    assert "x" not in cfg and plain(cfg.blk) == {"j": 2}
    with pytest.raises(NeMoGymConfigError, match=r"key `blk\.nope` is not in the config"):
        parse_global_config(["+config_paths=[a.yaml]", "~blk.nope"], allocate_ports=False)


def test_delete_a_server_block():
    args = stack()
    cfg = parse_global_config(args + ["~my_agent"], allocate_ports=False)
    assert [s.server_id for s in find_server_instances(cfg)] == ["policy_model", "my_res"]


def test_recursive_config_paths_deduplicated():
    write("A.yaml", "config_paths: [B.yaml, C.yaml]\nfrom_a: 1\nshared: a\n")
    write("B.yaml", "config_paths: [C.yaml]\nfrom_b: 1\nshared: b\n")
    write("C.yaml", "config_paths: [A.yaml]\nfrom_c: 1\nshared: c\n")  # a cycle back to A
    cfg = parse_global_config(["+config_paths=[A.yaml]"], allocate_ports=False)
    assert list(cfg.config_paths) == ["A.yaml", "B.yaml", "C.yaml"]
    assert cfg.from_a == cfg.from_b == cfg.from_c == 1
    assert cfg.shared == "c"  # later-loaded files override earlier ones


def test_config_path_cwd_first_then_install_dir():
    write(gc.PARENT_DIR / "configs" / "x.yaml", "where: install\nonly_install: 1\n")
    write(gc.PARENT_DIR / "configs" / "y.yaml", "y_where: install\n")
    write("configs/x.yaml", "where: cwd\n")
    cfg = parse_global_config(["+config_paths=[configs/x.yaml,configs/y.yaml]"], allocate_ports=False)
    assert cfg.where == "cwd" and "only_install" not in cfg
    assert cfg.y_where == "install"


def test_env_yaml_cwd_first_then_install_dir():
    write(gc.PARENT_DIR / "env.yaml", "source: install\n")
    assert parse_global_config([], allocate_ports=False).source == "install"
    write("env.yaml", "source: cwd\n")
    assert parse_global_config([], allocate_ports=False).source == "cwd"


def test_absolute_config_path(tmp_path):
    path = write(tmp_path / "elsewhere" / "abs.yaml", "absolute: true\n")
    cfg = parse_global_config([f"+config_paths=[{path}]"], allocate_ports=False)
    assert cfg.absolute is True


# --------------------------------------------------------------------------------------------------
# Interpolation and swap_key
# --------------------------------------------------------------------------------------------------


def test_interpolations_stay_unresolved_until_asked():
    args = stack()
    cfg = parse_global_config(args, allocate_ports=False)
    raw = plain(get_first_server_config_dict(cfg, "policy_model"))
    assert raw["openai_base_url"] == "${policy_base_url}"

    cfg = parse_global_config(
        args + ["+policy_base_url=http://x/v1", "+policy_api_key=sk", "+policy_model_name=m"], allocate_ports=False
    )
    assert plain(cfg)["policy_model"]["responses_api_models"]["openai_model"]["openai_base_url"] == "${policy_base_url}"
    resolved = resolve_server_config(cfg, "policy_model")
    assert resolved["openai_base_url"] == "http://x/v1"
    assert resolved["name"] == "policy_model"
    assert resolved["host"] == "127.0.0.1"
    dumped = yaml.safe_load(dump_config_yaml(cfg, mask=False))
    assert dumped["policy_model"]["responses_api_models"]["openai_model"]["openai_model"] == "m"
    unresolved = dump_config_yaml(cfg, resolve=False, mask=False)
    assert "${policy_base_url}" in unresolved
    # What children receive parses back to the same config.
    assert plain(gc.load_config_from_env_yaml_text(unresolved)) == plain(cfg)


def test_env_resolver_and_default(monkeypatch):
    write("a.yaml", "home: ${oc.env:NG_TEST_HOME,/tmp}\n")
    monkeypatch.delenv("NG_TEST_HOME", raising=False)
    cfg = parse_global_config(["+config_paths=[a.yaml]"], allocate_ports=False)
    assert yaml.safe_load(dump_config_yaml(cfg))["home"] == "/tmp"
    monkeypatch.setenv("NG_TEST_HOME", "/h")
    assert yaml.safe_load(dump_config_yaml(cfg))["home"] == "/h"


def test_swap_key_moves_blocks():
    write(
        "a.yaml",
        """
        policy_model: ${swap_key:my_judge_model}
        my_judge_model:
          responses_api_models:
            openai_model:
              entrypoint: app.py
        nested:
          dst: ${swap_key:nested.src}
          src: {value: 1}
        """,
    )
    cfg = parse_global_config(["+config_paths=[a.yaml]"], allocate_ports=False)
    assert "my_judge_model" not in cfg
    assert plain(cfg.policy_model) == {"responses_api_models": {"openai_model": {"entrypoint": "app.py", "host": "127.0.0.1"}}}
    assert plain(cfg.nested) == {"dst": {"value": 1}}
    assert [s.server_id for s in find_server_instances(cfg)] == ["policy_model"]


def test_swap_key_resolver_round_trips():
    cfg = OmegaConf.create({"a": "${swap_key:x.y}"})
    assert OmegaConf.to_container(cfg, resolve=True) == {"a": "${swap_key:x.y}"}


def test_swap_key_unknown_source():
    with pytest.raises(NeMoGymConfigError, match=r"moves `nope\.x`, but `nope\.x` is not in the config"):
        parse_global_config(["+a=${swap_key:nope.x}"], allocate_ports=False)


# --------------------------------------------------------------------------------------------------
# Servers, references, almost-servers
# --------------------------------------------------------------------------------------------------


def test_find_server_instances_and_first_config():
    cfg = parse_global_config(stack(), allocate_ports=False)
    specs = find_server_instances(cfg)
    assert [(s.server_id, s.server_type, s.impl) for s in specs] == [
        ("policy_model", "responses_api_models", "openai_model"),
        ("my_res", "resources_servers", "mcqa"),
        ("my_agent", "responses_api_agents", "simple_agent"),
    ]
    assert specs[1].dir_relpath == "resources_servers/mcqa"
    assert isinstance(specs[1].config, DictConfig)
    assert get_first_server_config_dict(cfg, "my_res").domain == "knowledge"
    # Non-server top-level values are ignored as servers.
    cfg = parse_global_config(
        stack() + ["+responses_create_params={temperature: 0.1}", "+not_a_server.resources_servers.x.y=1"],
        allocate_ports=False,
    )
    assert len(find_server_instances(cfg)) == 3


def test_host_defaults_and_missing_ports_left_absent():
    cfg = parse_global_config(stack() + ["+my_res.resources_servers.mcqa.host=0.0.0.0"], allocate_ports=False)
    assert get_first_server_config_dict(cfg, "my_agent").host == "127.0.0.1"
    assert get_first_server_config_dict(cfg, "my_res").host == "0.0.0.0"
    assert "port" not in get_first_server_config_dict(cfg, "my_agent")


def test_server_refs_valid():
    parse_global_config(stack(), allocate_ports=False)


def server_ref_error(name: str) -> str:
    """The config error when the agent's resources server ref names `name`."""
    override = f"my_agent.responses_api_agents.simple_agent.resources_server.name={name}"
    return error_message(NeMoGymConfigError, parse_global_config, stack() + [override], allocate_ports=False)


def test_server_ref_missing_name_lists_existing():
    message = server_ref_error("my_rse")
    assert "refers to resources_servers server `my_rse`" in message
    assert "which does not exist" in message
    assert "Existing resources_servers servers: my_res." in message
    assert "Did you mean `my_res`?" in message


def test_server_ref_wrong_type():
    message = server_ref_error("policy_model")
    assert "`policy_model` is a responses_api_models server, not one of resources_servers" in message
    assert "Existing resources_servers servers: my_res." in message


def test_server_ref_without_name():
    with pytest.raises(NeMoGymConfigError, match=r"has type resources_servers but no `name`"):
        parse_global_config(stack() + ["~my_agent.responses_api_agents.simple_agent.resources_server.name"], allocate_ports=False)


def test_server_ref_to_almost_server_explains():
    args = stack() + ["~my_res.resources_servers.mcqa.domain", "+error_on_almost_servers=false"]
    with pytest.raises(NeMoGymConfigError, match=r"`my_res` failed validation: .*A domain is required"):
        parse_global_config(args, allocate_ports=False)


def test_almost_server_error(capsys):
    write(
        "a.yaml",
        """
        bad_res:
          resources_servers:
            mcqa:
              entrypoint: app.py
        bad_agent:
          responses_api_agents:
            simple_agent:
              entrypoint: app.py
              datasets:
              - {name: train_data, type: train, jsonl_fpath: t.jsonl}
              - {name: ex, type: example, jsonl_fpath: e.jsonl, license: WTFPL}
        """,
    )
    with pytest.raises(NeMoGymConfigError, match=r"almost-server.*validation errors") as info:
        parse_global_config(["+config_paths=[a.yaml]"], allocate_ports=False)
    message = str(info.value)
    assert message.startswith("Found 2 almost-server(s) with validation errors.")
    assert "error_on_almost_servers=false" in message
    assert "resources_servers -> mcqa: A domain is required for resources servers." in message
    assert "datasets -> 0: A license is required for train_data" in message
    assert "datasets -> 1 -> license: Must be one of:" in message
    err = capsys.readouterr().err
    assert "Configuration Warnings: Almost-Servers Detected" in err
    assert "Almost-Server Detected: 'bad_res'" in err
    assert "This server configuration failed validation:" in err
    assert "This server will NOT be started." in err


def test_almost_server_bypass(capsys):
    args = stack() + ["~my_res.resources_servers.mcqa.domain", "~my_agent.responses_api_agents.simple_agent.resources_server"]
    cfg = parse_global_config(args + ["+error_on_almost_servers=false"], allocate_ports=False)
    assert "Almost-Server Detected: 'my_res'" in capsys.readouterr().err
    assert [s.server_id for s in find_server_instances(cfg)] == ["policy_model", "my_agent"]


def test_block_with_two_server_types_is_almost_server():
    write(
        "a.yaml",
        """
        twin:
          responses_api_models: {m: {entrypoint: app.py}}
          responses_api_agents: {a: {entrypoint: app.py}}
        """,
    )
    with pytest.raises(NeMoGymConfigError, match=r"Found 1 almost-server"):
        parse_global_config(["+config_paths=[a.yaml]"], allocate_ports=False)


def test_missing_value_left_unset_in_server_block():
    write(
        "a.yaml",
        """
        judge:
          resources_servers:
            my_judge:
              entrypoint: app.py
              domain: other
              judge:
                url: ???
        """,
    )
    message = error_message(NeMoGymConfigError, parse_global_config, ["+config_paths=[a.yaml]"], allocate_ports=False)
    assert "`judge.resources_servers.my_judge.judge.url`" in message
    assert "+judge.resources_servers.my_judge.judge.url=..." in message
    cfg = parse_global_config(["+config_paths=[a.yaml]", "+judge.resources_servers.my_judge.judge.url=http://j"], allocate_ports=False)
    assert get_first_server_config_dict(cfg, "judge").judge.url == "http://j"


def test_missing_required_field_names_server_and_field():
    class JudgeConfig(BaseRunServerInstanceConfig):
        judge_model_server: ModelServerRef

    cfg = parse_global_config(stack(), allocate_ports=False)
    message = error_message(NeMoGymConfigError, gc.load_server_config, JudgeConfig, "my_res", cfg)
    assert "Server `my_res`" in message
    assert "missing required field `judge_model_server`" in message
    assert "+my_res.resources_servers.mcqa.judge_model_server=..." in message
    # And a complete block validates, with name = the server id.
    cfg = parse_global_config(stack() + ["+my_res.resources_servers.mcqa.port=1234"], allocate_ports=False)
    loaded = gc.load_server_config(BaseRunServerInstanceConfig, "my_res", cfg)
    assert loaded.name == "my_res" and loaded.port == 1234


def test_unknown_server_id():
    cfg = parse_global_config(stack(), allocate_ports=False)
    with pytest.raises(NeMoGymConfigError, match=r"No server named `my_ress`.*Existing servers: policy_model, my_res, my_agent\. Did you mean `my_res`\?"):
        resolve_server_config(cfg, "my_ress")
    with pytest.raises(NeMoGymConfigError, match="No server named"):
        get_first_server_config_dict(cfg, "nope")


# --------------------------------------------------------------------------------------------------
# Errors while loading
# --------------------------------------------------------------------------------------------------


def test_missing_config_file():
    write("a.yaml", "config_paths: [missing_child.yaml]\n")
    message = error_message(NeMoGymConfigError, parse_global_config, ["+config_paths=[a.yaml]"], allocate_ports=False)
    assert "Config file `missing_child.yaml` not found" in message
    assert f"listed by config_paths in {Path.cwd() / 'a.yaml'}" in message
    assert str(Path.cwd() / "missing_child.yaml") in message
    assert str(gc.PARENT_DIR / "missing_child.yaml") in message

    with pytest.raises(NeMoGymConfigError, match=r"`nope\.yaml` not found \(listed by the command line\)"):
        parse_global_config(["+config_paths=[nope.yaml]"], allocate_ports=False)


def test_yaml_syntax_error_names_file_and_line():
    write("bad.yaml", "ok: 1\nlist: [1, 2\nnext: 3\n")
    message = error_message(NeMoGymConfigError, parse_global_config, ["+config_paths=[bad.yaml]"], allocate_ports=False)
    assert message.startswith(f"YAML syntax error in {Path.cwd() / 'bad.yaml'}, line ")
    assert re.search(r"line [23], column \d+", message)


def test_yaml_syntax_error_in_env_yaml():
    write("env.yaml", "a: b: c\n")
    with pytest.raises(NeMoGymConfigError, match=r"YAML syntax error in .*env\.yaml, line 1, column \d+"):
        parse_global_config([], allocate_ports=False)


def test_top_level_list_file():
    write("list.yaml", "- a\n- b\n")
    with pytest.raises(NeMoGymConfigError, match="mapping of keys to values"):
        parse_global_config(["+config_paths=[list.yaml]"], allocate_ports=False)


@pytest.mark.parametrize("override", ["+config_paths=a.yaml", "+config_paths=5"])
def test_scalar_config_paths(override):
    with pytest.raises(NeMoGymConfigError, match=re.escape("config_paths must be a list, e.g. +config_paths=[a.yaml]")):
        parse_global_config([override], allocate_ports=False)


def test_scalar_config_paths_in_a_file():
    write("a.yaml", "config_paths: b.yaml\n")
    with pytest.raises(NeMoGymConfigError, match=re.escape("config_paths must be a list")):
        parse_global_config(["+config_paths=[a.yaml]"], allocate_ports=False)


def test_bad_override_syntax():
    with pytest.raises(NeMoGymConfigError, match=r"Bad override `\+config_paths=\[a.yaml`: missing closing `\]`"):
        parse_global_config(["+config_paths=[a.yaml"], allocate_ports=False)


def test_unresolved_interpolation_in_dump():
    cfg = parse_global_config(stack(), allocate_ports=False)
    message = error_message(NeMoGymConfigError, dump_config_yaml, cfg)
    assert "`policy_base_url` is not set" in message
    assert "Pass `+policy_base_url=...` on the command line or put it in env.yaml." in message
    assert "policy_model.responses_api_models.openai_model.openai_base_url" in message
    with pytest.raises(NeMoGymConfigError, match=r"`policy_base_url` is not set"):
        resolve_server_config(cfg, "policy_model")


def test_missing_env_var_in_dump(monkeypatch):
    monkeypatch.delenv("NG_TEST_NOPE", raising=False)
    cfg = parse_global_config(["+x=${oc.env:NG_TEST_NOPE}"], allocate_ports=False)
    with pytest.raises(NeMoGymConfigError, match=r"environment variable `NG_TEST_NOPE` is not set"):
        dump_config_yaml(cfg)


# --------------------------------------------------------------------------------------------------
# Secrets
# --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "key, secret",
    [
        ("api_key", True),
        ("policy_api_key", True),
        ("openai_api_key", True),
        ("hf_token", True),
        ("mlflow_tracking_token", True),
        ("wandb_api_key", True),
        ("client_secret", True),
        ("db-password", True),
        ("passwd", True),
        ("API_KEY", True),
        ("max_output_tokens", False),
        ("key_count", False),
        ("keys", False),
        ("tokenizer", False),
        ("monkey", False),
        ("top_k", False),
        # issue 37: header names, camelCase, plurals of credentials
        ("Authorization", True),
        ("Proxy-Authorization", True),
        ("X-Api-Key", True),
        ("apiKey", True),
        ("APIKey", True),
        ("openaiApiKey", True),
        ("api_keys", True),
        ("apiKeys", True),
        ("apikeys", True),
        ("access_tokens", True),
        ("credentials", True),
        ("credential", True),
        ("aws_credentials", True),
        ("passphrase", True),
        ("sshPassphrase", True),
        ("passwords", True),
        ("client_secrets", True),
        ("session_token", True),
        ("Cookie", True),
        ("maxOutputTokens", False),
        ("max_tokens", False),
        ("num_tokens", False),
        ("special_tokens", False),
        ("sort_keys", False),
        ("required_keys", False),
        ("eos_token", False),
        ("pad_token", False),
        ("passage", False),
        ("authorization_url", False),
    ],
)
def test_is_secret_key(key, secret):
    assert is_secret_key(key) is secret


@pytest.mark.parametrize(
    "value, masked",
    [
        ("http://user:pass@host:8000/v1", "http://user:****@host:8000/v1"),
        ("https://ghp_tok@github.com/o/r.git", "https://****@github.com/o/r.git"),
        ("postgres://u:p@ss@db:5432/x?sslmode=require", "postgres://u:****@db:5432/x?sslmode=require"),
        ("redis://:hunter2@cache:6379/0", "redis://:****@cache:6379/0"),
        ("--upstream http://a:b@h/x --other http://h2/y", "--upstream http://a:****@h/x --other http://h2/y"),
        ("http://host/path@not-userinfo", "http://host/path@not-userinfo"),
        ("http://host/?email=a@b.c", "http://host/?email=a@b.c"),
        ("name@example.com", "name@example.com"),
        ("http://${oc.env:U}:${oc.env:P}@h/v1", "http://${oc.env:U}:${oc.env:P}@h/v1"),  # unresolved: no secret
    ],
)
def test_url_passwords_are_masked_host_and_path_kept(value, masked):
    assert mask_secrets({"some_url": value}) == {"some_url": masked}


def test_everything_under_a_secret_key_is_masked():
    data = {
        "credentials": {"aws_access_key_id": "AKIA", "region": "x", "nested": [{"anything": "s"}]},
        "api_keys": ["sk-1", "sk-2"],
        "headers": {"Authorization": "Bearer sk-3", "Accept": "application/json"},
        "ssh": {"passphrase": "open sesame", "port": 22},
        "use_api_key": True,  # a boolean hides nothing
        "api_key": None,
        "max_output_tokens": 64,
        "special_tokens": ["<s>", "</s>"],
    }
    assert mask_secrets(data) == {
        "credentials": {"aws_access_key_id": "****", "region": "****", "nested": [{"anything": "****"}]},
        "api_keys": ["****", "****"],
        "headers": {"Authorization": "****", "Accept": "application/json"},
        "ssh": {"passphrase": "****", "port": 22},
        "use_api_key": True,
        "api_key": None,
        "max_output_tokens": 64,
        "special_tokens": ["<s>", "</s>"],
    }


SECRETS_CONFIG = """
extra_headers:
  Authorization: Bearer sk-auth
  X-Api-Key: sk-xapi
upstream:
  apiKey: sk-camel
  api_keys: [sk-list-1, sk-list-2]
  credentials: {user: alice, secret_value: sk-cred}
  passphrase: sk-phrase
  base_url: http://alice:sk-url@llm.internal:8000/v1
  max_output_tokens: 77
"""
SECRET_VALUES = ["sk-auth", "sk-xapi", "sk-camel", "sk-list-1", "sk-list-2", "sk-cred", "sk-phrase", "sk-url", "alice"]


def _dump_args() -> list[str]:
    stack()
    write("secrets.yaml", SECRETS_CONFIG)
    return ["+config_paths=[stack.yaml,secrets.yaml]", "+policy_base_url=http://x", "+policy_api_key=sk-policy",
            "+policy_model_name=m"]


def test_ng_dump_config_masks_every_shape(capsys):
    from nemo_gym.cli import find_command

    assert find_command("dump_config").main(_dump_args()) == 0, capsys.readouterr().err
    out = capsys.readouterr().out
    for value in [*SECRET_VALUES, "sk-policy"]:
        assert value not in out.replace("alice:****", ""), value
    dumped = yaml.safe_load(out)
    assert dumped["upstream"]["base_url"] == "http://alice:****@llm.internal:8000/v1"
    assert dumped["upstream"]["max_output_tokens"] == 77


def test_head_server_config_endpoint_masks_and_keeps_addresses():
    """`/global_config_dict_yaml` is read by clients (ServerClient, ng_status, trainers) for servers' addresses and
    limits, never for secrets; the servers themselves get the real config from ng_run directly."""
    import httpx

    from nemo_gym.runtime.launcher import RunHelper
    from nemo_gym.testing.stack import free_port

    port = free_port()
    cfg = parse_global_config(_dump_args() + [f"+head_server.port={port}"], allocate_ports=False)
    helper = RunHelper(cfg)
    helper.start_head()
    try:
        text = httpx.get(f"http://127.0.0.1:{port}/global_config_dict_yaml?raw=true", timeout=10).text
    finally:
        helper.head.stop()
    for value in [*SECRET_VALUES, "sk-policy"]:
        assert value not in text.replace("alice:****", ""), value
    served = yaml.safe_load(text)
    assert served["upstream"]["base_url"] == "http://alice:****@llm.internal:8000/v1"
    assert served["head_server"]["port"] == port and served["upstream"]["max_output_tokens"] == 77
    assert served["my_res"] == plain(cfg)["my_res"]  # server blocks (what clients route by) as they are
    assert "sk-auth" in OmegaConf.to_yaml(cfg)  # what ng_run hands its servers is not masked


def test_mask_secrets_nested():
    data = {
        "policy_api_key": "sk-123",
        "max_output_tokens": 100,
        "blk": {"servers": [{"api_key": "a", "name": "x"}, [{"hf_token": "t"}]], "unset_key": None},
    }
    masked = mask_secrets(data)
    assert masked == {
        "policy_api_key": "****",
        "max_output_tokens": 100,
        "blk": {"servers": [{"api_key": "****", "name": "x"}, [{"hf_token": "****"}]], "unset_key": None},
    }
    assert data["policy_api_key"] == "sk-123"  # a copy
    masked_cfg = mask_secrets(OmegaConf.create(data))
    assert isinstance(masked_cfg, DictConfig) and masked_cfg.blk.servers[0].api_key == "****"


def test_dump_masks_by_key_name():
    cfg = parse_global_config(
        stack()
        + [
            "+policy_base_url=http://x",
            "+policy_api_key=sk-secret",
            "+policy_model_name=m",
            "+responses_create_params={max_output_tokens: 64}",
        ],
        allocate_ports=False,
    )
    text = dump_config_yaml(cfg)
    assert "sk-secret" not in text
    dumped = yaml.safe_load(text)
    assert dumped["policy_api_key"] == "****"
    assert dumped["policy_model"]["responses_api_models"]["openai_model"]["openai_api_key"] == "****"
    assert dumped["responses_create_params"]["max_output_tokens"] == 64
    assert "sk-secret" in dump_config_yaml(cfg, mask=False)


# --------------------------------------------------------------------------------------------------
# Ports
# --------------------------------------------------------------------------------------------------


def test_ports_allocated_reserved_and_disallowed():
    cfg = parse_global_config(stack() + ["+my_res.resources_servers.mcqa.port=15555"])
    agent = get_first_server_config_dict(cfg, "my_agent")
    model = get_first_server_config_dict(cfg, "policy_model")
    assert get_first_server_config_dict(cfg, "my_res").port == 15555
    assert agent.port != model.port
    for port in (agent.port, model.port):
        assert 10001 <= port <= 20000
        assert ports.is_reserved("127.0.0.1", port)
        probe = socket.socket()
        with pytest.raises(OSError):
            probe.bind(("127.0.0.1", port))
        probe.close()
    assert not ports.is_reserved("127.0.0.1", 15555)  # explicit ports are the launcher's to bind
    assert list(cfg.disallowed_ports) == [11000, 15555, model.port, agent.port]


def test_allocation_avoids_disallowed_and_head_port():
    low = free_port_block(5)
    cfg = parse_global_config(
        stack()
        + [f"+port_range_low={low}", f"+port_range_high={low + 4}", f"+head_server.port={low}", f"+disallowed_ports=[{low + 1}]"]
    )
    got = sorted(get_first_server_config_dict(cfg, s).port for s in ("policy_model", "my_res", "my_agent"))
    assert got == [low + 2, low + 3, low + 4]
    assert sorted(cfg.disallowed_ports) == [low, low + 1, low + 2, low + 3, low + 4]


def test_allocation_fails_when_range_exhausted():
    with pytest.raises(NeMoGymConfigError, match="range is exhausted"):
        parse_global_config(stack() + ["+port_range_low=11000", "+port_range_high=11001", "+disallowed_ports=[11001]"])


def test_two_parses_never_share_ports():
    a = parse_global_config(stack())
    b = parse_global_config(stack())
    ports_a = {get_first_server_config_dict(a, s).port for s in ("policy_model", "my_res", "my_agent")}
    ports_b = {get_first_server_config_dict(b, s).port for s in ("policy_model", "my_res", "my_agent")}
    assert not ports_a & ports_b


# --------------------------------------------------------------------------------------------------
# The cached config of this process
# --------------------------------------------------------------------------------------------------


def test_global_config_dict_is_cached():
    write("env.yaml", "x: 1\n")
    first = get_global_config_dict(allocate_ports=False)
    assert first.x == 1
    write("env.yaml", "x: 2\n")
    assert get_global_config_dict() is first
    gc.reset_global_config_dict_cache()
    assert get_global_config_dict(allocate_ports=False).x == 2


def test_global_config_dict_from_overrides_and_parser_config():
    cfg = get_global_config_dict(overrides=["+y=3"], allocate_ports=False)
    assert cfg.y == 3
    gc.reset_global_config_dict_cache()
    options = gc.GlobalConfigDictParserConfig(
        initial_global_config_dict={"policy_api_key": "sk", "z": 1}, skip_load_from_cli=True, hide_secrets=True
    )
    masked = get_global_config_dict(options, allocate_ports=False)
    assert masked.z == 1 and masked.policy_api_key == "****"
    assert get_global_config_dict().policy_api_key == "sk"


def test_child_parses_env_var_without_validation(monkeypatch):
    # An almost-server and an unknown ref would fail validation; a child takes the YAML as is.
    text = textwrap.dedent(
        """
        bad:
          resources_servers:
            x:
              entrypoint: app.py
              ref: {type: resources_servers, name: nope}
        value: ${other}
        other: 7
        """
    )
    monkeypatch.setenv(NEMO_GYM_CONFIG_DICT_ENV_VAR_NAME, text)
    cfg = get_global_config_dict()
    assert cfg.value == 7
    assert plain(cfg)["value"] == "${other}"
    assert "head_server" not in cfg


def test_child_env_var_bad_yaml(monkeypatch):
    monkeypatch.setenv(NEMO_GYM_CONFIG_DICT_ENV_VAR_NAME, "a: [1")
    with pytest.raises(NeMoGymConfigError, match="YAML syntax error in NEMO_GYM_CONFIG_DICT, line 1"):
        get_global_config_dict()


def test_head_server_config_helper():
    cfg = parse_global_config(["+head_server.port=12000"], allocate_ports=False)
    head = gc.get_head_server_config(cfg)
    assert (head.host, head.port) == ("127.0.0.1", 12000)


def test_find_open_port_compat():
    port = gc.find_open_port(disallowed_ports=[], port_range_low=21000, port_range_high=31999)
    assert 21000 <= port <= 31999
    assert not ports.is_reserved("127.0.0.1", port)


def test_ref_to_a_non_server_block():
    args = stack() + ["~my_res.resources_servers.mcqa.entrypoint"]
    with pytest.raises(NeMoGymConfigError, match=r"but `my_res` is not a server block"):
        parse_global_config(args, allocate_ports=False)


# --------------------------------------------------------------------------------------------------
# Config mistakes that would otherwise start the wrong stack silently
# --------------------------------------------------------------------------------------------------


def test_same_server_block_twice_in_one_file_names_both_lines():
    write("twice.yaml", RESOURCES + RESOURCES.replace("knowledge", "math"))
    with pytest.raises(NeMoGymConfigError) as info:
        parse_global_config(["+config_paths=[twice.yaml]"], allocate_ports=False)
    message = str(info.value)
    assert "twice.yaml" in message and "`my_res` is defined twice" in message
    assert "line 2 and line 8" in message


def test_duplicate_key_inside_a_block_is_refused_too():
    write("inner.yaml", RESOURCES + "      domain: math\n")
    with pytest.raises(NeMoGymConfigError, match=r"`domain` is defined twice in one mapping \(line 6 and line 7\)"):
        parse_global_config(["+config_paths=[inner.yaml]"], allocate_ports=False)


def test_same_server_block_in_two_files_warns_naming_both(capsys):
    write("a.yaml", RESOURCES)
    write("b.yaml", RESOURCES.replace("knowledge", "math"))
    cfg = parse_global_config(["+config_paths=[a.yaml,b.yaml]"], allocate_ports=False)
    err = capsys.readouterr().err
    assert "warning: server block `my_res` is defined in" in err
    assert "a.yaml and again in" in err and "b.yaml" in err
    assert cfg.my_res.resources_servers.mcqa.domain == "math"  # later files still win


def test_one_file_per_block_gives_no_warning(capsys):
    write("a.yaml", RESOURCES)
    write("b.yaml", MODEL)
    parse_global_config(["+config_paths=[a.yaml,b.yaml]"], allocate_ports=False)
    assert "warning" not in capsys.readouterr().err


@pytest.mark.parametrize(("typo", "meant"), [("resources_serverz", "resources_servers"),
                                             ("responses_api_agent", "responses_api_agents"),
                                             ("response_api_models", "responses_api_models")])
def test_misspelled_server_kind_is_refused_with_a_suggestion(typo, meant):
    write("kind.yaml", RESOURCES.replace("resources_servers", typo))
    with pytest.raises(NeMoGymConfigError) as info:
        parse_global_config(["+config_paths=[kind.yaml]"], allocate_ports=False)
    assert f"`my_res.{typo}`: unknown server kind. Did you mean `{meant}`?" in str(info.value)


def test_a_user_key_holding_a_dict_is_not_taken_for_a_server_kind():
    write("user.yaml", RESOURCES + "judge_settings:\n  temperature: 0.0\n  prompts: {a: b}\n")
    cfg = parse_global_config(["+config_paths=[user.yaml]"], allocate_ports=False)
    assert cfg.judge_settings.prompts.a == "b"
