"""`ng_init_resources_server` (`ng init`): scaffold a new resources server that works as soon as it is written.

The templates live in `nemo_gym/authoring/templates/resources_server_template/` (package data, so this works from a wheel
too). Placeholders are `@@name@@` (the folder name), `@@Title@@` (that name in TitleCase, the prefix of every
class name) and `@@requirement@@` (the line of requirements.txt that installs nemo_gym). The scaffold is a small
but real task, so its tests pass and a rollout scores: one tool (`get_word_length`), a verify request with a
dataset field (`expected_answer`), a verify response with metrics, 5 example rows, and tests.

Decisions:
- The target must be `<...>/resources_servers/<name>`: `ng_run` finds a server's folder as `resources_servers/<impl>`
  under the current folder or the install folder, and its tests import `resources_servers.<name>.app`. A bare
  `<name>` means `resources_servers/<name>` under the current folder.
- `<name>` must be a Python identifier (not a keyword): it is a package name in imports.
- An existing target (file or folder, even empty) is refused: nothing is ever overwritten.
- requirements.txt: in a source checkout `-e nemo-gym @ ../../` for a server inside it (the checkout's absolute
  path for one outside it); installed from a wheel, `nemo-gym`. `venv_mode: isolated` installs this nemo_gym in
  place of that line.
- When the parent `resources_servers/` folder has no `__init__.py` (a fresh project outside the checkout), one is
  created, so the tests' `resources_servers.<name>` import resolves to this folder.
- `data/example_metrics.json` is written too, with the same content `ng_prepare_data +mode=example_validation`
  gives, so the new server passes `ng_test +should_validate_data=true` (and `ng_test_all`) from the start. It is
  marked as measured on placeholder rows, so `ng_prepare_data` replaces it without a conflict once the real rows
  are in (the v0.5 tutorials' order: replace the data, then run it).
- `tests/test_e2e.py` knows nothing of the placeholder task: its fake model calls each example row's first tool with
  arguments made from the tool's JSON schema and answers with the tool's output, and it checks the wiring (every
  row gets a scored rollout, no tool call fails), not the reward. So it keeps passing when the author replaces the
  task, the data and verify (as v0.5's tutorials have them do), and it runs wherever the project folder is.
- Files are written into a temporary sibling folder that is renamed into place at the end: an error half way
  leaves nothing behind.
"""

from __future__ import annotations

import keyword
import os
import re
import shutil
import tempfile
from pathlib import Path
from typing import Optional

from pydantic import Field

from nemo_gym import PARENT_DIR
from nemo_gym.config.types import BaseNeMoGymCLIConfig
from nemo_gym.errors import NeMoGymConfigError

TEMPLATE_DIR = Path(__file__).resolve().parent / "templates" / "resources_server_template"
RESOURCES_SERVERS_DIRNAME = "resources_servers"
MODEL_CONFIG = "responses_api_models/openai_model/configs/openai_model.yaml"

# template file -> path inside the new server folder (`{name}` is the server name)
TEMPLATE_FILES: dict[str, str] = {
    "app.py.tmpl": "app.py",
    "config.yaml.tmpl": "configs/{name}.yaml",
    "example.jsonl.tmpl": "data/example.jsonl",
    "data.gitignore.tmpl": "data/.gitignore",
    "requirements.txt.tmpl": "requirements.txt",
    "README.md.tmpl": "README.md",
    "test_app.py.tmpl": "tests/test_app.py",
    "test_e2e.py.tmpl": "tests/test_e2e.py",
}
EMPTY_FILES = ("__init__.py", "tests/__init__.py")
_PLACEHOLDER_RE = re.compile(r"@@[A-Za-z_]+@@")


class InitResourcesServerConfig(BaseNeMoGymCLIConfig):
    """Scaffold a new resources server: app.py (one tool and a verify), configs/<name>.yaml (the server with
    `domain: other` and a `<name>_simple_agent` block using `policy_model`), data/example.jsonl (5 rows) and
    its example_metrics.json, data/.gitignore, requirements.txt, README.md and tests (unit tests that pass, and
    an end-to-end test with the fake LLM). Refuses an existing folder.

    Example: ng_init_resources_server +entrypoint=resources_servers/my_env"""

    entrypoint: str = Field(
        description="The new server folder, resources_servers/<name> (relative to the current folder, or absolute). "
        "<name> must be a Python identifier."
    )


def title_case(name: str) -> str:
    """`my_env` -> `MyEnv`, `mcqa` -> `Mcqa`, `my2_env` -> `My2Env` (inner capitals are kept)."""
    return "".join(part[:1].upper() + part[1:] for part in name.split("_") if part)


def framework_requirement_line(server_dir: Path) -> str:
    """The requirements.txt line that installs nemo_gym for a server at `server_dir`."""
    if not (PARENT_DIR / "pyproject.toml").is_file():  # installed from a wheel
        return "nemo-gym"
    # A source checkout: relative for a server inside it (`../../`), else the checkout's absolute path.
    server_dir = Path(os.path.abspath(server_dir))
    if server_dir.is_relative_to(PARENT_DIR):
        return f"-e nemo-gym @ {os.path.relpath(PARENT_DIR, server_dir).replace(os.sep, '/')}/"
    return f"-e nemo-gym @ {PARENT_DIR.as_posix()}"


def resolve_target(entrypoint: str, cwd: Optional[Path] = None) -> Path:
    """The absolute folder to create, after checking its name and place (raises NeMoGymConfigError)."""
    cwd = Path(cwd) if cwd is not None else Path.cwd()
    text = str(entrypoint).strip()
    if not text:
        raise NeMoGymConfigError("+entrypoint is empty: pass +entrypoint=resources_servers/<name>.")
    path = Path(os.path.expanduser(text))
    if len(path.parts) == 1 and not path.is_absolute():
        path = Path(RESOURCES_SERVERS_DIRNAME) / path
    if not path.is_absolute():
        path = cwd / path
    path = Path(os.path.normpath(path))
    name = path.name
    if not name.isidentifier() or keyword.iskeyword(name):
        hint = re.sub(r"\W+", "_", name).strip("_").lower() or "my_env"
        if hint[:1].isdigit():
            hint = "env_" + hint
        raise NeMoGymConfigError(
            f"Invalid server name {name!r}: the folder name is used as a Python package name, so it must be a Python "
            f"identifier (letters, digits and underscores, not starting with a digit, not a keyword), e.g. "
            f"+entrypoint=resources_servers/{hint}."
        )
    if path.parent.name != RESOURCES_SERVERS_DIRNAME:
        raise NeMoGymConfigError(
            f"{path} is not inside a `{RESOURCES_SERVERS_DIRNAME}` folder. ng_run finds resources servers as "
            f"{RESOURCES_SERVERS_DIRNAME}/<name>, so pass +entrypoint={RESOURCES_SERVERS_DIRNAME}/{name}."
        )
    if path.exists() or path.is_symlink():
        what = "folder" if path.is_dir() else "file"
        raise NeMoGymConfigError(
            f"{path} already exists (a {what}); ng_init_resources_server never overwrites anything. "
            f"Pick another name, or remove it first if you meant to start over."
        )
    return path


def render(template: str, values: dict[str, str]) -> str:
    text = template
    for key, value in values.items():
        text = text.replace(f"@@{key}@@", value)
    left = _PLACEHOLDER_RE.search(text)
    if left:  # a template bug, not a user error
        raise RuntimeError(f"unfilled placeholder {left.group(0)} in a scaffold template")
    return text


def scaffold_resources_server(entrypoint: str, *, cwd: Optional[Path] = None) -> Path:
    """Create the server folder from the templates and return its absolute path."""
    target = resolve_target(entrypoint, cwd)
    name = target.name
    values = {"name": name, "Title": title_case(name), "requirement": framework_requirement_line(target)}

    parent = target.parent
    parent.mkdir(parents=True, exist_ok=True)
    created_package_init = False
    if not (parent / "__init__.py").exists():
        (parent / "__init__.py").write_text("")
        created_package_init = True

    staging = Path(tempfile.mkdtemp(prefix=f".{name}.scaffold-", dir=parent))
    try:
        for template_name, relative in TEMPLATE_FILES.items():
            out = staging / relative.format(name=name)
            out.parent.mkdir(parents=True, exist_ok=True)
            out.write_text(render((TEMPLATE_DIR / template_name).read_text(encoding="utf-8"), values), encoding="utf-8")
        for relative in EMPTY_FILES:
            (staging / relative).parent.mkdir(parents=True, exist_ok=True)
            (staging / relative).write_text("")
        example_fpath = f"{RESOURCES_SERVERS_DIRNAME}/{name}/data/example.jsonl"  # as the config lists it
        write_example_metrics(staging / "data" / "example.jsonl", example_fpath)
        staging.chmod(0o777 & ~_umask())  # mkdtemp makes it private; give it the mode mkdir would
        if target.exists():  # created meanwhile by someone else: still never overwrite
            raise NeMoGymConfigError(f"{target} appeared while scaffolding; nothing was written.")
        os.rename(staging, target)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        if created_package_init:
            (parent / "__init__.py").unlink(missing_ok=True)
        raise
    return target


def _umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def write_example_metrics(example_path: Path, jsonl_fpath: str) -> Path:
    """Write `example_metrics.json` next to the example rows, exactly as `ng_prepare_data +mode=example_validation`
    would for the config's `example` dataset (so the scaffold passes `ng_test +should_validate_data=true`)."""
    import json

    from nemo_gym.config.types import DatasetConfig
    from nemo_gym.rollouts.data_prep import PLACEHOLDER_METRICS_KEY, DatasetMetricsAccumulator, metrics_document

    dataset = DatasetConfig(name="example", type="example", jsonl_fpath=jsonl_fpath, license="Apache 2.0")
    accumulator = DatasetMetricsAccumulator()
    for line in example_path.read_text(encoding="utf-8").splitlines():
        if line.strip():
            accumulator.add_row(json.loads(line))
    out = example_path.with_name("example_metrics.json")
    # Marked as measured on placeholder rows, so ng_prepare_data replaces it once the real rows are in.
    document = {**metrics_document(dataset, accumulator), PLACEHOLDER_METRICS_KEY: True}
    out.write_text(json.dumps(document, indent=4) + "\n", encoding="utf-8")
    return out


def _display(path: Path, cwd: Path) -> str:
    try:
        return str(path.relative_to(cwd))
    except ValueError:
        return str(path)


def next_steps(target: Path, cwd: Path) -> str:
    """What to do after scaffolding, with commands that work from `cwd`."""
    name = target.name
    rel = _display(target, cwd)
    root = target.parent.parent  # the folder that holds resources_servers/: data paths in the config start there
    configs = f"resources_servers/{name}/configs/{name}.yaml,{MODEL_CONFIG}"
    files = ("app.py", f"configs/{name}.yaml", "data/example.jsonl", "tests/test_app.py", "tests/test_e2e.py",
             "README.md")
    lines = [f"Created resources server `{name}` in {rel}:", *(f"  {rel}/{f}" for f in files), "", "Next steps:"]
    if root != cwd:
        lines.append(f"  (run the commands from {root}: the paths in the config are relative to it)")
    lines += [
        f"  1. Run its tests:         ng_test +entrypoint={rel}",
        "  2. Make it yours:         the tool and verify in app.py, the rows of data/example.jsonl (keep 5), the",
        "                            tests, the README; set `domain` in the config.",
        "  3. After changing data/example.jsonl, measure it again (rewrites data/example_metrics.json):",
        f"     ng_prepare_data \"+config_paths=[{configs}]\" +output_dirpath=results/example_validation/{name} "
        "+mode=example_validation +overwrite_metrics_conflicts=true",
        f"  4. Check tests and data:  ng_test +entrypoint={rel} +should_validate_data=true",
        "  5. Run it against a model (policy_base_url, policy_api_key, policy_model_name in env.yaml):",
        f"     ng_run \"+config_paths=[{configs}]\"",
        f"     ng_collect_rollouts +agent_name={name}_simple_agent "
        f"+input_jsonl_fpath=resources_servers/{name}/data/example.jsonl +output_jsonl_fpath=results/{name}.jsonl",
        "See docs/writing-an-environment.md for how rollouts, tools, verify and datasets fit together.",
    ]
    return "\n".join(lines) + "\n"

