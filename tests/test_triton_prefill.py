"""vLLM's Triton 2D attention kernel over a prompt chunk (hwprofile/plan/predict.py
``_triton_prefill_ms``): bound by its loop's clocks where a tile iteration's MMAs are short (a small head
on a card whose tensor cores do much per clock), by its FLOPs otherwise; the card's SM clocks from the
datasheet (hwprofile/plan/gpufacts.py ``sm_clock_ghz``)."""

from __future__ import annotations

import dataclasses

import pytest

from hwprofile.host.snapshot import Gpu
from hwprofile.model import resolve_model
from hwprofile.plan import candidates, gpufacts
from hwprofile.plan import predict as pm

NONE = pm.Link("none", 0.0, 0.0, "one GPU")


def _gpu(name: str, gib: int) -> pm.Gpu:
    gpu, _ = candidates.gpu_of(Gpu(0, name, memory_total_bytes=gib * 2**30))
    assert gpu is not None
    return gpu


def _shape(model: str, kernel: str) -> pm.ModelShape:
    return candidates.model_shape(resolve_model(model, "model"), 2, attention_kernel=kernel)


@pytest.mark.parametrize(
    ("name", "sms_x_ghz"),
    [
        ("NVIDIA A100-SXM4-80GB", 108 * 1.41),  # GA100: 2048 FLOPs per SM per clock
        ("NVIDIA GeForce RTX 3090", 82 * 1.695),  # GA102: 1024 at FP16 accumulate (the row's 142.3)
        ("NVIDIA H100 80GB HBM3", 132 * 1.83),  # GH100: 4096
        ("NVIDIA L40S", 142 * 2.52),  # AD102: 1024
    ],
)
def test_the_cards_sm_clocks_come_from_its_fp16_accumulate_rate(name: str, sms_x_ghz: float) -> None:
    row = gpufacts.lookup(name)
    assert row is not None
    got = gpufacts.sm_clock_ghz(row)
    assert got == pytest.approx(sms_x_ghz, rel=0.02)  # datasheet rounding
    assert _gpu(name, int(row["memory_gb"])).sm_clock_ghz == got


def test_unknown_sm_clocks_are_none_and_leave_the_step_alone() -> None:
    assert gpufacts.sm_clock_ghz({"compute_capability": "6.1", "fp16_bf16_tensor_tflops_dense": 20}) is None
    assert gpufacts.sm_clock_ghz({"compute_capability": "8.0"}) is None
    gpu, m = _gpu("NVIDIA A100-SXM4-80GB", 80), _shape("openai/gpt-oss-20b", "triton")
    unknown = dataclasses.replace(gpu, sm_clock_ghz=None)
    step = pm.step_ms(unknown, m, 1, NONE, 0, 0.0, 2048, 16000.0)
    assert step["attention_loop_ms"] == 0.0
    split = pm.step_ms(
        unknown, dataclasses.replace(m, attention_kernel="split"), 1, NONE, 0, 0.0, 2048, 16000.0
    )
    assert step["compute_ms"] == split["compute_ms"]
    assert pm.step_ms(gpu, m, 1, NONE, 0, 0.0, 2048, 16000.0)["compute_ms"] > split["compute_ms"]


@pytest.mark.parametrize("name", ["NVIDIA H20", "NVIDIA A10G", "NVIDIA L20"])
def test_a_row_whose_rate_does_not_give_its_sm_clocks_says_unknown(name: str) -> None:
    row = gpufacts.lookup(name)
    assert row is not None and "sm_clock_ghz" in row
    assert gpufacts.sm_clock_ghz(row) is None


def test_a_small_head_on_an_a100_is_bound_by_the_loop_not_the_flops() -> None:
    gpu, m = _gpu("NVIDIA A100-SXM4-80GB", 80), _shape("openai/gpt-oss-20b", "triton")
    split = dataclasses.replace(m, attention_kernel="split")
    chunk, ctx = 2048, 16000.0
    tri = pm.step_ms(gpu, m, 1, NONE, 0, 0.0, chunk, ctx)
    fa = pm.step_ms(gpu, split, 1, NONE, 0, 0.0, chunk, ctx)
    rate = gpu.tflops * 1e12 * gpu.compute_efficiency
    attn_ms = pm._attention_reads(m, 1, 0, 0, 0.0, chunk, ctx, 0.0)[1] / rate * 1e3
    assert tri["attention_loop_ms"] > 2 * attn_ms  # the loop, several times the MMAs' time
    # the step pays the loop in place of the chunk's attention FLOPs, nothing else changes
    assert tri["compute_ms"] - fa["compute_ms"] == pytest.approx(tri["attention_loop_ms"] - attn_ms)
    assert fa["attention_loop_ms"] == 0.0
    # the loop grows with the context the full layers attend; a windowed kind stops at its window
    assert m.kv_kinds and any(w for _, _, _, w, _ in m.kv_kinds)
    unwindowed = dataclasses.replace(m, kv_kinds=tuple((n, b, h, 0, d) for n, b, h, _, d in m.kv_kinds))
    whole = pm._triton_prefill_ms(gpu, unwindowed, 1, chunk, ctx)
    assert tri["attention_loop_ms"] < 0.55 * whole  # half its layers walk 128 keys, not 16,000
    longer = pm.step_ms(gpu, m, 1, NONE, 0, 0.0, chunk, 2 * ctx)["attention_loop_ms"]
    assert longer > 1.9 * tri["attention_loop_ms"]
    # ... and a decode-only step has none
    assert pm.step_ms(gpu, m, 1, NONE, 64, ctx)["attention_loop_ms"] == 0.0


def test_the_loop_counts_query_blocks_kv_heads_and_tiles() -> None:
    gpu = _gpu("NVIDIA A100-SXM4-80GB", 80)
    base = dataclasses.replace(
        _shape("Qwen/Qwen3-8B", "triton"), kv_kinds=(), layers=10, attn_layers=10, heads=32, kv_heads=8
    )
    clocks = pm.TRITON_ITER_CLOCKS / (gpu.sm_clock_ghz * 1e9) * 1e3  # one iteration, ms
    ctx = 32 * 99.5  # 100 tiles on average per query block (the last one partial)
    # 4 query heads per KV head: 16 rows = 4 positions per block; 8 KV heads on one GPU
    got = pm._triton_prefill_ms(gpu, base, 1, 400, ctx)
    assert got == pytest.approx(10 * (400 / 4) * 8 * 100 * clocks)
    # TP 4: two KV heads on each GPU
    assert pm._triton_prefill_ms(gpu, base, 4, 400, ctx) == pytest.approx(got / 4)
    # 32 query heads per KV head: a block of 32 rows, one position each
    mqa = dataclasses.replace(base, kv_heads=1)
    assert pm._triton_prefill_ms(gpu, mqa, 1, 400, ctx) == pytest.approx(10 * 400 * 1 * 100 * clocks)
    # TP 8 over 4 KV heads: each rank holds one KV head (replicated) and 4 query heads: 4 positions a block
    gqa4 = dataclasses.replace(base, kv_heads=4)
    assert pm._triton_prefill_ms(gpu, gqa4, 8, 400, ctx) == pytest.approx(10 * (400 / 4) * 1 * 100 * clocks)
    # MQA at TP 4: 8 query heads on each rank over its one KV head: 2 positions a block
    assert pm._triton_prefill_ms(gpu, mqa, 4, 400, ctx) == pytest.approx(10 * (400 / 2) * 1 * 100 * clocks)


def test_a_large_head_on_a_geforce_card_stays_flops_bound() -> None:
    """Qwen3.8 (head 256) on RTX 3090s: a tile's MMAs outlast its loop; the step is unchanged (issue 38's
    TRITON_ATTN points kept their prefill)."""
    gpu = _gpu("NVIDIA GeForce RTX 3090", 24)
    m = _shape("Qwen/Qwen3.8-27B-FP8", "triton")
    split = dataclasses.replace(m, attention_kernel="split")
    for tp, ctx in ((4, 16000.0), (4, 64000.0), (2, 32000.0)):
        tri = pm.step_ms(gpu, m, tp, NONE, 0, 0.0, 8192, ctx)
        assert tri["attention_loop_ms"] > 0
        assert tri["compute_ms"] == pytest.approx(
            pm.step_ms(gpu, split, tp, NONE, 0, 0.0, 8192, ctx)["compute_ms"]
        )


def test_the_prefill_term_says_where_the_loop_comes_from() -> None:
    gpu, m = _gpu("NVIDIA A100-SXM4-80GB", 80), _shape("openai/gpt-oss-20b", "triton")
    cand = pm.Candidate(1, 1, 1, 256, 2048, True, 10**6, NONE)
    pred = pm.predict(gpu, m, cand, pm.Workload(32000, 100, 1), None)
    prefill = [t for t in pred.terms if t["term"].startswith("prefill")]
    assert prefill and f"{pm.TRITON_ITER_CLOCKS:g} SM clocks per 32-key tile" in prefill[0]["source"]
    assert "152 G SM-clocks/s" in prefill[0]["source"]  # the A100's 108 SMs x 1.41 GHz
    unknown = pm.predict(
        dataclasses.replace(gpu, sm_clock_ghz=None), m, cand, pm.Workload(32000, 100, 1), None
    )
    assert (
        "the loop not costed" in next(t for t in unknown.terms if t["term"].startswith("prefill"))["source"]
    )
