"""The settings as one typed, frozen object, built once from the merged, validated layers
(:meth:`Settings.from_tree`): a setting they leave unset takes its declared default, one they set
keeps its value (an explicit 0 stays 0 where the range allows it). Read it by attribute:
``settings.engine.max_num_seqs``.

Every setting is declared once, as a field of its section (:mod:`.plan_sections`,
:mod:`.run_sections`; how, in :mod:`.section`); :mod:`.schema` derives the table of settings and
the validation of the layers from these classes.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import field, fields
from typing import Any

from ..record import record
from . import ConfigError
from .fields import Field
from .plan_sections import Cpu, Engine, KTable, Layout, Memory, Server, Speculative
from .run_sections import Bench, Degrade, Logs, Supervise, Verify, Watch
from .section import Path_, Section, checked, is_setting, setting, spec_of

__all__ = [
    "SECTIONS",
    "TOP_LEVEL",
    "Bench",
    "Cpu",
    "Degrade",
    "Engine",
    "KTable",
    "Layout",
    "Logs",
    "Memory",
    "Section",
    "Server",
    "Settings",
    "Speculative",
    "Supervise",
    "Verify",
    "Watch",
]


@record
class Settings:
    """Every setting, typed: one attribute per section (``settings.engine.max_num_seqs``) and the
    top-level ``model`` and ``profile``. Build it with :meth:`from_tree`."""

    engine: Engine = field(default_factory=Engine)
    layout: Layout = field(default_factory=Layout)
    speculative: Speculative = field(default_factory=Speculative)
    memory: Memory = field(default_factory=Memory)
    server: Server = field(default_factory=Server)
    logs: Logs = field(default_factory=Logs)
    supervise: Supervise = field(default_factory=Supervise)
    watch: Watch = field(default_factory=Watch)
    degrade: Degrade = field(default_factory=Degrade)
    bench: Bench = field(default_factory=Bench)
    verify: Verify = field(default_factory=Verify)
    cpu: Cpu = field(default_factory=Cpu)
    model: str = setting(
        "str",
        "target model: a local directory, a Hugging Face name, or a catalog name",
        default="Qwen/Qwen3-32B",
    )
    profile: str | None = setting(
        "str", "force this profile instead of matching", nullable=True, default=None
    )

    @classmethod
    def from_tree(cls, tree: Mapping[str, Any]) -> tuple[Settings, list[Path_]]:
        """(the settings, the paths left at their default) from a merged settings tree (the layers'
        :func:`~.layers.merge`): each value checked against its declaration (the layers validated
        it already, with file and line), every setting the tree lacks at its default."""
        kw: dict[str, Any] = {}
        filled: list[Path_] = []
        try:
            for f in fields(cls):
                given = tree.get(f.name)
                section = SECTIONS.get(f.name)
                if section is None:
                    if f.name in tree:
                        kw[f.name] = checked(spec_of(f), given, (f.name,))
                    else:
                        filled.append((f.name,))
                    continue
                given = {k: v for k, v in (given or {}).items() if k not in ("_replace", "_drop")}
                kw[f.name] = section.from_json(given, f.name)
                filled += [(f.name, k) for k in section.specs() if k not in given]
        except ValueError as e:
            raise ConfigError(str(e)) from None
        return cls(**kw), filled


# Settings that must keep an order between them: (lower, upper, strict). Each value is in its own
# range (its declaration); these say what one setting's range cannot: a warm threshold above the hot
# one would make the policy skip states, a backoff that starts above its cap never grows.
RELATIONS: tuple[tuple[str, str, bool], ...] = (
    ("watch.warm_c", "watch.hot_c", True),
    ("watch.hot_c", "watch.critical_c", True),
    ("watch.critical_margin_c", "watch.hot_margin_c", True),
    ("watch.hot_margin_c", "watch.warm_margin_c", True),
    ("supervise.backoff_initial", "supervise.backoff_max", False),
)


def broken_relations(settings: Settings) -> list[tuple[str, str, str]]:
    """``(lower, upper, what)`` for every :data:`RELATIONS` pair these settings break."""
    out = []
    for lo, hi, strict in RELATIONS:
        a = getattr(getattr(settings, lo.split(".")[0]), lo.split(".")[1])
        b = getattr(getattr(settings, hi.split(".")[0]), hi.split(".")[1])
        if a > b or (strict and a == b):
            out.append((lo, hi, f"{lo} = {a:g} must be {'below' if strict else 'at most'} {hi} = {b:g}"))
    return out


SECTIONS: dict[str, type[Section]] = {
    f.name: f.default_factory  # type: ignore[misc]  # a section's field: its factory is the Section class
    for f in fields(Settings)
    if not is_setting(f)
}
"""The sections by name (``engine`` → :class:`Engine`, ...), in declaration order."""
TOP_LEVEL: dict[str, Field] = {f.name: spec_of(f) for f in fields(Settings) if is_setting(f)}
"""The settings outside any section (``model``, ``profile``)."""
