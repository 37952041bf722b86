"""The families vLLM 0.32-0.33 added, read by their own keys (their published or fixture config.json
shapes), against vLLM's own accounting of them (the parameter formulas of their vLLM modules and the
KV cache specs their layers return, run through vLLM 0.33's grouping):

- Kimi-K3: its experts in a latent space (``routed_expert_hidden_size``), ``num_experts_per_token``,
  KDA layers on FlashKDA exporting a prefill checkpoint page on SM90/SM10x/SM12x;
- GLM-5.3: ``layer_types`` (KDA and sparse MLA; its 0-based ``linear_attn_config`` lists are not what
  vLLM reads), ``mlp_layer_types``, the indexer pooling ``index_kpool`` keys into one;
- HY-V4: ``indexer_types`` (``shared`` layers reuse the last ``full`` layer's top-k: no indexer);
- Qwen4-Exp (Qwen3.8-Flash-Next): the config's ``mamba_ssm_dtype``, the n-gram embedding tables, its QSA
  caches and PLE state packed as vLLM packs them;
- DeepSeek V4.1: its caches on kv_source_layer_ids, its engram tables in host memory;
- Inkling: its local (sliding-window) layers and every layer's short-conv state;
- MiniMax-M3: ``dense_intermediate_size``, its sparse layers' indexer keys; Step3/Step5: ``num_attention_groups`` KV heads,
  ``moe_layers_enum``.
"""

from __future__ import annotations

from typing import Any

import pytest

from hwprofile.config.settings import Settings
from hwprofile.host.snapshot import Gpu
from hwprofile.model import parse_config
from hwprofile.model.layers import layer_stack
from hwprofile.plan.engine import hybrid_opts
from hwprofile.plan.memory import HybridOpts, hybrid_kv_cache, kv_bytes_per_token


def _kimi_k3() -> dict[str, Any]:
    """moonshotai/Kimi-K3's config.json (the keys that size it)."""
    full = [*range(4, 93, 4), 93]
    text = {
        "model_type": "kimi_linear",
        "dtype": "bfloat16",
        "hidden_size": 7168,
        "intermediate_size": 33792,
        "num_hidden_layers": 93,
        "num_attention_heads": 96,
        "num_key_value_heads": 96,
        "kv_lora_rank": 512,
        "q_lora_rank": 1536,
        "qk_nope_head_dim": 128,
        "qk_rope_head_dim": 64,
        "v_head_dim": 128,
        "first_k_dense_replace": 1,
        "moe_layer_freq": 1,
        "num_experts": 896,
        "num_experts_per_token": 16,
        "num_shared_experts": 2,
        "moe_intermediate_size": 3072,
        "routed_expert_hidden_size": 3584,
        "latent_moe_use_norm": True,
        "topk_method": "noaux_tc",
        "vocab_size": 163840,
        "tie_word_embeddings": False,
        "linear_attn_config": {
            "kda_layers": [i for i in range(1, 94) if i not in full],
            "full_attn_layers": full,
            "num_heads": 96,
            "head_dim": 128,
            "short_conv_kernel_size": 4,
            "gate_lower_bound": -5.0,
        },
    }
    return {"architectures": ["KimiK3ForConditionalGeneration"], "model_type": "kimi_k3", "text_config": text}


def _gpu(cc: str) -> Gpu:
    return Gpu(index=0, name="test", memory_total_bytes=80 << 30, compute_capability=cc)


def test_kimi_k3_latent_experts_and_the_flashkda_checkpoint_page() -> None:
    """Kimi-K3: 896 experts of 3 x 3072 x 3584 (the latent width, not 7168) with the projections
    into and out of it; 16 routed a token. vLLM counts 2.779 T parameters with the vision tower
    (0.447 T not read here): the language model within 1 %. On H100 its KDA layers run FlashKDA and
    export a prefill checkpoint: 3 pages a state layer per request; vLLM 0.33 logs 20,480 tokens for
    1 GiB at TP8 and 8,192 tokens (block 768); on an A100 (no FlashKDA) 2 pages."""
    m = parse_config(_kimi_k3(), "k3", "test", None)
    assert m.experts_per_token == 16
    assert abs(m.params - 2_779_484_476_000) / 2_779_484_476_000 < 0.01
    assert m.active_params < m.params / 20
    st = m.stack
    assert st is not None and st.state is not None and st.state.bounded_gate
    on = hybrid_opts(m, Settings(), None, "0.33.0", _gpu("9.0"))
    off = hybrid_opts(m, Settings(), None, "0.33.0", _gpu("8.0"))
    assert on is not None and on.prefill_checkpoint and on.checkpoint_align == 16
    assert off is not None and not off.prefill_checkpoint
    h = hybrid_kv_cache(m, 1 << 30, 8192, tp=8, **on._asdict())
    assert (h.block_size, h.logged_tokens) == (768, 20480)
    assert h.state_slots == 3 and hybrid_kv_cache(m, 1 << 30, 8192, tp=8, **off._asdict()).state_slots == 2
    # its MoonViT by the vt_* keys (vLLM kimi_k25_vit.py: 447,358,976 parameters with the projector)
    vision = {"vt_hidden_size": 1024, "vt_num_hidden_layers": 27, "vt_intermediate_size": 4096}
    vision |= {"qkv_hidden_size": 1536, "patch_size": 14, "init_pos_emb_height": 64, "init_pos_emb_width": 64}
    vision |= {"merge_kernel_size": [2, 2], "text_hidden_size": 7168}
    seen = parse_config({**_kimi_k3(), "vision_config": vision}, "k3", "test", None)
    assert abs(seen.vision_bytes / 2 - 447_358_976) < 10_000
    for bad in ([2, 2.5], [2], "2x2", [0, 2], [True, 2]):
        with pytest.raises(ValueError, match="merge_kernel_size"):
            parse_config(
                {**_kimi_k3(), "vision_config": {**vision, "merge_kernel_size": bad}}, "k3", "t", None
            )
    kimi_linear = {**_kimi_k3(), "architectures": ["KimiLinearForCausalLM"]}
    other = hybrid_opts(
        parse_config(kimi_linear, "kl", "test", None), Settings(), None, "0.33.0", _gpu("9.0")
    )
    assert other is not None and not other.prefill_checkpoint  # Kimi-Linear's KDA: no FlashKDA export


def _glm53() -> dict[str, Any]:
    kda = [i for i in range(45) if i % 4 != 3]
    text = {
        "model_type": "glm5_next_text",
        "hidden_size": 6144,
        "intermediate_size": 12288,
        "num_hidden_layers": 45,
        "num_attention_heads": 64,
        "num_key_value_heads": 64,
        "kv_lora_rank": 512,
        "q_lora_rank": 1536,
        "qk_nope_head_dim": 256,
        "qk_rope_head_dim": 0,
        "v_head_dim": 256,
        "index_topk": 2048,
        "index_head_dim": 128,
        "index_n_heads": 32,
        "index_kpool": 4,
        "n_routed_experts": 288,
        "num_experts_per_tok": 8,
        "n_shared_experts": 1,
        "moe_intermediate_size": 2048,
        "mlp_layer_types": ["dense"] * 3 + ["sparse"] * 42,
        "layer_types": ["linear_attention" if i in kda else "deepseek_sparse_attention" for i in range(45)],
        "linear_attn_config": {
            "num_heads": 64,
            "head_dim": 128,
            "short_conv_kernel_size": 4,
            "gate_lower_bound": -5.0,
            "kda_layers": kda,
            "full_attn_layers": [i for i in range(45) if i not in kda],
        },
        "vocab_size": 154880,
    }
    return {
        "architectures": ["Glm5NextForConditionalGeneration"],
        "model_type": "glm5_next",
        "text_config": text,
    }


def test_glm53_layer_types_kda_and_a_pooled_indexer() -> None:
    """GLM-5.3: 34 KDA + 11 sparse MLA layers by its layer_types (its linear_attn_config lists are
    0-based and not read by vLLM: read 1-based they would refuse it). Per token and MLA layer
    vLLM keeps the 512-wide latent (1,024 B) and one indexer key of 132 B per 4 tokens (33 B): 11,627
    B at any TP. 3 dense layers (mlp_layer_types), 42 MoE. At TP8 the block is 640 tokens (the KDA
    state on FlashKDA's 16-token grid); the packing was +7 % at one GPU and 8,192 tokens."""
    m = parse_config(_glm53(), "glm", "test", None)
    st = m.stack
    assert st is not None and st.count("kda") == 34 and st.count("mla") == 11
    assert [k.mlp for k in st.kinds].count("dense") == 3
    assert kv_bytes_per_token(m, 1, 2) == kv_bytes_per_token(m, 8, 2) == 11 * (1024 + 33)
    opts = hybrid_opts(m, Settings(), None, "0.33.0", _gpu("9.0"))
    assert opts is not None and opts.prefill_checkpoint
    assert st.indexed is not None and st.indexed.kind == "kpool"
    # vLLM 0.33 (BLHNC: its pooled indexer's tail backend) packs the MLA pages, the indexer's keys,
    # the KDA states and the tail rings in one block, rounded to lcm(1,024-byte rows, the indexer's
    # 256-token pages); vLLM's own functions give (block, blocks, blocks a request, logged tokens)
    for tp, o, mem, length, want in (
        (8, opts, 1 << 30, 8192, (640, 143, 26, 45_056)),
        (1, opts, 1 << 30, 8192, (4_352, 21, 15, 11_468)),
        (4, opts._replace(num_spec=1, mtp_attention_layers=1), 1 << 30, 8192, (1_152, 73, 21, 28_476)),
        (2, HybridOpts(num_spec=3, mtp_attention_layers=1), 20 << 30, 131072, (2_304, 734, 70, 1_374_383)),
    ):
        h = hybrid_kv_cache(m, mem, length, tp=tp, **o._asdict())
        assert (h.block_size, h.num_blocks, h.per_request_blocks, h.logged_tokens) == want, (tp, o)


def test_hy_v4_indexer_types_and_mlp_layer_types() -> None:
    """HY-V4: only the ``full`` layers of indexer_types hold an indexer (its key cache and weights);
    ``shared`` ones reuse the last full layer's top-k; mlp_layer_types says the dense layers; its MLA's
    output gate (gated_mla, 7.85 B parameters of the published shape) and fp32 sinks are counted."""
    types = ["full" if i % 4 == 0 else "shared" for i in range(8)]
    cfg = {
        "architectures": ["HYV4ForCausalLM"],
        "model_type": "hy_v4",
        "hidden_size": 512,
        "num_hidden_layers": 8,
        "num_attention_heads": 8,
        "kv_lora_rank": 128,
        "qk_rope_head_dim": 64,
        "qk_nope_head_dim": 64,
        "v_head_dim": 64,
        "index_topk": 64,
        "index_head_dim": 128,
        "index_n_heads": 4,
        "indexer_types": types,
        "n_routed_experts": 8,
        "num_experts_per_tok": 2,
        "moe_intermediate_size": 128,
        "intermediate_size": 1024,
        "mlp_layer_types": ["dense"] + ["sparse"] * 7,
        "vocab_size": 1000,
    }
    m = parse_config(cfg, "hy", "test", None)
    # 2 of 8 layers index: 8 x 192 x 2 B of latent, 2 x 132 B of indexer keys
    assert kv_bytes_per_token(m, 1, 2) == 8 * 192 * 2 + 2 * 132
    assert [k.mlp for k in m.stack.kinds] == ["dense"] + ["moe"] * 7
    every = parse_config({**cfg, "indexer_types": ["full"] * 8}, "hy", "test", None)
    assert every.params > m.params  # the shared layers carry no indexer weights
    # gated_mla: an elementwise output gate hidden -> heads x v_head_dim in every layer; fp32 sinks
    gated = parse_config({**cfg, "gated_mla": True, "gating_type": "elementwise"}, "hy", "test", None)
    assert gated.params - m.params == 8 * 512 * 8 * 64
    sinks = parse_config({**cfg, "learnable_sink": True}, "hy", "test", None)
    assert sinks.params - m.params == 8 * 2 * 8


def test_qwen4_exp_state_dtype_and_ngram_tables() -> None:
    """Qwen4-Exp takes its config's mamba_ssm_dtype as Qwen3.5 does (float32 state), and holds an
    n-gram embedding per ple_layer_ids layer: (3 - 1) x 8 hashed heads of ~20 M rows x 2560 / 16
    columns = 51.2 B parameters, stored (bf16: 102 GB) but not read per token."""
    cfg = {
        "architectures": ["Qwen4ExpForConditionalGeneration"],
        "model_type": "qwen4_exp",
        "text_config": {
            "model_type": "qwen4_exp_text",
            "hidden_size": 2560,
            "num_hidden_layers": 4,
            "num_attention_heads": 24,
            "num_key_value_heads": 2,
            "head_dim": 256,
            "layer_types": ["linear_attention"] * 3 + ["full_attention"],
            "linear_num_key_heads": 16,
            "linear_num_value_heads": 48,
            "linear_key_head_dim": 128,
            "linear_value_head_dim": 128,
            "linear_conv_kernel_dim": 4,
            "mamba_ssm_dtype": "float32",
            "intermediate_size": 1024,
            "vocab_size": 248320,
            "ple_layer_ids": [2],
            "ple_embed_dim": 2560,
            "ngram_size": 3,
            "heads_per_ngram": 8,
            "ngram_vocab_size_base": 20_000_000,
            "make_ngram_vocab_size_divisible_by": 128,
            "hc_count": 4,
        },
    }
    st = layer_stack(cfg)
    assert st.state is not None and st.state.ssm_dtype == "float32"
    m = parse_config(cfg, "q4", "test", None)
    without = parse_config(
        {**cfg, "text_config": {**cfg["text_config"], "ple_layer_ids": []}}, "q4", "test", None
    )
    table = 320_000_000 * 160
    assert table < m.params - without.params < table * 1.01
    assert m.active_params - without.active_params < 0.01 * table


def _qwen38_flash_next(mrope: bool = True, ple: bool = True) -> dict[str, Any]:
    """RadixArk/Qwen3.8-Flash-Next's config.json (the keys that size its cache)."""
    rope: dict[str, Any] = {"rope_type": "default", "partial_rotary_factor": 0.25}
    if mrope:
        rope |= {"mrope_interleaved": True, "mrope_section": [11, 11, 10]}
    text = {
        "model_type": "qwen4_exp_text",
        "hidden_size": 2560,
        "num_hidden_layers": 48,
        "num_attention_heads": 24,
        "num_key_value_heads": 2,
        "head_dim": 256,
        "full_attention_interval": 4,
        "layer_types": ["linear_attention", "linear_attention", "linear_attention", "full_attention"] * 12,
        "linear_conv_kernel_dim": 4,
        "linear_key_head_dim": 128,
        "linear_value_head_dim": 128,
        "linear_num_key_heads": 16,
        "linear_num_value_heads": 48,
        "mamba_ssm_dtype": "float32",
        "num_experts": 512,
        "num_experts_per_tok": 10,
        "moe_intermediate_size": 640,
        "shared_expert_intermediate_size": 640,
        "hc_count": 4,
        "indexer_n_heads": 4,
        "indexer_kv_heads": 1,
        "indexer_head_dim": 128,
        "indexer_budget": 2048,
        "indexer_compress_ratio": 4,
        "ple_layer_ids": [2] if ple else [],
        "ple_embed_dim": 2560,
        "ple_conv_kernel_size": 4,
        "ngram_size": 3,
        "mtp_num_hidden_layers": 1,
        "rope_parameters": rope,
    }
    return {
        "architectures": ["Qwen4ExpForConditionalGeneration"],
        "model_type": "qwen4_exp",
        "text_config": text,
    }


def test_qwen38_flash_next_packs_its_qsa_caches_as_vllm_does() -> None:
    """Qwen3.8-Flash-Next's QSA layers keep, beside their KV, the indexer's compressed key (64 B a
    token) and a ring of raw keys (one block a request); its PLE layer a TP-replicated short-conv
    state beside the GDN state. vLLM 0.33 lays them out BLNHC and packs the pages side by side in
    one block. The figures are vLLM's own (get_kv_cache_groups, get_kv_cache_config_from_groups,
    get_max_concurrency_for_kv_cache_config on the specs the model's layers return): block size,
    blocks, blocks a request and the logged tokens. Before, the raw GDN layout logged +31 % at 8,192
    tokens on one GPU (14,745 for 11,210)."""
    m = parse_config(_qwen38_flash_next(), "q38fn", "test", None)
    st = m.stack
    assert st is not None and st.indexed is not None and st.short_conv is not None
    assert kv_bytes_per_token(m, 8, 2) == 12 * (1024 + 64)
    on = hybrid_opts(m, Settings(), None, "0.33.0", _gpu("9.0"))
    assert on is not None and on.prefill_checkpoint and on.checkpoint_align == 64
    cases = [  # (tp, opts, GiB-fraction bytes, max_model_len) -> vLLM's (block, blocks, per request, logged)
        (1, on, 1 << 30, 8192, (1600, 26, 19, 11210)),
        (8, on, 1 << 30, 8192, (448, 183, 32, 46848)),
        (1, on, 1 << 30, 131072, (1600, 26, 95, 35872)),
        (8, on, 1 << 30, 131072, (448, 183, 306, 78386)),
        # MTP resident (its QSA layer with its caches), one speculative token
        (4, on._replace(num_spec=1, mtp_attention_layers=1), 13_971_674_657, 8192, (832, 1187, 27, 360144)),
    ]
    for tp, o, mem, length, want in cases:
        h = hybrid_kv_cache(m, mem, length, tp=tp, **o._asdict())
        assert (h.block_size, h.num_blocks, h.per_request_blocks, h.logged_tokens) == want, (tp, o, length)
    # no prefix caching, 3 speculative tokens (a ring of 8 rows), no M-RoPE positions, no PLE layer
    plain = parse_config(_qwen38_flash_next(mrope=False, ple=False), "q38fn", "test", None)
    off = HybridOpts(num_spec=3)
    h = hybrid_kv_cache(plain, 1 << 30, 32768, tp=2, **off._asdict())
    assert (h.block_size, h.num_blocks, h.per_request_blocks, h.logged_tokens) == (1600, 51, 34, 49152)
    # the state a sequence holds is whole blocks of the pool: 3 GDN groups x 3 pages, PLE 3, the ring 1;
    # the sequences whose state fits (max_num_seqs' cap) count the ring's block too
    h = hybrid_kv_cache(m, 1 << 30, 8192, tp=8, **on._asdict())
    assert h.state_bytes_per_sequence == (3 * 3 + 3 + 1) * 5_849_088
    assert h.state_blocks == 183 // 13


def test_minimax_m3_dense_width_and_step_attention_groups() -> None:
    """MiniMax-M3's dense layers are dense_intermediate_size wide; Step3/Step5's KV heads are their
    num_attention_groups and their MoE layers moe_layers_enum's."""
    base = {
        "hidden_size": 256,
        "num_hidden_layers": 4,
        "num_attention_heads": 8,
        "num_key_value_heads": 2,
        "head_dim": 32,
        "num_experts": 4,
        "num_experts_per_tok": 2,
        "moe_intermediate_size": 64,
        "vocab_size": 1000,
    }
    mm = {**base, "architectures": ["MiniMaxM3SparseForCausalLM"], "model_type": "minimax_m3_text"}
    mm |= {"first_k_dense_replace": 1, "intermediate_size": 64}
    narrow = parse_config(mm, "m3", "test", None)
    wide = parse_config({**mm, "dense_intermediate_size": 1024}, "m3", "test", None)
    assert wide.params - narrow.params == 3 * 256 * (1024 - 64)  # the one dense layer's gate, up, down
    step = {k: v for k, v in base.items() if k != "num_key_value_heads"}
    step |= {"architectures": ["Step5ForCausalLM"], "model_type": "step5", "num_attention_groups": 2}
    step |= {"moe_layers_enum": "2,3", "intermediate_size": 512}
    s = parse_config(step, "step5", "test", None)
    assert s.num_kv_heads == 2 and kv_bytes_per_token(s, 1, 2) == 4 * 2 * 2 * 32 * 2
    assert [k.mlp for k in s.stack.kinds] == ["dense", "dense", "moe", "moe"]


def test_minimax_m3_sparse_layers_keep_their_indexer_keys() -> None:
    """MiniMax-M3's sparse layers (sparse_attention_freq not 0) keep, beside their KV, the indexer's
    key: 128 bf16 values a token on every TP rank (vLLM 0.33's MiniMaxM3IndexerCache). vLLM's one
    group of 117 pages costs 137,472 bytes a token at TP1 and 45,312 at TP8; hwprofile counted
    122,880 and 30,720 (-32 %), and a pool of 22.95 GB logs 506,496 tokens, not 747,120. Its MTP
    module is read by its own key (num_mtp_modules): it was not offered."""
    from hwprofile.plan.memory import vllm_kv_cache

    freq = [0, 0, 0] + [1] * 57
    cfg = {"architectures": ["MiniMaxM3SparseForCausalLM"], "model_type": "minimax_m3_vl"}
    text = {"model_type": "minimax_m3_text", "hidden_size": 6144, "num_hidden_layers": 60}
    text |= {"num_attention_heads": 64, "num_key_value_heads": 4, "head_dim": 128, "vocab_size": 200064}
    text |= {"intermediate_size": 3072, "dense_intermediate_size": 12288, "num_local_experts": 128}
    text |= {"num_experts_per_tok": 4, "moe_layer_freq": freq, "num_mtp_modules": 1, "n_shared_experts": 1}
    text["sparse_attention_config"] = {
        "use_sparse_attention": True,
        "sparse_index_dim": 128,
        "sparse_num_index_heads": 4,
        "sparse_attention_freq": freq,
    }
    m = parse_config({**cfg, "text_config": text}, "m3", "test", None)
    for tp, want in ((1, 137_472), (8, 45_312)):
        assert 0 <= kv_bytes_per_token(m, tp, 2) - want < 60  # the indexer keys averaged over 60 layers
    _, logged = vllm_kv_cache(m, 22_951_644_001, 8192, tp=8)
    assert abs(logged - 506_496) / 506_496 < 0.002
    # its MTP module (num_mtp_modules; vLLM's minimax_m3_mtp): a sparse MoE layer, eh_proj and norms
    # (7,491,582,592 parameters by vLLM's modules) with its own embedding and head (2 x 1,229,193,216)
    assert m.mtp_layers == 1
    assert abs(m.mtp_bytes / 2 - 9_949_969_024) / 9_949_969_024 < 0.01
    bad = {
        **text,
        "sparse_attention_config": {**text["sparse_attention_config"], "sparse_attention_freq": [1]},
    }
    with pytest.raises(ValueError, match="sparse_attention_freq"):
        parse_config({**cfg, "text_config": bad}, "m3", "test", None)


def _inkling_small() -> dict[str, Any]:
    """Inkling-Small's config.json (the keys that size its cache)."""
    local = [i for i in range(42) if i % 6 != 5]
    text = {
        "model_type": "inkling_model",
        "architectures": None,
        "vocab_size": 200058,
        "hidden_size": 4096,
        "intermediate_size": 2048,
        "dense_intermediate_size": 16384,
        "num_hidden_layers": 42,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "head_dim": 128,
        "local_layer_ids": local,
        "sliding_window_size": 512,
        "swa_num_key_value_heads": 8,
        "swa_head_dim": 128,
        "use_sconv": True,
        "sconv_kernel_size": 4,
        "n_routed_experts": 256,
        "n_shared_experts": 2,
        "num_experts_per_tok": 6,
        "dense_mlp_idx": 2,
        "padded_vocab_size": 201024,
    }
    return {"architectures": ["InklingForCausalLM"], "model_type": "inkling_mm_model", "text_config": text}


def test_inkling_local_layers_and_its_short_conv_state() -> None:
    """Inkling: local_layer_ids are sliding-window layers (35 of 42); every layer also keeps a
    short-conv state vLLM holds as a 4-token sliding window of 8 heads x 2,048 values. Its page
    (131,072 B at TP1) is twice the attention's at 16 tokens, so vLLM raises the attention block to
    32 and groups the 42 + 35 + 7 layers by 7; each request reserves its conv windows plus the tokens
    in flight. The figures are vLLM 0.33's own functions'; hwprofile read 42 full layers and logged
    +365 %."""
    from hwprofile.plan.memory import kv_bytes_per_sequence, sconv_kv_cache, vllm_kv_cache

    m = parse_config(_inkling_small(), "inkling", "test", None)
    st = m.stack
    assert st is not None and st.sconv is not None and (st.count("sliding"), st.count("full")) == (35, 7)
    for tp, mem, length, flight, want in (
        (1, 10 << 30, 8192, 4096, (32, 917_504, 11_702, 7_137, 13_431)),
        (8, 10 << 30, 131072, 16384, (32, 114_688, 93_622, 31_329, 391_688)),
        (4, 1 << 30, 8192, 16384, (32, 229_376, 4_681, 13_835, 2_771)),
    ):
        x = sconv_kv_cache(m, mem, length, tp, None, flight)
        assert (
            x.attention_block,
            x.bytes_per_block,
            x.num_blocks,
            x.blocks_per_request,
            x.logged_tokens,
        ) == want
        assert vllm_kv_cache(m, mem, length, tp=tp, in_flight=flight)[1] == want[-1]
    # vLLM's start-up check (one request's reserved blocks within the pool less its null block): it
    # refuses TP4 with 1 GiB at 8,192 tokens and 8,192 batched (2 in flight), starts TP1 with 10 GiB at 2,048
    for tp, mem, flight, starts in ((4, 1 << 30, 16384, False), (1, 10 << 30, 4096, True)):
        one = kv_bytes_per_sequence(m, tp, 2, 8192, in_flight=flight, reserve=True)
        block = sconv_kv_cache(m, mem, 8192, tp, None, flight).bytes_per_block
        assert (one <= mem - block) is starts
    with pytest.raises(ValueError, match="tensor parallel at most"):
        sconv_kv_cache(m, 1 << 30, 8192, 16, None, 0)
    # its weights as vLLM builds them: the first dense_mlp_idx layers dense (16,384 wide), the
    # embedding padded_vocab_size rows and whole on every rank; 263.66 B parameters by vLLM's modules
    # (the attention's relative-position branch, 0.09 B, not counted; it was 276.1 B)
    assert abs(m.params - 263_656_182_314) / 263_656_182_314 < 0.002
    assert [k.mlp for k in st.kinds[:3]] == ["dense", "dense", "moe"]
    assert m.replicated_bytes >= 201024 * 4096 * 2


def test_inkling_with_fewer_kv_heads_than_gpus_is_planned_below_them(host_of, empty_root, tmp_path) -> None:
    """Each rank of Inkling keeps a short-conv state of its own KV heads (vLLM asserts TP <= KV
    heads): with 4 KV heads on 8 GPUs (16 experts: it fits one) the plan takes TP 4 or less by itself,
    and refuses TP 8 asked for by name (it was a bare ValueError out of the KV arithmetic)."""
    import json

    from hwprofile.pipeline import make_plan
    from hwprofile.plan.refusal import PlanRefused

    cfg = _inkling_small()
    cfg["text_config"] |= {"num_key_value_heads": 4, "swa_num_key_value_heads": 4, "n_routed_experts": 16}
    d = tmp_path / "inkling"
    d.mkdir()
    (d / "config.json").write_text(json.dumps(cfg))
    host = host_of("h100-sxm-8x")
    plan = make_plan(host, empty_root, environ={}, model=str(d), sets=["speculative.method=none"])
    assert all(i.tensor_parallel_size <= 4 for i in plan.instances)
    with pytest.raises(PlanRefused, match="short-conv state"):
        make_plan(host, empty_root, environ={}, model=str(d), sets=["layout.tensor_parallel_size=8"])


def _dsv4_flash() -> dict[str, Any]:
    """deepseek-ai/DeepSeek-V4-Flash's config.json (the keys that size it)."""
    return {
        "architectures": ["DeepseekV4ForCausalLM"],
        "model_type": "deepseek_v4",
        "hidden_size": 4096,
        "num_hidden_layers": 43,
        "num_attention_heads": 64,
        "num_key_value_heads": 1,
        "head_dim": 512,
        "qk_rope_head_dim": 64,
        "q_lora_rank": 1024,
        "o_groups": 8,
        "o_lora_rank": 1024,
        "compress_ratios": [0, 0] + [4, 128] * 20 + [4, 0],
        "sliding_window": 128,
        "index_head_dim": 128,
        "index_n_heads": 64,
        "index_topk": 512,
        "hc_mult": 4,
        "num_hash_layers": 3,
        "n_routed_experts": 256,
        "num_experts_per_tok": 6,
        "n_shared_experts": 1,
        "moe_intermediate_size": 2048,
        "num_nextn_predict_layers": 1,
        "vocab_size": 129280,
        "tie_word_embeddings": False,
        "torch_dtype": "bfloat16",
        "quantization_config": {"quant_method": "fp8", "fmt": "e4m3", "weight_block_size": [128, 128]},
    }


def test_deepseek_v4_weights_as_its_checkpoint_holds_them() -> None:
    """DeepSeek-V4-Flash: the query and output through LoRA ranks (grouped for the output), one
    512-wide KV head, compressors on the ratio-4 and ratio-128 layers, the indexer on the ratio-4
    ones, hyper-connections, a MoE in every layer (3 hash-routed), its MTP layer; FP8 with the
    routed experts in MXFP4 (expert_dtype's default). The published checkpoint: 148.65 GiB,
    290.94 B parameters (284.3 B without the MTP layer); counted as plain attention at 8 bits
    everywhere it was 298.8 GB."""
    m = parse_config(_dsv4_flash(), "v4", "test", None)
    assert abs(m.weights_bytes / 2**30 - 148.65) < 0.5
    assert abs(m.params - 290_944_616_402) / 290_944_616_402 < 0.002
    assert 13.5e9 < m.active_params < 14.2e9  # 13.8 B read per token
    fp8 = {**_dsv4_flash(), "expert_dtype": "fp8"}
    assert parse_config(fp8, "v4", "test", None).weights_bytes > 1.8 * m.weights_bytes  # experts at 8 bits
    layer_types = {
        "sliding_attention": 0,
        "compressed_sparse_attention": 4,
        "heavily_compressed_attention": 128,
    }
    by_name = {v: k for k, v in layer_types.items()}
    typed = {k: v for k, v in _dsv4_flash().items() if k != "compress_ratios"}
    typed["layer_types"] = [by_name[r] for r in _dsv4_flash()["compress_ratios"][:43]]
    # transformers' layer_types spelling reads the same (the MTP layer's ratio, absent there, is 0)
    same = parse_config(typed, "v4", "test", None)
    assert (same.params, same.weights_bytes) == (m.params, m.weights_bytes)


def test_deepseek_v4_cache_as_vllm_packs_it() -> None:
    """DeepSeek-V4-Flash's cache as vLLM 0.33 lays it out on a Hopper GPU (its own grouping and
    capacity functions run over the layers' specs): fp8_ds_mla rows of 584 B in 576-B-aligned pages,
    5 packed groups (two sliding-window groups of 22 and 21 layers, one of the compressed caches, one
    of each compressor state), 1,002,240 B a block, whatever the TP; a request of M tokens with F in
    flight reserves 2 x (cdiv(min(127 + F, M), 64) + 1) + cdiv(M, 256) + cdiv(min(7 + F, M), 4) + 1
    + cdiv(min(127 + F, M), 8) + 1 blocks. vLLM logs 5,095 tokens for 1 GiB at M 8,192 and F 4,096,
    104,196 at M 1,048,576 and F 16,384 (the Pro: 3,553 and 72,674); as plain sliding-window layers it
    was 862,756 on the plan's 39.3 GB where vLLM's arithmetic says 186,660."""
    from hwprofile.plan.compressed import compressed_cache
    from hwprofile.plan.memory import kv_bytes_per_sequence, vllm_kv_cache

    m = parse_config(_dsv4_flash(), "v4", "test", None)
    c = m.stack.compressed
    assert c is not None and c.ratios.count(4) == 21 and c.ratios.count(128) == 20
    cache = compressed_cache(c, 1 << 30, 8192, 4096)
    assert cache.bytes_per_block == 1_002_240 and len(cache.groups) == 5
    assert (cache.blocks_per_request, cache.logged_tokens) == (1722, 5095)
    assert compressed_cache(c, 1 << 30, 1 << 20, 16384).logged_tokens == 104_196
    assert vllm_kv_cache(m, 39_325_185_729, 8192, tp=8, in_flight=4096)[1] == 186_660
    assert kv_bytes_per_token(m, 1, 2) == kv_bytes_per_token(m, 8, 1) == 3915
    assert kv_bytes_per_sequence(m, 8, 2, 8192, in_flight=4096, reserve=True) == 1722 * 1_002_240
    pro = {**_dsv4_flash(), "hidden_size": 7168, "num_hidden_layers": 61, "num_attention_heads": 128}
    pro |= {"compress_ratios": [128, 128] + [4, 128] * 29 + [4, 0], "q_lora_rank": 1536, "o_groups": 16}
    p = parse_config(pro, "v4-pro", "test", None)
    assert compressed_cache(p.stack.compressed, 1 << 30, 8192, 4096).logged_tokens == 3553
    assert compressed_cache(p.stack.compressed, 1 << 30, 1 << 20, 16384).logged_tokens == 72_674


def test_deepseek_v4_runs_on_hopper_and_blackwell_only() -> None:
    """No vLLM backend runs DeepSeek V4's sparse attention below SM90 (FlashMLA on SM90/SM100,
    FlashInfer on SM12x): a plan for an Ampere card is refused, saying so."""
    from hwprofile.plan import attention

    m = parse_config(_dsv4_flash(), "v4", "test", None)
    assert attention.of_instance("auto", "8.0", "auto", m).refused
    assert not attention.of_instance("auto", "9.0", "auto", m).refused
    assert not attention.of_instance("auto", "12.0", "auto", m).refused


def test_malformed_new_family_keys_are_clear_refusals() -> None:
    """The new keys are checked: a wrong value is a ValueError naming the key, not a traceback,
    a silent misreading or a loop over millions of entries."""
    import pytest

    base = _dsv4_flash()
    cases: list[tuple[dict[str, Any], str]] = [
        ({**base, "compress_ratios": "0,4"}, "compress_ratios"),
        ({**base, "compress_ratios": [128] * 44}, "no layer of compression ratio 4"),
        ({**base, "qk_rope_head_dim": 1024}, "qk_rope_head_dim"),
    ]
    hy = {"model_type": "hy_v4", "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 2}
    hy |= {"kv_lora_rank": 32, "index_topk": 8, "indexer_types": [["full"], "shared"]}
    cases.append((hy, "indexer_types"))
    zamba = {"model_type": "zamba2", "hidden_size": 64, "num_hidden_layers": 4, "hybrid_layer_ids": [1, 1, 9]}
    cases.append((zamba, "hybrid_layer_ids"))
    step = {"model_type": "step5", "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 2}
    step |= {"num_experts": 2, "moe_layers_enum": "1,x"}
    cases.append((step, "moe_layers_enum"))
    ple = {
        "model_type": "qwen4_exp_text",
        "hidden_size": 64,
        "num_hidden_layers": 2,
        "num_attention_heads": 2,
    }
    ple |= {"ple_layer_ids": [1, 1], "ple_embed_dim": 64, "ngram_vocab_size_base": 100}
    cases.append((ple, "ple_layer_ids"))
    for cfg, words in cases:
        with pytest.raises(ValueError, match=words):
            parse_config(cfg, "bad", "test", None)


def test_an_asr_models_audio_encoder_is_not_a_tower_to_drop() -> None:
    """Only an omni thinker's audio tower counts with the vision tower (and so is dropped under
    --language-model-only); a speech-to-text model's encoder is its input path."""
    from hwprofile.plan.loaded import language_only

    audio = {"d_model": 256, "encoder_layers": 2, "encoder_ffn_dim": 512, "output_dim": 256}
    asr = {"model_type": "qwen3_asr", "hidden_size": 256, "num_hidden_layers": 2, "num_attention_heads": 4}
    asr |= {"vocab_size": 1000, "audio_config": audio}
    m = parse_config(asr, "asr", "test", None)
    assert m.vision_bytes == 0 and not language_only(m, Settings(), "0.33.0")


def test_step_attention_groups_and_a_listed_moe_layers_enum() -> None:
    """Step-3.5 names its KV heads num_attention_groups too; moe_layers_enum may be a list."""
    cfg = {"model_type": "step3p5", "hidden_size": 256, "num_hidden_layers": 4, "num_attention_heads": 8}
    cfg |= {"head_dim": 32, "num_attention_groups": 2, "num_experts": 4, "num_experts_per_tok": 2}
    cfg |= {
        "moe_intermediate_size": 64,
        "intermediate_size": 512,
        "moe_layers_enum": [2, 3],
        "vocab_size": 100,
    }
    m = parse_config(cfg, "step", "test", None)
    assert m.num_kv_heads == 2
    assert [k.mlp for k in m.stack.kinds] == ["dense", "dense", "moe", "moe"]


def _dsv41_flash() -> dict[str, Any]:
    """deepseek-ai/DeepSeek-V4.1-Flash's config.json (the keys that size it)."""
    text = {
        "model_type": "deepseek_v41_text",
        "vocab_size": 129280,
        "hidden_size": 5120,
        "moe_intermediate_size": 2304,
        "num_hidden_layers": 40,
        "num_attention_heads": 64,
        "num_key_value_heads": 1,
        "head_dim": 512,
        "qk_rope_head_dim": 64,
        "q_lora_rank": 1280,
        "o_lora_rank": 1024,
        "o_groups": 8,
        "n_routed_experts": 384,
        "n_shared_experts": 1,
        "num_experts_per_tok": 6,
        "tie_word_embeddings": False,
        "sliding_window": 128,
        "compress_ratios": [0, 0] + [2] * 18 + [1] * 20 + [0, 0, 0],
        "kv_source_layer_ids": [2, 8, 14, 20],
        "index_source_layer_ids": [2, 8, 14, 20, 24, 28, 32, 36],
        "index_n_heads": 32,
        "index_head_dim": 128,
        "hc_mult": 4,
        "engram_layer_ids": [1, 14],
        "engram_num_embeddings": [384006168, 384016682],
        "engram_max_ngram_size": 4,
        "engram_n_heads": 8,
        "engram_head_dim": 256,
        "num_nextn_predict_layers": 3,
    }
    quant = {"quant_method": "fp8", "weight_block_size": [32, 32], "expert_dtype": "fp4"}
    return {
        "architectures": ["DeepseekV41ForCausalLM"],
        "model_type": "deepseek_v41",
        "quantization_config": quant,
        "text_config": text,
    }


def test_deepseek_v41_caches_on_its_source_layers_and_engram_in_host_memory() -> None:
    """DeepSeek V4.1: every layer's sliding window (32-token blocks), the compressed entries (ratio 2
    or 1) and the indexer's keys only on kv_source_layer_ids (64-token blocks), a ratio-2 source's
    compressor state a ring; vLLM 0.33's own functions give the blocks and logged tokens below
    (it was 25,317 tokens for 1 GiB where vLLM logs 70,961). Its weights: MXFP4 experts, the engram
    tables (~203 GB) in host memory, the DSpark stages not loaded: 300.2 GB at TP1 by vLLM's modules
    without a vision tower (hwprofile 298.6; it was 606 GB). Its DSpark stages are no MTP head: vLLM refuses mtp."""
    from hwprofile.plan.compressed import compressed_cache

    m = parse_config(_dsv41_flash(), "v41", "test", None)
    assert m.mtp_layers == 0
    # vLLM's modules without the vision tower (970.5 MB) this config lacks: 300,173,788,608 B, of which
    # wo_a dequantized to bf16 on SM90 (+1.36 GB over its MXFP8 bytes, not modelled)
    assert abs(m.weights_bytes - 300_173_788_608) / 300_173_788_608 < 0.006
    c = m.stack.compressed
    assert c is not None and c.sources == (2, 8, 14, 20)
    for mem, length, flight, want in (
        (1 << 30, 8192, 4096, (116_928, 9_182, 1_060, 70_961)),
        (1 << 30, 131072, 16384, (116_928, 9_182, 5_668, 212_332)),
        (20 << 30, 8192, 16384, (116_928, 183_658, 1_928, 780_355)),
    ):
        x = compressed_cache(c, mem, length, flight)
        assert (x.bytes_per_block, x.num_blocks, x.blocks_per_request, x.logged_tokens) == want
    text = _dsv41_flash()["text_config"]
    for bad, words in (
        ({**text, "kv_source_layer_ids": [0, 2]}, "kv_source_layer_ids"),
        ({**text, "compress_ratios": [4] * 43}, "compress_ratios"),
        ({**text, "compress_ratios": [0] * 43}, "no compressed layer"),
    ):
        with pytest.raises(ValueError, match=words):
            parse_config({**_dsv41_flash(), "text_config": bad}, "v41", "test", None)


def test_deepseek_v41_engram_tables_need_the_hosts_memory(host_of, empty_root, tmp_path) -> None:
    """DeepSeek V4.1-Flash's engram tables: 768,022,850 rows of 256 fp8 values and 8 scale bytes
    (202.76 GB) in pinned host memory per instance: said in the plan, refused on a host without it."""
    import json

    from hwprofile.pipeline import make_plan
    from hwprofile.plan.refusal import PlanRefused

    m = parse_config(_dsv41_flash(), "v41", "test", None)
    assert m.host_bytes == 768_022_850 * 264
    d = tmp_path / "v41"
    d.mkdir()
    (d / "config.json").write_text(json.dumps(_dsv41_flash()))
    host = host_of("h100-sxm-8x")
    plan = make_plan(host._replace(memory_bytes=2 << 40), empty_root, environ={}, model=str(d), sets=[])
    assert any(r.key.endswith("memory.host_bytes") and r.value == m.host_bytes for r in plan.reasons)
    # its MXFP4 experts on H100: Humming's tile, said in the plan
    assert any(r.key == "model.expert_padding" and r.value == "64 x 1" for r in plan.reasons)
    with pytest.raises(PlanRefused, match="pinned host memory"):
        make_plan(host._replace(memory_bytes=128 << 30), empty_root, environ={}, model=str(d), sets=[])


def test_mxfp4_experts_are_padded_to_the_tile_of_the_kernel_vllm_picks() -> None:
    """vLLM's Mxfp4MoEMethod rounds each rank's expert shapes up to its kernel's tile
    (mxfp4_round_up_hidden_size_and_intermediate_size, 0.32-0.33). DeepSeek V4.1-Flash's experts
    (2304 wide: 288,777,830,400 B by vLLM's modules) on H100 run Humming (64): 288 -> 320 at TP8, so a
    rank holds 42.34 GB by vLLM's modules where unpadded arithmetic gave 37.9; on an A100, Marlin (128):
    576 -> 640 at TP4. gpt-oss on Marlin pads its hidden 2880 to 3072 too; an unknown GPU pads nothing,
    and says so."""
    from hwprofile.model.resolve import resolve_model
    from hwprofile.plan.loaded import expert_tile
    from hwprofile.plan.memory import expert_padding, weights_per_gpu
    from hwprofile.plan.reasons import Reasons

    m = parse_config(_dsv41_flash(), "v41", "test", None)
    assert m.mxfp4_expert_bytes == 288_777_830_400
    r = Reasons({})
    hopper = expert_tile(m, "9.0", r)
    assert (
        r.items[-1].value == "64 x 1"
        and "Humming" in r.items[-1].reason
        and "288 -> 320" in r.items[-1].reason
    )
    assert [expert_padding(hopper, tp) for tp in (1, 2, 4, 8)] == [0, 0, 0, 4_010_803_200]
    assert abs(weights_per_gpu(hopper, 8) - 42_335_380_160) / 42_335_380_160 < 0.015
    assert abs(weights_per_gpu(m, 8) - 42_335_380_160) / 42_335_380_160 > 0.09  # unpadded, as it was
    ampere = expert_tile(m, "8.0", Reasons({}))
    assert expert_padding(ampere, 4) == 8_021_606_400 and expert_padding(ampere, 2) == 0
    oss = resolve_model("openai/gpt-oss-120b", "model")
    assert 0 < oss.mxfp4_expert_bytes < oss.weights_bytes
    marlin = expert_tile(oss, "8.6", Reasons({}))
    grown = oss.mxfp4_expert_bytes * (2944 * 3072 - 2880 * 2880) // (2880 * 2880)
    assert expert_padding(marlin, 1) == grown
    assert expert_padding(expert_tile(oss, "9.0", Reasons({})), 1) == 0  # the OAI Triton kernels: 64
    r = Reasons({})
    assert expert_tile(oss, None, r).expert_tile == (1, 1) and r.items[-1].value == "unknown"
    assert parse_config(_kimi_k3(), "k3", "test", None).mxfp4_expert_bytes == 0  # no MXFP4 experts


def test_gpt_oss_on_hopper_runs_marlin_until_vllm_bundles_the_triton_kernels() -> None:
    """gpt-oss's MXFP4 experts on SM90 take the OAI Triton kernels only where ``triton_kernels`` imports:
    vLLM builds it in from 0.12.0 (vllm.third_party.triton_kernels); 0.10.2 and 0.11.0 neither require
    nor install it (requirements/cuda.txt, docker/Dockerfile), so get_mxfp4_backend picks Marlin and its
    128 x 256 tile. vLLM 0.10.1 on an H100 logs Marlin and "Model loading took 65.9651 GiB"
    (vllm-project/vllm#23278): the plan's weights, padded to Marlin's tile, come within 0.2 % of it."""
    from hwprofile.model.resolve import resolve_model
    from hwprofile.plan.loaded import expert_tile
    from hwprofile.plan.memory import GiB, weights_per_gpu
    from hwprofile.plan.reasons import Reasons

    oss = resolve_model("openai/gpt-oss-120b", "model")
    for version in ("0.10.1", "0.10.2", "0.11.0"):
        r = Reasons({})
        old = expert_tile(oss, "9.0", r, version)
        assert (
            old.expert_tile == (128, 256)
            and "Marlin (no triton_kernels in vLLM before 0.12" in r.items[-1].reason
        )
        assert abs(weights_per_gpu(old, 1) / GiB - 65.9651) / 65.9651 < 0.002
    for version in ("0.12.0", "0.32.0", None):  # None: an unknown release, the newest behaviour
        r = Reasons({})
        assert (
            expert_tile(oss, "9.0", r, version).expert_tile == (64, 1) and "OAI Triton" in r.items[-1].reason
        )
    # Marlin on Ampere whatever the release; other MXFP4 models on Hopper keep their own list
    assert expert_tile(oss, "8.0", Reasons({}), "0.12.0").expert_tile == (128, 256)


def test_the_triton_kernels_keep_gpt_oss_expert_scales_twice_until_vllm_frees_them() -> None:
    """The OAI Triton path swizzles the experts' block scales into a copy of its own and converts their
    biases to fp32; before vLLM 0.25 the checkpoint's scales stay beside the copy (only the weights are
    deleted). vLLM 0.14.1 on an H100, "Using Triton backend", logs "Model loading took 64.38 GiB" for
    gpt-oss-120b (vllm-project/vllm#33155), the checkpoint 60.8: the plan comes within 0.5 % of it; and
    gpt-oss-20b takes 13.47 GiB on an H100 on the same backend (llm-d-benchmark's empirical memory
    results)."""
    from hwprofile.model.resolve import resolve_model
    from hwprofile.plan.loaded import expert_tile
    from hwprofile.plan.memory import GiB, weights_per_gpu
    from hwprofile.plan.reasons import Reasons

    for name, logged in (("openai/gpt-oss-120b", 64.38), ("openai/gpt-oss-20b", 13.47)):
        model = resolve_model(name, "model")
        r = Reasons({})
        held = weights_per_gpu(expert_tile(model, "9.0", r, "0.14.1"), 1) / GiB
        assert abs(held - logged) / logged < 0.007 and "block scales twice" in r.items[-1].reason
        freed = weights_per_gpu(expert_tile(model, "9.0", Reasons({}), "0.25.0"), 1) / GiB
        scales = model.mxfp4_expert_bytes / 17 / GiB
        assert abs(held - freed - scales) < 0.01  # from 0.25 only the fp32 biases remain beside them
        assert model.weights_bytes / GiB < freed < model.weights_bytes / GiB + 0.1
    # Marlin (Ampere, or Hopper before the bundled kernels) keeps no copies
    oss = resolve_model("openai/gpt-oss-120b", "model")
    assert expert_tile(oss, "8.0", Reasons({}), "0.14.1").expert_kernel_bytes == 0
    assert expert_tile(oss, "9.0", Reasons({}), "0.11.0").expert_kernel_bytes == 0


def test_deepseek_v4_refuses_a_16_bit_cache_as_vllm_does() -> None:
    import pytest

    from hwprofile.plan.engine import kv_cache_dtype
    from hwprofile.plan.refusal import PlanRefused

    m = parse_config(_dsv4_flash(), "v4", "test", None)
    assert kv_cache_dtype("auto", _gpu("9.0"), m)[:2] == ("auto", 1)
    with pytest.raises(PlanRefused, match="fp8_ds_mla"):
        kv_cache_dtype("bfloat16", _gpu("9.0"), m)


def test_a_qsa_ring_that_does_not_divide_the_block_is_refused(host_of, empty_root, tmp_path) -> None:
    """vLLM asserts that QSA's raw-key ring (the ratio plus the speculative tokens, rounded up to the
    ratio) divides the attention block: 5 speculative tokens make a ring of 12 rows, which a block of
    320 tokens does not hold; the plan refuses it and names k that fit (vLLM 0.32's 288 would)."""
    import json

    from hwprofile.pipeline import make_plan
    from hwprofile.plan.refusal import PlanRefused

    d = tmp_path / "q38fn"
    d.mkdir()
    (d / "config.json").write_text(json.dumps(_qwen38_flash_next()))
    host = host_of("h100-sxm-8x")  # vLLM 0.33: blocks on the 64-token grid of GDN's prefill checkpoints
    host = host._replace(software=host.software._replace(vllm_version="0.33.0"))
    base = ["speculative.method=ngram", "layout.workload_concurrency=1", "layout.tensor_parallel_size=8"]
    with pytest.raises(PlanRefused, match="ring of 12 rows") as e:
        make_plan(
            host, empty_root, environ={}, model=str(d), sets=[*base, "speculative.num_speculative_tokens=5"]
        )
    assert "speculative.num_speculative_tokens=4" in " ".join(e.value.report())
    plan = make_plan(
        host, empty_root, environ={}, model=str(d), sets=[*base, "speculative.num_speculative_tokens=4"]
    )
    assert plan.instances[0].memory.vllm_logged_kv_tokens


def test_mxfp4_padding_by_release_and_across_pipeline_stages_and_nodes() -> None:
    """Humming leads SM90's MXFP4 list from vLLM 0.32 (absent in 0.27-0.29: Marlin's 128 x 256 there). A
    pipeline stage holds its share of the experts, padded at its own TP; TP across nodes pads each rank
    at the whole degree (DeepSeek V4.1-Flash at TP16: 144 -> 192 a rank with Humming, where a node's TP8
    arithmetic gave 288 -> 320); Kimi-K3's compressed-tensors MXFP4, which vLLM rewrites to mxfp4, too."""
    from hwprofile.plan.loaded import expert_tile
    from hwprofile.plan.memory import expert_padding
    from hwprofile.plan.nodes import _shard, stage_of
    from hwprofile.plan.reasons import Reasons

    m = parse_config(_dsv41_flash(), "v41", "test", None)
    r = Reasons({})
    old = expert_tile(m, "9.0", r, "0.29.0")
    assert old.expert_tile == (128, 256) and "Marlin" in r.items[-1].reason
    new = expert_tile(m, "9.0", Reasons({}), "0.33.0")
    assert new.expert_tile == (64, 1)
    assert abs(expert_padding(stage_of(new, 2), 8) - expert_padding(new, 8) / 2) < 2
    whole = m.mxfp4_expert_bytes * (192 - 144) // (144 * 16)
    assert abs(expert_padding(_shard(new, 2), 8) - whole) < 2 and whole > expert_padding(new, 8)
    q = {"quant_method": "compressed-tensors", "format": "mxfp4-pack-quantized"}
    q |= {
        "config_groups": {
            "g": {"targets": ["Linear"], "weights": {"num_bits": 4, "type": "float", "group_size": 32}}
        }
    }
    assert parse_config({**_kimi_k3(), "quantization_config": q}, "k3", "test", None).mxfp4_expert_bytes > 0


def test_the_mtp_layers_mxfp4_experts_are_padded_where_mtp_loads_them() -> None:
    """DeepSeek V4's MTP block is a decoder layer under the same quantization: its MXFP4 experts are
    padded to the kernel's tile like the decoder's, once MTP speculation loads them, and not otherwise
    (the target skips the mtp. weights)."""
    from hwprofile.config.settings import Settings
    from hwprofile.plan.loaded import as_loaded
    from hwprofile.plan.memory import expert_padding
    from hwprofile.plan.reasons import Reasons

    cfg = {**_dsv4_flash(), "moe_intermediate_size": 2304}  # 288 a rank at TP8: Humming pads to 320
    m = parse_config(cfg, "v4", "test", None)
    assert 0 < m.mtp_mxfp4_expert_bytes < m.mtp_bytes and m.mxfp4_expert_bytes > 0
    off = as_loaded(m, Settings(), None, "0.32.0", Reasons({}), "9.0")
    on = as_loaded(m, Settings(), "mtp", "0.32.0", Reasons({}), "9.0")
    assert off.mxfp4_expert_bytes == m.mxfp4_expert_bytes
    assert on.mxfp4_expert_bytes == m.mxfp4_expert_bytes + m.mtp_mxfp4_expert_bytes
    grown = expert_padding(on, 8) - expert_padding(off, 8)
    assert grown == m.mtp_mxfp4_expert_bytes * (320 - 288) // (288 * 8)
    # folded once: the loaded facts planned again add nothing
    again = as_loaded(on, Settings(), "mtp", "0.32.0", Reasons({}), "9.0")
    assert again.mxfp4_expert_bytes == on.mxfp4_expert_bytes and again.mtp_mxfp4_expert_bytes == 0


def test_gpt_oss_on_hopper_runs_the_triton_kernels_installed_beside_an_older_vllm() -> None:
    """Before 0.12 vLLM imports an optional ``triton_kernels``: where the host's snapshot lists it
    (vLLM's gpt-oss recipe once asked for it), gpt-oss's experts on SM90 take the OAI Triton kernels and
    their 64 x 1 tile, not Marlin's."""
    from hwprofile.model.resolve import resolve_model
    from hwprofile.plan.loaded import expert_tile
    from hwprofile.plan.reasons import Reasons

    oss = resolve_model("openai/gpt-oss-120b", "model")
    r = Reasons({})
    assert expert_tile(oss, "9.0", r, "0.11.0", ("triton-kernels 1.0.0",)).expert_tile == (64, 1)
    assert "triton-kernels 1.0.0 installed" in r.items[-1].reason
    assert expert_tile(oss, "9.0", Reasons({}), "0.11.0", ("flashinfer-python 0.3.1",)).expert_tile == (
        128,
        256,
    )
    # vLLM 0.10.1 pins torch 2.7.1, below what its Triton MXFP4 path takes: Marlin all the same
    old = expert_tile(oss, "9.0", Reasons({}), "0.10.1", ("triton-kernels 1.0.0",))
    assert old.expert_tile == (128, 256)
