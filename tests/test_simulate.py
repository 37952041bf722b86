"""plan/simulate.py: vLLM's scheduler simulated (issue 32). Each test drives the simulation with a per-step
cost it can compute by hand and checks a mechanism: the fixed per-request cost, chunked prefill under the
token budget, max_num_seqs queueing, KV preemption, the API server's rate ceiling, Poisson arrivals, the
bounded event count, and the plan's hook (predict.step_cost through candidates.simulated_figures)."""

from __future__ import annotations

import pytest

from hwprofile.plan import simulate as sim


def flat(prefill_s_per_token: float = 0.0, decode_s: float = 0.010):
    """A step costs ``decode_s`` plus ``prefill_s_per_token`` per prompt token."""

    def cost(prefill_tokens: int, decode_seqs: int, decode_context: float, prefill_context: float) -> float:
        return decode_s + prefill_s_per_token * prefill_tokens

    return cost


def engine(**kw: object) -> sim.Engine:
    base: dict[str, object] = dict(
        max_num_seqs=64,
        max_num_batched_tokens=2048,
        kv_tokens=1_000_000,
        request_overhead_s=0.0,
        api_max_rps=None,
    )
    return sim.Engine(**(base | kw))  # type: ignore[arg-type]


def test_single_request_ttft_is_overhead_plus_prefill_step_and_tpot_the_decode_step() -> None:
    res = sim.simulate(
        flat(1e-4), engine(request_overhead_s=0.03), sim.Arrivals("concurrency", 3, 1000, 11, concurrency=1)
    )
    assert res.ttft_ms() == pytest.approx(30 + 10 + 100)  # overhead, the step's fixed part, 1000 tokens
    assert res.tpot_ms() == pytest.approx(10)
    assert res.peak_running == 1 and res.preemptions == 0
    assert res.output_tokens_per_s == pytest.approx(33 / (3 * (0.14 + 10 * 0.01)))


def test_chunked_prefill_cuts_the_prompt_to_the_budget() -> None:
    one = sim.simulate(flat(0.0), engine(max_num_batched_tokens=512), sim.Arrivals("burst", 1, 2048, 2))
    assert one.ttft_ms() == pytest.approx(4 * 10)  # four chunks of 512, one step each
    with pytest.raises(ValueError, match="chunked prefill"):
        sim.simulate(
            flat(),
            engine(max_num_batched_tokens=512, chunked_prefill=False),
            sim.Arrivals("burst", 1, 2048, 2),
        )


def test_max_num_seqs_makes_the_rest_wait() -> None:
    arr = sim.Arrivals("burst", 8, 10, 101)
    free = sim.simulate(flat(), engine(max_num_seqs=8), arr)
    capped = sim.simulate(flat(), engine(max_num_seqs=4), arr)
    assert free.peak_running == 8 and capped.peak_running == 4
    assert free.ttft_ms("mean") == pytest.approx(10)
    # the second four start when the first four end: 101 steps later
    assert max(t.ttft_s for t in capped.requests) == pytest.approx(0.010 + 101 * 0.010, rel=0.02)


def test_a_full_kv_cache_preempts_and_recomputes() -> None:
    # 4 requests of 64 + 64 tokens need 32 blocks of 16 at their end; the cache holds 20
    res = sim.simulate(flat(), engine(kv_tokens=320, block_size=16), sim.Arrivals("burst", 4, 64, 64))
    assert res.preemptions > 0 and len(res.requests) == 4
    roomy = sim.simulate(flat(), engine(kv_tokens=4096, block_size=16), sim.Arrivals("burst", 4, 64, 64))
    assert roomy.preemptions == 0 and res.duration_s > roomy.duration_s
    assert sim.regime(sim.Arrivals("burst", 4, 64, 64), res) == "kv-limited"


def test_a_sliding_window_group_holds_only_the_window_of_a_long_request() -> None:
    """vLLM's allocator keeps sliding-window layers in groups of their own (gpt-oss: 18 full and 18
    sliding layers, two groups sharing one pool): a request holds every token's block in the full group
    but only its window's (plus the tokens the step computes) in the sliding one, the blocks before the
    window freed as it schedules (SlidingWindowManager.remove_skipped_blocks)."""
    # 32,000 tokens decoding one more: 2,000 full blocks + the 128-token window's 8
    assert sim.held_blocks((0, 128), 32_000, 1, 16) == 2_000 + 8
    # a 2,048-token chunk on top of 20,000: the window before it and the chunk, 136 blocks
    assert sim.held_blocks((0, 128), 22_048, 2_048, 16) == 1_378 + 136
    # a short request holds its own blocks in both groups; one group of every layer: its tokens' blocks
    assert sim.held_blocks((0, 128), 100, 100, 16) == 7 + 7
    assert sim.held_blocks((0,), 32_000, 1, 16) == 2_000
    # two requests of 2,000 + 10 tokens: 126 full blocks each and, prefilling 512 at a time, at most
    # 41 sliding ones; a pool of 2 x 167 blocks runs both at once with the window's group, while two
    # full groups of the same pool (every token in each) prefill one at a time
    arr = sim.Arrivals("burst", 2, 2000, 10)
    windowed = sim.simulate(
        flat(), engine(max_num_batched_tokens=512, kv_tokens=334 * 16, kv_groups=(0, 128)), arr
    )
    assert windowed.peak_running == 2 and windowed.preemptions == 0
    full = sim.simulate(flat(), engine(max_num_batched_tokens=512, kv_tokens=334 * 16, kv_groups=(0, 0)), arr)
    # there the second request's prompt waits for the first to end
    assert max(t.ttft_s for t in full.requests) > max(t.ttft_s for t in windowed.requests) + 0.05
    assert full.duration_s > windowed.duration_s


def test_a_tight_pool_with_sliding_groups_keeps_its_blocks_accounted(monkeypatch: pytest.MonkeyPatch) -> None:
    """With a sliding group beside the full one, a request's held blocks rise and fall as its window
    moves; every step the free blocks and those the running requests hold add up to the pool, and the
    free ones never go below zero."""
    total = 150
    seen: list[int] = []
    step = sim._Scheduler.step

    def checked(self: sim._Scheduler) -> None:
        step(self)
        assert self.free_blocks >= 0
        assert self.free_blocks + sum(r.blocks for r in self.running) == total
        seen.append(self.free_blocks)

    monkeypatch.setattr(sim._Scheduler, "step", checked)
    e = engine(max_num_batched_tokens=256, kv_tokens=total * 16, kv_groups=(0, 128))
    res = sim.simulate(flat(), e, sim.Arrivals("burst", 6, 600, 200))
    assert len(res.requests) == 6 and res.preemptions > 0 and min(seen) < 10


def _req(
    rid: int, prompt: int, output: int, computed: int = 0, generated: int = 0, blocks: int = 0
) -> sim._Req:
    r = sim._Req(rid, 0.0, prompt, output)
    r.computed, r.generated, r.blocks = computed, generated, blocks
    return r


def _scheduler(e: sim.Engine, free: int, running: list[sim._Req], waiting: list[sim._Req]) -> sim._Scheduler:
    """A scheduler in a given state: ``running`` and ``waiting`` requests, ``free`` KV blocks."""
    s = sim._Scheduler(flat(), e, sim._Clients.start(sim.Arrivals("burst", 1, 1, 2), e), free_blocks=free)
    s.running, s.waiting = running, sim.deque(waiting)
    return s


def test_a_step_that_preempts_admits_no_waiting_request() -> None:
    """vLLM's scheduler (v1 ``Scheduler.schedule``: ``if not preempted_reqs``) admits no waiting request in
    a step whose running requests had to preempt for KV blocks, even where blocks are free after it."""
    # 4 blocks of 16; 17 tokens a step: a recomputed prompt's first chunk fits the block a preemption frees
    e = engine(kv_tokens=64, block_size=16, max_num_batched_tokens=17)
    # two decoding requests hold the cache's 4 blocks; the older one's next token needs a third block
    old, young, waiting = _req(0, 16, 64, 32, 17, 2), _req(1, 32, 8, 20, 5, 2), _req(2, 16, 8)
    s = _scheduler(e, 0, [old, young], [waiting])
    s.step()
    assert s.preemptions == 1 and s.running == [old]  # the younger one gave its blocks to the older
    # neither admitted this step, though the preempted one's first chunk (16 tokens) fits the free block
    assert list(s.waiting) == [young, waiting] and young.blocks == waiting.blocks == 0
    assert s.free_blocks == 1  # two freed, one taken by the older request's new block: one left free
    # the same block free and no preemption: the waiting request is admitted in that step
    a, b, late = _req(0, 16, 8, 18, 3, 2), _req(1, 16, 8, 20, 5, 2), _req(2, 16, 8)
    calm = _scheduler(e, 1, [a, b], [late])
    calm.step()
    assert calm.preemptions == 0 and calm.running == [a, b, late] and late.blocks == 1


def test_the_api_server_ceiling_limits_a_burst_of_short_requests() -> None:
    arr = sim.Arrivals("burst", 300, 128, 4)
    gpu_only = sim.simulate(flat(1e-6, 0.002), engine(max_num_seqs=256), arr)
    capped = sim.simulate(flat(1e-6, 0.002), engine(max_num_seqs=256, api_max_rps=30.0), arr)
    assert capped.duration_s == pytest.approx(300 / 30.0, rel=0.02)
    assert gpu_only.duration_s < capped.duration_s / 5
    # the default ceiling and overhead come with their sources
    assert sim.API_SERVER_MAX_RPS is None and "refuted" in sim.API_SERVER_SOURCE
    assert "issue 32" in sim.REQUEST_OVERHEAD_SOURCE


def test_a_requests_end_costs_the_api_server_with_its_last_token() -> None:
    """``api_finish_s``: each request as it ends costs the API server that much with its last step's
    tokens: busier by one finish a request, and the last token reaches its client that much later
    where the API server has nothing else to do (one client: 5 ms later, the TTFT unchanged)."""
    arr = sim.Arrivals("concurrency", 8, 8, 10, concurrency=1)
    plain = sim.simulate(flat(0.0, 0.010), engine(api_token_s=1e-4), arr)
    ending = sim.simulate(flat(0.0, 0.010), engine(api_token_s=1e-4, api_finish_s=0.005), arr)
    assert ending.api_busy_s - plain.api_busy_s == pytest.approx(8 * 0.005, rel=1e-6)
    assert ending.e2e_ms() - plain.e2e_ms() == pytest.approx(5.0, rel=0.02)
    assert ending.ttft_ms() == pytest.approx(plain.ttft_ms(), rel=1e-6)
    # nothing streamed, nothing costed: a bare engine has no API server
    bare = sim.simulate(flat(0.0, 0.010), engine(), arr)
    assert bare.api_busy_s == 0.0


def test_the_api_server_streams_tokens_at_its_own_rate_and_the_engine_runs_ahead() -> None:
    # 50 requests of 8 in / 40 out at once, a GPU step of 1 ms: the engine is done in ~40 steps, but the
    # API server streams 2,000 tokens at 1 ms each: the clients see ~2 s, 1,000 tokens/s
    arr = sim.Arrivals("burst", 50, 8, 40)
    gpu_only = sim.simulate(flat(0.0, 0.001), engine(), arr)
    streamed = sim.simulate(flat(0.0, 0.001), engine(api_token_s=0.001), arr)
    assert gpu_only.duration_s == pytest.approx(0.040, rel=0.05)
    assert streamed.output_tokens_per_s == pytest.approx(1000.0, rel=0.03)
    # each request's tokens come one round of the 50 streams apart: TPOT 50 ms, not the step's 1 ms
    assert streamed.tpot_ms() == pytest.approx(50.0, rel=0.05)
    assert streamed.steps == gpu_only.steps  # the engine's own work did not change
    # the run says what bounds it: the API server busy all along, the engine a few percent of it
    assert streamed.api_busy_s / streamed.duration_s == pytest.approx(1.0, abs=0.03)
    assert streamed.engine_busy_s / streamed.duration_s < 0.05
    assert any("API server's CPU was busy" in n for n in streamed.notes) and not gpu_only.notes


def test_the_api_servers_cost_per_step_is_shared_by_the_steps_tokens() -> None:
    """The output handler's CPU per engine step (``api_step_s``) is paid once a step, whatever its tokens:
    with 2 ms a step and a 1 ms GPU step, the API server sets the pace of one stream and of eight alike
    (TPOT ~2 ms), where a cost per token of the same 2 ms would make eight streams eight times slower."""
    per_step = {
        c: sim.simulate(
            flat(0.0, 0.001),
            engine(api_step_s=0.002),
            sim.Arrivals("concurrency", 4 * c, 8, 40, concurrency=c),
        )
        for c in (1, 8)
    }
    per_token = sim.simulate(
        flat(0.0, 0.001), engine(api_token_s=0.002), sim.Arrivals("concurrency", 32, 8, 40, concurrency=8)
    )
    for res in per_step.values():
        assert res.tpot_ms() == pytest.approx(2.0, rel=0.05)
        assert res.api_busy_s / res.duration_s == pytest.approx(1.0, abs=0.05)
    assert per_token.tpot_ms() == pytest.approx(16.0, rel=0.05)


def test_admissions_share_the_api_server_with_each_other_and_with_the_streams() -> None:
    # 400 short requests at once, 2 ms of the API server's CPU to admit each: the event loop's round robin
    # among their handlers shares the CPU (processor sharing), so they reach the engine together after
    # 400 x 2 ms, not one every 2 ms as a first-come-first-served queue would let them in
    burst = sim.Arrivals("burst", 400, 16, 64)
    alone = sim.simulate(flat(0.0, 0.002), engine(api_request_s=0.002, max_num_seqs=512), burst)
    ttfts = [t.ttft_s for t in alone.requests]
    assert min(ttfts) == pytest.approx(400 * 0.002, rel=0.02)
    assert max(ttfts) == pytest.approx(400 * 0.002, rel=0.02)
    # sent one by one (a closed loop of 4 lockstep clients), they are admitted in the order sent: the
    # first of each wave after 2 ms, the last after 8 ms (shared, all four would wait 8 ms)
    loop = sim.Arrivals("concurrency", 4, 16, 2, concurrency=4)
    waves = sim.simulate(flat(0.0, 0.002), engine(api_request_s=0.002), loop)
    assert min(t.ttft_s for t in waves.requests) == pytest.approx(0.002 + 0.002, rel=0.02)
    assert max(t.ttft_s for t in waves.requests) == pytest.approx(0.008 + 0.002, rel=0.02)
    # the same 400 sent over about a second (Poisson, 400/s: one by one, in order), 200 us per streamed
    # token too. The CPU never idles while work waits (0.8 s of admissions + 5.12 s of tokens, whatever
    # the share); the outputs' share only decides who waits: with all of it (share 1) the admissions
    # starve and few requests run at once; sharing it, more run and each one's tokens come further apart
    arr = sim.Arrivals("poisson", 400, 16, 64, rate=400, seed=1)

    def run(share: float) -> sim.SimResult:
        eng = engine(api_request_s=0.002, api_token_s=200e-6, max_num_seqs=512, api_token_share=share)
        return sim.simulate(flat(0.0, 0.002), eng, arr)

    first, shared = run(1.0), run(0.5)
    for res in (first, shared):
        assert res.duration_s == pytest.approx(400 * 0.002 + 400 * 64 * 200e-6, rel=0.03)
    assert first.peak_running < shared.peak_running
    assert first.tpot_ms() < shared.tpot_ms()
    with pytest.raises(ValueError, match="api_token_share"):
        run(0.0)


def test_shared_admissions_split_the_cpu_among_those_waiting() -> None:
    # 1 s of CPU each: A sent at 0 has it alone for 0.5 s, then shares it with B (sent at 0.5) until it
    # has had its 1 s (at 1.5 s); B then has it alone and ends at 2.0 s (in order sent: 1.0 and 2.0)
    def run(shared: bool) -> list[float]:
        api = sim._ApiServer(1.0, 0.0, shared=shared)
        a, b = sim._Req(0, 0.0, 1, 1), sim._Req(1, 0.5, 1, 1)
        api.admit_due(0.0)
        api.enqueue(a)
        assert api.admit_due(0.5) == []
        api.enqueue(b)
        done = api.admit_due(10.0)
        assert done == [a, b] and not api.queue and api.ps_v == api.v0_sum == 0.0
        return [a.queued, b.queued]

    assert run(True) == pytest.approx([1.5, 2.0])
    assert run(False) == pytest.approx([1.0, 2.0])


def test_one_client_at_a_time_pays_its_own_admission_only() -> None:
    # a closed loop of one: nothing to share the API server with, each request's admission is its own 2 ms
    arr = sim.Arrivals("concurrency", 5, 16, 4, concurrency=1)
    res = sim.simulate(flat(0.0, 0.010), engine(api_request_s=0.002), arr)
    assert [t.ttft_s for t in res.requests] == pytest.approx([0.002 + 0.010] * 5)


def test_a_shared_frontend_cpus_work_per_request_waits_behind_the_outputs() -> None:
    """Where the API server shares its CPU with EngineCore, the latency measured outside the engine at
    one client (``request_overhead_s``) is work on that CPU (``frontend_request_s``): one client at a
    time pays it as the fixed latency it was measured as; four clients' requests wait behind each
    other's and the streams' work there. The API server's own busy share stays its own admission."""
    loop1 = sim.Arrivals("concurrency", 8, 16, 8, concurrency=1)
    loop4 = sim.Arrivals("concurrency", 32, 16, 8, concurrency=4)
    base = dict(request_overhead_s=0.005, api_request_s=0.002, api_token_s=200e-6, api_step_s=300e-6)
    delay, shared = engine(**base), engine(**base, frontend_request_s=0.005)
    one = [sim.simulate(flat(0.0, 0.002), e, loop1) for e in (delay, shared)]
    # one client: the same TTFT either way, the overhead, the prompt's step and the first token's delivery
    assert one[0].ttft_ms() == pytest.approx(one[1].ttft_ms()) == pytest.approx(5.0 + 2.0 + 0.5, rel=0.02)
    four = [sim.simulate(flat(0.0, 0.002), e, loop4) for e in (delay, shared)]
    assert four[1].ttft_ms() > four[0].ttft_ms() + 1.0
    # the API server's busy share counts its own 2 ms a request, not the shared CPU's 5 ms (and its
    # tokens' and steps' work)
    for res in four:
        own = 32 * 0.002 + 32 * 8 * 200e-6 + res.steps * 300e-6
        assert res.api_busy_s == pytest.approx(own, rel=0.02)
    # the shared CPU's busy time is its own figure: the API server's and the rest of each request's 5 ms
    assert four[0].frontend_busy_s == 0.0 and "frontend_busy_fraction" not in four[0].to_json()
    assert four[1].frontend_busy_s == pytest.approx(four[1].api_busy_s + 32 * 0.003, rel=0.02)
    assert four[1].to_json()["frontend_busy_fraction"] > four[1].to_json()["api_busy_fraction"]
    # a burst's requests, sent together, pay the API server's admission alone (as measured on the VM)
    burst = sim.Arrivals("burst", 16, 16, 8)
    assert sim.simulate(flat(0.0, 0.002), shared, burst).ttft_ms() == pytest.approx(
        sim.simulate(flat(0.0, 0.002), delay, burst).ttft_ms()
    )


def test_a_bursts_decode_tokens_ride_steps_full_of_its_prompts() -> None:
    # 256 requests of 128 in / 4 out at once, 1 ms of the API server each: they reach the engine together
    # (0.256 s), which then prefills four prompts a step (512 tokens) beside the running ones' decodes:
    # each decode token rides a full step (2 ms + 512 x 0.1 ms), not a decode-only one (2 ms), as
    # GPUStack's lab measured (Qwen3-14B on an H100: TPOT 597 ms, a full 8,192-token step)
    full = 0.002 + 512 * 1e-4
    arr = sim.Arrivals("burst", 256, 128, 4)
    res = sim.simulate(flat(1e-4, 0.002), engine(api_request_s=0.001, max_num_batched_tokens=512), arr)
    assert res.tpot_ms() == pytest.approx(full * 1e3, rel=0.05)
    assert min(t.ttft_s for t in res.requests) == pytest.approx(0.256 + full, rel=0.05)


def test_the_engine_cpu_per_sequence_adds_to_the_step_or_overlaps_it() -> None:
    arr = sim.Arrivals("burst", 8, 10, 101)
    serial = sim.simulate(flat(0.0, 0.010), engine(step_seq_s=0.002), arr)
    overlap = sim.simulate(flat(0.0, 0.010), engine(step_seq_s=0.002, async_scheduling=True), arr)
    assert serial.tpot_ms() == pytest.approx(10 + 8 * 2)  # GPU 10 ms, then 8 sequences x 2 ms of CPU
    assert overlap.tpot_ms() == pytest.approx(max(10, 8 * 2))
    one = sim.simulate(
        flat(0.0, 0.010), engine(step_seq_s=0.002, async_scheduling=True), sim.Arrivals("burst", 1, 10, 11)
    )
    assert one.tpot_ms() == pytest.approx(10)  # one sequence's CPU hides under the GPU's step


def test_server_costs_by_release_with_their_sources() -> None:
    from hwprofile.plan import servercost as sc

    assert sc.async_scheduling_default("0.11.0") is False
    assert sc.async_scheduling_default("0.32.0+cpu") is True
    assert sc.async_scheduling_default(None) is None
    old, unknown = sc.server_costs("0.11.0", "Intel Xeon"), sc.server_costs(None)
    assert old.async_scheduling is False and unknown.async_scheduling is None
    assert "fitted" in old.source and "validation_serving.yaml" in old.source and "Intel Xeon" in old.source
    assert "release unknown" in unknown.source
    eng = sim.engine_for(64, 2048, 50_000, True, old)
    assert (eng.api_request_s, eng.api_token_s, eng.step_seq_s) == (
        old.api_request_s,
        old.api_token_s,
        old.step_seq_s,
    )
    assert eng.async_scheduling is False and sim.engine_for(64, 2048, 50_000, True, None).api_token_s == 0
    # the API server shares a CPU with EngineCore only on the CPU backend with fewer CPUs left than those
    # processes (or an unknown number)
    assert not old.frontend_shared and not unknown.frontend_shared
    cpu = {f: sc.server_costs("0.32.0+cpu", cpu_backend=True, frontend=f, engines=1) for f in (None, 0, 1, 2)}
    assert [cpu[f].frontend_shared for f in (None, 0, 1, 2)] == [True, True, True, False]
    assert cpu[1].to_json()["frontend_shared"] is True and cpu[2].step_seq_s == sc.STEP_SEQ_S


def test_the_chat_renderer_sets_the_api_servers_cost_per_request() -> None:
    # vLLM's chat endpoint renders gpt-oss through Harmony (token ids from openai_harmony, no chat template
    # and no tokenizer call), every other model through its chat template and the tokenizer
    from hwprofile.model.resolve import resolve_model
    from hwprofile.plan import candidates
    from hwprofile.plan import servercost as sc

    assert sc.chat_renderer("gpt_oss") == "harmony"
    assert sc.chat_renderer("qwen3") == sc.chat_renderer(None) == "template"
    oss = candidates.model_shape(resolve_model("openai/gpt-oss-20b", "model"), 2)
    qwen = candidates.model_shape(resolve_model("Qwen/Qwen3-0.6B", "model"), 2)
    assert (oss.chat_renderer, qwen.chat_renderer) == ("harmony", "template")
    harmony = sc.server_costs("0.11.0", renderer="harmony")
    template = sc.server_costs("0.11.0", renderer="template")
    assert harmony.api_request_s < template.api_request_s
    assert "through Harmony" in harmony.source and "chat template" in template.source
    assert harmony.to_json()["renderer"] == "harmony"
    # the completions endpoint (what `hwprofile bench` sends) renders nothing: the plan's own loop is costed so
    completion = sc.server_costs("0.11.0")
    assert completion.renderer == "completion"  # the default: what `hwprofile bench` sends
    assert completion.api_request_s < template.api_request_s and "no chat template" in completion.source
    with pytest.raises(ValueError, match="completion, harmony, template"):
        sc.server_costs("0.11.0", renderer="completions")
    assert sim.Arrivals("burst", 1, 1, 1).endpoint == "completions"
    with pytest.raises(ValueError, match="completions or chat"):
        sim.Arrivals("burst", 1, 1, 1, endpoint="grpc")


def test_poisson_arrivals_are_seeded_and_queue_more_as_the_rate_rises() -> None:
    def ttft(rate: float, seed: int = 1) -> float:
        arr = sim.Arrivals("poisson", 200, 512, 64, rate=rate, seed=seed)
        return sim.simulate(flat(2e-5, 0.010), engine(max_num_seqs=16), arr).ttft_ms("mean")

    assert ttft(2.0) == ttft(2.0)
    assert ttft(2.0) < ttft(20.0)


def test_closed_loop_ttft_grows_with_concurrency_and_events_stay_bounded() -> None:
    def run(c: int) -> sim.SimResult:
        return sim.simulate(
            flat(5e-5, 0.015),
            engine(max_num_seqs=256),
            sim.Arrivals("concurrency", 4 * c, 512, 256, concurrency=c),
        )

    r16, r48 = run(16), run(48)
    assert r48.ttft_ms("mean") > r16.ttft_ms("mean") > run(1).ttft_ms("mean")
    # decode-only stretches are advanced together: far fewer events than steps
    assert r48.events < r48.steps / 5


def test_the_plan_carries_simulated_figures_with_their_sources() -> None:
    from hwprofile.plan import predict as pm

    gpu = pm.Gpu("test", 1000.0, 100.0, 24 << 30, "test row")
    shape = pm.ModelShape("m", 16 << 30, 16 << 30, 8_000_000_000, 32, 4096, 32, 128, 131072, 8)
    link = pm.Link("none", 0.0, 0.0, "one GPU")
    cand = pm.Candidate(1, 1, 1, 64, 2048, True, 50_000, link)
    cost = pm.step_cost(gpu, shape, cand)
    assert cost(0, 1, 100.0, 0.0) == pytest.approx(
        pm.step_ms(gpu, shape, 1, link, 1, 100.0)["total_ms"] / 1e3
    )
    from hwprofile.plan.candidates import simulated_figures

    figs = simulated_figures(gpu, shape, cand, pm.Workload(512, 128, 8), 8)
    assert figs is not None and figs["regime"] == "loaded"
    for name in ("ttft_ms", "tpot_ms", "output_tokens_per_s"):
        assert figs[name]["value"] > 0 and "simulated" in figs[name]["source"]
        assert figs[name]["band"] is not None or "no validation points" in figs[name]["band_unknown"]
    assert simulated_figures(gpu, shape, cand, pm.Workload(60_000, 128, 1), 1) is None  # beyond the KV cache
    assert figs["server_costs"] is None and "no CPU cost" in figs["ttft_ms"]["source"]
    # with the host: its vLLM's CPU costs (plan/servercost.py), named in every figure's source
    from hwprofile.host.snapshot import Cpu, HostSnapshot, Software

    host = HostSnapshot(cpu=Cpu(model="Test CPU"), software=Software(vllm_version="0.11.0"))
    withcpu = simulated_figures(gpu, shape, cand, pm.Workload(512, 128, 8), 8, host=host)
    assert withcpu is not None and withcpu["server_costs"]["async_scheduling"] is False
    # the plan's own loop is `hwprofile bench`'s, on the completions endpoint: no chat template to render
    assert withcpu["server_costs"]["renderer"] == "completion"
    assert "API server" in withcpu["tpot_ms"]["source"] and "Test CPU" in withcpu["tpot_ms"]["source"]
    # one client: each step adds the engine's CPU for its one sequence (0.11: no async scheduling)
    one = simulated_figures(gpu, shape, cand, pm.Workload(512, 128, 1), 1)
    one_cpu = simulated_figures(gpu, shape, cand, pm.Workload(512, 128, 1), 1, host=host)
    assert one is not None and one_cpu is not None
    assert one_cpu["tpot_ms"]["value"] == pytest.approx(
        one["tpot_ms"]["value"] + withcpu["server_costs"]["step_seq_us"] / 1e3, abs=2e-3
    )


def test_plan_explain_shows_the_simulated_figures_with_bands_or_why_not() -> None:
    from hwprofile.cli.views import _simulated_lines

    assert _simulated_lines(None) == []
    assert "not run" in _simulated_lines({"not_simulated": "2048 clients"})[0]
    fig = {"value": 1.0, "source": "simulated: x", "band": None, "band_unknown": "no validation points"}
    banded = fig | {"band": {"ratio_lo": 0.9, "ratio_hi": 1.2, "points": 5}}
    lines = _simulated_lines(
        {
            "regime": "loaded",
            "preemptions": 0,
            "peak_running": 4,
            "ttft_ms": banded,
            "tpot_ms": fig,
            "output_tokens_per_s": fig,
        }
    )
    assert "band x0.9-x1.2 of measured (5 points)" in lines[1] and "band unknown" in lines[2]
    busy = _simulated_lines(
        {
            "regime": "burst",
            "preemptions": 0,
            "peak_running": 9,
            "engine_busy_fraction": 0.2,
            "api_busy_fraction": 0.97,
            "notes": ["the API server's CPU was busy 97% of the run"],
            "ttft_ms": fig,
            "tpot_ms": fig,
            "output_tokens_per_s": fig,
        }
    )
    assert "engine busy 20%, API server busy 97%" in busy[0] and "note: the API server" in busy[1]


# -- a wave sent together (issue 38's loaded points: decode_active_tok_s) -----------------------------


def test_a_wave_s_early_requests_decode_through_the_prompts_behind_them() -> None:
    """Four prompts of one full step budget each, sent together: each request decodes one token per step
    while the prompts behind it are prefilled, so its own decode rate (tokens after the first over its
    window) is the slower the earlier it came; the last prompt's request decodes in decode steps alone.
    The sum of the four rates is far below four times the plain decode rate."""
    decode_s, per_token = 0.010, 1e-3  # a prompt step of 2048 tokens: 2.058 s
    res = sim.simulate(flat(per_token, decode_s), engine(), sim.Arrivals("burst", 4, 2048, 101))
    rates = [1 / r.tpot_s for r in res.requests]  # by rid: the order they were sent and admitted
    assert rates == sorted(rates) and rates[0] < rates[-1] / 5
    # the last two come out of the prefill together (the last prompt's tail is a few tokens): clean
    assert rates[-1] == pytest.approx(1 / decode_s, rel=0.01)
    # the first: its window holds three full prompt steps (the budget left beside its decode token goes
    # to requests 2, 3 and 4 in turn), one token each, then decode steps
    prompt_step = decode_s + per_token * 2048
    assert 1 / rates[0] == pytest.approx((3 * prompt_step + 97 * decode_s) / 100, rel=0.02)
    assert res.decode_rate_sum() == pytest.approx(sum(rates))
    assert res.decode_rate_sum() < 0.65 * 4 / decode_s
    figs = sim.figures(res, sim.Arrivals("burst", 4, 2048, 101), "test")
    assert figs["decode_rate_sum_tok_s"]["value"] == pytest.approx(res.decode_rate_sum(), rel=1e-3)
    loop = sim.Arrivals("concurrency", 8, 2048, 101, concurrency=4)
    assert "decode_rate_sum_tok_s" not in sim.figures(
        sim.simulate(flat(per_token, decode_s), engine(), loop), loop, "test"
    )


def test_the_analytic_wave_agrees_with_the_simulated_scheduler() -> None:
    """predict.wave_decode_rates (arithmetic over the prefill steps, then decode steps) against the
    simulation of the same wave with predict.step_cost: the same scheduling, the same order of rates,
    sums within 20 % (the two cost a prompt chunk's attention differently: step_ms reads the chunk's
    attended KV per prompt token, step_cost once per chunk, so the analytic prompt steps are the longer)."""
    from hwprofile.host.snapshot import Gpu
    from hwprofile.model import resolve_model
    from hwprofile.plan import candidates
    from hwprofile.plan import predict as pm

    gpu, _ = candidates.gpu_of(Gpu(0, "NVIDIA GeForce RTX 3090", memory_total_bytes=24 * 2**30))
    assert gpu is not None
    shape = candidates.model_shape(resolve_model("Qwen/Qwen3-8B", "model"), 2)
    cand = pm.Candidate(1, 1, 1, 16, 8192, True, 10**6, pm.link_of([], [], None, 1))
    for n in (2, 4, 8):
        wl = pm.Workload(8192, 128, n)
        rates = pm.wave_decode_rates(gpu, shape, cand, wl, n)
        res = sim.simulate(
            pm.step_cost(gpu, shape, cand),
            engine(max_num_batched_tokens=8192),
            sim.Arrivals("burst", n, 8192, 128),
        )
        simulated = [1 / r.tpot_s for r in res.requests]
        assert len(rates) == n and rates == sorted(rates), rates
        assert sum(rates) == pytest.approx(sum(simulated), rel=0.20), (n, rates, simulated)
        # more requests in the wave: more prompt steps in the early ones' windows, never a larger sum
        # than n clean decoders
        clean = 1e3 / pm.step_ms(gpu, shape, 1, cand.link, n, 8192 + 64)["total_ms"]
        assert sum(rates) < n * clean
    # the analytic prediction carries the wave as a term
    p = pm.predict(gpu, shape, cand, pm.Workload(8192, 128, 4), None)
    wave = next(t for t in p.terms if t["term"].startswith("wave:"))
    assert wave["tok_s"] == pytest.approx(
        sum(pm.wave_decode_rates(gpu, shape, cand, pm.Workload(8192, 128, 4), 4)), rel=1e-3
    )
    single = pm.predict(gpu, shape, cand, pm.Workload(8192, 128, 1), None)
    assert not any(t["term"].startswith("wave:") for t in single.terms)


def test_sharegpt_lengths_spread_about_the_means_within_the_samplers_filter() -> None:
    arr = sim.Arrivals("burst", 1000, 217, 202, lengths="sharegpt")
    lengths = sim.request_lengths(arr)
    ins, outs = [i for i, _ in lengths], [o for _, o in lengths]
    assert sum(ins) / 1000 == pytest.approx(217, abs=0.5) and sum(outs) / 1000 == pytest.approx(202, abs=0.5)
    assert min(ins) >= 4 and min(outs) >= 4 and max(ins) <= 1024
    assert max(i + o for i, o in lengths) <= 2048
    # long-tailed: most requests shorter than the mean, as an exponential's median is ln 2 of its mean
    assert sorted(ins)[500] < 0.8 * 217 and sorted(outs)[500] < 0.8 * 202
    assert lengths == sim.request_lengths(arr)  # deterministic: the same lengths on every run
    assert sim.request_lengths(sim.Arrivals("burst", 3, 217, 202)) == [(217, 202)] * 3
    with pytest.raises(ValueError, match="lengths"):
        sim.Arrivals("burst", 3, 217, 202, lengths="zipf")


def test_sharegpt_means_the_filter_cannot_give_are_refused_and_long_ones_reached() -> None:
    """Means near the filter's bounds are still reached (the rescale goes on until they are); means it
    cannot give (a mean prompt over its 1,024 cap, below its 4-token floor) are refused, saying why."""
    lengths = sim.request_lengths(sim.Arrivals("burst", 1000, 800, 300, lengths="sharegpt"))
    assert sum(i for i, _ in lengths) / 1000 == pytest.approx(800, abs=0.5)
    assert sum(o for _, o in lengths) / 1000 == pytest.approx(300, abs=0.5)
    for i, o in ((1500, 100), (2, 2)):
        with pytest.raises(ValueError, match=r"ShareGPT's filter .* use lengths fixed"):
            sim.request_lengths(sim.Arrivals("burst", 100, i, o, lengths="sharegpt"))


def test_spread_lengths_end_a_closed_loop_out_of_step() -> None:
    """Fixed lengths keep a closed loop's clients in lockstep (each wave's prompts share one step); spread
    lengths end them apart, so each prompt is prefilled beside the others' decodes."""
    cost = flat(1e-4)
    fixed = sim.simulate(cost, engine(), sim.Arrivals("concurrency", 40, 200, 50, concurrency=4))
    spread = sim.simulate(
        cost, engine(), sim.Arrivals("concurrency", 40, 200, 50, concurrency=4, lengths="sharegpt")
    )
    assert spread.requests[-1].rid == 39 and len(spread.requests) == 40
    assert spread.ttft_ms("mean") < fixed.ttft_ms("mean")


def test_a_closed_loop_in_waves_says_so_with_its_ttft_spread() -> None:
    """Eight clients of one length whose prompts take two steps of the budget: each wave's later prompts
    wait for the earlier ones' prefill, and the figures say why their TTFT is above a lone prompt's.
    Spread lengths, more clients than sequences (queueing by design) or a KV cache that holds two
    requests (queueing for blocks) carry no such note."""
    cost, arr = flat(1e-4), sim.Arrivals("concurrency", 32, 512, 50, concurrency=8)
    waves = sim.simulate(cost, engine(), arr)
    (note,) = [n for n in waves.notes if "waves" in n]
    shortest = min(t.ttft_s for t in waves.requests)
    assert shortest == pytest.approx(0.010 + 0.0512)  # one step: its own prompt and others' decodes
    assert waves.ttft_ms() >= 2 * shortest * 1e3 and waves.peak_running == 8
    assert (
        f"TTFT {shortest * 1e3:.0f} ms the shortest" in note
        and f"{waves.ttft_ms():.0f} ms the median" in note
    )
    for quiet in (
        sim.simulate(
            cost, engine(), sim.Arrivals("concurrency", 32, 512, 50, concurrency=8, lengths="sharegpt")
        ),
        sim.simulate(cost, engine(max_num_seqs=4), arr),
        sim.simulate(cost, engine(kv_tokens=1200), arr),
    ):
        assert not [n for n in quiet.notes if "waves" in n], quiet.notes


def test_the_plans_simulation_sends_what_hwprofile_bench_sends(host_of, empty_root) -> None:
    """The simulated figures are those `hwprofile bench` would measure at the workload: the closed loop
    sends bench.num_prompts (at least the concurrency) to the layout, each instance its share."""
    from hwprofile.pipeline import make_plan

    def sent(sets: list[str]) -> list[str]:
        plan = make_plan(host_of("a800-pcie-4x-2numa"), empty_root, environ={}, sets=sets).to_json()
        return [i["prediction"]["simulated"]["ttft_ms"]["source"] for i in plan["instances"]]

    # two instances, 16 clients: 8 each; 40 prompts: 20 each; 4 prompts: at least the clients, 8 each
    assert all(
        "over 20 requests" in s and "closed loop of 8 clients" in s for s in sent(["bench.num_prompts=40"])
    )
    assert all("over 8 requests" in s for s in sent(["bench.num_prompts=4"]))
