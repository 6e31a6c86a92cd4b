"""The one failure classifier: what a failed attempt means for the step or node that made it.

A transaction's rollback controller and a plan's retry policy both act on the same reading of
a failure: its Clean Hint (the key the tool named wins over the one the cleaner found),
whether it is transient (the tool's or the exception's verdict wins over the hint's
category), whether it timed out (a typed flag set where the deadline fired, never read back
from the message text), and whether it is a mistake of the agent's call (caught before any
tool ran). A mistake is never retried as transient.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, NamedTuple

import attrs

from .._hints import CleanHint, clean_error

if TYPE_CHECKING:
    from .._tools import Failure

__all__ = ["Classified", "classify"]


class Classified(NamedTuple):
    """A failure as the step core reads it."""

    hint: CleanHint
    transient: bool
    timed_out: bool
    mistake: bool

    @property
    def retryable(self) -> bool:
        """Whether the same call may be sent again as it is (transient, not a mistake)."""
        return self.transient and not self.mistake


def classify(failure: Failure) -> Classified:
    """Read `failure`: its hint, and whether it is transient, a timeout, a mistake."""
    hint = clean_error(failure.message)
    if failure.key is not None and failure.key != hint.key:
        hint = attrs.evolve(hint, key=failure.key)
    transient = hint.category.transient if failure.transient is None else failure.transient
    return Classified(hint, transient, failure.timed_out, failure.mistake)
