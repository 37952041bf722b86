"""One setting's declaration (:class:`Field`: kind, documentation, range, choices, default) and the
check that turns a value given in YAML, the environment or ``--set`` into that kind, or says what is
expected. Text that can reach a rendered file (argv, the shell line, an environment file, a systemd
unit) never holds a control character; numbers are finite."""

from __future__ import annotations

import itertools
import math
import re
from collections.abc import Callable, Iterable
from typing import Any, NamedTuple


class Field(NamedTuple):
    """What one setting may hold, and its one default (sizes in bytes)."""

    kind: str  # float, int, bool, str, text, choice, size, int_or_auto, k_table, str_list
    doc: str
    lo: float | None = None
    hi: float | None = None
    choices: tuple[str, ...] = ()
    nullable: bool = False
    default: Any = None
    pattern: str = ""  # str: the whole value must match this regular expression
    pattern_doc: str = ""  # what the pattern means, for the error message


# Spellings people use that no vLLM accepts (``--kv-cache-dtype fp16`` is invalid in every release).
ALIASES = {"fp16": "float16", "half": "float16", "bf16": "bfloat16", "fp32": "float32", "int8": "fp8"}

MAX_SIZE = 2**50  # 1 PiB: a larger size is a typo

_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([KMGT]i?B?|B)?\s*$", re.I)
_UNITS = {"": 1, "B": 1, "K": 1000, "M": 1000**2, "G": 1000**3, "T": 1000**4}


def parse_size(value: object) -> int:
    """``123``, ``"600MiB"``, ``"1GiB"``, ``"64M"`` (vLLM's style: M = 10^6, MiB = 2^20) → bytes,
    at most ``MAX_SIZE``."""
    if isinstance(value, bool):
        raise ValueError("a size, not a boolean")
    if isinstance(value, int):
        if value < 0:
            raise ValueError("a size cannot be negative")
        size = value
    else:
        m = _SIZE.match(str(value)) if isinstance(value, str | float) else None
        if not m:
            raise ValueError(f"{value!r} is not a size (use bytes or e.g. 600MiB, 1GiB)")
        number, unit = float(m.group(1)), (m.group(2) or "").upper()
        binary = "I" in unit
        base = unit[:1] if unit[:1] in "KMGT" and unit else ""
        factor = 1024 ** ("KMGT".index(base) + 1) if binary and base else _UNITS[base]
        if not math.isfinite(number * factor):
            raise ValueError(f"{value!r} is too large a size (at most {MAX_SIZE} bytes)")
        size = int(number * factor)
    if size > MAX_SIZE:
        raise ValueError(f"{value!r} is too large a size (at most {MAX_SIZE} bytes, 1 PiB)")
    return size


def check(field: Field, value: object) -> Any:
    """Return the value converted to its kind, or raise ValueError saying what is expected."""
    if value is None:
        if field.nullable:
            return None
        raise ValueError("a value is required (null is not allowed here)")
    if isinstance(value, float) and not math.isfinite(value):
        raise ValueError(f"expected a finite number, got {value}")
    checker = _CHECKERS.get(field.kind)
    if checker is None:
        raise AssertionError(field.kind)
    return checker(field, value)


def _check_bool(field: Field, value: object) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.lower() in ("true", "false", "yes", "no", "on", "off", "1", "0"):
        return value.lower() in ("true", "yes", "on", "1")
    raise ValueError(f"expected true or false, got {value!r}")


def _parse_number_text(kind: str, value: object) -> int | float:
    """A value that is not already a number (text, or a list or mapping) read as ``kind``."""
    if not isinstance(value, str):
        value = repr(value)  # a list or mapping: refused below, with what was given
    try:
        return float(value) if kind == "float" else int(str(value), 10)
    except ValueError:
        expected = (
            "a number"
            if kind == "float"
            else ("an integer or auto" if kind == "int_or_auto" else "an integer")
        )
        raise ValueError(f"expected {expected}, got {value!r}") from None


def _check_number(field: Field, value: object) -> int | float | str:
    k = field.kind
    if k == "int_or_auto" and value == "auto":
        return "auto"
    if isinstance(value, bool) or not isinstance(value, int | float):
        value = _parse_number_text(k, value)
    if isinstance(value, float) and not math.isfinite(value):
        raise ValueError(f"expected a finite number, got {value}")
    if k != "float":
        if isinstance(value, float) and not value.is_integer():
            raise ValueError(f"expected an integer, got {value!r}")
        value = int(value)
    else:
        value = float(value)
    _check_range(field, value)
    return value


def _check_range(field: Field, value: int | float) -> None:
    if isinstance(value, int) and value.bit_length() > 63:
        raise ValueError(
            f"a {value.bit_length()}-bit number is out of range [{_num(field.lo)}, {_num(field.hi)}]"
        )
    if (field.lo is not None and value < field.lo) or (field.hi is not None and value > field.hi):
        raise ValueError(f"{value} is out of range [{_num(field.lo)}, {_num(field.hi)}]")


def _check_choice(field: Field, value: object) -> object:
    if isinstance(value, bool) and {"on", "off"} <= set(field.choices):
        value = "on" if value else "off"  # YAML reads a bare on/off as a boolean
    if value not in field.choices:
        alias = ALIASES.get(str(value).lower())
        close = [alias] if alias in field.choices else _close(str(value), field.choices)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        raise ValueError(f"{value!r} is not one of: {', '.join(field.choices)}{hint}")
    return value


def _check_text(field: Field, value: object) -> str:
    if not isinstance(value, str | int | float) or isinstance(value, bool):
        raise ValueError(f"expected text, got {type(value).__name__}")
    text = str(value)
    if field.kind == "text":  # several lines allowed, but no escape sequences for the terminal
        plain_text(text.replace("\n", " ").replace("\t", " "))
        return text
    plain_text(text)
    if field.pattern and not re.fullmatch(field.pattern, text):
        raise ValueError(f"{text!r} is not {field.pattern_doc}")
    return text


def _check_str_list(field: Field, value: object) -> list[str]:
    if isinstance(value, str):
        import shlex

        plain_text(value)
        return shlex.split(value)
    if not isinstance(value, list) or not all(
        isinstance(v, str | int | float) and not isinstance(v, bool) for v in value
    ):
        raise ValueError("expected a list of strings")
    items = [str(v) for v in value]
    for item in items:
        plain_text(item)
    return items


_CHECKERS: dict[str, Callable[[Field, object], object]] = {
    "bool": _check_bool,
    "int": _check_number,
    "float": _check_number,
    "int_or_auto": _check_number,
    "choice": _check_choice,
    "str": _check_text,
    "text": _check_text,
    "size": lambda field, value: parse_size(value),
    "k_table": lambda field, value: _k_table(value),
    "str_list": _check_str_list,
}


CONTROL_CHARS = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029]")

# a host name (RFC 1123 labels of letters, digits, '-' and '_', none starting or ending with '-'),
# an IPv4 address, or an IPv6 one (bare or in brackets): never an option ("-oProxyCommand=...")
_LABEL = r"[A-Za-z0-9_](?:[A-Za-z0-9_-]{0,61}[A-Za-z0-9_])?"
HOST_ADDRESS = rf"{_LABEL}(?:\.{_LABEL})*\.?|\[[0-9A-Fa-f:.]+\]|[0-9A-Fa-f:.]*:[0-9A-Fa-f:.]*"
_HOST_ADDRESS = re.compile(HOST_ADDRESS)


def address_problem(value: object) -> str | None:
    """Why ``value`` is not a host name or an IP address another host can be reached at, or None."""
    if not isinstance(value, str) or not value:
        return "expected a host name or an IP address"
    if len(value) > 253 or not _HOST_ADDRESS.fullmatch(value):
        return f"{value[:80]!r} is not a host name or an IP address (letters, digits, '.', '-', at most 253)"
    if ":" in value:
        import ipaddress

        try:
            ipaddress.IPv6Address(value.strip("[]"))
        except ValueError:
            return f"{value[:80]!r} is not an IPv6 address"
    return None


def plain_text(text: str) -> None:
    """Refuse control characters (newline, tab, escape, NUL, ...): they would break, or add lines
    to, the shell line, the environment file or the systemd unit this text reaches."""
    m = CONTROL_CHARS.search(text)
    if m:
        raise ValueError(
            f"{text!r} holds the control character {m.group()!r} at position {m.start()}; "
            "text settings are one line of printable characters"
        )


def _num(x: float | None) -> str:
    return "-inf" if x is None else (str(int(x)) if float(x).is_integer() else str(x))


def _k_table(value: object) -> list[list[int | None]]:
    if not isinstance(value, list) or not value:
        raise ValueError("expected a list of [lo, hi, k] rows")
    rows: list[tuple[int, int | None, int]] = []
    for row in value:
        if not (isinstance(row, list) and len(row) == 3):
            raise ValueError(f"row {row!r} is not [lo, hi, k]")
        lo, hi, k = row
        if any(isinstance(x, bool) for x in row):
            raise ValueError(f"row {row!r}: numbers, not booleans")
        if not isinstance(lo, int) or lo < 1 or (hi is not None and (not isinstance(hi, int) or hi < lo)):
            raise ValueError(f"row {row!r}: need 1 <= lo <= hi (hi may be null)")
        if not isinstance(k, int) or not 0 <= k <= 16:
            raise ValueError(f"row {row!r}: k must be an integer 0..16")
        rows.append((lo, hi, k))
    rows.sort(key=lambda r: r[0])
    if rows[0][0] != 1:
        raise ValueError("the first row must start at batch size 1 (vLLM needs a k for every batch size)")
    for a, b in itertools.pairwise(rows):
        if a[1] is None or a[1] >= b[0]:
            raise ValueError(f"rows {list(a)} and {list(b)} overlap")
    return [list(r) for r in rows]


def _close(word: str, valid: Iterable[str]) -> list[str]:
    import difflib  # only on the error path: its import is a cost every start would pay

    return difflib.get_close_matches(word, list(valid), n=1, cutoff=0.6)


# settings renamed, by their old leaf name: the new name (as ``valid`` would spell it) and why
RENAMED = {
    "cuda_context_bytes": (
        "non_torch_bytes",
        "the CUDA context is made before vLLM's memory baseline and never counted against the KV cache; "
        "memory.non_torch_bytes holds what vLLM does count outside PyTorch, memory.collective_bytes "
        "more where tensor parallel > 1",
    ),
}


def suggest(key: str, valid: list[str]) -> str:
    """`` (did you mean 'x'?)`` for the closest of ``valid``, else nothing; for a renamed setting
    (:data:`RENAMED`), its new name and why."""
    leaf = key.rsplit(".", 1)[-1]
    if leaf in RENAMED:
        new, why = RENAMED[leaf]
        name = next((v for v in valid if v == new or v.endswith("." + new)), new)
        return f" (renamed '{name}': {why})"
    close = _close(key, valid)
    return f" (did you mean '{close[0]}'?)" if close else ""
