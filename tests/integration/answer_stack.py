"""Rollouts collected by a real stack of tests/fixtures/stack's answer checker, for the tests of the commands that
read rollouts files (`ng reverify`, the bad-lines policy of view / export / reverify / merge).

The stack is `ng_run` with openai_model in front of the scripted fake LLM, simple_agent and the answer checker
(which grades case-sensitively against the task's `expected_answer`); the collection is `ng_collect_rollouts` run as
a child process, as a user runs it.
"""

from __future__ import annotations

import json
import sys
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

from nemo_gym.testing.script import answer_rule
from nemo_gym.testing.stack import ChildProcess, FakeLLMBackend, NgRunStack, fake_llm_overrides
from tests.conftest import FIXTURE_STACK, free_port

COLLECT = [sys.executable, "-c", "from nemo_gym.cli import collect_rollouts; collect_rollouts()"]


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


@contextmanager
def collected_answers(tmp: Path, answers: dict[str, tuple[str, str]], num_repeats: int = 2) -> Iterator[tuple[Path, int]]:
    """Collect `num_repeats` rollouts of each question of `answers` (question -> (the fake model's answer, the
    expected answer)) into `tmp/rollouts.jsonl`; yields (that path, the head server's port) while the stack still
    runs, and stops it after."""
    script = write_jsonl(tmp / "script.jsonl", [answer_rule(q, a) for q, (a, _) in answers.items()])
    tasks = [
        {"responses_create_params": {"input": [{"role": "user", "content": q}]}, "expected_answer": expected}
        for q, (_, expected) in answers.items()
    ]
    write_jsonl(tmp / "tasks.jsonl", tasks)
    head_port = free_port()
    with FakeLLMBackend("--script", str(script)) as backend:
        overrides = fake_llm_overrides(["configs/reverify.yaml"], backend.base_url, head_port)
        stack = NgRunStack(overrides, cwd=FIXTURE_STACK)
        try:
            stack.wait_for("All 3 / 3 servers ready!", timeout=180)
            collect = ChildProcess(
                [
                    *COLLECT, f"+head_server.port={head_port}", "+agent_name=answer_agent",
                    f"+input_jsonl_fpath={tmp / 'tasks.jsonl'}", f"+output_jsonl_fpath={tmp / 'rollouts.jsonl'}",
                    f"+num_repeats={num_repeats}", "+progress_bar=false",
                ],
                cwd=tmp,
            )  # fmt: skip
            assert collect.wait(timeout=300) == 0, collect.output
            yield tmp / "rollouts.jsonl", head_port
        finally:
            assert stack.stop(timeout=60) == 0, stack.tail()
