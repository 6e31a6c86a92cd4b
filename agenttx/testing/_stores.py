"""`check_store`: a conformance suite for any `agenttx.stores.Store` implementation.

A hypothesis state machine drives a fresh store through random interleavings of several
transactions and compares every observable with a small model after every step. The model is
written differently from `MemoryStore` on purpose: its snapshots are whole copies of the
overlay, not journal positions, so an error in the journal cannot hide in both.

Hypothesis turns random subsets of a machine's rules off in each example ("swarm testing"), so
the calls that must meet for a bug to show (writes, rewinds, commits of colliding
transactions) are all made by one rule, `work`; the other two add outside commits and misuse.
"""

from __future__ import annotations

from functools import partial
from typing import TYPE_CHECKING, Any, Final, Protocol, cast, runtime_checkable

import attrs
from hypothesis import Phase, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule, run_state_machine_as_test

from .._errors import (
    InvalidArgument,
    ReadConflict,
    StorageError,
    TransactionNotFound,
    WriteConflict,
)
from .._limits import DEFAULT_ISOLATION, ISOLATION_LEVELS, Isolation

if TYPE_CHECKING:
    from collections.abc import Callable

    from ..stores import Store

__all__ = ["check_store"]

#: Few transactions and keys, so that transactions collide often.
TX_IDS: Final = ("t1", "t2", "t3")
#: Includes a non-ASCII key; code-point order puts it after the ASCII ones.
KEYS: Final = ("a", "b", "ключ")
#: JSON texts; `"null"` is a value, not an absence.
VALUES: Final = ("1", '"x"', "null", '{"k":["é",2.5]}', '""')
STEPS: Final = (0, 1, 2, 3)
#: The isolation levels `begin` is called with; `None`: the argument is left out (the default).
ISOLATIONS: Final[tuple[Isolation | None, ...]] = (None, *ISOLATION_LEVELS)
#: The transaction of `commit_elsewhere`, which begins, writes and commits in one rule.
RIVAL_TX_ID: Final = "rival"


@runtime_checkable
class _Closable(Protocol):
    """A store with resources to give back when a test is done with it (`close()`, once)."""

    def close(self) -> None: ...


BAD_TX_IDS: Final = ("", "t 1", "t/1", "é", "x" * 129, "t1\n")
BAD_KEYS: Final = ("", "k" * 1025, "é" * 513, "\ud800")
BAD_VALUES: Final = ("\udfff", '"\ud800"')
BAD_STEPS: Final = (-1, 2**32, True)
BAD_ISOLATIONS: Final = ("", "snapshot", "SERIALIZABLE", "read committed", None, 1)

MISUSES: Final = (
    "begin an open transaction",
    "use a transaction that is not open",
    "bad tx_id",
    "bad key",
    "bad value",
    "bad step",
    "bad isolation",
)

_MISSING: Final = object()

_Entry = tuple[int, "str | None"]


@attrs.frozen
class _Op:
    """One call on a transaction, shown as it reads in a failing example: `put('a', '1')`."""

    name: str  # get, put, delete, snapshot, restore, commit, discard; or rival (see _RIVALS)
    key: str = ""
    value: str = ""
    step: int = 0

    @property
    def arguments(self) -> tuple[str | int, ...]:
        if self.name == "put":
            return (self.key, self.value)
        if self.name in {"get", "delete", "rival"}:
            return (self.key,)
        if self.name in {"snapshot", "restore"}:
            return (self.step,)
        return ()

    def __repr__(self) -> str:
        return f"{self.name}({', '.join(map(repr, self.arguments))})"

    def call(self, tx_id: str) -> str:
        """The store call this op makes, as text: `put('t1', 'a', '1')`."""
        return f"{self.name}({', '.join(map(repr, (tx_id, *self.arguments)))})"


# Built with `map`, not `builds`, so that failing examples show the ops as `put('a', '1')`.
_PUTS = st.tuples(st.sampled_from(KEYS), st.sampled_from(VALUES)).map(
    lambda kv: _Op("put", key=kv[0], value=kv[1])
)
_DELETES = st.sampled_from(KEYS).map(lambda key: _Op("delete", key=key))
_GETS = st.sampled_from(KEYS).map(lambda key: _Op("get", key=key))
_REWINDS = st.tuples(st.sampled_from(("snapshot", "restore")), st.sampled_from(STEPS)).map(
    lambda call: _Op(call[0], step=call[1])
)
_ENDS = st.sampled_from(("commit", "discard")).map(_Op)
# Another transaction commits a write of the key in between this one's calls: a read or write
# of it before, and a write and commit after, make a conflict (a lost update, if unchecked).
_RIVALS = st.sampled_from(KEYS).map(lambda key: _Op("rival", key=key))
_WRITES = st.lists(st.one_of(_PUTS, _DELETES), min_size=1, max_size=4)
_WORK = st.lists(
    st.one_of(
        _PUTS,
        _DELETES,
        _GETS,
        _RIVALS,
        _REWINDS,
        _ENDS,
    ),
    min_size=1,
    max_size=8,
)


@attrs.define
class _ModelTx:
    isolation: str = DEFAULT_ISOLATION
    overlay: dict[str, _Entry] = attrs.Factory(dict)
    #: key -> the version of its first read from committed state; never forgotten.
    reads: dict[str, int] = attrs.Factory(dict)
    mutations: int = 0
    #: step -> (mutations so far, a copy of the overlay), in the order taken.
    snapshots: dict[int, tuple[int, dict[str, _Entry]]] = attrs.Factory(lambda: {0: (0, {})})


@attrs.define
class _Model:
    """The contract of `Store`, transcribed as plainly as possible."""

    committed: dict[str, tuple[int, str]] = attrs.Factory(dict)
    commits: int = 0
    txs: dict[str, _ModelTx] = attrs.Factory(dict)

    def version(self, key: str) -> int:
        return self.committed[key][0] if key in self.committed else 0

    def get(self, tx_id: str, key: str) -> str | None:
        tx = self.txs[tx_id]
        if key in tx.overlay:
            return tx.overlay[key][1]
        if tx.isolation != "read_committed":
            tx.reads.setdefault(key, self.version(key))
        return self.committed[key][1] if key in self.committed else None

    def get_changes_nothing(self, tx_id: str, key: str) -> bool:
        """Whether `get` would leave the transaction as it is (records no read)."""
        tx = self.txs[tx_id]
        return tx.isolation == "read_committed" or key in tx.overlay or key in tx.reads

    def write(self, tx_id: str, key: str, value: str | None) -> None:
        tx = self.txs[tx_id]
        if key in tx.overlay:
            base = tx.overlay[key][0]
        elif key in tx.reads:
            base = tx.reads[key]
        else:
            base = self.version(key)
        tx.overlay[key] = (base, value)
        tx.mutations += 1

    def snapshot(self, tx_id: str, step: int) -> None:
        tx = self.txs[tx_id]
        tx.snapshots.pop(step, None)
        tx.snapshots[step] = (tx.mutations, dict(tx.overlay))

    def restore(self, tx_id: str, step: int) -> int:
        tx = self.txs[tx_id]
        mutations, overlay = tx.snapshots[step]
        reverted = tx.mutations - mutations
        tx.overlay = dict(overlay)
        tx.mutations = mutations
        tx.snapshots = {
            s: snap for s, snap in tx.snapshots.items() if s <= step and snap[0] <= mutations
        }
        return reverted

    def conflicts(self, tx_id: str) -> tuple[type[WriteConflict], list[str]]:
        """The error a commit raises, and the keys in conflict (none: it commits)."""
        tx = self.txs[tx_id]
        written = sorted(key for key, (base, _) in tx.overlay.items() if self.version(key) != base)
        if written or tx.isolation != "serializable":
            return WriteConflict, written
        return ReadConflict, sorted(k for k, read in tx.reads.items() if self.version(k) != read)

    def commit(self, tx_id: str) -> int:
        tx = self.txs.pop(tx_id)
        self.commits += 1
        for key, (_, value) in tx.overlay.items():
            if value is None:
                self.committed.pop(key, None)
            else:
                self.committed[key] = (self.commits, value)
        return len(tx.overlay)


class _StoreMachine(RuleBasedStateMachine):
    """Drives one fresh store and the model with the same calls; every observable must agree."""

    def __init__(self, factory: Callable[[], Store]) -> None:
        super().__init__()
        self.store = factory()
        self.model = _Model()

    def teardown(self) -> None:
        if isinstance(self.store, _Closable):  # a store that holds resources gives them back
            self.store.close()

    # ------------------------------------------------------------ rules

    @rule(tx_id=st.sampled_from(TX_IDS), ops=_WORK, isolation=st.sampled_from(ISOLATIONS))
    def work(self, tx_id: str, ops: list[_Op], isolation: Isolation | None) -> None:
        """Calls on one transaction; it is begun first (at `isolation`) whenever it is not open."""
        for op in ops:
            if tx_id not in self.model.txs:
                if isolation is None:
                    self._returns(f"begin({tx_id!r})", None, self.store.begin, tx_id)
                else:
                    call = f"begin({tx_id!r}, isolation={isolation!r})"
                    self._returns(call, None, partial(self.store.begin, isolation=isolation), tx_id)
                self.model.txs[tx_id] = _ModelTx(isolation=isolation or DEFAULT_ISOLATION)
            self._apply(tx_id, op)

    @rule(writes=_WRITES, data=st.data())
    def commit_elsewhere(self, writes: list[_Op], data: st.DataObject) -> None:
        """Another transaction writes and commits at once, so that open ones may now conflict."""
        # Often also write a key that an open transaction has written or read: a conflict to be.
        targets = sorted(
            {key for tx in self.model.txs.values() for key in (*tx.overlay, *tx.reads)}
        )
        target = data.draw(st.sampled_from([None, *targets]), label="also write")
        if target is not None:
            writes = [*writes, _Op("put", key=target, value=VALUES[0])]
        self._rival(writes)

    def _rival(self, writes: list[_Op]) -> None:
        """Transaction `RIVAL_TX_ID` begins, makes `writes` and commits."""
        self._returns(f"begin({RIVAL_TX_ID!r})", None, self.store.begin, RIVAL_TX_ID)
        self.model.txs[RIVAL_TX_ID] = _ModelTx()
        for op in [*writes, _Op("commit")]:
            self._apply(RIVAL_TX_ID, op)

    def _apply(self, tx_id: str, op: _Op) -> None:
        store, model = self.store, self.model
        call = op.call(tx_id)
        if op.name == "rival":
            self._rival([_Op("put", key=op.key, value=VALUES[0])])
        elif op.name == "get":
            self._returns(call, model.get(tx_id, op.key), store.get, tx_id, op.key)
        elif op.name == "put":
            self._returns(call, None, store.put, tx_id, op.key, op.value)
            model.write(tx_id, op.key, op.value)
        elif op.name == "delete":
            self._returns(call, None, store.delete, tx_id, op.key)
            model.write(tx_id, op.key, None)
        elif op.name == "snapshot":
            self._returns(call, None, store.snapshot, tx_id, op.step)
            model.snapshot(tx_id, op.step)
        elif op.name == "restore":
            if op.step in model.txs[tx_id].snapshots:
                self._returns(call, model.restore(tx_id, op.step), store.restore, tx_id, op.step)
            else:
                call = f"{call} of a missing snapshot"
                self._raises(call, StorageError, store.restore, tx_id, op.step)
        elif op.name == "commit":
            error, conflicts = model.conflicts(tx_id)
            if conflicts:
                # The transaction stays open and unchanged, and nothing is published: the
                # invariant checks both after this step.
                call = f"{call} with conflicting keys {conflicts}"
                self._raises(call, error, store.commit, tx_id, exact=True, key=conflicts[0])
            else:
                self._returns(call, model.commit(tx_id), store.commit, tx_id)
        else:
            self._returns(call, None, store.discard, tx_id)
            del model.txs[tx_id]

    @rule(call=st.sampled_from(MISUSES), tx_id=st.sampled_from(TX_IDS), data=st.data())
    def misuse(self, call: str, tx_id: str, data: st.DataObject) -> None:
        """A call that must raise, and change nothing: the invariant checks that afterwards."""
        store = self.store
        if call == "begin an open transaction":
            if tx_id in self.model.txs:
                call = f"begin({tx_id!r}) of an open transaction"
                self._raises(call, InvalidArgument, store.begin, tx_id)
        elif call == "use a transaction that is not open":
            if tx_id not in self.model.txs:
                self._use_not_open(tx_id, data)
        elif call == "bad tx_id":
            bad_id = data.draw(st.sampled_from(BAD_TX_IDS), label="bad tx_id")
            self._raises(f"begin({bad_id!r})", InvalidArgument, store.begin, bad_id)
        # Arguments are checked before the transaction is looked up: whether `tx_id` is open
        # or not, the error is InvalidArgument.
        elif call == "bad value":
            value = data.draw(st.sampled_from(BAD_VALUES), label="bad value")
            call = f"put({tx_id!r}, {KEYS[0]!r}, {value!r})"
            self._raises(call, InvalidArgument, store.put, tx_id, KEYS[0], value)
        elif call == "bad isolation":
            bad = data.draw(st.sampled_from(BAD_ISOLATIONS), label="bad isolation")
            begin = partial(store.begin, isolation=cast("Any", bad))
            self._raises(f"begin({tx_id!r}, isolation={bad!r})", InvalidArgument, begin, tx_id)
        elif call == "bad step":
            step = data.draw(st.sampled_from(BAD_STEPS), label="bad step")
            for name, rewind in (("snapshot", store.snapshot), ("restore", store.restore)):
                self._raises(f"{name}({tx_id!r}, {step!r})", InvalidArgument, rewind, tx_id, step)
        else:
            key = data.draw(st.sampled_from(BAD_KEYS), label="bad key")
            calls: tuple[tuple[str, Callable[..., object], tuple[object, ...]], ...] = (
                ("get", store.get, (tx_id, key)),
                ("put", store.put, (tx_id, key, VALUES[0])),
                ("delete", store.delete, (tx_id, key)),
                ("read_committed", store.read_committed, (key,)),
                ("committed_version", store.committed_version, (key,)),
            )
            for name, method, arguments in calls:
                self._raises(f"{name}{arguments!r}", InvalidArgument, method, *arguments)

    def _use_not_open(self, tx_id: str, data: st.DataObject) -> None:
        key = data.draw(st.sampled_from(KEYS), label="key")
        store, expected = self.store, {"tx_id": cast("Any", tx_id)}
        calls: tuple[tuple[str, Callable[..., object], tuple[object, ...]], ...] = (
            ("get", store.get, (tx_id, key)),
            ("put", store.put, (tx_id, key, VALUES[0])),
            ("delete", store.delete, (tx_id, key)),
            ("snapshot", store.snapshot, (tx_id, 0)),
            ("restore", store.restore, (tx_id, 0)),
            ("commit", store.commit, (tx_id,)),
            ("written_keys", store.written_keys, (tx_id,)),
        )
        for name, method, arguments in calls:
            call = f"{name}{arguments!r} of a transaction that is not open"
            self._raises(call, TransactionNotFound, method, *arguments, **expected)
        self._returns(
            f"discard({tx_id!r}) of a transaction that is not open", None, store.discard, tx_id
        )

    # ------------------------------------------------------------ the observables

    @invariant()
    def observables_agree(self) -> None:
        store, model = self.store, self.model
        for tx_id in TX_IDS:
            is_open = tx_id in model.txs
            self._returns(f"is_open({tx_id!r})", is_open, store.is_open, tx_id)
            if not is_open:
                self._raises(
                    f"get({tx_id!r}, {KEYS[0]!r})",
                    TransactionNotFound,
                    store.get,
                    tx_id,
                    KEYS[0],
                    tx_id=tx_id,
                )
                self._raises(
                    f"written_keys({tx_id!r})",
                    TransactionNotFound,
                    store.written_keys,
                    tx_id,
                    tx_id=tx_id,
                )
                continue
            for step in STEPS:
                if step not in model.txs[tx_id].snapshots:
                    call = f"restore({tx_id!r}, {step}) of a missing snapshot"
                    self._raises(call, StorageError, store.restore, tx_id, step)
            written = tuple(sorted(model.txs[tx_id].overlay))
            self._returns(f"written_keys({tx_id!r})", written, store.written_keys, tx_id)
            for key in KEYS:
                # A read that would record a read version is left to the `work` rule: made
                # here after every step, it would fix every key's base at once.
                if model.get_changes_nothing(tx_id, key):
                    self._returns(
                        f"get({tx_id!r}, {key!r})", model.get(tx_id, key), store.get, tx_id, key
                    )
        for key in KEYS:
            committed = model.committed.get(key)
            value = None if committed is None else committed[1]
            self._returns(f"read_committed({key!r})", value, store.read_committed, key)
            self._returns(
                f"committed_version({key!r})", model.version(key), store.committed_version, key
            )

    # ------------------------------------------------------------ helpers

    @staticmethod
    def _returns(
        call: str, expected: object, method: Callable[..., object], *arguments: object
    ) -> None:
        try:
            result = method(*arguments)
        except Exception as exc:
            raise AssertionError(f"store.{call} raised {exc!r}, expected {expected!r}") from exc
        if type(result) is not type(expected) or result != expected:
            raise AssertionError(f"store.{call} returned {result!r}, expected {expected!r}")

    @staticmethod
    def _raises(
        call: str,
        error: type[Exception],
        method: Callable[..., object],
        *arguments: object,
        exact: bool = False,
        **attributes: Any,
    ) -> None:
        try:
            result = method(*arguments)
        except error as exc:
            if exact and type(exc) is not error:
                raise AssertionError(
                    f"store.{call} raised {exc!r}, expected {error.__name__}"
                ) from exc
            for name, expected in attributes.items():
                got = getattr(exc, name, _MISSING)
                if got != expected:
                    raise AssertionError(
                        f"store.{call} raised {error.__name__} with {name}={got!r}, "
                        f"expected {expected!r}"
                    ) from exc
            return
        except Exception as exc:
            raise AssertionError(f"store.{call} raised {exc!r}, expected {error.__name__}") from exc
        raise AssertionError(f"store.{call} returned {result!r}, expected {error.__name__}")


def check_store(factory: Callable[[], Store], *, max_examples: int = 50) -> None:
    """Check a `Store` implementation against the protocol's contract; raise `AssertionError`.

    Runs a hypothesis state machine: each example calls `factory()` for a fresh, empty store and
    drives three transactions over three keys with random `begin` (at each isolation level, and
    with the default), `get`, `put`, `delete`, `snapshot`, `restore`, `commit` and `discard`
    calls (conflicts included, lost updates and read conflicts among them), plus malformed
    arguments. After every step, every observable is compared with a model of the contract:
    `get` for each open transaction and key (where the read records no read version, which
    would change the transaction), `read_committed`, `committed_version`, `written_keys`,
    `is_open`, the values returned, and the exceptions raised (their types, `ReadConflict`
    told from `WriteConflict`; the key a conflict names, the smallest conflicting one; the id a
    `TransactionNotFound` carries). A conflicting commit must change nothing, and malformed
    arguments must be refused before the transaction is looked up.

    On a mismatch, hypothesis shrinks the run and the `AssertionError` describes the first
    wrong call; the minimal sequence of calls is printed above it. If the store has a `close()`
    method, it is called at the end of each example. The factory must return an empty store
    every time (for SQLite, a new database file). The run uses the current hypothesis settings
    profile, with `max_examples` examples, no deadline and one bug reported. It is not a
    concurrency test: calls are made from one thread.
    """
    if type(max_examples) is not int or max_examples < 1:
        raise InvalidArgument(f"max_examples must be a positive integer, got {max_examples!r}")

    class StoreConformance(_StoreMachine):
        def __init__(self) -> None:
            super().__init__(factory)

    run_state_machine_as_test(
        StoreConformance,
        settings=settings(
            max_examples=max_examples,
            deadline=None,
            report_multiple_bugs=False,
            # The explain phase re-runs a shrunk failure hundreds of times to report which
            # lines only failing runs reach: it doubled the time to a report, for little help.
            phases=[phase for phase in settings().phases if phase is not Phase.explain],
        ),
    )
