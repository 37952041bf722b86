"""First-match rules (like tuned's recommend rules), as data: ordered, each naming a profile and the
host facts it needs. The matcher explains every rule it tried and never probes the host.

Rules are checked when they are loaded, each problem naming the file and line: the rule's keys, a
profile that exists, predicate names, and predicate values of the right type (``gpu_name`` a valid
regular expression, compiled once; counts whole numbers; ``memory_gib`` finite numbers;
``compute_capability`` ``"8.9"``, ``9`` or ``{min, max}`` of those; ``nvlink``, ``p2p`` and
``homogeneous`` real booleans: the text ``"false"`` would otherwise be true)."""

from __future__ import annotations

import math
import os
import re
from typing import TYPE_CHECKING, NamedTuple, TypeVar

from ..config import ConfigError
from ..config.schema import suggest
from ..config.yamlsrc import Locations, load_file, yaml_files
from ..host.snapshot import HostSnapshot
from .profiles import builtin_dir, profile_names

if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any


class HostFacts(NamedTuple):
    """What rules can test, derived from a snapshot (usable GPUs only)."""

    gpu_count: int
    gpu_names: tuple[str, ...]
    memory_gib: tuple[float, ...]
    compute_capabilities: tuple[tuple[int, int], ...]
    homogeneous: bool
    nvlink: bool | None  # True: every GPU has NVLink and every pair is NV-linked; False: none; None: partial
    p2p: bool | None  # every pair supports P2P; None if unknown or fewer than 2 GPUs
    numa_nodes: int


def host_facts(host: HostSnapshot) -> HostFacts:
    gpus = host.usable_gpus
    names = tuple(g.name or "?" for g in gpus)
    mem = tuple((g.memory_total_bytes or 0) / 2**30 for g in gpus)
    ccs = tuple(_cc(g.compute_capability) for g in gpus)
    index = host.links()
    links = [index.get((a.index, b.index)) for i, a in enumerate(gpus) for b in gpus[i + 1 :]]
    has = [bool(g.nvlink_active_links) for g in gpus]
    pairs_nv = [bool(lk and lk.link and lk.link.startswith("NV")) for lk in links]
    if not gpus or not any(has):
        nvlink: bool | None = False
    elif all(has) and all(pairs_nv):
        nvlink = True
    else:
        nvlink = None
    p2ps = [lk.p2p if lk else None for lk in links]
    p2p = None if not p2ps or None in p2ps else all(p2ps)
    return HostFacts(
        gpu_count=len(gpus),
        gpu_names=names,
        memory_gib=mem,
        compute_capabilities=ccs,
        homogeneous=len(set(zip(names, [round(m) for m in mem], strict=True))) <= 1,
        nvlink=nvlink,
        p2p=p2p,
        numa_nodes=len(host.numa_nodes) or 1,
    )


def _cc(text: str | None) -> tuple[int, int]:
    try:
        major, minor = (text or "0.0").split(".")
        return int(major), int(minor)
    except ValueError:
        return (0, 0)


class Rule(NamedTuple):
    profile: str
    when: dict[str, Any]  # as written (shown by `hwprofile profiles`)
    why: str
    file: str
    line: int
    tests: dict[str, Any] | None = None  # `when` checked and converted at load (None: on use)


class Check(NamedTuple):
    predicate: str
    ok: bool
    detail: str


class RuleResult(NamedTuple):
    rule: Rule
    matched: bool
    checks: tuple[Check, ...]


PREDICATES = (
    "gpu_count",
    "gpu_name",
    "memory_gib",
    "compute_capability",
    "nvlink",
    "p2p",
    "numa_nodes",
    "homogeneous",
)


RULE_KEYS = ("profile", "when", "why")
RANGE_KEYS = ("min", "max")
BOOL_PREDICATES = ("nvlink", "p2p", "homogeneous")


def load_rules(root: str | os.PathLike[str] | None) -> list[Rule]:
    """Site rules (``<root>/rules.d/*.yaml``, sorted) first, then the built-in ``rules.yaml``.
    Every rule is checked here: a bad one is a ConfigError with its file and line, never a
    surprise while matching."""
    files = yaml_files(os.path.join(root, "rules.d"), "rules") if root is not None else []
    files.append(os.path.join(builtin_dir(), "rules.yaml"))
    known = sorted(profile_names(root))
    rules: list[Rule] = []
    problems: list[str] = []
    for f in files:
        data, locs = load_file(f)
        items = (data or {}).get("rules") if isinstance(data, dict) else None
        if not isinstance(items, list):
            raise ConfigError(f"{f}:1: expected 'rules:' with a list of {{profile, when, why}}")
        for extra in [str(k) for k in data if k != "rules"]:
            problems.append(
                f"{f}:{locs.get((extra,), 1)}: unknown key '{extra}'; a rules file holds 'rules:' only"
            )
        for i, item in enumerate(items):
            rule = _rule(f, locs, i, item, known, problems)
            if rule is not None:
                rules.append(rule)
    if problems:
        raise ConfigError(problems)
    return rules


def _rule(
    f: str, locs: Locations, i: int, item: object, known: list[str], problems: list[str]
) -> Rule | None:
    line = locs.get(("rules", str(i)), 1)

    def at(*p: str) -> int:
        return locs.get(("rules", str(i), *p), line)

    if not isinstance(item, dict) or "profile" not in item:
        problems.append(f"{f}:{line}: each rule needs 'profile:' (and optionally 'when:', 'why:')")
        return None
    for k in [str(k) for k in item if k not in RULE_KEYS]:
        problems.append(
            f"{f}:{at(k)}: unknown rule key '{k}'{suggest(k, list(RULE_KEYS))}; valid: {', '.join(RULE_KEYS)}"
        )
    profile = item["profile"]
    if not isinstance(profile, str) or not profile:
        problems.append(f"{f}:{at('profile')}: 'profile' must be a profile name, got {profile!r}")
        return None
    if profile not in known:
        problems.append(
            f"{f}:{at('profile')}: unknown profile '{profile}'{suggest(profile, known)}; "
            f"available: {', '.join(known)}"
        )
    why = item.get("why", "")
    if not isinstance(why, str | int | float) or isinstance(why, bool):
        problems.append(f"{f}:{at('why')}: 'why' must be text, got {type(why).__name__}")
    when = item.get("when")
    if when is None:
        when = {}
    if not isinstance(when, dict):
        problems.append(f"{f}:{at('when')}: 'when' must be a mapping of predicates, got {when!r}")
        return None
    tests: dict[str, Any] = {}
    for key, want in when.items():
        key = str(key)
        if key not in PREDICATES:
            own = at("when", key)
            problems.append(
                f"{f}:{line}: unknown rule predicate '{key}'{suggest(key, list(PREDICATES))}; "
                f"valid: {', '.join(PREDICATES)}" + (f" (line {own})" if own != line else "")
            )
            continue
        try:
            tests[key] = predicate(key, want)
        except ValueError as e:
            problems.append(f"{f}:{at('when', key)}: rule for '{profile}': {key}: {e}")
    return Rule(profile, dict(when), str(why), f, line, tests)


def gpu_name_pattern(text: str) -> Any:
    """A ``gpu_name`` rule's pattern, compiled by RE2 (google-re2): matching takes time linear in the
    name whatever the pattern, so a site rule like ``^(([\\w ]+)+)+X$`` cannot hang every plan and the
    daemon's live reload the way a backtracking engine would. Case-insensitive; what RE2 cannot
    say (back-references, look-around) is an invalid expression, with RE2's reason."""
    import re2

    opts = re2.Options()
    opts.case_sensitive = False
    opts.log_errors = False  # the reason goes into the error, not onto stderr
    try:
        return re2.compile(text, opts)
    except re2.error as e:
        why = e.args[0].decode("utf-8", "replace") if e.args and isinstance(e.args[0], bytes) else str(e)
        raise ValueError(
            f"invalid regular expression {text!r}: {why} (RE2 syntax: no back-references or look-around)"
        ) from None


def predicate(key: str, want: object) -> Any:
    """A predicate's value checked and converted for ``evaluate``; a ValueError says what is expected."""
    if key == "gpu_name":
        if not isinstance(want, str | int) or isinstance(want, bool) or not str(want):
            raise ValueError(f"expected a regular expression (text), got {want!r}")
        return gpu_name_pattern(str(want))
    if key in BOOL_PREDICATES:
        if not isinstance(want, bool):
            raise ValueError(f"expected true or false (unquoted), got {want!r}")
        return want
    if key == "compute_capability":
        if isinstance(want, dict):
            lo, hi = _bounds(want, _cc_value)
            return (lo or (0, 0), hi or (99, 99))
        cc = _cc_value(want)
        return (cc, cc)
    conv = _count if key in ("gpu_count", "numa_nodes") else _gib
    return _bounds(want, conv) if isinstance(want, dict) else conv(want)


# a bound of a range predicate: a count, GiB, or a compute capability (major, minor)
B = TypeVar("B", int, float, tuple[int, int])


def _bounds(want: dict[object, object], conv: Callable[[object], B]) -> tuple[B | None, B | None]:
    bad = [str(k) for k in want if k not in RANGE_KEYS]
    if bad:
        raise ValueError(f"unknown bound '{bad[0]}'{suggest(bad[0], list(RANGE_KEYS))}; valid: min, max")
    if not want:
        raise ValueError("an empty range: give min, max or both")
    lo = conv(want["min"]) if want.get("min") is not None else None
    hi = conv(want["max"]) if want.get("max") is not None else None
    if lo is not None and hi is not None and lo > hi:
        raise ValueError(f"min {want['min']} is above max {want['max']}")
    return lo, hi


def _count(v: object) -> int:
    if isinstance(v, bool) or not isinstance(v, int) or v < 0:
        raise ValueError(f"expected a whole number >= 0 or {{min, max}}, got {v!r}")
    return v


def _gib(v: object) -> float:
    if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v) or v < 0:
        raise ValueError(f"expected a finite number of GiB >= 0 or {{min, max}}, got {v!r}")
    return float(v)


_CC = re.compile(r"(\d{1,2})(?:\.(\d{1,2}))?")


def _cc_value(v: object) -> tuple[int, int]:
    """``"8.9"``, ``8.9``, ``9`` or ``"9"`` → (major, minor); anything else is a ValueError.
    (A bare ``9`` used to fail to split on the dot and silently become 0.0: ``{min: 9}`` then
    matched an 8.9 card.)"""
    ok = isinstance(v, str | int | float) and not isinstance(v, bool)
    m = _CC.fullmatch(str(v).strip()) if ok and not (isinstance(v, float) and not math.isfinite(v)) else None
    if not m:
        raise ValueError(f'expected a compute capability like "8.9" or 9, got {v!r}')
    return int(m.group(1)), int(m.group(2) or 0)


def _in(bounds: float | tuple[float | None, float | None], x: float) -> bool:
    if isinstance(bounds, tuple):
        lo, hi = bounds
        return (lo is None or x >= lo) and (hi is None or x <= hi)
    return x == bounds


def _shown(bounds: float | tuple[float | None, float | None]) -> str:
    if isinstance(bounds, tuple):
        lo, hi = bounds
        return f"[{'-inf' if lo is None else _n(lo)}, {'inf' if hi is None else _n(hi)}]"
    return f"= {_n(bounds)}"


def _n(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else str(x)


def evaluate(rule: Rule, f: HostFacts) -> RuleResult:
    tests = rule.tests if rule.tests is not None else {k: predicate(k, v) for k, v in rule.when.items()}
    checks: list[Check] = []
    for key, want in tests.items():
        if key == "gpu_count":
            ok = _in(want, f.gpu_count)
            checks.append(Check(key, ok, f"{f.gpu_count} GPU(s), want {_shown(want)}"))
        elif key == "gpu_name":
            ok = f.gpu_count > 0 and all(want.search(n) for n in f.gpu_names)
            names = ", ".join(sorted(set(f.gpu_names))) or "no GPU"
            checks.append(Check(key, ok, f"{names} {'matches' if ok else 'does not match'} /{want.pattern}/"))
        elif key == "memory_gib":
            ok = bool(f.memory_gib) and all(_in(want, m) for m in f.memory_gib)
            shown = ", ".join(f"{m:.1f}" for m in sorted(set(f.memory_gib))) or "none"
            checks.append(Check(key, ok, f"GPU memory {shown} GiB, want {_shown(want)}"))
        elif key == "compute_capability":
            lo, hi = want
            ok = bool(f.compute_capabilities) and all(lo <= c <= hi for c in f.compute_capabilities)
            checks.append(
                Check(
                    key,
                    ok,
                    f"compute capability {sorted(set(f.compute_capabilities))}, want {rule.when.get(key)}",
                )
            )
        elif key == "nvlink":
            ok = f.nvlink is want
            state = {True: "every GPU pair on NVLink", False: "no NVLink", None: "NVLink on some GPUs only"}[
                f.nvlink
            ]
            checks.append(Check(key, ok, f"{state}, want nvlink={want}"))
        elif key == "p2p":
            ok = f.p2p is want
            checks.append(Check(key, ok, f"P2P {'unknown' if f.p2p is None else f.p2p}, want {want}"))
        elif key == "numa_nodes":
            ok = _in(want, f.numa_nodes)
            checks.append(Check(key, ok, f"{f.numa_nodes} NUMA node(s), want {_shown(want)}"))
        elif key == "homogeneous":
            ok = f.homogeneous is want
            checks.append(
                Check(
                    key,
                    ok,
                    f"{'one GPU model' if f.homogeneous else 'mixed GPU models'}, want homogeneous={want}",
                )
            )
    return RuleResult(rule, all(c.ok for c in checks), tuple(checks))


def match(rules: list[Rule], facts: HostFacts) -> tuple[RuleResult | None, list[RuleResult]]:
    """Evaluate every rule in order; the first that matches wins."""
    results = [evaluate(r, facts) for r in rules]
    winner = next((r for r in results if r.matched), None)
    return winner, results
