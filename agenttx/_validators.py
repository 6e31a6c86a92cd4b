"""Validators for settings, in the shape attrs expects: `(instance, attribute, value)`.

One vocabulary for every setting, wherever it is given (a `Transaction` keyword, an
`EngineConfig` field, a durable record read back): each raises `InvalidArgument` naming the
setting and the value it refused, so the same mistake gets the same message everywhere.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

from ._errors import InvalidArgument

if TYPE_CHECKING:
    from collections.abc import Callable

__all__ = [
    "instance_of",
    "is_positive_int",
    "is_positive_number",
    "non_negative_int",
    "non_negative_number",
    "one_of",
    "optional",
    "positive_int",
    "positive_number",
]


def is_positive_number(value: object) -> bool:
    """A finite number > 0 (not a bool): what every time limit must be."""
    return (
        isinstance(value, (int, float))
        and not isinstance(value, bool)
        and math.isfinite(value)
        and value > 0
    )


def is_positive_int(value: object) -> bool:
    """An int > 0 (not a bool): what every count limit must be."""
    return isinstance(value, int) and not isinstance(value, bool) and value > 0


def positive_number(_instance: object, attribute: Any, value: object) -> None:
    """A finite number > 0, such as a time limit in seconds."""
    if not is_positive_number(value):
        raise InvalidArgument(f"{attribute.name} must be a number > 0, got {value!r}")


def positive_int(_instance: object, attribute: Any, value: object) -> None:
    """An integer > 0, such as a count limit."""
    if not is_positive_int(value):
        raise InvalidArgument(f"{attribute.name} must be an integer > 0, got {value!r}")


def non_negative_int(_instance: object, attribute: Any, value: object) -> None:
    """An integer >= 0, such as how many of something to keep."""
    if not (is_positive_int(value) or (type(value) is int and value == 0)):
        raise InvalidArgument(f"{attribute.name} must be an integer >= 0, got {value!r}")


def non_negative_number(_instance: object, attribute: Any, value: object) -> None:
    """A finite number >= 0, such as an age in seconds."""
    if not (is_positive_number(value) or (type(value) in (int, float) and value == 0)):
        raise InvalidArgument(f"{attribute.name} must be a finite number >= 0, got {value!r}")


def one_of(*choices: str) -> Callable[[object, Any, object], None]:
    """One of `choices`, compared by equality."""
    listed = ", ".join(repr(choice) for choice in choices)

    def check(_instance: object, attribute: Any, value: object) -> None:
        if not isinstance(value, str) or value not in choices:
            raise InvalidArgument(f"{attribute.name} must be one of {listed}, got {value!r}")

    return check


def instance_of(cls: type) -> Callable[[object, Any, object], None]:
    """An instance of `cls`."""

    def check(_instance: object, attribute: Any, value: object) -> None:
        if not isinstance(value, cls):
            raise InvalidArgument(f"{attribute.name} must be a {cls.__name__}, got {value!r}")

    return check


def optional(
    validator: Callable[[object, Any, object], None],
) -> Callable[[object, Any, object], None]:
    """None, or what `validator` accepts."""

    def check(instance: object, attribute: Any, value: object) -> None:
        if value is not None:
            validator(instance, attribute, value)

    return check
