"""The config keys a config.json may leave out because they equal its config class's defaults.

transformers writes config.json without the values that equal the config class's own defaults
(``PretrainedConfig.to_diff_dict``), and vLLM reads the model through that class: a missing key means
the class default, not nothing. Gemma 3's published configs leave ``vocab_size`` and
``tie_word_embeddings`` out of ``text_config`` (262,208 tokens, tied), the smaller Gemma 3 sizes their
heads too. The table holds, per ``model_type`` (the text config's), the defaults that size a model, for
the classes whose defaults differ from what hwprofile assumes of a missing key (untied embeddings,
no vocabulary, heads from ``hidden_size``): read from transformers 5.19's config classes.

Pure: a dict in, a dict out.
"""

from __future__ import annotations

from typing import Any

_GEMMA = {"tie_word_embeddings": True, "head_dim": 256}
CLASS_DEFAULTS: dict[str, dict[str, Any]] = {
    "gemma": {**_GEMMA, "vocab_size": 256000, "num_attention_heads": 16, "num_key_value_heads": 16},
    "gemma2": {**_GEMMA, "vocab_size": 256000, "num_attention_heads": 8, "num_key_value_heads": 4},
    "gemma3_text": {**_GEMMA, "vocab_size": 262208, "num_attention_heads": 8, "num_key_value_heads": 4},
    "gemma3n_text": {**_GEMMA, "vocab_size": 262400, "num_attention_heads": 8, "num_key_value_heads": 2},
    "cohere": {"tie_word_embeddings": True, "vocab_size": 256000},
    "cohere2": {"tie_word_embeddings": True, "vocab_size": 256000, "head_dim": 128},
    "lfm2": {"tie_word_embeddings": True, "vocab_size": 65536},
    "ernie4_5_moe": {"tie_word_embeddings": True, "vocab_size": 103424},
    "smollm3": {"tie_word_embeddings": True, "vocab_size": 128256},
}


def with_class_defaults(cfg: dict[str, Any]) -> dict[str, Any]:
    """``cfg`` with its config class's defaults for the keys it leaves out (:data:`CLASS_DEFAULTS`),
    in ``text_config`` where the language model lives there; ``cfg`` itself where nothing is missing."""
    if not isinstance(cfg, dict):
        return cfg
    text = cfg.get("text_config")
    inner = text if isinstance(text, dict) and text else cfg
    mtype = inner.get("model_type")
    defaults = CLASS_DEFAULTS.get(mtype) if isinstance(mtype, str) else None
    if defaults is None and inner is text:  # a text_config without its own model_type: the wrapper's
        wrapper = cfg.get("model_type")
        defaults = CLASS_DEFAULTS.get(f"{wrapper}_text") if isinstance(wrapper, str) else None
    missing = {k: v for k, v in (defaults or {}).items() if k not in inner}
    if not missing:
        return cfg
    if inner is text:
        return {**cfg, "text_config": {**text, **missing}}
    return {**cfg, **missing}
