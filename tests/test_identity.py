"""Long-lived objects compare by identity, hash, and never show user data in their repr."""

from __future__ import annotations

import pytest

import agenttx
from agenttx import DependencyGraph, Engine, LineageRecorder, RollbackPolicy
from agenttx._rollback import RollbackController
from agenttx.stores import SQLiteStore

SECRET = "sk-live-4f9a1c"  # an API key a tool received or returned


def _graph() -> DependencyGraph:
    graph = DependencyGraph()
    graph.add_step(1, "login", {"api_key": SECRET})
    graph.record_output(1, {"token": SECRET, "user": {"id": 42}})
    graph.add_step(2, "fetch", {"token": SECRET, "user_id": 42})
    graph.record_output(2, {"rows": [SECRET]})
    graph.add_step(3, "send", {"token": SECRET})
    return graph


def _controller() -> RollbackController:
    controller = RollbackController(RollbackPolicy())
    controller.observe_step(3)
    controller.decide(3, SECRET, lambda _step, _key: 1)
    return controller


def _recorder() -> LineageRecorder:
    recorder = LineageRecorder()
    recorder.start_run(SECRET)
    recorder.on_iteration(1)
    recorder.on_tool_start("c1", "login", {"api_key": SECRET})
    recorder.on_tool_end("c1", {"token": SECRET})
    recorder.on_iteration(2)
    recorder.on_tool_start("c2", "fetch", {"token": SECRET})
    return recorder


@agenttx.tool
def login(api_key: str) -> dict:
    return {"token": api_key}


def test_repr_shows_counts_never_user_data():
    """The repr of a graph, controller, recorder or engine holds no argument or output."""
    graph, controller, recorder = _graph(), _controller(), _recorder()
    assert repr(graph) == "<DependencyGraph steps=3 edges=3>"
    assert repr(controller) == "<RollbackController global_resets=0 replayed_steps=3 horizon=3>"
    assert repr(recorder) == "<LineageRecorder calls=2 edges=1>"
    for obj in (graph, controller, recorder):
        assert SECRET not in repr(obj)
        assert SECRET not in str(obj)


def test_engine_repr_shows_the_store_and_counts(tmp_path):
    """An engine's repr names its store (a SQLite file by path) and counts its transactions."""
    with SQLiteStore(tmp_path / "agent.db") as store:
        engine = Engine(tools=[login], store=store)
        live, ended = engine.begin(agent_id=SECRET), engine.begin()
        assert live.execute_step(1, "login", {"api_key": SECRET}).ok
        ended.commit()
        engine.transactions()  # the engine notices the end
        text = repr(engine)
        assert text == (f"<Engine store=SQLiteStore({store.path!r}) live=1 ended=1>")
        assert SECRET not in text
    assert repr(Engine()) == "<Engine store=MemoryStore live=0 ended=0>"


@pytest.mark.parametrize("build", [_graph, _controller, _recorder, Engine])
def test_long_lived_objects_compare_by_identity_and_hash(build):
    """Equal content is not equality: each object equals itself only, and can go in a set."""
    first, twin = build(), build()
    assert first == first  # noqa: PLR0124  (the point of the test)
    assert first != twin
    assert len({first, twin, first}) == 2
    assert {first: 1}[first] == 1
