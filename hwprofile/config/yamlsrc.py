"""Safe YAML loading that remembers the file and line of every key."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from . import ConfigError, Source

Locations = dict[tuple[str, ...], int]  # key path → 1-based line


# libyaml's C parser (shipped in PyYAML's wheels) is ~10x faster than the pure-Python one; both are
# the *safe* loader: plain data only, no Python object construction.
SafeLoader: type = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def safe_load(text: str, filename: str = "<text>") -> Any:
    """Plain data from YAML text; a syntax error is a ConfigError naming the line."""
    return load_text(text, filename)[0]


def load_text(text: str, filename: str) -> tuple[Any, Locations]:
    """Parse YAML (safe subset only) and return ``(data, key path → line)``."""
    loader = SafeLoader(text)
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


def load_file(path: str | Path) -> tuple[Any, Locations]:
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as e:
        raise ConfigError(f"{path}: cannot read: {e.strerror or e}") from None
    return load_text(text, str(path))


def _walk(node: yaml.Node, path: tuple[str, ...], locs: Locations) -> None:
    if isinstance(node, yaml.MappingNode):
        for key_node, value_node in node.value:
            key = str(key_node.value)
            locs[(*path, key)] = key_node.start_mark.line + 1
            _walk(value_node, (*path, key), locs)


def source_of(kind: str, filename: str, locs: Locations, path: tuple[str, ...]) -> Source:
    """The Source of ``path`` in a loaded file (the nearest enclosing key with a line)."""
    for n in range(len(path), 0, -1):
        line = locs.get(path[:n])
        if line is not None:
            return Source(kind, filename, line)
    return Source(kind, filename, None)
