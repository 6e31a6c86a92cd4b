"""The `fs.*` built-in tools, their sandbox and the `fs.restore_file` compensation.

Paths are relative to a sandbox root fixed when the tools are built. `fs.write` records a
durable undo (`fs.restore_file` with the file's prior bytes) *before* it writes, so a write that
fails halfway is still undone, and writes atomically through a temporary file.

Every path is walked one component at a time from a descriptor of the root, each directory
opened with `O_NOFOLLOW` relative to the one before (`openat`), so a directory swapped for a
symlink between a check and a use is seen at the use, never followed by the kernel; the file
itself is then read, replaced (`renameat`) or deleted (`unlinkat`) relative to the directory
descriptor the walk ended on. Only regular files are read or replaced: a FIFO, socket or device
is refused without blocking. The same walk serves the tools and the undo, in a rewind and in
crash recovery. What it cannot see is a directory moved out of the root (which takes write access
outside it) while a call holds it open: the call finishes in that directory.

Messages (`docs/protocol.md#fs-tools`): an escape is ``path '{p}' escapes the sandbox``, a missing
file ``No such file or directory: '{p}'``, any other I/O error ``{strerror}: '{p}'``, where `p` is
the relative path as the agent wrote it; and a FIFO, socket or device is ``not a regular file:
'{p}'``.
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import secrets
import stat
from pathlib import Path, PurePath, PurePosixPath
from typing import TYPE_CHECKING, Final

from .._errors import InvalidArgument, ToolError
from .._tools import Compensation, Tool, ToolContext, compensation, tool
from ._args import text_arg
from ._specs import DESCRIPTIONS, PARAMETERS

if TYPE_CHECKING:
    from collections.abc import Iterator, Sequence

    from .._json import JSONValue

__all__ = ["TMP_SUFFIX", "Sandbox", "fs_tools", "restore_file"]

#: Suffix of the temporary files an atomic write goes through before one is renamed into place.
#: Each is named `.{16 random hex digits}.agenttx-tmp` and created exclusively, so it can never be
#: another file, and a file a user named `x.agenttx-tmp` is left alone.
TMP_SUFFIX: Final = ".agenttx-tmp"

_RESTORE_KIND: Final = "fs.restore_file"
_HEX: Final = re.compile(r"[0-9A-Fa-f]*")
_NOFOLLOW: Final[int] = getattr(os, "O_NOFOLLOW", 0)
_CLOEXEC: Final[int] = getattr(os, "O_CLOEXEC", 0)
_DIRECTORY: Final[int] = getattr(os, "O_DIRECTORY", 0)
_NONBLOCK: Final[int] = getattr(os, "O_NONBLOCK", 0)
# O_PATH (Linux) opens a directory for walking only, so one the process may search but not list
# can still be passed through; elsewhere the directory is opened for reading.
_DIR_FLAGS: Final[int] = getattr(os, "O_PATH", os.O_RDONLY) | _DIRECTORY | _CLOEXEC
_READ_FLAGS: Final[int] = os.O_RDONLY | _NOFOLLOW | _NONBLOCK | _CLOEXEC
_TMP_FLAGS: Final[int] = os.O_WRONLY | os.O_CREAT | os.O_EXCL | _NOFOLLOW | _CLOEXEC
# A regular file the undo rewrites in place: never through a symlink, never blocking on a FIFO.
_REWRITE_FLAGS: Final[int] = os.O_WRONLY | _NOFOLLOW | _NONBLOCK | _CLOEXEC
# The walk needs `openat`-style calls; without them (Windows) the tools refuse every path.
_DIR_FD_CALLS: Final = {os.open, os.mkdir, os.unlink, os.stat, os.readlink, os.rename}
_SUPPORTED: Final = bool(_NOFOLLOW and _DIRECTORY) and _DIR_FD_CALLS.issubset(os.supports_dir_fd)
_MAX_HOPS: Final = 40  # symlinks followed in one walk, as Linux allows; then ELOOP
_TMP_ATTEMPTS: Final = 8
_MKDIR_ATTEMPTS: Final = 8  # for one directory that vanishes again each time it is made


def _escape(rel: str) -> ToolError:
    return ToolError(f"path '{rel}' escapes the sandbox")


def _not_regular(rel: str) -> ToolError:
    return ToolError(f"not a regular file: '{rel}'")


def _io_error(exc: OSError, rel: str) -> ToolError:
    if isinstance(exc, FileNotFoundError):
        return ToolError(f"No such file or directory: '{rel}'")
    return ToolError(f"{exc.strerror or exc}: '{rel}'")


def _os_error(code: int) -> OSError:
    return OSError(code, os.strerror(code))


class _SymlinkError(Exception):
    """The walk met a symlink it may not follow; `prefix` is the path up to and including it."""

    def __init__(self, prefix: str) -> None:
        super().__init__(prefix)
        self.prefix = prefix


class _Walk:
    """Opens the directory that holds a path's last component, from a root directory descriptor.

    Each directory component is opened with `O_NOFOLLOW | O_DIRECTORY` relative to the
    descriptor of the one before, so a component that is (or has just become) a symlink is
    never followed by the kernel. With `aliases` (the root's absolute spellings), a symlink is
    followed by this walk itself if its target stays under the root: a relative target is
    resolved from the directory the link is in, an absolute one must start with an alias, and a
    `..` goes back to the directory descriptor the walk came from, never past the root. Any
    other symlink raises `_SymlinkError`. Without `aliases` every symlink raises it.

    `names` is the canonical path walked, from the root, as directory names. With `create`, a
    missing directory is made with `mkdirat` and then opened like any other.
    """

    __slots__ = ("_aliases", "_create", "_fds", "names")

    def __init__(
        self, root_fd: int, *, create: bool, aliases: Sequence[tuple[str, ...]] | None
    ) -> None:
        self._fds = [root_fd]
        self._create = create
        self._aliases = aliases
        self.names: list[str] = []

    @property
    def fd(self) -> int:
        """The descriptor of the directory the walk is in."""
        return self._fds[-1]

    def close(self) -> None:
        """Close every descriptor the walk opened (the root's stays open: the caller owns it)."""
        while len(self._fds) > 1:
            os.close(self._fds.pop())
        self.names.clear()

    def walk(self, folders: Sequence[str]) -> None:
        """Descend through `folders`; raises `_SymlinkError` or `OSError`."""
        pending = list(reversed(folders))
        hops = made = 0
        while pending:
            part = pending.pop()  # never "" or ".": PurePath drops them
            if part == "..":
                if not self.names:
                    raise _SymlinkError("..")
                os.close(self._fds.pop())
                self.names.pop()
                continue
            try:
                fd = os.open(part, _DIR_FLAGS | _NOFOLLOW, dir_fd=self.fd)
            except FileNotFoundError:
                # A directory removed each time it is made must not keep the walk going.
                if not self._create or made >= _MKDIR_ATTEMPTS:
                    raise
                made += 1
                with contextlib.suppress(FileExistsError):
                    os.mkdir(part, 0o777, dir_fd=self.fd)
                pending.append(part)
                continue
            except OSError as exc:
                # A symlink opened with O_NOFOLLOW | O_DIRECTORY fails with ELOOP or ENOTDIR.
                if exc.errno not in {errno.ELOOP, errno.ENOTDIR} or not self._is_link(part):
                    raise
                hops += 1
                if hops > _MAX_HOPS:
                    raise _os_error(errno.ELOOP) from None
                pending.extend(reversed(self._follow(part)))
                continue
            self._fds.append(fd)
            self.names.append(part)
            made = 0

    def _is_link(self, name: str) -> bool:
        try:
            return stat.S_ISLNK(os.stat(name, dir_fd=self.fd, follow_symlinks=False).st_mode)
        except OSError:
            return False

    def _follow(self, link: str) -> list[str]:
        """The components to walk instead of the symlink `link` in the current directory."""
        prefix = "/".join([*self.names, link])
        if self._aliases is None:
            raise _SymlinkError(prefix)
        target = PurePosixPath(os.readlink(link, dir_fd=self.fd))
        if not target.is_absolute():
            return list(target.parts)
        for alias in self._aliases:
            if target.parts[: len(alias)] == alias:
                self.close()  # back to the root, then down the target's path
                return list(target.parts[len(alias) :])
        raise _SymlinkError(prefix)


def _check_rel(rel: str) -> tuple[str, ...]:
    """The components of an agent's relative path; raises `ToolError` for one it may not use."""
    if "\0" in rel:
        raise ToolError(f"file name contained an unexpected NUL byte: '{rel}'")
    pure = PurePath(rel)
    if not rel or rel.startswith(".") or pure.anchor or ".." in pure.parts or not pure.parts:
        raise _escape(rel)
    return pure.parts


class Sandbox:
    """Resolves agent-supplied relative paths inside one root directory.

    A path is accepted when it is non-empty, relative, does not start with `.`, and has no `..`
    component (a `.` or an empty component in the middle is normalised away);
    every symlink on the way to it stays inside the root (it is followed by the walk, never by
    the kernel); and the target itself is not a symlink. Anything else fails with
    ``path '{p}' escapes the sandbox``. The root itself, and the directories above it, are the
    caller's and are trusted: a symlink there is followed.
    """

    __slots__ = ("_root",)

    def __init__(self, root: str | os.PathLike[str]) -> None:
        self._root = str(Path(root).absolute())

    def read(self, rel: str) -> bytes:
        """The bytes of the regular file at `rel`; raises `ToolError` (the step's message)."""
        parts = _check_rel(rel)
        try:
            with self._parent(rel, parts, create=False) as (parent_fd, _):
                data, _mode = _read_at(parent_fd, parts[-1], rel)
        except OSError as exc:
            raise _io_error(exc, rel) from None
        return data

    def write(self, ctx: ToolContext, rel: str, data: bytes) -> None:
        """Replace the file at `rel` with `data`, registering its undo before it writes.

        Creates the root and missing parent directories (only ever inside the root). Raises
        `ToolError` (the step's message); the undo stays registered if the write itself fails.
        """
        parts = _check_rel(rel)
        try:
            Path(self._root).mkdir(parents=True, exist_ok=True)
            real_root = os.path.realpath(self._root)
            with self._parent(rel, parts, create=True) as (parent_fd, names):
                try:
                    prior, mode = _read_at(parent_fd, parts[-1], rel)
                except FileNotFoundError:
                    prior, mode = None, None
                target = str(Path(real_root).joinpath(*names, parts[-1]))
                ctx.register_undo(
                    _RESTORE_KIND,
                    {
                        "path": target,
                        "prior_hex": None if prior is None else prior.hex(),
                        "root": real_root,
                    },
                    description=f"{'delete' if prior is None else 'restore'} {target}",
                )
                _write_at(parent_fd, parts[-1], data, mode)
        except OSError as exc:
            raise _io_error(exc, rel) from None

    @contextlib.contextmanager
    def _parent(
        self, rel: str, parts: Sequence[str], *, create: bool
    ) -> Iterator[tuple[int, list[str]]]:
        """Yield the descriptor of `rel`'s parent directory and its canonical names."""
        if not _SUPPORTED:
            raise ToolError("the fs tools need a POSIX system with openat and O_NOFOLLOW")
        root_fd = os.open(self._root, _DIR_FLAGS)
        aliases = [
            PurePosixPath(os.path.realpath(self._root)).parts,
            PurePosixPath(self._root).parts,
        ]
        walk = _Walk(root_fd, create=create, aliases=aliases)
        try:
            walk.walk(parts[:-1])
            yield walk.fd, list(walk.names)
        except _SymlinkError:
            raise _escape(rel) from None
        finally:
            walk.close()
            os.close(root_fd)


def _read_at(dir_fd: int, name: str, rel: str) -> tuple[bytes, int]:
    """The bytes and permission bits of the regular file `name` in `dir_fd`.

    Never follows a symlink (`path '{rel}' escapes the sandbox`) and never blocks on a FIFO:
    anything but a regular file or a directory is ``not a regular file: '{rel}'``, and a
    directory raises `IsADirectoryError`. Other failures raise `OSError`.
    """
    _check_regular(os.stat(name, dir_fd=dir_fd, follow_symlinks=False).st_mode, rel)
    try:
        fd = os.open(name, _READ_FLAGS, dir_fd=dir_fd)
    except OSError as exc:
        if exc.errno == errno.ELOOP:  # it became a symlink after the check
            raise _escape(rel) from None
        if exc.errno == errno.ENXIO:  # a socket, or a device without its driver
            raise _not_regular(rel) from None
        raise
    with os.fdopen(fd, "rb") as file:
        mode = os.fstat(fd).st_mode
        _check_regular(mode, rel)  # it may have been swapped after the check
        return file.read(), stat.S_IMODE(mode)


def _check_regular(mode: int, rel: str) -> None:
    if stat.S_ISREG(mode):
        return
    if stat.S_ISLNK(mode):
        raise _escape(rel)
    if stat.S_ISDIR(mode):
        raise _os_error(errno.EISDIR)
    raise _not_regular(rel)


def _write_at(dir_fd: int, name: str, data: bytes, mode: int | None) -> None:
    """Replace `name` in `dir_fd` with a regular file holding `data`, atomically.

    The bytes go to a new temporary file in the same directory (a random name, created with
    `O_EXCL | O_NOFOLLOW`, so no existing file is ever opened), are fsynced, and the file is
    renamed over `name` (which, if it is a symlink, is replaced, not followed). `mode`, if
    given, is set on the new file. The temporary file is removed if anything fails. Readers see
    the old or the new contents, never a mix.
    """
    for _ in range(_TMP_ATTEMPTS):
        tmp = f".{secrets.token_hex(8)}{TMP_SUFFIX}"
        try:
            fd = os.open(tmp, _TMP_FLAGS, 0o666, dir_fd=dir_fd)
        except FileExistsError:
            continue
        break
    else:
        raise _os_error(errno.EEXIST)
    try:
        with os.fdopen(fd, "wb") as file:
            if mode is not None:
                os.fchmod(file.fileno(), mode)
            file.write(data)
            file.flush()
            os.fsync(file.fileno())
        os.replace(tmp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp, dir_fd=dir_fd)
        raise


# ---------------------------------------------------------------------- the undo

#: Why an existing name is replaced by a new file rather than rewritten in place: it is gone, a
#: symlink, a FIFO without a reader or a device, a directory, or not writable by this process.
_NOT_REWRITTEN: Final = frozenset(
    {errno.ENOENT, errno.ELOOP, errno.ENXIO, errno.EISDIR, errno.EAGAIN, errno.EACCES, errno.EPERM}
)


def _rewrite_at(dir_fd: int, name: str, data: bytes) -> bool:
    """Write `data` over the regular file `name` in `dir_fd`, in place; False if it is none.

    The file keeps its inode, so its hard links, owner, group, mode and extended attributes
    stay; it is written from the start, cut to `len(data)` and fsynced. Not atomic: a reader,
    or a crash, may catch a mix of the old and the new bytes. Anything but a regular file
    (missing, a symlink, a FIFO, a directory; also one swapped in after the check), and a file
    this process may not open for writing (read-only, as `fs.write` may leave one it wrote
    with the prior mode), is left alone and False is returned, so the caller replaces it by name.
    """
    try:
        if not stat.S_ISREG(os.stat(name, dir_fd=dir_fd, follow_symlinks=False).st_mode):
            return False
        fd = os.open(name, _REWRITE_FLAGS, dir_fd=dir_fd)
    except OSError as exc:
        if exc.errno in _NOT_REWRITTEN:
            return False
        raise
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return False
        os.set_blocking(fd, True)  # O_NONBLOCK was only for opening a FIFO swapped in
        view = memoryview(data)
        offset = 0
        while offset < len(data):
            offset += os.pwrite(fd, view[offset:], offset)
        os.ftruncate(fd, len(data))
        os.fsync(fd)
    finally:
        os.close(fd)
    return True


def _restore_parts(path: str, root: str) -> tuple[str, ...]:
    """`path`'s components below `root`; raises `ToolError` if it is not strictly below it."""
    pure, base = PurePosixPath(path), PurePosixPath(root)
    if "\0" in path or not pure.is_absolute() or not pure.is_relative_to(base):
        raise ToolError(f"'{path}' not restored: it is not inside '{root}'")
    parts = pure.relative_to(base).parts
    if not parts or ".." in parts:
        raise ToolError(f"'{path}' not restored: it is not inside '{root}'")
    return parts


def _regular_mode(dir_fd: int, name: str) -> int | None:
    """The permission bits of `name` in `dir_fd` if it is a regular file, else None."""
    try:
        status = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except FileNotFoundError:
        return None
    return stat.S_IMODE(status.st_mode) if stat.S_ISREG(status.st_mode) else None


@compensation(name=_RESTORE_KIND)
def restore_file(payload: JSONValue) -> None:
    """Undo an `fs.write`: put the file's prior bytes back, or delete it if it did not exist.

    `payload` is `{"path": absolute path, "prior_hex": lowercase hex of the prior bytes, or
    null, "root": the sandbox root}`, as `fs.write` records it, with both paths fully resolved.
    The path is walked from the root as `fs.write` walks it, except that no symlink is followed
    at all: the recorded path had none, so one found now was put there since, and the restore is
    refused with a `ToolError` (``'{path}' not restored: '{link}' is a symlink``) rather than
    acting wherever it points; so is a `path` not strictly inside `root`. A payload without
    `root` (recorded by an earlier version) is walked the same way from `/`.

    Idempotent: restoring twice writes the same bytes, and deleting a file that is already gone
    (or whose directory is) succeeds. A regular file at the path is rewritten in place: it
    keeps its inode, so every hard link to it sees the restored bytes, and its owner, group and
    mode stay. The trade-off is atomicity: a reader may see a mix of the old and the restored
    bytes while it runs, and a crash partway leaves such a mix on disk; the undo record stays
    until the compensation is recorded as done, so recovery runs the restore again (it is
    idempotent) and completes it. A file that is missing, a symlink or other non-directory at
    the path, or a file this process may not open for writing (whose mode is then kept), is
    replaced atomically through a temporary file (the path itself, never anything a symlink
    points to). Missing parent directories are recreated; directories
    `fs.write` created are left in place.

    Raises `InvalidArgument` (a `ValueError`) for a bad payload: ``payload missing `path` ``,
    `bad hex` (odd length or a non-hex character), ``"`prior_hex` must be a string or null"``
    or ``"`root` must be an absolute path"``; `ToolError` for a refused path; and `OSError`
    (naming `path`) when the file system refuses.
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
    root = payload.get("root", "/")
    if not isinstance(root, str) or not PurePosixPath(root).is_absolute() or "\0" in root:
        raise InvalidArgument("`root` must be an absolute path")
    parts = _restore_parts(path, root)
    if not _SUPPORTED:
        raise ToolError("the fs tools need a POSIX system with openat and O_NOFOLLOW")
    try:
        root_fd = os.open(root, _DIR_FLAGS)
    except FileNotFoundError:
        if prior_hex is None:
            return  # nothing there: the file is gone already
        Path(root).mkdir(parents=True, exist_ok=True)
        root_fd = os.open(root, _DIR_FLAGS)
    walk = _Walk(root_fd, create=prior_hex is not None, aliases=None)
    try:
        walk.walk(parts[:-1])
        if prior_hex is None:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(parts[-1], dir_fd=walk.fd)
            return
        data = bytes.fromhex(prior_hex)
        if not _rewrite_at(walk.fd, parts[-1], data):
            _write_at(walk.fd, parts[-1], data, _regular_mode(walk.fd, parts[-1]))
    except _SymlinkError as exc:
        link = PurePosixPath(root, exc.prefix)
        raise ToolError(f"'{path}' not restored: '{link}' is a symlink") from None
    except OSError as exc:
        if isinstance(exc, FileNotFoundError) and prior_hex is None:
            return  # a directory on the way is gone, and the file with it
        # The error of an *at call names one component; name the whole path instead.
        raise OSError(exc.errno, exc.strerror, path) from exc
    finally:
        walk.close()
        os.close(root_fd)


def fs_tools(
    fs_root: str | os.PathLike[str],
) -> tuple[Tool[..., JSONValue], Tool[..., JSONValue], Compensation[[JSONValue], None]]:
    """`fs.write` and `fs.read` bound to the sandbox `fs_root`, and the `fs.restore_file` undo.

    Each call builds new tools, so tools for different roots never interfere. Nothing is
    created on disk until `fs.write` runs. The tools hold no state and may run in several
    threads at once, each write through its own temporary file; but files are not isolated
    between transactions: a transaction sees another's writes at once, and of two concurrent
    writes to one file the last rename wins.
    """
    sandbox = Sandbox(fs_root)

    @tool(
        name="fs.write",
        description=DESCRIPTIONS["fs.write"],
        parameters=PARAMETERS["fs.write"],
    )
    def fs_write(ctx: ToolContext, /, **arguments: JSONValue) -> JSONValue:
        """Write `contents` (a string, stored as UTF-8) to `path`; output `{"path", "bytes"}`.

        Creates missing parent directories inside the sandbox, reads the prior bytes,
        registers the `fs.restore_file` undo, and only then writes, atomically. `bytes` is the
        UTF-8 length of `contents`; `path` is echoed as given.
        """
        rel = text_arg(arguments, "path")
        contents = text_arg(arguments, "contents")
        data = contents.encode("utf-8")
        sandbox.write(ctx, rel, data)
        return {"path": rel, "bytes": len(data)}

    @tool(
        name="fs.read",
        description=DESCRIPTIONS["fs.read"],
        parameters=PARAMETERS["fs.read"],
    )
    def fs_read(ctx: ToolContext, /, **arguments: JSONValue) -> JSONValue:  # noqa: ARG001
        """Read the file at `path`; output `{"path", "contents"}`.

        Invalid UTF-8 is replaced with U+FFFD. Creates no directories, not even `fs_root`:
        reading leaves the file system untouched.
        """
        rel = text_arg(arguments, "path")
        data = sandbox.read(rel)
        return {"path": rel, "contents": data.decode("utf-8", errors="replace")}

    return fs_write, fs_read, restore_file
