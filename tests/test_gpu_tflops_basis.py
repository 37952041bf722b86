"""The planner's GEMM rate is the one PyTorch reaches: bf16/fp16 GEMMs accumulate in FP32, which GeForce
parts run at half their FP16-accumulate rate (issue 32). Every GeForce row of hwprofile/data/gpus.yaml is
checked against the FP16-accumulate figure it lists beside it, and every row with a rate names its basis."""

from __future__ import annotations

from hwprofile.plan import gpufacts


def test_every_geforce_row_uses_the_fp32_accumulate_rate() -> None:
    geforce = [r for r in gpufacts.table() if str(r["name"]).startswith("GeForce")]
    assert len(geforce) >= 20
    for r in geforce:
        planned, fp16acc = r["fp16_bf16_tensor_tflops_dense"], r["fp16_tensor_tflops_dense_fp16acc"]
        assert abs(planned - fp16acc / 2) <= 0.1, r["name"]
        assert r["tflops_basis"].startswith("FP32 accumulate, half"), r["name"]


def test_every_rate_names_its_basis() -> None:
    for r in gpufacts.table():
        if r.get("fp16_bf16_tensor_tflops_dense") is not None:
            assert "FP32 accumulate" in r["tflops_basis"], r["name"]
            assert "shared/facts/gpus.yaml" in r["tflops_basis"], r["name"]


def test_the_rtx_4090_is_planned_at_165_not_330() -> None:
    row = gpufacts.lookup("NVIDIA GeForce RTX 4090", 23.6)
    assert row is not None and row["fp16_bf16_tensor_tflops_dense"] == 165.2
    assert row["fp16_tensor_tflops_dense_fp16acc"] == 330.3
