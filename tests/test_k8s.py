"""``render --format k8s``: Kubernetes manifests for each GPU class, validated strictly.

- every manifest against the Kubernetes API's own schemas (``kubernetes-validate``, strict: an
  unknown field is an error) for two Kubernetes releases, :data:`K8S_VERSIONS`; the CRDs
  (LeaderWorkerSet, PodMonitor) with ``jsonschema`` against the ``openAPIV3Schema`` their projects
  publish (``tests/fixtures/crds/``, see its SOURCE.md), closed the way the API server prunes;
  a LeaderWorkerSet's pod templates also against the API's PodTemplate;
- each seed GPU class gets its own workload and args (A800 x4 vs RTX 4090: TP and max_num_seqs);
  a mixed cluster (``tests/fixtures/k8s/nodes-mixed.json``, as kubectl prints it) one per class;
- probes sized to the planned load time, the grace period longer than the drain, the API key from
  a Secret and never in args, the writable paths named, a hostile label value kept as data.

Fast: in-process renders of fixture snapshots; no cluster, no network.
"""

from __future__ import annotations

import copy
import json
import shlex
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml

from hwprofile.cli import main
from hwprofile.cli.parser import build_parser
from hwprofile.render.k8s import PROBE_PERIOD_S
from hwprofile.render.k8s.nodes import node_classes, pod_view

HERE = Path(__file__).resolve().parent
CRDS = HERE / "fixtures" / "crds"
NODES_MIXED = HERE / "fixtures" / "k8s" / "nodes-mixed.json"
K8S_VERSIONS = ("1.29.0", "1.35.0")  # an older and a recent release of the API
HUGE = "Qwen/Qwen3-235B-A22B"  # 470 GB: more than one 4xA800 node
SEED = {  # seed-class fixture host → model planned on it (None: the profile's own)
    "a800-pcie-4x-2numa": None,
    "rtx4090-1x": None,
    "rtx3060-12g-1x": "Qwen/Qwen3-8B",
    "rtx4070-12g-1x": "Qwen/Qwen3-8B",
    "rtx3090-2x": None,
    "a100-80g-pcie-1x": None,
}
HOSTILE = "x\n---\nkind: Secret\nmetadata: {name: pwned}\n# \"quoted\" 'single' key: value {a: b}"


def _closed(schema: Any) -> Any:
    """A CRD's structural schema as the API server applies it: unknown fields pruned, here refused."""
    if isinstance(schema, dict):
        out = {k: _closed(v) for k, v in schema.items()}
        if (
            "properties" in out
            and "additionalProperties" not in out
            and not out.get("x-kubernetes-preserve-unknown-fields")
        ):
            out["additionalProperties"] = False
        return out
    if isinstance(schema, list):
        return [_closed(v) for v in schema]
    return schema


CRD_SCHEMAS = {
    ("leaderworkerset.x-k8s.io/v1", "LeaderWorkerSet"): "leaderworkerset-v1.schema.json",
    ("monitoring.coreos.com/v1", "PodMonitor"): "podmonitor-v1.schema.json",
}


@pytest.fixture(scope="module")
def crd_validators() -> dict[tuple[str, str], jsonschema.Draft7Validator]:
    return {
        key: jsonschema.Draft7Validator(_closed(json.loads((CRDS / name).read_text())))
        for key, name in CRD_SCHEMAS.items()
    }


def validate(doc: dict[str, Any], crds: dict[tuple[str, str], jsonschema.Draft7Validator]) -> int:
    """Validate one manifest strictly; returns how many schema checks it passed."""
    key = (doc["apiVersion"], doc["kind"])
    if key in crds:
        errors = sorted(crds[key].iter_errors(doc), key=lambda e: list(e.path))
        assert not errors, f"{doc['kind']} {doc['metadata']['name']}: " + "; ".join(
            f"{'/'.join(map(str, e.path))}: {e.message}" for e in errors[:5]
        )
        checks = 1
        if doc["kind"] == "LeaderWorkerSet":  # its pods, against the API's own PodTemplate
            lwt = doc["spec"]["leaderWorkerTemplate"]
            for t in ("leaderTemplate", "workerTemplate"):
                pod = {
                    "apiVersion": "v1",
                    "kind": "PodTemplate",
                    "metadata": {"name": "t"},
                    "template": lwt[t],
                }
                for v in K8S_VERSIONS:
                    kubernetes_validate.validate(pod, v, strict=True)
                    checks += 1
        return checks
    for v in K8S_VERSIONS:
        kubernetes_validate.validate(doc, v, strict=True)
    return len(K8S_VERSIONS)


def render(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[list[dict[str, Any]], str, str]:
    """``hwprofile render --format k8s ARGV`` in this process: (documents, YAML text, stderr); for vLLM
    0.33.0 unless ARGV names a release (the fast loop has no vLLM installed to render for)."""
    release = [] if "--vllm-version" in argv else ["--vllm-version", "0.33.0"]
    rc = main(["render", "--format", "k8s", *argv, *release])
    out, err = capsys.readouterr()
    assert rc == 0, err
    return [d for d in yaml.safe_load_all(out) if d is not None], out, err


@pytest.fixture
def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    import os

    for k in list(os.environ):
        if k.startswith("HWPROFILE_") and k not in (
            "HWPROFILE_PROC_ROOT",
            "HWPROFILE_SYS_ROOT",
            "HWPROFILE_NVML_LIBRARY",
        ):
            monkeypatch.delenv(k)


@pytest.fixture
def snapshot(host_of, tmp_path: Path, clean_env):
    """``snapshot(name)``: the path of the fixture host's snapshot as `hwprofile detect --json` saves it."""

    def make(name: str) -> str:
        path = tmp_path / f"{name}.json"
        path.write_text(host_of(name).to_json())
        return str(path)

    return make


def _of(docs: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [d for d in docs if d["kind"] == kind]


def _pods(workload: dict[str, Any]) -> list[dict[str, Any]]:
    if workload["kind"] == "Deployment":
        return [workload["spec"]["template"]["spec"]]
    lwt = workload["spec"]["leaderWorkerTemplate"]
    return [lwt["leaderTemplate"]["spec"], lwt["workerTemplate"]["spec"]]


def _sets(container: dict[str, Any]) -> dict[str, str]:
    args = container["args"]
    return dict(args[i + 1].split("=", 1) for i, a in enumerate(args) if a == "--set")


def check_workload(docs: list[dict[str, Any]], workload: dict[str, Any]) -> None:
    """What every workload must be, whatever its class."""
    name = workload["metadata"]["name"]
    config = next(d for d in _of(docs, "ConfigMap") if d["metadata"]["name"] == f"{name}-plan")
    plan = json.loads(config["data"]["plan.json"])
    plans = plan if isinstance(plan, list) else [plan]
    supervise, drain = plans[0]["supervise"], plans[0]["instances"][0]["server"]["shutdown_timeout"]
    for pod in _pods(workload):
        (c,) = pod["containers"]
        # the image's entrypoint, PID 1 of the pod: the daemon (its thermal policy in the pod), with args
        # its own parser takes (the rank of a group's worker comes from the environment)
        assert c["command"] == ["hwprofile"] and c["args"][0] == "daemon"
        parsed = build_parser().parse_args([a.replace("$(HWPROFILE_NODE_RANK)", "1") for a in c["args"]])
        assert parsed.command == "daemon" and parsed.state_dir == "/var/lib/hwprofile"
        # resources: the instance's GPUs, CPU and memory requested
        gpus = len(plans[0]["instances"][0]["gpus"])
        assert c["resources"]["limits"]["nvidia.com/gpu"] == str(gpus)
        assert {"cpu", "memory", "nvidia.com/gpu"} <= set(c["resources"]["requests"])
        assert (
            pod["nodeSelector"]["nvidia.com/gpu.product"]
            == workload["metadata"]["annotations"]["hwprofile.io/gpu-class"]
        )
        # security
        sc = c["securityContext"]
        assert sc["allowPrivilegeEscalation"] is False and sc["readOnlyRootFilesystem"] is True
        assert sc["capabilities"] == {"drop": ["ALL"]} and pod["securityContext"]["runAsNonRoot"] is True
        mounts = {m["mountPath"]: m["name"] for m in c["volumeMounts"]}
        volumes = {v["name"]: v for v in pod["volumes"]}
        for path in (
            "/tmp",
            "/cache",
            "/run/hwprofile",
            "/var/lib/hwprofile",
            "/var/log/hwprofile",
            "/dev/shm",
        ):
            assert "emptyDir" in volumes[mounts[path]], path
        assert volumes[mounts["/dev/shm"]]["emptyDir"]["medium"] == "Memory"
        env = {e["name"]: e for e in c["env"]}
        assert env["HF_HOME"]["value"].startswith("/cache") and env["HOME"]["value"] == "/tmp"
        # drain: the grace period covers the preStop pause and vLLM's drain with room to spare
        assert pod["terminationGracePeriodSeconds"] > drain + int(
            c["lifecycle"]["preStop"]["exec"]["command"][1]
        )
        assert "--shutdown-timeout" not in c["args"]  # vLLM's flag, in the shown args only
        # the daemon's metrics port on the pod's address, vLLM's lines on stdout
        sets = _sets(c)
        ports = {p["name"]: p["containerPort"] for p in c["ports"]}
        assert (
            sets["watch.metrics_host"] == "0.0.0.0" and int(sets["watch.metrics_port"]) == ports["hwprofile"]
        )
        assert sets["logs.stdout"] == "true"
        # liveness: the daemon's loop (it restarts vLLM itself), on every pod
        lp = c["livenessProbe"]
        assert lp["httpGet"] == {"path": "/livez", "port": "hwprofile"}
        assert lp["failureThreshold"] * lp["periodSeconds"] > supervise["unhealthy_s"]
        # probes: sized to the planned load time, on the daemon's /health, on pods with an API server
        if "startupProbe" in c:
            sp = c["startupProbe"]
            assert (
                sp["httpGet"] == {"path": "/health", "port": "hwprofile"}
                and sp["periodSeconds"] == PROBE_PERIOD_S
            )
            assert (
                sp["failureThreshold"] * sp["periodSeconds"]
                >= supervise["ready_timeout"] + supervise["gpu_free_timeout"]
            )
            rp = c["readinessProbe"]
            assert rp["httpGet"] == {"path": "/health", "port": "hwprofile"}
            # /health says 503 before a degrade drains for as long as this probe needs to notice it
            assert float(sets["watch.unready_s"]) >= rp["periodSeconds"] * rp["failureThreshold"]
            assert sets["server.host"] == "0.0.0.0"
        else:
            assert _sets(c)["layout.nodes"] != "1", "only a group's headless workers go without probes"
    # what runs is readable: the annotation is the ConfigMap's command line
    shown = workload["metadata"]["annotations"]["hwprofile.io/vllm-args"]
    argv = json.loads(config["data"]["vllm.argv.json" if len(plans) == 1 else "vllm-node0.argv.json"])
    assert shlex.join(argv) in shown and argv[:2] == ["vllm", "serve"]


def test_seed_classes_each_get_their_own_workload(snapshot, empty_root, capsys, crd_validators) -> None:
    checked = manifests = 0
    args_of: dict[str, list[str]] = {}
    for name, model in SEED.items():
        extra = ["--model", model] if model else []
        docs, _, _ = render(capsys, "--from", snapshot(name), "--config-root", str(empty_root), *extra)
        kinds = sorted(d["kind"] for d in docs)
        assert kinds == ["ConfigMap", "Deployment", "PodMonitor", "Service"], (name, kinds)
        for d in docs:
            checked += validate(d, crd_validators)
        manifests += len(docs)
        (dep,) = _of(docs, "Deployment")
        check_workload(docs, dep)
        (cm,) = _of(docs, "ConfigMap")
        args_of[name] = json.loads(cm["data"]["vllm.argv.json"])
        snap = json.loads(cm["data"]["pod.json"])
        assert all(g["uuid"] is None for g in snap["gpus"]), "a pod may get any GPUs of its class"
        assert [g["index"] for g in snap["gpus"]] == list(range(len(snap["gpus"])))
    # three API kinds for each Kubernetes release, the PodMonitor against its CRD
    assert manifests == 4 * len(SEED) and checked == len(SEED) * (3 * len(K8S_VERSIONS) + 1)

    def flag(argv: list[str], name: str, default: str | None = None) -> str | None:
        return argv[argv.index(name) + 1] if name in argv else default

    a800, rtx = args_of["a800-pcie-4x-2numa"], args_of["rtx4090-1x"]
    assert flag(a800, "--tensor-parallel-size") == "2" and flag(rtx, "--tensor-parallel-size", "1") == "1"
    assert int(flag(a800, "--max-num-seqs")) > int(flag(rtx, "--max-num-seqs"))
    assert len({json.dumps(a) for a in args_of.values()}) == len(args_of), "each class its own args"


def test_a800_pods_and_replicas(snapshot, empty_root, capsys) -> None:
    """Two TP2 instances on the 4-GPU A800 host: one Deployment of two 2-GPU pods, bound to nothing
    (the kubelet places a pod's CPUs), its GPUs numbered from 0 as the device plugin shows them."""
    docs, _, _ = render(capsys, "--from", snapshot("a800-pcie-4x-2numa"), "--config-root", str(empty_root))
    (dep,) = _of(docs, "Deployment")
    assert dep["spec"]["replicas"] == 2
    assert dep["spec"]["strategy"]["rollingUpdate"] == {"maxSurge": 0, "maxUnavailable": 1}
    (c,) = dep["spec"]["template"]["spec"]["containers"]
    sets = _sets(c)
    assert sets["layout.numa_bind"] == "false" and sets["layout.tensor_parallel_size"] == "2"
    (cm,) = _of(docs, "ConfigMap")
    env = json.loads(cm["data"]["vllm.env.json"])
    assert env["CUDA_VISIBLE_DEVICES"] == "0,1"
    assert "--numa-bind" not in json.loads(cm["data"]["vllm.argv.json"])
    assert dep["spec"]["progressDeadlineSeconds"] > c["startupProbe"]["failureThreshold"] * PROBE_PERIOD_S


def test_one_data_parallel_server_is_one_pod_with_every_rank(
    snapshot, empty_root, capsys, crd_validators
) -> None:
    docs, _, _ = render(
        capsys,
        "--from",
        snapshot("a800-pcie-4x-2numa"),
        "--config-root",
        str(empty_root),
        "--set",
        "layout.shape=data_parallel",
        "--vllm-version",
        "0.33.0",
    )
    (dep,) = _of(docs, "Deployment")
    (c,) = dep["spec"]["template"]["spec"]["containers"]
    assert dep["spec"]["replicas"] == 1 and c["resources"]["limits"]["nvidia.com/gpu"] == "4"
    assert _sets(c)["layout.shape"] == "data_parallel" and _sets(c)["layout.replicas"] == "2"
    assert "--data-parallel-size 2" in dep["metadata"]["annotations"]["hwprofile.io/vllm-args"]
    for d in docs:
        validate(d, crd_validators)
    check_workload(docs, dep)


def test_api_key_from_a_secret_never_in_args(
    snapshot, empty_root, capsys, monkeypatch, crd_validators
) -> None:
    monkeypatch.setenv("HWP_TEST_KEY", "s3cr3t-value-never-rendered")
    docs, text, _ = render(
        capsys,
        "--from",
        snapshot("rtx4090-1x"),
        "--config-root",
        str(empty_root),
        "--set",
        "server.api_key_env=HWP_TEST_KEY",
        "--api-key-secret",
        "my-key",
    )
    assert "s3cr3t" not in text
    (dep,) = _of(docs, "Deployment")
    (c,) = dep["spec"]["template"]["spec"]["containers"]
    env = {e["name"]: e for e in c["env"]}
    assert env["HWP_TEST_KEY"]["valueFrom"]["secretKeyRef"] == {"name": "my-key", "key": "api-key"}
    assert "value" not in env["HWP_TEST_KEY"]
    assert not any("VLLM_API_KEY" in a or "--api-key" in a for a in c["args"])
    (cm,) = _of(docs, "ConfigMap")
    assert "--api-key" not in json.loads(cm["data"]["vllm.argv.json"])
    for d in docs:
        validate(d, crd_validators)


def test_mixed_cluster_one_workload_per_class(empty_root, capsys, clean_env, crd_validators) -> None:
    docs, text, err = render(
        capsys, "--nodes", str(NODES_MIXED), "--config-root", str(empty_root), "--vllm-version", "0.33.0"
    )
    deps = {d["metadata"]["annotations"]["hwprofile.io/gpu-class"]: d for d in _of(docs, "Deployment")}
    # the RTX 3060 node cannot hold its profile's model: left out, with the reason, not an error
    assert set(deps) == {"NVIDIA-A800-80GB-PCIe", "NVIDIA-GeForce-RTX-4090"}
    assert "NVIDIA-GeForce-RTX-3060 (1 node(s)): no workload" in err and "does not fit" in text
    assert "cp-1" not in text  # no GPU Feature Discovery labels: not a GPU node
    a800, rtx = deps["NVIDIA-A800-80GB-PCIe"], deps["NVIDIA-GeForce-RTX-4090"]
    # one pod per TP group on each of the two nodes: 4 GPUs / the plan's TP (the shipped TP 2 gives way
    # to a >= 10 % better TP 1 where the labels say no NVLink)
    tp = int(
        a800["metadata"]["annotations"]["hwprofile.io/vllm-args"].partition("--tensor-parallel-size ")[2][:1]
        or 1
    )
    assert a800["spec"]["replicas"] == 2 * 4 // tp
    assert a800["metadata"]["annotations"]["hwprofile.io/nodes"] == "gpu-a800-1,gpu-a800-2"
    assert a800["spec"]["template"]["spec"]["nodeSelector"] == {
        "nvidia.com/gpu.product": "NVIDIA-A800-80GB-PCIe",
        "nvidia.com/gpu.count": "4",
        "nvidia.com/gpu.memory": "81920",
    }
    assert rtx["spec"]["replicas"] == 1
    args = {k: d["metadata"]["annotations"]["hwprofile.io/vllm-args"] for k, d in deps.items()}
    assert tp == 1 or "--tensor-parallel-size 2" in args["NVIDIA-A800-80GB-PCIe"]
    assert "--tensor-parallel-size" not in args["NVIDIA-GeForce-RTX-4090"]
    assert args["NVIDIA-A800-80GB-PCIe"] != args["NVIDIA-GeForce-RTX-4090"]
    assert "# assumed: no NVLink and no PCIe topology" in text  # what labels cannot say, said
    assert len(docs) == 8
    for d in docs:
        validate(d, crd_validators)
    for d in deps.values():
        check_workload(docs, d)


def _lws_checks(docs: list[dict[str, Any]], crds: dict[tuple[str, str], Any]) -> dict[str, Any]:
    (lws,) = _of(docs, "LeaderWorkerSet")
    assert not _of(docs, "Deployment")
    for d in docs:
        validate(d, crds)
    check_workload(docs, lws)
    name = lws["metadata"]["name"]
    spec = lws["spec"]["leaderWorkerTemplate"]
    assert spec["size"] == 2 and lws["spec"]["replicas"] == 1
    (leader,) = spec["leaderTemplate"]["spec"]["containers"]
    (worker,) = spec["workerTemplate"]["spec"]["containers"]
    assert "startupProbe" in leader and "startupProbe" not in worker and "ports" in leader
    assert leader["args"][leader["args"].index("--node-rank") + 1] == "0"
    assert worker["args"][worker["args"].index("--node-rank") + 1] == "$(HWPROFILE_NODE_RANK)"
    rank = next(e for e in worker["env"] if e["name"] == "HWPROFILE_NODE_RANK")
    assert "leaderworkerset.sigs.k8s.io/worker-index" in rank["valueFrom"]["fieldRef"]["fieldPath"]
    (cm,) = _of(docs, "ConfigMap")
    inventory = yaml.safe_load(cm["data"]["inventory.yaml"])
    assert [n["address"] for n in inventory["nodes"]] == [f"{name}-0.{name}", f"{name}-0-1.{name}"]
    node1 = json.loads(cm["data"]["vllm-node1.argv.json"])
    assert "--headless" in node1 and node1[node1.index("--node-rank") + 1] == "1"
    assert node1[node1.index("--master-addr") + 1] == f"{name}-0.{name}"
    (svc,) = _of(docs, "Service")
    assert svc["spec"]["selector"]["hwprofile.io/role"] == "leader"
    return lws


def test_a_model_larger_than_a_node_is_a_leaderworkerset(
    snapshot, empty_root, capsys, crd_validators
) -> None:
    a800 = snapshot("a800-pcie-4x-2numa")
    docs, _, _ = render(
        capsys, "--from", a800, "--from", a800, "--config-root", str(empty_root), "--model", HUGE
    )
    _lws_checks(docs, crd_validators)


def test_a_cluster_class_too_small_for_the_model_groups_its_nodes(
    empty_root, capsys, clean_env, crd_validators
) -> None:
    docs, _, _ = render(
        capsys,
        "--nodes",
        str(NODES_MIXED),
        "--config-root",
        str(empty_root),
        "--model",
        HUGE,
        "--vllm-version",
        "0.33.0",
    )
    lws = _lws_checks(docs, crd_validators)
    assert lws["metadata"]["annotations"]["hwprofile.io/nodes"] == "gpu-a800-1,gpu-a800-2"


def _hostile_nodes() -> dict[str, Any]:
    doc = json.loads(NODES_MIXED.read_text())
    a800 = next(n for n in doc["items"] if n["metadata"]["name"] == "gpu-a800-1")
    rtx = next(n for n in doc["items"] if n["metadata"]["name"] == "ws-4090")
    bad = copy.deepcopy(rtx)
    bad["metadata"]["name"] = "evil-product"
    bad["metadata"]["labels"]["nvidia.com/gpu.product"] = HOSTILE
    bad_mem = copy.deepcopy(rtx)
    bad_mem["metadata"]["name"] = "evil-memory"
    bad_mem["metadata"]["labels"]["nvidia.com/gpu.memory"] = "24564\n---\nkind: Secret"
    named = copy.deepcopy(a800)
    named["metadata"]["name"] = HOSTILE  # no node name the API server takes (DNS-1123): left out, said so
    machine = copy.deepcopy(a800)
    machine["metadata"]["labels"]["nvidia.com/gpu.machine"] = (
        HOSTILE  # a label is data: an annotation, a comment
    )
    doc["items"] = [named, machine, bad, bad_mem, rtx]
    return doc


def test_a_hostile_label_value_injects_no_yaml(
    empty_root, capsys, clean_env, tmp_path, crd_validators
) -> None:
    path = tmp_path / "nodes.json"
    path.write_text(json.dumps(_hostile_nodes()))
    docs, text, err = render(
        capsys, "--nodes", str(path), "--config-root", str(empty_root), "--vllm-version", "0.33.0"
    )
    # the stream is exactly the documents built: no Secret, no extra key, nothing but comments outside
    assert sorted(d["kind"] for d in docs) == [
        "ConfigMap",
        "ConfigMap",
        "Deployment",
        "Deployment",
        "PodMonitor",
        "PodMonitor",
        "Service",
        "Service",
    ]
    assert not any(d["kind"] == "Secret" or d.get("metadata", {}).get("name") == "pwned" for d in docs)
    for line in text.splitlines():
        assert not line.startswith("kind: Secret") and not line.startswith("metadata: {name: pwned")
    # a product that is no label value never reaches a selector; its node is left out, said so
    selectors = [p["nodeSelector"] for d in docs if d["kind"] == "Deployment" for p in _pods(d)]
    assert {s["nvidia.com/gpu.product"] for s in selectors} == {
        "NVIDIA-A800-80GB-PCIe",
        "NVIDIA-GeForce-RTX-4090",
    }
    assert "node evil-product" in err and "not a valid label value" in err
    assert "node evil-memory" in err and "not a size in MiB" in err
    # the hostile node name is no node name: left out, said so (escaped), never in a manifest
    assert "not a Kubernetes node name" in err and HOSTILE not in text
    a800 = next(d for d in _of(docs, "Deployment") if "a800" in d["metadata"]["name"])
    assert a800["metadata"]["annotations"]["hwprofile.io/nodes"] == "gpu-a800-1"
    tp = int(
        a800["metadata"]["annotations"]["hwprofile.io/vllm-args"].partition("--tensor-parallel-size ")[2][:1]
        or 1
    )
    assert a800["spec"]["replicas"] == 4 // tp  # one node of this class here: a pod per TP group
    for d in docs:
        validate(d, crd_validators)


def test_strict_validation_refuses_unknown_fields(snapshot, empty_root, capsys, crd_validators) -> None:
    """The validators are strict: a field the schema does not have is an error, not pruned."""
    a800 = snapshot("a800-pcie-4x-2numa")
    docs, _, _ = render(
        capsys, "--from", a800, "--from", a800, "--config-root", str(empty_root), "--model", HUGE
    )
    single, _, _ = render(capsys, "--from", a800, "--config-root", str(empty_root))
    (dep,) = _of(single, "Deployment")
    bad = copy.deepcopy(dep)
    bad["spec"]["template"]["spec"]["containers"][0]["gpus"] = 2
    for v in K8S_VERSIONS:
        with pytest.raises(kubernetes_validate.ValidationError):
            kubernetes_validate.validate(bad, v, strict=True)
    for kind, where in (("LeaderWorkerSet", ("spec", "leaderWorkerTemplate")), ("PodMonitor", ("spec",))):
        doc = copy.deepcopy(_of(docs, kind)[0])
        target = doc
        for key in where:
            target = target[key]
        target["unknownField"] = True
        with pytest.raises(AssertionError, match="unknownField"):
            validate(doc, crd_validators)
    doc = copy.deepcopy(_of(docs, "LeaderWorkerSet")[0])
    doc["spec"]["leaderWorkerTemplate"]["restartPolicy"] = "Sometimes"
    with pytest.raises(AssertionError, match="Sometimes"):
        validate(doc, crd_validators)


def test_node_labels_become_a_class_snapshot() -> None:
    doc = json.loads(NODES_MIXED.read_text())
    classes, warnings = node_classes(doc, "0.33.0")
    by = {c.product: c for c in classes}
    assert set(by) == {"NVIDIA-A800-80GB-PCIe", "NVIDIA-GeForce-RTX-4090", "NVIDIA-GeForce-RTX-3060"}
    a800 = by["NVIDIA-A800-80GB-PCIe"]
    assert a800.nodes == ("gpu-a800-1", "gpu-a800-2") and a800.gpu_count == 4
    g = a800.snapshot.gpus
    assert [x.name for x in g] == ["NVIDIA A800 80GB PCIe"] * 4  # the NVML name, for the profile rules
    assert g[0].memory_total_bytes == 81920 * 2**20 and g[0].compute_capability == "8.0"
    assert not a800.snapshot.gpu_links and not g[0].nvlink_active_links  # PCIe board: no NVLink assumed
    assert a800.snapshot.cpu.logical_cpus == 112 and a800.snapshot.driver.version == "550.107.02"
    assert a800.snapshot.software.vllm_version == "0.33.0"
    # an SXM board: NVLink between every pair, as the datasheet says, and said to be assumed
    h100 = copy.deepcopy(doc["items"][1])
    labels = h100["metadata"]["labels"]
    labels.update(
        {
            "nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3",
            "nvidia.com/gpu.count": "8",
            "nvidia.com/gpu.memory": "81559",
        }
    )
    del labels["nvidia.com/gpu.compute.major"], labels["nvidia.com/gpu.compute.minor"]
    h100["status"]["allocatable"]["nvidia.com/gpu"] = "7"  # one GPU unhealthy: 7 schedulable
    mig = copy.deepcopy(doc["items"][1])
    mig["metadata"]["labels"]["nvidia.com/gpu.product"] = "NVIDIA-A100-SXM4-40GB-MIG-1g.5gb"
    shared = copy.deepcopy(doc["items"][1])
    shared["metadata"]["labels"]["nvidia.com/gpu.sharing-strategy"] = "time-slicing"
    classes, warnings = node_classes({"kind": "List", "items": [h100, mig, shared]}, "0.33.0")
    (h,) = classes
    assert h.gpu_count == 7 and h.snapshot.gpus[0].compute_capability == "9.0"
    assert all(lk.link.startswith("NV") for lk in h.snapshot.gpu_links) and len(h.snapshot.gpu_links) == 21
    assert any("NVLink between every pair" in a for a in h.assumed)
    assert any("from the datasheet" in a for a in h.assumed)
    assert len(warnings) == 3 and "7 of its 8 GPUs allocatable" in warnings[0]
    assert "MIG" in warnings[1] and "time-slicing" in warnings[2]


def test_malformed_nodes_are_left_out_not_crashed_on() -> None:
    good = json.loads(NODES_MIXED.read_text())["items"][3]  # ws-4090
    junk: list[Any] = [
        "a string",
        7,
        None,
        {"metadata": []},
        {"metadata": {"labels": "x"}},
        {"metadata": {"name": 5, "labels": {"nvidia.com/gpu.product": ["list"]}}},
        {
            "metadata": {
                "labels": {
                    "nvidia.com/gpu.product": "NVIDIA-GeForce-RTX-4090",
                    "nvidia.com/gpu.memory": "24564",
                    "nvidia.com/gpu.count": "99999",
                }
            },
            "status": {"capacity": [], "allocatable": "4"},
        },
    ]
    classes, warnings = node_classes({"items": [*junk, good]}, "0.33.0")
    assert [c.nodes for c in classes] == [("ws-4090",)]
    assert any("not a valid label value" in w for w in warnings)
    assert any("no allocatable" in w for w in warnings)
    with pytest.raises(ValueError, match="items"):
        node_classes(["not", "a", "list", "document"], "0.33.0")


def test_pod_view_numbers_the_pods_gpus_from_zero(host_of, clean_env) -> None:
    host = host_of("a800-pcie-4x-2numa")
    view = pod_view(host, (2, 3))
    assert [g.index for g in view.gpus] == [0, 1]
    assert [g.pci_device_id for g in view.gpus] == [host.gpus[2].pci_device_id, host.gpus[3].pci_device_id]
    assert all(g.uuid is None and g.minor_number is None for g in view.gpus) and not view.numa_nodes
    assert all({lk.a, lk.b} <= {0, 1} for lk in view.gpu_links)


def test_cli_output_file_and_refusals(snapshot, empty_root, capsys, tmp_path) -> None:
    snap = snapshot("rtx4090-1x")
    out = tmp_path / "out"
    assert (
        main(
            [
                "render",
                "--format",
                "k8s",
                "--from",
                snap,
                "--config-root",
                str(empty_root),
                "--output",
                str(out),
                "--image",
                "registry.example/hwprofile-vllm:v0.32.0",
                "--namespace",
                "llm",
                "--vllm-version",
                "0.32.0",
            ]
        )
        == 0
    )
    capsys.readouterr()
    docs = list(yaml.safe_load_all((out / "hwprofile.k8s.yaml").read_text()))
    assert {d["metadata"]["namespace"] for d in docs} == {"llm"}
    (dep,) = _of(docs, "Deployment")
    assert (
        dep["spec"]["template"]["spec"]["containers"][0]["image"] == "registry.example/hwprofile-vllm:v0.32.0"
    )
    assert main(["render", "--format", "k8s", "--from", snap, "--nodes", str(NODES_MIXED)]) == 2
    assert main(["render", "--format", "argv", "--from", snap, "--nodes", str(NODES_MIXED)]) == 2
    assert main(["render", "--format", "k8s", "--from", snap, "--check"]) == 2
    with pytest.raises(SystemExit):
        main(["render", "--format", "k8s", "--from", snap, "--namespace", "Not_A_Name"])
    capsys.readouterr()


def test_the_router_in_front_of_a_mixed_cluster(empty_root, capsys, clean_env, crd_validators) -> None:
    """--router-image: vLLM's router (a Deployment of one pod and its Service) in front of every
    workload's Service, its argv the one hwprofile renders (cache_aware, /health checks), no API key."""
    docs, text, _ = render(
        capsys,
        "--nodes",
        str(NODES_MIXED),
        "--config-root",
        str(empty_root),
        "--vllm-version",
        "0.33.0",
        "--router-image",
        "example.org/vllm-router:0.1.17",
    )
    router = next(d for d in _of(docs, "Deployment") if d["metadata"]["name"] == "hwprofile-router")
    (svc,) = [d for d in _of(docs, "Service") if d["metadata"]["name"] == "hwprofile-router"]
    workloads = [d for d in _of(docs, "Service") if d["metadata"]["name"] != "hwprofile-router"]
    assert len(workloads) == 2 and len(docs) == 10
    (c,) = router["spec"]["template"]["spec"]["containers"]
    assert c["image"] == "example.org/vllm-router:0.1.17" and c["command"] == ["vllm-router"]
    args = c["args"]
    w = args.index("--worker-urls")
    urls = args[w + 1 : w + 3]
    assert sorted(urls) == sorted(
        f"http://{s['metadata']['name']}:{s['spec']['ports'][0]['port']}" for s in workloads
    )
    assert args[args.index("--policy") + 1] == "cache_aware" and args[args.index("--host") + 1] == "0.0.0.0"
    assert "--api-key" not in args and "cache_aware" in text
    assert svc["spec"]["selector"] == router["spec"]["selector"]["matchLabels"]
    assert svc["spec"]["ports"][0]["port"] == int(args[args.index("--port") + 1])
    for d in docs:
        validate(d, crd_validators)
    plain, _, _ = render(
        capsys, "--nodes", str(NODES_MIXED), "--config-root", str(empty_root), "--vllm-version", "0.33.0"
    )
    assert not [d for d in plain if d["metadata"]["name"] == "hwprofile-router"]
