"""The sizes of a vLLM pod, decided here and only formatted by :mod:`.manifests`: CPU and memory
requests, the emptyDir volumes, the probes' periods and failure thresholds, the grace periods, and the
rates a first start is assumed to run at."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, NamedTuple

from ...runtime.processes import TEARDOWN_S

if TYPE_CHECKING:
    from ...host.snapshot import HostSnapshot
    from ...plan.types import Plan
    from ..translate import Rendered

GiB, MiB = 2**30, 2**20
PRESTOP_S = 5  # the Service stops sending before vLLM stops accepting (endpoints propagate)
PROBE_PERIOD_S = 10
READY_PERIOD_S, READY_FAILURES = 5, 2  # the readiness probe; watch.unready_s is their product
# What a first start is assumed to read (the weights from the Hugging Face hub into the pod's empty
# cache): a conservative rate, and the engine's own start (CUDA graphs, compile) on top.
ASSUMED_DOWNLOAD_BYTES_S = 200e6
ASSUMED_ENGINE_START_S = 180


def quantity(nbytes: float) -> str:
    """Bytes as a Kubernetes quantity, rounded up: whole GiB where exact, else MiB."""
    n = max(1, math.ceil(nbytes / MiB))
    return f"{n // 1024}Gi" if n % 1024 == 0 else f"{n}Mi"


class Sizes(NamedTuple):
    gpus: int
    cpu: int
    memory: int
    shm: int
    cache: int
    tmp: int
    logs: int
    load_s: int  # the planned load time: supervise.ready_timeout
    estimate_s: int  # a first start's download and engine start, at the assumed rates
    startup_failures: int
    liveness_failures: int
    grace_s: int
    drain_s: int
    progress_deadline_s: int


def sizes(plan: Plan, pod_plan: Plan, rendered: Rendered, host: HostSnapshot) -> Sizes:
    """The pod's resources, volumes, probe thresholds and grace periods: ``pod_plan`` (its instance
    as the pod plans it, rendered as ``rendered``) of the class's ``plan`` on nodes like ``host``."""
    pod = pod_plan.instances[0]
    gpus = len(pod.gpus)
    weights = int(pod_plan.model.weights_bytes or 0) + int(
        (pod_plan.draft.weights_bytes or 0) if pod_plan.draft else 0
    )
    per_node = sum(1 for i in plan.instances if i.device == "cuda" and i.node == 0) or 1
    share = (host.cpu.logical_cpus or 0) // per_node
    cpu = max(2, min(4 + 2 * gpus, share) if share else 4 + 2 * gpus)
    shm = (1 + gpus) * GiB if gpus > 1 else 2 * GiB
    memory = (
        8 * GiB + 2 * GiB * gpus + shm
    )  # API server, engine core, one worker per GPU; /dev/shm counts too
    load_s = math.ceil(pod_plan.supervise.ready_timeout)
    estimate_s = int(weights / ASSUMED_DOWNLOAD_BYTES_S) + ASSUMED_ENGINE_START_S
    drain = int(pod.server.shutdown_timeout)
    # the preStop pause, vLLM's drain with its room, the SIGKILL margin, the kernel's teardown of the group
    grace = (
        PRESTOP_S + int(rendered.stop_timeout_s) + math.ceil(pod_plan.supervise.stop_margin) + int(TEARDOWN_S)
    )
    unhealthy = (
        pod_plan.supervise.unhealthy_s + pod_plan.supervise.ready_timeout + pod_plan.supervise.backoff_max
    )
    return Sizes(
        gpus=gpus,
        cpu=cpu,
        memory=memory,
        shm=shm,
        cache=int(weights * 1.1) + 10 * GiB,
        tmp=8 * GiB,
        logs=int(pod_plan.logs.max_bytes) + 64 * MiB,
        load_s=load_s,
        estimate_s=estimate_s,
        # the start gate (supervise.gate) may wait for a previous pod's GPU memory before the first start
        startup_failures=math.ceil(
            (load_s + math.ceil(pod_plan.supervise.gpu_free_timeout) + 30) / PROBE_PERIOD_S
        ),
        liveness_failures=math.ceil(unhealthy / PROBE_PERIOD_S),
        grace_s=grace,
        drain_s=drain,
        progress_deadline_s=load_s + 300,
    )
