"""Instructions a transaction costs, this working tree against an earlier commit (valgrind).

Run from the repository root (needs `valgrind`)::

    python bench/instructions.py                 # against 1ffc288
    python bench/instructions.py --against REV
    python bench/instructions.py --quick         # runs the workloads once, without valgrind

Timings on a shared machine move with its load; the count of machine instructions that a
workload executes does not (to a fraction of a percent). Each workload runs under
`valgrind --tool=callgrind` twice in fresh processes, with 10 and with 40 transactions after
the same warm-up, and the difference divided by 30 is what one transaction costs, start-up and
import excluded. The workloads are compare.py's: a chain of 20 steps of an inline no-op tool
with one `${steps.N.id}` reference (`Transaction(tools=[...])`, begun and committed each time),
and 20 `kv.put` steps and a commit on an `Engine` over a `MemoryStore`. The ratio new / old is
the one to read: it is what the timed comparison measures, without the noise.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

from _report import Row, report
from compare import DEFAULT_AGAINST, ROOT, STEP_TARGET, TPS_TARGET, git

WORKLOAD = """
import sys, tempfile
import agenttx
from agenttx import builtins
sys.path.insert(0, {bench!r})
from _chain import noop
mode, count = sys.argv[1], int(sys.argv[2])
tool = agenttx.tool(inline=True)(noop)
engine = agenttx.Engine(tools=builtins.tools(tempfile.mkdtemp()))
def chain(n):
    tx = agenttx.Transaction(tools=[tool])
    tx.execute_step(1, "noop", {{"a": "start", "b": 1, "c": "lit", "d": True}})
    for step in range(2, 21):
        arguments = {{"a": f"${{{{steps.{{step - 1}}.id}}}}", "b": step, "c": "lit", "d": True}}
        tx.execute_step(step, "noop", arguments)
    tx.commit()
def kv(n):
    tx = engine.begin()
    for step in range(1, 21):
        tx.execute_step(step, "kv.put", {{"key": f"t{{n}}/s{{step}}", "value": step}})
    tx.commit()
work = chain if mode == "chain" else kv
for n in range(5 + count):
    work(n)
"""


def instructions(tree: Path, mode: str, count: int) -> int:
    """The instructions one run of the workload executes on `tree`'s library."""
    with tempfile.TemporaryDirectory() as folder:
        script = Path(folder) / "workload.py"
        script.write_text(WORKLOAD.format(bench=str(ROOT / "bench")))
        result = subprocess.run(  # noqa: S603  (valgrind on our own script)
            [  # noqa: S607
                "valgrind",
                "--tool=callgrind",
                f"--callgrind-out-file={folder}/out",
                sys.executable,
                str(script),
                mode,
                str(count),
            ],
            capture_output=True,
            text=True,
            check=False,
            env={**os.environ, "PYTHONPATH": str(tree)},
        )
    found = re.search(r"Collected : (\d+)", result.stderr)
    if result.returncode != 0 or found is None:
        raise SystemExit(f"valgrind failed on {tree}: {result.stderr[-2000:]}")
    return int(found.group(1))


def quick_run(mode: str) -> None:
    """Run the workload once on this tree, without valgrind; exit if it fails."""
    with tempfile.TemporaryDirectory() as folder:
        script = Path(folder) / "workload.py"
        script.write_text(WORKLOAD.format(bench=str(ROOT / "bench")))
        result = subprocess.run(  # noqa: S603  (our own interpreter and script)
            [sys.executable, str(script), mode, "1"],
            capture_output=True,
            text=True,
            check=False,
            env={**os.environ, "PYTHONPATH": str(ROOT)},
        )
    if result.returncode != 0:
        raise SystemExit(f"the {mode} workload failed: {result.stderr[-2000:]}")


def per_transaction(tree: Path, mode: str) -> float:
    """Instructions one transaction of the workload costs on `tree`."""
    return (instructions(tree, mode, 40) - instructions(tree, mode, 10)) / 30


#: The workloads, and the target of each: the issue's (a step at most 1.10 times the old
#: commit's; throughput at least 0.90 times, that is instructions at most 1 / 0.90 times).
WORKLOADS = (
    ("chain", "step, 20-step chain, inline tool", STEP_TARGET),
    ("kv", "step, engine, 20 kv.put", 1 / TPS_TARGET),
)


def main() -> int:
    """Print the instructions a step costs on both trees, and their ratio, as a table."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--against", default=DEFAULT_AGAINST, help="the commit to compare with")
    parser.add_argument(
        "--quick", action="store_true", help="run each workload once on this tree, uncounted"
    )
    args = parser.parse_args()
    rows = []
    if args.quick:  # the smoke run of tests/test_bench.py: the workloads still run
        for mode, label, _ in WORKLOADS:
            quick_run(mode)
            rows.append(Row(label, "ran", "-", 0.0, "--quick: run once, not counted"))
        return report(rows, quick=True)
    commit = git("rev-parse", "--short", args.against)
    with tempfile.TemporaryDirectory() as folder:
        old_root = Path(folder) / "old"
        git("worktree", "add", "--detach", str(old_root), commit)
        try:
            for mode, label, target in WORKLOADS:
                old, new = per_transaction(old_root, mode), per_transaction(ROOT, mode)
                rows.append(
                    Row(
                        label,
                        f"{new / old:.3f}x",
                        f"<= {target:.2f}x",
                        new / old / target,
                        f"{old / 20:,.0f} instructions a step with {commit}, {new / 20:,.0f} now "
                        "(begin and commit included)",
                    )
                )
        finally:
            git("worktree", "remove", "--force", str(old_root))
    return report(rows, quick=False)


if __name__ == "__main__":
    sys.exit(main())
