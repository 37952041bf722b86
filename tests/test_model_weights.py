"""Weights as vLLM loads them (hwprofile.model.weights): parameters per layer kind and bytes per
quantization format, on config-only copies of current models (tests/fixtures/models, SOURCE.md
there says where each config and each expected number comes from), and against the parameter
tensors transformers itself builds for the same configs (on the meta device: no memory, no weights).
"""

from __future__ import annotations

import json
import math
import time
from pathlib import Path
from typing import Any

import pytest
from vllmtools import DEEPSEEK_V3, TINY_LFM2

from hwprofile.model import parse_config, read_model_dir
from hwprofile.model.defaults import with_class_defaults
from hwprofile.model.quant import read_quant
from hwprofile.model.weights import (
    LayerKind,
    count_params,
    layer_kinds,
    tensors,
    weights_bytes,
)

GiB = 1 << 30
MODELS = Path(__file__).parent / "fixtures" / "models"


def _cfg(name: str) -> dict[str, Any]:
    return json.loads((MODELS / name / "config.json").read_text())


def _kinds_from_layer_types(cfg: dict[str, Any]) -> list[LayerKind]:
    """The test's own reading of a Qwen3.5-style layer list (independent of weights.layer_kinds)."""
    types = cfg["text_config"]["layer_types"]
    return [LayerKind("gdn" if t == "linear_attention" else "full", "dense") for t in types]


# --------------------------------------------------------------------------- Qwen3.8-27B


def test_qwen38_layer_kinds_from_its_layer_types() -> None:
    cfg = _cfg("qwen3.8-27b")
    kinds = layer_kinds(cfg)
    assert kinds == _kinds_from_layer_types(cfg)
    assert [k.mixer for k in kinds].count("gdn") == 48 and [k.mixer for k in kinds].count("full") == 16
    # without layer_types, full_attention_interval says the same
    text = {k: v for k, v in cfg["text_config"].items() if k != "layer_types"}
    assert layer_kinds({**cfg, "text_config": text}) == kinds


def test_qwen38_params_per_part_equal_the_published_breakdown() -> None:
    """hybrid.md: 27,781,427,952 parameters = decoder 24.35 B + embedding 1.27 B + LM head 1.27 B
    (untied) + vision 0.46 B (460.7 M) + MTP 0.42 B."""
    cfg = _cfg("qwen3.8-27b")
    p = count_params(cfg, _kinds_from_layer_types(cfg))
    assert p.total == 27_781_427_952
    assert p.embed == p.lm_head == 248_320 * 5120
    assert p.vision == 460_730_096
    assert p.decoder / 1e9 == pytest.approx(24.35, abs=0.005)
    assert p.mtp / 1e9 == pytest.approx(0.42, abs=0.005)
    assert p.total == p.decoder + p.embed + p.lm_head + p.vision + p.mtp
    assert p.active == p.decoder + p.embed + p.lm_head  # dense: everything but vision and MTP
    facts = read_model_dir(MODELS / "qwen3.8-27b")
    assert facts.params == p.total and facts.active_params == p.active
    assert facts.weights_bytes_source == "estimate"


def test_qwen38_bf16_weights() -> None:
    """vLLM loads 51.75 GiB (27.78 B parameters at 2 bytes) with the vision tower (0.858 GiB) and
    the MTP layer; --language-model-only leaves the tower out."""
    cfg = _cfg("qwen3.8-27b")
    kinds = _kinds_from_layer_types(cfg)
    w = weights_bytes(cfg, kinds)
    assert w.total == 2 * 27_781_427_952
    assert w.total / GiB == pytest.approx(51.75, rel=0.05)
    assert w.by_part["vision"] / GiB == pytest.approx(0.858, rel=0.01)
    lang = weights_bytes(cfg, kinds, language_only=True)
    assert lang.total == w.total - w.by_part["vision"] and lang.by_part["vision"] == 0
    assert w.loaded(language_only=True) == lang.total
    assert w.method is None and w.bits is None
    facts = read_model_dir(MODELS / "qwen3.8-27b")
    assert facts.weights_bytes == w.total
    assert (facts.vision_bytes, facts.mtp_bytes) == (w.by_part["vision"], w.by_part["mtp"])
    assert facts.quant_method is None and facts.bits == 16


def test_qwen38_int4_compressed_tensors_pack_quantized() -> None:
    """The W4A16 checkpoint people serve on 24 GB cards: ~16.6 GiB loaded language-only."""
    cfg = _cfg("qwen3.8-27b-int4-autoround")
    kinds = _kinds_from_layer_types(cfg)
    w = weights_bytes(cfg, kinds)
    assert w.method == "compressed-tensors" and w.bits == 4
    assert w.loaded(language_only=True, mtp=False) / GiB == pytest.approx(16.6, rel=0.05)
    facts = read_model_dir(MODELS / "qwen3.8-27b-int4-autoround")
    assert (facts.quant_method, facts.quant_bits, facts.bits) == ("compressed-tensors", 4, 4)
    assert facts.weights_bytes == w.total
    assert facts.weights_bytes < 0.36 * read_model_dir(MODELS / "qwen3.8-27b").weights_bytes
    # the ignore list: lm_head, the vision tower, the MTP head and every in_proj_a/b stay 16-bit
    q = read_quant(cfg)
    by_name = {t.name: t for t in tensors(cfg, kinds)}
    bits = {n: q.scheme(t).bits for n, t in by_name.items() if t.linear}
    assert bits["lm_head"] == 16
    assert bits["model.language_model.layers.0.linear_attn.in_proj_a"] == 16
    assert bits["model.language_model.layers.62.linear_attn.in_proj_b"] == 16
    assert bits["model.language_model.layers.0.linear_attn.in_proj_qkv"] == 4
    assert bits["model.language_model.layers.3.self_attn.q_proj"] == 4
    assert bits["model.language_model.layers.63.mlp.down_proj"] == 4
    assert {b for n, b in bits.items() if n.startswith(("model.visual", "mtp."))} == {16}
    # group 128, bf16 scales: 4.125 bits per quantized weight
    t = by_name["model.language_model.layers.0.mlp.gate_proj"]
    assert q.scheme(t).nbytes(t) == t.params * (0.5 + 2 / 128)


def test_qwen38_fp8_block() -> None:
    cfg = _cfg("qwen3.8-27b-fp8")
    kinds = _kinds_from_layer_types(cfg)
    w = weights_bytes(cfg, kinds)
    assert (w.method, w.bits) == ("fp8", 8)
    assert w.loaded(language_only=True, mtp=False) / GiB == pytest.approx(27.6, rel=0.05)
    # one float32 scale per 128x128 block on top of one byte per weight
    q = read_quant(cfg)
    t = next(t for t in tensors(cfg, kinds) if t.name.endswith("layers.0.mlp.up_proj"))
    assert q.scheme(t).nbytes(t) == t.params + math.ceil(17408 / 128) * (5120 // 128) * 4
    facts = read_model_dir(MODELS / "qwen3.8-27b-fp8")
    assert (facts.quant_method, facts.quant_bits) == ("fp8", 8)


def test_the_three_checkpoints_rank_as_their_bits() -> None:
    sizes = [
        read_model_dir(MODELS / n).weights_bytes
        for n in ("qwen3.8-27b-int4-autoround", "qwen3.8-27b-fp8", "qwen3.8-27b")
    ]
    assert sizes == sorted(sizes) and len(set(sizes)) == 3


# --------------------------------------------------------------------------- other current models


def test_nemotron_h_hybrid_pattern_mamba2_moe_attention() -> None:
    """Nemotron-3-Nano-30B-A3B: 31.6 B total, 3.6 B active with embeddings, ~59 GiB in bf16 (it was
    estimated at 190.6 GiB when its layer pattern was not read)."""
    cfg = _cfg("nemotron-3-nano-30b-a3b")
    kinds = layer_kinds(cfg)
    pattern = cfg["hybrid_override_pattern"]
    assert len(kinds) == len(pattern) == 52
    assert sum(k.mixer == "mamba2" for k in kinds) == pattern.count("M") == 23
    assert sum(k.mlp == "moe" for k in kinds) == pattern.count("E") == 23
    assert sum(k.mixer == "full" for k in kinds) == pattern.count("*") == 6
    p = count_params(cfg, kinds)
    assert p.total / 1e9 == pytest.approx(31.6, rel=0.01)
    assert p.active / 1e9 == pytest.approx(3.6, rel=0.05)
    facts = read_model_dir(MODELS / "nemotron-3-nano-30b-a3b")
    assert facts.params == p.total and facts.active_params == p.active
    assert facts.weights_bytes / GiB == pytest.approx(59, rel=0.10)
    assert facts.weights_bytes / GiB < 62  # one A100 80G holds it


def test_gpt_oss_mxfp4_experts_with_their_scales() -> None:
    """openai/gpt-oss-20b: 20.9 B parameters; its safetensors index says total_size 13,761,264,768:
    the experts at 4 bits plus one uint8 scale per 32, attention/router/embeddings in bf16."""
    facts = read_model_dir(MODELS / "gpt-oss-20b")
    assert facts.params / 1e9 == pytest.approx(20.9, rel=0.01)
    assert facts.weights_bytes == pytest.approx(13_761_264_768, rel=0.10)
    assert facts.weights_bytes == 13_761_264_768  # every tensor as the checkpoint stores it
    assert (facts.quant_method, facts.quant_bits) == ("mxfp4", 4)
    cfg = _cfg("gpt-oss-20b")
    q = read_quant(cfg)
    ts = tensors(cfg, layer_kinds(cfg))
    attn = next(t for t in ts if t.name.endswith("layers.0.self_attn.q_proj"))
    expert = next(t for t in ts if t.name.endswith("layers.0.mlp.experts.down_proj"))
    assert q.scheme(attn).bits == 16
    assert q.scheme(expert).nbytes(expert) == expert.params * (0.5 + 1 / 32)


@pytest.mark.parametrize("name", ["qwen2.5-7b-instruct-awq", "qwen2.5-7b-instruct-gptq-int4"])
def test_awq_gptq_params_and_method(name: str) -> None:
    facts = read_model_dir(MODELS / name)
    assert facts.params / 1e9 == pytest.approx(7.61, rel=0.01)  # Qwen2.5-7B's published 7.61 B
    assert facts.quant_bits == 4 and facts.quant_method in ("awq", "gptq")
    # 4-bit decoder, 16-bit embedding and LM head (1.09 B parameters each)
    assert 5.0 * GiB < facts.weights_bytes < 5.4 * GiB


def _packed_layout_bytes(model: Any, method: str, group: int, bits: int) -> int:
    """An AutoAWQ (WQLinear_GEMM) or AutoGPTQ (QuantLinear) checkpoint's bytes, from the modules
    transformers builds: per nn.Linear of the decoder qweight int32 [in, out*bits/32] (AWQ) or
    [in*bits/32, out] (GPTQ), qzeros int32 [in/group, out*bits/32], scales fp16 [in/group, out],
    GPTQ's g_idx int32 [in], biases fp16; everything else (embeddings, norms, lm_head) fp16."""
    import torch

    total = 0
    linear_params = set()
    for name, mod in model.named_modules():
        if isinstance(mod, torch.nn.Linear) and name != "lm_head":
            i, o = mod.in_features, mod.out_features
            groups = i // group
            total += i * o * bits // 8 + groups * o * bits // 8 + groups * o * 2
            total += 4 * i if method == "gptq" else 0
            total += 2 * o if mod.bias is not None else 0
            linear_params |= {f"{name}.weight", f"{name}.bias"}
    total += sum(2 * p.numel() for n, p in model.named_parameters() if n not in linear_params)
    return total


@pytest.mark.parametrize("name", ["qwen2.5-7b-instruct-awq", "qwen2.5-7b-instruct-gptq-int4"])
def test_awq_gptq_bytes_equal_their_tensor_layout(name: str) -> None:
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    cfg = _cfg(name)
    q = cfg["quantization_config"]
    plain = {k: v for k, v in cfg.items() if k != "quantization_config"}
    with torch.device("meta"):
        model = transformers.Qwen2ForCausalLM(transformers.Qwen2Config(**plain))
    want = _packed_layout_bytes(model, q["quant_method"], q["group_size"], q["bits"])
    got = weights_bytes(cfg, layer_kinds(cfg)).total
    assert got == pytest.approx(want, rel=0.001)


# --------------------------------------------------------------------------- transformers as the oracle


def _hf_count(cfg_cls: str, model_cls: str, cfg: dict[str, Any]) -> int:
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    if not hasattr(transformers, model_cls):
        pytest.skip(f"transformers {transformers.__version__} has no {model_cls}")
    conf = getattr(transformers, cfg_cls)(**cfg) if cfg_cls else transformers.AutoConfig.for_model(**cfg)
    with torch.device("meta"):
        model = getattr(transformers, model_cls)._from_config(conf)
    n = sum(p.numel() for p in model.parameters())
    # router biases transformers keeps as buffers but checkpoints (and vLLM) hold as weights
    return n + sum(b.numel() for k, b in model.named_buffers() if k.endswith("e_score_correction_bias"))


def test_qwen38_against_transformers_own_modules() -> None:
    """transformers' Qwen3_5ForConditionalGeneration built from the fixture: every parameter but
    the MTP layer (transformers has no MTP module; vLLM's qwen3_5_mtp.py builds it)."""
    cfg = _cfg("qwen3.8-27b")
    p = count_params(cfg, layer_kinds(cfg))
    assert _hf_count("", "Qwen3_5ForConditionalGeneration", cfg) == p.total - p.mtp


def test_nemotron_against_transformers_own_modules() -> None:
    cfg = _cfg("nemotron-3-nano-30b-a3b")
    assert _hf_count("", "NemotronHForCausalLM", cfg) == count_params(cfg, layer_kinds(cfg)).total


TINY: dict[str, tuple[str, str, dict[str, Any]]] = {
    # GDN (fused in_proj_qkvz / in_proj_ba) + gated attention + MoE with a gated shared expert
    "qwen3_next": (
        "Qwen3NextConfig",
        "Qwen3NextForCausalLM",
        {
            "hidden_size": 128,
            "intermediate_size": 256,
            "moe_intermediate_size": 64,
            "shared_expert_intermediate_size": 96,
            "num_hidden_layers": 8,
            "num_attention_heads": 4,
            "num_key_value_heads": 2,
            "head_dim": 64,
            "linear_num_key_heads": 2,
            "linear_num_value_heads": 4,
            "linear_key_head_dim": 64,
            "linear_value_head_dim": 64,
            "num_experts": 4,
            "num_experts_per_tok": 2,
            "vocab_size": 1000,
        },
    ),
    # Qwen3.5 dense and MoE text models (split in_proj_qkv / z / b / a)
    "qwen3_5": (
        "Qwen3_5TextConfig",
        "Qwen3_5ForCausalLM",
        {
            "hidden_size": 128,
            "intermediate_size": 256,
            "num_hidden_layers": 4,
            "num_attention_heads": 4,
            "num_key_value_heads": 2,
            "head_dim": 64,
            "linear_num_key_heads": 2,
            "linear_num_value_heads": 4,
            "linear_key_head_dim": 64,
            "linear_value_head_dim": 64,
            "vocab_size": 1000,
        },
    ),
    "qwen3_5_moe": (
        "Qwen3_5MoeTextConfig",
        "Qwen3_5MoeForCausalLM",
        {
            "hidden_size": 128,
            "moe_intermediate_size": 64,
            "shared_expert_intermediate_size": 96,
            "num_hidden_layers": 4,
            "num_attention_heads": 4,
            "num_key_value_heads": 2,
            "head_dim": 64,
            "linear_num_key_heads": 2,
            "linear_num_value_heads": 4,
            "linear_key_head_dim": 64,
            "linear_value_head_dim": 64,
            "num_experts": 4,
            "num_experts_per_tok": 2,
            "vocab_size": 1000,
        },
    ),
    # Granite-4 hybrid: Mamba2 + attention, every layer MoE with an ungated-router shared MLP
    "granitemoehybrid": (
        "GraniteMoeHybridConfig",
        "GraniteMoeHybridForCausalLM",
        {
            "hidden_size": 128,
            "intermediate_size": 256,
            "num_hidden_layers": 4,
            "num_attention_heads": 4,
            "num_key_value_heads": 2,
            "layer_types": ["mamba", "mamba", "attention", "mamba"],
            "mamba_n_heads": 8,
            "mamba_d_head": 32,
            "mamba_d_state": 16,
            "mamba_n_groups": 1,
            "num_local_experts": 4,
            "num_experts_per_tok": 2,
            "shared_intermediate_size": 96,
            "vocab_size": 1000,
        },
    ),
    # ERNIE 4.5 MoE: MoE layers from moe_layer_start_index every moe_layer_interval, up to
    # moe_layer_end_index; moe_num_experts routed (moe_k a token) and moe_num_shared_experts shared
    "ernie4_5_moe": (
        "Ernie4_5_MoeConfig",
        "Ernie4_5_MoeForCausalLM",
        {
            "hidden_size": 128,
            "intermediate_size": 256,
            "num_hidden_layers": 6,
            "num_attention_heads": 4,
            "num_key_value_heads": 2,
            "head_dim": 32,
            "moe_num_experts": 8,
            "moe_k": 2,
            "moe_num_shared_experts": 2,
            "moe_intermediate_size": 64,
            "moe_layer_start_index": 1,
            "moe_layer_end_index": 4,
            "moe_layer_interval": 1,
            "vocab_size": 1000,
        },
    ),
    # HunYuan-A13B: its MoE keys one value per layer (moe_topk, moe_intermediate_size,
    # num_shared_expert), a dense shared MLP beside the experts (use_mixed_mlp_moe), QK norms
    "hunyuan_v1_moe": (
        "HunYuanMoEV1Config",
        "HunYuanMoEV1ForCausalLM",
        {
            "hidden_size": 128,
            "intermediate_size": 64,
            "num_hidden_layers": 4,
            "num_attention_heads": 4,
            "num_key_value_heads": 2,
            "head_dim": 32,
            "num_experts": 8,
            "moe_topk": [2] * 4,
            "moe_intermediate_size": [64] * 4,
            "num_shared_expert": [1] * 4,
            "use_mixed_mlp_moe": True,
            "use_qk_norm": True,
            "vocab_size": 1000,
        },
    ),
    # Gemma-3n: per-layer inputs (their own embedding and projections), AltUp's streams, LAuReL, the
    # MLP width one a layer (config.json as transformers writes it), the last layers reusing KV
    "gemma3n": (
        "Gemma3nTextConfig",
        "Gemma3nForCausalLM",
        {
            "hidden_size": 128,
            "intermediate_size": [256, 256, 192, 192, 256, 256],
            "num_hidden_layers": 6,
            "num_attention_heads": 4,
            "num_key_value_heads": 2,
            "head_dim": 32,
            "vocab_size": 1000,
            "vocab_size_per_layer_input": 900,
            "hidden_size_per_layer_input": 16,
            "num_kv_shared_layers": 2,
            "layer_types": ["sliding_attention", "full_attention"] * 3,
            "activation_sparsity_pattern": [0.0] * 6,
            "laurel_rank": 8,
            "altup_num_inputs": 4,
        },
    ),
    # LFM2: gated short convolutions (conv_dim wide) + attention; the MLP two thirds of
    # intermediate_size, rounded up to block_multiple_of (with a multiplier that moves it)
    "lfm2": (
        "Lfm2Config",
        "Lfm2ForCausalLM",
        {
            **TINY_LFM2,
            "intermediate_size": 400,
            "block_ffn_dim_multiplier": 1.3,
            "vocab_size": 1000,
        },
    ),
    # Zamba2: a Mamba2 mixer in every layer, one shared attention + MLP block (2 x hidden wide) called
    # by both hybrid layers, each hybrid layer with its own projection and q/k/v/MLP adapters
    "zamba2": (
        "Zamba2Config",
        "Zamba2ForCausalLM",
        {
            "hidden_size": 64,
            "intermediate_size": 160,
            "num_hidden_layers": 5,
            "layers_block_type": ["mamba", "hybrid", "mamba", "mamba", "hybrid"],
            "num_attention_heads": 4,
            "n_mamba_heads": 4,
            "mamba_d_state": 16,
            "num_mem_blocks": 1,
            "use_shared_attention_adapter": True,
            "adapter_rank": 8,
            "vocab_size": 1000,
        },
    ),
    # LFM2-MoE: the first num_dense_layers dense, MoE after; the convolution as wide as hidden
    "lfm2_moe": (
        "Lfm2MoeConfig",
        "Lfm2MoeForCausalLM",
        {
            "hidden_size": 128,
            "intermediate_size": 256,
            "moe_intermediate_size": 64,
            "num_experts": 4,
            "num_experts_per_tok": 2,
            "num_dense_layers": 2,
            "num_hidden_layers": 5,
            "num_attention_heads": 4,
            "num_key_value_heads": 2,
            "layer_types": ["conv", "conv", "full_attention", "conv", "conv"],
            "conv_L_cache": 3,
            "vocab_size": 1000,
        },
    ),
}


@pytest.mark.parametrize("family", sorted(TINY))
def test_hybrid_families_equal_transformers_parameter_count(family: str) -> None:
    pytest.importorskip("transformers")
    import transformers

    cfg_cls, model_cls, kw = TINY[family]
    d = getattr(transformers, cfg_cls)(**kw).to_dict()
    d.pop("mtp_num_hidden_layers", None)  # transformers builds no MTP layers
    d = with_class_defaults(d)  # as config.json is read (HunYuan's per-layer lists: one value)
    p = count_params(d, layer_kinds(d))
    assert p.total == _hf_count(cfg_cls, model_cls, kw)
    moe = any(k.mlp == "moe" for k in layer_kinds(d))
    assert (p.active < p.total) == moe


# --------------------------------------------------------------------------- quantization formats


def _base() -> dict[str, Any]:
    return {
        "model_type": "qwen3",
        "hidden_size": 1024,
        "intermediate_size": 3072,
        "num_hidden_layers": 2,
        "num_attention_heads": 8,
        "num_key_value_heads": 4,
        "head_dim": 128,
        "vocab_size": 4096,
    }


def _bytes(q: dict[str, Any] | None) -> int:
    cfg = {**_base(), **({"quantization_config": q} if q else {})}
    return weights_bytes(cfg, layer_kinds(cfg)).total


def test_amd_quark_fp8_int4_mxfp4_per_layer_patterns_and_exclude() -> None:
    """AMD Quark checkpoints (``quark.py``): the global weight spec, ``layer_quant_config``'s
    fnmatch patterns before it, ``exclude`` at 16 bits. Bytes as each layout stores them: FP8 per
    tensor (one fp32 scale), UINT4 per group of 128 (bf16 scale and a 4-bit zero point), MXFP4
    (one 8-bit exponent per 32)."""
    cfg = _base()
    linear = 2 * (1024 * (1024 + 2 * 512 + 1024) + 3 * 1024 * 3072)  # q, k, v, o and the MLP, 2 layers
    bf16 = _bytes(None)
    rest = bf16 - 2 * linear  # embeddings, LM head and norms stay 16-bit

    def quark(weight: dict[str, Any], **extra: Any) -> int:
        return _bytes({"quant_method": "quark", "global_quant_config": {"weight": weight}, **extra})

    fp8 = quark({"dtype": "fp8_e4m3", "qscheme": "per_tensor"})
    assert fp8 == rest + linear + 14 * 4  # 7 linear tensors a layer, one fp32 scale each
    uint4 = quark({"dtype": "uint4", "qscheme": "per_group", "group_size": 128, "symmetric": False})
    assert uint4 == rest + linear // 2 + linear // 128 * (2 + 0.5)
    mxfp4 = quark({"dtype": "fp4", "qscheme": "per_group", "group_size": 32})
    assert mxfp4 == rest + linear // 2 + linear // 32
    mxfp6 = quark({"dtype": "fp6_e3m2", "qscheme": "per_group", "group_size": 32})
    assert mxfp6 == rest + linear * 6 // 8 + linear // 32
    # the attention excluded (a re: expression), the MLP's down projection at FP8 by its own
    # pattern; exclude entries are exact names or re: expressions, never shell patterns
    attn = 2 * 1024 * (1024 + 2 * 512 + 1024)
    down = 2 * 3072 * 1024
    mixed = quark(
        {"dtype": "fp4", "qscheme": "per_group", "group_size": 32},
        exclude=["re:.*self_attn.*"],
        layer_quant_config={"*down_proj": {"weight": {"dtype": "fp8_e4m3", "qscheme": "per_tensor"}}},
    )
    other = linear - attn - down
    assert mixed == rest + 2 * attn + down + 2 * 4 + other // 2 + other // 32
    globbed = quark({"dtype": "fp4", "qscheme": "per_group", "group_size": 32}, exclude=["*self_attn*"])
    assert globbed == mxfp4  # a shell pattern names no module: nothing excluded
    unread = weights_bytes({**cfg, "quantization_config": {"quant_method": "quark"}}, layer_kinds(cfg))
    assert unread.total == bf16 and "16 bits assumed" in " ".join(
        read_quant({"quantization_config": {"quant_method": "quark"}}).notes
    )


def test_formats_order_by_their_bits_and_scales() -> None:
    bf16 = _bytes(None)
    nvfp4 = _bytes(
        {"quant_method": "modelopt", "quant_algo": "NVFP4", "group_size": 16, "exclude_modules": ["lm_head"]}
    )
    w4 = _bytes({"quant_method": "awq", "bits": 4, "group_size": 128, "zero_point": True})
    w8 = _bytes(
        {
            "quant_method": "compressed-tensors",
            "format": "int-quantized",
            "config_groups": {
                "g": {"targets": ["Linear"], "weights": {"num_bits": 8, "strategy": "channel"}}
            },
        }
    )
    fp8 = _bytes({"quant_method": "fp8", "activation_scheme": "dynamic"})
    bnb4 = _bytes({"quant_method": "bitsandbytes", "load_in_4bit": True, "bnb_4bit_quant_type": "nf4"})
    assert w4 < nvfp4 < w8 < bf16 and w4 < bnb4 < w8 and fp8 < bf16
    # 4.5 bits either way: an fp8 scale per 16 (NVFP4), an fp32 absmax per 64 (nf4)
    assert bnb4 == pytest.approx(nvfp4, rel=0.001)
    assert abs(w8 - fp8) < 0.01 * fp8  # one byte per weight either way; channel vs tensor scales


def test_compressed_tensors_groups_targets_and_regex_ignore() -> None:
    """Mixed precision: the first config group whose targets match a layer decides; ``re:``
    patterns match from the name's start (vLLM's re.match), exact names exactly."""
    cfg = {
        **_base(),
        "quantization_config": {
            "quant_method": "compressed-tensors",
            "format": "pack-quantized",
            "config_groups": {
                "attn": {
                    "targets": ["re:.*self_attn\\..*"],
                    "weights": {"num_bits": 8, "strategy": "channel"},
                },
                "rest": {
                    "targets": ["Linear"],
                    "weights": {"num_bits": 4, "strategy": "group", "group_size": 64},
                },
            },
            "ignore": ["model.layers.1.mlp.down_proj", "re:.*up_proj$", "re:mlp"],
        },
    }
    q = read_quant(cfg)
    bits = {t.name: q.scheme(t).bits for t in tensors(cfg, layer_kinds(cfg)) if t.linear}
    assert bits["model.layers.0.self_attn.q_proj"] == 8
    assert bits["model.layers.0.mlp.gate_proj"] == 4
    assert bits["model.layers.0.mlp.down_proj"] == 4 and bits["model.layers.1.mlp.down_proj"] == 16
    assert bits["model.layers.0.mlp.up_proj"] == 16
    assert q.bits == 8  # the widest group


def test_autoround_extra_config_and_gptq_dynamic() -> None:
    cfg = {
        **_base(),
        "quantization_config": {
            "quant_method": "auto-round",
            "bits": 4,
            "group_size": 128,
            "sym": True,
            "extra_config": {
                "model.layers.0.self_attn.q_proj": {"bits": 16},
                "model.layers.1.mlp.down_proj": {"bits": 8, "group_size": 32},
            },
        },
    }
    q = read_quant(cfg)
    got = {t.name: q.scheme(t) for t in tensors(cfg, layer_kinds(cfg)) if t.linear}
    assert got["model.layers.0.self_attn.q_proj"].bits == 16
    assert (got["model.layers.1.mlp.down_proj"].bits, got["model.layers.1.mlp.down_proj"].group) == (8, 32)
    assert got["model.layers.1.mlp.up_proj"].bits == 4
    gptq = {
        **_base(),
        "quantization_config": {
            "quant_method": "gptq",
            "bits": 4,
            "group_size": 128,
            "dynamic": {"-:.*mlp\\.gate_proj": {}},
        },
    }
    q = read_quant(gptq)
    got = {t.name: q.scheme(t).bits for t in tensors(gptq, layer_kinds(gptq)) if t.linear}
    assert got["model.layers.0.mlp.gate_proj"] == 16 and got["model.layers.0.mlp.up_proj"] == 4


def test_modelopt_fnmatch_exclusions_and_fp8_skip_lists() -> None:
    cfg = {
        **_base(),
        "quantization_config": {
            "quant_method": "modelopt",
            "quant_algo": "NVFP4",
            "group_size": 16,
            "exclude_modules": ["lm_head", "model.layers.*.self_attn*"],
        },
    }
    q = read_quant(cfg)
    got = {t.name: q.scheme(t).bits for t in tensors(cfg, layer_kinds(cfg)) if t.linear}
    assert got["model.layers.1.self_attn.o_proj"] == 16 and got["model.layers.1.mlp.up_proj"] == 4
    fp8 = {
        **_base(),
        "quantization_config": {
            "quant_method": "fp8",
            "weight_block_size": [128, 128],
            "modules_to_not_convert": ["model.layers.0.mlp"],
        },
    }
    q = read_quant(fp8)
    got = {t.name: q.scheme(t).bits for t in tensors(fp8, layer_kinds(fp8)) if t.linear}
    assert got["model.layers.0.mlp.up_proj"] == 16 and got["model.layers.1.mlp.up_proj"] == 8


def test_hostile_patterns_and_huge_ignore_lists_stay_fast() -> None:
    """A regex RE2 cannot compile matches nothing (no crash); a catastrophic-backtracking pattern
    runs in linear time; tens of thousands of exact names are a set look-up."""
    names = [f"model.layers.{i}.mlp.experts.{e}.up_proj" for i in range(400) for e in range(100)]
    cfg = {
        **_base(),
        "quantization_config": {
            "quant_method": "compressed-tensors",
            "config_groups": {
                "g": {
                    "targets": ["Linear"],
                    "weights": {"num_bits": 4, "group_size": 128, "strategy": "group"},
                }
            },
            "ignore": [*names, "re:(?=lookahead)", "re:(a+)+$" + "x" * 10, "re:^model\\.layers\\.0\\..*"],
        },
    }
    start = time.process_time()
    w = weights_bytes(cfg, layer_kinds(cfg))
    assert time.process_time() - start < 20  # measured well under a second
    q = read_quant(cfg)
    got = {t.name: q.scheme(t).bits for t in tensors(cfg, layer_kinds(cfg)) if t.linear}
    assert got["model.layers.0.mlp.up_proj"] == 16 and got["model.layers.1.mlp.up_proj"] == 4
    assert w.bits == 4


def test_unknown_layer_symbols_are_a_clear_refusal(tmp_path: Path) -> None:
    from hwprofile.config import ConfigError

    cfg = {**_cfg("nemotron-3-nano-30b-a3b"), "hybrid_override_pattern": "M*EQ" * 13}
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(
        ConfigError,
        match=r"json: NemotronHForCausalLM: hybrid_override_pattern must be 52 characters of M, \*, - and E",
    ):
        read_model_dir(tmp_path)
    gdn = _cfg("qwen3.8-27b")
    gdn["text_config"] = {k: v for k, v in gdn["text_config"].items() if k != "linear_num_value_heads"}
    (tmp_path / "config.json").write_text(json.dumps(gdn))
    with pytest.raises(ConfigError, match=r"Qwen3_5ForConditionalGeneration: .*linear_num_value_heads"):
        read_model_dir(tmp_path)


def test_modelopt_config_groups_export_and_a_bad_vision_config(tmp_path: Path) -> None:
    """ModelOpt's config.json export (compressed-tensors-like groups, shell-pattern ignore list)."""
    cfg = {
        **_base(),
        "quantization_config": {
            "quant_method": "modelopt",
            "quant_algo": "NVFP4",
            "ignore": ["lm_head", "model.layers.0.*"],
            "config_groups": {
                "g": {
                    "targets": ["Linear"],
                    "weights": {"num_bits": 4, "type": "float", "group_size": 16, "strategy": "tensor_group"},
                }
            },
        },
    }
    q = read_quant(cfg)
    got = {t.name: q.scheme(t) for t in tensors(cfg, layer_kinds(cfg)) if t.linear}
    assert got["model.layers.0.mlp.up_proj"].bits == 16
    assert (got["model.layers.1.mlp.up_proj"].bits, got["model.layers.1.mlp.up_proj"].group) == (4, 16)
    from hwprofile.config import ConfigError

    bad = {**_cfg("qwen3.8-27b")}
    bad["vision_config"] = {**bad["vision_config"], "depth": "27"}
    (tmp_path / "config.json").write_text(json.dumps(bad))
    with pytest.raises(ConfigError, match=r"vision_config\.depth: expected a non-negative integer"):
        read_model_dir(tmp_path)


def test_deepseek_v3_mla_moe_and_its_mtp_layer() -> None:
    """DeepSeek-V3's config.json (MLA, 256 routed + 1 shared expert, 3 dense layers, noaux_tc router
    bias, one MTP layer with its own embedding and head copies): the model card's 671 B main model +
    14 B MTP module = 685 B, 37 B activated; the FP8 block checkpoint holds ~1 byte per parameter."""
    cfg = {
        "architectures": ["DeepseekV3ForCausalLM"],
        "model_type": "deepseek_v3",
        "hidden_size": 7168,
        "intermediate_size": 18432,
        "moe_intermediate_size": 2048,
        "num_hidden_layers": 61,
        "num_attention_heads": 128,
        "num_key_value_heads": 128,
        "n_routed_experts": 256,
        "n_shared_experts": 1,
        "num_experts_per_tok": 8,
        "first_k_dense_replace": 3,
        "moe_layer_freq": 1,
        "kv_lora_rank": 512,
        "q_lora_rank": 1536,
        "qk_rope_head_dim": 64,
        "qk_nope_head_dim": 128,
        "v_head_dim": 128,
        "topk_method": "noaux_tc",
        "vocab_size": 129280,
        "num_nextn_predict_layers": 1,
        "tie_word_embeddings": False,
        "quantization_config": {
            "activation_scheme": "dynamic",
            "fmt": "e4m3",
            "quant_method": "fp8",
            "weight_block_size": [128, 128],
        },
    }
    kinds = layer_kinds(cfg)
    assert [k.mlp for k in kinds[:4]] == ["dense", "dense", "dense", "moe"] and {k.mixer for k in kinds} == {
        "mla"
    }
    p = count_params(cfg, kinds)
    assert (p.total - p.mtp) / 1e9 == pytest.approx(671, rel=0.01)
    assert p.total / 1e9 == pytest.approx(685, rel=0.01)
    assert p.active / 1e9 == pytest.approx(37, rel=0.03)
    w = weights_bytes(cfg, kinds)
    assert w.total == pytest.approx(p.total, rel=0.01)  # fp8 experts and projections, bf16 embeddings


# meta-llama/Llama-4-Scout-17B-16E's text config: a text-only fine-tune's config.json quoted in vllm#20581
# (Llama4ForCausalLM), the rest as a public test mirrors unsloth/Llama-4-Scout-17B-16E's text_config
LLAMA4_SCOUT_TEXT = {
    "architectures": ["Llama4ForCausalLM"],
    "model_type": "llama4_text",
    "attention_chunk_size": 8192,
    "head_dim": 128,
    "hidden_size": 5120,
    "interleave_moe_layer_step": 1,
    "intermediate_size": 8192,
    "intermediate_size_mlp": 16384,
    "no_rope_layers": [1, 1, 1, 0] * 12,
    "num_attention_heads": 40,
    "num_experts_per_tok": 1,
    "num_hidden_layers": 48,
    "num_key_value_heads": 8,
    "num_local_experts": 16,
    "tie_word_embeddings": False,
    "use_qk_norm": True,
    "vocab_size": 202048,
}


def test_llama4_shared_expert_and_dense_layers_of_their_own_width() -> None:
    """Llama 4 (vLLM llama4.py): every MoE layer has a shared expert of ``intermediate_size`` beside its
    routed experts (Llama4MoE.shared_expert), and a dense layer's MLP is ``intermediate_size_mlp`` wide.
    Scout's text model, counted by hand: 48 x (attention 62,914,560 + router 81,920 + 16 experts
    2,013,265,920 + shared expert 125,829,120 + norms 10,240) + embedding and head 2 x 1,034,485,760 +
    final norm 5,120 = 107,769,861,120; the Hub's safetensors total for the model with its vision tower
    is 108,641,793,536."""
    kinds = layer_kinds(LLAMA4_SCOUT_TEXT)
    p = count_params(LLAMA4_SCOUT_TEXT, kinds)
    assert p.total == 107_769_861_120
    assert p.active == p.total - 48 * 15 * 3 * 5120 * 8192  # one routed expert of 16 read per token
    maverick_like = {**LLAMA4_SCOUT_TEXT, "interleave_moe_layer_step": 2, "num_hidden_layers": 2}
    dense, moe = layer_kinds(maverick_like)
    assert (dense.mlp, moe.mlp) == ("dense", "moe")
    mlp = [t for t in tensors(maverick_like, [dense]) if ".mlp." in t.name and t.name.endswith("_proj")]
    assert {t.rows * t.cols for t in mlp} == {16384 * 5120}


# moonshotai/Kimi-Linear-48B-A3B-Instruct's config.json fields as a public package copies them verbatim
# (its DEPENDED_FIELDS); tie_word_embeddings false as the model's remote-code config defaults
KIMI_LINEAR_48B = {
    "architectures": ["KimiLinearForCausalLM"],
    "model_type": "kimi_linear",
    "hidden_size": 2304,
    "intermediate_size": 9216,
    "num_attention_heads": 32,
    "num_key_value_heads": 32,
    "num_hidden_layers": 27,
    "vocab_size": 163840,
    "hidden_act": "silu",
    "kv_lora_rank": 512,
    "q_lora_rank": None,
    "qk_nope_head_dim": 128,
    "qk_rope_head_dim": 64,
    "v_head_dim": 128,
    "linear_attn_config": {
        "head_dim": 128,
        "num_heads": 32,
        "short_conv_kernel_size": 4,
        "kda_layers": [1, 2, 3, 5, 6, 7, 9, 10, 11, 13, 14, 15, 17, 18, 19, 21, 22, 23, 25, 26],
        "full_attn_layers": [4, 8, 12, 16, 20, 24, 27],
    },
    "num_experts": 256,
    "num_experts_per_token": 8,
    "num_shared_experts": 1,
    "moe_intermediate_size": 1024,
    "first_k_dense_replace": 1,
    "moe_layer_freq": 1,
    "num_nextn_predict_layers": 0,
    "tie_word_embeddings": False,
}


def test_kimi_linear_shared_expert_from_num_shared_experts() -> None:
    """Kimi-Linear names its shared experts ``num_shared_experts`` (vLLM kimi_k3 KimiMoE: one MLP of
    ``moe_intermediate_size x num_shared_experts``), not DeepSeek's ``n_shared_experts``. By hand:
    7 MLA layers x 29,114,880 + 20 KDA layers x 39,514,272 + 26 MoE MLPs x (router 589,824 + 256
    experts 1,811,939,328 + shared 7,077,888) + 1 dense MLP 63,700,992 + norms 27 x 4,608 + embedding
    and head 2 x 377,487,360 + final norm 2,304 = 49,122,675,072 (the card's "48B")."""
    kinds = layer_kinds(KIMI_LINEAR_48B)
    p = count_params(KIMI_LINEAR_48B, kinds)
    assert p.total == 49_122_675_072
    shared = [t for t in tensors(KIMI_LINEAR_48B, kinds) if ".shared_experts." in t.name]
    assert len(shared) == 26 * 3 and {t.rows * t.cols for t in shared} == {1024 * 2304}


def test_modelopt_mixed_precision_groups_without_a_strategy() -> None:
    """ModelOpt's MIXED_PRECISION config.json (NVIDIA's NVFP4 hybrids: FP8 dense layers, NVFP4 routed
    experts) writes its groups without ``strategy``: a group size means group scales (compressed-tensors'
    rule), so an NVFP4 expert keeps one fp8 scale per 16 weights (4.5 bits a weight), not 4 bits."""
    cfg = {
        **_cfg("nemotron-3-nano-30b-a3b"),
        "quantization_config": {
            "quant_method": "modelopt",
            "quant_algo": "MIXED_PRECISION",
            "config_groups": {
                "group_0": {
                    "weights": {"dynamic": False, "num_bits": 8, "type": "float"},
                    "targets": ["backbone.layers.0.mixer.in_proj"],
                },
                "group_1": {
                    "weights": {"dynamic": False, "group_size": 16, "num_bits": 4, "type": "float"},
                    "targets": ["backbone.layers.1.mixer.experts.0.up_proj"],
                },
            },
            "quantized_layers": {
                "backbone.layers.0.mixer.in_proj": {"quant_algo": "FP8"},
                "backbone.layers.1.mixer.experts.0.up_proj": {"quant_algo": "NVFP4", "group_size": 16},
            },
        },
    }
    q = read_quant(cfg)
    by_name = {t.name: t for t in tensors(cfg, layer_kinds(cfg))}
    expert = by_name["backbone.layers.1.mixer.experts.0.up_proj"]
    scheme = q.scheme(expert)
    assert (scheme.bits, scheme.group, scheme.scale_bytes, scheme.per_tensor) == (4, 16, 1.0, False)
    n = expert.rows * expert.cols
    assert scheme.nbytes(expert) == pytest.approx(expert.count * (n / 2 + n / 16 + 4))
    fp8 = q.scheme(by_name["backbone.layers.0.mixer.in_proj"])
    assert (fp8.bits, fp8.per_tensor) == (8, True)


def test_modelopt_mixed_precision_without_quantized_layers_is_refused() -> None:
    """vLLM's ModelOptMixedPrecisionConfig reads each layer's algorithm from quantized_layers (at the
    top of quantization_config, or under its quantization key) and refuses a checkpoint without them:
    hwprofile refuses it too, naming the key, instead of planning a model that does not load."""
    from hwprofile.model import parse_config

    groups = {"g": {"weights": {"num_bits": 8, "type": "float"}, "targets": ["Linear"]}}
    base = _cfg("nemotron-3-nano-30b-a3b")
    for q in (
        {"quant_method": "modelopt", "quant_algo": "MIXED_PRECISION", "config_groups": groups},
        {
            "quant_method": "modelopt",
            "quantization": {"quant_algo": "mixed_precision", "quantized_layers": {}},
        },
    ):
        with pytest.raises(ValueError, match=r"MIXED_PRECISION without a quantized_layers mapping"):
            parse_config({**base, "quantization_config": q}, "nemotron", "dir", None)
    nested = {
        "quant_algo": "MIXED_PRECISION",
        "quantized_layers": {"backbone.layers.0.mixer.in_proj": {"quant_algo": "FP8"}},
    }
    parse_config(
        {**base, "quantization_config": {"quant_method": "modelopt", "quantization": nested}},
        "n",
        "dir",
        None,
    )


# google/gemma-3-27b-it's config.json as a public test reproduces it (GEMMA3_27B_CONFIG; its layer count and
# window restored to the model's 62 and 1024, as the text-only copies of the same config give them); as
# published, it has neither layer_types nor sliding_window_pattern
GEMMA3_27B = {
    "architectures": ["Gemma3ForConditionalGeneration"],
    "boi_token_index": 255999,
    "eoi_token_index": 256000,
    "eos_token_id": [1, 106],
    "image_token_index": 262144,
    "mm_tokens_per_image": 256,
    "model_type": "gemma3",
    "text_config": {
        "head_dim": 128,
        "hidden_size": 5376,
        "intermediate_size": 21504,
        "model_type": "gemma3_text",
        "num_attention_heads": 32,
        "num_hidden_layers": 62,
        "num_key_value_heads": 16,
        "query_pre_attn_scalar": 168,
        "rope_scaling": {"factor": 8.0, "rope_type": "linear"},
        "sliding_window": 1024,
    },
    "torch_dtype": "bfloat16",
    "vision_config": {
        "hidden_size": 1152,
        "image_size": 896,
        "intermediate_size": 4304,
        "model_type": "siglip_vision_model",
        "num_attention_heads": 16,
        "num_hidden_layers": 27,
        "patch_size": 14,
        "vision_use_head": False,
    },
}


def test_keys_left_out_as_their_class_defaults() -> None:
    """Gemma 3's text_config has no vocab_size and no tie_word_embeddings: transformers wrote them out
    as Gemma3TextConfig's defaults (262,208 tokens, tied), which is what vLLM loads. Read so, the model
    is the Hub's 27,432,406,640 parameters; read as missing, it was 26.02 B (no embedding) and an untied
    head would have added 1.41 B."""
    from hwprofile.model import parse_config

    m = parse_config(GEMMA3_27B, "gemma-3-27b-it", "dir", None)
    assert (m.vocab_size, m.tie_word_embeddings) == (262208, True)
    assert m.params == pytest.approx(27_432_406_640, rel=1e-4)
    untied = {**GEMMA3_27B, "text_config": {**GEMMA3_27B["text_config"], "tie_word_embeddings": False}}
    assert parse_config(untied, "g", "dir", None).params - m.params == 262208 * 5376


def test_gemma3_as_published_has_a_full_layer_every_sixth() -> None:
    """Without layer_types or sliding_window_pattern, Gemma3TextConfig derives layer_types from its
    default pattern 6, and vLLM's gemma3.py reads them: 52 sliding and 10 full layers of 62. Read as a
    model-wide window (every layer sliding), a 128K request needed 3.1x too little KV."""
    from hwprofile.model import parse_config
    from hwprofile.model.defaults import with_class_defaults
    from hwprofile.model.layers import layer_stack

    m = parse_config(GEMMA3_27B, "gemma-3-27b-it", "dir", None)
    assert (m.sliding_layers, m.sliding_window, m.max_position_embeddings) == (52, 1024, 131072)
    stack = layer_stack(with_class_defaults(GEMMA3_27B))  # as parse_config reads it
    assert (stack.count("sliding"), stack.count("full")) == (52, 10)
    assert [i for i, k in enumerate(stack.kinds) if k.mixer == "full"] == list(range(5, 62, 6))


@pytest.mark.parametrize(
    ("mtype", "extra"),
    [
        ("gemma2", {}),
        ("gemma3_text", {}),
        ("gemma3_text", {"sliding_window_pattern": 4}),
        ("gemma3n_text", {}),
        ("cohere2", {}),
        ("cohere2", {"sliding_window_pattern": 6}),
    ],
)
def test_layer_types_are_derived_as_the_config_class_derives_them(mtype: str, extra: dict[str, int]) -> None:
    """A config without layer_types gets the ones its transformers class computes (and vLLM reads)."""
    transformers = pytest.importorskip("transformers")
    from hwprofile.model.defaults import with_class_defaults

    cfg = {"model_type": mtype, "num_hidden_layers": 14, "hidden_size": 512, **extra}
    want = transformers.AutoConfig.for_model(mtype, **{k: v for k, v in cfg.items() if k != "model_type"})
    assert with_class_defaults(cfg)["layer_types"] == want.layer_types
    given = {**cfg, "layer_types": ["full_attention"] * 14}
    assert with_class_defaults(given)["layer_types"] == given["layer_types"]


def test_the_class_defaults_are_the_config_classes_constants() -> None:
    """Every CLASS_DEFAULTS value is the installed transformers class's default, and is a constant:
    the same whatever the config's other keys (Cohere2's head_dim is hidden / heads: not listed)."""
    transformers = pytest.importorskip("transformers")
    from hwprofile.model.defaults import CLASS_DEFAULTS

    for mtype, defaults in CLASS_DEFAULTS.items():
        plain = transformers.AutoConfig.for_model(mtype)
        # Zamba2's class lists 54 layers unless told its layers
        blocks = {"layers_block_type": ["mamba", "hybrid", "mamba"]} if mtype == "zamba2" else {}
        other = transformers.AutoConfig.for_model(
            mtype, hidden_size=1024, num_attention_heads=4, num_hidden_layers=3, **blocks
        )
        for key, value in defaults.items():
            assert getattr(plain, key) == value, (mtype, key)
            if key not in ("num_attention_heads", "num_hidden_layers"):
                assert getattr(other, key) == value, (mtype, key, "computed from other keys")
    assert "head_dim" not in CLASS_DEFAULTS["cohere2"]


def test_ernie_moe_end_index_minus_one_is_the_last_layer() -> None:
    """ERNIE 4.5's ``moe_layer_end_index: -1`` (transformers' default) is the last layer, as its
    config class makes it before vLLM reads it; a layer index past it is dense."""
    cfg = {
        "architectures": ["Ernie4_5_MoeForCausalLM"],
        "model_type": "ernie4_5_moe",
        "hidden_size": 256,
        "intermediate_size": 512,
        "num_hidden_layers": 6,
        "num_attention_heads": 4,
        "moe_num_experts": 8,
        "moe_k": 2,
        "moe_intermediate_size": 64,
        "moe_layer_start_index": 1,
        "vocab_size": 1000,
    }
    kinds = [k.mlp for k in layer_kinds({**cfg, "moe_layer_end_index": -1})]
    assert kinds == ["dense"] + ["moe"] * 5 == [k.mlp for k in layer_kinds(cfg)]
    assert [k.mlp for k in layer_kinds({**cfg, "moe_layer_end_index": 3})] == ["dense"] + ["moe"] * 3 + [
        "dense"
    ] * 2


def test_replicated_tensors_are_whole_on_every_rank() -> None:
    """vLLM keeps MLA's down-projections to the latents (``fused_qkv_a_proj`` with ``disable_tp``,
    ``kv_a_proj_with_mqa``), every MoE router and DeepSeek-V3.2's sparse-attention indexer whole on
    each tensor-parallel rank (``ReplicatedLinear``): one GPU holds its share of the rest and all of
    those. DeepSeek-V3-shaped, bf16, 61 layers (3 dense): 61 x 7168 x (1536 + 576) + 58 x 256 x 7168
    elements replicated; V3.2 adds its indexer (64 heads of 128 from the 1536 query latent, one key,
    a weight per head) on each indexed layer."""
    from hwprofile.plan.memory import weights_per_gpu

    v3 = DEEPSEEK_V3
    facts = parse_config(v3, "v3", "test", None)
    replicated = 2 * (61 * 7168 * (1536 + 576) + 58 * 256 * 7168)
    assert facts.replicated_bytes == replicated
    assert weights_per_gpu(facts, 8) == -(-(facts.weights_bytes - replicated) // 8) + replicated
    assert weights_per_gpu(facts, 1) == facts.weights_bytes
    v32 = parse_config(
        {**v3, "index_topk": 2048, "index_head_dim": 128, "index_n_heads": 64}, "v32", "test", None
    )
    indexer = 2 * (64 * 128 * 1536 + 128 * 7168 + 64 * 7168) + 2 * 2 * 128  # + the key norm's weight and bias
    assert v32.replicated_bytes - replicated == 61 * indexer
    every_4th = parse_config({**v3, "index_topk": 2048, "index_topk_freq": 4}, "ic", "test", None)
    assert every_4th.replicated_bytes - replicated == 16 * indexer


def test_hunyuan_a13b_per_layer_moe_keys() -> None:
    """HunYuan-A13B's config.json gives moe_topk, moe_intermediate_size and num_shared_expert one value a
    layer (hunyuan_v1.py reads entry [layer_id]): the same for every layer, read as that value; the
    model card's 80 B parameters, 13 B active. Layers that differ are refused by the key's name."""
    n = 32
    cfg = {
        "architectures": ["HunYuanMoEV1ForCausalLM"],
        "model_type": "hunyuan_v1_moe",
        "hidden_size": 4096,
        "intermediate_size": 3072,
        "num_hidden_layers": n,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "head_dim": 128,
        "num_experts": 64,
        "moe_topk": [8] * n,
        "moe_intermediate_size": [3072] * n,
        "num_shared_expert": [1] * n,
        "use_mixed_mlp_moe": True,
        "use_qk_norm": True,
        "vocab_size": 128167,
        "tie_word_embeddings": True,
        "torch_dtype": "bfloat16",
    }
    facts = parse_config(cfg, "hunyuan-a13b", "test", None)
    assert 79.5e9 < facts.params < 81e9 and 12.5e9 < facts.active_params < 13.5e9
    assert facts.experts_per_token == 8 and facts.moe_intermediate_size == 3072
    with pytest.raises(ValueError, match="moe_topk: the layers' values differ"):
        parse_config({**cfg, "moe_topk": [8] * (n - 1) + [2]}, "hunyuan-mixed", "test", None)


def test_an_omni_model_is_its_thinker() -> None:
    """Qwen3-Omni keeps its language model, vision and audio towers under ``thinker_config`` and a
    speech generator beside it (talker, code2wav), which vLLM does not load: the model is read as the
    thinker, its language model the same as that text_config served alone (Qwen3-30B-A3B's shape),
    plus the vision tower."""
    text = {
        "model_type": "qwen3_omni_moe_text",
        "hidden_size": 2048,
        "intermediate_size": 768,
        "num_hidden_layers": 48,
        "num_attention_heads": 32,
        "num_key_value_heads": 4,
        "head_dim": 128,
        "num_experts": 128,
        "num_experts_per_tok": 8,
        "moe_intermediate_size": 768,
        "vocab_size": 152064,
    }
    vision = {"depth": 27, "hidden_size": 1152, "intermediate_size": 4304, "out_hidden_size": 2048}
    vision |= {
        "patch_size": 16,
        "spatial_merge_size": 2,
        "temporal_patch_size": 2,
        "num_position_embeddings": 2304,
    }
    omni = {
        "architectures": ["Qwen3OmniMoeForConditionalGeneration"],
        "model_type": "qwen3_omni_moe",
        "thinker_config": {"text_config": text, "vision_config": vision, "audio_config": {"d_model": 1280}},
        "talker_config": {"text_config": {"hidden_size": 1024, "num_hidden_layers": 20}},
        "code2wav_config": {"hidden_size": 1024},
    }
    facts = parse_config(omni, "omni", "test", None)
    alone = parse_config(
        {**text, "architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe"}, "lm", "test", None
    )
    assert facts.architecture == "Qwen3OmniMoeForConditionalGeneration" and facts.num_layers == 48
    assert facts.vision_bytes > 0
    assert facts.weights_bytes - facts.vision_bytes == alone.weights_bytes
    assert 30.4e9 < alone.params < 30.7e9  # Qwen3-30B-A3B: 30.5 B
    # the audio tower counted with the vision tower (both multimodal encoders)
    audio = {"d_model": 1280, "encoder_layers": 32, "encoder_ffn_dim": 5120, "output_dim": 2048}
    heard = parse_config(
        {**omni, "thinker_config": {**omni["thinker_config"], "audio_config": audio}}, "omni", "test", None
    )
    assert 1.1e9 < heard.vision_bytes - facts.vision_bytes < 1.3e9  # ~0.6 B params in bf16


@pytest.mark.parametrize(
    ("cfg_cls", "model_cls"),
    [
        (
            "qwen2_5_omni.configuration_qwen2_5_omni.Qwen2_5OmniAudioEncoderConfig",
            "qwen2_5_omni.modeling_qwen2_5_omni.Qwen2_5OmniAudioEncoder",
        ),
        (
            "qwen3_omni_moe.configuration_qwen3_omni_moe.Qwen3OmniMoeAudioEncoderConfig",
            "qwen3_omni_moe.modeling_qwen3_omni_moe.Qwen3OmniMoeAudioEncoder",
        ),
    ],
)
def test_omni_audio_towers_equal_transformers_parameter_count(cfg_cls: str, model_cls: str) -> None:
    """Qwen2.5-Omni's and Qwen3-Omni's audio encoders, counted from their audio_config, hold what
    transformers' own modules hold (a small one of each, and the published default shape)."""
    torch = pytest.importorskip("torch")
    import importlib

    from hwprofile.model.weights import tensors

    def load(dotted: str) -> Any:
        mod, name = dotted.rsplit(".", 1)
        return getattr(importlib.import_module(f"transformers.models.{mod}"), name)

    for kw in ({}, {"d_model": 64, "encoder_layers": 2, "encoder_attention_heads": 4, "encoder_ffn_dim": 96}):
        conf = load(cfg_cls)(**kw)
        with torch.device("meta"):
            want = sum(p.numel() for p in load(model_cls)._from_config(conf).parameters())
        cfg = {"model_type": "qwen3_omni_moe", "hidden_size": 64, "num_attention_heads": 4, "vocab_size": 10}
        got = [
            t
            for t in tensors({**cfg, "audio_config": conf.to_dict()}, [])
            if t.name.startswith("audio_tower")
        ]
        assert sum(t.params for t in got) == want, kw


def test_an_omni_checkpoints_total_is_not_what_vllm_loads(tmp_path: Path) -> None:
    """An omni checkpoint's safetensors also hold the talker and code2wav: its total is not taken as
    the weights (the config's count of the thinker is), and the source says why; a plain model's
    checkpoint total still is."""
    text = {"model_type": "qwen3_moe", "hidden_size": 256, "num_hidden_layers": 2, "num_attention_heads": 4}
    text |= {"num_experts": 8, "num_experts_per_tok": 2, "moe_intermediate_size": 64, "vocab_size": 1000}
    omni = {
        "architectures": ["Qwen3OmniMoeForConditionalGeneration"],
        "model_type": "qwen3_omni_moe",
        "thinker_config": {"text_config": text},
        "talker_config": {"text_config": {"hidden_size": 64}},
        "code2wav_config": {"hidden_size": 64},
    }
    for name, cfg in (("omni", omni), ("plain", {**text, "architectures": ["Qwen3MoeForCausalLM"]})):
        d = tmp_path / name
        d.mkdir()
        (d / "config.json").write_text(json.dumps(cfg))
        (d / "model-00001-of-00001.safetensors").write_bytes(b"")
        index = {"metadata": {"total_size": 5 * GiB}, "weight_map": {"w": "model-00001-of-00001.safetensors"}}
        (d / "model.safetensors.index.json").write_text(json.dumps(index))
    facts = read_model_dir(tmp_path / "omni")
    assert facts.weights_bytes < GiB and "talker_config, code2wav_config" in facts.weights_bytes_source
    assert read_model_dir(tmp_path / "plain").weights_bytes == 5 * GiB
