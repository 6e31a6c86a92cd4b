"""The outside world of an episode: an AgentDojo environment behind a fake service, on files.

The environment (bank account, Slack workspace, inbox, ...) lives in a JSON file, as a remote
service's state would, so that it survives the agent's process being killed. Every tool call of
every loop goes through `Service.call`, which applies the episode's fault, runs the AgentDojo
function on the environment, writes it back and appends what happened to a ledger (JSON lines):
the ledger is the service's own log, from which the damage is counted (`_metrics.py`).
"""

from __future__ import annotations

import json
import os
import signal
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from pydantic import TypeAdapter

if TYPE_CHECKING:
    from pathlib import Path

# The tools whose effect cannot be taken back once delivered: money leaves, a message is read.
# AgentDojo's calendar tools that create, reschedule or cancel an event e-mail its participants
# (`inbox.send_email`), so they are messages too.
_INVITATIONS = frozenset(
    {"create_calendar_event", "reschedule_calendar_event", "cancel_calendar_event"}
)
IRREVERSIBLE: dict[str, frozenset[str]] = {
    "banking": frozenset({"send_money", "schedule_transaction"}),
    "slack": frozenset({"send_direct_message", "send_channel_message", "post_webpage"}),
    "travel": frozenset(
        {"send_email", "reserve_hotel", "reserve_car_rental", "reserve_restaurant"} | _INVITATIONS
    ),
    "workspace": frozenset({"send_email", "share_file"} | _INVITATIONS),
}
# The only tools whose service deduplicates a request on the caller's idempotency key, as
# payment APIs do; e-mail (SMTP), chat messages, web posts and bookings do not.
DEDUPLICATED: frozenset[str] = frozenset({"send_money", "schedule_transaction"})
# The tools that move money: approvals are asked for these in the injection arm.
MONEY: frozenset[str] = frozenset(
    {"send_money", "schedule_transaction", "update_scheduled_transaction"}
)

FAULTS = (
    "none",
    "crash_after_effect",
    "crash_after_record",
    "timeout",
    "transient",
    "permanent",
    "noop",
    "injection",
)


class Unavailable(ConnectionError):
    """A 503 (or 429) answered before the request did anything."""


class Refused(RuntimeError):
    """The service refuses the call for good (an account locked mid-task)."""


@dataclass(frozen=True)
class Fault:
    """One fault of the schedule: its kind and the index of the logical call it hits."""

    kind: str
    call: int  # -1: none


def _read_json(path: Path) -> Any:
    return json.loads(path.read_text())


def _write_json(path: Path, value: Any) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(value, sort_keys=True))
    tmp.replace(path)


class Service:
    """The suite's tools as a remote service over the environment file of one episode."""

    def __init__(self, suite: Any, directory: Path, fault: Fault) -> None:
        self.suite = suite
        self.directory = directory
        self.fault = fault
        self.world = directory / "world.json"
        self.ledger = directory / "ledger.jsonl"
        self.fired = directory / "fired"
        from agentdojo.functions_runtime import FunctionsRuntime  # noqa: PLC0415

        self.runtime = FunctionsRuntime(suite.tools)
        self.irreversible = IRREVERSIBLE[suite.name]

    # ---------------------------------------------------------------- state
    def reset(self, env: Any) -> None:
        _write_json(self.world, env.model_dump(mode="json"))
        self.ledger.write_text("")
        self.fired.unlink(missing_ok=True)
        (self.directory / "turns").unlink(missing_ok=True)

    def load(self) -> Any:
        return revive(self.suite.environment_type, _read_json(self.world))

    def log(self, **entry: Any) -> None:
        with self.ledger.open("a") as ledger:
            ledger.write(json.dumps(entry, sort_keys=True) + "\n")
            ledger.flush()
            os.fsync(ledger.fileno())

    def entries(self) -> list[dict[str, Any]]:
        return [json.loads(line) for line in self.ledger.read_text().splitlines() if line]

    def _fire(self, kind: str, call: int) -> bool:
        """Whether the fault `kind` hits logical call `call` now (each fires once per episode)."""
        if self.fault.kind != kind or self.fault.call != call or self.fired.exists():
            return False
        self.fired.write_text(kind)
        return True

    # ---------------------------------------------------------------- the service
    def call(self, name: str, args: dict[str, Any], call: int, key: str | None = None) -> Any:
        """Run tool `name` for logical call `call`; `key` is the caller's idempotency key."""
        self.log(event="request", call=call, tool=name, key=key)
        if key is not None and name in DEDUPLICATED:
            done = [
                e
                for e in self.entries()
                if e["event"] == "effect" and e.get("key") == key and e["call"] == call
            ]
            if done:  # a payment API deduplicates on the key
                self.log(event="deduplicated", call=call, tool=name, key=key)
                return done[-1]["result"]
        if self.fault.kind == "permanent" and self.fault.call == call:
            self.log(event="refused", call=call, tool=name, key=key)  # key: at delivery
            raise Refused("403 Forbidden: the account is locked")
        if self._fire("transient", call):
            self.log(event="unavailable", call=call, tool=name)
            raise Unavailable("503 Service Unavailable")
        if self._fire("noop", call):
            self.log(event="noop", call=call, tool=name)
            return None
        env = self.load()
        before = env.model_dump(mode="json")
        result, error = self.runtime.run_function(env, name, args)
        after = env.model_dump(mode="json")
        if after != before:
            _write_json(self.world, after)
            self.log(
                event="effect",
                call=call,
                tool=name,
                key=key,
                irreversible=name in self.irreversible,
                before=before,
                result=_jsonable(result),
            )
        if self._fire("crash_after_effect", call):
            os.kill(os.getpid(), signal.SIGKILL)
        if self._fire("timeout", call):
            self.log(event="timeout", call=call, tool=name, key=key)
            raise TimeoutError("read timed out (the request was sent)")
        if error is not None:
            raise RuntimeError(error)
        return _jsonable(result)

    def validate(self, name: str, args: dict[str, Any], call: int) -> None:
        """The provider's check before a staged call (a payment's authorization, a message's
        validation): raises what the call would raise now, changes nothing. A locked account
        (the `permanent` fault) is refused here too."""
        self.log(event="validate", call=call, tool=name)
        if self.fault.kind == "permanent" and self.fault.call == call:
            self.log(event="refused", call=call, tool=name)
            raise Refused("403 Forbidden: the account is locked")
        _, error = self.runtime.run_function(self.load(), name, args)  # never written back
        if error is not None:
            raise RuntimeError(error)

    def boundary(self, call: int) -> None:
        """Called by a loop once call `call` is recorded, before the next call starts."""
        if self._fire("crash_after_record", call):
            os.kill(os.getpid(), signal.SIGKILL)

    def turn(self) -> None:
        """Count one model turn (an agent decision); the count survives the process."""
        turns = self.directory / "turns"
        turns.write_text(str(int(turns.read_text()) + 1 if turns.exists() else 1))

    def turns(self) -> int:
        turns = self.directory / "turns"
        return int(turns.read_text()) if turns.exists() else 0

    def restore(self, call: int, before: Any) -> None:
        """Undo logical call `call`: put back the environment as it was before its effect."""
        _write_json(self.world, before)
        self.log(event="undo", call=call)

    def status(self, call: int, key: str) -> Any:
        """The status check: the result of call `call` made with `key`, or None if not done."""
        self.log(event="checked", call=call, key=key)
        done = [e for e in self.entries() if e["event"] == "effect" and e.get("key") == key]
        return done[-1]["result"] if done else None


def revive(environment_type: Any, data: dict[str, Any]) -> Any:
    """An environment from its JSON dump, with every write in it.

    AgentDojo's `Calendar`, `Inbox` and `CloudDrive` rebuild `events` / `emails` / `files` from
    `initial_events` / ... when validated, which would drop whatever the calls wrote there; so
    each such field is put back from the dump after validation (`initial_*` keep the start)."""
    env = environment_type.model_validate(data)
    _put_back(env, data)
    return env


def _put_back(model: Any, data: Any) -> None:
    fields = getattr(type(model), "model_fields", None)
    if fields is None or not isinstance(data, dict):
        return
    for name in fields:
        if name.startswith("initial_") and name[8:] in fields and name[8:] in data:
            target = name[8:]
            value = TypeAdapter(fields[target].annotation).validate_python(data[target])
            setattr(model, target, value)
        elif name in data:
            _put_back(getattr(model, name), data[name])


def _jsonable(value: Any) -> Any:
    """An AgentDojo result (pydantic models, lists of them) as JSON."""
    dump = getattr(value, "model_dump", None)
    if dump is not None:
        return dump(mode="json")
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if value is None or isinstance(value, (str, int, float, bool)):
        return value
    return str(value)
