"""The tools of a Model Context Protocol (MCP) client session as agenttx tools.

`tools = await tools_from_mcp(session)` lists the session's tools and gives one agenttx tool
for each: its spec is the MCP tool's own (`inputSchema` as the parameters, its description),
and each call is one step that runs `session.call_tool(name, arguments)`. A result with
`isError` fails the step: its text goes to the hint cleaner, like a `ToolError`'s, without the
SDK's `Error executing tool NAME: ` prefix, and when it quotes the value of one of the call's
arguments, that argument is the offending input the root-cause search follows (`_failure`).
The SDK withholds the text of any other exception than its own `ToolError` a server's tool
raises; `share_errors` on the server side lets it through. What a successful call returns
is the step's output (the rule is in `_output`, and in docs/integrations.md). Compensations
are declared per tool by name: `compensations={"charge": "refund"}` undoes a `charge` step
with the server's `refund` tool.

MCP calls are asynchronous and belong to the event loop that runs the session: send the
steps with `await tx.acall(...)` / `await tx.acall_turn(...)` (or `aexecute_step`) from that
loop. A synchronous `tx.call` made from another thread also works while the session's loop
runs (each call hops to it); one made on the loop's own thread would block the loop the
session needs, and the step would time out. See docs/integrations.md.

Needs the `agenttx[mcp]` extra; `import agenttx` never imports this module or the SDK.
"""

from __future__ import annotations

import functools
import inspect
import json
import re
import threading
import traceback
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Final, ParamSpec, TypeVar, cast, overload

try:
    import mcp as _mcp_sdk  # noqa: F401  (fails early, naming the extra to install)
except ImportError as exc:
    raise ImportError(
        "agenttx.integrations.mcp needs the MCP SDK: pip install 'agenttx[mcp]'"
    ) from exc

from .._errors import InvalidArgument, ToolError
from .._tools import Compensation, Tool, compensation, tool

if TYPE_CHECKING:
    import asyncio
    from collections.abc import Awaitable, Callable, Coroutine

    from mcp.types import CallToolResult
    from mcp.types import Tool as MCPTool

    from .._json import JSONValue

__all__ = ["share_errors", "tools_from_mcp"]

#: Seconds a call made from another event loop waits for the session's loop to start it.
LOOP_START_WAIT: Final = 5.0

#: Pages of `tools/list` read at most: a server whose cursor never ends cannot hang the call.
MAX_PAGES: Final = 100

#: The shortest argument value an error text may name to make that argument the offending one.
MIN_NAMED_VALUE: Final = 3

P = ParamSpec("P")
R = TypeVar("R")


async def tools_from_mcp(
    session: object,
    *,
    compensations: Mapping[str, str | Compensation[Any, Any]] | None = None,
    needs_approval: Mapping[str, bool | Callable[[Any], bool]] | None = None,
) -> list[Tool[Any, Any]]:
    """The session's tools as agenttx tools, in the order the server lists them.

    `session` is an `mcp.ClientSession` or an `mcp.Client` (anything with the SDK's async
    `list_tools` and `call_tool`), already connected. Each tool is registered under its MCP
    name (its wire name maps characters providers refuse, such as `.`, to `_`), with the MCP
    tool's description and `inputSchema` (which may hold `$ref`/`$defs`) as its spec.

    `compensations` maps a tool's name to its undo: the name of another MCP tool of the
    session, called with the properties its input schema names, taken from the undone
    call's output when that is a JSON object and otherwise from its arguments; or an agenttx
    `Compensation`, called with `{"arguments": ..., "output": ...}` like any `compensate=`.

    `needs_approval` maps a tool's name to `needs_approval=` of `agenttx.tool` (True, or a
    callable of the arguments): MCP has no approval of its own on the client side, so a call
    of such a tool waits for a person in the transaction (`NEEDS_APPROVAL`), and the agent
    loop's runner (`runner.waiting`, `wait`, `aresume`) closes the loop once it is decided.

    Raises `InvalidArgument` for a session without the SDK's methods, a compensation or an
    approval setting for a tool the session does not list, or an undo that is neither a
    listed tool nor a `Compensation`. The server's own errors while listing propagate.
    """
    list_tools = getattr(session, "list_tools", None)
    call_tool = getattr(session, "call_tool", None)
    if not (callable(list_tools) and callable(call_tool)):
        raise InvalidArgument(
            f"tools_from_mcp: {type(session).__name__} is not an MCP client session "
            "(pass an mcp.ClientSession or mcp.Client, connected)"
        )
    undo = _check_compensations(compensations)
    listed = await _list_all(session)
    by_name = {item.name: item for item in listed}
    for name, action in undo.items():
        if name not in by_name:
            raise InvalidArgument(
                f"tools_from_mcp: compensations names tool {name!r}, which the session does "
                f"not list (listed: {', '.join(by_name) or 'none'})"
            )
        if isinstance(action, str) and action not in by_name:
            raise InvalidArgument(
                f"tools_from_mcp: the compensation of {name!r} is {action!r}, which is neither "
                "a tool the session lists nor an agenttx Compensation"
            )
    if needs_approval is not None and not isinstance(needs_approval, Mapping):
        raise InvalidArgument(
            "tools_from_mcp: needs_approval must map tool names to True/False or a callable "
            f"of the arguments, got {type(needs_approval).__name__}"
        )
    approvals = dict(needs_approval or {})
    unknown = sorted(set(approvals) - set(by_name))
    if unknown:
        raise InvalidArgument(
            f"tools_from_mcp: needs_approval names tool {unknown[0]!r}, which the session "
            f"does not list (listed: {', '.join(by_name) or 'none'})"
        )
    runner = _Runner(session)
    made: dict[str, Compensation[Any, Any]] = {}
    tools: list[Tool[Any, Any]] = []
    for item in listed:
        declared = undo.get(item.name)
        if isinstance(declared, str):
            if declared not in made:
                made[declared] = _mcp_compensation(runner, by_name[declared])
            declared = made[declared]
        tools.append(_mcp_tool(runner, item, declared, approvals.get(item.name, False)))
    return tools


def _check_compensations(
    compensations: object,
) -> dict[str, str | Compensation[Any, Any]]:
    if compensations is None:
        return {}
    if not isinstance(compensations, Mapping):
        raise InvalidArgument(
            "tools_from_mcp: compensations must map tool names to an undo, "
            f"got {type(compensations).__name__}"
        )
    checked: dict[str, str | Compensation[Any, Any]] = {}
    for name, action in compensations.items():
        if not isinstance(name, str):
            raise InvalidArgument(f"tools_from_mcp: compensations key {name!r} is not a name")
        if not isinstance(action, (str, Compensation)):
            raise InvalidArgument(
                f"tools_from_mcp: the compensation of {name!r} must be an MCP tool's name or an "
                f"agenttx Compensation, got {action!r}"
            )
        checked[name] = action
    return checked


async def _list_all(session: Any) -> list[MCPTool]:
    """Every tool the session lists, following the cursor (at most `MAX_PAGES` pages)."""
    from mcp import Client  # noqa: PLC0415
    from mcp.types import PaginatedRequestParams  # noqa: PLC0415

    listed: list[MCPTool] = []
    cursor: str | None = None
    for _ in range(MAX_PAGES):
        if isinstance(session, Client):
            page = await session.list_tools(cursor=cursor)
        elif cursor is None:
            page = await session.list_tools()
        else:
            page = await session.list_tools(params=PaginatedRequestParams(cursor=cursor))
        listed.extend(page.tools)
        cursor = page.next_cursor
        if cursor is None:
            return listed
    raise InvalidArgument(f"tools_from_mcp: the server listed more than {MAX_PAGES} pages")


class _Runner:
    """Runs a coroutine of the session on the session's event loop, from any loop."""

    __slots__ = ("loop", "session")

    def __init__(self, session: Any) -> None:
        import asyncio  # noqa: PLC0415

        self.session = session
        self.loop: asyncio.AbstractEventLoop = asyncio.get_running_loop()

    async def call(self, name: str, arguments: dict[str, Any]) -> CallToolResult:
        """`session.call_tool(name, arguments)`, on the session's loop."""
        import asyncio  # noqa: PLC0415

        if asyncio.get_running_loop() is self.loop:
            return await self._call(name, arguments)
        # A synchronous step runs an async tool on a loop of its own: hop to the session's.
        if self.loop.is_closed() or not self.loop.is_running():
            raise ToolError(
                f"MCP tool {name!r} was called after its session's event loop stopped: "
                "call MCP tools with `await tx.acall(...)` while the session is open"
            )
        hop = _Hop()
        future = asyncio.run_coroutine_threadsafe(hop.run(self._call(name, arguments)), self.loop)
        if not await asyncio.to_thread(hop.wait_started):
            raise ToolError(
                f"MCP tool {name!r} was not sent: its session's event loop did not pick the call "
                f"up within {LOOP_START_WAIT} s; a synchronous tx.call on the thread that runs "
                "the session blocks it (use `await tx.acall(...)` there)"
            )
        result = await asyncio.wrap_future(future)
        if result is None:  # pragma: no cover  (only an abandoned call returns None)
            raise ToolError(f"MCP tool {name!r} was not sent")
        return result

    async def _call(self, name: str, arguments: dict[str, Any]) -> CallToolResult:
        result: CallToolResult = await self.session.call_tool(name, arguments)
        return result


class _Hop:
    """A call handed to the session's loop that either starts there, or is abandoned unsent.

    The caller waits `LOOP_START_WAIT` seconds for the loop to start it; if the loop has not
    (it is blocked, perhaps by the very thread waiting for it), the caller abandons it, and
    the loop, when it gets to it, drops it without calling the server: an abandoned call
    never lands late.
    """

    __slots__ = ("_lock", "abandoned", "started")

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.started = threading.Event()
        self.abandoned = False

    async def run(self, call: Coroutine[Any, Any, CallToolResult]) -> CallToolResult | None:
        with self._lock:
            if self.abandoned:
                call.close()
                return None
            self.started.set()
        return await call

    def wait_started(self) -> bool:
        """Wait for the loop to start the call; False (and abandoned) if it has not."""
        if self.started.wait(LOOP_START_WAIT):
            return True
        with self._lock:
            if self.started.is_set():
                return True
            self.abandoned = True
            return False


def _mcp_tool(
    runner: _Runner,
    item: MCPTool,
    undo: Compensation[Any, Any] | None,
    approval: bool | Callable[[Any], bool],
) -> Tool[Any, Any]:
    name = item.name

    async def call_mcp_tool(**arguments: Any) -> JSONValue:
        result = await runner.call(name, arguments)
        if result.is_error:
            raise _failure(name, result, arguments)
        return _output(result)

    call_mcp_tool.__name__ = call_mcp_tool.__qualname__ = _identifier(name)
    decorate: Callable[[Callable[..., Any]], Tool[Any, Any]] = tool(
        name=name,
        description=item.description or item.title or "",
        parameters=dict(item.input_schema),
        compensate=undo,
        needs_approval=approval,
    )
    return decorate(call_mcp_tool)


def _mcp_compensation(runner: _Runner, item: MCPTool) -> Compensation[Any, Any]:
    """An agenttx compensation that calls the MCP tool `item` with what the undone call gave."""
    name = item.name
    schema = item.input_schema
    properties = schema.get("properties")
    wanted = list(properties) if isinstance(properties, Mapping) else []

    async def call_mcp_undo(payload: JSONValue) -> JSONValue:
        arguments = _undo_arguments(wanted, payload)
        result = await runner.call(name, arguments)
        if result.is_error:
            raise _failure(name, result, arguments)
        return _output(result)

    call_mcp_undo.__name__ = call_mcp_undo.__qualname__ = _identifier(name)
    return compensation(name=name)(call_mcp_undo)


def _undo_arguments(wanted: list[str], payload: JSONValue) -> dict[str, Any]:
    """The undo tool's arguments: each property it names, from the output, else the arguments."""
    output: JSONValue = None
    arguments: JSONValue = None
    if isinstance(payload, dict):
        output, arguments = payload.get("output"), payload.get("arguments")
    found: dict[str, Any] = {}
    for key in wanted:
        if isinstance(output, dict) and key in output:
            found[key] = output[key]
        elif isinstance(arguments, dict) and key in arguments:
            found[key] = arguments[key]
    return found


def _output(result: CallToolResult) -> JSONValue:
    """A successful call's output: its structured content if any, else its content blocks.

    A text block whose text is a JSON object or array is that value (servers send structured
    results as JSON text); other text stays a string; any other block (image, audio,
    resource) is its JSON form. One block is the output itself, several are a list, none is
    null.
    """
    if result.structured_content is not None:
        structured: JSONValue = result.structured_content
        return structured
    values = [_block(block) for block in result.content]
    if not values:
        return None
    return values[0] if len(values) == 1 else values


def _block(block: Any) -> JSONValue:
    text = getattr(block, "text", None)
    if getattr(block, "type", None) == "text" and isinstance(text, str):
        if text.lstrip()[:1] in {"{", "["}:
            try:
                parsed: JSONValue = json.loads(text)
            except ValueError:
                return text
            return parsed
        return text
    dumped: JSONValue = block.model_dump(mode="json", by_alias=True, exclude_none=True)
    return dumped


def _text(result: CallToolResult) -> str:
    """The text of a failed call: its text blocks, one per line (other blocks by their type)."""
    parts = []
    for block in result.content:
        text = getattr(block, "text", None)
        parts.append(text if isinstance(text, str) else f"[{getattr(block, 'type', 'content')}]")
    return "\n".join(parts).strip()


def _failure(name: str, result: CallToolResult, arguments: Mapping[str, Any]) -> ToolError:
    """The `ToolError` of a failed call: the server's own text and, if it names one, the
    offending argument.

    The SDK's `Error executing tool NAME: ` prefix is taken off, so that the hint cleaner reads
    the server's message. A result that is only `Error executing tool NAME` is an exception the
    SDK withheld (anything but its `ToolError`): the text says so and how to share it. The
    argument whose string value the text quotes (as a whole word, the only one) is the key the
    root-cause search follows to the step that produced the value.
    """
    text = _text(result)
    prefix = f"Error executing tool {name}"
    if text == prefix:
        return ToolError(
            f"MCP tool {name!r} failed; its server withheld the error (the MCP SDK shows only "
            "the text of its own ToolError: raise that in the tool, or wrap the tool with "
            "agenttx.integrations.mcp.share_errors)"
        )
    if text.startswith(prefix + ": "):
        text = text[len(prefix) + 2 :].strip()
    if not text:
        return ToolError(f"MCP tool {name!r} failed without a message")
    return ToolError(text, key=_named_argument(text, arguments))


def _named_argument(text: str, arguments: Mapping[str, Any]) -> str | None:
    """The one argument whose string value `text` quotes as a whole word, if exactly one does."""
    named = {
        key
        for key, value in arguments.items()
        if isinstance(value, str)
        and len(value) >= MIN_NAMED_VALUE
        and re.search(rf"(?<![\w-]){re.escape(value)}(?![\w-])", text) is not None
    }
    return named.pop() if len(named) == 1 else None


@overload
def share_errors(fn: Callable[P, Awaitable[R]]) -> Callable[P, Awaitable[R]]: ...
@overload
def share_errors(fn: Callable[P, R]) -> Callable[P, R]: ...
def share_errors(fn: Callable[P, Any]) -> Callable[P, Any]:
    """For an MCP server's tool: its exceptions reach the client with their text.

    The MCP SDK (2.x) answers any exception of a tool but its own `ToolError` with only
    `Error executing tool NAME`, so the client (and agenttx's root-cause search) never learns
    what went wrong. Under `@server.tool()`, `@share_errors` re-raises every other exception
    as the SDK's `ToolError`, with the text Python gives it (`ValueError: customer c-404 not
    found`); the SDK's own errors pass unchanged. Sync and `async def` tools keep their
    signature. Use it only where the exceptions' text may be shown to the client and its model.
    """
    from mcp.server.mcpserver.exceptions import ToolError as MCPToolError  # noqa: PLC0415
    from mcp.shared.exceptions import MCPError  # noqa: PLC0415

    kept = (MCPToolError, MCPError)

    def shared(exc: Exception) -> MCPToolError:
        return MCPToolError("".join(traceback.format_exception_only(exc)).strip())

    if inspect.iscoroutinefunction(fn):
        call = cast("Callable[P, Awaitable[Any]]", fn)

        @functools.wraps(fn)
        async def ashared(*args: P.args, **kwargs: P.kwargs) -> Any:
            try:
                return await call(*args, **kwargs)
            except kept:
                raise
            except Exception as exc:
                raise shared(exc) from exc

        return ashared

    @functools.wraps(fn)
    def sshared(*args: P.args, **kwargs: P.kwargs) -> Any:
        try:
            return fn(*args, **kwargs)
        except kept:
            raise
        except Exception as exc:
            raise shared(exc) from exc

    return sshared


def _identifier(name: str) -> str:
    """A Python identifier for the wrapper function (names in tracebacks and reprs)."""
    cleaned = "".join(ch if ch.isalnum() or ch == "_" else "_" for ch in name)
    return f"mcp_{cleaned}"
