"""Memory arithmetic of a vLLM instance, per GPU. Pure functions; every figure is in bytes.

vLLM's rule (``--gpu-memory-utilization``): the instance may use ``total × utilization`` of each
GPU's memory; weights, activations, non-torch allocations and (since 0.20) CUDA graphs come out of
that, and the KV cache gets the rest.

KV per token and layer follows the attention kind (ordinary K+V per KV head, or one MLA latent);
sliding-window layers hold only their window; :func:`vllm_kv_cache` reproduces the capacity vLLM
logs (``KV cache size: N tokens``), hybrid full/sliding models included. Checked against real
vLLM per family in tests/test_vllm_kv_arch.py.
"""

from __future__ import annotations

import re
from typing import NamedTuple

from ..model import ModelFacts

BLOCK_TOKENS = 16  # vLLM's default KV block size on GPUs (tokens per block)
CPU_BLOCK_TOKENS = 128  # vLLM's CPU platform default (platforms/cpu.py), unless --block-size is given
GiB = 1 << 30
MiB = 1 << 20


def kv_heads_per_gpu(model: ModelFacts, tp: int) -> int:
    """KV heads each GPU holds: split across TP ranks, replicated when TP exceeds them."""
    return max(1, model.num_kv_heads // tp)


def kv_bytes_per_token_layer(model: ModelFacts, tp: int, kv_dtype_bytes: int) -> int:
    """KV bytes one token takes in one attention layer on one GPU.

    Ordinary attention (MHA/GQA/MQA; vLLM ``AttentionSpec``): K and V, for each KV head on this GPU:
    2 × heads per GPU × ``head_dim`` × element bytes. MLA (DeepSeek-V2/V3; ``MLAAttentionSpec``):
    one latent vector of ``kv_lora_rank + qk_rope_head_dim`` elements, not split across TP ranks
    (``num_kv_heads=1, max_tp_shards=1`` in ``vllm/model_executor/layers/attention/mla_attention.py``).
    """
    if model.kv_lora_rank:
        return (model.kv_lora_rank + model.qk_rope_head_dim) * kv_dtype_bytes
    return 2 * kv_heads_per_gpu(model, tp) * model.head_dim * kv_dtype_bytes


def kv_bytes_per_token(model: ModelFacts, tp: int, kv_dtype_bytes: int, sliding: bool = True) -> int:
    """Per GPU: layers × :func:`kv_bytes_per_token_layer` (2 × KV heads per GPU × head size × element
    bytes for ordinary attention; one latent per layer for MLA).

    With ``sliding=False`` only full-attention layers count (sliding-window layers hold at most
    ``window`` tokens per sequence; see :func:`kv_bytes_per_sequence`).
    """
    layers = model.num_layers if sliding else model.full_layers
    return layers * kv_bytes_per_token_layer(model, tp, kv_dtype_bytes)


def sliding_window_blocks(model: ModelFacts, length: int, block: int, in_flight: int = 0) -> int:
    """Blocks a sliding-window layer holds for one request of ``length`` tokens (vLLM
    ``SlidingWindowSpec.max_admission_blocks_per_request``, v1/kv_cache_interface.py): the last
    ``window - 1`` tokens plus the ``in_flight`` tokens being scheduled (:func:`in_flight_tokens`),
    at most ``length``, plus one block (the window need not start a block):
    ``cdiv(min(window - 1 + in_flight, length), block) + 1``. So a window near the block size, or
    near or past ``length``, costs one block more than the request's own blocks: with
    ``length == block`` twice them."""
    window = model.sliding_window or length
    return -(-min(window - 1 + in_flight, length) // block) + 1


def in_flight_tokens(
    vllm_version: str | None,
    batched_tokens: int,
    device: str = "cuda",
    pipeline_parallel: int = 1,
    spec_method: str | None = None,
) -> int:
    """Tokens scheduled but not yet settled, which each sliding-window layer also holds per request
    (vLLM ``VllmConfig.max_in_flight_tokens``): up to 0.25 one ``max_num_batched_tokens`` batch
    (0.25.0 ``SlidingWindowSpec.max_memory_usage_bytes``); from 0.29 ``max_concurrent_batches`` of
    them (0.32.0 config/vllm.py ``max_in_flight_tokens``): 2 with async scheduling (pipeline
    parallel + 1 with PP), else the PP size. Async scheduling is on by default on GPUs, off on the
    CPU (platforms/cpu.py) and with speculation that does not support it (ngram, suffix: 0.32.0
    config/vllm.py, "Async scheduling not supported with ...")."""
    m = re.match(r"^\s*v?(\d+)\.(\d+)", vllm_version or "")
    if m and (int(m.group(1)), int(m.group(2))) < (0, 29):
        return batched_tokens
    pp = max(1, pipeline_parallel)
    async_on = device == "cuda" and spec_method not in ("ngram", "suffix")
    batches = (pp + 1 if pp > 1 else 2) if async_on else pp
    return batches * batched_tokens


def kv_bytes_per_sequence(
    model: ModelFacts,
    tp: int,
    kv_dtype_bytes: int,
    length: int,
    block: int = BLOCK_TOKENS,
    in_flight: int = 0,
    reserve: bool = False,
) -> int:
    """KV bytes one sequence of ``length`` tokens holds: full-attention layers every token,
    sliding-window layers at most the window (:func:`sliding_window_blocks`), never more than the
    sequence's own blocks (vLLM's runtime clamp, ``get_num_blocks_to_allocate``). Whole blocks of
    ``block`` tokens.

    ``reserve``: what vLLM reserves for a request of ``length = max_model_len`` instead (its
    ``max_memory_usage_bytes``, behind the logged capacity and the start-up check that one such
    request fits): the sliding-window layers' admission cap with ``in_flight``, extra block
    included, even where it exceeds the request's own blocks."""
    blocks = -(-length // block)
    tokens = blocks * block
    per_layer = kv_bytes_per_token_layer(model, tp, kv_dtype_bytes)
    full = model.full_layers * per_layer * tokens
    if model.sliding_layers and model.sliding_window:
        window_tokens = sliding_window_blocks(model, length, block, in_flight) * block
        if not reserve:
            window_tokens = min(tokens, window_tokens)
        return full + model.sliding_layers * per_layer * window_tokens
    return full + model.sliding_layers * per_layer * tokens


def kv_cache_groups(model: ModelFacts) -> list[tuple[str, int]]:
    """vLLM's KV cache groups for this model: ``[(kind, layers per group), ...]``, kind ``"full"``
    or ``"sliding"`` (``_get_kv_cache_groups_uniform_page_size``, v1/core/kv_cache_utils.py).

    A model with one attention kind has one group of every layer. A hybrid one (Gemma 2/3,
    gpt-oss) is cut into groups of equal size: the smaller kind's layer count, or the larger
    kind's when it is less than 1.5 × the smaller (the last group of a kind padded). Every group
    takes a page of each of its layers per block from one shared pool.
    """
    sliding = model.sliding_layers if model.sliding_window else 0
    full = model.num_layers - sliding
    buckets = [(k, n) for k, n in (("full", full), ("sliding", sliding)) if n]
    if len(buckets) == 1:
        return buckets
    lo = min(n for _, n in buckets)
    hi = max(n for _, n in buckets)
    size = hi if hi < lo * 1.5 else lo
    return [(k, size) for k, n in buckets for _ in range(-(-n // size))]


def vllm_kv_cache(
    model: ModelFacts,
    kv_cache_bytes: int,
    max_model_len: int,
    block: int = BLOCK_TOKENS,
    kv_dtype_bytes: int | None = None,
    tp: int = 1,
    in_flight: int = 0,
) -> tuple[int, int]:
    """``(num_blocks, logged tokens)``: vLLM's arithmetic for a KV cache of ``kv_cache_bytes``.

    ``num_blocks = bytes // (layers per group × page)`` (``get_kv_cache_config_from_groups``), and
    the ``KV cache size: N tokens`` line is ``int(num_blocks / blocks per request × max_model_len)``
    (``get_kv_cache_capacity``), where a request of ``max_model_len`` tokens takes
    ``cdiv(max_model_len, block)`` blocks in each full-attention group and
    :func:`sliding_window_blocks` in each sliding-window group. ``in_flight``:
    ``max_num_batched_tokens`` × concurrent batches (one on the CPU: no async scheduling).
    """
    dtype_bytes = kv_dtype_bytes or model.dtype_bytes
    page = kv_bytes_per_token_layer(model, tp, dtype_bytes) * block
    groups = kv_cache_groups(model)
    num_blocks = max(0, kv_cache_bytes) // (max(n for _, n in groups) * page)
    full_blocks = -(-max_model_len // block)
    per_request = sum(
        full_blocks if kind == "full" else sliding_window_blocks(model, max_model_len, block, in_flight)
        for kind, _ in groups
    )
    return num_blocks, int(num_blocks / per_request * max_model_len)


def active_weights_bytes(model: ModelFacts) -> int:
    """Weight bytes read to decode one token: all of a dense model; for a mixture of experts, the
    shared part plus the ``experts_per_token`` routed experts (``active_params / params`` of the
    checkpoint), since every expert sits in memory but only the routed ones are read."""
    if not model.active_params or model.active_params >= model.params:
        return model.weights_bytes
    return int(model.weights_bytes * model.active_params / model.params)


def activation_bytes(
    model: ModelFacts, tp: int, batched_tokens: int, max_num_seqs: int, factor: float
) -> int:
    """Peak of vLLM's profiling forward pass, per GPU (an estimate; ``factor`` scales it).

    One step of ``batched_tokens`` tokens holds a few hidden-size tensors (residual, norm output,
    attention output: ~4 × hidden) and the gated MLP's two intermediate tensors (2 × intermediate / TP),
    in 2-byte elements; plus fp32 logits of the sampled positions (one per sequence) over the vocabulary.
    """
    per_token = (4 * model.hidden_size + 2 * model.intermediate_size // tp) * 2
    logits = min(max_num_seqs, batched_tokens) * model.vocab_size * 4
    return int(factor * (batched_tokens * per_token + logits))


class Fit(NamedTuple):
    budget_bytes: int  # total × utilization
    weights_bytes: int  # target weights on this GPU
    draft_weights_bytes: int
    activation_bytes: int
    overhead_bytes: int  # CUDA context + graphs + margin
    kv_cache_bytes: int  # what is left for the KV cache (may be negative: does not fit)
    kv_bytes_per_token: int  # target + draft, all layers
    kv_tokens: int  # kv_cache_bytes // kv_bytes_per_token, whole blocks
    block_size: int = BLOCK_TOKENS

    @property
    def fits(self) -> bool:
        return self.kv_cache_bytes > 0


def fit(
    total_bytes: int,
    utilization: float,
    model: ModelFacts,
    draft: ModelFacts | None,
    tp: int,
    kv_dtype_bytes: int,
    batched_tokens: int,
    max_num_seqs: int,
    context_bytes: int,
    graph_bytes: int,
    margin_bytes: int,
    activation_factor: float,
) -> Fit:
    budget = int(total_bytes * utilization)
    weights = -(-model.weights_bytes // tp)
    draft_w = -(-draft.weights_bytes // tp) if draft else 0
    act = activation_bytes(model, tp, batched_tokens, max_num_seqs, activation_factor)
    overhead = context_bytes + graph_bytes + margin_bytes
    kv_cache = budget - weights - draft_w - act - overhead
    per_token = kv_bytes_per_token(model, tp, kv_dtype_bytes) + (
        kv_bytes_per_token(draft, tp, kv_dtype_bytes) if draft else 0
    )
    return Fit(
        budget, weights, draft_w, act, overhead, kv_cache, per_token, kv_tokens_in(kv_cache, per_token)
    )


def sequence_bytes(
    model: ModelFacts,
    draft: ModelFacts | None,
    tp: int,
    kv_dtype_bytes: int,
    length: int,
    block: int = BLOCK_TOKENS,
    in_flight: int = 0,
    reserve: bool = False,
) -> int:
    """:func:`kv_bytes_per_sequence` of the target plus the draft's."""
    return kv_bytes_per_sequence(model, tp, kv_dtype_bytes, length, block, in_flight, reserve) + (
        kv_bytes_per_sequence(draft, tp, kv_dtype_bytes, length, block, in_flight, reserve) if draft else 0
    )


def kv_tokens_in(kv_cache_bytes: int, bytes_per_token: int, block: int = BLOCK_TOKENS) -> int:
    """Token capacity of a KV cache: whole blocks of ``block`` tokens."""
    return max(0, kv_cache_bytes) // (bytes_per_token * block) * block


def longest_context(
    model: ModelFacts,
    draft: ModelFacts | None,
    tp: int,
    kv_dtype_bytes: int,
    kv_cache_bytes: int,
    step: int = 256,
    block: int = BLOCK_TOKENS,
    in_flight: int = 0,
    reserve: bool = False,
) -> int:
    """The longest context (a multiple of ``step``) whose KV fits in ``kv_cache_bytes``; 0 if none.
    ``reserve``: as vLLM's start-up check counts one such request (:func:`kv_bytes_per_sequence`)."""
    lo, hi = 0, 1 << 24
    while lo < hi:
        mid = (lo + hi + 1) // 2
        need = sequence_bytes(model, draft, tp, kv_dtype_bytes, mid * step, block, in_flight, reserve)
        if need <= kv_cache_bytes:
            lo = mid
        else:
            hi = mid - 1
    return lo * step


def vllm_reported_kv_tokens(kv_tokens: int, max_model_len: int, block: int = BLOCK_TOKENS) -> int:
    """What vLLM logs as ``KV cache size: N tokens`` for a cache of ``kv_tokens`` (whole blocks).

    vLLM (v1 ``kv_cache_utils.get_kv_cache_capacity``) reports ``max_concurrency × max_model_len``,
    where ``max_concurrency = num_blocks / blocks_per_request`` (a float), not the raw block
    capacity. When ``max_model_len`` equals the block size the two coincide. Models with one
    attention kind only; :func:`vllm_kv_cache` covers sliding-window and hybrid models.
    """
    blocks = kv_tokens // block
    per_request = -(-max_model_len // block)
    return int(blocks / per_request * max_model_len)
