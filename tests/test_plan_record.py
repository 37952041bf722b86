"""plan/record.py: a record behaves as the frozen dataclass it replaces (issue 34: the plan types and the
predictor's inputs share their methods instead of generating six per class at import)."""

from __future__ import annotations

import dataclasses

import pytest

from hwprofile.plan.record import record, state


@record
class _Rec:
    a: int
    b: str = "x"
    c: tuple[int, ...] = ()


@dataclasses.dataclass(frozen=True)
class _Dc:
    a: int
    b: str = "x"
    c: tuple[int, ...] = ()


@record
class _Checked:
    n: int

    def __post_init__(self) -> None:
        if self.n < 0:
            raise ValueError("n < 0")


@record
class _One:
    only: float


def test_construction_equality_hash_and_repr_match_a_frozen_dataclass() -> None:
    for args, kw in (((1,), {}), ((1, "y"), {}), ((), {"a": 2, "c": (3,)}), ((4,), {"c": (5,), "b": "z"})):
        r, d = _Rec(*args, **kw), _Dc(*args, **kw)
        assert (r.a, r.b, r.c) == (d.a, d.b, d.c)
        assert hash(r) == hash(d)
        assert repr(r).replace("_Rec", "_Dc") == repr(d)
    assert _Rec(1) == _Rec(1, "x", ()) and _Rec(1) != _Rec(2) and _Rec(1) != _Dc(1)
    assert [f.name for f in dataclasses.fields(_Rec)] == ["a", "b", "c"]
    assert dataclasses.replace(_Rec(1), b="q") == _Rec(1, "q")
    assert _One(1.5) == _One(1.5) and hash(_One(1.5)) == hash((1.5,))


def test_frozen_and_wrong_arguments_refused() -> None:
    r = _Rec(1)
    with pytest.raises(dataclasses.FrozenInstanceError):
        r.a = 2  # type: ignore[misc]  # the point: a record is frozen
    with pytest.raises(dataclasses.FrozenInstanceError):
        del r.a  # type: ignore[misc]  # the point: a record is frozen
    with pytest.raises(TypeError, match="missing"):
        _Rec()  # type: ignore[call-arg]  # the point: a required field left out
    with pytest.raises(TypeError, match="multiple values"):
        _Rec(1, a=2)  # type: ignore[misc]  # the point: a field given twice
    with pytest.raises(TypeError, match="unexpected"):
        _Rec(1, d=3)  # type: ignore[call-arg]  # the point: no such field
    with pytest.raises(TypeError, match="positional"):
        _Rec(1, "x", (), 4)  # type: ignore[call-arg]  # the point: too many


def test_post_init_runs_and_a_factory_makes_each_default() -> None:
    assert _Checked(1).n == 1
    with pytest.raises(ValueError, match="n < 0"):
        _Checked(-1)

    @record
    class _Listed:
        items: list[int] = dataclasses.field(default_factory=list)

    a, b = _Listed(), _Listed()
    assert a == b and a.items == [] and a.items is not b.items
    with pytest.raises(TypeError, match="init, repr and comparison"):

        @record
        class _Bad:
            hidden: int = dataclasses.field(default=0, repr=False)


@state
class _State:
    a: int
    items: list[int] = dataclasses.field(default_factory=list)


@dataclasses.dataclass
class _DcState:
    a: int
    items: list[int] = dataclasses.field(default_factory=list)


def test_a_state_behaves_as_a_mutable_dataclass() -> None:
    s, d = _State(1), _DcState(1)
    assert repr(s).replace("_State", "_DcState") == repr(d)
    s.a, s.items = 2, [3]
    assert s == _State(2, [3]) and s != _State(2) and s != _DcState(2, [3])
    assert _State.__hash__ is None and _DcState.__hash__ is None
    assert _State(1).items is not _State(1).items
    assert dataclasses.replace(s, a=5) == _State(5, [3])
    with pytest.raises(TypeError, match="missing"):
        _State()  # type: ignore[call-arg]  # the point: a required field left out
