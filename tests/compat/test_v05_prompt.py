"""v0.5 prompt templates (`nemo_gym.prompt`): loading YAML through the search roots, rendering rows, the
template/input exclusivity check, offline materialization, and a dataset's `prompt_config` applied while
`ng_prepare_data` writes the prepared files."""

import json
import shutil
from pathlib import Path

import pytest

from nemo_gym import PARENT_DIR
from nemo_gym.errors import NeMoGymConfigError
from nemo_gym.prompt import (
    PromptConfig,
    apply_prompt_to_row,
    fill_prompt,
    load_prompt_config,
    materialize_prompts,
    prompt_row_applier,
    validate_prompt_compatibility,
)

MATH = """\
system: You are a careful mathematician.
user: "Solve: {question}\\nPut the final answer in \\\\boxed{{}}."
description: ignored by the loader
"""


@pytest.fixture(autouse=True)
def fresh_cache(monkeypatch):
    monkeypatch.delenv("NEMO_GYM_EXTRA_ROOTS", raising=False)
    load_prompt_config.cache_clear()
    yield
    load_prompt_config.cache_clear()


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


# ----------------------------------------------------------------------------------------------- loading


def test_load_from_a_relative_path_in_the_current_directory(tmp_path, monkeypatch):
    write(tmp_path / "prompts" / "math.yaml", MATH)
    monkeypatch.chdir(tmp_path)
    cfg = load_prompt_config("prompts/math.yaml")
    assert isinstance(cfg, PromptConfig)
    assert cfg.system == "You are a careful mathematician."
    assert cfg.user == "Solve: {question}\nPut the final answer in \\boxed{{}}."
    assert cfg.source == str((tmp_path / "prompts" / "math.yaml").resolve())
    assert not hasattr(cfg, "description")  # other keys are ignored


def test_extra_roots_come_before_the_current_directory(tmp_path, monkeypatch):
    write(tmp_path / "extra" / "p.yaml", "user: from extra {x}\n")
    write(tmp_path / "cwd" / "p.yaml", "user: from cwd {x}\n")
    monkeypatch.chdir(tmp_path / "cwd")
    assert load_prompt_config("p.yaml").user == "from cwd {x}"
    load_prompt_config.cache_clear()
    monkeypatch.setenv("NEMO_GYM_EXTRA_ROOTS", str(tmp_path / "extra"))
    assert load_prompt_config("p.yaml").user == "from extra {x}"


def test_relative_path_falls_back_to_the_install_root(tmp_path, monkeypatch):
    # configs/quickstart.yaml ships with nemo_gym and is not in the (empty) current directory. It is no prompt
    # template, so loading it fails, naming the file found under the install root.
    monkeypatch.chdir(tmp_path)
    with pytest.raises(NeMoGymConfigError) as info:
        load_prompt_config("configs/quickstart.yaml")
    assert str(Path(PARENT_DIR) / "configs" / "quickstart.yaml") in str(info.value)
    assert "`user`" in str(info.value)


def test_missing_file_names_every_place_looked(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(FileNotFoundError) as info:
        load_prompt_config("prompts/nope.yaml")
    assert isinstance(info.value, NeMoGymConfigError)
    assert str(tmp_path / "prompts" / "nope.yaml") in str(info.value)
    assert str(Path(PARENT_DIR) / "prompts" / "nope.yaml") in str(info.value)


def test_bad_yaml_names_the_file_and_line(tmp_path):
    path = write(tmp_path / "bad.yaml", "system: ok\nuser: [unclosed\n")
    with pytest.raises(NeMoGymConfigError) as info:
        load_prompt_config(path)
    assert str(path) in str(info.value) and "line" in str(info.value)


@pytest.mark.parametrize("text", ["system: only a system part\n", "user: [a, list]\n", "- a\n- b\n", ""])
def test_a_file_without_a_user_template_is_refused(tmp_path, text):
    path = write(tmp_path / "p.yaml", text)
    with pytest.raises(NeMoGymConfigError) as info:
        load_prompt_config(path)
    assert str(path) in str(info.value)


def test_loads_are_cached_by_resolved_path(tmp_path, monkeypatch):
    path = write(tmp_path / "p.yaml", "user: first {x}\n")
    monkeypatch.chdir(tmp_path)
    first = load_prompt_config("p.yaml")
    assert load_prompt_config(str(path)) is first  # relative and absolute spellings share the entry
    path.write_text("user: second {x}\n")
    assert load_prompt_config("p.yaml").user == "first {x}"
    assert load_prompt_config.cache_info().maxsize == 64
    load_prompt_config.cache_clear()
    assert load_prompt_config("p.yaml").user == "second {x}"


# ----------------------------------------------------------------------------------------------- rendering


def test_fill_prompt_renders_system_then_user_from_top_level_fields():
    cfg = PromptConfig(system="Be {tone}.", user="Q: {question} ({meta})")
    row = {"question": "2+2?", "tone": "brief", "meta": {"level": 1}}
    assert fill_prompt(cfg, row) == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Q: 2+2? ({'level': 1})"},
    ]
    assert fill_prompt(PromptConfig(user="{question} in {{braces}}"), row) == [
        {"role": "user", "content": "2+2? in {braces}"}
    ]


def test_a_missing_field_is_a_key_error_listing_the_row_fields():
    with pytest.raises(KeyError) as info:
        fill_prompt(PromptConfig(user="{question} {answer_choices}"), {"question": "q", "expected_answer": "a"})
    message = str(info.value)
    assert "answer_choices" in message and "expected_answer, question" in message


def test_a_lone_brace_is_a_clear_value_error():
    with pytest.raises(ValueError) as info:
        fill_prompt(PromptConfig(user="f(x) = {x"), {"x": 1})
    assert "doubled" in str(info.value)


def test_validate_prompt_compatibility_lists_every_row_with_its_own_input():
    rows = [
        {"question": "a"},
        {"question": "b", "responses_create_params": {"input": "hi"}},
        {"question": "c", "responses_create_params": {"input": [], "temperature": 0.5}},
        {"question": "d", "responses_create_params": {"input": [{"role": "user", "content": "x"}]}},
    ]
    with pytest.raises(ValueError) as info:
        validate_prompt_compatibility(rows, PromptConfig(user="{question}"))
    assert "Rows (0-based): 1, 3." in str(info.value)
    validate_prompt_compatibility([rows[0], rows[2]], PromptConfig(user="{question}"))


def test_apply_prompt_to_row_keeps_other_params_and_the_original_row():
    cfg = PromptConfig(user="{question}")
    row = {"question": "why?", "responses_create_params": {"temperature": 0.2, "max_output_tokens": 9}}
    out = apply_prompt_to_row(row, cfg)
    assert out["responses_create_params"] == {
        "temperature": 0.2,
        "max_output_tokens": 9,
        "input": [{"role": "user", "content": "why?"}],
    }
    assert row["responses_create_params"] == {"temperature": 0.2, "max_output_tokens": 9}
    assert apply_prompt_to_row({"question": "q"}, cfg)["responses_create_params"] == {
        "input": [{"role": "user", "content": "q"}]
    }


def test_the_row_applier_loads_the_template_once(tmp_path):
    path = write(tmp_path / "p.yaml", "user: '#{n}'\n")
    apply = prompt_row_applier(str(path))
    path.write_text("user: 'changed {n}'\n")
    load_prompt_config.cache_clear()
    assert [apply({"n": i})["responses_create_params"]["input"][0]["content"] for i in range(3)] == ["#0", "#1", "#2"]
    with pytest.raises(FileNotFoundError):
        prompt_row_applier(str(tmp_path / "missing.yaml"))


# ----------------------------------------------------------------------------------------------- materializing


def test_materialize_prompts_renders_every_row_and_records_the_template(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    template = write(tmp_path / "prompts" / "math.yaml", MATH)
    write(tmp_path / "in.jsonl", "\n".join(json.dumps({"question": q, "expected_answer": a}) for q, a in
                                           [("1+1", "2"), ("2*3", "6")]) + "\n\n")
    out = materialize_prompts("in.jsonl", "prompts/math.yaml", "out/rendered.jsonl")
    assert out == tmp_path / "out" / "rendered.jsonl"
    rows = read_jsonl(out)
    assert [r["expected_answer"] for r in rows] == ["2", "6"]
    assert rows[1]["responses_create_params"]["input"] == [
        {"role": "system", "content": "You are a careful mathematician."},
        {"role": "user", "content": "Solve: 2*3\nPut the final answer in \\boxed{}."},
    ]
    assert {r["prompt_config_used"] for r in rows} == {str(template.resolve())}


def test_materialize_prompts_refuses_rows_with_input_and_writes_nothing(tmp_path):
    template = write(tmp_path / "p.yaml", "user: '{question}'\n")
    source = write(tmp_path / "in.jsonl", json.dumps({"question": "a"}) + "\n"
                   + json.dumps({"question": "b", "responses_create_params": {"input": "own"}}) + "\n")
    with pytest.raises(ValueError) as info:
        materialize_prompts(source, template, tmp_path / "out.jsonl")
    assert "Rows (0-based): 1." in str(info.value)
    assert not (tmp_path / "out.jsonl").exists()


def test_materialize_prompts_names_the_line_of_bad_json(tmp_path):
    template = write(tmp_path / "p.yaml", "user: '{question}'\n")
    source = write(tmp_path / "in.jsonl", json.dumps({"question": "a"}) + "\n{not json\n")
    with pytest.raises(NeMoGymConfigError) as info:
        materialize_prompts(source, template, tmp_path / "out.jsonl")
    assert f"{source}:2" in str(info.value)


def test_materialize_prompts_names_the_line_of_a_row_missing_a_field(tmp_path):
    template = write(tmp_path / "p.yaml", "user: '{question}'\n")
    source = write(tmp_path / "in.jsonl", json.dumps({"question": "a"}) + "\n" + json.dumps({"q": "b"}) + "\n")
    with pytest.raises(KeyError) as info:
        materialize_prompts(source, template, tmp_path / "out.jsonl")
    assert f"{source}:2" in str(info.value) and "question" in str(info.value)
    assert not (tmp_path / "out.jsonl").exists()


# ----------------------------------------------------------------------------------------------- ng_prepare_data

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "prepare_data"


def test_a_dataset_prompt_config_is_rendered_into_the_prepared_rows(tmp_path, monkeypatch):
    from nemo_gym.config.global_config import parse_global_config
    from nemo_gym.rollouts.data_prep import (
        POLICY_PLACEHOLDERS,
        PrepareDataError,
        TrainDataProcessorConfig,
        prepare_data,
    )

    ws = tmp_path / "ws"
    shutil.copytree(FIXTURE, ws)
    monkeypatch.chdir(ws)
    write(ws / "prompts" / "qa.yaml", "system: Answer in one word.\nuser: 'Question: {question}'\n")
    write(ws / "data" / "bench.jsonl", "".join(json.dumps({"question": q, "expected_answer": a}) + "\n"
                                               for q, a in [("Capital of France?", "Paris"), ("2+2?", "4")]))
    write(ws / "configs" / "bench.yaml", """
qa_resources_server:
  resources_servers:
    qa_check:
      entrypoint: app.py
      domain: knowledge
bench_agent:
  responses_api_agents:
    simple_agent:
      entrypoint: app.py
      resources_server: {type: resources_servers, name: qa_resources_server}
      datasets:
        - {name: bench, type: example, jsonl_fpath: data/bench.jsonl, prompt_config: prompts/qa.yaml, num_repeats: 2}
""")

    def run():
        gc = parse_global_config(
            ["+config_paths=[configs/bench.yaml]", "+output_dirpath=out", "+mode=example_validation"],
            initial_global_config_dict=dict(POLICY_PLACEHOLDERS),
            allocate_ports=False,
            cwd=ws,
            load_env_yaml=False,
        )
        return prepare_data(TrainDataProcessorConfig.from_global_config(gc), gc)

    paths = run()
    prepared = read_jsonl(ws / "data" / "bench_prepare.jsonl")
    assert [r["expected_answer"] for r in prepared] == ["Paris", "Paris", "4", "4"]
    assert prepared[0]["responses_create_params"] == {"input": [
        {"role": "system", "content": "Answer in one word."},
        {"role": "user", "content": "Question: Capital of France?"},
    ]}
    assert read_jsonl(paths["example"]) == prepared
    metrics = json.loads((ws / "data" / "bench_metrics.json").read_text())
    assert metrics["Number of turns"]["Average"] == 1  # measured on the rendered input

    # A row that brings its own input is reported with its file and line.
    with (ws / "data" / "bench.jsonl").open("a") as handle:
        own = {"question": "x", "expected_answer": "y", "responses_create_params": {"input": "own"}}
        handle.write(json.dumps(own) + "\n")
    with pytest.raises(PrepareDataError) as info:
        run()
    assert "data/bench.jsonl:3" in str(info.value) and "prompt_config" in str(info.value)

    # A template path that does not exist names the agent and the dataset.
    text = (ws / "configs" / "bench.yaml").read_text().replace("prompts/qa.yaml", "prompts/missing.yaml")
    (ws / "configs" / "bench.yaml").write_text(text)
    with pytest.raises(NeMoGymConfigError) as info:
        run()
    assert "bench_agent" in str(info.value) and "prompts/missing.yaml" in str(info.value)
