"""The config keys a config.json may leave out because they equal its config class's defaults.

transformers writes config.json without the values that equal the config class's own defaults
(``PretrainedConfig.to_diff_dict``), and vLLM reads the model through that class: a missing key means
the class default, not nothing. Gemma 3's published configs leave ``vocab_size`` and
``tie_word_embeddings`` out of ``text_config`` (262,208 tokens, tied), the smaller Gemma 3 sizes their
heads too. The table holds, per ``model_type`` (the text config's), the defaults that size a model, for
the classes whose defaults differ from what hwprofile assumes of a missing key (untied embeddings,
no vocabulary, heads from ``hidden_size``, no window, no length cap): read from transformers 5.19's
config classes (tests/test_model_weights.py compares them with the installed classes). A value the
class computes from other keys is no constant default: ``layer_types`` is derived here as the class
derives it (:data:`LAYER_PATTERN`), Cohere2's ``head_dim`` is hidden / heads as hwprofile reads it.
A key a class reads under another name (LFM2's ``tie_embedding``) is read under hwprofile's
(:data:`ALIASES`).

Pure: a dict in, a dict out.
"""

from __future__ import annotations

from typing import Any

_GEMMA = {"tie_word_embeddings": True, "head_dim": 256}
_TIED = {"tie_word_embeddings": True}
_LFM2 = {"vocab_size": 65536, "max_position_embeddings": 128000, "conv_L_cache": 3}
# keys a config class reads under another name: the name config.json may use -> the one read
ALIASES: dict[str, dict[str, str]] = {
    "lfm2": {"tie_embedding": "tie_word_embeddings"},  # LFM2's published configs say tie_embedding
    "lfm2_moe": {"tie_embedding": "tie_word_embeddings"},
    # Step3/Step5's KV heads are its attention groups (step3_text.py, step5: num_kv_heads)
    "step3_text": {"num_attention_groups": "num_key_value_heads"},
    "step5": {"num_attention_groups": "num_key_value_heads"},
    "step3p5": {"num_attention_groups": "num_key_value_heads"},
}
# keys HunYuan's classes give one value per layer (moe_topk, moe_intermediate_size, num_shared_expert,
# num_experts: hunyuan_v1.py reads entry [layer_id]); one value for every layer where the list holds
# one, else refused by name (hwprofile counts one MoE shape for every layer); other families' lists are
# read, and refused, by their own readers
PER_LAYER_KEYS = ("moe_topk", "moe_intermediate_size", "num_shared_expert", "num_experts")
CLASS_DEFAULTS: dict[str, dict[str, Any]] = {
    "gemma": {**_GEMMA, "vocab_size": 256000, "num_attention_heads": 16, "num_key_value_heads": 16}
    | {"max_position_embeddings": 8192},
    "gemma2": {**_GEMMA, "vocab_size": 256000, "num_attention_heads": 8, "num_key_value_heads": 4}
    | {"sliding_window": 4096, "max_position_embeddings": 8192},
    "gemma3_text": {**_GEMMA, "vocab_size": 262208, "num_attention_heads": 8, "num_key_value_heads": 4}
    | {"sliding_window": 4096, "max_position_embeddings": 131072},
    "gemma3n_text": {**_GEMMA, "vocab_size": 262400, "num_attention_heads": 8, "num_key_value_heads": 2}
    | {"sliding_window": 512, "max_position_embeddings": 32768, "num_kv_shared_layers": 15},
    "cohere": {**_TIED, "vocab_size": 256000, "max_position_embeddings": 8192},
    # Cohere2's head_dim is hidden_size / num_attention_heads, computed: no constant default
    "cohere2": {**_TIED, "vocab_size": 256000, "sliding_window": 4096, "max_position_embeddings": 8192},
    "lfm2": {**_TIED, **_LFM2, "block_auto_adjust_ff_dim": True, "block_multiple_of": 256}
    | {"block_ffn_dim_multiplier": 1.0},
    "lfm2_moe": {**_TIED, **_LFM2},
    "ernie4_5_moe": {**_TIED, "vocab_size": 103424, "max_position_embeddings": 131072},
    "smollm3": {**_TIED, "vocab_size": 128256, "max_position_embeddings": 32768},
    # Qwen4-Exp (Qwen3.8-Flash-Next): its hyper-connection streams, PLE short conv and n-gram tables
    "qwen4_exp_text": {"vocab_size": 248320, "head_dim": 256, "num_key_value_heads": 2}
    | {"linear_conv_kernel_dim": 4, "linear_key_head_dim": 128, "linear_value_head_dim": 128}
    | {
        "linear_num_key_heads": 16,
        "linear_num_value_heads": 32,
        "num_experts": 512,
        "num_experts_per_tok": 10,
    }
    | {"moe_intermediate_size": 512, "shared_expert_intermediate_size": 512, "hc_count": 4, "hc_lowrank": 320}
    | {"ple_conv_kernel_size": 4, "ngram_size": 3, "heads_per_ngram": 8, "ngram_vocab_size_base": 20_000_000}
    | {"make_ngram_vocab_size_divisible_by": 128, "max_position_embeddings": 32768},
    "zamba2": {**_TIED, "vocab_size": 32000, "max_position_embeddings": 4096, "num_attention_heads": 32}
    | {"n_mamba_heads": 8, "mamba_expand": 2, "mamba_d_state": 64, "mamba_d_conv": 4, "mamba_ngroups": 1}
    | {"num_mem_blocks": 1, "use_shared_attention_adapter": False, "adapter_rank": 128},
}

# The classes that derive ``layer_types`` when the config has none: layer ``i`` is full attention
# where ``(i + 1) % pattern == 0``, sliding otherwise; the pattern is the config's key named here
# (a config.json written before ``layer_types`` existed keeps it) or the class's own number.
# Gemma 3 27B's published text_config has neither key: 52 sliding and 10 full layers of 62.
LAYER_PATTERN: dict[str, tuple[str | None, int]] = {
    "gemma2": (None, 2),
    "gemma3_text": ("sliding_window_pattern", 6),
    "gemma3n_text": (None, 5),
    "cohere2": ("sliding_window_pattern", 4),
}


def _derived_layer_types(inner: dict[str, Any], mtype: str) -> list[str] | None:
    """The ``layer_types`` the config class derives for ``inner`` (None: the config gives them, the
    class derives none, or the keys it needs are not numbers: read and refused elsewhere)."""
    if mtype not in LAYER_PATTERN or inner.get("layer_types") is not None:
        return None
    key, pattern = LAYER_PATTERN[mtype]
    if key is not None:
        pattern = inner.get(key, pattern)
    layers = inner.get("num_hidden_layers")
    if type(pattern) is not int or pattern < 1 or type(layers) is not int or layers < 0:
        return None
    return ["full_attention" if (i + 1) % pattern == 0 else "sliding_attention" for i in range(layers)]


def _uniform(inner: dict[str, Any]) -> dict[str, Any]:
    """The :data:`PER_LAYER_KEYS` of ``inner`` given per layer, as their one value; HunYuan's mixed
    MLP (``use_mixed_mlp_moe``: ``num_shared_expert`` dense MLPs of ``intermediate_size`` beside the
    experts, hunyuan_v1.py) under the keys the shared experts are read by. ``ValueError`` where the
    layers' values differ."""
    out: dict[str, Any] = {}
    for key in PER_LAYER_KEYS:
        v = inner.get(key)
        if type(v) is list and v and all(type(x) is int for x in v):
            if len(set(v)) > 1:
                raise ValueError(
                    f"{key}: the layers' values differ ({min(v)} to {max(v)}); hwprofile counts one "
                    "mixture-of-experts shape for every layer"
                )
            out[key] = v[0]
    shared = out.get("num_shared_expert", inner.get("num_shared_expert"))
    if inner.get("use_mixed_mlp_moe") and type(shared) is int and shared and "n_shared_experts" not in inner:
        out["n_shared_experts"] = shared
        if type(inner.get("intermediate_size")) is int:
            out.setdefault("moe_shared_expert_intermediate_size", inner["intermediate_size"])
    return out


def _zamba2_heads(inner: dict[str, Any]) -> dict[str, Any]:
    """Zamba2's attention shape as its class computes it (``Zamba2Config``): it attends over the hidden
    state and the embedding side by side, so each head is ``2 x hidden_size / num_attention_heads``
    wide (``attention_head_dim``), and every head has its own K and V (vLLM's ``zamba2.py``)."""
    hidden, heads = inner.get("hidden_size"), inner.get("num_attention_heads")
    out: dict[str, Any] = {}
    if "head_dim" not in inner and type(hidden) is int and type(heads) is int and heads > 0:
        given = inner.get("attention_head_dim")
        out["head_dim"] = given if type(given) is int else 2 * hidden // heads
    if "num_key_value_heads" not in inner and type(heads) is int:
        out["num_key_value_heads"] = heads
    return out


# the sub-configs of an omni model that vLLM does not load (qwen2_5_omni_thinker.py,
# qwen3_omni_moe_thinker.py: the thinker serves text; "talker." and "code2wav." weights are skipped)
SPEECH_PARTS = ("talker_config", "code2wav_config", "token2wav_config")


def unloaded_parts(cfg: dict[str, Any]) -> tuple[str, ...]:
    """The sub-configs of ``cfg`` whose weights the checkpoint holds but vLLM does not load (an omni
    model's speech generator): its safetensors total then overstates what is loaded."""
    if not isinstance(cfg, dict) or not isinstance(cfg.get("thinker_config"), dict):
        return ()
    return tuple(k for k in SPEECH_PARTS if isinstance(cfg.get(k), dict))


def unwrapped(cfg: dict[str, Any]) -> dict[str, Any]:
    """An omni model's config (Qwen2.5-Omni, Qwen3-Omni: the language model, vision and audio towers
    under ``thinker_config``) as the thinker's, which is what vLLM serves: ``thinker_config``'s keys
    at the top (its ``text_config`` the language model), the top level's own keys (architectures,
    quantization) over them, the speech generator's left out. Any other config as it is."""
    if not isinstance(cfg, dict):
        return cfg
    thinker = cfg.get("thinker_config")
    if not isinstance(thinker, dict) or not thinker or "text_config" in cfg:
        return cfg
    top = {k: v for k, v in cfg.items() if k != "thinker_config" and k not in SPEECH_PARTS}
    return {**thinker, **top}


def with_class_defaults(cfg: dict[str, Any]) -> dict[str, Any]:
    """``cfg`` with its config class's defaults for the keys it leaves out (:data:`CLASS_DEFAULTS`)
    and its per-layer lists as one value (:func:`_uniform`), in ``text_config`` where the language
    model lives there; ``cfg`` itself where nothing is missing."""
    if not isinstance(cfg, dict):
        return cfg
    text = cfg.get("text_config")
    inner = text if isinstance(text, dict) and text else cfg
    mtype = inner.get("model_type")
    if not isinstance(mtype, str) and inner is text:  # a text_config without its own model_type
        wrapper = cfg.get("model_type")
        mtype = f"{wrapper}_text" if isinstance(wrapper, str) else None
    if not isinstance(mtype, str):
        return cfg
    aliased = {
        to: inner[name] for name, to in ALIASES.get(mtype, {}).items() if name in inner and to not in inner
    }
    missing = {k: v for k, v in CLASS_DEFAULTS.get(mtype, {}).items() if k not in inner} | aliased
    if mtype.startswith("hunyuan"):
        missing |= _uniform(inner)
    if mtype == "zamba2":
        missing |= _zamba2_heads({**inner, **missing})
    types = _derived_layer_types({**inner, **missing}, mtype)
    if types is not None:
        missing["layer_types"] = types
    if not missing:
        return cfg
    if inner is text:
        return {**cfg, "text_config": {**text, **missing}}
    return {**cfg, **missing}
