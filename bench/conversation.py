"""What a durable runner spends writing its conversation, per model turn, as it grows.

Run from the repository root::

    python bench/conversation.py            # 9 conversations of 100 turns
    python bench/conversation.py --quick    # a smoke run: 1 conversation of 20 turns

An OpenAI chat `ToolRunner` on `SQLiteStore` (WAL, `synchronous=NORMAL`) drives one transaction
through 100 model turns, each an assistant message with one tool call (a no-op tool whose result
is about 300 bytes of JSON) answered by the runner. The runner writes its conversation with the
transaction twice a turn (when the turn arrives, before its call runs, and once it is answered);
the figure is the time spent in those writes (`Runner._save`: building the record and the
store's durable write) at turns 1, 10 and 100, the median over the conversations. Each
conversation is checked: restored from the store, it is the runner's.

Target: at most 0.5 ms a turn at every mark (a write holds only the turn's new messages, so
its cost does not grow with the conversation; a whole record each write cost about 4.6 ms at
the 100th turn on the same machine).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import agenttx
from _report import Row, report
from agenttx.integrations import _runs
from agenttx.integrations.openai import ToolRunner
from agenttx.stores import SQLiteStore

TARGET_MS = 0.5


@agenttx.tool(inline=True)
def lookup(order_id: str) -> dict[str, Any]:
    """Look an order up."""
    return {"order_id": order_id, "status": "shipped", "items": ["SKU-1"] * 8, "note": "x" * 120}


def conversation(root: Path, n: int, turns: int) -> list[float]:
    """The write time of each turn of one conversation, in seconds."""
    spent: list[float] = []
    kept = _runs.Runner._save  # noqa: SLF001

    def timed(self: Any) -> None:
        start = time.perf_counter()
        kept(self)
        spent[-1] += time.perf_counter() - start

    _runs.Runner._save = timed  # type: ignore[method-assign]  # noqa: SLF001
    try:
        with SQLiteStore(root / f"c{n}.db") as store:
            engine = agenttx.Engine(tools=[lookup], store=store)
            tx = engine.begin()
            runner = ToolRunner(tx)
            messages: list[Any] = [
                {"role": "system", "content": "You look orders up. " * 10},
                {"role": "user", "content": "Where are my orders?"},
            ]
            for turn in range(1, turns + 1):
                spent.append(0.0)
                reply = {
                    "role": "assistant",
                    "content": None,
                    "tool_calls": [
                        {
                            "id": f"call-{turn}",
                            "type": "function",
                            "function": {
                                "name": "lookup",
                                "arguments": f'{{"order_id": "o-{turn}"}}',
                            },
                        }
                    ],
                }
                messages = runner.handle(messages, reply)
            del runner
            restored = ToolRunner.restore(tx)
            if restored.messages != messages:
                raise SystemExit("the restored conversation is not the runner's")
            del restored
            tx.commit()
    finally:
        _runs.Runner._save = kept  # type: ignore[method-assign]  # noqa: SLF001
    return spent


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--runs", type=int, default=9)
    parser.add_argument("--quick", action="store_true")
    options = parser.parse_args()
    runs, turns = (1, 20) if options.quick else (options.runs, 100)
    with tempfile.TemporaryDirectory() as root:
        found = [conversation(Path(root), n, turns) for n in range(runs)]
    rows = []
    for mark in (1, 10, turns):
        median = statistics.median(spent[mark - 1] for spent in found) * 1e3
        rows.append(
            Row(
                name=f"conversation writes, turn {mark}",
                measured=f"{median:.3f} ms",
                target=f"<= {TARGET_MS} ms",
                ratio=median / TARGET_MS,
                detail=f"median of {runs} conversations of {turns} turns, two writes a turn",
            )
        )
    return report(rows, quick=options.quick)


if __name__ == "__main__":
    sys.exit(main())
