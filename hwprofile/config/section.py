"""How a setting is declared: :func:`setting` makes a dataclass field that carries the setting's
:class:`~.fields.Field` (kind, documentation, range, choices, its one default); a :class:`Section`
is a frozen dataclass of such fields, read from and written to JSON with every value checked.
The sections themselves are declared in :mod:`.plan_sections` and :mod:`.run_sections`."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import Field as DataclassField
from dataclasses import FrozenInstanceError, dataclass, field, fields
from typing import Any, ClassVar, TypeVar, dataclass_transform

from .fields import Field, check

Path_ = tuple[str, ...]

_META = "hwprofile.setting"
S = TypeVar("S", bound="Section")


def setting(
    kind: str,
    doc: str,
    lo: float | None = None,
    hi: float | None = None,
    *,
    default: Any,
    choices: tuple[str, ...] = (),
    nullable: bool = False,
    pattern: str = "",
    pattern_doc: str = "",
) -> Any:
    """A dataclass field declaring one setting: ``default`` is the field's default and the setting's."""
    spec = Field(kind, doc, lo, hi, choices, nullable, default, pattern, pattern_doc)
    return field(default=default, metadata={_META: spec})


def spec_of(f: DataclassField[object]) -> Field:
    """The :class:`Field` a dataclass field declares (KeyError for a field that is no setting)."""
    return f.metadata[_META]


def is_setting(f: DataclassField[object]) -> bool:
    """Whether a dataclass field declares a setting (:func:`setting`)."""
    return _META in f.metadata


def typed(spec: Field, value: Any) -> Any:
    """A checked value in the form the typed settings hold it: lists become tuples."""
    if spec.kind == "str_list":
        return tuple(value)
    if spec.kind == "k_table" and value is not None:
        return tuple(tuple(row) for row in value)
    return value


def _plain(value: object) -> object:
    return [_plain(v) for v in value] if isinstance(value, tuple) else value


def checked(spec: Field, value: object, path: Path_) -> Any:
    """``value`` checked against ``spec`` and :func:`typed`; ValueError names the setting's ``path``."""
    try:
        return typed(spec, check(spec, value))
    except (ValueError, TypeError) as e:
        raise ValueError(f"{'.'.join(path)}: {e}") from None


@dataclass_transform(frozen_default=True, field_specifiers=(setting,))
def section(cls: type[S]) -> type[S]:
    """Declare a section: a dataclass of :func:`setting` fields, frozen. Its ``__init__`` (keywords,
    each at its declared default when not given), immutability, equality, hash and repr are
    :class:`Section`'s, shared rather than generated per class: every start imports every section,
    and the generated methods were most of that cost."""
    cls = dataclass(init=False, repr=False, eq=False)(cls)
    cls._defaults = {f.name: f.default for f in fields(cls)}
    return cls


class Section:
    """A section of settings (declared with :func:`section`); every field is a setting
    (:func:`setting`). Frozen: a changed section is a new one (``dataclasses.replace``)."""

    _defaults: ClassVar[dict[str, Any]] = {}
    # declared, not set: :func:`section` makes every subclass a dataclass, and this says so to mypy
    __dataclass_fields__: ClassVar[dict[str, DataclassField[Any]]]

    def __init__(self, **values: object) -> None:
        unknown = values.keys() - self._defaults.keys()
        if unknown:
            raise TypeError(f"{type(self).__name__}: unknown setting(s) {sorted(unknown)}")
        for name, default in self._defaults.items():
            object.__setattr__(self, name, values.get(name, default))

    def __setattr__(self, name: str, value: object) -> None:
        raise FrozenInstanceError(f"cannot assign to field {name!r}")

    def __delattr__(self, name: str) -> None:
        raise FrozenInstanceError(f"cannot delete field {name!r}")

    def _values(self) -> tuple[object, ...]:
        return tuple(getattr(self, name) for name in self._defaults)

    def __eq__(self, other: object) -> bool:
        if type(other) is not type(self):
            return NotImplemented
        return self._values() == other._values()

    def __hash__(self) -> int:
        return hash((type(self), self._values()))

    def __repr__(self) -> str:
        inner = ", ".join(f"{name}={getattr(self, name)!r}" for name in self._defaults)
        return f"{type(self).__name__}({inner})"

    @classmethod
    def specs(cls) -> dict[str, Field]:
        """The section's settings by name, in declaration order."""
        return {f.name: spec_of(f) for f in fields(cls)}

    def to_json(self) -> dict[str, Any]:
        """The section as JSON (tuples as lists), every setting in declaration order."""
        return {name: _plain(getattr(self, name)) for name in self._defaults}

    @classmethod
    def from_json(cls: type[S], doc: Mapping[str, object], name: str = "") -> S:
        """Read a section back (``to_json``'s document, or a section of a validated tree): each value
        checked against its declaration, a key left out at its default. ValueError names the
        setting."""
        if not isinstance(doc, Mapping):
            raise ValueError(f"{name or cls.__name__}: expected a mapping, got {type(doc).__name__}")
        specs = cls.specs()
        unknown = sorted(set(doc) - set(specs))
        if unknown:
            raise ValueError(f"{name or cls.__name__}: unknown setting(s) {unknown}")
        return cls(**{k: checked(specs[k], v, (name, k) if name else (k,)) for k, v in doc.items()})
