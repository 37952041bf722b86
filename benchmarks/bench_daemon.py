"""What the daemon costs at steady state, and how fast it acts, against a peer in the same run.

    python benchmarks/bench_daemon.py [--seconds 30] [--host h100-sxm-8x] [--instances 2]
                                      [--profile daemon.prof]

- Steady state: `hwprofile daemon` at watch.interval 1 s on a fake 8-GPU host (through the fake
  libnvidia-ml.so.1) supervising 2 instances (tests/fakevllm.py, TP 4 each) whose /metrics it
  scrapes every tick (tests/fakevllm.py answers HTTP/1.1 and keeps connections open, as vLLM's
  uvicorn does: the daemon's scrapes and /health probes go over one kept connection each): CPU time
  of the daemon process itself (its threads, not the servers) per second of wall time and per tick, and its resident memory (and how it moved over the window). Peer,
  same host, measured over the same seconds: `gpustat -i 1` (an NVML watcher that only prints), and
  the ratio of the two. Targets: CPU <= 0.5 % of one core and <= gpustat's, RSS <= 60 MB.
- Reaction: with the defaults (poll 1 s, dwell 3 s), from the moment a card's state file says it is
  hot to the daemon starting the degrade (its daemon.json history). Target <= 6 s.
- ``--instances N`` (N > 2): N instances of TP 1 on the host's GPUs repeated up to N (tests/fakehost.py's
  scaled host); target <= 2 % of one core at 16. The reaction is measured for 2 instances only.
- ``--busy``: a client per instance (in this process, not measured) sends completions one after another
  (64 tokens at FAKEVLLM_TOKEN_DELAY 0.01 s), so every instance has a request running at most ticks:
  each busy instance is scraped and its changed /metrics parsed at every tick (an idle one every 5 s,
  and an unchanged body is not parsed again).
- ``--profile PATH``: the daemon runs under cProfile on every one of its threads, timed by each thread's
  own CPU time (``time.thread_time``: waits are not counted; the counts reset when the measured window
  begins); the stats go to PATH (``python -m pstats PATH``). The CPU figures of a
  profiled run are not the daemon's own.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from fakehost import build, compile_fake_nvml, scaled_spec

ROOT = Path(__file__).resolve().parent.parent
FAKE = ROOT / "tests" / "fakevllm.py"
CONFIG = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 128,
    "intermediate_size": 256,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "vocab_size": 2048,
    "max_position_embeddings": 2048,
    "torch_dtype": "bfloat16",
}
HZ = os.sysconf("SC_CLK_TCK")
# `python -c PROFILED hwprofile daemon ...`: cProfile on every thread, reset on SIGUSR1, dumped at exit
PROFILED = """
import atexit, cProfile, os, pstats, runpy, signal, sys, threading, time
profs = []
def start(frame, event, arg):
    sys.setprofile(None)
    p = cProfile.Profile(time.thread_time); profs.append(p); p.enable()
threading.setprofile(start)
main = cProfile.Profile(time.thread_time); profs.append(main); main.enable()
signal.signal(signal.SIGUSR1, lambda s, f: [p.clear() for p in profs])
def dump():
    for p in profs:
        p.disable()
    st = pstats.Stats(profs[0])
    for p in profs[1:]:
        try:
            st.add(p)
        except TypeError:  # a thread that never ran anything
            pass
    st.dump_stats(os.environ["BENCH_PROFILE"])
atexit.register(dump)
sys.argv = ["hwprofile", *sys.argv[1:]]
runpy.run_module("hwprofile", run_name="__main__")
"""


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / HZ  # utime + stime, this process only


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def free_port(n: int) -> int:
    while True:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            base = s.getsockname()[1]
        if base + n < 65535:
            return base


def measure(pids: list[int], seconds: float) -> list[tuple[float, float, float]]:
    """For each of ``pids``, over the same ``seconds``: (CPU % of one core, CPU seconds, RSS MB at the end)."""
    c0, t0 = [cpu_seconds(p) for p in pids], time.monotonic()
    time.sleep(seconds)
    c1, t1 = [cpu_seconds(p) for p in pids], time.monotonic()
    return [(100 * (b - a) / (t1 - t0), b - a, rss_mb(p)) for p, a, b in zip(pids, c0, c1, strict=True)]


def daemon_doc(runtime: Path) -> dict:
    try:
        return json.loads((runtime / "daemon.json").read_text())
    except (OSError, ValueError):
        return {}


def restarts(runtime: Path) -> int:
    """The supervisor's restarts of all its instances so far (its state.json)."""
    try:
        doc = json.loads((runtime / "state.json").read_text())
    except (OSError, ValueError):
        return 0
    return sum(int(i.get("restarts") or 0) for i in doc.get("instances") or [])


def load(url: str, model: Path, stop: threading.Event) -> None:
    """Completions to ``url``, one after another, until ``stop``."""
    import http.client
    import urllib.parse

    parts = urllib.parse.urlsplit(url)
    body = json.dumps({"model": str(model), "prompt": "hello " * 20, "max_tokens": 64, "ignore_eos": True})
    while not stop.is_set():
        try:
            conn = http.client.HTTPConnection(parts.hostname or "127.0.0.1", parts.port, timeout=30)
            conn.request("POST", "/v1/completions", body.encode(), {"Content-Type": "application/json"})
            conn.getresponse().read()
            conn.close()
        except OSError:
            time.sleep(0.5)


def stop(daemon: subprocess.Popen[bytes]) -> int:
    daemon.send_signal(signal.SIGTERM)
    code = daemon.wait(120)
    print(f"  daemon exit on SIGTERM: {code}")
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=30)
    ap.add_argument("--host", default="h100-sxm-8x")
    ap.add_argument("--instances", type=int, default=2, help="2: TP 4 each; more: TP 1 each")
    ap.add_argument("--busy", action="store_true", help="a request always running on every instance")
    ap.add_argument("--profile", type=Path, default=None, help="cProfile stats of the daemon to this file")
    args = ap.parse_args()
    many = args.instances > 2
    tmp = Path(tempfile.mkdtemp(prefix="hwpb-", dir="/tmp"))
    daemon: subprocess.Popen[bytes] | None = None
    try:
        lib = compile_fake_nvml(tmp / "lib")
        spec = scaled_spec(args.host, max(8, args.instances)) if many else None
        host = build(args.host, tmp / "host", spec)
        model = tmp / "model"
        model.mkdir()
        (model / "config.json").write_text(json.dumps(CONFIG))
        (model / "model.safetensors").write_bytes(b"\0" * 4096)
        shim = tmp / "vllm"
        shim.write_text(f'#!/bin/sh\nexec "{sys.executable}" "{FAKE}" "$@"\n')
        shim.chmod(0o755)
        (tmp / "etc").mkdir()
        env = {
            **host.env(lib.parent),
            "HWPROFILE_CONFIG_ROOT": str(tmp / "etc"),
            "HWPROFILE_RUNTIME_DIR": str(tmp / "rt"),
            "FAKEVLLM_READY_DELAY": "0.2",
        }
        if args.profile is not None:
            env["BENCH_PROFILE"] = str(args.profile.resolve())
        port = free_port(args.instances)
        sets = [
            f"layout.tensor_parallel_size={1 if many else 4}",
            "speculative.method=ngram",
            "server.shutdown_timeout=1",
            f"server.port={port}",
            f"server.vllm_command={shim}",
            f"logs.dir={tmp / 'logs'}",
            "watch.metrics_port=0",
            "watch.hot_c=82",
        ]
        daemon = subprocess.Popen(
            [
                sys.executable,
                *(["-c", PROFILED] if args.profile is not None else ["-m", "hwprofile"]),
                "daemon",
                "--model",
                str(model),
                *[f"--set={s}" for s in sets],
            ],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=(tmp / "daemon.err").open("wb"),
            start_new_session=True,
        )
        end = time.monotonic() + 60 + 5 * args.instances
        while time.monotonic() < end:
            d = daemon_doc(tmp / "rt")
            if (
                d.get("instances")
                and all(i["status"] == "ok" for i in d["instances"])
                and len(d["instances"]) == args.instances
            ):
                break
            time.sleep(0.2)
        else:
            print("the daemon's instances did not become ready; its stderr ends:")
            print("\n".join((tmp / "daemon.err").read_text(errors="replace").splitlines()[-20:]))
            daemon.kill()
            return 1
        stop_load = threading.Event()
        if args.busy:
            for inst in daemon_doc(tmp / "rt")["instances"]:
                threading.Thread(target=load, args=(inst["url"], model, stop_load), daemon=True).start()
        time.sleep(3)  # past start-up
        gpustat = shutil.which("gpustat", path=str(Path(sys.executable).parent)) or "gpustat"
        peer = subprocess.Popen(
            [gpustat, "-i", "1"], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        time.sleep(3)
        # both measured over the same window (the same seconds, the same load on the machine)
        before = daemon_doc(tmp / "rt").get("ticks") or 0
        rss0 = rss_mb(daemon.pid)
        restarts0 = restarts(tmp / "rt")
        if args.profile is not None:
            daemon.send_signal(signal.SIGUSR1)  # the profile of the measured window only
        (d_cpu, d_s, d_rss), (p_cpu, p_s, p_rss) = measure([daemon.pid, peer.pid], args.seconds)
        peer.send_signal(signal.SIGINT)
        peer.wait(10)
        stop_load.set()
        doc = daemon_doc(tmp / "rt")
        ticks, missed, tick_s = doc.get("ticks") or 0, doc.get("missed_ticks"), doc.get("tick_seconds") or 0
        n = max(1, ticks - before)
        print(
            f"host fixture {args.host} ({max(8, args.instances)} GPUs), {args.instances} instances "
            f"{'busy' if args.busy else 'idle'}, "
            f"watch.interval 1 s, the same {args.seconds:.0f} s"
        )
        print(
            f"  hwprofile daemon   CPU {d_cpu:5.2f} % of one core   {1000 * d_s / n:6.2f} ms CPU per tick ({n} ticks)"
            f"   RSS {d_rss:5.1f} MB ({d_rss - rss0:+.1f} over the window)"
            f"   (target <= {2 if many else 0.5} %, <= 60 MB)"
        )
        print(
            f"  gpustat -i 1       CPU {p_cpu:5.2f} % of one core   {1000 * p_s / args.seconds:6.2f} ms CPU per second"
            f"   RSS {p_rss:5.1f} MB"
        )
        print(f"  ratio daemon / gpustat CPU: {d_cpu / p_cpu if p_cpu else float('inf'):.2f}x (target <= 1)")
        print(f"  daemon ticks {ticks}, missed {missed}, last tick {tick_s * 1000:.1f} ms")
        print(f"  daemon threads {len(os.listdir(f'/proc/{daemon.pid}/task'))}")
        # a supervisor that restarts or marks failing instances in the window measures its churn, not watching
        print(
            f"  instance restarts in the window {restarts(tmp / 'rt') - restarts0} (state changes: 0 expected)"
        )
        if many:
            return stop(daemon)
        # reaction: defaults (dwell 3 s, 1 s ticks) from the first hot reading to the action
        before = len(doc.get("actions") or [])
        heated = time.time()
        host.set_state(**{"dev4.temperature": 86})
        end = time.monotonic() + 30
        started = None
        while time.monotonic() < end and started is None:
            acts = daemon_doc(tmp / "rt").get("actions") or []
            started = next((a["at"] for a in acts[before:] if a["outcome"] == "started"), None)
            time.sleep(0.05)
        if started is None:
            print("  reaction: no action within 30 s")
        else:
            print(
                f"  reaction: first hot reading -> degrade started in {started - heated:.2f} s (target <= 6 s)"
            )
        return stop(daemon)
    finally:
        if daemon is not None and daemon.poll() is None:  # interrupted: its instances go with it
            daemon.send_signal(signal.SIGTERM)
            daemon.wait(120)
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    raise SystemExit(main())
