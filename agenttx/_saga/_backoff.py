"""How long to wait before trying again: one bounded exponential backoff for every retry."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Final, TypeGuard, final

import attrs

from .._errors import InvalidArgument

if TYPE_CHECKING:
    from collections.abc import Callable

__all__ = ["MAX_WAIT_LIMIT", "MIN_BASE", "Backoff"]

#: The longest wait a backoff may be given (a week): longer is a mistake, and the bound keeps
#: every power the delay computes far from overflowing.
MAX_WAIT_LIMIT: Final = 604_800.0
#: The shortest non-zero base (a microsecond), for the same reason: `max_wait / base` is bounded.
MIN_BASE: Final = 1e-6


def _is_number(value: object) -> TypeGuard[float]:
    """A finite int or float (not a bool)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _check_base(_: object, __: object, value: float) -> None:
    if not _is_number(value) or not (value == 0 or MIN_BASE <= value <= MAX_WAIT_LIMIT):
        raise InvalidArgument(
            f"base must be 0 or a number of seconds from {MIN_BASE:g} to {MAX_WAIT_LIMIT:g},"
            f" got {value!r}"
        )


def _check_factor(_: object, __: object, value: float) -> None:
    if not _is_number(value) or value < 1:
        raise InvalidArgument(f"factor must be a finite number >= 1, got {value!r}")


def _check_max_wait(_: object, __: object, value: float) -> None:
    if not _is_number(value) or not 0 <= value <= MAX_WAIT_LIMIT:
        raise InvalidArgument(
            f"max_wait must be a number of seconds from 0 to {MAX_WAIT_LIMIT:g}, got {value!r}"
        )


def _check_jitter(_: object, __: object, value: bool) -> None:
    if not isinstance(value, bool):
        raise InvalidArgument(f"jitter must be True or False, got {value!r}")


def _check_rng(_: object, __: object, value: Callable[[], float]) -> None:
    if not callable(value):
        raise InvalidArgument(f"rng must be a callable returning a float in [0, 1], got {value!r}")


def _system_random() -> Callable[[], float]:
    """`random.random`, loaded when a jittered backoff is made, not at `import agenttx`."""
    import random  # noqa: PLC0415

    return random.random


@final
@attrs.frozen(kw_only=True)
class Backoff:
    """The wait after the n-th failed attempt: `base * factor**(n - 1)`, at most `max_wait`.

    With `jitter`, the wait is drawn uniformly from `[0, that)` ("full jitter": callers that
    failed together do not retry together), using `rng` (a `random.random`-like callable; pass
    a seeded one for reproducible runs; values outside [0, 1] are clamped, NaN counts as 1).
    Without jitter `delay` is a pure function of `attempt`: never negative, non-decreasing, never
    above `max_wait`. The exponent is capped where the wait reaches `max_wait`, so no attempt
    number overflows. Every field is checked on construction (`InvalidArgument` names it):
    `base` is 0 or from `MIN_BASE` to `MAX_WAIT_LIMIT`, `factor >= 1`, `base <= max_wait <=
    MAX_WAIT_LIMIT`.
    """

    base: float = attrs.field(validator=_check_base)
    factor: float = attrs.field(default=2.0, validator=_check_factor)
    max_wait: float = attrs.field(validator=_check_max_wait)
    jitter: bool = attrs.field(default=False, validator=_check_jitter)
    rng: Callable[[], float] = attrs.field(
        factory=_system_random, validator=_check_rng, eq=False, repr=False
    )

    def __attrs_post_init__(self) -> None:
        if self.max_wait < self.base:
            raise InvalidArgument(
                f"max_wait must be >= base, got max_wait={self.max_wait!r}, base={self.base!r}"
            )

    def delay(self, attempt: int) -> float:
        """Seconds to wait after failed attempt number `attempt` (1 for the first failure).

        Raises `InvalidArgument` unless `attempt` is an integer >= 1.
        """
        if isinstance(attempt, bool) or not isinstance(attempt, int) or attempt < 1:
            raise InvalidArgument(f"attempt must be an integer >= 1, got {attempt!r}")
        wait = self._ceiling(attempt - 1)
        if self.jitter:
            draw = self.rng()
            if not 0.0 <= draw <= 1.0:  # NaN too
                draw = 0.0 if draw < 0.0 else 1.0
            wait *= draw
        return wait

    def _ceiling(self, exponent: int) -> float:
        if self.base == 0 or self.factor == 1:
            return float(self.base)
        # The last exponent whose wait stays below max_wait; beyond it the wait is max_wait and
        # the power is not computed. factor**cap <= max_wait / base <= MAX_WAIT_LIMIT / MIN_BASE,
        # so the power never overflows whatever `attempt` is.
        cap = math.floor(math.log(self.max_wait / self.base) / math.log(self.factor))
        if exponent > cap:
            return float(self.max_wait)
        return float(min(self.base * self.factor**exponent, self.max_wait))
