"""Graph exports with the history of the steps: statuses, and exact snapshots of each format."""

from __future__ import annotations

import json

import pytest

import agenttx


def shop() -> agenttx.Transaction:
    """Create a user, charge them (undoable), fail on the order: a jump back to step 1."""

    @agenttx.compensation(name="refund")
    def refund(payload) -> None:
        del payload

    @agenttx.tool(name="create_user", inline=True)
    def create_user(name: str) -> dict:
        return {"user_id": f"u-{name}"}

    @agenttx.tool(name="charge", inline=True)
    def charge(ctx: agenttx.ToolContext, user_id: str) -> dict:
        ctx.register_undo("refund", {"user_id": user_id})
        return {"charge_id": "c-1"}

    @agenttx.tool(name="order", inline=True)
    def order(user_id: str, charge_id: str) -> dict:
        if user_id == "u-bad":
            raise agenttx.ToolError(
                'ERROR: insert or update on table "orders" violates foreign key constraint '
                f'"orders_user_id_fkey"\nDETAIL: Key (user_id)=({user_id}) is not present in '
                'table "users".'
            )
        return {"order_id": "o-1"}

    tx = agenttx.Transaction(tools=[refund, create_user, charge, order])
    tx.execute_step(1, "create_user", {"name": "bad"})
    tx.execute_step(2, "charge", {"user_id": "${steps.1.user_id}"})
    failed = tx.execute_step(
        3, "order", {"user_id": "${steps.1.user_id}", "charge_id": "${steps.2.charge_id}"}
    )
    assert failed.rollback_to_step == 1
    tx.execute_step(1, "create_user", {"name": "ada"})
    return tx


def test_history_marks_failed_rewound_and_compensated_steps():
    """The failed step is failed; the rewind undoes step 1 (rewound) and step 2 (compensated)."""
    tx = shop()
    assert [(a.step_id, a.tool_name, a.status.value) for a in tx.history] == [
        (1, "create_user", "rewound"),
        (2, "charge", "compensated"),
        (3, "order", "failed"),
        (1, "create_user", "live"),
    ]


def test_history_after_an_abort():
    """An abort undoes every live step."""
    tx = shop()
    tx.rollback()
    assert [a.status.value for a in tx.history] == ["rewound", "compensated", "failed", "rewound"]


def test_dot_export_snapshot():
    """The DOT export: live steps, each undone attempt coloured by status, then the edges."""
    tx = shop()
    tx.execute_step(2, "charge", {"user_id": "${steps.1.user_id}"})
    assert tx.export_graph("dot") == (
        "digraph agenttx {\n"
        "  rankdir=LR;\n"
        "  node [shape=box];\n"
        '  s1 [label="1: create_user"];\n'
        '  s2 [label="2: charge"];\n'
        '  a0 [label="1: create_user (rewound)", style=filled, fillcolor="#e2e3e5"];\n'
        '  a1 [label="2: charge (compensated)", style=filled, fillcolor="#fff3cd"];\n'
        '  a2 [label="3: order (failed)", style=filled, fillcolor="#f8d7da"];\n'
        '  s1 -> s2 [label="user_id"];\n'
        "}\n"
    )


def test_mermaid_export_snapshot():
    """The Mermaid export: the same graph, statuses as classes."""
    tx = shop()
    assert tx.export_graph("mermaid") == (
        "flowchart LR\n"
        '  s1["1: create_user"]\n'
        '  a0["1: create_user (rewound)"]:::rewound\n'
        '  a1["2: charge (compensated)"]:::compensated\n'
        '  a2["3: order (failed)"]:::failed\n'
        "  classDef rewound fill:#e2e3e5\n"
        "  classDef compensated fill:#fff3cd\n"
        "  classDef failed fill:#f8d7da\n"
    )


def test_json_export_snapshot():
    """The JSON export: nodes with ids and statuses, edges with keys and kinds."""
    tx = shop()
    tx.execute_step(2, "charge", {"user_id": "${steps.1.user_id}"})
    assert json.loads(tx.export_graph("json")) == {
        "nodes": [
            {"id": "s1", "step": 1, "tool": "create_user", "status": "live"},
            {"id": "s2", "step": 2, "tool": "charge", "status": "live"},
            {"id": "a0", "step": 1, "tool": "create_user", "status": "rewound"},
            {"id": "a1", "step": 2, "tool": "charge", "status": "compensated"},
            {"id": "a2", "step": 3, "tool": "order", "status": "failed"},
        ],
        "edges": [
            {
                "source": 1,
                "target": 2,
                "source_key": "user_id",
                "target_key": "user_id",
                "kind": "explicit",
            }
        ],
    }
    assert tx.export_graph("json") == tx.export_graph("json")  # deterministic


def test_export_refuses_an_unknown_format():
    """An unknown format is an InvalidArgument naming it."""
    with pytest.raises(agenttx.InvalidArgument, match="svg"):
        agenttx.Transaction().export_graph("svg")  # type: ignore[arg-type]
