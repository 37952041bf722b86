"""Model facts: architecture and weight sizes from a local model directory (config.json, safetensors),
the local Hugging Face cache, or the built-in catalog of well-known models.

Parsers take text or dicts; readers take paths. Nothing here imports torch or transformers.
"""

from __future__ import annotations

import json
import os
from functools import lru_cache
from typing import TYPE_CHECKING, NamedTuple

from ..config import ConfigError
from .arch import read_arch

if TYPE_CHECKING:
    from typing import Any

DTYPE_BYTES = {"bfloat16": 2, "float16": 2, "half": 2, "float32": 4, "float": 4, "float8_e4m3fn": 1}


class ModelFacts(NamedTuple):
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
    # architecture facts (hwprofile.model.arch); defaults describe a dense model with ordinary attention
    active_params: int = 0  # weights read per decoded token (MoE: routed experts only); 0 = params
    num_experts: int = 0  # MoE: routed experts per MoE layer
    experts_per_token: int = 0  # MoE: experts each token is routed to
    kv_lora_rank: int = 0  # MLA: one latent of kv_lora_rank + qk_rope_head_dim per token and layer
    qk_rope_head_dim: int = 0

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
    "sliding_window_pattern": (1, 10_000),
    "num_experts": (0, 1 << 16),
    "n_routed_experts": (0, 1 << 16),
    "num_local_experts": (0, 1 << 16),
    "moe_intermediate_size": (1, 1 << 24),
    "n_shared_experts": (0, 1 << 16),
    "num_nextn_predict_layers": (0, 1000),
    "mtp_num_hidden_layers": (0, 1000),
}
MAX_CONFIG_BYTES = 16 << 20
MAX_INDEX_BYTES = 64 << 20


def _show(v: Any) -> str:
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

    def bad(self, key: str, expected: str, v: Any) -> ValueError:
        return ValueError(f"{self.name(key)}: expected {expected}, got {_show(v)}")

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


def parse_config(cfg: dict[str, Any], name: str, source: str, path: str | None) -> ModelFacts:
    """ModelFacts from a config.json dict (text config of multimodal models included). Every key
    read is type- and range-checked: a ``ValueError`` names the key and what it holds."""
    if not isinstance(cfg, dict):
        raise ValueError(f"expected a JSON object, got {_show(cfg)}")
    text = cfg.get("text_config")
    if text is not None and not isinstance(text, dict):
        raise ValueError(f"text_config: expected an object, got {_show(text)}")
    text_keys: frozenset[str] = frozenset()
    if text:  # multimodal wrappers keep the LM in text_config
        cfg = {**cfg, **text}
        text_keys = frozenset(text)
    k = _Keys(cfg, text_keys)
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
    inter = k.integer("intermediate_size") or 4 * hidden
    vocab = k.integer("vocab_size", 0) or 0
    dtype = k.text("torch_dtype") or k.text("dtype") or "bfloat16"
    tie = bool(k.flag("tie_word_embeddings"))
    # some configs write false for "no window"
    window = None if cfg.get("sliding_window") is False else k.integer("sliding_window")
    k.flag("use_sliding_window")
    k.integer("sliding_window_pattern")
    types = cfg.get("layer_types")
    if types is not None and (type(types) is not list or not all(type(t) is str for t in types)):
        raise k.bad("layer_types", "a list of strings", types)
    k.text("model_type")
    archs = cfg.get("architectures")
    if archs is not None and (type(archs) is not list or not all(type(a) is str for a in archs)):
        raise k.bad("architectures", "a list of strings", archs)
    sliding = _sliding_layers(cfg, layers)
    if sliding > layers:
        raise ValueError(f"{k.name('layer_types')}: {sliding} sliding layers, but only {layers} layers")
    q = cfg.get("quantization_config")
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
    qbits = qbits or {"fp8": 8, "mxfp4": 4}.get(qmethod or "")
    for key in (
        "num_experts",
        "n_routed_experts",
        "num_local_experts",
        "moe_intermediate_size",
        "n_shared_experts",
    ):
        k.integer(key)
    arch = read_arch(cfg, hidden, inter, layers, heads, kv, head_dim, vocab, tie)
    params = arch.params
    bits = qbits if qbits else 8 * min(DTYPE_BYTES.get(dtype, 2), 2)
    return ModelFacts(
        name=name,
        source=source,
        path=path,
        architecture=(archs or [None])[0],
        model_type=cfg.get("model_type"),
        num_layers=layers,
        hidden_size=hidden,
        num_heads=heads,
        num_kv_heads=kv,
        head_dim=head_dim,
        intermediate_size=inter,
        vocab_size=vocab,
        max_position_embeddings=k.integer("max_position_embeddings"),
        dtype=dtype,
        tie_word_embeddings=tie,
        sliding_window=window if window and sliding else None,
        sliding_layers=sliding,
        quant_method=qmethod,
        quant_bits=qbits,
        params=params,
        weights_bytes=weights_bytes_at(params, embed_params(vocab, hidden, tie), bits),
        weights_bytes_source="estimate",
        mtp_layers=k.integer("num_nextn_predict_layers") or k.integer("mtp_num_hidden_layers") or 0,
        quantized_variants={},
        active_params=arch.active_params,
        num_experts=arch.num_experts,
        experts_per_token=arch.experts_per_token,
        kv_lora_rank=arch.kv_lora_rank,
        qk_rope_head_dim=arch.qk_rope_head_dim,
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


def _read_json(path: str, cap: int, what: str) -> Any:
    """Parse the JSON file ``path`` (at most ``cap`` bytes, UTF-8); problems are ``ConfigError``s
    naming the file. ``FileNotFoundError`` passes through (the caller knows what a missing file means)."""
    try:
        with open(path, "rb") as f:
            raw = f.read(cap + 1)
    except FileNotFoundError:
        raise
    except OSError as e:
        raise ConfigError(f"{path}: cannot read: {e.strerror or e}") from None
    if len(raw) > cap:
        raise ConfigError(f"{path}: larger than {cap >> 20} MiB: not a {what}")
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        raise ConfigError(f"{path}: not UTF-8 text (byte 0x{raw[e.start]:02x} at offset {e.start})") from None
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        raise ConfigError(f"{path}:{e.lineno}: invalid JSON: {e.msg}") from None
    except RecursionError:
        raise ConfigError(f"{path}: invalid JSON: nested too deeply") from None
    except ValueError as e:  # e.g. an integer of more than 4300 digits
        raise ConfigError(f"{path}: invalid JSON: {e}") from None


def read_model_dir(path: str | os.PathLike[str], name: str | None = None, source: str = "dir") -> ModelFacts:
    path = os.fspath(path)
    cfg_path = os.path.join(path, "config.json")
    try:
        cfg = _read_json(cfg_path, MAX_CONFIG_BYTES, "model config")
    except FileNotFoundError:
        raise ConfigError(
            f"{cfg_path}: no config.json in the model directory (is {path} a Hugging Face model folder?)"
        ) from None
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


MAX_CHECKPOINT_BYTES = 1 << 50


def checkpoint_bytes(path: str | os.PathLike[str]) -> tuple[int, str]:
    """Weight bytes from ``model.safetensors.index.json`` (metadata.total_size), else the sum of the
    ``*.safetensors`` files (their small JSON headers included). An index that is not valid JSON,
    holds a size that is not a byte count, or names shards the directory lacks is a ``ConfigError``."""
    path = os.fspath(path)
    index_path = os.path.join(path, "model.safetensors.index.json")
    try:
        index = _read_json(index_path, MAX_INDEX_BYTES, "safetensors index")
    except FileNotFoundError:
        index = None
    if index is not None:
        total = _check_index(index, index_path, path)
        if total:
            return total, "safetensors index"
    try:
        files = [e for e in os.scandir(path) if e.name.endswith(".safetensors") and e.is_file()]
    except OSError:
        files = []
    if files:
        return sum(e.stat().st_size for e in files), "safetensors files"
    return 0, "estimate"


def _check_index(index: Any, index_path: str, path: str) -> int | None:
    """metadata.total_size of a safetensors index, after checking its shape and its shards."""
    if not isinstance(index, dict):
        raise ConfigError(f"{index_path}: expected a JSON object, got {_show(index)}")
    meta = index.get("metadata")
    if meta is not None and not isinstance(meta, dict):
        raise ConfigError(f"{index_path}: metadata: expected an object, got {_show(meta)}")
    total = (meta or {}).get("total_size")
    if total is not None and (type(total) is not int or not 0 <= total <= MAX_CHECKPOINT_BYTES):
        raise ConfigError(
            f"{index_path}: metadata.total_size: expected a byte count from 0 to {MAX_CHECKPOINT_BYTES}, "
            f"got {_show(total)}"
        )
    weight_map = index.get("weight_map")
    if weight_map is None:
        return total
    if not isinstance(weight_map, dict):
        raise ConfigError(f"{index_path}: weight_map: expected an object, got {_show(weight_map)}")
    shards: set[str] = set()
    for tensor, shard in weight_map.items():
        if (
            type(shard) is not str
            or not shard
            or os.path.isabs(shard)
            or ".." in shard.split("/")
            or "\x00" in shard
        ):
            raise ConfigError(
                f"{index_path}: weight_map.{tensor}: expected a shard file name in the model folder, "
                f"got {_show(shard)}"
            )
        shards.add(shard)
    missing = sorted(s for s in shards if not os.path.isfile(os.path.join(path, s)))
    if missing:
        shown = ", ".join(missing[:5]) + (f" and {len(missing) - 5} more" if len(missing) > 5 else "")
        raise ConfigError(
            f"{index_path}: weight_map names {len(missing)} shard file(s) missing from {path}: {shown} "
            "(an incomplete download?)"
        )
    return total


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
    except (OSError, ValueError):  # unreadable, or not UTF-8
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
    if not spec or not spec.strip():
        raise ConfigError(
            f"--{what} {spec!r}: empty; give a model directory, a Hugging Face name or a catalog name "
            "(or leave the option out for the profile's model)"
        )
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
