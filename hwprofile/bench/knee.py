"""The saturation sweep's knee (pure): the highest concurrency up to which p99 TTFT stays within the
target, reported as the recommended ``max_num_seqs`` with the evidence of every point.

The knee is taken before the first point that breaks the target, even when a later point meets it
again (noise, or a batch the scheduler happened to favour): a recommendation must hold on the way up.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class SweepPoint:
    concurrency: int
    p99_ttft_ms: float
    output_throughput: float  # tokens/s


@dataclass(frozen=True)
class Knee:
    target_ms: float
    recommended_max_num_seqs: int | None  # None: even concurrency 1 breaks the target
    breaks_at: int | None  # the first concurrency over the target; None: none did
    verdict: str
    evidence: tuple[str, ...] = field(default_factory=tuple)

    def to_json(self) -> dict[str, Any]:
        return {
            "target_ms": self.target_ms,
            "recommended_max_num_seqs": self.recommended_max_num_seqs,
            "breaks_at": self.breaks_at,
            "verdict": self.verdict,
            "evidence": list(self.evidence),
        }


def find_knee(
    points: Sequence[SweepPoint], target_ms: float, planned_max_num_seqs: int | None = None
) -> Knee:
    """The knee of a sweep (points in any order; one per concurrency). ``planned_max_num_seqs``, the
    plan's value, is compared with the recommendation in the verdict."""
    if not points:
        return Knee(target_ms, None, None, "no sweep points: nothing to judge")
    pts = sorted(points, key=lambda p: p.concurrency)
    first_bad = next((p for p in pts if p.p99_ttft_ms > target_ms), None)
    good = [p for p in pts if first_bad is None or p.concurrency < first_bad.concurrency]
    evidence = _point_evidence(pts, target_ms, first_bad)
    if not good:
        assert first_bad is not None
        return Knee(
            target_ms,
            None,
            first_bad.concurrency,
            f"p99 TTFT {first_bad.p99_ttft_ms:.1f} ms already at concurrency {first_bad.concurrency} breaks the "
            f"{target_ms:g} ms target: no max_num_seqs meets it on this host (a faster host, a smaller model, "
            "shorter prompts, or a looser bench.ttft_p99_target_ms)",
            tuple(evidence),
        )
    knee = good[-1]
    peak = max(pts, key=lambda p: p.output_throughput)
    if peak.output_throughput > 0:
        evidence.append(
            f"throughput at the knee {knee.output_throughput:.1f} tokens/s = "
            f"{knee.output_throughput / peak.output_throughput:.0%} of the sweep's peak "
            f"{peak.output_throughput:.1f} tokens/s (concurrency {peak.concurrency})"
        )
    verdict = _verdict(knee, first_bad, target_ms, planned_max_num_seqs)
    return Knee(
        target_ms, knee.concurrency, first_bad.concurrency if first_bad else None, verdict, tuple(evidence)
    )


def _point_evidence(pts: Sequence[SweepPoint], target_ms: float, first_bad: SweepPoint | None) -> list[str]:
    """One line per point (sorted by concurrency) against the target, and a note on points that met
    it again after the first break (not counted)."""
    evidence = []
    for p in pts:
        ok = p.p99_ttft_ms <= target_ms
        evidence.append(
            f"concurrency {p.concurrency}: p99 TTFT {p.p99_ttft_ms:.1f} ms {'<=' if ok else '>'} "
            f"{target_ms:g} ms, {p.output_throughput:.1f} output tokens/s"
        )
    if first_bad is not None:
        later_ok = [
            p.concurrency for p in pts if p.concurrency > first_bad.concurrency and p.p99_ttft_ms <= target_ms
        ]
        if later_ok:
            evidence.append(
                f"concurrency {', '.join(map(str, later_ok))} met the target again after {first_bad.concurrency} "
                "broke it: not counted (the knee is the first break)"
            )
    return evidence


def _verdict(
    knee: SweepPoint, first_bad: SweepPoint | None, target_ms: float, planned_max_num_seqs: int | None
) -> str:
    """The recommendation in words, compared with the plan's max_num_seqs when given."""
    if first_bad is None:
        verdict = (
            f"p99 TTFT stays within {target_ms:g} ms up to the sweep's top, concurrency {knee.concurrency}: "
            f"recommended max_num_seqs >= {knee.concurrency} (the knee is above it; raise bench.sweep_max to find it)"
        )
    else:
        verdict = (
            f"p99 TTFT breaks {target_ms:g} ms beyond concurrency {knee.concurrency} "
            f"({first_bad.p99_ttft_ms:.1f} ms at {first_bad.concurrency}): recommended max_num_seqs {knee.concurrency}"
        )
    if planned_max_num_seqs is not None:
        if first_bad is not None and planned_max_num_seqs > knee.concurrency:
            verdict += f"; the plan has {planned_max_num_seqs} (--set engine.max_num_seqs={knee.concurrency})"
        else:
            verdict += f"; the plan has {planned_max_num_seqs}"
    return verdict
