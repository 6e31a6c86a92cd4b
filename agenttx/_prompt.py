"""The system prompt that teaches a model the step protocol: `PROMPT` and `prompt(tools)`.

Models do best with agenttx when they reference earlier outputs (`${steps.N.path}`) instead of
copying values: a failure caused by a bad value then jumps back to the step that produced it.
`PROMPT` says so, with the numbering and what a rollback means; `prompt` adds the tools, and
with `plans=True` the plan format (`PLANS_PROMPT`), for a model offered `propose_plan`.
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

__all__ = ["PLANS_PROMPT", "PROMPT", "prompt"]

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


#: What `prompt(..., plans=True)` adds: the plan format a model proposes with `propose_plan`.
PLANS_PROMPT: Final[str] = """\
You may also propose a whole plan at once with the propose_plan tool, instead of calling the \
tools one step at a time. A plan is {"nodes": [...]}; each node calls one tool, has an "id" \
(letters, digits, _ and -) and maps the tool's arguments in "inputs". An input may take another \
node's output by reference: "${lookup.customer_id}" is the field customer_id of the output of \
node lookup, "${lookup}" all of it; a reference may sit inside a longer string. In a plan, \
references name node ids, not step numbers. A node runs once every node it references has \
succeeded, and nodes that do not wait for each other run at the same time; "after": ["charge"] \
makes a node wait for node charge though no value flows. A node may also set "retries" (0 to \
10, for transient failures) and "timeout" (seconds, at most 3600). For example, with tools \
lookup_customer, charge and send_email:

{"nodes": [
  {"id": "lookup", "tool": "lookup_customer", "inputs": {"email": "ada@example.com"}},
  {"id": "charge", "tool": "charge",
   "inputs": {"customer_id": "${lookup.customer_id}", "amount": 42}},
  {"id": "notify", "tool": "send_email", "after": ["charge"],
   "inputs": {"to": "ada@example.com", "text": "Order for ${lookup.customer_id} is paid"}}
]}

Use only the tools you are given. The plan is checked before anything runs: if it has \
problems, you are told every one of them (with "did you mean" suggestions) and nothing runs; \
fix them all and send the whole corrected plan again. Once it ran, you get each node's output \
or error.
"""


def prompt(tools_or_tx: object, *, plans: bool = False) -> str:
    """The system prompt for an agent using `tools_or_tx`: `PROMPT`, then one line per tool.

    `tools_or_tx` is a `Transaction`, an `Engine`, or the tools as a `Transaction` takes them
    (a list of tools and callables, or `{name: callable}`); each tool is listed by the name a
    provider sees (`ToolSpec.wire_name`) and the first line of its description, in registration
    order. With `plans=True`, `PLANS_PROMPT` (the plan format, with an example) comes before
    the tools, for a model offered the `propose_plan` tool (`plan_tool_spec`, or a runner's
    `plans=True`). Raises `InvalidArgument` for anything else (naming it), as `Transaction`
    does.
    """
    if not isinstance(plans, bool):
        raise InvalidArgument(f"plans must be True or False, got {plans!r:.80}")
    lines = [_line(spec) for spec in _tools(tools_or_tx)]
    text = f"{PROMPT}\n{PLANS_PROMPT}" if plans else PROMPT
    if not lines:
        return text
    return f"{text}\nTools:\n" + "\n".join(lines) + "\n"


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
