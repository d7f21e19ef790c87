"""Agent observations (`ng_agent_observations`, NeMo Gym v0.5 §7.2): the bundle's checks and its join with the
model calls a rollout's capture file holds.

The captured calls are real: two model servers (openai_model, `policy_model` and `helper_model`) capture into one
folder, in front of the fake LLM backend (a real OpenAI-compatible HTTP server), all served by uvicorn; the calls
are made the way a harness makes them (openai / anthropic SDKs on the `/ng-rollout/<id>` base URL). The bundles
then name those calls by the ids of the answers the SDKs got, as a harness would.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any, Iterator

import anthropic
import openai
import pytest
from pydantic import ValidationError

from nemo_gym.base_responses_api_model import merge_model_call_capture_into_record
from nemo_gym.rollout_observability import (
    AgentEpisode,
    AgentObservationBundle,
    ModelCallRef,
    ObservationGap,
    describe_bundle_error,
    join_agent_observations,
)
from nemo_gym.servers.base import serving_app
from nemo_gym.testing.fake_openai_server import build_app as build_fake_llm
from nemo_gym.testing.live_server import live_server
from nemo_gym.testing.servers import make_server, make_server_client
from responses_api_models.openai_model.app import SimpleModelServer

# ------------------------------------------------------------------------------------------------------------
# Bundles


def invocation(invocation_id: str, parent: str | None = None, **fields: Any) -> dict:
    record = {"kind": "agent_invocation", "invocation_id": invocation_id, **fields}
    if parent is not None:
        record["parent_invocation_id"] = parent
    return record


def bundle(*records: dict, **fields: Any) -> dict:
    return {"source": "test_harness", "records": list(records), **fields}


FULL_BUNDLE = bundle(
    invocation("main", agent="claude_code", status="completed", num_turns=3, started_at="2025-01-01T00:00:00Z",
               completed_at="2025-01-01T00:01:00+00:00", model_calls=[{"model_ref": "policy_model", "response_id": "resp_1"}]),
    invocation("explore", parent="main", agent="Explore", status="failed", error="ran out of turns",
               model_calls=[{"model_call_id": "abc"}]),
    {"kind": "tool_call", "invocation_id": "main", "name": "bash", "tool_call_id": "call_1",
     "arguments": {"command": "ls"}, "output": "a.txt", "model_call": {"model_ref": "policy_model", "response_id": "resp_1"}},
    {"kind": "tool_call", "invocation_id": "explore", "name": "read_file", "is_error": True, "output": "no such file"},
    {"kind": "context_compaction", "invocation_id": "main", "trigger": "auto", "tokens_before": 190000,
     "tokens_after": 12000, "model_call": {"model_call_id": "def"}},
    {"kind": "sandbox", "action": "create", "sandbox_id": "sb-1", "image": "python:3.11"},
    {"kind": "sandbox", "invocation_id": "explore", "action": "exec", "sandbox_id": "sb-1", "command": "ls /nope",
     "exit_code": 2, "metadata": {"stderr_bytes": 31}},
    gaps=[{"code": "transcript_truncated", "invocation_id": "explore", "detail": "the last 2 turns were not logged"}],
)


def test_a_bundle_with_every_kind_of_record_is_read_and_dumps_back_as_sent():
    parsed = AgentObservationBundle.model_validate(FULL_BUNDLE)
    assert [r.kind for r in parsed.records] == ["agent_invocation", "agent_invocation", "tool_call", "tool_call",
                                               "context_compaction", "sandbox", "sandbox"]
    assert list(parsed.invocations()) == ["main", "explore"]
    assert [(i, ref.model_call_id or ref.response_id) for i, _, ref in parsed.model_call_refs()] == [
        (0, "resp_1"), (1, "abc"), (2, "resp_1"), (4, "def")]
    assert parsed.gaps == [ObservationGap(code="transcript_truncated", invocation_id="explore",
                                          detail="the last 2 turns were not logged")]
    assert parsed.model_dump(mode="json", exclude_unset=True) == FULL_BUNDLE
    # Only the source is required: an agent with nothing to report sends an empty bundle.
    assert AgentObservationBundle.model_validate({"source": "x"}).records == []


def test_episodes_read_the_invocation_tree_without_captured_calls():
    main, explore = AgentObservationBundle.model_validate(FULL_BUNDLE).episodes()
    assert isinstance(main, AgentEpisode)
    assert (main.invocation_id, main.depth, main.child_invocation_ids, main.agent, main.status) == (
        "main", 0, ["explore"], "claude_code", "completed")
    assert (explore.parent_invocation_id, explore.depth, explore.child_invocation_ids) == ("main", 1, [])
    assert [t.name for t in main.tool_calls] == ["bash"] and [t.name for t in explore.tool_calls] == ["read_file"]
    assert [c.tokens_after for c in main.context_compactions] == [12000]
    assert main.sandbox == [] and [s.command for s in explore.sandbox] == ["ls /nope"]  # the shared one is nobody's
    assert [g.code for g in explore.gaps] == ["transcript_truncated"] and main.gaps == []
    # Without captured calls: ids given are taken as they are, answer-id references are unresolved, no totals.
    assert main.model_call_ids == ["def"] and [r.response_id for r in main.unresolved_model_calls] == ["resp_1", "resp_1"]
    assert explore.model_call_ids == ["abc"] and main.tokens_in is None and main.num_model_calls is None


# ------------------------------------------------------------------------------------------------------------
# What a bundle may not be


def rejected(value: Any) -> str:
    """The error a bundle gets, checked to be the same from pydantic and from the join's one-line account."""
    with pytest.raises(ValidationError) as info:
        AgentObservationBundle.model_validate(value)
    return describe_bundle_error(info.value, value)


@pytest.mark.parametrize(
    "ref, message",
    [
        ({}, "needs `model_call_id`, or both `model_ref` (the model server's name) and `response_id`"),
        ({"model_ref": "policy_model"}, "got {'model_ref': 'policy_model'}"),
        ({"response_id": "resp_3"}, "got {'response_id': 'resp_3'}"),
        ({"model_call_id": ""}, "model_call_id: String should have at least 1 character"),
        ({"model_call_id": "a", "call_id": "b"}, "call_id: Extra inputs are not permitted"),
    ],
)
def test_a_model_call_ref_needs_an_id_or_a_server_and_an_answer_id(ref, message):
    error = rejected(bundle(invocation("main", model_calls=[{"model_call_id": "ok"}, ref])))
    assert error.startswith("records[0] (agent_invocation 'main'): model_calls.1") and message in error, error
    with pytest.raises(ValidationError, match="needs `model_call_id`"):
        ModelCallRef()
    assert ModelCallRef(model_call_id="x").describe() == "model_call_id='x'"
    assert ModelCallRef(model_ref="m", response_id="r").model_call_id is None


def test_invocation_ids_are_unique():
    error = rejected(bundle(invocation("main"), invocation("sub", parent="main"), invocation("main")))
    assert error == (
        "records[2] (agent_invocation 'main') repeats the invocation_id of records[0]: each agent_invocation needs "
        "an id of its own"
    )


def test_parents_and_owners_must_be_invocations_of_the_bundle():
    error = rejected(bundle(invocation("main"), invocation("sub", parent="mian")))
    assert error == (
        "records[1] (agent_invocation 'sub'): parent_invocation_id 'mian' is not the invocation_id of any "
        "agent_invocation record of this bundle; add that invocation's record or drop the parent_invocation_id"
    )
    error = rejected(bundle(invocation("main"), {"kind": "tool_call", "invocation_id": "other", "name": "bash",
                                                 "tool_call_id": "c9"}))
    assert error.startswith("records[1] (tool_call 'bash' (c9)): invocation_id 'other' is not the invocation_id")
    error = rejected(bundle({"kind": "sandbox", "invocation_id": "ghost", "action": "exec", "sandbox_id": "sb"}))
    assert error.startswith("records[0] (sandbox 'exec' on 'sb'): invocation_id 'ghost'")
    error = rejected(bundle({"kind": "context_compaction", "invocation_id": "ghost"}))
    assert error.startswith("records[0] (context_compaction): invocation_id 'ghost'")


@pytest.mark.parametrize(
    "records, cycle",
    [
        ([invocation("a", parent="a")], "a -> a (records[0])"),
        ([invocation("root"), invocation("a", parent="b"), invocation("b", parent="a")], "a -> b -> a (records[1], records[2])"),
        # A chain leading into a loop: the loop is reported, not the invocation that leads to it.
        ([invocation("x", parent="b"), invocation("b", parent="c"), invocation("c", parent="d"), invocation("d", parent="b")],
         "b -> c -> d -> b (records[1], records[2], records[3])"),
    ],
)
def test_no_invocation_is_its_own_ancestor(records, cycle):
    error = rejected(bundle(*records))
    assert error == (
        f"agent_invocation records form a parent cycle: {cycle}; an invocation cannot be its own ancestor, so one "
        "of these parent_invocation_id values is wrong"
    )


def test_deep_trees_and_forests_are_fine():
    chain = [invocation("n0")] + [invocation(f"n{i}", parent=f"n{i - 1}") for i in range(1, 200)]
    parsed = AgentObservationBundle.model_validate(bundle(*reversed(chain), invocation("other_root")))
    episodes = parsed.episodes()
    assert [e.invocation_id for e in episodes] == [f"n{i}" for i in range(200)] + ["other_root"]
    assert [e.depth for e in episodes] == list(range(200)) + [0]


@pytest.mark.parametrize(
    "value, message",
    [
        (bundle(invocation("main"), version=2), "version: Extra inputs are not permitted"),
        ({"records": []}, "source: Field required"),
        (bundle(source=""), "source: String should have at least 1 character"),
        ("not a bundle", "Input should be a valid dictionary or instance of AgentObservationBundle"),
        (bundle({"kind": "thought", "text": "hm"}), "records[0] (thought): `kind` 'thought' is not one of agent_invocation, tool_call, context_compaction, sandbox"),
        (bundle({"name": "bash"}), "records[0]: a record needs a `kind`, one of agent_invocation, tool_call, context_compaction, sandbox"),
        (bundle(invocation("main"), {"kind": "tool_call", "invocation_id": "main"}), "records[1] (tool_call): name: Field required"),
        (bundle(invocation("main", turns=3)), "records[0] (agent_invocation 'main'): turns: Extra inputs are not permitted"),
        (bundle(invocation("main", started_at="yesterday")), "records[0] (agent_invocation 'main'): started_at: not an ISO 8601 timestamp: 'yesterday'"),
        (bundle({"kind": "context_compaction", "tokens_after": -1}), "records[0] (context_compaction): tokens_after: Input should be greater than or equal to 0"),
        (bundle(invocation("")), "records[0] (agent_invocation ''): invocation_id: String should have at least 1 character"),
        (bundle(gaps=[{"detail": "no code"}]), "gaps[0]: code: Field required"),
    ],
)
def test_field_errors_name_the_record(value, message):
    error = rejected(value)
    assert message in error, error


# ------------------------------------------------------------------------------------------------------------
# Real captured calls

SCRIPT = [
    # A backend that gives every answer the same id (some serving stacks do): references by id become ambiguous.
    {"name": "fixed id", "match": {"last_user_contains": "[fixed-id]"}, "output": ["same again"],
     "response": {"id": "resp_fixed"}},
    {"name": "echo", "output": ["heard: {{last_user}}"]},
]


class Harness:
    """The model calls of a harness for one rollout: the SDKs on the prefixed base URLs of both model servers."""

    def __init__(self, urls: dict[str, str], capture_dir: Path, rollout_id: str) -> None:
        self.capture_dir = capture_dir
        self.rollout_id = rollout_id
        self.policy = openai.OpenAI(base_url=f"{urls['policy_model']}/ng-rollout/{rollout_id}/v1", api_key="x", max_retries=0)
        self.helper = openai.OpenAI(base_url=f"{urls['helper_model']}/ng-rollout/{rollout_id}/v1", api_key="x", max_retries=0)
        self.messages = anthropic.Anthropic(base_url=f"{urls['policy_model']}/ng-rollout/{rollout_id}", api_key="x", max_retries=0)

    def respond(self, text: str) -> str:
        return self.policy.responses.create(model="m", input=text).id

    def respond_streamed(self, text: str) -> str:
        events = list(self.policy.responses.create(model="m", input=text, stream=True))
        return events[-1].response.id

    def chat(self, text: str) -> str:
        return self.helper.chat.completions.create(model="m", messages=[{"role": "user", "content": text}]).id

    def message(self, text: str) -> str:
        return self.messages.messages.create(model="m", max_tokens=64, messages=[{"role": "user", "content": text}]).id

    def captured(self) -> list[dict]:
        path = self.capture_dir / f"{self.rollout_id}.capture.jsonl"
        return [json.loads(line) for line in path.read_text().splitlines()]

    def call_id_of(self, response_id: str) -> str:
        """The capture's id of the call that answered `response_id` (what a harness reading the capture sees)."""
        (call_id,) = [e["model_call_id"] for e in self.captured() if (e["response"] or {}).get("id") == response_id]
        return call_id


@pytest.fixture(scope="module")
def model_servers(tmp_path_factory) -> Iterator[tuple[dict[str, str], Path]]:
    capture_dir = tmp_path_factory.mktemp("captures")
    with live_server(build_fake_llm(script=SCRIPT)) as backend:
        client = make_server_client({"observability_enabled": True, "model_call_capture_dir": str(capture_dir)})
        urls = {}
        with live_server(serving_app(make_server(
            SimpleModelServer, name="policy_model", server_client=client, openai_base_url=backend + "/v1",
            openai_api_key="k", openai_model="served-model").build_app())) as policy, live_server(serving_app(make_server(
                SimpleModelServer, name="helper_model", server_client=client, openai_base_url=backend + "/v1",
                openai_api_key="k", openai_model="served-model").build_app())) as helper:
            urls = {"policy_model": policy, "helper_model": helper}
            yield urls, capture_dir


def harness(model_servers, task: int, rollout: int = 0) -> Harness:
    urls, capture_dir = model_servers
    return Harness(urls, capture_dir, f"{task}-{rollout}")


def result_row(task: int, observations: Any, rollout: int = 0) -> dict:
    return {"_ng_task_index": task, "_ng_rollout_index": rollout, "reward": 0.75,
            "response": {"id": "resp_final", "output": [], "usage": {"input_tokens": 1}},
            "ng_agent_observations": observations}


def test_join_points_every_reference_at_its_captured_call(model_servers):
    h = harness(model_servers, 1)
    first = h.respond("plan the work")
    second = h.respond_streamed("do the work")  # streamed: the capture put the answer back together
    summary = h.message("summarise the context")
    delegated = h.chat("explore the repo")
    sent = bundle(
        invocation("main", agent="harness", status="completed", model_calls=[
            {"model_ref": "policy_model", "response_id": first},
            {"model_call_id": h.call_id_of(second)},  # a harness that read the capture itself
        ]),
        invocation("explore", parent="main", model_calls=[{"model_ref": "helper_model", "response_id": delegated}]),
        {"kind": "tool_call", "invocation_id": "main", "name": "bash", "tool_call_id": "call_1",
         "model_call": {"model_ref": "policy_model", "response_id": first}},
        {"kind": "context_compaction", "invocation_id": "main", "trigger": "auto",
         "model_call": {"model_ref": "policy_model", "response_id": summary, "model_call_id": h.call_id_of(summary)}},
        {"kind": "sandbox", "action": "create", "sandbox_id": "sb-1"},
        gaps=[{"code": "transcript_truncated", "invocation_id": "explore"}],
    )
    record = result_row(1, copy.deepcopy(sent))
    reward, response = record["reward"], copy.deepcopy(record["response"])

    merged = merge_model_call_capture_into_record(record, model_servers[1])

    assert merged is record and record["reward"] == reward and record["response"] == response
    capture = record["ng_model_call_capture"]
    assert "gaps" not in capture and capture["metrics"]["num_calls"] == 4
    # The bundle comes back as sent, with each reference's model_call_id filled in from the capture file.
    expected = copy.deepcopy(sent)
    expected["records"][0]["model_calls"][0]["model_call_id"] = h.call_id_of(first)
    expected["records"][1]["model_calls"][0]["model_call_id"] = h.call_id_of(delegated)
    expected["records"][2]["model_call"]["model_call_id"] = h.call_id_of(first)
    assert record["ng_agent_observations"] == expected
    assert len({h.call_id_of(i) for i in (first, second, summary, delegated)}) == 4

    # Read back per invocation, with the collected calls: each invocation's own calls and their totals.
    main, explore = AgentObservationBundle.model_validate(record["ng_agent_observations"]).episodes(capture["calls"])
    assert main.model_call_ids == [h.call_id_of(first), h.call_id_of(second), h.call_id_of(summary)]
    assert explore.model_call_ids == [h.call_id_of(delegated)]
    assert main.unresolved_model_calls == [] == explore.unresolved_model_calls
    calls = {c["model_call_id"]: c for c in capture["calls"]}
    for episode in (main, explore):
        own = [calls[i] for i in episode.model_call_ids]
        assert episode.num_model_calls == len(own)
        assert (episode.tokens_in, episode.tokens_out, episode.tokens_total) == (
            sum(c["tokens_in"] for c in own), sum(c["tokens_out"] for c in own), sum(c["tokens_total"] for c in own))
    assert main.tokens_in + explore.tokens_in == capture["metrics"]["tokens_in"]
    assert [c["model_ref"] for c in own] == ["helper_model"] and [g.code for g in explore.gaps] == ["transcript_truncated"]


def test_what_cannot_be_joined_is_a_gap_and_the_rest_is_still_joined(model_servers):
    h = harness(model_servers, 2)
    good = h.respond("one")
    other = h.respond("two")
    delegated = h.chat("three")
    sent = bundle(
        invocation("main", model_calls=[
            {"model_ref": "policy_model", "response_id": good},
            {"model_ref": "policy_model", "response_id": "resp_never_seen"},
            {"model_ref": "helper_model", "response_id": other},  # the answer id is real, the server is not
        ]),
        invocation("worker", parent="main", model_calls=[
            {"model_call_id": "not-a-captured-call"},
            {"model_call_id": h.call_id_of(delegated), "response_id": other},  # both given, and they disagree
            {"model_call_id": h.call_id_of(delegated), "model_ref": "policy_model"},
        ]),
        {"kind": "tool_call", "name": "grep", "model_call": {"model_ref": "policy_model", "response_id": "resp_gone"}},
    )
    record = result_row(2, copy.deepcopy(sent))
    merge_model_call_capture_into_record(record, model_servers[1])

    assert record["reward"] == 0.75 and record["response"]["id"] == "resp_final"
    gaps = record["ng_model_call_capture"]["gaps"]
    assert [(g["code"], g.get("invocation_id")) for g in gaps] == [
        ("agent_observation_join_failed", "main"), ("agent_observation_join_failed", "worker"),
        ("agent_observation_join_failed", None)]
    assert gaps[0]["detail"] == (
        "2 model call reference(s) not joined with the 3 captured call(s) of rollout 2-0: "
        "records[0] (agent_invocation 'main') model_ref='policy_model' response_id='resp_never_seen': no captured "
        "call of that model server answered with this id; "
        f"records[0] (agent_invocation 'main') model_ref='helper_model' response_id='{other}': no captured call of "
        "that model server answered with this id"
    )
    worker = gaps[1]["detail"]
    assert worker.startswith("3 model call reference(s) not joined")
    assert "model_call_id='not-a-captured-call': no captured call has this model_call_id" in worker
    assert f"that call's answer id is '{delegated}', not '{other}'" in worker
    assert "that call went to 'helper_model', not 'policy_model'" in worker
    assert "records[2] (tool_call 'grep') model_ref='policy_model' response_id='resp_gone'" in gaps[2]["detail"]

    # The reference that could be joined is, the others stay as sent.
    expected = copy.deepcopy(sent)
    expected["records"][0]["model_calls"][0]["model_call_id"] = h.call_id_of(good)
    assert record["ng_agent_observations"] == expected
    main, worker_episode = AgentObservationBundle.model_validate(expected).episodes(record["ng_model_call_capture"]["calls"])
    assert main.model_call_ids == [h.call_id_of(good)] and len(main.unresolved_model_calls) == 2
    # Ids the capture has count as the worker's calls even where the reference disagreed: the gap says so.
    assert worker_episode.model_call_ids == [h.call_id_of(delegated)] and len(worker_episode.unresolved_model_calls) == 1


def test_an_answer_id_two_captured_calls_share_is_ambiguous(model_servers):
    h = harness(model_servers, 3)
    assert h.respond("[fixed-id] first") == h.respond("[fixed-id] second") == "resp_fixed"
    record = result_row(3, bundle(invocation("main", model_calls=[{"model_ref": "policy_model", "response_id": "resp_fixed"}])))
    merge_model_call_capture_into_record(record, model_servers[1])
    (gap,) = record["ng_model_call_capture"]["gaps"]
    ids = [e["model_call_id"] for e in h.captured()]
    assert gap["code"] == "agent_observation_join_failed" and gap["invocation_id"] == "main"
    assert f"2 captured calls ({', '.join(ids)}) answered with this id; name one by model_call_id" in gap["detail"]
    # Named by the capture's id it joins.
    record = result_row(3, bundle(invocation("main", model_calls=[{"model_call_id": ids[1], "response_id": "resp_fixed"}])))
    merge_model_call_capture_into_record(record, model_servers[1])
    assert "gaps" not in record["ng_model_call_capture"]


def test_an_invalid_bundle_is_kept_as_sent_and_reported(model_servers):
    h = harness(model_servers, 4)
    h.respond("hello")
    sent = bundle(invocation("a", parent="b"), invocation("b", parent="a"))
    record = result_row(4, sent)
    merge_model_call_capture_into_record(record, model_servers[1])
    assert record["ng_agent_observations"] is sent and record["reward"] == 0.75
    capture = record["ng_model_call_capture"]
    assert capture["metrics"]["num_calls"] == 1
    assert capture["gaps"] == [{
        "code": "agent_observation_join_failed",
        "detail": "invalid ng_agent_observations of rollout 4-0, kept as sent: agent_invocation records form a "
                  "parent cycle: a -> b -> a (records[0], records[1]); an invocation cannot be its own ancestor, so "
                  "one of these parent_invocation_id values is wrong",
    }]
    weird = result_row(4, ["not", "a", "bundle"])
    merge_model_call_capture_into_record(weird, model_servers[1])
    assert weird["ng_agent_observations"] == ["not", "a", "bundle"]
    assert "Input should be a valid dictionary" in weird["ng_model_call_capture"]["gaps"][0]["detail"]


def test_capture_gaps_come_first_and_a_bundle_without_references_is_just_checked(model_servers):
    # Nothing captured for this rollout: the capture's own gap, then the join's.
    record = result_row(5, bundle(invocation("main", model_calls=[{"model_ref": "policy_model", "response_id": "resp_x"}])))
    merge_model_call_capture_into_record(record, model_servers[1])
    assert [g["code"] for g in record["ng_model_call_capture"]["gaps"]] == [
        "model_call_capture_no_records", "agent_observation_join_failed"]
    assert "not joined with the 0 captured call(s)" in record["ng_model_call_capture"]["gaps"][1]["detail"]

    sent = bundle({"kind": "sandbox", "action": "create", "sandbox_id": "sb"})
    record = result_row(5, copy.deepcopy(sent))
    merge_model_call_capture_into_record(record, model_servers[1])
    assert record["ng_agent_observations"] == sent
    assert [g["code"] for g in record["ng_model_call_capture"]["gaps"]] == ["model_call_capture_no_records"]


def test_without_capture_the_bundle_stays_as_the_agent_sent_it(model_servers):
    h = harness(model_servers, 6)
    answer = h.respond("hi")
    for sent in (bundle(invocation("main", model_calls=[{"model_ref": "policy_model", "response_id": answer}])),
                 bundle(invocation("a", parent="a")), "garbage"):
        record = result_row(6, sent)
        assert merge_model_call_capture_into_record(record, None) == result_row(6, sent)
        assert record["ng_agent_observations"] is sent and "ng_model_call_capture" not in record
    # No rollout indices in the result: nothing to join with either.
    no_indices = {"reward": 1.0, "ng_agent_observations": bundle(invocation("a", parent="a"))}
    assert merge_model_call_capture_into_record(copy.deepcopy(no_indices), model_servers[1]) == no_indices


def test_join_agent_observations_directly(model_servers):
    h = harness(model_servers, 7)
    answer = h.respond("direct")
    captured = h.captured()
    parsed = AgentObservationBundle.model_validate(bundle(invocation("main", model_calls=[
        {"model_ref": "policy_model", "response_id": answer}])))
    join = join_agent_observations(parsed, captured)  # an already-built bundle, raw capture lines
    assert (join.resolved, join.unresolved, join.gaps) == (1, 0, [])
    assert join.bundle["records"][0]["model_calls"][0]["model_call_id"] == captured[0]["model_call_id"]
    assert parsed.records[0].model_calls[0].model_call_id is None  # the caller's bundle is not changed
    # The summary's calls carry no answer ids: only model_call_id references can be joined against them.
    summary_calls = merge_model_call_capture_into_record(result_row(7, None), model_servers[1])["ng_model_call_capture"]["calls"]
    join = join_agent_observations(parsed, summary_calls)
    assert (join.resolved, join.unresolved) == (0, 1) and join.gaps[0].invocation_id == "main"
