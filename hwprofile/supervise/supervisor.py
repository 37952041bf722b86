"""Run planned vLLM instances: own process group each, readiness, verification, restarts, the
out-of-memory ladder, graceful stop. One thread per instance; the state file mirrors every change.

Trust: the supervisor holds ``<runtime>/supervisor.lock`` for its whole life (a second supervisor is
refused), records each process as PID plus start time, and removes ``state.json`` when it ends
cleanly. A child is reaped only after its process group has been ended: until then its PID (and so
the group's number) cannot be reused, so the group signalled is always ours. Each instance's state
has one writer (:class:`.lifecycle.Machine`); an instance thread that breaks marks it failed."""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

from ..plan.types import InstancePlan, Plan, as_instance, as_plan
from ..render.translate import Rendered, render_instance
from ..render.versions import Release
from ..runtime.processes import Identity, group_members, identify
from . import http
from .failures import MIN_CONTEXT, Failure, Rung, classify, ladder_sets, next_rung
from .lifecycle import TERMINAL, Machine, State
from .logs import RotatingLog, private_dir, pump
from .state import LAST_FILE, STATE_FILE, RuntimeLock, remove_state, write_state
from .verify import compare, parse_startup

if TYPE_CHECKING:
    from ..config.settings import Logs, Supervise

log = logging.getLogger("hwprofile")

# The child asks the kernel for SIGTERM when its parent dies (PR_SET_PDEATHSIG = 1), checks the parent
# did not die already, then execs vLLM in place (same PID, so the signal setting stays). Done by a
# tiny interpreter rather than preexec_fn: Python code between fork and exec in a threaded parent can
# deadlock on a lock another thread held at fork time.
_EXEC_WRAPPER = (
    "import ctypes,os,signal,sys;"
    "ctypes.CDLL(None).prctl(1,signal.SIGTERM,0,0,0);"
    "os.getppid()==int(sys.argv[1]) or sys.exit(70);"
    "os.execvp(sys.argv[2],sys.argv[2:])"
)


def die_with_parent(argv: list[str]) -> list[str]:
    return [sys.executable, "-I", "-S", "-c", _EXEC_WRAPPER, str(os.getpid()), *argv]


# vLLM puts ZMQ IPC sockets in TMPDIR ("<dir>/<uuid4>"): a Unix socket path holds at most 107 bytes.
MAX_TMPDIR = 107 - 1 - 36 - 8


def short_tmpdir(preferred: Path, name: str) -> Path:
    """``preferred`` when its path is short enough for vLLM's IPC sockets, else a private dir in /tmp."""
    if len(str(preferred)) <= MAX_TMPDIR:
        return private_dir(preferred)
    import tempfile

    link = Path(tempfile.mkdtemp(prefix=f"hwp-{name[:20]}-", dir="/tmp"))  # 0700 from mkdtemp
    log.info("%s: TMPDIR %s is too long for vLLM's IPC sockets; using %s", name, preferred, link)
    return link


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


def port_free(host: str, port: int) -> bool:
    """Whether a server could bind ``host:port`` now (with SO_REUSEADDR, as uvicorn does, so a
    socket of a previous run in TIME_WAIT does not count)."""
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError as e:
            if e.errno == errno.EADDRINUSE:
                return False
            raise
    return True


class Instance:
    def __init__(self, sup: Supervisor, plan: Plan, inst: InstancePlan) -> None:
        self.sup = sup
        self.plan = plan
        self.inst = inst  # frozen: a re-plan or a replacement is a new InstancePlan
        self.name = inst.name
        self.machine = Machine(self.name, on_change=self._changed)
        self.pid: int | None = None  # the last process started (kept for status after it ended)
        self.ident: Identity | None = None  # the process running now (None once it is reaped)
        self.proc: subprocess.Popen[bytes] | None = None
        self.restarts = 0
        self.ladder: list[dict[str, str]] = []  # the steps taken, for status (rung, change, because, set)
        self._taken: list[Rung] = []  # the same steps: their overrides are the re-plan's
        self._refused: list[Rung] = []  # steps whose re-plan was refused: not tried again
        self.failure: dict[str, str] | None = None
        self.verify_warnings: list[str] = []
        self.render_warnings: list[str] = []
        self.started_at: float | None = None
        self.ready_at: float | None = None
        self.argv: list[str] = []
        base = private_dir(sup.opts.runtime / self.name)
        self.tmp = short_tmpdir(base / "tmp", self.name)
        self.cache = private_dir(base / "cache")
        self.log = RotatingLog(sup.opts.log_root / self.name, sup.opts.log_max_bytes, sup.opts.log_files)
        self.thread = threading.Thread(target=self._main, name=f"instance-{self.name}", daemon=True)
        self._stop_asked = threading.Event()
        self._replace_lock = threading.Lock()
        self._replacement: InstancePlan | None = None  # a new plan for this instance, not yet applied
        self._replace_asked = threading.Event()
        self.replacements = 0  # planned restarts with new settings (the daemon's degrade/recover)
        self._pump: threading.Thread | None = None
        self._saved_dropped = 0

    # -- public ---------------------------------------------------------------------------
    @property
    def state(self) -> State:
        return self.machine.state

    @property
    def url(self) -> str:
        s = self.inst.server
        host = "127.0.0.1" if s.host in ("0.0.0.0", "", "::") else s.host
        return f"http://{host}:{s.port}"

    def snapshot(self) -> dict[str, Any]:
        inst = self.inst.to_json()  # the state file holds the plan's JSON, as before
        return {
            "name": self.name,
            "state": self.state.value,
            "pid": self.pid,
            "pgid": self.pid,
            "process": self.ident.to_json() if self.ident else None,
            "url": self.url,
            "gpus": inst["gpus"],
            "numa_node": inst.get("numa_node"),
            "started_at": self.started_at,
            "ready_at": self.ready_at,
            "restarts": self.restarts,
            "ladder": self.ladder,
            "failure": self.failure,
            "log_dir": str(self.log.dir),
            "log_file": str(self.log.path),
            "stop_grace_s": self._grace(),
            "log_dropped_lines": self.log.dropped,
            "log_error": self.log.last_error,
            "argv": self.argv,
            "replacements": self.replacements,
            "engine": inst["engine"],
            "speculative": inst.get("speculative"),
            "warnings": self.render_warnings + self.verify_warnings,
        }

    def stop(self) -> None:
        self._stop_asked.set()

    def replace(self, inst: InstancePlan | dict[str, Any]) -> None:
        """Restart this instance with ``inst`` (the same instance, re-planned): once it is ready, the
        running process drains (SIGTERM, --shutdown-timeout), is stopped, and the new one starts.
        Not a failure: no backoff, no restart counted. A later call before it is applied wins."""
        inst = as_instance(inst)
        if inst.name != self.name:
            raise ValueError(f"a plan for {inst.name} cannot replace {self.name}")
        with self._replace_lock:
            self._replacement = inst
        self._replace_asked.set()

    @property
    def replacing(self) -> bool:
        return self._replace_asked.is_set()

    def _take_replacement(self) -> InstancePlan | None:
        with self._replace_lock:
            new, self._replacement = self._replacement, None
            self._replace_asked.clear()
        return new

    # -- the life cycle ---------------------------------------------------------------------
    def _changed(self, old: State, new: State) -> None:
        if old != new:
            log.info("%s: %s -> %s", self.name, old, new)
        self.sup.save()

    def _set(self, state: State) -> None:
        self.machine.change(state)

    def _render(self) -> Rendered:
        # server.vllm_command, when set, is the executable: the same one render and --dry-run show
        command = self.inst.server.vllm_command or self.sup.vllm_command
        return render_instance(self.plan, self.inst, self.sup.release, command, self.sup.numactl)

    def _spawn(self, r: Rendered) -> subprocess.Popen[bytes]:
        env = {**os.environ, **r.env}
        env.update(
            TMPDIR=str(self.tmp),
            VLLM_CACHE_ROOT=str(self.cache / "vllm"),
            TORCHINDUCTOR_CACHE_DIR=str(self.cache / "inductor"),
            XDG_CACHE_HOME=str(self.cache),
            PYTHONUNBUFFERED="1",
        )
        for target, source in r.secrets.items():
            if source in os.environ:
                env[target] = os.environ[source]
            else:
                log.warning(
                    "%s: $%s (server.api_key_env) is not set: serving without an API key", self.name, source
                )
        self.argv = r.argv
        proc = subprocess.Popen(
            die_with_parent(r.argv),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            env=env,
            cwd=str(self.tmp),
            start_new_session=True,  # its own session and process group: we signal the whole group
        )
        # Not reaped until _end: the PID and its start time stay this process's until then.
        self.proc, self.pid, self.ident = proc, proc.pid, identify(proc.pid)
        assert proc.stdout is not None
        self._pump = pump(proc.stdout, self.log, log, self.name)
        return proc

    @staticmethod
    def _exited(proc: subprocess.Popen[bytes]) -> bool:
        """Whether the child has exited, without reaping it (WNOWAIT): a zombie keeps its PID, so its
        process group number cannot go to anyone else before :meth:`_end` has signalled it."""
        if proc.returncode is not None:
            return True
        try:
            return os.waitid(os.P_PID, proc.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None
        except ChildProcessError:
            return True

    def _end(self, proc: subprocess.Popen[bytes], grace: float) -> None:
        """Graceful stop: SIGTERM to vLLM's API server (the group leader) only, so vLLM shuts its
        engine and workers down in order and drains requests (--shutdown-timeout); after ``grace``
        seconds, or once the leader is gone, SIGKILL whatever is left of the process group. The leader
        is reaped last, so every signal here reaches our own processes."""
        if proc.returncode is None:
            if not self._exited(proc):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(proc.pid, signal.SIGTERM)
                end = time.monotonic() + grace
                while not self._exited(proc) and time.monotonic() < end:
                    time.sleep(0.1)
                if not self._exited(proc):
                    log.warning(
                        "%s: still running %.0f s after SIGTERM: SIGKILL to its process group",
                        self.name,
                        grace,
                    )
            end = time.monotonic() + min(5.0, grace)
            while group_members(proc.pid) and time.monotonic() < end:  # vLLM's children leave on their own
                time.sleep(0.1)
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)  # the leader is alive or a zombie: the group is ours
        proc.wait()
        self.ident = None
        if self._pump is not None:
            self._pump.join(5)

    def _grace(self) -> float:
        return float(self.inst.server.shutdown_timeout or 0) + self.sup.opts.stop_margin

    def _note_dropped(self) -> None:
        if self.log.dropped != self._saved_dropped:
            self._saved_dropped = self.log.dropped
            self.sup.save()

    def _wait_ready(self, proc: subprocess.Popen[bytes]) -> str:
        """'ready', 'exited', 'stopping' or 'timeout'."""
        deadline = time.monotonic() + self.sup.opts.ready_timeout
        last_note = 0.0
        while True:
            if self._stop_asked.is_set():
                return "stopping"
            if self._exited(proc):
                return "exited"
            if http.healthy(self.url):
                return "ready"
            now = time.monotonic()
            if now > deadline:
                return "timeout"
            if self.sup.opts.progress and now - last_note >= 5:
                last_note = now
                elapsed = time.time() - (self.started_at or time.time())
                self.sup.opts.progress(
                    f"{self.name}: starting, {elapsed:.0f} s | {self.log.last_line()[-160:]}"
                )
            self._note_dropped()
            self._stop_asked.wait(self.sup.opts.poll_interval)

    def _main(self) -> None:
        try:
            self._run()
        except BaseException as e:  # whatever breaks, the instance must not look alive
            self._crashed(e)
        finally:
            self.sup._instance_done()

    def _crashed(self, e: BaseException) -> None:
        log.error("%s: the supervisor thread broke: %s: %s", self.name, type(e).__name__, e, exc_info=e)
        self.failure = {
            "kind": "supervisor error",
            "evidence": f"{type(e).__name__}: {e}"[:300],
            "fix": f"a fault in hwprofile itself: see {self.sup.opts.runtime / 'hwprofile.log'}",
        }
        proc = self.proc
        if proc is not None and proc.returncode is None:
            try:
                self._end(proc, self._grace())
            except Exception as again:
                log.error("%s: could not end process %s: %s", self.name, proc.pid, again)
        self.machine.fail()

    def _stopping(self, proc: subprocess.Popen[bytes] | None) -> None:
        self._set(State.STOPPING)
        if proc is not None:
            self._end(proc, self._grace())

    # -- the memory ladder --------------------------------------------------------------------
    def _min_model_len(self) -> int:
        known = self.sup.opts.min_model_len  # the plan's engine section has no min_model_len
        return int(known) if known else MIN_CONTEXT

    def _ladder_step(self) -> tuple[Rung, Plan, InstancePlan] | str:
        """The next ladder step, re-planned: (step, the new plan, this instance in it); or, when there
        is none, what to do instead. A step whose re-plan is refused, or moves this instance to other
        GPUs or another port, is skipped for the next one."""
        while True:
            step = next_rung(self.inst, [*self._taken, *self._refused], self._min_model_len())
            if step is None:
                return "every ladder step taken; a smaller model, a 4-bit checkpoint or another GPU"
            if self.sup.replan is None:
                return f"the next ladder step is --set {step.set}; this supervisor cannot re-plan: launch again with it"
            sets = ladder_sets([*self._taken, step])
            try:
                plan = as_plan(self.sup.replan(sets))
            except Exception as e:  # a refused re-plan: this step cannot be taken
                why = f"{type(e).__name__}: {getattr(e, 'message', None) or e}"
            else:
                new = next((i for i in plan.instances if i.name == self.name), None)
                if new is None:
                    why = "the re-plan has no instance of this name"
                elif (new.gpus, new.tensor_parallel_size, new.server.host, new.server.port) != (
                    self.inst.gpus,
                    self.inst.tensor_parallel_size,
                    self.inst.server.host,
                    self.inst.server.port,
                ):
                    why = "the re-plan moves this instance to other GPUs or another port"
                else:
                    return step, plan, new
            log.warning("%s: ladder step %s skipped: %s", self.name, step.set, str(why)[:300])
            self._refused.append(step)

    def _take_step(self, step: Rung, plan: Plan, new: InstancePlan, because: str) -> None:
        """Run the next start as ``new``, the instance re-planned with every step so far: its engine
        settings and memory figures are the planner's, so the startup check compares fresh ones."""
        section, _, rest = step.set.partition(".")
        key, _, wanted = rest.partition("=")
        change = step.change
        if section == "engine":
            got = getattr(new.engine, key, None)
            if str(got).lower() != wanted.lower():
                change += f" (planned: {got})"
        self.plan, self.inst = plan, new
        self._taken.append(step)
        self.ladder.append({"rung": step.rung, "change": change, "because": because, "set": step.set})
        log.warning("%s: ladder step %d: %s (%s)", self.name, len(self.ladder), change, because)
        self.log.mark(f"ladder: {change} (--set {step.set})")

    def _run(self) -> None:
        backoff = self.sup.opts.backoff_initial
        while not self._stop_asked.is_set():
            step: tuple[Rung, Plan, InstancePlan] | None = None  # a ladder step, re-planned
            because = ""  # the failure that step answers
            r = self._render()
            self.render_warnings = r.warnings
            s = self.inst.server
            if self.restarts or self.ladder or self.replacements:
                end = time.monotonic() + 15  # after a failure: let the old process's socket go
                while (
                    not port_free(s.host, s.port)
                    and time.monotonic() < end
                    and not self._stop_asked.wait(0.5)
                ):
                    pass
            elif not port_free(s.host, s.port):
                self.failure = {"kind": "port in use", "evidence": f"{s.host}:{s.port} is taken before start",
                                "fix": "stop what holds it, or --set server.port=<free port>"}  # fmt: skip
                self.log.mark(f"port {s.port} taken; not started")
                self._set(State.FAILED)
                return
            if self._stop_asked.is_set():
                break
            self.started_at, self.ready_at = time.time(), None
            self.log.mark(f"start {self.name} (restart {self.restarts}): {' '.join(r.argv)}")
            since = self.log.count  # this start's own lines: earlier starts' stay out of its verdicts
            proc = self._spawn(r)
            self._set(State.STARTING if not (self.restarts or self.replacements) else State.RESTARTING)
            outcome = self._wait_ready(proc)
            if outcome == "stopping":
                self._stopping(proc)
                break
            if outcome == "ready":
                self.ready_at = time.time()
                self.verify_warnings = compare(self.inst, parse_startup(self.log.text_since(since)))
                for w in self.verify_warnings:
                    log.warning("%s: started differently from the plan: %s", self.name, w)
                backoff = self.sup.opts.backoff_initial
                self._set(State.READY)
                while (
                    not self._exited(proc)
                    and not self._replace_asked.is_set()
                    and not self._stop_asked.wait(self.sup.opts.poll_interval)
                ):
                    self._note_dropped()
                if self._stop_asked.is_set():
                    self._stopping(proc)
                    break
                if self._replace_asked.is_set() and not self._exited(proc):
                    new = self._take_replacement()
                    if new is not None:
                        self._set(State.RESTARTING)
                        self.log.mark(f"planned restart with new settings ({self.replacements + 1})")
                        log.info("%s: planned restart with new settings: draining", self.name)
                        self._end(proc, self._grace())
                        self.inst, self.ladder, self.failure = new, [], None
                        self._taken, self._refused = [], []
                        self.replacements += 1
                        continue
                # Any exit we did not ask for is a failure, whatever the code (vLLM can exit 0 after its engine died).
                self._end(proc, 0)
                code = proc.returncode
                self.failure = {
                    "kind": "unplanned exit",
                    "evidence": f"exit code {code}: {self.log.last_line()[-300:]}",
                }
                log.error("%s: exited with code %s without being asked to", self.name, code)
            elif outcome == "timeout":
                evidence = self.log.last_line()[-300:]  # before the stop adds its own lines
                self._end(proc, 10)
                self.failure = {"kind": "readiness timeout", "evidence": evidence}
                log.error("%s: not ready after %.0f s", self.name, self.sup.opts.ready_timeout)
            else:  # exited during start-up
                self._end(proc, 0)
                f: Failure = classify(self.log.text_since(since))
                self.failure = {"kind": f.kind, "evidence": f.evidence}
                log.error("%s: failed to start (%s): %s", self.name, f.kind, f.evidence)
                if f.memory_like:
                    got = self._ladder_step()
                    if isinstance(got, str):
                        self.failure["fix"] = got
                        self._set(State.FAILED)
                        return
                    step, because = got, f.kind
                elif not f.retry:
                    self.failure["fix"] = "a configuration error: fix it and launch again (not retried)"
                    self._set(State.FAILED)
                    return
            # A ladder step is a restart too: it counts toward max_restarts and waits the backoff.
            self.restarts += 1
            if self.restarts > self.sup.opts.max_restarts:
                self.failure = {
                    **(self.failure or {}),
                    "fix": f"gave up after {self.sup.opts.max_restarts} restarts"
                    + (f" (the next ladder step would have been --set {step[0].set})" if step else ""),
                }
                self._set(State.FAILED)
                return
            if step is not None:
                self._take_step(*step, because=because)
            self._set(State.RESTARTING)
            log.warning("%s: restart %d in %.0f s", self.name, self.restarts, backoff)
            if self._stop_asked.wait(backoff):
                break
            backoff = min(backoff * 2, self.sup.opts.backoff_max)
        if self.state != State.STOPPING:
            self._stopping(None)
        self._set(State.STOPPED)


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
