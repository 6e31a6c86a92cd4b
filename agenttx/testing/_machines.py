"""A hypothesis state machine that checks a transaction's guarantees against a tiny model."""

from __future__ import annotations

import itertools
from typing import TYPE_CHECKING, Any

from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from .._errors import ToolError
from .._results import StepResult, StepStatus, TxStatus
from .._rollback import RollbackStrategy
from .._tools import StagedEffect, ToolContext, compensation, tool
from .._transaction import Transaction
from ..stores import MemoryStore

if TYPE_CHECKING:
    from .._json import JSONValue
    from .._rollback import RollbackPolicy
    from ..stores import Store

__all__ = ["TransactionMachine"]

KEYS = ("a", "b", "c")
FAILURES = {
    "plain": "something went wrong",
    "transient": "upstream returned HTTP 503",
    "keyed": "KeyError: 'value'",
}


class TransactionMachine(RuleBasedStateMachine):
    """Random execute / fail / rollback / commit sequences, checked after every step.

    The machine runs probe tools: each call writes `probe/{key}`, registers a durable undo and
    stages an effect, then succeeds or fails as told. After every rule it checks that:

    * the transaction reads, for every key, the last write of the steps it still holds (or
      the committed value);
    * every undo of a rewound or aborted call ran exactly once, and none of a live or
      committed call ever ran;
    * effects are dispatched only by a commit, exactly those of the committed steps, in order;
    * `next_step_id`, the live steps and the dependency graph agree with the model;
    * a failed step's `voided_steps` are exactly the live steps its rewind dropped, and a
      mistake (an unknown tool, malformed JSON) that is resent drops none.

    Subclass it to check your own configuration, overriding `make_store` (for example to
    check a store of your own) or `policy`, and run it with `TransactionMachine.TestCase`.
    """

    policy: RollbackPolicy | None = None

    def __init__(self) -> None:
        super().__init__()
        self.store = self.make_store()
        self.uids = itertools.count(1)
        self.undone: dict[int, int] = {}  # uid -> times its undo ran
        self.ran: set[int] = set()  # every uid whose tool ran
        self.dropped: set[int] = set()  # uids rewound or aborted: each undone exactly once
        self.dispatched: list[StagedEffect] = []
        self.committed: dict[str, JSONValue] = {}
        self.expected_dispatch: list[JSONValue] = []
        self.tools = self._probe_tools()
        self._begin()

    def make_store(self) -> Store:
        """The store transactions run on; override to check another one."""
        return MemoryStore()

    def _probe_tools(self) -> list[Any]:
        @compensation(name="probe.undo")
        def undo(payload: dict[str, Any]) -> None:
            uid = payload["uid"]
            self.undone[uid] = self.undone.get(uid, 0) + 1

        @tool(name="probe")
        def probe(
            ctx: ToolContext, uid: int, key: str, value: int, fail: str = ""
        ) -> dict[str, Any]:
            ctx.register_undo("probe.undo", {"uid": uid})
            ctx.state.put(f"probe/{key}", value)
            ctx.stage_effect("probe", {"uid": uid})
            if fail:
                raise ToolError(FAILURES[fail])
            return {"uid": uid, "key": key, "value": value}

        return [undo, probe]

    def _begin(self) -> None:
        self.tx = Transaction(
            tools=self.tools,
            store=self.store,
            policy=self.policy,
            dispatcher=self.dispatched.append,
        )
        # uid, key, value of each live step, in step order
        self.live: list[tuple[int, str, int]] = []

    def _drop_from(self, step_id: int) -> None:
        """The model's rewind: steps >= step_id are no longer live."""
        self.dropped.update(uid for uid, _, _ in self.live[step_id - 1 :])
        del self.live[step_id - 1 :]

    # ------------------------------------------------------------------ rules

    @precondition(lambda self: self.tx.status is TxStatus.ACTIVE)
    @rule(key=st.sampled_from(KEYS), value=st.integers(0, 9))
    def step_succeeds(self, key: str, value: int) -> None:
        """A probe call that succeeds becomes a live step."""
        uid = next(self.uids)
        result = self.tx.execute_step(
            self.tx.next_step_id, "probe", {"uid": uid, "key": key, "value": value}
        )
        assert result.status is StepStatus.SUCCESS, result
        self.ran.add(uid)
        self.live.append((uid, key, value))

    @precondition(lambda self: self.tx.status is TxStatus.ACTIVE)
    @rule(key=st.sampled_from(KEYS), failure=st.sampled_from(sorted(FAILURES)))
    def step_fails(self, key: str, failure: str) -> None:
        """A probe call that fails rewinds to the step the result names, or aborts."""
        uid = next(self.uids)
        step_id = self.tx.next_step_id
        result = self.tx.execute_step(
            step_id, "probe", {"uid": uid, "key": key, "value": -1, "fail": failure}
        )
        self.ran.add(uid)
        self.dropped.add(uid)
        self._rewound(result, step_id)

    @precondition(lambda self: self.tx.status is TxStatus.ACTIVE)
    @rule(malformed_json=st.booleans())
    def step_is_a_mistake(self, malformed_json: bool) -> None:
        """An unknown tool or malformed JSON: no tool runs; it is resent, or rewinds."""
        step_id = self.tx.next_step_id
        if malformed_json:
            result = self.tx.execute_step(step_id, "probe", '{"uid": ')
        else:
            result = self.tx.execute_step(step_id, "no_such_probe", {})
        if result.strategy is RollbackStrategy.RESEND:
            assert (result.next_step_id, result.voided_steps) == (step_id, ()), result
        self._rewound(result, step_id)

    def _rewound(self, result: StepResult, step_id: int) -> None:
        """The model follows the rewind (or abort) of failed step `step_id`."""
        assert result.status is not StepStatus.SUCCESS
        if result.status is StepStatus.FAILED:
            assert self.tx.status is TxStatus.FAILED
            first = 1
        else:
            assert 1 <= result.next_step_id <= step_id, result
            first = result.next_step_id
        assert result.voided_steps == tuple(range(first, step_id)), result
        self._drop_from(first)

    @precondition(lambda self: self.tx.status is TxStatus.ACTIVE and self.tx.next_step_id > 1)
    @rule(data=st.data())
    def rollback_to(self, data: st.DataObject) -> None:
        """A manual rollback drops the steps from `to_step` on."""
        target = data.draw(st.integers(1, self.tx.next_step_id - 1), label="to_step")
        result = self.tx.rollback(to_step=target)
        assert (result.aborted, result.next_step_id) == (False, target)
        self._drop_from(target)

    @precondition(lambda self: self.tx.status is TxStatus.ACTIVE)
    @rule()
    def abort(self) -> None:
        """A full rollback drops every step and ends the transaction."""
        assert self.tx.rollback().aborted
        self._drop_from(1)

    @precondition(lambda self: self.tx.status is TxStatus.ACTIVE)
    @rule()
    def commit(self) -> None:
        """A commit publishes the live steps' writes and dispatches their effects."""
        result = self.tx.commit()
        assert result.steps_committed == len(self.live)
        for uid, key, value in self.live:
            self.committed[f"probe/{key}"] = value
            self.expected_dispatch.append({"uid": uid})
        self.live.clear()

    @precondition(lambda self: self.tx.status.terminal)
    @rule()
    def next_transaction(self) -> None:
        """After a transaction ends, the next one starts on the same store."""
        self._begin()

    # ------------------------------------------------------------------ invariants

    @invariant()
    def state_is_the_live_steps_writes(self) -> None:
        """Every key reads as the live steps' last write, else the committed value."""
        expected = dict(self.committed)
        if self.tx.status is TxStatus.ACTIVE:
            for _, key, value in self.live:
                expected[f"probe/{key}"] = value
        for key in KEYS:
            name = f"probe/{key}"
            assert self.tx.read(name) == expected.get(name), (name, self.tx.read(name))

    @invariant()
    def every_undo_of_a_dropped_call_ran_once(self) -> None:
        """Each undo of a rewound or aborted call ran once; no other undo ran."""
        for uid in self.ran:
            expected = 1 if uid in self.dropped else 0
            assert self.undone.get(uid, 0) == expected, (uid, self.undone.get(uid))

    @invariant()
    def only_commits_dispatch(self) -> None:
        """Dispatched effects are exactly those of committed steps, in order."""
        assert [effect.payload for effect in self.dispatched] == self.expected_dispatch

    @invariant()
    def steps_and_graph_match_the_model(self) -> None:
        """next_step_id, the live steps and the graph agree with the model."""
        if self.tx.status is not TxStatus.ACTIVE:
            return
        assert self.tx.next_step_id == len(self.live) + 1
        assert [step.output["uid"] for step in self.tx.steps] == [  # type: ignore[index,call-overload]
            uid for uid, _, _ in self.live
        ]
        assert self.tx.graph.steps() == tuple(range(1, len(self.live) + 1))
