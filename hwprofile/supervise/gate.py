"""The start gate: before every start of a GPU instance (the first, a restart after a failure, a
ladder step, a planned replacement: the daemon's degrade, recover and reload), wait until its GPUs'
memory is back, bounded by ``supervise.gpu_free_timeout``.

Why: vLLM measures the free memory once, at start-up. A start onto a GPU whose previous process is
still releasing its memory silently gets a much smaller KV pool (operators' reports,
shared/facts/hybrid.md), fails outright (vLLM's ``request_memory``: free < total x
``gpu_memory_utilization``), or trips vLLM 0.33's profiling assertion when that memory is released
while it profiles ("other processes ... release GPU memory while vLLM is profiling").

When a GPU counts as back (:func:`judge`), both:

1. **back to its baseline**: used memory (total - free) at most :data:`SLACK_BYTES` above what the
   GPU held before this instance's first start (read then, through NVML: nothing hwprofile started
   was on it, since no two instances share a GPU). This catches a process that still holds any of its
   memory: a CUDA context alone is more than the slack. "Free >= what the plan needs" alone would
   pass while a dying process still holds a few GiB on a large card, which vLLM 0.33 then sees
   released under its profiling;
2. **free >= what vLLM will ask**: ``ceil(total x gpu_memory_utilization)`` (vLLM's own start-up
   check). The baseline is read when the supervisor starts the instance, so after ``hwprofile stop``
   and an immediate ``launch`` the old run's leftovers are in it; this catches those.

A reading that failed (NVML error, GPU lost) is unknown, never free: the gate waits until its bound
and then starts anyway, with a warning that names the GPU and the error (vLLM may still start; a
gate that refused would turn an NVML hiccup into an outage). Where NVML cannot be opened at all
(no driver library in this process), the gate cannot work and is skipped with a warning at each start:
waiting the bound for something that can never be read would only delay every start. CPU instances
have no gate. The policy (:func:`judge`) is pure; :class:`StartGate` waits with an injected clock
and sleep, the readings come from :class:`hwprofile.host.gpumem.GpuMemory` (the one NVML
chokepoint) as a callable."""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from ..host.gpumem import MemoryReading

MiB = 2**20
GiB = 2**30
# Used memory above the baseline still counted as back: below one CUDA context (some 300-600 MiB),
# so a process that holds anything at all is seen, above the drift of a desktop or a monitor.
SLACK_BYTES = 256 * MiB
POLL_S = 0.5

Reader = Callable[[Sequence[int]], Mapping[int, MemoryReading]]


@dataclass(frozen=True)
class Verdict:
    """``settled``: every GPU is back; ``waiting``: per GPU not back, why (held memory, or unknown);
    ``unknown``: the GPUs whose reading failed (a subset of ``waiting``'s)."""

    settled: bool
    waiting: tuple[str, ...] = ()
    unknown: tuple[int, ...] = ()

    @property
    def why(self) -> str:
        return "; ".join(self.waiting)


def need_bytes(reading: MemoryReading, utilization: float | None) -> int | None:
    """What vLLM asks of this GPU at start-up (``ceil(total x gpu_memory_utilization)``, the total as
    CUDA counts it), or None."""
    if utilization is None or reading.total_bytes is None:
        return None
    return math.ceil(reading.total_bytes * utilization)


def judge(
    gpus: Sequence[int],
    baseline: Mapping[int, MemoryReading],
    now: Mapping[int, MemoryReading],
    utilization: float | None,
    slack: int = SLACK_BYTES,
) -> Verdict:
    """Are ``gpus`` back (module doc: used within ``slack`` of ``baseline`` and free >= what vLLM
    asks at ``utilization``)? A GPU without a reading now is unknown; one without a known baseline
    is judged on what vLLM asks alone."""
    waiting: list[str] = []
    unknown: list[int] = []
    for g in gpus:
        r = now.get(g)
        if r is None or r.used_bytes is None or r.free_bytes is None:
            unknown.append(g)
            waiting.append(
                f"GPU {g}: memory unknown ({r.error if r is not None and r.error else 'not read'})"
            )
            continue
        base = baseline.get(g)
        if base is not None and base.used_bytes is not None and r.used_bytes > base.used_bytes + slack:
            waiting.append(
                f"GPU {g}: {r.used_bytes / GiB:.2f} GiB used, {base.used_bytes / GiB:.2f} GiB before hwprofile "
                f"started anything on it (a previous process still releasing its memory?)"
            )
            continue
        need = need_bytes(r, utilization)
        if need is not None and r.free_bytes < need:
            waiting.append(
                f"GPU {g}: {r.free_bytes / GiB:.2f} GiB free, vLLM asks {need / GiB:.2f} GiB "
                f"(gpu_memory_utilization {utilization})"
            )
    return Verdict(not waiting, tuple(waiting), tuple(unknown))


@dataclass(frozen=True)
class Passage:
    """How one start passed the gate: ``outcome`` free (every GPU back), timeout (not back within
    the bound: started anyway), unknown (a reading failed until the bound: started anyway), skipped
    (no NVML in this process), stopped (a stop was asked while waiting: not started);
    ``waited_s``; ``why``: what it waited for, or what was not back when it gave up."""

    outcome: str
    waited_s: float = 0.0
    why: str = ""

    @property
    def warning(self) -> str | None:
        """The warning a start that did not find its GPUs back carries (None when they were)."""
        if self.outcome == "timeout":
            return (
                f"started after waiting {self.waited_s:.0f} s (supervise.gpu_free_timeout) for GPU memory "
                f"that was not back: {self.why}; vLLM may have measured a smaller KV cache pool"
            )
        if self.outcome == "unknown":
            return (
                f"started without knowing that the GPUs' memory is back, after {self.waited_s:.0f} s "
                f"(supervise.gpu_free_timeout): {self.why}"
            )
        if self.outcome == "skipped":
            return f"GPU memory not checked before the start: {self.why}"
        return None


def _sleep(s: float) -> bool:
    """``time.sleep``: never asked to stop."""
    time.sleep(s)
    return False


@dataclass
class StartGate:
    """The gate of one instance: ``read`` (the GPUs' memory, a callable from the detection layer),
    ``timeout_s`` (``supervise.gpu_free_timeout``; 0: one look, no wait), ``clock`` and ``sleep``
    (``sleep(s)`` returns True when a stop was asked: the instance's stop event's ``wait``)."""

    read: Reader
    timeout_s: float
    clock: Callable[[], float] = time.monotonic
    sleep: Callable[[float], bool] = field(default=_sleep)
    poll_s: float = POLL_S
    baseline: dict[int, MemoryReading] = field(default_factory=dict)

    def take_baseline(self, gpus: Sequence[int]) -> None:
        """What ``gpus`` hold before this instance first starts; a GPU whose reading fails gets none
        (judged on what vLLM asks alone)."""
        for g, r in self.read(gpus).items():
            if r.used_bytes is not None and g not in self.baseline:
                self.baseline[g] = r

    def wait(
        self, gpus: Sequence[int], utilization: float | None, note: Callable[[str], None] = lambda _m: None
    ) -> Passage:
        """Wait until ``gpus`` are back or the bound passes; ``note(why)`` each time what it waits
        for changes (the instance logs it and shows it in status)."""
        start = self.clock()
        said = ""
        while True:
            now = self.read(gpus)
            if now and all(r.no_nvml for r in now.values()):
                why = next(iter(now.values())).error
                return Passage(
                    "skipped", self.clock() - start, f"NVML cannot be opened in this process ({why})"
                )
            v = judge(gpus, self.baseline, now, utilization)
            waited = self.clock() - start
            if v.settled:
                return Passage("free", waited, said)
            if waited >= self.timeout_s:
                return Passage("unknown" if v.unknown else "timeout", waited, v.why)
            if v.why != said:
                said = v.why
                note(v.why)
            if self.sleep(min(self.poll_s, max(0.0, self.timeout_s - waited))):
                return Passage("stopped", self.clock() - start, v.why)
