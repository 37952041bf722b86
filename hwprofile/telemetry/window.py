"""Counter increases and histogram quantiles over a sliding window, with counter resets handled
the way Prometheus' ``increase()`` does (a drop means the process restarted from 0)."""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping


class CounterWindow:
    """Samples of named counters (monotonic between resets) over the last ``window_s`` seconds.

    Each sample stores, per counter, its reset-adjusted running total (the sum of its increases
    since it was first seen), so an increase over the window is one subtraction, whatever the
    number of samples.
    """

    def __init__(self, window_s: float) -> None:
        self.window_s = window_s
        self._samples: deque[tuple[float, dict[str, float]]] = deque()
        self._raw: dict[str, float] = {}  # the last raw value of each counter
        self._adjusted: dict[str, float] = {}  # its running total with resets undone
        self._carried: dict[str, int] = {}  # samples in the window that carry each counter
        self._born: dict[str, float] = {}  # when each counter was first seen (its running total was 0)

    def add(self, now: float, values: Mapping[str, float]) -> None:
        raw, adj, carried = self._raw, self._adjusted, self._carried
        for name, v in values.items():
            last = raw.get(name)
            if last is None:
                adj[name] = 0.0
                self._born.setdefault(name, now)
            else:
                adj[name] += v - last if v >= last else v  # a drop: the counter began again from 0
            raw[name] = v
            carried[name] = carried.get(name, 0) + 1
        self._samples.append((now, {n: adj[n] for n in values}))
        # keep one sample at or before the window's start, so the increase spans the whole window
        while len(self._samples) >= 2 and now - self._samples[1][0] >= self.window_s:
            _, gone = self._samples.popleft()
            for name in gone:
                carried[name] -= 1

    @property
    def span_s(self) -> float:
        return self._samples[-1][0] - self._samples[0][0] if len(self._samples) >= 2 else 0.0

    def increase(self, name: str) -> float | None:
        """The counter's increase over the window (None until two samples carry it): one subtraction,
        never a scan of the window (but for a counter that went missing at the window's first sample
        after it had been seen, which vLLM's counters never do)."""
        if len(self._samples) < 2 or name not in self._samples[-1][1] or self._carried.get(name, 0) < 2:
            return None
        first_at, first = self._samples[0]
        if name in first:
            start = first[name]
        elif self._born[name] > first_at:
            start = 0.0  # first seen inside the window: its running total began at 0 then
        else:
            start = next(v[name] for _, v in self._samples if name in v)
        return self._samples[-1][1][name] - start

    def increases(self, prefix: str) -> dict[str, float]:
        if not self._samples:
            return {}
        out = {}
        for n in self._samples[-1][1]:
            if n.startswith(prefix):
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
