"""TTFT and TPOT under load from a discrete-event simulation of vLLM's (v1) scheduler (issue 32).

Pure: a per-step cost function and an arrival process in, per-request timings and a summary out. What is
simulated, as vLLM's ``vllm/v1/core/sched/scheduler.py`` does it:

- continuous batching: each engine step first serves the running requests (a decode token each, or the
  next chunk of a prompt still being prefilled), then admits waiting requests first come, first served;
- the step's token budget ``max_num_batched_tokens``: with chunked prefill a prompt is cut to what the
  budget leaves; without it a prompt waits until it fits the budget whole;
- ``max_num_seqs`` running requests at most;
- KV capacity in blocks of ``block_size`` tokens: a request is admitted only when its blocks are free;
  a running request that needs a block when none is free preempts the most recently admitted running
  request (recompute: its blocks are freed, it returns to the front of the queue and prefills again);
- the first token is sampled at the end of the step that completes the prompt; each later step adds one.

Outside the engine: a fixed per-request cost (HTTP, chat template, tokenization, detokenization of the
stream) added to the time to first token, and the API server's request-rate ceiling (a single FIFO of CPU
work per request) before a request reaches the engine's queue.

Steps in which nothing changes but every running request decoding one more token are advanced together
(up to the next arrival, finish or KV block boundary), so the events simulated stay bounded by the
requests, not by their tokens.
"""

from __future__ import annotations

import heapq
import math
from collections import deque
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from collections.abc import Sequence

# Fitted, not measured here: issue 32's comparison of 30 published vLLM serving figures found low-load TTFT
# 20-45 ms above a model of the engine's steps alone (HTTP, chat template, tokenization). The midpoint.
REQUEST_OVERHEAD_S = 0.030
REQUEST_OVERHEAD_SOURCE = "fitted: issue 32, low-load TTFT measured 20-45 ms above the step model (midpoint)"
# The API server's request-rate ceiling (a FIFO of per-request CPU work) is a mechanism the simulation
# has, but no default: issue 32 read ~30 requests/s from a Qwen3 burst of 128 in / 4 out on an H100, while
# the same lab's bursts of the same shape reached 184-212 requests/s with gpt-oss-20b on A100 and H100
# (benchmarks/data/validation_serving*.yaml): the limit is not one per-request constant. Unknown: None.
API_SERVER_MAX_RPS: float | None = None
API_SERVER_SOURCE = (
    "unknown: issue 32's ~30 requests/s (Qwen3 on H100) is refuted as a constant by gpt-oss-20b's "
    "184-212 requests/s on the same lab's hosts (benchmarks/data/validation_serving*.yaml)"
)


class StepCost(Protocol):
    """Seconds of one engine step: ``prefill_tokens`` prompt tokens (attending ``prefill_context`` tokens
    on average) beside ``decode_seqs`` decoding sequences (at ``decode_context`` tokens on average)."""

    def __call__(
        self, prefill_tokens: int, decode_seqs: int, decode_context: float, prefill_context: float, /
    ) -> float: ...


@dataclass(frozen=True)
class Engine:
    """The scheduler's limits, as the plan sets them."""

    max_num_seqs: int
    max_num_batched_tokens: int
    kv_tokens: int  # the KV cache's capacity in tokens (one instance)
    chunked_prefill: bool = True
    block_size: int = 16
    request_overhead_s: float = REQUEST_OVERHEAD_S
    api_max_rps: float | None = API_SERVER_MAX_RPS


@dataclass(frozen=True)
class Arrivals:
    """Who sends what, when: ``kind`` concurrency (a closed loop of ``concurrency`` clients, each sending
    its next request when its last one ends, as ``vllm bench serve --max-concurrency`` does), burst (all
    ``num_requests`` at time 0) or poisson (``rate`` requests/s, seeded, optionally capped at
    ``concurrency`` in flight as ``vllm bench serve --request-rate R --max-concurrency C`` does)."""

    kind: str
    num_requests: int
    input_len: int
    output_len: int
    concurrency: int | None = None
    rate: float | None = None
    seed: int = 0

    def __post_init__(self) -> None:
        if self.kind not in ("concurrency", "burst", "poisson"):
            raise ValueError(f"arrival kind {self.kind!r}: concurrency, burst or poisson")
        if self.kind == "concurrency" and not self.concurrency:
            raise ValueError("a closed loop needs its concurrency")
        if self.kind == "poisson" and not self.rate:
            raise ValueError("a Poisson process needs its rate")
        if self.input_len < 1 or self.output_len < 1 or self.num_requests < 1:
            raise ValueError("input_len, output_len and num_requests are at least 1")


@dataclass
class _Req:
    rid: int
    sent: float  # when the client sent it
    input_len: int
    output_len: int
    queued: float = 0.0  # when it reached the engine's queue
    computed: int = 0  # tokens whose KV is in the cache (prompt chunks, then generated ones)
    generated: int = 0
    blocks: int = 0
    first_token: float | None = None
    finished: float | None = None
    preemptions: int = 0

    @property
    def prompt_left(self) -> int:
        """Tokens to compute before the next token is sampled: the prompt, or after a preemption the
        prompt and the tokens generated so far (recomputed); 0 while decoding."""
        target = self.input_len if self.generated == 0 else self.input_len + self.generated - 1
        return max(0, target - self.computed)


@dataclass(frozen=True)
class RequestTiming:
    rid: int
    ttft_s: float
    tpot_s: float | None  # None for a single output token
    e2e_s: float
    preemptions: int


@dataclass(frozen=True)
class SimResult:
    requests: tuple[RequestTiming, ...]
    duration_s: float
    output_tokens_per_s: float
    steps: int  # engine steps simulated
    events: int  # loop iterations (steps advanced together count once)
    preemptions: int
    peak_running: int
    notes: tuple[str, ...] = field(default=())

    def _stat(self, values: Sequence[float], stat: str) -> float:
        if not values:
            return float("nan")
        return median(values) if stat == "median" else sum(values) / len(values)

    def ttft_ms(self, stat: str = "median") -> float:
        return 1e3 * self._stat([r.ttft_s for r in self.requests], stat)

    def tpot_ms(self, stat: str = "median") -> float:
        return 1e3 * self._stat([r.tpot_s for r in self.requests if r.tpot_s is not None], stat)

    def e2e_ms(self, stat: str = "median") -> float:
        return 1e3 * self._stat([r.e2e_s for r in self.requests], stat)

    def decode_rate_sum(self) -> float:
        """The sum over the requests of each one's own decode rate, 1 / its TPOT (tokens after its first
        one over the time from its first token to its last): what a benchmark that sends a wave of
        requests together and adds up their per-request decode rates reports. Each request's window
        holds the steps in which the prompts admitted after it are prefilled (a decode token rides on
        each such step), so the early requests of a wave decode far slower than the last one."""
        return sum(1.0 / r.tpot_s for r in self.requests if r.tpot_s)

    def to_json(self) -> dict[str, object]:
        return {
            "ttft_ms": {"median": round(self.ttft_ms(), 2), "mean": round(self.ttft_ms("mean"), 2)},
            "tpot_ms": {"median": round(self.tpot_ms(), 3), "mean": round(self.tpot_ms("mean"), 3)},
            "e2e_ms": {"median": round(self.e2e_ms(), 1)},
            "output_tokens_per_s": round(self.output_tokens_per_s, 1),
            "duration_s": round(self.duration_s, 3),
            "requests": len(self.requests),
            "steps": self.steps,
            "events": self.events,
            "preemptions": self.preemptions,
            "peak_running": self.peak_running,
            "notes": list(self.notes),
        }


def median(values: Sequence[float]) -> float:
    xs = sorted(values)
    n = len(xs)
    return xs[n // 2] if n % 2 else (xs[n // 2 - 1] + xs[n // 2]) / 2


def _blocks(tokens: int, block_size: int) -> int:
    return -(-tokens // block_size)


def simulate(cost: StepCost, engine: Engine, arrivals: Arrivals, max_events: int = 200_000) -> SimResult:
    """Run ``arrivals`` through ``engine`` with ``cost`` per step; stops (with a note) after ``max_events``."""
    if engine.max_num_seqs < 1 or engine.max_num_batched_tokens < 1:
        raise ValueError("max_num_seqs and max_num_batched_tokens are at least 1")
    total_blocks = engine.kv_tokens // engine.block_size
    notes: list[str] = []
    a = arrivals
    if _blocks(a.input_len + a.output_len, engine.block_size) > total_blocks:
        raise ValueError(
            f"one request ({a.input_len + a.output_len} tokens) exceeds the KV cache ({engine.kv_tokens})"
        )
    if not engine.chunked_prefill and a.input_len > engine.max_num_batched_tokens:
        raise ValueError("without chunked prefill a prompt must fit max_num_batched_tokens")

    # -- the clients: times at which requests are sent ---------------------------------------------
    import random  # only Poisson arrivals draw

    rng = random.Random(a.seed)
    sends: list[tuple[float, int]] = []  # heap of (time, rid)
    in_flight_cap = a.concurrency if a.kind != "burst" else None
    pending_sends: deque[float] = deque()  # poisson times waiting for a free client slot
    next_rid = 0
    if a.kind == "burst":
        sends = [(0.0, i) for i in range(a.num_requests)]
        next_rid = a.num_requests
    elif a.kind == "concurrency":
        for _ in range(min(a.num_requests, a.concurrency or 1)):
            sends.append((0.0, next_rid))
            next_rid += 1
    else:
        t = 0.0
        for _ in range(a.num_requests):
            pending_sends.append(t)
            t += rng.expovariate(a.rate or 1.0)
    heapq.heapify(sends)
    in_flight = 0

    def release_poisson(now: float) -> None:
        nonlocal next_rid, in_flight
        while pending_sends and (in_flight_cap is None or in_flight < in_flight_cap):
            t0 = max(pending_sends.popleft(), now)
            heapq.heappush(sends, (t0, next_rid))
            next_rid += 1
            in_flight += 1

    if a.kind == "poisson":
        release_poisson(0.0)
    elif a.kind == "concurrency":
        in_flight = len(sends)

    # -- the API server: a FIFO of per-request CPU work, then the fixed latency ----------------------
    api_free = 0.0
    arriving: list[tuple[float, int, _Req]] = []  # heap of (time it reaches the engine queue, rid, req)

    def send_all_due(now: float) -> None:
        nonlocal api_free
        while sends and sends[0][0] <= now + 1e-12:
            t0, rid = heapq.heappop(sends)
            r = _Req(rid, t0, a.input_len, a.output_len)
            # the fixed cost includes the CPU work: only what exceeds it is added after the FIFO
            service = 1.0 / engine.api_max_rps if engine.api_max_rps else 0.0
            api_free = max(api_free, t0) + service
            r.queued = api_free + max(0.0, engine.request_overhead_s - service)
            heapq.heappush(arriving, (r.queued, rid, r))

    waiting: deque[_Req] = deque()
    running: list[_Req] = []
    done: list[_Req] = []
    free_blocks = total_blocks
    now = 0.0
    steps = events = preemptions = peak = 0

    def next_event_time() -> float:
        ts = [arriving[0][0]] if arriving else []
        if sends:
            ts.append(sends[0][0])
        return min(ts) if ts else math.inf

    while len(done) < a.num_requests:
        events += 1
        if events > max_events:
            notes.append(
                f"stopped after {max_events} events: {len(done)} of {a.num_requests} requests finished"
            )
            break
        send_all_due(now)
        while arriving and arriving[0][0] <= now + 1e-12:
            waiting.append(heapq.heappop(arriving)[2])
        if not running and not waiting:
            t = next_event_time()
            if t == math.inf:
                break
            now = max(now, t)
            continue

        budget = engine.max_num_batched_tokens
        prefill_tokens = 0
        prefill_ctx_sum = 0.0
        decode: list[_Req] = []
        chunks: list[tuple[_Req, int]] = []
        # running requests first: their next chunk or their next token, preempting for blocks if need be
        i = 0
        if (
            len(running) <= budget
            and free_blocks >= len(running)
            and all(r.computed >= r.input_len for r in running)
        ):
            # the common case: every running request decodes one token (a block at most each)
            bs = engine.block_size
            for r in running:
                if r.prompt_left:
                    break
                if r.computed % bs == 0:
                    free_blocks -= 1
                    r.blocks += 1
                decode.append(r)
                i += 1
            budget -= i
        while i < len(running) and budget > 0:
            r = running[i]
            left = r.prompt_left
            n = min(left, budget) if left > 0 else 1
            need = _blocks(r.computed + n, engine.block_size) - r.blocks
            while need > free_blocks and len(running) - 1 > i:
                victim = running.pop()
                free_blocks += victim.blocks
                victim.blocks, victim.computed = 0, 0
                victim.preemptions += 1
                preemptions += 1
                waiting.appendleft(victim)
            if need > free_blocks:
                break  # cannot happen with one request fitting the cache; kept as a guard
            free_blocks -= need
            r.blocks += need
            budget -= n
            if left > 0:
                chunks.append((r, n))
            else:
                decode.append(r)
            i += 1
        # then waiting requests, first come first served (no admission in a step that preempted)
        while waiting and len(running) < engine.max_num_seqs and budget > 0:
            r = waiting[0]
            left = r.prompt_left
            if not engine.chunked_prefill and left > budget:
                break
            n = min(left, budget)
            need = _blocks(r.computed + n, engine.block_size)
            if need > free_blocks:
                break
            waiting.popleft()
            free_blocks -= need
            r.blocks = need
            budget -= n
            running.append(r)
            chunks.append((r, n))
        peak = max(peak, len(running))
        for r, n in chunks:
            prefill_tokens += n
            prefill_ctx_sum += n * (r.computed + n / 2)
        dec_ctx = sum(r.computed for r in decode) / len(decode) if decode else 0.0
        pre_ctx = prefill_ctx_sum / prefill_tokens if prefill_tokens else 0.0

        # how many identical decode-only steps can be taken together
        k = 1
        if not chunks and decode and len(decode) == len(running):
            k = min(r.output_len - r.generated for r in decode)
            horizon = next_event_time()
            c1 = cost(0, len(decode), dec_ctx, 0.0)
            if horizon < math.inf and c1 > 0:
                k = min(k, max(1, math.ceil((horizon - now) / c1)))
            # the blocks k tokens more need (the one of this step is already allocated)
            while k > 1:
                extra = sum(_blocks(r.computed + k, engine.block_size) - r.blocks for r in decode)
                if extra <= free_blocks:
                    break
                k = max(1, k // 2)
            if k > 1:
                extra = sum(_blocks(r.computed + k, engine.block_size) - r.blocks for r in decode)
                free_blocks -= extra
                for r in decode:
                    r.blocks = _blocks(r.computed + k, engine.block_size)
            dur = k * cost(0, len(decode), dec_ctx + (k - 1) / 2, 0.0)
        else:
            dur = cost(prefill_tokens, len(decode), dec_ctx, pre_ctx)
        now += dur
        steps += k
        for r in decode:
            r.computed += k
            r.generated += k
        for r, n in chunks:
            r.computed += n
            if r.prompt_left == 0:
                if r.generated == 0:
                    r.first_token = now
                r.generated += 1
        ended = [r for r in running if r.generated >= r.output_len]
        if ended:
            running = [r for r in running if r.generated < r.output_len]
        for r in ended:
            r.finished = now
            free_blocks += r.blocks
            r.blocks = 0
            done.append(r)
            if a.kind == "concurrency":
                if next_rid < a.num_requests:
                    heapq.heappush(sends, (now, next_rid))
                    next_rid += 1
            elif a.kind == "poisson":
                in_flight -= 1
                release_poisson(now)

    timings = []
    for r in done:
        assert r.first_token is not None and r.finished is not None
        tpot = (r.finished - r.first_token) / (r.output_len - 1) if r.output_len > 1 else None
        timings.append(RequestTiming(r.rid, r.first_token - r.sent, tpot, r.finished - r.sent, r.preemptions))
    start = min((r.sent for r in done), default=0.0)
    end = max((r.finished or 0.0 for r in done), default=0.0)
    duration = max(1e-9, end - start)
    out = sum(r.output_len for r in done)
    return SimResult(tuple(sorted(timings, key=lambda t: t.rid)), duration, out / duration, steps, events,
                     preemptions, peak, tuple(notes))  # fmt: skip


# -- figures with their evidence -------------------------------------------------------------------

BANDS_FILE = "prediction_bands.yaml"  # hwprofile/data/: written by benchmarks/bench_predict.py --write-bands


def regime(arrivals: Arrivals, result: SimResult | None = None) -> str:
    """The validation regime a prediction falls in: single (one request at a time), burst (all at once),
    kv-limited (the simulation preempted), loaded (anything else)."""
    if result is not None and result.preemptions:
        return "kv-limited"
    if arrivals.kind == "burst":
        return "burst"
    if arrivals.kind == "concurrency" and arrivals.concurrency == 1:
        return "single"
    return "loaded"


def bands() -> dict[str, dict[str, dict[str, Any]]]:
    """{regime: {figure: {'lo', 'hi', 'median', 'n', 'source'}}}: predicted/measured ratios of the
    validation set (benchmarks/data/validation_*.yaml); empty where the file is absent."""
    import os

    path = os.path.join(os.path.dirname(os.path.dirname(__file__)), "data", BANDS_FILE)
    if not os.path.exists(path):
        return {}
    from ..config.yamlsrc import load_file

    doc = load_file(path)[0] or {}
    return dict(doc.get("regimes") or {})


def figures(result: SimResult, arrivals: Arrivals, cost_source: str) -> dict[str, Any]:
    """The simulated figures, each with where it comes from and its error band (the validation set's
    10th-90th percentile ratio in this regime; None with the reason where the set has none)."""
    reg = regime(arrivals, result)
    table = bands().get(reg, {})
    how = {
        "concurrency": f"a closed loop of {arrivals.concurrency} clients",
        "burst": "all requests at once",
        "poisson": f"Poisson arrivals at {arrivals.rate} requests/s",
    }[arrivals.kind]
    src = (f"simulated: vLLM's scheduler over {arrivals.num_requests} requests of {arrivals.input_len} in / "
           f"{arrivals.output_len} out, {how}; per-step cost {cost_source}")  # fmt: skip

    def fig(name: str, value: float, extra: str = "") -> dict[str, Any]:
        b = table.get(name)
        band = (
            {
                "ratio_lo": b["lo"],
                "ratio_hi": b["hi"],
                "median_ratio": b["median"],
                "points": b["n"],
                "source": b.get("source", BANDS_FILE),
            }
            if b
            else None
        )
        out: dict[str, Any] = {"value": round(value, 3), "source": src + extra, "regime": reg, "band": band}
        if band is None:
            out["band_unknown"] = f"no validation points for {name} in regime {reg} ({BANDS_FILE})"
        return out

    return {
        "regime": reg,
        "ttft_ms": fig(
            "ttft_ms",
            result.ttft_ms(),
            f"; + {REQUEST_OVERHEAD_S * 1e3:g} ms per request ({REQUEST_OVERHEAD_SOURCE})",
        ),
        "ttft_ms_mean": round(result.ttft_ms("mean"), 2),
        "tpot_ms": fig("tpot_ms", result.tpot_ms()),
        "tpot_ms_mean": round(result.tpot_ms("mean"), 3),
        "output_tokens_per_s": fig("output_tokens_per_s", result.output_tokens_per_s),
        **(
            {
                "decode_rate_sum_tok_s": fig(
                    "decode_rate_sum_tok_s",
                    result.decode_rate_sum(),
                    "; the sum of each request's own decode rate (1 / its TPOT) over the wave",
                )
            }
            if arrivals.kind == "burst"
            else {}
        ),
        "preemptions": result.preemptions,
        "peak_running": result.peak_running,
        "events": result.events,
        "notes": list(result.notes),
    }
