"""Calibration from a bench (issue 32), fast: the fitted device reproduces the measured point, a CPU
plan predicts nothing before a calibration and "calibrated" figures after, and `bench --calibrate`
stores only a usable measurement. The loop on real vLLM: tests/test_calibrate_vllm.py (slow)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from hwprofile.config import ConfigError
from hwprofile.host.snapshot import Cpu, HostSnapshot, Software
from hwprofile.model import resolve_model
from hwprofile.pipeline import calibration_path, make_plan
from hwprofile.plan import candidates
from hwprofile.plan import predict as pm
from hwprofile.plan.calibration import calibrated_device
from hwprofile.plan.types import ABSENT

CONFIG = {
    "architectures": ["Qwen2ForCausalLM"],
    "model_type": "qwen2",
    "hidden_size": 256,
    "intermediate_size": 512,
    "num_hidden_layers": 4,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "vocab_size": 4096,
    "max_position_embeddings": 2048,
    "torch_dtype": "bfloat16",
    "tie_word_embeddings": True,
}
SETS = [
    "engine.max_model_len=512",
    "cpu.kv_cache_space_gib=0.0625",
    "speculative.method=none",
    "layout.workload_input_len=96",
    "layout.workload_output_len=48",
]


def _doc(
    points: list[tuple[int, float, float, float]],
    batched: int | None = 256,
    engine: dict[int, list[tuple[object, ...]]] | None = None,
) -> dict[str, Any]:
    """A bench document of ``points`` (concurrency, TPOT, TTFT, tok/s); ``engine``: per concurrency, each
    repeat's server figures (queue ms, prefill ms) as its /metrics gave them, and the client's mean TTFT,
    then, where given, the API server's CPU (ms), the output tokens and the requests over the point."""

    def spread(v: float) -> dict[str, Any]:
        return {"values": [v], "median": v, "min": v, "max": v, "relative_spread": 0.0}

    return {
        "schema": "hwprofile.bench/1",
        "created": "2026-12-04T22:00:00Z",
        "workload": {"input_len": 96, "output_len": 48},
        "host": {"gpus": []},
        "plans": [
            {
                "instances": 1,
                "max_num_seqs": 64,
                "max_num_batched_tokens": batched,
                "non_default_settings": [],
                "summary": [
                    {
                        "concurrency": c,
                        "rounds": 1,
                        "metrics": {
                            "p50_tpot_ms": spread(t),
                            "p50_ttft_ms": spread(f),
                            "output_throughput": spread(x),
                        },
                    }
                    for c, t, f, x in points
                ],
                "runs": [
                    {
                        "round": r,
                        "points": [
                            {
                                "concurrency": c,
                                "latency_ms": {"ttft": {"mean": mean}},
                                "server_metrics": {
                                    "queue_ms": reps[r][0],
                                    "prefill_ms": reps[r][1],
                                    # the API server's CPU, the output tokens and the requests, where given
                                    **dict(
                                        zip(
                                            ("api_cpu_ms", "output_tokens", "requests", "steps"),
                                            reps[r][3:],
                                            strict=False,
                                        )
                                    ),
                                },
                            }
                            for c, reps in (engine or {}).items()
                            if r < len(reps)
                            for mean in [reps[r][2]]
                        ],
                    }
                    for r in range(max((len(v) for v in (engine or {}).values()), default=0))
                ],
            }
        ],
    }


def _model_host_root(tmp_path: Path) -> tuple[Path, HostSnapshot, Path]:
    """A model directory of :data:`CONFIG`, the CPU host and an empty config root under ``tmp_path``."""
    d = tmp_path / "m"
    d.mkdir()
    (d / "config.json").write_text(json.dumps(CONFIG))
    root = tmp_path / "etc"
    root.mkdir()
    return d, _cpu_host(), root


def _cpu_host() -> HostSnapshot:
    return HostSnapshot(
        hostname="cpu-box",
        cpu=Cpu("a CPU", 2, 1, ("avx2",)),
        memory_bytes=8 << 30,
        software=Software(vllm_version="0.32.0+cpu"),
    )


@pytest.mark.parametrize(("tpot", "ttft"), [(20.0, 60.0), (8.0, 300.0), (50.0, 200.0)])
def test_the_fitted_device_reproduces_the_benched_point(tpot: float, ttft: float) -> None:
    m = candidates.model_shape(resolve_model("Qwen/Qwen3-0.6B", "model"), 2)
    cand = pm.Candidate(1, 1, 1, 64, 256, True, 100_000, pm.link_of([], [], None, 1))
    cal = pm.Calibration("c.json", None, 96, 48, 1, None, ((1, tpot, ttft, 1000 / tpot),))
    dev = calibrated_device(m, cand, cal, "cpu")
    assert dev is not None and dev.efficiency_basis == "calibrated" and dev.step_fixed_ms is not None
    p = pm.predict(dev, m, cand, pm.Workload(96, 48, 1), None)
    assert p.tpot_ms == pytest.approx(tpot, rel=0.02) and p.ttft_ms == pytest.approx(ttft, rel=0.02)
    # more requests in flight: longer steps, never shorter
    assert pm.predict(dev, m, cand, pm.Workload(96, 48, 8), None).tpot_ms >= p.tpot_ms


def test_a_cpu_plan_predicts_nothing_until_calibrated_then_calibrated(tmp_path: Path) -> None:
    d, host, root = _model_host_root(tmp_path)
    sets = [*SETS, "layout.workload_concurrency=4"]
    before = make_plan(host, root, environ={}, model=str(d), sets=sets).to_json()
    assert before["instances"][0]["device"] == "cpu" and before["instances"][0].get("prediction") is None
    path = Path(calibration_path(root, host))
    path.parent.mkdir()
    path.write_text(json.dumps(_doc([(1, 20.0, 60.0, 45.0)])))
    after = make_plan(host, root, environ={}, model=str(d), sets=sets).to_json()
    p = after["instances"][0]["prediction"]
    assert p["source"] == f"calibrated: {path}" and p["workload"]["concurrency"] == 4
    fixed = next(t for t in p["terms"] if t["term"].startswith("decode step: fixed"))
    assert fixed["basis"] == "calibrated" and "concurrency 1: TPOT 20 ms, TTFT 60 ms" in fixed["source"]
    assert p["tpot_ms"] >= 20.0 and p["simulated"]["tpot_ms"]["value"] > 0
    # at the benched point: the measurement back
    at1 = make_plan(
        host, root, environ={}, model=str(d), sets=[*SETS, "layout.workload_concurrency=1"]
    ).to_json()
    q = at1["instances"][0]["prediction"]
    assert q["tpot_ms"] == pytest.approx(20.0, rel=0.02) and q["ttft_ms"] == pytest.approx(60.0, rel=0.02)
    # the simulation of that bench does not add the GPU hosts' fitted latency per request (30 ms) to a
    # TTFT that measured this host's own: one request at a time, it gives the measurement back too
    sim_ttft = q["simulated"]["ttft_ms"]
    assert "no latency per request added" in sim_ttft["source"] and "+ 30 ms" not in sim_ttft["source"]
    assert sim_ttft["value"] == pytest.approx(60.0, rel=0.25)


def test_the_latency_outside_the_engine_is_kept_apart_from_the_prompts_cost(tmp_path: Path) -> None:
    """With the server's own figures, the TTFT measured by the client splits into the engine's part (the
    prompt's steps: what the fit charges to its tokens) and the rest (client, HTTP, API server), added
    once per request: the benched point comes back, and a prompt that shares its step with other
    requests' decodes no longer charges them that latency."""
    d = tmp_path / "m"
    d.mkdir()
    (d / "config.json").write_text(json.dumps(CONFIG))
    host = _cpu_host()
    plans = {}
    # the client's mean TTFT less the engine's queue and prefill means: 39, 40.5 and 39 ms outside
    split_engine = {1: [(0.0, 22.0, 61.0), (0.5, 20.0, 61.0), (0.0, 21.0, 60.0)]}
    for name, engine in (("whole", None), ("split", split_engine)):
        root = tmp_path / name
        path = Path(calibration_path(root, host))
        path.parent.mkdir(parents=True)
        path.write_text(json.dumps(_doc([(1, 20.0, 60.0, 45.0)], engine=engine)))
        plans[name] = {
            c: make_plan(
                host, root, environ={}, model=str(d), sets=[*SETS, f"layout.workload_concurrency={c}"]
            ).to_json()["instances"][0]["prediction"]
            for c in (1, 4)
        }
    split, whole = plans["split"], plans["whole"]
    # the benched point back, the simulation too; the latency said where it comes from
    assert split[1]["ttft_ms"] == pytest.approx(60.0, rel=0.02) and split[1]["tpot_ms"] == pytest.approx(
        20.0, rel=0.02
    )
    assert split[1]["simulated"]["ttft_ms"]["value"] == pytest.approx(60.0, rel=0.05)
    # what was measured outside the engine holds the first token's delivery, which the simulation adds;
    # two CPUs: it is work on the CPU the API server shares with EngineCore
    first = split[1]["simulated"]["server_costs"]["api_token_us"] / 1e3
    assert (
        f"{39 - first:g} ms per request of the shared CPU's work (calibrated: measured on this host"
        in split[1]["simulated"]["ttft_ms"]["source"]
    )
    latency = next(t for t in split[1]["terms"] if t["term"].startswith("the request's latency outside"))
    assert latency["ms"] == pytest.approx(39.0) and "39 ms of it outside the engine" in latency["source"]
    # four requests: each one's prompt step is cheaper than the whole TTFT fitted as FLOPs made it
    assert split[4]["tpot_ms"] < whole[4]["tpot_ms"]
    assert split[4]["simulated"]["tpot_ms"]["value"] < whole[4]["simulated"]["tpot_ms"]["value"]


@pytest.mark.parametrize(
    ("engine", "want"),
    [
        ({1: [(0.1, 3.0, 10.0), (None, 3.0, 10.0), (0.0, 4.0, 10.0)]}, ((1, 6.45),)),  # a gap adds nothing
        ({1: [(0.0, 12.0, 10.0)]}, ()),  # the engine's part not below the client's: no latency measured
        ({1: [("3", 3.0, 10.0)]}, "server_metrics.queue_ms"),
        ({1: [(0.0, -1.0, 10.0)]}, "server_metrics.prefill_ms"),
        ({1: [(0.0, float("nan"), 10.0)]}, "server_metrics.prefill_ms"),
        ({1: [(0.0, True, 10.0)]}, "server_metrics.prefill_ms"),
        ({1: [(0.0, 3.0, "10")]}, "latency_ms.ttft.mean"),
    ],
)
def test_the_latency_outside_the_engine_is_read_as_a_measurement(
    tmp_path: Path, engine: dict[int, list[tuple[object, object, object]]], want: object
) -> None:
    from hwprofile.pipeline import calibration_from_bench

    doc = _doc([(1, 20.0, 60.0, 45.0)], engine=engine)
    if isinstance(want, str):
        with pytest.raises(ConfigError, match=rf"c\.json.*runs\[0\]\.points\[0\]\.{want}"):
            calibration_from_bench(doc, "c.json", _cpu_host())
    else:
        got = calibration_from_bench(doc, "c.json", _cpu_host()).outside_latency
        assert [c for c, _ in got] == [c for c, _ in want] and [v for _, v in got] == pytest.approx(
            [v for _, v in want]
        )


@pytest.mark.parametrize(
    ("reps", "want"),
    [
        # the API server's CPU, the output tokens and the steps per request: medians over the repeats
        (
            [(1500.0, 4800, 100, 4800), (1600.0, 4800, 100, 4800), (1450.0, 2400, 100, 2400)],
            ((1, 15.0, 48.0, 48.0),),
        ),
        ([(1500.0, 4800, 100, 4800), (None, 4800, 100, 4800)], ((1, 15.0, 48.0, 48.0),)),  # nothing
        ([(1500.0, None, 100, 4800)], ()),
        ([(1500.0, 4800, 100, None)], ()),
        ([(1500.0, 4800, 0, 0)], ()),  # no request counted: no figure per request
        ([(1500.0, 4800, None, 4800)], ()),
        # the median repeat by its CPU per request, its three figures together
        (
            [(1400.0, 4800, 100, 4800), (1600.0, 2400, 100, 2400), (1500.0, 3600, 100, 3000)],
            ((1, 15.0, 36.0, 30.0),),
        ),
        ([(1500.0, 4800, 100.0, 4800)], "server_metrics.requests"),  # a count is whole
        ([(1500.0, 4800, 100, 48.5)], "server_metrics.steps"),
        ([(-1.0, 4800, 100, 4800)], "server_metrics.api_cpu_ms"),
        ([(float("inf"), 4800, 100, 4800)], "server_metrics.api_cpu_ms"),
        ([("9", 4800, 100, 4800)], "server_metrics.api_cpu_ms"),
        ([(1500.0, -4, 100, 4800)], "server_metrics.output_tokens"),
        ([(1500.0, 4800, 100, -1)], "server_metrics.steps"),
    ],
)
def test_the_api_servers_cpu_is_read_as_a_measurement(reps: list[tuple[object, ...]], want: object) -> None:
    from hwprofile.pipeline import calibration_from_bench

    engine: dict[int, list[tuple[object, ...]]] = {1: []}
    for cpu, tokens, n, steps in reps:
        engine[1].append((0.0, 20.0, 61.0, cpu, tokens, n, steps))
    doc = _doc([(1, 20.0, 60.0, 45.0)], engine=engine)
    if isinstance(want, str):
        with pytest.raises(ConfigError, match=rf"c\.json.*runs\[\d\]\.points\[0\]\.{want}"):
            calibration_from_bench(doc, "c.json", _cpu_host())
    else:
        assert calibration_from_bench(doc, "c.json", _cpu_host()).api_cpu == want


def test_a_merged_stream_measures_no_latency_outside_the_engine() -> None:
    """A repeat whose streamed tokens reached the client merged (its median TPOT near 0, the server's
    2.6 ms) has a client TTFT of the whole request: it adds nothing to the latency outside the engine
    (two clean repeats: 15 and 16 ms; with the merged one the median would be 16, its own 128)."""
    from hwprofile.pipeline import _bench_outside_latency

    def point(ttft: float, tpot: float) -> dict[str, Any]:
        return {
            "concurrency": 1,
            "latency_ms": {"ttft": {"mean": ttft}, "tpot": {"p50": tpot}},
            "server_metrics": {"queue_ms": 0.0, "prefill_ms": 5.0, "tpot_ms": 2.6},
        }

    runs = [{"points": [point(20.0, 2.6)]}, {"points": [point(133.0, 0.003)]}, {"points": [point(21.0, 2.5)]}]
    assert _bench_outside_latency(runs, "b.json", {1}) == ((1, 15.5),)
    assert _bench_outside_latency(runs[1:2], "b.json", {1}) == ()  # merged alone: unknown, not 128


def test_a_calibrated_host_streams_at_the_api_cpu_its_bench_measured(tmp_path: Path) -> None:
    """The API server's CPU per engine step is this host's, where its bench read it: what a request cost
    less the request's own and its tokens' (fitted) work, over its later steps. It delays the tokens
    and, while it keeps the API server busy, the next requests' admissions; none of it is added to the
    benched point itself (its first token's delivery is in what was measured there)."""
    from hwprofile.plan.servercost import API_REQUEST_S, API_TOKEN_S

    d = tmp_path / "m"
    d.mkdir()
    (d / "config.json").write_text(json.dumps(CONFIG))
    host = _cpu_host()
    got: dict[str, dict[int, dict[str, Any]]] = {}
    for name, cpu in (("fitted", ()), ("measured", (1500.0, 4800, 100, 4800))):
        root = tmp_path / name
        path = Path(calibration_path(root, host))
        path.parent.mkdir(parents=True)
        engine = {1: [(0.0, 4.0, 10.0, *cpu)]}  # 6 ms outside the engine, 15 ms of CPU per request
        path.write_text(json.dumps(_doc([(1, 2.0, 10.0, 480.0)], engine=engine)))
        got[name] = {
            c: make_plan(
                host, root, environ={}, model=str(d), sets=[*SETS, f"layout.workload_concurrency={c}"]
            ).to_json()["instances"][0]["prediction"]["simulated"]
            for c in (1, 4)
        }
    fitted, measured = got["fitted"], got["measured"]
    # what the simulation charges a request (to admit it, then each step and token) gives 15 ms back
    want_us = (15.0 - API_REQUEST_S["completion"] * 1e3 - 48 * API_TOKEN_S * 1e3) / 48 * 1e3
    assert fitted[1]["server_costs"]["api_step_us"] == 0.0
    costs = measured[1]["server_costs"]
    assert costs["api_step_us"] == pytest.approx(want_us, abs=0.1)
    assert costs["api_token_us"] == pytest.approx(API_TOKEN_S * 1e6)
    assert f"per engine step {want_us:.3g} us, measured on this host" in costs["source"]
    assert "15 ms per request of 48 output tokens in 48 steps" in costs["source"]
    assert "less the first token's delivery" in measured[1]["ttft_ms"]["source"]
    # two CPUs: vLLM's OpenMP threads leave one to the API server and EngineCore, where the latency
    # measured outside the engine is that CPU's work, queued behind the outputs' at more clients
    assert costs["frontend_shared"] is True
    assert "all of it CPU work on the CPU the API server shares" in measured[4]["ttft_ms"]["source"]
    # the benched point comes back either way; four clients wait no less behind the steps' work
    for sim in (fitted[1], measured[1]):
        assert sim["ttft_ms"]["value"] == pytest.approx(10.0, rel=0.05)
    assert measured[4]["ttft_ms"]["value"] >= fitted[4]["ttft_ms"]["value"]
    # the API server busy as measured: 15 ms of a request's ~104 ms at one client (the prompt's step and
    # 47 of 2 ms), against 4.4 ms with the fitted costs alone; and once a step, whatever the clients: four
    # add what one adds, the step's cost over its time (per token they would add four times as much)
    assert measured[1]["api_busy_fraction"] == pytest.approx(15.0 / 104.0, rel=0.1)
    for c in (1, 4):
        added = measured[c]["api_busy_fraction"] - fitted[c]["api_busy_fraction"]
        assert added == pytest.approx(want_us / 1e3 / measured[c]["tpot_ms"]["value"], rel=0.2), c


# the API server's CPU per request (ms) at 1, 2 and 4 clients of 96 in / 48 out, with its steps per
# request, measured through `hwprofile bench` on two of this project's CPU VMs (vLLM 0.32): on the
# second, a request costs more besides its steps, which one client alone cannot tell
API_CPU_VMS = {
    "first": ((1, 18.3, 48.0, 48.0), (2, 12.5, 48.0, 24.7), (4, 7.8, 48.0, 12.4)),
    "second": ((1, 26.25, 48.0, 48.0), (2, 19.06, 48.0, 24.6), (4, 13.13, 48.0, 12.2)),
}


@pytest.mark.parametrize("vm", sorted(API_CPU_VMS))
def test_the_api_servers_costs_per_request_and_step_fitted_where_the_steps_differ(vm: str) -> None:
    """One client's bench moves a request's tokens and steps together (one token a step): the step
    takes what the request's and its tokens' fitted costs leave. Benched at one and four clients, the
    steps per request differ fourfold: a cost per step and one per request as it ends are both this
    host's (the tokens keep theirs: every request has the workload's length). Two clients' CPU comes
    back within 10 % on both VMs, where the one-client figure misses the second VM's by a fifth."""
    from hwprofile.plan.servercost import API_REQUEST_S, API_TOKEN_S

    one, two, four = API_CPU_VMS[vm]
    req = API_REQUEST_S["completion"]

    def cal(*api: tuple[int, float, float, float]) -> pm.Calibration:
        return pm.Calibration("c.json", None, 96, 48, 1, None, ((1, 2.0, 10.0, 400.0),), api_cpu=api)

    def charged(finish: float, s: float, point: tuple[int, float, float, float]) -> float:
        # as plan/simulate.py's API server charges a request: to admit it, each token and step, its end
        return (req + finish + point[2] * API_TOKEN_S + point[3] * s) * 1e3

    got = candidates.measured_api_costs(cal(one), req, API_TOKEN_S)
    assert got is not None
    f1, s1, why1 = got
    assert f1 == 0.0 and charged(f1, s1, one) == pytest.approx(one[1])
    assert "at concurrency 1" in why1
    got = candidates.measured_api_costs(cal(one, four), req, API_TOKEN_S)
    assert got is not None
    f, s, why = got
    assert f >= 0.0 and s > 0.0
    # the first VM's line would cross below the request's own cost: none at its end, through the origin
    assert (f == 0.0) == (vm == "first")
    for point in (one, four):
        assert charged(f, s, point) == pytest.approx(point[1], rel=0.05)
    assert charged(f, s, two) == pytest.approx(two[1], rel=0.10)
    assert "fitted on this host" in why and f"4: {four[1]:.3g} ms in {four[3]:.3g} steps" in why
    if vm == "second":  # the one-client figure: 18 % low at two clients (this VM's own bench: 24 %)
        assert charged(f1, s1, two) < 0.85 * two[1]
    # steps that do not differ (one client twice), or no positive cost per step: the one-client figure
    assert candidates.measured_api_costs(cal(one, one), req, API_TOKEN_S) == (f1, s1, why1)
    upside_down = (4, 30.0, 48.0, 12.2)  # more CPU in fewer steps
    assert candidates.measured_api_costs(cal(one, upside_down), req, API_TOKEN_S) == (f1, s1, why1)
    assert candidates.measured_api_costs(cal(), req, API_TOKEN_S) is None


def test_a_host_benched_at_two_concurrencies_streams_at_its_cost_per_request_and_step(tmp_path: Path) -> None:
    """Benched at one and four clients (the second VM's figures: 26.25 ms a request in 48 steps, 13.13
    ms in 12.2), the plan's simulation charges this host's cost per step and the rest per request as it
    ends: four clients keep the API server busier than the one-client figure says (that figure puts
    four clients' requests at 10 ms, the measurement at 13)."""
    from hwprofile.plan.servercost import API_REQUEST_S, API_TOKEN_S

    d = tmp_path / "m"
    d.mkdir()
    (d / "config.json").write_text(json.dumps(CONFIG))
    host = _cpu_host()
    got: dict[str, dict[str, Any]] = {}
    one = [(0.0, 4.0, 10.0, 2625.0, 4800, 100, 4800)]
    four = [(0.0, 4.0, 12.0, 1313.0, 4800, 100, 1220)]
    for name, engine, points in (
        ("one", {1: one}, [(1, 2.0, 10.0, 480.0)]),
        ("two", {1: one, 4: four}, [(1, 2.0, 10.0, 480.0), (4, 2.5, 12.0, 1500.0)]),
    ):
        root = tmp_path / name
        path = Path(calibration_path(root, host))
        path.parent.mkdir(parents=True)
        path.write_text(json.dumps(_doc(points, engine=engine)))
        plan = make_plan(host, root, environ={}, model=str(d), sets=[*SETS, "layout.workload_concurrency=4"])
        got[name] = plan.to_json()["instances"][0]["prediction"]["simulated"]
    costs = got["two"]["server_costs"]
    base = 1e3 * (API_REQUEST_S["completion"] + 48 * API_TOKEN_S)  # ms: the admission and the tokens
    y1, y4 = 26.25 - base, 13.13 - base  # what is left of each request, over 48 and 12.2 steps
    slope = (y1 - y4) / (48 - 12.2)
    assert costs["api_step_us"] == pytest.approx(slope * 1e3, rel=0.01)
    assert costs["api_finish_ms"] == pytest.approx(y1 - 48 * slope, rel=0.01)
    assert costs["api_token_us"] == pytest.approx(API_TOKEN_S * 1e6)
    assert "per request as it ends, fitted on this host" in costs["source"]
    assert got["one"]["server_costs"]["api_finish_ms"] == 0.0
    assert got["two"]["api_busy_fraction"] > 1.15 * got["one"]["api_busy_fraction"]


def test_an_engine_part_the_steps_cannot_reach_leaves_the_rest_as_latency() -> None:
    """The engine's part of a TTFT below the TPOT (a prompt's step costs at least a step's fixed time):
    the fit stops at what the steps can reach and the latency is the rest, so the benched point still
    comes back."""
    m = candidates.model_shape(resolve_model("Qwen/Qwen3-0.6B", "model"), 2)
    cand = pm.Candidate(1, 1, 1, 64, 256, True, 100_000, pm.link_of([], [], None, 1))
    cal = pm.Calibration(
        "c.json", None, 96, 48, 1, None, ((1, 20.0, 60.0, 45.0),), outside_latency=((1, 55.0),)
    )
    dev = calibrated_device(m, cand, cal, "cpu")
    assert dev is not None
    p = pm.predict(dev, m, cand, pm.Workload(96, 48, 1), None)
    assert p.tpot_ms == pytest.approx(20.0, rel=0.02) and p.ttft_ms == pytest.approx(60.0, rel=0.02)
    assert 35.0 < dev.request_latency_ms < 40.0  # 60 less a prompt step of at least the 20 ms fixed time


def test_the_cpu_backend_never_schedules_asynchronously() -> None:
    from hwprofile.plan.servercost import server_costs

    # vLLM 0.32 schedules asynchronously by default on GPUs; vllm/platforms/cpu.py turns it off
    assert server_costs("0.32.0").async_scheduling is True
    cpu = server_costs("0.32.0+cpu", "a CPU", cpu_backend=True)
    assert cpu.async_scheduling is False and "CPU backend never schedules asynchronously" in cpu.source


def test_the_api_server_on_enginecores_cpu_costs_each_scheduled_sequence() -> None:
    """With fewer CPUs outside the OpenMP threads than the API server and the EngineCores need, the API
    server's work per streamed token is serial with the step; enough CPUs of their own, or a GPU host,
    keep it off the step."""
    from hwprofile.plan.servercost import API_TOKEN_S, STEP_SEQ_S, server_costs

    shared = server_costs("0.32.0+cpu", "a CPU", cpu_backend=True, frontend=1)
    assert shared.step_seq_s == pytest.approx(STEP_SEQ_S + API_TOKEN_S)
    assert "leave 1 CPU(s) to the API server and 1 EngineCore(s)" in shared.source
    assert f"({(STEP_SEQ_S + API_TOKEN_S) * 1e6:g} us in all)" in shared.source
    assert "an unknown number of CPUs" in server_costs("0.32.0+cpu", cpu_backend=True).source
    own = server_costs("0.32.0+cpu", "a CPU", cpu_backend=True, frontend=2)
    assert own.step_seq_s == STEP_SEQ_S and "leave" not in own.source
    dp = server_costs("0.32.0+cpu", "a CPU", cpu_backend=True, frontend=2, engines=2)
    assert dp.step_seq_s > STEP_SEQ_S  # two EngineCores and the API server on two CPUs
    assert server_costs("0.32.0", "a CPU", frontend=1).step_seq_s == STEP_SEQ_S  # a GPU host


@pytest.mark.parametrize(
    ("nodes", "cpus", "bind", "tp", "dp", "left"),
    [
        (["0-1"], None, ABSENT, 1, 1, 1),  # auto: one core kept back for the rank
        (["0-7"], None, ABSENT, 2, 1, 2),
        (["0-7", "8-15"], None, ABSENT, 1, 1, 9),  # the other node's CPUs are free
        (["0-7", "8-15"], "0-7", ABSENT, 1, 1, 1),  # bound to node 0
        (["0-7"], None, "0-5", 1, 1, 2),
        (["0-7"], None, "0-3|0-3", 1, 2, 4),  # one list for two ranks: the CPUs, not the count
        (["0-7"], None, "0,0,1,1,2,3", 1, 1, 4),  # duplicates, as vLLM's parse_id_list drops them
        (["0-7"], "0-7", "8-15", 1, 1, 8),  # a list outside the instance's CPUs takes none of them
        (["0-7"], None, "nobind", 1, 1, 0),  # the threads on every CPU
        (["0-7"], None, "8-3", 1, 1, None),  # a list vLLM would refuse: unknown
        ([], None, ABSENT, 1, 1, None),  # no CPUs read
    ],
)
def test_the_cpus_the_openmp_threads_leave(nodes, cpus, bind, tp, dp, left) -> None:
    from hwprofile.host.snapshot import NumaNode
    from hwprofile.plan.servercost import frontend_cpus

    host = _cpu_host()._replace(numa_nodes=tuple(NumaNode(i, c) for i, c in enumerate(nodes)))
    host = host._replace(cpu=host.cpu._replace(logical_cpus=None))
    inst = SimpleNamespace(
        cpus=cpus,
        omp_threads_bind=bind,
        tensor_parallel_size=tp,
        pipeline_parallel_size=1,
        ranks=dp,
    )
    assert frontend_cpus(inst, host) == left  # type: ignore[arg-type]


def test_a_calibrated_cpu_plan_charges_the_api_server_only_where_it_shares(tmp_path: Path) -> None:
    """The wiring: on an 8-CPU host, OpenMP lists leaving two CPUs give the API server its own; vLLM's
    ``auto`` (one kept back) does not, and each scheduled sequence costs the step its work too. Either
    way the simulation gives the benched TPOT back at the benched concurrency (nothing counted twice)."""
    from hwprofile.plan.servercost import API_REQUEST_S, API_TOKEN_S, STEP_SEQ_S

    d = tmp_path / "m"
    d.mkdir()
    (d / "config.json").write_text(json.dumps(CONFIG))
    host = _cpu_host()._replace(cpu=Cpu("a CPU", 8, 1, ("avx2",)))
    root = tmp_path / "etc"
    root.mkdir()
    path = Path(calibration_path(root, host))
    path.parent.mkdir()
    path.write_text(json.dumps(_doc([(1, 20.0, 60.0, 45.0)])))
    got = {}
    for bind in ("auto", "0-5"):
        sets = [*SETS, "layout.workload_concurrency=1", f"cpu.omp_threads_bind={bind}"]
        sim = make_plan(host, root, environ={}, model=str(d), sets=sets).to_json()["instances"][0]
        sim = sim["prediction"]["simulated"]
        got[bind] = sim["server_costs"]["step_seq_us"]
        assert sim["tpot_ms"]["value"] == pytest.approx(20.0, rel=0.02)
        # the API server's CPU per request is the latency measured outside the engine, and says so
        request_ms = sim["server_costs"]["api_request_ms"]
        assert request_ms < API_REQUEST_S["completion"] * 1e3
        assert f"taken as the {request_ms:.3g} ms" in sim["server_costs"]["source"]
    assert got["auto"] == pytest.approx((STEP_SEQ_S + API_TOKEN_S) * 1e6)
    assert got["0-5"] == pytest.approx(STEP_SEQ_S * 1e6)


def test_a_request_alone_finds_no_step_in_flight() -> None:
    """One request at a time (a closed loop of one): its TTFT is its prompt's steps, with no half step
    of another request's decode before it; two: half a step on average."""
    m = candidates.model_shape(resolve_model("Qwen/Qwen3-0.6B", "model"), 2)
    cand = pm.Candidate(1, 1, 1, 64, 4096, True, 100_000, pm.link_of([], [], None, 1))
    gpu = pm.Gpu("test", 1000.0, 100.0, 24 << 30, "test row")
    one = pm.predict(gpu, m, cand, pm.Workload(96, 48, 1), None)
    prefill = next(t for t in one.terms if t["term"].startswith("prefill"))
    # and the request's latency outside the steps: a datasheet device's is the fitted 30 ms
    outside = next(t for t in one.terms if t["term"].startswith("the request's latency outside"))
    assert outside["ms"] == 30.0 and outside["basis"] == "fitted"
    assert one.ttft_ms == pytest.approx(prefill["ms"] + outside["ms"], rel=1e-3)
    two = pm.predict(gpu, m, cand, pm.Workload(96, 48, 2), None)
    assert two.ttft_ms > next(t for t in two.terms if t["term"].startswith("prefill"))["ms"]


def test_bench_calibrate_stores_only_a_usable_measurement(tmp_path: Path) -> None:
    from hwprofile.cli.bench import store_calibration

    host = _cpu_host()
    path = store_calibration(_doc([(1, 20.0, 60.0, 45.0)]), tmp_path, host)
    assert (
        path == calibration_path(tmp_path, host)
        and json.loads(Path(path).read_text())["schema"] == "hwprofile.bench/1"
    )
    with pytest.raises(ConfigError, match="no concurrency with"):
        store_calibration(_doc([]), tmp_path / "other", host)
    assert not (tmp_path / "other").exists()


def test_a_cpu_calibration_holds_for_the_model_it_measured_not_another(tmp_path: Path) -> None:
    """A bench of one model fits this CPU to that model's steps: another model planned on the host is
    predicted nothing (as before any calibration), with the file, why and how to calibrate for it; the
    same model's facts under another path take it, and so does the model a bench names by path only."""
    host, root = _cpu_host(), tmp_path / "etc"
    root.mkdir()
    dirs = {}
    for name, layers in (("a", 4), ("a-copy", 4), ("b", 8)):
        d = dirs[name] = tmp_path / name
        d.mkdir()
        (d / "config.json").write_text(json.dumps({**CONFIG, "num_hidden_layers": layers}))
    measured = make_plan(host, root, environ={}, model=str(dirs["a"]), sets=SETS).model
    doc = _doc([(1, 20.0, 60.0, 45.0)])
    doc["plans"][0] |= {"model": measured.path, "model_facts": measured.cost_facts()}
    path = Path(calibration_path(root, host))
    path.parent.mkdir()
    path.write_text(json.dumps(doc))

    def planned(name: str) -> dict[str, Any]:
        return make_plan(host, root, environ={}, model=str(dirs[name]), sets=SETS).to_json()

    for name in ("a", "a-copy"):
        got = planned(name)
        assert got["instances"][0]["prediction"]["source"] == f"calibrated: {path}", name
        assert got["prediction"]["calibration"]["not_applied"] is None
    other = planned("b")
    assert other["instances"][0].get("prediction") is None
    why = other["prediction"]["calibration"]["not_applied"]
    params = other["model"]["params"]
    assert (
        why
        == f"{path}: it measured {measured.path} (params {measured.params} there, {params} here; layers 4 there, 8 here)"
    )
    assert any(f"--model {dirs['b']} --calibrate" in w for w in other["warnings"])
    # a bench that names its model only (no facts): that model by path, no other
    doc["plans"][0].pop("model_facts")
    path.write_text(json.dumps(doc))
    assert planned("a")["instances"][0]["prediction"]["source"] == f"calibrated: {path}"
    assert planned("b")["instances"][0].get("prediction") is None


@pytest.mark.parametrize(
    ("facts", "want"),
    [
        ({"layers": 4}, "expected an object of architecture"),
        ("big", "expected an object of architecture"),
        ("ints", "model_facts.layers: expected a whole number"),
    ],
)
def test_the_model_a_bench_measured_is_read_as_facts(facts: object, want: str) -> None:
    from hwprofile.pipeline import calibration_from_bench
    from hwprofile.plan.types import ModelSummary

    doc = _doc([(1, 20.0, 60.0, 45.0)])
    if facts == "ints":
        facts = {**dict.fromkeys(ModelSummary.COST_FACTS), "layers": 4.5}
    doc["plans"][0]["model_facts"] = facts
    with pytest.raises(ConfigError, match=want):
        calibration_from_bench(doc, "c.json", _cpu_host())
    doc["plans"][0]["model"] = ["not", "a", "name"]
    doc["plans"][0]["model_facts"] = None
    with pytest.raises(ConfigError, match=r"plans\[0\]\.model: expected"):
        calibration_from_bench(doc, "c.json", _cpu_host())


def test_the_bench_is_modelled_as_it_ran_its_batching_and_speculation() -> None:
    """What a calibration sets the model against is the bench's own configuration: its batching and its
    speculation (none, or the plan's method at the bench's k), and its measurement is a candidate's own
    figure only where that configuration is the candidate's; a bench that speculated by another method
    cannot be set against this plan's model (None)."""
    link = pm.link_of([], [], None, 1)
    cand = pm.Candidate(1, 1, 1, 64, 2048, True, 100_000, link)
    ngram = pm.Speculation("ngram", ((1, 8, 4), (9, None, 2)), 4, 0.6, None, "assumed")
    wl = pm.Workload(96, 48, 4)

    def cal(speculation: tuple[str, int] | None, seqs: int | None = 64) -> pm.Calibration:
        return pm.Calibration(
            "c.json", None, 96, 48, 1, None, ((4, 20.0, 60.0, 45.0),), seqs, 2048, speculation=speculation
        )

    assert candidates.as_benched(cal(None), cand, ngram, wl) == (
        cand,
        ngram,
        True,
    )  # not recorded: the plan's
    assert candidates.as_benched(cal(("none", 0)), cand, None, wl) == (cand, None, True)
    assert candidates.as_benched(cal(("none", 0)), cand, ngram, wl) == (cand, None, False)
    bench, spec, same = candidates.as_benched(cal(("ngram", 4)), cand, ngram, wl) or (None, None, None)
    assert bench == cand and spec is not None and (spec.k, spec.k_by_batch, same) == (4, (), True)
    at16 = pm.Workload(96, 48, 16)  # the plan's table gives k = 2 there: not what the bench ran
    assert candidates.as_benched(cal(("ngram", 4)), cand, ngram, at16)[2] is False  # type: ignore[index]
    assert candidates.as_benched(cal(("draft_model", 5)), cand, ngram, wl) is None
    assert candidates.as_benched(cal(("ngram", 4)), cand, None, wl) is None
    bench, _, same = candidates.as_benched(cal(None, seqs=8), cand, None, wl) or (None, None, None)
    assert bench is not None and (bench.max_num_seqs, bench.max_num_batched_tokens, same) == (8, 2048, False)
    # a draft is part of the speculation: another draft's bench is not this candidate's
    drafted = dataclasses.replace(cal(("draft_model", 4)), speculation_model="org/draft-a")
    with_draft = dataclasses.replace(ngram, method="draft_model")
    assert candidates.as_benched(drafted, cand, with_draft, wl, ("/m/draft-b", "org/draft-b")) is None
    assert candidates.as_benched(drafted, cand, with_draft, wl, ("/m/draft-a", "org/draft-a")) is not None
    # the bench is modelled at the acceptance it measured: a candidate at another (an operator's) is not
    # the bench's configuration, whether or not its predictions take the measured one
    for applies in (True, False):
        measured = dataclasses.replace(cal(("ngram", 4)), acceptance=0.8, acceptance_applies=applies)
        _, spec, same = candidates.as_benched(measured, cand, ngram, wl) or (None, None, None)
        assert spec is not None and (spec.acceptance, same) == (0.8, False)
    at = dataclasses.replace(ngram, acceptance=0.8)
    assert candidates.as_benched(dataclasses.replace(cal(("ngram", 4)), acceptance=0.8), cand, at, wl)[2]  # type: ignore[index]


def test_a_k_table_is_read_at_the_requests_an_instance_runs() -> None:
    """The k a benched concurrency ran: its table at the requests one instance runs, at most
    max_num_seqs (16 in flight on one instance of 8 sequences run 8, at k = 3, not the 16's k = 1)."""
    from hwprofile.pipeline import calibration_from_bench

    assert [candidates.running(c, 2, 8) for c in (1, 3, 16, 40)] == [1, 2, 8, 8]
    doc = _doc([(16, 20.0, 60.0, 45.0)])
    doc["plans"][0] |= {
        "max_num_seqs": 8,
        "speculative": {
            "method": "ngram",
            "model": None,
            "num_speculative_tokens": 3,
            "num_speculative_tokens_per_batch_size": [[1, 8, 3], [9, None, 1]],
        },
    }
    doc["plans"][0]["summary"][0]["mean_acceptance_length"] = {"median": 2.5}
    cal = calibration_from_bench(doc, "c.json", _cpu_host())
    assert cal.acceptance == round(pm.acceptance_of_length(2.5, 3), 6) and 0.6 < cal.acceptance < 0.8


def test_a_cpu_bench_of_other_speculation_predicts_nothing_for_this_instance(tmp_path: Path) -> None:
    """A CPU prediction models no speculation of its own (the device fitted to the bench carries the
    bench's): a bench that speculated predicts nothing for an instance that does not, as before any
    calibration."""
    d, host, root = _model_host_root(tmp_path)
    path = Path(calibration_path(root, host))
    path.parent.mkdir()
    doc = _doc([(1, 20.0, 60.0, 45.0)])
    for recorded, predicted in (
        (None, True),
        ({"method": "ngram", "model": None, "num_speculative_tokens": 3}, False),
    ):
        doc["plans"][0]["speculative"] = recorded
        path.write_text(json.dumps(doc))
        got = make_plan(host, root, environ={}, model=str(d), sets=SETS).to_json()["instances"][0]
        assert (got.get("prediction") is not None) is predicted, recorded


def test_a_bench_that_ran_no_speculation_says_so_and_a_bad_one_is_refused(tmp_path: Path) -> None:
    """A bench that recorded no speculation, at the plan's own configuration: the measurement back; a
    speculative entry that is not one is an error naming it."""
    d, host, root = _model_host_root(tmp_path)
    sets = [*SETS, "layout.workload_concurrency=1"]
    path = Path(calibration_path(root, host))
    path.parent.mkdir()
    doc = _doc([(1, 20.0, 60.0, 45.0)], batched=None)
    doc["plans"][0]["speculative"] = None
    path.write_text(json.dumps(doc))
    q = make_plan(host, root, environ={}, model=str(d), sets=sets).to_json()["instances"][0]["prediction"]
    assert q["tpot_ms"] == pytest.approx(20.0, rel=0.02)
    doc["plans"][0]["speculative"] = {"method": "x", "model": None, "num_speculative_tokens": "3"}
    path.write_text(json.dumps(doc))
    with pytest.raises(ConfigError, match="plans\\[0\\]\\.speculative: expected null or its method"):
        make_plan(host, root, environ={}, model=str(d), sets=sets)
