"""Kubernetes nodes as host snapshots: the nodes of ``kubectl get nodes -o json`` grouped by GPU
Feature Discovery's labels, one synthetic :class:`~hwprofile.host.snapshot.HostSnapshot` per GPU
class (product, GPU count, GPU memory), joined with the datasheet table (``hwprofile/data/gpus.yaml``)
for what labels do not say; and a snapshot as a pod sees it (its own GPUs only, numbered from 0).

Labels say less than detection: no NUMA layout, no PCIe or NVLink topology, no GPU UUIDs or device
minors, nothing about the driver's reserved memory. What each snapshot assumed instead is listed in
its class's ``assumed``, for the manifests' comments. Every label value is data: one that is not a
valid Kubernetes label value, or not a number where one is expected, leaves its node out with a
warning, never in a selector. Pure: a parsed document in, records out.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any, NamedTuple, TypeGuard

from ...host.snapshot import Cpu, Driver, Gpu, GpuLink, HostSnapshot, PcieLink, Software
from ...host.snapshot_io import snapshot_from_dict
from ...plan import gpufacts

PRODUCT = "nvidia.com/gpu.product"
COUNT = "nvidia.com/gpu.count"
MEMORY = "nvidia.com/gpu.memory"  # MiB
RESOURCE = "nvidia.com/gpu"  # the device plugin's allocatable resource
COMPUTE_MAJOR, COMPUTE_MINOR = "nvidia.com/gpu.compute.major", "nvidia.com/gpu.compute.minor"
SHARING = "nvidia.com/gpu.sharing-strategy"

# A label value (k8s.io/apimachinery validation.IsValidLabelValue): 63 characters at most,
# alphanumerics at both ends, '-', '_', '.' between.
_LABEL_VALUE = re.compile(r"(?:[A-Za-z0-9](?:[-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?)?")
_QUANTITY = re.compile(r"([0-9]+(?:\.[0-9]+)?)(?:(Ki|Mi|Gi|Ti|Pi|Ei|m|k|M|G|T|P|E)|[eE]([0-9]{1,2}))?")
_BINARY = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60}
_DECIMAL = {"m": 1e-3, "k": 1e3, "M": 1e6, "G": 1e9, "T": 1e12, "P": 1e15, "E": 1e18}
MAX_NODES = 10_000
MAX_GPUS_PER_NODE = 64


class NodeClass(NamedTuple):
    """The nodes of one GPU class and the snapshot that stands for each of them."""

    product: str  # the nvidia.com/gpu.product value, as the nodes carry it
    gpu_count: int  # allocatable nvidia.com/gpu per node
    memory_mib: int
    nodes: tuple[str, ...]  # node names
    snapshot: HostSnapshot
    assumed: tuple[str, ...]  # what the labels did not say and the snapshot assumes

    @property
    def selector(self) -> dict[str, str]:
        """The node selector of this class: GFD's product, count and memory labels (one product in
        two memory sizes is two classes: their pods must not land on the other's nodes)."""
        return {PRODUCT: self.product, COUNT: str(self.gpu_count), MEMORY: str(self.memory_mib)}


# a Node's name as the API server takes it: a DNS-1123 subdomain (lower case, digits, '-', '.';
# labels of 63 at most, 253 in all)
_NODE_NAME = re.compile(r"[a-z0-9](?:[-a-z0-9]{0,61}[a-z0-9])?(?:\.[a-z0-9](?:[-a-z0-9]{0,61}[a-z0-9])?)*")


def valid_node_name(value: object) -> TypeGuard[str]:
    return isinstance(value, str) and len(value) <= 253 and _NODE_NAME.fullmatch(value) is not None


def valid_label_value(value: object) -> bool:
    return isinstance(value, str) and bool(_LABEL_VALUE.fullmatch(value))


def gfd_product(nvml_name: str | None) -> str | None:
    """The ``nvidia.com/gpu.product`` value GFD gives a GPU of this NVML name (spaces as dashes);
    None when it would not be a valid label value."""
    if not nvml_name:
        return None
    value = re.sub(r"\s+", "-", nvml_name.strip())
    return value if valid_label_value(value) else None


def nvml_name(product: str) -> str:
    """The NVML name behind a product label: the datasheet's NVML name that GFD writes so, else the
    label with its dashes as spaces."""
    for row in gpufacts.table():
        for name in row.get("nvml_names") or []:
            if gfd_product(name) == product:
                return str(name)
    return product.replace("-", " ")


def quantity(text: object) -> float | None:
    """A Kubernetes quantity (``64``, ``63500m``, ``263843844Ki``, ``512Gi``, ``1e9``); None if not one."""
    if not isinstance(text, str) or len(text) > 40:
        return None
    m = _QUANTITY.fullmatch(text.strip())
    if not m:
        return None
    number, suffix, exp = float(m.group(1)), m.group(2), m.group(3)
    if suffix:
        return number * (_BINARY.get(suffix) or _DECIMAL[suffix])
    return number * 10 ** int(exp) if exp else number


def _map(value: object) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def _count(value: object, lo: int, hi: int) -> int | None:
    if isinstance(value, str) and value.isascii() and value.isdigit() and len(value) <= 9:
        n = int(value)
        return n if lo <= n <= hi else None
    return None


def _driver(labels: Mapping[str, Any]) -> Driver:
    def version(full: str, parts: tuple[str, ...]) -> str | None:
        v = labels.get(full)
        if isinstance(v, str) and re.fullmatch(r"[0-9]+(\.[0-9]+){0,3}", v):
            return v
        got = [labels.get(p) for p in parts]
        if all(isinstance(g, str) and g.isdigit() for g in got[:2]):
            return ".".join(g for g in got if isinstance(g, str) and g.isdigit())
        return None

    return Driver(
        version=version(
            "nvidia.com/cuda.driver-version.full",
            ("nvidia.com/cuda.driver.major", "nvidia.com/cuda.driver.minor", "nvidia.com/cuda.driver.rev"),
        ),
        cuda_version=version(
            "nvidia.com/cuda.runtime-version.full",
            ("nvidia.com/cuda.runtime.major", "nvidia.com/cuda.runtime.minor"),
        ),
    )


def class_snapshot(
    product: str,
    gpus: int,
    memory_mib: int,
    labels: Mapping[str, Any],
    status: Mapping[str, Any],
    vllm_version: str | None,
    hostname: str,
) -> tuple[HostSnapshot, tuple[str, ...]]:
    """The snapshot of one node of a class, from its labels and status, and what it assumed."""
    name = nvml_name(product)
    row = gpufacts.lookup(name, memory_mib / 1024)
    assumed = [
        f"GPU {name}: {gpus} x {memory_mib} MiB from the labels"
        + (f"; datasheet row {row['name']}" if row else "; no datasheet row (no bandwidth, no FP8 facts)"),
        "no NUMA layout from labels: one NUMA node, no CPU or memory binding (layout.numa_bind=false)",
        "no GPU UUIDs or device minors from labels: the pod's GPUs are numbered from 0 as the device "
        "plugin shows them",
        "no memory reserved by the driver known from labels: the whole label memory counted",
    ]
    cc = _compute_capability(labels, row, assumed)
    links = _nvlinks(row, name, assumed)
    cpus = quantity(_map(status.get("capacity")).get("cpu"))
    mem = quantity(_map(status.get("capacity")).get("memory"))
    gpu_list = tuple(
        Gpu(
            index=i,
            name=name,
            memory_total_bytes=memory_mib * 2**20,
            compute_capability=cc,
            pcie=PcieLink(
                gen=row.get("pcie_gen") if row else None, width=row.get("pcie_lanes") if row else None
            ),
            nvlink_active_links=links,
        )
        for i in range(gpus)
    )
    pairs = tuple(GpuLink(a, b, f"NV{links}", True) for a in range(gpus) for b in range(a + 1, gpus) if links)
    snap = HostSnapshot(
        hostname=hostname,
        cpu=Cpu(logical_cpus=int(cpus) if cpus and 1 <= cpus <= 16384 else None),
        memory_bytes=int(mem) if mem and mem >= 2**20 else None,
        gpus=gpu_list,
        gpu_links=pairs,
        driver=_driver(labels),
        software=Software(vllm_version=vllm_version),
    )
    return snapshot_from_dict(snap.to_dict(), f"the labels of {hostname}"), tuple(assumed)


def _compute_capability(
    labels: Mapping[str, Any], row: Mapping[str, Any] | None, assumed: list[str]
) -> str | None:
    """The compute capability from GFD's labels, else the datasheet's (said in ``assumed``)."""
    major, minor = labels.get(COMPUTE_MAJOR), labels.get(COMPUTE_MINOR)
    if isinstance(major, str) and isinstance(minor, str) and major.isdigit() and minor.isdigit():
        return f"{int(major)}.{int(minor)}"
    cc = str(row["compute_capability"]) if row and row.get("compute_capability") else None
    assumed.append(f"compute capability {cc or 'unknown'} from the datasheet (no GFD compute labels)")
    return cc


def _nvlinks(row: Mapping[str, Any] | None, name: str, assumed: list[str]) -> int:
    """NVLink links per GPU assumed between every pair (SXM boards with a datasheet bandwidth), else 0;
    what was assumed said in ``assumed``."""
    sxm = bool(row and row.get("nvlink") and "SXM" in str(row["name"]).upper())
    links = int(row.get("nvlink_bandwidth_gbs") or 0) // 50 if sxm and row else 0
    if sxm and links:
        assumed.append(
            f"NVLink between every pair of GPUs ({links} links each, NVSwitch), as SXM boards of "
            f"{row['name'] if row else name} have; labels say nothing of topology"
        )
    else:
        assumed.append("no NVLink and no PCIe topology: labels say nothing of how the GPUs are linked")
    return links


def node_classes(doc: object, vllm_version: str | None) -> tuple[list[NodeClass], list[str]]:
    """The GPU classes of a ``kubectl get nodes -o json`` document (a ``List`` of ``Node``, or one
    ``Node``), largest first, and a warning for each node left out and why."""
    if isinstance(doc, Mapping) and doc.get("kind") == "Node":
        items: Any = [doc]
    else:
        items = doc.get("items") if isinstance(doc, Mapping) else None
    if not isinstance(items, list):
        raise ValueError("expected the output of `kubectl get nodes -o json`: an object with `items`")
    if len(items) > MAX_NODES:
        raise ValueError(f"{len(items)} nodes: more than {MAX_NODES}")
    warnings: list[str] = []
    groups: dict[tuple[str, int, int], list[_Member]] = {}
    for n, item in enumerate(items):
        entry = _node_entry(n, item, warnings)
        if entry is not None:
            groups.setdefault(entry[0], []).append(entry[1])
    classes = []
    for (product, gpus, memory), members in groups.items():
        _, labels, status = members[0]  # the first node of the class stands for all of them
        # node names are data (annotations, comments), never the snapshot's host name
        hostname = f"{product}-x{gpus}"
        snap, assumed = class_snapshot(product, gpus, memory, labels, status, vllm_version, hostname)
        classes.append(NodeClass(product, gpus, memory, tuple(m[0] for m in members), snap, assumed))
    classes.sort(key=lambda c: (-c.gpu_count * c.memory_mib, c.product, c.gpu_count))
    return classes, warnings


_Member = tuple[str, Mapping[str, Any], Mapping[str, Any]]  # a node of a class: name, labels, status


def _node_entry(n: int, item: object, warnings: list[str]) -> tuple[tuple[str, int, int], _Member] | None:
    """Node ``n`` of the list as its class key (product, GPUs, MiB) and member, or None when it is
    left out (not a GPU node without a word; otherwise with a warning saying why)."""
    meta = _map(_map(item).get("metadata"))
    name = meta.get("name")
    node = name if valid_node_name(name) else f"items[{n}]"  # never a name the API server refuses
    labels = _map(meta.get("labels"))
    status = _map(_map(item).get("status"))
    product = labels.get(PRODUCT)
    if product is None:
        return None  # no GPU Feature Discovery labels: not a GPU node (or GFD does not run there)
    if not valid_label_value(product):
        warnings.append(f"node {node}: {PRODUCT} {product!r} is not a valid label value: left out")
        return None
    if "-MIG-" in product or product.endswith("-SHARED"):
        warnings.append(
            f"node {node}: {PRODUCT} {product} is a MIG slice or a shared GPU: hwprofile plans "
            "whole GPUs only: left out"
        )
        return None
    sharing = labels.get(SHARING)
    if sharing not in (None, "none"):
        warnings.append(f"node {node}: {SHARING} {sharing!r}: GPUs shared between pods: left out")
        return None
    memory = _count(labels.get(MEMORY), 1, 1 << 24)
    if memory is None:
        warnings.append(f"node {node}: {MEMORY} {labels.get(MEMORY)!r} is not a size in MiB: left out")
        return None
    alloc = _count(_map(status.get("allocatable")).get(RESOURCE), 0, MAX_GPUS_PER_NODE)
    count = _count(labels.get(COUNT), 0, MAX_GPUS_PER_NODE)
    gpus = alloc if alloc is not None else count
    if not gpus:
        warnings.append(f"node {node}: no allocatable {RESOURCE} (count {labels.get(COUNT)!r}): left out")
        return None
    if count is not None and alloc is not None and alloc != count:
        warnings.append(f"node {node}: {alloc} of its {count} GPUs allocatable: planned with {alloc}")
    if not valid_node_name(name):
        shown = repr(name)[:80] + ("..." if len(repr(name)) > 80 else "")
        warnings.append(
            f"items[{n}]: metadata.name {shown}: not a Kubernetes node name (DNS-1123: a-z, "
            "0-9, '-', '.'; 253 characters at most): left out"
        )
        return None
    return (product, gpus, memory), (node, labels, status)


def pod_view(host: HostSnapshot, gpus: tuple[int, ...]) -> HostSnapshot:
    """``host`` as a pod given ``gpus`` of it sees it: those GPUs only, numbered from 0 in that order
    (the device plugin's view), no UUIDs or minors (any GPUs of the class may be the pod's), no GPU
    memory in use, no NUMA layout (the kubelet, not hwprofile, places the pod's CPUs)."""
    index = {g: i for i, g in enumerate(gpus)}
    by_index = {g.index: g for g in host.gpus}
    mine = tuple(
        by_index[g]._replace(
            index=index[g],
            uuid=None,
            minor_number=None,
            pci_bus_id=None,
            memory_used_bytes=None,
            numa_node=None,
            numa_node_source=None,
            cpu_affinity=None,
        )
        for g in gpus
    )
    links = tuple(
        lk._replace(a=index[lk.a], b=index[lk.b]) for lk in host.gpu_links if lk.a in index and lk.b in index
    )
    return host._replace(gpus=mine, gpu_links=links, numa_nodes=(), errors=())
