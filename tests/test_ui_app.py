"""`agenttx ui`'s handlers through Starlette's TestClient, on a SQLite file and on PostgreSQL:
every page, its filters, the token, CSRF and origin refusals, read-only, hostile strings shown
as text, and every decision (approve, reject, edit, review) made through the same book as the
command line's, with its actor recorded."""

from __future__ import annotations

import contextlib
import json
import re
import time
from typing import TYPE_CHECKING, Any

import pytest

pytest.importorskip("starlette")
pytest.importorskip("jinja2")

from starlette.testclient import TestClient

import agenttx
import test_cli_stores
from agenttx import Engine, EngineConfig
from agenttx._approvals import requests_for
from agenttx._ui import _views
from agenttx._ui._app import make_app
from agenttx._ui._security import csrf_token, session_secret
from agenttx._ui._values import CUT, shown_json, shown_text
from test_cli_stores import Backend, Filled, add, charge

#: The stores and their contents of tests/test_cli_stores.py: a SQLite file and PostgreSQL.
backend = test_cli_stores.backend
filled = test_cli_stores.filled

if TYPE_CHECKING:
    from httpx import Response

TOKEN = "s3cret-token"
ORIGIN = "http://testserver"

pytestmark = pytest.mark.timeout(300)


def client(store: Any, **options: Any) -> TestClient:
    """A client of the app over `store`, holding the token's cookie (its first request carries
    the token in the query)."""
    made = TestClient(make_app(store, token=TOKEN, **options), follow_redirects=False)
    assert made.get(f"/?token={TOKEN}").status_code == 303
    return made


def post(made: TestClient, path: str, **fields: str) -> Response:
    """A POST from the page: the CSRF token, an actor, the page's own origin."""
    form = {"csrf": csrf_token(TOKEN), "actor": "alice", **fields}
    return made.post(path, data=form, headers={"origin": ORIGIN})


def flash_of(made: TestClient, response: Response) -> str:
    """The `#flash` of the page a decision redirected to."""
    assert response.status_code == 303, response.text
    page = made.get(response.headers["location"]).text
    found = re.search(r'<div id="flash"[^>]*>(.*?)</div>', page, re.DOTALL)
    assert found is not None
    return found.group(0)


def rows(page: str, tag: str = "tr", cls: str = "run") -> list[dict[str, str]]:
    """The data attributes of each `<tag class="cls" ...>` of a page."""
    return [
        dict(re.findall(r'data-([a-z-]+)="([^"]*)"', match.group(1)))
        for match in re.finditer(rf'<{tag} class="{cls}"([^>]*)>', page)
    ]


def test_every_page_shows_the_store(backend: Backend, filled: Filled) -> None:  # noqa: PLR0915
    """Runs (with its filters), a transaction (ended and open, with the rewind preview), a plan
    run, the inbox and the audit trail (with its filters) show what the store holds."""
    store = backend.make()
    made = client(store)
    ended, waiting = filled.ended, filled.waiting

    page = made.get("/").text
    assert 'data-page="runs"' in page
    assert 'data-live="2"' in page
    for link in ("nav-runs", "nav-inbox", "nav-audit"):
        assert f'id="{link}"' in page
    listed = {row["id"]: row for row in rows(page)}
    assert listed[ended.id]["status"] == "COMMITTED"
    assert listed[waiting.id]["status"] == "WAITING_APPROVAL"
    assert listed["done-run"] == {"id": "done-run", "kind": "plan", "status": "SUCCEEDED"}
    assert f'<a class="run-link" href="/tx/{ended.id}">' in page
    assert [r["id"] for r in rows(made.get("/?status=committed").text)] == [ended.id]
    assert [r["id"] for r in rows(made.get("/?kind=plan").text)] == ["done-run"]
    assert [r["id"] for r in rows(made.get("/?agent=payer").text)] == [waiting.id]
    assert made.get("/?kind=nothing").status_code == 404

    page = made.get(f"/tx/{ended.id}").text
    assert 'data-page="transaction"' in page
    assert 'data-live="2"' not in page  # it has ended: nothing changes
    assert rows(page, cls="step") == [{"step": "1", "state": "committed"}]
    assert re.search(r'<div id="graph"><svg', page)
    assert '<ul id="timeline">\n<li>1. step 1 add: committed</li>' in page
    for part in ("compensations", "staged"):
        assert f'id="{part}"' in page

    page = made.get(f"/tx/{waiting.id}").text
    assert 'data-live="2"' in page
    assert '<form id="preview"' in page
    assert 'select name="to"' in page
    assert "preview-result" not in page
    page = made.get(f"/tx/{waiting.id}?to=0").text
    assert 'id="preview-result"' in page
    for part in ("void", "compensate", "drop", "irreversible"):
        assert f'id="preview-{part}"' in page
    assert made.get("/tx/no-such-tx").status_code == 404

    page = made.get("/plan/done-run").text
    assert 'data-page="plan"' in page
    assert re.search(r'<div id="dag"><svg', page)
    assert re.search(r'<div id="gantt"><svg', page)
    assert '<dl id="plan-totals">' in page
    assert '<dd id="total-retries">0</dd>' in page
    assert rows(page, cls="node") == [
        {"id": "x", "state": "succeeded"},
        {"id": "y", "state": "succeeded"},
    ]
    assert made.get("/plan/no-such-run").status_code == 404

    page = made.get("/inbox").text
    assert rows(page, "article", "request") == [{"request-id": filled.request}]
    assert rows(page, "article", "review") == [{"review-id": filled.review}]
    assert '<span class="tool">charge</span>' in page
    assert "&#34;amount&#34;: 4200" in page
    for form in ("approve", "reject", "edit", "resolve"):
        assert f'<form class="{form}"' in page
    assert page.count(f'name="csrf" value="{csrf_token(TOKEN)}"') == 4
    assert 'button type="submit" name="outcome" value="not_done"' in page

    page = made.get("/audit").text
    kinds = [row["kind"] for row in rows(page, cls="event")]
    assert {"step_dispatched", "step_completed", "committed"} <= set(kinds)
    assert f'<a class="run" href="/tx/{ended.id}">' in page
    assert '<a class="run" href="/plan/done-run">' in page
    page = made.get("/audit?kind=committed").text
    assert {row["kind"] for row in rows(page, cls="event")} == {"committed"}
    page = made.get(f"/audit?run={ended.id}").text
    assert [row["kind"] for row in rows(page, cls="event")] == [
        "committed",
        "step_completed",
        "step_dispatched",
    ]
    assert rows(made.get("/audit?actor=nobody").text, cls="event") == []

    fragment = made.get("/", headers={"x-agenttx-live": "1"}).text
    assert "<html" not in fragment
    assert '<table id="runs">' in fragment


def test_a_plan_runs_page_sums_the_gbp_its_nodes_reported(backend: Backend) -> None:
    """The plan page's cost is the exact sum of what its nodes' attempts reported, by
    category; a run whose tools reported nothing says so."""

    @agenttx.tool
    def priced(ctx: agenttx.ToolContext, n: int) -> dict[str, int]:
        ctx.add_cost("0.25")
        ctx.add_cost("0.005", category="model")
        return {"n": n}

    store = backend.make()
    engine = Engine(tools=[priced, add], store=store, config=EngineConfig(idle_timeout=None))
    nodes = [agenttx.Node(name, tool="priced", inputs={"n": 1}) for name in ("a", "b")]
    engine.run_plan(agenttx.Plan(nodes=nodes), initial={}, run_id="priced-run")
    free = agenttx.Plan(nodes=[agenttx.Node("p", tool="add", inputs={"n": 1})])
    engine.run_plan(free, initial={}, run_id="free-run")
    engine.close()
    made = client(store)
    assert (
        '<dd id="total-cost">0.510 (model 0.010, tool 0.50)</dd>'
        in made.get("/plan/priced-run").text
    )
    assert '<dd id="total-cost">none reported</dd>' in made.get("/plan/free-run").text


def test_list_runs_pages_at_the_store(backend: Backend, monkeypatch) -> None:
    """`list_runs` gives the ended transactions and plan runs a page at a time, latest first,
    without the plan runs' own transactions; the runs page follows it, page after page."""
    store = backend.make()
    engine = Engine(tools=[add], store=store, config=EngineConfig(idle_timeout=None))
    ids = []
    for number in range(5):
        tx = engine.begin(agent_id="pager")
        tx.call("add", {"n": number})
        tx.commit()
        ids.append(tx.id)
    plan = agenttx.Plan(nodes=[agenttx.Node("p", tool="add", inputs={"n": 1})])
    engine.run_plan(plan, initial={}, run_id="pr-1")
    engine.close()
    every = store.list_runs(100)
    assert [row[:2] for row in every if row[0] == "plan"] == [("plan", "pr-1")]
    assert [row[1] for row in every if row[0] == "tx"] == ids[::-1]
    assert [row[2] for row in every] == sorted((row[2] for row in every), reverse=True)
    plan_row = next(row for row in every if row[0] == "plan")
    assert plan_row[3:] == ("SUCCEEDED", None, None)
    tx_row = next(row for row in every if row[0] == "tx")
    assert tx_row[3] is None
    assert json.loads(tx_row[4])["agent_id"] == "pager"
    assert json.loads(tx_row[5])["status"] == "COMMITTED"
    pages = [store.list_runs(2, offset) for offset in (0, 2, 4)]
    assert [row for page in pages for row in page] == list(every)
    assert store.list_runs(100, kind="plan") == tuple(r for r in every if r[0] == "plan")
    with pytest.raises(agenttx.InvalidArgument):
        store.list_runs(0)
    with pytest.raises(agenttx.InvalidArgument):
        store.list_runs(1, kind="nothing")
    monkeypatch.setattr(_views, "PER_PAGE", 2)
    made = client(store)
    seen = []
    for page in (1, 2, 3):
        listed = rows(made.get(f"/?kind=tx&page={page}").text)
        assert len(listed) == (2 if page < 3 else 1)
        seen.extend(row["id"] for row in listed)
    assert seen == ids[::-1]
    assert 'id="older"' not in made.get("/?kind=tx&page=3").text


def test_every_request_without_the_token_is_refused(backend: Backend, filled: Filled) -> None:
    """No token, a wrong one: 403 on pages, fragments, static files and POSTs. The token in
    the query sets an HttpOnly, SameSite=Strict session cookie that is accepted alone."""
    store = backend.make()
    app = make_app(store, token=TOKEN)
    bare = TestClient(app, follow_redirects=False)
    for path in ("/", "/inbox", "/audit", "/static/ui.js", f"/tx/{filled.ended.id}"):
        refused = bare.get(path)
        assert refused.status_code == 403
        assert "token is missing" in refused.text
        assert refused.headers["content-type"].startswith("text/plain")
        assert bare.get(f"{path}?token=wrong").status_code == 403
    assert post(bare, f"/inbox/{filled.request}/approve").status_code == 403
    wrong = TestClient(app, cookies={"agenttx_session_80": "wrong"})
    assert wrong.get("/").status_code == 403

    first = bare.get(f"/?token={TOKEN}")
    assert first.status_code == 303
    cookie = first.headers["set-cookie"]
    assert cookie.startswith(f"agenttx_session_80={session_secret(TOKEN)};")
    for part in ("HttpOnly", "SameSite=Strict", "Path=/"):
        assert part in cookie
    headers = first.headers
    assert headers["content-security-policy"].startswith("default-src 'self'")
    assert "script-src 'self'" in headers["content-security-policy"]
    assert headers["x-content-type-options"] == "nosniff"
    assert headers["referrer-policy"] == "no-referrer"
    assert headers["x-frame-options"] == "DENY"
    by_cookie = TestClient(app, cookies={"agenttx_session_80": session_secret(TOKEN)})
    assert by_cookie.get("/static/ui.css").status_code == 200
    assert "set-cookie" not in by_cookie.get("/").headers
    assert requests_for(store).get(filled.request).state == "pending"


def test_writes_need_the_csrf_token_and_the_page_s_origin(backend: Backend, filled: Filled) -> None:
    """A POST without the CSRF token, with a wrong one, from another origin, from an opaque
    one or saying no origin at all (unless the browser's `Sec-Fetch-Site` says same-origin),
    or from another site by `Sec-Fetch-Site`, is refused (403) and decides nothing; a
    same-origin `Referer` stands in for a missing `Origin`."""
    store = backend.make()
    made = client(store)
    path = f"/inbox/{filled.request}/reject"
    form = {"actor": "mallory", "reason": "forged"}
    good = csrf_token(TOKEN)
    refused = [
        made.post(path, data=form, headers={"origin": ORIGIN}),
        made.post(path, data={**form, "csrf": "0" * 64}, headers={"origin": ORIGIN}),
        made.post(path, data={**form, "csrf": good}, headers={"origin": "http://evil.example"}),
        made.post(path, data={**form, "csrf": good}, headers={"origin": "null"}),
        made.post(path, data={**form, "csrf": good}),
        made.post(path, data={**form, "csrf": good}, headers={"referer": "http://evil.example/"}),
    ]
    cross_site = {"origin": "null", "sec-fetch-site": "cross-site"}
    refused.append(made.post(path, data={**form, "csrf": good}, headers=cross_site))
    same_site = {"origin": ORIGIN, "sec-fetch-site": "same-site"}
    refused.append(made.post(path, data={**form, "csrf": good}, headers=same_site))
    assert [response.status_code for response in refused] == [403] * 8
    assert "CSRF" in refused[0].text
    assert "another origin" in refused[2].text
    assert "says no origin" in refused[3].text
    assert "another site" in refused[6].text
    assert requests_for(store).get(filled.request).state == "pending"
    done = made.post(path, data={**form, "csrf": good}, headers={"referer": f"{ORIGIN}/inbox"})
    assert "rejected" in flash_of(made, done)
    assert requests_for(store).get(filled.request).state == "rejected"
    # Chromium under `Referrer-Policy: no-referrer`: `Origin: null`, no `Referer`, and its own
    # `Sec-Fetch-Site` saying the form is the page's.
    browser = {"origin": "null", "sec-fetch-site": "same-origin"}
    done = made.post(
        f"/reviews/{filled.review}/resolve",
        data={"csrf": good, "actor": "ops", "outcome": "not_done"},
        headers=browser,
    )
    assert "resolved not_done by ops" in flash_of(made, done)


def test_read_only_serves_no_writes(backend: Backend, filled: Filled) -> None:
    """`read_only`: the inbox has no forms, and every POST is refused (403)."""
    store = backend.make()
    made = client(store, read_only=True)
    page = made.get("/inbox").text
    assert rows(page, "article", "request") == [{"request-id": filled.request}]
    assert "<form class=" not in page
    assert "read-only" in page
    for action in ("approve", "reject", "edit"):
        response = post(made, f"/inbox/{filled.request}/{action}", reason="x", arguments="{}")
        assert response.status_code == 403
        assert "read-only" in response.text
    assert post(made, f"/reviews/{filled.review}/resolve", outcome="done").status_code == 403
    assert requests_for(store).get(filled.request).state == "pending"


def test_approving_in_the_page_runs_the_call_once(backend: Backend, filled: Filled) -> None:
    """An approval made in the page is the book's: it records its actor, the waiting
    transaction's call then runs once, and approving it again is refused."""
    store = backend.make()
    made = client(store, actor="ui:tester")
    assert 'name="actor" value="ui:tester"' in made.get("/inbox").text
    said = flash_of(made, post(made, f"/inbox/{filled.request}/approve", actor="carol"))
    assert f"approved {filled.request} by carol" in said
    assert 'class="error"' not in said
    decision = json.loads(requests_for(store).get(filled.request).decision or "{}")
    assert decision["actor"] == "carol"
    result = filled.waiting.call("charge", {"amount": 4200})
    assert result.ok
    assert result.output == {"amount": 4200}
    state = requests_for(store).get(filled.request).state
    assert state in {"consumed", "finished"}
    again = flash_of(made, post(made, f"/inbox/{filled.request}/approve"))
    assert '<div id="flash" class="error"' in again
    assert "not approved" in again
    assert rows(made.get("/inbox").text, "article", "request") == []


def test_rejecting_and_resolving_record_their_actors(backend: Backend, filled: Filled) -> None:
    """A rejection needs a reason and says it; a review is resolved not done; each decision
    records who made it; an empty actor is refused."""
    store = backend.make()
    made = client(store)
    said = flash_of(made, post(made, f"/inbox/{filled.request}/reject", reason=""))
    assert 'class="error"' in said
    said = flash_of(made, post(made, f"/inbox/{filled.request}/reject", actor=" ", reason="x"))
    assert "say who decides" in said
    assert requests_for(store).get(filled.request).state == "pending"
    said = flash_of(made, post(made, f"/inbox/{filled.request}/reject", reason="too dear"))
    assert f"rejected {filled.request} by alice: too dear" in said
    row = requests_for(store).get(filled.request)
    assert (row.state, json.loads(row.decision)["actor"]) == ("rejected", "alice")
    result = filled.waiting.call("charge", {"amount": 4200})
    assert not result.ok
    assert "too dear" in str(result.error)

    said = flash_of(made, post(made, f"/reviews/{filled.review}/resolve", outcome="maybe"))
    assert 'class="error"' in said
    said = flash_of(
        made, post(made, f"/reviews/{filled.review}/resolve", outcome="not_done", actor="ops")
    )
    assert f"review {filled.review} resolved not_done by ops" in said
    row = requests_for(store).get(filled.review)
    assert row.state == "resolved"
    assert json.loads(row.decision)["actor"] == "ops"


def test_an_edit_is_checked_against_the_tool_s_schema(backend: Backend, filled: Filled) -> None:
    """An edit that is not JSON, not an object, does not fit the schema stored with the
    request, or is over 1 MiB is refused with the reason and the difference; one that fits
    is approved, and the call runs with it."""
    store = backend.make()
    made = client(store)
    path = f"/inbox/{filled.request}/edit"
    said = flash_of(made, post(made, path, arguments='{"amount": "lots"}'))
    assert '<div id="flash" class="error"' in said
    assert "do not fit tool `charge`" in said
    assert '<pre id="diff">' in said
    assert '<span class="del">-  &#34;amount&#34;: 4200</span>' in said
    assert '<span class="add">+  &#34;amount&#34;: &#34;lots&#34;</span>' in said
    for text, why in (
        ("{not json", "not JSON"),
        ("[1, 2]", "must be a JSON object"),
        ('{"amount": "' + "9" * (1 << 20) + '"}', "exceed 1048576 bytes"),
    ):
        said = flash_of(made, post(made, path, arguments=text))
        assert 'class="error"' in said
        assert why in said
        assert len(said) < 20_000
    assert requests_for(store).get(filled.request).state == "pending"

    said = flash_of(made, post(made, path, arguments='{"amount": 10}'))
    assert f"approved {filled.request} by alice with edited arguments" in said
    assert 'class="error"' not in said
    result = filled.waiting.call("charge", {"amount": 4200})
    assert result.ok
    assert result.output == {"amount": 10}
    decision = json.loads(requests_for(store).get(filled.request).decision or "{}")
    assert (decision["edited"], decision["actor"]) == (True, "alice")


def test_an_edit_without_a_stored_schema_is_refused_and_said(backend: Backend) -> None:
    """A request stored without its tool's schema: the inbox says an edit cannot be checked,
    and an edit is refused (the request stays pending)."""
    store = backend.make()
    engine = Engine(tools=[charge], store=store, config=EngineConfig(idle_timeout=None))
    tx = engine.begin(agent_id="x")
    stored = requests_for(store).request(
        scope="transaction",
        scope_id=tx.id,
        tool="mystery",
        arguments={"a": 1},
        digest="0" * 64,
        step=1,
    )
    made = client(store)
    page = made.get("/inbox").text
    at = page.index(f'data-request-id="{stored.id}"')
    assert 'class="no-schema"' in page[at:]
    said = flash_of(made, post(made, f"/inbox/{stored.id}/edit", arguments='{"a": 2}'))
    assert 'class="error"' in said
    assert "holds no schema" in said
    assert requests_for(store).get(stored.id).state == "pending"
    engine.close()


def test_hostile_strings_are_shown_as_text(backend: Backend) -> None:
    """Markup, attribute breakers, terminal escape codes and a 10 MB string from an agent or a
    tool are shown as text: nothing is interpreted, and the page stays small and says the
    size."""
    store = backend.make()
    engine = Engine(tools=[charge], store=store, config=EngineConfig(idle_timeout=None))
    hostile = '\x1b[31m<script>alert(1)</script>"><img src=x onerror=alert(2)>'
    tx = engine.begin(agent_id=hostile)
    stored = requests_for(store).request(
        scope="transaction",
        scope_id=tx.id,
        tool=hostile,
        arguments={"note": hostile, "blob": "B" * 10_000_000},
        digest="0" * 64,
        step=1,
    )
    made = client(store)
    for path in ("/inbox", "/", f"/tx/{tx.id}"):
        page = made.get(path).text
        assert "<script>" not in page
        assert "<img" not in page
        assert "\x1b" not in page
        assert len(page) < 200_000
    page = made.get("/inbox").text
    assert (
        "&lt;script&gt;alert(1)&lt;/script&gt;&#34;&gt;&lt;img src=x onerror=alert(2)&gt;" in page
    )
    assert "\\x1b[31m" in page or "\\u001b[31m" in page
    assert "The first 4 KiB of 10.0 MB shown." in page
    assert stored.id in page
    engine.close()


def test_values_are_cut_folded_and_escaped() -> None:
    """A value is cut to its first 4 KiB with its whole size said, folded when long, its
    control characters written out; a short one is shown whole."""
    huge = shown_json({"blob": "x" * 10_000_000})
    assert huge.cut
    assert huge.long
    assert len(huge.text) == CUT
    assert huge.size_said == "10.0 MB"
    short = shown_json({"a": 1})
    assert (short.text, short.cut, short.long) == ('{"a": 1}', False, False)
    text = shown_text("\x1b[2Jhi\u202e")
    assert text.text == "\\x1b[2Jhi\\u202e"
    assert not text.cut
    assert shown_text("y" * 5000).cut


def test_a_plan_node_waiting_for_approval_is_decided_in_the_page(backend: Backend) -> None:
    """A plan run whose node waits for approval is WAITING_APPROVAL in the runs, the node so in
    its page (live while it runs), and in the inbox with the node and its run; approved in the
    page, the node runs and the run succeeds."""
    store = backend.make()
    engine = Engine(tools=[add, charge], store=store, config=EngineConfig(idle_timeout=None))
    plan = agenttx.Plan(
        nodes=[
            agenttx.Node("first", tool="add", inputs={"n": 1}),
            agenttx.Node("pay", tool="charge", inputs={"amount": 5}, after=("first",)),
        ]
    )
    run_ = engine.start_plan(plan, initial={}, run_id="gated-run")
    try:
        while not run_.pending_approvals():
            time.sleep(0.05)
        made = client(store)
        listed = {row["id"]: row for row in rows(made.get("/").text)}
        assert listed["gated-run"]["status"] == "WAITING_APPROVAL"
        page = made.get("/plan/gated-run").text
        assert 'data-live="2"' in page
        fragment = made.get("/plan/gated-run", headers={"x-agenttx-live": "1"})
        assert fragment.status_code == 200, fragment.text
        assert '<ul id="waiting">' in fragment.text
        assert "<html" not in fragment.text
        assert {"id": "pay", "state": "waiting_approval"} in rows(page, cls="node")
        page = made.get("/inbox").text
        (request,) = rows(page, "article", "request")
        assert "node pay of plan run gated-run" in page
        assert '<span class="after">node first</span>' in page
        said = flash_of(made, post(made, f"/inbox/{request['request-id']}/approve"))
        assert "approved" in said
        assert run_.wait(timeout=120).status is agenttx.PlanStatus.SUCCEEDED
        page = made.get("/plan/gated-run").text
        assert 'data-live="2"' not in page
        assert {"id": "pay", "state": "succeeded"} in rows(page, cls="node")
    finally:
        if not run_.done:
            run_.cancel("the test ends")
            run_.wait(timeout=120)
        engine.close()


def _sql(backend: Backend, statement: str, values: tuple[Any, ...]) -> None:
    """Run one statement on the backend's tables, outside any store."""
    if backend.kind == "sqlite":
        import sqlite3  # noqa: PLC0415

        with contextlib.closing(sqlite3.connect(backend.text)) as conn, conn:
            conn.execute(statement.replace("%s", "?").replace("{s}", ""), values)
        return
    import psycopg  # noqa: PLC0415

    with psycopg.connect(backend.text, autocommit=True) as conn:
        conn.execute(statement.replace("{s}", f"{backend.schema}."), values)


def test_list_runs_lists_a_transaction_kept_twice_once(backend: Backend) -> None:
    """A transaction whose history the store keeps twice (it ended keeping undos, then again)
    is listed once, with its last row: its last end time and its last history."""
    store = backend.make()
    engine = Engine(tools=[add], store=store, config=EngineConfig(idle_timeout=None))
    tx = engine.begin(agent_id="twice")
    tx.call("add", {"n": 1})
    tx.commit()
    engine.close()
    (first,) = store.list_runs(10)
    history = json.loads(first[5])
    history["status"] = "ROLLED_BACK"
    _sql(
        backend,
        "INSERT INTO {s}ended (tx_id, record, isolation, history, steps, ended_at) "
        "SELECT tx_id, record, isolation, %s, steps, ended_at + 5 FROM {s}ended WHERE tx_id = %s",
        (json.dumps(history), tx.id),
    )
    (row,) = store.list_runs(10)
    assert row[:3] == ("tx", tx.id, first[2] + 5)
    assert json.loads(row[5])["status"] == "ROLLED_BACK"
    listed = rows(client(store).get("/").text)
    assert listed == [{"id": tx.id, "kind": "tx", "status": "ROLLED_BACK"}]


def test_a_store_the_page_cannot_read_is_said_not_raised(backend: Backend) -> None:
    """A store that cannot be read (here: closed under the page) gives each page one line
    saying why (404), not a server error."""
    store = backend.make()
    made = client(store)
    store.close()
    for path in ("/", "/inbox", "/audit", "/tx/some-tx", "/plan/some-run"):
        response = made.get(path)
        assert response.status_code == 404, path
        assert '<p class="missing">' in response.text
        assert "closed" in response.text


def test_a_decision_the_store_cannot_take_is_refused_and_said(backend: Backend) -> None:
    """When the store a decision is written through cannot be opened, the inbox says nothing
    was decided (`#flash.error`), not a server error."""
    store = backend.make()

    def writer() -> Any:
        raise agenttx.StorageError("the disk is gone")

    made = TestClient(make_app(store, token=TOKEN, writer=writer), follow_redirects=False)
    assert made.get(f"/?token={TOKEN}").status_code == 303
    said = flash_of(made, post(made, "/inbox/apr-x/approve"))
    assert '<div id="flash" class="error"' in said
    assert "nothing decided: the disk is gone" in said


def test_every_live_fragment_renders_with_content(backend: Backend, filled: Filled) -> None:
    """The live refresh of a page with something to show (the inbox with a waiting request and
    a review, an open transaction) renders its macros as the whole page does: 200, not 500."""
    made = client(backend.make())
    live = {"x-agenttx-live": "1"}
    fragment = made.get("/inbox", headers=live)
    assert fragment.status_code == 200, fragment.text
    assert "<html" not in fragment.text
    assert rows(fragment.text, "article", "request") == [{"request-id": filled.request}]
    assert f'name="csrf" value="{csrf_token(TOKEN)}"' in fragment.text
    fragment = made.get(f"/tx/{filled.waiting.id}", headers=live)
    assert fragment.status_code == 200, fragment.text
    assert '<ul id="timeline">' in fragment.text
    assert '<table id="steps">' in fragment.text


def test_a_flooded_inbox_shows_the_oldest_and_says_how_many_more_wait(
    backend: Backend, filled: Filled, monkeypatch
) -> None:
    """The inbox shows at most `SHOWN` requests, oldest first, and says how many more wait
    after them (a flood of requests can neither make the page huge nor hide that later ones
    wait); the heading counts them all."""
    from agenttx._ui import _inbox  # noqa: PLC0415

    monkeypatch.setattr(_inbox, "SHOWN", 0)
    page = client(backend.make()).get("/inbox").text
    assert rows(page, "article", "request") == []
    assert "<h2>Approval requests (1)</h2>" in page
    assert '<p id="inbox-cut-requests" class="cut">The 0 oldest shown; 1 more wait' in page
    assert '<p id="inbox-cut-reviews" class="cut">The 0 oldest shown; 1 more wait' in page
    monkeypatch.setattr(_inbox, "SHOWN", 100)
    page = client(backend.make()).get("/inbox").text
    assert rows(page, "article", "request") == [{"request-id": filled.request}]
    assert "inbox-cut" not in page


@pytest.fixture
def lone(tmp_path: Any) -> Any:
    """An empty SQLite store of its own (a test's that needs no contents)."""
    from agenttx.stores import SQLiteStore  # noqa: PLC0415

    store = SQLiteStore(str(tmp_path / "lone.db"))
    yield store
    store.close()


def test_the_session_cookie_is_neither_the_token_nor_shared_between_ports(lone: Any) -> None:
    """The cookie a valid token sets holds an HMAC of the token (not the token, not the CSRF
    token), under a name carrying the server's port: a cookie holding the token itself is
    refused, and servers on two ports of one host keep their own cookies."""
    app = make_app(lone, token=TOKEN)
    first = TestClient(app, follow_redirects=False).get(f"/?token={TOKEN}")
    name, _, rest = first.headers["set-cookie"].partition("=")
    value = rest.split(";", 1)[0]
    assert name == "agenttx_session_80"
    assert TOKEN not in value
    assert value not in {TOKEN, csrf_token(TOKEN)}
    assert TestClient(app, cookies={name: TOKEN}).get("/").status_code == 403
    assert TestClient(app, cookies={"agenttx_token": TOKEN}).get("/").status_code == 403
    other = TestClient(app, base_url="http://testserver:8001", follow_redirects=False)
    assert other.get(f"/?token={TOKEN}").headers["set-cookie"].startswith("agenttx_session_8001=")
    both = {"agenttx_session_8001": "another server's", name: value}
    assert TestClient(app, cookies=both).get("/").status_code == 200


def test_a_foreign_cookie_does_not_hide_the_session(lone: Any) -> None:
    """Cookies of other local applications that are not RFC 2109 (JSON, spaces, backslashes,
    stray quotes) are skipped, and the session cookie beside them is read."""
    made = TestClient(make_app(lone, token=TOKEN))
    session = f"agenttx_session_80={session_secret(TOKEN)}"
    for foreign in ('prefs={"theme":"dark"}', "name=John Doe", "path=C:\\Users", 'x="a"b"', "junk"):
        for header in (f"{foreign}; {session}", f"{session}; {foreign}"):
            assert made.get("/", headers={"cookie": header}).status_code == 200, header


def test_a_request_at_another_host_is_refused(lone: Any) -> None:
    """DNS rebinding: a request whose Host is not the server's own address (a local name, the
    address it was reached at, a name given to `make_app`) with its port is refused (421),
    the token notwithstanding."""
    from agenttx._ui._security import host_allowed  # noqa: PLC0415

    made = TestClient(make_app(lone, token=TOKEN, hosts=("box.lan",)), follow_redirects=False)
    for host in ("testserver", "localhost", "127.0.0.1", "[::1]", "box.lan", "LOCALHOST:80"):
        assert made.get(f"/?token={TOKEN}", headers={"host": host}).status_code == 303, host
    for host in ("evil.example", "localhost:8080", "127.0.0.1.evil.example", "localhost:+80", ""):
        refused = made.get(f"/?token={TOKEN}", headers={"host": host})
        assert refused.status_code == 421, host
        assert "set-cookie" not in refused.headers
    assert host_allowed("[::1]:8765", ("::1", 8765), frozenset())
    assert host_allowed("192.168.1.5:8765", ("192.168.1.5", 8765), frozenset())
    assert not host_allowed("evil.example:8765", ("127.0.0.1", 8765), frozenset())
    assert not host_allowed("[::1]x:8765", ("::1", 8765), frozenset())


def test_wrong_tokens_are_refused_at_once_and_never_lock_the_token_out(
    lone: Any, monkeypatch
) -> None:
    """A wrong token is refused at once, however many came before: a refusal never sleeps
    (waits would hold the server's connections for anyone who reaches the port), and the
    right token still gets its page."""
    import asyncio  # noqa: PLC0415

    slept: list[float] = []
    real_sleep = asyncio.sleep

    async def sleep(delay: float, *args: Any) -> Any:
        slept.append(delay)
        return await real_sleep(0, *args)

    monkeypatch.setattr(asyncio, "sleep", sleep)
    made = TestClient(make_app(lone, token=TOKEN), follow_redirects=False)
    for n in range(300):
        assert made.get(f"/?token=wrong-{n}").status_code == 403
    assert not [delay for delay in slept if delay > 0]
    assert made.get(f"/?token={TOKEN}").status_code == 303


def test_the_redirect_that_drops_the_token_stays_on_this_server(lone: Any) -> None:
    """A path that starts with `//` (which a Location would read as another host) is sent to
    this server's own path, one slash."""
    made = TestClient(make_app(lone, token=TOKEN), follow_redirects=False)
    for path, sent in (
        (f"//evil.example/?token={TOKEN}", "/evil.example/"),
        (f"///evil.example/x?token={TOKEN}&page=2", "/evil.example/x?page=2"),
    ):
        answer = made.get(f"http://testserver{path}")
        assert answer.status_code == 303
        assert answer.headers["location"] == sent


def test_a_token_in_the_url_is_taken_out_of_it(lone: Any) -> None:
    """A GET carrying a valid `?token=` sets the cookie and is sent (303) to the same URL
    without the token (the rest of its query kept), so it leaves the address bar."""
    made = TestClient(make_app(lone, token=TOKEN), follow_redirects=False)
    sent = made.get(f"/audit?kind=committed&token={TOKEN}&page=2")
    assert sent.status_code == 303
    assert sent.headers["location"] == "/audit?kind=committed&page=2"
    assert "set-cookie" in sent.headers
    assert made.get("/audit?kind=committed&page=2").status_code == 200


def test_a_query_number_in_other_digits_is_no_number(lone: Any) -> None:
    """`?page=²` or `?to=①` (digits to `isdigit`, not to `int`) are taken as no number, not a
    server error."""
    made = client(lone)
    for path in ("/?page=%C2%B2", "/audit?page=%C2%B9", "/?page=%D9%A3", "/tx/x?to=%E2%91%A0"):
        assert made.get(path).status_code in {200, 404}, path


def test_a_post_is_checked_before_its_body_is_read(lone: Any, monkeypatch) -> None:
    """A POST to a read-only server, or from another origin, is refused without its form
    being parsed; a form of more than `MAX_FIELDS` fields is refused (413); the headers
    forbid other form targets and `<base>`."""
    from agenttx._ui import _app  # noqa: PLC0415

    parsed: list[bytes] = []
    real = _app._parsed
    monkeypatch.setattr(_app, "_parsed", lambda body: parsed.append(body) or real(body))
    flood = "&".join(["x="] * 10_000)
    only_read = client(lone, read_only=True)
    answer = only_read.post("/inbox/r/approve", content=flood, headers={"origin": ORIGIN})
    assert answer.status_code == 403
    made = client(lone)
    evil = {"origin": "http://evil.example"}
    assert made.post("/inbox/r/approve", content=flood, headers=evil).status_code == 403
    assert parsed == []
    answer = made.post("/inbox/r/approve", content=flood, headers={"origin": ORIGIN})
    assert answer.status_code == 413
    assert "fields" in answer.text
    policy = made.get("/").headers["content-security-policy"]
    assert "form-action 'self'" in policy
    assert "base-uri 'none'" in policy


@agenttx.tool(name="echo", needs_approval=True)
def echo(text: str) -> dict[str, str]:
    return {"text": text}


@agenttx.tool(name="items", needs_approval=True)
def items(values: list[int]) -> dict[str, int]:
    return {"n": len(values)}


def _asked(store: Any, tool: Any, arguments: dict[str, Any]) -> tuple[Engine, str]:
    engine = Engine(tools=[tool], store=store, config=EngineConfig(idle_timeout=None))
    return engine, engine.begin(agent_id="asker").call(tool.name, arguments).approval.id


def test_large_arguments_get_no_edit_form(lone: Any) -> None:
    """Arguments over `EDIT_INLINE` are shown cut but not put in an edit text area: the inbox
    says they are too large to edit in the page, and stays small."""
    from agenttx._ui._inbox import EDIT_INLINE  # noqa: PLC0415

    engine, request = _asked(lone, echo, {"text": "<" * (EDIT_INLINE + 10)})
    page = client(lone).get("/inbox").text
    assert rows(page, "article", "request") == [{"request-id": request}]
    assert '<form class="edit"' not in page
    assert '<p class="edit-too-large">' in page
    assert '<form class="approve"' in page
    assert len(page) < 40_000
    engine.close()


def test_the_edit_diff_is_bounded(lone: Any, monkeypatch) -> None:
    """An edit of long arguments (more lines than `DIFF_LINES`) is not compared line by line
    (difflib's cost is quadratic): the flash sums up where they differ, in at most
    `DIFF_SHOWN` lines."""
    from agenttx._ui import _inbox  # noqa: PLC0415

    def refused(*_args: Any, **_kwargs: Any) -> Any:
        raise AssertionError("compared line by line")

    engine, request = _asked(lone, items, {"values": list(range(3_000))})
    monkeypatch.setattr(_inbox.difflib, "unified_diff", refused)
    edited = {"values": [-v if v == 1_500 else v for v in range(3_000)]}
    made = client(lone)
    said = flash_of(made, post(made, f"/inbox/{request}/edit", arguments=json.dumps(edited)))
    assert "with edited arguments" in said
    assert "too long to compare line by line" in said
    assert "they differ from line 1503" in said
    assert said.count("<span class=") <= _inbox.DIFF_SHOWN
    engine.close()


def test_control_and_bidi_characters_are_visible_in_the_edit_flash_and_404(lone: Any) -> None:
    """Arguments holding bidi overrides or controls are written in the edit text area as JSON
    escapes (the same value: an unchanged edit approves them exactly) with a visible warning;
    a flash and a 404 page show such characters written out."""
    text = "pay to 1234\u202e5678 GB\u2066x\u2069\x1b"
    engine, request = _asked(lone, echo, {"text": text})
    made = client(lone)
    page = made.get("/inbox").text
    area = re.search(r'<textarea name="arguments"[^>]*>(.*?)</textarea>', page, re.DOTALL)
    assert area is not None
    assert "\u202e" not in area.group(1)
    assert "\\u202e" in area.group(1)
    assert 'class="hidden-chars warning"' in page
    said = flash_of(made, post(made, f"/inbox/{request}/reject", reason="no \u202e\x07"))
    assert "\u202e" not in said
    assert "\x07" not in said
    assert "\\u202e" in said
    missing = made.get("/tx/nothing%00here%E2%80%AE")
    assert missing.status_code == 404
    assert "\x00" not in missing.text
    assert "\u202e" not in missing.text
    engine.close()


def test_an_unchanged_escaped_edit_approves_the_exact_arguments(lone: Any) -> None:
    """The escaped text of the edit area is the same JSON value: sent back unchanged, the
    approval carries the model's arguments exactly."""
    text = "a\u202eb\x1b"
    engine, request = _asked(lone, echo, {"text": text})
    made = client(lone)
    area = re.search(
        r'<textarea name="arguments"[^>]*>(.*?)</textarea>', made.get("/inbox").text, re.DOTALL
    )
    assert area is not None
    import html  # noqa: PLC0415

    sent = html.unescape(area.group(1))
    said = flash_of(made, post(made, f"/inbox/{request}/edit", arguments=sent))
    assert "approved" in said
    assert 'id="diff"' not in said  # the edit is the model's arguments, exactly
    assert requests_for(lone).get(request).state == "approved"
    engine.close()


@pytest.mark.timeout(120)
def test_a_postgres_lock_ends_a_page_and_a_decision_in_time(
    backend: Backend, filled: Filled
) -> None:
    """On PostgreSQL the page's stores (`open_target(..., statement_timeout=)`, as `agenttx
    ui` opens them) give up on a lock held elsewhere: the inbox says why in one line (404)
    and a decision says nothing was decided, instead of waiting for the lock's end."""
    if backend.kind != "postgres":
        pytest.skip("SQLite's own busy wait bounds it (tests above)")
    import psycopg  # noqa: PLC0415

    from agenttx._cli import open_target  # noqa: PLC0415

    reader = open_target(backend.text, 1.0, schema=backend.schema, statement_timeout=0.3).store
    writer = open_target(
        backend.text, 1.0, schema=backend.schema, write=True, statement_timeout=0.3
    ).store

    @contextlib.contextmanager
    def writing() -> Any:
        yield writer

    made = TestClient(make_app(reader, token=TOKEN, writer=writing), follow_redirects=False)
    made.get(f"/?token={TOKEN}")
    try:
        with psycopg.connect(backend.text) as conn:
            conn.execute(f"LOCK TABLE {backend.schema}.requests IN ACCESS EXCLUSIVE MODE")
            page = made.get("/inbox")
            assert page.status_code == 404
            assert '<p class="missing">' in page.text
            answer = post(made, f"/inbox/{filled.request}/approve")
            conn.rollback()
        said = flash_of(made, answer)
        assert '<div id="flash" class="error"' in said
        assert "nothing decided" in said or "not approved" in said
        assert requests_for(backend.make()).get(filled.request).state == "pending"
    finally:
        reader.close()
        writer.close()


def test_a_long_transaction_s_page_is_bounded_and_paged(lone: Any, monkeypatch) -> None:
    """A transaction of more steps than `MAX_ROWS` shows that many at a time, with a link to
    the next ones; past `MAX_DRAWN` boxes its graph says it is too large instead of drawing
    it; the runs listing reads an ended transaction's status without parsing its history;
    the audit page shows at most `MAX_EVENTS` events and says how many there were."""
    from agenttx._ui import _detail  # noqa: PLC0415

    engine = Engine(tools=[add], store=lone, config=EngineConfig(idle_timeout=None))
    tx = engine.begin(agent_id="looper")
    for number in range(_views.MAX_ROWS + 5):
        tx.call("add", {"n": number})
    made = client(lone)
    page = made.get(f"/tx/{tx.id}").text
    assert len(rows(page, cls="step")) == _views.MAX_ROWS
    assert f'<a id="next-steps" href="?first={_views.MAX_ROWS + 1}">' in page
    timeline = re.search(r'<ul id="timeline">(.*?)</ul>', page, re.DOTALL)
    assert timeline is not None
    assert timeline.group(1).count("<li>") == _views.MAX_ROWS
    rest = made.get(f"/tx/{tx.id}?first={_views.MAX_ROWS + 1}").text
    assert [row["step"] for row in rows(rest, cls="step")] == [
        str(step) for step in range(_views.MAX_ROWS + 1, _views.MAX_ROWS + 6)
    ]
    monkeypatch.setattr(_detail, "MAX_DRAWN", 100)
    page = made.get(f"/tx/{tx.id}").text
    assert re.search(r'<div id="graph"><svg[^>]*><text[^>]*>\d+ steps and attempts: too many', page)
    tx.commit()
    engine.close()

    def unread(_history: Any) -> Any:
        raise AssertionError("the listing parsed a whole history")

    monkeypatch.setattr(_views, "read_history", unread)
    assert rows(made.get("/").text) == [{"id": tx.id, "kind": "tx", "status": "COMMITTED"}]
    monkeypatch.undo()
    monkeypatch.setattr(_views, "MAX_EVENTS", 10)
    page = made.get("/audit").text
    assert len(rows(page, cls="event")) == 10
    assert '<p class="cut" id="audit-cut">The newest 10 of' in page


def test_a_page_that_cannot_read_in_time_says_the_store_is_busy(lone: Any, monkeypatch) -> None:
    """While another page's reads hold the store (one connection), a page waits at most
    `READ_WAIT` seconds, then says the store is busy in one line instead of holding a
    worker thread; static files never wait."""
    from agenttx._ui import _app  # noqa: PLC0415

    app = make_app(lone, token=TOKEN)
    made = TestClient(app, follow_redirects=False)
    made.get(f"/?token={TOKEN}")
    ui = next(route.endpoint.__self__ for route in app.routes if route.path == "/")
    monkeypatch.setattr(_app, "READ_WAIT", 0.01)
    with ui.reading:
        for path in ("/", "/inbox", "/audit", "/tx/x", "/plan/x"):
            answer = made.get(path)
            assert answer.status_code == 404, path
            assert "the store is busy" in answer.text
        assert made.get("/static/ui.css").status_code == 200
    assert made.get("/").status_code == 200
