"""hwprofile/record.py: a record behaves as the frozen dataclass it replaces (issue 34: the plan types,
the predictor's inputs, the settings and the release facts share their methods instead of generating
six per class at import)."""

from __future__ import annotations

import dataclasses

import pytest

from hwprofile.record import record, state


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


def test_dataclasses_sees_a_record_as_what_it_is_frozen_or_not() -> None:
    """A frozen dataclass may subclass a record and a mutable one may not, as with a real frozen
    dataclass (dataclasses reads the class's own parameters); a state is the other way round."""

    @dataclasses.dataclass(frozen=True)
    class Sub(_Rec):
        d: int = 0

    s = Sub(1, d=2)
    assert s == Sub(1, d=2) and hash(s) == hash(Sub(1, d=2))
    with pytest.raises(TypeError, match="cannot inherit non-frozen dataclass from a frozen one"):

        @dataclasses.dataclass
        class Mutable(_Rec):
            pass

    assert dataclasses.fields(_Rec)[0].name == "a"
    assert _Rec.__dataclass_params__.frozen and _Rec.__dataclass_params__.eq  # type: ignore[attr-defined]


def test_field_options_a_record_does_not_honour_are_refused() -> None:
    """compare=False, repr=False, a field's own hash, keyword-only fields and InitVar: refused when the
    class is declared, never silently handled otherwise than a dataclass would."""
    for opt in ({"compare": False}, {"repr": False}, {"hash": False}, {"kw_only": True}):
        with pytest.raises(TypeError, match="a record's fields"):

            @record
            class Bad:
                a: int = dataclasses.field(default=0, **opt)  # type: ignore[call-overload]

    with pytest.raises(TypeError, match="no InitVar"):

        @record
        class WithInitVar:
            a: int
            scale: dataclasses.InitVar[int] = 1
