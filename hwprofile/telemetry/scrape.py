"""vLLM's ``/metrics`` scraped: one path for every user (the daemon's tick, ``watch``, ``bench``'s
counter deltas, ``plan --advice-from``), :class:`Scraper`, over one kept-alive connection per server
(a new TCP connection and urllib's handler chain every second cost more CPU than the parse), never
through a proxy, bounded in time and size. Failures are data: an unreachable or metrics-less server
gives a reading with a status and a reason."""

from __future__ import annotations

import http.client
import time
import urllib.parse
from dataclasses import dataclass
from typing import Any

from .http import Client, TooLarge, redact
from .metrics import MetricsError, Parser, VllmMetrics

# A scrape must finish well inside one tick (the loop's watchdog ping waits for it).
SCRAPE_TIMEOUT_S = 0.5
MAX_METRICS_BYTES = 8 << 20


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
    """``/metrics`` GETs over one kept-alive HTTP connection per server; :meth:`__call__` is one
    scrape (an :class:`InstanceReading`, never an exception). :func:`scrape` is a one-off."""

    def __init__(self, timeout: float = SCRAPE_TIMEOUT_S) -> None:
        self.timeout = timeout
        self._clients: dict[str, Client] = {}  # per server (scheme://host:port)
        self._parsers: dict[str, Parser] = {}  # per URL: an unchanged body is not parsed again

    def close(self) -> None:
        for c in self._clients.values():
            c.close()
        self._clients.clear()

    def _get(self, url: str) -> bytes:
        parts = urllib.parse.urlsplit(url)
        key = f"{parts.scheme}://{parts.netloc}"
        client = self._clients.get(key)
        if client is None:
            client = self._clients[key] = Client(key, self.timeout)
        status, body = client.request(
            (parts.path.rstrip("/")) + "/metrics", {"Accept": "text/plain"}, cap=MAX_METRICS_BYTES
        )
        if status != 200:
            raise OSError(f"HTTP {status}")
        return body

    def __call__(self, name: str, url: str, now: float) -> InstanceReading:
        """One scrape of ``url``/metrics at ``now`` (the caller's clock)."""
        t0 = time.perf_counter()
        target = url.rstrip("/") + "/metrics"
        try:
            body = self._get(url)
        except TooLarge:
            return InstanceReading(
                name, url, now, "error", error=f"{target}: more than {MAX_METRICS_BYTES} bytes"
            )
        except (http.client.HTTPException, OSError, ValueError) as e:
            return InstanceReading(name, url, now, "unreachable", error=f"{redact(target)}: {e}")
        try:
            parser = self._parsers.get(url)
            if parser is None:
                parser = self._parsers[url] = Parser()
            m = parser(body.decode("utf-8", "replace"))
        except MetricsError as e:
            return InstanceReading(name, url, now, "error", error=f"{target}: {e}")
        took = time.perf_counter() - t0
        if m.metrics_disabled:
            why = (
                f"{target} has no vllm:* series (the server runs with --disable-log-stats): nothing to judge"
            )
            return InstanceReading(name, url, now, "metrics_disabled", m, why, took)
        return InstanceReading(name, url, now, "ok", m, None, took)


def scrape(name: str, url: str, now: float, timeout: float = SCRAPE_TIMEOUT_S) -> InstanceReading:
    """One scrape on a connection of its own (``watch --once``, ``plan --advice-from``, bench)."""
    scraper = Scraper(timeout)
    try:
        return scraper(name, url, now)
    finally:
        scraper.close()


class ScrapePool:
    """Every instance's ``/metrics`` at once, each on a thread and a kept connection of its own:
    one slow or hung server never delays the others, the GPU readings or the loop's watchdog ping.

    :meth:`collect` starts a scrape for each target whose previous one has finished, waits at most
    ``wait_s`` (a little more than one scrape's own deadline), and answers for every target: the
    scrapes that finished, and for one still running a reading that says so (status
    ``unreachable``); that scrape is not started again until it ended."""

    def __init__(self, timeout: float = SCRAPE_TIMEOUT_S, wait_s: float | None = None) -> None:
        from concurrent.futures import ThreadPoolExecutor

        self.timeout = timeout
        self.wait_s = wait_s if wait_s is not None else timeout + 0.2
        self._pool = ThreadPoolExecutor(max_workers=32, thread_name_prefix="scrape")
        self._scrapers: dict[str, Scraper] = {}
        self._running: dict[str, tuple[Any, float]] = {}  # name -> (future, when it started)

    def collect(self, targets: dict[str, str], now: float) -> dict[str, InstanceReading]:
        import concurrent.futures as cf

        started = []
        for name, url in targets.items():
            if name not in self._running:
                scraper = self._scrapers.get(name)
                if scraper is None:
                    scraper = self._scrapers[name] = Scraper(self.timeout)
                self._running[name] = (self._pool.submit(scraper, name, url, now), time.monotonic())
                started.append(self._running[name][0])
        # only the scrapes started now are waited for: one still running from an earlier call (a server
        # that hangs or trickles) is known to be slow, and is not waited for again at every tick
        cf.wait(started, timeout=self.wait_s)
        out: dict[str, InstanceReading] = {}
        for name, url in targets.items():
            future, since = self._running[name]
            if not future.done():
                waited = time.monotonic() - since
                out[name] = InstanceReading(
                    name,
                    url,
                    now,
                    "unreachable",
                    error=f"{redact(url)}/metrics: still no answer after {waited:.1f} s",
                )
                continue
            del self._running[name]
            try:
                out[name] = future.result()
            except Exception as e:  # a scrape never raises; if it ever does, it is a reading too
                out[name] = InstanceReading(
                    name, url, now, "error", error=f"scrape failed: {type(e).__name__}: {e}"
                )
        return out

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
        for s in self._scrapers.values():
            s.close()
