"""The CPU instance (no usable GPU): a fixed KV space in RAM, the context that fits it, few
sequences, eager or compiled, NUMA node 0."""

from __future__ import annotations

from ..config.settings import Settings
from ..host.snapshot import HostSnapshot
from ..model import ModelFacts
from .engine import server_settings
from .layout import ONE_NODE
from .memory import (
    CPU_BLOCK_TOKENS,
    GiB,
    kv_bytes_per_token,
    kv_tokens_in,
    longest_context,
    sequence_bytes,
    vllm_kv_cache,
)
from .reasons import Reasons
from .refusal import PlanRefused
from .speculative import speculative_config
from .types import EngineSettings, Estimate, InstancePlan, MemoryFit


def cpu_instance(
    host: HostSnapshot,
    settings: Settings,
    model: ModelFacts,
    draft: ModelFacts | None,
    spec_method: str | None,
    r: Reasons,
    warnings: list[str],
) -> InstancePlan:
    key = "instances[0]"
    kv_gib = settings.cpu.kv_cache_space_gib
    kv_space = int(kv_gib * GiB)
    r.add(
        f"{key}.cpu.kv_cache_space_gib",
        kv_gib,
        "CPU backend: the KV cache is a fixed size in RAM (VLLM_CPU_KVCACHE_SPACE / --kv-cache-memory-bytes)",
        ("cpu", "kv_cache_space_gib"),
    )
    ram = host.memory_bytes or 0
    need = model.weights_bytes + (draft.weights_bytes if draft else 0) + kv_space + 2 * GiB
    if ram and need > ram:
        raise PlanRefused(
            f"{model.name} on the CPU needs about {need / GiB:.1f} GiB of RAM (weights + KV + 2 GiB), the host has {ram / GiB:.1f}",
            [
                "a smaller model",
                f"a smaller KV space (--set cpu.kv_cache_space_gib={max(0.25, kv_gib / 4):g})",
            ],
        )

    # context length: what the KV space holds, at most the model's max_position_embeddings
    length = settings.engine.max_model_len
    if model.max_position_embeddings and length > model.max_position_embeddings:
        length = int(model.max_position_embeddings)
    per_tok = kv_bytes_per_token(model, 1, model.dtype_bytes) + (
        kv_bytes_per_token(draft, 1, model.dtype_bytes) if draft else 0
    )
    block = CPU_BLOCK_TOKENS
    tokens = kv_tokens_in(kv_space, per_tok, block)
    if tokens - block < length:  # one block is vLLM's null block
        length = longest_context(
            model, draft, 1, model.dtype_bytes, kv_space - per_tok * block, step=block, block=block
        )
    r.add(
        f"{key}.engine.max_model_len",
        length,
        f"{kv_gib:g} GiB of KV space holds {tokens} tokens",
        ("engine", "max_model_len"),
    )

    seqs = settings.engine.max_num_seqs
    r.add(
        f"{key}.engine.max_num_seqs",
        seqs,
        "CPU backend: few concurrent sequences",
        ("engine", "max_num_seqs"),
    )
    batched = max(seqs, settings.engine.max_num_batched_tokens)
    eager = settings.engine.enforce_eager
    r.add(
        f"{key}.engine.enforce_eager",
        eager,
        "CPU backend: eager starts in ~25 s, compiled mode in 30-75 s"
        if eager
        else "torch.compile on the CPU",
        ("engine", "enforce_eager"),
    )
    bind = settings.layout.numa_bind and len(host.numa_nodes) > 1
    numa = host.numa_nodes[0].id if bind else None
    cpus = host.numa_nodes[0].cpus if numa is not None else None
    if not bind:
        why = ONE_NODE if settings.layout.numa_bind else "NUMA binding is off"
        r.add(f"{key}.numa_node", None, why, ("layout", "numa_bind"))
    if len(host.numa_nodes) > 1:
        warnings.append("CPU backend on a multi-node host: bound to NUMA node 0 only")
    dtype = settings.engine.dtype
    engine = EngineSettings(**{
        "gpu_memory_utilization": None,
        "max_model_len": length,
        "max_num_seqs": seqs,
        "max_num_batched_tokens": batched,
        "kv_cache_dtype": "auto",
        "kv_cache_memory_bytes": kv_space,
        "quantization": model.quant_method,
        "dtype": "bfloat16" if dtype == "auto" else dtype,
        "enforce_eager": eager,
        "enable_prefix_caching": settings.engine.enable_prefix_caching,
        "enable_chunked_prefill": settings.engine.enable_chunked_prefill,
    })
    spec = speculative_config(settings, spec_method, draft, 1, r, key)
    return InstancePlan(**{
        "name": "vllm-cpu",
        "device": "cpu",
        "gpus": (),
        "gpu_name": None,
        "numa_node": numa,
        "cpus": cpus,
        "tensor_parallel_size": 1,
        "pipeline_parallel_size": 1,
        "server": server_settings(settings, settings.server.port),
        "engine": engine,
        "speculative": spec,
        "memory": MemoryFit(**{
            "budget_bytes": kv_space + model.weights_bytes,
            "weights_bytes": model.weights_bytes,
            "draft_weights_bytes": draft.weights_bytes if draft else 0,
            "activation_bytes": 0,
            "overhead_bytes": 0,
            "kv_cache_bytes": kv_space,
            "kv_bytes_per_token": per_tok,
            "kv_bytes_per_token_target": kv_bytes_per_token(model, 1, model.dtype_bytes),
            "kv_bytes_per_token_draft": kv_bytes_per_token(draft, 1, model.dtype_bytes) if draft else 0,
            "kv_tokens": tokens,
            "block_size": block,
            "kv_bytes_per_max_len_request": sequence_bytes(model, draft, 1, model.dtype_bytes, length, block),
            # what vLLM's log will say (`KV cache size: N tokens`), sliding-window groups included;
            # with a draft the cache is shared in ways this does not model: then no figure
            "vllm_logged_kv_tokens": None
            if draft
            else vllm_kv_cache(
                model, kv_space, length, block, model.dtype_bytes, 1, int(engine.max_num_batched_tokens)
            )[1],
        }),
        "estimate": Estimate(note="CPU backend: no datasheet bandwidth figure"),
    })
