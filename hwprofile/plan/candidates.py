"""Candidates: every way the layout could split a group of GPUs (each tensor-parallel size the model's
heads allow, as separate servers or one data-parallel server: the model predicts them alike), each
predicted at the workload by :mod:`.predict` from the datasheet, the snapshot's links and the model;
the winner by ``layout.objective``; and each planned instance's own prediction.

Pure: the datasheet row comes from :mod:`.gpufacts`, the calibration (``hwprofile bench`` results)
is handed in by the pipeline, which reads it.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import math
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, NamedTuple

from ..config.settings import Settings
from ..host.snapshot import Gpu, HostSnapshot
from ..model import ModelFacts
from ..release import release_of
from . import attention, gpufacts
from . import predict as pm
from .batching import batching_rows, runs_at
from .calibration import calibrated, calibrated_device
from .engine import cuda_total, fit_args, hybrid_opts, kv_cache_dtype, state_seqs
from .estimate import acceptance_for
from .memory import (
    Fit,
    HybridOpts,
    active_weights_bytes,
    attention_bytes_by_kind,
    expert_padding,
    fit,
    is_hybrid,
    kv_bytes_per_token,
    kv_pool,
    sequence_bytes,
    state_bytes_per_layer,
)
from .servercost import chat_renderer
from .types import InstancePlan, InstancePrediction

if TYPE_CHECKING:
    from .interconnect import Report
    from .servercost import ServerCosts
    from .simulate import Arrivals, Engine


def host_fingerprint(host: HostSnapshot) -> str:
    """The name of this host's calibration file: 16 hex digits of a hash of its GPUs (UUIDs where
    known, else model, memory and bus id) and, without any GPU UUID, its hostname."""
    gpus = sorted(host.usable_gpus, key=lambda g: g.index)
    if gpus and all(g.uuid for g in gpus):
        text = "|".join(sorted(str(g.uuid) for g in gpus))
    else:
        text = (
            (host.hostname or "?")
            + "|"
            + "|".join(f"{g.name}/{g.memory_total_bytes}/{g.pci_bus_id}" for g in gpus)
        )
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def workload(settings: Settings) -> pm.Workload:
    lay = settings.layout
    return pm.Workload(lay.workload_input_len, lay.workload_output_len, lay.workload_concurrency)


def _bench_share(settings: Settings, wl: pm.Workload, instances: int) -> int:
    """The requests one instance gets of what `hwprofile bench` sends: bench.num_prompts (at least the
    concurrency) to the whole layout, split evenly; the simulated figures are those its bench measures."""
    return -(-max(settings.bench.num_prompts, wl.concurrency) // max(1, instances))


# the chunked gated delta rule's chunk (vLLM 0.32 mamba/ops/gdn_chunk_cutedsl: chunk_size = 64; FLA's)
GDN_CHUNK = 64


def gdn_prefill_flops_per_token(model: ModelFacts) -> float:
    """A prompt token's FLOPs in the GDN layers beyond their projections, the whole model: per value
    head, the chunked delta rule's state readout, update and WY correction (~6 dk dv) and the chunk's
    own causal attention (~4 C (dk + dv), C = 64). 0 for a model without GDN layers (other state
    kinds: not modelled). Qwen3.8-27B: ~0.4 GFLOPs, under 1 % of its 2 x 27 B per token."""
    st = model.stack.state if model.stack is not None else None
    if st is None or st.kind != "gdn" or not st.num_heads:
        return 0.0
    dk, dv = st.head_k_dim or st.head_dim, st.head_dim
    per_head = 6 * dk * dv + 4 * GDN_CHUNK * (dk + dv)
    return float(st.num_heads * per_head * model.stack.count("gdn"))


def model_shape(
    model: ModelFacts, kv_dtype_bytes: int, ssm_dtype: str = "auto", attention_kernel: str = "split"
) -> pm.ModelShape:
    attn, state, state_flops = 0, 0, 0.0
    if is_hybrid(model):
        attn = len(model.stack.attention_layers())
        state = state_bytes_per_layer(model, 1, 0, ssm_dtype) * model.stack.state_layers
        state_flops = gdn_prefill_flops_per_token(model)
    return pm.ModelShape(
        name=model.name,
        weights_bytes=model.weights_bytes,
        active_bytes=active_weights_bytes(model),
        active_params=model.active_params or model.params,
        layers=model.num_layers,
        hidden=model.hidden_size,
        heads=model.num_heads,
        head_dim=model.head_dim,
        kv_bytes_per_token=kv_bytes_per_token(model, 1, kv_dtype_bytes),
        kv_heads=max(1, model.num_kv_heads),
        num_experts=model.num_experts,
        experts_per_token=model.experts_per_token,
        attn_layers=attn,
        state_bytes=state,
        state_prefill_flops_per_token=state_flops,
        lm_head_params=model.vocab_size * model.hidden_size,
        embedding_params=0 if model.tie_word_embeddings else model.vocab_size * model.hidden_size,
        expert_active_params=expert_active_params(model),
        moe_kernel=moe_kernel(model),
        kv_kinds=kv_kinds(model, kv_dtype_bytes),
        attention_kernel=attention_kernel,
        expert_padding=padding_by_tp(model),
        chat_renderer=chat_renderer(model.model_type),
        **_kv_pool_fields(model, kv_dtype_bytes),
    )


def _kv_pool_fields(model: ModelFacts, kv_dtype_bytes: int) -> dict[str, Any]:
    """:attr:`~.predict.ModelShape.kv_groups` and ``kv_pool_scale`` (plan/memory.py kv_pool)."""
    pool = kv_pool(model, kv_dtype_bytes)
    return {} if pool is None else {"kv_groups": pool.windows, "kv_pool_scale": pool.scale}


def padding_by_tp(model: ModelFacts) -> tuple[tuple[int, int], ...]:
    """(TP, bytes one rank's MXFP4 experts grow by) at every degree up to 64 that splits the experts
    (vLLM asserts it does), where there is padding."""
    if not model.mxfp4_expert_bytes or model.moe_intermediate_size <= 0:
        return ()
    degrees = (t for t in range(1, 65) if model.moe_intermediate_size % t == 0)
    return tuple((t, b) for t in degrees if (b := expert_padding(model, t)))


def kv_kinds(model: ModelFacts, kv_dtype_bytes: int) -> tuple[tuple[int, int, int, int, int], ...]:
    """The attention layers by kind for the step cost (:attr:`hwprofile.plan.predict.ModelShape.kv_kinds`),
    where one shape over the whole context would misprice them: sliding-window or chunked-local
    layers (they read their window), kinds of different KV heads or head sizes (MiMo-V2, Gemma 4),
    layers reading another layer's KV (Gemma-3n: they hold none, but read it). Empty for a model whose
    attention layers are all one full-context shape, each with its own KV."""
    st = model.stack
    if st is None:
        return ()
    by_kind = attention_bytes_by_kind(model, 1, kv_dtype_bytes)
    shapes = {(st.attention[k].num_kv_heads, st.attention[k].head_dim) for k in by_kind}
    windowed = any(st.attention[k].window for k in by_kind if k in ("sliding", "chunked"))
    if not windowed and len(shapes) <= 1 and not st.kv_shared:
        return ()
    out = []
    for kind, (_, b) in by_kind.items():
        a = st.attention[kind]
        window = a.window if kind in ("sliding", "chunked") and a.window else 0
        # every layer of the kind reads: those that reuse an earlier layer's KV (Gemma-3n) too
        n = st.count(kind)
        out.append((n, n * b, a.num_kv_heads, window, a.head_dim))
    return tuple(out)


def expert_active_params(model: ModelFacts) -> int:
    """The routed experts' parameters one token multiplies, every MoE layer together: the
    ``params - active_params`` experts not routed are ``num_experts - experts_per_token`` per layer, so
    the routed ones are that x ``experts_per_token / (num_experts - experts_per_token)``
    (hwprofile.model.arch.read_arch). 0 for a dense model or where the counts do not say."""
    e, k = model.num_experts, model.experts_per_token
    if not e or not k or e <= k or not model.active_params or model.active_params >= model.params:
        return 0
    return (model.params - model.active_params) * k // (e - k)


def moe_kernel(model: ModelFacts) -> str:
    """The kind of vLLM fused-MoE kernel a mixture of experts runs, by its checkpoint's format (the keys
    of gpu_efficiency.yaml's ``moe_kernels``): "mxfp4" (gpt-oss), "fp8", "bfloat16" (unquantized); ""
    for a dense model or another format (the architecture's median over kinds applies)."""
    if not model.num_experts:
        return ""
    q = (model.quant_method or "").lower()
    if "mxfp4" in q:
        return "mxfp4"
    if "fp8" in q:
        return "fp8"
    if not q and model.bits >= 16:
        return "bfloat16"
    return ""


def mtp_draft_shape(model: ModelFacts, kv_dtype_bytes: int) -> pm.ModelShape | None:
    """The MTP head as a draft: each proposal runs its layer(s) and the LM head over the whole
    vocabulary (the target's, shared: bf16 in the checkpoints people serve), reading both."""
    if not model.mtp_layers or not model.mtp_bytes:
        return None
    head = model.vocab_size * model.hidden_size * 2
    # an MTP layer is a full-attention (or MLA) layer: its KV as one of the model's own
    by_kind = attention_bytes_by_kind(model, 1, kv_dtype_bytes) if model.stack is not None else {}
    full = by_kind.get("mla") or by_kind.get("full")
    attn_kv = full[1] if full else 2 * model.num_kv_heads * model.head_dim * kv_dtype_bytes
    return pm.ModelShape(
        name=f"{model.name} MTP head",
        weights_bytes=model.mtp_bytes + head,
        active_bytes=model.mtp_bytes + head,
        active_params=(model.mtp_bytes + head) // 2,
        layers=model.mtp_layers,
        hidden=model.hidden_size,
        heads=model.num_heads,
        head_dim=model.head_dim,
        kv_bytes_per_token=attn_kv * model.mtp_layers,
        kv_heads=max(1, model.num_kv_heads),
    )


def gpu_of(gpu: Gpu) -> tuple[pm.Gpu | None, dict[str, Any] | None]:
    row = gpufacts.lookup(gpu.name, gpu.memory_total_gib)
    if not row or not row.get("memory_bandwidth_gbs"):
        return None, row
    eff = gpufacts.efficiency(row.get("architecture"), gpufacts.segment(row))
    g = pm.Gpu(
        str(row["name"]),
        float(row["memory_bandwidth_gbs"]),
        float(row["fp16_bf16_tensor_tflops_dense"]) if row.get("fp16_bf16_tensor_tflops_dense") else None,
        gpu.memory_total_bytes or 0,
        f"hwprofile/data/gpus.yaml ({row['name']})",
        float(eff["memory"]),
        float(eff["compute"]),
        f"hwprofile/data/gpu_efficiency.yaml {eff['key']}: {eff['source']}",
        str(eff["basis"]),
        sm_clock_ghz=gpufacts.sm_clock_ghz(row),
    )
    moe = gpufacts.moe_kernels(row.get("architecture"))
    if moe is not None:
        ratios = tuple((str(k), float(v["ratio"])) for k, v in (moe.get("ratios") or {}).items())
        src = f"hwprofile/data/gpu_efficiency.yaml moe_kernels {moe['key']}: {moe.get('source', '')}"
        g = dataclasses.replace(g, moe_ratios=ratios, moe_source=src)
    return g, row


def link_for(
    host: HostSnapshot,
    gpus: Sequence[Gpu],
    tp: int,
    row: Mapping[str, Any] | None,
    measured: Report | None = None,
) -> pm.Link:
    """The slowest path inside the first TP group of ``gpus`` (as the snapshot has it); its bandwidth
    the one measured where ``measured`` (the host's current interconnect record,
    :class:`~.interconnect.Report`) covers that group (:func:`.interconnect.link_source`)."""
    from .interconnect import link_source, memory_across_dies

    grp = list(gpus)[:tp]
    pairs: list[tuple[str | None, bool | None]] = []
    links = host.links()
    for i, a in enumerate(grp):
        for b in grp[i + 1 :]:
            lk = links.get((a.index, b.index))
            pairs.append((lk.link, lk.p2p) if lk else (None, None))
    pcie = [(g.pcie.gen, g.pcie.width) for g in grp]
    link = pm.link_of(
        pairs, pcie, (row or {}).get("nvlink_bandwidth_gbs"), tp, memory_across_dies(host.cpu.model)
    )
    return link_source(link, measured, [g.index for g in grp]) if len(grp) == tp else link


def speculation(
    settings: Settings,
    method: str | None,
    draft: ModelFacts | None,
    kv_bytes: int,
    model: ModelFacts | None = None,
    cal: pm.Calibration | None = None,
) -> pm.Speculation | None:
    if not method or method == "none":
        return None
    s = settings.speculative
    d = model_shape(draft, kv_bytes) if (draft is not None and method == "draft_model") else None
    if method == "mtp" and model is not None:
        d = mtp_draft_shape(model, kv_bytes)
    a, source = acceptance_for(settings, method, (draft.path, draft.name) if draft is not None else (), cal)
    return pm.Speculation(method, tuple(s.by_batch_size or ()), s.num_speculative_tokens, a, d, source)


def _calibrate(
    preds: list[pm.Prediction],
    gpu: pm.Gpu,
    shape: pm.ModelShape,
    cands: list[pm.Candidate],
    wl: pm.Workload,
    specs: list[tuple[pm.Speculation | None, ModelFacts | None]],
    cal: pm.Calibration | None,
    default_tp: int,
) -> list[pm.Prediction]:
    """Each prediction from the measurement where there is one (the measured configuration's TP:
    ``cal.tp``, else the TP the rules give without a prediction), each candidate's with its own
    speculation and draft (``specs``) set against the bench (:func:`as_benched`)."""
    if cal is None or not cal.points:
        return preds
    tp = cal.tp or default_tp
    at_tp = [i for i, c in enumerate(cands) if c.tp == tp]
    if not at_tp:
        return preds
    c0 = min(cal.points, key=lambda x: (abs(x[0] - wl.concurrency), x[0]))[0]
    out = []
    for p, c, (spec, draft) in zip(preds, cands, specs, strict=True):
        benched = as_benched(cal, cands[at_tp[0]], spec, wl, _names(draft)) if c.fits else None
        if not c.fits or benched is None:  # a bench this candidate's speculation is not: the datasheet's
            out.append(_not_benched(p, cal, spec) if c.fits else p)
            continue
        bench, bench_spec, same = benched
        at = pm.predict(gpu, shape, bench, pm.Workload(cal.input_len, cal.output_len, c0), bench_spec)
        out.append(calibrated(p, at, cal, wl, same_config=(c.tp == tp and same)))
    return out


def _names(draft: ModelFacts | None) -> tuple[str | None, ...]:
    """How a bench may have named ``draft``: its path and its name (none: no draft)."""
    return (draft.path, draft.name) if draft is not None else ()


def running(concurrency: int, instances: int, max_num_seqs: int | None) -> int:
    """The requests one instance runs at once with ``concurrency`` in flight over ``instances``, at most
    ``max_num_seqs`` (the rest wait): the batch a k table is read at, as the model takes it
    (:func:`.predict.predict`)."""
    b = max(1, math.ceil(concurrency / max(1, instances)))
    return min(b, max_num_seqs) if max_num_seqs else b


def _not_benched(p: pm.Prediction, cal: pm.Calibration, spec: pm.Speculation | None) -> pm.Prediction:
    """``p`` as the datasheet has it, with a term saying why ``cal`` is not applied: its bench speculated
    by another method than this candidate (:func:`as_benched`)."""
    ran = cal.speculation[0] if cal.speculation else "?"
    why = (
        f"calibration not applied: its bench speculated by {ran}, this candidate "
        + (f"by {spec.method}" if spec is not None else "not at all")
        + "; bench this configuration (`hwprofile bench --calibrate`) to calibrate it"
    )
    return dataclasses.replace(p, terms=[*p.terms, {"term": why, "ms": 0.0, "source": cal.path}])


def as_benched(
    cal: pm.Calibration,
    cand: pm.Candidate,
    spec: pm.Speculation | None,
    wl: pm.Workload,
    drafted: Sequence[str | None] = (),
) -> tuple[pm.Candidate, pm.Speculation | None, bool] | None:
    """The configuration ``cal``'s bench ran, as the model takes it: ``cand`` (at the bench's TP) with
    the bench's batching, and its speculation: none, or ``spec``'s method (with the draft ``drafted``
    names) at the bench's k (its k table where it ran one) and the acceptance it measured; where the
    bench did not record one, ``cand``'s and ``spec``'s. With whether that is ``cand`` and ``spec`` at
    ``wl`` (then what the bench measured is this candidate's own figure there). None where the bench
    speculated by another method or draft than ``spec``'s: a step of that speculation is not one this
    candidate models, so the measurement cannot be set against it here."""
    seqs = cal.max_num_seqs or cand.max_num_seqs
    batched = cal.max_num_batched_tokens or cand.max_num_batched_tokens
    bench = dataclasses.replace(cand, max_num_seqs=seqs, max_num_batched_tokens=batched)
    same = (seqs, batched) == (cand.max_num_seqs, cand.max_num_batched_tokens)
    if cal.speculation is None:
        return bench, spec, same
    method, k = cal.speculation
    if method == "none":
        return bench, None, same and spec is None
    if spec is None or spec.method != method:
        return None
    if cal.speculation_model is not None and cal.speculation_model not in drafted:
        return None
    a = cal.acceptance if cal.acceptance is not None else spec.acceptance
    at_k = dataclasses.replace(spec, k_by_batch=cal.speculation_table, k=k, acceptance=a)
    same = same and spec.acceptance == a
    if cal.speculation_table:  # the bench ran a k table: the plan's own where it runs the same one
        return bench, at_k, same and (spec.k_by_batch, spec.k) == (cal.speculation_table, k)
    return bench, at_k, same and spec.k_at(running(wl.concurrency, cand.instances, cand.max_num_seqs)) == k


@dataclasses.dataclass(frozen=True)
class _Fitter:
    """``model``'s memory fit on ``gpu0`` (the group's smallest GPU) with its KV bytes and settings, at
    a TP with or without a draft, at the configured batching or another; ``hybrid``: a hybrid model's
    options, whose recurrent state caps the sequences (None: a model without state)."""

    gpu0: Gpu
    model: ModelFacts
    kv_bytes: int
    settings: Settings
    hybrid: HybridOpts | None
    vllm_version: str | None
    kernel_packages: tuple[str, ...] | None = None

    def fit_at(self, d: ModelFacts | None, tp: int, batched: int | None, seqs: int | None) -> Fit:
        """The memory fit (with the draft ``d``) at ``tp``, at the configured batching or the one given."""
        eng = self.settings.engine
        return fit(
            cuda_total(self.gpu0),
            eng.gpu_memory_utilization,
            self.model,
            d,
            tp,
            self.kv_bytes,
            batched or eng.max_num_batched_tokens,
            seqs or eng.max_num_seqs,
            **fit_args(self.settings, eng.enforce_eager, self.vllm_version, self.kernel_packages),
        )

    def fits(
        self, d: ModelFacts | None, tp: int, batched: int | None = None, seqs: int | None = None
    ) -> tuple[bool, int]:
        """Whether the model (with the draft ``d``) fits at ``tp`` with room for ``engine.min_model_len``
        tokens, and the KV tokens it holds (at other batching where given)."""
        f = self.fit_at(d, tp, batched, seqs)
        room = sequence_bytes(self.model, d, tp, self.model.dtype_bytes, self.settings.engine.min_model_len)
        return f.fits and f.kv_cache_bytes >= room, f.kv_tokens

    def state_seqs(
        self, d: ModelFacts | None, tp: int, batched: int | None = None, seqs: int | None = None
    ) -> int | None:
        """The sequences whose recurrent state fits the pool at ``tp`` (at other batching where given),
        where ``seqs`` (else ``max_num_seqs``) are asked: None where the model does not fit (or has no
        state)."""
        asked = seqs or self.settings.engine.max_num_seqs
        f = self.fit_at(d, tp, batched, asked)
        if self.hybrid is None or not f.fits:
            return None
        return state_seqs(
            self.model,
            self.hybrid,
            f.kv_cache_bytes,
            tp,
            self.kv_bytes,
            self.settings,
            self.vllm_version,
            asked,
        )


class _Tried(NamedTuple):
    """One TP as the layout would try it: the candidate, its speculation, the draft it runs, and
    whether an instance would run it (it fits, or fits once it drops the draft)."""

    cand: pm.Candidate
    spec: pm.Speculation | None
    draft: ModelFacts | None
    runs: bool


def _tried(
    host: HostSnapshot,
    settings: Settings,
    tp: int,
    parts: list[list[Gpu]],
    d: ModelFacts | None,
    fits: Callable[..., tuple[bool, int]],
    why: str,
    link: tuple[Mapping[str, Any] | None, Report | None],
    spec: tuple[str | None, int, ModelFacts, pm.Calibration | None],
    cap: Callable[..., int | None] | None = None,
) -> _Tried:
    """The candidate at ``tp`` over ``parts``; ``why``: why it is not allowed (empty: allowed);
    ``link``: the GPU's row and the interconnect record; ``spec``: the method, KV bytes, model and the
    host's calibration (its measured acceptance: :func:`acceptance_for`);
    ``cap``: a hybrid's sequences whose state fits (the candidate runs at most those)."""
    eng, lay = settings.engine, settings.layout
    spec_method, kv_bytes, model, cal = spec
    ok, kv_tokens = fits(d, tp)
    d_tp, only_without = d, False
    if not ok and d is not None:  # predicted as the instance would run (ngram), but not a layout that fits
        only_without, kv_tokens = fits(None, tp)
        d_tp = None if only_without else d
    method = spec_method if d_tp is not None or spec_method != "draft_model" else "ngram"
    speculated = speculation(settings, method, d_tp, kv_bytes, model, cal)
    if isinstance(lay.replicas, int) or lay.strategy == "single":
        parts = parts[: 1 if lay.strategy == "single" else int(lay.replicas)]
    if not parts:
        why = why or f"not enough GPUs for a TP={tp} group"
    elif only_without:
        why = (
            why
            or "fits only without the draft (an instance would drop it for ngram), as the layout rule counts it"
        )
    elif not ok:
        why = why or f"does not fit: {eng.min_model_len} tokens of context need more than the KV space left"
    batched = max(eng.max_num_batched_tokens, eng.max_num_seqs)
    # as the instance would run it: a hybrid's max_num_seqs at most the sequences whose state fits
    runs = ok or only_without
    seqs, _ = runs_at(eng.max_num_seqs, batched, functools.partial(cap, d_tp, tp) if cap and runs else None)
    cand = pm.Candidate(
        tp,
        max(1, len(parts)),
        1,
        seqs,
        batched,
        eng.enable_chunked_prefill,
        max(0, kv_tokens),
        link_for(host, parts[0] if parts else [], tp, link[0], link[1]),
        fits=not why,
        why_not=why,
    )
    return _Tried(cand, speculated, d_tp, bool(parts) and runs)


def _predicted(
    pgpu: pm.Gpu,
    shape: pm.ModelShape,
    t: _Tried,
    wl: pm.Workload,
    settings: Settings,
    fits: Callable[..., tuple[bool, int]],
    cap: Callable[..., int | None] | None = None,
) -> pm.Prediction:
    """The prediction of the tried candidate ``t``, with its capacity within the targets (where it fits)
    and its batching rows (where an instance would run it; ``cap``: a hybrid's sequences whose state
    fits, :meth:`_Fitter.state_seqs`)."""
    lay, c, spec = settings.layout, t.cand, t.spec
    p = pm.predict(pgpu, shape, c, wl, spec)
    p.fits, p.why_not = c.fits, c.why_not
    if c.fits:
        p.capacity_output_tokens_per_s, p.capacity_concurrency = pm.capacity(
            pgpu, shape, c, wl, spec, lay.ttft_target_ms, lay.tpot_target_ms
        )
    p.meets_targets = p.ttft_ms <= lay.ttft_target_ms and p.tpot_ms <= lay.tpot_target_ms
    if (
        t.runs
    ):  # as the instance would run: a rule may still take it (the layout choice never does unless it fits)
        p.batching = batching_rows(
            pgpu,
            shape,
            c,
            wl,
            spec,
            settings,
            functools.partial(fits, t.draft, c.tp),
            functools.partial(cap, t.draft, c.tp) if cap is not None else None,
        )
    return p


def predict_group(
    host: HostSnapshot,
    parts_by_tp: Mapping[int, list[list[Gpu]]],
    model: ModelFacts,
    draft: ModelFacts | None,
    spec_method: str | None,
    settings: Settings,
    allowed: Mapping[int, str],
    calibration: pm.Calibration | None,
    default_tp: int,
    interconnect: Report | None = None,
) -> list[pm.Prediction]:
    """One prediction per TP of ``parts_by_tp`` (its instances' GPU groups); ``allowed``: TP → why it
    is not allowed (empty: allowed). Empty where the GPU has no bandwidth figure. ``interconnect``: the
    host's current interconnect record (its measured link bandwidth replaces the datasheet's)."""
    any_parts = next((p for p in parts_by_tp.values() if p), None)
    if not any_parts:
        return []
    gpu0 = min(any_parts[0], key=cuda_total)
    pgpu, row = gpu_of(gpu0)
    if pgpu is None:
        return []
    kv_name, kv_bytes, _ = kv_cache_dtype(settings.engine.kv_cache_dtype, gpu0, model)
    flag = release_of(host.software.vllm_version).has("--attention-backend")
    e = settings.engine
    att = attention.of_instance(e.attention_backend, gpu0.compute_capability, kv_name, model, flag, e.dtype)
    shape = model_shape(model, kv_bytes, attention_kernel=att.kernel)
    wl = workload(settings)
    version = host.software.vllm_version
    hybrid = hybrid_opts(model, settings, spec_method, version, gpu0)
    fitter = _Fitter(gpu0, model, kv_bytes, settings, hybrid, version, host.software.kernel_packages)
    fits = fitter.fits
    cap = fitter.state_seqs if hybrid is not None else None
    # With the draft, as the layout rule fits it; only where no TP fits the draft, without it (the
    # instance then drops it: plan/speculative.py).
    d = draft if draft is not None and any(fits(draft, t)[0] for t in parts_by_tp) else None
    tried = [
        _tried(
            host,
            settings,
            tp,
            parts,
            d,
            fits,
            allowed.get(tp, ""),
            (row, interconnect),
            (spec_method, kv_bytes, model, calibration),
            cap,
        )
        for tp, parts in sorted(parts_by_tp.items())
    ]
    preds = [_predicted(pgpu, shape, t, wl, settings, fits, cap) for t in tried]
    cands = [t.cand for t in tried]
    specs_drafts = [(t.spec, t.draft) for t in tried]
    return _calibrate(preds, pgpu, shape, cands, wl, specs_drafts, calibration, default_tp)


def record(
    store: list[dict[str, Any]],
    gpus: Sequence[Gpu],
    preds: list[pm.Prediction],
    chosen_tp: int,
    how: str,
    predicted_tp: int | None,
    why: str,
    batching_pick: int = -1,
    batching_why: str = "",
) -> None:
    """One group's candidates into the plan's ``prediction.groups`` (JSON-shaped, tuples for lists);
    ``batching_pick``: the batching row the objective took (-1: the configured one stayed)."""
    rows = next((p.batching for p in preds if p.tp == chosen_tp), [])
    rows = [
        b | {"chosen": (i == batching_pick) if batching_pick >= 0 else b["planned"]}
        for i, b in enumerate(rows)
    ]
    store.append(
        {
            "gpus": tuple(g.index for g in gpus),
            "gpu_name": gpus[0].name if gpus else None,
            "candidates": tuple(p.to_json() | {"chosen": p.tp == chosen_tp} for p in preds),
            "chosen": next((p.label for p in preds if p.tp == chosen_tp), f"TP{chosen_tp}"),
            "chosen_by": how,  # "prediction" or "rule"
            "predicted_best": next((p.label for p in preds if p.tp == predicted_tp), None),
            "reason": why,
            "batching": tuple(rows),
            "batching_chosen_by": "prediction" if batching_pick >= 0 else "configured",
            "batching_reason": batching_why,
        }
    )


def _instance_speculation(
    inst: InstancePlan,
    model: ModelFacts,
    draft: ModelFacts | None,
    settings: Settings,
    kv_bytes: int,
    cal: pm.Calibration | None = None,
) -> pm.Speculation | None:
    """The instance's speculative config as the prediction takes it (None: no speculation)."""
    if inst.speculative is None:
        return None
    sp = inst.speculative
    table = tuple(sp.num_speculative_tokens_per_batch_size or ())
    d = model_shape(draft, kv_bytes) if (draft is not None and sp.method == "draft_model") else None
    if sp.method == "mtp":
        d = mtp_draft_shape(model, kv_bytes)
    drafted = (sp.model, *((draft.path, draft.name) if draft is not None else ()))
    a, source = acceptance_for(settings, sp.method, drafted, cal)
    return pm.Speculation(sp.method, table, sp.num_speculative_tokens, a, d, source)


def _calibrated_at(
    host: HostSnapshot,
    p: pm.Prediction,
    pgpu: pm.Gpu,
    shape: pm.ModelShape,
    cand: pm.Candidate,
    wl: pm.Workload,
    spec: pm.Speculation | None,
    calibration: pm.Calibration,
    link: tuple[int, Mapping[str, Any] | None, Report | None],
    drafted: Sequence[str | None] = (),
) -> pm.Prediction:
    """``p`` calibrated by the benchmark's points: the prediction at the benchmark's own TP and nearest
    concurrency against what it measured. ``link``: the rule's TP, the GPU's row, the interconnect record;
    ``drafted``: how the instance's draft is named (:func:`as_benched`)."""
    rule_tp, row, interconnect = link
    btp = calibration.tp or rule_tp
    c0 = min(calibration.points, key=lambda x: (abs(x[0] - wl.concurrency), x[0]))[0]
    tp_cand = (
        cand
        if btp == cand.tp
        else pm.Candidate(
            btp,
            max(1, len(host.usable_gpus) // btp),
            1,
            cand.max_num_seqs,
            cand.max_num_batched_tokens,
            cand.chunked_prefill,
            cand.kv_tokens,
            link_for(host, host.usable_gpus, btp, row, interconnect),
        )
    )
    benched = as_benched(calibration, tp_cand, spec, wl, drafted)
    if benched is None:  # its speculation is not one this plan can model: the datasheet's figures
        return _not_benched(p, calibration, spec)
    bench, bench_spec, same = benched
    at = pm.predict(
        pgpu, shape, bench, pm.Workload(calibration.input_len, calibration.output_len, c0), bench_spec
    )
    return calibrated(p, at, calibration, wl, same_config=(btp == cand.tp and same))


def _instance_shape(inst: InstancePlan, model: ModelFacts, gpu0: Gpu, tp: int) -> tuple[int, pm.ModelShape]:
    """The KV dtype's bytes and the model's shape as this instance runs it (its state dtype, the attention
    backend vLLM picks on ``gpu0``)."""
    kv_bytes = max(1, inst.memory.kv_bytes_per_token_target // max(1, kv_bytes_per_token(model, tp, 1)))
    ssm = inst.engine.mamba_ssm_cache_dtype if isinstance(inst.engine.mamba_ssm_cache_dtype, str) else "auto"
    asked = inst.engine.attention_backend if isinstance(inst.engine.attention_backend, str) else "auto"
    att = attention.of_instance(
        asked, gpu0.compute_capability, inst.engine.kv_cache_dtype, model, dtype=inst.engine.dtype
    )
    return kv_bytes, model_shape(model, kv_bytes, ssm, att.kernel)


def instance_prediction(
    host: HostSnapshot,
    inst: InstancePlan,
    instances: int,
    model: ModelFacts,
    draft: ModelFacts | None,
    settings: Settings,
    calibration: pm.Calibration | None,
    rule_tp: int,
    interconnect: Report | None = None,
) -> InstancePrediction | None:
    """This instance's figures with its own engine settings (each rank gets its share of the workload);
    ``interconnect`` as :func:`predict_group` takes it."""
    if inst.device == "cpu":
        return cpu_prediction(inst, instances, model, settings, calibration, host)
    gpus = [g for g in host.usable_gpus if g.index in inst.gpus]
    if not gpus or inst.device != "cuda":
        return None
    gpu0 = min(gpus, key=cuda_total)
    pgpu, row = gpu_of(gpu0)
    if pgpu is None:
        return None
    tp, ranks = inst.tensor_parallel_size, inst.ranks
    kv_bytes, shape = _instance_shape(inst, model, gpu0, tp)
    wl = workload(settings)
    spec = _instance_speculation(inst, model, draft, settings, kv_bytes, calibration)
    total = instances  # every rank of every instance shares the workload
    cand = pm.Candidate(
        tp,
        total,
        inst.pipeline_parallel_size,
        inst.engine.max_num_seqs,
        inst.engine.max_num_batched_tokens,
        inst.engine.enable_chunked_prefill,
        inst.memory.kv_tokens,
        link_for(host, gpus, tp, row, interconnect),
    )
    p = pm.predict(pgpu, shape, cand, wl, spec, step_cpu=step_cpu_of(host))
    if calibration is not None and calibration.points:
        drafted = (inst.speculative.model if inst.speculative else None, *_names(draft))
        link = (rule_tp, row, interconnect)
        p = _calibrated_at(host, p, pgpu, shape, cand, wl, spec, calibration, link, drafted)
    per = p.output_tokens_per_s / total * ranks
    bench_share = _bench_share(settings, wl, total)
    return InstancePrediction(
        workload=wl.to_json(),
        concurrency=p.per_instance_concurrency * ranks,
        ttft_ms=round(p.ttft_ms, 1),
        tpot_ms=round(p.tpot_ms, 2),
        output_tokens_per_s=round(per, 1),
        source=p.source,
        terms=tuple({k: v for k, v in t.items()} for t in p.terms),
        simulated=simulated_figures(
            pgpu, shape, cand, wl, p.per_instance_concurrency, host=host, spec=spec, requests=bench_share
        ),
    )


def step_cpu_of(host: HostSnapshot) -> pm.StepCpu:
    """The engine's CPU per scheduled sequence for the analytic wave, as the simulation takes it
    (plan/servercost.py: overlapping the step where the release schedules asynchronously)."""
    from .servercost import server_costs

    costs = server_costs(host.software.vllm_version, host.cpu.model)
    return pm.StepCpu(costs.step_seq_s * 1e3, bool(costs.async_scheduling))


# -- hook: the scheduler simulation (plan/simulate.py, issue 32) -----------------------------------


SIMULATED_CLIENTS_MAX = 128  # the simulation's events grow with clients x requests: keep `plan` fast
SIMULATED_REQUESTS_MAX = 1024  # and the requests a closed loop sends, as many as `hwprofile bench` up to this


def _host_costs(host: HostSnapshot, shape: pm.ModelShape, arrivals: Arrivals | None) -> ServerCosts:
    """``host``'s server costs for clients on the chat endpoint (``arrivals`` says so: the model's chat
    renderer) or on the completions endpoint (the plan's own loop: `hwprofile bench`'s)."""
    from .servercost import server_costs

    chat = arrivals is not None and arrivals.endpoint == "chat"
    renderer = shape.chat_renderer if chat else "completion"
    return server_costs(host.software.vllm_version, host.cpu.model, renderer=renderer)


def simulated_figures(
    gpu: pm.Gpu,
    shape: pm.ModelShape,
    cand: pm.Candidate,
    wl: pm.Workload,
    per_instance: int,
    arrivals: Arrivals | None = None,
    host: HostSnapshot | None = None,
    spec: pm.Speculation | None = None,
    requests: int | None = None,
    measured_latency: bool = False,
    costs: ServerCosts | None = None,
) -> dict[str, Any] | None:
    """One instance's share of the workload (``per_instance`` clients in a closed loop, as ``vllm bench
    serve --max-concurrency``, sending ``requests`` in all: what `hwprofile bench` sends this instance at
    that point; None: twice the clients, at least 8, at most 64 more; or ``arrivals``: a
    :class:`simulate.Arrivals`, as benchmarks/bench_predict.py gives each measured point's) through
    plan/simulate.py with :func:`predict.step_cost`; None where the engine cannot take one request (the
    plan refuses or says so elsewhere). With ``host``, the CPU outside the GPU's step
    (plan/servercost.py: the API server, the engine's CPU per sequence) for its vLLM; ``spec``: the
    instance's speculation, each decode step at its cost per token (predict.step_cost); ``costs``: those
    costs as the caller has them (a calibrated host's), instead of ``host``'s.
    ``measured_latency``: ``gpu`` was fitted to this host's bench (:func:`.calibration.calibrated_device`):
    the latency a request has outside the engine's steps is the one measured there (its
    ``request_latency_ms``), not the datasheet hosts' fitted one."""
    from . import simulate as sim

    c = max(1, per_instance)
    if costs is None and host is not None:
        costs = _host_costs(host, shape, arrivals)
    pool, groups = shape.kv_pool(cand.kv_tokens, drafted=pm.drafted(spec))
    eng = sim.engine_for(
        cand.max_num_seqs, cand.max_num_batched_tokens, pool, cand.chunked_prefill, costs, groups
    )
    overhead_src = sim.REQUEST_OVERHEAD_SOURCE
    if measured_latency:
        eng, overhead_src = _measured_overhead(eng, gpu, costs)
    said = f"{spec.method} k={spec.k}, acceptance {spec.acceptance}" if spec is not None else "no speculation"
    src = f"plan/predict.py step_cost ({gpu.source}; {said})"
    step = pm.step_cost(gpu, shape, cand, spec)
    if arrivals is not None:
        try:
            res = sim.simulate(step, eng, arrivals)
        except ValueError:
            return None
        return sim.figures(res, arrivals, src, costs, eng.request_overhead_s, overhead_src)
    if c > SIMULATED_CLIENTS_MAX:
        return {
            "not_simulated": f"{c} clients per instance: above the {SIMULATED_CLIENTS_MAX} the plan simulates "
            "within its time budget (benchmarks/bench_plan.py); plan/simulate.py runs it offline"
        }
    n = min(SIMULATED_REQUESTS_MAX, max(c, requests)) if requests else min(c + 64, max(8, 2 * c))
    arr = sim.Arrivals("concurrency", n, wl.input_len, wl.output_len, concurrency=c)
    try:
        res = sim.simulate(step, eng, arr)
    except ValueError:
        return None
    return sim.figures(res, arr, src, costs, eng.request_overhead_s, overhead_src)


def _measured_overhead(eng: Engine, gpu: pm.Gpu, costs: ServerCosts | None) -> tuple[Engine, str]:
    """``eng`` with the latency per request ``gpu`` measured outside the engine's steps on this host
    (:func:`.calibration.calibrated_device`), and its source. What was measured there holds the first
    token's delivery, which the simulation's API server adds itself: less that."""
    first = costs.api_token_s + costs.api_step_s if costs is not None else 0.0
    eng = dataclasses.replace(eng, request_overhead_s=max(0.0, gpu.request_latency_ms / 1e3 - first))
    src = "calibrated: measured on this host, outside the engine's steps" + (
        f", less the first token's delivery ({first * 1e6:.3g} us of the API server's CPU)" if first else ""
    )
    if costs is not None and costs.frontend_shared:
        # measured at one client on an idle CPU: at more clients that work waits behind the outputs'
        eng = dataclasses.replace(eng, frontend_request_s=eng.request_overhead_s)
        src += (
            "; all of it CPU work on the CPU the API server shares with EngineCore (the client's, HTTP, "
            "tokenization, the hand-over), admitted behind the outputs' work there"
        )
    return eng, src


def _benched_speculation(cal: pm.Calibration, inst: InstancePlan) -> bool:
    """The CPU device fitted to ``cal`` holds ``inst``'s steps: its bench ran ``inst``'s speculation
    (none, or its method and draft; where the bench recorded one) — a CPU prediction models no
    speculation of its own, the fitted device carries the bench's."""
    if cal.speculation is None:
        return True
    ran = inst.speculative.method if inst.speculative is not None else "none"
    if cal.speculation[0] != ran:
        return False
    return cal.speculation_model is None or (
        inst.speculative is not None and cal.speculation_model == inst.speculative.model
    )


def cpu_prediction(
    inst: InstancePlan,
    instances: int,
    model: ModelFacts,
    settings: Settings,
    calibration: pm.Calibration | None,
    host: HostSnapshot | None = None,
) -> InstancePrediction | None:
    """A CPU instance's figures: a CPU has no datasheet here, so nothing is predicted (None: unknown)
    until ``hwprofile bench --calibrate`` stores a bench of this host; then a device fitted to it
    (:func:`.calibration.calibrated_device`: the fixed time of a step, the FLOPs of a token and the
    latency outside the engine, from the bench's TPOT, TTFT and the server's own figures) predicts every
    workload and batching, each figure "calibrated". The simulation adds ``host``'s server costs
    (:func:`_calibrated_costs`, :func:`_less_step_cpu`: none counted twice)."""
    if calibration is None or not calibration.points or not _benched_speculation(calibration, inst):
        return None
    kv_bytes = max(1, inst.memory.kv_bytes_per_token_target // max(1, kv_bytes_per_token(model, 1, 1)))
    shape = model_shape(model, kv_bytes)
    eng = inst.engine
    cand = pm.Candidate(
        *(1, instances, 1, eng.max_num_seqs, eng.max_num_batched_tokens, eng.enable_chunked_prefill),
        *(inst.memory.kv_tokens, pm.link_of([], [], None, 1)),
    )
    bench = dataclasses.replace(
        cand,
        instances=calibration.instances,
        max_num_seqs=calibration.max_num_seqs or eng.max_num_seqs,
        max_num_batched_tokens=calibration.max_num_batched_tokens or eng.max_num_batched_tokens,
    )
    dev = calibrated_device(shape, bench, calibration, "this host's CPU")
    if dev is None:
        return None
    costs = _calibrated_costs(host, dev, inst, calibration)  # `hwprofile bench`'s completions
    wl = workload(settings)
    p = pm.predict(dev, shape, cand, wl, None)
    bench_share = _bench_share(settings, wl, instances)
    return InstancePrediction(
        workload=wl.to_json(),
        concurrency=p.per_instance_concurrency,
        ttft_ms=round(p.ttft_ms, 1),
        tpot_ms=round(p.tpot_ms, 2),
        output_tokens_per_s=round(p.output_tokens_per_s / instances, 1),
        source=f"calibrated: {calibration.path}",
        terms=tuple(dict(t) for t in p.terms),
        simulated=simulated_figures(
            _less_step_cpu(dev, costs, min(min(calibration.points)[0], bench.max_num_seqs)),
            shape,
            cand,
            wl,
            p.per_instance_concurrency,
            requests=bench_share,
            measured_latency=True,
            costs=costs,
        ),
    )


def _calibrated_costs(
    host: HostSnapshot | None,
    dev: pm.Gpu,
    inst: InstancePlan,
    cal: pm.Calibration | None = None,
    renderer: str = "completion",
) -> ServerCosts | None:
    """``host``'s server costs for ``inst`` on its CPU backend (the CPUs its OpenMP threads leave the
    API server and EngineCore: plan/servercost.py ``frontend_cpus``), the API server's CPU per request
    no more than the latency ``dev`` measured outside the engine, and its CPU per engine step the one
    ``cal``'s bench measured (:func:`measured_api_costs`; None: no host, no costs)."""
    if host is None:
        return None
    from .servercost import frontend_cpus, server_costs

    costs = server_costs(
        host.software.vllm_version,
        host.cpu.model,
        cpu_backend=True,
        frontend=frontend_cpus(inst, host),
        engines=inst.ranks,
        renderer=renderer,
    )
    measured = dev.request_latency_ms / 1e3
    if measured < costs.api_request_s:
        costs = dataclasses.replace(
            costs,
            api_request_s=measured,
            source=f"{costs.source}; the API server's CPU per request taken as the {measured * 1e3:.3g} ms "
            "this host's bench measured outside the engine (less than the fitted figure)",
        )
    fit = measured_api_costs(cal, costs.api_request_s, costs.api_token_s) if cal is not None else None
    if fit is None:
        return costs
    finish_s, step_s, why = fit
    return dataclasses.replace(
        costs, api_finish_s=finish_s, api_step_s=step_s, source=f"{costs.source}; {why}"
    )


def measured_api_costs(
    cal: pm.Calibration, request_s: float, token_s: float
) -> tuple[float, float, str] | None:
    """The API server's CPU per request as it ends and per engine step on this host, ``(finish_s,
    step_s, source)``, from its /metrics process CPU per request at the bench's concurrencies
    (:attr:`.predict.Calibration.api_cpu`), as plan/simulate.py's API server charges a request:
    ``request_s`` to admit it (before the engine: at most the latency measured outside it), ``step_s +
    tokens x token_s`` for each step that streams its tokens, ``finish_s`` as it ends. ``token_s`` stays
    the fitted one: one workload's requests all have its output length, so its tokens cannot be told
    from a cost per request. None: not measured.

    - Two or more concurrencies whose steps per request differ (by half at least): what each request
      cost beyond ``request_s`` and its tokens, fitted by least squares to a cost per request (the
      finish) and one per step (:func:`_api_fit`).
    - One concurrency (or steps that do not differ): a request's steps move with its tokens (one token
      a step), so the finish is not measured (0) and the step takes what is left, over its steps.

    The steps are vLLM's (``vllm:iteration_tokens_total``): a prompt longer than the step's budget takes
    steps that stream nothing, which the simulation does not charge (the figure comes out low there).
    Measured on this project's CPU VMs (vLLM 0.32, 96 in / 48 out, docs/validation-serving.md): the API
    server's CPU over a point follows the engine's steps, not the tokens streamed. Fitted at one client
    alone, two and four clients came out 4-11 % low on one VM and 18-28 % low on another, where a
    request costs more besides its steps; fitted at one and four clients of one session, two clients'
    came out 7-8 % low on both."""
    points = [(c, ms, tokens, steps) for c, ms, tokens, steps in cal.api_cpu if steps > 0]
    if not points:
        return None
    left = [(st, ms / 1e3 - request_s - tokens * token_s) for _, ms, tokens, st in points]
    steps = [st for st, _ in left]
    if len(points) >= 2 and max(steps) >= 1.5 * min(steps):
        fit = _api_fit(left)
        if fit is not None:
            finish, s = fit
            where = ", ".join(f"{c}: {ms:.3g} ms in {st:.3g} steps" for c, ms, _, st in points)
            return (
                finish,
                s,
                (
                    f"the API server's CPU per engine step {s * 1e6:.3g} us and {finish * 1e3:.3g} ms per request "
                    f"as it ends, fitted on this host (its /metrics process CPU per request by concurrency, "
                    f"{where}; less {request_s * 1e3:.3g} ms for the request and {token_s * 1e6:.3g} us for "
                    "each token)"
                ),
            )
    (c, ms, tokens, st), (_, rest) = min(zip(points, left, strict=True))
    step_s = max(0.0, rest / st)
    return (
        0.0,
        step_s,
        (
            f"the API server's CPU per engine step {step_s * 1e6:.3g} us, measured on this host (its /metrics "
            f"process CPU at concurrency {c}: {ms:.3g} ms per request of {tokens:.3g} output tokens in "
            f"{st:.3g} steps, less {request_s * 1e3:.3g} ms for the request and {token_s * 1e6:.3g} us for "
            "each token)"
        ),
    )


def _api_fit(left: list[tuple[float, float]]) -> tuple[float, float] | None:
    """(per request, per step) seconds: the least-squares line of each point's CPU per request left
    after its admission and tokens over its steps per request (``(steps, seconds)``). A negative
    intercept is no cost per request: the line through the origin then. None where the steps do not
    differ or no positive cost per step fits."""
    n = len(left)
    mx = sum(x for x, _ in left) / n
    my = sum(y for _, y in left) / n
    sxx = sum((x - mx) ** 2 for x, _ in left)
    if sxx <= 0:
        return None
    slope = sum((x - mx) * (y - my) for x, y in left) / sxx
    finish = my - slope * mx
    if finish < 0:
        finish, slope = 0.0, sum(x * y for x, y in left) / sum(x * x for x, _ in left)
    if slope <= 0:
        return None
    return finish, slope


def _less_step_cpu(dev: pm.Gpu, costs: ServerCosts | None, c0: int) -> pm.Gpu:
    """``dev``, fitted with the CPU per scheduled sequence (the engine's, and the API server's where they
    share CPUs: plan/servercost.py) inside its fixed time, for a simulation that adds it itself: the
    fixed time less what it adds at the bench's concurrency (``c0`` sequences a step, serial with it: the
    CPU backend schedules synchronously)."""
    if costs is None or dev.step_fixed_ms is None or costs.async_scheduling:
        return dev
    return dataclasses.replace(dev, step_fixed_ms=max(0.0, dev.step_fixed_ms - costs.step_seq_s * 1e3 * c0))
