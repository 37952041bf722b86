"""Run a plan's vLLM instances: the :class:`Supervisor` owns them (one :class:`.instance.Instance`
and thread each), the runtime directory's lock and the state file that mirrors every change.

Trust: the supervisor holds ``<runtime>/supervisor.lock`` for its whole life (a second supervisor is
refused), records each process as PID plus start time, and removes ``state.json`` when it ends
cleanly, leaving ``last.json`` (both :mod:`hwprofile.supervise.runfiles` documents). How one instance is run,
restarted and stopped is :mod:`.instance` (its process: :mod:`.child`; its memory ladder:
:mod:`.ladder`). A supervisor is built in one place only: :func:`hwprofile.launch.start.supervisor`,
after the checks every start passes."""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable, Sequence
from typing import Protocol

from ..plan.types import InstancePlan, Plan
from ..render.translate import Rendered, render_instance
from ..render.versions import Release
from ..runtime.processes import identify
from .instance import Instance
from .lifecycle import TERMINAL, State
from .logs import private_dir
from .options import Options
from .router import RouterFront
from .runfiles import (
    LAST_FILE,
    STATE_FILE,
    DirIdentity,
    RunFileError,
    RuntimeLock,
    SupervisorDoc,
    read_doc,
    remove,
    write_doc,
)

log = logging.getLogger("hwprofile")


class Supervising(Protocol):
    """What the daemon drives: a :class:`Supervisor`, or a test's fake with its instances, the state
    file's save and the render of an instance for the running release."""

    @property
    def instances(self) -> Sequence[Instance]: ...

    @property
    def release(self) -> Release: ...

    def save(self) -> None: ...

    def render(self, plan: Plan, inst: InstancePlan) -> Rendered: ...


class Supervisor:
    """The instances of one plan. Creating it takes the runtime directory's lock
    (:class:`.state.AlreadySupervising` when another supervisor holds it); when the last instance
    ends, the state file is replaced by ``last.json`` and the lock is let go (also :meth:`close`)."""

    def __init__(
        self,
        plan: Plan,
        release: Release,
        vllm_command: str,
        numactl: str | None,
        opts: Options,
        replan: Callable[[list[str]], Plan] | None = None,
        router: str | None = None,
    ) -> None:
        """``replan(extra_sets)`` plans again from the inputs of ``plan`` with more ``--set``
        overrides: the memory ladder's steps go through it. Without it a memory failure is final.
        ``router``: vLLM's router executable, run in front of the servers when the plan's endpoint
        is the router (:mod:`.router`)."""
        self.plan = plan
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
        # the runtime directory as made or checked now: state.json and last.json are never written into
        # (nor removed from) a directory that replaced it (adopt_runtime: the daemon made it again)
        self.runtime_id = DirIdentity.of(opts.runtime)
        self.runtime_trouble: str | None = None
        self.runtime_lock = RuntimeLock(opts.runtime)
        self.runtime_lock.acquire()
        ident = identify(os.getpid())
        assert ident is not None  # this process exists
        self.ident = ident
        self.end_reason: str | None = None  # set by whoever asks it to stop (a signal, the daemon)
        self.previous = self._previous_run()
        if self.previous:
            log.info("the previous run here: %s", self.previous)
        remove(opts.runtime / LAST_FILE)
        private_dir(opts.log_root)
        self.instances = [
            Instance(plan, i, opts, self.render, self.save, self._instance_done, replan)
            for i in plan.instances
        ]
        self._running = 0
        self.front: RouterFront | None = None
        if plan.endpoint is not None and plan.endpoint.via == "router":
            if router is None:
                raise ValueError("the plan's endpoint is vLLM's router and no router executable was given")
            self.front = RouterFront(
                plan, router, opts, lambda: any(i.state == State.READY for i in self.instances), self.save
            )

    def _previous_run(self) -> str | None:
        """How the last run in this runtime directory ended: its ``last.json``, or a ``state.json``
        left behind by a supervisor that could not clean up. Unreadable records are said, not trusted."""
        for name in (STATE_FILE, LAST_FILE):
            try:
                doc = read_doc(self.opts.runtime / name, SupervisorDoc)
            except RunFileError as e:
                return f"its record cannot be read: {e}"
            if doc is not None:
                return doc.how_it_ended()
        return None

    def render(self, plan: Plan, inst: InstancePlan) -> Rendered:
        """``inst`` of ``plan`` rendered for this supervisor's release: ``server.vllm_command``, when
        set, is the executable (the same one render and ``--dry-run`` show), else ours."""
        command = inst.server.vllm_command or self.vllm_command
        return render_instance(plan, inst, self.release, command, self.numactl)

    def document(self) -> SupervisorDoc:
        return SupervisorDoc(
            supervisor=self.ident,
            instances=tuple(i.record() for i in self.instances),
            started_at=self.started_at,
            profile=self.plan.profile,
            model=self.plan.model.path or self.plan.model.name,
            vllm_version=self.release.target,
            previous=self.previous,
            endpoint=self.plan.endpoint.to_json() if self.plan.endpoint is not None else None,
            front=self.front.record() if self.front is not None else None,
        )

    def _runtime_ours(self) -> bool:
        """Whether the runtime directory is still the one this supervisor made or checked (said once
        when it is not: the state files are then not written there). Under ``_lock``."""
        trouble = self.runtime_id.trouble(self.opts.runtime) if self.runtime_id is not None else None
        if trouble is not None and trouble != self.runtime_trouble:
            log.error("%s: the supervisor's state files are not written there", trouble)
        self.runtime_trouble = trouble
        return trouble is None

    def adopt_runtime(self) -> None:
        """The runtime directory was made again by this process (the daemon's guard): its state files go
        there from now on."""
        with self._lock:
            self.runtime_id = DirIdentity.of(self.opts.runtime)
            self.runtime_trouble = None

    def save(self) -> None:
        with self._lock:
            if self._closed or not self._runtime_ours():
                return
            try:
                write_doc(self.state_path, self.document())
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
        if self.front is not None:
            self.front.start()

    def stop(self) -> None:
        if self.front is not None:  # first: no new request goes to a server that is stopping
            self.front.stop()
        for i in self.instances:
            i.stop()

    def _instance_done(self) -> None:
        with self._lock:
            self._running -= 1
            last = self._running <= 0
        if last:
            if self.front is not None:  # nothing left to stand in front of
                self.front.stop()
                self.front.join(60)
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
            failed = [i.name for i in self.instances if i.state == State.FAILED]
            reason = self.end_reason or (
                f"instances failed: {', '.join(failed)}" if failed else "every instance stopped"
            )
            if not self._runtime_ours():  # another's directory: neither written into nor emptied
                self.runtime_lock.release()  # our descriptor only: nothing of theirs is touched
                return
            try:
                write_doc(self.opts.runtime / LAST_FILE, self.document().ended(time.time(), reason))
            except OSError as e:
                log.error("cannot write %s: %s", self.opts.runtime / LAST_FILE, e)
            remove(self.state_path)
            self.runtime_lock.release()

    def wait(self, timeout: float | None = None) -> None:
        end = None if timeout is None else time.monotonic() + timeout
        for i in self.instances:
            i.thread.join(None if end is None else max(0.0, end - time.monotonic()))
        if self.front is not None:
            self.front.join(None if end is None else max(0.0, end - time.monotonic()))

    def wait_ready(self, timeout: float) -> bool:
        """True when every instance is ready; False as soon as one failed or time ran out. True only once
        the state file says so too (an instance's thread saves after its change is visible here: a
        ``status`` read right after this returns would otherwise still see "starting")."""
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            states = {i.state for i in self.instances}
            if states == {State.READY} and (self.front is None or self.front.state == "ready"):
                self.save()
                return True
            if states & TERMINAL:
                return False
            time.sleep(0.3)
        return False

    @property
    def all_done(self) -> bool:
        front = self.front is not None and self.front.thread.is_alive()
        return not front and all(not i.thread.is_alive() for i in self.instances)
