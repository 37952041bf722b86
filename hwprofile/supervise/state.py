"""The supervisor's state file: what ``hwprofile status`` and ``stop`` read.

Every process the state file mentions is recorded as an identity (:mod:`hwprofile.runtime.processes`:
PID plus start time), and nothing read back from it is trusted or signalled before both match again.

The state file lives only while a supervisor does: the supervisor holds an exclusive ``flock`` on
``<runtime>/supervisor.lock`` for its whole life (:mod:`hwprofile.runtime.lock`) and removes
``state.json`` on a clean exit, leaving ``last.json`` (what ended, and how; no process to signal)
behind. Files are written with :func:`hwprofile.runtime.files.atomic_write`; directories are made
with :func:`hwprofile.runtime.dirs.private_dir`."""

from __future__ import annotations

import contextlib
import json
from pathlib import Path
from typing import Any

from ..errors import OperationError
from ..runtime.files import atomic_write
from ..runtime.lock import FileLock, held

SCHEMA = "hwprofile.state/1"
STATE_FILE = "state.json"
LAST_FILE = "last.json"
LOCK_FILE = "supervisor.lock"


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


# -- the supervisor's lock ---------------------------------------------------------------------


class AlreadySupervising(OperationError):
    """Another supervisor holds the runtime directory's lock."""


class RuntimeLock(FileLock):
    """The supervisor's lock, ``<runtime>/supervisor.lock``, held for its whole life."""

    def __init__(self, runtime: Path) -> None:
        super().__init__(runtime / LOCK_FILE, lambda: AlreadySupervising(already_message(runtime)))


def lock_held(runtime: Path) -> bool:
    """Whether some process holds the supervisor lock of ``runtime`` now."""
    return held(runtime / LOCK_FILE)


def already_message(runtime: Path) -> str:
    state = read_state(runtime / STATE_FILE) or {}
    who = f" (pid {state['supervisor_pid']})" if state.get("supervisor_pid") else ""
    return f"hwprofile is already supervising in {runtime}{who}: `hwprofile stop` first, or use another --runtime-dir"
