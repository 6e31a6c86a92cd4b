"""The `fs.*` sandbox holds for writes, reads and undos: symlink swaps, FIFOs and odd paths."""

from __future__ import annotations

import contextlib
import errno
import os
import stat
import tempfile
import threading
from pathlib import Path

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

import agenttx
import agenttx.builtins
from agenttx import Engine, EngineConfig
from agenttx._errors import InvalidArgument, ToolError
from agenttx._tools import Tool, ToolContext
from agenttx.builtins import _fs, restore_file
from agenttx.stores import MemoryStore, SQLiteStore

pytestmark = pytest.mark.skipif(not _fs._SUPPORTED, reason="the fs tools need openat")

TX = "t1"
GUARD = 30.0  # seconds a call may take before it counts as blocked for ever


def new_context() -> ToolContext:
    store = MemoryStore()
    store.begin(TX)
    return ToolContext(
        tx_id=TX,
        step_id=1,
        idempotency_key="k",
        deadline=float("inf"),
        store=store,
        compensations={"fs.restore_file": restore_file},
    )


def tools_for(root: Path) -> dict[str, Tool]:
    return {t.name: t for t in agenttx.builtins.tools(root) if isinstance(t, Tool)}


@pytest.fixture
def root(tmp_path: Path) -> Path:
    path = tmp_path / "sandbox"
    path.mkdir()
    return path


@pytest.fixture
def outside(tmp_path: Path) -> Path:
    """A directory next to the root, holding files a rogue symlink could lead to."""
    path = tmp_path / "outside"
    path.mkdir()
    (path / "f.txt").write_text("outside f")
    (path / "new.txt").write_text("outside new")
    return path


@pytest.fixture
def tools(root: Path) -> dict[str, Tool]:
    return tools_for(root)


def failure(tools, ctx, name, /, **arguments) -> str:
    with pytest.raises(ToolError) as info:
        tools[name](ctx, **arguments)
    return info.value.message


def snapshot(top: Path, *, skip: Path | None = None) -> dict[str, tuple[str, object]]:
    """Every entry under `top` (but `skip`): its kind and its bytes, target or nothing."""
    seen: dict[str, tuple[str, object]] = {}
    for dirpath, dirnames, filenames in os.walk(top):
        here = Path(dirpath)
        if skip is not None and here == skip:
            dirnames.clear()
            continue
        for name in [*dirnames, *filenames]:
            path = here / name
            if path == skip:
                continue
            mode = path.lstat().st_mode
            if stat.S_ISLNK(mode):
                seen[str(path)] = ("link", str(path.readlink()))
            elif stat.S_ISREG(mode):
                seen[str(path)] = ("file", path.read_bytes())
            else:
                seen[str(path)] = ("other", stat.S_IFMT(mode))
    return seen


def swap_for_symlink(directory: Path, target: Path) -> Path:
    """Move `directory` aside (inside the root) and put a symlink to `target` in its place."""
    moved = directory.with_name(directory.name + "-moved")
    directory.rename(moved)
    directory.symlink_to(target, target_is_directory=True)
    return moved


def finish_within(function, *args, **kwargs) -> object:
    """Run `function` on a thread; fail (and unblock it) if it has not finished in GUARD s."""
    outcome: dict[str, object] = {}

    def run() -> None:
        try:
            outcome["value"] = function(*args, **kwargs)
        except BaseException as exc:
            outcome["error"] = exc

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(GUARD)
    if thread.is_alive():
        pytest.fail(f"{function} blocked for {GUARD} s")
    if "error" in outcome:
        raise outcome["error"]  # type: ignore[misc]
    return outcome.get("value")


def release(fifo: Path) -> None:
    """Let a reader blocked opening `fifo` (a regression) go: open and close its writing end."""
    with contextlib.suppress(OSError):
        os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))


@pytest.fixture
def fifo(root: Path):
    """A FIFO in the root, released afterwards."""
    path = root / "pipe"
    os.mkfifo(path)
    yield path
    release(path)


# ---------------------------------------------------------------------- undo after a swap


def test_rewind_after_a_directory_became_a_symlink_leaves_outside_alone(root, outside):
    """A rewind whose directory was swapped for a symlink out of the root is refused, reported."""
    (root / "d").mkdir()
    (root / "d" / "f.txt").write_text("v0")
    tx = agenttx.Transaction(tools=agenttx.builtins.tools(root), compensation_retries=1)
    tx.execute_step(1, "fs.write", {"path": "d/f.txt", "contents": "v1"})
    tx.execute_step(2, "fs.write", {"path": "d/new.txt", "contents": "n"})
    moved = swap_for_symlink(root / "d", outside)
    before = snapshot(outside)

    result = tx.rollback(1)

    assert result.compensations_run == 0
    assert len(result.compensation_errors) == 2
    for error in result.compensation_errors:
        assert f"not restored: '{root / 'd'}' is a symlink" in error
        assert "\n" not in error
    assert snapshot(outside) == before
    assert (moved / "f.txt").read_text() == "v1"  # refused, not silently done elsewhere
    assert (moved / "new.txt").read_text() == "n"


def test_restore_refuses_a_symlink_even_one_inside_the_root(root):
    """The recorded path had no symlink; one found at undo time is refused wherever it leads."""
    (root / "d").mkdir()
    (root / "e").mkdir()
    (root / "e" / "f.txt").write_text("someone else's")
    ctx = new_context()
    tools_for(root)["fs.write"](ctx, path="d/f.txt", contents="mine")
    swap_for_symlink(root / "d", root / "e")
    ((undo,), _) = ctx._close()
    with pytest.raises(ToolError, match=f"not restored: '{root / 'd'}' is a symlink"):
        restore_file(undo.payload)
    assert (root / "e" / "f.txt").read_text() == "someone else's"


def test_a_legacy_payload_without_root_refuses_symlinks_from_slash(tmp_path, outside):
    """A payload recorded before `root` existed is walked from `/` and follows no symlink."""
    (tmp_path / "link").symlink_to(outside, target_is_directory=True)
    payload = {"path": str(tmp_path / "link" / "f.txt"), "prior_hex": None}
    with pytest.raises(ToolError, match=f"'{tmp_path / 'link'}' is a symlink"):
        restore_file(payload)
    with pytest.raises(ToolError, match=f"'{tmp_path / 'link'}' is a symlink"):
        restore_file({**payload, "prior_hex": "00"})
    assert (outside / "f.txt").read_text() == "outside f"


@pytest.mark.parametrize(
    "path",
    ["{t}/elsewhere/f", "{t}/sandbox-evil/f", "{t}/sandbox/../f", "{t}/sandbox", "f", "{t}/a\0b"],
)
def test_restore_refuses_a_path_not_inside_its_root(tmp_path, monkeypatch, path):
    """A payload whose path is not strictly inside its root is refused before any I/O."""
    monkeypatch.chdir(tmp_path)  # even a regression acts only inside tmp_path
    payload = {"path": path.format(t=tmp_path), "prior_hex": "00", "root": f"{tmp_path}/sandbox"}
    with pytest.raises(ToolError, match="not restored: it is not inside"):
        restore_file(payload)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("root", [3, "", "sandbox", "/sand\0box", None])
def test_restore_rejects_a_bad_root(tmp_path, root):
    """`root`, when present, must be an absolute path."""
    with pytest.raises(InvalidArgument, match="`root` must be an absolute path"):
        restore_file({"path": str(tmp_path / "f"), "prior_hex": None, "root": root})


def test_restore_with_a_missing_root_deletes_nothing_and_recreates_for_bytes(tmp_path):
    """A vanished root: deleting succeeds at once; restoring bytes recreates it."""
    root = tmp_path / "gone"
    restore_file({"path": str(root / "a" / "f"), "prior_hex": None, "root": str(root)})
    assert not root.exists()
    restore_file({"path": str(root / "a" / "f"), "prior_hex": "6869", "root": str(root)})
    assert (root / "a" / "f").read_bytes() == b"hi"


def test_restore_deleting_under_a_vanished_directory_succeeds(root):
    """Deleting a file whose directory is gone is already done."""
    payload = {"path": str(root / "gone" / "f"), "prior_hex": None, "root": str(root)}
    restore_file(payload)
    assert list(root.iterdir()) == []


@pytest.mark.skipif(os.geteuid() != 0, reason="chown to another user needs root")
def test_restore_rewrites_the_file_in_place_keeping_links_owner_and_mode(root):
    """A restore writes the prior bytes into the file itself: its inode stays, so a hard link
    sees them, and its owner, group and mode are kept."""
    target, link = root / "f.txt", root / "link.txt"
    target.write_bytes(b"the current, longer contents")
    os.link(target, link)
    os.chown(target, 65534, 65534)
    target.chmod(0o640)
    before = target.stat()
    restore_file({"path": str(target), "prior_hex": b"prior".hex(), "root": str(root)})
    after = target.stat()
    assert (target.read_bytes(), link.read_bytes()) == (b"prior", b"prior")
    assert (after.st_ino, after.st_nlink) == (before.st_ino, 2)
    assert (after.st_uid, after.st_gid) == (65534, 65534)
    assert stat.S_IMODE(after.st_mode) == 0o640
    restore_file({"path": str(target), "prior_hex": b"prior".hex(), "root": str(root)})
    assert (link.read_bytes(), target.stat().st_ino) == (b"prior", before.st_ino)


def test_restore_replaces_a_file_it_may_not_open_keeping_its_mode(root, monkeypatch):
    """A file the process may not write in place (EACCES) is replaced by name, as before, with
    its mode kept."""
    target = root / "f.txt"
    target.write_bytes(b"new")
    target.chmod(0o444)
    real_open = os.open

    def refuse_rewrite(path, flags, *args, **kwargs):
        if flags & os.O_WRONLY and not flags & os.O_CREAT:
            raise PermissionError(errno.EACCES, "Permission denied")
        return real_open(path, flags, *args, **kwargs)

    monkeypatch.setattr(os, "open", refuse_rewrite)
    restore_file({"path": str(target), "prior_hex": b"old".hex(), "root": str(root)})
    monkeypatch.undo()
    assert target.read_bytes() == b"old"
    assert stat.S_IMODE(target.stat().st_mode) == 0o444


def test_restore_replaces_a_fifo_without_blocking(root, fifo):
    """Restoring prior bytes over a FIFO renames a file over it; it never opens the FIFO."""
    payload = {"path": str(fifo), "prior_hex": b"old".hex(), "root": str(root)}
    finish_within(restore_file, payload)
    assert fifo.read_bytes() == b"old"


def test_write_racing_a_symlink_swap_writes_inside_and_its_undo_is_refused(
    root, outside, monkeypatch
):
    """A parent swapped for an outside symlink mid-write: the bytes stay in the walked directory."""
    (root / "a").mkdir()
    real_register = ToolContext.register_undo
    moved: list[Path] = []

    def register_then_swap(self, *args, **kwargs):
        real_register(self, *args, **kwargs)
        moved.append(swap_for_symlink(root / "a", outside))

    monkeypatch.setattr(ToolContext, "register_undo", register_then_swap)
    before = snapshot(outside)
    ctx = new_context()
    tools_for(root)["fs.write"](ctx, path="a/f.txt", contents="inside")
    assert snapshot(outside) == before
    assert (moved[0] / "f.txt").read_text() == "inside"
    ((undo,), _) = ctx._close()
    with pytest.raises(ToolError, match=f"'{root / 'a'}' is a symlink"):
        restore_file(undo.payload)
    assert snapshot(outside) == before


def test_write_through_a_parent_symlinked_outside_is_refused(tools, root, outside):
    """A parent that already points outside the root is an escape; nothing outside changes."""
    (root / "a").symlink_to(outside, target_is_directory=True)
    before = snapshot(outside)
    ctx = new_context()
    assert failure(tools, ctx, "fs.write", path="a/f.txt", contents="x") == (
        "path 'a/f.txt' escapes the sandbox"
    )
    assert snapshot(outside) == before
    assert ctx._close() == ((), ())


# ---------------------------------------------------------------------- crash recovery


def test_recovery_refuses_a_restore_through_a_swapped_symlink(tmp_path, root, outside):
    """`Engine.recover` reports the refused restore, keeps the undo, and retries it next time."""
    config = EngineConfig(idle_timeout=None, compensation_retries=1)
    tools = agenttx.builtins.tools(root)
    engine = Engine(store=SQLiteStore(tmp_path / "db"), config=config, tools=tools)
    (root / "d").mkdir()
    (root / "d" / "f.txt").write_text("v0")
    tx = engine.begin()
    tx.execute_step(1, "fs.write", {"path": "d/f.txt", "contents": "v1"})
    engine.close()
    engine.store.close()  # type: ignore[attr-defined]  (the process died here)
    moved = swap_for_symlink(root / "d", outside)
    before = snapshot(outside)

    engine = Engine(store=SQLiteStore(tmp_path / "db"), config=config, tools=tools)
    report = engine.recover()
    assert report.compensations_run == 0
    (line,) = report.failures
    assert f"not restored: '{root / 'd'}' is a symlink" in line
    assert snapshot(outside) == before

    (root / "d").unlink()  # an operator puts the directory back; the kept undo now runs
    moved.rename(root / "d")
    report = engine.recover()
    assert (report.compensations_run, report.failures) == (1, ())
    assert (root / "d" / "f.txt").read_text() == "v0"
    engine.close()
    engine.store.close()  # type: ignore[attr-defined]


# ---------------------------------------------------------------------- non-regular files


@pytest.mark.parametrize(("name", "arguments"), [("fs.read", {}), ("fs.write", {"contents": "x"})])
def test_a_fifo_is_refused_promptly(tools, fifo, name, arguments):
    """Reading or writing a FIFO fails at once with a one-line message; it never blocks."""
    ctx = new_context()
    message = finish_within(failure, tools, ctx, name, path="pipe", **arguments)
    assert message == "not a regular file: 'pipe'"
    assert ctx._close() == ((), ())
    assert stat.S_ISFIFO(fifo.lstat().st_mode)


def test_a_file_swapped_for_a_fifo_after_the_check_is_refused(tools, root, fifo, monkeypatch):
    """The opened file is checked again: a FIFO that replaced a checked file is refused."""
    regular = root / "regular"
    regular.write_text("")
    real_stat = os.stat
    monkeypatch.setattr(_fs.os, "stat", lambda *a, **k: real_stat(regular))
    message = finish_within(failure, tools, new_context(), "fs.read", path="pipe")
    assert message == "not a regular file: 'pipe'"


def test_a_file_swapped_for_a_symlink_after_the_check_is_an_escape(
    tools, root, outside, monkeypatch
):
    """The last component is opened with O_NOFOLLOW: a symlink that replaced it is refused."""
    regular = root / "regular"
    regular.write_text("")
    (root / "t").symlink_to(outside / "f.txt")
    real_stat = os.stat
    monkeypatch.setattr(_fs.os, "stat", lambda *a, **k: real_stat(regular))
    assert failure(tools, new_context(), "fs.read", path="t") == "path 't' escapes the sandbox"


@pytest.mark.parametrize(
    ("code", "message"),
    [
        (errno.ENXIO, "not a regular file: 's'"),  # a socket, a device without its driver
        (errno.EACCES, f"{os.strerror(errno.EACCES)}: 's'"),
    ],
)
def test_a_file_that_cannot_be_opened_reports_why(tools, root, monkeypatch, code, message):
    """Opening the file itself: ENXIO is ``not a regular file``, anything else its strerror."""
    (root / "s").write_text("")
    real_open = os.open

    def open_(path, flags, *args, **kwargs):
        if flags == _fs._READ_FLAGS:
            raise OSError(code, os.strerror(code))
        return real_open(path, flags, *args, **kwargs)

    monkeypatch.setattr(_fs.os, "open", open_)
    assert failure(tools, new_context(), "fs.read", path="s") == message


def test_a_parent_that_cannot_be_inspected_reports_the_open_error(tools, root, monkeypatch):
    """If the parent is not a directory and cannot even be lstat'ed, the open's error stands."""
    (root / "f").write_text("")

    def broken_stat(*args, **kwargs):
        raise PermissionError(errno.EACCES, os.strerror(errno.EACCES))

    monkeypatch.setattr(_fs.os, "stat", broken_stat)
    message = failure(tools, new_context(), "fs.read", path="f/x")
    assert message == f"{os.strerror(errno.ENOTDIR)}: 'f/x'"


# ---------------------------------------------------------------------- temporary files


def test_temporary_names_that_keep_colliding_fail_cleanly(tools, root, monkeypatch):
    """If every random temporary name is taken, the write fails with EEXIST; no file changes."""
    monkeypatch.setattr(_fs.secrets, "token_hex", lambda n: "0" * (2 * n))
    taken = root / f".{'0' * 16}{_fs.TMP_SUFFIX}"
    taken.write_text("a user's file")
    message = failure(tools, new_context(), "fs.write", path="f", contents="x")
    assert message == f"{os.strerror(errno.EEXIST)}: 'f'"
    assert taken.read_text() == "a user's file"
    assert sorted(p.name for p in root.iterdir()) == [taken.name]


# ---------------------------------------------------------------------- symlinks inside the root


def test_a_relative_symlink_with_dotdot_inside_the_root_is_followed(tools, root):
    """`a/toc -> ../c` lands in `c`; the undo records the real path."""
    (root / "a").mkdir()
    (root / "c").mkdir()
    (root / "a" / "toc").symlink_to("../c")
    ctx = new_context()
    tools["fs.write"](ctx, path="a/toc/f", contents="x")
    assert (root / "c" / "f").read_text() == "x"
    ((undo,), _) = ctx._close()
    assert undo.payload["path"] == os.path.realpath(root / "c" / "f")
    restore_file(undo.payload)
    assert not (root / "c" / "f").exists()


def test_a_relative_symlink_climbing_out_of_the_root_is_an_escape(tools, root, outside):
    """`a/esc -> ../../outside` climbs past the root: refused, for reads and writes."""
    (root / "a").mkdir()
    (root / "a" / "esc").symlink_to("../../outside")
    ctx = new_context()
    for name in ["fs.read", "fs.write"]:
        message = failure(tools, ctx, name, path="a/esc/f.txt", contents="x")
        assert message == "path 'a/esc/f.txt' escapes the sandbox"
    assert (outside / "f.txt").read_text() == "outside f"


def test_an_absolute_symlink_through_either_spelling_of_the_root_is_followed(tmp_path):
    """A root reached through a symlink: absolute links by its real or its given path work."""
    real = tmp_path / "real-root"
    (real / "a").mkdir(parents=True)
    given_root = tmp_path / "given-root"
    given_root.symlink_to(real, target_is_directory=True)
    (real / "by-real").symlink_to(real / "a")
    (real / "by-given").symlink_to(given_root / "a")
    (tmp_path / "real-root-evil").mkdir()
    (real / "by-prefix").symlink_to(tmp_path / "real-root-evil")
    tools = tools_for(given_root)
    ctx = new_context()
    tools["fs.write"](ctx, path="by-real/f", contents="1")
    tools["fs.write"](ctx, path="by-given/g", contents="2")
    assert sorted(p.name for p in (real / "a").iterdir()) == ["f", "g"]
    message = failure(tools, ctx, "fs.write", path="by-prefix/h", contents="3")
    assert message == "path 'by-prefix/h' escapes the sandbox"
    assert list((tmp_path / "real-root-evil").iterdir()) == []


def test_a_deep_new_path_is_created(tools, root):
    """Any number of missing directories are made (the symlink limit is not a depth limit)."""
    path = "/".join(["d"] * 60) + "/f"
    tools["fs.write"](new_context(), path=path, contents="deep")
    assert root.joinpath(*path.split("/")).read_text() == "deep"


def test_a_directory_that_keeps_vanishing_ends_the_walk(tools, root, monkeypatch):
    """A directory removed every time it is made fails the write instead of looping."""
    real_mkdir = os.mkdir
    made: list[str] = []

    def vanishing_mkdir(name, mode=0o777, *, dir_fd=None):
        real_mkdir(name, mode, dir_fd=dir_fd)
        os.rmdir(name, dir_fd=dir_fd)
        made.append(name)

    monkeypatch.setattr(_fs.os, "mkdir", vanishing_mkdir)
    message = failure(tools, new_context(), "fs.write", path="d/f", contents="x")
    assert message == "No such file or directory: 'd/f'"
    assert made == ["d"] * _fs._MKDIR_ATTEMPTS
    with pytest.raises(FileNotFoundError, match=str(root / "d" / "f")):  # bounded too
        restore_file({"path": str(root / "d" / "f"), "prior_hex": "00", "root": str(root)})


def test_a_symlink_loop_reports_too_many_levels(tools, root):
    """A symlink cycle inside the root ends with ELOOP, not a hang."""
    (root / "loop").symlink_to("loop")
    message = failure(tools, new_context(), "fs.read", path="loop/x")
    assert message == f"{os.strerror(errno.ELOOP)}: 'loop/x'"


def test_without_openat_the_tools_refuse(tools, root, monkeypatch):
    """Where `openat`-style calls are missing, every path fails with one clear message."""
    monkeypatch.setattr(_fs, "_SUPPORTED", False)
    message = "the fs tools need a POSIX system with openat and O_NOFOLLOW"
    assert failure(tools, new_context(), "fs.read", path="f") == message
    with pytest.raises(ToolError, match=message):
        restore_file({"path": str(root / "f"), "prior_hex": None, "root": str(root)})


# ---------------------------------------------------------------------- the invariant

# Names the traps below answer to, drawn as often as the odd ones.
COMPONENTS = st.one_of(
    st.sampled_from(["a", "f", "sub", "inner", "abs", "back", "link", "up", "pipe"]),
    st.sampled_from(["esc", "loop", "flink", "pre", "..", ".", "", "\0", "x" * 300, "ä"]),
)
PATHS = st.one_of(
    # A directory (a trap or not) and a file name: the shapes that reach the traps.
    st.builds(
        lambda folder, name: f"{folder}/{name}" if folder else name,
        st.sampled_from(["", "a", "inner", "abs", "a/back/a", "link", "up", "pre", "a/esc"]),
        st.sampled_from(["f", "g", "pipe", "flink", "sub/h", "loop/x"]),
    ),
    # Anything else, from the same names and the odd ones.
    st.builds(
        lambda lead, parts: lead + "/".join(parts),
        st.sampled_from(["", "", "", "/", "./", "../"]),
        st.lists(COMPONENTS, min_size=0, max_size=5),
    ),
)


def _plant(base: Path) -> tuple[Path, Path]:
    """A root full of traps next to an outside tree; returns (root, outside)."""
    outside = base / "outside"
    (outside / "sub").mkdir(parents=True)
    (outside / "f").write_text("secret")
    (base / "sandbox-x").mkdir()
    root = base / "sandbox"
    (root / "a").mkdir(parents=True)
    (root / "a" / "f").write_text("inside")
    (root / "link").symlink_to(outside)
    (root / "up").symlink_to("../outside")
    (root / "abs").symlink_to(root / "a")
    (root / "inner").symlink_to("a")
    (root / "a" / "back").symlink_to("..")
    (root / "a" / "esc").symlink_to("../../outside")
    (root / "loop").symlink_to("loop")
    (root / "flink").symlink_to(outside / "f")
    (root / "pre").symlink_to(base / "sandbox-x")
    os.mkfifo(root / "pipe")
    return root, outside


@given(paths=st.lists(PATHS, min_size=1, max_size=4), swap=st.booleans())
@example(paths=["a/f", "inner/sub/g"], swap=True)  # an undo through a swapped directory
@example(paths=["pipe"], swap=False)  # a FIFO
def test_nothing_outside_the_root_is_ever_touched(paths, swap):
    """Any writes, reads and undos, even after a swap, leave everything outside the root as is."""
    with tempfile.TemporaryDirectory() as name:
        base = Path(name)
        root, outside = _plant(base)
        before = snapshot(base, skip=root)
        tools = tools_for(root)
        ctx = new_context()

        def run() -> None:
            for path in paths:
                for tool in ["fs.write", "fs.read"]:
                    with contextlib.suppress(ToolError):
                        tools[tool](ctx, path=path, contents="pwned")
            undos, _ = ctx._close()
            if swap:
                swap_for_symlink(root / "a", outside)
            for undo in reversed(undos):
                with contextlib.suppress(ToolError, OSError):
                    restore_file(undo.payload)

        try:
            finish_within(run)
        finally:
            release(root / "pipe")
        assert snapshot(base, skip=root) == before
