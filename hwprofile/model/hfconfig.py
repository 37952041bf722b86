"""config.json parsing: :func:`parse_config` turns a Hugging Face config dict (a multimodal model's
``text_config`` included) into :class:`.facts.ModelFacts`, checking the type and range of every key
it reads; the architecture-specific parts (MoE, MLA) come from :mod:`.arch`.

Pure: takes a dict, reads no files (:mod:`.files` reads config.json).
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from .arch import read_arch
from .defaults import unwrapped, with_class_defaults
from .facts import ModelFacts
from .layers import layer_stack
from .weights import count_params, weights_bytes

if TYPE_CHECKING:
    from .layers import LayerStack
    from .weights import ParamBreakdown, WeightBytes

# Bounds of the config.json keys hwprofile reads: far above any real model, far below nonsense.
_LIMITS: dict[str, tuple[int, int]] = {
    "num_hidden_layers": (1, 10_000),
    "hidden_size": (1, 1 << 20),
    "num_attention_heads": (1, 1 << 14),
    "num_key_value_heads": (1, 1 << 14),
    "head_dim": (1, 1 << 14),
    "intermediate_size": (1, 1 << 24),
    "vocab_size": (1, 1 << 24),
    "max_position_embeddings": (1, 1 << 32),
    "sliding_window": (0, 1 << 32),
    "sliding_window_size": (0, 1 << 32),
    "sliding_window_pattern": (1, 10_000),
    "num_experts": (0, 1 << 16),
    "n_routed_experts": (0, 1 << 16),
    "num_local_experts": (0, 1 << 16),
    "moe_num_experts": (0, 1 << 16),
    "moe_intermediate_size": (1, 1 << 24),
    "n_shared_experts": (0, 1 << 16),
    "num_nextn_predict_layers": (0, 1000),
    "mtp_num_hidden_layers": (0, 1000),
    "num_mtp_modules": (0, 1000),
}


def show_value(v: object) -> str:
    """``v`` as an error message shows it: JSON, cut at 60 characters; objects and lists by kind."""
    if isinstance(v, dict):
        return "an object"
    if isinstance(v, list):
        return "a list"
    text = json.dumps(v)
    return text if len(text) <= 60 else text[:57] + "..."


class _Keys:
    """Typed reads of config.json keys; every problem is a ``ValueError`` naming the key
    (``text_config.`` in front when it came from a multimodal model's text config)."""

    def __init__(
        self, cfg: dict[str, Any], text_keys: frozenset[str] = frozenset(), prefix: str = ""
    ) -> None:
        self.cfg, self.text_keys, self.prefix = cfg, text_keys, prefix

    def name(self, key: str) -> str:
        return f"{self.prefix}text_config.{key}" if key in self.text_keys else f"{self.prefix}{key}"

    def bad(self, key: str, expected: str, v: object) -> ValueError:
        return ValueError(f"{self.name(key)}: expected {expected}, got {show_value(v)}")

    def integer(self, key: str, default: int | None = None) -> int | None:
        v = self.cfg.get(key)
        if v is None:
            return default
        lo, hi = _LIMITS[key]
        if type(v) is not int or not lo <= v <= hi:
            what = "a positive integer" if lo == 1 else "a non-negative integer"
            raise self.bad(key, f"{what} (at most {hi})", v)
        return v

    def need(self, key: str) -> int:
        v = self.integer(key)
        if v is None:
            raise ValueError(
                f"{self.name(key)}: missing (needed to size the model; not a decoder language model?)"
            )
        return v

    def text(self, key: str) -> str | None:
        v = self.cfg.get(key)
        if v is not None and type(v) is not str:
            raise self.bad(key, "a string", v)
        return v

    def flag(self, key: str) -> bool | None:
        v = self.cfg.get(key)
        if v is not None and type(v) is not bool:
            raise self.bad(key, "true/false", v)
        return v


def _window(cfg: dict[str, Any], k: _Keys) -> int | None:
    """The sliding window (some configs write false for none; MiMo-V2 names it sliding_window_size)."""
    window = None if cfg.get("sliding_window") is False else k.integer("sliding_window")
    return window or k.integer("sliding_window_size")


def parse_config(cfg: dict[str, Any], name: str, source: str, path: str | None) -> ModelFacts:
    """ModelFacts from a config.json dict (text config of multimodal models included). Every key
    read is type- and range-checked: a ``ValueError`` names the key and what it holds."""
    # an omni model's thinker; the keys config.json leaves out as its class's defaults
    raw = with_class_defaults(unwrapped(cfg))
    cfg, text_keys = _language_config(raw)
    k = _Keys(cfg, text_keys)
    layers, hidden, heads, kv, head_dim = _attention_shape(k)
    inter = _widest_mlp(k) or 4 * hidden
    vocab = k.integer("vocab_size", 0) or 0
    tie = bool(k.flag("tie_word_embeddings"))
    window = _window(cfg, k)
    _check_read_elsewhere(k)
    archs = _string_list(k, "architectures")
    sliding = _sliding_layers(cfg, layers, k)
    qmethod, qbits = _declared_quant(k)
    _check_expert_keys(k)
    arch = read_arch(cfg, hidden, inter, layers, heads, kv, head_dim, vocab, tie)
    stack, counted, loaded = _count_weights(raw, archs, cfg)
    return ModelFacts(
        name=name,
        source=source,
        path=path,
        architecture=archs[0] if archs else None,
        model_type=cfg.get("model_type"),
        num_layers=layers,
        hidden_size=hidden,
        num_heads=heads,
        num_kv_heads=kv,
        head_dim=head_dim,
        intermediate_size=inter,
        vocab_size=vocab,
        max_position_embeddings=k.integer("max_position_embeddings"),
        dtype=k.text("torch_dtype") or k.text("dtype") or "bfloat16",
        tie_word_embeddings=tie,
        sliding_window=window if window and sliding else None,
        sliding_layers=sliding,
        quant_method=qmethod or loaded.method,
        quant_bits=qbits or loaded.bits,
        params=counted.total,
        weights_bytes=loaded.total,
        weights_bytes_source="estimate",
        mtp_layers=_mtp_layers(k, cfg.get("model_type")),
        host_bytes=_engram_host_bytes(cfg),
        quantized_variants={},
        active_params=counted.active,
        num_experts=arch.num_experts,
        experts_per_token=arch.experts_per_token,
        moe_intermediate_size=(k.integer("moe_intermediate_size") or inter) if arch.num_experts else 0,
        kv_lora_rank=arch.kv_lora_rank,
        qk_rope_head_dim=arch.qk_rope_head_dim,
        vision_bytes=loaded.by_part["vision"],
        mtp_bytes=loaded.by_part["mtp"],
        replicated_bytes=loaded.replicated,
        mxfp4_expert_bytes=loaded.mxfp4_experts,
        mtp_mxfp4_expert_bytes=loaded.mtp_mxfp4_experts,
        quant_grid=loaded.grid,
        stack=stack,
    )


def _engram_host_bytes(cfg: dict[str, Any]) -> int:
    """DeepSeek V4.1's engram tables (``common/engram.py``): ``engram_num_embeddings`` rows per engram
    layer of ``engram_head_dim`` fp8 values and an e8m0 scale per 32, in pinned host memory."""
    rows = cfg.get("engram_num_embeddings")
    if not cfg.get("engram_layer_ids") or rows is None:
        return 0
    if type(rows) is not list or not all(type(n) is int and 0 < n < 1 << 40 for n in rows):
        raise ValueError(
            f"engram_num_embeddings: expected a positive integer per engram layer, got {rows!r}"[:160]
        )
    dim = cfg.get("engram_head_dim", 256)
    if type(dim) is not int or not 0 < dim <= 1 << 16:
        raise ValueError(f"engram_head_dim: expected a positive integer, got {dim!r}"[:120])
    return sum(rows) * (dim + -(-dim // 32))


def _mtp_layers(k: _Keys, model_type: object) -> int:
    """The MTP layers vLLM's ``mtp`` method drafts with; none for DeepSeek V4.1, whose
    ``num_nextn_predict_layers`` are DSpark stages (vLLM refuses ``mtp`` there: only ``dspark``);
    MiniMax-M3's ``num_mtp_modules``."""
    if isinstance(model_type, str) and model_type.startswith("deepseek_v41"):
        return 0
    if isinstance(model_type, str) and model_type.startswith("minimax_m3"):  # its own key (speculative.py)
        return k.integer("num_mtp_modules") or 0
    return k.integer("num_nextn_predict_layers") or k.integer("mtp_num_hidden_layers") or 0


def _widest_mlp(k: _Keys) -> int | None:
    """``intermediate_size``: one number, or (Gemma-3n) one a layer, the widest of them; each a
    checked integer (the weights count every layer's own)."""
    v = k.cfg.get("intermediate_size")
    if not isinstance(v, list):
        return k.integer("intermediate_size")
    lo, hi = _LIMITS["intermediate_size"]
    if not v or not all(type(w) is int and lo <= w <= hi for w in v):
        raise k.bad("intermediate_size", f"an integer in [{lo}, {hi}] or a list of them", v)
    return max(v)


def _check_read_elsewhere(k: _Keys) -> None:
    """The keys read elsewhere (layer kinds, the model type), checked here for their type: a
    ``ValueError`` names the key."""
    k.flag("use_sliding_window")
    k.integer("sliding_window_pattern")
    _string_list(k, "layer_types")
    k.text("model_type")


def _language_config(cfg: dict[str, Any]) -> tuple[dict[str, Any], frozenset[str]]:
    """The language model's keys (a multimodal wrapper's text_config over the top level), and which
    of them came from text_config."""
    if not isinstance(cfg, dict):
        raise ValueError(f"expected a JSON object, got {show_value(cfg)}")
    text = cfg.get("text_config")
    if text is not None and not isinstance(text, dict):
        raise ValueError(f"text_config: expected an object, got {show_value(text)}")
    text_keys: frozenset[str] = frozenset()
    if text:  # multimodal wrappers keep the LM in text_config
        cfg = {**cfg, **text}
        text_keys = frozenset(text)
    blocks = cfg.get("layers_block_type")
    if cfg.get("num_hidden_layers") is None and type(blocks) is list and blocks:
        cfg = {**cfg, "num_hidden_layers": len(blocks)}  # transformers 5's Nemotron-H: one entry a layer
    return cfg, text_keys


def _attention_shape(k: _Keys) -> tuple[int, int, int, int, int]:
    """Layers, hidden size, attention heads, KV heads and head size, checked against each other."""
    layers = k.need("num_hidden_layers")
    hidden = k.need("hidden_size")
    heads = k.need("num_attention_heads")
    kv = k.integer("num_key_value_heads") or heads
    if kv > heads or heads % kv:
        raise ValueError(
            f"{k.name('num_key_value_heads')}: {kv} does not divide {k.name('num_attention_heads')} ({heads})"
        )
    head_dim = k.integer("head_dim")
    if head_dim is None:
        if hidden < heads:
            raise ValueError(
                f"{k.name('hidden_size')}: {hidden} is less than {k.name('num_attention_heads')} ({heads}) "
                "and there is no head_dim"
            )
        head_dim = hidden // heads
    return layers, hidden, heads, kv, head_dim


def _string_list(k: _Keys, key: str) -> list[str] | None:
    """``key``'s list of strings, or None when absent."""
    v = k.cfg.get(key)
    if v is not None and (type(v) is not list or not all(type(t) is str for t in v)):
        raise k.bad(key, "a list of strings", v)
    return v


def _declared_quant(k: _Keys) -> tuple[str | None, int | None]:
    """The quantization method (lower case) and bits quantization_config declares, each None if not."""
    q = k.cfg.get("quantization_config")
    if q is None:
        q = {}
    elif type(q) is not dict:
        raise k.bad("quantization_config", "an object", q)
    qk = _Keys(q, prefix=k.name("quantization_config") + ".")
    qmethod_raw = qk.text("quant_method")
    qmethod = qmethod_raw.lower() if qmethod_raw else None
    qbits: int | None = None
    for key in ("bits", "w_bit"):
        v = q.get(key)
        if v is not None and (type(v) is not int or not 1 <= v <= 32):
            raise qk.bad(key, "an integer from 1 to 32", v)
        qbits = qbits or v
    return qmethod, qbits


def _check_expert_keys(k: _Keys) -> None:
    """The mixture-of-experts and multi-token-prediction sizes, range-checked (read later)."""
    for key in (
        "num_experts",
        "n_routed_experts",
        "num_local_experts",
        "moe_num_experts",
        "moe_intermediate_size",
        "n_shared_experts",
        "num_nextn_predict_layers",
        "mtp_num_hidden_layers",
    ):
        k.integer(key)


def _count_weights(
    raw: dict[str, Any], archs: list[str] | None, cfg: dict[str, Any]
) -> tuple[LayerStack, ParamBreakdown, WeightBytes]:
    """Parameters and bytes tensor by tensor, per layer kind, at the checkpoint's quantization; an
    error names the architecture."""
    try:
        stack = layer_stack(raw)
        kinds = list(stack.kinds)
        counted = count_params(raw, kinds)
        loaded = weights_bytes(raw, kinds)
    except ValueError as e:
        what = (archs[0] if archs else None) or cfg.get("model_type") or "this architecture"
        raise ValueError(str(e) if str(e).startswith(f"{what}:") else f"{what}: {e}") from None
    return stack, counted, loaded


def _sliding_layers(cfg: dict[str, Any], layers: int, k: _Keys) -> int:
    """The sliding-window layers, at most ``layers`` (more is a ValueError naming the key)."""
    n = _sliding_count(cfg, layers)
    if n > layers:
        raise ValueError(f"{k.name('layer_types')}: {n} sliding layers, but only {layers} layers")
    return n


def _sliding_count(cfg: dict[str, Any], layers: int) -> int:
    pattern = cfg.get("hybrid_layer_pattern")  # MiMo-V2: 1 a sliding-window layer
    if type(pattern) is list and pattern:
        return sum(1 for p in pattern if p == 1)
    types = cfg.get("layer_types")
    if isinstance(types, list) and types:
        return sum(1 for t in types if "sliding" in str(t))
    if not cfg.get("sliding_window") or cfg.get("use_sliding_window") is False:
        return 0
    if cfg.get("model_type") == "gemma2":  # alternating local/global layers
        return layers // 2
    pattern = cfg.get("sliding_window_pattern")
    if isinstance(pattern, int) and pattern > 1:  # gemma3: every pattern-th layer is global
        return layers - layers // pattern
    return layers
