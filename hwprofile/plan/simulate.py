"""TTFT and TPOT under load from a discrete-event simulation of vLLM's (v1) scheduler (issue 32).

Pure: a per-step cost function and an arrival process in, per-request timings and a summary out. What is
simulated, as vLLM's ``vllm/v1/core/sched/scheduler.py`` does it:

- continuous batching: each engine step first serves the running requests (a decode token each, or the
  next chunk of a prompt still being prefilled), then admits waiting requests first come, first served;
- the step's token budget ``max_num_batched_tokens``: with chunked prefill a prompt is cut to what the
  budget leaves; without it a prompt waits until it fits the budget whole;
- ``max_num_seqs`` running requests at most;
- KV capacity in blocks of ``block_size`` tokens: a request is admitted only when its blocks are free;
  where vLLM's allocator keeps several KV cache groups (sliding-window layers beside full ones: gpt-oss,
  Gemma) a block is one page of each of a group's layers from the shared pool, and a request holds its
  tokens' blocks in each full group but only its window's in each sliding one (``Engine.kv_groups``);
  a running request that needs a block when none is free preempts the most recently admitted running
  request (recompute: its blocks are freed, it returns to the front of the queue and prefills again),
  and a step that preempted admits no waiting request;
- the first token is sampled at the end of the step that completes the prompt; each later step adds one;
- each request its own lengths: the workload's, or spread about them as a dataset's are (``Arrivals.lengths``,
  :func:`request_lengths`: ShareGPT's), so that requests end apart and short ones leave early.

Outside the engine (plan/servercost.py says how much, and from what evidence):

- vLLM's API server, one asyncio process in front of EngineCore since V1, as one CPU: each request costs
  ``api_request_s`` of it before it reaches the engine's queue (HTTP, the chat template where the
  endpoint renders one, tokenization, the request's set-up), each streamed output token
  ``api_token_s`` (detokenization, the SSE chunk) and each engine step that streams any ``api_step_s``
  (the output handler's wake-up, the step's outputs received and decoded) before the client sees it, and
  each request as it ends ``api_finish_s`` (the last chunk, the response closed) with its last token. The
  output handler
  (vllm/v1/engine/async_llm.py, ``output_handler``) and the request handlers take turns on one event
  loop: while requests wait to be admitted the outputs get ``api_token_share`` of the CPU (about half),
  otherwise all of it, and the CPU never idles while work waits; the engine does not wait for the API
  server (no back-pressure): it runs ahead, the tokens queue.
  A burst's requests, sent together, share the rest equally (processor sharing), as the loop's round
  robin among their handlers does, each awaiting in turn (body, chat template, tokenizer, ``add_request``):
  they reach the engine together, near the end of the burst's admission work, not one by one, and the
  engine's steps then run full of prompt chunks, each decode token of the burst riding one. Requests sent
  one by one (a closed loop, Poisson arrivals) are admitted in the order sent: a closed loop's clients
  send as their last requests end, staggered by the client's and the server's work per request, which the
  simulation's lockstep clients lack (measured on this project's CPU VM, vLLM 0.32: a burst of 16 or 32
  requests ends its admissions together, the median TTFT at the latest's: docs/validation-serving.md);
- a fixed latency per request (``request_overhead_s``, beyond the API server's CPU) added to TTFT; where
  the API server shares its CPU with EngineCore (vLLM's CPU backend on few CPUs) that latency, measured
  on this host at one client, is work on that CPU (``frontend_request_s``: the client's, HTTP,
  tokenization, the hand-over), admitted as the API server's admissions are, behind the outputs' work,
  in a closed loop (its clients send each request as the last ends: measured there; a burst's requests,
  sent together, pay the API server's admission alone, as measured on that VM);
- the engine step's own CPU (scheduler, input preparation, sampling, output processing) grows with the
  sequences it schedules: ``step_seq_s`` each, serial with the GPU's work unless the release schedules
  asynchronously (``async_scheduling``: the CPU work of step n+1 overlaps the GPU's of step n).

Steps in which nothing changes but every running request decoding one more token are advanced together
(up to the next arrival, finish or KV block boundary), so the events simulated stay bounded by the
requests, not by their tokens.
"""

from __future__ import annotations

import heapq
import math
from collections import deque
from dataclasses import field
from functools import lru_cache
from typing import TYPE_CHECKING, Any, Protocol

from ..record import record, state

if TYPE_CHECKING:
    from collections.abc import Sequence

    from .servercost import ServerCosts

# Fitted, not measured here: issue 32's comparison of 30 published vLLM serving figures found low-load TTFT
# 20-45 ms above a model of the engine's steps alone (HTTP, chat template, tokenization). The midpoint.
REQUEST_OVERHEAD_S = 0.030
REQUEST_OVERHEAD_SOURCE = "fitted: issue 32, low-load TTFT measured 20-45 ms above the step model (midpoint)"
# A bare request-rate ceiling has no default: issue 32 read ~30 requests/s from a Qwen3 burst of 128 in /
# 4 out on an H100, while the same lab's bursts of the same shape reached 184-212 requests/s with
# gpt-oss-20b on A100 and H100 (benchmarks/data/validation_serving*.yaml): the limit is not one
# per-request constant. The API server's CPU per request and per streamed token, beside the engine's, is
# plan/servercost.py's (the plan passes it through :func:`engine_for`).
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


@record
class Engine:
    """The scheduler's limits, as the plan sets them."""

    max_num_seqs: int
    max_num_batched_tokens: int
    kv_tokens: int  # the KV cache's capacity in tokens (one instance): the pool's blocks x block_size
    chunked_prefill: bool = True
    block_size: int = 16
    # vLLM's KV cache groups (v1/core/kv_cache_utils.py), each its window in tokens (0: every token the
    # request has): one group of every layer unless sliding-window layers are kept apart (:meth:`blocks`)
    kv_groups: tuple[int, ...] = (0,)
    request_overhead_s: float = REQUEST_OVERHEAD_S
    api_max_rps: float | None = API_SERVER_MAX_RPS  # a request-rate ceiling: 1 / api_request_s
    # plan/servercost.py: CPU outside the GPU's step (0: not modelled, as a bare Engine has it)
    api_request_s: float = 0.0
    api_token_s: float = 0.0
    api_step_s: float = 0.0  # the API server's CPU per engine step that streams tokens (its output handler)
    api_finish_s: float = 0.0  # the API server's CPU per request as it ends (the last chunk, the response)
    step_seq_s: float = 0.0
    async_scheduling: bool = False
    api_token_share: float = 1.0  # the API server's CPU the outputs get while requests wait to be admitted
    # the work per request on the CPU the API server shares with EngineCore, its own included (0: the
    # API server has a CPU of its own, its admission alone waits there)
    frontend_request_s: float = 0.0

    def blocks(self, tokens: int, new: int) -> int:
        """The pool's blocks a request holds (:func:`held_blocks`)."""
        return held_blocks(self.kv_groups, tokens, new, self.block_size)

    @property
    def request_cpu_s(self) -> float:
        """The API server's CPU per request: ``api_request_s``, else the ceiling's ``1 / api_max_rps``."""
        if self.api_request_s:
            return self.api_request_s
        return 1.0 / self.api_max_rps if self.api_max_rps else 0.0

    @property
    def admission_s(self) -> float:
        """The CPU work a request waits for before the engine's queue: the API server's, or the shared
        CPU's (``frontend_request_s``) where that is more."""
        return max(self.request_cpu_s, self.frontend_request_s)


def held_blocks(groups: Sequence[int], tokens: int, new: int, block: int) -> int:
    """The pool's blocks a request holds with ``tokens`` in the cache, ``new`` of them computed in this
    step, over KV cache groups of windows ``groups`` (0: the whole context): in a full group all its
    tokens'; in a sliding group of window ``w`` those from the window before the step on (vLLM's
    SlidingWindowManager frees the blocks before ``computed - w + 1`` as it schedules,
    ``remove_skipped_blocks``), the step's new tokens with them."""
    whole = -(-tokens // block)
    held = 0
    for w in groups:
        held += whole - max(0, (tokens - new - w + 1) // block) if w else whole
    return held


def engine_for(
    max_num_seqs: int,
    max_num_batched_tokens: int,
    kv_tokens: int,
    chunked_prefill: bool,
    costs: ServerCosts | None,
    kv_groups: tuple[int, ...] = (0,),
) -> Engine:
    """The plan's engine, with plan/servercost.py's CPU costs (None: the engine's GPU work alone)."""
    if costs is None:
        return Engine(max_num_seqs, max_num_batched_tokens, kv_tokens, chunked_prefill, kv_groups=kv_groups)
    return Engine(
        max_num_seqs,
        max_num_batched_tokens,
        kv_tokens,
        chunked_prefill,
        kv_groups=kv_groups,
        api_request_s=costs.api_request_s,
        api_token_s=costs.api_token_s,
        api_step_s=costs.api_step_s,
        api_finish_s=costs.api_finish_s,
        api_token_share=costs.api_token_share,
        step_seq_s=costs.step_seq_s,
        async_scheduling=bool(costs.async_scheduling),
    )


@record
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
    # fixed (every request input_len / output_len) or sharegpt (spread about them: see LENGTHS; the
    # longest request, up to 2,048 tokens, must then fit the KV cache, and the means must be ones that
    # ShareGPT's filter can give, else :func:`request_lengths` refuses them)
    lengths: str = "fixed"
    # the endpoint the clients call: completions (what `hwprofile bench` sends: no chat template) or chat
    # (the model's chat renderer: plan/servercost.py chat_renderer); the plan costs the API server by it
    endpoint: str = "completions"

    def __post_init__(self) -> None:
        if self.kind not in ("concurrency", "burst", "poisson"):
            raise ValueError(f"arrival kind {self.kind!r}: concurrency, burst or poisson")
        if self.endpoint not in ("completions", "chat"):
            raise ValueError(f"endpoint {self.endpoint!r}: completions or chat")
        if self.lengths not in LENGTHS:
            raise ValueError(f"lengths {self.lengths!r}: {' or '.join(LENGTHS)}")
        if self.kind == "concurrency" and not self.concurrency:
            raise ValueError("a closed loop needs its concurrency")
        if self.kind == "poisson" and not self.rate:
            raise ValueError("a Poisson process needs its rate")
        if self.input_len < 1 or self.output_len < 1 or self.num_requests < 1:
            raise ValueError("input_len, output_len and num_requests are at least 1")


# How the requests' lengths spread about the workload's means. ShareGPT (``vllm bench serve --dataset-name
# sharegpt``) sends each conversation's first turn with its own reply's length as the output: long-tailed,
# most requests shorter than the mean. The dataset is not shipped, so only its means are known (the run's
# totals / requests): the spread taken is the exponential about each mean (the maximum-entropy law for a
# positive length of known mean), input and output independent, inside the filter vLLM's ShareGPT sampler
# applies (vllm/benchmarks/datasets.py, ``is_valid_sequence``: prompt and output at least 4 tokens, prompt
# at most 1,024, prompt + output at most 2,048), rescaled so the means stay the run's.
LENGTHS = ("fixed", "sharegpt")
SHAREGPT_MIN_LEN, SHAREGPT_MAX_PROMPT, SHAREGPT_MAX_TOTAL = 4, 1024, 2048


def request_lengths(a: Arrivals) -> list[tuple[int, int]]:
    """Each request's (input, output) tokens, by request id: the workload's own lengths, or (``sharegpt``)
    deterministic quantiles of the spread above, paired by a seeded shuffle so that long and short
    requests interleave in the order they are sent."""
    n = a.num_requests
    if a.lengths == "fixed":
        return [(a.input_len, a.output_len)] * n
    import random

    rng = random.Random(f"{a.seed}:lengths")  # its own stream: the Poisson gaps draw from another

    def spread(mean: float, hi: Sequence[int]) -> list[int]:
        base = [-math.log(1.0 - (i + 0.5) / n) for i in range(n)]  # unit-mean exponential quantiles
        rng.shuffle(base)
        scale, xs = mean, []
        for _ in range(32):  # the filter's clip moves the mean: rescale until it is the workload's again
            xs = [min(hi[i], max(SHAREGPT_MIN_LEN, round(scale * b))) for i, b in enumerate(base)]
            got = sum(xs) / n
            if abs(got - mean) < 0.5:
                break
            scale *= mean / got
        else:
            raise ValueError(
                f"lengths sharegpt: ShareGPT's filter (prompt and output at least {SHAREGPT_MIN_LEN} tokens, "
                f"prompt at most {SHAREGPT_MAX_PROMPT}, both at most {SHAREGPT_MAX_TOTAL}) gives a mean of "
                f"{got:.1f} tokens at best where {mean:g} is asked: use lengths fixed for such a workload"
            )
        return xs

    ins = spread(a.input_len, [SHAREGPT_MAX_PROMPT] * n)
    outs = spread(a.output_len, [max(SHAREGPT_MIN_LEN, SHAREGPT_MAX_TOTAL - x) for x in ins])
    return list(zip(ins, outs, strict=True))


@state
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
    v0: float = 0.0  # the API server's per-request admission progress when it was sent

    @property
    def prompt_left(self) -> int:
        """Tokens to compute before the next token is sampled: the prompt, or after a preemption the
        prompt and the tokens generated so far (recomputed); 0 while decoding."""
        target = self.input_len if self.generated == 0 else self.input_len + self.generated - 1
        return max(0, target - self.computed)


@record
class RequestTiming:
    rid: int
    ttft_s: float
    tpot_s: float | None  # None for a single output token
    e2e_s: float
    preemptions: int


@record
class SimResult:
    requests: tuple[RequestTiming, ...]
    duration_s: float
    output_tokens_per_s: float
    steps: int  # engine steps simulated
    events: int  # loop iterations (steps advanced together count once)
    preemptions: int
    peak_running: int
    notes: tuple[str, ...] = field(default=())
    engine_busy_s: float = 0.0  # the engine's steps, GPU and CPU
    api_busy_s: float = 0.0  # the API server's CPU: admissions and streamed tokens
    # the CPU the API server shares with EngineCore (``Engine.frontend_request_s``, a closed loop): its
    # work and the rest of each request's there; 0: not shared
    frontend_busy_s: float = 0.0

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
            "engine_busy_fraction": round(self.engine_busy_s / self.duration_s, 3),
            "api_busy_fraction": round(self.api_busy_s / self.duration_s, 3),
            **(
                {"frontend_busy_fraction": round(self.frontend_busy_s / self.duration_s, 3)}
                if self.frontend_busy_s
                else {}
            ),
            "notes": list(self.notes),
        }


def median(values: Sequence[float]) -> float:
    xs = sorted(values)
    n = len(xs)
    return xs[n // 2] if n % 2 else (xs[n // 2 - 1] + xs[n // 2]) / 2


@state
class _ApiServer:
    """vLLM's API server as one CPU: token work (``token_s`` per streamed token, ``step_s`` per engine
    step that streams any) from when the engine's outputs arrive, first come first served among themselves, with ``share`` of the CPU while admissions
    wait (all of it otherwise); admissions (``request_s`` per request) in the CPU time the token work
    leaves: ``shared`` (a burst), shared equally by the requests waiting (processor sharing: ``ps_v`` is
    the CPU each has had since the start, a request's ``v0`` what it was when the request was sent);
    otherwise one after another in the order sent (``head_done``: the CPU the first has had). ``segs``
    holds the token work not yet behind the admissions: (start, end, the fraction of that span it keeps
    the CPU busy)."""

    request_s: float
    token_s: float
    share: float = 1.0  # the CPU's share the token work gets while admissions wait (1: all of it)
    queue: deque[_Req] = field(default_factory=deque)  # sent, waiting for the CPU's admission work
    adm_clock: float = 0.0  # up to when the admission work is accounted
    segs: deque[tuple[float, float, float]] = field(default_factory=deque)
    tok_end: float = 0.0
    busy_s: float = 0.0  # CPU spent so far (admissions and tokens)
    next_admission: float = math.inf  # the queue's head, as the token work known so far lets it finish
    shared: bool = False  # the requests waiting share the CPU (a burst); else first come, first served
    ps_v: float = 0.0  # the admission CPU each waiting request has had since the start (processor sharing)
    v0_sum: float = 0.0  # the waiting requests' ``v0``, summed
    head_done: float = 0.0  # first come, first served: the CPU the first request waiting has had
    step_s: float = 0.0  # the output handler's CPU per engine step that streams tokens
    finish_s: float = 0.0  # the CPU per request as it ends, with its step's tokens
    own_s: float | None = None  # the API server's own share of ``request_s`` (None: all of it)
    shared_s: float = 0.0  # the rest of ``request_s`` spent so far: the shared CPU's, not the API server's

    def enqueue(self, r: _Req) -> None:
        """``r`` sent now (the admissions due before it accounted): it joins the requests waiting."""
        r.v0 = self.ps_v
        self.v0_sum += r.v0
        self.queue.append(r)

    def _finish(self, start: float, work: float) -> float:
        """When ``work`` seconds of admission CPU started at ``start`` end, around the token work."""
        if work <= 0:
            return start
        t, left = start, work
        for s0, e0, busy in self.segs:
            if e0 <= t:
                continue
            if s0 > t:
                if s0 - t >= left:
                    return t + left
                left -= s0 - t
                t = s0
            free = (e0 - t) * (1.0 - busy)
            if free >= left:
                return t + left / (1.0 - busy)
            left -= free
            t = e0
        return t + left

    def _capacity(self, start: float, end: float) -> float:
        """The CPU seconds the token work leaves the admissions between ``start`` and ``end``."""
        if end <= start:
            return 0.0
        t, free = start, 0.0
        for s0, e0, busy in self.segs:
            if e0 <= t:
                continue
            if s0 >= end:
                break
            if s0 > t:
                free += s0 - t
                t = s0
            e = min(e0, end)
            free += (e - t) * (1.0 - busy)
            t = e
            if t >= end:
                return free
        return free + max(0.0, end - t)

    def admit_due(self, now: float) -> list[_Req]:
        """The requests whose admission work ends by ``now``, each stamped with the time it ended. Shared,
        the admissions waiting split the CPU the token work leaves equally; with one cost per request
        they end in the order they were sent, either way."""
        out = []
        self.next_admission = math.inf
        q = self.queue
        while q:
            head = q[0]
            if self.shared:
                need = max(0.0, self.request_s - (self.ps_v - head.v0))
                work = need * len(q)
            else:
                need = work = max(0.0, self.request_s - self.head_done)
            done = self._finish(self.adm_clock, work) if work > 0 else self.adm_clock
            if done > now + 1e-12:
                got = self._capacity(self.adm_clock, now)
                if self.shared:
                    self.ps_v += got / len(q)
                else:
                    self.head_done += got
                self.adm_clock = max(self.adm_clock, now)
                self.next_admission = done
                break
            q.popleft()
            self.v0_sum -= head.v0
            self.ps_v += need if self.shared else 0.0
            self.head_done = 0.0
            self.adm_clock = done
            own = self.request_s if self.own_s is None else min(self.own_s, self.request_s)
            self.busy_s += own
            self.shared_s += self.request_s - own
            head.queued = done
            out.append(head)
        if not q:  # idle: the next request starts afresh
            self.adm_clock = max(self.adm_clock, now)
            self.ps_v = self.v0_sum = self.head_done = 0.0
        while self.segs and self.segs[0][1] <= self.adm_clock:
            self.segs.popleft()
        return out

    def deliver(self, first_end: float, last_end: float, tokens: int, steps: int, ending: int = 0) -> float:
        """The engine's ``steps`` steps, the first ending at ``first_end`` and the last at ``last_end``,
        each streaming ``tokens`` tokens, the last ending ``ending`` requests (``finish_s`` each): when
        the last step's tokens reach their clients."""
        if not (self.token_s or self.step_s or self.finish_s * ending) or not tokens:
            return last_end
        start = max(first_end, self.tok_end)
        work = steps * (self.step_s + tokens * self.token_s) + ending * self.finish_s
        self.busy_s += work
        end = start + work
        share = self.share
        if self.queue and share < 1.0:
            # the admissions waiting need ``rem`` seconds of CPU after ``start`` (no token work is known
            # past it): both share the CPU until they are done, then the tokens have all of it
            if self.shared:
                left = max(0.0, len(self.queue) * (self.request_s - self.ps_v) + self.v0_sum)
            else:
                left = max(0.0, len(self.queue) * self.request_s - self.head_done)
            rem = self._finish(self.adm_clock, left) - start
            if rem > 0:
                shared_until = start + rem / (1.0 - share)
                if start + work / share <= shared_until:
                    end = start + work / share
                else:
                    end = shared_until + work - (shared_until - start) * share
        end = max(end, last_end + self.step_s + tokens * self.token_s + ending * self.finish_s)
        if end > start:
            self.segs.append((start, end, min(1.0, work / (end - start))))
        self.tok_end = end
        while self.segs and self.segs[0][1] <= self.adm_clock:
            self.segs.popleft()
        return end


@state
class _Clients:
    """The clients and the API server in front of the engine: when each request is sent (a closed loop,
    a burst or a Poisson process) and when, after the API server's admission work and the fixed
    per-request latency, it reaches the engine's queue."""

    arrivals: Arrivals
    engine: Engine
    api: _ApiServer
    sends: list[tuple[float, int]] = field(default_factory=list)  # heap of (time, rid)
    pending_sends: deque[float] = field(default_factory=deque)  # poisson times waiting for a free client slot
    # heap of (time it reaches the engine's queue, rid, req)
    arriving: list[tuple[float, int, _Req]] = field(default_factory=list)
    next_rid: int = 0
    in_flight: int = 0
    lengths: list[tuple[int, int]] = field(default_factory=list)  # (input, output) by request id

    @classmethod
    def start(cls, arrivals: Arrivals, engine: Engine) -> _Clients:
        a = arrivals
        c = cls(
            a,
            engine,
            _ApiServer(
                # a closed loop's clients send each request as the last ends: its work on a shared CPU is
                # on the request's path (measured there); a burst's or Poisson's, the API server's alone
                engine.admission_s if a.kind == "concurrency" else engine.request_cpu_s,
                engine.api_token_s,
                engine.api_token_share,
                shared=a.kind == "burst",
                step_s=engine.api_step_s,
                finish_s=engine.api_finish_s,
                own_s=engine.request_cpu_s,
            ),
            lengths=request_lengths(a),
        )
        if a.kind == "burst":
            c.sends = [(0.0, i) for i in range(a.num_requests)]
            c.next_rid = a.num_requests
        elif a.kind == "concurrency":
            for _ in range(min(a.num_requests, a.concurrency or 1)):
                c.sends.append((0.0, c.next_rid))
                c.next_rid += 1
        else:
            import random  # only Poisson arrivals draw (the plan's closed loops do not)

            rng = random.Random(f"{a.seed}:gaps")  # apart from the lengths' stream (request_lengths)
            t = 0.0
            for _ in range(a.num_requests):
                c.pending_sends.append(t)
                t += rng.expovariate(a.rate or 1.0)
        heapq.heapify(c.sends)
        if a.kind == "poisson":
            c.release_poisson(0.0)
        return c

    def release_poisson(self, now: float) -> None:
        """Send the Poisson requests whose time has come, as far as the concurrency cap lets them."""
        cap = self.arrivals.concurrency
        while self.pending_sends and (cap is None or self.in_flight < cap):
            t0 = max(self.pending_sends.popleft(), now)
            heapq.heappush(self.sends, (t0, self.next_rid))
            self.next_rid += 1
            self.in_flight += 1

    def send_all_due(self, now: float) -> None:
        engine = self.engine
        api = self.api
        admitted: list[_Req] = []
        while self.sends and self.sends[0][0] <= now + 1e-12:
            t0, rid = heapq.heappop(self.sends)
            admitted += api.admit_due(t0)  # the admissions ending before it joins the share
            api.enqueue(_Req(rid, t0, *self.lengths[rid]))
        admitted += api.admit_due(now)
        # the fixed cost includes the CPU work: only what exceeds it is added after the admission
        latency = max(0.0, engine.request_overhead_s - api.request_s)
        for r in admitted:
            r.queued += latency
            heapq.heappush(self.arriving, (r.queued, r.rid, r))

    def arrived(self, now: float) -> list[_Req]:
        """The requests that have reached the engine's queue by ``now``, in order."""
        out = []
        while self.arriving and self.arriving[0][0] <= now + 1e-12:
            out.append(heapq.heappop(self.arriving)[2])
        return out

    def next_event_time(self) -> float:
        ts = [self.arriving[0][0]] if self.arriving else []
        if self.sends:
            ts.append(self.sends[0][0])
        return min([*ts, self.api.next_admission])

    def ended(self, at: float) -> None:
        """A request's last token reached its client at ``at``: the client sends the next one (closed
        loop) or frees a slot."""
        a = self.arrivals
        if a.kind == "concurrency":
            if self.next_rid < a.num_requests:
                heapq.heappush(self.sends, (at, self.next_rid))
                self.next_rid += 1
        elif a.kind == "poisson":
            self.in_flight -= 1
            self.release_poisson(at)


@state
class _Step:
    """What one engine step computes: prompt chunks and decode tokens, and the token budget left."""

    budget: int
    decode: list[_Req] = field(default_factory=list)
    chunks: list[tuple[_Req, int]] = field(default_factory=list)


@state
class _Scheduler:
    """The engine's state between steps, and the scheduler's phases as methods: serve the running
    requests (preempting for KV blocks), admit waiting ones, then run the step (several identical
    decode-only steps together) and retire the requests that ended."""

    cost: StepCost
    engine: Engine
    clients: _Clients
    free_blocks: int
    waiting: deque[_Req] = field(default_factory=deque)
    running: list[_Req] = field(default_factory=list)
    done: list[_Req] = field(default_factory=list)
    now: float = 0.0
    steps: int = 0
    preemptions: int = 0
    peak: int = 0
    busy_s: float = 0.0

    def _decode_all(self, step: _Step) -> int:
        """The common case: every running request decodes one token (a block at most each). Returns
        how many running requests were served (0 where the case does not hold)."""
        running = self.running
        groups = len(self.engine.kv_groups)
        if not (
            len(running) <= step.budget
            and self.free_blocks >= groups * len(running)
            and all(r.computed >= r.input_len for r in running)
        ):
            return 0
        blocks = self.engine.blocks
        i = 0
        for r in running:
            if r.prompt_left:
                break
            held = blocks(r.computed + 1, 1)
            self.free_blocks -= held - r.blocks
            r.blocks = held
            step.decode.append(r)
            i += 1
        step.budget -= i
        return i

    def _preempt_last(self) -> None:
        """Recompute preemption of the most recently admitted running request: its blocks are freed and
        it returns to the front of the queue."""
        victim = self.running.pop()
        self.free_blocks += victim.blocks
        victim.blocks, victim.computed = 0, 0
        victim.preemptions += 1
        self.preemptions += 1
        self.waiting.appendleft(victim)

    def _serve_running(self, step: _Step) -> None:
        """Running requests first: their next chunk or their next token, preempting for blocks if need be."""
        i = self._decode_all(step)
        running = self.running
        while i < len(running) and step.budget > 0:
            r = running[i]
            left = r.prompt_left
            n = min(left, step.budget) if left > 0 else 1
            need = self.engine.blocks(r.computed + n, n) - r.blocks
            while need > self.free_blocks and len(running) - 1 > i:
                self._preempt_last()
            if need > self.free_blocks:
                break  # cannot happen with one request fitting the cache; kept as a guard
            self.free_blocks -= need
            r.blocks += need
            step.budget -= n
            if left > 0:
                step.chunks.append((r, n))
            else:
                step.decode.append(r)
            i += 1

    def _admit(self, step: _Step) -> None:
        """Then waiting requests, first come first served (no admission in a step that preempted)."""
        engine = self.engine
        while self.waiting and len(self.running) < engine.max_num_seqs and step.budget > 0:
            r = self.waiting[0]
            left = r.prompt_left
            if not engine.chunked_prefill and left > step.budget:
                break
            n = min(left, step.budget)
            need = engine.blocks(r.computed + n, n)
            if need > self.free_blocks:
                break
            self.waiting.popleft()
            self.free_blocks -= need
            r.blocks = need
            step.budget -= n
            self.running.append(r)
            step.chunks.append((r, n))

    def _decode_run(self, decode: list[_Req], dec_ctx: float) -> tuple[int, float]:
        """How many identical decode-only steps can be taken together (up to the next arrival or finish,
        fewer where the free blocks would not last), their blocks allocated; returns that count and the
        seconds they take."""
        blocks = self.engine.blocks
        k = min(r.output_len - r.generated for r in decode)
        horizon = self.clients.next_event_time()
        c1 = self._step_s(self.cost(0, len(decode), dec_ctx, 0.0), len(decode))
        if horizon < math.inf and c1 > 0:
            k = min(k, max(1, math.ceil((horizon - self.now) / c1)))
        # the blocks k tokens more need (the one of this step is already allocated); a sliding group holds
        # its window's blocks throughout, one more at some steps than at the last: kept free for them
        slack = sum(1 for w in self.engine.kv_groups if w) * len(decode)
        while k > 1:
            extra = sum(blocks(r.computed + k, 1) - r.blocks for r in decode)
            if extra + slack <= self.free_blocks:
                break
            k = max(1, k // 2)
        if k > 1:
            extra = sum(blocks(r.computed + k, 1) - r.blocks for r in decode)
            self.free_blocks -= extra
            for r in decode:
                r.blocks = blocks(r.computed + k, 1)
        return k, k * self._step_s(self.cost(0, len(decode), dec_ctx + (k - 1) / 2, 0.0), len(decode))

    def _step_s(self, gpu_s: float, seqs: int) -> float:
        """A step's seconds: the GPU's and the engine's CPU for ``seqs`` scheduled sequences, one after
        the other, or overlapped where the release schedules asynchronously."""
        cpu = self.engine.step_seq_s * seqs
        return max(gpu_s, cpu) if self.engine.async_scheduling else gpu_s + cpu

    def _retire(self, delivered: float) -> None:
        """The requests that generated their last token end: their blocks are freed at once, their
        clients told when the API server has streamed the token (``delivered``)."""
        ended = [r for r in self.running if r.generated >= r.output_len]
        if ended:
            self.running = [r for r in self.running if r.generated < r.output_len]
        for r in ended:
            r.finished = delivered
            self.free_blocks += r.blocks
            r.blocks = 0
            self.done.append(r)
            self.clients.ended(delivered)

    def step(self) -> None:
        """One engine step (or several identical decode-only ones taken together)."""
        step = _Step(self.engine.max_num_batched_tokens)
        preempted = self.preemptions
        self._serve_running(step)
        # vLLM admits none in a step that preempted (``if not preempted_reqs``)
        if self.preemptions == preempted:
            self._admit(step)
        decode, chunks = step.decode, step.chunks
        self.peak = max(self.peak, len(self.running))
        prefill_tokens = 0
        prefill_ctx_sum = 0.0
        for r, n in chunks:
            prefill_tokens += n
            prefill_ctx_sum += n * (r.computed + n / 2)
        dec_ctx = sum(r.computed for r in decode) / len(decode) if decode else 0.0
        pre_ctx = prefill_ctx_sum / prefill_tokens if prefill_tokens else 0.0
        if not chunks and decode and len(decode) == len(self.running):
            k, dur = self._decode_run(decode, dec_ctx)
        else:
            gpu_s = self.cost(prefill_tokens, len(decode), dec_ctx, pre_ctx)
            k, dur = 1, self._step_s(gpu_s, len(decode) + len(chunks))
        start = self.now
        self.now += dur
        self.busy_s += dur
        self.steps += k
        for r in decode:
            r.computed += k
            r.generated += k
        sampled = len(decode)
        firsts = []
        for r, n in chunks:
            r.computed += n
            if r.prompt_left == 0:
                if r.generated == 0:
                    firsts.append(r)
                r.generated += 1
                sampled += 1
        ending = sum(r.generated >= r.output_len for r in self.running)
        delivered = self.clients.api.deliver(start + dur / k, self.now, sampled, k, ending)
        for r in firsts:
            r.first_token = delivered
        self._retire(delivered)


def _result(s: _Scheduler, events: int, notes: list[str]) -> SimResult:
    done = s.done
    timings = []
    for r in done:
        assert r.first_token is not None and r.finished is not None
        tpot = (r.finished - r.first_token) / (r.output_len - 1) if r.output_len > 1 else None
        timings.append(RequestTiming(r.rid, r.first_token - r.sent, tpot, r.finished - r.sent, r.preemptions))
    start = min((r.sent for r in done), default=0.0)
    end = max((r.finished or 0.0 for r in done), default=0.0)
    duration = max(1e-9, end - start)
    out = sum(r.output_len for r in done)
    api = s.clients.api.busy_s
    frontend = api + s.clients.api.shared_s if s.clients.api.shared_s else 0.0
    api_bound = max(api, frontend) >= 0.9 * duration
    waves = _waves_note(s, api_bound)
    if waves:
        notes.append(waves)
    if api_bound:
        which = "the CPU the API server shares with EngineCore" if frontend else "the API server's CPU"
        notes.append(
            f"{which} was busy {max(api, frontend) / duration:.0%} of the run: it, not the engine "
            f"({s.busy_s / duration:.0%} busy), bounds the throughput (plan/servercost.py)"
        )
    return SimResult(
        tuple(sorted(timings, key=lambda t: t.rid)),
        duration,
        out / duration,
        s.steps,
        events,
        s.preemptions,
        s.peak,
        tuple(notes),
        s.busy_s,
        api,
        frontend,
    )


def _waves_note(s: _Scheduler, api_bound: bool) -> str | None:
    """A closed loop of requests of one length, every client's request running at once: requests
    started together end together, so the clients send their next ones together again (``vllm bench
    serve --max-concurrency`` does the same), and each wave's prompts wait for each other's prefill.
    Said where the median request's TTFT is at least twice the shortest; None otherwise, and where
    something else makes requests wait (the KV cache, preemptions, no chunked prefill, the API server)."""
    a = s.clients.arrivals
    clients = min(a.concurrency or 1, a.num_requests)
    if a.kind != "concurrency" or a.lengths != "fixed" or api_bound or s.preemptions:
        return None
    if not s.engine.chunked_prefill or s.peak < clients or clients < 2:
        return None
    ttft = sorted(r.first_token - r.sent for r in s.done if r.first_token is not None)
    if len(ttft) < 4 or median(ttft) < 2 * ttft[0]:
        return None
    p90 = ttft[math.ceil(0.9 * len(ttft)) - 1]
    return (
        f"the {clients} clients sent in waves (requests of one length started together end together): "
        f"each wave's prompts wait for each other's prefill, TTFT {ttft[0] * 1e3:.0f} ms the shortest (no "
        f"prompt ahead of it), {median(ttft) * 1e3:.0f} ms the median, {p90 * 1e3:.0f} ms "
        "the 90th percentile; the same load arriving staggered waits about as long as the shortest"
    )


def simulate(cost: StepCost, engine: Engine, arrivals: Arrivals, max_events: int = 200_000) -> SimResult:
    """Run ``arrivals`` through ``engine`` with ``cost`` per step; stops (with a note) after ``max_events``."""
    if engine.max_num_seqs < 1 or engine.max_num_batched_tokens < 1:
        raise ValueError("max_num_seqs and max_num_batched_tokens are at least 1")
    if not 0.0 < engine.api_token_share <= 1.0:
        raise ValueError("api_token_share is a share of the API server's CPU: above 0, at most 1")
    total_blocks = engine.kv_tokens // engine.block_size
    notes: list[str] = []
    a = arrivals
    clients = _Clients.start(a, engine)
    longest = max(i + o for i, o in clients.lengths)
    if engine.blocks(longest, min(longest, engine.max_num_batched_tokens)) > total_blocks:
        raise ValueError(f"one request ({longest} tokens) exceeds the KV cache ({engine.kv_tokens})")
    if not engine.chunked_prefill and max(i for i, _ in clients.lengths) > engine.max_num_batched_tokens:
        raise ValueError("without chunked prefill a prompt must fit max_num_batched_tokens")
    s = _Scheduler(cost, engine, clients, total_blocks)
    events = 0
    while len(s.done) < a.num_requests:
        events += 1
        if events > max_events:
            notes.append(
                f"stopped after {max_events} events: {len(s.done)} of {a.num_requests} requests finished"
            )
            break
        clients.send_all_due(s.now)
        s.waiting.extend(clients.arrived(s.now))
        if not s.running and not s.waiting:
            t = clients.next_event_time()
            if t == math.inf:
                break
            s.now = max(s.now, t)
            continue
        s.step()
    return _result(s, events, notes)


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


@lru_cache(maxsize=1)
def bands() -> dict[str, dict[str, dict[str, Any]]]:
    """{regime: {figure: {'lo', 'hi', 'median', 'n', 'source'}}}: predicted/measured ratios of the
    validation set (benchmarks/data/validation_*.yaml); empty where the file is absent. Read once per
    process, like the other data tables (a plan simulates each candidate layout: read it once)."""
    import os

    path = os.path.join(os.path.dirname(os.path.dirname(__file__)), "data", BANDS_FILE)
    if not os.path.exists(path):
        return {}
    from ..config.yamlsrc import load_file

    doc = load_file(path)[0] or {}
    return dict(doc.get("regimes") or {})


def figures(
    result: SimResult,
    arrivals: Arrivals,
    cost_source: str,
    costs: ServerCosts | None = None,
    request_overhead_s: float = REQUEST_OVERHEAD_S,
    overhead_source: str = REQUEST_OVERHEAD_SOURCE,
) -> dict[str, Any]:
    """The simulated figures, each with where it comes from and its error band (the validation set's
    10th-90th percentile ratio in this regime; None with the reason where the set has none).
    ``request_overhead_s``: the fixed latency per request outside the engine, as simulated, and
    ``overhead_source`` where it comes from (0: none added)."""
    reg = regime(arrivals, result)
    table = bands().get(reg, {})
    src = _source(arrivals, cost_source, costs)

    def fig(name: str, value: float, extra: str = "") -> dict[str, Any]:
        return _figure(table.get(name), name, value, src + extra, reg)

    return {
        "regime": reg,
        "ttft_ms": fig(
            "ttft_ms",
            result.ttft_ms(),
            (
                f"; {request_overhead_s * 1e3:g} ms per request of the shared CPU's work ({overhead_source})"
                if result.frontend_busy_s
                else f"; + {request_overhead_s * 1e3:g} ms per request ({overhead_source})"
            )
            if request_overhead_s
            else "; no latency per request added",
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
        "server_costs": costs.to_json() if costs else None,
        "engine_busy_fraction": round(result.engine_busy_s / result.duration_s, 3),
        "api_busy_fraction": round(result.api_busy_s / result.duration_s, 3),
        **(
            {"frontend_busy_fraction": round(result.frontend_busy_s / result.duration_s, 3)}
            if result.frontend_busy_s
            else {}
        ),
        "events": result.events,
        "notes": list(result.notes),
    }


def _source(arrivals: Arrivals, cost_source: str, costs: ServerCosts | None) -> str:
    """What the simulated figures come from: the requests, how they arrive, the costs."""
    how = {
        "concurrency": f"a closed loop of {arrivals.concurrency} clients",
        "burst": "all requests at once",
        "poisson": f"Poisson arrivals at {arrivals.rate} requests/s",
    }[arrivals.kind]
    return (
        f"simulated: vLLM's scheduler over {arrivals.num_requests} requests of {arrivals.input_len} in / "
        f"{arrivals.output_len} out"
        + (
            " (means; ShareGPT's spread: exponential within its filter)"
            if arrivals.lengths == "sharegpt"
            else ""
        )
        + f", {how}; per-step cost {cost_source}; "
        + (f"CPU outside the GPU {costs.source}" if costs else "no CPU cost outside the GPU's step")
    )


def _figure(b: dict[str, Any] | None, name: str, value: float, source: str, reg: str) -> dict[str, Any]:
    """One simulated figure with its source and its regime's band (``b``: the bands file's entry)."""
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
    out: dict[str, Any] = {"value": round(value, 3), "source": source, "regime": reg, "band": band}
    if band is None:
        out["band_unknown"] = f"no validation points for {name} in regime {reg} ({BANDS_FILE})"
    return out
