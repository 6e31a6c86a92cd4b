"""The public surface: sorted `__all__`, one import path per object, `__module__` set."""

from __future__ import annotations

import importlib
import importlib.resources
import inspect
import pkgutil

import pytest

import agenttx
import agenttx.builtins
import agenttx.stores
import agenttx.testing

PUBLIC_MODULES = {
    "agenttx": agenttx,
    "agenttx.builtins": agenttx.builtins,
    "agenttx.stores": agenttx.stores,
    "agenttx.testing": agenttx.testing,
}

EXPECTED = {
    "agenttx": [
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
    ],
    "agenttx.builtins": sorted(agenttx.builtins.__all__),
    "agenttx.stores": [
        "ClaimingOutbox",
        "DurableStore",
        "EffectRow",
        "EndedTransaction",
        "HistoryStore",
        "LeasedStore",
        "MemoryStore",
        "OutboxEntry",
        "PlanChange",
        "PlanExpect",
        "PlanImage",
        "PlanNodeRow",
        "PlanStore",
        "PostgresStore",
        "ReleasingStore",
        "RequestRow",
        "RequestStore",
        "SQLiteStore",
        "Store",
        "TxImage",
        "UndoRow",
    ],
    "agenttx.testing": [
        "StepSpec",
        "TransactionMachine",
        "build_graph",
        "check_graph_invariants",
        "check_store",
        "json_scalars",
        "json_values",
        "plans",
        "step_sequences",
    ],
}


@pytest.mark.parametrize("name", sorted(PUBLIC_MODULES))
def test_all_is_pinned_and_sorted(name):
    """`__all__` lists exactly the public names, sorted (constants first, as isort sorts)."""
    module = PUBLIC_MODULES[name]
    assert module.__all__ == EXPECTED[name]
    assert module.__all__ == sorted(module.__all__, key=lambda n: (not n.isupper(), n))


@pytest.mark.parametrize("name", sorted(PUBLIC_MODULES))
def test_every_public_name_exists(name):
    """Each name in `__all__` can be imported from its public module."""
    module = PUBLIC_MODULES[name]
    for attribute in module.__all__:
        assert hasattr(module, attribute), attribute


@pytest.mark.parametrize("name", sorted(PUBLIC_MODULES))
def test_public_classes_live_at_their_public_path(name):
    """Exported classes and functions report the public module, not a private one."""
    module = PUBLIC_MODULES[name]
    for attribute in module.__all__:
        obj = getattr(module, attribute)
        if isinstance(obj, type):
            assert obj.__module__ == name, f"{attribute}.__module__ is {obj.__module__}"


def test_each_object_has_one_public_import_path():
    """No object is exported by two public modules."""
    seen: dict[int, str] = {}
    for module_name, module in PUBLIC_MODULES.items():
        for attribute in module.__all__:
            obj = getattr(module, attribute)
            if isinstance(obj, (int, str)):
                continue
            assert id(obj) not in seen, f"{attribute} is exported by {seen.get(id(obj))} too"
            seen[id(obj)] = module_name


def test_only_listed_modules_are_public():
    """Every module of the package other than the public ones is private (underscore)."""
    public = set(PUBLIC_MODULES) | {"agenttx.__main__", "agenttx.integrations"}
    for info in pkgutil.walk_packages(agenttx.__path__, prefix="agenttx."):
        leaf = info.name.rsplit(".", 1)[-1]
        if info.name.startswith("agenttx.integrations."):
            continue  # one public module per integration (docs/integrations.md)
        if info.name not in public:
            assert leaf.startswith("_"), f"{info.name} is neither public nor private"


def test_no_public_signature_mentions_rustworkx():
    """No public method of the graph mentions rustworkx (test_layers: only _graph imports it)."""
    for name in dir(agenttx.DependencyGraph):
        member = getattr(agenttx.DependencyGraph, name)
        if name.startswith("_") or not callable(member):
            continue
        signature = str(inspect.signature(member))
        assert "rustworkx" not in signature, name
        assert "PyDiGraph" not in signature, name


def test_package_is_typed():
    """The package ships its py.typed marker."""
    assert importlib.resources.files("agenttx").joinpath("py.typed").is_file()


@pytest.mark.parametrize("name", sorted(PUBLIC_MODULES))
def test_every_public_name_is_documented(name):
    """Each exported class and function, and each public method and property, has a docstring."""
    module = PUBLIC_MODULES[name]
    for attribute in module.__all__:
        obj = getattr(module, attribute)
        if not (inspect.isclass(obj) or inspect.isfunction(obj)):
            continue
        assert (obj.__doc__ or "").strip(), f"{name}.{attribute} has no docstring"
        if inspect.isclass(obj):
            for member, value in vars(obj).items():
                if member.startswith("_"):
                    continue
                if inspect.isfunction(value) or isinstance(value, property):
                    assert (value.__doc__ or "").strip(), f"{name}.{attribute}.{member}"
