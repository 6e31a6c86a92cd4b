"""The settings of a transaction: one frozen class, validated once, written to the durable log.

`Transaction` builds it from its keywords, `EngineConfig` hands its fields to it, and a
transaction resumed from its durable record reads it back with `from_record`: the same
validators (`_validators`) refuse the same mistakes with the same messages in all three.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Final, final

import attrs

from ._errors import InvalidArgument
from ._limits import DEFAULT_ISOLATION, ISOLATION_LEVELS, Isolation
from ._rollback import RollbackPolicy
from ._tools import to_json_value
from ._validators import instance_of, one_of, positive_int, positive_number

if TYPE_CHECKING:
    from ._json import JSONValue
    from ._tools import OutputSerializer

__all__ = ["DEFAULT_STEP_TIMEOUT", "Settings", "check_serializer", "float_seconds", "settings_of"]

DEFAULT_STEP_TIMEOUT: Final = 30.0


def float_seconds(value: object) -> object:
    """An int time limit becomes a float; anything else is left for the validator to refuse."""
    return float(value) if type(value) is int else value


def check_serializer(_: object, __: object, value: object) -> None:
    """An output serializer is a callable taking the output (`to_json_value` by default)."""
    if not callable(value):
        raise InvalidArgument(f"output_serializer must be a callable, got {type(value).__name__}")


@final
@attrs.frozen(kw_only=True)
class Settings:
    """How one transaction runs: its time limit, caps, isolation, rollback policy and outputs.

    `step_timeout` (seconds > 0) bounds each tool call; `max_constraints` (> 0) caps the hints
    kept; `compensation_retries` (> 0) is the attempts per compensation, each bounded by
    `compensation_timeout` seconds; `dispatch_timeout` bounds each delivery of a staged effect;
    `isolation` is one of `ISOLATION_LEVELS` (docs/protocol.md#isolation-levels); `policy`
    drives the rollback controller; `output_serializer` converts a tool output that is not JSON
    (docs/protocol.md#outputs). Raises `InvalidArgument` naming the setting. The serializer is
    code, not data: the durable record does not keep it, and a resumed transaction gets the
    one its engine passes.
    """

    step_timeout: float = attrs.field(
        default=DEFAULT_STEP_TIMEOUT, converter=float_seconds, validator=positive_number
    )
    max_constraints: int = attrs.field(default=32, validator=positive_int)
    compensation_retries: int = attrs.field(default=3, validator=positive_int)
    compensation_timeout: float = attrs.field(
        default=DEFAULT_STEP_TIMEOUT, converter=float_seconds, validator=positive_number
    )
    dispatch_timeout: float = attrs.field(
        default=DEFAULT_STEP_TIMEOUT, converter=float_seconds, validator=positive_number
    )
    isolation: Isolation = attrs.field(
        default=DEFAULT_ISOLATION, validator=one_of(*ISOLATION_LEVELS)
    )
    policy: RollbackPolicy = attrs.field(
        factory=RollbackPolicy, validator=instance_of(RollbackPolicy)
    )
    output_serializer: OutputSerializer = attrs.field(
        default=to_json_value, validator=check_serializer
    )

    def to_record(self) -> dict[str, JSONValue]:
        """The settings other than the policy and the serializer, as the durable record keeps
        them."""
        return {
            "isolation": self.isolation,
            "step_timeout": self.step_timeout,
            "max_constraints": self.max_constraints,
            "compensation_retries": self.compensation_retries,
            "compensation_timeout": self.compensation_timeout,
            "dispatch_timeout": self.dispatch_timeout,
        }

    @classmethod
    def from_record(
        cls,
        record: dict[str, JSONValue],
        policy: RollbackPolicy,
        output_serializer: OutputSerializer = to_json_value,
    ) -> Settings:
        """Read back what `to_record` wrote; raises `InvalidArgument` if it is malformed."""
        fields: dict[str, Any] = dict(record)
        unknown = set(fields) - {field.name for field in attrs.fields(cls)}
        if unknown or "policy" in fields or "output_serializer" in fields:
            raise InvalidArgument(f"unknown settings in the durable record: {sorted(unknown)}")
        return cls(policy=policy, output_serializer=output_serializer, **fields)


#: The settings already built, by their arguments and the arguments' types (`1 == 1.0 ==
#: True`, and a bool is refused where a number is asked): most transactions of a process share
#: a few, so one lookup replaces the checks of every field. Cleared when full.
_BUILT: dict[tuple[object, ...], Settings] = {}
_MAX_BUILT: Final = 64


def settings_of(**fields: Any) -> Settings:
    """`Settings(**fields)`, the same instance for the same arguments (settings are frozen).

    Raises what `Settings` raises; an argument that cannot be hashed is checked by `Settings`.
    """
    key = tuple((name, type(value), value) for name, value in fields.items())
    try:
        built = _BUILT.get(key)
    except TypeError:  # unhashable: `Settings` says what is wrong with it
        return Settings(**fields)
    if built is None:
        built = Settings(**fields)  # raises for a bad value: nothing is kept
        if len(_BUILT) >= _MAX_BUILT:
            _BUILT.clear()
        _BUILT[key] = built
    return built
