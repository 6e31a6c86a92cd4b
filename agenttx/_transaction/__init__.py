"""The interactive transaction: every tool call is a numbered step that can be rolled back.

`Transaction` (`_core`) holds its parts, each an object with its own contract: the timeline
(`_timeline.Timeline`: live steps, outputs, effects, truncated together), the turn lock
(`_turnlock.Calls`: calls run one at a time, first come first served), the people desk
(`_people.People`: approvals, reviews, the step core's `Desk`, what blocks a step or the
commit), the read-only observers (`_views.Views`) and, on a durable store, the durable log
(`_txlog.TxLog`). The step pipeline and the one rewind path are the transaction's own;
`call` and `call_turn` (`_turns`) are functions of its public step API.
"""

from __future__ import annotations

from ._core import Transaction as Transaction

__all__ = ["Transaction"]
