"""Run a plan's vLLM instances: the :class:`Supervisor` owns them (one :class:`.instance.Instance`
and thread each), the runtime directory's lock and the state file that mirrors every change.

Trust: the supervisor holds ``<runtime>/supervisor.lock`` for its whole life (a second supervisor is
refused), records each process as PID plus start time, and removes ``state.json`` when it ends
cleanly, leaving ``last.json``. How one instance is run, restarted and stopped is
:mod:`.instance` (its process: :mod:`.child`; its memory ladder: :mod:`.ladder`).

This module is the supervisor's public face: ``Supervisor``, ``Options``, and, from the modules
above, ``Instance``, ``port_free``, ``short_tmpdir``, ``die_with_parent``, ``MAX_TMPDIR``."""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

from ..plan.types import Plan, as_plan
from ..render.versions import Release
from ..runtime.processes import identify
from .child import MAX_TMPDIR, die_with_parent, port_free, short_tmpdir
from .instance import Instance
from .lifecycle import TERMINAL, State
from .logs import private_dir
from .state import LAST_FILE, STATE_FILE, RuntimeLock, remove_state, write_state

__all__ = [
    "MAX_TMPDIR",
    "Instance",
    "Options",
    "Supervisor",
    "die_with_parent",
    "port_free",
    "short_tmpdir",
]

if TYPE_CHECKING:
    from ..config.settings import Logs, Supervise

log = logging.getLogger("hwprofile")


class Options(NamedTuple):
    """What the supervisor needs beyond the plan: the paths the caller decided, and the plan's
    ``supervise`` and ``logs`` settings, read in one place (:meth:`from_settings`). No setting has a
    default here: its default is its declaration's (:mod:`hwprofile.config.run_sections`)."""

    runtime: Path
    log_root: Path
    log_max_bytes: int
    log_files: int
    ready_timeout: float
    max_restarts: int
    backoff_initial: float
    backoff_max: float
    progress: Callable[[str], None] | None = None
    poll_interval: float = 0.5  # seconds between /health polls and exit checks (not a setting)
    stop_margin: float = 10.0  # seconds beyond server.shutdown_timeout before SIGKILL (not a setting)
    min_model_len: int | None = None  # the profile's engine.min_model_len: the ladder's context floor

    @classmethod
    def from_settings(
        cls, supervise: Supervise, logs: Logs, runtime: Path, log_root: Path, **rest: Any
    ) -> Options:
        """The options for ``supervise`` and ``logs`` (a plan's sections); ``rest``: the other fields."""
        return cls(
            runtime=runtime,
            log_root=log_root,
            log_max_bytes=logs.max_bytes,
            log_files=logs.files,
            ready_timeout=supervise.ready_timeout,
            max_restarts=supervise.max_restarts,
            backoff_initial=supervise.backoff_initial,
            backoff_max=supervise.backoff_max,
            **rest,
        )


class Supervisor:
    """The instances of one plan. Creating it takes the runtime directory's lock
    (:class:`.state.AlreadySupervising` when another supervisor holds it); when the last instance
    ends, the state file is replaced by ``last.json`` and the lock is let go (also :meth:`close`)."""

    def __init__(
        self,
        plan: Plan | dict[str, Any],
        release: Release,
        vllm_command: str,
        numactl: str | None,
        opts: Options,
        replan: Callable[[list[str]], dict[str, Any]] | None = None,
    ) -> None:
        """``replan(extra_sets)`` plans again from the inputs of ``plan`` with more ``--set``
        overrides: the memory ladder's steps go through it. Without it a memory failure is final.
        ``plan`` is a :class:`Plan` or its JSON (``pipeline.make_plan``'s), read once here."""
        self.plan = plan = as_plan(plan)
        self.replan = replan
        self.release = release
        self.vllm_command = vllm_command
        self.numactl = numactl
        self.opts = opts
        self.state_path = opts.runtime / STATE_FILE
        self.started_at = time.time()
        self._lock = threading.Lock()
        self._closed = False
        self._save_failed = False
        private_dir(opts.runtime)
        self.runtime_lock = RuntimeLock(opts.runtime)
        self.runtime_lock.acquire()
        self.ident = identify(os.getpid())
        remove_state(opts.runtime / LAST_FILE)
        private_dir(opts.log_root)
        self.instances = [Instance(self, plan, i) for i in plan.instances]
        self._running = 0

    def _document(self) -> dict[str, Any]:
        return {
            "supervisor_pid": os.getpid(),
            "supervisor": self.ident.to_json() if self.ident else None,
            "started_at": self.started_at,
            "profile": self.plan.profile,
            "model": self.plan.model.path or self.plan.model.name,
            "vllm_version": self.release.target,
            "instances": [i.snapshot() for i in self.instances],
        }

    def save(self) -> None:
        with self._lock:
            if self._closed:
                return
            try:
                write_state(self.state_path, self._document())
                self._save_failed = False
            except OSError as e:  # a full disk must not stop supervision; say so once
                if not self._save_failed:
                    log.error("cannot write %s: %s", self.state_path, e)
                self._save_failed = True

    def start(self) -> None:
        self.save()
        with self._lock:
            self._running = len(self.instances)
        for i in self.instances:
            i.thread.start()

    def stop(self) -> None:
        for i in self.instances:
            i.stop()

    def _instance_done(self) -> None:
        with self._lock:
            self._running -= 1
            last = self._running <= 0
        if last:
            self.close()

    def close(self) -> None:
        """The end of supervision: no process of ours is left (every instance thread has reaped its
        child), so ``state.json`` goes; ``last.json`` says how each instance ended, with no process
        to signal. Then the lock is released. Idempotent."""
        with self._lock:
            if self._closed:
                return
            if self._running > 0:
                return  # still supervising: the last instance to end closes
            self._closed = True
            doc = self._document()
            doc["ended_at"] = time.time()
            for inst in doc["instances"]:
                inst["process"] = None
            try:
                write_state(self.opts.runtime / LAST_FILE, doc)
            except OSError as e:
                log.error("cannot write %s: %s", self.opts.runtime / LAST_FILE, e)
            remove_state(self.state_path)
            self.runtime_lock.release()

    def wait(self, timeout: float | None = None) -> None:
        end = None if timeout is None else time.monotonic() + timeout
        for i in self.instances:
            i.thread.join(None if end is None else max(0.0, end - time.monotonic()))

    def wait_ready(self, timeout: float) -> bool:
        """True when every instance is ready; False as soon as one failed or time ran out."""
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            states = {i.state for i in self.instances}
            if states == {State.READY}:
                return True
            if states & TERMINAL:
                return False
            time.sleep(0.3)
        return False

    @property
    def all_done(self) -> bool:
        return all(not i.thread.is_alive() for i in self.instances)
