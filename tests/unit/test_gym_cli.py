"""`gym` (nemo_gym/cli/gym.py): each v0.5 `gym <group> <action>` and flag translates to the registered command
and the `+key=value` overrides it would get from `ng_<name>`; mistakes are clear errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from nemo_gym.cli import gym
from nemo_gym.cli.commands import BY_NAME
from nemo_gym.cli.gym import ACTIONS, GymUsageError, completion_words, translate


def tr(*argv: str) -> tuple[str, list[str]]:
    t = translate(list(argv))
    return t.command_name, t.overrides


# -------------------------------------------------------------------------------------------- mappings


@pytest.mark.parametrize(
    "argv, command",
    [
        (["env", "start"], "run"),
        (["env", "status"], "status"),
        (["env", "resolve"], "dump_config"),
        (["env", "validate"], "validate"),
        (["env", "init", "--resources-server", "x"], "init_resources_server"),
        (["env", "test"], "test_all"),
        (["env", "test", "--resources-server", "x"], "test"),
        (["env", "test", "+entrypoint=resources_servers/x"], "test"),
        (["env", "prefetch"], "run"),
        (["env", "packages"], "gym:packages"),
        (["eval", "run"], "e2e_collect_rollouts"),
        (["eval", "run", "--no-serve"], "collect_rollouts"),
        (["eval", "prepare"], "prepare_benchmark"),
        (["eval", "aggregate"], "aggregate_rollouts"),
        (["eval", "reverify"], "reverify"),
        (["eval", "profile"], "reward_profile"),
        (["list", "benchmarks"], "list_benchmarks"),
        (["list", "environments"], "gym:list"),
        (["list", "agents"], "gym:list"),
        (["list", "models"], "gym:list"),
        (["list", "resources-servers"], "gym:list"),
        (["search", "math"], "gym:search"),
        (["dataset", "render"], "materialize_prompts"),
        (["dataset", "collate"], "prepare_data"),
        (["dataset", "upload"], "gym:unavailable"),
        (["dev", "test"], "gym:dev_test"),
        (["--version"], "version"),
    ],
)
def test_each_action_maps_to_its_command(argv, command):
    assert translate(argv).command_name == command


def test_every_mapped_command_is_registered_or_one_of_the_pending_ones():
    pending = {"validate", "prepare_benchmark", "aggregate_rollouts", "materialize_prompts", "list_benchmarks"}
    named = {a.command for a in ACTIONS if a.command} | {"test", "test_all", "collect_rollouts", "e2e_collect_rollouts"}
    assert named - set(BY_NAME) <= pending, named - set(BY_NAME)


# -------------------------------------------------------------------------------------------- flags


def test_config_flags_merge_into_one_config_paths_with_bare_config_paths():
    _, ov = tr("env", "start", "--config", "a.yaml", "--config=b.yaml", "+config_paths=[c.yaml,d.yaml]", "+x=1")
    assert ov == ["+config_paths=[a.yaml,b.yaml,c.yaml,d.yaml]", "+x=1"]


def test_shared_model_flags():
    _, ov = tr("env", "start", "-m", "m1", "--model-url", "http://h:1/v1", "--model-api-key", "k")
    assert ov == ["+policy_model_name=m1", "+policy_base_url=http://h:1/v1", "+policy_api_key=k"]
    _, ov = tr("eval", "run", "--model=m2")
    assert ov == ["+policy_model_name=m2"]


@pytest.mark.parametrize("where", ["top", "leaf_short", "leaf_long"])
def test_verbose_anywhere_adds_verbose(where):
    argv = {"top": ["-v", "env", "status"], "leaf_short": ["env", "status", "-v"],
            "leaf_long": ["env", "status", "--verbose"]}[where]
    assert tr(*argv) == ("status", [gym.verbose_override()])
    assert gym.verbose_override().endswith("+verbose=true")


def test_json_flag():
    assert tr("env", "status", "--json") == ("status", ["+json=true"])
    assert tr("--version", "--json") == ("version", ["+json=true"])
    with pytest.raises(GymUsageError, match="--version"):
        translate(["--version", "--jsn"])


def test_eval_run_flags():
    _, ov = tr(
        "eval", "run", "--no-serve", "--resume", "-a", "ag", "--input", "in.jsonl", "-o", "out dir/o.jsonl",
        "--limit", "5", "--num-repeats", "3", "--prompt-config", "p.yaml", "--concurrency", "8", "--split",
        "benchmark", "--temperature", "0.5", "--top-p", "0.9", "--max-output-tokens", "64", "--disable-aggregation",
    )
    assert ov == [
        "+resume_from_cache=true",
        "+agent_name=ag",
        "+input_jsonl_fpath=in.jsonl",
        "+output_jsonl_fpath='out dir/o.jsonl'",
        "+limit=5",
        "+num_repeats=3",
        "+prompt_config=p.yaml",
        "+num_samples_in_parallel=8",
        "+split=benchmark",
        "+responses_create_params.temperature=0.5",
        "+responses_create_params.top_p=0.9",
        "+responses_create_params.max_output_tokens=64",
        "+disable_aggregation=true",
    ]


def test_eval_reverify_aggregate_profile_flags():
    t = translate(["eval", "reverify", "--inputs", "m.jsonl", "--rollouts", "r.jsonl", "-o", "o.jsonl",
                   "--concurrency", "2", "--limit", "3", "--force", "--overwrite", "--resume",
                   "--disable-aggregation", "--judge-failed-only", "--append"])
    assert t.overrides == [
        "+input_jsonl_fpath=r.jsonl", "+output_jsonl_fpath=o.jsonl", "+num_samples_in_parallel=2", "+limit=3",
        "+force=true", "+overwrite=true", "+resume_from_cache=true", "+disable_aggregation=true",
        "+judge_failed_only=true", "+append=true",
    ]
    assert any("--inputs" in n for n in t.notes)
    assert tr("eval", "aggregate", "--input-glob", "a/*.jsonl,b/*.jsonl", "--output", "m.jsonl") == (
        "aggregate_rollouts", ["+input_glob='a/*.jsonl,b/*.jsonl'", "+output_jsonl_fpath=m.jsonl"])
    assert tr("eval", "profile", "--inputs", "m.jsonl", "--rollouts", "r.jsonl") == (
        "reward_profile", ["+materialized_inputs_jsonl_fpath=m.jsonl", "+rollouts_jsonl_fpath=r.jsonl"])


def test_dataset_flags():
    assert tr("dataset", "render", "-i", "in.jsonl", "--prompt-config", "p.yaml", "-o", "out.jsonl") == (
        "materialize_prompts",
        ["+input_jsonl_fpath=in.jsonl", "+prompt_config=p.yaml", "+output_jsonl_fpath=out.jsonl"],
    )
    assert tr("dataset", "collate", "--mode", "train_preparation", "--output-dir", "d", "--download") == (
        "prepare_data", ["+mode=train_preparation", "+output_dirpath=d", "+should_download=true"])


def test_env_prefetch_is_a_dry_run_and_init_takes_the_server_name():
    assert tr("env", "prefetch", "--config", "a.yaml") == ("run", ["+config_paths=[a.yaml]", "+dry_run=true"])
    assert tr("env", "init", "--resources-server", "my_rs") == (
        "init_resources_server", ["+entrypoint=resources_servers/my_rs"])
    assert tr("env", "init", "--entrypoint", "resources_servers/a") == (
        "init_resources_server", ["+entrypoint=resources_servers/a"])


def test_list_and_search_words():
    assert tr("list", "benchmarks", "aime24") == ("list_benchmarks", ["+name=aime24"])
    t = translate(["search", "agents", "simple", "--json"])
    assert (t.words, t.overrides) == (["agents", "simple"], ["+json=true"])


# -------------------------------------------------------------------------------------------- asset selectors


def _write(root: Path, rel: str) -> Path:
    path = root / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("x: 1\n")
    return path


def test_asset_selectors_resolve_over_search_dir_then_cwd(tmp_path, monkeypatch):
    extra, cwd = tmp_path / "extra", tmp_path / "cwd"
    bench = _write(cwd, "benchmarks/mybench/config.yaml")
    flavor = _write(cwd, "benchmarks/mybench/hard.yaml")
    shadow = _write(extra, "environments/myenv/config.yaml")
    _write(cwd, "environments/myenv/config.yaml")
    rs = _write(cwd, "resources_servers/myrs/configs/myrs.yaml")
    rs_flavor = _write(cwd, "resources_servers/myrs/configs/judge.yaml")
    model = _write(cwd, "responses_api_models/mymodel/configs/mymodel.yaml")
    monkeypatch.chdir(cwd)
    monkeypatch.delenv("NEMO_GYM_EXTRA_ROOTS", raising=False)

    t = translate(["eval", "run", "--search-dir", str(extra), "--config", "a.yaml", "--benchmark", "mybench",
                   "--environment", "myenv", "--resources-server", "myrs", "--model-type", "mymodel"])
    paths = [str(p.resolve()) for p in (bench, shadow, rs, model)]
    assert t.overrides == [f"+config_paths=[a.yaml,{','.join(paths)}]", "+split=benchmark"]  # --benchmark runs its split
    assert t.search_dirs == [str(extra)]
    assert tr("eval", "prepare", "--benchmark", "mybench/hard")[1] == [f"+config_paths=[{flavor.resolve()}]"]
    assert tr("env", "start", "--resources-server", "myrs/judge")[1] == [f"+config_paths=[{rs_flavor.resolve()}]"]


def test_unknown_asset_names_what_was_tried(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(GymUsageError) as info:
        translate(["eval", "prepare", "--benchmark", "nope"])
    assert "benchmarks/nope/config.yaml" in str(info.value) and "gym list benchmarks" in str(info.value)


# -------------------------------------------------------------------------------------------- mistakes


def test_unknown_flag_suggests_the_close_one():
    with pytest.raises(GymUsageError, match="unknown flag `--concurency`.*Did you mean `--concurrency`"):
        translate(["eval", "run", "--concurency", "3"])


def test_unknown_group_and_action_suggest():
    with pytest.raises(GymUsageError, match="Did you mean `eval`"):
        translate(["evl", "run"])
    with pytest.raises(GymUsageError, match="Did you mean `start`"):
        translate(["env", "strat"])
    with pytest.raises(GymUsageError, match="needs an action"):
        translate(["env"])


def test_value_flag_without_value_and_bool_with_value():
    with pytest.raises(GymUsageError, match="--agent needs a value"):
        translate(["eval", "run", "--agent"])
    with pytest.raises(GymUsageError, match="takes no value"):
        translate(["eval", "run", "--resume=yes"])


def test_main_exit_codes_and_messages(capsys):
    assert gym.main([]) == 1
    assert "Usage: gym <group> <action>" in capsys.readouterr().err
    assert gym.main(["env", "start", "--confg", "x.yaml"]) == 2
    assert "Did you mean `--config`" in capsys.readouterr().err
    if "prepare_benchmark" not in BY_NAME:
        assert gym.main(["eval", "prepare"]) == 1
        assert "`gym eval prepare` needs the `prepare_benchmark` command, which this install does not have" in (
            capsys.readouterr().err)
    assert gym.main(["dataset", "upload"]) == 1
    assert "not available" in capsys.readouterr().err


def test_help_for_top_group_and_action(capsys):
    assert gym.main(["--help"]) == 0
    out = capsys.readouterr().out
    assert all(f"gym {a.words}" in out for a in ACTIONS)
    assert gym.main(["eval"]) == 0 and "reverify" in capsys.readouterr().out
    assert gym.main(["eval", "run", "--help"]) == 0
    out = capsys.readouterr().out
    assert "--max-output-tokens" in out and "ng_e2e_collect_rollouts" in out
    assert gym.main(["env", "status", "-h"]) == 0
    assert "ng_status:" in capsys.readouterr().out  # the command's own parameter help follows


def test_completion_words_follow_the_table():
    assert "env" in completion_words([]) and "--version" in completion_words([])
    assert set(completion_words(["env"])) == {"init", "resolve", "validate", "packages", "test", "start",
                                              "prefetch", "status"}
    assert "--no-serve" in completion_words(["eval", "run"]) and "--config" in completion_words(["eval", "run", "-a"])
    assert "agents" in completion_words(["search"])
    assert gym.main(["--completion", "bash"]) == 0


# -------------------------------------------------------------------------------------------- local actions


def test_list_components_finds_server_folders_and_earlier_roots_win(tmp_path, monkeypatch, capsys):
    a, b = tmp_path / "a", tmp_path / "b"
    _write(a, "responses_api_agents/my_agent/configs/my_agent.yaml")
    _write(b, "responses_api_agents/my_agent/configs/other.yaml")
    _write(b, "responses_api_agents/second_agent/requirements.txt")
    (b / "responses_api_agents" / "not_a_server").mkdir()
    monkeypatch.chdir(b)
    monkeypatch.delenv("NEMO_GYM_EXTRA_ROOTS", raising=False)
    assert gym.main(["list", "agents", "--search-dir", str(a), "--json"]) == 0
    rows = {r["name"]: r for r in json.loads(capsys.readouterr().out)}
    assert rows["my_agent"]["configs"] == ["responses_api_agents/my_agent/configs/my_agent.yaml"]
    assert "second_agent" in rows and "not_a_server" not in rows
    assert "simple_agent" in rows  # the install root is searched last
    assert gym.main(["search", "agents", "secnd", "--json"]) == 0
    assert [r["name"] for r in json.loads(capsys.readouterr().out)] == ["second_agent"]
    assert gym.main(["list", "agents", "second_agnt"]) == 1
    assert "Did you mean `second_agent`" in capsys.readouterr().err


def test_fuzzy_filter_prefers_substrings():
    assert gym.fuzzy_filter("math", ["mathx", "my_awesome_thing_h", "other"]) == ["mathx", "my_awesome_thing_h"]


def test_search_rank_matches_names_descriptions_and_domains_as_v05():
    row = {"name": "word_problems", "description": "Sums checked by math-verify", "domain": "knowledge"}
    assert gym.search_rank("word", row) == 0  # part of the name
    assert gym.search_rank("problms", row) == 1  # close to a word of the name
    assert gym.search_rank("math", row) == 2  # in the description
    assert gym.search_rank("knowledg", row) == 2  # close to the domain
    assert gym.search_rank("chemistry", row) is None
    rows = [{"name": "arithmetic", "domain": "math"}, {"name": "gsm_math"}, {"name": "trivia", "domain": "knowledge"}]
    assert [r["name"] for r in gym.search_rows("math", rows)] == ["gsm_math", "arithmetic"]


def _write_benchmark(root: Path, name: str, domain: str, description: str) -> None:
    folder = root / "benchmarks" / name
    folder.mkdir(parents=True)
    (folder / "config.yaml").write_text(
        f"{name}_rs:\n  resources_servers:\n    mcqa:\n      entrypoint: app.py\n      domain: {domain}\n"
        f"      description: {description}\n"
        f"{name}_agent:\n  responses_api_agents:\n    simple_agent:\n      entrypoint: app.py\n"
        f"      datasets:\n        - {{name: {name}, type: benchmark, jsonl_fpath: benchmarks/{name}/data/x.jsonl, "
        f"prepare_script: benchmarks.{name}.prepare}}\n"
    )


def test_gym_search_finds_benchmarks_resources_servers_and_environments_by_domain(tmp_path, monkeypatch, capsys):
    """`gym search math` as v0.5: the query is matched against names, descriptions and domains."""
    _write_benchmark(tmp_path, "gsm_tiny", "math", "grade-school word problems")
    _write_benchmark(tmp_path, "trivia_tiny", "knowledge", "general questions")
    server = tmp_path / "resources_servers" / "adder" / "configs"
    server.mkdir(parents=True)
    (server / "adder.yaml").write_text(
        "adder_rs:\n  resources_servers:\n    adder:\n      entrypoint: app.py\n      domain: math\n"
        "      description: sums two numbers\n"
    )
    env = tmp_path / "environments" / "counting"
    env.mkdir(parents=True)
    (env / "config.yaml").write_text(
        "counting_rs:\n  resources_servers:\n    adder:\n      entrypoint: app.py\n      domain: math\n"
    )
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("NEMO_GYM_EXTRA_ROOTS", raising=False)

    assert gym.main(["search", "math", "--json"]) == 0  # benchmarks by default
    found = [b["name"] for b in json.loads(capsys.readouterr().out)]
    assert "gsm_tiny" in found and "trivia_tiny" not in found
    assert gym.main(["search", "resources-servers", "math", "--json"]) == 0
    rows = {r["name"]: r for r in json.loads(capsys.readouterr().out)}
    assert rows["adder"]["domain"] == "math" and rows["adder"]["description"] == "sums two numbers"
    assert gym.main(["search", "environments", "math", "--json"]) == 0
    assert [r["name"] for r in json.loads(capsys.readouterr().out)] == ["counting"]
    assert gym.main(["search", "environments", "zzzq"]) == 0
    assert "No environments match `zzzq`" in capsys.readouterr().out


def test_list_environments_reads_environment_folders(tmp_path, monkeypatch, capsys):
    env = tmp_path / "environments" / "my_env"
    env.mkdir(parents=True)
    (env / "config.yaml").write_text(
        "my_rs:\n  resources_servers:\n    mcqa:\n      entrypoint: app.py\n      domain: knowledge\n"
        "      description: answer questions\n"
    )
    (tmp_path / "environments" / "no_config").mkdir()
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("NEMO_GYM_EXTRA_ROOTS", raising=False)
    assert gym.main(["list", "environments", "my_env", "--json"]) == 0
    [row] = json.loads(capsys.readouterr().out)
    assert row["name"] == "my_env" and row["configs"] == ["environments/my_env/config.yaml"]
    assert gym.main(["list", "environments", "no_config"]) == 1


def test_unknown_top_level_option_suggests():
    with pytest.raises(GymUsageError, match="Did you mean `--version`"):
        translate(["--versoin"])


def test_eval_run_with_a_benchmark_runs_its_benchmark_split_unless_told_otherwise():
    from nemo_gym.cli.gym import translate

    t = translate(["eval", "run", "--benchmark", "arithmetic", "-o", "out.jsonl"])
    assert t.command_name == "e2e_collect_rollouts" and "+split=benchmark" in t.overrides
    assert any(o.startswith("+config_paths=[") and "benchmarks/arithmetic/config.yaml" in o for o in t.overrides)
    told = translate(["eval", "run", "--benchmark", "arithmetic", "--split", "validation", "-o", "out.jsonl"])
    assert "+split=validation" in told.overrides and "+split=benchmark" not in told.overrides
