"""The Saga side of a transaction: undo records and compensation, staged effects and delivery.

Compensations and deliveries are user code run under a deadline on worker threads; retries
wait by one `Backoff`.
"""

from __future__ import annotations

from ._attempts import DEFAULT_TIMEOUT as DEFAULT_TIMEOUT
from ._attempts import Attempt as Attempt
from ._backoff import Backoff as Backoff
from ._dispatch import OUTBOX_BACKOFF as OUTBOX_BACKOFF
from ._dispatch import Dispatcher as Dispatcher
from ._dispatch import EffectDispatcher as EffectDispatcher
from ._dispatch import JsonlDispatcher as JsonlDispatcher
from ._dispatch import check_dispatcher as check_dispatcher
from ._dispatch import deliver_committed as deliver_committed
from ._dispatch import deliver_outbox as deliver_outbox
from ._dispatch import dispatch_effects as dispatch_effects
from ._dispatch import outbox_effect as outbox_effect
from ._ledger import COMPENSATION_BACKOFF as COMPENSATION_BACKOFF
from ._ledger import STILL_RUNNING as STILL_RUNNING
from ._ledger import CompensationReport as CompensationReport
from ._ledger import SagaLedger as SagaLedger

__all__ = [
    "COMPENSATION_BACKOFF",
    "DEFAULT_TIMEOUT",
    "OUTBOX_BACKOFF",
    "STILL_RUNNING",
    "Attempt",
    "Backoff",
    "CompensationReport",
    "Dispatcher",
    "EffectDispatcher",
    "JsonlDispatcher",
    "SagaLedger",
    "check_dispatcher",
    "deliver_committed",
    "deliver_outbox",
    "dispatch_effects",
    "outbox_effect",
]
