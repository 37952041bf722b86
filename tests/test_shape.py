"""One URL per host: the shape the planner chooses for a host's GPU groups (separate servers, or one
data-parallel vLLM server), its reasons, the render of each, and nginx (the real one, Debian's
package) in front of separate servers, tested against two fake vLLM servers."""

from __future__ import annotations

import json
import subprocess
import time
import urllib.request

import pytest
from system import need
from vllmtools import fake_model, fake_vllm_shim, free_port, free_ports

from hwprofile.pipeline import make_plan
from hwprofile.plan import PlanRefused
from hwprofile.render.output import render_nginx
from hwprofile.render.translate import Unrenderable, render_instance
from hwprofile.render.versions import release

MODEL = "Qwen/Qwen2.5-32B-Instruct"


def plan(host_of, root, name="a800-pcie-4x-2numa", version="0.32.0", sets=()):
    host = host_of(name)
    host = host._replace(software=host.software._replace(vllm_version=version))
    # the operator's TP 2 pairs (this host's shipped numa_pairs layout gives way to a faster 4 x TP 1)
    return make_plan(host, root, environ={}, model=MODEL, sets=["layout.tensor_parallel_size=2", *sets])


def shape_reason(p) -> str:
    return next(r.reason for r in p.reasons if r.key == "layout.shape")


def test_the_seed_host_runs_two_servers_behind_one_url(host_of, empty_root) -> None:
    """The A800 profile's k-by-batch-size table is the reason: vLLM drops it with data parallel."""
    p = plan(host_of, empty_root)
    assert [(i.name, i.server.port, i.ranks) for i in p.instances] == [
        ("vllm-gpu0-1", 8000, 1),
        ("vllm-gpu2-3", 8001, 1),
    ]
    assert "drops the k-by-batch-size table" in shape_reason(p)
    assert (p.endpoint.url, p.endpoint.via, p.endpoint.instances) == (
        "http://127.0.0.1:8080",
        "nginx",
        ("vllm-gpu0-1", "vllm-gpu2-3"),
    )
    j = p.to_json()
    assert j["endpoint"]["url"] == "http://127.0.0.1:8080" and "render --format nginx" in j["endpoint"]["how"]


def test_without_the_table_the_host_is_one_data_parallel_server(host_of, empty_root) -> None:
    p = plan(host_of, empty_root, sets=["speculative.method=none"])
    (dp,) = p.instances
    assert (
        dp.ranks == 2 and dp.tensor_parallel_size == 2 and dp.gpus == (0, 1, 2, 3) and dp.server.port == 8000
    )
    assert dp.gpu_numa_nodes == (0, 0, 1, 1) and dp.numa_node is None
    assert p.endpoint.url == "http://127.0.0.1:8000" and p.endpoint.via == "vllm"
    argv = render_instance(p, dp, release("0.32.0"), "vllm", "/usr/bin/numactl").argv
    assert argv[argv.index("--data-parallel-size") + 1] == "2"
    assert argv[argv.index("--numa-bind-nodes") + 1 : argv.index("--numa-bind-nodes") + 5] == [
        "0",
        "0",
        "1",
        "1",
    ]
    with pytest.raises(Unrenderable, match="no --data-parallel-size"):
        render_instance(p, dp, release("0.6.3"), "vllm", None)


def test_releases_that_cannot_bind_each_rank_keep_separate_servers(host_of, empty_root) -> None:
    p = plan(host_of, empty_root, version="0.15.0", sets=["speculative.method=none"])
    assert len(p.instances) == 2 and "--numa-bind-nodes is 0.20+" in shape_reason(p)
    old = plan(host_of, empty_root, version="0.8.2", sets=["speculative.method=none"])
    assert len(old.instances) == 2 and "no --data-parallel-size" in shape_reason(old)


def test_forced_shapes(host_of, empty_root) -> None:
    dp = plan(host_of, empty_root, sets=["layout.shape=data_parallel"])
    (inst,) = dp.instances
    assert inst.ranks == 2 and inst.speculative and not inst.speculative.num_speculative_tokens_per_batch_size
    assert any("by_batch_size dropped" in w for w in dp.warnings)
    servers = plan(host_of, empty_root, sets=["speculative.method=none", "layout.shape=servers"])
    assert len(servers.instances) == 2 and shape_reason(servers).endswith("layout.shape=servers")
    with pytest.raises(PlanRefused, match="cannot be one data-parallel server"):
        plan(host_of, empty_root, version="0.8.2", sets=["layout.shape=data_parallel"])
    with pytest.raises(PlanRefused, match="endpoint_port 8001 is one of the instances' ports"):
        plan(host_of, empty_root, sets=["layout.endpoint_port=8001"])


def test_cpu_replicas_as_servers_or_data_parallel(host_of, empty_root, tmp_path) -> None:
    model = fake_model(tmp_path / "m")
    host = host_of("no-driver")
    two = make_plan(
        host,
        empty_root,
        environ={},
        model=str(model),
        sets=["layout.replicas=2", "layout.shape=servers", "speculative.method=none"],
    )
    assert [(i.name, i.server.port) for i in two.instances] == [("vllm-cpu0", 8000), ("vllm-cpu1", 8001)]
    dp = make_plan(
        host, empty_root, environ={}, model=str(model), sets=["layout.replicas=2", "speculative.method=none"]
    )
    (inst,) = dp.instances
    assert inst.ranks == 2 and inst.device == "cpu" and inst.name == "vllm-cpu-dp2"


def test_nginx_is_rendered_only_for_separate_servers_and_refuses_hostile_hosts(host_of, empty_root) -> None:
    p = plan(host_of, empty_root)
    text = render_nginx(p)
    assert "server 127.0.0.1:8000 max_fails=1" in text and "server 127.0.0.1:8001 max_fails=1" in text
    assert "listen 127.0.0.1:8080;" in text and "least_conn;" in text
    from hwprofile.render.output import UnsafeValue

    with pytest.raises(UnsafeValue, match="needs no nginx"):
        render_nginx(plan(host_of, empty_root, sets=["speculative.method=none"]))
    with pytest.raises(UnsafeValue, match="cannot be written into an nginx configuration"):
        render_nginx(plan(host_of, empty_root, sets=["server.host=a;include/etc/shadow"]))


def test_real_nginx_gives_two_servers_one_url(host_of, empty_root, tmp_path) -> None:
    """Two fake vLLM servers on the plan's ports, Debian's nginx with the rendered conf.d file: every
    request through the one URL is answered, both servers take some, and with one server stopped the
    URL still answers (nginx skips it)."""
    nginx = need("nginx")
    model = fake_model(tmp_path / "model")
    shim = fake_vllm_shim(tmp_path / "vllm")
    base, front = free_ports(2), free_port()
    p = plan(host_of, empty_root, sets=[f"server.port={base}", f"layout.endpoint_port={front}"])
    conf = tmp_path / "nginx"
    (conf / "conf.d").mkdir(parents=True)
    (conf / "conf.d" / "hwprofile.conf").write_text(render_nginx(p))
    (conf / "nginx.conf").write_text(
        f"daemon off; pid {conf}/nginx.pid; error_log {conf}/error.log; worker_processes 1;\n"
        f"events {{ worker_connections 64; }}\n"
        f"http {{ access_log off; client_body_temp_path {conf}/tmp; proxy_temp_path {conf}/tmp;\n"
        f"  include {conf}/conf.d/*.conf; }}\n"
    )
    assert (
        subprocess.run(
            [nginx, "-t", "-p", str(conf), "-c", str(conf / "nginx.conf")], capture_output=True
        ).returncode
        == 0
    )
    servers = [
        subprocess.Popen(
            [
                str(shim),
                "serve",
                str(model),
                "--host",
                "127.0.0.1",
                "--port",
                str(base + i),
                "--fake-ready-delay",
                "0.1",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        for i in range(2)
    ]
    proxy = subprocess.Popen(
        [nginx, "-p", str(conf), "-c", str(conf / "nginx.conf")], stderr=subprocess.DEVNULL
    )
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))

    def ask() -> int:
        body = json.dumps({"model": str(model), "prompt": "a b", "max_tokens": 2}).encode()
        req = urllib.request.Request(
            p.endpoint.url + "/v1/completions", body, {"Content-Type": "application/json"}
        )
        with opener.open(req, timeout=10) as r:
            return r.status

    def healthy(port: int) -> bool:
        try:
            with opener.open(f"http://127.0.0.1:{port}/health", timeout=5) as r:
                return r.status == 200
        except OSError:
            return False

    try:
        # Both servers answer /health before the first request through nginx: one not yet listening
        # would be marked failed by nginx (max_fails) and skipped for its fail_timeout.
        end = time.monotonic() + 20
        while time.monotonic() < end and not all(healthy(base + i) for i in range(2)):
            time.sleep(0.1)
        assert all(healthy(base + i) for i in range(2)), [s.poll() for s in servers]  # exit codes, if any
        while time.monotonic() < end:
            try:
                if ask() == 200:
                    break
            except OSError:
                time.sleep(0.1)
        assert all(ask() == 200 for _ in range(8))
        metrics = [
            opener.open(f"http://127.0.0.1:{base + i}/metrics", timeout=5).read().decode() for i in range(2)
        ]
        served = [
            sum(
                float(ln.rsplit(" ", 1)[1])
                for ln in m.splitlines()
                if ln.startswith("vllm:request_success_total")
            )
            for m in metrics
        ]
        assert all(n >= 1 for n in served), served  # both servers took requests
        servers[0].terminate()
        servers[0].wait(10)
        assert all(ask() == 200 for _ in range(6))  # one stopped: the URL still answers
    finally:
        proxy.terminate()
        proxy.wait(10)
        for s in servers:
            if s.poll() is None:
                s.terminate()
                s.wait(10)
