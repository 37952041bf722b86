"""hwprofile's own directories: the runtime directory, the log root, each instance's.

:func:`private_dir` creates a missing one 0700 and checks an existing one with ``lstat`` (not a link,
this user's, not writable by group or others without the sticky bit), refusing it otherwise; it
never changes the mode of a directory it did not create. In a shared directory (a tmpfs,
``logs.dir``) hwprofile makes its own, named per user (:func:`user_dirname`)."""

from __future__ import annotations

import os
import stat
import tempfile
from pathlib import Path

from ..errors import InputError


def user_dirname() -> str:
    """The name of hwprofile's own directory inside a shared one (a tmpfs, ``logs.dir``, /tmp):
    ``hwprofile`` for root, ``hwprofile-<uid>`` for anyone else, so users never share one."""
    uid = os.geteuid()
    return "hwprofile" if uid == 0 else f"hwprofile-{uid}"


def runtime_dir(flag: str | None = None) -> Path:
    """``--runtime-dir``, else ``$HWPROFILE_RUNTIME_DIR``, else ``$XDG_RUNTIME_DIR/hwprofile`` (that
    directory is the user's own), else ``/run/hwprofile`` as root, else ``/tmp/hwprofile-<uid>``.
    Only the path: :func:`private_dir` creates or checks it."""
    if flag or os.environ.get("HWPROFILE_RUNTIME_DIR"):
        return Path(flag or os.environ["HWPROFILE_RUNTIME_DIR"])
    xdg = os.environ.get("XDG_RUNTIME_DIR")
    if xdg:
        return Path(xdg) / "hwprofile"
    if os.geteuid() == 0 and os.path.isdir("/run"):
        return Path("/run/hwprofile")
    return Path(tempfile.gettempdir()) / f"hwprofile-{os.geteuid()}"


def state_dir(flag: str | None = None) -> Path:
    """Where what outlives a run is kept (the daemon's last good plan): ``--state-dir``, else
    ``$HWPROFILE_STATE_DIR`` (the unit's ``StateDirectory``), else ``$XDG_STATE_HOME/hwprofile``, else
    ``/var/lib/hwprofile`` as root, else ``~/.local/state/hwprofile``. Only the path."""
    if flag or os.environ.get("HWPROFILE_STATE_DIR"):
        return Path(flag or os.environ["HWPROFILE_STATE_DIR"])
    if os.environ.get("XDG_STATE_HOME"):
        return Path(os.environ["XDG_STATE_HOME"]) / "hwprofile"
    if os.geteuid() == 0:
        return Path("/var/lib/hwprofile")
    return Path.home() / ".local" / "state" / "hwprofile"


def cache_dir() -> Path:
    """What can be made again, kept to save the work: ``$XDG_CACHE_HOME/hwprofile``, else
    ``~/.cache/hwprofile`` (the unit sets ``XDG_CACHE_HOME`` to its ``CacheDirectory``). Only the path."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "hwprofile"


class UnsafeDirectory(InputError):
    """A directory hwprofile would use exists but is not safely its own (the message says why)."""


def _owner(uid: int) -> str:
    try:
        import pwd

        return f"uid {uid} ({pwd.getpwuid(uid).pw_name})"
    except (KeyError, ImportError):
        return f"uid {uid}"


def check_private(path: Path, st: os.stat_result | None = None) -> None:
    """Refuse (:class:`UnsafeDirectory`) an existing ``path`` that is a symbolic link, not a directory,
    owned by another user, or writable by group or others without the sticky bit. Uses ``lstat``:
    a link is never followed, so what is checked is what is there."""
    if st is None:
        try:
            st = os.lstat(path)
        except NotADirectoryError:
            raise UnsafeDirectory(f"{path}: a part of the path above it is a file, not a directory") from None
    if stat.S_ISLNK(st.st_mode):
        raise UnsafeDirectory(f"{path} is a symbolic link: hwprofile does not use a directory through a link")
    if not stat.S_ISDIR(st.st_mode):
        raise UnsafeDirectory(f"{path} exists and is not a directory")
    me = os.geteuid()
    if st.st_uid != me:
        raise UnsafeDirectory(
            f"{path} is owned by {_owner(st.st_uid)}, not by this user ({_owner(me)}): "
            "not used (remove it, or choose another directory)"
        )
    mode = stat.S_IMODE(st.st_mode)
    if mode & (stat.S_IWGRP | stat.S_IWOTH) and not mode & stat.S_ISVTX:
        who = " and ".join(w for w, bit in (("group", stat.S_IWGRP), ("others", stat.S_IWOTH)) if mode & bit)
        raise UnsafeDirectory(
            f"{path} is writable by {who} (mode {mode:04o}) without the sticky bit: not used "
            f"(`chmod go-w {path}`, or choose another directory)"
        )


def check_parent(parent: Path, name: str) -> None:
    """Refuse to create ``name`` in ``parent`` when someone else could replace it there: a parent
    owned by another user than root or this one, or writable by others without the sticky bit
    (group-writable is let be: /var/log is root:syslog 0775 on Debian and Ubuntu)."""
    st = os.stat(parent)
    mode = stat.S_IMODE(st.st_mode)
    if st.st_uid not in (0, os.geteuid()):
        raise UnsafeDirectory(
            f"{parent} is owned by {_owner(st.st_uid)}: hwprofile does not create {name} in it "
            "(choose another directory)"
        )
    if mode & stat.S_IWOTH and not mode & stat.S_ISVTX:
        raise UnsafeDirectory(
            f"{parent} is writable by others (mode {mode:04o}) without the sticky bit: hwprofile "
            f"does not create {name} in it (choose another directory)"
        )


def private_dir(path: Path) -> Path:
    """``path`` as a directory of this user's own: created 0700 when missing (missing parents too,
    with the default mode; the parent it goes in is checked with :func:`check_parent`), else
    checked with :func:`check_private`. The mode of a directory hwprofile did not create is never
    changed."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        st = None
    except NotADirectoryError:
        raise UnsafeDirectory(f"{path}: a part of the path above it is a file, not a directory") from None
    if st is None:
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            check_parent(path.parent, path.name)
            os.mkdir(path, 0o700)
        except FileExistsError:  # someone else was faster: check theirs
            check_private(path)
            return path
        except NotADirectoryError:
            raise UnsafeDirectory(f"{path}: a part of the path above it is a file, not a directory") from None
        except OSError as e:  # /proc, /sys, a read-only mount, no permission
            raise UnsafeDirectory(
                f"{path}: cannot be created ({e.strerror or e}): choose another directory"
            ) from None
        # Ours: a umask may have taken owner bits off 0700; the descriptor pins the directory made.
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
        try:
            check_private(path, os.fstat(fd))
            os.fchmod(fd, 0o700)
        finally:
            os.close(fd)
        return path
    check_private(path, st)
    return path
