"""Many transactions on one store: begin them, find them again, and reap the idle ones.

An `Engine` holds the configuration a deployment shares (tools, store, policy, time limits,
dispatcher), builds the tool registry once, and keeps every transaction it began, ended ones
included, so `get` still shows how a transaction ended (an audit trail the reference lacks).
"""

from __future__ import annotations

import os
import threading
from typing import TYPE_CHECKING, Any, Final, Literal, cast, final

import attrs

from ._errors import InvalidArgument, TransactionNotFound
from ._limits import Isolation, check_isolation, is_positive_int, is_positive_number
from ._policy import RollbackPolicy
from ._recovery import recover
from ._results import DispatchReport, RecoveryReport
from ._saga import deliver_outbox
from ._tools import ToolRegistry
from ._transaction import Transaction
from .stores import MemoryStore, Store
from .stores._durable import is_durable

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable, Mapping
    from types import TracebackType

    from typing_extensions import Self

    from ._saga import Dispatcher
    from ._tools import ToolSpec
    from .stores import OutboxEntry

__all__ = ["Engine", "EngineConfig"]

#: The reaper wakes up every quarter of the idle timeout, within these bounds (the reference's).
REAPER_PERIOD_BOUNDS: Final = (0.05, 60.0)


@final
@attrs.frozen(kw_only=True)
class EngineConfig:
    """The settings an engine shares, with the reference's defaults and checks.

    `idle_timeout=None` disables reaping. `from_env` reads the reference's `AGENTTX_*`
    variables: `AGENTTX_STEP_TIMEOUT_MS`, `AGENTTX_TX_IDLE_TIMEOUT_SECS` (0 disables),
    `AGENTTX_COMPENSATION_RETRIES`, `AGENTTX_MAX_CONSTRAINTS`, `AGENTTX_MAX_LOCAL_DEPTH`,
    `AGENTTX_MAX_GLOBAL_RESETS`, `AGENTTX_REPLAY_BUDGET_FACTOR` and `AGENTTX_ISOLATION`.
    """

    step_timeout: float = 30.0
    idle_timeout: float | None = 900.0
    compensation_retries: int = 3
    max_constraints: int = 32
    policy: RollbackPolicy = attrs.field(factory=RollbackPolicy)
    isolation: Isolation = "no_lost_updates"

    def __attrs_post_init__(self) -> None:
        if not is_positive_number(self.step_timeout):
            raise InvalidArgument(f"step timeout must be > 0, got {self.step_timeout!r}")
        if self.idle_timeout is not None and not is_positive_number(self.idle_timeout):
            raise InvalidArgument(
                f"idle timeout must be > 0 (or None to disable), got {self.idle_timeout!r}"
            )
        if not is_positive_int(self.compensation_retries):
            raise InvalidArgument(
                f"compensation retries must be an integer > 0, got {self.compensation_retries!r}"
            )
        if not is_positive_int(self.max_constraints):
            raise InvalidArgument(
                f"max constraints must be an integer > 0, got {self.max_constraints!r}"
            )
        if not isinstance(self.policy, RollbackPolicy):
            raise InvalidArgument(f"policy must be a RollbackPolicy, got {self.policy!r}")
        check_isolation(self.isolation)

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

    Thread-safe: `begin`, `get`, `reap_idle` and `close` may be called from any thread; each
    transaction serializes its own calls. `with Engine(...) as engine:` closes it (stopping the
    reaper thread) on the way out.
    """

    def __init__(
        self,
        *,
        tools: Iterable[ToolSpec] | Mapping[str, Callable[..., Any]] = (),
        store: Store | None = None,
        config: EngineConfig | None = None,
        dispatcher: Dispatcher | None = None,
    ) -> None:
        self._registry = ToolRegistry(tools)  # validated once, shared by every transaction
        self._store: Store = MemoryStore() if store is None else store
        self._config = EngineConfig() if config is None else config
        if not isinstance(self._config, EngineConfig):
            raise InvalidArgument(f"config must be an EngineConfig, got {config!r}")
        self._dispatcher = dispatcher
        self._transactions: dict[str, Transaction] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._reaper: threading.Thread | None = None

    @property
    def config(self) -> EngineConfig:
        """The engine's settings."""
        return self._config

    @property
    def store(self) -> Store:
        """The store every transaction of this engine uses."""
        return self._store

    def begin(
        self,
        *,
        agent_id: str = "",
        policy: RollbackPolicy | Mapping[str, Any] | None = None,
        isolation: Isolation | None = None,
    ) -> Transaction:
        """Begin a transaction; `policy` replaces the engine's, or overrides the fields it names.

        `policy={"max_local_depth": 0}` keeps the engine's other policy fields; `isolation`
        defaults to the engine's.
        """
        if policy is None:
            chosen = self._config.policy
        elif isinstance(policy, RollbackPolicy):
            chosen = policy
        else:
            try:
                chosen = attrs.evolve(self._config.policy, **dict(policy))
            except TypeError as exc:
                raise InvalidArgument(f"unknown policy field in {dict(policy)!r}") from exc
        tx = Transaction(
            self._registry,
            store=self._store,
            policy=chosen,
            agent_id=agent_id,
            dispatcher=self._dispatcher,
            step_timeout=self._config.step_timeout,
            max_constraints=self._config.max_constraints,
            compensation_retries=self._config.compensation_retries,
            isolation=self._config.isolation if isolation is None else isolation,
        )
        with self._lock:
            self._transactions[tx.id] = tx
        return tx

    def get(self, tx_id: str) -> Transaction:
        """The transaction `tx_id`, ended or not; `TransactionNotFound` if this engine has none."""
        with self._lock:
            tx = self._transactions.get(tx_id)
        if tx is None:
            raise TransactionNotFound(tx_id=tx_id)
        return tx

    def transactions(self) -> tuple[Transaction, ...]:
        """Every transaction this engine began, in the order it began them."""
        with self._lock:
            return tuple(self._transactions.values())

    # ------------------------------------------------------------------ durability

    def recover(self, mode: Literal["abort", "resume"] = "abort") -> RecoveryReport:
        """Take over the transactions a crashed process left open in a durable store.

        Call it once at start-up. `"abort"` (the reference's presumed abort) compensates each
        one's undo records newest first through the registered compensations and discards its
        state; `"resume"` rebuilds each one, rewinding the step that was running when the
        process died, so that the agent goes on from `next_step_id` (find them with `get`).
        A transaction that ended with undo records left over is never resumed: those records
        are retried. A compensation that fails, or whose kind is not registered, stays in the
        store, is reported and is tried again by the next recovery. Transactions of this
        engine and of other live processes on this host are left alone. Several engines and
        processes may recover one store at once: each transaction is claimed atomically by one
        of them, so no compensation runs twice; any failure with one transaction is reported
        in `failures` and the others go on. On a store that is not durable there is nothing
        to recover.
        """
        if not is_durable(self._store):
            if mode not in ("abort", "resume"):
                raise InvalidArgument(f"mode must be 'abort' or 'resume', got {mode!r}")
            return RecoveryReport()
        with self._lock:
            live = {tx_id for tx_id, tx in self._transactions.items() if not tx.status.terminal}
        report, resumed = recover(
            self._store, self._registry, mode=mode, dispatcher=self._dispatcher, live=live
        )
        with self._lock:
            for tx in resumed:
                self._transactions[tx.id] = tx
        return report

    def pending_effects(self, limit: int = 1000) -> tuple[OutboxEntry, ...]:
        """Committed effects not yet delivered, oldest first (empty unless the store is durable)."""
        if not is_durable(self._store):
            return ()
        return self._store.pending_effects(limit)

    def dispatch_pending(self, limit: int = 1000) -> DispatchReport:
        """Deliver the outbox's due effects through the engine's dispatcher, in order.

        Each is marked delivered, or keeps its error and is offered again after a bounded
        backoff. Delivery is at least once, always with the effect's idempotency key. Raises
        `InvalidArgument` if the engine has no dispatcher.
        """
        if self._dispatcher is None:
            raise InvalidArgument("dispatch_pending needs an engine with a dispatcher")
        if not is_durable(self._store):
            return DispatchReport()
        delivered, errors = deliver_outbox(self._store, self._dispatcher, limit=limit)
        return DispatchReport(delivered=delivered, errors=errors)

    def reap_idle(self) -> int:
        """Abort every ACTIVE transaction idle for `idle_timeout`; skip busy ones; return count.

        Aborting compensates, drops staged effects and discards state; the transaction ends
        ROLLED_BACK and stays visible through `get`. Does nothing when reaping is disabled.
        """
        timeout = self._config.idle_timeout
        if timeout is None:
            return 0
        return sum(tx.abort_if_idle(timeout) for tx in self.transactions())

    def start_reaper(self) -> None:
        """Run `reap_idle` on a daemon thread every `clamp(idle_timeout / 4, 50 ms, 60 s)`."""
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
        """Stop the reaper thread, if one runs. Transactions are left as they are."""
        self._stop.set()
        if self._reaper is not None:
            self._reaper.join()
            self._reaper = None

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()
