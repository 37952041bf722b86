"""Memory arithmetic of a vLLM instance, per GPU. Pure functions; every figure is in bytes.

vLLM's rule (``--gpu-memory-utilization``): the instance may use ``total × utilization`` of each
GPU's memory; weights, activations, non-torch allocations and (since 0.20) CUDA graphs come out of
that, and the KV cache gets the rest.
"""

from __future__ import annotations

from .._record import Record
from ..model import ModelFacts

BLOCK_TOKENS = 16  # vLLM's default KV block size on GPUs (tokens per block)
CPU_BLOCK_TOKENS = 128  # vLLM's CPU platform default (platforms/cpu.py), unless --block-size is given
GiB = 1 << 30
MiB = 1 << 20


def kv_heads_per_gpu(model: ModelFacts, tp: int) -> int:
    """KV heads each GPU holds: split across TP ranks, replicated when TP exceeds them."""
    return max(1, model.num_kv_heads // tp)


def kv_bytes_per_token(model: ModelFacts, tp: int, kv_dtype_bytes: int, sliding: bool = True) -> int:
    """Per GPU: 2 (K and V) × layers × KV heads per GPU × head size × element bytes.

    With ``sliding=False`` only full-attention layers count (sliding-window layers hold at most
    ``window`` tokens per sequence; see :func:`kv_bytes_per_sequence`).
    """
    layers = model.num_layers if sliding else model.full_layers
    return 2 * layers * kv_heads_per_gpu(model, tp) * model.head_dim * kv_dtype_bytes


def kv_bytes_per_sequence(
    model: ModelFacts, tp: int, kv_dtype_bytes: int, length: int, block: int = BLOCK_TOKENS
) -> int:
    """KV bytes one sequence of ``length`` tokens needs: full-attention layers hold every token,
    sliding-window layers at most the window. Rounded up to whole blocks of ``block`` tokens."""
    blocks = -(-length // block)
    tokens = blocks * block
    per_layer = 2 * kv_heads_per_gpu(model, tp) * model.head_dim * kv_dtype_bytes
    full = model.full_layers * per_layer * tokens
    if model.sliding_layers and model.sliding_window:
        window_tokens = min(tokens, -(-(model.sliding_window + block) // block) * block)
        return full + model.sliding_layers * per_layer * window_tokens
    return full + model.sliding_layers * per_layer * tokens


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


class Fit(Record):
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
) -> int:
    return kv_bytes_per_sequence(model, tp, kv_dtype_bytes, length, block) + (
        kv_bytes_per_sequence(draft, tp, kv_dtype_bytes, length, block) if draft else 0
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
) -> int:
    """The longest context (a multiple of ``step``) whose KV fits in ``kv_cache_bytes``; 0 if none."""
    lo, hi = 0, 1 << 24
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if sequence_bytes(model, draft, tp, kv_dtype_bytes, mid * step, block) <= kv_cache_bytes:
            lo = mid
        else:
            hi = mid - 1
    return lo * step


def vllm_reported_kv_tokens(kv_tokens: int, max_model_len: int, block: int = BLOCK_TOKENS) -> int:
    """What vLLM logs as ``KV cache size: N tokens`` for a cache of ``kv_tokens`` (whole blocks).

    vLLM (v1 ``kv_cache_utils.get_kv_cache_capacity``) reports ``max_concurrency × max_model_len``,
    where ``max_concurrency = num_blocks // blocks_per_request``, not the raw block capacity. When
    ``max_model_len`` equals the block size the two coincide.
    """
    blocks = kv_tokens // block
    per_request = -(-max_model_len // block)
    return blocks // per_request * max_model_len
