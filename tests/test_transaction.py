"""The interactive transaction: the step pipeline, failure handling, rewinds, commit."""

from __future__ import annotations

import asyncio
import contextlib
import json
import threading
import time

import pytest
from hypothesis import settings

import agenttx
from agenttx import RollbackStrategy, StepStatus, TxStatus, builtins
from agenttx.stores import MemoryStore
from agenttx.testing import TransactionMachine

FK_ERROR = (
    'ERROR: insert or update on table "orders" violates foreign key constraint '
    '"orders_customer_id_fkey"\nDETAIL: Key (customer_id)=(c-1) is not present in table '
    '"customers".'
)


class Shop:
    """A tiny order workflow whose tools log what they and their undos did."""

    def __init__(self, *, fail_order_times: int = 1) -> None:
        self.log: list[str] = []
        self.emails: list[agenttx.StagedEffect] = []
        self.fail_order_times = fail_order_times

        @agenttx.compensation(name="shop.undo")
        def undo(payload):
            self.log.append(f"undo {payload['what']}")

        @agenttx.tool(name="create_customer")
        def create_customer(ctx: agenttx.ToolContext, name: str) -> dict:
            ctx.register_undo("shop.undo", {"what": "customer"})
            ctx.state.put("customers/c-1", {"name": name})
            self.log.append("create_customer")
            return {"customer_id": "c-1"}

        @agenttx.tool(name="reserve_stock")
        def reserve_stock(ctx: agenttx.ToolContext, sku: str) -> dict:
            ctx.register_undo("shop.undo", {"what": "stock"})
            ctx.state.put(f"stock/{sku}", 9)
            self.log.append("reserve_stock")
            return {"reservation_id": "r-1", "sku": sku}

        @agenttx.tool(name="send_confirmation")
        def send_confirmation(ctx: agenttx.ToolContext, to: str) -> dict:
            key = ctx.stage_effect("email", {"to": to})
            self.log.append("send_confirmation")
            return {"queued": key}

        @agenttx.tool(name="create_order")
        def create_order(ctx: agenttx.ToolContext, customer_id: str, sku: str) -> dict:
            self.log.append("create_order")
            if self.fail_order_times > 0:
                self.fail_order_times -= 1
                raise agenttx.ToolError(FK_ERROR)
            ctx.state.put("orders/o-1", {"customer_id": customer_id, "sku": sku})
            return {"order_id": "o-1"}

        self.tools = [undo, create_customer, reserve_stock, send_confirmation, create_order]
        self.calls = {
            1: ("create_customer", {"name": "Ada"}),
            2: ("reserve_stock", {"sku": "SKU-1"}),
            3: ("send_confirmation", {"to": "ada@example.com"}),
            4: ("create_order", {"customer_id": "${steps.1.customer_id}", "sku": "SKU-1"}),
        }

    def transaction(self, **options) -> agenttx.Transaction:
        options.setdefault("dispatcher", {"email": self.emails.append})
        return agenttx.Transaction(tools=self.tools, **options)


def run_all(tx: agenttx.Transaction, calls: dict, *, limit: int = 100) -> list:
    """Drive the transaction like an agent: always send the step it asks for next."""
    results = []
    while tx.status is TxStatus.ACTIVE and tx.next_step_id in calls and len(results) < limit:
        tool, arguments = calls[tx.next_step_id]
        results.append(tx.execute_step(tx.next_step_id, tool, arguments))
    return results


# ---------------------------------------------------------------- end-to-end scenarios


def test_foreign_key_failure_jumps_to_the_root_cause_and_reverts_everything():
    """Step 4's FK failure on customer_id jumps to step 1 and undoes steps 4..1, newest first."""
    shop = Shop()
    tx = shop.transaction()
    for step in (1, 2, 3):
        assert tx.execute_step(step, *shop.calls[step]).ok
    assert tx.read("stock/SKU-1") == 9
    assert tx.view().pending_effects == 1

    result = tx.execute_step(4, *shop.calls[4])

    assert result.status is StepStatus.ROLLBACK_TRIGGERED
    assert result.strategy is RollbackStrategy.DEPENDENCY_JUMP
    assert (result.rollback_to_step, result.next_step_id) == (1, 1)
    assert result.hint is not None
    assert result.hint.text == (
        "Hint: Foreign key constraint failed for 'customer_id'. "
        "Ensure target customer exists before step execution."
    )
    assert result.hint.key == "customer_id"
    assert result.constraints == (result.hint.text,)
    assert result.context_reset is False
    assert shop.log[-2:] == ["undo stock", "undo customer"]
    assert tx.read("stock/SKU-1") is None
    assert tx.read("customers/c-1") is None
    assert tx.view().pending_effects == 0
    assert tx.steps == ()
    assert tx.graph.steps() == ()

    # The corrected replay: the agent sends steps 1..4 again and commits.
    results = run_all(tx, shop.calls)
    assert [r.status for r in results] == [StepStatus.SUCCESS] * 4
    commit = tx.commit()
    assert commit.steps_committed == 4
    assert commit.effects_dispatched == 1
    assert [e.payload for e in shop.emails] == [{"to": "ada@example.com"}]
    assert tx.status is TxStatus.COMMITTED


def test_unresolved_reference_jumps_to_the_referenced_step():
    """`${steps.1.user_id}` missing from step 1's output jumps back to step 1."""
    shop = Shop()
    tx = shop.transaction()
    tx.execute_step(1, *shop.calls[1])
    result = tx.execute_step(2, "reserve_stock", {"sku": "${steps.1.user_id}"})
    assert result.strategy is RollbackStrategy.DEPENDENCY_JUMP
    assert result.rollback_to_step == 1
    assert result.hint is not None
    assert result.hint.text == (
        "Hint: Step 1 output has no 'user_id'. Re-run step 1 so it returns 'user_id', "
        "or fix the reference."
    )
    assert "reserve_stock" not in shop.log  # the tool never ran


def test_a_step_that_always_fails_escalates_then_aborts():
    """Backtrack, backtrack, global reset, the same again, then abort; counted executions
    (with `repeat_limit=0`, which turns the repeated-failure abort off)."""
    runs = []

    @agenttx.tool
    def ok(n: int) -> dict:
        runs.append(n)
        return {"n": n}

    @agenttx.tool
    def broken() -> dict:
        runs.append(3)
        raise agenttx.ToolError("something odd happened")

    calls = {1: ("ok", {"n": 1}), 2: ("ok", {"n": 2}), 3: ("broken", {})}
    policy = agenttx.RollbackPolicy(repeat_limit=0)
    tx = agenttx.Transaction(tools=[ok, broken], policy=policy)
    results = run_all(tx, calls)
    failures = [(r.strategy, r.rollback_to_step) for r in results if not r.ok]
    assert failures == [
        (RollbackStrategy.LOCAL_BACKTRACK, 2),
        (RollbackStrategy.LOCAL_BACKTRACK, 1),
        (RollbackStrategy.GLOBAL_RESET, 0),
        (RollbackStrategy.LOCAL_BACKTRACK, 2),
        (RollbackStrategy.LOCAL_BACKTRACK, 1),
        (RollbackStrategy.ABORT, 0),
    ]
    assert runs.count(3) == 6
    assert runs == [1, 2, 3, 2, 3, 1, 2, 3, 1, 2, 3, 2, 3, 1, 2, 3]
    last = results[-1]
    assert last.status is StepStatus.FAILED
    assert last.next_step_id == 0
    assert last.context_reset is True
    assert last.abort_reason == "local backtrack depth exhausted; global reset budget (1) exhausted"
    assert tx.status is TxStatus.FAILED
    assert tx.global_resets == 1
    with pytest.raises(agenttx.InvalidTransactionState):
        tx.execute_step(1, "ok", {"n": 1})


def test_a_tiny_replay_budget_forces_an_early_global_reset():
    """With replay_budget_factor=0.1 the first backtrack is over budget: a global reset."""

    @agenttx.tool
    def ok() -> dict:
        return {}

    @agenttx.tool
    def broken() -> dict:
        raise agenttx.ToolError("nope")

    tx = agenttx.Transaction(
        tools=[ok, broken], policy=agenttx.RollbackPolicy(replay_budget_factor=0.1)
    )
    tx.execute_step(1, "ok", {})
    tx.execute_step(2, "ok", {})
    result = tx.execute_step(3, "broken", {})
    assert result.strategy is RollbackStrategy.GLOBAL_RESET
    assert (result.next_step_id, result.context_reset) == (1, True)
    assert tx.context == ()


def test_malformed_json_is_a_failed_step_with_the_malformed_json_hint():
    """Arguments as broken JSON text fail the step; nothing is raised."""
    shop = Shop()
    tx = shop.transaction()
    result = tx.execute_step(1, "create_customer", '{"name": ')
    assert result.status is StepStatus.ROLLBACK_TRIGGERED
    assert result.strategy is RollbackStrategy.RESEND  # a mistake: step 1 is sent again
    assert result.hint is not None
    assert result.hint.text == (
        "Hint: Malformed JSON. Emit a single valid JSON object with double-quoted keys."
    )
    assert result.error is not None
    assert result.error.startswith("invalid arguments JSON: ")
    assert tx.execute_step(1, "create_customer", '{"name": "Ada"}').ok


def test_missing_arguments_become_hints_with_the_key():
    """A missing argument fails against the tool's spec, before the tool runs, keyed on it."""
    shop = Shop()
    tx = shop.transaction()
    result = tx.execute_step(1, "create_customer", {})
    assert result.hint is not None
    assert result.hint.key == "name"
    assert result.error == "missing field `name`"
    assert result.hint.text == (
        "Hint: Required field 'name' is missing from the arguments. Provide 'name' explicitly."
    )


def test_python_exceptions_are_given_as_python_formats_them():
    """A KeyError in a tool becomes `KeyError: 'user_id'`, which the cleaner understands."""

    @agenttx.tool
    def lookup(record: dict) -> dict:
        return {"id": record["user_id"]}

    tx = agenttx.Transaction(tools=[lookup])
    result = tx.execute_step(1, "lookup", {"record": {}})
    assert result.error == "KeyError: 'user_id'"
    assert result.hint is not None
    assert result.hint.key == "user_id"


def test_unknown_tools_list_the_registered_ones():
    """Calling a tool that does not exist is a failed step whose hint lists the tools."""
    shop = Shop()
    tx = shop.transaction()
    result = tx.execute_step(1, "create_user", {})
    assert result.hint is not None
    assert result.hint.text == (
        "Hint: Tool 'create_user' does not exist. Use one of: create_customer, create_order, "
        "reserve_stock, send_confirmation."
    )


def test_unknown_tools_list_the_wire_names_the_model_was_given(tmp_path):
    """An unknown tool's message and hint list the wire names (`kv_put`), which the model was
    given and may call, not the registered names (`kv.put`); both still call the tool."""
    tx = agenttx.Transaction(builtins.tools(tmp_path))
    wire = sorted(spec.wire_name for spec in tx.tool_specs)
    assert "kv_put" in wire
    assert all("." not in name for name in wire)
    result = tx.execute_step(1, "kv.set", {})
    assert result.error == f"unknown tool 'kv.set'; registered tools: {', '.join(wire)}"
    assert result.hint is not None
    assert result.hint.text == f"Hint: Tool 'kv.set' does not exist. Use one of: {', '.join(wire)}."
    assert tx.execute_step(1, "kv_put", {"key": "a", "value": 1}).ok
    assert tx.execute_step(2, "kv.put", {"key": "b", "value": 2}).ok


# ---------------------------------------------------------------- transient failures


def _flaky(times: int):
    state = {"left": times, "runs": 0}

    @agenttx.tool
    def fetch() -> dict:
        state["runs"] += 1
        if state["left"] > 0:
            state["left"] -= 1
            raise agenttx.ToolError("upstream returned HTTP 503 Service Unavailable")
        return {"ok": True}

    @agenttx.tool
    def first() -> dict:
        return {}

    return state, [fetch, first]


def test_transient_failures_retry_the_same_step_first():
    """A 5xx retries step K itself (RETRY), not K-1, once by default."""
    state, tools = _flaky(1)
    tx = agenttx.Transaction(tools=tools)
    tx.execute_step(1, "first", {})
    result = tx.execute_step(2, "fetch", {})
    assert result.strategy is RollbackStrategy.RETRY
    assert (result.rollback_to_step, result.next_step_id) == (2, 2)
    assert tx.execute_step(2, "fetch", {}).ok
    assert state["runs"] == 2


def test_transient_retries_zero_is_the_reference_behaviour():
    """With transient_retries=0 a 5xx backtracks locally to K-1."""
    _, tools = _flaky(1)
    tx = agenttx.Transaction(tools=tools, policy=agenttx.RollbackPolicy(transient_retries=0))
    tx.execute_step(1, "first", {})
    result = tx.execute_step(2, "fetch", {})
    assert result.strategy is RollbackStrategy.LOCAL_BACKTRACK
    assert result.rollback_to_step == 1


# ---------------------------------------------------------------- commit


def test_commit_publishes_atomically_and_only_then_dispatches():
    """Other transactions see nothing before commit; effects are dispatched after it."""
    store = MemoryStore()
    shop = Shop(fail_order_times=0)
    tx = shop.transaction(store=store)
    run_all(tx, shop.calls)
    assert store.read_committed("orders/o-1") is None
    assert shop.emails == []
    result = tx.commit()
    assert json.loads(store.read_committed("orders/o-1")) == {"customer_id": "c-1", "sku": "SKU-1"}
    assert result.effects_dispatched == 1
    assert result.effects[0].channel == "email"
    assert "undo" not in " ".join(shop.log)


def test_without_a_dispatcher_the_effects_are_handed_back():
    """commit() with no dispatcher returns the committed effects for the caller to deliver."""
    shop = Shop(fail_order_times=0)
    tx = agenttx.Transaction(tools=shop.tools)
    run_all(tx, shop.calls)
    result = tx.commit()
    assert result.effects_dispatched == 0
    assert [e.payload for e in result.effects] == [{"to": "ada@example.com"}]


def test_dispatch_errors_are_reported_and_the_commit_stands():
    """A failing dispatcher is reported per effect; the commit is not undone."""

    def broken(effect):
        raise ConnectionError("smtp down")

    shop = Shop(fail_order_times=0)
    tx = shop.transaction(dispatcher={"email": broken})
    run_all(tx, shop.calls)
    result = tx.commit()
    assert result.effects_dispatched == 0
    assert len(result.dispatch_errors) == 1
    assert result.dispatch_errors[0].startswith("email effect ")
    assert result.dispatch_errors[0].endswith("(step 3): smtp down")
    assert tx.status is TxStatus.COMMITTED
    assert tx.read("orders/o-1") is not None
    assert not any(line.startswith("undo") for line in shop.log)


def test_write_conflict_fails_the_later_committer_and_compensates_it():
    """First committer wins; the loser raises WriteConflict naming the key and ends FAILED."""
    store = MemoryStore()
    undone = []

    @agenttx.tool
    def put(ctx: agenttx.ToolContext, value: int) -> dict:
        ctx.register_undo(lambda: undone.append(value))
        ctx.state.put("kv/inventory", value)
        return {"value": value}

    first = agenttx.Transaction(tools=[put], store=store)
    second = agenttx.Transaction(tools=[put], store=store)
    first.execute_step(1, "put", {"value": 1})
    second.execute_step(1, "put", {"value": 2})
    second.commit()
    with pytest.raises(agenttx.WriteConflict) as caught:
        first.commit()
    assert caught.value.key == "kv/inventory"
    assert first.status is TxStatus.FAILED
    assert undone == [1]
    assert json.loads(store.read_committed("kv/inventory")) == 2


def test_an_empty_transaction_commits():
    """Committing with no steps is allowed."""
    result = agenttx.Transaction().commit()
    assert (result.steps_committed, result.effects_dispatched) == (0, 0)


# ---------------------------------------------------------------- rollback


def test_manual_rollback_rewinds_and_keeps_counters_and_constraints():
    """rollback(to_step=n) undoes steps >= n; constraints and resets stay."""
    shop = Shop(fail_order_times=0)
    tx = shop.transaction()
    run_all(tx, shop.calls)
    result = tx.rollback(to_step=2)
    assert (result.aborted, result.next_step_id, result.compensations_run) == (False, 2, 1)
    assert tx.next_step_id == 2
    assert tx.read("stock/SKU-1") is None
    assert tx.read("customers/c-1") == {"name": "Ada"}
    assert [s.step_id for s in tx.steps] == [1]
    assert tx.view().pending_effects == 0


@pytest.mark.parametrize("to_step", [None, 0])
def test_full_rollback_aborts(to_step):
    """rollback() and rollback(0) compensate everything and end ROLLED_BACK."""
    shop = Shop(fail_order_times=0)
    tx = shop.transaction()
    run_all(tx, shop.calls)
    result = tx.rollback(to_step)
    assert (result.aborted, result.next_step_id, result.compensations_run) == (True, 0, 2)
    assert tx.status is TxStatus.ROLLED_BACK
    assert tx.view().status is TxStatus.ROLLED_BACK
    assert tx.read("customers/c-1") is None
    assert shop.emails == []


@pytest.mark.parametrize("to_step", [5, 6, -1])
def test_rollback_must_target_an_earlier_step(to_step):
    """to_step must be below next_step_id; nothing changes otherwise."""
    shop = Shop(fail_order_times=0)
    tx = shop.transaction()
    run_all(tx, shop.calls)
    with pytest.raises(agenttx.InvalidArgument, match="must be lower than the next step 5"):
        tx.rollback(to_step=to_step)
    assert tx.next_step_id == 5


def test_failed_compensations_are_reported_and_kept_after_commit():
    """A compensation that keeps failing is reported, the others still run, and it stays visible."""
    ran = []

    @agenttx.tool
    def step(ctx: agenttx.ToolContext, n: int) -> dict:
        def undo():
            ran.append(n)
            if n == 2:
                raise RuntimeError("disk full")

        ctx.register_undo(undo)
        return {"n": n}

    tx = agenttx.Transaction(tools=[step])
    for n in (1, 2, 3):
        tx.execute_step(n, "step", {"n": n})
    result = tx.rollback(to_step=1)
    assert result.compensations_run == 2
    assert result.compensation_errors == ("call undo: disk full",)
    assert ran == [3, 2, 2, 2, 1]  # three attempts for step 2, newest first overall
    tx.commit()
    assert tx.view().compensation_failures == ("call undo: disk full",)


# ---------------------------------------------------------------- compensations and keys


def test_declared_compensation_gets_arguments_and_output():
    """compensate= is recorded on success and called with {"arguments", "output"}."""
    seen = []

    @agenttx.compensation(name="refund")
    def refund(payload):
        seen.append(payload)

    @agenttx.tool(name="charge", compensate=refund)
    def charge(amount: int) -> dict:
        return {"charge_id": "ch-1"}

    tx = agenttx.Transaction(tools=[charge])
    tx.execute_step(1, "charge", {"amount": 5})
    tx.rollback()
    assert seen == [{"arguments": {"amount": 5}, "output": {"charge_id": "ch-1"}}]


def test_nothing_is_compensated_after_commit():
    """Commit forgets the undo records: a later failure elsewhere never undoes committed work."""
    seen = []

    @agenttx.tool(compensate="undo")
    def act() -> dict:
        return {}

    undo = agenttx.compensation(name="undo")(seen.append)
    tx = agenttx.Transaction(tools=[act, undo])
    tx.execute_step(1, "act", {})
    tx.commit()
    assert seen == []


def test_idempotency_keys_are_stable_and_renewed_after_compensation():
    """The same call gets the same key; after its effects were undone it gets a new one."""
    keys = []

    @agenttx.tool
    def pay(ctx: agenttx.ToolContext, amount: int) -> dict:
        keys.append(ctx.idempotency_key)
        return {}

    def run(tx_id):
        tx = agenttx.Transaction(tools=[pay], tx_id=tx_id)
        tx.execute_step(1, "pay", {"amount": 5})
        return tx

    run("t-a")
    tx = run("t-a-again")
    assert keys[0] != keys[1]  # another transaction
    run("t-a")
    assert keys[2] == keys[0]  # same transaction id, step, tool and arguments
    tx.rollback(to_step=1)
    tx.execute_step(1, "pay", {"amount": 5})
    assert keys[3] != keys[1]


def test_resolved_values_are_never_rescanned():
    """An output containing `${steps.1.secret}` is passed on as text."""

    @agenttx.tool
    def emit() -> dict:
        return {"text": "${steps.1.secret}", "secret": "s3cr3t"}

    @agenttx.tool
    def echo(text: str) -> dict:
        return {"text": text}

    tx = agenttx.Transaction(tools=[emit, echo])
    tx.execute_step(1, "emit", {})
    assert tx.execute_step(2, "echo", {"text": "${steps.1.text}"}).output == {
        "text": "${steps.1.secret}"
    }


# ---------------------------------------------------------------- protocol misuse and bad input


def test_steps_out_of_order_raise_and_say_what_to_send():
    """Sending step 3 to a fresh transaction raises StepOutOfOrder expecting step 1."""
    tx = agenttx.Transaction(tools=Shop().tools)
    with pytest.raises(agenttx.StepOutOfOrder) as caught:
        tx.execute_step(3, "create_customer", {"name": "x"})
    assert (caught.value.expected, caught.value.got) == (1, 3)
    assert "expected step 1" in str(caught.value)


@pytest.mark.parametrize(
    ("tool", "arguments", "error"),
    [
        ("", {}, agenttx.InvalidArgument),
        ("x" * 129, {}, agenttx.InvalidArgument),
        ("create_customer", {"name": {1, 2}}, agenttx.JSONValueError),
        ("create_customer", {"name": float("nan")}, agenttx.JSONValueError),
        ("create_customer", {"name": "x" * 1_048_577}, agenttx.InvalidArgument),
        ("create_customer", "{" + " " * 1_048_576 + "}", agenttx.InvalidArgument),
        ("create_customer", ["not", "a", "mapping"], agenttx.InvalidArgument),
    ],
)
def test_bad_input_raises_and_changes_nothing(tool, arguments, error):
    """Misuse is refused before anything changes: same view, same state, same step."""
    shop = Shop()
    tx = shop.transaction()
    tx.execute_step(1, *shop.calls[1])
    before = tx.view()
    with pytest.raises(error):
        tx.execute_step(2, tool, arguments)
    assert tx.view() == before
    assert tx.read("customers/c-1") == {"name": "Ada"}
    assert tx.execute_step(2, *shop.calls[2]).ok


def test_self_referencing_arguments_are_refused():
    """A mapping that contains itself is a JSONValueError, not a RecursionError."""
    loop: dict = {}
    loop["self"] = loop
    tx = agenttx.Transaction(tools=Shop().tools)
    with pytest.raises(agenttx.JSONValueError, match="contains itself"):
        tx.execute_step(1, "create_customer", loop)


def test_non_object_arguments_fail_the_step_with_a_type_hint():
    """JSON text that is not an object reaches no tool: a wrong-type hint."""
    tx = agenttx.Transaction(tools=Shop().tools)
    result = tx.execute_step(1, "create_customer", "[1, 2]")
    assert result.hint is not None
    assert result.hint.text == (
        "Hint: Wrong argument type: got array, expected a JSON object of arguments."
    )


def test_non_json_output_raises_to_the_developer():
    """A tool returning what no serializer converts raises ToolOutputError naming the tool."""

    @agenttx.tool
    def odd() -> object:
        return {"x": object()}

    tx = agenttx.Transaction(tools=[odd])
    with pytest.raises(agenttx.ToolOutputError, match="the output of tool 'odd' at step 1"):
        tx.execute_step(1, "odd", {})
    assert tx.next_step_id == 1


def test_ended_transactions_refuse_calls_but_stay_viewable():
    """After commit, every call raises InvalidTransactionState; view() shows COMMITTED."""
    tx = agenttx.Transaction()
    tx.commit()
    with pytest.raises(agenttx.InvalidTransactionState, match="is COMMITTED, expected ACTIVE"):
        tx.commit()
    with pytest.raises(agenttx.InvalidTransactionState):
        tx.rollback()
    assert tx.view().status is TxStatus.COMMITTED


@pytest.mark.parametrize(
    "options",
    [
        {"agent_id": "x" * 257},
        {"step_timeout": 0},
        {"max_constraints": 0},
        {"compensation_retries": 0},
        {"policy": "strict"},
    ],
)
def test_bad_options_are_refused(options):
    """Out-of-range construction options raise InvalidArgument."""
    with pytest.raises(agenttx.InvalidArgument):
        agenttx.Transaction(**options)


# ---------------------------------------------------------------- cleanup always runs


def test_context_manager_commits_on_success():
    """Leaving the with block normally commits."""
    shop = Shop(fail_order_times=0)
    with shop.transaction() as tx:
        run_all(tx, shop.calls)
    assert tx.status is TxStatus.COMMITTED
    assert len(shop.emails) == 1


def test_context_manager_aborts_on_keyboard_interrupt_and_reraises():
    """A KeyboardInterrupt in the block compensates everything, then propagates."""
    shop = Shop(fail_order_times=0)
    tx = shop.transaction()

    def interrupted_block():
        with tx:
            tx.execute_step(1, *shop.calls[1])
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        interrupted_block()
    assert tx.status is TxStatus.ROLLED_BACK
    assert shop.log[-1] == "undo customer"


def test_interrupt_inside_a_tool_undoes_that_step_and_allows_a_retry():
    """A BaseException from a tool compensates the step's registered undos, then re-raises."""
    undone = []
    state = {"interrupt": True}

    @agenttx.tool
    def slow(ctx: agenttx.ToolContext) -> dict:
        ctx.register_undo(lambda: undone.append("slow"))
        ctx.state.put("k", 1)
        if state["interrupt"]:
            state["interrupt"] = False
            raise KeyboardInterrupt
        return {}

    tx = agenttx.Transaction(tools=[slow])
    with pytest.raises(KeyboardInterrupt):
        tx.execute_step(1, "slow", {})
    assert undone == ["slow"]
    assert tx.read("k") is None
    assert (tx.status, tx.next_step_id) == (TxStatus.ACTIVE, 1)
    assert tx.execute_step(1, "slow", {}).ok


# ---------------------------------------------------------------- async


def test_async_tools_and_compensations_run_on_the_callers_loop():
    """aexecute_step awaits async tools; their async compensations are awaited on rewind."""
    events = []

    @agenttx.compensation(name="aundo")
    async def aundo(payload):
        await asyncio.sleep(0)
        events.append(("undo", payload["n"]))

    @agenttx.tool
    async def fetch(ctx: agenttx.ToolContext, n: int) -> dict:
        await asyncio.sleep(0)
        ctx.register_undo("aundo", {"n": n})
        events.append(("fetch", n))
        return {"n": n}

    @agenttx.tool
    async def fail() -> dict:
        raise agenttx.ToolError("no luck")

    async def main():
        tx = agenttx.Transaction(tools=[aundo, fetch, fail])
        assert (await tx.aexecute_step(1, "fetch", {"n": 1})).ok
        assert (await tx.aexecute_step(2, "fetch", {"n": 2})).ok
        return await tx.aexecute_step(3, "fail", {})

    result = asyncio.run(main())
    assert result.strategy is RollbackStrategy.LOCAL_BACKTRACK
    assert events == [("fetch", 1), ("fetch", 2), ("undo", 2)]


def test_async_tools_also_run_from_execute_step():
    """The sync API runs an async tool to completion."""

    @agenttx.tool
    async def add(x: int) -> int:
        return x + 1

    tx = agenttx.Transaction(tools=[add])
    assert tx.execute_step(1, "add", {"x": 1}).output == 2


# ---------------------------------------------------------------- model-based

TransactionMachine.TestCase.settings = settings(max_examples=40, stateful_step_count=40)
test_transaction_machine = TransactionMachine.TestCase


class ReferenceMistakeMachine(TransactionMachine):
    """The same guarantees when mistakes are decided as any failure (mistake_retries=0)."""

    policy = agenttx.RollbackPolicy(mistake_retries=0)


ReferenceMistakeMachine.TestCase.settings = settings(max_examples=25, stateful_step_count=40)
test_reference_mistake_machine = ReferenceMistakeMachine.TestCase


def test_builtins_foreign_key_failure_reverts_kv_file_and_email(tmp_path):
    """With built-ins: step 4's FK failure jumps to step 1 and reverts kv, file and email."""

    sent = []
    tx = agenttx.Transaction(tools=builtins.tools(tmp_path), dispatcher={"email": sent.append})
    calls = {
        1: ("kv.put", {"key": "session/customer", "value": "c-404"}),
        2: ("fs.write", {"path": "drafts/${steps.1.value}.json", "contents": "{}"}),
        3: ("effect.stage", {"channel": "email", "payload": {"customer": "${steps.1.value}"}}),
        4: (
            "record.insert",
            {
                "table": "orders",
                "id": "o-1",
                "fields": {"customer_id": "${steps.1.value}"},
                "references": {"customer_id": "customers"},
            },
        ),
    }
    for step in (1, 2, 3):
        assert tx.execute_step(step, *calls[step]).ok
    draft = tmp_path / "drafts" / "c-404.json"
    assert draft.exists()

    result = tx.execute_step(4, *calls[4])

    assert result.strategy is RollbackStrategy.DEPENDENCY_JUMP
    assert result.rollback_to_step == 1
    assert result.hint is not None
    assert result.hint.text == (
        "Hint: Foreign key constraint failed for 'customer_id'. "
        "Ensure target customer exists before step execution."
    )
    assert tx.read("kv/session/customer") is None
    assert not draft.exists()
    assert tx.view().pending_effects == 0
    tx.commit()
    assert sent == []


def test_read_only_properties_describe_the_transaction():
    """id, agent_id, policy, tools and find_root_cause reflect the construction and the graph."""
    policy = agenttx.RollbackPolicy(max_local_depth=3)
    shop = Shop(fail_order_times=0)
    tx = agenttx.Transaction(tools=shop.tools, agent_id="agent-7", policy=policy, tx_id="tx-1")
    assert (tx.id, tx.agent_id, tx.policy) == ("tx-1", "agent-7", policy)
    assert tx.tools == ("create_customer", "create_order", "reserve_stock", "send_confirmation")
    run_all(tx, shop.calls)
    assert tx.find_root_cause(4, "customer_id") == 1
    assert [entry.step_id for entry in tx.context] == [1, 2, 3, 4]


def test_illegal_transitions_raise_and_leave_the_status():
    """The status table is enforced: COMMITTED cannot go back to ACTIVE."""
    tx = agenttx.Transaction()
    tx.commit()
    with pytest.raises(agenttx.IllegalTransition, match="COMMITTED -> ACTIVE"):
        tx._pipeline._transition(TxStatus.ACTIVE)
    assert tx.status is TxStatus.COMMITTED


@pytest.mark.parametrize(
    ("raw_context", "message"),
    [(7, "raw_context must be a string"), ("x" * 1_048_577, "raw_context exceeds")],
)
def test_bad_raw_context_is_refused(raw_context, message):
    """raw_context must be a string of at most 1 MiB."""
    tx = agenttx.Transaction(tools=Shop().tools)
    with pytest.raises(agenttx.InvalidArgument, match=message):
        tx.execute_step(1, "create_customer", {"name": "x"}, raw_context=raw_context)
    assert tx.next_step_id == 1


def test_rollback_to_step_must_be_an_integer():
    """to_step that is not an integer is refused."""
    tx = agenttx.Transaction()
    with pytest.raises(agenttx.InvalidArgument, match="to_step must be an integer"):
        tx.rollback(to_step="1")  # type: ignore[arg-type]


@pytest.mark.parametrize(("text", "kind"), [("null", "null"), ("true", "boolean"), ("3", "number")])
def test_scalar_json_arguments_fail_with_their_kind(text, kind):
    """Arguments that are a JSON scalar name its kind in the wrong-type hint."""
    tx = agenttx.Transaction(tools=Shop().tools)
    result = tx.execute_step(1, "create_customer", text)
    assert result.hint is not None
    assert result.hint.text == (
        f"Hint: Wrong argument type: got {kind}, expected a JSON object of arguments."
    )


def test_a_storage_error_at_commit_leaves_the_transaction_active():
    """A commit that fails in the store (not a conflict) can be retried."""

    class Flaky(MemoryStore):
        fail = True

        def commit(self, tx_id):
            if self.fail:
                self.fail = False
                raise agenttx.StorageError("disk unplugged")
            return super().commit(tx_id)

    tx = agenttx.Transaction(store=Flaky())
    with pytest.raises(agenttx.StorageError):
        tx.commit()
    assert tx.status is TxStatus.ACTIVE
    assert tx.commit().steps_committed == 0


def test_leaving_a_with_block_after_an_explicit_end_does_nothing():
    """A transaction rolled back inside the block is left alone by __exit__."""
    with agenttx.Transaction() as tx:
        tx.rollback()
    assert tx.status is TxStatus.ROLLED_BACK


def test_a_commit_interrupted_after_the_memory_store_committed_is_committed(monkeypatch):
    """On a MemoryStore too: the interrupt propagates, the object says COMMITTED as the store
    does; its effect, undelivered, is counted in view().pending_effects."""
    sent = []

    @agenttx.tool
    def notify(ctx: agenttx.ToolContext) -> dict:
        ctx.stage_effect("email", {"to": "ada@x.io"})
        ctx.state.put("k", 1)
        return {}

    store = agenttx.stores.MemoryStore()
    tx = agenttx.Transaction(tools=[notify], store=store, dispatcher=sent.append)
    tx.execute_step(1, "notify", {})
    real_commit = agenttx.stores.MemoryStore.commit

    def interrupted(self, tx_id):
        real_commit(self, tx_id)
        raise KeyboardInterrupt

    monkeypatch.setattr(agenttx.stores.MemoryStore, "commit", interrupted)
    with pytest.raises(KeyboardInterrupt):
        tx.commit()
    assert tx.status is TxStatus.COMMITTED
    assert store.read_committed("k") == "1"
    assert tx.view().pending_effects == 1  # counted, not delivered: no outbox here
    assert sent == []


def test_async_failures_before_the_tool_and_interrupts():
    """aexecute_step reports an unknown tool, and undoes an interrupted async tool's step."""
    undone = []

    @agenttx.tool
    async def stop(ctx: agenttx.ToolContext) -> dict:
        ctx.register_undo(lambda: undone.append(1))
        raise KeyboardInterrupt

    async def main():
        tx = agenttx.Transaction(tools=[stop])
        unknown = await tx.aexecute_step(1, "nope", {})
        assert unknown.strategy is RollbackStrategy.RESEND
        assert unknown.hint is not None
        assert unknown.hint.category is agenttx.HintCategory.UNKNOWN_TOOL
        with pytest.raises(KeyboardInterrupt):
            await tx.aexecute_step(1, "stop", {})
        return tx

    tx = asyncio.run(main())
    assert undone == [1]
    assert (tx.status, tx.next_step_id) == (TxStatus.ACTIVE, 1)


def test_async_tool_returning_a_plain_value_from_a_sync_function():
    """aexecute_step also runs plain sync tools."""

    @agenttx.tool
    def plain() -> dict:
        return {"ok": True}

    tx = agenttx.Transaction(tools=[plain])
    assert asyncio.run(tx.aexecute_step(1, "plain", {})).output == {"ok": True}


def test_async_tools_time_out_with_the_reference_message():
    """An async tool running past step_timeout is cancelled; the step fails as a timeout."""
    cancelled = []

    @agenttx.tool
    async def slow() -> dict:
        try:
            await asyncio.sleep(10)
        except asyncio.CancelledError:
            cancelled.append(True)
            raise
        return {}

    tx = agenttx.Transaction(tools=[slow], step_timeout=0.05)
    result = asyncio.run(tx.aexecute_step(1, "slow", {}))
    assert result.error == "tool 'slow' timed out after 50 ms"
    assert result.hint is not None
    assert result.hint.category is agenttx.HintCategory.TIMEOUT
    assert result.strategy is RollbackStrategy.RETRY
    assert cancelled == [True]
    sync_result = tx.execute_step(1, "slow", {})
    assert sync_result.error == "tool 'slow' timed out after 50 ms"


def test_a_hanging_sync_tool_fails_at_the_deadline_and_is_fenced():
    """A sync tool past step_timeout fails the step at once; what it does later is refused.

    The undo it registered before the deadline waits for the tool to finish (its effect may
    still land) and then runs once; its state write before the deadline is reverted, and its
    calls after the deadline raise and land nowhere.
    """
    release, done = threading.Event(), threading.Event()
    undone, late_errors = [], []

    @agenttx.tool
    def hang(ctx: agenttx.ToolContext) -> dict:
        ctx.register_undo(lambda: undone.append("early"))
        ctx.state.put("early", 1)
        release.wait(5.0)
        for late in (
            lambda: ctx.state.put("late", 1),
            lambda: ctx.state.get("early"),
            lambda: ctx.register_undo(lambda: undone.append("late")),
            lambda: ctx.stage_effect("email", {"to": "x"}),
        ):
            try:
                late()
            except agenttx.InvalidArgument as exc:
                late_errors.append(str(exc))
        done.set()
        return {}

    sent = []
    tx = agenttx.Transaction(tools=[hang], step_timeout=0.05, dispatcher=sent.append)
    result = tx.execute_step(1, "hang", {})
    assert not done.is_set()  # it did not wait for the tool, which waits for `release`
    assert result.error == "tool 'hang' timed out after 50 ms"
    assert result.hint is not None
    assert result.hint.category is agenttx.HintCategory.TIMEOUT
    assert undone == []  # not while the tool may still act
    release.set()
    assert done.wait(5.0)
    assert late_errors == ["step 1 has ended: its context accepts no more calls"] * 4
    assert tx.read("early") is None
    assert tx.read("late") is None
    committed = tx.commit()
    assert (committed.steps_committed, committed.effects) == (0, ())
    assert sent == []
    assert undone == ["early"]


def test_an_async_tool_swallowing_cancellation_cannot_write_after_the_deadline():
    """An async tool that ignores its cancellation still fails the step; late writes are refused."""
    refused = []

    @agenttx.tool
    async def stubborn(ctx: agenttx.ToolContext) -> dict:
        with contextlib.suppress(asyncio.CancelledError):  # ignores its cancellation
            await asyncio.sleep(5)
        try:
            ctx.state.put("late", 1)
        except agenttx.InvalidArgument as exc:
            refused.append(str(exc))
        return {"ok": True}

    tx = agenttx.Transaction(tools=[stubborn], step_timeout=0.05)
    result = asyncio.run(tx.aexecute_step(1, "stubborn", {}))
    assert result.error == "tool 'stubborn' timed out after 50 ms"
    assert refused == ["step 1 has ended: its context accepts no more calls"]
    assert tx.read("late") is None


def test_an_inline_tool_returning_after_the_deadline_fails_as_timed_out():
    """An inline tool cannot be interrupted, but a late result still fails the step and rewinds."""

    @agenttx.tool(inline=True)
    def slow(ctx: agenttx.ToolContext) -> dict:
        ctx.state.put("written", 1)
        time.sleep(0.06)
        return {}

    tx = agenttx.Transaction(tools=[slow], step_timeout=0.05)
    result = tx.execute_step(1, "slow", {})
    assert result.error == "tool 'slow' timed out after 50 ms"
    assert tx.read("written") is None
    assert asyncio.run(tx.aexecute_step(1, "slow", {})).error == result.error


def test_sync_tools_run_on_a_worker_and_inline_tools_on_the_caller():
    """A plain sync tool runs on a worker thread; inline=True keeps it on the calling thread."""

    @agenttx.tool
    def where() -> dict:
        return {"thread": threading.get_ident()}

    @agenttx.tool(inline=True)
    def here() -> dict:
        return {"thread": threading.get_ident()}

    tx = agenttx.Transaction(tools=[where, here])
    assert tx.execute_step(1, "where", {}).output != {"thread": threading.get_ident()}
    assert tx.execute_step(2, "here", {}).output == {"thread": threading.get_ident()}
    with pytest.raises(agenttx.InvalidArgument, match="inline= must be a bool"):
        agenttx.tool(inline="yes")(lambda: None)  # type: ignore[arg-type]


def test_aexecute_step_keeps_the_loop_running_during_a_sync_tool():
    """A blocking sync tool under aexecute_step runs on a worker: other tasks keep running."""
    release = threading.Event()

    @agenttx.tool
    def block() -> dict:
        return {"released": release.wait(5.0)}

    async def main():
        tx = agenttx.Transaction(tools=[block])
        step = asyncio.ensure_future(tx.aexecute_step(1, "block", {}))
        await asyncio.sleep(0.01)
        release.set()  # only possible because the loop is not blocked
        return await step

    assert asyncio.run(main()).output == {"released": True}


def test_a_base_exception_from_a_worker_tool_rewinds_the_step():
    """SystemExit raised by a sync tool on its worker reaches the caller after the rewind."""
    undone = []

    @agenttx.tool
    def leave(ctx: agenttx.ToolContext) -> dict:
        ctx.register_undo(lambda: undone.append(1))
        raise SystemExit(2)

    tx = agenttx.Transaction(tools=[leave])
    with pytest.raises(SystemExit):
        tx.execute_step(1, "leave", {})
    assert undone == [1]
    assert (tx.status, tx.next_step_id) == (TxStatus.ACTIVE, 1)


# ---------------------------------------------------------------- found in review


def test_a_snapshot_failure_changes_nothing():
    """If the store cannot take the step's snapshot, the error propagates and nothing changes."""

    class NoSnapshots(MemoryStore):
        def snapshot(self, tx_id, step):
            if step == 1:
                raise agenttx.StorageError("disk full")
            super().snapshot(tx_id, step)

    tx = agenttx.Transaction(tools=Shop().tools, store=NoSnapshots())
    with pytest.raises(agenttx.StorageError):
        tx.execute_step(1, "create_customer", {"name": "x"})
    assert (tx.status, tx.next_step_id) == (TxStatus.ACTIVE, 1)
    assert tx.rollback().aborted


def test_a_restore_failure_ends_the_transaction_failed():
    """A rewind the store cannot finish aborts the transaction (FAILED), then re-raises."""

    class NoRestore(MemoryStore):
        def restore(self, tx_id, step):
            raise agenttx.StorageError("journal lost")

    shop = Shop(fail_order_times=0)
    tx = shop.transaction(store=NoRestore())
    run_all(tx, shop.calls)
    with pytest.raises(agenttx.StorageError, match="journal lost"):
        tx.rollback(to_step=2)
    assert tx.status is TxStatus.FAILED
    assert shop.log[-2:] == ["undo stock", "undo customer"]  # every undo ran once
    assert tx.view().pending_effects == 0


def test_an_interrupted_compensation_keeps_the_rest_and_ends_failed():
    """A KeyboardInterrupt in an undo ends the transaction; the undos not run are kept as failed."""
    ran = []

    @agenttx.tool
    def step(ctx: agenttx.ToolContext, n: int) -> dict:
        def undo():
            ran.append(n)
            if n == 2:
                raise KeyboardInterrupt

        ctx.register_undo(undo)
        return {"n": n}

    tx = agenttx.Transaction(tools=[step])
    for n in (1, 2, 3):
        tx.execute_step(n, "step", {"n": n})
    with pytest.raises(KeyboardInterrupt):
        tx.rollback()
    assert ran == [3, 2]
    assert tx.status is TxStatus.FAILED
    failures = tx.view().compensation_failures
    assert failures == (
        "call undo: interrupted by KeyboardInterrupt",
        "call undo: not run: interrupted by KeyboardInterrupt",
    )


def test_register_undo_accepts_a_compensation_object():
    """Passing the compensation itself records it by name, with its payload."""
    seen = []
    refund = agenttx.compensation(name="refund")(seen.append)

    @agenttx.tool
    def charge(ctx: agenttx.ToolContext) -> dict:
        ctx.register_undo(refund, {"amount": 5})
        with pytest.raises(agenttx.InvalidArgument, match="takes no payload"):
            ctx.register_undo(lambda: None, {"amount": 5})
        return {}

    tx = agenttx.Transaction(tools=[charge, refund])
    tx.execute_step(1, "charge", {})
    tx.rollback()
    assert seen == [{"amount": 5}]


def test_a_declared_compensation_runs_even_when_the_output_is_refused():
    """A tool that acted but returned a non-JSON value is still compensated (output null)."""
    seen = []

    @agenttx.compensation(name="refund")
    def refund(payload):
        seen.append(payload)

    @agenttx.tool(name="charge", compensate=refund)
    def charge(amount: int) -> object:
        return {"receipt": object()}

    tx = agenttx.Transaction(tools=[charge])
    with pytest.raises(agenttx.ToolOutputError):
        tx.execute_step(1, "charge", {"amount": 5})
    assert seen == [{"arguments": {"amount": 5}, "output": None}]


def test_a_timeout_error_raised_by_an_async_tool_is_its_own_error():
    """Only the step deadline reads as a step timeout; the tool's own TimeoutError is kept."""

    @agenttx.tool
    async def fetch() -> dict:
        raise TimeoutError("upstream socket timed out")

    tx = agenttx.Transaction(tools=[fetch])
    result = asyncio.run(tx.aexecute_step(1, "fetch", {}))
    assert result.error == "TimeoutError: upstream socket timed out"


def test_stage_effect_refuses_a_non_string_key():
    """An idempotency key must be a string."""

    @agenttx.tool
    def send(ctx: agenttx.ToolContext) -> dict:
        ctx.stage_effect("email", {}, idempotency_key=12345)  # type: ignore[arg-type]
        return {}

    result = agenttx.Transaction(tools=[send]).execute_step(1, "send", {})
    assert result.error is not None
    assert "idempotency_key must be a string" in result.error


class Blocked:
    """Step 1 creates a customer (refunded on undo), step 2 looks up a price, step 3 charges
    the customer by reference and fails with `ToolError(key=...)` when told to."""

    def __init__(self, key: str | None) -> None:
        self.undone: list[str] = []

        @agenttx.compensation(name="delete_customer")
        def delete_customer(payload) -> None:
            self.undone.append(payload["output"]["customer_id"])

        @agenttx.tool(compensate=delete_customer)
        def create_customer(name: str) -> dict:
            return {"customer_id": f"c-{name}"}

        @agenttx.tool
        def price(sku: str) -> dict:
            return {"sku": sku, "amount": 5}

        @agenttx.tool
        def charge(customer_id: str, amount: int) -> dict:
            raise agenttx.ToolError(f"customer {customer_id} is blocked", key=key)

        self.tools = [delete_customer, create_customer, price, charge]

    def run(self) -> tuple[agenttx.Transaction, agenttx.StepResult]:
        tx = agenttx.Transaction(tools=self.tools)
        tx.execute_step(1, "create_customer", {"name": "ada"})
        tx.execute_step(2, "price", {"sku": "a-1"})
        arguments = {"customer_id": "${steps.1.customer_id}", "amount": "${steps.2.amount}"}
        return tx, tx.execute_step(3, "charge", arguments)


def test_a_tool_error_key_jumps_to_the_step_that_produced_it():
    """ToolError(key="customer_id") at step 3 whose customer_id came from step 1 by reference
    jumps to step 1, compensating it, though the message names no key."""
    blocked = Blocked("customer_id")
    tx, result = blocked.run()
    assert result.strategy is RollbackStrategy.DEPENDENCY_JUMP
    assert (result.rollback_to_step, result.next_step_id) == (1, 1)
    assert result.hint is not None
    assert result.hint.key == "customer_id"
    assert blocked.undone == ["c-ada"]
    assert tx.next_step_id == 1


def test_a_tool_error_without_a_key_backtracks_locally():
    """The same failure without a key cannot find its root cause: a local backtrack to step 2."""
    blocked = Blocked(None)
    _, result = blocked.run()
    assert result.strategy is RollbackStrategy.LOCAL_BACKTRACK
    assert result.rollback_to_step == 2
    assert blocked.undone == []


def test_a_tool_error_key_replaces_the_key_the_cleaner_finds():
    """A message naming one key and `key=` naming another: `key=` drives the search."""

    @agenttx.tool
    def make() -> dict:
        return {"a": 1, "b": 2}

    @agenttx.tool
    def use(a: int, b: int) -> dict:
        raise agenttx.ToolError("KeyError: 'a'", key="b")

    tx = agenttx.Transaction(tools=[make, use])
    tx.execute_step(1, "make", {})
    result = tx.execute_step(2, "use", {"a": 1, "b": "${steps.1.b}"})
    assert result.hint is not None
    assert result.hint.key == "b"
    assert result.hint.rule == "python_key_error"
    assert result.strategy is RollbackStrategy.DEPENDENCY_JUMP


@pytest.mark.parametrize(
    ("dispatcher", "message"),
    [
        (5, r"^dispatcher must be a callable, a mapping of channel names to callables or None"),
        ("email", r"^dispatcher must be a callable.*got str$"),
        ({"email": "not callable"}, r"^dispatcher must map channel names to callables, got str"),
        ({1: print}, r"^dispatcher must map channel names to callables, got int -> "),
    ],
)
def test_a_bad_dispatcher_is_refused_when_the_transaction_is_built(dispatcher, message):
    """Transaction(dispatcher=...) that is not None, a callable or a mapping of channel names to
    callables raises InvalidArgument naming it, before anything is stored."""
    store = MemoryStore()
    with pytest.raises(agenttx.InvalidArgument, match=message):
        agenttx.Transaction(store=store, dispatcher=dispatcher, tx_id="t-1")
    assert not store.is_open("t-1")
    for good in (None, print, {"email": print}, agenttx.JsonlDispatcher("/dev/null")):
        agenttx.Transaction(dispatcher=good)


# ---------------------------------------------------------------- mistakes the model learns from

FK_DETAIL = (
    'insert or update on table "reservations" violates foreign key constraint\n'
    'DETAIL:  Key (customer_id)=({}) is not present in table "customers".'
)


class Till:
    """A charge (refunded on rewind) that echoes its customer, and a reservation that fails on
    an unknown customer (the database's words) or on a quantity that is not an integer."""

    def __init__(self, plain: bool = False) -> None:
        self.calls: list[str] = []
        self.charges: list[str] = []
        self.refunds: list[str] = []
        till = self

        @agenttx.compensation(name="refund")
        def refund(payload: dict) -> None:
            till.refunds.append(payload["output"]["charge_id"])

        @agenttx.tool(compensate=refund, secret=["card"])
        def charge(customer_id: str, amount: int, card: str = "4111") -> dict:
            till.calls.append("charge")
            till.charges.append(f"ch-{len(till.charges) + 1}")
            return {"charge_id": till.charges[-1], "customer_id": customer_id}

        @agenttx.tool
        def reserve(customer_id: str, sku: str, quantity: object = 1) -> dict:
            till.calls.append("reserve")
            if customer_id not in ("c-1", "c-2"):
                raise agenttx.ToolError(FK_DETAIL.format(customer_id))
            if not isinstance(quantity, int):
                message = f'invalid type: "{quantity}" for field quantity, expected an integer'
                if plain:
                    raise ValueError(message)
                raise agenttx.ToolError(message, key="quantity")
            return {"reservation": f"r-{customer_id}-{quantity}"}

        self.tools = [refund, charge, reserve]

    def transaction(self, **options: object) -> agenttx.Transaction:
        return agenttx.Transaction(tools=self.tools, **options)


def order(tx: agenttx.Transaction, customer: str, quantity: object = 1) -> agenttx.StepResult:
    """An agent that sends the charge, then the reservation, as it was told to."""
    charged = tx.call("charge", {"customer_id": customer, "amount": 42})
    assert charged.ok
    return tx.call("reserve", {"customer_id": customer, "sku": "S", "quantity": quantity})


def test_the_same_bad_customer_sent_again_after_a_rewind_ends_the_run():
    """The repeated-mistake scenario: the first failure rewinds to the charge that produced the
    bad customer (one refund) and tells the model the bad value; the same call failing the
    same way again aborts, naming the loop: two charges, two refunds, never a third cycle."""
    till = Till()
    tx = till.transaction()
    first = order(tx, "c-404")
    assert (first.strategy, first.root_cause) == (
        RollbackStrategy.DEPENDENCY_JUMP,
        agenttx.RootCause(1, "customer_id"),
    )
    assert first.bad_value == agenttx.BadValue(key="customer_id", value="c-404", step=1)
    assert first.compensated == ((1, "refund"),)
    results = [first]
    while tx.status is TxStatus.ACTIVE and len(results) < 10:
        results.append(order(tx, "c-404"))  # the model repeats its mistake
    assert len(results) == 2
    last = results[-1]
    assert (last.status, last.strategy) == (StepStatus.FAILED, RollbackStrategy.ABORT)
    assert last.abort_reason == (
        "repeated failure: the same call failed the same way after being rewound once"
    )
    assert last.for_model()["instruction"].startswith("The same call failed the same way")
    assert last.bad_value == first.bad_value
    assert till.charges == till.refunds == ["ch-1", "ch-2"]
    rewinds = [r for r in results if r.strategy is not RollbackStrategy.ABORT]
    assert [len(r.compensated) for r in rewinds] == [1]  # one per distinct mistake


def test_varying_an_argument_the_failure_is_not_about_still_ends_the_run():
    """The same bad customer sent again with another `sku` (an argument the failure's key does
    not name) is the same mistake: one rewind, then the abort; two charges, two refunds."""
    till = Till()
    tx = till.transaction()
    results = []
    while tx.status is TxStatus.ACTIVE and len(results) < 10:
        charged = tx.call("charge", {"customer_id": "c-404", "amount": 42})
        assert charged.ok
        sku = f"S-{len(results)}"  # the model varies what the failure is not about
        results.append(tx.call("reserve", {"customer_id": "c-404", "sku": sku}))
    assert [r.strategy for r in results] == [
        RollbackStrategy.DEPENDENCY_JUMP,
        RollbackStrategy.ABORT,
    ]
    assert results[-1].abort_reason.startswith("repeated failure")
    assert till.charges == till.refunds == ["ch-1", "ch-2"]


def test_distinct_mistakes_each_get_their_rewind():
    """Two different bad customers are two mistakes: each rewinds once; the first one sent
    again then ends the run."""
    till = Till()
    tx = till.transaction()
    strategies = [order(tx, customer).strategy for customer in ("c-404", "c-405", "c-404")]
    assert strategies == [
        RollbackStrategy.DEPENDENCY_JUMP,
        RollbackStrategy.DEPENDENCY_JUMP,
        RollbackStrategy.ABORT,
    ]
    assert len(till.refunds) == 3


@pytest.mark.parametrize("plain", [False, True], ids=["tool-error-key", "plain-exception"])
def test_a_literal_the_tool_refuses_is_resent_and_undoes_nothing(plain):
    """`quantity: "two"` written in the call and refused by the tool (not the schema) is a
    mistake of this step: a resend of step 2, the charge kept, N+1 calls, no compensation."""
    till = Till(plain=plain)
    tx = till.transaction()
    failed = order(tx, "c-1", "two")
    assert (failed.strategy, failed.next_step_id, failed.voided_steps) == (
        RollbackStrategy.RESEND,
        2,
        (),
    )
    assert failed.bad_value == agenttx.BadValue(key="quantity", value="two", step=2)
    assert failed.for_model()["bad_value"] == {"key": "quantity", "value": "two", "step": 2}
    fixed = tx.call("reserve", {"customer_id": "c-1", "sku": "S", "quantity": 2})
    assert fixed.ok
    assert till.calls == ["charge", "reserve", "reserve"]  # N + 1
    assert till.refunds == []
    assert tx.commit().steps_committed == 2


def test_a_literal_pydantic_refuses_is_resent_and_undoes_nothing():
    """A tool that validates its input with pydantic and lets the `ValidationError` out names
    the field on the line before the message: a literal written in the call, so step 2 is
    resent with step 1 kept, N+1 calls and nothing compensated."""
    pydantic = pytest.importorskip("pydantic")

    class Payment(pydantic.BaseModel):
        amount: float

    calls: list[str] = []
    undone: list[str] = []

    @agenttx.tool
    def note(ctx: agenttx.ToolContext, text: str) -> dict:
        calls.append("note")
        ctx.register_undo(lambda: undone.append(text))
        return {"noted": text}

    @agenttx.tool
    def pay(payment: dict) -> dict:
        calls.append("pay")
        return Payment.model_validate(payment).model_dump()

    tx = agenttx.Transaction(tools=[note, pay])
    assert tx.call("note", {"text": "rent"}).ok
    failed = tx.call("pay", {"payment": {"amount": "about 100"}})
    assert (failed.strategy, failed.next_step_id, failed.voided_steps) == (
        RollbackStrategy.RESEND,
        2,
        (),
    )
    assert failed.bad_value == agenttx.BadValue(key="amount", value="about 100", step=2)
    assert tx.call("pay", {"payment": {"amount": 100}}).ok
    assert calls == ["note", "pay", "pay"]
    assert undone == []


def test_a_bad_value_that_came_from_an_earlier_step_still_rewinds_there():
    """The same refusal for a quantity passed on by a reference, or linked implicitly to an
    earlier output, is not this step's mistake: the controller jumps to its producer."""

    @agenttx.tool
    def quote() -> dict:
        return {"quantity": "two"}

    till = Till()
    for quantity in ("${steps.1.quantity}", "two"):
        tx = agenttx.Transaction(tools=[quote, *till.tools])
        tx.call("quote", {})
        result = tx.call("reserve", {"customer_id": "c-1", "sku": "S", "quantity": quantity})
        assert result.strategy is RollbackStrategy.DEPENDENCY_JUMP
        assert result.bad_value == agenttx.BadValue(key="quantity", value="two", step=1)


def test_the_bad_value_is_bounded_and_a_secret_is_redacted():
    """A long value is cut to 200 characters; a tool's secret parameter shows as redacted."""

    @agenttx.tool(secret=["token"])
    def login(user: str, token: str) -> dict:
        raise agenttx.ToolError("rejected", key="token" if user == "ada" else "user")

    tx = agenttx.Transaction(tools=[login])
    secret = tx.call("login", {"user": "ada", "token": "s3cr3t-value"})
    assert secret.bad_value == agenttx.BadValue(
        key="token", value="[redacted]", step=1, redacted=True
    )
    assert "s3cr3t" not in json.dumps(secret.for_model())
    long = tx.call("login", {"user": "x" * 500, "token": "t"})
    assert long.bad_value is not None
    assert long.bad_value.value == "x" * 197 + "..."


def test_a_value_copied_from_an_earlier_output_under_another_key_is_not_a_literal():
    """A customer id written as text, but equal to what step 1 output under another key, came
    from step 1: the normal decision (no resend of the same mistake), the bad value's step 1."""

    @agenttx.tool
    def find(email: str) -> dict:
        return {"customer": "c-old", "visits": 7}

    @agenttx.tool
    def reserve(customer_id: str, quantity: int = 1) -> dict:
        raise agenttx.ToolError(f"customer {customer_id} has a closed account", key="customer_id")

    tx = agenttx.Transaction(tools=[find, reserve])
    assert tx.call("find", {"email": "a@x"}).ok
    copied = tx.call("reserve", {"customer_id": "c-old"})
    assert copied.strategy is not RollbackStrategy.RESEND
    assert copied.bad_value == agenttx.BadValue(key="customer_id", value="c-old", step=1)
    tx = agenttx.Transaction(tools=[find, reserve])
    assert tx.call("find", {"email": "a@x"}).ok
    # a small number equal by chance is still the call's own literal
    failed = tx.call("reserve", {"customer_id": "no", "quantity": 7})
    assert failed.strategy is RollbackStrategy.RESEND


def test_a_huge_integer_bad_value_is_cut_like_a_long_string():
    """An integer whose digits outnumber 200 shows as its first 197 digits and `...`."""

    @agenttx.tool
    def size(n: int) -> dict:
        raise agenttx.ToolError("n too big", key="n")

    for n, text in ((10**4000, "1" + "0" * 196 + "..."), (-(10**250), "-1" + "0" * 195 + "...")):
        result = agenttx.Transaction(tools=[size]).call("size", {"n": n})
        assert result.bad_value is not None
        assert result.bad_value.value == text
        assert len(json.dumps(result.for_model()["bad_value"])) < 300
    kept = agenttx.Transaction(tools=[size]).call("size", {"n": 10**199})
    assert kept.bad_value is not None
    assert kept.bad_value.value == 10**199


@pytest.mark.parametrize("kind", ["int", "duplicate", "nested", "number"])
def test_a_secret_argument_never_reaches_the_hint_error_constraints_or_audit(kind):
    """The value of a secret parameter quoted by the tool's error (Python's `int()`, a
    database's duplicate key, a nested field, a number) shows as `[redacted]` in the hint,
    the error, the constraints, `for_model()` and the audit trail."""
    secret: object = "S3CRET-4242"

    @agenttx.tool(secret=["pin"])
    def unlock(pin: object, user: str) -> dict:
        if kind == "int":
            int(str(pin))
        leaf = pin["code"] if isinstance(pin, dict) else pin
        raise ValueError(
            'duplicate key value violates unique constraint "pins_pkey"\n'
            f"DETAIL:  Key (pin)=({leaf}) already exists."
        )

    pin: object = secret
    if kind == "nested":
        pin = {"code": secret}
    elif kind == "number":
        secret = 987654321
        pin = secret
    tx = agenttx.Transaction(tools=[unlock])
    result = tx.call("unlock", {"pin": pin, "user": "ada"})
    assert not result.ok
    shown = str(secret)
    assert "[redacted]" in result.hint.text
    for text in (
        result.hint.text,
        result.error,
        json.dumps(result.for_model()),
        json.dumps(list(result.constraints)),
        json.dumps(list(tx.constraints)),
        repr(tx.audit()),
    ):
        assert shown not in text


def test_the_async_path_names_the_bad_value_and_stops_the_loop_alike():
    """acall decides and reports as call does: a refused literal is resent with its bad value,
    the same call failing the same way after a rewind aborts, each undo reported."""
    till = Till()
    tx = till.transaction()

    async def agent() -> list[agenttx.StepResult]:
        results = []
        for customer, quantity in (("c-1", "two"), ("c-404", 1), ("c-404", 1)):
            assert (await tx.acall("charge", {"customer_id": customer, "amount": 42})).ok
            arguments = {"customer_id": customer, "sku": "S", "quantity": quantity}
            results.append(await tx.acall("reserve", arguments))
        return results

    literal, rewound, ended = asyncio.run(agent())
    assert (literal.strategy, literal.bad_value, literal.compensated) == (
        RollbackStrategy.RESEND,
        agenttx.BadValue(key="quantity", value="two", step=2),
        (),
    )
    assert (rewound.strategy, rewound.compensated) == (
        RollbackStrategy.DEPENDENCY_JUMP,
        ((2, "refund"),),
    )
    assert ended.strategy is RollbackStrategy.ABORT
    assert ended.compensated == ((2, "refund"), (1, "refund"))
    assert till.refunds == ["ch-2", "ch-3", "ch-1"]
