"""Static checks of the OpenAI and Anthropic integrations: mypy checks this file.

Nothing here runs; each `assert_type` fails type checking if a signature regresses, and an
unannotated mixed tools list must be accepted as it is.
"""

from __future__ import annotations

from typing import Any, Literal  # noqa: F401  (Literal: named in an assert_type string)

from typing_extensions import assert_type

import agenttx
from agenttx.integrations import anthropic as atx_anthropic
from agenttx.integrations import openai as atx_openai


@agenttx.compensation
def undo(payload: dict[str, Any]) -> None:
    del payload


@agenttx.tool(compensate=undo)
def act(n: int) -> int:
    return n


def plain(text: str) -> str:
    return text


mixed = [act, undo, plain]
assert_type(atx_openai.tools(mixed), "list[dict[str, Any]]")
assert_type(atx_openai.tools(mixed, api="responses"), "list[dict[str, Any]]")
assert_type(atx_anthropic.tools({"act": act}), "list[dict[str, Any]]")

tx = agenttx.Transaction(tools=mixed)
assert_type(atx_openai.tools(tx), "list[dict[str, Any]]")
runner = atx_openai.ToolRunner(tx, history="void")
assert_type(runner.tools, "list[dict[str, Any]]")
assert_type(runner.tx, agenttx.Transaction)
messages: list[dict[str, Any]] = [{"role": "user", "content": "hi"}]
assert_type(runner.handle(messages, {"role": "assistant"}), "list[dict[str, Any]]")
responses = atx_openai.ResponsesToolRunner(tx)
assert_type(responses.handle("hi", {"output": []}), "list[dict[str, Any]]")
claude = atx_anthropic.ToolRunner(tx, history="keep")
assert_type(claude.history, 'Literal["truncate", "void", "keep"]')
assert_type(claude.handle(messages, {"role": "assistant", "content": []}), "list[dict[str, Any]]")
