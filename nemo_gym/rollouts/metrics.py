"""Metrics over verify responses: pass@k, majority@k, subsets, and `/aggregate_metrics` (NeMo Gym v0.5 names).

(Skeleton: the functions below are filled in by the metrics work; the mixin's interface is final.)
"""

from __future__ import annotations

from typing import Any, Callable, Optional

from nemo_gym.config.types import AggregateMetrics, AggregateMetricsRequest

__all__ = ["AggregateMetricsMixin", "compute_aggregate_metrics"]


def compute_aggregate_metrics(
    verify_responses: list[dict[str, Any]],
    compute_metrics_fn: Optional[Callable[[list[list[dict]]], dict]] = None,
    get_key_metrics_fn: Optional[Callable[[dict], dict]] = None,
) -> AggregateMetrics:
    raise NotImplementedError


class AggregateMetricsMixin:
    """The `/aggregate_metrics` hooks of resources servers and agents: override `compute_metrics` (tasks =
    verify responses grouped per task, in rollout order) and `get_key_metrics` (which metrics to print)."""

    def compute_metrics(self, tasks: list[list[dict]]) -> dict:
        return {}

    def get_key_metrics(self, agent_metrics: dict) -> dict:
        return {k: v for k, v in agent_metrics.items() if k.startswith("mean/")}

    async def aggregate_metrics(self, body: AggregateMetricsRequest) -> AggregateMetrics:
        return compute_aggregate_metrics(body.verify_responses, self.compute_metrics, self.get_key_metrics)
