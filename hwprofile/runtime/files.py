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
