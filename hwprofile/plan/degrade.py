"""Degrade steps as settings: what a hot GPU's instances run with, given as a typed override layer
(:class:`~hwprofile.config.layers.Overrides`, source kind ``degrade``) that goes back through the planner
(so every degraded value is planned, checked and explained like any other, its source ``degrade step N
(why)``, not a ``--set`` nobody typed). Pure: the instance as planned in (an
:class:`~.types.InstancePlan`; its JSON is read as one), settings and reasons out.

Step ``n`` multiplies ``max_num_seqs`` and ``max_num_batched_tokens`` by the profile's
``degrade.*_factor`` to the power ``n`` (seed 000: 256 → 192 at step 1) and takes
``degrade.num_speculative_tokens_step × n`` proposals off every k (never below 1).
"""

from __future__ import annotations

from ..config.layers import Overrides
from ..config.settings import Degrade
from .types import InstancePlan

MIN_SEQS = 1
MIN_BATCHED_TOKENS = 256


Value = tuple[tuple[str, ...], object]  # (setting path, value)


def degrade_values(inst: InstancePlan, level: int, degrade: Degrade) -> tuple[list[Value], list[str]]:
    """(typed settings, one reason per setting) for degrade step ``level`` of ``inst`` (the instance of
    the full plan). Step 0 is the full profile: no settings."""
    if level <= 0:
        return [], []
    e = inst.engine
    out: list[Value] = []
    why: list[str] = []
    f_seqs = degrade.max_num_seqs_factor**level
    seqs = max(MIN_SEQS, int(e.max_num_seqs * f_seqs))
    if seqs != e.max_num_seqs:
        out.append((("engine", "max_num_seqs"), seqs))
        why.append(f"max_num_seqs {e.max_num_seqs} -> {seqs} (degrade step {level}: x{f_seqs:.3g})")
    f_tok = degrade.max_num_batched_tokens_factor**level
    tokens = max(MIN_BATCHED_TOKENS, int(e.max_num_batched_tokens * f_tok))
    if tokens != e.max_num_batched_tokens:
        out.append((("engine", "max_num_batched_tokens"), tokens))
        why.append(
            f"max_num_batched_tokens {e.max_num_batched_tokens} -> {tokens} (degrade step {level}: x{f_tok:.3g})"
        )
    spec = inst.speculative
    if spec is None and out:
        # a degrade never adds proposals: an instance that runs none (off as configured, or its draft
        # given way on the full plan's predictions) stays without at the smaller batching too
        out.append((("speculative", "method"), "none"))
        why.append(f"speculative decoding stays off (degrade step {level}: a degrade never adds proposals)")
    cut = degrade.num_speculative_tokens_step * level
    if spec and cut:
        k = int(spec.num_speculative_tokens)
        new_k = max(1, k - cut)
        if new_k != k:
            out.append((("speculative", "num_speculative_tokens"), new_k))
            why.append(f"num_speculative_tokens {k} -> {new_k} (degrade step {level})")
        table = spec.num_speculative_tokens_per_batch_size  # ABSENT is falsy
        if table:
            # a band without speculation (k 0) stays without: a degrade never adds proposals
            rows = [[lo, hi, max(1, kk - cut) if kk > 0 else kk] for lo, hi, kk in table]
            if rows != [list(r) for r in table]:
                out.append((("speculative", "by_batch_size"), rows))
                why.append(f"k by batch size {[list(r) for r in table]} -> {rows} (degrade step {level})")
    return out, why


def degrade_overrides(
    inst: InstancePlan, level: int, degrade: Degrade, because: str | None = None
) -> tuple[Overrides | None, list[str]]:
    """Degrade step ``level`` of ``inst`` as a typed override layer (its values' source reads ``degrade
    step N (because)``), and one reason per setting; None at step 0 (the full profile)."""
    values, why = degrade_values(inst, level, degrade)
    if not values:
        return None, why
    label = f"step {level}" + (f" ({because})" if because else "")
    return Overrides("degrade", label, tuple(values)), why


def degrade_sets(inst: InstancePlan, level: int, degrade: Degrade) -> tuple[list[str], list[str]]:
    """The same step as ``--set`` texts (what an operator would type to pin it: ``hwprofile advise``,
    the docs), and one reason per override."""
    values, why = degrade_values(inst, level, degrade)
    return [f"{'.'.join(path)}={_text(v)}" for path, v in values], why


def _text(v: object) -> str:
    if isinstance(v, list):
        return "[" + ",".join(f"[{lo},{'null' if hi is None else hi},{kk}]" for lo, hi, kk in v) + "]"
    return str(v)
