"""One way to write a file: atomically, never through a link, with its mode set before any byte.

``atomic_write`` creates a temporary file beside the target with ``O_CREAT|O_EXCL|O_NOFOLLOW``
(a name another user planted, link or not, makes it fail instead of being followed), sets the mode
on the open descriptor before the data (a secret is never readable by others, not even briefly),
writes, fsyncs, renames over the target and fsyncs the directory. A reader sees the old file or the
new one, never half of one.
"""

from __future__ import annotations

import contextlib
import errno
import io
import os
import stat
from typing import TYPE_CHECKING

from ..errors import OperationError

if TYPE_CHECKING:
    import logging  # the own log's handler only: not imported by commands that write no log


class WriteError(OperationError, OSError):
    """A file could not be written; the message says which and why, in words."""


def _describe(path: str) -> str | None:
    """Why ``path`` cannot be the target of a write, or None."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return None
    if stat.S_ISLNK(st.st_mode):
        return f"{path} is a symbolic link (hwprofile does not write through links)"
    if stat.S_ISDIR(st.st_mode):
        return f"{path} is a directory"
    if not stat.S_ISREG(st.st_mode):
        return f"{path} is not a regular file"
    return None


def atomic_write(
    path: str | os.PathLike[str], data: str | bytes, mode: int = 0o644, durable: bool = True
) -> None:
    """Replace ``path`` with ``data`` atomically (see the module doc). ``str`` is written as UTF-8.

    ``durable=False`` skips the two fsyncs: still atomic (a reader sees the old file or the new
    one), not necessarily on disk after a power cut; for files rewritten every second and useless
    after a reboot (the daemon's live view on a tmpfs)."""
    path = os.fspath(path)
    why = _describe(path)
    if why:
        raise WriteError(errno.EEXIST, why)
    directory = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(directory):
        raise WriteError(errno.ENOENT, f"cannot write {path}: {directory} is not a directory")
    try:
        dfd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError as e:
        raise WriteError(e.errno, f"cannot write {path}: {e.strerror}") from e
    try:
        _write_in(dfd, os.path.basename(path), path, data, mode, durable)
    finally:
        os.close(dfd)


def _write_in(dfd: int, name: str, label: str, data: str | bytes, mode: int, durable: bool) -> None:
    """The atomic write of ``name`` inside the open directory ``dfd`` (``label``: its path, for messages)."""
    try:
        st = os.stat(name, dir_fd=dfd, follow_symlinks=False)
    except FileNotFoundError:
        st = None
    if st is not None and not stat.S_ISREG(st.st_mode):
        what = (
            "a symbolic link (hwprofile does not write through links)"
            if stat.S_ISLNK(st.st_mode)
            else ("a directory" if stat.S_ISDIR(st.st_mode) else "not a regular file")
        )
        raise WriteError(errno.EEXIST, f"{label} is {what}")
    raw = data.encode("utf-8") if isinstance(data, str) else data
    tmp = f".{name}.{os.urandom(6).hex()}.tmp"
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    try:
        fd = os.open(tmp, flags, 0o600, dir_fd=dfd)
    except OSError as e:
        raise WriteError(e.errno, f"cannot write {label}: {e.strerror}") from e
    try:
        try:
            os.fchmod(fd, mode)
            view = memoryview(raw)
            while view:
                n = os.write(fd, view)
                view = view[n:]
            if durable:
                os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, name, src_dir_fd=dfd, dst_dir_fd=dfd)
    except OSError as e:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp, dir_fd=dfd)
        raise WriteError(e.errno, f"cannot write {label}: {e.strerror}") from e
    if durable:
        with contextlib.suppress(OSError):
            os.fsync(dfd)


# -- writing where another user may write: walk, never follow ------------------------------------


class UnsafeDirectory(WriteError):
    """A directory on the way to a write is not this user's alone: another user's, writable by others
    (without the sticky bit), a symbolic link, or not a directory; the message names it and says why."""


def _untrusted(st: os.stat_result, uid: int) -> str | None:
    """Why a directory with this ``stat`` may be changed by another user than ``uid`` (or root), or None."""
    if not stat.S_ISDIR(st.st_mode):
        return "not a directory"
    if st.st_uid not in (uid, 0):
        return f"owned by another user (uid {st.st_uid}; this process runs as uid {uid})"
    if st.st_mode & 0o022 and not st.st_mode & stat.S_ISVTX:
        return f"writable by other users (mode {stat.S_IMODE(st.st_mode):04o}, without the sticky bit)"
    return None


def _open_below(dfd: int, name: str, label: str, uid: int, create: bool, dmode: int) -> int | None:
    """The directory ``name`` in ``dfd``, opened without following a link and checked; None when
    missing and not to be created."""
    flags = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
    for attempt in (0, 1):
        try:
            fd = os.open(name, flags, dir_fd=dfd)
        except FileNotFoundError:
            if not create or attempt:
                return None
            try:
                os.mkdir(name, dmode, dir_fd=dfd)
            except FileExistsError:
                pass
            except OSError as e:
                raise WriteError(e.errno, f"cannot create {label}: {e.strerror}") from e
            continue
        except OSError as e:
            if e.errno in (errno.ELOOP, errno.ENOTDIR):
                try:
                    link = stat.S_ISLNK(os.stat(name, dir_fd=dfd, follow_symlinks=False).st_mode)
                except OSError:
                    link = False
                why = (
                    "a symbolic link (hwprofile does not write through links)" if link else "not a directory"
                )
                raise UnsafeDirectory(errno.ELOOP, f"{label} is {why}") from None
            raise WriteError(e.errno, f"cannot open {label}: {e.strerror}") from e
        untrusted = _untrusted(os.fstat(fd), uid)
        if untrusted:
            os.close(fd)
            raise UnsafeDirectory(errno.EPERM, f"{label} is {untrusted}")
        return fd
    return None


def open_trusted_dir(
    base: str | os.PathLike[str], parts: tuple[str, ...] = (), *, create: bool = True, mode: int = 0o755
) -> int | None:
    """An open descriptor of ``base/parts...``, reached from ``/`` one directory at a time with
    ``O_NOFOLLOW|O_DIRECTORY`` (``base`` is resolved first: a link the user configured is taken,
    but nothing on the resolved way may be a link, another user's, or writable by other users
    without the sticky bit; the same holds for ``parts``, created with ``mode`` where missing and
    ``create``). None when a directory is missing and not created. Raises :class:`UnsafeDirectory`
    naming the directory that is not this user's alone, :class:`WriteError` else. The caller closes
    the descriptor."""
    uid = os.geteuid()
    real = os.path.realpath(os.fspath(base))
    chain = [p for p in real.split(os.sep) if p]
    for p in parts:
        if not p or p in (".", "..") or os.sep in p:
            raise WriteError(errno.EINVAL, f"{p!r}: not a single folder name")
    fd = os.open("/", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    why = _untrusted(os.fstat(fd), uid)
    if why:
        os.close(fd)
        raise UnsafeDirectory(errno.EPERM, f"/ is {why}")
    where = ""
    try:
        for i, name in enumerate([*chain, *parts]):
            where = f"{where}/{name}"
            below = i >= len(chain)
            nxt = _open_below(fd, name, where, uid, create, mode if below else 0o755)
            os.close(fd)
            fd = -1
            if nxt is None:
                return None
            fd = nxt
    except BaseException:
        if fd >= 0:
            os.close(fd)
        raise
    return fd


def check_trusted_dirs(base: str | os.PathLike[str], *trees: tuple[str, ...]) -> None:
    """Every existing directory of each path ``base/tree...`` is this user's alone (see
    :func:`open_trusted_dir`); none is created. Raises :class:`UnsafeDirectory` naming the first
    that is not."""
    for tree in ((), *trees):
        fd = open_trusted_dir(base, tree, create=False)
        if fd is not None:
            os.close(fd)


def trusted_write(
    base: str | os.PathLike[str],
    parts: tuple[str, ...],
    name: str,
    data: str | bytes,
    mode: int = 0o644,
    durable: bool = True,
) -> str:
    """Write ``base/parts.../name`` atomically where other users might otherwise redirect it: every
    directory on the way checked and opened without following links (:func:`open_trusted_dir`,
    the missing ones created), the file written through a temporary one in that verified directory
    and renamed over ``name`` there. Returns the path written."""
    label = os.path.join(os.fspath(base), *parts, name)
    if not name or name in (".", "..") or os.sep in name:
        raise WriteError(errno.EINVAL, f"{label}: not a file name")
    dfd = open_trusted_dir(base, parts, create=True)
    assert dfd is not None
    try:
        _write_in(dfd, name, label, data, mode, durable)
    finally:
        os.close(dfd)
    return label


# -- the one way to read a file ------------------------------------------------------------------


class UnsafeFile(OSError):
    """A file hwprofile will not read (not a regular file, a link where none is taken, another user's,
    too large); ``strerror`` says why in words, ``filename`` names it; ``size``: the bytes seen when
    too large (``errno.EFBIG``), None when only the read (not the size) showed it."""

    size: int | None = None


_KINDS = (
    (stat.S_ISFIFO, "a FIFO"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISSOCK, "a socket"),
    (stat.S_ISDIR, "a directory"),
)


def read_bounded(
    path: str | os.PathLike[str],
    cap: int,
    *,
    follow: bool = True,
    owner: int | None = None,
    pipe: bool = False,
) -> bytes:
    """The bytes of the regular file ``path``, at most ``cap`` of them, never blocking and never
    endless: opened with ``O_NONBLOCK`` (a FIFO cannot hang the open or the read), refused unless
    ``fstat`` of what was opened says a regular file (not a FIFO, ``/dev/zero``, a socket), read up
    to ``cap + 1`` bytes (procfs files report size 0: the read, not the size, decides).

    ``follow=False``: a symbolic link is refused (``O_NOFOLLOW``), for files hwprofile wrote itself.
    ``owner``: the file must belong to that uid (the run-time files: this user's own).
    ``pipe``: a pipe is read too, to its end (a file the user named on the command line, such as
    ``--from <(hwprofile detect --json)``; one without a writer reads as empty at once).
    Raises ``FileNotFoundError`` when missing, :class:`UnsafeFile` when refused, ``OSError`` else."""
    path = os.fspath(path)
    flags = os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | (0 if follow else os.O_NOFOLLOW)
    try:
        fd = os.open(path, flags)
    except OSError as e:
        if e.errno == errno.ELOOP and not follow:
            raise UnsafeFile(errno.ELOOP, "a symbolic link (not followed)", path) from None
        raise
    try:
        st = os.fstat(fd)
        if pipe and stat.S_ISFIFO(st.st_mode):
            os.set_blocking(fd, True)  # opened without waiting for a writer; now read what it writes
        elif not stat.S_ISREG(st.st_mode):
            kind = next((k for test, k in _KINDS if test(st.st_mode)), "an unknown kind")
            raise UnsafeFile(errno.EINVAL, f"not a regular file ({kind})", path)
        if owner is not None and st.st_uid != owner:
            raise UnsafeFile(errno.EPERM, f"owned by uid {st.st_uid}, not by this user (uid {owner})", path)
        if st.st_size > cap:
            big = UnsafeFile(errno.EFBIG, f"{st.st_size} bytes, more than the {cap} allowed", path)
            big.size = st.st_size
            raise big
        chunks: list[bytes] = []
        left = cap + 1
        while left > 0:
            chunk = os.read(fd, min(left, 1 << 20))
            if not chunk:
                break
            chunks.append(chunk)
            left -= len(chunk)
        data = b"".join(chunks)
    finally:
        os.close(fd)
    if len(data) > cap:
        raise UnsafeFile(errno.EFBIG, f"more than the {cap} bytes allowed", path)
    return data


OWN_LOG_BYTES = 4 * 2**20  # hwprofile's own log: on a tmpfs (RAM), so bounded: this, then one older file
OWN_LOG_FILES = 2


def own_log_handler(path: str | os.PathLike[str]) -> logging.Handler:
    """hwprofile's own log file: rotated at ``OWN_LOG_BYTES`` (one older file kept, ``.1``), and opened
    again, 0600, when it was deleted under the process (a runtime directory made again), so that lines
    never go into a file nobody can read."""
    import logging.handlers  # binds ``logging`` too

    class OwnLog(logging.handlers.RotatingFileHandler):
        def _open(self) -> io.TextIOWrapper:
            fd = os.open(
                self.baseFilename,
                os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW | os.O_CLOEXEC,
                0o600,
            )
            return open(fd, "a", encoding=self.encoding or "utf-8", errors=self.errors)

        def emit(self, record: logging.LogRecord) -> None:
            if self.stream is not None:
                try:
                    gone = os.fstat(self.stream.fileno()).st_nlink == 0
                except (OSError, ValueError):
                    gone = True
                if gone:  # deleted: a new file (when its directory is there again)
                    with contextlib.suppress(OSError):
                        self.stream.close()
                    self.stream = None
                    try:
                        self.stream = self._open()
                    except OSError:
                        return  # its directory is gone too: the line is lost, not the process
            super().emit(record)

    return OwnLog(os.fspath(path), maxBytes=OWN_LOG_BYTES, backupCount=OWN_LOG_FILES - 1, encoding="utf-8")
