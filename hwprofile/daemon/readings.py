"""What the liveness and drift policies read of an instance at one tick (values, no behaviour): the
evidence a :mod:`.actions` action carries, and the input of :mod:`.policy`'s steps."""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True)
class Progress:
    """One instance's progress in one scrape: ``work``, the requests running plus waiting (None: not
    reported), and ``counters``, the sum of its token counters (None: none reported)."""

    work: float | None
    counters: float | None


@dataclass(frozen=True)
class DriftReading:
    """One instance at one tick: its TPOT (the window's median inter-token latency; None: no tokens in the
    window or not scraped), the requests running and waiting, its process RSS (bytes; None: not read) and
    its ``max_num_seqs`` (the burst threshold's base; None: unknown, so no recycle)."""

    tpot_s: float | None
    running: float | None
    waiting: float | None
    rss_bytes: float | None
    max_num_seqs: int | None = None

    def __post_init__(self) -> None:
        # A scraped figure that is not a finite number (a NaN histogram, +Inf) is no reading: None, so
        # the policy leaves the drift as it was, exactly as for a figure that was not read.
        for name in ("tpot_s", "running", "waiting", "rss_bytes"):
            value = getattr(self, name)
            if value is not None and not math.isfinite(value):
                object.__setattr__(self, name, None)
