"""The argv of vLLM's router (``pip install vllm-router``) in front of a plan's separate servers:
every value from the plan (formatting only). The router binds the endpoint's address (loopback
unless ``server.host`` says otherwise), balances the instances by the plan's policy, checks their
``/health`` itself and skips one that fails (circuit breaker, retries), and serves its own metrics on
loopback. No API key on its argv: vLLM checks the key (``server.api_key_env``) and the router passes a
client's ``Authorization`` header through to it."""

from __future__ import annotations

import re
import urllib.parse

from ..plan.types import Plan
from .output import UnsafeValue

ROUTER = "vllm-router"
_HOST = re.compile(r"[A-Za-z0-9._-]+|\[[0-9A-Fa-f:.]+\]")
HEALTH_INTERVAL_S = 5  # how often the router asks each server's /health
HEALTH_FAILURES = 2  # failed checks in a row before it skips a server
METRICS_OFFSET = 1  # the router's Prometheus port: the endpoint's port + 1 (the plan refuses a clash)


def _address(host: str, what: str) -> str:
    h = "127.0.0.1" if host in ("0.0.0.0", "", "::") else host
    if not _HOST.fullmatch(h):
        raise UnsafeValue(f"{what} {h!r} cannot be given to vLLM's router")
    return h


def worker_urls(plan: Plan) -> list[str]:
    """The instances' own URLs, in the endpoint's order."""
    if plan.endpoint is None:
        return []
    by_name = {i.name: i for i in plan.instances}
    return [
        f"http://{_address(by_name[n].server.host, 'server.host')}:{int(by_name[n].server.port)}"
        for n in plan.endpoint.instances
    ]


def router_argv(
    binary: str,
    host: str,
    port: int,
    workers: list[str],
    policy: str,
    startup_timeout_s: int,
    request_timeout_s: int,
    metrics_port: int,
) -> list[str]:
    """The router's argv (the benchmark and the supervisor use the same)."""
    return [
        binary,
        "--host",
        host,
        "--port",
        str(int(port)),
        "--worker-urls",
        *workers,
        "--policy",
        policy,
        "--health-check-endpoint",
        "/health",
        "--health-check-interval-secs",
        str(HEALTH_INTERVAL_S),
        "--health-failure-threshold",
        str(HEALTH_FAILURES),
        "--health-success-threshold",
        "1",
        "--worker-startup-timeout-secs",
        str(int(startup_timeout_s)),
        "--worker-startup-check-interval",
        "2",
        "--request-timeout-secs",
        str(int(request_timeout_s)),
        "--prometheus-host",
        "127.0.0.1",
        "--prometheus-port",
        str(int(metrics_port)),
        "--log-level",
        "info",
    ]


def render_router(plan: Plan, binary: str = ROUTER) -> list[str]:
    """The router's argv for ``plan``'s endpoint; :class:`UnsafeValue` when the plan has none."""
    ep = plan.endpoint
    if ep is None or ep.via != "router":
        how = ep.how if ep is not None else "no endpoint"
        raise UnsafeValue(f"this plan needs no router: its one URL is {ep.url if ep else '?'} ({how})")
    parts = urllib.parse.urlsplit(ep.url)
    port = parts.port or 80
    longest = max((int(i.server.shutdown_timeout) for i in plan.instances), default=0)
    return router_argv(
        binary,
        _address(parts.hostname or "127.0.0.1", "the endpoint's host"),
        port,
        worker_urls(plan),
        str(ep.policy),
        int(plan.supervise.ready_timeout),
        max(3600, longest),
        metrics_port(plan),
    )


def metrics_port(plan: Plan) -> int:
    """The router's own Prometheus port: the endpoint's port + 1, on loopback."""
    assert plan.endpoint is not None
    return (urllib.parse.urlsplit(plan.endpoint.url).port or 80) + METRICS_OFFSET
