"""Lineage of what agenttx ran: `${steps.N...}` references as explicit edges, step numbers read
from the step payloads (else counted), calls voided by a rewind, and agreement with `tx.graph`
(`agenttx._lineage._steps`, `lineage_from_openai`, `tx.lineage()`, `agenttx lineage`)."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import agenttx
from agenttx import EdgeKind, LineageEdge, LineageGraph, LineageNode, StepResult, ToolContext
from agenttx._lineage._steps import StepPayload, StepTracker, step_payload, with_references
from agenttx._refs import Dependency
from agenttx.testing import step_sequences

# ---------------------------------------------------------------- a transcript driven by agenttx


def for_model(result: StepResult, voided: list[int]) -> dict[str, Any]:
    """What the model is sent for `result`: `result.for_model()` where it exists, else the
    documented payload built from the result (`voided` are the steps the call rewound)."""
    method = getattr(result, "for_model", None)
    if method is not None:
        return method()  # type: ignore[no-any-return]
    payload: dict[str, Any] = {"ok": result.ok, "step": result.step_id}
    if result.ok:
        payload["output"] = result.output
    else:
        payload["error"] = result.hint.text if result.hint is not None else result.error
    payload["next_step"] = result.next_step_id
    if voided:
        payload["voided_steps"] = voided
    return payload


class Loop:
    """An agent loop over a real Transaction, recorded as an OpenAI chat transcript: one
    assistant message per model turn, one tool message (the step payload) per call."""

    def __init__(self, tx: agenttx.Transaction) -> None:
        self.tx = tx
        self.messages: list[dict[str, Any]] = [
            {"role": "system", "content": agenttx.__doc__},
            {"role": "user", "content": "Order 2 of sku-42 for ada@example.com."},
        ]
        self.calls = 0
        self.results: list[StepResult] = []

    def turn(self, *calls: tuple[str, dict[str, Any]]) -> list[StepResult]:
        """Send one model turn; its calls run in order and stop at the first failure."""
        tool_calls = []
        for name, arguments in calls:
            self.calls += 1
            tool_calls.append(
                {
                    "id": f"call_{self.calls}",
                    "type": "function",
                    "function": {"name": name, "arguments": json.dumps(arguments)},
                }
            )
        self.messages.append({"role": "assistant", "content": None, "tool_calls": tool_calls})
        results = []
        for call in tool_calls:
            live = {step.step_id for step in self.tx.steps}
            function = call["function"]
            result = self.tx.execute_step(
                self.tx.next_step_id, function["name"], function["arguments"]
            )
            voided = sorted(live - {step.step_id for step in self.tx.steps})
            payload = for_model(result, voided)
            self.messages.append(
                {"role": "tool", "tool_call_id": call["id"], "content": json.dumps(payload)}
            )
            results.append(result)
            if not result.ok:
                assert call is tool_calls[-1], "the scripted turns fail on their last call only"
        self.results.extend(results)
        return results


@agenttx.tool
def lookup_customer(email: str, refresh: bool = False) -> dict[str, str]:
    """The customer record; a stale cache gives an expired card unless refreshed."""
    card = "tok_live_0002" if refresh else "tok_expired_0001"
    return {"customer_id": "cus_8841", "card": card, "email": email}


@agenttx.compensation(name="release_stock")
def release_stock(payload: dict[str, Any]) -> None:
    RELEASED.append(payload["output"]["reservation_id"])


@agenttx.tool(compensate=release_stock)
def reserve_stock(sku: str, quantity: int) -> dict[str, str]:
    return {"reservation_id": f"res_{sku}_{quantity}_{len(RELEASED)}"}


@agenttx.compensation(name="refund")
def refund(payload: dict[str, Any]) -> None:
    raise AssertionError(f"no charge succeeds before the rewind: {payload}")


@agenttx.tool(compensate=refund)
def charge(customer_id: str, card: str, amount: int, reservation: str) -> dict[str, Any]:
    if "expired" in card:
        raise agenttx.ToolError(f"card {card} was declined: expired", key="card")
    return {"charge_id": f"ch_{customer_id}_{amount}", "reservation": reservation}


@agenttx.tool
def send_confirmation(ctx: ToolContext, customer: str, charge_id: str) -> dict[str, str]:
    return {"email_id": ctx.stage_effect("email", {"to": customer, "charge": charge_id})}


RELEASED: list[str] = []
SHOP = [lookup_customer, reserve_stock, charge, send_confirmation, release_stock, refund]
CHARGE = {
    "customer_id": "${steps.1.customer_id}",
    "card": "${steps.1.card}",
    "amount": 4200,
    "reservation": "${steps.2.reservation_id}",
}


def shop_run() -> tuple[Loop, list[agenttx.Edge]]:
    """The order workflow: the charge fails on the stale card step 1 gave, agenttx rewinds to
    step 1 (voiding steps 1 and 2), the model replays with a fresh lookup, then commits.
    Returns the loop and the explicit edges of `tx.graph` just before the commit."""
    RELEASED.clear()
    loop = Loop(agenttx.Transaction(tools=SHOP))
    loop.turn(("lookup_customer", {"email": "ada@example.com"}))
    reserve = ("reserve_stock", {"sku": "sku-42", "quantity": 2})
    failed = loop.turn(reserve, ("charge", CHARGE))[-1]
    assert failed.strategy is agenttx.RollbackStrategy.DEPENDENCY_JUMP
    assert (failed.rollback_to_step, failed.next_step_id) == (1, 1)
    loop.turn(("lookup_customer", {"email": "ada@example.com", "refresh": True}))
    confirm = {"customer": "ada@example.com", "charge_id": "${steps.3.charge_id}"}
    done = loop.turn(reserve, ("charge", CHARGE), ("send_confirmation", confirm))
    assert all(result.ok for result in done)
    explicit = [e for e in loop.tx.graph.edges() if e.kind is EdgeKind.EXPLICIT]
    assert len(loop.tx.commit().effects) == 1  # the email, staged once, out after the commit
    assert RELEASED == ["res_sku-42_2_0"]
    return loop, explicit


def described(edge: LineageEdge) -> tuple[object, ...]:
    """An edge as (source call, target call, value, keys) for comparisons."""
    keys = (edge.source_key, edge.target_key) if edge.explicit else ()
    return (edge.source.call_id, edge.target.call_id, edge.value, *keys)


def by_step(edges: Any) -> set[tuple[int | None, int | None, str | None, str | None]]:
    """Explicit lineage edges as graph edges: (source step, target step, keys)."""
    return {(e.source.step, e.target.step, e.source_key, e.target_key) for e in edges if e.explicit}


def test_a_transcript_driven_by_agenttx_links_its_references_and_skips_the_rewound_calls():
    """The order workflow's transcript: references are explicit edges from the call that was
    that step when the reference was sent, the calls the rewind undid are voided and keep no
    edge, a step sent again maps to its new call, and the value the model copied still links."""
    loop, _ = shop_run()
    graph = agenttx.lineage_from_openai(loop.messages)
    assert [(n.call_id, n.tool_name, n.step, n.voided) for n in graph.nodes] == [
        ("call_1", "lookup_customer", 1, True),
        ("call_2", "reserve_stock", 2, True),
        ("call_3", "charge", 3, False),  # failed, never live: not voided, and no edge
        ("call_4", "lookup_customer", 1, False),
        ("call_5", "reserve_stock", 2, False),
        ("call_6", "charge", 3, False),
        ("call_7", "send_confirmation", 4, False),
    ]
    assert [described(edge) for edge in graph.edges] == [
        ("call_4", "call_6", "${steps.1.card}", "card", "card"),
        ("call_4", "call_6", "${steps.1.customer_id}", "customer_id", "customer_id"),
        ("call_5", "call_6", "${steps.2.reservation_id}", "reservation_id", "reservation"),
        ("call_6", "call_7", "${steps.3.charge_id}", "charge_id", "charge_id"),
        ("call_4", "call_7", "ada@example.com"),  # copied by the model: a value edge
    ]
    # Without the references the transcript links nothing but the copied value.
    plain = agenttx.LineageRecorder()
    for iteration, message in enumerate(m for m in loop.messages if m["role"] == "assistant"):
        plain.on_iteration(iteration + 1)
        for call in message["tool_calls"]:
            arguments = json.loads(call["function"]["arguments"])
            plain.on_tool_start(call["id"], call["function"]["name"], arguments)
    assert plain.lineage().edges == ()


def test_the_transcript_lineage_agrees_with_the_transactions_graph():
    """The explicit edges of the transcript's live calls are the explicit edges of tx.graph,
    and tx.lineage() has them too."""
    loop, explicit = shop_run()
    expected = {(e.source, e.target, e.source_key, e.target_key) for e in explicit}
    assert len(expected) == 4
    assert by_step(agenttx.lineage_from_openai(loop.messages).edges) == expected


def test_step_numbers_come_from_the_payloads_not_from_counting():
    """Counting the calls would make the replayed lookup step 4; the payloads say step 1."""
    loop, _ = shop_run()
    payloads = [json.loads(m["content"]) for m in loop.messages if m["role"] == "tool"]
    assert [p["step"] for p in payloads] == [1, 2, 3, 1, 2, 3, 4]
    assert payloads[2]["voided_steps"] == [1, 2]
    assert payloads[2]["next_step"] == 1


def test_the_cli_shows_the_links_of_a_transcript_driven_by_agenttx(tmp_path, capsys):
    """`agenttx lineage` prints the references, the copied value and the voided calls."""
    from agenttx._cli import main  # noqa: PLC0415

    loop, _ = shop_run()
    path = tmp_path / "transcript.json"
    path.write_text(json.dumps(loop.messages))
    assert main(["lineage", str(path)]) == 0
    link = "  lookup_customer (call_4, step 1) -> "
    assert capsys.readouterr().out.splitlines() == [
        "7 tool calls, 5 links (4 by reference), 2 voided by a rewind",
        f"{link}charge (call_6, step 3)  ${{steps.1.card}}  card -> card",
        f"{link}charge (call_6, step 3)  ${{steps.1.customer_id}}  customer_id -> customer_id",
        (
            "  reserve_stock (call_5, step 2) -> charge (call_6, step 3)  "
            "${steps.2.reservation_id}  reservation_id -> reservation"
        ),
        (
            "  charge (call_6, step 3) -> send_confirmation (call_7, step 4)  "
            "${steps.3.charge_id}  charge_id -> charge_id"
        ),
        f'{link}send_confirmation (call_7, step 4)  "ada@example.com"',
        "  voided: lookup_customer (call_1, step 1)",
        "  voided: reserve_stock (call_2, step 2)",
    ]
    assert main(["lineage", str(path), "--format", "json"]) == 0
    document = json.loads(capsys.readouterr().out)
    assert document["nodes"][0] == {
        "call_id": "call_1",
        "index": 0,
        "iteration": 1,
        "step": 1,
        "tool_name": "lookup_customer",
        "voided": True,
    }
    assert document["edges"][0] == {
        "explicit": True,
        "source": 3,
        "source_key": "card",
        "target": 5,
        "target_key": "card",
        "value": "${steps.1.card}",
    }


def test_exports_draw_references_bold_and_voided_calls_dashed():
    """DOT: explicit edges bold with their keys, voided calls dashed; Mermaid: thick arrows."""
    loop, _ = shop_run()
    graph = agenttx.lineage_from_openai(loop.messages)
    dot = graph.to_dot()
    assert (
        '  n0 [label="call_1: lookup_customer (step 1, iteration 1, voided)", style=dashed];' in dot
    )
    assert '  n3 -> n5 [label="${steps.1.card}\\ncard -> card", style=bold];' in dot
    assert '  n3 -> n6 [label="ada@example.com"];' in dot
    mermaid = graph.to_mermaid()
    assert '  n3 ==>|"${steps.1.card}, card -> card"| n5' in mermaid


# ---------------------------------------------------------------- agreement with tx.graph


def without_references(value: Any) -> Any:
    """`value` with every string that holds `${` replaced by a plain one, as a model that
    gives up on a reference it got wrong and copies a value instead."""
    if isinstance(value, str):
        return "copied" if "${" in value else value
    if isinstance(value, list):
        return [without_references(item) for item in value]
    if isinstance(value, dict):
        return {key: without_references(item) for key, item in value.items()}
    return value


def run_steps(steps: list[Any]) -> tuple[agenttx.Transaction, Loop]:
    """Send generated steps through a real Transaction, one call a turn, following next_step_id
    through every rewind, until the last step succeeds, the transaction aborts, or 60 calls.
    A step that failed (a reference that cannot resolve) is sent without its references after
    that, so most runs rewind and then go on."""
    outputs = {step.step_id: step.output for step in steps}

    def tool(ctx: ToolContext, **_arguments: object) -> object:
        return outputs[ctx.step_id]

    names = sorted({step.tool_name for step in steps})
    tx = agenttx.Transaction(tools=dict.fromkeys(names, tool))
    loop = Loop(tx)
    fixed: dict[int, Any] = {}
    for _ in range(60):
        if tx.status is not agenttx.TxStatus.ACTIVE or tx.next_step_id > len(steps):
            break
        step = steps[tx.next_step_id - 1]
        arguments = fixed.get(step.step_id, step.arguments)
        if not loop.turn((step.tool_name, arguments))[0].ok:
            fixed[step.step_id] = without_references(step.arguments)
    return tx, loop


@settings(max_examples=60, deadline=None)
@given(step_sequences(max_steps=8))
def test_every_explicit_graph_edge_is_a_lineage_edge(steps):
    """Over random reference chains (rewinds and aborts included): tx.lineage()'s explicit edges
    are exactly tx.graph's, and so are those of the recorded transcript's live calls."""
    tx, loop = run_steps(steps)
    graph_edges = {
        (e.source, e.target, e.source_key, e.target_key)
        for e in tx.graph.edges()
        if e.kind is EdgeKind.EXPLICIT
    }
    lineage = tx.lineage()
    assert by_step(lineage.edges) == graph_edges
    assert [node.step for node in lineage.nodes] == [step.step_id for step in tx.steps]
    transcript = agenttx.lineage_from_openai(loop.messages)
    live = {f"call_{i + 1}" for i, result in enumerate(loop.results) if result.ok}
    kept = [e for e in transcript.edges if e.target.call_id in live]
    assert by_step(kept) == graph_edges
    # A live call is one of the transaction's live steps, and nothing live is voided.
    steps_live = {n.step for n in transcript.nodes if n.call_id in live and not n.voided}
    assert steps_live == {step.step_id for step in tx.steps}


def test_tx_lineage_marks_steps_and_adds_reference_edges():
    """tx.lineage(): each node knows its step; a reference is an explicit edge valued `${steps.N}`
    (the transaction keeps the keys, not the path) next to the value edge it carried."""
    loop, _ = shop_run()
    RELEASED.clear()
    tx = agenttx.Transaction(tools=SHOP)
    tx.execute_step(1, "lookup_customer", {"email": "ada@example.com", "refresh": True})
    tx.execute_step(2, "reserve_stock", {"sku": "sku-42", "quantity": 1})
    tx.execute_step(3, "charge", CHARGE)
    graph = tx.lineage()
    assert [n.step for n in graph.nodes] == [1, 2, 3]
    assert [described(e) for e in graph.edges] == [
        ("1", "3", "${steps.1}", "card", "card"),
        ("1", "3", "${steps.1}", "customer_id", "customer_id"),
        ("2", "3", "${steps.2}", "reservation_id", "reservation"),
        ("1", "3", "cus_8841"),  # then the values, as the resolved arguments are walked (in
        ("1", "3", "tok_live_0002"),  # the key order the call gave them)
        ("2", "3", "res_sku-42_1_0"),
    ]
    assert by_step(loop.tx.lineage().edges) == {  # committed: still its steps' lineage
        (1, 3, "card", "card"),
        (1, 3, "customer_id", "customer_id"),
        (2, 3, "reservation_id", "reservation"),
        (3, 4, "charge_id", "charge_id"),
    }


# ---------------------------------------------------------------- the rules, one by one


def call(call_id: str, name: str, arguments: object) -> dict[str, Any]:
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}


def assistant(*calls: dict[str, Any]) -> dict[str, Any]:
    return {"role": "assistant", "content": None, "tool_calls": list(calls)}


def tool(call_id: str, content: object) -> dict[str, Any]:
    text = content if isinstance(content, str) else json.dumps(content)
    return {"role": "tool", "tool_call_id": call_id, "content": text}


def ok(step: int, output: object, **extra: object) -> dict[str, object]:
    return {"ok": True, "step": step, "output": output, "next_step": step + 1, **extra}


def test_without_payloads_steps_are_counted():
    """Results that are not payloads: the n-th call is step n, and references still link;
    node steps stay None (no payload stated them)."""
    graph = agenttx.lineage_from_openai(
        [
            assistant(call("a", "find", {"q": "x"}), call("b", "get", {"id": "${steps.1.id}"})),
            tool("a", {"id": "ord-1"}),
            tool("b", "ok"),
            assistant(call("c", "ship", '{"order": "${steps.1.id}", "rec": "${steps.2}"}')),
            tool("c", "shipped"),
        ]
    )
    assert [n.step for n in graph.nodes] == [None, None, None]
    assert [described(e) for e in graph.edges] == [
        ("a", "b", "${steps.1.id}", "id", "id"),  # one turn: a ran before b
        ("a", "c", "${steps.1.id}", "id", "order"),
        ("b", "c", "${steps.2}", "rec", "rec"),
    ]


def test_a_payload_resets_the_count_and_a_missing_result_still_counts():
    """After a payload the count goes on from its next_step; a call without a result counts."""
    graph = agenttx.lineage_from_openai(
        [
            assistant(call("a", "t", {}), call("b", "t", {}), call("c", "t", {})),
            tool("a", ok(5, {"k": "v"}, next_step=7)),
            tool("c", "no payload"),  # b has no result: step 7; c is step 8
            assistant(call("d", "t", {"x": "${steps.7}", "y": "${steps.8}", "z": "${steps.5}"})),
        ]
    )
    assert [n.step for n in graph.nodes] == [5, None, None, None]
    assert [(e.source.call_id, e.value) for e in graph.edges] == [
        ("b", "${steps.7}"),
        ("c", "${steps.8}"),
        ("a", "${steps.5}"),
    ]


def test_a_failed_call_produces_nothing_and_its_step_is_sent_again():
    """A failed payload (a mistake resent, nothing rewound) is no producer: a reference to its
    step names the call that succeeded as that step next."""
    graph = agenttx.lineage_from_openai(
        [
            assistant(call("a", "t", {})),
            tool("a", ok(1, "first")),
            assistant(call("b", "t", {"bad": 1})),
            tool("b", {"ok": False, "step": 2, "error": "Hint: fix it.", "next_step": 2}),
            assistant(call("c", "t", {})),
            tool("c", ok(2, "second")),
            assistant(call("d", "t", {"v": "${steps.2}", "w": "${steps.1}"})),
            tool("d", ok(3, None)),
        ]
    )
    assert [(n.step, n.voided) for n in graph.nodes] == [
        (1, False),
        (2, False),
        (2, False),
        (3, False),
    ]
    assert [(e.source.call_id, e.target.call_id) for e in graph.edges] == [("c", "d"), ("a", "d")]


def test_a_rewind_voids_by_voided_steps_and_by_sending_a_step_again():
    """`voided_steps` voids the calls that were those steps; sending step N again voids the
    calls of steps >= N even when no payload said so (a history truncated by the integration)."""
    said = agenttx.lineage_from_openai(
        [
            assistant(call("a", "t", {}), call("b", "t", {"x": "${steps.1}"})),
            tool("a", ok(1, "A")),
            tool("b", ok(2, "B")),
            assistant(call("c", "t", {"y": "${steps.2}"})),
            tool("c", {"ok": False, "step": 3, "error": "e", "next_step": 2, "voided_steps": [2]}),
        ]
    )
    assert [n.voided for n in said.nodes] == [False, True, False]
    assert [described(e) for e in said.edges] == []  # a->b voided with b; b->c from a voided call
    unsaid = agenttx.lineage_from_openai(
        [
            assistant(call("a", "t", {})),
            tool("a", ok(1, "A")),
            assistant(call("b", "t", {"x": "${steps.1}"})),
            tool("b", ok(2, "B")),
            assistant(call("c", "t", {"x": "${steps.1}"})),
            tool("c", ok(2, "B2")),  # step 2 again: b was rewound
            assistant(call("d", "t", {"y": "${steps.2}"})),
            tool("d", ok(3, None)),
        ]
    )
    assert [n.voided for n in unsaid.nodes] == [False, True, False, False]
    assert [(e.source.call_id, e.target.call_id) for e in unsaid.edges] == [("a", "c"), ("c", "d")]


def test_an_abort_voids_every_call():
    """next_step 0 with every live step voided: nothing links, every earlier call is voided."""
    graph = agenttx.lineage_from_openai(
        [
            assistant(call("a", "t", {}), call("b", "t", {"x": "${steps.1}"})),
            tool("a", ok(1, "A")),
            tool("b", ok(2, "B")),
            assistant(call("c", "t", {"x": "${steps.2}"})),
            tool(
                "c", {"ok": False, "step": 3, "error": "e", "next_step": 0, "voided_steps": [1, 2]}
            ),
            assistant(call("d", "t", {"x": "${steps.1}"})),
            tool("d", "the transaction has ended"),
        ]
    )
    assert [n.voided for n in graph.nodes] == [True, True, False, False]
    assert graph.edges == ()


def test_payload_detection_is_strict():
    """A payload needs a bool `ok` and a `step` that is an int >= 0 or null (0 and null: not
    sent as a step), or `voided` true; odd `voided_steps` entries are skipped; anything else
    is a tool's own output."""
    assert step_payload({"step": 3}) is None  # a tool output with a `step` key
    assert step_payload({"ok": True}) is None
    assert step_payload({"ok": True, "step": "3"}) is None
    assert step_payload({"ok": 1, "step": 3}) is None
    assert step_payload({"ok": True, "step": True}) is None
    assert step_payload({"ok": True, "step": -1}) is None
    assert step_payload(["ok", "step"]) is None
    assert step_payload(
        {"ok": False, "step": 4, "error": "e", "next_step": "1", "voided_steps": [1, "2", None, 3]}
    ) == StepPayload(ok=False, step=4, next_step=None, voided_steps=(1, 3), result="e")
    assert step_payload({"ok": True, "step": 2, "voided_steps": "1,2"}) == StepPayload(
        ok=True, step=2, next_step=None, voided_steps=(), result=None
    )
    not_run = StepPayload(ok=False, step=None, next_step=2, voided_steps=(), result="Hint: ...")
    assert (
        step_payload({"ok": False, "step": None, "error": "Hint: ...", "next_step": 2}) == not_run
    )
    assert step_payload({"ok": False, "step": 0, "error": "Hint: ...", "next_step": 2}) == not_run
    assert step_payload({"ok": False, "voided": True, "error": "gone"}) == StepPayload(
        ok=False, step=None, next_step=None, voided_steps=(), result="gone", voided=True
    )


def test_a_call_that_was_not_run_claims_no_step():
    """A payload with step null (call_turn's NOT_RUN) or 0 (an integration's): the call names
    nothing, produces nothing, voids nothing, and the count goes on from its next_step."""
    graph = agenttx.lineage_from_openai(
        [
            assistant(call("a", "t", {})),
            tool("a", ok(1, "A")),
            assistant(
                call("b", "t", {"x": "${steps.1}"}),
                call("c", "t", {"x": "${steps.1}"}),
                call("d", "t", {"x": "${steps.1}"}),
            ),
            tool("b", {"ok": False, "step": 2, "error": "fix it", "next_step": 2}),
            tool("c", {"ok": False, "step": None, "error": "not run", "next_step": 2}),
            tool("d", {"ok": False, "step": 0, "error": "not run", "next_step": 2}),
            assistant(call("e", "t", {"x": "${steps.1}"}), call("f", "t", {"y": "${steps.2}"})),
            tool("e", ok(2, "E")),
            tool("f", "not a payload: counted as step 3"),
        ]
    )
    assert [(n.call_id, n.step, n.voided) for n in graph.nodes] == [
        ("a", 1, False),
        ("b", 2, False),
        ("c", None, False),
        ("d", None, False),
        ("e", 2, False),
        ("f", None, False),
    ]
    assert [(e.source.call_id, e.target.call_id) for e in graph.edges] == [
        ("a", "b"),  # b was sent (and failed): it named step 1
        ("a", "e"),
        ("e", "f"),
    ]


def test_a_result_rewritten_as_voided_voids_its_call():
    """An integration's `history="void"` replaces a voided call's result by one marked
    `voided`: that call is voided, and the replayed step maps to its new call."""
    graph = agenttx.lineage_from_openai(
        [
            assistant(call("a", "t", {})),
            tool("a", {"ok": False, "step": 1, "voided": True, "error": "Voided by rollback"}),
            assistant(call("b", "t", {"x": "${steps.1}"})),
            tool("b", {"ok": False, "step": 2, "error": "e", "next_step": 1, "voided_steps": [1]}),
            assistant(call("c", "t", {})),
            tool("c", ok(1, "C")),
            assistant(call("d", "t", {"x": "${steps.1}"})),
            tool("d", ok(2, "D")),
        ]
    )
    assert [(n.call_id, n.voided) for n in graph.nodes] == [
        ("a", True),
        ("b", False),
        ("c", False),
        ("d", False),
    ]
    assert [(e.source.call_id, e.target.call_id) for e in graph.edges] == [("c", "d")]


def test_call_turn_results_read_back():
    """A turn run by tx.call_turn that stops at a failure: the calls it did not run claim no
    step, and the live calls' explicit edges are the graph's."""
    if not hasattr(agenttx.Transaction, "call_turn"):
        pytest.skip("tx.call_turn is not on this branch yet")
    tx = agenttx.Transaction(tools=SHOP)
    messages: list[dict[str, Any]] = []
    turns = [
        [("lookup_customer", {"email": "ada@example.com"})],
        [
            ("reserve_stock", {"sku": "sku-42", "quantity": 2}),
            ("charge", CHARGE),
            ("send_confirmation", {"customer": "ada", "charge_id": "${steps.3.charge_id}"}),
        ],
        [("lookup_customer", {"email": "ada@example.com", "refresh": True})],
        [("reserve_stock", {"sku": "sku-42", "quantity": 2}), ("charge", CHARGE)],
    ]
    count = 0
    for turn in turns:
        calls = []
        for name, arguments in turn:
            count += 1
            calls.append((name, json.dumps(arguments), f"call_{count}"))
        messages.append(assistant(*(call(i, n, a) for n, a, i in calls)))
        results = tx.call_turn(calls)  # type: ignore[attr-defined]
        messages.extend(tool(i, r.for_model()) for (_, _, i), r in zip(calls, results, strict=True))
    graph = agenttx.lineage_from_openai(messages)
    not_run = graph.nodes[3]
    assert (not_run.tool_name, not_run.step, not_run.voided) == ("send_confirmation", None, False)
    assert not any(e.target is not_run for e in graph.edges)
    expected = {
        (e.source, e.target, e.source_key, e.target_key)
        for e in tx.graph.edges()
        if e.kind is EdgeKind.EXPLICIT
    }
    assert by_step(graph.edges) == expected
    assert len(expected) == 3


def test_the_recorder_sees_a_payloads_output_not_the_payload():
    """Value edges come from the output (or, failed, the error marked as such), never from the
    payload's own fields: a step number or instruction text is not a value the call produced."""
    instruction = "Send step 2 next."
    graph = agenttx.lineage_from_openai(
        [
            assistant(call("a", "t", {})),
            tool("a", ok(1, {"id": "ord-1"}, instruction=instruction)),
            assistant(call("b", "t", {"order": "ord-1", "note": instruction})),
            tool("b", {"ok": False, "step": 2, "error": "declined-77", "next_step": 2}),
            assistant(call("c", "t", {"why": "declined-77"})),
        ],
        evidence=True,
    )
    assert [
        (e.source.call_id, e.target.call_id, e.value, e.source_failed) for e in graph.edges
    ] == [
        ("a", "b", "ord-1", False),
        ("b", "c", "declined-77", True),
    ]


def test_a_transcript_without_agenttx_is_exactly_the_recorders():
    """No payloads and no references: the same graph as the value recorder alone, no steps."""
    messages = [
        assistant(call("c1", "find", '{"q": "4411"}')),
        tool("c1", {"order_id": "ord-4411-x"}),
        assistant(call("c2", "refund", {"order": "ord-4411-x"})),
        tool("c2", "refunded"),
    ]
    recorder = agenttx.LineageRecorder()
    recorder.on_iteration(1)
    recorder.on_tool_start("c1", "find", {"q": "4411"})
    recorder.on_tool_end("c1", {"order_id": "ord-4411-x"})
    recorder.on_iteration(2)
    recorder.on_tool_start("c2", "refund", {"order": "ord-4411-x"})
    recorder.on_tool_end("c2", "refunded")
    assert agenttx.lineage_from_openai(messages) == recorder.lineage()


# ---------------------------------------------------------------- bad input


@pytest.mark.parametrize(
    "argument",
    [
        "${steps.x.id}",
        "${steps.1.}",
        "${steps.1..id}",
        "${steps.1.a b}",
        "${steps.1.id",
        "${ steps.1.id}",
        "$${steps.1.id}",  # an escape: the literal text, no reference
        "${steps.-1}",
        "${initial.email}",
        "${node.field}",
        "${}",
    ],
)
def test_malformed_references_link_nothing(argument):
    """Text the grammar does not read as a `${steps.N...}` reference is literal: no edge."""
    graph = agenttx.lineage_from_openai(
        [
            assistant(call("a", "t", {})),
            tool("a", ok(1, {"id": "ord-1"})),
            assistant(call("b", "t", {"x": argument, "y": [argument, {"z": argument}]})),
            tool("b", ok(2, None)),
        ]
    )
    assert graph.edges == ()


@pytest.mark.parametrize(
    "reference",
    [
        "${steps.0}",
        "${steps.9.id}",
        "${steps.2.id}",  # the consuming call's own step
        "${steps.3}",  # a later step
        "${steps.4294967297.id}",  # past 2**32 - 1: never a step
        "${steps." + "9" * 5000 + "}",
    ],
)
def test_references_to_unknown_steps_link_nothing(reference):
    """A reference to no step, to the call's own step or a later one, never links."""
    graph = agenttx.lineage_from_openai(
        [
            assistant(call("a", "t", {})),
            tool("a", ok(1, {"id": "ord-1"})),
            assistant(call("b", "t", {"x": reference})),
            tool("b", {"ok": False, "step": 2, "error": "unresolved", "next_step": 2}),
            assistant(call("c", "t", {})),
            tool("c", ok(3, None)),  # a step 3 exists, but only after b
        ]
    )
    assert graph.edges == ()


def test_a_reference_to_a_missing_key_still_names_the_step():
    """The edge says which step was referenced, whether or not the path existed in its output."""
    graph = agenttx.lineage_from_openai(
        [
            assistant(call("a", "t", {})),
            tool("a", ok(1, {"id": "ord-1"})),
            assistant(call("b", "t", {"x": "${steps.1.nope.0}"})),
            tool("b", {"ok": False, "step": 2, "error": "unresolved", "next_step": 2}),
        ]
    )
    assert [described(e) for e in graph.edges] == [("a", "b", "${steps.1.nope.0}", "nope", "x")]


@pytest.mark.parametrize(
    "messages",
    [
        [assistant(call("a", "t", "not json ${steps.1}"))],
        [assistant(call("a", "t", None)), tool("a", None)],
        [assistant(call("a", "t", {"x": "${steps.1}"})), tool("a", "[")],
        [tool("ghost", ok(1, "x")), assistant(call("a", "t", {"x": "${steps.1}"}))],
        [assistant({"id": "a", "function": "t"}), tool("a", ok(1, "x"))],
        [{"role": "tool", "tool_call_id": "a", "content": [{"type": "text", "text": "{"}]}],
        [assistant(call("a", "t", {1: "${steps.1}", "k": {None: "${steps.1}"}}))],
    ],
)
def test_malformed_transcripts_never_raise(messages):
    """Odd arguments, results, ids and keys are skipped: a graph comes back."""
    assert isinstance(agenttx.lineage_from_openai(messages), LineageGraph)


def test_a_repeated_result_does_not_renumber_a_call():
    """A call's first result counts for the step numbering; a second one changes nothing."""
    graph = agenttx.lineage_from_openai(
        [
            assistant(call("a", "t", {})),
            tool("a", ok(1, "A")),
            tool("a", ok(7, "A", voided_steps=[1])),
            assistant(call("b", "t", {"x": "${steps.1}"})),
        ]
    )
    assert [(n.step, n.voided) for n in graph.nodes] == [(1, False), (None, False)]
    assert [(e.source.call_id, e.target.call_id) for e in graph.edges] == [("a", "b")]


@pytest.mark.timeout(300)  # a hang guard (a quadratic pass takes hours here), not a speed check
def test_a_huge_transcript_is_read_with_one_edge_per_distinct_reference():
    """20,000 calls in a reference chain, one call with 100,000 references and a payload voiding
    100,000 steps: every call read, one edge per distinct reference."""
    messages: list[dict[str, Any]] = []
    for n in range(1, 20_001):
        arguments = {"prev": f"${{steps.{n - 1}.id}}"} if n > 1 else {}
        messages.append(assistant(call(f"c{n}", "t", arguments)))
        messages.append(tool(f"c{n}", ok(n, {"id": f"v{n}"})))
    messages.append(assistant(call("wide", "t", {"many": ["${steps.20000.id}"] * 100_000})))
    voided = list(range(1, 100_001))
    messages.append(
        tool("wide", {"ok": False, "step": 20_001, "error": "e", "voided_steps": voided})
    )
    graph = agenttx.lineage_from_openai(messages)
    assert len(graph.nodes) == 20_001
    assert sum(node.voided for node in graph.nodes) == 20_000
    assert graph.edges == ()  # every producer voided by the last payload
    messages.pop()  # without the voiding result: the chain, and the wide call's one edge
    graph = agenttx.lineage_from_openai(messages)
    assert len(graph.edges) == 20_000
    assert graph.edges[-1].target.call_id == "wide"


def test_the_tracker_voids_in_amortized_constant_time():
    """Sending step 1 again and again (a rewind each time) does not rescan the live steps."""
    tracker = StepTracker()
    for index in range(50_000):
        tracker.call(index, {"x": "${steps.1}"}, StepPayload(True, 1 + index % 2, None, (), None))
    assert len(tracker.voided) == 49_998
    assert len(tracker.explicit) == 25_000  # each step-2 call names the step-1 call before it


def test_with_references_keeps_a_graph_with_nothing_to_add():
    """No explicit edges, no steps, no voided calls: the very same graph object."""
    node = LineageNode(index=0, call_id="a", tool_name="t", iteration=1)
    graph = LineageGraph(nodes=(node,))
    assert with_references(graph, [], {}, ()) is graph


def test_an_explicit_edge_needs_its_keys():
    """LineageEdge(explicit=True) without source_key or target_key is refused; steps are ints."""
    node = LineageNode(index=0, call_id="a", tool_name="t", iteration=1)
    with pytest.raises(agenttx.InvalidArgument, match="source_key and a target_key"):
        LineageEdge(source=node, target=node, value="${steps.1}", explicit=True, source_key="k")
    with pytest.raises(agenttx.InvalidArgument, match="step"):
        LineageNode(index=0, call_id="a", tool_name="t", iteration=1, step=True)  # type: ignore[arg-type]
    with pytest.raises(agenttx.InvalidArgument, match="voided"):
        LineageNode(index=0, call_id="a", tool_name="t", iteration=1, voided=None)  # type: ignore[arg-type]


@given(st.lists(st.integers(min_value=-3, max_value=6), max_size=30), st.data())
@settings(max_examples=100, deadline=None)
def test_random_payload_sequences_keep_the_graph_valid(steps, data):
    """Any sequence of payload steps, voids and references gives a valid graph whose edges
    join live calls, from a lower step to a higher one."""
    messages: list[dict[str, Any]] = []
    for n, step in enumerate(steps):
        reference = data.draw(st.integers(min_value=0, max_value=7))
        messages.append(assistant(call(f"c{n}", "t", {"x": f"${{steps.{reference}}}"})))
        voided = data.draw(st.lists(st.integers(min_value=0, max_value=7), max_size=3))
        payload = {"ok": data.draw(st.booleans()), "step": step, "voided_steps": voided}
        messages.append(tool(f"c{n}", payload))
    graph = agenttx.lineage_from_openai(messages)
    for edge in graph.edges:
        assert not edge.source.voided
        assert not edge.target.voided
        assert edge.source.index < edge.target.index
        source_step = int(edge.value.removeprefix("${steps.").removesuffix("}"))
        assert edge.source.step in {source_step, None}  # None: not a payload, counted
        assert edge.target.step is None or source_step < edge.target.step


def test_dependency_objects_are_the_graphs():
    """lineage_from_steps reads `dependencies` as the transaction keeps them, and skips the rest."""

    class Step:
        def __init__(self, step_id: int, dependencies: object) -> None:
            self.step_id = step_id
            self.tool_name = "t"
            self.arguments = None
            self.output = None
            self.dependencies = dependencies

    dependency = Dependency(from_step=1, source_key="id", target_key="user")
    graph = agenttx.lineage_from_steps(
        [
            Step(1, (dependency,)),  # from its own step: dropped
            Step(2, [dependency, "junk", Dependency(from_step=5, source_key="a", target_key="b")]),
            Step(3, "not a tuple"),
        ]
    )
    assert [described(e) for e in graph.edges] == [("1", "2", "${steps.1}", "id", "user")]


@pytest.mark.parametrize("history", ["truncate", "void", "keep"])
def test_transcripts_of_the_openai_integration_agree_with_the_graph(history):
    """The order workflow run by `agenttx.integrations.openai.ToolRunner` under each history
    policy: the live calls' explicit edges are tx.graph's, and the calls the rewind undid are
    voided where the history still holds them."""
    atx_openai = pytest.importorskip("agenttx.integrations.openai")
    scripted = pytest.importorskip("_scripted")
    shop = pytest.importorskip("_shop").Shop()
    tx = shop.transaction()
    model = scripted.ScriptedModel(scripted.order_script())
    client = model.openai()
    runner = atx_openai.ToolRunner(tx, history=history)
    messages: list[Any] = [{"role": "user", "content": "Order 2 x SKU-1 for ada@example.com."}]
    while True:
        reply = client.chat.completions.create(model="m", messages=messages, tools=runner.tools)
        if not reply.choices[0].message.tool_calls:
            break
        messages = runner.handle(messages, reply.choices[0].message)
    dumped = [m.model_dump() if hasattr(m, "model_dump") else m for m in messages]
    graph = agenttx.lineage_from_openai(json.loads(json.dumps(dumped)))
    expected = {
        (e.source, e.target, e.source_key, e.target_key)
        for e in tx.graph.edges()
        if e.kind is EdgeKind.EXPLICIT
    }
    assert expected
    assert by_step(graph.edges) == expected  # the failed reserve named a voided lookup only
    voided = [n.call_id for n in graph.nodes if n.voided]
    assert voided == ([] if history == "truncate" else ["call_lookup_old", "call_charge_1"])
