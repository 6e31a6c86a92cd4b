"""OpenTelemetry spans and metrics from agenttx's audit events.

`OtelHook` is an `agenttx.EventHook`: pass it as `hooks=[OtelHook()]` to a `Transaction`, an
`Engine`, `run_plan`, `arun_plan` or `start_plan`. It turns the events into

- a span per transaction (`agenttx.transaction`) or plan run (`agenttx.plan`), ended by the
  commit or abort (or the run's `finished` event);
- under it, a span per step attempt or node attempt, named `execute_tool {tool}`, following
  the GenAI semantic conventions where they apply (`gen_ai.operation.name = "execute_tool"`,
  `gen_ai.tool.name`, `gen_ai.tool.call.id` when the call has an id), with
  `agenttx.status` (SUCCESS, FAILED, RETRIED, CANCELLED), `agenttx.rollback.strategy`,
  `agenttx.attempt` and `agenttx.duration_ms`; a failed attempt has the span status ERROR, its
  hint as the description and its hint category as `error.type`;
- counters: `agenttx.rollbacks` (rewinds and aborts, by `agenttx.rollback.kind`),
  `agenttx.compensations` (by `agenttx.compensation.outcome`: completed or failed) and
  `agenttx.approvals` (by `agenttx.approval.event`: requested, approved, rejected, consumed,
  expired).

Span times are the events' times. `tracer_provider` and `meter_provider` default to the global
ones (`opentelemetry.trace.set_tracer_provider`, `opentelemetry.metrics.set_meter_provider`).
The hook is thread-safe and holds no lock while it calls OpenTelemetry. Spans of a transaction
or run that never ends stay open (and held) until the hook is dropped.

Needs the `agenttx[otel]` extra; `import agenttx` never imports this module or the SDK.
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Any, Final, final

try:
    from opentelemetry import metrics, trace
    from opentelemetry.trace import SpanKind, Status, StatusCode
except ImportError as exc:
    raise ImportError(
        "agenttx.integrations.otel needs OpenTelemetry: pip install 'agenttx[otel]'"
    ) from exc

from .._events import Event, EventKind
from .._version import __version__

if TYPE_CHECKING:
    from opentelemetry.metrics import MeterProvider
    from opentelemetry.trace import Span, TracerProvider

__all__ = ["OtelHook"]

_NS: Final = 1_000_000_000

#: Events that end an attempt's span, with the status they give it.
_ENDS: Final = {
    EventKind.STEP_COMPLETED: "SUCCESS",
    EventKind.STEP_FAILED: "FAILED",
    EventKind.COMPLETED: "SUCCESS",
    EventKind.FAILED: "FAILED",
    EventKind.RETRIED: "RETRIED",
    EventKind.CANCELLED: "CANCELLED",
}
#: Events that end a transaction's span, and a plan run's.
_SCOPE_ENDS: Final = {
    "transaction": frozenset({EventKind.COMMITTED, EventKind.ABORTED}),
    "plan": frozenset({EventKind.FINISHED}),
}
_APPROVALS: Final = {
    EventKind.APPROVAL_REQUESTED: "requested",
    EventKind.APPROVED: "approved",
    EventKind.REJECTED: "rejected",
    EventKind.APPROVAL_CONSUMED: "consumed",
    EventKind.APPROVAL_EXPIRED: "expired",
}


def _ns(event: Event) -> int:
    return int(event.at.timestamp() * _NS)


@final
class OtelHook:
    """An `EventHook` that records spans and metrics with OpenTelemetry (see the module)."""

    __slots__ = (
        "_approvals",
        "_attempts",
        "_compensations",
        "_lock",
        "_open",
        "_rollbacks",
        "_scopes",
        "_tracer",
    )

    def __init__(
        self,
        tracer_provider: TracerProvider | None = None,
        meter_provider: MeterProvider | None = None,
    ) -> None:
        self._tracer = trace.get_tracer("agenttx", __version__, tracer_provider=tracer_provider)
        meter = metrics.get_meter("agenttx", __version__, meter_provider=meter_provider)
        self._rollbacks = meter.create_counter(
            "agenttx.rollbacks", unit="{rollback}", description="Rewinds and aborts."
        )
        self._compensations = meter.create_counter(
            "agenttx.compensations", unit="{compensation}", description="Compensations run."
        )
        self._approvals = meter.create_counter(
            "agenttx.approvals", unit="{event}", description="Approval requests and decisions."
        )
        self._lock = threading.Lock()
        #: The span of each transaction or plan run, by (scope, scope id).
        self._scopes: dict[tuple[str, str], Span] = {}
        #: The span of each attempt under way, with its start (ns), by (scope id, step or node).
        self._open: dict[tuple[str, str], tuple[Span, int, int]] = {}
        #: How many attempts each step or node has had, by (scope id, step or node).
        self._attempts: dict[tuple[str, str], int] = {}

    def on_event(self, event: Event) -> None:
        """Turn one event into span changes and counter increments."""
        kind = event.kind
        if kind is EventKind.STEP_DISPATCHED or kind is EventKind.DISPATCHED:
            self._start(event)
        elif kind in _ENDS and (event.step is not None or event.node is not None):
            self._end(event, _ENDS[kind])
        elif kind is EventKind.STEP_REWOUND or kind is EventKind.ABORTED:
            self._rollbacks.add(
                1,
                {"agenttx.rollback.kind": "rewind" if kind is EventKind.STEP_REWOUND else "abort"},
            )
        elif kind is EventKind.COMPENSATED or kind is EventKind.COMPENSATION_FAILED:
            outcome = "completed" if kind is EventKind.COMPENSATED else "failed"
            self._compensations.add(
                1, {"agenttx.compensation.outcome": outcome, "agenttx.scope": event.scope}
            )
        elif kind in _APPROVALS:
            self._approvals.add(1, {"agenttx.approval.event": _APPROVALS[kind]})
        if kind in _SCOPE_ENDS[event.scope]:
            self._end_scope(event)

    # -- spans ----------------------------------------------------------------------------

    def _key(self, event: Event) -> tuple[str, str]:
        return event.scope_id, str(event.step if event.node is None else event.node)

    def _scope_span(self, event: Event) -> Span:
        key = (event.scope, event.scope_id)
        with self._lock:
            span = self._scopes.get(key)
        if span is not None:
            return span
        attributes: dict[str, Any] = {"agenttx.scope": event.scope}
        attributes["agenttx.tx_id" if event.scope == "transaction" else "agenttx.run_id"] = (
            event.scope_id
        )
        created = self._tracer.start_span(
            f"agenttx.{event.scope}",
            kind=SpanKind.INTERNAL,
            start_time=_ns(event),
            attributes=attributes,
        )
        with self._lock:
            span = self._scopes.setdefault(key, created)
        if span is not created:  # another thread made it first
            created.end(end_time=_ns(event))
        return span

    def _start(self, event: Event) -> None:
        parent = trace.set_span_in_context(self._scope_span(event))
        tool = str(event.data.get("tool", ""))
        attributes: dict[str, Any] = {
            "gen_ai.operation.name": "execute_tool",
            "gen_ai.tool.name": tool,
            "agenttx.scope": event.scope,
            "agenttx.scope_id": event.scope_id,
        }
        call_id = event.data.get("call_id")
        if isinstance(call_id, str):
            attributes["gen_ai.tool.call.id"] = call_id
        if event.step is not None:
            attributes["agenttx.step"] = event.step
        if event.node is not None:
            attributes["agenttx.node"] = event.node
        key = self._key(event)
        with self._lock:
            number = self._attempts.get(key, 0) + 1
            self._attempts[key] = number
        attributes["agenttx.attempt"] = event.attempt if event.attempt is not None else number
        start = _ns(event)
        span = self._tracer.start_span(
            f"execute_tool {tool}".rstrip(),
            context=parent,
            kind=SpanKind.INTERNAL,
            start_time=start,
            attributes=attributes,
        )
        with self._lock:
            replaced = self._open.pop(key, None)
            self._open[key] = (span, start, number)
        if replaced is not None:  # dispatched again without an end: close the old one
            replaced[0].end(end_time=start)

    def _end(self, event: Event, status: str) -> None:
        key = self._key(event)
        with self._lock:
            found = self._open.pop(key, None)
        if found is None:
            if event.kind is not EventKind.STEP_FAILED:
                return  # a node skipped or cancelled before it started: no attempt to end
            # A step that failed before its tool ran (unknown tool, bad arguments): a span
            # of no length, so that the failure is seen.
            self._start(_dispatch_of(event))
            with self._lock:
                found = self._open.pop(key, None)
            if found is None:  # pragma: no cover - _start put it there
                return
        span, start, _number = found
        end = max(_ns(event), start)
        span.set_attribute("agenttx.status", status)
        span.set_attribute("agenttx.duration_ms", (end - start) / 1_000_000)
        strategy = event.data.get("strategy")
        span.set_attribute(
            "agenttx.rollback.strategy", strategy if isinstance(strategy, str) else "none"
        )
        if status == "SUCCESS":
            span.set_status(Status(StatusCode.OK))
        elif status != "CANCELLED":
            hint = event.data.get("hint")
            category = event.data.get("category")
            span.set_attribute(
                "error.type", category if isinstance(category, str) else status.lower()
            )
            span.set_status(Status(StatusCode.ERROR, hint if isinstance(hint, str) else None))
        span.end(end_time=end)

    def _end_scope(self, event: Event) -> None:
        key = (event.scope, event.scope_id)
        with self._lock:
            span = self._scopes.pop(key, None)
            left = [k for k in self._open if k[0] == event.scope_id]
            spans = [self._open.pop(k)[0] for k in left]
            for k in [k for k in self._attempts if k[0] == event.scope_id]:
                del self._attempts[k]
        end = _ns(event)
        for attempt in spans:  # attempts the trail never ended (a crash, a lost run)
            attempt.end(end_time=end)
        if span is None:
            return
        span.set_attribute("agenttx.outcome", event.kind.value)
        status = event.data.get("status")
        if isinstance(status, str):
            span.set_attribute("agenttx.status", status)
        if event.kind is EventKind.COMMITTED or status == "SUCCEEDED":
            span.set_status(Status(StatusCode.OK))
        elif event.kind is EventKind.ABORTED or status in ("FAILED", "CANCELLED"):
            span.set_status(Status(StatusCode.ERROR, f"ended {status or event.kind.value}"))
        span.end(end_time=end)


def _dispatch_of(event: Event) -> Event:
    """The `step_dispatched` event a failed step would have had, at the failure's time."""
    return Event(
        kind=EventKind.STEP_DISPATCHED,
        at=event.at,
        scope=event.scope,
        scope_id=event.scope_id,
        seq=event.seq,
        step=event.step,
        data={"tool": event.data.get("tool", "")},
    )
