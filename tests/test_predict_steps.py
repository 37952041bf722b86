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
    peak = gpu.tflops * 1e12 * pm.COMPUTE_EFFICIENCY
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
    assert at["nvlink"] < at["pcie_p2p"] <= at["pcie_host"] < at["sys"] < at["network"]
    # large ones: bandwidth-bound, NVLink first, through the host and across the sockets slower than P2P
    at = {k: pm.allreduce_ms(v, tp, large) for k, v in links.items()}
    assert at["nvlink"] < at["pcie_p2p"] < at["pcie_host"] < at["sys"]
    # the source names the implementation and where its figures come from
    assert "vLLM custom all-reduce" in links["nvlink"].source and "AIConfigurator" in links["nvlink"].source
    assert ("custom all-reduce (2 GPUs)" in links["pcie_p2p"].source) == (tp == 2)


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
