"""The host snapshot: a frozen, plain-data picture of one machine, and the limits of its contract.

Records are ``typing.NamedTuple``s: immutable, and cheap to define (a frozen dataclass costs ~1 ms
each to create at import on these machines, a NamedTuple ~0.2 ms; ``detect`` has a 100 ms budget).

Detection (:mod:`hwprofile.host.detect`) is the only code that produces it from the live host;
everything downstream (matching, planning, rendering) reads only this. It serialises to JSON under the
schema ``hwprofile.host/1`` and loads back unchanged, so a snapshot can be saved on one machine and
replayed on another (``--from FILE``).

This module is what detection needs: the records, their JSON form, the contract's limits. Reading a
saved snapshot back (:mod:`.snapshot_io`: :func:`~.snapshot_io.load_snapshot` for a file,
:func:`~.snapshot_io.snapshot_from_dict` for parsed JSON), the load-time checks (:mod:`.snapshot_check`,
in the rule vocabulary of :mod:`hwprofile.contracts`) and the published JSON Schema
(:mod:`.snapshot_schema`) stand above it: detection never imports them.

Unknown values are ``None``; what could not be read, and why, is listed in ``errors``.
"""

import json
import threading
from collections.abc import Iterable, Mapping
from types import MappingProxyType
from typing import Any, NamedTuple

from ..errors import InputError

SCHEMA = "hwprofile.host/1"

# Limits of the hwprofile.host/1 contract (checked at load by .snapshot_check).
MAX_SNAPSHOT_BYTES = 4 << 20  # a snapshot of 256 GPUs is ~1 MB; anything larger is not one
MAX_GPUS = 256
MAX_DEVICE_MINOR = 255  # /dev/nvidia<minor> is a char device of major 195, minors 0-255
MAX_CPUS = 16384
MAX_NUMA_NODES = 1024


# -- cpulists (the kernel's "0-3,8" form) -----------------------------------------------------


def parse_cpulist(text: str) -> list[int]:
    """``"0-3,8,10-11"`` → ``[0, 1, 2, 3, 8, 10, 11]``. Empty text → ``[]``. A CPU number at or
    above :data:`MAX_CPUS`, or a range running backwards, is a ``ValueError`` (a
    ``0-4000000000`` would otherwise build a list of four billion numbers)."""
    cpus: list[int] = []
    for part in text.strip().split(","):
        part = part.strip()
        if not part:
            continue
        lo, _, hi = part.partition("-")
        try:
            first, last = int(lo), int(hi or lo)
        except ValueError:
            raise ValueError(f"CPU range {part!r}: not a CPU number or a range of them") from None
        if not 0 <= first <= last < MAX_CPUS:
            raise ValueError(f"CPU range {part!r}: CPUs are numbered 0 to {MAX_CPUS - 1}, ascending")
        cpus.extend(range(first, last + 1))
        if len(cpus) > MAX_CPUS:
            raise ValueError(f"more than {MAX_CPUS} CPUs listed")
    return cpus


def format_cpulist(cpus: Iterable[int]) -> str:
    """``[0, 1, 2, 3, 8]`` → ``"0-3,8"`` (sorted, duplicates dropped)."""
    ordered = sorted(set(cpus))
    runs: list[str] = []
    i = 0
    while i < len(ordered):
        j = i
        while j + 1 < len(ordered) and ordered[j + 1] == ordered[j] + 1:
            j += 1
        runs.append(str(ordered[i]) if i == j else f"{ordered[i]}-{ordered[j]}")
        i = j + 1
    return ",".join(runs)


# Clock-event (throttle) reason bits, as in nvml.h (nvmlClocksEventReason*).
CLOCK_EVENT_REASONS: dict[int, str] = {
    0x1: "gpu_idle",
    0x2: "applications_clocks_setting",
    0x4: "sw_power_cap",
    0x8: "hw_slowdown",
    0x10: "sync_boost",
    0x20: "sw_thermal_slowdown",
    0x40: "hw_thermal_slowdown",
    0x80: "hw_power_brake_slowdown",
    0x100: "display_clock_setting",
}

# Link vocabulary of ``nvidia-smi topo -m``, best first.
LINK_KINDS = ("NV", "PIX", "PXB", "PHB", "NODE", "SYS")


class SnapshotError(InputError, ValueError):
    """A saved snapshot that cannot be read; the message says which file and what is wrong."""


def decode_clock_event_reasons(mask: int | None) -> tuple[str, ...] | None:
    if mask is None:
        return None
    names = [name for bit, name in CLOCK_EVENT_REASONS.items() if mask & bit]
    unknown = mask & ~sum(CLOCK_EVENT_REASONS)
    if unknown:
        names.append(f"unknown_0x{unknown:x}")
    return tuple(names)


class PcieLink(NamedTuple):
    gen: int | None = None
    width: int | None = None
    max_gen: int | None = None
    max_width: int | None = None

    @property
    def degraded(self) -> bool:
        """True when the link trained below the width or generation the board supports."""
        return (self.width is not None and self.max_width is not None and self.width < self.max_width) or (
            self.gen is not None and self.max_gen is not None and self.gen < self.max_gen
        )


class Gpu(NamedTuple):
    index: int  # type: ignore[assignment]  # the NVML index; shadows tuple.index, which no caller uses
    name: str | None = None
    uuid: str | None = None
    pci_bus_id: str | None = None
    pci_device_id: str | None = None
    minor_number: int | None = None  # N of /dev/nvidiaN (NVML index != minor); None = unknown
    memory_total_bytes: int | None = None
    memory_used_bytes: int | None = None
    memory_reserved_bytes: int | None = None  # set aside by the driver (NVML memory v2)
    compute_capability: str | None = None
    numa_node: int | None = None
    numa_node_source: str | None = None  # "nvml" or "sysfs"
    cpu_affinity: str | None = None
    pcie: PcieLink = PcieLink()
    nvlink_active_links: int | None = None
    power_limit_watts: float | None = None
    power_draw_watts: float | None = None
    temperature_c: int | None = None
    temperature_slowdown_c: int | None = None
    temperature_shutdown_c: int | None = None
    sm_clock_mhz: int | None = None
    sm_clock_max_mhz: int | None = None
    clocks_event_reasons: tuple[str, ...] | None = None
    clocks_event_reasons_mask: int | None = None
    lost: bool = False
    # hardware faults at detection (NVML; None: not supported or not read): uncorrectable ECC errors
    # since the driver loaded, retired pages or remapped rows waiting for a GPU reset, a failed remap
    ecc_uncorrected: int | None = None
    retired_pages_pending: bool | None = None
    remapped_rows_pending: bool | None = None
    row_remap_failure: bool | None = None

    @property
    def memory_total_gib(self) -> float | None:
        return None if self.memory_total_bytes is None else self.memory_total_bytes / 2**30

    @property
    def cuda_total_bytes(self) -> int | None:
        """The total CUDA reports (``cudaMemGetInfo``, of which vLLM's ``gpu_memory_utilization`` is a
        share): NVML's total less what the driver reserves. None where either is unread (NVML's memory
        v1 does not say the reservation)."""
        if self.memory_total_bytes is None or self.memory_reserved_bytes is None:
            return None
        return self.memory_total_bytes - self.memory_reserved_bytes

    @property
    def faults(self) -> tuple[str, ...]:
        """The fatal hardware faults this GPU reported at detection, each ``kind: what`` (the daemon's
        words, daemon/policy.py ``read_faults``): a GPU that has one is not planned for."""
        out = []
        if self.ecc_uncorrected:
            n = self.ecc_uncorrected
            out.append(f"ecc_uncorrectable: {n} uncorrectable ECC error(s) since the driver loaded")
        if self.row_remap_failure:
            out.append(
                "row_remap_failure: a row remapping failed (the card's spare rows are spent: replace it)"
            )
        if self.remapped_rows_pending:
            out.append("row_remap_pending: remapped rows wait for a GPU reset")
        if self.retired_pages_pending:
            out.append("retired_pages_pending: retired pages wait for a GPU reset")
        return tuple(out)


class GpuLink(NamedTuple):
    a: int
    b: int
    link: str | None  # NV<n>, PIX, PXB, PHB, NODE, SYS; None when unknown
    p2p: bool | None = None  # NVML P2P read status OK
    p2p_write: bool | None = None  # NVML P2P write status OK
    p2p_atomics: bool | None = None  # NVML P2P atomics status OK


class AcsPort(NamedTuple):
    """ACS control of one PCIe port between GPUs (see :mod:`.interconnect`)."""

    bdf: str  # sysfs name, 0000:00:01.0
    gpu_indexes: tuple[int, ...]  # the GPUs below it whose peer traffic crosses it
    acs_ctrl: int | None  # the ACS control register; 0 where the port has no ACS capability
    redirect: bool | None  # P2P request or completion redirect on: peer traffic goes via the root complex
    unknown: str | None = None  # why acs_ctrl is None


class VllmP2p(NamedTuple):
    """One of vLLM's cached peer-to-peer tests (``gpu_p2p_access_cache_for_<devices>.json`` under
    ``VLLM_CACHE_ROOT``, written by its custom all-reduce's first start on those devices and trusted
    by every later one): which pairs of its devices reached each other."""

    file: str  # the file's name
    devices: tuple[str, ...]  # the devices its name lists (CUDA_VISIBLE_DEVICES entries or physical ids)
    gpu_indexes: tuple[int, ...] | None  # their NVML indexes; None: not mapped (why in ``unknown``)
    allowed: tuple[str, ...] = ()  # "i->j" (positions in ``devices``): P2P works
    denied: tuple[str, ...] = ()  # "i->j": vLLM found no P2P (its custom all-reduce stays off)
    unknown: str | None = None


class Interconnect(NamedTuple):
    """What the host says about peer-to-peer traffic between GPUs; None is unknown, with the reason."""

    iommu: str | None = None  # off, passthrough, translated
    iommu_evidence: str | None = None  # what it was read from, or why it is unknown
    iommu_units: tuple[str, ...] | None = None  # /sys/class/iommu entries
    acs_ports: tuple[AcsPort, ...] = ()
    acs_unknown: str | None = None  # why no port was read
    vllm_cache_root: str | None = None  # where vLLM keeps its P2P cache files (VLLM_CACHE_ROOT)
    vllm_p2p: tuple[VllmP2p, ...] = ()
    vllm_p2p_unknown: str | None = None  # why none was read


class NumaNode(NamedTuple):
    id: int
    cpus: str
    memory_bytes: int | None = None


class Cpu(NamedTuple):
    model: str | None = None
    logical_cpus: int | None = None
    sockets: int | None = None
    flags: tuple[str, ...] = ()


class Driver(NamedTuple):
    version: str | None = None
    cuda_version: str | None = None
    nvml_library: str | None = None


class Software(NamedTuple):
    vllm_version: str | None = None
    vllm_distribution: str | None = None
    numactl_path: str | None = None
    tmpfs_path: str | None = None
    tmpfs_free_bytes: int | None = None
    # vLLM's fused-MoE kernel configs (``E=…,N=…,device_name=…[,dtype=…].json``): the directory the
    # installed release ships and its file names, and VLLM_TUNED_CONFIG_FOLDER's (None: not read / not set)
    moe_configs_dir: str | None = None
    moe_configs: tuple[str, ...] | None = None
    tuned_config_folder: str | None = None
    tuned_configs: tuple[str, ...] | None = None
    router_path: str | None = None  # vLLM's router (pip install vllm-router), None when not installed
    # host/software.py KERNEL_PACKAGES installed ("name version"): () none; None not read (an older
    # snapshot): FlashInfer and OpenAI's triton_kernels, which vLLM before 0.12 does not install itself
    kernel_packages: tuple[str, ...] | None = None


class DetectError(NamedTuple):
    where: str
    message: str


class HostSnapshot(NamedTuple):
    hostname: str | None = None
    kernel: str | None = None
    cpu: Cpu = Cpu()
    memory_bytes: int | None = None
    numa_nodes: tuple[NumaNode, ...] = ()
    gpus: tuple[Gpu, ...] = ()
    gpu_links: tuple[GpuLink, ...] = ()
    driver: Driver = Driver()
    software: Software = Software()
    errors: tuple[DetectError, ...] = ()
    schema: str = SCHEMA
    interconnect: Interconnect = Interconnect()

    # -- derived facts, for matching and planning ---------------------------------------------
    @property
    def usable_gpus(self) -> tuple[Gpu, ...]:
        return tuple(g for g in self.gpus if not g.lost)

    def link(self, a: int, b: int) -> GpuLink | None:
        """The link between GPUs ``a`` and ``b`` (either order), the first listed; O(1) after the
        snapshot's first look-up (see :func:`_link_index`)."""
        return _link_index(self.gpu_links).get((a, b))

    def links(self) -> Mapping[tuple[int, int], GpuLink]:
        """Every pair's link, under ``(a, b)`` and ``(b, a)``: :meth:`link` of many pairs at once."""
        return MappingProxyType(_link_index(self.gpu_links))

    # -- serialisation --------------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        d = _plain(self)
        out: dict[str, Any] = {"schema": d.pop("schema")}
        out.update(d)
        for g, gd in zip(self.gpus, out["gpus"], strict=True):
            gd["pcie"]["degraded"] = g.pcie.degraded
        return out

    def to_json(self, indent: int | None = 2) -> str:
        return json.dumps(self.to_dict(), indent=indent, sort_keys=False)


# The pair index of a snapshot's link list, built once per list: a NamedTuple has no room for a
# cached attribute, so the index lives here, keyed by the (immutable) list's identity; each entry
# holds its list, so the identity cannot be reused while the entry lives. A few entries suffice
# (a command plans one host; the daemon compares two snapshots).
_LINK_INDEX: dict[int, tuple[tuple[GpuLink, ...], dict[tuple[int, int], GpuLink]]] = {}
_LINK_INDEX_SIZE = 8
_LINK_INDEX_LOCK = threading.Lock()


def _link_index(links: tuple[GpuLink, ...]) -> dict[tuple[int, int], GpuLink]:
    """``(a, b)`` and ``(b, a)`` → the first link listed between them."""
    with _LINK_INDEX_LOCK:
        hit = _LINK_INDEX.get(id(links))
        if hit is not None and hit[0] is links:
            return hit[1]
    index: dict[tuple[int, int], GpuLink] = {}
    for lk in links:
        index.setdefault((lk.a, lk.b), lk)
        index.setdefault((lk.b, lk.a), lk)
    with _LINK_INDEX_LOCK:
        while len(_LINK_INDEX) >= _LINK_INDEX_SIZE:
            del _LINK_INDEX[next(iter(_LINK_INDEX))]
        _LINK_INDEX[id(links)] = (links, index)
    return index


def _plain(obj: object) -> Any:
    """Records → dicts, tuples → lists, recursively (JSON-ready)."""
    if hasattr(obj, "_asdict"):
        return {k: _plain(v) for k, v in obj._asdict().items()}
    if isinstance(obj, list | tuple):
        return [_plain(v) for v in obj]
    return obj
