"""Run a program against unit tests in the sandbox and judge the results (the trusted side).

`run_unit_tests(code, unit_tests, settings)` is a plain blocking function: the server calls it in a worker thread,
or as a Ray task (it is importable and its arguments are picklable) when Ray is up.

The program runs under `nemo_gym.isolation.sandbox` with `sandbox_driver.py` as its driver. The driver gets one test input
at a time and reports what the program printed or returned; the expected outputs never enter the sandbox, and the
comparison happens here. Tests run in order and stop at the first failure.

Result codes per test (as the reference's LiveCodeBench harness): `True` pass, `-2` wrong answer, `-3` time limit,
`-4` runtime error (also: compilation error, output limit), `-1` global failure (the harness itself failed or the
whole run exceeded `(timeout + 1) * num_tests + 5` seconds; then every entry is -1).
"""

from __future__ import annotations

import json
import math
import time
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation
from pathlib import Path
from typing import Any, Optional, Union

from nemo_gym.isolation.sandbox import Sandbox, SandboxError, SandboxLimits

PASS = True
GLOBAL_FAILURE = -1
WRONG_ANSWER = -2
TIME_LIMIT_EXCEEDED = -3
RUNTIME_ERROR = -4

ERROR_MESSAGES = {
    GLOBAL_FAILURE: "Global Failure",
    WRONG_ANSWER: "Wrong Answer",
    TIME_LIMIT_EXCEEDED: "Time Limit Exceeded",
    RUNTIME_ERROR: "Runtime Error",
}

DRIVER_SOURCE = (Path(__file__).resolve().parent / "sandbox_driver.py").read_text()
# How long after a test's own time limit the trusted side waits for the driver's reply before it gives up on
# the test (the driver kills the test itself at the limit; this only matters if the test froze the driver).
WATCHDOG_GRACE_SECS = 5.0
# Strings in `metadata` are cut to this many characters.
METADATA_TEXT_LIMIT = 2000

Result = Union[bool, int]


@dataclass(frozen=True)
class ExecutionSettings:
    """Limits for one verify (picklable: it travels to Ray tasks)."""

    timeout: float = 10.0  # wall-clock seconds per test
    memory_bytes: int = 1 << 30  # RLIMIT_AS per process
    max_processes: int = 16  # RLIMIT_NPROC for the sandbox user (processes and threads)
    max_output_bytes: int = 8 << 20  # stdout (or JSON return value) kept per test; more is a runtime error
    max_file_bytes: int = 16 << 20  # RLIMIT_FSIZE: files the program writes
    scratch_bytes: int = 64 << 20  # the scratch tmpfs
    site_packages: bool = False  # True: the program may import installed packages, not only the stdlib


# ------------------------------------------------------------------------------------------------ judging


def _clip(value: Any) -> Any:
    if isinstance(value, str) and len(value) > METADATA_TEXT_LIMIT:
        return value[:METADATA_TEXT_LIMIT] + f"... [{len(value) - METADATA_TEXT_LIMIT} more characters]"
    return value


def _output_lines(text: str) -> list[str]:
    return [line.strip() for line in text.strip().splitlines()]


def _tokens_equal(actual: str, expected: str) -> bool:
    if actual == expected:
        return True
    try:
        return Decimal(actual) == Decimal(expected)
    except (InvalidOperation, ValueError):
        return False


def stdio_outputs_match(actual: str, expected: str) -> bool:
    """Line by line after stripping the whole output and every line; a line that differs as text still matches
    when its whitespace-separated tokens match one by one, as text or as equal decimal numbers (`1.50` = `1.5`)."""
    actual_lines, expected_lines = _output_lines(actual), _output_lines(expected)
    if len(actual_lines) != len(expected_lines):
        return False
    for a, e in zip(actual_lines, expected_lines):
        if a == e:
            continue
        a_tokens, e_tokens = a.split(), e.split()
        if len(a_tokens) != len(e_tokens) or not all(_tokens_equal(x, y) for x, y in zip(a_tokens, e_tokens)):
            return False
    return True


def _json_normal(value: Any) -> Any:
    """What the value looks like after a JSON round trip (tuples become lists)."""
    return json.loads(json.dumps(value))


def call_outputs_match(returned_json: Optional[str], expected: Any) -> bool:
    if returned_json is None:
        return False
    try:
        returned = json.loads(returned_json)
    except ValueError:
        return False
    return returned == _json_normal(expected)


def parse_call_arguments(raw: Any) -> list:
    """A call-based test input: a string with one JSON value per non-empty line (LiveCodeBench's format), or a
    JSON list of the positional arguments."""
    if isinstance(raw, list):
        return raw
    if isinstance(raw, str):
        return [json.loads(line) for line in raw.split("\n") if line.strip()]
    raise ValueError(f"a call-based input must be a string or a list, not {type(raw).__name__}")


def parse_call_expected(raw: Any) -> Any:
    """A call-based expected output: JSON text of the return value (a string that is not JSON is taken
    literally), or the value itself."""
    if isinstance(raw, str):
        try:
            return json.loads(raw)
        except ValueError:
            return raw
    return raw


# ----------------------------------------------------------------------------------------------- running


def _failure(code: int, *, message: Optional[str] = None, **fields: Any) -> dict:
    clipped = {key: _clip(value) for key, value in fields.items()}
    return {"error_code": code, "error_message": message or ERROR_MESSAGES[code], **clipped}


def _global_failure(num_tests: int, error: str) -> tuple[list[Result], dict]:
    return [GLOBAL_FAILURE] * max(1, num_tests), _failure(GLOBAL_FAILURE, error=error)


def run_unit_tests(code: str, unit_tests: dict, settings: ExecutionSettings) -> tuple[list[Result], dict]:
    """Run `code` on `unit_tests` (`{"inputs": [...], "outputs": [...], "fn_name": str | None}`).

    Returns `(results, metadata)`: one result per test that ran (stopping at the first failure) and a description
    of the failure (or of the passing run)."""
    inputs = list(unit_tests.get("inputs") or [])
    outputs = list(unit_tests.get("outputs") or [])
    fn_name = unit_tests.get("fn_name")
    num_tests = len(inputs)
    if not inputs or len(inputs) != len(outputs):
        return _global_failure(num_tests, f"invalid unit tests: {len(inputs)} inputs and {len(outputs)} outputs")
    mode = "call" if fn_name else "stdio"
    try:
        if mode == "call":
            requests = [{"op": "run", "args": parse_call_arguments(raw)} for raw in inputs]
            expected = [parse_call_expected(raw) for raw in outputs]
        else:
            requests = [{"op": "run", "stdin": str(raw)} for raw in inputs]
            expected = [str(raw) for raw in outputs]
    except ValueError as err:
        return _global_failure(num_tests, f"invalid unit test: {err}")

    timeout = float(settings.timeout)
    limits = SandboxLimits(
        cpu_seconds=math.ceil(timeout) + 1,
        memory_bytes=settings.memory_bytes,
        max_processes=settings.max_processes,
        max_file_bytes=settings.max_file_bytes,
        max_open_files=64,
        scratch_bytes=settings.scratch_bytes,
        wall_seconds=(timeout + 1) * num_tests + 5,
        # The longest reply line: the output, JSON-escaped (at worst 6 bytes per byte), plus the envelope.
        max_output_bytes=6 * settings.max_output_bytes + 65536,
    )
    results: list[Result] = []
    max_time = 0.0
    try:
        with Sandbox(limits, site_packages=settings.site_packages) as sandbox:
            process = sandbox.start(
                sandbox.python_argv("driver.py"), files={"driver.py": DRIVER_SOURCE, "solution.py": code}
            )
            sweep = bool(sandbox.enforced.get("pid_namespace") or sandbox.enforced.get("dedicated_uid"))
            process.send_json(
                {"op": "init", "mode": mode, "fn_name": fn_name, "timeout": timeout,
                 "max_output": settings.max_output_bytes, "sweep": sweep}
            )
            reply = process.read_json(timeout=60)
            if reply is None:
                sandbox.exit_status()  # raises SandboxSetupError if the driver could not even start
                return _global_failure(num_tests, "the test driver exited: " + _tail(process))
            if not reply.get("ok"):
                failure = _failure(RUNTIME_ERROR, message="Compilation Error", error=reply.get("compile_error"))
                return [RUNTIME_ERROR], failure

            for index, request in enumerate(requests):
                process.send_json(request)
                try:
                    reply = process.read_json(timeout=timeout + WATCHDOG_GRACE_SECS)
                except TimeoutError:
                    if time.monotonic() >= sandbox.deadline:
                        return _global_failure(num_tests, f"global timeout: the run exceeded {limits.wall_seconds:g} s")
                    results.append(TIME_LIMIT_EXCEEDED)
                    return results, _failure(
                        TIME_LIMIT_EXCEEDED, test_index=index, inputs=inputs[index], expected=outputs[index],
                        error="the test did not finish and the driver stopped answering",
                    )
                if reply is None:
                    return _global_failure(num_tests, f"the test driver died during test {index}: " + _tail(process))
                max_time = max(max_time, float(reply.get("time") or 0.0))
                status = reply.get("status")
                common = {"test_index": index, "inputs": inputs[index], "expected": outputs[index]}
                if status == "timeout":
                    results.append(TIME_LIMIT_EXCEEDED)
                    return results, _failure(TIME_LIMIT_EXCEEDED, error=reply.get("error"), **common)
                if status != "ok":
                    results.append(RUNTIME_ERROR)
                    return results, _failure(
                        RUNTIME_ERROR, error=reply.get("error"), output=reply.get("stdout"), **common
                    )
                if mode == "call":
                    passed = call_outputs_match(reply.get("return"), expected[index])
                    shown = reply.get("return")
                else:
                    passed = stdio_outputs_match(reply.get("stdout") or "", expected[index])
                    shown = reply.get("stdout")
                if not passed:
                    results.append(WRONG_ANSWER)
                    return results, _failure(WRONG_ANSWER, output=shown, **common)
                results.append(PASS)
            process.send_json({"op": "exit"})
            process.close_stdin()
            process.wait(timeout=5)
    except SandboxError as err:
        return _global_failure(num_tests, f"sandbox error: {err}")
    except (OSError, ValueError) as err:  # broken pipe to a dead driver, an unreadable reply
        return _global_failure(num_tests, f"{type(err).__name__}: {err}")
    return results, {"num_tests": num_tests, "max_test_time": round(max_time, 6)}


def _tail(process) -> str:
    return process.stderr_tail(2000).decode(errors="replace").strip() or "no error output"
