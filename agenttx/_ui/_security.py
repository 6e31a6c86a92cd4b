"""Who may use the page, and what it may do: the token, the session cookie, the CSRF token,
the Host and origin checks, and the headers of every response.

* Every request (pages, fragments, static files, POSTs) must carry the token in the `token`
  query parameter, or the session cookie that a GET with a valid query token sets (then
  answered 303 to the same URL without the token, so it leaves the address bar).
  The cookie is `agenttx_session_PORT` (one per server: two servers on one host keep their
  own), HttpOnly, SameSite=Strict, Path=/; its value is `session_secret(token)`, an HMAC of
  the token, never the token itself: a cookie read elsewhere (cookies ignore ports) gives
  neither the token nor the CSRF token. Without either: 403, a short plain page, at once
  (a refusal holds no connection: a token of 32 characters or more cannot be guessed, and
  waits would let anyone who reaches the port hold the server's connections and lock the
  approver out). Compared with `hmac.compare_digest`. A request whose `Host` is
  not the server's own address (`127.0.0.1`, `localhost`, `[::1]`, the address it was reached
  on, or a name given to `make_app`) is refused (421) before anything else: a page of another
  name resolving to 127.0.0.1 (DNS rebinding) is not this page's origin.
* A write is a POST from this page (`origin_refusal`, checked before the body is read): an
  `Origin` (or, missing that, a `Referer`) that is the server's own origin; a browser that
  sends `Origin: null` (as Chromium does under `Referrer-Policy: no-referrer`) must send
  `Sec-Fetch-Site: same-origin`, and one that sends `Sec-Fetch-Site` at all must say
  `same-origin`. Then the form's field `csrf` must equal `csrf_token(token)` (an HMAC of the
  token under another key; only the pages hold it). `--read-only` refuses every POST.
* Every response carries `HEADERS`: a Content-Security-Policy allowing nothing but the
  server's own scripts, styles, images (and `data:` images) and form targets, no `<base>`, no
  sniffing, no referrer, no framing.

`TokenGate` is a pure ASGI middleware (it sees every request, static files included);
`write_refusal` is what a POST handler asks before it decides anything.
"""

from __future__ import annotations

import hashlib
import hmac
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
    "cookie_name",
    "cookies",
    "csrf_refusal",
    "csrf_token",
    "host_allowed",
    "origin_refusal",
    "same_token",
    "session_secret",
    "write_refusal",
]

#: The session cookie's name, before the server's port.
COOKIE: Final = "agenttx_session_"
#: The headers of every response.
HEADERS: Final = (
    (
        b"content-security-policy",
        (
            b"default-src 'self'; img-src 'self' data:; style-src 'self'; script-src 'self'; "
            b"form-action 'self'; base-uri 'none'"
        ),
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
#: Refused because of its Host (421).
MISDIRECTED: Final = (
    "agenttx ui: this server answers only at its own address (127.0.0.1, localhost or the "
    "--host it was given): open the URL `agenttx ui` printed.\n"
)
_CSRF_KEY: Final = b"agenttx ui csrf"
_SESSION_KEY: Final = b"agenttx ui session"
#: Names every server answers at (with its port), besides the address it was reached on.
_LOCAL: Final = frozenset({"127.0.0.1", "localhost", "[::1]"})


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


def session_secret(token: str) -> str:
    """The session cookie's value of the server whose token is `token`: an HMAC of it under
    its own key (it gives neither the token nor the CSRF token)."""
    return hmac.new(token.encode(), _SESSION_KEY, hashlib.sha256).hexdigest()


def cookie_name(port: int) -> str:
    """The session cookie of the server on `port` (cookies ignore ports: one name each)."""
    return f"{COOKIE}{port}"


def same_token(given: str | None, token: str) -> bool:
    """Whether `given` is `token`, compared in constant time."""
    return given is not None and hmac.compare_digest(given.encode(), token.encode())


def _headers(scope: Scope) -> dict[str, str]:
    return {
        name.decode("latin-1").lower(): value.decode("latin-1")
        for name, value in scope.get("headers", ())
    }


def cookies(header: str) -> dict[str, str]:
    """The cookies of a `Cookie` header, read as browsers send them (`a=1; b=2`), leniently:
    a part that is not `name=value` is skipped, a value may hold anything but `;`, the first
    of a name wins. Another application's odd cookie never hides this one's."""
    found: dict[str, str] = {}
    for part in header.split(";"):
        name, sep, value = part.strip().partition("=")
        if sep and name:
            found.setdefault(name.strip(), value.strip().strip('"'))
    return found


def host_allowed(host: str | None, server: tuple[str, int] | None, names: frozenset[str]) -> bool:
    """Whether the `Host` header `host` names this server: its port is the server's and its
    name is a local address, the address the request reached (`server`), or one of `names`.
    (A rebinding page at `http://evil.example:PORT` resolving to 127.0.0.1 is refused.)"""
    if not host or server is None:
        return False
    host = host.lower()
    if host.startswith("["):
        end = host.find("]") + 1
        name, rest = host[:end], host[end:]
        if rest and not rest.startswith(":"):
            return False
        given = rest[1:]
    else:
        name, _, given = host.partition(":")
    if given and not (given.isascii() and given.isdecimal() and len(given) <= 5):
        return False
    if (int(given) if given else 80) != int(server[1]):
        return False
    bound = server[0].lower()
    own = f"[{bound}]" if ":" in bound else bound
    return bool(name) and (name in _LOCAL or name == own or name in names)


def _query_token(scope: Scope) -> str | None:
    query = urllib.parse.parse_qs(scope.get("query_string", b"").decode("latin-1"))
    values = query.get("token")
    return values[-1] if values else None


def _without_token(scope: Scope) -> str:
    """The request's path and query without `token`: where a GET carrying it is sent."""
    pairs = urllib.parse.parse_qsl(
        scope.get("query_string", b"").decode("latin-1"), keep_blank_values=True
    )
    kept = urllib.parse.urlencode([(key, value) for key, value in pairs if key != "token"])
    # One leading slash: `//host/...` in a Location is another site's address.
    path = "/" + urllib.parse.quote(
        (scope.get("path", "/") or "/").lstrip("/"), safe="/:@!$&'()*+,;=-._~"
    )
    return path + (f"?{kept}" if kept else "")


class TokenGate:
    """Refuses every HTTP request at another Host (421) or without the token (403,
    `MISSING`), sets the session cookie when a valid token comes in the
    query (a GET is then sent, 303, to the same URL without it), and adds `HEADERS` to every
    response. `hosts`: names besides the local ones the server answers at (`--host`)."""

    def __init__(self, app: ASGIApp, *, token: str, hosts: frozenset[str] = frozenset()) -> None:
        self._app = app
        self._token = token
        self._session = session_secret(token)
        self._hosts = frozenset(host.lower() for host in hosts)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self._app(scope, receive, send)
            return
        headers = _headers(scope)
        server = scope.get("server")
        if not host_allowed(headers.get("host"), server, self._hosts):
            await _refuse(send, MISDIRECTED, status=421)
            return
        name = cookie_name(int(server[1]) if server else 0)
        from_query = same_token(_query_token(scope), self._token)
        if not (
            from_query or same_token(cookies(headers.get("cookie", "")).get(name), self._session)
        ):
            await _refuse(send, MISSING)
            return
        cookie = (
            f"{name}={self._session}; HttpOnly; SameSite=Strict; Path=/".encode()
            if from_query
            else None
        )
        if cookie is not None and scope.get("method") in {"GET", "HEAD"}:
            await _refuse(
                send,
                "",
                status=303,
                extra=((b"location", _without_token(scope).encode()), (b"set-cookie", cookie)),
            )
            return

        async def sending(message: Message) -> None:
            if message["type"] == "http.response.start":
                extra = list(HEADERS)
                if cookie is not None:
                    extra.append((b"set-cookie", cookie))
                message["headers"] = [*message.get("headers", ()), *extra]
            await send(message)

        await self._app(scope, receive, sending)


async def _refuse(
    send: Send, text: str, *, status: int = 403, extra: tuple[tuple[bytes, bytes], ...] = ()
) -> None:
    body = text.encode()
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [
                (b"content-type", b"text/plain; charset=utf-8"),
                (b"content-length", str(len(body)).encode()),
                *HEADERS,
                *extra,
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})


def write_refusal(
    *,
    read_only: bool,
    token: str,
    csrf: object,
    origin: str | None,
    referer: str | None,
    own_origin: str,
    fetch_site: str | None = None,
) -> str | None:
    """Why a POST is refused (None: it may decide): `origin_refusal`, else the CSRF token
    is missing or wrong."""
    why = origin_refusal(
        read_only=read_only,
        origin=origin,
        referer=referer,
        own_origin=own_origin,
        fetch_site=fetch_site,
    )
    if why is not None:
        return why
    return csrf_refusal(token, csrf)


def csrf_refusal(token: str, csrf: object) -> str | None:
    """Why a form's `csrf` field is refused (None: it is the server's CSRF token)."""
    if not isinstance(csrf, str) or not hmac.compare_digest(
        csrf.encode(), csrf_token(token).encode()
    ):
        return "the form's CSRF token is missing or wrong: reload the page and try again"
    return None


def origin_refusal(
    *,
    read_only: bool,
    origin: str | None,
    referer: str | None,
    own_origin: str,
    fetch_site: str | None = None,
) -> str | None:
    """Why a POST is refused before its body is read (None: it may go on): the server is
    read-only, or the request comes from another origin: its `Origin`, or missing that its
    `Referer`, is not `own_origin` (`scheme://host:port`).

    A browser told `Referrer-Policy: no-referrer` (as every page here is) sends a form's POST
    with `Origin: null` and no `Referer`; then the browser's own `Sec-Fetch-Site` header
    (`fetch_site`, which no page can set) must say `same-origin`."""
    if read_only:
        return "this page is read-only (agenttx ui --read-only): it decides nothing"
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
