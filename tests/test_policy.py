"""The rollback controller: policy validation, replay budget, the decision algorithm, retries."""

from __future__ import annotations

import json
import math

import attrs
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from agenttx import Dependency, DependencyGraph, InvalidArgument
from agenttx._rollback import (
    MAX_REPEATS,
    ControllerState,
    RollbackController,
    RollbackDecision,
    RollbackPolicy,
    RollbackStrategy,
    failure_signature,
)

RETRY = RollbackStrategy.RETRY
RESEND = RollbackStrategy.RESEND
LOCAL = RollbackStrategy.LOCAL_BACKTRACK
JUMP = RollbackStrategy.DEPENDENCY_JUMP
RESET = RollbackStrategy.GLOBAL_RESET
ABORT = RollbackStrategy.ABORT

DEPTH = "local backtrack depth exhausted"
BUDGET = "replay budget exceeded"


def retry(step):
    return RollbackDecision(strategy=RETRY, target_step=step)


def resend(step):
    return RollbackDecision(strategy=RESEND, target_step=step)


def local(target, depth):
    return RollbackDecision(strategy=LOCAL, target_step=target, depth=depth)


def jump(target, key):
    return RollbackDecision(strategy=JUMP, target_step=target, root_key=key)


def reset(reason):
    return RollbackDecision(strategy=RESET, target_step=0, reason=reason)


def abort(reason, resets=1):
    return RollbackDecision(
        strategy=ABORT,
        target_step=0,
        reason=f"{reason}; global reset budget ({resets}) exhausted",
    )


def no_root(step, key):
    return None


def root_at(root):
    return lambda step, key: root


def controller(**policy):
    return RollbackController(RollbackPolicy(**policy))


# ---------------------------------------------------------------- policy and budget


@pytest.mark.parametrize(
    ("factor", "horizon", "budget"),
    [
        (2.0, 0, 2),
        (2.0, 3, 12),
        (2.0, 5, 30),
        (2.0, 10, 80),
        (2.0, 50, 600),
        (0.5, 8, 16),
        (0.1, 8, 4),
    ],
)
def test_budget_values_from_the_spec(factor, horizon, budget):
    """budget(N) = max(1, ceil(c * n * ceil(log2(n + 1)))) gives the documented table."""
    assert RollbackPolicy(replay_budget_factor=factor).budget(horizon) == budget


def test_budget_treats_horizons_below_one_as_one():
    """n = max(N, 1): horizons 0 and -5 budget like horizon 1; the minimum budget is 1."""
    policy = RollbackPolicy()
    assert policy.budget(-5) == policy.budget(0) == policy.budget(1) == 2
    assert RollbackPolicy(replay_budget_factor=0.1).budget(1) == 1


def test_budget_rounds_float_products_as_the_reference():
    """c = 0.1, N = 3: 0.1 * 3 * 2 is 0.6000000000000001 in floats, so the budget is 1."""
    assert RollbackPolicy(replay_budget_factor=0.1).budget(3) == 1


def test_budget_of_huge_horizons_is_exact():
    """Horizons beyond float precision are budgeted with exact arithmetic."""
    horizon = 2**60 + 1
    assert RollbackPolicy().budget(horizon) == 2 * horizon * 61


@given(st.floats(0.1, 1000), st.integers(0, 10_000))
def test_budget_matches_the_formula_and_grows_with_the_horizon(factor, horizon):
    """The budget is the float formula with log2 in floats, and never shrinks as N grows."""
    policy = RollbackPolicy(replay_budget_factor=factor)
    n = max(horizon, 1)
    expected = max(1, math.ceil(factor * n * math.ceil(math.log2(n + 1))))
    assert policy.budget(horizon) == expected
    assert policy.budget(horizon + 1) >= policy.budget(horizon)


@pytest.mark.parametrize("horizon", [1.0, "3", True, None])
def test_budget_rejects_non_int_horizons(horizon):
    """budget() wants an int horizon."""
    with pytest.raises(InvalidArgument, match="horizon must be an int"):
        RollbackPolicy().budget(horizon)


def test_policy_defaults():
    """The defaults are D=2, one global reset, c=2.0, one transient retry, three resends."""
    policy = RollbackPolicy()
    assert policy.max_local_depth == 2
    assert policy.max_global_resets == 1
    assert policy.replay_budget_factor == 2.0
    assert policy.transient_retries == 1
    assert policy.mistake_retries == 3
    assert policy.repeat_limit == 1


INT_FIELDS = [
    "max_local_depth",
    "max_global_resets",
    "transient_retries",
    "mistake_retries",
    "repeat_limit",
]


@pytest.mark.parametrize("field", INT_FIELDS)
@pytest.mark.parametrize("value", [0, 1, 16])
def test_count_fields_accept_their_range(field, value):
    """0 and 16 are the edges of the 0..=16 range of the count fields."""
    assert getattr(RollbackPolicy(**{field: value}), field) == value


@pytest.mark.parametrize("field", INT_FIELDS)
@pytest.mark.parametrize(
    ("value", "message"),
    [
        (17, "{field} must be <= 16"),
        (1000, "{field} must be <= 16"),
        (-1, "{field} must be >= 0, got -1"),
        (True, "{field} must be an int, got True"),
        (2.0, "{field} must be an int, got 2.0"),
        ("2", "{field} must be an int, got '2'"),
        (None, "{field} must be an int, got None"),
    ],
)
def test_count_fields_reject_values_outside_the_range(field, value, message):
    """Out-of-range and non-int counts raise InvalidArgument with the documented message."""
    with pytest.raises(InvalidArgument) as info:
        RollbackPolicy(**{field: value})
    assert str(info.value) == message.format(field=field)
    assert isinstance(info.value, ValueError)


@pytest.mark.parametrize("value", [0.1, 1000, 1000.0, 2, 0.5])
def test_replay_budget_factor_accepts_its_range(value):
    """[0.1, 1000] is inclusive; ints are taken as floats."""
    policy = RollbackPolicy(replay_budget_factor=value)
    assert policy.replay_budget_factor == value
    assert type(policy.replay_budget_factor) is float


@pytest.mark.parametrize("value", [0.09, 1000.1, 0, 0.0, -1.0, math.nan, math.inf, -math.inf, 1001])
def test_replay_budget_factor_rejects_values_outside_the_range(value):
    """NaN, infinity, 0 and values outside [0.1, 1000] get the documented message."""
    with pytest.raises(InvalidArgument) as info:
        RollbackPolicy(replay_budget_factor=value)
    assert str(info.value) == "replay_budget_factor must be within [0.1, 1000]"


@pytest.mark.parametrize("value", [True, "2", None])
def test_replay_budget_factor_rejects_non_numbers(value):
    """Booleans, strings and None are not budget factors."""
    with pytest.raises(InvalidArgument, match="replay_budget_factor must be a float"):
        RollbackPolicy(replay_budget_factor=value)


def test_policy_is_frozen_and_keyword_only():
    """A policy cannot be changed after construction and takes keyword arguments only."""
    policy = RollbackPolicy()
    with pytest.raises(attrs.exceptions.FrozenInstanceError):
        policy.max_local_depth = 3  # type: ignore[misc]
    with pytest.raises(TypeError):
        RollbackPolicy(2)  # type: ignore[misc]
    assert RollbackPolicy(max_local_depth=3) == RollbackPolicy(max_local_depth=3)


def test_decision_is_validated():
    """RollbackDecision rejects a non-strategy, negative steps and non-string keys."""
    with pytest.raises(InvalidArgument, match="strategy must be a RollbackStrategy"):
        RollbackDecision(strategy="retry", target_step=1)  # type: ignore[arg-type]
    with pytest.raises(InvalidArgument, match="target_step must be >= 0"):
        RollbackDecision(strategy=RETRY, target_step=-1)
    with pytest.raises(InvalidArgument, match="depth must be an int"):
        RollbackDecision(strategy=RETRY, target_step=1, depth=True)
    with pytest.raises(InvalidArgument, match="root_key must be a string or None"):
        RollbackDecision(strategy=JUMP, target_step=1, root_key=3)  # type: ignore[arg-type]


def test_strategy_values():
    """The strategies and their stable string values."""
    assert {s.name: s.value for s in RollbackStrategy} == {
        "NONE": "none",
        "RETRY": "retry",
        "RESEND": "resend",
        "LOCAL_BACKTRACK": "local_backtrack",
        "DEPENDENCY_JUMP": "dependency_jump",
        "GLOBAL_RESET": "global_reset",
        "MANUAL": "manual",
        "ABORT": "abort",
    }


# ---------------------------------------------------------------- the decision algorithm


def fail_always(ctl, step, *, key=None, root_cause=no_root, transient=False, times=6):
    """Fail `step` over and over, re-observing the replayed steps as a transaction would."""
    decisions = []
    replayed = []
    for _ in range(times):
        decision = ctl.decide(step, key, root_cause, transient=transient)
        decisions.append(decision)
        replayed.append(ctl.replayed_steps)
        if decision.strategy is ABORT:
            break
        for s in range(max(decision.target_step, 1), step + 1):
            ctl.observe_step(s)
    return decisions, replayed


def test_first_failure_backtracks_one_step():
    """The first failure of K resumes at K-1 (re-running K-1 and K): cost 2."""
    ctl = controller(transient_retries=0)
    ctl.observe_step(5)
    assert ctl.decide(5, None, no_root) == local(4, 1)
    assert ctl.replayed_steps == 2
    assert ctl.state().retries == ((5, 1),)


def test_escalation_sequence_for_a_step_that_always_fails_at_3():
    """K=3, default policy: LB to 2, LB to 1, reset, LB to 2, LB to 1, then abort."""
    ctl = controller()
    for step in (1, 2, 3):
        ctl.observe_step(step)
    assert ctl.replay_budget == 12
    decisions, replayed = fail_always(ctl, 3)
    assert decisions == [
        local(2, 1),
        local(1, 2),
        reset(DEPTH),
        local(2, 1),
        local(1, 2),
        abort(DEPTH),
    ]
    assert replayed == [2, 5, 0, 2, 5, 5]
    assert ctl.global_resets == 1


def test_escalation_sequence_for_a_step_that_always_fails_at_1():
    """K=1: both backtracks target step 1 (never below), filling budget(1) = 2 exactly."""
    ctl = controller()
    ctl.observe_step(1)
    assert ctl.replay_budget == 2
    decisions, replayed = fail_always(ctl, 1)
    assert decisions == [
        local(1, 1),
        local(1, 2),
        reset(DEPTH),
        local(1, 1),
        local(1, 2),
        abort(DEPTH),
    ]
    assert replayed == [1, 2, 0, 1, 2, 2]


def test_jump_consumes_a_local_attempt():
    """D=2: two jumps from K to the same root, then the third failure resets."""
    ctl = controller()
    decisions, _ = fail_always(ctl, 5, key="user_id", root_cause=root_at(2), times=3)
    assert decisions == [jump(2, "user_id"), jump(2, "user_id"), reset(DEPTH)]


def test_jump_counters_before_the_cap():
    """A jump increments both K's attempt counter and the root's jump counter."""
    ctl = controller()
    ctl.observe_step(5)
    ctl.decide(5, "user_id", root_at(2))
    ctl.decide(5, "user_id", root_at(2))
    state = ctl.state()
    assert state.retries == ((5, 2),)
    assert state.jumps == ((2, 2),)
    assert state.replayed_steps == 8


def test_unknown_key_falls_back_to_a_local_backtrack():
    """Documented example: K=4 jumps to 1 for user_id, then backtracks to 2 (depth 2) for sku."""
    roots = {"user_id": 1}
    ctl = controller()
    ctl.observe_step(4)
    assert ctl.decide(4, "user_id", lambda step, key: roots.get(key)) == jump(1, "user_id")
    assert ctl.decide(4, "sku", lambda step, key: roots.get(key)) == local(2, 2)
    assert ctl.replayed_steps == 4 + 3


def test_unknown_key_example_with_a_real_graph():
    """The same example with DependencyGraph.find_root_cause as the root-cause function."""
    graph = DependencyGraph()
    graph.add_step(1, "create_user", {"name": "Ada"})
    graph.record_output(1, {"id": "u-7"})
    graph.add_step(2, "noop", {})
    graph.record_output(2, {})
    graph.add_step(3, "noop", {})
    graph.record_output(3, {})
    graph.add_step(
        4,
        "insert_order",
        {"user_id": "u-7", "sku": "s-1"},
        (Dependency(from_step=1, source_key="id", target_key="user_id"),),
    )
    ctl = controller()
    for step in range(1, 5):
        ctl.observe_step(step)
    assert ctl.decide(4, "user_id", graph.find_root_cause) == jump(1, "user_id")
    assert ctl.decide(4, "sku", graph.find_root_cause) == local(2, 2)


def test_depth_zero_escalates_untraceable_failures_at_once():
    """D=0: no local backtracks; an untraceable failure resets, then aborts."""
    ctl = controller(max_local_depth=0)
    ctl.observe_step(4)
    assert ctl.decide(4, None, no_root) == reset(DEPTH)
    assert ctl.decide(4, "sku", no_root) == abort(DEPTH)


def test_depth_zero_still_jumps_once_per_root_per_epoch():
    """D=0: the jump cap is max(0, 1) = 1 per root per epoch; a new epoch allows one more."""
    ctl = controller(max_local_depth=0, max_global_resets=2)
    ctl.observe_step(4)
    assert ctl.decide(4, "id", root_at(2)) == jump(2, "id")
    assert ctl.decide(4, "id", root_at(2)) == reset(DEPTH)
    assert ctl.decide(4, "id", root_at(2)) == jump(2, "id")
    assert ctl.decide(4, "id", root_at(1)) == jump(1, "id")  # another root has its own cap
    assert ctl.decide(4, "id", root_at(1)) == reset(DEPTH)


def test_retries_are_counted_per_failing_step():
    """A failure at K-1 after a backtrack has its own counter; K's counter carries on."""
    ctl = controller(transient_retries=0)
    ctl.observe_step(5)
    assert ctl.decide(5, None, no_root) == local(4, 1)
    assert ctl.decide(4, None, no_root) == local(3, 1)
    assert ctl.decide(5, None, no_root) == local(3, 2)
    assert ctl.state().retries == ((4, 1), (5, 2))


@pytest.mark.parametrize("root", [5, 6, 100, 0, -1])
def test_a_root_that_is_not_an_earlier_step_is_not_a_jump(root):
    """R >= K (or R < 1) is no jump: the failure backtracks locally and counts no jump."""
    ctl = controller()
    ctl.observe_step(5)
    assert ctl.decide(5, "id", root_at(root)) == local(4, 1)
    assert ctl.state().jumps == ()


def test_root_cause_is_asked_with_the_clamped_step_and_only_with_a_key():
    """root_cause(K, key) is called once per keyed failure, with K = max(K, 1)."""
    calls = []

    def spy(step, key):
        calls.append((step, key))

    ctl = controller()
    ctl.decide(0, None, spy)
    ctl.decide(0, "id", spy)
    ctl.decide(-3, "", spy)
    assert calls == [(1, "id"), (1, "")]


def test_failed_steps_below_one_are_step_one():
    """decide() clamps K to 1 and observes it."""
    ctl = controller()
    assert ctl.decide(0, None, no_root) == local(1, 1)
    assert ctl.horizon == 1
    assert ctl.state().retries == ((1, 1),)


def test_jump_over_budget_escalates_without_trying_a_backtrack():
    """c=0.1, N=8: a jump 8 -> 1 costs 8 > budget 4, so reset, though a backtrack would fit."""
    ctl = controller(replay_budget_factor=0.1)
    ctl.observe_step(8)
    assert ctl.replay_budget == 4
    assert ctl.decide(8, "id", root_at(1)) == reset(BUDGET)
    assert ctl.state() == ControllerState(global_resets=1, horizon=8)
    # The backtrack the controller did not try instead would have cost only 2.
    assert ctl.decide(8, None, no_root) == local(7, 1)


def test_tiny_replay_budget_forces_an_early_global_reset():
    """c=0.1, K=3: budget(3) = 1 cannot pay for even one backtrack, so reset, then abort."""
    ctl = controller(replay_budget_factor=0.1, transient_retries=0)
    for step in (1, 2, 3):
        ctl.observe_step(step)
    assert ctl.replay_budget == 1
    assert ctl.decide(3, None, no_root) == reset(BUDGET)
    assert ctl.decide(3, None, no_root) == abort(BUDGET)


def test_budget_is_checked_against_the_replayed_total():
    """A backtrack that would push the epoch's replayed steps over the budget escalates."""
    ctl = controller(max_local_depth=16, replay_budget_factor=0.5)
    ctl.observe_step(4)
    assert ctl.replay_budget == 6
    assert ctl.decide(4, None, no_root) == local(3, 1)  # replayed 2
    assert ctl.decide(4, None, no_root) == local(2, 2)  # replayed 5
    assert ctl.decide(4, None, no_root) == reset(BUDGET)  # 5 + 4 > 6


def test_no_global_resets_aborts_on_the_first_escalation():
    """max_global_resets=0: the first escalation is an abort naming the budget of 0."""
    ctl = controller(max_global_resets=0, max_local_depth=0)
    decision = ctl.decide(3, None, no_root)
    assert decision == abort(DEPTH, resets=0)
    assert decision.reason == "local backtrack depth exhausted; global reset budget (0) exhausted"
    assert ctl.global_resets == 0


def test_abort_reason_names_the_reset_budget():
    """With three resets allowed, the fourth escalation aborts with "(3) exhausted"."""
    ctl = controller(max_local_depth=0, max_global_resets=3)
    decisions = [ctl.decide(2, None, no_root) for _ in range(4)]
    assert decisions == [reset(DEPTH)] * 3 + [abort(DEPTH, resets=3)]
    assert decisions[-1].target_step == 0
    assert decisions[-1].depth == 0


def test_abort_changes_no_epoch_counter():
    """An abort leaves the resets, jumps and replayed steps as they were."""
    ctl = controller(max_global_resets=0)
    ctl.observe_step(5)
    ctl.decide(5, "id", root_at(2))
    ctl.decide(5, "id", root_at(2))
    before = ctl.state()
    assert ctl.decide(5, "id", root_at(2)) == abort(DEPTH, resets=0)  # cap reached, attempt 3
    after = ctl.state()
    assert after.jumps == before.jumps
    assert after.replayed_steps == before.replayed_steps
    assert after.global_resets == 0


def test_global_reset_starts_a_new_epoch_but_keeps_the_horizon():
    """A reset clears retries, jumps and replayed steps; the horizon stays at its maximum."""
    ctl = controller()
    for step in range(1, 11):
        ctl.observe_step(step)
    ctl.decide(10, "id", root_at(3))
    ctl.decide(3, None, no_root)
    decisions, _ = fail_always(ctl, 3, times=2)
    assert decisions == [local(1, 2), reset(DEPTH)]
    assert ctl.horizon == 10
    assert ctl.replay_budget == 80
    assert ctl.state() == ControllerState(global_resets=1, horizon=10)


def test_observe_step_keeps_the_maximum():
    """observe_step never lowers the horizon."""
    ctl = controller()
    ctl.observe_step(7)
    ctl.observe_step(3)
    ctl.observe_step(-1)
    assert ctl.horizon == 7


@pytest.mark.parametrize("bad", [1.0, "1", True, None])
def test_steps_must_be_ints(bad):
    """observe_step and decide reject non-int steps before changing anything."""
    ctl = controller()
    with pytest.raises(InvalidArgument, match="step must be an int"):
        ctl.observe_step(bad)
    with pytest.raises(InvalidArgument, match="failed_step must be an int"):
        ctl.decide(bad, None, no_root)
    assert ctl.state() == ControllerState()


def test_error_key_must_be_a_string_or_none():
    """A non-string key is refused before any counter moves."""
    ctl = controller()
    with pytest.raises(InvalidArgument, match="error_key must be a string or None"):
        ctl.decide(2, 7, no_root)  # type: ignore[arg-type]
    assert ctl.state() == ControllerState()


def test_controller_wants_a_policy():
    """RollbackController(policy) refuses anything but a RollbackPolicy."""
    with pytest.raises(InvalidArgument, match="policy must be a RollbackPolicy"):
        RollbackController({"max_local_depth": 2})  # type: ignore[arg-type]
    assert RollbackController(RollbackPolicy()).policy == RollbackPolicy()


# ---------------------------------------------------------------- transient retries


def test_transient_failure_retries_the_same_step_once():
    """Default policy: RETRY K first (cost 1, no local attempt used), then the normal path."""
    ctl = controller()
    ctl.observe_step(3)
    assert ctl.decide(3, "x", root_at(1), transient=True) == retry(3)
    assert ctl.state() == ControllerState(transient_retries=((3, 1),), replayed_steps=1, horizon=3)
    assert ctl.decide(3, None, no_root, transient=True) == local(2, 1)
    assert ctl.state().retries == ((3, 1),)
    assert ctl.replayed_steps == 1 + 2


def test_transient_retry_does_not_ask_for_a_root_cause():
    """A RETRY decision never calls root_cause."""

    def boom(step, key):
        raise AssertionError

    assert controller().decide(4, "id", boom, transient=True) == retry(4)


def test_transient_retries_are_per_step():
    """Each failing step has its own transient allowance."""
    ctl = controller(transient_retries=2)
    ctl.observe_step(6)
    assert ctl.decide(6, None, no_root, transient=True) == retry(6)
    assert ctl.decide(5, None, no_root, transient=True) == retry(5)
    assert ctl.decide(6, None, no_root, transient=True) == retry(6)
    assert ctl.decide(6, None, no_root, transient=True) == local(5, 1)
    assert ctl.state().transient_retries == ((5, 1), (6, 2))


def test_non_transient_failures_never_retry():
    """transient=False takes the decision algorithm's path even with retries available."""
    ctl = controller(transient_retries=16)
    assert ctl.decide(3, None, no_root) == local(2, 1)


def test_transient_retries_count_against_the_replay_budget():
    """c=0.1, K=3 (budget 1): one RETRY fits, the next does not and takes the normal path."""
    ctl = controller(replay_budget_factor=0.1, transient_retries=2)
    ctl.observe_step(3)
    assert ctl.decide(3, None, no_root, transient=True) == retry(3)
    assert ctl.replayed_steps == 1
    assert ctl.decide(3, None, no_root, transient=True) == reset(BUDGET)


def test_transient_retries_are_cleared_by_a_global_reset():
    """A new epoch grants the transient retries again."""
    ctl = controller()
    ctl.observe_step(3)
    decisions, _ = fail_always(ctl, 3, transient=True, times=8)
    assert decisions == [
        retry(3),
        local(2, 1),
        local(1, 2),
        reset(DEPTH),
        retry(3),
        local(2, 1),
        local(1, 2),
        abort(DEPTH),
    ]


def run_plan(policy, steps, fails, *, transient=False, limit=1000):
    """Drive a scripted agent: step `k` fails on its `n`th run when `fails(k, n)`; count calls."""
    ctl = RollbackController(policy)
    runs: dict[int, int] = {}
    calls = 0
    step = 1
    decisions = []
    while step <= steps and calls < limit:
        ctl.observe_step(step)
        calls += 1
        runs[step] = runs.get(step, 0) + 1
        if not fails(step, runs[step]):
            step += 1
            continue
        decision = ctl.decide(step, None, no_root, transient=transient)
        decisions.append(decision.strategy)
        if decision.strategy is ABORT:
            break
        step = max(decision.target_step, 1)
    return calls, decisions


def test_benchmark_transient_scenario():
    """A step failing once transiently costs N+2 calls without retries, N+1 with one."""
    for steps in (8, 16, 32, 64):
        fail_at = max(math.ceil(3 * steps / 4), max(steps // 4, 2) + 2)

        def once(step, run, fail_at=fail_at):
            return step == fail_at and run == 1

        reference = RollbackPolicy(transient_retries=0)
        assert run_plan(reference, steps, once, transient=True)[0] == steps + 2
        assert run_plan(RollbackPolicy(), steps, once, transient=True) == (steps + 1, [RETRY])


def test_benchmark_persistent_scenario():
    """A step that always fails: LB, LB, GR, LB, LB, ABORT in 2 * (F + 2 + 3) calls."""
    for steps, expected in ((8, 22), (16, 34), (32, 58), (64, 106)):
        fail_at = max(math.ceil(3 * steps / 4), max(steps // 4, 2) + 2)
        calls, decisions = run_plan(
            RollbackPolicy(), steps, lambda step, run, fail_at=fail_at: step == fail_at
        )
        assert decisions == [LOCAL, LOCAL, RESET, LOCAL, LOCAL, ABORT]
        assert calls == expected == 2 * (fail_at + 2 + 3)


# ---------------------------------------------------------------- mistakes


def test_a_mistake_is_resent_three_times_then_decided_as_any_failure():
    """By default the first three consecutive mistakes at a step are RESEND to it; the fourth
    and later take the decision algorithm (a local backtrack here)."""
    ctl = controller()
    for step in range(1, 4):
        ctl.observe_step(step)
    assert [ctl.decide(3, None, no_root, mistake=True) for _ in range(3)] == [resend(3)] * 3
    assert ctl.state().mistakes == ((3, 3),)
    assert ctl.state().retries == ()
    assert ctl.replayed_steps == 0
    assert ctl.decide(3, None, no_root, mistake=True) == local(2, 1)
    assert ctl.state().mistakes == ((3, 4),)


def test_a_resend_asks_for_no_root_cause_and_wins_over_transient():
    """A resent mistake neither asks for a root cause nor retries as transient."""

    def refuse(step, key):
        raise AssertionError("root_cause must not be called")

    ctl = controller()
    assert ctl.decide(2, "id", refuse, transient=True, mistake=True) == resend(2)
    assert ctl.state().transient_retries == ()


def test_an_exhausted_mistake_is_not_retried_as_transient():
    """Past its resends, a mistake is decided as a non-transient failure."""
    ctl = controller(mistake_retries=1)
    ctl.observe_step(2)
    assert ctl.decide(2, None, no_root, mistake=True) == resend(2)
    assert ctl.decide(2, None, no_root, transient=True, mistake=True) == local(1, 1)


def test_the_mistake_streak_ends_at_another_step_a_real_failure_or_a_reset():
    """Mistakes count consecutively at one step: observing another step, a failure that is not
    a mistake, or a global reset starts the count again."""
    ctl = controller(mistake_retries=2, max_local_depth=1)
    for step in range(1, 5):
        ctl.observe_step(step)
    assert ctl.decide(4, None, no_root, mistake=True) == resend(4)
    ctl.observe_step(4)  # the resend of step 4 itself: the streak goes on
    assert ctl.decide(4, None, no_root, mistake=True) == resend(4)
    ctl.observe_step(5)  # step 4 succeeded
    assert ctl.state().mistakes == ()
    assert ctl.decide(5, None, no_root, mistake=True) == resend(5)
    assert ctl.decide(5, None, no_root) == local(4, 1)  # not a mistake: decided, streak over
    assert ctl.state().mistakes == ()
    assert ctl.decide(5, None, no_root, mistake=True) == resend(5)
    assert ctl.decide(5, None, no_root, mistake=True) == resend(5)
    assert ctl.decide(5, None, no_root, mistake=True) == reset(DEPTH)
    assert ctl.state().mistakes == ()
    assert ctl.decide(5, None, no_root, mistake=True) == resend(5)


def test_mistakes_before_step_one_are_step_one():
    """A mistake at step 0 or below is resent as step 1."""
    ctl = controller()
    assert ctl.decide(0, None, no_root, mistake=True) == resend(1)
    assert ctl.decide(-3, None, no_root, mistake=True) == resend(1)
    assert ctl.state().mistakes == ((1, 2),)


def test_zero_mistake_retries_decide_a_mistake_as_the_reference():
    """With mistake_retries=0 a mistake backtracks like any failure, and no streak is kept."""
    ctl = controller(mistake_retries=0)
    ctl.observe_step(3)
    assert ctl.decide(3, None, no_root, mistake=True) == local(2, 1)
    assert ctl.state() == ControllerState(retries=((3, 1),), replayed_steps=2, horizon=3)


def test_the_mistake_streak_survives_a_snapshot_and_old_documents_load():
    """The streak is part of the state and of its JSON, written only when there is one; a
    document written before it (no "mistakes") reads back with no streak."""
    ctl = controller()
    ctl.decide(2, None, no_root, mistake=True)
    document = json.loads(json.dumps(ctl.state().to_json()))
    assert document["mistakes"] == [[2, 1]]
    restored = RollbackController.from_state(ctl.policy, ControllerState.from_json(document))
    assert [restored.decide(2, None, no_root, mistake=True) for _ in range(3)] == [
        resend(2),
        resend(2),
        local(1, 1),
    ]
    old = controller().state().to_json()
    assert "mistakes" not in old
    assert ControllerState.from_json(old) == ControllerState()


def test_the_mistake_streak_holds_at_most_one_step():
    """ControllerState.mistakes is one (step, count) pair or empty."""
    with pytest.raises(InvalidArgument, match="at most one"):
        ControllerState(mistakes=((1, 1), (2, 1)))
    with pytest.raises(InvalidArgument, match="counts must be >= 1"):
        ControllerState(mistakes=((1, 0),))


def test_a_policy_without_mistake_retries_loads_with_the_default():
    """A policy record written before mistake_retries reads back with the default (3)."""
    record = attrs.asdict(RollbackPolicy(max_local_depth=1))
    del record["mistake_retries"]
    assert RollbackPolicy(**record) == RollbackPolicy(max_local_depth=1, mistake_retries=3)


# ---------------------------------------------------------------- state snapshots


def test_fresh_state_is_the_default_state():
    """A new controller's state is ControllerState() and restores to one with equal counters."""
    ctl = controller()
    assert ctl.state() == ControllerState()
    restored = RollbackController.from_state(RollbackPolicy(), ControllerState())
    assert (restored.policy, restored.state()) == (ctl.policy, ctl.state())
    assert restored != ctl  # controllers compare by identity: equal counters are equal states


def test_state_lists_every_counter():
    """state() holds retries, jumps, transient retries, replayed steps, resets and horizon."""
    ctl = controller(max_global_resets=2)
    for step in range(1, 7):
        ctl.observe_step(step)
    fail_always(ctl, 2, times=3)  # LB, LB, reset
    ctl.decide(6, "id", root_at(3))
    ctl.decide(5, None, no_root, transient=True)
    ctl.decide(4, None, no_root)
    assert ctl.state() == ControllerState(
        retries=((4, 1), (6, 1)),
        jumps=((3, 1),),
        transient_retries=((5, 1),),
        replayed_steps=4 + 1 + 2,
        global_resets=1,
        horizon=6,
    )


def test_state_json_round_trip():
    """to_json is JSON-serialisable and from_json reads it back to an equal state."""
    state = ControllerState(
        retries=((2, 1), (9, 3)),
        jumps=((1, 2),),
        transient_retries=((9, 1),),
        replayed_steps=7,
        global_resets=1,
        horizon=12,
    )
    document = json.loads(json.dumps(state.to_json()))
    assert ControllerState.from_json(document) == state
    assert document["retries"] == [[2, 1], [9, 3]]


@pytest.mark.parametrize(
    "document",
    [
        None,
        [],
        {"retries": []},
        {
            "retries": {},
            "jumps": [],
            "transient_retries": [],
            "replayed_steps": 0,
            "global_resets": 0,
            "horizon": 0,
        },
        {
            "retries": [[1]],
            "jumps": [],
            "transient_retries": [],
            "replayed_steps": 0,
            "global_resets": 0,
            "horizon": 0,
        },
        {
            "retries": [["1", 1]],
            "jumps": [],
            "transient_retries": [],
            "replayed_steps": 0,
            "global_resets": 0,
            "horizon": 0,
        },
        {
            "retries": [],
            "jumps": [],
            "transient_retries": [],
            "replayed_steps": 1.5,
            "global_resets": 0,
            "horizon": 0,
        },
        {
            "retries": [],
            "jumps": [],
            "transient_retries": [],
            "replayed_steps": 0,
            "global_resets": 0,
            "horizon": 0,
            "extra": 1,
        },
    ],
)
def test_state_from_json_rejects_malformed_documents(document):
    """A document that to_json could not have written raises InvalidArgument."""
    with pytest.raises(InvalidArgument, match=r"controller state|must be an int"):
        ControllerState.from_json(document)


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"retries": [(1, 1)]}, "must be a tuple of"),
        ({"retries": ((1, 1, 1),)}, "must be a tuple of"),
        ({"jumps": ((1, True),)}, "must be a tuple of"),
        ({"jumps": ((2, 1), (1, 1))}, "strictly ascending order, got step 1 after 2"),
        ({"jumps": ((2, 1), (2, 1))}, "strictly ascending"),
        ({"transient_retries": ((0, 1),)}, "steps >= 1"),
        ({"retries": ((3, 0),)}, "counts must be >= 1, got 0 for step 3"),
        ({"replayed_steps": -1}, "replayed_steps must be >= 0"),
        ({"global_resets": 1.0}, "global_resets must be an int"),
        ({"horizon": None}, "horizon must be an int"),
    ],
)
def test_state_is_validated(fields, message):
    """ControllerState only holds canonical counters."""
    with pytest.raises(InvalidArgument, match=message):
        ControllerState(**fields)


def test_from_state_wants_a_state():
    """from_state refuses anything but a ControllerState."""
    with pytest.raises(InvalidArgument, match="state must be a ControllerState"):
        RollbackController.from_state(RollbackPolicy(), {})  # type: ignore[arg-type]


def test_from_state_takes_counters_beyond_the_new_policy():
    """A state from a laxer policy restores as is: exhausted resets abort at once."""
    state = ControllerState(global_resets=3, horizon=4)
    ctl = RollbackController.from_state(RollbackPolicy(max_local_depth=0), state)
    assert ctl.global_resets == 3
    assert ctl.decide(4, None, no_root) == abort(DEPTH)


# ---------------------------------------------------------------- properties

POLICIES = st.builds(
    RollbackPolicy,
    max_local_depth=st.integers(0, 4),
    max_global_resets=st.integers(0, 3),
    replay_budget_factor=st.sampled_from([0.1, 0.3, 0.5, 1.0, 2.0, 10.0]) | st.floats(0.1, 1000),
    transient_retries=st.integers(0, 3),
    mistake_retries=st.integers(0, 3),
)
STEPS = st.integers(-1, 12)
KEYS = st.sampled_from([None, "id", "sku", ""])
ROOTS = st.none() | st.integers(-1, 13)
OBSERVE = st.tuples(st.just("observe"), STEPS)
FAIL = st.tuples(st.just("fail"), STEPS, KEYS, ROOTS, st.booleans(), st.booleans())
OPS = st.lists(OBSERVE | FAIL, max_size=40)


def apply(ctl, op, *, transient=None, mistake=None):
    """Apply one operation; returns the decision of a failure, None for an observation."""
    if op[0] == "observe":
        ctl.observe_step(op[1])
        return None
    _, step, key, root, flag, wrong = op
    return ctl.decide(
        step,
        key,
        root_at(root),
        transient=flag if transient is None else transient,
        mistake=wrong if mistake is None else mistake,
    )


@given(st.data(), OPS)
def test_zero_transient_retries_is_the_reference(data, ops):
    """With transient_retries=0, transient=True decides exactly as transient=False, always."""
    policy = attrs.evolve(data.draw(POLICIES), transient_retries=0)
    flagged, plain = RollbackController(policy), RollbackController(policy)
    for op in ops:
        assert apply(flagged, op, transient=True) == apply(plain, op, transient=False)
        assert flagged.state() == plain.state()
        assert flagged.state().transient_retries == ()


@given(st.data(), OPS)
def test_zero_mistake_retries_is_the_reference(data, ops):
    """With mistake_retries=0, mistake=True decides exactly as mistake=False, always, and the
    counters are the reference's (no streak)."""
    policy = attrs.evolve(data.draw(POLICIES), mistake_retries=0)
    flagged, plain = RollbackController(policy), RollbackController(policy)
    for op in ops:
        assert apply(flagged, op, mistake=True) == apply(plain, op, mistake=False)
        assert flagged.state() == plain.state()
        assert flagged.state().mistakes == ()


@given(POLICIES, OPS)
def test_a_resend_changes_no_counter_but_the_streak(policy, ops):
    """A RESEND leaves retries, jumps, transient retries, replayed steps and resets as they
    were: only the mistake streak moves (and the horizon, which observes the step)."""
    ctl = RollbackController(policy)
    for op in ops:
        before = ctl.state()
        decision = apply(ctl, op)
        if decision is not None and decision.strategy is RESEND:
            after = ctl.state()
            assert attrs.evolve(after, mistakes=before.mistakes, horizon=before.horizon) == before
            assert after.horizon == max(before.horizon, op[1], 1)
            ((step, count),) = after.mistakes
            assert (step, decision.target_step) == (max(op[1], 1), step)
            assert 1 <= count <= policy.mistake_retries


@given(POLICIES, OPS, OPS, st.booleans())
def test_restored_controller_makes_the_same_decisions(policy, prefix, suffix, via_json):
    """from_state(policy, c.state()) decides exactly as c from then on (also through JSON)."""
    original = RollbackController(policy)
    for op in prefix:
        apply(original, op)
    state = original.state()
    if via_json:
        state = ControllerState.from_json(json.loads(json.dumps(state.to_json())))
    restored = RollbackController.from_state(policy, state)
    assert restored.state() == original.state()
    for op in suffix:
        assert apply(restored, op) == apply(original, op)
    assert restored.state() == original.state()


class NaiveController:
    """The documented decision algorithm transcribed line by line, plus the transient retry rule."""

    def __init__(self, policy):
        self.policy = policy
        self.retries = {}
        self.jumps = {}
        self.transient = {}
        self.streak = (0, 0)  # (step, consecutive mistakes)
        self.replayed = 0
        self.global_resets = 0
        self.horizon = 0

    def budget(self):
        n = max(self.horizon, 1)
        return max(1, math.ceil(self.policy.replay_budget_factor * n * math.ceil(math.log2(n + 1))))

    def observe(self, step):
        self.horizon = max(self.horizon, step)
        if step != self.streak[0]:
            self.streak = (0, 0)

    def decide(self, k, key, root_cause, transient, mistake=False):
        k = max(k, 1)
        self.observe(k)
        if mistake and self.policy.mistake_retries > 0:
            self.streak = (k, self.streak[1] + 1)
            if self.streak[1] <= self.policy.mistake_retries:
                return ("resend", k, 0, None)
            transient = False
        elif self.policy.mistake_retries > 0:
            self.streak = (0, 0)
        used = self.transient.get(k, 0)
        if (
            transient
            and used < self.policy.transient_retries
            and self.replayed + 1 <= self.budget()
        ):
            self.transient[k] = used + 1
            self.replayed += 1
            return ("retry", k, 0, None)
        self.retries[k] = self.retries.get(k, 0) + 1
        attempt = self.retries[k]
        d = self.policy.max_local_depth
        candidate = None
        if key is not None:
            r = root_cause(k, key)
            if r is not None and 1 <= r < k and self.jumps.get(r, 0) < max(d, 1):
                candidate = ("dependency_jump", r, 0, key)
        if candidate is None and attempt <= d:
            candidate = ("local_backtrack", max(k - attempt, 1), attempt, None)
        if candidate is None:
            return self.escalate(DEPTH)
        cost = k - candidate[1] + 1
        if self.replayed + cost > self.budget():
            return self.escalate(BUDGET)
        self.replayed += cost
        if candidate[0] == "dependency_jump":
            self.jumps[candidate[1]] = self.jumps.get(candidate[1], 0) + 1
        return candidate

    def escalate(self, reason):
        limit = self.policy.max_global_resets
        if self.global_resets >= limit:
            return ("abort", 0, 0, f"{reason}; global reset budget ({limit}) exhausted")
        self.global_resets += 1
        self.retries.clear()
        self.jumps.clear()
        self.transient.clear()
        self.streak = (0, 0)
        self.replayed = 0
        return ("global_reset", 0, 0, reason)


def as_tuple(decision):
    key_or_reason = decision.reason if decision.reason is not None else decision.root_key
    return (decision.strategy.value, decision.target_step, decision.depth, key_or_reason)


class ControllerMachine(RuleBasedStateMachine):
    """The controller agrees with the naive transcription and keeps the per-epoch caps."""

    @initialize(policy=POLICIES)
    def start(self, policy):
        self.policy = policy
        self.ctl = RollbackController(policy)
        self.model = NaiveController(policy)
        self.restored = None  # a controller restored from a snapshot, driven in lockstep
        self.epoch_cost = 0
        self.epoch_jumps = {}
        self.aborted = False

    @rule(step=STEPS)
    def observe(self, step):
        for ctl in self.controllers():
            ctl.observe_step(step)
        self.model.observe(step)

    @rule(step=STEPS, key=KEYS, root=ROOTS, transient=st.booleans(), mistake=st.booleans())
    def fail(self, step, key, root, transient, mistake):
        resets_before = self.ctl.global_resets
        flags = {"transient": transient, "mistake": mistake}
        decision = self.ctl.decide(step, key, root_at(root), **flags)
        if self.restored is not None:
            assert self.restored.decide(step, key, root_at(root), **flags) == decision
        assert as_tuple(decision) == self.model.decide(step, key, root_at(root), transient, mistake)
        if decision.strategy is RESEND:
            assert mistake
            assert decision.target_step == max(step, 1)
            assert self.ctl.state().mistakes[0][1] <= self.policy.mistake_retries
            return

        k = max(step, 1)
        if decision.strategy is RESET:
            assert self.ctl.global_resets == resets_before + 1
            self.epoch_cost = 0
            self.epoch_jumps = {}
        elif decision.strategy is ABORT:
            assert resets_before == self.ctl.global_resets >= self.policy.max_global_resets
            self.aborted = True
        else:
            assert 1 <= decision.target_step <= k
            self.epoch_cost += k - decision.target_step + 1
            if decision.strategy is RETRY:
                assert decision.target_step == k
            elif decision.strategy is JUMP:
                assert decision.target_step < k
                root_step = decision.target_step
                self.epoch_jumps[root_step] = self.epoch_jumps.get(root_step, 0) + 1
            else:
                assert decision.strategy is LOCAL
                assert 1 <= decision.depth <= self.policy.max_local_depth

    @precondition(lambda self: self.restored is None)
    @rule()
    def snapshot(self):
        self.restored = RollbackController.from_state(self.policy, self.ctl.state())

    def controllers(self):
        return [self.ctl] if self.restored is None else [self.ctl, self.restored]

    @invariant()
    def replayed_steps_stay_within_the_budget(self):
        assert self.ctl.replayed_steps == self.epoch_cost
        assert self.ctl.replayed_steps <= self.ctl.replay_budget

    @invariant()
    def jumps_per_root_stay_within_the_cap(self):
        assert dict(self.ctl.state().jumps) == self.epoch_jumps
        cap = max(self.policy.max_local_depth, 1)
        assert all(count <= cap for count in self.epoch_jumps.values())

    @invariant()
    def transient_retries_stay_within_the_cap(self):
        counts = dict(self.ctl.state().transient_retries)
        assert all(count <= self.policy.transient_retries for count in counts.values())

    @invariant()
    def global_resets_stay_within_the_cap(self):
        assert self.ctl.global_resets <= self.policy.max_global_resets
        assert self.ctl.global_resets == self.model.global_resets

    @invariant()
    def counters_agree_with_the_model(self):
        state = self.ctl.state()
        assert dict(state.retries) == self.model.retries
        assert dict(state.transient_retries) == self.model.transient
        assert state.replayed_steps == self.model.replayed
        assert state.horizon == self.model.horizon
        assert state.mistakes == (() if self.model.streak[1] == 0 else (self.model.streak,))
        if self.restored is not None:
            assert self.restored.state() == state


ControllerMachine.TestCase.settings = settings(max_examples=150, stateful_step_count=40)
test_controller_machine = ControllerMachine.TestCase


# ---------------------------------------------------------------- repeated failures

REPEATED = "repeated failure: the same call failed the same way after being rewound once"


def repeated(times="once"):
    return RollbackDecision(
        strategy=ABORT,
        target_step=0,
        reason=f"repeated failure: the same call failed the same way after being rewound {times}",
    )


def test_the_same_failure_after_a_rewind_aborts():
    """A signed failure that already caused a rewind aborts at once, whatever the counters
    would still allow; another signature, or none, is decided as before."""
    ctl = controller()
    ctl.observe_step(3)
    assert ctl.decide(3, "customer_id", root_at(1), signature="a") == jump(1, "customer_id")
    assert ctl.decide(3, "customer_id", root_at(1), signature="b") == jump(1, "customer_id")
    assert ctl.decide(3, "customer_id", root_at(1), signature="a") == repeated()
    assert ctl.state().repeats == (("a", 1), ("b", 1))


def test_an_unsigned_failure_keeps_the_reference_sequence():
    """Without a signature the escalation sequence is the reference one."""
    ctl = controller()
    ctl.observe_step(3)
    decisions, _ = fail_always(ctl, 3, times=3)
    assert decisions == [local(2, 1), local(1, 2), reset(DEPTH)]
    assert ctl.state().repeats == ()


def test_the_repeat_limit_is_the_rewinds_one_signature_may_cause():
    """repeat_limit=2 lets a signature cause two rewinds; 0 turns the check off."""
    ctl = controller(repeat_limit=2)
    ctl.observe_step(3)
    decisions = [ctl.decide(3, None, no_root, signature="s") for _ in range(3)]
    assert decisions == [local(2, 1), local(1, 2), repeated("2 times")]
    off = controller(repeat_limit=0)
    off.observe_step(3)
    assert [off.decide(3, None, no_root, signature="s") for _ in range(3)] == [
        local(2, 1),
        local(1, 2),
        reset(DEPTH),
    ]
    assert off.state().repeats == ()


def test_resends_retries_and_transient_failures_are_not_counted():
    """A resend or a transient retry undoes no earlier step: it counts no rewind; nor does a
    transient failure decided as any failure (an outage repeats itself through no fault)."""
    ctl = controller(transient_retries=1)
    ctl.observe_step(2)
    assert ctl.decide(2, "x", no_root, mistake=True, signature="m") == resend(2)
    assert ctl.decide(2, None, no_root, transient=True, signature="t") == retry(2)
    assert ctl.decide(2, None, no_root, transient=True, signature="t") == local(1, 1)
    assert ctl.decide(2, None, no_root, transient=True, signature="t") == local(1, 2)
    assert ctl.state().repeats == ()


def test_a_global_reset_keeps_the_rewinds_of_each_signature():
    """A loop spans epochs: a global reset counts as a rewind and keeps the counts."""
    ctl = controller(max_local_depth=0)
    ctl.observe_step(2)
    assert ctl.decide(2, None, no_root, signature="s") == reset(DEPTH)
    assert ctl.state().repeats == (("s", 1),)
    ctl.observe_step(2)
    assert ctl.decide(2, None, no_root, signature="s") == repeated()


def test_an_abort_counts_no_rewind():
    """A failure that aborts anyway records nothing."""
    ctl = controller(max_local_depth=0, max_global_resets=0)
    assert ctl.decide(2, None, no_root, signature="s") == abort(DEPTH, resets=0)
    assert ctl.state().repeats == ()


def test_the_controller_keeps_the_most_recent_signatures():
    """At most MAX_REPEATS signatures are counted; the oldest is forgotten first, and one
    counted again becomes the most recent."""
    ctl = controller(max_local_depth=16, repeat_limit=2, replay_budget_factor=1000)
    ctl.observe_step(2)
    for signature in [*(f"s{n}" for n in range(MAX_REPEATS)), "s0", f"s{MAX_REPEATS}"]:
        ctl.decide(2, None, no_root, signature=signature)
        ctl._retries.clear()  # keep backtracking: only the signatures are under test
    repeats = ctl.state().repeats
    assert len(repeats) == MAX_REPEATS
    assert repeats[0] == ("s2", 1)
    assert repeats[-2:] == (("s0", 2), (f"s{MAX_REPEATS}", 1))


def test_a_signature_must_be_text():
    """decide(signature=) is a string or None, checked before anything changes."""
    ctl = controller()
    with pytest.raises(InvalidArgument, match="signature must be a string"):
        ctl.decide(1, None, no_root, signature=3)  # type: ignore[arg-type]
    assert ctl.state() == ControllerState()


def test_the_rewinds_per_signature_survive_a_snapshot_and_old_documents_load():
    """repeats are part of the state and its JSON, written only when there are some; a
    document written before them reads back with none."""
    ctl = controller()
    ctl.decide(3, None, no_root, signature="s")
    document = json.loads(json.dumps(ctl.state().to_json()))
    assert document["repeats"] == [["s", 1]]
    restored = RollbackController.from_state(ctl.policy, ControllerState.from_json(document))
    assert restored.decide(3, None, no_root, signature="s") == repeated()
    old = controller().state().to_json()
    assert "repeats" not in old
    assert ControllerState.from_json(old) == ControllerState()


@pytest.mark.parametrize(
    ("repeats", "message"),
    [
        ((("s", 0),), "counts >= 1"),
        ((("", 1),), "counts >= 1"),
        ((("s", 1), ("s", 2)), "twice"),
        (tuple((f"s{n}", 1) for n in range(MAX_REPEATS + 1)), "at most"),
    ],
)
def test_the_rewinds_per_signature_are_validated(repeats, message):
    """ControllerState.repeats is a tuple of distinct (signature, count >= 1) pairs, bounded."""
    with pytest.raises(InvalidArgument, match=message):
        ControllerState(repeats=repeats)


def test_a_policy_without_repeat_limit_loads_with_the_default():
    """A policy record written before repeat_limit reads back with the default (1)."""
    record = attrs.asdict(RollbackPolicy(max_local_depth=1))
    del record["repeat_limit"]
    assert RollbackPolicy(**record) == RollbackPolicy(max_local_depth=1)


def test_failure_signatures_ignore_key_order_and_tell_failures_apart():
    """Same tool, canonical arguments, category and key give one signature; any difference
    gives another."""
    base = failure_signature("reserve", {"a": 1, "b": [1, 2]}, "invalid_value", "a")
    assert base == failure_signature("reserve", {"b": [1, 2], "a": 1}, "invalid_value", "a")
    assert len(base) == 32
    others = [
        failure_signature("ship", {"a": 1, "b": [1, 2]}, "invalid_value", "a"),
        failure_signature("reserve", {"a": 2, "b": [1, 2]}, "invalid_value", "a"),
        failure_signature("reserve", {"a": 1, "b": [1, 2]}, "unknown", "a"),
        failure_signature("reserve", {"a": 1, "b": [1, 2]}, "invalid_value", None),
    ]
    assert len({base, *others}) == 5


def test_a_failure_signature_with_a_key_is_the_value_under_it():
    """With a key naming an argument, only the tool, category, key (ignoring ASCII case) and
    the values under it count: other arguments may vary; without one, all arguments count."""
    base = failure_signature("reserve", {"id": "c-9", "note": "a"}, "invalid_value", "id")
    assert base == failure_signature("reserve", {"ID": "c-9", "note": "b"}, "invalid_value", "Id")
    assert base != failure_signature("reserve", {"id": "c-8", "note": "a"}, "invalid_value", "id")
    nested = failure_signature("ship", {"to": {"zip": "1"}, "n": 1}, "invalid_value", "zip")
    assert nested == failure_signature("ship", {"to": {"zip": "1"}, "n": 2}, "invalid_value", "zip")
    assert nested != failure_signature("ship", {"to": {"zip": "2"}, "n": 1}, "invalid_value", "zip")
    whole = failure_signature("ship", {"to": {"zip": "1"}}, "invalid_value", "to")
    assert whole != failure_signature("ship", {"to": {"zip": "2"}}, "invalid_value", "to")
    # a key that names no argument, or none at all: every argument counts
    for key in ("sku", None):
        assert failure_signature("reserve", {"n": 1}, "unknown", key) != failure_signature(
            "reserve", {"n": 2}, "unknown", key
        )


@settings(max_examples=200)
@given(
    st.lists(
        st.tuples(st.integers(1, 6), st.sampled_from(["s1", "s2", "s3", None]), st.booleans()),
        max_size=60,
    ),
    st.integers(1, 3),
)
def test_no_signature_causes_more_rewinds_than_its_limit(failures, limit):
    """Whatever fails in whatever order, each signature causes at most `repeat_limit` rewinds
    (jumps, backtracks, resets); the next failure with it aborts."""
    ctl = controller(repeat_limit=limit, max_global_resets=16, replay_budget_factor=1000)
    rewinds: dict[str, int] = {}
    for step, signature, keyed in failures:
        ctl.observe_step(step)
        decision = ctl.decide(step, "k" if keyed else None, root_at(1), signature=signature)
        if decision.strategy is ABORT:
            if signature is not None and decision.reason.startswith("repeated failure"):
                assert rewinds[signature] == limit
            break
        if signature is not None:
            rewinds[signature] = rewinds.get(signature, 0) + 1
            assert rewinds[signature] <= limit
