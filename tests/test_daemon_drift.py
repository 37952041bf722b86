"""Slow decay: the drift policy over replayed readings (pure, an injected clock), the watcher's one recycle
at a time, and the loop's planned recycle (drain, then the same settings) with fakes: never during a burst,
never two at once, reported where operators look."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hwprofile.config.settings import Watch
from hwprofile.daemon import policy
from hwprofile.daemon.policy import DriftReading, DriftState, drift_step, load_band
from hwprofile.telemetry.metrics import GENERATION, RUNNING, WAITING, VllmMetrics
from hwprofile.telemetry.scrape import InstanceReading

D = Watch(
    drift_baseline_s=600,
    drift_hold_s=300,
    drift_tpot_factor=1.5,
    drift_rss_factor=1.5,
    drift_recycle=True,
    recycle_max_load=0.25,
)
GiB = 2**30


def replay(trace: list[DriftReading | None], s: Watch = D, step: float = 10.0, busy: Any = ()) -> list[tuple]:
    """One reading per ``step`` seconds (None: the same reading as a TPOT and RSS not made); the times of
    the recycles decided with their reasons, and the drift shown at the end."""
    state, out = DriftState(), []
    for i, r in enumerate(trace):
        now = i * step
        r = r if r is not None else DriftReading(None, None, None, None, 64)
        state, why = drift_step(state, r, s, now, busy=i in busy)
        if why:
            out.append((now, why))
    return out


def R(
    tpot_ms: float | None, running: float = 8, rss: float | None = 10 * GiB, waiting: float = 0
) -> DriftReading:
    return DriftReading(None if tpot_ms is None else tpot_ms / 1000, running, waiting, rss, 64)


def test_load_bands_are_powers_of_two() -> None:
    assert [load_band(n) for n in (0, 1, 2, 3, 4, 7, 8, 64)] == [0, 0, 1, 1, 2, 2, 3, 6]


def test_tpot_drift_at_comparable_load_recycles_once_after_the_hold_off_peak() -> None:
    base = [R(20.0)] * 60  # 600 s of baseline at 20 ms, 8 running (16 % of max_num_seqs 64: off-peak)
    decay = [R(35.0)] * 100  # 1.75x from t=600
    got = replay(base + decay)
    assert [t for t, _ in got] == [600.0 + 300]
    why = got[0][1]
    assert "TPOT 35.0 ms is 1.75x its baseline 20.0 ms at 8 request(s) running" in why
    assert "watch.drift_hold_s 300 s" in why and "planned recycle" in why


def test_no_recycle_when_off_and_drift_still_shown() -> None:
    s = Watch(**{**D.__dict__, "drift_recycle": False})
    state = DriftState()
    for i, r in enumerate([R(20.0)] * 60 + [R(40.0)] * 100):
        state, why = drift_step(state, r, s, i * 10.0)
        assert why is None
    shown = policy.drift_shown(state, 1590.0)
    assert shown is not None and shown.startswith("drifting for 990 s: TPOT 40.0 ms is 2.00x")


def test_a_higher_tpot_at_a_higher_load_is_not_drift() -> None:
    # baseline at 2 running; later 32 running with a TPOT three times as high: another band, no baseline
    got = replay([R(10.0, running=2)] * 60 + [R(30.0, running=32)] * 200)
    assert got == []


def test_never_during_a_burst_the_recycle_waits_for_off_peak() -> None:
    burst = [R(40.0, running=8, waiting=30)] * 60  # 38 requests > 25 % of 64
    calm = [R(40.0, running=8)] * 5
    got = replay([R(20.0)] * 60 + burst + calm)
    assert [t for t, _ in got] == [(60 + 60) * 10.0]  # the first off-peak reading after the hold


def test_never_while_busy_and_a_reading_not_made_changes_nothing() -> None:
    trace = [R(20.0)] * 60 + [R(40.0)] * 40 + [None] * 30 + [R(40.0)] * 10
    busy = set(range(60, 135))  # another instance restarting all that time
    got = replay(trace, busy=busy)
    assert [t for t, _ in got] == [1350.0]  # the drift held through the readings not made
    # a reading made without drift ends it: the hold starts again
    got = replay([R(20.0)] * 60 + [R(40.0)] * 20 + [R(21.0)] + [R(40.0)] * 40)
    assert [t for t, _ in got] == [(81 + 30) * 10.0]


def test_a_figure_that_is_not_a_number_is_no_reading() -> None:
    """A NaN or infinite TPOT or RSS (a NaN histogram bucket is valid Prometheus text) neither starts nor
    ends a drift, nor enters the baseline: it is a reading not made."""
    nan, inf = float("nan"), float("inf")
    r = DriftReading(nan, inf, nan, -inf, 64)
    assert (r.tpot_s, r.running, r.waiting, r.rss_bytes) == (None, None, None, None)
    # NaN readings through the baseline and the hold: no drift starts, the baseline is the real one
    trace = [R(20.0)] * 30 + [R(nan)] * 30 + [R(nan, rss=nan)] * 100
    assert replay(trace) == []
    # a drift held through NaN TPOTs (as through readings not made) recycles once, after the hold
    got = replay([R(20.0)] * 60 + [R(40.0)] * 10 + [R(nan)] * 30 + [R(40.0)])
    assert [t for t, _ in got] == [900.0]  # 600 + the 300 s hold: the load of the NaN reading is known


def test_rss_growth_is_drift() -> None:
    rss = [R(None, rss=10 * GiB)] * 60 + [R(None, rss=(10 + i / 4) * GiB) for i in range(100)]
    got = replay(rss)
    # 15 GiB (1.5x) reached at i=20 (t=800), held 300 s
    assert [t for t, _ in got] == [1100.0]
    assert "RSS 23040 MiB is 2.25x its baseline 10240 MiB (watch.drift_rss_factor 1.5)" in got[0][1]


DR = st.one_of(
    st.none(),
    st.tuples(st.sampled_from([10.0, 20.0, 45.0]), st.sampled_from([1, 8, 40]), st.sampled_from([0, 30])),
)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seq=st.lists(DR, min_size=1, max_size=150), busy=st.sets(st.integers(0, 150), max_size=40))
def test_property_a_recycle_only_off_peak_not_busy_once(seq, busy) -> None:
    trace = [None if p is None else R(p[0], running=p[1], waiting=p[2]) for p in seq]
    got = replay([R(20.0, running=8)] * 60 + trace, busy={b + 60 for b in busy})
    assert len(got) <= 1
    for t, _ in got:
        i = int(t // 10)
        r = ([R(20.0)] * 60 + trace)[i]
        assert r is not None and i - 60 not in busy
        assert r.running is not None and r.running + (r.waiting or 0) <= 0.25 * 64


# -- the watcher and the loop ------------------------------------------------------------------------------
BUCKETS = (0.02, 0.04, 0.08, float("inf"))


class Vllm:
    """What one fake instance's /metrics says at each tick: cumulative ITL buckets grown by 100
    observations at ``tpot`` per tick, its running requests."""

    def __init__(self) -> None:
        self.tpot = 0.01
        self.running = 8.0
        self.counts = dict.fromkeys(BUCKETS, 0.0)
        self.tokens = 0.0

    def reading(self, name: str, now: float) -> InstanceReading:
        for b in BUCKETS:
            if self.tpot <= b:
                self.counts[b] += 100
        self.tokens += 100
        m = VllmMetrics(
            "v1", {RUNNING: self.running, WAITING: 0.0}, {GENERATION: self.tokens}, {}, dict(self.counts)
        )
        return InstanceReading(name, "http://x", now, "ok", m)


def test_the_loop_recycles_one_instance_at_a_time_with_the_reason(caplog) -> None:
    from test_overrides import _Inst, _plan, _Sup

    from hwprofile.daemon.loop import Daemon
    from hwprofile.daemon.notify import status_line
    from hwprofile.supervise.lifecycle import State

    class Inst(_Inst):
        def replace(self, inst: Any) -> None:
            super().replace(inst)
            self.state = State.STARTING  # not scraped while it restarts

    s = Watch(window_s=10, drift_baseline_s=60, drift_hold_s=30, drift_recycle=True, recycle_max_load=0.25)
    plan = _plan({"a": 64, "b": 64})
    sup = _Sup(["a", "b"])
    sup.instances = [Inst("a"), Inst("b")]
    servers = {"a": Vllm(), "b": Vllm()}
    t = [0.0]
    rss = {"a": 10 * GiB, "b": 10 * GiB}
    d = Daemon(
        plan,
        lambda sets: plan,
        sup,
        type("S", (), {"sample": lambda self, now: []})(),
        s,
        plan.degrade,
        Path("/nonexistent"),
        clock=lambda: t[0],
        collect=lambda targets, now: {n: servers[n].reading(n, now) for n in targets},
        rss_reader=lambda inst: rss[inst.name],
    )

    def tick(n: int) -> None:
        for _ in range(n):
            d.tick()
            t[0] += 1.0

    with caplog.at_level("WARNING", logger="hwprofile"):
        tick(70)  # the baseline: 10 ms
        assert d.report is not None and all(i.drift is None for i in d.report.instances)
        for v in servers.values():
            v.tpot = 0.06  # both decay at once
        tick(15)  # the window fills with the new TPOT
        assert all(i.drift and "TPOT" in i.drift for i in d.report.instances)
        assert "drifting from baseline: a, b" in status_line(d)
        assert d.document()["instances"][0]["drift"].startswith("drifting for")
        tick(40)  # past the hold: one recycle
        a, b = sup.instances
        assert len(a.got) == 1 and b.got == [], (a.got, b.got)
        (rec,) = [r for r in caplog.records if r.getMessage().startswith("decided: recycle")]
        assert rec.INSTANCE == "a" and rec.ACTION == "recycle" and "slow decay" in rec.getMessage()  # type: ignore[attr-defined]
        servers["b"].running = 60  # a burst on b: its recycle waits even once a is back
        tick(20)
        assert b.got == []  # a is still restarting: b waits
        a.state, a.replacements, a.replacing = State.READY, 1, False
        servers["a"] = Vllm()  # the new process: fast again, a new baseline
        tick(20)
        assert b.got == []  # burst on b
        servers["b"].running = 8
        tick(3)

        assert len(b.got) == 1 and len(a.got) == 1
        assert [(h["kind"], h["instance"], h["outcome"]) for h in d.history][:2] == [
            ("recycle", "a", "started"),
            ("recycle", "a", "done"),
        ]
        assert d.published.actions_total["recycle"] == 2


def test_an_rss_read_of_a_real_process_tree() -> None:
    import os

    from hwprofile.runtime.processes import identify, tree_rss

    ident = identify(os.getpid())
    assert ident is not None
    got = tree_rss(ident)
    assert got is not None and got > 10 * 2**20
    assert tree_rss(type(ident)(ident.pid, ident.start + 1)) is None  # not that process: no reading


@pytest.mark.parametrize("kind", ["recycle"])
def test_the_exporter_names_the_drift(kind: str) -> None:
    from prometheus_client import CollectorRegistry, generate_latest

    from hwprofile.daemon.exporter import HwprofileCollector, Published
    from hwprofile.daemon.watcher import InstanceReport, Report

    pub = Published()
    pub.report = Report(
        0.0, (), (InstanceReport("a", "u", "ok", drift="drifting for 9 s: x", rss_bytes=5e9),)
    )
    pub.actions_total = {kind: 1}
    reg = CollectorRegistry(auto_describe=False)
    reg.register(HwprofileCollector(pub))
    text = generate_latest(reg).decode()
    assert 'hwprofile_instance_drifting{instance="a"} 1.0' in text
    assert 'hwprofile_instance_rss_bytes{instance="a"} 5e+09' in text
    assert 'hwprofile_actions_total{kind="recycle"} 1.0' in text
