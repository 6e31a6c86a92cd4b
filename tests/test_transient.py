"""Transient failures by exception type and status code (`agenttx._tools._transient`)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

import agenttx
from agenttx import RollbackStrategy
from agenttx._tools import is_transient_status, transient_verdict

httpx = pytest.importorskip("httpx")
httpx2 = pytest.importorskip("httpx2")
openai = pytest.importorskip("openai")
anthropic = pytest.importorskip("anthropic")
requests = pytest.importorskip("requests")


def status_error(client: Any, status: int) -> Exception:
    request = client.Request("GET", "https://api.example.com/v1/orders")
    response = client.Response(status, request=request)
    try:
        response.raise_for_status()
    except client.HTTPStatusError as exc:
        return exc
    raise AssertionError(status)


def sdk_status_error(sdk: Any, status: int, kind: str = "APIStatusError") -> Exception:
    request = httpx2.Request("POST", "https://api.example.com/v1/messages")
    response = httpx2.Response(status, request=request)
    return getattr(sdk, kind)("upstream said no", response=response, body=None)


def requests_error(status: int | None) -> Exception:
    if status is None:
        return requests.exceptions.HTTPError("no response")
    response = requests.Response()
    response.status_code = status
    return requests.exceptions.HTTPError(f"{status} Error", response=response)


def sdk_request() -> Any:
    return httpx2.Request("POST", "https://api.example.com/v1/messages")


@pytest.mark.parametrize(
    ("exc", "verdict"),
    [
        # httpx and httpx2: status errors by status, transport errors yes, bad URLs no
        (status_error(httpx, 503), True),
        (status_error(httpx, 500), True),
        (status_error(httpx, 429), True),
        (status_error(httpx, 408), True),
        (status_error(httpx, 404), False),
        (status_error(httpx, 400), False),
        (status_error(httpx, 422), False),
        (status_error(httpx, 302), False),
        (status_error(httpx2, 502), True),
        (status_error(httpx2, 403), False),
        (httpx.ConnectError("refused"), True),
        (httpx.ReadTimeout("slow"), True),
        (httpx.ConnectTimeout("slow"), True),
        (httpx.PoolTimeout("busy"), True),
        (httpx.RemoteProtocolError("server disconnected"), True),
        (httpx.ReadError("reset"), True),
        (httpx.UnsupportedProtocol("ftp://"), False),
        (httpx.LocalProtocolError("bad header"), False),
        (httpx.InvalidURL("bad"), None),
        (httpx2.ConnectError("refused"), True),
        (httpx2.TimeoutException("slow"), True),
        # openai and anthropic
        (sdk_status_error(openai, 500, "InternalServerError"), True),
        (sdk_status_error(openai, 429, "RateLimitError"), True),
        (sdk_status_error(openai, 503), True),
        (sdk_status_error(openai, 400, "BadRequestError"), False),
        (sdk_status_error(openai, 401, "AuthenticationError"), False),
        (sdk_status_error(openai, 409, "ConflictError"), False),
        (openai.APIConnectionError(request=sdk_request()), True),
        (openai.APITimeoutError(request=sdk_request()), True),
        (sdk_status_error(anthropic, 529, "OverloadedError"), True),
        (sdk_status_error(anthropic, 429, "RateLimitError"), True),
        (sdk_status_error(anthropic, 404, "NotFoundError"), False),
        (anthropic.APIConnectionError(request=sdk_request()), True),
        (anthropic.APITimeoutError(request=sdk_request()), True),
        # requests
        (requests_error(503), True),
        (requests_error(429), True),
        (requests_error(404), False),
        (requests_error(None), None),
        (requests.exceptions.ConnectionError("refused"), True),
        (requests.exceptions.ReadTimeout("slow"), True),
        (requests.exceptions.ConnectTimeout("slow"), True),
        (requests.exceptions.ChunkedEncodingError("broken"), True),
        (requests.exceptions.InvalidURL("bad"), None),
        # the standard library
        (TimeoutError("slow"), True),
        (asyncio.TimeoutError(), True),
        (ConnectionRefusedError(111, "refused"), True),
        (ConnectionResetError(104, "reset"), True),
        (BrokenPipeError(32, "pipe"), True),
        (ValueError("bad"), None),
        (KeyError("id"), None),
        (OSError("disk"), None),
    ],
    ids=lambda value: type(value).__name__ if isinstance(value, Exception) else repr(value),
)
def test_the_verdict_of_the_real_client_exceptions(exc, verdict):
    """Each documented class, built as its library builds it, gets its documented verdict."""
    assert transient_verdict(exc) is verdict


@pytest.mark.parametrize(
    ("status", "transient"),
    [(408, True), (429, True), (500, True), (599, True), (400, False), (404, False), (425, False)],
)
def test_retryable_statuses_are_408_429_and_5xx(status, transient):
    """A 4xx other than 408 and 429 is not transient."""
    assert is_transient_status(status) is transient


def fake(module: str, name: str, *, base: type[Exception] = Exception) -> type[Exception]:
    return type(name, (base,), {"__module__": module})


def test_classes_are_matched_by_module_as_well_as_name():
    """A `HTTPStatusError` or `Timeout` of another library gives no verdict."""
    assert transient_verdict(fake("mylib.errors", "HTTPStatusError")()) is None
    assert transient_verdict(fake("mylib", "Timeout")()) is None
    assert transient_verdict(fake("mylib", "ConnectionError")()) is None
    assert transient_verdict(fake("requests.exceptions", "Timeout")()) is True


def test_any_sdk_with_the_stainless_error_names_is_recognised():
    """`APIStatusError` and `APIConnectionError` of another generated SDK work by name."""
    status_error = fake("groq._exceptions", "APIStatusError")
    error = status_error()
    error.status_code = 503  # type: ignore[attr-defined]
    assert transient_verdict(error) is True
    error.status_code = 400  # type: ignore[attr-defined]
    assert transient_verdict(error) is False
    assert transient_verdict(fake("groq", "APIConnectionError")()) is True


def test_a_subclass_of_a_known_class_is_matched_through_its_mro():
    """A user's subclass of httpx.ConnectError or of TimeoutError is transient too."""
    assert transient_verdict(type("Mine", (httpx.ConnectError,), {})("x")) is True
    assert transient_verdict(type("Slow", (TimeoutError,), {})()) is True


def test_a_status_that_cannot_be_read_gives_no_verdict():
    """A response property that raises, or a non-int status, is read as absent."""

    class Broken(fake("httpx", "HTTPStatusError")):  # type: ignore[misc]
        @property
        def response(self) -> Any:
            raise RuntimeError("no response")

    assert transient_verdict(Broken()) is None
    odd = fake("openai", "APIStatusError")()
    odd.status_code = "503"  # type: ignore[attr-defined]
    assert transient_verdict(odd) is None
    flag = fake("openai", "APIStatusError")()
    flag.status_code = True  # type: ignore[attr-defined]
    assert transient_verdict(flag) is None


# ------------------------------------------------------------------ in a transaction


def run_failing(exc: BaseException, *, transient_retries: int = 1) -> agenttx.StepResult:
    @agenttx.tool
    def fetch() -> dict:
        raise exc

    policy = agenttx.RollbackPolicy(transient_retries=transient_retries)
    tx = agenttx.Transaction(tools=[fetch], policy=policy)
    return tx.execute_step(1, "fetch", {})


def test_a_status_error_503_is_retried_though_its_message_is_not_recognised():
    """httpx's `Server error '503 ...'` message has no HTTP prefix; its type makes it RETRY."""
    result = run_failing(status_error(httpx, 503))
    assert result.error is not None
    assert result.error.startswith("httpx.HTTPStatusError: Server error '503 Service Unavailable'")
    assert result.strategy is RollbackStrategy.RETRY


def test_a_client_status_error_is_not_retried():
    """A 404 status error is not transient: the controller does not RETRY it."""
    assert run_failing(status_error(httpx, 404)).strategy is not RollbackStrategy.RETRY


def test_an_sdk_rate_limit_is_retried():
    """openai's RateLimitError makes the step RETRY."""
    result = run_failing(sdk_status_error(openai, 429, "RateLimitError"))
    assert result.strategy is RollbackStrategy.RETRY


def test_a_tool_error_raised_from_a_transient_exception_is_transient():
    """`raise ToolError(...) from exc` takes the verdict of exc when it sets none itself."""

    @agenttx.tool
    def reserve(sku: str) -> dict:
        try:
            httpx.Client(transport=httpx.MockTransport(refuse)).get("https://inventory/x")
        except httpx.ConnectError as exc:
            raise agenttx.ToolError(f"the inventory service is down for {sku}") from exc
        return {}

    def refuse(request: Any) -> Any:
        raise httpx.ConnectError("connection refused", request=request)

    tx = agenttx.Transaction(tools=[reserve])
    result = tx.execute_step(1, "reserve", {"sku": "a-1"})
    assert result.error == "the inventory service is down for a-1"
    assert result.strategy is RollbackStrategy.RETRY


def test_an_explicit_transient_flag_wins_over_the_type():
    """ToolError(transient=False) from a 503 is not retried; transient=True is, whatever it says."""
    refused = agenttx.ToolError("do not retry", transient=False)
    refused.__cause__ = status_error(httpx, 503)
    assert run_failing(refused).strategy is not RollbackStrategy.RETRY
    forced = agenttx.ToolError("card declined", transient=True)
    assert run_failing(forced).strategy is RollbackStrategy.RETRY


def test_transient_retries_zero_keeps_the_reference_behaviour():
    """With transient_retries=0 a transient type fails the step like any other failure."""
    result = run_failing(TimeoutError("slow"), transient_retries=0)
    assert result.strategy is not RollbackStrategy.RETRY
