"""Crash recovery: take over the transactions a dead process left open in a durable store.

`recover` reads each open transaction's durable log and either aborts it, the reference's
presumed abort (compensate its undo records newest first, then discard its state), or resumes
it (rebuild the `Transaction`, rewinding the step that was running when the process died). A
compensation that fails, or whose kind is not registered, stays in the store and is reported;
the next recovery tries it again.
"""

from __future__ import annotations

import json
import os
from functools import partial
from typing import TYPE_CHECKING, Literal, cast

from ._errors import AgentTxError, InvalidArgument
from ._results import RecoveryReport
from ._saga import SagaLedger
from ._transaction import Transaction
from ._txlog import end_keeping_undos, read_image

if TYPE_CHECKING:
    from collections.abc import Container

    from ._saga import Dispatcher
    from ._tools import ToolRegistry, UndoRecord
    from .stores import DurableStore

__all__ = ["owner_alive", "recover"]


def recover(
    store: DurableStore,
    registry: ToolRegistry,
    *,
    mode: Literal["abort", "resume"],
    dispatcher: Dispatcher | None,
    live: Container[str],
) -> tuple[RecoveryReport, list[Transaction]]:
    """Recover every open transaction of `store` not in `live` and not owned by a live process.

    Returns the report and, in resume mode, the resumed transactions.
    """
    if mode not in ("abort", "resume"):
        raise InvalidArgument(f"mode must be 'abort' or 'resume', got {mode!r}")
    taken = run = 0
    failures: list[str] = []
    resumed: list[Transaction] = []
    skipped: list[str] = []
    for tx_id in store.open_transactions():
        if tx_id in live:
            continue
        try:
            if owner_alive(store.owner(tx_id)):
                skipped.append(tx_id)
                continue
            image = store.load(tx_id)
            if image.record == "null":  # died between begin and its record: nothing durable
                store.discard(tx_id)
                taken += 1
                continue
            restored = read_image(image)
        except AgentTxError as exc:
            failures.append(f"{tx_id}: {exc}")
            continue
        taken += 1
        if mode == "resume" and restored.ended is None:
            try:
                tx, report = Transaction._resume(  # noqa: SLF001  (recovery builds transactions)
                    restored, registry=registry, store=store, dispatcher=dispatcher
                )
            except AgentTxError as exc:
                failures.append(f"{tx_id}: {exc}")
                continue
            run += report.succeeded
            failures.extend(f"{tx_id}: {line}" for line in report.failures)
            resumed.append(tx)
            continue
        ledger = SagaLedger(
            attempts=cast("int", restored.settings.get("compensation_retries", 3)),
            on_compensated=partial(_forget, store, tx_id),
        )
        report = ledger.compensate(
            sorted(restored.undos, key=lambda r: (r.step_id, r.seq), reverse=True),
            registry.compensations,
        )
        run += report.succeeded
        failures.extend(f"{tx_id}: {line}" for line in report.failures)
        if report.failures:  # the record and the failed undos stay, for next time
            end_keeping_undos(store, tx_id, restored.record, restored.ended or "ROLLED_BACK")
        else:
            store.discard(tx_id)
    return (
        RecoveryReport(
            transactions=taken,
            compensations_run=run,
            failures=tuple(failures),
            resumed=tuple(tx.id for tx in resumed),
            skipped=tuple(skipped),
        ),
        resumed,
    )


def _forget(store: DurableStore, tx_id: str, record: UndoRecord) -> None:
    store.forget_undo(tx_id, record.step_id, record.seq)


def owner_alive(owner: str | None) -> bool:
    """Whether `owner` (a store's JSON owner record) names another live process on this host.

    The record has `pid` and `hostname`. A process on another host, or one that no longer
    exists, does not count; neither does this process (its own transactions are excluded by
    the caller). PIDs can be reused, so a transaction whose owner died may wait for a process
    that took its pid; recovery never takes over one whose owner is alive.
    """
    if owner is None:
        return False
    try:
        record = json.loads(owner)
        pid, host = record["pid"], record["hostname"]
    except (ValueError, KeyError, TypeError):
        return False
    import socket  # noqa: PLC0415  (recovery alone needs it: not loaded by `import agenttx`)

    if host != socket.gethostname() or not isinstance(pid, int) or pid == os.getpid():
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # it exists, owned by another user
        return True
    return True
