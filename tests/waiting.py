"""Waiting in a test for what another thread or process does: :func:`wait_for` polls a condition until
it holds. Its deadline is a ceiling for a loaded two-core machine, never a margin a test's verdict
rests on: a condition that holds ends the wait at once, and only a failing test waits it out."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, TypeVar

T = TypeVar("T")


def wait_for(
    pred: Callable[[], T],
    what: str,
    timeout: float = 60.0,
    why: Callable[[], Any] | None = None,
    *,
    every: float = 0.05,
) -> T:
    """``pred()``'s first true value, asked every ``every`` s; after ``timeout`` s an AssertionError
    naming ``what`` (and ``why()``, when given: what is left, as the test sees it)."""
    end = time.monotonic() + timeout
    while True:
        got = pred()
        if got:
            return got
        if time.monotonic() >= end:
            break
        time.sleep(every)
    raise AssertionError(f"timed out after {timeout:g} s waiting for {what}" + (f":\n{why()}" if why else ""))
