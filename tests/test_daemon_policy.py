"""The daemon's pure policy over replayed traces with an injected clock: thermal states with
hysteresis and dwell, actions with rate limits, speculation health and k advice."""

from __future__ import annotations

import random

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hwprofile.config.settings import Watch
from hwprofile.daemon import policy
from hwprofile.daemon.policy import (
    InstanceActionState,
    SpecWindow,
    ThermalState,
    advise_k,
    expected_gain,
)
from hwprofile.host.sampler import GpuReading

S = Watch(hot_c=82, warm_c=75, critical_c=88, hysteresis_c=3, dwell_s=3, throttle_s=5, recover_s=120)
A800 = {"slowdown_c": 95.0, "shutdown_c": 100.0}  # far above the profile's thresholds: they decide


def run(trace, settings=S, gpus=(0,), start=0.0, step=1.0, extra=None):
    """Replay ``trace`` (one temperature, or a dict of reading fields, per second) through the
    thermal step and the action decisions; return (states per tick, actions, deferred)."""
    thermal: dict[int, ThermalState] = {}
    acts: dict[str, InstanceActionState] = {}
    levels, actions, deferred = [], [], []
    for i, point in enumerate(trace):
        now = start + i * step
        fields = point if isinstance(point, dict) else {"temperature_c": float(point)}
        for g in gpus:
            r = GpuReading(g, now, **{**A800, **(extra or {}), **fields})
            thermal[g], _ = policy.thermal_step(thermal.get(g, ThermalState()), r, settings, now)
        d = policy.decide_actions({"vllm-gpu0": gpus}, thermal, acts, settings, now)
        acts.update(d.states)
        actions += [(now, a.kind, a.level) for a in d.actions]
        deferred += list(d.deferred)
        levels.append(thermal[gpus[0]].level)
    return levels, actions, deferred


def test_ramp_goes_up_one_level_at_a_time_after_the_dwell() -> None:
    trace = [60] * 5 + list(range(60, 91)) + [90] * 10
    levels, actions, _ = run(trace)
    first = {lv: levels.index(lv) for lv in ("warm", "hot", "critical")}
    # 75 is reached at tick 5+15=20, held 3 s -> warm at 23; 82 at 27 -> hot at 30; 88 at 33 -> 36
    assert first == {"warm": 23, "hot": 30, "critical": 36}
    assert actions == [(30.0, "degrade", 1), (36.0, "degrade", 2)]


def test_a_single_sample_spike_never_acts() -> None:
    trace = [70] * 20 + [97] + [70] * 20 + [96, 70, 95, 70] * 5
    levels, actions, _ = run(trace)
    assert set(levels) == {"ok"} and actions == []


def test_thirty_minutes_of_dither_around_the_trip_point_is_one_episode() -> None:
    """Warm-up, 30 minutes dithering +-2 °C around hot_c (82), a cool-down: exactly one degrade
    and one recover, in that order, and nothing during the dither after the first degrade."""
    rng = random.Random(7)
    trace = [70] * 60
    trace += [82 + rng.uniform(-2, 2) for _ in range(1800)]
    trace += [70] * 400
    levels, actions, _ = run(trace)
    kinds = [k for _, k, _ in actions]
    assert kinds == ["degrade", "recover"], actions
    degrade_at, recover_at = actions[0][0], actions[1][0]
    assert 60 <= degrade_at < 1860 and recover_at >= 1860 + S.recover_s
    assert "critical" not in levels


def test_dither_below_the_trip_point_never_acts() -> None:
    rng = random.Random(3)
    trace = [79.5 + rng.uniform(-2, 2) for _ in range(1800)]  # peaks at 81.5 < 82
    _, actions, _ = run(trace)
    assert actions == []


def test_recovery_waits_for_recover_s_below_hot_minus_hysteresis() -> None:
    trace = [85] * 10 + [80] * 200 + [78] * 200  # 80 is above 82-3: not cool
    _levels, actions, _ = run(trace)
    assert [k for _, k, _ in actions] == ["degrade", "recover"]
    cool_from = 210  # first tick at 78
    assert actions[1][0] == cool_from + S.recover_s


def test_sustained_thermal_throttling_is_hot_whatever_the_temperature() -> None:
    hot = {"temperature_c": 60.0, "reasons": ("sw_thermal_slowdown",)}
    levels, actions, _ = run([hot] * 12)
    # on from t=0, 5 s of it by t=5 (throttle_s), then the 3 s dwell
    assert levels.index("hot") == 8 and actions == [(8.0, "degrade", 1)]
    power = {"temperature_c": 60.0, "reasons": ("sw_power_cap",)}
    levels, actions, _ = run([power] * 60)
    assert set(levels) == {"ok"} and actions == []  # reported, not acted on


def test_the_cards_own_slowdown_threshold_caps_the_profile() -> None:
    """A card that slows down at 84 °C: hot from 84-6 = 78 °C, though the profile says 82."""
    levels, _, _ = run([79] * 10, extra={"slowdown_c": 84.0})
    assert levels[-1] == "hot"
    # where the driver reports the margin itself, it is used as is
    levels, _, _ = run([{"temperature_c": 70.0, "margin_c": 5.0}] * 10)
    assert levels[-1] == "hot"
    levels, _, _ = run([{"temperature_c": 70.0, "margin_c": 30.0}] * 10)
    assert levels[-1] == "ok"


def test_no_reading_holds_the_state() -> None:
    trace = [85] * 10 + [{"temperature_c": None, "status": "error"}] * 300
    levels, actions, _ = run(trace, extra={"slowdown_c": None})
    assert levels[-1] == "hot" and [k for _, k, _ in actions] == ["degrade"]


# A temperature read that failed while the other calls answered (the sampler's "partial": the clock-event
# reasons read as none), one of which nothing could be read, and a GPU gone from the bus.
FAIL = {
    "temperature_c": None,
    "status": "partial",
    "reasons": (),
    "sm_clock_mhz": 1410,
    "error": "gpu[0].temperature: nvmlDeviceGetTemperature: Unknown Error",
}
UNREAD = {"temperature_c": None, "status": "unreadable", "error": "every call failed"}
LOST = {"status": "lost", "error": "NVML answered GPU_IS_LOST"}


def states_of(trace, settings=S, gpus=(0,)):
    """Like :func:`run`, also the thermal states of the first GPU per tick."""
    thermal: dict[int, ThermalState] = {}
    acts: dict[str, InstanceActionState] = {}
    out, actions = [], []
    for i, point in enumerate(trace):
        now = float(i)
        per_gpu = point if isinstance(point, tuple) else (point,) * len(gpus)
        for g, p in zip(gpus, per_gpu, strict=True):
            fields = p if isinstance(p, dict) else {"temperature_c": float(p)}
            r = GpuReading(g, now, **{**A800, **fields})
            thermal[g], _ = policy.thermal_step(thermal.get(g, ThermalState()), r, settings, now)
        d = policy.decide_actions({"inst": gpus}, thermal, acts, settings, now)
        acts.update(d.states)
        actions += [(now, a.kind, a.level, a.reason) for a in d.actions]
        out.append(thermal[gpus[0]])
    return out, actions


def test_one_failed_read_in_three_neither_resets_the_hot_dwell_nor_counts_as_cool() -> None:
    """86 °C with every third temperature read failing degrades when steady reads do (within a tick):
    the failed read held the pending level and its start instead of reading as 'cool'."""
    _, steady = states_of([86] * 40)
    _, flaky = states_of([86, 86, FAIL] * 14)
    assert [a[:3] for a in steady] == [(3.0, "degrade", 1)]
    assert [a[1:3] for a in flaky] == [("degrade", 1)] and flaky[0][0] <= steady[0][0] + 1


def test_a_degraded_gpu_whose_reads_fail_for_good_is_never_recovered_and_turns_unknown() -> None:
    s = Watch(**{**S.__dict__, "recover_s": 10, "unknown_s": 15})
    states, actions = states_of([86] * 10 + [FAIL] * 400, settings=s)
    assert [a[1] for a in actions] == ["degrade"]  # no recover while still (for all we know) at 86
    assert states[10 + 14].level == "hot" and not states[10 + 14].unknown  # held for unknown_s
    assert states[10 + 15].unknown and states[10 + 15].shown == "unknown"
    assert "no temperature reading for 15 s" in states[25].reason and "last known hot" in states[-1].reason
    # readings back, cool: recover_s of made readings, then the recover
    states, actions = states_of([86] * 10 + [FAIL] * 100 + [70] * 30, settings=s)
    assert [a[:2] for a in actions][-1] == (110.0 + 10, "recover")


def test_a_gpu_lost_while_degraded_is_never_recovered() -> None:
    """An instance over GPUs 2 and 3, degraded by GPU 2; GPU 2 falls off the bus while GPU 3 is cool:
    lost must never read as 'below hot'."""
    s = Watch(**{**S.__dict__, "recover_s": 5})
    trace = [(86, 70)] * 10 + [(LOST, 70)] * 100
    states, actions = states_of(trace, settings=s, gpus=(2, 3))
    assert [a[1] for a in actions] == ["degrade"]
    assert states[-1].lost and states[-1].shown == "gpu_lost"
    # nor when everything of it stopped answering (the sampler's "unreadable"), past unknown_s
    _, actions = states_of([(86, 70)] * 10 + [(UNREAD, 70)] * 100, settings=s, gpus=(2, 3))
    assert [a[1] for a in actions] == ["degrade"]


def test_a_failed_read_within_a_cool_stretch_defers_the_recover_to_the_next_made_reading() -> None:
    s = Watch(**{**S.__dict__, "recover_s": 10})
    trace = [86] * 10 + [70] * 9 + [FAIL] * 3 + [70] * 5
    _, actions = states_of(trace, settings=s)
    # cool from t=10; t=20 (recover_s) is a failed read: the recover waits for the reading at t=22
    assert [a[:2] for a in actions] == [(3.0, "degrade"), (22.0, "recover")]


READINGS = st.sampled_from([70, 79, 86, 90, "fail", "unread", "lost"])


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(trace=st.lists(st.tuples(READINGS, READINGS), min_size=1, max_size=120))
def test_property_no_recover_is_decided_on_a_reading_that_was_not_made(trace) -> None:
    """Any interleaving of cool, warm, hot, critical, failed, unreadable and lost readings of an instance's
    two GPUs: a recover is decided only at a tick where both GPUs were read, and read below hot minus the
    hysteresis."""
    s = Watch(**{**S.__dict__, "recover_s": 4, "unknown_s": 3, "dwell_s": 2})
    kinds = {"fail": FAIL, "unread": UNREAD, "lost": LOST}
    lost: set[int] = set()
    readings = []
    for pair in trace:  # a lost GPU stays lost (as the sampler reports it)
        row = []
        for g, p in enumerate(pair):
            lost |= {g} if p == "lost" else set()
            row.append(LOST if g in lost else kinds[p] if isinstance(p, str) else p)
        readings.append(tuple(row))
    _, actions = states_of(readings, settings=s, gpus=(0, 1))
    for at, kind, _level, _why in actions:
        if kind == "recover":
            row = readings[int(at)]
            assert all(isinstance(p, int) and p < s.hot_c - s.hysteresis_c for p in row), (at, row)


def test_a_lost_gpu_is_reported_once_and_never_acted_on() -> None:
    st = ThermalState()
    st, change = policy.thermal_step(st, GpuReading(2, 0.0, temperature_c=70.0), S, 0.0)
    lost = GpuReading(2, 1.0, status="lost", error="NVML answered GPU_IS_LOST")
    st, change = policy.thermal_step(st, lost, S, 1.0)
    assert st.lost and change and "GPU 2 lost" in change
    st2, change2 = policy.thermal_step(st, lost, S, 2.0)
    assert change2 is None and st2.lost
    d = policy.decide_actions({"vllm-gpu2": (2,)}, {2: st2}, {}, S, 2.0)
    assert d.actions == ()


def test_actions_are_rate_limited_per_hour_with_the_reason() -> None:
    s = Watch(**{**S.__dict__, "max_actions_per_hour": 1, "recover_s": 10})
    trace = [85] * 10 + [70] * 30 + [85] * 10
    _, actions, deferred = run(trace, settings=s)
    assert [k for _, k, _ in actions] == ["degrade"]
    assert deferred and "watch.max_actions_per_hour 1" in deferred[0] and "recover" in deferred[0]


def test_the_worst_gpu_of_an_instance_decides() -> None:
    thermal = {0: ThermalState(level="ok"), 1: ThermalState(level="critical", reason="critical: 90 °C")}
    d = policy.decide_actions({"vllm-gpu0-1": (0, 1)}, thermal, {}, S, 100.0)
    assert [(a.kind, a.level) for a in d.actions] == [("degrade", 2)] and "GPU 1" in d.actions[0].reason


def test_a_node_of_a_multi_node_group_is_never_degraded_alone_and_says_why() -> None:
    thermal = {0: ThermalState(level="critical", reason="critical: 90 °C")}
    held = {"vllm-gpu0-node1": "node 1 of a group over 2 nodes: ..."}
    d = policy.decide_actions({"vllm-gpu0-node1": (0,)}, thermal, {}, S, 100.0, held)
    assert d.actions == () and d.states["vllm-gpu0-node1"].level == 0
    assert d.deferred == ("vllm-gpu0-node1: degrade to step 2 not done: node 1 of a group over 2 nodes: ...",)
    # the same host, one server: degraded as before
    assert [
        a.kind for a in policy.decide_actions({"vllm-gpu0": (0,)}, thermal, {}, S, 100.0, held).actions
    ] == ["degrade"]


# -- speculative decoding -------------------------------------------------------------------------


def window(rates, drafts=1000.0, k=None):
    k = k or len(rates)
    per_pos = tuple(r * drafts for r in rates)
    return SpecWindow(drafts, drafts * k, sum(per_pos), per_pos)


def test_acceptance_formulas_match_vllms() -> None:
    w = SpecWindow(drafts=100, draft_tokens=500, accepted=300, per_position=(90, 80, 60, 40, 30))
    assert w.acceptance_rate == pytest.approx(0.6)
    assert w.mean_acceptance_length == pytest.approx(4.0)  # 1 + 300 / 100
    assert w.position_rates() == pytest.approx((0.9, 0.8, 0.6, 0.4, 0.3))


def test_acceptance_outside_the_band_is_a_warning_with_the_numbers() -> None:
    low = policy.acceptance_health(window([0.6, 0.5, 0.4, 0.3, 0.2]), S)
    assert low and "40% below the profile's band 65%-85%" in low
    assert policy.acceptance_health(window([0.9, 0.8, 0.7, 0.6, 0.5]), S) is None  # 70 %
    assert policy.acceptance_health(window([0.6] * 5, drafts=10), S) is None  # too few drafts to judge


def test_k_advice_against_hand_computed_cases() -> None:
    # batch 1, free ngram proposals, rates 0.9, 0.8, 0.5, 0.1 (observed up to k=4)
    rates = [0.9, 0.8, 0.5, 0.1]
    gains = [expected_gain(rates, k, 0.0, 0.0) for k in range(5)]
    assert gains == pytest.approx([1.0, 1.9, 2.7, 3.2, 3.3])
    a = advise_k(window(rates), 4, 0.0, 0.0, S, k_max=4)
    assert a.k == 4 and a.gain == pytest.approx(3.3)
    # a draft costing 10 % of a step: k=3 -> (1+2.2)/(1.3)=2.46 beats k=4 -> 3.3/1.4=2.36
    a = advise_k(window(rates), 4, 0.1, 0.0, S, k_max=4)
    assert a.k == 3 and a.gain == pytest.approx(3.2 / 1.3, rel=1e-3)


def test_k_advice_never_speculates_where_it_loses_to_none() -> None:
    # full batch (each verified proposal costs a token of compute), poor acceptance
    a = advise_k(window([0.4, 0.15, 0.05]), 5, 0.1, 1.0, S)
    assert a.k == 0 and "no speculation" in a.reason
    for k in range(1, 9):
        assert expected_gain(policy.extend_rates([0.4, 0.15, 0.05], 8), k, 0.1, 1.0) < 1.0


@pytest.mark.parametrize("decay", [0.95, 0.85, 0.7, 0.5, 0.3])
@pytest.mark.parametrize(("draft_cost", "load"), [(0.0, 0.0), (0.05, 0.2), (0.1, 0.5), (0.02, 0.9)])
def test_advised_k_within_five_percent_of_the_best_fixed_k_in_hindsight(decay, draft_cost, load) -> None:
    """Acceptance geometric in the position (P(i) = decay^(i+1)), observed with the k running now
    (5), noise in the counters: the advised k's true gain is within 5 % of the best k's."""
    rng = random.Random(int(decay * 100 + draft_cost * 1000 + load * 10))
    true = [decay ** (i + 1) for i in range(8)]
    observed = [max(0.0, min(1.0, p * (1 + rng.uniform(-0.03, 0.03)))) for p in true[:5]]
    a = advise_k(window(observed), 5, draft_cost, load, S, k_max=8)
    best = max(expected_gain(true, k, draft_cost, load) for k in range(9))
    got = expected_gain(true, a.k, draft_cost, load)
    assert got >= 0.95 * best, (a.k, got, best)


def test_advice_follows_a_phase_change_in_acceptance() -> None:
    """High acceptance, then low (e.g. a switch from code to chat): the window's advice moves."""
    from hwprofile.telemetry.window import CounterWindow

    win = CounterWindow(60)
    totals = {"drafts": 0.0, "p0": 0.0, "p1": 0.0, "p2": 0.0}
    advised = []
    for t in range(240):
        rates = (0.95, 0.9, 0.85) if t < 120 else (0.3, 0.08, 0.02)
        totals["drafts"] += 20
        for i, r in enumerate(rates):
            totals[f"p{i}"] += 20 * r
        win.add(float(t), totals)
        w = SpecWindow(
            win.increase("drafts") or 0,
            (win.increase("drafts") or 0) * 3,
            sum(win.increase(f"p{i}") or 0 for i in range(3)),
            tuple(win.increase(f"p{i}") or 0 for i in range(3)),
        )
        a = advise_k(w, 3, 0.1, 0.6, S, k_max=6)
        advised.append(a.k if a else None)
    assert advised[100] >= 3 and advised[-1] == 0  # more proposals while they land, none after
    assert advised[130] != 0  # the window still holds the earlier phase a few seconds in


def test_counter_window_handles_resets() -> None:
    from hwprofile.telemetry.window import CounterWindow

    w = CounterWindow(60)
    for t, v in [(0, 100), (10, 150), (20, 5), (30, 25)]:  # a restart between 10 and 20
        w.add(float(t), {"c": v})
    assert w.increase("c") == 50 + 5 + 20


def test_histogram_quantile_interpolates_like_prometheus() -> None:
    from hwprofile.telemetry.window import histogram_quantile

    b = {0.1: 50.0, 0.2: 90.0, 0.5: 100.0, float("inf"): 100.0}
    assert histogram_quantile(0.5, b) == pytest.approx(0.1)
    assert histogram_quantile(0.7, b) == pytest.approx(0.1 + 0.1 * 20 / 40)
    assert histogram_quantile(0.99, b) == pytest.approx(0.2 + 0.3 * 9 / 10)
    assert histogram_quantile(0.5, {}) is None


# -- liveness ---------------------------------------------------------------------------------------

L = Watch(**{**S.__dict__, "stall_s": 30})


def live(trace, settings=L, step=1.0):
    """Replay (work, counters) readings (None: a scrape not made) one per ``step`` seconds; the times of
    the restarts decided, with their reasons."""
    st, out = policy.LivenessState(), []
    for i, point in enumerate(trace):
        p = None if point is None else policy.Progress(*point)
        st, why = policy.liveness_step(st, p, settings, i * step)
        if why:
            out.append((i * step, why))
    return out


def test_a_hung_engine_with_work_is_restarted_once_after_stall_s() -> None:
    # progress until t=10, then 3 requests waiting/running and the counters stand
    trace = [(2, 100 + 10 * i) for i in range(10)] + [(3, 190)] * 100
    got = live(trace)
    assert [t for t, _ in got] == [9.0 + 30]  # the last progress at t=9, stalled from there
    assert "no progress for 30 s with 3 request(s)" in got[0][1] and "watch.stall_s 30 s" in got[0][1]


def test_an_idle_server_is_never_restarted_however_long_its_counters_stand() -> None:
    assert live([(0, 500)] * 10_000) == []
    assert live([(0, 0)] * 10_000) == []  # a server that never served anything
    # work that comes and goes within stall_s each time, counters standing while idle
    trace = ([(2, 10)] * 20 + [(0, 10)] * 50) * 20
    assert live(trace) == []


def test_progress_or_an_empty_engine_ends_a_stall_and_a_new_stall_acts_again() -> None:
    trace = [(1, 50)] * 40 + [(1, 51)] + [(1, 51)] * 40 + [(0, 51)] + [(1, 51)] * 40
    assert [t for t, _ in live(trace)] == [30.0, 40.0 + 30, 82.0 + 30]


def test_liveness_decides_nothing_on_a_reading_not_made_nor_when_off() -> None:
    assert live([None] * 100) == [] and live([(None, 10)] * 100) == [] and live([(3, None)] * 100) == []
    assert live([(3, 10)] * 100, settings=Watch(**{**S.__dict__, "stall_s": 0})) == []


WORK = st.sampled_from([0, 0, 1, 4])
STEP = st.sampled_from([0, 0, 0, 1, 25])


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seq=st.lists(st.one_of(st.none(), st.tuples(WORK, STEP)), min_size=1, max_size=200))
def test_property_a_restart_follows_only_stall_s_of_work_without_progress(seq) -> None:
    """Any sequence of readings: a restart is decided only when, over the last watch.stall_s seconds,
    every reading made had work and the same counters; in particular never for an idle server."""
    counters, trace = 0, []
    for point in seq:
        if point is None:
            trace.append(None)
        else:
            counters += point[1]
            trace.append((point[0], counters))
    for t, _why in live(trace, step=5.0):
        i = int(t // 5)
        window = [w for j, w in enumerate(trace) if t - L.stall_s <= j * 5.0 <= t and w is not None]
        now = trace[i]
        assert now is not None and window and all(w[0] > 0 and w[1] == now[1] for w in window), (t, window)


def test_counter_window_increase_is_one_subtraction_never_a_scan() -> None:
    """increase() on a window of thousands of samples reads the first and the last sample only, for a
    counter that never moved as for one that did, and for one first seen inside the window."""
    from collections import deque

    from hwprofile.telemetry.window import CounterWindow

    class NoScan(deque):  # type: ignore[type-arg]
        def __iter__(self):  # type: ignore[no-untyped-def]
            raise AssertionError("the window was scanned")

    w = CounterWindow(3600)
    for t in range(5000):
        w.add(
            float(t), {"still": 7.0, "moving": float(t), **({"late": float(t - 4000)} if t >= 4000 else {})}
        )
    w._samples = NoScan(w._samples)
    assert w.increase("still") == 0.0 and w.increase("moving") == 3600.0 and w.increase("late") == 999.0
    assert w.increase("absent") is None
    w2 = CounterWindow(60)
    w2.add(0.0, {"a": 1.0})
    w2.add(1.0, {"a": 1.0, "b": 5.0})
    w2._samples = NoScan(w2._samples)
    assert w2.increase("a") == 0.0 and w2.increase("b") is None  # one sample carries b: no increase yet
