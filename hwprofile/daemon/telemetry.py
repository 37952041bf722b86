"""One sample per tick: every GPU through the NVML chokepoint (handles kept, not a new detection),
every vLLM instance's ``/metrics``. Failures are data: a GPU lost mid-run or NVML failing gives a
reading with a status and a reason; an unreachable or metrics-less server likewise."""

from __future__ import annotations

import http.client
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from ..host.nvml import GpuLost, Nvml, Unavailable
from ..host.snapshot import decode_clock_event_reasons
from ..supervise.http import urlopen
from .policy import GpuReading
from .vllm_metrics import MetricsError, VllmMetrics, parse

# A scrape must finish well inside one tick (the loop's watchdog ping waits for it).
SCRAPE_TIMEOUT_S = 0.5
MAX_METRICS_BYTES = 8 << 20


class GpuSampler:
    """Keeps NVML open and one handle per GPU; :meth:`sample` reads what changes every tick.

    Thresholds and maximum clocks are read once per GPU. A driver function that answers NOT
    SUPPORTED once (the temperature margin on boards before Ada) is not asked again.
    """

    def __init__(self, indexes: Iterable[int] | None = None) -> None:
        self.nvml = Nvml()
        self.error: str | None = None
        self.handles: dict[int, Any] = {}
        self.lost: dict[int, str] = {}
        self._static: dict[int, dict[str, Any]] = {}
        self._no_margin: set[int] = set()
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

    def close(self) -> None:
        self.nvml.close()

    def _static_of(self, i: int, h: Any) -> dict[str, Any]:
        st = self._static.get(i)
        if st is None:
            n, w = self.nvml._n, f"gpu[{i}]"
            st = {
                "slowdown_c": self.nvml.call(
                    f"{w}.temperature_slowdown",
                    "nvmlDeviceGetTemperatureThreshold",
                    h,
                    n.NVML_TEMPERATURE_THRESHOLD_SLOWDOWN,
                    quiet=True,
                ),
                "shutdown_c": self.nvml.call(
                    f"{w}.temperature_shutdown",
                    "nvmlDeviceGetTemperatureThreshold",
                    h,
                    n.NVML_TEMPERATURE_THRESHOLD_SHUTDOWN,
                    quiet=True,
                ),
                "sm_clock_max_mhz": self.nvml.call(
                    f"{w}.sm_clock_max", "nvmlDeviceGetMaxClockInfo", h, n.NVML_CLOCK_SM, quiet=True
                ),
            }
            self._static[i] = st
        return st

    def sample(self, now: float) -> tuple[GpuReading, ...]:
        """Every GPU's reading at ``now`` (monotonic seconds, from the caller's clock)."""
        out: list[GpuReading] = []
        for i, why in sorted(self.lost.items()):
            out.append(GpuReading(i, now, status="lost", error=why))
        if self.error:
            return tuple(out)
        for i, h in sorted(self.handles.items()):
            try:
                out.append(self._read(i, h, now))
            except GpuLost:
                self.lost[i] = "NVML answered GPU_IS_LOST"
                del self.handles[i]
                out.append(GpuReading(i, now, status="lost", error=self.lost[i]))
        return tuple(sorted(out, key=lambda r: r.index))

    def _read(self, i: int, h: Any, now: float) -> GpuReading:
        n, w, call = self.nvml._n, f"gpu[{i}]", self.nvml.call
        self.nvml.errors.clear()
        st = self._static_of(i, h)
        temp = call(f"{w}.temperature", "nvmlDeviceGetTemperature", h, n.NVML_TEMPERATURE_GPU)
        margin = None
        if i not in self._no_margin:
            margin = call(f"{w}.temperature_margin", "nvmlDeviceGetMarginTemperature", h, quiet=True)
            if margin is None:
                self._no_margin.add(i)
        mask = call(
            f"{w}.clocks_event_reasons",
            ("nvmlDeviceGetCurrentClocksEventReasons", "nvmlDeviceGetCurrentClocksThrottleReasons"),
            h,
        )
        clock = call(f"{w}.sm_clock", "nvmlDeviceGetClockInfo", h, n.NVML_CLOCK_SM)
        draw = call(f"{w}.power_draw", "nvmlDeviceGetPowerUsage", h)
        limit = call(
            f"{w}.power_limit", ("nvmlDeviceGetEnforcedPowerLimit", "nvmlDeviceGetPowerManagementLimit"), h
        )
        mem = call(f"{w}.memory", "nvmlDeviceGetMemoryInfo", h)
        errors = "; ".join(f"{e.where}: {e.message}" for e in self.nvml.errors) or None
        self.nvml.errors.clear()
        return GpuReading(
            index=i,
            at=now,
            status="ok" if errors is None else "partial",
            temperature_c=float(temp) if temp is not None else None,
            margin_c=float(margin) if margin is not None else None,
            slowdown_c=float(st["slowdown_c"]) if st["slowdown_c"] is not None else None,
            shutdown_c=float(st["shutdown_c"]) if st["shutdown_c"] is not None else None,
            sm_clock_mhz=clock,
            sm_clock_max_mhz=st["sm_clock_max_mhz"],
            reasons=decode_clock_event_reasons(mask),
            power_draw_watts=draw / 1000 if draw is not None else None,
            power_limit_watts=limit / 1000 if limit is not None else None,
            memory_used_bytes=int(mem.used) if mem is not None else None,
            error=errors,
        )


# -- vLLM /metrics --------------------------------------------------------------------------------



@dataclass(frozen=True)
class InstanceReading:
    """One scrape of one server. ``status``: ok, metrics_disabled, unreachable, error."""

    name: str
    url: str
    at: float
    status: str
    metrics: VllmMetrics | None = None
    error: str | None = None
    scrape_s: float | None = None


class Scraper:
    """``/metrics`` GETs over one kept-alive HTTP connection per server (a new TCP connection and
    urllib's handler chain every second cost more CPU than the parse); never through a proxy."""

    def __init__(self, timeout: float = SCRAPE_TIMEOUT_S) -> None:
        self.timeout = timeout
        self._conns: dict[str, http.client.HTTPConnection] = {}

    def close(self) -> None:
        for c in self._conns.values():
            c.close()
        self._conns.clear()

    def _get(self, url: str) -> bytes:
        parts = urllib.parse.urlsplit(url)
        if parts.scheme != "http" or not parts.hostname:
            raise ValueError(f"only http:// URLs are scraped, not {url!r}")
        key = f"{parts.hostname}:{parts.port or 80}"
        path = (parts.path.rstrip("/") or "") + "/metrics"
        for attempt in (0, 1):  # a kept connection the server closed meanwhile: one fresh try
            conn = self._conns.get(key)
            if conn is None:
                conn = self._conns[key] = http.client.HTTPConnection(
                    parts.hostname, parts.port or 80, timeout=self.timeout
                )
            try:
                conn.request("GET", path, headers={"Accept": "text/plain"})
                resp = conn.getresponse()
                body = resp.read(MAX_METRICS_BYTES + 1)
                if resp.will_close:
                    conn.close()
                    del self._conns[key]
                if resp.status != 200:
                    raise OSError(f"HTTP {resp.status}")
                return body
            except (http.client.HTTPException, OSError):
                conn.close()
                self._conns.pop(key, None)
                if attempt:
                    raise
        raise OSError("unreachable")  # not reached

    def __call__(self, name: str, url: str, now: float) -> InstanceReading:
        return scrape(name, url, now, self.timeout, self._get)


def scrape(
    name: str,
    url: str,
    now: float,
    timeout: float = SCRAPE_TIMEOUT_S,
    get: Any = None,
) -> InstanceReading:
    """GET ``url``/metrics, never through a proxy (loopback), bounded in time and size."""
    t0 = time.perf_counter()
    target = url.rstrip("/") + "/metrics"
    try:
        if get is not None:
            body = get(url)
        else:
            with urlopen(target, timeout=timeout) as resp:
                body = resp.read(MAX_METRICS_BYTES + 1)
    except (urllib.error.URLError, http.client.HTTPException, OSError, ValueError) as e:
        reason = getattr(e, "reason", e)
        return InstanceReading(name, url, now, "unreachable", error=f"{target}: {reason}")
    if len(body) > MAX_METRICS_BYTES:
        return InstanceReading(
            name, url, now, "error", error=f"{target}: more than {MAX_METRICS_BYTES} bytes"
        )
    try:
        m = parse(body.decode("utf-8", "replace"))
    except MetricsError as e:
        return InstanceReading(name, url, now, "error", error=f"{target}: {e}")
    took = time.perf_counter() - t0
    if m.metrics_disabled:
        return InstanceReading(
            name,
            url,
            now,
            "metrics_disabled",
            m,
            f"{target} has no vllm:* series (the server runs with --disable-log-stats): nothing to judge",
            took,
        )
    return InstanceReading(name, url, now, "ok", m, None, took)
