"""Processes named by what identifies them, not by a PID alone.

A PID names a process only while it lives: once it is gone the number can belong to anything. So
every process hwprofile records is an :class:`Identity`, its PID plus its start time
(``/proc/PID/stat`` field 22, clock ticks since boot), and nothing read back from a file is trusted
or signalled before both match again. Signals go through a pidfd opened before the check, so the
process checked is the process signalled."""

from __future__ import annotations

import errno
import os
import signal
import sys
import time
from pathlib import Path
from typing import NamedTuple

# pidfd_send_signal: signal the process group of the target (Linux 6.9+); older kernels say EINVAL.
PIDFD_SIGNAL_PROCESS_GROUP = 1 << 2


def module_command() -> list[str]:
    """This interpreter running this installation's hwprofile as a module, for the processes hwprofile
    starts of itself (the detached supervisor, a unit without the console script). ``-P``: the
    working directory is not put first on the import path, so a checkout's ``hwprofile/`` folder where
    the command runs does not shadow the installed package (a newcomer runs commands from the clone)."""
    return [sys.executable, "-P", "-m", "hwprofile"]


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


def _threads_left(pid: int) -> bool:
    """Whether threads of ``pid`` other than its main one are still there (``/proc/PID/task``)."""
    try:
        return len(os.listdir(f"/proc/{pid}/task")) > 1
    except OSError:
        return False


def group_members(pgid: int, not_before: int | None = None, exiting: bool = False) -> list[Identity]:
    """Processes whose process group is ``pgid`` and, with ``not_before``, that started no earlier
    (processes of a group cannot predate its leader). A zombie is left out; with ``exiting``, not
    one whose other threads are still being torn down (the main thread of a killed threaded process
    turns zombie first, and the last thread out closes its sockets and frees its memory)."""
    out: list[Identity] = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        pid = int(d.name)
        fields = _stat_fields(pid)
        if not fields or len(fields) <= 19 or int(fields[2]) != pgid:
            continue
        if fields[0] in ("Z", "X") and not (exiting and _threads_left(pid)):
            continue
        start = int(fields[19])
        if not_before is None or start >= not_before:
            out.append(Identity(pid, start))
    return out


TEARDOWN_S = 10.0  # how long a SIGKILLed process group may take to be torn down before it is reported


def group_left(leader: Identity) -> list[Identity]:
    """What of ``leader``'s process group still holds anything (:func:`group_members` with
    ``exiting``); nothing once its number belongs to another process (the kernel hands out a number
    again only when no process of the group is left)."""
    start = start_time(leader.pid)
    if start is not None and start != leader.start:
        return []
    return group_members(leader.pid, not_before=leader.start, exiting=True)


def wait_group_gone(leader: Identity, timeout: float = TEARDOWN_S) -> list[Identity]:
    """Wait until :func:`group_left` is empty; what is still there after ``timeout``."""
    end = time.monotonic() + timeout
    while (left := group_left(leader)) and time.monotonic() < end:
        time.sleep(0.05)
    return left


def wait_gone(ident: Identity, timeout: float) -> bool:
    end = time.monotonic() + timeout
    while check(ident) == ALIVE:
        if time.monotonic() >= end:
            return False
        time.sleep(0.1)
    return True


def tree_rss(ident: Identity, limit: int = 256) -> int | None:
    """The resident memory (bytes) of ``ident`` and its descendants (``/proc/PID/task/TID/children``,
    ``/proc/PID/statm``): an instance's API server and its engine processes. None when ``ident`` is not
    that process any more (gone, or its number reused); at most ``limit`` processes are read."""
    if check(ident) != ALIVE:
        return None
    page = os.sysconf("SC_PAGE_SIZE")
    total, todo, seen = 0, [ident.pid], set[int]()
    while todo and len(seen) < limit:
        pid = todo.pop()
        if pid in seen:
            continue
        seen.add(pid)
        try:
            total += int(Path(f"/proc/{pid}/statm").read_text().split()[1]) * page
            for tid in os.listdir(f"/proc/{pid}/task"):
                todo += [int(c) for c in Path(f"/proc/{pid}/task/{tid}/children").read_text().split()]
        except (OSError, ValueError, IndexError):
            continue  # a process that ended between the reads: what it held is gone
    return total
