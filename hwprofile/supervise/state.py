"""The supervisor's state file: what ``hwprofile status`` and ``hwprofile stop`` read.

Written atomically (temp file + rename) on every change, under a runtime directory."""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any

SCHEMA = "hwprofile.state/1"


def runtime_dir(flag: str | None = None) -> Path:
    if flag or os.environ.get("HWPROFILE_RUNTIME_DIR"):
        return Path(flag or os.environ["HWPROFILE_RUNTIME_DIR"])
    xdg = os.environ.get("XDG_RUNTIME_DIR")
    if xdg:
        return Path(xdg) / "hwprofile"
    if os.geteuid() == 0 and os.path.isdir("/run"):
        return Path("/run/hwprofile")
    return Path(tempfile.gettempdir()) / f"hwprofile-{os.geteuid()}"


def write_state(path: Path, state: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        json.dump({"schema": SCHEMA, **state}, f, indent=2)
    os.replace(tmp, path)


def read_state(path: Path) -> dict[str, Any] | None:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) and data.get("schema") == SCHEMA else None


def pid_alive(pid: int | None, group: bool = False) -> bool:
    """Whether process ``pid`` (or, with ``group``, any process of group ``pid``) still exists."""
    if not pid:
        return False
    try:
        (os.killpg if group else os.kill)(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
