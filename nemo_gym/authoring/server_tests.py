"""`ng_test` and `ng_test_all`: run servers' own tests in their environment, and check resources servers' examples.

`ng_test +entrypoint=<type>/<name>` runs `python -m pytest` in the server folder with the server's interpreter:
the current one by default, the server's isolated uv venv (`nemo_gym.runtime.venvs`) when `venv_mode: isolated` is set
globally or in the server's block of its `configs/*.yaml` (the block wins). The exit code is pytest's. With
`+should_validate_data=true`, a resources server's example data is checked too (`validate_example_data`).

`ng_test_all` does the same for every server folder with a README.md under `resources_servers/`,
`responses_api_models/` and `responses_api_agents/` (of the current folder when it has any of them, else of the
install folder), one server after another, with data validation on for resources servers, and prints a table.

Decisions:
- Relative `+entrypoint` paths are looked up in the current folder first, then in the install folder.
- Tests run even when the example data is bad and the data is checked even when tests fail, so one run shows
  every problem. Exit code of `ng_test`: pytest's when it is not 0, else 1 when the data check failed, else 0.
- In an isolated venv without pytest (the server's requirements did not ask for it), pytest is installed into the
  venv with uv at the version this interpreter has; if that fails the message says to add it to requirements.txt.
- The data check of a server with an isolated venv runs in that venv (`python -m nemo_gym.authoring.server_tests
  --check-rows <dir>`), since the server's app may import libraries only that venv has.
- Data check rules (resources servers only): `data/example.jsonl` holds exactly 5 rows (non-blank lines); every
  row fits the verify request model of the server's `verify` (validated together with a placeholder `response`,
  as `ng_prepare_data` does: `nemo_gym.rollouts.data_prep`); a server whose verify model cannot be loaded fails;
  `data/example_metrics.json` exists with `"Number of examples": 5`; no `data/*conflict*` files.
  `data/example_rollouts.jsonl` is optional (the reference required it): checked when present (5 lines, each a
  JSON object with a numeric `reward`), a note when absent.
- `ng_test_all` captures each server's pytest output in a log file (a temporary folder, printed) and shows the
  tail of a failing one; `+show_output=true` streams it instead. Categories: passed, failed (pytest exit codes
  other than 0 and 5, or an environment that could not be built), missing tests (exit code 5: nothing
  collected), data validation failed (tests passed, data did not), not run (after a failure with
  `+fail_fast=true`, or Ctrl-C).
"""

from __future__ import annotations

import collections
import json
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping, Optional, TextIO

import yaml
from pydantic import Field, field_validator

from nemo_gym import PARENT_DIR
from nemo_gym.config.server_paths import server_folder_of
from nemo_gym.config.types import AGENT_SERVER_TYPE, SERVER_TYPES, BaseNeMoGymCLIConfig
from nemo_gym.errors import NeMoGymConfigError, closest_match

TEST_COMMAND = "ng_test"
TEST_ALL_COMMAND = "ng_test_all"
RESOURCES_SERVERS = "resources_servers"
EXAMPLE_ROWS = 5
EXAMPLE_JSONL = "data/example.jsonl"
EXAMPLE_METRICS = "data/example_metrics.json"
EXAMPLE_ROLLOUTS = "data/example_rollouts.jsonl"
MODEL_CONFIG = "responses_api_models/openai_model/configs/openai_model.yaml"
TAIL_LINES = 40

# pytest exit codes
PYTEST_OK = 0
PYTEST_NO_TESTS = 5
DATA_VALIDATION_EXIT = 1

PASSED = "passed"
FAILED = "failed"
MISSING_TESTS = "missing tests"
DATA_FAILED = "data validation failed"
NOT_RUN = "not run"
CATEGORIES = (PASSED, FAILED, MISSING_TESTS, DATA_FAILED, NOT_RUN)

Log = Callable[[str], None]


# --------------------------------------------------------------------------------------------------
# Parameters
# --------------------------------------------------------------------------------------------------


class TestConfig(BaseNeMoGymCLIConfig):
    """Run one server's tests (`python -m pytest` in its folder) in its environment: the current interpreter, or
    the server's isolated venv when `venv_mode: isolated` is set (globally or in the server's config block).
    Exits with pytest's exit code. With +should_validate_data=true, also checks a resources server's example
    data: 5 rows in data/example.jsonl, each valid for the server's verify request; data/example_metrics.json
    (written by ng_prepare_data +mode=example_validation) with 5 examples; no data/*conflict* files.

    Example: ng_test +entrypoint=resources_servers/mcqa +should_validate_data=true"""

    __test__ = False  # not a pytest test class

    entrypoint: str = Field(
        description="The server folder, e.g. resources_servers/mcqa (relative: current folder first, then the "
        "install folder)."
    )
    should_validate_data: bool = Field(
        default=False, description="Also check the example data of a resources server (see above)."
    )


def _name_list(value: Any) -> Optional[list[str]]:
    if value is None:
        return None
    if isinstance(value, str):
        value = [v for v in value.split(",")]
    return [str(v).strip().strip("/") for v in value if str(v).strip()]


class TestAllConfig(BaseNeMoGymCLIConfig):
    """Run the tests of every server folder that has a README.md under resources_servers/,
    responses_api_models/ and responses_api_agents/ (of the current folder when it has any of them, else of the
    install folder), one after another, with the example-data check on for resources servers. Prints a table of
    passed / failed / missing tests / data validation failed, and exits 1 if any server did not pass.

    Example: ng_test_all "+include=[mcqa,example_single_tool_call]" +fail_fast=true"""

    __test__ = False

    fail_on_total_and_test_mismatch: bool = Field(
        default=False,
        description="Fail when some server folders were not tested because they have no README.md.",
    )
    include: Optional[list[str]] = Field(
        default=None,
        description="Only these servers: folder names (mcqa) or type/name (resources_servers/mcqa).",
    )
    exclude: Optional[list[str]] = Field(default=None, description="Skip these servers (same forms as include).")
    fail_fast: bool = Field(default=False, description="Stop at the first server that does not pass.")
    show_output: bool = Field(
        default=False, description="Stream every server's pytest output (default: only the tail of failing ones)."
    )
    log_dir: Optional[str] = Field(
        default=None, description="Folder for each server's pytest log (default: a new temporary folder)."
    )

    @field_validator("include", "exclude", mode="before")
    @classmethod
    def normalize_names(cls, value: Any) -> Optional[list[str]]:
        return _name_list(value)


# --------------------------------------------------------------------------------------------------
# Finding a server and its config block
# --------------------------------------------------------------------------------------------------


def resolve_server_dir(entrypoint: str, cwd: Optional[Path] = None) -> Path:
    """The absolute server folder for `+entrypoint` (current folder first, then the install folder)."""
    cwd = Path(cwd) if cwd is not None else Path.cwd()
    text = str(entrypoint).strip()
    if not text:
        raise NeMoGymConfigError("+entrypoint is empty: pass a server folder, e.g. +entrypoint=resources_servers/mcqa.")
    found = server_folder_of(text, cwd, SERVER_TYPES)  # refuses `..` and folders outside the server roots
    if found is not None:
        return found
    path = Path(os.path.expanduser(text))
    candidates = [path] if path.is_absolute() else [cwd / path, PARENT_DIR / path]
    looked = ", ".join(str(c) for c in dict.fromkeys(candidates))
    hint = ""
    if len(path.parts) == 1:
        found = [f"{t}/{path}" for t in SERVER_TYPES for root in (cwd, PARENT_DIR) if (root / t / path).is_dir()]
        if found:
            hint = f" Did you mean +entrypoint={found[0]}?"
    raise NeMoGymConfigError(f"No server folder {text} (looked at {looked}).{hint}")


def server_label(server_dir: Path) -> str:
    """`resources_servers/mcqa` for a server folder (its type folder and name)."""
    return f"{server_dir.parent.name}/{server_dir.name}"


def server_config_blocks(server_dir: Path) -> list[tuple[Path, str, dict]]:
    """(file, server id, implementation dict) of every block in the server's configs/*.yaml that runs this folder."""
    server_type, impl = server_dir.parent.name, server_dir.name
    found: list[tuple[Path, str, dict]] = []
    configs = server_dir / "configs"
    if not configs.is_dir():
        return found
    for path in sorted([*configs.glob("*.yaml"), *configs.glob("*.yml")]):
        try:
            data = yaml.safe_load(path.read_text(encoding="utf-8"))
        except (OSError, yaml.YAMLError):
            continue  # a broken config is for ng_run to report; tests still run
        if not isinstance(data, dict):
            continue
        for server_id, block in data.items():
            if not isinstance(block, dict) or not isinstance(block.get(server_type), dict):
                continue
            impl_cfg = block[server_type].get(impl)
            if isinstance(impl_cfg, dict):
                found.append((path, str(server_id), impl_cfg))
    return found


def server_block(server_dir: Path) -> dict:
    """The implementation dict that decides how this server runs: the first block that sets `venv_mode`, else the
    first block, else `{}`."""
    blocks = server_config_blocks(server_dir)
    for _, _, cfg in blocks:
        if cfg.get("venv_mode"):
            return cfg
    return blocks[0][2] if blocks else {}


# --------------------------------------------------------------------------------------------------
# The interpreter and pytest
# --------------------------------------------------------------------------------------------------


class ServerEnvironmentError(RuntimeError):
    """The server's test environment could not be prepared (venv build, pytest install)."""


def _has_pytest(python: str) -> bool:
    try:
        return subprocess.run([python, "-c", "import pytest"], capture_output=True, timeout=120).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


def _install_pytest(python: str, global_config: Mapping, label: str, log: Log) -> None:
    from importlib import metadata

    from nemo_gym.runtime.venvs import find_uv

    try:
        spec = f"pytest=={metadata.version('pytest')}"
    except metadata.PackageNotFoundError:
        spec = "pytest"
    cache = global_config.get("uv_cache_dir") if global_config is not None else None
    env = dict(os.environ)
    env.pop("VIRTUAL_ENV", None)
    if cache:
        env["UV_CACHE_DIR"] = str(cache)
    command = [find_uv(), "pip", "install", "--python", python, spec]
    log(f"{label}: pytest is not installed in its isolated venv; installing {spec} ...")
    proc = subprocess.run(command, capture_output=True, text=True, env=env)
    if proc.returncode != 0:
        tail = "\n".join(f"    {line}" for line in (proc.stdout + proc.stderr).strip().splitlines()[-15:])
        raise ServerEnvironmentError(
            f"pytest is not installed in the isolated venv of {label} ({python}) and installing it failed:\n{tail}\n"
            f"  Add `pytest` to the server's requirements.txt (or require `nemo-gym[dev]`), or run with "
            f"+venv_mode=shared."
        )


def server_test_python(
    server_dir: Path, global_config: Mapping, block: Mapping, *, log: Log = print
) -> tuple[str, str]:
    """(python executable, venv mode) to run the server's tests with; builds or reuses its isolated venv."""
    from nemo_gym.runtime.venvs import VenvBuildError, ensure_server_venv

    label = server_label(server_dir)
    try:
        result = ensure_server_venv(server_dir, global_config, block, log=lambda m: log(f"{label}: {m}"))
    except VenvBuildError as exc:
        raise ServerEnvironmentError(str(exc)) from None
    if result.mode == "isolated" and not _has_pytest(result.python):
        _install_pytest(result.python, global_config, label, log)
    return result.python, result.mode



def pytest_command(python: str) -> list[str]:
    return [python, "-m", "pytest"]


def rerun_hint(server_dir: Path, python: str) -> str:
    return f"cd {shlex.quote(str(server_dir))} && {' '.join(shlex.quote(a) for a in pytest_command(python))}"


def run_pytest(
    python: str, server_dir: Path, *, echo: Optional[TextIO], log_file: Optional[TextIO] = None
) -> tuple[int, list[str]]:
    """Run pytest in the server folder. Output lines go to `echo` (live) and `log_file`; returns the exit code and
    the last lines of output."""
    tail: collections.deque[str] = collections.deque(maxlen=TAIL_LINES)
    env = dict(os.environ)
    env.setdefault("PYTHONUNBUFFERED", "1")
    for key in ("NEMO_GYM_CONFIG_DICT", "NEMO_GYM_CONFIG_PATH", "NEMO_GYM_LISTEN_FD"):
        env.pop(key, None)  # never leak a server child's identity into the tests
    proc = subprocess.Popen(
        pytest_command(python),
        cwd=str(server_dir),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        errors="replace",
        env=env,
    )
    assert proc.stdout is not None
    try:
        for line in proc.stdout:
            tail.append(line.rstrip("\n"))
            if echo is not None:
                echo.write(line)
                echo.flush()
            if log_file is not None:
                log_file.write(line)
    except BaseException:  # Ctrl-C: stop the tests too
        proc.kill()
        proc.wait()
        raise
    return proc.wait(), list(tail)


# --------------------------------------------------------------------------------------------------
# The example data check
# --------------------------------------------------------------------------------------------------


@dataclass
class DataCheck:
    """Outcome of `validate_example_data`: `problems` fail the check; `notes` and `ok` are informational."""

    problems: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    ok: list[str] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        return not self.problems


def _rel(path: Path, server_dir: Path) -> str:
    """A path as `resources_servers/<name>/...` (how configs and commands name it)."""
    try:
        return str(path.relative_to(server_dir.parent.parent))
    except ValueError:
        return str(path)


def _rows(path: Path) -> list[tuple[int, str]]:
    with path.open("r", encoding="utf-8", errors="surrogateescape") as handle:
        return [(n, line) for n, line in enumerate(handle, start=1) if line.strip()]


def example_config_file(server_dir: Path) -> str:
    """The config (relative to the folder holding resources_servers/) that lists the example dataset."""
    want = f"{server_dir.name}/{EXAMPLE_JSONL}"
    configs = server_dir / "configs"
    candidates = sorted(configs.glob("*.yaml")) if configs.is_dir() else []
    for path in candidates:
        try:
            if want in path.read_text(encoding="utf-8"):
                return _rel(path, server_dir)
        except OSError:
            continue
    if candidates:
        return _rel(candidates[0], server_dir)
    return f"{server_label(server_dir)}/configs/{server_dir.name}.yaml"


def prepare_data_command(server_dir: Path, cwd: Optional[Path] = None) -> str:
    """The exact command that writes data/example_metrics.json for this server."""
    root = server_dir.parent.parent
    command = (
        f'ng_prepare_data "+config_paths=[{example_config_file(server_dir)},{MODEL_CONFIG}]" '
        f"+output_dirpath=results/example_validation/{server_dir.name} +mode=example_validation"
    )
    cwd = Path(cwd) if cwd is not None else Path.cwd()
    if os.path.abspath(cwd) != os.path.abspath(root):
        command = f"cd {shlex.quote(str(root))} && {command}"
    return command


def example_agent_name(server_dir: Path) -> str:
    """The agent block of the server's example config (the first `responses_api_agents` block), else the
    scaffold's `<name>_simple_agent`."""
    import yaml

    config = Path(server_dir).parent.parent / example_config_file(server_dir)
    try:
        blocks = yaml.safe_load(config.read_text(encoding="utf-8")) or {}
    except (OSError, yaml.YAMLError):
        blocks = {}
    for key, block in blocks.items() if isinstance(blocks, dict) else ():
        if isinstance(block, dict) and AGENT_SERVER_TYPE in block:
            return str(key)
    return f"{server_dir.name}_simple_agent"


def collect_rollouts_command(server_dir: Path) -> str:
    return (
        f'ng_run "+config_paths=[{example_config_file(server_dir)},{MODEL_CONFIG}]" with your model, then '
        f"ng_collect_rollouts +agent_name={example_agent_name(server_dir)} +input_jsonl_fpath={server_label(server_dir)}/"
        f"{EXAMPLE_JSONL} +output_jsonl_fpath={server_label(server_dir)}/{EXAMPLE_ROLLOUTS}"
    )


def check_example_rows(server_dir: Path) -> dict:
    """Validate data/example.jsonl against the server's verify request model, in this interpreter.

    Returns `{"rows": n, "model": description, "model_problem": str | None, "row_problems": [[line, reason]]}`."""
    from omegaconf import OmegaConf

    from nemo_gym.rollouts.data_prep import _check_row, load_verify_request_model

    server_dir = Path(server_dir)
    rows = _rows(server_dir / EXAMPLE_JSONL)
    # A one-server config naming this folder, so the loader imports its entrypoint (looked up under `root`).
    block = server_block(server_dir)
    entrypoint = str(block.get("entrypoint") or "app.py")
    server_id = f"{server_dir.name}_resources_server"
    impl = {"entrypoint": entrypoint, "domain": "other"}
    cfg = OmegaConf.create({server_id: {RESOURCES_SERVERS: {server_dir.name: impl}}})
    verify = load_verify_request_model(cfg, server_id, cwd=server_dir.parent.parent)
    problems = []
    for number, line in rows:
        _, reason = _check_row(line, verify)
        if reason is not None:
            problems.append([number, reason])
    return {"rows": len(rows), "model": verify.description, "model_problem": verify.warning, "row_problems": problems}


def _check_rows_in(python: str, server_dir: Path) -> dict:
    """`check_example_rows` in another interpreter (the server's isolated venv)."""
    proc = subprocess.run(
        [python, "-m", "nemo_gym.authoring.server_tests", "--check-rows", str(server_dir)],
        capture_output=True,
        text=True,
        cwd=str(server_dir),
    )
    lines = proc.stdout.strip().splitlines()
    if proc.returncode != 0 or not lines:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-10:]
        raise ServerEnvironmentError(
            f"checking the example rows with {python} failed (exit {proc.returncode}):\n"
            + "\n".join(f"    {line}" for line in tail)
        )
    return json.loads(lines[-1])


def validate_example_data(server_dir: Path, *, python: Optional[str] = None, cwd: Optional[Path] = None) -> DataCheck:
    """Check a resources server's example data. `python`: check the rows with that interpreter (an isolated venv)
    instead of this one."""
    server_dir = Path(server_dir)
    check = DataCheck()
    label = server_label(server_dir)
    example = server_dir / EXAMPLE_JSONL
    metrics = server_dir / EXAMPLE_METRICS
    example_rel = _rel(example, server_dir)

    # 1 + 2: the rows.
    if not example.is_file():
        check.problems.append(
            f"{example_rel} is missing. Write {EXAMPLE_ROWS} example rows (one JSON object per line, with "
            f"`responses_create_params` and the fields the verify request needs) and list the file as the `example` "
            f"dataset of the server's agent in {example_config_file(server_dir)}."
        )
    else:
        try:
            result = check_example_rows(server_dir) if python is None else _check_rows_in(python, server_dir)
        except ServerEnvironmentError as exc:
            check.problems.append(f"{label}: {exc}")
            result = None
        if result is not None:
            if result["rows"] != EXAMPLE_ROWS:
                check.problems.append(
                    f"{example_rel}: {result['rows']} row(s); an example dataset has exactly {EXAMPLE_ROWS}. "
                    f"{'Add' if result['rows'] < EXAMPLE_ROWS else 'Remove'} rows, then rerun ng_prepare_data."
                )
            if result["model_problem"]:
                check.problems.append(
                    f"{label}: cannot check the rows against the server's verify request: {result['model_problem']}"
                )
            for number, reason in result["row_problems"]:
                check.problems.append(f"{example_rel} line {number}: {reason}. Fix the row.")
            if not result["row_problems"] and not result["model_problem"]:
                check.ok.append(f"{result['rows']} row(s) in {example_rel}, each valid for {result['model']}")

    # 3: the metrics written by ng_prepare_data.
    metrics_rel = _rel(metrics, server_dir)
    if not metrics.is_file():
        check.problems.append(
            f"{metrics_rel} is missing. Create it with: {prepare_data_command(server_dir, cwd)}"
        )
    else:
        try:
            document = json.loads(metrics.read_text(encoding="utf-8"))
            count = document.get("Number of examples") if isinstance(document, dict) else None
        except (OSError, json.JSONDecodeError) as exc:
            document, count = None, None
            check.problems.append(
                f"{metrics_rel} is not valid JSON ({exc}). Delete it and recreate it with: "
                f"{prepare_data_command(server_dir, cwd)}"
            )
        if document is not None and count != EXAMPLE_ROWS:
            check.problems.append(
                f'{metrics_rel} says "Number of examples": {json.dumps(count)}, expected {EXAMPLE_ROWS}. Fix '
                f"{example_rel}, then recreate the metrics with: {prepare_data_command(server_dir, cwd)}"
                " +overwrite_metrics_conflicts=true"
            )
        elif document is not None:
            check.ok.append(f'{metrics_rel} has "Number of examples": {EXAMPLE_ROWS}')

    # 4: conflicts left by ng_prepare_data.
    data_dir = server_dir / "data"
    conflicts = sorted(data_dir.glob("*conflict*")) if data_dir.is_dir() else []
    for path in conflicts:
        check.problems.append(
            f"{_rel(path, server_dir)}: ng_prepare_data found that the data no longer matches the committed metrics "
            f"and wrote the new ones here. Compare the two; if the data changed on purpose, run "
            f"{prepare_data_command(server_dir, cwd)} +overwrite_metrics_conflicts=true (it replaces the metrics "
            f"and removes this file), else fix the data."
        )
    if data_dir.is_dir() and not conflicts:
        check.ok.append("no data/*conflict* files")

    # 5 (optional here): example rollouts.
    rollouts = server_dir / EXAMPLE_ROLLOUTS
    rollouts_rel = _rel(rollouts, server_dir)
    if not rollouts.is_file():
        check.notes.append(
            f"no {rollouts_rel} (optional in nemo_gym). To add it: {collect_rollouts_command(server_dir)}"
        )
    else:
        lines = _rows(rollouts)
        if len(lines) != EXAMPLE_ROWS:
            check.problems.append(
                f"{rollouts_rel}: {len(lines)} line(s), expected {EXAMPLE_ROWS} (one rollout per example). "
                f"Recreate it: {collect_rollouts_command(server_dir)}"
            )
        bad = 0
        for number, line in lines:
            try:
                row = json.loads(line)
            except json.JSONDecodeError as exc:
                check.problems.append(f"{rollouts_rel} line {number}: not valid JSON ({exc.msg}). Recreate the file.")
                bad += 1
                continue
            reward = row.get("reward") if isinstance(row, dict) else None
            if isinstance(reward, bool) or not isinstance(reward, (int, float)):
                check.problems.append(
                    f"{rollouts_rel} line {number}: not a rollout (no numeric `reward`). Recreate the file."
                )
                bad += 1
        if len(lines) == EXAMPLE_ROWS and not bad:
            check.ok.append(f"{EXAMPLE_ROWS} rollouts in {rollouts_rel}")
    return check


# --------------------------------------------------------------------------------------------------
# One server
# --------------------------------------------------------------------------------------------------


@dataclass
class ServerTestResult:
    server: str  # resources_servers/mcqa
    server_dir: Path
    status: str = NOT_RUN
    pytest_exit_code: Optional[int] = None
    python: Optional[str] = None
    venv_mode: Optional[str] = None
    data: Optional[DataCheck] = None
    error: Optional[str] = None  # the environment could not be prepared
    seconds: float = 0.0
    output_tail: list[str] = field(default_factory=list)
    log_path: Optional[Path] = None

    @property
    def rerun(self) -> str:
        return rerun_hint(self.server_dir, self.python or sys.executable)

    @property
    def exit_code(self) -> int:
        if self.error is not None:
            return 1
        if self.pytest_exit_code not in (None, PYTEST_OK):
            return int(self.pytest_exit_code)
        if self.data is not None and not self.data.passed:
            return DATA_VALIDATION_EXIT
        return 0

    def detail(self) -> str:
        """One line for the summary table."""
        if self.status == PASSED:
            return f"pytest ok{'; data ok' if self.data is not None else ''}"
        parts = []
        if self.error:
            parts.append(self.error.splitlines()[0])
        if self.pytest_exit_code == PYTEST_NO_TESTS:
            parts.append("no tests collected")
        elif self.pytest_exit_code not in (None, PYTEST_OK):
            parts.append(f"pytest exit code {self.pytest_exit_code}")
        if self.data is not None and self.data.problems:
            parts.append(f"{len(self.data.problems)} data problem(s)")
        return "; ".join(parts)


def _classify(result: ServerTestResult) -> str:
    if result.error is not None:
        return FAILED
    if result.pytest_exit_code == PYTEST_NO_TESTS:
        return MISSING_TESTS
    if result.pytest_exit_code != PYTEST_OK:
        return FAILED
    if result.data is not None and not result.data.passed:
        return DATA_FAILED
    return PASSED


def run_server_tests(
    server_dir: Path,
    global_config: Mapping,
    *,
    validate_data: bool,
    echo: Optional[TextIO] = None,
    log_file: Optional[TextIO] = None,
    log: Log = print,
    cwd: Optional[Path] = None,
) -> ServerTestResult:
    """Run one server's tests in its environment and, when asked (resources servers only), check its data."""
    server_dir = Path(server_dir)
    result = ServerTestResult(server=server_label(server_dir), server_dir=server_dir)
    started = time.monotonic()
    try:
        block = server_block(server_dir)
        result.python, result.venv_mode = server_test_python(server_dir, global_config, block, log=log)
    except (ServerEnvironmentError, NeMoGymConfigError) as exc:
        result.error = f"could not prepare the test environment: {exc}"
    if result.error is None:
        code, tail = run_pytest(result.python, server_dir, echo=echo, log_file=log_file)
        result.pytest_exit_code, result.output_tail = code, tail
    if validate_data and server_dir.parent.name == RESOURCES_SERVERS:
        isolated_python = result.python if result.venv_mode == "isolated" else None
        if result.error is None or result.venv_mode != "isolated":
            result.data = validate_example_data(server_dir, python=isolated_python, cwd=cwd)
    result.seconds = time.monotonic() - started
    result.status = _classify(result)
    return result


def report_server_result(result: ServerTestResult, *, validate_data: bool, out: TextIO, err: TextIO) -> None:
    """What `ng_test` prints after pytest's own output."""
    label = result.server
    if result.error is not None:
        err.write(f"{TEST_COMMAND}: {label}: {result.error}\n")
    elif result.pytest_exit_code == PYTEST_NO_TESTS:
        err.write(
            f"{TEST_COMMAND}: {label}: no tests were collected (pytest exit code 5). Add tests/test_app.py "
            f"(ng_init_resources_server writes an example), then rerun by hand:\n  {result.rerun}\n"
        )
    elif result.pytest_exit_code != PYTEST_OK:
        err.write(
            f"{TEST_COMMAND}: {label}: tests FAILED (pytest exit code {result.pytest_exit_code}). Rerun by hand:\n"
            f"  {result.rerun}\n"
        )
    else:
        where = "its isolated venv" if result.venv_mode == "isolated" else "the current interpreter"
        out.write(f"{TEST_COMMAND}: {label}: tests passed ({where}: {result.python}).\n")

    if validate_data and result.server_dir.parent.name != RESOURCES_SERVERS:
        out.write(f"{TEST_COMMAND}: {label}: data validation applies to resources servers only; skipped.\n")
    data = result.data
    if data is None:
        return
    if data.problems:
        err.write(f"{TEST_COMMAND}: {label}: example data check FAILED ({len(data.problems)} problem(s)):\n")
        for problem in data.problems:
            err.write(f"  - {problem}\n")
    else:
        out.write(f"{TEST_COMMAND}: {label}: example data OK:\n" + "".join(f"  - {line}\n" for line in data.ok))
    for note in data.notes:
        out.write(f"{TEST_COMMAND}: {label}: note: {note}\n")
    err.flush()
    out.flush()


# --------------------------------------------------------------------------------------------------
# Commands
# --------------------------------------------------------------------------------------------------


def run_one_server_tests(config: TestConfig, global_config: Mapping, *, cwd: Optional[Path] = None) -> int:
    """What `ng_test` does: run one server's tests (and its data check when asked); returns pytest's exit code."""
    cwd = Path(cwd) if cwd is not None else Path.cwd()
    server_dir = resolve_server_dir(config.entrypoint, cwd)
    print(f"{TEST_COMMAND}: running the tests of {server_label(server_dir)} ({server_dir})", flush=True)
    result = run_server_tests(
        server_dir, global_config, validate_data=config.should_validate_data, echo=sys.stdout, cwd=cwd
    )
    report_server_result(result, validate_data=config.should_validate_data, out=sys.stdout, err=sys.stderr)
    return result.exit_code


def discover_servers(cwd: Optional[Path] = None) -> tuple[Path, list[Path], list[Path]]:
    """(root, server folders with a README.md, server folders without one). Root is the current folder when it
    has any of the three server-type folders, else the install folder. A folder with neither `app.py` nor
    `configs/` is a shared library package, not a server, and is left out."""
    cwd = Path(cwd) if cwd is not None else Path.cwd()
    root = cwd if any((cwd / t).is_dir() for t in SERVER_TYPES) else PARENT_DIR
    with_readme: list[Path] = []
    without: list[Path] = []
    for server_type in SERVER_TYPES:
        type_dir = root / server_type
        if not type_dir.is_dir():
            continue
        for child in sorted(type_dir.iterdir()):
            if not child.is_dir() or child.name.startswith((".", "_")):
                continue
            if not (child / "app.py").is_file() and not (child / "configs").is_dir():
                continue  # a library package for servers (e.g. resources_servers/gymnasium), not a server
            (with_readme if (child / "README.md").is_file() else without).append(child)
    return root, with_readme, without


def _matches(server_dir: Path, names: list[str]) -> bool:
    return server_dir.name in names or server_label(server_dir) in names


def _select(servers: list[Path], config: TestAllConfig) -> list[Path]:
    known = {s.name for s in servers} | {server_label(s) for s in servers}
    for option, names in (("include", config.include), ("exclude", config.exclude)):
        unknown = [n for n in names or () if n not in known]
        if unknown:
            parts = []
            for name in unknown:
                close = closest_match(name, sorted(known))
                parts.append(f"{name!r}" + (f" (did you mean {close!r}?)" if close else ""))
            raise NeMoGymConfigError(
                f"+{option} names servers that do not exist (or have no README.md): {', '.join(parts)}. "
                f"Known: {', '.join(sorted(s.name for s in servers))}."
            )
    selected = [s for s in servers if config.include is None or _matches(s, config.include)]
    return [s for s in selected if not config.exclude or not _matches(s, config.exclude)]


def _console(file: TextIO):
    from rich.console import Console

    width = shutil.get_terminal_size((120, 24)).columns if file.isatty() else 120
    return Console(file=file, width=max(width, 80), highlight=False, soft_wrap=False)


STYLE = {PASSED: "green", FAILED: "red", MISSING_TESTS: "yellow", DATA_FAILED: "magenta", NOT_RUN: "dim"}


def print_summary(results: list[ServerTestResult], out: TextIO) -> dict[str, int]:
    """The per-server table and the per-category counts with percentages; returns the counts."""
    from rich.table import Table

    console = _console(out)
    table = Table(title="ng_test_all", show_lines=False)
    table.add_column("#", justify="right")
    table.add_column("server", no_wrap=True)
    table.add_column("result", no_wrap=True)
    table.add_column("time", justify="right")
    table.add_column("details", overflow="fold")
    for i, r in enumerate(results, start=1):
        seconds = f"{r.seconds:.1f} s" if r.status != NOT_RUN else ""
        table.add_row(str(i), r.server, f"[{STYLE[r.status]}]{r.status}[/]", seconds, r.detail())
    console.print(table)

    counts = {c: sum(1 for r in results if r.status == c) for c in CATEGORIES}
    total = len(results) or 1
    summary = Table(title="summary")
    summary.add_column("result")
    summary.add_column("count", justify="right")
    summary.add_column("%", justify="right")
    for category in CATEGORIES:
        if category == NOT_RUN and not counts[category]:
            continue
        share = f"{100 * counts[category] / total:.1f}%"
        summary.add_row(f"[{STYLE[category]}]{category}[/]", str(counts[category]), share)
    summary.add_row("total", str(len(results)), "100.0%" if results else "0.0%")
    console.print(summary)
    # A plain closing line that CI systems and people can read without the table.
    passed = counts.get(PASSED, 0)
    out.write(f"ng_test_all: {passed} passed, {len(results) - passed} failed\n")
    out.flush()
    return counts


def run_all_server_tests(config: TestAllConfig, global_config: Mapping, *, cwd: Optional[Path] = None) -> int:
    """What `ng_test_all` does; returns 0 only when every selected server passed (130 when interrupted)."""
    cwd = Path(cwd) if cwd is not None else Path.cwd()
    root, with_readme, without_readme = discover_servers(cwd)
    servers = _select(with_readme, config)
    if config.include is not None or config.exclude:
        without_readme = [s for s in without_readme if config.include is None or _matches(s, config.include)]
        without_readme = [s for s in without_readme if not config.exclude or not _matches(s, config.exclude)]

    if config.log_dir:
        log_dir = Path(os.path.expanduser(config.log_dir))
        log_dir = log_dir if log_dir.is_absolute() else cwd / log_dir
        log_dir.mkdir(parents=True, exist_ok=True)
    else:
        log_dir = Path(tempfile.mkdtemp(prefix="ng_test_all_"))
    print(f"{TEST_ALL_COMMAND}: {len(servers)} server(s) under {root}; pytest logs in {log_dir}", flush=True)
    results = [ServerTestResult(server=server_label(s), server_dir=s) for s in servers]
    interrupted = False
    for index, (server_dir, placeholder) in enumerate(zip(servers, results), start=1):
        prefix = f"[{index}/{len(servers)}] {placeholder.server}"
        print(f"{prefix} ...", flush=True)
        log_path = log_dir / f"{server_dir.parent.name}__{server_dir.name}.log"
        try:
            with log_path.open("w", encoding="utf-8", buffering=1) as log_file:  # line-buffered: tail -f works
                result = run_server_tests(
                    server_dir,
                    global_config,
                    validate_data=True,
                    echo=sys.stdout if config.show_output else None,
                    log_file=log_file,
                    log=lambda m: print(f"  {m}", flush=True),
                    cwd=cwd,
                )
        except KeyboardInterrupt:
            interrupted = True
            print(f"{prefix}: interrupted", flush=True)
            break
        result.log_path = log_path
        results[index - 1] = result
        print(f"{prefix}: {result.status} ({result.seconds:.1f} s)", flush=True)
        if result.status != PASSED:
            _print_failure(result, show_tail=not config.show_output)
            if config.fail_fast:
                print(f"{TEST_ALL_COMMAND}: stopping at the first failure (+fail_fast=true).", flush=True)
                break

    print(flush=True)
    counts = print_summary(results, sys.stdout)
    failed = counts[FAILED] + counts[MISSING_TESTS] + counts[DATA_FAILED]
    code = 0 if failed == 0 and counts[NOT_RUN] == 0 else 1
    if without_readme:
        names = ", ".join(server_label(s) for s in without_readme)
        tested_total = f"{len(servers)} tested of {len(servers) + len(without_readme)} server folders"
        if config.fail_on_total_and_test_mismatch:
            sys.stderr.write(
                f"{TEST_ALL_COMMAND}: {tested_total}: no README.md in {names}. Add a README.md to each "
                f"(+fail_on_total_and_test_mismatch=true).\n"
            )
            code = 1
        else:
            print(f"{TEST_ALL_COMMAND}: note: {tested_total}; skipped (no README.md): {names}")
    if failed:
        print(f"{TEST_ALL_COMMAND}: {failed} of {len(results)} server(s) did not pass. Full logs: {log_dir}")
    if interrupted:
        return 130
    return code



def _print_failure(result: ServerTestResult, *, show_tail: bool) -> None:
    lines = []
    if result.error:
        lines.append(f"  {result.error}")
    if show_tail and result.pytest_exit_code not in (None, PYTEST_OK) and result.output_tail:
        lines.append(f"  last lines of pytest's output (full log: {result.log_path}):")
        lines.extend(f"    | {line}" for line in result.output_tail[-TAIL_LINES:])
    if result.pytest_exit_code not in (None, PYTEST_OK):
        lines.append(f"  rerun by hand: {result.rerun}")
    if result.data is not None:
        lines.extend(f"  data: {problem}" for problem in result.data.problems)
    print("\n".join(lines), flush=True)


def _check_rows_cli(argv: list[str]) -> int:
    """`python -m nemo_gym.authoring.server_tests --check-rows <server_dir>`: one JSON line (used inside isolated venvs)."""
    if len(argv) != 2 or argv[0] != "--check-rows":
        sys.stderr.write("usage: python -m nemo_gym.authoring.server_tests --check-rows <server_dir>\n")
        return 2
    result = check_example_rows(Path(argv[1]))
    sys.stdout.write("\n" + json.dumps(result) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(_check_rows_cli(sys.argv[1:]))
