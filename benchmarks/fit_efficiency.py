"""Fit the share of the datasheet each GPU architecture reaches (hwprofile/data/gpu_efficiency.yaml) to
the validation sets that are not held out (benchmarks/data/validation_serving.yaml and
validation_qwen38.yaml); the held-out sets are never read here.

    python benchmarks/fit_efficiency.py [--write] [--family Hopper]

Per architecture family (the gpus.yaml row's ``architecture`` before " ("), every (memory, compute) pair
of a grid is planned on each of that family's points with benchmarks/bench_predict.py's own planning;
the pair with the least sum of squared log(predicted / measured) over the figures wins (the simulated
figure where the plan simulated it, else the analytic one). ``--write`` puts the winners, their
10th-90th percentile residuals and the points they came from into the yaml.
"""

from __future__ import annotations

import argparse
import math
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "benchmarks"), str(ROOT / "tests"), str(ROOT / "tools")]

import bench_predict as bp  # noqa: E402
import yaml  # noqa: E402

DATA = ROOT / "hwprofile" / "data" / "gpu_efficiency.yaml"
MEMORY = (0.5, 0.6, 0.7, 0.8, 0.9)
COMPUTE = (0.15, 0.2, 0.25, 0.3, 0.35, 0.4, 0.5, 0.6, 0.7)


def family_of(gpu_name: str, by_chip: bool = False) -> str | None:
    from hwprofile.plan import gpufacts

    row = gpufacts.lookup(gpu_name)
    if not row or not row.get("architecture"):
        return None
    if not by_chip:
        return str(row["architecture"]).split(" (")[0]
    seg = gpufacts.segment(row)  # the key plan/gpufacts.efficiency tries first ("Ampere (GA102) GeForce")
    return f"{row['architecture']} {seg}" if seg else str(row["architecture"])


# A point whose all-reduce goes through host memory across more than two GPUs (plan/interconnect.py
# host_share: the CPU's throughput shared by the group, a band from (2 / n)^3 to the two-GPU share that the
# snapshot cannot narrow) cannot tell the compute share from the collective's at a prefill's sizes: it is
# left out of the fit (and says so). Read from the all-reduce term's own provenance.
HOST_SHARED = "through host memory: x"


def host_shared(pred: dict[str, Any]) -> bool:
    """Whether the prediction's all-reduce is the CPU-shared host-staged one."""
    t = next(
        (t for t in pred.get("terms") or () if t["term"] == "decode step: 2 all-reduces per layer"), None
    )
    return HOST_SHARED in str((t or {}).get("source", ""))


def identifiable(
    points: list[dict[str, Any]], lib: Path, work: Path
) -> tuple[list[dict[str, Any]], list[str]]:
    """The points whose figures can pin the efficiencies, and the ids of those left out (with why)."""
    keep, out = [], []
    for p in points:
        res = bp.plan_point(p, lib, work)
        if host_shared(res.get("prediction") or {}):
            out.append(f"{p['id']} (all-reduce through host memory, shared by more than two GPUs)")
        else:
            keep.append(p)
    return keep, out


def ratios(points: list[dict[str, Any]], lib: Path, work: Path) -> list[float]:
    out: list[float] = []
    for p in points:
        res = bp.plan_point(p, lib, work)
        if "prediction" not in res:
            continue
        for _name, meas, kind in bp.measured_rows(p):
            c = p["workload"]["concurrency"]
            v = bp.simulated(kind, res["prediction"], c)
            if v is None:
                v = bp.predicted(kind, res["prediction"], c)
            if v is not None and v > 0 and meas > 0:
                out.append(v / meas)
    return out


def fit(
    family: str,
    points: list[dict[str, Any]],
    lib: Path,
    work: Path,
    memory_only: bool = False,
    compute_only: bool = False,
) -> dict[str, Any]:
    from hwprofile.plan import gpufacts

    base = gpufacts.efficiency_table()
    best: tuple[float, float, float, list[float]] | None = None
    # --compute-only: the memory share the chip has without a row of its own (its family's, else the
    # default), for points whose figures cannot tell it (bursts: prefill-bound)
    held = gpufacts.efficiency(family.split(" GeForce")[0].split(" (")[0])["memory"]
    for mem in (held,) if compute_only else MEMORY:
        for comp in (base["default"]["compute"],) if memory_only else COMPUTE:
            doc = {
                **base,
                "architectures": {
                    **(base.get("architectures") or {}),
                    family: {"memory": mem, "compute": comp, "basis": "fitted", "source": "fit"},
                },
            }
            gpufacts.efficiency_table = lambda d=doc: d  # type: ignore[assignment]
            rs = ratios(points, lib, work)
            err = sum(math.log(r) ** 2 for r in rs)
            if best is None or err < best[0]:
                best = (err, mem, comp, rs)
    gpufacts.efficiency_table = lambda: base  # type: ignore[assignment]
    assert best is not None
    err, mem, comp, rs = best
    rs = sorted(rs)
    return {
        "memory": mem,
        "compute": comp,
        "basis": "fitted",
        "residuals": {
            "lo": round(rs[int(0.1 * (len(rs) - 1))], 3),
            "hi": round(rs[round(0.9 * (len(rs) - 1))], 3),
            "median": round(bp._median(rs), 3),
            "n": len(rs),
        },
        "points": sorted(p["id"] for p in points),
    }


def merged(doc: dict[str, Any], fits: dict[str, Any]) -> dict[str, Any]:
    """The yaml's architectures with ``fits`` in place of the families refitted: a family not refitted
    (``--family``) stays as it is; a refitted one keeps its ``applied: false`` and ``why_not_applied``
    (a judgement of the fit, made by a person) and loses ``judged`` (the held-out figures of the old fit)."""
    rows = dict(doc.get("architectures") or {})
    for fam, f in fits.items():
        old = rows.get(fam) or {}
        keep = {k: old[k] for k in ("applied", "why_not_applied") if k in old}
        rows[fam] = {**f, **keep}
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--write", action="store_true", help=f"write {DATA.relative_to(ROOT)}")
    ap.add_argument("--family", help="one architecture family")
    ap.add_argument(
        "--by-chip", action="store_true", help="fit each chip (Ampere (GA100)) rather than each family"
    )
    only = ap.add_mutually_exclusive_group()
    only.add_argument(
        "--memory-only",
        action="store_true",
        help="fit the memory share only; the compute share stays the default (AIConfigurator's measured kernels)",
    )
    only.add_argument(
        "--compute-only",
        action="store_true",
        help="fit the compute share only; the memory share stays the family's (points that cannot tell it)",
    )
    args = ap.parse_args(argv)
    from fakehost import compile_fake_nvml

    points = bp.load_points(bp.MAIN) + bp.load_points(bp.SERVING)  # never the held-out sets
    by: dict[str, list[dict[str, Any]]] = {}
    for p in points:
        fam = family_of(p["hardware"]["gpu"], args.by_chip)
        if fam:
            by.setdefault(fam, []).append(p)
    fits: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        lib = compile_fake_nvml(work / "lib").parent
        for fam, pts in sorted(by.items()):
            if args.family and fam != args.family:
                continue
            pts, left_out = identifiable(pts, lib, work)
            if not pts:
                continue
            f = fit(fam, pts, lib, work, args.memory_only, args.compute_only)
            if left_out:
                f["left_out"] = left_out
            gpus = sorted({p["hardware"]["gpu"] for p in pts})
            f["source"] = (
                f"fitted by benchmarks/fit_efficiency.py to {len(pts)} published vLLM measurements "
                f"({', '.join(gpus)}; benchmarks/data/validation_serving.yaml, validation_qwen38.yaml)"
            )
            fits[fam] = f
            print(
                f"{fam}: memory {f['memory']:.0%}, compute {f['compute']:.0%}; predicted/measured "
                f"median x{f['residuals']['median']:.2f}, 10-90 % x{f['residuals']['lo']:.2f}-x{f['residuals']['hi']:.2f} "
                f"over {f['residuals']['n']} figures of {len(pts)} points"
            )
    if args.write:
        text = DATA.read_text()
        head = text[: text.index("architectures:")]
        body = yaml.safe_dump(
            {"architectures": merged(yaml.safe_load(text), fits)}, sort_keys=True, width=120
        )
        DATA.write_text(head + body)
        print(f"wrote {DATA.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
