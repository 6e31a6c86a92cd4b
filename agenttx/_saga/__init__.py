"""The Saga side of a transaction: undo records and compensation, staged effects and delivery."""

from __future__ import annotations

from ._dispatch import OUTBOX_BACKOFF as OUTBOX_BACKOFF
from ._dispatch import OUTBOX_MAX_WAIT as OUTBOX_MAX_WAIT
from ._dispatch import Dispatcher as Dispatcher
from ._dispatch import EffectDispatcher as EffectDispatcher
from ._dispatch import OutboxDispatcher as OutboxDispatcher
from ._dispatch import deliver_committed as deliver_committed
from ._dispatch import deliver_outbox as deliver_outbox
from ._dispatch import dispatch_effects as dispatch_effects
from ._dispatch import outbox_effect as outbox_effect
from ._ledger import BACKOFF_BASE as BACKOFF_BASE
from ._ledger import CompensationReport as CompensationReport
from ._ledger import SagaLedger as SagaLedger

__all__ = [
    "BACKOFF_BASE",
    "OUTBOX_BACKOFF",
    "OUTBOX_MAX_WAIT",
    "CompensationReport",
    "Dispatcher",
    "EffectDispatcher",
    "OutboxDispatcher",
    "SagaLedger",
    "deliver_committed",
    "deliver_outbox",
    "dispatch_effects",
    "outbox_effect",
]
