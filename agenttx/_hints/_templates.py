"""How each Clean Hint rule (`_rules`) renders its captures into a hint's text: the helpers
that read the captured groups, and one template function per rule that needs more than a
fixed text. A hint stays within `_clean.MAX_HINT_CHARS` (240) characters."""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Final, TypeAlias

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping


Groups: TypeAlias = "Mapping[str, str | None]"


def _pick(groups: Groups, names: tuple[str, ...]) -> str | None:
    """The first of the named captures that is non-empty once trimmed, trimmed; else None."""
    for name in names:
        value = groups.get(name)
        if value:
            value = value.strip()
            if value:
                return value
    return None


def _get(groups: Groups, *names: str) -> str:
    """`_pick`, or the literal `unknown` when every named capture is empty or did not take part."""
    value = _pick(groups, names)
    return "unknown" if value is None else value


def _first_column(key: str) -> str:
    """The first column of a possibly composite key: `(tenant_id, user_id)` gives `tenant_id`."""
    return key.strip("()").split(",", 1)[0].strip().strip("\"`'")


def _singular(table: str) -> str:
    """Naive English singular of a table name, schema dropped: `public.companies` -> `company`."""
    name = table.rsplit(".", 1)[-1]
    if name.endswith("ies"):
        return name[:-3] + "y"
    if name.endswith(("sses", "xes", "ches")):
        return name[:-2]
    if name.endswith("s") and not name.endswith("ss"):
        return name[:-1]
    return name  # `status` -> `statu` above: naive on purpose (`docs/protocol.md#the-cleaner`)


def _foreign_key(g: Groups) -> str:
    return (
        f"Hint: Foreign key constraint failed for '{_first_column(_get(g, 'key'))}'. "
        f"Ensure target {_singular(_get(g, 'table'))} exists before step execution."
    )


#: A `type_mismatch` {found} that names its field: `"two" for field quantity` (also quoted).
#: Linear as searched: the literal starts each try, and the name is anchored at the end.
_FOUND_FIELD: Final = re.compile(
    r" for field [`'\"]?(?P<field>[A-Za-z_][\w.\[\]-]{0,127}?)[`'\"]?\Z"
)


def _field_of_found(g: Groups) -> str | None:
    """The field a `type_mismatch` message names after its value, if it names one."""
    found = g.get("found")
    match = None if found is None else _FOUND_FIELD.search(found.rstrip())
    return None if match is None else match.group("field")


def _java_npe(g: Groups) -> str:
    key = _pick(g, ("key", "key2"))
    if key is None:
        return "Hint: Null reference encountered. Validate that all required inputs are non-null."
    return (
        f"Hint: '{key}' is null when calling {_get(g, 'method', 'method2')}. "
        f"Initialize '{key}' before this step."
    )


def _file_not_found(g: Groups) -> str:
    path = _pick(g, ("path", "path2", "path3"))
    if path is None:
        return "Hint: File does not exist. Create it in an earlier step or correct the path."
    return f"Hint: File '{path}' does not exist. Create it in an earlier step or correct the path."


def _permission_denied(g: Groups) -> str:
    path = _pick(g, ("path", "path2"))
    if path is None:
        return "Hint: Permission denied. Use a resource the agent is allowed to modify."
    return f"Hint: Permission denied for '{path}'. Use a path inside the writable sandbox."


def _unknown_field(g: Groups) -> str:
    expected = _pick(g, ("expected",))
    if expected is None:
        return (
            f"Hint: Unknown argument '{_get(g, 'key')}'. Remove it: this tool takes no arguments."
        )
    return f"Hint: Unknown argument '{_get(g, 'key')}'. Remove it; expected {expected}."


#: The longest call id a hint quotes whole: a longer one would push what to do past 240 characters.
_MAX_QUOTED_CALL_ID: Final = 64


def _duplicate_call_id(g: Groups) -> str:
    call_id = _get(g, "call_id")
    if len(call_id) > _MAX_QUOTED_CALL_ID:
        call_id = call_id[: _MAX_QUOTED_CALL_ID - 3] + "..."
    return (
        f"Hint: Call id '{call_id}' was already used by step {_get(g, 'step')}, which still "
        "stands. Send the call again with a call id of its own."
    )


#: `_clean.MAX_HINT_CHARS` (that module imports this one), which a hint must not exceed.
_HINT_CHARS: Final = 240
#: The longest tool or type name an `output_mismatch` hint quotes whole.
_MAX_QUOTED_NAME: Final = 32
_OUTPUT_MISMATCH_ADVICE: Final = (
    "The tool is at fault, not its arguments: do not repeat the call unchanged."
)


def _cut(text: str, limit: int) -> str:
    """`text`, or its first `limit - 3` characters and `...` if it is longer than `limit`."""
    return text if len(text) <= limit else text[: max(limit - 3, 0)] + "..."


def _output_mismatch(g: Groups) -> str:
    # The names are shortened, then what is wrong, so that the advice is never cut off.
    tool = _cut(_get(g, "tool"), _MAX_QUOTED_NAME)
    type_name = _cut(_get(g, "type"), _MAX_QUOTED_NAME)
    if g.get("field") is None:
        why = f"expected an object, got {_get(g, 'got')}"
    elif g.get("why") is None:
        why = f"field '{_get(g, 'field')}' is missing"
    else:
        why = f"field '{_get(g, 'field')}': {_get(g, 'why')}"
    head = f"Hint: Output of tool '{tool}' does not match its return type {type_name}: "
    room = _HINT_CHARS - len(head) - len(_OUTPUT_MISMATCH_ADVICE) - len(". ")
    return f"{head}{_cut(why, room)}. {_OUTPUT_MISMATCH_ADVICE}"


def _fixed(text: str) -> Callable[[Groups], str]:
    return lambda _g: text
