"""CPU, memory, NUMA and PCI facts from procfs and sysfs.

Parsers take text and return data; readers take a root directory (so tests can build fake trees
named after real machines) and return data plus the errors they met. Nothing here talks to NVML.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable

from .snapshot import Cpu, DetectError, NumaNode, format_cpulist, parse_cpulist

# -- cpulist helpers ---------------------------------------------------------------------------


def cpulist_from_masks(words: Iterable[int], bits_per_word: int = 64) -> str:
    """A CPU bitmask as an array of words (NVML's cpuSet) → cpulist text."""
    cpus = [
        w * bits_per_word + b for w, word in enumerate(words) for b in range(bits_per_word) if word >> b & 1
    ]
    return format_cpulist(cpus)


# -- parsers (text in, data out) --------------------------------------------------------------


def parse_cpuinfo(text: str) -> Cpu:
    """Parse ``/proc/cpuinfo``: model name, logical CPUs, sockets and flags (x86 and Arm)."""
    model: str | None = None
    flags: tuple[str, ...] = ()
    processors = 0
    sockets: set[str] = set()
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if not sep:
            continue
        key, value = key.strip(), value.strip()
        if key == "processor":
            processors += 1
        elif key == "model name" and model is None:
            model = value
        elif key == "physical id":
            sockets.add(value)
        elif key in ("flags", "Features") and not flags:
            flags = tuple(value.split())
    return Cpu(
        model=model,
        logical_cpus=processors or None,
        sockets=len(sockets) or (1 if processors else None),
        flags=flags,
    )


_MEMTOTAL = re.compile(r"MemTotal:\s+(\d+)\s*kB")


def parse_meminfo_total(text: str) -> int | None:
    """``MemTotal`` in bytes from ``/proc/meminfo`` or a node's ``meminfo`` (``Node 0 MemTotal:``)."""
    m = _MEMTOTAL.search(text)
    return int(m.group(1)) * 1024 if m else None


def parse_mounts_fstype(text: str, mountpoint: str) -> str | None:
    """The filesystem type mounted at ``mountpoint`` per ``/proc/mounts`` (last mount wins)."""
    fstype = None
    for line in text.splitlines():
        parts = line.split()
        if len(parts) >= 3 and parts[1] == mountpoint:
            fstype = parts[2]
    return fstype


def sysfs_pci_name(nvml_bus_id: str) -> str:
    """NVML's ``00000000:17:00.0`` → sysfs's ``0000:17:00.0`` (lower case, 4-digit domain)."""
    bus_id = nvml_bus_id.strip().lower()
    domain, _, rest = bus_id.partition(":")
    if len(domain) > 4:
        domain = domain[-4:]
    return f"{domain}:{rest}"


# -- readers (paths in, data + errors out) ----------------------------------------------------


MAX_PROC_BYTES = 16 << 20  # /proc/cpuinfo of 1024 CPUs is ~1.5 MB


def _read(*parts: str | os.PathLike[str]) -> str:
    """A procfs or sysfs file (under a real or a fake root), through the one bounded reader: a FIFO
    or a device planted in a ``--proc-root`` tree is refused, never waited on or read forever."""
    from ..runtime.files import read_bounded

    return read_bounded(os.path.join(*parts), MAX_PROC_BYTES).decode("utf-8", "replace")


def read_cpu(proc_root: str | os.PathLike[str], errors: list[DetectError]) -> Cpu:
    try:
        return parse_cpuinfo(_read(proc_root, "cpuinfo"))
    except OSError as e:
        errors.append(DetectError("cpu", f"cannot read {os.path.join(proc_root, 'cpuinfo')}: {e.strerror}"))
        return Cpu(logical_cpus=os.cpu_count())


def read_memory(proc_root: str | os.PathLike[str], errors: list[DetectError]) -> int | None:
    path = os.path.join(proc_root, "meminfo")
    try:
        total = parse_meminfo_total(_read(path))
    except OSError as e:
        errors.append(DetectError("memory", f"cannot read {path}: {e.strerror}"))
        return None
    if total is None:
        errors.append(DetectError("memory", f"no MemTotal line in {path}"))
    return total


def read_host_ids(proc_root: str | os.PathLike[str]) -> tuple[str | None, str | None]:
    """Hostname and kernel release, from procfs (so fake trees carry them), else uname."""
    uname = os.uname()
    out: list[str | None] = []
    for name, fallback in (("hostname", uname.nodename), ("osrelease", uname.release)):
        try:
            out.append(_read(proc_root, "sys", "kernel", name).strip() or fallback)
        except OSError:
            out.append(fallback)
    return out[0], out[1]


def read_numa_nodes(sys_root: str | os.PathLike[str], errors: list[DetectError]) -> tuple[NumaNode, ...]:
    base = os.path.join(sys_root, "devices", "system", "node")
    try:
        entries = sorted((int(n[4:]), n) for n in os.listdir(base) if re.fullmatch(r"node\d+", n))
    except OSError as e:
        errors.append(DetectError("numa", f"cannot list {base}: {e.strerror}"))
        return ()
    nodes: list[NumaNode] = []
    for node_id, name in entries:
        try:
            cpus = format_cpulist(parse_cpulist(_read(base, name, "cpulist")))
        except (OSError, ValueError) as e:
            errors.append(DetectError(f"numa[{node_id}]", f"cannot read cpulist: {e}"))
            continue
        try:
            mem = parse_meminfo_total(_read(base, name, "meminfo"))
        except OSError:
            mem = None
        nodes.append(NumaNode(id=node_id, cpus=cpus, memory_bytes=mem))
    return tuple(nodes)


def read_pci_numa_node(sys_root: str | os.PathLike[str], nvml_bus_id: str) -> int | None:
    """NUMA node of a PCI device from sysfs; ``-1`` (unknown) and a missing file → ``None``."""
    try:
        node = int(_read(sys_root, "bus", "pci", "devices", sysfs_pci_name(nvml_bus_id), "numa_node").strip())
    except (OSError, ValueError):
        return None
    return node if node >= 0 else None


def read_pci_local_cpulist(sys_root: str | os.PathLike[str], nvml_bus_id: str) -> str | None:
    try:
        text = _read(sys_root, "bus", "pci", "devices", sysfs_pci_name(nvml_bus_id), "local_cpulist")
        return format_cpulist(parse_cpulist(text)) or None
    except (OSError, ValueError):
        return None


def read_tmpfs(proc_root: str | os.PathLike[str], path: str = "/dev/shm") -> tuple[str | None, int | None]:
    """``(path, free bytes)`` when ``path`` is a tmpfs mount, else ``(None, None)``."""
    try:
        fstype = parse_mounts_fstype(_read(proc_root, "mounts"), path)
    except OSError:
        fstype = None
    if fstype != "tmpfs":
        return None, None
    try:
        st = os.statvfs(path)
    except OSError:
        return path, None
    return path, st.f_bavail * st.f_frsize
