"""Shape: a host's instances as separate servers, or as one data-parallel vLLM server; and the one URL
clients use either way.

Separate servers (one per GPU group): a fault or a degrade restarts one group while the others serve;
their one URL is nginx in front of them (``hwprofile render --format nginx``; least connections,
a server that fails is skipped), not anything hwprofile proxies itself. One data-parallel server
(``--data-parallel-size N``, vLLM 0.8.3+): one API server, vLLM balances the ranks (its internal load
balancing), its own URL is the one; a degrade restarts every rank. ``layout.shape=auto`` takes data
parallel unless the plan or the release rules it out, each reason said:

- the groups differ (GPU model, tensor parallel size, engine settings): ranks are identical copies;
- the plan uses ``speculative.by_batch_size``: vLLM drops the k-by-batch-size table when
  ``data_parallel_size > 1`` (config/vllm.py, 0.25+: "static k" warning), and the table is the tuning;
- the release has no ``--data-parallel-size`` (before 0.8.3);
- the ranks sit on several NUMA nodes that are bound and the release cannot bind each rank to its node
  (``--numa-bind-nodes`` is 0.20+): one numactl cannot bind two ranks to two nodes.

Pure: instances in, instances and the endpoint out, reasons attached.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from ..config.settings import Settings
from ..host.snapshot import HostSnapshot
from ..release import first_with, release_of
from .context import PlanContext
from .refusal import PlanRefused
from .types import ABSENT, AbsentT, Endpoint, InstancePlan


def why_not_data_parallel(host: HostSnapshot, settings: Settings, instances: list[InstancePlan]) -> list[str]:
    """Every reason these instances cannot be one data-parallel server (none: they can)."""
    out: list[str] = []
    first = instances[0]
    same = all(
        i.device == first.device
        and i.gpu_name == first.gpu_name
        and i.tensor_parallel_size == first.tensor_parallel_size
        and i.pipeline_parallel_size == first.pipeline_parallel_size
        and i.engine == first.engine
        and i.speculative == first.speculative
        for i in instances[1:]
    )
    if not same:
        out.append(
            "the groups differ (GPU model, tensor parallel size or engine settings); ranks are identical"
        )
    if any(i.speculative and i.speculative.num_speculative_tokens_per_batch_size for i in instances):
        out.append(
            "speculative.by_batch_size is set, and vLLM drops the k-by-batch-size table when "
            "data_parallel_size > 1 (a static k instead)"
        )
    rel = release_of(host.software.vllm_version)
    if not rel.data_parallel():
        out.append(
            f"vLLM {host.software.vllm_version} has no --data-parallel-size ({first_with('--data-parallel-size')}+)"
        )
    nodes = {n for i in instances for n in (i.gpu_numa_nodes or ()) if n is not None}
    if len(nodes) > 1 and not rel.numa_bind_nodes():
        out.append(
            f"the ranks are on NUMA nodes {sorted(nodes)} and vLLM {host.software.vllm_version} cannot bind "
            f"each rank to its own node (--numa-bind-nodes is {first_with('--numa-bind-nodes')}+)"
        )
    return out


def shape(ctx: PlanContext, instances: list[InstancePlan]) -> tuple[list[InstancePlan], Endpoint]:
    """The instances as planned (``servers``) or merged into one data-parallel instance, and the
    endpoint clients use."""
    host, settings = ctx.host, ctx.settings
    want = settings.layout.shape
    src = ("layout", "shape")
    if len(instances) < 2:
        return instances, _own(instances[0], "one server: its own URL")
    against = why_not_data_parallel(host, settings, instances)
    if want == "servers" or (want == "auto" and against):
        why = (
            "layout.shape=servers"
            if want == "servers"
            else "not one data-parallel server: " + "; ".join(against)
        )
        ctx.add("layout.shape", "servers", f"{len(instances)} separate servers (fault isolation): {why}", src)
        return instances, _front(ctx, instances)
    if want == "data_parallel" and against:
        fixable = [a for a in against if a.startswith("speculative.by_batch_size")]
        if len(fixable) != len(against):
            raise PlanRefused(
                "layout.shape=data_parallel: these groups cannot be one data-parallel server: "
                + "; ".join(a for a in against if a not in fixable),
                ["--set layout.shape=servers (separate servers, one URL through nginx)"],
            )
        ctx.warn("speculative.by_batch_size dropped: vLLM ignores it with data_parallel_size > 1 (static k)")
        instances = [_static_k(i) for i in instances]
    merged = merge(instances)
    ctx.add(
        "layout.shape",
        "data_parallel",
        f"one data-parallel server of {merged.ranks} ranks x TP {merged.tensor_parallel_size}: one URL, vLLM "
        "balances the ranks; a degrade restarts every rank",
        src,
    )
    return [merged], _own(merged, f"one API server in front of {merged.ranks} data-parallel ranks")


def merge(instances: list[InstancePlan]) -> InstancePlan:
    """One instance whose ranks are ``instances`` (identical but for their GPUs), on the first's port."""
    first = instances[0]
    gpus = tuple(g for i in instances for g in i.gpus)

    def joined(field: str) -> Any:  # a tuple, or ABSENT where an instance's is
        parts = [getattr(i, field) for i in instances]
        return ABSENT if any(p is ABSENT for p in parts) else tuple(x for p in parts for x in p)

    nodes = {i.numa_node for i in instances}
    one = next(iter(nodes)) if len(nodes) == 1 else None
    return dataclasses.replace(
        first,
        name="vllm-dp-gpu" + "-".join(str(g) for g in gpus)
        if first.device == "cuda"
        else f"vllm-cpu-dp{len(instances)}",
        gpus=gpus,
        gpu_uuids=joined("gpu_uuids"),
        gpu_minors=joined("gpu_minors"),
        gpu_numa_nodes=joined("gpu_numa_nodes"),
        numa_node=one,
        cpus=first.cpus if one is not None else None,
        data_parallel_size=len(instances),
        omp_threads_bind=_joined_omp(instances),
    )


def _joined_omp(instances: list[InstancePlan]) -> str | AbsentT:
    """The ranks' OpenMP bindings as one server takes them: one CPU list per rank, joined by |."""
    parts = [i.omp_threads_bind for i in instances]
    if any(p is ABSENT for p in parts):
        return ABSENT
    return "nobind" if "nobind" in parts else "|".join(str(p) for p in parts)


def _static_k(i: InstancePlan) -> InstancePlan:
    if not i.speculative or not i.speculative.num_speculative_tokens_per_batch_size:
        return i
    return dataclasses.replace(
        i, speculative=dataclasses.replace(i.speculative, num_speculative_tokens_per_batch_size=ABSENT)
    )


def _url(host: str, port: int) -> str:
    h = "127.0.0.1" if host in ("0.0.0.0", "", "::") else host
    return f"http://{h}:{port}"


def _own(inst: InstancePlan, how: str) -> Endpoint:
    return Endpoint(_url(inst.server.host, inst.server.port), "vllm", (inst.name,), how)


ROUTER_POLICY = "cache_aware"


def _router(ctx: PlanContext, names: tuple[str, ...], taken: set[int]) -> Endpoint:
    """vLLM's router in front of the servers ``names`` (their ports ``taken``), supervised by hwprofile."""
    settings = ctx.settings
    port = settings.layout.endpoint_port
    want = settings.layout.front
    found = ctx.host.software.router_path
    src = ("layout", "front")
    why = (
        "layout.front=router"
        if want == "router"
        else f"layout.front=auto and vLLM's router is installed ({found})"
    )
    if want == "router" and not found:
        why += " (not installed on the planning host: pip install vllm-router where it runs)"
    if port + 1 in taken or port + 1 > 65_535:
        raise PlanRefused(
            f"vLLM's router serves its metrics on layout.endpoint_port + 1 ({port + 1}), which is taken",
            [f"--set layout.endpoint_port={max(taken) + 1}", "--set layout.front=nginx"],
        )
    ctx.add(
        "layout.front",
        "router",
        f"vLLM's router in front of the servers, started and supervised by hwprofile: {why}",
        src,
    )
    ctx.add(
        "layout.endpoint_port",
        port,
        f"the one port of vLLM's router in front of the servers (its metrics: {port + 1}, loopback)",
        ("layout", "endpoint_port"),
    )
    ctx.add(
        "router.policy",
        ROUTER_POLICY,
        "cache_aware: each request goes to the server whose prefix cache already holds the longest part of "
        "its prompt (a conversation's next turn, a shared system prompt), unless the servers' loads drift "
        "apart, then to the least loaded; least connections would scatter a conversation's turns and "
        "recompute their prefix on each server",
        src,
    )
    return Endpoint(
        _url(settings.server.host, port),
        "router",
        names,
        f"vLLM's router ({ROUTER_POLICY}) in front of the servers, supervised by hwprofile with them; one "
        "that fails its health checks is skipped and retried (circuit breaker)",
        ROUTER_POLICY,
    )


def _front(ctx: PlanContext, instances: list[InstancePlan]) -> Endpoint:
    """The one URL in front of separate servers: vLLM's router where ``layout.front`` says so or,
    with ``auto``, where it is installed (``host.software.router_path``); else nginx."""
    host, settings = ctx.host, ctx.settings
    port = settings.layout.endpoint_port
    taken = {i.server.port for i in instances}
    if port in taken:
        raise PlanRefused(
            f"layout.endpoint_port {port} is one of the instances' ports {sorted(taken)}",
            [f"--set layout.endpoint_port={max(taken) + 1}"],
        )
    want = settings.layout.front
    if want == "router" or (want == "auto" and host.software.router_path):
        return _router(ctx, tuple(i.name for i in instances), taken)
    why = (
        "layout.front=nginx"
        if want == "nginx"
        else "layout.front=auto and vLLM's router is not installed (pip install vllm-router)"
    )
    ctx.add("layout.front", "nginx", f"nginx in front of the servers: {why}", ("layout", "front"))
    return _nginx(ctx, instances)


def _nginx(ctx: PlanContext, instances: list[InstancePlan]) -> Endpoint:
    settings = ctx.settings
    port = settings.layout.endpoint_port
    taken = {i.server.port for i in instances}
    if port in taken:
        raise PlanRefused(
            f"layout.endpoint_port {port} is one of the instances' ports {sorted(taken)}",
            [f"--set layout.endpoint_port={max(taken) + 1}"],
        )
    ctx.add(
        "layout.endpoint_port",
        port,
        "the one port of nginx in front of the servers",
        ("layout", "endpoint_port"),
    )
    return Endpoint(
        _url(settings.server.host, port),
        "nginx",
        tuple(i.name for i in instances),
        "nginx in front of the servers (least connections; one that fails or restarts is skipped): "
        "hwprofile render --format nginx --output /etc/nginx/conf.d (hwprofile.nginx.conf), then nginx -s reload",
    )
