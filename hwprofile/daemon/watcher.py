"""The evaluation both ``hwprofile watch`` and the daemon run each tick: readings in, a frozen
report out (thermal state per GPU with its reason, window figures per instance, decisions).

:class:`Watcher` keeps the state between ticks (thermal states, counter windows, action states) and
is driven by one owner; everything it decides comes from the pure functions in ``policy``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from ..config.settings import Watch
from ..host.sampler import GpuReading
from ..telemetry.metrics import ACCEPTED, DRAFT_TOKENS, DRAFTS, GENERATION, PER_POS, PREEMPTIONS, PROMPT
from ..telemetry.scrape import InstanceReading
from ..telemetry.window import CounterWindow, histogram_quantile
from . import policy
from .actions import Action, Drain, Recycle, Restart
from .policy import (
    DriftReading,
    DriftState,
    FaultState,
    InstanceActionState,
    LivenessState,
    Progress,
    SpecWindow,
    ThermalState,
)


@dataclass(frozen=True)
class InstanceSpec:
    """What the watcher knows of an instance it did not launch or did: its GPUs and speculation."""

    name: str
    url: str
    gpus: tuple[int, ...] = ()
    num_speculative_tokens: int | None = None
    draft_cost: float = 0.0  # one proposal's cost relative to a target step
    max_num_seqs: int | None = None
    adaptive_k: bool = False  # this vLLM picks k by batch size itself
    held: str | None = None  # why this daemon cannot restart it alone (a node of a multi-node group)


@dataclass(frozen=True)
class InstanceReport:
    name: str
    url: str
    status: str
    error: str | None = None
    running: float | None = None
    waiting: float | None = None
    kv_usage: float | None = None
    preemptions: float | None = None  # over the window
    generation_tokens_per_s: float | None = None
    acceptance_rate: float | None = None
    mean_acceptance_length: float | None = None
    acceptance_per_position: tuple[float, ...] = ()
    ttft_p50_s: float | None = None
    ttft_p99_s: float | None = None
    itl_p50_s: float | None = None
    itl_p99_s: float | None = None
    window_s: float = 0.0
    thermal_state: str = "ok"
    degrade_level: int = 0
    warning: str | None = None
    advice: policy.KAdvice | None = None
    engines: dict[str, dict[str, float]] = field(default_factory=dict)  # data-parallel ranks, by engine label
    stalled_s: float | None = None  # requests pending and vLLM's token counters unchanged this long
    drained: str | None = None  # drained for a hardware fault of its GPU(s), not restarted there: why
    drift: str | None = None  # slow decay against its baseline (TPOT at comparable load, RSS), while it holds
    rss_bytes: float | None = None  # its processes' resident memory, when the daemon read it

    def to_json(self) -> dict[str, Any]:
        d = {k: getattr(self, k) for k in self.__dataclass_fields__ if k != "advice"}
        d["acceptance_per_position"] = list(self.acceptance_per_position)
        d["advice"] = (
            {
                "num_speculative_tokens": self.advice.k,
                "gain": self.advice.gain,
                "current": self.advice.current_k,
                "current_gain": self.advice.current_gain,
                "reason": self.advice.reason,
            }
            if self.advice
            else None
        )
        return d


@dataclass(frozen=True)
class GpuReport:
    reading: GpuReading
    state: ThermalState
    now: float
    faults: FaultState = field(default_factory=FaultState)

    def to_json(self) -> dict[str, Any]:
        r, s = self.reading, self.state
        return {
            "index": r.index,
            "status": "gpu_lost" if s.lost else r.status,
            # its last level for watch.unknown_s while reads fail (the reason says so), then unknown
            "thermal_state": s.shown,
            "reason": s.reason,
            "pending": s.pending,
            "temperature_c": r.temperature_c,
            "temperature_slowdown_c": r.slowdown_c,
            "temperature_shutdown_c": r.shutdown_c,
            "temperature_margin_c": r.headroom_c,
            "sm_clock_mhz": r.sm_clock_mhz,
            "sm_clock_max_mhz": r.sm_clock_max_mhz,
            "clocks_event_reasons": {k: round(v, 1) for k, v in s.reason_active_s(self.now).items()},
            "power_draw_watts": r.power_draw_watts,
            "power_limit_watts": r.power_limit_watts,
            "memory_used_bytes": r.memory_used_bytes,
            "error": r.error,
            # hardware faults: fatal ones drain the GPU's instances (see the daemon docs)
            "faults": list(self.faults.fatal),
            "fault_notes": list(self.faults.notes),
            "faulted_since": self.faults.since,
            "ecc_uncorrected": r.ecc_uncorrected,
            "ecc_corrected": r.ecc_corrected,
            "retired_pages_pending": r.retired_pages_pending,
            "remapped_rows_pending": r.remapped_rows_pending,
            "row_remap_failure": r.row_remap_failure,
            "xids": list(r.xids),
        }


@dataclass(frozen=True)
class Report:
    at: float
    gpus: tuple[GpuReport, ...]
    instances: tuple[InstanceReport, ...]
    actions: tuple[Action, ...] = ()
    deferred: tuple[str, ...] = ()
    changes: tuple[str, ...] = ()  # thermal state changes this tick
    changed_gpus: tuple[int, ...] = ()  # the GPU of each change
    errors: tuple[str, ...] = field(default=())

    def to_json(self) -> dict[str, Any]:
        return {
            "gpus": [g.to_json() for g in self.gpus],
            "instances": [i.to_json() for i in self.instances],
            "actions": [
                {
                    "kind": a.kind,
                    "instance": a.instance,
                    "level": a.level,
                    "reason": a.reason,
                    "gpus": list(a.gpus),
                }
                for a in self.actions
            ],
            "deferred": list(self.deferred),
            "changes": list(self.changes),
            "errors": list(self.errors),
        }


class Watcher:
    def __init__(self, settings: Watch, instances: Sequence[InstanceSpec]) -> None:
        self.settings = settings
        self.instances = {i.name: i for i in instances}
        self.thermal: dict[int, ThermalState] = {}
        self.windows: dict[str, CounterWindow] = {}
        # each instance's last reading and the figures of its window then: a reading that stands for an
        # idle instance (the loop did not scrape it again: the same object) is not added nor read again
        self._figures: dict[str, tuple[InstanceReading, dict[str, Any]]] = {}
        self.actions: dict[str, InstanceActionState] = {}
        self.liveness: dict[str, LivenessState] = {}
        self.drift: dict[str, DriftState] = {}
        self.rss: dict[str, float] = {}  # the last RSS read per instance (the loop reads it now and then)
        self.faults: dict[int, FaultState] = {}
        self.drained: dict[str, str] = {}  # instance -> why it was drained (a hardware fault)
        self.power: tuple[float, float] | None = None  # (factor, hold s) of the power lever; None: off
        self.no_power: dict[str, str] = {}  # instances where the power limit could not be set, why

    def set_level(self, instance: str, level: int) -> None:
        """The loop says which degrade step an instance really runs (after a failed restart...)."""
        st = self.actions.get(instance, InstanceActionState())
        self.actions[instance] = replace(st, level=level)

    def power_failed(self, instance: str, why: str) -> None:
        """The power limit could not be lowered for ``instance`` (not root, no constraints): the lever
        is off for it from now on, and the batch steps decide at the next tick."""
        self.no_power[instance] = why
        st = self.actions.get(instance, InstanceActionState())
        self.actions[instance] = replace(st, power_at=None)

    def tick(
        self,
        now: float,
        gpus: Sequence[GpuReading],
        scrapes: Mapping[str, InstanceReading],
        act: bool = True,
        busy: frozenset[str] = frozenset(),
    ) -> Report:
        """One evaluation. ``busy``: instances the loop is restarting or has queued (a recycle waits
        while any instance is busy: one at a time)."""
        s = self.settings
        changes: list[str] = []
        changed: list[int] = []
        reports: list[GpuReport] = []
        for r in gpus:
            new, change = policy.thermal_step(self.thermal.get(r.index, ThermalState()), r, s, now)
            self.thermal[r.index] = new
            if change:
                changes.append(change)
                changed.append(r.index)
            fault, said = policy.fault_step(self.faults.get(r.index, FaultState()), r, now)
            self.faults[r.index] = fault
            if said:
                changes.append(said)
                changed.append(r.index)
            reports.append(GpuReport(r, new, now, fault))
        decisions = policy.Decisions()
        drains: list[Drain] = []
        seen = {r.index: r for r in gpus}
        if act:
            drains = policy.decide_drains(
                {n: i.gpus for n, i in self.instances.items() if i.gpus}, self.faults, self.drained, seen
            )
            self.drained.update({a.instance: a.reason for a in drains})
            # a drained instance is neither degraded, recovered nor restarted: it is not served there
            decisions = policy.decide_actions(
                {n: i.gpus for n, i in self.instances.items() if i.gpus and n not in self.drained},
                self.thermal,
                self.actions,
                s,
                now,
                {n: i.held for n, i in self.instances.items() if i.held},
                self._lever(),
                seen,
            )
            self.actions.update(decisions.states)
        acting = {a.instance for a in decisions.actions} | set(self.drained)
        restarts, held = self._liveness(now, scrapes, acting, act)
        inst_reports = [self._instance(now, spec, scrapes.get(spec.name)) for spec in self.instances.values()]
        moving = {a.instance for a in (*drains, *decisions.actions, *restarts)}  # restarted or stopped now
        inst_reports, recycles = self._drift(now, inst_reports, busy | moving, act)
        return Report(
            now,
            tuple(reports),
            tuple(inst_reports),
            (*drains, *decisions.actions, *restarts, *recycles),
            (*decisions.deferred, *held),
            tuple(changes),
            changed_gpus=tuple(changed),
        )

    def _lever(self) -> policy.PowerLever | None:
        if self.power is None or self.power[0] <= 0:
            return None
        ok = frozenset(n for n, i in self.instances.items() if i.gpus and n not in self.no_power)
        return policy.PowerLever(ok, self.power[1], self.power[0])

    def _liveness(
        self, now: float, scrapes: Mapping[str, InstanceReading], acting: set[str], act: bool
    ) -> tuple[list[Restart], list[str]]:
        """The liveness policy per instance (:func:`policy.liveness_step`): a restart, at the step in
        force, for an engine with work and no progress for ``watch.stall_s``; none for an instance a
        thermal action restarts anyway, or one this daemon cannot restart alone (deferred, with why)."""
        actions: list[Restart] = []
        deferred: list[str] = []
        for name, spec in self.instances.items():
            r = scrapes.get(name)
            if r is None:  # not scraped: not ready (starting, restarting): a new process is judged afresh
                self.liveness.pop(name, None)
                continue
            old = self.liveness.get(name, LivenessState())
            progress = _progress(r)
            st, why = policy.liveness_step(old, progress, self.settings, now)
            self.liveness[name] = st
            if why is None or not act or name in acting:
                continue
            if spec.held:
                deferred.append(f"{name}: restart not done: {why}; {spec.held}")
                continue
            level = self.actions.get(name, InstanceActionState()).level
            actions.append(Restart(name, why, spec.gpus, level, (progress,) if progress else ()))
        return actions, deferred

    def _drift(
        self, now: float, reports: list[InstanceReport], busy: set[str] | frozenset[str], act: bool
    ) -> tuple[list[InstanceReport], list[Recycle]]:
        """The drift policy per instance (:func:`policy.drift_step`) on this tick's figures: its report
        says the drift while it holds; at most one recycle is decided, and none while another instance
        is busy. An instance not scraped (starting, restarting) begins a new baseline when it is back."""
        out: list[InstanceReport] = []
        actions: list[Recycle] = []
        for rep in reports:
            spec = self.instances[rep.name]
            if rep.status == "not scraped":
                self.drift.pop(rep.name, None)
                self.rss.pop(rep.name, None)
                out.append(rep)
                continue
            ok = rep.status == "ok"
            reading = DriftReading(
                rep.itl_p50_s if ok else None,
                rep.running if ok else None,
                rep.waiting if ok else None,
                self.rss.get(rep.name),
                spec.max_num_seqs,
            )
            others = bool(actions) or any(n != rep.name for n in busy)
            blocked = others or not act or rep.name in busy or bool(spec.held) or rep.name in self.drained
            st, why = policy.drift_step(
                self.drift.get(rep.name, DriftState()), reading, self.settings, now, busy=blocked
            )
            self.drift[rep.name] = st
            if why is not None:
                level = self.actions.get(rep.name, InstanceActionState()).level
                actions.append(Recycle(rep.name, why, spec.gpus, level, (reading,)))
            out.append(replace(rep, drift=policy.drift_shown(st, now), rss_bytes=reading.rss_bytes))
        return out, actions

    def _instance(self, now: float, spec: InstanceSpec, r: InstanceReading | None) -> InstanceReport:
        level = self.actions.get(spec.name, InstanceActionState()).level
        states = [self.thermal[g] for g in spec.gpus if g in self.thermal]
        lost = [g for g in spec.gpus if g in self.thermal and self.thermal[g].lost]
        unknown = any(t.unknown for t in states)
        thermal = (
            "gpu_lost"
            if lost
            else "unknown"
            if unknown
            else max((t.level for t in states), key=policy.LEVELS.index, default="ok")
        )
        base: dict[str, Any] = {
            "name": spec.name,
            "url": spec.url,
            "thermal_state": thermal,
            "degrade_level": level,
            "drained": self.drained.get(spec.name),
        }
        gone = (
            f"GPU {', '.join(map(str, lost))} lost: this instance cannot be served there; no degrade helps "
            "(fix the host, then restart the daemon: the plan leaves lost GPUs out)"
            if lost
            else None
        )
        if r is None:
            return InstanceReport(status="not scraped", warning=gone, **base)
        if r.status != "ok" or r.metrics is None:
            return InstanceReport(status=r.status, error=r.error, warning=gone, **base)
        figures = self._window_figures(spec, r, now)
        return InstanceReport(
            status="ok",
            stalled_s=_stalled(self.liveness.get(spec.name), now),
            **{**base, **figures, "warning": gone or figures["warning"]},
        )

    def _window_figures(self, spec: InstanceSpec, r: InstanceReading, now: float) -> dict[str, Any]:
        """The figures of an instance's counter window with reading ``r`` added (rates, quantiles,
        acceptance, the k advice); those of the last tick when ``r`` is the reading it had then."""
        last = self._figures.get(spec.name)
        if last is not None and last[0] is r:
            return last[1]
        s = self.settings
        m = r.metrics
        assert m is not None
        win = self.windows.setdefault(spec.name, CounterWindow(s.window_s))
        win.add(now, m.window_values())
        span = win.span_s
        per_pos = win.increases(PER_POS)
        positions = [
            per_pos[k] for k in sorted(per_pos, key=lambda k: int(k.split("=")[-1].rstrip("}") or 0))
        ]
        sw = None
        drafts = win.increase(DRAFTS)
        if drafts is not None:
            sw = SpecWindow(
                drafts, win.increase(DRAFT_TOKENS) or 0.0, win.increase(ACCEPTED) or 0.0, tuple(positions)
            )
        gen = win.increase(GENERATION)
        ttft = _buckets(win.increases("ttft_bucket"))
        itl = _buckets(win.increases("itl_bucket"))
        load = (m.running or 0) / spec.max_num_seqs if spec.max_num_seqs else 0.0
        advice = (
            policy.advise_k(
                sw, spec.num_speculative_tokens, spec.draft_cost, load, s, adaptive=spec.adaptive_k
            )
            if spec.num_speculative_tokens
            else None
        )
        figures: dict[str, Any] = {
            "running": m.running,
            "waiting": m.waiting,
            "kv_usage": m.kv_usage,
            "preemptions": win.increase(PREEMPTIONS),
            "generation_tokens_per_s": (gen / span) if gen is not None and span > 0 else None,
            "acceptance_rate": sw.acceptance_rate if sw else None,
            "mean_acceptance_length": sw.mean_acceptance_length if sw else None,
            "acceptance_per_position": sw.position_rates() if sw else (),
            "ttft_p50_s": histogram_quantile(0.5, ttft),
            "ttft_p99_s": histogram_quantile(0.99, ttft),
            "itl_p50_s": histogram_quantile(0.5, itl),
            "itl_p99_s": histogram_quantile(0.99, itl),
            "window_s": span,
            "warning": policy.acceptance_health(sw, s),
            "advice": advice,
            "engines": dict(m.engines),
        }
        self._figures[spec.name] = (r, figures)
        return figures


def _stalled(st: LivenessState | None, now: float) -> float | None:
    return now - st.stalled_since if st is not None and st.stalled_since is not None else None


def _progress(r: InstanceReading) -> Progress | None:
    """What the liveness policy reads of one scrape: requests running plus waiting, and the prompt and
    generation token counters summed (None: the scrape failed, or the server exports no stats)."""
    m = r.metrics
    if r.status != "ok" or m is None:
        return None
    work = None if m.running is None and m.waiting is None else (m.running or 0.0) + (m.waiting or 0.0)
    seen = [m.counters[n] for n in (GENERATION, PROMPT) if n in m.counters]
    return Progress(work, sum(seen) if seen else None)


def _buckets(inc: Mapping[str, float]) -> dict[float, float]:
    return {float(k.split("le=")[1].rstrip("}")): v for k, v in inc.items()}
