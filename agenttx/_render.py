"""Drawing graphs as DOT and Mermaid text: one renderer for steps, attempts and lineage.

Labels are quoted for each format, so any text (newlines, quotes) is drawn, never interpreted.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Final, NamedTuple

from ._errors import InvalidArgument

if TYPE_CHECKING:
    from collections.abc import Sequence

__all__ = ["STATUS_COLOURS", "DrawnEdge", "DrawnNode", "dot_quote", "mermaid_quote", "render_graph"]


class DrawnNode(NamedTuple):
    """A node to draw: its id, its label and, if it is not a plain live step, its status."""

    node_id: str
    label: str
    status: str | None = None


class DrawnEdge(NamedTuple):
    """An edge to draw between two node ids; dashed for an implicit (value-matched) edge."""

    source: str
    target: str
    label: str
    dashed: bool = False


#: Fill colours of the statuses a transaction marks its steps with, and of plan node states.
STATUS_COLOURS: Final = {
    "failed": "#f8d7da",
    "rewound": "#e2e3e5",
    "compensated": "#fff3cd",
    # ... and the states of a plan run's nodes
    "succeeded": "#d4edda",
    "running": "#cce5ff",
    "ready": "#e8f4fd",
    "pending": "#ffffff",
    "timed_out": "#f8d7da",
    "cancelled": "#e2e3e5",
    "skipped": "#e2e3e5",
}


def render_graph(nodes: Sequence[DrawnNode], edges: Sequence[DrawnEdge], fmt: str) -> str:
    """Draw nodes and edges as DOT or Mermaid, in the order given (callers sort them).

    A node with a status gets it in its label and a fill colour (a Mermaid class).
    """
    if fmt == "dot":
        lines = ["digraph agenttx {", "  rankdir=LR;", "  node [shape=box];"]
        for node in nodes:
            if node.status is None:
                lines.append(f"  {node.node_id} [label={dot_quote(node.label)}];")
            else:
                colour = STATUS_COLOURS.get(node.status, "#ffffff")
                label = dot_quote(f"{node.label} ({node.status})")
                lines.append(
                    f'  {node.node_id} [label={label}, style=filled, fillcolor="{colour}"];'
                )
        for edge in edges:
            style = ", style=dashed" if edge.dashed else ""
            lines.append(
                f"  {edge.source} -> {edge.target} [label={dot_quote(edge.label)}{style}];"
            )
        lines.append("}")
        return "\n".join(lines) + "\n"
    if fmt == "mermaid":
        lines = ["flowchart LR"]
        statuses: list[str] = []
        for node in nodes:
            if node.status is None:
                lines.append(f"  {node.node_id}[{mermaid_quote(node.label)}]")
            else:
                label = mermaid_quote(f"{node.label} ({node.status})")
                lines.append(f"  {node.node_id}[{label}]:::{node.status}")
                if node.status not in statuses:
                    statuses.append(node.status)
        for edge in edges:
            arrow = "-.->" if edge.dashed else "-->"
            lines.append(f"  {edge.source} {arrow}|{mermaid_quote(edge.label)}| {edge.target}")
        lines.extend(
            f"  classDef {status} fill:{STATUS_COLOURS.get(status, '#ffffff')}"
            for status in statuses
        )
        return "\n".join(lines) + "\n"
    raise InvalidArgument(f"format must be 'dot' or 'mermaid' here, got {fmt!r}")


def dot_quote(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'


def mermaid_quote(text: str) -> str:
    return '"' + text.replace('"', "#quot;").replace("\n", " ") + '"'
