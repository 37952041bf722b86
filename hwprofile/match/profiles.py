"""Profiles are YAML data. Built-in ones ship in the package (``hwprofile.profiles``); a file of the
same name under ``<config root>/profiles/`` shadows a built-in. ``extends:`` names a parent;
inheritance resolves to a list of layers, ancestors first."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, NamedTuple

from ..config import ConfigError, Source
from ..config.layers import Layer
from ..config.schema import PROFILE_ONLY, suggest, validate
from ..config.yamlsrc import Locations, load_file, source_of, yaml_files

if TYPE_CHECKING:
    from typing import Any


class ProfileFile(NamedTuple):
    name: str
    path: str
    kind: str  # builtin or etc-profile
    raw: dict[str, Any]
    locs: Locations

    def where(self, path: tuple[str, ...]) -> Source:
        return source_of(self.kind, self.path, self.locs, path)

    @property
    def description(self) -> str:
        return str(self.raw.get("description") or "")

    @property
    def parent(self) -> str | None:
        p = self.raw.get("extends")
        return str(p) if p else None


def builtin_dir() -> str:
    """The built-in profiles: inside the installed package, or the repository's ``profiles/``."""
    package = os.path.dirname(os.path.dirname(os.path.realpath(__file__)))  # the hwprofile package
    shipped = os.path.join(package, "profiles")
    return shipped if os.path.isdir(shipped) else os.path.join(os.path.dirname(package), "profiles")


def profile_names(root: str | os.PathLike[str] | None) -> set[str]:
    """The name of every profile, built-in or under ``<root>/profiles/``, without reading one."""
    dirs = [builtin_dir()] + ([os.path.join(root, "profiles")] if root is not None else [])
    return {os.path.basename(p)[: -len(".yaml")] for d in dirs for p in yaml_files(d, "profile")} - {"rules"}


def load_profiles(root: str | os.PathLike[str] | None) -> dict[str, ProfileFile]:
    """Every profile by name; ``<root>/profiles/NAME.yaml`` shadows the built-in NAME."""
    found: dict[str, ProfileFile] = {}
    dirs = [(builtin_dir(), "builtin")]
    if root is not None:
        dirs.append((os.path.join(root, "profiles"), "etc-profile"))
    for d, kind in dirs:
        for path in yaml_files(d, "profile"):
            name = os.path.basename(path)[: -len(".yaml")]
            if name == "rules":
                continue
            data, locs = load_file(path)
            if data is None:
                data = {}
            if not isinstance(data, dict):
                raise ConfigError(f"{path}:1: a profile must be a mapping, got {type(data).__name__}")
            pf = ProfileFile(name, path, kind, data, locs)
            validate(data, pf.where, allowed_top=PROFILE_ONLY)  # report problems early, with lines
            found[name] = pf
    return found


def resolve(name: str, profiles: dict[str, ProfileFile], asked_at: str = "--profile") -> list[ProfileFile]:
    """The chain ``[root ancestor, ..., name]``; unknown parents and cycles are errors."""
    if name not in profiles:
        raise ConfigError(
            f"{asked_at}: unknown profile '{name}'{suggest(name, list(profiles))}; "
            f"available: {', '.join(sorted(profiles))}"
        )
    chain: list[ProfileFile] = []
    seen: list[str] = []
    cur: str | None = name
    while cur is not None:
        if cur in seen:
            cycle = " -> ".join([*seen[seen.index(cur) :], cur])
            pf = profiles[seen[-1]]
            raise ConfigError(f"{_loc(pf, ('extends',))}: profile inheritance cycle: {cycle}")
        seen.append(cur)
        pf = profiles[cur]
        chain.append(pf)
        parent = pf.parent
        if parent is not None and parent not in profiles:
            raise ConfigError(
                f"{_loc(pf, ('extends',))}: unknown parent profile '{parent}'{suggest(parent, list(profiles))}; "
                f"available: {', '.join(sorted(profiles))}"
            )
        cur = parent
    return list(reversed(chain))


def layers(chain: list[ProfileFile]) -> list[Layer]:
    out = []
    for pf in chain:
        data = {k: v for k, v in pf.raw.items() if k not in ("description", "extends")}
        out.append(Layer(validate(data, pf.where), pf.where))
    return out


def _loc(pf: ProfileFile, path: tuple[str, ...]) -> str:
    s = pf.where(path)
    return f"{s.file}:{s.line}" if s.line else str(s.file)
