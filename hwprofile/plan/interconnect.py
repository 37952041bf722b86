"""The interconnect check's result as plain data, and what the planner decides from it (pure).

:mod:`hwprofile.interconnect` runs the check (an all-reduce of a known tensor across each planned TP
group, small and large, P2P on and off, each a short-lived process under a hard deadline) and
records a :class:`Report` per host fingerprint; :func:`decide` reads that record (never runs it)
and says, with reasons: whether vLLM's custom all-reduce must be disabled, whether NCCL must run
without P2P (``NCCL_P2P_DISABLE=1``), whether this TP group cannot be trusted at all (a smaller TP
or replicas), and the measured link bandwidth for the performance model.

Outcomes of one run: ``ok`` (every size exact on every rank), ``wrong`` (a rank saw a number other
than the known sum), ``hang`` (the deadline passed; the process group was killed), ``error`` (a rank
exited non-zero before a result).
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, NamedTuple

if TYPE_CHECKING:
    from collections.abc import Sequence
    from typing import Any

    from .types import Plan

SCHEMA = "hwprofile.interconnect/1"
OUTCOMES = ("ok", "wrong", "hang", "error")


# -- one all-reduce by link type (the performance model's collective cost) -------------------------


class Collective(NamedTuple):
    """One all-reduce over a link type: ``latency_us + 2 (n - 1) / n * bytes / bus`` where ``bus`` is the
    link's per-direction GB/s times ``efficiency`` (what an all-reduce of a decode step's 16 KB-4 MB reaches).
    The ``*_lo``/``*_hi`` bounds are the spread of the sources below: the all-reduce's error band."""

    kind: str  # nvlink, pcie_p2p, pcie_host, sys, network
    implementation: str
    latency_us: float
    latency_lo_us: float
    latency_hi_us: float
    per_gpu_us: float  # added per GPU in the group (NCCL's ring steps)
    efficiency: float
    efficiency_lo: float
    efficiency_hi: float
    source: str
    # the bytes go through host memory (no P2P): every GPU of the group moves its share into and out of
    # the CPU at once, so the CPU's and memory's throughput is shared by the group's flows (above two
    # GPUs the share falls with the group's size: :func:`host_share`)
    host_staged: bool = False
    # added per step of the ring (an all-reduce of n GPUs is 2 (n - 1) steps, each waiting on the one
    # before): a step handed over through host memory (:data:`HOST_STEP_SOURCE`)
    step_us: float = 0.0


# A ring step through host memory (NCCL's SHM transport, no P2P): the sender writes its chunk and a flag
# into host memory across PCIe and the receiver polls that flag across PCIe, a round trip per step where
# P2P writes into the receiver's own memory; a small all-reduce of n GPUs waits on 2 (n - 1) such steps
# in a row, so it grows with the group faster than the P2P ring's per-GPU term. Fitted to issue 38's
# 4x RTX 3090 single-stream decode (benchmarks/data/validation_qwen38.yaml: FP8 and NVFP4 at 8K, TP 2 and
# TP 4, custom all-reduce off): the measured decode step less its weight, KV and fixed terms leaves
# 29-37 µs per all-reduce at TP 4 (4 points) and 3-14 µs at TP 2 (3 points), where the P2P ring's terms
# give 16 and 9; 3 µs per step gives 34 and 15. The 4x L4 host's TPOT (TP 4, no P2P) moves the same way.
# The ring's 2 (n - 1) steps are NCCL's own latency model (src/graph/tuning.cc: base + steps x per-step).
# AIConfigurator's L40S NCCL latencies (7.7, 11.9, 22.6 µs at 2, 4, 8 GPUs) are the P2P ring's above;
# with this step hwprofile's TPOT of its L40S TP4 cases is 11-14 % above AIConfigurator's (6-12 % before).
HOST_STEP_US = 3.0
HOST_STEP_SOURCE = (
    "a ring step through host memory waits on a flag polled across PCIe: "
    f"{HOST_STEP_US:g} µs x 2 (n - 1) steps (fitted to issue 38's 4x RTX 3090 single-stream decode)"
)

COLLECTIVES: dict[str, Collective] = {
    # vLLM's custom all-reduce (one kernel, CUDA graphs) over NVLink. Latency: AIConfigurator 0.12's measured
    # vLLM tables (systems/data/*/comm) 4.3-5.7 µs on H100/A100 SXM under CUDA graphs; 8.7-11.8 µs at 32 KB
    # without graphs (H100, TP 2/4/8: sglang PR #2904's table of vLLM's kernel), the upper bound. Bus share:
    # NCCL 2 MiB over 8 H100 in 38 µs (~106 GB/s of 450: 0.24; AIConfigurator), vLLM's kernel at 256 KB-1 MB
    # on H100 TP4/TP8 ~48 GB/s of 450 (0.11; sglang PR #2904), the lower bound.
    "nvlink": Collective(
        "nvlink",
        "vLLM custom all-reduce",
        5.0,
        4.3,
        11.8,
        0.0,
        0.25,
        0.11,
        0.30,
        "datasheet NVLink x measured share (AIConfigurator 0.12 tables; sglang PR #2904)",
    ),
    # vLLM's custom all-reduce over PCIe P2P (2 GPUs only: custom_all_reduce.py refuses more than two
    # PCIe-only GPUs): 5.4 µs on 2 L40S (AIConfigurator); 80 % of the lanes' rate (TLP headers).
    "pcie_p2p_custom": Collective(
        "pcie_p2p",
        "vLLM custom all-reduce (2 GPUs)",
        6.0,
        5.4,
        10.0,
        0.0,
        0.80,
        0.5,
        0.85,
        "datasheet PCIe lanes x 80 % DMA share; latency AIConfigurator's 2 x L40S (5.4 µs)",
    ),
    # NCCL's ring over PCIe P2P (3+ GPUs): ~2 µs + 3 µs per GPU (AIConfigurator L40S: 7.7, 11.9, 22.6 µs on 2,
    # 4, 8 GPUs).
    "pcie_p2p": Collective(
        "pcie_p2p",
        "NCCL ring (P2P)",
        2.0,
        1.5,
        4.0,
        3.0,
        0.80,
        0.5,
        0.85,
        "datasheet PCIe lanes x 80 %; latency AIConfigurator's L40S NCCL table",
    ),
    # NCCL through host memory (no P2P: the SHM transport copies every byte twice): the same ring latency, half
    # the bandwidth; AIConfigurator's L40S NCCL table: 2 MiB over 2 GPUs in 122 µs (~11-18 GB/s of 25).
    "pcie_host": Collective(
        "pcie_host",
        "NCCL via host memory (SHM)",
        2.0,
        1.5,
        6.0,
        3.0,
        0.40,
        0.25,
        0.5,
        "datasheet PCIe lanes x 40 % (two copies); AIConfigurator's L40S NCCL table",
        True,
        HOST_STEP_US,
    ),
    # across the CPU sockets (SYS): one more hop (+5 µs, assumed) and the socket link halves it again (4 L40S:
    # ~5 GB/s, AIConfigurator); with P2P 40 %, without 20 %.
    "sys": Collective(
        "sys",
        "NCCL across the CPU sockets",
        7.0,
        4.0,
        15.0,
        3.0,
        0.40,
        0.13,
        0.5,
        "datasheet PCIe lanes x 40 % (socket link); +5 µs per hop assumed; AIConfigurator's 4 x L40S",
    ),
    "sys_host": Collective(
        "sys",
        "NCCL across the CPU sockets via host memory",
        7.0,
        4.0,
        15.0,
        3.0,
        0.20,
        0.13,
        0.4,
        "datasheet PCIe lanes x 20 % (socket link, two copies); AIConfigurator's 4 x L40S",
        True,
        HOST_STEP_US,
    ),
    # NCCL between hosts (InfiniBand / RoCE, GPUDirect RDMA): ~12-25 µs for a small all-reduce across two
    # nodes (nccl-tests all_reduce_perf at 8 B-64 KB), ~80 % of the NIC's line rate at MB sizes.
    "network": Collective(
        "network",
        "NCCL over the network (IB/RoCE)",
        18.0,
        12.0,
        30.0,
        3.0,
        0.80,
        0.5,
        0.9,
        "datasheet NIC line rate x 80 %; latency nccl-tests all_reduce_perf across 2 nodes",
    ),
}


# Host-staged all-reduce (NCCL's SHM transport, no P2P) across more than two GPUs: every GPU writes its
# share into host memory and reads its neighbour's at the same time, so the group's flows meet in the CPU
# and its memory. NCCL's maintainers: "On PCI systems, the performance you get is usually determined by the
# bandwidth your CPU and memory can deliver" (NVIDIA/nccl#1639) and "performance tends to degrade
# significantly when we have traffic going from/to all GPUs and interleaving in the CPU; [...] 2 GPUs only
# would be kind of equivalent to the p2pBandwidth test in bidirectional mode" (NVIDIA/nccl#1285). The
# per-link share of COLLECTIVES is what two GPUs reach; ``n`` GPUs share that CPU throughput: 2 / n of it.
# The low end of the band: on multi-die CPUs with memory interleaved across the dies (AMD EPYC at NPS1,
# one NUMA node per socket) SHM all-reduces of four GPUs fall much further (nccl-tests#74, nccl#1285: "very
# bad for NCCL performance via shared memory", fixed by NPS4): (2 / n)^3. The high end: a CPU whose
# throughput is not the limit (the two-GPU share). The snapshot does not say which: the band says so.
HOST_SHARE_SOURCE = (
    "the group's flows share the CPU's and memory's throughput (NVIDIA/nccl#1639, #1285): 2 / n of the "
    "two-GPU share, down to (2 / n)^3 where memory interleaves across CPU dies (nccl-tests#74)"
)


# Where the snapshot does say it: a group whose GPUs sit under different PCIe host bridges of one NUMA
# node (nvidia-smi topo's NODE) on an AMD EPYC or Threadripper (several dies, one NUMA node per socket
# at the default NPS1: memory interleaved across the dies; at NPS4 the bridges' GPUs would read SYS) is
# the slow case those issues measured: nccl-tests#74, A40s at buses 01, 25, 41, 61 of an EPYC 7302;
# nccl#1285, 4090s on an EPYC 7K62. The four RTX 3090s on an EPYC 7642 of issue 38's validation set
# agree: their four-GPU prefill and loaded waves come right there, their two-GPU ones at the share of two.
HOST_SHARE_DIES_SOURCE = (
    "GPUs under different PCIe host bridges (NODE) of a CPU whose memory interleaves across its dies (AMD "
    "EPYC/Threadripper, one NUMA node): (2 / n)^3 of the two-GPU share (nccl-tests#74, NVIDIA/nccl#1285: "
    "fixed by NPS4), up to 2 / n"
)


# CPUs built of several dies whose memory interleaves across them at one NUMA node per socket (the
# default NPS1), by their /proc/cpuinfo model name
MEMORY_ACROSS_DIES = re.compile(r"\bAMD (EPYC|Ryzen Threadripper)\b")


def memory_across_dies(cpu_model: str | None) -> bool:
    """Whether the host's CPU (its model name) interleaves memory across several dies
    (:data:`HOST_SHARE_DIES_SOURCE`)."""
    return bool(MEMORY_ACROSS_DIES.search(cpu_model or ""))


def host_share(c: Collective, n: int, across_dies: bool = False) -> tuple[float, float, float]:
    """The share (central, low, high) of a collective's per-link efficiency a group of ``n`` GPUs reaches
    when its bytes are staged through host memory (``c.host_staged``); 1 for P2P, NVLink and two GPUs.
    ``across_dies``: the group spans PCIe host bridges of a CPU whose memory interleaves across its
    dies (:data:`HOST_SHARE_DIES_SOURCE`): the slow end is the central value."""
    if not c.host_staged or n <= 2:
        return 1.0, 1.0, 1.0
    f = 2 / n
    if across_dies:
        return f**3, f**3, f
    return f, f**3, 1.0


def collective_key(kind: str, tp: int, p2p: bool) -> str:
    """The :data:`COLLECTIVES` entry vLLM uses for a TP group of ``tp`` over a link ``kind``."""
    if kind == "nvlink":
        return "nvlink"
    if kind == "sys":
        return "sys" if p2p else "sys_host"
    if kind == "pcie_p2p":
        return "pcie_p2p_custom" if tp == 2 else "pcie_p2p"
    return kind


class SizeResult(NamedTuple):
    bytes: int
    exact: bool  # every rank saw the known sum, element for element
    seconds: float  # median all-reduce time, slowest rank
    bus_gbs: float  # NCCL's bus bandwidth: 2 (n - 1) / n * bytes / seconds, in GB/s


class Run(NamedTuple):
    group: tuple[int, ...]  # GPU indexes (NVML) of the TP group; ranks of a CPU group on gloo
    p2p: bool  # False: run with NCCL_P2P_DISABLE=1
    outcome: str  # one of OUTCOMES
    detail: str  # what went wrong, in words ("" when ok)
    sizes: tuple[SizeResult, ...] = ()
    wall_s: float | None = None


class Report(NamedTuple):
    fingerprint: str
    backend: str  # nccl or gloo
    runs: tuple[Run, ...]
    measured_at: str | None = None  # ISO 8601 UTC
    torch_version: str | None = None
    schema: str = SCHEMA
    # what the result depends on beyond the GPUs (the fingerprint): a later driver or another IOMMU
    # mode makes it stale (:func:`stale`); None: not recorded (a record from before these fields)
    driver_version: str | None = None
    iommu: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "schema": self.schema,
            "fingerprint": self.fingerprint,
            "backend": self.backend,
            "measured_at": self.measured_at,
            "torch_version": self.torch_version,
            "driver_version": self.driver_version,
            "iommu": self.iommu,
            "runs": [
                {**r._asdict(), "group": list(r.group), "sizes": [s._asdict() for s in r.sizes]}
                for r in self.runs
            ],
        }


def _bad(where: str, why: str) -> ValueError:
    return ValueError(f"{where}: not a hwprofile interconnect result: {why}")


def _num(where: str, v: Any, key: str, lo: float, hi: float, whole: bool = False) -> Any:
    ok = type(v) is int or (not whole and type(v) is float)
    if not ok or not lo <= v <= hi:
        raise _bad(
            where, f"{key}: {v!r:.40} is not a {'whole ' if whole else ''}number from {lo:g} to {hi:g}"
        )
    return v


def _text(where: str, v: Any, key: str, null: bool = False) -> Any:
    if v is None and null:
        return None
    if not isinstance(v, str) or len(v) > 4096:
        raise _bad(where, f"{key}: expected a string")
    return v


def _size_from_dict(s: Any, sk: str, where: str) -> SizeResult:
    if not isinstance(s, dict) or type(s.get("exact")) is not bool:
        raise _bad(where, f"{sk}: expected an object with exact true or false")
    return SizeResult(
        _num(where, s.get("bytes"), f"{sk}.bytes", 1, 1 << 40, whole=True),
        s["exact"],
        _num(where, s.get("seconds"), f"{sk}.seconds", 0, 86400),
        _num(where, s.get("bus_gbs"), f"{sk}.bus_gbs", 0, 1e6),
    )


def _run_from_dict(r: Any, k: str, where: str) -> Run:
    if not isinstance(r, dict):
        raise _bad(where, f"{k}: expected an object")
    group = r.get("group")
    if not isinstance(group, list) or not 1 <= len(group) <= 256:
        raise _bad(where, f"{k}.group: expected a list of GPU indexes")
    if type(r.get("p2p")) is not bool:
        raise _bad(where, f"{k}.p2p: expected true or false")
    if r.get("outcome") not in OUTCOMES:
        raise _bad(where, f"{k}.outcome: expected one of {', '.join(OUTCOMES)}")
    sizes_in = r.get("sizes", [])
    if not isinstance(sizes_in, list) or len(sizes_in) > 64:
        raise _bad(where, f"{k}.sizes: expected a list")
    sizes = [_size_from_dict(s, f"{k}.sizes[{j}]", where) for j, s in enumerate(sizes_in)]
    wall = r.get("wall_s")
    return Run(
        tuple(_num(where, g, f"{k}.group", 0, 255, whole=True) for g in group),
        r["p2p"],
        r["outcome"],
        _text(where, r.get("detail", ""), f"{k}.detail"),
        tuple(sizes),
        None if wall is None else _num(where, wall, f"{k}.wall_s", 0, 86400),
    )


def report_from_dict(doc: Any, where: str) -> Report:
    """A :class:`Report` from parsed JSON; ``ValueError`` naming ``where`` and the field otherwise."""
    if not isinstance(doc, dict) or doc.get("schema") != SCHEMA:
        raise _bad(where, f"schema is not {SCHEMA}")
    runs_in = doc.get("runs")
    if not isinstance(runs_in, list) or len(runs_in) > 4096:
        raise _bad(where, "runs: expected a list")
    runs = [_run_from_dict(r, f"runs[{i}]", where) for i, r in enumerate(runs_in)]
    return Report(
        _text(where, doc.get("fingerprint"), "fingerprint"),
        _text(where, doc.get("backend"), "backend"),
        tuple(runs),
        _text(where, doc.get("measured_at"), "measured_at", null=True),
        _text(where, doc.get("torch_version"), "torch_version", null=True),
        driver_version=_text(where, doc.get("driver_version"), "driver_version", null=True),
        iommu=_text(where, doc.get("iommu"), "iommu", null=True),
    )


class Decision(NamedTuple):
    """What the plan takes from the recorded check for one TP group; every field has its reason."""

    group: tuple[int, ...]
    proven: bool | None  # None: no run of this group recorded (the check has not run here)
    disable_custom_all_reduce: bool
    nccl_p2p_disable: bool
    tp_unsafe: bool  # neither mode gave the right result in time: a smaller TP or replicas
    link_gbs: float | None  # measured bus bandwidth of the large all-reduce in the mode chosen
    reasons: tuple[str, ...]


def _describe(run: Run) -> str:
    mode = "P2P on" if run.p2p else "P2P off (NCCL_P2P_DISABLE=1)"
    return f"{mode}: {run.outcome}" + (f" ({run.detail})" if run.detail else "")


def decide(report: Report | None, group: Sequence[int]) -> Decision:
    """The decision for the TP group ``group`` (GPU indexes) from ``report``."""
    g = tuple(sorted(group))
    if len(g) <= 1:
        return Decision(g, True, False, False, False, None, ("TP 1: no all-reduce between GPUs",))
    runs = [r for r in (report.runs if report else ()) if tuple(sorted(r.group)) == g]
    on = next((r for r in runs if r.p2p), None)
    off = next((r for r in runs if not r.p2p), None)
    if on is None and off is None:
        why = (
            "no interconnect check recorded for this host"
            if report is None
            else "the check did not cover GPUs "
        )
        if report is not None:
            why += ",".join(map(str, g))
        return Decision(
            g, None, False, False, False, None, (why + ": run `hwprofile doctor --interconnect`",)
        )

    def large_gbs(r: Run | None) -> float | None:
        return max(r.sizes, key=lambda s: s.bytes).bus_gbs if r and r.sizes else None

    ok_on = on is not None and on.outcome == "ok"
    ok_off = off is not None and off.outcome == "ok"
    reasons = [_describe(r) for r in (on, off) if r is not None]
    if ok_on:
        reasons.append("the all-reduce is exact and in time with P2P: custom all-reduce and NCCL P2P stay on")
        return Decision(g, True, False, False, False, large_gbs(on), tuple(reasons))
    if ok_off:
        reasons.append(
            "with P2P the all-reduce is wrong or hangs, without it it is exact: NCCL_P2P_DISABLE=1 and "
            "disable_custom_all_reduce (vLLM's custom all-reduce needs P2P) — check ACS/IOMMU"
        )
        return Decision(g, True, True, True, False, large_gbs(off), tuple(reasons))
    reasons.append(
        "no mode gave the exact sum in time: do not run TP across these GPUs (a smaller TP or replicas)"
    )
    return Decision(g, False, True, False, True, None, tuple(reasons))


def vllm_p2p(host: Any, group: Sequence[int]) -> tuple[bool | None, str]:
    """What vLLM's own cached P2P test (:class:`~hwprofile.host.snapshot.VllmP2p`, in the snapshot)
    says of every ordered pair of ``group`` (GPU indexes): False where some pair was denied, True
    where every pair was allowed, None where no cache file covers the group; with the reason. The file
    of exactly these GPUs (the one vLLM reads for this instance) decides; else a denial in any file
    covering them is evidence about the hardware."""
    ic = host.interconnect
    g = tuple(group)
    covering = [
        c for c in ic.vllm_p2p if c.unknown is None and c.gpu_indexes and set(g) <= set(c.gpu_indexes)
    ]
    covering.sort(key=lambda c: set(c.gpu_indexes or ()) != set(g))  # the exact file first
    where = ic.vllm_cache_root or "VLLM_CACHE_ROOT"
    for c in covering:
        pos = {gpu: i for i, gpu in enumerate(c.gpu_indexes or ())}
        pairs = [(a, b, f"{pos[a]}->{pos[b]}") for a in g for b in g if a != b]
        denied = [(a, b) for a, b, k in pairs if k in c.denied]
        if denied:
            return False, (
                f"vLLM's own P2P test ({where}/{c.file}) found no peer access for GPU pair(s) "
                + ", ".join(f"{a}->{b}" for a, b in denied)
                + ": its custom all-reduce cannot run there (disable_custom_all_reduce; NCCL carries the all-reduce)"
            )
        if set(c.gpu_indexes or ()) == set(g) and all(k in c.allowed for _, _, k in pairs):
            return True, f"vLLM's own P2P test ({where}/{c.file}) found peer access between every pair"
    if ic.vllm_p2p_unknown and not ic.vllm_p2p:
        return None, f"vLLM's P2P cache not read: {ic.vllm_p2p_unknown}"
    return None, "vLLM has not cached a P2P test of these GPUs (it runs one at its first start)"


def apply(plan: Plan, report: Report | None, source: str, host: Any = None, note: Any = None) -> Plan:
    """``plan`` with, on each GPU instance of TP > 1, the recorded check's decision and what vLLM's
    own cached P2P test says (``host``'s snapshot): the instance's ``interconnect`` (what render turns
    into ``--disable-custom-all-reduce`` and ``NCCL_P2P_DISABLE=1``), a reason per instance, and a
    warning where TP is not safe; ``note`` (a :class:`~.types.Reason`: which record was used, or why
    it was ignored) joins the reasons. Without a recorded check (``report`` None) and without a vLLM
    P2P cache of the group, the instance is unchanged (``interconnect`` absent: never proven)."""
    import dataclasses

    from .types import Reason

    instances = []
    reasons = list(plan.reasons) + ([note] if note is not None else [])
    warnings = list(plan.warnings)
    for inst in plan.instances:
        if inst.device != "cuda" or inst.tensor_parallel_size * max(1, int(inst.pipeline_parallel_size)) <= 1:
            instances.append(inst)
            continue
        d = decide(report, inst.gpus)
        p2p, p2p_why = vllm_p2p(host, inst.gpus) if host is not None else (None, "")
        if report is None and p2p is None:
            instances.append(inst)  # as planned (by_links' record where the links rule custom all-reduce out)
            continue
        links = inst.interconnect if isinstance(inst.interconnect, dict) else {}  # by_links' record
        why = list(d.reasons) + list(links.get("reasons", ()))
        no_custom = d.disable_custom_all_reduce or bool(links.get("disable_custom_all_reduce"))
        if p2p is not None:
            why.append(p2p_why)
        if p2p is False and not no_custom:
            no_custom = True
        record = {
            "proven": d.proven,
            "disable_custom_all_reduce": no_custom,
            "nccl_p2p_disable": d.nccl_p2p_disable,
            "tp_unsafe": d.tp_unsafe,
            "link_gbs": d.link_gbs,
            "link_source": "measured" if d.link_gbs is not None else "datasheet",
            "vllm_p2p": p2p,
            "reasons": tuple(why),
            "source": source if report is not None else "vLLM's P2P cache",
        }
        instances.append(dataclasses.replace(inst, interconnect=record))
        reasons.append(
            Reason(f"instances.{inst.name}.interconnect", d.proven, "; ".join(why), str(record["source"]))
        )
        if d.tp_unsafe:
            warnings.append(
                f"{inst.name}: the all-reduce across GPUs {','.join(map(str, inst.gpus))} was wrong or hung in "
                f"every mode ({source}): use a smaller tensor_parallel_size or replicas"
            )
    return dataclasses.replace(
        plan, instances=tuple(instances), reasons=tuple(reasons), warnings=tuple(warnings)
    )


def measured_link(link: Any, decision: Decision, report: Report | None = None) -> Any:
    """The performance model's :class:`~.predict.Link` of a TP group with what the check measured: the
    bandwidth (NCCL's bus bandwidth of the large all-reduce is what a ring moves per link and direction,
    the unit of ``Link.gbs``) and, given the ``report``, the latency (the small all-reduce's time less its
    bytes over that bandwidth); the datasheet link where nothing was measured. The check runs eagerly
    (no CUDA graphs, NCCL rather than vLLM's custom kernel): its latency is the band's upper end, the
    datasheet's lower end stays. Through :func:`link_source`, which ``candidates.link_for`` calls."""
    import dataclasses

    if decision.link_gbs is None or decision.link_gbs <= 0 or link.kind == "none":
        return link
    mode = "P2P off" if decision.nccl_p2p_disable else "P2P on"
    gbs = decision.link_gbs
    src = f"measured: {gbs:.2f} GB/s bus bandwidth of the large all-reduce ({mode}; hwprofile doctor --interconnect)"
    lat = link.latency_us
    run = next(
        (
            r
            for r in (report.runs if report else ())
            if tuple(sorted(r.group)) == decision.group
            and r.p2p != decision.nccl_p2p_disable
            and r.outcome == "ok"
            and r.sizes
        ),
        None,
    )
    if run is not None:
        small = min(run.sizes, key=lambda x: x.bytes)
        n = len(run.group)
        lat = max(0.0, small.seconds * 1e6 - 2 * (n - 1) / n * small.bytes / gbs / 1e3)
        src += f", {lat:.1f} µs latency of the {small.bytes // 1024} KiB one (eager: the band's upper end)"
    lo = min(link.latency_lo_us or link.latency_us, lat)
    return dataclasses.replace(
        link,
        gbs=gbs,
        latency_us=lat,
        latency_lo_us=lo,
        latency_hi_us=max(lat, link.latency_us),
        gbs_lo=gbs * 0.9,
        gbs_hi=gbs * 1.1,
        basis="measured",
        source=f"{src}; was {link.source}",
    )


# -- which measurement a plan may use, and the bandwidth the performance model takes from it ------


def stale(report: Report, host: Any, fp: str) -> str | None:
    """Why the recorded ``report`` no longer describes ``host`` (a
    :class:`~hwprofile.host.snapshot.HostSnapshot` whose fingerprint is ``fp``,
    :func:`~.candidates.host_fingerprint`), or None when it still does: other GPUs (the fingerprint of
    their UUIDs differs), another NVIDIA driver, another IOMMU mode. A record that did not note the
    driver or the IOMMU mode is not judged on it."""
    if report.fingerprint != fp:
        return f"measured on other GPUs (host fingerprint {report.fingerprint}, this host {fp})"
    drv = host.driver.version
    if report.driver_version and drv and report.driver_version != drv:
        return f"measured under NVIDIA driver {report.driver_version}, this host runs {drv}"
    io = host.interconnect.iommu
    if report.iommu and io and report.iommu != io:
        return f"measured with the IOMMU {report.iommu}, now it is {io} (peer-to-peer routing changed)"
    return None


def link_source(link: Any, report: Report | None, group: Sequence[int]) -> Any:
    """Where the performance model's link bandwidth of the TP group ``group`` comes from: the
    measured bus bandwidth of the recorded check (provenance ``measured``, :func:`measured_link`)
    where ``report`` (already judged current by :func:`stale`) covers this group with a run that
    passed, else ``link`` as the datasheet and the snapshot give it. The bandwidth, the latency (from
    the check's small all-reduce) and their source change; the kind stays the snapshot's."""
    if report is None or len(group) <= 1:
        return link
    return measured_link(link, decide(report, group), report)


# vLLM's custom all-reduce (0.32/0.33 vllm/distributed/device_communicators/custom_all_reduce.py
# CustomAllreduce.__init__): world sizes 2, 4, 6, 8, 16; more than two GPUs only when NVLink joins every
# pair (is_fully_connected); and P2P between every pair (_can_p2p: with VLLM_SKIP_P2P_CHECK=1, vLLM's
# default, the driver's own P2P report).
CUSTOM_AR_WORLD_SIZES = (2, 4, 6, 8, 16)
LINKS_SOURCE = "the snapshot's GPU links (NVML topology and P2P status)"


def custom_all_reduce(host: Any, group: Sequence[int]) -> tuple[bool | None, str]:
    """Whether vLLM's custom all-reduce can run across the TP group ``group`` (GPU indexes) of
    ``host`` (a :class:`~hwprofile.host.snapshot.HostSnapshot`), and why: True over NVLink (every pair)
    or over PCIe with P2P (two GPUs); False where vLLM would disable it (PCIe without P2P, more than two
    GPUs without NVLink, an unsupported size), so the plan renders ``--disable-custom-all-reduce``; None
    where the links or their P2P status are not read (vLLM checks for itself)."""
    g = tuple(sorted(group))
    if len(g) <= 1:
        return None, "TP 1: no all-reduce between GPUs"
    pairs = [(a, b, host.link(a, b)) for i, a in enumerate(g) for b in g[i + 1 :]]
    kinds = [lk.link if lk else None for _, _, lk in pairs]
    nvlink = all(k is not None and k.startswith("NV") for k in kinds)
    src = "vLLM's CustomAllreduce (vllm/distributed/device_communicators/custom_all_reduce.py)"
    if len(g) not in CUSTOM_AR_WORLD_SIZES:
        return False, (
            f"{len(g)} GPUs: vLLM's custom all-reduce runs on {', '.join(map(str, CUSTOM_AR_WORLD_SIZES))} "
            f"only ({src}); disabled explicitly, NCCL all-reduces"
        )
    if nvlink:
        return True, f"NVLink between every pair of GPUs {list(g)}: vLLM's custom all-reduce runs"
    if any(k is None for k in kinds):
        return None, (
            f"the link between some GPUs of {list(g)} is not read: vLLM decides the custom all-reduce "
            "itself (from the driver's P2P report)"
        )
    if len(g) > 2:
        return False, (
            f"GPUs {list(g)} are {len(g)} without NVLink between every pair ({', '.join(sorted(set(map(str, kinds))))}): "
            f"vLLM's custom all-reduce runs over PCIe for two GPUs only ({src}); disabled explicitly, "
            "NCCL all-reduces"
        )
    no_p2p = [f"{a}-{b}" for a, b, lk in pairs if lk is not None and lk.p2p is False]
    if no_p2p:
        return False, (
            f"GPUs {', '.join(no_p2p)} over PCIe ({kinds[0]}) without P2P (NVML P2P status): vLLM's custom "
            f"all-reduce needs P2P ({src}); --disable-custom-all-reduce, NCCL all-reduces through host memory"
        )
    if any(lk is None or lk.p2p is None for _, _, lk in pairs):
        return None, (
            f"P2P between GPUs {list(g)} not read: vLLM decides the custom all-reduce itself (from the "
            "driver's P2P report)"
        )
    return True, f"GPUs {list(g)} over PCIe ({kinds[0]}) with P2P (NVML P2P status): custom all-reduce runs"


def by_links(host: Any, inst: Any) -> tuple[bool | None, str, dict[str, Any] | None]:
    """For one planned GPU instance: :func:`custom_all_reduce` over each of its TP groups (a
    data-parallel server has one per rank), and the ``interconnect`` record render reads where it must
    be disabled (None otherwise)."""
    tp = int(inst.tensor_parallel_size)
    gpus = list(inst.gpus or ())
    groups = [gpus[i : i + tp] for i in range(0, len(gpus), tp)] or [[]]
    verdicts = [custom_all_reduce(host, grp) for grp in groups]
    off = next((v for v in verdicts if v[0] is False), None)
    if off is not None:
        record = {
            "proven": None,
            "disable_custom_all_reduce": True,
            "nccl_p2p_disable": False,
            "tp_unsafe": False,
            "link_gbs": None,
            "link_source": "datasheet",
            "vllm_p2p": None,
            "reasons": (off[1],),
            "source": LINKS_SOURCE,
        }
        return False, off[1], record
    unknown = next((v for v in verdicts if v[0] is None), None)
    return (None, unknown[1], None) if unknown is not None else (True, verdicts[0][1], None)
