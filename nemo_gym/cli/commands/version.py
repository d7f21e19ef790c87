"""`ng_version` / `ng version`: versions of nemo_gym, Python, key dependencies and the machine (for bug reports)."""

from __future__ import annotations

import json
import os
import platform
import sys
from importlib import metadata

from pydantic import Field

from nemo_gym import __version__
from nemo_gym.cli.command import Command
from nemo_gym.config.types import BaseNeMoGymCLIConfig

DEPENDENCIES = ("fastapi", "uvicorn", "httpx", "pydantic", "omegaconf", "typer", "openai", "ray", "orjson")


class VersionConfig(BaseNeMoGymCLIConfig):
    """Print the versions of nemo_gym, Python and the main dependencies, where nemo_gym is installed, and the
    machine (OS, CPUs, memory): what a bug report needs."""

    json_format: bool = Field(default=False, alias="json", description="Print JSON instead of text.")


def version_info() -> dict:
    import psutil

    from nemo_gym import PARENT_DIR

    deps = {}
    for name in DEPENDENCIES:
        try:
            deps[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            deps[name] = None
    return {
        "nemo_gym": __version__,
        "python": platform.python_version(),
        "python_path": sys.executable,
        "installation_path": str(PARENT_DIR),
        "dependencies": deps,
        "system": {
            "os": platform.system(),
            "platform": platform.platform(),
            "architecture": platform.machine(),
            "processor": platform.processor(),
            "cpu_count": os.cpu_count(),
            "memory_gb": round(psutil.virtual_memory().total / 1024**3, 1),
        },
    }


def run(config: VersionConfig) -> int:
    info = version_info()
    if config.json_format:
        print(json.dumps(info, indent=2))
        return 0
    print(f"nemo_gym {info['nemo_gym']}")
    print(f"Python {info['python']} ({info['python_path']})")
    print(f"Installed at {info['installation_path']}")
    for name, ver in info["dependencies"].items():
        print(f"  {name:<10} {ver or 'not installed'}")
    sysinfo = info["system"]
    print(f"{sysinfo['platform']} {sysinfo['architecture']}, {sysinfo['cpu_count']} CPUs, {sysinfo['memory_gb']} GB")
    return 0


COMMAND = Command(
    name="version",
    verb="version",
    summary="Print versions of nemo_gym, Python and key dependencies.",
    model=VersionConfig,
    run=run,
    reads_config_files=False,
    examples=("ng_version", "ng_version +json=true"),
)
