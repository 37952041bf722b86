"""Safe YAML loading that remembers the file and line of every key.

Hostile files are refused, each with its file and line: only regular files are read (a FIFO or a
device is never opened for reading: checked before opening, and opened non-blocking so a swap in
between cannot hang), at most ``MAX_BYTES``; duplicate keys (naming both lines), anchors and aliases
(a few hundred bytes of aliases expand to billions of nodes), merge keys (``<<``) and nesting deeper
than ``MAX_DEPTH`` are errors.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

from . import ConfigError, Source

if TYPE_CHECKING:
    from typing import Any

    import yaml

Locations = dict[tuple[str, ...], int]  # key path (list items by index) → 1-based line

MAX_BYTES = 1 << 20  # a configuration file larger than this is refused (1 MiB)
MAX_DEPTH = 32  # mappings/lists nested deeper than this are refused (settings are 2 deep)
MERGE_TAG = "tag:yaml.org,2002:merge"


def safe_load(text: str, filename: str = "<text>") -> Any:
    """Plain data from YAML text; a syntax error is a ConfigError naming the line."""
    return load_text(text, filename)[0]


def load_text(text: str, filename: str) -> tuple[Any, Locations]:
    """Parse YAML (safe subset only) and return ``(data, key path → line)``. Duplicate keys,
    anchors/aliases, merge keys and too deep nesting are ConfigErrors naming the line."""
    import yaml

    # libyaml's C parser (shipped in PyYAML's wheels) is ~10x faster than the pure-Python one;
    # both are the *safe* loader: plain data only, no Python object construction.
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)(text)
    locs: Locations = {}
    try:
        node = loader.get_single_node()
        data = None
        if node is not None:
            # Checked on the node graph, before anything is built: an alias bomb never expands. Plain
            # data (maps, lists, strings, numbers, booleans, nulls) is built in the same walk.
            plain = _Plain(loader)
            data = _walk(node, (), locs, filename, set(), 0, 1, plain)
            if not plain.ok:  # another tag, or a value PyYAML refuses: its own constructor decides
                try:
                    data = loader.construct_document(node)
                except yaml.YAMLError:
                    raise
                except Exception as e:  # PyYAML's constructors: month 13, a 5000-digit integer, "!!int" alone
                    raise ConfigError(
                        f"{filename}:{_failing_line(loader, node)}: invalid YAML value: {e}"
                    ) from None
    except yaml.MarkedYAMLError as e:
        mark = e.problem_mark or e.context_mark
        where = f"{filename}:{mark.line + 1}" if mark else filename
        raise ConfigError(f"{where}: invalid YAML: {e.problem or e.context}") from None
    except yaml.YAMLError as e:
        raise ConfigError(f"{filename}: invalid YAML: {e}") from None
    except RecursionError:
        raise ConfigError(f"{filename}: invalid YAML: nested too deeply") from None
    finally:
        if hasattr(loader, "dispose"):
            loader.dispose()
    return data, locs


def load_file(path: str | os.PathLike[str]) -> tuple[Any, Locations]:
    """``load_text`` of a file, read by :func:`hwprofile.runtime.files.read_bounded`: only a regular
    file of at most ``MAX_BYTES`` (a FIFO, a device or a directory is a ConfigError, never a hang)."""
    import errno

    from ..runtime.files import UnsafeFile, read_bounded

    name = os.fspath(path)
    try:
        raw = read_bounded(name, MAX_BYTES)
    except UnsafeFile as e:
        if e.errno != errno.EFBIG:
            raise ConfigError(f"{name}: {e.strerror}; only regular files are read") from None
        size = f"{e.size} bytes" if e.size is not None else f"more than {MAX_BYTES} bytes"
        raise ConfigError(f"{name}: {size}; configuration files are limited to {MAX_BYTES} bytes") from None
    except OSError as e:
        raise ConfigError(f"{name}: cannot read: {e.strerror or e}") from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ConfigError(f"{name}: not UTF-8 text (byte {e.start})") from None
    return load_text(text, name)


def _failing_line(loader: Any, root: yaml.Node) -> int:
    """The line of the first scalar PyYAML cannot construct (its errors there carry no line)."""
    import yaml

    stack = [root]
    while stack:
        node = stack.pop()
        if isinstance(node, yaml.ScalarNode):
            try:
                loader.construct_object(node)
            except Exception:
                return node.start_mark.line + 1
        elif isinstance(node, yaml.MappingNode):
            stack.extend(n for pair in reversed(node.value) for n in reversed(pair))
        elif isinstance(node, yaml.SequenceNode):
            stack.extend(reversed(node.value))
    return root.start_mark.line + 1


def yaml_files(directory: str | os.PathLike[str], what: str = "configuration") -> list[str]:
    """The ``*.yaml`` files of a directory, sorted by name (hidden files skipped); ``[]`` if it
    does not exist. A path that is not a directory, or a ``*.yml`` file in it (which would
    otherwise be skipped without a word), is a ConfigError."""
    d = os.fspath(directory)
    try:
        names = os.listdir(d)
    except FileNotFoundError:
        return []
    except NotADirectoryError:
        raise ConfigError(f"{d}: not a directory (it should hold the {what} *.yaml files)") from None
    except OSError as e:
        raise ConfigError(f"{d}: cannot list: {e.strerror or e}") from None
    names = sorted(n for n in names if not n.startswith("."))
    yml = [n for n in names if n.endswith(".yml")]
    if yml:
        raise ConfigError(
            [
                f"{os.path.join(d, n)}: only *.yaml files are read here; rename it to {n[:-4]}.yaml"
                for n in yml
            ]
        )
    return [os.path.join(d, n) for n in names if n.endswith(".yaml")]


_CORE = "tag:yaml.org,2002:"
_MAP, _SEQ, _STR = _CORE + "map", _CORE + "seq", _CORE + "str"


class _Plain:
    """Builds the scalars of plain data as PyYAML's safe constructor does (its own methods for
    numbers and booleans); ``ok`` turns False at any other tag or a value that constructor refuses,
    and the document is then built by PyYAML's constructor instead, errors and all."""

    def __init__(self, loader: Any) -> None:
        self.ok = True
        self.scalar = {
            _STR: lambda node: node.value,
            _CORE + "null": lambda node: None,
            _CORE + "bool": loader.construct_yaml_bool,
            _CORE + "int": loader.construct_yaml_int,
            _CORE + "float": loader.construct_yaml_float,
        }

    def of(self, node: yaml.Node) -> Any:
        make = self.scalar.get(node.tag)
        if make is None or not self.ok:
            self.ok = False
            return None
        try:
            return make(node)
        except Exception:  # PyYAML's constructor raises it again, in its own words
            self.ok = False
            return None


def _walk(
    node: yaml.Node,
    path: tuple[str, ...],
    locs: Locations,
    filename: str,
    seen: set[int],
    depth: int,
    line: int,
    plain: _Plain,
) -> Any:
    """Record the line of every key and list item; refuse aliases (``line`` is where ``node`` is
    used: the key it is the value of, or the list it is an item of), duplicate keys, merge keys
    and nesting deeper than ``MAX_DEPTH``. Nothing is expanded: it runs on the node graph. Returns
    the node's plain data (meaningless once ``plain.ok`` is False)."""
    import yaml

    if id(node) in seen:  # the composer hands back the anchored node itself for every alias
        raise ConfigError(
            f"{filename}:{line}: YAML anchors and aliases (&name, *name) are not allowed in "
            "configuration files; write the value out"
        )
    seen.add(id(node))
    if depth > MAX_DEPTH:
        raise ConfigError(f"{filename}:{node.start_mark.line + 1}: nested more than {MAX_DEPTH} levels deep")
    if isinstance(node, yaml.MappingNode):
        if node.tag != _MAP:
            plain.ok = False
        first: dict[str, int] = {}
        out: dict[Any, Any] = {}
        for key_node, value_node in node.value:
            key, key_line = _key(key_node, path, first, filename, seen)
            first[key] = key_line
            locs[(*path, key)] = key_line
            value = _walk(value_node, (*path, key), locs, filename, seen, depth + 1, key_line, plain)
            if plain.ok:
                out[key if key_node.tag == _STR else plain.of(key_node)] = value
        return out
    if isinstance(node, yaml.SequenceNode):  # list items by index: ("rules", "3")
        if node.tag != _SEQ:
            plain.ok = False
        items: list[Any] = []
        for i, item in enumerate(node.value):
            locs[(*path, str(i))] = item.start_mark.line + 1
            items.append(
                _walk(item, (*path, str(i)), locs, filename, seen, depth + 1, _item_line(node, i), plain)
            )
        return items
    return plain.of(node)


def _key(
    key_node: Any, path: tuple[str, ...], first: dict[str, int], filename: str, seen: set[int]
) -> tuple[str, int]:
    """A mapping key's name and line; a merge key, an alias, a key that is no scalar or one the
    mapping has already (``first``: each key's line) is a ConfigError."""
    import yaml

    key_line = key_node.start_mark.line + 1
    if key_node.tag == MERGE_TAG:
        raise ConfigError(
            f"{filename}:{key_line}: YAML merge keys (<<) are not allowed in configuration files"
        )
    if id(key_node) in seen:
        raise ConfigError(
            f"{filename}:{key_line}: YAML anchors and aliases (&name, *name) are not allowed in "
            "configuration files; write the value out"
        )
    if not isinstance(key_node, yaml.ScalarNode):
        raise ConfigError(f"{filename}:{key_line}: a key must be a plain name, not a {key_node.id}")
    seen.add(id(key_node))
    key = str(key_node.value)
    if key in first:
        raise ConfigError(
            f"{filename}:{key_line}: duplicate key '{'.'.join((*path, key))}' (first at line "
            f"{first[key]}); each key may appear once per mapping: merge the two"
        )
    return key, key_line


def _item_line(seq: yaml.SequenceNode, i: int) -> int:
    """Where item ``i`` of a list is written (an alias's own node carries its anchor's position):
    the list's first line for the first item, else the line after the item before it."""
    if i == 0:
        return seq.start_mark.line + 1
    end = seq.value[i - 1].end_mark
    if seq.flow_style or end.column == 0:  # same line, or the item before ended at a line break
        return end.line + 1
    return end.line + 2


def source_of(kind: str, filename: str, locs: Locations, path: tuple[str, ...]) -> Source:
    """The Source of ``path`` in a loaded file (the nearest enclosing key with a line)."""
    for n in range(len(path), 0, -1):
        line = locs.get(path[:n])
        if line is not None:
            return Source(kind, filename, line)
    return Source(kind, filename, None)
