"""Whether the exception a tool raised is transient, by its type and status code.

`transient_verdict` recognises the timeouts, connection failures and retryable HTTP statuses of
the common clients (docs/protocol.md#what-counts-as-transient) without importing them: it walks
the exception's MRO and matches each class by name and top-level module, and reads the status
code from `status_code` or `response.status_code`. Its verdict goes into `Failure.transient`,
which overrides the hint cleaner's reading of the message; None leaves the decision to the
cleaner.
"""

from __future__ import annotations

from typing import Final, Literal, TypeAlias

__all__ = ["is_transient_status", "transient_verdict"]

_Verdict: TypeAlias = "bool | Literal['status']"

#: Any module: the error classes of the Stainless-generated SDKs (openai, anthropic and others)
#: share these names and shapes.
_ANY: Final = None
_HTTPX: Final = frozenset({"httpx", "httpx2"})
_SDKS: Final = frozenset({"openai", "anthropic"})
_REQUESTS: Final = frozenset({"requests"})
_BUILTINS: Final = frozenset({"builtins"})
_ASYNCIO: Final = frozenset({"asyncio", "concurrent"})

#: Class name -> (the top-level modules it may come from, None for any; its verdict). The MRO is
#: walked from the exception's own class up, so a more specific entry wins: httpx's
#: `UnsupportedProtocol` (a bad URL) is a `TransportError` but not transient.
_CLASSES: Final[dict[str, tuple[frozenset[str] | None, _Verdict]]] = {
    # httpx and httpx2
    "HTTPStatusError": (_HTTPX, "status"),
    "UnsupportedProtocol": (_HTTPX, False),
    "LocalProtocolError": (_HTTPX, False),
    "TimeoutException": (_HTTPX, True),
    "TransportError": (_HTTPX, True),  # connect, read and write errors, a dropped connection
    # openai, anthropic (and other SDKs generated the same way)
    "APIStatusError": (_ANY, "status"),
    "RateLimitError": (_SDKS, True),
    "InternalServerError": (_SDKS, True),
    "APITimeoutError": (_ANY, True),
    "APIConnectionError": (_ANY, True),
    # requests
    "HTTPError": (_REQUESTS, "status"),
    "Timeout": (_REQUESTS, True),
    "ConnectionError": (_REQUESTS | _BUILTINS, True),
    "ChunkedEncodingError": (_REQUESTS, True),  # the connection broke mid-response
    # the standard library
    "TimeoutError": (_BUILTINS | _ASYNCIO, True),
}


def is_transient_status(status: int) -> bool:
    """Whether an HTTP status is worth a plain retry: 408, 429 and every 5xx."""
    return status in (408, 429) or 500 <= status <= 599


def transient_verdict(exc: BaseException) -> bool | None:
    """True if `exc` is a transient failure, False if it surely is not, None if unknown.

    For a status error (httpx `HTTPStatusError`, an SDK's `APIStatusError`, a `requests`
    `HTTPError` with a response), the status decides (`is_transient_status`); without a
    readable status the verdict is None. Never raises: a property that raises is read as
    absent.
    """
    for cls in type(exc).__mro__:
        entry = _CLASSES.get(cls.__name__)
        if entry is None:
            continue
        modules, verdict = entry
        if modules is not None and cls.__module__.partition(".")[0] not in modules:
            continue
        if verdict == "status":
            status = _status(exc)
            return None if status is None else is_transient_status(status)
        return bool(verdict)
    return None


def _status(exc: BaseException) -> int | None:
    """`exc.status_code`, else `exc.response.status_code`, if it is an int."""
    for holder in (exc, _read(exc, "response")):
        status = _read(holder, "status_code")
        if isinstance(status, int) and not isinstance(status, bool):
            return status
    return None


def _read(obj: object, name: str) -> object:
    if obj is None:
        return None
    try:
        return getattr(obj, name, None)
    except Exception:  # noqa: BLE001  (a property of a foreign object: absent, as far as we know)
        return None
