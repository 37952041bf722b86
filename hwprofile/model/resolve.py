"""Finding a model by what the user typed: a local directory, else a name (``ORG/NAME``, or
``ORG/NAME@REVISION``) whose weights are in the local Hugging Face cache (``HF_HUB_CACHE``,
``HF_HOME``), else a name in the built-in catalog (``hwprofile/data/models.yaml``, parsed once per
process; a name with a revision skips it), else the Hub (:mod:`.hub`: config and file list, never
the weights; with ``HF_HUB_OFFLINE``, only what an earlier look-up left in the cache).

Reads the file system (the cache, the catalog file); only :mod:`.hub` reaches the network.
"""

from __future__ import annotations

import os
from functools import lru_cache
from typing import TYPE_CHECKING

from ..config import ConfigError
from .files import MAX_CONFIG_BYTES, _read_json, read_model_dir
from .hfconfig import parse_config

if TYPE_CHECKING:
    from typing import Any

    from .facts import ModelFacts


def hf_cache_dir() -> str:
    if os.environ.get("HF_HUB_CACHE"):
        return os.environ["HF_HUB_CACHE"]
    home = os.environ.get("HF_HOME") or os.path.join(os.path.expanduser("~"), ".cache", "huggingface")
    return os.path.join(home, "hub")


def find_in_hf_cache(
    name: str, cache: str | os.PathLike[str] | None = None, revision: str | None = None
) -> str | None:
    """The snapshot directory of ``org/name`` in the local Hugging Face cache (refs/main first, or
    the snapshot of ``revision``: a commit, or a branch or tag the cache has a ref of). A snapshot
    where hwprofile fetched only the config (:mod:`.hub`: its file list names weights the snapshot
    lacks) is no downloaded model: it is left to the Hub look-up."""
    cache_dir = os.fspath(cache or hf_cache_dir())
    base = os.path.join(cache_dir, "models--" + name.replace("/", "--"))
    snaps = os.path.join(base, "snapshots")
    if not os.path.isdir(snaps):
        return None
    from .hub import load_record, record_path, weights_missing  # a cache holds it: its records
    from .repoid import COMMIT

    def usable(snap: str) -> bool:
        if not os.path.isfile(os.path.join(snap, "config.json")):
            return False
        record = load_record(cache_dir, name, os.path.basename(snap))
        if record is None:  # none kept (downloaded by vLLM or huggingface_hub), or one not trusted
            return not os.path.lexists(record_path(cache_dir, name, os.path.basename(snap)))
        return not weights_missing(snap, record)

    try:
        from ..runtime.files import read_bounded

        if revision and COMMIT.fullmatch(revision):
            ref = revision
        else:
            parts = (revision or "main").split("/")
            ref = read_bounded(os.path.join(base, "refs", *parts), 4096).decode("utf-8").strip()
        snap = os.path.join(snaps, os.path.basename(ref))  # a commit hash, never a path out of the cache
        if usable(snap):
            return snap
    except (OSError, ValueError):  # unreadable, or not UTF-8
        pass
    if revision:
        return None  # a named revision is that snapshot or none
    try:
        candidates = [e for e in os.scandir(snaps) if usable(e.path)]
    except OSError:
        return None
    return max(candidates, key=lambda e: e.stat().st_mtime).path if candidates else None


CATALOG_DIR = os.path.join(os.path.dirname(os.path.dirname(__file__)), "data")


def _catalog_config(entry: dict[str, Any]) -> dict[str, Any]:
    """A catalog entry's config.json: inline (``config``), or a whole shipped copy
    (``config_file``, under ``hwprofile/data/``: a model whose config is too large to transcribe)."""
    if "config_file" in entry:
        return _read_json(os.path.join(CATALOG_DIR, entry["config_file"]), MAX_CONFIG_BYTES, "catalog config")
    return entry["config"]


@lru_cache(maxsize=1)
def _catalog() -> dict[str, dict[str, Any]]:
    """Every catalog model by lower-cased name. A quantized checkpoint listed with its own
    ``config_file`` is a catalog model too: planned from its own quantization config, not estimated."""
    from ..config.yamlsrc import load_file

    data = load_file(os.path.join(CATALOG_DIR, "models.yaml"))[0]
    out = {m["name"].lower(): m for m in data["models"]}
    for m in data["models"]:
        for q in m.get("quantized") or ():
            if "config_file" in q:
                out[q["name"].lower()] = {
                    "name": q["name"],
                    "config_file": q["config_file"],
                    "variant_of": m["name"],
                }
    return out


@lru_cache(maxsize=1)
def catalog_models() -> tuple[ModelFacts, ...]:
    """Every catalog model's facts (parsed once per process)."""
    return tuple(f for f in (from_catalog(m["name"]) for m in _catalog().values()) if f is not None)


@lru_cache(maxsize=8)
def catalog_family(model_type: str | None) -> tuple[ModelFacts, ...]:
    """The catalog models of one ``model_type`` (what :func:`catalog_models` holds of that type, in
    catalog order), parsing only those: a plan's draft and smaller-model searches stay within the
    target's family, and parsing all 34 configs costs more than the rest of a plan."""
    same = (m for m in _catalog().values() if _model_type(_catalog_config(m)) == model_type)
    return tuple(f for f in (from_catalog(m["name"]) for m in same) if f is not None)


def _model_type(cfg: dict[str, Any]) -> Any:
    """``model_type`` as :func:`~.hfconfig.parse_config` reads it: the text config's, where it has one."""
    text = cfg.get("text_config")
    return text["model_type"] if isinstance(text, dict) and "model_type" in text else cfg.get("model_type")


def catalog_names() -> list[str]:
    return sorted(m["name"] for m in _catalog().values())


@lru_cache(maxsize=64)
def from_catalog(name: str) -> ModelFacts | None:
    """A catalog model's facts, parsed once per process: a plan reads its target here, then again
    within the target's family (:func:`catalog_family`, the draft search)."""
    key = name.lower()
    entry = _catalog().get(key) or next((m for k, m in _catalog().items() if k.split("/")[-1] == key), None)
    if entry is None:
        return None
    facts = parse_config(_catalog_config(entry), entry["name"], "catalog", None)
    return facts._replace(
        quantized_variants={int(q["bits"]): q["name"] for q in entry.get("quantized") or ()},
        origin="the built-in catalog (hwprofile/data/models.yaml): no Hub look-up",
    )


def variant_facts(model: ModelFacts, variant: str, bits: int) -> ModelFacts:
    """The facts of ``model``'s ``bits``-bit checkpoint ``variant``: read from its own config where the
    catalog ships it (its quantization format, what it keeps in 16 bits), else estimated as AWQ."""
    own = from_catalog(variant)
    if own is not None and own.quant_bits == bits:
        return own._replace(origin=f"{model.origin}; its {bits}-bit checkpoint from the catalog's own config")
    return model._replace(  # its grid and MXFP4 experts unknown: none assumed
        name=variant,
        quant_method="awq",
        quant_bits=bits,
        weights_bytes=model.weights_bytes_at_bits(bits),
        quant_grid=None,
        mxfp4_expert_bytes=0,
        mtp_mxfp4_expert_bytes=0,
        expert_tile=(1, 1),
    )


def resolve_model(spec: str, what: str = "model") -> ModelFacts:
    """A directory, else a Hugging Face name whose weights are in the local cache, else a catalog
    name, else the Hub (``ORG/NAME`` or ``ORG/NAME@REVISION``; a revision skips the catalog)."""
    if not spec or not spec.strip():
        raise ConfigError(
            f"--{what} {spec!r}: empty; give a model directory, a Hugging Face name or a catalog name "
            "(or leave the option out for the profile's model)"
        )
    if "\x00" in spec:  # no path or Hub name holds one (os.path refuses it with a bare ValueError)
        raise ConfigError(
            f"--{what} {spec!r}: a NUL character; give a model directory or a Hugging Face name"
        )
    p = os.path.expanduser(spec)
    if os.path.isdir(p):
        facts = read_model_dir(p, name=spec)
        return facts._replace(origin=f"the local directory {os.path.abspath(p)}")
    looks_like_path = spec.startswith(("/", "./", "../", "~")) or os.path.exists(p)
    if looks_like_path:
        raise ConfigError(f"{what} {spec}: no such model directory")
    from . import repoid

    name, revision = (
        repoid.split_revision(spec) if repoid.is_repo_id(spec.partition("@")[0]) else (spec, None)
    )
    snap = find_in_hf_cache(name, revision=revision)
    if snap is not None:
        facts = read_model_dir(snap, name=name, source="hf-cache")
        commit = os.path.basename(snap)
        return facts._replace(
            revision=commit if repoid.COMMIT.fullmatch(commit) else None,
            origin=f"the Hugging Face cache: {snap} (downloaded; commit {commit})",
        )
    listed = from_catalog(spec) if revision is None else None
    if listed is not None:
        return listed
    if repoid.is_repo_id(name):
        from . import hub

        return hub.resolve_hub(name, revision, hf_cache_dir(), what)
    from ..config.schema import suggest

    raise ConfigError(
        f"{what} '{spec}': not a local directory, not in the Hugging Face cache ({hf_cache_dir()}), "
        f"not in the built-in catalog{suggest(spec, catalog_names())}, and not a Hub name (ORG/NAME). "
        f"Give a model directory, a Hub name, or one of: {', '.join(catalog_names())}"
    )
