"""Detection: reads the host (procfs, sysfs, NVML, the installed software) and changes nothing on it.
It returns a frozen HostSnapshot.

Roots are parameters (``proc_root``, ``sys_root``) so that tests and replays can point detection at
fake procfs/sysfs trees; the NVML library is whatever ``libnvidia-ml.so.1`` the process loads (or
``$HWPROFILE_NVML_LIBRARY``).
"""

from __future__ import annotations

import os
from typing import Any

from . import linux, software
from .interconnect import read_interconnect
from .nvml import GpuLost, Nvml, NvmlHandle, Unavailable
from .snapshot import DetectError, Driver, Gpu, GpuLink, HostSnapshot, NumaNode, Software

DEFAULT_PROC_ROOT = "/proc"
DEFAULT_SYS_ROOT = "/sys"


def detect_host(
    proc_root: str | os.PathLike[str] | None = None,
    sys_root: str | os.PathLike[str] | None = None,
    tmpfs: str = "/dev/shm",
    use_nvml: bool = True,
) -> HostSnapshot:
    """Probe this host. Never raises for a missing or broken part: it ends up in ``errors``."""
    proc = proc_root or os.environ.get("HWPROFILE_PROC_ROOT") or DEFAULT_PROC_ROOT
    sysfs = sys_root or os.environ.get("HWPROFILE_SYS_ROOT") or DEFAULT_SYS_ROOT
    errors: list[DetectError] = []

    hostname, kernel = linux.read_host_ids(proc)
    cpu = linux.read_cpu(proc, errors)
    memory = linux.read_memory(proc, errors)
    numa_nodes = linux.read_numa_nodes(sysfs, errors)

    gpus: tuple[Gpu, ...] = ()
    links: tuple[GpuLink, ...] = ()
    driver = Driver()
    if use_nvml:
        gpus, links, driver = _read_nvml(sysfs, cpu.logical_cpus or os.cpu_count() or 1, numa_nodes, errors)

    interconnect = read_interconnect(str(proc), str(sysfs), gpus)
    return HostSnapshot(
        hostname=hostname,
        kernel=kernel,
        cpu=cpu,
        memory_bytes=memory,
        numa_nodes=numa_nodes,
        gpus=gpus,
        gpu_links=links,
        driver=driver,
        software=_read_software(proc, tmpfs),
        errors=tuple(errors),
        interconnect=interconnect,
    )


def _read_nvml(
    sysfs: str | os.PathLike[str],
    logical_cpus: int,
    numa_nodes: tuple[NumaNode, ...],
    errors: list[DetectError],
) -> tuple[tuple[Gpu, ...], tuple[GpuLink, ...], Driver]:
    """The GPUs, their links and the driver through NVML; NVML's own failures go into ``errors``
    (nothing when NVML cannot be opened)."""
    gpus: tuple[Gpu, ...] = ()
    links: tuple[GpuLink, ...] = ()
    driver = Driver()
    nvml = Nvml()
    try:
        nvml.open()
    except Unavailable as e:
        errors.append(DetectError("nvml", str(e)))
        return gpus, links, driver
    try:
        driver = nvml.driver()
        gpus, handles = _read_gpus(nvml, logical_cpus)
        gpus = tuple(_complete(g, sysfs, numa_nodes) for g in gpus)
        links = nvml.links([g for g in gpus if not g.lost], handles)
    finally:
        nvml.close()
    errors.extend(nvml.errors)
    return gpus, links, driver


def _read_software(proc: str | os.PathLike[str], tmpfs: str) -> Software:
    """vLLM, numactl, the tmpfs, the MoE and tuned config folders, the router, the kernel packages vLLM
    may run (FlashInfer, triton_kernels): what is installed."""
    tmpfs_path, tmpfs_free = linux.read_tmpfs(proc, tmpfs)
    vllm_version, vllm_dist = software.vllm_version()
    moe_dir, moe_names = software.moe_configs()
    tuned_dir, tuned_names = software.tuned_config_folder()
    return Software(
        vllm_version=vllm_version,
        vllm_distribution=vllm_dist,
        numactl_path=software.numactl_path(),
        tmpfs_path=tmpfs_path,
        tmpfs_free_bytes=tmpfs_free,
        moe_configs_dir=moe_dir,
        moe_configs=moe_names,
        tuned_config_folder=tuned_dir,
        tuned_configs=tuned_names,
        router_path=software.router_path(),
        kernel_packages=software.kernel_packages(),
    )


def _read_gpus(nvml: Nvml, logical_cpus: int) -> tuple[tuple[Gpu, ...], dict[int, NvmlHandle]]:
    gpus: list[Gpu] = []
    handles: dict[int, NvmlHandle] = {}
    for index in range(nvml.count()):
        try:
            handle = nvml.handle(index)
            if handle is None:
                gpus.append(Gpu(index=index, lost=True))
                continue
            gpu = nvml.gpu(index, handle, logical_cpus)
            f = nvml.faults(index, handle)  # a GPU already faulted is not planned for (Gpu.faults)
            gpus.append(
                gpu._replace(
                    ecc_uncorrected=f.ecc_uncorrected,
                    retired_pages_pending=f.retired_pending,
                    remapped_rows_pending=f.remap_pending,
                    row_remap_failure=f.remap_failure,
                )
            )
            handles[index] = handle
        except GpuLost:
            nvml.errors.append(
                DetectError(f"gpu[{index}]", "GPU is lost (fell off the bus?): check `dmesg` for Xid errors")
            )
            gpus.append(Gpu(index=index, lost=True))
    return tuple(gpus), handles


def _complete(gpu: Gpu, sys_root: str | os.PathLike[str], numa_nodes: tuple[NumaNode, ...]) -> Gpu:
    """NUMA node and local CPUs where the driver did not give them: sysfs first (``-1`` there
    means unknown), then the host's only node, then the node whose CPUs equal the GPU's affinity."""
    if gpu.lost or not gpu.pci_bus_id:
        return gpu
    changes: dict[str, Any] = {}  # Gpu fields by name
    cpus = gpu.cpu_affinity
    if cpus is None:
        cpus = linux.read_pci_local_cpulist(sys_root, gpu.pci_bus_id)
        if cpus:
            changes["cpu_affinity"] = cpus
    if gpu.numa_node is None:
        node = linux.read_pci_numa_node(sys_root, gpu.pci_bus_id)
        if node is not None:
            changes.update(numa_node=node, numa_node_source="sysfs")
        elif len(numa_nodes) == 1:
            changes.update(numa_node=numa_nodes[0].id, numa_node_source="only_node")
        elif cpus:
            match = [n.id for n in numa_nodes if n.cpus == cpus]
            if len(match) == 1:
                changes.update(numa_node=match[0], numa_node_source="cpu_affinity")
    return gpu._replace(**changes) if changes else gpu


__all__ = ["HostSnapshot", "detect_host"]
