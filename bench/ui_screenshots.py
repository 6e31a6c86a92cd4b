"""The README's pictures of `agenttx ui`: the approval inbox and a transaction's graph.

    python bench/ui_screenshots.py          # writes docs/img/ui-inbox.png and docs/img/ui-graph.png
    python bench/ui_screenshots.py --quick  # the same into a temporary folder (tests/test_bench.py)

It runs the demo (`python -m agenttx demo`) into a temporary folder, adds to its SQLite file a
transaction whose charge waits for a person's approval, serves the file with `agenttx ui`, and
takes two screenshots with headless Chromium (Debian's `chromium`, driven by Playwright): the
inbox with the waiting charge, and the demo's transaction with its rewound attempts and the root
cause of the rewind. Correctness checks, also in `--quick`: the inbox lists the charge, the graph
marks rewound attempts and a root cause. Target: each picture under 300 KB. Without Chromium or
Playwright it says so and measures nothing (a failure under AGENTTX_REQUIRE_CHROMIUM=1).
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import IO, Any

import agenttx
from _report import Row, report
from agenttx.stores import SQLiteStore

ROOT = Path(__file__).resolve().parent.parent
#: The most a picture may weigh, in KB (the README loads both).
MAX_KB = 300
VIEWPORT = {"width": 1280, "height": 860}


@agenttx.tool(name="payments.charge", needs_approval=lambda arguments: arguments["amount"] > 10_000)
def charge(amount: int, card: str, order_id: str) -> dict:
    """Charge a card.

    Args:
        amount: the amount in pence
        card: the card's token
        order_id: the order it pays for
    """
    return {"charge_id": "ch_1", "amount": amount, "card": card, "order_id": order_id}


@agenttx.tool(name="orders.lookup")
def lookup_order(order_id: str) -> dict:
    """Look an order up.

    Args:
        order_id: the order's id
    """
    return {"order_id": order_id, "total": 12_500, "card": "tok_visa_4242"}


#: Where the agenttx this script imported lives: the demo and the server run it too (`-m`
#: looks in the working directory first), so that they read the file this script writes.
MINE = str(Path(agenttx.__file__).resolve().parent.parent)


def _env() -> dict[str, str]:
    """The environment of the demo and the server: the agenttx this script imported (the one
    that writes the waiting charge into the same file)."""
    path = os.environ.get("PYTHONPATH", "")
    return {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (MINE, path) if p)}


def _demo(folder: Path) -> str:
    """Run the demo into `folder`; the id of its transaction."""
    done = subprocess.run(  # noqa: S603  (our own interpreter and command)
        [sys.executable, "-m", "agenttx", "demo", "--dir", str(folder)],
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
        env=_env(),
        cwd=MINE,
    )
    found = re.search(r"agenttx inspect \S+ ([0-9a-f-]{36})$", done.stdout, re.MULTILINE)
    if found is None:
        raise SystemExit(f"the demo named no transaction:\n{done.stdout}")
    return found[1]


def _shoot(db: Path, tx: str, out: Path) -> tuple[Path, Path]:
    """Serve `db` with `agenttx ui` and save the two pictures into `out`."""
    with tempfile.TemporaryFile("w+") as log:  # the server's log, shown if it does not start
        return _serve(db, tx, out, log)


def _serve(db: Path, tx: str, out: Path, log: IO[str]) -> tuple[Path, Path]:
    from playwright.sync_api import expect, sync_playwright  # noqa: PLC0415

    server = subprocess.Popen(  # noqa: S603  (our own interpreter and command)
        [sys.executable, "-m", "agenttx", "ui", str(db), "--port", "0", "--actor", "alice"],
        stdout=subprocess.PIPE,
        stderr=log,
        text=True,
        env=_env(),
        cwd=MINE,
    )
    try:
        assert server.stdout is not None
        line = server.stdout.readline().strip()
        if not line.startswith("agenttx ui: http://"):
            server.wait(timeout=30)
            log.seek(0)
            raise SystemExit(f"agenttx ui printed {line!r}, not its URL:\n{log.read()}")
        url = line.split(": ", 1)[1]
        origin, token = url.split("/?token=")
        inbox, graph = out / "ui-inbox.png", out / "ui-graph.png"
        with sync_playwright() as playwright:
            browser = playwright.chromium.launch(
                executable_path=shutil.which("chromium"), args=["--no-sandbox"]
            )
            page = browser.new_page(viewport=VIEWPORT)
            page.goto(f"{origin}/inbox?token={token}")
            expect(page.locator("#inbox .request .tool")).to_contain_text("payments.charge")
            expect(page.locator("#inbox .request pre.args")).to_contain_text("12500")
            page.set_viewport_size({"width": VIEWPORT["width"], "height": 700})
            page.screenshot(path=str(inbox))
            page.set_viewport_size(VIEWPORT)
            page.goto(f"{origin}/tx/{tx}?token={token}")
            expect(page.locator("#graph svg g.node.rewound").first).to_be_visible()
            expect(page.locator("#graph svg g.node.root-cause")).not_to_have_count(0)
            page.locator("#graph").scroll_into_view_if_needed()
            page.screenshot(path=str(graph))
            browser.close()
        return inbox, graph
    finally:
        if server.poll() is None:
            server.send_signal(signal.SIGTERM)
        server.communicate(timeout=30)


def _missing() -> str | None:
    try:
        import playwright.sync_api  # noqa: F401, PLC0415
    except ImportError:
        return "Playwright for Python is not installed (pip install 'agenttx[test-ui]')"
    if shutil.which("chromium") is None:
        return "no `chromium` on PATH (Debian: apt-get install chromium)"
    return None


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="into a temporary folder")
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "img", help="where to write")
    args = parser.parse_args()
    missing = _missing()
    if missing is not None:  # the table's header, no row: nothing was measured
        print(
            "benchmark  measured  target  ratio  result\n---------  --------  ------  -----  ------"
        )
        print(f"\nNot measured: {missing}.")
        return 1 if os.environ.get("AGENTTX_REQUIRE_CHROMIUM") == "1" else 0
    with tempfile.TemporaryDirectory(prefix="agenttx-ui-shots-") as scratch:
        folder = Path(scratch)
        tx = _demo(folder / "demo")
        db = folder / "demo" / "agenttx.db"
        out = folder if args.quick else args.out
        out.mkdir(parents=True, exist_ok=True)
        with SQLiteStore(db) as store:  # a charge waiting for a person while the pages are taken
            engine = agenttx.Engine(tools=[lookup_order, charge], store=store)
            waiting: Any = engine.begin(agent_id="billing")
            order = waiting.call("orders.lookup", {"order_id": "o-1"})
            assert order.ok, order.error
            asked = {"amount": "${steps.1.total}", "card": "${steps.1.card}", "order_id": "o-1"}
            assert waiting.call("payments.charge", asked).approval is not None
            pictures = _shoot(db, tx, out)
            waiting.rollback()
        rows = []
        for picture in pictures:
            size = picture.stat().st_size / 1024
            rows.append(
                Row(picture.name, f"{size:.0f} KB", f"<= {MAX_KB} KB", size / MAX_KB, str(picture))
            )
            if args.quick:
                picture.unlink()
        return report(rows, quick=args.quick)


if __name__ == "__main__":
    sys.exit(main())
