"""The GPUs' memory, read before each start of an instance (the start gate,
:mod:`hwprofile.supervise.gate`): NVML opened once, one handle per GPU, through the one NVML
chokepoint (:class:`.nvml.Nvml`). A reading that failed says why and has no figures: unknown, never
free."""

from __future__ import annotations

import threading
from collections.abc import Iterable
from dataclasses import dataclass

from .nvml import GpuLost, Nvml, NvmlHandle, Unavailable


@dataclass(frozen=True)
class MemoryReading:
    """One GPU's memory now: ``total_bytes`` and ``free_bytes`` as CUDA counts them (NVML's total less
    the driver's reservation, which NVML's free excludes too: :meth:`hwprofile.host.nvml.Nvml.memory`);
    both None with ``error`` when it could not be read."""

    index: int
    total_bytes: int | None = None
    free_bytes: int | None = None
    error: str | None = None
    no_nvml: bool = False  # NVML cannot be opened in this process at all (no library, no driver)

    @property
    def used_bytes(self) -> int | None:
        """What every process holds: total - free (the driver's reservation too, where NVML's memory v1
        could not say it apart)."""
        if self.total_bytes is None or self.free_bytes is None:
            return None
        return self.total_bytes - self.free_bytes


class GpuMemory:
    """Reads GPUs' memory on demand (:meth:`read`), from any thread. NVML is opened at the first
    read; where it cannot be opened at all, :attr:`unavailable` says why (every reading then carries
    that error)."""

    def __init__(self) -> None:
        self._nvml: Nvml | None = None
        self._handles: dict[int, NvmlHandle] = {}
        self._lock = threading.Lock()
        self.unavailable: str | None = None

    def _open(self) -> Nvml | None:
        if self._nvml is None and self.unavailable is None:
            nvml = Nvml()
            try:
                nvml.open()
            except Unavailable as e:
                self.unavailable = str(e)
                return None
            self._nvml = nvml
        return self._nvml

    def __call__(self, indexes: Iterable[int]) -> dict[int, MemoryReading]:
        return self.read(indexes)

    def read(self, indexes: Iterable[int]) -> dict[int, MemoryReading]:
        """Each GPU of ``indexes`` (NVML indexes, as a plan's ``gpus``) now."""
        with self._lock:
            nvml = self._open()
            out: dict[int, MemoryReading] = {}
            for i in indexes:
                if nvml is None:
                    out[i] = MemoryReading(i, error=f"NVML: {self.unavailable}", no_nvml=True)
                    continue
                nvml.errors.clear()
                try:
                    h = self._handles.get(i)
                    if h is None:
                        h = nvml.handle(i)
                        if h is not None:
                            self._handles[i] = h
                    got = nvml.memory(i, h) if h is not None else None
                except GpuLost:
                    self._handles.pop(i, None)
                    out[i] = MemoryReading(i, error="NVML says the GPU is lost")
                    continue
                if got is None:
                    why = "; ".join(f"{e.where}: {e.message}" for e in nvml.errors) or "no answer"
                    self._handles.pop(i, None)  # asked again next time: a handle that went stale
                    out[i] = MemoryReading(i, error=why)
                else:
                    out[i] = MemoryReading(i, total_bytes=got[0], free_bytes=got[1])
            return out

    def close(self) -> None:
        with self._lock:
            if self._nvml is not None:
                self._nvml.close()
                self._nvml = None
                self._handles.clear()
