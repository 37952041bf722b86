"""The performance model (hwprofile/plan/predict.py) against AIConfigurator, and its use in the plan.

AIConfigurator 0.12.0 (NVIDIA, `pip install aiconfigurator`, run offline from its measured kernel
tables; vLLM backend, Qwen/Qwen3-32B, 512 in / 256 out) made the fixtures in
tests/fixtures/aiconfigurator/: `make_fixtures.sh` (the exact commands; `cases.json` keeps each run's
command line) and `parse.py`. It is far too large for CI; these tests only read what it printed.

For each `cli estimate` case (system, TP, sequences per instance) hwprofile predicts the same
configuration from the datasheet (hwprofile/data/gpus.yaml) and the host's links (H100 SXM: NV18,
A100 SXM: NV12; L40S: the links AIConfigurator's own L40S NCCL table implies, PCIe through the host
for 2 GPUs and across the CPU sockets for 4). TPOT and output tokens/s must agree within ±30 %; the best
layout at each of the host's concurrencies (16, 64, 256, 1024 requests split over the instances) must
agree. Agreement on 38 of 40 points; TPOT within 25 % everywhere on H100/A100 SXM.

Disagreements (each asserted below, so a new one or a fixed one is noticed):

- L40S x4, one TP4 server at 64 and 256 sequences: AIConfigurator predicts TPOT 136.8 ms and 488.4 ms,
  hwprofile 96.2 ms (-30 %) and 302.6 ms (-38 %); throughput +44 % and +63 %. AIConfigurator is backed by
  its measured NCCL table on that system (2 MiB all-reduce over 4 L40S in 620 µs, ~3.4 GB/s);
  hwprofile's across-the-sockets PCIe figure (a quarter of PCIe gen 4 x16, ~6.3 GB/s) is an assumption.
  The best layout still agrees (two TP2 servers), and on a real host the snapshot's links decide.
- TTFT (not compared): AIConfigurator's aggregated TTFT is 2-7x hwprofile's on NVLink systems (e.g. one
  TP8 H100 at 16 sequences: 103 ms vs 24 ms). hwprofile's TTFT is a prompt's chunk riding in the step
  (512 tokens of prefill FLOPs); AIConfigurator's includes its own scheduling model of mixed
  batches. No published vLLM measurement at this point was found to decide it; `hwprofile bench` on
  the host (calibration) is the way to settle it for a host.
- The best layout at 16 requests on 4 x L40S: AIConfigurator two TP2 servers (295 tok/s) by 5 % over one
  TP4 (280), hwprofile one TP4 (348 vs 288): the same all-reduce cost as above; AIConfigurator's side is
  the measured one. At 64 and 256 requests both take two TP2.
- The SLA search (`cli default`, TTFT <= 500 ms, TPOT <= 120 ms, default_*.txt) agrees on the winner on
  all four hosts, and on the whole order on 8 x H100 SXM: AIConfigurator 4 x TP2 2586 tok/s/GPU >
  2 x TP4 2173 > 1 x TP8 1602 > 8 x TP1 1193; hwprofile (sequences capped at max_num_seqs 256, the
  generic-nvlink profile's draft with its k-by-batch table) 2337 > 1694 > 1093 > 787, 10-34 % lower (8
  x TP1: -34 %, its KV space holds fewer sequences in hwprofile's memory model). The issue's stated
  figures (four TP2 ~1,940 tok/s per GPU vs one TP8 ~1,560) are the same order. 4 x L40S: two TP2 358
  tok/s/GPU vs one TP4 37.5 (AIConfigurator), 232 vs 165 (hwprofile, same all-reduce gap as above).

The constants of hwprofile/plan/predict.py (bandwidth and FLOPs efficiency, per-layer fixed cost,
all-reduce latencies, NVLink efficiency) were set from AIConfigurator's own measured tables, so the
agreement on the points is partly by construction: it checks the model's shape (how TP, batch and
link scale it), not an independent measurement.

Comparison (`cli estimate`, TPOT ms and output tok/s per instance, AIConfigurator vs hwprofile):

    system    GPUs TP seqs |   TPOT AIC     hw       | tok/s AIC      hw       | agree
    h100_sxm   8    1    2 |     25.7    27.1 ( +5%) |       76       73 ( -4%) | yes
    h100_sxm   8    1   32 |     32.4    33.0 ( +2%) |      967      965 ( -0%) | yes
    h100_sxm   8    2   16 |     16.2    17.2 ( +6%) |      958      922 ( -4%) | yes
    h100_sxm   8    2  256 |     51.4    54.7 ( +7%) |     4908     4675 ( -5%) | yes
    h100_sxm   8    4  128 |     20.6    22.6 (+10%) |     6055     5653 ( -7%) | yes
    h100_sxm   8    8   16 |      6.9     7.3 ( +6%) |     2178     2164 ( -1%) | yes
    h100_sxm   8    8  256 |     23.7    29.3 (+24%) |    10547     8741 (-17%) | yes
    a100_sxm   8    1    8 |     48.0    47.7 ( -1%) |      163      166 ( +1%) | yes
    a100_sxm   8    2    4 |     29.6    24.5 (-17%) |      132      161 (+22%) | yes
    a100_sxm   8    2  256 |    145.3   152.2 ( +5%) |     1743     1681 ( -4%) | yes
    a100_sxm   8    8   16 |     11.8    10.7 ( -9%) |     1303     1472 (+13%) | yes
    a100_sxm   8    8  256 |     61.9    60.3 ( -2%) |     4079     4240 ( +4%) | yes
    h100_sxm   4    2  128 |     31.0    33.3 ( +7%) |     4036     3831 ( -5%) | yes
    h100_sxm   4    4  256 |     33.3    37.7 (+13%) |     7543     6776 (-10%) | yes
    l40s       4    2    8 |     53.3    55.1 ( +3%) |      147      144 ( -2%) | yes
    l40s       4    2   32 |     68.8    68.5 ( -1%) |      457      465 ( +2%) | yes
    l40s       4    4   16 |     54.8    45.3 (-17%) |      280      348 (+24%) | yes
    l40s       4    4   64 |    136.8    96.2 (-30%) |      458      661 (+44%) | NO
    l40s       4    4  256 |    488.4   302.6 (-38%) |      520      845 (+63%) | NO
    (all 40 points: `comparison()` below; 8 more cases AIConfigurator refused: out of memory at TP1)

Seed hosts: the predicted best agrees with the rule on the A800 4x PCIe (2 x TP2), the single 4090,
3060/4070 12G and A100 80G (one GPU: one candidate); it disagrees on the dual 3090 (it would take one
TP2 over the two cards, for its larger KV space at 16 requests; the rule's TP1 stays: the profile sets
it, and the evidence, a closed-loop estimate with a queue, is not clear) and on NVLink hosts under the
generic-nvlink profile (4 x TP2 under the throughput objective; the profile's tensor_parallel strategy
stays, `--set layout.strategy=auto` lets the objective decide).
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from hwprofile.host.snapshot import Gpu
from hwprofile.model import resolve_model
from hwprofile.pipeline import calibration_path, make_plan
from hwprofile.plan import candidates
from hwprofile.plan import predict as pm
from hwprofile.plan.types import InstancePrediction

FIXTURES = Path(__file__).parent / "fixtures" / "aiconfigurator"
NVML = {"h100_sxm": "NVIDIA H100 80GB HBM3", "a100_sxm": "NVIDIA A100-SXM4-80GB", "l40s": "NVIDIA L40S"}
TOLERANCE = 0.30
# (system, gpus, tp, sequences per instance): the points where the two disagree by more than 30 %. The
# 4 x L40S TP4 points (64 and 256 sequences) did until the all-reduce through host memory shared the
# CPU's throughput among the group's GPUs (plan/interconnect.py host_share): none now.
DISAGREE: set[tuple[str, int, int, int]] = set()
# (system, gpus, host concurrency): the best layout differs, (AIConfigurator's TP, hwprofile's TP); 4 x L40S
# at 16 requests (AIConfigurator TP2, hwprofile TP4) agreed with the same change
BEST_DISAGREE: dict[tuple[str, int, int], tuple[int, int]] = {}
MEMORY_GB = {"h100_sxm": 80, "a100_sxm": 80, "l40s": 48}


def _cases() -> list[dict]:
    return json.loads((FIXTURES / "cases.json").read_text())["cases"]


def _link(system: str, tp: int, row: dict) -> pm.Link:
    if system == "h100_sxm":
        pairs = [("NV18", True)]
    elif system == "a100_sxm":
        pairs = [("NV12", True)]
    else:  # what AIConfigurator's L40S NCCL table implies: through the host; 4 GPUs across the sockets
        pairs = [("PHB", False)] if tp <= 2 else [("PHB", False), ("SYS", False)]
    return pm.link_of(pairs, [(4, 16)] * tp, row.get("nvlink_bandwidth_gbs"), tp)


def hwprofile_at(case: dict) -> pm.Prediction:
    """hwprofile's prediction of one AIConfigurator case (same model, lengths, TP, sequences)."""
    gpu, row = candidates.gpu_of(
        Gpu(0, NVML[case["system"]], memory_total_bytes=MEMORY_GB[case["system"]] * 2**30)
    )
    assert gpu is not None and row is not None
    # the shares AIConfigurator's own kernel tables give (the default row of hwprofile/data/gpu_efficiency.yaml),
    # not those fitted to served measurements per architecture: this compares the model's shape
    gpu = dataclasses.replace(gpu, mem_efficiency=pm.MEM_EFFICIENCY, compute_efficiency=pm.COMPUTE_EFFICIENCY)
    shape = candidates.model_shape(resolve_model("Qwen/Qwen3-32B", "model"), 2)
    cand = pm.Candidate(
        case["tp"], case["instances"], 1, 256, 8192, True, 10**7, _link(case["system"], case["tp"], row)
    )
    wl = pm.Workload(512, 256, case["instances"] * case["batch_per_instance"])
    return pm.predict(gpu, shape, cand, wl, None, per_instance=case["batch_per_instance"])


def comparison() -> list[dict]:
    """Each case with both predictions (tests and the table in the docstring)."""
    out = []
    for c in _cases():
        if c["aiconfigurator"] is None:
            continue
        p = hwprofile_at(c)
        a = c["aiconfigurator"]
        mine_tps = p.output_tokens_per_s / c["instances"]
        out.append(
            {
                "key": (c["system"], c["gpus"], c["tp"], c["batch_per_instance"]),
                "case": c,
                "aic_tpot": a["tpot_ms"],
                "hw_tpot": p.tpot_ms,
                "aic_tps": a["output_tokens_per_s_per_instance"],
                "hw_tps": mine_tps,
                "tpot_err": p.tpot_ms / a["tpot_ms"] - 1,
                "tps_err": mine_tps / a["output_tokens_per_s_per_instance"] - 1,
            }
        )
    return out


def test_fixtures_were_recorded_with_their_commands() -> None:
    cases = _cases()
    assert len(cases) >= 40
    for c in cases:
        assert c["command"].startswith("/tmp/aic/bin/aiconfigurator cli estimate --model-path Qwen/Qwen3-32B")
        assert (
            f"--tp-size {c['tp']}" in c["command"]
            and f"--batch-size {c['batch_per_instance']}" in c["command"]
        )
        assert c["aiconfigurator"] is not None or c["error"].startswith("RuntimeError: OOM")
    assert (FIXTURES / "make_fixtures.sh").is_file() and (FIXTURES / "parse.py").is_file()


def test_tpot_and_throughput_within_30_percent_of_aiconfigurator() -> None:
    rows = comparison()
    off = {r["key"] for r in rows if abs(r["tpot_err"]) > TOLERANCE or abs(r["tps_err"]) > TOLERANCE}
    assert off == DISAGREE, [
        (r["key"], round(r["tpot_err"], 2), round(r["tps_err"], 2)) for r in rows if r["key"] in off
    ]
    nvlink = [r for r in rows if r["key"][0] != "l40s"]
    assert max(abs(r["tpot_err"]) for r in nvlink) < 0.25


def test_best_layout_agrees_with_aiconfigurator_at_every_concurrency() -> None:
    """At each host concurrency, the TP whose instances give the most output tokens/s in total."""
    best: dict[tuple[str, int, int], dict[str, tuple[float, int]]] = {}
    for r in comparison():
        c = r["case"]
        key = (c["system"], c["gpus"], c["instances"] * c["batch_per_instance"])
        b = best.setdefault(key, {"aic": (0.0, 0), "hw": (0.0, 0)})
        for who, tps in (("aic", r["aic_tps"]), ("hw", r["hw_tps"])):
            total = tps * c["instances"]
            if total > b[who][0]:
                b[who] = (total, c["tp"])
    compared = {k: v for k, v in best.items() if v["aic"][1]}
    assert len(compared) >= 12
    assert {
        k: (v["aic"][1], v["hw"][1]) for k, v in compared.items() if v["aic"][1] != v["hw"][1]
    } == BEST_DISAGREE


def capacity_best(system: str, gpus: int, seqs: int = 512) -> list[tuple[int, float]]:
    """hwprofile's capacity per TP on ``gpus`` of ``system`` within TTFT <= 500 ms and TPOT <= 120 ms
    (AIConfigurator's SLA search: up to 512 sequences per instance, no speculation), best first."""
    gpu, row = candidates.gpu_of(Gpu(0, NVML[system], memory_total_bytes=MEMORY_GB[system] * 2**30))
    assert gpu is not None and row is not None
    model = resolve_model("Qwen/Qwen3-32B", "model")
    shape = candidates.model_shape(model, 2)
    out = []
    for tp in (1, 2, 4, 8):
        if tp > gpus:
            continue
        free = (
            MEMORY_GB[system] * 1e9 * 0.9 - model.weights_bytes / tp - 4e9
        )  # AIConfigurator's ~3.5 GB other memory
        if free <= 0:
            continue
        kv_tokens = int(free / (shape.kv_bytes_per_token / min(tp, shape.kv_heads)))
        cand = pm.Candidate(tp, gpus // tp, 1, seqs, 8192, True, kv_tokens, _link(system, tp, row))
        cap, _ = pm.capacity(gpu, shape, cand, pm.Workload(512, 256, 16), None, 500, 120)
        out.append((tp, cap / gpus))
    return sorted(out, key=lambda x: -x[1])


@pytest.mark.parametrize("system,gpus", [("h100_sxm", 8), ("a100_sxm", 8), ("h100_sxm", 4), ("l40s", 4)])
def test_sla_search_best_layout_agrees(system: str, gpus: int) -> None:
    text = (FIXTURES / f"default_{system}_{gpus}.txt").read_text()
    rank1 = next(line for line in text.splitlines() if line.startswith("|  1 "))
    aic_tp = int(rank1.split("tp")[-1].split("pp")[0])
    ours = capacity_best(system, gpus)
    assert ours[0][0] == aic_tp, ours


def test_sla_search_and_the_issue_figures_rank_four_tp2_first_on_8_h100(host_of, empty_root) -> None:
    text = (FIXTURES / "default_h100_sxm_8.txt").read_text()
    rank1 = next(line for line in text.splitlines() if line.startswith("|  1 "))
    assert "tp2pp1" in rank1 and "(=384x4)" in rank1  # AIConfigurator: four TP2 servers win
    # the issue's figures: four TP2 ~1,940 output tok/s per GPU against ~1,560 for one TP8
    plan = make_plan(host_of("h100-sxm-8x"), empty_root, environ={}, sets=["layout.strategy=auto"]).to_json()
    group = plan["prediction"]["groups"][0]
    cap = {c["layout"]: c["capacity_output_tokens_per_s"] for c in group["candidates"]}
    assert cap["4 x TP2"] > cap["1 x TP8"]
    assert group["chosen"] == "4 x TP2" and group["chosen_by"] == "prediction"
    assert plan["instances"][0]["tensor_parallel_size"] == 2


def test_the_objective_decides_where_the_layout_is_auto(host_of, empty_root) -> None:
    host = host_of("h100-sxm-8x")
    lat = make_plan(
        host, empty_root, environ={}, sets=["layout.strategy=auto", "layout.objective=latency"]
    ).to_json()
    assert [i["tensor_parallel_size"] for i in lat["instances"]] == [8]
    assert "objective latency" in lat["prediction"]["groups"][0]["reason"]
    # the generic-nvlink profile's own strategy gives way to the 4 x TP2 predicted >= 10 % better
    shipped = make_plan(host, empty_root, environ={}).to_json()
    g = shipped["prediction"]["groups"][0]
    assert (g["chosen"], g["chosen_by"], g["predicted_best"]) == ("4 x TP2", "prediction", "4 x TP2")
    # an operator's strategy stays, and the plan says what the objective would take
    rule = make_plan(host, empty_root, environ={}, sets=["layout.strategy=tensor_parallel"]).to_json()
    g = rule["prediction"]["groups"][0]
    assert (g["chosen"], g["chosen_by"], g["predicted_best"]) == ("1 x TP8", "rule", "4 x TP2")
    assert any(
        r["key"].startswith("layout.objective[") and "would choose" in r["reason"] for r in rule["reasons"]
    )


@pytest.mark.parametrize("name", ["a800-pcie-4x-2numa", "rtx4090-1x", "a100-80g-pcie-1x", "h100-sxm-8x"])
def test_every_gpu_instance_has_its_prediction_at_the_workload(host_of, empty_root, name) -> None:
    plan = make_plan(host_of(name), empty_root, environ={}).to_json()
    assert plan["prediction"]["workload"] == {"input_len": 512, "output_len": 256, "concurrency": 16}
    for inst in plan["instances"]:
        p = inst["prediction"]
        assert p["ttft_ms"] > 0 and p["tpot_ms"] > 0 and p["output_tokens_per_s"] > 0
        assert p["source"] == "datasheet" and any("gpus.yaml" in t["source"] for t in p["terms"])
    chosen = [c for g in plan["prediction"]["groups"] for c in g["candidates"] if c["chosen"]]
    assert len(chosen) == len(plan["prediction"]["groups"])


def test_a800_seed_host_two_tp2_agrees_and_pcie_tp4_is_not_allowed(host_of, empty_root) -> None:
    plan = make_plan(host_of("a800-pcie-4x-2numa"), empty_root, environ={}).to_json()
    g = plan["prediction"]["groups"][0]
    # the prediction agrees: 2 x TP2 is its best, or no other layout beats it by the 10 % margin
    assert g["chosen"] == "2 x TP2"
    assert g["predicted_best"] == "2 x TP2" or "less than the 10% margin" in g["reason"]
    tp4 = next(c for c in g["candidates"] if c["tensor_parallel_size"] == 4)
    assert not tp4["fits"] and "max_pcie_tensor_parallel" in tp4["why_not"]
    # the workload's 16 requests split over the two servers: 8 each, and each server's own tokens/s
    assert [i["prediction"]["concurrency"] for i in plan["instances"]] == [8, 8]
    total = sum(i["prediction"]["output_tokens_per_s"] for i in plan["instances"])
    assert total == pytest.approx(
        next(c for c in g["candidates"] if c["chosen"])["output_tokens_per_s"], rel=0.01
    )


def test_workload_settings_move_the_prediction(host_of, empty_root) -> None:
    host = host_of("a100-80g-pcie-1x")
    short = make_plan(host, empty_root, environ={}).to_json()["instances"][0]["prediction"]
    long = make_plan(host, empty_root, environ={}, sets=["layout.workload_input_len=4096"]).to_json()
    p = long["instances"][0]["prediction"]
    assert p["workload"]["input_len"] == 4096 and p["ttft_ms"] > short["ttft_ms"] * 4


def test_links_read_from_the_snapshot() -> None:
    nv = pm.link_of([("NV18", True)], [(5, 16)], 900, 8)
    pcie2 = pm.link_of([("PIX", True)], [(4, 16), (4, 16)], None, 2)
    pcie4 = pm.link_of([("PIX", True)] * 6, [(4, 16)] * 4, None, 4)
    host = pm.link_of([("PHB", False)], [(4, 16)] * 2, None, 2)
    sys_ = pm.link_of([("SYS", False)], [(4, 16)] * 2, None, 2)
    narrow = pm.link_of([("PIX", True)], [(3, 8), (4, 16)], None, 2)
    assert nv.kind == "nvlink" and "NVLink x18" in nv.source
    assert pcie2.kind == "pcie_p2p" and "custom all-reduce" in pcie2.source
    assert pcie4.latency_us > pcie2.latency_us and "NCCL" in pcie4.source
    assert host.gbs == pytest.approx(pcie2.gbs / 2) and sys_.gbs < host.gbs
    assert narrow.gbs < pcie2.gbs / 3 and "gen 3 x8" in narrow.source
    assert pm.allreduce_ms(pm.link_of([], [], None, 1), 1, 1e6) == 0.0


def test_speculation_pays_at_batch_one_and_not_at_a_large_batch() -> None:
    gpu, _ = candidates.gpu_of(Gpu(0, NVML["h100_sxm"], memory_total_bytes=80 * 2**30))
    assert gpu is not None
    shape = candidates.model_shape(resolve_model("Qwen/Qwen3-32B", "model"), 2)
    draft = candidates.model_shape(resolve_model("Qwen/Qwen3-1.7B", "model"), 2)
    cand = pm.Candidate(2, 1, 1, 256, 8192, True, 10**7, pm.link_of([("NV18", True)], [], 900, 2))
    spec = pm.Speculation("draft_model", (), 5, 0.7, draft, "test")
    wl = pm.Workload(512, 256, 1)
    plain1, spec1 = pm.predict(gpu, shape, cand, wl, None), pm.predict(gpu, shape, cand, wl, spec)
    assert spec1.tpot_ms < plain1.tpot_ms
    wl = pm.Workload(512, 256, 256)
    assert pm.predict(gpu, shape, cand, wl, spec).tpot_ms > pm.predict(gpu, shape, cand, wl, None).tpot_ms
    table = pm.Speculation("draft_model", ((1, 16, 5), (17, None, 0)), 5, 0.7, draft, "test")
    assert pm.predict(gpu, shape, cand, wl, table).tpot_ms == pytest.approx(
        pm.predict(gpu, shape, cand, wl, None).tpot_ms
    )


def _bench_doc(host, tpot: float, ttft: float, tps: float, concurrency: int = 16) -> dict:
    def spread(v: float) -> dict:
        return {"values": [v], "median": v, "min": v, "max": v, "relative_spread": 0.0}

    return {
        "schema": "hwprofile.bench/1",
        "created": "2026-12-01T10:00:00Z",
        "workload": {"input_len": 512, "output_len": 256},
        "host": {"gpus": [{"index": g.index, "name": g.name, "uuid": g.uuid} for g in host.usable_gpus]},
        "plans": [
            {
                "instances": 2,
                "non_default_settings": [],
                "summary": [
                    {
                        "concurrency": concurrency,
                        "rounds": 1,
                        "metrics": {
                            "p50_tpot_ms": spread(tpot),
                            "p50_ttft_ms": spread(ttft),
                            "output_throughput": spread(tps),
                        },
                    }
                ],
            }
        ],
    }


def test_calibration_from_bench_replaces_the_datasheet_on_that_host(host_of, empty_root) -> None:
    host = host_of("a800-pcie-4x-2numa")
    before = make_plan(host, empty_root, environ={}).to_json()
    path = Path(calibration_path(empty_root, host))
    assert before["prediction"]["calibration"] == {
        "fingerprint": path.stem,
        "path": None,
        "created": None,
        "not_applied": None,
    }
    path.parent.mkdir()
    path.write_text(json.dumps(_bench_doc(host, tpot=30.0, ttft=250.0, tps=480.0)))
    after = make_plan(host, empty_root, environ={}).to_json()
    assert after["prediction"]["calibration"]["path"] == str(path)
    for inst in after["instances"]:  # the measured configuration at the measured workload: the measurement
        p = inst["prediction"]
        assert (p["tpot_ms"], p["ttft_ms"], p["output_tokens_per_s"]) == (30.0, 250.0, 240.0)
        assert str(path) in p["source"]
    # another workload: the datasheet model scaled by what was measured
    other = make_plan(host, empty_root, environ={}, sets=["layout.workload_concurrency=64"]).to_json()
    base = make_plan(
        host, Path(str(empty_root) + "-none"), environ={}, sets=["layout.workload_concurrency=64"]
    )
    ratio = 30.0 / before["instances"][0]["prediction"]["tpot_ms"]
    got = other["instances"][0]["prediction"]
    assert got["source"].startswith("datasheet scaled by calibration")
    assert got["tpot_ms"] == pytest.approx(base.instances[0].prediction.tpot_ms * ratio, rel=0.02)


def test_a_gpu_calibration_of_another_model_leaves_the_datasheet_saying_why(host_of, empty_root) -> None:
    """A bench of one model says nothing of another's steps: the plan of another model on that host keeps
    the datasheet's figures, names the file and why, and says how to calibrate for it; the same model's
    facts, under another name, take it."""
    host = host_of("a800-pcie-4x-2numa")
    base = make_plan(host, empty_root, environ={})
    path = Path(calibration_path(empty_root, host))
    path.parent.mkdir()
    doc = _bench_doc(host, tpot=30.0, ttft=250.0, tps=480.0)
    other = make_plan(host, empty_root, environ={}, model="Qwen/Qwen3-8B").model
    doc["plans"][0] |= {"model": other.name, "model_facts": other.cost_facts()}
    path.write_text(json.dumps(doc))
    got = make_plan(host, empty_root, environ={}).to_json()
    assert [i["prediction"] for i in got["instances"]] == [i.prediction.to_json() for i in base.instances]
    assert all("calibration" not in i["prediction"]["source"] for i in got["instances"])
    assert got["prediction"]["calibration"]["path"] is None
    why = got["prediction"]["calibration"]["not_applied"]
    assert why.startswith(f"{path}: it measured Qwen/Qwen3-8B (") and "layers 36 there" in why
    assert any(str(path) in w and "--calibrate" in w for w in got["warnings"])
    assert any(r["key"] == "prediction.calibration" for r in got["reasons"])
    # the planned model's own facts, whatever name the bench gave it: taken
    doc["plans"][0] |= {"model": "/srv/models/elsewhere", "model_facts": base.model.cost_facts()}
    path.write_text(json.dumps(doc))
    took = make_plan(host, empty_root, environ={}).to_json()
    assert took["prediction"]["calibration"] == {
        "fingerprint": path.stem,
        "path": str(path),
        "created": doc["created"],
        "not_applied": None,
    }
    assert all(str(path) in i["prediction"]["source"] for i in took["instances"])


def test_a_gpu_bench_at_other_batching_is_modelled_at_its_own(host_of, empty_root) -> None:
    """The bench's recorded batching is the configuration the model is set against: at the benched
    workload the measurement is the plan's own figure only where the bench ran the plan's batching."""
    host = host_of("a800-pcie-4x-2numa")
    seqs = make_plan(host, empty_root, environ={}).instances[0].engine.max_num_seqs
    path = Path(calibration_path(empty_root, host))
    path.parent.mkdir()
    doc = _bench_doc(host, tpot=30.0, ttft=250.0, tps=480.0)
    for recorded, measured_back in ((seqs, True), (4, False)):  # 4: below the 16 requests benched
        doc["plans"][0]["max_num_seqs"] = recorded
        path.write_text(json.dumps(doc))
        p = make_plan(host, empty_root, environ={}).to_json()["instances"][0]["prediction"]
        assert ((p["tpot_ms"], p["ttft_ms"]) == (30.0, 250.0)) is measured_back, recorded
        assert p["source"].startswith("datasheet scaled by calibration") is not measured_back


def test_a_gpu_bench_is_set_against_the_speculation_it_ran(host_of, empty_root) -> None:
    """The plan here speculates with a draft (k = 5 at the benched 8 requests an instance). A bench that
    recorded that: its measurement is the plan's figure. One that ran without speculation: the model
    without it is what the measurement scales, and the figure is not the measurement. One that ran
    another method: nothing this plan models, the datasheet's figures stay."""
    host = host_of("a800-pcie-4x-2numa")
    base = make_plan(host, empty_root, environ={})
    spec = base.instances[0].speculative
    assert spec is not None and spec.method == "draft_model"
    path = Path(calibration_path(empty_root, host))
    path.parent.mkdir()
    doc = _bench_doc(host, tpot=30.0, ttft=250.0, tps=480.0)
    ran = {"method": "draft_model", "model": spec.model, "num_speculative_tokens": 5}
    for recorded, want in ((ran, "measured"), (None, "scaled"), (ran | {"method": "ngram"}, "datasheet")):
        doc["plans"][0]["speculative"] = recorded
        path.write_text(json.dumps(doc))
        p = make_plan(host, empty_root, environ={}).to_json()["instances"][0]["prediction"]
        got = (
            "measured"
            if (p["tpot_ms"], p["ttft_ms"]) == (30.0, 250.0)
            else "scaled"
            if p["source"].startswith("datasheet scaled by calibration")
            else p["source"]
        )
        assert got == want, recorded
    said = p.pop("terms")[-1]
    assert said["source"] == str(path) and said["term"].startswith(
        "calibration not applied: its bench speculated by ngram, this candidate by draft_model"
    )
    assert p == {k: v for k, v in base.instances[0].prediction.to_json().items() if k != "terms"}


@pytest.mark.parametrize("k", [1, 3, 5])
@pytest.mark.parametrize("a", [0.0, 0.3, 0.6, 0.85])
def test_the_acceptance_of_a_measured_length_gives_that_length_back(a: float, k: int) -> None:
    length = (1 - a ** (k + 1)) / (1 - a)  # what the model expects per step (predict._speculated)
    assert pm.acceptance_of_length(length, k) == pytest.approx(a, abs=1e-5)
    assert pm.acceptance_of_length(0.5, k) == pytest.approx(0.0, abs=1e-5)  # below 1: none accepted
    assert pm.acceptance_of_length(k + 3, k) == pytest.approx(0.999, abs=1e-5)  # above k + 1: all


def test_a_bench_that_speculated_sets_the_acceptance_an_operator_did_not(host_of, empty_root) -> None:
    """vLLM's counters read by the bench (a mean acceptance length at the bench's k) become the plan's
    per-token acceptance where the plan speculates by the same method and no operator set one; the
    reason says measured and from which file; an operator's value, or another method, is left alone."""
    host = host_of("a800-pcie-4x-2numa")
    spec = make_plan(host, empty_root, environ={}).instances[0].speculative
    assert spec is not None and spec.method == "draft_model"
    path = Path(calibration_path(empty_root, host))
    path.parent.mkdir()
    doc = _bench_doc(host, tpot=30.0, ttft=250.0, tps=480.0)
    doc["plans"][0]["speculative"] = {
        "method": "draft_model",
        "model": spec.model,
        "num_speculative_tokens": 3,
    }
    doc["plans"][0]["summary"][0]["mean_acceptance_length"] = {"median": 3.1, "values": [3.1]}

    def acceptance(sets: list[str] | None = None) -> tuple[object, str, str]:
        """The reason's value and text for the acceptance, and the speculation term's source; the
        instance's batch-1 ceiling (its ``estimate``) is at the acceptance the prediction takes."""
        plan = make_plan(host, empty_root, environ={}, sets=sets or [])
        got = plan.to_json()
        said = [r for r in got["reasons"] if r["key"] == "speculative.assumed_acceptance"]
        (term,) = [
            t["source"] for t in got["instances"][0]["prediction"]["terms"] if "speculation" in t["term"]
        ]
        est = got["instances"][0]["estimate"]
        assert f"acceptance {est['assumed_acceptance']} ({est['acceptance_source']})" in term, (est, term)
        from hwprofile.cli.views import _instance_body

        shown = "\n".join(_instance_body(plan.instances[0]))  # what plan --explain prints
        measured = est["acceptance_source"].startswith("measured: ")
        assert (
            f"acceptance {est['assumed_acceptance']} (measured by this host's bench)" in shown
        ) == measured
        return (said[-1]["value"], said[-1]["reason"], term) if said else (None, "", term)

    path.write_text(json.dumps(doc))
    a, why, term = acceptance()
    assert a == pm.acceptance_of_length(3.1, 3) and 0.8 < a < 0.9  # 1 + a + a^2 + a^3 = 3.1
    assert why.startswith(f"measured, for an instance that speculates by draft_model and {spec.model}: ")
    assert f"this host's bench ({path}, " in why and f"acceptance {a} (measured: {path}, " in term
    a, why, term = acceptance(["speculative.assumed_acceptance=0.5"])
    assert a == 0.5 and "not taken: the operator's value stays" in why and "acceptance 0.5 " in term
    # another draft's, or another method's, acceptance says nothing of this one's
    for other in ({"model": "Qwen/Qwen3-0.6B"}, {"method": "ngram", "model": None}):
        doc["plans"][0]["speculative"] |= other
        path.write_text(json.dumps(doc))
        a, why, term = acceptance()
        assert "acceptance 0.6 (speculative.assumed_acceptance)" in term, other
        doc["plans"][0]["speculative"] |= {"method": "draft_model", "model": spec.model}
    doc["plans"][0]["summary"][0]["mean_acceptance_length"] = {"median": 0.2}
    path.write_text(json.dumps(doc))
    from hwprofile.config import ConfigError

    with pytest.raises(ConfigError, match=r"summary\[0\]\.mean_acceptance_length\.median: expected 1 to 65"):
        make_plan(host, empty_root, environ={})


def test_an_operators_acceptance_moves_the_calibrated_figures(host_of, empty_root) -> None:
    """A bench that ran the plan's own speculation (its draft, its k table): at the benched workload its
    measurement is the plan's figure. An operator's lower acceptance is planned as such: the bench is
    modelled at what it measured, the plan at the operator's value, and TPOT comes out slower."""
    host = host_of("a800-pcie-4x-2numa")
    spec = make_plan(host, empty_root, environ={}).instances[0].speculative
    assert spec is not None and isinstance(spec.num_speculative_tokens_per_batch_size, tuple)
    path = Path(calibration_path(empty_root, host))
    path.parent.mkdir()
    doc = _bench_doc(host, tpot=30.0, ttft=250.0, tps=480.0)
    doc["plans"][0]["speculative"] = {
        "method": spec.method,
        "model": spec.model,
        "num_speculative_tokens": spec.num_speculative_tokens,
        "num_speculative_tokens_per_batch_size": [
            list(r) for r in spec.num_speculative_tokens_per_batch_size
        ],
    }
    doc["plans"][0]["summary"][0]["mean_acceptance_length"] = {"median": 4.0}  # k = 5 at 8 an instance
    path.write_text(json.dumps(doc))
    own = make_plan(host, empty_root, environ={}).to_json()["instances"][0]["prediction"]
    assert (own["tpot_ms"], own["ttft_ms"]) == (30.0, 250.0)
    low = make_plan(host, empty_root, environ={}, sets=["speculative.assumed_acceptance=0.3"]).to_json()
    p = low["instances"][0]["prediction"]
    assert p["source"].startswith("datasheet scaled by calibration") and p["tpot_ms"] > 30.0 * 1.2


def test_the_4_bit_retry_takes_the_calibration_of_the_checkpoint_that_runs(host_of, empty_root) -> None:
    """Qwen3-32B does not fit one RTX 4090 at 16 bits: the plan starts over with its 4-bit checkpoint. A
    bench of that checkpoint (n-gram with the plan's k table) is its calibration: the measured acceptance
    is what the final predictions take, and the reason says so. A bench of the 16-bit one is not."""
    host = host_of("rtx4090-1x")
    base = make_plan(host, empty_root, environ={}, model="Qwen/Qwen3-32B")
    spec = base.instances[0].speculative
    assert base.model.bits == 4 and spec is not None and spec.method == "ngram"
    assert spec.num_speculative_tokens_per_batch_size == ((1, 2, 6), (3, None, 4))
    from hwprofile.model import resolve_model
    from hwprofile.plan.checkpoint import model_summary

    sixteen = model_summary(resolve_model("Qwen/Qwen3-32B", "model"))
    path = Path(calibration_path(empty_root, host))
    path.parent.mkdir()
    doc = _bench_doc(host, tpot=30.0, ttft=250.0, tps=480.0)
    doc["plans"][0] |= {
        "instances": 1,
        "speculative": {
            "method": "ngram",
            "model": None,
            "num_speculative_tokens": 6,
            "num_speculative_tokens_per_batch_size": [[1, 2, 6], [3, None, 4]],
        },
    }
    doc["plans"][0]["summary"][0]["mean_acceptance_length"] = {"median": 2.5}  # at 16 requests: k = 4
    want = round(pm.acceptance_of_length(2.5, 4), 6)
    for measured, applies in ((base.model, True), (sixteen, False)):
        doc["plans"][0] |= {"model": measured.name, "model_facts": measured.cost_facts()}
        path.write_text(json.dumps(doc))
        got = make_plan(host, empty_root, environ={}, model="Qwen/Qwen3-32B").to_json()
        said = [r for r in got["reasons"] if r["key"] == "speculative.assumed_acceptance"]
        terms = " ".join(t["source"] for t in got["instances"][0]["prediction"]["terms"])
        assert got["model"]["name"] == "Qwen/Qwen3-32B-AWQ"
        if applies:
            assert said and said[-1]["value"] == want and "at its k table" in said[-1]["reason"]
            assert f"acceptance {want} " in terms and got["prediction"]["calibration"]["not_applied"] is None
        else:
            assert not said and "acceptance 0.6 " in terms
            assert "it measured Qwen/Qwen3-32B (" in got["prediction"]["calibration"]["not_applied"]


def test_a_calibration_from_other_gpus_or_not_a_bench_result_is_refused(host_of, empty_root) -> None:
    from hwprofile.config import ConfigError

    host = host_of("a800-pcie-4x-2numa")
    path = Path(calibration_path(empty_root, host))
    path.parent.mkdir()
    doc = _bench_doc(host, 30.0, 250.0, 480.0)
    doc["host"]["gpus"] = [{"index": 0, "name": "x", "uuid": "GPU-not-this-one"}]
    path.write_text(json.dumps(doc))
    with pytest.raises(ConfigError, match="measured on GPUs"):
        make_plan(host, empty_root, environ={})
    path.write_text('{"schema": "hwprofile.plan/1"}')
    with pytest.raises(ConfigError, match="not a usable hwprofile bench result"):
        make_plan(host, empty_root, environ={})


def test_explain_shows_the_candidates(host_of, empty_root, capsys) -> None:
    from hwprofile.cli.views import format_plan

    text = format_plan(make_plan(host_of("a800-pcie-4x-2numa"), empty_root, environ={}), explain=True)
    assert "Predictions at 512 in / 256 out, 16 requests in flight (objective throughput" in text
    assert "=>  2 x TP2" in text and "x   1 x TP4" in text
    assert (
        "calibration: none" in text and "each instance: TTFT" in text
    )  # the two identical instances, folded


def test_batching_alternatives_show_what_a_bigger_step_costs_on_one_a100(host_of, empty_root) -> None:
    """The a100-80g profile's choice of 2048 tokens per step: at 64 requests the KV space a 16384-token
    step's activations take costs output tokens/s (vLLM PR #17885 measured the same on A100). At 64
    requests the 1.7B draft gives way (its KV starved: plan/speculative.py ``draft_gain``), and the
    bigger step still costs over 5 % (9 % predicted)."""
    plan = make_plan(
        host_of("a100-80g-pcie-1x"), empty_root, environ={}, sets=["layout.workload_concurrency=64"]
    )
    rows = plan.to_json()["prediction"]["groups"][0]["batching"]
    at = {(b["max_num_seqs"], b["max_num_batched_tokens"]): b for b in rows}
    planned = next(b for b in rows if b["planned"])
    assert (planned["max_num_seqs"], planned["max_num_batched_tokens"]) == (256, 2048)
    assert at[(256, 16384)]["kv_tokens"] < at[(256, 2048)]["kv_tokens"]
    assert at[(256, 16384)]["output_tokens_per_s"] < 0.95 * at[(256, 2048)]["output_tokens_per_s"]
    assert plan.draft is None


def _row(seqs: int, ttft: float, tpot: float, cap: float, planned: bool = False, fits: bool = True) -> dict:
    return {
        "max_num_seqs": seqs,
        "max_num_batched_tokens": 2048,
        "fits": fits,
        "kv_tokens": 1000,
        "ttft_ms": ttft,
        "tpot_ms": tpot,
        "output_tokens_per_s": cap,
        "capacity_output_tokens_per_s": cap,
        "capacity_concurrency": seqs,
        "planned": planned,
    }


def test_a_configured_batching_over_the_ttft_target_is_never_called_within_it() -> None:
    """issue 31: "configured max_num_seqs 6 ...: TTFT 7665 ms ... within the targets" with a 500 ms target."""
    import re

    from hwprofile.plan.batching import choose_batching

    planned = _row(6, 9500, 20, 278, planned=True)
    i, why = choose_batching([planned, _row(16, 370, 45, 348)], "throughput", 500, 120, 256)
    assert i == 1 and "TTFT 9500 ms, TPOT 20.0 ms at the workload (TTFT over 500 ms)" in why, why
    assert not re.search(r"TTFT 9500 ms[^;]*within the targets", why), why
    assert "278 tok/s within the targets at 6 requests" in why  # what it does meet, at the load it meets it
    never = _row(6, 9500, 200, 0, planned=True)
    _, why = choose_batching([never, _row(16, 370, 45, 348)], "throughput", 500, 120, 256)
    assert "(TTFT over 500 ms, TPOT over 120 ms); no load within the targets" in why, why


def test_the_objective_chooses_the_batching_by_a_margin() -> None:
    from hwprofile.plan.batching import BATCHING_MARGIN, choose_batching

    planned = _row(6, 9500, 20, 278, planned=True)
    # throughput: the most tok/s within the targets, when it beats the configured one by the margin
    i, why = choose_batching(
        [planned, _row(16, 370, 45, 348), _row(32, 900, 60, 0)], "throughput", 500, 120, 256
    )
    assert (
        i == 1
        and why.startswith("objective throughput: max_num_seqs 16")
        and "configured max_num_seqs 6" in why
    )
    close = _row(12, 300, 30, 278 * (1 + BATCHING_MARGIN) - 1)
    assert choose_batching([planned, close], "throughput", 500, 120, 256) == (
        -1,
        "objective throughput: max_num_seqs 12, max_num_batched_tokens 2048 are predicted less than 10% "
        "better than the configured batching, which stays",
    )
    # a row that does not fit never wins; none within the targets at any load: the closest to them
    i, why = choose_batching(
        [_row(4, 18600, 21, 0, planned=True), _row(16, 590, 67, 0), _row(64, 10, 1, 0, fits=False)],
        "throughput",
        500,
        120,
        256,
    )
    assert i == 1 and "as no batching meets TTFT <= 500 ms" in why
    # latency: the shortest request, not the lowest TPOT (fewer sequences only make requests wait)
    rows = [_row(6, 9500, 20, 278, planned=True), _row(3, 20000, 15, 100), _row(16, 370, 45, 348)]
    assert choose_batching(rows, "latency", 500, 120, 256)[0] == 2
    assert choose_batching([_row(6, 100, 10, 0, planned=True, fits=False)], "latency", 500, 120, 256) == (
        -1,
        "no batching fits",
    )


def test_gdn_prefill_flops_are_counted_per_prompt_token() -> None:
    """Issue 38: a GDN layer's chunked delta rule costs FLOPs of its own per prompt token (state readout
    and update, the chunk's causal attention), beyond its projections: counted in a prefill step's
    compute, not in a decode step's (there the state is a bandwidth term)."""
    model = resolve_model(
        str(Path(__file__).resolve().parent.parent / "examples" / "models" / "qwen3.8-27b-fp8")
    )
    per_token = candidates.gdn_prefill_flops_per_token(model)
    assert per_token == 48 * (6 * 128 * 128 + 4 * 64 * (128 + 128)) * 48  # 48 value heads x 48 GDN layers
    assert per_token < 0.01 * 2 * model.params  # under 1 % of the matmuls: a small term, not a missing one
    shape = candidates.model_shape(model, 1)
    assert shape.state_prefill_flops_per_token == per_token
    gpu, _ = candidates.gpu_of(Gpu(0, NVML["a100_sxm"], memory_total_bytes=80 * 2**30))
    assert gpu is not None
    link = pm.link_of([], [], None, 1)
    without = dataclasses.replace(shape, state_prefill_flops_per_token=0.0)
    a = pm.step_ms(gpu, shape, 1, link, 0, 0.0, 4096, 0.0)["compute_ms"]
    b = pm.step_ms(gpu, without, 1, link, 0, 0.0, 4096, 0.0)["compute_ms"]
    assert a - b == pytest.approx(per_token * 4096 / (gpu.tflops * 1e12 * gpu.compute_efficiency) * 1e3)
    decode = pm.step_ms(gpu, shape, 1, link, 8, 1024.0)["compute_ms"]
    assert decode == pm.step_ms(gpu, without, 1, link, 8, 1024.0)["compute_ms"]


def test_a_gpu_calibration_scales_the_engines_ttft_and_adds_the_latency_outside_it_once(
    host_of, tmp_path
) -> None:
    """A bench whose /metrics put 200 of its 250 ms TTFT outside the engine (HTTP, tokenization, the
    client): another prompt length scales the engine's 50 ms by the model, and adds the 200 ms once,
    where scaling the whole TTFT would have multiplied a fixed latency by the prompt's growth."""
    host = host_of("a800-pcie-4x-2numa")
    longer = ["layout.workload_input_len=4096"]
    plans = {}
    for name, outside in (("whole", None), ("split", 200.0)):
        root = tmp_path / name
        path = Path(calibration_path(root, host))
        path.parent.mkdir(parents=True)
        doc = _bench_doc(host, tpot=30.0, ttft=250.0, tps=480.0)
        if outside is not None:
            doc["plans"][0]["runs"] = [
                {
                    "points": [
                        {
                            "concurrency": 16,
                            "latency_ms": {"ttft": {"mean": 250.0}},
                            "server_metrics": {"queue_ms": 10.0, "prefill_ms": 250.0 - outside - 10.0},
                        }
                    ]
                }
            ]
        path.write_text(json.dumps(doc))
        plans[name] = make_plan(host, root, environ={}, sets=longer).instances[0].prediction
    base = make_plan(host, tmp_path / "none", environ={}).instances[0].prediction
    at_bench = make_plan(host, tmp_path / "none", environ={}, sets=longer).instances[0].prediction

    # what the model says the longer prompt does to the engine's part (the datasheet's fitted latency
    # outside the engine, 30 ms in both, is not the prompt's: the measurement replaces it)
    def outside(p: InstancePrediction) -> float:
        return next(t["ms"] for t in p.terms if t["term"].startswith("the request's latency outside"))

    assert outside(base) == outside(at_bench) == 30.0
    growth = (at_bench.ttft_ms - 30.0) / (base.ttft_ms - 30.0)
    assert growth > 1.5
    assert plans["whole"].ttft_ms == pytest.approx(250.0 * growth, rel=0.02)
    assert plans["split"].ttft_ms == pytest.approx(50.0 * growth + 200.0, rel=0.02)
    for p in plans.values():  # the fitted latency gave way to the measurement
        assert not any(t["term"].startswith("the request's latency outside") for t in p.terms)
    scaled = next(t for t in plans["split"].terms if t["term"].startswith("scaled by the measurement"))
    assert "+ 200.0 ms outside the engine" in scaled["term"] and scaled["ms"] == 200.0


def test_of_capacities_within_10_tok_s_the_one_within_the_targets_at_the_workload_wins() -> None:
    """RTX 4090, Qwen3-32B-AWQ, 16 requests: 12 sequences sustain 366 tok/s within the targets, 16
    sustain 369, but 12 makes the workload's other 4 requests wait (TTFT 3.1 s, over the 500 ms target;
    the requests take as long either way). Within 10 tok/s the two are equal, wherever a rounding bin
    would have split them (366 and 374 are as equal as 366 and 369): the one within the targets at the
    workload wins, then the shorter request; the row that sustains 11 tok/s more still wins on capacity."""
    from hwprofile.plan.batching import CAPACITY_TIE, choose_batching

    planned = _row(6, 8100, 17, 330, planned=True)
    for more in (2.4, 8.0):
        i, why = choose_batching(
            [planned, _row(12, 3130, 31, 366.2), _row(16, 380, 42, 366.2 + more)], "throughput", 500, 120, 256
        )
        assert i == 2 and why.startswith("objective throughput: max_num_seqs 16"), (more, why)
    # 12 ahead by less than the tie: still the one within the targets at the workload
    i, _ = choose_batching(
        [planned, _row(12, 3130, 31, 375.0), _row(16, 380, 42, 375.0 - CAPACITY_TIE + 1)],
        "throughput",
        500,
        120,
        256,
    )
    assert i == 2
    # both within the targets at the workload: the shorter request
    i, _ = choose_batching(
        [planned, _row(12, 450, 31, 366.2), _row(16, 380, 42, 368.6)], "throughput", 500, 120, 256
    )
    assert i == 1  # 450 + 255 x 31 < 380 + 255 x 42
    # beyond it, capacity decides
    i, _ = choose_batching(
        [planned, _row(12, 3130, 31, 380.0), _row(16, 380, 42, 380.0 - CAPACITY_TIE - 1)],
        "throughput",
        500,
        120,
        256,
    )
    assert i == 1


def test_layouts_within_10_tok_s_of_the_most_capacity_are_equal_and_the_lower_tpot_wins() -> None:
    """``predict.choose`` (the layout) ties as the batching does: a band of CAPACITY_TIE below the best,
    not fixed bins (which split 364.9 from 365.1 and joined 361 with 369 only by chance)."""
    from hwprofile.plan.predict import CAPACITY_TIE, Prediction, choose

    def pred(label: str, capacity: float, tpot: float) -> Prediction:
        return Prediction(
            label, 1, 1, 100.0, tpot, capacity, 16, "datasheet", capacity_output_tokens_per_s=capacity
        )

    for a, b in ((364.9, 365.1), (361.0, 369.0), (366.0, 366.0 + CAPACITY_TIE - 0.5)):
        i, why = choose([pred("more", b, 30.0), pred("faster", a, 20.0)], "throughput", 1000, 100)
        assert i == 1 and why.startswith("objective throughput: faster sustains as much"), (a, b, why)
        assert f"(within 10 of more's {b:.0f}, at a lower TPOT: 20.0 ms against 30.0)" in why, why
    # beyond the band, capacity decides whatever the TPOT
    i, _ = choose(
        [pred("more", 380.0, 30.0), pred("faster", 380.0 - CAPACITY_TIE - 1, 20.0)], "throughput", 1000, 100
    )
    assert i == 0
    # equal TPOT: the higher capacity
    i, _ = choose([pred("less", 365.0, 20.0), pred("more", 369.0, 20.0)], "throughput", 1000, 100)
    assert i == 1


def test_where_no_layout_meets_the_targets_the_closest_to_them_wins_as_for_the_batching() -> None:
    """None within TTFT <= 1000 ms and TPOT <= 100 ms at any load: the layout closest to them at the workload
    wins (the farther of its two figures from its target the least, the batching's own fallback), not
    the lowest TPOT, which a few wide instances reach by making the workload's other requests wait."""
    from hwprofile.plan.predict import Prediction, choose

    def pred(label: str, ttft: float, tpot: float) -> Prediction:
        return Prediction(label, 1, 1, ttft, tpot, 100.0, 16, "datasheet", capacity_output_tokens_per_s=0.0)

    wide, many = pred("1 x TP4", 9000.0, 110.0), pred("4 x TP1", 1500.0, 140.0)
    i, why = choose([wide, many], "throughput", 1000, 100)
    assert i == 1, why  # 1.5x the TTFT target against 9x
    assert "4 x TP1 comes closest at the workload (TTFT 1500 ms, TPOT 140.0 ms: 1.5x the farther" in why
    # equally far: the lower TPOT
    i, _ = choose([pred("a", 1500.0, 140.0), pred("b", 1400.0, 150.0)], "throughput", 1000, 100)
    assert i == 0
    # a candidate that does not fit never wins, however close
    fits_not = pred("2 x TP2", 900.0, 90.0)
    fits_not.fits = False
    assert choose([wide, fits_not], "throughput", 1000, 100)[0] == 0


def test_where_no_batching_meets_the_targets_the_closest_to_them_wins_not_the_shortest_request() -> None:
    """RTX 3060 12 GB, Qwen3-8B-AWQ, 16 clients: the profile's 4 sequences keep a request's time (the GPU
    is the limit either way: 23.5 s against 22.9 s at 16, within the margin) by making 12 clients wait 18 s
    for their first token; 16 sequences miss only the TTFT target, by half. Closest to the targets wins,
    by the margin, said with both rows' figures; a row within the margin of the configured one's miss
    leaves it."""
    from hwprofile.plan.batching import choose_batching

    planned = _row(4, 18349.7, 20.17, 0, planned=True)
    i, why = choose_batching(
        [planned, _row(8, 12271.2, 42.29, 0), _row(16, 772.9, 86.84, 0)], "throughput", 500, 120, 256
    )
    assert i == 2, why
    assert (
        "closest to the targets at the workload (TTFT 773 ms, TPOT 86.8 ms: 1.5x the farther target)" in why
    )
    assert "configured max_num_seqs 4" in why and "TTFT 18350 ms" in why
    # the shortest request alone (what the fallback was) would have kept the configured row
    assert (18349.7 + 255 * 20.17) < (772.9 + 255 * 86.84) / (1 - 0.10)
    # closer, but not by the margin: the configured row stays
    i, why = choose_batching(
        [_row(4, 800, 20, 0, planned=True), _row(8, 760, 40, 0)], "throughput", 500, 120, 256
    )
    assert i == -1 and "less than 10% better" in why


def test_the_closest_batching_is_one_whose_sequences_the_kv_cache_holds() -> None:
    """Where no batching meets the targets, more sequences always shorten the wait that lands in TTFT; a
    row whose ``max_num_seqs`` the KV cache cannot hold at the workload's request length (its figures
    assume every sequence running, where vLLM preempts) comes after every row it can hold, said so."""
    from hwprofile.plan.batching import choose_batching

    def row(seqs: int, ttft: float, tpot: float, planned: bool = False) -> dict:
        return {**_row(seqs, ttft, tpot, 0, planned=planned), "kv_tokens": 20_000}

    rows = [row(4, 88_000, 20, planned=True), row(8, 60_000, 42), row(64, 55_000, 142)]
    i, why = choose_batching(rows, "throughput", 500, 120, 256, 768)  # 64 x 768 > 20,000: 26 held
    assert i == 1 and "the KV cache holds at 768 tokens a request" in why, why
    assert choose_batching(rows, "throughput", 500, 120, 256)[0] == 2  # no request length: not judged
    # every row beyond the cache: the closest of them all
    i, _ = choose_batching(
        [row(4, 88_000, 20, planned=True), row(64, 55_000, 142)], "throughput", 500, 120, 256, 8000
    )
    assert i == 1
    # a row that says how many requests vLLM's pool holds (a sliding-window model's pool holds more
    # than every layer's count) is judged by that: 64 held, none preempted
    pooled = [
        row(4, 88_000, 20, planned=True),
        row(8, 60_000, 42),
        {**row(64, 55_000, 142), "kv_requests": 64},
    ]
    assert choose_batching(pooled, "throughput", 500, 120, 256, 768)[0] == 2
