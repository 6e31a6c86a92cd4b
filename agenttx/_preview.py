"""What a rollback would do, worked out without doing it (`RollbackPreview`).

`preview_rollback` is a pure function of a transaction's live steps, its pending undo records
and its staged effects: the live transaction gives it its timeline and undo ledger
(`Transaction.preview_rollback`), the command line gives it what the durable log holds
(`agenttx inspect DB TX --preview STEP`). It follows the one rewind path: the undo records of
the steps at or after the target are compensated newest first, the effects those steps staged
are dropped, and the steps are voided; a target of 0 (an abort) voids every step.
"""

from __future__ import annotations

import copy
from typing import TYPE_CHECKING, final

import attrs

from ._errors import InvalidArgument

if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence

    from ._json import JSONValue
    from ._tools import StagedEffect, UndoRecord

__all__ = ["CompensationPreview", "RollbackPreview", "preview_rollback"]


@final
@attrs.frozen(kw_only=True)
class CompensationPreview:
    """One compensation a rollback would run: the step whose undo record it is, that step's
    tool, the record's compensation `kind` (`"fn"` for an in-memory callable, whose payload is
    not kept) and the `payload` it would be called with (a copy)."""

    step_id: int
    tool_name: str
    kind: str
    payload: JSONValue
    description: str


@final
@attrs.frozen(kw_only=True)
class RollbackPreview:
    """What `rollback(to_step)` would do now; computing it changes nothing.

    * `to_step`: the step that would run next (0 for an abort);
    * `voided_steps`: the live steps the rollback would void, in step order;
    * `compensations`: the compensations it would run, in the order it would run them (newest
      undo record first);
    * `dropped_effects`: the staged effects (emails, webhooks) it would drop, in staging order;
    * `irreversible`: the voided steps that left nothing to undo (no undo record, no staged
      effect). Their state writes are undone with the store, but whatever their tool did
      outside the transaction has happened and stays: a step of a read-only tool shows here too,
      as agenttx cannot tell one from the other.
    """

    to_step: int
    voided_steps: tuple[int, ...]
    compensations: tuple[CompensationPreview, ...]
    dropped_effects: tuple[StagedEffect, ...]
    irreversible: tuple[int, ...]

    @property
    def aborts(self) -> bool:
        """Whether the rollback would end the transaction (a rollback to 0)."""
        return self.to_step == 0

    def describe(self) -> str:
        """One line for a person or a model: what the rollback would undo."""
        if not self.voided_steps:
            return "nothing to undo"
        parts = [f"voids step(s) {_steps(self.voided_steps)}"]
        if self.compensations:
            runs = ", ".join(f"{c.kind} (step {c.step_id})" for c in self.compensations)
            parts.append(f"compensates {runs}")
        if self.dropped_effects:
            drops = ", ".join(f"{e.channel} (step {e.step_id})" for e in self.dropped_effects)
            parts.append(f"drops {drops}")
        if self.irreversible:
            parts.append(f"cannot undo what step(s) {_steps(self.irreversible)} did outside it")
        return "; ".join(parts)


def _steps(steps: Sequence[int]) -> str:
    return ", ".join(str(step) for step in steps)


def check_target(to_step: object, next_step: int) -> int:
    """`to_step` as a rollback target (None and 0 abort), as `rollback` checks it.

    Raises `InvalidArgument` for a target that is not an integer, or not lower than `next_step`.
    """
    if to_step is None:
        return 0
    if isinstance(to_step, bool) or not isinstance(to_step, int):
        raise InvalidArgument(f"to_step must be an integer, got {to_step!r}")
    if to_step and not 0 < to_step < next_step:
        raise InvalidArgument(f"to_step {to_step} must be lower than the next step {next_step}")
    return to_step


def preview_rollback(
    to_step: object,
    *,
    next_step: int,
    tools: Mapping[int, str],
    undos: Sequence[UndoRecord],
    effects: Sequence[StagedEffect],
) -> RollbackPreview:
    """What a rollback to `to_step` would do to live steps `tools` (step id -> tool name).

    `undos` are the pending undo records in registration order, `effects` the staged effects in
    staging order. Raises `InvalidArgument` for a target `rollback` would refuse.
    """
    target = check_target(to_step, next_step)
    first = max(target, 1)
    voided = tuple(sorted(step for step in tools if step >= first))
    taken = [record for record in undos if record.step_id >= first]
    dropped = tuple(effect for effect in effects if effect.step_id >= first)
    left = {record.step_id for record in taken} | {effect.step_id for effect in dropped}
    return RollbackPreview(
        to_step=target,
        voided_steps=voided,
        compensations=tuple(
            CompensationPreview(
                step_id=record.step_id,
                tool_name=tools.get(record.step_id, ""),
                kind=record.kind,
                payload=copy.deepcopy(record.payload),
                description=record.description,
            )
            for record in reversed(taken)
        ),
        dropped_effects=tuple(attrs.evolve(e, payload=copy.deepcopy(e.payload)) for e in dropped),
        irreversible=tuple(step for step in voided if step not in left),
    )
