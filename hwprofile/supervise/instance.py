"""One supervised vLLM instance (:class:`Instance`): spawn, readiness, startup verification, restarts
with backoff, the out-of-memory ladder, planned replacement, graceful stop; one thread each.

Trust: a child is reaped only after its process group has been ended (:func:`.child.end_group`):
until then its PID (and so the group's number) cannot be reused, so the group signalled is always
ours. Each instance's state has one writer (:class:`.lifecycle.Machine`); an instance thread that
breaks marks it failed. The instances of a plan, the state file and the lock are
:class:`.supervisor.Supervisor`'s.
"""

from __future__ import annotations

import logging
import os
import re
import subprocess
import threading
import time
from collections import deque
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from ..plan.types import ABSENT, InstancePlan, Plan
from ..render.translate import Rendered
from ..runtime.processes import Identity, identify
from ..telemetry import http
from .child import end_group, exited, own_tmpdir, port_free, short_tmpdir, spawn
from .failures import MIN_CONTEXT, Failure, Rung, classify, exit_evidence
from .gate import StartGate
from .group import Head, judge, look, probe
from .ladder import replan_step, step_change
from .lifecycle import Machine, State
from .logs import RotatingLog, private_dir, pump
from .pools import record as record_pool
from .runfiles import LOG_FILE, DirIdentity, InstanceRecord
from .verify import compare, parse_startup

if TYPE_CHECKING:
    from pathlib import Path

    from .options import Options

log = logging.getLogger("hwprofile")


# vLLM's log line prefix: "(APIServer pid=12) INFO 12-04 19:00:00 [api_server.py:1] " (vllm/logger.py _FORMAT)
_VLLM_PREFIX = re.compile(
    r"^(?:\S*\([^)]*pid=\d+\)\s+)?(?:[A-Z]+\s+\d\d-\d\d \d\d:\d\d:\d\d(?:\.\d+)?\s+)?(?:\[[^\]]*\]\s+)?"
)


def progress_text(line: str, width: int = 100) -> str:
    """A start-up progress note from vLLM's last log line: its message without the process, level, time
    and source prefix, cut at the end (never from the left, which leaves a line's tail unreadable)."""
    text = _VLLM_PREFIX.sub("", line.strip(), count=1).strip()
    return text if len(text) <= width else text[: width - 1] + "…"


def _private_files(
    opts: Options, name: str
) -> tuple[Path | None, Path, RotatingLog, tuple[DirIdentity | None, DirIdentity | None]]:
    """An instance's private temporary and cache directories (under ``opts.runtime``; no temporary
    one where its path would be too long for vLLM's IPC sockets: made in /tmp at the first start),
    its log, and the two directories' identities (checked before each start)."""
    base = private_dir(opts.runtime / name)
    tmp = short_tmpdir(base / "tmp")
    cache = private_dir(base / "cache")
    log = RotatingLog(
        opts.log_root / name,
        opts.log_max_bytes,
        opts.log_files,
        echo=f"[{name}] " if opts.log_stdout else None,
    )
    return tmp, cache, log, (DirIdentity.of(tmp) if tmp else None, DirIdentity.of(cache))


def _start_gate(opts: Options, stop: threading.Event) -> StartGate | None:
    """The start gate (.gate) where GPU memory is read (None: not read, no gate): before each start,
    the instance's GPUs' memory back (what they held before its first start, and what vLLM asks);
    waiting ends when a stop is asked."""
    if opts.gpu_memory is None:
        return None
    return StartGate(opts.gpu_memory, opts.gpu_free_timeout, clock=opts.clock, sleep=stop.wait)


class Instance:
    """One planned vLLM instance: its process (one at a time, in its own process group), readiness,
    the startup check against the plan, restarts with backoff, the memory ladder, planned
    replacement, graceful stop. Runs in its own thread; every state change is reported through ``on_change``
    (its :class:`.supervisor.Supervisor` saves the state file)."""

    def __init__(
        self,
        plan: Plan,
        inst: InstancePlan,
        opts: Options,
        render: Callable[[Plan, InstancePlan], Rendered],
        on_change: Callable[[], None],
        on_done: Callable[[], None],
        replan: Callable[[list[str]], Plan] | None = None,
    ) -> None:
        """``render(plan, inst)``: the instance's argv and environment for the installed release;
        ``on_change()``: after every change of its state (the supervisor saves its state file);
        ``on_done()``: once, when its thread ends; ``replan(extra_sets)``: the memory ladder's steps
        (without it a memory failure is final)."""
        self.opts = opts
        self.render = render
        self.on_change = on_change
        self.on_done = on_done
        self.replan = replan
        self.plan = plan
        self.inst = inst  # frozen: a re-plan or a replacement is a new InstancePlan
        self.name = inst.name
        self.machine = Machine(self.name, on_change=self._changed)
        self.pid: int | None = None  # the last process started (kept for status after it ended)
        self.ident: Identity | None = None  # the process running now (None once it is reaped)
        self.proc: subprocess.Popen[bytes] | None = None
        self.restarts = 0  # every restart after a failure, over the instance's life (status)
        # the failures within supervise.restart_window_s (opts.clock() times): what max_restarts counts
        self.crashes: deque[float] = deque()
        self.gave_up = 0  # give-ups in a row: the cool-off before the next try doubles with each
        self.retry_at: float | None = None  # failed, cooling off: when it is tried again (wall time)
        self._ready_since: float | None = None  # opts.clock() when it last became ready
        self.ladder: list[dict[str, str]] = []  # the steps taken, for status (rung, change, because, set)
        self._taken: list[Rung] = []  # the same steps: their overrides are the re-plan's
        self._refused: list[Rung] = []  # steps whose re-plan was refused: not tried again
        self.failure: dict[str, str] | None = None
        self.verify_warnings: list[str] = []
        self.render_warnings: list[str] = []
        self.started_at: float | None = None
        self.ready_at: float | None = None
        self.argv: list[str] = []
        self.tmp, self.cache, self.log, self._dirs_id = _private_files(opts, self.name)
        self._made: list[tuple[Path, DirIdentity | None]] = []  # made in /tmp: see _remove_made
        self.thread = threading.Thread(target=self._main, name=f"instance-{self.name}", daemon=True)
        self._stop_asked, self._replace_asked = threading.Event(), threading.Event()
        self._replace_lock = threading.Lock()
        self._replacement: InstancePlan | None = None  # a new plan for this instance, not yet applied
        self.replacements = 0  # planned restarts with new settings (the daemon's degrade/recover)
        self.unresponsive = 0  # restarts because /health kept failing while the process lived
        self.health_failing_since: float | None = None  # wall time /health began failing (None: it answers)
        # a headless node of a group (.group): node 0 before this start, why it waits, its rejoins
        self._head_at_start: Head | None = None
        self.group_wait: str | None = None
        self.rejoins = 0
        self._pump: threading.Thread | None = None
        self._saved_dropped = 0
        # the start gate (:func:`_start_gate`); what it waits for now (status), the last start's warning
        self.gate = _start_gate(opts, self._stop_asked)
        self.gpu_wait: str | None = None
        self.gate_warnings: list[str] = []

    # -- public ---------------------------------------------------------------------------
    @property
    def state(self) -> State:
        return self.machine.state

    @property
    def url(self) -> str:
        """Where this instance answers: its own server, or, for a headless node of a group, node 0's
        (the group is ready, and well, when node 0 answers: it only does with every node joined)."""
        s = self.inst.server
        if self.inst.headless:
            return f"http://{self.inst.master_addr}:{s.port}"
        host = "127.0.0.1" if s.host in ("0.0.0.0", "", "::") else s.host
        return f"http://{host}:{s.port}"

    def record(self) -> InstanceRecord:
        """This instance as the state file records it."""
        return InstanceRecord(
            name=self.name,
            state=self.state.value,
            pid=self.pid,
            process=self.ident,
            url=self.url,
            stop_grace_s=self._grace(),
            log_dir=str(self.log.dir),
            log_file=str(self.log.path),
            restarts=self.restarts,
            replacements=self.replacements,
            gpus=tuple(self.inst.gpus or ()),
            numa_node=self.inst.numa_node,
            started_at=self.started_at,
            ready_at=self.ready_at,
            ladder=tuple(self.ladder),
            failure=self.failure,
            log_dropped_lines=self.log.dropped,
            log_error=self.log.last_error,
            argv=tuple(self.argv),
            engine=self.inst.engine.to_json(),
            speculative=self.inst.speculative.to_json() if self.inst.speculative else None,
            warnings=tuple(self.render_warnings + self.gate_warnings + self.verify_warnings),
            health_failing_since=self.health_failing_since,
            unresponsive=self.unresponsive,
            group_wait=self.group_wait,
            rejoins=self.rejoins,
            gpu_wait=self.gpu_wait,
            retry_at=self.retry_at,
            gave_up=self.gave_up,
            node=(
                f"{self.inst.node} of {self.inst.nnodes}"
                + (
                    " (headless: the group answers at node 0)"
                    if self.inst.headless
                    else " (the group's API server)"
                )
            )
            if self.inst.nnodes is not ABSENT
            else None,
        )

    def stop(self) -> None:
        self._stop_asked.set()

    def replace(self, inst: InstancePlan) -> None:
        """Restart this instance with ``inst`` (the same instance, re-planned): once it is ready, the
        running process drains (SIGTERM, --shutdown-timeout), is stopped, and the new one starts.
        Not a failure: no backoff, no restart counted. A later call before it is applied wins."""
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
        self.on_change()

    def _set(self, state: State) -> None:
        self.machine.change(state)

    def _render(self) -> Rendered:
        return self.render(self.plan, self.inst)

    def _check_dirs(self) -> Path:
        """The process's TMPDIR and caches (in the runtime directory) as they were made: when they went
        with a deleted runtime directory, or another directory stands in their place, the next process
        gets a new private directory in /tmp (never one it did not make: TMPDIR is vLLM's working and
        IPC directory)."""
        if self.tmp is None:  # too long under the runtime directory: one of its own in /tmp
            self.tmp = own_tmpdir(
                self.name, f"TMPDIR under {self.opts.runtime} is too long for vLLM's IPC sockets"
            )
            self._made.append((self.tmp, DirIdentity.of(self.tmp)))
            self._dirs_id = (self._made[-1][1], self._dirs_id[1])
        if self._dirs_id == (DirIdentity.of(self.tmp), DirIdentity.of(self.cache)):
            return self.tmp
        fresh = own_tmpdir(
            self.name, f"its directories under {self.opts.runtime} are gone or not its own any more"
        )
        log.warning("%s: TMPDIR and caches now in %s", self.name, fresh)
        self._made.append((fresh, DirIdentity.of(fresh)))
        self.tmp, self.cache = private_dir(fresh / "tmp"), private_dir(fresh / "cache")
        self._dirs_id = (DirIdentity.of(self.tmp), DirIdentity.of(self.cache))
        return self.tmp

    def _spawn(self, r: Rendered) -> subprocess.Popen[bytes]:
        self.argv = r.argv
        self.health_failing_since = None  # a new process: the last one's failing /health is not its
        proc = spawn(r, self._check_dirs(), self.cache, self.name, self._grace())
        # Not reaped until _end: the PID and its start time stay this process's until then.
        self.proc, self.pid, self.ident = proc, proc.pid, identify(proc.pid)
        assert proc.stdout is not None
        self._pump = pump(proc.stdout, self.log, log, self.name)
        return proc

    def _end(self, proc: subprocess.Popen[bytes], grace: float) -> None:
        """Stop ``proc`` gracefully and reap it (:func:`.child.end_group`: SIGTERM to the leader, after
        ``grace`` seconds SIGKILL to what is left of its group, until it is torn down), then let its
        log pump finish."""
        end_group(proc, grace, self.name)
        self.ident = None
        if self._pump is not None:
            self._pump.join(5)

    def _grace(self) -> float:
        return float(self.inst.server.shutdown_timeout or 0) + self.opts.stop_margin

    def _note_dropped(self) -> None:
        if self.log.dropped != self._saved_dropped:
            self._saved_dropped = self.log.dropped
            self.on_change()

    def _wait_ready(self, proc: subprocess.Popen[bytes]) -> str:
        """'ready', 'exited', 'stopping', 'timeout' or (a headless node, :mod:`.group`) 'rejoin'."""
        clock = self.opts.clock
        deadline = clock() + self.opts.ready_timeout
        last_note, last_said = 0.0, ""
        probed = False
        while True:
            if self._stop_asked.is_set():
                return "stopping"
            if exited(proc):
                return "exited"
            if not self.inst.headless:
                if http.healthy(self.url):
                    return "ready"
            else:
                head = look(self.url)
                v = judge(self._head_at_start, head)
                if not v.ready and v.why != self.group_wait:
                    self.group_wait = v.why
                    log.info("%s: %s", self.name, v.why)
                    self.on_change()
                if v.ready:
                    return "ready"
                if v.rejoin:
                    return "rejoin"
                if v.probe and not probed:
                    probed = True
                    said = probe(self.url, self._api_key())
                    log.warning(
                        "%s: asked node 0 for one token, so that it finds this node gone: %s", self.name, said
                    )
                    self.log.mark(f"probe of node 0 ({self.url}): {said}")
            if clock() > deadline:
                return "timeout"
            now = time.monotonic()
            if self.opts.progress and now - last_note >= 5:
                last_note = now
                elapsed = time.time() - (self.started_at or time.time())
                said = progress_text(self.log.last_line())
                news = f" | {said}" if said and said != last_said else ""
                last_said = said or last_said
                self.opts.progress(f"{self.name}: starting, {elapsed:.0f} s{news}")
            self._note_dropped()
            self._stop_asked.wait(self.opts.poll_interval)

    def _serve(self, proc: subprocess.Popen[bytes]) -> str | None:
        """While ready: watch the process and its ``/health`` until it exits, a replacement or a stop
        is asked, or ``/health`` has failed for ``supervise.unhealthy_s`` seconds (a hung server, an
        API server whose engine died, or, for a headless node, node 0 gone: its process joined to
        nothing from then on): then the reason. A failing ``/health`` is recorded (status shows it)
        from its first failure; an answer again clears it."""
        poll = self.opts.poll_interval
        every = max(poll, min(2.0, self.opts.unhealthy_s / 4))
        self.health_failing_since = None
        probe = http.Client(self.url)  # one kept-alive connection for the probes (uvicorn keeps it)
        try:
            return self._watch_health(proc, probe, every)
        finally:
            probe.close()

    def _watch_health(self, proc: subprocess.Popen[bytes], probe: http.Client, every: float) -> str | None:
        """:meth:`_serve`'s loop: ``/health`` every ``every`` seconds on ``probe``."""
        poll = self.opts.poll_interval
        next_check = time.monotonic() + every
        last = ""
        failing_from = 0.0  # opts.clock() at the first failure: unhealthy_s is measured on it
        while not exited(proc) and not self._replace_asked.is_set() and not self._stop_asked.wait(poll):
            self._note_dropped()
            now = time.monotonic()
            if now < next_check:
                continue
            next_check = now + every
            timeout = min(5.0, self.opts.unhealthy_s / 2)
            got = probe.get("/health", timeout=timeout)
            if got is not None and got[0] == 200:
                if self.health_failing_since is not None:
                    log.warning(
                        "%s: /health answers again after %.0f s",
                        self.name,
                        time.time() - self.health_failing_since,
                    )
                    self.health_failing_since = None
                    self.on_change()
                continue
            last = "no answer" if got is None else f"HTTP {got[0]}"
            if self.health_failing_since is None:
                self.health_failing_since, failing_from = time.time(), self.opts.clock()
                log.warning("%s: /health failing (%s)", self.name, last)
                self.on_change()
            elif (failing := self.opts.clock() - failing_from) >= self.opts.unhealthy_s:
                return f"/health failing for {failing:.0f} s ({last})"
        return None

    def _main(self) -> None:
        try:
            self._run()
        except BaseException as e:  # whatever breaks, the instance must not look alive
            self._crashed(e)
        finally:
            self._remove_made()
            self.on_done()

    def _remove_made(self) -> None:
        """Remove the directories this instance made in /tmp (:attr:`_made`) once no process of its
        own is left: each only where it is still the directory made (device, inode, owner, mode; a
        link or another directory in its place is left alone), its contents without following
        links (``shutil.rmtree``'s fd-based walk)."""
        import shutil

        proc = self.proc
        if proc is not None and proc.returncode is None:
            log.warning("%s: its process %s may still run: %s kept", self.name, proc.pid, self._made)
            return
        for path, ident in self._made:
            try:
                now = DirIdentity.of(path)
            except OSError as e:
                log.warning("%s: %s not removed: %s", self.name, path, e)
                continue
            if now is None or now != ident:
                continue
            try:
                shutil.rmtree(path)
            except OSError as e:
                log.warning("%s: %s not removed: %s", self.name, path, e)
        self._made.clear()

    def _crashed(self, e: BaseException) -> None:
        log.error("%s: the supervisor thread broke: %s: %s", self.name, type(e).__name__, e, exc_info=e)
        self.failure = {
            "kind": "supervisor error",
            "evidence": f"{type(e).__name__}: {e}"[:300],
            "fix": f"a fault in hwprofile itself: see {self.opts.runtime / LOG_FILE}",
        }
        proc = self.proc
        if proc is not None and proc.returncode is None:
            try:
                self._end(proc, self._grace())
            except Exception as again:
                log.error("%s: could not end process %s: %s", self.name, proc.pid, again)
        self.machine.fail()

    def _rejoin(self, proc: subprocess.Popen[bytes], why: str) -> None:
        """A headless process that belongs to no group (:mod:`.group`): stop it (a few seconds: it
        serves nothing to drain) and start a new one at once. Not a failure: no backoff, no restart
        counted; node 0's own restarts bound how often this happens."""
        log.warning("%s: %s: starting a new process to join node 0's next group", self.name, why)
        self.log.mark(f"rejoin: {why}")
        self._end(proc, min(self._grace(), 5.0))
        self.rejoins += 1
        self.group_wait = None

    def _api_key(self) -> str | None:
        source = self.inst.server.api_key_env
        return os.environ.get(source) if source else None

    def _stopping(self, proc: subprocess.Popen[bytes] | None) -> None:
        self._set(State.STOPPING)
        if proc is not None:
            self._end(proc, self._grace())

    # -- the start gate -----------------------------------------------------------------------
    def _gate(self) -> bool:
        """Before a start of a GPU instance: wait (bounded) until its GPUs' memory is back
        (:mod:`.gate`), logged, and shown in status while it waits; a start that did not find it
        back carries a warning. False when a stop was asked while it waited."""
        self.gate_warnings = []
        gpus = list(self.inst.gpus or ())
        if self.gate is None or self.inst.device != "cuda" or not gpus:
            return True  # a CPU instance has no GPU memory to wait for
        if not self.gate.baseline and not (self.restarts or self.replacements or self.rejoins or self.ladder):
            self.gate.take_baseline(gpus)  # before its first start: nothing hwprofile started is there

        def note(why: str) -> None:
            log.warning(
                "%s: waiting up to %.0f s for GPU memory before the start: %s",
                self.name,
                self.opts.gpu_free_timeout,
                why,
            )
            self.log.mark(f"start gate: waiting for GPU memory: {why}")
            self.gpu_wait = why
            self.on_change()

        util = self.inst.engine.gpu_memory_utilization
        passed = self.gate.wait(gpus, util if isinstance(util, float) else None, note)
        self.gpu_wait = None
        if passed.outcome == "stopped":
            return False
        if passed.outcome == "free" and passed.why:
            log.info("%s: GPU memory back after %.1f s: starting", self.name, passed.waited_s)
            self.log.mark(f"start gate: GPU memory back after {passed.waited_s:.1f} s")
        warning = passed.warning
        if warning:
            log.warning("%s: %s", self.name, warning)
            self.log.mark(f"start gate: {warning}")
            self.gate_warnings = [warning]
        self.on_change()
        return True

    # -- the memory ladder --------------------------------------------------------------------
    def _min_model_len(self) -> int:
        known = self.opts.min_model_len  # the plan's engine section has no min_model_len
        return int(known) if known else MIN_CONTEXT

    def _ladder_step(self) -> tuple[Rung, Plan, InstancePlan] | str:
        """The next ladder step, re-planned (:func:`.ladder.replan_step`), or what to do instead."""
        return replan_step(
            self.name, self.inst, self._taken, self._refused, self._min_model_len(), self.replan
        )

    def _take_step(self, step: Rung, plan: Plan, new: InstancePlan, because: str) -> None:
        """Run the next start as ``new``, the instance re-planned with every step so far: its engine
        settings and memory figures are the planner's, so the startup check compares fresh ones."""
        change = step_change(step, new)
        self.plan, self.inst = plan, new
        self._taken.append(step)
        self.ladder.append({"rung": step.rung, "change": change, "because": because, "set": step.set})
        log.warning("%s: ladder step %d: %s (%s)", self.name, len(self.ladder), change, because)
        self.log.mark(f"ladder: {change} (--set {step.set})")

    def _count_failure(self) -> bool:
        """Count a failure in the window (systemd's StartLimitBurst within StartLimitIntervalSec): True
        when it is one more than ``supervise.max_restarts`` within ``supervise.restart_window_s``. A
        failure after a whole window of serving starts the give-ups in a row again."""
        now, window = self.opts.clock(), self.opts.restart_window_s
        if self._ready_since is not None and now - self._ready_since >= window:
            self.gave_up = 0
        self._ready_since = None
        self.crashes.append(now)
        while self.crashes and now - self.crashes[0] >= window:
            self.crashes.popleft()
        return len(self.crashes) > self.opts.max_restarts

    def _plan_cool_off(self) -> float | None:
        """After giving up, before the state turns failed: the cool-off's length, with ``retry_at`` and the
        fix that says it set first (so /health and STATUS never show the failed state without them);
        None when retries are off (``supervise.retry_failed_s`` 0). The wait doubles with each give-up in
        a row, at most ``supervise.retry_failed_max_s``."""
        if self.opts.retry_failed_s <= 0:
            return None
        wait = min(self.opts.retry_failed_s * 2**self.gave_up, self.opts.retry_failed_max_s)
        self.gave_up += 1
        self.retry_at = time.time() + wait
        fix = (
            f"{(self.failure or {}).get('fix', 'gave up')}; tried again in {wait:.0f} s "
            f"(give-up {self.gave_up} in a row, supervise.retry_failed_s)"
        )
        self.failure = {**(self.failure or {}), "fix": fix}
        return wait

    def _cool_off(self, wait: float | None) -> bool:
        """Wait ``wait`` seconds (:meth:`_plan_cool_off`) in state failed, then True to try again with a
        fresh window; False at once when retries are off (None), or when a stop is asked meanwhile (it
        stays failed)."""
        if wait is None:
            return False
        log.error("%s: %s", self.name, (self.failure or {}).get("fix"))
        clock = self.opts.clock
        until = clock() + wait
        while clock() < until:
            if self._stop_asked.wait(self.opts.poll_interval):
                self.retry_at = None
                self.on_change()
                return False
        self.retry_at = None
        self.crashes.clear()
        self.log.mark(f"retry after a cool-off of {wait:.0f} s (give-up {self.gave_up} in a row)")
        log.warning("%s: trying again after a cool-off of %.0f s", self.name, wait)
        return True

    def _run(self) -> None:
        """Start, serve, and after each failure restart (with backoff, a ladder step, a cool-off) until
        asked to stop or given up: each phase is one method, each returns what the loop does next."""
        backoff = self.opts.backoff_initial
        while not self._stop_asked.is_set():
            r = self._render()
            self.render_warnings = r.warnings
            if not self._port_ready():
                return
            if self._stop_asked.is_set() or not self._gate():
                break
            proc, since = self._start(r)
            outcome = self._wait_ready(proc)
            if outcome == "stopping":
                self._stopping(proc)
                break
            if outcome == "rejoin":
                self._rejoin(proc, self.group_wait or "node 0's group ended")
                continue
            step: tuple[Rung, Plan, InstancePlan] | None = None  # a ladder step, re-planned
            because = ""  # the failure that step answers
            if outcome == "ready":
                backoff = self.opts.backoff_initial
                after = self._ready(proc, since)
                if after == "stop":
                    break
                if after == "replaced":
                    continue
            elif outcome == "timeout":
                self._timed_out(proc)
            else:  # exited during start-up
                got = self._start_failed(proc, since)
                if got is None:
                    return  # failed for good
                step, because = got
            then = self._after_failure(step, because, backoff)
            if then == "return":
                return
            if then == "fresh":
                backoff = self.opts.backoff_initial
                continue
            if then == "stop":
                break
            backoff = min(backoff * 2, self.opts.backoff_max)
        self._finish()

    def _finish(self) -> None:
        if self.state == State.FAILED:
            return  # asked to stop while cooling off: nothing runs, and it ended failed
        if self.state != State.STOPPING:
            self._stopping(None)
        self._set(State.STOPPED)

    def _port_ready(self) -> bool:
        """Its port before a start: after a failure, the old process's socket is given up to 15 s to go;
        at the first start a port already taken fails the instance (False)."""
        s = self.inst.server
        if self.inst.headless:
            return True
        if self.restarts or self.ladder or self.replacements:
            end = time.monotonic() + 15  # after a failure: let the old process's socket go
            while not port_free(s.host, s.port) and time.monotonic() < end and not self._stop_asked.wait(0.5):
                pass
            return True
        if port_free(s.host, s.port):
            return True
        self.failure = {
            "kind": "port in use",
            "evidence": f"{s.host}:{s.port} is taken before start",
            "fix": "stop what holds it, or --set server.port=<free port>",
        }
        self.log.mark(f"port {s.port} taken; not started")
        self._set(State.FAILED)
        return False

    def _start(self, r: Rendered) -> tuple[subprocess.Popen[bytes], int]:
        """Spawn the server; returns its process and where its own log lines begin."""
        self.started_at, self.ready_at = time.time(), None
        self.log.mark(f"start {self.name} (restart {self.restarts}): {' '.join(r.argv)}")
        since = self.log.count  # this start's own lines: earlier starts' stay out of its verdicts
        if self.inst.headless:  # node 0 before this process: did a group form without it?
            self._head_at_start = look(self.url)
        proc = self._spawn(r)
        self._set(
            State.STARTING if not (self.restarts or self.replacements or self.rejoins) else State.RESTARTING
        )
        return proc, since

    def _ready(self, proc: subprocess.Popen[bytes], since: int) -> str:
        """Ready: check it started as planned, serve until it ends. Returns ``stop`` (asked to stop),
        ``replaced`` (a planned restart with new settings) or ``failed`` (it exited or stopped serving)."""
        self.ready_at = time.time()
        started = parse_startup(self.log.text_since(since))
        self.verify_warnings = compare(self.inst, started)
        if self.opts.kv_pools is not None:  # supervise.pin_kv_pool: the pool vLLM measured
            record_pool(self.opts.kv_pools, self.plan, self.inst, started)
        for w in self.verify_warnings:
            log.warning("%s: started differently from the plan: %s", self.name, w)
        self._ready_since = self.opts.clock()
        self._set(State.READY)
        self.group_wait = None
        unresponsive = self._serve(proc)
        if self._stop_asked.is_set():
            self._stopping(proc)
            return "stop"
        if self._replace_asked.is_set() and not exited(proc):
            new = self._take_replacement()
            if new is not None:
                self._set(State.RESTARTING)
                self.log.mark(f"planned restart with new settings ({self.replacements + 1})")
                log.info("%s: planned restart with new settings: draining", self.name)
                self._end(proc, self._grace())
                self.inst, self.ladder, self.failure = new, [], None
                self._taken, self._refused = [], []
                self.replacements += 1
                return "replaced"
        if unresponsive:  # alive, but not serving: drained as far as it still can, then restarted
            log.error("%s: %s; restarting it", self.name, unresponsive)
            self.log.mark(f"unresponsive: {unresponsive}")
            self._set(State.RESTARTING)  # not "ready" while it drains (a frozen one: the whole grace)
            self._end(proc, self._grace())
            self.failure = {"kind": "unresponsive", "evidence": unresponsive}
            self.unresponsive += 1
            self.health_failing_since = None
            return "failed"
        # Any exit we did not ask for is a failure, whatever the code (vLLM can exit 0 after its engine died).
        self._end(proc, 0)
        code = proc.returncode
        why = exit_evidence(self.log.text_since(since)) or self.log.last_line()[-300:]
        self.failure = {"kind": "unplanned exit", "evidence": f"exit code {code}: {why}"}
        log.error("%s: exited with code %s without being asked to", self.name, code)
        return "failed"

    def _timed_out(self, proc: subprocess.Popen[bytes]) -> None:
        evidence = self.log.last_line()[-300:]  # before the stop adds its own lines
        self._end(proc, 10)
        self.failure = {"kind": "readiness timeout", "evidence": evidence}
        log.error("%s: not ready after %.0f s", self.name, self.opts.ready_timeout)

    def _start_failed(
        self, proc: subprocess.Popen[bytes], since: int
    ) -> tuple[tuple[Rung, Plan, InstancePlan] | None, str] | None:
        """It exited during start-up: classify why. None: failed for good (a configuration error, or no
        ladder step left); else the ladder step to take (None: the same settings) and the failure it answers."""
        self._end(proc, 0)
        f: Failure = classify(self.log.text_since(since))
        said = f"exit code {proc.returncode}: " if f.kind == "unplanned exit" else ""
        self.failure = {"kind": f.kind, "evidence": said + f.evidence}
        log.error("%s: failed to start (%s): %s", self.name, f.kind, f.evidence)
        if f.memory_like:
            got = self._ladder_step()
            if isinstance(got, str):
                self.failure["fix"] = got
                self._set(State.FAILED)
                return None
            return got, f.kind
        if not f.retry:
            self.failure["fix"] = "a configuration error: fix it and launch again (not retried)"
            self._set(State.FAILED)
            return None
        return None, ""

    def _after_failure(
        self, step: tuple[Rung, Plan, InstancePlan] | None, because: str, backoff: float
    ) -> str:
        """Count the failure and wait before the next start: ``next`` (after the backoff), ``fresh`` (given
        up, cooled off: a fresh window), ``stop`` (asked to stop meanwhile) or ``return`` (given up for good)."""
        # A ladder step is a restart too: it counts toward max_restarts and waits the backoff.
        self.restarts += 1
        if self._count_failure():
            self.failure = {
                **(self.failure or {}),
                "fix": f"gave up after {self.opts.max_restarts} restarts within "
                f"supervise.restart_window_s ({self.opts.restart_window_s:g} s)"
                + (f" (the next ladder step would have been --set {step[0].set})" if step else ""),
            }
            wait = self._plan_cool_off()  # retry_at before the state: never "failed, not tried again"
            self._set(State.FAILED)
            if not self._cool_off(wait):
                return "return"
            if (new := self._take_replacement()) is not None:  # new settings came while it was failed
                self.inst, self.ladder, self._taken, self._refused = new, [], [], []
            return "fresh"  # a fresh window: the same settings again (a ladder step waits for its failures)
        if step is not None:
            self._take_step(*step, because=because)
        self._set(State.RESTARTING)
        log.warning("%s: restart %d in %.1f s", self.name, self.restarts, backoff)
        if self._stop_asked.wait(backoff):
            return "stop"
        return "next"
