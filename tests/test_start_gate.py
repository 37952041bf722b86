"""The start gate (hwprofile/supervise/gate.py): before every start of a GPU instance, wait (bounded,
logged, shown in status) until its GPUs' memory is back. The policy with an injected clock; the
readings through the fake NVML (pynvml's real code), whose state file a test changes while a
supervisor runs: memory still held, then released → the start waits, then goes; never released →
started after the bound with a warning; a failed reading is unknown, not free; CPU instances skip it."""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest
from test_supervisor_fast import fake_env, plan_inputs, rt, starts, world  # noqa: F401 (fixtures)
from waiting import wait_for

from hwprofile.config.settings import Logs, Supervise
from hwprofile.host.gpumem import GpuMemory, MemoryReading
from hwprofile.launch.status import format_status, status
from hwprofile.supervise.gate import SLACK_BYTES, StartGate, judge
from hwprofile.supervise.lifecycle import State
from hwprofile.supervise.options import Options
from hwprofile.supervise.supervisor import Supervisor

MiB, GiB = 2**20, 2**30
TOTAL = 24 * GiB


def reading(used: int | None, total: int = TOTAL, error: str | None = None) -> MemoryReading:
    if used is None:
        return MemoryReading(0, error=error or "NVML error")
    return MemoryReading(0, total_bytes=total, free_bytes=total - used)


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t

    def sleep(self, s: float) -> bool:
        self.t += s
        return False


def scripted(
    clock: Clock, used_at: Callable[[float], int | None]
) -> Callable[[Sequence[int]], Mapping[int, MemoryReading]]:
    return lambda gpus: {g: reading(used_at(clock.t)) for g in gpus}


# -- the policy, with an injected clock ------------------------------------------------------------


def test_judge_baseline_and_what_vllm_asks() -> None:
    base = {0: reading(1 * GiB)}
    assert judge([0], base, {0: reading(1 * GiB + SLACK_BYTES)}, 0.9).settled
    held = judge([0], base, {0: reading(1 * GiB + SLACK_BYTES + MiB)}, 0.9)
    assert not held.settled and "GPU 0" in held.why and "before hwprofile started anything" in held.why
    # at the baseline, but less free than vLLM's request (total x utilization): the old run's leftovers
    # were already there when the baseline was read (a launch right after a stop)
    short = judge([0], {0: reading(4 * GiB)}, {0: reading(4 * GiB)}, 0.9)
    assert not short.settled and "vLLM asks 21.60 GiB" in short.why
    assert judge([0], {0: reading(2 * GiB)}, {0: reading(2 * GiB)}, 0.9).settled
    # no baseline (its reading failed): judged on what vLLM asks alone
    assert judge([0], {}, {0: reading(2 * GiB)}, 0.9).settled
    # a failed reading is unknown, never free
    unknown = judge([0], base, {0: reading(None, error="gpu[0].memory: Unknown Error")}, 0.9)
    assert not unknown.settled and unknown.unknown == (0,) and "Unknown Error" in unknown.why
    # every GPU of the instance counts
    two = judge([0, 1], {}, {0: reading(0), 1: reading(5 * GiB)}, 0.9)
    assert not two.settled and "GPU 1" in two.why and "GPU 0" not in two.why


def test_held_then_released_waits_then_goes() -> None:
    clock = Clock()
    used = {"now": 1 * GiB}
    read = lambda gpus: {g: reading(used["now"]) for g in gpus}  # noqa: E731
    gate = StartGate(
        read,
        60.0,
        clock=clock,
        sleep=lambda s: (clock.sleep(s), used.update(now=8 * GiB if clock.t < 7 else 1 * GiB))[1] or False,
    )
    gate.take_baseline([0])
    used["now"] = 8 * GiB  # the previous process still holds its memory
    notes: list[str] = []
    p = gate.wait([0], 0.9, notes.append)
    assert p.outcome == "free" and 7 <= p.waited_s <= 7.5 and p.warning is None
    assert len(notes) == 1 and "8.00 GiB used, 1.00 GiB before" in notes[0]  # said once, not every poll


def test_never_released_is_bounded_and_started_with_a_warning() -> None:
    clock = Clock()
    gate = StartGate(scripted(clock, lambda t: 8 * GiB), 60.0, clock=clock, sleep=clock.sleep)
    gate.baseline[0] = reading(1 * GiB)
    p = gate.wait([0], 0.9)
    assert p.outcome == "timeout" and p.waited_s == 60.0
    assert (
        p.warning
        and "60 s" in p.warning
        and "GPU 0: 8.00 GiB used" in p.warning
        and "smaller KV cache" in p.warning
    )


def test_unknown_waits_the_bound_then_starts_naming_it() -> None:
    clock = Clock()
    gate = StartGate(scripted(clock, lambda t: None), 30.0, clock=clock, sleep=clock.sleep)
    p = gate.wait([0], 0.9)
    assert p.outcome == "unknown" and p.waited_s == 30.0
    assert p.warning and "without knowing" in p.warning and "GPU 0: memory unknown (NVML error)" in p.warning


def test_no_nvml_in_this_process_skips_at_once_and_says_so() -> None:
    clock = Clock()
    read = lambda gpus: {g: MemoryReading(g, error="NVML: no library", no_nvml=True) for g in gpus}  # noqa: E731
    p = StartGate(read, 60.0, clock=clock, sleep=clock.sleep).wait([0], 0.9)
    assert p.outcome == "skipped" and p.waited_s == 0 and p.warning and "no library" in p.warning


def test_a_stop_while_waiting_ends_the_wait() -> None:
    clock = Clock()
    gate = StartGate(scripted(clock, lambda t: 8 * GiB), 60.0, clock=clock, sleep=lambda s: True)
    gate.baseline[0] = reading(1 * GiB)
    assert gate.wait([0], 0.9).outcome == "stopped"


def test_zero_bound_looks_once() -> None:
    clock = Clock()
    calls: list[float] = []
    gate = StartGate(
        scripted(clock, lambda t: 8 * GiB), 0.0, clock=clock, sleep=lambda s: calls.append(s) or False
    )
    gate.baseline[0] = reading(1 * GiB)
    assert gate.wait([0], 0.9).outcome == "timeout" and calls == []


# -- the readings, through the fake NVML -------------------------------------------------------------


def test_gpu_memory_reads_the_fake_nvml_and_follows_its_state(fake_host) -> None:
    host = fake_host("rtx4090-1x")
    mem = GpuMemory()
    try:
        (r,) = mem([0]).values()
        # the fixture: 24564 MiB, 5 MiB used and 300 MiB reserved; as CUDA counts them (v2: the total less
        # the reservation, which free excludes too), what vLLM's share is of
        assert (r.total_bytes, r.free_bytes, r.used_bytes) == (
            (24564 - 300) * MiB,
            (24564 - 305) * MiB,
            5 * MiB,
        )
        host.set_state(**{"dev0.memory_used": 9000 * MiB})  # the file changes under the open session
        assert mem([0])[0].used_bytes == 9000 * MiB
        host.set_state(
            **{"dev0.err.nvmlDeviceGetMemoryInfo_v2": 999, "dev0.err.nvmlDeviceGetMemoryInfo": 999}
        )
        bad = mem([0])[0]
        assert (
            bad.used_bytes is None
            and bad.error
            and "nvmlDeviceGetMemoryInfo" in bad.error
            and not bad.no_nvml
        )
    finally:
        mem.close()


def test_no_library_is_said_in_every_reading(monkeypatch, tmp_path: Path) -> None:
    monkeypatch.setenv("HWPROFILE_NVML_LIBRARY", str(tmp_path / "absent.so"))
    (r,) = GpuMemory()([0]).values()
    assert r.no_nvml and r.used_bytes is None and "absent.so" in (r.error or "")


# -- a supervisor on a GPU host, the fake NVML's state changed while it runs -------------------------


def gpu_supervisor(w: dict[str, Any], where: Path, host: Any, read: Any, bound: float) -> Supervisor:
    inputs = plan_inputs(
        w,
        where,
        "engine.gpu_memory_utilization=0.6",
        "engine.max_model_len=1024",
        "speculative.method=none",
        host=host,
    )
    sup = Supervise(
        ready_timeout=20,
        max_restarts=3,
        backoff_initial=0.1,
        backoff_max=1.0,
        stop_margin=3.0,
        gpu_free_timeout=bound,
    )
    opts = Options.from_settings(
        sup, Logs(), where / "run", where / "logs", poll_interval=0.05, gpu_memory=read
    )
    return Supervisor(inputs.replan(), w["release"], "/nonexistent/vllm", None, opts, replan=inputs.replan)


def finish(sup: Supervisor) -> None:
    sup.stop()
    sup.wait(60)
    sup.close()


def test_a_replacement_waits_for_memory_still_held_then_starts(world, rt, fake_env, host_of) -> None:  # noqa: F811
    host = host_of("rtx4090-1x")
    state = Path(os.environ["FAKE_NVML_STATE"])  # the fake NVML's state file: read again once it changes
    mem = GpuMemory()
    sup = gpu_supervisor(world, rt, host, mem, 600.0)
    try:
        sup.start()
        assert sup.wait_ready(30)
        inst = sup.instances[0]
        assert inst.inst.device == "cuda" and 0 in inst.gate.baseline and len(starts(fake_env)) == 1
        # the daemon's degrade/recover: a planned replacement; the old process's memory is still held
        with state.open("a") as f:
            f.write(f"dev0.memory_used={9000 * MiB}\n")
        inst.replace(inst.inst)
        why = wait_for(lambda: inst.gpu_wait, "the start gate waiting")
        assert "GPU 0: " in why and "before hwprofile started anything" in why
        assert len(starts(fake_env)) == 1  # not started while the memory is held
        # the state file (saved right after) and `hwprofile status` show what it waits for
        wanted = "waiting for GPU memory (supervise.gpu_free_timeout): GPU 0"
        wait_for(lambda: wanted in format_status(status(rt / "run")), "status showing the wait", 10)
        with state.open("a") as f:  # released
            f.write(f"dev0.memory_used={5 * MiB}\n")
        wait_for(lambda: inst.replacements == 1 and inst.state == State.READY, "ready again")
        assert len(starts(fake_env)) == 2 and inst.gpu_wait is None and not inst.gate_warnings
        assert "start gate: GPU memory back after" in inst.log.path.read_text()
    finally:
        finish(sup)
        mem.close()


def test_a_first_start_waits_for_a_previous_runs_leftovers(world, rt, fake_env, host_of) -> None:  # noqa: F811
    """A launch right after a stop: the old run's memory is in the first start's baseline, so the
    gate's other rule holds the start: free memory below what vLLM asks (total x 0.6)."""
    host = host_of("rtx4090-1x")
    state = Path(os.environ["FAKE_NVML_STATE"])
    with state.open("a") as f:
        f.write(f"dev0.memory_used={20000 * MiB}\n")  # 4 GiB free of 24: vLLM would refuse to start
    mem = GpuMemory()
    sup = gpu_supervisor(world, rt, host, mem, 600.0)
    try:
        sup.start()
        inst = sup.instances[0]
        why = wait_for(lambda: inst.gpu_wait, "the start gate waiting")
        assert "GPU 0: " in why and "vLLM asks" in why and inst.state == State.STARTING
        assert starts(fake_env) == []
        with state.open("a") as f:
            f.write(f"dev0.memory_used={5 * MiB}\n")
        assert sup.wait_ready(30) and len(starts(fake_env)) == 1 and not inst.gate_warnings
    finally:
        finish(sup)
        mem.close()


def test_memory_never_released_starts_after_the_bound_with_a_warning(world, rt, fake_env, host_of) -> None:  # noqa: F811
    host = host_of("rtx4090-1x")
    state = Path(os.environ["FAKE_NVML_STATE"])
    mem = GpuMemory()
    sup = gpu_supervisor(world, rt, host, mem, 1.0)
    try:
        sup.start()
        assert sup.wait_ready(30)
        inst = sup.instances[0]
        with state.open("a") as f:
            f.write(f"dev0.memory_used={9000 * MiB}\n")
        inst.replace(inst.inst)
        wait_for(lambda: inst.replacements == 1 and inst.state == State.READY, "ready again")
        (w,) = inst.gate_warnings
        assert "supervise.gpu_free_timeout" in w and "GPU 0: " in w and "smaller KV cache" in w
        assert w in inst.record().warnings  # status shows it
        # a reading that fails is unknown, not free: the same bound, a warning that says so
        with state.open("a") as f:
            f.write("dev0.err.nvmlDeviceGetMemoryInfo_v2=999\ndev0.err.nvmlDeviceGetMemoryInfo=999\n")
        inst.replace(inst.inst)
        wait_for(lambda: inst.replacements == 2 and inst.state == State.READY, "ready again")
        (w,) = inst.gate_warnings
        assert "without knowing" in w and "GPU 0: memory unknown" in w
    finally:
        finish(sup)
        mem.close()


def test_a_cpu_instance_skips_the_gate(world, rt, fake_env) -> None:  # noqa: F811
    asked: list[Sequence[int]] = []

    def read(gpus: Sequence[int]) -> dict[int, MemoryReading]:
        asked.append(gpus)
        return {}

    inputs = plan_inputs(world, rt)
    opts = Options.from_settings(
        Supervise(ready_timeout=20), Logs(), rt / "run", rt / "logs", poll_interval=0.05, gpu_memory=read
    )
    sup = Supervisor(inputs.replan(), world["release"], "/nonexistent/vllm", None, opts)
    try:
        assert sup.instances[0].inst.device == "cpu"
        sup.start()
        assert sup.wait_ready(30)
        assert asked == [] and not sup.instances[0].gate_warnings
    finally:
        finish(sup)


@pytest.mark.parametrize("bound", [0.0])
def test_the_setting_reaches_the_gate(bound: float, tmp_path: Path) -> None:
    opts = Options.from_settings(Supervise(gpu_free_timeout=bound), Logs(), tmp_path, tmp_path)
    assert opts.gpu_free_timeout == bound and Supervise().gpu_free_timeout == 60.0
