"""The system prompt that teaches a model the step protocol: `PROMPT` and `prompt(tools)`.

Models do best with agenttx when they reference earlier outputs (`${steps.N.path}`) instead of
copying values: a failure caused by a bad value then jumps back to the step that produced it.
`PROMPT` says so, with the numbering and what a rollback means; `prompt` adds the tools.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Final

from ._engine import Engine
from ._errors import InvalidArgument
from ._tools import ToolRegistry
from ._transaction import Transaction

if TYPE_CHECKING:
    from ._tools import ToolSpec

__all__ = ["PROMPT", "prompt"]

#: The static part of the system prompt: step numbering, references, rollbacks, resending.
PROMPT: Final[str] = """\
You act through tools inside a transaction. Every tool call is a numbered step: 1, 2, 3, ...
Each tool result says whether the step succeeded ("ok"), its output or an error, and "next_step", \
the number of the step you send next.

Use earlier results by reference, not by copying: write ${steps.N.path} in an argument to pass \
the value at `path` in the output of step N (for example ${steps.2.customer.id}, \
${steps.3.items.0.sku}, or ${steps.1} for the whole output). A reference may stand alone (the \
value keeps its type) or sit inside a longer string. When a step fails because of a bad value, \
the transaction traces the reference back to the step that produced it; a copied value cannot \
be traced.

When a step fails, the transaction may roll back: it undoes the steps that led to the failure \
and "next_step" goes back to an earlier number. Steps listed as voided were undone: their \
effects are gone and their outputs no longer exist, so do not reference them; send them again, \
changed as the error says, if they are still needed. If you are told to reset, forget the \
results of the voided steps entirely.

After a mistake (an unknown tool, malformed JSON, a missing or wrong argument), nothing is \
undone: fix the call and send the same step again. Follow the constraints you are given, and \
send calls one after another, in order; a call after a failed one in the same turn is not run \
and must be sent again.
"""


def prompt(tools_or_tx: object) -> str:
    """The system prompt for an agent using `tools_or_tx`: `PROMPT`, then one line per tool.

    `tools_or_tx` is a `Transaction`, an `Engine`, or the tools as a `Transaction` takes them
    (a list of tools and callables, or `{name: callable}`); each tool is listed by the name a
    provider sees (`ToolSpec.wire_name`) and the first line of its description, in registration
    order. Raises `InvalidArgument` for anything else (naming it), as `Transaction` does.
    """
    lines = [_line(spec) for spec in _tools(tools_or_tx)]
    if not lines:
        return PROMPT
    return f"{PROMPT}\nTools:\n" + "\n".join(lines) + "\n"


def _tools(source: object) -> tuple[ToolSpec, ...]:
    """The specs of the tools of `source`, in registration order."""
    if isinstance(source, (Transaction, Engine)):
        return source.tool_specs
    if isinstance(source, (ToolRegistry, Mapping)) or _is_tool_list(source):
        return ToolRegistry(source).specs()  # type: ignore[arg-type]  # the registry checks it
    raise InvalidArgument(
        f"prompt() takes a Transaction, an Engine, or a list of tools, got {type(source).__name__}"
    )


def _is_tool_list(source: object) -> bool:
    return isinstance(source, Iterable) and not isinstance(source, (str, bytes))


def _line(spec: ToolSpec) -> str:
    """`- wire_name: the first line of the description` (or just the name)."""
    summary = spec.description.strip().split("\n", 1)[0].strip()
    return f"- {spec.wire_name}: {summary}" if summary else f"- {spec.wire_name}"
