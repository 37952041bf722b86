"""The manifests of a workload, built as Python data and dumped with ``yaml.safe_dump``: the
ConfigMap (the pod's snapshot, the vLLM command line, the pod's plan), the Deployment or
LeaderWorkerSet, the Service and the PodMonitor. A value from a label, a node name or a setting is
always a quoted scalar, never YAML syntax; comments go through :func:`hwprofile.render.output.label`
(one line each, control characters escaped). Every number decided per plan (resources, probes, grace
periods) comes from :mod:`.sizes`; what is fixed here (a probe's 5 s timeout, the small emptyDirs,
the scrape interval, the pod's user) is the same for every pod."""

from __future__ import annotations

import hashlib
import json
import shlex
from collections.abc import Sequence
from typing import Any

from ...errors import RefusedError
from ...release import parse_version
from ..output import label
from ..translate import Rendered
from .nodes import valid_label_value
from .sizes import (
    ASSUMED_DOWNLOAD_BYTES_S,
    PRESTOP_S,
    PROBE_PERIOD_S,
    READY_FAILURES,
    READY_PERIOD_S,
    Sizes,
    quantity,
    sizes,
)
from .workloads import LOG_DIR, POD_ROOT, K8sError, Options, Target, Workload, lws_address, plan_workloads

# Where the pod keeps what it writes: the root filesystem is read-only.
RUNTIME_DIR = "/run/hwprofile"
STATE_DIR = "/var/lib/hwprofile"  # the daemon's last good plan (it outlives a container restart)
CACHE_DIR = "/cache"
API_KEY_ITEM = "api-key"  # the key of the API key in its Secret
HF_TOKEN_SECRET = "hf-token"  # optional Secret with key `token`, for gated models
LWS_INDEX_LABEL = "leaderworkerset.sigs.k8s.io/worker-index"


MAX_NODES_ANNOTATION = 4096  # bytes; the API server takes 256 KiB of annotations per object in all


def nodes_annotation(nodes: Sequence[str]) -> str:
    """The class's node names, joined; past :data:`MAX_NODES_ANNOTATION` a summary: their count, the
    SHA-256 of the whole list and the first names (10,000 nodes must not fill an object's annotations)."""
    joined = ",".join(nodes)
    if len(joined) <= MAX_NODES_ANNOTATION:
        return joined
    digest = hashlib.sha256(joined.encode()).hexdigest()
    head, used = [], 0
    for n in nodes:
        if used + len(n) + 1 > MAX_NODES_ANNOTATION // 2:
            break
        head.append(n)
        used += len(n) + 1
    return f"{len(nodes)} nodes, sha256 {digest} of their names joined by ',': {','.join(head)},..."


def image_of(opts: Options) -> str:
    if opts.image:
        return opts.image
    major, minor, patch = parse_version(opts.release.target or "")
    return (
        f"hwprofile-vllm:v{major}.{minor}.{patch}"  # podman build -t hwprofile-vllm:vX.Y.Z -f Containerfile .
    )


def _sizes(w: Workload, rank: int) -> Sizes:
    return sizes(w.plan, w.pod_plans[rank], w.rendered[rank], w.target.inputs.host)


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
        inventory = {
            "nodes": [{"snapshot": f"node{k}.json", "address": w.pod_inputs.addresses[k]} for k in range(n)]
        }
        data["inventory.yaml"] = json.dumps(inventory, indent=1) + "\n"  # JSON is YAML
        for k in range(n):
            data[f"node{k}.json"] = hosts[k].to_json() + "\n"
    for k, r in enumerate(w.rendered):
        suffix = "" if n == 1 else f"-node{k}"
        data[f"vllm{suffix}.argv.json"] = json.dumps(r.argv) + "\n"
        data[f"vllm{suffix}.env.json"] = (
            json.dumps({**r.env, **{t: f"${s}" for t, s in r.secrets.items()}}, indent=1) + "\n"
        )
        data[f"vllm{suffix}.sh"] = _shell(r) + "\n"
    data["plan.json"] = (
        json.dumps(w.pod_plans[0].to_json() if n == 1 else [p.to_json() for p in w.pod_plans], indent=1)
        + "\n"
    )
    return data


def _launch_args(w: Workload, rank: int | None) -> list[str]:
    plan = w.pod_plans[0]
    model = plan.model.path if plan.model.source == "dir" and plan.model.path else plan.model.name
    args = ["daemon", "--config-root", POD_ROOT, "--runtime-dir", RUNTIME_DIR, "--state-dir", STATE_DIR]
    if len(w.pod_plans) == 1:
        args += ["--from", f"{POD_ROOT}/pod.json"]
    else:
        args += [
            "--inventory",
            f"{POD_ROOT}/inventory.yaml",
            "--node-rank",
            "0" if rank == 0 else "$(HWPROFILE_NODE_RANK)",
        ]
    args += ["--model", model, "--profile", plan.profile]
    if plan.draft is not None and w.pod_inputs.draft:
        args += ["--draft", w.pod_inputs.draft]
    for s in w.sets:
        args += ["--set", s]
    return args


def _probe(path: str, period: int, failures: int) -> dict[str, Any]:
    """A probe of the daemon's metrics port (``/health``: every instance serves and none is about to
    be drained; ``/livez``: the daemon's loop ticks)."""
    return {
        "httpGet": {"path": path, "port": "hwprofile"},
        "periodSeconds": period,
        "timeoutSeconds": 5,
        "failureThreshold": failures,
    }


def pod_spec(w: Workload, opts: Options, rank: int | None) -> dict[str, Any]:
    """The pod of node ``rank`` (None: every worker of a group; 0 also for a Deployment)."""
    k = rank if rank is not None else 1
    s = _sizes(w, k)
    r = w.rendered[k]
    pod = w.pod_plans[k].instances[0]
    headless = pod.headless
    container: dict[str, Any] = {
        "name": "vllm",
        "image": image_of(opts),
        "imagePullPolicy": "IfNotPresent",
        "command": ["hwprofile"],
        "args": _launch_args(w, rank),
        "env": _pod_env(r, opts, rank),
        "resources": {
            "requests": {"cpu": str(s.cpu), "memory": quantity(s.memory), "nvidia.com/gpu": str(s.gpus)},
            "limits": {"nvidia.com/gpu": str(s.gpus)},
        },
        "volumeMounts": _volume_mounts(),
        "lifecycle": {"preStop": {"exec": {"command": ["sleep", str(PRESTOP_S)]}}},
        "securityContext": {
            "allowPrivilegeEscalation": False,
            "privileged": False,
            "readOnlyRootFilesystem": True,
            "runAsNonRoot": True,
            "capabilities": {"drop": ["ALL"]},
        },
    }
    ports = _ports(w, k)
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
        "volumes": _volumes(w, s),
    }


def _pod_env(r: Rendered, opts: Options, rank: int | None) -> list[dict[str, Any]]:
    """The container's environment: caches under the emptyDirs, the Hugging Face token and the API
    key from their Secrets, and a group worker's rank from LeaderWorkerSet's index label."""
    env: list[dict[str, Any]] = [
        {"name": "HOME", "value": "/tmp"},
        {"name": "XDG_CACHE_HOME", "value": CACHE_DIR},
        {"name": "XDG_CONFIG_HOME", "value": "/tmp/.config"},
        {"name": "HF_HOME", "value": f"{CACHE_DIR}/huggingface"},
        {"name": "VLLM_CACHE_ROOT", "value": f"{CACHE_DIR}/vllm"},
        {"name": "PYTHONDONTWRITEBYTECODE", "value": "1"},
        {
            "name": "HF_TOKEN",
            "valueFrom": {"secretKeyRef": {"name": HF_TOKEN_SECRET, "key": "token", "optional": True}},
        },
    ]
    for source in sorted(set(r.secrets.values())):
        env.append(
            {
                "name": source,
                "valueFrom": {"secretKeyRef": {"name": opts.api_key_secret, "key": API_KEY_ITEM}},
            }
        )
    if rank is None:
        env.append(
            {
                "name": "HWPROFILE_NODE_RANK",
                "valueFrom": {"fieldRef": {"fieldPath": f"metadata.labels['{LWS_INDEX_LABEL}']"}},
            }
        )
    return env


def _ports(w: Workload, k: int) -> list[dict[str, Any]]:
    """The API server's port (not on a headless rank) and hwprofile's exporter (when it has one)."""
    pod = w.pod_plans[k].instances[0]
    ports: list[dict[str, Any]] = []
    if not pod.headless:
        ports.append({"name": "http", "containerPort": int(pod.server.port), "protocol": "TCP"})
    metrics_port = int(w.pod_plans[k].watch.metrics_port)
    if metrics_port:
        ports.append({"name": "hwprofile", "containerPort": metrics_port, "protocol": "TCP"})
    return ports


def _volume_mounts() -> list[dict[str, Any]]:
    """Where the container sees the pod's volumes: every path it writes is an emptyDir."""
    return [
        {"name": "shm", "mountPath": "/dev/shm"},
        {"name": "tmp", "mountPath": "/tmp"},
        {"name": "cache", "mountPath": CACHE_DIR},
        {"name": "runtime", "mountPath": RUNTIME_DIR},
        {"name": "state", "mountPath": STATE_DIR},
        {"name": "logs", "mountPath": LOG_DIR},
        {"name": "plan", "mountPath": POD_ROOT, "readOnly": True},
    ]


def _volumes(w: Workload, s: Sizes) -> list[dict[str, Any]]:
    """The pod's emptyDirs (sized) and its plan ConfigMap."""
    return [
        {"name": "shm", "emptyDir": {"medium": "Memory", "sizeLimit": quantity(s.shm)}},
        {"name": "tmp", "emptyDir": {"sizeLimit": quantity(s.tmp)}},
        {"name": "cache", "emptyDir": {"sizeLimit": quantity(s.cache)}},
        {"name": "runtime", "emptyDir": {"medium": "Memory", "sizeLimit": "64Mi"}},
        {"name": "state", "emptyDir": {"sizeLimit": "16Mi"}},
        {"name": "logs", "emptyDir": {"sizeLimit": quantity(s.logs)}},
        {"name": "plan", "configMap": {"name": f"{w.name}-plan"}},
    ]


def _digest(data: dict[str, str], image: str, args: Sequence[str]) -> str:
    h = hashlib.sha256(json.dumps([data, image, list(args)], sort_keys=True).encode())
    return h.hexdigest()


def manifests(w: Workload, opts: Options) -> list[tuple[list[str], dict[str, Any]]]:
    """``[(comment lines, manifest), ...]`` of one workload."""
    data = config_data(w)
    labels = _labels(w)
    group = len(w.pod_plans) > 1
    args_note = (
        shlex.join(w.rendered[0].argv)
        if not group
        else f"node 0: {shlex.join(w.rendered[0].argv)} (the workers: vllm-node<k>.sh in ConfigMap {w.name}-plan)"
    )
    annotations = {
        "hwprofile.io/vllm-args": args_note,
        "hwprofile.io/vllm-release": w.rendered[0].vllm_version,
        "hwprofile.io/profile": w.pod_plans[0].profile,
        "hwprofile.io/gpu-class": w.target.product,
    }
    if w.target.nodes:
        annotations["hwprofile.io/nodes"] = nodes_annotation(w.target.nodes)
    digest = _digest(data, image_of(opts), _launch_args(w, 0))
    template_meta = {"labels": labels, "annotations": {**annotations, "hwprofile.io/plan-sha256": digest}}
    s = _sizes(w, 0)
    out: list[tuple[list[str], dict[str, Any]]] = []
    out.append(
        (
            [f"{w.name}: the pod's snapshot, the vLLM command line it runs, its plan"],
            {
                "apiVersion": "v1",
                "kind": "ConfigMap",
                "metadata": _meta(w, f"{w.name}-plan", opts),
                "data": data,
            },
        )
    )
    if not group:
        out.append((_workload_comments(w, s), _deployment(w, opts, annotations, template_meta, s)))
        selector = dict(labels)
    else:
        out.append((_workload_comments(w, s), _leader_worker_set(w, opts, annotations, template_meta)))
        selector = {**labels, "hwprofile.io/role": "leader"}
    port = int(w.pod_plans[0].instances[0].server.port)
    out.append(
        (
            [f"{w.name}: the API server (node 0 of a group)"],
            {
                "apiVersion": "v1",
                "kind": "Service",
                "metadata": _meta(w, w.name, opts),
                "spec": {
                    "type": "ClusterIP",
                    "selector": selector,
                    "ports": [{"name": "http", "port": port, "targetPort": "http", "protocol": "TCP"}],
                },
            },
        )
    )

    out.append(_pod_monitor(w, opts, labels))
    return out


def _deployment(
    w: Workload, opts: Options, annotations: dict[str, str], template_meta: dict[str, Any], s: Sizes
) -> dict[str, Any]:
    """The Deployment of a workload whose pods stand alone."""
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": _meta(w, w.name, opts, annotations),
        "spec": {
            "replicas": w.replicas,
            "selector": {"matchLabels": template_meta["labels"]},
            # no surge: a new pod needs GPUs an old one still holds
            "strategy": {
                "type": "RollingUpdate",
                "rollingUpdate": {"maxSurge": 0, "maxUnavailable": 1},
            },
            "progressDeadlineSeconds": s.progress_deadline_s,
            "template": {"metadata": template_meta, "spec": pod_spec(w, opts, 0)},
        },
    }


def _leader_worker_set(
    w: Workload, opts: Options, annotations: dict[str, str], template_meta: dict[str, Any]
) -> dict[str, Any]:
    """The LeaderWorkerSet of a workload whose pods form one group over several nodes."""
    labels = template_meta["labels"]
    leader = {
        "labels": {**labels, "hwprofile.io/role": "leader"},
        "annotations": template_meta["annotations"],
    }
    worker = {
        "labels": {**labels, "hwprofile.io/role": "worker"},
        "annotations": template_meta["annotations"],
    }
    return {
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
    }


def _relabel(job: str) -> list[dict[str, Any]]:
    """The labels monitoring/rules and the dashboard group by: ``job`` as in
    monitoring/prometheus.yml (a PodMonitor's own would be <namespace>/<name>), ``host`` = the node."""
    return [
        {"targetLabel": "job", "replacement": job},
        {"sourceLabels": ["__meta_kubernetes_pod_node_name"], "targetLabel": "host"},
    ]


def _pod_monitor(w: Workload, opts: Options, labels: dict[str, str]) -> tuple[list[str], dict[str, Any]]:
    """The PodMonitor of vLLM's /metrics (and hwprofile's exporter, when the plan has one)."""
    endpoints: list[dict[str, Any]] = [
        {"port": "http", "path": "/metrics", "interval": "15s", "relabelings": _relabel("vllm")}
    ]
    comments = [
        f"{w.name}: vLLM's /metrics on the http port (every pod with an API server); job and host "
        "labelled as monitoring/prometheus.yml does, for monitoring/rules and the dashboard"
    ]
    if int(w.pod_plans[0].watch.metrics_port):
        endpoints.append(
            {"port": "hwprofile", "path": "/metrics", "interval": "15s", "relabelings": _relabel("hwprofile")}
        )
        comments.append(
            f"and hwprofile's exporter (watch.metrics_port {int(w.pod_plans[0].watch.metrics_port)}, on the "
            "pod's address: watch.metrics_host=0.0.0.0)"
        )
    return (
        comments,
        {
            "apiVersion": "monitoring.coreos.com/v1",
            "kind": "PodMonitor",
            "metadata": _meta(w, w.name, opts),
            "spec": {"selector": {"matchLabels": dict(labels)}, "podMetricsEndpoints": endpoints},
        },
    )


def _workload_comments(w: Workload, s: Sizes) -> list[str]:
    pod = w.pod_plans[0].instances[0]
    e = pod.engine
    kind = "LeaderWorkerSet group" if len(w.pod_plans) > 1 else f"Deployment of {w.replicas} pod(s)"
    where = (
        f"{len(w.target.nodes)} node(s): {', '.join(w.target.nodes)}" if w.target.nodes else "from a snapshot"
    )
    lines = [
        f"{w.name}: {kind} on {w.target.product} ({where}); profile {w.pod_plans[0].profile}, "
        f"model {w.pod_plans[0].model.name}",
        f"each pod: {s.gpus} GPU(s), tensor parallel {pod.tensor_parallel_size}, pipeline parallel "
        f"{pod.pipeline_parallel_size}, max_num_seqs {e.max_num_seqs}, max_model_len {e.max_model_len}",
        f"startup: {s.startup_failures} x {PROBE_PERIOD_S} s >= the planned load time {s.load_s} s "
        f"(supervise.ready_timeout) + the start gate's {w.pod_plans[0].supervise.gpu_free_timeout:.0f} s "
        f"(supervise.gpu_free_timeout) + 30 s; a first start's download and engine start at "
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
        lines.append(
            f"warning: the estimated first start ({s.estimate_s} s) is longer than supervise.ready_timeout "
            f"({s.load_s} s): raise it (--set supervise.ready_timeout=...) or cache the weights"
        )
    if not w.rendered[0].secrets:
        lines.append(
            "no API key (server.api_key_env unset): the server answers anyone who reaches the Service"
        )
    if len(w.pod_plans) > 1:
        lines.append(
            f"a headless rank (worker) serves no HTTP: no probes; restartPolicy re-forms the group "
            f"when a pod restarts; node k is {lws_address(w.name, 1).replace('-0-1.', '-0-<k>.')}, "
            f"node 0 {w.pod_inputs.addresses[0]} (LeaderWorkerSet's headless Service)"
        )
    model = w.pod_plans[0].model
    if model.source == "dir":
        lines.append(
            f"the model is a directory on the planning host ({model.path}): mount it into the pod "
            "at that path (a volume of yours), or pass --model with a Hugging Face name"
        )
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

        def ignore_aliases(self, data: object) -> bool:
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
        text = yaml.dump(
            doc, Dumper=dumper, sort_keys=False, default_flow_style=False, width=1000, allow_unicode=False
        )
        parts.append("---\n" + "".join(f"# {label(c)}\n" for c in comments) + text)
    out = "".join(parts)
    # read back by libyaml's safe loader where PyYAML has it (as config.yamlsrc does): the pure-Python
    # one takes seconds over the manifests of thousands of nodes
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    if list(yaml.load_all(out, Loader=loader)) != [
        d for _, d in docs
    ]:  # never: safe_dump quotes what it must
        raise K8sError("the manifests do not read back as they were built")
    return out


ROUTER_NAME = "hwprofile-router"
ROUTER_PORT = 8080


def router_manifests(workloads: Sequence[Workload], opts: Options) -> list[tuple[list[str], dict[str, Any]]]:
    """vLLM's router in front of every workload's Service (one Deployment of one pod, one Service):
    the cluster's one URL, cache-aware across the workloads. Each worker URL is a workload's Service,
    so the router picks a workload and kube-proxy a pod within it (the router's own pod discovery,
    --service-discovery, needs RBAC to watch pods; not rendered here)."""
    from ..router import router_argv

    urls = [f"http://{w.name}:{int(w.pod_plans[0].instances[0].server.port)}" for w in workloads]
    argv = router_argv("vllm-router", "0.0.0.0", ROUTER_PORT, urls, "cache_aware", 900, 3600, ROUTER_PORT + 1)
    labels = {
        "app.kubernetes.io/name": "vllm-router",
        "app.kubernetes.io/instance": ROUTER_NAME,
        "app.kubernetes.io/managed-by": "hwprofile",
    }
    meta: dict[str, Any] = {"name": ROUTER_NAME, "labels": labels}
    if opts.namespace:
        meta["namespace"] = opts.namespace
    container = _router_container(opts, argv)
    deploy = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": meta,
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": labels},
            "template": {"metadata": {"labels": labels}, "spec": {"containers": [container]}},
        },
    }
    service = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": meta,
        "spec": {
            "type": "ClusterIP",
            "selector": labels,
            "ports": [{"name": "http", "port": ROUTER_PORT, "targetPort": "http", "protocol": "TCP"}],
        },
    }
    note = (
        f"{ROUTER_NAME}: vLLM's router (cache_aware) in front of {', '.join(w.name for w in workloads)}: "
        "the one URL for clients; the API key stays with vLLM (the router passes Authorization through)"
    )
    return [([note], deploy), ([f"{ROUTER_NAME}: its Service, port {ROUTER_PORT}"], service)]


def _router_container(opts: Options, argv: Sequence[str]) -> dict[str, Any]:
    """The router's container: its command line, port and probes."""
    return {
        "name": "vllm-router",
        "image": opts.router_image,
        "command": [argv[0]],
        "args": list(argv[1:]),
        "ports": [{"name": "http", "containerPort": ROUTER_PORT, "protocol": "TCP"}],
        "readinessProbe": {
            "httpGet": {"path": "/readiness", "port": "http"},
            "periodSeconds": 5,
            "failureThreshold": 3,
        },
        "livenessProbe": {
            "httpGet": {"path": "/health", "port": "http"},
            "periodSeconds": 10,
            "failureThreshold": 6,
            "initialDelaySeconds": 10,
        },
        "resources": {"requests": {"cpu": "500m", "memory": "256Mi"}, "limits": {"memory": "1Gi"}},
    }


def render_k8s(targets: Sequence[Target], opts: Options, header: Sequence[str] = ()) -> tuple[str, list[str]]:
    """The YAML stream of every target's workloads, and the warnings to print."""
    from ...plan import PlanRefused

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
    if opts.router_image:
        docs += router_manifests(workloads, opts)
    lines = [
        f"hwprofile render --format k8s: {len(workloads)} workload(s), {len(docs)} manifests, "
        f"vLLM {opts.release.target}, image {image_of(opts)}",
        *header,
        *left_out,
    ]
    warnings = (
        left_out
        + [x for w in workloads for x in w.warnings]
        + [f"{w.name}: {x}" for w in workloads for r in w.rendered for x in r.warnings]
    )
    return dump(docs, lines), warnings
