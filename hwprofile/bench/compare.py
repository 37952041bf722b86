"""Two plans measured alternately (pure statistics): the per-round ratio B/A of each metric, its
median and its spread. Rounds are paired (A and B of one round ran back to back), so slow drift of
the host (heat, other load) hits both sides of a ratio alike."""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

# metric -> (label, higher is better)
METRICS: dict[str, tuple[str, bool]] = {
    "output_throughput": ("output tokens/s", True),
    "request_throughput": ("requests/s", True),
    "p50_ttft_ms": ("p50 TTFT ms", False),
    "p99_ttft_ms": ("p99 TTFT ms", False),
    "p50_tpot_ms": ("p50 TPOT ms", False),
    "p99_tpot_ms": ("p99 TPOT ms", False),
    "p50_itl_ms": ("p50 ITL ms", False),
    "p99_itl_ms": ("p99 ITL ms", False),
}


@dataclass(frozen=True)
class Spread:
    values: tuple[float, ...]
    median: float
    min: float
    max: float

    @property
    def relative_spread(self) -> float:
        """(max - min) / median: the width of the range as a share of the median (0 with one value)."""
        return (self.max - self.min) / self.median if self.median else 0.0

    def to_json(self) -> dict[str, Any]:
        return {
            "values": list(self.values),
            "median": self.median,
            "min": self.min,
            "max": self.max,
            "relative_spread": self.relative_spread,
        }


def spread(values: Sequence[float]) -> Spread:
    if not values:
        raise ValueError("no values")
    v = tuple(float(x) for x in values)
    return Spread(v, statistics.median(v), min(v), max(v))


@dataclass(frozen=True)
class MetricComparison:
    metric: str
    label: str
    higher_is_better: bool
    a: Spread
    b: Spread
    ratio: Spread  # per round, B / A

    def to_json(self) -> dict[str, Any]:
        return {
            "metric": self.metric,
            "label": self.label,
            "higher_is_better": self.higher_is_better,
            "a": self.a.to_json(),
            "b": self.b.to_json(),
            "ratio_b_over_a": self.ratio.to_json(),
        }

    def sentence(self, a_name: str, b_name: str) -> str:
        r = self.ratio
        if r.min <= 1 <= r.max:
            how = "no clear difference: the rounds' ratios straddle 1"
        else:
            how = f"{b_name} {'better' if (r.median > 1) == self.higher_is_better else 'worse'}"
        return (
            f"{self.label}: {b_name}/{a_name} = {r.median:.3f} (median of {len(r.values)} rounds, "
            f"range {r.min:.3f}-{r.max:.3f}, spread {r.relative_spread:.1%}); {how}"
        )


def compare(
    rounds_a: Sequence[Mapping[str, float]], rounds_b: Sequence[Mapping[str, float]]
) -> list[MetricComparison]:
    """Per metric of :data:`METRICS` present in every round of both: the paired ratios B/A. Rounds
    pair up in order; a metric missing or zero on A's side in some round is left out."""
    if len(rounds_a) != len(rounds_b) or not rounds_a:
        raise ValueError(f"rounds must pair up: {len(rounds_a)} of A, {len(rounds_b)} of B")
    out = []
    for name, (label, higher) in METRICS.items():
        try:
            a = [float(r[name]) for r in rounds_a]
            b = [float(r[name]) for r in rounds_b]
        except (KeyError, TypeError):
            continue
        if any(x == 0 for x in a):
            continue
        out.append(
            MetricComparison(
                name, label, higher, spread(a), spread(b), spread([y / x for x, y in zip(a, b, strict=True)])
            )
        )
    return out
