"""Two real vLLM CPU servers on the tiny model, launched by hwprofile as separate servers: vLLM's router
(installed here) comes up in front of them, supervised, and answers through the plan's one URL; nginx,
configured by hwprofile for the same two servers, answers too; `hwprofile stop` ends the router with
the servers."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
import runcli
from vllmtools import free_ports, require_vllm
from waiting import wait_for

pytestmark = pytest.mark.slow(minutes=1.5)

READY = 600
ROUTER = Path(sys.executable).parent / "vllm-router"
OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> Path:
    require_vllm()
    if not ROUTER.is_file():
        if os.environ.get("CI"):
            pytest.fail("vllm-router is not installed: pip install -e '.[router]'")
        pytest.skip("vllm-router is not installed: pip install -e '.[router]'")
    from hwprofile.launch.tinymodel import make_tiny_model

    return make_tiny_model(tmp_path_factory.mktemp("model") / "tiny")


def hw(env: dict[str, str], *args: str, timeout: float = READY + 60) -> subprocess.CompletedProcess[str]:
    return runcli.hwprofile(*args, env=env, timeout=timeout)


def chat(url: str, model: str) -> int:
    body = json.dumps({"model": model, "prompt": "one two three", "max_tokens": 4}).encode()
    req = urllib.request.Request(url + "/v1/completions", body, {"Content-Type": "application/json"})
    with OPENER.open(req, timeout=120) as r:
        return r.status


def served(port: int) -> float:
    """Requests the vLLM server on ``port`` finished (its own counter)."""
    text = OPENER.open(f"http://127.0.0.1:{port}/metrics", timeout=30).read().decode()
    return sum(
        float(ln.rsplit(" ", 1)[1]) for ln in text.splitlines() if ln.startswith("vllm:request_success_total")
    )


def test_two_servers_behind_the_router_and_behind_nginx(tiny, tmp_path) -> None:
    base, front = free_ports(2), free_ports(4)
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith(("HWPROFILE_", "FAKE_NVML"))},
        "HWPROFILE_RUNTIME_DIR": str(tmp_path / "rt"),
        "HWPROFILE_CONFIG_ROOT": str(tmp_path / "etc"),
    }
    (tmp_path / "etc").mkdir()
    sets = [
        "layout.replicas=2",
        "layout.shape=servers",
        "speculative.method=none",
        "cpu.kv_cache_space_gib=0.0625",
        "engine.max_model_len=512",
        "engine.enforce_eager=true",
        f"server.port={base}",
        f"layout.endpoint_port={front}",
        "supervise.backoff_initial=0.5",
        f"logs.dir={tmp_path / 'logs'}",
    ]
    args = ["--model", str(tiny), *[f"--set={s}" for s in sets]]
    up = hw(env, "launch", *args)
    try:
        assert up.returncode == 0, up.stdout + up.stderr
        st = json.loads(hw(env, "status", "--json", timeout=60).stdout)
        assert st["endpoint"]["via"] == "router" and st["endpoint"]["policy"] == "cache_aware"
        url = st["endpoint"]["url"]
        assert url == f"http://127.0.0.1:{front}"
        assert st["front"]["state"] == "ready" and st["front"]["servers"] == 2, st["front"]
        router_pid = st["front"]["pid"]
        assert (
            b"router" in Path(f"/proc/{router_pid}/cmdline").read_bytes()
        )  # it retitles itself vllm::router
        assert [chat(url, str(tiny)) for _ in range(6)] == [200] * 6
        # the router's view of its servers is its last health check (a loaded machine can fail one and
        # the next passes): the status says both ready and healthy once it has seen them so
        seen: list[str] = []

        def both_healthy() -> bool:
            seen[:] = [hw(env, "status", timeout=60).stdout]
            return "vllm-router: ready" in seen[0] and "2 of 2 servers healthy" in seen[0]

        wait_for(
            both_healthy, "the router ready with 2 of 2 servers healthy", 120, lambda: seen[0], every=1.0
        )
        # nginx, as hwprofile configures it, in front of the same two servers
        from hwprofile.launch.detached import read_launch_file
        from hwprofile.plan.types import Endpoint
        from hwprofile.supervise.front import nginx_binary, nginx_front
        from hwprofile.supervise.runfiles import LAUNCH_FILE

        if nginx_binary() is None:
            if os.environ.get("CI"):
                pytest.fail("nginx is not installed")
        else:
            p = read_launch_file(tmp_path / "rt" / LAUNCH_FILE).plan
            ep = Endpoint(f"http://127.0.0.1:{front + 2}", "nginx", p.endpoint.instances, "nginx")
            before = [served(base), served(base + 1)]
            with nginx_front(dataclasses.replace(p, endpoint=ep), tmp_path / "nginx") as nurl:
                assert [chat(nurl, str(tiny)) for _ in range(6)] == [200] * 6
            after = [served(base), served(base + 1)]
            assert sum(after) - sum(before) == 6
    finally:
        down = hw(env, "stop", timeout=READY)
    assert down.returncode == 0, down.stdout + down.stderr
    end = time.monotonic() + 30
    while time.monotonic() < end and Path(f"/proc/{router_pid}").exists():
        time.sleep(0.2)
    assert (
        not Path(f"/proc/{router_pid}").exists()
        or b"router" not in Path(f"/proc/{router_pid}/cmdline").read_bytes()
    )
