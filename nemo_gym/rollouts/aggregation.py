"""After a collection: ask each agent for `/aggregate_metrics` over its rollouts (NeMo Gym v0.5, spec §3.3).

The agent computes them (by default itself, or proxied to its resources server, whose `compute_metrics` hook
knows the task: pass@k, majority@k, subsets...). We send the collected rollouts of that agent, stripped of the
large payloads (`response` but its `usage`, `responses_create_params`, observation and capture data), and write
`<stem>_aggregate_metrics.json`: a JSON array of `{agent_ref: {name}, agent_metrics, key_metrics,
group_level_metrics}`, one entry per agent.

Only successful rollouts (the output file) are aggregated: failures, judge failures included, are not scores.
An agent that cannot aggregate (an old agent without the route, an error in a custom `compute_metrics`) costs
its entry and a clear message, never the collected rollouts. One request carries all of an agent's rollouts (v0.5's
contract), so past `aggregation_max_rollouts` (200,000 by default) the collector skips the step and says so,
instead of holding the whole run in memory; the reward profile is computed in bounded memory at any size.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any, Mapping, Optional

from nemo_gym.rollouts.jsonl import iter_jsonl_objects

__all__ = [
    "STRIPPED_KEYS",
    "TooManyToAggregate",
    "stripped_for_aggregation",
    "read_results_by_agent",
    "aggregate_by_agent",
    "write_aggregate_metrics",
    "print_key_metrics",
]

STRIPPED_KEYS = ("response", "responses_create_params", "ng_agent_observations", "ng_model_call_capture")


def stripped_for_aggregation(result: Mapping[str, Any]) -> dict:
    """`result` without the large payloads; `response` is kept as `{"usage": ...}` when it has usage."""
    out = {k: v for k, v in result.items() if k not in STRIPPED_KEYS}
    response = result.get("response")
    if isinstance(response, Mapping) and response.get("usage") is not None:
        out["response"] = {"usage": response["usage"]}
    return out


def _agent_of(result: Mapping[str, Any], default: Optional[str]) -> Optional[str]:
    ref = result.get("agent_ref")
    if isinstance(ref, Mapping) and isinstance(ref.get("name"), str):
        return ref["name"]
    return default


class TooManyToAggregate(Exception):
    """More rollouts than one `/aggregate_metrics` request should carry (it holds them all in memory, twice)."""


def read_results_by_agent(
    path: Path, default_agent: Optional[str] = None, *, max_rollouts: Optional[int] = None
) -> dict[str, list[dict]]:
    """The stripped results of a rollouts file, grouped by `agent_ref.name` (rows without one go to
    `default_agent`, or are skipped), sorted by (task, rollout) index. More than `max_rollouts` rows raise
    `TooManyToAggregate` as soon as the file shows it."""
    groups: dict[str, list[dict]] = {}
    count = 0
    for result in iter_jsonl_objects(path, on_bad=lambda: None):  # a torn line was reported by the collector
        agent = _agent_of(result, default_agent)
        if agent is not None:
            count += 1
            if max_rollouts is not None and count > max_rollouts:
                raise TooManyToAggregate(f"more than {max_rollouts} rollouts in {path}")
            groups.setdefault(agent, []).append(stripped_for_aggregation(result))
    for rows in groups.values():
        rows.sort(key=lambda r: (r.get("_ng_task_index", 0), r.get("_ng_rollout_index", 0)))
    return groups


async def aggregate_by_agent(
    server_client: Any, groups: Mapping[str, list[dict]], *, route_owner: Optional[Mapping[str, str]] = None
) -> tuple[list[dict], list[str]]:
    """POST each group to `/aggregate_metrics` of its agent (or of `route_owner[agent]`, e.g. its resources
    server for reverify). Returns (entries, problems): one entry per agent that answered, one line per one that
    did not."""
    from nemo_gym.http.client import get_response_json

    entries: list[dict] = []
    problems: list[str] = []
    for agent, rows in groups.items():
        target = (route_owner or {}).get(agent, agent)
        try:
            response = await server_client.post(target, "/aggregate_metrics", json={"verify_responses": rows})
            status = getattr(response, "status", None) or getattr(response, "status_code", 0)
            if status >= 400:
                body = await response.read() if hasattr(response, "read") else response.content
                text = body.decode("utf-8", errors="replace") if isinstance(body, bytes) else str(body)
                problems.append(f"`{target}` answered HTTP {status} to POST /aggregate_metrics: {text[:500]}")
                continue
            data = await get_response_json(response)
        except Exception as exc:
            problems.append(f"POST /aggregate_metrics on `{target}` failed: {type(exc).__name__}: {exc}")
            continue
        entries.append(
            {
                "agent_ref": {"name": agent},
                "agent_metrics": data.get("agent_metrics", {}),
                "key_metrics": data.get("key_metrics", {}),
                "group_level_metrics": data.get("group_level_metrics", []),
            }
        )
    return entries, problems


def write_aggregate_metrics(path: Path, entries: list[dict]) -> None:
    """Write the entries as an indented JSON array (to a temporary file renamed into place)."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(entries, indent=2, allow_nan=False, default=str) + "\n")
    tmp.replace(path)


def print_key_metrics(entries: list[dict], out: Any = None) -> None:
    """One block per agent with its key metrics (numbers with 4 significant decimals)."""
    out = out or sys.stdout
    for entry in entries:
        key_metrics = entry.get("key_metrics") or {}
        if not key_metrics:
            continue
        out.write(f"Key metrics of `{entry['agent_ref']['name']}`:\n")
        width = max(len(k) for k in key_metrics)
        for name, value in key_metrics.items():
            shown = f"{value:.4f}" if isinstance(value, float) else str(value)
            out.write(f"  {name:<{width}}  {shown}\n")
    out.flush()
