"""Human-readable views of hwprofile's data (formatting only; no decisions)."""

from __future__ import annotations

from .snapshot import Gpu, HostSnapshot


def human_bytes(n: int | float | None) -> str:
    if n is None:
        return "?"
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(value) < 1024 or unit == "TiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{value:.1f} TiB"


def _v(x: object, suffix: str = "") -> str:
    return "?" if x is None else f"{x}{suffix}"


def _pcie(g: Gpu) -> str:
    p = g.pcie
    if p.gen is None and p.width is None:
        return "?"
    text = f"Gen{_v(p.gen)} x{_v(p.width)}"
    if p.degraded:
        text += f" (max Gen{_v(p.max_gen)} x{_v(p.max_width)}) BELOW MAX"
    return text


def _table(rows: list[list[str]]) -> list[str]:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return ["  " + "  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows]


def format_host(s: HostSnapshot) -> str:
    out: list[str] = []
    cpu = s.cpu
    out.append(f"Host {s.hostname or '?'} (kernel {s.kernel or '?'})")
    out.append(
        f"  CPU: {cpu.model or '?'}, {_v(cpu.sockets)} socket(s), {_v(cpu.logical_cpus)} logical CPUs;"
        f" memory {human_bytes(s.memory_bytes)}"
    )
    d, sw = s.driver, s.software
    out.append(
        f"  NVIDIA driver {d.version or 'none'}, CUDA {d.cuda_version or '-'};"
        f" vLLM {sw.vllm_version or 'not installed'}"
        + (f" ({sw.vllm_distribution})" if sw.vllm_distribution else "")
    )
    out.append(
        f"  numactl {sw.numactl_path or 'not found'};"
        f" tmpfs {sw.tmpfs_path or 'none'}"
        + (f" ({human_bytes(sw.tmpfs_free_bytes)} free)" if sw.tmpfs_free_bytes is not None else "")
    )

    out.append("")
    if not s.gpus:
        out.append("GPUs: none detected")
    else:
        out.append(f"GPUs ({len(s.usable_gpus)} usable of {len(s.gpus)})")
        rows = [
            [
                "#",
                "name",
                "memory",
                "CC",
                "NUMA",
                "CPUs",
                "PCIe",
                "NVLink",
                "temp (slow/shut)",
                "power",
                "SM MHz",
                "clock events",
            ]
        ]
        for g in s.gpus:
            if g.lost:
                rows.append([str(g.index), "LOST", "-", "-", "-", "-", "-", "-", "-", "-", "-", "-"])
                continue
            rows.append(
                [
                    str(g.index),
                    g.name or "?",
                    human_bytes(g.memory_total_bytes),
                    _v(g.compute_capability),
                    _v(g.numa_node),
                    _v(g.cpu_affinity),
                    _pcie(g),
                    "none" if g.nvlink_active_links == 0 else f"{_v(g.nvlink_active_links)} links",
                    f"{_v(g.temperature_c, ' C')} ({_v(g.temperature_slowdown_c)}/{_v(g.temperature_shutdown_c)})",
                    _v(None if g.power_limit_watts is None else f"{g.power_limit_watts:.0f}", " W"),
                    f"{_v(g.sm_clock_mhz)}/{_v(g.sm_clock_max_mhz)}",
                    ",".join(g.clocks_event_reasons)
                    if g.clocks_event_reasons
                    else ("-" if g.clocks_event_reasons is not None else "?"),
                ]
            )
        out.extend(_table(rows))
        degraded = [g.index for g in s.usable_gpus if g.pcie.degraded]
        if degraded:
            out.append(
                "  warning: PCIe link below its maximum on GPU "
                + ", ".join(map(str, degraded))
                + " (reseat the card, check the slot, or the BIOS link setting)"
            )

    if s.gpu_links:
        idx = [g.index for g in s.usable_gpus]
        out.append("")
        out.append("GPU links (nvidia-smi topo vocabulary; * = P2P supported)")
        rows = [[""] + [f"GPU{i}" for i in idx]]
        for a in idx:
            row = [f"GPU{a}"]
            for b in idx:
                if a == b:
                    row.append("X")
                    continue
                lk = s.link(a, b)
                row.append("?" if lk is None or lk.link is None else lk.link + ("*" if lk.p2p else ""))
            rows.append(row)
        out.extend(_table(rows))

    out.append("")
    if s.numa_nodes:
        out.append(f"NUMA nodes ({len(s.numa_nodes)})")
        for n in s.numa_nodes:
            on = [str(g.index) for g in s.usable_gpus if g.numa_node == n.id]
            out.append(
                f"  node {n.id}: CPUs {n.cpus}, memory {human_bytes(n.memory_bytes)}"
                + (f", GPUs {','.join(on)}" if on else "")
            )
    else:
        out.append("NUMA nodes: unknown")

    if s.errors:
        out.append("")
        out.append(f"Could not read ({len(s.errors)})")
        for e in s.errors:
            out.append(f"  {e.where}: {e.message}")
    return "\n".join(out) + "\n"
