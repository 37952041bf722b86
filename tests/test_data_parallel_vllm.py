"""One endpoint over several engines, for real: vLLM CPU 0.32 as one data-parallel server of two
ranks (two engine cores behind its API server) on the tiny model, launched through hwprofile: the
plan's one URL answers, both ranks report their own series, a dead rank takes the server down and
the supervisor restarts it, stop leaves nothing; and the daemon degrading it when a (fake) card heats.

How the last test joins a GPU plan to a CPU run: the daemon plans on a fake 4xA800 host (fake NVML)
with ``layout.shape=data_parallel``, so the plan is one data-parallel server of two TP-2 ranks; its
``server.vllm_command`` is a wrapper that runs the real vLLM CPU build with the plan's own
data-parallel size and batching, dropping only what a CPU cannot take (the GPU memory share, TP 2,
NUMA binding) and giving it a CPU KV size. The fake card heats, the daemon degrades the plan, the
wrapper sees the new --max-num-seqs, real vLLM starts again with it."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import runcli
from fakehost import build
from vllmtools import VLLM, free_port

pytestmark = [pytest.mark.slow(minutes=9), pytest.mark.multi_rank]

READY = 420


def hw(env: dict[str, str], *args: str, timeout: float = READY + 60) -> subprocess.CompletedProcess[str]:
    return runcli.hwprofile(*args, env=env, timeout=timeout)


def status(env: dict[str, str]) -> dict:
    return json.loads(hw(env, "status", "--json", timeout=60).stdout)


def wait(pred, what: str, timeout: float = READY):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        got = pred()
        if got:
            return got
        time.sleep(1)
    raise AssertionError(f"timed out waiting for {what}")


OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def complete(url: str, model: str) -> int:
    body = json.dumps({"model": model, "prompt": "one two three", "max_tokens": 8}).encode()
    req = urllib.request.Request(url + "/v1/completions", body, {"Content-Type": "application/json"})
    with OPENER.open(req, timeout=120) as r:
        return r.status


def ranks_of(pgid: int) -> dict[str, int]:
    """vLLM's engine-core processes of a server's group, by title (EngineCore_DP<n>)."""
    out = {}
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                fields = (d / "stat").read_text().rsplit(")", 1)[1].split()
                cmd = (d / "cmdline").read_bytes().replace(b"\0", b" ").decode()
            except OSError:
                continue
            if int(fields[2]) == pgid and cmd.startswith("VLLM::EngineCore_DP"):
                out[cmd.split()[0].split("_")[-1]] = int(d.name)
    return out


def test_a_data_parallel_server_through_hwprofile(tiny, tmp_path) -> None:
    port = free_port()
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith(("HWPROFILE_", "FAKE_NVML"))},
        "HWPROFILE_RUNTIME_DIR": str(tmp_path / "rt"),
        "HWPROFILE_CONFIG_ROOT": str(tmp_path / "etc"),
    }
    (tmp_path / "etc").mkdir()
    sets = [
        "layout.replicas=2",
        "speculative.method=none",
        "cpu.kv_cache_space_gib=0.0625",
        "engine.max_model_len=512",
        "engine.enforce_eager=true",
        f"server.port={port}",
        "supervise.backoff_initial=0.5",
        f"logs.dir={tmp_path / 'logs'}",
    ]
    args = ["--model", str(tiny), *[f"--set={s}" for s in sets]]
    t0 = time.monotonic()
    up = hw(env, "launch", *args)
    assert up.returncode == 0, up.stdout + up.stderr
    started = time.monotonic() - t0
    st = status(env)
    (inst,) = st["instances"]
    assert inst["name"] == "vllm-cpu-dp2" and "--data-parallel-size" in inst["argv"]
    url = st["endpoint"]["url"]
    assert url == f"http://127.0.0.1:{port}" and st["endpoint"]["via"] == "vllm"
    try:
        assert sorted(ranks_of(inst["pid"])) == ["DP0", "DP1"]  # two engine cores behind one API server
        with ThreadPoolExecutor(4) as pool:
            assert list(pool.map(lambda _: complete(url, str(tiny)), range(8))) == [200] * 8
        text = OPENER.open(url + "/metrics", timeout=30).read().decode()
        engines = {
            ln.split('engine="', 1)[1].split('"', 1)[0]
            for ln in text.splitlines()
            if ln.startswith("vllm:num_requests_running{")
        }
        assert engines == {"0", "1"}
        from hwprofile.telemetry.metrics import parse

        m = parse(text)
        assert sorted(m.engines) == ["0", "1"] and m.counters["vllm:generation_tokens_total"] >= 8
        # a rank dies: vLLM takes the server down, the supervisor restarts it (one URL again)
        os.kill(ranks_of(inst["pid"])["DP1"], signal.SIGKILL)
        t1 = time.monotonic()
        again = wait(
            lambda: (i := status(env)["instances"][0])["restarts"] == 1 and i["state"] == "ready" and i,
            "restarted and ready",
        )
        recovered = time.monotonic() - t1
        assert "died" in again["failure"]["evidence"] or "exit code" in again["failure"]["evidence"], again[
            "failure"
        ]
        assert complete(url, str(tiny)) == 200
        print(
            f"\nDP=2 on the CPU: ready in {started:.0f} s; a dead rank: ready again {recovered:.0f} s later"
        )
    finally:
        pid = status(env)["instances"][0]["pid"]
        down = hw(env, "stop", timeout=180)
    assert down.returncode == 0, down.stderr
    assert ranks_of(pid) == {} and not Path(f"/proc/{pid}").exists()


WRAPPER = '''#!{python}
"""The plan's vLLM command for a GPU plan run on this CPU (see the module doc of the test)."""
import json, os, sys
args, out, i = sys.argv[1:], [], 0
if args[:1] == ["--version"]:
    os.execv({vllm!r}, [{vllm!r}, "--version"])
while i < len(args):
    a = args[i]
    if a in ("--gpu-memory-utilization", "--tensor-parallel-size", "--kv-cache-dtype", "--max-model-len"):
        i += 2
        continue
    if a == "--numa-bind":
        i += 1
        continue
    if a == "--numa-bind-nodes":
        i += 1
        while i < len(args) and not args[i].startswith("--"):
            i += 1
        continue
    out.append(a)
    i += 1
with open({log!r}, "a") as f:
    f.write(json.dumps(out) + "\\n")
os.environ.pop("CUDA_VISIBLE_DEVICES", None)
os.execv({vllm!r}, [{vllm!r}, *out, "--kv-cache-memory-bytes", "67108864", "--max-model-len", "512",
                    "--enforce-eager"])
'''


def test_the_daemon_degrades_a_data_parallel_server_when_a_card_heats(tiny, tmp_path, fake_nvml_dir) -> None:
    host = build("a800-pcie-4x-2numa", tmp_path / "host")
    log = tmp_path / "starts.jsonl"
    wrapper = tmp_path / "vllm-on-cpu"
    wrapper.write_text(WRAPPER.format(python=sys.executable, vllm=str(VLLM), log=str(log)))
    wrapper.chmod(0o755)
    port = free_port()
    env = {
        **host.env(fake_nvml_dir),
        "HWPROFILE_RUNTIME_DIR": str(tmp_path / "rt"),
        "HWPROFILE_CONFIG_ROOT": str(tmp_path / "etc"),
        "HF_HUB_OFFLINE": "1",
    }
    (tmp_path / "etc").mkdir()
    # the operator's TP2 (a NUMA pair per rank): the profile's would give way to TP1 on a tiny model
    sets = [
        "layout.shape=data_parallel",
        "layout.tensor_parallel_size=2",
        "speculative.method=none",
        f"server.port={port}",
        f"server.vllm_command={wrapper}",
        "watch.interval=0.5",
        "watch.dwell_s=1",
        "watch.metrics_port=0",
        "server.shutdown_timeout=5",
        f"logs.dir={tmp_path / 'logs'}",
    ]
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "hwprofile",
            "daemon",
            "--vllm-version",
            "0.32.0",
            "--model",
            str(tiny),
            *[f"--set={s}" for s in sets],
        ],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )

    def starts() -> list[list[str]]:
        return [json.loads(x) for x in log.read_text().splitlines()] if log.exists() else []

    def flag(argv: list[str], name: str) -> str:
        return argv[argv.index(name) + 1]

    try:
        wait(lambda: (s := status(env)).get("instances") and s["instances"][0]["state"] == "ready", "ready")
        (first,) = starts()
        # the A800 profile's 192 sequences, doubled by layout.objective for this model (layout.batching=predicted)
        assert flag(first, "--data-parallel-size") == "2" and flag(first, "--max-num-seqs") == "384"
        url = status(env)["endpoint"]["url"]
        assert complete(url, str(tiny)) == 200
        host.set_state(**{"dev2.temperature": 84})  # past the A800 profile's hot_c (82 °C)
        t0 = time.monotonic()
        wait(lambda: len(starts()) >= 2, "the degraded start", 120)
        assert flag(starts()[-1], "--max-num-seqs") == "288"  # 384 x 0.75: the whole server, both ranks
        wait(
            lambda: (
                (s := status(env))["instances"][0]["state"] == "ready"
                and s["instances"][0]["replacements"] == 1
            ),
            "ready again at the degrade step",
        )
        downtime = time.monotonic() - t0
        assert complete(url, str(tiny)) == 200

        # state.json says ready first; the daemon records the restart as done at its next tick (the power
        # step before it has its own record, done or failed as the fake card allows: not the one waited on)
        def done_actions() -> list[dict]:
            doc = json.loads((tmp_path / "rt" / "daemon.json").read_text())
            return [
                a for a in doc["actions"] if a["kind"] == "degrade" and a["outcome"] in ("done", "failed")
            ]

        done = wait(done_actions, "the daemon's record of the restart", 30)
        doc = json.loads((tmp_path / "rt" / "daemon.json").read_text())
        assert (
            done[-1]["outcome"] == "done"
            and "downtime of the data-parallel server: all 2 ranks" in done[-1]["detail"]
        ), doc["actions"]
        print(f"\na hot card under the DP server: degraded, ready again after {downtime:.0f} s")
    finally:
        os.kill(proc.pid, signal.SIGTERM)
        code = proc.wait(180)
    assert code == 0, (proc.stderr.read() if proc.stderr else "")[-3000:]
