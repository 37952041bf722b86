"""The daemon's reactions are typed actions decided by pure policies (thermal, hardware faults, liveness,
drift), each with its instance, its reason and the readings that decided it, and carried out in one place:
the loop's dispatcher, keyed on the action's type."""

from __future__ import annotations

from dataclasses import FrozenInstanceError, dataclass
from pathlib import Path
from typing import Any, ClassVar

import pytest
from test_overrides import _plan, _Sampler, _Sup

from hwprofile.config.settings import Watch
from hwprofile.daemon import policy
from hwprofile.daemon.actions import Degrade, Drain, Recover, Restart, _Action
from hwprofile.daemon.loop import Daemon
from hwprofile.daemon.policy import Progress, ThermalState
from hwprofile.host.sampler import GpuReading

S = Watch(hot_c=82, warm_c=75, critical_c=88, hysteresis_c=3, dwell_s=3, throttle_s=5, recover_s=10)


def _reading(gpu: int, now: float, temp: float, **extra: Any) -> GpuReading:
    return GpuReading(gpu, now, temperature_c=temp, slowdown_c=95.0, **extra)


def test_the_thermal_policy_returns_a_degrade_then_a_recover_with_the_readings_behind_them() -> None:
    thermal: dict[int, ThermalState] = {}
    acts: dict[str, policy.InstanceActionState] = {}
    got: list[Any] = []
    for t in range(40):
        temp = 85.0 if t < 10 else 60.0
        rs = {g: _reading(g, float(t), temp if g == 1 else 60.0) for g in (0, 1)}
        for g, r in rs.items():
            thermal[g], _ = policy.thermal_step(thermal.get(g, ThermalState()), r, S, float(t))
        d = policy.decide_actions({"a": (0, 1)}, thermal, acts, S, float(t), readings=rs)
        acts.update(d.states)
        got += [(t, a) for a in d.actions]
    kinds = [(t, type(a), a.level) for t, a in got]
    assert kinds == [(3, Degrade, 1), (20, Recover, 0)], kinds
    (_, degrade), *_ = got
    assert degrade.instance == "a" and degrade.kind == "degrade" and degrade.gpus == (0, 1)
    assert "GPU 1" in degrade.reason
    # the evidence: this tick's readings of the instance's GPUs, the hot one among them
    assert [(r.index, r.temperature_c) for r in degrade.evidence] == [(0, 60.0), (1, 85.0)]
    with pytest.raises(FrozenInstanceError):
        degrade.level = 0  # type: ignore[misc]


def test_the_fault_policy_returns_a_drain_with_the_faulted_reading() -> None:
    r = _reading(2, 5.0, 60.0, xids=(79,))
    fault, _ = policy.fault_step(policy.FaultState(), r, 5.0)
    (d,) = policy.decide_drains({"b": (2, 3), "c": (4,)}, {2: fault}, {}, {2: r})
    assert isinstance(d, Drain) and (d.instance, d.gpus, d.kind) == ("b", (2, 3), "drain")
    assert "xid_79" in d.reason and d.evidence == (r,)


def test_the_liveness_policy_returns_a_restart_with_the_progress_it_read() -> None:
    from hwprofile.daemon.watcher import InstanceSpec, Watcher

    # liveness: work pending and vLLM's token counters standing for watch.stall_s
    s = Watch(stall_s=5.0)
    w = Watcher(s, [InstanceSpec("a", "http://127.0.0.1:1", (0,))])
    stuck = {"a": _stuck_reading()}
    restarts = []
    for t in range(10):
        restarts += list(w.tick(float(t), [], stuck).actions)
    (a,) = restarts
    assert isinstance(a, Restart) and a.instance == "a" and "no progress" in a.reason
    (p,) = a.evidence
    assert isinstance(p, Progress) and p.work == 3.0


def _stuck_reading() -> Any:
    from hwprofile.telemetry.metrics import GENERATION, PROMPT
    from hwprofile.telemetry.scrape import InstanceReading

    class M:
        def __init__(self) -> None:
            self.running, self.waiting, self.kv_usage = 2.0, 1.0, None
            self.counters = {GENERATION: 10.0, PROMPT: 5.0}
            self.engines: dict[str, dict[str, float]] = {}

        def window_values(self) -> dict[str, float]:
            return {}

    return InstanceReading("a", "http://127.0.0.1:1", 0.0, "ok", M())  # type: ignore[arg-type]


def _daemon() -> Daemon:
    plan = _plan({"a": 64})
    t = [0.0]
    return Daemon(
        plan,
        lambda sets: plan,
        _Sup(["a"]),
        _Sampler(),
        plan.watch,
        plan.degrade,
        Path("/nonexistent"),
        clock=lambda: t[0],
    )


def test_the_dispatcher_carries_out_each_action_by_its_type() -> None:
    d = _daemon()
    insts = d.instances()
    d.act(Degrade("a", "GPU 0 hot: 85 °C", (0,), 1), insts)
    assert [(type(q), q.level) for q in d.queue] == [(Degrade, 1)]
    d.act(Restart("a", "no progress", (0,), 0), insts)  # the queued degrade restarts it anyway
    assert [type(q) for q in d.queue] == [Degrade]
    d.act(Recover("a", "cool", (0,), 0), insts)  # the newest decision wins
    assert [type(q) for q in d.queue] == [Recover]
    d.queue.clear()
    d.act(Recover("a", "cool", (0,), 0), insts)  # at the full profile: only the power limit, no restart
    assert not d.queue and d.history[-1]["kind"] == "recover" and d.history[-1]["outcome"] == "done"


def test_a_new_reaction_is_an_action_class_and_one_handler() -> None:
    @dataclass(frozen=True)
    class Quiesce(_Action):
        kind: ClassVar[str] = "quiesce"

    d = _daemon()
    with pytest.raises(TypeError, match="no handler for the action Quiesce"):
        d.act(Quiesce("a", "why not"), d.instances())  # type: ignore[arg-type]
    seen: list[Any] = []
    d.handlers[Quiesce] = lambda a, insts: seen.append((a.instance, sorted(insts)))
    d.act(Quiesce("a", "why not"), d.instances())  # type: ignore[arg-type]
    assert seen == [("a", ["a"])]


def test_a_degrade_re_plans_with_the_typed_degrade_layer_and_says_its_source() -> None:
    from hwprofile.config.layers import Overrides

    plan = _plan({"a": 64})
    asked: list[list[Any]] = []

    def replan(extra: Any) -> Any:
        asked.append(list(extra))
        return plan

    d = Daemon(
        plan,
        replan,
        _Sup(["a"]),
        _Sampler(),
        plan.watch,
        plan.degrade,
        Path("/nonexistent"),
        clock=lambda: 0.0,
    )
    d.act(Degrade("a", "GPU 0 hot: 88 °C >= hot 82 °C", (0,), 1), d.instances())
    d._progress(0.0)
    (extra,) = asked
    (layer,) = extra  # no --set text: one typed layer
    assert isinstance(layer, Overrides) and layer.kind == "degrade"
    assert layer.label == "step 1 (GPU 0 hot: 88 °C >= hot 82 °C)"
    assert dict(layer.values)[("engine", "max_num_seqs")] == 48  # 64 x 0.75
    started = d.history[-1]
    assert started["outcome"] == "started" and started["detail"].startswith(
        "degrade step 1 (GPU 0 hot: 88 °C"
    )
    assert "max_num_seqs 64 -> 48" in started["detail"]
