"""hwprofile's own Prometheus metrics, served on loopback from a private registry.

The collector builds fresh families from the one published :class:`~.watcher.Report` on every
scrape (a GPU or instance gone from the report is gone from /metrics); it reads that immutable
reference only — no NVML, no HTTP, no lock of the loop. Names follow Prometheus' conventions:
``hwprofile_`` prefix, base units in the name, ``_total`` counters, states as labelled gauges.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from ..supervise.lifecycle import State
from .policy import LEVELS

STATES = tuple(s.value for s in State)  # the instance state machine's own states, no other


class Published:
    """The reference the loop swaps after each tick; the exporter and status read it."""

    def __init__(self) -> None:
        self.report: Any = None  # watcher.Report
        self.instance_states: dict[str, str] = {}
        self.restarts: dict[str, int] = {}
        self.actions_total: dict[str, int] = {}
        self.ticks_total = 0
        self.missed_ticks_total = 0
        self.tick_seconds = 0.0


class HwprofileCollector:
    def __init__(self, published: Published) -> None:
        self.published = published

    def describe(self) -> list[Any]:  # no collect() at registration
        return []

    def collect(self) -> Iterator[Any]:
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        p = self.published
        rep = p.report
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
        inst_state = GaugeMetricFamily(
            "hwprofile_instance_state", "1 for the instance's state", labels=["instance", "state"]
        )
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
        restarts = CounterMetricFamily(
            "hwprofile_instance_restarts", "restarts of the instance", labels=["instance"]
        )
        actions = CounterMetricFamily("hwprofile_actions", "actions taken, by kind", labels=["kind"])
        ticks = CounterMetricFamily("hwprofile_ticks", "main-loop ticks")
        missed = CounterMetricFamily("hwprofile_missed_ticks", "ticks that started late")
        tick_s = GaugeMetricFamily("hwprofile_tick_duration_seconds", "time the last tick took")
        if rep is not None:
            for g in rep.gpus:
                r, st, label = g.reading, g.state, str(g.reading.index)
                if r.temperature_c is not None:
                    temp.add_metric([label], r.temperature_c)
                if r.slowdown_c is not None:
                    slow.add_metric([label], r.slowdown_c)
                if r.sm_clock_mhz is not None:
                    clock.add_metric([label], r.sm_clock_mhz * 1e6)
                if r.sm_clock_max_mhz is not None:
                    clock_max.add_metric([label], r.sm_clock_max_mhz * 1e6)
                if r.power_draw_watts is not None:
                    power.add_metric([label], r.power_draw_watts)
                for name, held in st.reason_active_s(g.now).items():
                    reason.add_metric([label, name], 1)
                    reason_s.add_metric([label, name], held)
                current = "gpu_lost" if st.lost else st.level
                for lv in (*LEVELS, "gpu_lost"):
                    thermal.add_metric([label, lv], 1 if lv == current else 0)
            for i in rep.instances:
                degrade.add_metric([i.name], i.degrade_level)
                if i.acceptance_rate is not None:
                    accept.add_metric([i.name], i.acceptance_rate)
        for name, state in p.instance_states.items():
            for s in STATES:
                inst_state.add_metric([name, s], 1 if s == state else 0)
        for name, n in p.restarts.items():
            restarts.add_metric([name], n)
        for kind in ("degrade", "recover"):
            actions.add_metric([kind], p.actions_total.get(kind, 0))
        ticks.add_metric([], p.ticks_total)
        missed.add_metric([], p.missed_ticks_total)
        tick_s.add_metric([], p.tick_seconds)
        yield from (temp, slow, clock, clock_max, power, reason, reason_s, thermal)
        yield from (inst_state, degrade, accept, restarts, actions, ticks, missed, tick_s)


def serve(published: Published, port: int, host: str = "127.0.0.1") -> tuple[Any, Any]:
    """Start the exporter on its own thread; returns (server, thread) so that it can be shut down."""
    from prometheus_client import CollectorRegistry, start_http_server

    registry = CollectorRegistry(auto_describe=False)
    registry.register(HwprofileCollector(published))
    return start_http_server(port, addr=host, registry=registry)


NAMES = (
    "hwprofile_gpu_temperature_celsius",
    "hwprofile_gpu_slowdown_temperature_celsius",
    "hwprofile_gpu_sm_clock_hertz",
    "hwprofile_gpu_sm_clock_max_hertz",
    "hwprofile_gpu_power_watts",
    "hwprofile_gpu_clock_event_reason_active",
    "hwprofile_gpu_clock_event_reason_active_seconds",
    "hwprofile_gpu_thermal_state",
    "hwprofile_instance_state",
    "hwprofile_instance_degrade_level",
    "hwprofile_instance_spec_acceptance_ratio",
    "hwprofile_instance_restarts_total",
    "hwprofile_actions_total",
    "hwprofile_ticks_total",
    "hwprofile_missed_ticks_total",
    "hwprofile_tick_duration_seconds",
)
