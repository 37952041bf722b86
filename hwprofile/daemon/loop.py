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

import contextlib
import json
import logging
import os
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..config.layers import Overrides
from ..config.settings import Degrade as DegradeSection
from ..config.settings import Watch
from ..errors import HwprofileError
from ..host.sampler import GpuSource
from ..plan.degrade import degrade_overrides
from ..plan.speculative import draft_cost
from ..plan.types import ABSENT, InstancePlan, Plan
from ..supervise.runfiles import DAEMON_FILE, DAEMON_SCHEMA, DaemonDoc, write_doc
from ..telemetry.scrape import InstanceReading, scrape
from .actions import Action, Degrade, Drain, PowerCap, Recover, Recycle, Reload, Restart
from .exporter import Published
from .policy import fault_kinds
from .watcher import InstanceSpec, Report, Watcher

if TYPE_CHECKING:
    from ..supervise.instance import Instance
    from ..supervise.supervisor import Supervising

log = logging.getLogger("hwprofile")
HISTORY = 50
RSS_EVERY_S = 30.0  # an instance's RSS is read this often (drift is judged over hours)
# An idle instance (nothing running or waiting at its last scrape) is scraped this often, not at every
# tick: the staleness of what the liveness policy reads of it is bounded by this (and by a quarter of
# watch.stall_s), the thermal readings never wait for a scrape, and a busy instance (work at its last
# scrape, or one the loop restarts or has queued) is scraped at every tick.
IDLE_SCRAPE_S = 5.0
# A node of a group cannot be degraded alone: every node runs the same engine settings, and a restart of
# one node takes the whole group down (supervise/group.py). The card is left to the driver's own throttling.
GROUP_HELD = (
    "node {node} of a group over {n} nodes: every node must restart together with the same settings "
    "(a degrade of one node alone would take the group down and mismatch it); the card is left to the "
    "driver's own clock throttling. To degrade the group: the same override on every node (overrides.d), "
    "then a restart of the group"
)


def instance_spec(plan: Plan, inst: InstancePlan, per_batch_honoured: bool = False) -> InstanceSpec:
    """What the watcher needs to know of a planned instance."""
    s = inst.server
    host = "127.0.0.1" if s.host in ("0.0.0.0", "", "::") else s.host
    spec = inst.speculative
    k = spec.num_speculative_tokens if spec else None
    return InstanceSpec(
        inst.name,
        f"http://{host}:{s.port}",
        tuple(inst.gpus or ()),
        int(k) if k else None,
        draft_cost(plan, inst),
        inst.engine.max_num_seqs,
        per_batch_honoured and bool(spec and spec.num_speculative_tokens_per_batch_size),
        held=GROUP_HELD.format(node=inst.node, n=inst.nnodes)
        if inst.nnodes is not ABSENT and int(inst.nnodes) > 1
        else None,
    )


def fields(a: Action) -> dict[str, str | None]:
    """The journal fields of an action's log lines (:class:`.journal.JournalHandler` sends a record's
    UPPERCASE attributes): ``journalctl INSTANCE=vllm-gpu2-3``, ``ACTION=degrade``, ``GPU=2``."""
    return {"INSTANCE": a.instance, "ACTION": a.kind, "GPU": ",".join(map(str, a.gpus)) or None}


def shown(layers: Sequence[Overrides]) -> str:
    """Typed override layers in a line: ``degrade step 1 (why): engine.max_num_seqs=192, ...``."""
    return (
        "; ".join(
            f"{o.kind} {o.label}: " + ", ".join(f"{'.'.join(p)}={v}" for p, v in o.values) for o in layers
        )
        or "no override"
    )


def instance_troubles(instances: Iterable[Instance], now: float | None = None) -> dict[str, str]:
    """What an operator must see of each instance in trouble, by name (STATUS=, the metrics port's
    ``/health``, ``daemon.json``): failed (with when it is tried again, or that it is not), or ready
    while its ``/health`` fails (for how long). ``now``: wall time (the supervisor records wall times)."""
    now = time.time() if now is None else now
    out: dict[str, str] = {}
    for i in instances:
        name, state = getattr(i, "name", "?"), i.state.value
        if state == "failed":
            kind = (getattr(i, "failure", None) or {}).get("kind", "unknown")
            retry = getattr(i, "retry_at", None)
            when = (
                f"tried again in {max(0.0, retry - now):.0f} s"
                if retry is not None
                else "not tried again: see `hwprofile status`"
            )
            out[name] = f"{name} FAILED ({kind}; {when})"
        elif state == "ready" and (since := getattr(i, "health_failing_since", None)) is not None:
            out[name] = f"{name} failing /health for {max(0.0, now - since):.0f} s"
    return out


def _dir_id(path: Path, missing_ok: bool = True) -> tuple[int, int] | None:
    """The (device, inode) of the directory at ``path``, never through a link; None when it is not there
    (or, with ``missing_ok`` False, FileNotFoundError) or is not a directory."""
    import stat

    try:
        st = os.lstat(path)
    except FileNotFoundError:
        if not missing_ok:
            raise
        return None
    except OSError:
        return None
    return (st.st_dev, st.st_ino) if stat.S_ISDIR(st.st_mode) else (-1, -1)


def instance_rss(inst: Instance) -> float | None:
    """The resident memory of an instance's processes (its API server and engines), or None."""
    from ..runtime.processes import tree_rss

    ident = getattr(inst, "ident", None)
    return float(r) if ident is not None and (r := tree_rss(ident)) is not None else None


class Errors(deque[str]):
    """The daemon's recent errors, each with its UTC time (``daemon.json``, ``hwprofile status``); one
    that was fixed is taken off (:meth:`fixed`), so what is listed still stands or says when it stood."""

    def __init__(self, maxlen: int = HISTORY) -> None:
        super().__init__(maxlen=maxlen)

    def append(self, msg: str) -> None:
        super().append(time.strftime("%Y-%m-%dT%H:%M:%SZ ", time.gmtime()) + msg)

    def fixed(self, about: str) -> None:
        """Take off every error whose text contains ``about`` (the trouble is over)."""
        keep = [e for e in self if about not in e]
        if len(keep) != len(self):
            self.clear()
            self.extend(keep)


@dataclass
class InFlight:
    """The one restart in flight. ``new``: the instance to start, while the restart is still in its
    ``watch.unready_s`` lead (``/health`` of the metrics port answers 503; the drain begins at
    ``drain_at``); None once the supervisor was told."""

    action: Action
    started: float
    replacements_before: int
    overrides: list[Overrides]
    new: InstancePlan | None = None
    drain_at: float = 0.0


class Daemon:
    """The loop's state and one tick; :meth:`run` drives it until asked to stop."""

    def __init__(
        self,
        plan: Plan,
        replan: Callable[[Sequence[str | Overrides]], Plan],
        supervisor: Supervising,
        sampler: GpuSource,
        settings: Watch,
        degrade: DegradeSection,
        runtime: Path,
        clock: Callable[[], float] = time.monotonic,
        scraper: Callable[[str, str, float], InstanceReading] = scrape,
        collect: Callable[[dict[str, str], float], dict[str, InstanceReading]] | None = None,
        on_tick: Callable[[Daemon, Report], None] | None = None,
        rss_reader: Callable[[Instance], float | None] | None = None,
    ) -> None:
        """``replan(extra)`` returns a :class:`Plan` (``PlanInputs.replan``; ``extra``: typed override
        layers, a degrade step's); ``supervisor``: a
        :class:`~hwprofile.supervise.supervisor.Supervisor` or a fake with its ``instances``,
        ``release`` and ``render``; ``settings`` and ``degrade``: the plan's ``watch`` and
        ``degrade`` sections (a test may give others)."""
        self.plan = plan
        self.replan = replan
        self.sup = supervisor
        self.sampler = sampler
        self.settings = settings
        self.degrade = degrade
        self.runtime = runtime
        self.clock = clock
        self.scraper = scraper
        # every ready instance's /metrics: off the loop's thread in the daemon (ScrapePool.collect),
        # one after another with a test's fake scraper
        self.collect = collect or (lambda targets, now: {n: scraper(n, u, now) for n, u in targets.items()})
        self.on_tick = on_tick
        self.rss_reader = rss_reader or instance_rss  # a test gives its own readings
        self._scraped: dict[str, InstanceReading] = {}  # each ready instance's last scrape that was made
        self._rss_at: dict[str, float] = {}
        per_batch = bool(supervisor.release.spec_table().get("per_batch_size"))
        self.watcher = Watcher(settings, [instance_spec(plan, i, per_batch) for i in plan.instances])
        self.queue: deque[Action] = deque()
        self.current: InFlight | None = None
        self.history: deque[dict[str, Any]] = deque(maxlen=HISTORY)
        self.errors = Errors()
        self._write_failed: str | None = None  # daemon.json could not be written: why (said once)
        self.published = Published()
        self.report: Report | None = None
        self.ticks = self.missed = 0
        self.levels: dict[str, int] = {i.name: 0 for i in plan.instances}  # degrade step running
        self.degrade_why: dict[str, str] = {}  # why each instance was last degraded (its layer's label)
        self.per_batch = per_batch
        self._init_reload()
        self._deferred_said: set[str] = set()  # deferred actions already logged (said once each)
        self.stopping = False  # set when the daemon was asked to stop: /health answers 503 at once
        self.watcher.power = (degrade.power_limit_factor, degrade.power_limit_hold_s)
        self.power_saved: dict[int, int] = {}  # GPU -> its power limit (mW) before the daemon lowered it
        # the runtime directory as it was at start (None: not there): one deleted under the daemon is made
        # again with its lock; another directory in its place (not made by this daemon) is never written into
        self.runtime_id = _dir_id(runtime)
        self.runtime_trouble: str | None = None
        self.handlers = self._dispatcher()

    def _init_reload(self) -> None:
        """Reload (SIGHUP, ``hwprofile reload``, an edited override): one flag, handled at the next tick."""
        self.reload_requested: str | None = None  # why; set from a signal handler: a plain store
        self.poll_changes: Callable[[float], str | None] | None = None  # the overrides watcher
        self.on_reloading: Callable[[Daemon], None] | None = None  # RELOADING=1
        self.on_reloaded: Callable[[Daemon], None] | None = None  # READY=1, in a finally
        self.reload_error: str | None = None  # the last reload's error, while its plan is refused
        self.last_reload: dict[str, Any] | None = None
        self.pending: deque[tuple[str, InstancePlan]] = deque()  # instances to restart for a reload

    def _dispatcher(self) -> dict[type[Action], Callable[[Any, dict[str, Instance]], None]]:
        """The one place an action is carried out, keyed on its type (a new reaction: a policy that
        returns a new action class, and its handler here)."""
        return {
            Drain: self._on_drain,
            PowerCap: self._on_power,
            Recover: self._on_recover,
            Degrade: self._on_degrade,
            Restart: self._on_restart,
            Recycle: self._on_restart,
        }

    # -- one tick ---------------------------------------------------------------------------------
    def instances(self) -> dict[str, Instance]:
        return {i.name: i for i in self.sup.instances}

    def tick(self) -> Report:
        t0 = time.perf_counter()
        now = self.clock()
        # the GPUs first: neither a re-plan (reload) nor a /metrics that hangs or trickles delays a
        # thermal reading
        readings = self.sampler.sample(now)
        self._guard_runtime()
        if self.poll_changes is not None:
            why = self.poll_changes(now)
            if why:
                self.request_reload(why)
        if self.reload_requested:
            why, self.reload_requested = self.reload_requested, None
            self.reload(why)
        insts = self.instances()
        busy = {q.instance for q in self.queue} | {n for n, _ in self.pending}
        if self.current is not None:
            busy.add(self.current.action.instance)
        scrapes = self._scrape(now, insts, busy)
        self._read_rss(now, insts, scrapes)
        rep = self.watcher.tick(now, readings, scrapes, busy=frozenset(busy))
        for change, gpu in zip(rep.changes, rep.changed_gpus, strict=True):
            log.warning("%s", change, extra={"GPU": gpu})
        for note in rep.deferred:  # said once while it stands, not at every tick
            if note not in self._deferred_said:
                log.warning("%s", note)
        self._deferred_said = set(rep.deferred)
        for a in rep.actions:
            self.act(a, insts)
        self._progress(now)
        self.ticks += 1
        self.report = rep
        self._publish(rep, time.perf_counter() - t0)
        if self.on_tick:
            self.on_tick(self, rep)
        return rep

    # -- the dispatcher: each action type's handler -------------------------------------------------
    def act(self, a: Action, insts: dict[str, Instance]) -> None:
        """Carry out one action decided by a policy: the handler registered for its type."""
        handler = self.handlers.get(type(a))
        if handler is None:
            raise TypeError(f"no handler for the action {type(a).__name__} ({a.instance}: {a.reason})")
        handler(a, insts)

    def _on_drain(self, a: Drain, insts: dict[str, Instance]) -> None:
        self._drain(a, insts.get(a.instance))

    def _on_power(self, a: PowerCap, insts: dict[str, Instance]) -> None:
        self._power(a)

    def _on_recover(self, a: Recover, insts: dict[str, Instance]) -> None:
        self.restore_power(a.gpus, a)
        if a.level == 0 and self.levels.get(a.instance, 0) == 0 and not self._queued(a.instance):
            self._record(a, "done", "power limit restored; no restart (the batch was never cut)")
            return
        self._enqueue(a)
        self._said_step(a)

    def _on_degrade(self, a: Degrade, insts: dict[str, Instance]) -> None:
        self._enqueue(a)
        self._said_step(a)

    def _on_restart(self, a: Restart | Recycle, insts: dict[str, Instance]) -> None:
        if self._queued(a.instance):
            return  # the action queued for it restarts it anyway, and at the step it decided
        self._enqueue(a)
        log.warning(
            "decided: %s %s (drain, then the same settings): %s",
            a.kind,
            a.instance,
            a.reason,
            extra=fields(a),
        )

    def _queued(self, name: str) -> bool:
        return any(q.instance == name for q in self.queue)

    def _enqueue(self, a: Action) -> None:
        """Queue a restarting action; the newest decision for an instance wins."""
        self.queue = deque(q for q in self.queue if q.instance != a.instance)
        self.queue.append(a)

    @staticmethod
    def _said_step(a: Action) -> None:
        log.warning(
            "decided: %s %s to degrade step %d: %s", a.kind, a.instance, a.level, a.reason, extra=fields(a)
        )

    def _guard_runtime(self) -> None:
        """The runtime directory and the supervisor's lock in it, checked at each tick (two ``lstat``): a
        directory deleted under the daemon (``/run/user/UID`` goes at logout without linger) is made again,
        this user's and 0700, and the lock taken again in it, so that `status` and `reload` find the daemon
        and a second daemon is refused; another directory in its place, or the lock held by another process,
        is reported (log, STATUS=, ``/health``) and never written into."""
        if self.runtime_id is None or self.runtime_id == (-1, -1):
            return  # nothing of its own there at start (a test's daemon): nothing to keep
        lock = getattr(self.sup, "runtime_lock", None)
        try:
            now_id = _dir_id(self.runtime, missing_ok=False)
        except FileNotFoundError:
            now_id = None
        except OSError as e:
            self._runtime_said(f"the runtime directory {self.runtime} cannot be checked: {e.strerror or e}")
            return
        remade = False
        if now_id is None:
            from ..runtime.dirs import private_dir

            try:
                private_dir(self.runtime)
            except (OSError, HwprofileError) as e:
                self._runtime_said(
                    f"the runtime directory {self.runtime} was deleted and cannot be made again: {e}"
                )
                return
            log.warning(
                "the runtime directory %s was deleted under the daemon: made again (0700)", self.runtime
            )
            self.runtime_id, remade = _dir_id(self.runtime), True
        elif now_id != self.runtime_id:
            self._runtime_said(
                f"the runtime directory {self.runtime} was replaced by a directory this daemon did not make: "
                "not written into (its state is not published there; restart the daemon to use it)"
            )
            return
        if lock is not None and not lock.intact():
            try:
                lock.reacquire()
            except (OSError, HwprofileError) as e:
                self._runtime_said(f"the supervisor's lock in {self.runtime} cannot be taken again: {e}")
                return
            log.warning(
                "the supervisor's lock %s was gone: taken again (a second daemon is refused)", lock.path
            )
        if remade and hasattr(self.sup, "adopt_runtime"):
            self.sup.adopt_runtime()  # made again by this daemon: the supervisor's state files go there
        if remade and hasattr(self.sup, "save"):
            try:
                self.sup.save()  # the state file again: `hwprofile status` finds what runs
            except OSError as e:
                log.error("cannot write the state file again in %s: %s", self.runtime, e)
        if self.runtime_trouble is not None:
            log.warning("the runtime directory %s is this daemon's again", self.runtime)
            self.errors.fixed(str(self.runtime))
        self.runtime_trouble = None

    def _runtime_said(self, msg: str) -> None:
        if msg != self.runtime_trouble:
            log.error("%s", msg)
            self.errors.append(msg)
        self.runtime_trouble = msg

    def idle_scrape_s(self) -> float:
        """How long an idle instance's last scrape stands for it (:data:`IDLE_SCRAPE_S`, at most a
        quarter of ``watch.stall_s``, never less than one tick)."""
        s = self.settings
        bound = min(IDLE_SCRAPE_S, s.stall_s / 4) if s.stall_s > 0 else IDLE_SCRAPE_S
        return max(bound, s.interval)

    def _scrape(self, now: float, insts: dict[str, Instance], busy: set[str]) -> dict[str, InstanceReading]:
        """Every ready instance's reading: a new scrape, but for an instance idle at its last one made
        less than :meth:`idle_scrape_s` ago and not ``busy``, whose last reading stands (an idle server's
        counters stand still)."""
        ready = {
            name: spec.url
            for name, spec in self.watcher.instances.items()
            if name in insts and insts[name].state.value == "ready"
        }
        for name in [n for n in self._scraped if n not in ready]:
            del self._scraped[name]  # not ready: the next start is scraped afresh
        stands = {}
        for name, last in self._scraped.items():
            m = last.metrics
            idle = last.status == "metrics_disabled" or (
                last.status == "ok" and m is not None and not m.running and not m.waiting
            )
            if idle and name not in busy and now - last.at < self.idle_scrape_s() - 1e-9:
                stands[name] = last
        fresh = self.collect({n: u for n, u in ready.items() if n not in stands}, now)
        self._scraped.update(fresh)
        return {**fresh, **stands}

    def _read_rss(self, now: float, insts: dict[str, Instance], scrapes: dict[str, InstanceReading]) -> None:
        """Each scraped instance's process RSS, every ``RSS_EVERY_S`` (the drift policy's slow reading)."""
        for name in scrapes:
            if now - self._rss_at.get(name, -RSS_EVERY_S) < RSS_EVERY_S or name not in insts:
                continue
            self._rss_at[name] = now
            rss = self.rss_reader(insts[name])
            if rss is None:
                self.watcher.rss.pop(name, None)
            else:
                self.watcher.rss[name] = float(rss)

    def _drain(self, a: Drain, inst: Instance | None) -> None:
        """A hardware fault on the instance's GPU(s): stop it now (SIGTERM: vLLM drains its requests
        within its shutdown timeout), drop what was queued for it, never restart it there."""
        self.queue = deque(q for q in self.queue if q.instance != a.instance)
        self.pending = deque(p for p in self.pending if p[0] != a.instance)
        kinds = dict.fromkeys(
            k for g in a.gpus if g in self.watcher.faults for k in fault_kinds(self.watcher.faults[g])
        )
        f = {**fields(a), "FAULT": ",".join(kinds) or None}  # journalctl FAULT=xid_79
        log.error(
            "drain %s: hardware fault on GPU %s: %s",
            a.instance,
            ",".join(map(str, a.gpus)),
            a.reason,
            extra=f,
        )
        self.published.actions_total["drain"] = self.published.actions_total.get("drain", 0) + 1
        if inst is None:
            self._record(a, "failed", "no such instance under the supervisor")
            return
        inst.stop()
        self._record(a, "done", "stopped; not restarted on this GPU")

    def _power(self, a: PowerCap) -> None:
        """Lower the power limit of the action's GPUs to ``degrade.power_limit_factor`` of their limit (never
        below the card's minimum); no restart. When it cannot be set (not root, a card without constraints,
        a fake sampler) the lever is off for that instance and the batch steps decide at the next tick."""
        from .policy import power_target

        factor = self.degrade.power_limit_factor
        done: list[str] = []
        failed: str | None = None
        if not hasattr(self.sampler, "set_power_limit"):
            failed = "this sampler cannot set a power limit"
        for g in a.gpus if failed is None else ():
            if g in self.power_saved:
                continue
            limit, lo, _hi, err = self.sampler.power_limits(g)
            if err or limit is None or lo is None:
                failed = f"GPU {g}: its power limit and constraints cannot be read ({err or 'no answer'})"
                break
            target = power_target(limit, lo, factor)
            if target >= limit:
                failed = f"GPU {g}: already at its minimum power limit {lo / 1000:.0f} W"
                break
            err = self.sampler.set_power_limit(g, target)
            if err:
                failed = f"GPU {g}: {err} (setting a power limit needs root)"
                break
            self.power_saved[g] = limit
            done.append(f"GPU {g} {limit / 1000:.0f} -> {target / 1000:.0f} W (minimum {lo / 1000:.0f} W)")
        self.published.actions_total["power"] = self.published.actions_total.get("power", 0) + 1
        if failed is None:
            log.warning("action: power %s: %s: %s", a.instance, a.reason, "; ".join(done), extra=fields(a))
            self._record(a, "done", "; ".join(done))
            return
        self.restore_power(a.gpus)
        self.watcher.power_failed(a.instance, failed)
        msg = f"power {a.instance}: the power limit is not lowered: {failed}; the batch steps decide"
        log.warning("%s", msg, extra=fields(a))
        self._record(a, "failed", msg)

    def restore_power(self, gpus: Iterable[int] | None = None, a: Action | None = None) -> None:
        """Put back the power limit of ``gpus`` (all the daemon lowered: None), on recover and on exit."""
        for g in sorted(self.power_saved if gpus is None else [g for g in gpus if g in self.power_saved]):
            limit = self.power_saved.pop(g)
            err = self.sampler.set_power_limit(g, limit)
            if err:
                msg = f"GPU {g}: the power limit {limit / 1000:.0f} W could not be restored: {err}"
                log.error("%s", msg, extra={"GPU": str(g)})
                self.errors.append(msg)
            else:
                log.warning(
                    "GPU %d: power limit restored to %.0f W%s",
                    g,
                    limit / 1000,
                    f" ({a.kind} {a.instance})" if a else "",
                    extra={"GPU": str(g), "ACTION": "power"},
                )

    def _progress(self, now: float) -> None:
        """Finish the restart in flight, or start the next one (one instance at a time)."""
        insts = self.instances()
        if self.current is not None and not self._finish_current(self.current, insts, now):
            return
        if not self._start_reloads(insts, now):
            return
        while self.queue and self.current is None:
            a = self.queue.popleft()
            inst = insts.get(a.instance)
            if inst is None or inst.state.value != "ready":
                self.queue.appendleft(a)  # wait until it is ready (a restart of its own, a start)
                return
            self._apply(a, inst, now)

    def _finish_current(self, cur: InFlight, insts: dict[str, Instance], now: float) -> bool:
        """The restart in flight: its new settings are applied once its drain time is over, then it is done
        when its instance is ready again after the replacement, or failed when the instance failed or
        stopped. True when it is over (``self.current`` is then None), False while it is in flight."""
        inst = insts.get(cur.action.instance)
        state = inst.state.value if inst is not None else "failed"
        if cur.new is not None and inst is not None and state not in ("failed", "stopped"):
            if now >= cur.drain_at:  # before: /health of the metrics port says 503, the balancer stops
                inst.replace(cur.new)
                cur.new = None
            return False
        if (
            inst is not None
            and state == "ready"
            and inst.replacements > cur.replacements_before
            and not inst.replacing
        ):
            self._done(cur, now)
        elif state in ("failed", "stopped"):
            self._failed(cur.action, inst, state)
        else:
            return False
        self.current = None
        return True

    def _done(self, cur: InFlight, now: float) -> None:
        """A restart whose instance is ready again: logged and recorded, its degrade step in force."""
        a = cur.action
        took = now - cur.started
        ranks = self._ranks(a.instance)
        whole = f" (downtime of the data-parallel server: all {ranks} ranks)" if ranks > 1 else ""
        log.warning(
            "done: %s %s at degrade step %d, ready again after %.0f s%s",
            a.kind,
            a.instance,
            a.level,
            took,
            whole,
            extra=fields(a),
        )
        self._record(a, "done", f"ready again after {took:.0f} s{whole}")
        self.levels[a.instance] = a.level

    def _failed(self, a: Action, inst: Instance | None, state: str) -> None:
        """A restart whose instance failed or stopped (or is gone): an error, recorded, and the watcher back
        at the step in force."""
        msg = f"{a.kind} {a.instance}: the instance is {state} ({(inst.failure or {}) if inst is not None else ''})"
        log.error("%s", msg, extra=fields(a))
        self.errors.append(msg)
        self._record(a, "failed", msg)
        self.watcher.set_level(a.instance, self.levels.get(a.instance, 0))

    def _start_reloads(self, insts: dict[str, Instance], now: float) -> bool:
        """A reload's restarts, first and one at a time: a failed instance to be tried again takes its new
        settings then, a failed, stopped or gone one is skipped with an error, a ready one is restarted.
        False when the next one is not ready yet (nothing else starts before it)."""
        while self.pending and self.current is None:
            name, new = self.pending[0]
            inst = insts.get(name)
            retry_at = getattr(inst, "retry_at", None) if inst is not None else None
            if inst is not None and inst.state.value == "failed" and retry_at is not None:
                self.pending.popleft()  # failed, to be tried again: it starts with the new settings then
                inst.replace(new)
                log.warning(
                    "reload: %s is failed and tried again in %.0f s: with its new settings",
                    name,
                    max(0.0, retry_at - time.time()),
                    extra={"INSTANCE": name, "ACTION": "reload"},
                )
                continue
            if inst is None or inst.state.value in ("failed", "stopped"):
                self.pending.popleft()
                msg = f"reload: {name} is {inst.state.value if inst else 'gone'}: its new settings are not applied"
                log.error("%s", msg)
                self.errors.append(msg)
                continue
            if inst.state.value != "ready":
                return False  # wait until it is ready
            self.pending.popleft()
            a = Reload(name, "the configuration changed", tuple(new.gpus or ()), self.levels.get(name, 0))
            log.warning(
                "action: reload %s: the configuration changed; restarting it (drain, then the new settings)",
                name,
            )
            self._record(a, "started", "the configuration changed")
            self._begin(a, inst, new, now, [])
        return True

    def _apply(self, a: Action, inst: Instance, now: float) -> None:
        base = next((i for i in self.plan.instances if i.name == a.instance), None)
        if base is None:
            return
        if isinstance(a, Degrade):
            self.degrade_why[a.instance] = a.reason
        step, why = degrade_overrides(base, a.level, self.degrade, self.degrade_why.get(a.instance))
        sets = [step] if step is not None else []
        advice = next(
            (i.advice for i in (self.report.instances if self.report else ()) if i.name == a.instance), None
        )
        if self.settings.apply_k_advice and advice is not None and advice.k != advice.current_k:
            # watch.apply_k_advice: the advised k rides along with this restart (never on its own), its
            # own layer over the degrade step's
            value = (
                (("speculative", "method"), "none")
                if advice.k == 0
                else (("speculative", "num_speculative_tokens"), advice.k)
            )
            sets.append(Overrides("k-advice", advice.reason, (value,)))
            why.append(f"k advice applied: {advice.reason}")
        try:
            new_plan = self.replan(sets)
        except Exception as e:  # a refused re-plan keeps the instance as it runs
            msg = f"{a.kind} {a.instance}: re-plan with {shown(sets)} failed: {e}"
            log.error("%s", msg, extra=fields(a))
            self.errors.append(msg)
            self._record(a, "failed", msg)
            self.watcher.set_level(a.instance, self.levels.get(a.instance, 0))
            return
        new = next((i for i in new_plan.instances if i.name == a.instance), None)
        if new is None:
            msg = f"{a.kind} {a.instance}: the re-plan has no instance of that name: not applied"
            log.error("%s", msg, extra=fields(a))
            self.errors.append(msg)
            self._record(a, "failed", msg)
            self.watcher.set_level(a.instance, self.levels.get(a.instance, 0))
            return
        ranks = self._ranks(a.instance)
        if ranks > 1:  # one API server: its ranks restart together, the URL is down meanwhile
            why.append(
                f"a data-parallel server: all {ranks} ranks restart (layout.shape=servers isolates them)"
            )
        log.warning(
            "action: %s %s to degrade step %d (%s): %s; restarting it (drain, then the new settings)",
            a.kind,
            a.instance,
            a.level,
            a.reason,
            "; ".join(why) or "the full profile",
            extra=fields(a),
        )
        self.published.actions_total[a.kind] = self.published.actions_total.get(a.kind, 0) + 1
        detail = "; ".join(why) or "the full profile"
        # the layer the new values come from, as their provenance says it: "degrade step 1 (GPU 0 hot: ...)"
        self._record(a, "started", f"{step.kind} {step.label}: {detail}" if step is not None else detail)
        self._begin(a, inst, new, now, sets)

    def _begin(self, a: Action, inst: Instance, new: InstancePlan, now: float, sets: list[Overrides]) -> None:
        """The restart of ``inst`` as ``new``: at once, or after ``watch.unready_s`` of 503 on the
        metrics port's ``/health`` (a pod's readiness probe fails first, so its Service routes
        elsewhere before the drain)."""
        lead = self.settings.unready_s
        self.current = InFlight(a, now, inst.replacements, sets, new if lead > 0 else None, now + lead)
        if lead > 0:
            log.warning(
                "%s %s: /health answers 503 for %.0f s before the drain (watch.unready_s)",
                a.kind,
                a.instance,
                lead,
                extra=fields(a),
            )
        else:
            inst.replace(new)

    def unready(self) -> str | None:
        """Why the instances are not to be sent requests now (``/health`` of the metrics port), or None."""
        if self.stopping:
            return "the daemon is stopping: draining"
        if self.current is not None:
            a = self.current.action
            if self.current.new is not None:
                return f"{a.kind} of {a.instance}: its drain begins in {max(0.0, self.current.drain_at - self.clock()):.0f} s"
            return f"{a.kind} of {a.instance}: restarting"
        insts = list(self.sup.instances)
        if not insts:
            return "no instance"
        troubles = instance_troubles(insts)
        waiting = [
            troubles.get(i.name) or f"{i.name} is {i.state.value}"
            for i in insts
            if i.state.value != "ready" or i.name in troubles
        ]
        return ", ".join(waiting) or None

    def troubles(self) -> tuple[str, ...]:
        """The daemon's own troubles that ``/health`` says beside its answer: the runtime directory (the
        loop's guard, the supervisor's state files) and a ``daemon.json`` that cannot be written."""
        said = (self.runtime_trouble, getattr(self.sup, "runtime_trouble", None), self._write_failed)
        return tuple(dict.fromkeys(t for t in said if isinstance(t, str)))

    def _ranks(self, name: str) -> int:
        inst = next((i for i in self.plan.instances if i.name == name), None)
        return inst.ranks if inst is not None else 1

    # -- reload ---------------------------------------------------------------------------------
    def request_reload(self, why: str) -> None:
        """Ask for a reload at the next tick (safe from a signal handler: one store)."""
        self.reload_requested = why

    def reload(self, why: str) -> None:
        """Re-plan from the same inputs and apply the difference; an invalid configuration keeps the
        last good plan (error in the log, STATUS= and daemon.json). ``on_reloaded`` runs in a finally."""
        log.info("reload (%s): re-planning", why)
        if self.on_reloading:
            self.on_reloading(self)
        try:
            try:
                new_plan = self.replan([])
            except Exception as e:
                self.reload_error = " ".join(str(e).split()) or type(e).__name__
                msg = f"reload ({why}): the configuration is invalid, the last good plan is kept: {self.reload_error}"
                log.error("%s", msg)
                self.errors.append(msg)
                self.last_reload = {
                    "at": time.time(),
                    "reason": why,
                    "outcome": "failed",
                    "detail": self.reload_error,
                }
                return
            self.reload_error = None
            self.errors.fixed("reload (")  # the configuration is valid again: the reload errors are over
            self.errors.fixed("the configuration is invalid")
            detail = self.apply_plan(new_plan)
            self.last_reload = {"at": time.time(), "reason": why, "outcome": "applied", "detail": detail}
            log.warning("reload (%s): %s", why, detail)
        except Exception as e:
            self.reload_error = f"{type(e).__name__}: {e}"
            self.errors.append(f"reload ({why}) failed: {self.reload_error}")
            log.error("reload (%s) failed: %s", why, self.reload_error, exc_info=e)
            self.last_reload = {
                "at": time.time(),
                "reason": why,
                "outcome": "failed",
                "detail": self.reload_error,
            }
        finally:
            if self.on_reloaded:
                self.on_reloaded(self)

    def apply_plan(self, new_plan: Plan) -> str:
        """Make ``new_plan`` the running plan: unchanged instances keep running; watch.* and degrade.*
        take effect at once; each changed instance is queued for a restart (one at a time, each
        waiting for /health, at its degrade step). A different set of instances is refused."""
        old = {i.name: i for i in self.plan.instances}
        new = {i.name: i for i in new_plan.instances}
        if old.keys() != new.keys():
            raise ValueError(
                f"the planned instances changed ({', '.join(sorted(old))} -> {', '.join(sorted(new))}): "
                "restart the daemon to apply that"
            )
        changed = [
            n for n in new if self._fingerprint(new_plan, new[n]) != self._fingerprint(self.plan, old[n])
        ]
        degrade = new_plan.degrade
        replacements = []  # everything that can fail comes before the first change of state
        for n in changed:
            inst = new[n]
            level = self.levels.get(n, 0)
            if level:  # keep its degrade step: re-plan it with that step's settings
                step, _ = degrade_overrides(inst, level, degrade, self.degrade_why.get(n))
                inst = self.replan([step] if step is not None else []).instance(n)
            replacements.append((n, inst))
        settings = new_plan.watch
        notes = []
        if settings != self.plan.watch:
            self.settings = settings
            self.watcher.settings = settings
            notes.append("watch.* applied")
        self.degrade = degrade
        self.watcher.power = (degrade.power_limit_factor, degrade.power_limit_hold_s)
        self.plan = new_plan
        for n, inst in replacements:
            self.pending = deque(p for p in self.pending if p[0] != n)
            self.pending.append((n, inst))
            self.watcher.instances[n] = instance_spec(new_plan, new[n], self.per_batch)
        notes.append(f"restarting {', '.join(changed)} one at a time" if changed else "no instance changed")
        return "; ".join(notes)

    def _fingerprint(self, plan: Plan, inst: InstancePlan) -> str:
        """What a running instance is made of: its rendered argv and environment (so a comment, a
        provenance line or a daemon-only setting restarts nothing), plus the supervisor's settings."""
        doc = inst.to_json()
        extra = {k: doc.get(k) for k in ("gpus", "numa_node", "supervise", "logs")}
        r = self.sup.render(plan, inst)
        return json.dumps([r.argv, r.env, r.secrets, extra], sort_keys=True, default=str)

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
            "schema": DAEMON_SCHEMA,
            "updated_at": time.time(),
            "ticks": self.ticks,
            "missed_ticks": self.missed,
            "tick_seconds": self.published.tick_seconds,
            "watch": self.settings.to_json(),
            **rep,
            "actions": list(self.history),
            "queued": [{"kind": a.kind, "instance": a.instance, "level": a.level} for a in self.queue],
            "restarting": self.current.action.instance if self.current else None,
            "degrade_levels": dict(self.levels),
            # GPUs whose power limit the daemon lowered (the power step), with the limit it restores
            "power_limits_lowered": {str(g): mw / 1000 for g, mw in self.power_saved.items()},
            "power_lever_off": dict(self.watcher.no_power),
            "pid": os.getpid(),
            "reload": self.last_reload,
            "reload_error": self.reload_error,
            "pending_restarts": [n for n, _ in self.pending],
            "troubles": list(instance_troubles(self.sup.instances).values()),
            "errors": list(self.errors) + rep.get("errors", []),
        }

    def _publish(self, rep: Report, took: float) -> None:
        p = self.published
        p.report = rep
        p.instance_states = {i.name: i.state.value for i in self.sup.instances}
        p.restarts = {i.name: i.restarts for i in self.sup.instances}
        front = getattr(self.sup, "front", None)
        p.front = front.record() if front is not None else None
        wall = time.time()
        p.retry_in = {
            i.name: max(0.0, at - wall)
            for i in self.sup.instances
            if (at := getattr(i, "retry_at", None)) is not None
        }
        p.health_failing_s = {
            i.name: max(0.0, wall - since)
            for i in self.sup.instances
            if (since := getattr(i, "health_failing_since", None)) is not None
        }
        p.ticks_total, p.missed_ticks_total, p.tick_seconds = self.ticks, self.missed, took
        p.unready, p.last_tick_at, p.interval = self.unready(), self.clock(), self.settings.interval
        p.troubles = self.troubles()
        if self.runtime_trouble is not None:
            return  # never into a directory this daemon did not make (the trouble is in the log and STATUS=)
        path = self.runtime / DAEMON_FILE
        try:
            write_doc(path, DaemonDoc.from_json(self.document()), durable=False)
        except OSError as e:
            msg = f"cannot write {path}: {e}"
            if self._write_failed != msg:
                log.error("%s", msg)
                self.errors.append(msg)
                self._write_failed = msg
            with contextlib.suppress(OSError):
                os.utime(path)  # a full disk still takes a new time: `status` says the daemon ticks
            return
        if self._write_failed is not None:
            log.warning("%s is written again", path)
            self._write_failed = None
            self.errors.fixed(f"cannot write {path}")
            with contextlib.suppress(OSError):  # the figures again, without the error that is over
                write_doc(path, DaemonDoc.from_json(self.document()), durable=False)

    # -- the loop ------------------------------------------------------------------------------------
    def run(self, stop: threading.Event) -> None:
        """Tick every ``watch.interval`` on monotonic deadlines until ``stop`` is set (a tick that
        ends after the next deadline is counted as missed and the schedule moves on)."""
        deadline = self.clock()
        while not stop.is_set():
            step = self.settings.interval  # a reload may change it
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
