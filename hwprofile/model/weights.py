"""Weights as vLLM loads them: every parameter tensor of a model, layer by layer and per layer kind,
and the bytes each takes under the checkpoint's quantization.

A model is a list of :class:`Tensor` records (:func:`tensors`), named as the Hugging Face checkpoint
names its modules (``model.language_model.layers.3.self_attn.q_proj``), so that a quantization
config's ``ignore`` list matches them the way vLLM matches it. From those records:

- :func:`count_params`: decoder, embedding, LM head, vision tower and MTP head, the total, and the
  parameters read per decoded token (routed experts only).
- :func:`weights_bytes`: bytes per part, each linear weight at its quantized width plus its scales
  and zero points, the rest (embeddings, norms, convolutions, the ignore list) at 16 bits;
  ``language_only`` drops the vision tower (vLLM's ``--language-model-only``).

Per layer kind, as vLLM 0.33 builds them (``vllm/model_executor``):

- full / sliding / chunked attention: q, k, v, o (``attn_output_gate`` of Qwen3-Next/3.5 doubles q:
  ``models/qwen3_next.py`` ``Qwen3NextAttention``), q/k norms, biases, gpt-oss sinks; MLA as DeepSeek.
- Gated DeltaNet (``layers/mamba/gdn/qwen_gdn_linear_attn.py``): in_proj_qkvz (q, k, v, z), in_proj_ba,
  conv1d (no bias), dt_bias, A_log, a gated norm over one V head, out_proj.
- Mamba2 (``layers/mamba/mamba_mixer2.py``): in_proj (x, z, B, C, dt), conv1d (+ bias), A, D, dt_bias,
  a gated norm over the inner width, out_proj. Mamba1 (``mamba_mixer.py``): in_proj, conv1d, x_proj,
  dt_proj, A, D, out_proj.
- MoE: router (+ ``e_score_correction_bias`` where the router has one), every expert, shared experts
  (Llama 4's: one of the experts' width, ``llama4.py`` ``Llama4MoE``; its dense layers are
  ``intermediate_size_mlp`` wide) and the shared-expert gate (``qwen3_next.py``
  ``Qwen3NextSparseMoeBlock``; ``nemotron_h.py`` ``NemotronHMoE``: ungated relu2 experts). Dense MLPs:
  gate/up/down (up/down for relu2).
- MTP (``qwen3_5_mtp.py``): one full-attention decoder layer per MTP layer, fc 2H→H and three norms;
  DeepSeek-V3 style heads also carry their own embedding and LM head. vLLM's target model skips the
  ``mtp.`` weights (``WeightsMapper(orig_to_new_prefix={"mtp.": None})``): they load only with MTP
  speculation.
- Vision towers from ``vision_config``: Qwen3-VL/3.5 (exact), Qwen2.5-VL, and a generic ViT (SigLIP
  style) with its projector, to a few per cent.

Quantization formats: :mod:`.quant`.

Pure: dicts in, numbers out; nothing from torch or transformers.
"""

from collections.abc import Sequence
from typing import Any, NamedTuple

from .layers import (
    MIXERS,
    MLPS,
    PARALLEL_STATE_TYPES,
    LayerKind,
    dsv4_ratios,
    dsv41_ratios,
    indexed_layers,
    is_dsv4,
    is_dsv41,
    kda_geometry,
)
from .layers import layer_kinds as read_layer_kinds
from .quant import Scheme, read_quant
from .tensor import PARTS, QuantGrid, Tensor

MAMBA2_TYPES = ("nemotron_h", "granitemoehybrid", "bamba", "falcon_h1", "zamba2", "mamba2")


class ParamBreakdown(NamedTuple):
    decoder: int  # decoder layers and the final norm
    embed: int  # input embedding (0 where tied: counted once, as the embedding)
    lm_head: int  # output head where untied
    vision: int  # vision (and audio) towers and their projectors: the multimodal encoders
    mtp: int  # multi-token-prediction layers (their own embedding/head where they carry one)
    total: int  # everything the checkpoint holds
    active: int  # read per decoded token: language model with only the routed experts


# --------------------------------------------------------------------------- config reading


def _int(cfg: dict[str, Any], *keys: str, default: int = 0) -> int:
    for key in keys:
        v = cfg.get(key)
        if v is None:
            continue
        if type(v) is not int or v < 0 or v > 1 << 32:
            raise ValueError(f"{key}: expected a non-negative integer, got {v!r}"[:120])
        return v
    return default


def _str(cfg: dict[str, Any], key: str) -> str:
    v = cfg.get(key)
    return v if type(v) is str else ""


def flat_config(cfg: dict[str, Any]) -> dict[str, Any]:
    """The language model's keys at the top (a multimodal wrapper's ``text_config`` merged over it)."""
    text = cfg.get("text_config")
    return {**cfg, **text} if isinstance(text, dict) else dict(cfg)


def _mtype(cfg: dict[str, Any]) -> str:
    return _str(cfg, "model_type")


def _is_qwen_next(mt: str) -> bool:
    return mt.startswith(("qwen3_next", "qwen3_5"))


def layer_kinds(cfg: dict[str, Any]) -> list[LayerKind]:
    """Each decoder layer's kind (:func:`hwprofile.model.layers.layer_kinds`, the one reading of every
    layer schema), as the list :func:`count_params` and :func:`weights_bytes` take."""
    return list(read_layer_kinds(cfg))


class _Shape(NamedTuple):
    mt: str
    hidden: int
    heads: int
    kv: int
    head_dim: int
    inter: int
    dense_inter: int  # a dense layer's MLP beside MoE layers (Llama 4's intermediate_size_mlp), else inter
    vocab: int
    tie: bool
    gated_mlp: bool  # gate+up+down (SwiGLU) rather than up+down (relu2)


def _shape(c: dict[str, Any]) -> _Shape:
    hidden = _int(c, "hidden_size")
    heads = _int(c, "num_attention_heads") or 1
    kv = _int(c, "num_key_value_heads") or heads
    head_dim = _int(c, "head_dim") or (hidden // heads if heads else 0)
    act = _str(c, "mlp_hidden_act") or _str(c, "hidden_act")
    widths = c.get("intermediate_size")
    # a list, one a layer (Gemma-3n): the widest here, each layer its own in tensors()
    inter = max(widths, default=0) if isinstance(widths, list) else _int(c, "intermediate_size")
    inter = inter or 4 * hidden
    return _Shape(
        mt=_mtype(c),
        hidden=hidden,
        heads=heads,
        kv=kv,
        head_dim=head_dim,
        inter=inter,
        # a dense layer's MLP beside MoE layers: Llama 4's intermediate_size_mlp, MiniMax-M3's
        # dense_intermediate_size
        dense_inter=_lfm2_ff(c, inter)
        if _mtype(c) == "lfm2"
        else _int(c, "intermediate_size_mlp", "dense_intermediate_size") or inter,
        vocab=_int(c, "padded_vocab_size", "vocab_size"),  # Inkling, ChatGLM: the embedding's own rows
        tie=c.get("tie_word_embeddings") is True,
        gated_mlp=act not in ("relu2", "gelu_new_no_gate"),
    )


def _lfm2_ff(c: dict[str, Any], inter: int) -> int:
    """LFM2's MLP width (``lfm2.py`` ``Lfm2MLP``): with ``block_auto_adjust_ff_dim``, two thirds of
    ``intermediate_size`` times ``block_ffn_dim_multiplier``, rounded up to ``block_multiple_of``."""
    if c.get("block_auto_adjust_ff_dim") is not True:
        return inter
    ff = int(2 * inter / 3)
    mult = c.get("block_ffn_dim_multiplier")
    if isinstance(mult, (int, float)) and not isinstance(mult, bool) and mult > 0:
        ff = int(mult * ff)
    step = _int(c, "block_multiple_of", default=256) or 256
    return step * -(-ff // step)


class _Names(NamedTuple):
    layer: str  # format with the layer index
    embed: str
    lm_head: str
    final_norm: str
    vision: str
    mtp: str


def _names(cfg: dict[str, Any], s: _Shape) -> _Names:
    if s.mt == "nemotron_h":
        return _Names("backbone.layers.{}", "backbone.embeddings", "lm_head", "backbone.norm_f", "", "mtp")
    if isinstance(cfg.get("text_config"), dict):  # multimodal wrapper (transformers' naming)
        return _Names(
            "model.language_model.layers.{}",
            "model.language_model.embed_tokens",
            "lm_head",
            "model.language_model.norm",
            "model.visual",
            "mtp",
        )
    return _Names("model.layers.{}", "model.embed_tokens", "lm_head", "model.norm", "model.visual", "mtp")


# --------------------------------------------------------------------------- per layer kind


def _lin(name: str, part: str, rows: int, cols: int, count: int = 1, active: int = -1) -> Tensor:
    return Tensor(name, part, rows, cols, count, active)


def _vec(name: str, part: str, n: int, count: int = 1, active: int = -1) -> Tensor:
    return Tensor(name, part, 1, n, count, active, linear=False, vector=True)


def _indexer(c: dict[str, Any], h: int, q_rank: int, p: str, part: str) -> list[Tensor]:
    """DeepSeek-V3.2's sparse-attention indexer (``deepseek_v2.py`` ``Indexer``): its query from the
    query latent, one key head, a weight per head; every projection replicated on each rank. Named
    under ``.indexer.``: :func:`tensors` keeps it on the layers that compute their own top-k."""
    if "index_topk" not in c:
        return []
    head = _int(c, "index_head_dim", default=128)
    n = _int(c, "index_n_heads", default=64)
    return [
        Tensor(f"{p}.indexer.wq_b", part, n * head, q_rank or h, replicated=True),
        Tensor(f"{p}.indexer.wk", part, head, h, replicated=True),
        Tensor(f"{p}.indexer.k_norm", part, 1, 2 * head, linear=False, vector=True, replicated=True),
        Tensor(f"{p}.indexer.weights_proj", part, n, h, replicated=True),
    ]


def _mla(c: dict[str, Any], h: int, heads: int, p: str, part: str) -> list[Tensor]:
    """Multi-head latent attention (DeepSeek-V2/V3, ``deepseek_v2.py`` ``DeepseekV2MLAAttention``)."""
    rank = _int(c, "kv_lora_rank")
    rope = _int(c, "qk_rope_head_dim")
    nope = _int(c, "qk_nope_head_dim")
    v_dim = _int(c, "v_head_dim") or nope
    q_rank = _int(c, "q_lora_rank")
    out: list[Tensor] = []
    # the down-projections to the latents are replicated (fused_qkv_a_proj with disable_tp, or
    # ReplicatedLinear): every rank holds them whole
    if q_rank:
        out += [
            Tensor(f"{p}.q_a_proj", part, q_rank, h, replicated=True),
            _vec(f"{p}.q_a_layernorm", part, q_rank),
            _lin(f"{p}.q_b_proj", part, heads * (nope + rope), q_rank),
        ]
    else:
        out.append(_lin(f"{p}.q_proj", part, heads * (nope + rope), h))
    if c.get("gated_mla") is True:  # HY-V4's output gate (hy_v4/nvidia/attention.py linear_gate)
        per_head = 1 if c.get("gating_type") == "headwise" else v_dim
        out.append(_lin(f"{p}.linear_gate", part, heads * per_head, h))
    if c.get("learnable_sink") is True:
        out.append(_vec(f"{p}.learnable_sink", part, 2 * heads))  # fp32: two bf16 widths
    return [
        *out,
        *_indexer(c, h, q_rank, p, part),
        Tensor(f"{p}.kv_a_proj_with_mqa", part, rank + rope, h, replicated=True),
        _vec(f"{p}.kv_a_layernorm", part, rank),
        _lin(f"{p}.kv_b_proj", part, heads * (nope + v_dim), rank),
        _lin(f"{p}.o_proj", part, h, heads * v_dim),
    ]


# the families whose attention normalizes each head's query and key (q_norm, k_norm)
QK_NORMED = ("qwen3", "qwen3_moe", "gemma3", "gemma3_text", "gemma3n_text", "lfm2", "lfm2_moe")


def _attention(c: dict[str, Any], s: _Shape, kind: LayerKind, p: str, part: str) -> list[Tensor]:
    """Softmax attention (full, sliding, chunked) or MLA; ``p`` is the module prefix."""
    h = s.hidden
    heads = getattr(kind, "num_heads", None) or s.heads
    kv = getattr(kind, "num_kv_heads", None) or s.kv
    hd = getattr(kind, "head_dim", None) or s.head_dim
    if _int(c, "kv_lora_rank"):  # DeepSeek MLA (deepseek_v2.py DeepseekV2MLAAttention)
        return _mla(c, h, heads, p, part)
    vd = _int(c, "v_head_dim") or hd  # V's head size where it differs from K's (MiMo-V2)
    if kind.mixer == "sliding" and ("swa_num_key_value_heads" in c or "swa_head_dim" in c):
        # MiMo-V2's sliding-window layers: heads of their own (mimo_v2.py MiMoV2DecoderLayer)
        heads = _int(c, "swa_num_attention_heads") or heads
        kv = _int(c, "swa_num_key_value_heads") or kv
        hd = _int(c, "swa_head_dim") or hd
        vd = _int(c, "swa_v_head_dim") or hd  # absent: V as wide as K (mimo_v2.py)
    gate = c.get("attn_output_gate", True) is not False if _is_qwen_next(s.mt) else False
    out = [
        _lin(f"{p}.q_proj", part, heads * hd * (2 if gate else 1), h),
        _lin(f"{p}.k_proj", part, kv * hd, h),
        _lin(f"{p}.v_proj", part, kv * vd, h),
        _lin(f"{p}.o_proj", part, h, heads * vd),
    ]
    if c.get("attention_bias") is True:  # llama-style: q, k, v and o
        out += [_vec(f"{p}.qkv_bias", part, (heads + kv) * hd + kv * vd), _vec(f"{p}.o_proj.bias", part, h)]
    elif s.mt in ("qwen2", "qwen2_moe") or (_is_qwen_next(s.mt) and c.get("qkv_bias") is True):
        out.append(_vec(f"{p}.qkv_bias", part, (heads + 2 * kv) * hd))
    if (
        s.mt in QK_NORMED
        or s.mt.startswith(("qwen3_vl", "qwen3_omni"))  # their text models are Qwen3's
        or _is_qwen_next(s.mt)
        or (s.mt.startswith("hunyuan") and c.get("use_qk_norm") is True)
    ):
        out += [_vec(f"{p}.q_norm", part, hd), _vec(f"{p}.k_norm", part, hd)]
    if s.mt == "gpt_oss":
        out.append(_vec(f"{p}.sinks", part, heads))
    return out


def _gdn(c: dict[str, Any], s: _Shape, p: str, part: str) -> list[Tensor]:
    """Gated DeltaNet (Qwen3-Next, Qwen3.5/3.6/3.8)."""
    h = s.hidden
    nk = _int(c, "linear_num_key_heads")
    nv = _int(c, "linear_num_value_heads")
    dk = _int(c, "linear_key_head_dim")
    dv = _int(c, "linear_value_head_dim")
    conv = _int(c, "linear_conv_kernel_dim", default=4)
    if not (nk and nv and dk and dv):
        raise ValueError(
            "linear_num_key_heads, linear_num_value_heads, linear_key_head_dim, linear_value_head_dim: "
            "needed to size the Gated DeltaNet layers"
        )
    key, value = nk * dk, nv * dv
    if s.mt.startswith("qwen3_next"):  # one fused, interleaved tensor each
        proj = [
            _lin(f"{p}.in_proj_qkvz", part, 2 * key + 2 * value, h),
            _lin(f"{p}.in_proj_ba", part, 2 * nv, h),
        ]
    else:
        proj = [
            _lin(f"{p}.in_proj_qkv", part, 2 * key + value, h),
            _lin(f"{p}.in_proj_z", part, value, h),
            _lin(f"{p}.in_proj_b", part, nv, h),
            _lin(f"{p}.in_proj_a", part, nv, h),
        ]
    return [
        *proj,
        Tensor(f"{p}.conv1d", part, 2 * key + value, conv, linear=False),
        _vec(f"{p}.dt_bias", part, nv),
        _vec(f"{p}.A_log", part, nv),
        _vec(f"{p}.norm", part, dv),
        _lin(f"{p}.out_proj", part, h, value),
    ]


def _mamba2(c: dict[str, Any], s: _Shape, p: str, part: str) -> list[Tensor]:
    """Mamba2 mixer (Nemotron-H, Granite-4 hybrid, Falcon-H1, Zamba2, Mamba2)."""
    h = s.hidden
    heads = _int(c, "mamba_num_heads", "mamba_n_heads", "mamba_nheads", "n_mamba_heads")
    head_dim = _int(
        c, "mamba_head_dim", "mamba_d_head", "mamba_headdim", "head_dim" if s.mt == "mamba2" else "_"
    )
    expand = _int(c, "mamba_expand", "expand", default=2)
    inter = heads * head_dim if heads and head_dim else _int(c, "mamba_d_ssm") or expand * h
    if not heads:
        heads = _int(c, "num_heads") if s.mt == "mamba2" else 0
        heads = heads or inter // (head_dim or 64)
    state = _int(c, "ssm_state_size", "mamba_d_state", "state_size", default=128)
    groups = _int(c, "n_groups", "mamba_n_groups", "mamba_ngroups", default=1)
    conv = _int(c, "conv_kernel", "mamba_d_conv", default=4)
    conv_bias = c.get("use_conv_bias", c.get("mamba_conv_bias", True)) is not False
    bias_key = "add_bias_linear" if s.mt == "zamba2" else "use_bias"
    proj_bias = c.get(bias_key, c.get("mamba_proj_bias", False)) is True
    conv_dim = inter + 2 * groups * state
    out = [
        _lin(f"{p}.in_proj", part, 2 * inter + 2 * groups * state + heads, h),
        Tensor(f"{p}.conv1d", part, conv_dim, conv, linear=False),
        _vec(f"{p}.A_log", part, heads),
        _vec(f"{p}.D", part, heads),
        _vec(f"{p}.dt_bias", part, heads),
        _vec(f"{p}.norm", part, inter),
        _lin(f"{p}.out_proj", part, h, inter),
    ]
    if conv_bias:
        out.append(_vec(f"{p}.conv1d.bias", part, conv_dim))
    if proj_bias:
        out += [
            _vec(f"{p}.in_proj.bias", part, 2 * inter + 2 * groups * state + heads),
            _vec(f"{p}.out_proj.bias", part, h),
        ]
    return out


def _mamba1(c: dict[str, Any], s: _Shape, p: str, part: str) -> list[Tensor]:
    """Mamba1 mixer (Jamba, Falcon-Mamba, Mamba)."""
    h = s.hidden
    inter = _int(c, "mamba_expand", "expand", default=2) * h
    state = _int(c, "mamba_d_state", "state_size", default=16)
    conv = _int(c, "mamba_d_conv", "conv_kernel", default=4)
    dt_rank = c.get("mamba_dt_rank", c.get("time_step_rank"))
    rank = dt_rank if type(dt_rank) is int and dt_rank > 0 else -(-h // 16)
    out = [
        _lin(f"{p}.in_proj", part, 2 * inter, h),
        Tensor(f"{p}.conv1d", part, inter, conv, linear=False),
        _vec(f"{p}.conv1d.bias", part, inter),
        _lin(f"{p}.x_proj", part, rank + 2 * state, inter),
        _lin(f"{p}.dt_proj", part, inter, rank),
        _vec(f"{p}.dt_proj.bias", part, inter),
        Tensor(f"{p}.A_log", part, inter, state, linear=False),
        _vec(f"{p}.D", part, inter),
        _lin(f"{p}.out_proj", part, h, inter),
    ]
    if s.mt == "jamba":  # dt / B / C layer norms
        out.append(_vec(f"{p}.dt_layernorm+b+c", part, rank + 2 * state))
    return out


def _linear_attention(c: dict[str, Any], s: _Shape, p: str, part: str, kda: bool) -> list[Tensor]:
    """Linear attention: MiniMax lightning attention (qkv, output gate, out, norm) or Kimi Delta
    Attention (q, k, v, o, low-rank decay and gate projections, beta, short convolutions)."""
    h = s.hidden
    if not kda:
        la = v if isinstance(v := c.get("linear_attn_config"), dict) else {}
        n, d = _int(la, "num_heads") or s.heads, _int(la, "head_dim") or s.head_dim
        return [
            _lin(f"{p}.qkv_proj", part, 3 * n * d, h),
            _lin(f"{p}.output_gate", part, n * d, h),
            _lin(f"{p}.out_proj", part, h, n * d),
            _vec(f"{p}.norm", part, n * d),
        ]
    n, d, conv = kda_geometry(c, "the KDA layers")
    return [
        _lin(f"{p}.q_proj", part, n * d, h),
        _lin(f"{p}.k_proj", part, n * d, h),
        _lin(f"{p}.v_proj", part, n * d, h),
        Tensor(f"{p}.qkv_conv1d", part, 3 * n * d, conv, linear=False),
        _lin(f"{p}.f_a_proj", part, d, h),
        _lin(f"{p}.f_b_proj", part, n * d, d),
        _lin(f"{p}.g_a_proj", part, d, h),
        _lin(f"{p}.g_b_proj", part, n * d, d),
        _lin(f"{p}.b_proj", part, n, h),
        _vec(f"{p}.A_log", part, n),
        _vec(f"{p}.dt_bias", part, n * d),
        _vec(f"{p}.o_norm", part, d),
        _lin(f"{p}.o_proj", part, h, n * d),
    ]


def _short_conv(c: dict[str, Any], s: _Shape, p: str, part: str) -> list[Tensor]:
    """LFM2's gated short convolution (``layers/mamba/short_conv.py``): ``in_proj`` to B, C and x of
    the convolution's width, a depthwise kernel of ``conv_L_cache`` taps, ``out_proj`` back. LFM2
    convolves ``conv_dim``, LFM2-MoE the hidden size (``lfm2_moe.py``)."""
    h = s.hidden
    dim = (_int(c, "conv_dim") if s.mt == "lfm2" else 0) or h
    taps = _int(c, "conv_L_cache", default=3)
    out = [
        _lin(f"{p}.in_proj", part, 3 * dim, h),
        Tensor(f"{p}.conv", part, dim, taps, linear=False),
        _lin(f"{p}.out_proj", part, h, dim),
    ]
    if c.get("conv_bias") is True:
        out += [_vec(f"{p}.conv.bias", part, dim), _vec(f"{p}.in_proj.bias", part, 3 * dim)]
        out.append(_vec(f"{p}.out_proj.bias", part, h))
    return out


def _mlp(s: _Shape, p: str, part: str, inter: int, count: int = 1, active: int = -1) -> list[Tensor]:
    h = s.hidden
    if s.mt == "mixtral":  # block_sparse_moe.experts.N.w1 / w2 / w3
        return [
            _lin(f"{p}.w1", part, inter, h, count, active),
            _lin(f"{p}.w3", part, inter, h, count, active),
            _lin(f"{p}.w2", part, h, inter, count, active),
        ]
    gate = [_lin(f"{p}.gate_proj", part, inter, h, count, active)] if s.gated_mlp else []
    return [
        *gate,
        _lin(f"{p}.up_proj", part, inter, h, count, active),
        _lin(f"{p}.down_proj", part, h, inter, count, active),
    ]


def _moe(c: dict[str, Any], s: _Shape, p: str, part: str) -> list[Tensor]:
    from .arch import EXPERT_KEYS, TOPK_KEYS

    h = s.hidden
    experts = next((_int(c, k) for k in EXPERT_KEYS if _int(c, k)), 0)
    topk = next((_int(c, k) for k in TOPK_KEYS if _int(c, k)), 0) or experts
    topk = min(topk, experts)
    inter = _int(c, "moe_intermediate_size") or s.inter
    if s.mt == "gpt_oss":  # fused gate_up with biases, router with bias (gpt_oss.py)
        return [
            _lin(f"{p}.router", part, experts, h),
            _vec(f"{p}.router.bias", part, experts),
            _lin(f"{p}.experts.gate_up_proj", part, 2 * inter, h, experts, topk),
            _vec(f"{p}.experts.gate_up_proj_bias", part, 2 * inter, experts, topk),
            _lin(f"{p}.experts.down_proj", part, h, inter, experts, topk),
            _vec(f"{p}.experts.down_proj_bias", part, h, experts, topk),
        ]
    box = p.rsplit(".", 1)[0] + ".block_sparse_moe" if s.mt == "mixtral" else p
    out = [Tensor(f"{box}.gate", part, experts, h, replicated=True)]  # the router: ReplicatedLinear
    if s.mt in ("nemotron_h", "ernie4_5_moe") or _str(c, "topk_method") == "noaux_tc":
        out.append(_vec(f"{box}.gate.e_score_correction_bias", part, experts))
    latent = _int(c, "routed_expert_hidden_size")
    if latent and latent != h:  # Kimi-K3's latent MoE: the experts work in a narrower space
        out += [
            _lin(f"{box}.routed_expert_down_proj", part, latent, h),
            _lin(f"{box}.routed_expert_up_proj", part, h, latent),
        ]
        if c.get("latent_moe_use_norm") is not False:
            out.append(_vec(f"{box}.routed_expert_norm", part, latent))
        out += _mlp(s._replace(hidden=latent), f"{box}.experts.0", part, inter, experts, topk)
    else:
        out += _mlp(s, f"{box}.experts.0", part, inter, experts, topk)
    n_shared = _int(
        c, "n_shared_experts", "num_shared_experts", "moe_num_shared_experts"
    )  # DeepSeek, Kimi, ERNIE
    shared_inter = _int(c, "shared_expert_intermediate_size")
    if s.mt == "nemotron_h" and n_shared:
        out += _mlp(
            s, f"{box}.shared_experts", part, _int(c, "moe_shared_expert_intermediate_size") * n_shared
        )
    elif _int(c, "shared_intermediate_size"):  # granite: one shared MLP, no gate
        out += _mlp(s, f"{box}.shared_mlp", part, _int(c, "shared_intermediate_size"))
    elif shared_inter:  # qwen2-moe / qwen3-next: one shared expert and its gate
        out += _mlp(s, f"{box}.shared_expert", part, shared_inter)
        out.append(_lin(f"{box}.shared_expert_gate", part, 1, h))
    elif n_shared:  # deepseek, kimi-linear, bailing, ernie: n_shared experts of their width as one MLP
        width = _int(c, "moe_shared_expert_intermediate_size") or inter
        out += _mlp(s, f"{box}.shared_experts", part, n_shared * width)
    elif s.mt.startswith("llama4"):  # one shared expert of the experts' width (llama4.py Llama4MoE)
        out += _mlp(s, f"{box}.shared_expert", part, inter)
    return out


def _layer(c: dict[str, Any], s: _Shape, kind: LayerKind, p: str, part: str) -> list[Tensor]:
    mixer, mlp = kind.mixer, kind.mlp
    if mixer not in MIXERS or mlp not in MLPS:
        raise ValueError(f"unknown layer kind {mixer!r}/{mlp!r}")
    nemo = s.mt == "nemotron_h"  # one block per layer under "mixer", one norm
    m = f"{p}.mixer" if nemo else p
    out: list[Tensor] = []
    if mixer in ("full", "sliding", "chunked", "mla"):
        out += _attention(c, s, kind, m if nemo else f"{p}.self_attn", part)
        beside = PARALLEL_STATE_TYPES.get(s.mt)  # a parallel hybrid: a state mixer beside attention
        if beside == "mamba2":
            out += _mamba2(c, s, f"{p}.mamba", part)
        elif beside is not None:
            raise ValueError(f"a {beside} mixer beside each attention layer: its weights are not counted")
    elif mixer == "gdn":
        out += _gdn(c, s, f"{p}.linear_attn", part)
    elif mixer == "mamba2":
        out += _mamba2(c, s, m if nemo else f"{p}.mamba", part)
    elif mixer == "mamba":
        out += _mamba1(c, s, f"{p}.mamba", part)
    elif mixer in ("kda", "linear"):
        out += _linear_attention(c, s, f"{p}.self_attn", part, kda=mixer == "kda")
    elif mixer == "short_conv":
        out += _short_conv(c, s, f"{p}.conv", part)
    if mlp == "moe":
        out += _moe(c, s, m if nemo else f"{p}.mlp", part)
    elif mlp == "dense":
        out += _mlp(s, m if nemo else f"{p}.mlp", part, s.dense_inter)
    h = s.hidden
    norms = 1 if nemo else 4 if s.mt.startswith("gemma") else 2
    if mixer == "none" and mlp != "none" and not nemo:
        norms -= 1
    if mlp == "none" and mixer != "none" and not nemo:
        norms -= 1
    out.append(_vec(f"{p}.norms", part, norms * h))
    return out


# --------------------------------------------------------------------------- MTP and vision


def _mtp(c: dict[str, Any], s: _Shape, names: _Names) -> list[Tensor]:
    n = _int(c, "mtp_num_hidden_layers") or _int(c, "num_nextn_predict_layers")
    if s.mt.startswith("minimax_m3"):  # minimax_m3/nvidia/mtp.py: num_mtp_modules
        n = _int(c, "num_mtp_modules")
    if not n:
        return []
    if n > 1000:
        raise ValueError(f"mtp_num_hidden_layers / num_nextn_predict_layers: {n} (at most 1000)")
    h = s.hidden
    moe = bool(
        next((_int(c, k) for k in ("num_experts", "n_routed_experts", "num_local_experts") if _int(c, k)), 0)
    )
    kind = LayerKind("mla" if _int(c, "kv_lora_rank") else "full", "moe" if moe else "dense")
    out: list[Tensor] = []
    for i in range(n):
        p = f"{names.mtp}.layers.{i}"
        out += _layer(c, s, kind, p, "mtp")
        out.append(_lin(f"{names.mtp}.fc" if i == 0 else f"{p}.fc", "mtp", h, 2 * h))
        out.append(_vec(f"{p}.pre_fc_norms", "mtp", 2 * h))
        if s.mt == "deepseek_v3" or s.mt.startswith("minimax_m3"):  # each MTP layer's own embedding and head
            out.append(Tensor(f"{p}.embed_tokens", "mtp", s.vocab, h, linear=False))
            out.append(_lin(f"{p}.shared_head.head", "mtp", s.vocab, h))
    out.append(_vec(f"{names.mtp}.norm", "mtp", n * h))
    return out


class _VisionDims(NamedTuple):
    h: int
    inter: int
    depth: int
    patch: int
    chans: int
    tpatch: int
    out_h: int
    merge: int


def _vision(cfg: dict[str, Any], text_hidden: int, names: _Names) -> list[Tensor]:
    v = cfg.get("vision_config")
    if not isinstance(v, dict) or not v:
        return []
    p, part = names.vision, "vision"
    if "vt_hidden_size" in v:
        return _moonvit(v, text_hidden, "vision_tower", part)  # as the checkpoint names it
    h = _int(v, "hidden_size", "embed_dim", "width")
    inter = _int(v, "intermediate_size") or 4 * h
    depth = _int(v, "depth", "num_hidden_layers", "num_layers")
    if not (h and depth):
        return []
    patch = _int(v, "patch_size", default=14)
    chans = _int(v, "in_channels", "in_chans", "num_channels", default=3)
    tpatch = _int(v, "temporal_patch_size", default=1)
    out_h = _int(v, "out_hidden_size") or text_hidden
    merge = _int(v, "spatial_merge_size", default=1)
    d = _VisionDims(h, inter, depth, patch, chans, tpatch, out_h, merge)
    if "temporal_patch_size" in v or "spatial_merge_size" in v:
        return _qwen_vision(v, p, part, d)
    return _vit_vision(v, p, part, d, text_hidden)


def _merge_kernel(kernel: object) -> int:
    """Patches one merged token holds: ``merge_kernel_size`` [height, width] (absent: 2 x 2)."""
    if kernel is None:
        return 4
    if not (
        isinstance(kernel, list) and len(kernel) == 2 and all(type(k) is int and 0 < k <= 64 for k in kernel)
    ):
        raise ValueError(
            f"vision_config.merge_kernel_size: expected [height, width] in patches, got {kernel!r}"[:120]
        )
    return int(kernel[0] * kernel[1])


def _moonvit(v: dict[str, Any], text_hidden: int, p: str, part: str) -> list[Tensor]:
    """Kimi's MoonViT (``vt_*`` keys; vLLM ``kimi_k25_vit.py``): patch embedding, a learned position
    grid, ``vt_num_hidden_layers`` blocks of a fused QKV ``qkv_hidden_size`` wide and a plain MLP, and
    the patch-merger projector into the text model."""
    h, depth = _int(v, "vt_hidden_size"), _int(v, "vt_num_hidden_layers")
    if not (h and depth):
        return []
    inter, qkv = _int(v, "vt_intermediate_size") or 4 * h, _int(v, "qkv_hidden_size") or h
    patch = _int(v, "patch_size", default=14)
    grid = _int(v, "init_pos_emb_height", default=64) * _int(v, "init_pos_emb_width", default=64)
    merge = _merge_kernel(v.get("merge_kernel_size"))
    merged, out_h = h * merge, _int(v, "text_hidden_size") or text_hidden
    return [
        Tensor(f"{p}.patch_embed", part, h, 3 * patch * patch, linear=False),
        Tensor(f"{p}.pos_emb", part, grid, h, linear=False),
        _lin(f"{p}.blocks.wqkv", part, 3 * qkv, h, depth),
        _lin(f"{p}.blocks.wo", part, h, qkv, depth),
        _lin(f"{p}.blocks.mlp.fc0", part, inter, h, depth),
        _lin(f"{p}.blocks.mlp.fc1", part, h, inter, depth),
        _vec(f"{p}.blocks.norms", part, 2 * h, depth),
        _vec(f"{p}.final_layernorm", part, 2 * h),
        _lin("mm_projector.linear_1", part, merged, merged),
        _lin("mm_projector.linear_2", part, out_h, merged),
    ]


OMNI_TYPES = ("qwen2_5_omni", "qwen3_omni")  # thinkers whose audio tower serves beside text and vision


def _audio(cfg: dict[str, Any]) -> list[Tensor]:
    """A Whisper-style audio encoder (``audio_config``: ``d_model``, ``encoder_layers``,
    ``encoder_ffn_dim``, ``num_mel_bins``, ``output_dim``), as Qwen2.5-Omni and Qwen3-Omni's thinkers
    hold it: two 1-D convolutions (Qwen2.5) or three 3x3 2-D ones of ``downsample_hidden_size``
    channels and a linear out (Qwen3), the layers (q/k/v/out with biases, K's in Qwen3 only; fc1,
    fc2; two layer norms), a final norm and the projection to ``output_dim``. Counted with the
    vision tower: a multimodal encoder, not loaded under ``--language-model-only``."""
    a = cfg.get("audio_config")
    if not isinstance(a, dict) or not _mtype(cfg).startswith(OMNI_TYPES):
        return []  # an audio-input model's encoder (ASR) is its input path, not a tower to drop
    d, layers = _int(a, "d_model"), _int(a, "encoder_layers")
    if not (d and layers):
        return []
    ffn, mel = _int(a, "encoder_ffn_dim") or 4 * d, _int(a, "num_mel_bins", default=128)
    out_dim, p, part = _int(a, "output_dim") or d, "audio_tower", "vision"
    down = _int(a, "downsample_hidden_size")
    b = f"{p}.layers.0"
    out = [
        _lin(f"{b}.self_attn.qkvo", part, 4 * d, d, layers),
        _lin(f"{b}.fc1", part, ffn, d, layers),
        _lin(f"{b}.fc2", part, d, ffn, layers),
        _vec(f"{b}.biases_norms", part, (4 if down else 3) * d + ffn + d + 4 * d, layers),
        _vec(f"{p}.ln_post", part, 2 * d),
        _lin(f"{p}.proj" if not down else f"{p}.proj2", part, out_dim, d),
        _vec(f"{p}.proj.bias", part, out_dim),
    ]
    if down:  # Qwen3-Omni: conv2d1-3 (stride 2 each: mel / 8 rows left), conv_out, proj1
        out += [
            Tensor(f"{p}.conv2d1", part, down, 9 + 1, linear=False),
            Tensor(f"{p}.conv2d23", part, 2 * down, down * 9 + 1, linear=False),
            _lin(f"{p}.conv_out", part, d, down * (mel // 8)),
            _lin(f"{p}.proj1", part, d, d),
            _vec(f"{p}.proj1.bias", part, d),
        ]
    else:  # Qwen2.5-Omni: conv1 (mel -> d), conv2 (d -> d), kernel 3; the audio bos/eos embedding
        out += [
            Tensor(f"{p}.conv1", part, d, mel * 3 + 1, linear=False),
            Tensor(f"{p}.conv2", part, d, d * 3 + 1, linear=False),
            Tensor(f"{p}.audio_bos_eos_token", part, 2, out_dim, linear=False),
        ]
    return out


def _qwen_vision(v: dict[str, Any], p: str, part: str, d: _VisionDims) -> list[Tensor]:
    """A Qwen-VL vision tower (Qwen2-VL, Qwen2.5-VL, Qwen3-VL with its deepstack mergers)."""
    h, inter, depth, patch, chans, tpatch, out_h, merge = d
    out: list[Tensor] = []
    qwen25 = "fullatt_block_indexes" in v or "window_size" in v  # Qwen2.5-VL: gated MLP, RMSNorm
    conv_bias = not qwen25
    out.append(Tensor(f"{p}.patch_embed", part, h, chans * tpatch * patch * patch, linear=False))
    if conv_bias:
        out.append(_vec(f"{p}.patch_embed.bias", part, h))
    pos = _int(v, "num_position_embeddings")
    if pos:
        out.append(Tensor(f"{p}.pos_embed", part, pos, h, linear=False))
    b = f"{p}.blocks.0"
    norm = (1 if qwen25 else 2) * 2 * h
    mlp = (
        [
            _lin(f"{b}.mlp.gate_proj", part, inter, h, depth),
            _lin(f"{b}.mlp.up_proj", part, inter, h, depth),
            _lin(f"{b}.mlp.down_proj", part, h, inter, depth),
            _vec(f"{b}.mlp.bias", part, 2 * inter + h, depth),
        ]
        if qwen25
        else [
            _lin(f"{b}.mlp.linear_fc1", part, inter, h, depth),
            _lin(f"{b}.mlp.linear_fc2", part, h, inter, depth),
            _vec(f"{b}.mlp.bias", part, inter + h, depth),
        ]
    )
    out += [
        _vec(f"{b}.norms", part, norm, depth),
        _lin(f"{b}.attn.qkv", part, 3 * h, h, depth),
        _vec(f"{b}.attn.qkv.bias", part, 3 * h, depth),
        _lin(f"{b}.attn.proj", part, h, h, depth),
        _vec(f"{b}.attn.proj.bias", part, h, depth),
        *mlp,
    ]
    wide = h * merge * merge
    deep = v.get("deepstack_visual_indexes")
    mergers = 1 + (len(deep) if isinstance(deep, list) else 0)
    for j in range(mergers):
        m = f"{p}.merger" if j == 0 else f"{p}.deepstack_merger_list.{j - 1}"
        norm_w = (1 if qwen25 else 2) * (h if j == 0 else wide)  # deepstack mergers norm after the shuffle
        out += [
            _vec(f"{m}.norm", part, norm_w),
            _lin(f"{m}.linear_fc1", part, wide, wide),
            _vec(f"{m}.linear_fc1.bias", part, wide),
            _lin(f"{m}.linear_fc2", part, out_h, wide),
            _vec(f"{m}.linear_fc2.bias", part, out_h),
        ]
    return out


def _vit_vision(v: dict[str, Any], p: str, part: str, d: _VisionDims, text_hidden: int) -> list[Tensor]:
    """A generic ViT (SigLIP / CLIP style) and a linear projector into the language model."""
    h, inter, depth, patch, chans = d.h, d.inter, d.depth, d.patch, d.chans
    image = _int(v, "image_size", default=224)
    b = f"{p}.encoder.layers.0"
    return [
        Tensor(f"{p}.embeddings.patch_embedding", part, h, chans * patch * patch, linear=False),
        _vec(f"{p}.embeddings.patch_embedding.bias", part, h),
        Tensor(f"{p}.embeddings.position_embedding", part, (image // max(patch, 1)) ** 2, h, linear=False),
        _lin(f"{b}.self_attn.qkv_proj", part, 3 * h, h, depth),
        _lin(f"{b}.self_attn.out_proj", part, h, h, depth),
        _lin(f"{b}.mlp.fc1", part, inter, h, depth),
        _lin(f"{b}.mlp.fc2", part, h, inter, depth),
        _vec(f"{b}.biases_norms", part, 3 * h + h + inter + h + 4 * h, depth),
        _vec(f"{p}.post_layernorm", part, 2 * h),
        _lin("model.multi_modal_projector", part, text_hidden, h),
    ]


# --------------------------------------------------------------------------- the model


def tensors(cfg: dict[str, Any], kinds: Sequence[LayerKind]) -> list[Tensor]:
    """Every parameter tensor of the model whose config.json is ``cfg`` (multimodal wrapper
    included) and whose decoder layers are ``kinds``."""
    c = flat_config(cfg)
    s = _shape(c)
    if not s.hidden:
        raise ValueError("hidden_size: missing (needed to size the model)")
    names = _names(cfg, s)
    out: list[Tensor] = []
    widths = _layer_widths(c, len(kinds))
    # the last num_kv_shared_layers reuse an earlier layer's KV: a query projection, no K or V
    # (Gemma-3n, gemma3n.py: "KV-shared layers only have q_proj")
    first_shared = len(kinds) - (_int(c, "num_kv_shared_layers") or 0)
    indexed = indexed_layers(c, len(kinds)) if "index_topk" in c else None
    if s.mt == "zamba2":
        out += _zamba2(c, s, kinds)
        kinds = ()
    elif is_dsv4(c):
        out += _deepseek_v4(c, s, len(kinds))
        kinds = ()
    elif is_dsv41(c):
        out += _deepseek_v41(c, s, len(kinds))
        kinds = ()
    for i, kind in enumerate(kinds):
        shape = s if widths is None else s._replace(inter=widths[i], dense_inter=widths[i])
        layer = _layer(c, shape, kind, names.layer.format(i), "decoder")
        if i >= first_shared:
            layer = [t for t in layer if not t.name.endswith((".k_proj", ".v_proj", ".k_norm"))]
        if indexed is not None and i not in indexed:
            layer = [t for t in layer if ".indexer." not in t.name]
        out += layer
        if s.mt.startswith("gemma3n"):
            out += _gemma3n_layer(c, s, names.layer.format(i))
    out.append(_vec(names.final_norm, "decoder", s.hidden))
    if s.mt.startswith("gemma3n"):
        out += _gemma3n_model(c, s, len(kinds))
    # Inkling's embedding is whole on every rank (its VocabEmbedding is not vocab-parallel)
    out.append(
        Tensor(names.embed, "embed", s.vocab, s.hidden, linear=False, replicated=s.mt.startswith("inkling"))
    )
    out += _ngram_tables(c)
    if not s.tie:
        out.append(_lin(names.lm_head, "lm_head", s.vocab, s.hidden))
    out += [] if is_dsv4(c) or is_dsv41(c) else _mtp(c, s, names)
    try:
        out += _vision(cfg, s.hidden, names)
    except ValueError as e:
        raise ValueError(f"vision_config.{e}") from None
    try:
        out += _audio(cfg)
    except ValueError as e:
        raise ValueError(f"audio_config.{e}") from None
    return out


def _zamba2(c: dict[str, Any], s: _Shape, kinds: Sequence[LayerKind]) -> list[Tensor]:
    """Zamba2's decoder (``zamba2.py``): a Mamba2 mixer in every layer; each hybrid layer's own
    projection (replicated) and low-rank adapters (the shared MLP's gate/up, and q/k/v with
    ``use_shared_attention_adapter``); ``num_mem_blocks`` shared attention + MLP blocks over the
    hidden state and the embedding side by side (2 x hidden wide), stored once and read once per
    hybrid layer that calls them (block ``b`` serves every ``num_mem_blocks``-th hybrid layer)."""
    h, ffn, wide = s.hidden, s.inter, 2 * s.hidden
    hybrid = [i for i, k in enumerate(kinds) if k.mixer == "full"]
    called = set(hybrid)
    blocks = max(1, min(_int(c, "num_mem_blocks", default=1), max(1, len(hybrid))))
    rank = _int(c, "adapter_rank", default=128)
    qkv_adapters = c.get("use_shared_attention_adapter") is True
    out: list[Tensor] = []
    for i in range(len(kinds)):
        p = f"model.layers.{i}"
        out += _mamba2(c, s, f"{p}.mamba_decoder.mamba" if i in called else f"{p}.mamba", "decoder")
        out.append(_vec(f"{p}.input_layernorm", "decoder", h))
    for n, i in enumerate(hybrid):
        p, b = f"model.layers.{i}", n % blocks
        out.append(Tensor(f"{p}.linear", "decoder", h, h, replicated=True))
        out += [
            _lin(f"model.blocks.{b}.feed_forward.gate_up_proj_adapter_list.{n}.{ab}", "decoder", r, k)
            for ab, r, k in (("A", rank, h), ("B", 2 * ffn, rank))
        ]
        if qkv_adapters:
            out += [
                _lin(f"model.blocks.{b}.self_attn.linear_{x}_adapter_list.{n}.{ab}", "decoder", r, k)
                for x in "qkv"
                for ab, r, k in (("A", rank, wide), ("B", wide, rank))
            ]
    for b in range(blocks):
        p, calls = f"model.blocks.{b}", len(hybrid[b::blocks])
        out += [
            _lin(f"{p}.self_attn.qkv_proj", "decoder", 3 * wide, wide, active=calls),
            _lin(f"{p}.self_attn.o_proj", "decoder", h, wide, active=calls),
            _lin(f"{p}.feed_forward.gate_up_proj", "decoder", 2 * ffn, h, active=calls),
            _lin(f"{p}.feed_forward.down_proj", "decoder", h, ffn, active=calls),
            _vec(f"{p}.norms", "decoder", wide + h, active=calls),
        ]
    return out


def _dsv4_attention(c: dict[str, Any], s: _Shape, r: int, p: str, part: str) -> list[Tensor]:
    """One DeepSeek V4 attention (vLLM ``models/deepseek_v4``): the query through a LoRA rank, one
    shared KV head of ``head_dim`` (448 NoPE + RoPE), the output through ``o_groups`` grouped LoRA
    projections, an fp32 sink per head; a compressor (bf16, its positional table in fp32) where
    ``r > 1`` (two streams at 4), and at 4 the lightning indexer with a compressor of its own."""
    h, heads, hd = s.hidden, s.heads, s.head_dim
    ql, og, ol = _int(c, "q_lora_rank"), _int(c, "o_groups", default=1), _int(c, "o_lora_rank")
    out = [
        Tensor(f"{p}.wq_a", part, ql, h, replicated=True),
        Tensor(f"{p}.wkv", part, hd, h, replicated=True),
        _vec(f"{p}.norms", part, ql + hd),
        _lin(f"{p}.wq_b", part, heads * hd, ql),
        _lin(f"{p}.wo_a", part, og * ol, heads * hd // max(1, og)),
        _lin(f"{p}.wo_b", part, h, og * ol),
        _vec(f"{p}.attn_sink", part, 2 * heads),  # fp32: two bf16 widths
    ]
    if r > 1:
        coff = 1 + (r == 4)
        out += [
            Tensor(f"{p}.compressor.wkv_wgate", part, 2 * coff * hd, h, linear=False, replicated=True),
            _vec(f"{p}.compressor.ape_norm", part, 2 * r * coff * hd + hd),
        ]
    if r == 4:
        ih, inh = _int(c, "index_head_dim", default=128), _int(c, "index_n_heads", default=64)
        out += [
            _lin(f"{p}.indexer.wq_b", part, inh * ih, ql),
            Tensor(f"{p}.indexer.weights_proj", part, inh, h, linear=False, replicated=True),
            Tensor(f"{p}.indexer.compressor.wkv_wgate", part, 4 * ih, h, linear=False, replicated=True),
            _vec(f"{p}.indexer.compressor.ape_norm", part, 2 * 4 * 2 * ih + ih),
        ]
    return out


def _dsv4_ffn(c: dict[str, Any], s: _Shape, p: str, part: str, hashed: bool) -> list[Tensor]:
    """A DeepSeek V4 MoE: the router (bf16; a hash layer routes by a token-to-expert table instead
    of a bias), the routed experts (MXFP4 in the published checkpoints: see quant.py) and the shared
    ones; every layer is MoE."""
    h, e = s.hidden, _int(c, "n_routed_experts")
    k, inter = _int(c, "num_experts_per_tok") or e, _int(c, "moe_intermediate_size") or s.inter
    out = [Tensor(f"{p}.gate", part, e, h, linear=False, replicated=True)]
    out.append(
        Tensor(f"{p}.gate.tid2eid", part, s.vocab, k, linear=False)
        if hashed
        else _vec(f"{p}.gate.bias", part, 2 * e)
    )
    out += _mlp(s, f"{p}.experts.0", part, inter, e, min(k, e))
    shared = _int(c, "n_shared_experts") * inter
    if shared:
        out += _mlp(s, f"{p}.shared_experts", part, shared)
    return out


def _dsv4_mix(c: dict[str, Any], s: _Shape, p: str, part: str) -> list[Tensor]:
    """Manifold hyper-connections (``hc_mult`` residual streams; fp32, so two bf16 widths) and the
    layer's two norms."""
    hc = _int(c, "hc_mult", default=4)
    mix = (2 + hc) * hc
    return [
        _vec(f"{p}.hc", part, 2 * 2 * (mix * hc * s.hidden + mix + 3)),
        _vec(f"{p}.norms", part, 2 * s.hidden),
    ]


def _deepseek_v4(c: dict[str, Any], s: _Shape, layers: int) -> list[Tensor]:
    """DeepSeek V4's decoder layers and its MTP layers (``num_nextn_predict_layers``: attention
    without a compressor where its ratio is 0, a MoE, the hyper-connections, ``e_proj``/``h_proj``
    and its norms) as vLLM 0.33's ``models/deepseek_v4`` builds them."""
    mtp = _int(c, "num_nextn_predict_layers")
    ratios = dsv4_ratios(c, layers)
    hashed = _int(c, "num_hash_layers")
    out: list[Tensor] = []
    for i in range(layers):
        p = f"layers.{i}"
        out += _dsv4_attention(c, s, ratios[i], f"{p}.attn", "decoder")
        out += _dsv4_ffn(c, s, f"{p}.ffn", "decoder", i < hashed)
        out += _dsv4_mix(c, s, p, "decoder")
    hc = _int(c, "hc_mult", default=4)
    out.append(_vec("hc_head", "decoder", 2 * (hc * hc * s.hidden + hc + 1)))
    for j in range(mtp):
        p, r = f"mtp.{j}", ratios[layers + j] if layers + j < len(ratios) else 0
        out += _dsv4_attention(c, s, r, f"{p}.attn", "mtp")
        out += _dsv4_ffn(c, s, f"{p}.ffn", "mtp", False)
        out += _dsv4_mix(c, s, p, "mtp")
        out += [
            _lin(f"{p}.e_proj", "mtp", s.hidden, s.hidden),
            _lin(f"{p}.h_proj", "mtp", s.hidden, s.hidden),
            _vec(f"{p}.mtp_norms", "mtp", 3 * s.hidden + 2 * (hc * hc * s.hidden + hc + 1)),
        ]
    return out


def _dsv41_attention(c: dict[str, Any], s: _Shape, i: int, ratios: tuple[int, ...]) -> list[Tensor]:
    """One DeepSeek V4.1 attention (``deepseek_v41/attention.py``): the query LoRA and the KV head in
    one replicated projection, grouped-LoRA output, an fp32 sink per head; a compressor (bf16, two
    streams at ratio 2) only on ``kv_source_layer_ids``, an indexer on ``index_source_layer_ids``
    (its key projection only on a source: the others read the source's keys)."""
    h, heads, hd, p = s.hidden, s.heads, s.head_dim, f"layers.{i}.attn"
    ql, og, ol = _int(c, "q_lora_rank"), _int(c, "o_groups", default=1), _int(c, "o_lora_rank")
    out = [
        Tensor(f"{p}.fused_wqa_wkv", "decoder", ql + hd, h, replicated=True),
        _vec(f"{p}.norms", "decoder", ql + hd),
        _lin(f"{p}.wq_b", "decoder", heads * hd, ql),
        _lin(f"{p}.wo_a", "decoder", og * ol, heads * hd // max(1, og)),
        _lin(f"{p}.wo_b", "decoder", h, og * ol),
        _vec(f"{p}.attn_sink", "decoder", 2 * heads),  # fp32: two bf16 widths
    ]
    source = i in (c.get("kv_source_layer_ids") or ())
    if source:
        streams = 2 if ratios[i] == 2 else 1
        out += [
            Tensor(
                f"{p}.compressor.fused_wkv_wgate", "decoder", streams * hd, h, linear=False, replicated=True
            ),
            _vec(f"{p}.compressor.norm", "decoder", hd),
        ]
    if i in (c.get("index_source_layer_ids") or ()):
        ih, inh = _int(c, "index_head_dim", default=128), _int(c, "index_n_heads", default=64)
        out += [
            Tensor(f"{p}.indexer.wq_b", "decoder", inh * ih, ql, replicated=True),
            Tensor(f"{p}.indexer.weights_proj", "decoder", inh, h, linear=False, replicated=True),
        ]
        if source:
            out += [
                Tensor(f"{p}.indexer.wk", "decoder", ih, hd, linear=False),
                _vec(f"{p}.indexer.k_norm", "decoder", ih),
            ]
    return out


def _engram(c: dict[str, Any], s: _Shape, p: str) -> list[Tensor]:
    """DeepSeek V4.1's engram on its layers (``common/engram.py``): the projection of the hashed
    n-gram rows into the residual streams and its q/k weights on the GPU. The tables themselves
    (``engram_num_embeddings`` rows of ``engram_head_dim`` fp8 values: ~203 GB for V4.1-Flash) live
    in pinned host memory by default (``EngramConfig.cpu_offload``): no GPU weight."""
    ng, heads = _int(c, "engram_max_ngram_size", default=4), _int(c, "engram_n_heads", default=8)
    hd, hc = _int(c, "engram_head_dim", default=256), _int(c, "hc_mult", default=4)
    return [
        _lin(f"{p}.engram.wkv", "decoder", s.hidden * (ng + 1), (ng - 1) * heads * hd),
        _vec(f"{p}.engram.q_k_weight", "decoder", 2 * hc * s.hidden),
    ]


def _deepseek_v41(c: dict[str, Any], s: _Shape, layers: int) -> list[Tensor]:
    """DeepSeek V4.1's decoder layers as vLLM 0.33's ``models/deepseek_v41`` builds them: V4's MoE
    (no hash layers; a second fp32 bias beside a vision tower) and hyper-connections, its own
    attention (:func:`_dsv41_attention`) and engram (:func:`_engram`). Its DSpark stages
    (``num_nextn_predict_layers``) load only with DSpark speculation: not counted."""
    ratios = dsv41_ratios(c, layers)
    engram = set(c.get("engram_layer_ids") or ())
    vision = isinstance(c.get("vision_config"), dict) and bool(c.get("vision_config"))
    out: list[Tensor] = []
    for i in range(layers):
        out += _dsv41_attention(c, s, i, ratios)
        out += _dsv4_ffn(c, s, f"layers.{i}.ffn", "decoder", False)
        if vision:
            out.append(_vec(f"layers.{i}.ffn.gate.bias_vl", "decoder", 2 * _int(c, "n_routed_experts")))
        out += _dsv4_mix(c, s, f"layers.{i}", "decoder")
        out += _engram(c, s, f"layers.{i}") if i in engram else []
    return out


def _ngram_tables(c: dict[str, Any]) -> list[Tensor]:
    """Qwen4-Exp's per-layer n-gram embeddings (``ple_layer_ids``; qwen4_exp ``ngram_embedding.py``):
    ``(ngram_size - 1) x heads_per_ngram`` hashed heads, each a table of the next prime above
    ``ngram_vocab_size_base`` rows (taken as the base itself: the primes lie a few hundred rows above
    it) of ``ple_embed_dim / heads`` columns, the rows padded to ``make_ngram_vocab_size_divisible_by``;
    and the layer's projection of them into its residual streams. A few rows are looked up per
    token: nothing of the table is read per decoded token beyond them."""
    layers = c.get("ple_layer_ids")
    if layers is None or layers == []:
        return []
    n = _int(c, "num_hidden_layers")
    if (
        type(layers) is not list
        or len(set(layers)) != len(layers)
        or not all(type(i) is int and 0 < i <= n for i in layers)
    ):
        raise ValueError(
            f"ple_layer_ids: expected distinct layer numbers from 1 to {n}, got {layers!r}"[:120]
        )
    heads = max(1, (_int(c, "ngram_size", default=3) - 1) * _int(c, "heads_per_ngram", default=1))
    dim, base = _int(c, "ple_embed_dim") or _int(c, "hidden_size"), _int(c, "ngram_vocab_size_base")
    if not (dim and base):
        return []
    if dim % heads:
        raise ValueError(f"ple_embed_dim: {dim} does not divide into the {heads} n-gram heads")
    pad = _int(c, "make_ngram_vocab_size_divisible_by", default=1) or 1
    rows = -(-heads * base // pad) * pad
    streams = (_int(c, "hc_count", default=1) or 1) * _int(c, "hidden_size")
    out: list[Tensor] = []
    for i in layers:
        out += [
            Tensor(
                f"model.ple_layers.{i}.ngram_embedding", "embed", rows, dim // heads, active=0, linear=False
            ),
            _lin(f"model.ple_layers.{i}.kv_proj", "decoder", streams + dim, dim),
        ]
    return out


def _layer_widths(c: dict[str, Any], layers: int) -> list[int] | None:
    """Each layer's MLP width where ``intermediate_size`` is a list, one a layer (Gemma-3n's
    config.json as transformers writes it); None where it is one number."""
    v = c.get("intermediate_size")
    if not isinstance(v, list):
        return None
    if len(v) != layers or not all(type(w) is int and 0 < w <= 1 << 24 for w in v):
        raise ValueError(f"intermediate_size: expected {layers} positive integers, one a layer")
    return v


def _gemma3n_layer(c: dict[str, Any], s: _Shape, p: str) -> list[Tensor]:
    """A Gemma-3n decoder layer's own parts beyond attention and MLP (``gemma3n.py``): AltUp's router
    and coefficients over ``altup_num_inputs`` streams, LAuReL's low-rank residual, and the gate and
    projection of the per-layer input."""
    h, n = s.hidden, _int(c, "altup_num_inputs", default=4)
    rank, per = _int(c, "laurel_rank", default=64), _int(c, "hidden_size_per_layer_input", default=256)
    return [
        _vec(f"{p}.altup.scales_and_norms", "decoder", 2 * h),
        Tensor(f"{p}.altup.coefs", "decoder", n, n + n * n, linear=False),
        _lin(f"{p}.altup.modality_router", "decoder", n, h),
        _lin(f"{p}.laurel.linear_left", "decoder", rank, h),
        _lin(f"{p}.laurel.linear_right", "decoder", h, rank),
        _vec(f"{p}.laurel.post_laurel_norm", "decoder", h),
        _lin(f"{p}.per_layer_input_gate", "decoder", per, h),
        _lin(f"{p}.per_layer_projection", "decoder", h, per),
        _vec(f"{p}.post_per_layer_input_norm", "decoder", h),
    ]


def _gemma3n_model(c: dict[str, Any], s: _Shape, layers: int) -> list[Tensor]:
    """Gemma-3n's model-wide parts: the per-layer input embedding (``vocab_size_per_layer_input``
    rows of ``layers x hidden_size_per_layer_input``, looked up per token), its projection from the
    hidden state, and AltUp's ``altup_num_inputs - 1`` projections in and out."""
    h, n = s.hidden, _int(c, "altup_num_inputs", default=4)
    per = _int(c, "hidden_size_per_layer_input", default=256)
    vocab = _int(c, "vocab_size_per_layer_input") or s.vocab
    return [
        Tensor("model.embed_tokens_per_layer", "embed", vocab, layers * per, linear=False),
        _lin("model.per_layer_model_projection", "decoder", layers * per, h),
        _vec("model.per_layer_projection_norm", "decoder", per),
        _lin("model.altup_projections", "decoder", h, h, count=2 * (n - 1)),
    ]


def breakdown(ts: Sequence[Tensor]) -> ParamBreakdown:
    by = dict.fromkeys(PARTS, 0)
    for t in ts:
        by[t.part] += t.params
    active = sum(t.active_params for t in ts if t.part in ("decoder", "embed", "lm_head"))
    return ParamBreakdown(**by, total=sum(by.values()), active=active)


def count_params(cfg: dict[str, Any], kinds: Sequence[LayerKind]) -> ParamBreakdown:
    """Parameters per part (decoder, embedding, LM head, vision, MTP), the total, and those read per
    decoded token (the language model with only the routed experts)."""
    return breakdown(tensors(cfg, kinds))


def _grid(found: list[tuple[Tensor, Scheme]]) -> QuantGrid | None:
    """:class:`QuantGrid` from the quantized down-projections of the decoder (the input a row-parallel
    down-projection splits is the intermediate size the column-parallel gate/up split too): an FP8
    scheme's blocks, or a scheme's weight groups along the input."""
    if not found:
        return None
    widths = tuple(sorted({t.cols for t, _ in found if t.count == 1}))
    experts = max((t.cols for t, _ in found if t.count > 1), default=0)
    scheme = found[0][1]
    if scheme.block:
        return QuantGrid(scheme.block, widths, experts, fp8=True)
    return QuantGrid((1, scheme.group), widths, experts, fp8=False)


def _on_grid(t: Tensor, scheme: Scheme) -> bool:
    """A decoder MLP's down-projection stored in FP8 blocks or in integer weight groups along its input
    (AWQ, GPTQ, compressed-tensors pack-quantized: 16-bit scales; MXFP4 and NVFP4's 8-bit scales are
    left out: vLLM pads MXFP4 experts to its kernel's tile instead)."""
    groups = scheme.bits < 16 and scheme.group > 0 and scheme.scale_bytes >= 2 and scheme.block is None
    gridded = (scheme.bits == 8 and scheme.block is not None) or groups
    return gridded and t.part == "decoder" and t.name.endswith(_DOWN)


class WeightBytes(NamedTuple):
    total: int  # every part (what the checkpoint holds)
    by_part: dict[str, int]  # PARTS → bytes
    method: str | None
    bits: int | None
    notes: tuple[str, ...]
    replicated: int = 0  # of total: the tensors every tensor-parallel rank holds whole
    mxfp4_experts: int = 0  # of total: the routed experts vLLM's Mxfp4MoEMethod pads (Quant.mxfp4_moe)
    grid: QuantGrid | None = None  # the MLPs' FP8 blocks or weight groups, where the checkpoint has them
    mtp_mxfp4_experts: int = 0  # of by_part["mtp"]: the MTP layers' own such experts

    def loaded(self, *, language_only: bool = False, mtp: bool = True) -> int:
        """Bytes vLLM loads: without the vision tower under ``--language-model-only``, without
        the MTP layers unless MTP speculation is on."""
        drop = (self.by_part["vision"] if language_only else 0) + (0 if mtp else self.by_part["mtp"])
        return self.total - drop


def weights_bytes(
    cfg: dict[str, Any], kinds: Sequence[LayerKind], *, language_only: bool = False
) -> WeightBytes:
    """Bytes of every tensor at the checkpoint's quantization; ``language_only`` leaves the vision
    tower out of ``total`` (and of ``by_part``)."""
    q = read_quant(cfg)
    choose = q.chooser()
    by = dict.fromkeys(PARTS, 0.0)
    replicated = 0.0
    padded = dict.fromkeys(("decoder", "mtp"), 0.0)  # the MXFP4 experts vLLM pads, by part
    gridded: list[tuple[Tensor, Scheme]] = []
    for t in tensors(cfg, kinds):
        if language_only and t.part == "vision":
            continue
        scheme = choose(t)
        nbytes = scheme.nbytes(t)
        by[t.part] += nbytes
        replicated += nbytes if t.replicated and t.part != "mtp" else 0.0
        # routed experts (copies of one shape) of the language model stored in 4 bits
        expert = q.mxfp4_moe and t.count > 1 and t.linear and scheme.bits == 4
        if expert and t.part in padded:
            padded[t.part] += nbytes
        if _on_grid(t, scheme) and not str(q.method).startswith("bitsandbytes"):  # bnb: no TP split
            gridded.append((t, scheme))
    parts = {k: int(v) for k, v in by.items()}
    total = sum(parts.values())
    return WeightBytes(
        total,
        parts,
        q.method,
        q.bits,
        q.notes,
        int(replicated),
        int(padded["decoder"]),
        _grid(gridded),
        int(padded["mtp"]),
    )


_DOWN = (".down_proj", ".w2")  # an MLP's row-parallel down-projection, as checkpoints name it
