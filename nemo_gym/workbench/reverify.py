"""`ng_reverify`: score saved rollouts again with the current verifier, without calling any model.

Why: a verifier changes (a bug fixed, a threshold moved, an answer key corrected) and rollouts already collected
should be re-scored without paying for generation again. Each saved row goes to its resources server the way the
agent sent it the first time: `/seed_session` with the row (without `response` and `reward`), then `/verify` with
the row and its saved `response`, on one cookie jar per row (a stateful resources server answers 409 to a cookie
it did not issue, and finds the row's seeded state again in `/verify`).

What it writes:
- the output: every row with the verifier's answer merged over it (as simple_agent merges it), `reward` the new
  reward and `_ng_previous_reward` the reward the row had in the input (null when it had none);
- `<stem>_failures.jsonl` beside it: the rows that could not be re-verified after retries (the collector's
  failure records: indices, error type, message, HTTP status, server, attempts, row). One bad row never stops
  the run; the command then exits 1.
Then a diff on stdout: rows whose reward changed, mean reward before and after, the first changed rows.

Which resources server scores a row: `+resources_server_name` for every row; else the `resources_server` of the
row's agent (`agent_ref.name`, else `+agent_name`) in the stack's config; else the stack's only resources server.
A config without agent blocks (resources servers only, as v0.5 recommends) sends every row to its only resources
server; with several, `+resources_server_name` must choose.
Which stack: when the config has server blocks (`+config_paths=[...]`), the resources servers the rows need (and
the servers they refer to, e.g. a judge model) are started with ng_run's launcher for this run and stopped at the
end; otherwise the running stack that the head server (`+head_server.host/port`) describes.

Resume: rows are identified by (`_ng_task_index`, `_ng_rollout_index`), which every collected rollout carries.
Re-running with an existing output keeps the rows in it and re-verifies the others (the failed ones included);
`+resume_from_cache=false` starts afresh. The input is checked in one streaming pass before anything runs (every
problem reported as `file:line: ...`); memory stays flat apart from a few bytes of bookkeeping per row. Lines that
are not JSON objects follow the policy of every rollouts command (`nemo_gym.rollouts.jsonl`): refused with the
other problems (exit 2) unless `+skip_bad_lines=true` (`--skip-bad-lines`) skips and lists them. The output grows
row by row so that an interrupted run resumes; an output that got no row is removed.

Limit: tool calls are not replayed, so a verifier that grades the state the rollout's tool calls left in the
session (not the state `/seed_session` builds) does not see that state.
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import os
import signal
import sys
import threading
from array import array
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator, Optional

import orjson
from pydantic import Field

from nemo_gym.config.types import AGENT_SERVER_TYPE, RESOURCES_SERVER_TYPE, BaseNeMoGymCLIConfig, is_server_ref
from nemo_gym.config.values import is_mapping
from nemo_gym.errors import NeMoGymConfigError, NeMoGymStackError, did_you_mean
from nemo_gym.rollouts.collection import (
    DEFAULT_MAX_IN_FLIGHT,
    MAX_REPORTED_PROBLEMS,
    ROLLOUT_INDEX_KEY_NAME,
    TASK_INDEX_KEY_NAME,
    CollectionOutcome,
    CollectionPaths,
    InputProblem,
    InputValidationError,
    RolloutResult,
    read_outcome,
    record_result,
    agent_name_of,
    rollout_key,
    ProgressDisplay,
    truncate_message,
    check_output_paths,
    read_finished_keys,
    repair_jsonl_tail,
    resolve_input_path,
)
from nemo_gym.rollouts.failure_routing import NG_FAILURE_JUDGE_ERROR_KEY, declared_failure
from nemo_gym.rollouts.jsonl import SKIP_BAD_LINES_HELP, BadLines, iter_jsonl_objects, read_rows
from nemo_gym.rollouts.outcome import INCOMPLETE_NOTE
from nemo_gym.rollouts.row_keys import FinishedRollouts, RolloutKeySpace

__all__ = [
    "PREVIOUS_REWARD_KEY_NAME",
    "ReverifyConfig",
    "VerifierRouting",
    "CheckedRollouts",
    "RewardDiff",
    "check_rollouts_file",
    "servers_needed",
    "started_servers",
    "reward_diff",
    "reverify_from_config",
]

PREVIOUS_REWARD_KEY_NAME = "_ng_previous_reward"
REWARD_KEY_NAME = "reward"
# Fields a row carries that are not part of what the agent sent: never sent to the verifier.
_SCORE_KEYS = (REWARD_KEY_NAME, PREVIOUS_REWARD_KEY_NAME)


class ReverifyConfig(BaseNeMoGymCLIConfig):
    """Re-score saved rollouts with the current resources servers: POST every row (with its saved `response`) to
    its resources server's /verify (after /seed_session), no model calls. Writes the rows with the new `reward` and
    the old one in `_ng_previous_reward`, <stem>_failures.jsonl for rows that could not be re-verified (exit code 1),
    and prints what changed. Rows already in the output are kept (resume). With server blocks in the config
    ("+config_paths=[...]") the resources servers the rows need are started for the run; otherwise the running
    stack of +head_server.host/port is used.
    Example: ng_reverify "+config_paths=[configs/quickstart.yaml]" +input_jsonl_fpath=results/rollouts.jsonl
    +output_jsonl_fpath=results/rollouts_reverified.jsonl"""

    input_jsonl_fpath: str = Field(description="The saved rollouts (JSONL, as ng_collect_rollouts writes them).")
    output_jsonl_fpath: str = Field(description="Where to write the re-scored rollouts (JSONL; not the input file).")
    resources_server_name: Optional[str] = Field(
        default=None, description="Score every row with this resources server (server id) instead of its agent's."
    )
    agent_name: Optional[str] = Field(
        default=None, description="Agent (server id) whose resources server scores rows without `agent_ref`."
    )
    limit: Optional[int] = Field(default=None, ge=1, description="Re-verify only the first `limit` rows.")
    num_samples_in_parallel: Optional[int] = Field(
        default=None, ge=1, description=f"Maximum rows in flight (null = {DEFAULT_MAX_IN_FLIGHT})."
    )
    resume_from_cache: bool = Field(
        default=True, description="Keep the rows already in the output and re-verify only the others."
    )
    seed_session: bool = Field(
        default=True, description="Call /seed_session with the row before /verify, as the agent did."
    )
    start_servers: Optional[bool] = Field(
        default=None,
        description=(
            "Start the needed resources servers from the config's server blocks (null: when the config has any; "
            "false: always use the running stack)."
        ),
    )
    max_attempts: int = Field(
        default=3, ge=1, description="Attempts per row on connection errors, timeouts, HTTP 429, 500, 502-504."
    )
    request_timeout_s: Optional[float] = Field(
        default=None, gt=0, description="Give up on one attempt (seed + verify) after this many seconds."
    )
    retry_backoff_s: float = Field(default=1.0, ge=0, description="Base of the backoff between attempts.")
    retry_backoff_max_s: float = Field(default=30.0, ge=0, description="Cap of one backoff sleep.")
    num_changed_rows_shown: int = Field(default=10, ge=0, description="Changed rows listed in the diff.")
    force: bool = Field(
        default=False,
        description="Re-score even with a resources server whose GET /reverify_mode says `unsupported`.",
    )
    disable_aggregation: bool = Field(
        default=False,
        description="Skip /aggregate_metrics of each resources server over the output (<stem>_aggregate_metrics.json).",
    )
    progress_bar: bool = Field(default=True, description="Show a live progress bar on stderr.")
    skip_bad_lines: bool = Field(default=False, description=SKIP_BAD_LINES_HELP)


def _err(text: str) -> None:
    sys.stderr.write(text.rstrip("\n") + "\n")
    sys.stderr.flush()


# --------------------------------------------------------------------------------------------------------
# Which resources server scores a row


class _RowProblem(Exception):
    pass


class VerifierRouting:
    """Finds the resources server (server id) that scores a row, from a stack's global config."""

    def __init__(self, cfg: Any, *, resources_server_name: Optional[str] = None, agent_name: Optional[str] = None):
        from nemo_gym.config.global_config import find_server_instances

        self.cfg = cfg
        specs = find_server_instances(cfg)
        self.resources_servers = [s.server_id for s in specs if s.server_type == RESOURCES_SERVER_TYPE]
        self.agents = [s.server_id for s in specs if s.server_type == AGENT_SERVER_TYPE]
        self.fixed = resources_server_name
        self.agent_name = agent_name
        if resources_server_name is not None and resources_server_name not in self.resources_servers:
            raise NeMoGymConfigError(
                f"`+resources_server_name={resources_server_name}` is not a resources server of the stack (resources "
                f"servers: {', '.join(self.resources_servers) or '(none)'})."
                f"{did_you_mean(resources_server_name, self.resources_servers)}"
            )
        if agent_name is not None and agent_name not in self.agents:
            raise NeMoGymConfigError(
                f"`+agent_name={agent_name}` is not an agent of the stack "
                f"(agents: {', '.join(self.agents) or '(none)'})."
                f"{did_you_mean(agent_name, self.agents)}"
            )
        if self.fixed is None and agent_name is None and not self.agents and self.resources_servers:
            # A config of resources servers only (as v0.5 recommends for reverify): no agent to route rows by.
            if len(self.resources_servers) > 1:
                raise NeMoGymConfigError(
                    f"the config has no agent blocks to route rows by and {len(self.resources_servers)} resources "
                    f"servers ({', '.join(self.resources_servers)}); pass +resources_server_name=<one of them>."
                )
            self.fixed = self.resources_servers[0]
        self._by_agent: dict[str, str] = {}

    def server_for(self, row: dict) -> str:
        """The resources server of `row`; `_RowProblem` says why there is none."""
        if self.fixed is not None:
            return self.fixed
        ref = row.get("agent_ref")
        agent = ref.get("name") if isinstance(ref, dict) else None
        if not isinstance(agent, str) or not agent:
            agent = self.agent_name
        if agent is None:
            if len(self.resources_servers) == 1:
                return self.resources_servers[0]
            raise _RowProblem(
                "no `agent_ref.name`, and the stack has "
                f"{len(self.resources_servers)} resources servers ({', '.join(self.resources_servers) or 'none'}); "
                "pass +agent_name=<agent> or +resources_server_name=<resources server>"
            )
        found = self._by_agent.get(agent)
        if found is None:
            found = self._by_agent[agent] = self._agent_resources_server(agent)
        return found

    def _agent_resources_server(self, agent: str) -> str:
        if agent not in self.agents:
            raise _RowProblem(
                f"agent `{agent}` is not in the stack (agents: {', '.join(self.agents) or '(none)'})."
                f"{did_you_mean(agent, self.agents)} Pass +resources_server_name=<resources server> to choose one"
            )
        from nemo_gym.config.global_config import get_first_server_config_dict

        try:
            ref = get_first_server_config_dict(self.cfg, agent).get("resources_server")
            name = ref.get("name") if is_mapping(ref) else None
        except Exception as exc:  # an interpolation that does not resolve
            raise _RowProblem(f"agent `{agent}`: cannot read its `resources_server` ({exc})") from None
        if not isinstance(name, str) or name not in self.resources_servers:
            raise _RowProblem(
                f"agent `{agent}` has no `resources_server` that the stack runs (found {name!r}); "
                "pass +resources_server_name=<resources server>"
            )
        return name


# --------------------------------------------------------------------------------------------------------
# Checking the input


@dataclass
class CheckedRollouts:
    """What the checking pass learned: the rows' (task, rollout) in file order, the servers they need and the bad
    lines skipped."""

    num_rows: int = 0
    tasks: array = field(default_factory=lambda: array("q"))
    rollouts: array = field(default_factory=lambda: array("q"))
    servers: set[str] = field(default_factory=set)
    bad_lines: BadLines = field(default_factory=BadLines)

    def pairs(self) -> Iterator[tuple[int, int]]:
        return zip(self.tasks, self.rollouts)


def _check_row(row: dict, routing: VerifierRouting) -> str:
    """The resources server of a row (a JSON object); `_RowProblem` when the row cannot be re-verified."""
    if not isinstance(row.get("response"), dict):
        raise _RowProblem(
            "no saved `response` object, so this is not a rollout (give the output of ng_collect_rollouts, not its "
            "input: the agent's saved answer is what is scored)"
        )
    for name in (TASK_INDEX_KEY_NAME, ROLLOUT_INDEX_KEY_NAME):
        value = row.get(name)
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            got = "it is missing" if value is None else f"got {value!r}"
            raise _RowProblem(
                f"`{name}` must be a non-negative integer, {got} (ng_collect_rollouts writes `{TASK_INDEX_KEY_NAME}` "
                f"and `{ROLLOUT_INDEX_KEY_NAME}` on every rollout; they identify the row on resume)"
            )
    if not isinstance(row.get("responses_create_params"), dict):
        raise _RowProblem("no `responses_create_params` object (the verifier's request needs the task's parameters)")
    reward = row.get(REWARD_KEY_NAME)
    if reward is not None and (isinstance(reward, bool) or not isinstance(reward, (int, float))):
        raise _RowProblem(f"`reward` must be a number or null, got {reward!r}")
    return routing.server_for(row)


def check_rollouts_file(
    path: Path,
    routing: VerifierRouting,
    *,
    limit: Optional[int] = None,
    max_reported: int = MAX_REPORTED_PROBLEMS,
    skip_bad_lines: bool = False,
) -> CheckedRollouts:
    """Check every row that will be used (streaming) and raise `InputValidationError` listing the problems as
    `file:line: ...`: no indices, no `response`, no resources server, the same (task, rollout) twice; with them the
    bad lines (not JSON objects), unless `skip_bad_lines`. Bad lines alone raise `BadLinesRefused`."""
    if path.is_dir():
        raise NeMoGymConfigError(f"+input_jsonl_fpath={path} is a folder; give the rollouts JSONL file in it.")
    if not path.is_file():
        raise NeMoGymConfigError(f"Rollouts file not found: {path} (+input_jsonl_fpath).")
    checked = CheckedRollouts(bad_lines=BadLines(skip=skip_bad_lines, not_done="nothing was re-verified"))
    lines = array("q")
    problems: list[InputProblem] = []
    total = 0

    def problem(lineno: int, message: str) -> None:
        nonlocal total
        total += 1
        if len(problems) < max_reported:
            problems.append(InputProblem(str(path), lineno, message))

    bad_lines = checked.bad_lines
    for line in read_rows([path], bad_lines, limit=limit, settle=False):
        try:
            server = _check_row(line.row, routing)
        except _RowProblem as exc:
            problem(line.line, str(exc))
            continue
        checked.servers.add(server)
        checked.tasks.append(line.row[TASK_INDEX_KEY_NAME])
        checked.rollouts.append(line.row[ROLLOUT_INDEX_KEY_NAME])
        lines.append(line.line)
    checked.num_rows = len(lines)
    if bad_lines.refusing and not total:
        raise bad_lines.refusal()
    if bad_lines.refusing:  # bad lines and other problems: all in one list, in file order
        problems = sorted(
            [*problems, *(InputProblem(b.path, b.line, b.problem) for b in bad_lines.first)],
            key=lambda p: p.line,
        )
        raise InputValidationError(
            problems,
            total + bad_lines.count,
            what=f"rollouts file {path}",
            fix=f"fix or remove the line(s) and rerun; {bad_lines.count} of them are bad lines (not JSON objects), "
            "which --skip-bad-lines skips",
        )
    if not total and not checked.num_rows:
        what = bad_lines.summary() if bad_lines.count else "the file is empty or holds only blank lines"
        raise NeMoGymConfigError(f"{path} has no rows ({what}), so there is nothing to re-verify.")
    if not total:  # duplicates: a second row with the same (task, rollout) could not be told apart on resume
        seen = FinishedRollouts(RolloutKeySpace.from_pairs(checked.pairs))
        first_line: dict[int, int] = {}
        for (task, rollout), lineno in zip(checked.pairs(), lines):
            key = rollout_key(task, rollout)
            if key in seen:
                if not first_line:  # a second pass finds where the first copies are (rare: only on errors)
                    first_line = _first_lines_of(checked, lines)
                problem(
                    lineno,
                    f"the same `{TASK_INDEX_KEY_NAME}`={task}, `{ROLLOUT_INDEX_KEY_NAME}`={rollout} as line "
                    f"{first_line.get(key, '?')} (a row must be unique to be resumed; remove the duplicate)",
                )
            seen.add(key)
    if total:
        raise InputValidationError(
            problems, total, what=f"rollouts file {path}", fix="fix or remove the line(s) and rerun"
        )
    return checked


def _first_lines_of(checked: CheckedRollouts, lines: array) -> dict[int, int]:
    first: dict[int, int] = {}
    for (task, rollout), lineno in zip(checked.pairs(), lines):
        first.setdefault(rollout_key(task, rollout), lineno)
    return first


# --------------------------------------------------------------------------------------------------------
# Starting what the rows need


def _refs_in(node: Any) -> Iterator[str]:
    """Server ids of every `{type, name}` reference anywhere inside a (plain) config value."""
    if isinstance(node, dict):
        if is_server_ref(node) and isinstance(node.get("name"), str):
            yield node["name"]
            return
        for value in node.values():
            yield from _refs_in(value)
    elif isinstance(node, list):
        for value in node:
            yield from _refs_in(value)


def servers_needed(cfg: Any, roots: set[str]) -> list[str]:
    """`roots` and every server they refer to, directly or not (e.g. a judge model), in config order."""
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    from nemo_gym.config.global_config import find_server_instances, get_first_server_config_dict

    order = [s.server_id for s in find_server_instances(cfg)]
    todo, seen = list(roots), set()
    while todo:
        sid = todo.pop()
        if sid in seen or sid not in order:
            continue
        seen.add(sid)
        node = get_first_server_config_dict(cfg, sid)
        try:
            plain = OmegaConf.to_container(node, resolve=True)
        except OmegaConfBaseException:
            plain = OmegaConf.to_container(node, resolve=False)
        todo.extend(_refs_in(plain))
    return [sid for sid in order if sid in seen]


def _config_with_only(cfg: Any, keep: list[str]) -> Any:
    """The global config without the server blocks that are not in `keep` (everything else stays)."""
    from omegaconf import OmegaConf

    from nemo_gym.config.global_config import find_server_instances

    drop = {s.server_id for s in find_server_instances(cfg)} - set(keep)
    data = OmegaConf.to_container(cfg, resolve=False)
    return OmegaConf.create({k: v for k, v in data.items() if k not in drop})


def _interrupt(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt


@contextlib.contextmanager
def started_servers(cfg: Any, server_ids: list[str]) -> Iterator[Any]:
    """Start only `server_ids` of `cfg` (ports allocated) with ng_run's launcher, yield the config they run
    with, and stop them whatever happens. Their output goes to stderr; SIGTERM stops them like Ctrl-C."""
    from nemo_gym.runtime.launcher import RunHelper, ServerCrashed

    sub = _config_with_only(cfg, server_ids)
    helper = RunHelper(sub, out=sys.stderr)
    main_thread = threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGTERM, _interrupt) if main_thread else None
    try:
        try:
            helper.prepare()
            helper.start_ray()
            helper.start_servers()
            seconds = helper.wait_until_ready(helper.ready_timeout_s)
        except ServerCrashed as exc:
            _err(f"ERROR: {exc}")
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else "a server crashed"
            raise NeMoGymStackError(f"{first} The full report is above.") from None
        _err(f"Started {', '.join(server_ids)} for the re-verification ({seconds:.1f} s).")
        yield sub
    finally:
        helper.shutdown()
        if main_thread:
            signal.signal(signal.SIGTERM, previous)


# --------------------------------------------------------------------------------------------------------
# Re-verifying rows


@dataclass
class _Pending:
    row: dict
    server: str


async def _reverify_one(
    item: _Pending, *, client: Any, retry_policy: Any, request_timeout_s: Optional[float], seed_session: bool
) -> RolloutResult:
    row, server = item.row, item.server
    sent = {k: v for k, v in row.items() if k not in _SCORE_KEYS}
    seed_body = {k: v for k, v in sent.items() if k != "response"}
    step = "/verify"

    async def attempt() -> Any:
        nonlocal step
        async with asyncio.timeout(request_timeout_s):
            cookies: dict[str, str] = {}  # this row's own jar: a fresh session per attempt
            if seed_session:
                step = "/seed_session"
                seeded = await client.post(server, "/seed_session", json=seed_body, cookies=cookies, max_attempts=1)
                if not 200 <= seeded.status_code < 300:
                    return seeded
                cookies = {name: morsel.value for name, morsel in seeded.cookies.items()}
            step = "/verify"
            return await client.post(server, "/verify", json=sent, cookies=cookies, max_attempts=1)

    outcome = await retry_policy.run(
        attempt, idempotent=True, label=lambda: f"POST {step} on resources server `{server}`"
    )
    data, status, error_type, message = read_outcome(
        outcome, step=step, target=f"POST {step} on resources server `{server}`", request_timeout_s=request_timeout_s
    )
    # Each call was told to try once: the client's "after 1 attempt" would contradict `attempts`.
    message = message.replace(" failed after 1 attempt:", " failed:")
    declared = declared_failure(data) if data is not None else None
    if declared is not None:  # e.g. the judge call failed: not a score, so not a re-verified row
        failure_class, terminal = declared
        detail = data.get(NG_FAILURE_JUDGE_ERROR_KEY) or ""
        return RolloutResult(
            row,
            result=data,
            error_type=failure_class,
            message=truncate_message(
                f"POST /verify on resources server `{server}` answered failure class `{failure_class}`"
                + (f": {detail}" if detail else "")
            ),
            status_code=status,
            server=server,
            agent_name=agent_name_of(row),
            attempts=outcome.attempts,
            failure_class=failure_class,
            terminal=terminal,
        )
    if data is not None:
        reward = data.get(REWARD_KEY_NAME)
        if isinstance(reward, bool) or not isinstance(reward, (int, float)):
            error_type = "InvalidResponse"
            message = f"POST /verify on resources server `{server}` answered no numeric `reward` (got {reward!r})"
        else:
            new = {**row, **data}
            new[PREVIOUS_REWARD_KEY_NAME] = row.get(REWARD_KEY_NAME)
            new[TASK_INDEX_KEY_NAME] = row[TASK_INDEX_KEY_NAME]
            new[ROLLOUT_INDEX_KEY_NAME] = row[ROLLOUT_INDEX_KEY_NAME]
            return RolloutResult(row, result=new, server=server, attempts=outcome.attempts)
    return RolloutResult(
        row,
        error_type=error_type,
        message=truncate_message(message),
        status_code=status,
        server=server,
        agent_name=agent_name_of(row),
        attempts=outcome.attempts,
    )


def _iter_pending(
    path: Path, routing: VerifierRouting, finished: Any, limit: Optional[int]
) -> Iterator[_Pending]:
    """The rows of the (already checked) input that are not in `finished`, with their resources server (bad lines
    were reported by the check and are skipped here)."""
    for line in read_rows([path], BadLines(skip=True), limit=limit):
        row = line.row
        try:
            server = _check_row(row, routing)
        except _RowProblem as exc:  # the file changed since it was checked
            raise InputValidationError([InputProblem(str(path), line.line, str(exc))]) from None
        if finished and rollout_key(row[TASK_INDEX_KEY_NAME], row[ROLLOUT_INDEX_KEY_NAME]) in finished:
            continue
        yield _Pending(row, server)


async def _run_all(
    items: Iterator[_Pending], limit: int, verify: Callable[[_Pending], Any], on_result: Callable[[RolloutResult], None]
) -> None:
    """At most `limit` rows in flight: each worker takes the next row of the shared iterator when it is free."""

    async def worker() -> None:
        for item in items:  # `next()` runs without awaiting, so workers never step on each other
            try:
                result = await verify(item)
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # a bug, not a verifier failure: still data, never a hang
                result = RolloutResult(item.row, error_type=type(exc).__name__, message=truncate_message(str(exc)), attempts=1)
            on_result(result)

    await asyncio.gather(*(worker() for _ in range(limit)))


# --------------------------------------------------------------------------------------------------------
# The diff


@dataclass
class RewardDiff:
    """Old against new rewards over the rows of an output file."""

    rows: int = 0
    changed: int = 0
    before_sum: float = 0.0
    before_count: int = 0
    after_sum: float = 0.0
    after_count: int = 0
    first_changed: list[tuple[int, int, Any, Any]] = field(default_factory=list)  # (task, rollout, old, new)

    @property
    def mean_before(self) -> Optional[float]:
        return self.before_sum / self.before_count if self.before_count else None

    @property
    def mean_after(self) -> Optional[float]:
        return self.after_sum / self.after_count if self.after_count else None


def _number(value: Any) -> Optional[float]:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def reward_diff(path: Path, show: int = 10) -> RewardDiff:
    """Stream a re-verified file: how many rewards changed, the means before and after, and the `show` changed
    rows with the smallest (task, rollout)."""
    diff = RewardDiff()
    heap: list[tuple[int, int, Any, Any]] = []  # the `show` smallest, as a max-heap on negated keys

    def ignore() -> None:
        pass

    for row in iter_jsonl_objects(path, ignore):
        old, new = _number(row.get(PREVIOUS_REWARD_KEY_NAME)), _number(row.get(REWARD_KEY_NAME))
        diff.rows += 1
        if old is not None:
            diff.before_sum += old
            diff.before_count += 1
        if new is not None:
            diff.after_sum += new
            diff.after_count += 1
        if old == new:
            continue
        diff.changed += 1
        task, rollout = row.get(TASK_INDEX_KEY_NAME, -1), row.get(ROLLOUT_INDEX_KEY_NAME, -1)
        entry = (-task, -rollout, old, new)
        if len(heap) < show:
            heapq.heappush(heap, entry)
        elif show and (task, rollout) < (-heap[0][0], -heap[0][1]):
            heapq.heapreplace(heap, entry)
    diff.first_changed = sorted((-t, -r, old, new) for t, r, old, new in heap)
    return diff


def _fmt(value: Optional[float]) -> str:
    return "-" if value is None else f"{value:.4f}"


def print_diff(diff: RewardDiff) -> None:
    """The diff on stdout, for a person."""
    print(f"Rewards changed in {diff.changed} of {diff.rows} rollouts.")
    before, after = diff.mean_before, diff.mean_after
    delta = f" ({after - before:+.4f})" if before is not None and after is not None else ""
    print(f"Mean reward: {_fmt(before)} before, {_fmt(after)} after{delta}.")
    if diff.before_count < diff.rows:
        print(f"({diff.rows - diff.before_count} rollout(s) had no reward before; the mean before leaves them out.)")
    if diff.first_changed:
        more = diff.changed - len(diff.first_changed)
        print(f"First changed rollouts (old reward kept in `{PREVIOUS_REWARD_KEY_NAME}`):")
        for task, rollout, old, new in diff.first_changed:
            print(f"  task {task}, rollout {rollout}: {_fmt(old)} -> {_fmt(new)}")
        if more > 0:
            print(f"  ... and {more} more")


# --------------------------------------------------------------------------------------------------------
# The command


def _open_output(
    config: ReverifyConfig, checked: CheckedRollouts, paths: CollectionPaths
) -> tuple[CollectionOutcome, Any]:
    """Resume from the output (a torn last line cut off) or start it afresh; the old failures go either way.
    Returns the counts so far and the (task, rollout) keys already done."""
    output = paths.output
    counts = CollectionOutcome(total=checked.num_rows)
    finished: Any = None
    output.parent.mkdir(parents=True, exist_ok=True)
    if config.resume_from_cache and output.exists():
        cut = repair_jsonl_tail(output)
        if cut:
            _err(f"Removed a torn last line ({cut} bytes) from {output}; that row is re-verified again.")
        finished, bad = read_finished_keys(output, into=FinishedRollouts(RolloutKeySpace.from_pairs(checked.pairs)))
        if bad:
            _err(f"Warning: {bad} unreadable line(s) in {output} were ignored.")
        counts.cached = sum(1 for t, r in checked.pairs() if rollout_key(t, r) in finished) if finished else 0
        if counts.cached:
            _err(
                f"Resuming: {counts.cached} rollouts already in {output} are kept; re-verifying the other "
                f"{counts.total - counts.cached} (+resume_from_cache=false starts afresh)."
            )
    else:
        output.unlink(missing_ok=True)
    paths.failures.unlink(missing_ok=True)  # failed rows of an earlier run are retried now
    return counts, finished


def _verify_rows(
    config: ReverifyConfig,
    client: Any,
    routing: VerifierRouting,
    input_path: Path,
    paths: CollectionPaths,
    counts: CollectionOutcome,
    finished: Any,
    servers: list[str],
) -> bool:
    """Re-verify the rows not in `finished`, appending to the output and the failures file; False if interrupted."""
    from nemo_gym.http.retry import RetryPolicy

    display = ProgressDisplay(counts.total, counts.cached, enabled=config.progress_bar)
    policy = RetryPolicy(config.max_attempts, config.retry_backoff_s, config.retry_backoff_max_s)
    limit = min(int(config.num_samples_in_parallel or DEFAULT_MAX_IN_FLIGHT), max(1, counts.total - counts.cached))

    async def verify(item: _Pending) -> RolloutResult:
        return await _reverify_one(
            item,
            client=client,
            retry_policy=policy,
            request_timeout_s=config.request_timeout_s,
            seed_session=config.seed_session,
        )

    with open(paths.output, "ab") as out, open(paths.failures, "ab") as fails:

        def on_result(result: RolloutResult) -> None:
            record_result(result, out, fails, counts)
            display.update(result)

        async def check_then_verify() -> None:
            await check_reverify_modes(client, servers, force=config.force)
            await _run_all(_iter_pending(input_path, routing, finished, config.limit), limit, verify, on_result)
            if not config.disable_aggregation:
                await _aggregate(client, routing, paths)

        try:
            asyncio.run(check_then_verify())
        except KeyboardInterrupt:
            return False
        finally:
            display.stop()
            for path in (paths.output, paths.failures):  # no empty files: a file is there when it has rows
                if path.exists() and path.stat().st_size == 0:
                    path.unlink()
    return True


async def check_reverify_modes(client: Any, servers: list[str], *, force: bool) -> None:
    """Ask each resources server `GET /reverify_mode` (NeMo Gym v0.5): `unsupported` stops the run unless `force`;
    `unknown` (the default of every server that does not say) and a server without the route are re-scored with a
    warning, as `ng reverify` always did."""
    for server in servers:
        try:
            response = await client.get(server, "/reverify_mode", max_attempts=1)
            mode = orjson.loads(response.content) if 200 <= response.status_code < 300 else "unknown"
        except Exception:
            mode = "unknown"
        if mode == "stateless":
            continue
        if mode == "unsupported":
            if force:
                _err(f"Warning: resources server `{server}` says its verify cannot be re-run from saved rows "
                     "(reverify_mode `unsupported`); re-scoring anyway because of +force=true.")
                continue
            raise NeMoGymConfigError(
                f"Resources server `{server}` says its verify cannot be re-run from saved rows (GET /reverify_mode: "
                "`unsupported`), e.g. it grades state the rollout's tool calls built. Pass +force=true (--force) to "
                "re-score anyway."
            )
        _err(f"Note: resources server `{server}` does not say whether its verify depends on session state "
             f"(reverify_mode `{mode}`); re-scoring from /seed_session + /verify (set REVERIFY_MODE on its config "
             "class to `stateless` or `unsupported` to say).")


async def _aggregate(client: Any, routing: VerifierRouting, paths: CollectionPaths) -> None:
    """`<stem>_aggregate_metrics.json` from each resources server's `/aggregate_metrics` over the output's rows."""
    from nemo_gym.rollouts.aggregation import aggregate_by_agent, read_results_grouped, write_aggregate_metrics

    def server_of(row: dict) -> Optional[str]:
        try:
            return routing.server_for(row)
        except Exception:  # a row the checking pass refused never reached the output; nothing to group
            return None

    groups = read_results_grouped(paths.output, server_of)
    if not groups:
        return
    entries, problems = await aggregate_by_agent(client, groups)
    for problem in problems:
        _err(f"Warning: no aggregate metrics: {problem}")
    if entries:
        for entry in entries:  # keyed by resources server here
            entry["resources_server_ref"] = entry.pop("agent_ref")
        write_aggregate_metrics(paths.aggregate_metrics, entries)
        print(f"Aggregate metrics: {paths.aggregate_metrics}")


def _report(
    config: ReverifyConfig, paths: CollectionPaths, counts: CollectionOutcome, completed: bool, bad_lines: BadLines
) -> int:
    """Print the outcome and the diff; returns the exit code."""
    if not completed:
        saved = f"were saved to {paths.output}" if counts.succeeded else "were saved (no output file was written)"
        _err(f"Interrupted: {counts.succeeded} re-verified rows {saved}. Rerun the same command to finish.")
        return 130
    done = counts.cached + counts.succeeded
    where = f"into {paths.output}" if done else f"; no file was written ({paths.output})"
    parts = [f"Re-verified {done} / {counts.total} rollouts {where}".replace(" ;", ";")]
    if counts.cached:
        parts.append(f"{counts.cached} from an earlier run, {counts.succeeded} new")
    if bad_lines.count:
        parts.append(bad_lines.summary())
    print("; ".join(parts) + ".")
    if counts.outcomes.total:  # the rows of this run (not those kept from an earlier one), in the collector's words
        print(counts.outcomes.describe("new rollout" if counts.cached else "rollout") + ".")
        if counts.outcomes.incomplete:
            print(INCOMPLETE_NOTE)
    if done:
        print_diff(reward_diff(paths.output, config.num_changed_rows_shown))
    if counts.failed:
        kinds = ", ".join(f"{n} {k}" for k, n in sorted(counts.failure_types.items()))
        _err(
            f"{counts.failed} rollout(s) could not be re-verified ({kinds}); details in {paths.failures}. "
            "Rerun the same command to retry them (the rows already in the output are kept)."
        )
    sys.stdout.flush()
    return 1 if counts.failed else 0


def _checked_input(config: ReverifyConfig, input_path: Path, routing: VerifierRouting) -> CheckedRollouts:
    """The checking pass; the bad lines it skipped (--skip-bad-lines) are listed on stderr before any work."""
    checked = check_rollouts_file(input_path, routing, limit=config.limit, skip_bad_lines=config.skip_bad_lines)
    checked.bad_lines.warn_skipped("ng_reverify")
    return checked


def _refuse_overwriting_input(paths: CollectionPaths, input_path: Path) -> None:
    for path, key in ((paths.output, "+output_jsonl_fpath"), (paths.failures, "its _failures.jsonl")):
        with contextlib.suppress(OSError):
            if path.exists() and input_path.exists() and os.path.samefile(path, input_path):
                raise NeMoGymConfigError(
                    f"{key} ({path}) is the input file {input_path}: re-verification writes a new file and never "
                    "changes the saved rollouts. Choose another output path, e.g. "
                    f"{input_path.with_name(input_path.stem + '_reverified.jsonl')}."
                )


def reverify_from_config(config: ReverifyConfig, *, server_client: Any = None) -> int:
    """Re-verify as `config` says; returns the exit code (0 ok, 1 some rows failed, 130 interrupted). Bad input
    raises `NeMoGymConfigError` (`InputValidationError` naming `file:line`) before anything is sent; no stack
    raises `NeMoGymStackError`. `server_client`: use this client (and its stack) instead of the config's."""
    from nemo_gym.config.global_config import find_server_instances, get_head_server_config
    from nemo_gym.http.client import ServerClient

    cfg = config.global_config
    paths = CollectionPaths(Path(config.output_jsonl_fpath).expanduser())
    input_path = resolve_input_path(config.input_jsonl_fpath)
    _refuse_overwriting_input(paths, input_path)
    check_output_paths(paths, input_path)
    options = dict(resources_server_name=config.resources_server_name, agent_name=config.agent_name)

    start = config.start_servers
    if start is None:
        start = server_client is None and cfg is not None and bool(find_server_instances(cfg))
    if start:
        if cfg is None or not find_server_instances(cfg):
            raise NeMoGymConfigError(
                "+start_servers=true needs server blocks in the config: pass \"+config_paths=[your_stack.yaml]\"."
            )
        routing = VerifierRouting(cfg, **options)
        checked = _checked_input(config, input_path, routing)
        counts, finished = _open_output(config, checked, paths)
        completed = True
        if counts.cached < counts.total:  # nothing to start when every row is in the output already
            with started_servers(cfg, servers_needed(cfg, checked.servers)) as stack_cfg:
                client = ServerClient(global_config_dict=stack_cfg)
                completed = _verify_rows(
                    config, client, routing, input_path, paths, counts, finished, sorted(checked.servers)
                )
        return _report(config, paths, counts, completed, checked.bad_lines)

    if server_client is None:
        try:
            server_client = ServerClient.load_from_global_config(get_head_server_config(cfg))
        except ValueError as exc:  # no stack there: one line, exit 1
            raise NeMoGymStackError(str(exc)) from None
    routing = VerifierRouting(server_client.global_config_dict, **options)
    checked = _checked_input(config, input_path, routing)
    counts, finished = _open_output(config, checked, paths)
    completed = _verify_rows(
        config, server_client, routing, input_path, paths, counts, finished, sorted(checked.servers)
    )
    return _report(config, paths, counts, completed, checked.bad_lines)
