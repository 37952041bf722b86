"""A bench turned into predictions (issue 32's calibrate-from-bench loop): a candidate's figures scaled
by what ``hwprofile bench`` measured (:func:`calibrated`), and a device whose step costs reproduce that
measurement for a host without a datasheet, or to replace one (:func:`calibrated_device`). Pure: the
step model of :mod:`.predict` in, predictions out."""

from __future__ import annotations

import math
from collections.abc import Callable

from .predict import (
    LATENCY_TERM,
    Calibration,
    Candidate,
    Gpu,
    ModelShape,
    Prediction,
    Workload,
    predict,
)


def calibrated(
    p: Prediction, model_at_bench: Prediction | None, cal: Calibration, wl: Workload, same_config: bool
) -> Prediction:
    """``p`` from the measurement: the measured point itself where the candidate is the configuration
    measured at this workload, else ``p`` scaled by measured / modelled at the measured point (the TTFT's
    engine part; the latency the server's /metrics put outside the engine there added once, unscaled)."""
    pts = sorted(cal.points, key=lambda x: (abs(x[0] - wl.concurrency), x[0]))
    if not pts:
        return p
    c, tpot, ttft, tps = pts[0]
    where = f"calibration {cal.path} (bench {cal.created or '?'}, concurrency {c})"
    # the datasheet's fitted latency outside the engine gives way to the measurement, either way below
    kept = [t for t in p.terms if not str(t.get("term", "")).startswith(LATENCY_TERM)]
    if (
        same_config
        and c == wl.concurrency
        and (cal.input_len, cal.output_len) == (wl.input_len, wl.output_len)
    ):
        terms = [*kept, {"term": "measured", "ms": tpot, "source": where}]
        return Prediction(
            p.label, p.tp, p.instances, ttft, tpot, tps, p.per_instance_concurrency, where, terms
        )
    # the model's engine parts: the datasheet's fitted latency outside the engine is the measurement's
    # to replace, never scaled with the prompt
    engine_p = p.ttft_ms - p.latency_ms
    engine_at = model_at_bench.ttft_ms - model_at_bench.latency_ms if model_at_bench is not None else 0.0
    if model_at_bench is None or model_at_bench.tpot_ms <= 0 or engine_at <= 0:
        return p
    # the engine's part of the TTFT is scaled, the latency the server's /metrics put outside it added
    # once (scaled, a fixed latency would grow with the prompt); without /metrics the measured TTFT is
    # scaled whole
    outside = cal.outside_ms(c, ttft)
    f_tpot = tpot / model_at_bench.tpot_ms
    f_ttft = (ttft - outside) / engine_at
    said = f" + {outside:.1f} ms outside the engine (its /metrics)" if outside else ""
    terms = [
        *kept,
        {
            "term": f"scaled by the measurement: TPOT x{f_tpot:.2f}, TTFT x{f_ttft:.2f}{said}",
            "ms": round(outside, 3),
            "source": where + f": measured {cal.instances} x TP{cal.tp}",
        },
    ]
    ttft2, tpot2 = engine_p * f_ttft + outside, p.tpot_ms * f_tpot
    latency = ttft2 + (wl.output_len - 1) * tpot2
    tps2 = p.instances * p.per_instance_concurrency * wl.output_len / (latency / 1e3)
    return Prediction(
        p.label,
        p.tp,
        p.instances,
        ttft2,
        tpot2,
        tps2,
        p.per_instance_concurrency,
        "datasheet scaled by " + where,
        terms,
        latency_ms=outside,
    )


def calibrated_device(
    m: ModelShape, cand: Candidate, cal: Calibration, name: str, base: Gpu | None = None
) -> Gpu | None:
    """A device whose step costs reproduce what ``hwprofile bench`` measured on this host, for a host
    without a datasheet (a CPU) or to replace one: the fixed time of a step (the scheduler, the kernels'
    launches and, where ``base`` is None, the weights' read: constant per step) and the effective FLOPs
    of a token, fitted so that :func:`predict` at the bench's workload and lowest concurrency gives its
    median TPOT and the engine's part of its TTFT (each monotone in both: alternating bisections).

    The engine's part is the TTFT less the latency the server's /metrics put outside the engine at that
    concurrency (:attr:`Calibration.outside_latency`); what the fitted steps leave of the measured TTFT
    is kept as ``request_latency_ms`` (client, HTTP, tokenization, the hand-over to EngineCore): a
    prompt's tokens then cost what the engine spent on them, not that latency spread over them (which a
    step shared with other requests' decodes would charge to each of them). Without the server's
    figures the whole TTFT is fitted as the engine's (the latency: only what the steps cannot reach).
    ``base``: keep its bandwidth (the KV and weight reads then stay a memory term). None where the
    bench has no point."""
    if not cal.points:
        return None
    c0, tpot, ttft, _ = min(cal.points)
    wl = Workload(cal.input_len, cal.output_len, c0)
    engine_ttft, src = _engine_ttft(cal)
    bw = base.bandwidth_gbs if base is not None else 1e9  # no datasheet: the reads are in the fixed time

    def dev(fixed: float, tflops: float, latency_ms: float = 0.0) -> Gpu:
        return Gpu(
            name,
            bw,
            tflops,
            base.memory_bytes if base else 0,
            src,
            base.mem_efficiency if base else 1.0,
            1.0,
            src,
            "calibrated",
            fixed,
            latency_ms,
        )

    solve = _bisect
    fixed, tflops = tpot / 2, 1.0
    for _ in range(8):
        # TPOT grows with the fixed time; TTFT falls as the FLOPs grow

        def tpot_at(x: float, t: float = tflops) -> float:
            return predict(dev(x, t), m, cand, wl, None, per_instance=c0, wave=False).tpot_ms

        fixed = solve(tpot_at, tpot, 0.0, tpot, False)

        def ttft_at(x: float, f: float = fixed) -> float:
            return -predict(dev(f, x), m, cand, wl, None, per_instance=c0, wave=False).ttft_ms

        tflops = solve(ttft_at, -engine_ttft, 1e-6, 1e6, True)
    # the latency is what the steps leave of the measured TTFT (a prompt's step costs at least the
    # fixed time, which the TPOT set: the engine's part cannot always be reached)
    reached = predict(dev(fixed, tflops), m, cand, wl, None, per_instance=c0, wave=False).ttft_ms
    return dev(fixed, tflops, max(0.0, ttft - reached))


def _engine_ttft(cal: Calibration) -> tuple[float, str]:
    """The engine's part of the median TTFT at the calibration's lowest concurrency: less the latency
    measured outside the engine there (the whole TTFT where none was, or it is not below the TTFT),
    and the calibrated device's source, which says which."""
    c0, tpot, ttft, _ = min(cal.points)
    outside = cal.outside_ms(c0, ttft)
    said = (
        f", {outside:g} ms of it outside the engine (the server's /metrics)"
        if outside
        else ", the server's /metrics not below it: all of it taken as the engine's"
        if c0 in dict(cal.outside_latency)
        else ""
    )
    return ttft - outside, (
        f"calibrated: {cal.path} (bench {cal.created or '?'}, concurrency {c0}: TPOT {tpot:g} ms, "
        f"TTFT {ttft:g} ms{said})"
    )


def _bisect(f: Callable[[float], float], want: float, lo: float, hi: float, log: bool) -> float:
    """Where the increasing ``f`` reaches ``want`` between ``lo`` and ``hi`` (``log``: geometric steps)."""
    for _ in range(40):
        mid = math.sqrt(lo * hi) if log else (lo + hi) / 2
        if f(mid) < want:
            lo = mid
        else:
            hi = mid
    return math.sqrt(lo * hi) if log else (lo + hi) / 2
