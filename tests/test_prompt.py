"""The system prompt: `PROMPT` teaches the step protocol, `prompt(tools)` lists the tools."""

from __future__ import annotations

import re

import pytest

import agenttx
from agenttx import builtins
from agenttx._prompt import PLANS_PROMPT


@agenttx.tool(name="payments.charge")
def charge(amount: int, card: str) -> dict:
    """Charge a card.

    Args:
        amount: in pence.
        card: the card token.
    """
    return {"charge_id": "ch-1"}


@agenttx.compensation(name="payments.refund")
def refund(payload: dict) -> None:
    """Refund a charge."""


def lookup(email: str) -> dict:
    return {"customer_id": "c-1"}


def test_the_static_prompt_teaches_numbering_references_rollbacks_and_resending():
    """PROMPT covers what a model must know: next_step, ${steps.N.path}, voided steps, resend."""
    text = agenttx.PROMPT
    assert "numbered step" in text
    assert '"next_step"' in text
    assert "${steps.N.path}" in text
    assert "not by copying" in text
    assert "roll back" in text
    assert "voided" in text
    assert "send the same step again" in text
    assert "not run" in text


def test_every_reference_in_the_prompt_follows_the_grammar():
    """The examples in PROMPT are references the resolver accepts."""
    examples = re.findall(r"\$\{steps\.[^}]*\}", agenttx.PROMPT)
    assert len(examples) >= 3
    for example in examples[1:]:  # the first is the ${steps.N.path} template
        assert re.fullmatch(r"\$\{steps\.([0-9]+)((?:\.[A-Za-z0-9_\-]+)*)\}", example), example


def test_prompt_lists_each_tool_by_wire_name_and_summary():
    """Each tool: its provider-safe name and its docstring's first line; not compensations."""
    text = agenttx.prompt([charge, refund, lookup])
    assert text.startswith(agenttx.PROMPT)
    tools = text.split("Tools:\n", 1)[1].splitlines()
    assert tools == ["- payments_charge: Charge a card.", "- lookup"]


def test_prompt_accepts_a_transaction_an_engine_and_a_mapping():
    """The same tool lines from a Transaction, an Engine, a list, or {name: callable}."""
    expected = agenttx.prompt([charge, refund, lookup])
    assert agenttx.prompt(agenttx.Transaction(tools=[charge, refund, lookup])) == expected
    assert agenttx.prompt(agenttx.Engine(tools=[charge, refund, lookup])) == expected
    mapped = agenttx.prompt({"find": lookup})
    assert mapped.endswith("Tools:\n- find\n")


def test_prompt_without_tools_is_the_static_part():
    """No tools: just PROMPT."""
    assert agenttx.prompt([]) == agenttx.PROMPT
    assert agenttx.prompt(agenttx.Transaction()) == agenttx.PROMPT


def test_the_builtin_tools_get_names_a_provider_accepts():
    """Every built-in's listed name matches ^[a-zA-Z0-9_-]{1,64}$ (kv.put is listed as kv_put)."""
    text = agenttx.prompt(builtins.tools("."))
    names = [line[2:].split(":", 1)[0] for line in text.split("Tools:\n", 1)[1].splitlines()]
    assert "kv_put" in names
    assert all(re.fullmatch(r"[a-zA-Z0-9_-]{1,64}", name) for name in names)


@pytest.mark.parametrize("bad", [None, 3, "kv.put", b"tools", [3]])
def test_prompt_refuses_what_is_not_tools(bad):
    """Anything but tools, a transaction or an engine raises InvalidArgument."""
    with pytest.raises(agenttx.InvalidArgument):
        agenttx.prompt(bad)


def test_prompt_with_plans_teaches_the_plan_format_with_an_example():
    """`prompt(tools, plans=True)` adds the plan format (references between nodes, after,
    retries, what happens to a plan with problems) and an example that is a valid plan."""
    text = agenttx.prompt([charge], plans=True)
    assert text.startswith(agenttx.PROMPT)
    assert text.endswith("Tools:\n- payments_charge: Charge a card.\n")
    for phrase in ("propose_plan", '"nodes"', "${lookup.customer_id}", '"after"', "did you mean"):
        assert phrase in text
    example = text[text.index('\n{"nodes"') : text.index("]}\n") + 2]

    @agenttx.tool
    def lookup_customer(email: str) -> dict: ...

    @agenttx.tool
    def send_email(to: str, text: str) -> dict: ...

    @agenttx.tool(name="charge")
    def charge_(customer_id: str, amount: int) -> dict: ...

    plan = agenttx.Plan.from_json(example)
    assert plan.validate([lookup_customer, charge_, send_email]) == ()


def test_prompt_without_plans_is_unchanged():
    """`prompt(tools)` and `prompt(tools, plans=False)` say nothing of plans; `plans` must be a
    bool."""
    assert agenttx.prompt([charge]) == agenttx.prompt([charge], plans=False)
    assert "propose_plan" not in agenttx.prompt([charge])
    assert agenttx.prompt([], plans=True) == agenttx.PROMPT + "\n" + PLANS_PROMPT
    with pytest.raises(agenttx.InvalidArgument, match="plans must be True or False"):
        agenttx.prompt([charge], plans="yes")  # type: ignore[arg-type]
