"""hwprofile bench, fast: the workloads from settings, the knee, the paired comparison, the NVML
sampler against the fake NVML (a card that throttles mid-run), the vllm bench serve argv and result
reading (a result vLLM 0.32 really wrote), the /metrics deltas, the plot read back, and the whole
command against tests/fakevllm.py (its `bench serve` imitation), validated against
schemas/hwprofile.bench-1.schema.json. Real `vllm bench serve` against real vLLM: test_bench_vllm.py."""

from __future__ import annotations

import dataclasses
import itertools
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import jsonschema
import pytest
from clock import ManualClock
from system import need
from vllmtools import fake_model, fake_vllm_shim, free_port, free_ports

from hwprofile.bench.compare import compare, spread
from hwprofile.bench.knee import SweepPoint, find_knee
from hwprofile.bench.report import headline
from hwprofile.bench.result import BenchPlan, summary
from hwprofile.bench.runner import Point, Target, bench_argv, read_result, spec_delta
from hwprofile.bench.tags import HardwareSampler, non_default_settings
from hwprofile.bench.workloads import bench_settings, sweep_points, workload
from hwprofile.config.settings import Settings

ROOT = Path(__file__).resolve().parent.parent
SCHEMA = json.loads((ROOT / "schemas" / "hwprofile.bench-1.schema.json").read_text())

# What `vllm bench serve --save-result` of vLLM 0.32.0 wrote against the tiny model with a self-draft
# (8 prompts, 32 in / 16 out, concurrency 2; latencies and queue times cut short).
REAL_RESULT = {
    "date": "20261201-111025",
    "endpoint_type": "openai",
    "backend": "openai",
    "label": None,
    "model_id": "/root/.cache/hwprofile/tiny-llama",
    "tokenizer_id": "/root/.cache/hwprofile/tiny-llama",
    "num_prompts": 8,
    "request_rate": "inf",
    "burstiness": 1.0,
    "max_concurrency": 2,
    "duration": 1.1327748779985995,
    "completed": 8,
    "failed": 0,
    "total_input_tokens": 256,
    "total_output_tokens": 128,
    "request_throughput": 7.062303512710749,
    "request_goodput": None,
    "output_throughput": 112.99685620337199,
    "total_token_throughput": 338.990568610116,
    "latencies": [0.3422969200000807],
    "queue_times": [0.00022166800044942647],
    "max_output_tokens_per_s": 91.0,
    "max_concurrent_requests": 8,
    "rtfx": 0.0,
    "spec_decode_acceptance_rate": 7.000000000000001,
    "spec_decode_acceptance_length": 1.21,
    "spec_decode_num_drafts": 100,
    "spec_decode_draft_tokens": 300,
    "spec_decode_accepted_tokens": 21,
    "spec_decode_per_position_acceptance_rates": [0.19, 0.01, 0.01],
    "mean_ttft_ms": 54.80417612511701,
    "median_ttft_ms": 56.37632300022233,
    "std_ttft_ms": 20.024685318492505,
    "p50_ttft_ms": 56.37632300022233,
    "p99_ttft_ms": 90.41427743992243,
    "mean_tpot_ms": 14.543861383314532,
    "median_tpot_ms": 14.942978099982913,
    "std_tpot_ms": 3.2287924589184858,
    "p50_tpot_ms": 14.942978099982913,
    "p99_tpot_ms": 19.481915836668726,
    "mean_itl_ms": 17.452633659977437,
    "median_itl_ms": 14.257619000090926,
    "std_itl_ms": 8.24325679495028,
    "p50_itl_ms": 14.257619000090926,
    "p99_itl_ms": 37.25581491011326,
    "mean_e2el_ms": 272.96209687483497,
    "median_e2el_ms": 274.5218349991774,
    "std_e2el_ms": 53.96358979608522,
    "p50_e2el_ms": 274.5218349991774,
    "p99_e2el_ms": 342.26119690014457,
}


def test_the_schema_is_a_valid_json_schema() -> None:
    jsonschema.Draft202012Validator.check_schema(SCHEMA)


# -- workloads ----------------------------------------------------------------------------------


def test_workloads_come_from_the_settings() -> None:
    s = bench_settings(Settings.from_tree({})[0])
    seed = workload("seed", s)
    assert (seed.concurrencies, seed.input_len, seed.output_len, seed.num_prompts) == ((16,), 512, 256, 64)
    assert seed.ttft_p99_target_ms == 120 and s.rounds == 3
    assert workload("latency", s).concurrencies == (1,)
    sweep = workload("sweep", s)
    assert sweep.concurrencies == (1, 2, 4, 8, 16, 32, 64) and sweep.primary == 16
    changed = bench_settings(
        Settings.from_tree({"bench": {"sweep_max": 12, "concurrency": 3, "num_prompts": 2}})[0]
    )
    sw = workload("sweep", changed)
    assert sw.concurrencies == (1, 2, 4, 8, 12) and sw.primary == 12  # 3 is not a sweep point
    assert sw.prompts_at(8) == 8 and sw.prompts_at(1) == 2  # never fewer requests than slots
    assert sweep_points(1) == (1,)
    with pytest.raises(ValueError, match="one of seed, latency, sweep"):
        workload("soak", s)


# -- knee -----------------------------------------------------------------------------------------


def pts(*rows: tuple[int, float, float]) -> list[SweepPoint]:
    return [SweepPoint(c, t, thr) for c, t, thr in rows]


def test_knee_is_the_last_concurrency_before_the_first_break() -> None:
    k = find_knee(pts((8, 118, 800), (1, 40, 100), (2, 60, 190), (4, 90, 400), (16, 300, 900)), 120, 256)
    assert k.recommended_max_num_seqs == 8 and k.breaks_at == 16
    assert "recommended max_num_seqs 8" in k.verdict and "--set engine.max_num_seqs=8" in k.verdict
    assert k.evidence[0].startswith("concurrency 1: p99 TTFT 40.0 ms <= 120 ms")
    assert any("16: p99 TTFT 300.0 ms > 120 ms" in e for e in k.evidence)
    assert any("89% of the sweep's peak" in e for e in k.evidence)


def test_knee_ignores_a_later_point_that_meets_the_target_again() -> None:
    k = find_knee(pts((1, 50, 1), (2, 130, 2), (4, 110, 3)), 120)
    assert k.recommended_max_num_seqs == 1 and k.breaks_at == 2
    assert any("met the target again" in e for e in k.evidence)


def test_knee_when_nothing_or_everything_breaks() -> None:
    never = find_knee(pts((1, 10, 1), (2, 20, 2)), 120, 2)
    assert never.recommended_max_num_seqs == 2 and never.breaks_at is None
    assert "raise bench.sweep_max" in never.verdict and "--set" not in never.verdict
    at_once = find_knee(pts((1, 200, 1), (2, 400, 2)), 120)
    assert at_once.recommended_max_num_seqs is None and at_once.breaks_at == 1
    assert "no max_num_seqs meets it" in at_once.verdict
    assert find_knee([], 120).recommended_max_num_seqs is None


# -- compare --------------------------------------------------------------------------------------


def test_compare_pairs_rounds_and_reports_median_and_spread() -> None:
    a = [
        {"output_throughput": 100.0, "p99_ttft_ms": 50.0},
        {"output_throughput": 80.0, "p99_ttft_ms": 60.0},
        {"output_throughput": 90.0, "p99_ttft_ms": 55.0},
    ]
    b = [
        {"output_throughput": 150.0, "p99_ttft_ms": 40.0},
        {"output_throughput": 100.0, "p99_ttft_ms": 66.0},
        {"output_throughput": 117.0, "p99_ttft_ms": 55.0},
    ]
    thr, ttft = compare(a, b)
    assert thr.metric == "output_throughput" and thr.ratio.values == (1.5, 1.25, 1.3)
    assert thr.ratio.median == 1.3 and thr.ratio.min == 1.25 and thr.ratio.max == 1.5
    assert thr.ratio.relative_spread == pytest.approx(0.25 / 1.3)
    assert "B/A = 1.300 (median of 3 rounds, range 1.250-1.500" in thr.sentence("A", "B")
    assert thr.sentence("A", "B").endswith("B better")
    assert ttft.ratio.values == (0.8, 1.1, 1.0) and "no clear difference" in ttft.sentence("A", "B")
    with pytest.raises(ValueError, match="pair up"):
        compare(a, b[:2])
    assert compare([{"output_throughput": 0.0}], [{"output_throughput": 5.0}]) == []  # no ratio over 0
    assert spread([3.0]).relative_spread == 0


# -- NVML tags ------------------------------------------------------------------------------------


def test_sampler_sees_a_card_throttle_mid_run(fake_host) -> None:
    """The sampler's clock is the test's (tests/clock.py): each 0.05 s step is taken only once the
    thread has sampled at the step before, so the throttled time is the test's, not the scheduler's."""
    host = fake_host("a100-80g-pcie-1x")
    clock = ManualClock(0.0)
    s = HardwareSampler({0: "A100"}, interval_s=0.01, clock=clock)

    def steps(n: int) -> None:
        for _ in range(n):
            seen = s.tracks[0].samples
            end = time.monotonic() + 60
            while s.tracks[0].samples < seen + 2 and time.monotonic() < end:  # one sampled at this time
                time.sleep(0.005)
            assert s.tracks[0].samples >= seen + 2, "the sampler thread took no reading for 60 s"
            clock.advance(0.05)

    with s:
        steps(6)  # 0.3 s
        host.set_state(**{"dev0.temperature": 91, "dev0.clocks_event_reasons": 0x20, "dev0.sm_clock": 900})
        steps(8)  # 0.4 s
    tags = s.tags()
    assert tags["status"] == "ok" and tags["throttled"]
    (g,) = tags["gpus"]
    assert g["name"] == "A100" and g["samples"] >= 5
    assert g["temperature_c"]["max"] == 91 and g["temperature_c"]["min"] < 91
    assert g["sm_clock_mhz"]["min"] == 900 and g["sm_clock_mhz"]["card_max"] > 900
    assert g["throttle_reasons_seen"] == ["sw_thermal_slowdown"]
    assert abs(g["throttled_s"] - 0.4) <= 0.05 + 1e-9, g  # the 0.4 s it was on, to one step
    first, thr = headline([_plan_with_hardware(tags)])
    assert thr and first.startswith("THROTTLED: GPU 0 (A100) sw_thermal_slowdown for")


def test_sampler_on_a_quiet_card_and_on_a_cpu_host(fake_host) -> None:
    fake_host("rtx4090-1x")
    with HardwareSampler({0: "RTX 4090"}, interval_s=0.05) as s:
        time.sleep(0.15)
    tags = s.tags()
    assert tags["status"] == "ok" and not tags["throttled"] and tags["gpus"][0]["throttled_s"] == 0
    first, thr = headline([_plan_with_hardware(tags)])
    assert not thr and first.startswith("no throttling seen: GPU 0 RTX 4090")
    with HardwareSampler({}) as cpu:
        pass
    assert cpu.tags()["status"] == "no_gpu" and cpu.tags()["gpus"] == []
    assert headline([_plan_with_hardware(cpu.tags())])[0].startswith("CPU host: no GPU clock/throttle tags")


def test_sampler_failures_are_tags(monkeypatch, tmp_path) -> None:
    monkeypatch.setenv("HWPROFILE_NVML_LIBRARY", str(tmp_path / "missing.so"))
    with HardwareSampler({0: "A100"}) as s:
        pass
    tags = s.tags()
    assert tags["status"] == "error" and "cannot be loaded" in tags["error"]
    assert headline([_plan_with_hardware(tags)])[0].startswith("GPU tags incomplete (NVML: ")

    class Broken:
        error = None

        def sample(self, now: float) -> tuple[()]:
            raise RuntimeError("driver went away")

    with HardwareSampler({0: "x"}, make_sampler=lambda idx: Broken()) as s2:
        pass
    assert s2.tags()["status"] == "error" and "driver went away" in s2.tags()["error"]


def _point(c: int = 4, thr: float = 10.0, ttft: float = 50.0) -> Point:
    lat = {m: {"mean": ttft, "p50": ttft, "p99": ttft} for m in ("ttft", "tpot", "itl", "e2el")}
    return Point(
        c,
        8,
        8,
        0,
        1.0,
        1.0,
        thr,
        thr,
        lat,
        None,
        None,
        {"argv": ["vllm", "bench", "serve"], "result_file": "x.json", "spec_decode_reported": None},
    )


def _plan_with_hardware(tags: dict[str, Any]) -> BenchPlan:
    p = BenchPlan("p", "url", "http://x", None)
    p.runs.append(
        {"round": 1, "order": 1, "url": "http://x", "started": "", "points": [_point()], "hardware": [tags]}
    )
    return p


def test_a_stream_merged_by_the_api_server_is_told_from_the_engines_timing() -> None:
    """vLLM's API server merges a request's streamed outputs when its stream falls behind: the client's
    TPOT then falls near 0 while the server's own histogram still times each token. Measured on this
    project's VM: client median TPOT 0.0034 ms, server 2.58 ms."""
    from hwprofile.plan.servercost import merged_stream

    why = merged_stream(0.0034, 2.58)
    assert why is not None and "0.0034 ms" in why and "2.58 ms" in why and "merged" in why
    assert merged_stream(2.5, 2.58) is None and merged_stream(1.3, 2.58) is None  # half or more: timed
    assert merged_stream(1.28, 2.58) is not None
    for client, server in ((None, 2.58), (0.003, None), (True, 2.58), (0.003, 0.0), ("0", 2.58)):
        assert merged_stream(client, server) is None, (client, server)  # unknown: nothing said


def test_a_merged_round_keeps_its_throughput_and_leaves_the_latency_medians() -> None:
    def timed(ttft: float, tpot: float, thr: float) -> Point:
        p = _point(1, thr, ttft)
        lat = {**p.latency_ms, "tpot": {"mean": tpot, "p50": tpot, "p99": tpot}}
        return dataclasses.replace(p, latency_ms=lat, server_metrics={"tpot_ms": 2.6})

    plan = BenchPlan("p", "url", "http://x", None)
    for r, pt in enumerate((timed(10.0, 2.6, 350.0), timed(133.0, 0.003, 340.0), timed(11.0, 2.7, 330.0))):
        plan.runs.append(
            {"round": r + 1, "order": 1, "url": "http://x", "started": "", "points": [pt], "hardware": [{}]}
        )
    assert plan.runs[1]["points"][0].to_json()["stream_merged"] is not None
    assert plan.runs[0]["points"][0].to_json()["stream_merged"] is None
    (row,) = summary(plan)
    assert row["rounds"] == 3 and row["merged_rounds"] == 1
    assert row["metrics"]["p50_ttft_ms"]["values"] == [10.0, 11.0]
    assert row["metrics"]["p50_tpot_ms"]["values"] == [2.6, 2.7]
    assert row["metrics"]["output_throughput"]["values"] == [350.0, 340.0, 330.0]
    from hwprofile.bench.report import plan_table

    said = "\n".join(plan_table(plan, [row]))
    assert "1 of 3 rounds streamed their tokens merged" in said, said
    for p in plan.runs[1:]:  # every round merged: no latency at all, the throughput still there
        p["points"] = [timed(133.0, 0.003, 340.0)]
    plan.runs[0]["points"] = [timed(130.0, 0.002, 345.0)]
    (row,) = summary(plan)
    assert row["merged_rounds"] == 3 and set(row["metrics"]) == {"output_throughput", "request_throughput"}


def test_non_default_settings_name_their_source() -> None:
    from hwprofile.config import Source

    settings = {"engine": {"max_num_seqs": 7}, "bench": {"rounds": 3}}
    prov = {("engine", "max_num_seqs"): Source("cli", "--set engine.max_num_seqs=7")}
    nd = non_default_settings(Settings.from_tree(settings)[0], prov)
    assert {
        "key": "engine.max_num_seqs",
        "value": 7,
        "default": Settings().engine.max_num_seqs,
        "source": "cli --set engine.max_num_seqs=7",
    } in nd
    assert all(s["key"] != "bench.rounds" for s in nd)  # 3 is the default


# -- runner ---------------------------------------------------------------------------------------


def test_argv_is_the_seed_shape(tmp_path) -> None:
    from hwprofile.bench.workloads import resolve_dataset

    wl = resolve_dataset(workload("seed", bench_settings(Settings.from_tree({})[0])), False)
    argv = bench_argv(
        Target("http://127.0.0.1:8000", "m", "/models/m", "/venv/bin/vllm"), wl, 16, tmp_path, "r.json"
    )
    assert argv[:3] == ["/venv/bin/vllm", "bench", "serve"]
    flags = dict(itertools.pairwise(argv))
    assert (
        flags["--base-url"] == "http://127.0.0.1:8000"
        and flags["--model"] == "m"
        and flags["--tokenizer"] == "/models/m"
    )
    assert flags["--dataset-name"] == "random" and flags["--random-input-len"] == "512"
    assert (
        flags["--random-output-len"] == "256"
        and flags["--num-prompts"] == "64"
        and flags["--max-concurrency"] == "16"
    )
    assert flags["--metric-percentiles"] == "50,99" and flags["--percentile-metrics"] == "ttft,tpot,itl,e2el"
    assert (
        flags["--result-dir"] == str(tmp_path)
        and flags["--result-filename"] == "r.json"
        and flags["--seed"] == "0"
    )
    assert "--ignore-eos" in argv and "--save-result" in argv


def test_a_real_vllm_result_reads_into_a_point(tmp_path) -> None:
    f = tmp_path / "r.json"
    f.write_text(json.dumps(REAL_RESULT))
    p = read_result(f, 2, ["vllm"])
    assert (p.completed, p.num_prompts, p.failed) == (8, 8, 0)
    assert p.output_throughput == pytest.approx(112.9968562)
    assert p.latency_ms["ttft"] == {
        "mean": pytest.approx(54.804176),
        "p50": pytest.approx(56.376323),
        "p99": pytest.approx(90.414277),
    }
    assert (
        p.metric("p99_itl_ms") == pytest.approx(37.255815)
        and p.metric("output_throughput") == p.output_throughput
    )
    rep = p.vllm_bench["spec_decode_reported"]
    assert rep["acceptance_rate"] == pytest.approx(0.07) and rep["mean_acceptance_length"] == 1.21
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({k: v for k, v in REAL_RESULT.items() if k != "output_throughput"}))
    with pytest.raises(Exception, match="no number under 'output_throughput'"):
        read_result(bad, 2, [])


def test_spec_delta_uses_the_documented_formulas_and_survives_a_reset() -> None:
    pp = "vllm:spec_decode_num_accepted_tokens_per_pos_total"
    before = {
        "vllm:spec_decode_num_drafts_total": 100,
        "vllm:spec_decode_num_draft_tokens_total": 300,
        "vllm:spec_decode_num_accepted_tokens_total": 150,
        f"{pp}{{position=0}}": 80,
        f"{pp}{{position=1}}": 70,
    }
    after = {
        "vllm:spec_decode_num_drafts_total": 150,
        "vllm:spec_decode_num_draft_tokens_total": 450,
        "vllm:spec_decode_num_accepted_tokens_total": 230,
        f"{pp}{{position=0}}": 125,
        f"{pp}{{position=1}}": 105,
    }
    d = spec_delta(before, after)
    assert d["num_drafts"] == 50 and d["draft_tokens"] == 150 and d["accepted_tokens"] == 80
    assert d["acceptance_rate"] == pytest.approx(80 / 150) and d["mean_acceptance_length"] == pytest.approx(
        1 + 80 / 50
    )
    assert d["per_position_acceptance"] == [pytest.approx(45 / 50), pytest.approx(35 / 50)]
    restarted = {k: v / 10 for k, v in after.items()}  # the server restarted: counters began again
    assert spec_delta(before, restarted)["num_drafts"] == 15
    assert spec_delta(before, {}) is None


# -- plot -----------------------------------------------------------------------------------------


def test_plot_is_a_png_with_the_axes_and_lines_it_reports(tmp_path) -> None:
    import matplotlib.image

    from hwprofile.bench.plot import plot

    series = {
        "A": [(1, (10, 9, 11), (40, 38, 42)), (2, (19, 18, 20), (70, 60, 80))],
        "B": [(1, (12, 12, 12), (30, 30, 30)), (2, (25, 24, 26), (150, 140, 160))],
    }
    rec = plot(series, 120, tmp_path / "x.png", "t")
    img = matplotlib.image.imread(tmp_path / "x.png")
    assert img.shape[:2] == (rec["height_px"], rec["width_px"]) == (450, 1100)
    assert [a["ylabel"] for a in rec["axes"]] == ["output tokens/s", "p99 TTFT (ms)"]
    assert rec["axes"][0]["lines"] == ["A", "B"] and sorted(rec["axes"][1]["lines"]) == [
        "A",
        "B",
        "target 120 ms",
    ]


# -- the command, against the fake vLLM -----------------------------------------------------------


@pytest.fixture
def world(tmp_path: Path):
    model = fake_model(tmp_path / "model")
    shim = fake_vllm_shim(tmp_path / "vllm")
    (tmp_path / "etc").mkdir()
    runtime = Path(tempfile.mkdtemp(prefix="hwpbt-", dir="/tmp"))
    env = {
        **{
            k: v
            for k, v in os.environ.items()
            if not k.startswith(("FAKEVLLM_", "HWPROFILE_", "FAKE_NVML"))
            and k.lower() not in ("http_proxy", "https_proxy", "all_proxy")
        },
        "HWPROFILE_CONFIG_ROOT": str(tmp_path / "etc"),
        "FAKEVLLM_READY_DELAY": "0.2",
        "HWPROFILE_STATE_DIR": str(tmp_path / "state"),
    }
    port = free_ports(2)  # the two-server shape takes port and port + 1
    sets = [
        "engine.max_model_len=512",
        "cpu.kv_cache_space_gib=0.0625",
        "server.shutdown_timeout=2",
        f"server.port={port}",
        f"server.vllm_command={shim}",
        f"logs.dir={tmp_path / 'logs'}",
        "bench.input_len=8",
        "bench.output_len=6",
        "bench.num_prompts=4",
    ]
    yield {
        "tmp": tmp_path,
        "model": model,
        "shim": shim,
        "env": env,
        "sets": sets,
        "port": port,
        "runtime": runtime,
    }
    shutil.rmtree(runtime, ignore_errors=True)


def hw(
    world: dict[str, Any],
    *args: str,
    env: dict[str, str] | None = None,
    sets: list[str] | None = None,
    plot: bool = False,
):
    """``hwprofile bench`` with the world's model and runtime; no plot unless the test reads it (one is
    a second of CPU, matplotlib's import)."""
    cmd = [
        sys.executable,
        "-m",
        "hwprofile",
        "bench",
        "--model",
        str(world["model"]),
        "--runtime-dir",
        str(world["runtime"]),
    ]
    for s in world["sets"] if sets is None else sets:
        cmd += ["--set", s]
    return subprocess.run(
        [*cmd, *args, *([] if plot else ["--no-plot"])],
        env={**world["env"], **(env or {})},
        capture_output=True,
        text=True,
        timeout=300,
        cwd=world["tmp"],  # were a bench to write into the working directory, here, not in the checkout
    )


def test_speculating_plans_are_benchmarked_on_real_prompts(tmp_path) -> None:
    """bench.dataset auto: real prompts (the shipped ShareGPT-format set) wherever a plan speculates,
    random tokens where none does, real prompts when it is not known; an explicit choice is kept."""
    from hwprofile.bench.workloads import prompts_path, resolve_dataset

    wl = workload("seed", bench_settings(Settings.from_tree({})[0]))
    assert wl.dataset == "auto"
    spec, plain, unknown = (resolve_dataset(wl, s) for s in (True, False, None))
    assert (spec.dataset, plain.dataset, unknown.dataset) == ("prompts", "random", "prompts")
    assert "speculates" in spec.dataset_why and "not known" in unknown.dataset_why
    forced = workload("seed", bench_settings(Settings.from_tree({"bench": {"dataset": "random"}})[0]))
    assert resolve_dataset(forced, True).dataset == "random"
    with pytest.raises(ValueError, match="not resolved"):
        bench_argv(Target("http://h:1", "m", "t"), wl, 1, tmp_path, "r.json")
    flags = dict(itertools.pairwise(bench_argv(Target("http://h:1", "m", "t"), spec, 4, tmp_path, "r.json")))
    assert flags["--dataset-name"] == "sharegpt" and flags["--sharegpt-output-len"] == "256"
    assert "--random-input-len" not in flags and flags["--dataset-path"] == prompts_path()
    # the shipped set: ShareGPT conversations vLLM's reader keeps (two turns, a prompt of several words)
    convs = json.loads(Path(prompts_path()).read_text(encoding="utf-8"))
    prompts = [c["conversations"][0]["value"] for c in convs]
    assert len(convs) >= 32 and len(set(prompts)) == len(prompts)
    assert all(len(c["conversations"]) >= 2 and c["conversations"][0]["from"] == "human" for c in convs)
    assert all(len(p) >= 20 for p in prompts) and max(len(p) for p in prompts) > 5 * min(
        len(p) for p in prompts
    )


@pytest.mark.slow(minutes=1)
def test_vllms_own_sharegpt_reader_takes_the_shipped_prompts() -> None:
    """vLLM's own ShareGPT dataset reader (what ``vllm bench serve --dataset-name sharegpt`` runs)
    samples the shipped prompts with a real tokenizer: every request a real prompt, oversampled to
    the number asked for, none dropped by its length rules."""
    pytest.importorskip("vllm")
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast
    from vllm.benchmarks.datasets.datasets import ShareGPTDataset

    from hwprofile.bench.workloads import prompts_path

    tok = Tokenizer(models.WordLevel({"[UNK]": 0}, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="[UNK]")
    convs = json.loads(Path(prompts_path()).read_text(encoding="utf-8"))
    ds = ShareGPTDataset(dataset_path=prompts_path(), random_seed=0)
    got = ds.sample(fast, num_requests=64, output_len=256)
    assert len(got) == 64 and all(r.expected_output_len == 256 for r in got)
    assert len({r.prompt for r in got}) == len(convs)  # each shipped prompt kept once, then oversampled
    assert {r.prompt for r in got} == {c["conversations"][0]["value"] for c in convs}


def validate(doc: dict[str, Any]) -> None:
    errors = [f"{e.json_path}: {e.message}" for e in jsonschema.Draft202012Validator(SCHEMA).iter_errors(doc)]
    assert not errors, errors[:5]


def test_sweep_compare_profile_with_baseline(world) -> None:
    out = world["tmp"] / "out"
    r = hw(
        world,
        "--workload",
        "sweep",
        "--compare",
        "profile",
        "baseline",
        "--rounds",
        "2",
        "--output",
        str(out),
        "--set",
        "bench.sweep_max=4",
        "--set",
        "bench.ttft_p99_target_ms=300",
        env={"FAKEVLLM_BENCH_TTFT_MS_PER_CONCURRENCY": "100"},
        plot=True,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    doc = json.loads((out / "bench.json").read_text())
    validate(doc)
    assert r.stdout.splitlines()[0] == doc["headline"] and doc["headline"].startswith("CPU host: no GPU")
    a, b = doc["plans"]
    assert (a["label"], b["label"]) == ("profile", "baseline")
    assert a["speculative"]["method"] == "ngram" and b["speculative"] is None
    # the profile speculates: both sides run on the same real prompts (the fake serves them as given)
    assert doc["workload"]["dataset"] == "prompts" and "speculates" in doc["workload"]["dataset_why"]
    assert "prompts dataset" in r.stdout
    assert any(s["key"] == "speculative.method" and s["value"] == "none" for s in b["non_default_settings"])
    # rounds alternate A B, B A; each run has one point per sweep concurrency, each with its tags
    assert [(run["round"], run["order"]) for run in a["runs"]] == [(1, 1), (2, 4)]
    assert [(run["round"], run["order"]) for run in b["runs"]] == [(1, 2), (2, 3)]
    for p in (a, b):
        for run in p["runs"]:
            assert [pt["concurrency"] for pt in run["points"]] == [1, 2, 4]
            assert all(pt["hardware"]["status"] == "no_gpu" and pt["completed"] == 4 for pt in run["points"])
    # the fake's speculation counts one accepted token per step of 3 proposals
    spec = a["runs"][0]["points"][0]["spec_decode"]
    assert spec["acceptance_rate"] == pytest.approx(1 / 3) and spec[
        "mean_acceptance_length"
    ] == pytest.approx(2.0)
    assert b["runs"][0]["points"][0]["spec_decode"] is None
    # p99 TTFT ~ 100 ms per slot + the fake's own: 1 and 2 meet 300 ms, 4 does not
    for p in (a, b):
        assert p["knee"]["recommended_max_num_seqs"] == 2 and p["knee"]["breaks_at"] == 4, p["knee"]
        assert "recommended max_num_seqs 2" in r.stdout
    cmp = doc["compare"]
    assert cmp["a"] == "profile" and cmp["b"] == "baseline"
    row = next(x for x in cmp["per_concurrency"] if x["concurrency"] == 4)
    thr = next(m for m in row["metrics"] if m["metric"] == "output_throughput")
    assert len(thr["ratio_b_over_a"]["values"]) == 2
    assert thr["ratio_b_over_a"]["values"][0] == pytest.approx(thr["b"]["values"][0] / thr["a"]["values"][0])
    # the plot: the PNG has the size and the lines the JSON says, one line per plan
    import matplotlib.image

    img = matplotlib.image.imread(out / doc["plot"]["file"])
    assert img.shape[:2] == (doc["plot"]["height_px"], doc["plot"]["width_px"])
    knees = ["knee baseline: 2", "knee profile: 2"]  # the sweeps broke the target: their knees drawn
    assert sorted(doc["plot"]["axes"][0]["lines"]) == ["baseline", *knees, "profile"]
    assert sorted(doc["plot"]["axes"][1]["lines"]) == ["baseline", *knees, "profile", "target 300 ms"]
    # vllm bench serve's own results are kept beside
    assert (out / "vllm-bench" / "profile-r1-c4.json").exists()


def test_url_mode_json_and_errors(world) -> None:
    port = world["port"]
    proc = subprocess.Popen(
        [
            str(world["shim"]),
            "serve",
            str(world["model"]),
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--speculative-config",
            '{"method": "ngram", "num_speculative_tokens": 2}',
        ],
        env=world["env"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        url = f"http://127.0.0.1:{port}"
        for _ in range(100):
            try:
                with socket.create_connection(("127.0.0.1", port), 0.2):
                    break
            except OSError:
                time.sleep(0.1)
        time.sleep(0.4)  # past the fake's loading delay
        out = world["tmp"] / "u"
        r = hw(
            world,
            "--url",
            url,
            "--workload",
            "latency",
            "--json",
            "--output",
            str(out),
            "--set",
            f"server.vllm_command={world['shim']}",
        )
        assert r.returncode == 0, r.stderr[-3000:]
        doc = json.loads(r.stdout)
        validate(doc)
        (p,) = doc["plans"]
        assert p["kind"] == "url" and p["source"] == url and doc["compare"] is None
        assert (
            doc["plot"] is None
            and doc["plot_error"] == "not drawn (--no-plot)"
            and not (out / "bench.png").exists()
        )
        (pt,) = p["runs"][0]["points"]
        assert pt["concurrency"] == 1 and pt["spec_decode"]["acceptance_rate"] == pytest.approx(0.5)
        assert pt["vllm_bench"]["argv"][pt["vllm_bench"]["argv"].index("--model") + 1] == str(world["model"])
        # vllm bench serve failing: exit 1, its own message shown
        r = hw(world, "--url", url, "--output", str(out), env={"FAKEVLLM_BENCH_FAIL": "tokenizer exploded"})
        assert (
            r.returncode == 1 and "tokenizer exploded" in r.stderr and "vllm bench serve exited 1" in r.stderr
        )
    finally:
        os.killpg(proc.pid, 15)
        proc.wait(30)
    r = hw(world, "--url", "http://127.0.0.1:1", "--compare", "profile", "baseline")
    assert r.returncode == 2 and "--compare launches both plans itself" in r.stderr
    # a server hwprofile did not launch runs a model, batching and speculation it cannot see: a bench of
    # it is no calibration (one is set against them)
    r = hw(world, "--url", "http://127.0.0.1:1", "--calibrate")
    assert r.returncode == 2 and "bench with --model MODEL --calibrate instead" in r.stderr
    assert not (world["tmp"] / "etc" / "calibration").exists()
    r = hw(world, "--compare", "profile", str(world["tmp"] / "nope.yaml"))
    assert r.returncode == 2 and "neither 'profile', 'baseline' nor an overrides file" in r.stderr
    r = hw(world, "--url", f"http://127.0.0.1:{free_port()}")
    assert r.returncode == 1 and "no model to benchmark" in r.stderr


def test_a_throttling_gpu_is_the_first_line(world, fake_nvml_dir) -> None:
    from fakehost import build

    host = build("rtx4090-1x", world["tmp"] / "host")
    host.set_state(**{"dev0.clocks_event_reasons": 0x20, "dev0.temperature": 89})
    env = {
        **host.env(fake_nvml_dir),
        **{k: v for k, v in world["env"].items() if k.startswith(("HWPROFILE_", "FAKEVLLM_"))},
    }
    out = world["tmp"] / "g"
    r = hw(
        world,
        "--output",
        str(out),
        "--set",
        "speculative.method=none",
        "--set",
        "bench.concurrency=2",
        env=env,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    doc = json.loads((out / "bench.json").read_text())
    validate(doc)
    first = r.stdout.splitlines()[0]
    assert (
        first.startswith("THROTTLED: GPU 0 (NVIDIA GeForce RTX 4090) sw_thermal_slowdown")
        and doc["throttled"]
    )
    (g,) = doc["plans"][0]["runs"][0]["points"][0]["hardware"]["gpus"]
    assert g["temperature_c"] == {"min": 89, "max": 89} and g["throttled_s"] > 0
    assert doc["host"]["gpus"][0]["name"] == "NVIDIA GeForce RTX 4090"
    # the accuracy gate: the GPU plan's own predictions at the point (datasheet x fitted efficiencies),
    # with bands, against the fake server (nothing like a 4090): off, and the next step is to calibrate
    acc = doc["plans"][0]["accuracy"]
    (pt,) = acc["points"]
    assert pt["concurrency"] == 2 and pt["workload"]["concurrency"] == 2 and pt["predicted"]
    assert {f["provenance"] for f in pt["figures"]} <= {"fitted", "datasheet"}
    assert all(f["predicted"] > 0 and f["error"] is not None for f in pt["figures"])
    assert acc["state"] == "fail" and acc["next_step"].startswith("run `hwprofile bench --calibrate`")
    assert "accuracy profile: predicted vs measured" in r.stdout


def test_point_logs_are_never_written_through_a_planted_link(tmp_path) -> None:
    """`bench --output` wrote its per-point logs with a plain open(): a link planted at the log's
    name wrote into its target. The log is opened without following links, the raw directory is a
    private one, and a point with a planted link fails with the reason instead."""
    from hwprofile.bench.runner import BenchFailed, Target, run_point
    from hwprofile.bench.workloads import Workload

    raw = tmp_path / "out" / "vllm-bench"
    raw.mkdir(parents=True, mode=0o700)
    victim = tmp_path / "victim"
    victim.write_text("theirs\n")
    (raw / "p-c1.log").symlink_to(victim)
    wl = Workload("seed", (1,), 64, 32, 4, 120.0, 1)
    with pytest.raises(BenchFailed, match="cannot write the point's log"):
        run_point(Target("http://127.0.0.1:9", "m", "m", "/bin/true"), wl, 1, raw, "p-c1")
    assert victim.read_text() == "theirs\n"


def test_compare_the_two_shapes_of_one_host_each_through_its_one_url(world) -> None:
    """Separate servers are measured through nginx in front of them (the URL their clients use), one
    data-parallel server through its own."""
    need("nginx")
    servers, dp = world["tmp"] / "servers.yaml", world["tmp"] / "dp.yaml"
    servers.write_text("layout:\n  shape: servers\n  replicas: 2\n  front: nginx\n")
    dp.write_text("layout:\n  shape: data_parallel\n  replicas: 2\n")
    front = free_port()
    out = world["tmp"] / "out"
    log = world["tmp"] / "starts.jsonl"
    r = hw(
        world,
        "--compare",
        str(servers),
        str(dp),
        "--rounds",
        "1",
        "--output",
        str(out),
        "--set",
        f"layout.endpoint_port={front}",
        "--set",
        "bench.num_prompts=8",
        env={"FAKEVLLM_ARGV_LOG": str(log)},
    )
    assert r.returncode == 0, r.stderr[-3000:]
    assert f"their one URL http://127.0.0.1:{front} (nginx in front" in r.stderr
    doc = json.loads((out / "bench.json").read_text())
    validate(doc)
    a, b = doc["plans"]
    assert (a["label"], b["label"], a["instances"], b["instances"]) == ("servers", "dp", 2, 1)
    assert a["runs"][0]["url"] == f"http://127.0.0.1:{front}"
    assert b["runs"][0]["url"] == f"http://127.0.0.1:{world['port']}"
    starts = [json.loads(ln)["argv"] for ln in log.read_text().splitlines()]
    ports = sorted(a_[a_.index("--port") + 1] for a_ in starts if "--data-parallel-size" not in a_)
    assert ports == [str(world["port"]), str(world["port"] + 1)]
    assert any("--data-parallel-size" in a_ for a_ in starts)
    assert doc["compare"]["a"] == "servers" and doc["compare"]["b"] == "dp"


def test_a_bench_that_never_ran_leaves_no_results_directory_behind(world) -> None:
    dead = world["tmp"] / "dead-vllm"
    dead.write_text('#!/bin/sh\n[ "$1" = --version ] && { echo 0.32.0; exit 0; }\nexit 3\n')  # dies serving
    dead.chmod(0o755)
    kept = world["tmp"] / "kept"
    kept.mkdir()
    for output in ([], ["--output", str(world["tmp"] / "new")], ["--output", str(kept)]):
        r = hw(
            world, *output, sets=[*world["sets"], f"server.vllm_command={dead}", "supervise.max_restarts=0"]
        )
        assert r.returncode != 0 and "not ready: vllm-cpu" in r.stderr, r.stdout + r.stderr
        assert not list(world["tmp"].glob("hwprofile-bench-*")) and not (world["tmp"] / "new").exists(), (
            r.stderr
        )
        assert not list((world["tmp"] / "state").glob("bench/hwprofile-bench-*")), r.stderr
    assert kept.is_dir()  # a directory the user named and that was there stays


def test_results_go_to_the_state_directory_not_the_working_directory(world) -> None:
    """Run from inside a checkout, a bench without --output leaves nothing there: its results go under
    the state directory, and it says where."""
    r = hw(world)
    assert r.returncode == 0, r.stderr[-3000:]
    made = list((world["tmp"] / "state" / "bench").glob("hwprofile-bench-*"))
    assert len(made) == 1 and (made[0] / "bench.json").is_file(), r.stderr
    assert f"results go to {made[0]}" in r.stderr
    assert not list(world["tmp"].glob("hwprofile-bench-*"))  # the working directory


def test_vllms_own_warnings_stay_in_its_log_kept_beside_the_results(world) -> None:
    """vLLM's WARNING lines are not hwprofile's progress: not on the terminal, in the log kept with the results."""
    out = world["tmp"] / "out"
    r = hw(world, "--output", str(out), env={"FAKEVLLM_MODE": "warn"})
    assert r.returncode == 0, r.stderr[-3000:]
    assert "a warning of vLLM's own" not in r.stderr + r.stdout, r.stderr
    kept = out / "profile-vllm-cpu.vllm.log"
    assert "a warning of vLLM's own" in kept.read_text()
    assert f"vLLM's own output (warnings included) is in {kept}" in r.stderr


def test_py_cpuinfo_is_probed_once_per_boot(tmp_path, monkeypatch) -> None:
    """py-cpuinfo times the clock in a second Python (about a second of CPU): its answer is kept in
    the user's cache for this boot; another boot's, a malformed or a linked cache is probed again."""
    import cpuinfo

    from hwprofile.bench import tags

    calls = []
    monkeypatch.setattr(
        cpuinfo,
        "get_cpu_info",
        lambda: calls.append(1) or {"brand_raw": "Acme 9", "l2_cache_size": 2 << 20, "flags": ["avx"]},
    )
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    cache = tmp_path / "hwprofile" / tags.CPUINFO_CACHE
    first = tags.cpu_info()
    assert first["brand"] == "Acme 9" and first["l2_cache_bytes"] == 2 << 20 and first["error"] is None
    assert tags.cpu_info() == first and len(calls) == 1 and oct(cache.stat().st_mode & 0o777) == "0o600"
    doc = json.loads(cache.read_text())
    assert doc["boot_id"] == Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    for planted in (
        json.dumps({**doc, "boot_id": "another-boot"}),
        "{not json",
        json.dumps({"boot_id": doc["boot_id"]}),
    ):
        cache.write_text(planted)
        assert tags.cpu_info() == first
    assert len(calls) == 4
    cache.unlink()
    (tmp_path / "elsewhere.json").write_text(json.dumps(doc))
    cache.symlink_to(tmp_path / "elsewhere.json")
    assert tags.cpu_info() == first and len(calls) == 5
    for plant in ("fifo", "zero"):  # never a blocking or endless read: probed again
        cache.unlink()
        os.mkfifo(cache) if plant == "fifo" else cache.symlink_to("/dev/zero")
        assert tags.cpu_info() == first
    assert len(calls) == 7


def test_separate_servers_behind_the_router_are_measured_through_it(world) -> None:
    """With vLLM's router installed (layout.front=router), the supervisor runs it and the bench
    measures the servers through it, the URL their clients use."""
    if not (Path(sys.executable).parent / "vllm-router").is_file():
        pytest.skip("vllm-router is not installed (the 'router' extra)")
    servers = world["tmp"] / "routed.yaml"
    servers.write_text("layout:\n  shape: servers\n  replicas: 2\n  front: router\n")
    front = free_ports(2)
    out = world["tmp"] / "out-router"
    r = hw(
        world,
        "--compare",
        str(servers),
        str(servers),
        "--rounds",
        "1",
        "--output",
        str(out),
        "--set",
        f"layout.endpoint_port={front}",
        "--set",
        "bench.num_prompts=8",
    )
    assert r.returncode == 0, r.stderr[-3000:]
    assert f"their one URL http://127.0.0.1:{front} (vLLM's router in front" in r.stderr
    doc = json.loads((out / "bench.json").read_text())
    assert doc["plans"][0]["runs"][0]["url"] == f"http://127.0.0.1:{front}"


def _pred(source: str, tpot: float, ttft: float, tps: float, basis: str = "datasheet") -> dict[str, Any]:
    band = {"ratio_lo": 0.8, "ratio_hi": 1.25, "median_ratio": 1.0, "points": 5, "source": "bands"}
    sim: dict[str, Any] = {
        k: {"value": v, "regime": "single", "band": band} for k, v in (("ttft_ms", ttft), ("tpot_ms", tpot))
    }
    sim["output_tokens_per_s"] = {"value": tps, "regime": "single", "band": None, "band_unknown": "none here"}
    return {
        "workload": {"input_len": 8, "output_len": 6, "concurrency": 1},
        "tpot_ms": tpot,
        "ttft_ms": ttft,
        "output_tokens_per_s": tps,
        "source": source,
        "terms": [{"term": "t", "ms": 1.0, "basis": basis}],
        "simulated": sim,
    }


def _row(c: int, tpot: list[float], ttft: list[float], tps: list[float]) -> dict[str, Any]:
    from hwprofile.bench.compare import spread

    return {
        "concurrency": c,
        "rounds": len(tpot),
        "metrics": {
            "p50_tpot_ms": spread(tpot).to_json(),
            "p50_ttft_ms": spread(ttft).to_json(),
            "output_throughput": spread(tps).to_json(),
        },
    }


def test_the_accuracy_gate_judges_the_mape_per_figure() -> None:
    from hwprofile.bench.accuracy import CALIBRATE, accuracy, lines, provenance

    assert provenance(_pred("datasheet", 1, 1, 1)) == "datasheet"
    assert provenance(_pred("datasheet", 1, 1, 1, basis="fitted")) == "fitted"
    assert provenance(_pred("calibrated: /x.json", 1, 1, 1)) == "calibrated"
    assert provenance(_pred("datasheet scaled by calibration /x.json (…)", 1, 1, 1)) == "calibrated"
    assert provenance(_pred("calibration /x.json (bench ?, concurrency 1)", 1, 1, 1)) == "measured"
    rows = [_row(1, [10.0], [100.0], [50.0]), _row(4, [20.0], [400.0], [100.0])]
    # within 20 % on every figure: pass, nothing to do
    ok = accuracy({1: _pred("datasheet", 11, 90, 55), 4: _pred("datasheet", 18, 440, 95)}, rows, "-")
    assert ok["state"] == "pass" and ok["next_step"] is None
    assert ok["mape"]["tpot_ms"] == pytest.approx((0.1 + 0.1) / 2)
    assert ok["mape"]["ttft_ms"] == pytest.approx((0.1 + 0.1) / 2)
    assert ok["mape"]["output_tokens_per_s"] == pytest.approx((0.1 + 0.05) / 2)
    assert ok["mape"]["overall"] == pytest.approx((0.1 * 5 + 0.05) / 6)
    f = ok["points"][0]["figures"][1]
    assert f["figure"] == "ttft_ms" and f["error"] == pytest.approx(-0.1) and f["provenance"] == "datasheet"
    # the band: measured expected within predicted / ratio_hi .. predicted / ratio_lo
    assert f["band"]["measured_lo"] == pytest.approx(90 / 1.25) and f["band"]["measured_hi"] == pytest.approx(
        90 / 0.8
    )
    assert f["within_band"] is True
    assert (
        ok["points"][0]["figures"][0]["band"] is None
        and ok["points"][0]["figures"][0]["band_unknown"] == "none here"
    )
    # TTFT off (x3 at 4): fail, named, and the next step is to calibrate (the figures are not calibrated)
    bad = accuracy({1: _pred("datasheet", 11, 90, 55), 4: _pred("datasheet", 18, 1200, 95)}, rows, "-")
    assert bad["state"] == "fail" and bad["next_step"] == CALIBRATE
    assert "TTFT p50 off by +200% at concurrency 4" in bad["why"]
    # calibrated already and still off: which figure and by how much, not "calibrate"
    cal = {c: _pred("calibrated: /x.json", 11, t, 55) for c, t in ((1, 90), (4, 1200))}
    again = accuracy(cal, rows, "-")
    assert again["state"] == "fail" and again["next_step"].startswith("calibrated already")
    assert "TTFT p50 off by +200% at concurrency 4 (MAPE 105%)" in again["next_step"]
    # a measurement whose rounds disagree more than the gate cannot judge: noisy, never pass or fail
    noisy_rows = [_row(1, [10.0, 10.0], [50.0, 150.0], [50.0, 50.0])]
    noisy = accuracy({1: _pred("calibrated: /x.json", 10, 200, 50)}, noisy_rows, "-")
    assert noisy["state"] == "noisy" and "measurement too noisy (spread 100% of TTFT p50" in noisy["why"]
    # nothing predicted: unknown, with the reason and the way to a prediction
    none = accuracy({1: None}, rows[:1], "a CPU has no datasheet here")
    assert none["state"] == "unknown" and none["mape"]["overall"] is None and none["next_step"] == CALIBRATE
    assert none["why"] == "nothing predicted: a CPU has no datasheet here"
    assert accuracy({}, rows, "a server at --url: no plan")["next_step"] is None
    from hwprofile.bench.accuracy import calibration_caveats

    assert calibration_caveats(rows)[0].startswith("concurrency 1: one measurement a point")
    assert calibration_caveats([_row(1, [10.0, 10.5], [100.0, 101.0], [50.0, 51.0])]) == []
    (wide,) = calibration_caveats(noisy_rows)
    assert "TTFT p50 spread ±50% over 2 measurements, wider than the 20% gate" in wide
    text = "\n".join(lines(bad, "profile"))
    assert "gate: FAIL" in text and "next: run `hwprofile bench --calibrate`" in text and "(OUT)" in text


def test_the_gate_judges_the_plans_simulation_of_the_bench() -> None:
    """A bench's closed loop of one length runs in waves the closed-form figure (staggered arrivals)
    does not model: the gate compares the plan's simulated figure where there is one, and keeps the
    closed-form beside it; without a simulation, or at the calibration's own point, the closed-form."""
    from hwprofile.bench.accuracy import accuracy

    rows = [_row(4, [20.0], [400.0], [100.0])]
    pred = _pred("datasheet", 18, 150, 95)
    pred["simulated"]["ttft_ms"] = {**pred["simulated"]["ttft_ms"], "value": 410.0}
    f = accuracy({4: pred}, rows, "-")["points"][0]["figures"][1]
    assert (f["judged"], f["predicted"], f["closed_form"]) == ("simulated", 410.0, 150)
    assert f["error"] == pytest.approx(410 / 400 - 1)
    bare = {**pred, "simulated": None}
    g = accuracy({4: bare}, rows, "-")["points"][0]["figures"][1]
    assert (g["judged"], g["predicted"], g["closed_form"]) == ("closed-form", 150, 150)
    given_back = {**pred, "source": "calibration /x.json (bench ?, concurrency 4)"}
    h = accuracy({4: given_back}, rows, "-")["points"][0]["figures"][1]
    assert (h["judged"], h["predicted"]) == ("closed-form", 150)


def test_the_accuracy_gate_after_bench_unknown_then_calibrated_then_off(world) -> None:
    """A CPU plan predicts nothing before a calibration: the gate is unknown and says to calibrate;
    `bench --calibrate` stores the bench; the next bench's predictions are the plan's calibrated ones,
    judged; a server that turns 3 s slower to the first token fails the gate, naming TTFT."""
    from hwprofile.bench.accuracy import CALIBRATE, FIGURES

    sets = [*world["sets"], "speculative.method=none", "bench.concurrency=1"]
    slow = {"FAKEVLLM_BENCH_TTFT_MS_PER_CONCURRENCY": "300"}  # TTFT ~300 ms: above the fake's own jitter

    err: list[str] = []

    def bench(*extra: str, env: dict[str, str] | None = None) -> tuple[dict[str, Any], str]:
        r = hw(
            world,
            "--output",
            str(world["tmp"] / f"o{len(list(world['tmp'].glob('o*')))}"),
            *extra,
            sets=sets,
            env=env,
        )
        assert r.returncode == 0, r.stderr[-3000:]
        err.append(r.stderr)
        doc = json.loads((Path(r.stdout.strip().splitlines()[-1].split("results: ")[-1])).read_text())
        validate(doc)
        return doc, r.stdout

    doc, out = bench(env=slow)
    acc = doc["plans"][0]["accuracy"]
    assert (
        acc["state"] == "unknown" and acc["next_step"] == CALIBRATE and "a CPU has no datasheet" in acc["why"]
    )
    assert "accuracy gate UNKNOWN" in out and "gate: UNKNOWN: nothing predicted" in out
    doc, out = bench("--calibrate", env=slow)
    assert "calibration: concurrency 1: one measurement a point" in err[-1]
    assert doc["plans"][0]["accuracy"]["state"] == "unknown"  # predicted before this bench was stored
    assert list((world["tmp"] / "etc" / "calibration").glob("*.json"))
    doc, out = bench(env=slow)
    acc = doc["plans"][0]["accuracy"]
    (pt,) = acc["points"]
    row = doc["plans"][0]["summary"][0]
    for f, (key, metric, _) in zip(pt["figures"], FIGURES, strict=True):
        assert f["figure"] == key
        assert f["provenance"] == "calibrated" and f["source"].startswith("calibrated: ")
        assert f["measured"] == row["metrics"][metric]["median"]
        assert f["error"] == pytest.approx(f["predicted"] / f["measured"] - 1)
    mape = acc["mape"]
    assert acc["state"] == ("pass" if all(mape[k] <= 0.2 for k, _, _ in FIGURES) else "fail"), acc
    assert f"MAPE {mape['overall']:.1%} over all figures" in out
    # the server's first token 3 s later than when calibrated: TTFT is off, by about -90 %
    doc, out = bench(env={"FAKEVLLM_BENCH_TTFT_MS_PER_CONCURRENCY": "3300"})
    acc = doc["plans"][0]["accuracy"]
    assert acc["state"] == "fail" and acc["mape"]["ttft_ms"] > 0.8, acc
    assert acc["next_step"].startswith("calibrated already") and "TTFT p50 off by -" in acc["next_step"]
    assert "gate: FAIL" in out and "next: calibrated already" in out


VLLM_METRICS = """# HELP vllm:time_to_first_token_seconds Histogram of time to first token in seconds.
# TYPE vllm:time_to_first_token_seconds histogram
vllm:time_to_first_token_seconds_bucket{{engine="0",le="+Inf",model_name="m"}} {n}
vllm:time_to_first_token_seconds_count{{engine="0",model_name="m"}} {n}
vllm:time_to_first_token_seconds_sum{{engine="0",model_name="m"}} {ttft}
vllm:time_to_first_token_seconds_count{{engine="1",model_name="m"}} {n}
vllm:time_to_first_token_seconds_sum{{engine="1",model_name="m"}} {ttft}
# TYPE vllm:request_time_per_output_token_seconds histogram
vllm:request_time_per_output_token_seconds_count{{engine="0",model_name="m"}} {n2}
vllm:request_time_per_output_token_seconds_sum{{engine="0",model_name="m"}} {tpot}
# TYPE vllm:iteration_tokens_total histogram
vllm:iteration_tokens_total_count{{engine="0",model_name="m"}} {steps}
vllm:iteration_tokens_total_sum{{engine="0",model_name="m"}} {tokens}
"""


def test_the_servers_own_figures_from_its_histograms() -> None:
    """A point's server-side means: the increase of each histogram's sum over that of its count, summed
    over the engines; a histogram the server lacks, or one that went back (a restart), is None."""
    from hwprofile.bench.servermetrics import delta, parse_sums

    a = parse_sums(VLLM_METRICS.format(n=2, ttft=0.1, n2=2, tpot=0.02, steps=10, tokens=40))
    b = parse_sums(VLLM_METRICS.format(n=6, ttft=0.5, n2=6, tpot=0.08, steps=110, tokens=240))
    assert a["vllm:time_to_first_token_seconds"] == (0.2, 4.0)
    d = delta(a, b)
    assert d["ttft_ms"] == pytest.approx(0.8 / 8 * 1e3) and d["requests"] == 8
    assert d["tpot_ms"] == pytest.approx(0.06 / 4 * 1e3)
    assert d["tokens_per_step"] == pytest.approx(2.0) and d["steps"] == 100
    assert d["prefill_ms"] is None and d["itl_ms"] is None
    assert delta(b, a)["ttft_ms"] is None  # counters went back: a restart, no figure
    # no process counter (several API server processes share a multiprocess registry): unknown, not 0
    assert d["api_cpu_ms"] is None and d["output_tokens"] is None


def test_the_api_servers_own_cpu_and_the_tokens_generated_over_a_point() -> None:
    """The API server process's CPU (prometheus_client's process collector in the process serving
    /metrics) and vLLM's generated tokens: each counter's increase over the point, summed over the
    engines' series; one that went back (a restart) is None."""
    from hwprofile.bench.servermetrics import delta, parse_sums

    counters = (
        "# HELP process_cpu_seconds_total Total user and system CPU time spent in seconds.\n"
        "# TYPE process_cpu_seconds_total counter\n"
        "process_cpu_seconds_total {cpu}\n"
        "# TYPE vllm:generation_tokens counter\n"
        'vllm:generation_tokens_total{{engine="0",model_name="m"}} {t0}\n'
        'vllm:generation_tokens_total{{engine="1",model_name="m"}} {t1}\n'
        'vllm:generation_tokens_created{{engine="0",model_name="m"}} {created}\n'
    )
    hist = VLLM_METRICS.format(n=2, ttft=0.1, n2=2, tpot=0.02, steps=10, tokens=40)
    a = parse_sums(hist + counters.format(cpu=12.5, t0=100, t1=50, created=1.7e9))
    b = parse_sums(hist + counters.format(cpu=13.0, t0=400, t1=250, created=1.8e9))
    # the engines' series summed, the creation time's gauge never taken for the counter
    assert b["vllm:generation_tokens_total"] == (650.0, 1.0) and b["process_cpu_seconds_total"] == (13.0, 1.0)
    d = delta(a, b)
    assert d["api_cpu_ms"] == pytest.approx(500.0) and d["output_tokens"] == 500
    back = delta(b, a)
    assert back["api_cpu_ms"] is None and back["output_tokens"] is None


def test_repeats_measure_each_concurrency_again_after_one_uncounted_warmup(world) -> None:
    out = world["tmp"] / "rep"
    r = hw(
        world,
        "--workload",
        "sweep",
        "--repeats",
        "2",
        "--json",
        "--output",
        str(out),
        sets=[*world["sets"], "speculative.method=none", "bench.sweep_max=2"],
    )
    assert r.returncode == 0, r.stderr[-3000:]
    doc = json.loads(r.stdout)
    validate(doc)
    (run,) = doc["plans"][0]["runs"]
    assert [p["concurrency"] for p in run["points"]] == [1, 2, 1, 2]  # interleaved
    assert all(row["rounds"] == 2 for row in doc["plans"][0]["summary"])
    raw = out / "vllm-bench"
    assert (raw / "profile-r1-c2-warmup.json").exists() and (raw / "profile-r1-c2-k2.json").exists()
    assert not (raw / "profile-r1-c1-warmup.json").exists()  # one warm-up: the largest concurrency
    assert "warm-up (not counted)" in r.stderr
    # the fake server's own TTFT histogram: every request of the point, vllm bench serve's test one too
    for p in run["points"]:
        sm = p["server_metrics"]
        assert sm["requests"] == p["num_prompts"] + 1 and sm["ttft_ms"] > 0, sm
        # the server process's own CPU (the fake's: its process_cpu_seconds_total) and the tokens it made
        assert sm["api_cpu_ms"] is not None and sm["api_cpu_ms"] >= 0 and sm["output_tokens"] > 0, sm


@pytest.mark.parametrize(
    ("host", "model"),
    [
        ("a800-pcie-4x", "Qwen/Qwen3-8B"),  # four servers, a draft of the profile's choosing
        ("rtx3090-1x", "Qwen/Qwen3-32B"),  # the planner's own 4-bit checkpoint that fits
        ("rtx3090-1x", "Qwen/Qwen3.8-27B"),  # a hybrid with MTP layers, as loaded
    ],
)
def test_the_gate_predicts_with_the_plan_that_runs(host: str, model: str, tmp_path: Path) -> None:
    """At the plan's own workload, the gate's prediction is the plan's: the same model, checkpoint,
    draft and engine settings (what plan shows is what runs, and what the gate judges)."""
    from hwprofile.host.snapshot_io import snapshot_from_dict
    from hwprofile.pipeline import PlanInputs, predictions_at

    snap = snapshot_from_dict(json.loads((ROOT / "examples" / "hosts" / f"{host}.json").read_text()), host)
    inputs = PlanInputs(snap, str(tmp_path), None, (), (), model)
    plan = inputs.whole_plan()
    own = plan.instances[0].prediction
    w, n = own.workload, len(plan.instances)
    got = predictions_at(inputs, plan, w["input_len"], w["output_len"], (w["concurrency"], 1), front=True)
    p = got[w["concurrency"]]
    assert (p.ttft_ms, p.tpot_ms, p.source) == (own.ttft_ms, own.tpot_ms, own.source)
    assert p.output_tokens_per_s / n == pytest.approx(own.output_tokens_per_s, abs=0.1)
    assert got[1].workload["concurrency"] == 1 and got[1].tpot_ms <= p.tpot_ms
