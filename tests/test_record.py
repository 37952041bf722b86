"""``hwprofile._record.Record`` must behave as ``typing.NamedTuple`` (type checkers are told it is)."""

from __future__ import annotations

from typing import NamedTuple

import pytest

from hwprofile._record import Record


class Typed(NamedTuple):
    """A point."""

    x: int
    y: int = 0
    tags: tuple[str, ...] = ()

    @property
    def norm1(self) -> int:
        return abs(self.x) + abs(self.y)

    def moved(self, dx: int) -> Typed:
        return self._replace(x=self.x + dx)


class Light(Record):
    """A point."""

    x: int
    y: int = 0
    tags: tuple[str, ...] = ()

    @property
    def norm1(self) -> int:
        return abs(self.x) + abs(self.y)

    def moved(self, dx: int) -> Light:
        return self._replace(x=self.x + dx)


@pytest.mark.parametrize("cls", [Typed, Light])
def test_same_behaviour_as_typing_namedtuple(cls: type) -> None:
    p = cls(3, tags=("a",))
    assert tuple(p) == (3, 0, ("a",))
    assert p._fields == ("x", "y", "tags")
    assert p._field_defaults == {"y": 0, "tags": ()}
    assert p._asdict() == {"x": 3, "y": 0, "tags": ("a",)}
    assert p.norm1 == 3 and p.moved(-5).norm1 == 2
    assert type(p.moved(1)) is cls
    assert repr(p) == f"{cls.__name__}(x=3, y=0, tags=('a',))"
    assert cls.__doc__ == "A point."
    assert cls.__module__ == __name__
    assert list(cls.__annotations__) == ["x", "y", "tags"]
    assert isinstance(p, tuple) and p == cls(3, 0, ("a",)) and hash(p) == hash(cls(3, 0, ("a",)))
    with pytest.raises(AttributeError):
        p.x = 1  # type: ignore[misc]
    with pytest.raises(TypeError):
        cls()  # type: ignore[call-arg]


def test_field_order_and_reserved_names_are_checked() -> None:
    with pytest.raises(TypeError, match="without a default"):

        class Bad(Record):
            a: int = 0
            b: int

    with pytest.raises(AttributeError, match="cannot overwrite"):

        class Worse(Record):
            a: int

            def _asdict(self) -> dict:  # type: ignore[override]
                return {}
