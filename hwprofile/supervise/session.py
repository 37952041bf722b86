"""Serve a plan for the length of a ``with`` block: what ``hwprofile bench`` and ``hwprofile verify``
use to start the plans they measure or compare (the supervisor of ``launch``, in this process, in its
own runtime directory), and stop it cleanly afterwards whatever happened inside."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from ..errors import OperationError
from ..plan.types import Plan, as_plan


class NotReady(OperationError):
    """A served plan did not become ready (the message names the instances and their logs)."""


@contextlib.contextmanager
def serving(
    plan: Plan | dict[str, Any],
    rel: Any,
    vllm_cmd: str,
    numactl: str | None,
    tmpfs: str | None,
    runtime: Path,
    progress: Callable[[str], None] | None = None,
) -> Iterator[list[str]]:
    """Start every instance of ``plan`` under a supervisor holding ``runtime``; yield their base URLs
    once all answer ``/health``; stop and wait for them on leaving. Raises :class:`NotReady` (after
    stopping what started) when an instance fails or the plan's ``supervise.ready_timeout`` passes,
    and the launch errors (ports taken, another supervisor in ``runtime``) before starting anything."""
    from ..launch import check_not_running, check_ports, options, prepare_dirs
    from .lifecycle import State
    from .supervisor import Supervisor

    plan = as_plan(plan)
    prepare_dirs(plan, tmpfs, runtime)
    check_not_running(runtime)
    check_ports(plan)
    sup = Supervisor(plan, rel, vllm_cmd, numactl, options(plan, tmpfs, runtime, progress=progress))
    sup.start()
    try:
        if not sup.wait_ready(plan.supervise.ready_timeout):
            bad = [
                f"{i.name} ({i.state.value}; log {i.log.path})"
                for i in sup.instances
                if i.state != State.READY
            ]
            raise NotReady(f"not ready: {', '.join(bad) or 'no instance'}")
        yield [i.url for i in sup.instances]
    finally:
        sup.stop()
        sup.wait(max((float(i.server.shutdown_timeout) for i in plan.instances), default=0.0) + 60)
        sup.close()
