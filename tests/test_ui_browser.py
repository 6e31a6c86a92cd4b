"""`agenttx ui` in a real browser: headless Chromium (Playwright) against the `agenttx ui`
command as a process, with agent and plan processes deciding and changing what it shows.

Each page is saved as a screenshot under the test's temporary folder and checked: not blank
(more than one colour) and its key texts in the page's DOM. Skipped, with the reason, where
Chromium or Playwright is missing, unless `AGENTTX_REQUIRE_CHROMIUM=1` (CI) makes them required.
"""

from __future__ import annotations

import contextlib
import functools
import http.server
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import threading
import time
from typing import TYPE_CHECKING, Any

import pytest

import agenttx
from _ui_fixtures import (
    AGENT,
    PLAN,
    ROOT,
    Backend,
    Server,
    backend_of,
    child_env,
    effects,
    finish,
    first_line,
    kill,
    png_colours,
    reap,
    spawn,
    ui_server,
)
from agenttx import builtins
from agenttx.stores import SQLiteStore

if TYPE_CHECKING:
    from collections.abc import Iterator
    from pathlib import Path

pytestmark = pytest.mark.timeout(300)

#: Set to 1 (CI) to fail, rather than skip, when Chromium or Playwright is missing.
REQUIRE = "AGENTTX_REQUIRE_CHROMIUM"
#: How long Playwright waits for a page to show what a test expects: a hang guard, in ms.
PATIENCE = 60_000


@pytest.fixture(autouse=True)
def _reaped() -> Iterator[None]:
    """No agent or plan process outlives its test."""
    yield
    reap()


def _missing() -> str | None:
    """Why the browser tests cannot run here, or None."""
    for module, extra in (("playwright", "test-ui"), ("uvicorn", "ui"), ("starlette", "ui")):
        if importlib.util.find_spec(module) is None:
            return f"{module} is not installed: pip install 'agenttx[{extra}]'"
    if shutil.which("chromium") is None:
        return "no `chromium` on PATH (Debian: apt-get install chromium)"
    return None


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    """Headless Chromium: Debian's, driven by Playwright (never Playwright's own download)."""
    missing = _missing()
    if missing is not None:
        if os.environ.get(REQUIRE) == "1":
            pytest.fail(f"{missing}; {REQUIRE}=1 requires the browser tests", pytrace=False)
        pytest.skip(missing)
    from playwright.sync_api import expect, sync_playwright  # noqa: PLC0415

    expect.set_options(timeout=PATIENCE)
    with sync_playwright() as playwright:
        chromium = playwright.chromium.launch(
            executable_path=shutil.which("chromium"), args=["--no-sandbox"]
        )
        yield chromium
        chromium.close()


@pytest.fixture
def page(browser: Any) -> Iterator[Any]:
    """A new page in a context of its own (no cookie from another test); no script error."""
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    context.set_default_timeout(PATIENCE)
    opened = context.new_page()
    errors: list[str] = []
    opened.on("pageerror", lambda error: errors.append(str(error)))
    yield opened
    context.close()
    assert errors == [], f"the page's scripts failed: {errors}"


def shot(page: Any, folder: Path, name: str, *texts: str) -> Path:
    """Save the page as `folder/NAME.png`; check that it is not blank and that the page's
    DOM holds each of `texts`."""
    path = folder / f"{name}.png"
    page.screenshot(path=str(path), full_page=True)
    assert png_colours(path) > 2, f"the screenshot {path} is blank"
    shown = page.locator("body").inner_text()
    for text in texts:
        assert text in shown, f"{text!r} is not on the page {page.url}:\n{shown}"
    return path


def _expect() -> Any:
    from playwright.sync_api import expect  # noqa: PLC0415

    return expect


def _submit(page: Any, form: Any) -> None:
    """Click the form's submit button and wait for the page it leads to (the inbox)."""
    with page.expect_navigation():
        form.locator("button, input[type=submit]").first.click()


def _empty_store(tmp_path: Path) -> str:
    db = tmp_path / "ui.db"
    SQLiteStore(db).close()
    return str(db)


def _waiting_agent(
    db: str, root: Path, *options: str
) -> tuple[subprocess.Popen[str], dict[str, Any]]:
    agent = spawn(AGENT, "wait", db, str(root), *options)
    return agent, first_line(agent)


@pytest.fixture(params=["sqlite", "postgres"])
def backend(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Backend]:
    """The store the agent and `agenttx ui` share: a SQLite file, or a PostgreSQL DSN."""
    with backend_of(request.param, tmp_path) as made:
        yield made


def _open_request(page: Any, server: Server, request_id: str, folder: Path) -> Any:
    """Open the runs page with the URL `agenttx ui` printed, then the inbox by its link; the
    request is listed with its tool and arguments."""
    page.goto(server.url)
    expect = _expect()
    expect(page.locator("main#page")).to_have_attribute("data-page", "runs")
    page.locator("a#nav-inbox").click()
    expect(page.locator("main#page")).to_have_attribute("data-page", "inbox")
    request = page.locator(f'#inbox .request[data-request-id="{request_id}"]')
    expect(request.locator(".tool")).to_contain_text("charge")
    expect(request.locator("pre.args")).to_contain_text("4242")
    shot(page, folder, "inbox", "charge", "4242")
    return request


# ---------------------------------------------------------------------- 1. approve


def test_a_charge_approved_in_the_inbox_runs_and_its_run_is_shown_committed(
    page, backend, tmp_path
):
    """The agent waits on a charge; approved in the page, the charge runs once, the agent
    commits, and the runs page and the transaction's page show it committed (on a SQLite
    file and on a PostgreSQL DSN)."""
    agent, asked = _waiting_agent(backend.target, tmp_path, *backend.options)
    expect = _expect()
    with ui_server(backend.target, "--actor", "alice", *backend.options) as server:
        request = _open_request(page, server, asked["request"], tmp_path)
        _submit(page, request.locator("form.approve"))
        flash = page.locator("#flash")
        expect(flash).to_contain_text(re.compile("approved", re.IGNORECASE))
        expect(flash).not_to_have_class(re.compile(r"\berror\b"))
        expect(page.locator(f'.request[data-request-id="{asked["request"]}"]')).to_have_count(0)
        shot(page, tmp_path, "approved")
        done = finish(agent)
        assert (done["answer"]["ok"], done["status"]) == (True, "COMMITTED")
        assert [effect["amount"] for effect in effects(tmp_path)] == [500]
        page.locator("a#nav-runs").click()
        run = page.locator(f'#runs tr.run[data-id="{asked["tx"]}"]')
        expect(run).to_have_attribute("data-status", "COMMITTED")
        expect(run).to_have_attribute("data-kind", "tx")
        shot(page, tmp_path, "runs", "COMMITTED", "ui-agent")
        run.locator("a.run-link").click()
        expect(page.locator("main#page")).to_have_attribute("data-page", "transaction")
        expect(page.locator('#steps tr.step[data-step="1"]')).to_contain_text("charge")
        expect(page.locator("#graph svg")).to_have_count(1)
        shot(page, tmp_path, "transaction", "charge")


def test_an_approval_in_the_page_is_consumed_once_across_a_sigkill_of_the_agent(
    page, backend, tmp_path
):
    """Approved in the page, the agent is SIGKILLed once it saw the approval, before sending
    the call again; restarted (recover, restore), it charges exactly once."""
    (tmp_path / "hold-decided").write_text("")
    agent, asked = _waiting_agent(backend.target, tmp_path, *backend.options)
    with ui_server(backend.target, "--actor", "alice", *backend.options) as server:
        request = _open_request(page, server, asked["request"], tmp_path)
        _submit(page, request.locator("form.approve"))
        _expect()(page.locator("#flash")).to_contain_text(re.compile("approved", re.IGNORECASE))
        while not (tmp_path / "hold-decided.reached").exists():
            assert agent.poll() is None, agent.communicate()
            time.sleep(0.02)
        assert effects(tmp_path) == []
        kill(agent)
        (tmp_path / "hold-decided").unlink()
        restarted = spawn(
            AGENT, "resume", backend.target, str(tmp_path), asked["tx"], *backend.options
        )
        resumed = finish(restarted)
        assert (resumed["answer"]["ok"], resumed["status"]) == (True, "COMMITTED")
        assert len(effects(tmp_path)) == 1
        page.goto(server.page(f"/tx/{asked['tx']}"))
        expect = _expect()
        expect(page.locator('#steps tr.step[data-step="1"]')).to_contain_text("charge")
        shot(page, tmp_path, "after-restart", "charge")


def test_a_request_made_while_the_inbox_is_open_appears_without_a_reload(page, tmp_path):
    """The inbox is live: a charge an agent asks for while the page is open shows up in it,
    with its forms, without the page being reloaded."""
    db = _empty_store(tmp_path)
    expect = _expect()
    with ui_server(db, "--actor", "alice") as server:
        page.goto(server.page("/inbox"))
        main = page.locator("main#page")
        expect(main).to_have_attribute("data-page", "inbox")
        expect(main).to_have_attribute("data-live", re.compile(r"\d"))
        expect(page.locator("#inbox .request")).to_have_count(0)
        page.evaluate("window.__notReloaded = true")
        _, asked = _waiting_agent(db, tmp_path)
        request = page.locator(f'#inbox .request[data-request-id="{asked["request"]}"]')
        expect(request.locator("form.approve")).to_have_count(1)
        expect(request.locator(".tool")).to_contain_text("charge")
        assert page.evaluate("window.__notReloaded") is True
        shot(page, tmp_path, "inbox-live", "charge", "4242")


# ---------------------------------------------------------------------- 2. reject


def test_a_charge_rejected_with_a_reason_gives_the_agent_the_reason(page, tmp_path):
    """Rejected in the page with a reason: the agent's call is answered with the person and
    the reason, and nothing is charged."""
    db = _empty_store(tmp_path)
    agent, asked = _waiting_agent(db, tmp_path)
    reason = "the card was reported stolen this morning"
    with ui_server(db, "--actor", "alice") as server:
        request = _open_request(page, server, asked["request"], tmp_path)
        form = request.locator("form.reject")
        form.locator("textarea[name=reason]").fill(reason)
        _submit(page, form)
        flash = page.locator("#flash")
        _expect()(flash).to_contain_text(re.compile("rejected", re.IGNORECASE))
        _expect()(flash).not_to_have_class(re.compile(r"\berror\b"))
        shot(page, tmp_path, "rejected")
        done = finish(agent)
    assert done["answer"]["ok"] is False
    assert done["answer"]["rejection"] == {"by": "alice", "reason": reason}
    assert effects(tmp_path) == []


# ---------------------------------------------------------------------- 3. edit


def test_an_edit_that_does_not_fit_is_explained_then_a_valid_edit_runs(page, tmp_path):
    """An edit against the tool's schema is refused with the reason and the difference from
    the model's arguments, and the request still waits; a valid edit is accepted and the
    agent's call runs with it."""
    db = _empty_store(tmp_path)
    agent, asked = _waiting_agent(db, tmp_path)
    expect = _expect()
    with ui_server(db, "--actor", "alice") as server:
        request = _open_request(page, server, asked["request"], tmp_path)
        arguments = request.locator("form.edit textarea[name=arguments]")
        assert json.loads(arguments.input_value()) == {"amount": 500, "card": "4242"}
        arguments.fill('{"amount": "five hundred", "card": "4242"}')
        _submit(page, request.locator("form.edit"))
        expect(page.locator("#flash.error")).to_contain_text("amount")
        expect(page.locator("#diff")).to_contain_text("five hundred")
        shot(page, tmp_path, "refused-edit", "five hundred")
        request = page.locator(f'.request[data-request-id="{asked["request"]}"]')
        expect(request).to_have_count(1)  # still waiting
        assert agent.poll() is None
        request.locator("form.edit textarea[name=arguments]").fill(
            '{"amount": 300, "card": "4242"}'
        )
        _submit(page, request.locator("form.edit"))
        expect(page.locator("#flash")).not_to_have_class(re.compile(r"\berror\b"))
        expect(page.locator(f'.request[data-request-id="{asked["request"]}"]')).to_have_count(0)
        shot(page, tmp_path, "edited")
        done = finish(agent)
    assert done["answer"]["ok"] is True
    assert done["answer"]["output"]["amount"] == 300
    assert [effect["amount"] for effect in effects(tmp_path)] == [300]


# ---------------------------------------------------------------------- 4. the demo's graph


def test_the_demos_transaction_shows_its_rewound_attempts_and_root_cause(page, tmp_path):
    """After `python -m agenttx demo`, the transaction's graph marks the rewound attempts,
    the compensated one and the root cause of the rewind (step 1)."""
    demo = subprocess.run(
        [sys.executable, "-m", "agenttx", "demo", "--dir", str(tmp_path / "demo")],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
        env=child_env(),
        cwd=ROOT,
    )
    found = re.search(r"agenttx inspect \S+ ([0-9a-f-]{36})$", demo.stdout, re.MULTILINE)
    assert found is not None, demo.stdout
    tx = found[1]
    expect = _expect()
    with ui_server(str(tmp_path / "demo" / "agenttx.db")) as server:
        page.goto(server.page(f"/tx/{tx}"))
        expect(page.locator("main#page")).to_have_attribute("data-page", "transaction")
        graph = page.locator("#graph svg")
        expect(graph).to_have_count(1)
        assert graph.locator("g.node.rewound").count() >= 2
        assert graph.locator("g.node.compensated").count() >= 1
        causes = graph.locator("g.node.root-cause")
        assert causes.count() >= 1
        assert {causes.nth(i).get_attribute("data-id") for i in range(causes.count())} == {"1"}
        assert graph.locator("path.edge.explicit").count() >= 2
        assert "record.insert" in graph.text_content()
        expect(page.locator("#timeline")).to_contain_text("record.insert")
        shot(page, tmp_path, "demo-transaction", "record.insert", "fs.write")


def test_an_open_transactions_page_shows_a_new_step_without_a_reload(page, tmp_path):
    """The page of an open transaction is live: a step the agent runs while it is open
    appears in its steps and its graph, without the page being reloaded."""

    @agenttx.tool
    def note(text: str) -> dict:
        """Write a note.

        Args:
            text: the note
        """
        return {"noted": text}

    db = _empty_store(tmp_path)
    expect = _expect()
    with SQLiteStore(db) as store:
        tx = agenttx.Engine(tools=[note], store=store).begin(agent_id="writer")
        assert tx.call("note", {"text": "first"}).ok
        with ui_server(db) as server:
            page.goto(server.page(f"/tx/{tx.id}"))
            main = page.locator("main#page")
            expect(main).to_have_attribute("data-page", "transaction")
            expect(main).to_have_attribute("data-live", re.compile(r"\d"))
            expect(page.locator('#steps tr.step[data-step="1"]')).to_contain_text("note")
            expect(page.locator("#steps tr.step")).to_have_count(1)
            page.evaluate("window.__notReloaded = true")
            assert tx.call("note", {"text": "second"}).ok
            expect(page.locator('#steps tr.step[data-step="2"]')).to_contain_text("note")
            expect(page.locator('#graph svg g.node[data-id="2"]')).to_have_count(1)
            assert page.evaluate("window.__notReloaded") is True
            shot(page, tmp_path, "transaction-live", "second")
        tx.rollback()


def test_the_runs_page_shows_a_commit_without_a_reload(page, tmp_path):
    """The runs page is live: a transaction that commits while it is open turns COMMITTED
    there, and one begun meanwhile is added, without the page being reloaded."""

    @agenttx.tool
    def note(text: str) -> dict:
        """Write a note.

        Args:
            text: the note
        """
        return {"noted": text}

    db = _empty_store(tmp_path)
    expect = _expect()
    with SQLiteStore(db) as store:
        engine = agenttx.Engine(tools=[note], store=store)
        tx = engine.begin(agent_id="writer")
        assert tx.call("note", {"text": "first"}).ok
        with ui_server(db) as server:
            page.goto(server.url)
            run = page.locator(f'#runs tr.run[data-id="{tx.id}"]')
            expect(run).to_have_attribute("data-status", "OPEN")
            page.evaluate("window.__notReloaded = true")
            tx.commit()
            later = engine.begin(agent_id="reader")
            expect(run).to_have_attribute("data-status", "COMMITTED")
            expect(page.locator(f'#runs tr.run[data-id="{later.id}"]')).to_have_count(1)
            assert page.evaluate("window.__notReloaded") is True
            shot(page, tmp_path, "runs-live", "COMMITTED", "reader")
        later.rollback()


def test_the_rewind_preview_says_what_a_rollback_would_undo_and_does_nothing(page, tmp_path):
    """On an open transaction's page, picking step 1 in the rewind preview lists the steps a
    rollback would void, the compensation it would run, the staged email it would drop and
    what it cannot undo; nothing is rewound."""

    @agenttx.tool
    def notify(text: str) -> dict:
        """Send a text message (it cannot be taken back).

        Args:
            text: the message
        """
        return {"sent": text}

    db = _empty_store(tmp_path)
    files = tmp_path / "files"
    expect = _expect()
    with SQLiteStore(db) as store:
        tools = [*builtins.tools(str(files)), notify]
        tx = agenttx.Engine(tools=tools, store=store).begin(agent_id="shop")
        assert tx.call("kv.put", {"key": "stock/SKU-1", "value": {"reserved": 2}}).ok
        assert tx.call("fs.write", {"path": "receipt.txt", "contents": "1 x SKU-1"}).ok
        assert tx.call("effect.stage", {"channel": "email", "payload": {"to": "a@x.io"}}).ok
        assert tx.call("notify", {"text": "your order is on its way"}).ok
        with ui_server(db) as server:
            page.goto(server.page(f"/tx/{tx.id}"))
            form = page.locator("form#preview")
            form.locator("select[name=to]").select_option("1")
            with page.expect_navigation():
                form.locator("button, input[type=submit]").first.click()
            expect(page.locator("#preview-result")).to_have_count(1)
            void = page.locator("#preview-void")
            for tool in ("kv.put", "fs.write", "effect.stage", "notify"):
                expect(void).to_contain_text(tool)
            expect(page.locator("#preview-compensate")).to_contain_text("fs.restore_file")
            expect(page.locator("#preview-drop")).to_contain_text("email")
            expect(page.locator("#preview-irreversible")).to_contain_text("notify")
            shot(page, tmp_path, "preview", "fs.restore_file", "notify")
        assert (files / "receipt.txt").read_text() == "1 x SKU-1"  # nothing was undone
        assert tx.next_step_id == 5
        tx.rollback()


# ---------------------------------------------------------------------- 5. a live plan run


def test_a_live_plan_runs_nodes_change_state_on_the_open_page(page, tmp_path):
    """With the plan run's page open, its nodes go from running to succeeded, each as its
    gate opens, without the page being reloaded."""
    db = _empty_store(tmp_path)
    plan = spawn(PLAN, db, str(tmp_path))
    assert first_line(plan) == {"run": "live-1"}
    expect = _expect()
    first = page.locator('#dag g.node[data-id="first"]')
    second = page.locator('#dag g.node[data-id="second"]')
    try:
        with ui_server(db) as server:
            page.goto(server.page("/plan/live-1"))
            main = page.locator("main#page")
            expect(main).to_have_attribute("data-page", "plan")
            expect(main).to_have_attribute("data-live", re.compile(r"\d"))
            expect(page.locator("#gantt svg")).to_have_count(1)
            page.evaluate("window.__notReloaded = true")
            expect(first).to_have_class(re.compile(r"\brunning\b"))
            expect(second).to_have_class(re.compile(r"\bpending\b"))
            shot(page, tmp_path, "plan-running", "first", "second")
            (tmp_path / "go-first").write_text("")
            expect(first).to_have_class(re.compile(r"\bsucceeded\b"))
            expect(second).to_have_class(re.compile(r"\brunning\b"))
            (tmp_path / "go-second").write_text("")
            expect(second).to_have_class(re.compile(r"\bsucceeded\b"))
            assert page.evaluate("window.__notReloaded") is True
            shot(page, tmp_path, "plan-succeeded", "first", "second")
            done = finish(plan)
    finally:
        for gate in ("go-first", "go-second"):
            (tmp_path / gate).write_text("")
        if plan.poll() is None:
            plan.communicate(timeout=120)
    assert done == {"status": "SUCCEEDED", "states": {"first": "SUCCEEDED", "second": "SUCCEEDED"}}


# ---------------------------------------------------------------------- 6. no token


def test_a_page_without_the_token_is_refused(page, tmp_path):
    """Without the token (or with a wrong one), pages, static files and writes get 403 and a
    page saying the token is missing."""
    db = _empty_store(tmp_path)
    with ui_server(db) as server:
        for path in ("/", "/inbox", "/audit", "/static/ui.js", "/?token=not-the-token"):
            response = page.goto(server.origin + path)
            assert response.status == 403, path
            assert "token" in page.locator("body").inner_text().lower(), path
        shot(page, tmp_path, "refused", "token")
        posted = page.request.post(server.origin + "/inbox/apr-x/approve", form={"actor": "x"})
        assert posted.status == 403
        assert server.token not in page.content()


@contextlib.contextmanager
def _other_site(folder: Path) -> Iterator[str]:
    """A web server of another origin on this host (another port: the same site, so the
    browser sends it the `SameSite=Strict` cookie), serving the files of `folder`."""
    handler = functools.partial(_Quiet, directory=str(folder))
    with http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler) as other:
        thread = threading.Thread(target=other.serve_forever, daemon=True)
        thread.start()
        try:
            yield f"http://127.0.0.1:{other.server_address[1]}"
        finally:
            other.shutdown()
            thread.join()


class _Quiet(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args: object) -> None:
        """Say nothing of each request."""


def test_a_read_only_server_shows_what_waits_and_decides_nothing(page, tmp_path):
    """`agenttx ui --read-only`: the inbox lists the waiting charge with no form, and a POST
    from the page itself, with the token's cookie, is refused."""
    db = _empty_store(tmp_path)
    agent, asked = _waiting_agent(db, tmp_path)
    with ui_server(db, "--read-only") as server:
        page.goto(server.page("/inbox"))
        request = page.locator(f'#inbox .request[data-request-id="{asked["request"]}"]')
        _expect()(request.locator(".tool")).to_contain_text("charge")
        assert page.locator("form.approve, form.reject, form.edit, form.resolve").count() == 0
        shot(page, tmp_path, "read-only-inbox", "charge", "4242")
        status = page.evaluate(
            """async (path) => (await fetch(path, {method: "POST",
                body: new URLSearchParams({actor: "alice"})})).status""",
            f"/inbox/{asked['request']}/approve",
        )
        assert status == 403
        page.goto(server.page("/inbox"))
        _expect()(request).to_have_count(1)
    assert agent.poll() is None  # still waiting for a decision
    assert effects(tmp_path) == []


#: A page that sends no referrer: its form's POST says `Origin: null`.
NO_REFERRER = '<meta name="referrer" content="no-referrer">'


def test_a_decision_posted_from_another_origin_is_refused(page, tmp_path):
    """A page of another origin on this host posts the approve form, with the cookie the
    browser sends it and even the CSRF token: refused (403), with its Origin and with none
    (`no-referrer`); the request still waits."""

    @agenttx.tool(needs_approval=True)
    def wire(amount: int) -> dict:
        """Wire money.

        Args:
            amount: pence
        """
        return {"amount": amount}

    db = _empty_store(tmp_path)
    site = tmp_path / "site"
    site.mkdir()
    with SQLiteStore(db) as store:
        tx = agenttx.Engine(tools=[wire], store=store).begin(agent_id="victim")
        request = tx.call("wire", {"amount": 100_000}).approval
        with ui_server(db) as server:
            page.goto(server.page("/inbox"))  # the person's page: the browser keeps the cookie
            approve = page.locator(f'.request[data-request-id="{request.id}"] form.approve')
            csrf = approve.locator("input[name=csrf]").input_value()  # as if it leaked
            for name, head in (("origin", ""), ("no-origin", NO_REFERRER)):
                (site / f"{name}.html").write_text(
                    f"<html><head>{head}</head><body>"
                    f'<form method="post" action="{server.origin}/inbox/{request.id}/approve">'
                    f'<input name="csrf" value="{csrf}"><input name="actor" value="mallory">'
                    '<button type="submit">win a prize</button></form></body></html>'
                )
            with _other_site(site) as other:
                for name in ("origin", "no-origin"):
                    page.goto(f"{other}/{name}.html")
                    with page.expect_navigation() as sent:
                        page.locator("button").click()
                    assert sent.value.status == 403, name
                    assert "refused" in page.locator("body").inner_text(), name
            shot(page, tmp_path, "cross-origin-refused", "refused")
            page.goto(server.page("/inbox"))
            _expect()(page.locator(f'.request[data-request-id="{request.id}"]')).to_have_count(1)
        assert [r.id for r in agenttx.Engine(store=store).pending_approvals()] == [request.id]
        tx.rollback()


# ---------------------------------------------------------------------- 7. hostile strings

HOSTILE = (
    '<script>window.__pwned = 1</script><img src="x" onerror="window.__pwned = 2">'
    "\x1b[31mRED\x1b[0m \x1b]0;title\x07 end"
)


def test_scripts_and_escape_codes_from_an_agent_are_shown_as_text(page, tmp_path):
    """A run whose arguments and outputs hold a script, an HTML handler and terminal escape
    codes: each page shows them as text; nothing runs, no element is made from them."""

    @agenttx.tool
    def echo(text: str) -> dict:
        """Say it back.

        Args:
            text: what to say
        """
        return {"said": text}

    @agenttx.tool(needs_approval=True)
    def wire(note: str) -> dict:
        """Wire money, with a note.

        Args:
            note: the note
        """
        return {"note": note}

    db = _empty_store(tmp_path)
    with SQLiteStore(db) as store:
        engine = agenttx.Engine(tools=[echo, wire], store=store)
        ended = engine.begin(agent_id=HOSTILE)
        assert ended.call("echo", {"text": HOSTILE}).ok
        ended.commit()
        waiting = engine.begin(agent_id=HOSTILE)
        request = waiting.call("wire", {"note": HOSTILE}).approval
        with ui_server(db) as server:
            for name, path, holder in (
                ("hostile-runs", "/", "#runs"),
                ("hostile-transaction", f"/tx/{ended.id}", "#steps"),
                ("hostile-inbox", "/inbox", f'.request[data-request-id="{request.id}"]'),
                ("hostile-audit", "/audit", "#audit"),
            ):
                page.goto(server.page(path))
                page.locator("details").evaluate_all("found => found.forEach(d => d.open = true)")
                shown = page.locator(holder).first.inner_text()  # what a person sees
                if name != "hostile-audit":  # the trail need not quote the values
                    assert "<script>window.__pwned = 1</script>" in shown, shown
                    assert "[31mRED" in shown
                assert "\x1b" not in shown  # an escape is shown as text, not passed through
                assert page.evaluate("typeof window.__pwned") == "undefined"
                assert page.locator('img[src="x"]').count() == 0
                scripts = page.locator("script")
                for i in range(scripts.count()):
                    assert "__pwned" not in (scripts.nth(i).text_content() or "")
                shot(page, tmp_path, name)
        waiting.rollback()
