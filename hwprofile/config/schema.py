"""The table of settings (every setting's path and :class:`~.fields.Field`), derived from the typed
declarations in :mod:`.settings`, and the validation of one layer against it: a profile, an overrides
file, the environment or ``--set``. Validation names the file and line of each problem and suggests
the closest valid key.

Every setting's default is its declaration's (``Field.default``) and nothing else's: the merged layers
become :class:`~.settings.Settings` once (:meth:`~.settings.Settings.from_tree`), which fills the
settings they leave unset; code reads a setting without a fallback of its own, and an explicit 0 is
honoured where the range allows it."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from . import ConfigError, Source
from .fields import MAX_SIZE, Field, check, parse_size, plain_text, suggest
from .settings import SECTIONS as SECTION_TYPES
from .settings import TOP_LEVEL

if TYPE_CHECKING:
    from typing import Any

__all__ = [
    "MAX_SIZE",
    "MERGE_KEYS",
    "PROFILE_ONLY",
    "SECTIONS",
    "SETTINGS",
    "Field",
    "check",
    "defaults",
    "parse_size",
    "plain_text",
    "resolve_key",
    "suggest",
    "validate",
]

SETTINGS: dict[tuple[str, ...], Field] = {
    **{(name, key): spec for name, cls in SECTION_TYPES.items() for key, spec in cls.specs().items()},
    **{(name,): spec for name, spec in TOP_LEVEL.items()},
}
"""Every setting by path (``("engine", "max_num_seqs")``, ``("model",)``), in declaration order."""

SECTIONS = set(SECTION_TYPES)
PROFILE_ONLY: dict[tuple[str, ...], Field] = {
    ("description",): Field("text", "what the profile is for"),
    ("extends",): Field("str", "parent profile"),
}
MERGE_KEYS = ("_replace", "_drop")


def validate(
    data: object,
    where: Callable[[tuple[str, ...]], Source],
    allowed_top: dict[tuple[str, ...], Field] | None = None,
) -> dict[str, Any]:
    """Check a settings tree (one layer); return it with values converted. Raises ConfigError
    listing every problem, each with its file and line, and the valid choices."""
    fields = {**SETTINGS, **(allowed_top or {})}
    problems: list[str] = []
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"{_loc(where(()))}: expected a mapping of settings, got {type(data).__name__}")
    out: dict[str, Any] = {}
    for key, value in data.items():
        key = str(key)
        if key in SECTIONS:
            if value is None:
                continue
            if not isinstance(value, dict):
                problems.append(f"{_loc(where((key,)))}: '{key}' must be a mapping of settings")
                continue
            section: dict[str, object] = {}
            valid = sorted(p[1] for p in fields if len(p) == 2 and p[0] == key)
            for sub, v in value.items():
                sub = str(sub)
                path = (key, sub)
                if sub in MERGE_KEYS:
                    try:
                        section[sub] = _merge_key(sub, v, valid)
                    except ValueError as e:
                        problems.append(f"{_loc(where(path))}: {key}.{sub}: {e}")
                    continue
                f = fields.get(path)
                if f is None:
                    problems.append(
                        f"{_loc(where(path))}: unknown key '{key}.{sub}'{suggest(sub, valid)}; "
                        f"valid keys in '{key}': {', '.join(valid)}"
                    )
                    continue
                try:
                    section[sub] = check(f, v)
                except (ValueError, TypeError) as e:
                    problems.append(f"{_loc(where(path))}: {key}.{sub}: {e}")
            out[key] = section
            continue
        f = fields.get((key,))
        if f is None:
            valid = sorted({p[0] for p in fields})
            problems.append(
                f"{_loc(where((key,)))}: unknown key '{key}'{suggest(key, valid)}; valid top-level keys: {', '.join(valid)}"
            )
            continue
        try:
            out[key] = check(f, value)
        except (ValueError, TypeError) as e:
            problems.append(f"{_loc(where((key,)))}: {key}: {e}")
    if problems:
        raise ConfigError(problems)
    return out


def _merge_key(name: str, value: object, valid: list[str]) -> bool | list[str]:
    """``_replace`` must be a real boolean (``"no"`` is text, and text is true); ``_drop`` a list
    of the section's keys."""
    if name == "_replace":
        if not isinstance(value, bool):
            raise ValueError(f"expected true or false (unquoted), got {value!r}")
        return value
    items = [value] if isinstance(value, str) else value
    if not isinstance(items, list) or not all(isinstance(x, str) for x in items):
        raise ValueError(f"expected a list of keys to remove, e.g. [{valid[0]}], got {value!r}")
    unknown = [x for x in items if x not in valid]
    if unknown:
        raise ValueError(
            f"cannot drop unknown key '{unknown[0]}'{suggest(unknown[0], valid)}; valid keys: {', '.join(valid)}"
        )
    return list(items)


def defaults() -> dict[str, Any]:
    """Every setting at its declared default, as a settings tree (a fresh copy; lists for tuples)."""
    out: dict[str, Any] = {}
    for path, f in SETTINGS.items():
        node = out
        for part in path[:-1]:
            node = node.setdefault(part, {})
        node[path[-1]] = list(f.default) if isinstance(f.default, tuple) else f.default
    return out


def _loc(s: Source) -> str:
    if s.file and s.line:
        return f"{s.file}:{s.line}"
    return s.file or s.kind


def resolve_key(dotted: str) -> tuple[str, ...]:
    """``engine.max_model_len`` or a unique leaf name like ``max_model_len`` → the setting's path."""
    parts = tuple(p for p in dotted.strip().split(".") if p)
    if parts in SETTINGS:
        return parts
    if len(parts) == 1:
        leaves = [p for p in SETTINGS if p[-1] == parts[0]]
        if len(leaves) == 1:
            return leaves[0]
    valid = [".".join(p) for p in SETTINGS]
    raise ValueError(f"unknown setting '{dotted}'{suggest(dotted, valid)}")
