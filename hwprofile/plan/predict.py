"""The performance model: TTFT, TPOT and output tokens/s of a candidate layout at a workload.

Pure (no I/O, no vLLM or torch): the inputs are the GPU's datasheet row (``hwprofile/data/gpus.yaml``:
memory bandwidth, dense BF16 tensor FLOPs, NVLink bandwidth), the host snapshot's links (NVLink
count, PCIe generation and width, P2P, PIX/PXB/PHB/NODE/SYS), the model's facts (weights, layers,
hidden size, KV bytes per token) and the plan's settings (``predict.*``, ``engine.*``,
``speculative.*``). It builds on :mod:`.estimate` (the batch-1 decode ceiling: weight bytes over
bandwidth) and adds what that ceiling leaves out:

- one step of the engine at ``T`` tokens (``b`` decoding sequences, prefill chunks riding along): the
  roofline of weight + KV bytes over achievable bandwidth against FLOPs over achievable peak, plus the
  fixed per-layer cost of small kernels, plus two all-reduces per layer over the measured interconnect;
- the steady state of a closed loop of ``concurrency`` requests split evenly over the instances: TTFT
  (the step in flight, then the prompt's chunks, then the request's latency outside the engine's
  steps: fitted, or measured by a calibration), TPOT (decode steps plus the other requests' prefills
  amortised over the output), output tokens/s (requests in flight × output / request latency);
- speculative decoding: expected tokens per step from acceptance ``a`` and ``k``
  (``(1 - a^(k+1)) / (1 - a)``), a verify step of ``b (k+1)`` tokens, and ``k`` draft steps;
- a measured calibration (``hwprofile bench`` on this host) scales the datasheet model by what the host
  measured, or replaces it where the configuration is the one measured.

Every figure carries its term and its source; the constants below name where each comes from.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import field
from typing import Any

from ..record import record, state
from .simulate import REQUEST_OVERHEAD_S, REQUEST_OVERHEAD_SOURCE, held_blocks

# Share of the datasheet memory bandwidth a decode step reaches, and of the dense tensor FLOPs a
# prefill reaches: fitted to AIConfigurator 0.12's measured vLLM kernel tables (H100 SXM, A100 SXM,
# L40S; tests/fixtures/aiconfigurator) within the ±30 % that tests/test_predict.py holds.
MEM_EFFICIENCY = 0.80
COMPUTE_EFFICIENCY = 0.60
# Per layer and step, the kernels whose time does not scale with bytes or FLOPs (norms, rotary, the
# attention launch, activation), in µs; and per step, the sampler and the scheduler (CUDA graphs on).
LAYER_FIXED_US = 12.0
STEP_FIXED_MS = 1.5
# One all-reduce by link type (latency + bytes over the link's share, with the sources' spread as its error
# band): plan/interconnect.py's COLLECTIVES. PCIe per lane and direction, GB/s (128b/130b from gen 3: 0.985,
# 1.969, 3.938, 7.877); NVLink per link and direction, NVLink 3 (A100) and NVLink 4 (H100) alike.
PCIE_LANE_GBS = {1: 0.25, 2: 0.5, 3: 0.985, 4: 1.969, 5: 3.938, 6: 7.877}
NVLINK_LINK_GBS = 25.0
ACT_BYTES = 2  # activations crossing an all-reduce: bf16/fp16
# vLLM's Triton unified attention (plan/attention.py): in a step of decodes only (one query per
# sequence, at most TRITON_3D_GRID / KV heads sequences) it splits each sequence's context into
# TRITON_SEGMENTS thread blocks per KV head; else one thread block per block of queries and KV head
# reads the whole context (triton_attn.py, triton_unified_attention.py: 0.26). One thread block reads
# at about TRITON_BLOCK_GBS, whatever the card: fitted to issue 38's 4x RTX 3090 TRITON_ATTN points
# (one KV head per GPU): decode slows by ~75 ns per context token from 8K to 128K (16 blocks: ~215 GB/s
# of the card's 936), and an MTP verify at 8K (3 queries, 2 blocks) takes ~9.5 ms longer than the
# model's split-KV step (134 MB per block).
TRITON_SEGMENTS = 16
TRITON_3D_GRID = 128
TRITON_BLOCK_GBS = 13.7
# Its 2D kernel (every step with a prompt chunk in it) gives each thread block TRITON_BLOCK_M query rows
# (16, or the query heads per KV head rounded up to a power of 2 where more: BLOCK_Q = BLOCK_M / those
# heads query positions) and walks the keys TRITON_TILE_PREFILL at a time up to the causal edge
# (triton_unified_attention.py, unchanged from 0.11 to 0.26 on CUDA but SM100). Each tile iteration
# loads its K and V through the block table, masks, updates the online softmax and runs two 16 x 32 x head
# MMAs. With a small head on a card whose tensor cores do much per clock (head 64 on an A100: 0.9 ns of
# MMA per iteration at its share) the loop, not the MMAs, sets the time: TRITON_ITER_CLOCKS SM clocks per
# iteration (:func:`_triton_prefill_ms`). Fitted to GPUStack's gpt-oss-20b 32K burst on one A100 SXM
# (validation_serving_heldout.yaml; that point then judges it no longer): its output, TTFT and TPOT all came
# out 2x fast with the chunk's attention at the GEMMs' share; the 4K and 2K bursts of the same set move the
# same way. vLLM's #18152 saw the same kernel 2.5x slower than the old prefill kernel on an A100 (8K
# prompt). With head 256 (Qwen3.8 on RTX 3090s) a step's chunk attention FLOPs take about twice the loop's
# clocks and nothing changes. Turing and Volta (always Triton) and Ada take the same constant, not fitted there.
TRITON_BLOCK_M = 16
TRITON_TILE_PREFILL = 32
TRITON_ITER_CLOCKS = 530.0


@record
class Workload:
    """A closed loop of ``concurrency`` requests of ``input_len`` prompt and ``output_len`` output tokens."""

    input_len: int
    output_len: int
    concurrency: int

    def to_json(self) -> dict[str, int]:
        return {"input_len": self.input_len, "output_len": self.output_len, "concurrency": self.concurrency}


@record
class Link:
    """The slowest path inside a tensor-parallel group."""

    kind: str  # none, nvlink, pcie_p2p, pcie_host, sys, network
    gbs: float  # usable GB/s per direction
    latency_us: float
    source: str
    # the error band of one all-reduce: latency and usable GB/s at their bounds (0: the central value)
    latency_lo_us: float = 0.0
    latency_hi_us: float = 0.0
    gbs_lo: float = 0.0
    gbs_hi: float = 0.0
    basis: str = "datasheet"  # datasheet (the link's rate x a measured share) or measured (this host's check)


@record
class Gpu:
    """What the model needs of one GPU (from the datasheet row and the snapshot)."""

    name: str
    bandwidth_gbs: float
    tflops: float | None
    memory_bytes: int
    source: str
    # the share of the datasheet reached (hwprofile/data/gpu_efficiency.yaml, by architecture)
    mem_efficiency: float = MEM_EFFICIENCY
    compute_efficiency: float = COMPUTE_EFFICIENCY
    efficiency_source: str = "default share (AIConfigurator 0.12's tables)"
    efficiency_basis: str = "fitted"
    # a device calibrated from this host's bench (:func:`calibrated_device`): the fixed time of a step
    # (None: the per-layer and scheduler constants below)
    step_fixed_ms: float | None = None
    # and a request's latency outside the engine's steps, measured (0: none measured). A datasheet
    # device (``step_fixed_ms`` None) takes plan/simulate.py's fitted REQUEST_OVERHEAD_S instead
    # (:func:`request_latency`), in the closed form as in the simulation
    request_latency_ms: float = 0.0
    # a mixture of experts' routed-expert GEMMs (vLLM's fused-MoE kernels) reach this fraction of the dense
    # GEMMs' share, per kernel kind (ModelShape.moe_kernel; "any": the architecture's median over kinds):
    # gpu_efficiency.yaml's `moe_kernels`, AIConfigurator's measured MoE tables against its dense ones.
    # Empty where no table measured the architecture: the experts at the dense share, said in moe_source
    moe_ratios: tuple[tuple[str, float], ...] = ()
    moe_source: str = "no measured MoE kernel table for this architecture: the experts at the dense share"
    # the card's streaming multiprocessors x boost clock, G SM-clocks per second (plan/gpufacts.py
    # sm_clock_ghz: the datasheet's FP16-accumulate tensor rate over its architecture's FLOPs per SM per
    # clock); what a kernel bound by its loop's clocks, not its FLOPs, runs at (:func:`_triton_prefill_ms`).
    # None: unknown (that bound then not applied)
    sm_clock_ghz: float | None = None

    def moe_ratio(self, kernel: str) -> float:
        """The routed experts' share relative to the dense one for ``kernel`` (1.0: not measured)."""
        ratios = dict(self.moe_ratios)
        return ratios.get(kernel) or ratios.get("any") or 1.0


@record
class ModelShape:
    """What the model needs of a model: bytes read and FLOPs per token, the all-reduce sizes."""

    name: str
    weights_bytes: int  # all of them (in memory)
    active_bytes: int  # read per token at batch 1 (MoE: shared + routed experts)
    active_params: int
    layers: int
    hidden: int
    heads: int
    head_dim: int
    kv_bytes_per_token: int  # all layers, the whole model (one GPU holds 1 / min(TP, kv_heads) of it)
    kv_heads: int = 1
    num_experts: int = 0
    experts_per_token: int = 0
    # a hybrid: the layers with attention over the context (0: all of them), and the recurrent
    # state one sequence holds over all its state layers (the whole model: a GPU holds 1 / TP), which
    # every decode step reads and writes back (Gated DeltaNet / Mamba: the state is updated in place)
    attn_layers: int = 0
    state_bytes: int = 0
    # a prompt token's FLOPs in the state layers beyond their projections (whole model; GDN's chunked
    # delta rule: the state's readout and update and the chunk's own causal attention): 0 where unknown
    state_prefill_flops_per_token: float = 0.0
    # the LM head (vocabulary x hidden): vLLM computes logits only for the tokens it samples (each
    # decode, a prompt's last), not for every prompt token; the input embedding when untied (a row
    # looked up per token: neither read whole nor multiplied). Both bf16 in every checkpoint format.
    lm_head_params: int = 0
    embedding_params: int = 0
    # a mixture of experts: the routed experts' parameters one token multiplies (experts_per_token
    # experts x every MoE layer), part of active_params; their FLOPs run in the fused-MoE kernels, of
    # the kind ``moe_kernel`` ("mxfp4", "bfloat16", "fp8"; "" where the checkpoint's format says none)
    expert_active_params: int = 0
    moe_kernel: str = ""
    # the attention layers by kind, where their KV is not one shape read over the whole context:
    # (layers, KV bytes per token of those layers at TP 1, their KV heads, their window in tokens or 0
    # for the whole context, their head size). A sliding-window or chunked-local layer reads and
    # attends at most its window; each kind is split over min(TP, its KV heads) ranks. Empty: every
    # layer reads ``kv_bytes_per_token`` over the whole context, split over min(TP, ``kv_heads``)
    kv_kinds: tuple[tuple[int, int, int, int, int], ...] = ()
    # the decode attention kernel (plan/attention.py): "split" (FlashAttention, FlashInfer, MLA: a
    # sequence's KV streams at the card's bandwidth) or "triton" (vLLM's Triton unified attention: a
    # fixed grid per sequence and KV head, :func:`_triton_wait_ms`)
    attention_kernel: str = "split"
    # (TP, bytes one rank's routed experts grow by there): vLLM's MXFP4 MoE kernels pad each rank's expert
    # shapes to their tile (plan/memory.py expert_padding); the padded rows are read as the experts are
    expert_padding: tuple[tuple[int, int], ...] = ()
    # how vLLM's chat endpoint renders a request (plan/servercost.py chat_renderer): "template" (the
    # model's chat template, then the tokenizer) or "harmony" (gpt-oss): the API server's CPU per request
    chat_renderer: str = "template"
    # vLLM's KV cache groups where sliding-window layers are kept apart (plan/memory.py kv_pool): each
    # group's window in tokens (0: the whole context), and the pool's blocks per block of every layer,
    # which the plan's ``kv_tokens`` counts; empty: one group of every layer
    kv_groups: tuple[int, ...] = ()
    kv_pool_scale: float = 1.0

    def kv_pool(self, kv_tokens: int, block: int = 16, drafted: bool = False) -> tuple[int, tuple[int, ...]]:
        """``(tokens, groups)`` of the KV pool the plan's ``kv_tokens`` make, as plan/simulate.py's
        Engine takes them (``kv_tokens``, ``kv_groups``). ``drafted``: a draft model's layers share the
        pool, and vLLM groups them with the target's in ways this does not model: every layer's count."""
        if not self.kv_groups or drafted:
            return kv_tokens, (0,)
        return int(kv_tokens * self.kv_pool_scale) // block * block, self.kv_groups

    def requests_in_kv(self, kv_tokens: int, tokens: int, block: int = 16, drafted: bool = False) -> int:
        """Requests of ``tokens`` tokens the pool holds at once (at least 1), in whole blocks."""
        pool, groups = self.kv_pool(kv_tokens, block, drafted)
        return max(1, pool // block // max(1, held_blocks(groups, tokens, 1, block)))


@record
class Speculation:
    method: str
    k_by_batch: tuple[tuple[int, int | None, int], ...]  # (lo, hi or None, k); empty: k always
    k: int
    acceptance: float
    draft: ModelShape | None  # draft_model only; ngram/suffix cost nothing on the GPU
    acceptance_source: str

    def k_at(self, batch: int) -> int:
        for lo, hi, k in self.k_by_batch:
            if batch >= lo and (hi is None or batch <= hi):
                return k
        return self.k


def drafted(spec: Speculation | None) -> bool:
    """A draft model runs beside the target (its layers share the KV pool: :meth:`ModelShape.kv_pool`)."""
    return spec is not None and spec.draft is not None


@record
class Candidate:
    """One way to run the model on a group of GPUs: ``instances`` × TP ``tp`` (× PP ``pp``)."""

    tp: int
    instances: int
    pp: int
    max_num_seqs: int
    max_num_batched_tokens: int
    chunked_prefill: bool
    kv_tokens: int  # per instance
    link: Link
    fits: bool = True
    why_not: str = ""

    @property
    def label(self) -> str:
        pp = f" x PP{self.pp}" if self.pp > 1 else ""
        return f"{self.instances} x TP{self.tp}{pp}"


@record
class StepCpu:
    """The engine's CPU per scheduled sequence per step (plan/servercost.py's ``step_seq_s``), serial
    with the GPU's step or overlapping it (``overlaps``: the release schedules asynchronously), as
    plan/simulate.py's Engine takes it."""

    ms_per_seq: float
    overlaps: bool

    def step(self, gpu_ms: float, seqs: int) -> float:
        cpu = self.ms_per_seq * seqs
        return max(gpu_ms, cpu) if self.overlaps else gpu_ms + cpu


@record
class Calibration:
    """What ``hwprofile bench`` measured on this host (``<root>/calibration/<fingerprint>.json``): the
    median TPOT, TTFT and output tokens/s at each concurrency, for a plan of ``instances`` × TP ``tp``."""

    path: str
    created: str | None
    input_len: int
    output_len: int
    instances: int
    tp: int | None
    points: tuple[tuple[int, float, float, float], ...]  # (concurrency, tpot_ms, ttft_ms, output tok/s)
    # the bench's engine settings where its result names them (None: as this plan has them)
    max_num_seqs: int | None = None
    max_num_batched_tokens: int | None = None
    # a request's latency outside the engine's steps at each concurrency, where the server's /metrics
    # were read: the client's mean TTFT less vLLM's queue and prefill means (median over the repeats),
    # (concurrency, ms): the client, HTTP, the API server's tokenization, the hand-over to EngineCore
    outside_latency: tuple[tuple[int, float], ...] = ()
    # the API server process's own CPU per request at each concurrency where its /metrics had it, with
    # the output tokens and the engine's steps per request (medians over the repeats):
    # (concurrency, ms, tokens, steps)
    api_cpu: tuple[tuple[int, float, float, float], ...] = ()
    # the model measured: its path or name, and the facts its steps' cost follows
    # (ModelSummary.cost_facts) as (fact, value) pairs; () where the bench names none
    model: str | None = None
    model_facts: tuple[tuple[str, Any], ...] = ()
    # the bench's speculation: ("none", 0) without, (method, k) with; None where the bench did not say
    speculation: tuple[str, int] | None = None
    # its k by the requests an instance runs, where the bench's plan set such a table; its draft (path
    # or name), where the method has one
    speculation_table: tuple[tuple[int, int | None, int], ...] = ()
    speculation_model: str | None = None
    # the mean acceptance length its bench measured with that speculation (1 + accepted / drafts, from
    # vLLM's counters: the median over the benched concurrencies), and the per-token acceptance it
    # implies (the median over those concurrencies of each one's, at the k it ran:
    # :func:`acceptance_of_length`); None where none was measured
    acceptance_length: float | None = None
    acceptance: float | None = None
    # whether a prediction takes that acceptance (False: an operator set speculative.assumed_acceptance,
    # plan._acceptance_of); the bench is modelled at it either way (candidates.as_benched)
    acceptance_applies: bool = True

    def outside_ms(self, c: int, ttft_ms: float) -> float:
        """The latency measured outside the engine at concurrency ``c`` where it is a part of
        ``ttft_ms`` (above 0, below it); else 0: none measured there, or not a part of that TTFT."""
        outside = dict(self.outside_latency).get(c, 0.0)
        return outside if 0 < outside < ttft_ms else 0.0


@state
class Prediction:
    """One candidate at one workload; ``terms``: each part of the figures with its source."""

    label: str
    tp: int
    instances: int
    ttft_ms: float
    tpot_ms: float
    output_tokens_per_s: float  # the whole group (every instance)
    per_instance_concurrency: int
    source: str  # datasheet, or calibration (file)
    terms: list[dict[str, Any]] = field(default_factory=list)
    capacity_output_tokens_per_s: float = 0.0
    capacity_concurrency: int = 0
    meets_targets: bool = True
    fits: bool = True
    why_not: str = ""
    batching: list[dict[str, Any]] = field(default_factory=list)  # the same layout at other batching
    # the part of ttft_ms outside the engine's steps (:func:`request_latency`): what a calibration
    # scaling the engine's part (:func:`calibrated`) keeps apart
    latency_ms: float = 0.0

    def to_json(self) -> dict[str, Any]:
        return {
            "layout": self.label,
            "tensor_parallel_size": self.tp,
            "instances": self.instances,
            "fits": self.fits,
            "ttft_ms": round(self.ttft_ms, 1),
            "tpot_ms": round(self.tpot_ms, 2),
            "output_tokens_per_s": round(self.output_tokens_per_s, 1),
            "capacity_output_tokens_per_s": round(self.capacity_output_tokens_per_s, 1),
            "capacity_concurrency": self.capacity_concurrency,
            "meets_targets": self.meets_targets,
            "source": self.source,
            **({"why_not": self.why_not} if self.why_not else {}),
        }


# -- the interconnect ------------------------------------------------------------------------------


def link_of(
    links: Sequence[tuple[str | None, bool | None]],
    pcie: Sequence[tuple[int | None, int | None]],
    nvlink_datasheet_gbs: float | None,
    tp: int,
    dies_interleaved: bool = False,
) -> Link:
    """The slowest path of a TP group from the snapshot: ``links`` (nvidia-smi topo kind, P2P) of
    every pair, ``pcie`` (generation, width) of every GPU, the datasheet NVLink figure (bidirectional);
    its all-reduce cost by link type from plan/interconnect.py's COLLECTIVES. ``dies_interleaved``: the
    host's CPU interleaves memory across its dies (plan/interconnect.py host_share)."""
    from .interconnect import COLLECTIVES, collective_key

    if tp <= 1:
        return Link("none", 0.0, 0.0, "one GPU: no all-reduce")
    kinds = [k or "?" for k, _ in links]
    if links and all(k.startswith("NV") for k in kinds):
        n = min(int(k[2:]) if k[2:].isdigit() else 1 for k in kinds)
        raw = n * NVLINK_LINK_GBS
        src = f"snapshot: NVLink x{n} per pair x {NVLINK_LINK_GBS:g} GB/s per link and direction"
        if nvlink_datasheet_gbs:
            raw = min(raw, nvlink_datasheet_gbs / 2)
            src += f" (datasheet {nvlink_datasheet_gbs:g} GB/s both directions)"
        return _with_collective("nvlink", raw, COLLECTIVES["nvlink"], tp, src)
    gens = [g for g, _ in pcie if g]
    widths = [w for _, w in pcie if w]
    gen, width = (min(gens) if gens else 3), (min(widths) if widths else 16)
    raw = PCIE_LANE_GBS.get(gen, 0.985) * width
    read = "snapshot" if gens and widths else "assumed (not in the snapshot)"
    src = f"{read}: PCIe gen {gen} x{width} = {raw:.1f} GB/s per direction"
    p2p = bool(links) and all(bool(p) for _, p in links)
    if any(k == "SYS" for k in kinds):
        kind = "sys"
        src += "; across the CPU sockets (SYS): halved by the socket link" + (
            "" if p2p else ", and copied through host memory (no P2P): halved again"
        )
    elif not p2p:
        kind = "pcie_host"
        src += "; no P2P: NCCL copies through host memory (halved)"
    else:
        kind = "pcie_p2p"
        src += "; P2P" if tp == 2 else "; P2P (vLLM's custom all-reduce stops at 2 GPUs on PCIe)"
    across = dies_interleaved and not p2p and any(k == "NODE" for k in kinds)
    return _with_collective(kind, raw, COLLECTIVES[collective_key(kind, tp, p2p)], tp, src, across)


def network_link(nic_gbps: float, tp: int, nic_source: str) -> Link:
    """A TP group spanning hosts: NCCL over the network at the NIC's line rate (Gb/s)."""
    from .interconnect import COLLECTIVES

    return _with_collective(
        "network", nic_gbps / 8, COLLECTIVES["network"], tp, f"{nic_source}: {nic_gbps:g} Gb/s NIC"
    )


def _with_collective(kind: str, raw_gbs: float, c: Any, tp: int, src: str, across_dies: bool = False) -> Link:
    from .interconnect import HOST_SHARE_DIES_SOURCE, HOST_SHARE_SOURCE, HOST_STEP_SOURCE, host_share

    per_gpu = c.per_gpu_us * tp + c.step_us * 2 * (tp - 1)
    share, share_lo, share_hi = host_share(c, tp, across_dies)
    eff, eff_lo, eff_hi = c.efficiency * share, c.efficiency_lo * share_lo, c.efficiency_hi * share_hi
    src += (
        f"; {c.implementation}: {c.latency_us + per_gpu:g} µs ({c.latency_lo_us + per_gpu:g}-{c.latency_hi_us + per_gpu:g})"
        f" + bytes over {eff:.0%} ({eff_lo:.0%}-{eff_hi:.0%}) of the link [{c.source}]"
    )
    if c.step_us:
        src += f"; {HOST_STEP_SOURCE}"
    if share < 1:
        why = HOST_SHARE_DIES_SOURCE if across_dies else HOST_SHARE_SOURCE
        src += f"; {tp} GPUs through host memory: x{share:.2f} (x{share_lo:.2f}-x{share_hi:.2f}), {why}"
    return Link(
        kind,
        raw_gbs * eff,
        c.latency_us + per_gpu,
        src,
        c.latency_lo_us + per_gpu,
        c.latency_hi_us + per_gpu,
        raw_gbs * eff_lo,
        raw_gbs * eff_hi,
    )


def allreduce_ms(link: Link, tp: int, message_bytes: float) -> float:
    """One ring all-reduce of ``message_bytes``: latency plus 2 (tp - 1) / tp of it over the link."""
    if tp <= 1 or link.kind == "none":
        return 0.0
    return link.latency_us / 1e3 + 2 * (tp - 1) / tp * message_bytes / (link.gbs * 1e9) * 1e3


def allreduce_band_ms(link: Link, tp: int, message_bytes: float) -> tuple[float, float]:
    """The all-reduce's error band: (fastest, slowest) over the link's latency and bandwidth bounds."""
    if tp <= 1 or link.kind == "none":
        return 0.0, 0.0
    lo = Link(link.kind, link.gbs_hi or link.gbs, link.latency_lo_us or link.latency_us, link.source)
    hi = Link(link.kind, link.gbs_lo or link.gbs, link.latency_hi_us or link.latency_us, link.source)
    return allreduce_ms(lo, tp, message_bytes), allreduce_ms(hi, tp, message_bytes)


# -- one step --------------------------------------------------------------------------------------


def _weights_read(m: ModelShape, tokens: int) -> float:
    """Weight bytes one step reads: a mixture of experts touches more experts as the batch grows."""
    if not m.num_experts or m.active_bytes >= m.weights_bytes:
        return float(m.weights_bytes)
    routed = m.weights_bytes - m.active_bytes  # the experts not read at batch 1 (approximation)
    return m.active_bytes + routed * _experts_touched(m, tokens)


def _experts_touched(m: ModelShape, tokens: int) -> float:
    """The share of a layer's routed experts one step's ``tokens`` touch (each routed to its top k)."""
    return 1 - (1 - m.experts_per_token / m.num_experts) ** max(1, tokens)


def _padding_read(m: ModelShape, tp: int, tokens: int) -> float:
    """The MXFP4 tile padding one rank reads in a step: the padded rows of the experts it touches."""
    pad = next((b for t, b in m.expert_padding if t == tp), 0)
    if not pad or not m.num_experts:
        return 0.0
    # the active experts unknown, every expert is read (as _weights_read reads them), its padding too
    return pad * _experts_touched(m, tokens) if m.active_bytes < m.weights_bytes else float(pad)


def _attention_reads(
    m: ModelShape,
    tp: int,
    decode: int,
    seqs: int,
    context: float,
    prefill: int,
    prefill_context: float,
    prefill_kv: float,
) -> tuple[float, float]:
    """``(KV bytes one GPU reads, attention FLOPs on it)`` in a step of ``decode`` query tokens of
    ``seqs`` sequences at ``context`` tokens (a verify step: several queries per sequence, its KV read
    once for them) and a ``prefill`` chunk attending ``prefill_context`` (its KV read once:
    ``prefill_kv`` tokens). Per attention kind (:attr:`ModelShape.kv_kinds`): a windowed layer reads
    and attends at most its window (a chunk: its window and the chunk itself)."""
    if not m.kv_kinds:
        kv = (seqs * context + prefill_kv) * m.kv_bytes_per_token / max(1, min(tp, m.kv_heads))
        attn = m.attn_layers or m.layers
        return kv, 4 * attn * m.heads * m.head_dim * (decode * context + prefill * prefill_context) / tp
    kv = flops = 0.0
    for layers, nbytes, heads, window, head_dim in m.kv_kinds:
        ctx, pctx, pkv = context, prefill_context, prefill_kv
        if window:
            ctx, pctx, pkv = min(ctx, window), min(pctx, window), min(pkv, window + prefill)
        kv += (seqs * ctx + pkv) * nbytes / max(1, min(tp, heads))
        flops += 4 * layers * m.heads * head_dim * (decode * ctx + prefill * pctx) / tp
    return kv, flops


def _head_bytes(m: ModelShape, context: float) -> float:
    """One sequence's KV of one KV head at ``context`` tokens, every attention layer (a windowed kind:
    its window)."""
    if not m.kv_kinds:
        return context * m.kv_bytes_per_token / max(1, m.kv_heads)
    return sum(
        min(context, w) * n / max(1, h) if w else context * n / max(1, h) for _, n, h, w, _ in m.kv_kinds
    )


def _triton_wait_ms(
    gpu: Gpu, m: ModelShape, tp: int, seqs: int, queries: int, context: float, prefill: int
) -> float:
    """The time vLLM's Triton unified attention adds to a step over streaming the decoding sequences'
    KV at the card's bandwidth (0 for a split-KV kernel): its longest thread block reads one
    sequence's context of one KV head, in TRITON_SEGMENTS parts in a step of decodes only (the 3D
    kernel), whole otherwise, at TRITON_BLOCK_GBS. Many sequences fill the card: then the stream."""
    if m.attention_kernel != "triton" or seqs <= 0 or context <= 0:
        return 0.0
    heads = max(1, m.kv_heads // max(1, min(tp, m.kv_heads)))  # KV heads on one GPU
    one = _head_bytes(m, context)
    three_d = queries <= 1 and not prefill and seqs <= TRITON_3D_GRID // heads
    block_ms = one / (TRITON_SEGMENTS if three_d else 1) / (TRITON_BLOCK_GBS * 1e9) * 1e3
    stream_ms = seqs * heads * one / (gpu.bandwidth_gbs * 1e9 * gpu.mem_efficiency) * 1e3
    return max(0.0, block_ms - stream_ms)


def _triton_prefill_ms(gpu: Gpu, m: ModelShape, tp: int, prefill: int, prefill_context: float) -> float:
    """The time vLLM's Triton 2D kernel takes over a prompt chunk's queries when bound by its loop's
    clocks: per attention kind, the chunk's query blocks (BLOCK_Q positions each) x the KV heads on one
    GPU x the tiles up to each block's causal edge (a windowed kind: its window), at TRITON_ITER_CLOCKS SM
    clocks each over the card's SM clocks. 0 where the kernel is not Triton, the step has no chunk or the
    card's SM clocks are unknown. The step takes the larger of this and the chunk's attention FLOPs at the
    card's share (:func:`_step_ms`)."""
    if m.attention_kernel != "triton" or prefill <= 0 or not gpu.sm_clock_ghz:
        return 0.0
    kinds = m.kv_kinds or ((m.attn_layers or m.layers, 0, m.kv_heads, 0, m.head_dim),)
    iterations = 0.0
    for layers, _, heads, window, _ in kinds:
        on_gpu = max(1, heads // max(1, min(tp, heads)))  # KV heads on one rank (TP > heads: 1 each)
        per_kv = max(1, max(1, m.heads // tp) // on_gpu)  # one rank's query heads per KV head, as vLLM has it
        block_m = TRITON_BLOCK_M if per_kv <= TRITON_BLOCK_M else 1 << (per_kv - 1).bit_length()
        block_q = max(1, block_m // per_kv)
        ctx = min(prefill_context, window) if window else prefill_context
        iterations += layers * math.ceil(prefill / block_q) * on_gpu * (ctx / TRITON_TILE_PREFILL + 0.5)
    return iterations * TRITON_ITER_CLOCKS / (gpu.sm_clock_ghz * 1e9) * 1e3


def step_ms(
    gpu: Gpu,
    m: ModelShape,
    tp: int,
    link: Link,
    decode: int,
    context: float,
    prefill: int = 0,
    prefill_context: float = 0.0,
    scheduler: bool = True,
    queries: int = 1,
) -> dict[str, float]:
    """One engine step's parts (:func:`_step_ms`), a dict of the caller's own; ``queries``: the query
    tokens of each decoding sequence (a speculative verify: k + 1; ``decode`` counts them all)."""
    return dict(_step_ms(gpu, m, tp, link, decode, context, prefill, prefill_context, scheduler, queries))


_Steps = dict[tuple[Any, ...], dict[str, float]]  # one record set's steps, by their other arguments


class _StepMemo:
    """A pure step function's results, each computed once. A plan's search predicts a few hundred
    (candidate, batch) pairs and each asks for the same few steps (~2,000 calls, ~200 different at 8
    GPUs), always with the same handful of Gpu, ModelShape and Link records: those are looked up by
    identity (each record hashed by its values once, not at every call), the record objects held so
    that their ids stay theirs; equal records share their steps. ``cache_clear`` empties it."""

    LIMIT = 4096  # steps (and record sets) held at most, as the lru_cache before it: then it starts afresh

    def __init__(self, fn: Callable[..., dict[str, float]]) -> None:
        self.fn = fn
        self.by_id: dict[tuple[int, int, int], tuple[Gpu, ModelShape, Link, _Steps]] = {}
        self.by_value: dict[tuple[Gpu, ModelShape, Link], _Steps] = {}
        self.size = 0  # steps held

    def cache_clear(self) -> None:
        self.by_id.clear()
        self.by_value.clear()
        self.size = 0

    def __call__(self, gpu: Gpu, m: ModelShape, tp: int, link: Link, *rest: Any) -> dict[str, float]:
        ids = (id(gpu), id(m), id(link))
        held = self.by_id.get(ids)
        if held is None:
            if len(self.by_id) >= self.LIMIT:
                self.cache_clear()
            held = self.by_id[ids] = (gpu, m, link, self.by_value.setdefault((gpu, m, link), {}))
        steps = held[3]
        key = (tp, *rest)
        found = steps.get(key)
        if found is None:
            if self.size >= self.LIMIT:
                for each in self.by_value.values():
                    each.clear()
                self.size = 0
            found = steps[key] = self.fn(gpu, m, tp, link, *rest)
            self.size += 1
        return found


@_StepMemo
def _step_ms(
    gpu: Gpu,
    m: ModelShape,
    tp: int,
    link: Link,
    decode: int,
    context: float,
    prefill: int,
    prefill_context: float,
    scheduler: bool,
    queries: int = 1,
) -> dict[str, float]:
    """One engine step on one instance: ``decode`` query tokens (``queries`` per sequence) at mean
    ``context`` tokens, plus a ``prefill`` chunk (its own tokens attending ``prefill_context`` tokens on
    average); a draft's proposal steps (``scheduler`` False) ride in the target's step and pay no
    scheduler time.

    Each decoding sequence reads its own KV; a prompt chunk reads the KV it attends once for the whole
    chunk (FlashAttention streams each KV tile past a block of queries; the other query blocks' re-reads
    hit L2): the cache before the chunk and the chunk itself, ``prefill_context + prefill / 2`` tokens
    (the chunk's tokens attend ``prefill_context`` on average, causally). Its FLOPs still grow with
    tokens x context (the compute term)."""
    tokens = decode + prefill
    weights = max(0.0, _weights_read(m, tokens) - 2 * m.embedding_params) / tp + _padding_read(m, tp, tokens)
    prefill_kv = prefill_context + prefill / 2 if prefill and prefill_context else 0.0
    seqs = -(-decode // max(1, queries))
    kv, attn_flops = _attention_reads(m, tp, decode, seqs, context, prefill, prefill_context, prefill_kv)
    wait = _triton_wait_ms(gpu, m, tp, seqs, queries, context, prefill)
    # each running sequence's recurrent state, read and written once per step (a prefill chunk: once)
    state = 2 * (decode + (1 if prefill else 0)) * m.state_bytes / tp
    mem = (weights + kv + state) / (gpu.bandwidth_gbs * 1e9 * gpu.mem_efficiency) * 1e3
    logits = decode + (1 if prefill else 0)  # the sampled rows: the LM head runs on these only
    body = max(0, m.active_params - m.lm_head_params - m.embedding_params - m.expert_active_params)
    flops = (
        2 * body * tokens + 2 * m.lm_head_params * logits + m.state_prefill_flops_per_token * prefill
    ) / tp
    flops += attn_flops
    # the routed experts' GEMMs at their own kernels' rate (Gpu.moe_ratio of the dense share)
    if m.expert_active_params:
        flops += 2 * m.expert_active_params * tokens / tp / gpu.moe_ratio(m.moe_kernel)
    comp, loop = _compute_ms(gpu, m, tp, flops, prefill, prefill_context)
    comm, comm_lo, comm_hi, gather = _collectives_ms(m, tp, link, tokens, logits)
    if gpu.step_fixed_ms is not None:
        fixed = gpu.step_fixed_ms if scheduler else gpu.step_fixed_ms * m.layers / max(1, m.layers + 8)
    else:
        fixed = m.layers * LAYER_FIXED_US / 1e3 + (STEP_FIXED_MS if scheduler else 0.0)
    state_ms = state / (gpu.bandwidth_gbs * 1e9 * gpu.mem_efficiency) * 1e3
    return {
        "memory_ms": mem,
        "compute_ms": comp,
        "allreduce_ms": comm,
        "fixed_ms": fixed,
        "state_ms": state_ms,
        "allreduce_lo_ms": comm_lo,
        "allreduce_hi_ms": comm_hi,
        "gather_ms": gather,
        "attention_wait_ms": wait,
        "attention_loop_ms": loop,
        "total_ms": max(mem, comp) + comm + gather + fixed + wait,
    }


def _compute_ms(
    gpu: Gpu, m: ModelShape, tp: int, flops: float, prefill: int, prefill_context: float
) -> tuple[float, float]:
    """A step's ``flops`` at the card's share of its tensor rate, and Triton's prefill loop
    (:func:`_triton_prefill_ms`) where it outlasts the chunk's attention FLOPs: (compute ms, loop ms)."""
    rate = (gpu.tflops or 0) * 1e12 * gpu.compute_efficiency
    comp = flops / rate * 1e3 if rate else 0.0
    loop = _triton_prefill_ms(gpu, m, tp, prefill, prefill_context)
    if loop and rate:
        chunk_attn = _attention_reads(m, tp, 0, 0, 0.0, prefill, prefill_context, 0.0)[1] / rate * 1e3
        comp += max(0.0, loop - chunk_attn)
    return comp, loop


def _collectives_ms(m: ModelShape, tp: int, link: Link, tokens: int, logits: int) -> tuple[float, ...]:
    """A step's collectives: its 2 all-reduces per layer of ``tokens`` x hidden (central, fastest,
    slowest), and the ``logits`` sampled rows gathered from the vocabulary-parallel LM head (vLLM's
    LogitsProcessor: an all-gather of rows x vocab / TP per rank, in the model's dtype; a ring all-gather
    moves half an all-reduce's bytes in half its steps). The gather grows with the batch: a large
    vocabulary through host memory costs a running sequence beside its 2 x layers all-reduces."""
    message = tokens * m.hidden * ACT_BYTES
    comm = 2 * m.layers * allreduce_ms(link, tp, message)
    lo, hi = (2 * m.layers * x for x in allreduce_band_ms(link, tp, message))
    vocab = m.lm_head_params // max(1, m.hidden)
    gather = allreduce_ms(link, tp, logits * vocab * ACT_BYTES) / 2 if vocab else 0.0
    return comm, lo, hi, gather


def _flops_source(gpu: Gpu, m: ModelShape) -> str:
    """Where a step's FLOPs rate comes from: the dense share, and a mixture of experts' routed experts'."""
    text = f"{gpu.source}: {gpu.tflops or '?'} dense TFLOPs x {gpu.compute_efficiency:.0%} ({gpu.efficiency_source})"
    if m.expert_active_params:
        ratio = gpu.moe_ratio(m.moe_kernel)
        text += (
            f"; routed experts ({m.expert_active_params / 1e9:.2f} B params per token, {m.moe_kernel or 'unknown'}"
            f" kernels) at x{ratio:g} of that ({gpu.moe_source})"
        )
    return text


# -- the workload ----------------------------------------------------------------------------------


def predict(
    gpu: Gpu,
    m: ModelShape,
    cand: Candidate,
    wl: Workload,
    spec: Speculation | None,
    per_instance: int | None = None,
    wave: bool = True,
    step_cpu: StepCpu | None = None,
    explain: bool = True,
) -> Prediction:
    """The candidate's TTFT, TPOT and output tokens/s at ``wl`` (or at ``per_instance`` requests in
    flight on each instance), from the datasheet; ``wave``: with the term of those requests sent together
    (:func:`wave_decode_rates`; a search over many candidates leaves it out: it changes no figure it ranks);
    ``step_cpu``: the engine's CPU per scheduled sequence in the wave's steps (plan/servercost.py);
    ``explain``: False leaves every term out (:func:`capacity` reads the figures alone)."""
    c = per_instance if per_instance is not None else max(1, math.ceil(wl.concurrency / cand.instances))
    kv_seqs = m.requests_in_kv(cand.kv_tokens, wl.input_len + wl.output_len, drafted=drafted(spec))
    b = max(1, min(c, cand.max_num_seqs, kv_seqs))  # running; the rest wait for a slot
    ctx = wl.input_len + wl.output_len / 2
    link = cand.link
    dec = step_ms(gpu, m, cand.tp, link, b, ctx)
    t_dec = dec["total_ms"]
    terms = _decode_terms(gpu, m, cand, dec, b) if explain else []
    # The prompt: chunks of what the step budget leaves beside the other b - 1 requests' decodes (one step
    # without chunking); the request being prefilled decodes nothing yet.
    budget = max(1, cand.max_num_batched_tokens - (b - 1)) if cand.chunked_prefill else wl.input_len
    chunks = max(1, math.ceil(wl.input_len / budget))
    chunk = math.ceil(wl.input_len / chunks)
    pre = step_ms(gpu, m, cand.tp, link, b - 1 if b > 1 else 0, ctx, chunk, wl.input_len / 2)
    t_prefill = chunks * pre["total_ms"]
    extra = max(0.0, t_prefill - chunks * (t_dec if b > 1 else 0.0))  # what the prompt adds to its steps
    if explain:
        terms.append(_prefill_term(gpu, m, chunks, chunk, t_prefill))
    # TPOT: a decode step, with each speculative step's tokens, plus the other b - 1 requests' prefills.
    per_token = (
        t_dec if spec is None else _speculated(gpu, m, cand, spec, b, ctx, t_dec, terms if explain else None)
    )
    # the other running requests' prompts stall this one's steps (its own prompt is in its TTFT)
    tpot = per_token + (b - 1) * extra / max(1, wl.output_len)
    # TTFT: half the step in flight (where other requests run: alone, a request finds the engine idle),
    # the prompt, and any wait for a free slot.
    ttft = (t_dec / 2 if b > 1 else 0.0) + t_prefill
    latency = ttft + (wl.output_len - 1) * tpot
    if c > b:
        queue_ms = (c - b) / b * latency
        ttft += queue_ms
        if explain:
            terms.append(_queue_term(c, b, queue_ms))
    away, *said = request_latency(gpu)  # outside the engine's steps
    ttft += away
    if explain and away:
        terms.append(_latency_term(away, *said))
    latency = ttft + (wl.output_len - 1) * tpot
    tps = cand.instances * c * wl.output_len / (latency / 1e3)
    if explain and wave and c > 1 and wl.output_len > 1:
        terms.append(_wave_term(gpu, m, cand, wl, c, per_token if spec is not None else None, step_cpu))
    return Prediction(
        cand.label, cand.tp, cand.instances, ttft, tpot, tps, c, "datasheet", terms, latency_ms=away
    )


def request_latency(gpu: Gpu) -> tuple[float, str, str]:
    """A request's latency outside the engine's steps (the client, HTTP, the API server's rendering and
    tokenization, the hand-over to EngineCore), in ms, with its source and basis: a calibrated device's
    measured one (0 where its bench left none), a datasheet device's the fitted constant the simulation
    takes too (plan/simulate.py REQUEST_OVERHEAD_S: issue 32's low-load TTFT 20-45 ms above the steps)."""
    if gpu.step_fixed_ms is not None:
        return gpu.request_latency_ms, gpu.source, gpu.efficiency_basis
    return REQUEST_OVERHEAD_S * 1e3, REQUEST_OVERHEAD_SOURCE, "fitted"


LATENCY_TERM = "the request's latency outside the engine's steps"


def _latency_term(ms: float, source: str, basis: str) -> dict[str, Any]:
    """The latency per request outside the engine's steps (:func:`request_latency`)."""
    return {
        "term": f"{LATENCY_TERM} (client, HTTP, API server)",
        "ms": round(ms, 3),
        "source": source,
        "basis": basis,
    }


def _queue_term(c: int, b: int, queue_ms: float) -> dict[str, Any]:
    """The wait for a free slot: ``c`` requests in flight, ``b`` of them running."""
    return {
        "term": f"queue: {c} requests, {b} run at once",
        "ms": round(queue_ms, 1),
        "source": "max_num_seqs and the KV cache",
    }


def _prefill_term(gpu: Gpu, m: ModelShape, chunks: int, chunk: int, t_prefill: float) -> dict[str, Any]:
    """The prompt's term: its chunks at the roofline (with a hybrid's state layers' own FLOPs, and
    Triton's attention loop where it outlasts the chunk's attention FLOPs)."""
    pre_src = "the same roofline at the chunk's tokens (FLOPs bound)"
    if m.state_prefill_flops_per_token:
        pre_src += (
            f"; the state layers' own {m.state_prefill_flops_per_token / 1e9:.2f} GFLOPs per prompt token "
            "(GDN's chunked delta rule) included"
        )
    if m.attention_kernel == "triton":
        pre_src += (
            f"; vLLM's Triton attention over the chunk at the larger of its FLOPs and its loop: "
            f"{TRITON_ITER_CLOCKS:g} SM clocks per {TRITON_TILE_PREFILL}-key tile of a block of query rows (fitted to a gpt-oss-20b "
            "32K burst on an A100) over "
            + (
                f"{gpu.sm_clock_ghz:.0f} G SM-clocks/s (the datasheet's FP16-accumulate rate over the "
                "architecture's FLOPs per SM per clock)"
                if gpu.sm_clock_ghz
                else "an unknown SM clock rate: the loop not costed"
            )
        )
    return {
        "term": f"prefill: {chunks} chunk(s) of {chunk} tokens",
        "ms": round(t_prefill, 3),
        "source": pre_src,
    }


def _decode_terms(
    gpu: Gpu, m: ModelShape, cand: Candidate, dec: dict[str, float], b: int
) -> list[dict[str, Any]]:
    """The decode step's terms (:func:`step_ms`'s parts), each with its source and basis."""
    link = cand.link
    terms: list[dict[str, Any]] = [
        {
            "term": "decode step: weights + KV over bandwidth",
            "ms": round(dec["memory_ms"], 3),
            "source": f"{gpu.source}: {gpu.bandwidth_gbs:g} GB/s x {gpu.mem_efficiency:.0%} ({gpu.efficiency_source}); model: "
            f"{m.weights_bytes / 1e9:.1f} GB weights / TP {cand.tp}, {m.kv_bytes_per_token} B KV per token",
            "basis": gpu.efficiency_basis,
        },
        {
            "term": "decode step: FLOPs over peak",
            "ms": round(dec["compute_ms"], 3),
            "source": _flops_source(gpu, m),
            "basis": gpu.efficiency_basis,
        },
        {
            "term": "decode step: 2 all-reduces per layer",
            "ms": round(dec["allreduce_ms"], 3),
            "source": link.source,
            "basis": link.basis,
            "band_ms": [round(dec["allreduce_lo_ms"], 3), round(dec["allreduce_hi_ms"], 3)],
        },
        {
            "term": "decode step: fixed kernels and scheduler",
            "ms": round(dec["fixed_ms"], 3),
            "source": (
                f"{m.layers} layers x {LAYER_FIXED_US:g} µs + {STEP_FIXED_MS:g} ms (fitted to AIConfigurator's tables)"
                if gpu.step_fixed_ms is None
                else gpu.efficiency_source
            ),
            "basis": "fitted" if gpu.step_fixed_ms is None else gpu.efficiency_basis,
        },
    ]
    if cand.tp > 1:  # the logits gathered from the ranks (one rank: nothing to gather)
        terms.insert(
            3,
            {
                "term": f"decode step: the logits of {b} sequence(s) gathered from the TP ranks",
                "ms": round(dec["gather_ms"], 3),
                "source": f"{m.lm_head_params // max(1, m.hidden):,} vocabulary rows x 2 bytes per sampled "
                f"row, an all-gather over the all-reduce's link (half its bytes and steps)",
                "basis": link.basis,
            },
        )
    if dec["attention_wait_ms"]:
        terms.append(_triton_term(dec["attention_wait_ms"], b))
    if m.state_bytes:
        terms.insert(
            1,
            {
                "term": f"decode step: recurrent state of {b} sequence(s) read and written (in the memory term)",
                "ms": round(dec["state_ms"], 3),
                "source": f"{m.state_bytes / 2**20:.1f} MiB of state per sequence / TP {cand.tp}, twice per step",
            },
        )
    return terms


def _triton_term(ms: float, b: int) -> dict[str, Any]:
    """The decode step's Triton attention term (:func:`_triton_wait_ms`)."""
    return {
        "term": f"decode step: Triton attention's fixed grid at {b} sequence(s)",
        "ms": round(ms, 3),
        "source": f"vLLM's Triton unified attention: one sequence's context of one KV head read by "
        f"{TRITON_SEGMENTS} thread blocks in a step of decodes only (1 otherwise) at ~{TRITON_BLOCK_GBS:g} "
        "GB/s each, beyond the card's stream (fitted to issue 38's 4x RTX 3090 TRITON_ATTN points)",
        "basis": "fitted",
    }


def _speculated(
    gpu: Gpu,
    m: ModelShape,
    cand: Candidate,
    spec: Speculation,
    b: int,
    ctx: float,
    t_dec: float,
    terms: list[dict[str, Any]] | None,
) -> float:
    """The time per token with speculation at batch ``b`` (its term appended to ``terms``, unless
    None); ``t_dec`` where it proposes nothing there."""
    link = cand.link
    per_token = t_dec
    k = spec.k_at(b)
    if k > 0:
        a = spec.acceptance
        expected = (1 - a ** (k + 1)) / (1 - a) if a < 1 else k + 1
        verify = step_ms(gpu, m, cand.tp, link, b * (k + 1), ctx, queries=k + 1)["total_ms"]
        draft = 0.0
        if spec.draft is not None and spec.method == "mtp":
            # MTP: k proposal passes, each its own forward as vLLM's proposer loop runs them (the first
            # over the b (k + 1) verified positions, then one token per sequence) with its own
            # launches, LM head and sampling over the whole vocabulary and attention metadata rebuilt
            # for the next position: each pays a step's fixed cost. Read against issue 38's MTP
            # points (4x3090, k=2); a separate draft model keeps the cost below until points of its own
            first = step_ms(gpu, spec.draft, cand.tp, link, b * (k + 1), ctx, queries=k + 1)["total_ms"]
            draft = first + (k - 1) * step_ms(gpu, spec.draft, cand.tp, link, b, ctx)["total_ms"]
        elif spec.draft is not None:
            draft = k * step_ms(gpu, spec.draft, cand.tp, link, b, ctx, scheduler=False)["total_ms"]
        per_token = (verify + draft) / expected
        if terms is None:
            return per_token
        terms.append(
            {
                "term": f"speculation: k={k} at batch {b}, {expected:.2f} tokens per step",
                "ms": round(per_token, 3),
                "source": f"{spec.method}: acceptance {a} ({spec.acceptance_source}); verify "
                f"{verify:.2f} ms + draft {draft:.2f} ms per step"
                + (
                    f" ({k} proposal passes, each with a step's fixed cost)"
                    if spec.method == "mtp" and spec.draft is not None
                    else ""
                ),
            }
        )
    return per_token


def _wave_term(
    gpu: Gpu,
    m: ModelShape,
    cand: Candidate,
    wl: Workload,
    c: int,
    per: float | None,
    step_cpu: StepCpu | None,
) -> dict[str, Any]:
    """The term of ``c`` requests sent together: the sum of their own decode rates, with its band."""
    rates = wave_decode_rates(gpu, m, cand, wl, c, per, step_cpu)
    total = sum(rates)
    lo, hi = wave_band(gpu, m, cand, wl, c, per, step_cpu)
    return {
        "term": f"wave: {len(rates)} requests sent together, the sum of their own decode rates "
        f"{total:.1f} tok/s (the first {rates[0]:.1f}, the last {rates[-1]:.1f})",
        "ms": round(1e3 * len(rates) / total, 3) if total else 0.0,
        "tok_s": round(total, 2),
        "band_tok_s": [round(min(lo, total), 2), round(max(hi, total), 2)],
        "source": "vLLM's scheduler: running requests first, the prompts behind fill the step budget; "
        "each request decodes a token per step while they prefill (its decode window "
        "holds those steps); the band: the same wave with prompts "
        f"{WAVE_LEN_SPREAD:.0%} shorter and longer (whether a prompt fills the step budget decides "
        "if the next-to-last request's window holds a prompt step)",
    }


def wave_decode_rates(
    gpu: Gpu,
    m: ModelShape,
    cand: Candidate,
    wl: Workload,
    n: int,
    per_token_ms: float | None = None,
    step_cpu: StepCpu | None = None,
) -> list[float]:
    """Each request's own decode rate (tokens after its first / the time from its first token to its
    last, tok/s) when ``n`` requests of ``wl`` reach one instance together, as vLLM's scheduler runs them:
    every step serves the running requests first (a decode token each) and fills what the step budget
    leaves with the waiting prompts, first come first served. A request that has its first token keeps
    decoding one token per step while the prompts behind it are prefilled, so its decode window holds
    those long steps: the early requests of a wave decode far slower than the last one, whose window is
    decode steps alone. ``per_token_ms``: a decode step's time per token where it is not one plain
    decode step (speculation); else :func:`step_ms` at the batch running. ``step_cpu``: the engine's CPU
    per scheduled sequence, added to each step or overlapping it (None: the GPU's step alone)."""
    n, cpu = max(1, min(n, cand.max_num_seqs)), step_cpu or StepCpu(0.0, True)
    out = wl.output_len
    budget = cand.max_num_batched_tokens
    if not cand.chunked_prefill:
        budget = max(budget, wl.input_len)
    left = [wl.input_len] * n  # prompt tokens still to prefill
    first: list[float | None] = [None] * n
    made = [0] * n  # tokens generated
    ended: list[float | None] = [None] * n
    now = 0.0

    def dec_ms(batch: int) -> float:
        if per_token_ms is not None:
            return per_token_ms
        return step_ms(gpu, m, cand.tp, cand.link, batch, wl.input_len + out / 2)["total_ms"]

    while any(x > 0 for x in left):  # the prefill phase: a step per chunk, decodes riding along
        decoding = [i for i in range(n) if first[i] is not None and ended[i] is None]
        chunks = _wave_chunks(left, budget - len(decoding), cand.chunked_prefill)
        tokens = sum(t for _, t in chunks)
        ctx = wl.input_len + out / 2
        gpu_ms = step_ms(gpu, m, cand.tp, cand.link, len(decoding), ctx, tokens, wl.input_len / 2)["total_ms"]
        now += cpu.step(gpu_ms, len(decoding) + len(chunks))
        for i in decoding:
            made[i] += 1
            if made[i] >= out:
                ended[i] = now
        for i, t in chunks:
            left[i] -= t
            if left[i] == 0:
                first[i], made[i] = now, 1
                if out <= 1:
                    ended[i] = now
    while any(e is None for e in ended):  # then decode steps alone, the batch shrinking as requests end
        live = [i for i in range(n) if ended[i] is None]
        steps = min(out - made[i] for i in live)
        now += steps * cpu.step(dec_ms(len(live)), len(live))
        for i in live:
            made[i] += steps
            if made[i] >= out:
                ended[i] = now
    return _wave_rates(first, ended, out)


# A wave's prompts are not exact to the token (the chat template, the tokenizer): the band of the wave's
# summed decode rate spans prompts this much shorter and longer than the workload's.
WAVE_LEN_SPREAD = 0.01


def wave_band(
    gpu: Gpu,
    m: ModelShape,
    cand: Candidate,
    wl: Workload,
    n: int,
    per_token_ms: float | None = None,
    step_cpu: StepCpu | None = None,
) -> tuple[float, float]:
    """The (lowest, highest) summed decode rate of :func:`wave_decode_rates` over prompts
    ``WAVE_LEN_SPREAD`` shorter and longer than ``wl``'s (and ``wl``'s own). The sum is dominated by the
    requests whose windows hold no full prompt step, and which those are hinges on whether a prompt
    fills the step budget: at ``input_len`` = ``max_num_batched_tokens`` each prompt's tail shares a step
    with the next prompt's chunk, so the next-to-last request's window holds only the last prompt's
    short tail and it decodes as fast as the last one; a prompt a few tokens shorter fits beside the
    decodes, the next prompt's long chunk follows in that window, and the sum drops by about a third
    (issue 38's 4x3090 waves of 8192-token prompts at a budget of 8192: x0.63-0.71).
    Identical prompts to the token are an artefact of the workload's description, not of a run."""
    d = max(1, round(wl.input_len * WAVE_LEN_SPREAD))
    sums = [
        sum(
            wave_decode_rates(
                gpu, m, cand, Workload(max(1, wl.input_len + k), wl.output_len, n), n, per_token_ms, step_cpu
            )
        )
        for k in (-d, 0, d)
    ]
    return min(sums), max(sums)


def _wave_chunks(left: list[int], room: int, chunked_prefill: bool) -> list[tuple[int, int]]:
    """The prompt chunks (request, tokens) of one wave step: the waiting prompts first come first served
    in the ``room`` the decodes leave in the step budget, the last one cut with chunked prefill."""
    chunks: list[tuple[int, int]] = []
    for i in range(len(left)):
        if room <= 0:
            break
        if left[i] > 0:
            take = min(left[i], room) if chunked_prefill else left[i]
            if take > room:
                break
            chunks.append((i, take))
            room -= take
    return chunks


def _wave_rates(first: list[float | None], ended: list[float | None], out: int) -> list[float]:
    """Each request's own decode rate (tok/s) from its first and last token times (ms)."""
    rates = []
    for f, e in zip(first, ended, strict=True):
        if f is not None and e is not None and out > 1 and e > f:
            rates.append((out - 1) / ((e - f) / 1e3))
    return rates


def capacity(
    gpu: Gpu,
    m: ModelShape,
    cand: Candidate,
    wl: Workload,
    spec: Speculation | None,
    ttft_target_ms: float,
    tpot_target_ms: float,
) -> tuple[float, int]:
    """The most output tokens/s the candidate sustains within both targets, and at what host
    concurrency: each instance's requests in flight raised in powers of two up to ``max_num_seqs``."""
    best, at = 0.0, 0
    c = 1
    while True:
        p = predict(gpu, m, cand, wl, spec, per_instance=c, wave=False, explain=False)
        if p.ttft_ms <= ttft_target_ms and p.tpot_ms <= tpot_target_ms and p.output_tokens_per_s > best:
            best, at = p.output_tokens_per_s, c * cand.instances
        if c >= cand.max_num_seqs:
            break
        c = min(c * 2, cand.max_num_seqs)
    return best, at


# -- calibration -----------------------------------------------------------------------------------


def acceptance_of_length(length: float, k: int) -> float:
    """The per-token acceptance ``a`` whose expected tokens per step at ``k`` proposals,
    (1 - a^(k+1)) / (1 - a) as :func:`_speculated` takes them, is ``length`` (vLLM's mean acceptance
    length: 1 + accepted / drafts), within 1e-6; ``length`` clipped to [1, k + 1]."""
    want = min(max(length, 1.0), k + 1.0)
    lo, hi = 0.0, 0.999
    for _ in range(40):
        a = (lo + hi) / 2
        if (1 - a ** (k + 1)) / (1 - a) < want:
            lo = a
        else:
            hi = a
    return round((lo + hi) / 2, 6)


# -- the choice ------------------------------------------------------------------------------------


# output tokens/s within which two predicted capacities count as equal (the prediction's resolution: a
# band around the best, not fixed bins, which would split 364.9 from 365.1); the batching's too
CAPACITY_TIE = 10.0


def target_miss(ttft_ms: float, tpot_ms: float, targets: tuple[float, float]) -> float:
    """How far figures at the workload are from the targets (TTFT, TPOT): the larger of TTFT / its
    target and TPOT / its target (at most 1 within both). Where nothing meets the targets at any load,
    the layout (:func:`choose`), the batching and the draft take the candidate where it is least."""
    return max(ttft_ms / targets[0], tpot_ms / targets[1])


def choose(
    preds: Sequence[Prediction], objective: str, ttft_target_ms: float, tpot_target_ms: float
) -> tuple[int, str]:
    """The index of the winning prediction and why. ``throughput``: the highest capacity within the
    targets, capacities within :data:`CAPACITY_TIE` of it counting as equal (ties: the lower TPOT at the
    workload, then the higher capacity); ``latency``: the lowest TPOT at the workload, then TTFT.
    Candidates that do not fit never win; when none meets the targets at any load, the one closest to
    them at the workload (:func:`target_miss` the least), then the lower TPOT."""
    ok = [i for i, p in enumerate(preds) if p.fits]
    if not ok:
        return -1, "no candidate fits"
    if objective == "latency":
        i = min(ok, key=lambda j: (round(preds[j].tpot_ms, 3), preds[j].ttft_ms))
        return i, (
            f"objective latency: {preds[i].label} has the lowest predicted TPOT "
            f"({preds[i].tpot_ms:.1f} ms, TTFT {preds[i].ttft_ms:.0f} ms)"
        )
    within = [j for j in ok if preds[j].capacity_output_tokens_per_s > 0]
    if not within:

        def miss(j: int) -> float:
            return target_miss(preds[j].ttft_ms, preds[j].tpot_ms, (ttft_target_ms, tpot_target_ms))

        i = min(ok, key=lambda j: (round(miss(j), 2), preds[j].tpot_ms, preds[j].ttft_ms))
        return i, (
            f"objective throughput: no candidate meets TTFT <= {ttft_target_ms:g} ms and TPOT <= "
            f"{tpot_target_ms:g} ms at any load; {preds[i].label} comes closest at the workload (TTFT "
            f"{preds[i].ttft_ms:.0f} ms, TPOT {preds[i].tpot_ms:.1f} ms: {miss(i):.1f}x the farther target)"
        )
    top = preds[max(within, key=lambda j: preds[j].capacity_output_tokens_per_s)]
    best = top.capacity_output_tokens_per_s
    tied = [j for j in within if preds[j].capacity_output_tokens_per_s >= best - CAPACITY_TIE]
    i = min(tied, key=lambda j: (preds[j].tpot_ms, -preds[j].capacity_output_tokens_per_s))
    most = preds[i].capacity_output_tokens_per_s >= best
    tie = (
        ""
        if most
        else f" (within {CAPACITY_TIE:g} of {top.label}'s {best:.0f}, at a lower TPOT: "
        f"{preds[i].tpot_ms:.1f} ms against {top.tpot_ms:.1f})"
    )
    return i, (
        f"objective throughput: {preds[i].label} sustains {'the most' if most else 'as much'}, "
        f"{preds[i].capacity_output_tokens_per_s:.0f} output tok/s at {preds[i].capacity_concurrency} "
        f"requests within TTFT <= {ttft_target_ms:g} ms and TPOT <= {tpot_target_ms:g} ms{tie}"
    )


# -- hook: the scheduler simulation (plan/simulate.py, issue 32) -----------------------------------


def step_cost(
    gpu: Gpu, m: ModelShape, cand: Candidate, spec: Speculation | None = None
) -> Callable[[int, int, float, float], float]:
    """:func:`step_ms` as plan/simulate.py's per-step cost: (prefill tokens, decode sequences, their mean
    context, the prefill tokens' mean attended context) → seconds of one step of one instance.

    The prompt chunk's KV is read once per chunk and its attention FLOPs counted over the attention
    layers, both in :func:`step_ms` itself (the analytic path and the simulation share one step). With
    ``spec``, the simulation's step makes one token per decoding sequence as before, so its decode part
    costs a speculative step per token (:func:`_speculated`: verify and draft over the expected tokens
    at that batch) in place of a plain decode step."""

    def cost(prefill_tokens: int, decode_seqs: int, decode_context: float, prefill_context: float) -> float:
        ms = step_ms(gpu, m, cand.tp, cand.link, decode_seqs, decode_context, prefill_tokens, prefill_context)
        total = ms["total_ms"]
        if spec is not None and decode_seqs > 0:
            plain = step_ms(gpu, m, cand.tp, cand.link, decode_seqs, decode_context)["total_ms"]
            total += _speculated(gpu, m, cand, spec, decode_seqs, decode_context, plain, None) - plain
        return total / 1e3

    return cost
