"""The attention backend: vLLM's own pick by compute capability, head size and KV dtype
(plan/attention.py), ``engine.attention_backend`` rendered as ``--attention-backend`` where the release
has it, and the Triton unified attention's fixed decode grid in the step cost (plan/predict.py): a long
context read by 16 thread blocks per sequence and KV head in a step of decodes only, by one per block
of queries in a speculative verify, while split-KV kernels stream it at the card's bandwidth."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest

from hwprofile.plan import predict as pm
from hwprofile.plan.attention import Need, pick

FP8 = Path(__file__).resolve().parent.parent / "examples" / "models" / "qwen3.8-27b-fp8"
AWQ = Path(__file__).resolve().parent / "fixtures" / "models" / "qwen2.5-7b-instruct-awq"


@pytest.mark.parametrize(
    ("cc", "need", "backend", "kernel"),
    [
        ("8.6", Need(256), "FLASH_ATTN", "split"),  # RTX 3090, bf16 KV
        ("8.6", Need(256, "fp8"), "FLASHINFER", "split"),  # FlashAttention 2 reads no fp8 KV
        ("9.0", Need(128, "fp8"), "FLASH_ATTN", "split"),  # FlashAttention 3 on Hopper does
        ("9.0", Need(128, "fp8_e5m2"), "FLASHINFER", "split"),  # but only e4m3
        ("10.0", Need(128), "FLASHINFER", "split"),  # Blackwell datacenter: FlashInfer first
        ("8.9", Need(512), "FLASHINFER", "split"),  # a head wider than FlashAttention's 256
        ("8.0", Need(320), "TRITON_ATTN", "triton"),  # neither takes a 320 head
        ("7.0", Need(128), "TRITON_ATTN", "triton"),  # V100: neither runs on Volta
        ("7.5", Need(128), "TRITON_ATTN", "triton"),  # T4: FlashInfer held back below 8.0
        ("8.9", Need(64, sinks=True), "TRITON_ATTN", "triton"),  # gpt-oss on Ada: sinks need FA3 or SM100
        ("9.0", Need(64, sinks=True), "FLASH_ATTN", "split"),  # FA3 on Hopper runs them
        ("8.0", Need(128, dtype="float32"), "TRITON_ATTN", "triton"),  # float32: Triton only
    ],
)
def test_vllms_own_pick(cc: str, need: Need, backend: str, kernel: str) -> None:
    att = pick("auto", cc, need)
    assert att.kernel == kernel and not att.asked and not att.refused
    assert f"vLLM's own pick: {backend}" in att.why


def test_asked_mla_and_unknown() -> None:
    assert pick("TRITON_ATTN", "9.0", Need(128))[:3] == ("TRITON_ATTN", "triton", True)
    assert not pick("TRITON_ATTN", "7.0", Need(320, "fp8")).refused  # Triton runs everything
    # a backend vLLM cannot run for this model and GPU: it would refuse to start, so the plan refuses
    assert "fp8" in pick("FLASH_ATTN", "8.6", Need(256, "fp8")).refused
    assert "8.0" in pick("FLASHINFER", "7.0", Need(128)).refused
    assert "MLA" in pick("TRITON_ATTN", "9.0", Need(576, mla=True)).refused
    assert pick("auto", "7.0", Need(576, mla=True)).kernel == "split"  # vLLM's MLA backends
    unknown = pick("auto", None, Need(128))
    assert unknown.kernel == "split" and "unknown" in unknown.why
    assert not pick("FLASH_ATTN", None, Need(128)).refused  # an unknown GPU: not refused on a guess


def _shape(kernel: str) -> pm.ModelShape:
    # 16 attention layers, 4 KV heads of 256, bf16: 65,536 B per token (Qwen3.8-27B's attention)
    return pm.ModelShape(
        "m", 7 * 10**9, 7 * 10**9, 3_500_000_000, 64, 5120, 24, 256, 65_536, kv_heads=4, attn_layers=16,
        attention_kernel=kernel,
    )  # fmt: skip


GPU = pm.Gpu("RTX 3090", 936.0, 71.2, 24 * 2**30, "test")
LINK = pm.Link("none", 0.0, 0.0, "one GPU")


def test_triton_decode_grid_reads_a_long_context_slowly() -> None:
    split, triton = _shape("split"), _shape("triton")
    ctx = 131_072
    # one sequence, one KV head per GPU (TP 4): 16 thread blocks, each a 16th of its context
    one_head = ctx * 65_536 / 4
    want = one_head / 16 / (pm.TRITON_BLOCK_GBS * 1e9) * 1e3 - one_head / (936e9 * pm.MEM_EFFICIENCY) * 1e3
    t = pm.step_ms(GPU, triton, 4, LINK, 1, ctx)
    s = pm.step_ms(GPU, split, 4, LINK, 1, ctx)
    assert t["attention_wait_ms"] == pytest.approx(want) and want > 5
    assert s["attention_wait_ms"] == 0 and t["total_ms"] == pytest.approx(s["total_ms"] + want)
    # a verify of 3 queries runs the 2D kernel: one thread block reads the whole context
    verify = pm.step_ms(GPU, triton, 4, LINK, 3, 8192, queries=3)
    plain = pm.step_ms(GPU, triton, 4, LINK, 1, 8192)
    assert verify["attention_wait_ms"] > 10 * plain["attention_wait_ms"] > 0
    # short contexts and many sequences: the grid fills the card, the stream governs
    assert pm.step_ms(GPU, triton, 4, LINK, 1, 256)["attention_wait_ms"] < 0.02
    assert pm.step_ms(GPU, triton, 1, LINK, 64, ctx)["attention_wait_ms"] == 0


def test_a_verify_reads_each_sequences_kv_once() -> None:
    """A speculative verify's k + 1 queries of one sequence read its KV together (the memory term), but
    each attends it (the FLOPs)."""
    m = _shape("split")
    one = pm.step_ms(GPU, m, 1, LINK, 1, 65_536)
    three = pm.step_ms(GPU, m, 1, LINK, 3, 65_536, queries=3)
    assert three["memory_ms"] == pytest.approx(one["memory_ms"])
    assert three["compute_ms"] > 2.5 * one["compute_ms"]


def _plan(
    host_of, empty_root, tmp_path: Path, sets: list[str], version: str = "0.26.0", model: Path = FP8
) -> Any:
    from hwprofile.pipeline import make_plan

    host = host_of("rtx3090-2x")
    host = host._replace(software=host.software._replace(vllm_version=version))
    d = tmp_path / ("-".join(sets).replace("=", "_") + version)
    shutil.copytree(model, d)
    base = ["speculative.method=none", "layout.tensor_parallel_size=2", "engine.max_model_len=32768"]
    wl = [
        "layout.workload_input_len=30000",
        "layout.workload_output_len=128",
        "layout.workload_concurrency=1",
    ]
    return make_plan(host, empty_root, environ={}, model=str(d), sets=[*base, *wl, *sets])


def _argv(plan: Any, version: str) -> list[str]:
    from hwprofile.render.translate import render_instance
    from hwprofile.render.versions import release

    return render_instance(plan, plan.instances[0], release(version), "vllm", None).argv


def test_asked_backend_is_rendered_reasoned_and_costed(host_of, empty_root, tmp_path) -> None:
    own = _plan(host_of, empty_root, tmp_path, [])
    why = {r.key: r.reason for r in own.reasons}
    assert "vLLM's own pick: FLASH_ATTN" in why["instances[0].engine.attention_backend"]
    assert "--attention-backend" not in _argv(own, "0.26.0")
    assert not any("Triton" in t["term"] for t in own.instances[0].prediction.terms)

    tri = _plan(host_of, empty_root, tmp_path, ["engine.attention_backend=TRITON_ATTN"])
    argv = _argv(tri, "0.26.0")
    assert argv[argv.index("--attention-backend") + 1] == "TRITON_ATTN"
    assert tri.instances[0].engine.attention_backend == "TRITON_ATTN"
    term = next(t for t in tri.instances[0].prediction.terms if "Triton" in t["term"])
    assert term["ms"] > 0.5 and term["basis"] == "fitted"
    assert tri.instances[0].prediction.tpot_ms > own.instances[0].prediction.tpot_ms + 0.5

    # 0.12 has no --attention-backend (nor Qwen3.8): nothing rendered, vLLM's own pick costed, said
    old = _plan(host_of, empty_root, tmp_path, ["engine.attention_backend=TRITON_ATTN"], "0.12.0", AWQ)
    why = {r.key: r.reason for r in old.reasons}["instances[0].engine.attention_backend"]
    assert "not rendered" in why
    assert "--attention-backend" not in _argv(old, "0.12.0")
    assert not any("Triton" in t["term"] for t in old.instances[0].prediction.terms)

    # a backend vLLM would refuse for this GPU and model: refused with what would work
    from hwprofile.plan import PlanRefused

    with pytest.raises(PlanRefused, match="FlashAttention reads an fp8") as e:
        _plan(
            host_of,
            empty_root,
            tmp_path,
            ["engine.attention_backend=FLASH_ATTN", "engine.kv_cache_dtype=fp8"],
        )
    assert any("auto" in s for s in e.value.suggestions)
