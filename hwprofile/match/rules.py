"""First-match rules (like tuned's recommend rules), as data: ordered, each naming a profile and the
host facts it needs. The matcher explains every rule it tried and never probes the host."""

from __future__ import annotations

import os
import re

from .._record import TYPE_CHECKING, Record
from ..config import ConfigError
from ..config.schema import suggest
from ..config.yamlsrc import load_file, yaml_files
from ..snapshot import HostSnapshot
from .profiles import builtin_dir

if TYPE_CHECKING:
    from typing import Any


class HostFacts(Record):
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
    links = [host.link(a.index, b.index) for i, a in enumerate(gpus) for b in gpus[i + 1 :]]
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


class Rule(Record):
    profile: str
    when: dict[str, Any]
    why: str
    file: str
    line: int


class Check(Record):
    predicate: str
    ok: bool
    detail: str


class RuleResult(Record):
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


def load_rules(root: str | os.PathLike[str] | None) -> list[Rule]:
    """Site rules (``<root>/rules.d/*.yaml``, sorted) first, then the built-in ``rules.yaml``."""
    files = yaml_files(os.path.join(root, "rules.d")) if root is not None else []
    files.append(os.path.join(builtin_dir(), "rules.yaml"))
    rules: list[Rule] = []
    for f in files:
        data, locs = load_file(f)
        items = (data or {}).get("rules") if isinstance(data, dict) else None
        if not isinstance(items, list):
            raise ConfigError(f"{f}:1: expected 'rules:' with a list of {{profile, when, why}}")
        for i, item in enumerate(items):
            line = locs.get(("rules", str(i)), 1)
            if not isinstance(item, dict) or "profile" not in item:
                raise ConfigError(f"{f}:{line}: each rule needs 'profile:' (and optionally 'when:', 'why:')")
            when = item.get("when") or {}
            for key in when:
                if key not in PREDICATES:
                    raise ConfigError(
                        f"{f}:{line}: unknown rule predicate '{key}'{suggest(key, list(PREDICATES))}; "
                        f"valid: {', '.join(PREDICATES)}"
                    )
            rules.append(Rule(str(item["profile"]), dict(when), str(item.get("why", "")), f, line))
    return rules


def _range(value: Any, x: float) -> tuple[bool, str]:
    if isinstance(value, dict):
        lo, hi = value.get("min"), value.get("max")
        ok = (lo is None or x >= lo) and (hi is None or x <= hi)
        return ok, f"[{'-inf' if lo is None else lo}, {'inf' if hi is None else hi}]"
    return x == value, f"= {value}"


def evaluate(rule: Rule, f: HostFacts) -> RuleResult:
    checks: list[Check] = []
    for key, want in rule.when.items():
        if key == "gpu_count":
            ok, rng = _range(want, f.gpu_count)
            checks.append(Check(key, ok, f"{f.gpu_count} GPU(s), want {rng}"))
        elif key == "gpu_name":
            pat = re.compile(str(want), re.I)
            ok = f.gpu_count > 0 and all(pat.search(n) for n in f.gpu_names)
            names = ", ".join(sorted(set(f.gpu_names))) or "no GPU"
            checks.append(Check(key, ok, f"{names} {'matches' if ok else 'does not match'} /{want}/"))
        elif key == "memory_gib":
            oks = [_range(want, m) for m in f.memory_gib]
            ok = bool(oks) and all(o for o, _ in oks)
            shown = ", ".join(f"{m:.1f}" for m in sorted(set(f.memory_gib))) or "none"
            checks.append(Check(key, ok, f"GPU memory {shown} GiB, want {_range(want, 0)[1]}"))
        elif key == "compute_capability":
            lo = _cc(str(want.get("min"))) if isinstance(want, dict) and want.get("min") else (0, 0)
            hi = _cc(str(want.get("max"))) if isinstance(want, dict) and want.get("max") else (99, 99)
            ok = bool(f.compute_capabilities) and all(lo <= c <= hi for c in f.compute_capabilities)
            checks.append(
                Check(key, ok, f"compute capability {sorted(set(f.compute_capabilities))}, want {want}")
            )
        elif key == "nvlink":
            ok = f.nvlink is bool(want)
            state = {True: "every GPU pair on NVLink", False: "no NVLink", None: "NVLink on some GPUs only"}[
                f.nvlink
            ]
            checks.append(Check(key, ok, f"{state}, want nvlink={bool(want)}"))
        elif key == "p2p":
            ok = f.p2p is bool(want)
            checks.append(Check(key, ok, f"P2P {'unknown' if f.p2p is None else f.p2p}, want {bool(want)}"))
        elif key == "numa_nodes":
            ok, rng = _range(want, f.numa_nodes)
            checks.append(Check(key, ok, f"{f.numa_nodes} NUMA node(s), want {rng}"))
        elif key == "homogeneous":
            ok = f.homogeneous is bool(want)
            checks.append(
                Check(
                    key,
                    ok,
                    f"{'one GPU model' if f.homogeneous else 'mixed GPU models'}, want homogeneous={bool(want)}",
                )
            )
    return RuleResult(rule, all(c.ok for c in checks), tuple(checks))


def match(rules: list[Rule], facts: HostFacts) -> tuple[RuleResult | None, list[RuleResult]]:
    """Evaluate every rule in order; the first that matches wins."""
    results = [evaluate(r, facts) for r in rules]
    winner = next((r for r in results if r.matched), None)
    return winner, results
