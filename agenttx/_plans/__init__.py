"""Plans: a DAG of tool calls, validated before it runs, then run concurrently, with metrics."""

from __future__ import annotations

from ._abort import abort_run as abort_run
from ._abort import missing_tool as missing_tool
from ._abort import plan_of as plan_of
from ._cycles import find_cycles as find_cycles
from ._journal import StoredNode as StoredNode
from ._journal import is_plan_store as is_plan_store
from ._journal import read_run as read_run
from ._metrics import CostBreakdown as CostBreakdown
from ._metrics import PlanMetrics as PlanMetrics
from ._model import Plan as Plan
from ._node import MAX_NODE_ID as MAX_NODE_ID
from ._node import InputRef as InputRef
from ._node import Node as Node
from ._node import UnresolvedInput as UnresolvedInput
from ._node import resolve_inputs as resolve_inputs
from ._node import resolve_resource as resolve_resource
from ._problems import PlanProblem as PlanProblem
from ._problems import PlanProblemCode as PlanProblemCode
from ._results import CompensationOutcome as CompensationOutcome
from ._results import CompensationStatus as CompensationStatus
from ._results import NodeResult as NodeResult
from ._results import PlanResult as PlanResult
from ._results import PlanStatus as PlanStatus
from ._results import cost_per_completed_workflow as cost_per_completed_workflow
from ._runner import PlanRun as PlanRun
from ._runner import arun_plan as arun_plan
from ._runner import resume_plan as resume_plan
from ._runner import run_plan as run_plan
from ._runner import start_plan as start_plan
from ._scheduler import NodeState as NodeState
from ._scheduler import RateLimit as RateLimit
from ._schema import PLAN_TOOL as PLAN_TOOL
from ._schema import plan_tool_spec as plan_tool_spec
from ._validate import validate_plan as validate_plan

__all__ = [
    "MAX_NODE_ID",
    "PLAN_TOOL",
    "CompensationOutcome",
    "CompensationStatus",
    "CostBreakdown",
    "InputRef",
    "Node",
    "NodeResult",
    "NodeState",
    "Plan",
    "PlanMetrics",
    "PlanProblem",
    "PlanProblemCode",
    "PlanResult",
    "PlanRun",
    "PlanStatus",
    "RateLimit",
    "StoredNode",
    "UnresolvedInput",
    "abort_run",
    "arun_plan",
    "cost_per_completed_workflow",
    "find_cycles",
    "is_plan_store",
    "missing_tool",
    "plan_of",
    "plan_tool_spec",
    "read_run",
    "resolve_inputs",
    "resolve_resource",
    "resume_plan",
    "run_plan",
    "start_plan",
    "validate_plan",
]
