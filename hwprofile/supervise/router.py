"""vLLM's router (``pip install vllm-router``) in front of a plan's separate servers, run by the
supervisor like an instance: started once the first server is ready (the router waits for its
workers' ``/health`` itself), its output in ``<log root>/vllm-router.log``, ready when its own
``/readiness`` answers with at least one healthy server, restarted with the instances' backoff when it
exits, stopped (SIGTERM, then SIGKILL to its group) before the servers so that no client is sent to a
server that is going away. Tied to the supervisor's life as vLLM is (:func:`.child.die_with_parent`).

Side effects: one process, one log file; :meth:`RouterFront.record` is its part of ``state.json``."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import threading
import time
from collections.abc import Callable
from typing import Any

from ..plan.types import Plan
from ..render.router import metrics_port, render_router
from ..runtime.processes import identify
from .child import die_with_parent, end_group, exited
from .logs import private_dir
from .options import Options

log = logging.getLogger("hwprofile")
LOG_NAME = "vllm-router.log"
STOP_GRACE_S = 10.0  # the router drains in-flight requests on SIGTERM; then its group is killed


class RouterFront:
    """The router of ``plan`` (its argv from :func:`~hwprofile.render.router.render_router`), run by
    a thread of its own. ``servers_ready()``: whether a server is ready (the router starts then);
    ``changed()``: called at every change of state (the supervisor saves ``state.json``)."""

    def __init__(
        self,
        plan: Plan,
        binary: str,
        opts: Options,
        servers_ready: Callable[[], bool],
        changed: Callable[[], None],
    ) -> None:
        assert plan.endpoint is not None
        self.argv = render_router(plan, binary)
        self.url = plan.endpoint.url
        self.policy = str(plan.endpoint.policy)
        self.metrics_url = f"http://127.0.0.1:{metrics_port(plan)}/metrics"
        self.opts = opts
        self.log_path = opts.log_root / LOG_NAME
        self.servers_ready = servers_ready
        self.changed = changed
        self.state = "waiting"  # waiting | starting | ready | restarting | stopped
        self.proc: subprocess.Popen[bytes] | None = None
        self.started_at: float | None = None
        self.restarts = 0
        self.last_exit: int | None = None
        self.healthy_workers: int | None = None
        self.total_workers: int | None = None
        self._stop = threading.Event()
        self.thread = threading.Thread(target=self._run, name="vllm-router", daemon=True)

    # -- the thread ---------------------------------------------------------------------------
    def _set(self, state: str) -> None:
        if state != self.state:
            log.info("vllm-router: %s -> %s", self.state, state)
            self.state = state
            self.changed()

    def _spawn(self) -> subprocess.Popen[bytes]:
        private_dir(self.opts.log_root)
        argv, life = die_with_parent(self.argv, STOP_GRACE_S)
        env = {**os.environ, "NO_COLOR": "1", "RUST_LOG_STYLE": "never"}
        fd = os.open(self.log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        try:
            proc = subprocess.Popen(
                argv,
                pass_fds=(life,),
                stdin=subprocess.DEVNULL,
                stdout=fd,
                stderr=subprocess.STDOUT,
                env=env,
                start_new_session=True,
            )
        finally:
            os.close(fd)
        self.started_at = time.time()
        log.info(
            "vllm-router (pid %d) starting on %s (%s) in front of %s; log %s",
            proc.pid,
            self.url,
            self.policy,
            " ".join(a for a in self.argv if a.startswith("http://")),
            self.log_path,
        )
        return proc

    def readiness(self) -> tuple[int, int] | None:
        """(healthy servers, servers) as the router's ``/readiness`` says; None without an answer."""
        from ..telemetry import http

        got = http.get(self.url + "/readiness", timeout=2.0)
        if got is None:
            return None
        try:
            doc = json.loads(got[1])
            return int(doc["healthy_workers"]), int(doc["total_workers"])
        except (ValueError, KeyError, TypeError):
            return None

    def _run(self) -> None:
        delay = self.opts.backoff_initial
        try:
            while not self._stop.is_set():
                while not self.servers_ready():
                    if self._stop.wait(self.opts.poll_interval):
                        return
                self._set("starting")
                self.proc = self._spawn()
                began = time.monotonic()
                while not self._stop.is_set() and not exited(self.proc):
                    got = self.readiness()
                    self.healthy_workers, self.total_workers = got if got else (None, None)
                    self._set("ready" if got and got[0] > 0 else "starting")
                    self._stop.wait(self.opts.poll_interval)
                if self._stop.is_set():
                    return
                self.last_exit = self.proc.wait()
                self.proc = None
                self.restarts += 1
                if time.monotonic() - began > self.opts.restart_window_s:
                    delay = self.opts.backoff_initial  # it ran a while: a new failure, not a crash loop
                log.warning(
                    "vllm-router exited (%s); restart %d in %.1f s (log %s)",
                    self.last_exit,
                    self.restarts,
                    delay,
                    self.log_path,
                )
                self._set("restarting")
                if self._stop.wait(delay):
                    return
                delay = min(delay * 2, self.opts.backoff_max)
        finally:
            if self.proc is not None:
                end_group(self.proc, STOP_GRACE_S, "vllm-router")
                self.last_exit = self.proc.returncode
                self.proc = None
            self.healthy_workers = self.total_workers = None
            self._set("stopped")

    # -- the supervisor's side ----------------------------------------------------------------
    def start(self) -> None:
        self.thread.start()

    def stop(self) -> None:
        """Ask the thread to stop the router (it does, then says so); returns at once."""
        self._stop.set()

    def join(self, timeout: float | None = None) -> None:
        if self.thread.is_alive():
            self.thread.join(timeout)

    def record(self) -> dict[str, Any]:
        """Its part of ``state.json``: what ``status`` and the exporter show."""
        proc = self.proc
        ident = identify(proc.pid) if proc is not None and proc.returncode is None else None
        return {
            "kind": "router",
            "state": self.state,
            "url": self.url,
            "policy": self.policy,
            "pid": ident.pid if ident else None,
            "process": ident.to_json() if ident else None,
            "started_at": self.started_at if ident else None,
            "restarts": self.restarts,
            "last_exit": self.last_exit,
            "healthy_servers": self.healthy_workers,
            "servers": self.total_workers,
            "metrics_url": self.metrics_url,
            "log_file": str(self.log_path),
            "argv": list(self.argv),
        }
