"""An approval made in `agenttx ui` is consumed exactly once by the agent waiting for it, across
a SIGKILL of the agent and its restart, on SQLite and PostgreSQL; no browser (the app is driven
by Starlette's test client, posting its own forms as a page would)."""

from __future__ import annotations

import sys
import time
import urllib.parse
from typing import TYPE_CHECKING, Any

import pytest

from _ui_fixtures import (
    AGENT,
    Backend,
    backend_of,
    effects,
    finish,
    first_line,
    form_of,
    kill,
    reap,
    spawn,
)

pytest.importorskip("starlette", reason="the web app needs the ui extra: pip install 'agenttx[ui]'")
pytest.importorskip("httpx", reason="Starlette's test client needs httpx")

if TYPE_CHECKING:
    import subprocess
    from collections.abc import Iterator
    from pathlib import Path

    from starlette.testclient import TestClient

pytestmark = [
    pytest.mark.skipif(sys.platform == "win32", reason="SIGKILL is POSIX"),
    pytest.mark.timeout(300),
]

TOKEN = "t-" + "x" * 40
ORIGIN = "http://127.0.0.1:8765"


@pytest.fixture(autouse=True)
def _reaped() -> Iterator[None]:
    """No agent or plan process outlives its test."""
    yield
    reap()


@pytest.fixture(params=["sqlite", "postgres"])
def backend(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Backend]:
    with backend_of(request.param, tmp_path) as made:
        yield made


@pytest.fixture
def app(backend: Backend) -> Iterator[TestClient]:
    """The web app on the agent's store, opened as `agenttx ui` opens it, deciding as alice."""
    from starlette.testclient import TestClient  # noqa: PLC0415

    from agenttx._cli._target import open_target  # noqa: PLC0415
    from agenttx._ui._app import make_app  # noqa: PLC0415

    store = open_target(backend.target, 5.0, schema=backend.schema or "agenttx", write=True).store
    with TestClient(make_app(store, token=TOKEN, actor="alice"), base_url=ORIGIN) as client:
        yield client
    store.close()


def _post_form(client: TestClient, page_path: str, kind: str, route: str, **owner: str) -> None:
    """Read the page, then post its form of class `kind` (held by `owner`) as the page would:
    same origin, the token, the CSRF field and the actor the form holds; a 303 to the inbox."""
    page = client.get(page_path, params={"token": TOKEN})
    assert page.status_code == 200, page.text
    form = form_of(page.text, kind, **owner)
    assert form.method == "post"
    assert urllib.parse.urlsplit(form.action).path == route
    assert form.fields.get("csrf"), f"the form has no CSRF field: {form}"
    fields = dict(form.fields)
    if kind == "resolve":
        fields["outcome"] = "done"  # the button `outcome=done`
    done = client.post(
        route,
        params={"token": TOKEN},
        data=fields,
        headers={"Origin": ORIGIN},
        follow_redirects=False,
    )
    assert done.status_code == 303, done.text
    assert urllib.parse.urlsplit(done.headers["location"]).path == "/inbox"


def _approve(client: TestClient, request_id: str) -> None:
    route = f"/inbox/{request_id}/approve"
    _post_form(client, "/inbox", "approve", route, request_id=request_id)


def _gate_reached(process: subprocess.Popen[str], reached: Path) -> None:
    """Wait until the agent made `reached` (it holds there), alive all along."""
    while not reached.exists():
        assert process.poll() is None, process.communicate()
        time.sleep(0.02)


def _ask(backend: Backend, root: Path, gate: str, *flags: str) -> tuple[Any, dict[str, Any]]:
    (root / gate).write_text("")
    agent = spawn(AGENT, "wait", backend.target, str(root), *backend.options, *flags)
    return agent, first_line(agent)


def _restart(backend: Backend, root: Path, tx: str, *flags: str) -> subprocess.Popen[str]:
    return spawn(AGENT, "resume", backend.target, str(root), tx, *backend.options, *flags)


def test_an_approval_from_the_app_runs_once_when_the_agent_dies_before_sending_it(
    backend, app, tmp_path
):
    """Approved in the app, the agent is SIGKILLed once it saw the approval and before it sent
    the call again; restarted, it runs the call once, and the inbox lists it no more."""
    agent, asked = _ask(backend, tmp_path, "hold-decided")
    _approve(app, asked["request"])
    _gate_reached(agent, tmp_path / "hold-decided.reached")
    assert effects(tmp_path) == []  # the call was not sent yet
    kill(agent)
    (tmp_path / "hold-decided").unlink()
    resumed = finish(_restart(backend, tmp_path, asked["tx"]))
    assert resumed["answer"]["ok"] is True
    assert resumed["answer"]["output"]["amount"] == 500
    assert resumed["committed"] == 1
    assert [effect["amount"] for effect in effects(tmp_path)] == [500]
    inbox = app.get("/inbox", params={"token": TOKEN})
    assert asked["request"] not in inbox.text


def test_an_approval_from_the_app_runs_once_when_the_agent_dies_after_the_effect(
    backend, app, tmp_path
):
    """Approved in the app, the agent is SIGKILLed after the charge happened and before its
    outcome was recorded; restarted, the status check finds the charge: not run again."""
    agent, asked = _ask(backend, tmp_path, "hold-effect")
    _approve(app, asked["request"])
    _gate_reached(agent, tmp_path / "hold-effect.reached")
    assert len(effects(tmp_path)) == 1
    kill(agent)
    (tmp_path / "hold-effect").unlink()
    resumed = finish(_restart(backend, tmp_path, asked["tx"]))
    assert resumed["answer"]["ok"] is True
    assert resumed["answer"]["output"]["checked"] is True  # the check's output, no new charge
    assert resumed["committed"] == 1
    assert len(effects(tmp_path)) == 1


def test_a_call_cut_short_without_a_check_is_resolved_in_the_app_and_not_run_again(
    backend, app, tmp_path
):
    """Without a status check the restarted agent waits on a review; resolved `done` in the
    app, the agent goes on without charging again."""
    agent, asked = _ask(backend, tmp_path, "hold-effect", "--no-check")
    _approve(app, asked["request"])
    _gate_reached(agent, tmp_path / "hold-effect.reached")
    kill(agent)
    (tmp_path / "hold-effect").unlink()
    restarted = _restart(backend, tmp_path, asked["tx"], "--no-check")
    _gate_reached(restarted, tmp_path / "waiting.json")
    review = (tmp_path / "waiting.json").read_text().strip('[]"\n')
    route = f"/reviews/{review}/resolve"
    _post_form(app, "/inbox", "resolve", route, review_id=review)
    resumed = finish(restarted)
    assert resumed["answer"]["ok"] is True
    assert resumed["committed"] == 1
    assert len(effects(tmp_path)) == 1
