"""A clock a test moves by hand (:class:`ManualClock`), injected where the product measures a
deadline (``supervise.Options.clock``): the deadline passes when the test says so, after what it
waits for has happened, however slow a loaded machine makes the processes around it."""

from __future__ import annotations

import threading


class ManualClock:
    """Monotonic seconds that stand still until :meth:`advance` moves them."""

    def __init__(self, start: float = 1000.0) -> None:
        self._now = start
        self._lock = threading.Lock()

    def __call__(self) -> float:
        with self._lock:
            return self._now

    def advance(self, seconds: float) -> None:
        with self._lock:
            self._now += seconds
