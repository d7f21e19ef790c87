"""Unit tests start no process: a test here that forks or spawns one fails and says where it belongs (real
processes are tests/integration/'s). Threads (an in-process live server) are fine. The guard holds through each
test's setup, call and teardown, so a module- or session-scoped fixture (set up with the first test that uses it,
torn down after the last) cannot start one either."""

from __future__ import annotations

import contextlib
import os
import subprocess
from typing import Iterator

import _posixsubprocess
import pytest

_MESSAGE = "a unit test starts no process: move this test to tests/integration/"


def _refuse(*args, **kwargs):
    raise AssertionError(_MESSAGE)


@contextlib.contextmanager
def _no_processes() -> Iterator[None]:
    with pytest.MonkeyPatch.context() as monkeypatch:
        monkeypatch.setattr(_posixsubprocess, "fork_exec", _refuse)
        if hasattr(subprocess, "_fork_exec"):  # subprocess keeps its own reference (Python 3.11+)
            monkeypatch.setattr(subprocess, "_fork_exec", _refuse)
        monkeypatch.setattr(os, "fork", _refuse)
        for name in ("posix_spawn", "posix_spawnp"):
            if hasattr(os, name):
                monkeypatch.setattr(os, name, _refuse)
        yield


# Hooks of this conftest run for the tests under tests/unit only.
@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_setup(item):
    with _no_processes():
        yield


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_call(item):
    with _no_processes():
        yield


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_teardown(item, nextitem):
    with _no_processes():
        yield
