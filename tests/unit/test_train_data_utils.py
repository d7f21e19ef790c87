"""ng_prepare_data: dataset scope, file checks, row validation against the verify model, metrics, conflicts,
prepared and collated outputs. Every test works on a copy of tests/fixtures/prepare_data (a resources server
whose verify request needs `expected_answer: str`, one whose dependency is missing, configs and data)."""

import json
import shutil
import sys
from pathlib import Path

import pytest

from nemo_gym.servers.resources_server import BaseRunRequest
from nemo_gym.cli import find_command
from nemo_gym.errors import NeMoGymConfigError
from nemo_gym.config.global_config import parse_global_config
from nemo_gym.rollouts.data_prep import (
    ERROR_REPORT_FILENAME,
    MAX_ERRORS_IN_MESSAGE,
    POLICY_PLACEHOLDERS,
    DatasetMetricsAccumulator,
    NumericAggregate,
    PrepareDataError,
    TrainDataProcessorConfig,
    check_dataset_files,
    compare_metrics,
    find_datasets_in_scope,
    load_verify_request_model,
    prepare_data,
    round_metric,
)

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "prepare_data"
ng_prepare_data = find_command("prepare_data").main  # the command as `ng_prepare_data` runs it
AGENT_REF = {"type": "responses_api_agents", "name": "qa_agent"}


@pytest.fixture
def ws(tmp_path, monkeypatch):
    """A writable copy of the fixture tree, used as the current directory."""
    root = tmp_path / "ws"
    shutil.copytree(FIXTURE, root)
    monkeypatch.chdir(root)
    return root


def load(ws: Path, *overrides: str, config: str = "configs/qa.yaml"):
    global_config = parse_global_config(
        [f"+config_paths=[{config}]", *overrides],
        initial_global_config_dict=dict(POLICY_PLACEHOLDERS),
        allocate_ports=False,
        cwd=ws,
        load_env_yaml=False,
    )
    return TrainDataProcessorConfig.from_global_config(global_config), global_config


def write_jsonl(path: Path, rows) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def qa_row(question: str, answer, **extra) -> dict:
    return {"responses_create_params": {"input": [{"role": "user", "content": question}]}, "expected_answer": answer, **extra}


def agent_yaml(agent: str, datasets: str, resources: str = "qa_resources_server", impl: str = "qa_check") -> str:
    return f"""
{resources}:
  resources_servers:
    {impl}:
      entrypoint: app.py
      domain: knowledge
{agent}:
  responses_api_agents:
    simple_agent:
      entrypoint: app.py
      resources_server:
        type: resources_servers
        name: {resources}
      datasets:
{datasets}
"""


def write_config(ws: Path, text: str, name: str = "custom.yaml") -> str:
    path = ws / "configs" / name
    path.write_text(text)
    return f"configs/{name}"


# ----------------------------------------------------------------------------------------------- parameters


def test_help_prints_parameters_and_exits_zero(capsys):
    for flag in ("+h=true", "+help=true"):
        assert ng_prepare_data([flag]) == 0
        out = capsys.readouterr().out
        assert "ng_prepare_data" in out
        for name in ("+output_dirpath", "+mode", "+should_download", "+data_source", "+overwrite_metrics_conflicts"):
            assert name in out
        assert "[required]" in out
        assert "'huggingface'" in out


def test_config_parameters_and_scope(ws):
    config, _ = load(ws, "+output_dirpath=out", "+mode=train_preparation")
    assert config.should_download is False
    assert config.data_source == "huggingface"
    assert config.overwrite_metrics_conflicts is False
    assert config.in_scope_dataset_types == ("train", "validation", "benchmark")  # v0.5: benchmark datasets are collated too
    config, _ = load(ws, "+output_dirpath=out", "+mode=example_validation")
    assert config.in_scope_dataset_types == ("example",)

    with pytest.raises(NeMoGymConfigError, match=r"\+mode"):
        load(ws, "+output_dirpath=out")
    with pytest.raises(NeMoGymConfigError, match="train_preparation"):
        load(ws, "+output_dirpath=out", "+mode=training")


def test_config_is_parsed_with_empty_policy_values_and_no_ports(ws, monkeypatch):
    import nemo_gym.config.global_config as global_config_module

    seen = {}
    real = global_config_module.parse_global_config

    def spy(overrides, **kwargs):
        seen.update(kwargs)
        return real(overrides, **kwargs)

    monkeypatch.setattr(global_config_module, "parse_global_config", spy)
    args = ["+config_paths=[configs/qa.yaml]", "+output_dirpath=out", "+mode=example_validation"]
    assert ng_prepare_data(args) == 0
    assert seen["initial_global_config_dict"] == {"policy_base_url": "", "policy_api_key": "", "policy_model_name": ""}
    assert seen["allocate_ports"] is False
    # A value given on the command line still wins over the seeded empty one.
    gc = real([*args, "+policy_model_name=m"], initial_global_config_dict=dict(POLICY_PLACEHOLDERS), allocate_ports=False)
    assert gc.policy_model_name == "m" and gc.policy_base_url == ""


def test_missing_parameter_exits_2(ws, capsys):
    assert ng_prepare_data(["+config_paths=[configs/qa.yaml]", "+mode=example_validation"]) == 2
    assert "output_dirpath" in capsys.readouterr().err


# ----------------------------------------------------------------------------------------------- scope


def test_train_preparation_keeps_train_and_validation_only(ws):
    config, gc = load(ws, "+output_dirpath=out", "+mode=train_preparation")
    found = find_datasets_in_scope(config, gc)
    assert [(d.agent_name, d.dataset.name, d.dataset.type) for d in found] == [
        ("qa_agent", "train", "train"),
        ("qa_agent", "validation", "validation"),
    ]
    assert found[0].path == ws / "data" / "qa_train.jsonl"
    assert found[0].resources_server_name == "qa_resources_server"
    # qa_examples_only_agent lists only example data: it contributes nothing here (A.9 fixed).
    assert all(d.agent_name != "qa_examples_only_agent" for d in found)


def test_example_validation_keeps_examples_of_every_agent(ws):
    config, gc = load(ws, "+output_dirpath=out", "+mode=example_validation")
    found = find_datasets_in_scope(config, gc)
    assert [(d.agent_name, d.dataset.name) for d in found] == [
        ("qa_agent", "example"),
        ("qa_examples_only_agent", "more_examples"),
    ]


def test_nothing_in_scope_is_an_error(ws):
    path = write_config(
        ws,
        agent_yaml("only_examples", "        - {name: ex, type: example, jsonl_fpath: data/qa_example.jsonl}"),
    )
    config, gc = load(ws, "+output_dirpath=out", "+mode=train_preparation", config=path)
    with pytest.raises(NeMoGymConfigError, match=r"Nothing to prepare in mode train_preparation.*only_examples"):
        find_datasets_in_scope(config, gc)


# ----------------------------------------------------------------------------------------------- files


def test_missing_files_are_all_reported(ws):
    (ws / "data" / "qa_train.jsonl").unlink()
    (ws / "data" / "qa_validation.jsonl").unlink()
    config, gc = load(ws, "+output_dirpath=out", "+mode=train_preparation")
    with pytest.raises(PrepareDataError) as info:
        prepare_data(config, gc)
    message = str(info.value)
    assert "2 dataset file(s) missing" in message
    assert "dataset 'train' (type train, agent 'qa_agent'): file data/qa_train.jsonl not found" in message
    assert "dataset 'validation'" in message and "data/qa_validation.jsonl" in message
    assert str(ws / "data" / "qa_validation.jsonl") in message
    assert not (ws / "out").exists()


def test_should_download_is_refused_offline_with_where_to_put_the_file(ws):
    datasets = """        - name: hf_train
          type: train
          jsonl_fpath: data/not_here.jsonl
          license: MIT
          huggingface_identifier: {repo_id: someorg/somedata, artifact_fpath: train.jsonl}
          gitlab_identifier: {dataset_name: gl_data, version: 0.0.1, artifact_fpath: train.jsonl}
        - name: bare_train
          type: train
          jsonl_fpath: data/also_not_here.jsonl
          license: MIT
        - name: ex
          type: example
          jsonl_fpath: data/no_example.jsonl
"""
    path = write_config(ws, agent_yaml("dl_agent", datasets))
    config, gc = load(ws, "+output_dirpath=out", "+mode=train_preparation", "+should_download=true", config=path)
    found = find_datasets_in_scope(config, gc)
    with pytest.raises(PrepareDataError) as info:
        check_dataset_files(config, found)
    message = str(info.value)
    assert "dataset 'hf_train' (type train, agent 'dl_agent')" in message
    assert "Hugging Face dataset someorg/somedata, file train.jsonl is not supported offline" in message
    assert f"put it at {ws / 'data' / 'not_here.jsonl'}" in message
    assert "dataset 'bare_train'" in message and "no huggingface_identifier or gitlab_identifier" in message

    config, gc = load(
        ws, "+output_dirpath=out", "+mode=train_preparation", "+should_download=true", "+data_source=gitlab", config=path
    )
    with pytest.raises(PrepareDataError, match="GitLab/MLflow dataset gl_data version 0.0.1"):
        check_dataset_files(config, find_datasets_in_scope(config, gc))

    config, gc = load(ws, "+output_dirpath=out", "+mode=example_validation", "+should_download=true", config=path)
    with pytest.raises(PrepareDataError, match="Example datasets are never downloaded"):
        check_dataset_files(config, find_datasets_in_scope(config, gc))


# ----------------------------------------------------------------------------------------------- row validation


def test_invalid_rows_are_all_reported_with_dataset_file_and_line(ws, capsys):
    write_jsonl(
        ws / "data" / "qa_train.jsonl",
        [
            qa_row("ok", "1"),  # 1
            '{"responses_create_params": ',  # 2: not JSON
            "[1, 2]",  # 3: not an object
            {"expected_answer": "x"},  # 4: no responses_create_params
            {"responses_create_params": {"temperature": 1.0}, "expected_answer": "x"},  # 5: no input
            {"responses_create_params": {"input": "q"}},  # 6: verify model needs expected_answer
            qa_row("q", 42),  # 7: expected_answer must be a string
            {"responses_create_params": {"input": "q", "not_a_param": 1}, "expected_answer": "x"},  # 8
            "",  # 9: blank lines are skipped
            qa_row("fine again", "2"),  # 10
        ],
    )
    write_jsonl(ws / "data" / "qa_validation.jsonl", [qa_row("ok", "1"), {"responses_create_params": "nope"}])
    config, gc = load(ws, "+output_dirpath=out", "+mode=train_preparation")
    with pytest.raises(PrepareDataError) as info:
        prepare_data(config, gc)
    message = str(info.value)
    assert message.startswith("8 invalid line(s) in 2 of 2 dataset(s)")
    train = "dataset 'train' (type train, agent 'qa_agent')"
    expected_lines = [
        f"data/qa_train.jsonl:2: {train}: not valid JSON",
        f"data/qa_train.jsonl:3: {train}: a row must be a JSON object, got list",
        f"data/qa_train.jsonl:4: {train}: missing `responses_create_params`",
        f"data/qa_train.jsonl:5: {train}: `responses_create_params` has no `input`",
        f"data/qa_train.jsonl:6: {train}: does not fit QAVerifyRequest (resources_servers/qa_check/app.py, "
        "QACheckResourcesServer.verify): expected_answer: Field required",
        f"data/qa_train.jsonl:7: {train}: does not fit QAVerifyRequest",
        f"data/qa_train.jsonl:8: {train}: does not fit QAVerifyRequest",
        "data/qa_validation.jsonl:2: dataset 'validation' (type validation, agent 'qa_agent'): "
        "`responses_create_params` must be an object",
    ]
    for expected in expected_lines:
        assert expected in message, expected
    assert "expected_answer: Input should be a valid string (got 42)" in message
    assert "responses_create_params.not_a_param: Extra inputs are not permitted" in message
    for good in (":1:", ":9:", ":10:"):
        assert f"data/qa_train.jsonl{good}" not in message
    assert "nothing was written" in message
    assert not (ws / "out").exists()
    assert not (ws / "data" / "qa_train_metrics.json").exists()
    assert not (ws / "data" / "qa_train_prepare.jsonl").exists()

    # The command: exit 2, the same report on stderr.
    code = ng_prepare_data(["+config_paths=[configs/qa.yaml]", "+output_dirpath=out", "+mode=train_preparation"])
    assert code == 2
    err = capsys.readouterr().err
    assert "error: ng_prepare_data: 8 invalid line(s)" in err
    assert "data/qa_train.jsonl:7:" in err


def test_many_invalid_rows_are_capped_in_the_message_and_listed_in_a_report(ws):
    count = MAX_ERRORS_IN_MESSAGE + 5
    write_jsonl(ws / "data" / "qa_train.jsonl", ["not json"] * count)
    config, gc = load(ws, "+output_dirpath=out", "+mode=train_preparation")
    with pytest.raises(PrepareDataError) as info:
        prepare_data(config, gc)
    message = str(info.value)
    assert f"{count} invalid line(s)" in message
    assert "... and 5 more" in message
    report = (ws / "out" / ERROR_REPORT_FILENAME).read_text().splitlines()
    assert len(report) == count
    assert report[-1].startswith(f"data/qa_train.jsonl:{count}: ")


def test_verify_model_is_read_from_the_resources_server_module(ws):
    _, gc = load(ws, "+output_dirpath=out", "+mode=example_validation")
    verify = load_verify_request_model(gc, "qa_resources_server")
    assert verify.model.__name__ == "QAVerifyRequest"
    assert verify.warning is None
    assert verify.with_response
    assert set(verify.model.model_fields) >= {"responses_create_params", "response", "expected_answer"}
    # The server's sibling helper module is not left behind for other servers to pick up.
    assert "qa_helpers" not in sys.modules
    # A row validates together with a placeholder response; a row's own `response` is ignored.
    write_jsonl(ws / "data" / "qa_example.jsonl", [{**qa_row("q", "a"), "response": {"garbage": True}}])
    config, gc = load(ws, "+output_dirpath=out", "+mode=example_validation")
    assert set(prepare_data(config, gc)) == {"example"}


def test_unimportable_resources_server_falls_back_to_base_run_request(ws, capsys):
    datasets = "        - {name: ex, type: example, jsonl_fpath: data/dep_example.jsonl}"
    path = write_config(ws, agent_yaml("dep_agent", datasets, resources="dep_server", impl="needs_missing_dep"))
    # Rows without `must_have` (which the server's own model would require) pass BaseRunRequest.
    write_jsonl(ws / "data" / "dep_example.jsonl", [{"responses_create_params": {"input": "hi"}}])
    config, gc = load(ws, "+output_dirpath=out", "+mode=example_validation", config=path)
    verify = load_verify_request_model(gc, "dep_server")
    assert verify.model is BaseRunRequest
    assert "cannot import resources_servers/needs_missing_dep/app.py in this interpreter" in verify.warning
    assert "ModuleNotFoundError" in verify.warning
    capsys.readouterr()
    prepare_data(config, gc)
    assert "warning: cannot import resources_servers/needs_missing_dep/app.py" in capsys.readouterr().err
    # The fallback still checks responses_create_params strictly.
    write_jsonl(ws / "data" / "dep_example.jsonl", [{"responses_create_params": {"input": "hi", "bogus": 1}}])
    with pytest.raises(PrepareDataError, match=r"dep_example.jsonl:1: .*BaseRunRequest.*bogus"):
        prepare_data(config, gc)


def test_agent_without_resources_server_uses_base_run_request(ws):
    path = write_config(
        ws,
        """
lone_agent:
  responses_api_agents:
    simple_agent:
      entrypoint: app.py
      datasets:
        - {name: ex, type: example, jsonl_fpath: data/lone.jsonl}
""",
    )
    write_jsonl(ws / "data" / "lone.jsonl", [{"responses_create_params": {"input": "hi"}}])
    config, gc = load(ws, "+output_dirpath=out", "+mode=example_validation", config=path)
    assert find_datasets_in_scope(config, gc)[0].resources_server_name is None
    assert load_verify_request_model(gc, None).model is BaseRunRequest
    assert prepare_data(config, gc) == {"example": ws / "out" / "example.jsonl"}


# ----------------------------------------------------------------------------------------------- metrics

HAND_ROWS = [
    {
        "responses_create_params": {
            "input": [{"role": "user", "content": "hello world"}],
            "tools": [{"type": "function", "name": "a"}, {"type": "function", "name": "b"}],
            "temperature": 0.5,
        },
        "score": 1,
        "ok": True,
        "label": "x",
        "vals": [1, 2],
        "meta": {"k": 1},
    },
    {
        "responses_create_params": {"input": "just a prompt", "temperature": 1.0},
        "score": 2.5,
        "ok": False,
        "label": "y",
        "vals": [3],
        "tags": ["p", "q", "p"],
        "mixed": "three",
    },
    {
        "responses_create_params": {
            "input": [
                {"role": "system", "content": "be brief"},
                {"role": "user", "content": "q1"},
                {"role": "assistant", "content": "a1"},
                {"role": "user", "content": "q2"},
            ],
            "tools": [],
        },
        "score": None,
        "ok": True,
        "label": "x",
        "vals": [],
        "mixed": 3,
    },
]

# Worked by hand (sample standard deviation; 2 decimals when |x| >= 1, else 3):
#  tools: only row 1 has any (2); words of json.dumps(responses_create_params): 17, 6, 20;
#  turns (user messages; a string input is one): 1, 1, 2; temperature: 0.5, 1.0;
#  score: 1, 2.5 (null skipped); ok: 1, 0, 1; vals: 1, 2, 3; label: x, y, x; tags: p, q, p;
#  mixed: one number (3) and one string; meta is an object and is not measured.
HAND_METRICS = {
    "Number of examples": 3,
    "Number of tools": {"Total # non-null values": 1, "Average": 2.0, "Min": 2.0, "Max": 2.0, "Standard deviation": 0.0},
    "Json-dumped number of words (proxy for token count)": {
        "Total # non-null values": 3,
        "Average": 14.33,  # 43 / 3
        "Min": 6.0,
        "Max": 20.0,
        "Standard deviation": 7.37,  # sqrt(108.667 / 2)
    },
    "Number of turns": {
        "Total # non-null values": 3,
        "Average": 1.33,
        "Min": 1.0,
        "Max": 2.0,
        "Standard deviation": 0.577,
    },
    "Temperature": {"Total # non-null values": 2, "Average": 0.75, "Min": 0.5, "Max": 1.0, "Standard deviation": 0.354},
    "score": {"Total # non-null values": 2, "Average": 1.75, "Min": 1.0, "Max": 2.5, "Standard deviation": 1.06},
    "ok": {"Total # non-null values": 3, "Average": 0.667, "Min": 0.0, "Max": 1.0, "Standard deviation": 0.577},
    "label": {"unique_count": 2, "total_count": 3},
    "vals": {"Total # non-null values": 3, "Average": 2.0, "Min": 1.0, "Max": 3.0, "Standard deviation": 1.0},
    "tags": {"unique_count": 2, "total_count": 3},
    "mixed": {
        "Total # non-null values": 1,
        "Average": 3.0,
        "Min": 3.0,
        "Max": 3.0,
        "Standard deviation": 0.0,
        "unique_count": 1,
        "total_count": 1,
    },
}


def test_metrics_on_a_hand_computed_example():
    assert [len(json.dumps(r["responses_create_params"]).split()) for r in HAND_ROWS] == [17, 6, 20]
    acc = DatasetMetricsAccumulator()
    for row in HAND_ROWS:
        acc.add_row(row)
    metrics = acc.to_dict()
    assert metrics == HAND_METRICS
    assert list(metrics) == list(HAND_METRICS)  # built-ins first, then fields in first-seen order


def test_metrics_file_for_a_dataset_has_config_fields_then_aggregates(ws):
    path = write_config(
        ws,
        agent_yaml(
            "hand_agent",
            "        - {name: hand, type: train, jsonl_fpath: data/hand.jsonl, license: MIT, num_repeats: 3}",
        ),
    )
    rows = [{**row, "expected_answer": "e"} for row in HAND_ROWS]
    write_jsonl(ws / "data" / "hand.jsonl", rows)
    config, gc = load(ws, "+output_dirpath=out", "+mode=train_preparation", config=path)
    prepare_data(config, gc)
    written = json.loads((ws / "data" / "hand_metrics.json").read_text())
    expected_head = {
        "name": "hand",
        "type": "train",
        "jsonl_fpath": "data/hand.jsonl",
        "num_repeats": 3,
        "gitlab_identifier": None,
        "huggingface_identifier": None,
        "license": "MIT",
    }
    assert list(written)[:8] == [*expected_head, "Number of examples"]
    assert {k: written[k] for k in expected_head} == expected_head
    body = {k: v for k, v in written.items() if k not in expected_head}
    assert body == {**HAND_METRICS, "expected_answer": {"unique_count": 1, "total_count": 3}}
    # Repeats don't change the metrics (they describe the data), only the prepared file.
    assert body["Number of examples"] == 3
    assert len(read_jsonl(ws / "data" / "hand_prepare.jsonl")) == 9


def test_empty_aggregates_and_single_values():
    assert NumericAggregate().to_dict() == {
        "Total # non-null values": 0,
        "Average": 0.0,
        "Min": 0.0,
        "Max": 0.0,
        "Standard deviation": 0.0,
    }
    one = NumericAggregate()
    one.add(7)
    assert one.to_dict()["Standard deviation"] == 0.0
    acc = DatasetMetricsAccumulator()
    acc.add_row({"responses_create_params": {"input": [{"role": "system", "content": "s"}]}, "x": None, "f": float("nan")})
    metrics = acc.to_dict()
    assert metrics["Number of turns"]["Total # non-null values"] == 0  # no user message
    assert "x" not in metrics and "f" not in metrics


def test_rounding():
    assert round_metric(1234.5678) == 1234.57
    assert round_metric(1.0049) == 1.0
    assert round_metric(-3.14159) == -3.14
    assert round_metric(0.12345) == 0.123
    assert round_metric(-0.98765) == -0.988
    assert round_metric(0.0) == 0.0
    assert round_metric(5) == 5.0 and isinstance(round_metric(5), float)


def test_merged_aggregates_equal_one_stream():
    values_a = [1.5, 2.0, 10.0, -3.0]
    values_b = [4.0, 4.0, 100.25]
    single, a, b = NumericAggregate(), NumericAggregate(), NumericAggregate()
    for v in values_a + values_b:
        single.add(v)
    for v in values_a:
        a.add(v)
    for v in values_b:
        b.add(v)
    a.merge(b)
    assert a.count == single.count and a.min == single.min and a.max == single.max
    assert a.mean == pytest.approx(single.mean) and a.std == pytest.approx(single.std)

    first, second, whole = DatasetMetricsAccumulator(), DatasetMetricsAccumulator(), DatasetMetricsAccumulator()
    for row in HAND_ROWS[:2]:
        first.add_row(row)
        whole.add_row(row)
    second.add_row(HAND_ROWS[2])
    whole.add_row(HAND_ROWS[2])
    first.merge(second)
    assert first.to_dict() == whole.to_dict() == HAND_METRICS


# ----------------------------------------------------------------------------------------------- conflicts


def test_compare_metrics_tolerance_lists_and_nulls():
    assert compare_metrics({"a": 80.47}, {"a": 80.474}) == []  # |x| >= 1: 5e-3
    assert compare_metrics({"a": 80.47}, {"a": 80.475}) == []
    assert compare_metrics({"a": 80.47}, {"a": 80.48}) == ["a: 80.47 != 80.48"]
    assert compare_metrics({"a": 0.123}, {"a": 0.1234}) == []  # |x| < 1: 5e-4
    assert compare_metrics({"a": 0.123}, {"a": 0.124}) == ["a: 0.123 != 0.124"]
    assert compare_metrics({"n": 5}, {"n": 5.0}) == []
    assert compare_metrics({"n": 5}, {"n": 6}) != []
    assert compare_metrics({"b": True}, {"b": 1}) != []
    assert compare_metrics({"s": "x"}, {"s": "y"}) == ["s: 'x' != 'y'"]
    assert compare_metrics({"l": [1, "a", {"k": 2.0}]}, {"l": [{"k": 2.001}, "a", 1]}) == []
    assert compare_metrics({"l": [1, 1, 2]}, {"l": [1, 2, 2]}) != []
    assert compare_metrics({"old": None}, {}) == [] and compare_metrics({}, {"new": None}) == []
    assert compare_metrics({"x": {"deep": 1.0}}, {"x": {"deep": 2.0}}) == ["x.deep: 1.0 != 2.0"]
    assert compare_metrics({}, {"new": 1}) == ["new: None != 1"]


def _edit_json(path: Path, edit) -> None:
    data = json.loads(path.read_text())
    edit(data)
    path.write_text(json.dumps(data, indent=4) + "\n")


def test_conflicts_within_tolerance_beyond_and_overwrite(ws):
    args = ("+output_dirpath=out", "+mode=train_preparation")
    config, gc = load(ws, *args)
    prepare_data(config, gc)
    metrics_path = ws / "data" / "qa_train_metrics.json"
    conflict_path = ws / "data" / "qa_train_metrics_conflict.json"
    original = json.loads(metrics_path.read_text())
    words = "Json-dumped number of words (proxy for token count)"
    assert original["difficulty"]["Standard deviation"] == 0.707

    # Within tolerance: no conflict, the existing file is left as it is.
    _edit_json(metrics_path, lambda d: d["difficulty"].update({"Standard deviation": 0.7072}))
    _edit_json(ws / "out" / "train_metrics.json", lambda d: d[words].update({"Average": 7.004}))
    before = metrics_path.read_text()
    prepare_data(config, gc)
    assert metrics_path.read_text() == before
    assert not conflict_path.exists()

    # Beyond tolerance: conflict file with the new metrics, an error naming the difference, nothing else written.
    _edit_json(metrics_path, lambda d: d["difficulty"].update({"Average": 1.6}))
    (ws / "data" / "qa_train_prepare.jsonl").unlink()
    with pytest.raises(PrepareDataError) as info:
        prepare_data(config, gc)
    message = str(info.value)
    assert "1 metrics file(s) differ" in message
    assert f"{metrics_path} differs; new metrics written to {conflict_path}" in message
    assert "difficulty.Average: 1.6 != 1.5" in message
    assert "+overwrite_metrics_conflicts=true" in message
    assert json.loads(conflict_path.read_text()) == original
    assert json.loads(metrics_path.read_text())["difficulty"]["Average"] == 1.6
    assert not (ws / "data" / "qa_train_prepare.jsonl").exists()

    # The command exits 2 on a conflict.
    assert ng_prepare_data(["+config_paths=[configs/qa.yaml]", *args]) == 2

    # Overwrite: the new metrics replace the old, the stale conflict file goes away, outputs are written.
    config, gc = load(ws, *args, "+overwrite_metrics_conflicts=true")
    prepare_data(config, gc)
    assert json.loads(metrics_path.read_text()) == original
    assert not conflict_path.exists()
    assert (ws / "data" / "qa_train_prepare.jsonl").exists()


def test_collated_metrics_conflict_is_detected_too(ws):
    config, gc = load(ws, "+output_dirpath=out", "+mode=example_validation")
    prepare_data(config, gc)
    _edit_json(ws / "out" / "example_metrics.json", lambda d: d.update({"Number of examples": 4}))
    with pytest.raises(PrepareDataError, match=r"(?s)collated example metrics.*Number of examples: 4 != 5"):
        prepare_data(config, gc)
    assert json.loads((ws / "out" / "example_metrics_conflict.json").read_text())["Number of examples"] == 5


# ----------------------------------------------------------------------------------------------- outputs


def test_num_repeats_expansion_and_agent_ref_injection(ws):
    write_jsonl(
        ws / "data" / "qa_train.jsonl",
        [
            json.dumps(qa_row("a?", "A")) + "  \t",  # trailing whitespace is fine
            {**qa_row("b?", "B"), "agent_ref": {"type": "responses_api_agents", "name": "elsewhere"}},  # replaced
        ],
    )
    config, gc = load(ws, "+output_dirpath=out", "+mode=train_preparation")
    paths = prepare_data(config, gc)
    assert paths == {"train": ws / "out" / "train.jsonl", "validation": ws / "out" / "validation.jsonl"}
    prepared = read_jsonl(ws / "data" / "qa_train_prepare.jsonl")
    assert [r["expected_answer"] for r in prepared] == ["A", "A", "B", "B"]  # num_repeats: 2, pattern aabb
    assert all(r["agent_ref"] == AGENT_REF for r in prepared)
    assert prepared[0] == {**qa_row("a?", "A"), "agent_ref": AGENT_REF}
    assert read_jsonl(paths["train"]) == prepared
    assert read_jsonl(paths["validation"]) == [{**qa_row("What is 9-3?", "6", difficulty=1), "agent_ref": AGENT_REF}]


def test_collation_of_two_datasets_in_example_validation_mode(ws):
    config, gc = load(ws, "+output_dirpath=out", "+mode=example_validation")
    paths = prepare_data(config, gc)
    assert paths == {"example": ws / "out" / "example.jsonl"}
    collated = read_jsonl(paths["example"])
    assert [r["expected_answer"] for r in collated] == ["4", "Paris", "blue", "6", "Pacific"]
    assert [r["agent_ref"]["name"] for r in collated] == ["qa_agent"] * 3 + ["qa_examples_only_agent"] * 2

    # Per dataset: example_metrics.json-style files next to the data (what ng_test's data check reads).
    example_metrics = json.loads((ws / "data" / "qa_example_metrics.json").read_text())
    assert example_metrics["Number of examples"] == 3
    assert example_metrics["type"] == "example" and example_metrics["license"] is None
    more = json.loads((ws / "data" / "qa_more_examples_metrics.json").read_text())
    assert more["Number of examples"] == 2 and more["name"] == "more_examples"
    assert not list((ws / "data").glob("*conflict*"))

    # Collated metrics: aggregates over both files, prefixed with the first dataset's config fields.
    collated_metrics = json.loads((ws / "out" / "example_metrics.json").read_text())
    assert collated_metrics["name"] == "example" and collated_metrics["jsonl_fpath"] == "data/qa_example.jsonl"
    assert collated_metrics["Number of examples"] == 5
    assert collated_metrics["expected_answer"] == {"unique_count": 5, "total_count": 5}
    assert collated_metrics["Number of turns"]["Total # non-null values"] == 5
    whole = DatasetMetricsAccumulator()
    for row in read_jsonl(ws / "data" / "qa_example.jsonl") + read_jsonl(ws / "data" / "qa_more_examples.jsonl"):
        whole.add_row(row)
    assert {k: v for k, v in collated_metrics.items() if k in whole.to_dict()} == whole.to_dict()
    # train/validation outputs are not written in this mode.
    assert not (ws / "out" / "train.jsonl").exists()


def test_ng_prepare_data_end_to_end(ws, capsys):
    code = ng_prepare_data(["+config_paths=[configs/qa.yaml]", "+output_dirpath=prepared", "+mode=train_preparation"])
    assert code == 0
    out = capsys.readouterr().out
    assert "dataset 'train' (type train, agent 'qa_agent'): 2 row(s) valid, 4 prepared (x2)" in out
    assert sorted(p.name for p in (ws / "prepared").iterdir()) == [
        "train.jsonl",
        "train_metrics.json",
        "validation.jsonl",
        "validation_metrics.json",
    ]
    assert len(read_jsonl(ws / "prepared" / "train.jsonl")) == 4
    # The example-only agent's data was left alone (A.9).
    assert not (ws / "data" / "qa_more_examples_prepare.jsonl").exists()
    # Running again on unchanged data is a no-op for metrics (no conflicts).
    assert ng_prepare_data(["+config_paths=[configs/qa.yaml]", "+output_dirpath=prepared", "+mode=train_preparation"]) == 0


def test_file_shared_by_two_agents_gets_per_agent_side_outputs(ws):
    datasets = "        - {name: ex, type: example, jsonl_fpath: data/qa_example.jsonl}"
    text = agent_yaml("first_agent", datasets)
    text += f"""second_agent:
  responses_api_agents:
    simple_agent:
      entrypoint: app.py
      resources_server: {{type: resources_servers, name: qa_resources_server}}
      datasets:
{datasets}
"""
    path = write_config(ws, text)
    config, gc = load(ws, "+output_dirpath=out", "+mode=example_validation", config=path)
    prepare_data(config, gc)
    for agent in ("first_agent", "second_agent"):
        rows = read_jsonl(ws / "data" / f"qa_example_{agent}_prepare.jsonl")
        assert {r["agent_ref"]["name"] for r in rows} == {agent}
        assert json.loads((ws / "data" / f"qa_example_{agent}_metrics.json").read_text())["Number of examples"] == 3
    assert len(read_jsonl(ws / "out" / "example.jsonl")) == 6


def test_collated_output_may_not_overwrite_an_input(ws):
    path = write_config(
        ws, agent_yaml("a", "        - {name: ex, type: example, jsonl_fpath: data/example.jsonl}")
    )
    shutil.copy(ws / "data" / "qa_example.jsonl", ws / "data" / "example.jsonl")
    config, gc = load(ws, "+output_dirpath=data", "+mode=example_validation", config=path)
    with pytest.raises(NeMoGymConfigError, match="would overwrite an input dataset file"):
        prepare_data(config, gc)
