"""Speculation on a hybrid model (recurrent-state layers), pure: where it pays, what it costs in
resident sequences, and what vLLM gets wrong when it is combined with prefix caching.

- Each running request holds ``1 + k`` state pages per state group (``2 + k`` with prefix caching;
  ``MambaSpec.max_memory_usage_bytes``), whatever the method (ngram included): speculation cuts the
  sequences whose state the pool holds. Operators measured MTP paying below ~8 concurrent short
  requests and plain batching winning above (../shared/facts/hybrid.md): with
  ``speculative.method: auto`` and a workload of more than :data:`SPECULATION_PAYS_BELOW` requests in
  flight per host, a hybrid runs without speculation.
- MTP together with prefix caching corrupted the recurrent state (vllm#43559): prefix caching is
  left off where MTP runs on a hybrid.
"""

from __future__ import annotations

import dataclasses

from ..config.settings import Settings
from ..model import ModelFacts
from .context import PlanContext
from .memory import HybridOpts, hybrid_kv_cache, is_hybrid
from .reasons import Reasons

SPECULATION_PAYS_BELOW = 8  # concurrent requests (operators' measurements, hybrid.md)


def by_load(
    ctx: PlanContext, model: ModelFacts, spec_method: str | None, draft: ModelFacts | None
) -> tuple[str | None, ModelFacts | None]:
    """``(method, draft)``: none on a hybrid where ``speculative.method`` is auto and the workload has
    more requests in flight than speculation pays at; else as chosen."""
    settings = ctx.settings
    if spec_method is None or not is_hybrid(model) or settings.speculative.method != "auto":
        return spec_method, draft
    load = settings.layout.workload_concurrency
    if load <= SPECULATION_PAYS_BELOW:
        return spec_method, draft
    ctx.add(
        "speculative.method",
        None,
        f"{spec_method} off: the workload has {load} requests in flight (layout.workload_concurrency), above "
        f"the ~{SPECULATION_PAYS_BELOW} where speculation pays on a hybrid; each running sequence would hold "
        f"{settings.speculative.num_speculative_tokens} more state pages per state group, fewer stay "
        "resident (operators' measurements: docs/qwen3.8-27b.md)",
        ("layout", "workload_concurrency"),
    )
    return None, None


SPEC_UTIL_CAP = 0.93  # hybrid.md, operators: a hybrid's decode workspace under speculation outgrows profiling
SHIPPED_KINDS = ("builtin", "default")  # a shipped profile's value or the schema's (not the user's own)


def speculation_headroom(
    ctx: PlanContext, model: ModelFacts, util: float, spec_method: str | None, key: str, name: str
) -> float:
    """``gpu_memory_utilization`` for a hybrid that speculates: at most 0.93 where a shipped value asked
    for more (the decode workspace with speculation grows past what vLLM's profiling run saw: the
    operators of Qwen3.8 keep 0.93, hybrid.md); a user's own value is kept, with a warning."""
    if not spec_method or not is_hybrid(model) or util <= SPEC_UTIL_CAP:
        return util
    src = ctx.reasons.provenance.get(("engine", "gpu_memory_utilization"))
    why = (
        f"speculation ({spec_method}) on a hybrid: its decode workspace grows past what vLLM's profiling "
        f"run measured, so the pool must leave room (operators keep {SPEC_UTIL_CAP}, hybrid.md)"
    )
    if src is not None and src.kind not in SHIPPED_KINDS:
        ctx.warn(f"{name}: gpu_memory_utilization {util} ({src}) leaves no headroom for {why}")
        return util
    ctx.add(
        f"{key}.engine.gpu_memory_utilization",
        SPEC_UTIL_CAP,
        f"lowered from {util}: {why}",
        ("engine", "gpu_memory_utilization"),
    )
    return SPEC_UTIL_CAP


def mtp_prefix_caching(
    ctx: PlanContext, model: ModelFacts, spec_method: str | None, key: str, name: str
) -> Settings:
    """The context's settings with prefix caching off where MTP runs on a hybrid (vllm#43559)."""
    settings = ctx.settings
    if spec_method != "mtp" or not is_hybrid(model) or not settings.engine.enable_prefix_caching:
        return settings
    ctx.add(
        f"{key}.engine.enable_prefix_caching",
        False,
        "off: MTP speculation with prefix caching corrupted a hybrid's recurrent state (vllm#43559); "
        "it also saves one state page per state group per running sequence (mamba_cache_mode none)",
        ("engine", "enable_prefix_caching"),
    )
    ctx.warn(f"{name}: prefix caching left off beside MTP on a hybrid model (vllm#43559)")
    return dataclasses.replace(
        settings, engine=dataclasses.replace(settings.engine, enable_prefix_caching=False)
    )


def state_cost(
    model: ModelFacts,
    hybrid: HybridOpts,
    spec_method: str | None,
    kv_cache_bytes: int,
    length: int,
    tp: int,
    kv_dtype_bytes: int,
    r: Reasons,
    key: str,
) -> None:
    """The reason that says what speculation costs a hybrid in resident sequences."""
    if not spec_method or not hybrid.num_spec:
        return

    def seqs(opts: HybridOpts) -> int:
        h = hybrid_kv_cache(
            model, kv_cache_bytes, length, tp=tp, kv_dtype_bytes=kv_dtype_bytes, **opts._asdict()
        )
        return h.state_blocks

    with_spec = seqs(hybrid)
    without = seqs(hybrid._replace(num_spec=0, mtp_attention_layers=0))
    r.add(
        f"{key}.speculative.state_cost",
        with_spec,
        f"{spec_method} with k={hybrid.num_spec}: each running sequence holds {hybrid.num_spec} more state "
        f"pages per state group; {with_spec} sequences' state fit the pool instead of {without} without it "
        f"(a lever for few users: it pays below ~{SPECULATION_PAYS_BELOW} concurrent requests)",
    )
