"""Model facts: architecture and weight sizes from a local model directory (config.json, safetensors),
the local Hugging Face cache, the built-in catalog of well-known models, or the Hugging Face Hub.

- :mod:`.facts`: :class:`ModelFacts` and the weight arithmetic (pure).
- :mod:`.hfconfig`: config.json dict → :class:`ModelFacts`, every key checked (pure); :mod:`.arch`
  adds what differs per architecture (MoE, MLA); :mod:`.weights` counts every parameter tensor per
  layer kind and sizes it under the checkpoint's quantization (pure).
- :mod:`.files`: a model folder's config.json and safetensors index or shards (reads files).
- :mod:`.resolve`: directory, else Hugging Face cache, else catalog, else the Hub (reads the cache and
  the catalog).
- :mod:`.hub`: a Hub model before its download: config.json, the file list with sizes, the safetensors
  index and headers through ``huggingface_hub`` (imported lazily), kept in the Hugging Face cache; the
  one module here that reaches the network or writes (the cache).

Parsers take dicts; readers take paths. Nothing here imports torch or transformers. The names below
are this package's interface: import them from ``hwprofile.model``.
"""

from __future__ import annotations

from .facts import DTYPE_BYTES, ModelFacts, embed_params, weights_bytes_at
from .files import MAX_CHECKPOINT_BYTES, MAX_CONFIG_BYTES, MAX_INDEX_BYTES, checkpoint_bytes, read_model_dir
from .hfconfig import parse_config
from .resolve import (
    catalog_family,
    catalog_models,
    catalog_names,
    find_in_hf_cache,
    from_catalog,
    hf_cache_dir,
    resolve_model,
    variant_facts,
)
from .weights import ParamBreakdown, WeightBytes, count_params, weights_bytes

__all__ = [
    "DTYPE_BYTES",
    "MAX_CHECKPOINT_BYTES",
    "MAX_CONFIG_BYTES",
    "MAX_INDEX_BYTES",
    "ModelFacts",
    "ParamBreakdown",
    "WeightBytes",
    "catalog_family",
    "catalog_models",
    "catalog_names",
    "checkpoint_bytes",
    "count_params",
    "embed_params",
    "find_in_hf_cache",
    "from_catalog",
    "hf_cache_dir",
    "parse_config",
    "read_model_dir",
    "resolve_model",
    "variant_facts",
    "weights_bytes",
    "weights_bytes_at",
]
