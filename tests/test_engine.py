"""The engine: transactions on one store, per-transaction policies, configuration, reaping."""

from __future__ import annotations

import gc
import threading
import time
import tracemalloc
from unittest import mock

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import agenttx
import agenttx.builtins
import agenttx.stores
from agenttx import Engine, EngineConfig, RollbackPolicy, Transaction, TxStatus
from agenttx._engine import SWEEP_MIN


@agenttx.tool
def put(ctx: agenttx.ToolContext, key: str, value: int) -> dict:
    ctx.register_undo(lambda: UNDONE.append(key))
    ctx.state.put(key, value)
    return {"key": key}


UNDONE: list[str] = []


def test_transactions_share_the_engine_store():
    """Two transactions of one engine see each other's commits and conflict on shared keys."""
    engine = Engine(tools=[put])
    first, second = engine.begin(agent_id="a"), engine.begin(agent_id="b")
    first.execute_step(1, "put", {"key": "k", "value": 1})
    second.execute_step(1, "put", {"key": "k", "value": 2})
    first.commit()
    assert second.read("k") == 2  # its own write
    assert engine.begin().read("k") == 1  # the committed value
    with pytest.raises(agenttx.WriteConflict):
        second.commit()
    assert engine.store.read_committed("k") == "1"


def test_get_finds_live_and_ended_transactions():
    """get() returns any transaction the engine began, ended ones with their final status."""
    engine = Engine(tools=[put])
    tx = engine.begin()
    tx.commit()
    assert engine.get(tx.id) is tx
    assert engine.get(tx.id).view().status is TxStatus.COMMITTED
    assert engine.transactions() == (tx,)
    with pytest.raises(agenttx.TransactionNotFound, match="`nope` not found"):
        engine.get("nope")


def test_a_per_transaction_policy_overrides_only_the_fields_it_names():
    """begin(policy={...}) keeps the engine's other policy fields; a RollbackPolicy replaces it."""
    config = EngineConfig(policy=RollbackPolicy(max_local_depth=5, max_global_resets=3))
    engine = Engine(config=config)
    tx = engine.begin(policy={"max_global_resets": 0})
    assert tx.policy == RollbackPolicy(max_local_depth=5, max_global_resets=0)
    assert engine.begin(policy=RollbackPolicy()).policy == RollbackPolicy()
    assert engine.begin().policy == config.policy
    with pytest.raises(agenttx.InvalidArgument, match="unknown policy field"):
        engine.begin(policy={"depth": 1})
    with pytest.raises(agenttx.InvalidArgument, match="max_local_depth must be <= 16"):
        engine.begin(policy={"max_local_depth": 17})


def test_configuration_from_the_environment():
    """AGENTTX_* variables set the engine's settings, with their documented names and defaults."""
    config = EngineConfig.from_env(
        {
            "AGENTTX_STEP_TIMEOUT_MS": "2500",
            "AGENTTX_TX_IDLE_TIMEOUT_SECS": "60",
            "AGENTTX_COMPENSATION_RETRIES": "5",
            "AGENTTX_MAX_CONSTRAINTS": "8",
            "AGENTTX_MAX_LOCAL_DEPTH": "4",
            "AGENTTX_MAX_GLOBAL_RESETS": "2",
            "AGENTTX_REPLAY_BUDGET_FACTOR": "0.5",
            "AGENTTX_MISTAKE_RETRIES": "0",
        }
    )
    assert (config.step_timeout, config.idle_timeout) == (2.5, 60.0)
    assert (config.compensation_retries, config.max_constraints) == (5, 8)
    assert config.policy == RollbackPolicy(
        max_local_depth=4, max_global_resets=2, replay_budget_factor=0.5, mistake_retries=0
    )
    assert EngineConfig.from_env({}) == EngineConfig()
    assert EngineConfig.from_env({"AGENTTX_TX_IDLE_TIMEOUT_SECS": "0"}).idle_timeout is None


@pytest.mark.parametrize(
    ("variable", "value", "message"),
    [
        ("AGENTTX_STEP_TIMEOUT_MS", "0", "step_timeout must be a number > 0"),
        ("AGENTTX_COMPENSATION_RETRIES", "0", "compensation_retries must be an integer > 0"),
        ("AGENTTX_MAX_CONSTRAINTS", "0", "max_constraints must be an integer > 0"),
        ("AGENTTX_MAX_LOCAL_DEPTH", "17", "max_local_depth must be <= 16"),
        ("AGENTTX_MISTAKE_RETRIES", "17", "mistake_retries must be <= 16"),
        (
            "AGENTTX_REPLAY_BUDGET_FACTOR",
            "nan",
            r"replay_budget_factor must be within \[0.1, 1000\]",
        ),
        (
            "AGENTTX_MAX_GLOBAL_RESETS",
            "two",
            "AGENTTX_MAX_GLOBAL_RESETS='two' is not a valid number",
        ),
    ],
)
def test_bad_environment_values_are_refused(variable, value, message):
    """A zero timeout, zero retries or an out-of-range policy is refused with a clear message."""
    with pytest.raises(agenttx.InvalidArgument, match=message):
        EngineConfig.from_env({variable: value})


def test_reap_idle_aborts_only_idle_active_transactions():
    """Idle ACTIVE transactions are compensated and end ROLLED_BACK; others are left alone."""
    UNDONE.clear()
    engine = Engine(tools=[put], config=EngineConfig(idle_timeout=0.05))
    idle, fresh, ended = engine.begin(), engine.begin(), engine.begin()
    idle.execute_step(1, "put", {"key": "idle", "value": 1})
    ended.commit()
    time.sleep(0.06)
    fresh.view()  # any call counts as activity
    assert engine.reap_idle() == 1
    assert idle.status is TxStatus.ROLLED_BACK
    assert UNDONE == ["idle"]
    assert fresh.status is TxStatus.ACTIVE
    assert ended.status is TxStatus.COMMITTED
    assert engine.get(idle.id).view().status is TxStatus.ROLLED_BACK


def test_busy_transactions_are_skipped():
    """A transaction in the middle of a call is not reaped, however idle it looked."""
    started, release = threading.Event(), threading.Event()

    @agenttx.tool
    def slow() -> dict:
        started.set()
        release.wait(5)
        return {}

    engine = Engine(tools=[slow], config=EngineConfig(idle_timeout=0.01))
    tx = engine.begin()
    worker = threading.Thread(target=tx.execute_step, args=(1, "slow", {}))
    worker.start()
    started.wait(5)
    time.sleep(0.02)
    assert engine.reap_idle() == 0
    release.set()
    worker.join()
    assert tx.status is TxStatus.ACTIVE


def test_the_reaper_thread_reaps_and_stops_on_close():
    """start_reaper() reaps in the background; leaving the with block stops it."""
    with Engine(tools=[put], config=EngineConfig(idle_timeout=0.05)) as engine:
        tx = engine.begin()
        engine.start_reaper()
        deadline = time.monotonic() + 5
        while tx.status is TxStatus.ACTIVE and time.monotonic() < deadline:
            time.sleep(0.01)
        assert tx.status is TxStatus.ROLLED_BACK
    assert engine._reaper is None


def test_reaping_disabled():
    """With idle_timeout=None nothing is reaped and no thread starts."""
    engine = Engine(config=EngineConfig(idle_timeout=None))
    engine.begin()
    assert engine.reap_idle() == 0
    engine.start_reaper()
    assert engine._reaper is None


def test_bad_configuration_is_refused():
    """Out-of-range settings raise InvalidArgument naming the setting."""
    with pytest.raises(agenttx.InvalidArgument, match="idle_timeout"):
        EngineConfig(idle_timeout=0)
    with pytest.raises(agenttx.InvalidArgument, match="policy must be"):
        EngineConfig(policy="strict")  # type: ignore[arg-type]
    with pytest.raises(agenttx.InvalidArgument, match="config must be"):
        Engine(config={"step_timeout": 1})  # type: ignore[arg-type]


# ---------------------------------------------------------------- isolation


@agenttx.tool
def on_call_check(ctx: agenttx.ToolContext, me: str, other: str) -> dict:
    """The write-skew example: go off call only if the other doctor is still on call."""
    if ctx.state.get(f"oncall/{other}") != "yes":
        raise agenttx.ToolError(f"{other} is not on call")
    ctx.state.put(f"oncall/{me}", "no")
    return {"off": me}


def _doctors(isolation):
    engine = Engine(tools=[on_call_check], config=EngineConfig(isolation=isolation))
    setup = engine.begin(isolation="read_committed")
    setup_store = engine.store
    setup_store.put(setup.id, "oncall/alice", '"yes"')
    setup_store.put(setup.id, "oncall/bob", '"yes"')
    setup.commit()
    alice, bob = engine.begin(), engine.begin()
    assert alice.execute_step(1, "on_call_check", {"me": "alice", "other": "bob"}).ok
    assert bob.execute_step(1, "on_call_check", {"me": "bob", "other": "alice"}).ok
    return engine, alice, bob


@pytest.mark.parametrize("isolation", ["read_committed", "no_lost_updates"])
def test_below_serializable_write_skew_is_allowed(isolation):
    """Read committed and the default both let both doctors go off call (documented skew)."""
    engine, alice, bob = _doctors(isolation)
    alice.commit()
    bob.commit()
    assert engine.store.read_committed("oncall/alice") == '"no"'
    assert engine.store.read_committed("oncall/bob") == '"no"'


def test_serializable_refuses_write_skew_with_a_read_conflict():
    """Serializable: the second commit read a key the first changed, so it fails and aborts."""
    engine, alice, bob = _doctors("serializable")
    alice.commit()
    with pytest.raises(agenttx.ReadConflict) as caught:
        bob.commit()
    assert caught.value.key == "oncall/alice"
    assert isinstance(caught.value, agenttx.WriteConflict)
    assert bob.status is TxStatus.FAILED
    assert engine.store.read_committed("oncall/bob") == '"yes"'


def test_serializable_reads_of_own_writes_and_unchanged_keys_commit():
    """Reads of keys nobody else committed, or of the transaction's own writes, do not conflict."""
    engine = Engine(tools=[put], config=EngineConfig(isolation="serializable"))
    tx = engine.begin()
    tx.execute_step(1, "put", {"key": "k", "value": 1})
    assert tx.read("k") == 1
    assert tx.read("absent") is None
    other = engine.begin()
    other.execute_step(1, "put", {"key": "unrelated", "value": 2})
    other.commit()
    assert tx.commit().steps_committed == 1


def test_a_read_of_an_absent_key_conflicts_when_it_is_created():
    """Reading "absent" is a read too: another transaction creating the key conflicts."""
    store = agenttx.stores.MemoryStore()
    store.begin("reader", isolation="serializable")
    assert store.get("reader", "k") is None
    store.begin("writer")
    store.put("writer", "k", "1")
    store.commit("writer")
    store.put("reader", "other", "2")
    with pytest.raises(agenttx.ReadConflict, match="`k`"):
        store.commit("reader")
    assert store.is_open("reader")  # a conflicting commit changes nothing


@agenttx.tool
def read_number(ctx: agenttx.ToolContext, key: str) -> int:
    """The number at `key` (0 if absent)."""
    return ctx.state.get(key) or 0


@pytest.mark.parametrize("isolation", [None, "read_committed"])
def test_the_default_isolation_refuses_a_lost_update(isolation):
    """A step reads a key, another transaction commits it, a later step writes it: by default
    the commit conflicts; read committed loses the other update (documented)."""
    config = EngineConfig() if isolation is None else EngineConfig(isolation=isolation)
    engine = Engine(tools=[read_number, put], config=config)
    assert engine.config.isolation == (isolation or "no_lost_updates")
    slow, fast = engine.begin(), engine.begin()
    assert slow.execute_step(1, "read_number", {"key": "n"}).output == 0
    fast.execute_step(1, "put", {"key": "n", "value": 1})
    fast.commit()
    slow.execute_step(2, "put", {"key": "n", "value": 1})  # 0 + 1: fast's increment is lost
    if isolation is None:
        with pytest.raises(agenttx.WriteConflict) as caught:
            slow.commit()
        assert type(caught.value) is agenttx.WriteConflict
        assert caught.value.key == "n"
    else:
        slow.commit()
    assert engine.store.committed_version("n") == (1 if isolation is None else 2)


def test_isolation_values_are_checked():
    """Only the three isolation levels are accepted."""
    with pytest.raises(agenttx.InvalidArgument, match="isolation must be"):
        agenttx.Transaction(isolation="snapshot")  # type: ignore[arg-type]
    with pytest.raises(agenttx.InvalidArgument, match="isolation must be"):
        EngineConfig(isolation="repeatable")  # type: ignore[arg-type]
    assert EngineConfig.from_env({"AGENTTX_ISOLATION": "serializable"}).isolation == (
        "serializable"
    )


# ---------------------------------------------------------------- the ended transactions kept


def _run(engine: Engine, count: int, key: str = "k") -> None:
    """Begin `count` transactions, each with one step writing `key`, and commit them."""
    for value in range(count):
        tx = engine.begin()
        tx.execute_step(1, "put", {"key": key, "value": value})
        tx.commit()


def test_the_engine_keeps_at_most_keep_ended_ended_transactions():
    """10,000 ended transactions: the engine holds the 100 last ended, and every live one."""
    engine = Engine(tools=[put], config=EngineConfig(keep_ended=100))
    live = [engine.begin() for _ in range(3)]
    first = engine.begin()
    first.commit()
    _run(engine, 9_999)
    # begin alone keeps the live view bounded, without anyone calling transactions()
    assert len(engine._live) <= max(2 * len(live), SWEEP_MIN) + 1
    held = engine.transactions()
    assert len(held) == 100 + len(live)
    assert held[: len(live)] == tuple(live)  # begin order: the live ones began first
    assert all(tx.status is TxStatus.COMMITTED for tx in held[len(live) :])
    for tx in live:
        assert engine.get(tx.id) is tx
    assert engine.get(held[-1].id) is held[-1]
    with pytest.raises(agenttx.TransactionNotFound):
        engine.get(first.id)  # evicted: the oldest ended go first


def test_memory_stays_bounded_once_the_cap_is_reached():
    """Past keep_ended, 2,000 more transactions add no memory (unbounded: about 6 MB)."""
    engine = Engine(tools=[put], config=EngineConfig(keep_ended=100))
    tracemalloc.start()
    try:
        _run(engine, 1_000)
        gc.collect()
        before = tracemalloc.get_traced_memory()[0]
        _run(engine, 2_000)
        gc.collect()
        growth = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert growth < 1_000_000


def test_ended_transactions_are_evicted_after_keep_ended_for():
    """An ended transaction older than keep_ended_for is gone; a live one never is."""
    engine = Engine(tools=[put], config=EngineConfig(keep_ended_for=0.05, idle_timeout=None))
    ended, live = engine.begin(), engine.begin()
    ended.commit()
    assert engine.get(ended.id) is ended  # ended just now: kept
    time.sleep(0.06)
    with pytest.raises(agenttx.TransactionNotFound):
        engine.get(ended.id)
    assert engine.get(live.id) is live
    assert engine.transactions() == (live,)


def test_keep_ended_zero_keeps_no_ended_transaction_and_none_keeps_all():
    """keep_ended=0 forgets a transaction once it ends; None (with no age limit) keeps it."""
    forgetful = Engine(tools=[put], config=EngineConfig(keep_ended=0))
    tx = forgetful.begin()
    assert forgetful.get(tx.id) is tx
    tx.commit()
    with pytest.raises(agenttx.TransactionNotFound):
        forgetful.get(tx.id)
    keeper = Engine(tools=[put], config=EngineConfig(keep_ended=None, keep_ended_for=None))
    _run(keeper, 300)
    assert len(keeper.transactions()) == 300


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("keep_ended", -1),
        ("keep_ended", 1.5),
        ("keep_ended", True),
        ("keep_ended", "10"),
        ("keep_ended_for", -1.0),
        ("keep_ended_for", float("nan")),
        ("keep_ended_for", float("inf")),
        ("keep_ended_for", "60"),
        ("keep_ended_for", False),
    ],
)
def test_bad_keep_ended_settings_are_refused(field, value):
    """keep_ended must be an int >= 0 and keep_ended_for finite seconds >= 0, or None."""
    with pytest.raises(agenttx.InvalidArgument, match=f"^{field} must be"):
        EngineConfig(**{field: value})


def test_keep_ended_settings_accept_zero_and_none():
    """Zero and None are valid for both settings; the defaults are 1000 and one hour."""
    assert (EngineConfig().keep_ended, EngineConfig().keep_ended_for) == (1000, 3600.0)
    EngineConfig(keep_ended=0, keep_ended_for=0)
    EngineConfig(keep_ended=None, keep_ended_for=None)


def test_reap_idle_inspects_only_the_live_transactions():
    """reap_idle asks only live transactions whether they are idle, however many have ended."""
    engine = Engine(tools=[put], config=EngineConfig(keep_ended=None, keep_ended_for=None))
    live = [engine.begin() for _ in range(5)]
    _run(engine, 1_000)
    real = Transaction.abort_if_idle
    with mock.patch.object(
        Transaction, "abort_if_idle", autospec=True, side_effect=real
    ) as inspected:
        assert engine.reap_idle() == 0
        assert inspected.call_count == len(live)
        inspected.reset_mock()
        live[0].commit()
        assert engine.reap_idle() == 0
        assert inspected.call_count == len(live) - 1
    assert len(engine.transactions()) == 1_005  # nothing lost: the ended ones are only moved


def test_a_reaped_transaction_joins_the_ended_ones():
    """A transaction the reaper aborted is found by get until the ended view evicts it."""
    engine = Engine(tools=[put], config=EngineConfig(idle_timeout=0.01, keep_ended=1))
    first, second = engine.begin(), engine.begin()
    time.sleep(0.02)
    assert engine.reap_idle() == 2
    assert len(engine._live) == 0
    held = engine.transactions()
    assert len(held) == 1
    assert held[0].status is TxStatus.ROLLED_BACK
    assert held[0] in (first, second)


@settings(max_examples=50)
@given(
    keep=st.integers(0, 4),
    ops=st.lists(
        st.tuples(
            st.sampled_from(["begin", "commit", "rollback", "get", "list"]), st.integers(0, 9)
        ),
        max_size=60,
    ),
)
def test_the_engine_view_agrees_with_a_model(keep, ops):
    """Live transactions are always found; at most keep_ended ended ones, all genuinely ended."""
    engine = Engine(config=EngineConfig(keep_ended=keep, idle_timeout=None))
    began: list[Transaction] = []
    for op, index in ops:
        if op == "begin":
            began.append(engine.begin())
            continue
        if not began:
            continue
        tx = began[index % len(began)]
        if op in ("commit", "rollback") and tx.status is TxStatus.ACTIVE:
            tx.commit() if op == "commit" else tx.rollback()
        elif op == "get":
            try:
                assert engine.get(tx.id) is tx
            except agenttx.TransactionNotFound:
                assert tx.status.terminal
        held = engine.transactions() if op == "list" else None
        if held is not None:
            ended = [t for t in held if t.status.terminal]
            assert len(ended) <= keep
            assert [t for t in held if not t.status.terminal] == [
                t for t in began if not t.status.terminal
            ]
            order = [began.index(t) for t in held]
            assert order == sorted(order)
    for tx in began:
        if not tx.status.terminal:
            assert engine.get(tx.id) is tx


def test_concurrent_begins_and_reaping_keep_the_bounds():
    """Threads begin and end transactions while another reaps and lists: no error, bounds kept."""
    errors: list[BaseException] = []
    done = threading.Event()
    config = EngineConfig(keep_ended=20, idle_timeout=1.0)

    def work(engine: Engine, key: str) -> None:
        try:
            _run(engine, 300, key)
            for _ in range(20):
                engine.begin()  # left live
        except BaseException as exc:  # reported below
            errors.append(exc)

    def watch(engine: Engine) -> None:
        try:
            while not done.is_set():
                engine.reap_idle()
                for tx in engine.transactions():
                    try:
                        assert engine.get(tx.id) is tx
                    except agenttx.TransactionNotFound:
                        assert tx.status.terminal  # ended and evicted since the listing
        except BaseException as exc:  # reported below
            errors.append(exc)

    with Engine(tools=[put], config=config) as engine:
        engine.start_reaper()
        workers = [threading.Thread(target=work, args=(engine, f"k{n}")) for n in range(4)]
        watcher = threading.Thread(target=watch, args=(engine,))
        for thread in (*workers, watcher):
            thread.start()
        for worker in workers:
            worker.join()
        done.set()
        watcher.join()
    assert errors == []
    held = engine.transactions()
    assert sum(tx.status.terminal for tx in held) <= 20
    assert sum(not tx.status.terminal for tx in held) == 80


# ---------------------------------------------------------------- misuse


def test_start_reaper_after_close_is_refused():
    """start_reaper() on a closed engine raises FailedPrecondition saying what to do instead."""
    engine = Engine(config=EngineConfig(idle_timeout=1.0))
    engine.close()
    engine.close()  # idempotent
    with pytest.raises(agenttx.FailedPrecondition, match="create a new Engine"):
        engine.start_reaper()
    assert engine._reaper is None
    assert engine.begin().status is TxStatus.ACTIVE  # close stops the reaper, nothing else


def test_a_non_store_is_refused_by_name():
    """store= something that is not a Store raises InvalidArgument naming `store`."""
    for bogus in ("agent.db", {"k": "v"}, object()):
        with pytest.raises(agenttx.InvalidArgument, match=r"^store must implement"):
            Engine(store=bogus)  # type: ignore[arg-type]


def test_a_bad_dispatcher_is_refused_by_name():
    """dispatcher= must be a callable or a mapping of channel names to callables."""
    with pytest.raises(agenttx.InvalidArgument, match=r"^dispatcher must be"):
        Engine(dispatcher=5)  # type: ignore[arg-type]
    with pytest.raises(agenttx.InvalidArgument, match=r"^dispatcher must map"):
        Engine(dispatcher={"email": "not callable"})  # type: ignore[dict-item]
    Engine(dispatcher={"email": print})
    Engine(dispatcher=print)


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda engine: engine.get(5), "^tx_id must be a string, got int"),
        (lambda engine: engine.get(["a"]), "^tx_id must be a string, got list"),
        (lambda engine: engine.begin(agent_id=5), "^agent_id must be a string, got int"),
        (lambda engine: engine.begin(policy=5), "^policy must be a RollbackPolicy"),
        (lambda engine: engine.begin(policy={1: 2}), "^unknown policy field"),
        (lambda engine: engine.begin(isolation="snapshot"), "^isolation must be"),
        (lambda engine: engine.recover("later"), "^mode must be 'abort' or 'resume'"),
        (lambda engine: engine.recover(["abort"]), "^mode must be 'abort' or 'resume'"),
        (lambda engine: engine.pending_effects(0), "^limit must be an integer > 0"),
        (lambda engine: engine.pending_effects("10"), "^limit must be an integer > 0"),
        (lambda engine: engine.dispatch_pending(-1), "^limit must be an integer > 0"),
    ],
)
@pytest.mark.parametrize("durable", [False, True])
def test_misuse_of_engine_methods_raises_invalid_argument(tmp_path, durable, call, message):
    """Wrong argument types or values raise InvalidArgument naming the argument, on any store."""
    store = agenttx.stores.SQLiteStore(tmp_path / "db") if durable else None
    engine = Engine(store=store, dispatcher=print)
    try:
        with pytest.raises(agenttx.InvalidArgument, match=message):
            call(engine)
    finally:
        if store is not None:
            store.close()


def test_a_bad_idle_timeout_is_refused():
    """idle_timeout must be a number > 0 or None; a string or a bool is refused."""
    for bogus in ("5", True, -1, float("nan")):
        with pytest.raises(agenttx.InvalidArgument, match="idle_timeout"):
            EngineConfig(idle_timeout=bogus)  # type: ignore[arg-type]


# ---------------------------------------------------------------- idleness


def test_a_step_longer_than_the_idle_timeout_is_not_reaped_when_it_returns():
    """Idleness counts from the end of the last call: a 0.3 s step survives a 0.2 s timeout."""

    @agenttx.tool
    def slow() -> dict:
        time.sleep(0.3)
        return {}

    engine = Engine(tools=[slow], config=EngineConfig(idle_timeout=0.2))
    tx = engine.begin()
    assert tx.execute_step(1, "slow", {}).ok
    assert engine.reap_idle() == 0
    assert tx.status is TxStatus.ACTIVE


# ---------------------------------------------------------------- close gives up what it holds


def _kv_tools(tmp_path) -> list:
    return list(agenttx.builtins.tools(str(tmp_path / "files")))


def test_a_closed_engines_open_transactions_are_recovered_at_once(durable_backend, tmp_path):
    """close() releases the engine's open transactions (SQLite: owner; PostgreSQL: lease), so
    another engine on the same backend, in this live process, recovers them at once and goes
    on from the step after the last; the closed engine's store stays open."""
    store = durable_backend(lease_seconds=60.0)
    first = Engine(tools=_kv_tools(tmp_path), store=store)
    tx = first.begin(agent_id="a")
    assert tx.call("kv.put", {"key": "n", "value": 7}).ok
    first.close()
    first.close()  # idempotent
    other = Engine(tools=_kv_tools(tmp_path), store=durable_backend(lease_seconds=60.0))
    report = other.recover("resume")
    assert report.resumed == (tx.id,)
    assert report.skipped == ()
    resumed = other.get(tx.id)
    assert resumed.next_step_id == 2
    assert resumed.call("kv.put", {"key": "m", "value": "${steps.1.value}"}).ok
    assert resumed.commit().steps_committed == 2
    assert (store.read_committed("kv/n"), store.read_committed("kv/m")) == ("7", "7")


_CLOSE_THEN_WAIT = """
import sys
import agenttx, agenttx.builtins
from agenttx.stores import SQLiteStore
store = SQLiteStore(sys.argv[1])
engine = agenttx.Engine(tools=list(agenttx.builtins.tools(sys.argv[2])), store=store)
tx = engine.begin()
assert tx.call("kv.put", {"key": "n", "value": 7}).ok
engine.close()
print(tx.id, flush=True)
sys.stdin.read()  # alive, its store open, until the parent is done
"""


@pytest.mark.timeout(120)
def test_a_live_process_that_closed_its_engine_leaves_its_transactions_to_recovery(tmp_path):
    """A process that closed its engine but lives on (its SQLiteStore still open) does not
    keep its transactions: another process's engine recovers them at once."""
    import os  # noqa: PLC0415
    import subprocess  # noqa: PLC0415
    import sys  # noqa: PLC0415
    from pathlib import Path  # noqa: PLC0415

    db = tmp_path / "shared.db"
    root = str(Path(__file__).resolve().parent.parent)
    env = {**os.environ, "PYTHONPATH": root}
    with subprocess.Popen(
        [sys.executable, "-c", _CLOSE_THEN_WAIT, str(db), str(tmp_path / "files")],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env=env,
    ) as worker:
        assert worker.stdout is not None
        tx_id = worker.stdout.readline().strip()
        assert worker.poll() is None  # alive
        with agenttx.stores.SQLiteStore(db) as store:
            engine = Engine(tools=_kv_tools(tmp_path), store=store)
            report = engine.recover("resume")
            assert (report.resumed, report.skipped) == ((tx_id,), ())
            assert engine.get(tx_id).commit().steps_committed == 1
        worker.communicate("", timeout=60)
    assert worker.returncode == 0


def test_close_leaves_ended_transactions_and_a_memory_store_alone(tmp_path):
    """close() on a MemoryStore engine releases nothing and breaks nothing."""
    engine = Engine(tools=_kv_tools(tmp_path))
    tx = engine.begin()
    assert tx.call("kv.put", {"key": "n", "value": 1}).ok
    engine.close()
    assert tx.commit().steps_committed == 1
