"""One bad line, four commands, one policy (`nemo_gym.rollouts.jsonl`): `ng export`, `ng reverify`, `ng merge` and
`ng view` run as child processes, as a user runs them, on the same rollouts file, collected by a real stack
(`ng_run` with openai_model in front of the scripted fake LLM, simple_agent and the answer checker of
tests/fixtures/stack) and then given a broken line.

- default: exit 2, the first line of stderr names the bad line as file:line with the parse error and says what to
  do (fix or delete it, or --skip-bad-lines), and no output file exists (an earlier one is left as it was);
- `--skip-bad-lines`: exit 0, the output holds every good row, stderr names the skipped line (ng view: the page's
  status counts it);
- an export that keeps no row (every rollout dropped): exit 1, the reason, and no file, JSONL or Parquet.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from nemo_gym.testing.stack import ChildProcess
from tests.conftest import FIXTURE_STACK, free_port
from tests.integration.answer_stack import collected_answers, read_jsonl

NG = [sys.executable, "-m", "nemo_gym.cli"]
ANSWERS = {"capital of Italy": ("Rome", "Rome"), "capital of France": ("Lyon", "Paris"), "say hi": ("hi", "hi")}
BAD_LINE_NO = 3
BAD_LINE = '{"_ng_task_index": 1, "_ng_rollout_index": 0, "reward": 1.0, "response": {"output": ['


@pytest.fixture(scope="module")
def collected(tmp_path_factory) -> Path:
    """Rollouts collected by a real stack (3 tasks x 2 repeats), the stack stopped again."""
    tmp = tmp_path_factory.mktemp("bad_lines")
    with collected_answers(tmp, ANSWERS) as (rollouts, _):
        pass
    assert len(read_jsonl(rollouts)) == 6
    return rollouts


@pytest.fixture
def broken(collected, tmp_path) -> Path:
    """A copy of the collected rollouts (with its materialized inputs, which ng merge needs) with a broken line 3."""
    lines = collected.read_text().splitlines()
    lines.insert(BAD_LINE_NO - 1, BAD_LINE)
    path = tmp_path / "rollouts.jsonl"
    path.write_text("\n".join(lines) + "\n")
    shutil.copyfile(
        collected.with_name("rollouts_materialized_inputs.jsonl"), tmp_path / "rollouts_materialized_inputs.jsonl"
    )
    return path


def ng(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([*NG, *args], cwd=cwd, capture_output=True, text=True, timeout=300)


def batch_commands(path: Path, out: Path) -> dict[str, tuple[list[str], Path, Path]]:
    """command -> (arguments, working directory, the output file it would write)."""
    return {
        "export": (["export", "sft", str(path), "-o", str(out / "sft.parquet")], path.parent, out / "sft.parquet"),
        "merge": (["merge", str(path), "-o", str(out / "merged.jsonl")], path.parent, out / "merged.jsonl"),
        "reverify": (
            ["reverify", str(path), "-o", str(out / "reverified.jsonl"), "+config_paths=[configs/reverify.yaml]",
             "--no-progress-bar"],
            FIXTURE_STACK,
            out / "reverified.jsonl",
        ),  # fmt: skip
    }


def assert_names_the_bad_line(command: str, path: Path, err: str) -> None:
    first = err.splitlines()[0]
    assert first.startswith(f"error: ng_{command}: {path}:{BAD_LINE_NO}: not valid JSON ("), err
    assert "unexpected end of data" in first, err  # the parser's own words
    assert "1 bad line (a line that is not a JSON object)" in err, err
    assert "Fix or delete it, or pass --skip-bad-lines to skip it." in err, err


def test_a_bad_line_is_refused_by_all_four_commands_and_nothing_is_written(broken, tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    earlier = out / "merged.jsonl"
    earlier.write_text('{"an earlier merge": true}\n')
    for command, (args, cwd, output) in batch_commands(broken, out).items():
        done = ng(*args, cwd=cwd)
        assert done.returncode == 2, (command, done.stdout, done.stderr)
        assert_names_the_bad_line(command, broken, done.stderr)
        if output == earlier:
            assert earlier.read_text() == '{"an earlier merge": true}\n'  # a refused run destroys nothing
        else:
            assert not output.exists(), command
    assert sorted(p.name for p in out.iterdir()) == ["merged.jsonl"]  # no partial or temporary file either

    port = free_port()
    view = ChildProcess(
        [*NG, "view", str(broken), "--no-browser", "--port", str(port)],
        env={"NEMO_GYM_VIEW_CACHE": str(tmp_path / "cache")},
        name="ng view",
    )
    assert view.wait(timeout=120) == 2, view.output
    assert_names_the_bad_line("view", broken, view.output)
    assert "the viewer was not started" in view.output and "Viewer: http" not in view.output


def test_skip_bad_lines_keeps_every_good_row_and_names_the_skipped_line(broken, collected, tmp_path):
    good = read_jsonl(collected)
    out = tmp_path / "out"
    skipped = f"{broken}:{BAD_LINE_NO}: not valid JSON ("
    for command, (args, cwd, output) in batch_commands(broken, out).items():
        done = ng(*args, "--skip-bad-lines", cwd=cwd)
        assert done.returncode == 0, (command, done.stdout, done.stderr)
        assert f"warning: ng_{command}: skipped 1 bad line (--skip-bad-lines):\n  {skipped}" in done.stderr, command
        assert "skipped 1 bad line" in done.stdout, (command, done.stdout)  # in the command's summary too
        if output.suffix == ".parquet":
            import pyarrow.parquet as pq

            rows = pq.read_table(output).to_pylist()
        else:
            rows = read_jsonl(output)
        keys = sorted((r["_ng_task_index"], r["_ng_rollout_index"]) for r in rows)
        assert keys == sorted((r["_ng_task_index"], r["_ng_rollout_index"]) for r in good), command
    assert sorted(p.name for p in out.iterdir() if p.suffix in (".jsonl", ".parquet")) == [
        "merged.jsonl", "merged_materialized_inputs.jsonl", "merged_reward_profiling.jsonl", "reverified.jsonl",
        "sft.parquet",
    ]  # fmt: skip

    port = free_port()
    url = f"http://127.0.0.1:{port}/"
    with ChildProcess(
        [*NG, "view", str(broken), "--no-browser", "--port", str(port), "--skip-bad-lines"],
        env={"NEMO_GYM_VIEW_CACHE": str(tmp_path / "cache")},
        name="ng view",
    ) as view:
        view.wait_http_ok(url + "api/status", timeout=120)
        (status,) = httpx.get(url + "api/status").json()["files"]
        assert status["rollouts"] == len(good) and status["bad_lines"] == 1
        assert httpx.get(url + "api/rows", params={"limit": 100}).json()["total"] == len(good)
        assert f"warning: ng_view: skipped 1 bad line (--skip-bad-lines):\n  {skipped}" in view.output


@pytest.mark.parametrize("suffix", [".jsonl", ".parquet"])
def test_an_export_that_keeps_no_row_fails_and_writes_no_file(collected, tmp_path, suffix):
    output = tmp_path / f"dpo{suffix}"
    done = ng("export", "dpo", str(collected), "-o", str(output), "--min-margin", "2", cwd=tmp_path)
    assert done.returncode == 1, (done.stdout, done.stderr)
    assert "error: ng_export: no row kept: 6 dropped (6 margin_below_min); no file was written" in done.stderr
    assert "no file written" in done.stdout
    assert list(tmp_path.iterdir()) == []
