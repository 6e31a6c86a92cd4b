"""Plans: a DAG of tool calls, validated before it runs, then run concurrently, with metrics."""

from __future__ import annotations

from ._metrics import CostBreakdown as CostBreakdown
from ._metrics import PlanMetrics as PlanMetrics
from ._model import MAX_NODE_ID as MAX_NODE_ID
from ._model import InputRef as InputRef
from ._model import Node as Node
from ._model import Plan as Plan
from ._model import PlanProblem as PlanProblem
from ._model import PlanProblemCode as PlanProblemCode
from ._model import UnresolvedInput as UnresolvedInput
from ._model import resolve_inputs as resolve_inputs
from ._validate import find_cycles as find_cycles
from ._validate import validate_plan as validate_plan

__all__ = [
    "MAX_NODE_ID",
    "CostBreakdown",
    "InputRef",
    "Node",
    "Plan",
    "PlanMetrics",
    "PlanProblem",
    "PlanProblemCode",
    "UnresolvedInput",
    "find_cycles",
    "resolve_inputs",
    "validate_plan",
]
