"""Many transactions on one store: begin them, find them again, and reap the idle ones.

An `Engine` holds the configuration a deployment shares (tools, store, policy, time limits,
dispatcher) and builds the tool registry once. It holds its live transactions, and a bounded
view of the recently ended ones (`EngineConfig.keep_ended`, `keep_ended_for`), so that `get`
still shows how a transaction ended without a long-lived engine growing with every transaction
it ever ran. The lasting record of a transaction is the durable store's to keep, not the
engine's.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import threading
import time
from collections import OrderedDict
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Final, Literal, cast, final

import attrs

from ._approvals import requests_for, scopes_alive
from ._audit import merge_scopes, stored_audit, write_jsonl
from ._errors import AgentTxError, FailedPrecondition, InvalidArgument, TransactionNotFound
from ._events import hook_callables
from ._limits import DEFAULT_ISOLATION, ISOLATION_LEVELS, Isolation
from ._plans import PlanRun, run_plan, start_plan
from ._recovery import cancel_stranded_plan, recover, recover_plans
from ._results import DispatchReport, RecoveryReport, TxStatus
from ._rollback import RollbackPolicy
from ._saga import check_dispatcher, deliver_outbox
from ._settings import (
    DEFAULT_STEP_TIMEOUT,
    Settings,
    check_serializer,
    float_seconds,
    settings_of,
)
from ._step import edit_check
from ._tools import ToolRegistry, to_json_value
from ._transaction import Transaction
from ._validators import (
    instance_of,
    is_positive_int,
    non_negative_int,
    non_negative_number,
    one_of,
    optional,
    positive_int,
    positive_number,
)
from .stores import MemoryStore, Store, is_durable, is_plan_store, releases

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable
    from types import TracebackType
    from typing import TextIO

    from typing_extensions import Self

    from ._approvals import Approval, ApprovalRequest, Review
    from ._events import Event, HookLike
    from ._json import JSONValue
    from ._plans import Plan, PlanResult
    from ._saga import Dispatcher
    from ._tools import OutputSerializer, ToolsArgument, ToolSpec
    from .stores import OutboxEntry, SQLiteStore

__all__ = ["Engine", "EngineConfig"]

#: The reaper wakes up every quarter of the idle timeout, within these bounds.
REAPER_PERIOD_BOUNDS: Final = (0.05, 60.0)

#: `begin` looks for ended transactions among the live ones once their number has doubled since
#: the last look, and at least this many have been begun: amortized O(1) per `begin`.
SWEEP_MIN: Final = 64


@final
@attrs.frozen(kw_only=True)
class EngineConfig:
    """The settings an engine shares, with their defaults and checks (`docs/protocol.md#engine`).

    `idle_timeout=None` disables reaping. `from_env` reads the `AGENTTX_*` environment
    variables: `AGENTTX_STEP_TIMEOUT_MS`, `AGENTTX_TX_IDLE_TIMEOUT_SECS` (0 disables),
    `AGENTTX_COMPENSATION_RETRIES`, `AGENTTX_MAX_CONSTRAINTS`, `AGENTTX_MAX_LOCAL_DEPTH`,
    `AGENTTX_MAX_GLOBAL_RESETS`, `AGENTTX_REPLAY_BUDGET_FACTOR`, `AGENTTX_MISTAKE_RETRIES` and
    `AGENTTX_ISOLATION`.
    """

    step_timeout: float = attrs.field(
        default=DEFAULT_STEP_TIMEOUT, converter=float_seconds, validator=positive_number
    )
    idle_timeout: float | None = attrs.field(default=900.0, validator=optional(positive_number))
    compensation_retries: int = attrs.field(default=3, validator=positive_int)
    compensation_timeout: float = attrs.field(
        default=DEFAULT_STEP_TIMEOUT, converter=float_seconds, validator=positive_number
    )
    dispatch_timeout: float = attrs.field(
        default=DEFAULT_STEP_TIMEOUT, converter=float_seconds, validator=positive_number
    )
    max_constraints: int = attrs.field(default=32, validator=positive_int)
    policy: RollbackPolicy = attrs.field(
        factory=RollbackPolicy, validator=instance_of(RollbackPolicy)
    )
    isolation: Isolation = attrs.field(
        default=DEFAULT_ISOLATION, validator=one_of(*ISOLATION_LEVELS)
    )
    #: How many ended transactions the engine keeps for `get` (None: no limit), and for how
    #: many seconds after it saw them end (None: no limit); the oldest ended go first.
    keep_ended: int | None = attrs.field(default=1000, validator=optional(non_negative_int))
    keep_ended_for: float | None = attrs.field(
        default=3600.0, validator=optional(non_negative_number)
    )
    #: Converts a tool output that is not JSON (docs/protocol.md#outputs); not read from the
    #: environment.
    output_serializer: OutputSerializer = attrs.field(
        default=to_json_value, validator=check_serializer
    )

    @property
    def settings(self) -> Settings:
        """The settings each transaction of the engine runs with (its own policy aside)."""
        return Settings(
            step_timeout=self.step_timeout,
            max_constraints=self.max_constraints,
            compensation_retries=self.compensation_retries,
            compensation_timeout=self.compensation_timeout,
            dispatch_timeout=self.dispatch_timeout,
            isolation=self.isolation,
            policy=self.policy,
            output_serializer=self.output_serializer,
        )

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> EngineConfig:
        """The configuration from `AGENTTX_*` variables (default: `os.environ`)."""
        env = os.environ if environ is None else environ
        defaults = cls()

        def read(name: str, parse: Callable[[str], Any], default: Any) -> Any:
            text = env.get(f"AGENTTX_{name}")
            if text is None or not text.strip():
                return default
            try:
                return parse(text.strip())
            except ValueError:
                raise InvalidArgument(f"AGENTTX_{name}={text!r} is not a valid number") from None

        idle = read("TX_IDLE_TIMEOUT_SECS", float, defaults.idle_timeout)
        policy = RollbackPolicy(
            max_local_depth=read("MAX_LOCAL_DEPTH", int, defaults.policy.max_local_depth),
            max_global_resets=read("MAX_GLOBAL_RESETS", int, defaults.policy.max_global_resets),
            replay_budget_factor=read(
                "REPLAY_BUDGET_FACTOR", float, defaults.policy.replay_budget_factor
            ),
            mistake_retries=read("MISTAKE_RETRIES", int, defaults.policy.mistake_retries),
        )
        return cls(
            step_timeout=read("STEP_TIMEOUT_MS", int, 30_000) / 1000,
            idle_timeout=None if idle == 0 else idle,
            compensation_retries=read("COMPENSATION_RETRIES", int, defaults.compensation_retries),
            max_constraints=read("MAX_CONSTRAINTS", int, defaults.max_constraints),
            policy=policy,
            isolation=cast("Any", env.get("AGENTTX_ISOLATION", "").strip() or defaults.isolation),
        )  # isolation is checked on construction


class Engine:
    """Begins transactions on one store with shared tools and settings, and reaps idle ones.

    The engine holds its live transactions and a bounded view of the ended ones: at most
    `config.keep_ended` of them, each for at most `config.keep_ended_for` seconds after the
    engine noticed it ended, the oldest ended evicted first. It notices an end when it next
    touches the transaction (`get`, `transactions`, `reap_idle`, and a periodic look from
    `begin`), so a transaction may stay a little past the bounds until then. Memory therefore
    stays bounded by the live transactions plus the ended ones kept, however long the engine
    runs.

    `hooks` (`EventHook`s or callables) get the audit events of every transaction the engine
    begins or recovers and of every plan it runs; `audit` and `export_audit` read the trail
    back, from the store once it has ended (docs/audit.md).

    Thread-safe: every method may be called from any thread; each transaction serializes its
    own calls. `with Engine(...) as engine:` closes it (stopping the reaper thread) on the way
    out. Compared by identity; `repr` shows the store and the counts, never transaction data.
    """

    def __init__(
        self,
        *,
        tools: ToolsArgument = (),
        store: Store | None = None,
        config: EngineConfig | None = None,
        dispatcher: Dispatcher | None = None,
        hooks: Iterable[HookLike] | None = None,
    ) -> None:
        self._config = EngineConfig() if config is None else config
        if not isinstance(self._config, EngineConfig):
            raise InvalidArgument(f"config must be an EngineConfig, got {config!r}")
        if store is not None and not isinstance(store, Store):
            raise InvalidArgument(
                f"store must implement agenttx.stores.Store (e.g. MemoryStore or SQLiteStore), "
                f"got {type(store).__name__}"
            )
        check_dispatcher(dispatcher)
        self._registry = ToolRegistry(tools)  # validated once, shared by every transaction
        self._store: Store = MemoryStore() if store is None else store
        self._dispatcher = dispatcher
        # Checked here, so that a bad hook fails at construction; kept as the functions to call.
        self._hooks: tuple[HookLike, ...] = hook_callables(hooks)
        # The settings of a transaction begun with the engine's policy and isolation, once
        # the first one is begun (`begin`).
        self._settings: Settings | None = None
        # The order transactions were begun (or recovered) in, for `transactions()`.
        self._sequence = itertools.count()
        # Transactions not yet seen ended; some may have ended since the engine last looked.
        self._live: dict[str, tuple[int, Transaction]] = {}
        # Ended transactions, oldest end first, with when the engine noticed the end.
        self._ended: OrderedDict[str, tuple[int, Transaction, float]] = OrderedDict()
        self._sweep_at = SWEEP_MIN
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._reaper: threading.Thread | None = None
        self._closed = False
        # The plan runs started or resumed here, by run id.
        self._plans: dict[str, PlanRun] = {}

    @property
    def config(self) -> EngineConfig:
        """The engine's settings."""
        return self._config

    @property
    def tool_specs(self) -> tuple[ToolSpec, ...]:
        """The specs of the engine's tools, in registration order (what a model is told)."""
        return self._registry.specs()

    @property
    def store(self) -> Store:
        """The store every transaction of this engine uses."""
        return self._store

    def __repr__(self) -> str:
        # No lock: a repr must not block (or deadlock in a debugger); the counts are a glimpse.
        kind = type(self._store)
        where = kind.__name__  # not a third-party store's own repr: it might show credentials
        if where == "SQLiteStore" and kind.__module__ == "agenttx.stores":
            where = f"SQLiteStore({cast('SQLiteStore', self._store).path!r})"
        return f"<Engine store={where} live={len(self._live)} ended={len(self._ended)}>"

    # ------------------------------------------------------------------ the transactions held

    def _hold(self, tx: Transaction) -> None:
        """Hold a new live transaction; with the lock held."""
        self._live[tx.id] = (next(self._sequence), tx)
        if len(self._live) >= self._sweep_at:
            self._sweep(time.monotonic())

    def _sweep(self, now: float) -> None:
        """Move the live transactions that have ended to the ended view; with the lock held."""
        for tx_id in [tx_id for tx_id, (_, tx) in self._live.items() if tx.status.terminal]:
            self._retire(tx_id, now)
        self._sweep_at = max(2 * len(self._live), SWEEP_MIN)
        self._trim(now)

    def _retire(self, tx_id: str, now: float) -> None:
        """Move one ended transaction from the live ones to the ended view; with the lock held."""
        order, tx = self._live.pop(tx_id)
        self._ended[tx_id] = (order, tx, now)

    def _trim(self, now: float) -> None:
        """Evict the ended beyond the count or the age, oldest first; with the lock held."""
        keep, keep_for = self._config.keep_ended, self._config.keep_ended_for
        ended = self._ended
        while ended and (
            (keep is not None and len(ended) > keep)
            or (keep_for is not None and now - next(iter(ended.values()))[2] >= keep_for)
        ):
            ended.popitem(last=False)

    def begin(
        self,
        *,
        agent_id: str = "",
        policy: RollbackPolicy | Mapping[str, Any] | None = None,
        isolation: Isolation | None = None,
    ) -> Transaction:
        """Begin a transaction; `policy` replaces the engine's, or overrides the fields it names.

        `policy={"max_local_depth": 0}` keeps the engine's other policy fields; `isolation`
        defaults to the engine's. `begin` still works after `close` (which only stops the
        reaper). Raises `InvalidArgument` naming the argument that is wrong.
        """
        if not isinstance(agent_id, str):
            raise InvalidArgument(f"agent_id must be a string, got {type(agent_id).__name__}")
        if policy is None:
            chosen = self._config.policy
        elif isinstance(policy, RollbackPolicy):
            chosen = policy
        elif isinstance(policy, Mapping):
            fields = dict(policy)
            try:
                chosen = attrs.evolve(self._config.policy, **fields)
            except TypeError as exc:
                raise InvalidArgument(
                    f"unknown policy field in {sorted(map(str, fields))}"
                ) from exc
        else:
            raise InvalidArgument(
                "policy must be a RollbackPolicy, a mapping of its fields or None, "
                f"got {type(policy).__name__}"
            )
        if chosen is self._config.policy and isolation is None and self._settings is not None:
            settings = self._settings  # most transactions: the engine's own, built once
        else:
            config = self._config
            settings = settings_of(
                step_timeout=config.step_timeout,
                max_constraints=config.max_constraints,
                compensation_retries=config.compensation_retries,
                compensation_timeout=config.compensation_timeout,
                dispatch_timeout=config.dispatch_timeout,
                isolation=config.isolation if isolation is None else isolation,
                policy=chosen,
                output_serializer=config.output_serializer,
            )
            if chosen is config.policy and isolation is None:
                self._settings = settings
        tx = Transaction._begin(  # noqa: SLF001  (the engine's own way in)
            settings,
            registry=self._registry,
            store=self._store,
            agent_id=agent_id,
            dispatcher=self._dispatcher,
            hooks=self._hooks,
        )
        with self._lock:
            self._hold(tx)
        return tx

    def get(self, tx_id: str) -> Transaction:
        """The transaction `tx_id`: live, or ended and still in the engine's view of ended ones.

        Raises `TransactionNotFound` if this engine never began it or has evicted it (beyond
        `keep_ended` or `keep_ended_for`): the engine keeps recent history only, the full
        history is the durable store's (`audit(tx_id)` says how a transaction that ended in
        another process, or before a crash, ended). `InvalidArgument` if `tx_id` is not a
        string.
        """
        if not isinstance(tx_id, str):
            raise InvalidArgument(f"tx_id must be a string, got {type(tx_id).__name__}")
        with self._lock:
            now = time.monotonic()
            held = self._live.get(tx_id)
            if held is not None and held[1].status.terminal:
                self._retire(tx_id, now)  # it has ended: from now on it counts as ended
            self._trim(now)
            held = self._live.get(tx_id)
            if held is not None:
                return held[1]
            ended = self._ended.get(tx_id)
        if ended is None:
            raise TransactionNotFound(tx_id=tx_id)
        return ended[1]

    def transactions(self) -> tuple[Transaction, ...]:
        """The transactions the engine holds (live, and the ended ones kept), in begin order."""
        with self._lock:
            self._sweep(time.monotonic())
            held = [*self._live.values(), *((order, tx) for order, tx, _ in self._ended.values())]
        return tuple(tx for _, tx in sorted(held, key=lambda pair: pair[0]))

    # ------------------------------------------------------------------ durability

    def recover(self, mode: Literal["abort", "resume"] = "abort") -> RecoveryReport:
        """Take over the transactions a crashed process left open in a durable store.

        Call it once at start-up. `"abort"` (presumed abort) compensates each one's undo
        records newest first through the registered compensations and discards its state;
        `"resume"` rebuilds each one, rewinding the step that was running when the process
        died, so that the agent goes on from `next_step_id` (find them with `get`). A
        transaction that ended with undo records left over is never resumed: those records
        are retried. A compensation that fails, or whose kind is not registered, stays in the
        store, is reported and is tried again by the next recovery. Transactions of this
        engine and of other live processes on this host are left alone. Several engines and
        processes may recover one store at once: each transaction is claimed atomically by one
        of them, so no compensation runs twice; any failure with one transaction is reported
        in `failures` and the others go on. On a store that is not durable there is nothing
        to recover.

        Plan runs a dead process left `RUNNING` are resumed in either mode. One whose plan
        uses a tool that is no longer registered cannot be: `"resume"` leaves it and lists its
        `PlanToolMissing` in `failures`; `"abort"` (or a cancellation recorded for it) ends it
        CANCELLED, compensating its completed nodes through the registered compensations.
        """
        if not isinstance(mode, str) or mode not in ("abort", "resume"):
            raise InvalidArgument(f"mode must be 'abort' or 'resume', got {mode!r}")
        if not is_durable(self._store):
            return RecoveryReport()
        with self._lock:
            self._sweep(time.monotonic())
            live = {tx_id for tx_id, (_, tx) in self._live.items() if not tx.status.terminal}
        report, resumed = recover(
            self._store,
            self._registry,
            mode=mode,
            dispatcher=self._dispatcher,
            live=live,
            output_serializer=self._config.output_serializer,
            hooks=self._hooks,
        )
        with self._lock:
            for tx in resumed:
                self._hold(tx)
            held = {run_id for run_id, run in self._plans.items() if not run.done}
        plans, skipped, failures, ran = recover_plans(
            self._store,
            self._registry,
            dispatcher=self._dispatcher,
            live=held,
            hooks=self._hooks,
            mode=mode,
        )
        with self._lock:
            for run in plans:
                self._plans[run.id] = run
        if not (plans or skipped or failures or ran):
            return report
        return attrs.evolve(
            report,
            compensations_run=report.compensations_run + ran,
            failures=(*report.failures, *failures),
            skipped=(*report.skipped, *skipped),
            plans_resumed=tuple(run.id for run in plans),
        )

    # ------------------------------------------------------------------ plan runs

    def run_plan(
        self, plan: Plan, *, initial: Mapping[str, JSONValue], **options: Any
    ) -> PlanResult:
        """`agenttx.run_plan` with the engine's tools, store and dispatcher: on a durable
        store the run is recorded durably, transition by transition, and `recover` resumes
        it after a crash. `options` are `run_plan`'s other keywords."""
        return run_plan(
            plan,
            tools=self._registry,
            initial=initial,
            store=self._store,
            dispatcher=self._dispatcher,
            **self._with_hooks(options),
        )

    def start_plan(
        self, plan: Plan, *, initial: Mapping[str, JSONValue], **options: Any
    ) -> PlanRun:
        """`agenttx.start_plan` with the engine's tools, store and dispatcher; the engine holds
        the run for `get_plan` and `cancel_plan`."""
        run = start_plan(
            plan,
            tools=self._registry,
            initial=initial,
            store=self._store,
            dispatcher=self._dispatcher,
            **self._with_hooks(options),
        )
        with self._lock:
            self._plans = {k: v for k, v in self._plans.items() if not v.done}
            self._plans[run.id] = run
        return run

    def _with_hooks(self, options: dict[str, Any]) -> dict[str, Any]:
        """`options` with the engine's hooks before any the call gives."""
        if not self._hooks:
            return options
        more = options.get("hooks")
        return {**options, "hooks": (*self._hooks, *hook_callables(more))}

    # ------------------------------------------------------------------ audit

    def audit(self, tx_or_run_id: str | None = None) -> tuple[Event, ...]:
        """The audit trail of one transaction or plan run, or (None) of everything at hand.

        With an id: the events of a transaction or plan run this engine holds (live or kept
        ended), else those its durable store keeps (ended transactions within the store's
        retention; plan runs). Raises `TransactionNotFound` if there are none. With None: the
        events the store keeps of its recent ended transactions and plan runs, and those of
        the transactions and runs this engine holds; each scope in `seq` order, scopes by
        their first event. See docs/audit.md.
        """
        if tx_or_run_id is not None:
            if not isinstance(tx_or_run_id, str):
                raise InvalidArgument(
                    f"tx_or_run_id must be a string or None, got {type(tx_or_run_id).__name__}"
                )
            try:
                return self.get(tx_or_run_id).audit()
            except TransactionNotFound:
                pass
            with self._lock:
                run = self._plans.get(tx_or_run_id)
            if run is not None:
                return run.audit()
            return stored_audit(self._store, tx_or_run_id)
        held: list[Event] = [event for tx in self.transactions() for event in tx.audit()]
        with self._lock:
            runs = list(self._plans.values())
        held.extend(event for run in runs for event in run.audit())
        seen = {(event.scope, event.scope_id) for event in held}
        stored = [
            event
            for event in stored_audit(self._store)
            if (event.scope, event.scope_id) not in seen
        ]
        return merge_scopes([*stored, *held])

    def export_audit(
        self, file: str | os.PathLike[str] | TextIO, tx_or_run_id: str | None = None
    ) -> int:
        """Write `audit(tx_or_run_id)` as JSON lines to `file` (a path, replaced, or an open
        text file); return how many events were written."""
        events = self.audit(tx_or_run_id)
        if isinstance(file, (str, os.PathLike)):
            with open(file, "w", encoding="utf-8") as out:  # noqa: PTH123
                return write_jsonl(events, out)
        return write_jsonl(events, file)

    def get_plan(self, run_id: str) -> PlanRun:
        """The plan run `run_id` started (`start_plan`) or resumed (`recover`) by this engine.

        Raises `TransactionNotFound` if the engine holds no such run (another process's runs
        are in the store: `agenttx plans DB RUN` shows them).
        """
        with self._lock:
            run = self._plans.get(run_id)
        if run is None:
            raise TransactionNotFound(tx_id=run_id)
        return run

    def cancel_plan(self, run_id: str, reason: str = "cancelled") -> None:
        """Cancel plan run `run_id`, whichever thread or process runs it.

        On a durable store the cancellation is recorded first, and the runner (here or in
        another process) reads it before its next dispatch; a run held here is woken at once. A
        dead process's run that cannot be resumed (a tool of its plan is no longer registered)
        is ended here: its completed nodes compensated, CANCELLED.
        Raises `FailedPrecondition` if the run has ended or was cancelled already, and
        `TransactionNotFound` if neither the store nor this engine knows it.
        """
        if not isinstance(reason, str):
            raise InvalidArgument(f"reason must be a string, got {reason!r:.80}")
        with self._lock:
            run = self._plans.get(run_id)
        store = self._store
        if is_durable(store) and is_plan_store(store):
            try:
                recorded = store.cancel_plan(run_id, reason)
            except TransactionNotFound:
                if run is None:
                    raise
                recorded = True  # not durable yet (it has not started): cancel it here
            if not recorded:
                raise FailedPrecondition(f"plan run `{run_id}` has ended or was cancelled already")
            if run is not None:
                with contextlib.suppress(FailedPrecondition):  # it may have read it already
                    run.cancel(reason)
            else:  # a dead process's run that recovery cannot resume (a tool is missing)
                cancel_stranded_plan(self._store, run_id, self._registry, reason, self._hooks)
            return
        if run is None:
            raise TransactionNotFound(tx_id=run_id)
        run.cancel(reason)

    def pending_effects(self, limit: int = 1000) -> tuple[OutboxEntry, ...]:
        """Committed effects not yet delivered, oldest first (empty unless the store is durable).

        Raises `InvalidArgument` unless `limit` is an integer > 0.
        """
        _check_limit(limit)
        if not is_durable(self._store):
            return ()
        return self._store.pending_effects(limit)

    def dispatch_pending(self, limit: int = 1000) -> DispatchReport:
        """Deliver the outbox's due effects through the engine's dispatcher, in order.

        Each is marked delivered, or keeps its error and is offered again after a bounded
        backoff. Delivery is at least once, always with the effect's idempotency key. Raises
        `InvalidArgument` if the engine has no dispatcher, or unless `limit` is an integer > 0.
        """
        _check_limit(limit)
        if self._dispatcher is None:
            raise InvalidArgument("dispatch_pending needs an engine with a dispatcher")
        if not is_durable(self._store):
            return DispatchReport()
        delivered, failures = deliver_outbox(
            self._store, self._dispatcher, limit=limit, timeout=self._config.dispatch_timeout
        )
        return DispatchReport(delivered=delivered, failures=failures)

    # ------------------------------------------------------------------ approvals and reviews

    def pending_approvals(self, limit: int = 1000) -> tuple[ApprovalRequest, ...]:
        """The approval requests on the engine's store waiting for a decision, oldest first:
        those of every process, on a durable store (docs/approvals.md)."""
        _check_limit(limit)
        return requests_for(self._store).pending_approvals(limit, scopes_alive(self._store))

    def pending_reviews(self, limit: int = 1000) -> tuple[Review, ...]:
        """The reviews on the engine's store waiting for a person, oldest first."""
        _check_limit(limit)
        return requests_for(self._store).pending_reviews(limit, scopes_alive(self._store))

    def _holder(self, request_id: str) -> Transaction | PlanRun | None:
        """The live transaction or plan run of this engine that a request belongs to."""
        row = requests_for(self._store).get(request_id)
        if row is None:
            return None
        with self._lock:
            held = self._live.get(row.scope_id)
            run = self._plans.get(row.scope_id)
        if held is not None:
            return held[1]
        return run if run is not None and not run.done else None

    def approve(
        self,
        request_id: str,
        *,
        actor: str,
        expires_in: float | None = None,
        note: str = "",
        arguments: Mapping[str, Any] | None = None,
    ) -> Approval:
        """Approve request `request_id`, found by id on the engine's store (any process's).

        As `Transaction.approve`; edited `arguments` are checked against the engine's tool.
        The transaction that asked goes on when its agent sends the call again, here or in the
        process that resumes it.
        """
        tx = self._holder(request_id)
        if tx is not None:
            return tx.approve(
                request_id, actor=actor, expires_in=expires_in, note=note, arguments=arguments
            )
        return requests_for(self._store).approve(
            request_id,
            actor=actor,
            expires_in=expires_in,
            note=note,
            arguments=arguments,
            validate=edit_check(self._registry.get),  # or the schema stored with it
        )

    def reject(self, request_id: str, *, actor: str, reason: str) -> None:
        """Reject request `request_id`, found by id on the engine's store (`Transaction.reject`)."""
        tx = self._holder(request_id)
        if tx is not None:
            tx.reject(request_id, actor=actor, reason=reason)
            return
        requests_for(self._store).reject(request_id, actor=actor, reason=reason)

    def resolve_review(
        self, review_id: str, *, outcome: str, output: JSONValue = None, actor: str
    ) -> None:
        """Resolve review `review_id`, found by id on the engine's store
        (`Transaction.resolve_review`)."""
        tx = self._holder(review_id)
        if tx is not None:
            tx.resolve_review(review_id, outcome=outcome, output=output, actor=actor)
            return
        requests_for(self._store).resolve_review(
            review_id, outcome=outcome, output=output, actor=actor
        )

    # ------------------------------------------------------------------ reaping

    def reap_idle(self) -> int:
        """Abort every ACTIVE transaction idle for `idle_timeout`; skip busy ones; return count.

        Aborting compensates, drops staged effects and discards state; the transaction ends
        ROLLED_BACK and joins the ended ones kept for `get`. The work is proportional to the
        live transactions (and those ended since the last look), never to the engine's
        history. Does nothing when reaping is disabled.
        """
        timeout = self._config.idle_timeout
        if timeout is None:
            return 0
        with self._lock:
            self._sweep(time.monotonic())
            candidates = [tx for _, tx in self._live.values() if tx.status is TxStatus.ACTIVE]
        reaped = [tx for tx in candidates if tx.abort_if_idle(timeout)]
        if reaped:
            with self._lock:
                now = time.monotonic()
                for tx in reaped:
                    if tx.id in self._live:
                        self._retire(tx.id, now)
                self._trim(now)
        return len(reaped)

    def start_reaper(self) -> None:
        """Run `reap_idle` on a daemon thread every `clamp(idle_timeout / 4, 50 ms, 60 s)`.

        Does nothing if reaping is disabled or the reaper already runs. Raises
        `FailedPrecondition` after `close`: a closed engine's reaper stays stopped.
        """
        with self._lock:
            if self._closed:
                raise FailedPrecondition(
                    "start_reaper() was called after close(): a closed engine does not reap; "
                    "start the reaper before closing, or create a new Engine"
                )
            timeout = self._config.idle_timeout
            if timeout is None or self._reaper is not None:
                return
            low, high = REAPER_PERIOD_BOUNDS
            period = min(max(timeout / 4, low), high)

            def run() -> None:
                while not self._stop.wait(period):
                    self.reap_idle()

            self._reaper = threading.Thread(target=run, name="agenttx-reaper", daemon=True)
            self._reaper.start()

    def close(self) -> None:
        """Stop the reaper thread, if one runs, and wait for it; then give up the engine's open
        transactions, so that any engine or process can recover them at once. Idempotent.

        On a durable store each open transaction the engine holds is released
        (`SQLiteStore.release`, `PostgresStore.release`): its buffered writes are written and
        the store's hold is given up (SQLite: its owner cleared; PostgreSQL: its lease ended),
        so `recover()` elsewhere takes it over now, not once this process has exited (SQLite)
        or the lease has run out (PostgreSQL). The engine's `Transaction` objects for them are
        let go: a step sent to one afterwards raises (the store no longer holds it), so close
        an engine once its agents have stopped. A transaction another store took over meanwhile
        is left to it. `begin` still works; only `start_reaper` is refused from now on.
        """
        with self._lock:
            self._closed = True
            self._stop.set()
            reaper, self._reaper = self._reaper, None
            held = [tx_id for tx_id, (_, tx) in self._live.items() if not tx.status.terminal]
        # Joined without the lock: a sweep in progress needs it to finish.
        if reaper is not None and reaper is not threading.current_thread():
            reaper.join()
        if releases(self._store):  # the log-based durable stores
            for tx_id in held:
                with contextlib.suppress(AgentTxError):  # taken over, or gone: not ours now
                    self._store.release(tx_id)

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


def _check_limit(limit: object) -> None:
    if not is_positive_int(limit):
        raise InvalidArgument(f"limit must be an integer > 0, got {limit!r}")
