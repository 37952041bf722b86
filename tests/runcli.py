"""The command as a user types it, for the tests: ``python -m hwprofile ARGS`` in a child process (this
interpreter, so the checkout under test), its output captured as text, bounded by ``timeout``."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path


def hwprofile(
    *args: str,
    env: Mapping[str, str] | None = None,
    extra_env: Mapping[str, str] | None = None,
    timeout: float = 60,
    cwd: str | Path | None = None,
) -> subprocess.CompletedProcess[str]:
    """Run ``hwprofile ARGS``: ``env`` the whole environment (default: this process's), ``extra_env``
    added on top of it."""
    full = {**(os.environ if env is None else env), **(extra_env or {})}
    return subprocess.run(
        [sys.executable, "-m", "hwprofile", *args],
        env=full,
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
