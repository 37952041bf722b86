"""nginx least-connections against vLLM's router (cache_aware) in front of two real vLLM CPU servers on
the tiny model, on a prefix-heavy workload: many multi-turn chats, each opening with one of a few long
system prompts shared by several chats, each turn resending the whole conversation.

    python benchmarks/bench_router.py [--chats 24] [--turns 4] [--prefixes 6] [--prefix-tokens 900]

Both fronts are configured as hwprofile configures them: nginx with the ``conf.d`` text of
``templates/nginx.conf.j2`` (least_conn, max_fails=1 fail_timeout=5s, proxy_next_upstream), the
router with the argv of :func:`hwprofile.render.router.router_argv` (cache_aware, /health every
5 s, 2 failures to skip a server). Each server's KV cache is small (``--kv-cache-tokens``, fewer than
all shared prompts together), so where a chat's turns land decides what stays cached.

Prints, per front: vLLM's prefix-cache hit rate from the servers' own counters
(``vllm:prefix_cache_hits_total`` / ``vllm:prefix_cache_queries_total``, tokens, summed over both
servers, the caches reset before each run through the dev-mode ``/reset_prefix_cache``), TTFT p50/p99
(streamed, to the first content chunk), and then a second run where one server is SIGKILLed a third
of the way in: the requests clients saw fail, and the time from the kill to the last failure
(every request after it succeeded). The killed server is started again between the two fronts.
Needs vLLM (CPU build), nginx and vllm-router. Heavy: run it once, on an otherwise idle machine.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from vllmtools import VLLM, cpu_env, free_ports

from hwprofile.launch.tinymodel import make_tiny_model
from hwprofile.render.output import environment
from hwprofile.render.router import router_argv
from hwprofile.supervise.front import main_conf, nginx_binary

OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))
KV_BYTES_PER_TOKEN = (
    512  # the tiny model: 2 x 2 layers x 2 KV heads x 32 x 2 bytes (hwprofile.launch.tinymodel)
)


def http(url: str, body: dict[str, Any] | None = None, timeout: float = 120.0) -> tuple[int, bytes]:
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url, data, {"Content-Type": "application/json"} if data else {})
    with OPENER.open(req, timeout=timeout) as r:
        return r.status, r.read()


def healthy(url: str) -> bool:
    try:
        return http(url + "/health", timeout=3)[0] == 200
    except OSError:
        return False


def wait(what, timeout: float, why: str) -> None:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if what():
            return
        time.sleep(0.3)
    raise RuntimeError(f"{why}: not within {timeout:.0f} s")


class Server:
    def __init__(self, model: Path, port: int, kv_tokens: int, work: Path, cpu: int) -> None:
        self.model, self.port, self.kv_tokens, self.work, self.cpu = model, port, kv_tokens, work, cpu
        self.url = f"http://127.0.0.1:{port}"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        env = cpu_env(self.work)
        env.update(VLLM_SERVER_DEV_MODE="1", VLLM_CPU_OMP_THREADS_BIND=str(self.cpu))
        argv = [
            str(VLLM),
            "serve",
            str(self.model),
            "--host",
            "127.0.0.1",
            "--port",
            str(self.port),
            "--max-model-len",
            "2048",
            "--enforce-eager",
            "--enable-prefix-caching",
            "--kv-cache-memory-bytes",
            str(self.kv_tokens * KV_BYTES_PER_TOKEN),
            "--max-num-seqs",
            "8",
            "--served-model-name",
            "tiny",
        ]
        log = (self.work / f"vllm-{self.port}.log").open("ab")
        self.proc = subprocess.Popen(
            argv, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.kill()

    def counters(self) -> tuple[float, float]:
        """(prefix-cache hits, queries) in tokens, from vLLM's own /metrics."""
        text = http(self.url + "/metrics")[1].decode()
        got = {"hits": 0.0, "queries": 0.0}
        for ln in text.splitlines():
            for k in got:
                if ln.startswith(f"vllm:prefix_cache_{k}_total"):
                    got[k] += float(ln.rsplit(" ", 1)[1])
        return got["hits"], got["queries"]


class Front:
    def __init__(self, kind: str, port: int, servers: list[Server], work: Path) -> None:
        self.kind, self.port, self.servers, self.work = kind, port, servers, work
        self.url = f"http://127.0.0.1:{port}"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        d = self.work / self.kind
        (d / "conf.d").mkdir(parents=True, exist_ok=True)
        (d / "tmp").mkdir(exist_ok=True)
        if self.kind == "nginx":
            nginx = nginx_binary()
            assert nginx, "nginx is not installed"
            servers = [{"name": f"vllm-{s.port}", "address": f"127.0.0.1:{s.port}"} for s in self.servers]
            text = (
                environment()
                .get_template("nginx.conf.j2")
                .render(url=self.url, servers=servers, listen=f"127.0.0.1:{self.port}", read_timeout_s=3600)
            )
            (d / "conf.d" / "hwprofile.conf").write_text(text)
            (d / "nginx.conf").write_text(main_conf(d))
            argv = [nginx, "-p", str(d), "-c", str(d / "nginx.conf")]
        else:
            exe = str(Path(sys.executable).parent / "vllm-router")
            argv = router_argv(
                exe,
                "127.0.0.1",
                self.port,
                [s.url for s in self.servers],
                "cache_aware",
                600,
                3600,
                self.port + 1,
            )
        log = (self.work / f"{self.kind}.log").open("ab")
        env = {**os.environ, "NO_COLOR": "1"}
        self.proc = subprocess.Popen(
            argv, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True
        )
        wait(lambda: healthy(self.url), 120, f"{self.kind} in front")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGQUIT if self.kind == "nginx" else signal.SIGTERM)
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()


def words(rng: random.Random, n: int) -> str:
    syll = [c + v for c in "bdfgklmnprstvz" for v in "aeiou"]
    return " ".join(rng.choice(syll) + rng.choice(syll) for _ in range(n))


def workload(args: argparse.Namespace, tokens_per_word: float) -> list[list[dict[str, str]]]:
    """Each chat: its shared system prompt and its own user turns (the replies are added as they come)."""
    rng = random.Random(7)
    prefixes = [words(rng, int(args.prefix_tokens / tokens_per_word)) for _ in range(args.prefixes)]
    return [
        [{"role": "system", "content": prefixes[c % args.prefixes]}]
        + [{"role": "user", "content": words(rng, int(40 / tokens_per_word))} for _ in range(args.turns)]
        for c in range(args.chats)
    ]


def one_turn(url: str, messages: list[dict[str, str]], max_tokens: int) -> tuple[float, str]:
    """(TTFT in s, the reply) of one streamed chat completion."""
    body = {"model": "tiny", "messages": messages, "max_tokens": max_tokens, "stream": True, "temperature": 0}
    req = urllib.request.Request(
        url + "/v1/chat/completions", json.dumps(body).encode(), {"Content-Type": "application/json"}
    )
    t0 = time.perf_counter()
    ttft: float | None = None
    out: list[str] = []
    with OPENER.open(req, timeout=300) as r:
        if r.status != 200:
            raise OSError(f"HTTP {r.status}")
        for raw in r:
            line = raw.decode(errors="replace").strip()
            if not line.startswith("data:") or line == "data: [DONE]":
                continue
            delta = json.loads(line[5:])["choices"][0].get("delta", {}).get("content")
            if delta:
                ttft = ttft if ttft is not None else time.perf_counter() - t0
                out.append(delta)
    if ttft is None:
        raise OSError("no content streamed")
    return ttft, "".join(out)


def run(
    front: Front, chats: list[list[dict[str, str]]], args: argparse.Namespace, kill: Server | None = None
) -> dict[str, Any]:
    """Every chat turn by turn, ``args.concurrency`` chats at a time; with ``kill``, that server is
    SIGKILLed once a third of the turns are done."""
    ttfts: list[float] = []
    errors: list[float] = []  # when each failed request failed (monotonic)
    done = [0]
    lock = threading.Lock()
    total = len(chats) * args.turns
    killed_at: list[float] = []

    def chat(spec: list[dict[str, str]]) -> None:
        history = [spec[0]]
        for user in spec[1:]:
            history.append(user)
            try:
                ttft, reply = one_turn(front.url, history, args.max_tokens)
                history.append({"role": "assistant", "content": reply})
                with lock:
                    ttfts.append(ttft)
            except (OSError, ValueError):
                with lock:
                    errors.append(time.monotonic())
                history.pop()  # the client gives this turn up and goes on
            with lock:
                done[0] += 1
                if kill is not None and not killed_at and done[0] >= total // 3:
                    kill.kill()
                    killed_at.append(time.monotonic())

    before = [s.counters() for s in front.servers if s.proc and s.proc.poll() is None]
    t0 = time.monotonic()
    with ThreadPoolExecutor(args.concurrency) as pool:
        list(pool.map(chat, chats))
    wall = time.monotonic() - t0
    out: dict[str, Any] = {
        "requests": total,
        "ok": len(ttfts),
        "errors": len(errors),
        "wall_s": round(wall, 1),
    }
    if ttfts:
        q = statistics.quantiles(ttfts, n=100, method="inclusive")
        out.update(ttft_p50_ms=round(statistics.median(ttfts) * 1000, 1), ttft_p99_ms=round(q[98] * 1000, 1))
    if kill is None:
        after = [s.counters() for s in front.servers]
        hits = sum(a[0] - b[0] for a, b in zip(after, before, strict=True))
        queries = sum(a[1] - b[1] for a, b in zip(after, before, strict=True))
        out["prefix_cache_hit_rate"] = round(hits / queries, 3) if queries else None
        out["prefix_cache_query_tokens"] = int(queries)
    else:
        k = killed_at[0] if killed_at else None
        late = [e for e in errors if k is not None and e >= k]
        out["errors_after_kill"] = len(late)
        out["recovered_after_s"] = round(max(late) - k, 1) if late and k is not None else 0.0
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--chats", type=int, default=24)
    ap.add_argument("--turns", type=int, default=4)
    ap.add_argument("--prefixes", type=int, default=6, help="distinct long system prompts the chats share")
    ap.add_argument("--prefix-tokens", type=int, default=900)
    ap.add_argument("--kv-cache-tokens", type=int, default=4096, help="each server's KV cache (tokens)")
    ap.add_argument("--max-tokens", type=int, default=8)
    ap.add_argument("--concurrency", type=int, default=4)
    args = ap.parse_args()

    work = Path(tempfile.mkdtemp(prefix="hwpbr-", dir="/tmp"))
    model = make_tiny_model(work / "tiny")
    base = free_ports(2)
    fports = free_ports(4)
    servers = [
        Server(model, base + i, args.kv_cache_tokens, work, i % max(1, os.cpu_count() or 1)) for i in range(2)
    ]
    fronts = [Front("nginx", fports, servers, work), Front("router", fports + 2, servers, work)]
    results: dict[str, dict[str, Any]] = {}
    try:
        for s in servers:
            s.start()
        for s in servers:
            wait(lambda s=s: healthy(s.url), 900, f"vLLM on {s.port}")
        got = json.loads(
            http(servers[0].url + "/tokenize", {"model": "tiny", "prompt": words(random.Random(1), 200)})[1]
        )
        tokens_per_word = got["count"] / 200
        chats = workload(args, tokens_per_word)
        print(
            f"# {args.chats} chats x {args.turns} turns, {args.prefixes} shared system prompts of ~{args.prefix_tokens} "
            f"tokens, {args.concurrency} chats at a time; each server's KV cache {args.kv_cache_tokens} tokens; "
            f"{os.cpu_count()} CPUs",
            flush=True,
        )
        for front in fronts:
            for s in servers:
                http(s.url + "/reset_prefix_cache", {})
            front.start()
            try:
                results[front.kind] = run(front, chats, args)
                print(f"{front.kind}: {json.dumps(results[front.kind])}", flush=True)
            finally:
                front.stop()
        for front in fronts:
            for s in servers:
                if s.proc is None or s.proc.poll() is not None:
                    s.start()
                    wait(lambda s=s: healthy(s.url), 900, f"vLLM on {s.port} again")
            front.start()
            try:
                results[front.kind + "_kill"] = run(front, chats, args, kill=servers[1])
                print(
                    f"{front.kind} with a server killed: {json.dumps(results[front.kind + '_kill'])}",
                    flush=True,
                )
            finally:
                front.stop()
    finally:
        for f in fronts:
            f.stop()
        for s in servers:
            s.stop()
    n, r = results.get("nginx", {}), results.get("router", {})
    nk, rk = results.get("nginx_kill", {}), results.get("router_kill", {})
    rows = [
        (
            "prefix-cache hit rate (vLLM's counters)",
            n.get("prefix_cache_hit_rate"),
            r.get("prefix_cache_hit_rate"),
        ),
        ("TTFT p50 ms", n.get("ttft_p50_ms"), r.get("ttft_p50_ms")),
        ("TTFT p99 ms", n.get("ttft_p99_ms"), r.get("ttft_p99_ms")),
        ("wall s", n.get("wall_s"), r.get("wall_s")),
        ("server killed: client errors", nk.get("errors"), rk.get("errors")),
        (
            "server killed: s from kill to last error",
            nk.get("recovered_after_s"),
            rk.get("recovered_after_s"),
        ),
        ("server killed: TTFT p99 ms", nk.get("ttft_p99_ms"), rk.get("ttft_p99_ms")),
    ]
    print("\n| | nginx least_conn | vllm-router cache_aware |\n|---|---|---|")
    for name, a, b in rows:
        print(f"| {name} | {a} | {b} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
