"""What an agent harness saw during a rollout, joined with the model calls the stack captured (NeMo Gym v0.5 §7.2).

A `/run` answer may carry `ng_agent_observations`: an `AgentObservationBundle` in which the harness (Claude Code,
Codex, a terminal agent, ...) reports what only it knows - which agent invocations ran (a main agent and the
subagents it started), which tools they called, when their context was compacted, what they did in a sandbox - and
which model calls belong to each. The harness cannot know the ids the model servers gave those calls in their
capture files, so it names a call by what it does see (`ModelCallRef`): the server it called (`model_ref`) and the
`id` of the answer it got (`response_id`), or the capture's `model_call_id` when it has it.

With capture on, the collector calls `join_agent_observations` (through `merge_model_call_capture_into_record`)
after each result: the bundle is validated, each reference is looked up among the rollout's captured calls and
gets its `model_call_id`, and the bundle is stored back with those ids. What cannot be joined (an invalid bundle,
a call that was not captured, an ambiguous reference) becomes an `agent_observation_join_failed` gap of the
rollout's `ng_model_call_capture`; the rollout itself, its reward and output, are never touched. Without capture
the bundle stays as the agent sent it.

`AgentObservationBundle.episodes()` reads a bundle back per invocation (`AgentEpisode`): the invocation tree with
each invocation's tool calls, compactions, sandbox actions, model calls and, given the captured calls, its tokens.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Annotated, Any, Iterable, Iterator, Literal, Mapping, Optional, Union

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

__all__ = [
    "AGENT_OBSERVATIONS_KEY",
    "AGENT_OBSERVATION_JOIN_FAILED",
    "RECORD_KINDS",
    "ModelCallRef",
    "ObservationGap",
    "AgentInvocationRecord",
    "ToolCallRecord",
    "ContextCompactionRecord",
    "SandboxRecord",
    "ObservationRecord",
    "AgentObservationBundle",
    "AgentEpisode",
    "AgentObservationJoin",
    "join_agent_observations",
    "describe_bundle_error",
]

AGENT_OBSERVATIONS_KEY = "ng_agent_observations"  # the `/run` result field that carries a bundle
AGENT_OBSERVATION_JOIN_FAILED = "agent_observation_join_failed"  # the gap code for what could not be joined
RECORD_KINDS = ("agent_invocation", "tool_call", "context_compaction", "sandbox")

_DETAIL_LIMIT = 2000  # characters of a gap's detail


class _Strict(BaseModel):
    """Unknown keys are an error: a misspelt field would otherwise vanish without a word."""

    model_config = ConfigDict(extra="forbid", protected_namespaces=())


# --------------------------------------------------------------------------------------------------------
# References and gaps


class ModelCallRef(_Strict):
    """One model call as the harness names it: `model_call_id` (the id in the rollout's capture file), or
    `model_ref` (the model server's name in the config, e.g. `policy_model`) together with `response_id` (the `id`
    of the answer that server returned: `resp_...`, `chatcmpl-...`, `msg_...`). The join fills in
    `model_call_id`; a reference that gives both must agree with the captured call."""

    model_call_id: Optional[str] = Field(default=None, min_length=1)
    model_ref: Optional[str] = Field(default=None, min_length=1)
    response_id: Optional[str] = Field(default=None, min_length=1)

    @model_validator(mode="after")
    def _names_a_call(self) -> "ModelCallRef":
        if self.model_call_id is None and (self.model_ref is None or self.response_id is None):
            given = {k: v for k, v in (("model_ref", self.model_ref), ("response_id", self.response_id)) if v}
            raise ValueError(
                "a model call reference needs `model_call_id`, or both `model_ref` (the model server's name) and "
                f"`response_id` (the id of its answer); got {given or 'neither'}"
            )
        return self

    def describe(self) -> str:
        parts = [f"{name}={value!r}" for name, value in self.model_dump(exclude_none=True).items()]
        return " ".join(parts)


class ObservationGap(_Strict):
    """Something known to be missing from the observations: `code` says what (e.g. a harness's
    `transcript_truncated`, the collector's `agent_observation_join_failed`), `invocation_id` which invocation it
    concerns (it may name one whose record is lost), `detail` a readable explanation."""

    code: str = Field(min_length=1)
    invocation_id: Optional[str] = None
    detail: Optional[str] = None


# --------------------------------------------------------------------------------------------------------
# Records, by kind


class _Record(_Strict):
    """Fields every record has: when it started and ended (ISO 8601, as the capture's `started_at`), and
    `metadata` for what a harness wants to keep that has no field here."""

    started_at: Optional[str] = None
    completed_at: Optional[str] = None
    metadata: dict[str, Any] = {}

    @field_validator("started_at", "completed_at", mode="before")
    @classmethod
    def _iso_timestamp(cls, value: Any) -> Any:
        if isinstance(value, datetime):
            return value.isoformat()
        if isinstance(value, str):
            try:
                datetime.fromisoformat(value)
            except ValueError:
                raise ValueError(f"not an ISO 8601 timestamp: {value!r} (e.g. '2025-01-01T12:00:00+00:00')") from None
        return value

    def model_call_refs(self) -> list[ModelCallRef]:
        """The model calls this record points at."""
        return []

    def label(self) -> str:
        """How error messages name the record: its kind and what identifies it."""
        return self.kind  # type: ignore[attr-defined]


class AgentInvocationRecord(_Record):
    """One run of an agent: the main agent, or a subagent it started (`parent_invocation_id`). `agent` says which
    (e.g. `claude_code`, a subagent type), `status` how it ended (`completed`, `failed`, `timeout`, `cancelled`,
    ...), `error` why it failed, `num_turns` how many model turns it took, `model_calls` the model calls it made
    itself (those of its subagents belong to them)."""

    kind: Literal["agent_invocation"]
    invocation_id: str = Field(min_length=1)
    parent_invocation_id: Optional[str] = Field(default=None, min_length=1)
    agent: Optional[str] = None
    status: Optional[str] = None
    error: Optional[str] = None
    num_turns: Optional[int] = Field(default=None, ge=0)
    model_calls: list[ModelCallRef] = []

    def model_call_refs(self) -> list[ModelCallRef]:
        return list(self.model_calls)

    def label(self) -> str:
        return f"agent_invocation {self.invocation_id!r}"


class ToolCallRecord(_Record):
    """One tool call an invocation made: `name`, the model's `tool_call_id`, `arguments` and `output` as the
    harness has them, `is_error` when the tool failed, and `model_call`, the model call that asked for it."""

    kind: Literal["tool_call"]
    invocation_id: Optional[str] = Field(default=None, min_length=1)
    name: str = Field(min_length=1)
    tool_call_id: Optional[str] = None
    arguments: Any = None
    output: Any = None
    is_error: bool = False
    model_call: Optional[ModelCallRef] = None

    def model_call_refs(self) -> list[ModelCallRef]:
        return [self.model_call] if self.model_call is not None else []

    def label(self) -> str:
        return f"tool_call {self.name!r}" + (f" ({self.tool_call_id})" if self.tool_call_id else "")


class ContextCompactionRecord(_Record):
    """The harness shrank an invocation's context: `trigger` (`auto` at the context limit, `manual`), the context
    size before and after in tokens, and `model_call`, the call that wrote the summary, if one did."""

    kind: Literal["context_compaction"]
    invocation_id: Optional[str] = Field(default=None, min_length=1)
    trigger: Optional[str] = None
    tokens_before: Optional[int] = Field(default=None, ge=0)
    tokens_after: Optional[int] = Field(default=None, ge=0)
    model_call: Optional[ModelCallRef] = None

    def model_call_refs(self) -> list[ModelCallRef]:
        return [self.model_call] if self.model_call is not None else []


class SandboxRecord(_Record):
    """One thing done with a sandbox: `action` (`create`, `exec`, `upload`, `download`, `destroy`, ...), on
    `sandbox_id` (from `image`), the `command` run and its `exit_code`, `error` when it failed. Without
    `invocation_id` it belongs to the rollout as a whole (a sandbox shared by all invocations)."""

    kind: Literal["sandbox"]
    invocation_id: Optional[str] = Field(default=None, min_length=1)
    action: str = Field(min_length=1)
    sandbox_id: Optional[str] = None
    image: Optional[str] = None
    command: Optional[str] = None
    exit_code: Optional[int] = None
    error: Optional[str] = None

    def label(self) -> str:
        return f"sandbox {self.action!r}" + (f" on {self.sandbox_id!r}" if self.sandbox_id else "")


ObservationRecord = Annotated[
    Union[AgentInvocationRecord, ToolCallRecord, ContextCompactionRecord, SandboxRecord],
    Field(discriminator="kind"),
]


# --------------------------------------------------------------------------------------------------------
# The bundle


class AgentObservationBundle(_Strict):
    """`ng_agent_observations`: who reported (`source`, e.g. `claude_code_agent`), the `records` (by `kind`:
    `agent_invocation`, `tool_call`, `context_compaction`, `sandbox`) and what is known to be missing (`gaps`).

    Checked on top of each record's fields: invocation ids are unique, every `parent_invocation_id` and every
    other record's `invocation_id` names an `agent_invocation` of the bundle, and no invocation is its own
    ancestor. Errors name the record as `records[<index>] (<kind> <id or name>)`."""

    source: str = Field(min_length=1)
    records: list[ObservationRecord] = []
    gaps: list[ObservationGap] = []

    @model_validator(mode="after")
    def _invocations_form_a_forest(self) -> "AgentObservationBundle":
        where: dict[str, int] = {}
        for index, record in enumerate(self.records):
            if not isinstance(record, AgentInvocationRecord):
                continue
            first = where.get(record.invocation_id)
            if first is not None:
                raise ValueError(
                    f"records[{index}] ({record.label()}) repeats the invocation_id of records[{first}]: each "
                    "agent_invocation needs an id of its own"
                )
            where[record.invocation_id] = index
        for index, record in enumerate(self.records):
            if isinstance(record, AgentInvocationRecord):
                owner, owner_field = record.parent_invocation_id, "parent_invocation_id"
            else:
                owner, owner_field = record.invocation_id, "invocation_id"
            if owner is not None and owner not in where:
                raise ValueError(
                    f"records[{index}] ({record.label()}): {owner_field} {owner!r} is not the invocation_id of any "
                    f"agent_invocation record of this bundle; add that invocation's record or drop the {owner_field}"
                )
        parents = {
            r.invocation_id: r.parent_invocation_id for r in self.records if isinstance(r, AgentInvocationRecord)
        }
        settled: set[str] = set()  # invocations known to lead up to a root
        for start in parents:
            path: list[str] = []
            current: Optional[str] = start
            while current is not None and current not in settled:
                if current in path:
                    cycle = path[path.index(current):] + [current]
                    records = ", ".join(f"records[{where[i]}]" for i in cycle[:-1])
                    raise ValueError(
                        f"agent_invocation records form a parent cycle: {' -> '.join(cycle)} ({records}); an "
                        "invocation cannot be its own ancestor, so one of these parent_invocation_id values is wrong"
                    )
                path.append(current)
                current = parents[current]
            settled.update(path)
        return self

    # -- reading ---------------------------------------------------------------------------------------------

    def invocations(self) -> dict[str, AgentInvocationRecord]:
        """The agent_invocation records by id, in record order."""
        return {r.invocation_id: r for r in self.records if isinstance(r, AgentInvocationRecord)}

    def model_call_refs(self) -> Iterator[tuple[int, Any, ModelCallRef]]:
        """(record index, record, reference) for every model call reference, in record order."""
        for index, record in enumerate(self.records):
            for ref in record.model_call_refs():
                yield index, record, ref

    def episodes(self, calls: Optional[Iterable[Any]] = None) -> list["AgentEpisode"]:
        """One `AgentEpisode` per invocation, parents before their children (depth first, in record order).
        `calls`: the rollout's captured calls (`ng_model_call_capture["calls"]`, or `ModelCallRecord`s); with them
        each episode gets its token and latency totals, and references to calls not among them count as
        unresolved."""
        captured = None if calls is None else {_call_field(c, "model_call_id"): c for c in calls}
        invocations = self.invocations()
        children: dict[Optional[str], list[str]] = {}
        for invocation in invocations.values():
            children.setdefault(invocation.parent_invocation_id, []).append(invocation.invocation_id)
        owned: dict[str, list[Any]] = {i: [] for i in invocations}
        for record in self.records:
            if not isinstance(record, AgentInvocationRecord) and record.invocation_id is not None:
                owned[record.invocation_id].append(record)

        episodes: list[AgentEpisode] = []

        def visit(invocation_id: str, depth: int) -> None:
            invocation = invocations[invocation_id]
            records = owned[invocation_id]
            episodes.append(
                AgentEpisode.build(invocation, depth, children.get(invocation_id, []), records, self.gaps, captured)
            )
            for child in children.get(invocation_id, []):
                visit(child, depth + 1)

        for root in children.get(None, []):
            visit(root, 0)
        return episodes


class AgentEpisode(BaseModel):
    """One agent invocation of a rollout with everything that belongs to it (read from a bundle, not sent).

    - `invocation_id`, `parent_invocation_id`, `depth` (0 for a top-level invocation), `child_invocation_ids`
      (the subagents it started): its place in the invocation tree;
    - `agent`, `status`, `started_at`, `completed_at`: copied from its record;
    - `model_call_ids`: the captured calls it made itself (its own `model_calls`, then those its tool calls and
      compactions point at, each once); `unresolved_model_calls`: its references without a captured call;
    - `tool_calls`, `context_compactions`, `sandbox`: its records of those kinds, in record order;
    - `gaps`: the bundle's gaps about this invocation;
    - `num_model_calls`, `tokens_in`, `tokens_out`, `tokens_total`, `latency_total_ms`: totals over
      `model_call_ids` from the captured calls (None when the episode was read without them). Subagents' calls are
      theirs, not their parent's."""

    model_config = ConfigDict(protected_namespaces=())

    invocation_id: str
    parent_invocation_id: Optional[str] = None
    depth: int = 0
    child_invocation_ids: list[str] = []
    agent: Optional[str] = None
    status: Optional[str] = None
    started_at: Optional[str] = None
    completed_at: Optional[str] = None
    model_call_ids: list[str] = []
    unresolved_model_calls: list[ModelCallRef] = []
    tool_calls: list[ToolCallRecord] = []
    context_compactions: list[ContextCompactionRecord] = []
    sandbox: list[SandboxRecord] = []
    gaps: list[ObservationGap] = []
    num_model_calls: Optional[int] = None
    tokens_in: Optional[int] = None
    tokens_out: Optional[int] = None
    tokens_total: Optional[int] = None
    latency_total_ms: Optional[float] = None

    @classmethod
    def build(
        cls,
        invocation: AgentInvocationRecord,
        depth: int,
        child_ids: list[str],
        records: list[Any],
        gaps: list[ObservationGap],
        captured: Optional[dict[str, Any]],
    ) -> "AgentEpisode":
        """The episode of `invocation` (see `AgentObservationBundle.episodes`): `records` are the bundle's records
        it owns, `captured` the rollout's calls by `model_call_id` (None: read without them)."""
        ids: list[str] = []
        unresolved: list[ModelCallRef] = []
        for ref in [*invocation.model_call_refs(), *(ref for r in records for ref in r.model_call_refs())]:
            known = ref.model_call_id is not None and (captured is None or ref.model_call_id in captured)
            if not known:
                unresolved.append(ref)
            elif ref.model_call_id not in ids:
                ids.append(ref.model_call_id)
        totals: dict[str, Any] = {}
        if captured is not None:
            calls = [captured[i] for i in ids]
            totals = {
                "num_model_calls": len(calls),
                "tokens_in": sum(_call_field(c, "tokens_in") or 0 for c in calls),
                "tokens_out": sum(_call_field(c, "tokens_out") or 0 for c in calls),
                "tokens_total": sum(_call_field(c, "tokens_total") or 0 for c in calls),
                "latency_total_ms": round(sum(_call_field(c, "latency_total_ms") or 0.0 for c in calls), 3),
            }
        return cls(
            invocation_id=invocation.invocation_id,
            parent_invocation_id=invocation.parent_invocation_id,
            depth=depth,
            child_invocation_ids=list(child_ids),
            agent=invocation.agent,
            status=invocation.status,
            started_at=invocation.started_at,
            completed_at=invocation.completed_at,
            model_call_ids=ids,
            unresolved_model_calls=unresolved,
            tool_calls=[r for r in records if isinstance(r, ToolCallRecord)],
            context_compactions=[r for r in records if isinstance(r, ContextCompactionRecord)],
            sandbox=[r for r in records if isinstance(r, SandboxRecord)],
            gaps=[g for g in gaps if g.invocation_id == invocation.invocation_id],
            **totals,
        )


# --------------------------------------------------------------------------------------------------------
# The join


@dataclass
class AgentObservationJoin:
    """What `join_agent_observations` gives: `bundle`, the value to store as `ng_agent_observations` (the
    rewritten bundle, or what the agent sent when it is invalid), `gaps` (`agent_observation_join_failed`, one per
    invocation with unresolved references, or one for an invalid bundle), and how many references were resolved
    and left unresolved."""

    bundle: Any
    gaps: list[ObservationGap] = field(default_factory=list)
    resolved: int = 0
    unresolved: int = 0


def join_agent_observations(
    value: Any, calls: Iterable[Any], *, rollout_id: Optional[str] = None
) -> AgentObservationJoin:
    """Validate a bundle (dict or `AgentObservationBundle`) and point each of its `ModelCallRef`s at one of
    `calls`, the rollout's captured calls (`ModelCallRecord`s with their payloads, or dicts with `model_call_id`,
    `model_ref` and `response_id` or a `response` payload). Never raises for bad input: what cannot be joined is
    reported in `gaps`, and resolved references are rewritten even when others are not."""
    whose = f" of rollout {rollout_id}" if rollout_id else ""
    try:
        bundle = (
            value.model_copy(deep=True) if isinstance(value, AgentObservationBundle)
            else AgentObservationBundle.model_validate(value)
        )
    except ValidationError as exc:
        detail = f"invalid {AGENT_OBSERVATIONS_KEY}{whose}, kept as sent: {describe_bundle_error(exc, value)}"
        return AgentObservationJoin(bundle=value, gaps=[_gap(None, detail)])

    index = _CapturedCalls(calls)
    join = AgentObservationJoin(bundle=None)
    failures: dict[Optional[str], list[str]] = {}
    for position, record, ref in bundle.model_call_refs():
        problem = index.resolve(ref)
        if problem is None:
            join.resolved += 1
            continue
        join.unresolved += 1
        problem = f"records[{position}] ({record.label()}) {ref.describe()}: {problem}"
        failures.setdefault(record.invocation_id, []).append(problem)
    for invocation_id, problems in failures.items():
        detail = (
            f"{len(problems)} model call reference(s) not joined with the {index.count} captured call(s){whose}: "
            + "; ".join(problems)
        )
        join.gaps.append(_gap(invocation_id, detail))
    join.bundle = bundle.model_dump(mode="json", exclude_unset=True)
    return join


class _CapturedCalls:
    """The rollout's captured calls, found by id and by (model server, answer id)."""

    def __init__(self, calls: Iterable[Any]) -> None:
        self.by_id: dict[str, Any] = {}
        self.by_answer: dict[tuple[Any, str], list[str]] = {}
        for call in calls:
            call_id = _call_field(call, "model_call_id")
            if not call_id:
                continue
            self.by_id[call_id] = call
            response_id = _response_id(call)
            if response_id:
                self.by_answer.setdefault((_call_field(call, "model_ref"), response_id), []).append(call_id)
        self.count = len(self.by_id)

    def resolve(self, ref: ModelCallRef) -> Optional[str]:
        """Fill in `ref.model_call_id`; None when that worked, else why not."""
        if ref.model_call_id is not None:
            call = self.by_id.get(ref.model_call_id)
            if call is None:
                return "no captured call has this model_call_id"
            if ref.model_ref is not None and ref.model_ref != _call_field(call, "model_ref"):
                return f"that call went to {_call_field(call, 'model_ref')!r}, not {ref.model_ref!r}"
            if ref.response_id is not None and ref.response_id != _response_id(call):
                return f"that call's answer id is {_response_id(call)!r}, not {ref.response_id!r}"
            return None
        matches = self.by_answer.get((ref.model_ref, ref.response_id), [])
        if not matches:
            return "no captured call of that model server answered with this id"
        if len(matches) > 1:
            listed = ", ".join(matches)
            return f"{len(matches)} captured calls ({listed}) answered with this id; name one by model_call_id"
        ref.model_call_id = matches[0]
        return None


def _call_field(call: Any, name: str) -> Any:
    return call.get(name) if isinstance(call, Mapping) else getattr(call, name, None)


def _response_id(call: Any) -> Optional[str]:
    """The `id` of a captured call's answer (its `response_id` when the caller already worked it out)."""
    given = _call_field(call, "response_id")
    if isinstance(given, str) and given:
        return given
    response = _call_field(call, "response")
    answer_id = response.get("id") if isinstance(response, Mapping) else None
    return answer_id if isinstance(answer_id, str) and answer_id else None


def _gap(invocation_id: Optional[str], detail: str) -> ObservationGap:
    if len(detail) > _DETAIL_LIMIT:
        detail = detail[:_DETAIL_LIMIT] + "...[truncated]"
    return ObservationGap(code=AGENT_OBSERVATION_JOIN_FAILED, invocation_id=invocation_id, detail=detail)


def describe_bundle_error(exc: ValidationError, value: Any = None) -> str:
    """A bundle's validation errors in one line, each located as `records[<i>] (<kind> <id>): <field>: <what>`
    or `gaps[<i>]: <field>: <what>` (`value`, the input, lets records be named by their id or name)."""
    raw_records = value.get("records") if isinstance(value, Mapping) else None
    parts = []
    for error in exc.errors(include_url=False):
        loc = list(error.get("loc") or ())
        where = ""
        if len(loc) >= 2 and loc[0] == "records" and isinstance(loc[1], int):
            where = f"records[{loc[1]}]"
            raw = raw_records[loc[1]] if isinstance(raw_records, list) and loc[1] < len(raw_records) else None
            if isinstance(raw, Mapping) and isinstance(raw.get("kind"), str):
                if raw["kind"] == "agent_invocation":
                    name = raw.get("invocation_id")
                else:
                    name = raw.get("name") or raw.get("action")
                where += f" ({raw['kind']}" + (f" {name!r})" if isinstance(name, str) else ")")
            loc = loc[3:] if len(loc) > 2 and loc[2] in RECORD_KINDS else loc[2:]
        elif len(loc) >= 2 and isinstance(loc[1], int):
            where = f"{loc[0]}[{loc[1]}]"
            loc = loc[2:]
        elif loc:
            where = str(loc[0])
            loc = loc[1:]
        field_path = ".".join(str(part) for part in loc)
        message = str(error.get("msg", "")).removeprefix("Value error, ")
        kinds = ", ".join(RECORD_KINDS)
        if error.get("type") == "union_tag_not_found":
            message = f"a record needs a `kind`, one of {kinds}"
        elif error.get("type") == "union_tag_invalid":
            message = f"`kind` {error.get('input', {}).get('kind')!r} is not one of {kinds}"
        parts.append(": ".join(p for p in (where, field_path, message) if p))
    return "; ".join(parts)
