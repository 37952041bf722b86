"""vLLM picks a speculative method from a model's *path*: a planned method must survive it.

vLLM 0.33 (and 0.32, the same lines), ``vllm/config/speculative.py``, ``SpeculativeConfig.__post_init__``:
where the method is not one of ``eagle``, ``eagle3``, ``dflash``, ``dspark``, it builds the draft's
``ModelConfig`` and re-detects the method from ``draft_model_config.model.lower()`` (the string it
was given; a symlink is not resolved), in this order::

    elif "eagle-" in model.lower():  method = "eagle"
    elif "eagle3" in model.lower():  method = "eagle3"
    elif "dflash" in model.lower():  method = "dflash"   # (or the draft's architecture says so)
    elif "dspark" in model.lower():  method = "dspark"   # (or the draft's architecture says so)

The methods it re-detects are the model-based ones hwprofile plans without naming the head kind:
``draft_model`` (the path is the draft's) and ``mtp`` (vLLM sets the draft to the *target's* path
before detecting). ``ngram`` and ``suffix`` build no draft config; ``eagle``/``eagle3`` named
explicitly are kept as they are. A planned ``mtp`` on a model at ``/models/Qwen-dflash-test`` would
start as DFlash, silently: :func:`path_conflicts` says so, and the planner refuses it
(:func:`check`). The list is encoded once, here (:data:`PATH_METHODS`).

A release without a method cannot pick it: a substring is not checked for releases up to the last
one whose flag table (speculative methods read off each release's parser) lacks the method
(:meth:`hwprofile.release.Release.may_pick_method`). An unknown release is checked against every
substring."""

from __future__ import annotations

from collections.abc import Sequence

from ..release import release_of
from .reasons import Reasons
from .refusal import PlanRefused
from .types import InstancePlan

# (substring of the lower-cased path, the method vLLM then picks), in vLLM's order: the first wins
PATH_METHODS: tuple[tuple[str, str], ...] = (
    ("eagle-", "eagle"),
    ("eagle3", "eagle3"),
    ("dflash", "dflash"),
    ("dspark", "dspark"),
)
# planned methods vLLM re-detects from the path (the others it keeps, or builds no draft for)
REDETECTED = frozenset({"draft_model", "mtp"})
SOURCE = "vLLM 0.32/0.33 vllm/config/speculative.py SpeculativeConfig.__post_init__"


def method_from_path(path: str, version: str | None = None) -> tuple[str, str] | None:
    """``(substring, method)`` vLLM ``version`` (None: any) would pick from ``path``, or None where
    the path says nothing to it."""
    low, rel = path.lower(), release_of(version)
    for sub, method in PATH_METHODS:
        if not rel.may_pick_method(method):
            continue  # this release has no such method: it cannot pick it
        if sub in low:
            return sub, method
    return None


def checked_path(inst: InstancePlan, target_path: str) -> tuple[str, str] | None:
    """``(which, path)`` vLLM detects the method of ``inst``'s speculation from (``which``: draft or
    target), or None where it detects nothing (no speculation, ngram, suffix, an explicit EAGLE)."""
    spec = inst.speculative
    if spec is None or spec.method not in REDETECTED:
        return None
    if spec.model:
        return ("draft", str(spec.model))
    return ("target", target_path)  # MTP: vLLM takes the target's path as the draft's


def path_conflicts(inst: InstancePlan, target_path: str, version: str | None = None) -> str | None:
    """Why vLLM would run another speculative method than ``inst`` plans, naming the path and the
    fix; None where it runs the planned one."""
    where = checked_path(inst, target_path)
    if where is None:
        return None
    which, path = where
    found = method_from_path(path, version)
    if found is None:
        return None
    sub, method = found
    planned = inst.speculative.method if inst.speculative else None
    return (
        f"{inst.name}: speculative method {planned} is planned, but vLLM would run {method}: the {which} "
        f"model's path {path!r} contains {sub!r}, and vLLM picks the method from the path ({SOURCE}). "
        f"Rename the directory, or point at it through a symlink whose whole path has none of "
        f"{', '.join(repr(s) for s, _ in PATH_METHODS)}"
    )


def check(
    instances: Sequence[InstancePlan], target_path: str, r: Reasons, version: str | None = None
) -> None:
    """Refuse (:class:`PlanRefused`) a plan in which vLLM would pick another speculative method from
    a model path than planned; otherwise record, per speculating instance whose method vLLM re-detects,
    that its path was checked."""
    bad = [why for inst in instances if (why := path_conflicts(inst, target_path, version))]
    if bad:
        raise PlanRefused(
            "; ".join(bad),
            [
                "rename the model directory (or a symlink to it) so that its path contains none of "
                + ", ".join(repr(s) for s, _ in PATH_METHODS),
                "or plan without speculation: --set speculative.method=none (or ngram)",
            ],
        )
    for i, inst in enumerate(instances):
        where = checked_path(inst, target_path)
        if where is not None:
            r.add(
                f"instances[{i}].speculative.method",
                inst.speculative.method if inst.speculative else None,
                f"the {where[0]} path {where[1]!r} contains none of the substrings from which vLLM picks a "
                f"speculative method ({', '.join(s for s, _ in PATH_METHODS)}; {SOURCE})",
            )
