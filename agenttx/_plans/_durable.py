"""The durable half of a plan run: its journal, the durable log of its state transaction, the
claims of its rounds, and the end of that transaction (see `_execution`).

`DurableRun` is held by the run (`PlanExecution._log`). On a store that keeps plan runs it
writes the run's record (`PlanJournal`, buffered and written at the barriers the run sets),
claims each round's nodes with their exclusive resources, units and rate tokens in one write,
and keeps the durable log (`TxLog`) of the run's state transaction: undo records written
ahead, a node's writes and staged effects written before its completion. A write that finds
the run lost (taken over by a recoverer, or gone) stops all writing and tells the run, which
cancels its own copy (`on_lost`). On other stores it holds nothing and writes nothing.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any, Final, cast

from .._errors import StorageError, TransactionNotFound
from .._limits import DEFAULT_ISOLATION
from .._rollback import RollbackPolicy
from .._saga import deliver_outbox, dispatch_effects
from .._settings import Settings
from .._txlog import LiveStep, TxLog, history_text, read_image
from ..stores import is_durable
from ._journal import PlanJournal, StoredNode, is_plan_store
from ._records import SerializedStore
from ._results import CompensationStatus

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable, Mapping, Sequence

    from .._json import JSONValue
    from .._saga import Backoff, Dispatcher
    from .._tools import Outcome, StagedEffect, UndoRecord
    from ..stores import DurableStore, Store
    from ._model import Node
    from ._records import Attempt, NodeRecord
    from ._results import CompensationOutcome, PlanStatus
    from ._scheduler import Scheduler, Start

__all__ = ["ENDED_STORED", "DurableRun"]

#: Stored states a resumed run takes as they are (the node is not run again).
ENDED_STORED: Final = frozenset({"SUCCEEDED", "FAILED", "TIMED_OUT"})
#: The backoff step a node waiting for another run's exclusive resource stops growing at.
_HOLD_WAITS: Final = 3
#: The compensation order of undo records a resumed run restored: before any of its own
#: (whose times are `time.monotonic()` readings, never negative), in node order.
_RESTORED_AT: Final = -1e9


class DurableRun:
    """A run's durable records (see the module docstring); from the run's loop only."""

    __slots__ = (
        "_id",
        "_on_lost",
        "_store",
        "begun",
        "durable",
        "hold_waits",
        "journal",
        "log_undo",
        "lost",
        "restored",
        "resumed",
        "serialized",
        "txlog",
        "unclaimed",
    )

    def __init__(
        self,
        run_id: str,
        store: Store,
        restored: dict[str, StoredNode] | None,
        on_lost: Callable[[Exception], None],
    ) -> None:
        self._id = run_id
        self._store = store
        self._on_lost = on_lost
        #: The run's store, with the nodes' state calls serialized.
        self.serialized = SerializedStore(store)
        #: The durable record of the run, on a store that keeps plan runs (`open_journal`).
        self.journal: PlanJournal | None = None
        self.lost = False  # the store lost the run (taken over): write and undo nothing
        self.durable = is_plan_store(store)
        self.restored: dict[str, StoredNode] = dict(restored or {})
        self.resumed = restored is not None
        #: The durable log of the run's state transaction (undo records, staged effects), on a
        #: durable store that keeps plan runs; `log_undo` writes an undo record ahead.
        self.txlog: TxLog | None = None
        self.log_undo: Callable[[UndoRecord], object] | None = None
        self.begun = False  # whether the run's state transaction was opened (by this run)
        #: The nodes of the current round whose claim did not hold (another runner has them).
        self.unclaimed: frozenset[str] = frozenset()
        #: How many times each node found its exclusive resource held by another run.
        self.hold_waits: dict[str, int] = {}

    def persist(self, write: Callable[..., object], *args: Any, **kwargs: Any) -> object:
        """Run a journal write; if the store lost the run (taken over by a recoverer, or gone),
        stop writing and tell the run (`on_lost`): another runner holds it now."""
        if self.journal is None:
            return None
        try:
            return write(*args, **kwargs)
        except (StorageError, TransactionNotFound) as exc:
            self.journal = None
            self.lost = True
            self._on_lost(exc)
            return None

    def open_journal(
        self, record: Mapping[str, JSONValue], states: Iterable[tuple[str, str, int]]
    ) -> None:
        """Write the run's durable `record` with its nodes' `states` (or take over the resumed
        run's record); once."""
        if self.journal is not None or self.lost:
            return
        if self.resumed:
            journal = PlanJournal.resumed(self._store, self._id, self.restored)
            # Claims of attempts that died with their process are released: those nodes are
            # claimed again (same idempotency key) when the scheduler starts them.
            journal.transitions(
                (node_id, "READY", 0)
                for node_id, node in self.restored.items()
                if node.state == "RUNNING"
            )
            journal.flush()
            self.journal = journal
            return
        self.journal = PlanJournal.begin(self._store, self._id, record, states)

    def claim(  # noqa: PLR0917  (the round and what its claims take)
        self,
        starts: tuple[Start, ...],
        records: Mapping[str, NodeRecord],
        rates: Mapping[str, tuple[str, float, int]],
        events: Callable[[], list[tuple[int, str]]],
        scheduler: Scheduler,
        backoff: Backoff,
    ) -> None:
        """Claim the round's `starts` (those a resumed run does not replay) with what the
        journal has buffered and the audit `events()` not yet written, in one durable write,
        before any of their tools runs; put back those whose resource, units or rate token
        another run holds (`scheduler.postpone`, after a `backoff`)."""
        journal = self.journal
        assert journal is not None
        restored = self.restored
        claims = [
            (start.node, start.attempt, start.number)
            for start in starts
            if start.node not in restored or restored[start.node].state not in ENDED_STORED
        ]
        holds = {start.node: hold for start in starts if (hold := records[start.node].exclusive)}
        units = {start.node: taken for start in starts if (taken := records[start.node].units)}
        by_tool = (
            {
                start.node: rate
                for start in starts
                if (rate := rates.get(records[start.node].tool)) is not None
            }
            if rates
            else None
        )
        refused = (
            self.persist(
                journal.claim_all, claims, events(), holds or None, units or None, by_tool or None
            )
            if claims
            else None
        )
        self.unclaimed = refused if isinstance(refused, frozenset) else frozenset()
        if (holds or units or by_tool) and self.journal is not None and self.journal.held:
            self._wait_for_holds(starts, self.journal.held, records, scheduler, backoff)

    def _wait_for_holds(
        self,
        starts: tuple[Start, ...],
        held: frozenset[str],
        records: Mapping[str, NodeRecord],
        scheduler: Scheduler,
        backoff: Backoff,
    ) -> None:
        """Put back the `starts` whose exclusive resource another run holds (or whose units
        would exceed a capacity counted over every run, or whose tool's rate bucket, shared by
        every run, is empty): they stay queued (never started) and are claimed again after a
        backoff."""
        now = time.monotonic()
        for start in starts:
            if start.node in held:
                waits = self.hold_waits[start.node] = self.hold_waits.get(start.node, 0) + 1
                retry_at = now + backoff.delay(min(waits, _HOLD_WAITS))
                record = records[start.node]
                if record.exclusive is not None:
                    label = f"hold:{record.exclusive}"
                elif record.units:
                    label = "shared:" + "+".join(name for name, _, _ in record.units)
                else:  # its tool's bucket, shared by every run, was empty
                    label = f"rate:{record.tool}"
                scheduler.postpone(start, retry_at, label)

    def open_state(self, nodes: Sequence[Node], records: Mapping[str, NodeRecord]) -> None:
        """Open the run's state transaction (id: the run id). On a durable store that keeps
        plan runs it has a durable log: a resumed run claims the dead runner's, keeping its
        durable state writes, staged effects and undo records (which go back to their nodes,
        `nodes` in plan order), or begins a new one if it has ended or never began."""
        store = self._store
        run_id = self._id
        if not (self.durable and is_durable(store)):
            store.begin(run_id)
            self.begun = True
            return
        if self.resumed:
            try:
                image = store.claim(run_id, store.owner(run_id))
            except TransactionNotFound:
                image = None  # never begun, or ended (committed or discarded) before the crash
            else:
                if image is None:
                    raise StorageError(
                        f"the state transaction of plan run `{run_id}` is held by a live store"
                    )
            if image is not None:
                restored = read_image(image)
                self.begun = True
                self.txlog = TxLog(
                    cast("DurableStore", self.serialized), run_id, record=restored.record
                )
                self.log_undo = self.txlog.undo
                _restore_undos(restored.undos, nodes, records)
                return
        self.txlog = TxLog.begin(
            cast("DurableStore", self.serialized),
            run_id,
            isolation=DEFAULT_ISOLATION,
            agent_id=f"plan run {run_id}",
            policy=RollbackPolicy(),
            settings=Settings().to_record(),
        )
        self.begun = True
        self.log_undo = self.txlog.undo

    def write_state(
        self,
        record: NodeRecord,
        attempt: Attempt,
        outcome: Outcome,
        kind: str | None,
        undos: list[UndoRecord],
    ) -> None:
        """Before a node's completion is recorded: its node's `compensate=` undo (in the place
        of its tool's), then its state writes and staged effects in one atomic write."""
        txlog = self.txlog
        assert txlog is not None
        if kind is not None and undos:
            txlog.undo(undos[-1])
        if outcome.effects:
            txlog.step(
                record.step_id,
                LiveStep(
                    tool_name=record.tool,
                    arguments=attempt.arguments,
                    output=outcome.output,
                    raw_context="",
                    dependencies=(),
                ),
                outcome.effects,
            )
        else:
            self.serialized.flush(self._id)

    def end_state(self, status: PlanStatus, compensations: tuple[CompensationOutcome, ...]) -> None:
        """End the state transaction of a run that did not succeed: discarded (its staged
        effects with it: nothing is published), or, on a durable log with compensations that
        failed, ended keeping their undo records, so that recovery retries them. (With
        `compensate_on="never"` nothing is to be compensated: the records are dropped.)"""
        txlog = self.txlog
        left = any(c.status is CompensationStatus.FAILED for c in compensations)
        if txlog is not None and left and not self.lost:
            txlog.end(status.value, history_text(status.value, [], (), ()), keep_undos=True)
        else:
            self._store.discard(self._id)

    def deliver(
        self, effects: Sequence[StagedEffect], dispatcher: Dispatcher | None
    ) -> tuple[int, tuple[str, ...]]:
        """Deliver the committed effects: on a durable log, from the outbox the commit put
        them in (those a crashed runner committed included); else `effects` directly."""
        if self.txlog is None:
            return dispatch_effects(tuple(effects), dispatcher)
        if dispatcher is None:
            return 0, ()  # they wait in the outbox for `Engine.dispatch_pending`
        return deliver_outbox(cast("DurableStore", self._store), dispatcher, tx_id=self._id)


def _restore_undos(
    undos: tuple[UndoRecord, ...], nodes: Sequence[Node], records: Mapping[str, NodeRecord]
) -> None:
    """Give the undo records of the dead runner back to their nodes, to be compensated if
    the resumed run fails (they count as older than any of this run's)."""
    for undo in undos:
        if 1 <= undo.step_id <= len(nodes):
            node_id = nodes[undo.step_id - 1].id
            records[node_id].undos += ((_RESTORED_AT + undo.step_id, undo),)
