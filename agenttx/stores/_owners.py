"""Whether the owner of a transaction or plan run in a `SQLiteStore` file is alive: the
stores open in this process, and the process check on this host that recovery and
`SQLiteStore.orphaned_plans` share."""

from __future__ import annotations

import json
import os

__all__ = ["OPEN_HERE", "owner_alive", "owner_gone"]

#: The owners of the `SQLiteStore`s open in this process. A transaction owned by one of them
#: is alive, whatever `owner_alive` makes of its process id, so `claim` leaves it alone. It is
#: process-wide state by nature (which store instances this process has open), like the pid.
#: Each store adds itself when it opens and removes itself when it closes or is collected;
#: `set.add`, `discard` and `in` are atomic, so no lock, which a finalizer could deadlock on.
OPEN_HERE: set[str] = set()


def owner_alive(owner: str | None) -> bool:
    """Whether `owner` (a store's JSON owner record) names another live process on this host.

    The record has `pid` and `hostname`. A process on another host, or one that no longer
    exists, does not count; neither does this process (its own transactions are excluded by
    the caller, and `DurableStore.claim` refuses those of its stores still open). PIDs can be
    reused, so a transaction whose owner died may wait for a process that took its pid;
    recovery never takes over one whose owner is alive.
    """
    if owner is None:
        return False
    try:
        record = json.loads(owner)
        pid, host = record["pid"], record["hostname"]
    except (ValueError, KeyError, TypeError):
        return False
    import socket  # noqa: PLC0415  (only owner checks need it: not loaded by `import agenttx`)

    if host != socket.gethostname() or not isinstance(pid, int) or pid == os.getpid():
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # it exists, owned by another user
        return True
    return True


def owner_gone(owner: str | None) -> bool:
    """Whether a `SQLiteStore` run or transaction of `owner` has lost its owner: no store of
    this process holds it (`OPEN_HERE`) and no other live process on this host is `owner`."""
    return owner not in OPEN_HERE and not owner_alive(owner)
