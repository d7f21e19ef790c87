"""In-process checks of the one-line error rules (docs/errors.md) that the subprocess cases of
tests/integration/test_bad_inputs.py do not pin down: warnings come after the error line, a message with several
problems names the first on its first line, and tolerant JSONL readers say where the first bad line is."""

from __future__ import annotations

from pathlib import Path

import pytest

from nemo_gym.cli.command import Command
from nemo_gym.config.types import BaseNeMoGymCLIConfig
from nemo_gym.errors import NeMoGymConfigError, NeMoGymStackError
from nemo_gym.rollouts.collection import InputProblem, InputValidationError, materialize_input_file
from nemo_gym.rollouts.jsonl import iter_jsonl_objects


class _Params(BaseNeMoGymCLIConfig):
    count: int = 1
    size: int = 1


def _command(run) -> Command:
    return Command(name="probe", verb="probe", summary="probe", model=_Params, run=run)


def test_warnings_written_while_the_config_is_built_come_after_the_error_line(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    # A server block without entrypoint next to a real one warns; a second, broken block makes the build fail.
    (tmp_path / "c.yaml").write_text(
        "a:\n  resources_servers:\n    x:\n      domain: agent\n"
        "b:\n  resources_servers:\n    mcqa:\n      entrypoint: app.py\n      domain: agent\n"
        "c:\n  resources_servers:\n    mcqa:\n      entrypoint: app.py\n      domain: agent\n      port: abc\n"
    )
    code = _command(lambda config: 0).main(["+config_paths=[c.yaml]"])
    err = capsys.readouterr().err.splitlines()
    assert code == 2
    assert err[0].startswith("error: ng_probe: Found 1 almost-server(s) with validation errors. Server `c`: ")
    assert "port" in err[0] and "(got 'abc')" in err[0]
    assert any("`a.resources_servers.x` has no `entrypoint`" in line for line in err[1:])
    # The almost-server banner is not repeated after an error that already holds its content.
    assert not any("Configuration Warnings: Almost-Servers Detected" in line for line in err)


def test_a_stack_error_is_one_line_with_exit_code_1(capsys):
    def run(config):
        raise NeMoGymStackError("Could not reach the NeMo Gym head server at 127.0.0.1:1.")

    assert _command(run).main([]) == 1
    assert capsys.readouterr().err == "error: ng_probe: Could not reach the NeMo Gym head server at 127.0.0.1:1.\n"


def test_several_invalid_parameters_name_the_first_on_the_first_line():
    with pytest.raises(NeMoGymConfigError) as info:
        _Params.from_global_config({"count": "abc", "size": "x"})
    first, *rest = str(info.value).splitlines()
    assert first.startswith("invalid parameter `+count`:") and "(and 1 more problem(s), listed below)" in first
    assert any("`+size`" in line for line in rest)


def test_input_problems_put_the_first_file_line_first():
    one = InputValidationError([InputProblem("in.jsonl", 3, "invalid JSON")])
    assert str(one) == "in.jsonl:3: invalid JSON (no rollout was started; fix or remove the line and rerun)"
    many = InputValidationError([InputProblem("in.jsonl", 3, "a"), InputProblem("in.jsonl", 7, "b")], total=5)
    lines = str(many).splitlines()
    assert lines[0].startswith("in.jsonl:3: a (and 4 more problem(s)")
    assert lines[1:] == ["  in.jsonl:7: b", "  ... and 3 more"]


def test_empty_input_is_refused_and_an_earlier_materialized_file_is_kept(tmp_path):
    src = tmp_path / "in.jsonl"
    src.write_text("\n  \n")
    out = tmp_path / "out_materialized_inputs.jsonl"
    out.write_text("earlier\n")
    with pytest.raises(NeMoGymConfigError, match=r"in\.jsonl has no rows"):
        materialize_input_file(src, out, agent_name="a", validate_params=False)
    assert out.read_text() == "earlier\n"
    assert not list(tmp_path.glob("*.tmp*"))


def test_tolerant_jsonl_reader_says_where_the_bad_lines_are(tmp_path: Path):
    path = tmp_path / "rows.jsonl"
    path.write_text('{"a": 1}\n{torn\n\n[1]\n{"b": 2}\n')
    bad: list[str] = []
    rows = list(iter_jsonl_objects(path, lambda: None, bad.append))
    assert rows == [{"a": 1}, {"b": 2}]
    assert bad == [f"{path}:2: not valid JSON", f"{path}:4: a JSON list, not an object"]
    # The two-argument form of the reference keeps working.
    count = []
    assert len(list(iter_jsonl_objects(path, lambda: count.append(1)))) == 2 and len(count) == 2


def test_a_port_out_of_range_is_a_config_error_not_a_traceback():
    from nemo_gym.config.global_config import parse_global_config

    with pytest.raises(NeMoGymConfigError, match=r"`head_server\.port` must be a port number from 0 to 65535"):
        parse_global_config(["+head_server.port=70000"], allocate_ports=False, load_env_yaml=False)
