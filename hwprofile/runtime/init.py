"""PID 1's duties, for ``hwprofile daemon`` as a container's entrypoint.

The first process of a PID namespace has two jobs no other process has: the kernel hands it every
orphan (a vLLM worker whose parent died, a helper's helper), whose exit it must wait for, or the
zombie stays until the pod ends; and it gets no signal it has not asked for (a SIGTERM with the
default disposition is dropped, so the kubelet's stop would wait out the grace period and end in
SIGKILL). :func:`become_init` splits the process in two, as tini and dumb-init do: the parent stays
PID 1, forwards the stopping signals to the child and reaps whatever the kernel hands it; the child
returns and runs the daemon as any other process. The parent ends with the child's exit status
(128 + N for a child ended by signal N, like a shell), so the container exits with the daemon's fate.

The child's own children (vLLM) are the daemon's to wait for: only the parent reaps every PID, and
it has one child of its own, so it can never take an exit status the daemon's supervisor waits for.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading

FORWARDED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2)


def exit_status(status: int) -> int:
    """A shell's exit code for a wait status: the exit code, or 128 + the signal that ended it."""
    code = os.waitstatus_to_exitcode(status)
    return 128 - code if code < 0 else code


def become_init(say: bool = True) -> bool:
    """As PID 1: fork; the parent forwards :data:`FORWARDED` to the child, reaps every process and
    exits with the child's status (it never returns); the child returns True. Not PID 1, or with
    threads already running (a fork would copy them half-way): returns False and changes nothing."""
    if os.getpid() != 1 or threading.active_count() > 1:
        return False
    for stream in (sys.stdout, sys.stderr):
        stream.flush()  # nothing buffered is written twice
    old = signal.pthread_sigmask(signal.SIG_BLOCK, FORWARDED)  # none lost before the handlers exist
    child = os.fork()
    if child == 0:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)
        return True
    if say:
        print(
            f"hwprofile: PID 1: the daemon runs as PID {child}; signals are forwarded to it, "
            "orphans reaped here",
            file=sys.stderr,
            flush=True,
        )

    def forward(signum: int, _frame: object) -> None:
        with contextlib.suppress(ProcessLookupError):  # it is ending: its exit is reaped below
            os.kill(child, signum)

    for s in FORWARDED:
        signal.signal(s, forward)
    signal.pthread_sigmask(signal.SIG_SETMASK, old)
    code = 1
    while True:
        try:
            pid, status = os.waitpid(-1, 0)  # EINTR: PEP 475 retries after the handler ran
        except ChildProcessError:  # no child left at all: the daemon's status was lost (cannot happen)
            break
        if pid == child:
            code = exit_status(status)
            break
    os._exit(code)  # the namespace ends with PID 1: whatever is left is killed by the kernel


__all__ = ["FORWARDED", "become_init", "exit_status"]
