"""`ng export {sft,dpo,tokens}` on rollout files of the shape `ng_collect_rollouts` writes: what each kind keeps,
the rows it writes (read back from JSONL and, with pyarrow, from Parquet), the drop counts, and the command line.
tests/integration/test_export.py does the same on rollouts collected from a real stack, and runs `ng_export` as a
child process without pyarrow."""

from __future__ import annotations

import json
import random
import re
from pathlib import Path
from typing import Any, Optional

import pyarrow.parquet as pq
import pytest

from nemo_gym.cli.commands.export import COMMAND
from nemo_gym.testing.responses import function_call, function_call_output, make_response, message, reasoning
from nemo_gym.workbench.export import ExportConfig, choose_pairs, export_rollouts
from nemo_gym.workbench.task_groups import Member

TOOLS = [
    {
        "type": "function",
        "name": "add",
        "description": "add to the counter",
        "parameters": {"type": "object", "properties": {"count": {"type": "integer"}}, "required": ["count"]},
        "strict": False,
    }
]
CHAT_TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "add",
            "description": "add to the counter",
            "parameters": {"type": "object", "properties": {"count": {"type": "integer"}}, "required": ["count"]},
            "strict": False,
        },
    }
]


def rollout(
    task: int,
    index: int,
    reward: Any,
    *output: Any,
    text: str = "please add 2",
    tools: Optional[list] = TOOLS,
    **extra: Any,
) -> dict:
    """A rollout line as `ng_collect_rollouts` writes it (the agent's /run answer plus the index keys)."""
    params = {"input": [{"role": "system", "content": "You count."}, {"role": "user", "content": text}], "seed": index}
    if tools:
        params["tools"] = tools
    response = make_response(*(output or ("ok",))).model_dump(mode="json")
    return {
        "responses_create_params": params,
        "agent_ref": {"name": "counter_agent"},
        "_ng_task_index": task,
        "_ng_rollout_index": index,
        "response": response,
        "reward": reward,
        **extra,
    }


def tool_episode(count: int, call_id: str = "call_1") -> list[dict]:
    return [
        reasoning("I add.", item_id=f"rs_{call_id}"),
        function_call("add", {"count": count}, call_id=call_id),
        function_call_output({"count": count + 1}, call_id=call_id),
        message(f"now {count + 1}", msg_id=f"msg_{call_id}"),
    ]


def write_jsonl(path: Path, rows: list) -> Path:
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return path


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def export(kind: str, inputs: Any, output: Path, **params: Any):
    config = ExportConfig.model_validate(
        {"kind": kind, "input_jsonl_fpath": [str(p) for p in inputs], "output_fpath": str(output), **params}
    )
    return export_rollouts(config)


def parquet_rows(path: Path) -> list[dict]:
    """Parquet rows in their JSONL shape: null message keys left out, `tools` decoded from its JSON text."""

    def clean(messages):
        return [{k: v for k, v in m.items() if v is not None} for m in messages]

    rows = []
    for row in pq.read_table(path).to_pylist():
        for key in ("messages", "prompt", "chosen", "rejected"):
            if key in row:
                row[key] = clean(row[key])
        if row.get("tools") is not None:
            row["tools"] = json.loads(row["tools"])
        rows.append(row)
    return rows


def jsonl_as_parquet_sees_it(rows: list[dict]) -> list[dict]:
    """JSONL rows with the keys a Parquet round trip loses (null content) left out the same way."""
    out = []
    for row in rows:
        row = dict(row)
        for key in ("messages", "prompt", "chosen", "rejected"):
            if key in row:
                row[key] = [{k: v for k, v in m.items() if v is not None} for m in row[key]]
        out.append(row)
    return out


# ------------------------------------------------------------------------------------------------ sft


EXPECTED_TOOL_EPISODE = [
    {"role": "system", "content": "You count."},
    {"role": "user", "content": "please add 2"},
    {
        "role": "assistant",
        "content": "<think>I add.</think>",
        "tool_calls": [{"id": "call_1", "type": "function", "function": {"name": "add", "arguments": '{"count": 2}'}}],
    },
    {"role": "tool", "tool_call_id": "call_1", "content": '{"count": 3}'},
    {"role": "assistant", "content": "now 3"},
]


def test_sft_rows_are_chat_messages_with_tool_calls_and_tools_in_jsonl_and_parquet(tmp_path):
    rows = [rollout(0, 0, 1.0, *tool_episode(2)), rollout(1, 0, 0.5, "hi there", tools=None)]
    rollouts = write_jsonl(tmp_path / "r.jsonl", rows)
    report = export("sft", [rollouts], tmp_path / "sft.jsonl")
    assert (report.read, report.kept, dict(report.dropped)) == (2, 2, {})
    first, second = read_jsonl(tmp_path / "sft.jsonl")
    assert first == {
        "messages": EXPECTED_TOOL_EPISODE,
        "tools": CHAT_TOOLS,
        "reward": 1.0,
        "agent_name": "counter_agent",
        "_ng_task_index": 0,
        "_ng_rollout_index": 0,
    }
    assert second["messages"][-1] == {"role": "assistant", "content": "hi there"} and second["tools"] is None

    export("sft", [rollouts], tmp_path / "sft.parquet")
    assert parquet_rows(tmp_path / "sft.parquet") == jsonl_as_parquet_sees_it([first, second])


@pytest.mark.parametrize(
    "mode, assistant",
    [
        ("think", {"content": "<think>I add.</think>"}),
        ("field", {"content": "", "reasoning_content": "I add."}),
        ("drop", {"content": None}),
    ],
)
def test_sft_reasoning_is_kept_in_the_content_as_a_field_or_dropped(tmp_path, mode, assistant):
    rollouts = write_jsonl(tmp_path / "r.jsonl", [rollout(0, 0, 1.0, *tool_episode(2))])
    export("sft", [rollouts], tmp_path / "sft.jsonl", reasoning=mode)
    (row,) = read_jsonl(tmp_path / "sft.jsonl")
    call = row["messages"][2]
    assert {k: v for k, v in call.items() if k not in ("role", "tool_calls")} == assistant
    assert call["tool_calls"][0]["function"]["name"] == "add"
    export("sft", [rollouts], tmp_path / "sft.parquet", reasoning=mode)
    assert parquet_rows(tmp_path / "sft.parquet") == jsonl_as_parquet_sees_it([row])


def test_sft_keeps_rewards_at_the_threshold_and_counts_every_dropped_line(tmp_path):
    good = rollout(0, 0, 1.0, *tool_episode(2))
    rows = [
        good,
        rollout(0, 1, 0.25),
        rollout(1, 0, None),
        {"_ng_task_index": 2, "_ng_rollout_index": 0, "error_type": "HTTPError", "message": "503", "row": {}},
        {"responses_create_params": {"input": "x"}, "_ng_task_index": 3, "_ng_rollout_index": 0},  # materialized input
        rollout(4, 0, 1.0, "cut", tools=None) | {"response": {**make_response("cut").model_dump(mode="json"),
                                                            "status": "incomplete",
                                                            "incomplete_details": {"reason": "max_output_tokens"}}},
        rollout(5, 0, 0.5),
    ]
    path = write_jsonl(tmp_path / "r.jsonl", rows)
    report = export("sft", [path], tmp_path / "sft.jsonl", min_reward=0.5)
    assert report.read == 7 and report.kept == 2 and report.bad_lines.count == 0
    assert dict(report.dropped) == {
        "below_min_reward": 1,
        "no_reward": 1,
        "failed_rollout": 1,
        "no_response": 1,
        "incomplete_response": 1,
    }
    assert [r["reward"] for r in read_jsonl(tmp_path / "sft.jsonl")] == [1.0, 0.5]
    text = "\n".join(report.lines())
    assert "kept 2 rows" in text and "dropped 5 rollout(s)" in text and "incomplete_response" in text

    kept = export("sft", [path], tmp_path / "all.jsonl", include_incomplete=True)
    assert kept.kept == 5 and "incomplete_response" not in kept.dropped  # no threshold: rewardless rows too


def test_sft_best_of_k_keeps_the_best_rollouts_of_each_task_first_in_file_order_on_ties(tmp_path):
    rows = [rollout(0, i, r) for i, r in enumerate([0.2, 0.9, 0.9, 0.1])]
    rows += [rollout(1, i, r, text="other task") for i, r in enumerate([0.0, 0.7])]
    path = write_jsonl(tmp_path / "r.jsonl", rows)
    report = export("sft", [path], tmp_path / "best.jsonl", best_of_k=1)
    assert report.kept == 2 and dict(report.dropped) == {"not_best_of_k": 4}
    kept = read_jsonl(tmp_path / "best.jsonl")
    assert [(r["_ng_task_index"], r["_ng_rollout_index"]) for r in kept] == [(0, 1), (1, 1)]
    two = export("sft", [path], tmp_path / "best2.parquet", best_per_task=2)
    assert two.kept == 4
    assert [(r["_ng_task_index"], r["_ng_rollout_index"]) for r in parquet_rows(tmp_path / "best2.parquet")] == [
        (0, 1), (0, 2), (1, 0), (1, 1)
    ]


def test_developer_messages_can_become_system_messages(tmp_path):
    row = rollout(0, 0, 1.0)
    row["responses_create_params"]["input"][0]["role"] = "developer"
    row["responses_create_params"]["instructions"] = "Be brief."
    path = write_jsonl(tmp_path / "r.jsonl", [row])
    for as_system, roles in ((False, ["system", "developer", "user"]), (True, ["system", "system", "user"])):
        export("sft", [path], tmp_path / "sft.jsonl", developer_as_system=as_system)
        (out,) = read_jsonl(tmp_path / "sft.jsonl")
        assert [m["role"] for m in out["messages"][:3]] == roles
        assert [m["content"] for m in out["messages"][:3]] == ["Be brief.", "You count.", "please add 2"]


def test_non_text_content_is_refused_with_its_reason(tmp_path):
    row = rollout(0, 0, 1.0)
    row["responses_create_params"]["input"][1]["content"] = [
        {"type": "input_text", "text": "what is this?"},
        {"type": "input_image", "image_url": "data:image/png;base64,AAAA"},
    ]
    path = write_jsonl(tmp_path / "r.jsonl", [row, rollout(1, 0, 1.0)])
    report = export("sft", [path], tmp_path / "sft.jsonl")
    assert report.kept == 1 and dict(report.dropped) == {"non_text_content": 1}
    assert "image_url" in report.examples["non_text_content"]  # the part as the chat conversion names it


# ------------------------------------------------------------------------------------------------ dpo


def test_dpo_pairs_best_with_worst_per_task_with_the_prompt_split_out(tmp_path):
    rows = [
        rollout(0, 0, 0.0, *tool_episode(1)),
        rollout(0, 1, 1.0, *tool_episode(2, call_id="call_2")),
        rollout(0, 2, 0.5, "not sure"),
        rollout(1, 0, 1.0, "only one", text="another task"),
    ]
    path = write_jsonl(tmp_path / "r.jsonl", rows)
    report = export("dpo", [path], tmp_path / "dpo.jsonl")
    assert (report.kept, report.paired_rollouts) == (1, 2)
    assert dict(report.dropped) == {"not_paired": 1, "alone_in_task": 1}
    (pair,) = read_jsonl(tmp_path / "dpo.jsonl")
    assert pair["prompt"] == EXPECTED_TOOL_EPISODE[:2]
    assert pair["chosen"][0]["tool_calls"][0]["id"] == "call_2" and pair["chosen"][-1]["content"] == "now 3"
    assert pair["rejected"][-1] == {"role": "assistant", "content": "now 2"}
    assert {m["role"] for m in pair["chosen"] + pair["rejected"]} == {"assistant", "tool"}
    assert (pair["chosen_reward"], pair["rejected_reward"]) == (1.0, 0.0)
    assert (pair["chosen_rollout_index"], pair["rejected_rollout_index"], pair["_ng_task_index"]) == (1, 0, 0)
    assert pair["tools"] == CHAT_TOOLS

    export("dpo", [path], tmp_path / "dpo.parquet")
    assert parquet_rows(tmp_path / "dpo.parquet") == jsonl_as_parquet_sees_it([pair])


def test_dpo_pairs_obey_the_margin_the_chosen_threshold_and_the_pair_cap(tmp_path):
    rewards = {0: [0.0, 0.2, 0.6, 1.0], 1: [0.5, 0.6], 2: [0.3, 0.3, 0.3], 3: [0.1, 0.4]}
    rows = [
        rollout(t, i, r, f"answer {t}.{i}", text=f"task {t}") for t, rs in rewards.items() for i, r in enumerate(rs)
    ]
    path = write_jsonl(tmp_path / "r.jsonl", rows)

    report = export("dpo", [path], tmp_path / "dpo.jsonl", min_margin=0.3, pairs_per_task=2)
    pairs = read_jsonl(tmp_path / "dpo.jsonl")
    assert [(p["_ng_task_index"], p["chosen_reward"], p["rejected_reward"]) for p in pairs] == [
        (0, 1.0, 0.0), (0, 0.6, 0.2), (3, 0.4, 0.1)
    ]
    assert all(p["chosen_reward"] - p["rejected_reward"] >= 0.3 for p in pairs)
    assert dict(report.dropped) == {"margin_below_min": 5}  # task 1 (margin 0.1) and task 2 (all equal)

    report = export("dpo", [path], tmp_path / "dpo2.jsonl", min_reward=0.5)
    pairs = read_jsonl(tmp_path / "dpo2.jsonl")
    assert [(p["_ng_task_index"], p["chosen_reward"]) for p in pairs] == [(0, 1.0), (1, 0.6)]
    assert report.dropped["below_min_reward"] == 2 + 3  # tasks 3 and 2: best below 0.5
    assert report.dropped["not_paired"] == 2


def test_dpo_groups_by_task_and_prompt_across_files(tmp_path):
    # Two runs that both number their tasks from 0: same index, different prompts, are different tasks.
    a = write_jsonl(tmp_path / "a.jsonl", [rollout(0, 0, 1.0, "A good", text="task A"),
                                           rollout(0, 1, 0.0, "A bad", text="task A")])
    b = write_jsonl(tmp_path / "b.jsonl", [rollout(0, 0, 0.0, "B bad", text="task B"),
                                           rollout(0, 2, 1.0, "B good", text="task B")])
    report = export("dpo", [a, b], tmp_path / "dpo.jsonl")
    assert report.files == 2 and report.kept == 2
    pairs = read_jsonl(tmp_path / "dpo.jsonl")
    for pair in pairs:
        task = pair["prompt"][1]["content"][-1]
        assert pair["chosen"][0]["content"] == f"{task} good" and pair["rejected"][0]["content"] == f"{task} bad"


def test_choose_pairs_never_breaks_its_rules_on_random_groups():
    rng = random.Random(7)
    for _ in range(500):
        members = [Member(seq, rng.choice([0.0, 0.25, 0.5, 1.0, rng.random()])) for seq in range(rng.randint(1, 8))]
        min_margin, min_reward, cap = rng.choice([0.0, 0.3, 0.6]), rng.choice([None, 0.5]), rng.randint(1, 4)
        pairs = choose_pairs(members, min_margin=min_margin, min_reward=min_reward, max_pairs=cap)
        used = [m.seq for pair in pairs for m in pair]
        assert len(used) == len(set(used)) and len(pairs) <= cap
        for chosen, rejected in pairs:
            margin = chosen.reward - rejected.reward
            assert margin > 0 and margin >= min_margin
            assert min_reward is None or chosen.reward >= min_reward
        best, worst = max(m.reward for m in members), min(m.reward for m in members)
        if best - worst > 0 and best - worst >= min_margin and (min_reward is None or best >= min_reward):
            assert pairs and pairs[0][0].reward == best and pairs[0][1].reward == worst


# ------------------------------------------------------------------------------------------------ tokens


def with_tokens(item: dict, prompt: list[int], generation: list[int], log_probs: Optional[list[float]] = None) -> dict:
    lps = log_probs if log_probs is not None else [-0.5] * len(generation)
    return {**item, "prompt_token_ids": prompt, "generation_token_ids": generation, "generation_log_probs": lps}


def test_tokens_join_the_model_calls_with_a_loss_mask_over_what_the_model_generated(tmp_path):
    call = with_tokens(function_call("add", {"count": 2}), [1, 2, 3], [10, 11], [-0.1, -0.2])
    answer = with_tokens(message("now 3"), [1, 2, 3, 10, 11, 20, 21, 22], [30], [-0.3])
    rows = [
        rollout(0, 0, 1.0, reasoning("hm"), call, function_call_output({"count": 3}), answer),
        rollout(0, 1, 1.0, "no tokens"),
        rollout(0, 2, 1.0, with_tokens(function_call("add", {}), [1], [5]), function_call_output("x"),
                with_tokens(message("y"), [9, 9], [6])),  # the second prompt re-renders the first call
        rollout(0, 3, 1.0, with_tokens(function_call("add", {}), [1], [5]), function_call_output("x"), message("y")),
        rollout(0, 4, 1.0, with_tokens(message("z"), [1], [5, 6], [-1.0])),
    ]
    path = write_jsonl(tmp_path / "r.jsonl", rows)
    report = export("tokens", [path], tmp_path / "tokens.jsonl")
    assert report.kept == 1
    assert dict(report.dropped) == {"no_token_data": 1, "tokens_not_contiguous": 1, "token_data_mismatch": 2}
    (row,) = read_jsonl(tmp_path / "tokens.jsonl")
    assert row == {
        "prompt_token_ids": [1, 2, 3],
        "generation_token_ids": [10, 11, 20, 21, 22, 30],
        "generation_log_probs": [-0.1, -0.2, 0.0, 0.0, 0.0, -0.3],
        "loss_mask": [1, 1, 0, 0, 0, 1],
        "num_model_calls": 2,
        "token_trajectory": "exact",
        "reward": 1.0,
        "agent_name": "counter_agent",
        "_ng_task_index": 0,
        "_ng_rollout_index": 0,
    }
    export("tokens", [path], tmp_path / "tokens.parquet")
    assert pq.read_table(tmp_path / "tokens.parquet").to_pylist() == [row]


def test_tokens_mark_re_tokenized_rollouts_keep_them_by_default_and_drop_them_on_request(tmp_path, capsys):
    """The drift check: a model call that says `token_trajectory: retokenized` makes its rollout `retokenized`
    (kept and marked, or dropped with --drop-retokenized); the counts exact / re-tokenized / unusable are printed."""
    def episode(flag: Optional[str]) -> list[dict]:
        second = with_tokens(message("done"), [1, 2, 5, 7], [8])
        return [with_tokens(function_call("add", {}), [1, 2], [5]), function_call_output("x"),
                second if flag is None else {**second, "token_trajectory": flag}]

    rows = [
        rollout(0, 0, 1.0, *episode(None)),  # older data: no flag, contiguous -> exact
        rollout(0, 1, 1.0, *episode("exact")),
        rollout(0, 2, 1.0, *episode("retokenized")),  # contiguous, but the server says it re-tokenized
        rollout(0, 3, 1.0, "no tokens"),
    ]
    path = write_jsonl(tmp_path / "r.jsonl", rows)
    out = tmp_path / "t.jsonl"
    assert COMMAND.main(["tokens", str(path), "-o", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "token trajectories: 2 exact, 1 re-tokenized, 1 unusable (no_token_data 1)" in printed
    assert "kept, marked token_trajectory=retokenized" in printed and "model call(s) 2" in printed
    got = {r["_ng_rollout_index"]: r["token_trajectory"] for r in read_jsonl(out)}
    assert got == {0: "exact", 1: "exact", 2: "retokenized"}
    assert read_jsonl(out)[2]["generation_token_ids"] == [5, 7, 8]  # still joined into one trajectory

    assert COMMAND.main(["tokens", str(path), "-o", str(tmp_path / "t.parquet"), "--drop-retokenized"]) == 0
    printed = capsys.readouterr().out
    assert "re-tokenized ones dropped" in printed and re.search(r"\b1\s+retokenized\s", printed)
    table = pq.read_table(tmp_path / "t.parquet").to_pylist()
    assert [(r["_ng_rollout_index"], r["token_trajectory"]) for r in table] == [(0, "exact"), (1, "exact")]


@pytest.mark.parametrize("suffix", [".jsonl", ".parquet"])
def test_nothing_to_export_writes_no_file_and_keeps_an_earlier_one(tmp_path, suffix):
    path = write_jsonl(tmp_path / "r.jsonl", [rollout(0, 0, 1.0)])
    report = export("tokens", [path], tmp_path / f"t{suffix}")
    assert report.kept == 0 and dict(report.dropped) == {"no_token_data": 1} and not report.written
    assert not (tmp_path / f"t{suffix}").exists() and not list(tmp_path.glob("t*.partial"))
    assert "no file written" in report.lines()[0]

    earlier = tmp_path / f"earlier{suffix}"
    earlier.write_bytes(b"an earlier export")
    export("tokens", [path], earlier)
    assert earlier.read_bytes() == b"an earlier export"


def test_a_bad_line_refuses_the_export_unless_skipped(tmp_path, capsys):
    rows = [rollout(0, 0, 1.0), "{torn", rollout(1, 0, 1.0), "[1, 2]", rollout(2, 0, 1.0)]
    path = write_jsonl(tmp_path / "r.jsonl", rows)
    with open(path, "a") as f:
        f.write('{"_ng_task_index": 3, "rew')  # a torn last line, no newline
    out = tmp_path / "sft.parquet"
    out.write_bytes(b"an earlier export")
    assert COMMAND.main(["sft", str(path), "-o", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: ng_export: {path}:2: not valid JSON (unexpected character")
    assert f"  {path}:4: a JSON list, not an object" in err
    assert f"  {path}:6: not valid JSON (" in err and "the last line has no newline" in err
    assert "3 bad lines (lines that are not JSON objects): nothing was written." in err
    assert "Fix or delete them, or pass --skip-bad-lines to skip them." in err
    assert out.read_bytes() == b"an earlier export" and not list(tmp_path.glob("*.partial"))

    assert COMMAND.main(["sft", str(path), "-o", str(out), "--skip-bad-lines"]) == 0
    captured = capsys.readouterr()
    assert "read 3 line(s) from 1 file (skipped 3 bad lines); kept 3 rows" in captured.out
    assert "warning: ng_export: skipped 3 bad lines (--skip-bad-lines):" in captured.err
    assert f"  {path}:4: a JSON list, not an object" in captured.err
    assert [r["_ng_task_index"] for r in parquet_rows(out)] == [0, 1, 2]


def test_only_bad_lines_skipped_is_nothing_kept(tmp_path, capsys):
    path = write_jsonl(tmp_path / "r.jsonl", ["{torn", "7"])
    out = tmp_path / "sft.jsonl"
    assert COMMAND.main(["sft", str(path), "-o", str(out), "--skip-bad-lines"]) == 1
    err = capsys.readouterr().err
    assert "no row kept: the input holds no rollout (skipped 2 bad lines); no file was written" in err
    assert not out.exists()


# ------------------------------------------------------------------------------------------------ command line


def test_the_command_line_takes_words_flags_and_overrides(tmp_path, capsys):
    a = write_jsonl(tmp_path / "a.jsonl", [rollout(0, 0, 1.0), rollout(0, 1, 0.0, "bad")])
    b = write_jsonl(tmp_path / "b.jsonl", [rollout(1, 0, 0.75, text="second")])
    out = tmp_path / "deep" / "sft.jsonl"
    assert COMMAND.main(["sft", str(a), str(b), "-o", str(out), "--min-reward", "0.5"]) == 0
    printed = capsys.readouterr().out
    assert f"read 3 line(s) from 2 files; kept 2 rows -> {out}" in printed and "below_min_reward" in printed
    assert [r["reward"] for r in read_jsonl(out)] == [1.0, 0.75]

    assert COMMAND.main(["+kind=dpo", f"+input_jsonl_fpath={a}", f"+output_fpath={tmp_path / 'd.parquet'}",
                         "+min_margin=0.5"]) == 0
    assert len(parquet_rows(tmp_path / "d.parquet")) == 1

    assert COMMAND.main(["sft", str(a), "-o", str(tmp_path / "best.jsonl"), "--best-per-task", "1",
                         "--developer-as-system", "--reasoning", "drop"]) == 0
    (best,) = read_jsonl(tmp_path / "best.jsonl")
    assert best["reward"] == 1.0

    assert COMMAND.main(["tokens", str(a), "-o", str(tmp_path / "t.jsonl")]) == 1  # nothing kept
    captured = capsys.readouterr()
    assert "no_token_data" in captured.out
    assert "error: ng_export: no row kept: 2 dropped (2 no_token_data); no file was written" in captured.err
    assert not (tmp_path / "t.jsonl").exists()


@pytest.mark.parametrize(
    "args, message",
    [
        (["sft", "{a}", "-o", "{tmp}/out.csv"], "+output_fpath="),
        (["sft", "{tmp}/missing.jsonl", "-o", "{tmp}/out.jsonl"], "+input_jsonl_fpath: file not found"),
        (["sft", "{a}", "-o", "{a}"], "is also an input file"),
        (["gold", "{a}", "-o", "{tmp}/out.jsonl"], "+kind"),
        (["sft", "{a}", "-o", "{tmp}/out.jsonl", "--min-margin", "-1"], "+min_margin"),
    ],
)
def test_bad_arguments_are_config_errors_that_name_the_key(tmp_path, capsys, args, message):
    a = write_jsonl(tmp_path / "a.jsonl", [rollout(0, 0, 1.0)])
    before = a.read_bytes()
    args = [arg.format(a=a, tmp=tmp_path) for arg in args]
    assert COMMAND.main(args) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ng_export: ") and message in err
    assert a.read_bytes() == before and not list(tmp_path.glob("out*"))


def test_hugging_face_datasets_loads_the_exports_when_installed(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")  # local files only; read when datasets is first imported
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    datasets = pytest.importorskip("datasets")
    rows = [rollout(0, 0, 1.0, *tool_episode(2)), rollout(0, 1, 0.0, "no")]
    path = write_jsonl(tmp_path / "r.jsonl", rows)
    export("sft", [path], tmp_path / "sft.parquet")
    export("dpo", [path], tmp_path / "dpo.jsonl")
    sft = datasets.load_dataset("parquet", data_files=str(tmp_path / "sft.parquet"), split="train")
    assert sft.num_rows == 2 and sft[0]["messages"][2]["tool_calls"][0]["function"]["name"] == "add"
    dpo = datasets.load_dataset("json", data_files=str(tmp_path / "dpo.jsonl"), split="train")
    assert dpo.column_names[:3] == ["prompt", "chosen", "rejected"] and dpo[0]["chosen_reward"] == 1.0


# ------------------------------------------------------------------------------------------------ multi-reward


def test_a_reward_component_is_the_reward_for_ranking_thresholds_and_the_exported_rows(tmp_path):
    """`reward_component=` picks one entry of a multi-reward verifier's `reward_components`: dpo ranks by it (here the
    opposite order to `reward`), sft thresholds by it, and a rollout without that component is dropped with a reason."""
    rows = [
        rollout(0, 0, 2.0, *tool_episode(1, "a"), reward_components={"correctness": 0.0, "format": 2.0}),
        rollout(0, 1, 1.0, *tool_episode(2, "b"), reward_components={"correctness": 1.0, "format": 0.0}),
        rollout(1, 0, 1.0, *tool_episode(3, "c")),
    ]
    src = [write_jsonl(tmp_path / "r.jsonl", rows)]

    by_reward = export("dpo", src, tmp_path / "by_reward.jsonl")
    by_component = export("dpo", src, tmp_path / "by_component.jsonl", reward_component="correctness")
    assert by_reward.kept == by_component.kept == 1
    chosen_by_reward = read_jsonl(tmp_path / "by_reward.jsonl")[0]
    chosen_by_component = read_jsonl(tmp_path / "by_component.jsonl")[0]
    assert chosen_by_reward["chosen"] != chosen_by_component["chosen"]
    assert chosen_by_component["chosen"] == chosen_by_reward["rejected"]
    assert by_component.dropped["no_reward"] == 1
    assert "correctness" in by_component.examples["no_reward"] and "none" in by_component.examples["no_reward"]

    sft = export("sft", src, tmp_path / "sft.jsonl", reward_component="correctness", min_reward=1.0)
    kept = read_jsonl(tmp_path / "sft.jsonl")
    assert sft.kept == 1 and kept[0]["reward"] == 1.0 and kept[0]["_ng_rollout_index"] == 1


def test_the_summary_says_what_it_dropped_in_the_outcome_words(tmp_path):
    """The words every tool uses (`nemo_gym.rollouts.outcome`): incomplete (with the reason) and failed (a failures
    line, or a response that failed) are counted apart from the other reasons; tokens keeps incomplete ones."""

    def cut(task: int) -> dict:
        row = rollout(task, 0, 1.0)
        row["response"].update(status="incomplete", incomplete_details={"reason": "max_output_tokens"})
        return row

    broken = rollout(3, 0, 1.0)
    broken["response"]["status"] = "failed"
    rows = [
        rollout(0, 0, 1.0),
        cut(1),
        cut(2),
        broken,
        {"_ng_task_index": 4, "_ng_rollout_index": 0, "error_type": "HTTPError", "message": "503", "row": {}},
        rollout(5, 0, 0.0),
    ]
    path = write_jsonl(tmp_path / "r.jsonl", rows)
    report = export("sft", [path], tmp_path / "sft.jsonl", min_reward=0.5)
    assert report.kept == 1 and dict(report.dropped) == {"incomplete_response": 2, "failed_rollout": 2, "below_min_reward": 1}
    text = "\n".join(report.lines())
    assert (
        "dropped 5 rollout(s): 2 incomplete (max_output_tokens), 2 failed (1 HTTPError, 1 response failed), "
        "1 for other reasons:"
    ) in text, text
    assert "incomplete: the response stopped early" in text and "failed: a line of a _failures.jsonl file" in text
    kept = export("sft", [path], tmp_path / "all.jsonl", include_incomplete=True)
    assert kept.kept == 4 and "0 incomplete, 2 failed" in "\n".join(kept.lines())
