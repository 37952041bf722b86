"""Safe YAML loading that remembers the file and line of every key.

Files are parsed once: what ``load_file`` parses is kept as JSON in a cache (like Python's
``__pycache__``), so later runs neither parse YAML nor import PyYAML (30-40 ms at every start on
small VMs, a fifth of ``hwprofile plan``'s budget). An entry is used only while the file has the same
path, inode, size, mtime and ctime (ctime cannot be set back by hand), and is written only for a
file that has not changed for two seconds (a file rewritten within one timestamp tick could
otherwise keep a stale entry). Data that JSON cannot carry exactly (dates, non-string keys) is
never cached. The cache is ``$HWPROFILE_CACHE_DIR`` or ``$XDG_CACHE_HOME/hwprofile`` or
``~/.cache/hwprofile``, subfolder ``yaml``; ``HWPROFILE_CACHE_DIR=off`` disables it. Cache files are
JSON (never pickle), written atomically, 0600 in a 0700 folder; an entry another user owns or could
write is ignored (a shared cache folder cannot inject settings); any unreadable entry is a miss.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
import zlib

from .._record import TYPE_CHECKING
from . import ConfigError, Source

if TYPE_CHECKING:
    from typing import Any

    import yaml

Locations = dict[tuple[str, ...], int]  # key path (list items by index) → 1-based line

CACHE_FORMAT = 2
SETTLE_NS = 2_000_000_000  # a file must be this old (ctime) before its parse is cached


def safe_load(text: str, filename: str = "<text>") -> Any:
    """Plain data from YAML text; a syntax error is a ConfigError naming the line."""
    return load_text(text, filename)[0]


def load_text(text: str, filename: str) -> tuple[Any, Locations]:
    """Parse YAML (safe subset only) and return ``(data, key path → line)``."""
    import yaml

    # libyaml's C parser (shipped in PyYAML's wheels) is ~10x faster than the pure-Python one;
    # both are the *safe* loader: plain data only, no Python object construction.
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)(text)
    try:
        node = loader.get_single_node()
        data = loader.construct_document(node) if node is not None else None
    except yaml.MarkedYAMLError as e:
        mark = e.problem_mark or e.context_mark
        where = f"{filename}:{mark.line + 1}" if mark else filename
        raise ConfigError(f"{where}: invalid YAML: {e.problem or e.context}") from None
    except yaml.YAMLError as e:
        raise ConfigError(f"{filename}: invalid YAML: {e}") from None
    finally:
        if hasattr(loader, "dispose"):
            loader.dispose()
    locs: Locations = {}
    if node is not None:
        _walk(node, (), locs)
    return data, locs


def load_file(path: str | os.PathLike[str]) -> tuple[Any, Locations]:
    """``load_text`` of a file, through the parse cache."""
    name = os.fspath(path)
    try:
        with open(name, "rb") as f:
            st = os.fstat(f.fileno())
            stamp = [os.path.abspath(name), st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns]
            entry = _cache_entry(stamp[0])
            hit = _cache_read(entry, stamp) if entry else None
            if hit is not None:
                return hit
            raw = f.read()
    except OSError as e:
        raise ConfigError(f"{name}: cannot read: {e.strerror or e}") from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ConfigError(f"{name}: not UTF-8 text (byte {e.start})") from None
    data, locs = load_text(text, name)
    if entry and time.time_ns() - st.st_ctime_ns > SETTLE_NS and _json_exact(data):
        _cache_write(entry, stamp, data, locs)
    return data, locs


def yaml_files(directory: str | os.PathLike[str]) -> list[str]:
    """The ``*.yaml`` files of a directory, sorted by name (hidden files skipped); ``[]`` if it
    does not exist."""
    try:
        names = os.listdir(directory)
    except (FileNotFoundError, NotADirectoryError):
        return []
    except OSError as e:
        raise ConfigError(f"{directory}: cannot list: {e.strerror or e}") from None
    return [
        os.path.join(directory, n) for n in sorted(names) if n.endswith(".yaml") and not n.startswith(".")
    ]


def _walk(node: yaml.Node, path: tuple[str, ...], locs: Locations) -> None:
    import yaml

    if isinstance(node, yaml.MappingNode):
        for key_node, value_node in node.value:
            key = str(key_node.value)
            locs[(*path, key)] = key_node.start_mark.line + 1
            _walk(value_node, (*path, key), locs)
    elif isinstance(node, yaml.SequenceNode):  # list items by index: ("rules", "3")
        for i, item in enumerate(node.value):
            locs[(*path, str(i))] = item.start_mark.line + 1
            _walk(item, (*path, str(i)), locs)


def source_of(kind: str, filename: str, locs: Locations, path: tuple[str, ...]) -> Source:
    """The Source of ``path`` in a loaded file (the nearest enclosing key with a line)."""
    for n in range(len(path), 0, -1):
        line = locs.get(path[:n])
        if line is not None:
            return Source(kind, filename, line)
    return Source(kind, filename, None)


# -- the parse cache -----------------------------------------------------------------------------


def cache_root() -> str | None:
    """hwprofile's cache folder (``None`` when disabled)."""
    explicit = os.environ.get("HWPROFILE_CACHE_DIR")
    if explicit:
        return None if explicit == "off" else explicit
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "hwprofile")


def _cache_entry(abspath: str) -> str | None:
    root = cache_root()
    if root is None:
        return None
    base = os.path.basename(abspath)[:64]
    return os.path.join(root, "yaml", f"{zlib.crc32(abspath.encode()):08x}-{base}.json")


def _cache_read(entry: str, stamp: list[Any]) -> tuple[Any, Locations] | None:
    try:
        with open(entry, encoding="utf-8") as f:
            st = os.fstat(f.fileno())
            if st.st_uid != os.getuid() or st.st_mode & 0o022:
                return None  # only entries this user wrote and nobody else can change
            d = json.load(f)
        if d["format"] != CACHE_FORMAT or d["stamp"] != stamp:
            return None
        return d["data"], {tuple(k): line for k, line in d["locations"]}
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _cache_write(entry: str, stamp: list[Any], data: Any, locs: Locations) -> None:
    doc = {
        "format": CACHE_FORMAT,
        "stamp": stamp,
        "data": data,
        "locations": [[list(k), v] for k, v in locs.items()],
    }
    tmp = f"{entry}.{os.getpid()}.tmp"
    try:
        os.makedirs(os.path.dirname(entry), mode=0o700, exist_ok=True)
        with open(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), "w", encoding="utf-8") as f:
            json.dump(doc, f, separators=(",", ":"))
        os.replace(tmp, entry)
    except OSError:  # a read-only or full cache folder only costs speed
        with contextlib.suppress(OSError):
            os.unlink(tmp)


def _json_exact(v: Any) -> bool:
    """True when JSON gives back exactly ``v`` (string keys, plain scalars, lists, mappings)."""
    if v is None or isinstance(v, str | bool | int):
        return True
    if isinstance(v, float):
        return v == v and v not in (float("inf"), float("-inf"))
    if isinstance(v, list):
        return all(_json_exact(x) for x in v)
    if isinstance(v, dict):
        return all(isinstance(k, str) and _json_exact(x) for k, x in v.items())
    return False
