"""The Starlette app of `agenttx ui` (`make_app`): its routes, each a thin handler over
`_views`, `_detail` and `_inbox`, its templates (Jinja2, autoescaped) and static files.

Every request passes `_security.TokenGate` first. GET handlers are plain functions (Starlette
runs them in its thread pool, so a store's blocking read never stalls the event loop); POST
handlers read the form, check `_security.write_refusal`, then decide in the thread pool, and
answer 303 to `/inbox?flash=ID` (the flash: what was decided, or why it was refused, and the
difference a refused edit made). A request carrying `X-Agenttx-Live: 1` (`ui.js`, every 2 s)
gets only the part of the page that changes (`#live`).
"""

from __future__ import annotations

import getpass
import secrets
import threading
import urllib.parse
from collections import OrderedDict
from importlib import resources
from typing import TYPE_CHECKING, Any, Final, TypeVar

import jinja2
from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.responses import HTMLResponse, PlainTextResponse, RedirectResponse, Response
from starlette.routing import Route

from .._cli import Failure, printable
from .._errors import AgentTxError
from ._detail import plan_page, transaction_page
from ._inbox import Decided, approve, edit, inbox, reject, resolve
from ._security import TokenGate, check_token, csrf_refusal, csrf_token, origin_refusal
from ._views import PageMissing, audit_page, runs_page

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable, Iterator
    from contextlib import AbstractContextManager

    from starlette.requests import Request

    from .._cli import CliStore

_T = TypeVar("_T")

__all__ = ["LIVE_HEADER", "MAX_FORM", "make_app"]

#: The header `ui.js` sends to ask for the changing part of a page only.
LIVE_HEADER: Final = "x-agenttx-live"
#: The largest form a POST may send (bytes): an edit up to 1 MiB of JSON, form-encoded.
MAX_FORM: Final = 4 * 1024 * 1024
#: The most fields a form may send (the inbox's forms send at most five).
MAX_FIELDS: Final = 16
#: What a page says instead of itself (404, one line): nothing to show, or a store it cannot
#: read (a file locked for the whole wait, rows it cannot decode).
_UNSHOWN: Final = (PageMissing, Failure, AgentTxError)
#: The longest a page waits for another page's reads to end before it says the store is
#: busy (seconds; a PostgreSQL statement of `agenttx ui` gives up after as long).
READ_WAIT: Final = 5.0
#: How many flashes (the outcome of the last decisions) the server keeps.
_FLASHES: Final = 256
_STATIC: Final = {"ui.css": "text/css; charset=utf-8", "ui.js": "text/javascript; charset=utf-8"}


def _default_actor() -> str:
    try:
        return f"ui:{getpass.getuser()}"
    except (OSError, KeyError, ImportError):  # no user name to be found
        return "ui:unknown"


def make_app(
    store: CliStore,
    *,
    token: str,
    read_only: bool = False,
    actor: str | None = None,
    writer: Callable[[], AbstractContextManager[CliStore]] | None = None,
    hosts: Iterable[str] = (),
) -> Starlette:
    """The app over `store` (read through the command line's readers), refusing every request
    without `token` (`ValueError` unless it is 1 to 512 URL-safe characters). `read_only`: no
    forms, every POST refused. `actor`: who the forms say decides (default `ui:<os user>`; a
    person may change it in the form). `writer` opens the
    store a decision is written through (default: `store` itself; `agenttx ui` opens a
    writable store for each decision, as `agenttx approve` does, and reads through a read-only
    one). `hosts`: the names, besides 127.0.0.1, localhost, [::1] and the address a request
    reached, that a request's `Host` may give (`agenttx ui --host NAME`); any other is
    refused (421)."""
    check_token(token)
    ui = _Ui(store, token=token, read_only=read_only, actor=actor or _default_actor())
    if writer is not None:
        ui.writer = writer
    routes = [
        Route("/", ui.runs),
        Route("/tx/{tx_id:path}", ui.transaction),
        Route("/plan/{run_id:path}", ui.plan),
        Route("/inbox", ui.inbox),
        Route("/inbox/{request_id}/approve", ui.approve, methods=["POST"]),
        Route("/inbox/{request_id}/reject", ui.reject, methods=["POST"]),
        Route("/inbox/{request_id}/edit", ui.edit, methods=["POST"]),
        Route("/reviews/{review_id}/resolve", ui.resolve, methods=["POST"]),
        Route("/audit", ui.audit),
        Route("/static/{name}", ui.static),
    ]
    app = Starlette(routes=routes)
    app.add_middleware(TokenGate, token=token, hosts=frozenset(hosts))
    return app


class _Ui:
    """The handlers, over one store."""

    def __init__(self, store: CliStore, *, token: str, read_only: bool, actor: str) -> None:
        self.store = store
        self.token = token
        self.read_only = read_only
        self.actor = actor
        self.csrf = csrf_token(token)
        self.writer: Callable[[], AbstractContextManager[CliStore]] = self._same_store
        self.flashes: OrderedDict[str, Decided] = OrderedDict()
        self.reading = threading.Lock()
        self.env = jinja2.Environment(
            loader=jinja2.PackageLoader("agenttx._ui", "templates"),
            autoescape=True,
            undefined=jinja2.StrictUndefined,
        )
        #: Text the server writes itself from what it was given (a flash, a 404's reason):
        #: its control and bidi characters written out, as every value's are.
        self.env.filters["visible"] = printable

    def _same_store(self) -> AbstractContextManager[CliStore]:
        import contextlib  # noqa: PLC0415

        @contextlib.contextmanager
        def same() -> Iterator[CliStore]:
            yield self.store

        return same()

    # ------------------------------------------------------------ rendering

    def _render(self, request: Request, name: str, page: str, **values: Any) -> Response:
        template = self.env.get_template(f"{name}.html")
        context = {
            "page_name": page,
            "read_only": self.read_only,
            "actor": self.actor,
            "csrf": self.csrf,
            "flash": None,
            "live": False,
            "here": request.url.path,
            **values,
        }
        if request.headers.get(LIVE_HEADER) == "1" and "live" in template.blocks:
            block = template.blocks["live"]
            text = "".join(block(template.new_context(context)))
            return HTMLResponse(text, headers={"cache-control": "no-store"})
        return HTMLResponse(template.render(context), headers={"cache-control": "no-store"})

    def _missing(self, request: Request, why: str) -> Response:
        response = self._render(request, "missing", "missing", why=why)
        response.status_code = 404
        return response

    # ------------------------------------------------------------ pages

    def runs(self, request: Request) -> Response:
        query = request.query_params
        filters = {key: query.get(key, "") for key in ("status", "agent", "kind")}
        try:
            found = self._read(
                runs_page, self.store, page=_page(query.get("page")), filters=filters
            )
        except _UNSHOWN as exc:
            return self._missing(request, str(exc))
        return self._render(
            request, "runs", "runs", view=found, live=True, link=_linker(filters), q=filters
        )

    def transaction(self, request: Request) -> Response:
        tx_id = request.path_params["tx_id"]
        to = _page(request.query_params.get("to"), default=None)
        first = _page(request.query_params.get("first"))
        try:
            found = self._read(transaction_page, self.store, tx_id, to=to, first=first)
        except _UNSHOWN as exc:
            return self._missing(request, str(exc))
        return self._render(request, "transaction", "transaction", view=found, live=found.open)

    def plan(self, request: Request) -> Response:
        try:
            found = self._read(plan_page, self.store, request.path_params["run_id"])
        except _UNSHOWN as exc:
            return self._missing(request, str(exc))
        return self._render(request, "plan", "plan", view=found, live=found.running)

    def inbox(self, request: Request) -> Response:
        flash = self.flashes.get(request.query_params.get("flash", ""))
        try:
            found = self._read(inbox, self.store)
        except _UNSHOWN as exc:
            return self._missing(request, str(exc))
        return self._render(request, "inbox", "inbox", view=found, live=True, flash=flash)

    def audit(self, request: Request) -> Response:
        query = request.query_params
        filters = {key: query.get(key, "") for key in ("kind", "actor", "run")}
        try:
            found = self._read(
                audit_page, self.store, page=_page(query.get("page")), filters=filters
            )
        except _UNSHOWN as exc:
            return self._missing(request, str(exc))
        return self._render(request, "audit", "audit", view=found, link=_linker(filters))

    def _read(self, read: Callable[..., _T], *args: Any, **kwargs: Any) -> _T:
        """`read(*args, **kwargs)`, one page's reads at a time (the store has one connection):
        a page that cannot start within `READ_WAIT` seconds says the store is busy
        (`PageMissing`) instead of holding a worker thread for as long as a lock lasts."""
        if not self.reading.acquire(timeout=READ_WAIT):
            raise PageMissing(
                f"the store is busy (another page has waited {READ_WAIT:g} s for it): "
                "try again in a moment"
            )
        try:
            return read(*args, **kwargs)
        finally:
            self.reading.release()

    async def static(self, request: Request) -> Response:
        name = request.path_params["name"]
        kind = _STATIC.get(name)
        if kind is None:
            return PlainTextResponse("no such file", status_code=404)
        body = resources.files("agenttx._ui").joinpath("static").joinpath(name).read_bytes()
        return Response(body, media_type=kind)

    # ------------------------------------------------------------ decisions

    async def _form(self, request: Request) -> dict[str, str] | Response:
        """The POST's form if it may decide, else the refusal (403, 413, 400). Whether it
        comes from this page (and the server writes at all) is checked before its body is
        read; the body is capped (`MAX_FORM` bytes, `MAX_FIELDS` fields) and parsed in a
        worker thread; then its CSRF token is checked."""
        why = origin_refusal(
            read_only=self.read_only,
            origin=request.headers.get("origin"),
            referer=request.headers.get("referer"),
            own_origin=f"{request.url.scheme}://{request.url.netloc}",
            fetch_site=request.headers.get("sec-fetch-site"),
        )
        if why is not None:
            return PlainTextResponse(f"agenttx ui: refused: {why}\n", status_code=403)
        size = request.headers.get("content-length")
        if size is not None and (not (size.isascii() and size.isdecimal()) or int(size) > MAX_FORM):
            return PlainTextResponse("the form is too large", status_code=413)
        chunks: list[bytes] = []
        read = 0
        async for chunk in request.stream():
            chunks.append(chunk)
            read += len(chunk)
            if read > MAX_FORM:
                return PlainTextResponse("the form is too large", status_code=413)
        form = await run_in_threadpool(_parsed, b"".join(chunks))
        if form is None:
            return PlainTextResponse(f"the form has more than {MAX_FIELDS} fields", status_code=413)
        why = csrf_refusal(self.token, form.get("csrf"))
        if why is not None:
            return PlainTextResponse(f"agenttx ui: refused: {why}\n", status_code=403)
        return form

    async def _decide(self, request: Request, decide: Callable[..., Decided]) -> Response:
        form = await self._form(request)
        if isinstance(form, Response):
            return form
        actor = form.get("actor", "").strip()
        if not actor:
            decided = Decided(said="refused: say who decides (actor)", refused=True)
        else:
            decided = await run_in_threadpool(self._write, decide, form, actor)
        key = secrets.token_urlsafe(12)
        self.flashes[key] = decided
        while len(self.flashes) > _FLASHES:
            self.flashes.popitem(last=False)
        return RedirectResponse(f"/inbox?flash={key}", status_code=303)

    def _write(self, decide: Callable[..., Decided], form: dict[str, str], actor: str) -> Decided:
        try:
            with self.writer() as store:
                return decide(store, form, actor)
        except (Failure, AgentTxError) as exc:  # the store could not be opened or written
            return Decided(said=f"nothing decided: {exc}", refused=True)

    async def approve(self, request: Request) -> Response:
        request_id = request.path_params["request_id"]
        return await self._decide(
            request, lambda store, _form, actor: approve(store, request_id, actor=actor)
        )

    async def reject(self, request: Request) -> Response:
        request_id = request.path_params["request_id"]
        return await self._decide(
            request,
            lambda store, form, actor: reject(
                store, request_id, actor=actor, reason=form.get("reason", "")
            ),
        )

    async def edit(self, request: Request) -> Response:
        request_id = request.path_params["request_id"]
        return await self._decide(
            request,
            lambda store, form, actor: edit(
                store, request_id, actor=actor, text=form.get("arguments", "")
            ),
        )

    async def resolve(self, request: Request) -> Response:
        review_id = request.path_params["review_id"]
        return await self._decide(
            request,
            lambda store, form, actor: resolve(
                store,
                review_id,
                actor=actor,
                outcome=form.get("outcome", ""),
                output=form.get("output", "null"),
            ),
        )


def _parsed(body: bytes) -> dict[str, str] | None:
    """A form's fields (the last of a name wins); None if it has more than `MAX_FIELDS`."""
    try:
        fields = urllib.parse.parse_qs(
            body.decode("utf-8", "replace"), keep_blank_values=True, max_num_fields=MAX_FIELDS
        )
    except ValueError:  # more fields than that
        return None
    return {key: values[-1] for key, values in fields.items()}


def _page(text: str | None, default: int | None = 1) -> Any:
    """A page number (or a step) from the query (ASCII digits only: `int` refuses `²`);
    `default` if missing or not a number."""
    if text is None or not (text.isascii() and text.isdecimal()) or len(text) > 9:
        return default
    return int(text)


def _linker(filters: dict[str, str]) -> Callable[[int], str]:
    """The query string of page N with the same filters."""

    def link(page: int) -> str:
        kept = {key: value for key, value in filters.items() if value}
        return "?" + urllib.parse.urlencode({**kept, "page": page})

    return link
