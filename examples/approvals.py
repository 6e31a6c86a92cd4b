"""People in the loop: approve the exact call, and never guess whether a charge happened.

Run it with `python examples/approvals.py`. A charge tool asks for a person's approval above
100.00 GBP and declares a status check that asks the (fake) payment provider by idempotency key.
The script shows a small charge running at once, a large one waiting for approval, approved
from a second engine on the same SQLite file (as from another process), then run once; a charge
that times out while the provider still works on it, settled by the status check instead of a
second charge; and a charge whose check cannot tell, which waits for human review. It ends
with the transaction's audit trail.
"""

from __future__ import annotations

import tempfile
import threading
import time
from pathlib import Path

import agenttx
from agenttx.stores import SQLiteStore


class Provider:
    """A fake payment provider: it deduplicates charges by idempotency key."""

    def __init__(self) -> None:
        self.charges: dict[str, int] = {}
        self.slow = threading.Event()  # set: the provider answers after the step's timeout
        self.down = False  # True: its status endpoint fails
        self.lock = threading.Lock()

    def charge(self, key: str, amount: int) -> dict[str, agenttx.JSONValue]:
        with self.lock:
            self.charges.setdefault(key, amount)
        if self.slow.is_set():
            time.sleep(0.6)  # past the step timeout; it returns within the grace
        return {"charge_id": "ch_" + key[:10], "amount": amount}

    def status(self, key: str) -> int | None:
        if self.down:
            raise ConnectionError("status endpoint unavailable")
        with self.lock:
            return self.charges.get(key)


provider = Provider()


def charge_status(arguments: dict, idempotency_key: str) -> agenttx.CheckResult:
    """Did the charge with this key happen? Ask the provider."""
    del arguments  # the key is enough: the provider keeps charges by it
    amount = provider.status(idempotency_key)
    if amount is None:
        return agenttx.CheckResult.not_done()
    return agenttx.CheckResult.done({"charge_id": "ch_" + idempotency_key[:10], "amount": amount})


@agenttx.tool(
    name="payments.charge",
    needs_approval=lambda arguments: arguments["amount"] > 10_000,  # pence: above 100.00 GBP
    check=charge_status,
)
def charge(ctx: agenttx.ToolContext, amount: int, card: str) -> dict:
    """Charge a card.

    Args:
        amount: the amount in pence
        card: the card's token
    """
    del card  # a real provider would take it
    return provider.charge(ctx.idempotency_key, amount)


root = Path(tempfile.mkdtemp(prefix="agenttx-approvals-"))
config = agenttx.EngineConfig(idle_timeout=None, step_timeout=0.3)
agent_store = SQLiteStore(root / "agent.db")
agent = agenttx.Engine(tools=[charge], store=agent_store, config=config)
tx = agent.begin(agent_id="billing-agent")

small = tx.call("payments.charge", {"amount": 2_500, "card": "tok_visa"})
print("small charge:", small.status.name, small.output)

big = {"amount": 45_000, "card": "tok_visa"}
waiting = tx.call("payments.charge", big)
print("large charge:", waiting.status.name)
print("  the model is told:", waiting.for_model()["instruction"])

# A person approves from elsewhere: another engine on the same file (another process, say).
with SQLiteStore(root / "agent.db") as desk_store:
    desk = agenttx.Engine(store=desk_store)
    for request in desk.pending_approvals():
        print(f"  pending {request.tool} {request.arguments} (digest {request.digest[:12]}...)")
        approval = desk.approve(request.id, actor="alice@finance", expires_in=600, note="PO 1187")
        print(f"  approved by {approval.actor}, until {approval.expires_at:%H:%M:%S %Z}")

ran = tx.call("payments.charge", big)
print("large charge, sent again:", ran.status.name, ran.output)
again = tx.call("payments.charge", big)
print("the same call once more needs a new approval:", again.status.name)
tx.reject(again.approval.id, actor="alice@finance", reason="already charged once")
rejected = tx.call("payments.charge", big)
print("after the rejection:", rejected.hint.text)

# The provider is slow: the step times out while the charge is under way.
provider.slow.set()
settled = tx.call("payments.charge", {"amount": 1_200, "card": "tok_amex"})
provider.slow.clear()
print("timed-out charge, settled by the status check:", settled.status.name, settled.output)

# Slow again, and the status endpoint is down: nobody knows, so a person reviews it.
provider.slow.set()
provider.down = True
unknown = tx.call("payments.charge", {"amount": 800, "card": "tok_mc"})
provider.slow.clear()
provider.down = False
review = unknown.review
print("timed-out charge, check failing:", unknown.status.name)
for error in review.errors:
    print("  evidence:", error)
agent.resolve_review(review.id, outcome="done", output={"charge_id": "manual"}, actor="bob@ops")
resolved = tx.call("payments.charge", {"amount": 800, "card": "tok_mc"})
print("after the review:", resolved.status.name, resolved.output)

committed = tx.commit()
print(f"committed {committed.steps_committed} steps; the provider charged", len(provider.charges))
assert len(provider.charges) == 4  # never twice for one call

print("audit trail:")
for event in tx.audit():
    actor = f" by {event.actor}" if event.actor else ""
    print(f"  {event.seq:>2} step {event.step} {event.kind.value}{actor}")
agent_store.close()
