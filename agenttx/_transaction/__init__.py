"""The interactive transaction: every tool call is a numbered step that can be rolled back.

`Transaction` (`_core`) is the public surface; it holds its parts, each an object with its
own contract, and delegates to them: the timeline (`_timeline.Timeline`: live steps, outputs,
effects, truncated together), the turn lock (`_turnlock.Calls`: calls run one at a time,
first come first served), the people desk (`_people.People`: approvals, reviews, the step
core's `Desk`, what blocks a step or the commit), the read-only views (`_views.Views`), the
step driver (`_pipeline.Pipeline`: the status, the step pipeline, the one rewind path,
rollback and commit) and the store's side of its end (`_record.Record`, with the durable log,
`_txlog.TxLog`, on a durable store). `call` and `call_turn` (`_turns`) are functions of the
transaction's public step API.
"""

from __future__ import annotations

from ._core import Transaction as Transaction
from ._core import plan_setting as plan_setting
from ._core import rewound_steps as rewound_steps
from ._core import turn_lock as turn_lock

__all__ = ["Transaction", "plan_setting", "rewound_steps", "turn_lock"]
