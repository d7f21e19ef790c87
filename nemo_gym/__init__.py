"""nemo_gym: build, run and score RL environments for LLMs.

Path constants match the NeMo Gym v0.2 layout so environment code that reads them keeps working.
"""

import os
import sys
from pathlib import Path

__version__ = "0.1.0"

ROOT_DIR = Path(__file__).resolve().parent
PARENT_DIR = ROOT_DIR.parent
# Editable install: the repo root holds pyproject.toml, so caches and results live there.
WORKING_DIR = PARENT_DIR if (PARENT_DIR / "pyproject.toml").exists() else Path.cwd()
CACHE_DIR = WORKING_DIR / "cache"
RESULTS_DIR = WORKING_DIR / "results"
# More folders to look in for configs, prompts, data and servers (os.pathsep list), before the current folder and
# this install (v0.5's `component_search_roots`); ng_run adds the folder it was started in for its servers.
EXTRA_ROOTS_ENV_VAR_NAME = "NEMO_GYM_EXTRA_ROOTS"

# Server folders (resources_servers/..., responses_api_models/...) import as top-level packages.
if str(PARENT_DIR) not in sys.path:
    sys.path.append(str(PARENT_DIR))

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("HF_DATASETS_CACHE", str(CACHE_DIR / "huggingface"))
os.environ.setdefault("TRANSFORMERS_CACHE", str(CACHE_DIR / "huggingface"))


def __getattr__(name: str):
    # `nemo_gym.component_search_roots` (NeMo Gym v0.5), imported on first use so `import nemo_gym` stays light.
    if name == "component_search_roots":
        from nemo_gym.rollouts.benchmarks import component_search_roots

        return component_search_roots
    raise AttributeError(f"module 'nemo_gym' has no attribute {name!r}")
