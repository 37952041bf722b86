#!/usr/bin/env python3
"""A fake ``vllm serve`` for fast tests: stdlib only, starts in well under a second.

Run it as ``fakevllm.py serve MODEL --host H --port P [vLLM flags...]`` (the argv shape hwprofile
renders; ``server.vllm_command`` can name it, through a two-line shell shim). It imitates what
hwprofile relies on in the real server (vLLM 0.32, CPU build):

- the startup log: ``non-default args: {...}`` built from its own argv, ``CPU KV cache size: N tokens``
  computed from the model's config.json and ``--kv-cache-memory-bytes`` like vLLM does, ``Starting
  vLLM API server``, ``Application startup complete.``; vLLM's own error lines for an unknown flag
  (any ``--bogus*`` flag, exit 2), a missing model (exit 1), a port in use (exit 1) and a KV cache too
  small for ``--max-model-len`` (exit 1);
- ``/health`` and ``/ping``: 503 while "loading", 200 once loaded (after the ready delay); ``/version``,
  ``/v1/models``, ``/v1/completions`` (also streamed, one token per ``token delay``) and ``/metrics``
  in vLLM's Prometheus text format (``vllm:num_requests_running``, ``vllm:kv_cache_usage_perc``,
  token counters with their ``_created`` gauges, spec-decode counters when ``--speculative-config``
  is given);
- SIGTERM: stop accepting, drain in-flight requests for up to ``--shutdown-timeout`` seconds (0: wait
  for them forever, as vLLM does), exit 0. An "engine" child process sits in its process group.

Modes, from flags (``--fake-*``, never reported as vLLM args) or the environment (``FAKEVLLM_*``):

- ``--fake-mode`` / ``FAKEVLLM_MODE``: comma-separated; ``oom`` (print a CUDA out-of-memory traceback
  and exit 1 while starting), ``crash`` (exit ``--fake-exit-code``, default 1, ``--fake-crash-after``
  seconds after its ``/health`` first answered 200: after a supervisor saw it ready, however loaded
  the machine), ``hang`` (never healthy), ``ignore-term`` (ignore SIGTERM),
  ``die`` (exit 1 while starting, with an error hwprofile does not know), ``sick`` (``--fake-sick-after`` /
  ``FAKEVLLM_SICK_AFTER`` seconds, default 0.5, after becoming ready the engine dies and the API server stays up, answering 503 on
  ``/health`` for good, as a server whose engine is gone does), ``noisy`` (write ``FAKEVLLM_NOISE_LINES`` lines, default 20000, while starting),
  ``warn`` (one WARNING line while starting), ``stall`` (``--fake-stall-after`` seconds, default 0.5, after its ``/health`` first answered 200 the
  engine hangs behind an API server that still answers: ``--fake-stall-waiting`` requests, default 2,
  wait for good, no token is generated any more, every counter stands, ``/health`` stays 200; with
  ``--fake-stall-port P`` only a server on port P, with ``--fake-stall-once FILE`` only the first
  server that creates FILE);
- ``--fake-ready-delay`` / ``FAKEVLLM_READY_DELAY``: seconds of "loading" (default 0.3);
- ``FAKEVLLM_KV_POOL_GIB``: log a GPU worker's profiled pool (``Available KV cache memory: X GiB``),
  after ``FAKEVLLM_COMPILE`` ``cold`` or ``warm``'s compile line; with ``--kv-cache-memory-bytes``
  vLLM's "reserved ... as specified by kv_cache_memory_bytes" line instead;
- ``--fake-fail-times N`` / ``FAKEVLLM_FAIL_TIMES`` with ``--fake-counter FILE`` / ``FAKEVLLM_COUNTER``:
  only the first N starts (counted in FILE) use the modes; later starts are healthy;
- ``--fake-token-delay`` / ``FAKEVLLM_TOKEN_DELAY``: seconds per generated token (default 0.01);
- ``FAKEVLLM_ARGV_LOG``: append this start (``{"t": time, "pid": PID, "argv": [...]}``, one JSON
  line) to that file.

``fakevllm.py bench serve --base-url URL ...`` imitates ``vllm bench serve`` (0.32) for fast tests: it
sends ``--num-prompts`` streamed completions, at most ``--max-concurrency`` at a time, measures
TTFT/TPOT/ITL/E2EL, takes the spec-decode counter deltas from ``/metrics`` as vLLM's does, and with
``--save-result`` writes vLLM's result JSON keys to ``--result-dir``/``--result-filename``. An unknown
flag exits 2. ``FAKEVLLM_BENCH_TTFT_MS_PER_CONCURRENCY`` adds that many ms per concurrent slot to every
TTFT (a server that saturates); ``FAKEVLLM_BENCH_FAIL`` makes it exit 1 with that text.

Greedy answers with token ids (what ``hwprofile verify`` compares): a non-streamed completion that asks
for ``return_token_ids`` gets ``token_ids`` (ids a hash of the prompt and the position picks, the same
on every server and every run), ``prompt_token_ids`` and the text of those ids (token ``N`` is the
text ``" wN"``, which ``POST /detokenize`` also gives); with ``logprobs: K`` and
``return_tokens_as_token_ids`` each position's ``top_logprobs`` (``token_id:N`` keys): the greedy
token at -0.5, the token a diverging server would emit 0.002 below it, then the rest further down.
A planted difference: ``--fake-diverge-after N`` / ``FAKEVLLM_DIVERGE_AFTER`` makes the answer leave
the greedy ids from position N on (another token there, then another continuation), for every
prompt, or with ``--fake-diverge-match TEXT`` / ``FAKEVLLM_DIVERGE_MATCH`` only for prompts that
contain TEXT.
"""

from __future__ import annotations

import ast
import hashlib
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

VERSION = "0.32.0+cpu"
PID = os.getpid()
STARTED = time.time()  # process_start_time_seconds on /metrics (prometheus-client's process collector)

# vLLM flags that take no value (the ones hwprofile renders, and a few more)
BOOLEAN = {
    "enforce-eager",
    "enable-prefix-caching",
    "no-enable-prefix-caching",
    "enable-chunked-prefill",
    "no-enable-chunked-prefill",
    "trust-remote-code",
    "disable-log-stats",
    "disable-log-requests",
    "enable-server-load-tracking",
    "numa-bind",
    "disable-custom-all-reduce",
    "async-scheduling",
    "no-async-scheduling",
    "enable-log-requests",
    "disable-uvicorn-access-log",
    "headless",
}
# The "engine": ignores SIGTERM (only a group SIGKILL or its server ends it), and dies with its server
# (parent-death signal), so a test that fails half-way leaves nothing behind.
ENGINE = (
    "import ctypes,os,signal,sys,time;"
    "signal.signal(signal.SIGTERM, signal.SIG_IGN);"
    "ctypes.CDLL(None).prctl(1, signal.SIGKILL, 0, 0, 0);"
    "os.getppid() == int(sys.argv[1]) or sys.exit(0);"
    "time.sleep(86400)"
)
MULTI = {"numa-bind-nodes", "numa-bind-cpus"}  # vLLM flags that take several values
FAKE = {
    "fake-mode",
    "fake-ready-delay",
    "fake-crash-after",
    "fake-sick-after",
    "fake-exit-code",
    "fake-fail-times",
    "fake-counter",
    "fake-token-delay",
    "fake-diverge-after",
    "fake-diverge-match",
    "fake-stall-after",
    "fake-stall-waiting",
    "fake-stall-port",
    "fake-stall-once",
}
VOCAB = 2048  # the token ids greedy answers are drawn from (the tiny model's vocabulary size)


def say(text: str, who: str = "APIServer", level: str = "INFO", where: str = "api_server.py:1") -> None:
    stamp = time.strftime("%m-%d %H:%M:%S")
    sys.stdout.write(f"({who} pid={PID}) {level} {stamp} [{where}] {text}\n")
    sys.stdout.flush()


def value_of(text: str) -> Any:
    for conv in (int, float):
        try:
            return conv(text)
        except ValueError:
            pass
    if text[:1] in "{[":
        try:
            return json.loads(text)
        except ValueError:
            pass
    return text


def parse(argv: list[str]) -> tuple[str | None, dict[str, Any], dict[str, str], list[str]]:
    """(model, vLLM args by dest name, fake options, unknown flags)."""
    if not argv or argv[0] != "serve":
        print("usage: vllm serve [model_tag] [options]", file=sys.stderr)
        sys.exit(2)
    model: str | None = None
    args: dict[str, Any] = {}
    fake: dict[str, str] = {}
    unknown: list[str] = []
    words = argv[1:]
    i = 0
    while i < len(words):
        w = words[i]
        i += 1
        if not w.startswith("--"):
            if model is None:
                model = w
            else:
                unknown.append(w)
            continue
        name, eq, val = w[2:].partition("=")
        if name in MULTI and not eq:  # nargs='+': every value up to the next flag
            values = []
            while i < len(words) and not words[i].startswith("--"):
                values.append(value_of(words[i]))
                i += 1
            args[name.replace("-", "_")] = values
            continue
        if not eq and name not in BOOLEAN and i < len(words) and not words[i].startswith("--"):
            val, eq = words[i], "="
            i += 1
        if name.startswith("bogus"):
            unknown.append(w if not eq or "=" in w else f"{w} {val}")
        elif name in FAKE:
            fake[name[5:]] = val
        elif name.startswith("no-") and not eq:
            args[name[3:].replace("-", "_")] = False
        elif name == "model":
            model = val
        else:
            args[name.replace("-", "_")] = value_of(val) if eq else True
    return model, args, fake, unknown


def _stalls(fake: dict[str, str], port: int) -> bool:
    """Stall mode applies to this server: its port (``stall-port``, when given), and the first to create
    the ``stall-once`` file (when given)."""
    only = option(fake, "stall-port", "")
    if only and int(only) != port:
        return False
    once = option(fake, "stall-once", "")
    if once:
        try:
            os.close(os.open(once, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600))
        except FileExistsError:
            return False
    return True


def option(fake: dict[str, str], name: str, default: str) -> str:
    return fake.get(name) or os.environ.get("FAKEVLLM_" + name.upper().replace("-", "_")) or default


def size_of(text: Any) -> int:
    s = str(text).strip()
    units = {"k": 10**3, "m": 10**6, "g": 10**9, "ki": 2**10, "mi": 2**20, "gi": 2**30}
    for suffix in sorted(units, key=len, reverse=True):
        if s.lower().endswith(suffix):
            return int(float(s[: -len(suffix)]) * units[suffix])
    return int(float(s))


def hashed_ids(salt: str, text: str, n: int) -> list[int]:
    """``n`` token ids picked by a hash of ``salt``, ``text`` and the position: stable everywhere."""
    return [
        int.from_bytes(hashlib.sha256(f"{salt}|{text}|{i}".encode()).digest()[:4], "big") % VOCAB
        for i in range(n)
    ]


def piece(token_id: int) -> str:
    """The text of one token id."""
    return f" w{token_id}"


def greedy_answer(prompt: str, n: int, diverge_after: int | None) -> tuple[list[int], list[int]]:
    """(the ids this server answers ``prompt`` with, the greedy ids): equal unless ``diverge_after``
    is set, then they part from that position on (a different token there, another continuation)."""
    greedy = hashed_ids("greedy", prompt, n)
    if diverge_after is None or diverge_after >= n:
        return greedy, greedy
    other = hashed_ids("diverged", prompt, n)
    ids = greedy[:diverge_after] + other[diverge_after:]
    if ids[diverge_after] == greedy[diverge_after]:
        ids[diverge_after] = (ids[diverge_after] + 1) % VOCAB
    return ids, greedy


def top_logprobs(ids: list[int], greedy: list[int], prompt: str, k: int) -> list[dict[str, float]]:
    """Per position: the greedy token at -0.5, the diverging server's token (or another) 0.002 below,
    then more tokens further down; ``k`` entries, plus the emitted token where it is not among them."""
    alts = hashed_ids("diverged", prompt, len(ids))
    out = []
    for i, emitted in enumerate(ids):
        top: dict[int, float] = {greedy[i]: -0.5}
        runner_up = alts[i] if alts[i] != greedy[i] else (alts[i] + 1) % VOCAB
        top.setdefault(runner_up, -0.502)
        j = 0
        while len(top) < max(k, 2):
            top.setdefault((greedy[i] + 7 * (j + 1)) % VOCAB, -3.0 - j)
            j += 1
        top = dict(list(top.items())[: max(k, 1)])
        top.setdefault(emitted, -0.502 if emitted != greedy[i] else -0.5)
        out.append({f"token_id:{t}": lp for t, lp in top.items()})
    return out


class _Listener(ThreadingHTTPServer):
    """The fake's HTTP server. socketserver's listen backlog is 5: bench's 16 concurrent clients
    overflowed it and a connection was reset now and then; uvicorn (vLLM's server) listens with 2048."""

    request_queue_size = 2048


class Server:
    def __init__(self, model: str, args: dict[str, Any], token_delay: float) -> None:
        self.model = model
        self.args = args
        self.token_delay = token_delay
        names = args.get("served_model_name")
        self.name = (names.split()[0] if isinstance(names, str) else None) or model
        self.loaded = False
        self.lock = threading.Lock()
        self.in_flight = 0
        self.accepting = True
        self.prompt_tokens = 0
        self.generation_tokens = 0
        self.finished: dict[str, int] = {"stop": 0, "length": 0, "abort": 0}
        self.kv_usage = 0.0
        self.created = time.time()
        self.spec = (
            args.get("speculative_config") if isinstance(args.get("speculative_config"), dict) else None
        )
        self.drafts = self.draft_tokens = self.accepted = 0
        # vLLM's latency histograms (0.8+ bucket edges): time to first token, per-step inter-token
        self.ttft = Histogram(TTFT_BUCKETS)
        self.itl = Histogram(ITL_BUCKETS)
        self.fake: dict[str, str] = {}
        self.group: Group | None = None  # node 0 of a multi-node group: its members' connections
        self.seen_healthy = threading.Event()  # /health answered 200 once (crash mode counts from it)
        self.engine_dead = False  # a step found a member gone: the API server exits (code 0), as vLLM's does
        self.stalled = threading.Event()  # the engine hangs: no token any more (stall mode)
        self.stuck = 0  # requests waiting for good once stalled

    # -- metrics ------------------------------------------------------------------------------
    def metrics(self) -> str:
        labels = f'engine="0",model_name="{self.name}"'
        out: list[str] = [
            "# HELP process_start_time_seconds Start time of the process since unix epoch in seconds.",
            "# TYPE process_start_time_seconds gauge",
            f"process_start_time_seconds {STARTED!r}",
            # this process's own CPU, as prometheus_client's process collector gives vLLM's API server's
            "# HELP process_cpu_seconds_total Total user and system CPU time spent in seconds.",
            "# TYPE process_cpu_seconds_total counter",
            f"process_cpu_seconds_total {time.process_time()!r}",
        ]

        def family(name: str, kind: str, help_: str, samples: list[tuple[str, str, float]]) -> None:
            out.append(f"# HELP {name} {help_}")
            out.append(f"# TYPE {name} {kind}")
            for suffix, extra, value in samples:
                out.append(f"{name}{suffix}{{{labels}{extra}}} {float(value)!r}")

        def counter(name: str, help_: str, value: float, extra: str = "") -> None:
            family(name, "counter", help_, [("_total", extra, value)])
            family(name + "_created", "gauge", help_, [("", extra, self.created)])

        ranks = int(self.args.get("data_parallel_size") or 1)  # one series per rank, as vLLM labels them

        def per_rank(name: str, help_: str, total: float, share: bool = True) -> None:
            out.append(f"# HELP {name} {help_}")
            out.append(f"# TYPE {name} gauge")
            for e in range(ranks):
                v = (total // ranks + (1 if e < total % ranks else 0)) if share else total
                out.append(f'{name}{{engine="{e}",model_name="{self.name}"}} {float(v)!r}')

        with self.lock:
            per_rank(
                "vllm:num_requests_running", "Number of requests in model execution batches.", self.in_flight
            )
            per_rank("vllm:num_requests_waiting", "Number of requests waiting to be processed.", self.stuck)
            per_rank(
                "vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.", self.kv_usage, False
            )
            counter("vllm:num_preemptions", "Cumulative number of preemption from the engine.", 0)
            counter("vllm:prompt_tokens", "Number of prefill tokens processed.", self.prompt_tokens)
            counter(
                "vllm:generation_tokens", "Number of generation tokens processed.", self.generation_tokens
            )
            out.append("# HELP vllm:request_success_total Count of successfully processed requests.")
            out.append("# TYPE vllm:request_success_total counter")
            for reason, n in self.finished.items():
                out.append(f'vllm:request_success_total{{{labels},finished_reason="{reason}"}} {float(n)!r}')
            for name, help_, h in (
                (
                    "vllm:time_to_first_token_seconds",
                    "Histogram of time to first token in seconds.",
                    self.ttft,
                ),
                (
                    "vllm:inter_token_latency_seconds",
                    "Histogram of inter-token latency in seconds.",
                    self.itl,
                ),
            ):
                out.append(f"# HELP {name} {help_}")
                out.append(f"# TYPE {name} histogram")
                for edge, n in h.cumulative():
                    out.append(f'{name}_bucket{{{labels},le="{edge}"}} {float(n)!r}')
                out.append(f"{name}_count{{{labels}}} {float(h.count)!r}")
                out.append(f"{name}_sum{{{labels}}} {h.sum!r}")
            if self.spec:
                counter("vllm:spec_decode_num_drafts", "Number of spec decoding drafts.", self.drafts)
                counter("vllm:spec_decode_num_draft_tokens", "Number of draft tokens.", self.draft_tokens)
                counter("vllm:spec_decode_num_accepted_tokens", "Number of accepted tokens.", self.accepted)
                k = int(self.spec.get("num_speculative_tokens") or 1)
                out.append(
                    "# HELP vllm:spec_decode_num_accepted_tokens_per_pos_total Accepted tokens per position."
                )
                out.append("# TYPE vllm:spec_decode_num_accepted_tokens_per_pos_total counter")
                for pos in range(k):
                    n = self.drafts if pos < 1 and self.accepted else 0
                    out.append(
                        f'vllm:spec_decode_num_accepted_tokens_per_pos_total{{{labels},position="{pos}"}} {float(n)!r}'
                    )
        return "\n".join(out) + "\n"

    # -- generation --------------------------------------------------------------------------
    def begin(self, prompt_tokens: int) -> bool:
        with self.lock:
            if not self.accepting:
                return False
            self.in_flight += 1
            self.prompt_tokens += prompt_tokens
            self.kv_usage = min(1.0, self.in_flight * 0.01)
            return True

    def token(self, since: list[float] | None = None) -> None:
        """One generated token; ``since``: ``[arrival, last token or None]`` of its request, for the
        latency histograms (TTFT from the arrival, then one inter-token sample per token)."""
        time.sleep(self.token_delay)
        while self.stalled.is_set():  # a hung engine: this request never gets its next token
            time.sleep(3600)
        now = time.monotonic()
        with self.lock:
            if since is not None:
                (self.ttft if since[1] is None else self.itl).observe(now - (since[1] or since[0]))
                since[1] = now
            self.generation_tokens += 1
            if self.spec:
                k = int(self.spec.get("num_speculative_tokens") or 1)
                self.drafts += 1
                self.draft_tokens += k
                self.accepted += 1

    def with_token_ids(self, choice: dict[str, Any], body: dict[str, Any], prompt: str, n: int) -> None:
        """Fill ``choice`` as vLLM 0.32 does for ``return_token_ids`` (and ``logprobs``)."""
        match = option(self.fake, "diverge-match", "")
        after = option(self.fake, "diverge-after", "")
        diverge = int(after) if after and (not match or match in prompt) else None
        ids, greedy = greedy_answer(prompt, n, diverge)
        choice["token_ids"] = ids
        choice["prompt_token_ids"] = hashed_ids("prompt", prompt, max(1, len(prompt.split())))
        choice["text"] = "".join(piece(t) for t in ids)
        k = body.get("logprobs")
        if isinstance(k, int) and not isinstance(k, bool) and k >= 0:
            as_ids = bool(body.get("return_tokens_as_token_ids"))
            tops = top_logprobs(ids, greedy, prompt, k)
            if not as_ids:
                tops = [{piece(int(key[9:])): lp for key, lp in t.items()} for t in tops]
            choice["logprobs"] = {
                "tokens": [f"token_id:{t}" if as_ids else piece(t) for t in ids],
                "token_logprobs": [
                    t[f"token_id:{i}" if as_ids else piece(i)] for t, i in zip(tops, ids, strict=True)
                ],
                "top_logprobs": tops,
                "text_offset": [len(piece(0)) * j for j in range(len(ids))],
            }

    def end(self, reason: str) -> None:
        with self.lock:
            self.in_flight -= 1
            self.finished[reason] = self.finished.get(reason, 0) + 1
            self.kv_usage = min(1.0, self.in_flight * 0.01)


def handler_for(srv: Server) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: Any) -> None:
            pass

        def reply(self, code: int, body: bytes = b"", kind: str = "application/json") -> None:
            self.send_response(code)
            self.send_header("Content-Type", kind)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_GET(self) -> None:
            path = self.path.split("?", 1)[0]
            if path in ("/health", "/ping"):
                self.reply(200 if srv.loaded else 503)
                if srv.loaded:
                    srv.seen_healthy.set()
            elif path == "/version":
                self.reply(200, json.dumps({"version": VERSION}).encode())
            elif path == "/metrics":
                self.reply(200, srv.metrics().encode(), "text/plain; version=0.0.4; charset=utf-8")
            elif path == "/v1/models" and srv.loaded:
                self.reply(
                    200,
                    json.dumps({"object": "list", "data": [{"id": srv.name, "object": "model"}]}).encode(),
                )
            else:
                self.reply(404, b'{"detail":"Not Found"}')

        def do_POST(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            try:
                body = json.loads(self.rfile.read(length) or b"{}")
            except ValueError:
                self.reply(400, b'{"error":"bad json"}')
                return
            if self.path == "/detokenize" and srv.loaded:
                tokens = body.get("tokens")
                if not isinstance(tokens, list) or not all(isinstance(t, int) and t >= 0 for t in tokens):
                    self.reply(400, b'{"error":"tokens must be a list of token ids"}')
                    return
                self.reply(200, json.dumps({"prompt": "".join(piece(t) for t in tokens)}).encode())
                return
            if self.path not in ("/v1/completions", "/v1/chat/completions") or not srv.loaded:
                self.reply(404, b'{"detail":"Not Found"}')
                return
            if srv.group is not None and srv.group.lost():  # the engine's next step finds a member gone
                say("AsyncLLM output_handler failed.", level="ERROR", where="async_llm.py:906")
                say(
                    "vllm.v1.engine.exceptions.EngineDeadError: EngineCore encountered an issue. See stack "
                    "trace (above) for the root cause.",
                    level="ERROR",
                    where="async_llm.py:906",
                )
                self.reply(
                    500,
                    json.dumps(
                        {
                            "error": {
                                "message": "EngineCore encountered an issue. See stack "
                                "trace (above) for the root cause.",
                                "type": "InternalServerError",
                                "code": 500,
                            }
                        }
                    ).encode(),
                )
                srv.engine_dead = True
                return
            prompt = str(body.get("prompt") or body.get("messages") or "")
            n = int(body.get("max_tokens") or 16)
            since: list[Any] = [time.monotonic(), None]
            if not srv.begin(len(prompt.split())):
                self.reply(503, b'{"error":"shutting down"}')
                return
            reason = "length"
            try:
                if body.get("stream"):
                    self.send_response(200)
                    self.send_header("Content-Type", "text/event-stream")
                    self.send_header("Connection", "close")
                    self.end_headers()
                    for i in range(n):
                        srv.token(since)
                        chunk = {
                            "id": "cmpl-fake",
                            "object": "text_completion",
                            "model": srv.name,
                            "choices": [{"index": 0, "text": f" t{i}", "finish_reason": None}],
                        }
                        self.wfile.write(f"data: {json.dumps(chunk)}\n\n".encode())
                        self.wfile.flush()
                    self.wfile.write(b"data: [DONE]\n\n")
                    self.wfile.flush()
                    self.close_connection = True
                else:
                    for _ in range(n):
                        srv.token(since)
                    text = "".join(f" t{i}" for i in range(n))
                    reply = {
                        "id": "cmpl-fake",
                        "object": "text_completion",
                        "model": srv.name,
                        "choices": [{"index": 0, "text": text, "finish_reason": "length"}],
                        "usage": {
                            "prompt_tokens": len(prompt.split()),
                            "completion_tokens": n,
                            "total_tokens": len(prompt.split()) + n,
                        },
                    }
                    if body.get("return_token_ids"):
                        srv.with_token_ids(reply["choices"][0], body, prompt, n)
                    self.reply(200, json.dumps(reply).encode())
            except OSError:
                reason = "abort"
            finally:
                srv.end(reason)

    return Handler


TTFT_BUCKETS = (
    0.001,
    0.005,
    0.01,
    0.02,
    0.04,
    0.06,
    0.08,
    0.1,
    0.25,
    0.5,
    0.75,
    1.0,
    2.5,
    5.0,
    7.5,
    10.0,
    20.0,
    40.0,
    80.0,
    160.0,
    640.0,
    2560.0,
)
ITL_BUCKETS = (
    0.01,
    0.025,
    0.05,
    0.075,
    0.1,
    0.15,
    0.2,
    0.3,
    0.4,
    0.5,
    0.75,
    1.0,
    2.5,
    5.0,
    7.5,
    10.0,
    20.0,
    40.0,
    80.0,
)


class Histogram:
    """A Prometheus histogram's state: counts per bucket edge, the count and the sum."""

    def __init__(self, edges: tuple[float, ...]) -> None:
        self.edges = edges
        self.counts = [0] * len(edges)
        self.count = 0
        self.sum = 0.0

    def observe(self, v: float) -> None:
        self.count += 1
        self.sum += v
        for i, edge in enumerate(self.edges):
            if v <= edge:
                self.counts[i] += 1
                break

    def cumulative(self) -> list[tuple[str, int]]:
        out, total = [], 0
        for edge, n in zip(self.edges, self.counts, strict=True):
            total += n
            out.append((repr(float(edge)), total))
        return [*out, ("+Inf", self.count)]


class Group:
    """A multi-node group as vLLM's mp backend forms one (``--nnodes N``), over plain TCP at
    ``--master-addr``:``--master-port``. Node 0 listens and takes the first N-1 members that connect
    (each is welcomed with one byte); it keeps listening without taking more, so a member that comes
    later waits at the rendezvous for good. Node 0 only finds a member gone when its engine takes a
    step (:meth:`lost`, at the next completion); a member whose node 0 has gone stays alive, joined to
    nothing. What real vLLM 0.32 does (supervise/group.py)."""

    def __init__(self, addr: str, port: int, n: int) -> None:
        self.addr, self.port, self.n = addr, port, n
        self.members: list[socket.socket] = []
        self.listener: socket.socket | None = None

    def form(self, stop: Flag) -> bool:
        """Node 0: wait for the other N-1 nodes (False when asked to stop first)."""
        ls = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        ls.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        ls.bind((self.addr, self.port))
        ls.listen(16)
        ls.settimeout(0.2)
        self.listener = ls
        while len(self.members) < self.n - 1:
            if stop.up:
                return False
            try:
                conn, _ = ls.accept()
            except TimeoutError:
                continue
            conn.settimeout(5)
            try:
                conn.recv(16)  # the member's rank: read, so that only its going is left to see
            except OSError:
                conn.close()
                continue
            conn.settimeout(None)  # blocking again: lost() peeks with MSG_DONTWAIT
            conn.sendall(b"W")
            self.members.append(conn)
            say(
                f"world_size={self.n} rank={len(self.members)} joined",
                "Worker",
                where="parallel_state.py:1906",
            )
        return True

    def lost(self) -> bool:
        for conn in self.members:
            try:
                if conn.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT) == b"":
                    return True
            except BlockingIOError:
                continue
            except OSError:
                return True
        return False

    def join(self, rank: int, stop: Flag) -> bool:
        """A headless node: connect and wait to be welcomed (False when asked to stop first)."""
        conn: socket.socket | None = None
        while conn is None:
            if stop.up:
                return False
            try:
                conn = socket.create_connection((self.addr, self.port), timeout=0.5)
            except OSError:
                stop.wait(0.2)
        conn.sendall(str(rank).encode())
        conn.settimeout(0.2)
        while not stop.up:
            try:
                got = conn.recv(1)
            except TimeoutError:
                continue
            except OSError:
                got = b""
            if got == b"W":
                self.members.append(conn)  # held open: node 0 sees this process go when it does
                say(
                    f"world_size={self.n} rank={rank} distributed_init_method=tcp://{self.addr}:{self.port}",
                    "Worker",
                    where="parallel_state.py:1906",
                )
                return True
            if got == b"":  # node 0 went: joined to nothing, and it stays so (as vLLM's does)
                while not stop.wait(0.5):
                    pass
                return False
        return False


def kv_check(model_dir: str, args: dict[str, Any]) -> tuple[int, int, float]:
    """(KV tokens vLLM reports, max_model_len, max concurrency); exits like vLLM when the cache cannot
    hold one request of max_model_len."""
    with open(os.path.join(model_dir, "config.json")) as f:
        cfg = json.load(f)
    layers = int(cfg.get("num_hidden_layers", 2))
    heads = int(cfg.get("num_attention_heads", 4))
    kv_heads = int(cfg.get("num_key_value_heads", heads))
    kv_heads = max(1, kv_heads // int(args.get("tensor_parallel_size") or 1))  # each worker holds its share
    head_dim = int(cfg.get("head_dim") or int(cfg.get("hidden_size", 128)) // heads)
    dtype = str(args.get("kv_cache_dtype", "auto"))
    width = 1 if dtype.startswith("fp8") else 4 if str(args.get("dtype")) == "float32" else 2
    per_token = 2 * layers * kv_heads * head_dim * width
    if "kv_cache_memory_bytes" in args:
        kv_bytes = size_of(args["kv_cache_memory_bytes"])
    else:
        kv_bytes = int(float(os.environ.get("VLLM_CPU_KVCACHE_SPACE") or 4) * 2**30)
    block = int(args.get("block_size") or os.environ.get("FAKEVLLM_BLOCK_SIZE") or 128)
    max_len = int(args.get("max_model_len") or cfg.get("max_position_embeddings", 2048))
    blocks = kv_bytes // (block * per_token)
    usable = max(0, blocks - 1) * block  # one block is vLLM's null block
    if usable < max_len:
        need, have = max_len * per_token / 2**30, usable * per_token / 2**30
        say(
            f"ValueError: To serve at least one request with the models's max seq len ({max_len}), "
            f"({need:.2f} GiB KV cache is needed, which is larger than the available KV cache memory "
            f"({have:.2f} GiB). Based on the available memory, the estimated maximum model length is "
            f"{usable}. Try increasing `kv_cache_memory_bytes` or decreasing `max_model_len` when "
            "initializing the engine.",
            "EngineCore",
            "ERROR",
            "core.py:1000",
        )
        print(
            "RuntimeError: Engine core initialization failed. See root cause above. Failed core proc(s): {}"
        )
        sys.exit(1)
    per_request = -(-max_len // block)
    concurrency = blocks // per_request
    return concurrency * max_len, max_len, blocks * block / max_len


def count_start(fake: dict[str, str]) -> int:
    """How many starts came before this one (0 without a counter file)."""
    path = option(fake, "counter", "")
    if not path:
        return 0
    try:
        with open(path) as f:
            n = int(f.read().strip() or 0)
    except (OSError, ValueError):
        n = 0
    with open(path, "w") as f:
        f.write(str(n + 1))
    return n


class Flag:
    """Set by a signal handler, waited for by the main thread. Not a ``threading.Event``: its
    ``set()`` takes the lock its ``wait()`` holds between bytecodes, so a handler that runs in the
    main thread at that moment deadlocks it (a process that never exits on SIGTERM)."""

    def __init__(self) -> None:
        self.up = False

    def set(self) -> None:
        self.up = True  # one store: safe in a handler

    def wait(self, timeout: float) -> bool:
        end = time.monotonic() + timeout
        while not self.up and time.monotonic() < end:
            time.sleep(min(0.02, max(0.0, end - time.monotonic())))
        return self.up


def headless(group: Group, rank: int) -> int:
    """``--headless``: no API server; this node's workers join node 0's group and serve in it."""
    stop = Flag()
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    engine = subprocess.Popen(
        [sys.executable, "-c", ENGINE, str(PID), "fakevllm-Worker"], stdin=subprocess.DEVNULL
    )
    say(
        f"Launching vLLM (v{VERSION}) headless multiproc executor, with head node address "
        f"{group.addr}:{group.port} for torch.distributed process group.",
        "MainProcess",
        where="serve.py:224",
    )
    group.join(rank, stop)
    while not stop.wait(0.2):
        pass
    engine.kill()
    engine.wait()
    return 0


def main(argv: list[str]) -> int:
    model, args, fake, unknown = parse(argv)
    log_argv = os.environ.get("FAKEVLLM_ARGV_LOG")
    if log_argv:
        with open(log_argv, "a") as f:
            f.write(json.dumps({"t": time.time(), "pid": PID, "argv": argv}) + "\n")
    modes = {m.strip() for m in option(fake, "mode", "").split(",") if m.strip()}
    if "crash-after" in fake or os.environ.get("FAKEVLLM_CRASH_AFTER"):
        modes.add("crash")
    fail_times = option(fake, "fail-times", "")
    if fail_times and count_start(fake) >= int(fail_times):
        modes = set()  # this start is past the failing ones: healthy
    if "ignore-term" in modes:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    say(f"vLLM API server version {VERSION}", where="utils.py:299")
    if unknown:
        print("usage: vllm serve [model_tag] [options]")
        print(f"vllm: error: unrecognized arguments: {' '.join(unknown)}")
        return 2
    host, port = str(args.get("host") or "0.0.0.0"), int(args.get("port") or 8000)
    shown = {"model_tag": model, **args}
    say(f"non-default args: {shown}", where="api_utils.py:286")
    ast.literal_eval(repr(shown))  # what hwprofile parses must parse
    if not model or not os.path.isfile(os.path.join(model, "config.json")):
        print("Traceback (most recent call last):")
        print(
            f"huggingface_hub.errors.HFValidationError: Repo id must be in the form 'repo_name' or "
            f"'namespace/repo_name': '{model}'. Use `repo_type` argument if needed."
        )
        return 1
    nnodes = int(args.get("nnodes") or 1)
    group = None
    if nnodes > 1:
        group = Group(
            str(args.get("master_addr") or "127.0.0.1"), int(args.get("master_port") or 29501), nnodes
        )
    if args.get("headless"):
        assert group is not None, "--headless needs --nnodes > 1"
        return headless(group, int(args.get("node_rank") or 0))
    try:
        httpd = _Listener((host, port), None)  # type: ignore[arg-type]
    except OSError as e:
        print(
            f"OSError: [Errno {e.errno}] error while attempting to bind on address ('{host}', {port}): {e.strerror.lower()}"
        )
        return 1
    srv = Server(model, args, float(option(fake, "token-delay", "0.01")))
    srv.fake = fake
    httpd.RequestHandlerClass = handler_for(srv)
    httpd.daemon_threads = True
    threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
    stop = Flag()
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    if "ignore-term" not in modes:
        signal.signal(signal.SIGTERM, lambda *_: stop.set())

    engine = subprocess.Popen(  # an "EngineCore" child in our process group, as vLLM has
        [sys.executable, "-c", ENGINE, str(PID), "fakevllm-EngineCore"],
        stdin=subprocess.DEVNULL,
    )

    def leave(code: int) -> int:
        engine.kill()
        engine.wait()
        return code

    if "warn" in modes:
        say("a warning of vLLM's own, for its log file", "EngineCore", "WARNING", "fake.py:1")
    if "noisy" in modes:
        for i in range(int(os.environ.get("FAKEVLLM_NOISE_LINES") or 20000)):
            say(f"loading shard {i}: " + "x" * 60, "EngineCore", where="loader.py:1")
    if "oom" in modes:
        say("EngineCore failed to start.", "EngineCore", "ERROR", "core.py:1000")
        print("Traceback (most recent call last):")
        print(
            "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total "
            "capacity of 23.64 GiB of which 1.02 GiB is free."
        )
        return leave(1)
    if "die" in modes:
        say("EngineCore failed to start.", "EngineCore", "ERROR", "core.py:1000")
        print(
            "RuntimeError: Engine core initialization failed. See root cause above. Failed core proc(s): {}"
        )
        return leave(1)
    try:
        tokens, max_len, concurrency = kv_check(model, args)
    except SystemExit as e:
        return leave(int(e.code or 1))
    delay = float(option(fake, "ready-delay", "0.3"))
    end = time.monotonic() + delay
    while "hang" in modes or time.monotonic() < end:
        if stop.wait(min(0.5, max(0.01, end - time.monotonic())) if "hang" not in modes else 0.5):
            say("Shutting down while loading.")
            return leave(0)
        if "hang" in modes:
            say("Loading weights ... (still)", "EngineCore", where="loader.py:2")
    if group is not None and not group.form(stop):
        say("Shutting down while loading.")
        return leave(0)
    srv.group = group
    pool = os.environ.get("FAKEVLLM_KV_POOL_GIB")  # a GPU worker's profiled pool (vLLM 0.33 gpu_worker.py)
    if pool and "kv_cache_memory_bytes" not in args:
        compiled = os.environ.get("FAKEVLLM_COMPILE", "")
        if compiled == "cold":
            say(
                "Compiling a graph for compile range (1, 8192) takes 41.20 s",
                "EngineCore",
                where="backends.py:418",
            )
        elif compiled == "warm":
            say(
                "Directly load the compiled graph(s) for compile range (1, 8192) from the cache, took 3.101 s",
                "EngineCore",
                where="backends.py:311",
            )
        say(f"Available KV cache memory: {pool} GiB", "EngineCore", where="gpu_worker.py:775")
    elif pool:
        say(
            f"Initial free memory 23.10 GiB, reserved {size_of(args['kv_cache_memory_bytes']) / 2**30:.2f} GiB memory "
            "for KV Cache as specified by kv_cache_memory_bytes config and skipped memory profiling.",
            "EngineCore",
            where="gpu_worker.py:676",
        )
    say(
        f"CPU KV cache size: {tokens:,} tokens, Maximum concurrency for {max_len:,} tokens per request: {concurrency:.2f}x",
        "EngineCore",
        where="kv_cache_utils.py:2327",
    )
    say(f"Starting vLLM API server 0 on http://{host}:{port}", where="api_server.py:2000")
    print("INFO:     Application startup complete.", flush=True)
    srv.loaded = True
    if "crash" in modes:
        after = float(option(fake, "crash-after", "0.5"))
        code = int(option(fake, "exit-code", "1"))

        def crash() -> None:
            srv.seen_healthy.wait(60)  # a crash of a ready server: one its supervisor saw ready
            time.sleep(after)
            say(
                "Engine core proc EngineCore_DP0 died unexpectedly, shutting down client.",
                level="ERROR",
                where="core_client.py:600",
            )
            sys.stdout.flush()
            engine.kill()
            os._exit(code)

        threading.Thread(target=crash, daemon=True).start()
    if "stall" in modes and _stalls(fake, port):
        after = float(option(fake, "stall-after", "0.5"))

        def stall() -> None:
            srv.seen_healthy.wait(60)
            time.sleep(after)
            with srv.lock:
                srv.stuck = int(option(fake, "stall-waiting", "2"))
                srv.stalled.set()

        threading.Thread(target=stall, daemon=True).start()
    if "sick" in modes:
        after = float(option(fake, "sick-after", "0.5"))

        def sicken() -> None:
            time.sleep(after)
            say(
                "Engine core proc EngineCore_DP0 died unexpectedly.",
                level="ERROR",
                where="core_client.py:600",
            )
            engine.kill()
            srv.loaded = False  # /health 503 from now on; the process stays

        threading.Thread(target=sicken, daemon=True).start()
    while not stop.wait(0.2):
        if srv.engine_dead:
            time.sleep(0.2)  # the 500 goes out first
            httpd.shutdown()
            httpd.server_close()
            return leave(0)
    say("Shutting down FastAPI HTTP server.", where="launcher.py:100")
    with srv.lock:
        srv.accepting = False
    httpd.shutdown()
    timeout = float(args.get("shutdown_timeout") or 0)
    deadline = time.monotonic() + timeout if timeout > 0 else None
    while srv.in_flight and (deadline is None or time.monotonic() < deadline):
        time.sleep(0.05)
    if srv.in_flight:
        say(f"{srv.in_flight} requests still running after {timeout:.0f} s: aborted", level="WARNING")
    httpd.server_close()
    return leave(0)


# -- `vllm bench serve` -----------------------------------------------------------------------------
BENCH_VALUED = {
    "backend",
    "endpoint",
    "base-url",
    "model",
    "tokenizer",
    "dataset-name",
    "random-input-len",
    "random-output-len",
    "num-prompts",
    "max-concurrency",
    "request-rate",
    "temperature",
    "percentile-metrics",
    "metric-percentiles",
    "seed",
    "result-dir",
    "result-filename",
    "input-len",
    "output-len",
    "dataset-path",
    "sharegpt-output-len",
}
BENCH_FLAGS = {"ignore-eos", "disable-tqdm", "save-result"}


def _percentile(values: list[float], p: float) -> float:
    if not values:
        return 0.0
    v = sorted(values)
    k = (len(v) - 1) * p / 100
    lo = int(k)
    hi = min(lo + 1, len(v) - 1)
    return v[lo] + (v[hi] - v[lo]) * (k - lo)


def _spec_counters(base: str) -> dict[str, float] | None:
    import urllib.request

    with urllib.request.build_opener(urllib.request.ProxyHandler({})).open(
        base + "/metrics", timeout=10
    ) as r:
        text = r.read().decode()
    out: dict[str, float] = {}
    for line in text.splitlines():
        if line.startswith("vllm:spec_decode") and line.split("{", 1)[0].endswith("_total"):
            name = line.split("{", 1)[0]
            if "per_pos" in name:
                name += "[" + line.split('position="', 1)[1].split('"', 1)[0] + "]"
            out[name] = out.get(name, 0.0) + float(line.rsplit(" ", 1)[1])
    return out or None


def bench_main(argv: list[str]) -> int:
    import http.client
    import itertools
    import urllib.parse
    from concurrent.futures import ThreadPoolExecutor

    opts: dict[str, str] = {}
    i = 0
    while i < len(argv):
        name = argv[i][2:] if argv[i].startswith("--") else ""
        if name in BENCH_FLAGS:
            opts[name] = "1"
            i += 1
        elif name in BENCH_VALUED and i + 1 < len(argv):
            opts[name] = argv[i + 1]
            i += 2
        else:
            print(f"vllm: error: unrecognized arguments: {argv[i]}", file=sys.stderr)
            return 2
    if os.environ.get("FAKEVLLM_BENCH_FAIL"):
        print(f"RuntimeError: {os.environ['FAKEVLLM_BENCH_FAIL']}", file=sys.stderr)
        return 1
    base = opts["base-url"].rstrip("/")
    parts = urllib.parse.urlsplit(base)
    n, conc = int(opts.get("num-prompts", 1000)), int(opts.get("max-concurrency") or 10**6)
    in_len, out_len = int(opts.get("random-input-len", 1024)), int(opts.get("random-output-len", 128))
    texts = [" ".join(["w"] * in_len)]
    if (
        opts.get("dataset-name") == "sharegpt"
    ):  # as vLLM's ShareGPTDataset: the first turn of each conversation
        with open(opts["dataset-path"], encoding="utf-8") as f:
            texts = [
                c["conversations"][0]["value"] for c in json.load(f) if len(c.get("conversations", ())) >= 2
            ]
        out_len = int(opts.get("sharegpt-output-len", 128))
        in_len = sum(len(t.split()) for t in texts) // len(texts)
    extra_ttft = float(os.environ.get("FAKEVLLM_BENCH_TTFT_MS_PER_CONCURRENCY") or 0) * min(conc, n) / 1000

    def one(k: int) -> tuple[float, list[float], float]:
        body = json.dumps(
            {
                "model": opts.get("model"),
                "prompt": texts[k % len(texts)],
                "max_tokens": out_len,
                "stream": True,
                "ignore_eos": True,
                "temperature": 0,
            }
        ).encode()
        conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=60)
        t0 = time.perf_counter()
        conn.request("POST", "/v1/completions", body, {"Content-Type": "application/json"})
        resp = conn.getresponse()
        stamps: list[float] = []
        for line in resp:
            if line.startswith(b"data: {"):
                stamps.append(time.perf_counter())
        conn.close()
        ttft = stamps[0] - t0 + extra_ttft
        itl = [b - a for a, b in itertools.pairwise(stamps)]
        return ttft, itl, stamps[-1] - t0 + extra_ttft

    before = _spec_counters(base)
    one(0)  # vLLM's "initial single prompt test run"
    t0 = time.perf_counter()
    with ThreadPoolExecutor(max_workers=min(conc, n)) as pool:
        outs = list(pool.map(one, range(n)))
    duration = time.perf_counter() - t0
    after = _spec_counters(base)
    ttfts = [o[0] for o in outs]
    itls = [x for o in outs for x in o[1]]
    tpots = [(o[2] - o[0]) / (out_len - 1) for o in outs] if out_len > 1 else [0.0]
    e2els = [o[2] for o in outs]
    res: dict[str, Any] = {
        "date": time.strftime("%Y%m%d-%H%M%S"),
        "endpoint_type": opts.get("backend", "openai"),
        "backend": opts.get("backend", "openai"),
        "label": None,
        "model_id": opts.get("model"),
        "tokenizer_id": opts.get("tokenizer"),
        "num_prompts": n,
        "request_rate": "inf",
        "burstiness": 1.0,
        "max_concurrency": int(opts["max-concurrency"]) if "max-concurrency" in opts else None,
        "duration": duration,
        "completed": n,
        "failed": 0,
        "total_input_tokens": n * in_len,
        "total_output_tokens": n * out_len,
        "request_throughput": n / duration,
        "request_goodput": None,
        "output_throughput": n * out_len / duration,
        "total_token_throughput": n * (in_len + out_len) / duration,
        "max_output_tokens_per_s": float(out_len),
        "max_concurrent_requests": min(conc, n),
        "rtfx": 0.0,
    }
    if before is not None and after is not None:
        d = {k: after[k] - before.get(k, 0.0) for k in after}
        drafts = d.get("vllm:spec_decode_num_drafts_total", 0.0)
        acc = d.get("vllm:spec_decode_num_accepted_tokens_total", 0.0)
        tokens = d.get("vllm:spec_decode_num_draft_tokens_total", 0.0)
        res.update(
            {
                "spec_decode_acceptance_rate": acc / tokens * 100 if tokens else 0.0,
                "spec_decode_acceptance_length": 1 + acc / drafts if drafts else 1.0,
                "spec_decode_num_drafts": int(drafts),
                "spec_decode_draft_tokens": int(tokens),
                "spec_decode_accepted_tokens": int(acc),
            }
        )
    pcts = [float(p) for p in opts.get("metric-percentiles", "99").split(",")]
    for metric, values in (("ttft", ttfts), ("tpot", tpots), ("itl", itls), ("e2el", e2els)):
        if metric not in opts.get("percentile-metrics", "ttft,tpot,itl").split(","):
            continue
        ms = [v * 1000 for v in values] or [0.0]
        res[f"mean_{metric}_ms"] = sum(ms) / len(ms)
        res[f"median_{metric}_ms"] = _percentile(ms, 50)
        res[f"std_{metric}_ms"] = 0.0
        for p in pcts:
            res[f"p{int(p) if int(p) == p else p}_{metric}_ms"] = _percentile(ms, p)
    print(f"Successful requests: {n}\nOutput token throughput (tok/s): {res['output_throughput']:.2f}")
    if "save-result" in opts:
        path = os.path.join(opts.get("result-dir") or ".", opts.get("result-filename") or "result.json")
        with open(path, "w") as f:
            json.dump(res, f)
    return 0


if __name__ == "__main__":
    if sys.argv[1:] in (["--version"], ["-v"]):  # `vllm --version` prints the version alone
        print(VERSION)
        sys.exit(0)
    if sys.argv[1:3] == ["bench", "serve"]:
        sys.exit(bench_main(sys.argv[3:]))
    sys.exit(main(sys.argv[1:]))
