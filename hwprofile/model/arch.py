"""Architecture-specific reading of a config.json: what differs between model families in the
weights (mixture of experts, multi-head latent attention) and in the KV cache.

The generic reader (``hwprofile.model.parse_config``) takes the fields every decoder shares; this
module adds, per family, what vLLM itself reads (``vllm/model_executor/models/<family>.py``):

- MoE (Qwen2-MoE/Qwen3-MoE ``num_experts``, Mixtral/gpt-oss ``num_local_experts``, DeepSeek
  ``n_routed_experts``): every expert is in memory (``params``), only ``experts_per_token`` of them
  are read per token (``active_params``). Which layers are MoE: DeepSeek from
  ``first_k_dense_replace`` and ``moe_layer_freq`` (``deepseek_v2.py``, ``DeepseekV2DecoderLayer``);
  Qwen MoE from ``decoder_sparse_step`` and ``mlp_only_layers`` (``qwen3_moe.py``, ``qwen2_moe.py``);
  LFM2-MoE from ``num_dense_layers`` (``lfm2_moe.py``); ERNIE 4.5 from ``moe_layer_start_index``,
  ``moe_layer_end_index`` and ``moe_layer_interval`` (``ernie45_moe.py``); MiMo-V2 from its per-layer ``moe_layer_freq``
  list (``mimo_v2.py``).
- MLA (DeepSeek-V2/V3, ``kv_lora_rank`` set): the KV cache holds one latent vector of
  ``kv_lora_rank + qk_rope_head_dim`` elements per token and layer (``MLAAttention.head_size`` in
  ``vllm/model_executor/layers/attention/mla_attention.py``; ``MLAAttentionSpec`` with
  ``num_kv_heads=1, max_tp_shards=1``: not split across TP ranks).

Pure functions over the config dict; nothing is imported from torch or transformers.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, NamedTuple

if TYPE_CHECKING:
    from typing import Any

# config keys: (families that use them)
# qwen-moe, deepseek, mixtral/gpt-oss, ernie 4.5
EXPERT_KEYS = ("num_experts", "n_routed_experts", "num_local_experts", "moe_num_experts")
# most, gpt-oss, hunyuan, ernie, Kimi-K3
TOPK_KEYS = ("num_experts_per_tok", "experts_per_token", "moe_topk", "moe_k", "num_experts_per_token")


class ArchFacts(NamedTuple):
    params: int  # every weight, all experts included
    active_params: int  # weights read per decoded token (the experts routed to, not all)
    num_experts: int  # routed experts per MoE layer (0: dense)
    experts_per_token: int  # routed experts each token uses (0: dense)
    moe_layers: int  # layers whose MLP is a mixture of experts
    kv_lora_rank: int  # MLA: latent KV rank (0: ordinary attention)
    qk_rope_head_dim: int  # MLA: the decoupled RoPE key part stored beside the latent


def _int(cfg: dict[str, Any], key: str, default: int = 0) -> int:
    """A non-negative integer config value; ``ValueError`` naming the key otherwise."""
    v = cfg.get(key)
    if v is None:
        return default
    if type(v) is not int or v < 0 or v > 1 << 32:
        raise ValueError(f"{key}: expected a non-negative integer, got {v!r}"[:120])
    return v


def _mtype(cfg: dict[str, Any]) -> str:
    v = cfg.get("model_type")
    return v if type(v) is str else ""


def _first(cfg: dict[str, Any], keys: tuple[str, ...]) -> int:
    for key in keys:
        v = _int(cfg, key)
        if v:
            return v
    return 0


def _layer_set(v: object, key: str) -> set[int]:
    """Layer indices written as "3,4,5" or as a list of integers; ``ValueError`` naming ``key``."""
    items = v.strip().split(",") if isinstance(v, str) else v
    bad = ValueError(f"{key}: expected layer indices, as '3,4,5' or a list of integers, got {v!r}"[:120])
    if not isinstance(items, (list, tuple)) or len(items) > 1 << 16:
        raise bad
    out: set[int] = set()
    for item in items:
        if isinstance(item, bool) or not isinstance(item, (int, str)):
            raise bad
        try:
            out.add(int(item))
        except ValueError:
            raise bad from None
    return out


def moe_layer_indices(cfg: dict[str, Any], layers: int, experts: int) -> list[int]:
    """Indices of the layers whose MLP is a mixture of experts (vLLM's rule per family)."""
    if not experts:
        return []
    kinds = cfg.get("mlp_layer_types")
    if type(kinds) is list and kinds:  # GLM-5.3, HY-V4: one name a layer, "dense" the dense ones
        if len(kinds) < layers or not all(type(k) is str for k in kinds):
            raise ValueError(f"mlp_layer_types: expected {layers} names, one a layer, got {kinds!r}"[:120])
        return [i for i in range(layers) if kinds[i] != "dense"]
    enum = cfg.get("moe_layers_enum")
    if enum is not None:  # Step3/Step5 (step3_text.py): "3,4,5,..." or a list: the MoE layers
        return [i for i in range(layers) if i in _layer_set(enum, "moe_layers_enum")]
    freqs = cfg.get("moe_layer_freq")
    if type(freqs) is list:  # MiMo-V2: one entry a layer, 1 where it is MoE (mimo_v2.py is_moe_layer)
        if len(freqs) != layers or any(f not in (0, 1) for f in freqs):
            raise ValueError(f"moe_layer_freq: expected {layers} entries of 0 or 1, got {freqs!r}"[:120])
        return [i for i, f in enumerate(freqs) if f]
    if "first_k_dense_replace" in cfg or _mtype(cfg).startswith("deepseek"):
        first = _int(cfg, "first_k_dense_replace")
        freq = _int(cfg, "moe_layer_freq", 1) or 1
        return [i for i in range(layers) if i >= first and i % freq == 0]
    if "moe_layer_start_index" in cfg or "moe_layer_interval" in cfg:  # ERNIE 4.5 (ernie45_moe.py)
        start = _int(cfg, "moe_layer_start_index")
        # -1 (transformers' default, which its config class makes the last layer) or absent: the last
        end = (
            layers - 1
            if cfg.get("moe_layer_end_index") == -1
            else _int(cfg, "moe_layer_end_index", layers - 1)
        )
        every = _int(cfg, "moe_layer_interval", 1) or 1
        return [i for i in range(layers) if (i + 1) % every == 0 and start <= i <= end]
    if "num_dense_layers" in cfg or "dense_mlp_idx" in cfg:  # LFM2-MoE, Inkling: the first ones dense
        first = _int(cfg, "num_dense_layers") or _int(cfg, "dense_mlp_idx")
        return [i for i in range(layers) if i >= first]
    step = _int(cfg, "decoder_sparse_step", 1) or 1
    dense = cfg.get("mlp_only_layers") or []
    if type(dense) is not list or not all(type(i) is int for i in dense):
        raise ValueError(f"mlp_only_layers: expected a list of layer indices, got {dense!r}"[:120])
    return [i for i in range(layers) if i not in dense and (i + 1) % step == 0]


def attention_params(
    cfg: dict[str, Any], hidden: int, heads: int, kv: int, head_dim: int
) -> tuple[int, int, int]:
    """(attention weights per layer, kv_lora_rank, qk_rope_head_dim); the last two are 0 without MLA."""
    rank = _int(cfg, "kv_lora_rank")
    if rank:  # DeepSeek MLA (deepseek_v2.py DeepseekV2MLAAttention)
        rope = _int(cfg, "qk_rope_head_dim")
        nope = _int(cfg, "qk_nope_head_dim")
        v_dim = _int(cfg, "v_head_dim") or nope
        qk = nope + rope
        q_rank = _int(cfg, "q_lora_rank")
        q = hidden * q_rank + q_rank + q_rank * heads * qk if q_rank else hidden * heads * qk
        kv_a = hidden * (rank + rope) + rank  # kv_a_proj_with_mqa + kv_a_layernorm
        kv_b = rank * heads * (nope + v_dim)
        o = heads * v_dim * hidden
        return q + kv_a + kv_b + o, rank, rope
    proj = hidden * heads * head_dim * 2 + hidden * kv * head_dim * 2  # q, o; k, v
    bias = (heads + 2 * kv) * head_dim if _mtype(cfg) in ("qwen2", "qwen2_moe") else 0  # q, k, v only
    if cfg.get("attention_bias") is True:  # llama-style attention_bias: q, k, v and o
        bias = (heads + 2 * kv) * head_dim + hidden
    qk_norm = 2 * head_dim if cfg.get("model_type") in ("qwen3", "qwen3_moe", "gemma3", "gemma3_text") else 0
    sinks = heads if cfg.get("model_type") == "gpt_oss" else 0
    return proj + bias + qk_norm + sinks, 0, 0


def read_arch(
    cfg: dict[str, Any],
    hidden: int,
    inter: int,
    layers: int,
    heads: int,
    kv: int,
    head_dim: int,
    vocab: int,
    tie: bool,
) -> ArchFacts:
    """Parameters (total and active per token) and the MoE/MLA facts of a config.json dict."""
    attn, rank, rope = attention_params(cfg, hidden, heads, kv, head_dim)
    experts = _first(cfg, EXPERT_KEYS)
    topk = _first(cfg, TOPK_KEYS) if experts else 0
    topk = min(topk or experts, experts)
    moe_idx = moe_layer_indices(cfg, layers, experts)
    moe_inter = _int(cfg, "moe_intermediate_size") or inter
    expert = 3 * hidden * moe_inter  # gate, up, down
    if cfg.get("model_type") == "gpt_oss":  # biased experts and router
        expert += 2 * moe_inter + hidden
    router = hidden * experts + (experts if cfg.get("model_type") == "gpt_oss" else 0)
    shared = _int(cfg, "n_shared_experts") * expert  # deepseek
    shared_inter = _int(cfg, "shared_expert_intermediate_size")  # qwen2-moe: one shared expert + gate
    if shared_inter:
        shared += 3 * hidden * shared_inter + hidden
    dense_mlp = 3 * hidden * inter
    norms = 2 * hidden + (2 * hidden if _mtype(cfg).startswith("gemma") else 0)
    n_moe = len(moe_idx)
    per_layer_fixed = attn + norms
    total = layers * per_layer_fixed + (layers - n_moe) * dense_mlp
    total += n_moe * (experts * expert + router + shared)
    embed = vocab * hidden * (1 if tie else 2)
    total += embed + hidden  # embeddings, LM head, final norm
    active = total - n_moe * (experts - topk) * expert
    return ArchFacts(
        params=total,
        active_params=active,
        num_experts=experts,
        experts_per_token=topk,
        moe_layers=n_moe,
        kv_lora_rank=rank,
        qk_rope_head_dim=rope,
    )
