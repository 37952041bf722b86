"""The composition root of ``hwprofile daemon``: the supervisor (through the one door,
:func:`hwprofile.launch.start.supervisor`), the sampler, the exporter and the loop from one
validated launch, run until SIGTERM/SIGINT, then drain and stop everything. Tests build
:class:`~.loop.Daemon` themselves with fakes; this wires the real parts."""

from __future__ import annotations

import contextlib
import dataclasses
import gc
import logging
import signal
import threading
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..errors import HwprofileError
from ..plan.degrade import degrade_sets
from ..runfiles import DAEMON_FILE, LAST_GOOD_FILE, LaunchDoc, write_doc
from ..runtime.dirs import private_dir
from .actions import Degrade
from .loop import Daemon
from .notify import Notifier, status_line
from .policy import start_levels

if TYPE_CHECKING:
    from ..launch.start import Launch

log = logging.getLogger("hwprofile")
STOP_SLACK_S = 30  # beyond the drain and its margin: last.json, the exporter, the daemon's own exit


def run_daemon(
    launch: Launch,
    on_tick: Callable[[Daemon, Any], None] | None = None,
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
    notifier = notifier if notifier is not None else Notifier.from_environ()
    from .journal import attach

    if attach():  # stderr is the journal: structured records instead of plain lines
        log.info("logging to the journal")
    from ..host.sampler import GpuSampler
    from ..launch.start import supervisor
    from ..supervise.lifecycle import State
    from ..telemetry.scrape import ScrapePool
    from .exporter import serve

    plan, runtime, replan = launch.plan, launch.runtime, launch.replan
    if replan is None:
        raise ValueError("the daemon re-plans (degrade steps, reloads): its launch needs the plan's inputs")
    settings = plan.watch
    gpus = sorted({g for i in plan.instances for g in i.gpus or ()})
    sampler = GpuSampler(gpus if gpus else None)
    if sampler.error and gpus:
        log.error("NVML: %s: GPUs are not watched (the instances still run)", sampler.error)
    # a card already hot: its instances start degraded, not at the full profile a dwell from a restart
    levels = start_levels({i.name: i.gpus for i in plan.instances if i.gpus}, sampler.sample(0.0), settings)
    start_plan = plan
    for name, (step, why) in levels.items():
        sets, what = degrade_sets(plan.instance(name), step, plan.degrade)
        try:
            degraded = replan(sets).instance(name)
        except Exception as e:  # a refused re-plan: it starts at the full profile and the loop acts
            log.error("%s: %s, but its degrade step %d cannot be planned (%s): started at the full profile",
                      name, why, step, e)  # fmt: skip
            continue
        log.warning("%s: %s: starting at degrade step %d (%s)", name, why, step, "; ".join(what))
        start_plan = dataclasses.replace(
            start_plan, instances=tuple(degraded if i.name == name else i for i in start_plan.instances)
        )
    # the ladder's steps are re-plans too; as a container's init, the pod's restart policy retries a
    # failed instance (the daemon ends failed)
    sup = supervisor(dataclasses.replace(launch, plan=start_plan), retry_failed=not in_container)
    stop = threading.Event()
    stopped_by_signal = threading.Event()

    def on_signal(signum: int, _frame: Any) -> None:
        log.info("received %s: draining and stopping every instance", signal.Signals(signum).name)
        sup.end_reason = f"the daemon was stopped by {signal.Signals(signum).name}"
        daemon.stopping = True
        daemon.published.unready = "the daemon is stopping: draining"  # at once, not at the next tick
        stopped_by_signal.set()
        stop.set()

    scrapes = ScrapePool()
    daemon = Daemon(
        plan,
        replan,
        sup,
        sampler,
        settings,
        plan.degrade,
        runtime,
        collect=scrapes.collect,
        on_tick=on_tick,
    )
    for name, (step, why) in levels.items():
        if start_plan.instance(name) is not plan.instance(name):
            daemon.levels[name] = step
            daemon.watcher.set_level(name, step)
            daemon._record(Degrade(name, why, tuple(plan.instance(name).gpus or ()), step), "done", "at start")
    if started_from:  # the configuration is invalid: the kept plan runs, and everyone is told why
        log.error("%s", started_from)
        daemon.reload_error = started_from
        daemon.errors.append(started_from)
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, on_signal)
    signal.signal(signal.SIGHUP, lambda _s, _f: daemon.request_reload("SIGHUP"))  # the loop reloads
    cwatch = None
    if watch_root is not None:
        from .overrides import ConfigWatch

        try:
            cwatch = ConfigWatch(watch_root, watch_quiet_s, daemon.clock)
            daemon.poll_changes = cwatch.poll
        except OSError as e:
            log.error("cannot watch %s: %s (edits apply on SIGHUP / hwprofile reload)", watch_root, e)
    server = thread = None
    if settings.metrics_port:
        try:
            server, thread = serve(daemon.published, settings.metrics_port, settings.metrics_host)
            log.info("hwprofile metrics on http://%s:%d/metrics (/health, /livez)", settings.metrics_host,
                     settings.metrics_port)  # fmt: skip
        except OSError as e:
            msg = (f"metrics on {settings.metrics_host}:{settings.metrics_port} not served: {e} "
                   "(watch.metrics_host, watch.metrics_port)")  # fmt: skip
            log.error("%s", msg)
            daemon.errors.append(msg)  # in daemon.json, so `hwprofile status` says it too
    sup.start()
    ready_said = False

    def keep_good(d: Daemon) -> None:
        """The plan running well, kept in the state directory: a restart whose configuration is
        invalid starts from it (cli.running.cmd_daemon)."""
        if state_dir is None or launch.inputs is None:
            return
        try:
            write_doc(private_dir(state_dir) / LAST_GOOD_FILE, LaunchDoc(d.plan, launch.inputs, launch.release.target))
        except (OSError, HwprofileError) as e:
            log.error("cannot keep the last good plan in %s: %s", state_dir, e)

    def reloaded(d: Daemon) -> None:
        if ready_said:
            notifier.ready(status_line(d))
            if (d.last_reload or {}).get("outcome") == "applied":
                keep_good(d)

    # RELOADING=1 ... READY=1 only once the unit is ready (before that, READY=1 would start it early)
    def reloading(d: Daemon) -> None:
        if ready_said:
            notifier.reloading()

    daemon.on_reloading = reloading
    daemon.on_reloaded = reloaded

    def tick_hook(d: Daemon, rep: Any) -> None:
        nonlocal ready_said
        if not ready_said and d.sup.instances and all(i.state == State.READY for i in d.sup.instances):
            ready_said = True
            log.info("every instance is ready")
            keep_good(d)
            notifier.ready(status_line(d))
            if on_ready:
                on_ready(d)
        elif notifier.enabled:
            notifier.status(status_line(d))
        notifier.watchdog()  # after each completed tick, at most every WATCHDOG_USEC / 2
        if on_tick:
            on_tick(d, rep)
        if sup.all_done:
            stop.set()  # every instance ended on its own (failed): nothing left to watch

    daemon.on_tick = tick_hook
    # Everything built so far lives as long as the daemon: out of the collector's sight, so that the
    # garbage of each tick's scrapes does not make it walk every long-lived object again.
    gc.collect()
    gc.freeze()
    try:
        daemon.run(stop)
    finally:
        # the instances drain at once: the longest drain, the SIGKILL margin and the daemon's own exit
        drain = max((float(i.inst.server.shutdown_timeout) for i in sup.instances), default=0.0)
        notifier.stopping(drain + launch.plan.supervise.stop_margin + STOP_SLACK_S)
        if cwatch is not None:
            cwatch.close()
        if on_stopping:
            on_stopping(daemon)
        sup.stop()
        sup.wait()
        sup.close()
        daemon.restore_power()  # a power limit the daemon lowered goes back before NVML closes
        sampler.close()
        scrapes.close()
        with contextlib.suppress(OSError):
            (runtime / DAEMON_FILE).unlink()  # nothing is watched any more: no stale live view
        if server is not None:
            server.shutdown()
            server.server_close()
            if thread is not None:
                thread.join(5)
    failed = [i.name for i in sup.instances if i.state == State.FAILED]
    if failed:
        log.error("instances that failed: %s", ", ".join(failed))
    # asked to stop: a clean exit; ended because every instance failed: a failure
    return 0 if stopped_by_signal.is_set() or not failed else 1
