"""DeepSeek V4's (and V4.1's) KV cache as vLLM 0.33 lays it out (pure: the model's compressed-attention facts,
the memory, the length and the tokens in flight in; blocks, tokens and bytes out).

Every layer keeps a sliding window (``SlidingWindowMLASpec``, 64-token blocks); a layer of ratio 4
(compressed sparse attention) one entry per 4 tokens and the lightning indexer's key per 4 tokens
(``MLAAttentionSpec``, 256-token blocks), a ratio-128 layer one entry per 128; each compressor
keeps its fp32 state over a window of ``2 x 4`` (ratio 4, 4-token blocks; the indexer's too) or
128 tokens (ratio 128, 8-token blocks). On vLLM's default backends (FlashMLA on SM90/SM100,
FlashInfer on SM12x) the cache is ``fp8_ds_mla`` (``auto`` becomes it; a 16-bit cache is refused):
a row of the NoPE part in fp8, the RoPE part in bf16 and 8 bytes of scales (584 bytes at a head of
512), pages padded to 576 bytes. (FlashInfer's bf16 backend on SM100, asked for by name, is not
modelled.) No spec splits across tensor-parallel ranks: each holds the whole cache.

vLLM packs the pages of several sizes side by side in one block (:mod:`.packed`). A request of
``max_model_len`` reserves, per group, its spec's blocks (the sliding ones their window plus the
tokens in flight, ``max_admission_blocks_per_request``), and the logged ``KV cache size`` is
``int(num_blocks / blocks per request x max_model_len)``.
"""

from __future__ import annotations

from typing import NamedTuple

from ..model.layers import Compressed
from .packed import Bucket, Group, blocks_per_request, bytes_per_block, logged_tokens, packed_groups

ALIGN = 576  # fp8_ds_mla pages are padded to a multiple of this
BLOCK = 256  # the compressed caches' block (FlashMLA sparse and the indexer: 256 tokens)
SWA_BLOCK = 64
SCALE_BYTES = 8
# DeepSeek V4.1 on SM90 (FLASHMLA_SPARSE_DSV41, its indexer: 64-token blocks; the sliding window 32;
# the compressor's fp32 state of 1,024 values a row, 8 rows a block up to 6 speculative tokens)
V41_BLOCK = 64
V41_SWA_BLOCK = 32
V41_STATE_ROW = 1024 * 4


class CompressedCache(NamedTuple):
    bytes_per_block: int
    groups: tuple[Group, ...]
    num_blocks: int
    blocks_per_request: int
    logged_tokens: int
    block: int = BLOCK  # tokens of the compressed caches' block

    @property
    def bytes_per_token(self) -> float:
        """What each further token of context costs, averaged (the compressed caches' blocks)."""
        return self.bytes_per_block / self.block


def row_bytes(c: Compressed) -> int:
    """One cached entry in fp8_ds_mla: the NoPE part in fp8, the RoPE part in bf16, the scales."""
    return (c.head_dim - c.rope_dim) + 2 * c.rope_dim + SCALE_BYTES


def _page(raw: int) -> int:
    return -(-raw // ALIGN) * ALIGN


def _v41_buckets(c: Compressed) -> list[Bucket]:
    """DeepSeek V4.1's buckets (``deepseek_v41/attention.py``, ``compressor.py``): every layer's sliding
    window; on each source layer its compressed entries (one per ``ratio`` tokens) and the indexer's
    keys (fp8 and a scale per 128) in 64-token blocks; a ratio-2 source's compressor state, a ring of
    one block a request."""
    row, index_row = row_bytes(c), c.index_dim + c.index_dim // 128 * 4
    compressed: dict[int, int] = {}
    for layer in c.sources:
        entries = V41_BLOCK // c.ratios[layer]
        for page in (_page(entries * row), _page(entries * index_row)):
            compressed[page] = compressed.get(page, 0) + 1
    out = [
        Bucket("sliding window", {_page(V41_SWA_BLOCK * row): len(c.ratios)}, V41_SWA_BLOCK, c.window),
        Bucket("compressed", compressed, V41_BLOCK, 0),
    ]
    rings = sum(1 for layer in c.sources if c.ratios[layer] == 2)
    if rings:
        out.append(Bucket("compressor state", {8 * V41_STATE_ROW: rings}, 8, 0, state=True, fixed=1))
    return out


def buckets(c: Compressed) -> list[Bucket]:
    """The model's spec buckets (vLLM's ``UniformTypeKVCacheSpecs``), each with its layers per page."""
    if c.sources:
        return _v41_buckets(c)
    row, n4, n128 = row_bytes(c), c.ratios.count(4), c.ratios.count(128)
    index_row = c.index_dim + c.index_dim // 128 * 4
    swa = Bucket("sliding window", {_page(SWA_BLOCK * row): len(c.ratios)}, SWA_BLOCK, c.window)
    compressed: dict[int, int] = {}
    for page, n in (
        (_page(BLOCK // 4 * row), n4),
        (_page(BLOCK // 128 * row), n128),
        (_page(BLOCK // 4 * index_row), n4),
    ):
        if n:
            compressed[page] = compressed.get(page, 0) + n
    out = [swa]
    if compressed:
        out.append(Bucket("compressed", compressed, BLOCK, 0))
    if n4:  # the ratio-4 compressor's state (two overlapping streams) and the indexer's
        pages = {_page(4 * 2 * 2 * c.head_dim * 4): n4}
        index_page = _page(4 * 2 * 2 * c.index_dim * 4)
        pages[index_page] = pages.get(index_page, 0) + n4
        out.append(Bucket("ratio-4 compressor state", pages, 4, 8))
    if n128:
        out.append(Bucket("ratio-128 compressor state", {_page(8 * 2 * c.head_dim * 4): n128}, 8, 128))
    return out


def compressed_cache(
    c: Compressed, kv_cache_bytes: int, max_model_len: int, in_flight: int
) -> CompressedCache:
    """vLLM's blocks, blocks per request of ``max_model_len`` and logged tokens for this model."""
    groups = packed_groups(buckets(c))
    per_block = bytes_per_block(groups, ALIGN)
    num_blocks = max(0, kv_cache_bytes) // per_block
    per_request = sum(blocks_per_request(g.bucket, max_model_len, in_flight) for g in groups)
    return CompressedCache(
        per_block,
        tuple(groups),
        num_blocks,
        per_request,
        logged_tokens(num_blocks, per_request, max_model_len),
        V41_BLOCK if c.sources else BLOCK,
    )
