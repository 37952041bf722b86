"""``hwprofile daemon``: launch every planned instance under the supervisor, then every
``watch.interval`` sample, decide, act and publish — on the main thread, the only writer of the
daemon's state (thermal states, degrade levels, the restart queue).

A tick: sample every GPU (kept NVML handles) and every ready instance's /metrics → the watcher's
pure policy → at most one restart in flight (rolling: the next waits until the previous instance
answers /health again) → publish (exporter reference, ``daemon.json`` for ``hwprofile status``) →
the ``on_tick`` hook (the service's watchdog ping). A degrade or recover is a re-plan with the
degrade step's settings (``hwprofile.plan.degrade``), applied to that one instance.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..plan.degrade import degrade_sets
from ..runtime.files import atomic_write
from .exporter import Published
from .policy import Action, WatchSettings
from .telemetry import GpuSampler, InstanceReading, scrape
from .watcher import InstanceSpec, Report, Watcher

log = logging.getLogger("hwprofile")
DAEMON_FILE = "daemon.json"
HISTORY = 50


def instance_spec(
    plan: Mapping[str, Any], inst: Mapping[str, Any], per_batch_honoured: bool = False
) -> InstanceSpec:
    """What the watcher needs to know of a planned instance."""
    s = inst["server"]
    host = "127.0.0.1" if s["host"] in ("0.0.0.0", "", "::") else s["host"]
    spec = inst.get("speculative") or {}
    k = spec.get("num_speculative_tokens")
    cost = 0.0
    if spec.get("method") == "draft_model" and plan.get("draft") and plan["model"].get("params"):
        cost = plan["draft"]["params"] / plan["model"]["params"]
    elif spec.get("method") in ("mtp", "eagle", "eagle3") and plan["model"].get("layers"):
        cost = 1 / plan["model"]["layers"]  # about one extra decoder layer per proposal
    return InstanceSpec(
        inst["name"],
        f"http://{host}:{s['port']}",
        tuple(inst.get("gpus") or ()),
        int(k) if k else None,
        round(cost, 4),
        inst["engine"].get("max_num_seqs"),
        per_batch_honoured and bool(spec.get("num_speculative_tokens_per_batch_size")),
    )


@dataclass
class Restart:
    action: Action
    started: float
    replacements_before: int
    sets: list[str]


class Daemon:
    """The loop's state and one tick; :meth:`run` drives it until asked to stop."""

    def __init__(
        self,
        plan: dict[str, Any],
        replan: Callable[[list[str]], dict[str, Any]],
        supervisor: Any,
        sampler: GpuSampler | Any,
        settings: WatchSettings,
        degrade: Mapping[str, Any],
        runtime: Path,
        clock: Callable[[], float] = time.monotonic,
        scraper: Callable[[str, str, float], InstanceReading] = scrape,
        on_tick: Callable[[Daemon, Report], None] | None = None,
    ) -> None:
        self.plan = plan
        self.replan = replan
        self.sup = supervisor
        self.sampler = sampler
        self.settings = settings
        self.degrade = dict(degrade)
        self.runtime = runtime
        self.clock = clock
        self.scraper = scraper
        self.on_tick = on_tick
        per_batch = bool(getattr(getattr(supervisor, "release", None), "spec_table", None)) and bool(
            supervisor.release.spec_table().get("per_batch_size")
        )
        self.watcher = Watcher(settings, [instance_spec(plan, i, per_batch) for i in plan["instances"]])
        self.queue: deque[Action] = deque()
        self.current: Restart | None = None
        self.history: deque[dict[str, Any]] = deque(maxlen=HISTORY)
        self.errors: deque[str] = deque(maxlen=HISTORY)
        self.published = Published()
        self.report: Report | None = None
        self.ticks = 0
        self.missed = 0
        self.levels: dict[str, int] = {i["name"]: 0 for i in plan["instances"]}  # degrade step running

    # -- one tick ---------------------------------------------------------------------------------
    def instances(self) -> dict[str, Any]:
        return {i.name: i for i in self.sup.instances}

    def tick(self) -> Report:
        t0 = time.perf_counter()
        now = self.clock()
        insts = self.instances()
        scrapes = {
            name: self.scraper(name, spec.url, now)
            for name, spec in self.watcher.instances.items()
            if name in insts and insts[name].state.value == "ready"
        }
        rep = self.watcher.tick(now, self.sampler.sample(now), scrapes)
        for change in rep.changes:
            log.warning("%s", change)
        for note in rep.deferred:
            log.warning("%s", note)
        for a in rep.actions:
            self.queue = deque(q for q in self.queue if q.instance != a.instance)  # the newest decision wins
            self.queue.append(a)
            log.warning("decided: %s %s to degrade step %d: %s", a.kind, a.instance, a.level, a.reason)
        self._progress(now)
        self.ticks += 1
        self.report = rep
        self._publish(rep, time.perf_counter() - t0)
        if self.on_tick:
            self.on_tick(self, rep)
        return rep

    def _progress(self, now: float) -> None:
        """Finish the restart in flight, or start the next one (one instance at a time)."""
        insts = self.instances()
        if self.current is not None:
            inst = insts.get(self.current.action.instance)
            state = inst.state.value if inst is not None else "failed"
            if (
                state == "ready"
                and inst.replacements > self.current.replacements_before
                and not inst.replacing
            ):
                a = self.current.action
                took = now - self.current.started
                log.warning(
                    "done: %s %s at degrade step %d, ready again after %.0f s",
                    a.kind,
                    a.instance,
                    a.level,
                    took,
                )
                self._record(a, "done", f"ready again after {took:.0f} s")
                self.levels[a.instance] = a.level
                self.current = None
            elif state in ("failed", "stopped"):
                a = self.current.action
                msg = (
                    f"{a.kind} {a.instance}: the instance is {state} ({(inst.failure or {}) if inst else ''})"
                )
                log.error("%s", msg)
                self.errors.append(msg)
                self._record(a, "failed", msg)
                self.watcher.set_level(a.instance, self.levels.get(a.instance, 0))
                self.current = None
            else:
                return
        while self.queue and self.current is None:
            a = self.queue.popleft()
            inst = insts.get(a.instance)
            if inst is None or inst.state.value != "ready":
                self.queue.appendleft(a)  # wait until it is ready (a restart of its own, a start)
                return
            self._apply(a, inst, now)

    def _apply(self, a: Action, inst: Any, now: float) -> None:
        base = next((i for i in self.plan["instances"] if i["name"] == a.instance), None)
        if base is None:
            return
        sets, why = degrade_sets(base, a.level, self.degrade)
        try:
            new_plan = self.replan(sets)
        except Exception as e:  # a refused re-plan keeps the instance as it runs
            msg = f"{a.kind} {a.instance}: re-plan with {sets} failed: {e}"
            log.error("%s", msg)
            self.errors.append(msg)
            self._record(a, "failed", msg)
            self.watcher.set_level(a.instance, self.levels.get(a.instance, 0))
            return
        new = next((i for i in new_plan["instances"] if i["name"] == a.instance), None)
        if new is None:
            msg = f"{a.kind} {a.instance}: the re-plan has no instance of that name: not applied"
            log.error("%s", msg)
            self.errors.append(msg)
            self._record(a, "failed", msg)
            self.watcher.set_level(a.instance, self.levels.get(a.instance, 0))
            return
        log.warning(
            "action: %s %s to degrade step %d (%s): %s; restarting it (drain, then the new settings)",
            a.kind,
            a.instance,
            a.level,
            a.reason,
            "; ".join(why) or "the full profile",
        )
        self.current = Restart(a, now, inst.replacements, sets)
        self.published.actions_total[a.kind] = self.published.actions_total.get(a.kind, 0) + 1
        self._record(a, "started", "; ".join(why) or "the full profile")
        inst.replace(new)

    def _record(self, a: Action, outcome: str, detail: str) -> None:
        self.history.append(
            {
                "at": time.time(),
                "kind": a.kind,
                "instance": a.instance,
                "level": a.level,
                "reason": a.reason,
                "outcome": outcome,
                "detail": detail,
            }
        )

    # -- publish ------------------------------------------------------------------------------------
    def document(self) -> dict[str, Any]:
        rep = self.report.to_json() if self.report else {}
        return {
            "schema": "hwprofile.daemon/1",
            "updated_at": time.time(),
            "ticks": self.ticks,
            "missed_ticks": self.missed,
            "tick_seconds": self.published.tick_seconds,
            "watch": {k: getattr(self.settings, k) for k in self.settings.__dataclass_fields__},
            **rep,
            "actions": list(self.history),
            "queued": [{"kind": a.kind, "instance": a.instance, "level": a.level} for a in self.queue],
            "restarting": self.current.action.instance if self.current else None,
            "degrade_levels": dict(self.levels),
            "errors": list(self.errors) + rep.get("errors", []),
        }

    def _publish(self, rep: Report, took: float) -> None:
        p = self.published
        p.report = rep
        p.instance_states = {i.name: i.state.value for i in self.sup.instances}
        p.restarts = {i.name: i.restarts for i in self.sup.instances}
        p.ticks_total, p.missed_ticks_total, p.tick_seconds = self.ticks, self.missed, took
        try:
            atomic_write(self.runtime / DAEMON_FILE, json.dumps(self.document(), default=str), 0o600)
        except OSError as e:
            msg = f"cannot write {self.runtime / DAEMON_FILE}: {e}"
            if not self.errors or self.errors[-1] != msg:
                log.error("%s", msg)
                self.errors.append(msg)

    # -- the loop ------------------------------------------------------------------------------------
    def run(self, stop: threading.Event) -> None:
        """Tick every ``watch.interval`` on monotonic deadlines until ``stop`` is set (a tick that
        ends after the next deadline is counted as missed and the schedule moves on)."""
        step = self.settings.interval
        deadline = self.clock()
        while not stop.is_set():
            try:
                self.tick()
            except Exception as e:  # a broken tick is logged with its traceback; the loop goes on
                log.error("tick failed: %s: %s", type(e).__name__, e, exc_info=e)
                self.errors.append(f"tick failed: {type(e).__name__}: {e}")
            deadline += step
            now = self.clock()
            if now > deadline:
                self.missed += int((now - deadline) // step) + 1
                deadline = now
            stop.wait(max(0.0, deadline - now))
