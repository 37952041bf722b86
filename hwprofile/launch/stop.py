"""``hwprofile stop``: the supervisor asked to stop; without one, what it left ended, each process
verified by its start time before it is signalled."""

from __future__ import annotations

import signal
from pathlib import Path

from ..runtime.processes import (
    ALIVE,
    GONE,
    TEARDOWN_S,
    Identity,
    check,
    group_left,
    signal_process,
    start_time,
    wait_gone,
    wait_group_gone,
)
from ..supervise.runfiles import STATE_FILE, SupervisorDoc, read_doc, remove


def _outlived(leader: Identity) -> str:
    """Wait until what was killed of ``leader``'s group is torn down; what outlived that, said."""
    left = wait_group_gone(leader)
    return f"; {len(left)} still there after {TEARDOWN_S:.0f} s: {[m.pid for m in left]}" if left else ""


def _end_leftovers(leader: Identity) -> str:
    """Kill, one by one and each verified, the members of a group whose leader is gone (a group is
    never signalled once its leader may have been reaped), and wait until they are torn down."""
    left = [m for m in group_left(leader) if m.pid != leader.pid]
    if not left:
        return ""
    killed = sum(signal_process(m, signal.SIGKILL) for m in left)
    return (f"; {killed} leftover processes killed" if killed else "") + _outlived(leader)


def _end_unsupervised(name: str, ident: Identity, grace: float) -> str:
    """End an instance its supervisor left behind: SIGTERM to the verified leader, then SIGKILL to
    its group while the leader still lives, or to each member outliving it. It returns once the
    kill has taken effect (the port and the memory are free), or says what outlived it."""
    signal_process(ident, signal.SIGTERM)
    if not wait_gone(ident, grace) and signal_process(ident, signal.SIGKILL, group=True):
        return f"{name}: process group {ident.pid} killed after {grace:.0f} s" + _outlived(ident)
    return f"{name}: pid {ident.pid} stopped" + _end_leftovers(ident)


def stop(runtime: Path, timeout: float = 120) -> list[str]:
    """Ask the supervisor to stop (SIGTERM); without one, end the recorded processes. Nothing is
    signalled unless its PID still has the start time recorded for it, and nothing is read from a
    state file that :func:`hwprofile.supervise.runfiles.read_doc` does not trust (exit 2 naming it)."""
    state = read_doc(runtime / STATE_FILE, SupervisorDoc)
    if state is None:
        return ["nothing to stop"]
    done: list[str] = []
    pid, sup = state.supervisor_pid, state.supervisor
    verdict = check(sup)
    if verdict == ALIVE:
        signal_process(sup, signal.SIGTERM)
        if wait_gone(sup, timeout):
            done.append(f"supervisor {pid} stopped")
        else:
            signal_process(sup, signal.SIGKILL)
            wait_gone(sup, 10)
            done.append(f"supervisor {pid} did not stop in {timeout:.0f} s: killed")
        state = read_doc(runtime / STATE_FILE, SupervisorDoc)  # a clean stop removed it
        if state is None:
            return done
    else:
        done.append(f"stale state file: supervisor pid {pid}: {verdict}; not signalled")
    for inst in state.instances:
        ident = inst.process
        what = check(ident)
        if what == ALIVE and ident is not None:
            done.append(_end_unsupervised(inst.name, ident, inst.stop_grace_s))
        elif ident is not None:
            # A zombie leader pins its number, so what is in its group is its own: ended too. A
            # leader long gone names nothing: its number may lead another group by now.
            zombie = what == GONE and start_time(ident.pid) == ident.start
            done.append(
                f"{inst.name}: pid {ident.pid}: {what}; not signalled"
                + (_end_leftovers(ident) if zombie else "")
            )
    remove(runtime / STATE_FILE)  # everything it names is checked and ended: the file is done
    return done
