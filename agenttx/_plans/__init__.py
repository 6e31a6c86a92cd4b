"""Plans: a DAG of tool calls, validated, scheduled and run concurrently, with metrics."""

from __future__ import annotations

from ._metrics import CostBreakdown as CostBreakdown
from ._metrics import PlanMetrics as PlanMetrics

__all__ = ["CostBreakdown", "PlanMetrics"]
