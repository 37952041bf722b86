"""The composition root of ``hwprofile daemon``: it builds the parts from one validated launch and wires
them, each construction step a named function:

- the readers: the GPU sampler (:func:`build_sampler`) and the /metrics scrape pool;
- the start: the plan each instance starts with (:func:`start_plan`: a card already hot starts its
  instances degraded);
- the supervisor (through the one door, :func:`hwprofile.launch.start.supervisor`);
- the loop (:func:`build_loop`: the :class:`~.loop.Daemon`, its watcher and policies, its dispatcher);
- the config watch (:func:`watch_config`), the exporter (:func:`serve_metrics`), the signals
  (:func:`install_signals`) and the service manager's notifications (:class:`ServiceHooks`);

then runs the loop until SIGTERM/SIGINT, and drains and stops everything (:func:`shut_down`). Tests build
:class:`~.loop.Daemon` themselves with fakes; this wires the real parts."""

from __future__ import annotations

import contextlib
import dataclasses
import gc
import logging
import signal
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from ..errors import HwprofileError
from ..plan.degrade import degrade_overrides
from ..runtime.dirs import private_dir
from ..supervise.runfiles import DAEMON_FILE, LAST_GOOD_FILE, LaunchDoc, write_doc
from .actions import Degrade
from .loop import Daemon
from .notify import Notifier, status_line
from .policy import start_levels

if TYPE_CHECKING:
    from types import FrameType
    from wsgiref.simple_server import WSGIServer

    from ..config.layers import Overrides
    from ..host.sampler import GpuSampler
    from ..launch.start import Launch
    from ..plan.types import Plan
    from ..supervise.supervisor import Supervisor
    from ..telemetry.scrape import ScrapePool
    from .overrides import ConfigWatch
    from .watcher import Report

log = logging.getLogger("hwprofile")
STOP_SLACK_S = 30  # beyond the drain and its margin: last.json, the exporter, the daemon's own exit


@dataclass
class Parts:
    """What the composition root built, for the shutdown to take down in order."""

    launch: Launch
    sampler: GpuSampler
    scrapes: ScrapePool
    sup: Supervisor
    daemon: Daemon
    notifier: Notifier
    stop: threading.Event = field(default_factory=threading.Event)
    stopped_by_signal: threading.Event = field(default_factory=threading.Event)
    cwatch: ConfigWatch | None = None
    server: WSGIServer | None = None
    thread: threading.Thread | None = None


def build_sampler(plan: Plan) -> GpuSampler:
    """The GPU reader: NVML handles kept for the planned GPUs."""
    from ..host.sampler import GpuSampler

    gpus = sorted({g for i in plan.instances for g in i.gpus or ()})
    sampler = GpuSampler(gpus if gpus else None)
    if sampler.error and gpus:
        log.error("NVML: %s: GPUs are not watched (the instances still run)", sampler.error)
    return sampler


def start_plan(
    plan: Plan, replan: Callable[[Sequence[str | Overrides]], Plan], sampler: GpuSampler
) -> tuple[Plan, dict[str, tuple[int, str]]]:
    """The plan the instances start with, and the degrade step each starts at: a card already hot starts
    its instances degraded, not at the full profile a dwell from a restart."""
    levels = start_levels({i.name: i.gpus for i in plan.instances if i.gpus}, sampler.sample(0.0), plan.watch)
    out = plan
    for name, (step, why) in levels.items():
        layer, what = degrade_overrides(plan.instance(name), step, plan.degrade, why)
        try:
            degraded = replan([layer] if layer is not None else []).instance(name)
        except Exception as e:  # a refused re-plan: it starts at the full profile and the loop acts
            log.error(
                "%s: %s, but its degrade step %d cannot be planned (%s): started at the full profile",
                name,
                why,
                step,
                e,
            )
            continue
        log.warning("%s: %s: starting at degrade step %d (%s)", name, why, step, "; ".join(what))
        out = dataclasses.replace(
            out, instances=tuple(degraded if i.name == name else i for i in out.instances)
        )
    return out, levels


def build_loop(
    launch: Launch,
    replan: Callable[[Sequence[str | Overrides]], Plan],
    sup: Supervisor,
    sampler: GpuSampler,
    scrapes: ScrapePool,
    started: Plan,
    levels: dict[str, tuple[int, str]],
    started_from: str | None,
) -> Daemon:
    """The loop (its watcher, the policies, the dispatcher), told the steps the instances started at."""
    plan = launch.plan
    daemon = Daemon(
        plan, replan, sup, sampler, plan.watch, plan.degrade, launch.runtime, collect=scrapes.collect
    )
    for name, (step, why) in levels.items():
        if started.instance(name) is not plan.instance(name):
            daemon.levels[name] = step
            daemon.watcher.set_level(name, step)
            daemon._record(
                Degrade(name, why, tuple(plan.instance(name).gpus or ()), step), "done", "at start"
            )
    if started_from:  # the configuration is invalid: the kept plan runs, and everyone is told why
        log.error("%s", started_from)
        daemon.reload_error = started_from
        daemon.errors.append(started_from)
    return daemon


def install_signals(p: Parts) -> None:
    """SIGTERM/SIGINT: drain and stop (``/health`` answers 503 at once); SIGHUP: a reload at the next tick."""

    def on_signal(signum: int, _frame: FrameType | None) -> None:
        log.info("received %s: draining and stopping every instance", signal.Signals(signum).name)
        p.sup.end_reason = f"the daemon was stopped by {signal.Signals(signum).name}"
        p.daemon.stopping = True
        p.daemon.published.unready = "the daemon is stopping: draining"  # at once, not at the next tick
        p.stopped_by_signal.set()
        p.stop.set()

    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, on_signal)
    signal.signal(signal.SIGHUP, lambda _s, _f: p.daemon.request_reload("SIGHUP"))  # the loop reloads


def watch_config(daemon: Daemon, root: Path | None, quiet_s: float) -> ConfigWatch | None:
    """The live overrides: an edit under ``root`` is a reload at the next tick."""
    if root is None:
        return None
    from .overrides import ConfigWatch

    try:
        cwatch = ConfigWatch(root, quiet_s, daemon.clock)
    except OSError as e:
        log.error("cannot watch %s: %s (edits apply on SIGHUP / hwprofile reload)", root, e)
        return None
    daemon.poll_changes = cwatch.poll
    return cwatch


def serve_metrics(daemon: Daemon) -> tuple[WSGIServer | None, threading.Thread | None]:
    """The exporter on ``watch.metrics_port`` (/metrics, /health, /livez); a port that cannot be taken is
    an error in daemon.json (so `hwprofile status` says it), not a stop."""
    from .exporter import serve

    s = daemon.settings
    if not s.metrics_port:
        return None, None
    try:
        server, thread = serve(daemon.published, s.metrics_port, s.metrics_host)
    except OSError as e:
        msg = (
            f"metrics on {s.metrics_host}:{s.metrics_port} not served: {e} "
            "(watch.metrics_host, watch.metrics_port)"
        )
        log.error("%s", msg)
        daemon.errors.append(msg)
        return None, None
    log.info("hwprofile metrics on http://%s:%d/metrics (/health, /livez)", s.metrics_host, s.metrics_port)
    return server, thread


class ServiceHooks:
    """The service manager's side of the loop: READY=1 once every instance is ready (then the last good
    plan is kept), STATUS= and the watchdog after each tick, RELOADING=1 ... READY=1 around a reload."""

    def __init__(
        self,
        p: Parts,
        state_dir: Path | None,
        on_tick: Callable[[Daemon, Report], None] | None,
        on_ready: Callable[[Daemon], None] | None,
    ) -> None:
        self.p, self.state_dir, self.on_tick, self.on_ready = p, state_dir, on_tick, on_ready
        self.ready_said = False

    def attach(self, daemon: Daemon) -> None:
        daemon.on_reloading = self.reloading
        daemon.on_reloaded = self.reloaded
        daemon.on_tick = self.tick

    def keep_good(self, d: Daemon) -> None:
        """The plan running well, kept in the state directory: a restart whose configuration is
        invalid starts from it (cli.running.cmd_daemon)."""
        launch = self.p.launch
        if self.state_dir is None or launch.inputs is None:
            return
        try:
            doc = LaunchDoc(d.plan, launch.inputs, launch.release.rendered_for)
            write_doc(private_dir(self.state_dir) / LAST_GOOD_FILE, doc)
        except (OSError, HwprofileError) as e:
            log.error("cannot keep the last good plan in %s: %s", self.state_dir, e)

    def reloading(self, d: Daemon) -> None:
        # RELOADING=1 ... READY=1 only once the unit is ready (before that, READY=1 would start it early)
        if self.ready_said:
            self.p.notifier.reloading()

    def reloaded(self, d: Daemon) -> None:
        if self.ready_said:
            self.p.notifier.ready(status_line(d))
            if (d.last_reload or {}).get("outcome") == "applied":
                self.keep_good(d)

    def tick(self, d: Daemon, rep: Report) -> None:
        from ..supervise.lifecycle import State

        notifier = self.p.notifier
        if not self.ready_said and d.sup.instances and all(i.state == State.READY for i in d.sup.instances):
            self.ready_said = True
            log.info("every instance is ready")
            self.keep_good(d)
            notifier.ready(status_line(d))
            if self.on_ready:
                self.on_ready(d)
        elif notifier.enabled:
            notifier.status(status_line(d))
        notifier.watchdog()  # after each completed tick, at most every WATCHDOG_USEC / 2
        if self.on_tick:
            self.on_tick(d, rep)
        if self.p.sup.all_done:
            self.p.stop.set()  # every instance ended on its own (failed): nothing left to watch


def shut_down(p: Parts, on_stopping: Callable[[Daemon], None] | None) -> None:
    """Drain and stop every instance, then the parts in the reverse order of their making."""
    sup = p.sup
    # the instances drain at once: the longest drain, the SIGKILL margin and the daemon's own exit
    drain = max((float(i.inst.server.shutdown_timeout) for i in sup.instances), default=0.0)
    p.notifier.stopping(drain + p.launch.plan.supervise.stop_margin + STOP_SLACK_S)
    if p.cwatch is not None:
        p.cwatch.close()
    if on_stopping:
        on_stopping(p.daemon)
    sup.stop()
    sup.wait()
    sup.close()
    p.daemon.restore_power()  # a power limit the daemon lowered goes back before NVML closes
    p.sampler.close()
    p.scrapes.close()
    with contextlib.suppress(OSError):
        (p.launch.runtime / DAEMON_FILE).unlink()  # nothing is watched any more: no stale live view
    if p.server is not None:
        p.server.shutdown()
        p.server.server_close()
        if p.thread is not None:
            p.thread.join(5)


def run_daemon(
    launch: Launch,
    on_tick: Callable[[Daemon, Report], None] | None = None,
    on_ready: Callable[[Daemon], None] | None = None,
    on_stopping: Callable[[Daemon], None] | None = None,
    notifier: Notifier | None = None,
    watch_root: Path | None = None,
    watch_quiet_s: float = 0.5,
    state_dir: Path | None = None,
    started_from: str | None = None,
    in_container: bool = False,
) -> int:
    """``notifier``: sd_notify (default: from $NOTIFY_SOCKET, which is then removed from the
    environment vLLM inherits); ``watch_root``: the config root to watch for live overrides;
    ``state_dir``: where the last good plan is kept; ``started_from``: why this start runs a kept
    plan rather than the configuration's (said in the log, STATUS= and daemon.json); ``in_container``:
    the daemon is a container's init (PID 1's child): an instance that gave up is not tried again here,
    the daemon ends failed and the pod's restart policy takes over."""
    from ..launch.start import supervisor
    from ..supervise.lifecycle import State
    from ..telemetry.scrape import ScrapePool
    from .journal import attach

    notifier = notifier if notifier is not None else Notifier.from_environ()
    if attach():  # stderr is the journal: structured records instead of plain lines
        log.info("logging to the journal")
    replan = launch.replan
    if replan is None:
        raise ValueError("the daemon re-plans (degrade steps, reloads): its launch needs the plan's inputs")
    sampler = build_sampler(launch.plan)
    started, levels = start_plan(launch.plan, replan, sampler)
    # the ladder's steps are re-plans too; as a container's init, the pod's restart policy retries a
    # failed instance (the daemon ends failed)
    sup = supervisor(dataclasses.replace(launch, plan=started), retry_failed=not in_container)
    scrapes = ScrapePool()
    daemon = build_loop(launch, replan, sup, sampler, scrapes, started, levels, started_from)
    p = Parts(launch, sampler, scrapes, sup, daemon, notifier)
    install_signals(p)
    p.cwatch = watch_config(daemon, watch_root, watch_quiet_s)
    p.server, p.thread = serve_metrics(daemon)
    sup.start()
    ServiceHooks(p, state_dir, on_tick, on_ready).attach(daemon)
    # Everything built so far lives as long as the daemon: out of the collector's sight, so that the
    # garbage of each tick's scrapes does not make it walk every long-lived object again.
    gc.collect()
    gc.freeze()
    try:
        daemon.run(p.stop)
    finally:
        shut_down(p, on_stopping)
    failed = [i.name for i in sup.instances if i.state == State.FAILED]
    if failed:
        log.error("instances that failed: %s", ", ".join(failed))
    # asked to stop: a clean exit; ended because every instance failed: a failure
    return 0 if p.stopped_by_signal.is_set() or not failed else 1
