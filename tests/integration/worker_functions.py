"""Functions the worker-pool tests run in worker processes. A module of their own, importing next to nothing, so a
worker starts in a fraction of a second (a worker imports the module of the function it runs)."""

import os
import signal
import time


def stuck_in_c_code(seconds: float) -> str:
    """Stands for a long call inside a C extension: math-verify's SIGALRM cannot interrupt it."""
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGALRM})
    signal.alarm(1)
    time.sleep(seconds)
    return "finished"


def crash() -> None:
    os._exit(3)


def fail() -> None:
    raise ArithmeticError("bad input")


def pid() -> int:
    return os.getpid()
