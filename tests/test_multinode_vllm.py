"""A model over two nodes, for real: vLLM CPU 0.32 as a two-node group on this one machine (node 0
with the API server, node 1 ``--headless``, tensor parallel 2 over gloo on 127.0.0.1), planned from
two snapshots of this host in an inventory and launched through hwprofile, one ``launch --node-rank
K`` per node with its own runtime directory, as two hosts would run it. The group answers
completions at node 0; each node's status shows its part; the headless node's process is killed
and the group comes back by itself (no client request needed: hwprofile's probe makes node 0 find its
member gone; see supervise/group.py); both stop cleanly."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
import runcli
from vllmtools import free_port

pytestmark = [pytest.mark.slow(minutes=3.5), pytest.mark.multi_rank]

READY = 480
OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def hw(env: dict[str, str], *args: str, timeout: float = READY + 60) -> subprocess.CompletedProcess[str]:
    return runcli.hwprofile(*args, env=env, timeout=timeout)


def status(env: dict[str, str]) -> dict:
    return json.loads(hw(env, "status", "--json", timeout=60).stdout)


def wait(pred, what: str, timeout: float = READY, why=None):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        got = pred()
        if got:
            return got
        time.sleep(1)
    raise AssertionError(f"timed out waiting for {what}" + (f":\n{why()}" if why else ""))


def complete(url: str, model: str) -> str:
    body = json.dumps({"model": model, "prompt": "one two three", "max_tokens": 4, "temperature": 0}).encode()
    req = urllib.request.Request(url + "/v1/completions", body, {"Content-Type": "application/json"})
    with OPENER.open(req, timeout=180) as r:
        return json.loads(r.read())["choices"][0]["text"]


def test_a_two_node_group_through_hwprofile(tiny, tmp_path) -> None:
    base = {k: v for k, v in os.environ.items() if not k.startswith(("HWPROFILE_", "FAKE_NVML"))}
    (tmp_path / "etc").mkdir()
    snap = tmp_path / "host.json"
    got = hw({**base, "HWPROFILE_CONFIG_ROOT": str(tmp_path / "etc")}, "detect", "--json", timeout=120)
    assert got.returncode == 0, got.stderr
    snap.write_text(got.stdout)
    inv = tmp_path / "nodes.yaml"
    inv.write_text(
        f"nodes:\n  - {{snapshot: {snap}, address: 127.0.0.1}}\n  - {{snapshot: {snap}, address: 127.0.0.1}}\n"
    )
    port = free_port()
    sets = [
        "layout.tensor_parallel_size=2",
        f"layout.master_port={free_port()}",
        "speculative.method=none",
        "cpu.kv_cache_space_gib=0.0625",
        "engine.max_model_len=512",
        "engine.enforce_eager=true",
        f"server.port={port}",
        "server.shutdown_timeout=5",
        "supervise.backoff_initial=0.5",
        f"logs.dir={tmp_path / 'logs'}",
    ]
    args = ["--model", str(tiny), "--inventory", str(inv), *[f"--set={s}" for s in sets]]
    envs = [
        {
            **base,
            "HWPROFILE_RUNTIME_DIR": str(tmp_path / f"rt{k}"),
            "HWPROFILE_CONFIG_ROOT": str(tmp_path / "etc"),
        }
        for k in (0, 1)
    ]
    t0 = time.monotonic()
    # node 1 first (it waits for node 0 to form the group); each launch returns once its node is ready
    ups = [
        subprocess.Popen(
            [sys.executable, "-m", "hwprofile", "launch", "--node-rank", str(k), *args],
            env=envs[k],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for k in (1, 0)
    ]
    outs = [p.communicate(timeout=READY + 60)[0] for p in ups]
    try:
        assert [p.returncode for p in ups] == [0, 0], outs
        started = time.monotonic() - t0
        s0, s1 = status(envs[0]), status(envs[1])
        (i0,), (i1,) = s0["instances"], s1["instances"]
        assert (i0["name"], i1["name"]) == ("vllm-cpu-node0", "vllm-cpu-node1")
        assert i0["node"] == "0 of 2 (the group's API server)" and i1["node"].startswith("1 of 2 (headless")
        assert "--headless" in i1["argv"] and "--headless" not in i0["argv"]
        url = s0["endpoint"]["url"]
        assert url == f"http://127.0.0.1:{port}" == i1["url"]
        t1 = time.monotonic()
        assert complete(url, str(tiny))
        first_request = time.monotonic() - t1
        # the headless node's vLLM dies: nobody sends a request, the group must come back by itself
        os.killpg(i1["pid"], signal.SIGKILL)
        t2 = time.monotonic()

        def both_ready_again():
            a, b = status(envs[0])["instances"][0], status(envs[1])["instances"][0]
            return a["state"] == b["state"] == "ready" and a["restarts"] >= 1 and b["rejoins"] >= 1 and (a, b)

        a, b = wait(
            both_ready_again,
            "the group formed again",
            why=lambda: hw(envs[1], "status").stdout + hw(envs[0], "status").stdout,
        )
        recovered = time.monotonic() - t2
        assert (
            "exit code 0" in a["failure"]["evidence"]
        )  # node 0's API server exits once its engine finds out
        log1 = Path(b["log_file"]).read_text()
        assert "probe of node 0" in log1 and "HTTP 500" in log1
        assert complete(url, str(tiny))
        print(
            f"\ntwo-node group (TP 2 over gloo): ready {started:.0f} s after launch, first completion "
            f"{first_request:.1f} s; headless node killed: ready again {recovered:.0f} s later"
        )
    finally:
        pids = []
        for env in envs:
            with contextlib.suppress(KeyError, IndexError, ValueError):
                pids.append(status(env)["instances"][0]["pid"])
        downs = [hw(env, "stop", timeout=180) for env in envs]
    assert [d.returncode for d in downs] == [0, 0], [d.stderr for d in downs]
    assert not any(Path(f"/proc/{p}").exists() for p in pids if p)
