"""code_gen: competitive-programming problems graded by running the model's program against unit tests.

There are no tools: the model answers in text, `verify` takes the last fenced code block and runs it against the
row's `verifier_metadata.unit_tests`:

* stdin/stdout programs: `{"inputs": ["1 2\\n", ...], "outputs": ["3\\n", ...]}`; a test passes when the printed
  output matches line by line (see `harness.stdio_outputs_match`).
* call-based: add `"fn_name": "twoSum"`; the program defines `class Solution` with that method (LeetCode style) or a
  top-level function. Each input is a string with one JSON value per line (the positional arguments; a JSON list
  of the arguments works too), each output the JSON text of the expected return value.

The program runs in a sandbox (`nemo_gym.isolation.sandbox`: no network, a private scratch directory, CPU / memory /
process / file-size limits, an unprivileged user, killed with all its children at the time limit) and never in
this process. Execution happens in a worker thread, or as a Ray task when Ray is up (`ray: true` in the server
config), so the event loop keeps serving while programs run.

reward = 1.0 iff every test passes; 0.0 otherwise (no code block, a failing test, a sandbox failure); and
`reasoning_format_penalty` (default -0.2) when the answer breaks the reasoning format (`<think>` tags in the answer
text, or more than one opening or closing tag in the reasoning summaries).

This is the pattern for a verifier that must execute untrusted output: extract, run it somewhere that cannot hurt
the server, judge outside the sandbox, and report enough (`result`, `metadata`) to tell a wrong program from a
broken harness.
"""

import asyncio
import json
import os
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Optional, Union

from fastapi import FastAPI
from pydantic import BaseModel, ConfigDict, PrivateAttr, field_validator

from nemo_gym.base_resources_server import (
    BaseResourcesServerConfig,
    BaseRunRequest,
    BaseVerifyRequest,
    BaseVerifyResponse,
    SimpleResourcesServer,
)
from nemo_gym.openai_utils import NeMoGymResponse
from resources_servers.code_gen.harness import GLOBAL_FAILURE, ExecutionSettings, run_unit_tests


class CodeGenResourcesServerConfig(BaseResourcesServerConfig):
    # How many verifies may execute programs at once (default: the number of CPUs of this machine). Tests are
    # timed by the wall clock, so oversubscribing the CPUs turns slow machines into time-limit failures.
    num_processes: Optional[int] = None
    unit_test_timeout_secs: float = 10.0  # wall-clock limit per test
    debug: bool = False  # print every verify's outcome
    reasoning_format_penalty: float = -0.2
    # Sandbox limits (see nemo_gym/isolation/sandbox.py).
    memory_limit_mb: int = 1024  # per process (RLIMIT_AS)
    max_processes: int = 16  # processes + threads of the program (RLIMIT_NPROC)
    max_output_mb: float = 8.0  # per test; more output is a runtime error
    max_file_mb: float = 16.0  # the largest file the program may write
    scratch_mb: int = 64  # its scratch directory (a tmpfs)
    allow_site_packages: bool = False  # let programs import installed packages (default: standard library only)
    # None: run tests as Ray tasks whenever this process is connected to Ray (`ray: true` asks ng_run for a
    # cluster); False: never; True: always (joins or starts a cluster).
    use_ray: Optional[bool] = None
    ray_num_cpus_per_task: float = 1.0


class UnitTests(BaseModel):
    model_config = ConfigDict(extra="allow")

    inputs: list[Any]  # stdin texts, or (call-based) argument lines / lists
    outputs: list[Any]  # expected stdout texts, or (call-based) JSON texts of the expected return values
    fn_name: Optional[str] = None  # set: call-based


class VerifierMetadata(BaseModel):
    model_config = ConfigDict(extra="allow")

    unit_tests: UnitTests

    @field_validator("unit_tests", mode="before")
    @classmethod
    def _decode_json_text(cls, value: Any) -> Any:
        """Some datasets store the unit tests as a JSON-encoded string: accept that too."""
        return json.loads(value) if isinstance(value, str) else value


class CodeGenRunRequest(BaseRunRequest):
    verifier_metadata: VerifierMetadata


class CodeGenVerifyRequest(CodeGenRunRequest, BaseVerifyRequest):
    pass


class CodeGenVerifyResponse(CodeGenVerifyRequest, BaseVerifyResponse):
    extracted_model_output: Optional[str] = None  # the answer text the code was looked for in
    extracted_model_code: Optional[str] = None  # the code that ran (None: no code block)
    # One entry per test that ran, in order, stopping at the first failure: True pass, -2 wrong answer,
    # -3 time limit, -4 runtime/compilation error, -1 global failure (then one -1 per test).
    result: Optional[list[Union[bool, int]]] = None
    metadata: Optional[dict[str, Any]] = None  # what failed and why (or the passing run's statistics)
    unit_tests_time_taken: Optional[float] = None  # seconds spent executing (None: nothing ran)
    reasoning_format_violation_rate: float = 0.0  # 1.0 when the reasoning format was broken


# ------------------------------------------------------------------------------------------------- parsing


def extract_code(text: str) -> Optional[str]:
    """The lines between the last two lines that contain a triple backtick; None with fewer than two such lines.
    (The language tag on the opening fence, e.g. ```python, is part of the fence line and so not code.)"""
    lines = text.splitlines()
    fences = [index for index, line in enumerate(lines) if "```" in line]
    if len(fences) < 2:
        return None
    return "\n".join(lines[fences[-2] + 1 : fences[-1]])


def reasoning_format_violation(response: NeMoGymResponse) -> bool:
    """`<think>` or `</think>` in the answer text, or more than one `<think>` (or more than one `</think>`) in the
    reasoning summaries (all reasoning items together): the reasoning parser was bypassed or the model opened a
    second reasoning block."""
    answer = response.output_text
    if "<think>" in answer or "</think>" in answer:
        return True
    summaries = []
    for item in response.output:
        if getattr(item, "type", None) != "reasoning":
            continue
        for part in getattr(item, "summary", None) or []:
            text = part.get("text") if isinstance(part, dict) else getattr(part, "text", None)
            summaries.append(text or "")
    reasoning = "\n".join(summaries)
    return reasoning.count("<think>") > 1 or reasoning.count("</think>") > 1


# -------------------------------------------------------------------------------------------------- server


class CodeGenResourcesServer(SimpleResourcesServer):
    config: CodeGenResourcesServerConfig

    _semaphore: Optional[asyncio.Semaphore] = PrivateAttr(default=None)
    _pool: Optional[ThreadPoolExecutor] = PrivateAttr(default=None)
    _ray_task: Any = PrivateAttr(default=None)

    def setup_webserver(self) -> FastAPI:
        return super().setup_webserver()  # no tools: the program is in the answer text

    # -- execution ------------------------------------------------------------------------------------------

    @property
    def concurrency(self) -> int:
        return max(1, int(self.config.num_processes or os.cpu_count() or 1))

    def execution_settings(self) -> ExecutionSettings:
        mb = 1 << 20
        return ExecutionSettings(
            timeout=float(self.config.unit_test_timeout_secs),
            memory_bytes=int(self.config.memory_limit_mb * mb),
            max_processes=int(self.config.max_processes),
            max_output_bytes=int(self.config.max_output_mb * mb),
            max_file_bytes=int(self.config.max_file_mb * mb),
            scratch_bytes=int(self.config.scratch_mb * mb),
            site_packages=bool(self.config.allow_site_packages),
        )

    def _use_ray(self) -> bool:
        if self.config.use_ray is False:
            return False
        from nemo_gym.runtime.ray import ray_is_initialized

        return bool(self.config.use_ray) or ray_is_initialized()

    def _remote_run_unit_tests(self):
        if self._ray_task is None:
            import ray

            from nemo_gym.runtime.ray import ensure_ray

            if not ray.is_initialized():
                ensure_ray()
            self._ray_task = ray.remote(
                num_cpus=self.config.ray_num_cpus_per_task, scheduling_strategy="SPREAD", max_retries=1
            )(run_unit_tests)
        return self._ray_task

    async def run_tests(self, code: str, unit_tests: dict) -> tuple[list, dict, float]:
        """Execute off the event loop: as a Ray task when Ray is up, else in a worker thread (the work itself
        happens in sandboxed subprocesses). Returns (results, metadata, seconds)."""
        if self._semaphore is None:
            self._semaphore = asyncio.Semaphore(self.concurrency)
        settings = self.execution_settings()
        async with self._semaphore:
            started = time.perf_counter()
            executor = "local"
            try:
                if self._use_ray():
                    executor = "ray"
                    if self._ray_task is None:  # the first use may start or join a cluster: not on the loop
                        await asyncio.to_thread(self._remote_run_unit_tests)
                    results, metadata = await self._ray_task.remote(code, unit_tests, settings)
                else:
                    if self._pool is None:
                        self._pool = ThreadPoolExecutor(self.concurrency, thread_name_prefix="code_gen")
                    loop = asyncio.get_running_loop()
                    results, metadata = await loop.run_in_executor(
                        self._pool, run_unit_tests, code, unit_tests, settings
                    )
            except Exception as err:  # noqa: BLE001 - a harness failure is a global failure, never a crash
                count = max(1, len(unit_tests.get("inputs") or []))
                results = [GLOBAL_FAILURE] * count
                metadata = {"error_code": GLOBAL_FAILURE, "error_message": "Global Failure", "error": repr(err)}
            elapsed = time.perf_counter() - started
        return results, {**metadata, "executor": executor}, elapsed

    # -- verify ---------------------------------------------------------------------------------------------

    async def verify(self, body: CodeGenVerifyRequest) -> CodeGenVerifyResponse:
        text = body.response.output_text
        violation = reasoning_format_violation(body.response)
        fields: dict[str, Any] = {
            "extracted_model_output": text,
            "reasoning_format_violation_rate": 1.0 if violation else 0.0,
        }
        code = extract_code(text) if text.strip() else None
        if code is None:
            return CodeGenVerifyResponse(**body.model_dump(), reward=0.0, **fields)

        unit_tests = body.verifier_metadata.unit_tests.model_dump()
        results, metadata, elapsed = await self.run_tests(code, unit_tests)
        passed = bool(results) and all(result is True for result in results)
        if violation:
            reward = float(self.config.reasoning_format_penalty)
        else:
            reward = 1.0 if passed else 0.0
        if self.config.debug:
            print(f"code_gen verify: reward={reward} result={results} metadata={metadata}", file=sys.stderr)
        return CodeGenVerifyResponse(
            **body.model_dump(),
            reward=reward,
            extracted_model_code=code,
            result=results,
            metadata=metadata,
            unit_tests_time_taken=elapsed,
            **fields,
        )


if __name__ == "__main__":
    CodeGenResourcesServer.run_webserver()
