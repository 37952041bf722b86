"""The GPUs' readings at every tick of the daemon (and of ``bench``'s sampler thread): NVML kept
open, one handle per GPU, through the one NVML chokepoint (:class:`.nvml.Nvml`). Failures are data:
a GPU lost mid-run or NVML failing gives a reading with a status and a reason."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Protocol

from .nvml import FaultCounters, GpuLost, Nvml, NvmlEventSet, NvmlHandle, Unavailable
from .snapshot import decode_clock_event_reasons

LOST_AFTER = 3  # samples in a row in which nothing of a GPU could be read: it is gone
THERMAL_REASONS = ("sw_thermal_slowdown", "hw_thermal_slowdown", "hw_slowdown")
POWER_REASONS = ("sw_power_cap", "hw_power_brake_slowdown")


@dataclass(frozen=True)
class GpuReading:
    """One GPU at one tick. ``status``: ok; partial (some values could not be read: those are None);
    unreadable (none could: not fine, not yet lost); lost."""

    index: int
    at: float
    status: str = "ok"
    temperature_c: float | None = None
    margin_c: float | None = None  # NVML's headroom to the slowdown threshold, where the driver has it
    slowdown_c: float | None = None
    shutdown_c: float | None = None
    sm_clock_mhz: int | None = None
    sm_clock_max_mhz: int | None = None
    reasons: tuple[str, ...] | None = None
    power_draw_watts: float | None = None
    power_limit_watts: float | None = None
    memory_used_bytes: int | None = None
    error: str | None = None
    # hardware faults (None: not read, or the board has no ECC): NVML's volatile counts and flags
    ecc_uncorrected: int | None = None
    ecc_corrected: int | None = None
    retired_pages_pending: bool | None = None
    remapped_rows_pending: bool | None = None
    row_remap_failure: bool | None = None
    xids: tuple[int, ...] = ()  # every XID critical error seen on this GPU since the sampler opened

    @property
    def headroom_c(self) -> float | None:
        if self.margin_c is not None:
            return self.margin_c
        if self.slowdown_c is not None and self.temperature_c is not None:
            return self.slowdown_c - self.temperature_c
        return None


class GpuSource(Protocol):
    """What the daemon reads the GPUs through and lowers their power limits with: a
    :class:`GpuSampler` (NVML), or a test's fake with the same three methods."""

    def sample(self, now: float) -> tuple[GpuReading, ...]: ...

    def power_limits(self, i: int) -> tuple[int | None, int | None, int | None, str | None]: ...

    def set_power_limit(self, i: int, milliwatts: int) -> str | None: ...


class GpuSampler:
    """Keeps NVML open and one handle per GPU; :meth:`sample` reads what changes every tick.

    Thresholds and maximum clocks are read once per GPU. A driver function that answers NOT
    SUPPORTED once (the temperature margin on boards before Ada) is not asked again. A GPU of which
    nothing can be read for :data:`LOST_AFTER` samples in a row (its kept handle answers "invalid
    argument" once the device left the bus, or every call fails) is lost, with the last error: a GPU
    that cannot be read is never reported as fine.
    """

    def __init__(self, indexes: Iterable[int] | None = None) -> None:
        self.nvml = Nvml()
        self.error: str | None = None
        self.handles: dict[int, NvmlHandle] = {}
        self.lost: dict[int, str] = {}
        self._limits: dict[int, tuple[int | None, int | None, int | None]] = {}
        self._no_margin: set[int] = set()
        self._unread: dict[int, int] = {}  # samples in a row that read nothing of the GPU
        self._no_faults: set[int] = set()  # boards that answer none of the fault counters (no ECC)
        self.xids: dict[int, list[int]] = {}
        self.events: NvmlEventSet | None = None
        try:
            self.nvml.open()
        except Unavailable as e:
            self.error = str(e)
            return
        count = self.nvml.count()
        for i in indexes if indexes is not None else range(count):
            try:
                h = self.nvml.handle(i)
            except GpuLost:
                self.lost[i] = "NVML says the GPU is lost"
                continue
            if h is not None:
                self.handles[i] = h
        self.nvml.errors.clear()
        try:
            self.events = self.nvml.xid_events(self.handles)
        except GpuLost:
            self.events = None
        self.events_error = "; ".join(f"{e.where}: {e.message}" for e in self.nvml.errors) or None
        self.nvml.errors.clear()

    def close(self) -> None:
        if self.events is not None:
            self.nvml.free_events(self.events)
            self.events = None
        self.nvml.close()

    def power_limits(self, i: int) -> tuple[int | None, int | None, int | None, str | None]:
        """``(limit, minimum, maximum, error)`` of GPU ``i``'s power limit in mW."""
        h = self.handles.get(i)
        if h is None:
            return None, None, None, self.lost.get(i) or self.error or f"GPU {i} is not watched"
        self.nvml.errors.clear()
        try:
            limit, lo, hi = self.nvml.power_limits(i, h)
        except GpuLost:
            return None, None, None, "NVML answered GPU_IS_LOST"
        err = "; ".join(f"{e.where}: {e.message}" for e in self.nvml.errors) or None
        self.nvml.errors.clear()
        return limit, lo, hi, err

    def set_power_limit(self, i: int, milliwatts: int) -> str | None:
        """Set GPU ``i``'s power limit; the error, or None."""
        h = self.handles.get(i)
        if h is None:
            return self.lost.get(i) or self.error or f"GPU {i} is not watched"
        try:
            err = self.nvml.set_power_limit(i, h, milliwatts)
        except GpuLost:
            err = "NVML answered GPU_IS_LOST"
        self.nvml.errors.clear()
        return err

    def _poll_xids(self) -> None:
        if self.events is None:
            return
        for i, xid in self.nvml.poll_xids(self.events, self.handles):
            self.xids.setdefault(i, []).append(xid)

    def sample(self, now: float) -> tuple[GpuReading, ...]:
        """Every GPU's reading at ``now`` (monotonic seconds, from the caller's clock)."""
        out: list[GpuReading] = []
        for i, why in sorted(self.lost.items()):
            out.append(GpuReading(i, now, status="lost", error=why, xids=tuple(self.xids.get(i, ()))))
        if self.error:
            return tuple(out)
        self._poll_xids()
        self.nvml.errors.clear()
        for i, h in sorted(self.handles.items()):
            try:
                r = self._read(i, h, now)
            except GpuLost:
                r = self._lose(i, now, "NVML answered GPU_IS_LOST")
            else:
                nothing = all(
                    v is None
                    for v in (r.temperature_c, r.sm_clock_mhz, r.power_draw_watts, r.memory_used_bytes)
                )
                self._unread[i] = self._unread.get(i, 0) + 1 if nothing else 0
                if self._unread[i] >= LOST_AFTER:
                    r = self._lose(
                        i, now, f"nothing could be read for {LOST_AFTER} samples in a row: {r.error}"
                    )
                elif nothing:
                    r = GpuReading(i, now, status="unreadable", error=r.error)
            out.append(r)
        return tuple(sorted(out, key=lambda r: r.index))

    def _lose(self, i: int, now: float, why: str) -> GpuReading:
        self.lost[i] = why
        del self.handles[i]
        return GpuReading(i, now, status="lost", error=why, xids=tuple(self.xids.get(i, ())))

    def _read(self, i: int, h: NvmlHandle, now: float) -> GpuReading:
        self.nvml.errors.clear()
        if i not in self._limits:
            self._limits[i] = self.nvml.limits(i, h)
        slowdown, shutdown, sm_max = self._limits[i]
        v = self.nvml.live(i, h, margin=i not in self._no_margin)
        if v.margin is None:
            self._no_margin.add(i)
        f: FaultCounters | None = None
        if i not in self._no_faults:
            f = self.nvml.faults(i, h)
            if all(x is None for x in f.values()):
                self._no_faults.add(i)  # NOT SUPPORTED is an answer: not asked again
        errors = "; ".join(f"{e.where}: {e.message}" for e in self.nvml.errors) or None
        self.nvml.errors.clear()
        draw, limit = v.power_draw, v.power_limit
        return GpuReading(
            index=i,
            at=now,
            status="ok" if errors is None else "partial",
            temperature_c=float(v.temperature) if v.temperature is not None else None,
            margin_c=float(v.margin) if v.margin is not None else None,
            slowdown_c=float(slowdown) if slowdown is not None else None,
            shutdown_c=float(shutdown) if shutdown is not None else None,
            sm_clock_mhz=v.sm_clock,
            sm_clock_max_mhz=sm_max,
            reasons=decode_clock_event_reasons(v.reasons),
            power_draw_watts=draw / 1000 if draw is not None else None,
            power_limit_watts=limit / 1000 if limit is not None else None,
            memory_used_bytes=v.memory_used,
            error=errors,
            ecc_uncorrected=f.ecc_uncorrected if f is not None else None,
            ecc_corrected=f.ecc_corrected if f is not None else None,
            retired_pages_pending=f.retired_pending if f is not None else None,
            remapped_rows_pending=f.remap_pending if f is not None else None,
            row_remap_failure=f.remap_failure if f is not None else None,
            xids=tuple(self.xids.get(i, ())),
        )
