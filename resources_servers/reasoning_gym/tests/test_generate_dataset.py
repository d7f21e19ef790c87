"""scripts/generate_dataset.py: rows the server accepts, reproducible files, offline generation and scoring."""

import ipaddress
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import reasoning_gym

from nemo_gym.openai_utils import NeMoGymResponse
from resources_servers.reasoning_gym.app import ReasoningGymVerifyRequest
from resources_servers.reasoning_gym.scripts.generate_dataset import (
    NOT_REPRODUCIBLE,
    SYSTEM_PROMPT,
    available_tasks,
    generate_rows,
    gold_check_failures,
    parse_tasks,
)

SERVER_DIR = Path(__file__).resolve().parents[1]
SCRIPT = SERVER_DIR / "scripts" / "generate_dataset.py"
REPO_ROOT = SERVER_DIR.parents[1]
EXAMPLE_ARGS = ["--tasks", "leg_counting,spell_backward,basic_arithmetic,word_sorting,knights_knaves", "--n", "5"]
PLACEHOLDER = NeMoGymResponse(id="resp_1", created_at=0, model="m", output=[]).model_dump(mode="json")

# Known at reasoning-gym 0.1.25. Rows without a gold answer (the scorer checks the model's solution instead):
NO_GOLD_ANSWER = {"boxnet", "graph_color", "propositional_logic", "rubiks_cube", "rush_hour"}
# Scorers that compare tuples in the metadata, which JSON turns into lists: their gold answers score 0.05.
NOT_GRADABLE_FROM_JSON = {"arc_agi", "rearc"}


def run_script(*args: str, env_hash_seed: str = "123", cwd: Path = REPO_ROOT) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONHASHSEED": env_hash_seed}
    return subprocess.run(
        [sys.executable, str(SCRIPT), *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=300
    )


@pytest.fixture
def no_network(monkeypatch):
    """Any connection or name lookup other than the loopback fails the test."""
    real_connect, real_getaddrinfo = socket.socket.connect, socket.getaddrinfo
    attempts = []

    def is_loopback(host) -> bool:
        if host in ("localhost", None):
            return True
        try:
            return ipaddress.ip_address(host).is_loopback
        except ValueError:
            return False

    def connect(sock, address):
        if sock.family in (socket.AF_INET, socket.AF_INET6) and not is_loopback(address[0]):
            attempts.append(address)
            raise OSError(f"network access in an offline test: {address}")
        return real_connect(sock, address)

    def getaddrinfo(host, *args, **kwargs):
        if not is_loopback(host):
            attempts.append(host)
            raise socket.gaierror(f"name lookup in an offline test: {host}")
        return real_getaddrinfo(host, *args, **kwargs)

    monkeypatch.setattr(socket.socket, "connect", connect)
    monkeypatch.setattr(socket, "getaddrinfo", getaddrinfo)
    yield attempts
    assert attempts == []


# ------------------------------------------------------------------------------------------------ rows


def test_parse_tasks():
    assert parse_tasks(" a, b,,a ,c ") == ["a", "b", "c"]


def test_rows_are_round_robin_and_valid_verify_requests(no_network):
    tasks = ["leg_counting", "spell_backward", "propositional_logic"]
    rows = generate_rows(tasks, 7, seed=3)
    assert [row["metadata"]["source_dataset"] for row in rows] == (tasks * 3)[:7]
    for row in rows:
        request = ReasoningGymVerifyRequest.model_validate({**row, "response": PLACEHOLDER})
        assert request.question == row["question"] and request.metadata["source_dataset"] in tasks
        assert row["responses_create_params"]["input"] == [
            {"role": "system", "content": SYSTEM_PROMPT},
            {"role": "user", "content": row["question"]},
        ]
        assert row["agent_ref"] == {"type": "responses_api_agents", "name": "reasoning_gym_simple_agent"}
    assert [row["answer"] is None for row in rows] == [False, False, True] * 2 + [False]
    assert gold_check_failures(rows) == {}


def test_rows_match_the_library_items():
    rows = generate_rows(["leg_counting", "spell_backward"], 4, seed=5)
    dataset = reasoning_gym.create_dataset("spell_backward", seed=5, size=2)
    assert [rows[1]["question"], rows[3]["question"]] == [dataset[0]["question"], dataset[1]["question"]]
    assert rows[3]["answer"] == dataset[1]["answer"]


def test_prompt_and_agent_can_be_changed_or_left_out():
    row = generate_rows(["leg_counting"], 1, seed=0, system_prompt="", agent_name=None)[0]
    assert row["responses_create_params"]["input"] == [{"role": "user", "content": row["question"]}]
    assert "agent_ref" not in row


def test_unknown_task_is_rejected():
    with pytest.raises(ValueError, match="unknown reasoning-gym task.*leg_countin"):
        generate_rows(["leg_countin"], 2, seed=0)
    with pytest.raises(ValueError, match="unknown"):
        generate_rows(["composite"], 2, seed=0)  # a mixer, not a task


def test_gold_check_catches_tasks_that_json_breaks():
    rows = generate_rows(["leg_counting", "arc_agi"], 2, seed=0)
    assert gold_check_failures(rows) == {"arc_agi": 0.05}


# ------------------------------------------------------------------------------------------------ the script


def test_script_is_reproducible_and_seeded(tmp_path):
    # ransom_note and word_ladder iterate over sets of strings: only a fixed hash seed keeps their output stable,
    # so the script sets one itself whatever the caller's is.
    args = ["--tasks", "ransom_note,word_ladder,leg_counting", "--n", "9"]
    outputs = []
    for name, seed, hash_seed in [("a", "0", "1"), ("b", "0", "2"), ("c", "1", "1")]:
        out = tmp_path / f"{name}.jsonl"
        done = run_script(*args, "--seed", seed, "--out", str(out), env_hash_seed=hash_seed)
        assert done.returncode == 0, done.stderr
        assert "wrote 9 rows" in done.stderr
        outputs.append(out.read_bytes())
    assert outputs[0] == outputs[1]
    assert outputs[0] != outputs[2]
    assert len(outputs[0].splitlines()) == 9


def test_example_data_is_what_the_script_writes(tmp_path):
    out = tmp_path / "example.jsonl"
    done = run_script(*EXAMPLE_ARGS, "--seed", "0", "--out", str(out))
    assert done.returncode == 0, done.stderr
    assert out.read_bytes() == (SERVER_DIR / "data" / "example.jsonl").read_bytes()


def test_script_errors(tmp_path):
    out = tmp_path / "x.jsonl"
    done = run_script("--tasks", "nope", "--n", "2", "--out", str(out))
    assert done.returncode == 2 and "unknown reasoning-gym task(s): nope" in done.stderr and not out.exists()

    done = run_script("--tasks", "arc_agi", "--n", "2", "--out", str(out))
    assert done.returncode == 2 and "arc_agi" in done.stderr and "--skip-gold-check" in done.stderr
    assert not out.exists()
    done = run_script("--tasks", "arc_agi", "--n", "2", "--out", str(out), "--skip-gold-check")
    assert done.returncode == 0 and len(out.read_text().splitlines()) == 2

    done = run_script("--n", "2", "--out", str(out))
    assert done.returncode == 2 and "--tasks and --out are required" in done.stderr
    done = run_script("--tasks", "leg_counting", "--n", "0", "--out", str(out))
    assert done.returncode == 2 and "--n must be at least 1" in done.stderr


def test_list_tasks():
    done = run_script("--list-tasks")
    assert done.returncode == 0
    names = done.stdout.split()
    assert "leg_counting" in names and "composite" not in names and names == sorted(names)


# ------------------------------------------------------------------------------------------------ offline sweep


def test_every_task_generates_and_scores_offline(no_network):
    """Every task of the pinned reasoning-gym version generates rows and scores its own gold answer as read back
    from JSON, with no network. The exceptions are the known lists above; list_functions ignores its seed."""
    tasks = available_tasks()
    assert len(tasks) == 105
    rows = generate_rows(tasks, 2 * len(tasks), seed=0)
    no_gold = {row["metadata"]["source_dataset"] for row in rows if row["answer"] is None}
    assert no_gold == NO_GOLD_ANSWER
    assert set(gold_check_failures(rows)) == NOT_GRADABLE_FROM_JSON

    again = generate_rows(tasks, 2 * len(tasks), seed=0)
    changed = {row["metadata"]["source_dataset"] for row, other in zip(rows, again) if row != other}
    assert changed == NOT_REPRODUCIBLE
