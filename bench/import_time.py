"""How long `import agenttx` takes in a fresh interpreter, and which modules the time goes to.

Run from the repository root::

    python bench/import_time.py          # the full run (21 fresh processes)
    python bench/import_time.py --quick  # a smoke run (used by tests/test_bench.py)

Each run is a fresh `python -c` process that times `import agenttx` with
`time.perf_counter` around the import statement (the interpreter's own start-up is not
counted); the figure is the median over the runs. Bytecode is cached, as it is for an
installed package: the runs write and read it under a temporary `PYTHONPYCACHEPREFIX` (so
nothing is written into the checkout, whatever `PYTHONDONTWRITEBYTECODE` says), after one
untimed run that fills it. Then a few runs under `python -X importtime` give each module's
cumulative import time (its own and its imports'); the table shows the top 10 by median.
For information, as many runs again with `PYTHONDONTWRITEBYTECODE=1` and no cache prefix: the
standard library's bytecode is read from the installation, but agenttx is compiled from source
at every import unless the checkout already holds its `__pycache__` (this is what a plain
`python -c "import agenttx"` measures in an environment that sets that variable).

Target (issue 11): at most 75 ms. Correctness check, also in `--quick`: `import agenttx`
loads none of asyncio, sqlite3, concurrent.futures and rustworkx (each path loads what it
needs when it first runs). `--quick` reports a missed timing without failing.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from _report import Row, report

TARGET_MS = 75.0
ROOT = Path(__file__).resolve().parent.parent
#: Modules `import agenttx` must not load: the paths that need them import them.
NOT_AT_IMPORT = ("asyncio", "sqlite3", "concurrent.futures", "rustworkx")


def timed(statement: str) -> str:
    """A `python -c` program that times `statement` (an import, say) and prints its wall and CPU
    milliseconds and which of NOT_AT_IMPORT are loaded after it."""
    return (
        "import sys, time\n"
        "started, cpu = time.perf_counter(), time.process_time()\n"
        f"{statement}\n"
        "elapsed, cpu = time.perf_counter() - started, time.process_time() - cpu\n"
        f"loaded = [m for m in {NOT_AT_IMPORT!r} if m in sys.modules]\n"
        "print(elapsed * 1000, cpu * 1000, ','.join(loaded))\n"
    )


TIMED = timed("import agenttx")


def environment(cache: str | None, root: Path = ROOT) -> dict[str, str]:
    """The checkout at `root` (this one by default) importable, bytecode cached under `cache`
    (or never written if None)."""
    env = dict(os.environ)
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    env.pop("PYTHONPYCACHEPREFIX", None)
    if cache is None:
        env["PYTHONDONTWRITEBYTECODE"] = "1"
    else:
        env["PYTHONPYCACHEPREFIX"] = cache
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(root), env.get("PYTHONPATH")]))
    return env


def run(arguments: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """Run the interpreter with `arguments`; exit if it fails."""
    result = subprocess.run(  # noqa: S603  (our own interpreter and arguments)
        [sys.executable, *arguments],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
        check=False,
    )
    if result.returncode != 0:
        raise SystemExit(f"{arguments} failed:\n{result.stdout}{result.stderr}")
    return result


def time_import(env: dict[str, str], program: str = TIMED) -> tuple[float, float, str]:
    """Wall and CPU milliseconds of `import agenttx` (or of what `program`, made by `timed`,
    times) in a fresh process, and what it loaded.

    What it loaded: those of NOT_AT_IMPORT, comma-separated.
    """
    elapsed, cpu, *loaded = run(["-c", program], env).stdout.split()
    return float(elapsed), float(cpu), ",".join(loaded)


def module_times(env: dict[str, str]) -> dict[str, int]:
    """Cumulative microseconds per module from one `python -X importtime` run."""
    stderr = run(["-X", "importtime", "-c", "import agenttx"], env).stderr
    times: dict[str, int] = {}
    for line in stderr.splitlines():
        if not line.startswith("import time:") or "cumulative" in line:
            continue
        _, cumulative, name = (field.strip() for field in line.split("|"))
        times[name] = int(cumulative)
    return times


def main() -> int:
    """Time the import, print the table, return 1 if the target is missed on a full run."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a small smoke run")
    parser.add_argument("--runs", type=int, default=None, help="fresh processes to time")
    args = parser.parse_args()
    runs = args.runs or (3 if args.quick else 21)
    profiles = 1 if args.quick else 5
    with tempfile.TemporaryDirectory(prefix="agenttx-pycache-") as cache:
        env = environment(cache)
        time_import(env)  # fills the bytecode cache
        timed = [time_import(env) for _ in range(runs)]
        profiled = [module_times(env) for _ in range(profiles)]
    uncached = [time_import(environment(None))[0] for _ in range(runs)]
    figures = [elapsed for elapsed, _, _ in timed]
    cpu = statistics.median(cpu for _, cpu, _ in timed)
    loaded = {module for _, _, modules in timed for module in modules.split(",") if module}
    median = statistics.median(figures)
    cumulative = {
        name: statistics.median(profile.get(name, 0) for profile in profiled)
        for name in profiled[0]
    }
    print(f"top 10 modules by cumulative import time (median of {profiles} -X importtime runs):")
    for name, micros in sorted(cumulative.items(), key=lambda item: -item[1])[:10]:
        print(f"  {micros / 1000:7.1f} ms  {name}")
    print()
    compiled = (ROOT / "agenttx" / "__pycache__").exists()
    print(
        f"without writing bytecode: median {statistics.median(uncached):.1f} ms"
        f" (min {min(uncached):.1f}, max {max(uncached):.1f} ms) over {runs} fresh processes"
        + (" (the checkout holds agenttx/__pycache__)" if compiled else "")
        + "\n"
    )
    rows = [
        Row(
            name="import agenttx",
            measured=f"{median:.1f} ms",
            target=f"<= {TARGET_MS:g} ms",
            ratio=median / TARGET_MS,
            detail=(
                f"median of {runs} fresh processes (min {min(figures):.1f}, max"
                f" {max(figures):.1f} ms), bytecode cached; CPU time {cpu:.1f} ms (median),"
                " which a busy machine inflates less"
            ),
        )
    ]
    status = report(rows, quick=args.quick)
    if loaded:
        print(f"\nFAILED: `import agenttx` loaded {', '.join(sorted(loaded))}")
        return 1
    return status


if __name__ == "__main__":
    sys.exit(main())
