"""An instance's states and the only moves between them (after supervisor's ``states.py`` and
``process.py``: a closed set of states, groups to ask "can this be signalled?", and one method that
changes state after checking the move is allowed, so an illegal move fails loudly)."""

from __future__ import annotations

import enum
import threading
from collections.abc import Callable


class State(enum.StrEnum):
    STARTING = "starting"  # spawned (or about to be), /health not 200 yet
    READY = "ready"  # /health answered 200
    RESTARTING = "restarting"  # after a failure: waiting out the backoff, or starting again
    STOPPING = "stopping"  # asked to stop: draining, then the process group is ended
    STOPPED = "stopped"  # stopped because we asked (terminal)
    FAILED = "failed"  # gave up, a configuration error, or the supervisor itself broke (terminal, except
    # that an instance that gave up after too many failures in a row is tried again after a cool-off:
    # supervise.retry_failed_s)


TERMINAL = frozenset({State.STOPPED, State.FAILED})
RUNNING = frozenset({State.STARTING, State.READY, State.RESTARTING, State.STOPPING})
SIGNALLABLE = RUNNING  # states in which a process of ours may exist

ALLOWED: dict[State, frozenset[State]] = {
    State.STARTING: frozenset({State.STARTING, State.READY, State.RESTARTING, State.STOPPING, State.FAILED}),
    State.READY: frozenset({State.RESTARTING, State.STOPPING, State.FAILED}),
    State.RESTARTING: frozenset({State.RESTARTING, State.READY, State.STOPPING, State.FAILED}),
    State.STOPPING: frozenset({State.STOPPED, State.FAILED}),
    State.STOPPED: frozenset(),
    State.FAILED: frozenset({State.RESTARTING}),  # only its own retry after the cool-off
}


class IllegalTransition(RuntimeError):
    pass


class Machine:
    """One instance's state. :meth:`change` is the only writer; ``on_change`` runs after each move
    (the supervisor saves its state file there)."""

    def __init__(self, name: str, on_change: Callable[[State, State], None] | None = None) -> None:
        self.name = name
        self._state = State.STARTING
        self._lock = threading.Lock()
        self._on_change = on_change

    @property
    def state(self) -> State:
        return self._state

    def change(self, new: State) -> None:
        with self._lock:
            old = self._state
            if new not in ALLOWED[old]:
                raise IllegalTransition(f"{self.name}: {old} -> {new} is not allowed")
            self._state = new
        if self._on_change:
            self._on_change(old, new)

    def fail(self) -> bool:
        """Move to FAILED from any state that is not terminal (used when the supervisor thread breaks);
        False when already terminal."""
        with self._lock:
            old = self._state
            if old in TERMINAL:
                return False
            self._state = State.FAILED
        if self._on_change:
            self._on_change(old, State.FAILED)
        return True
