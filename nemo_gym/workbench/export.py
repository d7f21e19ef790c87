"""`ng export {sft,dpo,tokens}`: rollout files in, training data out (JSONL or Parquet, by the output's suffix).

- `sft`: one row per rollout with reward >= `min_reward` (all successful rollouts when unset): `messages` in OpenAI
  chat format (`nemo_gym.workbench.conversation`), `tools` when the task offered any, `reward`; with
  `best_per_task=k` only the k best rollouts of each task.
- `dpo`: pairs of rollouts of the same task, TRL's conversational preference format: `prompt` (the shared
  instructions and input), `chosen` and `rejected` (the two episodes' assistant and tool messages), their rewards.
  Pairing: the task's rollouts ranked by reward; best with worst, then second best with second worst, ..., while
  the chosen one's reward beats the rejected one's by more than 0 and by at least `min_margin`, the chosen one has
  at least `min_reward`, and at most `pairs_per_task` pairs (default 1: best against worst). Each rollout is in at
  most one pair.
- `tokens`: per rollout the token ids, log probs and loss mask the model server captured
  (`nemo_gym.workbench.tokens`), and `token_trajectory`, the drift check of that rollout: `exact` (every prompt
  continues the tokens before it and no model call says it was re-tokenized) or `retokenized` (joinable, but the
  model server says it rebuilt some prompt from text). Re-tokenized rollouts are kept and marked by default;
  `drop_retokenized=true` (`--drop-retokenized`) drops them under the reason `retokenized`. Unusable ones are
  dropped with their reason as before; the counts exact / re-tokenized / unusable are printed at the end.

`reward_component=<name>` (`--reward-component`) ranks and thresholds by one entry of a multi-reward verifier's
`reward_components` instead of `reward`, and exports that value as the row's reward.

Every rollout that is not exported is counted under a reason (`DROP_REASONS`), printed at the end with the first
example of each; the incomplete and failed ones are also counted in the words every tool uses for rollout outcomes
(`nemo_gym.rollouts.outcome`: "dropped 3 rollout(s): 2 incomplete (max_output_tokens), 1 failed (HTTPError), ...").
sft and tokens stream (one row in memory at a time); dpo and best-of-k group the repeats of each task in a
temporary SQLite file (`nemo_gym.workbench.task_groups`), so memory holds one task at a time.

Bad lines of the inputs (not JSON objects: bad JSON, a torn last line) follow the policy of every rollouts command
(`nemo_gym.rollouts.jsonl`): refused by default (exit 2, nothing written), skipped and listed with
`skip_bad_lines=true` (`--skip-bad-lines`). The output is written to a temporary name and renamed at the end; an
export that keeps no row writes no file.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Iterator, Literal, Mapping, Optional, Union

import orjson
from pydantic import Field

from nemo_gym.config.types import BaseNeMoGymCLIConfig
from nemo_gym.errors import NeMoGymConfigError
from nemo_gym.rollouts.collection import ROLLOUT_INDEX_KEY_NAME, TASK_INDEX_KEY_NAME
from nemo_gym.rollouts.jsonl import SKIP_BAD_LINES_HELP, BadLines, read_rows
from nemo_gym.rollouts.outcome import FAILED, INCOMPLETE, OutcomeCounts, line_outcome
from nemo_gym.workbench.conversation import (
    ChatOptions,
    Unusable,
    chat_tools,
    completion_messages,
    full_conversation,
    prompt_messages,
    response_output,
)
from nemo_gym.workbench.export_files import RowWriter, open_rows, output_format, require_pyarrow
from nemo_gym.workbench.task_groups import Member, TaskGroups, task_key
from nemo_gym.workbench.tokens import RETOKENIZED, TRAJECTORY_FLAG, TrajectoryCounts, classify_trajectory

__all__ = ["ExportConfig", "ExportReport", "DROP_REASONS", "choose_pairs", "export_rollouts"]

KINDS = ("sft", "dpo", "tokens")

# Why a rollout was not exported: the key it is counted under and what it means.
DROP_REASONS = {
    "failed_rollout": "failed: a line of a _failures.jsonl file, a result that declares a failure "
    "(`_ng_failure_class`, `_ng_no_persist`), or a response whose status is failed / cancelled or has an error",
    "no_response": "no `response.output` (not a rollout line)",
    "no_prompt": "no `responses_create_params`",
    "incomplete_response": "incomplete: the response stopped early (status incomplete, e.g. max_output_tokens); "
    "it was verified, --include-incomplete keeps it",
    "no_reward": "no numeric `reward`, which the reward threshold or the ranking needs",
    "below_min_reward": "reward below min_reward",
    "not_best_of_k": "not among the best_per_task best rollouts of its task",
    "unconvertible": "an item with no chat-format equivalent",
    "non_text_content": "an image, file or other non-text content part",
    "empty_output": "the response has no output items",
    "alone_in_task": "the only usable rollout of its task: nothing to pair it with",
    "margin_below_min": "no pair of the task's rollouts differs in reward by more than 0 and by at least min_margin",
    "not_paired": "its task gave pairs, but not with this rollout (ranked between the paired ones)",
    "no_token_data": "no token ids: the model server did not capture them (vllm_model return_token_id_information)",
    "token_data_mismatch": "token data missing on some model output, or ids and log probs of different lengths",
    "tokens_not_contiguous": "a model call's prompt does not start with the tokens before it (re-rendered history)",
    "retokenized": "the model server re-tokenized some prompt (token_trajectory: retokenized); "
    "dropped by +drop_retokenized=true",
}


class ExportConfig(BaseNeMoGymCLIConfig):
    """Export rollouts as training data: `sft` (chat `messages` of rollouts with reward >= min_reward), `dpo` (TRL
    preference pairs `prompt` / `chosen` / `rejected` from the repeats of each task) or `tokens` (token ids, log
    probs and loss mask captured by the model server). The output format follows the suffix: .jsonl or .parquet.
    Prints how many rows were kept and, per reason, how many rollouts were dropped; exits 1 (and writes no file)
    when nothing was kept. A line of the input that is not a JSON object refuses the export (exit 2) unless
    --skip-bad-lines.
    Example: ng export sft results/rollouts.jsonl -o sft.parquet --min-reward 1"""

    kind: Literal["sft", "dpo", "tokens"] = Field(description="What to export: sft, dpo or tokens.")
    input_jsonl_fpath: Union[str, list[str]] = Field(
        description="Rollout file(s) written by ng_collect_rollouts (a list for several)."
    )
    output_fpath: str = Field(description="Where to write: a .jsonl or .parquet path (parent folders are created).")
    min_reward: Optional[float] = Field(
        default=None,
        description="sft/tokens: keep rollouts with reward >= this (null = all); dpo: the chosen rollout needs it.",
    )
    min_margin: float = Field(
        default=0.0, ge=0, description="dpo: least reward difference of a pair (a pair always needs a difference > 0)."
    )
    pairs_per_task: int = Field(
        default=1, ge=1, description="dpo: most pairs per task (best vs worst, then 2nd best vs 2nd worst, ...)."
    )
    best_per_task: Optional[int] = Field(
        default=None, ge=1, alias="best_of_k", description="sft: keep only the k best rollouts of each task."
    )
    reasoning: Literal["think", "field", "drop"] = Field(
        default="think",
        description="sft/dpo: reasoning as <think>...</think> in the content (think), as a reasoning_content field "
        "(field), or left out (drop).",
    )
    developer_as_system: bool = Field(default=False, description="sft/dpo: write developer messages as system.")
    reward_component: Optional[str] = Field(
        default=None,
        description="Use this entry of a multi-reward verifier's `reward_components` as the reward (thresholds, "
        "ranking, the exported reward) instead of `reward`.",
    )
    include_incomplete: bool = Field(
        default=False, description="sft/dpo: also export responses that stopped early (e.g. max_output_tokens)."
    )
    drop_retokenized: bool = Field(
        default=False,
        description="tokens: drop rollouts whose model server re-tokenized a prompt (token_trajectory: retokenized). "
        "Default false: keep them, marked token_trajectory=retokenized in their row (exact ones say exact), and "
        "count them in the summary.",
    )
    skip_bad_lines: bool = Field(default=False, description=SKIP_BAD_LINES_HELP)

    def input_paths(self) -> list[Path]:
        names = [self.input_jsonl_fpath] if isinstance(self.input_jsonl_fpath, str) else list(self.input_jsonl_fpath)
        if not names:
            raise NeMoGymConfigError("+input_jsonl_fpath names no file: pass one or more rollout files.")
        return [Path(str(name)).expanduser() for name in names]


@dataclass
class ExportReport:
    """What an export did: lines read, rows written, and the dropped rollouts per reason (with a first example)."""

    kind: str
    output: Path
    files: int = 0
    read: int = 0
    kept: int = 0
    paired_rollouts: int = 0  # dpo: rollouts that went into the pairs
    dropped: Counter = field(default_factory=Counter)
    examples: dict[str, str] = field(default_factory=dict)
    trajectories: Optional[TrajectoryCounts] = None  # tokens: the drift check of every rollout classified
    drop_retokenized: bool = False
    outcomes: OutcomeCounts = field(default_factory=OutcomeCounts)  # the dropped incomplete and failed rollouts
    bad_lines: BadLines = field(default_factory=BadLines)  # lines of the inputs that are not JSON objects
    written: bool = False  # the output file was written (not when no row was kept)

    def drop(
        self, reason: str, detail: str = "", count: int = 1, rollout: Optional[Mapping[str, Any]] = None
    ) -> None:
        self.dropped[reason] += count
        if rollout is not None and reason in _OUTCOME_DROPS:  # counted in the outcome words too
            self.outcomes.add(line_outcome(rollout), count)
        if detail and reason not in self.examples:
            self.examples[reason] = detail

    @property
    def unit(self) -> str:
        return "pair" if self.kind == "dpo" else "row"

    def lines(self) -> list[str]:
        unit = self.unit + ("" if self.kept == 1 else "s")
        files = f"{self.files} file" + ("" if self.files == 1 else "s")
        head = f"ng export {self.kind}: read {self.read} line(s) from {files}"
        if self.bad_lines.count:
            head += f" ({self.bad_lines.summary()})"
        head += f"; kept {self.kept} {unit}"
        if self.kind == "dpo":
            head += f" (from {self.paired_rollouts} rollouts)"
        out = [f"{head} -> {self.output}" if self.written else f"{head}; no file written"]
        if self.trajectories is not None:
            counts = self.trajectories
            fate = "dropped" if self.drop_retokenized else f"kept, marked {TRAJECTORY_FLAG}={RETOKENIZED}"
            out.append(f"{counts.summary()}; re-tokenized ones {fate}")
            if counts.retokenized and RETOKENIZED in counts.examples:
                out.append(f"  first re-tokenized: {counts.examples[RETOKENIZED]}")
        total = sum(self.dropped.values())
        if total:
            other = total - self.outcomes.incomplete - self.outcomes.failed
            out.append(f"dropped {total} rollout(s): {self.outcomes.not_ok()}, {other} for other reasons:")
            width = max(len(reason) for reason in self.dropped)
            for reason, count in self.dropped.most_common():
                out.append(f"  {count:>8}  {reason:<{width}}  {DROP_REASONS.get(reason, '')}")
                if reason in self.examples:
                    out.append(f"  {'':>8}  {'':<{width}}  first: {self.examples[reason]}")
        return out


# ------------------------------------------------------------------------------------------------ per rollout


def _reward(rollout: Mapping[str, Any], component: Optional[str] = None) -> Optional[float]:
    """`reward`, or with `component` the `reward_components[component]` of a multi-reward verifier."""
    if component is None:
        value = rollout.get("reward")
    else:
        components = rollout.get("reward_components")
        value = components.get(component) if isinstance(components, Mapping) else None
    if isinstance(value, (int, float)) and not isinstance(value, bool) and not math.isnan(float(value)):
        return float(value)
    return None


def _no_reward(rollout: Mapping[str, Any], component: Optional[str]) -> Unusable:
    if component is None:
        return Unusable("no_reward", f"reward is {rollout.get('reward')!r}")
    components = rollout.get("reward_components")
    names = sorted(components) if isinstance(components, Mapping) else []
    return Unusable("no_reward", f"reward_components has no number `{component}` (it has: {', '.join(names) or 'none'})")


_OUTCOME_DROPS = ("incomplete_response", "failed_rollout")  # drop reasons that are outcomes (`rollouts/outcome.py`)


def _check_complete(rollout: Mapping[str, Any], config: ExportConfig, keep_incomplete: bool = False) -> None:
    """Refuse a failed rollout, and an incomplete one unless it is kept (`include_incomplete`, or `keep_incomplete`
    for `tokens`), as `nemo_gym.rollouts.outcome` tells them."""
    response_output(rollout)  # failed rollouts and rows without a response
    outcome = line_outcome(rollout)
    if outcome.kind == FAILED:
        raise Unusable("failed_rollout", f"failed ({outcome.reason})")
    if outcome.kind == INCOMPLETE and not (config.include_incomplete or keep_incomplete):
        raise Unusable("incomplete_response", f"incomplete ({outcome.reason or 'no reason given'})")


def _rated(rollout: Mapping[str, Any], config: ExportConfig, needs_reward: bool) -> Optional[float]:
    """The rollout's reward (None when it has none), refused when it is needed (`needs_reward`, or min_reward set)
    and missing, or below min_reward."""
    reward = _reward(rollout, config.reward_component)
    if reward is None and (needs_reward or config.min_reward is not None):
        raise _no_reward(rollout, config.reward_component)
    if config.min_reward is not None and reward is not None and reward < config.min_reward:
        raise Unusable("below_min_reward", f"reward {reward:g} < {config.min_reward:g}")
    return reward


def _meta(rollout: Mapping[str, Any]) -> dict[str, Any]:
    agent = rollout.get("agent_ref")
    task = rollout.get(TASK_INDEX_KEY_NAME)
    index = rollout.get(ROLLOUT_INDEX_KEY_NAME)
    return {
        "agent_name": agent.get("name") if isinstance(agent, Mapping) else None,
        TASK_INDEX_KEY_NAME: task if isinstance(task, int) else None,
        ROLLOUT_INDEX_KEY_NAME: index if isinstance(index, int) else None,
    }


def _options(config: ExportConfig) -> ChatOptions:
    return ChatOptions(reasoning=config.reasoning, developer_as_system=config.developer_as_system)


# ------------------------------------------------------------------------------------------------ kinds


def _export_sft(config: ExportConfig, rollouts: Iterable[dict], writer: RowWriter, report: ExportReport) -> None:
    options = _options(config)
    k = config.best_per_task
    groups = TaskGroups() if k else None
    try:
        for rollout in rollouts:
            try:
                _check_complete(rollout, config)
                reward = _rated(rollout, config, needs_reward=groups is not None)
                row = {"messages": full_conversation(rollout, options), "tools": chat_tools(rollout), "reward": reward,
                       **_meta(rollout)}
            except Unusable as exc:
                report.drop(exc.reason, exc.detail, rollout=rollout)
                continue
            if groups is None:
                writer.write(row)
                report.kept += 1
            else:
                groups.add(task_key(rollout), reward, orjson.dumps(row))
        if groups is None:
            return
        for group in groups.groups():
            ranked = sorted(group.members, key=lambda m: (-(m.reward or 0.0), m.seq))
            best = sorted(m.seq for m in ranked[:k])
            if len(ranked) > k:
                report.drop("not_best_of_k", count=len(ranked) - k)
            payloads = groups.payloads(group.gid, best)
            for seq in best:
                writer.write(orjson.loads(payloads[seq]))
                report.kept += 1
    finally:
        if groups is not None:
            groups.close()


def choose_pairs(
    members: list[Member], *, min_margin: float = 0.0, min_reward: Optional[float] = None, max_pairs: int = 1
) -> list[tuple[Member, Member]]:
    """The (chosen, rejected) pairs of one task's rollouts (see the module docstring): ranked by reward, ties in
    file order; best with worst inwards while the margin is > 0 and >= `min_margin` and the chosen reward >=
    `min_reward`, at most `max_pairs`."""
    ranked = sorted(members, key=lambda m: (-(m.reward or 0.0), m.seq))
    pairs: list[tuple[Member, Member]] = []
    i, j = 0, len(ranked) - 1
    while i < j and len(pairs) < max_pairs:
        chosen, rejected = ranked[i], ranked[j]
        margin = (chosen.reward or 0.0) - (rejected.reward or 0.0)
        if margin <= 0 or margin < min_margin or (min_reward is not None and (chosen.reward or 0.0) < min_reward):
            break
        pairs.append((chosen, rejected))
        i, j = i + 1, j - 1
    return pairs


def _export_dpo(config: ExportConfig, rollouts: Iterable[dict], writer: RowWriter, report: ExportReport) -> None:
    options = _options(config)
    with TaskGroups() as groups:
        for rollout in rollouts:
            try:
                _check_complete(rollout, config)
                reward = _reward(rollout, config.reward_component)
                if reward is None:
                    raise _no_reward(rollout, config.reward_component)
                shared = {"prompt": prompt_messages(rollout, options), "tools": chat_tools(rollout)}
                completion = completion_messages(rollout, options)
            except Unusable as exc:
                report.drop(exc.reason, exc.detail, rollout=rollout)
                continue
            meta = _meta(rollout)
            groups.add(
                task_key(rollout),
                reward,
                orjson.dumps({"messages": completion, "meta": meta}),
                shared=orjson.dumps({**shared, "meta": meta}),
            )

        for group in groups.groups():
            pairs = choose_pairs(
                group.members, min_margin=config.min_margin, min_reward=config.min_reward,
                max_pairs=config.pairs_per_task,
            )
            if not pairs:
                best = max((m.reward or 0.0) for m in group.members)
                if len(group.members) == 1:
                    report.drop("alone_in_task", count=1)
                elif config.min_reward is not None and best < config.min_reward:
                    report.drop("below_min_reward", f"best reward of a task {best:g} < {config.min_reward:g}",
                                count=len(group.members))
                else:
                    report.drop("margin_below_min", count=len(group.members))
                continue
            used = {m.seq for pair in pairs for m in pair}
            if len(group.members) > len(used):
                report.drop("not_paired", count=len(group.members) - len(used))
            payloads = {seq: orjson.loads(data) for seq, data in groups.payloads(group.gid, sorted(used)).items()}
            shared = orjson.loads(group.shared or b"{}")
            for chosen, rejected in pairs:
                writer.write(
                    {
                        "prompt": shared["prompt"],
                        "chosen": payloads[chosen.seq]["messages"],
                        "rejected": payloads[rejected.seq]["messages"],
                        "tools": shared.get("tools"),
                        "chosen_reward": chosen.reward,
                        "rejected_reward": rejected.reward,
                        "agent_name": shared["meta"]["agent_name"],
                        TASK_INDEX_KEY_NAME: shared["meta"][TASK_INDEX_KEY_NAME],
                        "chosen_rollout_index": payloads[chosen.seq]["meta"][ROLLOUT_INDEX_KEY_NAME],
                        "rejected_rollout_index": payloads[rejected.seq]["meta"][ROLLOUT_INDEX_KEY_NAME],
                    }
                )
                report.kept += 1
            report.paired_rollouts += len(used)


def _export_tokens(config: ExportConfig, rollouts: Iterable[dict], writer: RowWriter, report: ExportReport) -> None:
    counts = report.trajectories = TrajectoryCounts()
    report.drop_retokenized = config.drop_retokenized
    for rollout in rollouts:
        try:
            _check_complete(rollout, config, keep_incomplete=True)  # failed rollouts first, before the reward filter
            reward = _rated(rollout, config, needs_reward=False)
        except Unusable as exc:
            report.drop(exc.reason, exc.detail, rollout=rollout)
            continue
        checked = counts.add(classify_trajectory(rollout))
        if checked.trajectory is None:
            report.drop(checked.reason or "unknown", checked.detail)
            continue
        if checked.kind == RETOKENIZED and config.drop_retokenized:
            report.drop(RETOKENIZED, checked.detail)
            continue
        trajectory = checked.trajectory
        writer.write(
            {
                "prompt_token_ids": trajectory.prompt_token_ids,
                "generation_token_ids": trajectory.generation_token_ids,
                "generation_log_probs": trajectory.generation_log_probs,
                "loss_mask": trajectory.loss_mask,
                "num_model_calls": trajectory.num_model_calls,
                TRAJECTORY_FLAG: checked.kind,
                "reward": reward,
                **_meta(rollout),
            }
        )
        report.kept += 1


_EXPORTERS = {"sft": _export_sft, "dpo": _export_dpo, "tokens": _export_tokens}


# ------------------------------------------------------------------------------------------------ the run


def _check_paths(config: ExportConfig) -> tuple[list[Path], Path]:
    inputs = config.input_paths()
    for path in inputs:
        if not path.is_file():
            raise NeMoGymConfigError(f"+input_jsonl_fpath: file not found: {path}")
    output = Path(config.output_fpath).expanduser()
    if output_format(output) == "parquet":
        require_pyarrow()
    if any(output.resolve() == path.resolve() for path in inputs):
        raise NeMoGymConfigError(f"+output_fpath={output} is also an input file; write the export somewhere else.")
    if output.is_dir():
        raise NeMoGymConfigError(f"+output_fpath={output} is a folder; give a file path ending in .jsonl or .parquet.")
    return inputs, output


def _read(paths: list[Path], report: ExportReport) -> Iterator[dict]:
    report.files = len(paths)
    for line in read_rows(paths, report.bad_lines):
        report.read += 1
        yield line.row


def export_rollouts(config: ExportConfig) -> ExportReport:
    """Run one export; the output file appears complete at the end, or not at all: not on an error (bad lines
    refused: `BadLinesRefused`), not when no row was kept (`report.written` is False). A file already at the output
    path is replaced only by a complete export."""
    inputs, output = _check_paths(config)
    report = ExportReport(kind=config.kind, output=output, bad_lines=BadLines(skip=config.skip_bad_lines))
    with open_rows(output, config.kind, reasoning_field=config.reasoning == "field") as writer:
        _EXPORTERS[config.kind](config, _read(inputs, report), writer, report)
    report.written = writer.written
    return report
