"""Quantized checkpoints under tensor parallelism, as vLLM checks them: a rank's share of an MLP must
be whole FP8 blocks (``validate_fp8_block_shape``: a row-parallel down-projection's input in
``block_k``) or whole integer weight groups (AWQ's "input size is not aligned",
``verify_group_size_divides_partition``); routed experts too (``validate_fp8_block_shape_moe``), unless
the release refines an ``fp8`` checkpoint's MoE blocks to a finer grid (``refine_fp8_moe_block_shape``:
the gcd of the blocks, the share and the hidden size, at least 32; read in 0.29-0.33, absent in 0.25,
0.27 and 0.28; compressed-tensors never refines), or AWQ/GPTQ falls back to the MoE WNA16 kernels'
halved groups. The plan refuses what vLLM refuses, names the block or group, and offers a degree vLLM
takes."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

import hwprofile
from hwprofile.model import parse_config
from hwprofile.plan.tpsplit import tp_refusal

FP8 = {"quant_method": "fp8", "activation_scheme": "dynamic", "weight_block_size": [128, 128]}
CT_BLOCK = {
    "quant_method": "compressed-tensors",
    "format": "float-quantized",
    "config_groups": {
        "group_0": {
            "targets": ["Linear"],
            "weights": {"num_bits": 8, "type": "float", "strategy": "block", "block_structure": [128, 128]},
            "input_activations": {"num_bits": 8, "type": "float", "strategy": "token", "dynamic": True},
        }
    },
    "ignore": ["lm_head"],
}


def _moe(quant: dict[str, Any], **over: Any) -> dict[str, Any]:
    """The catalog's Qwen3-30B-A3B (768-wide experts, hidden 2048) with ``quant``."""
    doc = yaml.safe_load((Path(hwprofile.__file__).parent / "data" / "models.yaml").read_text())
    cfg = next(m["config"] for m in doc["models"] if m["name"] == "Qwen/Qwen3-30B-A3B")
    return {**cfg, "quantization_config": quant} | over


def test_a_share_of_whole_blocks_or_a_refined_grid() -> None:
    m = parse_config(_moe(FP8), "q30", "test", None)
    assert m.quant_grid is not None and m.quant_grid.block == (128, 128)
    assert m.quant_grid.expert_width == 768
    assert tp_refusal(m, 2) is None  # 384: three blocks
    # TP4: 192 a rank; gcd(128, 128, 192, 2048) = 64: refined on 0.29+, refused before
    assert tp_refusal(m, 4, refine=True) is None
    why = tp_refusal(m, 4, refine=False)
    assert why is not None and "192 a rank" in why and "does not refine" in why
    # TP8: 96 a rank; the gcd is 32: still refined
    assert tp_refusal(m, 8, refine=True) is None
    # compressed-tensors' FP8 MoE validates without refining
    ct = parse_config(_moe(CT_BLOCK), "q30ct", "test", None)
    assert ct.quant_grid is not None and ct.quant_grid.block == (128, 128)
    ct_why = tp_refusal(ct, 4, refine=True)
    assert ct_why is not None and "validate_fp8_block_shape_moe" in ct_why
    # an unquantized or per-tensor FP8 checkpoint has no blocks to split
    assert parse_config(_moe({"quant_method": "fp8"}), "q", "test", None).quant_grid is None
    assert (
        parse_config(
            {k: v for k, v in _moe(FP8).items() if k != "quantization_config"}, "q", "t", None
        ).quant_grid
        is None
    )


def test_a_dense_mlp_is_never_refined() -> None:
    """A dense MLP (here a shared expert 512 wide) splits into whole blocks or vLLM refuses it, on
    every release: the down-projection's input is checked (Qwen3-Next-80B-A3B-FP8 at TP8: 64 a rank)."""
    cfg = _moe(FP8, moe_intermediate_size=512, shared_expert_intermediate_size=512, model_type="qwen2_moe")
    cfg["architectures"] = ["Qwen2MoeForCausalLM"]
    m = parse_config(cfg, "next", "test", None)
    assert m.quant_grid is not None and 512 in m.quant_grid.mlp_widths
    assert tp_refusal(m, 4, refine=True) is None  # 128 a rank
    why = tp_refusal(m, 8, refine=True)
    assert why is not None and "MLP 512 wide is 64 a rank" in why and "validate_fp8_block_shape" in why


def test_the_plan_refuses_what_vllm_refuses_and_offers_what_it_takes(
    host_of, empty_root, tmp_path: Path
) -> None:
    from hwprofile.pipeline import make_plan
    from hwprofile.plan.refusal import PlanRefused

    d = tmp_path / "q30-fp8"
    d.mkdir()
    (d / "config.json").write_text(json.dumps(_moe(FP8)))
    base = host_of("h100-sxm-8x")
    old = base._replace(software=base.software._replace(vllm_version="0.28.0"))
    new = base._replace(software=base.software._replace(vllm_version="0.33.0"))
    with pytest.raises(PlanRefused, match=r"tensor_parallel_size=4 .*FP8 blocks \(128 x 128\)") as refused:
        make_plan(old, empty_root, environ={}, model=str(d), sets=["layout.tensor_parallel_size=4"])
    assert "--set layout.tensor_parallel_size=2" in refused.value.suggestions
    plan = make_plan(new, empty_root, environ={}, model=str(d), sets=["layout.tensor_parallel_size=4"])
    assert all(i.tensor_parallel_size == 4 for i in plan.instances)
    # left to itself on 0.28 the plan takes no degree vLLM would refuse
    auto = make_plan(old, empty_root, environ={}, model=str(d), sets=[])
    assert all(i.tensor_parallel_size in (1, 2) for i in auto.instances)


def _qwen2_72b_awq(intermediate: int) -> dict[str, Any]:
    """Qwen2-72B-Instruct-AWQ's shape: 29,568 wide (231 groups of 128), or 29,696 as Qwen re-published
    it so that TP 2, 4 and 8 split whole groups (vllm#21695, Qwen's quantization guide)."""
    return {
        "architectures": ["Qwen2ForCausalLM"],
        "model_type": "qwen2",
        "hidden_size": 8192,
        "intermediate_size": intermediate,
        "num_hidden_layers": 80,
        "num_attention_heads": 64,
        "num_key_value_heads": 8,
        "vocab_size": 152064,
        "torch_dtype": "float16",
        "quantization_config": {"quant_method": "awq", "bits": 4, "group_size": 128, "zero_point": True},
    }


def test_int4_weight_groups_split_whole_or_vllm_refuses(host_of, empty_root, tmp_path: Path) -> None:
    """AWQ/GPTQ/compressed-tensors int4 groups: "The input size is not aligned with the quantized weight
    shape. This can be caused by too large tensor parallel size." at TP 2 for 29,568 (231 groups)."""
    from hwprofile.pipeline import make_plan
    from hwprofile.plan.refusal import PlanRefused

    m = parse_config(_qwen2_72b_awq(29568), "q72", "test", None)
    assert m.quant_grid is not None and m.quant_grid.block == (1, 128) and not m.quant_grid.fp8
    why = tp_refusal(m, 2)
    assert why is not None and "weight groups of 128" in why and "29568 wide is 14784 a rank" in why
    padded = parse_config(_qwen2_72b_awq(29696), "q72p", "test", None)
    assert all(tp_refusal(padded, t) is None for t in (2, 4, 8))
    # MXFP4 experts are padded to a kernel tile, not refused (gpt-oss-120b at TP8: 360 a rank)
    from hwprofile.model.resolve import resolve_model

    assert tp_refusal(resolve_model("openai/gpt-oss-120b", "model"), 8) is None
    d = tmp_path / "q72-awq"
    d.mkdir()
    (d / "config.json").write_text(json.dumps(_qwen2_72b_awq(29568)))
    host = host_of("a800-pcie-4x-2numa")
    with pytest.raises(PlanRefused, match="weight groups of 128"):
        make_plan(host, empty_root, environ={}, model=str(d), sets=["layout.tensor_parallel_size=2"])
    # the shipped A800 profile's TP 2 gives way, and says so; an operator's is refused (above)
    plan = make_plan(host, empty_root, environ={}, model=str(d), sets=[])
    assert all(i.tensor_parallel_size == 1 for i in plan.instances)
    assert any("gives way to 1" in w and "weight groups of 128" in w for w in plan.warnings)
    # the layout's own line does not claim the setting chose TP 1
    objective = next(x.reason for x in plan.reasons if x.key.startswith("layout.objective"))
    assert "as layout.tensor_parallel_size says" not in objective
    assert "tensor_parallel_size=2 gave way" in objective, objective


def test_awq_and_gptq_experts_fall_back_to_smaller_groups() -> None:
    """AWQ and GPTQ MoE layers whose share is not whole groups run on the MoE WNA16 kernels, which halve
    the group down to 32 until it divides the share and the hidden size (moe_wna16.py): Qwen3-30B-A3B-AWQ
    at TP4 (192 a rank: groups of 64) and TP8 (96: groups of 32) load. compressed-tensors' WNA16 MoE
    refuses the same share; bitsandbytes has no grid (vLLM splits no pre-quantized bnb)."""
    awq = {"quant_method": "awq", "bits": 4, "group_size": 128, "zero_point": True, "version": "gemm"}
    m = parse_config(_moe(awq), "q30awq", "test", None)
    assert m.quant_grid is not None and m.quant_grid.expert_width == 768
    assert tp_refusal(m, 4) is None and tp_refusal(m, 8) is None
    wide = parse_config(_moe(awq, moe_intermediate_size=720, hidden_size=2880), "odd", "test", None)
    assert tp_refusal(wide, 8) is not None  # 90 a rank: no group of 32 or more divides it
    ct = {
        "quant_method": "compressed-tensors",
        "format": "pack-quantized",
        "config_groups": {
            "group_0": {
                "targets": ["Linear"],
                "weights": {"num_bits": 4, "type": "int", "strategy": "group", "group_size": 128},
            }
        },
        "ignore": ["lm_head"],
    }
    why = tp_refusal(parse_config(_moe(ct), "q30ct4", "test", None), 4)
    assert why is not None and "weight groups of 128" in why and "compressed-tensors" in why
    bnb = {"quant_method": "bitsandbytes", "load_in_4bit": True, "bnb_4bit_quant_type": "nf4"}
    assert parse_config(_moe(bnb), "bnb", "test", None).quant_grid is None


def test_experts_split_evenly_whatever_their_format() -> None:
    """vLLM's FusedMoEConfig asserts the expert width divides by the TP degree, quantized or not."""
    cfg = _moe(FP8, moe_intermediate_size=1000)
    cfg.pop("quantization_config")
    m = parse_config(cfg, "odd", "test", None)
    assert tp_refusal(m, 8) is None
    why = tp_refusal(m, 16)
    assert why is not None and "1000 does not split 16 ways" in why
