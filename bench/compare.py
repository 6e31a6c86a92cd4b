"""Side by side: this working tree against an earlier commit, in alternating fresh processes.

Run from the repository root::

    python bench/compare.py                          # against 1ffc288, 7 rounds
    python bench/compare.py --against REV --rounds 9 --json results.json
    python bench/compare.py --quick                  # a smoke run (used by tests/test_bench.py)

The commit (`--against`, default 1ffc288: the code before the approvals, turns and plans work)
is checked out into a temporary `git worktree`, removed at the end. Each measure runs in fresh
processes, `bench/_probe.py MEASURE` with `PYTHONPATH` naming one tree or the other, old and new
alternately (the order swaps every round, so a drift of the machine's load weighs on both), for
`--rounds` rounds; the figure is the median over rounds, and the ratio is new / old. Both trees'
bytecode is compiled first, and every probe warms its workload up once before it times it. The
measurement code is this tree's bench code (`_chain`, `transaction`, `throughput`, `durable`,
`plans`, `import_time`) run on either tree's library, so both sides run the same workload.

The measures:

- a step of a `Transaction(tools=[...])` with an inline no-op tool on the in-memory store, the
  mean over the steps of 300 chains of 20 (bench/transaction.py's chain), and LangGraph running
  the same chain in a process of its own in the same round (bench/_chain.py's `time_langgraph`,
  the mean over 100 runs), for the lead of each tree;
- the engine's throughput: 20 `kv.put` steps and a commit a transaction, one thread, 512
  transactions on a `MemoryStore` (bench/throughput.py) and on a fresh `SQLiteStore` file
  (bench/durable.py);
- a durable step: the chain on an `Engine` over a `SQLiteStore` file (bench/durable.py), the mean;
- a plan node's scheduling: the overhead plan of bench/plans.py in memory (10,000 nodes) and
  durably on a `SQLiteStore` file (1,000 nodes), the wall time a node. A tree without plans has
  no figure: the table shows this tree's figure against the target instead of a ratio;
- `import agenttx` against `import httpx` (bench/import_time.py's timing: wall time around the
  import statement in a fresh `python -c`), and for information `import agenttx` followed by
  its first use (`agenttx.Transaction` and `agenttx.tool`), which loads what the import defers.

Targets (the speed issue): a step at most 1.10 times the old commit's (the durable step too);
LangGraph at least 15 times slower than a step; throughput at least 0.90 times the old commit's;
a plan node at most 30 us of scheduling in memory and 150 us durably on SQLite; `import agenttx`
no slower than `import httpx`. The machine's load average is printed at the start and the end:
on a shared machine the figures are only as good as the load is low. `--quick` runs one round
of small workloads, checks that every measure ran, and reports missed targets without failing.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from _report import Row, report
from import_time import environment, time_import, timed

ROOT = Path(__file__).resolve().parent.parent
BENCH = ROOT / "bench"
PROBE = BENCH / "_probe.py"
DEFAULT_AGAINST = "1ffc288"

STEP_TARGET = 1.10  # new / old, at most
LEAD_TARGET = 15.0  # LangGraph / agenttx per step, at least
TPS_TARGET = 0.90  # new / old, at least
PLAN_TARGET_US = 30.0
PLAN_DURABLE_TARGET_US = 150.0
IMPORT_TARGET = 1.0  # import agenttx / import httpx, at most

IMPORT = timed("import agenttx")
FIRST_USE = timed("import agenttx\nagenttx.Transaction\nagenttx.tool")
HTTPX = timed("import httpx")


@dataclass(frozen=True)
class Measure:
    """One line of the comparison."""

    key: str  # the probe's measure, or an import program's name
    label: str
    unit: str
    per_tree: bool = True  # False: measured once a round, not on each tree (LangGraph, httpx)


MEASURES = (
    Measure("step", "step, inline tool, in memory (mean)", "us"),
    Measure("langgraph", "LangGraph, the same chain (mean)", "us", per_tree=False),
    Measure("tps_memory", "20 kv.put + commit, MemoryStore", "tx/s"),
    Measure("tps_sqlite", "20 kv.put + commit, SQLiteStore", "tx/s"),
    Measure("durable_step", "step, durable on SQLite (mean)", "us"),
    Measure("plan_memory", "plan node, in memory", "us"),
    Measure("plan_durable", "plan node, durable on SQLite", "us"),
    Measure("import", "import agenttx", "ms"),
    Measure("first_use", "import agenttx + first use", "ms"),
    Measure("httpx", "import httpx", "ms", per_tree=False),
)
IMPORTS = {"import": IMPORT, "first_use": FIRST_USE, "httpx": HTTPX}


def git(*arguments: str) -> str:
    """Run git in this checkout; its output, stripped; exit if it fails."""
    result = subprocess.run(  # noqa: S603  (git with our own arguments)
        ["git", "-C", str(ROOT), *arguments],  # noqa: S607
        capture_output=True,
        text=True,
        check=False,
    )
    if result.returncode != 0:
        raise SystemExit(f"git {' '.join(arguments)} failed: {result.stderr.strip()}")
    return result.stdout.strip()


def probe(measure: str, env: dict[str, str], *, quick: bool) -> float | None:
    """Run one measure in a fresh process on the tree `env` names; its figure."""
    arguments = [sys.executable, str(PROBE), measure, *(["--quick"] if quick else [])]
    result = subprocess.run(  # noqa: S603  (our own interpreter and script)
        arguments, capture_output=True, text=True, env=env, timeout=600, check=False
    )
    if result.returncode != 0:
        raise SystemExit(f"{measure} failed:\n{result.stdout}{result.stderr}")
    value: float | None = json.loads(result.stdout.splitlines()[-1])["value"]
    return value


def importable(module: str) -> bool:
    """True if `module` imports in this interpreter (httpx and LangGraph are optional)."""
    code = f"import importlib.util, sys; sys.exit(importlib.util.find_spec({module!r}) is None)"
    return subprocess.run([sys.executable, "-c", code], check=False).returncode == 0  # noqa: S603


def compile_tree(root: Path, env: dict[str, str]) -> None:
    """Compile `root`'s library (and this tree's bench code) to bytecode, as an install would."""
    targets = [str(root / "agenttx"), str(BENCH)]
    subprocess.run(  # noqa: S603  (our own interpreter)
        [sys.executable, "-m", "compileall", "-q", *targets], env=env, check=True
    )


def run_rounds(
    trees: dict[str, dict[str, str]], rounds: int, *, quick: bool
) -> dict[str, dict[str, list[float]]]:
    """Every measure, `rounds` times, old and new alternately: the figures by measure and tree.

    A measure that is not run on each tree (LangGraph, httpx) is filed under "peer". A tree that
    lacks a measure's feature gets no figures for it.
    """
    with_langgraph, with_httpx = importable("langgraph"), importable("httpx")
    found: dict[str, dict[str, list[float]]] = {m.key: {} for m in MEASURES}

    def note(key: str, side: str, value: float | None) -> None:
        if value is not None:
            found[key].setdefault(side, []).append(value)

    for env in trees.values():  # untimed: the first start of each program
        for program in (IMPORT, FIRST_USE):
            time_import(env, program)
    if with_httpx:
        time_import(trees["new"], HTTPX)
    for number in range(rounds):
        order = ["old", "new"] if number % 2 == 0 else ["new", "old"]
        print(f"round {number + 1} of {rounds} ({' then '.join(order)})", file=sys.stderr)
        for measure in MEASURES:
            if measure.key == "langgraph" and with_langgraph:
                note("langgraph", "peer", probe("langgraph", trees["new"], quick=quick))
            elif measure.key == "httpx" and with_httpx:
                note("httpx", "peer", time_import(trees["new"], HTTPX)[0])
            elif measure.key in IMPORTS and measure.per_tree:
                for side in order:
                    note(measure.key, side, time_import(trees[side], IMPORTS[measure.key])[0])
            elif measure.per_tree:
                for side in order:
                    note(measure.key, side, probe(measure.key, trees[side], quick=quick))
    return found


def medians(found: dict[str, dict[str, list[float]]]) -> dict[str, dict[str, float]]:
    """The median of each measure's figures, by tree."""
    return {
        key: {side: statistics.median(values) for side, values in sides.items()}
        for key, sides in found.items()
    }


def comparison_table(figures: dict[str, dict[str, float]], against: str) -> None:
    """Print each measure's old and new medians and their ratio."""
    headers = ("measure", against, "work tree", "new/old")
    cells = []
    for m in MEASURES:
        sides = figures.get(m.key, {})
        if not sides:
            continue
        old, new = sides.get("old", sides.get("peer")), sides.get("new", sides.get("peer"))

        def cell(value: float | None, unit: str = m.unit) -> str:
            if value is None:
                return "-"
            return f"{value:,.0f} {unit}" if unit == "tx/s" else f"{value:,.1f} {unit}"

        ratio = "-" if old is None or new is None or not m.per_tree else f"{new / old:.2f}x"
        cells.append((m.label, cell(old), cell(new), ratio))
    widths = [max(len(h), *(len(c[i]) for c in cells)) for i, h in enumerate(headers)]
    print("  ".join(h.ljust(w) for h, w in zip(headers, widths, strict=True)).rstrip())
    print("  ".join("-" * w for w in widths))
    for row in cells:
        print("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip())
    print()


def target_rows(figures: dict[str, dict[str, float]], against: str) -> tuple[list[Row], list[str]]:
    """The targets' rows, and notes on those that could not be measured."""
    rows: list[Row] = []
    notes: list[str] = []

    def pair(key: str) -> tuple[float, float] | None:
        sides = figures.get(key, {})
        return (sides["old"], sides["new"]) if "old" in sides and "new" in sides else None

    for key, label in (("step", "step"), ("durable_step", "durable SQLite step")):
        if (found := pair(key)) is not None:
            ratio = found[1] / found[0]
            rows.append(
                Row(
                    name=f"{label} / {against}'s",
                    measured=f"{ratio:.2f}x",
                    target=f"<= {STEP_TARGET:.2f}x",
                    ratio=ratio / STEP_TARGET,
                    detail=f"{found[0]:.1f} us before, {found[1]:.1f} us now (mean a step)",
                )
            )
    langgraph = figures.get("langgraph", {}).get("peer")
    if langgraph is None:
        notes.append("LangGraph is not installed (pip install -e '.[bench]'): no lead measured")
    elif (found := pair("step")) is not None:
        lead_old, lead_new = langgraph / found[0], langgraph / found[1]
        rows.append(
            Row(
                name="LangGraph / agenttx step",
                measured=f"{lead_new:.1f}x",
                target=f">= {LEAD_TARGET:g}x",
                ratio=LEAD_TARGET / lead_new,
                detail=f"LangGraph {langgraph:.1f} us a node; {against}'s lead {lead_old:.1f}x",
            )
        )
    for key, store in (("tps_memory", "MemoryStore"), ("tps_sqlite", "SQLiteStore")):
        if (found := pair(key)) is not None:
            ratio = found[1] / found[0]
            rows.append(
                Row(
                    name=f"tx/s on {store} / {against}'s",
                    measured=f"{ratio:.2f}x",
                    target=f">= {TPS_TARGET:.2f}x",
                    ratio=TPS_TARGET / ratio,
                    detail=f"{found[0]:,.0f} tx/s before, {found[1]:,.0f} tx/s now",
                )
            )
    for key, label, target in (
        ("plan_memory", "plan node in memory", PLAN_TARGET_US),
        ("plan_durable", "plan node durable", PLAN_DURABLE_TARGET_US),
    ):
        sides = figures.get(key, {})
        if "new" not in sides:
            notes.append(f"{label}: not measured (this tree has no plan runner)")
            continue
        before = (
            f"{against}: {sides['old']:.1f} us"
            if "old" in sides
            else f"{against} has no plans: this tree's figure against the target"
        )
        rows.append(
            Row(
                name=label,
                measured=f"{sides['new']:.1f} us",
                target=f"<= {target:g} us",
                ratio=sides["new"] / target,
                detail=f"wall time a node; {before}",
            )
        )
    ours, httpx = figures.get("import", {}), figures.get("httpx", {}).get("peer")
    if httpx is None:
        notes.append("httpx is not installed: `import agenttx` not compared")
    elif "new" in ours:
        ratio = ours["new"] / httpx
        use = figures.get("first_use", {})
        rows.append(
            Row(
                name="import agenttx / import httpx",
                measured=f"{ratio:.2f}x",
                target=f"<= {IMPORT_TARGET:g}x",
                ratio=ratio / IMPORT_TARGET,
                detail=f"{ours['new']:.1f} ms against {httpx:.1f} ms; {against}:"
                f" {ours.get('old', float('nan')):.1f} ms; with the first use of"
                f" Transaction and tool: {use.get('new', float('nan')):.1f} ms now,"
                f" {use.get('old', float('nan')):.1f} ms before",
            )
        )
    return rows, notes


def load() -> tuple[float, float, float]:
    """The machine's load average (1, 5 and 15 minutes)."""
    return os.getloadavg()


def main() -> int:
    """Check the commit out, run the rounds, print the tables, write the JSON if asked."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--against", default=DEFAULT_AGAINST, help="the commit to compare with")
    parser.add_argument("--rounds", type=int, default=None, help="rounds (default 7; quick: 1)")
    parser.add_argument("--quick", action="store_true", help="small workloads: a smoke run")
    parser.add_argument("--json", type=Path, default=None, help="write the results here")
    args = parser.parse_args()
    rounds = args.rounds or (1 if args.quick else 7)
    if rounds < 1:
        parser.error("--rounds must be at least 1")
    load_start = load()
    commit = git("rev-parse", "--verify", f"{args.against}^{{commit}}")
    against = args.against if args.against != commit else commit[:10]
    with tempfile.TemporaryDirectory(prefix="agenttx-compare-") as scratch:
        old_root = Path(scratch) / "old"
        git("worktree", "add", "--detach", str(old_root), commit)
        try:
            # Bytecode beside each tree's sources, compiled first, then only read.
            trees = {"old": environment(None, old_root), "new": environment(None, ROOT)}
            compile_tree(old_root, trees["old"])
            compile_tree(ROOT, trees["new"])
            found = run_rounds(trees, rounds, quick=args.quick)
        finally:
            git("worktree", "remove", "--force", str(old_root))
    load_end = load()
    missing = [m.key for m in MEASURES if m.per_tree and "new" not in found[m.key]]
    if missing:
        raise SystemExit(f"no figure for this tree: {', '.join(missing)}")
    figures = medians(found)
    print(
        f"{rounds} round(s), old ({against}) and new (this working tree) alternately;"
        f" medians over rounds; load average {load_start[0]:.2f} at the start,"
        f" {load_end[0]:.2f} at the end (1 minute; 2 cores: above 2 the run shares them)\n"
    )
    comparison_table(figures, against)
    rows, notes = target_rows(figures, against)
    if args.json is not None:
        results: dict[str, Any] = {
            "against": against,
            "commit": commit,
            "rounds": rounds,
            "quick": args.quick,
            "load_start": load_start,
            "load_end": load_end,
            "measures": {
                m.key: {"label": m.label, "unit": m.unit, "figures": found[m.key]}
                | {"median": figures[m.key]}
                for m in MEASURES
            },
            "targets": [
                {"name": r.name, "measured": r.measured, "target": r.target, "passed": r.passed}
                for r in rows
            ],
        }
        args.json.write_text(json.dumps(results, indent=2) + "\n")
    return report(rows, quick=args.quick, notes=notes)


if __name__ == "__main__":
    sys.exit(main())
