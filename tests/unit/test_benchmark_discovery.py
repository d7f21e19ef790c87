"""Benchmarks and environments as data: search roots, discovery and naming, `prepare` of benchmark datasets, the
`benchmark` dataset type, and the list/prepare commands (run through `COMMAND.main`)."""

from __future__ import annotations

import json
import textwrap
import uuid
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from nemo_gym import PARENT_DIR
from nemo_gym.config.types import BenchmarkDatasetConfig, DatasetConfig, parse_dataset_config
from nemo_gym.errors import NeMoGymConfigError
from nemo_gym.rollouts.benchmarks import (
    PrepareBenchmarkConfig,
    benchmark_datasets_in,
    component_search_roots,
    discover_benchmarks,
    discover_environments,
    find_benchmark,
    prepare_benchmarks,
    resolve_component_path,
)


@pytest.fixture
def roots(tmp_path, monkeypatch):
    """Two extra roots (`first` wins over `second`) and an empty working directory."""
    first, second, work = tmp_path / "first", tmp_path / "second", tmp_path / "work"
    for d in (first, second, work):
        d.mkdir()
    monkeypatch.setenv("NEMO_GYM_EXTRA_ROOTS", f"{first}:{second}")
    monkeypatch.chdir(work)
    return first, second, work


def _write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(text), encoding="utf-8")
    return path


def _benchmark_yaml(agent: str, dataset: str, prepare_script: str, jsonl: str, *, domain: str = "math") -> str:
    return f"""
    {agent}_resources_server:
      resources_servers:
        math_with_judge:
          entrypoint: app.py
          domain: {domain}
          description: about {dataset}
          value: why {dataset}
    {agent}:
      responses_api_agents:
        simple_agent:
          entrypoint: app.py
          resources_server: {{type: resources_servers, name: {agent}_resources_server}}
          model_server: {{type: responses_api_models, name: policy_model}}
          datasets:
            - {{name: {dataset}, type: benchmark, jsonl_fpath: {jsonl}, prepare_script: {prepare_script}}}
    """


PREPARE_PY = """
import json
from pathlib import Path

OUTPUT = Path(__file__).resolve().parent / "data" / "{stem}.jsonl"
CALLS = Path(__file__).resolve().parent / "calls.txt"


def prepare(num_rows=3, **_ignored):
    with CALLS.open("a") as f:
        f.write("called\\n")
    OUTPUT.parent.mkdir(parents=True, exist_ok=True)
    with OUTPUT.open("w") as out:
        for i in range(num_rows):
            out.write(json.dumps({{"question": f"q{{i}}", "expected_answer": str(i)}}) + "\\n")
    return {returned}
"""


def _make_benchmark(root: Path, name: str, *, returned: str = "str(OUTPUT)", prepare: bool = True) -> str:
    """A benchmark folder `root/benchmarks/<name>/` whose module has a unique dotted path; returns that path."""
    package = f"b{uuid.uuid4().hex[:8]}"
    stem = f"{name}_benchmark"
    folder = root / "benchmarks" / package
    _write(folder / "__init__.py", "")
    dotted = f"benchmarks.{package}.prepare"
    if prepare:
        _write(folder / "prepare.py", PREPARE_PY.format(stem=stem, returned=returned))
    jsonl = f"benchmarks/{package}/data/{stem}.jsonl"
    _write(folder / "config.yaml", _benchmark_yaml(f"{name}_agent", name, dotted, jsonl))
    return package


# ------------------------------------------------------------------------------------------------ search roots


def test_search_roots_are_extra_roots_then_cwd_then_install_root(roots):
    first, second, work = roots
    assert component_search_roots() == [first, second, work, Path(PARENT_DIR)]


def test_component_search_roots_is_importable_from_nemo_gym():
    import nemo_gym

    assert nemo_gym.component_search_roots is component_search_roots


def test_resolve_component_path_prefers_an_existing_file_then_the_deepest_existing_folder(roots):
    first, second, work = roots
    _write(second / "benchmarks" / "x" / "data" / "x.jsonl", "{}\n")
    assert resolve_component_path("benchmarks/x/data/x.jsonl") == second / "benchmarks/x/data/x.jsonl"
    # Not written yet: it belongs to the root that holds benchmarks/y/, even though another root has benchmarks/.
    (first / "benchmarks").mkdir()
    (second / "benchmarks" / "y").mkdir()
    assert resolve_component_path("benchmarks/y/data/y.jsonl") == second / "benchmarks/y/data/y.jsonl"
    assert resolve_component_path("nowhere/z.jsonl") == first / "nowhere/z.jsonl"
    assert resolve_component_path(str(work / "abs.jsonl")) == work / "abs.jsonl"


# ------------------------------------------------------------------------------------------------ discovery


def test_names_come_from_the_path_below_benchmarks(roots):
    first, _, _ = roots
    _write(first / "benchmarks/aime/config.yaml", _benchmark_yaml("a", "aime", "m.p", "a.jsonl"))
    _write(first / "benchmarks/gpqa/diamond.yaml", _benchmark_yaml("g", "gpqa", "m.p", "g.jsonl"))
    _write(first / "benchmarks/flat.yaml", _benchmark_yaml("f", "flat", "m.p", "f.jsonl"))
    _write(first / "benchmarks/prompts/generic/math.yaml", "user: '{question}'\n")  # a template, not a benchmark
    found = discover_benchmarks([first])
    assert sorted(found) == ["aime", "flat", "gpqa/diamond"]
    aime = found["aime"]
    assert aime.agent_name == "a"
    assert aime.dataset.name == "aime" and aime.dataset.type == "benchmark"
    assert (aime.domain, aime.description, aime.value) == ("math", "about aime", "why aime")
    assert aime.resources_servers == ["math_with_judge"]
    assert aime.config_relpath == "benchmarks/aime/config.yaml"


def test_an_earlier_root_shadows_the_same_name_in_a_later_one(roots):
    first, second, _ = roots
    _write(first / "benchmarks/same/config.yaml", _benchmark_yaml("mine", "same", "m.p", "x.jsonl"))
    _write(second / "benchmarks/same/config.yaml", _benchmark_yaml("theirs", "same", "m.p", "x.jsonl"))
    _write(second / "benchmarks/other/config.yaml", _benchmark_yaml("o", "other", "m.p", "x.jsonl"))
    found = discover_benchmarks()
    assert found["same"].agent_name == "mine"
    assert found["same"].root == first.resolve()
    assert "other" in found


def test_broken_definitions_are_reported_and_skipped(roots, capsys):
    first, _, _ = roots
    _write(first / "benchmarks/good/config.yaml", _benchmark_yaml("g", "good", "m.p", "g.jsonl"))
    _write(first / "benchmarks/unparsable/config.yaml", "a: [unclosed\n")
    _write(
        first / "benchmarks/no_script/config.yaml",
        "ag:\n  responses_api_agents:\n    simple_agent:\n      datasets:\n"
        "        - {name: x, type: benchmark, jsonl_fpath: x.jsonl}\n",
    )
    two = _benchmark_yaml("t", "two", "m.p", "t.jsonl").rstrip() + (
        "\n            - {name: two_b, type: benchmark, jsonl_fpath: u.jsonl, prepare_script: m.q}\n"
    )
    _write(first / "benchmarks/two/config.yaml", two)
    assert sorted(discover_benchmarks([first])) == ["good"]
    err = capsys.readouterr().err
    assert "benchmarks/unparsable/config.yaml" in err
    assert "benchmarks/no_script/config.yaml" in err and "prepare_script" in err
    assert "benchmarks/two/config.yaml" in err and "exactly one" in err


def test_find_benchmark_suggests_a_close_name(roots):
    first, _, _ = roots
    _write(first / "benchmarks/arithmetic/config.yaml", _benchmark_yaml("a", "arithmetic", "m.p", "a.jsonl"))
    with pytest.raises(NeMoGymConfigError, match=r"No benchmark named `arithmetc`.*arithmetic"):
        find_benchmark("arithmetc")


def test_environments_are_folders_with_a_config_and_list_their_server_fields(roots):
    first, second, _ = roots
    _write(first / "environments/games/config.yaml", _benchmark_yaml("g", "games", "m.p", "g.jsonl", domain="games"))
    _write(second / "environments/games/config.yaml", _benchmark_yaml("h", "hidden", "m.p", "h.jsonl"))
    _write(second / "environments/no_config/README.md", "nothing here\n")
    found = discover_environments([first, second])
    assert sorted(found) == ["games"]
    games = found["games"]
    assert (games.domain, games.description, games.value) == ("games", "about games", "why games")
    assert games.agents == ["g"] and games.dataset_types == ["benchmark"]


def test_the_shipped_definitions_are_found_from_any_directory(tmp_path, monkeypatch):
    monkeypatch.delenv("NEMO_GYM_EXTRA_ROOTS", raising=False)
    monkeypatch.chdir(tmp_path)
    benchmarks = discover_benchmarks()
    assert len(benchmarks) >= 5
    for benchmark in benchmarks.values():
        assert benchmark.root == Path(PARENT_DIR).resolve()
        assert benchmark.dataset.prepare_script.startswith(f"benchmarks.{benchmark.name}.")
        assert benchmark.domain and benchmark.description and benchmark.value
    environments = discover_environments()
    assert {"frozen_lake", "example_llm_judge"} <= set(environments)


# ------------------------------------------------------------------------------------------------ prepare


def _config_of(root: Path, *packages: str):
    merged = {}
    for package in packages:
        merged.update(OmegaConf.to_container(OmegaConf.load(root / "benchmarks" / package / "config.yaml")))
    return OmegaConf.create(merged)


def test_prepare_calls_the_script_and_checks_the_path(roots):
    first, _, _ = roots
    package = _make_benchmark(first, "alpha")
    cfg = _config_of(first, package)
    paths = prepare_benchmarks(PrepareBenchmarkConfig(prepare_script_args={"num_rows": 4}), cfg)
    expected = first / "benchmarks" / package / "data" / "alpha_benchmark.jsonl"
    assert paths == [expected]
    assert len(expected.read_text().splitlines()) == 4
    calls = first / "benchmarks" / package / "calls.txt"
    # Cached mode leaves an existing file alone; the default prepares again.
    prepare_benchmarks(PrepareBenchmarkConfig(use_cached_prepared_benchmarks=True), cfg)
    assert calls.read_text().count("called") == 1
    prepare_benchmarks(PrepareBenchmarkConfig(), cfg)
    assert calls.read_text().count("called") == 2


def test_a_script_returning_another_path_is_refused(roots):
    first, _, _ = roots
    package = _make_benchmark(first, "beta", returned="str(OUTPUT.with_name('elsewhere.jsonl'))")
    with pytest.raises(NeMoGymConfigError, match=r"returned .*elsewhere\.jsonl.*jsonl_fpath"):
        prepare_benchmarks(PrepareBenchmarkConfig(), _config_of(first, package))


def test_every_script_is_checked_before_any_runs(roots):
    first, _, _ = roots
    good = _make_benchmark(first, "gamma")
    missing = _make_benchmark(first, "delta", prepare=False)
    with pytest.raises(NeMoGymConfigError, match=r"(?s)1 benchmark prepare script.*delta.*cannot be imported"):
        prepare_benchmarks(PrepareBenchmarkConfig(), _config_of(first, good, missing))
    assert not (first / "benchmarks" / good / "calls.txt").exists()


def test_a_failing_script_names_its_benchmark(roots):
    first, _, _ = roots
    package = _make_benchmark(first, "epsilon", returned="None")
    with pytest.raises(NeMoGymConfigError, match=r"`epsilon`.*returned nothing"):
        prepare_benchmarks(PrepareBenchmarkConfig(), _config_of(first, package))


def test_an_agent_with_two_benchmark_datasets_is_refused():
    cfg = OmegaConf.create({
        "agent": {"responses_api_agents": {"simple_agent": {"datasets": [
            {"name": "a", "type": "benchmark", "jsonl_fpath": "a.jsonl", "prepare_script": "x.a"},
            {"name": "b", "type": "benchmark", "jsonl_fpath": "b.jsonl", "prepare_script": "x.b"},
        ]}}}
    })
    with pytest.raises(NeMoGymConfigError, match=r"`agent` has 2 benchmark datasets"):
        benchmark_datasets_in(cfg)


def test_a_config_without_benchmark_datasets_says_what_to_load():
    cfg = OmegaConf.create({"agent": {"responses_api_agents": {"simple_agent": {"datasets": [
        {"name": "e", "type": "example", "jsonl_fpath": "e.jsonl"}]}}}})
    with pytest.raises(NeMoGymConfigError, match=r"No benchmark dataset.*benchmarks/<name>/config.yaml"):
        prepare_benchmarks(PrepareBenchmarkConfig(), cfg)


# ------------------------------------------------------------------------------------------------ dataset config


def test_benchmark_dataset_config():
    dataset = parse_dataset_config(
        {"name": "b", "type": "benchmark", "jsonl_fpath": "b.jsonl", "prepare_script": "m.p", "prompt_config": "p.yaml"}
    )
    assert isinstance(dataset, BenchmarkDatasetConfig)
    assert (dataset.num_repeats, dataset.license, dataset.prompt_config) == (1, None, "p.yaml")
    with pytest.raises(ValueError, match="prepare_script"):
        parse_dataset_config({"name": "b", "type": "benchmark", "jsonl_fpath": "b.jsonl"})
    with pytest.raises(ValueError, match="num_repeats"):
        parse_dataset_config({"name": "b", "type": "benchmark", "jsonl_fpath": "b.jsonl", "prepare_script": "m",
                              "num_repeats": 0})


def test_source_block_is_mirrored_and_exclusive():
    dataset = DatasetConfig.model_validate({
        "name": "t", "type": "train", "jsonl_fpath": "t.jsonl", "license": "CC BY-SA 4.0",
        "source": {"type": "gitlab", "dataset_name": "d", "version": "1", "artifact_fpath": "t.jsonl"},
    })
    assert dataset.gitlab_identifier.dataset_name == "d"
    with pytest.raises(ValueError, match="both `source` and"):
        DatasetConfig.model_validate({
            "name": "t", "type": "example", "jsonl_fpath": "t.jsonl",
            "source": {"type": "huggingface", "repo_id": "o/r"},
            "huggingface_identifier": {"repo_id": "o/r"},
        })


# ------------------------------------------------------------------------------------------------ commands


def test_list_commands_print_json(roots, capsys):
    from nemo_gym.cli.commands.list_benchmarks import COMMAND, ENVIRONMENTS

    first, _, _ = roots
    _write(first / "benchmarks/mine/config.yaml", _benchmark_yaml("m", "mine", "m.p", "m.jsonl"))
    _write(first / "environments/envy/config.yaml", _benchmark_yaml("e", "envy", "m.p", "e.jsonl"))
    assert COMMAND.main(["--json"]) == 0
    listed = {b["name"]: b for b in json.loads(capsys.readouterr().out)}
    assert listed["mine"]["config_path"] == "benchmarks/mine/config.yaml"
    assert listed["mine"]["prepared"] is False
    assert COMMAND.main(["mine"]) == 0
    assert "agent: m" in capsys.readouterr().out
    assert COMMAND.main(["mien"]) != 0
    assert "Did you mean `mine`" in capsys.readouterr().err
    _write(first / "benchmarks/other/config.yaml", _benchmark_yaml("o", "other", "m.p", "o.jsonl"))
    assert COMMAND.main(["+query=mne", "--json"]) == 0
    assert [b["name"] for b in json.loads(capsys.readouterr().out)] == ["mine"]
    assert ENVIRONMENTS.main(["envy", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["value"] == "why envy"


def test_prepare_benchmark_command_needs_no_model_config(roots, capsys):
    from nemo_gym.cli.commands.prepare_benchmark import COMMAND

    first, _, work = roots
    package = _make_benchmark(first, "zeta")
    config = first / "benchmarks" / package / "config.yaml"
    # The definition alone refers to a policy_model it does not define: a stand-in fills in (no model is called).
    assert COMMAND.main([f"+config_paths=[{config}]", "+prepare_script_args={num_rows: 2}"]) == 0, capsys.readouterr()
    out = first / "benchmarks" / package / "data" / "zeta_benchmark.jsonl"
    assert len(out.read_text().splitlines()) == 2
    assert str(out) in capsys.readouterr().out
    # A script's own error still comes through (not the stand-in's story).
    assert COMMAND.main([f"+config_paths=[{config}]", "+prepare_script_args={num_rows: many}"]) != 0
    assert "`zeta`" in (err := capsys.readouterr().err) and "prepare() failed: TypeError" in err
    # And so does a mistake in the config itself.
    assert COMMAND.main([f"+config_paths=[{config},{work / 'missing.yaml'}]"]) != 0
    assert "missing.yaml" in capsys.readouterr().err


# ------------------------------------------------------------------------------------------------ collation (e2e)


def _global_config(work: Path, benchmark_config: Path):
    from nemo_gym.config.global_config import parse_global_config

    model = _write(work / "model.yaml", """
    policy_model:
      responses_api_models:
        openai_model:
          entrypoint: app.py
          openai_base_url: http://127.0.0.1:1
          openai_api_key: none
          openai_model: none
    """)
    return parse_global_config([f"+config_paths=[{benchmark_config},{model}]"], cwd=work, allocate_ports=False)


def test_split_benchmark_prepares_then_collates_with_prompt_and_repeats(roots):
    from nemo_gym.rollouts.e2e import E2ERolloutCollectionConfig, prepare_split

    first, _, work = roots
    package = _make_benchmark(first, "eta")
    config = first / "benchmarks" / package / "config.yaml"
    text = config.read_text().replace("prepare_script: benchmarks.", "num_repeats: 2, prompt_config: p.yaml, "
                                      "prepare_script: benchmarks.")
    config.write_text(text)
    _write(first / "p.yaml", "user: 'Q: {question}'\n")
    # Another agent's training data is not needed for the benchmark split (only benchmark datasets are collated).
    _write(work / "train.yaml", """
    other_agent:
      responses_api_agents:
        simple_agent:
          entrypoint: app.py
          resources_server: {type: resources_servers, name: eta_agent_resources_server}
          model_server: {type: responses_api_models, name: policy_model}
          datasets:
            - {name: t, type: train, jsonl_fpath: missing_train.jsonl, license: MIT}
    """)
    cfg = OmegaConf.merge(_global_config(work, config), OmegaConf.load(work / "train.yaml"))
    params = E2ERolloutCollectionConfig(output_jsonl_fpath=str(work / "run" / "rollouts.jsonl"), split="benchmark")
    collated = prepare_split(params, cfg)
    assert collated == work / "run" / "preprocessed_datasets" / "benchmark.jsonl"
    rows = [json.loads(line) for line in collated.read_text().splitlines()]
    assert len(rows) == 3 * 2  # three prepared rows, each twice
    assert [r["question"] for r in rows] == ["q0", "q0", "q1", "q1", "q2", "q2"]
    assert rows[2]["responses_create_params"]["input"] == [{"role": "user", "content": "Q: q1"}]
    assert {r["agent_ref"]["name"] for r in rows} == {"eta_agent"}

    # Reuse: the collated file is taken as it is, even when the benchmark data has gone.
    (first / "benchmarks" / package / "data" / "eta_benchmark.jsonl").unlink()
    reused = E2ERolloutCollectionConfig(
        output_jsonl_fpath=str(work / "run" / "rollouts.jsonl"), split="benchmark", reuse_existing_data_preparation=True
    )
    assert prepare_split(reused, cfg) == collated
    assert not (first / "benchmarks" / package / "data" / "eta_benchmark.jsonl").exists()
    # Without reuse it is prepared again.
    prepare_split(params, cfg)
    assert (first / "benchmarks" / package / "data" / "eta_benchmark.jsonl").exists()


def test_a_missing_benchmark_file_in_collation_says_how_to_prepare_it(roots):
    from nemo_gym.rollouts.data_prep import TrainDataProcessorConfig, prepare_data

    first, _, work = roots
    package = _make_benchmark(first, "theta")
    cfg = _global_config(work, first / "benchmarks" / package / "config.yaml")
    with pytest.raises(NeMoGymConfigError, match=r"(?s)theta.*ng_prepare_benchmark"):
        prepare_data(TrainDataProcessorConfig(output_dirpath=str(work / "out"), mode="train_preparation"), cfg)


@pytest.mark.parametrize("kind", ["benchmarks", "environments"])
def test_every_shipped_definition_builds_a_valid_stack_config(kind, monkeypatch):
    from nemo_gym.config.global_config import find_server_instances, parse_global_config
    from nemo_gym.rollouts.data_prep import POLICY_PLACEHOLDERS

    monkeypatch.delenv("NEMO_GYM_EXTRA_ROOTS", raising=False)
    found = discover_benchmarks([PARENT_DIR]) if kind == "benchmarks" else discover_environments([PARENT_DIR])
    assert found
    for definition in found.values():
        paths = f"{definition.config_path},responses_api_models/openai_model/configs/openai_model.yaml"
        cfg = parse_global_config([f"+config_paths=[{paths}]"], initial_global_config_dict=POLICY_PLACEHOLDERS,
                                  cwd=Path(PARENT_DIR), allocate_ports=False)
        types = {spec.server_type for spec in find_server_instances(cfg)}
        assert types == {"resources_servers", "responses_api_agents", "responses_api_models"}, definition.name
