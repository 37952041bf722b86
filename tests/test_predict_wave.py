"""Issue 38, the loaded decode of a wave of requests sent together ("aggregate decode" of the 4x3090
points): whether the CPU outside the GPU's step (plan/servercost.py: the API server, the engine's CPU
per scheduled sequence) reaches it, and which efficiency row a chip takes (the GA102 fit keyed by chip,
never by the validation rig's name; A100/A800 keep the Ampere GA100 figures)."""

from __future__ import annotations

from typing import Any

import pytest

from hwprofile.host.snapshot import Gpu
from hwprofile.model import resolve_model
from hwprofile.plan import candidates, gpufacts
from hwprofile.plan import predict as pm
from hwprofile.plan import simulate as sim
from hwprofile.plan.servercost import async_scheduling_default, server_costs


def _rtx3090_wave(n: int) -> tuple[pm.Gpu, pm.ModelShape, pm.Candidate, pm.Workload]:
    gpu, _ = candidates.gpu_of(Gpu(0, "NVIDIA GeForce RTX 3090", memory_total_bytes=24 * 2**30))
    assert gpu is not None
    shape = candidates.model_shape(resolve_model("Qwen/Qwen3-8B", "model"), 2)
    cand = pm.Candidate(1, 1, 1, 16, 8192, True, 10**6, pm.link_of([], [], None, 1))
    return gpu, shape, cand, pm.Workload(8192, 128, n)


def _simulated_sum(n: int, vllm: str | None) -> float:
    gpu, shape, cand, wl = _rtx3090_wave(n)
    costs = server_costs(vllm) if vllm else None
    eng = sim.engine_for(cand.max_num_seqs, cand.max_num_batched_tokens, cand.kv_tokens, True, costs)
    res = sim.simulate(
        pm.step_cost(gpu, shape, cand), eng, sim.Arrivals("burst", n, wl.input_len, wl.output_len)
    )
    return res.decode_rate_sum()


def test_the_cpu_outside_the_step_does_not_reach_a_wave_on_an_async_scheduling_release() -> None:
    """vLLM 0.26 (the 4x3090 points' release) schedules asynchronously by default (its
    config/vllm.py: async_scheduling None -> True unless pooling, a non-EAGLE/MTP/ngram speculation,
    pipeline parallelism on the V1 runner or an executor without it; the multiprocessing executor of
    TP has it): the engine's CPU per sequence overlaps the GPU's step, and the API server is another
    process that keeps up (100 us per streamed token against a step of tens of ms). So the wave's
    summed decode rate with those costs is the one without them (the analytic wave's model) within
    1 %; on a release before async scheduling the same costs add to every step and the sum drops."""
    assert async_scheduling_default("0.26.0") is True and async_scheduling_default("0.11.0") is False
    for n in (4, 16):
        bare = _simulated_sum(n, None)
        with_cpu = _simulated_sum(n, "0.26.0")
        serial = _simulated_sum(n, "0.11.0")
        assert with_cpu == pytest.approx(bare, rel=0.01), (n, bare, with_cpu)
        assert serial < with_cpu, (n, serial, with_cpu)  # the per-sequence CPU is live where serial


def test_the_wave_sum_is_dominated_by_its_last_requests_and_the_prompt_steps() -> None:
    """What the loaded figure measures: the requests whose windows hold no full prompt step decode at
    the batch's step rate, every earlier one at about (its tokens) / (the prompt steps behind it); a
    slower prompt step lowers the sum, a slower decode step lowers its last terms."""
    gpu, shape, cand, wl = _rtx3090_wave(8)
    rates = pm.wave_decode_rates(gpu, shape, cand, wl, 8)
    step = pm.step_ms(gpu, shape, 1, cand.link, 8, wl.input_len + wl.output_len / 2)["total_ms"]
    assert rates[-1] == pytest.approx(1e3 / step, rel=0.10)
    assert rates[0] < rates[-1] / 5  # the first request's window holds seven prompt steps
    slow = pm.Gpu(**{**gpu.__dict__, "compute_efficiency": gpu.compute_efficiency / 2})
    slower = pm.wave_decode_rates(slow, shape, cand, wl, 8)
    assert sum(slower) < sum(rates)
    assert slower[0] < rates[0]


def _rows() -> list[dict[str, Any]]:
    return [r for r in gpufacts.table() if str(r.get("architecture") or "").startswith("Ampere")]


@pytest.mark.parametrize("applied", [False, True])
def test_the_ga102_geforce_fit_applies_to_geforce_ga102_parts_only(
    monkeypatch: pytest.MonkeyPatch, applied: bool
) -> None:
    """The RTX 3090 fit (FP32 accumulate at half the tensor rate) answers for the GeForce GA102 parts;
    the workstation and datacenter GA102 parts (full-rate FP32 accumulate) keep the family's, the GA100
    parts (A100, A800, A30) their chip's own fit."""
    key = "Ampere (GA102) GeForce"
    table = gpufacts.efficiency_table()
    rows = table["architectures"]
    assert key in rows and "Ampere (GA100)" in rows and "Ampere (GA102)" not in rows
    planted = {**table, "architectures": {**rows, key: {**rows[key], "applied": applied}}}
    monkeypatch.setattr(gpufacts, "efficiency_table", lambda: planted)
    named = {str(r["name"]): r for r in _rows()}
    assert {"GeForce RTX 3090", "A10", "RTX A6000"} <= set(named) and any("A100" in n for n in named)
    for name, row in named.items():
        got = gpufacts.efficiency(str(row["architecture"]), gpufacts.segment(row))["key"]
        if row["architecture"] == "Ampere (GA102)" and name.startswith("GeForce") and applied:
            assert got == key, name  # 3080, 3080 Ti, 3090, 3090 Ti
        elif row["architecture"] == "Ampere (GA100)":
            assert got == "Ampere (GA100)", name
        else:
            assert got == "Ampere", name  # A10, A40, RTX A5000/A6000, GA104/GA106 parts
    eff = gpufacts.efficiency("Ampere (GA102)", gpufacts.segment(named["GeForce RTX 3090"]))
    want = rows[key] if applied else rows["Ampere"]
    assert (eff["memory"], eff["compute"]) == (want["memory"], want["compute"])


def test_the_wave_band_spans_whether_a_prompt_fills_the_step_budget() -> None:
    """Prompts exactly the step budget long (8192 at 8192): each prompt's tail shares a step with the
    next one's chunk, so the next-to-last request decodes about as fast as the last; 1 % shorter, the
    next prompt's long chunk lands in its window. The wave term's band carries both; far from the edge
    (2,000-token prompts, four to a step) the band is narrow."""
    gpu, shape, cand, wl = _rtx3090_wave(8)
    at_edge = pm.wave_decode_rates(gpu, shape, cand, wl, 8)
    shorter = pm.wave_decode_rates(gpu, shape, cand, pm.Workload(8192 - 82, 128, 8), 8)
    assert at_edge[-2] > 0.8 * at_edge[-1]  # next-to-last: no prompt step in its window
    assert shorter[-2] < 0.7 * shorter[-1]  # a full prompt step in its window (an 8K prompt: ~2.4 s)
    lo, hi = pm.wave_band(gpu, shape, cand, wl, 8)
    assert lo <= sum(shorter) < 0.9 * sum(at_edge) <= hi  # the band holds the shorter side, well apart
    term = next(t for t in pm.predict(gpu, shape, cand, wl, None).terms if t["term"].startswith("wave:"))
    assert term["band_tok_s"][0] == pytest.approx(lo, abs=0.01) and term["tok_s"] <= term["band_tok_s"][1]
    far = pm.Workload(2000, 128, 8)
    flo, fhi = pm.wave_band(gpu, shape, cand, far, 8)
    assert fhi / flo < 1.1, (flo, fhi)


def test_the_analytic_wave_takes_the_engine_cpu_as_the_simulation_does() -> None:
    """Before async scheduling (vLLM 0.11) the engine's CPU per scheduled sequence adds to every step:
    the analytic wave with plan/servercost.py's ``step_seq_s`` moves as the simulation with the same
    costs moves (each against its own figure without them); at 0.26 it overlaps and changes nothing."""
    from hwprofile.plan.servercost import STEP_SEQ_S

    gpu, shape, cand, wl = _rtx3090_wave(16)
    bare = sum(pm.wave_decode_rates(gpu, shape, cand, wl, 16))
    serial = sum(pm.wave_decode_rates(gpu, shape, cand, wl, 16, None, pm.StepCpu(STEP_SEQ_S * 1e3, False)))
    overlapped = sum(pm.wave_decode_rates(gpu, shape, cand, wl, 16, None, pm.StepCpu(STEP_SEQ_S * 1e3, True)))
    assert overlapped == pytest.approx(bare, rel=1e-9)
    assert serial < bare
    sim_ratio = _simulated_sum(16, "0.11.0") / _simulated_sum(16, None)
    assert serial / bare == pytest.approx(sim_ratio, abs=0.005), (serial / bare, sim_ratio)
    # where the CPU per sequence is large (1 ms, serial) it shows in the sum
    slow = sum(pm.wave_decode_rates(gpu, shape, cand, wl, 16, None, pm.StepCpu(1.0, False)))
    assert slow < 0.9 * bare
