"""What the hardware did during a run, and what the host is.

:class:`HardwareSampler` is a thread that reads every GPU through the daemon's NVML sampler (the
NVML chokepoint, handles kept) about every 0.5 s while a benchmark runs: per GPU the temperature's
minimum and maximum, the SM clock's minimum and maximum against the card's maximum clock, every
clock-event reason seen, and the seconds a throttling reason (thermal or power: the daemon policy's
``THERMAL_REASONS`` and ``POWER_REASONS``) was on, and the power: draw integrated over the run
(energy, mean, maximum) and the enforced limit's range; tokens/s per watt of a point is its output
throughput over the GPUs' summed mean draw (:func:`per_watt`). A failure (no NVML, a lost GPU, a failing read)
is kept in the tags, never raised. A host without GPUs gets ``status: "no_gpu"``: there is nothing
to sample.

:func:`host_tags` describes the host: GPU names, driver, CPU model and cache sizes (``py-cpuinfo``,
imported here only), vLLM version. :func:`non_default_settings` lists every resolved setting that
differs from its schema default, with where it came from.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from ..host.sampler import POWER_REASONS, THERMAL_REASONS

if TYPE_CHECKING:
    from collections.abc import Iterable

    from ..config import Source
    from ..config.settings import Settings
    from ..host.sampler import GpuReading
    from ..host.snapshot import HostSnapshot

THROTTLE_REASONS = THERMAL_REASONS + POWER_REASONS
INTERVAL_S = 0.5


class ReadingSource(Protocol):
    """What :class:`HardwareSampler` reads the GPUs through: host.sampler's ``GpuSampler``, or a
    test's fake; its ``error`` and ``close()`` are used where it has them."""

    def sample(self, now: float) -> Iterable[GpuReading]: ...


@dataclass
class GpuTrack:
    """One GPU over a run."""

    index: int
    samples: int = 0
    temperature_min_c: float | None = None
    temperature_max_c: float | None = None
    sm_clock_min_mhz: int | None = None
    sm_clock_max_seen_mhz: int | None = None
    sm_clock_max_mhz: int | None = None  # the card's maximum
    reasons_seen: set[str] = field(default_factory=set)
    throttle_reasons_seen: set[str] = field(default_factory=set)
    throttled_s: float = 0.0
    errors: list[str] = field(default_factory=list)
    lost: bool = False
    power_max_w: float | None = None
    power_limit_min_w: float | None = None  # the lowest enforced limit seen (a daemon's power step shows)
    power_limit_max_w: float | None = None
    energy_j: float = 0.0  # power draw integrated over the intervals between readings
    power_s: float = 0.0  # seconds the energy covers
    _last_at: float | None = None

    def add(self, r: GpuReading) -> None:
        dt = r.at - self._last_at if self._last_at is not None else 0.0
        self._last_at = r.at
        if r.status == "lost":
            self.lost = True
            self._error(r.error or "GPU lost")
            return
        self.samples += 1
        if r.error:
            self._error(r.error)
        t = r.temperature_c
        if t is not None:
            self.temperature_min_c = t if self.temperature_min_c is None else min(self.temperature_min_c, t)
            self.temperature_max_c = t if self.temperature_max_c is None else max(self.temperature_max_c, t)
        c = r.sm_clock_mhz
        if c is not None:
            self.sm_clock_min_mhz = c if self.sm_clock_min_mhz is None else min(self.sm_clock_min_mhz, c)
            self.sm_clock_max_seen_mhz = (
                c if self.sm_clock_max_seen_mhz is None else max(self.sm_clock_max_seen_mhz, c)
            )
        if r.sm_clock_max_mhz is not None:
            self.sm_clock_max_mhz = r.sm_clock_max_mhz
        p = r.power_draw_watts
        if p is not None:
            self.power_max_w = p if self.power_max_w is None else max(self.power_max_w, p)
            self.energy_j += p * dt  # the interval that ended with this reading, as the throttled time
            self.power_s += dt
        lim = r.power_limit_watts
        if lim is not None:
            self.power_limit_min_w = (
                lim if self.power_limit_min_w is None else min(self.power_limit_min_w, lim)
            )
            self.power_limit_max_w = (
                lim if self.power_limit_max_w is None else max(self.power_limit_max_w, lim)
            )
        reasons = set(r.reasons or ())
        self.reasons_seen |= reasons
        hit = reasons & set(THROTTLE_REASONS)
        if hit:
            self.throttle_reasons_seen |= hit
            self.throttled_s += dt  # the interval that ended with this reading: an estimate to +-1 interval

    def _error(self, text: str) -> None:
        if text not in self.errors and len(self.errors) < 10:
            self.errors.append(text)

    def to_json(self, name: str | None = None) -> dict[str, Any]:
        return {
            "index": self.index,
            "name": name,
            "samples": self.samples,
            "temperature_c": {"min": self.temperature_min_c, "max": self.temperature_max_c},
            "sm_clock_mhz": {
                "min": self.sm_clock_min_mhz,
                "max": self.sm_clock_max_seen_mhz,
                "card_max": self.sm_clock_max_mhz,
            },
            "clock_event_reasons_seen": sorted(self.reasons_seen),
            "throttle_reasons_seen": sorted(self.throttle_reasons_seen),
            "throttled": bool(self.throttle_reasons_seen),
            "throttled_s": round(self.throttled_s, 3),
            "lost": self.lost,
            "errors": list(self.errors),
            "power_w": {
                "mean": round(self.energy_j / self.power_s, 3) if self.power_s > 0 else None,
                "max": self.power_max_w,
                "limit_min": self.power_limit_min_w,
                "limit_max": self.power_limit_max_w,
            },
            "energy_j": round(self.energy_j, 3) if self.power_s > 0 else None,
        }


class HardwareSampler:
    """``with HardwareSampler(gpu_names) as s: ...`` samples every GPU in a thread; :meth:`tags`
    afterwards. ``gpu_names``: index -> name of the GPUs the host snapshot has (empty: a CPU host,
    nothing is sampled). ``make_sampler`` builds the NVML sampler (tests give a fake)."""

    def __init__(
        self,
        gpu_names: Mapping[int, str | None],
        interval_s: float = INTERVAL_S,
        make_sampler: Callable[[list[int]], ReadingSource] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.names = dict(gpu_names)
        self.interval_s = interval_s
        self._make = make_sampler
        self._clock = clock
        self.tracks: dict[int, GpuTrack] = {i: GpuTrack(i) for i in self.names}
        self.error: str | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._sampler: ReadingSource | None = None
        self._failed = False
        self.started_at: float | None = None
        self.ended_at: float | None = None

    def __enter__(self) -> HardwareSampler:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self) -> None:
        self.started_at = self._clock()
        if not self.names:
            return
        try:
            if self._make is not None:
                self._sampler = self._make(sorted(self.names))
            else:
                from ..host.sampler import GpuSampler

                self._sampler = GpuSampler(sorted(self.names))
        except Exception as e:  # a sampler that cannot start is a tag, not a failed benchmark
            self.error = f"the GPU sampler did not start: {e}"
            return
        error = getattr(self._sampler, "error", None)
        if error:
            self.error = f"NVML: {error}"
        self._sample_once()
        self._thread = threading.Thread(target=self._run, name="hwprofile-bench-nvml", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s) and self._sample_once():
            pass

    def _sample_once(self) -> bool:
        """One reading of every GPU; False (and ``error`` set) once the sampler has failed."""
        if self._sampler is None or self._failed:
            return False
        try:
            for r in self._sampler.sample(self._clock()):
                self.tracks.setdefault(r.index, GpuTrack(r.index)).add(r)
        except Exception as e:  # the sampler's death is visible in the tags, never a failed benchmark
            self._failed = True
            self.error = f"the GPU sampler failed: {type(e).__name__}: {e}"
            return False
        return True

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(5)
            if self._thread.is_alive() and not self.error:
                self.error = "the GPU sampler did not stop within 5 s"
        if self._sampler is not None:
            self._sample_once()  # the last reading covers the run's end
            close = getattr(self._sampler, "close", None)
            if close is not None:
                close()
            self._sampler = None
        self.ended_at = self._clock()

    def tags(self) -> dict[str, Any]:
        """The run's hardware tags (schema ``hardware`` of a run)."""
        gpus = [t.to_json(self.names.get(i)) for i, t in sorted(self.tracks.items())]
        if not self.names:
            status = "no_gpu"
        elif self.error or any(g["samples"] == 0 for g in gpus):
            status = "error"
        elif any(g["errors"] for g in gpus):
            status = "partial"
        else:
            status = "ok"
        return {
            "status": status,
            "error": self.error or (None if status != "error" else "a GPU gave no reading"),
            "interval_s": self.interval_s,
            "seconds": round((self.ended_at or self._clock()) - (self.started_at or 0.0), 3)
            if self.started_at is not None
            else 0.0,
            "throttled": any(g["throttled"] for g in gpus),
            # the GPUs' mean power draw summed (None unless every GPU's draw was read): the watts of
            # ``output_tokens_per_s_per_watt``, which the campaign adds beside the point's throughput
            "power_w_mean": round(sum(g["power_w"]["mean"] for g in gpus), 3)
            if gpus and all(g["power_w"]["mean"] is not None for g in gpus)
            else None,
            "gpus": gpus,
        }


def per_watt(output_tokens_per_s: float | None, hardware: Mapping[str, Any]) -> float | None:
    """Output tokens/s per watt of the GPUs' mean draw during the point (None: a draw not read)."""
    watts = hardware.get("power_w_mean")
    if output_tokens_per_s is None or not watts:
        return None
    return round(output_tokens_per_s / watts, 4)


CPUINFO_CACHE = "bench-cpuinfo.json"  # in $XDG_CACHE_HOME/hwprofile: py-cpuinfo's answer for this boot
CPUINFO_CACHE_CAP = 1 << 20


def _boot_id() -> str | None:
    from ..runtime.files import read_bounded

    try:
        return read_bounded("/proc/sys/kernel/random/boot_id", 64).decode().strip() or None
    except (OSError, UnicodeDecodeError):
        return None


def _probe_cpuinfo() -> dict[str, Any]:
    """``py-cpuinfo``'s answer, kept for the rest of this boot: it runs a second Python that times the
    clock (about a second of CPU), and the brand and cache sizes it reports do not change until the
    machine restarts. A cache that is unreadable, another boot's or malformed is probed again."""
    import json
    import os

    from ..runtime.dirs import cache_dir
    from ..runtime.files import atomic_write, read_bounded

    boot, path = _boot_id(), str(cache_dir() / CPUINFO_CACHE)
    if boot is not None:
        try:
            doc = json.loads(read_bounded(path, CPUINFO_CACHE_CAP, follow=False, owner=os.getuid()).decode())
            if isinstance(doc, dict) and doc.get("boot_id") == boot and isinstance(doc.get("info"), dict):
                return doc["info"]
        except (OSError, UnicodeDecodeError, ValueError):
            pass
    import cpuinfo  # py-cpuinfo: the `bench` extra

    info = {
        k: v for k, v in cpuinfo.get_cpu_info().items() if isinstance(v, (str, int, float, bool, type(None)))
    }
    if boot is not None:
        try:
            os.makedirs(os.path.dirname(path), exist_ok=True)
            atomic_write(path, json.dumps({"boot_id": boot, "info": info}) + "\n", 0o600, durable=False)
        except OSError:
            pass  # no cache: the next bench probes again
    return info


def cpu_info() -> dict[str, Any]:
    """CPU brand and cache sizes in bytes from ``py-cpuinfo`` (``error`` when it is missing or fails);
    probed once per boot (:func:`_probe_cpuinfo`)."""
    try:
        import cpuinfo  # noqa: F401  py-cpuinfo: the `bench` extra
    except ImportError:
        return {"error": "py-cpuinfo is not installed (pip install py-cpuinfo)"}
    try:
        info = _probe_cpuinfo()
    except Exception as e:
        return {"error": f"py-cpuinfo failed: {e}"}

    def size(key: str) -> int | None:
        v = info.get(key)
        return int(v) if isinstance(v, int) else None

    return {
        "brand": info.get("brand_raw") or None,
        "arch": info.get("arch") or None,
        "logical_cpus": info.get("count") if isinstance(info.get("count"), int) else None,
        "l1_data_cache_bytes": size("l1_data_cache_size"),
        "l1_instruction_cache_bytes": size("l1_instruction_cache_size"),
        "l2_cache_bytes": size("l2_cache_size"),
        "l3_cache_bytes": size("l3_cache_size"),
        "error": None,
    }


def host_tags(host: HostSnapshot, cpu: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The host of a benchmark: GPUs, driver, CPU (``cpu`` or :func:`cpu_info`), vLLM."""
    return {
        "hostname": host.hostname,
        "kernel": host.kernel,
        "gpus": [{"index": g.index, "name": g.name, "uuid": g.uuid} for g in host.gpus],
        "driver": host.driver.version,
        "cuda": host.driver.cuda_version,
        "cpu": {"model": host.cpu.model, **(dict(cpu) if cpu is not None else cpu_info())},
        "memory_bytes": host.memory_bytes,
        "vllm_version": host.software.vllm_version,
    }


def non_default_settings(
    settings: Settings, provenance: Mapping[tuple[str, ...], Source]
) -> list[dict[str, Any]]:
    """Every setting whose resolved value differs from its schema default: key, value, default,
    and the layer it came from (a profile file and line, an overrides file, the environment, --set)."""
    from ..config.schema import SETTINGS

    out = []
    for path, f in SETTINGS.items():
        node: Any = settings
        for part in path:
            node = getattr(node, part, None)
        default = list(f.default) if isinstance(f.default, tuple) else f.default
        value = list(node) if isinstance(node, tuple) else node
        if value != default:
            src = provenance.get(path)
            out.append(
                {
                    "key": ".".join(path),
                    "value": value,
                    "default": default,
                    "source": str(src) if src else None,
                }
            )
    return out
