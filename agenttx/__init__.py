"""agenttx: transactions for an AI agent's tool calls.

Layer map: a module imports only from its own layer or below, and from a private package
only through the package itself (`from ._saga import SagaLedger`, never `._saga._ledger`), as
from a public package's private modules (`from .stores import is_durable`, never
`.stores._durable`). No modules import each other in a circle, even under `TYPE_CHECKING`.
`tests/test_layers.py` checks every import against this table (a layer may take several lines).

    layer 0: _errors _json _limits _validators _version
    layer 1: _refs _hints _render stores _events
    layer 2: _graph _rollback _saga _tools _lineage _constraints
    layer 3: _approvals _results _history _txlog _settings _timeline _prepare _turns _step
    layer 3: _preview
    layer 4: _transaction _plans
    layer 5: _audit _engine _recovery _prompt builtins testing integrations _demo _cli _ui __main__

    _errors      exception tree          _json       JSON checks, canonical dumps, leaves
    _limits      input limits            _validators settings validators
    _version     the version string      _refs       `${steps.N.path}` references
    _hints/      Clean Hints             _render     DOT and Mermaid drawing
    _events      audit events and hooks
    stores/      state stores, protocols _graph      dependency graph (the only rustworkx user)
    _rollback    rollback controller     _saga/      undo ledger, staged effects, dispatch
    _tools/      decorator, context,     _lineage/   value-provenance lineage
                 calls, worker threads   _results    what transactions report
    _history     step attempts           _txlog      the durable log
    _settings    a transaction's settings            _timeline   live steps, truncated together
    _prepare     a step's call, checked  _constraints hints kept, transient ones dropped
    _approvals/  approvals, status checks, reviews
    _turns       a model turn's calls    _step/      the step core: one tool call's lifecycle
    _preview     what a rollback would do, worked out without doing it
    _transaction/ interactive transactions: step pipeline, turn lock, people desk, views
    _prompt      the system prompt for agents
    _plans/      plans: model, validation, scheduler, runner, metrics; a run's attempts,
                 their ends, late calls, durable half, and the abort of a run left behind
    _audit       the stored audit trail, read back
    _engine      many transactions, reaper           _recovery   crash recovery
    builtins/    built-in tools          testing/    hypothesis helpers
    integrations/ agent SDKs and frameworks (optional extras, imported on their own)
    _demo, _cli, __main__                the demo and the command line
    _ui/         `agenttx ui`: the web app and its pictures

Everything public is re-exported here, from one import path each. The errors and the version
load with the package; every other name loads with its module when first asked for (module
`__getattr__`), so `import agenttx` costs little and a program pays only for what it uses.
"""

from __future__ import annotations

import importlib
import sys
from typing import TYPE_CHECKING

from ._errors import AgentTxError as AgentTxError
from ._errors import ApprovalConsumed as ApprovalConsumed
from ._errors import ApprovalError as ApprovalError
from ._errors import ApprovalExpired as ApprovalExpired
from ._errors import ApprovalNotFound as ApprovalNotFound
from ._errors import ApprovalRejected as ApprovalRejected
from ._errors import FailedPrecondition as FailedPrecondition
from ._errors import IllegalTransition as IllegalTransition
from ._errors import InvalidArgument as InvalidArgument
from ._errors import InvalidTransactionState as InvalidTransactionState
from ._errors import JSONValueError as JSONValueError
from ._errors import PlanToolMissing as PlanToolMissing
from ._errors import PlanValidationError as PlanValidationError
from ._errors import ReadConflict as ReadConflict
from ._errors import ReferenceSyntaxError as ReferenceSyntaxError
from ._errors import ReviewNotFound as ReviewNotFound
from ._errors import StepOutOfOrder as StepOutOfOrder
from ._errors import StorageError as StorageError
from ._errors import ToolError as ToolError
from ._errors import ToolOutputError as ToolOutputError
from ._errors import TransactionNotFound as TransactionNotFound
from ._errors import WriteConflict as WriteConflict
from ._version import __version__ as __version__

if TYPE_CHECKING:  # what the lazy names below load, for type checkers
    from . import stores as stores
    from ._approvals import Approval as Approval
    from ._approvals import ApprovalRequest as ApprovalRequest
    from ._approvals import CheckResult as CheckResult
    from ._approvals import Review as Review
    from ._engine import Engine as Engine
    from ._engine import EngineConfig as EngineConfig
    from ._events import Event as Event
    from ._events import EventHook as EventHook
    from ._events import EventKind as EventKind
    from ._events import audit_jsonl as audit_jsonl
    from ._graph import DependencyGraph as DependencyGraph
    from ._graph import Edge as Edge
    from ._graph import EdgeKind as EdgeKind
    from ._graph import StepNode as StepNode
    from ._hints import CleanHint as CleanHint
    from ._hints import HintCategory as HintCategory
    from ._hints import clean_error as clean_error
    from ._json import MAX_NESTING_DEPTH as MAX_NESTING_DEPTH
    from ._json import JSONValue as JSONValue
    from ._lineage import LineageEdge as LineageEdge
    from ._lineage import LineageGraph as LineageGraph
    from ._lineage import LineageNode as LineageNode
    from ._lineage import LineageRecorder as LineageRecorder
    from ._lineage import lineage_from_openai as lineage_from_openai
    from ._lineage import lineage_from_steps as lineage_from_steps
    from ._plans import CompensationOutcome as CompensationOutcome
    from ._plans import CompensationStatus as CompensationStatus
    from ._plans import CostBreakdown as CostBreakdown
    from ._plans import Node as Node
    from ._plans import NodeResult as NodeResult
    from ._plans import NodeState as NodeState
    from ._plans import Plan as Plan
    from ._plans import PlanMetrics as PlanMetrics
    from ._plans import PlanProblem as PlanProblem
    from ._plans import PlanProblemCode as PlanProblemCode
    from ._plans import PlanResult as PlanResult
    from ._plans import PlanRun as PlanRun
    from ._plans import PlanStatus as PlanStatus
    from ._plans import RateLimit as RateLimit
    from ._plans import arun_plan as arun_plan
    from ._plans import cost_per_completed_workflow as cost_per_completed_workflow
    from ._plans import plan_tool_spec as plan_tool_spec
    from ._plans import run_plan as run_plan
    from ._plans import start_plan as start_plan
    from ._preview import CompensationPreview as CompensationPreview
    from ._preview import RollbackPreview as RollbackPreview
    from ._prompt import PROMPT as PROMPT
    from ._prompt import prompt as prompt
    from ._refs import Dependency as Dependency
    from ._refs import Resolution as Resolution
    from ._refs import resolve_references as resolve_references
    from ._results import AttemptStatus as AttemptStatus
    from ._results import BadValue as BadValue
    from ._results import CommitResult as CommitResult
    from ._results import ContextEntry as ContextEntry
    from ._results import DispatchReport as DispatchReport
    from ._results import RecoveryReport as RecoveryReport
    from ._results import RollbackResult as RollbackResult
    from ._results import RootCause as RootCause
    from ._results import StepAttempt as StepAttempt
    from ._results import StepRecord as StepRecord
    from ._results import StepResult as StepResult
    from ._results import StepStatus as StepStatus
    from ._results import TransactionView as TransactionView
    from ._results import TxStatus as TxStatus
    from ._rollback import RollbackDecision as RollbackDecision
    from ._rollback import RollbackPolicy as RollbackPolicy
    from ._rollback import RollbackStrategy as RollbackStrategy
    from ._saga import CompensationReport as CompensationReport
    from ._saga import EffectDispatcher as EffectDispatcher
    from ._saga import JsonlDispatcher as JsonlDispatcher
    from ._tools import Compensation as Compensation
    from ._tools import StagedEffect as StagedEffect
    from ._tools import StateView as StateView
    from ._tools import Tool as Tool
    from ._tools import ToolContext as ToolContext
    from ._tools import ToolLike as ToolLike
    from ._tools import ToolSpec as ToolSpec
    from ._tools import UndoRecord as UndoRecord
    from ._tools import compensation as compensation
    from ._tools import to_json_value as to_json_value
    from ._tools import tool as tool
    from ._transaction import Transaction as Transaction
    from ._turns import TurnCall as TurnCall

__all__ = [
    "MAX_NESTING_DEPTH",
    "PROMPT",
    "AgentTxError",
    "Approval",
    "ApprovalConsumed",
    "ApprovalError",
    "ApprovalExpired",
    "ApprovalNotFound",
    "ApprovalRejected",
    "ApprovalRequest",
    "AttemptStatus",
    "BadValue",
    "CheckResult",
    "CleanHint",
    "CommitResult",
    "Compensation",
    "CompensationOutcome",
    "CompensationPreview",
    "CompensationReport",
    "CompensationStatus",
    "ContextEntry",
    "CostBreakdown",
    "Dependency",
    "DependencyGraph",
    "DispatchReport",
    "Edge",
    "EdgeKind",
    "EffectDispatcher",
    "Engine",
    "EngineConfig",
    "Event",
    "EventHook",
    "EventKind",
    "FailedPrecondition",
    "HintCategory",
    "IllegalTransition",
    "InvalidArgument",
    "InvalidTransactionState",
    "JSONValue",
    "JSONValueError",
    "JsonlDispatcher",
    "LineageEdge",
    "LineageGraph",
    "LineageNode",
    "LineageRecorder",
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
    "PlanToolMissing",
    "PlanValidationError",
    "RateLimit",
    "ReadConflict",
    "RecoveryReport",
    "ReferenceSyntaxError",
    "Resolution",
    "Review",
    "ReviewNotFound",
    "RollbackDecision",
    "RollbackPolicy",
    "RollbackPreview",
    "RollbackResult",
    "RollbackStrategy",
    "RootCause",
    "StagedEffect",
    "StateView",
    "StepAttempt",
    "StepNode",
    "StepOutOfOrder",
    "StepRecord",
    "StepResult",
    "StepStatus",
    "StorageError",
    "Tool",
    "ToolContext",
    "ToolError",
    "ToolLike",
    "ToolOutputError",
    "ToolSpec",
    "Transaction",
    "TransactionNotFound",
    "TransactionView",
    "TurnCall",
    "TxStatus",
    "UndoRecord",
    "WriteConflict",
    "arun_plan",
    "audit_jsonl",
    "clean_error",
    "compensation",
    "cost_per_completed_workflow",
    "lineage_from_openai",
    "lineage_from_steps",
    "plan_tool_spec",
    "prompt",
    "resolve_references",
    "run_plan",
    "start_plan",
    "to_json_value",
    "tool",
]

_MISSING = object()

#: Where each name of `__all__` that is not loaded with the package lives.
_LAZY: dict[str, str] = {
    "Approval": "._approvals",
    "ApprovalRequest": "._approvals",
    "CheckResult": "._approvals",
    "Review": "._approvals",
    "Engine": "._engine",
    "EngineConfig": "._engine",
    "Event": "._events",
    "EventHook": "._events",
    "EventKind": "._events",
    "audit_jsonl": "._events",
    "DependencyGraph": "._graph",
    "Edge": "._graph",
    "EdgeKind": "._graph",
    "StepNode": "._graph",
    "CleanHint": "._hints",
    "HintCategory": "._hints",
    "clean_error": "._hints",
    "MAX_NESTING_DEPTH": "._json",
    "JSONValue": "._json",
    "LineageEdge": "._lineage",
    "LineageGraph": "._lineage",
    "LineageNode": "._lineage",
    "LineageRecorder": "._lineage",
    "lineage_from_openai": "._lineage",
    "lineage_from_steps": "._lineage",
    "CompensationOutcome": "._plans",
    "CompensationStatus": "._plans",
    "CostBreakdown": "._plans",
    "Node": "._plans",
    "NodeResult": "._plans",
    "NodeState": "._plans",
    "Plan": "._plans",
    "PlanMetrics": "._plans",
    "PlanProblem": "._plans",
    "PlanProblemCode": "._plans",
    "PlanResult": "._plans",
    "PlanRun": "._plans",
    "PlanStatus": "._plans",
    "RateLimit": "._plans",
    "arun_plan": "._plans",
    "cost_per_completed_workflow": "._plans",
    "plan_tool_spec": "._plans",
    "run_plan": "._plans",
    "start_plan": "._plans",
    "CompensationPreview": "._preview",
    "RollbackPreview": "._preview",
    "PROMPT": "._prompt",
    "prompt": "._prompt",
    "Dependency": "._refs",
    "Resolution": "._refs",
    "resolve_references": "._refs",
    "AttemptStatus": "._results",
    "BadValue": "._results",
    "CommitResult": "._results",
    "ContextEntry": "._results",
    "DispatchReport": "._results",
    "RecoveryReport": "._results",
    "RollbackResult": "._results",
    "RootCause": "._results",
    "StepAttempt": "._results",
    "StepRecord": "._results",
    "StepResult": "._results",
    "StepStatus": "._results",
    "TransactionView": "._results",
    "TxStatus": "._results",
    "RollbackDecision": "._rollback",
    "RollbackPolicy": "._rollback",
    "RollbackStrategy": "._rollback",
    "CompensationReport": "._saga",
    "EffectDispatcher": "._saga",
    "JsonlDispatcher": "._saga",
    "Compensation": "._tools",
    "StagedEffect": "._tools",
    "StateView": "._tools",
    "Tool": "._tools",
    "ToolContext": "._tools",
    "ToolLike": "._tools",
    "ToolSpec": "._tools",
    "UndoRecord": "._tools",
    "compensation": "._tools",
    "to_json_value": "._tools",
    "tool": "._tools",
    "Transaction": "._transaction",
    "TurnCall": "._turns",
}

for _name in __all__:
    _obj = globals().get(_name)  # the lazy names are not loaded yet
    if isinstance(_obj, type):
        _obj.__module__ = __name__
del _name, _obj


def _publish() -> None:
    """Bind every lazy name whose module has loaded, each class's `__module__` set to `agenttx`.

    Called on every miss, so that loading one name publishes (and pins) all the names its module
    and the modules it imported define: an object met before its name was asked for (a result,
    an enum member) reports the public path. A module still being imported is skipped.
    """
    for name, module_name in _LAZY.items():
        obj = getattr(sys.modules.get(__name__ + module_name), name, _MISSING)
        if obj is _MISSING:
            continue
        if isinstance(obj, type):
            obj.__module__ = __name__
        globals()[name] = obj  # later lookups find it without `__getattr__`


if not TYPE_CHECKING:  # type checkers see the imports at the top (this would hide typos)

    def __getattr__(name: str) -> object:
        """Load a public name's module on first use (and `stores`, which `import agenttx` loaded
        before it was lazy); `AttributeError` for any other name."""
        module_name = _LAZY.get(name)
        if module_name is None:
            if name == "stores":
                return importlib.import_module(".stores", __name__)
            raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
        importlib.import_module(module_name, __name__)
        _publish()
        return globals()[name]


def __dir__() -> list[str]:
    """The module's names, the public ones included before they load."""
    return sorted({*globals(), *__all__})
