"""The engine settings of a GPU instance: memory share (lowered for memory others hold), KV cache
dtype, CUDA graphs or eager, context length, concurrent sequences, tokens per step; and the
server section every instance shares."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ..config.settings import Settings
from ..host.snapshot import Gpu
from ..model import ModelFacts, from_catalog, variant_facts
from ..release import first_with_choice, floor_of, release_of
from . import gpufacts
from .context import PlanContext
from .memory import (
    BLOCK_TOKENS,
    STATE_DTYPE_BYTES,
    Fit,
    GiB,
    HybridOpts,
    MiB,
    hybrid_kv_cache,
    is_hybrid,
    longest_context,
    sequence_bytes,
    weights_per_gpu,
)
from .reasons import Reasons
from .releases import fp8_kv_verdict
from .types import ServerSettings

AVERAGE_FILL = 0.5  # assumed share of max_model_len an average request occupies (concurrency cap)


class ContextTooShort(Exception):
    """The KV cache left after the weights holds less than ``engine.min_model_len`` tokens (the
    caller refuses the plan with what would fit)."""


def fit_args(
    settings: Settings, eager: bool, vllm_version: str | None, kernel_packages: tuple[str, ...] | None = None
) -> dict[str, Any]:
    """The ``memory.*`` settings :func:`hwprofile.plan.memory.fit` takes (the collectives' buffers from
    the first rank of a group wider than one GPU): the CUDA graphs' bytes only
    where vLLM takes them from the KV cache (release facts ``cudagraph_memory_deducted``; before, it
    captures them after sizing the cache, in what ``gpu_memory_utilization`` leaves), none when eager;
    and the sampler vLLM's profile warms up (:func:`sampler`)."""
    graphs = not eager and release_of(vllm_version).cudagraph_memory_deducted()
    mem, layout = settings.memory, settings.layout
    # a rank of a group wider than its TP on this host (pipeline stages, a TP group across nodes) holds
    # the collectives' buffers whatever its TP here; else they come with TP > 1 (memory.fit)
    grouped = layout.pipeline_parallel_size > 1 or (isinstance(layout.nodes, int) and layout.nodes > 1)
    return {
        "non_torch_bytes": mem.non_torch_bytes + (mem.collective_bytes if grouped else 0),
        "collective_bytes": 0 if grouped else mem.collective_bytes,
        "graph_bytes": settings.memory.cuda_graph_bytes if graphs else 0,
        "margin_bytes": settings.memory.margin_bytes,
        "activation_factor": settings.memory.activation_factor,
        "sampler": sampler(vllm_version, kernel_packages)[0],
    }


def sampler(vllm_version: str | None, kernel_packages: tuple[str, ...] | None) -> tuple[str, str]:
    """``(which, why)`` of the top-k/top-p sampling vLLM's memory profile warms up, ``flashinfer`` or
    ``torch`` (plan/memory.py ``sampler_bytes_per_logit``, ``activation_bytes``), by release (release facts ``flashinfer_dependency``,
    ``flashinfer_sampler_opt_in``, ``flashinfer_sampler_default``, ``triton_top_k_top_p``):
    FlashInfer's where it is on and installed; PyTorch's sort where FlashInfer's is opt-in, or where an
    older release's snapshot says FlashInfer (then an extra) is not installed; where the snapshot does
    not say, FlashInfer's (vLLM's images carry it), and said so."""
    rel = release_of(vllm_version)
    torch_sort = "PyTorch's top-k/top-p, a radix sort with int64 indices"
    if rel.flashinfer_sampler_default():
        return "flashinfer", "FlashInfer's top-k/top-p (on by default, a dependency of vLLM)"
    if rel.flashinfer_sampler_opt_in():
        opt_in = "FlashInfer's is opt-in in this release (VLLM_USE_FLASHINFER_SAMPLER=1)"
        if rel.triton_top_k_top_p():
            return "flashinfer", (
                f"the native sampler's Triton top-k/top-p ({opt_in}): its buffers not read, counted as "
                "FlashInfer's"
            )
        return "torch", f"{torch_sort}: {opt_in}"
    since = floor_of("flashinfer_dependency")
    if kernel_packages is None:
        return "flashinfer", (
            "FlashInfer's top-k/top-p, assumed: the host's snapshot does not say whether FlashInfer is "
            f"installed (an extra before vLLM {since}; without it {torch_sort})"
        )
    fi = next((p for p in kernel_packages if p.startswith("flashinfer")), None)
    if fi:
        return "flashinfer", f"FlashInfer's top-k/top-p ({fi} installed)"
    return "torch", (
        f"{torch_sort}: FlashInfer is not installed (an extra before vLLM {since}: pip install "
        "'vllm[flashinfer]' adds it)"
    )


# what the driver reserves where NVML did not say (its memory v1, a Kubernetes node's snapshot): CUDA
# reports 0.3 to 0.5 GiB less than NVML's total on the boards measured (an H100 80GB HBM3: 79.18 of
# 79.65 GiB; an RTX 3090: 23.69 of 24.0)
RESERVED_UNREAD_BYTES = 512 * MiB


def cuda_total(gpu: Gpu) -> int:
    """The total vLLM's ``gpu_memory_utilization`` is a share of (:attr:`Gpu.cuda_total_bytes`), with
    :data:`RESERVED_UNREAD_BYTES` taken off NVML's total where the driver's reservation was not read."""
    if gpu.cuda_total_bytes is not None:
        return gpu.cuda_total_bytes
    return max(0, (gpu.memory_total_bytes or 0) - RESERVED_UNREAD_BYTES)


def memory_share(ctx: PlanContext, gpus: list[Gpu], gpu: Gpu, key: str, name: str) -> float:
    """``gpu_memory_utilization``: as configured, lowered where other processes already hold memory
    (vLLM fails when CUDA's free memory < its total × share: :func:`cuda_total`). ``gpu`` is the
    instance's smallest GPU."""
    total = gpu.memory_total_bytes or 0
    util = ctx.settings.engine.gpu_memory_utilization
    reserved = gpu.memory_reserved_bytes
    counted = (
        f"NVML's {total / GiB:.1f} GiB less the {reserved / MiB:.0f} MiB the driver reserves, as CUDA counts it"
        if reserved is not None
        else f"NVML's {total / GiB:.1f} GiB less {RESERVED_UNREAD_BYTES / MiB:.0f} MiB assumed reserved by the "
        "driver: NVML did not say"
    )
    ctx.add(
        f"{key}.engine.gpu_memory_utilization",
        util,
        f"{util:.2f} of each GPU's {cuda_total(gpu) / GiB:.1f} GiB for this instance ({counted})",
        ("engine", "gpu_memory_utilization"),
    )
    # vLLM fails when CUDA's free memory is below its total x share: what processes hold beyond the
    # driver's reservation (NVML's memory v2 keeps the two apart; v1's "used" counts both)
    used = max(g.memory_used_bytes or 0 for g in gpus)
    cuda = cuda_total(gpu)
    if cuda and used > cuda * (1 - util):
        new = round(max(0.05, (cuda - used - 256 * MiB) / cuda), 3)
        ctx.warn(
            f"{name}: {used / GiB:.1f} GiB already in use on GPU {gpu.index}; memory share lowered to {new}"
        )
        ctx.add(
            f"{key}.engine.gpu_memory_utilization",
            new,
            f"vLLM fails when free memory < total × share; {used / GiB:.1f} GiB is taken by other processes",
        )
        util = new
    return util


def kv_cache_dtype(want: str, gpu: Gpu | None, model: ModelFacts) -> tuple[str, int, str]:
    """``(kv_cache_dtype, bytes per element, reason)`` for ``engine.kv_cache_dtype`` ``want`` on
    ``gpu``: ``fp8_if_supported`` is FP8 only where the datasheet table says the GPU has FP8
    hardware, else the model's dtype. DeepSeek V4's cache is vLLM's fp8_ds_mla (plan/compressed.py):
    ``auto`` and ``fp8_if_supported`` render nothing, a 16-bit cache is refused as vLLM refuses it."""
    if model.stack is not None and model.stack.compressed is not None:
        if want in ("bfloat16", "float16"):
            from .refusal import PlanRefused

            raise PlanRefused(
                f"engine.kv_cache_dtype {want}: vLLM keeps DeepSeek V4's cache in its fp8_ds_mla layout "
                "and refuses to start with another (deepseek_v4 attention.py, FlashMLA and FlashInfer SM12x)",
                ["engine.kv_cache_dtype=auto"],
            )
        if want in ("auto", "fp8_if_supported"):
            return (
                "auto",
                1,
                "vLLM keeps DeepSeek V4's cache as fp8_ds_mla (its FlashMLA / FlashInfer layout)",
            )
    if want == "fp8_if_supported":
        row = gpufacts.lookup(gpu.name, gpu.memory_total_gib) if gpu else None
        if row and row.get("fp8_support") and is_hybrid(model):
            verdict = fp8_kv_verdict(model)
            if verdict is None or not verdict[0]:
                why = verdict[1] if verdict else f"fp8 KV is not verified for {model.name} (a hybrid)"
                return "auto", model.dtype_bytes, f"KV cache in the model's dtype ({model.dtype}): {why}"
            return "fp8", 1, f"8-bit KV cache: {gpu.name if gpu else '?'} has FP8 hardware; {verdict[1]}"
        if row and row.get("fp8_support"):
            return (
                "fp8",
                1,
                f"8-bit KV cache: {gpu.name if gpu else '?'} has FP8 hardware (datasheet table); halves KV bytes per token",
            )
        return (
            "auto",
            model.dtype_bytes,
            f"KV cache in the model's dtype ({model.dtype}): {gpu.name if gpu else 'this device'} has no FP8 hardware",
        )
    if want.startswith("fp8"):
        return want, 1, "8-bit KV cache as configured"
    if want in ("bfloat16", "float16"):
        return want, 2, "KV cache dtype as configured"
    return "auto", model.dtype_bytes, f"KV cache in the model's dtype ({model.dtype})"


def choose_kv_dtype(ctx: PlanContext, gpu: Gpu | None, model: ModelFacts, key: str) -> tuple[str, int]:
    """:func:`kv_cache_dtype` for this instance's GPU, with its reason: ``(dtype, element bytes)``."""
    name, nbytes, why = kv_cache_dtype(ctx.settings.engine.kv_cache_dtype, gpu, model)
    ctx.add(key, name, why, ("engine", "kv_cache_dtype"))
    return name, nbytes


def choose_eager(ctx: PlanContext, key: str) -> bool:
    """``enforce_eager`` as configured (CUDA graphs on unless asked off)."""
    eager = ctx.settings.engine.enforce_eager
    ctx.add(
        f"{key}.engine.enforce_eager",
        eager,
        "CUDA graphs off (eager)"
        if eager
        else "CUDA graphs on: they cut the launch overhead of each step (speculative decoding included)",
        ("engine", "enforce_eager"),
    )
    return eager


def context_length(
    model: ModelFacts,
    draft: ModelFacts | None,
    tp: int,
    kv_bytes: int,
    f: Fit,
    settings: Settings,
    r: Reasons,
    key: str,
    in_flight: int | None = None,
    hybrid: HybridOpts | None = None,
) -> int:
    """``max_model_len``: as configured, at most the model's ``max_position_embeddings``, shortened
    to the longest one request whose KV fits the cache; :class:`ContextTooShort` below
    ``engine.min_model_len``. ``in_flight`` (:func:`~.memory.in_flight_tokens`): one request counted
    as vLLM's start-up check counts it (sliding-window layers: window + in-flight + a block)."""
    reserve = in_flight is not None
    flight = in_flight or 0
    length = settings.engine.max_model_len
    min_len = settings.engine.min_model_len
    if model.max_position_embeddings and length > model.max_position_embeddings:
        length = int(model.max_position_embeddings)
        r.add(
            f"{key}.engine.max_model_len",
            length,
            f"capped at the model's max_position_embeddings ({length})",
            ("engine", "max_model_len"),
        )
    one = sequence_bytes(model, draft, tp, kv_bytes, length, in_flight=flight, reserve=reserve, hybrid=hybrid)
    # vLLM keeps one block of the pool as its null block: a request gets the others.
    usable = f.kv_cache_bytes - f.kv_bytes_per_token * BLOCK_TOKENS
    if hybrid is not None and is_hybrid(model):  # the null block: one page in each layer of a group
        h = hybrid_kv_cache(
            model, f.kv_cache_bytes, length, tp=tp, kv_dtype_bytes=kv_bytes, **hybrid._asdict()
        )
        usable = f.kv_cache_bytes - h.block_bytes
    if one <= usable:
        r.add(
            f"{key}.engine.max_model_len",
            length,
            f"one {length}-token request needs {one / GiB:.2f} GiB of the {f.kv_cache_bytes / GiB:.2f} GiB KV cache",
            ("engine", "max_model_len"),
        )
        return length
    fits_len = longest_context(
        model, draft, tp, kv_bytes, usable, in_flight=flight, reserve=reserve, hybrid=hybrid
    )
    if fits_len < min_len:
        raise ContextTooShort(
            f"after weights the KV cache gets {f.kv_cache_bytes / GiB:.2f} GiB, "
            f"enough for {fits_len} tokens of context; the profile needs at least {min_len}"
        )
    r.add(
        f"{key}.engine.max_model_len",
        fits_len,
        f"{length} tokens would need {one / GiB:.2f} GiB of KV cache, {f.kv_cache_bytes / GiB:.2f} GiB is left: shortened to the longest that fits",
        ("engine", "max_model_len"),
    )
    return fits_len


def concurrency(
    ctx: PlanContext,
    model: ModelFacts,
    draft: ModelFacts | None,
    tp: int,
    kv_bytes: int,
    length: int,
    f: Fit,
    key: str,
    name: str,
    in_flight: int | None = None,
    chosen_by: str | None = None,
    hybrid: HybridOpts | None = None,
) -> int:
    """``max_num_seqs`` as configured (or as ``layout.objective`` chose it: ``chosen_by`` says why).
    vLLM preallocates the KV cache, so more sequences than it holds queue or get preempted rather
    than run out of memory: said so, not silently lowered. Requests at full length are counted as
    vLLM counts its maximum concurrency where ``in_flight`` is given (:func:`context_length`)."""
    seqs = ctx.settings.engine.max_num_seqs
    src: tuple[str, ...] = ("layout", "objective") if chosen_by else ("engine", "max_num_seqs")
    why = f"predicted: {chosen_by}; " if chosen_by else ""
    whole = sequence_bytes(
        model,
        draft,
        tp,
        kv_bytes,
        length,
        in_flight=in_flight or 0,
        reserve=in_flight is not None,
        hybrid=hybrid,
    )
    full_len = f.kv_cache_bytes // max(1, whole)
    avg = sequence_bytes(model, draft, tp, kv_bytes, max(16, int(length * AVERAGE_FILL)), hybrid=hybrid)
    half = max(1, int(f.kv_cache_bytes // max(1, avg)))
    holds = f"the KV cache holds {half} requests at {int(AVERAGE_FILL * 100)}% of max_model_len, {full_len} at full length"
    if seqs > half:
        ctx.warn(
            f"{name}: max_num_seqs {seqs} > {half} ({holds}); under long requests vLLM will queue or preempt"
            + _four_bit_room(ctx.settings, model, tp, f.kv_cache_bytes, avg)
        )
        ctx.add(
            f"{key}.engine.max_num_seqs",
            seqs,
            f"{why or f'{seqs} as configured; '}{holds} (more queue or are preempted)",
            src,
        )
    else:
        ctx.add(f"{key}.engine.max_num_seqs", seqs, why + holds, src)
    if hybrid is not None and is_hybrid(model):
        seqs = state_cap(ctx, model, tp, kv_bytes, length, f, hybrid, seqs, key, name)
    return seqs


def _ring_fits(model: ModelFacts, f: Fit, length: int, tp: int, kv_bytes: int, hybrid: HybridOpts) -> bool:
    """QSA's ring divides the attention block vLLM picks with these speculative tokens."""
    h = hybrid_kv_cache(model, f.kv_cache_bytes, length, tp=tp, kv_dtype_bytes=kv_bytes, **hybrid._asdict())
    return h.block_size % model.stack.indexed.ring_rows(hybrid.num_spec) == 0


def state_cap(
    ctx: PlanContext,
    model: ModelFacts,
    tp: int,
    kv_bytes: int,
    length: int,
    f: Fit,
    hybrid: HybridOpts,
    seqs: int,
    key: str,
    name: str,
) -> int:
    """A hybrid model's ``max_num_seqs`` at most the sequences whose recurrent state the pool holds
    at once (each holds its state pages in every state group: 1 + k, or 2 + k with prefix caching).
    vLLM itself refuses to start under full CUDA graphs when ``max_num_seqs`` exceeds the pool's
    blocks (``config/compilation.py``: "max_num_seqs exceeds available Mamba cache blocks"), and
    sequences beyond the state pages could not run anyway."""
    h = hybrid_kv_cache(model, f.kv_cache_bytes, length, tp=tp, kv_dtype_bytes=kv_bytes, **hybrid._asdict())
    idx = model.stack.indexed
    if idx is not None and h.block_size % idx.ring_rows(hybrid.num_spec):
        from .refusal import PlanRefused

        fits = [
            k for k in range(1, 9) if _ring_fits(model, f, length, tp, kv_bytes, hybrid._replace(num_spec=k))
        ]
        raise PlanRefused(
            f"{name}: QSA's raw-key ring of {idx.ring_rows(hybrid.num_spec)} rows (compression ratio "
            f"{idx.ratio} plus {hybrid.num_spec} speculative tokens, rounded up to the ratio) does not divide "
            f"the attention block of {h.block_size} tokens: vLLM stops at start-up (qsa_cache.py)",
            [f"--set speculative.num_speculative_tokens={k}" for k in fits[-2:]]
            or ["--set speculative.method=none"],
        )
    if h.state_blocks < 1:
        raise ContextTooShort(
            f"the {f.kv_cache_bytes / GiB:.2f} GiB KV cache holds {h.num_blocks} blocks, less than one "
            f"sequence's recurrent state ({h.state_groups} state groups x {h.state_slots} pages)"
        )
    if seqs <= h.state_blocks:
        return seqs
    per_seq = h.state_bytes_per_sequence
    why = (
        f"lowered from {seqs}: each running sequence holds {h.state_groups} state groups x {h.state_slots} pages "
        f"{f'and {h.ring_groups} ring block(s) ' if h.ring_groups else ''}"
        f"({per_seq / MiB:.1f} MiB of recurrent state per GPU); the {h.num_blocks} blocks of the pool hold "
        f"{h.state_blocks} sequences' state (vLLM refuses to start under full CUDA graphs when max_num_seqs "
        "exceeds its state blocks)"
    )
    ctx.warn(
        f"{name}: max_num_seqs {seqs} lowered to {h.state_blocks}: the recurrent state of more does not fit"
    )
    return ctx.add(f"{key}.engine.max_num_seqs", h.state_blocks, why)


def _four_bit_room(
    settings: Settings, model: ModelFacts, tp: int, kv_cache_bytes: int, per_request: int
) -> str:
    """Where a 16-bit (or 8-bit) checkpoint leaves the KV cache too small for ``max_num_seqs``: what its
    4-bit checkpoint (the catalog's) would leave, as the same requests, and the setting that plans it
    (``engine.weights_bits: 4``); "" where there is none or the operator fixed the bits. The KV cache
    grows by the weight bytes one GPU no longer holds; the requests it holds at ``per_request`` bytes."""
    variant = model.quantized_variants.get(4)
    if not variant or model.bits <= 4 or settings.engine.weights_bits != "auto" or kv_cache_bytes <= 0:
        return ""
    # the two checkpoints whole, as published: ``model`` may be loaded (a tower dropped) or one node's or
    # stage's share of it (plan/nodes.py), so the 4-bit one's share is taken in their proportion
    whole = from_catalog(model.name) or model
    four = variant_facts(whole, variant, 4)
    if whole.weights_bytes <= 0 or four.weights_bytes >= whole.weights_bytes:
        return ""
    freed = int(weights_per_gpu(model, tp) * (1 - four.weights_bytes / whole.weights_bytes))
    more = (kv_cache_bytes + freed) // max(1, per_request)
    return (
        f"; its 4-bit checkpoint {variant} would leave {freed / GiB:.1f} GiB more per GPU to the KV cache, "
        f"about {more} such requests (--set engine.weights_bits=4; 4-bit weights change the outputs a little)"
    )


def batched_tokens(ctx: PlanContext, seqs: int, length: int, key: str, chosen_by: str | None = None) -> int:
    """``max_num_batched_tokens``: as configured (or as ``layout.objective`` chose it), raised to what
    vLLM requires (at least ``max_num_seqs``; without chunked prefill, at least ``max_model_len``)."""
    settings = ctx.settings
    batched = settings.engine.max_num_batched_tokens
    chunked = settings.engine.enable_chunked_prefill
    if batched < seqs:
        batched = seqs
        ctx.add(
            f"{key}.engine.max_num_batched_tokens",
            batched,
            "raised to max_num_seqs (vLLM requires max_num_batched_tokens >= max_num_seqs)",
        )
    elif not chunked and batched < length:
        batched = length
        ctx.add(
            f"{key}.engine.max_num_batched_tokens",
            batched,
            "raised to max_model_len: without chunked prefill a whole prompt must fit one step",
        )
    else:
        ctx.add(
            f"{key}.engine.max_num_batched_tokens",
            batched,
            f"predicted: {chosen_by}" if chosen_by else "tokens per scheduler step",
            ("layout", "objective") if chosen_by else ("engine", "max_num_batched_tokens"),
        )
    return batched


def server_settings(settings: Settings, port: int) -> ServerSettings:
    """The server section of an instance listening on ``port``."""
    return ServerSettings(
        host=settings.server.host,
        port=port,
        served_model_name=settings.server.served_model_name,
        api_key_env=settings.server.api_key_env,
        shutdown_timeout=settings.server.shutdown_timeout,
        vllm_command=settings.server.vllm_command,
        user=settings.server.user,
        metrics=settings.server.metrics,
        extra_args=settings.server.extra_args,
    )


def hybrid_opts(
    model: ModelFacts,
    settings: Settings,
    spec_method: str | None,
    vllm_version: str | None,
    gpu: Gpu | None,
    device: str = "cuda",
) -> HybridOpts | None:
    """How vLLM will lay out a hybrid model's cache on this instance (None: not a hybrid).

    State pages per request follow ``num_speculative_tokens`` for any speculative method (ngram
    included: ``vllm_config.num_speculative_tokens``), prefix caching (``mamba_cache_mode align``:
    one page more) and the prefill checkpoint page a Mamba2 mixer, from vLLM 0.33 on Hopper a GDN
    layer on FlashInfer's prefill kernel (``qwen_gdn_linear_attn.py``: its blocks then on a 64-token
    grid), or a KDA layer on FlashKDA's (:func:`_flashkda`: a 16-token grid) exports in align mode;
    a resident MTP head adds its attention layers. The SSM state's dtype is vLLM's default
    (``auto``: the model's rule)."""
    if not is_hybrid(model):
        return None
    k = settings.speculative.num_speculative_tokens if spec_method else 0
    prefix = bool(settings.engine.enable_prefix_caching)
    rel = release_of(vllm_version)
    cc = (gpu.compute_capability or "") if gpu is not None else ""
    hopper = cc.split(".")[0] == "9"
    kind = model.stack.state.kind
    # align mode's extra prefill-checkpoint page: Mamba2 mixers (mamba_mixer2.py, 0.32 and 0.33);
    # GDN from 0.33 where FlashInfer's prefill kernel runs it (Hopper), on a 64-token grid
    flashinfer_gdn = kind == "gdn" and hopper and device == "cuda" and rel.flashinfer_gdn_prefill()
    flashkda = device == "cuda" and _flashkda(model, cc) and rel.flashkda_prefill_checkpoint()
    mamba2 = kind == "mamba2" and rel.mamba2_prefill_checkpoint()
    checkpoint = prefix and (flashinfer_gdn or flashkda or mamba2)
    if device == "cpu":
        from .memory import CPU_BLOCK_TOKENS, CPU_KERNEL_BLOCK

        block, kernel = CPU_BLOCK_TOKENS, CPU_KERNEL_BLOCK
    else:
        from .memory import GPU_KERNEL_BLOCK

        block, kernel = BLOCK_TOKENS, GPU_KERNEL_BLOCK
    return HybridOpts(
        num_spec=k,
        mtp_attention_layers=model.mtp_layers if spec_method == "mtp" else 0,
        prefix_caching=prefix,
        prefill_checkpoint=checkpoint,
        cache_block=block,
        kernel_block=kernel,
        checkpoint_align=(64 if flashinfer_gdn else 16 if flashkda else 1) if prefix else 1,
    )


def _flashkda(model: ModelFacts, cc: str) -> bool:
    """Whether the model's KDA layers run FlashKDA's prefill kernel (kimi_k3 / glm5next ``kda.py``:
    SM90/SM10x/SM12x, bf16 activations, a KDA head of 128, a bounded gate), exporting a prefill
    checkpoint page on a 16-token grid in align mode (``kda_checkpoint.py``)."""
    from ..model.layers import FLASHKDA_MODELS

    dims = model.stack.state
    return (
        dims is not None
        and dims.kind == "kda"
        and model.architecture in FLASHKDA_MODELS
        and cc.split(".")[0] in ("9", "10", "12")
        and dims.head_dim == 128
        and model.dtype == "bfloat16"
        and dims.bounded_gate
    )


def _ssm_dtype_auto(
    ctx: PlanContext, own: str | None, default: int, half: int, path: str, setting: tuple[str, ...]
) -> str:
    """``auto``'s choice for a float32 state: float16 where it keeps more of the wanted sequences'
    state resident (``default``, ``half``: the sequences each holds) on a release that has it; else
    the model's own."""
    vllm_version = ctx.version
    want = ctx.settings.engine.max_num_seqs
    if default >= want or half <= default:
        return ctx.add(
            path,
            "auto",
            f"the model's own SSM state dtype ({own}): {default} sequences' state fit, "
            f"max_num_seqs {want} asked; float16 would not add resident sequences that are wanted",
            setting,
        )
    if not release_of(vllm_version).ssm_float16():
        return ctx.add(
            path,
            "auto",
            f"the model's own SSM state dtype ({own}): vLLM {vllm_version} has no float16 SSM "
            f"state ({first_with_choice('--mamba-ssm-cache-dtype', 'float16')}+), which would hold {half} "
            f"sequences' state instead of {default}",
            setting,
        )
    return ctx.add(
        path,
        "float16",
        f"float16 SSM state instead of the model's {own}: {half} sequences' state fit "
        f"instead of {default} (max_num_seqs {want} asked); operators measured 64 instead of 37 resident "
        "requests on one RTX 3090 with Qwen3.8-27B (syv-ai/qwen38-27b-rtx3090, docs/gotchas.md)",
        setting,
    )


def choose_ssm_dtype(
    ctx: PlanContext,
    model: ModelFacts,
    hybrid: HybridOpts,
    kv_cache_bytes: int,
    tp: int,
    kv_dtype_bytes: int,
    key: str,
) -> HybridOpts:
    """The SSM state's dtype (``--mamba-ssm-cache-dtype``): ``engine.mamba_ssm_cache_dtype`` where set;
    on ``auto`` the model's own (vLLM's ``auto``: Qwen3.5's config says float32) unless float16 lets
    more sequences' state stay resident than the default does while fewer than ``max_num_seqs`` fit
    (operators measured 64 instead of 37 resident requests on one RTX 3090 with Qwen3.8-27B int4:
    ../shared/facts/hybrid.md), on a release that has float16 (0.13+)."""
    settings = ctx.settings
    asked = settings.engine.mamba_ssm_cache_dtype
    path = f"{key}.engine.mamba_ssm_cache_dtype"
    setting = ("engine", "mamba_ssm_cache_dtype")
    if asked != "auto":
        ctx.add(path, asked, f"engine.mamba_ssm_cache_dtype {asked}", setting)
        return hybrid._replace(ssm_dtype=asked)
    own = model.stack.state.ssm_dtype
    blocks = _state_blocks(model, hybrid, kv_cache_bytes, tp, kv_dtype_bytes, settings.engine.max_model_len)
    if not _float16_may_help(model):
        return hybrid
    chosen = _ssm_dtype_auto(ctx, own, blocks("auto"), blocks("float16"), path, setting)
    return hybrid if chosen == "auto" else hybrid._replace(ssm_dtype=chosen)


def _state_blocks(
    model: ModelFacts, hybrid: HybridOpts, kv_cache_bytes: int, tp: int, kv_dtype_bytes: int, length: int
) -> Callable[[str], int]:
    """The sequences whose recurrent state a pool of ``kv_cache_bytes`` holds, by SSM state dtype."""

    def blocks(ssm: str) -> int:
        opts = hybrid._replace(ssm_dtype=ssm)._asdict()
        h = hybrid_kv_cache(model, kv_cache_bytes, length, tp=tp, kv_dtype_bytes=kv_dtype_bytes, **opts)
        return h.state_blocks

    return blocks


def _float16_may_help(model: ModelFacts) -> bool:
    """A GDN or Mamba2 state wider than 16 bits: ``auto`` may choose float16 for it."""
    wide = STATE_DTYPE_BYTES.get(model.stack.state.ssm_dtype or "", 2) > 2
    return model.stack.state.kind in ("gdn", "mamba2") and wide


def state_seqs(
    model: ModelFacts,
    hybrid: HybridOpts,
    kv_cache_bytes: int,
    tp: int,
    kv_dtype_bytes: int,
    settings: Settings,
    vllm_version: str | None,
    seqs: int,
) -> int:
    """The sequences whose recurrent state a pool of ``kv_cache_bytes`` holds where ``seqs`` are asked,
    at the SSM state dtype the plan would run (:func:`choose_ssm_dtype`, :func:`_ssm_dtype_auto`):
    what :func:`state_cap` lowers ``max_num_seqs`` to, known before a batching is chosen."""
    blocks = _state_blocks(model, hybrid, kv_cache_bytes, tp, kv_dtype_bytes, settings.engine.max_model_len)
    asked = settings.engine.mamba_ssm_cache_dtype
    if asked != "auto":
        return blocks(asked)
    default = blocks("auto")
    if default >= seqs or not _float16_may_help(model) or not release_of(vllm_version).ssm_float16():
        return default
    return max(default, blocks("float16"))
