"""What the host says about peer-to-peer traffic between its GPUs: the IOMMU mode and ACS control
on the PCIe ports between the GPUs. Read-only, bounded reads, roots as parameters (fake trees in
tests). NVML's per-pair P2P read/write/atomics status is read in :mod:`.nvml` (``links``).

IOMMU: the kernel command line (``intel_iommu=``, ``amd_iommu=``, ``iommu=pt``,
``iommu.passthrough=``), the IOMMU units in ``/sys/class/iommu`` and, where a GPU sits in an IOMMU
group, the group's ``type`` (``identity`` is passthrough; ``DMA``/``DMA-FQ`` translate every DMA,
peer-to-peer included).

ACS: the PCIe extended capability 0x000D in each port's config space
(``/sys/bus/pci/devices/<bdf>/config``; beyond the first 64 bytes only root may read it). P2P
Request Redirect (bit 2) or Completion Redirect (bit 3) enabled on a port between two GPUs sends
their peer traffic up to the root complex (and through the IOMMU): slow at best, wrong or hung
on the hosts NCCL and vLLM users report.
"""

from __future__ import annotations

import contextlib
import os
import re
from typing import TYPE_CHECKING

from .snapshot import AcsPort, Interconnect, VllmP2p

if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence

    from .snapshot import Gpu

MAX_CONFIG_BYTES = 4096  # PCIe extended config space
ACS_CAP_ID = 0x000D
ACS_CTRL_BITS = {
    0x01: "source_validation",
    0x02: "translation_blocking",
    0x04: "p2p_request_redirect",
    0x08: "p2p_completion_redirect",
    0x10: "upstream_forwarding",
    0x20: "p2p_egress_control",
    0x40: "direct_translated_p2p",
}
REDIRECT_BITS = 0x04 | 0x08
_BDF = re.compile(r"^[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]$")


def _read_bytes(path: str, cap: int) -> bytes:
    from ..runtime.files import read_bounded

    return read_bounded(path, cap)


def read_iommu(
    proc_root: str, sys_root: str, gpus: Sequence[Gpu]
) -> tuple[str | None, str, tuple[str, ...] | None]:
    """(mode, evidence or why unknown, IOMMU units). Mode: ``off``, ``passthrough`` or ``translated``;
    None when the host does not say."""
    from .linux import sysfs_pci_name

    evidence: list[str] = []
    try:
        cmdline = _read_bytes(os.path.join(proc_root, "cmdline"), 65536).decode("utf-8", "replace").split()
    except OSError as e:
        cmdline = []
        evidence.append(f"kernel command line unreadable ({e.strerror or e})")
    args = {a.partition("=")[0]: a.partition("=")[2] for a in cmdline}
    units: tuple[str, ...] | None
    try:
        units = tuple(sorted(os.listdir(os.path.join(sys_root, "class", "iommu"))))
    except FileNotFoundError:
        units = None
        evidence.append("no /sys/class/iommu")
    except OSError as e:
        units = None
        evidence.append(f"/sys/class/iommu unreadable ({e.strerror or e})")
    types = set()
    for g in gpus:
        if g.lost or not g.pci_bus_id:
            continue
        path = os.path.join(
            sys_root, "bus", "pci", "devices", sysfs_pci_name(g.pci_bus_id), "iommu_group", "type"
        )
        with contextlib.suppress(OSError):
            types.add(_read_bytes(path, 64).decode("ascii", "replace").strip())
    cmd = " ".join(
        f"{k}={args[k]}" if args[k] else k
        for k in ("intel_iommu", "amd_iommu", "iommu", "iommu.passthrough")
        if k in args
    )
    if cmd:
        evidence.append(f"kernel command line: {cmd}")
    if units is not None:
        evidence.append(f"/sys/class/iommu: {', '.join(units) or 'no unit'}")
    if types:
        evidence.append(f"GPU IOMMU group type: {', '.join(sorted(types))}")
    why = "; ".join(evidence)
    if types:
        if types <= {"identity"}:
            return "passthrough", why, units
        return "translated", why, units
    if units == ():
        return "off", why, units
    off = {"intel_iommu": "off", "amd_iommu": "off", "iommu": "off"}
    if any(args.get(k) == v for k, v in off.items()):
        return "off", why, units
    if args.get("iommu") == "pt" or args.get("iommu.passthrough") == "1":
        return "passthrough", why, units
    if units:
        return "translated", why + " (no pt on the command line: DMA is translated by default)", units
    return None, why or "neither the kernel command line nor /sys/class/iommu says", units


def parse_acs(config: bytes) -> tuple[int | None, str | None]:
    """The ACS control register from a config space dump: (ctrl, None), (None, why)."""
    if len(config) < 0x104:
        return None, f"only {len(config)} bytes of config space readable (the extended space needs root)"
    off, seen = 0x100, set()
    while off and off not in seen and off + 8 <= len(config):
        seen.add(off)
        header = int.from_bytes(config[off : off + 4], "little")
        if header in (0, 0xFFFFFFFF):
            break
        if header & 0xFFFF == ACS_CAP_ID:
            return int.from_bytes(config[off + 6 : off + 8], "little"), None
        off = (header >> 20) & 0xFFC
    return 0, None  # no ACS capability: the port forwards peer traffic directly


def _chain(sys_root: str, bdf: str) -> list[str] | None:
    """The PCI functions from the root port down to ``bdf`` (itself last), from the sysfs device path."""
    try:
        real = os.path.realpath(os.path.join(sys_root, "bus", "pci", "devices", bdf))
    except OSError:
        return None
    parts = [p for p in real.split(os.sep) if _BDF.match(p)]
    return parts if parts and parts[-1] == bdf else None


def read_acs(sys_root: str, gpus: Sequence[Gpu]) -> tuple[tuple[AcsPort, ...], str | None]:
    """ACS control of every PCIe port between two GPUs (the ports on one GPU's path below the
    ancestor it shares with the other); a second value says why nothing could be read."""
    from .linux import sysfs_pci_name

    chains: dict[int, list[str]] = {}
    for g in gpus:
        if not g.lost and g.pci_bus_id:
            c = _chain(sys_root, sysfs_pci_name(g.pci_bus_id))
            if c:
                chains[g.index] = c[:-1]  # the ports above the GPU
    if len(chains) < 2:
        return (), "fewer than two GPUs found in sysfs" if len(gpus) > 1 else "one GPU: no peer traffic"
    between: dict[str, set[int]] = {}
    idx = sorted(chains)
    for i, a in enumerate(idx):
        for b in idx[i + 1 :]:
            shared = set(chains[a]) & set(chains[b])
            for gpu in (a, b):
                for port in chains[gpu]:
                    if port not in shared:
                        between.setdefault(port, set()).add(gpu)
    out = []
    for port in sorted(between):
        try:
            ctrl, why = parse_acs(
                _read_bytes(os.path.join(sys_root, "bus", "pci", "devices", port, "config"), MAX_CONFIG_BYTES)
            )
        except OSError as e:
            ctrl, why = None, f"config space unreadable ({e.strerror or e})"
        redirect = None if ctrl is None else bool(ctrl & REDIRECT_BITS)
        out.append(AcsPort(port, tuple(sorted(between[port])), ctrl, redirect, why))
    return tuple(out), None


def read_interconnect(
    proc_root: str, sys_root: str, gpus: Sequence[Gpu], env: Mapping[str, str] | None = None
) -> Interconnect:
    mode, why, units = read_iommu(proc_root, sys_root, gpus)
    usable = [g for g in gpus if not g.lost]
    acs, acs_why = read_acs(sys_root, usable) if len(usable) > 1 else ((), "fewer than two GPUs")
    root, caches, p2p_why = read_vllm_p2p(gpus, env) if len(usable) > 1 else (None, (), "fewer than two GPUs")
    return Interconnect(
        iommu=mode,
        iommu_evidence=why or None,
        iommu_units=units,
        acs_ports=acs,
        acs_unknown=acs_why,
        vllm_cache_root=root,
        vllm_p2p=caches,
        vllm_p2p_unknown=p2p_why,
    )


# -- vLLM's own P2P test, as its custom all-reduce cached it ------------------------------------------

P2P_CACHE_PREFIX = "gpu_p2p_access_cache_for_"
P2P_CACHE_MAX_FILES = 64  # one per CUDA_VISIBLE_DEVICES set vLLM ran with; more are not read
P2P_CACHE_MAX_BYTES = 1 << 16  # 8 GPUs: 64 pairs of ~15 bytes each
_PAIR = re.compile(r"^([0-9]{1,4})->([0-9]{1,4})$")


def vllm_cache_root(env: Mapping[str, str] | None = None) -> str:
    """``VLLM_CACHE_ROOT`` as vLLM resolves it (vllm/envs.py): the variable, else
    ``$XDG_CACHE_HOME/vllm``, else ``~/.cache/vllm``; ``~`` expanded."""
    e = os.environ if env is None else env
    if e.get("VLLM_CACHE_ROOT"):
        return os.path.expanduser(e["VLLM_CACHE_ROOT"])
    xdg = e.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.expanduser(os.path.join(xdg, "vllm"))


def read_vllm_p2p(
    gpus: Sequence[Gpu], env: Mapping[str, str] | None = None
) -> tuple[str | None, tuple[VllmP2p, ...], str | None]:
    """``(cache root, its P2P cache files, why none)``: vLLM's custom all-reduce tests P2P between
    every pair of its visible devices once and caches the answer in
    ``<VLLM_CACHE_ROOT>/gpu_p2p_access_cache_for_<devices>.json`` (``{"0->1": true, ...}``, positions
    in the device list; vllm/distributed/device_communicators/all_reduce_utils.py,
    ``gpu_p2p_access_check``), and trusts that file on every later start. Read-only and bounded: at most
    :data:`P2P_CACHE_MAX_FILES` files of :data:`P2P_CACHE_MAX_BYTES`, regular files only (a FIFO or a
    device planted there is refused), a file that is not such a document is listed with ``unknown``."""
    root = vllm_cache_root(env)
    if not os.path.isabs(root):
        return None, (), f"VLLM_CACHE_ROOT {root!r} is not an absolute path"
    try:
        names = sorted(
            n
            for n in os.listdir(root)
            if n.startswith(P2P_CACHE_PREFIX) and n.endswith(".json") and n.isprintable() and len(n) <= 512
        )
    except FileNotFoundError:
        return root, (), "no vLLM cache directory (vLLM has not run here as this user)"
    except OSError as e:
        return root, (), f"the vLLM cache directory is unreadable ({e.strerror or e})"
    if not names:
        return root, (), "no P2P cache file (vLLM's custom all-reduce has not started here as this user)"
    by_uuid = {g.uuid: g.index for g in gpus if g.uuid}
    indexes = {g.index for g in gpus}
    out = [_p2p_file(root, name, by_uuid, indexes) for name in names[:P2P_CACHE_MAX_FILES]]
    extra = len(names) - P2P_CACHE_MAX_FILES
    return root, tuple(out), (f"{extra} more P2P cache files not read" if extra > 0 else None)


def _p2p_file(root: str, name: str, by_uuid: Mapping[str, int], indexes: set[int]) -> VllmP2p:
    """One P2P cache file: its devices mapped to this host's GPU indexes (by physical id or UUID) and
    the pairs it allows and denies; ``why`` when it cannot be used, or could not be read."""
    import json

    from ..runtime.files import UnsafeFile

    devices = tuple(d[:128] for d in name[len(P2P_CACHE_PREFIX) : -len(".json")].split(","))[:256]
    mapped: list[int] = []
    why = None
    for d in devices:
        if d.isdigit() and int(d) in indexes:
            mapped.append(int(d))  # a physical id: NVML's index under CUDA_DEVICE_ORDER=PCI_BUS_ID
        elif d in by_uuid:
            mapped.append(by_uuid[d])
        else:
            why = f"device {d[:64]!r} is none of this host's GPUs"
            break
    gpu_indexes = tuple(mapped) if why is None and len(set(mapped)) == len(mapped) else None
    if gpu_indexes is None and why is None:
        why = "a device listed twice"
    allowed: list[str] = []
    denied: list[str] = []
    try:
        doc = json.loads(_read_bytes(os.path.join(root, name), P2P_CACHE_MAX_BYTES))
        if not isinstance(doc, dict):
            raise ValueError("not an object")
        for k, v in doc.items():
            m = _PAIR.match(k) if isinstance(k, str) else None
            if m is None or type(v) is not bool or max(int(m[1]), int(m[2])) >= len(devices):
                raise ValueError(f'entry {str(k)[:32]!r}: expected "i->j": true or false')
            if m[1] != m[2]:
                (allowed if v else denied).append(k)
    except (OSError, UnsafeFile, ValueError, UnicodeDecodeError, RecursionError) as e:
        why = f"not read: {e}"[:400]
        allowed, denied = [], []
    return VllmP2p(name, devices, gpu_indexes, tuple(allowed), tuple(denied), why)


def acs_flags(ctrl: int | None) -> tuple[str, ...] | None:
    if ctrl is None:
        return None
    return tuple(name for bit, name in ACS_CTRL_BITS.items() if ctrl & bit)
