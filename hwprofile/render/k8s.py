"""``render --format k8s``: Kubernetes manifests for the plan of each GPU class.

One workload per GPU class and instance shape: a Deployment whose pods each run one planned
instance (``replicas`` = how many such instances the class's nodes hold), or, for a model larger than
one node, a LeaderWorkerSet group (leader = node 0 with the API server, workers = headless ranks).
Each comes with a ConfigMap (the pod's snapshot, the vLLM command line, the pod's plan), a Service
and a PodMonitor. The container runs ``hwprofile daemon`` (the image's entrypoint, see
``Containerfile``: PID 1, the thermal policy in the pod) from the pod's snapshot in the ConfigMap, with
the plan's inputs (model, profile, the user's settings as ``--set``) and the settings that make the
pod's plan the one shown (``server.host``, the layout) and make it a pod's (the metrics port on the
pod's address, vLLM's lines on stdout, ``watch.unready_s`` = the readiness probe's period times its
failure threshold); vLLM is its child. The probes ask the daemon's metrics port: ``/health`` (ready
while every instance serves, 503 first when a degrade is about to drain) and ``/livez``.

Everything is built as Python data and dumped with ``yaml.safe_dump``: a value from a label, a
node name or a setting is always a quoted scalar, never YAML syntax. Comments (what was assumed,
the warnings) go through :func:`.output.label` (one line each, control characters escaped).
The decisions (sizes, probes, grace periods) are made here; nothing is computed in a template.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import re
import shlex
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

from ..errors import RefusedError
from ..kubenodes import gfd_product, pod_view, valid_label_value
from ..pipeline import PlanInputs, resolve_settings
from ..plan.nodes import USER_LAYERS
from ..plan.types import InstancePlan, Plan
from .output import label
from .translate import Rendered, render_instance
from .versions import Release, parse_version

GiB, MiB = 2**30, 2**20
# Where the pod keeps what it writes: the root filesystem is read-only.
POD_ROOT = "/etc/hwprofile/k8s"  # the ConfigMap; also the pod's --config-root (no profiles/ in it)
RUNTIME_DIR = "/run/hwprofile"
STATE_DIR = "/var/lib/hwprofile"  # the daemon's last good plan (it outlives a container restart)
LOG_DIR = "/var/log/hwprofile"
CACHE_DIR = "/cache"
PRESTOP_S = 5  # the Service stops sending before vLLM stops accepting (endpoints propagate)
PROBE_PERIOD_S = 10
READY_PERIOD_S, READY_FAILURES = 5, 2  # the readiness probe; watch.unready_s is their product
METRICS_PORT = 9464  # the daemon's port when the plan turned it off (the probes need it)
API_KEY_ITEM = "api-key"  # the key of the API key in its Secret
HF_TOKEN_SECRET = "hf-token"  # optional Secret with key `token`, for gated models
LWS_INDEX_LABEL = "leaderworkerset.sigs.k8s.io/worker-index"
# What a first start is assumed to read (the weights from the Hugging Face hub into the pod's empty
# cache): a conservative rate, and the engine's own start (CUDA graphs, compile) on top.
ASSUMED_DOWNLOAD_BYTES_S = 200e6
ASSUMED_ENGINE_START_S = 180
# Kubernetes object names here end up in pod host names (<name>-0-1): a DNS label, 63 at most.
MAX_NAME = 40
# These settings are how the pod differs from the host the plan was made for: pinned, not the user's.
POD_KEYS = ("server.host", "server.port", "layout.numa_bind", "logs.dir", "layout.tensor_parallel_size",
            "layout.pipeline_parallel_size", "layout.replicas", "layout.shape", "layout.nodes",
            "watch.metrics_host", "watch.metrics_port", "watch.unready_s", "logs.stdout")  # fmt: skip


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


class Options(NamedTuple):
    release: Release
    image: str | None = None  # default: hwprofile-vllm:v<release>, as Containerfile builds it
    namespace: str | None = None
    api_key_secret: str = "hwprofile-api-key"


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


def image_of(opts: Options) -> str:
    if opts.image:
        return opts.image
    major, minor, patch = parse_version(opts.release.target)
    return f"hwprofile-vllm:v{major}.{minor}.{patch}"  # podman build -t hwprofile-vllm:vX.Y.Z -f Containerfile .


def k8s_name(*parts: str) -> str:
    """A DNS label from ``parts`` (lower case, dashes), at most :data:`MAX_NAME` characters; a long
    one keeps a hash of the whole so two long names stay apart."""
    text = "-".join(p for p in parts if p)
    slug = re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-") or "vllm"
    if len(slug) > MAX_NAME:
        digest = hashlib.sha256(text.encode()).hexdigest()[:6]
        slug = slug[: MAX_NAME - 7].rstrip("-") + "-" + digest
    return slug


def set_value(value: Any) -> str:
    """``value`` as ``--set`` reads it back (YAML scalar or JSON flow), exactly."""
    from ..config.layers import _scalar

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
    res = resolve_settings(inputs.host, inputs.config_root, inputs.profile, list(inputs.overrides),
                           list(inputs.sets))  # fmt: skip
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
    return (inst.device, len(inst.gpus), inst.gpu_name, inst.tensor_parallel_size,
            inst.pipeline_parallel_size, inst.ranks)  # fmt: skip


def _pins(inst: InstancePlan, port: int, nnodes: int, metrics_port: int) -> list[str]:
    pins = ["server.host=0.0.0.0", f"server.port={port}", "layout.numa_bind=false", f"logs.dir={LOG_DIR}",
            f"layout.tensor_parallel_size={inst.tensor_parallel_size}",
            f"layout.pipeline_parallel_size={inst.pipeline_parallel_size}"]  # fmt: skip
    # the daemon's port on the pod's address (probes, PodMonitor), vLLM's lines for `kubectl logs`, and
    # /health 503 for as long as the readiness probe takes to see it before a restart drains
    pins += ["watch.metrics_host=0.0.0.0", f"watch.metrics_port={metrics_port}", "logs.stdout=true",
             f"watch.unready_s={READY_PERIOD_S * READY_FAILURES}"]  # fmt: skip
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


def group_name(product: str) -> str:
    return k8s_name("vllm", product, "group")


def lws_address(name: str, rank: int) -> str:
    """Node ``rank``'s pod of group 0 of LeaderWorkerSet ``name``, through its headless Service."""
    return f"{name}-0.{name}" if rank == 0 else f"{name}-0-{rank}.{name}"


def plan_workloads(
    target: Target, opts: Options, render: Callable[[Plan, InstancePlan], Rendered] | None = None
) -> list[Workload]:
    """The workloads of one GPU class: its plan (over several of its nodes when one is too small),
    each instance shape re-planned as its pod sees it, rendered for the release."""
    from ..plan import PlanRefused

    rel = opts.release
    if render is None:
        def render(p: Plan, i: InstancePlan) -> Rendered:
            return render_instance(p, i, rel, i.server.vllm_command or "vllm", None)

    inputs = target.inputs
    base = k8s_name("vllm", target.product)
    try:
        plan = inputs.whole_plan()
    except PlanRefused:
        if target.node_count < 2 or inputs.nodes:
            raise
        name = group_name(target.product)
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
    skipped = [f"{i.name}: a CPU instance: no Kubernetes workload (GPU classes only)"
               for i in plan.instances if i.device != "cuda"]  # fmt: skip
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
        pins = _pins(inst, port, 1, int(plan.watch.metrics_port) or METRICS_PORT)
        pod_inputs = dataclasses.replace(
            inputs, host=pod_view(inputs.host, inst.gpus), config_root=POD_ROOT, profile=plan.profile,
            overrides=(), sets=(*sets, *pins), nodes=(), addresses=(), node_rank=0,
        )  # fmt: skip
        pod_plan = pod_inputs.whole_plan()
        pod_inst = pod_plan.instances[0]
        warnings = list(skipped)
        if len(pod_plan.instances) != 1:
            raise K8sError(f"{name}: the pod's plan has {len(pod_plan.instances)} instances, not one")
        warnings += [f"{name}: {d}" for d in _same(inst, pod_inst)]
        out.append(Workload(
            name=name, target=target, plan=plan, pod_plans=[pod_plan], pod_inputs=pod_inputs,
            rendered=[render(pod_plan, pod_inst)], replicas=len(insts) * target.node_count,
            sets=[*sets, *pins], warnings=warnings,
        ))  # fmt: skip
    return out


def _group(
    target: Target, inputs: PlanInputs, plan: Plan, insts: list[InstancePlan], sets: list[str], port: int,
    render: Callable[[Plan, InstancePlan], Rendered], skipped: list[str],
) -> Workload:
    """A model over several nodes: one LeaderWorkerSet group, node k = worker index k."""  # fmt: skip
    nnodes = plan.nodes
    by_node = {i.node: i for i in insts}
    if sorted(by_node) != list(range(nnodes)) or len(insts) != nnodes:
        raise K8sError(f"{target.product}: a group over {nnodes} nodes with {len(insts)} instances: "
                       "a LeaderWorkerSet runs one pod per node")  # fmt: skip
    if len({len(i.gpus) for i in insts}) != 1:
        raise K8sError(f"{target.product}: the group's nodes use different GPU counts "
                       f"({', '.join(str(len(i.gpus)) for i in insts)}): a LeaderWorkerSet's workers share one pod template")  # fmt: skip
    name = group_name(target.product)
    hosts = (inputs.host, *inputs.nodes)
    views = tuple(pod_view(hosts[k], by_node[k].gpus) for k in range(nnodes))
    pins = _pins(insts[0], port, nnodes, int(plan.watch.metrics_port) or METRICS_PORT)
    pod_inputs = dataclasses.replace(
        inputs, host=views[0], config_root=POD_ROOT, profile=plan.profile, overrides=(), sets=(*sets, *pins),
        nodes=views[1:], addresses=tuple(lws_address(name, k) for k in range(nnodes)), node_rank=0,
    )  # fmt: skip
    whole = pod_inputs.whole_plan()
    if whole.nodes != nnodes:
        raise K8sError(f"{name}: the pods plan {whole.nodes} node(s), the hosts {nnodes}")
    pod_plans = [whole.for_node(k) for k in range(nnodes)]
    rendered = [render(whole, p.instances[0]) for p in pod_plans]
    warnings = list(skipped)
    for k in range(nnodes):
        warnings += [f"{name} node {k}: {d}" for d in _same(by_node[k], pod_plans[k].instances[0])]
    return Workload(name=name, target=target, plan=plan, pod_plans=pod_plans, pod_inputs=pod_inputs,
                    rendered=rendered, replicas=1, sets=[*sets, *pins], warnings=warnings)  # fmt: skip


# -- sizes -----------------------------------------------------------------------------------------


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


def sizes(w: Workload, rank: int = 0) -> Sizes:
    plan, pod = w.pod_plans[rank], w.pod_plans[rank].instances[0]
    r = w.rendered[rank]
    gpus = len(pod.gpus)
    weights = int(plan.model.weights_bytes or 0) + int((plan.draft.weights_bytes or 0) if plan.draft else 0)
    host = w.target.inputs.host
    per_node = sum(1 for i in w.plan.instances if i.device == "cuda" and i.node == 0) or 1
    share = (host.cpu.logical_cpus or 0) // per_node
    cpu = max(2, min(4 + 2 * gpus, share) if share else 4 + 2 * gpus)
    shm = (1 + gpus) * GiB if gpus > 1 else 2 * GiB
    memory = 8 * GiB + 2 * GiB * gpus + shm  # API server, engine core, one worker per GPU; /dev/shm counts too
    load_s = math.ceil(plan.supervise.ready_timeout)
    estimate_s = int(weights / ASSUMED_DOWNLOAD_BYTES_S) + ASSUMED_ENGINE_START_S
    drain = int(pod.server.shutdown_timeout)
    grace = PRESTOP_S + int(r.stop_timeout_s) + math.ceil(plan.supervise.stop_margin)
    unhealthy = plan.supervise.unhealthy_s + plan.supervise.ready_timeout + plan.supervise.backoff_max
    return Sizes(
        gpus=gpus, cpu=cpu, memory=memory, shm=shm, cache=int(weights * 1.1) + 10 * GiB, tmp=8 * GiB,
        logs=int(plan.logs.max_bytes) + 64 * MiB, load_s=load_s, estimate_s=estimate_s,
        startup_failures=math.ceil((load_s + 30) / PROBE_PERIOD_S),
        liveness_failures=math.ceil(unhealthy / PROBE_PERIOD_S), grace_s=grace, drain_s=drain,
        progress_deadline_s=load_s + 300,
    )  # fmt: skip


# -- the manifests ---------------------------------------------------------------------------------


def _labels(w: Workload) -> dict[str, str]:
    return {
        "app.kubernetes.io/name": "vllm",
        "app.kubernetes.io/instance": w.name,
        "app.kubernetes.io/managed-by": "hwprofile",
    }


def _meta(w: Workload, name: str, opts: Options, annotations: dict[str, str] | None = None) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name}
    if opts.namespace:
        meta["namespace"] = opts.namespace
    meta["labels"] = _labels(w)
    if annotations:
        meta["annotations"] = annotations
    return meta


def _shell(r: Rendered) -> str:
    env = [f"{k}={shlex.quote(v)}" for k, v in r.env.items()]
    return " ".join([*env, shlex.join(r.argv)])


def config_data(w: Workload) -> dict[str, str]:
    """The ConfigMap: the pods' snapshots (and a group's inventory), the vLLM command lines, the plans."""
    data: dict[str, str] = {}
    n = len(w.pod_plans)
    hosts = [w.pod_inputs.host, *w.pod_inputs.nodes]
    if n == 1:
        data["pod.json"] = hosts[0].to_json() + "\n"
    else:
        inventory = {"nodes": [{"snapshot": f"node{k}.json", "address": w.pod_inputs.addresses[k]}
                               for k in range(n)]}  # fmt: skip
        data["inventory.yaml"] = json.dumps(inventory, indent=1) + "\n"  # JSON is YAML
        for k in range(n):
            data[f"node{k}.json"] = hosts[k].to_json() + "\n"
    for k, r in enumerate(w.rendered):
        suffix = "" if n == 1 else f"-node{k}"
        data[f"vllm{suffix}.argv.json"] = json.dumps(r.argv) + "\n"
        data[f"vllm{suffix}.env.json"] = json.dumps({**r.env, **{t: f"${s}" for t, s in r.secrets.items()}},
                                                    indent=1) + "\n"  # fmt: skip
        data[f"vllm{suffix}.sh"] = _shell(r) + "\n"
    data["plan.json"] = json.dumps(w.pod_plans[0].to_json() if n == 1 else
                                   [p.to_json() for p in w.pod_plans], indent=1) + "\n"  # fmt: skip
    return data


def _launch_args(w: Workload, rank: int | None) -> list[str]:
    plan = w.pod_plans[0]
    model = plan.model.path if plan.model.source == "dir" and plan.model.path else plan.model.name
    args = ["daemon", "--config-root", POD_ROOT, "--runtime-dir", RUNTIME_DIR, "--state-dir", STATE_DIR]
    if len(w.pod_plans) == 1:
        args += ["--from", f"{POD_ROOT}/pod.json"]
    else:
        args += ["--inventory", f"{POD_ROOT}/inventory.yaml", "--node-rank",
                 "0" if rank == 0 else "$(HWPROFILE_NODE_RANK)"]  # fmt: skip
    args += ["--model", model, "--profile", plan.profile]
    if plan.draft is not None and w.pod_inputs.draft:
        args += ["--draft", w.pod_inputs.draft]
    for s in w.sets:
        args += ["--set", s]
    return args


def _probe(path: str, period: int, failures: int) -> dict[str, Any]:
    """A probe of the daemon's metrics port (``/health``: every instance serves and none is about to
    be drained; ``/livez``: the daemon's loop ticks)."""
    return {"httpGet": {"path": path, "port": "hwprofile"}, "periodSeconds": period, "timeoutSeconds": 5,
            "failureThreshold": failures}  # fmt: skip


def pod_spec(w: Workload, opts: Options, rank: int | None) -> dict[str, Any]:
    """The pod of node ``rank`` (None: every worker of a group; 0 also for a Deployment)."""
    k = rank if rank is not None else 1
    s = sizes(w, k)
    r = w.rendered[k]
    pod = w.pod_plans[k].instances[0]
    headless = pod.headless
    env: list[dict[str, Any]] = [
        {"name": "HOME", "value": "/tmp"},
        {"name": "XDG_CACHE_HOME", "value": CACHE_DIR},
        {"name": "XDG_CONFIG_HOME", "value": "/tmp/.config"},
        {"name": "HF_HOME", "value": f"{CACHE_DIR}/huggingface"},
        {"name": "VLLM_CACHE_ROOT", "value": f"{CACHE_DIR}/vllm"},
        {"name": "PYTHONDONTWRITEBYTECODE", "value": "1"},
        {"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {"name": HF_TOKEN_SECRET, "key": "token", "optional": True}}},
    ]
    for source in sorted(set(r.secrets.values())):
        env.append({"name": source, "valueFrom": {"secretKeyRef": {"name": opts.api_key_secret,
                                                                    "key": API_KEY_ITEM}}})  # fmt: skip
    if rank is None:
        env.append({"name": "HWPROFILE_NODE_RANK",
                    "valueFrom": {"fieldRef": {"fieldPath": f"metadata.labels['{LWS_INDEX_LABEL}']"}}})  # fmt: skip
    ports: list[dict[str, Any]] = []
    if not headless:
        ports.append({"name": "http", "containerPort": int(pod.server.port), "protocol": "TCP"})
    metrics_port = int(w.pod_plans[k].watch.metrics_port)
    if metrics_port:
        ports.append({"name": "hwprofile", "containerPort": metrics_port, "protocol": "TCP"})
    container: dict[str, Any] = {
        "name": "vllm",
        "image": image_of(opts),
        "imagePullPolicy": "IfNotPresent",
        "command": ["hwprofile"],
        "args": _launch_args(w, rank),
        "env": env,
        "resources": {
            "requests": {"cpu": str(s.cpu), "memory": quantity(s.memory), "nvidia.com/gpu": str(s.gpus)},
            "limits": {"nvidia.com/gpu": str(s.gpus)},
        },
        "volumeMounts": [
            {"name": "shm", "mountPath": "/dev/shm"},
            {"name": "tmp", "mountPath": "/tmp"},
            {"name": "cache", "mountPath": CACHE_DIR},
            {"name": "runtime", "mountPath": RUNTIME_DIR},
            {"name": "state", "mountPath": STATE_DIR},
            {"name": "logs", "mountPath": LOG_DIR},
            {"name": "plan", "mountPath": POD_ROOT, "readOnly": True},
        ],
        "lifecycle": {"preStop": {"exec": {"command": ["sleep", str(PRESTOP_S)]}}},
        "securityContext": {
            "allowPrivilegeEscalation": False,
            "privileged": False,
            "readOnlyRootFilesystem": True,
            "runAsNonRoot": True,
            "capabilities": {"drop": ["ALL"]},
        },
    }
    if ports:
        container["ports"] = ports
    if not headless:
        container["startupProbe"] = _probe("/health", PROBE_PERIOD_S, s.startup_failures)
        container["readinessProbe"] = _probe("/health", READY_PERIOD_S, READY_FAILURES)
    # the daemon restarts vLLM itself (failures, degrades): the kubelet restarts the container only when
    # the daemon's own loop stops ticking (a headless rank's daemon too)
    container["livenessProbe"] = _probe("/livez", PROBE_PERIOD_S, s.liveness_failures)
    return {
        "nodeSelector": dict(w.target.selector),
        "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
        "automountServiceAccountToken": False,
        "enableServiceLinks": False,  # a Service called vllm would set VLLM_PORT=tcp://..., which vLLM reads
        "terminationGracePeriodSeconds": s.grace_s,
        "securityContext": {
            "runAsNonRoot": True,
            "runAsUser": 1000,
            "runAsGroup": 1000,
            "fsGroup": 1000,
            "seccompProfile": {"type": "RuntimeDefault"},
        },
        "containers": [container],
        "volumes": [
            {"name": "shm", "emptyDir": {"medium": "Memory", "sizeLimit": quantity(s.shm)}},
            {"name": "tmp", "emptyDir": {"sizeLimit": quantity(s.tmp)}},
            {"name": "cache", "emptyDir": {"sizeLimit": quantity(s.cache)}},
            {"name": "runtime", "emptyDir": {"medium": "Memory", "sizeLimit": "64Mi"}},
            {"name": "state", "emptyDir": {"sizeLimit": "16Mi"}},
            {"name": "logs", "emptyDir": {"sizeLimit": quantity(s.logs)}},
            {"name": "plan", "configMap": {"name": f"{w.name}-plan"}},
        ],
    }


def _digest(data: dict[str, str], image: str, args: Sequence[str]) -> str:
    h = hashlib.sha256(json.dumps([data, image, list(args)], sort_keys=True).encode())
    return h.hexdigest()


def manifests(w: Workload, opts: Options) -> list[tuple[list[str], dict[str, Any]]]:
    """``[(comment lines, manifest), ...]`` of one workload."""
    data = config_data(w)
    labels = _labels(w)
    group = len(w.pod_plans) > 1
    args_note = (
        shlex.join(w.rendered[0].argv) if not group
        else f"node 0: {shlex.join(w.rendered[0].argv)} (the workers: vllm-node<k>.sh in ConfigMap {w.name}-plan)"
    )  # fmt: skip
    annotations = {
        "hwprofile.io/vllm-args": args_note,
        "hwprofile.io/vllm-release": w.rendered[0].vllm_version,
        "hwprofile.io/profile": w.pod_plans[0].profile,
        "hwprofile.io/gpu-class": w.target.product,
    }
    if w.target.nodes:
        annotations["hwprofile.io/nodes"] = ",".join(w.target.nodes)
    digest = _digest(data, image_of(opts), _launch_args(w, 0))
    template_meta = {"labels": labels, "annotations": {**annotations, "hwprofile.io/plan-sha256": digest}}
    s = sizes(w)
    out: list[tuple[list[str], dict[str, Any]]] = []
    out.append(([f"{w.name}: the pod's snapshot, the vLLM command line it runs, its plan"], {
        "apiVersion": "v1", "kind": "ConfigMap", "metadata": _meta(w, f"{w.name}-plan", opts), "data": data,
    }))  # fmt: skip
    if not group:
        out.append((_workload_comments(w, s), {
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": _meta(w, w.name, opts, annotations),
            "spec": {
                "replicas": w.replicas,
                "selector": {"matchLabels": labels},
                # no surge: a new pod needs GPUs an old one still holds
                "strategy": {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 0, "maxUnavailable": 1}},
                "progressDeadlineSeconds": s.progress_deadline_s,
                "template": {"metadata": template_meta, "spec": pod_spec(w, opts, 0)},
            },
        }))  # fmt: skip
        selector = dict(labels)
    else:
        leader = {"labels": {**labels, "hwprofile.io/role": "leader"}, "annotations": template_meta["annotations"]}
        worker = {"labels": {**labels, "hwprofile.io/role": "worker"}, "annotations": template_meta["annotations"]}
        out.append((_workload_comments(w, s), {
            "apiVersion": "leaderworkerset.x-k8s.io/v1",
            "kind": "LeaderWorkerSet",
            "metadata": _meta(w, w.name, opts, annotations),
            "spec": {
                "replicas": 1,  # the inventory names group 0's pods
                "startupPolicy": "LeaderCreated",
                "leaderWorkerTemplate": {
                    "size": len(w.pod_plans),
                    "restartPolicy": "RecreateGroupOnPodRestart",  # one node lost: the group re-forms
                    "leaderTemplate": {"metadata": leader, "spec": pod_spec(w, opts, 0)},
                    "workerTemplate": {"metadata": worker, "spec": pod_spec(w, opts, None)},
                },
            },
        }))  # fmt: skip
        selector = {**labels, "hwprofile.io/role": "leader"}
    port = int(w.pod_plans[0].instances[0].server.port)
    out.append(([f"{w.name}: the API server (node 0 of a group)"], {
        "apiVersion": "v1", "kind": "Service", "metadata": _meta(w, w.name, opts),
        "spec": {"type": "ClusterIP", "selector": selector,
                 "ports": [{"name": "http", "port": port, "targetPort": "http", "protocol": "TCP"}]},
    }))  # fmt: skip
    def relabel(job: str) -> list[dict[str, Any]]:
        """The labels monitoring/rules and the dashboard group by: ``job`` as in
        monitoring/prometheus.yml (a PodMonitor's own would be <namespace>/<name>), ``host`` = the node."""
        return [{"targetLabel": "job", "replacement": job},
                {"sourceLabels": ["__meta_kubernetes_pod_node_name"], "targetLabel": "host"}]  # fmt: skip

    endpoints: list[dict[str, Any]] = [
        {"port": "http", "path": "/metrics", "interval": "15s", "relabelings": relabel("vllm")}
    ]
    comments = [f"{w.name}: vLLM's /metrics on the http port (every pod with an API server); job and host "
                "labelled as monitoring/prometheus.yml does, for monitoring/rules and the dashboard"]  # fmt: skip
    if int(w.pod_plans[0].watch.metrics_port):
        endpoints.append({"port": "hwprofile", "path": "/metrics", "interval": "15s", "relabelings": relabel("hwprofile")})
        comments.append(
            f"and hwprofile's exporter (watch.metrics_port {int(w.pod_plans[0].watch.metrics_port)}, on the "
            "pod's address: watch.metrics_host=0.0.0.0)"
        )
    out.append((comments, {
        "apiVersion": "monitoring.coreos.com/v1", "kind": "PodMonitor", "metadata": _meta(w, w.name, opts),
        "spec": {"selector": {"matchLabels": dict(labels)}, "podMetricsEndpoints": endpoints},
    }))  # fmt: skip
    return out


def _workload_comments(w: Workload, s: Sizes) -> list[str]:
    pod = w.pod_plans[0].instances[0]
    e = pod.engine
    kind = "LeaderWorkerSet group" if len(w.pod_plans) > 1 else f"Deployment of {w.replicas} pod(s)"
    where = f"{len(w.target.nodes)} node(s): {', '.join(w.target.nodes)}" if w.target.nodes else "from a snapshot"
    lines = [
        f"{w.name}: {kind} on {w.target.product} ({where}); profile {w.pod_plans[0].profile}, "
        f"model {w.pod_plans[0].model.name}",
        f"each pod: {s.gpus} GPU(s), tensor parallel {pod.tensor_parallel_size}, pipeline parallel "
        f"{pod.pipeline_parallel_size}, max_num_seqs {e.max_num_seqs}, max_model_len {e.max_model_len}",
        f"startup: {s.startup_failures} x {PROBE_PERIOD_S} s >= the planned load time {s.load_s} s "
        f"(supervise.ready_timeout) + 30 s; a first start's download and engine start at "
        f"{ASSUMED_DOWNLOAD_BYTES_S / 1e6:.0f} MB/s: about {s.estimate_s} s",
        f"stop: preStop {PRESTOP_S} s, then SIGTERM; vLLM drains {s.drain_s} s (server.shutdown_timeout); "
        f"terminationGracePeriodSeconds {s.grace_s}",
        f"liveness: the daemon's loop (/livez), {s.liveness_failures} x {PROBE_PERIOD_S} s, longer than the "
        "supervisor's own restart of a hung vLLM (supervise.unhealthy_s + supervise.ready_timeout + supervise.backoff_max)",
        f"readiness: the daemon's /health every {READY_PERIOD_S} s; it answers 503 for watch.unready_s "
        f"({READY_PERIOD_S * READY_FAILURES} s) before a degrade drains vLLM, so the Service routes elsewhere first",
        "runAsNonRoot: vLLM needs no root; the official image's default user is root, so UID 1000 is set "
        f"and everything written goes to emptyDirs (/tmp, {CACHE_DIR}, {RUNTIME_DIR}, {STATE_DIR}, {LOG_DIR}, /dev/shm)",
        "the image is the repository's Containerfile (hwprofile on the official vLLM image, the daemon as PID 1); "
        f"{CACHE_DIR} is an emptyDir: a PersistentVolumeClaim keeps the weights across restarts",
    ]
    if s.estimate_s > s.load_s:
        lines.append(f"warning: the estimated first start ({s.estimate_s} s) is longer than supervise.ready_timeout "
                     f"({s.load_s} s): raise it (--set supervise.ready_timeout=...) or cache the weights")  # fmt: skip
    if not w.rendered[0].secrets:
        lines.append("no API key (server.api_key_env unset): the server answers anyone who reaches the Service")
    if len(w.pod_plans) > 1:
        lines.append(f"a headless rank (worker) serves no HTTP: no probes; restartPolicy re-forms the group "
                     f"when a pod restarts; node k is {lws_address(w.name, 1).replace('-0-1.', '-0-<k>.')}, "
                     f"node 0 {w.pod_inputs.addresses[0]} (LeaderWorkerSet's headless Service)")  # fmt: skip
    model = w.pod_plans[0].model
    if model.source == "dir":
        lines.append(f"the model is a directory on the planning host ({model.path}): mount it into the pod "
                     "at that path (a volume of yours), or pass --model with a Hugging Face name")  # fmt: skip
    lines += [f"assumed: {a}" for a in w.target.assumed]
    lines += [f"warning: {x}" for x in w.warnings]
    for r in w.rendered:
        lines += [f"vLLM {r.vllm_version}: {x}" for x in r.warnings]
    return lines


def _dumper() -> type:
    import yaml

    class Dumper(yaml.SafeDumper):
        """safe_dump without anchors and aliases (each manifest spelled out), and the ConfigMap's
        files as literal blocks where YAML can say them so (else quoted, as safe_dump would)."""

        def ignore_aliases(self, data: Any) -> bool:
            return True

    def text(dumper: yaml.SafeDumper, value: str) -> yaml.ScalarNode:
        style = "|" if "\n" in value else None  # PyYAML falls back to quotes where | cannot say it
        return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)

    Dumper.add_representer(str, text)
    return Dumper


def dump(docs: list[tuple[list[str], dict[str, Any]]], header: list[str]) -> str:
    """The manifests as one YAML stream: comments escaped to one line each, documents by the safe
    dumper (every value a scalar YAML quotes as it must)."""
    import yaml

    dumper = _dumper()
    parts = ["".join(f"# {label(line)}\n" for line in header)]
    for comments, doc in docs:
        text = yaml.dump(doc, Dumper=dumper, sort_keys=False, default_flow_style=False, width=1000,
                         allow_unicode=False)  # fmt: skip
        parts.append("---\n" + "".join(f"# {label(c)}\n" for c in comments) + text)
    out = "".join(parts)
    if list(yaml.safe_load_all(out)) != [d for _, d in docs]:  # never: safe_dump quotes what it must
        raise K8sError("the manifests do not read back as they were built")
    return out


def render_k8s(targets: Sequence[Target], opts: Options, header: Sequence[str] = ()) -> tuple[str, list[str]]:
    """The YAML stream of every target's workloads, and the warnings to print."""
    from ..plan import PlanRefused

    workloads: list[Workload] = []
    left_out: list[str] = []
    for t in targets:
        if not valid_label_value(t.product):
            raise K8sError(f"nvidia.com/gpu.product {t.product!r} is not a valid label value")
        try:
            workloads += plan_workloads(t, opts)
        except (PlanRefused, RefusedError) as e:  # K8sError and translate's Unrenderable too
            if len(targets) == 1:
                raise
            why = str(e).strip().split("\n")[0]
            left_out.append(f"{t.product} ({len(t.nodes)} node(s)): no workload: {why}")
    if not workloads:
        raise K8sError("no GPU class could be planned: " + "; ".join(left_out))
    names = [w.name for w in workloads]
    dup = sorted({n for n in names if names.count(n) > 1})
    if dup:
        raise K8sError(f"two workloads would be called {', '.join(dup)}")
    docs = [d for w in workloads for d in manifests(w, opts)]
    lines = [
        f"hwprofile render --format k8s: {len(workloads)} workload(s), {len(docs)} manifests, "
        f"vLLM {opts.release.target}, image {image_of(opts)}",
        *header,
        *left_out,
    ]
    warnings = left_out + [x for w in workloads for x in w.warnings] + [
        f"{w.name}: {x}" for w in workloads for r in w.rendered for x in r.warnings
    ]
    return dump(docs, lines), warnings


def snapshot_target(inputs: PlanInputs) -> Target:
    """The one GPU class of a host snapshot (``--from``), selected by the product label GFD gives
    its GPUs."""
    gpus = inputs.host.usable_gpus
    names = sorted({g.name or "?" for g in gpus})
    if not gpus:
        raise K8sError("the snapshot has no GPU: Kubernetes manifests are rendered for GPU classes")
    if len(names) > 1:
        raise K8sError(f"the snapshot has several GPU models ({', '.join(names)}): render one class at a time "
                       "or a cluster's nodes with --nodes")  # fmt: skip
    product = gfd_product(names[0])
    if product is None:
        raise K8sError(f"GPU name {names[0]!r} gives no valid nvidia.com/gpu.product label value")
    return Target(product, {"nvidia.com/gpu.product": product}, (), 1, inputs)


__all__ = ["K8sError", "Options", "Target", "Workload", "render_k8s", "snapshot_target"]
