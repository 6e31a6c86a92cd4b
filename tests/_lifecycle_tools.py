"""A fake payment provider and the guarded charging tool of tests/test_lifecycle.py.

The provider deduplicates charges by idempotency key and refunds a key at most once, so its
net charges are what a transaction's compensations left standing. The tool's behaviour for
each attempt is taken from a queue its test fills (`ok` when the queue is empty); every run,
refund and status check is written, in order, to one trace that the tests read back.
"""

from __future__ import annotations

import threading
from typing import Any

import agenttx
from agenttx import CheckResult

#: What one attempt of the charging tool does.
BEHAVIOURS = ("ok", "fail", "transient", "late", "hang")

#: Amounts above this need a person's approval.
LIMIT = 50


class Provider:
    """Charges by idempotency key (a key charges once), refunds by key (once)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.charged: dict[str, int] = {}  # key -> amount
        self.refunded: set[str] = set()
        self.trace: list[tuple[Any, ...]] = []
        self.in_flight: list[str] = []  # keys of tool calls running now (one entry a call)
        self.plan: list[str] = []  # behaviours of the next attempts
        self.gates: list[threading.Event] = []  # one per `hang` attempt, set to release it
        self.unknown = threading.Event()  # set when a call's outcome was declared unknown

    def hook(self, event: agenttx.Event) -> None:
        """An audit hook: a `late` call returns once its deadline was declared passed."""
        if event.kind is agenttx.EventKind.OUTCOME_UNKNOWN:
            self.unknown.set()

    def net(self) -> int:
        """Charges minus refunds."""
        with self.lock:
            return sum(a for k, a in self.charged.items() if k not in self.refunded)

    def charge(self, key: str, amount: int) -> None:
        with self.lock:
            self.charged.setdefault(key, amount)

    def refund(self, key: str, step: int) -> None:
        with self.lock:
            self.trace.append(("refund", step, key))
            if key in self.charged:
                self.refunded.add(key)

    def note(self, *entry: Any) -> None:
        with self.lock:
            self.trace.append(entry)

    def runs(self) -> list[tuple[Any, ...]]:
        """The tool runs so far: `("run", step, key, amount, behaviour)`."""
        with self.lock:
            return [entry for entry in self.trace if entry[0] == "run"]

    def release_all(self) -> None:
        for gate in self.gates:
            gate.set()


def charging_tools(provider: Provider) -> list[Any]:
    """The refund compensation and the guarded `charge` tool, on `provider`."""

    @agenttx.compensation(name="refund")
    def refund(payload: dict[str, Any]) -> None:
        output = payload["output"]
        provider.refund(output["key"], output["step"])

    def status(arguments: dict[str, Any], key: str) -> CheckResult:
        with provider.lock:
            running = key in provider.in_flight
            provider.trace.append(("check", key, running))
            amount = provider.charged.get(key)
            step = next((e[1] for e in provider.trace if e[0] == "run" and e[2] == key), 0)
        if amount is None:
            return CheckResult.not_done()
        return CheckResult.done({"key": key, "amount": amount, "step": step})

    @agenttx.tool(
        name="charge",
        compensate=refund,
        needs_approval=lambda arguments: arguments["amount"] > LIMIT,
        check=status,
        on_unknown="review",
    )
    def charge(ctx: agenttx.ToolContext, amount: int, memo: str) -> dict[str, Any]:
        """Charge the customer.

        Args:
            amount: pence
            memo: a note for the statement
        """
        del memo
        key = ctx.idempotency_key
        with provider.lock:
            behaviour = provider.plan.pop(0) if provider.plan else "ok"
            provider.trace.append(("run", ctx.step_id, key, amount, behaviour))
            provider.in_flight.append(key)
        try:
            if behaviour == "fail":
                raise agenttx.ToolError("card declined", transient=False)
            if behaviour == "transient":
                raise agenttx.ToolError("provider busy, try again", transient=True)
            if behaviour == "late":
                provider.unknown.clear()
            provider.charge(key, amount)
            if behaviour == "late":  # returns once the step declared its outcome unknown
                provider.unknown.wait(30)
            elif behaviour == "hang":  # runs until the test releases it
                gate = threading.Event()
                with provider.lock:
                    provider.gates.append(gate)
                gate.wait(30)
            return {"key": key, "amount": amount, "step": ctx.step_id}
        finally:
            with provider.lock:
                provider.in_flight.remove(key)

    return [refund, charge]
