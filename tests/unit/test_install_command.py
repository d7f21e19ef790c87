"""The README's first command builds llama.cpp with the same fast, AMX-free flags as CI, from a file that exists.

Without them the first install takes about four times as long, and on some virtual machines the embedded model dies
with SIGILL (responses_api_models/local_llama_model/README.md)."""

import re
import shlex
from pathlib import Path

from tests.conftest import REPO_ROOT


def _cmake_args(text: str) -> str:
    found = re.search(r'CMAKE_ARGS="([^"]+)"', text)
    assert found, "no CMAKE_ARGS=\"...\" found"
    return found.group(1)


def first_command() -> str:
    readme = (REPO_ROOT / "README.md").read_text()
    block = readme.split("```bash\n", 1)[1].split("```", 1)[0]
    return block.splitlines()[0]


def test_the_first_command_installs_the_local_extra_with_the_build_flags():
    command = first_command()
    assert 'pip install -e ".[local]"' in command
    assert command.index("CMAKE_ARGS=") < command.index("pip install")
    assert "ng_e2e_collect_rollouts" in command


def test_the_flags_are_ci_s_and_name_a_build_file_that_exists():
    readme_args = _cmake_args(first_command())
    assert readme_args == _cmake_args((REPO_ROOT / ".ci" / "run").read_text())
    include = [a for a in shlex.split(readme_args) if a.startswith("-DCMAKE_PROJECT_llama.cpp_INCLUDE=")]
    assert len(include) == 1
    path = include[0].split("=", 1)[1].replace("$PWD", str(REPO_ROOT))
    assert Path(path).is_file(), path
    build_file = (REPO_ROOT / "responses_api_models/local_llama_model/build_flags/llama_cpp.cmake").read_text()
    assert "set(LLAMA_BUILD_COMMON OFF" in build_file
    assert re.search(r"foreach\(_amx AMX_TILE AMX_INT8 AMX_BF16\)\s+set\(GGML_\$\{_amx\} OFF", build_file)
