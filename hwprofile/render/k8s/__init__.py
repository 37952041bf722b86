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

Three floors: :mod:`.workloads` (which pods a GPU class becomes, each re-planned as it sees
itself), :mod:`.sizes` (their resources, probes and grace periods, decided) and :mod:`.manifests`
(the YAML documents, formatted from those; nothing is computed in a template); under them
:mod:`.nodes` (the cluster's nodes as one host snapshot per GPU class, by GPU Feature Discovery's labels).
"""

from .manifests import render_k8s
from .sizes import PROBE_PERIOD_S
from .workloads import K8sError, Options, Target, Workload, snapshot_target

__all__ = ["PROBE_PERIOD_S", "K8sError", "Options", "Target", "Workload", "render_k8s", "snapshot_target"]
