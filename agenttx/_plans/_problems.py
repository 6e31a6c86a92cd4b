"""What the checks of a plan report (`PlanProblem`, by `PlanProblemCode`), and the shape of a
plan they read (`PlanShape`).

`PlanShape` is what `Plan` offers its checkers (`validate_plan`, `find_cycles`): they are
typed against it, not against `Plan`, so that the plan's module can call them and they never
import it back.
"""

from __future__ import annotations

import enum
from typing import TYPE_CHECKING, Protocol, final

import attrs

if TYPE_CHECKING:
    from collections.abc import Mapping

    from ._node import Node

__all__ = ["PlanProblem", "PlanProblemCode", "PlanShape"]


class PlanProblemCode(str, enum.Enum):
    """What is wrong with a plan (`PlanProblem.code`); each value is its name."""

    UNKNOWN_NODE = "UNKNOWN_NODE"
    """A reference, or `after`, names a node the plan does not have."""
    UNKNOWN_TOOL = "UNKNOWN_TOOL"
    """A node calls a tool (or names a compensation) that is not registered."""
    UNKNOWN_INPUT = "UNKNOWN_INPUT"
    """A node maps an input its tool does not take."""
    DUPLICATE_NODE = "DUPLICATE_NODE"
    """Two nodes share an id."""
    MISSING_INPUT = "MISSING_INPUT"
    """A required parameter is unmapped, or `${initial.key}` names an undeclared key."""
    MISSING_OUTPUT = "MISSING_OUTPUT"
    """A reference names a field the producer's return type lacks."""
    MALFORMED_PATH = "MALFORMED_PATH"
    """A reference does not follow the grammar, or its path does not fit the producer's type."""
    TYPE_MISMATCH = "TYPE_MISMATCH"
    """An input's type, from annotations, contradicts the parameter's."""
    UNSUPPORTED_TRANSFORMATION = "UNSUPPORTED_TRANSFORMATION"
    """An input asks for a conversion plans do not make, such as a list written into text."""
    SELF_DEPENDENCY = "SELF_DEPENDENCY"
    """A node references its own output, or lists itself in `after`."""
    DUPLICATE_EDGE = "DUPLICATE_EDGE"
    """One node maps the identical reference twice, or lists a node twice in `after`."""
    CYCLE = "CYCLE"
    """The nodes depend on each other in a ring; the subject is the ring's path."""

    def __str__(self) -> str:
        return self.value


@final
@attrs.frozen(kw_only=True)
class PlanProblem:
    """One problem `Plan.validate` found.

    `subject` names the offender: a node id (`stock_check`), a node's input or field
    (`reserve.customer_id`, `customer_lookup.account_status`), an initial key (`initial.sku`) or,
    for a `CYCLE`, its path (`customer_lookup -> reserve -> customer_lookup`). `message` is one
    sentence saying what is wrong and what to do.
    """

    code: PlanProblemCode
    subject: str
    message: str

    def __str__(self) -> str:
        return f"{self.code.value} {self.subject}: {self.message}"


class PlanShape(Protocol):
    """What a plan's checkers read of a `Plan`: its nodes in order, its initial keys, and the
    dependency tables it computes once, on construction (see `Plan`). Read only, except
    `_validated`, where `validate_plan` keeps its last answer with the tools it was for."""

    @property
    def nodes(self) -> tuple[Node, ...]: ...

    @property
    def initial(self) -> tuple[str, ...]: ...

    @property
    def node_ids(self) -> tuple[str, ...]: ...

    @property
    def _by_id(self) -> Mapping[str, Node]: ...

    @property
    def _prerequisites(self) -> Mapping[str, frozenset[str]]: ...

    @property
    def _dependants(self) -> Mapping[str, frozenset[str]]: ...

    @property
    def _validated(
        self,
    ) -> tuple[tuple[tuple[str, object], ...], tuple[PlanProblem, ...]] | None: ...

    def node(self, node_id: str) -> Node: ...

    def prerequisites(self, node_id: str) -> frozenset[str]: ...
