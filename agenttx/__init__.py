"""agenttx: transactions for an AI agent's tool calls.

Layer map (a module imports only from its own layer or below):

    0  _errors, _json            exception tree; JSON checks, canonical dumps, leaves
    1  _refs                     `${steps.N.path}` grammar and resolution
    2  _graph                    dependency graph (the only rustworkx importer)
    4  _demo, __main__, testing  the demo and command line; hypothesis strategies, checks

Everything public is re-exported here, from one import path each.
"""

from __future__ import annotations

from ._errors import AgentTxError as AgentTxError
from ._errors import FailedPrecondition as FailedPrecondition
from ._errors import IllegalTransition as IllegalTransition
from ._errors import InvalidArgument as InvalidArgument
from ._errors import InvalidTransactionState as InvalidTransactionState
from ._errors import JSONValueError as JSONValueError
from ._errors import ReferenceSyntaxError as ReferenceSyntaxError
from ._errors import StepOutOfOrder as StepOutOfOrder
from ._errors import StorageError as StorageError
from ._errors import TransactionNotFound as TransactionNotFound
from ._errors import WriteConflict as WriteConflict
from ._graph import DependencyGraph as DependencyGraph
from ._graph import Edge as Edge
from ._graph import EdgeKind as EdgeKind
from ._graph import StepNode as StepNode
from ._json import MAX_NESTING_DEPTH as MAX_NESTING_DEPTH
from ._json import JSONValue as JSONValue
from ._refs import Dependency as Dependency
from ._refs import Resolution as Resolution
from ._refs import resolve_references as resolve_references

__version__ = "0.1.0.dev0"

__all__ = [
    "MAX_NESTING_DEPTH",
    "AgentTxError",
    "Dependency",
    "DependencyGraph",
    "Edge",
    "EdgeKind",
    "FailedPrecondition",
    "IllegalTransition",
    "InvalidArgument",
    "InvalidTransactionState",
    "JSONValue",
    "JSONValueError",
    "ReferenceSyntaxError",
    "Resolution",
    "StepNode",
    "StepOutOfOrder",
    "StorageError",
    "TransactionNotFound",
    "WriteConflict",
    "resolve_references",
]

for _name in __all__:
    _obj = globals()[_name]
    if isinstance(_obj, type):
        _obj.__module__ = __name__
del _name, _obj
