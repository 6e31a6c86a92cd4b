"""The plan runs a runner's `propose_plan` calls start, and their answers.

A runner answers a `propose_plan` call with a plan run that goes on beside its turn
(`start_plan`): `handle` never blocks on a person. While a node of the run waits for an
approval or a review, the call waits with its turn (`Runner.waiting` shows the request);
`resume` answers it once the run has ended.

The run's id is derived from the transaction, the turn (its first step) and the call id
(`plan_run_id`), and the runner records it in its conversation before the run starts. A
restored runner answers the call from that run (resumed by `engine.recover("resume")`, or
ended) and never starts another: a run whose id the store holds is not started again.

Contracts: `PlanCalls.start` starts a run once per id (in this process, and on a store that
keeps plan runs, ever); `check` only reads (the run, or the store) and never blocks.
"""

from __future__ import annotations

import hashlib
from typing import TYPE_CHECKING, final

from .._approvals import requests_for
from .._errors import InvalidArgument, StorageError, TransactionNotFound
from .._plans import PLAN_TOOL, is_plan_store, read_run, start_plan
from .._transaction import plan_setting
from ._common import Outcome, plan_answer, plan_options
from ._conversation import Wait, WaitKind

if TYPE_CHECKING:
    from .._json import JSONValue
    from .._plans import Plan, PlanRun
    from .._transaction import Transaction
    from ..stores import PlanImage
    from ._common import ModelCall, Payload

__all__ = ["PlanCalls", "plan_run_id"]


def plan_run_id(tx_id: str, first_step: int, call_id: str) -> str:
    """The id of the plan run a `propose_plan` call starts: the same for the same transaction,
    turn (its first step) and call id, so a restored runner finds the run again."""
    digest = hashlib.sha256(f"{tx_id}\x00{first_step}\x00{call_id}".encode()).hexdigest()
    return f"{PLAN_TOOL}-{digest[:40]}"


@final
class PlanCalls:
    """The plan runs a runner started in this process, by run id; see the module docstring.
    Not thread-safe, like the runners."""

    __slots__ = ("_runs", "_tx")

    def __init__(self, tx: Transaction) -> None:
        self._tx = tx
        self._runs: dict[str, PlanRun] = {}

    def _stored(self, run_id: str) -> PlanImage | None:
        store = plan_setting(self._tx)[1]
        if not is_plan_store(store):
            return None
        try:
            return store.read_plan(run_id)
        except TransactionNotFound:
            return None

    def start(self, plan: Plan, run_id: str) -> None:
        """Start run `run_id` of `plan` in the background, unless it was started already."""
        if run_id in self._runs or self._stored(run_id) is not None:
            return
        try:
            self._runs[run_id] = start_plan(plan, run_id=run_id, **plan_options(self._tx))
        except InvalidArgument:
            if self._stored(run_id) is None:  # not the store's "exists already": a real error
                raise

    def check(self, call: ModelCall, run_id: str) -> Outcome | Wait | None:
        """The call's answer once its run has ended, the request it waits on while a node
        waits for a person, else None (the run goes on)."""
        run = self._runs.get(run_id)
        if run is not None:
            if run.done:
                return plan_answer(self._tx, call, run.wait())
            return _stored_wait(self._tx, call, run_id)
        image = self._stored(run_id)
        if image is None:
            return _lost(self._tx, call, run_id)
        if image.status != "RUNNING":
            return _stored_answer(self._tx, call, image)
        return _stored_wait(self._tx, call, run_id)


def _stored_wait(tx: Transaction, call: ModelCall, run_id: str) -> Wait | None:
    """The request a node of run `run_id` waits on, as the store has it (None: none)."""
    for row in requests_for(tx.store).of_scope(run_id):
        if row.state == "pending" and row.kind in ("approval", "review"):
            kind: WaitKind = "review" if row.kind == "review" else "approval"
            return Wait(call_id=call.call_id, kind=kind, request_id=row.id)
    return None


def _stored_answer(tx: Transaction, call: ModelCall, image: PlanImage) -> Outcome:
    """The answer to a plan whose run ended, read from the store (a run recovery resumed)."""
    try:
        record, stored = read_run(image)
        tools = {n["id"]: n["tool"] for n in record["plan"]["nodes"]}
    except (StorageError, KeyError, TypeError) as exc:
        return _lost(tx, call, image.run_id, str(exc))
    nodes: dict[str, JSONValue] = {}
    for node_id, node in stored.items():
        entry: dict[str, JSONValue] = {"tool": tools.get(node_id), "state": node.state}
        if node.state == "SUCCEEDED":
            entry["output"] = node.output
        elif node.error is not None:
            entry["error"] = node.error
        nodes[node_id] = entry
    ok = image.status == "SUCCEEDED"
    payload: Payload = {"ok": ok, "step": None, "plan": image.status, "run_id": image.run_id}
    payload["nodes"] = nodes
    payload["next_step"] = tx.next_step_id
    payload["instruction"] = (
        "The plan ran: each node's output is above. Copy what you need into later calls "
        "(references to a plan's nodes do not work outside it)."
        if ok
        else "The plan failed: nothing it wrote was kept and its completed nodes were "
        "compensated. Fix what the errors name and propose a corrected plan, or go on step "
        "by step."
    )
    return Outcome(call_id=call.call_id, payload=payload, is_error=not ok)


def _lost(tx: Transaction, call: ModelCall, run_id: str, why: str = "") -> Outcome:
    """The answer when the call's run can be found neither here nor in the store."""
    detail = f" ({why})" if why else ""
    payload: Payload = {
        "ok": False,
        "step": None,
        "plan": "UNKNOWN",
        "run_id": run_id,
        "error": (
            f"Hint: The plan's run `{run_id}` cannot be read{detail}; what it did is unknown "
            "here (`agenttx plans` shows it)."
        ),
        "next_step": tx.next_step_id,
        "instruction": f"Check what the run did before calling {PLAN_TOOL} again.",
    }
    return Outcome(call_id=call.call_id, payload=payload, is_error=True)
