"""The rollback controller: what to do when a step fails.

Pure decision logic (`docs/protocol.md#rollback-controller`): no I/O, no clocks. The transaction
tells the controller which steps ran (`observe_step`) and, when a step fails, asks it for a
`RollbackDecision` (`decide`); applying the decision (compensations, store restore, truncation) is
the transaction's job.

`decide(K, key, root_cause)` follows `docs/protocol.md#decision-algorithm` exactly:

1. `K = max(K, 1)`; observe K; `attempt = ++retries[K]`, whatever strategy is chosen, jumps
   included.
2. Jump candidate, only when the hint has a key: `R = root_cause(K, key)`, kept only if
   `R < K` and `jumps[R] < max(D, 1)`; the candidate is a jump to R.
3. Otherwise, if `attempt <= D`, the candidate is a local backtrack to `max(K - attempt, 1)` at
   depth `attempt`.
4. No candidate: escalate ("local backtrack depth exhausted").
5. `cost = K - target + 1`. If `replayed + cost > budget(horizon)`, escalate ("replay budget
   exceeded"); a cheaper backtrack is not tried when a jump is too expensive.
6. Otherwise `replayed += cost`, `jumps[R] += 1` for a jump, and the candidate is the decision.

Escalation aborts once `global_resets >= max_global_resets`; before that it is a global reset,
which starts a new epoch: `retries`, `jumps` and `replayed` are cleared, `global_resets` and the
horizon are kept.

Transient retries (`docs/protocol.md#transient-retries`): a *transient* failure (timeout, rate
limit, 5xx, connection refused) first retries the same step, `RollbackStrategy.RETRY` to K, at most
`transient_retries` times per step per epoch and only while the retry's cost (one step) fits the
replay budget. A transient retry touches no counter but the step's transient count and the replayed
steps; it does not use a local attempt. When the retries are used up, or over budget, the failure
goes through the algorithm above unchanged, so with `transient_retries=0` every failure takes that
algorithm.

Mistakes (`docs/protocol.md#mistakes`): a failure the agent caused by the form of its call (an
unknown tool, malformed JSON, arguments that do not fit the tool's schema, a duplicate call id),
caught before any tool ran, is answered `RollbackStrategy.RESEND` to K: the same step is sent
again, with nothing undone. Only the mistake streak changes: the step and the number of consecutive
mistakes at it. The `mistake_retries + 1`-th consecutive mistake at one step, and every one after,
goes through the algorithm above (transient retries aside: a mistake is never transient). The
streak ends when another step is observed, when a failure at the step is not a mistake, and at a
global reset. With `mistake_retries=0` a mistake is decided exactly as any other failure, and the
counters stay exactly those of the reference.

Repeated failures (`docs/protocol.md#repeated-failures`): the caller may name a failure by its
`signature` (`failure_signature`: the tool, the hint's category and key, and the value under that
key, the bad value; all canonical arguments only when the key names none). A failure that is neither
resent nor retried and whose signature already caused `repeat_limit` rewinds is decided `ABORT` at
once ("repeated failure: ..."), whatever the counters would allow: the same call failing the same
way after a rewind shows the rewind did not help, and another one would only repeat its compensable
effects. The rewinds each signature caused are counted for the whole transaction (a global reset
keeps them), for the last `MAX_REPEATS` signatures. With `repeat_limit=0`, or without signatures,
nothing changes.
"""

from __future__ import annotations

import enum
import hashlib
import math
from typing import TYPE_CHECKING, Any, Final, TypeAlias, final

import attrs

from ._errors import InvalidArgument
from ._json import canonical_dumps

if TYPE_CHECKING:
    from collections.abc import Callable

    from ._json import JSONValue

__all__ = [
    "ControllerState",
    "RollbackController",
    "RollbackDecision",
    "RollbackPolicy",
    "RollbackStrategy",
    "failure_signature",
]

#: Upper bound of `max_local_depth`, `max_global_resets` and `transient_retries`.
MAX_POLICY_COUNT: Final = 16
MIN_REPLAY_BUDGET_FACTOR: Final = 0.1
MAX_REPLAY_BUDGET_FACTOR: Final = 1000.0

LOCAL_DEPTH_EXHAUSTED: Final = "local backtrack depth exhausted"
REPLAY_BUDGET_EXCEEDED: Final = "replay budget exceeded"
#: The start of the reason of an abort decided because a failure repeated itself.
REPEATED_FAILURE: Final = "repeated failure"
#: The signatures whose rewinds a controller counts (the most recent ones).
MAX_REPEATS: Final = 64
#: Keys compare ignoring ASCII case only, as the dependency graph compares them.
_ASCII_LOWER: Final = str.maketrans("ABCDEFGHIJKLMNOPQRSTUVWXYZ", "abcdefghijklmnopqrstuvwxyz")

# Below this a step count converts to float exactly, so the budget is computed in floats,
# multiplying left to right (see `RollbackPolicy.budget`); above it (unreachable: step ids stop at
# 2**32 - 1) the budget is computed exactly instead.
_EXACT_FLOAT_INT: Final = 2**53

#: Per-step counters as `(step, count)` pairs, steps strictly ascending, every count >= 1.
Counts: TypeAlias = tuple[tuple[int, int], ...]


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _check_int(name: str, value: object) -> None:
    if not _is_int(value):
        raise InvalidArgument(f"{name} must be an int, got {value!r}")


def _check_policy_count(_instance: object, attribute: attrs.Attribute[int], value: object) -> None:
    _check_int(attribute.name, value)
    assert isinstance(value, int)
    if value < 0:
        raise InvalidArgument(f"{attribute.name} must be >= 0, got {value}")
    if value > MAX_POLICY_COUNT:
        raise InvalidArgument(f"{attribute.name} must be <= {MAX_POLICY_COUNT}")


def _as_float(value: float) -> float:
    """Accept an int for a float field (`replay_budget_factor=2`); anything else is validated."""
    return float(value) if _is_int(value) else value


def _check_factor(_instance: object, attribute: attrs.Attribute[float], value: object) -> None:
    if not isinstance(value, float):
        raise InvalidArgument(f"{attribute.name} must be a float, got {value!r}")
    # NaN fails both comparisons, infinity the upper one.
    if not MIN_REPLAY_BUDGET_FACTOR <= value <= MAX_REPLAY_BUDGET_FACTOR:
        raise InvalidArgument(f"{attribute.name} must be within [0.1, 1000]")


class RollbackStrategy(enum.Enum):
    """What a transaction does about a step.

    The controller returns `RESEND`, `RETRY`, `LOCAL_BACKTRACK`, `DEPENDENCY_JUMP`,
    `GLOBAL_RESET` and `ABORT`. `NONE` (the step succeeded) and `MANUAL` (the caller rolled
    back) are never decided by the controller; they exist so results can say what happened.
    """

    NONE = "none"
    RETRY = "retry"  # re-run the failed step itself (transient failures only)
    RESEND = "resend"  # send the failed step again, fixed (mistakes only; nothing was undone)
    LOCAL_BACKTRACK = "local_backtrack"
    DEPENDENCY_JUMP = "dependency_jump"
    GLOBAL_RESET = "global_reset"
    MANUAL = "manual"
    ABORT = "abort"


@final
@attrs.frozen(kw_only=True)
class RollbackPolicy:
    """The rollback controller's knobs, validated on construction.

    `max_local_depth` (D, 0..=16) caps the local backtracks per failing step per epoch and, as
    `max(D, 1)`, the jumps per root step per epoch. `max_global_resets` (0..=16) caps the global
    resets; the next escalation aborts. `replay_budget_factor` (c, finite, within [0.1, 1000])
    scales the replay budget (`budget`). `transient_retries` (0..=16) caps the same-step retries
    of a transient failure per step per epoch; 0 turns them off. `mistake_retries` (0..=16) is
    the consecutive mistakes at one step answered `RESEND` before the next is decided as any
    failure; 0 decides every mistake as any failure (the reference behaviour). `repeat_limit`
    (0..=16) is the rewinds one failure signature (the same call failing the same way) may
    cause; the next failure with that signature aborts; 0 turns the check off (the reference
    behaviour).

    Raises `InvalidArgument` naming the field, with the messages of
    `docs/protocol.md#rollback-policy` for values above the range (`max_local_depth must be <= 16`,
    `replay_budget_factor must be within [0.1, 1000]`, ...). Booleans are not accepted as numbers.
    """

    max_local_depth: int = attrs.field(default=2, validator=_check_policy_count)
    max_global_resets: int = attrs.field(default=1, validator=_check_policy_count)
    replay_budget_factor: float = attrs.field(
        default=2.0, converter=_as_float, validator=_check_factor
    )
    transient_retries: int = attrs.field(default=1, validator=_check_policy_count)
    mistake_retries: int = attrs.field(default=3, validator=_check_policy_count)
    repeat_limit: int = attrs.field(default=1, validator=_check_policy_count)

    def budget(self, horizon: int) -> int:
        """The replay budget of an epoch at `horizon`: `max(1, ceil(c * n * ceil(log2(n + 1))))`.

        `n = max(horizon, 1)`. Computed in floats, multiplying left to right, which fixes the
        rounding (c = 0.1, horizon 8 gives ceil(3.2) = 4; see `docs/protocol.md#replay-budget`).
        Grows as O(n log n). Raises `InvalidArgument` if `horizon` is not an int.
        """
        _check_int("horizon", horizon)
        n = max(horizon, 1)
        log_term = n.bit_length()  # ceil(log2(n + 1)), exactly, for n >= 1
        if n < _EXACT_FLOAT_INT:
            raw = math.ceil(self.replay_budget_factor * n * log_term)
        else:
            import fractions  # noqa: PLC0415  (rarely needed: not at `import agenttx`)

            raw = math.ceil(fractions.Fraction(self.replay_budget_factor) * n * log_term)
        return max(1, raw)


def _check_optional_str(_instance: object, attribute: attrs.Attribute[Any], value: object) -> None:
    if value is not None and not isinstance(value, str):
        raise InvalidArgument(f"{attribute.name} must be a string or None, got {value!r}")


def _check_non_negative(_instance: object, attribute: attrs.Attribute[int], value: object) -> None:
    _check_int(attribute.name, value)
    assert isinstance(value, int)
    if value < 0:
        raise InvalidArgument(f"{attribute.name} must be >= 0, got {value}")


def _check_strategy(_instance: object, attribute: attrs.Attribute[Any], value: object) -> None:
    if not isinstance(value, RollbackStrategy):
        raise InvalidArgument(f"{attribute.name} must be a RollbackStrategy, got {value!r}")


@final
@attrs.frozen(kw_only=True)
class RollbackDecision:
    """What the controller decided for a failed step.

    `target_step` is where the transaction resumes: K for `RETRY` and `RESEND`, the root step R for
    `DEPENDENCY_JUMP`, `max(K - depth, 1)` for `LOCAL_BACKTRACK`, and 0 for `GLOBAL_RESET` and
    `ABORT` (a global reset then resumes at step 1; an abort ends the transaction). `depth` is
    the local backtrack depth (the attempt number), 0 for every other strategy. `root_key` is
    the hint key that drove a jump. `reason` is set for `GLOBAL_RESET` ("local backtrack depth
    exhausted" or "replay budget exceeded") and `ABORT` ("{reason}; global reset budget ({max})
    exhausted", or for a repeated failure "repeated failure: ..."), and None otherwise.
    """

    strategy: RollbackStrategy = attrs.field(validator=_check_strategy)
    target_step: int = attrs.field(validator=_check_non_negative)
    depth: int = attrs.field(default=0, validator=_check_non_negative)
    root_key: str | None = attrs.field(default=None, validator=_check_optional_str)
    reason: str | None = attrs.field(default=None, validator=_check_optional_str)


def _check_counts(_instance: object, attribute: attrs.Attribute[Counts], value: object) -> None:
    problem = f"controller state {attribute.name} must be a tuple of (step, count) int pairs"
    if not isinstance(value, tuple):
        raise InvalidArgument(f"{problem}, got {value!r}")
    previous = 0
    for pair in value:
        if not (
            isinstance(pair, tuple) and len(pair) == 2 and _is_int(pair[0]) and _is_int(pair[1])
        ):
            raise InvalidArgument(f"{problem}, got {pair!r} in it")
        step, count = pair
        if step <= previous:
            raise InvalidArgument(
                f"controller state {attribute.name} must list steps >= 1 in strictly "
                f"ascending order, got step {step} after {previous}"
            )
        if count < 1:
            raise InvalidArgument(
                f"controller state {attribute.name} counts must be >= 1, "
                f"got {count} for step {step}"
            )
        previous = step


_STATE_COUNTS: Final = ("retries", "jumps", "transient_retries", "mistakes")
_STATE_TOTALS: Final = ("replayed_steps", "global_resets", "horizon")
#: Keys a state document may lack: it was written before them (their default is then taken).
_STATE_OPTIONAL: Final = frozenset({"mistakes", "repeats"})

#: Rewinds per failure signature, as `(signature, rewinds)` pairs, oldest signature first.
Repeats: TypeAlias = tuple[tuple[str, int], ...]


def failure_signature(tool: str, arguments: JSONValue, category: str, key: str | None) -> str:
    """What makes two failures the same for `decide(signature=)`, hashed (32 hex digits).

    With a `key` that names an argument (an object key anywhere in `arguments`, ignoring ASCII
    case): the tool, the hint's category, the key and the values under it (the bad value), in
    canonical JSON; the other arguments do not count, so that a call which only varies an
    argument the failure is not about fails "the same way". Without a key, or with one that
    names no argument: the tool, all its arguments, the category and the key. Pure; raises
    what `canonical_dumps` raises for a value that is not JSON.
    """
    if key is not None:
        found: list[JSONValue] = []
        _values_under(arguments, key.translate(_ASCII_LOWER), found)
        if found:
            text = canonical_dumps(["key", tool, category, key.translate(_ASCII_LOWER), found])
            return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()[:32]
    text = canonical_dumps([tool, arguments, category, key])
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()[:32]


def _values_under(value: JSONValue, lowered: str, found: list[JSONValue]) -> None:
    """Append to `found` every value held under an object key equal to `lowered` (ignoring
    ASCII case), depth first, object keys sorted; a value found is not searched further."""
    if isinstance(value, dict):
        for child in sorted(value):
            if isinstance(child, str) and child.translate(_ASCII_LOWER) == lowered:
                found.append(value[child])
            else:
                _values_under(value[child], lowered, found)
    elif isinstance(value, (list, tuple)):
        for item in value:
            _values_under(item, lowered, found)


def _check_repeats(_instance: object, attribute: attrs.Attribute[Repeats], value: object) -> None:
    problem = f"controller state {attribute.name} must be a tuple of (signature, count) pairs"
    if not isinstance(value, tuple):
        raise InvalidArgument(f"{problem}, got {value!r}")
    if len(value) > MAX_REPEATS:
        raise InvalidArgument(
            f"controller state {attribute.name} holds at most {MAX_REPEATS} signatures, "
            f"got {len(value)}"
        )
    seen: set[str] = set()
    for pair in value:
        if not (
            isinstance(pair, tuple)
            and len(pair) == 2
            and isinstance(pair[0], str)
            and pair[0]
            and _is_int(pair[1])
            and pair[1] >= 1
        ):
            raise InvalidArgument(f"{problem} with counts >= 1, got {pair!r} in it")
        if pair[0] in seen:
            raise InvalidArgument(
                f"controller state {attribute.name} lists signature {pair[0]!r} twice"
            )
        seen.add(pair[0])


def _check_streak(_instance: object, attribute: attrs.Attribute[Counts], value: object) -> None:
    _check_counts(_instance, attribute, value)
    assert isinstance(value, tuple)
    if len(value) > 1:
        raise InvalidArgument(
            f"controller state {attribute.name} must hold at most one (step, count) pair, "
            f"got {value!r}"
        )


@final
@attrs.frozen(kw_only=True)
class ControllerState:
    """A snapshot of a `RollbackController`'s counters, to persist and restore it.

    `retries` (local attempts per failing step), `jumps` (jumps per root step) and
    `transient_retries` (same-step retries per failing step) are this epoch's, as `(step, count)`
    pairs in ascending step order with counts >= 1; `replayed_steps` is this epoch's too.
    `mistakes` is the mistake streak: `((step, consecutive mistakes),)`, or empty.
    `global_resets`, `horizon` (the furthest step observed) and `repeats` (the rewinds each
    failure signature caused, oldest signature first, at most `MAX_REPEATS`) span the whole
    transaction. The default is a fresh controller's state. Validated on construction
    (`InvalidArgument`).
    """

    retries: Counts = attrs.field(default=(), validator=_check_counts)
    jumps: Counts = attrs.field(default=(), validator=_check_counts)
    transient_retries: Counts = attrs.field(default=(), validator=_check_counts)
    replayed_steps: int = attrs.field(default=0, validator=_check_non_negative)
    global_resets: int = attrs.field(default=0, validator=_check_non_negative)
    horizon: int = attrs.field(default=0, validator=_check_non_negative)
    mistakes: Counts = attrs.field(default=(), validator=_check_streak)
    repeats: Repeats = attrs.field(default=(), validator=_check_repeats)

    def to_json(self) -> dict[str, JSONValue]:
        """The state as a JSON object; `from_json` reads it back to an equal state.

        `mistakes` is written only when there is a streak, and `repeats` only when a signed
        failure caused a rewind, so that a controller that saw neither writes what earlier
        versions wrote.
        """
        document: dict[str, JSONValue] = {
            name: [[step, count] for step, count in getattr(self, name)]
            for name in _STATE_COUNTS
            if name not in _STATE_OPTIONAL or getattr(self, name)
        }
        for name in _STATE_TOTALS:
            document[name] = getattr(self, name)
        if self.repeats:
            document["repeats"] = [[signature, count] for signature, count in self.repeats]
        return document

    @classmethod
    def from_json(cls, document: JSONValue) -> ControllerState:
        """Read a state written by `to_json` (or before `mistakes` or `repeats` existed: without
        them); raises `InvalidArgument` if it is malformed."""
        expected = set(_STATE_COUNTS) | set(_STATE_TOTALS) | {"repeats"}
        if not isinstance(document, dict) or not (
            expected - _STATE_OPTIONAL <= set(document) <= expected
        ):
            raise InvalidArgument(
                f"controller state must be a JSON object with the keys {sorted(expected)}, "
                f"got {document!r}"
            )
        counts: dict[str, Counts] = {}
        for name in _STATE_COUNTS:
            pairs = document.get(name, [])
            if not isinstance(pairs, list) or not all(
                isinstance(pair, list) and len(pair) == 2 for pair in pairs
            ):
                raise InvalidArgument(
                    f"controller state {name} must be a list of [step, count] pairs, got {pairs!r}"
                )
            counts[name] = tuple((pair[0], pair[1]) for pair in pairs)  # type: ignore[index,misc]
        repeats = document.get("repeats", [])
        if not isinstance(repeats, list) or not all(
            isinstance(pair, list) and len(pair) == 2 for pair in repeats
        ):
            raise InvalidArgument(
                f"controller state repeats must be a list of [signature, count] pairs, "
                f"got {repeats!r}"
            )
        return cls(
            retries=counts["retries"],
            jumps=counts["jumps"],
            transient_retries=counts["transient_retries"],
            mistakes=counts["mistakes"],
            repeats=tuple((pair[0], pair[1]) for pair in repeats),  # type: ignore[index,misc]
            replayed_steps=document["replayed_steps"],  # type: ignore[arg-type]  # validated
            global_resets=document["global_resets"],  # type: ignore[arg-type]  # validated
            horizon=document["horizon"],  # type: ignore[arg-type]  # validated
        )


def _check_policy(_instance: object, attribute: attrs.Attribute[Any], value: object) -> None:
    if not isinstance(value, RollbackPolicy):
        raise InvalidArgument(f"{attribute.name} must be a RollbackPolicy, got {value!r}")


# Validated once, at construction (a hot path). Compared by identity: compare `state()`s.
@attrs.define(eq=False, repr=False, on_setattr=attrs.setters.NO_OP)
class RollbackController:
    """The rollback controller of one transaction (`docs/protocol.md#rollback-controller`).

    Pure and deterministic: its decisions depend only on the policy and the calls made so far,
    so a controller restored with `from_state(policy, c.state())` decides exactly as `c` would.
    Not thread-safe; a transaction serializes its calls. A decision is final once returned:
    the counters are already updated, and the caller must apply it. Compared by identity and
    hashable (equal counters are `c.state() == d.state()`); `repr` shows the counters only.
    """

    _policy: RollbackPolicy = attrs.field(validator=_check_policy)
    _retries: dict[int, int] = attrs.field(init=False, factory=dict)
    _jumps: dict[int, int] = attrs.field(init=False, factory=dict)
    _transient: dict[int, int] = attrs.field(init=False, factory=dict)
    # The mistake streak: consecutive mistakes (`_mistakes`) at one step (`_mistake_step`).
    _mistake_step: int = attrs.field(init=False, default=0)
    _mistakes: int = attrs.field(init=False, default=0)
    # Rewinds per failure signature, oldest signature first (dicts keep insertion order).
    _repeats: dict[str, int] = attrs.field(init=False, factory=dict)
    _replayed: int = attrs.field(init=False, default=0)
    _global_resets: int = attrs.field(init=False, default=0)
    _horizon: int = attrs.field(init=False, default=0)

    def __repr__(self) -> str:
        return (
            f"<RollbackController global_resets={self._global_resets} "
            f"replayed_steps={self._replayed} horizon={self._horizon}>"
        )

    @property
    def policy(self) -> RollbackPolicy:
        """The policy this controller applies."""
        return self._policy

    @property
    def horizon(self) -> int:
        """The furthest step observed; never reduced, not even by a global reset."""
        return self._horizon

    @property
    def global_resets(self) -> int:
        """The global resets decided so far."""
        return self._global_resets

    @property
    def replayed_steps(self) -> int:
        """The steps re-executed (or scheduled to be) in this epoch, by the decisions made."""
        return self._replayed

    @property
    def replay_budget(self) -> int:
        """The replay budget at the current horizon, `policy.budget(horizon)`."""
        return self._policy.budget(self._horizon)

    def observe_step(self, step: int) -> None:
        """Record that `step` is executing: the horizon becomes `max(horizon, step)`.

        The transaction calls this for every step it executes, whether it succeeds or not;
        `decide` calls it too. A step other than the one of the mistake streak ends the
        streak. Idempotent.
        """
        _check_int("step", step)
        self._observe(step)

    def _observe(self, step: int) -> None:
        """`observe_step` without the type check, for a step id already checked (the
        transaction's, by `check_call`): it runs on every step."""
        self._horizon = max(self._horizon, step)
        if self._mistakes and step != self._mistake_step:
            self._mistakes = 0

    def decide(
        self,
        failed_step: int,
        error_key: str | None,
        root_cause: Callable[[int, str], int | None],
        *,
        transient: bool = False,
        mistake: bool = False,
        signature: str | None = None,
    ) -> RollbackDecision:
        """Decide what to do about the failure of `failed_step` and update the counters.

        `error_key` is the Clean Hint's key, if any. `root_cause(step, key)` returns the step that
        produced the bad input `key` of `step`, or None (the transaction passes
        `graph.find_root_cause`); it is called at most once, with the clamped step and the key,
        and only when `error_key` is not None and neither a resend nor a transient retry is
        chosen. A root below 1 is treated as no root. `transient` says the failure's hint
        category is transient (timeout, rate_limited, http_server_error, connection_failure);
        `mistake` that the agent's call was malformed (`Failure.mistake`); ignored when
        `policy.mistake_retries` is 0. `signature` names the failure (`failure_signature`), so
        that the same call failing the same way after `policy.repeat_limit` rewinds aborts; a
        transient failure's is ignored. See the module docstring for the algorithm. Raises
        `InvalidArgument` for a non-int step, a key or signature that is neither a string nor
        None, before changing anything.
        """
        _check_int("failed_step", failed_step)
        if error_key is not None and not isinstance(error_key, str):
            raise InvalidArgument(f"error_key must be a string or None, got {error_key!r}")
        if signature is not None and not isinstance(signature, str):
            raise InvalidArgument(f"signature must be a string or None, got {signature!r}")
        policy = self._policy
        step = max(failed_step, 1)
        self.observe_step(step)
        if mistake and policy.mistake_retries:
            streak = self._mistakes + 1 if self._mistakes and self._mistake_step == step else 1
            self._mistake_step, self._mistakes = step, streak
            if streak <= policy.mistake_retries:
                return RollbackDecision(strategy=RollbackStrategy.RESEND, target_step=step)
            transient = False
        elif self._mistakes:
            self._mistakes = 0
        budget = policy.budget(self._horizon)

        used = self._transient.get(step, 0)
        if transient and used < policy.transient_retries and self._replayed + 1 <= budget:
            self._transient[step] = used + 1
            self._replayed += 1
            return RollbackDecision(strategy=RollbackStrategy.RETRY, target_step=step)

        if signature is None or transient or not policy.repeat_limit:
            return self._rewind(step, error_key, root_cause, budget)
        rewinds = self._repeats.get(signature, 0)
        if rewinds >= policy.repeat_limit:
            times = "once" if rewinds == 1 else f"{rewinds} times"
            return RollbackDecision(
                strategy=RollbackStrategy.ABORT,
                target_step=0,
                reason=(
                    f"{REPEATED_FAILURE}: the same call failed the same way after being "
                    f"rewound {times}"
                ),
            )
        decision = self._rewind(step, error_key, root_cause, budget)
        if decision.strategy is not RollbackStrategy.ABORT:
            self._repeats.pop(signature, None)  # counted as the most recent signature
            self._repeats[signature] = rewinds + 1
            if len(self._repeats) > MAX_REPEATS:
                del self._repeats[next(iter(self._repeats))]
        return decision

    def _rewind(
        self,
        step: int,
        error_key: str | None,
        root_cause: Callable[[int, str], int | None],
        budget: int,
    ) -> RollbackDecision:
        """Steps 3 to 8 of the decision algorithm: a jump, a backtrack or an escalation."""
        policy = self._policy
        attempt = self._retries.get(step, 0) + 1
        self._retries[step] = attempt

        candidate: RollbackDecision | None = None
        if error_key is not None:
            root = root_cause(step, error_key)
            if (
                root is not None
                and 1 <= root < step
                and self._jumps.get(root, 0) < max(policy.max_local_depth, 1)
            ):
                candidate = RollbackDecision(
                    strategy=RollbackStrategy.DEPENDENCY_JUMP, target_step=root, root_key=error_key
                )
        if candidate is None and attempt <= policy.max_local_depth:
            candidate = RollbackDecision(
                strategy=RollbackStrategy.LOCAL_BACKTRACK,
                target_step=max(step - attempt, 1),
                depth=attempt,
            )
        if candidate is None:
            return self._escalate(LOCAL_DEPTH_EXHAUSTED)

        cost = step - candidate.target_step + 1
        if self._replayed + cost > budget:
            return self._escalate(REPLAY_BUDGET_EXCEEDED)
        self._replayed += cost
        if candidate.strategy is RollbackStrategy.DEPENDENCY_JUMP:
            root = candidate.target_step
            self._jumps[root] = self._jumps.get(root, 0) + 1
        return candidate

    def _escalate(self, reason: str) -> RollbackDecision:
        limit = self._policy.max_global_resets
        if self._global_resets >= limit:
            return RollbackDecision(
                strategy=RollbackStrategy.ABORT,
                target_step=0,
                reason=f"{reason}; global reset budget ({limit}) exhausted",
            )
        self._global_resets += 1
        self._retries.clear()
        self._jumps.clear()
        self._transient.clear()
        self._mistakes = 0
        self._replayed = 0
        return RollbackDecision(
            strategy=RollbackStrategy.GLOBAL_RESET, target_step=0, reason=reason
        )

    def state(self) -> ControllerState:
        """A frozen snapshot of every counter; `from_state` restores it."""
        return ControllerState(
            retries=tuple(sorted(self._retries.items())),
            jumps=tuple(sorted(self._jumps.items())),
            transient_retries=tuple(sorted(self._transient.items())),
            replayed_steps=self._replayed,
            global_resets=self._global_resets,
            horizon=self._horizon,
            mistakes=((self._mistake_step, self._mistakes),) if self._mistakes else (),
            repeats=tuple(self._repeats.items()),
        )

    @classmethod
    def from_state(cls, policy: RollbackPolicy, state: ControllerState) -> RollbackController:
        """A controller applying `policy` from the counters in `state`.

        The state is taken as it is, even if it came from a different policy: counters beyond
        the new policy's caps simply leave fewer options (an exhausted reset budget aborts).
        """
        if not isinstance(state, ControllerState):
            raise InvalidArgument(f"state must be a ControllerState, got {state!r}")
        controller = cls(policy)
        controller._retries = dict(state.retries)
        controller._jumps = dict(state.jumps)
        controller._transient = dict(state.transient_retries)
        if state.mistakes:
            ((controller._mistake_step, controller._mistakes),) = state.mistakes
        controller._repeats = dict(state.repeats)
        controller._replayed = state.replayed_steps
        controller._global_resets = state.global_resets
        controller._horizon = state.horizon
        return controller
