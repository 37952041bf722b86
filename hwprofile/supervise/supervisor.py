"""Run planned vLLM instances: own process group each, readiness, verification, restarts, the
out-of-memory ladder, graceful stop. One thread per instance; the state file mirrors every change."""

from __future__ import annotations

import contextlib
import copy
import errno
import logging
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple

from ..render.translate import Rendered, render_instance
from ..render.versions import Release
from .failures import Failure, classify, next_step
from .logs import RotatingLog, private_dir, pump
from .state import pid_alive, write_state
from .verify import compare, parse_startup

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
    """What the supervisor needs beyond the plan (paths and policies), decided by the caller."""

    runtime: Path
    log_root: Path
    log_max_bytes: int = 64 << 20
    log_files: int = 4
    ready_timeout: float = 900
    max_restarts: int = 5
    backoff_initial: float = 2.0
    backoff_max: float = 60.0
    progress: Callable[[str], None] | None = None


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
    def __init__(self, sup: Supervisor, plan: dict[str, Any], inst: dict[str, Any]) -> None:
        self.sup = sup
        self.plan = plan
        self.inst = copy.deepcopy(inst)
        self.name = inst["name"]
        self.state = "starting"
        self.pid: int | None = None
        self.proc: subprocess.Popen[bytes] | None = None
        self.restarts = 0
        self.ladder: list[dict[str, str]] = []
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
        self.thread = threading.Thread(target=self._run, name=f"instance-{self.name}", daemon=True)
        self._stop_asked = threading.Event()

    # -- public ---------------------------------------------------------------------------
    @property
    def url(self) -> str:
        s = self.inst["server"]
        host = "127.0.0.1" if s["host"] in ("0.0.0.0", "", "::") else s["host"]
        return f"http://{host}:{s['port']}"

    def snapshot(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "state": self.state,
            "pid": self.pid,
            "pgid": self.pid,
            "url": self.url,
            "gpus": self.inst["gpus"],
            "numa_node": self.inst.get("numa_node"),
            "started_at": self.started_at,
            "ready_at": self.ready_at,
            "restarts": self.restarts,
            "ladder": self.ladder,
            "failure": self.failure,
            "log_dir": str(self.log.dir),
            "log_file": str(self.log.path),
            "argv": self.argv,
            "engine": self.inst["engine"],
            "speculative": self.inst.get("speculative"),
            "warnings": self.render_warnings + self.verify_warnings,
        }

    def stop(self) -> None:
        self._stop_asked.set()

    # -- the life cycle ---------------------------------------------------------------------
    def _set(self, state: str) -> None:
        self.state = state
        self.sup.save()

    def _render(self) -> Rendered:
        return render_instance(
            self.plan, self.inst, self.sup.release, self.sup.vllm_command, self.sup.numactl
        )

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
        self.proc, self.pid = proc, proc.pid
        assert proc.stdout is not None
        self._pump = pump(proc.stdout, self.log, log, self.name)
        return proc

    def _kill_group(self, proc: subprocess.Popen[bytes], grace: float) -> None:
        """Graceful stop: SIGTERM to vLLM's API server (the group leader) only, so vLLM shuts its
        engine and workers down in order and drains requests (--shutdown-timeout); after ``grace``
        seconds, or once the leader is gone, SIGKILL whatever is left of the process group."""
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(proc.pid, signal.SIGTERM)
            try:
                proc.wait(grace)
            except subprocess.TimeoutExpired:
                log.warning(
                    "%s: still running %.0f s after SIGTERM: SIGKILL to its process group", self.name, grace
                )
        end = time.monotonic() + min(5.0, grace)
        while (
            pid_alive(proc.pid, group=True) and time.monotonic() < end
        ):  # vLLM's children leave on their own
            time.sleep(0.1)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        self._pump.join(5)

    def _wait_ready(self, proc: subprocess.Popen[bytes]) -> str:
        """'ready', 'exited', 'stopping' or 'timeout'."""
        deadline = time.monotonic() + self.sup.opts.ready_timeout
        last_note = 0.0
        while True:
            if self._stop_asked.is_set():
                return "stopping"
            if proc.poll() is not None:
                return "exited"
            try:
                with urllib.request.urlopen(self.url + "/health", timeout=2) as resp:
                    if resp.status == 200:
                        return "ready"
            except (urllib.error.URLError, OSError, TimeoutError):
                pass
            now = time.monotonic()
            if now > deadline:
                return "timeout"
            if self.sup.opts.progress and now - last_note >= 5:
                last_note = now
                elapsed = time.time() - (self.started_at or time.time())
                self.sup.opts.progress(
                    f"{self.name}: starting, {elapsed:.0f} s | {self.log.last_line()[-160:]}"
                )
            self._stop_asked.wait(0.5)

    def _run(self) -> None:
        backoff = self.sup.opts.backoff_initial
        while not self._stop_asked.is_set():
            r = self._render()
            self.render_warnings = r.warnings
            s = self.inst["server"]
            if self.restarts or self.ladder:
                end = time.monotonic() + 15  # after a failure: let the old process's socket go
                while (
                    not port_free(s["host"], s["port"])
                    and time.monotonic() < end
                    and not self._stop_asked.wait(0.5)
                ):
                    pass
            elif not port_free(s["host"], s["port"]):
                self.failure = {"kind": "port in use", "evidence": f"{s['host']}:{s['port']} is taken before start",
                                "fix": "stop what holds it, or --set server.port=<free port>"}  # fmt: skip
                self.log.mark(f"port {s['port']} taken; not started")
                self._set("failed")
                return
            self.started_at, self.ready_at = time.time(), None
            self.log.mark(f"start {self.name} (restart {self.restarts}): {' '.join(r.argv)}")
            proc = self._spawn(r)
            self._set("starting" if not self.restarts else "restarting")
            outcome = self._wait_ready(proc)
            if outcome == "stopping":
                self._kill_group(proc, float(s.get("shutdown_timeout") or 0) + 10)
                break
            if outcome == "ready":
                self.ready_at = time.time()
                self.verify_warnings = compare(self.inst, parse_startup(self.log.text()))
                for w in self.verify_warnings:
                    log.warning("%s: started differently from the plan: %s", self.name, w)
                backoff = self.sup.opts.backoff_initial
                self._set("ready")
                while proc.poll() is None and not self._stop_asked.wait(0.5):
                    pass
                if self._stop_asked.is_set():
                    self._kill_group(proc, float(s.get("shutdown_timeout") or 0) + 10)
                    break
                # Any exit we did not ask for is a failure, whatever the code (vLLM can exit 0 after its engine died).
                code = proc.returncode
                self._kill_group(proc, 0)
                self.failure = {
                    "kind": "unplanned exit",
                    "evidence": f"exit code {code}: {self.log.last_line()[-300:]}",
                }
                log.error("%s: exited with code %s without being asked to", self.name, code)
            elif outcome == "timeout":
                self._kill_group(proc, 10)
                self.failure = {"kind": "readiness timeout", "evidence": self.log.last_line()[-300:]}
                log.error("%s: not ready after %.0f s", self.name, self.sup.opts.ready_timeout)
            else:  # exited during start-up
                self._kill_group(proc, 0)
                f: Failure = classify(self.log.text())
                self.failure = {"kind": f.kind, "evidence": f.evidence}
                log.error("%s: failed to start (%s): %s", self.name, f.kind, f.evidence)
                if f.memory_like:
                    nxt = next_step(self.inst)
                    if nxt is None:
                        self.failure["fix"] = (
                            "every ladder step taken; a smaller model, a 4-bit checkpoint or another GPU"
                        )
                        self._set("failed")
                        return
                    self.inst, step = nxt
                    self.ladder.append({"rung": step.rung, "change": step.change, "because": f.kind})
                    log.warning(
                        "%s: ladder step %d: %s (%s)", self.name, len(self.ladder), step.change, f.kind
                    )
                    self.log.mark(f"ladder: {step.change}")
                    continue
                if not f.retry:
                    self.failure["fix"] = "a configuration error: fix it and launch again (not retried)"
                    self._set("failed")
                    return
            self.restarts += 1
            if self.restarts > self.sup.opts.max_restarts:
                self.failure = {
                    **(self.failure or {}),
                    "fix": f"gave up after {self.sup.opts.max_restarts} restarts",
                }
                self._set("failed")
                return
            self._set("restarting")
            log.warning("%s: restart %d in %.0f s", self.name, self.restarts, backoff)
            if self._stop_asked.wait(backoff):
                break
            backoff = min(backoff * 2, self.sup.opts.backoff_max)
        self._set("stopped")


class Supervisor:
    def __init__(
        self, plan: dict[str, Any], release: Release, vllm_command: str, numactl: str | None, opts: Options
    ) -> None:
        self.plan = plan
        self.release = release
        self.vllm_command = vllm_command
        self.numactl = numactl
        self.opts = opts
        self.state_path = opts.runtime / "state.json"
        self.started_at = time.time()
        self._lock = threading.Lock()
        private_dir(opts.runtime)
        private_dir(opts.log_root)
        self.instances = [Instance(self, plan, i) for i in plan["instances"]]

    def save(self) -> None:
        with self._lock:
            write_state(
                self.state_path,
                {
                    "supervisor_pid": os.getpid(),
                    "started_at": self.started_at,
                    "profile": self.plan["profile"],
                    "model": self.plan["model"]["path"] or self.plan["model"]["name"],
                    "vllm_version": self.release.target,
                    "instances": [i.snapshot() for i in self.instances],
                },
            )

    def start(self) -> None:
        self.save()
        for i in self.instances:
            i.thread.start()

    def stop(self) -> None:
        for i in self.instances:
            i.stop()

    def wait(self, timeout: float | None = None) -> None:
        end = None if timeout is None else time.monotonic() + timeout
        for i in self.instances:
            i.thread.join(None if end is None else max(0.0, end - time.monotonic()))

    def wait_ready(self, timeout: float) -> bool:
        """True when every instance is ready; False as soon as one failed or time ran out."""
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            states = {i.state for i in self.instances}
            if states == {"ready"}:
                return True
            if "failed" in states or "stopped" in states:
                return False
            time.sleep(0.3)
        return False

    @property
    def all_done(self) -> bool:
        return all(not i.thread.is_alive() for i in self.instances)
