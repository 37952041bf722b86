"""The churn soak, simulated: the daemon's real loop (:class:`hwprofile.daemon.loop.Daemon`: the watcher,
the policies, the restart queue, reloads, the runtime-directory guard, daemon.json) driven by an injected
clock against fakes of the GPUs, the instances and their /metrics, with faults injected: a GPU's
temperature flipping across hot every ``flip_s`` (with failed reads), one instance killed every ``kill_s``
(its supervisor brings it back after a few seconds), an override rewritten every ``reload_s``, the runtime
directory deleted now and then. Each tick is checked against the invariants of months unattended; the
result says what happened. Used by ``tests/test_daemon_cost.py`` (compressed) and
``benchmarks/soak_daemon.py``."""

from __future__ import annotations

import os
import random
import shutil
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hwprofile.config.settings import Watch
from hwprofile.host.sampler import GpuReading
from hwprofile.runtime.dirs import private_dir
from hwprofile.supervise.lifecycle import State
from hwprofile.supervise.runfiles import RuntimeLock
from hwprofile.telemetry.metrics import GENERATION, RUNNING, WAITING, VllmMetrics
from hwprofile.telemetry.scrape import InstanceReading

START_TICKS = 3  # ticks a (re)started fake instance takes to be ready


class SimInstance:
    """An instance as the daemon sees it: its state, restarts (crashes, brought back by its supervisor)
    and replacements (the daemon's planned restarts)."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.state = State.READY
        self.restarts = 0
        self.replacements = 0
        self.replacing = False
        self.failure: dict[str, str] | None = None
        self.retry_at: float | None = None
        self.health_failing_since: float | None = None
        self.ready_in = 0  # ticks until ready again
        self.tokens = 0.0
        self.got: list[Any] = []

    def replace(self, inst: Any) -> None:
        self.got.append(inst)
        self.replacing = True
        self.state = State.STARTING
        self.ready_in = START_TICKS

    def crash(self) -> None:
        self.restarts += 1
        self.state = State.STARTING
        self.ready_in = START_TICKS

    def stop(self) -> None:
        self.state = State.STOPPED

    def step(self) -> None:
        if self.state == State.STARTING:
            self.ready_in -= 1
            if self.ready_in <= 0:
                self.state = State.READY
                if self.replacing:
                    self.replacing = False
                    self.replacements += 1


class SimSupervisor:
    def __init__(self, names: list[str], runtime: Path) -> None:
        from hwprofile.render.versions import release

        self.instances = [SimInstance(n) for n in names]
        self.release = release("0.32.0")
        private_dir(runtime)
        self.runtime_lock = RuntimeLock(runtime)
        self.runtime_lock.acquire()

    def render(self, plan: Any, inst: Any) -> Any:
        from hwprofile.render.translate import render_instance

        return render_instance(plan, inst, self.release, "vllm", None)

    def save(self) -> None:
        pass


class SimGpus:
    """GPU 0 flips between hot and cool every ``flip_s``; its reads fail with probability ``fail``."""

    def __init__(self, n: int, flip_s: float, fail: float, rng: random.Random) -> None:
        self.n, self.flip_s, self.fail, self.rng = n, flip_s, fail, rng
        self.failed_now: set[int] = set()
        self.hot = False

    def sample(self, now: float) -> list[GpuReading]:
        self.hot = int(now // self.flip_s) % 2 == 1
        self.failed_now = set()
        out = []
        for g in range(self.n):
            if g == 0 and self.rng.random() < self.fail:
                self.failed_now.add(g)
                out.append(GpuReading(g, now, status="error", error="NVML_ERROR_UNKNOWN (injected)"))
                continue
            temp = 86.0 if g == 0 and self.hot else 60.0
            out.append(GpuReading(g, now, temperature_c=temp, slowdown_c=95.0))
        return out


@dataclass
class SoakResult:
    ticks: int = 0
    actions: Counter[str] = field(default_factory=Counter)
    episodes: int = 0  # hot episodes of GPU 0
    per_episode: list[tuple[int, int]] = field(default_factory=list)  # (degrades, recovers) per episode
    crashes: int = 0
    reloads: int = 0
    runtime_deleted: int = 0
    max_in_flight: int = 0  # instances being replaced at once (one owner, one at a time)
    violations: list[str] = field(default_factory=list)
    fds: tuple[int, int] = (0, 0)  # open descriptors after the first minute and at the end
    bounded: dict[str, int] = field(default_factory=dict)  # sizes of what the daemon keeps, at the end


def soak(
    runtime: Path,
    seconds: float,
    seed: int = 1,
    flip_s: float = 40.0,
    kill_s: float = 180.0,
    reload_s: float = 120.0,
    delete_s: float = 600.0,
    fail: float = 0.33,
) -> SoakResult:
    """Simulate ``seconds`` of a daemon at watch.interval 1 s (one tick per simulated second)."""
    from test_overrides import _plan

    from hwprofile.daemon.loop import Daemon

    rng = random.Random(seed)
    plan = _plan({"a": 64, "b": 64})  # a on GPU 0 (the one that heats), b on GPU 1
    settings = Watch(
        dwell_s=3,
        recover_s=20,
        unknown_s=15,
        max_actions_per_hour=120,
        stall_s=30,
        window_s=10,
        metrics_port=0,
    )
    sup = SimSupervisor(["a", "b"], runtime)
    gpus = SimGpus(2, flip_s, fail, rng)
    t = [0.0]

    def collect(targets: dict[str, str], now: float) -> dict[str, InstanceReading]:
        out = {}
        for name, url in targets.items():
            inst = next(i for i in sup.instances if i.name == name)
            inst.tokens += 50
            m = VllmMetrics("v1", {RUNNING: 2.0, WAITING: 0.0}, {GENERATION: inst.tokens})
            out[name] = InstanceReading(name, url, now, "ok", m)
        return out

    d = Daemon(
        plan,
        lambda sets: plan,
        sup,
        gpus,
        settings,
        plan.degrade,
        runtime,
        clock=lambda: t[0],
        collect=collect,
        rss_reader=lambda inst: 1e9,
    )
    res = SoakResult()
    episode: list[int] = [0, 0]
    was_hot = False
    a_inst = sup.instances[0]
    try:
        for tick in range(int(seconds)):
            now = float(tick)
            t[0] = now
            if tick and tick % int(kill_s) == 0:  # SIGKILL of one instance: its supervisor restarts it
                victim = sup.instances[(tick // int(kill_s)) % 2]
                if victim.state == State.READY:
                    victim.crash()
                    res.crashes += 1
            if tick and tick % int(reload_s) == 0:  # an override rewritten
                d.request_reload("overrides.d/10-site.yaml changed")
                res.reloads += 1
            if tick and tick % int(delete_s) == 0:  # logout without linger
                shutil.rmtree(runtime, ignore_errors=True)
                res.runtime_deleted += 1
            rep = d.tick()
            for inst in sup.instances:
                inst.step()
            res.ticks += 1
            # -- invariants, every tick
            for a in rep.actions:
                res.actions[a.kind] += 1
                if a.kind == "recover" and 0 in gpus.failed_now and 0 in a.gpus:
                    res.violations.append(f"t={now}: recover of {a.instance} on a tick GPU 0 was not read")
                if a.instance == "a" and a.kind == "degrade":
                    episode[0] += 1
                if a.instance == "a" and a.kind == "recover":
                    episode[1] += 1
            in_flight = sum(1 for i in sup.instances if i.replacing)
            res.max_in_flight = max(res.max_in_flight, in_flight)
            if in_flight > 1:
                res.violations.append(f"t={now}: {in_flight} instances restarted at once")
            if a_inst.state == State.FAILED or sup.instances[1].state == State.FAILED:
                res.violations.append(f"t={now}: an instance is lost")
            hot = gpus.hot
            if hot and not was_hot and tick:
                res.episodes += 1
                if res.episodes > 1:
                    res.per_episode.append((episode[0], episode[1]))
                episode = [0, 0]
            was_hot = hot
            if tick == 60:
                res.fds = (len(os.listdir("/proc/self/fd")), 0)
        res.fds = (res.fds[0], len(os.listdir("/proc/self/fd")))
        res.bounded = {
            "history": len(d.history),
            "errors": len(d.errors),
            "queue": len(d.queue),
            "window_samples": max((len(w._samples) for w in d.watcher.windows.values()), default=0),
            "thermal": len(d.watcher.thermal),
        }
        if not sup.runtime_lock.intact():
            res.violations.append("the runtime lock is not held at the end")
        if RuntimeLock(runtime).path.exists():
            try:
                RuntimeLock(runtime).acquire(wait=0.0)
                res.violations.append("a second owner took the runtime lock")
            except Exception:
                pass
    finally:
        sup.runtime_lock.release()
    return res
