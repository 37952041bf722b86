"""hwprofile's own Prometheus metrics, served on loopback from a private registry.

The collector builds fresh families from the one published :class:`~.watcher.Report` on every
scrape (a GPU or instance gone from the report is gone from /metrics); it reads that immutable
reference only — no NVML, no HTTP, no lock of the loop. Names follow Prometheus' conventions:
``hwprofile_`` prefix, base units in the name, ``_total`` counters, states as labelled gauges.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import TYPE_CHECKING, Any

from ..supervise.lifecycle import State
from .policy import LEVELS, fault_kinds

if TYPE_CHECKING:
    import threading
    from wsgiref.simple_server import WSGIServer

    from _typeshed.wsgi import StartResponse, WSGIApplication, WSGIEnvironment
    from prometheus_client.metrics_core import Metric

    from .watcher import Report

STATES = tuple(s.value for s in State)  # the instance state machine's own states, no other


class Published:
    """The reference the loop swaps after each tick; the exporter and status read it."""

    def __init__(self) -> None:
        self.report: Report | None = None  # the last tick's
        self.instance_states: dict[str, str] = {}
        self.restarts: dict[str, int] = {}
        self.retry_in: dict[str, float] = {}  # failed instances: seconds until they are tried again
        self.health_failing_s: dict[str, float] = {}  # ready instances whose /health fails: for how long
        self.actions_total: dict[str, int] = {}
        self.front: dict[str, Any] | None = (
            None  # vLLM's router in front of the servers (its state.json record)
        )
        self.ticks_total = 0
        self.missed_ticks_total = 0
        self.tick_seconds = 0.0
        # /health and /livez: why the instances are not to be sent requests (None: they are), and
        # when the last tick ended (time.monotonic; None before the first) with the tick's interval
        self.unready: str | None = "starting"
        # the daemon's own trouble that is no reason to stop sending requests (the runtime directory
        # replaced or not made again: `status` and `reload` cannot find the daemon): said by /health
        self.troubles: tuple[str, ...] = ()
        self.last_tick_at: float | None = None
        self.interval = 1.0


def readiness(p: Published) -> tuple[bool, str]:
    """``/health`` of the metrics port: ready while every instance serves and none is about to be
    drained (a restart in its ``watch.unready_s`` lead, or under way, or the daemon stopping; a failed
    instance is not ready). The daemon's own troubles (:attr:`Published.troubles`) follow the answer,
    on a 200 too: the instances serve, but an operator reading the probe sees them."""
    said = "".join(f"; {t}" for t in p.troubles)
    return (True, "ready" + said) if p.unready is None else (False, p.unready + said)


def liveness(p: Published, now: float) -> tuple[bool, str]:
    """``/livez``: alive while the loop ticks (its last tick ended within ten intervals, at least 30 s;
    before the first tick, alive: the startup probe covers the start)."""
    if p.last_tick_at is None:
        return True, "no tick yet"
    late = now - p.last_tick_at
    limit = max(30.0, 10 * p.interval)
    return (
        late <= limit,
        f"last tick {late:.0f} s ago" + ("" if late <= limit else f" (over {limit:.0f} s)"),
    )


class HwprofileCollector:
    def __init__(self, published: Published) -> None:
        self.published = published

    def describe(self) -> list[Metric]:  # no collect() at registration
        return []

    def collect(self) -> Iterator[Metric]:
        p = self.published
        yield from _front(p.front)
        yield from _gpu_families(p.report)
        yield from _instance_families(p)
        yield from _loop_families(p)


def _gpu_families(rep: Report | None) -> Iterator[Metric]:
    """Per GPU: its readings, clock-event reasons, thermal state and fatal faults."""
    from prometheus_client.core import GaugeMetricFamily

    temp = GaugeMetricFamily("hwprofile_gpu_temperature_celsius", "GPU temperature", labels=["gpu"])
    slow = GaugeMetricFamily(
        "hwprofile_gpu_slowdown_temperature_celsius", "the card's own slowdown threshold", labels=["gpu"]
    )
    clock = GaugeMetricFamily("hwprofile_gpu_sm_clock_hertz", "SM clock", labels=["gpu"])
    clock_max = GaugeMetricFamily("hwprofile_gpu_sm_clock_max_hertz", "maximum SM clock", labels=["gpu"])
    power = GaugeMetricFamily("hwprofile_gpu_power_watts", "power draw", labels=["gpu"])
    reason = GaugeMetricFamily(
        "hwprofile_gpu_clock_event_reason_active",
        "1 while a clock-event (throttle) reason is active",
        labels=["gpu", "reason"],
    )
    reason_s = GaugeMetricFamily(
        "hwprofile_gpu_clock_event_reason_active_seconds",
        "how long the reason has been active",
        labels=["gpu", "reason"],
    )
    thermal = GaugeMetricFamily(
        "hwprofile_gpu_thermal_state", "1 for the GPU's thermal state", labels=["gpu", "state"]
    )
    fault = GaugeMetricFamily(
        "hwprofile_gpu_fault",
        "1 for each fatal hardware fault of the GPU (its instances are drained, not restarted there)",
        labels=["gpu", "kind"],
    )
    ecc = GaugeMetricFamily(
        "hwprofile_gpu_ecc_uncorrected_errors",
        "volatile uncorrectable ECC errors since the driver loaded (absent: no ECC)",
        labels=["gpu"],
    )
    readings = (
        (temp, "temperature_c", 1.0),
        (slow, "slowdown_c", 1.0),
        (clock, "sm_clock_mhz", 1e6),
        (clock_max, "sm_clock_max_mhz", 1e6),
        (power, "power_draw_watts", 1.0),
        (ecc, "ecc_uncorrected", 1.0),
    )
    for g in rep.gpus if rep is not None else ():
        r, st, label = g.reading, g.state, str(g.reading.index)
        for family, attr, scale in readings:
            if (v := getattr(r, attr)) is not None:
                family.add_metric([label], v * scale if scale != 1.0 else v)
        for name, held in st.reason_active_s(g.now).items():
            reason.add_metric([label, name], 1)
            reason_s.add_metric([label, name], held)
        current = st.shown
        for lv in (*LEVELS, "unknown", "gpu_lost"):
            thermal.add_metric([label, lv], 1 if lv == current else 0)
        for kind in fault_kinds(g.faults):
            fault.add_metric([label, kind], 1)
    yield from (temp, slow, clock, clock_max, power, reason, reason_s, thermal, fault, ecc)


def _instance_families(p: Published) -> Iterator[Metric]:
    """Per instance: its state, degrade step, drain, drift, memory, acceptance, restarts and troubles;
    the actions taken, by kind."""
    from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

    inst_state = GaugeMetricFamily(
        "hwprofile_instance_state", "1 for the instance's state", labels=["instance", "state"]
    )
    for name, state in p.instance_states.items():
        for s in STATES:
            inst_state.add_metric([name, s], 1 if s == state else 0)
    reported = _report_families(p)
    troubles = _trouble_families(p)
    actions = CounterMetricFamily("hwprofile_actions", "actions taken, by kind", labels=["kind"])
    for kind in ("degrade", "recover", "restart", "recycle", "drain", "power"):
        actions.add_metric([kind], p.actions_total.get(kind, 0))
    yield from (inst_state, *reported, *troubles, actions)


def _report_families(p: Published) -> tuple[Metric, ...]:
    """What the daemon's report says of each instance: degrade step, drained, drifting, RSS (where read),
    acceptance rate (where speculating); empty families without a report."""
    from prometheus_client.core import GaugeMetricFamily

    degrade = GaugeMetricFamily(
        "hwprofile_instance_degrade_level",
        "degrade step in force (0 = full profile)",
        labels=["instance"],
    )
    accept = GaugeMetricFamily(
        "hwprofile_instance_spec_acceptance_ratio",
        "speculative acceptance rate over the window",
        labels=["instance"],
    )
    drained = GaugeMetricFamily(
        "hwprofile_instance_drained",
        "1 while the instance is drained for a hardware fault",
        labels=["instance"],
    )
    drifting = GaugeMetricFamily(
        "hwprofile_instance_drifting",
        "1 while the instance drifts from its baseline (TPOT at comparable load, RSS): slow decay",
        labels=["instance"],
    )
    rss = GaugeMetricFamily(
        "hwprofile_instance_rss_bytes", "resident memory of the instance's processes", labels=["instance"]
    )
    for i in p.report.instances if p.report is not None else ():
        degrade.add_metric([i.name], i.degrade_level)
        drained.add_metric([i.name], 1 if i.drained else 0)
        drifting.add_metric([i.name], 1 if getattr(i, "drift", None) else 0)
        if (rss_bytes := getattr(i, "rss_bytes", None)) is not None:
            rss.add_metric([i.name], rss_bytes)
        if i.acceptance_rate is not None:
            accept.add_metric([i.name], i.acceptance_rate)
    return degrade, drained, drifting, rss, accept


def _trouble_families(p: Published) -> tuple[Metric, ...]:
    """An instance's restarts, the seconds until a failed one is tried again, and how long its /health
    has been failing."""
    from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

    restarts = CounterMetricFamily(
        "hwprofile_instance_restarts", "restarts of the instance", labels=["instance"]
    )
    for name, n in p.restarts.items():
        restarts.add_metric([name], n)
    retry = GaugeMetricFamily(
        "hwprofile_instance_retry_in_seconds",
        "a failed instance: seconds until it is tried again (absent: not failed, or never retried)",
        labels=["instance"],
    )
    for name, v in p.retry_in.items():
        retry.add_metric([name], v)
    failing = GaugeMetricFamily(
        "hwprofile_instance_health_failing_seconds",
        "how long the instance's /health has been failing (0: it answers)",
        labels=["instance"],
    )
    for name in p.instance_states:
        failing.add_metric([name], p.health_failing_s.get(name, 0.0))
    return restarts, retry, failing


def _loop_families(p: Published) -> Iterator[Metric]:
    """The loop's own: ticks, missed ticks, the last tick's duration."""
    from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

    ticks = CounterMetricFamily("hwprofile_ticks", "main-loop ticks")
    missed = CounterMetricFamily("hwprofile_missed_ticks", "ticks that started late")
    tick_s = GaugeMetricFamily("hwprofile_tick_duration_seconds", "time the last tick took")
    ticks.add_metric([], p.ticks_total)
    missed.add_metric([], p.missed_ticks_total)
    tick_s.add_metric([], p.tick_seconds)
    yield from (ticks, missed, tick_s)


FRONT_STATES = ("waiting", "starting", "ready", "restarting", "stopped")  # supervise.router's states


def _front(front: dict[str, Any] | None) -> Iterator[Metric]:
    """vLLM's router in front of the servers, where the plan has it: its state, restarts and how many
    servers it sees healthy (its own request metrics are on its metrics port: ``metrics_url``)."""
    from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

    if front is None:
        return
    state = GaugeMetricFamily(
        "hwprofile_front_state", "1 for vLLM's router's state", labels=["front", "state"]
    )
    for s in FRONT_STATES:
        state.add_metric(["vllm-router", s], 1 if s == front.get("state") else 0)
    restarts = CounterMetricFamily("hwprofile_front_restarts", "restarts of vLLM's router", labels=["front"])
    restarts.add_metric(["vllm-router"], int(front.get("restarts") or 0))
    yield state
    yield restarts
    if front.get("healthy_servers") is not None:
        healthy = GaugeMetricFamily(
            "hwprofile_front_healthy_servers", "the servers vLLM's router sees healthy", labels=["front"]
        )
        healthy.add_metric(["vllm-router"], int(front["healthy_servers"]))
        yield healthy


def app(published: Published, clock: Callable[[], float] | None = None) -> WSGIApplication:
    """The WSGI application of the metrics port: ``/metrics`` (prometheus_client's own application),
    ``/health`` (:func:`readiness`: 200 or 503 with the reason) and ``/livez`` (:func:`liveness`)."""
    import time

    from prometheus_client import CollectorRegistry, make_wsgi_app

    registry = CollectorRegistry(auto_describe=False)
    registry.register(HwprofileCollector(published))
    metrics = make_wsgi_app(registry)
    now = clock or time.monotonic

    def route(environ: WSGIEnvironment, start_response: StartResponse) -> Iterable[bytes]:
        path = environ.get("PATH_INFO") or "/"
        if path in ("/health", "/livez"):
            ok, why = readiness(published) if path == "/health" else liveness(published, now())
            body = (why + "\n").encode()
            start_response(
                "200 OK" if ok else "503 Service Unavailable",
                [("Content-Type", "text/plain; charset=utf-8"), ("Content-Length", str(len(body)))],
            )
            return [body]
        return metrics(environ, start_response)

    return route


def serve(published: Published, port: int, host: str = "127.0.0.1") -> tuple[WSGIServer, threading.Thread]:
    """Start the metrics port (:func:`app`) on its own thread; returns (server, thread) so that it can
    be shut down. Each request on a thread of its own (a slow scraper never holds the probes up)."""
    import socket
    import socketserver
    import threading
    from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

    class Server(socketserver.ThreadingMixIn, WSGIServer):
        daemon_threads = True
        address_family = socket.AF_INET6 if ":" in host else socket.AF_INET

    class Quiet(WSGIRequestHandler):
        def log_message(self, format: str, *args: Any) -> None:  # probes every few seconds: not logged
            pass

    server = make_server(host, port, app(published), Server, Quiet)
    thread = threading.Thread(target=server.serve_forever, name="hwprofile-metrics", daemon=True)
    thread.start()
    return server, thread


NAMES = (
    "hwprofile_gpu_temperature_celsius",
    "hwprofile_gpu_slowdown_temperature_celsius",
    "hwprofile_gpu_sm_clock_hertz",
    "hwprofile_gpu_sm_clock_max_hertz",
    "hwprofile_gpu_power_watts",
    "hwprofile_gpu_clock_event_reason_active",
    "hwprofile_gpu_clock_event_reason_active_seconds",
    "hwprofile_gpu_thermal_state",
    "hwprofile_gpu_fault",
    "hwprofile_gpu_ecc_uncorrected_errors",
    "hwprofile_instance_state",
    "hwprofile_instance_degrade_level",
    "hwprofile_instance_drained",
    "hwprofile_instance_drifting",
    "hwprofile_instance_rss_bytes",
    "hwprofile_instance_spec_acceptance_ratio",
    "hwprofile_instance_restarts_total",
    "hwprofile_instance_retry_in_seconds",
    "hwprofile_instance_health_failing_seconds",
    "hwprofile_actions_total",
    "hwprofile_front_state",
    "hwprofile_front_restarts_total",
    "hwprofile_front_healthy_servers",
    "hwprofile_ticks_total",
    "hwprofile_missed_ticks_total",
    "hwprofile_tick_duration_seconds",
)
