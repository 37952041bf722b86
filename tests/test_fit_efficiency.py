"""benchmarks/fit_efficiency.py: which points may pin the datasheet shares, and how a refit of one
family is written back (the others stay)."""

from __future__ import annotations

import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT / "benchmarks"), str(ROOT / "tools")]

import bench_predict  # noqa: E402
import fit_efficiency  # noqa: E402


def test_a_point_whose_all_reduce_band_is_wide_is_left_out_of_the_fit(
    fake_nvml_dir: Path, tmp_path: Path
) -> None:
    """The 4 x RTX 3090 TP4 point (no P2P: its all-reduce goes through host memory, the CPU shared by four
    GPUs, a band the snapshot cannot narrow) cannot tell the compute share from the collective's; the TP2 point (two GPUs, the
    two-copy share's band) can."""
    points = {p["id"]: p for p in bench_predict.load_points(bench_predict.MAIN)}
    pick = [points["3090x4-fp8-tp2-fp8kv-8k-c1"], points["3090x4-fp8-tp4-fp8kv-8k-c1"]]
    shared = [
        fit_efficiency.host_shared(bench_predict.plan_point(p, fake_nvml_dir, tmp_path)["prediction"])
        for p in pick
    ]
    assert shared == [False, True]
    keep, out = fit_efficiency.identifiable(pick, fake_nvml_dir, tmp_path)
    assert [p["id"] for p in keep] == ["3090x4-fp8-tp2-fp8kv-8k-c1"]
    assert out == [
        "3090x4-fp8-tp4-fp8kv-8k-c1 (all-reduce through host memory, shared by more than two GPUs)"
    ]


def test_a_refit_of_one_family_keeps_the_others_and_the_judgement_on_it() -> None:
    doc = yaml.safe_load(fit_efficiency.DATA.read_text())
    rows = doc["architectures"]
    fam = next(k for k, v in rows.items() if v.get("applied") is False)
    out = fit_efficiency.merged(doc, {fam: {"memory": 0.5, "compute": 0.5, "judged": None}})
    assert set(out) == set(rows)
    assert all(out[k] == v for k, v in rows.items() if k != fam)
    assert out[fam]["memory"] == 0.5 and out[fam]["applied"] is False
    assert out[fam]["why_not_applied"] == rows[fam]["why_not_applied"]
