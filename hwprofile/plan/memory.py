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

import math
from typing import TYPE_CHECKING, NamedTuple

from ..model import ModelFacts
from ..release import release_of
from .compressed import compressed_cache

if TYPE_CHECKING:
    from ..model.layers import AttentionShape, LayerStack

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
        shape = model.stack.attention.get("mla") if model.stack is not None else None
        if shape is not None:
            return mla_token_bytes(shape, kv_dtype_bytes)
        return (model.kv_lora_rank + model.qk_rope_head_dim) * kv_dtype_bytes
    return 2 * kv_heads_per_gpu(model, tp) * model.head_dim * kv_dtype_bytes


def mla_token_bytes(shape: AttentionShape, kv_dtype_bytes: int) -> int:
    """One token's bytes in one MLA layer: the latent in the KV dtype (vLLM's fp8_ds_mla row where
    sparse attention runs at an fp8 KV dtype) and the sparse indexer's keys
    (:attr:`~hwprofile.model.layers.AttentionShape.extra_bytes`)."""
    latent = shape.fp8_bytes if kv_dtype_bytes == 1 and shape.fp8_bytes else shape.head_dim * kv_dtype_bytes
    return latent + shape.extra_bytes


def kv_bytes_per_token(model: ModelFacts, tp: int, kv_dtype_bytes: int, sliding: bool = True) -> int:
    """Per GPU: layers × :func:`kv_bytes_per_token_layer` (2 × KV heads per GPU × head size × element
    bytes for ordinary attention; one latent per layer for MLA).

    With ``sliding=False`` only full-attention layers count (sliding-window layers hold at most
    ``window`` tokens per sequence; see :func:`kv_bytes_per_sequence`).
    """
    if model.stack is not None and model.stack.compressed is not None:  # DeepSeek V4, whatever the TP
        return math.ceil(compressed_cache(model.stack.compressed, 0, 1, 0).bytes_per_token)
    if not is_plain(model):
        return sum(
            n * b
            for kind, (n, b) in attention_bytes_by_kind(model, tp, kv_dtype_bytes).items()
            if sliding or kind in ("full", "mla")
        )
    layers = model.num_layers if sliding else model.full_layers
    return layers * kv_bytes_per_token_layer(model, tp, kv_dtype_bytes)


def is_plain(model: ModelFacts) -> bool:
    """Every layer an attention layer of one shape (full, sliding-window or MLA): the arithmetic
    hwprofile had before the layer stack, kept as it was. Hybrids with recurrent state, chunked-local
    attention, layers of several shapes and layers that reuse another's KV go by the stack."""
    st = model.stack
    if st is None:
        return True
    hit = _PLAIN.get(id(st))
    if hit is not None and hit[0] is st:
        return hit[1]
    plain = _plain_stack(st)
    if len(_PLAIN) >= _PLAIN_SIZE:
        _PLAIN.clear()
    _PLAIN[id(st)] = (st, plain)
    return plain


# is_plain's answer per layer stack: asked a few hundred times per plan (every memory fit), each a walk
# over the model's layers. Keyed by the (immutable) stack's identity; each entry holds its stack, so the
# identity cannot be reused while the entry lives. A few entries suffice (a target and its draft).
_PLAIN: dict[int, tuple[LayerStack, bool]] = {}
_PLAIN_SIZE = 8


def _plain_stack(st: LayerStack) -> bool:
    if st.compressed is not None or st.sconv is not None:
        return False
    if st.state_layers or st.kv_shared or "chunked" in st.attention or st.count("none"):
        return False
    if any(a.extra_bytes for k, a in st.attention.items() if k != "mla"):  # MiniMax-M3's indexer keys
        return False
    shapes = {(a.num_kv_heads, a.head_dim, a.head_dim_v) for k, a in st.attention.items() if k != "mla"}
    return len(shapes) <= 1 and all(a.head_dim_v is None for a in st.attention.values())


def attention_bytes_by_kind(model: ModelFacts, tp: int, kv_dtype_bytes: int) -> dict[str, tuple[int, int]]:
    """``{kind: (layers with their own KV, bytes per token and layer on one GPU)}`` from the stack."""
    st = model.stack
    out: dict[str, tuple[int, int]] = {}
    for _, kind in st.attention_layers():
        shape = st.attention[kind]
        if kind == "mla":
            b = mla_token_bytes(shape, kv_dtype_bytes)
        else:  # with an indexer's key beside it (MiniMax-M3's sparse layers), not split by TP
            b = max(1, shape.num_kv_heads // tp) * shape.kv_head_sum * kv_dtype_bytes + shape.extra_bytes
        if st.indexed is not None and kind != "mla":  # QSA's compressed key (MLA's: in its extra_bytes)
            b += st.indexed.key_bytes_per_token()
        n, _ = out.get(kind, (0, b))
        out[kind] = (n + 1, b)
    return out


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
    CPU (platforms/cpu.py) and with speculation that does not support it (suffix; ngram before 0.33:
    0.32.0 config/vllm.py, "Async scheduling not supported with ..."; 0.33 runs it on Model Runner V2)."""
    rel = release_of(vllm_version)
    if not rel.several_batches_in_flight():
        return batched_tokens
    pp = max(1, pipeline_parallel)
    off = ("suffix",) if rel.ngram_keeps_async() else ("ngram", "suffix")
    async_on = device == "cuda" and spec_method not in off
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
    hybrid: HybridOpts | None = None,
) -> int:
    """KV bytes one sequence of ``length`` tokens holds: full-attention layers every token,
    sliding-window layers at most the window (:func:`sliding_window_blocks`), never more than the
    sequence's own blocks (vLLM's runtime clamp, ``get_num_blocks_to_allocate``). Whole blocks of
    ``block`` tokens.

    ``reserve``: what vLLM reserves for a request of ``length = max_model_len`` instead (its
    ``max_memory_usage_bytes``, behind the logged capacity and the start-up check that one such
    request fits): the sliding-window layers' admission cap with ``in_flight``, extra block
    included, even where it exceeds the request's own blocks.

    A hybrid model (:func:`is_hybrid`): its attention layers' blocks at vLLM's hybrid block size
    plus its state pages (:func:`hybrid_kv_cache`, with ``hybrid``'s serving options)."""
    if model.stack is not None and model.stack.compressed is not None:  # DeepSeek V4 (plan.compressed)
        c = compressed_cache(model.stack.compressed, 0, length, in_flight)
        return c.blocks_per_request * c.bytes_per_block
    if model.stack is not None and model.stack.sconv is not None:  # Inkling: whole blocks of every group
        sc = sconv_kv_cache(model, 0, length, tp, kv_dtype_bytes, in_flight if reserve else 0, block)
        return sc.blocks_per_request * sc.bytes_per_block
    if is_hybrid(model):
        h = hybrid_kv_cache(
            model, 0, length, tp=tp, kv_dtype_bytes=kv_dtype_bytes, **(hybrid or HybridOpts())._asdict()
        )
        tokens = -(-length // h.block_size) * h.block_size
        per_token = h.attn_bytes_per_token_layer + h.extra_bytes_per_token_layer
        return h.attention_layers * per_token * tokens + h.state_bytes_per_sequence
    if not is_plain(model):
        return _stack_sequence_bytes(model, tp, kv_dtype_bytes, length, block, in_flight, reserve)
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
    if is_plain(model):
        sliding = model.sliding_layers if model.sliding_window else 0
        full = model.num_layers - sliding
        buckets = [(k, n) for k, n in (("full", full), ("sliding", sliding)) if n]
    else:  # one bucket per attention kind (all of one page size: see uniform_pages)
        buckets = [(k, n) for k, (n, _) in attention_bytes_by_kind(model, 1, 1).items()]
    if len(buckets) == 1:
        return buckets
    lo = min(n for _, n in buckets)
    hi = max(n for _, n in buckets)
    size = hi if hi < lo * 1.5 else lo
    return [(k, size) for k, n in buckets for _ in range(-(-n // size))]


class KvPool(NamedTuple):
    """vLLM's KV pool as plan/simulate.py allocates it where sliding-window layers are kept in groups of
    their own (:func:`kv_pool`)."""

    windows: tuple[int, ...]  # each group's window in tokens (0: the whole context)
    scale: float  # the pool's blocks per block of every layer (:func:`kv_tokens_in`'s count)


def kv_pool(model: ModelFacts, kv_dtype_bytes: int) -> KvPool | None:
    """The groups vLLM's allocator keeps (:func:`kv_cache_groups`) and the pool's size against the
    plan's ``kv_tokens`` (every layer's page per block): a pool block is one page of each layer of a
    group, so gpt-oss's 18 full and 18 sliding layers make blocks of 18 pages, twice the plan's count,
    of which a long request holds its tokens' in the full group and its window's in the sliding one.
    None: one group of every full-attention layer (the plan's count is the pool's), or a layout this
    does not cover (recurrent state, DeepSeek V4's compressed cache, Inkling's short conv, chunked-local
    attention, attention pages of several sizes): the plan's count, as every layer's."""
    st = model.stack
    if is_hybrid(model) or (st is not None and (st.compressed is not None or st.sconv is not None)):
        return None
    if not logs_kv_tokens(model, 1, kv_dtype_bytes):
        return None
    groups = kv_cache_groups(model)
    kinds = {k for k, _ in groups}
    # chunked-local layers (Llama 4): vLLM keeps them apart only where
    # VLLM_ALLOW_CHUNKED_LOCAL_ATTN_WITH_HYBRID_KV_CACHE allows (its default changed across releases),
    # and frees back to the current chunk's start, not a window: every layer's count, as before
    if "chunked" in kinds or "sliding" not in kinds:
        return None
    if is_plain(model):
        page = kv_bytes_per_token_layer(model, 1, kv_dtype_bytes)
        windows = [(model.sliding_window or 0) if k == "sliding" else 0 for k, _ in groups]
    else:
        page = next(b for _, b in attention_bytes_by_kind(model, 1, kv_dtype_bytes).values())
        windows = [
            (st.attention[k].window or 0) if st is not None and k == "sliding" else 0 for k, _ in groups
        ]
    per_block = groups[0][1] * page
    if per_block <= 0:
        return None
    return KvPool(tuple(windows), kv_bytes_per_token(model, 1, kv_dtype_bytes) / per_block)


def vllm_kv_cache(
    model: ModelFacts,
    kv_cache_bytes: int,
    max_model_len: int,
    block: int = BLOCK_TOKENS,
    kv_dtype_bytes: int | None = None,
    tp: int = 1,
    in_flight: int = 0,
    hybrid: HybridOpts | None = None,
) -> tuple[int, int]:
    """``(num_blocks, logged tokens)``: vLLM's arithmetic for a KV cache of ``kv_cache_bytes``. A
    hybrid model's by :func:`hybrid_kv_cache` (``hybrid``: how it is served; ``block`` its cache
    block before alignment), DeepSeek V4's by :mod:`.compressed`; chunked-local layers hold their
    chunk plus ``in_flight``.

    ``num_blocks = bytes // (layers per group × page)`` (``get_kv_cache_config_from_groups``), and
    the ``KV cache size: N tokens`` line is ``int(num_blocks / blocks per request × max_model_len)``
    (``get_kv_cache_capacity``), where a request of ``max_model_len`` tokens takes
    ``cdiv(max_model_len, block)`` blocks in each full-attention group and
    :func:`sliding_window_blocks` in each sliding-window group. ``in_flight``:
    ``max_num_batched_tokens`` × concurrent batches (one on the CPU: no async scheduling).
    """
    dtype_bytes = kv_dtype_bytes or model.dtype_bytes
    if model.stack is not None and model.stack.compressed is not None:  # DeepSeek V4 (plan.compressed)
        c = compressed_cache(model.stack.compressed, kv_cache_bytes, max_model_len, in_flight)
        return c.num_blocks, c.logged_tokens
    if model.stack is not None and model.stack.sconv is not None:  # Inkling
        sc = sconv_kv_cache(model, kv_cache_bytes, max_model_len, tp, dtype_bytes, in_flight, block)
        return sc.num_blocks, sc.logged_tokens
    if is_hybrid(model):
        h = hybrid_kv_cache(
            model,
            kv_cache_bytes,
            max_model_len,
            tp=tp,
            kv_dtype_bytes=dtype_bytes,
            **(hybrid or HybridOpts(cache_block=block))._asdict(),
        )
        return h.num_blocks, h.logged_tokens
    return _attention_kv_cache(model, kv_cache_bytes, max_model_len, block, dtype_bytes, tp, in_flight)


def _attention_kv_cache(
    model: ModelFacts,
    kv_cache_bytes: int,
    max_model_len: int,
    block: int,
    dtype_bytes: int,
    tp: int,
    in_flight: int,
) -> tuple[int, int]:
    """:func:`vllm_kv_cache` for attention-only models (plain, or by the layer stack's kinds)."""
    if is_plain(model):
        page = kv_bytes_per_token_layer(model, tp, dtype_bytes) * block
    else:
        pages = {b for _, b in attention_bytes_by_kind(model, tp, dtype_bytes).values()}
        if len(pages) != 1:
            raise ValueError(
                f"{model.name}: attention layers of several page sizes (vLLM packs them; not modelled)"
            )
        page = pages.pop() * block
    groups = kv_cache_groups(model)
    num_blocks = max(0, kv_cache_bytes) // (max(n for _, n in groups) * page)
    full_blocks = -(-max_model_len // block)
    chunk = (
        model.stack.attention["chunked"].window
        if model.stack and "chunked" in model.stack.attention
        else None
    )

    def blocks_of(kind: str) -> int:
        if kind == "sliding":
            return sliding_window_blocks(model, max_model_len, block, in_flight)
        if kind == "chunked" and chunk:
            return -(-min(chunk + in_flight, max_model_len) // block)
        return full_blocks

    per_request = sum(blocks_of(kind) for kind, _ in groups)
    return num_blocks, int(num_blocks / per_request * max_model_len)


class SconvCache(NamedTuple):
    """Inkling's cache as vLLM lays it out (:func:`sconv_kv_cache`)."""

    bytes_per_block: int
    num_blocks: int
    blocks_per_request: int
    logged_tokens: int
    attention_block: int  # the attention layers' block, raised so their page is the conv state's


def _sconv_buckets(
    model: ModelFacts, tp: int, kv_dtype_bytes: int, block: int
) -> list[tuple[int, int, int, int]]:
    """``(layers, page bytes, block tokens, window)`` of each spec bucket of an Inkling model: its
    attention kinds (full, sliding) and its short-conv states (one bucket per distinct shape)."""
    st = model.stack
    sc = st.sconv
    out: list[tuple[int, int, int, int]] = []
    convs: dict[tuple[int, int], int] = {}
    for kind, (n, b) in attention_bytes_by_kind(model, tp, kv_dtype_bytes).items():
        shape = st.attention[kind]
        out.append((n, b * block, block, shape.window or 0 if kind == "sliding" else 0))
        if shape.num_kv_heads < tp:  # InklingConvState asserts tp <= its KV heads
            raise ValueError(
                f"{model.name}: its short-conv state splits {shape.num_kv_heads} KV heads: tensor parallel at most that"
            )
        key = (shape.num_kv_heads // tp, sc.width(shape))
        convs[key] = convs.get(key, 0) + n
    for (heads, width), n in convs.items():
        out.append((n, heads * sc.kernel * width * model.dtype_bytes, sc.kernel, sc.kernel))
    return out


def sconv_kv_cache(
    model: ModelFacts,
    kv_cache_bytes: int,
    max_model_len: int,
    tp: int = 1,
    kv_dtype_bytes: int | None = None,
    in_flight: int = 0,
    block: int = BLOCK_TOKENS,
) -> SconvCache:
    """Inkling's KV cache (vLLM 0.33, ``models/inkling``): every layer's short-conv state is a sliding
    window of ``kernel`` tokens beside its attention. Nothing declares a layout (LBNHC), so vLLM
    unifies the page sizes (``unify_kv_cache_spec_page_size``: each smaller page's block multiplied up
    to the largest page, the attention block 16 -> 32 for Inkling-Small) and groups the layers by
    ``_get_kv_cache_groups_uniform_page_size`` (group size the smallest bucket's layers, or the
    largest's below 1.5x). A request reserves per group ``cdiv(max_model_len, block)`` (full) or a
    window's ``cdiv(min(window - 1 + in_flight, max_model_len), block) + 1`` blocks."""
    buckets = _sconv_buckets(model, tp, kv_dtype_bytes or model.dtype_bytes, block)
    page = max(p for _, p, _, _ in buckets)
    if any(page % p for _, p, _, _ in buckets):
        raise ValueError(
            f"{model.name}: page sizes vLLM cannot unify ({sorted({p for _, p, _, _ in buckets})})"
        )
    scaled = [(n, b * page // p, w) for n, p, b, w in buckets]
    counts = [n for n, _, _ in scaled]
    size = max(counts) if max(counts) < min(counts) * 1.5 else min(counts)
    per_request = 0
    for n, b, w in scaled:
        blocks = -(-min(w - 1 + in_flight, max_model_len) // b) + 1 if w else -(-max_model_len // b)
        per_request += -(-n // size) * blocks
    per_block = size * page
    num_blocks = max(0, kv_cache_bytes) // per_block
    attention = next(b for n, b, w in scaled if w != model.stack.sconv.kernel) if scaled else block
    return SconvCache(
        per_block, num_blocks, per_request, int(num_blocks / per_request * max_model_len), attention
    )


def logs_kv_tokens(model: ModelFacts, tp: int = 1, kv_dtype_bytes: int = 2) -> bool:
    """Whether :func:`vllm_kv_cache` can say what vLLM logs for this model: not where attention
    layers of several page sizes share the pool (vLLM packs them into mixed blocks)."""
    if (
        is_plain(model)
        or is_hybrid(model)
        or (model.stack is not None and (model.stack.compressed is not None or model.stack.sconv is not None))
    ):
        return True
    return len({b for _, b in attention_bytes_by_kind(model, tp, kv_dtype_bytes).values()}) == 1


def active_weights_bytes(model: ModelFacts) -> int:
    """Weight bytes read to decode one token: all of a dense model; for a mixture of experts, the
    shared part plus the ``experts_per_token`` routed experts, since every expert sits in memory but
    only the routed ones are read.

    Where the checkpoint's routed experts are MXFP4 (:attr:`~hwprofile.model.ModelFacts.mxfp4_expert_bytes`:
    gpt-oss, DeepSeek V4's fp4 experts) and the rest (attention, embeddings, router) keeps 16 bits, the
    experts not routed to are ``(num_experts - experts_per_token) / num_experts`` of those experts' own
    bytes: a token reads every other byte. gpt-oss-120b: 6.2 GB a token, where ``active_params / params``
    of the checkpoint's bytes (one share for every byte) gave 3.2. Otherwise that share of the bytes."""
    if not model.active_params or model.active_params >= model.params:
        return model.weights_bytes
    e, k = model.num_experts, model.experts_per_token
    if model.mxfp4_expert_bytes and e > k > 0:
        return max(0, model.weights_bytes - model.mxfp4_expert_bytes * (e - k) // e)
    return int(model.weights_bytes * model.active_params / model.params)


# vLLM's profiling run ends with a sampler warm-up (gpu_model_runner ``_dummy_sampler_run``, 0.11 to 0.32)
# on ``max_num_seqs`` rows of logits over the vocabulary, top-k and top-p on: FlashInfer's path
# (``flashinfer.sampling.top_k_top_p_sampling_from_logits``, vLLM's CUDA default where FlashInfer is
# installed) holds the bf16 logits, their fp32 copy, the masked fp32 logits and the fp32 probabilities at
# once: 2 + 4 + 4 + 4 bytes an element. PyTorch's path (``apply_top_k_top_p``: a sort with int64 indices,
# where FlashInfer is not installed or not enabled) holds more. The profile counts that peak against the
# KV cache: at least this much.
SAMPLER_BYTES_PER_LOGIT = 14
# PyTorch's path (v1/sample/ops/topk_topp_sampler.py ``apply_top_k_top_p``, read in 0.10.2, 0.11.0 and
# 0.14.0, where FlashInfer is not installed or not enabled) peaks in its sort. Over 4,096 a row, torch.sort
# is aten's radix sort (SortStable.cu ``launch_stable_sort_kernel``). Beside the bf16 logits and their fp32
# copy (2 + 4) it writes the sorted fp32 values and int64 indices (4 + 8), fills int64 reverse indices
# (8), and CUB's segmented radix sort (``DeviceSegmentedRadixSort::SortPairs``, not the DoubleBuffer form)
# allocates alternate key and value buffers (4 + 8): 38 bytes an element, at one row or at least
# :data:`TORCH_SEGMENTED_SORT_ROWS`. Between, torch sorts the whole tensor twice
# (``segmented_sort_pairs_by_full_sort``): two buffers of int2 index-and-segment pairs (8 + 8), the keys
# CUB is given no buffer for (4) and its alternate buffers (4 + 8): 50 bytes. The masks, the softmax and
# the scattered result after the sort hold 28 bytes at most.
SAMPLER_BYTES_PER_LOGIT_TORCH = 38
SAMPLER_BYTES_PER_LOGIT_TORCH_FULL_SORT = 50
TORCH_SEGMENTED_SORT_ROWS = 128


def sampler_bytes_per_logit(sampler: str, rows: int) -> int:
    """Bytes an element of ``rows`` x vocabulary logits the sampler warm-up holds at its peak:
    FlashInfer's :data:`SAMPLER_BYTES_PER_LOGIT`; PyTorch's sort :data:`SAMPLER_BYTES_PER_LOGIT_TORCH`,
    or :data:`SAMPLER_BYTES_PER_LOGIT_TORCH_FULL_SORT` at 2 to 127 rows."""
    if sampler != "torch":
        return SAMPLER_BYTES_PER_LOGIT
    if 1 < rows < TORCH_SEGMENTED_SORT_ROWS:
        return SAMPLER_BYTES_PER_LOGIT_TORCH_FULL_SORT
    return SAMPLER_BYTES_PER_LOGIT_TORCH


def sampler_label(sampler: str) -> str:
    """What :func:`sampler_bytes_per_logit` gives, in words (a reason's value)."""
    if sampler != "torch":
        return f"{SAMPLER_BYTES_PER_LOGIT} B per logit"
    return (
        f"{SAMPLER_BYTES_PER_LOGIT_TORCH} B per logit ({SAMPLER_BYTES_PER_LOGIT_TORCH_FULL_SORT} at 2 to "
        f"{TORCH_SEGMENTED_SORT_ROWS - 1} sequences)"
    )


def activation_bytes(
    model: ModelFacts,
    tp: int,
    batched_tokens: int,
    max_num_seqs: int,
    factor: float,
    sampler: str = "flashinfer",
) -> int:
    """Peak of vLLM's profiling run, per GPU (an estimate; ``factor`` scales it): the larger of its
    two moments, which never overlap (``profile_run``: the dummy forward pass, then the sampler
    warm-up on its output).

    The forward pass of ``batched_tokens`` tokens holds a few hidden-size tensors (residual, norm
    output, attention output: ~4 × hidden) and the gated MLP's two intermediate tensors
    (2 × intermediate / TP), in 2-byte elements. The sampler warm-up holds the sampled positions'
    logits (one row per sequence, :func:`sampler_bytes_per_logit` an element of the vocabulary for
    ``sampler``, FlashInfer's or PyTorch's sort) beside the forward pass's hidden states, which the
    run keeps. gpt-oss's 201,088-token vocabulary at 1,024 sequences: 2.9 GB with FlashInfer, 7.8 GB
    with PyTorch's sort (vLLM logs 7.38 GiB for gpt-oss-20b on an H100: llm-d-benchmark's empirical
    memory results, benchmarks/data/validation_memory.yaml).
    """
    per_token = (4 * model.hidden_size + 2 * model.intermediate_size // tp) * 2
    rows = min(max_num_seqs, batched_tokens)
    logits = rows * model.vocab_size * sampler_bytes_per_logit(sampler, rows)
    kept = batched_tokens * model.hidden_size * 2  # the dummy run's hidden states (bf16)
    return int(factor * max(batched_tokens * per_token, logits + kept))


class Fit(NamedTuple):
    budget_bytes: int  # total × utilization
    weights_bytes: int  # target weights on this GPU
    draft_weights_bytes: int
    activation_bytes: int
    overhead_bytes: int  # outside PyTorch (+ collectives at TP > 1) + graphs + margin
    kv_cache_bytes: int  # what is left for the KV cache (may be negative: does not fit)
    kv_bytes_per_token: int  # target + draft, all layers
    kv_tokens: int  # kv_cache_bytes // kv_bytes_per_token, whole blocks
    block_size: int = BLOCK_TOKENS

    @property
    def fits(self) -> bool:
        return self.kv_cache_bytes > 0


def weights_per_gpu(model: ModelFacts, tp: int) -> int:
    """One rank's weights at tensor parallel ``tp``: its share of what vLLM splits, whole what it
    replicates (:attr:`~hwprofile.model.ModelFacts.replicated_bytes`), the padding its MXFP4 MoE
    kernel adds to the routed experts (:func:`expert_padding`) and its share of the copies that kernel
    keeps (:attr:`~hwprofile.model.ModelFacts.expert_kernel_bytes`)."""
    replicated = min(model.replicated_bytes, model.weights_bytes)
    split = -(-(model.weights_bytes - replicated) // tp) + replicated
    return split + expert_padding(model, tp) + -(-model.expert_kernel_bytes // tp)


def expert_padding(model: ModelFacts, tp: int) -> int:
    """Bytes one rank's routed experts grow by at tensor parallel ``tp`` where vLLM's Mxfp4MoEMethod
    rounds their shapes up to its kernel's tile (``mxfp4_round_up_hidden_size_and_intermediate_size``:
    the intermediate size per rank, ``moe_intermediate_size / tp``, and the hidden size, each to a
    multiple of :attr:`~hwprofile.model.ModelFacts.expert_tile`); 0 without such experts or tile."""
    tile_i, tile_h = model.expert_tile
    inter, hidden = model.moe_intermediate_size // max(1, tp), model.hidden_size
    if not model.mxfp4_expert_bytes or inter <= 0 or hidden <= 0 or (tile_i, tile_h) == (1, 1):
        return 0
    grown = (-(-inter // tile_i) * tile_i) * (-(-hidden // tile_h) * tile_h)
    return model.mxfp4_expert_bytes * (grown - inter * hidden) // (inter * hidden * max(1, tp))


def fit(
    total_bytes: int,
    utilization: float,
    model: ModelFacts,
    draft: ModelFacts | None,
    tp: int,
    kv_dtype_bytes: int,
    batched_tokens: int,
    max_num_seqs: int,
    non_torch_bytes: int,
    graph_bytes: int,
    margin_bytes: int,
    activation_factor: float,
    sampler: str = "flashinfer",
    collective_bytes: int = 0,
) -> Fit:
    """vLLM's KV cache on one GPU, as its memory profile sizes it (``determine_available_memory``):
    ``utilization`` of ``total_bytes`` (the total CUDA reports: :func:`hwprofile.plan.engine.cuda_total`)
    less the weights, the profile's activation peak and the memory outside PyTorch it counts
    (``non_torch_bytes``, and ``collective_bytes`` more where ``tp`` > 1); less the CUDA graphs where
    the release takes them from the cache (``graph_bytes``: 0 otherwise) and the plan's own
    ``margin_bytes``. The CUDA context is not counted: vLLM's baseline is taken after it exists."""
    budget = int(total_bytes * utilization)
    weights = weights_per_gpu(model, tp)
    draft_w = weights_per_gpu(draft, tp) if draft else 0
    act = activation_bytes(model, tp, batched_tokens, max_num_seqs, activation_factor, sampler)
    overhead = non_torch_bytes + (collective_bytes if tp > 1 else 0) + graph_bytes + margin_bytes
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
    hybrid: HybridOpts | None = None,
) -> int:
    """:func:`kv_bytes_per_sequence` of the target plus the draft's."""
    return kv_bytes_per_sequence(model, tp, kv_dtype_bytes, length, block, in_flight, reserve, hybrid) + (
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
    hybrid: HybridOpts | None = None,
) -> int:
    """The longest context (a multiple of ``step``) whose KV fits in ``kv_cache_bytes``; 0 if none.
    ``reserve``: as vLLM's start-up check counts one such request (:func:`kv_bytes_per_sequence`)."""
    lo, hi = 0, 1 << 24
    while lo < hi:
        mid = (lo + hi + 1) // 2
        need = sequence_bytes(model, draft, tp, kv_dtype_bytes, mid * step, block, in_flight, reserve, hybrid)
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


# --- hybrid models: attention layers beside recurrent-state layers (Gated DeltaNet, Mamba, ...) ---

STATE_DTYPE_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2, "half": 2, "float": 4}
GPU_KERNEL_BLOCK = 16  # FlashAttention's kernel block multiple (flash_attn.py: MultipleOf(16))
CPU_KERNEL_BLOCK = 32  # CPU_ATTN's (cpu_attn.py: MultipleOf(32))


def is_hybrid(model: ModelFacts) -> bool:
    """The model has recurrent-state layers beside its attention (vLLM ``is_hybrid``)."""
    return model.stack is not None and model.stack.is_hybrid_state


class HybridOpts(NamedTuple):
    """How vLLM serves a hybrid model, as far as its cache layout depends on it (the keyword
    arguments of :func:`hybrid_kv_cache` besides the model, bytes and lengths)."""

    ssm_dtype: str = "auto"  # --mamba-ssm-cache-dtype
    num_spec: int = 0  # num_speculative_tokens, any method
    mtp_attention_layers: int = 0  # a resident MTP head's attention layers
    prefix_caching: bool = False
    prefill_checkpoint: bool = False
    cache_block: int = BLOCK_TOKENS
    kernel_block: int = GPU_KERNEL_BLOCK
    checkpoint_align: int = 1  # tokens the prefill checkpoints land on (0.33 GDN on FlashInfer: 64)


class HybridCache(NamedTuple):
    """vLLM's KV cache of a hybrid model, per GPU (TP rank), as its start-up arithmetic lays it out."""

    block_size: int  # attention tokens per block (raised so that a page holds one state)
    attn_bytes_per_token_layer: int
    attention_layers: int  # with their own KV (a resident MTP layer's included)
    state_layers: int
    state_bytes: int  # one state layer's state per sequence, unpadded (conv + SSM)
    page_bytes: int  # one layer's page: block_size x attention bytes; the state padded to it
    group_size: int  # layers per KV cache group
    attention_groups: int
    state_groups: int
    state_slots: int  # state pages a request holds per state group (1 + k; 2 + k with prefix caching)
    num_blocks: int
    per_request_blocks: int  # blocks one max_model_len request takes over all groups
    logged_tokens: int  # vLLM's "KV cache size: N tokens"
    block_bytes: int = 0  # one block over all the layers of a group (the widest group where packed)
    ring_groups: int = 0  # groups of rings (one block a request: Qwen4-Exp's raw QSA keys)
    extra_bytes_per_token_layer: int = 0  # beside each attention layer's KV (QSA's compressed key)

    @property
    def state_bytes_per_sequence(self) -> int:
        """State memory one running sequence holds: every state group's slots and every ring's
        block, whole blocks of the pool."""
        return (self.state_groups * self.state_slots + self.ring_groups) * self.block_bytes

    @property
    def state_blocks(self) -> int:
        """Sequences whose state fits the pool at once (vLLM refuses max_num_seqs above this under
        full CUDA graphs: ``max_num_seqs exceeds available Mamba cache blocks``)."""
        return self.num_blocks // max(1, self.state_groups * self.state_slots + self.ring_groups)


def state_bytes_per_layer(
    model: ModelFacts,
    tp: int = 1,
    num_spec: int = 0,
    ssm_dtype: str = "auto",
    conv_dtype_bytes: int | None = None,
) -> int:
    """One state layer's state per sequence on one TP rank (vLLM ``MambaSpec.page_size_bytes``
    before padding): the conv state in the model dtype (``--mamba-cache-dtype auto``), the SSM
    state in ``ssm_dtype`` (``auto``: the model's own rule, :attr:`~hwprofile.model.layers.StateDims.ssm_dtype`,
    else the conv dtype)."""
    from ..model.layers import state_shapes

    dims = model.stack.state
    conv_b = conv_dtype_bytes or model.dtype_bytes
    if ssm_dtype == "auto":
        ssm_b = STATE_DTYPE_BYTES.get(dims.ssm_dtype or "", conv_b)
    else:
        ssm_b = STATE_DTYPE_BYTES[ssm_dtype]
    shapes = state_shapes(dims, tp, num_spec)
    # linear attention keeps one state, in the model dtype; the others a conv state, then the SSM's
    dtypes = (conv_b,) if len(shapes) == 1 else (conv_b,) + (ssm_b,) * (len(shapes) - 1)
    return sum(math.prod(shape) * b for shape, b in zip(shapes, dtypes, strict=True))


def hybrid_attn_bytes_per_token_layer(model: ModelFacts, tp: int, kv_dtype_bytes: int) -> int:
    """Attention KV per token and layer of a hybrid model (one attention shape: vLLM aligns the
    block to ``model_config.get_head_size()`` and ``get_num_kv_heads``)."""
    shapes = model.stack.attention
    if "mla" in shapes:
        return mla_token_bytes(shapes["mla"], kv_dtype_bytes)
    kinds = {(s.num_kv_heads, s.kv_head_sum) for s in shapes.values()}
    if len(kinds) != 1:
        raise ValueError(f"{model.name}: a hybrid with attention layers of several shapes is not modelled")
    kv, heads_sum = kinds.pop()
    return max(1, kv // tp) * heads_sum * kv_dtype_bytes


def _hybrid_block(
    mla: bool,
    attn_tok: int,
    state: int,
    cache_block: int,
    kernel_block: int,
    prefix_caching: bool,
    checkpoint_align: int,
) -> int:
    """The attention block vLLM aligns to a hybrid's state page (``platforms/interface.py``
    ``_align_hybrid_block_size``): with ``align = max(kernel_block, cache_block)`` (16 and 16 on
    CUDA's FlashAttention, 32 and 128 on the CPU; at least 128 beside MLA; with prefix caching, a
    multiple of ``checkpoint_align`` in 0.33), ``block = align x cdiv(state, align x attention bytes
    per token)``, never below ``cache_block``; the state page is padded to ``block x attention bytes
    per token``."""
    align = max(kernel_block, cache_block)
    if mla:  # FlashInfer/TRTLLM MLA kernels: manager blocks a multiple of 128
        align = max(align, 128)
    if prefix_caching:  # mamba_cache_mode align: prefill checkpoints land on block boundaries (0.33)
        align = math.lcm(align, checkpoint_align)
    block = align * -(-state // (align * attn_tok))
    return max(cache_block, kernel_block * -(-block // kernel_block))


def _group_size(attn_layers: int, state_layers: int) -> int:
    """Layers per KV cache group (``v1/core/kv_cache_utils.py``
    ``_get_kv_cache_groups_uniform_page_size``): the attention and the state layers each cut into
    groups of the smaller count's layers (the larger count when it is under 1.5x the smaller); a block
    is one page in each layer of a group, so ``num_blocks = bytes // (group size x page)``."""
    lo, hi = min(attn_layers, state_layers), max(attn_layers, state_layers)
    return hi if hi < lo * 1.5 else lo


class _Layout(NamedTuple):
    """How the groups of a hybrid's cache share the pool (:func:`hybrid_kv_cache`)."""

    block_bytes: int
    group_size: int  # layers per group (the state groups' where they differ)
    attention_groups: int
    state_groups: int
    ring_groups: int


def _layout(model: ModelFacts, attn_layers: int, block: int, page: int, num_spec: int) -> _Layout:
    """Uniform pages (:func:`_group_size`), or vLLM's packed groups for Qwen4-Exp's QSA."""
    if model.stack.indexed is not None:
        return _packed_layout(model, attn_layers, block, page // block, num_spec)
    state_layers = model.stack.state_layers
    size = _group_size(attn_layers, state_layers)
    return _Layout(size * page, size, -(-attn_layers // size), -(-state_layers // size), 0)


def _packed_layout(model: ModelFacts, attn_layers: int, block: int, attn_tok: int, num_spec: int) -> _Layout:
    """Hybrids with an indexer beside their attention (Qwen4-Exp's QSA: BLNHC; GLM-5.3's pooled
    indexer: BLHNC): vLLM packs the attention pages with the indexer's keys, the recurrent states
    and PLE states (padded to the attention page) and the rings side by side in one block
    (:mod:`.packed`), the block rounded up to the pages' alignments."""
    from .packed import Bucket, bytes_per_block, packed_groups

    st = model.stack
    idx = st.indexed
    page = block * attn_tok
    key_page = idx.key_page(block)
    attention = {page: attn_layers}
    attention[key_page] = attention.get(key_page, 0) + attn_layers
    bs = [
        Bucket("attention", attention, block, 0),
        Bucket("state", {page: st.state_layers}, block, 0, True, 1),
        Bucket("ring", {idx.ring_page(num_spec): attn_layers}, block, 0, True, 1),
    ]
    if st.short_conv is not None:
        bs.insert(2, Bucket("short conv", {page: st.short_conv.layers}, block, 0, True, 1))
    groups = packed_groups(bs)
    states = [g for g in groups if g.bucket.name in ("state", "short conv")]
    return _Layout(
        bytes_per_block(groups, idx.alignment(attn_tok)),
        max(n for g in states for n in g.pages.values()),
        sum(1 for g in groups if g.bucket.name == "attention"),
        len(states),
        sum(1 for g in groups if g.bucket.name == "ring"),
    )


def _block_for(
    model: ModelFacts, attn_tok: int, state: int, num_spec: int, align: tuple[int, int, bool, int]
) -> int:
    """:func:`_hybrid_block` for the largest state page (Qwen4-Exp: its PLE state beside GDN's)."""
    st = model.stack
    conv = st.short_conv.page(model.dtype_bytes, num_spec) if st.short_conv else 0
    return _hybrid_block("mla" in st.attention, attn_tok, max(state, conv), *align)


def hybrid_kv_cache(
    model: ModelFacts,
    kv_cache_bytes: int,
    max_model_len: int,
    *,
    tp: int = 1,
    kv_dtype_bytes: int | None = None,
    ssm_dtype: str = "auto",
    num_spec: int = 0,
    mtp_attention_layers: int = 0,
    prefix_caching: bool = False,
    prefill_checkpoint: bool = False,
    cache_block: int = BLOCK_TOKENS,
    kernel_block: int = GPU_KERNEL_BLOCK,
    checkpoint_align: int = 1,
) -> HybridCache:
    """vLLM's layout of a hybrid model's KV cache of ``kv_cache_bytes`` per GPU, and the
    ``KV cache size: N tokens`` it logs (vLLM 0.32/0.33).

    - Block size: :func:`_hybrid_block` (for the largest state page: Qwen4-Exp's PLE beside GDN);
      groups: :func:`_group_size`, or packed for Qwen4-Exp's QSA (:func:`_packed_layout`).
    - Per request (``MambaSpec.max_memory_usage_bytes``): ``cdiv(max_model_len, block)`` blocks an
      attention group; a state group ``1 + k`` pages, ``2 + k`` with prefix caching (``mamba_cache_mode
      align``), one more with prefill checkpoints (``prefill_checkpoint``: Mamba2; 0.33's GDN on Hopper);
      ``k``: speculative tokens, any method; a ring group one block. ``mtp_attention_layers``: a
      resident MTP head's. Logged: ``int(num_blocks / per-request blocks x max_model_len)``."""
    stack = model.stack
    attn_tok = hybrid_attn_bytes_per_token_layer(model, tp, kv_dtype_bytes or model.dtype_bytes)
    if stack.indexed is not None and "mla" in stack.attention:  # the pooled indexer's keys: a page apart
        attn_tok -= stack.attention["mla"].extra_bytes
    state = state_bytes_per_layer(model, tp, num_spec, ssm_dtype)
    block = _block_for(
        model, attn_tok, state, num_spec, (cache_block, kernel_block, prefix_caching, checkpoint_align)
    )
    page = block * attn_tok
    attn_layers = len(stack.attention_layers()) + mtp_attention_layers
    lay = _layout(model, attn_layers, block, page, num_spec)
    slots = (2 + num_spec + (1 if prefill_checkpoint else 0)) if prefix_caching else 1 + num_spec
    num_blocks = max(0, kv_cache_bytes) // lay.block_bytes
    per_request = (
        lay.attention_groups * -(-max_model_len // block) + lay.state_groups * slots + lay.ring_groups
    )
    return HybridCache(
        block_size=block,
        attn_bytes_per_token_layer=attn_tok,
        attention_layers=attn_layers,
        state_layers=stack.state_layers + (stack.short_conv.layers if stack.short_conv else 0),
        state_bytes=state,
        page_bytes=page,
        group_size=lay.group_size,
        attention_groups=lay.attention_groups,
        state_groups=lay.state_groups,
        state_slots=slots,
        num_blocks=num_blocks,
        per_request_blocks=per_request,
        logged_tokens=int(num_blocks / per_request * max_model_len),
        block_bytes=lay.block_bytes,
        ring_groups=lay.ring_groups,
        extra_bytes_per_token_layer=stack.indexed.key_bytes_per_token() if stack.indexed else 0,
    )


def _stack_sequence_bytes(
    model: ModelFacts, tp: int, kv_dtype_bytes: int, length: int, block: int, in_flight: int, reserve: bool
) -> int:
    """KV bytes of one sequence over a stack of attention layers of several kinds and shapes:
    full layers every token, sliding-window layers their window (:func:`sliding_window_blocks`),
    chunked-local layers their chunk (vLLM ``ChunkedLocalAttentionSpec``: the current chunk,
    ``cdiv(min(chunk + in_flight, length), block)`` blocks at most), whole blocks."""
    st = model.stack
    blocks = -(-length // block)
    total = 0
    for kind, (n, b) in attention_bytes_by_kind(model, tp, kv_dtype_bytes).items():
        window = st.attention[kind].window
        if kind == "sliding" and window:
            cap = -(-min(window - 1 + in_flight, length) // block) + 1
        elif kind == "chunked" and window:
            cap = -(-min(window + in_flight, length) // block)
        else:
            cap = blocks
        if not reserve:
            cap = min(cap, blocks)
        total += n * b * cap * block
    return total
