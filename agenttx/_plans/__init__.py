"""Plans: a whole plan of tool calls, validated, then run as a DAG."""

from __future__ import annotations

from ._metrics import CostBreakdown as CostBreakdown
from ._metrics import PlanMetrics as PlanMetrics

__all__ = ["CostBreakdown", "PlanMetrics"]
