"""``Record``: ``typing.NamedTuple`` for type checkers, without importing ``typing`` at run time.

The snapshot and its records sit on the start-up path of every command (``hwprofile detect`` has a
100 ms budget). ``import typing`` alone costs 5-15 ms on small VMs, and the records are its only use
there. A type checker sees ``typing.NamedTuple`` (the ``TYPE_CHECKING`` branch); at run time a small
metaclass builds the same thing from the class body: ``collections.namedtuple`` with the annotated
fields, their defaults, and the methods and properties of the body, exactly as ``typing`` does.
"""

from __future__ import annotations

import collections

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing
if TYPE_CHECKING:
    from typing import NamedTuple as Record
else:
    _KEEP_OUT = frozenset(
        {"__annotations__", "__module__", "__qualname__", "__dict__", "__weakref__", "__slots__", "__doc__"}
    )

    class _RecordMeta(type):
        def __new__(mcls, name: str, bases: tuple[type, ...], ns: dict[str, object]) -> type:
            if not bases:  # Record itself
                return super().__new__(mcls, name, bases, ns)
            annotations = ns.get("__annotations__", {})
            fields = tuple(annotations)
            defaults = []
            for f in fields:
                if f in ns:
                    defaults.append(ns[f])
                elif defaults:
                    raise TypeError(f"{name}: field {f!r} without a default follows a field with one")
            cls = collections.namedtuple(name, fields, defaults=defaults, module=ns.get("__module__"))
            cls.__annotations__ = dict(annotations)
            if ns.get("__doc__"):
                cls.__doc__ = ns["__doc__"]
            for key, value in ns.items():
                if key in fields or key in _KEEP_OUT:
                    continue
                if key in cls._fields or key.startswith("_make") or key in ("_replace", "_asdict"):
                    raise AttributeError(f"{name}: cannot overwrite NamedTuple attribute {key}")
                setattr(cls, key, value)
            cls.__qualname__ = ns.get("__qualname__", name)
            return cls

    class Record(metaclass=_RecordMeta):
        """Base of immutable records: ``class Point(Record): x: int; y: int = 0``."""


__all__ = ["Record"]
