"""What became of a rollout, in one vocabulary for every tool that reports it (the collector's summary and progress
bar, the reward profile, `ng view`, `ng export`):

- **ok**: the rollout finished, was verified, and its response is complete.
- **incomplete**: verified (it has a reward and is kept in the output file), but the response stopped early:
  `status: "incomplete"` or an `incomplete_details`, whose `reason` is kept (e.g. `max_output_tokens`).
- **failed**: no usable result: a line of the collector's `<stem>_failures.jsonl` (ours, or NeMo Gym v0.5's
  sidecar line, the agent's answer with `_ng_failure_class`), a response whose status is `failed` / `cancelled`
  or that carries an `error`, or a row with neither a `response` object nor a numeric `reward`.

A line that is not a JSON object is none of these: it is an unreadable line, which the tool reading the file
reports under its own policy for bad lines.

Counting: a failed rollout is counted once per (task, rollout) key, however many failure lines (one per attempt,
v0.5's resume history) its sidecar holds; lines without both indices count one each.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Mapping, Optional

from nemo_gym.rollouts.failure_routing import NG_FAILURE_CLASS_KEY, NG_FAILURE_JUDGE_ERROR_KEY, NG_NO_PERSIST_KEY

OK, INCOMPLETE, FAILED = "ok", "incomplete", "failed"
OUTCOMES = (OK, INCOMPLETE, FAILED)
FAILURES_SUFFIX = "_failures"
NO_REASON = "no reason given"

# One sentence for whoever prints incomplete rollouts, so every tool explains them the same way.
INCOMPLETE_NOTE = (
    "Incomplete rollouts stopped early (the reason is given with the count) but were verified: they have a reward "
    "and are kept in the output; ng export leaves them out unless --include-incomplete."
)

_FAILED_STATUSES = ("failed", "cancelled")

__all__ = [
    "OK",
    "INCOMPLETE",
    "FAILED",
    "OUTCOMES",
    "INCOMPLETE_NOTE",
    "Outcome",
    "OutcomeCounts",
    "rollout_outcome",
    "failure_outcome",
    "line_outcome",
    "is_failure_record",
    "failure_key",
    "failure_agent",
    "failures_path_for",
]


@dataclass(frozen=True)
class Outcome:
    """One rollout's outcome: `kind` (ok / incomplete / failed) and, when not ok, why (`reason`: the incomplete
    reason or the error type; `message`: an error's text, when there is one)."""

    kind: str
    reason: Optional[str] = None
    message: Optional[str] = None


def failures_path_for(path: Path) -> Path:
    """`<stem>_failures.jsonl` beside a rollouts file (the name `ng_collect_rollouts` writes)."""
    path = Path(path)
    return path.with_name(f"{path.stem}{FAILURES_SUFFIX}.jsonl")


def rollout_outcome(row: Mapping[str, Any]) -> Outcome:
    """The outcome of a line of a rollouts file (an agent's `/run` answer: the verifier's fields and `response`)."""
    if row.get(NG_FAILURE_CLASS_KEY) is not None or row.get(NG_NO_PERSIST_KEY):
        return Outcome(FAILED, str(row.get(NG_FAILURE_CLASS_KEY) or "no_persist"))
    response = row.get("response")
    if not isinstance(response, Mapping):
        reward = row.get("reward")
        if isinstance(reward, (int, float)) and not isinstance(reward, bool):
            return Outcome(OK)  # verified; nothing says it stopped early
        return Outcome(FAILED, "no_response", "the row has neither a `response` object nor a reward")
    error = response.get("error")
    if error:
        code = error.get("code") if isinstance(error, Mapping) else None
        message = error.get("message") if isinstance(error, Mapping) else error
        reason = code or f"response {response.get('status') or 'error'}"
        return Outcome(FAILED, str(reason), None if message is None else str(message))
    status = response.get("status")
    if status in _FAILED_STATUSES:
        return Outcome(FAILED, f"response {status}")
    details = response.get("incomplete_details")
    if status == "incomplete" or details:
        reason = details.get("reason") if isinstance(details, Mapping) else None
        return Outcome(INCOMPLETE, str(reason) if reason else None)
    return Outcome(OK)


def is_failure_record(record: Mapping[str, Any]) -> bool:
    """Whether a JSON object is a line of a failures sidecar: ours (`error_type` and the input `row`) or v0.5's (the
    agent's answer with `_ng_failure_class`)."""
    return ("error_type" in record and "row" in record) or record.get(NG_FAILURE_CLASS_KEY) is not None


def failure_outcome(record: Mapping[str, Any]) -> Outcome:
    """The outcome of a line of a `<stem>_failures.jsonl` file: failed, with its error type (or failure class)."""
    kind = record.get("error_type") or record.get(NG_FAILURE_CLASS_KEY)
    message = record.get("message")
    if message is None:
        message = record.get(NG_FAILURE_JUDGE_ERROR_KEY)
    return Outcome(FAILED, str(kind or "unknown"), None if message is None else str(message))


def line_outcome(obj: Mapping[str, Any]) -> Outcome:
    """The outcome of a line of either file, told apart by its shape (for tools that read any file they are given)."""
    return failure_outcome(obj) if is_failure_record(obj) else rollout_outcome(obj)


def _int(value: Any) -> Optional[int]:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def failure_key(record: Mapping[str, Any]) -> Optional[tuple[int, int]]:
    """(task, rollout) of a failure line, to count a rollout with several failure lines once; None without both."""
    row = record.get("row") if isinstance(record.get("row"), Mapping) else {}
    task = _int(record.get("_ng_task_index", row.get("_ng_task_index")))
    rollout = _int(record.get("_ng_rollout_index", row.get("_ng_rollout_index")))
    return None if task is None or rollout is None else (task, rollout)


def _agent_ref_name(obj: Any) -> Optional[str]:
    ref = obj.get("agent_ref") if isinstance(obj, Mapping) else None
    name = ref.get("name") if isinstance(ref, Mapping) else None
    return name if isinstance(name, str) else None


def failure_agent(record: Mapping[str, Any]) -> Optional[str]:
    """The agent a failure line is about: `agent_name` (ours), else the `agent_ref` of its row or of itself."""
    name = record.get("agent_name")
    if isinstance(name, str):
        return name
    return _agent_ref_name(record.get("row")) or _agent_ref_name(record)


def _reasons_text(reasons: Counter, count: int) -> str:
    """` (max_output_tokens)` when every one has that reason, ` (2 max_output_tokens, 1 content_filter)` else."""
    if not count or not reasons:
        return ""
    ordered = sorted(reasons.items(), key=lambda kv: (-kv[1], kv[0]))
    if len(ordered) == 1:
        return f" ({ordered[0][0]})"
    return " (" + ", ".join(f"{n} {reason}" for reason, n in ordered) + ")"


@dataclass
class OutcomeCounts:
    """ok / incomplete / failed counts, with the reasons of the incomplete and failed ones."""

    ok: int = 0
    incomplete: int = 0
    failed: int = 0
    incomplete_reasons: Counter = field(default_factory=Counter)
    failed_reasons: Counter = field(default_factory=Counter)

    def add(self, outcome: Outcome, count: int = 1) -> None:
        if outcome.kind == OK:
            self.ok += count
        elif outcome.kind == INCOMPLETE:
            self.incomplete += count
            self.incomplete_reasons[outcome.reason or NO_REASON] += count
        else:
            self.failed += count
            self.failed_reasons[outcome.reason or "unknown"] += count

    def merge(self, other: "OutcomeCounts") -> None:
        self.ok += other.ok
        self.incomplete += other.incomplete
        self.failed += other.failed
        self.incomplete_reasons.update(other.incomplete_reasons)
        self.failed_reasons.update(other.failed_reasons)

    @property
    def total(self) -> int:
        return self.ok + self.incomplete + self.failed

    def phrases(self) -> dict[str, str]:
        """`{"ok": "3 ok", "incomplete": "2 incomplete (max_output_tokens)", "failed": "0 failed"}`."""
        return {
            OK: f"{self.ok} ok",
            INCOMPLETE: f"{self.incomplete} incomplete{_reasons_text(self.incomplete_reasons, self.incomplete)}",
            FAILED: f"{self.failed} failed{_reasons_text(self.failed_reasons, self.failed)}",
        }

    def parts(self) -> str:
        """`3 ok, 2 incomplete (max_output_tokens), 0 failed`."""
        return ", ".join(self.phrases().values())

    def not_ok(self) -> str:
        """`2 incomplete (max_output_tokens), 1 failed (HTTPError)` (what `ng export` says it dropped)."""
        phrases = self.phrases()
        return f"{phrases[INCOMPLETE]}, {phrases[FAILED]}"

    def describe(self, noun: str = "rollout") -> str:
        """`5 rollouts: 3 ok, 2 incomplete (max_output_tokens), 0 failed` (the words every tool prints)."""
        return f"{self.total} {noun}{'' if self.total == 1 else 's'}: {self.parts()}"

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready: the three counts, the reasons, `total`, and the words: `phrases` and `text` (`describe`)."""
        return {
            OK: self.ok,
            INCOMPLETE: self.incomplete,
            FAILED: self.failed,
            "incomplete_reasons": dict(sorted(self.incomplete_reasons.items(), key=lambda kv: (-kv[1], kv[0]))),
            "failed_reasons": dict(sorted(self.failed_reasons.items(), key=lambda kv: (-kv[1], kv[0]))),
            "total": self.total,
            "phrases": self.phrases(),
            "text": self.describe(),
        }

    @classmethod
    def of(cls, outcomes: Iterable[Outcome]) -> "OutcomeCounts":
        counts = cls()
        for outcome in outcomes:
            counts.add(outcome)
        return counts
