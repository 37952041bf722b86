"""Reading a local model folder: its config.json (parsed by :func:`.hfconfig.parse_config`) and its
checkpoint size, from ``model.safetensors.index.json`` (checked: its shape, and that the shards it
names are there) or else the ``*.safetensors`` files.

Reads files; every problem is a :class:`hwprofile.config.ConfigError` naming the file.
"""

from __future__ import annotations

import json
import os
from typing import TYPE_CHECKING

from ..config import ConfigError
from .defaults import unloaded_parts
from .hfconfig import parse_config, show_value

if TYPE_CHECKING:
    from typing import Any

    from .facts import ModelFacts

MAX_CONFIG_BYTES = 16 << 20
MAX_INDEX_BYTES = 64 << 20


def _read_json(path: str, cap: int, what: str) -> Any:
    """Parse the JSON file ``path`` (at most ``cap`` bytes, UTF-8); problems are ``ConfigError``s
    naming the file. ``FileNotFoundError`` passes through (the caller knows what a missing file means)."""
    from ..runtime.files import read_bounded

    try:
        raw = read_bounded(path, cap)
    except FileNotFoundError:
        raise
    except OSError as e:
        raise ConfigError(
            f"{path}: cannot read: {e.strerror or e} (a {what} is a regular file of at most {cap >> 20} MiB)"
        ) from None
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
    return with_checkpoint_bytes(facts, cfg, size, how)


def with_checkpoint_bytes(facts: ModelFacts, cfg: dict[str, Any], size: int, how: str) -> ModelFacts:
    """``facts`` weighed by the checkpoint's own total (``size`` bytes from ``how``; 0: not known),
    except where the checkpoint holds parts vLLM does not load (an omni model's talker and code2wav):
    then the config's count of what it loads, and the source says why."""
    if not size:
        return facts
    extra = unloaded_parts(cfg)
    if extra:
        return facts._replace(
            weights_bytes_source=f"config count: the checkpoint's {size / 2**30:.1f} GiB ({how}) also holds "
            f"{', '.join(extra)}, which vLLM does not load"
        )
    return facts._replace(weights_bytes=size, weights_bytes_source=how)


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


def _check_index(index: object, index_path: str, path: str) -> int | None:
    """metadata.total_size of a safetensors index, after checking its shape and its shards."""
    if not isinstance(index, dict):
        raise ConfigError(f"{index_path}: expected a JSON object, got {show_value(index)}")
    meta = index.get("metadata")
    if meta is not None and not isinstance(meta, dict):
        raise ConfigError(f"{index_path}: metadata: expected an object, got {show_value(meta)}")
    total = (meta or {}).get("total_size")
    # Some real indexes write the byte count as a float (Qwen3.8-27B's: 55562855904.0): a whole,
    # finite one is the same count; a fraction, NaN or infinity is not a byte count.
    if type(total) is float and total.is_integer() and 0 <= total <= MAX_CHECKPOINT_BYTES:
        total = int(total)
    if total is not None and (type(total) is not int or not 0 <= total <= MAX_CHECKPOINT_BYTES):
        raise ConfigError(
            f"{index_path}: metadata.total_size: expected a byte count from 0 to {MAX_CHECKPOINT_BYTES}, "
            f"got {show_value(total)}"
        )
    weight_map = index.get("weight_map")
    if weight_map is None:
        return total
    if not isinstance(weight_map, dict):
        raise ConfigError(f"{index_path}: weight_map: expected an object, got {show_value(weight_map)}")
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
                f"got {show_value(shard)}"
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
