"""The audit trail: every decision as an event, watched live, read back after the end.

Run it with `python examples/audit_trail.py`. An engine on a SQLite file runs a transaction
whose shipping step fails once: a hook prints each event as it happens (the charge, its
refund, the rewind, the retry, the commit). Once the transaction has ended, a second engine
on the same file reads its trail back from the store and exports it as JSON lines, as
`agenttx audit DB TX` would. With `pip install 'agenttx[otel]'`, the same events also become
OpenTelemetry spans: the script prints the spans it recorded in memory.
"""

from __future__ import annotations

import io
import json
import tempfile
from pathlib import Path

import agenttx
from agenttx.stores import SQLiteStore

ATTEMPTS: list[str] = []


@agenttx.compensation(name="payments.refund")
def refund(payload: agenttx.JSONValue) -> None:
    """Give the money back (idempotent: refunding a refunded charge changes nothing)."""
    assert isinstance(payload, dict)


@agenttx.tool(name="payments.charge", compensate=refund)
def charge(order: str, amount: int) -> dict[str, object]:
    """Charge the customer for an order."""
    return {"charge": f"ch-{order}", "amount": amount}


@agenttx.tool(name="shipping.book")
def book(order: str, charge: str) -> dict[str, object]:
    """Book the parcel; the carrier refuses the first try."""
    ATTEMPTS.append(order)
    if len(ATTEMPTS) == 1:
        raise agenttx.ToolError(f"charge {charge} is not settled yet", key="charge")
    return {"parcel": f"p-{order}"}


def show(event: agenttx.Event) -> None:
    """A hook: one line per event, as it happens."""
    where = f" step {event.step}" if event.step is not None else ""
    print(f"  {event.seq:>2} {event.kind.value}{where} {dict(event.data)}")


def telemetry() -> tuple[list[agenttx.EventHook], object | None]:
    """An OtelHook on an in-memory exporter, if OpenTelemetry is installed."""
    try:
        from opentelemetry.sdk.trace import TracerProvider  # noqa: PLC0415
        from opentelemetry.sdk.trace.export import SimpleSpanProcessor  # noqa: PLC0415
        from opentelemetry.sdk.trace.export.in_memory_span_exporter import (  # noqa: PLC0415
            InMemorySpanExporter,
        )

        from agenttx.integrations.otel import OtelHook  # noqa: PLC0415
    except ImportError:
        return [], None
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return [OtelHook(tracer_provider=provider)], exporter


def main() -> None:
    """Run the transaction with the hooks, then read its trail back from the file."""
    database = Path(tempfile.mkdtemp(prefix="agenttx-audit-"), "agent.db")
    tools = [refund, charge, book]
    otel, exporter = telemetry()
    print("events as they happen:")
    with SQLiteStore(database) as store:
        engine = agenttx.Engine(tools=tools, store=store, hooks=[show, *otel])
        tx = engine.begin(agent_id="shop")
        tx.call("payments.charge", {"order": "o-1", "amount": 40})
        failed = tx.call("shipping.book", {"order": "o-1", "charge": "${steps.1.charge}"})
        print(f"  -> the agent is told: {failed.hint.text if failed.hint else ''}")
        tx.call("payments.charge", {"order": "o-1", "amount": 40})
        tx.call("shipping.book", {"order": "o-1", "charge": "${steps.1.charge}"})
        tx.commit()
        engine.close()

    print(f"\nread back from {database.name} by another engine, as JSON lines:")
    with SQLiteStore(database, readonly=True) as store:
        reader = agenttx.Engine(tools=tools, store=store)
        trail = io.StringIO()
        count = reader.export_audit(trail, tx.id)
    for line in trail.getvalue().splitlines():
        entry = json.loads(line)
        print(f"  {entry['seq']:>2} {entry['kind']:<16} {entry['at']}")
    print(f"{count} events; `agenttx audit {database} {tx.id}` prints the same")

    if exporter is not None:
        spans = exporter.get_finished_spans()  # type: ignore[attr-defined]
        print("\nOpenTelemetry spans:")
        for span in spans:
            status = span.attributes.get("agenttx.status", span.attributes.get("agenttx.outcome"))
            print(f"  {span.name:<30} {status}")


if __name__ == "__main__":
    main()
