"""agenttx.integrations.otel: spans and metrics from audit events, read back from the SDK."""

from __future__ import annotations

import datetime as dt
import importlib
import sys

import pytest
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode

import agenttx
from agenttx.integrations.otel import OtelHook


@pytest.fixture
def telemetry():
    """An OtelHook on private providers, with the in-memory span exporter and metric reader."""
    exporter = InMemorySpanExporter()
    tracer_provider = TracerProvider()
    tracer_provider.add_span_processor(SimpleSpanProcessor(exporter))
    reader = InMemoryMetricReader()
    meter_provider = MeterProvider(metric_readers=[reader])
    hook = OtelHook(tracer_provider=tracer_provider, meter_provider=meter_provider)
    yield hook, exporter, reader
    tracer_provider.shutdown()
    meter_provider.shutdown()


def _counts(reader: InMemoryMetricReader) -> dict[tuple[str, tuple[tuple[str, object], ...]], int]:
    """Each counter's value, by name and attributes."""
    found: dict[tuple[str, tuple[tuple[str, object], ...]], int] = {}
    data = reader.get_metrics_data()
    if data is None:
        return found
    for resource in data.resource_metrics:
        for scope in resource.scope_metrics:
            for metric in scope.metrics:
                for point in metric.data.data_points:
                    key = (metric.name, tuple(sorted(point.attributes.items())))
                    found[key] = int(point.value)
    return found


def _tools(log: list[str]) -> list[object]:
    @agenttx.compensation(name="refund")
    def refund(payload: dict) -> None:
        log.append("refund")

    @agenttx.tool(name="charge", compensate=refund)
    def charge(amount: int) -> dict:
        return {"charged": amount}

    @agenttx.tool(name="ship")
    def ship(to: str) -> dict:
        raise agenttx.ToolError("address unknown", key="to", transient=False)

    return [refund, charge, ship]


def test_a_span_per_step_with_genai_attributes_under_the_transaction_span(telemetry):
    """Each step is an execute_tool span (tool name, call id, status, attempt, duration),
    a child of the transaction's span, which the commit ends with status OK."""
    hook, exporter, _ = telemetry
    tx = agenttx.Transaction(tools=_tools([]), hooks=[hook])
    tx.call("charge", {"amount": 5}, call_id="call_9")
    tx.commit()
    spans = {span.name: span for span in exporter.get_finished_spans()}
    assert set(spans) == {"execute_tool charge", "agenttx.transaction"}
    step, root = spans["execute_tool charge"], spans["agenttx.transaction"]
    assert step.attributes["gen_ai.operation.name"] == "execute_tool"
    assert step.attributes["gen_ai.tool.name"] == "charge"
    assert step.attributes["gen_ai.tool.call.id"] == "call_9"
    assert step.attributes["agenttx.status"] == "SUCCESS"
    assert step.attributes["agenttx.attempt"] == 1
    assert step.attributes["agenttx.rollback.strategy"] == "none"
    assert step.attributes["agenttx.duration_ms"] >= 0
    assert step.status.status_code is StatusCode.OK
    assert step.parent is not None
    assert step.parent.span_id == root.context.span_id
    assert root.attributes["agenttx.tx_id"] == tx.id
    assert root.attributes["agenttx.outcome"] == "committed"
    assert root.status.status_code is StatusCode.OK
    assert step.start_time <= step.end_time


def test_a_failed_step_is_an_error_span_and_counts_rollbacks_and_compensations(telemetry):
    """A failure gives an ERROR span with its hint and category; the abort and the
    compensation are counted."""
    hook, exporter, reader = telemetry
    log: list[str] = []
    tx = agenttx.Transaction(
        tools=_tools(log),
        hooks=[hook],
        policy=agenttx.RollbackPolicy(max_local_depth=0, max_global_resets=0, mistake_retries=0),
    )
    tx.call("charge", {"amount": 5})
    tx.call("ship", {"to": "nowhere"})
    assert log == ["refund"]
    spans = {span.name: span for span in exporter.get_finished_spans()}
    failed = spans["execute_tool ship"]
    assert failed.status.status_code is StatusCode.ERROR
    assert "address unknown" in (failed.status.description or "")
    assert failed.attributes["agenttx.status"] == "FAILED"
    assert failed.attributes["agenttx.rollback.strategy"] == "abort"
    assert isinstance(failed.attributes["error.type"], str)
    assert spans["agenttx.transaction"].status.status_code is StatusCode.ERROR
    counts = _counts(reader)
    assert counts[("agenttx.rollbacks", (("agenttx.rollback.kind", "abort"),))] == 1
    completed = (("agenttx.compensation.outcome", "completed"), ("agenttx.scope", "transaction"))
    assert counts[("agenttx.compensations", completed)] == 1


def test_a_step_that_fails_before_its_tool_runs_still_has_a_span(telemetry):
    """An unknown tool fails the step without a dispatch: an ERROR span of no length."""
    hook, exporter, _ = telemetry
    tx = agenttx.Transaction(tools=_tools([]), hooks=[hook])
    tx.call("no_such_tool", {})
    failed = [s for s in exporter.get_finished_spans() if s.name.startswith("execute_tool")]
    assert len(failed) == 1
    assert failed[0].status.status_code is StatusCode.ERROR
    assert failed[0].start_time == failed[0].end_time


def test_plan_nodes_are_spans_under_the_run_span(telemetry):
    """Each node attempt of a plan run is an execute_tool span under the run's span."""
    hook, exporter, _ = telemetry

    @agenttx.tool
    def add(n: int) -> dict:
        return {"n": n + 1}

    plan = agenttx.Plan(
        nodes=[
            agenttx.Node("a", tool="add", inputs={"n": 1}),
            agenttx.Node("b", tool="add", inputs={"n": "${a.n}"}),
        ]
    )
    result = agenttx.run_plan(plan, tools=[add], initial={}, hooks=[hook])
    assert result.succeeded
    spans = exporter.get_finished_spans()
    run = next(span for span in spans if span.name == "agenttx.plan")
    nodes = sorted(
        (span for span in spans if span.name == "execute_tool add"),
        key=lambda span: span.attributes["agenttx.node"],
    )
    assert [span.attributes["agenttx.node"] for span in nodes] == ["a", "b"]
    assert all(span.parent.span_id == run.context.span_id for span in nodes)
    assert all(
        span.attributes["agenttx.attempt"] == f"{span.attributes['agenttx.node']}#1"
        for span in nodes
    )
    assert run.attributes["agenttx.run_id"] == result.run_id
    assert run.attributes["agenttx.status"] == "SUCCEEDED"


def test_approval_events_are_counted(telemetry):
    """Approval requests and decisions increment agenttx.approvals by event."""
    hook, _, reader = telemetry
    now = dt.datetime.now(dt.timezone.utc)
    for seq, kind in enumerate((agenttx.EventKind.APPROVAL_REQUESTED, agenttx.EventKind.APPROVED)):
        hook.on_event(
            agenttx.Event(kind=kind, at=now, scope="transaction", scope_id="t", seq=seq, step=1)
        )
    counts = _counts(reader)
    assert counts[("agenttx.approvals", (("agenttx.approval.event", "requested"),))] == 1
    assert counts[("agenttx.approvals", (("agenttx.approval.event", "approved"),))] == 1


def test_the_module_names_the_extra_when_opentelemetry_is_missing(monkeypatch):
    """Without OpenTelemetry, importing the module raises ImportError naming agenttx[otel]."""
    monkeypatch.setitem(sys.modules, "opentelemetry", None)
    monkeypatch.delitem(sys.modules, "agenttx.integrations.otel", raising=False)
    with pytest.raises(ImportError, match=r"agenttx\[otel\]"):
        importlib.import_module("agenttx.integrations.otel")
