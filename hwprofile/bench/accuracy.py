"""The accuracy gate after a benchmark (issue 32): what the plan that ran predicted against what was
measured, per figure (output tokens/s, TTFT, TPOT) and concurrency, each prediction with its
provenance and error band; the mean absolute percentage error per figure and over all, and a verdict
against a gate (MAPE <= 20 %, AIConfigurator's). Pure: the predictions come in (the plan's
``InstancePrediction`` as ``plan --json`` writes it, per concurrency), the document's summary rows
beside them. Each figure is judged on the plan's simulation of that bench point where it has one
(:func:`_judged`: the bench's closed loop runs in waves the closed-form figure does not model).

The states: ``pass`` (every figure's MAPE within the gate), ``fail`` (one is not: the next step says
what to do), ``noisy`` (the measurement's own spread over its rounds is wider than the gate: it cannot
judge the model; measure again, more rounds), ``unknown`` (nothing predicted: the reason and the next
step say why and how to get a prediction)."""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from typing import Any

GATE_MAPE = 0.20  # AIConfigurator's gate: a mean absolute percentage error of at most 20 %
GATE_SOURCE = "the accuracy gate of AIConfigurator (MAPE <= 20 %), issue 32"

# (the prediction's key, the measured summary metric, label): the medians a calibration is fitted on
FIGURES: tuple[tuple[str, str, str], ...] = (
    ("output_tokens_per_s", "output_throughput", "output tok/s"),
    ("ttft_ms", "p50_ttft_ms", "TTFT p50"),
    ("tpot_ms", "p50_tpot_ms", "TPOT p50"),
)
CALIBRATE = "run `hwprofile bench --calibrate` to make this host's calibration from a measurement"


def provenance(pred: Mapping[str, Any]) -> str:
    """Where a prediction's figures come from: ``measured`` (the calibration's own point given back),
    ``calibrated`` (a device fitted to, or the datasheet scaled by, this host's bench), ``fitted``
    (datasheet figures times efficiencies fitted to published measurements), ``datasheet``."""
    src = str(pred.get("source") or "")
    if src.startswith("calibration "):
        return "measured"
    if src.startswith(("calibrated", "datasheet scaled by")):
        return "calibrated"
    if any(t.get("basis") == "fitted" for t in pred.get("terms") or ()):
        return "fitted"
    return "datasheet"


def _band(pred: Mapping[str, Any], key: str) -> tuple[dict[str, Any] | None, str | None]:
    """The figure's error band: the plan's simulated figure (plan/simulate.py) and the validation
    set's predicted/measured ratios in its regime, as the range of measurements it expects."""
    sim = (pred.get("simulated") or {}).get(key)
    if not isinstance(sim, Mapping) or not isinstance(sim.get("value"), int | float):
        return None, "the plan simulated nothing at this point: no band"
    b = sim.get("band")
    if not b:
        return None, str(sim.get("band_unknown") or "no band")
    lo, hi, value = float(b["ratio_lo"]), float(b["ratio_hi"]), float(sim["value"])
    return (
        {
            "simulated": value,
            "ratio_lo": lo,
            "ratio_hi": hi,
            "measured_lo": value / hi if hi > 0 else None,
            "measured_hi": value / lo if lo > 0 else None,
            "regime": sim.get("regime"),
            "source": b.get("source"),
        },
        None,
    )


def _judged(pred: Mapping[str, Any], key: str) -> tuple[float | None, str]:
    """The figure the gate compares with the bench, and which it is: the plan's simulation of the
    bench's own closed loop (its clients and requests, of one length, sent in the waves ``vllm bench
    serve --max-concurrency`` sends them in: plan/simulate.py) where the plan simulated that point;
    else the plan's closed-form figure (the steady state of staggered arrivals). The calibration's own
    point given back (provenance ``measured``) is compared as it is."""
    closed = pred.get(key)
    sim = (pred.get("simulated") or {}).get(key)
    if provenance(pred) != "measured" and isinstance(sim, Mapping):
        value = sim.get("value")
        if isinstance(value, int | float) and value > 0:
            return float(value), "simulated"
    return closed, "closed-form"


def _figure(
    pred: Mapping[str, Any], key: str, metric: str, label: str, row: Mapping[str, Any]
) -> dict[str, Any]:
    m = (row.get("metrics") or {}).get(metric)
    predicted, judged = _judged(pred, key)
    out: dict[str, Any] = {
        "figure": key,
        "label": label,
        "metric": metric,
        "predicted": predicted,
        "judged": judged,
        "closed_form": pred.get(key),
        "measured": m["median"] if m else None,
        "measured_spread": (m["relative_spread"] if m and len(m["values"]) > 1 else None),
        "provenance": provenance(pred),
        "source": pred.get("source"),
        "error": None,
        "band": None,
        "band_unknown": None,
        "within_band": None,
    }
    if predicted is None or not m or not m["median"]:
        return out
    out["error"] = predicted / m["median"] - 1
    band, why = _band(pred, key)
    out["band"], out["band_unknown"] = band, why
    if band and band["measured_lo"] is not None and band["measured_hi"] is not None:
        out["within_band"] = band["measured_lo"] <= m["median"] <= band["measured_hi"]
    return out


def accuracy(
    predictions: Mapping[int, Mapping[str, Any] | None],
    summary: Sequence[Mapping[str, Any]],
    why_none: str,
    gate: float = GATE_MAPE,
) -> dict[str, Any]:
    """The gate over every measured concurrency: ``predictions`` (concurrency -> the plan's prediction
    there, None: none), ``summary`` (the plan's rows of bench.json), ``why_none``: why nothing was
    predicted, and what to do, where a prediction is missing."""
    points = []
    for row in summary:
        c = row["concurrency"]
        pred = predictions.get(c)
        if pred is None:
            points.append({"concurrency": c, "predicted": False, "figures": []})
            continue
        figs = [_figure(pred, k, m, lbl, row) for k, m, lbl in FIGURES]
        points.append(
            {"concurrency": c, "predicted": True, "workload": pred.get("workload"), "figures": figs}
        )
    mape: dict[str, float | None] = {}
    worst: dict[str, tuple[float, int]] = {}
    errors: list[float] = []
    for key, _, _ in FIGURES:
        errs = [
            (abs(f["error"]), p["concurrency"], f["error"])
            for p in points
            for f in p["figures"]
            if f["figure"] == key and f["error"] is not None
        ]
        mape[key] = statistics.fmean(e for e, _, _ in errs) if errs else None
        errors += [e for e, _, _ in errs]
        if errs:
            _, c, e = max(errs)
            worst[key] = (e, c)
    mape["overall"] = statistics.fmean(errors) if errors else None
    state, why, next_step = _verdict(points, mape, worst, why_none, gate)
    return {
        "gate_mape": gate,
        "gate_source": GATE_SOURCE,
        "state": state,
        "why": why,
        "next_step": next_step,
        "mape": mape,
        "points": points,
    }


def _verdict(
    points: list[dict[str, Any]],
    mape: Mapping[str, float | None],
    worst: Mapping[str, tuple[float, int]],
    why_none: str,
    gate: float,
) -> tuple[str, str, str | None]:
    """(state, why, the next step: None where there is nothing to do)."""
    if mape["overall"] is None:
        return "unknown", f"nothing predicted: {why_none}", _next_unknown(why_none)
    label = {k: lbl for k, _, lbl in FIGURES}
    off = [k for k, _, _ in FIGURES if (m := mape[k]) is not None and m > gate]
    figs = [f for p in points for f in p["figures"]]
    noisy = [
        f
        for f in figs
        if f["figure"] in off and f["measured_spread"] is not None and f["measured_spread"] / 2 > gate
    ]
    summary = ", ".join(f"{label[k]} {mape[k]:.0%}" for k, _, _ in FIGURES if mape[k] is not None)
    if noisy:
        w = max(noisy, key=lambda f: f["measured_spread"])
        return (
            "noisy",
            f"measurement too noisy (spread {w['measured_spread']:.0%} of {w['label']} over the rounds, "
            f"wider than the {gate:.0%} gate): the gate cannot judge the model (MAPE {summary})",
            "measure again on a quieter host, with more rounds (--rounds)",
        )
    if not off:
        return "pass", f"MAPE {summary}: every figure within the {gate:.0%} gate", None
    calibrated = all(f["provenance"] in ("calibrated", "measured") for f in figs if f["figure"] in off)
    parts = [
        f"{label[k]} off by {worst[k][0]:+.0%} at concurrency {worst[k][1]} (MAPE {mape[k]:.0%})" for k in off
    ]
    why = f"MAPE {summary}; beyond the {gate:.0%} gate: " + "; ".join(parts)
    if calibrated:
        return (
            "fail",
            why,
            "calibrated already, and still off: "
            + "; ".join(parts)
            + " (the model's mechanism for that figure misses this host: report it with this bench.json)",
        )
    return "fail", why, CALIBRATE


def _next_unknown(why_none: str) -> str | None:
    return None if "--url" in why_none else CALIBRATE


def lines(acc: Mapping[str, Any], label: str) -> list[str]:
    """The gate in the text report: one row per concurrency and figure, then the verdict."""
    out = [f"accuracy {label}: predicted vs measured (gate: MAPE <= {acc['gate_mape']:.0%})"]
    rows = [p for p in acc["points"] if p["figures"]]
    if rows:
        out.append(
            f"  {'conc':>5} {'figure':<13} {'predicted':>10} {'measured':>10} {'error':>7}  provenance, band"
        )
    for p in rows:
        for f in p["figures"]:
            if f["predicted"] is None:
                continue
            band = f["band"]
            b = (
                f"simulated {band['simulated']:.4g}, measured expected {band['measured_lo']:.4g}-"
                f"{band['measured_hi']:.4g} ({band['regime']})" + (" (in)" if f["within_band"] else " (OUT)")
                if band and band["measured_lo"] is not None and band["measured_hi"] is not None
                else "no band"
            )
            meas = f"{f['measured']:.4g}" if f["measured"] is not None else "-"
            err = f"{f['error']:+.0%}" if f["error"] is not None else "-"
            spread = f" ±{f['measured_spread'] / 2:.0%}" if f["measured_spread"] else ""
            kind = "sim" if f["judged"] == "simulated" else "closed"
            out.append(
                f"  {p['concurrency']:>5} {f['label']:<13} {f['predicted']:>10.4g} {meas + spread:>10} {err:>7}  "
                f"{f['provenance']} ({kind}), {b}"
            )
    m = acc["mape"]
    if m["overall"] is not None:
        per = ", ".join(f"{lbl} {m[k]:.1%}" for k, _, lbl in FIGURES if m[k] is not None)
        out.append(f"  MAPE {per}; overall {m['overall']:.1%}")
    out.append(f"  gate: {acc['state'].upper()}: {acc['why']}")
    if acc["next_step"]:
        out.append(f"  next: {acc['next_step']}")
    return out


def calibration_caveats(summary: Sequence[Mapping[str, Any]], gate: float = GATE_MAPE) -> list[str]:
    """What a calibration made from these rows (a plan's summary) is worth: one measurement per point
    (nothing to tell its noise by), or a spread over the rounds and repeats wider than the gate."""
    out = []
    for row in summary:
        for _, metric, label in FIGURES:
            m = (row.get("metrics") or {}).get(metric)
            if not m:
                continue
            if len(m["values"]) < 2:
                out.append(
                    f"concurrency {row['concurrency']}: one measurement a point, its noise unknown "
                    "(--repeats 3 measures it)"
                )
                break
            if m["relative_spread"] / 2 > gate:
                out.append(
                    f"concurrency {row['concurrency']}: {label} spread ±{m['relative_spread'] / 2:.0%} over "
                    f"{len(m['values'])} measurements, wider than the {gate:.0%} gate: the calibration is as "
                    "noisy (bench again on a quieter host, more --repeats)"
                )
    return out
