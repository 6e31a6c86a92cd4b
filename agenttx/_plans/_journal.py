"""A plan run's durable records: every transition written before its events are emitted.

On a store that keeps plan runs (`SQLiteStore`: `begin_plan`, `write_plan`, ...), `PlanJournal`
writes the run's record (the plan's JSON form, the initial values, the run's settings) when the
run starts, and then each node's record at each transition, in one durable write per
transition: its state, unresolved prerequisite count, resolved inputs, output, attempt id and
number, error (the hint's text), retries, first start and end (seconds since the epoch), and its
history (`[state, at, attempt]` per transition). A claim is a compare-and-set: the node must
still be PENDING or READY with the attempt this journal last wrote for it, so of two runners
that both believe they hold a node, one claim succeeds. A completion or failure is a
compare-and-set on the attempt that holds the node. `StoredNode` reads a node back for
`Engine.recover`.
"""

from __future__ import annotations

import json
import time
from typing import TYPE_CHECKING, Any, Final, NamedTuple, cast, final

from .._errors import StorageError
from .._json import JSONValue, canonical_dumps
from ..stores._plans import PlanExpect, PlanNodeRow

if TYPE_CHECKING:
    from collections.abc import Iterable, Mapping

    from ..stores._plans import PlanImage

__all__ = ["FORMAT", "PlanJournal", "StoredNode", "is_plan_store", "read_run"]

#: The version of the records below.
FORMAT: Final = 1
_CLAIMABLE: Final = ("PENDING", "READY")
_RUNNING: Final = ("RUNNING",)
_ENDED: Final = frozenset({"SUCCEEDED", "FAILED", "TIMED_OUT", "CANCELLED", "SKIPPED"})
_METHODS: Final = ("begin_plan", "write_plan", "read_plan", "cancel_plan", "claim_plan")


def is_plan_store(store: object) -> bool:
    """Whether `store` keeps plan runs durably."""
    return all(callable(getattr(store, name, None)) for name in _METHODS)


class StoredNode(NamedTuple):
    """A node as its last durable record says."""

    state: str
    attempt: str | None
    output: JSONValue
    error: str | None
    record: dict[str, Any]


def read_run(image: PlanImage) -> tuple[dict[str, Any], dict[str, StoredNode]]:
    """The run's record and its nodes, decoded; `StorageError` if malformed."""
    try:
        record = json.loads(image.record)
        nodes: dict[str, StoredNode] = {}
        for row in image.nodes:
            node = json.loads(row.record)
            nodes[row.node_id] = StoredNode(
                state=row.state,
                attempt=row.attempt,
                output=node.get("output"),
                error=node.get("error"),
                record=node,
            )
    except (ValueError, TypeError, AttributeError) as exc:
        raise StorageError(f"plan run `{image.run_id}`: unreadable durable record: {exc}") from exc
    if not isinstance(record, dict) or record.get("format") != FORMAT:
        raise StorageError(f"plan run `{image.run_id}`: unknown record format")
    return record, nodes


@final
class PlanJournal:
    """Writes one plan run's durable records; see the module docstring. Called from the run's
    event loop only (a cancellation from elsewhere goes through the store's `cancel_plan`)."""

    __slots__ = ("_nodes", "_run_id", "_store")

    def __init__(self, store: Any, run_id: str, nodes: dict[str, dict[str, Any]]) -> None:
        self._store = store
        self._run_id = run_id
        self._nodes = nodes

    @classmethod
    def begin(
        cls,
        store: Any,
        run_id: str,
        record: Mapping[str, JSONValue],
        states: Iterable[tuple[str, str, int]],
    ) -> PlanJournal:
        """Write the run's `record` and its nodes (`(node_id, state, unresolved)`) at once."""
        now = time.time()
        nodes: dict[str, dict[str, Any]] = {}
        rows = []
        for node_id, state, unresolved in states:
            node: dict[str, Any] = {
                "unresolved": unresolved,
                "inputs": None,
                "output": None,
                "attempt": None,
                "number": 0,
                "error": None,
                "retries": 0,
                "started_at": None,
                "finished_at": None,
                "history": [[state, now, None]],
            }
            nodes[node_id] = node
            rows.append(_row(node_id, state, node))
        store.begin_plan(run_id, canonical_dumps({"format": FORMAT, **record}), rows)
        return cls(store, run_id, nodes)

    @classmethod
    def resumed(cls, store: Any, run_id: str, stored: Mapping[str, StoredNode]) -> PlanJournal:
        """The journal of a run taken over by recovery, from its stored nodes."""
        return cls(store, run_id, {node_id: dict(node.record) for node_id, node in stored.items()})

    def state(self, node_id: str) -> str:
        """The node's state as last written."""
        return str(self._nodes[node_id]["history"][-1][0])

    def claim(self, node_id: str, attempt: str, number: int, inputs: JSONValue) -> bool:
        """Claim the node for `attempt` (compare-and-set); False if it is not claimable."""
        node = self._nodes[node_id]
        expect = PlanExpect(node_id=node_id, states=_CLAIMABLE, attempt=node["attempt"])
        now = time.time()
        changed = {
            **node,
            "attempt": attempt,
            "number": number,
            "inputs": inputs,
            "unresolved": 0,
            "started_at": node["started_at"] or now,
            "history": [*node["history"], ["RUNNING", now, attempt]],
        }
        if not self._store.write_plan(
            self._run_id, [_row(node_id, "RUNNING", changed)], expect=expect
        ):
            return False
        self._nodes[node_id] = changed
        return True

    def end_attempt(
        self,
        node_id: str,
        attempt: str,
        state: str,
        *,
        output: JSONValue = None,
        error: str | None = None,
        released: Iterable[tuple[str, str, int]] = (),
    ) -> bool:
        """Record how `attempt` ended (`state`: SUCCEEDED, FAILED, TIMED_OUT, or READY for a
        retry) with the nodes it `released` (`(node_id, state, unresolved)`), in one write;
        False if another attempt holds the node."""
        node = self._nodes[node_id]
        now = time.time()
        changed = {
            **node,
            "output": output,
            "error": error,
            "retries": node["retries"] + (state == "READY"),
            "finished_at": None if state == "READY" else now,
            "history": [*node["history"], [state, now, attempt]],
        }
        rows = [_row(node_id, state, changed)]
        others = self._changes(released, now)
        rows += [_row(other, other_state, fields) for other, other_state, fields in others]
        expect = PlanExpect(node_id=node_id, states=_RUNNING, attempt=attempt)
        if not self._store.write_plan(self._run_id, rows, expect=expect):
            return False
        self._nodes[node_id] = changed
        for other, _, fields in others:
            self._nodes[other] = fields
        return True

    def transitions(
        self, changes: Iterable[tuple[str, str, int]], status: str | None = None
    ) -> None:
        """Record other nodes' transitions (`(node_id, state, unresolved)`: released,
        skipped, cancelled), and the run's `status` if given, in one write."""
        now = time.time()
        others = self._changes(changes, now)
        if not others and status is None:
            return
        rows = [_row(other, state, fields) for other, state, fields in others]
        self._store.write_plan(self._run_id, rows, status=status)
        for other, _, fields in others:
            self._nodes[other] = fields

    def cancel_reason(self) -> str | None:
        """The cancellation another thread or process recorded for the run, or None."""
        reason: str | None = self._store.plan_cancel_reason(self._run_id)
        return reason

    def _changes(
        self, changes: Iterable[tuple[str, str, int]], now: float
    ) -> list[tuple[str, str, dict[str, Any]]]:
        out = []
        for node_id, state, unresolved in changes:
            node = self._nodes[node_id]
            last = node["history"][-1][0]
            if last in _ENDED or (last == state and node["unresolved"] == unresolved):
                continue  # an ended node stays ended (a resumed run replays it)
            ended = state in ("SKIPPED", "CANCELLED")
            out.append(
                (
                    node_id,
                    state,
                    {
                        **node,
                        "unresolved": unresolved,
                        "finished_at": now if ended else node["finished_at"],
                        "history": [*node["history"], [state, now, None]],
                    },
                )
            )
        return out


def _row(node_id: str, state: str, node: Mapping[str, Any]) -> PlanNodeRow:
    return PlanNodeRow(
        node_id=node_id,
        state=state,
        attempt=node["attempt"],
        record=canonical_dumps(cast("JSONValue", dict(node))),
    )
