"""Records with shared methods: :func:`record` declares a frozen dataclass whose ``__init__``,
immutability, equality, hash and repr are the functions below, shared by every record, rather than
six methods generated (``exec``'d) per class when it is defined; :func:`state` a mutable one (a
plain ``@dataclass``: ``__init__``, equality and repr shared, no hash).

``plan`` imports every plan type and the predictor's inputs at start-up, and those generated methods
were most of that import's cost (~0.6 ms a class on the shared 2-core machine; ~0.1 ms here). Here,
below ``release/`` and ``config/``, so that the release facts, the settings and the pipeline's inputs
are records too (every plan builds them). What a
frozen dataclass offers stays: ``dataclasses.fields`` and ``replace``, keyword or positional
construction with the declared defaults, ``__post_init__``, equality and hash by the fields' values
(in field order), ``FrozenInstanceError`` on assignment, the same repr, ``field(default_factory=...)``.
Not supported, refused when the class is declared (use ``dataclasses.dataclass``): ``init=False``
fields, fields left out of the repr or the comparison or with their own hash, keyword-only fields,
``InitVar``.
"""

from __future__ import annotations

import dataclasses
from operator import attrgetter
from typing import Any, TypeVar, dataclass_transform

T = TypeVar("T")


def _init(self: Any, *args: Any, **kwargs: Any) -> None:
    cls = type(self)
    names: tuple[str, ...] = cls.__record_names__
    given = len(args)
    if given > len(names):
        raise TypeError(f"{cls.__name__}() takes {len(names)} positional arguments but {given} were given")
    if kwargs:
        for key in names[:given]:
            if key in kwargs:
                raise TypeError(f"{cls.__name__}() got multiple values for argument {key!r}")
    # The instance's own dict, written directly (what object.__setattr__ does for a field, without a
    # call per field), in field order.
    values = self.__dict__
    values.update(zip(names, args, strict=False))
    defaults: dict[str, Any] = cls.__record_defaults__
    left = len(kwargs)
    for key in names[given:]:
        if key in kwargs:
            values[key] = kwargs[key]
            left -= 1
        elif key in defaults:
            values[key] = defaults[key]
        elif key in cls.__record_factories__:
            values[key] = cls.__record_factories__[key]()
        else:
            raise TypeError(f"{cls.__name__}() missing required argument: {key!r}")
    if left:
        unknown = sorted(set(kwargs) - set(names[given:]))
        raise TypeError(f"{cls.__name__}() got an unexpected keyword argument {unknown[0]!r}")
    if cls.__record_post_init__:
        self.__post_init__()


def _setattr(self: Any, name: str, value: Any) -> None:
    raise dataclasses.FrozenInstanceError(f"cannot assign to field {name!r}")


def _delattr(self: Any, name: str) -> None:
    raise dataclasses.FrozenInstanceError(f"cannot delete field {name!r}")


def _eq(self: Any, other: Any) -> bool:
    if other.__class__ is not self.__class__:
        return NotImplemented
    values = self.__record_values__
    return bool(values(self) == values(other))  # the same class: the same fields


def _hash(self: Any) -> int:
    return hash(self.__record_values__(self))


def _repr(self: Any) -> str:
    inner = ", ".join(f"{key}={getattr(self, key)!r}" for key in self.__record_names__)
    return f"{type(self).__qualname__}({inner})"


def _values_of(names: tuple[str, ...]) -> Any:
    """The fields' values as a tuple, read by one C call (a record of one field: still a tuple)."""
    if len(names) == 1:
        one = attrgetter(names[0])
        return lambda obj: (one(obj),)
    if not names:
        return lambda obj: ()
    return attrgetter(*names)


@dataclass_transform(frozen_default=True, field_specifiers=(dataclasses.field,))
def record(cls: type[T]) -> type[T]:
    """Declare ``cls`` a frozen record (see the module's docstring); a method the class defines
    itself (``__repr__``, ``__eq__``, ...) is kept, as ``dataclass`` keeps it."""
    return _declare(cls, frozen=True)


@dataclass_transform(field_specifiers=(dataclasses.field,))
def state(cls: type[T]) -> type[T]:
    """Declare ``cls`` a mutable record: what ``@dataclass`` makes of it (equality by the fields'
    values, unhashable), with :func:`record`'s shared ``__init__``, equality and repr."""
    return _declare(cls, frozen=False)


def _declare(cls: type[T], frozen: bool) -> type[T]:
    # A class without a docstring gets ``Name(field, ...)`` (below): left without one, dataclasses
    # would ask inspect for the signature of an ``__init__`` it did not write (``Name()``, through
    # inspect's tokenizer: ~2 ms at the first record of a start).
    documented = bool(cls.__dict__.get("__doc__"))
    if not documented:
        cls.__doc__ = cls.__name__
    made: Any = dataclasses.dataclass(init=False, repr=False, eq=False)(cls)  # the same class, in place
    fields = dataclasses.fields(made)
    names = tuple(f.name for f in fields)
    for f in fields:
        if not (f.init and f.repr and f.compare) or f.hash is not None or f.kw_only is True:
            raise TypeError(
                f"{made.__name__}.{f.name}: a record's fields are all in init, repr and comparison, "
                "positional or keyword"
            )
    for name, f in made.__dataclass_fields__.items():
        if name not in names and "InitVar" in str(f.type):
            raise TypeError(f"{made.__name__}.{name}: a record has no InitVar")
    # What dataclasses itself reads of the class (a subclass's frozen check, for one) says what the
    # class is: frozen or not, compared by value.
    made.__dataclass_params__.frozen = frozen
    made.__dataclass_params__.eq = True
    made.__record_names__ = names
    if not documented:
        made.__doc__ = f"{made.__name__}({', '.join(names)})"
    made.__record_defaults__ = {f.name: f.default for f in fields if f.default is not dataclasses.MISSING}
    made.__record_factories__ = {
        f.name: f.default_factory for f in fields if f.default_factory is not dataclasses.MISSING
    }
    made.__record_values__ = staticmethod(_values_of(names))
    made.__record_post_init__ = hasattr(made, "__post_init__")
    shared: dict[str, Any] = {"__init__": _init, "__eq__": _eq, "__repr__": _repr}
    if frozen:
        shared.update({"__setattr__": _setattr, "__delattr__": _delattr, "__hash__": _hash})
    else:
        shared["__hash__"] = None  # as @dataclass: mutable, compared by value, so unhashable
    for name, fn in shared.items():
        if name not in made.__dict__ or (name == "__hash__" and made.__dict__[name] is None):
            setattr(made, name, fn)
    return cls
