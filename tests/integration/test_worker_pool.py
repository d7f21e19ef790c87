"""nemo_gym.isolation.worker_pool: hard time limits (a stuck worker is killed and replaced), crashes, errors, concurrency."""

import asyncio
import os
import signal
import time

import pytest

from nemo_gym.isolation.worker_pool import WorkerCrashed, WorkerError, WorkerPool, WorkerTimeout, function_name
from tests.integration import worker_functions
from tests.integration.worker_functions import crash, fail, pid, stuck_in_c_code


def test_pool_kills_a_worker_that_signals_cannot_stop():
    pool = WorkerPool(num_workers=1, timeout_s=1.0, preload=[worker_functions.__name__])
    try:
        worker_pid = asyncio.run(pool.run(pid))
        started = time.monotonic()
        with pytest.raises(WorkerTimeout, match="did not finish within 1 s"):
            asyncio.run(pool.run(stuck_in_c_code, 60))
        assert time.monotonic() - started < 5
        assert pool.worker_pids() == []  # killed, not left running
        with pytest.raises(ProcessLookupError):
            os.kill(worker_pid, 0)
        assert asyncio.run(pool.run(stuck_in_c_code, 0.1)) == "finished"  # a fresh worker
        assert asyncio.run(pool.run(pid)) != worker_pid
    finally:
        pool.close()


def test_pool_survives_a_crashed_worker_and_reports_errors():
    pool = WorkerPool(num_workers=1, timeout_s=30.0, preload=[worker_functions.__name__])
    try:
        with pytest.raises(WorkerCrashed):
            asyncio.run(pool.run(crash))
        with pytest.raises(WorkerError, match="ArithmeticError: bad input"):
            asyncio.run(pool.run(fail))
        assert asyncio.run(pool.run(pid)) > 0  # a worker that raised stays in use
    finally:
        pool.close()


def test_pool_replaces_a_worker_that_died_while_idle():
    pool = WorkerPool(num_workers=1, timeout_s=30.0, preload=[worker_functions.__name__])
    try:
        first = asyncio.run(pool.run(pid))
        os.kill(first, signal.SIGKILL)
        deadline = time.monotonic() + 10
        while pool.worker_pids() and time.monotonic() < deadline:  # until it is dead (and reaped)
            time.sleep(0.05)
        assert pool.worker_pids() == []
        second = asyncio.run(pool.run(pid))
        assert second > 0 and second != first
    finally:
        pool.close()


def test_pool_serves_other_calls_while_one_is_stuck():
    async def scenario(pool: WorkerPool) -> tuple:
        stuck = asyncio.ensure_future(pool.run(stuck_in_c_code, 60))
        await asyncio.sleep(0.2)
        started = time.monotonic()
        quick = await pool.run(stuck_in_c_code, 0)
        quick_took = time.monotonic() - started
        with pytest.raises(WorkerTimeout):
            await stuck
        return quick, quick_took

    pool = WorkerPool(num_workers=2, timeout_s=3.0, preload=[worker_functions.__name__])
    try:
        asyncio.run(pool.run(pid))
        asyncio.run(pool.run(pid))  # both workers started
        quick, quick_took = asyncio.run(scenario(pool))
        assert quick == "finished" and quick_took < 2.0
    finally:
        pool.close()


def test_pool_results_are_correct_and_functions_can_be_named():
    pool = WorkerPool(num_workers=2, timeout_s=30.0)
    try:

        async def many() -> list:
            return await asyncio.gather(*(pool.run("operator:add", i, i) for i in range(6)))

        assert asyncio.run(many()) == [0, 2, 4, 6, 8, 10]
        assert asyncio.run(pool.run("json:loads", '{"a": [1, 2]}')) == {"a": [1, 2]}
        assert pool.run_blocking(worker_functions.stuck_in_c_code, (0,)) == "finished"
        with pytest.raises(WorkerTimeout):  # a per-call limit overrides the pool's
            asyncio.run(pool.run(stuck_in_c_code, 5, timeout_s=0.5))
        with pytest.raises(WorkerError, match="ModuleNotFoundError"):
            asyncio.run(pool.run("no_such_module_here:f"))
    finally:
        pool.close()


def test_pool_rejects_functions_of_the_main_script_and_closed_pools():
    def local() -> None:
        pass

    with pytest.raises(ValueError, match="module-level"):
        function_name(local)
    local.__module__ = "__main__"
    pool = WorkerPool(num_workers=1, timeout_s=5.0, preload=[worker_functions.__name__])
    with pytest.raises(ValueError, match="__main__"):
        asyncio.run(pool.run(local))
    assert asyncio.run(pool.run(pid)) > 0
    pool.close()
    assert pool.worker_pids() == []
    with pytest.raises(RuntimeError, match="closed"):
        asyncio.run(pool.run(pid))
    with pytest.raises(ValueError):
        WorkerPool(num_workers=0)
