"""The supervisor's state file and the identities in it: what ``hwprofile status`` and ``stop`` read.

A PID alone names a process only while it lives: once it is gone the number can belong to anything.
So every process the state file mentions is recorded as an :class:`Identity`, its PID plus its start
time (``/proc/PID/stat`` field 22, clock ticks since boot), and nothing read back from the file is
trusted or signalled before both match again. Signals to such processes go through a pidfd opened
before the check, so the process checked is the process signalled.

The state file lives only while a supervisor does: the supervisor holds an exclusive ``flock`` on
``<runtime>/supervisor.lock`` for its whole life and removes ``state.json`` on a clean exit, leaving
``last.json`` (what ended, and how; no process to signal) behind. Files are written with
:func:`hwprofile.runtime.files.atomic_write`.

Directories (the runtime directory, the log root, each instance's): :func:`private_dir` creates a
missing one 0700 and checks an existing one with ``lstat`` (not a link, this user's, not writable by
group or others without the sticky bit), refusing it otherwise; it never changes the mode of a
directory it did not create. In a shared directory (a tmpfs, ``logs.dir``) hwprofile makes its own,
named per user (:func:`user_dirname`)."""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import signal
import stat
import tempfile
import time
from pathlib import Path
from typing import Any, NamedTuple

from ..errors import InputError, OperationError
from ..runtime.files import atomic_write

SCHEMA = "hwprofile.state/1"
STATE_FILE = "state.json"
LAST_FILE = "last.json"
LOCK_FILE = "supervisor.lock"

# pidfd_send_signal: signal the process group of the target (Linux 6.9+); older kernels say EINVAL.
PIDFD_SIGNAL_PROCESS_GROUP = 1 << 2


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
        st = os.lstat(path)
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
    if st is None:
        path.parent.mkdir(parents=True, exist_ok=True)
        check_parent(path.parent, path.name)
        try:
            os.mkdir(path, 0o700)
        except FileExistsError:  # someone else was faster: check theirs
            check_private(path)
            return path
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


def write_state(path: Path, state: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(path, json.dumps({"schema": SCHEMA, **state}, indent=2), 0o600)


def read_state(path: Path) -> dict[str, Any] | None:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) and data.get("schema") == SCHEMA else None


def remove_state(path: Path) -> None:
    with contextlib.suppress(FileNotFoundError):
        path.unlink()


def pid_alive(pid: int | None, group: bool = False) -> bool:
    """Whether process ``pid`` (or, with ``group``, any process of group ``pid``) exists now. Says
    nothing about *which* process that is: for PIDs read back from a file use :func:`check`."""
    if not pid:
        return False
    try:
        (os.killpg if group else os.kill)(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


# -- identities ------------------------------------------------------------------------------


def _stat_fields(pid: int) -> list[str] | None:
    """``/proc/PID/stat`` from field 3 on (the command name, in parentheses, may hold anything)."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return text.rsplit(")", 1)[1].split()


def start_time(pid: int) -> int | None:
    """Field 22 of ``/proc/PID/stat``: when the process started, in clock ticks since boot."""
    fields = _stat_fields(pid)
    return int(fields[19]) if fields and len(fields) > 19 else None


class Identity(NamedTuple):
    pid: int
    start: int

    def to_json(self) -> dict[str, int]:
        return {"pid": self.pid, "start_time": self.start}


def identify(pid: int) -> Identity | None:
    start = start_time(pid)
    return Identity(pid, start) if start is not None else None


def identity_of(data: Any) -> Identity | None:
    """The identity recorded in a state file (``{"pid": N, "start_time": T}``), or None."""
    if not isinstance(data, dict):
        return None
    pid, start = data.get("pid"), data.get("start_time")
    if isinstance(pid, int) and pid > 0 and isinstance(start, int):
        return Identity(pid, start)
    return None


ALIVE, GONE, REUSED, UNKNOWN = "alive", "gone", "pid reused", "not recorded"


def check(ident: Identity | None) -> str:
    """``alive`` (that very process runs), ``gone``, ``pid reused`` (another process has the number now),
    or ``not recorded``. A zombie counts as gone."""
    if ident is None:
        return UNKNOWN
    fields = _stat_fields(ident.pid)
    if not fields or len(fields) <= 19:
        return GONE
    if int(fields[19]) != ident.start:
        return REUSED
    return GONE if fields[0] in ("Z", "X") else ALIVE


def _pidfd(ident: Identity) -> int | None:
    """A pidfd for exactly ``ident`` (None when that process is gone or the number was reused)."""
    try:
        fd = os.pidfd_open(ident.pid)
    except OSError:
        return None
    if check(ident) != ALIVE:  # checked after opening: the pidfd now pins the process we checked
        os.close(fd)
        return None
    return fd


def signal_process(ident: Identity, sig: int, group: bool = False) -> bool:
    """Send ``sig`` to the process ``ident`` (with ``group``, to its whole process group) only if it is
    still that process and alive; True when sent. The group is signalled only while its leader lives."""
    fd = _pidfd(ident)
    if fd is None:
        return False
    try:
        if not group:
            signal.pidfd_send_signal(fd, sig)
            return True
        try:
            signal.pidfd_send_signal(fd, sig, None, PIDFD_SIGNAL_PROCESS_GROUP)
            return True
        except OSError as e:
            if e.errno != errno.EINVAL:  # EINVAL: an older kernel without group signals
                raise
        signal.pidfd_send_signal(fd, 0)  # the leader still exists (ESRCH otherwise), so its group number does
        os.killpg(ident.pid, sig)
        return True
    except ProcessLookupError:
        return False
    finally:
        os.close(fd)


def group_members(pgid: int, not_before: int | None = None) -> list[Identity]:
    """Processes whose process group is ``pgid`` and, with ``not_before``, that started no earlier
    (processes of a group cannot predate its leader)."""
    out: list[Identity] = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        fields = _stat_fields(int(d.name))
        if not fields or len(fields) <= 19 or fields[0] in ("Z", "X") or int(fields[2]) != pgid:
            continue
        start = int(fields[19])
        if not_before is None or start >= not_before:
            out.append(Identity(int(d.name), start))
    return out


def wait_gone(ident: Identity, timeout: float) -> bool:
    end = time.monotonic() + timeout
    while check(ident) == ALIVE:
        if time.monotonic() >= end:
            return False
        time.sleep(0.1)
    return True


# -- the supervisor's lock ---------------------------------------------------------------------


class AlreadySupervising(OperationError):
    """Another supervisor holds the runtime directory's lock."""


class RuntimeLock:
    """An exclusive ``flock`` on ``<runtime>/supervisor.lock``, held for the supervisor's whole life
    (the kernel drops it when the process ends, however it ends). The file itself stays empty."""

    def __init__(self, runtime: Path) -> None:
        self.path = runtime / LOCK_FILE
        self.fd: int | None = None

    def acquire(self, wait: float = 1.0) -> None:
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        end = time.monotonic() + wait  # a moment's patience: `status` probes the lock briefly
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() >= end:
                    os.close(fd)
                    raise AlreadySupervising(already_message(self.path.parent)) from None
                time.sleep(0.05)
        self.fd = fd

    def release(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None


def lock_held(runtime: Path) -> bool:
    """Whether some process holds the supervisor lock of ``runtime`` now."""
    try:
        fd = os.open(runtime / LOCK_FILE, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)  # closing drops a shared lock we may have taken
    return False


def already_message(runtime: Path) -> str:
    state = read_state(runtime / STATE_FILE) or {}
    who = f" (pid {state['supervisor_pid']})" if state.get("supervisor_pid") else ""
    return f"hwprofile is already supervising in {runtime}{who}: `hwprofile stop` first, or use another --runtime-dir"
