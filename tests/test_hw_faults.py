"""Hardware faults drain, not just heat: NVML's uncorrectable ECC count, retired pages and remapped rows
pending a reset, a failed row remap, XID critical errors (an NVML event set) and a GPU lost from the bus,
read through pynvml's real path against the fake libnvidia-ml; the pure fault policy; the watcher that
drains an instance on a faulted GPU and never degrades, recovers or restarts it; the exporter and status."""

from __future__ import annotations

import time

from hwprofile.config.settings import Watch
from hwprofile.daemon import policy
from hwprofile.daemon.exporter import NAMES, HwprofileCollector, Published
from hwprofile.daemon.policy import FaultState
from hwprofile.daemon.watcher import InstanceSpec, Watcher
from hwprofile.host.sampler import GpuReading, GpuSampler
from hwprofile.launch.status import _fmt_gpu, _fmt_live

S = Watch(hot_c=82, warm_c=75, critical_c=88, hysteresis_c=3, dwell_s=3, throttle_s=5, recover_s=120)


def _later() -> None:
    time.sleep(0.01)  # the next write changes the state file's stamp


def test_the_sampler_reads_every_fault_through_pynvml(fake_host) -> None:
    host = fake_host("a100-80g-pcie-1x")
    sampler = GpuSampler()
    try:
        (r,) = sampler.sample(0.0)
        assert r.ecc_uncorrected == 0 and r.ecc_corrected == 0
        assert (
            r.retired_pages_pending is False
            and r.remapped_rows_pending is False
            and r.row_remap_failure is False
        )
        assert r.xids == () and policy.read_faults(r) == ([], [])
        assert sampler.events is not None  # an event set registered for XID critical errors
        _later()
        host.set_state(
            **{
                "dev0.ecc_uncorrected": 2,
                "dev0.ecc_corrected": 7,
                "dev0.remap_pending": 1,
                "dev0.xid": "13,79",
            }
        )
        (r,) = sampler.sample(1.0)
        assert (r.ecc_uncorrected, r.ecc_corrected, r.remapped_rows_pending) == (2, 7, True)
        assert r.xids == (13, 79)
        fatal, notes = policy.read_faults(r)
        kinds = [f.split(":")[0] for f in fatal]
        assert kinds == ["ecc_uncorrectable", "row_remap_pending", "xid_79"], fatal
        assert notes == ["XID 13 (an application or driver fault: noted, not acted on)"]
        (r,) = sampler.sample(2.0)
        assert r.xids == (13, 79)  # each event delivered once, kept by the sampler
        _later()
        host.set_state(**{"dev0.retired_pending": 1, "dev0.remap_failure": 1})
        (r,) = sampler.sample(3.0)
        assert r.retired_pages_pending is True and r.row_remap_failure is True
    finally:
        sampler.close()


def test_a_board_without_ecc_is_not_asked_again_and_a_lost_gpu_is_a_fault(fake_host) -> None:
    host = fake_host("rtx4090-1x")
    host.set_state(**{"dev0.ecc_supported": 0})
    sampler = GpuSampler()
    try:
        (r,) = sampler.sample(0.0)
        assert r.status == "ok" and r.ecc_uncorrected is None and r.remapped_rows_pending is None
        assert 0 in sampler._no_faults  # NOT SUPPORTED is an answer, not an error of every tick
        assert r.error is None
        _later()
        host.set_state(**{"dev0.lost": 1})
        (r,) = sampler.sample(1.0)
        fatal, _ = policy.read_faults(r)
        assert r.status == "lost" and fatal and fatal[0].startswith("gpu_lost:")
    finally:
        sampler.close()


def _r(i: int, now: float, **kw) -> GpuReading:
    return GpuReading(i, now, temperature_c=60.0, slowdown_c=95.0, **kw)


def test_the_fault_policy_is_sticky_and_says_each_new_fault_once() -> None:
    st = FaultState()
    st, said = policy.fault_step(st, _r(0, 0.0, ecc_uncorrected=0), 0.0)
    assert not st.faulted and said is None
    st, said = policy.fault_step(st, _r(0, 1.0, xids=(48,)), 1.0)
    assert st.faulted and st.since == 1.0 and said and "XID 48 (double-bit ECC error)" in said
    st2, said = policy.fault_step(st, _r(0, 2.0, xids=(48,)), 2.0)
    assert st2 == st and said is None  # said once
    st3, said = policy.fault_step(st, _r(0, 3.0), 3.0)  # the reading no longer shows it: still faulted
    assert st3.faulted and said is None
    st4, said = policy.fault_step(st3, _r(0, 4.0, xids=(48,), ecc_uncorrected=1), 4.0)
    assert policy.fault_kinds(st4) == ("xid_48", "ecc_uncorrectable") and st4.since == 1.0


def test_decide_drains_only_the_instances_on_a_faulted_gpu_once() -> None:
    faults = {0: FaultState(), 2: FaultState(("xid_79: XID 79 (GPU has fallen off the bus)",), 5.0)}
    inst = {"a": (0, 1), "b": (2, 3)}
    (d,) = policy.decide_drains(inst, faults, {})
    assert (d.kind, d.instance, d.gpus) == ("drain", "b", (2, 3)) and "GPU 2: xid_79" in d.reason
    assert policy.decide_drains(inst, faults, {"b": d.reason}) == []


def test_the_watcher_drains_and_then_never_degrades_or_restarts_the_instance() -> None:
    w = Watcher(S, [InstanceSpec("a", "http://x", (0,)), InstanceSpec("b", "http://y", (1,))])
    rep = w.tick(0.0, [_r(0, 0.0), _r(1, 0.0, ecc_uncorrected=3)], {})
    assert [(a.kind, a.instance) for a in rep.actions] == [("drain", "b")]
    assert rep.changes == (
        "GPU 1 hardware fault: ecc_uncorrectable: 3 uncorrectable ECC error(s) since the driver loaded",
    ) and rep.changed_gpus == (1,)
    # GPU 1 now runs hot for long: a thermal degrade would be decided for an instance still on it
    acts = []
    for t in range(1, 20):
        rep = w.tick(
            float(t), [_r(0, float(t)), GpuReading(1, float(t), temperature_c=90.0, slowdown_c=95.0)], {}
        )
        acts += [(a.kind, a.instance) for a in rep.actions]
    assert acts == []  # drained: no second drain, no degrade
    (b,) = [i for i in rep.instances if i.name == "b"]
    assert b.drained and "ecc_uncorrectable" in b.drained
    g1 = next(g for g in rep.gpus if g.reading.index == 1).to_json()
    assert g1["faults"] and g1["faults"][0].startswith("ecc_uncorrectable") and g1["faulted_since"] == 0.0
    # the thermal policy of the healthy GPU still acts: heat on GPU 0 degrades instance a
    acts = []
    for t in range(20, 30):
        rep = w.tick(
            float(t), [GpuReading(0, float(t), temperature_c=85.0, slowdown_c=95.0), _r(1, float(t))], {}
        )
        acts += [(a.kind, a.instance, a.level) for a in rep.actions]
    assert acts == [("degrade", "a", 1)]


def test_exporter_and_status_show_the_fault_and_the_drain() -> None:
    from prometheus_client import CollectorRegistry, generate_latest

    w = Watcher(S, [InstanceSpec("a", "http://x", (0,))])
    rep = w.tick(0.0, [_r(0, 0.0, ecc_uncorrected=1, xids=(79,))], {})
    pub = Published()
    pub.report = rep
    pub.instance_states = {"a": "stopped"}
    pub.actions_total = {"drain": 1}
    reg = CollectorRegistry(auto_describe=False)
    reg.register(HwprofileCollector(pub))
    text = generate_latest(reg).decode()
    assert 'hwprofile_gpu_fault{gpu="0",kind="ecc_uncorrectable"} 1.0' in text
    assert 'hwprofile_gpu_fault{gpu="0",kind="xid_79"} 1.0' in text
    assert 'hwprofile_gpu_ecc_uncorrected_errors{gpu="0"} 1.0' in text
    assert 'hwprofile_instance_drained{instance="a"} 1.0' in text
    assert 'hwprofile_actions_total{kind="drain"} 1.0' in text
    assert {"hwprofile_gpu_fault", "hwprofile_instance_drained"} <= set(NAMES)
    doc = rep.to_json()
    line = _fmt_gpu(doc["gpus"][0])
    assert (
        "HARDWARE FAULT: ecc_uncorrectable" in line and "xid_79: XID 79 (GPU has fallen off the bus)" in line
    )
    live = _fmt_live(doc["instances"][0])
    assert any(s.startswith("    DRAINED for a hardware fault: GPU 0: ecc_uncorrectable") for s in live), live


def test_doctor_says_the_faults_and_whether_the_power_limit_is_a_lever(tmp_path, fake_nvml_dir) -> None:
    import json
    import subprocess
    import sys

    from conftest import cli_env
    from fakehost import build

    host = build("a800-pcie-4x-2numa", tmp_path / "host")
    env = {**cli_env(host, fake_nvml_dir), "HWPROFILE_CONFIG_ROOT": str(tmp_path / "etc")}

    def doctor() -> tuple[int, dict[str, dict]]:
        r = subprocess.run(
            [sys.executable, "-m", "hwprofile", "doctor", "--json"], env=env, capture_output=True, text=True
        )
        return r.returncode, {f["check"]: f for f in json.loads(r.stdout)["findings"]}

    _, found = doctor()
    assert found["faults"]["kind"] == "ok" and "no hardware fault on 4 GPU(s)" in found["faults"]["detail"]
    assert found["power_limit"]["kind"] == "advice" and "Not Supported" in found["power_limit"]["detail"]
    host.set_state(
        **{
            "dev1.remap_failure": 1,
            "dev2.xid": 79,
            **{f"dev{g}.power_limit_min_mw": 100_000 for g in range(4)},
            **{f"dev{g}.power_limit_max_mw": 300_000 for g in range(4)},
        }
    )
    code, found = doctor()
    assert code == 1 and found["faults"]["kind"] == "blocking", found["faults"]
    assert (
        "GPU 1: row_remap_failure" in found["faults"]["detail"]
        and "GPU 2: xid_79" in found["faults"]["detail"]
    )
    assert "GPU 0 300 -> 255 W (range 100-300 W)" in found["power_limit"]["detail"]


def test_the_status_line_says_the_fault_and_the_drain() -> None:
    from types import SimpleNamespace

    from hwprofile.daemon.notify import status_line

    w = Watcher(S, [InstanceSpec("a", "http://x", (0,)), InstanceSpec("b", "http://y", (1,))])
    rep = w.tick(0.0, [_r(0, 0.0), _r(1, 0.0, xids=(79,))], {})
    inst = [
        SimpleNamespace(name="a", state=SimpleNamespace(value="ready")),
        SimpleNamespace(name="b", state=SimpleNamespace(value="stopped")),
    ]
    d = SimpleNamespace(
        sup=SimpleNamespace(instances=inst),
        levels={},
        report=rep,
        watcher=w,
        current=None,
        reload_error=None,
        power_saved={1: 300_000},
    )
    line = status_line(d)
    assert line.startswith("1/2 ready") and "GPU1 FAULT xid_79" in line, line
    assert "drained for a hardware fault: b" in line and "power limit lowered on GPU 1" in line, line


def test_the_loop_stops_the_instance_with_the_journal_fields_and_never_replaces_it(caplog) -> None:
    from pathlib import Path

    from test_overrides import _Inst, _plan, _Sup

    from hwprofile.daemon.loop import Daemon
    from hwprofile.supervise.lifecycle import State

    class Inst(_Inst):
        def stop(self) -> None:
            self.state = State.STOPPED

    class Sampler:
        def __init__(self) -> None:
            self.temp = 60.0

        def sample(self, now: float) -> list[GpuReading]:
            return [
                GpuReading(0, now, temperature_c=self.temp, slowdown_c=95.0, xids=(79,) if now >= 2 else ())
            ]

    plan = _plan({"a": 64})
    sup = _Sup(["a"])
    sup.instances = [Inst("a")]
    clock = iter(float(t) for t in range(100))
    sampler = Sampler()
    d = Daemon(
        plan,
        lambda sets: plan,
        sup,
        sampler,
        plan.watch,
        plan.degrade,
        Path("/nonexistent"),
        clock=lambda: next(clock),
    )
    with caplog.at_level("WARNING", logger="hwprofile"):
        for _ in range(4):
            d.tick()
        sampler.temp = 95.0  # hot and critical afterwards: nothing is decided for a drained instance
        for _ in range(20):
            d.tick()
    (rec,) = [r for r in caplog.records if r.getMessage().startswith("drain a:")]
    assert (rec.INSTANCE, rec.ACTION, rec.GPU, rec.FAULT) == ("a", "drain", "0", "xid_79")  # type: ignore[attr-defined]
    assert sup.instances[0].state == State.STOPPED and sup.instances[0].got == []
    assert [(h["kind"], h["outcome"]) for h in d.history] == [("drain", "done")]
    doc = d.document()
    assert doc["instances"][0]["drained"].startswith("GPU 0: xid_79") and doc["gpus"][0]["xids"] == [79]
