"""hwprofile's predictions beside measured figures: AIConfigurator's cases (Qwen3-32B) and the
Qwen3.8-27B family's validation set of stock-vLLM measurements (benchmarks/data/).

    python benchmarks/bench_predict.py [--held-out] [--only ID] [--no-aiconfigurator] [--json FILE]

Each validation point is planned on its host (a fixture of tests/fixtures/hosts, detected through the
fake NVML as `hwprofile detect --json` would, with the point's vLLM release as the host's) with the
point's own settings: model copy (examples/models), TP, KV cache dtype, speculation, max_num_seqs,
batched tokens, context and workload. Per figure it prints measured, predicted and predicted/measured;
a point hwprofile cannot plan yet prints the measured figures and the refusal or error instead.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "tests"), str(ROOT / "tools")]

import yaml  # noqa: E402

DATA = ROOT / "benchmarks" / "data"
MAIN = DATA / "validation_qwen38.yaml"
HELD_OUT = DATA / "validation_qwen38_heldout.yaml"
SERVING = DATA / "validation_serving.yaml"  # issue 32: published `vllm bench serve` figures
SERVING_HELD_OUT = DATA / "validation_serving_heldout.yaml"
# a second held-out set, added after the mechanisms were in place (gpt-oss-120b: a model no set had)
SERVING_HELD_OUT2 = DATA / "validation_serving_heldout2.yaml"
BANDS = ROOT / "hwprofile" / "data" / "prediction_bands.yaml"
# issue 32's bars: primary figures (output tok/s, decode rates) within ±25 %, TPOT and TTFT within ±30 %
BAR = {"output": 0.25, "decode": 0.25, "decode_all": 0.25, "tpot": 0.30, "ttft": 0.30}
WITHIN = 0.25  # the bar for decode predictions on this set


def load_points(path: Path) -> list[dict[str, Any]]:
    doc = yaml.safe_load(path.read_text())
    assert doc.get("schema") == "hwprofile.validation/1", f"{path}: schema {doc.get('schema')!r}"
    points = list(doc["points"])
    # the set's endpoint (chat: its renderer's cost per request), where a point does not say its own
    if doc.get("endpoint"):
        for p in points:
            p["workload"].setdefault("endpoint", doc["endpoint"])
    return points


def host_snapshot(fixture: str, vllm: str, lib_dir: Path, work: Path) -> Any:
    """The fixture host as `detect --json` sees it, with ``vllm`` as the host's release."""
    import make_example_hosts as tool

    from hwprofile.host.snapshot_io import snapshot_from_dict

    data = tool.detect(fixture, lib_dir, work)
    data["driver"]["nvml_library"] = tool.NVML_LIBRARY
    data["software"] = {**tool.software(int(data["memory_bytes"])), "vllm_version": vllm}
    return snapshot_from_dict(data, source=f"fixture {fixture}")


def output_len_of(w: dict[str, Any]) -> int:
    """The run's mean output length: ``generated_tokens`` / ``num_prompts`` where the source says requests
    ended early (EOS before ``--random-output-len``), else ``output_len``."""
    if w.get("generated_tokens") and w.get("num_prompts"):
        return max(1, round(w["generated_tokens"] / w["num_prompts"]))
    return int(w["output_len"])


def settings_of(point: dict[str, Any]) -> list[str]:
    """`--set` values that make the plan the point's configuration (only what the source states)."""
    f, w = point.get("flags") or {}, point["workload"]
    sets = [
        f"layout.workload_input_len={w['input_len']}",
        f"layout.workload_output_len={output_len_of(w)}",
        f"layout.workload_concurrency={w['concurrency']}",
        "layout.replicas=1",
    ]
    if "tensor_parallel_size" in f:
        sets.append(f"layout.tensor_parallel_size={f['tensor_parallel_size']}")
    for key in ("max_num_seqs", "max_num_batched_tokens", "max_model_len", "gpu_memory_utilization"):
        if key in f:
            sets.append(f"engine.{key}={f[key]}")
    if "kv_cache_dtype" in f:
        sets.append(f"engine.kv_cache_dtype={f['kv_cache_dtype']}")
    if f.get("attention_backend"):
        sets.append(f"engine.attention_backend={f['attention_backend']}")
    if "enable_prefix_caching" in f:
        sets.append(f"engine.enable_prefix_caching={str(f['enable_prefix_caching']).lower()}")
    if "speculative" in f:
        spec = f["speculative"]
        if spec is None:
            sets.append("speculative.method=none")
        else:
            sets += [
                f"speculative.method={spec['method']}",
                f"speculative.num_speculative_tokens={spec['num_speculative_tokens']}",
                "speculative.by_batch_size=null",  # the point's k at every batch (a profile's table is not it)
            ]
            length = (point.get("measured") or {}).get("acceptance_length")
            if length:  # the run's own acceptance, so the figure judges the step costs, not a guess of it
                sets.append(
                    f"speculative.assumed_acceptance={acceptance_of(length, spec['num_speculative_tokens'])}"
                )
    return sets


def acceptance_of(length: float, k: int) -> float:
    """The per-token acceptance whose expected tokens per step at ``k`` is vLLM's logged mean acceptance
    length ``length`` (the planner's own conversion, as a calibration's bench gives it), to 3 places."""
    from hwprofile.plan.predict import acceptance_of_length

    return round(acceptance_of_length(length, k), 3)


def measured_rows(point: dict[str, Any]) -> list[tuple[str, float, str]]:
    """(figure, measured value, how the prediction is read) for each figure the source gives."""
    m, w = point["measured"], point["workload"]
    rows: list[tuple[str, float, str]] = []
    if "decode_tok_s" in m:
        rows.append(("decode tok/s (1 stream)", m["decode_tok_s"], "decode"))
    if "prefill_tok_s" in m:
        rows.append(("TTFT ms (input / prefill tok/s)", w["input_len"] / m["prefill_tok_s"] * 1000, "ttft"))
    if "decode_active_tok_s" in m:
        rows.append(("decode tok/s (all running)", m["decode_active_tok_s"], "decode_all"))
    if "output_tok_s" in m:
        rows.append(("output tok/s", m["output_tok_s"], "output"))
    if "ttft_ms" in m:
        rows.append(("TTFT ms", m["ttft_ms"], "ttft"))
    if "tpot_ms" in m:
        rows.append(("TPOT ms", m["tpot_ms"], "tpot"))
    return rows


def decode_step_ms(pred: dict[str, Any]) -> float | None:
    """The predicted time per output token of a step with every running request decoding and no
    prompt in it, from the prediction's own terms (the speculative step's where it speculates)."""
    terms = {t["term"]: t["ms"] for t in pred.get("terms") or ()}
    spec = next((ms for name, ms in terms.items() if name.startswith("speculation:")), None)
    if spec is not None:
        return spec
    mem = terms.get("decode step: weights + KV over bandwidth")
    if mem is None:
        return pred.get("tpot_ms")
    flops = terms.get("decode step: FLOPs over peak", 0.0)
    return (
        max(mem, flops)
        + terms.get("decode step: 2 all-reduces per layer", 0.0)
        + sum(ms for name, ms in terms.items() if name.endswith("gathered from the TP ranks"))
        + terms.get("decode step: fixed kernels and scheduler", 0.0)
    )


def predicted(kind: str, pred: dict[str, Any], concurrency: int) -> float | None:
    tpot = pred.get("tpot_ms")
    if kind == "decode":
        return 1000 / tpot if tpot else None
    if kind == "decode_all":  # a wave sent together: each request's own decode rate, summed
        wave = next((t for t in pred.get("terms") or () if t["term"].startswith("wave:")), None)
        return wave["tok_s"] if wave else None
    if kind == "output":
        return pred.get("output_tokens_per_s")
    if kind == "ttft":
        return pred.get("ttft_ms")
    if kind == "tpot":
        return tpot
    raise ValueError(kind)


def arrivals_of(point: dict[str, Any]) -> Any:
    """The point's arrival process for plan/simulate.py (a closed loop at its concurrency by default)."""
    from hwprofile.plan.simulate import Arrivals

    w = point["workload"]
    if "decode_active_tok_s" in point["measured"] and not w.get("arrival"):
        # the figure's protocol (QWEN38-FULL-COMPARISON.md, "Aggregate decode"; the server log sends the
        # cell's `concurrency` requests in the same second): one wave sent together, each request's own
        # decode rate summed
        return Arrivals("burst", w["concurrency"], w["input_len"], output_len_of(w))
    n = int(w.get("num_prompts") or max(8, 4 * w["concurrency"]))
    out = output_len_of(w)
    lengths = "sharegpt" if w.get("dataset") == "sharegpt" else "fixed"  # the dataset's spread (simulate.py)
    # the endpoint the runs called (the API server's cost per request: plan/servercost.py)
    ep = w.get("endpoint", "completions")
    if w.get("arrival") == "burst":
        return Arrivals("burst", n, w["input_len"], out, lengths=lengths, endpoint=ep)
    return Arrivals(
        "concurrency", n, w["input_len"], out, concurrency=w["concurrency"], lengths=lengths, endpoint=ep
    )


class simulated_as:
    """While planning ``point``, each instance's simulation runs the point's own arrivals."""

    def __init__(self, point: dict[str, Any]) -> None:
        self.arrivals = arrivals_of(point)

    def __enter__(self) -> None:
        import hwprofile.plan.candidates as cands

        self.orig = cands.simulated_figures
        arr = self.arrivals
        cands.simulated_figures = lambda *a, **k: self.orig(*a, **(k | {"arrivals": arr}))  # type: ignore[assignment]

    def __exit__(self, *exc: object) -> None:
        import hwprofile.plan.candidates as cands

        cands.simulated_figures = self.orig  # type: ignore[assignment]


def simulated(kind: str, pred: dict[str, Any], concurrency: int) -> float | None:
    """The simulated figure (plan/simulate.py through the plan's hook)."""
    sim = pred.get("simulated") or {}
    if not sim or "not_simulated" in sim:
        return None
    tpot = (sim.get("tpot_ms") or {}).get("value")
    if kind == "decode":
        return 1000 / tpot if tpot else None
    if kind == "decode_all":  # the wave's per-request decode rates, summed (plan/simulate.py)
        return (sim.get("decode_rate_sum_tok_s") or {}).get("value")
    if kind == "output":
        return (sim.get("output_tokens_per_s") or {}).get("value")
    if kind == "ttft":
        return (sim.get("ttft_ms") or {}).get("value")
    if kind == "tpot":
        return tpot
    raise ValueError(kind)


def regime_of(point: dict[str, Any]) -> str:
    w = point["workload"]
    if w.get("arrival") == "burst":
        return "burst"
    return "single" if w["concurrency"] == 1 else "loaded"


def plan_point(point: dict[str, Any], lib_dir: Path, work: Path) -> dict[str, Any]:
    """{'prediction': ..., 'instance': ...} or {'refused': reason} or {'error': what}."""
    from hwprofile.pipeline import make_plan

    ck = point.get("checkpoint") or {}
    model = str(ROOT / ck["example"]) if ck.get("example") else (ck["name"] if ck.get("catalog") else None)
    if not model:
        return {"refused": f"no config-only copy of {point['checkpoint']['name']} in examples/models"}
    try:
        host = host_snapshot(point["hardware"]["host"], str(point["vllm"]), lib_dir, work)
        root = work / "etc-hwprofile"
        root.mkdir(exist_ok=True)
        with simulated_as(point):
            plan = make_plan(host, root, environ={}, sets=settings_of(point), model=model).to_json()
    except Exception as e:  # a planner that cannot take the point yet: say why, do not stop the run
        return {"error": f"{type(e).__name__}: {e}"}
    if plan.get("refused"):
        return {"refused": plan["refused"]["reason"]}
    inst = plan["instances"][0]
    return {"prediction": inst.get("prediction") or {}, "instance": inst}


def report(points: list[dict[str, Any]], title: str, lib_dir: Path, work: Path) -> list[dict[str, Any]]:
    print(f"\n{title}: {len(points)} points (predicted / measured; within ±{WITHIN:.0%} marked ok)")
    out: list[dict[str, Any]] = []
    for p in points:
        hw = p["hardware"]
        f = p.get("flags") or {}
        spec = f.get("speculative")
        spec_s = f"{spec['method']} k={spec['num_speculative_tokens']}" if spec else "no spec"
        w = p["workload"]
        print(
            f"\n  {p['id']}\n    {hw['count']}x {hw['gpu']}, vLLM {p['vllm']}, {p['checkpoint']['name']}, "
            f"TP {f.get('tensor_parallel_size', '?')}, KV {f.get('kv_cache_dtype', 'not stated')}, {spec_s}; "
            f"{w['input_len']} in / {w['output_len']} out x {w['concurrency']}"
        )
        res = plan_point(p, lib_dir, work)
        row: dict[str, Any] = {"id": p["id"], "figures": []}
        for name, meas, kind in measured_rows(p):
            fig = {"figure": name, "kind": kind, "regime": regime_of(p), "measured": round(meas, 2)}
            if "prediction" in res:
                val = predicted(kind, res["prediction"], w["concurrency"])
                sv = simulated(kind, res["prediction"], w["concurrency"])
                if val is not None:
                    ratio = val / meas
                    fig |= {"predicted": round(val, 2), "ratio": round(ratio, 3)}
                    mark = "ok" if abs(ratio - 1) <= BAR[kind] else "OFF"
                    line = f"    {name:<32} {meas:>9.1f}  pred {val:>9.1f}  x{ratio:5.2f}  {mark:<3}"
                    if sv is not None:
                        sr = sv / meas
                        fig |= {"simulated": round(sv, 2), "sim_ratio": round(sr, 3)}
                        line += (
                            f" | sim {sv:>9.1f}  x{sr:5.2f}  {'ok' if abs(sr - 1) <= BAR[kind] else 'OFF'}"
                        )
                    print(line)
                    row["figures"].append(fig)
                    continue
            print(f"    {name:<32} {meas:>9.1f}  pred       -")
            row["figures"].append(fig)
        if "refused" in res:
            print(f"    not planned: {res['refused']}")
            row["refused"] = res["refused"]
        elif "error" in res:
            print(f"    not planned: {res['error']}")
            row["error"] = res["error"]
        else:
            inst = res["instance"]
            print(
                f"    plan: TP {inst.get('tensor_parallel_size')}, max_num_seqs "
                f"{(inst.get('engine') or {}).get('max_num_seqs')}, KV {(inst.get('engine') or {}).get('kv_cache_dtype')}"
            )
        out.append(row)
    figs = [f for r in out for f in r["figures"] if "ratio" in f]
    ok = sum(1 for f in figs if abs(f["ratio"] - 1) <= WITHIN)
    planned = sum(1 for r in out if "refused" not in r and "error" not in r)
    print(
        f"\n  {title}: {planned}/{len(out)} points planned; {ok}/{len(figs)} predicted figures within ±{WITHIN:.0%}"
    )
    summary(figs)
    return out


def _median(xs: list[float]) -> float:
    xs = sorted(xs)
    n = len(xs)
    return (xs[n // 2] if n % 2 else (xs[n // 2 - 1] + xs[n // 2]) / 2) if xs else float("nan")


def summary(figs: list[dict[str, Any]]) -> None:
    """Per figure and regime: how many within the issue's bar and the median ratio, the analytic model
    (pred) beside the simulation (sim)."""
    groups: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for f in figs:
        groups.setdefault((f["kind"], f["regime"]), []).append(f)
    print("    figure      regime   n | pred within  median | sim within  median")
    for (kind, reg), fs in sorted(groups.items()):
        bar = BAR[kind]
        pr = [f["ratio"] for f in fs]
        sr = [f["sim_ratio"] for f in fs if "sim_ratio" in f]
        pin = sum(1 for r in pr if abs(r - 1) <= bar)
        sin = sum(1 for r in sr if abs(r - 1) <= bar)
        sim_s = f"{sin:>3}/{len(sr):<3} ±{bar:.0%}  x{_median(sr):5.2f}" if sr else "   -"
        print(
            f"    {kind:<11} {reg:<7} {len(fs):>3} | {pin:>3}/{len(pr):<3} ±{bar:.0%}  x{_median(pr):5.2f} | {sim_s}"
        )


SET_NAMES = {
    "serving": ("serving", "validation_serving.yaml"),
    "serving_held_out": ("serving held-out", "validation_serving_heldout.yaml"),
    "serving_held_out2": ("serving held-out 2", "validation_serving_heldout2.yaml"),
    "main": ("qwen38", "validation_qwen38.yaml"),
    "held_out": ("qwen38 held-out", "validation_qwen38_heldout.yaml"),
}


def _cell(x: float | None) -> str:
    return "-" if x is None else f"{x:g}" if abs(x) < 1e4 else f"{x:.0f}"


def markdown(results: dict[str, Any]) -> str:
    """docs/validation-serving.md's tables from the rows: per set, figure and regime how many within the
    issue's bar and the median ratio (analytic "before", simulated "after"); then every figure."""
    out = [
        "| set | figure | regime | n | before: within | before: median | after: within | after: median |",
        "| --- | --- | --- | ---: | ---: | ---: | ---: | ---: |",
    ]
    for key, (name, _) in SET_NAMES.items():
        groups: dict[tuple[str, str], list[dict[str, Any]]] = {}
        for r in results.get(key, []):
            for f in r["figures"]:
                if "ratio" in f:
                    groups.setdefault((f["kind"], f["regime"]), []).append(f)
        for (kind, reg), fs in sorted(groups.items()):
            bar = BAR[kind]
            pr = [f["ratio"] for f in fs]
            sr = [f["sim_ratio"] for f in fs if "sim_ratio" in f]
            after = (
                f"{sum(abs(x - 1) <= bar for x in sr)} of {len(sr)} | ×{_median(sr):.2f}" if sr else "- | -"
            )
            out.append(
                f"| {name} | {kind} | {reg} | {len(fs)} | {sum(abs(x - 1) <= bar for x in pr)} | "
                f"×{_median(pr):.2f} | {after} |"
            )
    for key, (name, path) in SET_NAMES.items():
        if key not in results:
            continue
        out += [
            "",
            f"### {name} ({path})",
            "",
            "| point | figure | measured | before (analytic) | ratio | after (simulated) | ratio |",
            "| --- | --- | ---: | ---: | ---: | ---: | ---: |",
        ]
        for r in results[key]:
            for f in r["figures"]:
                if "ratio" not in f:
                    continue
                sim = (
                    f"| {_cell(f['simulated'])} | ×{f['sim_ratio']:.2f} |"
                    if "sim_ratio" in f
                    else "| - | - |"
                )
                out.append(
                    f"| {r['id']} | {f['figure'].split(' (input')[0]} | {_cell(f['measured'])} | {_cell(f['predicted'])} | "
                    f"×{f['ratio']:.2f} {sim}"
                )
    return "\n".join(out) + "\n"


def write_bands(figs: list[dict[str, Any]]) -> None:
    """hwprofile/data/prediction_bands.yaml: per regime and simulated figure, the 10th-90th percentile of
    simulated/measured on the main validation sets (never the held-out ones)."""
    names = {"ttft": "ttft_ms", "tpot": "tpot_ms", "output": "output_tokens_per_s"}
    regimes: dict[str, dict[str, Any]] = {}
    for f in figs:
        if "sim_ratio" not in f or f["kind"] not in names:
            continue
        regimes.setdefault(f["regime"], {}).setdefault(names[f["kind"]], []).append(f["sim_ratio"])
    doc: dict[str, Any] = {"regimes": {}}
    for reg, by in sorted(regimes.items()):
        for name, rs in sorted(by.items()):
            rs = sorted(rs)
            lo = rs[int(0.1 * (len(rs) - 1))]
            hi = rs[round(0.9 * (len(rs) - 1))]
            doc["regimes"].setdefault(reg, {})[name] = {
                "lo": round(lo, 3),
                "hi": round(hi, 3),
                "median": round(_median(rs), 3),
                "n": len(rs),
                "source": "benchmarks/bench_predict.py --write-bands: simulated/measured on benchmarks/data/"
                "validation_serving.yaml and validation_qwen38.yaml (10th-90th percentile)",
            }
    head = (
        "# Written by benchmarks/bench_predict.py --write-bands (issue 32): the simulation's error bands.\n"
    )
    BANDS.write_text(head + yaml.safe_dump(doc, sort_keys=True))
    print(f"\nwrote {BANDS.relative_to(ROOT)}")


def aiconfigurator_table() -> None:
    """The existing comparison (tests/test_predict.py): hwprofile vs AIConfigurator 0.12, Qwen3-32B."""
    from test_predict import comparison

    rows = comparison()
    print(f"AIConfigurator 0.12 vs hwprofile, Qwen/Qwen3-32B 512 in / 256 out ({len(rows)} cases)")
    print("    system    GPUs TP seqs |  TPOT AIC      hw       | tok/s AIC       hw")
    for r in rows:
        system, gpus, tp, seqs = r["key"]
        print(
            f"    {system:<9} {gpus:>4} {tp:>2} {seqs:>4} | {r['aic_tpot']:>8.1f} {r['hw_tpot']:>8.1f} "
            f"({r['tpot_err']:+.0%}) | {r['aic_tps']:>8.0f} {r['hw_tps']:>8.0f} ({r['tps_err']:+.0%})"
        )


def _sets(held_out: bool) -> list[tuple[str, list[dict[str, Any]], str]]:
    """(title, points, key) of each set to report: the main ones, then the held-out ones if asked."""
    files = [("validation set", MAIN, "main"), ("serving set", SERVING, "serving")]
    if held_out:
        files += [
            ("held-out", HELD_OUT, "held_out"),
            ("serving held-out", SERVING_HELD_OUT, "serving_held_out"),
            ("serving held-out 2", SERVING_HELD_OUT2, "serving_held_out2"),
        ]
    return [(f"{name} (benchmarks/data/{path.name})", load_points(path), key) for name, path, key in files]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--held-out", action="store_true", help="also the held-out points")
    ap.add_argument("--only", metavar="ID", help="one point (main or held-out) by id")
    ap.add_argument("--no-aiconfigurator", action="store_true", help="skip the AIConfigurator table")
    ap.add_argument("--json", metavar="FILE", help="also write the rows as JSON")
    ap.add_argument("--write-bands", action="store_true", help="write hwprofile/data/prediction_bands.yaml")
    ap.add_argument("--sets", default="all", help="qwen38, serving or all (default)")
    ap.add_argument("--markdown", metavar="FILE", help="also write docs/validation-serving.md's tables")
    args = ap.parse_args(argv)
    if not args.no_aiconfigurator and not args.only:
        aiconfigurator_table()
    from fakehost import compile_fake_nvml

    results: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        lib = compile_fake_nvml(work / "lib")
        sets = _sets(bool(args.held_out or args.only))
        if args.sets != "all":
            sets = [x for x in sets if (x[2].startswith("serving")) == (args.sets == "serving")]
        for title, points, key in sets:
            if args.only:
                points = [p for p in points if p["id"] == args.only]
                if not points:
                    continue
            results[key] = report(points, title, lib.parent, work)
    if args.only and not results:
        print(f"no point {args.only!r}", file=sys.stderr)
        return 2
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2) + "\n")
    if args.markdown:
        Path(args.markdown).write_text(markdown(results))
    if args.write_bands:
        # bands from the whole of both main sets, every point planned: a subset (--only, --sets) or a point
        # the planner could not take (an invalid data file) would write bands from what is left
        rows = [r for k in ("main", "serving") for r in results.get(k, [])]
        unplanned = [
            f"{r['id']}: {r.get('error') or r.get('refused')}" for r in rows if "error" in r or "refused" in r
        ]
        if args.only or args.sets != "all" or unplanned or not rows:
            why = (
                "; ".join(unplanned[:3]) or "--write-bands needs both main sets whole (no --only, --sets all)"
            )
            shown = BANDS.relative_to(ROOT) if BANDS.is_relative_to(ROOT) else BANDS
            print(f"\nnot written: {shown} ({why})", file=sys.stderr)
            return 1
        write_bands([f for r in rows for f in r["figures"] if "ratio" in f])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
