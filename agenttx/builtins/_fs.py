"""The `fs.*` built-in tools, their sandbox and the `fs.restore_file` compensation.

Paths are relative to a sandbox root fixed when the tools are built. `fs.write` records a
durable undo (`fs.restore_file` with the file's prior bytes) *before* it writes, so a write that
fails halfway is still undone, and writes atomically through `<path>.agenttx-tmp`.

Messages follow the reference: an escape is ``path '{p}' escapes the sandbox``, a missing file
``No such file or directory: '{p}'``, any other I/O error ``{strerror}: '{p}'``, where `p` is the
relative path as the agent wrote it.
"""

from __future__ import annotations

import contextlib
import os
import re
import stat
from pathlib import Path, PurePath
from typing import TYPE_CHECKING, Final

from .._errors import InvalidArgument, ToolError
from .._tools import Compensation, Tool, ToolContext, compensation, tool
from ._args import text_arg

if TYPE_CHECKING:
    from .._json import JSONValue

__all__ = ["TMP_SUFFIX", "Sandbox", "fs_tools", "restore_file"]

#: Suffix of the temporary file an atomic write goes through before it is renamed into place.
TMP_SUFFIX: Final = ".agenttx-tmp"

_RESTORE_KIND: Final = "fs.restore_file"
_HEX: Final = re.compile(r"[0-9A-Fa-f]*")
_NOFOLLOW: Final[int] = getattr(os, "O_NOFOLLOW", 0)
_CLOEXEC: Final[int] = getattr(os, "O_CLOEXEC", 0)
_BINARY: Final[int] = getattr(os, "O_BINARY", 0)


def _escape(rel: str) -> ToolError:
    return ToolError(f"path '{rel}' escapes the sandbox")


def _io_error(exc: OSError, rel: str) -> ToolError:
    if isinstance(exc, FileNotFoundError):
        return ToolError(f"No such file or directory: '{rel}'")
    return ToolError(f"{exc.strerror or exc}: '{rel}'")


class Sandbox:
    """Resolves agent-supplied relative paths inside one root directory.

    A path is accepted when it is non-empty, relative, does not start with `.`, and has no `..`
    component (a `.` or an empty component in the middle is normalised away, as Rust does);
    its parent, with symlinks resolved, lies inside the resolved root; and the target itself
    is not a symlink. Anything else fails with ``path '{p}' escapes the sandbox``.
    """

    __slots__ = ("_root",)

    def __init__(self, root: str | os.PathLike[str]) -> None:
        self._root = Path(root).absolute()

    def resolve(self, rel: str, *, create: bool) -> Path:
        """The absolute path of `rel` inside the root, with its parent's symlinks resolved.

        With `create`, the root and the target's parent directories are created, after the
        containment check (so an escaping path creates nothing). Raises `ToolError` for an
        escape and for a NUL byte, and `OSError` when the file system refuses.
        """
        if "\0" in rel:
            raise ToolError(f"file name contained an unexpected NUL byte: '{rel}'")
        pure = PurePath(rel)
        if not rel or rel.startswith(".") or pure.anchor or ".." in pure.parts or not pure.parts:
            raise _escape(rel)
        *folders, name = pure.parts
        root = _real(self._root)
        parent = _real(root.joinpath(*folders))
        if not parent.is_relative_to(root):
            raise _escape(rel)
        if create:
            parent.mkdir(parents=True, exist_ok=True)
            # Resolve again: a component may have been swapped for a symlink meanwhile.
            root = _real(self._root)
            parent = _real(parent)
            if not parent.is_relative_to(root):
                raise _escape(rel)
        target = parent / name
        if target.is_symlink():
            raise _escape(rel)
        return target


def _real(path: Path) -> Path:
    # `os.path.realpath`, not `Path.resolve`: on Python 3.10 and 3.11 the latter raises
    # RuntimeError on a symlink loop, where realpath leaves the loop for `open` to report.
    return Path(os.path.realpath(path))


def _read_bytes(path: Path) -> bytes:
    """The bytes of the file at `path`, refusing to follow a symlink at the last component."""
    fd = os.open(path, os.O_RDONLY | _NOFOLLOW | _CLOEXEC | _BINARY)
    with os.fdopen(fd, "rb") as file:
        return file.read()


def _atomic_write(path: Path, data: bytes) -> None:
    """Replace the file at `path` with `data`: write `<path>.agenttx-tmp`, fsync, rename.

    An existing regular file's permission bits are kept. A stale temporary file (or symlink) from an
    earlier crash is removed first; the temporary file is removed again if the write fails.
    Readers see the old or the new contents, never a mix.
    """
    tmp = path.with_name(path.name + TMP_SUFFIX)
    try:
        status = path.stat(follow_symlinks=False)
    except FileNotFoundError:
        mode = None
    else:
        mode = stat.S_IMODE(status.st_mode) if stat.S_ISREG(status.st_mode) else None
    tmp.unlink(missing_ok=True)
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | _NOFOLLOW | _CLOEXEC | _BINARY
    fd = os.open(tmp, flags, 0o666)
    try:
        with os.fdopen(fd, "wb") as file:
            if mode is not None and hasattr(os, "fchmod"):
                os.fchmod(file.fileno(), mode)
            file.write(data)
            file.flush()
            os.fsync(file.fileno())
        tmp.replace(path)
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise


def _prior_bytes(path: Path) -> bytes | None:
    try:
        return _read_bytes(path)
    except FileNotFoundError:
        return None


@compensation(name=_RESTORE_KIND)
def restore_file(payload: JSONValue) -> None:
    """Undo an `fs.write`: put the file's prior bytes back, or delete it if it did not exist.

    `payload` is `{"path": absolute path, "prior_hex": lowercase hex of the prior bytes, or
    null}`, as `fs.write` records it. Idempotent: restoring twice writes the same bytes, and
    deleting a file that is already gone succeeds. The restore is atomic (through
    `<path>.agenttx-tmp`) and recreates missing parent directories; directories `fs.write`
    created are left in place.

    Raises `InvalidArgument` (a `ValueError`) for a bad payload: ``payload missing `path` ``,
    `bad hex` (odd length or a non-hex character), or
    ``"`prior_hex` must be a string or null"``; and `OSError` when the file system refuses.
    """
    if not isinstance(payload, dict):
        raise InvalidArgument("payload missing `path`")
    path = payload.get("path")
    if not isinstance(path, str) or not path:
        raise InvalidArgument("payload missing `path`")
    prior_hex = payload.get("prior_hex")
    if prior_hex is not None and not isinstance(prior_hex, str):
        raise InvalidArgument("`prior_hex` must be a string or null")
    if prior_hex is not None and (len(prior_hex) % 2 or _HEX.fullmatch(prior_hex) is None):
        raise InvalidArgument("bad hex")
    target = Path(path)
    if prior_hex is None:
        target.unlink(missing_ok=True)
        return
    target.parent.mkdir(parents=True, exist_ok=True)
    _atomic_write(target, bytes.fromhex(prior_hex))


def fs_tools(
    fs_root: str | os.PathLike[str],
) -> tuple[Tool[..., JSONValue], Tool[..., JSONValue], Compensation[[JSONValue], None]]:
    """`fs.write` and `fs.read` bound to the sandbox `fs_root`, and the `fs.restore_file` undo.

    Each call builds new tools, so tools for different roots never interfere. Nothing is
    created on disk until `fs.write` runs. The tools hold no state and may run in several
    threads at once; but files are not isolated between transactions: a transaction sees
    another's writes at once, and two concurrent writes to one file race on its temporary
    file, as in the reference.
    """
    sandbox = Sandbox(fs_root)

    @tool(name="fs.write")
    def fs_write(ctx: ToolContext, /, **arguments: JSONValue) -> JSONValue:
        """Write `contents` (a string, stored as UTF-8) to `path`; output `{"path", "bytes"}`.

        Creates missing parent directories inside the sandbox, reads the prior bytes,
        registers the `fs.restore_file` undo, and only then writes, atomically. `bytes` is the
        UTF-8 length of `contents`; `path` is echoed as given.
        """
        rel = text_arg(arguments, "path")
        contents = text_arg(arguments, "contents")
        try:
            target = sandbox.resolve(rel, create=True)
            prior = _prior_bytes(target)
        except OSError as exc:
            raise _io_error(exc, rel) from None
        ctx.register_undo(
            _RESTORE_KIND,
            {"path": str(target), "prior_hex": None if prior is None else prior.hex()},
            description=f"{'delete' if prior is None else 'restore'} {target}",
        )
        data = contents.encode("utf-8")
        try:
            _atomic_write(target, data)
        except OSError as exc:
            raise _io_error(exc, rel) from None
        return {"path": rel, "bytes": len(data)}

    @tool(name="fs.read")
    def fs_read(ctx: ToolContext, /, **arguments: JSONValue) -> JSONValue:  # noqa: ARG001
        """Read the file at `path`; output `{"path", "contents"}`.

        Invalid UTF-8 is replaced with U+FFFD. Creates no directories (the reference's read
        creates the parent directories; this one leaves the file system untouched).
        """
        rel = text_arg(arguments, "path")
        try:
            data = _read_bytes(sandbox.resolve(rel, create=False))
        except OSError as exc:
            raise _io_error(exc, rel) from None
        return {"path": rel, "contents": data.decode("utf-8", errors="replace")}

    return fs_write, fs_read, restore_file
