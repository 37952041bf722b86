"""Which workloads a GPU class becomes: its plan (over several of its nodes when one is too small),
each instance shape re-planned as its pod sees it (the pod's snapshot, the settings pinned for a
pod, the user's own as ``--set``), rendered for the release. A Deployment per shape, or one
LeaderWorkerSet group for a model over several nodes; :mod:`.manifests` writes them out."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import re
from collections.abc import Callable
from typing import Any, NamedTuple

from ...errors import RefusedError
from ...pipeline import PlanInputs, resolve_settings
from ...plan.nodes import USER_LAYERS
from ...plan.types import InstancePlan, Plan
from ..translate import Rendered, render_instance
from ..versions import Release
from .nodes import gfd_product, pod_view
from .sizes import READY_FAILURES, READY_PERIOD_S

POD_ROOT = "/etc/hwprofile/k8s"  # the ConfigMap; also the pod's --config-root (no profiles/ in it)
LOG_DIR = "/var/log/hwprofile"
METRICS_PORT = 9464  # the daemon's port when the plan turned it off (the probes need it)
# Kubernetes object names here end up in pod host names (<name>-0-1): a DNS label, 63 at most.
MAX_NAME = 40
# These settings are how the pod differs from the host the plan was made for: pinned, not the user's.
POD_KEYS = (
    "server.host",
    "server.port",
    "layout.numa_bind",
    "logs.dir",
    "layout.tensor_parallel_size",
    "layout.pipeline_parallel_size",
    "layout.replicas",
    "layout.shape",
    "layout.nodes",
    "watch.metrics_host",
    "watch.metrics_port",
    "watch.unready_s",
    "logs.stdout",
)


class K8sError(RefusedError):
    """A plan that cannot be run as Kubernetes workloads as it stands; the message says why."""


class Target(NamedTuple):
    """One GPU class to render: its plan inputs (the class's snapshot as ``host``) and where it is."""

    product: str  # nvidia.com/gpu.product of its nodes
    selector: dict[str, str]  # the node selector
    nodes: tuple[str, ...]  # the cluster's node names of this class (empty: from a snapshot)
    node_count: int  # nodes of the class (from a snapshot: 1)
    inputs: PlanInputs
    assumed: tuple[str, ...] = ()  # what a snapshot from labels assumed
    variant: str = (
        ""  # beside the product in its workloads' names: one product in two classes (count, memory)
    )


class Options(NamedTuple):
    release: Release
    image: str | None = None  # default: hwprofile-vllm:v<release>, as Containerfile builds it
    namespace: str | None = None
    api_key_secret: str = "hwprofile-api-key"
    router_image: str | None = None  # vLLM's router in front of every workload (a Deployment + Service)


@dataclasses.dataclass
class Workload:
    """One Deployment or LeaderWorkerSet with its ConfigMap, Service and PodMonitor."""

    name: str
    target: Target
    plan: Plan  # the class's plan
    pod_plans: list[Plan]  # per node rank of a pod (one for a Deployment), as the pod plans itself
    pod_inputs: PlanInputs
    rendered: list[Rendered]  # per node rank
    replicas: int
    sets: list[str]  # --set arguments of the pod's launch
    warnings: list[str]


def k8s_name(*parts: str) -> str:
    """A DNS label from ``parts`` (lower case, dashes), at most :data:`MAX_NAME` characters; a long
    one keeps a hash of the whole so two long names stay apart."""
    text = "-".join(p for p in parts if p)
    slug = re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-") or "vllm"
    if len(slug) > MAX_NAME:
        digest = hashlib.sha256(text.encode()).hexdigest()[:6]
        slug = slug[: MAX_NAME - 7].rstrip("-") + "-" + digest
    return slug


def set_value(value: object) -> str:
    """``value`` as ``--set`` reads it back (YAML scalar or JSON flow), exactly."""
    from ...config.layers import _scalar

    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str) and _scalar(value) == value:
        return value
    text = json.dumps(list(value) if isinstance(value, tuple) else value, separators=(",", ":"))
    if _scalar(text) != (list(value) if isinstance(value, tuple) else value):
        raise K8sError(f"the setting value {value!r} cannot be passed to the pod as --set")
    return text


def user_sets(inputs: PlanInputs) -> tuple[list[str], str | None]:
    """The settings a person set (overrides.d, --overrides, HWPROFILE_*, --set) as ``--set``
    arguments, for a pod that has none of those files; and the site profile, if the plan's profile
    chain has one (the pod has the built-in profiles only)."""
    res = resolve_settings(
        inputs.host, inputs.config_root, inputs.profile, list(inputs.overrides), list(inputs.sets)
    )
    site = next((p.path for p in res.chain if p.kind != "builtin"), None)
    out = []
    for path, src in sorted(res.provenance.items()):
        key = ".".join(path)
        if src.kind not in USER_LAYERS or key in POD_KEYS or path[0] in ("model", "profile"):
            continue
        value: Any = res.merged
        for part in path:
            value = value[part]
        out.append(f"{key}={set_value(value)}")
    return out, site


def _shape(inst: InstancePlan) -> tuple[Any, ...]:
    return (
        inst.device,
        len(inst.gpus),
        inst.gpu_name,
        inst.tensor_parallel_size,
        inst.pipeline_parallel_size,
        inst.ranks,
    )


def _pins(inst: InstancePlan, port: int, nnodes: int, metrics_port: int) -> list[str]:
    pins = [
        "server.host=0.0.0.0",
        f"server.port={port}",
        "layout.numa_bind=false",
        f"logs.dir={LOG_DIR}",
        f"layout.tensor_parallel_size={inst.tensor_parallel_size}",
        f"layout.pipeline_parallel_size={inst.pipeline_parallel_size}",
    ]
    # the daemon's port on the pod's address (probes, PodMonitor), vLLM's lines for `kubectl logs`, and
    # /health 503 for as long as the readiness probe takes to see it before a restart drains
    pins += [
        "watch.metrics_host=0.0.0.0",
        f"watch.metrics_port={metrics_port}",
        "logs.stdout=true",
        f"watch.unready_s={READY_PERIOD_S * READY_FAILURES}",
    ]
    if nnodes > 1:
        pins.append(f"layout.nodes={nnodes}")
    elif inst.ranks > 1:
        pins += [f"layout.replicas={inst.ranks}", "layout.shape=data_parallel"]
    else:
        pins += ["layout.replicas=1", "layout.shape=servers"]
    return pins


def _same(a: InstancePlan, b: InstancePlan) -> list[str]:
    """What differs between the class's instance and the pod's own plan of it."""
    out = []
    for what, x, y in (
        ("GPUs", len(a.gpus), len(b.gpus)),
        ("tensor parallel size", a.tensor_parallel_size, b.tensor_parallel_size),
        ("pipeline parallel size", a.pipeline_parallel_size, b.pipeline_parallel_size),
        ("data-parallel ranks", a.ranks, b.ranks),
        ("max_num_seqs", a.engine.max_num_seqs, b.engine.max_num_seqs),
        ("max_model_len", a.engine.max_model_len, b.engine.max_model_len),
        ("gpu_memory_utilization", a.engine.gpu_memory_utilization, b.engine.gpu_memory_utilization),
    ):
        if x != y:
            out.append(f"{what} {x} on the host, {y} in the pod")
    return out


def group_name(product: str, variant: str = "") -> str:
    return k8s_name("vllm", product, variant, "group")


def lws_address(name: str, rank: int) -> str:
    """Node ``rank``'s pod of group 0 of LeaderWorkerSet ``name``, through its headless Service."""
    return f"{name}-0.{name}" if rank == 0 else f"{name}-0-{rank}.{name}"


def plan_workloads(
    target: Target, opts: Options, render: Callable[[Plan, InstancePlan], Rendered] | None = None
) -> list[Workload]:
    """The workloads of one GPU class: its plan (over several of its nodes when one is too small),
    each instance shape re-planned as its pod sees it, rendered for the release."""
    from ...plan import PlanRefused

    rel = opts.release
    if render is None:

        def render(p: Plan, i: InstancePlan) -> Rendered:
            return render_instance(p, i, rel, i.server.vllm_command or "vllm", None)

    inputs = target.inputs
    base = k8s_name("vllm", target.product, target.variant)
    try:
        plan = inputs.whole_plan()
    except PlanRefused:
        if target.node_count < 2 or inputs.nodes:
            raise
        name = group_name(target.product, target.variant)
        others = (inputs.host,) * (target.node_count - 1)
        addresses = tuple(lws_address(name, k) for k in range(target.node_count))
        inputs = dataclasses.replace(inputs, nodes=others, addresses=addresses)
        plan = inputs.whole_plan()
    sets, site = user_sets(inputs)
    if site:
        raise K8sError(
            f"profile {plan.profile} comes from the site configuration ({site}): a pod has the built-in "
            "profiles only; pass --profile with a built-in one (and --set for what yours changes)"
        )
    port = plan.instances[0].server.port
    gpu_instances = [i for i in plan.instances if i.device == "cuda"]
    skipped = [
        f"{i.name}: a CPU instance: no Kubernetes workload (GPU classes only)"
        for i in plan.instances
        if i.device != "cuda"
    ]
    if not gpu_instances:
        raise K8sError(f"{target.product}: the plan has no GPU instance ({plan.profile})")
    if plan.nodes > 1:
        return [_group(target, inputs, plan, gpu_instances, sets, port, render, skipped)]
    shapes: dict[tuple[Any, ...], list[InstancePlan]] = {}
    for inst in gpu_instances:
        shapes.setdefault(_shape(inst), []).append(inst)
    out = []
    for insts in shapes.values():
        inst = insts[0]
        name = base if len(shapes) == 1 else k8s_name(base, f"tp{inst.tensor_parallel_size}x{len(inst.gpus)}")
        out.append(_shape_workload(name, target, inputs, plan, insts, sets, port, render, skipped))
    return out


def _shape_workload(
    name: str,
    target: Target,
    inputs: PlanInputs,
    plan: Plan,
    insts: list[InstancePlan],
    sets: list[str],
    port: int,
    render: Callable[[Plan, InstancePlan], Rendered],
    skipped: list[str],
) -> Workload:
    """The workload of one instance shape (its instances become replicas): the shape re-planned as
    its pod sees it (its GPUs only, the shape pinned by ``--set``), rendered, and checked the same."""
    inst = insts[0]
    pins = _pins(inst, port, 1, int(plan.watch.metrics_port) or METRICS_PORT)
    pod_inputs = dataclasses.replace(
        inputs,
        host=pod_view(inputs.host, inst.gpus),
        config_root=POD_ROOT,
        profile=plan.profile,
        overrides=(),
        sets=(*sets, *pins),
        nodes=(),
        addresses=(),
        node_rank=0,
    )
    pod_plan = pod_inputs.whole_plan()
    pod_inst = pod_plan.instances[0]
    warnings = list(skipped)
    if len(pod_plan.instances) != 1:
        raise K8sError(f"{name}: the pod's plan has {len(pod_plan.instances)} instances, not one")
    warnings += [f"{name}: {d}" for d in _same(inst, pod_inst)]
    return Workload(
        name=name,
        target=target,
        plan=plan,
        pod_plans=[pod_plan],
        pod_inputs=pod_inputs,
        rendered=[render(pod_plan, pod_inst)],
        replicas=len(insts) * target.node_count,
        sets=[*sets, *pins],
        warnings=warnings,
    )


def _group(
    target: Target,
    inputs: PlanInputs,
    plan: Plan,
    insts: list[InstancePlan],
    sets: list[str],
    port: int,
    render: Callable[[Plan, InstancePlan], Rendered],
    skipped: list[str],
) -> Workload:
    """A model over several nodes: one LeaderWorkerSet group, node k = worker index k."""
    nnodes = plan.nodes
    by_node = {i.node: i for i in insts}
    if sorted(by_node) != list(range(nnodes)) or len(insts) != nnodes:
        raise K8sError(
            f"{target.product}: a group over {nnodes} nodes with {len(insts)} instances: "
            "a LeaderWorkerSet runs one pod per node"
        )
    if len({len(i.gpus) for i in insts}) != 1:
        raise K8sError(
            f"{target.product}: the group's nodes use different GPU counts "
            f"({', '.join(str(len(i.gpus)) for i in insts)}): a LeaderWorkerSet's workers share one pod template"
        )
    name = group_name(target.product, target.variant)
    hosts = (inputs.host, *inputs.nodes)
    views = tuple(pod_view(hosts[k], by_node[k].gpus) for k in range(nnodes))
    pins = _pins(insts[0], port, nnodes, int(plan.watch.metrics_port) or METRICS_PORT)
    pod_inputs = dataclasses.replace(
        inputs,
        host=views[0],
        config_root=POD_ROOT,
        profile=plan.profile,
        overrides=(),
        sets=(*sets, *pins),
        nodes=views[1:],
        addresses=tuple(lws_address(name, k) for k in range(nnodes)),
        node_rank=0,
    )
    whole = pod_inputs.whole_plan()
    if whole.nodes != nnodes:
        raise K8sError(f"{name}: the pods plan {whole.nodes} node(s), the hosts {nnodes}")
    pod_plans = [whole.for_node(k) for k in range(nnodes)]
    rendered = [render(whole, p.instances[0]) for p in pod_plans]
    warnings = list(skipped)
    for k in range(nnodes):
        warnings += [f"{name} node {k}: {d}" for d in _same(by_node[k], pod_plans[k].instances[0])]
    return Workload(
        name=name,
        target=target,
        plan=plan,
        pod_plans=pod_plans,
        pod_inputs=pod_inputs,
        rendered=rendered,
        replicas=1,
        sets=[*sets, *pins],
        warnings=warnings,
    )


def snapshot_target(inputs: PlanInputs) -> Target:
    """The one GPU class of a host snapshot (``--from``), selected by the product label GFD gives
    its GPUs."""
    gpus = inputs.host.usable_gpus
    names = sorted({g.name or "?" for g in gpus})
    if not gpus:
        raise K8sError("the snapshot has no GPU: Kubernetes manifests are rendered for GPU classes")
    if len(names) > 1:
        raise K8sError(
            f"the snapshot has several GPU models ({', '.join(names)}): render one class at a time "
            "or a cluster's nodes with --nodes"
        )
    product = gfd_product(names[0])
    if product is None:
        raise K8sError(f"GPU name {names[0]!r} gives no valid nvidia.com/gpu.product label value")
    return Target(product, {"nvidia.com/gpu.product": product}, (), 1, inputs)
