"""agenttx.integrations._common: specs from what a developer passes, a turn, the history rewrite."""

from __future__ import annotations

import asyncio
import functools
import json
import re
from pathlib import Path
from typing import Final

import pytest

import agenttx
from _shop import BAD_PLAN, EMAIL, OLD_EMAIL, TOOL_NAMES, Shop, bad_calls, order_plan
from agenttx.integrations import _common, _runs
from agenttx.integrations._framework import FrameworkRunner


def names(specs: tuple[agenttx.ToolSpec, ...]) -> list[str]:
    return [s.wire_name for s in specs]


def test_specs_from_every_accepted_form():
    """A transaction, an engine, one tool, a list and a mapping give the same specs."""
    shop = Shop()
    tx = shop.transaction()
    engine = agenttx.Engine(tools=shop.tools)
    assert names(_common.resolve_specs(tx, "t")) == list(TOOL_NAMES)
    assert names(_common.resolve_specs(engine, "t")) == list(TOOL_NAMES)
    assert names(_common.resolve_specs(shop.tools, "t")) == list(TOOL_NAMES)
    assert names(_common.resolve_specs(iter(shop.tools), "t")) == list(TOOL_NAMES)
    assert names(_common.resolve_specs(shop.tools[0], "t")) == ["lookup_customer"]
    assert names(_common.resolve_specs(agenttx._tools.ToolRegistry(shop.tools), "t")) == list(
        TOOL_NAMES
    )
    mapping = {"find": shop.tools[0]}
    assert names(_common.resolve_specs(mapping, "t")) == ["find"]


def test_plain_functions_are_tools_as_in_a_transaction():
    """A plain function (or a partial) in the list is registered as a tool, as Transaction does."""

    def ping(host: str) -> str:
        """Ping a host."""
        return host

    specs = _common.resolve_specs([ping, functools.partial(ping)], "t")
    assert names(specs)[0] == "ping"


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("lookup_customer", "got str"),
        (42, "got int"),
        ([None], "item 0 of the tools list is NoneType"),
        ([agenttx.Tool], "item 0 of the tools list is type"),
        ({"x": "not callable"}, r"tools\['x'\] is str"),
    ],
)
def test_non_tools_are_refused_by_name(value, message):
    """Anything but tools raises InvalidArgument naming the item and what it is."""
    with pytest.raises(agenttx.InvalidArgument, match=message):
        _common.resolve_specs(value, "tools()")


def test_history_and_transaction_checks():
    """A bad history value or a non-transaction is refused, naming it."""
    assert _common.check_history("void") == "void"
    with pytest.raises(agenttx.InvalidArgument, match="'rewind'"):
        _common.check_history("rewind")
    with pytest.raises(agenttx.InvalidArgument, match=r"Runner needs an agenttx\.Transaction"):
        _common.check_transaction(object(), "Runner")


def test_describe_is_short():
    """An offender is named by its type and a repr cut to 60 characters."""
    text = _common.describe("x" * 500)
    assert text.startswith("str 'xxx")
    assert len(text) < 80


def model_calls(calls):
    return [
        _common.ModelCall(call_id=f"c{i}", name=name, arguments=arguments)
        for i, (name, arguments) in enumerate(calls, 1)
    ]


def test_a_turn_gives_one_outcome_per_call_in_order():
    """The bad workflow in one turn: two successes, the failure, a call not run."""
    shop = Shop()
    tx = shop.transaction()
    outcomes = _common.run_turn(tx, model_calls(bad_calls()))
    assert [o.call_id for o in outcomes] == ["c1", "c2", "c3", "c4"]
    assert [o.is_error for o in outcomes] == [False, False, True, True]
    assert outcomes[2].result is not None
    assert outcomes[2].result.voided_call_ids == ("c1", "c2")
    assert outcomes[3].result is not None
    assert outcomes[3].result.status is agenttx.StepStatus.NOT_RUN
    assert shop.refunds == ["ch-1"]


def test_async_turn_matches_the_sync_one():
    """arun_turn runs the same turn through acall_turn."""
    tx = Shop().transaction()
    calls = model_calls([("lookup_customer", {"email": EMAIL})])
    (outcome,) = asyncio.run(_common.arun_turn(tx, calls))
    assert outcome.payload["ok"] is True
    assert _common.run_turn(tx, []) == ()


def test_unencodable_arguments_are_refused_not_raised():
    """Arguments that are not JSON (a set, NaN) refuse the step; nothing runs."""
    tx = Shop().transaction()
    (outcome,) = _common.run_turn(tx, model_calls([("lookup_customer", {1, 2})]))
    assert outcome.is_error
    assert "not JSON" in str(outcome.payload["error"])
    bad_id = _common.ModelCall(call_id="", name="lookup_customer", arguments="{}")
    (outcome,) = _common.run_turn(tx, [bad_id])
    assert "call id" in str(outcome.payload["error"])
    assert tx.next_step_id == 1


def test_rewrite_policies():
    """truncate drops and notes, void replaces, keep does nothing; a failed call stays."""
    tx = Shop().transaction()
    outcomes = _common.run_turn(tx, model_calls(bad_calls()))
    steps = {"c1": 1, "c2": 2}
    truncate = _common.rewrite_for("truncate", outcomes, steps)
    assert truncate.drop == frozenset({"c1", "c2"})
    assert set(truncate.notes) == {"c3"}
    void = _common.rewrite_for("void", outcomes, steps)
    assert void.replace == {"c1": _common.voided_payload(1), "c2": _common.voided_payload(2)}
    assert _common.rewrite_for("keep", outcomes, steps).empty
    assert _common.voided_payload(None)["error"].startswith("Voided by rollback: this step")


def test_hostile_arguments_are_refused_not_raised():
    """Arguments nested past the interpreter's recursion limit fail the step as the same JSON
    text does; arguments that are not JSON, or a hostile name, refuse the step."""
    deep: list[object] = []
    for _ in range(100_000):
        deep = [deep]
    tx = Shop().transaction()
    (outcome,) = _common.run_turn(tx, model_calls([("lookup_customer", {"email": deep})]))
    assert outcome.is_error
    text = '{"email": ' + "[" * 100_001 + "]" * 100_001 + "}"
    assert outcome.payload == Shop().transaction().call("lookup_customer", text).for_model()
    assert "Malformed JSON" in str(outcome.payload["error"])
    deep.append({1j})
    (outcome,) = _common.run_turn(tx, model_calls([("lookup_customer", {"email": deep})]))
    assert "not JSON" in str(outcome.payload["error"])
    (outcome,) = _common.run_turn(tx, model_calls([(None, "{}")]))
    assert "unknown tool None" in str(outcome.payload["error"])
    assert tx.next_step_id == 1


# ---------------------------------------------------------------- the documented mistakes table

CHARGE_ARGS: Final = {"customer_id": "c-1", "amount": 42}


def documented_mistakes() -> dict[str, tuple[str, str]]:
    """docs/integrations.md's table of what the model gets wrong: row -> (result, transaction)."""
    text = (Path(__file__).parent.parent / "docs" / "integrations.md").read_text(encoding="utf-8")
    table = text.split("| The model sent |", 1)[1].split("\n\n", 1)[0]
    rows = [line.strip("|").split(" | ") for line in table.splitlines()[2:]]
    return {sent.strip(): (says.strip(), tx.strip()) for sent, says, tx in rows}


def _after_a_charge(*calls: tuple[object, object, str]) -> tuple[Shop, list[_common.Payload]]:
    """Step 1 charges; then one turn of `calls` (name, arguments, call id)."""
    shop = Shop()
    tx = shop.transaction()
    assert tx.call("charge", CHARGE_ARGS, call_id="c1").ok
    turn = [_common.ModelCall(call_id=cid, name=n, arguments=a) for n, a, cid in calls]
    return shop, [outcome.payload for outcome in _common.run_turn(tx, turn)]


def _unknown_tool() -> list[_common.Payload]:
    shop, (payload,) = _after_a_charge(("refund_all", {}, "c2"))
    assert payload["error"] == (
        "Hint: Tool 'refund_all' does not exist. "
        "Use one of: charge, lookup_customer, reserve, send_confirmation."
    )
    assert (payload["step"], payload["next_step"]) == (2, 2)  # the same step again
    assert "send step 2 again" in str(payload["instruction"])
    assert (shop.calls, shop.refunds) == (["charge"], [])  # nothing runs, nothing is undone
    return [payload]


def _bad_arguments() -> list[_common.Payload]:
    shop, (malformed,) = _after_a_charge(("charge", '{"amount": ', "c2"))
    assert "Malformed JSON" in str(malformed["error"])
    shop2, (wrong,) = _after_a_charge(("charge", {"customer_id": "c-1", "amount": "x"}, "c2"))
    assert "`amount`, expected an integer" in str(wrong["error"])
    for payload in (malformed, wrong):
        assert (payload["step"], payload["next_step"]) == (2, 2)
    assert (shop.calls, shop.refunds, shop2.calls, shop2.refunds) == (
        ["charge"],
        [],
        ["charge"],
        [],
    )
    return [malformed, wrong]


def _reused_call_id() -> list[_common.Payload]:
    shop, (first, payload) = _after_a_charge(
        ("charge", CHARGE_ARGS, "c2"), ("charge", CHARGE_ARGS, "c2")
    )
    assert first["ok"] is True
    assert payload["error"] == (
        "Hint: Call id 'c2' was already used by step 2, which still stands. "
        "Send the call again with a call id of its own."
    )
    assert shop.calls == ["charge", "charge"]
    return [payload]


def _refused() -> list[_common.Payload]:
    shop, (long_name,) = _after_a_charge(("x" * 129, {}, "c2"))
    shop2, (huge,) = _after_a_charge(("charge", {"customer_id": "c" * 2_000_000}, "c2"))
    for payload in (long_name, huge):
        assert str(payload["error"]).startswith("Hint: Step 2 was refused: ")
    assert (shop.calls, shop2.calls) == (["charge"], ["charge"])
    return [long_name, huge]


def _too_many_calls() -> list[_common.Payload]:
    calls = [("charge", CHARGE_ARGS, f"c{n}") for n in range(2, 202)]
    shop, payloads = _after_a_charge(*calls)
    assert len(payloads) == 200  # every call is answered
    first, *rest = payloads
    assert first["error"] == (
        "Hint: Step 2 was refused: the turn has 200 tool calls, more than the 128 one turn may "
        "hold; send at most 128 per turn."
    )
    assert all(p["step"] is None and "step 2 was refused first" in str(p["error"]) for p in rest)
    assert shop.calls == ["charge"]  # none of the turn ran
    return [first]


def _after_the_end() -> list[_common.Payload]:
    shop = Shop()
    tx = shop.transaction()
    tx.commit()
    (payload,) = (o.payload for o in _common.run_turn(tx, model_calls([("charge", CHARGE_ARGS)])))
    assert "the transaction has ended" in str(payload["error"])
    assert shop.calls == []
    return [payload]


def _after_a_failed_call() -> list[_common.Payload]:
    shop, (failed, after) = _after_a_charge(("nope", {}, "c2"), ("charge", CHARGE_ARGS, "c3"))
    assert failed["ok"] is False
    assert "step 2 failed first" in str(after["error"])
    assert shop.calls == ["charge"]
    return [after]


def _a_refused_plan() -> list[_common.Payload]:
    shop = Shop()
    tx = shop.transaction()
    call = _common.ModelCall(call_id="p1", name="propose_plan", arguments=json.dumps(BAD_PLAN))
    (outcome,) = run_with_plans(tx, [call], plans=True)
    problems = outcome.payload["problems"]
    assert isinstance(problems, list)
    assert all("(did you mean" in str(problem) for problem in problems)
    assert (shop.calls, tx.next_step_id) == ([], 1)
    return [outcome.payload]


MISTAKE_SCENARIOS: Final = {
    "an unknown tool name": _unknown_tool,
    "arguments that are not JSON, or break the tool's schema": _bad_arguments,
    "a call id sent twice in one turn": _reused_call_id,
    "a tool name over 128 characters, arguments over the size limit": _refused,
    "more than 128 tool calls in one turn": _too_many_calls,
    "a call after the transaction ended": _after_the_end,
    "a call after a failed call in the same turn": _after_a_failed_call,
    "with `plans=True`, a `propose_plan` whose plan has problems": _a_refused_plan,
}


def test_every_row_of_the_mistakes_table_has_a_scenario():
    """Each row of docs/integrations.md's table of model mistakes is checked below."""
    assert set(documented_mistakes()) == set(MISTAKE_SCENARIOS)


@pytest.mark.parametrize("row", list(MISTAKE_SCENARIOS))
def test_the_mistakes_table_says_what_reaches_the_model(row):
    """Each row's payloads are failed results; every `"key": value` and phrase the row quotes
    in backticks is in them (a key's value, or a phrase of the error)."""
    says, _ = documented_mistakes()[row]
    for payload in MISTAKE_SCENARIOS[row]():
        assert payload["ok"] is False
        assert json.loads(_common.dumps(payload)) == payload
        for quoted in re.findall(r"`([^`]+)`", says):
            pair = re.fullmatch(r'"(\w+)": (.+)', quoted)
            if pair is not None:
                assert payload[pair.group(1)] == json.loads(pair.group(2)), quoted
            else:
                assert quoted in str(payload["error"]), quoted


# ---------------------------------------------------------------------- plans a model proposes


def run_with_plans(
    tx: agenttx.Transaction, calls: list[_common.ModelCall], *, plans: bool = True
) -> tuple[_common.Outcome, ...]:
    """One model turn through a runner (the runners' shared path, `_runs.Runner`, as
    `FrameworkRunner` drives it) with `plans`: every outcome, in the order of the calls."""
    runner = FrameworkRunner(tx, plans=plans)
    runner.turn(None, calls)
    assert runner.done is not None
    return runner.done


def plan_call(plan: object, call_id: str = "p1") -> _common.ModelCall:
    arguments = plan if isinstance(plan, str) else json.dumps(plan)
    return _common.ModelCall(call_id=call_id, name="propose_plan", arguments=arguments)


def step_call(name: str, arguments: dict[str, object], call_id: str) -> _common.ModelCall:
    return _common.ModelCall(call_id=call_id, name=name, arguments=json.dumps(arguments))


def test_a_plan_call_runs_after_the_turns_steps_and_answers_in_order():
    """In a turn with steps and a plan call, the steps run as one turn (steps 1 and 2), then
    the plan; the outcomes come in the order of the calls, and the plan used no step."""
    shop = Shop()
    tx = shop.transaction()
    calls = [
        step_call("lookup_customer", {"email": EMAIL}, "s1"),
        plan_call(order_plan()),
        step_call("charge", {"customer_id": "${steps.1.id}", "amount": 5}, "s2"),
    ]
    outcomes = run_with_plans(tx, calls, plans=True)
    assert [o.call_id for o in outcomes] == ["s1", "p1", "s2"]
    assert [o.payload["step"] for o in outcomes] == [1, None, 2]
    assert all(o.payload["ok"] for o in outcomes)
    assert outcomes[1].payload["next_step"] == 3
    assert shop.calls[:2] == ["lookup_customer", "charge"]  # the steps ran first
    assert tx.next_step_id == 3


def test_a_plan_call_after_a_failed_step_is_not_run():
    """A plan call in a turn whose step failed is not run, and says so; nothing of it runs."""
    shop = Shop()
    tx = shop.transaction()
    calls = [step_call("lookup_customer", {"email": "nobody@example.com"}, "s1"), plan_call({})]
    failed, plan = run_with_plans(tx, calls, plans=True)
    assert failed.is_error
    assert plan.is_error
    assert "Not run" in plan.payload["error"]
    assert shop.calls == ["lookup_customer"]


def test_after_a_refused_plan_the_next_plan_of_the_turn_is_not_run():
    """Two plan calls in one turn: once one is refused, the next is not run."""
    shop = Shop()
    first, second = run_with_plans(
        shop.transaction(), [plan_call(BAD_PLAN, "p1"), plan_call(order_plan(), "p2")], plans=True
    )
    assert first.payload["plan"] == "REFUSED"
    assert "Not run" in second.payload["error"]
    assert shop.calls == []


@pytest.mark.parametrize(
    ("arguments", "problem"),
    [
        ('{"nodes": [', "a plan in JSON text is malformed"),
        ("", "needs `nodes`"),
        ({"nodes": [{"id": "a"}]}, "needs `id` and `tool`"),
        ({"nodes": [{"id": "a", "tool": "charge", "retries": 99}]}, "MAX_NODE_RETRIES"),
        ({**order_plan(), "initial": ["email"]}, "the plan declares initial email"),
    ],
)
def test_a_malformed_plan_is_refused_with_what_is_wrong(arguments, problem):
    """A plan from_json refuses (malformed text, a missing field, a limit passed) or one that
    declares initial values (a proposed plan is given none) is refused, saying why; nothing
    runs and no step is used."""
    shop = Shop()
    tx = shop.transaction()
    (outcome,) = run_with_plans(tx, [plan_call(arguments)], plans=True)
    assert outcome.payload["plan"] == "REFUSED"
    assert problem in outcome.payload["problems"][0]
    assert len(outcome.payload["problems"]) == 1
    assert (shop.calls, tx.next_step_id) == ([], 1)


def test_a_plan_that_fails_when_it_runs_is_compensated_and_said_so():
    """A valid plan whose node fails runs as a failed plan: the model gets each node's state,
    the failing node's hint and the compensated nodes; nothing it did is kept."""
    shop = Shop()
    plan = order_plan()
    plan["nodes"][0]["inputs"]["email"] = OLD_EMAIL  # a closed account: the reservation fails
    (outcome,) = run_with_plans(shop.transaction(), [plan_call(plan)], plans=True)
    payload = outcome.payload
    assert outcome.is_error
    assert (payload["ok"], payload["plan"]) == (False, "FAILED")
    assert payload["nodes"]["hold"]["state"] == "FAILED"
    assert "closed account" in payload["nodes"]["hold"]["error"]
    assert payload["nodes"]["confirm"]["state"] == "SKIPPED"
    assert payload["compensated"] == ["pay"]
    assert shop.live_charges == []
    assert shop.delivered == []


def test_a_plan_in_an_ended_transaction_is_not_run():
    """Once the transaction has ended, a plan call is answered as any call is: not run."""
    shop = Shop()
    tx = shop.transaction()
    tx.commit()
    (outcome,) = run_with_plans(tx, [plan_call(order_plan())], plans=True)
    assert "transaction has ended" in outcome.payload["error"]
    assert shop.calls == []


def test_without_plans_a_plan_call_is_a_step_like_any_other():
    """A runner with `plans=False` sends propose_plan as a step: an unknown tool."""
    shop = Shop()
    (outcome,) = run_with_plans(shop.transaction(), [plan_call(order_plan())], plans=False)
    assert outcome.result is not None
    assert "does not exist" in outcome.payload["error"]


def test_a_plan_of_an_engines_transaction_is_recorded_durably(tmp_path):
    """On an engine's durable store the plan run is recorded in the store (and recovery would
    resume it), beside the transaction, which it leaves alone."""
    shop = Shop()
    store = agenttx.stores.SQLiteStore(tmp_path / "agent.db")
    engine = agenttx.Engine(tools=shop.tools, store=store, dispatcher=shop.deliver)
    tx = engine.begin()
    (outcome,) = run_with_plans(tx, [plan_call(order_plan())], plans=True)
    assert outcome.payload["ok"] is True
    runs = store.plan_runs()
    assert [(run_id, status) for run_id, status, _ in runs] == [
        (outcome.payload["run_id"], "SUCCEEDED")
    ]
    assert shop.live_charges == ["ch-1"]
    assert tx.status is agenttx.TxStatus.ACTIVE
    tx.commit()
    store.close()


def test_plans_must_be_a_bool_and_may_not_shadow_a_tool():
    """A runner's `plans` must be True or False; with plans=True a tool already named
    propose_plan is refused (the model could not reach it)."""
    shop = Shop()
    with pytest.raises(agenttx.InvalidArgument, match="plans must be True or False"):
        _runs.Runner(shop.transaction(), plans="yes")  # type: ignore[arg-type]

    @agenttx.tool
    def propose_plan() -> None: ...

    tx = agenttx.Transaction(tools=[propose_plan])
    with pytest.raises(agenttx.InvalidArgument, match="rename the tool"):
        _runs.Runner(tx, plans=True)
    assert _runs.Runner(tx).plan_spec is None
