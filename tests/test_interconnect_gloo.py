"""Issue 33 §1 for real: the interconnect check's all-reduce through the installed vLLM's own
PyTorch, gloo on this CPU machine, one process per rank: a correct run, a planted wrong result
(one rank adds 1) and a planted hang (one rank sleeps) that the deadline kills and reports as a
hang. The bounds are generous (a loaded 2-core machine starts torch slowly)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from hwprofile.host.snapshot import HostSnapshot
from hwprofile.interconnect.check import run_group
from hwprofile.pipeline import load_interconnect
from hwprofile.plan.interconnect import decide

pytestmark = pytest.mark.slow(minutes=1.5)  # real torch processes: seconds each, the hang its deadline

SIZES = (4096, 1 << 20)
GENEROUS_S = 300.0


def env_with(plant: str | None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "HWPROFILE_IC_PLANT"}
    if plant:
        env["HWPROFILE_IC_PLANT"] = plant
    return env


def test_a_correct_all_reduce_is_exact_and_timed() -> None:
    run = run_group(
        (0, 1, 2), p2p=True, backend="gloo", sizes_bytes=SIZES, deadline_s=GENEROUS_S, env=env_with(None)
    )
    assert run.outcome == "ok", run.detail
    assert [s.bytes for s in run.sizes] == list(SIZES)
    assert all(s.exact and s.seconds > 0 and s.bus_gbs > 0 for s in run.sizes)


def test_a_planted_wrong_result_is_caught() -> None:
    run = run_group(
        (0, 1, 2),
        p2p=False,
        backend="gloo",
        sizes_bytes=SIZES,
        deadline_s=GENEROUS_S,
        env=env_with("wrong:1"),
    )
    assert run.outcome == "wrong", run
    assert not any(s.exact for s in run.sizes)
    assert "rank 0: 1024 of 1024 elements" in run.detail  # every rank sees the sum off by one


def test_a_planted_hang_is_killed_at_the_deadline_and_reported() -> None:
    deadline = 60.0  # torch's start-up on a loaded machine fits; the sleeping rank never joins
    run = run_group(
        (0, 1), p2p=True, backend="gloo", sizes_bytes=SIZES, deadline_s=deadline, env=env_with("hang:1")
    )
    assert run.outcome == "hang", run
    assert "ranks not done: 0, 1" in run.detail
    assert run.wall_s is not None and deadline <= run.wall_s < deadline + GENEROUS_S
    # the whole process group is gone: none of this test's ranks is left (other tests may run theirs)
    out = subprocess.run(["ps", "-eo", "pid,ppid,args"], capture_output=True, text=True, check=True).stdout
    mine = [line.split(None, 2) for line in out.splitlines()[1:]]
    left = [m for m in mine if m[1] == str(os.getpid()) and "hwprofile.interconnect.worker" in m[2]]
    assert not left, left


def test_doctor_interconnect_records_the_result_for_plans(tmp_path: Path) -> None:
    host = HostSnapshot(hostname="cpu-box")
    snap = tmp_path / "host.json"
    snap.write_text(host.to_json())
    root = tmp_path / "etc"
    root.mkdir()
    cmd = [
        sys.executable,
        "-m",
        "hwprofile",
        "doctor",
        "--interconnect",
        "--json",
        "--from",
        str(snap),
        "--config-root",
        str(root),
        "--ranks",
        "2",
        "--deadline",
        str(GENEROUS_S),
    ]
    done = subprocess.run(cmd, capture_output=True, text=True, env=env_with(None), timeout=4 * GENEROUS_S)
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout)
    assert [(r["p2p"], r["outcome"]) for r in out["check"]["runs"]] == [(True, "ok"), (False, "ok")]
    report = load_interconnect(root, host)
    assert report is not None and report.backend == "gloo"
    assert decide(report, (0, 1)).proven is True
    text = subprocess.run(
        [a for a in cmd if a != "--json"],
        capture_output=True,
        text=True,
        env=env_with("wrong:0"),
        timeout=4 * GENEROUS_S,
    )
    assert text.returncode == 1
    assert "NOT SAFE" in text.stdout and "wrong" in text.stdout


def test_a_rank_that_dies_is_an_error_at_once_not_a_hang() -> None:
    run = run_group(
        (0, 1), p2p=True, backend="gloo", sizes_bytes=SIZES, deadline_s=GENEROUS_S, env=env_with("exit:1")
    )
    assert run.outcome == "error", run
    assert run.detail.startswith("rank 1 exited with status 3")
    assert run.wall_s is not None and run.wall_s < GENEROUS_S  # the survivor was not waited for
