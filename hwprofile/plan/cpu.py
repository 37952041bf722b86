"""The CPU instance (no usable GPU): a fixed KV space in RAM, the context that fits it, few
sequences, eager or compiled, NUMA node 0; and the attention backend and KV block size vLLM's CPU
platform picks from the model and the CPU's instruction set (:func:`cpu_attention`)."""

from __future__ import annotations

from typing import NamedTuple

from ..model import ModelFacts
from .context import PlanContext
from .engine import hybrid_opts, server_settings
from .layout import ONE_NODE
from .loaded import language_only
from .memory import (
    CPU_BLOCK_TOKENS,
    GiB,
    HybridOpts,
    hybrid_kv_cache,
    is_plain,
    kv_bytes_per_token,
    kv_tokens_in,
    logs_kv_tokens,
    longest_context,
    sequence_bytes,
    vllm_kv_cache,
)
from .refusal import PlanRefused
from .speculative import speculative_config
from .types import ABSENT, AbsentT, EngineSettings, Estimate, InstancePlan, MemoryFit

VLLM_DEFAULT_BATCHED_TOKENS = 2048  # SchedulerConfig.DEFAULT_MAX_NUM_BATCHED_TOKENS (vLLM 0.32)


class CpuAttention(NamedTuple):
    """What vLLM's CPU platform chooses for a model on a CPU (vLLM 0.32, ``platforms/cpu.py``)."""

    backend: str  # CPU_ATTN, AMX_MLA, CPU_MLA or DeepSeek-V4's own
    block_size: int  # KV tokens per block
    chunked_prefill: bool  # False where the platform forces chunked prefill and prefix caching off
    reason: str


def cpu_attention(model: ModelFacts, cpu_flags: tuple[str, ...]) -> CpuAttention:
    """vLLM 0.32's CPU attention backend and KV block size for ``model`` on a CPU with ``cpu_flags``.

    ``CpuPlatform.get_attn_backend_cls`` and ``check_and_update_config``: an MLA model runs on the
    AMX MLA kernel where the CPU has AMX tiles (``torch.cpu._is_amx_tile_supported()``, which
    Linux shows as the ``amx_tile`` flag only where the kernel enabled the tile state), else on the
    reference ``CPU_MLA`` kernel, whose decode kernel only compiles with 16-token blocks (forced even
    over a user's ``--block-size``) and which forces chunked prefill and prefix caching off;
    DeepSeek-V4's kernels take 256-token blocks; everything else ``CPU_ATTN`` with 128-token blocks.
    Arm's ``Features`` never list ``amx_tile``, as vLLM's x86-only AMX check says."""
    amx = "amx_tile" in cpu_flags
    has = (
        "has AMX tiles (amx_tile)"
        if amx
        else (
            "has no AMX tiles (no amx_tile flag)" if cpu_flags else "reports no CPU flags (AMX not assumed)"
        )
    )
    if model.model_type == "deepseek_v4":
        return CpuAttention(
            "DEEPSEEK_V4", 256, amx, f"DeepSeek-V4 on the CPU takes 256-token KV blocks; this CPU {has}"
        )
    if model.kv_lora_rank:
        if amx:
            return CpuAttention(
                "AMX_MLA", CPU_BLOCK_TOKENS, True, f"MLA on the AMX MLA kernel: this CPU {has}"
            )
        return CpuAttention(
            "CPU_MLA",
            16,
            False,
            f"MLA on vLLM's reference CPU_MLA kernel (16-token blocks, no chunked prefill or prefix "
            f"caching): this CPU {has}",
        )
    return CpuAttention(
        "CPU_ATTN", CPU_BLOCK_TOKENS, True, "CPU_ATTN: vLLM's CPU default of 128-token KV blocks"
    )


def cpu_ssm_dtype(requested: str, cpu_flags: tuple[str, ...], linear_attention_types: bool = True) -> str:
    """The SSM state dtype vLLM's CPU platform serves a state model with (vLLM 0.32
    ``platforms/cpu.py``): on a CPU with AVX512-BF16 (its accelerated GDN kernels) anything but an
    explicit ``float16``/``bfloat16`` becomes ``float32`` ("Reset SSM cache type to float32"), and
    those two stay only for a model whose ``layer_types`` lists ``linear_attention`` (its
    ``_cpu_mamba_backend`` is then ``gdn``: the model's own state dtype under that setting is the
    one asked for, as for Qwen3-Next, Qwen3.5 and Granite-4); elsewhere as requested."""
    if "avx512_bf16" not in cpu_flags:
        return requested
    if requested in ("float16", "bfloat16") and linear_attention_types:
        return requested
    return "float32"


MIN_KV_GIB = 0.25  # the smallest KV space worth suggesting: a few thousand tokens of a small model


def cpu_suggestions(
    model: ModelFacts, draft: ModelFacts | None, ram: int, count: int, kv_space: int
) -> list[str]:
    """What would fit in ``ram``, each computed to fit (advice that does not fit is not given): a
    smaller KV space, the model's 4-bit checkpoint, no draft, a smaller model of the family."""
    from ..model import variant_facts
    from .refusal import smaller_models

    def fits(weights: int, kv: int) -> bool:
        return count * (weights + kv) + 2 * GiB <= ram

    out: list[str] = []
    weights = model.weights_bytes + (draft.weights_bytes if draft else 0)
    room_kv = (ram - 2 * GiB) // count - weights  # the KV space left beside the weights
    if room_kv >= MIN_KV_GIB * GiB:
        gib = int(room_kv / GiB * 4) / 4  # down to a quarter GiB
        out.append(f"a smaller KV space that fits: --set cpu.kv_cache_space_gib={gib:g}")
    variant = model.quantized_variants.get(4)
    if variant and model.bits > 4:
        w4 = variant_facts(model, variant, 4).weights_bytes + (draft.weights_bytes if draft else 0)
        for kv in (kv_space, int(MIN_KV_GIB * GiB)):
            if fits(w4, kv):
                kv_set = "" if kv == kv_space else f" --set cpu.kv_cache_space_gib={MIN_KV_GIB:g}"
                out.append(
                    f"its 4-bit checkpoint {variant} ({w4 / GiB:.1f} GiB): --set engine.weights_bits=4{kv_set}"
                )
                break
    if draft is not None and fits(model.weights_bytes, int(MIN_KV_GIB * GiB)):
        out.append(
            f"no draft model ({draft.name}, {draft.weights_bytes / GiB:.1f} GiB): --set speculative.method=ngram"
        )
    smaller = smaller_models(model, (ram - 2 * GiB) // count - int(MIN_KV_GIB * GiB))
    if smaller:
        out.append("a smaller model that fits: " + ", ".join(smaller))
    if not out:
        out.append(
            f"a host with at least {(count * (weights + int(MIN_KV_GIB * GiB)) + 2 * GiB) / GiB:.0f} GiB of RAM"
        )
    return out


def _cpu_seqs(
    ctx: PlanContext, model: ModelFacts, hybrid: HybridOpts | None, kv_space: int, length: int, key: str
) -> tuple[int, dict[str, int]]:
    """max_num_seqs on the CPU, lowered to the sequences whose state the KV space holds (hybrid models),
    and the state figures for the memory fit."""
    seqs = ctx.settings.engine.max_num_seqs
    ctx.add(
        f"{key}.engine.max_num_seqs",
        seqs,
        "CPU backend: few concurrent sequences",
        ("engine", "max_num_seqs"),
    )
    state: dict[str, int] = {}
    if hybrid is not None:
        h = hybrid_kv_cache(model, kv_space, length, kv_dtype_bytes=model.dtype_bytes, **hybrid._asdict())
        state = {"state_bytes_per_sequence": h.state_bytes_per_sequence, "state_sequences": h.state_blocks}
        if seqs > h.state_blocks:
            ctx.warn(
                f"{key}: max_num_seqs {seqs} lowered to {h.state_blocks}: the state of more does not fit"
            )
            seqs = ctx.add(
                f"{key}.engine.max_num_seqs",
                max(1, h.state_blocks),
                f"each running sequence holds {h.state_groups} state groups x {h.state_slots} pages "
                f"({h.state_bytes_per_sequence / 2**20:.1f} MiB); the KV space holds {h.state_blocks} sequences' state",
            )
    return seqs, state


def _cpu_numa(ctx: PlanContext, key: str) -> tuple[int | None, str | None]:
    """The NUMA node (and its CPUs) a CPU instance is bound to: node 0 of a multi-node host, if binding is on."""
    host, settings = ctx.host, ctx.settings
    bind = settings.layout.numa_bind and len(host.numa_nodes) > 1
    numa = host.numa_nodes[0].id if bind else None
    cpus = host.numa_nodes[0].cpus if numa is not None else None
    if not bind:
        why = ONE_NODE if settings.layout.numa_bind else "NUMA binding is off"
        ctx.add(f"{key}.numa_node", None, why, ("layout", "numa_bind"))
    if len(host.numa_nodes) > 1:
        ctx.warn("CPU backend on a multi-node host: bound to NUMA node 0 only")
    return numa, cpus


def _cpu_omp_bind(ctx: PlanContext, key: str, index: int, count: int) -> str | AbsentT:
    """CPU instance ``index`` of ``count``'s ``VLLM_CPU_OMP_THREADS_BIND`` (``cpu.omp_threads_bind``):
    absent for ``auto`` (vLLM's own: one thread per physical core of the node, cores kept for its
    scheduler and API processes); a CPU list per rank otherwise, as vLLM reads it (one list per rank,
    separated by ``|``): one list for every instance, or one per instance (each its own; one
    data-parallel server joins them back). Any other count is refused: vLLM would stop at start-up."""
    value = ctx.settings.cpu.omp_threads_bind
    if value == "auto":
        return ABSENT
    lists = value.split("|")
    if value != "nobind" and len(lists) not in (1, count):
        raise PlanRefused(
            f"cpu.omp_threads_bind names {len(lists)} CPU lists; the plan runs {count} CPU rank(s): vLLM "
            "takes one list per rank, separated by |",
            [
                "one list for every rank: --set cpu.omp_threads_bind=" + lists[0],
                *([f"or {count} lists, one per rank, separated by |"] if count > 1 else []),
                "or vLLM's own choice: --set cpu.omp_threads_bind=auto",
            ],
        )
    mine = value if value == "nobind" or len(lists) == 1 else lists[index]
    shared = " (shared by every instance)" if count > 1 and len(lists) == 1 and value != "nobind" else ""
    ctx.add(
        f"{key}.cpu.omp_threads_bind",
        mine,
        f"the operator's OpenMP binding (VLLM_CPU_OMP_THREADS_BIND){shared}",
        ("cpu", "omp_threads_bind"),
    )
    return mine


def _cpu_ram_check(
    ctx: PlanContext, model: ModelFacts, draft: ModelFacts | None, count: int, kv_space: int
) -> None:
    """Refuse when ``count`` instances' weights and KV space (and 2 GiB) do not fit the host's RAM."""
    ram = ctx.host.memory_bytes or 0
    need = count * (model.weights_bytes + (draft.weights_bytes if draft else 0) + kv_space) + 2 * GiB
    if ram and need > ram:
        raise PlanRefused(
            f"{model.name} on the CPU needs about {need / GiB:.1f} GiB of RAM ({count} x (weights + KV) + 2 GiB), "
            f"the host has {ram / GiB:.1f}",
            cpu_suggestions(model, draft, ram, count, kv_space),
        )


class _CpuCache(NamedTuple):
    """What the CPU instance's KV space holds: the context, the block, the tokens, the hybrid options."""

    length: int
    per_tok: int
    block: int
    tokens: int
    hybrid: HybridOpts | None


def _cpu_hybrid(
    ctx: PlanContext, model: ModelFacts, hybrid: HybridOpts, kv_space: int, length: int, block: int, key: str
) -> tuple[HybridOpts, int, int]:
    """A hybrid model's state dtype by the CPU platform's rule, and the attention block raised to the
    state page: the options, the block, and the bytes usable (less the null block)."""
    ssm = ctx.add(
        f"{key}.memory.mamba_ssm_cache_dtype",
        cpu_ssm_dtype(hybrid.ssm_dtype, ctx.host.cpu.flags, model.stack.linear_attention_types),
        "vLLM's CPU platform keeps the SSM state in float32 on an AVX512-BF16 CPU unless float16/bfloat16 "
        "is asked for (platforms/cpu.py); elsewhere the model's own (--mamba-ssm-cache-dtype auto)",
    )
    hybrid = hybrid._replace(ssm_dtype=ssm, cache_block=block)
    h = hybrid_kv_cache(model, kv_space, length, kv_dtype_bytes=model.dtype_bytes, **hybrid._asdict())
    block = ctx.add(
        f"{key}.memory.block_size",
        h.block_size,
        f"vLLM raises the attention block so one page ({h.page_bytes} B) holds a state layer's "
        f"{h.state_bytes} B (_align_hybrid_block_size)",
    )
    return hybrid._replace(cache_block=block), block, kv_space - h.block_bytes


def _cpu_cache(
    ctx: PlanContext,
    model: ModelFacts,
    draft: ModelFacts | None,
    spec_method: str | None,
    attn: CpuAttention,
    kv_space: int,
    key: str,
) -> _CpuCache:
    """The context length the KV space holds (at most the model's max_position_embeddings), with the
    block size and, for a hybrid model, the state's options."""
    host, settings = ctx.host, ctx.settings
    length = settings.engine.max_model_len
    if model.max_position_embeddings and length > model.max_position_embeddings:
        length = int(model.max_position_embeddings)
    per_tok = kv_bytes_per_token(model, 1, model.dtype_bytes) + (
        kv_bytes_per_token(draft, 1, model.dtype_bytes) if draft else 0
    )
    block = ctx.add(f"{key}.memory.block_size", attn.block_size, attn.reason)
    tokens = kv_tokens_in(kv_space, per_tok, block)
    # vLLM starts only if one max_model_len request fits as it reserves it: sliding-window layers
    # also hold the tokens in flight (one batch on the CPU; the whole prompt without chunked prefill)
    flight = max(settings.engine.max_num_seqs, settings.engine.max_num_batched_tokens)
    if not (attn.chunked_prefill and settings.engine.enable_chunked_prefill):
        flight = max(flight, length, VLLM_DEFAULT_BATCHED_TOKENS)
    usable = kv_space - per_tok * block  # one block is vLLM's null block
    sliding = bool(model.sliding_layers and model.sliding_window) or not is_plain(model)
    hybrid = hybrid_opts(model, settings, spec_method, host.software.vllm_version, None, device="cpu")
    if hybrid is not None:  # the state's dtype by the CPU platform's rule; blocks aligned to the state page
        hybrid, block, usable = _cpu_hybrid(ctx, model, hybrid, kv_space, length, block, key)
        tokens = kv_tokens_in(kv_space, per_tok, block)
    if tokens - block < length or (
        sliding
        and sequence_bytes(model, draft, 1, model.dtype_bytes, length, block, flight, True, hybrid) > usable
    ):
        length = longest_context(
            model,
            draft,
            1,
            model.dtype_bytes,
            usable,
            step=block,
            block=block,
            in_flight=flight,
            reserve=sliding,
            hybrid=hybrid,
        )
    ctx.add(
        f"{key}.engine.max_model_len",
        length,
        f"{settings.cpu.kv_cache_space_gib:g} GiB of KV space holds {tokens} tokens",
        ("engine", "max_model_len"),
    )
    return _CpuCache(length, per_tok, block, tokens, hybrid)


def _cpu_engine(
    ctx: PlanContext,
    model: ModelFacts,
    attn: CpuAttention,
    cache: _CpuCache,
    seqs: int,
    kv_space: int,
    key: str,
) -> EngineSettings:
    """The CPU instance's engine settings: chunked prefill and prefix caching as vLLM leaves them for the
    backend, eager or compiled, the dtype."""
    host, settings = ctx.host, ctx.settings
    length = cache.length
    batched = max(seqs, settings.engine.max_num_batched_tokens)
    chunked = settings.engine.enable_chunked_prefill
    prefix = settings.engine.enable_prefix_caching
    if not attn.chunked_prefill:
        # what vLLM does on its own for this backend: the plan says it rather than hides it
        why = f"{attn.backend} on the CPU: vLLM turns it off"
        chunked = ctx.add(
            f"{key}.engine.enable_chunked_prefill", False, why, ("engine", "enable_chunked_prefill")
        )
        prefix = ctx.add(
            f"{key}.engine.enable_prefix_caching", False, why, ("engine", "enable_prefix_caching")
        )
        batched = ctx.add(
            f"{key}.engine.max_num_batched_tokens",
            max(batched, length, VLLM_DEFAULT_BATCHED_TOKENS),
            f"{attn.backend} on the CPU without chunked prefill: vLLM raises it to max(max_model_len, "
            f"{VLLM_DEFAULT_BATCHED_TOKENS})",
            ("engine", "max_num_batched_tokens"),
        )
    eager = settings.engine.enforce_eager
    ctx.add(
        f"{key}.engine.enforce_eager",
        eager,
        "CPU backend: eager starts in ~25 s, compiled mode in 30-75 s"
        if eager
        else "torch.compile on the CPU",
        ("engine", "enforce_eager"),
    )
    dtype = settings.engine.dtype
    lm_only = language_only(model, settings, host.software.vllm_version) if model.vision_bytes else ABSENT
    return EngineSettings(
        gpu_memory_utilization=None,
        max_model_len=length,
        max_num_seqs=seqs,
        max_num_batched_tokens=batched,
        kv_cache_dtype="auto",
        kv_cache_memory_bytes=kv_space,
        quantization=model.quant_method,
        dtype="bfloat16" if dtype == "auto" else dtype,
        enforce_eager=eager,
        enable_prefix_caching=prefix,
        enable_chunked_prefill=chunked,
        language_model_only=lm_only,
    )


def _cpu_memory(
    model: ModelFacts,
    draft: ModelFacts | None,
    cache: _CpuCache,
    engine: EngineSettings,
    kv_space: int,
    state: dict[str, int],
) -> MemoryFit:
    """The CPU instance's memory fit: the weights and the fixed KV space."""
    length, block, hybrid = cache.length, cache.block, cache.hybrid
    return MemoryFit(
        budget_bytes=kv_space + model.weights_bytes,
        weights_bytes=model.weights_bytes,
        draft_weights_bytes=draft.weights_bytes if draft else 0,
        activation_bytes=0,
        overhead_bytes=0,
        kv_cache_bytes=kv_space,
        kv_bytes_per_token=cache.per_tok,
        kv_bytes_per_token_target=kv_bytes_per_token(model, 1, model.dtype_bytes),
        kv_bytes_per_token_draft=kv_bytes_per_token(draft, 1, model.dtype_bytes) if draft else 0,
        kv_tokens=cache.tokens,
        block_size=block,
        kv_bytes_per_max_len_request=sequence_bytes(
            model,
            draft,
            1,
            model.dtype_bytes,
            length,
            block,
            int(engine.max_num_batched_tokens),
            reserve=True,
            hybrid=hybrid,
        ),  # what vLLM reserves for one (sliding-window layers: window + in-flight + a block)
        # what vLLM's log will say (`KV cache size: N tokens`), sliding-window groups included;
        # with a draft the cache is shared in ways this does not model: then no figure
        vllm_logged_kv_tokens=None
        if draft or not logs_kv_tokens(model, 1, model.dtype_bytes)
        else vllm_kv_cache(
            model,
            kv_space,
            length,
            block,
            model.dtype_bytes,
            1,
            int(engine.max_num_batched_tokens),
            hybrid,
        )[1],
        **state,
    )


def cpu_instance(
    ctx: PlanContext,
    model: ModelFacts,
    draft: ModelFacts | None,
    spec_method: str | None,
    index: int = 0,
    count: int = 1,
) -> InstancePlan:
    """CPU instance ``index`` of ``count`` (each with its own KV space, on its own port)."""
    host, settings = ctx.host, ctx.settings
    key = f"instances[{index}]"
    kv_gib = settings.cpu.kv_cache_space_gib
    kv_space = int(kv_gib * GiB)
    ctx.add(
        f"{key}.cpu.kv_cache_space_gib",
        kv_gib,
        "CPU backend: the KV cache is a fixed size in RAM (VLLM_CPU_KVCACHE_SPACE / --kv-cache-memory-bytes)",
        ("cpu", "kv_cache_space_gib"),
    )
    _cpu_ram_check(ctx, model, draft, count, kv_space)
    attn = cpu_attention(model, host.cpu.flags)
    if settings.engine.attention_backend != "auto":
        ctx.warn(
            f"engine.attention_backend {settings.engine.attention_backend} not rendered for {key}: vLLM's "
            "CPU backend runs its own attention"
        )
    cache = _cpu_cache(ctx, model, draft, spec_method, attn, kv_space, key)
    seqs, state = _cpu_seqs(ctx, model, cache.hybrid, kv_space, cache.length, key)
    engine = _cpu_engine(ctx, model, attn, cache, seqs, kv_space, key)
    numa, cpus = _cpu_numa(ctx, key)
    spec = speculative_config(ctx, spec_method, draft, 1, key, model)
    return InstancePlan(
        name="vllm-cpu" if count == 1 else f"vllm-cpu{index}",
        device="cpu",
        gpus=(),
        gpu_name=None,
        numa_node=numa,
        cpus=cpus,
        tensor_parallel_size=1,
        pipeline_parallel_size=1,
        server=server_settings(settings, settings.server.port + index),
        engine=engine,
        speculative=spec,
        memory=_cpu_memory(model, draft, cache, engine, kv_space, state),
        estimate=Estimate(note="CPU backend: no datasheet bandwidth figure"),
        omp_threads_bind=_cpu_omp_bind(ctx, key, index, count),
    )
