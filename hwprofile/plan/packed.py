"""vLLM's packed KV cache groups (pure): where a model's layers keep pages of several sizes and its
backends lay the cache out block-outermost (BLNHC, BLHNC), vLLM packs the pages side by side in one
block (``_get_packed_kv_cache_groups``, v1/core/kv_cache_planning.py, 0.33):

- the layers fall into buckets of one spec type (``UniformTypeKVCacheSpecs``);
- a bucket whose page sizes each hold the same number of layers is a repeating pattern; those split
  into groups of the same number of repeats (``_approximate_gcd``, at least the largest bucket that
  mixes page sizes, which stays whole);
- a state bucket (Mamba states, circular buffers; sliding windows where no pattern sets the split)
  is split further so that a group fits the block the others already need (the anchor) rather than
  widening it;
- a block is as wide as the widest group's pages, rounded up to the pages' alignments; each group is
  a column of the one pool, and a request takes blocks in every group.

Used by DeepSeek V4's cache (:mod:`.compressed`) and Qwen4-Exp's QSA hybrids (:mod:`.memory`).
"""

from __future__ import annotations

from typing import NamedTuple


class Bucket(NamedTuple):
    """Layers of one spec type: their page sizes (bytes: layers) and how a request's blocks grow."""

    name: str
    pages: dict[int, int]
    block: int  # tokens a block holds
    window: int  # 0: every token; else the tokens it keeps (a sliding window)
    state: bool = False  # Mamba states and circular buffers: split to fit the block, never widen it
    fixed: int = 0  # blocks a request holds whatever its length (state slots; a ring's one)


class Group(NamedTuple):
    bucket: Bucket
    pages: dict[int, int]  # page bytes: layers in this group

    @property
    def bytes(self) -> int:
        return sum(p * n for p, n in self.pages.items())


def approximate_gcd(values: list[int], lower: int) -> int:
    """vLLM's ``_approximate_gcd``: the repeats per group, from ``lower`` to the largest value, that
    pad the values least when each is rounded up to a multiple of it (ties: the larger)."""
    best, best_pad = lower, None
    for d in range(max(1, lower), max(values) + 1):
        pad = sum((d - x % d) % d for x in values)
        if best_pad is None or pad <= best_pad:
            best, best_pad = d, pad
    return best


def _balanced(b: Bucket) -> bool:
    return len(set(b.pages.values())) == 1


def _repeats(b: Bucket) -> int:
    return max(b.pages.values())


def _widest(b: Bucket, n: int) -> int:
    """Page bytes of the largest of the ``n`` groups ``b`` splits into."""
    return sum(-(-layers // n) * page for page, layers in b.pages.items())


def packed_groups(bs: list[Bucket]) -> list[Group]:
    """The groups vLLM packs ``bs`` into, in bucket order."""
    floor = max((_repeats(b) for b in bs if _balanced(b) and len(b.pages) > 1), default=0)
    per_group = approximate_gcd([_repeats(b) for b in bs if _balanced(b)], floor) if floor else None

    def groups_of(b: Bucket) -> int:
        return -(-_repeats(b) // per_group) if _balanced(b) and per_group else 1

    def is_state(b: Bucket) -> bool:  # a sliding window too where no pattern sets the split
        return b.state or (per_group is None and b.window > 0)

    anchor = max((_widest(b, sum(b.pages.values()) if is_state(b) else groups_of(b)) for b in bs), default=0)
    out: list[Group] = []
    for b in bs:
        n = groups_of(b)
        if anchor and is_state(b):  # as many states a group as the block already holds
            per_block = max(anchor // min(b.pages), 1)
            n = max(n, -(-sum(b.pages.values()) // per_block))
        for i in range(n):
            out.append(Group(b, {p: len(range(i, layers, n)) for p, layers in b.pages.items()}))
    return out


def bytes_per_block(groups: list[Group], align: int = 1) -> int:
    """A block: the widest group's pages, rounded up to a multiple of ``align``."""
    widest = max(g.bytes for g in groups)
    return -(-widest // align) * align


def blocks_per_request(b: Bucket, max_model_len: int, in_flight: int) -> int:
    """One group's blocks for a request of ``max_model_len`` tokens: a state's fixed pages; every
    block of a cache that keeps every token; a sliding window's last ``window - 1`` tokens, those in
    flight, and one block more."""
    if b.fixed:
        return b.fixed
    if not b.window:
        return -(-max_model_len // b.block)
    return -(-min(b.window - 1 + in_flight, max_model_len) // b.block) + 1


def logged_tokens(num_blocks: int, per_request: int, max_model_len: int) -> int:
    """vLLM's ``KV cache size: N tokens`` (``get_kv_cache_capacity``)."""
    return int(num_blocks / per_request * max_model_len) if per_request else 0


__all__ = [
    "Bucket",
    "Group",
    "approximate_gcd",
    "blocks_per_request",
    "bytes_per_block",
    "logged_tokens",
    "packed_groups",
]
