"""The rule vocabulary of hwprofile's JSON contracts (the ``hwprofile.host/1`` snapshot, the
run-time files of :mod:`hwprofile.supervise.runfiles`): integers and numbers in a range, true/false, bounded
text (optionally matching a pattern), bounded lists, objects with required fields, constants.

Each rule answers three questions about a value: ``valid`` (the fast yes/no a load of a good snapshot
takes), ``check`` (the JSON path of the first bad value, as :class:`Invalid`, asked only when
``valid`` said no) and ``schema`` (the same rule as JSON Schema, for :mod:`.snapshot_schema`).
The tables of which field holds what: :data:`hwprofile.host.snapshot_check.HOST`, and the run-time
documents' in :mod:`hwprofile.supervise.runfiles`. Plain Python, no imports but
``json`` (and ``re`` once a pattern is first used).
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any, TypeGuard

if TYPE_CHECKING:
    import re

_CONTROL = "".join(map(chr, range(32))) + "\x7f"
_CONTROL_CHAR = "[\\u0000-\\u001f\\u007f]"


class Invalid(Exception):
    """A value that breaks the contract; the message starts with its JSON path."""

    def __init__(self, path: str, message: str) -> None:
        super().__init__(f"{path}: {message}")


def _show(v: object) -> str:
    if isinstance(v, dict):
        return "an object"
    if isinstance(v, list):
        return "a list"
    text = json.dumps(v, ensure_ascii=True)
    return text if len(text) <= 60 else text[:57] + "..."


class Kind:
    """One field's rule: ``valid(value)`` is the fast answer; ``check(value, path)`` (run only when
    that is no) raises :class:`Invalid` with the path of the first bad value; ``schema()`` is the
    rule as JSON Schema."""

    null = False

    def valid(self, v: object) -> bool:
        return (v is None and self.null) or self.ok(v)

    def what(self) -> str:
        raise NotImplementedError

    def ok(self, v: object) -> bool:
        raise NotImplementedError

    def check(self, v: object, path: str) -> None:
        if v is None and self.null:
            return
        if not self.ok(v):
            self.fail(v, path)

    def fail(self, v: object, path: str) -> None:
        raise Invalid(path, f"expected {self.what()}{' or null' if self.null else ''}, got {_show(v)}")

    def schema(self) -> dict[str, Any]:
        raise NotImplementedError

    def typed(self, t: str) -> dict[str, Any]:
        return {"type": [t, "null"] if self.null else t}

    def nullable(self) -> Kind:
        """The same rule, null allowed."""
        return self._with(True)

    def required(self) -> Kind:
        """The same rule, null not allowed."""
        return self._with(False)

    def _with(self, null: bool) -> Kind:
        import copy

        other = copy.copy(self)
        other.null = null
        return other


class Int(Kind):
    lo: float  # an Int's bounds are integers, a Num's any numbers
    hi: float

    def __init__(self, lo: int, hi: int, null: bool = True, unit: str = "") -> None:
        self.lo, self.hi, self.null, self.unit = lo, hi, null, unit

    def what(self) -> str:
        return f"an integer from {self.lo} to {self.hi}{self.unit}"

    def ok(self, v: object) -> bool:
        return type(v) is int and self.lo <= v <= self.hi

    def schema(self) -> dict[str, Any]:
        return {**self.typed("integer"), "minimum": self.lo, "maximum": self.hi}


class Num(Int):
    def __init__(self, lo: float, hi: float, null: bool = True, unit: str = "") -> None:
        self.lo, self.hi, self.null, self.unit = lo, hi, null, unit

    def what(self) -> str:
        return f"a number from {self.lo} to {self.hi}{self.unit}"

    def ok(self, v: object) -> bool:
        return (type(v) is int or type(v) is float) and self.lo <= v <= self.hi  # NaN fails both comparisons

    def schema(self) -> dict[str, Any]:
        return {**self.typed("number"), "minimum": self.lo, "maximum": self.hi}


class Bool(Kind):
    def __init__(self, null: bool = False) -> None:
        self.null = null

    def what(self) -> str:
        return "true/false"

    def ok(self, v: object) -> bool:
        return type(v) is bool

    def schema(self) -> dict[str, Any]:
        return self.typed("boolean")


class Str(Kind):
    """Text of at most ``max_len`` characters, no control characters (they end up in file names,
    environment files and command lines) unless ``lines``; ``pattern`` (a regular expression,
    anchored) and ``like`` (what it says in an error) narrow it further."""

    def __init__(
        self, max_len: int, null: bool = True, pattern: str | None = None, like: str = "", lines: bool = False
    ) -> None:
        self.max_len, self.null, self.pattern, self.like, self.lines = max_len, null, pattern, like, lines
        self._rx: re.Pattern[str] | None = None  # compiled at the first check

    def what(self) -> str:
        if self.like:
            return self.like
        return f"a string of at most {self.max_len} characters{'' if self.lines else ' without control characters'}"

    def ok(self, v: object) -> bool:
        if type(v) is not str or len(v) > self.max_len:
            return False
        if not v.isprintable():  # rare: control characters, surrogates, unusual spaces
            try:
                v.encode("utf-8")  # a lone surrogate (from a "\\udc80" escape) cannot be printed
            except UnicodeEncodeError:
                return False
            if self.lines:
                return "\x00" not in v
            if v.translate(_STRIP_CONTROL) != v:
                return False
        if self.pattern is None:
            return True
        if self._rx is None:
            import re

            self._rx = re.compile(self.pattern)
        return self._rx.fullmatch(v) is not None

    def schema(self) -> dict[str, Any]:
        out: dict[str, Any] = {**self.typed("string"), "maxLength": self.max_len}
        if self.pattern is not None:
            out["pattern"] = f"^(?:{self.pattern})$"
        if not self.lines:  # also what "$" lets through before a final newline
            out["not"] = {"type": "string", "pattern": _CONTROL_CHAR}
        return out


_STRIP_CONTROL = {ord(c): None for c in _CONTROL}


class List(Kind):
    def __init__(self, item: Kind, max_items: int, null: bool = False) -> None:
        self.item, self.max_items, self.null = item, max_items, null

    def what(self) -> str:
        return f"a list of at most {self.max_items} items"

    def ok(self, v: object) -> TypeGuard[list[object]]:
        return type(v) is list and len(v) <= self.max_items

    def valid(self, v: object) -> bool:
        if v is None:
            return self.null
        if not self.ok(v):
            return False
        item = self.item
        return all(item.valid(x) for x in v)

    def check(self, v: object, path: str) -> None:
        super().check(v, path)
        if type(v) is list:  # else None, where null is allowed
            for i, x in enumerate(v):
                self.item.check(x, f"{path}[{i}]")

    def schema(self) -> dict[str, Any]:
        return {**self.typed("array"), "maxItems": self.max_items, "items": self.item.schema()}


class Obj(Kind):
    """An object with these fields; ``required`` ones must be there; other keys are ignored
    (a newer writer may add some)."""

    def __init__(
        self, fields: dict[str, Kind], required: tuple[str, ...] = (), doc: str = "", null: bool = False
    ) -> None:
        self.fields, self.needed, self.doc, self.null = fields, required, doc, null

    def what(self) -> str:
        return "an object"

    def ok(self, v: object) -> TypeGuard[dict[str, object]]:
        return type(v) is dict

    def valid(self, v: object) -> bool:
        if v is None:
            return self.null
        if type(v) is not dict:
            return False
        for name in self.needed:
            if name not in v:
                return False
        return all(kind.valid(v[name]) for name, kind in self.fields.items() if name in v)

    def check(self, v: object, path: str) -> None:
        super().check(v, path)
        if type(v) is not dict:  # None, where null is allowed
            return
        prefix = f"{path}." if path else ""
        for name in self.needed:
            if name not in v:
                raise Invalid(f"{prefix}{name}", "required, missing")
        for name, kind in self.fields.items():
            if name in v:
                kind.check(v[name], prefix + name)

    def schema(self) -> dict[str, Any]:
        out: dict[str, Any] = self.typed("object")
        if self.doc:
            out["description"] = self.doc
        out["properties"] = {k: f.schema() for k, f in self.fields.items()}
        if self.needed:
            out["required"] = list(self.needed)
        return out


class Const(Kind):
    def __init__(self, value: str) -> None:
        self.value = value

    def what(self) -> str:
        return json.dumps(self.value)

    def ok(self, v: object) -> bool:
        return v == self.value and type(v) is str

    def schema(self) -> dict[str, Any]:
        return {"const": self.value}


# -- strict JSON ---------------------------------------------------------------------------------


class BadJson(ValueError):
    """Bytes that are not one strict JSON document; ``where`` is ``:line:column`` when known (to
    follow a file name), ``message`` says what is wrong."""

    def __init__(self, message: str, where: str = "") -> None:
        super().__init__(f"{where.lstrip(':')}{': ' if where else ''}{message}")
        self.where, self.message = where, message


def parse_json(raw: bytes) -> Any:
    """One strict JSON document from ``raw``: UTF-8 (a leading byte-order mark is dropped), no
    duplicate keys, no NaN or Infinity (they are not JSON, and a NaN compares false with every
    bound). Raises :class:`BadJson`."""
    if raw.startswith(b"\xef\xbb\xbf"):  # a byte-order mark some editors write
        raw = raw[3:]
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise BadJson(f"not UTF-8 text (byte 0x{raw[e.start]:02x} at offset {e.start})") from None
    try:
        return json.loads(text, object_pairs_hook=_unique_keys, parse_constant=_no_constant)
    except json.JSONDecodeError as e:
        raise BadJson(f"invalid JSON: {e.msg}", f":{e.lineno}:{e.colno}") from None
    except Invalid as e:
        raise BadJson(f"invalid JSON: {e}") from None
    except RecursionError:
        raise BadJson("invalid JSON: nested too deeply") from None
    except ValueError as e:  # e.g. an integer of more than 4300 digits
        raise BadJson(f"invalid JSON: {e}") from None


def _unique_keys(pairs: list[tuple[str, object]]) -> dict[str, object]:
    out = dict(pairs)
    if len(out) != len(pairs):
        seen: set[str] = set()
        for k, _ in pairs:
            if k in seen:
                raise Invalid(f"key {json.dumps(k)}", "appears twice in one object")
            seen.add(k)
    return out


def _no_constant(name: str) -> Any:
    raise Invalid(name, "not a JSON number (NaN and Infinity are not allowed)")
