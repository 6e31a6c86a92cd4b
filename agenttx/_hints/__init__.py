"""Clean Hints: one-line, actionable hints from raw error text."""

from __future__ import annotations

from ._clean import MAX_HINT_CHARS as MAX_HINT_CHARS
from ._clean import MAX_INPUT_BYTES as MAX_INPUT_BYTES
from ._clean import CleanHint as CleanHint
from ._clean import HintCategory as HintCategory
from ._clean import add_constraint as add_constraint
from ._clean import clean_error as clean_error

__all__ = [
    "MAX_HINT_CHARS",
    "MAX_INPUT_BYTES",
    "CleanHint",
    "HintCategory",
    "add_constraint",
    "clean_error",
]
