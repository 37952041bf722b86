"""The reference prompts of ``hwprofile verify``: the shipped set (``hwprofile/data/verify_prompts.yaml``,
50 prompts: Chinese, English, code, math, nested JSON output) or a user's file of the same shape.

The file is read through the project's safe YAML loader (:mod:`hwprofile.config.yamlsrc`: regular
files only, size cap, no anchors, aliases, merge keys or duplicate keys); every problem is a
:class:`~hwprofile.config.ConfigError` naming the file and line."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, NamedTuple

from ..config import ConfigError

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping

KINDS = ("zh", "en", "code", "math", "json")
SCHEMA = "hwprofile.verify-prompts/1"
SHIPPED = os.path.join(os.path.dirname(os.path.dirname(__file__)), "data", "verify_prompts.yaml")
MAX_PROMPTS = 10_000
_KEYS = ("id", "kind", "text")


class Prompt(NamedTuple):
    id: str
    kind: str
    text: str
    line: int | None = None  # where the prompt is written in its file


class PromptSet(NamedTuple):
    source: str  # the file read
    prompts: tuple[Prompt, ...]


def load_prompts(path: str | os.PathLike[str] | None = None) -> PromptSet:
    """The prompts of ``path`` (the shipped set when None), validated: a mapping with a ``prompts``
    list (and optionally ``schema: hwprofile.verify-prompts/1``), each item a mapping of exactly
    ``id`` (unique, non-empty), ``kind`` (one of :data:`KINDS`) and ``text`` (non-empty)."""
    from ..config.yamlsrc import load_file

    name = os.fspath(path) if path is not None else SHIPPED
    data, locs = load_file(name)
    return PromptSet(name, tuple(parse_prompts(data, locs, name)))


def parse_prompts(data: object, locs: dict[tuple[str, ...], int], name: str) -> list[Prompt]:
    """Validate loaded YAML (``data`` with its key-path → line map) into prompts; every problem found
    is reported at once, each with ``name:line``."""
    at = _locator(locs, name)
    if not isinstance(data, dict):
        raise ConfigError(f"{name}:1: expected a mapping with a `prompts:` list, found {_what(data)}")
    problems = _file_problems(data, at)
    items = data.get("prompts")
    if not isinstance(items, list) or not items:
        problems.append(
            f"{at('prompts')}: `prompts` must be a non-empty list of {{id, kind, text}}, found {_what(items)}"
        )
        raise ConfigError(problems)
    if len(items) > MAX_PROMPTS:
        raise ConfigError(f"{at('prompts')}: {len(items)} prompts; at most {MAX_PROMPTS} are read")
    out: list[Prompt] = []
    seen: dict[str, str] = {}
    for i, item in enumerate(items):
        where = at("prompts", str(i))
        if not isinstance(item, dict):
            problems.append(f"{where}: a prompt must be a mapping of id, kind, text; found {_what(item)}")
            continue
        found = _key_problems(i, item, at)
        if not found:
            found = _value_problems(i, item, at, seen)
        problems += found
        if not found:
            out.append(Prompt(item["id"], item["kind"], item["text"], locs.get(("prompts", str(i)))))
    if problems:
        raise ConfigError(problems)
    return out


def _locator(locs: dict[tuple[str, ...], int], name: str) -> Callable[..., str]:
    """``name:line`` of a key path: the line of its longest prefix the file has, else line 1."""

    def at(*path: str) -> str:
        for n in range(len(path), 0, -1):
            if path[:n] in locs:
                return f"{name}:{locs[path[:n]]}"
        return f"{name}:1"

    return at


def _file_problems(data: Mapping[object, object], at: Callable[..., str]) -> list[str]:
    """Unknown top-level keys and a schema this hwprofile does not read."""
    problems: list[str] = []
    for key in data:
        if key not in ("schema", "prompts"):
            problems.append(f"{at(str(key))}: unknown key {key!r}; a prompts file has `schema` and `prompts`")
    if "schema" in data and data["schema"] != SCHEMA:
        problems.append(f"{at('schema')}: schema {data['schema']!r}; this hwprofile reads {SCHEMA!r}")
    return problems


def _key_problems(i: int, item: Mapping[object, object], at: Callable[..., str]) -> list[str]:
    """Prompt ``i``'s unknown keys, then the keys it lacks."""
    where = at("prompts", str(i))
    problems: list[str] = []
    for key in item:
        if key not in _KEYS:
            problems.append(
                f"{at('prompts', str(i), str(key))}: unknown key {key!r}; a prompt has id, kind, text"
            )
    for key in _KEYS:
        if key not in item:
            problems.append(f"{where}: prompt {i + 1} has no {key!r}")
    return problems


def _value_problems(
    i: int, item: Mapping[object, object], at: Callable[..., str], seen: dict[str, str]
) -> list[str]:
    """Prompt ``i``'s id (non-empty, unique: ``seen`` maps each id to where it was first), kind and
    text; a new id is added to ``seen``."""
    pid, kind, text = item["id"], item["kind"], item["text"]
    problems: list[str] = []
    if not isinstance(pid, str) or not pid.strip():
        problems.append(f"{at('prompts', str(i), 'id')}: id must be a non-empty string, found {_what(pid)}")
    elif pid in seen:
        problems.append(f"{at('prompts', str(i), 'id')}: duplicate id {pid!r} (first at {seen[pid]})")
    else:
        seen[pid] = at("prompts", str(i), "id")
    if kind not in KINDS:
        problems.append(f"{at('prompts', str(i), 'kind')}: kind {kind!r} is not one of {', '.join(KINDS)}")
    if not isinstance(text, str) or not text.strip():
        problems.append(
            f"{at('prompts', str(i), 'text')}: text must be a non-empty string, found {_what(text)}"
        )
    return problems


def _what(v: object) -> str:
    if v is None:
        return "nothing"
    if isinstance(v, str):
        return f"the string {v[:40]!r}"
    if isinstance(v, (bool, int, float)):
        return repr(v)
    return f"a {type(v).__name__}"
