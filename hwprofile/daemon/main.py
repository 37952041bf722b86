"""The composition root of ``hwprofile daemon``: build the supervisor, the sampler, the exporter
and the loop from one validated plan, run until SIGTERM/SIGINT, then drain and stop everything.
Tests build :class:`~.loop.Daemon` themselves with fakes; this wires the real parts."""

from __future__ import annotations

import logging
import signal
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from .loop import Daemon
from .policy import WatchSettings

log = logging.getLogger("hwprofile")


def run_daemon(
    plan: dict[str, Any],
    replan: Callable[[list[str]], dict[str, Any]],
    release: Any,
    vllm_command: str,
    numactl: str | None,
    tmpfs: str | None,
    runtime: Path,
    on_tick: Callable[[Daemon, Any], None] | None = None,
    on_ready: Callable[[Daemon], None] | None = None,
    on_stopping: Callable[[Daemon], None] | None = None,
) -> int:
    from ..launch import options
    from ..supervise.lifecycle import State
    from ..supervise.supervisor import Supervisor
    from .exporter import serve
    from .telemetry import GpuSampler

    settings = WatchSettings.from_settings(plan.get("watch") or {})
    sup = Supervisor(
        plan,
        release,
        vllm_command,
        numactl,
        options(plan, tmpfs, runtime, progress=lambda m: log.info("%s", m)),
    )
    gpus = sorted({g for i in plan["instances"] for g in i.get("gpus") or ()})
    sampler = GpuSampler(gpus if gpus else None)
    if sampler.error and gpus:
        log.error("NVML: %s: GPUs are not watched (the instances still run)", sampler.error)
    stop = threading.Event()
    stopped_by_signal = threading.Event()

    def on_signal(signum: int, _frame: Any) -> None:
        log.info("received %s: draining and stopping every instance", signal.Signals(signum).name)
        stopped_by_signal.set()
        stop.set()

    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, on_signal)
    daemon = Daemon(plan, replan, sup, sampler, settings, plan.get("degrade") or {}, runtime, on_tick=on_tick)
    server = thread = None
    if settings.metrics_port:
        try:
            server, thread = serve(daemon.published, settings.metrics_port)
            log.info("hwprofile metrics on http://127.0.0.1:%d/metrics", settings.metrics_port)
        except OSError as e:
            log.error("metrics on 127.0.0.1:%d not served: %s (watch.metrics_port)", settings.metrics_port, e)
    sup.start()
    ready_said = False

    def tick_hook(d: Daemon, rep: Any) -> None:
        nonlocal ready_said
        if not ready_said and d.sup.instances and all(i.state == State.READY for i in d.sup.instances):
            ready_said = True
            log.info("every instance is ready")
            if on_ready:
                on_ready(d)
        if on_tick:
            on_tick(d, rep)
        if sup.all_done:
            stop.set()  # every instance ended on its own (failed): nothing left to watch

    daemon.on_tick = tick_hook
    try:
        daemon.run(stop)
    finally:
        if on_stopping:
            on_stopping(daemon)
        sup.stop()
        sup.wait()
        sup.close()
        sampler.close()
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
