"""Test helpers for agenttx users: hypothesis strategies and invariant checks.

Requires hypothesis (`pip install agenttx[test]`). Use them to property-test your own tools and
tool graphs::

    from hypothesis import given
    from agenttx.testing import build_graph, check_graph_invariants, step_sequences


    @given(step_sequences())
    def test_graph(steps):
        check_graph_invariants(build_graph(steps))

`plans()` draws random plans (acyclic, or with one injected cycle) for plan validation and
scheduling tests.
"""

from __future__ import annotations

try:
    import hypothesis as _hypothesis  # noqa: F401
except ImportError as exc:  # pragma: no cover - exercised only without the test extra
    raise ImportError(
        "agenttx.testing needs hypothesis: install it with `pip install 'agenttx[test]'`"
    ) from exc

from ._invariants import check_graph_invariants as check_graph_invariants
from ._machines import TransactionMachine as TransactionMachine
from ._plans import plans as plans
from ._stores import check_store as check_store
from ._strategies import StepSpec as StepSpec
from ._strategies import build_graph as build_graph
from ._strategies import json_scalars as json_scalars
from ._strategies import json_values as json_values
from ._strategies import step_sequences as step_sequences

__all__ = [
    "StepSpec",
    "TransactionMachine",
    "build_graph",
    "check_graph_invariants",
    "check_store",
    "json_scalars",
    "json_values",
    "plans",
    "step_sequences",
]

for _name in __all__:
    _obj = globals()[_name]
    if isinstance(_obj, type):
        _obj.__module__ = __name__
del _name, _obj
