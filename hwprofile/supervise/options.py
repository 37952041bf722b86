"""What a supervisor and its instances need beyond the plan (:class:`Options`): the paths the caller
decided and the plan's ``supervise`` and ``logs`` settings, read in one place."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

if TYPE_CHECKING:
    from ..config.settings import Logs, Supervise
    from .gate import Reader


class Options(NamedTuple):
    """What the supervisor needs beyond the plan: the paths the caller decided, and the plan's
    ``supervise`` and ``logs`` settings, read in one place (:meth:`from_settings`). No setting has a
    default here: its default is its declaration's (:mod:`hwprofile.config.run_sections`)."""

    runtime: Path
    log_root: Path
    log_max_bytes: int
    log_files: int
    ready_timeout: float
    max_restarts: int  # failures within restart_window_s before giving up
    restart_window_s: float
    retry_failed_s: float  # cool-off after giving up before trying again (0: never), doubling
    retry_failed_max_s: float
    backoff_initial: float
    backoff_max: float
    stop_margin: float  # seconds beyond server.shutdown_timeout before SIGKILL
    unhealthy_s: float  # seconds of failing /health before a ready instance is restarted
    log_stdout: bool  # logs.stdout: every output line to hwprofile's stdout too, prefixed with the instance
    gpu_free_timeout: float  # the start gate's bound (supervise.gate)
    progress: Callable[[str], None] | None = None
    poll_interval: float = 0.5  # seconds between /health polls and exit checks (not a setting)
    min_model_len: int | None = None  # the profile's engine.min_model_len: the ladder's context floor
    # the GPUs' memory now (hwprofile.host.gpumem.GpuMemory, given by launch.start): the start gate's
    # readings; None: GPU instances start without the gate
    gpu_memory: Reader | None = None
    # what the start gate, the readiness deadline, supervise.unhealthy_s, the restart window and the
    # cool-off are measured by (tests inject their own, so that a deadline passes when the test says
    # so, not when a loaded machine happens to be slow)
    clock: Callable[[], float] = time.monotonic
    kv_pools: Path | None = None  # where the KV pools vLLM measured are recorded (supervise.pin_kv_pool)

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
            restart_window_s=supervise.restart_window_s,
            retry_failed_s=supervise.retry_failed_s,
            retry_failed_max_s=supervise.retry_failed_max_s,
            backoff_initial=supervise.backoff_initial,
            backoff_max=supervise.backoff_max,
            stop_margin=supervise.stop_margin,
            unhealthy_s=supervise.unhealthy_s,
            log_stdout=logs.stdout,
            gpu_free_timeout=supervise.gpu_free_timeout,
            **rest,
        )
