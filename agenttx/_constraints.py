"""A transaction's constraints: every distinct hint so far, and which are transient.

A hint added by a transient failure (a timeout, a rate limit, a 5xx, a refused connection)
holds only until the step that failed succeeds: it is then dropped from the constraints. The
transaction keeps the constraints as a list of texts and the transient ones as `(step, text)`
marks, both in its durable progress, so a resumed transaction drops the same ones. Pure: no
I/O, no locks (the transaction holds its state lock around these).
"""

from __future__ import annotations

from ._hints import add_constraint

__all__ = ["Marks", "add_hint", "without_transient"]

#: The transient constraints: `(step, hint text)`, oldest first.
Marks = list[tuple[int, str]]


def add_hint(
    constraints: list[str],
    marks: Marks,
    text: str,
    max_constraints: int,
    *,
    transient_step: int | None,
) -> None:
    """Add hint `text` to `constraints` (`add_constraint`), in place; if it is new and came
    from a transient failure of step `transient_step`, mark it to be dropped when that step
    succeeds. A text already present stays as it was (a lasting hint stays lasting)."""
    new = transient_step is not None and text not in constraints
    add_constraint(constraints, text, max_constraints)
    if new and text in constraints:
        assert transient_step is not None
        marks.append((transient_step, text))


def without_transient(
    constraints: list[str], marks: Marks, step: int
) -> tuple[list[str], Marks] | None:
    """The constraints and marks once step `step` has succeeded, or None if nothing changes.

    The texts marked for `step` are dropped, unless another step still marks the same text.
    The lists given are left unchanged: the caller swaps them in once the step is durable.
    """
    dropped = {text for marked, text in marks if marked == step}
    if not dropped:
        return None
    kept = [(marked, text) for marked, text in marks if marked != step]
    dropped -= {text for _, text in kept}
    return [text for text in constraints if text not in dropped], kept
