"""Counter increases and histogram quantiles over a sliding window, with counter resets handled
the way Prometheus' ``increase()`` does (a drop means the process restarted from 0)."""

from __future__ import annotations

import itertools
from collections import deque
from collections.abc import Mapping


class CounterWindow:
    """Samples of named counters (monotonic between resets) over the last ``window_s`` seconds."""

    def __init__(self, window_s: float) -> None:
        self.window_s = window_s
        self._samples: deque[tuple[float, dict[str, float]]] = deque()

    def add(self, now: float, values: Mapping[str, float]) -> None:
        self._samples.append((now, dict(values)))
        # keep one sample at or before the window's start, so the increase spans the whole window
        while len(self._samples) >= 2 and now - self._samples[1][0] >= self.window_s:
            self._samples.popleft()

    def reset(self) -> None:
        self._samples.clear()

    @property
    def span_s(self) -> float:
        return self._samples[-1][0] - self._samples[0][0] if len(self._samples) >= 2 else 0.0

    def increase(self, name: str) -> float | None:
        """The counter's increase over the window (None until two samples carry it)."""
        points = [(t, v[name]) for t, v in self._samples if name in v]
        if len(points) < 2:
            return None
        total = 0.0
        for (_, a), (_, b) in itertools.pairwise(points):
            total += b - a if b >= a else b  # a reset: the counter began again from 0
        return total

    def increases(self, prefix: str) -> dict[str, float]:
        names = {n for _, v in self._samples for n in v if n.startswith(prefix)}
        out = {}
        for n in names:
            inc = self.increase(n)
            if inc is not None:
                out[n] = inc
        return out


def histogram_quantile(q: float, buckets: Mapping[float, float]) -> float | None:
    """Prometheus' ``histogram_quantile`` over cumulative bucket counts ``{upper edge: count}``
    (an increase over a window): linear interpolation inside the bucket; None without data."""
    edges = sorted(buckets)
    if not edges:
        return None
    total = buckets[edges[-1]]
    if total <= 0:
        return None
    rank = q * total
    prev_edge, prev_count = 0.0, 0.0
    for edge in edges:
        count = buckets[edge]
        if count >= rank:
            if edge == float("inf"):
                return prev_edge
            width = count - prev_count
            if width <= 0:
                return edge
            return prev_edge + (edge - prev_edge) * (rank - prev_count) / width
        prev_edge, prev_count = edge, count
    return prev_edge
