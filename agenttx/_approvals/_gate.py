"""What a guarded call does next (`gate_action`, from the rows of its transaction or plan
run), whether it needs approval, and its status check under a deadline."""

from __future__ import annotations

from typing import TYPE_CHECKING, Final, Literal, cast

from .._tools import DeadlineExceeded, call_with_deadline
from ._records import APPROVAL, REVIEW, CheckResult, loads

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence

    from .._json import JSONValue
    from ..stores import RequestRow

__all__ = [
    "ENDED_WHILE_RUNNING",
    "Action",
    "approval_expired",
    "check_outcome",
    "cut_off",
    "gate_action",
    "needs_approval",
    "run_check",
]


#: Why a call found consumed at its step again, with no recorded outcome, is unknown.
ENDED_WHILE_RUNNING: Final = (
    "the call started (its approval was consumed) but its outcome was never recorded: "
    "the process ended, or the step was interrupted, while the tool ran"
)


def needs_approval(rule: object, tool: str, arguments: JSONValue) -> bool | str:
    """Whether a call needs approval under `rule` (True, False, or a callable of the arguments).

    A callable that raises, or returns something other than a bool, makes the call need
    approval (safe by default); its error is returned as text instead of True, for the record.
    """
    if rule is True or rule is False:
        return rule
    try:
        verdict = rule(arguments)  # type: ignore[operator]
    except Exception as exc:  # noqa: BLE001  (a rule that fails asks a person)
        return f"tool `{tool}`: needs_approval raised {type(exc).__name__}: {exc}"
    if isinstance(verdict, bool):
        return verdict
    return f"tool `{tool}`: needs_approval returned {type(verdict).__name__}, not a bool"


def run_check(
    check: Callable[..., object], arguments: JSONValue, key: str, timeout: float
) -> tuple[CheckResult, str | None]:
    """Call `check(arguments, key)` under `timeout`: its verdict, and its failure as text.

    A check that raises, hangs past the timeout or returns something else than a
    `CheckResult` gives `unknown`, with the failure (kept in the review's evidence).
    """
    try:
        verdict = call_with_deadline(lambda: check(arguments, key), timeout)
    except DeadlineExceeded:
        failure = f"the status check did not answer within {timeout:g} s"
        return CheckResult.unknown(failure), failure
    except Exception as exc:  # noqa: BLE001  (a failing check is evidence, not a crash)
        failure = f"the status check raised {type(exc).__name__}: {exc}"
        return CheckResult.unknown(failure), failure
    if not isinstance(verdict, CheckResult):
        failure = f"the status check returned {type(verdict).__name__}, not a CheckResult"
        return CheckResult.unknown(failure), failure
    return verdict, None


def check_outcome(
    check: Callable[..., object] | None,
    arguments: JSONValue,
    key: str,
    timeout: float,
    errors: list[str],
) -> CheckResult:
    """The verdict of the tool's status check on a call whose outcome is unknown (`check`
    None: the tool has none, so `unknown`), adding to `errors` (the review's evidence) why it
    could not tell: its failure, its own reason, or that there is no check."""
    if check is None:
        errors.append("the tool has no status check")
        return CheckResult.unknown()
    verdict, failure = run_check(check, arguments, key, timeout)
    if failure is not None:
        errors.append(failure)
    elif verdict.status == "unknown":
        errors.append(f"the status check cannot tell: {verdict.reason}".rstrip(": "))
    return verdict


#: What a guarded call does next (`gate_action`).
Action = Literal[
    "run", "request", "pending", "approved", "rejected", "unknown", "review", "resolved"
]


def gate_action(
    rows: Sequence[RequestRow],
    digest: str,
    step: int | None,
    *,
    needs: bool,
    node: str | None = None,
    plan_version: str | None = None,
) -> tuple[Action, RequestRow | None]:
    """What a guarded call of `digest` at `step` (or plan `node`) does, given its scope's
    requests (oldest first); for a node, requests of another `plan_version` do not count.

    First, an unsettled outcome of this very call at this step: a pending review (`review`),
    a resolved one not yet taken (`resolved`), or an approval consumed here whose call never
    recorded its outcome (`unknown`: the process ended while it ran). Then, if the call needs
    approval, the newest request for it decides: `pending`, `approved` (the caller checks its
    expiry), `rejected`; none, or only used or expired ones, means a new `request`. A call that
    needs no approval may `run`.
    """
    newest: RequestRow | None = None
    for row in reversed(rows):
        decision = None
        if row.digest != digest:
            decision = loads(row.decision)
            if decision.get("digest") != digest:
                continue
        record = loads(row.record)
        if record.get("node") != node or (
            node is not None and record.get("plan_version") != plan_version
        ):
            continue
        if row.kind == REVIEW:
            if row.state in ("pending", "resolved") and record.get("step") == step:
                return ("review" if row.state == "pending" else "resolved"), row
            continue
        if row.state == "consumed":
            decision = loads(row.decision) if decision is None else decision
            if decision.get("consumed_step") == step and decision.get("consumed_node") == node:
                return "unknown", row
        if newest is None and row.kind == APPROVAL:
            newest = row
    if not needs:
        return "run", None
    if newest is None or newest.state not in ("pending", "approved", "rejected"):
        return "request", None
    return cast("Action", newest.state), newest


def cut_off(rows: Sequence[RequestRow], step: int) -> RequestRow | None:
    """The row of a transaction's call at `step` that started and never recorded its outcome
    (what `gate_action` answers `unknown` for when that call is sent again), unless a review of
    it is open already; None if there is none. For recovery, which opens that review at once.
    """
    for row in reversed(rows):
        if row.kind == REVIEW:
            record = loads(row.record)
            if row.state in ("pending", "resolved") and record.get("step") == step:
                return None  # its review was opened before the crash
            continue
        if row.state != "consumed":
            continue
        decision = loads(row.decision)
        if decision.get("consumed_step") == step and decision.get("consumed_node") is None:
            return row
    return None


def approval_expired(row: RequestRow, now: float) -> bool:
    """Whether the approval of an approved `row` has expired at `now`."""
    expires_at = loads(row.decision).get("expires_at")
    return expires_at is not None and float(expires_at) <= now
