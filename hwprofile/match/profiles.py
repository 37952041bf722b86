"""Profiles are YAML data. Built-in ones ship in the package (``hwprofile.profiles``); a file of the
same name under ``<config root>/profiles/`` shadows a built-in. ``extends:`` names a parent;
inheritance resolves to a list of layers, ancestors first."""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping
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


def _read_profile(name: str, path: str, kind: str) -> ProfileFile:
    """The profile file ``path``, validated (problems reported early, with lines)."""
    data, locs = load_file(path)
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(f"{path}:1: a profile must be a mapping, got {type(data).__name__}")
    pf = ProfileFile(name, path, kind, data, locs)
    validate(data, pf.where, allowed_top=PROFILE_ONLY)  # report problems early, with lines
    return pf


def _profile_paths(directory: str) -> dict[str, str]:
    """The profile files of ``directory`` by name, sorted (``rules.yaml`` is not a profile)."""
    paths = {os.path.basename(p)[: -len(".yaml")]: p for p in yaml_files(directory, "profile")}
    paths.pop("rules", None)
    return paths


class Profiles(Mapping[str, ProfileFile]):
    """Every profile by name (the built-ins in file order, then the site's own);
    ``<root>/profiles/NAME.yaml`` shadows the built-in NAME. The site's files are read and validated
    at once (a broken or hostile one is an error whichever profile is asked for); a built-in (shipped
    with the package, each validated by the tests) is read the first time it is asked for, so a plan
    reads its profile chain, not all of them."""

    def __init__(self, site: dict[str, ProfileFile], builtin: dict[str, str]) -> None:
        self._site = site
        self._builtin = {n: p for n, p in builtin.items() if n not in site}
        self._read: dict[str, ProfileFile] = {}
        self._names = [*builtin, *(n for n in site if n not in builtin)]

    def __getitem__(self, name: str) -> ProfileFile:
        if name in self._site:
            return self._site[name]
        if name not in self._read:
            self._read[name] = _read_profile(name, self._builtin[name], "builtin")
        return self._read[name]

    def __contains__(self, name: object) -> bool:
        return name in self._site or name in self._builtin

    def __iter__(self) -> Iterator[str]:
        return iter(self._names)

    def __len__(self) -> int:
        return len(self._names)


def site_and_builtin(root: str | os.PathLike[str] | None) -> Profiles:
    """Every profile by name, a built-in read only when asked for (:class:`Profiles`)."""
    site: dict[str, ProfileFile] = {}
    if root is not None:
        for name, path in _profile_paths(os.path.join(root, "profiles")).items():
            site[name] = _read_profile(name, path, "etc-profile")
    return Profiles(site, _profile_paths(builtin_dir()))


def load_profiles(root: str | os.PathLike[str] | None) -> dict[str, ProfileFile]:
    """Every profile by name, each read and validated; ``<root>/profiles/NAME.yaml`` shadows the
    built-in NAME."""
    found: dict[str, ProfileFile] = {}
    dirs = [(builtin_dir(), "builtin")]
    if root is not None:
        dirs.append((os.path.join(root, "profiles"), "etc-profile"))
    for d, kind in dirs:
        for name, path in _profile_paths(d).items():
            found[name] = _read_profile(name, path, kind)
    return found


def resolve(name: str, profiles: Mapping[str, ProfileFile], asked_at: str = "--profile") -> list[ProfileFile]:
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
