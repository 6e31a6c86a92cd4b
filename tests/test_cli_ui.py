"""`agenttx ui`: it prints the URL line (the real port with `--port 0`), serves the page with
the token until interrupted, and without the `ui` extra says what to install."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from agenttx.__main__ import main
from agenttx.stores import SQLiteStore

if TYPE_CHECKING:
    from collections.abc import Iterator

pytest.importorskip("uvicorn")

ROOT = Path(__file__).resolve().parents[1]
#: A token given through the environment (at least 32 characters).
ENV_TOKEN = "from-the-env-" + "x" * 24


@pytest.fixture
def database(tmp_path: Path) -> str:
    path = str(tmp_path / "ui.db")
    SQLiteStore(path).close()
    return path


@pytest.fixture
def served(database: str) -> Iterator[tuple[subprocess.Popen[str], str]]:
    """`python -m agenttx ui DB --port 0` running, and the line it printed."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "AGENTTX_UI_TOKEN": ENV_TOKEN}
    process = subprocess.Popen(
        [sys.executable, "-m", "agenttx", "ui", database, "--port", "0"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        assert process.stdout is not None
        yield process, process.stdout.readline()
    finally:
        if process.poll() is None:
            process.kill()
        process.communicate(timeout=30)


@pytest.mark.timeout(120)
def test_ui_prints_its_url_and_serves_until_interrupted(
    served: tuple[subprocess.Popen[str], str],
) -> None:
    """One line `agenttx ui: http://127.0.0.1:PORT/?token=TOKEN` with the real port (asked
    for 0) and the token from AGENTTX_UI_TOKEN; the URL sets the session cookie and sends the
    browser (303) to the runs page without the token; a request without the token, or at a
    Host that is not the server's, is refused; SIGINT stops it quietly, status 130 (as every
    command)."""
    process, line = served
    found = re.fullmatch(rf"agenttx ui: http://127\.0\.0\.1:(\d+)/\?token={ENV_TOKEN}\n", line)
    assert found is not None, line
    port = int(found.group(1))
    assert port != 0
    url = line.split(": ", 1)[1].strip()
    browser = urllib.request.build_opener(urllib.request.HTTPCookieProcessor())
    with browser.open(url, timeout=30) as response:
        page = response.read().decode()
        assert response.url == f"http://127.0.0.1:{port}/"
    assert 'data-page="runs"' in page
    local = urllib.request.Request(
        f"http://127.0.0.1:{port}/inbox", headers={"Host": f"localhost:{port}"}
    )
    with browser.open(local, timeout=30) as response:
        assert response.status == 200
    rebound = urllib.request.Request(
        f"http://127.0.0.1:{port}/?token={ENV_TOKEN}", headers={"Host": f"evil.example:{port}"}
    )
    with pytest.raises(urllib.error.HTTPError) as misdirected:
        urllib.request.urlopen(rebound, timeout=30)
    assert misdirected.value.code == 421
    misdirected.value.close()
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=30)
    assert refused.value.code == 403
    refused.value.close()
    process.send_signal(signal.SIGINT)
    out, err = process.communicate(timeout=60)
    assert process.returncode == 130
    assert (out, "Traceback" in err) == ("", False), err


def test_ui_without_the_extra_names_it(database: str, capsys, monkeypatch) -> None:
    """Without Starlette, uvicorn or Jinja2, `agenttx ui` says `pip install 'agenttx[ui]'`
    in one line, status 2."""
    monkeypatch.setitem(sys.modules, "uvicorn", None)
    status = main(["ui", database, "--port", "0"])
    out, err = capsys.readouterr()
    assert status == 2
    assert out == ""
    assert err == (
        "agenttx ui: needs Starlette, uvicorn and Jinja2 (uvicorn is missing): "
        "pip install 'agenttx[ui]'\n"
    )


def test_ui_refuses_a_bad_port_and_a_missing_file(tmp_path: Path, capsys) -> None:
    """A port outside 0-65535 is a usage error; a TARGET that does not exist is one line,
    status 2, as for every command."""
    with pytest.raises(SystemExit) as exited:
        main(["ui", str(tmp_path / "x.db"), "--port", "70000"])
    assert exited.value.code == 2
    assert "a port is 0 to 65535" in capsys.readouterr().err
    assert main(["ui", str(tmp_path / "missing.db"), "--port", "0"]) == 2
    assert capsys.readouterr().err == f"agenttx ui: no such file: {tmp_path / 'missing.db'}\n"


def test_the_demo_ends_with_the_command_that_opens_it_in_a_page(tmp_path: Path) -> None:
    """The demo's last lines give `agenttx ui DB`; the page of its transaction then shows the
    rewound, compensated and failed attempts in its timeline and its graph."""
    pytest.importorskip("starlette")
    from starlette.testclient import TestClient  # noqa: PLC0415

    from agenttx import _demo  # noqa: PLC0415
    from agenttx._ui._app import make_app  # noqa: PLC0415

    said: list[str] = []
    tx = _demo.run(said.append, directory=str(tmp_path))
    database = tmp_path / "agenttx.db"
    assert said[-2].startswith("or in a page (pip install 'agenttx[ui]'")
    assert said[-1] == f"  agenttx ui {database}"
    store = SQLiteStore(str(database), readonly=True)
    try:
        made = TestClient(make_app(store, token="t"))
        page = made.get(f"/tx/{tx.id}?token=t").text
    finally:
        store.close()
    assert "<li>3. step 3 fs.write: compensated</li>" in page
    assert "<li>2. step 2 kv.put: rewound</li>" in page
    assert "<li>5. step 5 record.insert: failed</li>" in page
    assert '<div id="graph"><svg' in page
    drawn = set(re.findall(r'<g class="node ([^"]*)"', page))
    assert {"compensated", "failed", "rewound", "rewound root-cause"} <= drawn


def test_the_url_line_quotes_the_token_and_brackets_an_ipv6_host() -> None:
    """A token with characters a URL reserves is percent-encoded in the printed URL (the
    server decodes it back), and an IPv6 host is written in brackets."""
    from agenttx._ui._command import url_line  # noqa: PLC0415

    assert url_line("127.0.0.1", 8765, "a b&c") == (
        "agenttx ui: http://127.0.0.1:8765/?token=a%20b%26c"
    )
    assert url_line("::1", 1, "t") == "agenttx ui: http://[::1]:1/?token=t"


def test_ui_refuses_a_token_that_cannot_travel_in_a_url(database: str, capsys) -> None:
    """A `--token` with a space, a `;` or nothing URL-safe is refused in one line, status 2,
    before anything listens."""
    assert main(["ui", database, "--port", "0", "--token", "a b;c" * 8]) == 2
    err = capsys.readouterr().err
    assert err.startswith("agenttx ui: the token must be 1 to 512 letters, digits or `-._~+/=`")


def test_ui_refuses_a_short_token(database: str, capsys, monkeypatch) -> None:
    """A token given by `--token` or `AGENTTX_UI_TOKEN` shorter than 32 characters is
    refused in one line, status 2 (it is all that guards the page)."""
    assert main(["ui", database, "--port", "0", "--token", "b7"]) == 2
    assert capsys.readouterr().err == (
        "agenttx ui: the token must be at least 32 characters (it is all that guards the "
        "page; leave it out for a fresh one), got 2\n"
    )
    monkeypatch.setenv("AGENTTX_UI_TOKEN", "x" * 31)
    assert main(["ui", database, "--port", "0"]) == 2
    assert "at least 32 characters" in capsys.readouterr().err
