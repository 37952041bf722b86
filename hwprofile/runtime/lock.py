"""An exclusive ``flock`` held for a process's whole life (the kernel drops it when the process
ends, however it ends). The lock file itself stays empty."""

from __future__ import annotations

import errno
import fcntl
import os
import stat
import time
from collections.abc import Callable
from pathlib import Path

from ..errors import InputError, OperationError


class FileLock:
    """An exclusive ``flock`` on ``path``; :meth:`acquire` raises what ``busy()`` returns when another
    process holds it after ``wait`` seconds."""

    def __init__(self, path: Path, busy: Callable[[], OperationError]) -> None:
        self.path = path
        self.busy = busy
        self.fd: int | None = None

    def acquire(self, wait: float = 1.0) -> None:
        fd = _open(self.path, os.O_RDWR | os.O_CREAT)
        end = time.monotonic() + wait  # a moment's patience: `status` probes the lock briefly
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() >= end:
                    os.close(fd)
                    raise self.busy() from None
                time.sleep(0.05)
        self.fd = fd

    def release(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None

    def intact(self) -> bool:
        """Whether the file at :attr:`path` is still the one locked (not deleted, not another in its place)."""
        if self.fd is None:
            return False
        try:
            st = os.lstat(self.path)
        except OSError:
            return False
        mine = os.fstat(self.fd)
        return (st.st_dev, st.st_ino) == (mine.st_dev, mine.st_ino)

    def reacquire(self) -> None:
        """The lock taken again at its path (the file, or the directory holding it, was deleted): a new
        file, locked at once (what ``busy()`` returns when another process holds it: then the old lock is
        kept, on its deleted file). The old descriptor is let go once the new one is held."""
        old, self.fd = self.fd, None
        try:
            self.acquire(wait=0.0)
        except BaseException:
            self.fd = old
            raise
        if old is not None:
            os.close(old)


def _open(path: Path, flags: int) -> int:
    """The lock file, never through a link, never waiting (a FIFO planted as the lock would block an
    open), and only a regular file of this user's (else :class:`LockFileError`)."""
    try:
        fd = os.open(path, flags | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, 0o600)
    except OSError as e:
        if e.errno == errno.ELOOP:  # a link (a loop of links too): never followed
            raise LockFileError(
                f"{path}: a symbolic link: not used as hwprofile's lock (remove it)"
            ) from None
        if e.errno == errno.ENOTDIR:
            raise LockFileError(
                f"{path}: its directory is not a directory (a file is in its place)"
            ) from None
        if e.errno in (errno.ENXIO, errno.EACCES, errno.EPERM, errno.EROFS, errno.EISDIR):
            raise LockFileError(f"{path}: cannot be used as hwprofile's lock: {e.strerror}") from None
        raise
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid():
        os.close(fd)
        what = "not a regular file" if not stat.S_ISREG(st.st_mode) else f"owned by uid {st.st_uid}"
        raise LockFileError(f"{path}: {what}: not used as hwprofile's lock (remove it)")
    return fd


class LockFileError(InputError):
    """The lock file is not one hwprofile made (exit 2)."""


def held(path: Path) -> bool:
    """Whether some process holds an exclusive lock on ``path`` now (:class:`LockFileError` when
    the file there is not a lock file of this user's)."""
    try:
        fd = _open(path, os.O_RDONLY)
    except FileNotFoundError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)  # closing drops a shared lock we may have taken
    return False
