"""Static checks of the LangChain and MCP integrations: mypy checks this file.

Nothing here runs; each `assert_type` fails type checking if a signature regresses, and the
wrapped tools mix with agenttx tools in an unannotated list.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from langchain_core.tools import tool as lc_tool
from typing_extensions import assert_type

import agenttx
from agenttx.integrations.langchain import TransactionalToolNode, from_langchain, tool_schemas
from agenttx.integrations.mcp import tools_from_mcp

if TYPE_CHECKING:
    from mcp import ClientSession


@lc_tool
def search(query: str) -> str:
    """Search."""
    return query


@agenttx.compensation
def undo(payload: dict[str, Any]) -> None:
    del payload


@agenttx.tool(compensate=undo)
def act(n: int) -> int:
    return n


def langchain_checks() -> None:
    wrapped = from_langchain(search, name="web.search", compensate=undo)
    assert_type(wrapped, agenttx.Tool[Any, Any])
    tx = agenttx.Transaction(tools=[wrapped, act, undo])
    assert_type(tool_schemas(tx), list[dict[str, agenttx.JSONValue]])
    node = TransactionalToolNode(tx, history="void")
    assert_type(node.tools, list[dict[str, agenttx.JSONValue]])
    TransactionalToolNode(tx, history="keep", name="act")


async def mcp_checks(session: ClientSession) -> None:
    tools = await tools_from_mcp(session, compensations={"charge": "refund", "ship": undo})
    assert_type(tools, list[agenttx.Tool[Any, Any]])
    agenttx.Transaction(tools=[*tools, act])
