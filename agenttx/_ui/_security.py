"""Who may use the page, and what it may do: the token, the CSRF token, the origin check, and
the headers of every response.

* Every request (pages, fragments, static files, POSTs) must carry the token: in the `token`
  query parameter, or the `agenttx_token` cookie that the first request with a valid query
  token sets (HttpOnly, SameSite=Strict, Path=/). Without it: 403, a short plain page.
  Tokens are compared with `hmac.compare_digest`.
* A write is a POST with the token, a form field `csrf` equal to `csrf_token(token)` (an HMAC
  of the token: a page from another site cannot know it) and an `Origin` (or, missing that, a
  `Referer`) that is the server's own origin; a browser that sends `Origin: null` (as Chromium
  does under `Referrer-Policy: no-referrer`) must send `Sec-Fetch-Site: same-origin`, and one
  that sends `Sec-Fetch-Site` at all must say `same-origin`. `--read-only` refuses every POST.
* Every response carries `HEADERS`: a Content-Security-Policy allowing nothing but the
  server's own scripts, styles and images (and `data:` images), no sniffing, no referrer, no
  framing.

`TokenGate` is a pure ASGI middleware (it sees every request, static files included);
`write_refusal` is what a POST handler asks before it decides anything.
"""

from __future__ import annotations

import hashlib
import hmac
import http.cookies
import re
import urllib.parse
from typing import TYPE_CHECKING, Final

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable, MutableMapping
    from typing import Any

    Scope = MutableMapping[str, Any]
    Message = MutableMapping[str, Any]
    Receive = Callable[[], Awaitable[Message]]
    Send = Callable[[Message], Awaitable[None]]
    ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

__all__ = [
    "COOKIE",
    "HEADERS",
    "MISSING",
    "TokenGate",
    "check_token",
    "csrf_token",
    "same_token",
    "write_refusal",
]

#: The cookie that carries the token after the first request.
COOKIE: Final = "agenttx_token"
#: The headers of every response.
HEADERS: Final = (
    (
        b"content-security-policy",
        b"default-src 'self'; img-src 'self' data:; style-src 'self'; script-src 'self'",
    ),
    (b"x-content-type-options", b"nosniff"),
    (b"referrer-policy", b"no-referrer"),
    (b"x-frame-options", b"DENY"),
)
#: The body of the refusal of a request without the token.
MISSING: Final = (
    "agenttx ui: the token is missing or wrong. Open the URL `agenttx ui` printed (it ends "
    "with ?token=...).\n"
)
_CSRF_KEY: Final = b"agenttx ui csrf"


#: What a token may hold: what `secrets.token_urlsafe` gives, and base64's `+/=` (it travels in
#: a URL's query and in a cookie, unquoted).
_TOKEN: Final = re.compile(r"[A-Za-z0-9_.~+/=-]{1,512}")


def check_token(token: object) -> str:
    """`token` if it can be the server's token, else `ValueError` saying what it may hold."""
    if not isinstance(token, str) or not _TOKEN.fullmatch(token):
        raise ValueError(
            "the token must be 1 to 512 letters, digits or `-._~+/=` (it travels in the URL "
            "and in a cookie)"
        )
    return token


def csrf_token(token: str) -> str:
    """The CSRF token of the server whose token is `token` (an HMAC of it: stable for the
    server's life, unknown to any page that does not have the token)."""
    return hmac.new(token.encode(), _CSRF_KEY, hashlib.sha256).hexdigest()


def same_token(given: str | None, token: str) -> bool:
    """Whether `given` is `token`, compared in constant time."""
    return given is not None and hmac.compare_digest(given.encode(), token.encode())


def _headers(scope: Scope) -> dict[str, str]:
    return {
        name.decode("latin-1").lower(): value.decode("latin-1")
        for name, value in scope.get("headers", ())
    }


def _cookie(headers: dict[str, str]) -> str | None:
    jar: http.cookies.SimpleCookie = http.cookies.SimpleCookie()
    try:
        jar.load(headers.get("cookie", ""))
    except http.cookies.CookieError:
        return None
    morsel = jar.get(COOKIE)
    return None if morsel is None else morsel.value


def _query_token(scope: Scope) -> str | None:
    query = urllib.parse.parse_qs(scope.get("query_string", b"").decode("latin-1"))
    values = query.get("token")
    return values[-1] if values else None


class TokenGate:
    """Refuses every HTTP request without the token (403, `MISSING`), sets the cookie when a
    valid token comes in the query, and adds `HEADERS` to every response."""

    def __init__(self, app: ASGIApp, *, token: str) -> None:
        self._app = app
        self._token = token

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self._app(scope, receive, send)
            return
        headers = _headers(scope)
        query = _query_token(scope)
        from_query = same_token(query, self._token)
        if not (from_query or same_token(_cookie(headers), self._token)):
            await _refuse(send, MISSING)
            return
        cookie = (
            f"{COOKIE}={self._token}; HttpOnly; SameSite=Strict; Path=/".encode()
            if from_query
            else None
        )

        async def sending(message: Message) -> None:
            if message["type"] == "http.response.start":
                extra = list(HEADERS)
                if cookie is not None:
                    extra.append((b"set-cookie", cookie))
                message["headers"] = [*message.get("headers", ()), *extra]
            await send(message)

        await self._app(scope, receive, sending)


async def _refuse(send: Send, text: str) -> None:
    body = text.encode()
    await send(
        {
            "type": "http.response.start",
            "status": 403,
            "headers": [
                (b"content-type", b"text/plain; charset=utf-8"),
                (b"content-length", str(len(body)).encode()),
                *HEADERS,
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})


def write_refusal(  # noqa: PLR0911 - one return a reason
    *,
    read_only: bool,
    token: str,
    csrf: object,
    origin: str | None,
    referer: str | None,
    own_origin: str,
    fetch_site: str | None = None,
) -> str | None:
    """Why a POST is refused (None: it may decide): the server is read-only, the CSRF token
    is missing or wrong, or the request comes from another origin: its `Origin`, or missing
    that its `Referer`, is not `own_origin` (`scheme://host:port`).

    A browser told `Referrer-Policy: no-referrer` (as every page here is) sends a form's POST
    with `Origin: null` and no `Referer`; then the browser's own `Sec-Fetch-Site` header
    (`fetch_site`, which no page can set) must say `same-origin`."""
    if read_only:
        return "this page is read-only (agenttx ui --read-only): it decides nothing"
    if not isinstance(csrf, str) or not hmac.compare_digest(
        csrf.encode(), csrf_token(token).encode()
    ):
        return "the form's CSRF token is missing or wrong: reload the page and try again"
    if fetch_site is not None and fetch_site != "same-origin":
        return "the request comes from another site: a decision must come from this page"
    if origin == "null" or (origin is None and not referer):
        if fetch_site == "same-origin":
            return None
        return "the request says no origin: a decision must come from this page"
    if origin is not None:
        came = origin
    else:
        parts = urllib.parse.urlsplit(referer or "")
        came = f"{parts.scheme}://{parts.netloc}"
    if came.lower() != own_origin.lower():
        return "the request comes from another origin: a decision must come from this page"
    return None
