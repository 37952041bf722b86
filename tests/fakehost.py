"""Build fake hosts for tests and benchmarks: a fake NVML state file plus procfs/sysfs trees.

A fixture (``tests/fixtures/hosts/<machine>.yaml``) describes a real machine shape; :func:`build`
turns it into files that the fake ``libnvidia-ml.so.1`` and hwprofile's readers consume, and
returns the environment a subprocess needs to see that host.
"""

from __future__ import annotations

import os
import subprocess
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from system import need

HERE = Path(__file__).resolve().parent
FIXTURES = HERE / "fixtures" / "hosts"
FAKE_SOURCE = HERE / "fakenvml" / "fakenvml.c"

TOPO_LEVEL = {"PIX": 10, "PXB": 20, "PHB": 30, "NODE": 40, "SYS": 50}
MIB = 1 << 20
GIB = 1 << 30


def fixture_names() -> list[str]:
    return sorted(p.stem for p in FIXTURES.glob("*.yaml"))


def load_spec(name: str) -> dict[str, Any]:
    return yaml.safe_load((FIXTURES / f"{name}.yaml").read_text())


def nvml_include_dir() -> Path:
    """nvml.h from the PyPI package nvidia-nvml-dev (the fake compiles against the real header)."""
    import importlib.util

    spec = importlib.util.find_spec("nvidia")
    assert spec is not None and spec.submodule_search_locations, "pip install nvidia-nvml-dev"
    for base in spec.submodule_search_locations:
        for header in sorted(Path(base).glob("*/include/nvml.h")):
            return header.parent
    raise FileNotFoundError("nvml.h not found: pip install nvidia-nvml-dev")


def compile_fake_nvml(out_dir: Path) -> Path:
    """Compile tests/fakenvml/fakenvml.c into ``out_dir/libnvidia-ml.so.1`` with gcc."""
    out_dir.mkdir(parents=True, exist_ok=True)
    lib = out_dir / "libnvidia-ml.so.1"
    subprocess.run(
        [
            need("gcc"),
            "-O2",
            "-Wall",
            "-Wextra",
            "-Werror",
            "-Wno-deprecated-declarations",
            "-shared",
            "-fPIC",
            "-Wl,-soname,libnvidia-ml.so.1",
            f"-I{nvml_include_dir()}",
            "-o",
            str(lib),
            str(FAKE_SOURCE),
        ],
        check=True,
    )
    return lib


@dataclass
class FakeHost:
    name: str
    spec: dict[str, Any]
    root: Path
    proc: Path
    sys: Path
    state: Path

    def env(self, lib_dir: Path | None) -> dict[str, str]:
        """Environment for a process that should see this host through the fake NVML."""
        env = dict(os.environ)
        env["FAKE_NVML_STATE"] = str(self.state)
        env["HWPROFILE_PROC_ROOT"] = str(self.proc)
        env["HWPROFILE_SYS_ROOT"] = str(self.sys)
        env.setdefault("HWPROFILE_ROUTER", "none")  # a fixture host has no vLLM router unless a test says
        env.setdefault("VLLM_CACHE_ROOT", str(self.state.parent / "vllm-cache"))  # not this user's own
        if lib_dir is not None:
            env["LD_LIBRARY_PATH"] = str(lib_dir)
        return env

    def set_state(self, **entries: Any) -> None:
        """Append raw lines to the NVML state (later lines win), e.g. error injection."""
        with self.state.open("a") as f:
            for k, v in entries.items():
                f.write(f"{k.replace('__', '.')}={v}\n")


def gpus_of(spec: dict[str, Any]) -> list[dict[str, Any]]:
    """Each GPU's full description: the fixture's ``gpu`` defaults overlaid by its own entry."""
    return [{**(spec.get("gpu") or {}), **g} for g in spec.get("gpus") or []]


def scaled_spec(name: str, n: int) -> dict[str, Any]:
    """Fixture ``name`` with its GPUs repeated up to ``n`` (each copy of the board set in its own PCI
    domain, on the NUMA node its original sits on): a larger host of the same shape, for scaling."""
    spec = load_spec(name)
    base = spec["gpus"]
    spec["gpus"] = [
        {**base[i % len(base)], "bus": f"{i // len(base):08x}{base[i % len(base)]['bus'][8:]}"}
        for i in range(n)
    ]
    spec["hostname"] = f"{spec['hostname']}-{n}"
    return spec


def build(name: str, root: Path, spec: dict[str, Any] | None = None) -> FakeHost:
    """The fake host of fixture ``name`` (or of ``spec``, e.g. :func:`scaled_spec`) under ``root``."""
    spec = spec if spec is not None else load_spec(name)
    root.mkdir(parents=True, exist_ok=True)
    proc, sysfs = root / "proc", root / "sys"
    numa = spec["numa"]

    # -- procfs ---------------------------------------------------------------------------
    (proc / "sys" / "kernel").mkdir(parents=True, exist_ok=True)
    (proc / "sys" / "kernel" / "hostname").write_text(spec["hostname"] + "\n")
    (proc / "sys" / "kernel" / "osrelease").write_text(spec["kernel"] + "\n")
    cpu_node: dict[int, int] = {}
    for node_id, node in enumerate(numa):
        for c in _cpulist(node["cpus"]):
            cpu_node[c] = node_id
    lines = []
    for c in sorted(cpu_node):
        lines += [
            f"processor\t: {c}",
            f"model name\t: {spec['cpu']['model']}",
            f"physical id\t: {cpu_node[c]}",
            f"flags\t\t: {' '.join(spec['cpu'].get('flags', []))}",
            "",
        ]
    (proc / "cpuinfo").write_text("\n".join(lines) + "\n")
    total_kb = sum(n["memory_gib"] for n in numa) * GIB // 1024
    (proc / "meminfo").write_text(f"MemTotal:       {total_kb} kB\nMemFree:        {total_kb // 2} kB\n")
    (proc / "mounts").write_text("tmpfs /dev/shm tmpfs rw,nosuid,nodev 0 0\n")

    # -- sysfs ----------------------------------------------------------------------------
    for node_id, node in enumerate(numa):
        d = sysfs / "devices" / "system" / "node" / f"node{node_id}"
        d.mkdir(parents=True, exist_ok=True)
        (d / "cpulist").write_text(node["cpus"] + "\n")
        kb = node["memory_gib"] * GIB // 1024
        (d / "meminfo").write_text(f"Node {node_id} MemTotal:       {kb} kB\n")
    gpus = gpus_of(spec)
    for g in gpus:
        d = sysfs / "bus" / "pci" / "devices" / _sysfs_name(g["bus"])
        d.mkdir(parents=True, exist_ok=True)
        (d / "numa_node").write_text(f"{g['numa']}\n")
        local = numa[g["numa"]]["cpus"] if g["numa"] >= 0 else ",".join(n["cpus"] for n in numa)
        (d / "local_cpulist").write_text(local + "\n")

    # -- NVML state -----------------------------------------------------------------------
    state = root / "nvml-state.txt"
    st: list[str] = [f"# fake NVML state for {name}"]
    if "init_error" in spec:
        st.append(f"init_error={spec['init_error']}")
    drv = spec.get("driver") or {}
    if drv:
        st.append(f"driver_version={drv['version']}")
        st.append(f"cuda_version={drv['cuda']}")
    st.append(f"device_count={len(gpus)}")
    nvml_numa = spec.get("numa_source") == "nvml"
    for i, g in enumerate(gpus):
        p = f"dev{i}."
        gen, width, max_gen, max_width = g["pcie"]
        fields = {
            "name": g["name"],
            "uuid": g.get("uuid", f"GPU-{i:08x}-{zlib.crc32(name.encode()) % 10**8:08d}-0000-0000-{i:012x}"),
            "pci_bus_id": g["bus"].upper().replace("0X", "0x"),
            "pci_device_id": hex(g.get("pci_device_id", 0)),
            "memory_total": g["memory_mib"] * MIB,
            "memory_used": g.get("memory_used_mib", 5) * MIB,
            "memory_reserved": g.get("memory_reserved_mib", 300) * MIB,
            "cc_major": g["cc"].split(".")[0],
            "cc_minor": g["cc"].split(".")[1],
            "numa_node": g["numa"] if nvml_numa else -1,
            "cpu_affinity": numa[g["numa"]]["cpus"] if g["numa"] >= 0 else ",".join(n["cpus"] for n in numa),
            "pcie_gen": gen,
            "pcie_width": width,
            "pcie_max_gen": max_gen,
            "pcie_max_width": max_width,
            "power_limit_mw": g["power_limit_w"] * 1000,
            "power_usage_mw": g.get("power_draw_w", 60) * 1000,
            "temperature": g["temperature"],
            "temperature_slowdown": g["slowdown"],
            "temperature_shutdown": g["shutdown"],
            "sm_clock": g["sm_clock"],
            "sm_clock_max": g["sm_clock_max"],
            "clocks_event_reasons": hex(g.get("clocks_event_reasons", 0)),
            "fan": g.get("fan", 30),
            "util_gpu": g.get("util_gpu", 0),
        }
        links = g.get("nvlink", 0)
        if links:
            fields["nvlink_links"] = links
            fields["nvlink_switch"] = int(bool(g.get("nvswitch")))
            for lk in range(links):
                fields[f"nvlink_active.{lk}"] = 1
        if g.get("lost"):
            fields["lost"] = 1
        if "minor" in g:  # /dev/nvidia<minor>; without it the fake answers the index
            fields["minor"] = g["minor"]
        st.extend(f"{p}{k}={v}" for k, v in fields.items())
    topo = dict(spec.get("topology") or {})
    default = topo.pop("default", None)
    for i in range(len(gpus)):
        for j in range(i + 1, len(gpus)):
            kind = topo.get(f"{i}-{j}", default)
            if kind:
                st.append(f"topo.{i}.{j}={TOPO_LEVEL[kind]}")
    p2p = dict(spec.get("p2p") or {})
    p2p_default = p2p.pop("default", 0)
    for i in range(len(gpus)):
        for j in range(i + 1, len(gpus)):
            st.append(f"p2p.{i}.{j}={p2p.get(f'{i}-{j}', p2p_default)}")
    state.write_text("\n".join(st) + "\n")
    return FakeHost(name=name, spec=spec, root=root, proc=proc, sys=sysfs, state=state)


def _sysfs_name(bus: str) -> str:
    dom, _, rest = bus.lower().partition(":")
    return f"{dom[-4:]}:{rest}"


def _cpulist(text: str) -> list[int]:
    out: list[int] = []
    for part in text.split(","):
        lo, _, hi = part.partition("-")
        out.extend(range(int(lo), int(hi or lo) + 1))
    return out


def scaled_snapshot(n: int) -> dict[str, Any]:
    """A ``hwprofile.host/1`` snapshot (parsed JSON) of ``n`` H100 SXM GPUs over two NUMA nodes, for
    scaling checks beyond the fixtures' 8 GPUs: NVLink inside each board of 8, NODE between boards on
    one NUMA node, SYS across nodes (what ``detect --json`` writes for h100-sxm-8x, repeated)."""
    cpus = ("0-55,112-167", "56-111,168-223")
    gpus = []
    for i in range(n):
        node = 0 if i < n // 2 else 1
        gpus.append(
            {
                "index": i,
                "name": "NVIDIA H100 80GB HBM3",
                "uuid": f"GPU-{i:08x}-0000-0000-0000-000000000000",
                "pci_bus_id": f"0000{i >> 8:04x}:{(i & 0xFF):02x}:00.0",
                "pci_device_id": "0x233010de",
                "minor_number": i,
                "memory_total_bytes": 85520809984,
                "memory_used_bytes": 5242880,
                "memory_reserved_bytes": 314572800,
                "compute_capability": "9.0",
                "numa_node": node,
                "numa_node_source": "nvml",
                "cpu_affinity": cpus[node],
                "pcie": {"gen": 5, "width": 16, "max_gen": 5, "max_width": 16, "degraded": False},
                "nvlink_active_links": 18,
                "power_limit_watts": 700.0,
                "power_draw_watts": 60.0,
                "temperature_c": 29,
                "temperature_slowdown_c": 87,
                "temperature_shutdown_c": 92,
                "sm_clock_mhz": 1980,
                "sm_clock_max_mhz": 1980,
                "clocks_event_reasons": [],
                "clocks_event_reasons_mask": 0,
                "lost": False,
            }
        )
    links = [
        {
            "a": a,
            "b": b,
            "p2p": True,
            "link": "NV18"
            if a // 8 == b // 8
            else ("NODE" if gpus[a]["numa_node"] == gpus[b]["numa_node"] else "SYS"),
        }
        for a in range(n)
        for b in range(a + 1, n)
    ]
    return {
        "schema": "hwprofile.host/1",
        "hostname": f"scaled-{n}",
        "kernel": "6.8.0",
        "cpu": {
            "model": "Intel(R) Xeon(R) Platinum 8480+",
            "logical_cpus": 224,
            "sockets": 2,
            "flags": ["avx512f"],
        },
        "memory_bytes": 2 << 40,
        "numa_nodes": [{"id": k, "cpus": c, "memory_bytes": 1 << 40} for k, c in enumerate(cpus)],
        "gpus": gpus,
        "gpu_links": links,
        "driver": {
            "version": "550.54.15",
            "cuda_version": "12.4",
            "nvml_library": "/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1",
        },
        "software": {
            "vllm_version": "0.32.0",
            "vllm_distribution": "vllm",
            "numactl_path": "/usr/bin/numactl",
            "tmpfs_path": "/dev/shm",
            "tmpfs_free_bytes": 25 << 30,
        },
        "errors": [],
    }
