"""The ``hwprofile.host/1`` contract, checked when a saved snapshot is loaded.

One table (:data:`HOST`, in the vocabulary of :mod:`hwprofile.contracts`) says what every field may hold;
:func:`validate` walks a parsed snapshot against it, and :func:`.snapshot_schema.json_schema`
publishes the same table as JSON Schema (schemas/hwprofile.host-1.schema.json, kept equal by a test).
Then ``_consistency`` checks what JSON Schema cannot say: unique GPU indexes, device minors and NUMA
node ids, links between existing GPUs, GPUs on listed NUMA nodes, used ≤ total memory.
Plain Python, no imports: a snapshot of eight GPUs checks in well under a millisecond.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..contracts import Bool, Const, Int, Invalid, List, Num, Obj, Str
from .snapshot import MAX_CPUS, MAX_DEVICE_MINOR, MAX_GPUS, MAX_NUMA_NODES, SCHEMA, parse_cpulist

if TYPE_CHECKING:
    from collections.abc import Iterable
    from typing import Any

_TIB = 1 << 40
_PIB = 1 << 50
_CPULIST = "^([0-9]{1,5}(-[0-9]{1,5})?(,[0-9]{1,5}(-[0-9]{1,5})?)*)?$"
_LINK = "NV([1-9][0-9]?)|PIX|PXB|PHB|NODE|SYS"
_PATH = Str(4096, pattern="/[^\\u0000-\\u001f\\u007f]*", like="an absolute path without control characters")
_CONFIG_NAME = Str(512, null=False, pattern="[^/\\u0000-\\u001f\\u007f]+", like="a file name")
_P2P_PAIR = Str(16, null=False, pattern="[0-9]{1,4}->[0-9]{1,4}", like='a pair of positions like "0->1"')
_VERSION = Str(64, pattern="[0-9A-Za-z][0-9A-Za-z.+_!-]*", like="a version string like 0.11.0")

HOST = Obj(
    {
        "schema": Const(SCHEMA),
        "hostname": Str(253),
        "kernel": Str(256),
        "cpu": Obj(
            {
                "model": Str(256),
                "logical_cpus": Int(1, MAX_CPUS),
                "sockets": Int(1, 1024),
                "flags": List(Str(64, null=False, pattern="[A-Za-z0-9_.-]+", like="a CPU flag name"), 4096),
            }
        ),
        "memory_bytes": Int(0, _PIB, unit=" (1 PiB)"),
        "numa_nodes": List(
            Obj(
                {
                    "id": Int(0, MAX_NUMA_NODES - 1, null=False),
                    "cpus": Str(65536, null=False, pattern=_CPULIST, like='a CPU list like "0-27,56-83"'),
                    "memory_bytes": Int(0, _PIB, unit=" (1 PiB)"),
                },
                required=("id", "cpus"),
            ),
            MAX_NUMA_NODES,
        ),
        "gpus": List(
            Obj(
                {
                    "index": Int(0, MAX_GPUS - 1, null=False),
                    "name": Str(256),
                    "uuid": Str(128),
                    "pci_bus_id": Str(
                        32,
                        pattern="[0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}\\.[0-7]",
                        like='a PCI bus id like "00000000:21:00.0"',
                    ),
                    "pci_device_id": Str(
                        10, pattern="0x[0-9A-Fa-f]{8}", like='a PCI device id like "0x268410de"'
                    ),
                    "minor_number": Int(0, MAX_DEVICE_MINOR),
                    "memory_total_bytes": Int(0, _TIB, unit=" (1 TiB)"),
                    "memory_used_bytes": Int(0, _TIB, unit=" (1 TiB)"),
                    "memory_reserved_bytes": Int(0, _TIB, unit=" (1 TiB)"),
                    "compute_capability": Str(
                        5, pattern="[0-9]{1,2}\\.[0-9]{1,2}", like='a string like "8.9"'
                    ),
                    "numa_node": Int(0, MAX_NUMA_NODES - 1),
                    "numa_node_source": Str(
                        16,
                        pattern="nvml|sysfs|only_node|cpu_affinity",
                        like="nvml, sysfs, only_node or cpu_affinity",
                    ),
                    "cpu_affinity": Str(65536, pattern=_CPULIST, like='a CPU list like "0-27,56-83"'),
                    "pcie": Obj(
                        {
                            "gen": Int(1, 16),
                            "width": Int(1, 64),
                            "max_gen": Int(1, 16),
                            "max_width": Int(1, 64),
                            "degraded": Bool(null=True),
                        }
                    ),
                    "nvlink_active_links": Int(0, 64),
                    "power_limit_watts": Num(0, 10000, unit=" W"),
                    "power_draw_watts": Num(0, 10000, unit=" W"),
                    "temperature_c": Int(-50, 150, unit=" °C"),
                    "temperature_slowdown_c": Int(-50, 150, unit=" °C"),
                    "temperature_shutdown_c": Int(-50, 150, unit=" °C"),
                    "sm_clock_mhz": Int(0, 10000, unit=" MHz"),
                    "sm_clock_max_mhz": Int(0, 10000, unit=" MHz"),
                    "clocks_event_reasons": List(
                        Str(64, null=False, pattern="[a-z0-9_]+", like="a reason name like sw_power_cap"),
                        64,
                        null=True,
                    ),
                    "clocks_event_reasons_mask": Int(0, 2**64 - 1),
                    "lost": Bool(),
                    "ecc_uncorrected": Int(0, 2**63 - 1),
                    "retired_pages_pending": Bool(null=True),
                    "remapped_rows_pending": Bool(null=True),
                    "row_remap_failure": Bool(null=True),
                },
                required=("index",),
            ),
            MAX_GPUS,
        ),
        "gpu_links": List(
            Obj(
                {
                    "a": Int(0, MAX_GPUS - 1, null=False),
                    "b": Int(0, MAX_GPUS - 1, null=False),
                    "link": Str(8, pattern=_LINK, like="NV<n>, PIX, PXB, PHB, NODE or SYS"),
                    "p2p": Bool(null=True),
                    "p2p_write": Bool(null=True),
                    "p2p_atomics": Bool(null=True),
                },
                required=("a", "b", "link"),
            ),
            MAX_GPUS * (MAX_GPUS - 1) // 2,
        ),
        "driver": Obj({"version": _VERSION, "cuda_version": _VERSION, "nvml_library": _PATH}),
        "software": Obj(
            {
                "vllm_version": _VERSION,
                "vllm_distribution": Str(
                    128, pattern="[A-Za-z0-9][A-Za-z0-9._-]*", like="a distribution name"
                ),
                "numactl_path": _PATH,
                "tmpfs_path": _PATH,
                "tmpfs_free_bytes": Int(0, _PIB, unit=" (1 PiB)"),
                "moe_configs_dir": _PATH,
                "moe_configs": List(_CONFIG_NAME, 100_000, null=True),
                "tuned_config_folder": _PATH,
                "tuned_configs": List(_CONFIG_NAME, 100_000, null=True),
                "router_path": _PATH,
                "kernel_packages": List(
                    Str(
                        128,
                        null=False,
                        pattern="[A-Za-z0-9_.-]+ [0-9A-Za-z][0-9A-Za-z.+_!-]*",
                        like="a name and version",
                    ),
                    16,
                    null=True,
                ),
            }
        ),
        "interconnect": Obj(
            {
                "iommu": Str(16, pattern="off|passthrough|translated", like="off, passthrough or translated"),
                "iommu_evidence": Str(4096),
                "iommu_units": List(Str(64, null=False), 1024, null=True),
                "acs_ports": List(
                    Obj(
                        {
                            "bdf": Str(
                                16,
                                null=False,
                                pattern="[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\\.[0-7]",
                                like='a sysfs PCI name like "0000:00:01.0"',
                            ),
                            "gpu_indexes": List(Int(0, MAX_GPUS - 1, null=False), MAX_GPUS),
                            "acs_ctrl": Int(0, 0xFFFF),
                            "redirect": Bool(null=True),
                            "unknown": Str(4096),
                        },
                        required=("bdf",),
                    ),
                    4096,
                ),
                "acs_unknown": Str(4096),
                "vllm_cache_root": _PATH,
                "vllm_p2p": List(
                    Obj(
                        {
                            "file": Str(
                                512,
                                null=False,
                                pattern="gpu_p2p_access_cache_for_[^/\\u0000-\\u001f\\u007f]*\\.json",
                                like="gpu_p2p_access_cache_for_<devices>.json",
                            ),
                            "devices": List(Str(128, null=False), MAX_GPUS),
                            "gpu_indexes": List(Int(0, MAX_GPUS - 1, null=False), MAX_GPUS, null=True),
                            "allowed": List(_P2P_PAIR, MAX_GPUS * MAX_GPUS),
                            "denied": List(_P2P_PAIR, MAX_GPUS * MAX_GPUS),
                            "unknown": Str(4096),
                        },
                        required=("file", "devices"),
                    ),
                    64,
                ),
                "vllm_p2p_unknown": Str(4096),
            }
        ),
        "errors": List(
            Obj(
                {"where": Str(256, null=False), "message": Str(4096, null=False, lines=True)},
                required=("where", "message"),
            ),
            10000,
        ),
    },
    required=("schema",),
)


def _consistency(data: dict[str, Any]) -> None:
    """What the per-field rules cannot see: the snapshot's parts must agree with each other."""
    node_ids = _check_numa_nodes(data.get("numa_nodes", ()))
    indexes = _check_gpus(data.get("gpus", ()), node_ids)
    _check_links(data.get("gpu_links", ()), indexes)


def _check_numa_nodes(nodes: Iterable[dict[str, Any]]) -> set[int]:
    """NUMA node ids are unique and no CPU is on two nodes; returns the ids."""
    node_ids: set[int] = set()
    seen_cpus: dict[int, int] = {}
    for i, n in enumerate(nodes):
        if n["id"] in node_ids:
            raise Invalid(f"numa_nodes[{i}].id", f"NUMA node {n['id']} is listed twice")
        node_ids.add(n["id"])
        try:
            cpus = parse_cpulist(n["cpus"])
        except ValueError as e:
            raise Invalid(f"numa_nodes[{i}].cpus", f"bad {e}") from None
        for c in cpus:
            if seen_cpus.setdefault(c, n["id"]) != n["id"]:
                raise Invalid(f"numa_nodes[{i}].cpus", f"CPU {c} is also on NUMA node {seen_cpus[c]}")
    return node_ids


def _check_gpus(gpus: Iterable[dict[str, Any]], node_ids: set[int]) -> set[int]:
    """GPU indexes and device minors are unique and each GPU agrees with itself; returns the indexes."""
    indexes: set[int] = set()
    minors: dict[int, int] = {}
    for i, g in enumerate(gpus):
        w = f"gpus[{i}]"
        if g["index"] in indexes:
            raise Invalid(f"{w}.index", f"GPU index {g['index']} is listed twice")
        indexes.add(g["index"])
        minor = g.get("minor_number")
        if minor is not None:
            if minor in minors:
                raise Invalid(
                    f"{w}.minor_number",
                    f"device minor {minor} is also GPU {minors[minor]}'s (/dev/nvidia{minor})",
                )
            minors[minor] = g["index"]
        _check_gpu(w, g, node_ids)
    return indexes


def _check_gpu(w: str, g: dict[str, Any], node_ids: set[int]) -> None:
    """One GPU's NUMA node is listed, its CPU ranges are sound and no reading exceeds its maximum."""
    node = g.get("numa_node")
    if node is not None and node_ids and node not in node_ids:
        raise Invalid(f"{w}.numa_node", f"NUMA node {node} is not in numa_nodes (ids {sorted(node_ids)})")
    aff = g.get("cpu_affinity")
    for part in filter(None, (aff or "").split(",")):
        lo, _, hi = part.partition("-")
        if int(hi or lo) < int(lo) or int(hi or lo) >= MAX_CPUS:
            raise Invalid(f"{w}.cpu_affinity", f"bad CPU range {part!r} (CPUs are 0 to {MAX_CPUS - 1})")
    total = g.get("memory_total_bytes")
    for k in ("memory_used_bytes", "memory_reserved_bytes"):
        v = g.get(k)
        if v is not None and total is not None and v > total:
            raise Invalid(f"{w}.{k}", f"{v} is more than memory_total_bytes ({total})")
    pcie = g.get("pcie") or {}
    for cur, top in (("gen", "max_gen"), ("width", "max_width")):
        if pcie.get(cur) is not None and pcie.get(top) is not None and pcie[cur] > pcie[top]:
            raise Invalid(f"{w}.pcie.{cur}", f"{pcie[cur]} is above pcie.{top} ({pcie[top]})")


def _check_links(links: Iterable[dict[str, Any]], indexes: set[int]) -> None:
    """Each link joins two different listed GPUs, and no pair is linked twice."""
    pairs: set[frozenset[int]] = set()
    for i, lk in enumerate(links):
        for end in ("a", "b"):
            if lk[end] not in indexes:
                raise Invalid(f"gpu_links[{i}].{end}", f"no GPU with index {lk[end]} in gpus")
        if lk["a"] == lk["b"]:
            raise Invalid(f"gpu_links[{i}]", f"links GPU {lk['a']} to itself")
        pair = frozenset((lk["a"], lk["b"]))
        if pair in pairs:
            raise Invalid(f"gpu_links[{i}]", f"GPUs {lk['a']} and {lk['b']} are linked twice")
        pairs.add(pair)


def validate(data: object) -> None:
    """Raise :class:`Invalid` (with the JSON path) unless ``data`` is a valid ``hwprofile.host/1`` snapshot."""
    if not HOST.valid(data) or type(data) is not dict:  # valid() holds only for an object
        HOST.check(data, "")  # finds the path of the first bad value and raises
        raise Invalid("snapshot", "not valid")  # unreachable while valid() and check() agree
    _consistency(data)
