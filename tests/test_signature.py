"""The signature reader: parameters, annotations, defaults, docstrings and return types."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, NewType, TypedDict

import typing_extensions

from agenttx._tools._signature import (
    NO_DEFAULT,
    UNRESOLVED,
    parse_docstring,
    read_signature,
)

if TYPE_CHECKING:
    import agenttx

UserId = NewType("UserId", int)


class Order(TypedDict, total=False):
    sku: str
    qty: int


class Stock(typing_extensions.TypedDict):
    warehouse_id: str
    available: int


def check_stock(sku: str) -> Stock:
    return {"warehouse_id": sku}


def google(
    ctx: agenttx.ToolContext, amount: int, card: str = "visa", *, note: str | None = None
) -> UserId:
    """Charge a card.

    The longer text.

    Args:
        amount (int): Amount in cents,
            never negative.
        card: The card id.
        note: Optional note.

    Returns:
        The user charged.
    """
    raise NotImplementedError


def numpy_style(amount: int, card: str) -> Order:
    """Charge a card.

    Parameters
    ----------
    amount : int
        Amount in cents.
    card : str
        The card id.

    Returns
    -------
    Order
        The order.
    """
    raise NotImplementedError


def rest_style(amount: int, card: str) -> None:
    """Charge a card.

    :param int amount: Amount in cents.
    :param card: The card id,
        on two lines.
    :returns: nothing.
    """


def test_google_docstring_gives_summary_arguments_and_return():
    """Google `Args:`/`Returns:` sections give per-argument and return descriptions."""
    signature = read_signature(google, skip_context=True)
    assert [p.name for p in signature.parameters] == ["amount", "card", "note"]
    amount, card, note = signature.parameters
    assert amount.description == "Amount in cents, never negative."
    assert card.description == "The card id."
    assert signature.summary == "Charge a card."
    assert signature.description == "Charge a card.\n\nThe longer text."
    assert signature.returns.description == "The user charged."
    assert signature.returns.semantic_name == "UserId"
    assert amount.annotation is int
    assert amount.required
    assert amount.default is NO_DEFAULT
    assert card.default == "visa"
    assert not card.required
    assert note.annotation == (str | None)


def test_numpy_docstring_and_typed_dict_return():
    """A NumPy `Parameters` section is read; a TypedDict return lists its fields."""
    signature = read_signature(numpy_style, skip_context=False)
    assert {p.name: p.description for p in signature.parameters} == {
        "amount": "Amount in cents.",
        "card": "The card id.",
    }
    assert signature.returns.description == "The order."
    assert [(f.name, f.annotation, f.required) for f in signature.returns.fields] == [
        ("sku", str, False),
        ("qty", int, False),
    ]


def test_typing_extensions_typed_dict_return_lists_its_fields():
    """A `typing_extensions.TypedDict` return gives its fields as `typing.TypedDict` does."""
    fields = read_signature(check_stock, skip_context=False).returns.fields
    assert [(f.name, f.annotation, f.required) for f in fields] == [
        ("warehouse_id", str, True),
        ("available", int, True),
    ]


def test_rest_docstring():
    """reST `:param [type] name:` fields, continued on indented lines, are read."""
    signature = read_signature(rest_style, skip_context=False)
    assert {p.name: p.description for p in signature.parameters} == {
        "amount": "Amount in cents.",
        "card": "The card id, on two lines.",
    }
    assert signature.returns.description == "nothing."
    assert signature.summary == "Charge a card."


def test_unresolvable_forward_reference_is_unresolved_not_an_error():
    """A string annotation naming nothing resolves to UNRESOLVED; the others still resolve."""

    def fn(a: NoSuchType, b: int) -> int:  # type: ignore[name-defined]  # noqa: F821
        return b

    signature = read_signature(fn, skip_context=False)
    assert [p.annotation for p in signature.parameters] == [UNRESOLVED, int]
    assert signature.returns.annotation is int


def test_annotated_metadata_is_kept_and_kwargs_noted():
    """`Annotated` survives resolution; `**kwargs` marks extra keywords; `*args` is left out."""

    def fn(
        a: Annotated[int, "how many"], /, b: Annotated[str, "the name"], *args: int, **kw: str
    ) -> None:
        return None

    signature = read_signature(fn, skip_context=False)
    assert [p.name for p in signature.parameters] == ["b"]
    assert signature.parameters[0].annotation == Annotated[str, "the name"]
    assert signature.extra_keywords
    assert signature.extra_annotation is str


def test_no_docstring_and_builtin_without_signature():
    """No docstring gives empty texts; a callable without a signature takes any keywords."""
    signature = read_signature(lambda x: x, skip_context=False)
    assert signature.summary == ""
    assert signature.parameters[0].annotation is UNRESOLVED
    assert read_signature(max, skip_context=False).extra_keywords


def test_unknown_sections_stay_out_of_arguments():
    """A `Raises:` section is not read as arguments, and plain text stays in the description."""
    doc = parse_docstring("Do it.\n\nRaises:\n    ValueError: when bad.\n\nMore text.")
    assert doc.arguments == {}
    assert doc.description == "Do it.\n\nMore text."


def test_callable_objects_partials_and_bound_methods():
    """A callable object reads its `__call__` (doc included); partials and methods their rest."""
    import functools  # noqa: PLC0415

    class Counter:
        def __call__(self, n: int) -> int:
            """Count.

            Args:
                n: How many.
            """
            return n

    signature = read_signature(Counter(), skip_context=False)
    assert signature.summary == "Count."
    assert [(p.name, p.annotation, p.description) for p in signature.parameters] == [
        ("n", int, "How many.")
    ]

    def add(a: int, b: int) -> int:
        return a + b

    assert [
        p.name for p in read_signature(functools.partial(add, 1), skip_context=False).parameters
    ] == ["b"]
