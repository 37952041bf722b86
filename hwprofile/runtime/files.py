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
import os
import secrets
import stat

from ..errors import OperationError


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
    raw = data.encode("utf-8") if isinstance(data, str) else data
    tmp = os.path.join(directory, f".{os.path.basename(path)}.{secrets.token_hex(6)}.tmp")
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    try:
        fd = os.open(tmp, flags, 0o600)
    except OSError as e:
        raise WriteError(e.errno, f"cannot write {path}: {e.strerror}") from e
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
        os.replace(tmp, path)
    except OSError as e:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise WriteError(e.errno, f"cannot write {path}: {e.strerror}") from e
    if not durable:
        return
    try:
        dfd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    except OSError:
        return
    try:
        os.fsync(dfd)
    except OSError:
        pass
    finally:
        os.close(dfd)


# -- the one way to read a file ------------------------------------------------------------------


class UnsafeFile(OSError):
    """A file hwprofile will not read (not a regular file, a link where none is taken, another user's,
    too large); ``strerror`` says why in words, ``filename`` names it; ``size``: the bytes seen when
    too large (``errno.EFBIG``), None when only the read (not the size) showed it."""

    size: int | None = None


_KINDS = ((stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
          (stat.S_ISSOCK, "a socket"), (stat.S_ISDIR, "a directory"))  # fmt: skip


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
            e = UnsafeFile(errno.EFBIG, f"{st.st_size} bytes, more than the {cap} allowed", path)
            e.size = st.st_size
            raise e
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
