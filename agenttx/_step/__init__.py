"""The step core: the one lifecycle of a tool-call attempt, for transactions and plans alike.

A transaction's step and a plan's node are the same thing to the step core: a `Call` that was
prepared (references resolved, arguments checked), passes the approval gate, runs under its
deadline, and settles (success; a failure, classified; a late result; an unknown outcome). The
states and their legal transitions are `_lifecycle`; the failure classifier (`classify`: hint,
transient, a typed `timed_out`, mistake) is `_classify`; the guarded attempt (approval gate,
run, unknown outcome, status check, review) is `_gate`, a generator of actions that `_drive`'s
sync or async driver performs; an approver's edit is checked by `_edit.validate_edit` wherever
a person decides. The transaction and the plan runner hold what is theirs (which step comes
next, which node is ready) and ask the core the rest.
"""

from __future__ import annotations

from ._classify import Classified, classify
from ._drive import adrive, drive
from ._edit import EditCheck, edit_check, validate_edit
from ._gate import (
    Desk,
    Refused,
    Settled,
    Waiting,
    Where,
    attempt,
    blocking_request,
    decision_event,
    finish,
    unsettled,
)
from ._lifecycle import TRANSITIONS, Lifecycle, Phase

__all__ = [
    "TRANSITIONS",
    "Classified",
    "Desk",
    "EditCheck",
    "Lifecycle",
    "Phase",
    "Refused",
    "Settled",
    "Waiting",
    "Where",
    "adrive",
    "attempt",
    "blocking_request",
    "classify",
    "decision_event",
    "drive",
    "edit_check",
    "finish",
    "unsettled",
    "validate_edit",
]
