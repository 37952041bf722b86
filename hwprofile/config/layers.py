"""Override layers, merged lowest first, each value remembering the layer, file and line it came from.

Lowest to highest: built-in profile (and its parents) < ``<config root>/profiles/`` (shadows a
built-in of the same name) < ``<config root>/overrides.d/*.yaml`` (sorted) < ``--overrides FILE``
< ``HWPROFILE_<SECTION>__<KEY>`` environment variables < ``--set key=value``.

Merging: mappings merge key by key, scalars and lists replace. A section holding ``_replace: true``
replaces the lower layers' section instead of merging; ``_drop: [key, ...]`` removes keys set below.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING, NamedTuple

from . import ConfigError, Source
from .schema import SETTINGS, plain_text, resolve_key, suggest, validate
from .yamlsrc import load_file, safe_load, source_of, yaml_files

if TYPE_CHECKING:
    from typing import Any

DEFAULT_CONFIG_ROOT = "/etc/hwprofile"
Path_ = tuple[str, ...]


class Layer(NamedTuple):
    data: dict[str, Any]  # validated settings tree
    where: Callable[[Path_], Source]


def config_root(flag: str | None = None) -> str:
    """``--config-root`` (which must be a directory: a typo would otherwise drop every site file
    without a word), else ``HWPROFILE_CONFIG_ROOT``, else ``/etc/hwprofile`` (both may be absent)."""
    if flag:
        if not os.path.isdir(flag):
            what = "not a directory" if os.path.exists(flag) else "no such directory"
            raise ConfigError(f"--config-root {flag}: {what}")
        return flag
    env = os.environ.get("HWPROFILE_CONFIG_ROOT")
    if env and os.path.lexists(env) and not os.path.isdir(env):
        import stat

        mode = os.stat(env).st_mode if os.path.exists(env) else 0
        kind = "a FIFO" if stat.S_ISFIFO(mode) else "a file" if stat.S_ISREG(mode) else "not a directory"
        raise ConfigError(
            f"HWPROFILE_CONFIG_ROOT={env}: {kind}, not the site configuration directory "
            "(profiles/, overrides.d/, rules.d/): point it at a directory, or unset it"
        )
    return env or DEFAULT_CONFIG_ROOT


def file_layer(path: str | os.PathLike[str], kind: str) -> Layer:
    data, locs = load_file(path)
    where = lambda p, f=str(path), loc=locs: source_of(kind, f, loc, p)  # noqa: E731
    return Layer(validate(data, where), where)


def overrides_d(root: str | os.PathLike[str]) -> list[Layer]:
    files = yaml_files(os.path.join(root, "overrides.d"), "overrides")
    return [file_layer(p, "overrides.d") for p in files]


def _scalar(text: str) -> object:
    try:
        return safe_load(text) if text.strip() else None
    except ConfigError:
        return text


def _tree(path: Path_, value: object) -> dict[str, Any]:
    out: Any = value
    for part in reversed(path):
        out = {part: out}
    return out


def env_layer(environ: Mapping[str, str]) -> Layer | None:
    """``HWPROFILE_ENGINE__MAX_MODEL_LEN=4096`` → engine.max_model_len; ``HWPROFILE_MODEL``,
    ``HWPROFILE_PROFILE`` for the top-level ones. Other ``HWPROFILE_*`` names are not settings."""
    data: dict[str, Any] = {}
    names: dict[Path_, str] = {}
    problems: list[str] = []
    top = {p[0].upper(): p for p in SETTINGS if len(p) == 1}
    for name, raw in sorted(environ.items()):
        if not name.startswith("HWPROFILE_"):
            continue
        rest = name[len("HWPROFILE_") :]
        if "__" in rest:
            path = tuple(p.lower() for p in rest.split("__"))
            if path not in SETTINGS:
                valid = ["HWPROFILE_" + "__".join(p).upper() for p in SETTINGS if len(p) == 2]
                problems.append(f"environment {name}: unknown setting{suggest(name, valid)}")
                continue
        elif rest in top:
            path = top[rest]
        else:
            continue
        try:
            plain_text(raw)  # before YAML folds a line break into a space
        except ValueError as e:
            problems.append(f"environment {name}: {e}")
            continue
        names[path] = name
        _merge_into(data, _tree(path, _scalar(raw)))
    if problems:
        raise ConfigError(problems)
    if not data:
        return None
    where = _nearest("env", names, None)
    return Layer(validate(data, where), where)


def cli_layer(assignments: Iterable[str]) -> Layer | None:
    """``--set engine.max_model_len=4096`` (or a unique leaf: ``--set max_model_len=4096``)."""
    data: dict[str, Any] = {}
    texts: dict[Path_, str] = {}
    problems: list[str] = []
    for a in assignments:
        key, sep, value = a.partition("=")
        if not sep or not key.strip():
            why = "no '='" if not sep else "no setting's name before '='"
            problems.append(
                f"--set {a}: {why}: the syntax is --set KEY=VALUE, e.g. --set engine.max_model_len=4096"
            )
            continue
        try:
            path = resolve_key(key)
        except ValueError as e:
            problems.append(f"--set {a}: {e}")
            continue
        try:
            plain_text(value)  # before YAML folds a line break into a space
        except ValueError as e:
            problems.append(f"--set {key}: {e}")
            continue
        texts[path] = f"--set {a}"
        _merge_into(data, _tree(path, _scalar(value)))
    if problems:
        raise ConfigError(problems)
    if not data:
        return None
    where = _nearest("cli", texts, "--set")
    return Layer(validate(data, where), where)


class Overrides(NamedTuple):
    """Settings laid over every user layer by hwprofile itself, typed (no ``--set`` text nobody typed):
    ``kind``, their provenance kind (``degrade``: the daemon's degrade step; ``k-advice``); ``label``, what
    they are and why (``step 1 (GPU 3 hot: 88 °C >= hot 82 °C)``), so that a value's source reads
    ``degrade step 1 (GPU 3 ...)``; ``values``: (setting path, value), as the schema types them."""

    kind: str
    label: str
    values: tuple[tuple[Path_, object], ...]


def overrides_layer(o: Overrides) -> Layer | None:
    """The layer of typed ``Overrides``, every value's Source ``Source(o.kind, o.label)``; None when empty."""
    data: dict[str, Any] = {}
    for path, value in o.values:
        _merge_into(data, _tree(path, value))
    if not data:
        return None
    src = Source(o.kind, o.label)
    where = lambda _p: src  # noqa: E731
    return Layer(validate(data, where), where)


def _nearest(kind: str, labels: dict[Path_, str], default: str | None) -> Callable[[Path_], Source]:
    """The Source of a setting path: the label of the path or of its nearest enclosing one."""

    def where(p: Path_) -> Source:
        for n in range(len(p), 0, -1):
            if p[:n] in labels:
                return Source(kind, labels[p[:n]])
        return Source(kind, default)

    return where


def _merge_into(base: dict[str, Any], over: dict[str, Any]) -> None:
    for k, v in over.items():
        if isinstance(v, dict) and isinstance(base.get(k), dict):
            _merge_into(base[k], v)
        else:
            base[k] = v


def merge(layers: Iterable[Layer]) -> tuple[dict[str, Any], dict[Path_, Source]]:
    """Merge layers lowest first; return the settings and each leaf's Source."""
    out: dict[str, Any] = {}
    prov: dict[Path_, Source] = {}
    for layer in layers:
        _merge_layer(out, layer.data, (), prov, layer.where)
    return out, prov


def _merge_layer(
    base: dict[str, Any],
    over: dict[str, Any],
    prefix: Path_,
    prov: dict[Path_, Source],
    where: Callable[[Path_], Source],
) -> None:
    if over.get("_replace") is True:  # validated: a real boolean
        for k in list(base):
            _forget(prov, (*prefix, k))
        base.clear()
    for k in over.get("_drop") or ():  # validated: a list of the section's keys
        base.pop(k, None)
        _forget(prov, (*prefix, k))
    for k, v in over.items():
        if k in ("_replace", "_drop"):
            continue
        path = (*prefix, k)
        if isinstance(v, dict):
            if not isinstance(base.get(k), dict):
                base[k] = {}
            _merge_layer(base[k], v, path, prov, where)
        else:
            base[k] = v
            _forget(prov, path)
            prov[path] = where(path)


def _forget(prov: dict[Path_, Source], path: Path_) -> None:
    for p in [p for p in prov if p[: len(path)] == path]:
        del prov[p]
