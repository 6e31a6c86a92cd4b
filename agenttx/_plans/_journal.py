"""A plan run's durable records: every transition written before its events are emitted.

On a store that keeps plan runs (`SQLiteStore`: `begin_plan`, `write_plan`, ...), `PlanJournal`
writes the run's record (the plan's JSON form, the initial values, the run's settings) when the
run starts, and then each node's transitions: its state, unresolved prerequisite count,
resolved inputs, output, attempt id and number, error (the hint's text), retries, first start
and end (seconds since the epoch), the GBP its ended attempts reported (`cost`, by category,
decimal text), and its history (`[state, at, attempt]` per transition).

A node's record is JSON lines: the first line is the whole record as the run began, and each
transition appends one line with the fields it changed (its history entry under `"h"`), so a
transition costs the same however long the node's history is. `read_run` folds them back.

Transitions are buffered and written together, in one SQLite write transaction, at the next
barrier the runner sets: before any tool starts (with the claims of the round of nodes it
dispatches), before the runner waits for results, and before the run ends. So a node's
completion, the release of its dependants and the claims of the next nodes are one write, and
no tool starts before the transitions it depends on are durable. A node released and claimed
in the same write is one statement: the claim appends both transitions' lines. A claim is a
compare-and-set: the node must still be PENDING or READY with the attempt this journal last
wrote for it, so of two runners that both believe they hold a node, one claim succeeds. A
completion or failure is a compare-and-set on the attempt that holds the node. `StoredNode`
reads a node back for `Engine.recover`.

A claim can carry the node's exclusive resource (`claim_all(holds=)`): the store takes it in
the same write, and refuses the claim (nothing of it written) while another run's node holds
it; those nodes are `held` after the write, for the runner to try again later. A claim can
carry units of resource capacities too (`claim_all(units=)`), counted over every run on the
store: a claim past a capacity is `held` the same way. The end of the attempt (or the node's
cancellation) releases what it holds in the write that records it.
"""

from __future__ import annotations

import contextlib
import json
import time
from decimal import Decimal
from typing import TYPE_CHECKING, Any, Final, NamedTuple, cast, final

from .._errors import InvalidArgument, StorageError
from .._json import JSONValue, compact_encoder
from ..stores import PlanChange, PlanExpect, PlanNodeRow, is_plan_store

if TYPE_CHECKING:
    from collections.abc import Iterable, Mapping, Sequence

    from ..stores import PlanImage, PlanStore, Store

__all__ = ["FORMAT", "PlanJournal", "StoredNode", "fold", "is_plan_store", "read_run"]

#: The version of the records below: 2 writes node records as JSON lines (1: one JSON text).
FORMAT: Final = 2
_FORMATS: Final = (1, 2)
_CLAIMABLE: Final = ("PENDING", "READY")
_RUNNING: Final = ("RUNNING",)
_ENDED: Final = frozenset({"SUCCEEDED", "FAILED", "TIMED_OUT", "CANCELLED", "SKIPPED"})

#: Records are compact JSON with keys in their order, not sorted: a node's inputs, the plan's
#: and the initial values reach a tool of a resumed run as they were given (records written
#: before kept sorted keys, and read back so).
_dumps: Final = compact_encoder(sort_keys=False)


class StoredNode(NamedTuple):
    """A node as its last durable record says."""

    state: str
    attempt: str | None
    output: JSONValue
    error: str | None
    record: dict[str, Any]


def fold(text: str) -> dict[str, Any]:
    """A node's record from its stored lines: the first, updated by each transition's line
    (whose `"h"` entry is appended to the history). `ValueError` (or `TypeError`,
    `AttributeError`, `KeyError`) if malformed."""
    first, *lines = text.split("\n")
    node = json.loads(first)
    history = node["history"]
    for line in lines:
        change = json.loads(line)
        step = change.pop("h", None)
        node.update(change)
        if step is not None:
            history.append(step)
    if not isinstance(node, dict):
        raise TypeError("a node record must be an object")
    return cast("dict[str, Any]", node)


def read_run(image: PlanImage) -> tuple[dict[str, Any], dict[str, StoredNode]]:
    """The run's record and its nodes, decoded; `StorageError` if malformed."""
    try:
        record = json.loads(image.record)
        nodes: dict[str, StoredNode] = {}
        for row in image.nodes:
            node = fold(row.record)
            nodes[row.node_id] = StoredNode(
                state=row.state,
                attempt=row.attempt,
                output=node.get("output"),
                error=node.get("error"),
                record=node,
            )
    except (ValueError, TypeError, AttributeError, KeyError) as exc:
        raise StorageError(f"plan run `{image.run_id}`: unreadable durable record: {exc}") from exc
    if not isinstance(record, dict) or record.get("format") not in _FORMATS:
        raise StorageError(f"plan run `{image.run_id}`: unknown record format")
    return record, nodes


@final
class PlanJournal:
    """Writes one plan run's durable records; see the module docstring. Called from the run's
    event loop only (a cancellation from elsewhere goes through the store's `cancel_plan`).

    `end_attempt` and `transitions` buffer their changes (the journal's view, `state`, sees them
    at once); `flush`, `claim` and `claim_all` write everything buffered, in order, in one
    durable write. A store error (the run taken over, the file gone) propagates from those."""

    __slots__ = ("_holding", "_nodes", "_pending", "_run_id", "_store", "held")

    def __init__(self, store: Store, run_id: str, nodes: dict[str, dict[str, Any]]) -> None:
        if not is_plan_store(store):  # the run checked it: only a plan store has a journal
            raise InvalidArgument(f"plan run `{run_id}`: the store keeps no plan runs")
        self._store: PlanStore = store
        self._run_id = run_id
        self._nodes = nodes
        self._pending: list[PlanChange] = []
        #: The nodes that hold a resource or units now (claimed with them, not yet ended).
        self._holding: set[str] = set()
        #: The nodes the last `claim_all` did not claim because their resource was held.
        self.held: frozenset[str] = frozenset()

    @classmethod
    def begin(
        cls,
        store: Store,
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
            nodes[node_id] = _view(node)
            rows.append(
                PlanNodeRow(
                    node_id=node_id,
                    state=state,
                    attempt=None,
                    record=_dumps(cast("JSONValue", node)),
                )
            )
        journal = cls(store, run_id, nodes)
        journal._store.begin_plan(run_id, _dumps({"format": FORMAT, **record}), rows)
        return journal

    @classmethod
    def resumed(cls, store: Store, run_id: str, stored: Mapping[str, StoredNode]) -> PlanJournal:
        """The journal of a run taken over by recovery, from its stored nodes."""
        return cls(
            store,
            run_id,
            {node_id: _view(node.record) for node_id, node in stored.items()},
        )

    @property
    def pending(self) -> bool:
        """Whether changes are buffered, waiting for the next write."""
        return bool(self._pending)

    def state(self, node_id: str) -> str:
        """The node's state as last recorded (buffered changes included)."""
        return str(self._nodes[node_id]["state"])

    def number(self, node_id: str) -> int:
        """How many attempts the node has had (claims recorded)."""
        return int(self._nodes[node_id]["number"])

    def retries(self, node_id: str) -> int:
        """How many of the node's attempts failed and were retried."""
        return int(self._nodes[node_id]["retries"])

    def claim(self, node_id: str, attempt: str, number: int) -> bool:
        """Claim the node for `attempt` (compare-and-set), writing what is buffered with it;
        False if the node is not claimable."""
        return node_id not in self.claim_all(((node_id, attempt, number),)) and not self.held

    def claim_all(
        self,
        claims: Iterable[tuple[str, str, int]],
        events: Sequence[tuple[int, str]] = (),
        holds: Mapping[str, str] | None = None,
        units: Mapping[str, tuple[tuple[str, int, int], ...]] | None = None,
        rates: Mapping[str, tuple[str, float, int]] | None = None,
    ) -> frozenset[str]:
        """Claim each node for its attempt (`(node_id, attempt, number)`, compare-and-sets),
        writing what is buffered first (and audit `events`, as `flush` does), all in one
        durable write; the nodes not claimable. A node in `holds` takes that exclusive
        resource with its claim, a node in `units` those `(resource, units, capacity)`, and
        a node in `rates` a token of its tool's rate `(tool, per_second, burst)`; one whose
        resource another run holds, whose units would exceed a capacity counted over every
        run, or whose tool's bucket (shared by every run) is empty, is not claimed, and is in
        `held` (not in the result) after the write."""
        now = time.time()
        claimed: list[tuple[str, dict[str, Any]]] = []
        if holds:  # take resources in one order, so two runs' writes cannot deadlock
            claims = sorted(claims, key=lambda claim: holds.get(claim[0], ""))
        claims = list(claims)
        # A node released (READY) by this write and claimed in it (without a resource, units
        # or a rate token to take) is one statement: the claim appends both lines, and its
        # compare-and-set expects the state before both. A claim refused puts the release
        # back, to be written.
        released = self._released_now(
            {
                node_id
                for node_id, _, _ in claims
                if not (holds and node_id in holds)
                and not (units and units.get(node_id))
                and not (rates and node_id in rates)
            }
        )
        changes = [change for change in self._pending if change.node_id not in released]
        count = len(changes)
        self.held = frozenset()
        for node_id, attempt, number in claims:
            node = self._nodes[node_id]
            change: dict[str, Any] = {
                "attempt": attempt,
                "number": number,
                "unresolved": 0,
                "h": ["RUNNING", now, attempt],
            }
            if node["started_at"] is None:
                change["started_at"] = now
            expect = PlanExpect(node_id=node_id, states=_CLAIMABLE, attempt=node["attempt"])
            hold = holds.get(node_id) if holds else None
            taken = units.get(node_id, ()) if units else ()
            rate = rates.get(node_id) if rates else None
            changes.append(
                _change(
                    node_id,
                    "RUNNING",
                    attempt,
                    change,
                    expect,
                    hold=hold,
                    units=taken,
                    rate=rate,
                    before="" if node_id not in released else released[node_id].append,
                )
            )
            claimed.append((node_id, change))
        self._pending = []
        if not changes and not events:
            return frozenset()
        if events:
            made = self._store.write_plan(self._run_id, changes, events=events)
        else:
            made = self._store.write_plan(self._run_id, changes)
        refused = set()
        held = set()
        for (node_id, change), ok in zip(claimed, made[count:], strict=True):
            if ok:
                _apply(self._nodes[node_id], change)
                if (holds and node_id in holds) or (units and units.get(node_id)):
                    self._holding.add(node_id)
            elif ok is None:
                held.add(node_id)
            else:
                refused.add(node_id)
                if node_id in released:  # its release was not written with the claim
                    self._pending.append(released[node_id])
        if held:
            self.held = frozenset(held)
        return frozenset(refused)

    def _released_now(self, claimed: set[str]) -> dict[str, PlanChange]:
        """The buffered READY transitions of nodes in `claimed` that are their node's only
        buffered change and plain (no compare-and-set, nothing to release), by node."""
        if not claimed:
            return {}
        found: dict[str, PlanChange] = {}
        other: set[str] = set()
        for change in self._pending:
            node_id = change.node_id
            if node_id not in claimed:
                continue
            if (
                node_id in found
                or change.state != "READY"
                or change.expect is not None
                or change.release
            ):
                other.add(node_id)
            else:
                found[node_id] = change
        for node_id in other:
            found.pop(node_id, None)
        return found

    def end_attempt(
        self,
        node_id: str,
        attempt: str,
        state: str,
        *,
        inputs: JSONValue = None,
        output: JSONValue = None,
        error: str | None = None,
        costs: Iterable[tuple[str, Decimal]] = (),
        released: Iterable[tuple[str, str, int]] = (),
    ) -> None:
        """Buffer how `attempt` ended (`state`: SUCCEEDED, FAILED, TIMED_OUT, or READY for a
        retry), its resolved `inputs`, the `costs` it reported (added to the node's `cost`), with
        the nodes it `released` (`(node_id, state, unresolved)`); the write is a
        compare-and-set on the attempt holding the node."""
        node = self._nodes[node_id]
        now = time.time()
        change: dict[str, Any] = {
            "inputs": inputs,
            "output": output,
            "error": error,
            "finished_at": None if state == "READY" else now,
            "h": [state, now, attempt],
        }
        cost = add_costs(node["cost"], costs, retried=state == "READY")
        if cost is not node["cost"]:
            change["cost"] = cost
        if state == "READY":
            change["retries"] = node["retries"] + 1
        expect = PlanExpect(node_id=node_id, states=_RUNNING, attempt=attempt)
        release = node_id in self._holding
        self._holding.discard(node_id)
        self._pending.append(
            _change(node_id, state, node["attempt"], change, expect, release=release)
        )
        _apply(node, change)
        self._buffer(released, now)

    def regenerate(self, node_id: str, attempt: str, generation: int) -> None:
        """Buffer the node's new key `generation` (its earlier call was compensated), while
        `attempt` holds it; a resumed run derives the node's key for it."""
        node = self._nodes[node_id]
        expect = PlanExpect(node_id=node_id, states=_RUNNING, attempt=attempt)
        change = {"generation": generation}
        self._pending.append(_change(node_id, "RUNNING", node["attempt"], change, expect))

    def transitions(
        self, changes: Iterable[tuple[str, str, int]], status: str | None = None
    ) -> None:
        """Buffer other nodes' transitions (`(node_id, state, unresolved)`: released,
        skipped, cancelled); with the run's `status`, write them and it at once."""
        self._buffer(changes, time.time())
        if status is not None:
            self.flush(status)

    def flush(self, status: str | None = None, events: Sequence[tuple[int, str]] = ()) -> bool:
        """Write what is buffered (and the run's `status`, if given, and audit `events`,
        `(seq, JSON text)`) in one durable write; False if a compare-and-set among the changes
        did not hold (another runner holds that node; the rest was written)."""
        if not self._pending and status is None and not events:
            return True
        changes, self._pending = self._pending, []
        if events:
            made = self._store.write_plan(self._run_id, changes, status=status, events=events)
        else:
            made = self._store.write_plan(self._run_id, changes, status=status)
        return all(made)

    def cancel_reason(self) -> str | None:
        """The cancellation another thread or process recorded for the run, or None."""
        reason: str | None = self._store.plan_cancel_reason(self._run_id)
        return reason

    def _buffer(self, changes: Iterable[tuple[str, str, int]], now: float) -> None:
        for node_id, state, unresolved in changes:
            node = self._nodes[node_id]
            last = node["state"]
            if last in _ENDED or (last == state and node["unresolved"] == unresolved):
                continue  # an ended node stays ended (a resumed run replays it)
            change: dict[str, Any] = {"unresolved": unresolved, "h": [state, now, None]}
            if state in ("SKIPPED", "CANCELLED"):
                change["finished_at"] = now
            release = node_id in self._holding
            self._holding.discard(node_id)
            self._pending.append(
                _change(node_id, state, node["attempt"], change, None, release=release)
            )
            _apply(node, change)


def _change(
    node_id: str,
    state: str,
    attempt: str | None,
    change: Mapping[str, Any],
    expect: PlanExpect | None,
    *,
    hold: str | None = None,
    units: tuple[tuple[str, int, int], ...] = (),
    rate: tuple[str, float, int] | None = None,
    release: bool = False,
    before: str = "",
) -> PlanChange:
    return PlanChange(
        node_id=node_id,
        state=state,
        attempt=attempt,
        append=before + "\n" + _dumps(cast("JSONValue", change)),
        expect=expect,
        hold=hold,
        units=units,
        rate=rate,
        release=release,
    )


#: What the journal keeps of a node's record (its view): what it reads back to write the next
#: transitions. The rest (inputs, output, error, times, history) is written, not kept: a run of
#: thousands of nodes holds no second copy of its outputs and no history lists.
_VIEW: Final = {
    "unresolved": 0,
    "attempt": None,
    "number": 0,
    "retries": 0,
    "started_at": None,
    "cost": None,
}


def add_costs(
    cost: Mapping[str, str] | None, costs: Iterable[tuple[str, Decimal]], *, retried: bool
) -> Mapping[str, str] | None:
    """A node's stored `cost` (GBP by category, amounts as decimal text, exact) with one
    attempt's reported `costs` added; an attempt that another follows (`retried`) counts as
    `retry`, as the run's metrics count it. `cost` itself (the same object) if nothing was
    reported. An amount a damaged record cannot give as a number is left out."""
    total: dict[str, Decimal] = {}
    for category, text in (cost if isinstance(cost, dict) else {}).items():
        with contextlib.suppress(ArithmeticError, TypeError, ValueError):
            total[category] = Decimal(text)
    added = False
    for category, amount in costs:
        key = "retry" if retried else category
        total[key] = total.get(key, Decimal(0)) + amount
        added = True
    return {k: str(v) for k, v in total.items()} if added else cost


def _view(record: Mapping[str, Any]) -> dict[str, Any]:
    """The journal's view of a node's (folded) record: `_VIEW`'s fields (its defaults for a
    field a record lacks) and its last state."""
    view = {field: record.get(field, default) for field, default in _VIEW.items()}
    view["state"] = record["history"][-1][0]
    return view


def _apply(node: dict[str, Any], change: Mapping[str, Any]) -> None:
    """Fold one transition's `change` into the node's view, as `fold` does into its record."""
    for field, value in change.items():
        if field == "h":
            node["state"] = value[0]
        elif field in _VIEW:
            node[field] = value
