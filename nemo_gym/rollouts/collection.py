"""`ng_collect_rollouts`: run an agent's `/run` over a JSONL file of tasks and write one JSON line per rollout.

Compatible with NeMo Gym v0.2 (same parameters, indices and files), with these additions:

- **Streaming, bounded memory.** The input is read line by line and at most `num_samples_in_parallel` rollouts
  (1024 when unset) are in flight; no list of rows is ever built. The per-line state, the map from a line's hash
  to its task index (16-byte digests), is a dict for up to 16k distinct lines and then moves to a temporary
  SQLite file with a bounded cache; on resume the finished (task, rollout) keys are one bit per materialized
  row (`nemo_gym.rollouts.row_keys`).
- **Validation first.** One streaming pass over the input checks every line that will be used (valid JSON, an
  object, `responses_create_params` that the strict Responses model accepts, an agent, an agent the running
  stack has) and reports every problem as `file:line: ...` before any rollout starts. The same pass writes
  `<stem>_materialized_inputs.jsonl` (to a temporary file renamed at the end, so it is complete or absent).
- **Failures are data.** Connection errors, timeouts, HTTP 429, 503 and the other statuses that
  `nemo_gym.http.retry` retries for idempotent requests (a /run is rerun whole) are retried with jittered
  backoff up to `max_attempts` attempts per rollout; a rollout that still fails becomes a line of
  `<stem>_failures.jsonl` (row, error type, message, server, attempts) and the run goes on. The command exits 1
  when anything failed.
- **Fail fast on a failed server.** Before the first rollout, and when an attempt fails with a connection error, a
  timeout or a 5xx, the head server is asked (cached ~1 s, `http/stack_health.py`) whether a server the agents
  need has been marked failed by `ng_run` (restart budget spent). If so the collection stops with one message
  naming it (exit 1): rollouts in flight are cancelled and the rest are not started, neither is recorded as a
  failure, the ones written are kept, and `resume_from_cache=true` on a repaired stack runs the rest.
- **Parallelism is real.** `num_samples_in_parallel` above the shared client's per-host connection limit raises the
  collector's limit to match; when the stack's servers run with a lower one, a note says so and how to raise it.
- **Resume.** `resume_from_cache=true` (with an existing output file) reuses the materialized inputs of the first
  run (rebuilt from the input if missing; the output is never deleted when resuming), drops a torn last line of
  the output, skips every (task, rollout) already in the output and runs the rest (failed and missing rollouts),
  appending to the output and to the failures file, whose declared failures are the attempt history of v0.5's
  resume policy: a rollout whose failure was terminal, or that failed `NEMO_GYM_MAX_ROLLOUT_ATTEMPTS` times, is
  not run again (and reported); the others carry `_ng_attempt_index` = their earlier attempts. Without resume,
  the output and failures files are started afresh.
- **`num_repeats_add_seed` works**: our Responses schema accepts `seed`.
- **NeMo Gym v0.5's collection additions.** An answer that declares a failure (`_ng_failure_class`, e.g. a judge
  call that failed) is rerun with `_ng_attempt_index` up to `NEMO_GYM_MAX_ROLLOUT_ATTEMPTS` and then recorded as a
  failure of that class, never as a score (`rollouts/failure_routing.py`); results carry `agent_ref`; after the run
  each agent's `/aggregate_metrics` goes to `<stem>_aggregate_metrics.json` (`rollouts/aggregation.py`); an
  answer marked `_ng_no_persist` is written nowhere and runs again on resume; `num_repeats` may be a mapping
  agent -> repeats (with `_default`);
  `prompt_config` renders every row's input from a template; with `observability_enabled` each result gets its
  model calls as `ng_model_call_capture`.
- A live progress bar on stderr: done, then ok / incomplete / failed (`rollouts/outcome.py`), rollouts per second,
  mean reward so far, ETA; the summary at the end counts the new rollouts the same way.

Task indices: the first distinct line gets 0, the next distinct line 1, and so on; a line identical to an earlier
one (after stripping surrounding whitespace) gets that line's task index and continues its rollout numbering.
Rows are materialized grouped by line: (0,0), (0,1), (1,0), (1,1), ...

Python API for training frameworks: `iter_rollouts(rows, server_client=...)` is an async iterator of
`RolloutResult`s in completion order (the CLI uses it too).
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import re
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, AsyncIterable, AsyncIterator, Iterable, Iterator, Mapping, Optional, Union

import orjson
from pydantic import Field, ValidationError, field_validator

from nemo_gym.config.types import AGENT_SERVER_TYPE, BaseNeMoGymCLIConfig, format_validation_errors
from nemo_gym.errors import NeMoGymConfigError, NeMoGymStackError, did_you_mean
from nemo_gym.rollouts.jsonl import iter_jsonl_objects
from nemo_gym.rollouts.outcome import (
    FAILED,
    INCOMPLETE_NOTE,
    Outcome,
    OutcomeCounts,
    failures_path_for,
    rollout_outcome,
)
from nemo_gym.rollouts.row_keys import FinishedRollouts, RolloutKeySpace, TaskIndexMap
from nemo_gym.rollouts.skills import SkillsConfig
from nemo_gym.servers.model_call_capture import (
    ModelCallCaptureConfig,
    clear_capture,
    merge_model_call_capture_into_record,
)
from nemo_gym.servers.rollout_context import maybe_rollout_id_from_run_body
from nemo_gym.rollouts.failure_routing import (
    ATTEMPT_INDEX_KEY_NAME,
    NG_FAILURE_CLASS_KEY,
    NG_FAILURE_JUDGE_ERROR_KEY,
    NG_NO_PERSIST_KEY,
    NG_TERMINAL_KEY,
    MAX_ROLLOUT_ATTEMPTS_ENV_VAR_NAME,
    declared_failure,
    get_max_rollout_attempts,
)

from nemo_gym.http.stack_health import StackHealth, StackServerFailed

if TYPE_CHECKING:  # imported when rollouts run: it loads the HTTP stack
    from nemo_gym.http.retry import RetryPolicy

__all__ = [
    "TASK_INDEX_KEY_NAME",
    "NG_FAILURE_CLASS_KEY",
    "NG_NO_PERSIST_KEY",
    "NG_TERMINAL_KEY",
    "ATTEMPT_INDEX_KEY_NAME",
    "ROLLOUT_INDEX_KEY_NAME",
    "DEFAULT_MAX_IN_FLIGHT",
    "RolloutCollectionConfig",
    "RolloutResult",
    "InputProblem",
    "InputValidationError",
    "RowPreprocessor",
    "CollectionPaths",
    "iter_input_lines",
    "iter_materialized_rows",
    "materialize_input_file",
    "validate_materialized_file",
    "repair_jsonl_tail",
    "read_finished_keys",
    "iter_pending_rows",
    "FailureHistory",
    "read_failure_history",
    "check_num_repeats",
    "agent_names_in_config",
    "iter_rollouts",
    "run_from_config",
    "rollout_key",
    "agent_name_of",
    "truncate_message",
    "ProgressDisplay",
]

TASK_INDEX_KEY_NAME = "_ng_task_index"
ROLLOUT_INDEX_KEY_NAME = "_ng_rollout_index"
SKILLS_REF_KEY_NAME = "skills_ref"  # NeMo Gym v0.5 skills (`nemo_gym.skills`): travels from the row to the result

# `num_samples_in_parallel: null` means "no cap of yours". We still bound in-flight work so memory stays flat:
# 1024, the default per-host connection limit of the shared client (`global_aiohttp_connector_limit_per_host`).
# A larger `num_samples_in_parallel` raises the collector's own limit to match (`fit_connection_limits`), and says
# so when the stack's servers run with a lower one.
DEFAULT_MAX_IN_FLIGHT = 1024
CONNECTION_LIMIT_PER_HOST_KEY = "global_aiohttp_connector_limit_per_host"
CONNECTION_LIMIT_KEY = "global_aiohttp_connector_limit"
MAX_REPORTED_PROBLEMS = 50
_MESSAGE_LIMIT = 2000


class RolloutCollectionConfig(BaseNeMoGymCLIConfig):
    """Collect rollouts: POST every input row to an agent's /run (on the stack `ng_run` started) and write one
    JSON line per rollout: the agent's answer plus `_ng_task_index` and `_ng_rollout_index`, in completion
    order. Also writes <stem>_materialized_inputs.jsonl, <stem>_reward_profiling.jsonl,
    <stem>_agent_metrics.json, and <stem>_failures.jsonl for rollouts that failed after retries (exit code 1).
    Example: ng_collect_rollouts +agent_name=my_agent +input_jsonl_fpath=data/example.jsonl
    +output_jsonl_fpath=results/rollouts.jsonl +num_repeats=4 +num_samples_in_parallel=64"""

    output_jsonl_fpath: str = Field(description="Where to write the rollouts (JSONL).")
    input_jsonl_fpath: str = Field(
        description="Input rows (JSONL); a relative path is looked up in the current directory, then the install dir."
    )
    agent_name: Optional[str] = Field(
        default=None, description="Agent (server id) for rows without `agent_ref`; rows that name one keep theirs."
    )
    limit: Optional[int] = Field(
        default=None, ge=1, description="Use only the first `limit` non-blank input lines (before repeats)."
    )
    num_repeats: Optional[Union[int, dict[str, int]]] = Field(
        default=None,
        description=(
            "Rollouts per input line (null = 1), or per agent: `+num_repeats={my_agent:4,_default:1}` (an agent "
            "with no entry takes `_default`; without one its rows are refused)."
        ),
    )
    prompt_config: Optional[str] = Field(
        default=None,
        description=(
            "A prompt template YAML (`user`, optional `system`, with {field} placeholders filled from each row's "
            "top-level fields) that writes every row's responses_create_params.input; rows must not bring an input."
        ),
    )
    num_repeats_add_seed: bool = Field(
        default=False, description="Set responses_create_params.seed to the rollout index of each repeat."
    )
    skills: Optional[SkillsConfig] = Field(
        default=None,
        description="Run-level skills for agent runtimes: `+skills.path=<folder of skill folders, each with a "
        "SKILL.md>`; every row (and result) carries their `skills_ref` (path, content hash, names).",
    )
    num_samples_in_parallel: Optional[int] = Field(
        default=None,
        ge=1,
        description=(
            f"Maximum rollouts in flight (null = {DEFAULT_MAX_IN_FLIGHT}); the collector's connection limit is "
            "raised to match."
        ),
    )
    responses_create_params: dict[str, Any] = Field(
        default_factory=dict,
        description=(
            "Merged over every row's responses_create_params (these win), "
            "e.g. +responses_create_params.temperature=0.6"
        ),
    )
    resume_from_cache: bool = Field(
        default=False,
        description="Keep the rollouts already in the output; run only missing and failed ones (no duplicates).",
    )
    max_attempts: int = Field(
        default=3, ge=1, description="Attempts per rollout on connection errors, timeouts, HTTP 429, 500, 502-504."
    )
    request_timeout_s: Optional[float] = Field(
        default=None, gt=0, description="Give up on one /run attempt after this many seconds (null = no limit)."
    )
    retry_backoff_s: float = Field(
        default=1.0, ge=0, description="Base of the exponential backoff between attempts (full jitter)."
    )
    retry_backoff_max_s: float = Field(
        default=30.0, ge=0, description="Cap of one backoff sleep (an agent's Retry-After is honoured up to 60 s)."
    )
    pass_threshold: float = Field(
        default=1.0, description="Reward at or above which a rollout counts as passed (for pass@k in the profile)."
    )
    progress_bar: bool = Field(default=True, description="Show a live progress bar on stderr.")
    aggregation_max_rollouts: int = Field(
        default=1_000_000,
        ge=1,
        description="Refuse /aggregate_metrics (an error line, exit 1) when the output holds more rollouts than "
        "this: they are sent in bounded parts, but the agent holds them all in memory to compute.",
    )
    disable_aggregation: bool = Field(
        default=False,
        description=(
            "Skip asking each agent for /aggregate_metrics after the run (otherwise written to "
            "<stem>_aggregate_metrics.json and the key metrics printed)."
        ),
    )
    shard: Optional[str] = Field(
        default=None,
        description=(
            "Run only shard i of n (`+shard=i/n`, i from 1): the tasks whose index mod n is i-1, with the indices of "
            "the whole run; merge the shards' outputs with `ng merge` (docs/merging-shards.md)."
        ),
    )

    @field_validator("num_repeats", mode="before")
    @classmethod
    def _check_num_repeats(cls, value: Any) -> Any:
        return check_num_repeats(value)

    @field_validator("shard", mode="before")
    @classmethod
    def _check_shard(cls, value: Any) -> Optional[str]:
        from nemo_gym.rollouts.merge import parse_shard

        return None if value is None else str(parse_shard(value))


# --------------------------------------------------------------------------------------------------------
# Paths


def _with_stem_suffix(path: Path, suffix: str, ext: str) -> Path:
    return path.with_name(f"{path.stem}{suffix}{ext}")


@dataclass(frozen=True)
class CollectionPaths:
    """Every file a collection writes, derived from the output path as the reference does."""

    output: Path

    @property
    def materialized_inputs(self) -> Path:
        return _with_stem_suffix(self.output, "_materialized_inputs", ".jsonl")

    @property
    def failures(self) -> Path:
        return failures_path_for(self.output)

    @property
    def reward_profiling(self) -> Path:
        return _with_stem_suffix(self.output, "_reward_profiling", ".jsonl")

    @property
    def agent_metrics(self) -> Path:
        return _with_stem_suffix(self.output, "_agent_metrics", ".json")

    @property
    def aggregate_metrics(self) -> Path:
        return _with_stem_suffix(self.output, "_aggregate_metrics", ".json")


def resolve_input_path(path_str: str) -> Path:
    """A relative input path is tried against the current directory, then the install directory."""
    path = Path(path_str).expanduser()
    if path.is_absolute() or path.exists():
        return path
    from nemo_gym import PARENT_DIR

    candidate = PARENT_DIR / path
    return candidate if candidate.exists() else path


# --------------------------------------------------------------------------------------------------------
# Input problems


@dataclass(frozen=True)
class InputProblem:
    path: str
    line: int
    message: str

    def __str__(self) -> str:
        return f"{self.path}:{self.line}: {self.message}"


class InputValidationError(NeMoGymConfigError):
    """Problems found in an input file before any rollout started; `problems` lists the first ones,
    `total` counts them all."""

    def __init__(
        self,
        problems: list[InputProblem],
        total: Optional[int] = None,
        *,
        what: str = "input",
        fix: Optional[str] = None,
    ):
        self.problems = problems
        self.total = len(problems) if total is None else total
        # The first line is the first bad line as `file:line: what is wrong`, so a one-line reader sees it.
        first = str(problems[0]) if problems else f"problems in the {what}"
        if fix is None:
            fix = "fix or remove the line and rerun" if self.total <= 1 else "fix or remove these lines and rerun"
        if self.total <= 1:
            super().__init__(f"{first} (no rollout was started; {fix})")
            return
        more = f"and {self.total - 1} more problem(s) in the {what}, listed below"
        lines = [f"{first} ({more}; no rollout was started; {fix})"]
        lines += [f"  {p}" for p in problems[1:]]
        if self.total > len(problems):
            lines.append(f"  ... and {self.total - len(problems)} more")
        super().__init__("\n".join(lines))


class _RowProblem(Exception):
    pass


# --------------------------------------------------------------------------------------------------------
# Reading and preprocessing rows (streaming)


def iter_input_lines(lines: Iterable[Union[str, bytes]], limit: Optional[int] = None) -> Iterator[tuple[int, bytes]]:
    """(1-based line number, stripped line) for every non-blank line, stopping after `limit` of them.

    Blank lines are skipped (a trailing empty line is common in JSONL files) and do not count toward `limit`."""
    used = 0
    if limit is not None and limit <= 0:
        return
    for lineno, line in enumerate(lines, start=1):
        if isinstance(line, str):
            line = line.encode("utf-8")
        line = line.strip()
        if not line:
            continue
        yield lineno, line
        used += 1
        if limit is not None and used >= limit:
            return


def agent_name_of(row: Mapping[str, Any]) -> Optional[str]:
    """The agent a row names in `agent_ref.name`, or None."""
    ref = row.get("agent_ref")
    if type(ref) is dict or isinstance(ref, Mapping):
        name = ref.get("name")
        if isinstance(name, str) and name:
            return name
    return None


DEFAULT_REPEATS_KEY = "_default"


def check_num_repeats(value: Any) -> Union[None, int, dict[str, int]]:
    """`num_repeats` as v0.5 takes it: null, an int >= 1, or a mapping agent name -> int >= 1 with an optional
    `_default`. Anything else is a `ValueError` that says what was given."""
    if value is None:
        return None
    if hasattr(value, "items") and not isinstance(value, Mapping):  # an OmegaConf DictConfig
        from omegaconf import OmegaConf

        value = OmegaConf.to_container(value, resolve=True)
    if isinstance(value, Mapping):
        out: dict[str, int] = {}
        for name, n in value.items():
            if isinstance(n, bool) or not isinstance(n, int) or n < 1:
                raise ValueError(f"num_repeats.{name}={n!r}: each agent's repeats must be an integer >= 1")
            out[str(name)] = n
        if not out:
            raise ValueError("num_repeats is an empty mapping: give an integer, or agent names (or `_default`) -> int")
        return out
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(
            f"num_repeats={value!r}: expected an integer >= 1 or a mapping agent name -> integer (with an optional "
            "`_default`), e.g. +num_repeats=4 or +num_repeats={my_agent:4,_default:1}"
        )
    return value


class RowPreprocessor:
    """Turns input lines into materialized rows (reference `_preprocess_rows_from_config`, one line at a time).

    Per line: parse; fill `agent_ref = {"name": agent_name}` when the row names no agent; merge the override
    dict over `responses_create_params` (overrides win); check the params with the strict Responses model and
    the agent against `known_agents` (when given); give the line its task index (identical lines share one)
    and emit `num_repeats` independent rows with `_ng_rollout_index` = the task's running rollout count and,
    with `num_repeats_add_seed`, `responses_create_params.seed` = that rollout index.

    State kept: line digest -> (task index, next rollout index), a `TaskIndexMap` (a dict for the first
    `spill_after` distinct lines, then a temporary SQLite file); `close()` frees it.
    """

    def __init__(
        self,
        *,
        agent_name: Optional[str] = None,
        num_repeats: Union[None, int, Mapping[str, int]] = None,
        num_repeats_add_seed: bool = False,
        responses_create_params: Optional[Mapping[str, Any]] = None,
        known_agents: Optional[Iterable[str]] = None,
        validate_params: bool = True,
        spill_after: Optional[int] = None,
        prompt_config: Optional[str] = None,
        skills_ref: Optional[Mapping[str, Any]] = None,
    ) -> None:
        self.agent_name = agent_name
        self.skills_ref = None if skills_ref is None else dict(skills_ref)
        self.prompt = None  # `apply(row)` of the prompt template, loaded once (a bad path fails here)
        if prompt_config:
            from nemo_gym.rollouts.prompts import prompt_row_applier

            try:
                self.prompt = prompt_row_applier(prompt_config)
            except (OSError, ValueError) as exc:
                raise NeMoGymConfigError(f"+prompt_config={prompt_config}: {exc}") from None
        checked = check_num_repeats(num_repeats)
        # Per agent (v0.5): `repeats_by_agent`; `num_repeats` is then the `_default` (None: none).
        self.repeats_by_agent: Optional[dict[str, int]] = dict(checked) if isinstance(checked, dict) else None
        if self.repeats_by_agent is not None:
            self.num_repeats: Optional[int] = self.repeats_by_agent.pop(DEFAULT_REPEATS_KEY, None)
        else:
            self.num_repeats = 1 if checked is None else checked
        self.add_seed = bool(num_repeats_add_seed)
        self.overrides = dict(responses_create_params or {})
        self.known_agents = None if known_agents is None else frozenset(known_agents)
        if self.repeats_by_agent and self.known_agents is not None:
            for name in sorted(set(self.repeats_by_agent) - self.known_agents):
                sys.stderr.write(
                    f"Warning: +num_repeats names `{name}`, which is not an agent of the running stack (agents: "
                    f"{', '.join(sorted(self.known_agents)) or '(none)'}); its entry is not used."
                    f"{did_you_mean(name, self.known_agents)}\n"
                )
        self._params_model = None
        if validate_params:
            from nemo_gym.api.schemas import NeMoGymResponseCreateParamsNonStreaming

            self._params_model = NeMoGymResponseCreateParamsNonStreaming
        self._tasks = TaskIndexMap() if spill_after is None else TaskIndexMap(spill_after)

    @property
    def num_tasks(self) -> int:
        return len(self._tasks)

    def close(self) -> None:
        """Free the task-index map (and its temporary file); the preprocessor cannot materialize after this."""
        self._tasks.close()

    def check_line(self, line: bytes) -> dict:
        """Parse and check one line; return the preprocessed row (without indices) or raise `_RowProblem`."""
        try:
            row = orjson.loads(line)
        except orjson.JSONDecodeError as exc:
            raise _RowProblem(f"invalid JSON: {exc}") from None
        if not isinstance(row, dict):
            raise _RowProblem(f"expected a JSON object, got {type(row).__name__}")
        if self.prompt is not None:
            row = self._render_prompt(row)
        params = row.get("responses_create_params")
        if params is None:
            raise _RowProblem("missing `responses_create_params` (the model call parameters, with `input`)")
        if not isinstance(params, dict):
            raise _RowProblem(f"`responses_create_params` must be an object, got {type(params).__name__}")
        if self.overrides:
            row["responses_create_params"] = params = {**params, **self.overrides}
        if self._params_model is not None:
            try:
                self._params_model.model_validate(params)
            except ValidationError as err:
                details = "; ".join(format_validation_errors(err, key_prefix="responses_create_params")[:5])
                raise _RowProblem(f"invalid responses_create_params: {details}") from None
        name = agent_name_of(row)
        if name is None:
            if self.agent_name:
                ref = row.get("agent_ref")
                base = ref if isinstance(ref, dict) else {}
                row["agent_ref"] = {**base, "name": self.agent_name}
                name = self.agent_name
            else:
                raise _RowProblem("no agent: the row has no `agent_ref.name`; pass +agent_name=<agent server id>")
        if self.known_agents is not None and name not in self.known_agents:
            known = ", ".join(sorted(self.known_agents)) or "(none)"
            raise _RowProblem(
                f"unknown agent `{name}`: the running stack has agents {known}.{did_you_mean(name, self.known_agents)}"
            )
        self.repeats_for(name)
        if self.skills_ref is not None and row.get(SKILLS_REF_KEY_NAME) is None:
            row[SKILLS_REF_KEY_NAME] = self.skills_ref
        return row

    def repeats_for(self, agent: Optional[str]) -> int:
        """Rollouts per line for rows of `agent` (raises `_RowProblem` when a per-agent `num_repeats` has no entry
        for it and no `_default`)."""
        if self.repeats_by_agent is not None and agent in self.repeats_by_agent:
            return self.repeats_by_agent[agent]
        if self.num_repeats is None:
            entries = ", ".join(sorted(self.repeats_by_agent or {}))
            raise _RowProblem(
                f"agent `{agent}` has no entry in +num_repeats (entries: {entries}) and there is no `_default`; add "
                f"+num_repeats.{agent}=N or +num_repeats._default=N"
            )
        return self.num_repeats

    def _render_prompt(self, row: dict) -> dict:
        """The row with its input written by the prompt template (a row that brings its own input is refused)."""
        from nemo_gym.rollouts.prompts import has_input

        if has_input(row):
            raise _RowProblem(
                "has a non-empty `responses_create_params.input`, but +prompt_config writes the input; remove the "
                "row's input (keep the fields the template uses) or drop +prompt_config"
            )
        try:
            return self.prompt(row)
        except (KeyError, ValueError) as exc:
            raise _RowProblem(str(exc.args[0]) if exc.args else str(exc)) from None

    def task_index(self, line: bytes) -> int:
        """The task index of a line (a new one for a line not seen yet); hands out no rollout index."""
        return self._tasks.claim(hashlib.blake2b(line, digest_size=16).digest(), 0)[0]

    def _claim(self, line: bytes, repeats: int) -> tuple[int, int]:
        return self._tasks.claim(hashlib.blake2b(line, digest_size=16).digest(), repeats)

    def materialize(self, line: bytes, row: dict) -> Iterator[dict]:
        """The `num_repeats` rows (of its agent) of a checked line. The first is `row` itself, the others fresh
        copies."""
        repeats = self.repeats_for(agent_name_of(row) or self.agent_name)
        task, first = self._claim(line, repeats)
        for i in range(repeats):
            copy = row if i == 0 else orjson.loads(orjson.dumps(row))
            rollout = first + i
            copy[TASK_INDEX_KEY_NAME] = task
            copy[ROLLOUT_INDEX_KEY_NAME] = rollout
            if self.add_seed:
                copy["responses_create_params"] = {**copy["responses_create_params"], "seed": rollout}
            yield copy


def iter_materialized_rows(
    lines: Iterable[Union[str, bytes]],
    *,
    source: str = "<input>",
    limit: Optional[int] = None,
    **preprocessor_options: Any,
) -> Iterator[dict]:
    """Stream the materialized rows of `lines` (a file object, a list, any iterable of JSONL lines).

    Raises `InputValidationError` naming `source:line` at the first bad line. Options: see `RowPreprocessor`."""
    pre = RowPreprocessor(**preprocessor_options)
    try:
        for lineno, line in iter_input_lines(lines, limit):
            try:
                row = pre.check_line(line)
            except _RowProblem as exc:
                raise InputValidationError([InputProblem(source, lineno, str(exc))]) from None
            yield from pre.materialize(line, row)
    finally:
        pre.close()


@dataclass
class MaterializeStats:
    num_lines: int = 0
    num_tasks: int = 0
    num_rows: int = 0
    agents: set[str] = field(default_factory=set)  # the agents the rows go to


def materialize_input_file(
    input_path: Path,
    materialized_path: Path,
    *,
    limit: Optional[int] = None,
    max_reported: int = MAX_REPORTED_PROBLEMS,
    **preprocessor_options: Any,
) -> MaterializeStats:
    """Validate `input_path` and write its materialized rows to `materialized_path`, in one streaming pass.

    Every line that will be used is checked; if any is bad, nothing is written and `InputValidationError`
    lists the problems (`file:line: ...`). The file is written to a temporary name and renamed at the end."""
    if input_path.is_dir():
        raise NeMoGymConfigError(f"+input_jsonl_fpath={input_path} is a folder; give the JSONL file of tasks in it.")
    if not input_path.is_file():
        raise NeMoGymConfigError(f"Input file not found: {input_path} (+input_jsonl_fpath).")
    pre = RowPreprocessor(**preprocessor_options)
    problems: list[InputProblem] = []
    total_problems = 0
    stats = MaterializeStats()
    materialized_path.parent.mkdir(parents=True, exist_ok=True)
    tmp = materialized_path.with_name(materialized_path.name + f".tmp{os.getpid()}")
    try:
        with open(input_path, "rb") as src, open(tmp, "wb") as dst:
            for lineno, line in iter_input_lines(src, limit):
                stats.num_lines += 1
                try:
                    row = pre.check_line(line)
                except _RowProblem as exc:
                    total_problems += 1
                    if len(problems) < max_reported:
                        problems.append(InputProblem(str(input_path), lineno, str(exc)))
                    continue
                if total_problems:
                    continue  # keep validating, stop writing
                stats.agents.add(agent_name_of(row) or str(pre.agent_name))
                for out in pre.materialize(line, row):
                    dst.write(orjson.dumps(out))
                    dst.write(b"\n")
                    stats.num_rows += 1
        if total_problems:
            raise InputValidationError(problems, total_problems, what=f"input file {input_path}")
        if stats.num_lines == 0 and (limit is None or limit > 0):
            raise NeMoGymConfigError(
                f"{input_path} has no rows (the file is empty or holds only blank lines), so there is nothing to "
                "collect. Check +input_jsonl_fpath: one JSON object per line, each with `responses_create_params`."
            )
        os.replace(tmp, materialized_path)
        stats.num_tasks = pre.num_tasks
    finally:
        pre.close()
        if tmp.exists():
            tmp.unlink()
    return stats


def validate_materialized_file(
    path: Path, *, known_agents: Optional[Iterable[str]] = None, max_reported: int = MAX_REPORTED_PROBLEMS
) -> MaterializeStats:
    """Check an existing materialized-inputs file before resuming from it (streaming, keeps no rows)."""
    known = None if known_agents is None else frozenset(known_agents)
    problems: list[InputProblem] = []
    total = 0
    stats = MaterializeStats()
    max_task = -1
    with open(path, "rb") as f:
        for lineno, line in iter_input_lines(f):
            stats.num_lines += 1
            message = None
            try:
                row = orjson.loads(line)
            except orjson.JSONDecodeError as exc:
                row, message = None, f"invalid JSON: {exc}"
            if message is None:
                if not isinstance(row, dict):
                    message = "expected a JSON object"
                elif not isinstance(row.get(TASK_INDEX_KEY_NAME), int) or not isinstance(
                    row.get(ROLLOUT_INDEX_KEY_NAME), int
                ):
                    message = f"missing `{TASK_INDEX_KEY_NAME}` / `{ROLLOUT_INDEX_KEY_NAME}`"
                elif not isinstance(row.get("responses_create_params"), dict):
                    message = "missing `responses_create_params`"
                else:
                    name = agent_name_of(row)
                    if name is None:
                        message = "no agent (`agent_ref.name`)"
                    elif known is not None and name not in known:
                        message = (
                            f"unknown agent `{name}`: the running stack has agents "
                            f"{', '.join(sorted(known)) or '(none)'}.{did_you_mean(name, known)}"
                        )
            if message is not None:
                total += 1
                if len(problems) < max_reported:
                    problems.append(InputProblem(str(path), lineno, message))
                continue
            stats.num_rows += 1
            stats.agents.add(name)
            max_task = max(max_task, row[TASK_INDEX_KEY_NAME])
    if total:
        raise InputValidationError(
            problems, total, what=f"materialized inputs {path}", fix=f"delete {path} to rebuild it from the input"
        )
    stats.num_tasks = max_task + 1
    return stats


# --------------------------------------------------------------------------------------------------------
# Resume bookkeeping


def rollout_key(task: int, rollout: int) -> int:
    """One int for a (task index, rollout index) pair: what finished-rollout sets hold."""
    return (task << 32) | rollout


def repair_jsonl_tail(path: Path) -> int:
    """Cut a torn last line (no trailing newline, e.g. the process died mid-write) off a JSONL file.

    Returns the number of bytes removed. Complete lines are never touched."""
    if not path.exists():
        return 0
    with open(path, "r+b") as f:
        size = f.seek(0, os.SEEK_END)
        if size == 0:
            return 0
        f.seek(size - 1)
        if f.read(1) == b"\n":
            return 0
        # Walk back to the last newline, in chunks.
        pos = size
        keep = 0
        chunk = 65536
        while pos > 0:
            start = max(0, pos - chunk)
            f.seek(start)
            data = f.read(pos - start)
            i = data.rfind(b"\n")
            if i >= 0:
                keep = start + i + 1
                break
            pos = start
        f.truncate(keep)
        return size - keep


def read_finished_keys(path: Path, into: Any = None) -> tuple[Any, int]:
    """The (task, rollout) keys (packed ints) of the rollouts in an output file, and the number of unreadable
    lines that were ignored. The keys go into a new set, or into `into` (anything with `add(key)`, e.g. a
    `FinishedRollouts` bitmap of the materialized rows, which keeps only the keys of those rows)."""
    keys: Any = set() if into is None else into
    bad = 0
    if not path.exists():
        return keys, bad

    def count_bad() -> None:
        nonlocal bad
        bad += 1

    def tell(where: str) -> None:
        if bad == 1:  # the first one: where to look (the rest are only counted)
            _err(f"Warning: {where}; the line is ignored.")

    for row in iter_jsonl_objects(path, count_bad, tell):
        task, rollout = row.get(TASK_INDEX_KEY_NAME), row.get(ROLLOUT_INDEX_KEY_NAME)
        if isinstance(task, int) and isinstance(rollout, int):
            keys.add(rollout_key(task, rollout))
        else:
            bad += 1
    return keys, bad


@dataclass
class FailureHistory:
    """What the failures sidecar says of earlier runs, per (task, rollout) key (v0.5's resume policy): how many
    declared-failure attempts were made and whether one was terminal (`_ng_failure_terminal`).

    Attempts of a key = its lines that carry `_ng_failure_class` (a v0.5 sidecar holds one line per attempt), or
    the highest `_ng_attempt_index` + 1 when a line says more (our collector reruns within a run and writes one
    line for the last attempt). Transport failures (connection errors, HTTP 5xx, timeouts; lines without a class)
    are not the agent's verdict: they do not count, and resume retries them."""

    attempts: dict[int, int] = field(default_factory=dict)
    terminal: set[int] = field(default_factory=set)
    recorded: set[int] = field(default_factory=set)  # every key with a line (transport failures too)

    def skip_reason(self, key: int, max_attempts: int) -> Optional[str]:
        """"terminal" / "exhausted" for a key resume must not run again, else None."""
        if key in self.terminal:
            return "terminal"
        if self.attempts.get(key, 0) >= max_attempts:
            return "exhausted"
        return None


def _attempt_index_of(line: Mapping[str, Any]) -> int:
    for holder in (line, line.get("row"), line.get("result")):
        if isinstance(holder, Mapping):
            value = holder.get(ATTEMPT_INDEX_KEY_NAME)
            if isinstance(value, int) and not isinstance(value, bool):
                return value
    return 0


def read_failure_history(path: Path) -> FailureHistory:
    """The `FailureHistory` of a failures sidecar (ours or NeMo Gym v0.5's); an absent file is an empty history."""
    history = FailureHistory()
    if not path.exists():
        return history
    lines_per_key: dict[int, int] = {}
    for line in iter_jsonl_objects(path, on_bad=lambda: None):
        task, rollout = line.get(TASK_INDEX_KEY_NAME), line.get(ROLLOUT_INDEX_KEY_NAME)
        if not isinstance(task, int) or not isinstance(rollout, int):
            continue
        key = rollout_key(task, rollout)
        history.recorded.add(key)
        if line.get(NG_FAILURE_CLASS_KEY) is None:
            continue
        lines_per_key[key] = lines_per_key.get(key, 0) + 1
        history.attempts[key] = max(history.attempts.get(key, 0), lines_per_key[key], _attempt_index_of(line) + 1)
        if line.get(NG_TERMINAL_KEY) is True:
            history.terminal.add(key)
    return history


def drop_recovered_failures(path: Path, recovered: set[int]) -> None:
    """Remove from a failures sidecar the lines of rollouts that have since succeeded (they are in the output now),
    so the sidecar lists what still failed, with its whole attempt history."""
    if not recovered or not path.exists():
        return
    tmp = path.with_name(path.name + f".tmp{os.getpid()}")
    with open(path, "rb") as src, open(tmp, "wb") as dst:
        for raw in src:
            try:
                line = orjson.loads(raw)
                key = rollout_key(line[TASK_INDEX_KEY_NAME], line[ROLLOUT_INDEX_KEY_NAME])
            except Exception:
                key = None
            if key not in recovered:
                dst.write(raw if raw.endswith(b"\n") else raw + b"\n")
    os.replace(tmp, path)


def iter_pending_rows(
    materialized_path: Path,
    finished: Optional[Union[set[int], FinishedRollouts]] = None,
    shard: Any = None,
    history: Optional[FailureHistory] = None,
    max_rollout_attempts: Optional[int] = None,
) -> Iterator[dict]:
    """Stream the rows of a materialized-inputs file whose (task, rollout) (packed key) is not in `finished` (and,
    with a `merge.Shard`, whose task is in that shard). With a `FailureHistory`, keys it says not to run again
    are left out and the others carry `_ng_attempt_index` = their earlier attempts (when there were any)."""
    if history is not None and max_rollout_attempts is None:
        max_rollout_attempts = get_max_rollout_attempts()
    with open(materialized_path, "rb") as f:
        for line in f:
            line = line.strip()
            if not line:
                continue
            row = orjson.loads(line)
            key = rollout_key(row[TASK_INDEX_KEY_NAME], row[ROLLOUT_INDEX_KEY_NAME])
            if finished and key in finished:
                continue
            if shard is not None and row[TASK_INDEX_KEY_NAME] not in shard:
                continue
            if history is not None and history.attempts:
                if history.skip_reason(key, max_rollout_attempts) is not None:
                    continue
                earlier = history.attempts.get(key, 0)
                if earlier:
                    row[ATTEMPT_INDEX_KEY_NAME] = earlier
            yield row


# --------------------------------------------------------------------------------------------------------
# Running rollouts


@dataclass
class RolloutResult:
    """One finished rollout: `result` (the agent's /run answer plus the row's indices) or a failure
    (`error_type`, `message`, `status_code`, `server`). `attempts` counts the /run calls made."""

    row: dict
    result: Optional[dict] = None
    error_type: Optional[str] = None
    message: Optional[str] = None
    status_code: Optional[int] = None
    server: Optional[str] = None
    agent_name: Optional[str] = None
    attempts: int = 0
    # A declared failure (`rollouts/failure_routing.py`): the agent's answer, kept for re-judging.
    failure_class: Optional[str] = None
    terminal: bool = False

    @property
    def ok(self) -> bool:
        return self.error_type is None

    @property
    def outcome(self) -> Outcome:
        """ok / incomplete / failed (`rollouts/outcome.py`): a failure, else what its answer's response says."""
        if not self.ok or self.result is None:
            return Outcome(FAILED, self.error_type or "unknown", self.message)
        return rollout_outcome(self.result)

    @property
    def persist(self) -> bool:
        """False for an answer marked `_ng_no_persist` (kill-shaped): kept nowhere, run again on resume."""
        return not (self.failure_class is not None and self.result is not None and self.result.get(NG_NO_PERSIST_KEY))

    @property
    def task_index(self) -> Optional[int]:
        return self.row.get(TASK_INDEX_KEY_NAME)

    @property
    def rollout_index(self) -> Optional[int]:
        return self.row.get(ROLLOUT_INDEX_KEY_NAME)

    @property
    def reward(self) -> Optional[float]:
        if self.result is None:
            return None
        value = self.result.get("reward")
        return float(value) if isinstance(value, (int, float)) else None

    def failure_record(self) -> dict:
        """The `<stem>_failures.jsonl` line of a failed rollout (with v0.5's `_ng_failure_class`, and the agent's
        answer as `result`, when the agent declared the failure)."""
        record = {
            TASK_INDEX_KEY_NAME: self.task_index,
            ROLLOUT_INDEX_KEY_NAME: self.rollout_index,
            "error_type": self.error_type,
            "message": self.message,
            "status_code": self.status_code,
            "server": self.server,
            "agent_name": self.agent_name,
            "attempts": self.attempts,
            "row": self.row,
        }
        if self.failure_class is not None:
            record[NG_FAILURE_CLASS_KEY] = self.failure_class
            record[NG_TERMINAL_KEY] = self.terminal
            if self.row.get(ATTEMPT_INDEX_KEY_NAME):  # the last attempt's index: what resume counts
                record[ATTEMPT_INDEX_KEY_NAME] = self.row[ATTEMPT_INDEX_KEY_NAME]
            record["result"] = self.result
        return record


_SERVER_IN_MESSAGE = re.compile(r"server `([^`]+)`")


def _failing_server(message: str, agent: str) -> str:
    """The innermost server an error message names (our client errors say "(server `x`)"), else the agent."""
    names = [n for n in _SERVER_IN_MESSAGE.findall(message or "") if n != agent]
    return names[-1] if names else agent


def truncate_message(text: str, limit: int = _MESSAGE_LIMIT) -> str:
    """`text` cut to `limit` characters for a failure record or a message, marked when cut."""
    return text if len(text) <= limit else text[:limit] + "...[truncated]"


async def _run_one(
    row: dict,
    *,
    server_client: Any,
    agent_name: Optional[str],
    request_timeout_s: Optional[float],
    retry_policy: RetryPolicy,
    max_rollout_attempts: int = 1,
    capture_dir: Optional[str] = None,
    stack_health: Optional[StackHealth] = None,
) -> RolloutResult:
    """One rollout, retried as `retry_policy` says. With `stack_health`, an attempt that fails the way a dead server
    explains (connection error, timeout, 5xx) first asks the head server whether a needed server has failed, and
    then raises `StackServerFailed` instead of retrying."""
    agent = agent_name_of(row) or agent_name
    if not agent:
        return RolloutResult(
            row, error_type="NoAgent", message="the row has no agent_ref.name and no agent_name was given", attempts=0
        )
    from nemo_gym.http.client import ServerClient
    from nemo_gym.http.retry import is_retryable_error, is_retryable_status

    # Our own client: one HTTP attempt per call, the policy here does the retrying (so `attempts` is exact).
    extra = {"max_attempts": 1} if isinstance(server_client, ServerClient) else {}

    async def post() -> Any:
        if capture_dir is not None:  # the model calls of this attempt only
            clear_capture(capture_dir, maybe_rollout_id_from_run_body(row))
        try:
            async with asyncio.timeout(request_timeout_s):
                response = await server_client.post(agent, "/run", json=row, **extra)
        except Exception as exc:
            if stack_health is not None and is_retryable_error(exc, True):
                await stack_health.raise_if_failed()  # a failed server: stop, do not retry
            raise
        if stack_health is not None and is_retryable_status(getattr(response, "status_code", 200), True):
            await stack_health.raise_if_failed()
        return response

    # A failed rollout is rerun whole on a fresh session: /run is idempotent for the retry rules. An answer that
    # declares a failure (a judge that failed, ...) is rerun too, up to NEMO_GYM_MAX_ROLLOUT_ATTEMPTS attempts.
    attempts = 0
    # A row re-dispatched on resume carries the attempts of earlier runs: only the rest of the budget is left.
    first_attempt = int(row.get(ATTEMPT_INDEX_KEY_NAME) or 0)
    for attempt in range(first_attempt, max(max_rollout_attempts, first_attempt + 1)):
        outcome = await retry_policy.run(post, idempotent=True, label=f"POST /run on agent `{agent}`")
        if isinstance(outcome.error, StackServerFailed):
            raise outcome.error
        attempts += outcome.attempts
        data, status, error_type, message = read_outcome(
            outcome, step="/run", target=f"POST /run on agent `{agent}`", request_timeout_s=request_timeout_s
        )
        if data is None:
            break
        if TASK_INDEX_KEY_NAME in row:
            data[TASK_INDEX_KEY_NAME] = row[TASK_INDEX_KEY_NAME]
        if ROLLOUT_INDEX_KEY_NAME in row:
            data[ROLLOUT_INDEX_KEY_NAME] = row[ROLLOUT_INDEX_KEY_NAME]
        if ATTEMPT_INDEX_KEY_NAME in row:
            data[ATTEMPT_INDEX_KEY_NAME] = row[ATTEMPT_INDEX_KEY_NAME]
        if not isinstance(data.get("agent_ref"), dict):  # v0.5 stamps it: aggregation groups by it
            data["agent_ref"] = {"name": agent}
        if row.get(SKILLS_REF_KEY_NAME) is not None and SKILLS_REF_KEY_NAME not in data:  # v0.5 stamps it too
            data[SKILLS_REF_KEY_NAME] = row[SKILLS_REF_KEY_NAME]
        if capture_dir is not None:
            merge_model_call_capture_into_record(data, capture_dir)
        declared = declared_failure(data)
        if declared is None:
            return RolloutResult(row, result=data, agent_name=agent, attempts=attempts)
        failure_class, terminal = declared
        if terminal or attempt + 1 >= max_rollout_attempts:
            detail = data.get(NG_FAILURE_JUDGE_ERROR_KEY) or data.get("message") or ""
            return RolloutResult(
                row,
                result=data,
                error_type=failure_class,
                message=truncate_message(
                    f"agent `{agent}` answered with failure class `{failure_class}`" + (f": {detail}" if detail else "")
                ),
                status_code=status,
                server=agent,
                agent_name=agent,
                attempts=attempts,
                failure_class=failure_class,
                terminal=terminal,
            )
        row = {**row, ATTEMPT_INDEX_KEY_NAME: attempt + 1}
    assert data is None
    if extra:  # our client was told to try once: its "after 1 attempt" would contradict `attempts`
        message = message.replace(" failed after 1 attempt:", " failed:")
    message = truncate_message(message)
    return RolloutResult(
        row,
        error_type=error_type,
        message=message,
        status_code=status,
        server=_failing_server(message, agent),
        agent_name=agent,
        attempts=attempts,
    )


def _capture_dir(server_client: Any) -> Optional[str]:
    """Where model servers write this stack's model calls (`observability_enabled` + `model_call_capture_dir`), or
    None when they do not."""
    config = getattr(server_client, "global_config_dict", None)
    if config is None:
        return None
    capture = ModelCallCaptureConfig.from_global_config(config)
    return str(capture.model_call_capture_dir) if capture.capturing else None


class _WorkerDone:
    pass


@dataclass
class _FeedDone:
    workers: int


@dataclass
class _FeedCrashed:
    exc: BaseException


@dataclass
class _StackFailed:
    exc: StackServerFailed


_STOP = object()


async def iter_rollouts(
    rows: Union[Iterable[dict], AsyncIterable[dict]],
    *,
    server_client: Any,
    agent_name: Optional[str] = None,
    num_samples_in_parallel: Optional[int] = None,
    max_attempts: int = 3,
    request_timeout_s: Optional[float] = None,
    retry_backoff_s: float = 1.0,
    retry_backoff_max_s: float = 30.0,
    stack_health: Optional[StackHealth] = None,
) -> AsyncIterator[RolloutResult]:
    """Run every row through its agent's `/run` and yield a `RolloutResult` as each finishes (completion order).

    `rows`: any iterable or async iterable of dicts (consumed lazily: at most `num_samples_in_parallel` rows,
    default 1024, are read ahead of the results). Each row goes to the agent named in its `agent_ref.name`, else
    `agent_name`. `server_client`: a `ServerClient` (e.g. `ServerClient.load_from_global_config()`) or anything with
    an async `post(server_name, path, json=...)` returning an httpx-like response.

    Failures are yielded, not raised: what `nemo_gym.http.retry` retries for an idempotent request (connection
    errors, timeouts - `request_timeout_s` per attempt -, HTTP 429, 500, 502, 503, 504, ...) is retried with
    jittered backoff (`Retry-After` honoured) up to `max_attempts` attempts; other statuses, a non-JSON answer
    or a row without agent fail at once. An exception raised by `rows` itself propagates.
    Closing the iterator early cancels the rollouts in flight.

    `stack_health` (`nemo_gym.http.stack_health.StackHealth`): when an attempt fails with a connection error,
    a timeout or a 5xx and the head server says a server the agents need has failed (ng_run spent its restart
    budget), the iterator raises `StackServerFailed`: the rollouts in flight are cancelled (nothing is yielded for
    them) and the rows not started are not read further.
    """
    from nemo_gym.http.retry import RetryPolicy

    retry_policy = RetryPolicy(max_attempts, retry_backoff_s, retry_backoff_max_s)
    limit = int(num_samples_in_parallel or DEFAULT_MAX_IN_FLIGHT)
    if limit < 1:
        raise ValueError("num_samples_in_parallel must be >= 1")
    in_q: asyncio.Queue = asyncio.Queue(maxsize=limit)
    out_q: asyncio.Queue = asyncio.Queue(maxsize=limit)
    workers: list[asyncio.Task] = []
    options = dict(
        server_client=server_client,
        agent_name=agent_name,
        request_timeout_s=request_timeout_s,
        retry_policy=retry_policy,
        max_rollout_attempts=get_max_rollout_attempts(),
        capture_dir=_capture_dir(server_client),
        stack_health=stack_health,
    )

    async def work() -> None:
        while True:
            row = await in_q.get()
            if row is _STOP:
                await out_q.put(_WorkerDone())
                return
            try:
                result = await _run_one(row, **options)
            except asyncio.CancelledError:
                raise
            except StackServerFailed as exc:  # not this row's failure: the collection stops
                await out_q.put(_StackFailed(exc))
                return
            except Exception as exc:  # a bug, not a rollout failure: still data, never a hang
                result = RolloutResult(row, error_type=type(exc).__name__, message=truncate_message(str(exc)), attempts=1)
            await out_q.put(result)

    async def put(row: Any) -> None:
        if not isinstance(row, dict):
            raise TypeError(f"iter_rollouts: rows must be dicts, got {type(row).__name__}")
        await in_q.put(row)
        if len(workers) < limit:  # workers are started as rows arrive, up to the cap
            workers.append(asyncio.ensure_future(work()))

    async def feed() -> None:
        try:
            if hasattr(rows, "__aiter__"):
                async for row in rows:  # type: ignore[union-attr]
                    await put(row)
            else:
                for row in rows:  # type: ignore[union-attr]
                    await put(row)
        except asyncio.CancelledError:
            raise
        except BaseException as exc:
            await out_q.put(_FeedCrashed(exc))
            return
        for _ in workers:
            await in_q.put(_STOP)
        await out_q.put(_FeedDone(len(workers)))

    feeder = asyncio.ensure_future(feed())
    expected: Optional[int] = None
    done_workers = 0
    try:
        while expected is None or done_workers < expected:
            item = await out_q.get()
            if isinstance(item, RolloutResult):
                yield item
            elif isinstance(item, _WorkerDone):
                done_workers += 1
            elif isinstance(item, _FeedDone):
                expected = item.workers
            elif isinstance(item, _FeedCrashed):
                raise item.exc
            elif isinstance(item, _StackFailed):
                raise item.exc
    finally:
        pending = [t for t in (feeder, *workers) if not t.done()]
        for task in pending:
            task.cancel()
        if pending:
            await asyncio.gather(*pending, return_exceptions=True)


# --------------------------------------------------------------------------------------------------------
# The command


def agent_names_in_config(cfg: Any) -> list[str]:
    """Server ids of the agent blocks (`<id>: {responses_api_agents: {...}}`) in a global config."""
    names = []
    try:
        items = list(cfg.items())
    except Exception:
        return names
    for key, block in items:
        try:
            if hasattr(block, "keys") and AGENT_SERVER_TYPE in block.keys():
                names.append(str(key))
        except Exception:
            continue
    return names


class ProgressDisplay:
    """The live bar on stderr: done, ok / incomplete / failed (`rollouts/outcome.py`), rollouts per second, mean
    reward so far, ETA."""

    def __init__(self, total: int, already_done: int, enabled: bool) -> None:
        self.total = total
        self.done = already_done
        self.new_done = 0
        self.failed = 0
        self.outcomes = OutcomeCounts()
        self.reward_sum = 0.0
        self.reward_count = 0
        self.start = time.monotonic()
        self._progress = None
        if enabled:
            from rich.console import Console
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

            self._progress = Progress(
                TextColumn("[bold]rollouts"),
                BarColumn(),
                MofNCompleteColumn(),
                TextColumn("ok [green]{task.fields[ok]}[/]"),
                TextColumn("incomplete [yellow]{task.fields[incomplete]}[/]"),
                TextColumn("failed [red]{task.fields[failed]}[/]"),
                TextColumn("{task.fields[rate]} rollouts/s"),
                TextColumn("mean reward {task.fields[mean_reward]}"),
                TextColumn("ETA"),
                TimeRemainingColumn(),
                console=Console(stderr=True),
                refresh_per_second=4,
            )
            self._task = self._progress.add_task(
                "collect", total=total, completed=already_done, ok=0, incomplete=0, failed=0, rate="-",
                mean_reward="-",
            )  # fmt: skip
            self._progress.start()

    @property
    def mean_reward(self) -> Optional[float]:
        return self.reward_sum / self.reward_count if self.reward_count else None

    def update(self, result: RolloutResult) -> None:
        self.outcomes.add(result.outcome)
        if result.ok:
            self.done += 1
            self.new_done += 1
            reward = result.reward
            if reward is not None:
                self.reward_sum += reward
                self.reward_count += 1
        else:
            self.failed += 1
        if self._progress is not None:
            elapsed = max(time.monotonic() - self.start, 1e-9)
            mean = self.mean_reward
            self._progress.update(
                self._task,
                completed=self.done + self.failed,
                ok=self.outcomes.ok,
                incomplete=self.outcomes.incomplete,
                failed=self.outcomes.failed,
                rate=f"{(self.new_done + self.failed) / elapsed:.1f}",
                mean_reward="-" if mean is None else f"{mean:.3f}",
            )

    def stop(self) -> None:
        if self._progress is not None:
            self._progress.stop()
            self._progress = None


@dataclass
class CollectionOutcome:
    total: int = 0
    cached: int = 0
    succeeded: int = 0
    failed: int = 0
    mean_reward: Optional[float] = None
    paths: Optional[CollectionPaths] = None
    failure_types: dict[str, int] = field(default_factory=dict)
    aggregate_entries: list[dict] = field(default_factory=list)
    aggregation_problems: list[str] = field(default_factory=list)  # one line per agent that gave no metrics
    # Resume: keys of earlier runs' declared failures not run again ("terminal" / "exhausted" -> count).
    not_retried: dict[str, int] = field(default_factory=dict)
    max_rollout_attempts: int = 0
    not_persisted: int = 0
    history: Optional["FailureHistory"] = None
    recovered: set[int] = field(default_factory=set)  # keys with failure lines of earlier runs that succeeded now
    # Set when the collection stopped because a server its agents need has failed (`http/stack_health.py`).
    stopped: Optional[StackServerFailed] = None
    # The drift check of each new rollout's token trajectory, counted as it is written (`workbench/tokens.py`).
    trajectories: Optional[Any] = None
    # ok / incomplete / failed of the new rollouts (`rollouts/outcome.py`), counted as they are written.
    outcomes: OutcomeCounts = field(default_factory=OutcomeCounts)


async def _collect(
    config: RolloutCollectionConfig,
    server_client: Any,
    rows: Iterable[dict],
    paths: CollectionPaths,
    display: ProgressDisplay,
    outcome: CollectionOutcome,
    stack_health: Optional[StackHealth] = None,
) -> None:
    from nemo_gym.workbench.tokens import TrajectoryCounts, classify_trajectory

    outcome.trajectories = TrajectoryCounts()
    with open(paths.output, "ab") as out, open(paths.failures, "ab") as fails:
        try:
            async for result in iter_rollouts(
                rows,
                server_client=server_client,
                agent_name=config.agent_name,
                num_samples_in_parallel=config.num_samples_in_parallel,
                max_attempts=config.max_attempts,
                request_timeout_s=config.request_timeout_s,
                retry_backoff_s=config.retry_backoff_s,
                retry_backoff_max_s=config.retry_backoff_max_s,
                stack_health=stack_health,
            ):
                record_result(result, out, fails, outcome)
                if result.ok:
                    outcome.trajectories.add(classify_trajectory(result.result))
                display.update(result)
                if result.ok and outcome.history is not None and outcome.history.recorded:
                    key = rollout_key(result.task_index, result.rollout_index)
                    if key in outcome.history.recorded:
                        outcome.recovered.add(key)
        except StackServerFailed as exc:  # rollouts in flight were cancelled, the rest not started
            outcome.stopped = exc
            return  # no aggregation over a partial run: the resume that finishes it aggregates
    if not config.disable_aggregation:
        await _aggregate(config, server_client, paths, outcome)


async def _aggregate(
    config: RolloutCollectionConfig, server_client: Any, paths: CollectionPaths, outcome: CollectionOutcome
) -> None:
    """`<stem>_aggregate_metrics.json` from each agent's `/aggregate_metrics` over its successful rollouts (those of
    earlier runs included when resuming); nothing when there are none."""
    from nemo_gym.rollouts.aggregation import (
        TooManyToAggregate,
        aggregate_by_agent,
        read_results_by_agent,
        write_aggregate_metrics,
    )

    paths.aggregate_metrics.unlink(missing_ok=True)  # never a stale file beside missing metrics
    try:
        groups = read_results_by_agent(
            paths.output, default_agent=config.agent_name, max_rollouts=config.aggregation_max_rollouts, encoded=True
        )
    except TooManyToAggregate as exc:
        outcome.aggregation_problems.append(
            f"{exc}, over +aggregation_max_rollouts={config.aggregation_max_rollouts} (the agent holds them all in "
            "memory); raise it, or +disable_aggregation=true"
        )
        return
    if not groups:
        return
    entries, problems = await aggregate_by_agent(server_client, groups)
    outcome.aggregation_problems.extend(problems)
    if entries:
        write_aggregate_metrics(paths.aggregate_metrics, entries)
        outcome.aggregate_entries = entries


def read_outcome(
    outcome: Any, *, step: str, target: str, request_timeout_s: Optional[float]
) -> tuple[Optional[dict], Optional[int], str, str]:
    """What one retried call to our servers came to: `(answer, status, "", "")` for a 2xx JSON object, else
    `(None, status or None, error_type, message)`: our deadline passed (`Timeout`), the call raised (transport
    errors, unknown server id, ...: the exception's name), a non-2xx answer (`HTTPError`, with its body) or a 2xx
    that is not a JSON object (`InvalidResponse`)."""
    exc = outcome.error
    if type(exc) is TimeoutError and request_timeout_s is not None:  # our deadline, not a client's own timeout
        return None, None, "Timeout", f"{step} did not answer within {request_timeout_s} s"
    if exc is not None:
        return None, None, type(exc).__name__, str(exc) or repr(exc)
    response = outcome.result
    status, body = response.status_code, response.content
    if not 200 <= status < 300:
        return None, status, "HTTPError", f"{target} answered HTTP {status}: {body.decode('utf-8', errors='replace')}"
    try:
        data = orjson.loads(body)
        if not isinstance(data, dict):
            raise ValueError(f"expected a JSON object, got {type(data).__name__}")
    except Exception as bad:
        return None, status, "InvalidResponse", f"{step} answered {status} with {bad}"
    return data, status, "", ""


def record_result(result: RolloutResult, out: Any, fails: Any, tally: Any) -> None:
    """Append a finished row to the output, or its failure record to the failures file (flushed at once, so
    nothing collected is lost on a crash), and count it in `tally` (`succeeded`, `failed`, `failure_types`, and
    `outcomes` when it has one: ok / incomplete / failed)."""
    counts = getattr(tally, "outcomes", None)
    if counts is not None:
        counts.add(result.outcome)
    if result.ok:
        out.write(orjson.dumps(result.result, option=orjson.OPT_SERIALIZE_NUMPY) + b"\n")
        out.flush()
        tally.succeeded += 1
    else:
        if result.persist:
            fails.write(orjson.dumps(result.failure_record()) + b"\n")
            fails.flush()
        elif hasattr(tally, "not_persisted"):  # a `_ng_no_persist` answer is written nowhere: resume runs it again
            tally.not_persisted += 1
        tally.failed += 1
        kind = result.error_type or "?"
        tally.failure_types[kind] = tally.failure_types.get(kind, 0) + 1


def _err(text: str) -> None:
    sys.stderr.write(text.rstrip("\n") + "\n")
    sys.stderr.flush()


def check_output_paths(paths: CollectionPaths, input_path: Path) -> None:
    """Refuse, before any work, an output path that cannot be written or that would overwrite the input (a
    run without resume starts its output files afresh). A missing output folder is fine: it is created."""
    out = paths.output
    if out.is_dir():
        raise NeMoGymConfigError(
            f"+output_jsonl_fpath={out} is a folder; give a file path in it, e.g. {out / 'rollouts.jsonl'}."
        )
    for parent in (out.parent, *out.parent.parents):
        if parent.exists():
            if not parent.is_dir():
                raise NeMoGymConfigError(
                    f"+output_jsonl_fpath={out}: {parent} is a file, not a folder, so the output cannot go there."
                )
            break
    try:
        same = input_path.exists() and any(
            p.exists() and os.path.samefile(p, input_path)
            for p in (out, paths.failures, paths.materialized_inputs, paths.reward_profiling, paths.agent_metrics, paths.aggregate_metrics)
        )
    except OSError:
        same = False
    if same:
        raise NeMoGymConfigError(
            f"+output_jsonl_fpath={out} would overwrite the input file {input_path} (the output and its "
            f"_materialized_inputs / _failures / _reward_profiling files are written afresh). Choose another "
            "output path."
        )


def run_from_config(
    config: RolloutCollectionConfig,
    *,
    head_server_config: Any = None,
    server_client: Any = None,
    profile: bool = True,
) -> int:
    """Collect rollouts as `config` says and return the exit code (0 ok, 1 some rollouts failed, 130
    interrupted). Before any rollout starts (and before any earlier output is touched): an output path that cannot
    be written or would overwrite the input, an empty input and input problems raise `NeMoGymConfigError`
    (`InputValidationError` for bad lines); an unreachable stack prints the reason and returns 1. A server the
    agents need that `ng_run` marked failed raises `NeMoGymStackError` naming it (exit 1 from the CLI): before any
    rollout starts, or mid-run once an attempt fails and the head server confirms it (what was written is kept, the
    rest is neither run nor recorded; `resume_from_cache=true` runs it later).

    `server_client` defaults to `ServerClient.load_from_global_config(head_server_config)` (the running stack)."""
    paths = CollectionPaths(Path(config.output_jsonl_fpath).expanduser())
    input_path = resolve_input_path(config.input_jsonl_fpath)
    check_output_paths(paths, input_path)
    if server_client is None:
        from nemo_gym.http.client import ServerClient

        try:
            server_client = ServerClient.load_from_global_config(head_server_config)
        except ValueError as exc:  # the CLI checks this first (cli/commands/collect.py); Python callers get 1
            _err(f"error: ng_collect_rollouts: {exc}")
            return 1
    known_agents = agent_names_in_config(server_client.global_config_dict)
    if config.agent_name and known_agents and config.agent_name not in known_agents:
        # Checked even when every row names its own agent: a mistyped name must not pass silently.
        raise NeMoGymConfigError(
            f"`+agent_name={config.agent_name}` is not an agent of the running stack "
            f"(agents: {', '.join(sorted(known_agents))}).{did_you_mean(config.agent_name, known_agents)}"
        )

    resume = bool(config.resume_from_cache) and paths.output.exists()
    paths.output.parent.mkdir(parents=True, exist_ok=True)
    if resume and paths.materialized_inputs.exists():
        stats = validate_materialized_file(paths.materialized_inputs, known_agents=known_agents)
        _err(
            f"Resuming from {paths.output} with the {stats.num_rows} rollouts listed in {paths.materialized_inputs} "
            f"(input, limit, repeats and overrides are those of the first run)."
        )
    else:
        stats = materialize_input_file(
            input_path,
            paths.materialized_inputs,
            limit=config.limit,
            agent_name=config.agent_name,
            num_repeats=config.num_repeats,
            num_repeats_add_seed=config.num_repeats_add_seed,
            responses_create_params=config.responses_create_params,
            known_agents=known_agents,
            prompt_config=config.prompt_config,
            skills_ref=_load_skills(config),
        )

    # Before any earlier output is touched: a server the agents need that ng_run gave up on stops us here.
    stack_health = StackHealth.for_collection(server_client, sorted(stats.agents) or [config.agent_name or ""])
    if stack_health is not None:
        try:
            stack_health.raise_if_failed_now(max_age=0)
        except StackServerFailed as exc:
            stack_health.close()
            kept = f"; {paths.output} was left as it was" if paths.output.exists() else ""
            raise NeMoGymStackError(exc.message(f"No rollout was started{kept}.", resume=resume)) from None

    finished: Union[set[int], FinishedRollouts] = set()
    history = FailureHistory()
    max_rollout_attempts = get_max_rollout_attempts()
    if resume:
        # Kept and appended to (v0.5): its lines are the attempts of earlier runs, which the resume policy counts.
        history = read_failure_history(paths.failures)
        cut = repair_jsonl_tail(paths.output)
        if cut:
            _err(f"Removed a torn last line ({cut} bytes) from {paths.output}; that rollout runs again.")
        space = RolloutKeySpace.from_pairs(lambda: iter_materialized_pairs(paths.materialized_inputs))
        finished, bad = read_finished_keys(paths.output, into=FinishedRollouts(space))
        if bad:
            _err(f"Warning: {bad} unreadable line(s) in {paths.output} were ignored.")
    else:
        paths.output.unlink(missing_ok=True)
        paths.failures.unlink(missing_ok=True)
    paths.aggregate_metrics.unlink(missing_ok=True)  # written anew at the end, over all rollouts of the output
    paths.output.touch()

    from nemo_gym.rollouts.merge import parse_shard

    shard = parse_shard(config.shard)
    total = stats.num_rows
    if shard is not None:
        total = sum(1 for task, _ in iter_materialized_pairs(paths.materialized_inputs) if task in shard)
        _err(f"Shard {shard}: {total} of the {stats.num_rows} rollouts (tasks whose index mod {shard.count} is {shard.index - 1}).")
    outcome = CollectionOutcome(total=total, paths=paths)
    cached = 0
    if finished or history.attempts:
        # Count only keys that belong to these inputs (a streaming pass, nothing kept).
        for row in iter_materialized_keys(paths.materialized_inputs):
            if shard is not None and (row >> 32) not in shard:
                continue
            if row in finished:
                cached += 1
                continue
            reason = history.skip_reason(row, max_rollout_attempts)
            if reason is not None:
                outcome.not_retried[reason] = outcome.not_retried.get(reason, 0) + 1
    outcome.cached = cached
    outcome.max_rollout_attempts = max_rollout_attempts
    outcome.history = history

    fit_connection_limits(server_client, int(config.num_samples_in_parallel or DEFAULT_MAX_IN_FLIGHT))
    display = ProgressDisplay(total - sum(outcome.not_retried.values()), cached, enabled=config.progress_bar)
    interrupted = False
    try:
        asyncio.run(
            _collect(
                config,
                server_client,
                iter_pending_rows(paths.materialized_inputs, finished, shard, history, max_rollout_attempts),
                paths,
                display,
                outcome,
                stack_health,
            )
        )
    except KeyboardInterrupt:
        interrupted = True
    finally:
        display.stop()
        if stack_health is not None:
            stack_health.close()
    outcome.mean_reward = display.mean_reward
    del finished
    drop_recovered_failures(paths.failures, outcome.recovered)

    if paths.failures.exists() and paths.failures.stat().st_size == 0:
        paths.failures.unlink()

    if interrupted:
        _err(
            f"Interrupted: {outcome.succeeded} new rollouts were saved to {paths.output}. "
            f"Rerun with +resume_from_cache=true to finish."
        )
        return 130

    if outcome.stopped is not None:
        done = outcome.succeeded + outcome.failed
        left = total - outcome.cached - sum(outcome.not_retried.values()) - done
        saved = f"{outcome.succeeded} new rollout(s) saved to {paths.output}"
        if outcome.failed:
            saved += f", {outcome.failed} failed before that (in {paths.failures})"
        raise NeMoGymStackError(
            outcome.stopped.message(f"The collection stopped: {saved}; {left} not run (not recorded as failures).")
        )

    if profile:
        from nemo_gym.rollouts.reward_profile import profile_collection

        profile_collection(paths, pass_threshold=config.pass_threshold, describe=False)  # _print_outcome says it

    _print_outcome(outcome)
    return 1 if outcome.failed or outcome.not_retried or outcome.aggregation_problems else 0


def fit_connection_limits(server_client: Any, parallel: int) -> None:
    """Make `parallel` rollouts in flight real, before the client's first request.

    - The collector's own client: its per-host (and total) connection limit is raised to `parallel` by setting
      `global_aiohttp_connector_limit_per_host` (`global_aiohttp_connector_limit`) in the config it was built from,
      which the shared client reads when it creates its pool on the collection's event loop; the open-files limit
      of this process is raised to fit too.
    - The stack's servers read the same key from the config `ng_run` gave them and cannot be changed from here: when
      their limit is lower, one line says that an agent then sends at most that many requests at once to its model
      server (so not all rollouts progress at once), and how to start the stack so it does not."""
    from nemo_gym.config.values import config_get
    from nemo_gym.http.client import DEFAULT_CONNECTOR_LIMIT, DEFAULT_CONNECTOR_LIMIT_PER_HOST, ServerClient

    _raise_open_files_limit(parallel + 256)
    if not isinstance(server_client, ServerClient):
        return
    cfg = server_client.global_config_dict
    try:
        stack_per_host = int(config_get(cfg, CONNECTION_LIMIT_PER_HOST_KEY, DEFAULT_CONNECTOR_LIMIT_PER_HOST))
        total = int(config_get(cfg, CONNECTION_LIMIT_KEY, DEFAULT_CONNECTOR_LIMIT))
    except (TypeError, ValueError):
        return
    try:
        if 0 < stack_per_host < parallel:
            cfg[CONNECTION_LIMIT_PER_HOST_KEY] = parallel
        if 0 < total < parallel:
            cfg[CONNECTION_LIMIT_KEY] = parallel
    except Exception as exc:  # a read-only config: say so, the run goes on at the lower limit
        _err(
            f"Warning: could not raise this client's connection limit to +num_samples_in_parallel={parallel} "
            f"({type(exc).__name__}: {exc}); at most {stack_per_host} rollouts will be in flight."
        )
        return
    if 0 < stack_per_host < parallel:
        _err(
            f"Note: +num_samples_in_parallel={parallel} is above the stack's per-host connection limit "
            f"({CONNECTION_LIMIT_PER_HOST_KEY}={stack_per_host}, which ng_run gave every server): an agent process "
            f"sends at most {stack_per_host} requests at once to its model server, so the other rollouts in it wait "
            f"for a connection. To run {parallel} at once, start ng_run with "
            f"+{CONNECTION_LIMIT_PER_HOST_KEY}={parallel} (ng_status shows each server's limit)."
        )


def _raise_open_files_limit(want: int) -> None:
    """Raise this process's soft RLIMIT_NOFILE to `want` (up to the hard limit): one socket per rollout in flight."""
    try:
        import resource
    except ImportError:  # pragma: no cover - not on POSIX
        return
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY or soft >= want:
        return
    target = want if hard == resource.RLIM_INFINITY else min(hard, want)
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
    except (ValueError, OSError):
        pass
    if target < want:
        _err(
            f"Warning: the open-files limit ({target}, hard limit) is below the {want} this many rollouts in flight "
            "need; raise it with `ulimit -n` or lower +num_samples_in_parallel."
        )


def _load_skills(config: RolloutCollectionConfig) -> Optional[dict]:
    """The `skills_ref` of `+skills.path`, or None; a bad skills folder is a config error naming it."""
    if config.skills is None:
        return None
    from nemo_gym.rollouts.skills import skills_ref_from_config

    try:
        return skills_ref_from_config(config.skills)
    except ValueError as exc:
        raise NeMoGymConfigError(f"+skills.path={config.skills.path}: {exc}") from None


def iter_materialized_keys(materialized_path: Path) -> Iterator[int]:
    """The packed (task, rollout) key of every row of a materialized-inputs file."""
    for task, rollout in iter_materialized_pairs(materialized_path):
        yield rollout_key(task, rollout)


def iter_materialized_pairs(materialized_path: Path) -> Iterator[tuple[int, int]]:
    """The (task, rollout) of every row of a materialized-inputs file, in file order."""
    with open(materialized_path, "rb") as f:
        for line in f:
            line = line.strip()
            if line:
                row = orjson.loads(line)
                yield row[TASK_INDEX_KEY_NAME], row[ROLLOUT_INDEX_KEY_NAME]


def _print_outcome(outcome: CollectionOutcome) -> None:
    paths = outcome.paths
    assert paths is not None
    new = outcome.succeeded
    parts = [f"{outcome.cached + new} / {outcome.total} rollouts in {paths.output}"]
    if outcome.cached:
        parts.append(f"{outcome.cached} from an earlier run, {new} new")
    if outcome.mean_reward is not None:
        parts.append(f"mean reward of new rollouts {outcome.mean_reward:.4f}")
    print("Collected " + "; ".join(parts) + ".")
    counts = outcome.outcomes
    print(counts.describe("new rollout" if outcome.cached else "rollout") + ".")
    if counts.incomplete:
        print(INCOMPLETE_NOTE)
    print(f"Materialized inputs: {paths.materialized_inputs}")
    if paths.reward_profiling.exists():
        print(f"Reward profiling:    {paths.reward_profiling}")
    if paths.agent_metrics.exists():
        print(f"Agent metrics:       {paths.agent_metrics}")
    if outcome.aggregate_entries:
        from nemo_gym.rollouts.aggregation import print_key_metrics

        print(f"Aggregate metrics:   {paths.aggregate_metrics}")
        print_key_metrics(outcome.aggregate_entries)
    for problem in outcome.aggregation_problems:
        _err(f"error: no aggregate metrics: {problem} (the rollouts are saved; `ng_aggregate_rollouts` can retry).")
    trajectories = outcome.trajectories
    if trajectories is not None and trajectories.with_token_data:  # nothing when no rollout carries token ids
        print(f"Token data of the {trajectories.total} new rollouts: {trajectories.summary()}.")
    if outcome.failed:
        kinds = ", ".join(f"{n} {k}" for k, n in sorted(outcome.failure_types.items()))
        where = f"details in {paths.failures}"
        if outcome.not_persisted:
            where += f" ({outcome.not_persisted} marked _ng_no_persist are recorded nowhere)"
        _err(
            f"{outcome.failed} rollout(s) failed after retries ({kinds}); {where}. "
            f"Rerun with +resume_from_cache=true to retry those not terminal and under "
            f"{MAX_ROLLOUT_ATTEMPTS_ENV_VAR_NAME}={outcome.max_rollout_attempts or get_max_rollout_attempts()} attempts."
        )
    if outcome.not_retried:
        terminal, exhausted = outcome.not_retried.get("terminal", 0), outcome.not_retried.get("exhausted", 0)
        _err(
            f"Not run again: {terminal} rollout(s) whose failure is terminal (_ng_failure_terminal) and {exhausted} "
            f"that already failed {outcome.max_rollout_attempts} time(s) ({MAX_ROLLOUT_ATTEMPTS_ENV_VAR_NAME}); "
            f"their records are in {paths.failures}. Raise {MAX_ROLLOUT_ATTEMPTS_ENV_VAR_NAME} to try the "
            "latter again."
        )
    sys.stdout.flush()

