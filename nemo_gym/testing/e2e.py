"""End-to-end harness for environment tests: a real `ng_run` stack + `ng_collect_rollouts` over a server's examples.

The stack is the server's own config (its resources server and `<name>_simple_agent`) plus `openai_model` pointed
at the scripted fake LLM backend; only the LLM is fake. Typical use in `resources_servers/<name>/tests/test_e2e.py`:

    from nemo_gym.testing.e2e import collect_examples_e2e

    def test_examples_end_to_end(tmp_path):
        rows = collect_examples_e2e("mcqa", tmp_path, script=[{"match": {...}, "output": ["\\\\boxed{B}"]}, ...])
        assert [r["reward"] for r in rows] == [1.0, 1.0, 0.0, 1.0, 1.0]

`script` is a list of fake-backend rules (see `nemo_gym.testing.fake_openai_server`) or a path to a rules file;
`backend_args` passes other fake-backend flags instead (e.g. `["--tool-args", '{"city": "Oslo"}']`).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Optional, Sequence, Union

from nemo_gym import PARENT_DIR
from nemo_gym.testing.stack import FakeLLMBackend, NgRunStack, fake_llm_overrides, free_port

OPENAI_MODEL_CONFIG = "responses_api_models/openai_model/configs/openai_model.yaml"


def collect_examples_e2e(
    server_name: str,
    tmp_path: Path,
    *,
    script: Union[None, str, Path, list] = None,
    backend_args: Sequence[str] = (),
    config_paths: Optional[Sequence[str]] = None,
    agent_name: Optional[str] = None,
    input_jsonl: Optional[str] = None,
    extra_overrides: Sequence[str] = (),
    collect_overrides: Sequence[str] = (),
    ready_timeout: float = 180.0,
    project_dir: Optional[Path] = None,
) -> list[dict]:
    """Run the server's example dataset through a real stack and return the rollout rows in task order.

    `project_dir` is where `ng_run` starts and the server folder is found (default: the nemo_gym checkout); the
    config paths are relative to it. Raises AssertionError with the stack's output if collection exits non-zero."""
    project_dir = Path(project_dir or PARENT_DIR)
    tmp_path = Path(tmp_path)
    args = list(backend_args)
    if script is not None:
        if isinstance(script, (list, tuple)):
            script_path = tmp_path / "fake_llm_script.json"
            script_path.write_text(json.dumps(list(script)))
        else:
            script_path = Path(script)
        args += ["--script", str(script_path)]
    head_port = free_port()
    configs = list(config_paths or [f"resources_servers/{server_name}/configs/{server_name}.yaml", OPENAI_MODEL_CONFIG])
    agent = agent_name or f"{server_name}_simple_agent"
    input_path = input_jsonl or str(project_dir / "resources_servers" / server_name / "data" / "example.jsonl")
    output_path = tmp_path / "rollouts.jsonl"
    backend = FakeLLMBackend(*args)
    stack = None
    try:
        backend.wait_ready()
        stack = NgRunStack([*fake_llm_overrides(configs, backend.base_url, head_port), *extra_overrides], cwd=project_dir)
        stack.wait_for("servers ready!", timeout=ready_timeout)
        collect = subprocess.run(
            [sys.executable, "-c", "from nemo_gym.cli import collect_rollouts; collect_rollouts()",
             f"+agent_name={agent}", f"+input_jsonl_fpath={input_path}", f"+output_jsonl_fpath={output_path}",
             f"+head_server.port={head_port}", "+progress_bar=false", *collect_overrides],
            cwd=tmp_path, capture_output=True, text=True, env={**os.environ, "PYTHONUNBUFFERED": "1"}, timeout=600,
        )
        if collect.returncode != 0:
            raise AssertionError(
                f"ng_collect_rollouts exited {collect.returncode}\n--- stdout\n{collect.stdout}\n--- stderr\n"
                f"{collect.stderr}\n--- stack\n{stack.tail(80)}\n--- fake LLM\n{backend.tail(40)}"
            )
    finally:
        if stack is not None:
            stack.stop(timeout=60)
        backend.stop()
    rows = [json.loads(line) for line in output_path.read_text().splitlines() if line.strip()]
    return sorted(rows, key=lambda r: (r["_ng_task_index"], r["_ng_rollout_index"]))
