"""One GPU instance, assembled from the decisions in order: NUMA binding (layout), memory share,
KV dtype and eager (engine), the fit with or without the draft (speculative), or a refusal with
what would fit; then context, concurrency and tokens per step (engine), the speculative config,
the memory breakdown and the decode ceiling (estimate)."""

from __future__ import annotations

import dataclasses
from typing import NamedTuple

from ..host.snapshot import Gpu
from ..model import ModelFacts
from . import attention, engine, hybridspec
from .context import PlanContext
from .estimate import estimate
from .layout import numa_binding, refine_fp8
from .loaded import as_loaded, device_cc, language_only
from .memory import (
    BLOCK_TOKENS,
    Fit,
    GiB,
    HybridCache,
    HybridOpts,
    MiB,
    hybrid_kv_cache,
    in_flight_tokens,
    is_hybrid,
    is_plain,
    kv_bytes_per_token,
    logs_kv_tokens,
    sequence_bytes,
    vllm_kv_cache,
)
from .reasons import Reasons
from .refusal import PlanRefused, suggestions
from .speculative import fit_beside_draft, speculative_config
from .types import ABSENT, AbsentT, EngineSettings, InstancePlan, MemoryFit


def _refused(
    ctx: PlanContext,
    what: str,
    model: ModelFacts,
    tp: int,
    f: Fit,
    util: float,
    spec_method: str | None,
) -> PlanRefused:
    """The refusal ``what``, with what would fit instead (another checkpoint weighed as this plan would
    load it)."""

    def loaded(checkpoint: ModelFacts) -> int:  # another checkpoint as this plan would load it
        version = ctx.host.software.vllm_version
        return as_loaded(
            checkpoint,
            ctx.settings,
            spec_method,
            version,
            Reasons({}),
            device_cc(ctx.host),
            ctx.host.software.kernel_packages,
        ).weights_bytes

    return PlanRefused(what, suggestions(ctx.host, model, tp, f, util, loaded, refine_fp8(ctx)), f._asdict())


class _Sizing(NamedTuple):
    """An instance's context, concurrency and tokens per step, with a hybrid model's state options."""

    length: int
    seqs: int
    batched: int
    hybrid: HybridOpts | None


def _sizing(
    ctx: PlanContext,
    model: ModelFacts,
    draft: ModelFacts | None,
    spec_method: str | None,
    gpu: Gpu,
    tp: int,
    kv_bytes: int,
    f: Fit,
    util: float,
    names: tuple[str, str],
    chosen_by: str | None,
) -> _Sizing:
    """Context, concurrency and tokens per step (engine) for the fit ``f``; ``names``: the instance's
    key and name."""
    host, settings, r = ctx.host, ctx.settings, ctx.reasons
    key, name = names
    # vLLM's own count of one max-length request: sliding-window layers also hold the tokens in
    # flight (max_num_batched_tokens x the batches it keeps scheduled; the whole prompt without
    # chunked prefill)
    pp = settings.layout.pipeline_parallel_size
    step_tokens = max(settings.engine.max_num_batched_tokens, settings.engine.max_num_seqs)
    if not settings.engine.enable_chunked_prefill:
        step_tokens = max(step_tokens, settings.engine.max_model_len)
    flight = in_flight_tokens(host.software.vllm_version, step_tokens, "cuda", pp, spec_method)
    hybrid = engine.hybrid_opts(model, settings, spec_method, host.software.vllm_version, gpu)
    if hybrid is not None:
        hybrid = engine.choose_ssm_dtype(ctx, model, hybrid, f.kv_cache_bytes, tp, kv_bytes, key)
    try:
        length = engine.context_length(model, draft, tp, kv_bytes, f, settings, r, key, flight, hybrid)
        seqs = engine.concurrency(
            ctx, model, draft, tp, kv_bytes, length, f, key, name, flight, chosen_by, hybrid
        )
    except engine.ContextTooShort as e:
        raise _refused(
            ctx, f"{model.name} on {gpu.name} x{tp}: {e}", model, tp, f, util, spec_method
        ) from None
    batched = engine.batched_tokens(ctx, seqs, length, key, chosen_by)
    if hybrid is not None:
        r.add(
            f"{key}.env.PYTORCH_CUDA_ALLOC_CONF",
            "expandable_segments:True",
            "a hybrid's prefill kernels need expandable segments near full utilization (operators' "
            "reports: syv-ai/qwen38-27b-rtx3090, docs/gotchas.md)",
        )
        hybridspec.state_cost(model, hybrid, spec_method, f.kv_cache_bytes, length, tp, kv_bytes, r, key)
    return _Sizing(length, seqs, batched, hybrid)


def _host_tables(ctx: PlanContext, model: ModelFacts, key: str) -> None:
    """Weights vLLM keeps in pinned host memory (DeepSeek V4.1's engram tables), per instance: said in
    the reasons, refused where the host's memory cannot hold them, warned about near it."""
    if not model.host_bytes:
        return
    ram = ctx.host.memory_bytes
    have = f" of the host's {ram / GiB:.0f} GiB" if ram else " (the host's memory is unknown)"
    ctx.reasons.add(
        f"{key}.memory.host_bytes",
        model.host_bytes,
        f"{model.name}'s engram tables live in pinned host memory (vLLM's EngramConfig.cpu_offload, its "
        f"default): {model.host_bytes / GiB:.1f} GiB{have}, split over the instance's ranks",
    )
    if ram and model.host_bytes > ram:
        raise PlanRefused(
            f"{model.name}'s engram tables need {model.host_bytes / GiB:.0f} GiB of pinned host memory per "
            f"instance; this host has {ram / GiB:.0f} GiB",
            ["a host with more memory"],
        )
    if ram and model.host_bytes > 0.8 * ram:
        ctx.warn(f"{key}: the engram tables take {model.host_bytes / ram:.0%} of the host's memory, pinned")


def _attention(ctx: PlanContext, gpu: Gpu, model: ModelFacts, kv_name: str, key: str) -> str | AbsentT:
    """The instance's attention backend (plan/attention.py), with its reason: the asked one rendered,
    vLLM's own pick not."""
    asked, dtype = ctx.settings.engine.attention_backend, ctx.settings.engine.dtype
    flag = ctx.release.has("--attention-backend")
    att = attention.of_instance(asked, gpu.compute_capability, kv_name, model, flag, dtype)
    if att.refused and not att.asked and model.stack is not None and model.stack.compressed is not None:
        raise PlanRefused(
            f"{model.name} on {gpu.name}: {att.refused} ({att.why})",
            ["a Hopper (SM90) or Blackwell (SM100, SM12x) GPU"],
        )
    compressed = model.stack.compressed if model.stack is not None else None
    if compressed is not None and compressed.sources and (gpu.compute_capability or "").split(".")[0] != "9":
        ctx.warn(
            f"{model.name} on {gpu.name}: DeepSeek V4.1's cache is modelled as vLLM lays it out on Hopper (SM90: "
            "64-token blocks, 584-byte rows); elsewhere vLLM takes 128-token blocks and 528-byte MXFP8 rows, so "
            "its KV figures here are estimates"
        )
    if att.refused:
        raise PlanRefused(
            f"engine.attention_backend {att.backend} on {gpu.name} with {model.name}: {att.refused}; vLLM "
            "would refuse to start",
            ["engine.attention_backend=auto (vLLM's own pick)", "engine.attention_backend=TRITON_ATTN"]
            if not model.kv_lora_rank
            else ["engine.attention_backend=auto (vLLM's own pick)"],
        )
    backend: str | AbsentT = att.backend if att.asked else ABSENT
    why = att.why + (
        ": its decode grid is set by the sequences and KV heads (the step cost's Triton term)"
        if att.kernel == "triton"
        else ""
    )
    ctx.add(
        f"{key}.engine.attention_backend",
        att.backend if att.asked else "auto",
        why,
        ("engine", "attention_backend"),
    )
    return backend


def _engine_settings(
    ctx: PlanContext,
    model: ModelFacts,
    util: float,
    size: _Sizing,
    kv_name: str,
    eager: bool,
    key: str,
    gpu: Gpu,
) -> EngineSettings:
    """The instance's engine settings from the decisions taken, and the quantization's and attention
    backend's reasons."""
    settings, hybrid = ctx.settings, size.hybrid
    lm_only = language_only(model, settings, ctx.host.software.vllm_version) if model.vision_bytes else ABSENT
    _host_tables(ctx, model, key)
    out = EngineSettings(
        gpu_memory_utilization=util,
        max_model_len=size.length,
        max_num_seqs=size.seqs,
        max_num_batched_tokens=size.batched,
        kv_cache_dtype=kv_name,
        quantization=model.quant_method,
        dtype=settings.engine.dtype,
        enforce_eager=eager,
        enable_prefix_caching=settings.engine.enable_prefix_caching,
        enable_chunked_prefill=settings.engine.enable_chunked_prefill,
        language_model_only=lm_only,
        mamba_ssm_cache_dtype=hybrid.ssm_dtype if hybrid is not None else ABSENT,
        mamba_cache_mode=("align" if hybrid.prefix_caching else "none") if hybrid is not None else ABSENT,
        attention_backend=_attention(ctx, gpu, model, kv_name, key),
    )
    quant = model.quant_method
    ctx.add(
        f"{key}.engine.quantization",
        quant,
        f"from the checkpoint's quantization_config ({quant})" if quant else "unquantized checkpoint",
    )
    return out


def _memory_choices(
    ctx: PlanContext,
    gpus: list[Gpu],
    gpu: Gpu,
    model: ModelFacts,
    spec_method: str | None,
    names: tuple[str, str],
) -> tuple[float, str, int, bool]:
    """The instance's memory share (less speculation's headroom on a hybrid), its KV dtype (name and
    element bytes) and eager mode; ``names``: the instance's key and name."""
    key, name = names
    util = engine.memory_share(ctx, gpus, gpu, key, name)
    util = hybridspec.speculation_headroom(ctx, model, util, spec_method, key, name)
    kv_name, kv_bytes = engine.choose_kv_dtype(ctx, gpu, model, f"{key}.engine.kv_cache_dtype")
    return util, kv_name, kv_bytes, engine.choose_eager(ctx, key)


def _unfit(
    ctx: PlanContext, model: ModelFacts, gpu: Gpu, tp: int, f: Fit, util: float, spec_method: str | None
) -> PlanRefused:
    """The refusal of a model whose weights, activations and overhead exceed the budget on ``gpu``."""
    total = engine.cuda_total(gpu)
    return _refused(
        ctx,
        f"{model.name} does not fit on {gpu.name} x{tp}: weights {f.weights_bytes / GiB:.1f} GiB per GPU "
        f"+ activations {f.activation_bytes / GiB:.1f} GiB + overhead {f.overhead_bytes / GiB:.1f} GiB "
        f"exceed the {f.budget_bytes / GiB:.1f} GiB budget ({util:.2f} of {total / GiB:.1f} GiB)",
        model,
        tp,
        f,
        util,
        spec_method,
    )


def _with_batching(ctx: PlanContext, batching: tuple[int, int, str] | None) -> tuple[PlanContext, str | None]:
    """The context with the batching ``layout.objective`` chose (if it chose), and why."""
    if batching is None:
        return ctx, None
    seqs_, batched_, chosen_by = batching
    settings = dataclasses.replace(
        ctx.settings,
        engine=dataclasses.replace(ctx.settings.engine, max_num_seqs=seqs_, max_num_batched_tokens=batched_),
    )
    return ctx.on(settings=settings), chosen_by


def gpu_instance(
    ctx: PlanContext,
    i: int,
    gpus: list[Gpu],
    tp: int,
    model: ModelFacts,
    draft: ModelFacts | None,
    spec_method: str | None,
    batching: tuple[int, int, str] | None = None,
) -> tuple[InstancePlan, ModelFacts | None]:
    """Instance ``i`` over ``gpus`` at tensor parallel ``tp`` (the smallest GPU bounds its memory),
    and the draft it runs (None where it runs none, or dropped it for want of memory). ``batching``:
    ``(max_num_seqs, max_num_batched_tokens, why)`` where ``layout.objective`` chose them."""
    ctx, chosen_by = _with_batching(ctx, batching)
    host, r = ctx.host, ctx.reasons
    name = "vllm-gpu" + "-".join(str(g.index) for g in gpus)
    key = f"instances[{i}]"
    gpu = min(gpus, key=engine.cuda_total)
    total = engine.cuda_total(gpu)

    numa, cpus = numa_binding(ctx, gpus, key, name)
    util, kv_name, kv_bytes, eager = _memory_choices(ctx, gpus, gpu, model, spec_method, (key, name))
    f, draft, spec_method = fit_beside_draft(
        ctx, total, util, model, draft, spec_method, tp, kv_bytes, eager, key, name
    )
    settings = hybridspec.mtp_prefix_caching(ctx, model, spec_method, key, name)
    ctx = ctx.on(settings=settings)
    if not f.fits:
        raise _unfit(ctx, model, gpu, tp, f, util, spec_method)
    size = _sizing(ctx, model, draft, spec_method, gpu, tp, kv_bytes, f, util, (key, name), chosen_by)
    engine_settings = _engine_settings(ctx, model, util, size, kv_name, eager, key, gpu)
    spec = speculative_config(ctx, spec_method, draft, tp, key, model)
    method = spec.method if spec else None
    pp = settings.layout.pipeline_parallel_size
    in_flight = in_flight_tokens(host.software.vllm_version, size.batched, "cuda", pp, method)
    instance = InstancePlan(
        name=name,
        device="cuda",
        gpus=tuple(g.index for g in gpus),
        gpu_uuids=tuple(g.uuid for g in gpus),
        gpu_minors=tuple(g.minor_number for g in gpus),
        gpu_name=gpu.name,
        numa_node=numa,
        gpu_numa_nodes=tuple(g.numa_node for g in gpus)
        if settings.layout.numa_bind and len(host.numa_nodes) > 1
        else (),  # empty: the planner binds nothing (binding off, or one NUMA node)
        cpus=cpus,
        tensor_parallel_size=tp,
        pipeline_parallel_size=settings.layout.pipeline_parallel_size,
        server=engine.server_settings(settings, settings.server.port + i),
        engine=engine_settings,
        speculative=spec,
        memory=memory_fit(f, model, draft, tp, kv_bytes, size.length, in_flight, size.hybrid, r, key),
        estimate=estimate(gpu, model, draft, tp, spec, settings, r.calibration),
    )
    return instance, draft


def memory_fit(
    f: Fit,
    model: ModelFacts,
    draft: ModelFacts | None,
    tp: int,
    kv_bytes: int,
    length: int,
    in_flight: int = 0,
    hybrid: HybridOpts | None = None,
    r: Reasons | None = None,
    key: str = "instances[0]",
) -> MemoryFit:
    """The instance's memory breakdown per GPU. A max-length request costs what vLLM reserves for it
    (sliding-window layers: the window plus ``in_flight`` tokens and one block, see
    :func:`~.memory.sliding_window_blocks`); a sliding-window model without a draft also gets the
    ``KV cache size`` line vLLM will log for these bytes (:func:`~.memory.vllm_kv_cache`), which the
    start-up verification compares with the log."""
    sliding: dict[str, int] = {}
    block = BLOCK_TOKENS
    if hybrid is not None and is_hybrid(model):
        sliding = hybrid_memory(model, f.kv_cache_bytes, length, tp, kv_bytes, hybrid, draft, r, key)
        block = sliding.pop("block_size")
    elif (
        ((model.sliding_layers and model.sliding_window) or not is_plain(model))
        and draft is None
        and logs_kv_tokens(model, tp, kv_bytes)
    ):
        sliding["vllm_logged_kv_tokens"] = vllm_kv_cache(
            model, f.kv_cache_bytes, length, BLOCK_TOKENS, kv_bytes, tp, in_flight
        )[1]
    return MemoryFit(
        **sliding,
        **{
            "budget_bytes": f.budget_bytes,
            "weights_bytes": f.weights_bytes,
            "draft_weights_bytes": f.draft_weights_bytes,
            "activation_bytes": f.activation_bytes,
            "overhead_bytes": f.overhead_bytes,
            "kv_cache_bytes": f.kv_cache_bytes,
            "kv_bytes_per_token": f.kv_bytes_per_token,
            "kv_bytes_per_token_target": kv_bytes_per_token(model, tp, kv_bytes),
            "kv_bytes_per_token_draft": kv_bytes_per_token(draft, tp, kv_bytes) if draft else 0,
            "kv_tokens": f.kv_tokens,
            "block_size": block,
            "kv_bytes_per_max_len_request": sequence_bytes(
                model, draft, tp, kv_bytes, length, in_flight=in_flight, reserve=True, hybrid=hybrid
            ),
        },
    )


def hybrid_memory(
    model: ModelFacts,
    kv_cache_bytes: int,
    length: int,
    tp: int,
    kv_bytes: int,
    hybrid: HybridOpts,
    draft: ModelFacts | None,
    r: Reasons | None,
    key: str,
) -> dict[str, int]:
    """A hybrid model's part of the memory breakdown (:func:`~.memory.hybrid_kv_cache`): the
    attention block vLLM aligns to the state page, the recurrent state one sequence holds, the
    sequences whose state the pool holds, and the ``KV cache size`` line vLLM will log (not with a
    separate draft model, whose layers join the groups in ways this does not model)."""
    h = hybrid_kv_cache(model, kv_cache_bytes, length, tp=tp, kv_dtype_bytes=kv_bytes, **hybrid._asdict())
    out = {
        "block_size": h.block_size,
        "state_bytes_per_sequence": h.state_bytes_per_sequence,
        "state_sequences": h.state_blocks,
    }
    if draft is None:
        out["vllm_logged_kv_tokens"] = h.logged_tokens
    if r is not None:
        st = model.stack.state
        r.add(
            f"{key}.memory.block_size",
            h.block_size,
            f"vLLM raises the attention block so one page ({h.page_bytes} B) holds {_widest_state(model, h, hybrid)}: "
            "_align_hybrid_block_size",
        )
        r.add(
            f"{key}.memory.state_bytes_per_sequence",
            h.state_bytes_per_sequence,
            f"{h.state_layers} {st.kind} state layers{_beside(model)} in {h.state_groups} groups of "
            f"{'up to ' if model.stack.indexed else ''}{h.group_size}, {h.state_slots} page(s) each per running sequence "
            f"(1{' + 1 for prefix caching' if hybrid.prefix_caching else ''}"
            f"{f' + {hybrid.num_spec} speculative' if hybrid.num_spec else ''}"
            f"{' + 1 prefill checkpoint' if hybrid.prefill_checkpoint else ''})"
            f"{f', {h.ring_groups} ring group(s) of one block' if h.ring_groups else ''}: "
            f"{h.state_bytes_per_sequence / MiB:.1f} MiB per GPU",
        )
    return out


def _widest_state(model: ModelFacts, h: HybridCache, hybrid: HybridOpts) -> str:
    """The state whose page sets the hybrid's block: the recurrent state's, or Qwen4-Exp's PLE state's
    where that is the larger."""
    st = model.stack
    conv = st.short_conv.page(model.dtype_bytes, hybrid.num_spec) if st.short_conv else 0
    if conv > h.state_bytes:
        return f"a PLE layer's short-conv state ({conv} B per sequence, padded; a {st.state.kind} layer's: {h.state_bytes} B)"
    return f"a {st.state.kind} layer's state ({h.state_bytes} B per sequence, padded)"


def _beside(model: ModelFacts) -> str:
    """What else the state groups hold (Qwen4-Exp: its PLE short-conv states; its QSA key rings)."""
    st = model.stack
    parts = []
    if st.short_conv is not None:
        parts.append(f"{st.short_conv.layers} of them a PLE short-conv state")
    if st.indexed is not None:
        parts.append("vLLM packs them beside the QSA pages in one block")
    return f" ({'; '.join(parts)})" if parts else ""
