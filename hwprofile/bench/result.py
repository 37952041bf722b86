"""The ``hwprofile.bench/1`` document (schemas/hwprofile.bench-1.schema.json): plans, their runs and
points with the hardware tags of each, summaries over rounds, the knee, the comparison, the plot."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from .accuracy import accuracy
from .compare import METRICS, Spread, compare, spread
from .knee import SweepPoint, find_knee
from .runner import Point
from .workloads import Workload

if TYPE_CHECKING:
    from ..plan.types import Plan

SCHEMA = "hwprofile.bench/1"
SUMMARY_METRICS = tuple(METRICS)


@dataclass
class BenchPlan:
    """One side of a benchmark: a plan to launch (``plan``) or a running server (``url``)."""

    label: str
    kind: str  # profile, baseline, overrides, url
    source: str | None  # the overrides file, the URL
    profile: str | None
    plan: Plan | None = None
    url: str | None = None
    non_default_settings: list[dict[str, Any]] = field(default_factory=list)
    runs: list[dict[str, Any]] = field(default_factory=list)
    # what the plan that runs predicts at each concurrency of the workload (``plan --json``'s
    # instance prediction; None: nothing predicted, ``predictions_why`` says why and what to do)
    predictions: dict[int, dict[str, Any] | None] = field(default_factory=dict)
    predictions_why: str = "no plan of hwprofile's: nothing predicted"

    def describe(self) -> dict[str, Any]:
        p = self.plan
        inst = p.instances[0] if p is not None and p.instances else None
        spec = inst.speculative if inst is not None else None
        return {
            "label": self.label,
            "kind": self.kind,
            "source": self.source,
            "profile": self.profile,
            "model": (p.model.path or p.model.name) if p is not None else None,
            # what a calibration made of this bench holds for: a model with these facts (plan/types.py)
            "model_facts": p.model.cost_facts() if p is not None else None,
            "draft": (p.draft.path or p.draft.name) if p is not None and p.draft is not None else None,
            "instances": len(p.instances) if p is not None else None,
            "max_num_seqs": inst.engine.max_num_seqs if inst is not None else None,
            "max_num_batched_tokens": inst.engine.max_num_batched_tokens if inst is not None else None,
            "max_model_len": inst.engine.max_model_len if inst is not None else None,
            "speculative": (
                {
                    "method": spec.method,
                    "model": spec.model,
                    "num_speculative_tokens": spec.num_speculative_tokens,
                    # k by the requests an instance runs, where the plan set such a table (else null)
                    "num_speculative_tokens_per_batch_size": (
                        [list(row) for row in spec.num_speculative_tokens_per_batch_size]
                        if isinstance(spec.num_speculative_tokens_per_batch_size, tuple)
                        else None
                    ),
                }
                if spec is not None
                else None
            ),
            "non_default_settings": self.non_default_settings,
        }

    def points_by_concurrency(self) -> dict[int, list[Point]]:
        out: dict[int, list[Point]] = {}
        for run in self.runs:
            for p in run["points"]:
                out.setdefault(p.concurrency, []).append(p)
        return out


def summary(plan: BenchPlan) -> list[dict[str, Any]]:
    """Per concurrency: each metric's median and range over the rounds, and the mean acceptance. A
    round whose streamed tokens reached the client merged (:meth:`.runner.Point.stream_merged`) has no
    latency in the medians (its throughput stays: every token was counted): ``merged_rounds`` says
    how many; with all merged, the row has no latency."""
    out = []
    for c, pts in sorted(plan.points_by_concurrency().items()):
        metrics: dict[str, Any] = {}
        merged = [p.stream_merged() is not None for p in pts]
        for name in SUMMARY_METRICS:
            timed = [p for p, m in zip(pts, merged, strict=True) if not (m and name.endswith("_ms"))]
            vals = [v for v in (p.metric(name) for p in timed) if v is not None]
            if vals:
                metrics[name] = spread(vals).to_json()
        rates = [
            p.spec_decode["acceptance_rate"]
            for p in pts
            if p.spec_decode and p.spec_decode["acceptance_rate"] is not None
        ]
        lens = [
            p.spec_decode["mean_acceptance_length"]
            for p in pts
            if p.spec_decode and p.spec_decode["mean_acceptance_length"] is not None
        ]
        out.append(
            {
                "concurrency": c,
                "rounds": len(pts),
                "merged_rounds": sum(merged),
                "metrics": metrics,
                "acceptance_rate": spread(rates).to_json() if rates else None,
                "mean_acceptance_length": spread(lens).to_json() if lens else None,
            }
        )
    return out


def knee_of(plan: BenchPlan, wl: Workload) -> dict[str, Any] | None:
    """The sweep's knee on the medians over rounds (None for a one-point workload)."""
    if len(wl.concurrencies) < 2:
        return None
    pts = []
    for row in summary(plan):
        m = row["metrics"]
        if "p99_ttft_ms" in m and "output_throughput" in m:
            pts.append(
                SweepPoint(row["concurrency"], m["p99_ttft_ms"]["median"], m["output_throughput"]["median"])
            )
    planned = (
        plan.plan.instances[0].engine.max_num_seqs if plan.plan is not None and plan.plan.instances else None
    )
    return find_knee(pts, wl.ttft_p99_target_ms, planned).to_json()


def comparison(a: BenchPlan, b: BenchPlan, wl: Workload) -> dict[str, Any]:
    """Ratios B/A per concurrency, rounds paired in order."""
    pa, pb = a.points_by_concurrency(), b.points_by_concurrency()
    per_c = []
    for c in wl.concurrencies:
        ra = [{m: p.metric(m) for m in METRICS} for p in pa.get(c, [])]
        rb = [{m: p.metric(m) for m in METRICS} for p in pb.get(c, [])]
        n = min(len(ra), len(rb))
        if not n:
            continue
        comps = compare(
            [{k: v for k, v in r.items() if v is not None} for r in ra[:n]],
            [{k: v for k, v in r.items() if v is not None} for r in rb[:n]],
        )
        per_c.append(
            {
                "concurrency": c,
                "rounds": n,
                "metrics": [x.to_json() for x in comps],
                "sentences": [x.sentence(a.label, b.label) for x in comps],
            }
        )
    return {"a": a.label, "b": b.label, "primary_concurrency": wl.primary, "per_concurrency": per_c}


def plot_series(
    plans: Sequence[BenchPlan],
) -> dict[str, list[tuple[int, tuple[float, float, float], tuple[float, float, float]]]]:
    out = {}
    for p in plans:
        rows = []
        for row in summary(p):
            m = row["metrics"]
            if "output_throughput" in m and "p99_ttft_ms" in m:
                t, f = m["output_throughput"], m["p99_ttft_ms"]
                rows.append(
                    (row["concurrency"], (t["median"], t["min"], t["max"]), (f["median"], f["min"], f["max"]))
                )
        if rows:
            out[p.label] = rows
    return out


def document(
    *,
    created: str,
    version: str,
    command: list[str],
    headline: str,
    throttled: bool,
    wl: Workload,
    host: dict[str, Any],
    plans: Sequence[BenchPlan],
    cmp: dict[str, Any] | None,
    plot: dict[str, Any] | None,
    plot_error: str | None,
    verdict: list[str],
    output_dir: str,
    error: str | None = None,
) -> dict[str, Any]:
    plans_json = []
    for p in plans:
        runs = []
        for r in p.runs:
            runs.append(
                {
                    "round": r["round"],
                    "order": r["order"],
                    "url": r["url"],
                    "started": r["started"],
                    "points": [
                        {**pt.to_json(), "hardware": hw}
                        for pt, hw in zip(r["points"], r["hardware"], strict=True)
                    ],
                }
            )
        rows = summary(p)
        plans_json.append(
            {
                **p.describe(),
                "runs": runs,
                "summary": rows,
                "knee": knee_of(p, wl),
                "accuracy": accuracy(p.predictions, rows, p.predictions_why),
            }
        )
    return {
        "schema": SCHEMA,
        "created": created,
        "hwprofile_version": version,
        "command": command,
        "headline": headline,
        "throttled": throttled,
        "workload": wl.to_json(),
        "host": host,
        "plans": plans_json,
        "compare": cmp,
        "plot": plot,
        "plot_error": plot_error,
        "verdict": verdict,
        "output_dir": output_dir,
        "error": error,
    }


def primary_spread(plan: BenchPlan, wl: Workload, metric: str) -> Spread | None:
    vals = [
        v
        for v in (p.metric(metric) for p in plan.points_by_concurrency().get(wl.primary, []))
        if v is not None
    ]
    return spread(vals) if vals else None
