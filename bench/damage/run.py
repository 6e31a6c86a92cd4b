"""Damage under faults: AgentDojo's task suites, three agent loops, one seeded fault schedule.

Run from the repository root (`pip install -e '.[dev]'` installs AgentDojo)::

    python -m bench.damage            # every suite and fault, 12 tasks a suite (the defaults)
    python -m bench.damage --quick    # 5 tasks (tests/test_bench_damage.py runs it)
    python -m bench.damage --suites banking --tasks 5 --write bench/RESULTS.md

What is measured, and how, is in bench/damage/README.md.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import shutil
import signal
import sys
import tempfile
import time
import traceback
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _agent import MISTAKES, Call, Script, find_mistakes, script_for
from _agentdojo import get_suite
from _loops import LOOPS
from _world import DEDUPLICATED, FAULTS, Fault, Service, revive

SUITES = ("banking", "slack", "travel", "workspace")
# The quick run: a payment, an update of a scheduled payment, both with a profile update
# (banking); a file created (workspace: a reversible write that is not idempotent, so a crash
# or a timeout after it duplicates the file unless the loop undoes it or checks first), and an
# e-mail sent (to a service that does not deduplicate on the idempotency key).
QUICK = {
    "banking": ("user_task_0", "user_task_2", "user_task_15"),
    "workspace": ("user_task_31", "user_task_33"),
}
VERSION = "v1.2.1"
METRICS = ("unintended", "duplicates", "orphaned", "leaked", "blind_retries")
# The rows of the table: the service's faults, then the agent's mistakes (made fault-free).
KINDS = (*FAULTS, *MISTAKES)
# Where agenttx's docs claim zero (README "Durability and crash recovery", docs/approvals.md):
# duplicates, leaked irreversible effects and orphaned partial state, for every fault but a
# silent no-op (a service that answers success without acting is beyond any loop's reach).
CLAIMED = frozenset(f for f in KINDS if f != "noop")
# Not claimed either (marked where they occur): a duplicate delivery of a staged effect with
# its idempotency key to a service that ignores the key (‡: the outbox delivers at least once,
# README "Durability and crash recovery"); orphaned state after a staged effect was refused at
# delivery, after the commit (†: the commit cannot be taken back).


@dataclass
class Cell:
    """The sums of one (suite, fault, loop) over its episodes."""

    episodes: int = 0
    utility: int = 0
    calls: int = 0
    turns: int = 0
    seconds: float = 0.0
    sums: dict[str, int] = field(default_factory=lambda: dict.fromkeys(METRICS, 0))
    # the episodes whose scheduled fault fired (a crash: and restarted the agent's process)
    fired: int = 0
    # duplicates and blind retries that are the outbox's at-least-once delivery (the same
    # idempotency key sent again to a service that does not deduplicate on it)
    redelivered: int = 0
    same_key_retries: int = 0
    refused_at_delivery: int = 0  # refusals of a staged effect at delivery, after the commit


def load_suite(name: str) -> Any:
    return get_suite(name, VERSION)


def _calls(function_calls: Any) -> list[Call]:
    return [(c.function, dict(c.args)) for c in function_calls]


# ---------------------------------------------------------------- diffing environments
CLOCK = frozenset({"timestamp", "last_modified"})  # set from the clock, not by the agent


def _items(value: Any, path: str = "") -> set[str]:
    """An environment as a set of leaves: dict keys are paths, list items an unordered bag."""
    if isinstance(value, dict):
        out: set[str] = set()
        for key, item in value.items():
            if key in CLOCK:  # when a message was sent, a file written: the clock's
                continue
            out |= _items(item, f"{path}/{key}")
        return out
    if isinstance(value, list):
        counts: dict[str, int] = defaultdict(int)
        out = set()
        for item in value:
            text = json.dumps(_untimed(item), sort_keys=True)
            counts[text] += 1
            out.add(f"{path}[]{counts[text]}={text}")
        return out
    return {f"{path}={json.dumps(value)}"}


def _untimed(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _untimed(v) for k, v in value.items() if k not in CLOCK}
    if isinstance(value, list):
        return [_untimed(v) for v in value]
    return value


def changes(a: Any, b: Any) -> int:
    """How many leaves (a record of a list, a field of an object) differ between a and b."""
    left, right = _items(a), _items(b)
    return max(len(left - right), len(right - left))


# ---------------------------------------------------------------- one episode
def run_episode(
    service: Service,
    loop: str,
    script: Script,
    approved: list[Call] | None,
    policy: dict[str, Any],
) -> dict[str, Any]:
    """Run the loop in forked processes until it ends; a SIGKILL starts a resuming one."""
    out = service.directory / "out.json"
    out.unlink(missing_ok=True)
    resume, restarts = False, 0
    while True:
        pid = os.fork()
        if pid == 0:  # the agent's process
            code = 0
            try:
                approve = None if approved is None else (lambda n, a: (n, a) in approved)
                report = LOOPS[loop](service, script, resume, approve, policy)
                out.write_text(json.dumps(report))
            except BaseException:  # noqa: BLE001 -- the parent reports it
                (service.directory / "error.txt").write_text(traceback.format_exc())
                code = 1
            os._exit(code)
        _, status = os.waitpid(pid, 0)
        if os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL and restarts < 3:
            restarts, resume = restarts + 1, True
            continue
        if not out.exists():
            error = service.directory / "error.txt"
            raise RuntimeError(
                f"{loop} crashed:\n{error.read_text() if error.exists() else status}"
            )
        report = json.loads(out.read_text())
        report["restarts"] = restarts
        report["turns"] = service.turns()
        return report


def measure(
    service: Service, report: dict[str, Any], reference: Any, injected: set[int]
) -> dict[str, int]:
    """The damage of one episode, from the service's ledger and its final environment.

    An irreversible effect (a message, a payment, a booking) counts once delivered, whatever an
    undo did to the environment afterwards: a sent e-mail is not unsent by a restored snapshot.
    """
    entries = service.entries()
    final = json.loads(service.world.read_text())
    failed = report["status"] != "done"
    live: dict[int, list[dict[str, Any]]] = defaultdict(list)
    keys: dict[int, set[str]] = defaultdict(set)
    blind, same_key, redelivered, timed_out, last = 0, 0, 0, {}, {}
    for entry in entries:
        call, event = entry["call"], entry["event"]
        if event == "effect":
            live[call].append(entry)
            key = entry.get("key")
            if entry["irreversible"] and key is not None:
                redelivered += key in keys[call]  # the same key again: at-least-once delivery
                keys[call].add(key)
        if event == "undo" and live[call] and not live[call][-1]["irreversible"]:
            live[call].pop()
        if event == "timeout" and last.get(call) == "effect":  # a read's retry risks nothing
            timed_out[call] = entry.get("key")
        elif event in {"checked", "undo"}:
            timed_out.pop(call, None)
        elif event == "request" and call in timed_out:
            key = timed_out.pop(call)
            if key is None or entry.get("key") != key:
                blind += 1
            elif entry["tool"] not in DEDUPLICATED:  # the same key, to a service ignoring it
                blind += 1
                same_key += 1
        last[call] = event
    effects = [e for es in live.values() for e in es]
    return {
        "unintended": changes(final, reference),
        "duplicates": sum(max(0, len(es) - 1) for es in live.values()),
        "orphaned": sum(1 for e in effects if failed and not e["irreversible"]),
        "leaked": sum(
            1 for e in effects if e["irreversible"] and (failed or e["call"] in injected)
        ),
        "blind_retries": blind,
        "redelivered": redelivered,
        "same_key_retries": same_key,
        "refused_at_delivery": sum(
            1 for e in entries if e["event"] == "refused" and e.get("key") is not None
        ),
        "calls": sum(1 for e in entries if e["event"] in {"request", "validate"}),
    }


def fired(service: Service, fault: Fault, report: dict[str, Any], injected: set[int]) -> bool:
    """Whether the episode's scheduled fault happened (a crash: and the process restarted)."""
    if fault.kind == "injection":
        return bool(injected)
    if fault.kind == "permanent":
        return any(e["event"] == "refused" for e in service.entries())
    done = service.fired.exists() and service.fired.read_text() == fault.kind
    return done and (not fault.kind.startswith("crash") or report["restarts"] > 0)


# ---------------------------------------------------------------- the schedule
def plan_task(suite: Any, task: Any, seed: int, root: Path) -> dict[str, Any]:
    """The task's calls, its fault-free final environment and which calls change anything."""
    env = task.init_environment(suite.load_and_inject_default_environment({}))
    start = env.model_dump(mode="json")
    calls = _calls(task.ground_truth(env.model_copy(deep=True)))
    root.mkdir(parents=True, exist_ok=True)
    probe = Service(suite, root, Fault("none", -1))
    probe.reset(env)
    mistakes: dict[str, dict[int, dict[str, Any]]] = {kind: {} for kind in MISTAKES}
    for i, (name, args) in enumerate(calls):
        for kind, wrong in find_mistakes(probe.runtime, probe.load(), name, args).items():
            mistakes[kind][i] = wrong
        with contextlib.suppress(Exception):
            probe.call(name, args, i)
    effectful = sorted({e["call"] for e in probe.entries() if e["event"] == "effect"})
    rng = random.Random(f"{seed}/{suite.name}/{task.ID}")
    # among the injection tasks that make calls (some of AgentDojo's only plant text)
    attacks = [
        _calls(t.ground_truth(env.model_copy(deep=True)))
        for t in sorted(suite.injection_tasks.values(), key=lambda t: t.ID)
    ]
    injection = rng.choice([attack for attack in attacks if attack])
    return {
        "env": env,
        "start": start,
        "calls": calls,
        "reference": json.loads(probe.world.read_text()),
        "targets": effectful or list(range(len(calls))),
        "injection": injection,
        "seed": f"{seed}/{suite.name}/{task.ID}",
        "mistakes": mistakes,
    }


def schedule(plan: dict[str, Any], kind: str) -> tuple[Fault, Script, set[int], Any] | None:
    """The fault, the agent, the injected calls and the reference to diff; None for a mistake
    that no call of the task lets the agent make."""
    calls: list[Call] = list(plan["calls"])
    if kind == "none":
        return Fault(kind, -1), Script(calls), set(), plan["reference"]
    if kind == "injection":  # the attacker's calls, made right after the first call
        at = min(1, len(calls))
        calls[at:at] = plan["injection"]
        return (
            Fault(kind, -1),
            Script(calls),
            set(range(at, at + len(plan["injection"]))),
            plan["reference"],
        )
    draw = random.Random(f"{plan['seed']}/{kind}")
    if kind in MISTAKES:  # at a call that changes something where the tool rejects it
        possible = plan["mistakes"][kind]
        if not possible:
            return None
        targets = [c for c in plan["targets"] if c in possible] or sorted(possible)
        target = draw.choice(targets)
        script = script_for(calls, kind, target, possible[target])
        return Fault("none", -1), script, set(), plan["reference"]
    target = draw.choice(plan["targets"])
    reference = plan["start"] if kind == "permanent" else plan["reference"]
    return Fault(kind, target), Script(calls), set(), reference


def utility(task: Any, pre: Any, final: dict[str, Any], suite: Any) -> bool:
    post = revive(suite.environment_type, final)
    output = getattr(task, "GROUND_TRUTH_OUTPUT", "") or ""
    with contextlib.suppress(Exception):
        return bool(task.utility(output, pre, post))
    return False


def run(args: argparse.Namespace) -> dict[tuple[str, str, str], Cell]:
    cells: dict[tuple[str, str, str], Cell] = defaultdict(Cell)
    policy = {} if args.repeat_limit is None else {"repeat_limit": args.repeat_limit}
    root = Path(tempfile.mkdtemp(prefix="agenttx-damage-"))
    try:
        for suite_name in args.suites:
            suite = load_suite(suite_name)
            tasks = sorted(suite.user_tasks.values(), key=lambda t: int(t.ID.split("_")[-1]))
            if args.quick:
                tasks = [t for t in tasks if t.ID in QUICK[suite_name]]
            elif args.task_ids:
                tasks = [t for t in tasks if t.ID in args.task_ids]
            for task in tasks[: args.tasks]:
                for trial in range(args.trials):
                    plan = plan_task(suite, task, args.seed + trial, root / "probe")
                    for kind in args.faults:
                        scheduled = schedule(plan, kind)
                        if scheduled is None:
                            continue
                        fault, script, injected, reference = scheduled
                        for loop in args.loops:
                            directory = root / f"{suite_name}-{task.ID}-{trial}-{kind}-{loop}"
                            directory.mkdir(parents=True)
                            service = Service(suite, directory, fault)
                            service.reset(plan["env"])
                            began = time.perf_counter()
                            approved = plan["calls"] if kind == "injection" else None
                            report = run_episode(service, loop, script, approved, policy)
                            seconds = time.perf_counter() - began
                            if kind in MISTAKES and report["status"] != "done":
                                reference = plan["start"]  # a failed run should end undone
                            damage = measure(service, report, reference, injected)
                            cell = cells[suite_name, kind, loop]
                            cell.episodes += 1
                            cell.seconds += seconds
                            cell.calls += damage.pop("calls")
                            cell.turns += report["turns"]
                            final = json.loads(service.world.read_text())
                            # a run that ended failed gives no answer: read-only tasks
                            # would otherwise pass AgentDojo's check on the answer alone
                            cell.utility += report["status"] == "done" and utility(
                                task, plan["env"], final, suite
                            )
                            for name in METRICS:
                                cell.sums[name] += damage[name]
                            cell.redelivered += damage["redelivered"]
                            cell.same_key_retries += damage["same_key_retries"]
                            cell.refused_at_delivery += damage["refused_at_delivery"]
                            cell.fired += fired(service, fault, report, injected)
                            if not args.keep:
                                shutil.rmtree(directory)
    finally:
        if not args.keep:
            shutil.rmtree(root, ignore_errors=True)
    return cells


# ---------------------------------------------------------------- the table
HEADER = (
    "| suite | fault | loop | episodes | fault fired | utility | unintended | duplicates"
    " | orphaned | leaked | blind retries | calls | turns | seconds |"
)
# The rows whose fault is a fault of the service (the others are fault-free).
FAULTED = frozenset(FAULTS) - {"none"}


def _cells(fault: str, loop: str, c: Cell) -> list[str]:
    """The damage columns of a row, with agenttx's cells marked where nothing is claimed."""
    sums = {m: str(c.sums[m]) for m in METRICS}
    if loop == "agenttx" and fault not in CLAIMED:
        return [v if m == "blind_retries" else v + " (not claimed)" for m, v in sums.items()]
    if c.redelivered:
        sums["duplicates"] += f" (‡ {c.redelivered} not claimed)"
    if c.same_key_retries:
        sums["blind_retries"] += f" (‡ {c.same_key_retries} not claimed)"
    if loop == "agenttx" and c.refused_at_delivery and c.sums["orphaned"]:
        sums["orphaned"] += " (†)"
    return list(sums.values())


def table(cells: dict[tuple[str, str, str], Cell]) -> str:
    lines = [HEADER, "|" + "---|" * 14]
    for (suite, fault, loop), c in sorted(
        cells.items(), key=lambda kv: (SUITES.index(kv[0][0]), KINDS.index(kv[0][1]), kv[0][2])
    ):
        fired = f"{c.fired}/{c.episodes}" if fault in FAULTED else "-"
        lines.append(
            f"| {suite} | {fault} | {loop} | {c.episodes} | {fired} | {c.utility}/{c.episodes} | "
            + " | ".join(_cells(fault, loop, c))
            + f" | {c.calls} | {c.turns} | {c.seconds:.1f} |"
        )
    return "\n".join(lines)


def check(cells: dict[tuple[str, str, str], Cell]) -> list[str]:
    """The claims that fail: agenttx's zero cells and its fault-free utility; and any
    scheduled fault that did not fire."""
    problems = []
    for (suite, fault, loop), c in cells.items():
        if fault in FAULTED and c.fired < c.episodes:
            problems.append(f"{suite}/{fault}: {loop}'s fault fired in {c.fired}/{c.episodes}")
        if loop != "agenttx":
            continue
        if fault in CLAIMED:
            claimed = {
                "duplicates": c.sums["duplicates"] - c.redelivered,
                "leaked": c.sums["leaked"],
                "orphaned": 0 if c.refused_at_delivery else c.sums["orphaned"],
            }
            problems += [f"{suite}/{fault}: agenttx {m} = {n}" for m, n in claimed.items() if n]
        plain = cells.get((suite, "none", "plain"))
        if fault == "none" and plain is not None and c.utility < plain.utility:
            problems.append(f"{suite}: agenttx utility {c.utility} < plain {plain.utility}")
    return problems


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--quick", action="store_true", help="3 banking tasks, 2 workspace tasks (the tests)"
    )
    parser.add_argument("--suites", nargs="+", default=list(SUITES), choices=SUITES)
    parser.add_argument(
        "--faults", nargs="+", default=list(KINDS), choices=KINDS, help="faults and mistakes"
    )
    parser.add_argument("--loops", nargs="+", default=list(LOOPS), choices=list(LOOPS))
    parser.add_argument(
        "--tasks", type=int, default=12, help="first N user tasks per suite (1000: all of them)"
    )
    parser.add_argument("--task-ids", nargs="+", help="only these user tasks (user_task_N)")
    parser.add_argument("--trials", type=int, default=1, help="fault draws per task")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--keep", action="store_true", help="keep the episodes' files")
    parser.add_argument(
        "--repeat-limit",
        type=int,
        help="agenttx's RollbackPolicy.repeat_limit (default: the library's; 0: the reference)",
    )
    parser.add_argument("--write", type=Path, help="write the table into this RESULTS.md")
    parser.add_argument(
        "--allow-findings",
        action="store_true",
        help="exit 0 even when a FINDING is printed (exploratory runs)",
    )
    args = parser.parse_args(argv)
    if args.quick:
        args.suites = list(QUICK)
    began = time.perf_counter()
    cells = run(args)
    text = table(cells)
    print(text)
    episodes = sum(c.episodes for c in cells.values())
    print(f"\n{episodes} episodes in {time.perf_counter() - began:.0f} s")
    problems = check(cells)
    for problem in problems:
        print("FINDING:", problem)
    if args.write:
        seconds = time.perf_counter() - began
        summary = f"{episodes} episodes in {seconds:.0f} s." + "".join(
            f"\nFinding: {problem}." for problem in problems
        )
        write_results(args.write, text, summary, argv)
    return 1 if problems and not args.allow_findings else 0


def write_results(path: Path, text: str, summary: str, argv: list[str] | None) -> None:
    """Put the table in the "Damage prevented" section of `path` (replacing an older one)."""
    command = "python -m bench.damage " + " ".join(argv if argv is not None else sys.argv[1:])
    section = (
        "## Damage prevented\n\n"
        "AgentDojo's user tasks under the seeded fault schedule, through three loops; what each\n"
        "column counts, and the cells marked `(not claimed)`, `(‡ N not claimed)` and `(†)`,\n"
        "are explained in "
        f"bench/damage/README.md. Command: `{command.strip()}`.\n\n{text}\n\n{summary}\n"
    )
    content = path.read_text() if path.exists() else ""
    start = content.find("## Damage prevented")
    if start >= 0:
        end = content.find("\n## ", start + 1)
        content = content[:start] + section + (content[end + 1 :] if end >= 0 else "")
    else:
        content = content.rstrip("\n") + "\n\n" + section
    path.write_text(content)


if __name__ == "__main__":
    sys.exit(main())
