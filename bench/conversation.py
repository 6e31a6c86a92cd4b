"""What a durable runner spends writing its conversation, per model turn, as it grows.

Run from the repository root::

    python bench/conversation.py            # 5 conversations of 100 turns
    python bench/conversation.py --runs 1   # quicker

An OpenAI chat `ToolRunner` on `SQLiteStore` (WAL, `synchronous=NORMAL`) drives one transaction
through 100 model turns, each an assistant message with one tool call (a no-op tool whose result
is about 300 bytes of JSON) answered by the runner. The runner writes its conversation with the
transaction twice a turn (when the turn arrives, before its call runs, and once it is answered);
the figure is the time spent in those writes (`Runner._save`: building the record and the
store's durable write) at turns 1, 10 and 100, the median over the conversations.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import agenttx  # noqa: E402
from agenttx.integrations import _runs  # noqa: E402
from agenttx.integrations.openai import ToolRunner  # noqa: E402
from agenttx.stores import SQLiteStore  # noqa: E402

TURNS = 100
MARKS = (1, 10, 100)


@agenttx.tool(inline=True)
def lookup(order_id: str) -> dict[str, Any]:
    """Look an order up."""
    return {"order_id": order_id, "status": "shipped", "items": ["SKU-1"] * 8, "note": "x" * 120}


def conversation(root: Path, n: int) -> list[float]:
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
            for turn in range(1, TURNS + 1):
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
            tx.commit()
    finally:
        _runs.Runner._save = kept  # type: ignore[method-assign]  # noqa: SLF001
    return spent


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--runs", type=int, default=5)
    runs = parser.parse_args().runs
    with tempfile.TemporaryDirectory() as root:
        found = [conversation(Path(root), n) for n in range(runs)]
    for mark in MARKS:
        median = statistics.median(spent[mark - 1] for spent in found)
        print(f"turn {mark:>3}: {median * 1e3:.3f} ms of conversation writes")


if __name__ == "__main__":
    main()
