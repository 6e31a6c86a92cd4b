"""Hypothesis strategies for JSON values and step sequences."""

from __future__ import annotations

from typing import TYPE_CHECKING, final

import attrs
from hypothesis import strategies as st

from .._graph import DependencyGraph
from .._refs import resolve_references

if TYPE_CHECKING:
    from collections.abc import Sequence

    from .._json import JSONScalar, JSONValue

__all__ = ["StepSpec", "build_graph", "json_scalars", "json_values", "step_sequences"]

#: Keys that link to each other under the implicit-edge rule (`user_id` -> `id`, `User_ID`).
DEFAULT_KEYS = ("id", "user_id", "owner_id", "User_ID", "sku", "order_id", "amount", "note")
#: Values that collide on purpose: `7`, `7.0` and `"7"` differ; `True`, None and "" never link.
DEFAULT_VALUES: tuple[JSONScalar, ...] = ("u-1", "u-2", "sku-9", "7", 7, 7.0, 100, "", True, None)
DEFAULT_TOOLS = ("create_user", "lookup_owner", "check_stock", "insert_order", "charge")


def json_scalars() -> st.SearchStrategy[JSONScalar]:
    """Any JSON scalar: null, booleans, integers, finite floats and text."""
    return st.one_of(
        st.none(),
        st.booleans(),
        st.integers(),
        st.floats(allow_nan=False, allow_infinity=False),
        st.text(),
    )


def json_values(*, max_leaves: int = 20) -> st.SearchStrategy[JSONValue]:
    """Any JSON value (nested lists and objects with string keys), at most `max_leaves` scalars."""
    return st.recursive(
        json_scalars(),
        lambda children: st.one_of(
            st.lists(children, max_size=4),
            st.dictionaries(st.text(max_size=8), children, max_size=4),
        ),
        max_leaves=max_leaves,
    )


@final
@attrs.frozen(kw_only=True)
class StepSpec:
    """One step of a generated sequence: the call the agent sent and the output its tool gave."""

    step_id: int
    tool_name: str
    arguments: JSONValue
    output: JSONValue


@st.composite
def step_sequences(
    draw: st.DrawFn,
    *,
    min_steps: int = 1,
    max_steps: int = 12,
    keys: Sequence[str] = DEFAULT_KEYS,
    values: Sequence[JSONScalar] = DEFAULT_VALUES,
    tools: Sequence[str] = DEFAULT_TOOLS,
) -> list[StepSpec]:
    """Steps 1..n whose arguments mix plain values with `${steps.K.path}` references.

    Keys and values are drawn from small pools so that implicit links are frequent. References
    point at earlier steps, usually at a key their output has, sometimes at a missing key or a
    later step (both fail to resolve), and sometimes sit inside longer strings or lists.
    """
    count = draw(st.integers(min_value=min_steps, max_value=max_steps))
    key = st.sampled_from(list(keys))
    plain = st.sampled_from(list(values))
    steps: list[StepSpec] = []
    for step_id in range(1, count + 1):
        argument = st.one_of(
            plain,
            _references(steps, step_id, key),
            st.lists(plain, max_size=2),
        )
        arguments = draw(st.dictionaries(key, argument, max_size=4))
        output = draw(
            st.dictionaries(
                key, st.one_of(plain, st.dictionaries(key, plain, max_size=2)), max_size=4
            )
        )
        steps.append(
            StepSpec(
                step_id=step_id,
                tool_name=draw(st.sampled_from(list(tools))),
                arguments=arguments,  # type: ignore[arg-type]  # dict[str, Any] is JSON here
                output=output,  # type: ignore[arg-type]
            )
        )
    return steps


def _references(
    earlier: list[StepSpec], step_id: int, key: st.SearchStrategy[str]
) -> st.SearchStrategy[str]:
    addressable = [
        (step.step_id, name)
        for step in earlier
        if isinstance(step.output, dict)
        for name in step.output
    ]
    # Any earlier step and key, or the current step: these may miss, and then fail to resolve.
    anywhere = st.tuples(st.integers(min_value=1, max_value=step_id), key)
    target = st.one_of(st.sampled_from(addressable), anywhere) if addressable else anywhere
    return st.builds(_reference_text, target, st.booleans())


def _reference_text(target: tuple[int, str], embed: bool) -> str:
    text = f"${{steps.{target[0]}.{target[1]}}}"
    return f"see {text}." if embed else text


def build_graph(steps: Sequence[StepSpec]) -> DependencyGraph:
    """The graph a transaction builds for `steps`, all run in order without rewinds.

    Each step's references are resolved against the outputs of the steps before it. A step
    whose references resolve is added with its resolved arguments and its output recorded; one
    whose references fail is added with its unresolved arguments and the dependencies found
    before the failure, and gets no output, as a failed step's node does in a transaction.
    """
    graph = DependencyGraph()
    outputs: dict[int, JSONValue] = {}
    for step in steps:
        resolution = resolve_references(step.arguments, outputs, current_step=step.step_id)
        graph.add_step(step.step_id, step.tool_name, resolution.value, resolution.dependencies)
        if resolution.ok:
            graph.record_output(step.step_id, step.output)
            outputs[step.step_id] = step.output
    return graph
