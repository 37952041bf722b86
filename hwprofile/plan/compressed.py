"""DeepSeek V4's KV cache as vLLM 0.33 lays it out (pure: the model's compressed-attention facts,
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

vLLM packs the pages of several sizes side by side in one block (``_get_packed_kv_cache_groups``,
v1/core/kv_cache_planning.py): buckets of one spec type, split into groups of the same number of
repeats (``_approximate_gcd``), each group a column of the pool; a block is as wide as the widest
group. A request of ``max_model_len`` reserves, per group, its spec's blocks (the sliding ones
their window plus the tokens in flight, ``max_admission_blocks_per_request``), and the logged
``KV cache size`` is ``int(num_blocks / blocks per request x max_model_len)``.
"""

from __future__ import annotations

from typing import NamedTuple

from ..model.layers import Compressed

ALIGN = 576  # fp8_ds_mla pages are padded to a multiple of this
BLOCK = 256  # the compressed caches' block (FlashMLA sparse and the indexer: 256 tokens)
SWA_BLOCK = 64
SCALE_BYTES = 8


class Bucket(NamedTuple):
    """Layers of one spec type: their page sizes (bytes: layers) and how a request's blocks grow."""

    name: str
    pages: dict[int, int]
    block: int  # tokens a block holds
    window: int  # 0: every token (the compressed caches); else the tokens it keeps


class Group(NamedTuple):
    bucket: Bucket
    pages: dict[int, int]  # page bytes: layers in this group


class CompressedCache(NamedTuple):
    bytes_per_block: int
    groups: tuple[Group, ...]
    num_blocks: int
    blocks_per_request: int
    logged_tokens: int

    @property
    def bytes_per_token(self) -> float:
        """What each further token of context costs, averaged (the compressed caches' blocks)."""
        return self.bytes_per_block / BLOCK


def row_bytes(c: Compressed) -> int:
    """One cached entry in fp8_ds_mla: the NoPE part in fp8, the RoPE part in bf16, the scales."""
    return (c.head_dim - c.rope_dim) + 2 * c.rope_dim + SCALE_BYTES


def _page(raw: int) -> int:
    return -(-raw // ALIGN) * ALIGN


def buckets(c: Compressed) -> list[Bucket]:
    """The model's spec buckets (vLLM's ``UniformTypeKVCacheSpecs``), each with its layers per page."""
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


def approximate_gcd(values: list[int], lower: int) -> int:
    """vLLM's ``_approximate_gcd``: the repeats per group, from ``lower`` to the largest value, that
    pad the values least when each is rounded up to a multiple of it (ties: the larger)."""
    best, best_pad = lower, None
    for d in range(max(1, lower), max(values) + 1):
        pad = sum((d - x % d) % d for x in values)
        if best_pad is None or pad <= best_pad:
            best, best_pad = d, pad
    return best


def packed_groups(bs: list[Bucket]) -> list[Group]:
    """vLLM's packed groups: a bucket whose page sizes each hold the same number of layers is a
    repeating pattern; such buckets split into groups of ``approximate_gcd`` repeats (at least the
    largest mixed bucket's, which must stay whole); the others stay whole."""

    def balanced(b: Bucket) -> bool:
        return len(set(b.pages.values())) == 1

    def repeats(b: Bucket) -> int:
        return max(b.pages.values())

    floor = max((repeats(b) for b in bs if balanced(b) and len(b.pages) > 1), default=0)
    per_group = approximate_gcd([repeats(b) for b in bs if balanced(b)], floor) if floor else None
    out: list[Group] = []
    for b in bs:
        n = -(-repeats(b) // per_group) if balanced(b) and per_group else 1
        for i in range(n):
            out.append(Group(b, {p: len(range(i, layers, n)) for p, layers in b.pages.items()}))
    return out


def blocks_per_request(b: Bucket, max_model_len: int, in_flight: int) -> int:
    """One group's blocks for a request of ``max_model_len`` tokens: every block of the compressed
    caches; a sliding window's last ``window - 1`` tokens, those in flight, and one block more."""
    if not b.window:
        return -(-max_model_len // b.block)
    return -(-min(b.window - 1 + in_flight, max_model_len) // b.block) + 1


def compressed_cache(
    c: Compressed, kv_cache_bytes: int, max_model_len: int, in_flight: int
) -> CompressedCache:
    """vLLM's blocks, blocks per request of ``max_model_len`` and logged tokens for this model."""
    groups = packed_groups(buckets(c))
    widest = max(sum(p * n for p, n in g.pages.items()) for g in groups)
    per_block = _page(widest)
    num_blocks = max(0, kv_cache_bytes) // per_block
    per_request = sum(blocks_per_request(g.bucket, max_model_len, in_flight) for g in groups)
    logged = int(num_blocks / per_request * max_model_len) if per_request else 0
    return CompressedCache(per_block, tuple(groups), num_blocks, per_request, logged)
