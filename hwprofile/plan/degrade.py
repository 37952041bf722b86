"""Degrade steps as settings: what a hot GPU's instances run with, given as ``--set`` overrides that
go back through the planner (so every degraded value is planned, checked and explained like any
other). Pure: the instance as planned in (an :class:`~.types.InstancePlan`; its JSON is read as one),
overrides and reasons out.

Step ``n`` multiplies ``max_num_seqs`` and ``max_num_batched_tokens`` by the profile's
``degrade.*_factor`` to the power ``n`` (seed 000: 256 → 192 at step 1) and takes
``degrade.num_speculative_tokens_step × n`` proposals off every k (never below 1).
"""

from __future__ import annotations

from ..config.settings import Degrade
from .types import InstancePlan

MIN_SEQS = 1
MIN_BATCHED_TOKENS = 256


def degrade_sets(
    inst: InstancePlan, level: int, degrade: Degrade
) -> tuple[list[str], list[str]]:
    """(``--set`` overrides, one reason per override) for degrade step ``level`` of ``inst``
    (the instance of the full plan). Step 0 is the full profile: no overrides."""
    if level <= 0:
        return [], []
    e = inst.engine
    sets: list[str] = []
    why: list[str] = []
    f_seqs = degrade.max_num_seqs_factor ** level
    seqs = max(MIN_SEQS, int(e.max_num_seqs * f_seqs))
    if seqs != e.max_num_seqs:
        sets.append(f"engine.max_num_seqs={seqs}")
        why.append(f"max_num_seqs {e.max_num_seqs} -> {seqs} (degrade step {level}: x{f_seqs:.3g})")
    f_tok = degrade.max_num_batched_tokens_factor ** level
    tokens = max(MIN_BATCHED_TOKENS, int(e.max_num_batched_tokens * f_tok))
    if tokens != e.max_num_batched_tokens:
        sets.append(f"engine.max_num_batched_tokens={tokens}")
        why.append(
            f"max_num_batched_tokens {e.max_num_batched_tokens} -> {tokens} (degrade step {level}: x{f_tok:.3g})"
        )
    spec = inst.speculative
    cut = degrade.num_speculative_tokens_step * level
    if spec and cut:
        k = int(spec.num_speculative_tokens)
        new_k = max(1, k - cut)
        if new_k != k:
            sets.append(f"speculative.num_speculative_tokens={new_k}")
            why.append(f"num_speculative_tokens {k} -> {new_k} (degrade step {level})")
        table = spec.num_speculative_tokens_per_batch_size  # ABSENT is falsy
        if table:
            rows = [[lo, hi, max(1, kk - cut)] for lo, hi, kk in table]
            if rows != [list(r) for r in table]:
                text = (
                    "[" + ",".join(f"[{lo},{'null' if hi is None else hi},{kk}]" for lo, hi, kk in rows) + "]"
                )
                sets.append(f"speculative.by_batch_size={text}")
                why.append(f"k by batch size {[list(r) for r in table]} -> {rows} (degrade step {level})")
    return sets, why
