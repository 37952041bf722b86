"""vLLM's router in front of separate servers: the plan's choice (layout.front) and its reasons, the
router's argv rendered from the plan, and the supervisor running the real ``vllm-router`` in front of
two fake vLLM servers: ready once a server is, a request through the one URL answered, restarted when
killed, stopped with the servers; ``status`` shows it; a start without the router is refused."""

from __future__ import annotations

import json
import os
import shutil
import signal
import sys
import tempfile
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from vllmtools import fake_model, fake_vllm_shim, free_ports
from waiting import wait_for

from hwprofile.config.settings import Logs, Supervise
from hwprofile.launch.start import Launch, Refused, preflight
from hwprofile.launch.status import format_status, status
from hwprofile.pipeline import PlanInputs
from hwprofile.render.output import UnsafeValue, render_nginx
from hwprofile.render.router import render_router
from hwprofile.supervise.options import Options
from hwprofile.supervise.runfiles import LAST_FILE, STATE_FILE
from hwprofile.supervise.supervisor import Supervisor

ROUTER = shutil.which("vllm-router") or str(Path(sys.executable).parent / "vllm-router")


def need_router() -> str:
    if Path(ROUTER).is_file():
        return ROUTER
    msg = "vLLM's router is not installed: pip install vllm-router (the 'router' extra)"
    if os.environ.get("CI"):
        pytest.fail(msg)
    pytest.skip(msg)


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    from hwprofile.host.detect import detect_host
    from hwprofile.render.versions import release

    base = tmp_path_factory.mktemp("fake")
    return {
        "model": fake_model(base / "model"),
        "shim": fake_vllm_shim(base / "vllm"),
        "host": detect_host(),
        "release": release("0.32.0"),
    }


@pytest.fixture
def rt() -> Iterator[Path]:
    d = Path(tempfile.mkdtemp(prefix="hwpr-", dir="/tmp"))
    yield d
    shutil.rmtree(d, ignore_errors=True)


def inputs(world: dict[str, Any], rt: Path, router: str | None, *extra: str) -> PlanInputs:
    (rt / "etc").mkdir(exist_ok=True)
    host = world["host"]._replace(software=world["host"].software._replace(router_path=router))
    base = free_ports(2)
    front = free_ports(2)  # the router's port and its metrics port after it
    sets = (
        "engine.max_model_len=512",
        "cpu.kv_cache_space_gib=0.0625",
        "speculative.method=none",
        "server.shutdown_timeout=2",
        f"server.port={base}",
        f"server.vllm_command={world['shim']}",
        "layout.replicas=2",
        "layout.shape=servers",
        f"layout.endpoint_port={front}",
        *extra,
    )
    return PlanInputs(host, str(rt / "etc"), sets=sets, model=str(world["model"]))


def test_the_plan_says_which_front_and_why(world, rt) -> None:
    routed = inputs(world, rt, "/opt/r/bin/vllm-router").replan()
    ep = routed.endpoint
    assert (ep.via, ep.policy, ep.instances) == ("router", "cache_aware", ("vllm-cpu0", "vllm-cpu1"))
    why = {r.key: r.reason for r in routed.reasons}
    assert "vLLM's router is installed (/opt/r/bin/vllm-router)" in why["layout.front"]
    assert "prefix cache" in why["router.policy"] and "least connections" in why["router.policy"]
    assert routed.to_json()["endpoint"]["policy"] == "cache_aware"
    # not installed: nginx, and the reason says how to get the router
    plain = inputs(world, rt, None).replan()
    assert (
        plain.endpoint.via == "nginx"
        and "pip install vllm-router" in {r.key: r.reason for r in plain.reasons}["layout.front"]
    )
    assert "policy" not in plain.to_json()["endpoint"]
    # the operator's choice wins either way
    assert inputs(world, rt, "/opt/r/bin/vllm-router", "layout.front=nginx").replan().endpoint.via == "nginx"
    forced = inputs(world, rt, None, "layout.front=router").replan()
    assert forced.endpoint.via == "router"
    assert "not installed on the planning host" in {r.key: r.reason for r in forced.reasons}["layout.front"]
    with pytest.raises(UnsafeValue, match="needs no nginx"):
        render_nginx(routed)


def test_the_router_argv_comes_from_the_plan(world, rt) -> None:
    p = inputs(world, rt, "/r/vllm-router").replan()
    argv = render_router(p, "/r/vllm-router")
    port = int(p.endpoint.url.rsplit(":", 1)[1])
    urls = [f"http://127.0.0.1:{i.server.port}" for i in p.instances]
    assert argv[0] == "/r/vllm-router"
    assert argv[argv.index("--host") + 1] == "127.0.0.1" and argv[argv.index("--port") + 1] == str(port)
    w = argv.index("--worker-urls")
    assert argv[w + 1 : w + 3] == urls
    assert argv[argv.index("--policy") + 1] == "cache_aware"
    assert argv[argv.index("--prometheus-port") + 1] == str(port + 1)
    assert argv[argv.index("--prometheus-host") + 1] == "127.0.0.1"
    assert argv[argv.index("--health-check-endpoint") + 1] == "/health"
    assert "--api-key" not in argv  # the key stays with vLLM (server.api_key_env); never on an argv
    told = inputs(world, rt, "/r/vllm-router", "server.host=10.1.2.3").replan()
    assert render_router(told)[render_router(told).index("--host") + 1] == "10.1.2.3"
    with pytest.raises(UnsafeValue, match="cannot be given to vLLM's router"):
        render_router(inputs(world, rt, "/r/vllm-router", "server.host=a;b").replan())
    with pytest.raises(UnsafeValue, match="needs no router"):
        render_router(inputs(world, rt, None).replan())


def test_a_start_without_the_router_is_refused(world, rt) -> None:
    i = inputs(world, rt, None, "layout.front=router")
    launch = Launch(i.replan(), world["release"], str(world["shim"]), None, None, rt / "run", i)
    with pytest.raises(Refused, match="pip install vllm-router"):
        preflight(launch)


def _ask(url: str, model: str) -> int:
    body = json.dumps({"model": model, "prompt": "a b c", "max_tokens": 2}).encode()
    req = urllib.request.Request(url + "/v1/completions", body, {"Content-Type": "application/json"})
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    with opener.open(req, timeout=30) as r:
        return r.status


def test_the_supervisor_runs_restarts_and_stops_the_router(world, rt, monkeypatch) -> None:
    router = need_router()
    for k in list(os.environ):
        if k.lower() in ("http_proxy", "https_proxy", "all_proxy", "no_proxy"):
            monkeypatch.delenv(k)
    monkeypatch.setenv("FAKEVLLM_READY_DELAY", "0.2")
    i = inputs(world, rt, router)
    plan = i.replan()
    supervise = Supervise(
        ready_timeout=60, backoff_initial=0.1, backoff_max=1.0, stop_margin=3.0, retry_failed_s=0.0
    )
    opts = Options.from_settings(supervise, Logs(), rt / "run", rt / "logs", poll_interval=0.1)
    sup = Supervisor(plan, world["release"], "/nonexistent/vllm", None, opts, router=router)
    assert sup.front is not None
    sup.start()
    try:
        assert sup.wait_ready(120), [(x.name, x.state) for x in sup.instances] + [sup.front.state]
        assert _ask(plan.endpoint.url, str(world["model"])) == 200
        st = status(rt / "run")
        front = st["front"]
        assert front["state"] == "ready" and front["servers"] == 2 and front["healthy_servers"] >= 1
        first = front["pid"]
        assert first and Path(front["log_file"]).is_file()
        text = format_status(st)
        assert f"clients: {plan.endpoint.url} (vLLM's router, cache_aware" in text
        assert f"vllm-router: ready, pid {first}" in text
        os.kill(first, signal.SIGKILL)  # the router dies: the supervisor starts it again
        wait_for(
            lambda: sup.front.restarts == 1 and sup.front.state == "ready" and sup.front.proc is not None,
            "the router started again and ready",
        )
        assert sup.front.proc.pid != first
        assert _ask(plan.endpoint.url, str(world["model"])) == 200
        assert status(rt / "run")["front"]["restarts"] == 1
        second = sup.front.proc.pid
    finally:
        sup.stop()
        sup.wait(60)
        sup.close()
    assert sup.front.state == "stopped" and not sup.front.thread.is_alive()
    assert (
        not Path(f"/proc/{second}").exists() or b"router" not in Path(f"/proc/{second}/cmdline").read_bytes()
    )
    assert not (rt / "run" / STATE_FILE).exists()
    last = json.loads((rt / "run" / LAST_FILE).read_text())
    assert last["front"]["state"] == "stopped" and last["front"]["pid"] is None
