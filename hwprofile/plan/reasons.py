"""The Reasons collector: every planned value with why it is what it is and where it came from."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, TypeVar

from ..config import Source
from .types import Reason

if TYPE_CHECKING:
    from .interconnect import Report
    from .predict import Calibration

V = TypeVar("V")


class Reasons:
    """Collects ``(key, value, reason, source)`` for every planned value."""

    def __init__(self, provenance: Mapping[tuple[str, ...], Source]) -> None:
        self.items: list[Reason] = []
        self.provenance = provenance
        # the performance model's candidates per GPU group (plan/candidates.py), and the measured
        # calibration of this host the pipeline handed in (None: the datasheet model alone)
        self.predictions: list[dict[str, Any]] = []
        self.calibration: Calibration | None = None
        # what the pipeline handed in, before the planner checked it measured the model that runs
        # (plan._own_calibration: ``calibration`` is it where it did, else None)
        self.offered_calibration: Calibration | None = None
        self.calibration_not_applied: str | None = None  # the offered one's file and why, where it is not
        # the host's interconnect check record (plan/interconnect.py) when current: its measured link
        # bandwidth replaces the datasheet's in the predictions (None: none recorded, or stale)
        self.interconnect: Report | None = None
        # per GPU group (its indices): the batching layout.objective took (max_num_seqs,
        # max_num_batched_tokens, why), where it replaced the configured one (plan/layout.py)
        self.batching: dict[frozenset[int], tuple[int, int, str]] = {}

    def add(self, key: str, value: V, reason: str, setting: tuple[str, ...] | None = None) -> V:
        """Record ``value`` for ``key``; its source is the layer that set ``setting`` (else the planner)."""
        src = self.provenance.get(setting) if setting else None
        self.items.append(Reason(key, value, reason, str(src) if src else "planner"))
        return value
