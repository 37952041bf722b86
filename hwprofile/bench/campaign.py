"""Run a benchmark: every plan for every round (two plans alternate A B, B A, …, one server at a
time, each launched fresh), every concurrency of the workload as one ``vllm bench serve`` under the
NVML sampler; then the summaries, the knee, the comparison, the plot, the JSON and the report.

The launching and the running of a point are passed in, so the whole flow is tested against fakes."""

from __future__ import annotations

import contextlib
import datetime
import json
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

from .. import __version__
from ..runtime.files import atomic_write
from .report import headline, text, verdict
from .result import BenchPlan, comparison, document, knee_of, plot_series
from .runner import Point, Target
from .tags import HardwareSampler, per_watt
from .workloads import Workload

# serve(plan) -> context manager yielding the Target of its first instance
Serve = Callable[[BenchPlan], contextlib.AbstractContextManager[Target]]
# run(target, workload, concurrency, out_dir, tag) -> Point
RunPoint = Callable[[Target, Workload, int, Path, str], Point]


def order(plans: Sequence[BenchPlan], rounds: int) -> Iterator[tuple[int, BenchPlan]]:
    """(round, plan) in run order: A B, then B A, alternating (one plan: every round in turn)."""
    for r in range(1, rounds + 1):
        seq = list(plans) if r % 2 == 1 else list(reversed(plans))
        for p in seq:
            yield r, p


def run_campaign(
    plans: Sequence[BenchPlan],
    wl: Workload,
    rounds: int,
    out_dir: Path,
    serve: Serve,
    run_point: RunPoint,
    sampler: Callable[[], HardwareSampler],
    progress: Callable[[str], None] = lambda m: None,
    repeats: int = 1,
) -> None:
    """Fill each plan's ``runs``: per round ``{round, order, url, started, points, hardware}``.
    ``repeats`` > 1: the server first answers one warm-up point at the workload's largest concurrency
    (its result kept beside the others as ``…-warmup``, not counted), then each concurrency is measured
    ``repeats`` times, the concurrencies interleaved (so a slow drift of the host falls on all of them
    alike); the summary's medians and spreads take them all."""
    raw = out_dir / "vllm-bench"
    raw.mkdir(parents=True, exist_ok=True)
    for n, (rnd, plan) in enumerate(order(plans, rounds), start=1):
        progress(f"round {rnd}/{rounds}: {plan.label}: starting")
        with serve(plan) as target:
            run: dict[str, Any] = {
                "round": rnd,
                "order": n,
                "url": target.url,
                "started": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
                "points": [],
                "hardware": [],
            }
            if repeats > 1:  # the server's first requests (its every batch size up to the largest)
                c = max(wl.concurrencies)
                progress(f"round {rnd}/{rounds}: {plan.label}: concurrency {c}: warm-up (not counted)")
                run_point(target, wl, c, raw, f"{_safe(plan.label)}-r{rnd}-c{c}-warmup")
            for k, c in ((k, c) for k in range(1, repeats + 1) for c in wl.concurrencies):
                rep = f" (repeat {k}/{repeats})" if repeats > 1 else ""
                progress(
                    f"round {rnd}/{rounds}: {plan.label}: concurrency {c}, {wl.prompts_at(c)} requests{rep}"
                )
                s = sampler()
                with s:
                    tag = f"{_safe(plan.label)}-r{rnd}-c{c}" + (f"-k{k}" if repeats > 1 else "")
                    point = run_point(target, wl, c, raw, tag)
                run["points"].append(point)
                hw = s.tags()
                hw["output_tokens_per_s_per_watt"] = per_watt(point.output_throughput, hw)
                run["hardware"].append(hw)
                eff = hw["output_tokens_per_s_per_watt"]
                progress(
                    f"round {rnd}/{rounds}: {plan.label}: concurrency {c}: {point.output_throughput:.1f} tokens/s, "
                    f"p99 TTFT {point.latency_ms['ttft']['p99'] or 0:.1f} ms"
                    + (f", {eff:.3f} tokens/s per W ({hw['power_w_mean']:.0f} W)" if eff is not None else "")
                )
            plan.runs.append(run)


def _safe(label: str) -> str:
    return "".join(ch if ch.isalnum() or ch in "-_." else "_" for ch in label)[:60] or "plan"


def finish(
    plans: Sequence[BenchPlan],
    wl: Workload,
    host: dict[str, Any],
    out_dir: Path,
    command: list[str],
    make_plot: bool = True,
    error: str | None = None,
) -> tuple[dict[str, Any], str]:
    """The result document (written to ``out_dir/bench.json``), the plot (``bench.png``) and the report
    text. ``error``: why the benchmark stopped early (what ran is still written)."""
    head, throttled = headline(plans)
    cmp = comparison(plans[0], plans[1], wl) if len(plans) == 2 else None
    knees = {p.label: knee_of(p, wl) for p in plans}
    plot_rec, plot_err = None, None
    if make_plot:
        from .plot import plot

        series = plot_series(plans)
        if series:
            try:
                plot_rec = plot(
                    series,
                    wl.ttft_p99_target_ms,
                    out_dir / "bench.png",
                    f"hwprofile bench {wl.name}: {wl.input_len} in / {wl.output_len} out, {host.get('hostname') or ''}",
                    {
                        k: v["recommended_max_num_seqs"]
                        for k, v in knees.items()
                        if v and v["breaks_at"] is not None and v["recommended_max_num_seqs"] is not None
                    },
                )
            except ImportError:
                plot_err = "matplotlib is not installed (pip install matplotlib)"
        else:
            plot_err = "no point with throughput and p99 TTFT"
    else:
        plot_err = "not drawn (--no-plot)"
    doc = document(
        created=datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        version=__version__,
        command=command,
        headline=head,
        throttled=throttled,
        wl=wl,
        host=host,
        plans=plans,
        cmp=cmp,
        plot=plot_rec,
        plot_error=plot_err,
        verdict=verdict(plans, wl, knees, cmp),
        output_dir=str(out_dir),
        error=error,
    )
    atomic_write(out_dir / "bench.json", json.dumps(doc, indent=2, default=str) + "\n")
    return doc, text(doc, plans)
