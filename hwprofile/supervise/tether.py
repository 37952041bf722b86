"""Run a command tied to its supervisor's life: ``python -I -S tether.py PARENT LIFE_FD GRACE -- CMD...``.

Executed by path in a bare interpreter (the standard library only, no hwprofile import: it runs
between fork and vLLM, and hwprofile's modules are neither needed nor wanted there). In order:

1. ask the kernel for SIGTERM when the parent dies (``PR_SET_PDEATHSIG``) and check the parent is
   still ``PARENT`` (it may have died before the request was made): the graceful part, vLLM drains;
2. start a *keeper*: forked twice, so it is nobody's child but init's (vLLM may kill or wait for
   its own children at shutdown), in this process group, its standard streams on ``/dev/null`` (the
   log pipe must close when vLLM exits). It waits for one of two things: ``LIFE_FD`` (the read end
   of a pipe whose write end only the supervisor holds) reaching end of file, which happens however
   the supervisor dies, SIGKILL included; or this process exiting (a pidfd), after which the
   supervisor, alive, ends the rest of the group itself and the keeper just leaves. On the former
   it gives this process ``GRACE`` seconds to drain and exit, then SIGKILLs the whole process group
   (itself included): a vLLM that ignores or outlives SIGTERM cannot outlive its supervisor by more
   than its drain. The group cannot be another's: the keeper is a member, so its number is in use;
3. exec ``CMD`` in place: the same PID, so the supervisor's child *is* vLLM, and the parent-death
   request (kept across exec for programs that are not set-user-ID) stays.

Without pidfds (Linux < 5.3) the keeper is skipped and said so on stderr: the parent-death signal
alone remains.
"""

from __future__ import annotations

import ctypes
import os
import select
import signal
import sys

PR_SET_PDEATHSIG = 1
PR_SET_NAME = 15


def keep(life: int, pidfd: int, grace: float) -> None:
    """The keeper's life (see the module docstring). Never returns."""
    try:
        null = os.open(os.devnull, os.O_RDWR)
        for fd in (0, 1, 2):
            os.dup2(null, fd)
        low, high = sorted((life, pidfd))
        os.closerange(3, low)
        os.closerange(low + 1, high)
        os.closerange(high + 1, os.sysconf("SC_OPEN_MAX"))
        ctypes.CDLL(None).prctl(PR_SET_NAME, b"hwprofile-keep", 0, 0, 0)
        poll = select.poll()
        poll.register(life, select.POLLIN | select.POLLHUP)
        poll.register(pidfd, select.POLLIN)
        while True:
            ready = {fd for fd, _ in poll.poll()}
            if pidfd in ready:  # vLLM exited: its supervisor is alive to end the rest, or also gone
                if life not in ready:
                    os._exit(0)
                break
            if life in ready and not os.read(life, 1):
                break  # end of file: every write end closed, the supervisor is gone
        # the supervisor is gone: the leader had SIGTERM from the kernel; its drain, then the group
        # (what the leader left behind, or the leader itself when it ignored SIGTERM)
        select.select([pidfd], [], [], grace)
        os.killpg(os.getpgid(0), signal.SIGKILL)
    finally:
        os._exit(0)


def main(argv: list[str]) -> None:
    parent, life, grace = int(argv[0]), int(argv[1]), float(argv[2])
    command = argv[4:] if argv[3:4] == ["--"] else argv[3:]
    ctypes.CDLL(None).prctl(PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
    if os.getppid() != parent:
        sys.exit(70)  # the supervisor died before the request: start nothing
    try:
        pidfd = os.pidfd_open(os.getpid())
    except (AttributeError, OSError) as e:
        print(f"hwprofile: no keeper for this vLLM (pidfd_open: {e})", file=sys.stderr, flush=True)
    else:
        first = os.fork()
        if first == 0:  # no setsid: the keeper stays in this process group
            if os.fork() == 0:
                keep(life, pidfd, grace)
            os._exit(0)
        os.waitpid(first, 0)
        os.close(pidfd)
    os.close(life)
    os.execvp(command[0], command)


if __name__ == "__main__":
    main(sys.argv[1:])
