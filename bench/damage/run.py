"""Damage under faults: AgentDojo's task suites, three agent loops, one seeded fault schedule.

Run from the repository root (`pip install -e '.[dev]'` installs AgentDojo)::

    python -m bench.damage            # every suite and fault, 12 tasks a suite (the defaults)
    python -m bench.damage --quick    # 3 banking tasks (tests/test_bench_damage.py runs it)
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
from _world import FAULTS, Fault, Service, revive

SUITES = ("banking", "slack", "travel", "workspace")
VERSION = "v1.2.1"
METRICS = ("unintended", "duplicates", "orphaned", "leaked", "blind_retries")
# The rows of the table: the service's faults, then the agent's mistakes (made fault-free).
KINDS = (*FAULTS, *MISTAKES)
# Where agenttx's docs claim zero (README "Durability and crash recovery", docs/approvals.md):
# duplicates, leaked irreversible effects and orphaned partial state, for every fault but a
# silent no-op (a service that answers success without acting is beyond any loop's reach).
CLAIMED = frozenset(f for f in KINDS if f != "noop")
# Not claimed either: a staged message or payment is delivered after the commit, so a service
# that refuses it for good (the "permanent" fault on such a call) cannot undo the committed
# writes before it; the outbox keeps the effect and its error (`engine.pending_effects()`).
AFTER_COMMIT = ("permanent", "orphaned")


@dataclass
class Cell:
    """The sums of one (suite, fault, loop) over its episodes."""

    episodes: int = 0
    utility: int = 0
    calls: int = 0
    turns: int = 0
    seconds: float = 0.0
    sums: dict[str, int] = field(default_factory=lambda: dict.fromkeys(METRICS, 0))


def load_suite(name: str) -> Any:
    return get_suite(name, VERSION)


def _calls(function_calls: Any) -> list[Call]:
    return [(c.function, dict(c.args)) for c in function_calls]


# ---------------------------------------------------------------- diffing environments
def _items(value: Any, path: str = "") -> set[str]:
    """An environment as a set of leaves: dict keys are paths, list items an unordered bag."""
    if isinstance(value, dict):
        out: set[str] = set()
        for key, item in value.items():
            if key == "timestamp":  # when a message was sent: the clock's, not the agent's
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
        return {k: _untimed(v) for k, v in value.items() if k != "timestamp"}
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
    """The damage of one episode, from the service's ledger and its final environment."""
    entries = service.entries()
    final = json.loads(service.world.read_text())
    failed = report["status"] != "done"
    live: dict[int, list[dict[str, Any]]] = defaultdict(list)
    blind, timed_out, last = 0, {}, {}
    for entry in entries:
        call, event = entry["call"], entry["event"]
        if event == "effect":
            live[call].append(entry)
        if event == "undo" and live[call]:
            live[call].pop()
        if event == "timeout" and last.get(call) == "effect":  # a read's retry risks nothing
            timed_out[call] = entry.get("key")
        elif event in {"checked", "undo"}:
            timed_out.pop(call, None)
        elif event == "request" and call in timed_out:
            key = timed_out.pop(call)
            blind += key is None or entry.get("key") != key  # the same key: deduplicated
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
        "calls": sum(1 for e in entries if e["event"] in {"request", "validate"}),
    }


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
    injection = rng.choice(sorted(suite.injection_tasks.values(), key=lambda t: t.ID))
    return {
        "env": env,
        "start": start,
        "calls": calls,
        "reference": json.loads(probe.world.read_text()),
        "targets": effectful or list(range(len(calls))),
        "injection": _calls(injection.ground_truth(env.model_copy(deep=True))),
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
            if args.task_ids:
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
                            if not args.keep:
                                shutil.rmtree(directory)
    finally:
        if not args.keep:
            shutil.rmtree(root, ignore_errors=True)
    return cells


# ---------------------------------------------------------------- the table
HEADER = (
    "| suite | fault | loop | episodes | utility | unintended | duplicates | orphaned | leaked"
    " | blind retries | calls | turns | seconds |"
)


def table(cells: dict[tuple[str, str, str], Cell]) -> str:
    lines = [HEADER, "|" + "---|" * 13]
    for (suite, fault, loop), c in sorted(
        cells.items(), key=lambda kv: (SUITES.index(kv[0][0]), KINDS.index(kv[0][1]), kv[0][2])
    ):
        sums = [str(c.sums[m]) for m in METRICS]
        if loop == "agenttx" and fault not in CLAIMED:
            sums = [
                s + " (not claimed)" if m != "blind_retries" else s
                for s, m in zip(sums, METRICS, strict=True)
            ]
        elif loop == "agenttx" and fault == AFTER_COMMIT[0]:
            sums = [
                s + " (†)" if m == AFTER_COMMIT[1] and s != "0" else s
                for s, m in zip(sums, METRICS, strict=True)
            ]
        lines.append(
            f"| {suite} | {fault} | {loop} | {c.episodes} | {c.utility}/{c.episodes} | "
            + " | ".join(sums)
            + f" | {c.calls} | {c.turns} | {c.seconds:.1f} |"
        )
    return "\n".join(lines)


def check(cells: dict[tuple[str, str, str], Cell]) -> list[str]:
    """The claims that fail: agenttx's zero cells, and its fault-free utility."""
    problems = []
    for (suite, fault, loop), c in cells.items():
        if loop != "agenttx":
            continue
        if fault in CLAIMED:
            problems += [
                f"{suite}/{fault}: agenttx {m} = {c.sums[m]}"
                + (
                    " (†: a staged effect refused after the commit)"
                    if (fault, m) == AFTER_COMMIT
                    else ""
                )
                for m in ("duplicates", "leaked", "orphaned")
                if c.sums[m]
            ]
        plain = cells.get((suite, "none", "plain"))
        if fault == "none" and plain is not None and c.utility < plain.utility:
            problems.append(f"{suite}: agenttx utility {c.utility} < plain {plain.utility}")
    return problems


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="3 banking tasks (the tests run it)")
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
    args = parser.parse_args(argv)
    if args.quick:
        # a payment, an update of a scheduled payment, and both with a profile update
        args.suites, args.task_ids = ["banking"], ["user_task_0", "user_task_2", "user_task_15"]
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
    return 0


def write_results(path: Path, text: str, summary: str, argv: list[str] | None) -> None:
    """Put the table in the "Damage prevented" section of `path` (replacing an older one)."""
    command = "python -m bench.damage " + " ".join(argv if argv is not None else sys.argv[1:])
    section = (
        "## Damage prevented\n\n"
        "AgentDojo's user tasks under the seeded fault schedule, through three loops; what each\n"
        "column counts, and the cells marked `(not claimed)` and `(†)`, are explained in\n"
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
