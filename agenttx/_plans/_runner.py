"""Running a plan: `arun_plan`, `run_plan` for sync callers, `start_plan` and its `PlanRun`.

Each call checks everything before anything runs (a `PlanExecution` is constructed in the
caller's thread: the plan against the tools, the initial values, the limits), then executes it:
`arun_plan` in the caller's event loop, `run_plan` on a new one, `start_plan` on a background
thread with its own. See `docs/plans.md#running-a-plan`.
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Any, final

from .._errors import FailedPrecondition, InvalidArgument, StorageError
from .._tools import ToolRegistry
from ._abort import missing_tool, plan_of
from ._execution import PlanExecution
from ._journal import read_run
from ._model import Plan
from ._scheduler import RateLimit

if TYPE_CHECKING:
    from collections.abc import Iterable, Mapping

    from .._approvals import Approval, ApprovalRequest, Review
    from .._events import Event, HookLike
    from .._json import JSONValue
    from .._saga import Backoff, Dispatcher
    from .._tools import ToolsArgument
    from ..stores import PlanImage, Store
    from ._execution import CompensateOn, FailurePolicy
    from ._results import PlanResult, PlanStatus
    from ._scheduler import NodeState

__all__ = ["PlanRun", "arun_plan", "resume_plan", "run_plan", "start_plan"]


async def arun_plan(
    plan: Plan,
    *,
    tools: ToolsArgument,
    initial: Mapping[str, JSONValue],
    max_concurrency: int = 8,
    resources: Mapping[str, int] | None = None,
    on_failure: FailurePolicy = "skip_dependants",
    store: Store | None = None,
    rate_limits: Mapping[str, RateLimit | float] | None = None,
    run_id: str | None = None,
    dispatcher: Dispatcher | None = None,
    compensate_on: CompensateOn = "failure",
    backoff: Backoff | None = None,
    hooks: Iterable[HookLike] | None = None,
) -> PlanResult:
    """Run `plan` with `tools` and `initial` values; return its `PlanResult`.

    Before anything runs, raises `PlanValidationError` (with `.problems`) for an invalid plan
    and `InvalidArgument` for initial values that are unknown, missing or not JSON, a
    `max_concurrency` below 1, a negative capacity, a bad rate limit, failure policy or run id.
    `resources` gives each named resource's capacity; `rate_limits` maps a tool to starts per
    second (or a `RateLimit`). `on_failure`: `"skip_dependants"` (skip what depends on a failed
    node, finish the rest) or `"cancel_all"`. `store` (default: a private `MemoryStore`) holds
    the run's one transaction; `dispatcher` delivers staged effects after the commit.
    `compensate_on`: `"failure"` (default) compensates completed nodes when the run fails or is
    cancelled, `"never"` only reports them as requested. `backoff` (default: the library's
    retry backoff, jittered) spaces retries. `hooks` (`EventHook`s, or callables taking an
    `Event`) receive each audit event as it is recorded (see `docs/audit.md`). Cancelling the
    awaiting task cancels the run: it compensates, then the cancellation propagates.
    See `docs/plans.md#running-a-plan`.
    """
    run = PlanExecution(
        plan,
        tools=tools,
        initial=initial,
        max_concurrency=max_concurrency,
        resources=resources,
        on_failure=on_failure,
        store=store,
        rate_limits=rate_limits,
        run_id=run_id,
        dispatcher=dispatcher,
        compensate_on=compensate_on,
        backoff=backoff,
        hooks=hooks,
    )
    return await run.execute()


def run_plan(
    plan: Plan,
    *,
    tools: ToolsArgument,
    initial: Mapping[str, JSONValue],
    max_concurrency: int = 8,
    resources: Mapping[str, int] | None = None,
    on_failure: FailurePolicy = "skip_dependants",
    store: Store | None = None,
    rate_limits: Mapping[str, RateLimit | float] | None = None,
    run_id: str | None = None,
    dispatcher: Dispatcher | None = None,
    compensate_on: CompensateOn = "failure",
    backoff: Backoff | None = None,
    hooks: Iterable[HookLike] | None = None,
) -> PlanResult:
    """`arun_plan` for sync callers: runs it on a new event loop and returns its result.

    Raises `FailedPrecondition` when called from a thread whose event loop is running (await
    `arun_plan` there instead), and whatever `arun_plan` raises.
    """
    import asyncio  # noqa: PLC0415

    _refuse_running_loop("run_plan", "await agenttx.arun_plan(...)")
    run = PlanExecution(
        plan,
        tools=tools,
        initial=initial,
        max_concurrency=max_concurrency,
        resources=resources,
        on_failure=on_failure,
        store=store,
        rate_limits=rate_limits,
        run_id=run_id,
        dispatcher=dispatcher,
        compensate_on=compensate_on,
        backoff=backoff,
        hooks=hooks,
    )
    return asyncio.run(run.execute())


def _refuse_running_loop(name: str, instead: str) -> None:
    import asyncio  # noqa: PLC0415

    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return
    raise FailedPrecondition(
        f"{name} cannot run inside a running event loop (it would block it); use {instead}"
    )


@final
class PlanRun:
    """A plan run going on in a background thread (`start_plan`): `id`, `status`, `cancel`,
    `wait`.

    Thread-safe. `cancel(reason)` records the cancellation in the audit before dispatching
    stops; `wait(timeout)` returns the `PlanResult`, or raises `TimeoutError` if the run has not
    ended in time (it goes on), or re-raises what ended the run abnormally.
    """

    __slots__ = ("_done", "_error", "_result", "_run", "_thread")

    def __init__(self, run: PlanExecution) -> None:
        self._run = run
        self._done = threading.Event()
        self._result: PlanResult | None = None
        self._error: BaseException | None = None
        self._thread = threading.Thread(
            target=self._main, name=f"agenttx-plan-{run.id}", daemon=True
        )

    def _main(self) -> None:
        import asyncio  # noqa: PLC0415

        try:
            self._result = asyncio.run(self._run.execute())
        except BaseException as exc:  # noqa: BLE001  (handed to `wait`)
            self._error = exc
        finally:
            self._done.set()

    @property
    def id(self) -> str:
        """The run id (also the id of its store transaction)."""
        return self._run.id

    @property
    def done(self) -> bool:
        """Whether the run has ended (its `wait` returns at once)."""
        return self._done.is_set()

    @property
    def status(self) -> PlanStatus:
        """RUNNING until the run ends, then SUCCEEDED, FAILED or CANCELLED."""
        return self._run.status

    def cancel(self, reason: str = "cancelled") -> None:
        """Cancel the run: recorded first, then no new dispatch; running async tools are
        cancelled and sync ones fenced; every unfinished node ends CANCELLED, and completed
        nodes are compensated (unless `compensate_on="never"`).

        Raises `FailedPrecondition` once the run has ended or was already cancelled.
        """
        self._run.request_cancel(reason)

    def audit(self) -> tuple[Event, ...]:
        """The run's audit events so far (all of them once it has ended), in `seq` order."""
        return self._run.audit()

    def node_states(self) -> dict[str, NodeState]:
        """Every node's state now: a started node waiting for a person shows
        `WAITING_APPROVAL` or `NEEDS_REVIEW` (docs/approvals.md#plan-nodes)."""
        return self._run.node_states()

    def pending_approvals(self) -> tuple[ApprovalRequest, ...]:
        """The run's approval requests waiting for a decision, oldest first."""
        return self._run.people.pending_approvals()

    def pending_reviews(self) -> tuple[Review, ...]:
        """The run's reviews waiting for a person, oldest first."""
        return self._run.people.pending_reviews()

    def approve(
        self,
        request_id: str,
        *,
        actor: str,
        expires_in: float | None = None,
        note: str = "",
        arguments: Mapping[str, Any] | None = None,
    ) -> Approval:
        """Approve request `request_id` of this run, as `actor`: the node runs its call once.

        As `Transaction.approve` (the same errors); `ApprovalNotFound` for a request of
        another run. Safe from any thread while the run goes on.
        """
        approval = self._run.people.book.approve(
            request_id,
            actor=actor,
            expires_in=expires_in,
            note=note,
            arguments=arguments,
            scope_id=self.id,
            validate=self._run.edit_check(),
        )
        self._run.people.decided_row(request_id)
        return approval

    def reject(self, request_id: str, *, actor: str, reason: str) -> None:
        """Reject request `request_id` of this run: its node fails with the reason."""
        self._run.people.book.reject(request_id, actor=actor, reason=reason, scope_id=self.id)
        self._run.people.decided_row(request_id)

    def resolve_review(
        self, review_id: str, *, outcome: str, output: JSONValue = None, actor: str
    ) -> None:
        """Resolve review `review_id` of this run: `done` ends the node with `output`,
        `not_done` runs its call again with the same idempotency key."""
        self._run.people.book.resolve_review(
            review_id, outcome=outcome, output=output, actor=actor, scope_id=self.id
        )
        self._run.people.decided_row(review_id)

    def wait(self, timeout: float | None = None) -> PlanResult:
        """The run's result, once it has ended; see the class docstring."""
        if timeout is not None and (
            isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not timeout >= 0
        ):
            raise InvalidArgument(f"timeout must be None or a number >= 0, got {timeout!r:.80}")
        if not self._done.wait(timeout):
            raise TimeoutError(f"plan run `{self.id}` has not ended after {timeout} s")
        if self._error is not None:
            raise self._error
        if self._result is None:  # pragma: no cover  (the thread sets one or the other)
            raise FailedPrecondition(f"plan run `{self.id}` ended without a result")
        return self._result

    def __repr__(self) -> str:
        return f"<agenttx.PlanRun {self.id!r} {self.status.value}>"


def start_plan(
    plan: Plan,
    *,
    tools: ToolsArgument,
    initial: Mapping[str, JSONValue],
    max_concurrency: int = 8,
    resources: Mapping[str, int] | None = None,
    on_failure: FailurePolicy = "skip_dependants",
    store: Store | None = None,
    rate_limits: Mapping[str, RateLimit | float] | None = None,
    run_id: str | None = None,
    dispatcher: Dispatcher | None = None,
    compensate_on: CompensateOn = "failure",
    backoff: Backoff | None = None,
    hooks: Iterable[HookLike] | None = None,
) -> PlanRun:
    """Check the plan and its inputs here (raising as `arun_plan` does), then run it on a
    background thread with its own event loop; return the `PlanRun` that steers it."""
    run = PlanExecution(
        plan,
        tools=tools,
        initial=initial,
        max_concurrency=max_concurrency,
        resources=resources,
        on_failure=on_failure,
        store=store,
        rate_limits=rate_limits,
        run_id=run_id,
        dispatcher=dispatcher,
        compensate_on=compensate_on,
        backoff=backoff,
        hooks=hooks,
    )
    if run.durable:
        run.open_journal()
    handle = PlanRun(run)
    handle._thread.start()  # noqa: SLF001
    return handle


def resume_plan(
    store: Store,
    image: PlanImage,
    *,
    tools: ToolsArgument,
    dispatcher: Dispatcher | None = None,
    backoff: Backoff | None = None,
    hooks: Iterable[HookLike] | None = None,
) -> PlanRun:
    """Resume a plan run that recovery took over (`image`, from `claim_plan`) on a background
    thread; return its `PlanRun`. Completed nodes are not run again (their stored outputs feed
    their dependants), failed ones stay failed, and a node that was claimed but not completed
    runs again with the same idempotency key. Raises `StorageError` for an unreadable record,
    `PlanToolMissing` if a tool of its plan is not registered (cancelling the run still ends
    it: `abort_run`), and as `start_plan` does (the tools may no longer fit the plan)."""
    record, nodes = read_run(image)
    registry = tools if isinstance(tools, ToolRegistry) else ToolRegistry(tools)
    missing = missing_tool(plan_of(image), registry, image.run_id)
    if missing is not None:
        raise missing
    try:
        plan = Plan.from_json(record["plan"])
        settings = record["settings"]
        initial = record["initial"]
        rate_limits = {
            tool: RateLimit(per_second=rate, burst=burst)
            for tool, (rate, burst) in settings["rate_limits"].items()
        }
    except (KeyError, TypeError, ValueError) as exc:
        raise StorageError(f"plan run `{image.run_id}`: unreadable durable record: {exc}") from exc
    run = PlanExecution(
        plan,
        tools=registry,
        initial=initial,
        max_concurrency=settings["max_concurrency"],
        resources=settings["resources"],
        on_failure=settings["on_failure"],
        store=store,
        rate_limits=rate_limits,
        run_id=image.run_id,
        dispatcher=dispatcher,
        compensate_on=settings["compensate_on"],
        backoff=backoff,
        restored=nodes,
        hooks=hooks,
    )
    run.open_journal()
    handle = PlanRun(run)
    handle._thread.start()  # noqa: SLF001
    return handle
