"""Staged effects after a commit: dispatchers, and delivery from a durable store's outbox.

Staged effects are dispatched only after a commit, in staging order. Delivery never raises:
it runs after the commit is durable, and the commit stands whatever happens to its effects, so
every failure (a dispatcher raising or missing, a delivery past its deadline, the outbox's store
failing to record an outcome) is a report line.

Delivery is at least once. A delivery abandoned at its deadline goes on, unwatched, on its
worker thread and may still land; an outbox entry whose outcome could not be recorded stays
pending and is offered again. Dispatchers must therefore be idempotent on the effect's
`idempotency_key`.
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Callable, Mapping
from functools import partial
from typing import TYPE_CHECKING, Final, Protocol, final

from .._errors import InvalidArgument
from .._tools import StagedEffect
from ..stores import claims_effects, is_durable
from ._attempts import DEFAULT_TIMEOUT, Attempt, check_timeout, describe
from ._backoff import Backoff

if TYPE_CHECKING:
    from collections.abc import Sequence

    from ..stores import DurableStore, OutboxEntry, Store

__all__ = [
    "OUTBOX_BACKOFF",
    "Dispatcher",
    "EffectDispatcher",
    "JsonlDispatcher",
    "check_dispatcher",
    "deliver_committed",
    "deliver_outbox",
    "dispatch_effects",
    "outbox_effect",
]


class EffectDispatcher(Protocol):
    """Delivers one committed staged effect.

    Called after the commit is durable, once per effect, in staging order, on a worker thread
    (with the committing thread's context variables), under a deadline (30 s by default). It
    may raise: the error is reported in `CommitResult.dispatch_errors` and the commit stands.
    Past its deadline it is abandoned, still running, and reported as timed out; from an
    outbox it is offered again later. So it must be idempotent on `effect.idempotency_key`,
    which is stable: the same effect may be delivered more than once.
    """

    def __call__(self, effect: StagedEffect, /) -> object: ...


@final
class JsonlDispatcher:
    """Appends each effect as one fsync'd JSON line to a local file, for a relay to deliver.

    (Not to be confused with a durable store's outbox, where a commit puts its effects until
    they are delivered: this is a dispatcher, and may be the one that delivers them.) Each
    line is `{"tx_id", "committed_at_ms", "step_id", "channel", "payload",
    "idempotency_key"}`. Parent directories are created; writers in one process are
    serialized.
    """

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = os.fspath(path)
        self._lock = threading.Lock()

    def __call__(self, effect: StagedEffect, /) -> None:
        line = json.dumps(
            {
                "tx_id": effect.tx_id,
                "committed_at_ms": int(time.time() * 1000),
                "step_id": effect.step_id,
                "channel": effect.channel,
                "payload": effect.payload,
                "idempotency_key": effect.idempotency_key,
            },
            separators=(",", ":"),
            sort_keys=True,
            ensure_ascii=False,
        )
        with self._lock:
            from pathlib import Path  # noqa: PLC0415  (not loaded by `import agenttx`)

            path = Path(self.path)
            try:
                path.parent.mkdir(parents=True, exist_ok=True)
                with path.open("a", encoding="utf-8") as lines:
                    lines.write(line + "\n")
                    lines.flush()
                    os.fsync(lines.fileno())
            except OSError as exc:
                raise OSError(f"append to {self.path}: {exc}") from exc

    def __repr__(self) -> str:
        return f"JsonlDispatcher({self.path!r})"


Dispatcher = EffectDispatcher | Callable[..., object] | Mapping[str, Callable[..., object]]


def check_dispatcher(dispatcher: object) -> None:
    """Raise `InvalidArgument` unless `dispatcher` is one `dispatch_effects` can deliver through.

    That is None (no delivery), a callable (an `EffectDispatcher`: it gets every effect), or a
    mapping of channel names to callables (each gets its channel's effects). Checked when a
    transaction or an engine is built, so that a wrong one is named at once, not reported at
    every commit as an effect that could not be delivered.
    """
    if dispatcher is None or callable(dispatcher):
        return
    if isinstance(dispatcher, Mapping):
        for channel, target in dispatcher.items():
            if not isinstance(channel, str) or not callable(target):
                raise InvalidArgument(
                    "dispatcher must map channel names to callables, got "
                    f"{type(channel).__name__} -> {type(target).__name__}"
                )
        return
    raise InvalidArgument(
        "dispatcher must be a callable, a mapping of channel names to callables or None, "
        f"got {type(dispatcher).__name__}"
    )


#: Told of each effect delivered: `(channel, idempotency_key, step_id)`; it must not raise.
OnDelivered = Callable[[str, str, int], object]


def dispatch_effects(
    effects: Sequence[StagedEffect],
    dispatcher: Dispatcher | None,
    *,
    timeout: float = DEFAULT_TIMEOUT,
    on_delivered: OnDelivered | None = None,
) -> tuple[int, tuple[str, ...]]:
    """Deliver `effects` in order, each under a deadline of `timeout` seconds.

    Returns how many were delivered and a failure line per effect that was not; never raises
    for a delivery (see the module docstring). `InvalidArgument` if `timeout` is not a usable
    deadline (checked first, before anything is delivered).
    """
    timeout = check_timeout("timeout", timeout)
    if dispatcher is None:
        return 0, ()
    delivered = 0
    failures: list[str] = []
    for effect in effects:
        error = _deliver(effect, dispatcher, timeout)
        if error is None:
            delivered += 1
            if on_delivered is not None:
                on_delivered(effect.channel, effect.idempotency_key, effect.step_id)
        else:
            failures.append(_failure_line(effect, error))
    return delivered, tuple(failures)


def _deliver(effect: StagedEffect, dispatcher: Dispatcher, timeout: float) -> str | None:
    """Deliver one effect on a worker thread; return None, or the error."""
    target: Callable[..., object] | None
    target = dispatcher.get(effect.channel) if isinstance(dispatcher, Mapping) else dispatcher
    if target is None:
        return f"no dispatcher for channel `{effect.channel}`"
    return Attempt(partial(target, effect), timeout).run()


def _failure_line(effect: StagedEffect | OutboxEntry, error: str) -> str:
    return f"{effect.channel} effect {effect.idempotency_key} (step {effect.step_id}): {error}"


#: Outbox retries wait 0.5 s after the first failure, doubling up to 5 minutes.
OUTBOX_BACKOFF: Final = Backoff(base=0.5, max_wait=300.0)


def outbox_effect(entry: OutboxEntry) -> StagedEffect:
    """The staged effect an outbox entry holds."""
    return StagedEffect(
        tx_id=entry.tx_id,
        step_id=entry.step_id,
        channel=entry.channel,
        payload=json.loads(entry.payload),
        idempotency_key=entry.idempotency_key,
    )


def deliver_outbox(
    store: DurableStore,
    dispatcher: Dispatcher,
    *,
    tx_id: str | None = None,
    limit: int = 1000,
    clock: Callable[[], float] = time.time,
    timeout: float = DEFAULT_TIMEOUT,
    backoff: Backoff = OUTBOX_BACKOFF,
    on_delivered: OnDelivered | None = None,
) -> tuple[int, tuple[str, ...]]:
    """Deliver the due outbox entries (of one transaction, or all) in commit and staging order.

    Each delivery runs under a deadline of `timeout` seconds. Each delivered entry is marked
    delivered; each failure (timeouts included) is counted, keeps its error and is not offered
    again before `backoff.delay(attempts)` seconds have passed. A failure does not hold back the
    entries after it. Returns how many were delivered (and recorded so) and a failure line per
    entry that was not.

    Never raises for a delivery or for the store (see the module docstring): if the store
    cannot list the entries, that is the one failure line; if it cannot record an outcome, the
    entry stays pending, is offered again by the next run (`Engine.dispatch_pending`), possibly
    delivered twice, and the line says so. `InvalidArgument` if `timeout` is not a usable
    deadline (checked first).
    """
    timeout = check_timeout("timeout", timeout)
    try:
        # A store shared by several dispatchers (`PostgresStore`) hands each its own entries.
        if claims_effects(store):
            entries = store.claim_effects(limit, tx_id=tx_id, now=clock())
        else:
            entries = store.pending_effects(limit, tx_id=tx_id)
    except Exception as exc:  # noqa: BLE001  (reported: the commit before this stands)
        return 0, (f"outbox: the pending effects could not be read: {describe(exc)}",)
    now = clock()
    delivered = 0
    failures: list[str] = []
    for entry in entries:
        if entry.not_before > now:
            continue
        failure = _deliver_entry(
            store, dispatcher, entry, now=now, timeout=timeout, backoff=backoff
        )
        if failure is None:
            delivered += 1
            if on_delivered is not None:
                on_delivered(entry.channel, entry.idempotency_key, entry.step_id)
        else:
            failures.append(failure)
    return delivered, tuple(failures)


def _deliver_entry(
    store: DurableStore,
    dispatcher: Dispatcher,
    entry: OutboxEntry,
    now: float,
    *,
    timeout: float,
    backoff: Backoff,
) -> str | None:
    """Deliver one due entry and record the outcome in the store; None, or a failure line."""
    try:
        effect = outbox_effect(entry)
    except ValueError as exc:  # a payload that is not JSON (json.JSONDecodeError)
        error: str | None = f"unreadable payload: {describe(exc)}"
    else:
        error = _deliver(effect, dispatcher, timeout)
    try:
        if error is None:
            store.mark_delivered(entry.id)
            return None
        store.mark_failed(entry.id, error, now + backoff.delay(entry.attempts + 1))
    except Exception as exc:  # noqa: BLE001  (reported: the entry stays pending, see above)
        why = describe(exc)
        if error is None:
            error = f"delivered, but the outbox could not record it ({why}): it stays pending"
        else:
            error = f"{error}; the outbox could not record the failure ({why})"
        return _failure_line(entry, f"{error} and will be offered again")
    return _failure_line(entry, error)


def deliver_committed(
    effects: Sequence[StagedEffect],
    dispatcher: Dispatcher | None,
    store: Store,
    tx_id: str,
    *,
    timeout: float = DEFAULT_TIMEOUT,
    on_delivered: OnDelivered | None = None,
) -> tuple[int, tuple[str, ...]]:
    """Deliver a transaction's effects once its commit is durable; never raises for a failure.

    On a `DurableStore` the commit put them in its outbox: they are delivered from there (so a
    crash now loses none), or left for `Engine.dispatch_pending` when there is no dispatcher.
    """
    if not is_durable(store):
        return dispatch_effects(effects, dispatcher, timeout=timeout, on_delivered=on_delivered)
    if dispatcher is None or not effects:
        return 0, ()
    return deliver_outbox(
        store, dispatcher, tx_id=tx_id, timeout=timeout, on_delivered=on_delivered
    )
