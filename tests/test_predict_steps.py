"""One engine step of the performance model (hwprofile/plan/predict.py ``step_ms``), issue 32's known
errors: a prompt chunk's KV read once per chunk (not once per prompt token), the LM head on the sampled
rows only, the untied input embedding not read whole; the simulation's step the analytic one."""

from __future__ import annotations

import pytest

from hwprofile.host.snapshot import Gpu
from hwprofile.model import resolve_model
from hwprofile.plan import candidates
from hwprofile.plan import predict as pm


def _h100() -> pm.Gpu:
    gpu, _ = candidates.gpu_of(Gpu(0, "NVIDIA H100 80GB HBM3", memory_total_bytes=80 * 2**30))
    assert gpu is not None
    return gpu


def _qwen8b() -> pm.ModelShape:
    return candidates.model_shape(resolve_model("Qwen/Qwen3-8B", "model"), 2)


NONE = pm.Link("none", 0.0, 0.0, "one GPU")


def test_a_prompt_chunk_reads_its_attended_kv_once_not_once_per_token() -> None:
    gpu, m = _h100(), _qwen8b()
    bw = gpu.bandwidth_gbs * 1e9 * pm.MEM_EFFICIENCY
    chunk, ctx = 2048, 3072.0  # the chunk's tokens attend 3072 on average: 2048 cached + 1024 of its own
    without = pm.step_ms(gpu, m, 1, NONE, 0, 0.0, chunk, 0.0)
    with_ctx = pm.step_ms(gpu, m, 1, NONE, 0, 0.0, chunk, ctx)
    read = (with_ctx["memory_ms"] - without["memory_ms"]) / 1e3 * bw / m.kv_bytes_per_token
    assert read == pytest.approx(ctx + chunk / 2)  # the 4096 distinct tokens, not 2048 x 3072
    # its FLOPs still grow with tokens x context
    assert with_ctx["compute_ms"] > without["compute_ms"]
    # decodes read their own KV, once per sequence
    d = pm.step_ms(gpu, m, 1, NONE, 8, 1000.0)["memory_ms"] - pm.step_ms(gpu, m, 1, NONE, 8, 0.0)["memory_ms"]
    assert d / 1e3 * bw / m.kv_bytes_per_token == pytest.approx(8 * 1000)


def test_the_simulations_step_is_the_analytic_step() -> None:
    gpu, m = _h100(), _qwen8b()
    cand = pm.Candidate(1, 1, 1, 256, 8192, True, 10**6, NONE)
    cost = pm.step_cost(gpu, m, cand)
    for pre, dec, dctx, pctx in ((0, 16, 900.0, 0.0), (512, 0, 0.0, 256.0), (1500, 30, 2000.0, 1800.0)):
        assert cost(pre, dec, dctx, pctx) * 1e3 == pytest.approx(
            pm.step_ms(gpu, m, 1, NONE, dec, dctx, pre, pctx)["total_ms"]
        )


def test_the_lm_head_runs_on_sampled_rows_only() -> None:
    gpu, m = _h100(), _qwen8b()
    facts = resolve_model("Qwen/Qwen3-8B", "model")
    assert m.lm_head_params == facts.vocab_size * facts.hidden_size
    assert m.embedding_params == (0 if facts.tie_word_embeddings else m.lm_head_params)
    peak = gpu.tflops * 1e12 * gpu.compute_efficiency  # the share gpu_efficiency.yaml gives Hopper
    # one more prompt token costs the body's FLOPs, not the LM head's
    a = pm.step_ms(gpu, m, 1, NONE, 0, 0.0, 4096, 0.0)["compute_ms"]
    b = pm.step_ms(gpu, m, 1, NONE, 0, 0.0, 8192, 0.0)["compute_ms"]
    per_token = (b - a) / 1e3 * peak / 4096
    assert per_token == pytest.approx(2 * (m.active_params - m.lm_head_params - m.embedding_params))
    # one more decoding sequence samples: the LM head too
    a = pm.step_ms(gpu, m, 1, NONE, 100, 0.0)["compute_ms"]
    b = pm.step_ms(gpu, m, 1, NONE, 200, 0.0)["compute_ms"]
    assert (b - a) / 1e3 * peak / 100 == pytest.approx(2 * (m.active_params - m.embedding_params))
    # the untied input embedding is not read by a decode step
    untied = pm.step_ms(gpu, m, 1, NONE, 1, 0.0)["memory_ms"]
    plain = pm.step_ms(gpu, pm.ModelShape(**{**m.__dict__, "embedding_params": 0}), 1, NONE, 1, 0.0)[
        "memory_ms"
    ]
    assert (plain - untied) / 1e3 * gpu.bandwidth_gbs * 1e9 * pm.MEM_EFFICIENCY == pytest.approx(
        2 * m.embedding_params
    )


# -- collectives by link type (plan/interconnect.py COLLECTIVES) -------------------------------------


def _links(tp: int) -> dict[str, pm.Link]:
    pcie = [(4, 16)] * tp
    return {
        "nvlink": pm.link_of([("NV18", True)], pcie, 900, tp),
        "pcie_p2p": pm.link_of([("PIX", True)], pcie, None, tp),
        "pcie_host": pm.link_of([("PHB", False)], pcie, None, tp),
        "sys": pm.link_of([("SYS", False)], pcie, None, tp),
        "network": pm.network_link(200, tp, "test: a 200 Gb/s NIC"),
    }


@pytest.mark.parametrize("tp", [2, 4, 8])
def test_an_all_reduce_costs_latency_plus_bytes_by_link_type_within_its_band(tp: int) -> None:
    links = _links(tp)
    small, large = 16 * 1024, 4 << 20
    for name, link in links.items():
        assert link.kind == name and link.basis == "datasheet"
        for nbytes in (small, large):
            lo, hi = pm.allreduce_band_ms(link, tp, nbytes)
            assert 0 < lo <= pm.allreduce_ms(link, tp, nbytes) <= hi, name
    # small messages: latency-bound, NVLink's one-kernel all-reduce first, the network last
    at = {k: pm.allreduce_ms(v, tp, small) for k, v in links.items()}
    assert at["nvlink"] < at["pcie_p2p"] <= at["pcie_host"] < at["sys"]
    # the network's latency stays above a host-staged pair's; from 4 GPUs the ring's steps through host
    # memory (interconnect.HOST_STEP_US, each a flag polled across PCIe) and the CPU's shared throughput
    # (interconnect.host_share) put a cross-socket group behind a 200 Gb/s NIC even at 16 KB
    assert (at["sys"] < at["network"]) == (tp <= 2)
    # large ones: bandwidth-bound, NVLink first, through the host and across the sockets slower than P2P
    at = {k: pm.allreduce_ms(v, tp, large) for k, v in links.items()}
    assert at["nvlink"] < at["pcie_p2p"] < at["pcie_host"] < at["sys"]
    # the source names the implementation and where its figures come from
    assert "vLLM custom all-reduce" in links["nvlink"].source and "AIConfigurator" in links["nvlink"].source
    assert ("custom all-reduce (2 GPUs)" in links["pcie_p2p"].source) == (tp == 2)


@pytest.mark.parametrize("tp", [2, 4, 8])
def test_a_ring_through_host_memory_waits_on_each_of_its_steps(tp: int) -> None:
    """Issue 38's 4x RTX 3090 (no P2P): a small all-reduce through host memory pays a PCIe round trip
    on each of the ring's 2 (n - 1) steps, so four GPUs wait about three times what two do beyond the
    P2P ring's latency; P2P, NVLink and the network pay no such step."""
    from hwprofile.plan.interconnect import COLLECTIVES, HOST_STEP_US, collective_key

    links = _links(tp)
    host, p2p = COLLECTIVES["pcie_host"], COLLECTIVES[collective_key("pcie_p2p", tp, True)]
    assert host.step_us == HOST_STEP_US > 0 and COLLECTIVES["sys_host"].step_us == HOST_STEP_US
    assert all(
        COLLECTIVES[k].step_us == 0 for k in ("nvlink", "pcie_p2p", "pcie_p2p_custom", "sys", "network")
    )
    ring = host.latency_us + host.per_gpu_us * tp
    assert links["pcie_host"].latency_us == pytest.approx(ring + HOST_STEP_US * 2 * (tp - 1))
    assert links["pcie_p2p"].latency_us == pytest.approx(p2p.latency_us + p2p.per_gpu_us * tp)
    assert "polled across PCIe" in links["pcie_host"].source
    assert "polled across PCIe" not in links["pcie_p2p"].source
    lo, _ = pm.allreduce_band_ms(links["pcie_host"], tp, 16 * 1024)
    assert lo * 1e3 >= host.latency_lo_us + host.per_gpu_us * tp + HOST_STEP_US * 2 * (tp - 1)


def test_the_tp_decode_prediction_carries_the_all_reduce_band() -> None:
    gpu = _h100()
    m = candidates.model_shape(resolve_model("Qwen/Qwen3-32B", "model"), 2)
    for link in _links(4).values():
        cand = pm.Candidate(4, 1, 1, 256, 8192, True, 10**7, link)
        p = pm.predict(gpu, m, cand, pm.Workload(512, 256, 64), None)
        term = next(t for t in p.terms if t["term"] == "decode step: 2 all-reduces per layer")
        lo, hi = term["band_ms"]
        assert term["basis"] == "datasheet" and lo <= term["ms"] <= hi and lo < hi
    one = pm.predict(
        gpu,
        m,
        pm.Candidate(1, 1, 1, 256, 8192, True, 10**7, pm.link_of([], [], None, 1)),
        pm.Workload(512, 256, 64),
        None,
    )
    term = next(t for t in one.terms if t["term"] == "decode step: 2 all-reduces per layer")
    assert term["ms"] == 0 and term["band_ms"] == [0, 0]


def test_a_measured_check_gives_the_link_its_latency_and_bandwidth() -> None:
    from hwprofile.plan.interconnect import Report, Run, SizeResult, decide, measured_link

    sheet = pm.link_of([("PXB", True)], [(4, 16), (4, 16)], None, 2)
    sizes = (SizeResult(32768, True, 30e-6, 1.0), SizeResult(1 << 26, True, 0.01, 12.0))
    report = Report("f", "nccl", (Run((0, 1), True, "ok", "", sizes),))
    got = measured_link(sheet, decide(report, (0, 1)), report)
    assert got.basis == "measured" and got.gbs == 12.0
    assert got.latency_us == pytest.approx(30 - 32768 / 12.0 / 1e3)  # the small one less its bytes
    assert "latency of the 32 KiB one" in got.source
    lo, hi = pm.allreduce_band_ms(got, 2, 1 << 20)
    assert lo <= pm.allreduce_ms(got, 2, 1 << 20) <= hi
    # without the report: the bandwidth alone
    assert measured_link(sheet, decide(report, (0, 1))).latency_us == sheet.latency_us


# -- the share of the datasheet per architecture (hwprofile/data/gpu_efficiency.yaml) ----------------


def test_each_architecture_has_its_share_with_its_source_and_an_unapplied_fit_is_skipped(monkeypatch) -> None:
    from hwprofile.plan import gpufacts

    shipped = gpufacts.efficiency_table()
    for fam, row in shipped["architectures"].items():  # every fit names its points and its residual band
        assert (
            row["points"] and row["residuals"]["lo"] <= row["residuals"]["median"] <= row["residuals"]["hi"]
        ), fam
        assert row["applied"] or row["why_not_applied"], fam
    doc = {
        "default": {"memory": 0.8, "compute": 0.6, "basis": "fitted", "source": "default"},
        "architectures": {
            "Ampere": {"memory": 0.7, "compute": 0.4, "basis": "fitted", "source": "the family's fit"},
            "Ampere (GA102)": {"memory": 0.9, "compute": 0.5, "basis": "fitted", "source": "the chip's fit"},
            "Hopper": {"memory": 0.9, "compute": 0.2, "basis": "fitted", "source": "x", "applied": False},
        },
    }
    monkeypatch.setattr(gpufacts, "efficiency_table", lambda: doc)
    assert gpufacts.efficiency("Ampere (GA100)")["key"] == "Ampere"  # the family
    assert gpufacts.efficiency("Ampere (GA102)")["compute"] == 0.5  # the chip first
    assert gpufacts.efficiency("Hopper (GH100)")["key"] == "default"  # not applied
    a100, _ = candidates.gpu_of(Gpu(0, "NVIDIA A100-SXM4-80GB", memory_total_bytes=80 * 2**30))
    assert a100 is not None and (a100.mem_efficiency, a100.compute_efficiency) == (0.7, 0.4)
    m = _qwen8b()
    p = pm.predict(
        a100, m, pm.Candidate(1, 1, 1, 256, 8192, True, 10**6, NONE), pm.Workload(512, 128, 8), None
    )
    mem = next(t for t in p.terms if t["term"].startswith("decode step: weights"))
    assert "x 70%" in mem["source"] and "the family's fit" in mem["source"] and mem["basis"] == "fitted"
    # the step reads at 70 % of the datasheet
    ms = pm.step_ms(a100, m, 1, NONE, 1, 0.0)["memory_ms"]
    assert ms == pytest.approx(
        max(0, m.weights_bytes - 2 * m.embedding_params) / (a100.bandwidth_gbs * 1e9 * 0.7) * 1e3
    )


def test_a_host_staged_all_reduce_shares_the_cpu_among_the_group() -> None:
    """Without P2P the bytes go through host memory: two GPUs reach the link's two-copy share, n GPUs
    share the CPU's throughput (2 / n of it), with a band down to (2 / n)^3 (memory interleaved across
    CPU dies) and up to the two-GPU share; P2P and NVLink groups are not affected."""
    from hwprofile.plan.interconnect import COLLECTIVES, host_share

    big = 80 << 20  # a prefill chunk's all-reduce: 8192 tokens x 5120 x 2 B
    per_byte = {}
    for tp in (2, 4, 8):
        link = pm.link_of([("PHB", False)], [(4, 16)] * tp, None, tp)
        per_byte[tp] = pm.allreduce_ms(link, tp, big) / (2 * (tp - 1) / tp)
        lo, hi = pm.allreduce_band_ms(link, tp, big)
        assert lo <= pm.allreduce_ms(link, tp, big) <= hi
        if tp > 2:
            assert "through host memory" in link.source and "nccl#1639" in link.source
            # the slow end of the band: the cubed share, the fast end: the two-GPU one
            assert hi / lo == pytest.approx((tp / 2) ** 3 * 0.5 / 0.25, rel=0.05)
    assert per_byte[4] == pytest.approx(2 * per_byte[2], rel=0.02)
    assert per_byte[8] == pytest.approx(4 * per_byte[2], rel=0.02)
    for key in ("nvlink", "pcie_p2p", "pcie_p2p_custom", "network", "sys"):
        assert host_share(COLLECTIVES[key], 8) == (1.0, 1.0, 1.0)
    assert host_share(COLLECTIVES["pcie_host"], 2) == (1.0, 1.0, 1.0)
    p2p = pm.link_of([("PHB", True)], [(4, 16)] * 4, None, 4)
    assert "through host memory" not in p2p.source


def test_hoppers_share_is_its_measured_kernels_times_amperes_served_ratio() -> None:
    """The Hopper row is not fitted to the H100 points: its compute share is Hopper's measured GEMM share
    (AIConfigurator's tables, benchmarks/aic_gemm_share.py) times what a served step reaches of the kernels
    on the family it is transferred from; refitting that family without re-deriving Hopper fails here."""
    from hwprofile.plan import gpufacts

    rows = gpufacts.efficiency_table()["architectures"]
    hop = rows["Hopper"]
    src = hop["transferred_from"]
    assert rows[src["family"]]["applied"] and hop["applied"]
    ratio = rows[src["family"]]["compute"] / src["kernel_share"]
    assert 0 < ratio < 1  # a served step reaches less than its GEMMs alone
    assert hop["compute"] == pytest.approx(hop["kernel_share"] * ratio, abs=0.006)
    h100 = _h100()
    assert (
        h100.compute_efficiency == hop["compute"] and "not fitted to any H100 point" in h100.efficiency_source
    )


@pytest.mark.parametrize(
    ("name", "kernel"),
    [
        ("openai/gpt-oss-20b", "mxfp4"),
        ("Qwen/Qwen3-30B-A3B", "bfloat16"),
        ("mistralai/Mixtral-8x7B-Instruct-v0.1", "bfloat16"),
    ],
)
def test_routed_experts_run_at_their_kernels_share_of_the_dense_one(name: str, kernel: str) -> None:
    """A mixture of experts' routed-expert FLOPs are costed at gpu_efficiency.yaml's moe_kernels ratio of
    the architecture's dense share (AIConfigurator's measured fused-MoE tables); the rest at the dense share.
    An architecture without a measured MoE table (Ampere) runs them at the dense share, and says so."""
    facts = resolve_model(name, "model")
    m = candidates.model_shape(facts, 2)
    assert m.moe_kernel == kernel
    # the routed experts: top-k of every MoE layer's experts, the difference between all and active params
    per_expert = (facts.params - facts.active_params) // (facts.num_experts - facts.experts_per_token)
    assert m.expert_active_params == per_expert * facts.experts_per_token
    assert 0 < m.expert_active_params < m.active_params
    gpu = _h100()
    ratio = gpu.moe_ratio(kernel)
    assert 0.3 < ratio < 1.0 and "AIConfigurator" in gpu.moe_source
    peak = gpu.tflops * 1e12 * gpu.compute_efficiency
    a = pm.step_ms(gpu, m, 1, NONE, 0, 0.0, 4096, 0.0)["compute_ms"]
    b = pm.step_ms(gpu, m, 1, NONE, 0, 0.0, 8192, 0.0)["compute_ms"]
    dense = m.active_params - m.lm_head_params - m.embedding_params - m.expert_active_params
    assert (b - a) / 1e3 * peak / 4096 == pytest.approx(2 * dense + 2 * m.expert_active_params / ratio)
    # the simulation's step is the same step, experts included
    cost = pm.step_cost(gpu, m, pm.Candidate(1, 1, 1, 256, 8192, True, 10**6, NONE))
    assert cost(4096, 0, 0.0, 0.0) * 1e3 == pytest.approx(
        pm.step_ms(gpu, m, 1, NONE, 0, 0.0, 4096, 0.0)["total_ms"]
    )
    # the prediction's FLOPs term says which rate the experts ran at, and where it comes from
    pred = pm.predict(
        gpu, m, pm.Candidate(1, 1, 1, 256, 8192, True, 10**6, NONE), pm.Workload(2000, 100, 8), None
    )
    flops_term = next(t for t in pred.terms if t["term"] == "decode step: FLOPs over peak")
    assert "routed experts" in flops_term["source"] and f"x{ratio:g}" in flops_term["source"]
    assert "moe_kernels Hopper" in flops_term["source"]
    # without the ratio (a dense-share GPU) the same step is faster by exactly the experts' extra time
    flat = pm.Gpu(**{**gpu.__dict__, "moe_ratios": ()})
    assert flat.moe_ratio(kernel) == 1.0
    c = pm.step_ms(flat, m, 1, NONE, 0, 0.0, 8192, 0.0)["compute_ms"]
    d = pm.step_ms(flat, m, 1, NONE, 0, 0.0, 4096, 0.0)["compute_ms"]
    assert (b - a) - (c - d) == pytest.approx(
        2 * m.expert_active_params * (1 / ratio - 1) * 4096 / peak * 1e3
    )
    # Ampere: the A100's bf16 fused-MoE table is measured; gpt-oss's MXFP4 experts run Marlin below SM90,
    # the L40S's measured Marlin share transferred (and said); a format without a row stays dense-share
    a100, _ = candidates.gpu_of(Gpu(0, "NVIDIA A100-SXM4-80GB", memory_total_bytes=80 * 2**30))
    l40s, _ = candidates.gpu_of(Gpu(0, "NVIDIA L40S", memory_total_bytes=48 * 2**30))
    assert a100 is not None and l40s is not None and a100.moe_ratio("") == 1.0
    assert a100.moe_ratio("mxfp4") == l40s.moe_ratio("mxfp4") < 1.0 and "transferred" in a100.moe_source
    assert a100.moe_ratio("bfloat16") < 0.5
    # an architecture without any measured MoE table runs its experts at the dense share, and says so
    t4, _ = candidates.gpu_of(Gpu(0, "Tesla T4", memory_total_bytes=16 * 2**30))
    assert t4 is not None and t4.moe_ratios == () and t4.moe_ratio(kernel) == 1.0
    assert "no measured MoE kernel table" in t4.moe_source


def test_a_dense_model_has_no_routed_experts() -> None:
    m = _qwen8b()
    assert m.expert_active_params == 0 and m.moe_kernel == ""


def test_a_group_under_several_host_bridges_of_an_epyc_is_at_the_slow_end() -> None:
    """Four GPUs through host memory, each under its own PCIe host bridge (NODE) of a CPU whose memory
    interleaves across its dies (AMD EPYC at NPS1): (2/n)^3 of the two-GPU share, banded up to 2/n; under
    one host bridge (PHB), or on a CPU not matched, 2/n as before; P2P is untouched."""
    c = next(c for c in pm_collectives().values() if c.host_staged)
    assert pm_share(c, 4, True) == (0.125, 0.125, 0.5)
    assert pm_share(c, 4, False) == (0.5, 0.125, 1.0) and pm_share(c, 2, True) == (1.0, 1.0, 1.0)
    pcie = [(4, 16)] * 4
    node = pm.link_of([("NODE", False)] * 6, pcie, None, 4, True)
    phb = pm.link_of([("PHB", False)] * 6, pcie, None, 4, True)
    intel = pm.link_of([("NODE", False)] * 6, pcie, None, 4, False)
    p2p = pm.link_of([("NODE", True)] * 6, pcie, None, 4, True)
    assert node.gbs == pytest.approx(phb.gbs / 4) and intel.gbs == pytest.approx(phb.gbs)
    assert "different PCIe host bridges (NODE)" in node.source and "host bridges" not in phb.source
    assert p2p.kind == "pcie_p2p" and "host memory" not in p2p.source
    from hwprofile.plan.interconnect import memory_across_dies

    for cpu in ("AMD EPYC 7642 48-Core Processor", "AMD Ryzen Threadripper PRO 5995WX 64-Cores"):
        assert memory_across_dies(cpu), cpu
    for cpu in ("Intel(R) Xeon(R) Gold 6338 CPU @ 2.00GHz", "AMD Ryzen 9 7950X 16-Core Processor", None):
        assert not memory_across_dies(cpu), cpu


def pm_collectives():  # type: ignore[no-untyped-def]
    from hwprofile.plan.interconnect import COLLECTIVES

    return COLLECTIVES


def pm_share(c, n, across):  # type: ignore[no-untyped-def]
    from hwprofile.plan.interconnect import host_share

    return tuple(round(x, 6) for x in host_share(c, n, across))


def test_a_prompt_leaves_room_for_the_other_requests_decodes_only() -> None:
    """vLLM's budget: a prompt step holds the other running requests' decodes, not its own (it decodes
    nothing yet): an 8,192-token prompt alone at a budget of 8,192 is one step; beside 3 decoding
    requests, two."""
    gpu, m = _h100(), _qwen8b()
    cand = pm.Candidate(1, 1, 1, 256, 8192, True, 10**6, NONE)
    alone = pm.predict(gpu, m, cand, pm.Workload(8192, 64, 1), None)
    busy = pm.predict(gpu, m, cand, pm.Workload(8192, 64, 4), None)
    term = {
        p: next(t["term"] for t in x.terms if t["term"].startswith("prefill:"))
        for p, x in (("a", alone), ("b", busy))
    }
    assert term["a"] == "prefill: 1 chunk(s) of 8192 tokens" and term["b"].startswith("prefill: 2 chunk(s)")


def test_the_simulation_prices_a_speculating_decode_as_the_analytic_figure_does() -> None:
    """With speculation, the simulation's decode step costs the speculative step per token (verify and
    draft over the expected tokens at that batch), the analytic TPOT's own term; a prompt step keeps its
    prompt's cost beside it."""
    gpu, m = _h100(), _qwen8b()
    cand = pm.Candidate(1, 1, 1, 256, 8192, True, 10**6, NONE)
    spec = pm.Speculation("ngram", (), 3, 0.7, None, "test")
    plain, drafted = pm.step_cost(gpu, m, cand), pm.step_cost(gpu, m, cand, spec)
    for b in (1, 8):
        step = pm.step_ms(gpu, m, 1, NONE, b, 1000.0)["total_ms"]
        per_token = pm._speculated(gpu, m, cand, spec, b, 1000.0, step, None)
        assert drafted(0, b, 1000.0, 0.0) == pytest.approx(per_token / 1e3) and per_token < step
        assert plain(0, b, 1000.0, 0.0) == pytest.approx(step / 1e3)
        prompt = plain(2048, b, 1000.0, 512.0) - plain(0, b, 1000.0, 0.0)
        assert drafted(2048, b, 1000.0, 512.0) - drafted(0, b, 1000.0, 0.0) == pytest.approx(prompt)
    assert drafted(512, 0, 0.0, 256.0) == plain(512, 0, 0.0, 256.0)  # no decode: nothing speculated
    p = pm.predict(gpu, m, cand, pm.Workload(1000, 200, 1), spec)
    assert p.tpot_ms == pytest.approx(drafted(0, 1, 1100.0, 0.0) * 1e3, rel=1e-6)


def test_the_logits_gather_grows_with_the_sampled_rows_over_the_tp_link() -> None:
    """The vocabulary-parallel LM head's logits are all-gathered per sampled row: nothing at TP1, half
    an all-reduce of rows x vocab x 2 bytes at TP > 1, growing with the decoding batch."""
    gpu, m = _h100(), _qwen8b()
    vocab = m.lm_head_params // m.hidden
    assert vocab > 100_000
    one = pm.step_ms(gpu, m, 1, NONE, 8, 1000.0)
    assert one["gather_ms"] == 0.0
    host = pm.link_of([("PHB", False)] * 6, [(4, 16)] * 4, None, 4)
    for b in (1, 16):
        got = pm.step_ms(gpu, m, 4, host, b, 1000.0)["gather_ms"]
        assert got == pytest.approx(pm.allreduce_ms(host, 4, b * vocab * pm.ACT_BYTES) / 2)
    assert (
        pm.step_ms(gpu, m, 4, host, 16, 1000.0)["gather_ms"]
        > 4 * pm.step_ms(gpu, m, 4, host, 1, 1000.0)["gather_ms"]
    )
    cand = pm.Candidate(4, 1, 1, 256, 8192, True, 10**6, host)
    terms = [t["term"] for t in pm.predict(gpu, m, cand, pm.Workload(1000, 100, 8), None).terms]
    assert "decode step: the logits of 8 sequence(s) gathered from the TP ranks" in terms
    solo = pm.Candidate(1, 1, 1, 256, 8192, True, 10**6, NONE)
    assert not any(
        "gathered" in t["term"] for t in pm.predict(gpu, m, solo, pm.Workload(1000, 100, 8), None).terms
    )


def test_sliding_window_layers_read_their_window_and_each_kind_splits_over_its_own_heads() -> None:
    """gpt-oss-20b: 12 of its 24 layers attend a 128-token window. A decode step at 32K reads the full
    layers' KV over the whole context and the sliding layers' over their window (FlashAttention and
    vLLM's Triton kernel skip the tiles outside it); a prompt chunk's window layers read the window
    and the chunk. A kind with more KV heads (MiMo-V2's sliding layers: 8 against 4) splits over
    more ranks."""
    gpu = _h100()
    facts = resolve_model("openai/gpt-oss-20b", "model")
    m = candidates.model_shape(facts, 2)
    bw = gpu.bandwidth_gbs * 1e9 * pm.MEM_EFFICIENCY
    kinds = {w: (n, b, h) for n, b, h, w, _ in m.kv_kinds}
    assert set(kinds) == {0, 128} and kinds[0][0] == kinds[128][0] == 12
    per_layer = kinds[0][1] // 12
    ctx = 32_000.0
    d = pm.step_ms(gpu, m, 1, NONE, 1, ctx)["memory_ms"] - pm.step_ms(gpu, m, 1, NONE, 1, 0.0)["memory_ms"]
    assert d / 1e3 * bw == pytest.approx(12 * per_layer * (ctx + 128))
    chunk = 2048
    p = pm.step_ms(gpu, m, 1, NONE, 0, 0.0, chunk, ctx)["memory_ms"]
    p0 = pm.step_ms(gpu, m, 1, NONE, 0, 0.0, chunk, 0.0)["memory_ms"]
    assert (p - p0) / 1e3 * bw == pytest.approx(12 * per_layer * (ctx + chunk / 2 + 128 + chunk))
    # a kind of 8 KV heads and one of 4 at TP 8: one head per rank each (vLLM replicates the 4)
    mixed = pm.ModelShape(
        **{**m.__dict__, "kv_kinds": ((8, 8 * 2560, 4, 0, 192), (40, 40 * 5120, 8, 128, 192))}
    )
    d8 = (
        pm.step_ms(gpu, mixed, 8, NONE, 1, ctx)["memory_ms"]
        - pm.step_ms(gpu, mixed, 8, NONE, 1, 0.0)["memory_ms"]
    )
    assert d8 / 1e3 * bw == pytest.approx(8 * 2560 / 4 * ctx + 40 * 5120 / 8 * 128)


def test_mxfp4_tile_padding_is_read_with_the_experts_it_pads() -> None:
    """vLLM's MXFP4 MoE kernels pad each rank's expert shapes to their tile (Marlin on the A100: 128 x 256);
    a decode step reads the padded rows of the experts its tokens touch, and the batch-1 ceiling too.
    Where the tile divides the shapes (gpt-oss on Hopper at TP 1: 2,880 = 45 x 64) nothing is added."""
    from hwprofile.plan import loaded
    from hwprofile.plan.estimate import estimate
    from hwprofile.plan.memory import active_weights_bytes, expert_padding
    from hwprofile.plan.reasons import Reasons

    base = resolve_model("openai/gpt-oss-20b", "model")
    ampere = loaded.expert_tile(base, "8.0", Reasons({}), "0.32.0")
    hopper = loaded.expert_tile(base, "9.0", Reasons({}), "0.32.0")
    pad = expert_padding(ampere, 1)
    assert pad > 0 and expert_padding(hopper, 1) == 0
    # Marlin's tile on sm80: 2,880 x 2,880 experts become 2,944 x 3,072 (+9.0 %)
    assert pad / ampere.mxfp4_expert_bytes == pytest.approx(2944 * 3072 / 2880**2 - 1, rel=1e-6)
    a, h = candidates.model_shape(ampere, 2), candidates.model_shape(hopper, 2)
    assert dict(a.expert_padding)[1] == pad and 1 not in dict(h.expert_padding)
    gpu = _h100()
    for tokens in (1, 16):
        touched = 1 - (1 - base.experts_per_token / base.num_experts) ** tokens
        grew = (
            pm.step_ms(gpu, a, 1, NONE, tokens, 0.0)["memory_ms"]
            - pm.step_ms(gpu, h, 1, NONE, tokens, 0.0)["memory_ms"]
        )
        assert grew == pytest.approx(pad * touched / (gpu.bandwidth_gbs * 1e9 * gpu.mem_efficiency) * 1e3)
    from hwprofile.config.settings import Settings

    a100 = Gpu(0, "NVIDIA A100-SXM4-80GB", memory_total_bytes=80 * 2**30)
    est = estimate(a100, ampere, None, 1, None, Settings())
    share = base.experts_per_token / base.num_experts
    assert est.bytes_read_per_token_per_gpu == int(active_weights_bytes(ampere) + pad * share)
