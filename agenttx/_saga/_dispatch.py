"""Staged effects after a commit: dispatchers, and delivery from a durable store's outbox.

Staged effects are dispatched only after a commit, in staging order; dispatch errors are
reported and never undo the commit.
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Final, Protocol, final

from .._tools import StagedEffect, resolve_awaitable
from ._ledger import describe

if TYPE_CHECKING:
    from collections.abc import Sequence

    from ..stores import DurableStore, OutboxEntry

__all__ = [
    "OUTBOX_BACKOFF",
    "OUTBOX_MAX_WAIT",
    "Dispatcher",
    "EffectDispatcher",
    "OutboxDispatcher",
    "deliver_outbox",
    "dispatch_effects",
    "outbox_effect",
]


class EffectDispatcher(Protocol):
    """Delivers one committed staged effect.

    Called after the commit is durable, once per effect, in staging order, from the thread
    that committed. It may raise: the error is reported in `CommitResult.dispatch_errors` and
    the commit stands. It should be idempotent on `effect.idempotency_key`, which is stable.
    """

    def __call__(self, effect: StagedEffect, /) -> object: ...


@final
class OutboxDispatcher:
    """Appends each effect as one fsync'd JSON line to a local file, for a relay to deliver.

    Each line is `{"tx_id", "committed_at_ms", "step_id", "channel", "payload",
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
        from pathlib import Path  # noqa: PLC0415  (not loaded by `import agenttx`)

        with self._lock:
            path = Path(self.path)
            try:
                path.parent.mkdir(parents=True, exist_ok=True)
                with path.open("a", encoding="utf-8") as outbox:
                    outbox.write(line + "\n")
                    outbox.flush()
                    os.fsync(outbox.fileno())
            except OSError as exc:
                raise OSError(f"open outbox {self.path}: {exc}") from exc

    def __repr__(self) -> str:
        return f"OutboxDispatcher({self.path!r})"


Dispatcher = EffectDispatcher | Callable[..., object] | Mapping[str, Callable[..., object]]


def dispatch_effects(
    effects: Sequence[StagedEffect], dispatcher: Dispatcher | None
) -> tuple[int, tuple[str, ...]]:
    """Deliver `effects` in order; return how many were delivered and an error line per failure."""
    if dispatcher is None:
        return 0, ()
    delivered = 0
    errors: list[str] = []
    for effect in effects:
        error = _deliver(effect, dispatcher)
        if error is None:
            delivered += 1
        else:
            errors.append(_dispatch_error(effect, error))
    return delivered, tuple(errors)


def _deliver(effect: StagedEffect, dispatcher: Dispatcher) -> str | None:
    """Deliver one effect; return None, or the error."""
    target: Callable[..., object] | None
    target = dispatcher.get(effect.channel) if isinstance(dispatcher, Mapping) else dispatcher
    if target is None:
        return f"no dispatcher for channel `{effect.channel}`"
    try:
        resolve_awaitable(target(effect))
    except Exception as exc:  # noqa: BLE001  (reported; the commit stands)
        return describe(exc)
    return None


def _dispatch_error(effect: StagedEffect, error: str) -> str:
    return f"{effect.channel} effect {effect.idempotency_key} (step {effect.step_id}): {error}"


#: Outbox retries wait `OUTBOX_BACKOFF * 2**(attempts - 1)` seconds, at most `OUTBOX_MAX_WAIT`.
OUTBOX_BACKOFF: Final = 0.5
OUTBOX_MAX_WAIT: Final = 300.0


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
) -> tuple[int, tuple[str, ...]]:
    """Deliver the due outbox entries (of one transaction, or all) in commit and staging order.

    Each delivered entry is marked delivered; each failure is counted, keeps its error and
    waits a bounded, doubling backoff before it is offered again. A failure does not hold back
    the entries after it. Returns how many were delivered and an error line per failure. The
    store's own errors (`StorageError`) propagate: the entries stay pending.
    """
    now = clock()
    delivered = 0
    errors: list[str] = []
    for entry in store.pending_effects(limit, tx_id=tx_id):
        if entry.not_before > now:
            continue
        effect = outbox_effect(entry)
        error = _deliver(effect, dispatcher)
        if error is None:
            store.mark_delivered(entry.id)
            delivered += 1
        else:
            wait = min(OUTBOX_BACKOFF * (1 << min(entry.attempts, 20)), OUTBOX_MAX_WAIT)
            store.mark_failed(entry.id, error, now + wait)
            errors.append(_dispatch_error(effect, error))
    return delivered, tuple(errors)
