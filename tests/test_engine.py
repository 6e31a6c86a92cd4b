"""The engine: transactions on one store, per-transaction policies, configuration, reaping."""

from __future__ import annotations

import threading
import time

import pytest

import agenttx
import agenttx.stores
from agenttx import Engine, EngineConfig, RollbackPolicy, TxStatus


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
    """AGENTTX_* variables set the engine's settings, with the reference's names and defaults."""
    config = EngineConfig.from_env(
        {
            "AGENTTX_STEP_TIMEOUT_MS": "2500",
            "AGENTTX_TX_IDLE_TIMEOUT_SECS": "60",
            "AGENTTX_COMPENSATION_RETRIES": "5",
            "AGENTTX_MAX_CONSTRAINTS": "8",
            "AGENTTX_MAX_LOCAL_DEPTH": "4",
            "AGENTTX_MAX_GLOBAL_RESETS": "2",
            "AGENTTX_REPLAY_BUDGET_FACTOR": "0.5",
        }
    )
    assert (config.step_timeout, config.idle_timeout) == (2.5, 60.0)
    assert (config.compensation_retries, config.max_constraints) == (5, 8)
    assert config.policy == RollbackPolicy(
        max_local_depth=4, max_global_resets=2, replay_budget_factor=0.5
    )
    assert EngineConfig.from_env({}) == EngineConfig()
    assert EngineConfig.from_env({"AGENTTX_TX_IDLE_TIMEOUT_SECS": "0"}).idle_timeout is None


@pytest.mark.parametrize(
    ("variable", "value", "message"),
    [
        ("AGENTTX_STEP_TIMEOUT_MS", "0", "step timeout must be > 0"),
        ("AGENTTX_COMPENSATION_RETRIES", "0", "compensation retries must be an integer > 0"),
        ("AGENTTX_MAX_CONSTRAINTS", "0", "max constraints must be an integer > 0"),
        ("AGENTTX_MAX_LOCAL_DEPTH", "17", "max_local_depth must be <= 16"),
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
    with pytest.raises(agenttx.InvalidArgument, match="idle timeout"):
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
