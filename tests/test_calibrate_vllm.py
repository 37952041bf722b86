"""The calibrate-from-bench loop on real vLLM (the CPU build) and the tiny model (issue 32).

A CPU has no datasheet here: before a calibration the plan predicts nothing for it (unknown, not a
guess). `hwprofile bench --calibrate` at one concurrency stores the bench as this host's calibration;
the next plan's predictions come from a device fitted to it (plan/predict.py ``calibrated_device``),
marked calibrated. Then two other concurrencies and another ``max_num_batched_tokens`` are predicted
and measured with real `vllm bench serve`. The errors are printed beside the naive carry-over of the
benched point (what one knows without a model): the table goes in the report.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import pytest
from vllmtools import free_port, require_vllm

pytestmark = pytest.mark.slow  # real vLLM: minutes; the fast loop is `pytest -m 'not slow'`

BASE = [
    "engine.max_model_len=512",
    "cpu.kv_cache_space_gib=0.0625",
    "speculative.method=none",
    "bench.input_len=96",
    "bench.output_len=48",
    "layout.workload_input_len=96",
    "layout.workload_output_len=48",
    "bench.ttft_p99_target_ms=100000",
]
# held back: two other concurrencies, and another step budget (chunked prefill: a 96-token prompt in 2 steps)
TARGETS = [(2, None), (4, None), (2, 48)]


def _env(root: Path) -> dict[str, str]:
    keep = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("HWPROFILE_", "FAKE_NVML", "LD_LIBRARY_PATH"))
    }
    return {**keep, "HWPROFILE_CONFIG_ROOT": str(root)}


def _run(args: list[str], root: Path, timeout: int = 900) -> subprocess.CompletedProcess[str]:
    r = subprocess.run(
        [sys.executable, "-m", "hwprofile", *args],
        env=_env(root),
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-4000:]
    return r


def _sets(concurrency: int, batched: int | None) -> list[str]:
    out = [
        *BASE,
        f"bench.concurrency={concurrency}",
        f"bench.num_prompts={max(8, 3 * concurrency)}",
        f"layout.workload_concurrency={concurrency}",
    ]
    return out + ([f"engine.max_num_batched_tokens={batched}"] if batched else [])


def _flags(sets: list[str]) -> list[str]:
    return [x for s in sets for x in ("--set", s)]


def _prediction(model: Path, root: Path, concurrency: int, batched: int | None) -> dict[str, Any] | None:
    plan = json.loads(
        _run(["plan", "--json", "--model", str(model), *_flags(_sets(concurrency, batched))], root).stdout
    )
    return plan["instances"][0].get("prediction")


def _bench(
    model: Path, root: Path, out: Path, concurrency: int, batched: int | None, calibrate: bool = False
) -> dict[str, float]:
    runtime = Path(tempfile.mkdtemp(prefix="hwpcal-", dir="/tmp"))  # vLLM's IPC socket paths fit 107 bytes
    sets = [*_sets(concurrency, batched), f"server.port={free_port()}", f"logs.dir={out}-logs"]
    args = [
        "bench",
        "--model",
        str(model),
        "--workload",
        "seed",
        "--no-plot",
        "--json",
        "--output",
        str(out),
        "--runtime-dir",
        str(runtime),
        *_flags(sets),
    ] + (["--calibrate"] if calibrate else [])
    try:
        doc = json.loads(_run(args, root).stdout)
    finally:
        shutil.rmtree(runtime, ignore_errors=True)
    (row,) = doc["plans"][0]["summary"]
    m = row["metrics"]
    return {"tpot_ms": m["p50_tpot_ms"]["median"], "ttft_ms": m["p50_ttft_ms"]["median"]}


def test_bench_calibrate_predict_measure_on_real_vllm(tmp_path: Path) -> None:
    require_vllm()
    from hwprofile.launch.tinymodel import make_tiny_model

    model = make_tiny_model(tmp_path / "tiny")
    root = tmp_path / "etc"
    root.mkdir()
    # before: a CPU has no datasheet, so no prediction (unknown)
    assert _prediction(model, root, 2, None) is None
    benched = _bench(model, root, tmp_path / "b1", 1, None, calibrate=True)
    assert list((root / "calibration").glob("*.json")), "bench --calibrate stored nothing"
    rows = []
    for c, batched in TARGETS:
        p = _prediction(model, root, c, batched)
        assert p is not None and p["source"].startswith("calibrated: ")
        assert any(t.get("basis") == "calibrated" for t in p["terms"])
        got = _bench(model, root, tmp_path / f"b-{c}-{batched}", c, batched)
        sim = p["simulated"]
        rows.append(
            {
                "concurrency": c,
                "batched": batched,
                "measured": got,
                "predicted": {"tpot_ms": p["tpot_ms"], "ttft_ms": p["ttft_ms"]},
                "simulated": {"tpot_ms": sim["tpot_ms"]["value"], "ttft_ms": sim["ttft_ms"]["value"]},
                "carried_over": benched,
            }
        )
    lines = [
        f"benched at concurrency 1: TPOT {benched['tpot_ms']:.2f} ms, TTFT {benched['ttft_ms']:.1f} ms",
        "conc batched | figure  measured  calibrated (err)  simulated (err)  carried over (err)",
    ]
    errs: dict[str, list[float]] = {"predicted": [], "simulated": [], "carried_over": []}
    for r in rows:
        for fig in ("tpot_ms", "ttft_ms"):
            meas = r["measured"][fig]
            e = {k: r[k][fig] / meas - 1 for k in errs}
            for k in errs:
                errs[k].append(abs(e[k]))
            lines.append(
                f"{r['concurrency']:>4} {r['batched'] or 'plan':>7} | {fig:<7} {meas:9.2f}  "
                f"{r['predicted'][fig]:9.2f} ({e['predicted']:+.0%})  {r['simulated'][fig]:9.2f} "
                f"({e['simulated']:+.0%})  {r['carried_over'][fig]:9.2f} ({e['carried_over']:+.0%})"
            )
    table = "\n".join(lines)
    print(table)
    (Path(os.environ.get("HWPROFILE_CALIBRATE_REPORT", tmp_path / "report.txt"))).write_text(table + "\n")
    # the calibration drives the plan: at the benched concurrency the plan gives the measurement back
    at1 = _prediction(model, root, 1, None)
    assert at1 is not None and at1["tpot_ms"] == pytest.approx(benched["tpot_ms"], rel=0.03), table
    assert at1["ttft_ms"] == pytest.approx(benched["ttft_ms"], rel=0.03), table
    # Not asserted: the error at the held-back points. On this shared 2-core machine two runs disagreed by up
    # to 8x: TPOT 17.5 ms at 1 request falling to 8.5 at 4 in one, 2.3 rising to 17.2 in the other (the CPU
    # engine's step is the machine's load there, not the model's cost); neither the fitted step nor the
    # benched point carried over comes within the 10 % (the table above is the record).
    assert all(v > 0 for r in rows for k in ("predicted", "simulated") for v in r[k].values()), table
