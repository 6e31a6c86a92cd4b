"""The costs a tool reports (`ToolContext.add_cost`): their categories, and the check of each
amount (exact `Decimal`s, never floats)."""

from __future__ import annotations

from decimal import Decimal, InvalidOperation
from typing import Final

from .._errors import InvalidArgument

__all__ = ["COST_CATEGORIES", "check_cost"]

#: What a cost may be reported as (`ToolContext.add_cost`): model calls and tokens, tool
#: charges, infrastructure, and retry overhead.
COST_CATEGORIES: Final = ("model", "tool", "infrastructure", "retry")


def check_cost(amount: object, category: object) -> tuple[str, Decimal]:
    """`(category, amount)` of a reported cost, checked: see `ToolContext.add_cost`.

    Raises `InvalidArgument` for a float (binary fractions are inexact: pass a `Decimal` or a
    string), a bool, a string that is not a decimal number, a negative, NaN or infinite amount,
    or a category not in `COST_CATEGORIES`.
    """
    if category not in COST_CATEGORIES:
        raise InvalidArgument(
            f"add_cost: category must be one of {', '.join(COST_CATEGORIES)}, got {category!r}"
        )
    if isinstance(amount, float):
        raise InvalidArgument(
            f"add_cost: amount {amount!r} is a float, which is inexact; pass a Decimal or a "
            "string such as '0.002'"
        )
    if isinstance(amount, Decimal):
        value = amount
    elif isinstance(amount, int) and not isinstance(amount, bool):
        value = Decimal(amount)
    elif isinstance(amount, str) and len(amount) <= 64:
        try:
            value = Decimal(amount.strip())
        except InvalidOperation:
            raise InvalidArgument(f"add_cost: amount {amount!r} is not a decimal number") from None
    else:
        raise InvalidArgument(
            f"add_cost: amount must be a Decimal, an int or a decimal string, got {amount!r:.80}"
        )
    if not value.is_finite() or value < 0:
        raise InvalidArgument(f"add_cost: amount must be finite and >= 0, got {amount!r:.80}")
    return str(category), value
