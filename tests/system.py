"""What the suite needs of the system: one list (``.ci/packages``, which ``.ci/run`` installs from),
and :func:`need` for a test to ask for a command by name.

The README's test command needs every package on the list, so a missing command is a failure naming
the package to install, never a silent skip: CI runs on a machine where packages installed by hand are
still present, and a skip there would hide a missing install step.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

PACKAGES_FILE = Path(__file__).resolve().parent.parent / ".ci" / "packages"


def packages() -> dict[str, tuple[str, tuple[str, ...]]]:
    """``{command: (Debian package, other paths)}`` from ``.ci/packages``."""
    out: dict[str, tuple[str, tuple[str, ...]]] = {}
    for line in PACKAGES_FILE.read_text().splitlines():
        words = line.split("#", 1)[0].split()
        if words:
            out[words[0]] = (words[1], tuple(words[2:]))
    return out


def find(command: str) -> str | None:
    """Where ``command`` is (PATH, then the paths ``.ci/packages`` names), or None."""
    also = packages()[command][1]  # KeyError: a command the list does not name (add it there)
    found = shutil.which(command)
    if found:
        return found
    return next((p for p in also if os.access(p, os.X_OK)), None)


def need(command: str) -> str:
    """The path of ``command``; the test fails naming its package when it is not installed."""
    path = find(command)
    if path is None:
        import pytest  # here: tests/fakehost.py (benchmarks too) asks for gcc outside a test

        package = packages()[command][0]
        pytest.fail(
            f"{command} is not installed: apt-get install --no-install-recommends {package} "
            "(.ci/run installs every package in .ci/packages)",
            pytrace=False,
        )
    return path


def analyze_verify(*files: str | os.PathLike[str], timeout: float = 300) -> subprocess.CompletedProcess[str]:
    """``systemd-analyze verify`` without the man-page look-up (``--man=no``): whether a page named in
    ``Documentation=`` is installed (``man:sd_notify(3)`` comes only with libsystemd-dev) says nothing
    about a unit, and a host running it need not have the pages. Real unit errors are still reported."""
    return subprocess.run(
        [need("systemd-analyze"), "verify", "--man=no", *map(str, files)],
        capture_output=True,
        text=True,
        timeout=timeout,
    )
