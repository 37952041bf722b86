"""Issue 33 §1, the check before a TP plan's first start: groups never proven are checked, recorded
and planned again with what was found (P2P off where only that is right; refused where nothing is);
a proven group is not checked again; --skip-link-check and supervise.link_check=false skip it; a
check that cannot run (no PyTorch) starts the plan unproven. The last test runs the real harness
(gloo ranks on this CPU) with a fault planted only with P2P on."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from hwprofile.interconnect.check import run_group
from hwprofile.launch.linkcheck import prove_links, unproven_groups
from hwprofile.launch.start import Refused
from hwprofile.pipeline import PlanInputs, interconnect_path, load_interconnect
from hwprofile.plan.interconnect import Report, Run, SizeResult

HOST = "a800-pcie-4x-2numa"  # four A800 PCIe: TP 2 twice, (0, 1) and (2, 3)


def run(group: tuple[int, ...], p2p: bool, outcome: str, detail: str = "planted") -> Run:
    sizes = (SizeResult(32768, outcome == "ok", 1e-4, 0.3), SizeResult(1 << 26, outcome == "ok", 0.01, 9.0))
    return Run(group, p2p, outcome, "" if outcome == "ok" else detail, sizes if outcome != "hang" else ())


class Runner:
    """Stands in for run_check: records what it was asked, answers ``outcome(group, p2p)``."""

    def __init__(self, outcome) -> None:
        self.outcome, self.calls = outcome, []

    def __call__(self, groups, *, fingerprint: str, backend: str, **kw) -> Report:
        self.calls.append((list(groups), backend, kw))
        runs = tuple(run(tuple(g), p2p, self.outcome(tuple(g), p2p)) for g in groups for p2p in (True, False))
        return Report(
            fingerprint,
            backend,
            runs,
            "2026-12-04T22:00:00Z",
            None,
            driver_version=kw.get("driver_version"),
            iommu=kw.get("iommu"),
        )


def inputs_of(host_of, root: Path, sets: tuple[str, ...] = ()) -> tuple[PlanInputs, object]:
    # the operator's TP 2 (the profile's gives way to 4 x TP 1 on this host)
    inputs = PlanInputs(host_of(HOST), str(root), sets=("layout.tensor_parallel_size=2", *sets))
    return inputs, inputs.replan()


@pytest.fixture
def dev(tmp_path: Path) -> str:
    """A /dev with the fixture host's GPU device files (the fake NVML's GPUs have none here)."""
    d = tmp_path / "dev"
    d.mkdir()
    for name in ("nvidiactl", "nvidia0", "nvidia1", "nvidia2", "nvidia3"):
        (d / name).touch()
    return str(d)


def test_unproven_groups_are_checked_recorded_and_planned_again(host_of, empty_root: Path, dev: str) -> None:
    inputs, plan = inputs_of(host_of, empty_root)
    assert unproven_groups(plan) == [(0, 1), (2, 3)]
    said: list[str] = []
    runner = Runner(lambda g, p2p: "wrong" if (g == (0, 1) and p2p) else "ok")
    got = prove_links(plan, inputs, progress=said.append, runner=runner, dev_root=dev)
    ((groups, backend, kw),) = runner.calls
    assert groups == [(0, 1), (2, 3)] and backend == "nccl"
    assert (
        kw["deadline_s"] == 120.0 and kw["driver_version"] == inputs.host.driver.version
    )  # the setting's default
    a, b = got.instances
    assert (a.interconnect["nccl_p2p_disable"], a.interconnect["disable_custom_all_reduce"]) == (True, True)
    assert b.interconnect["proven"] is True and not b.interconnect["nccl_p2p_disable"]
    assert a.interconnect["source"] == interconnect_path(empty_root, inputs.host)
    assert load_interconnect(empty_root, inputs.host) is not None  # recorded for the host
    assert any("never proven" in m for m in said) and any("starts with NCCL_P2P_DISABLE=1" in m for m in said)
    # the next start finds both groups proven: no check
    again = Runner(lambda g, p2p: "ok")
    assert unproven_groups(inputs.replan()) == []
    prove_links(inputs.replan(), inputs, progress=said.append, runner=again, dev_root=dev)
    assert again.calls == []


@pytest.mark.parametrize(("driver", "kept"), [(None, True), ("410.48", False)])
def test_other_groups_of_the_record_are_kept_while_it_is_current(
    host_of, empty_root: Path, dev: str, driver: str | None, kept: bool
) -> None:
    """A record of the TP 4 group (another layout) stays beside the new runs; a record made under
    another driver does not: its runs would otherwise be relabelled with this driver."""
    from hwprofile.interconnect.store import save_report
    from hwprofile.plan.candidates import host_fingerprint

    inputs, plan = inputs_of(host_of, empty_root)
    host = inputs.host
    old = Report(
        host_fingerprint(host),
        "nccl",
        (run((0, 1, 2, 3), True, "ok"), run((0, 1, 2, 3), False, "ok")),
        driver_version=driver or host.driver.version,
    )
    save_report(empty_root, host, old)
    prove_links(plan, inputs, progress=lambda m: None, runner=Runner(lambda g, p2p: "ok"), dev_root=dev)
    rec = load_interconnect(empty_root, host)
    assert rec.driver_version == host.driver.version
    groups = {r.group for r in rec.runs}
    assert {(0, 1), (2, 3)} <= groups and ((0, 1, 2, 3) in groups) is kept


def test_a_group_wrong_or_hung_in_every_mode_is_refused(host_of, empty_root: Path, dev: str) -> None:
    inputs, plan = inputs_of(host_of, empty_root)
    runner = Runner(lambda g, p2p: "hang" if g == (2, 3) else "ok")
    with pytest.raises(Refused, match=r"GPUs 2,3 was wrong or hung with P2P on and off.*--skip-link-check"):
        prove_links(plan, inputs, progress=lambda m: None, runner=runner, dev_root=dev)
    assert load_interconnect(empty_root, inputs.host) is not None  # the finding is kept for `plan --explain`


@pytest.mark.parametrize("how", ["flag", "setting"])
def test_the_check_is_skipped_on_request(host_of, empty_root: Path, how: str, dev: str) -> None:
    inputs, plan = inputs_of(host_of, empty_root, ("supervise.link_check=false",) if how == "setting" else ())
    runner = Runner(lambda g, p2p: "hang")
    got = prove_links(plan, inputs, skip=how == "flag", progress=lambda m: None, runner=runner, dev_root=dev)
    assert runner.calls == [] and got is plan


def test_a_check_that_cannot_run_starts_the_plan_unproven(host_of, empty_root: Path, dev: str) -> None:
    inputs, plan = inputs_of(host_of, empty_root)
    said: list[str] = []

    def no_torch(groups, *, fingerprint, backend, **kw) -> Report:
        why = "rank 0 exited with status 1: ModuleNotFoundError: No module named 'torch'"
        return Report(
            fingerprint, backend, tuple(run(tuple(g), p, "error", why) for g in groups for p in (True, False))
        )

    got = prove_links(plan, inputs, progress=said.append, runner=no_torch, dev_root=dev)
    assert got is plan and any("cannot run here" in m and "No module named 'torch'" in m for m in said)
    assert load_interconnect(empty_root, inputs.host) is None  # nothing proven, nothing recorded


def test_an_nccl_error_in_every_mode_is_a_finding_not_a_missing_harness(
    host_of, empty_root: Path, dev: str
) -> None:
    inputs, plan = inputs_of(host_of, empty_root)
    runner = Runner(lambda g, p2p: "error")  # "planted": a rank failed inside the all-reduce
    with pytest.raises(Refused):
        prove_links(plan, inputs, progress=lambda m: None, runner=runner, dev_root=dev)


def test_gpus_this_process_cannot_reach_are_not_checked(host_of, empty_root: Path, dev: str) -> None:
    inputs, plan = inputs_of(host_of, empty_root)
    os.remove(os.path.join(dev, "nvidia3"))
    said: list[str] = []
    runner = Runner(lambda g, p2p: "ok")
    got = prove_links(plan, inputs, progress=said.append, runner=runner, dev_root=dev)
    assert got is plan and runner.calls == []
    assert any(f"{dev}/nvidia3 not here" in m and "start unproven" in m for m in said)


@pytest.mark.slow(minutes=0.5)
def test_the_real_harness_planted_wrong_with_p2p_degrades_the_start(
    host_of, empty_root: Path, dev: str
) -> None:
    """gloo ranks through the installed vLLM's PyTorch, one process each; rank 1 adds 1 only in the
    P2P-on runs: the record says P2P off, and the plan starts with NCCL_P2P_DISABLE=1."""
    inputs, plan = inputs_of(host_of, empty_root)

    def gloo(groups, *, fingerprint, backend, deadline_s, driver_version, iommu) -> Report:
        base = {k: v for k, v in os.environ.items() if k != "HWPROFILE_IC_PLANT"}
        runs = tuple(
            run_group(
                g,
                p2p=p2p,
                backend="gloo",
                sizes_bytes=(4096, 1 << 20),
                deadline_s=300.0,
                env={**base, "HWPROFILE_IC_PLANT": "wrong:1"} if p2p else base,
            )
            for g in groups
            for p2p in (True, False)
        )
        return Report(fingerprint, "gloo", runs, driver_version=driver_version, iommu=iommu)

    got = prove_links(plan, inputs, progress=lambda m: None, runner=gloo, dev_root=dev)
    rec = load_interconnect(empty_root, inputs.host)
    runs = [(r.group, r.p2p, r.outcome) for r in rec.runs]
    assert runs[:4] == [
        ((0, 1), True, "wrong"),
        ((0, 1), False, "ok"),
        ((2, 3), True, "wrong"),
        ((2, 3), False, "ok"),
    ]
    # planned again over the slower links (P2P off), the plan may take another shape (its draft then
    # misses the targets and gives way: one data-parallel server over the four GPUs); a group it has
    # that was never checked is checked the same way, with the same planted fault
    assert all(outcome == ("wrong" if p2p else "ok") for _, p2p, outcome in runs[4:]), runs
    assert {g for g, _, _ in runs[4:]} <= {tuple(i.gpus) for i in got.instances}, runs
    assert all(
        i.interconnect["nccl_p2p_disable"] and i.interconnect["link_source"] == "measured"
        for i in got.instances
    )
