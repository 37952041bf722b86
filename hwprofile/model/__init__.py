"""Model facts: architecture and weight sizes from a local model directory (config.json, safetensors),
the local Hugging Face cache, or the built-in catalog of well-known models.

Parsers take text or dicts; readers take paths. Nothing here imports torch or transformers.
"""

from __future__ import annotations

import json
import os
from functools import lru_cache

from .._record import TYPE_CHECKING, Record
from ..config import ConfigError

if TYPE_CHECKING:
    from typing import Any

DTYPE_BYTES = {"bfloat16": 2, "float16": 2, "half": 2, "float32": 4, "float": 4, "float8_e4m3fn": 1}


class ModelFacts(Record):
    name: str
    source: str  # "dir", "hf-cache" or "catalog"
    path: str | None
    architecture: str | None
    model_type: str | None
    num_layers: int
    hidden_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    max_position_embeddings: int | None
    dtype: str
    tie_word_embeddings: bool
    sliding_window: int | None
    sliding_layers: int  # layers with a sliding window (the rest are full attention)
    quant_method: str | None
    quant_bits: int | None
    params: int  # estimated from the architecture
    weights_bytes: int  # on-disk checkpoint size where known, else estimated from params and bits
    weights_bytes_source: str  # "safetensors index", "safetensors files", "estimate"
    mtp_layers: int  # multi-token-prediction heads shipped with the model (usable as speculator)
    quantized_variants: dict[int, str]  # catalog: bits → checkpoint name

    @property
    def full_layers(self) -> int:
        return self.num_layers - self.sliding_layers

    @property
    def dtype_bytes(self) -> int:
        return DTYPE_BYTES.get(self.dtype, 2)

    @property
    def bits(self) -> int:
        return self.quant_bits or 8 * min(self.dtype_bytes, 2)

    def weights_bytes_at_bits(self, bits: int) -> int:
        """Estimated checkpoint size of this model at ``bits`` per weight."""
        return weights_bytes_at(
            self.params, embed_params(self.vocab_size, self.hidden_size, self.tie_word_embeddings), bits
        )


def parse_config(cfg: dict[str, Any], name: str, source: str, path: str | None) -> ModelFacts:
    """ModelFacts from a config.json dict (text config of multimodal models included)."""
    if isinstance(cfg.get("text_config"), dict):  # multimodal wrappers keep the LM in text_config
        cfg = {**cfg, **cfg["text_config"]}
    try:
        layers = int(cfg["num_hidden_layers"])
        hidden = int(cfg["hidden_size"])
        heads = int(cfg["num_attention_heads"])
    except (KeyError, TypeError, ValueError) as e:
        raise ValueError(f"config.json lacks a usable {e} (not a decoder language model?)") from None
    kv = int(cfg.get("num_key_value_heads") or heads)
    head_dim = int(cfg.get("head_dim") or hidden // heads)
    inter = int(cfg.get("intermediate_size") or 4 * hidden)
    vocab = int(cfg.get("vocab_size") or 0)
    dtype = str(cfg.get("torch_dtype") or cfg.get("dtype") or "bfloat16")
    tie = bool(cfg.get("tie_word_embeddings", False))
    window = cfg.get("sliding_window")
    sliding = _sliding_layers(cfg, layers)
    q = cfg.get("quantization_config") or {}
    qmethod = str(q.get("quant_method")).lower() if q.get("quant_method") else None
    qbits = q.get("bits") or q.get("w_bit") or (8 if qmethod == "fp8" else None)
    params = estimate_params(cfg, hidden, inter, layers, heads, kv, head_dim, vocab, tie)
    bits = int(qbits) if qbits else 8 * min(DTYPE_BYTES.get(dtype, 2), 2)
    return ModelFacts(
        name=name,
        source=source,
        path=path,
        architecture=(cfg.get("architectures") or [None])[0],
        model_type=cfg.get("model_type"),
        num_layers=layers,
        hidden_size=hidden,
        num_heads=heads,
        num_kv_heads=kv,
        head_dim=head_dim,
        intermediate_size=inter,
        vocab_size=vocab,
        max_position_embeddings=cfg.get("max_position_embeddings"),
        dtype=dtype,
        tie_word_embeddings=tie,
        sliding_window=int(window) if window and sliding else None,
        sliding_layers=sliding,
        quant_method=qmethod,
        quant_bits=int(qbits) if qbits else None,
        params=params,
        weights_bytes=weights_bytes_at(params, embed_params(vocab, hidden, tie), bits),
        weights_bytes_source="estimate",
        mtp_layers=int(cfg.get("num_nextn_predict_layers") or cfg.get("mtp_num_hidden_layers") or 0),
        quantized_variants={},
    )


def _sliding_layers(cfg: dict[str, Any], layers: int) -> int:
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


def estimate_params(
    cfg: dict[str, Any],
    hidden: int,
    inter: int,
    layers: int,
    heads: int,
    kv: int,
    head_dim: int,
    vocab: int,
    tie: bool,
) -> int:
    attn = hidden * heads * head_dim * 2 + hidden * kv * head_dim * 2
    experts = int(cfg.get("num_experts") or cfg.get("n_routed_experts") or cfg.get("num_local_experts") or 0)
    if experts:
        moe_inter = int(cfg.get("moe_intermediate_size") or inter)
        shared = int(cfg.get("n_shared_experts") or 0) * 3 * hidden * moe_inter
        mlp = experts * 3 * hidden * moe_inter + shared + hidden * experts
    else:
        mlp = 3 * hidden * inter
    return layers * (attn + mlp + 2 * hidden) + embed_params(vocab, hidden, tie) + hidden


def embed_params(vocab: int, hidden: int, tie: bool) -> int:
    """Input embedding plus LM head (one matrix when tied)."""
    return vocab * hidden * (1 if tie else 2)


def weights_bytes_at(params: int, embed: int, bits: int) -> int:
    """Checkpoint size at ``bits`` per weight. Quantized checkpoints keep embeddings and the LM head
    in 16 bits and add ~4 % for group scales and zero points (group size 128)."""
    if bits >= 16:
        return params * 2
    body = params - embed
    return int(body * bits / 8 * 1.04) + embed * 2


# -- readers ------------------------------------------------------------------------------


def read_model_dir(path: str | os.PathLike[str], name: str | None = None, source: str = "dir") -> ModelFacts:
    path = os.fspath(path)
    cfg_path = os.path.join(path, "config.json")
    try:
        with open(cfg_path, encoding="utf-8") as f:
            text = f.read()
    except FileNotFoundError:
        raise ConfigError(
            f"{cfg_path}: no config.json in the model directory (is {path} a Hugging Face model folder?)"
        ) from None
    except OSError as e:
        raise ConfigError(f"{cfg_path}: cannot read: {e.strerror or e}") from None
    try:
        cfg = json.loads(text)
    except json.JSONDecodeError as e:
        raise ConfigError(f"{cfg_path}:{e.lineno}: invalid JSON: {e.msg}") from None
    if not isinstance(cfg, dict):
        raise ConfigError(f"{cfg_path}:1: expected a JSON object")
    try:
        facts = parse_config(cfg, name or path, source, path)
    except ValueError as e:
        raise ConfigError(f"{cfg_path}: {e}") from None
    size, how = checkpoint_bytes(path)
    if size:
        facts = facts._replace(weights_bytes=size, weights_bytes_source=how)
    return facts


def checkpoint_bytes(path: str | os.PathLike[str]) -> tuple[int, str]:
    """Weight bytes from ``model.safetensors.index.json`` (metadata.total_size), else the sum of the
    ``*.safetensors`` files (their small JSON headers included)."""
    try:
        with open(os.path.join(path, "model.safetensors.index.json"), encoding="utf-8") as f:
            total = json.load(f).get("metadata", {}).get("total_size")
        if total:
            return int(total), "safetensors index"
    except (OSError, ValueError, AttributeError):
        pass
    try:
        files = [e for e in os.scandir(path) if e.name.endswith(".safetensors") and e.is_file()]
    except OSError:
        files = []
    if files:
        return sum(e.stat().st_size for e in files), "safetensors files"
    return 0, "estimate"


def hf_cache_dir() -> str:
    if os.environ.get("HF_HUB_CACHE"):
        return os.environ["HF_HUB_CACHE"]
    home = os.environ.get("HF_HOME") or os.path.join(os.path.expanduser("~"), ".cache", "huggingface")
    return os.path.join(home, "hub")


def find_in_hf_cache(name: str, cache: str | os.PathLike[str] | None = None) -> str | None:
    """The snapshot directory of ``org/name`` in the local Hugging Face cache (refs/main first)."""
    base = os.path.join(cache or hf_cache_dir(), "models--" + name.replace("/", "--"))
    snaps = os.path.join(base, "snapshots")
    if not os.path.isdir(snaps):
        return None
    try:
        with open(os.path.join(base, "refs", "main"), encoding="utf-8") as f:
            snap = os.path.join(snaps, f.read().strip())
        if os.path.isfile(os.path.join(snap, "config.json")):
            return snap
    except OSError:
        pass
    try:
        candidates = [e for e in os.scandir(snaps) if os.path.isfile(os.path.join(e.path, "config.json"))]
    except OSError:
        return None
    return max(candidates, key=lambda e: e.stat().st_mtime).path if candidates else None


@lru_cache(maxsize=1)
def _catalog() -> dict[str, dict[str, Any]]:
    from ..config.yamlsrc import load_file

    data = load_file(os.path.join(os.path.dirname(os.path.dirname(__file__)), "data", "models.yaml"))[0]
    return {m["name"].lower(): m for m in data["models"]}


@lru_cache(maxsize=1)
def catalog_models() -> tuple[ModelFacts, ...]:
    """Every catalog model's facts (parsed once per process)."""
    return tuple(f for f in (from_catalog(m["name"]) for m in _catalog().values()) if f is not None)


def catalog_names() -> list[str]:
    return sorted(m["name"] for m in _catalog().values())


def from_catalog(name: str) -> ModelFacts | None:
    key = name.lower()
    entry = _catalog().get(key) or next((m for k, m in _catalog().items() if k.split("/")[-1] == key), None)
    if entry is None:
        return None
    facts = parse_config(entry["config"], entry["name"], "catalog", None)
    return facts._replace(
        quantized_variants={int(q["bits"]): q["name"] for q in entry.get("quantized") or ()}
    )


def resolve_model(spec: str, what: str = "model") -> ModelFacts:
    """A directory, else a Hugging Face name found in the local cache, else a catalog name."""
    p = os.path.expanduser(spec)
    if os.path.isdir(p):
        return read_model_dir(p, name=spec)
    looks_like_path = spec.startswith(("/", "./", "../", "~")) or os.path.exists(p)
    if looks_like_path:
        raise ConfigError(f"{what} {spec}: no such model directory")
    snap = find_in_hf_cache(spec)
    if snap is not None:
        return read_model_dir(snap, name=spec, source="hf-cache")
    facts = from_catalog(spec)
    if facts is not None:
        return facts
    from ..config.schema import suggest

    raise ConfigError(
        f"{what} '{spec}': not a local directory, not in the Hugging Face cache ({hf_cache_dir()}), "
        f"and not in the built-in catalog{suggest(spec, catalog_names())}. "
        f"Give a model directory, or one of: {', '.join(catalog_names())}"
    )
