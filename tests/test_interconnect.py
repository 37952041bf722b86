"""Issue 33 §1, the fast part: what the host says about peer-to-peer (IOMMU mode from a fake
procfs/sysfs, ACS control read from fake PCIe config space, NVML's P2P read/write/atomics through
the real pynvml path on the fake library), the recorded result (round trip, validation, per host)
and the pure decision the planner takes from it. The real all-reduce runs are in
test_interconnect_gloo.py."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from hwprofile.host.detect import detect_host
from hwprofile.host.interconnect import parse_acs, read_acs, read_iommu
from hwprofile.host.snapshot import Gpu, HostSnapshot
from hwprofile.host.snapshot_io import snapshot_from_dict
from hwprofile.interconnect.store import save_report
from hwprofile.pipeline import interconnect_path, load_interconnect, make_plan
from hwprofile.plan.interconnect import Report, Run, SizeResult, decide, report_from_dict

GPUS = (
    Gpu(index=0, pci_bus_id="00000000:03:00.0", uuid="GPU-a"),
    Gpu(index=1, pci_bus_id="00000000:04:00.0", uuid="GPU-b"),
)


def config_space(acs_ctrl: int | None, size: int = 4096) -> bytes:
    """A config space with, in the extended space, an AER capability (0x0001) then, when
    ``acs_ctrl`` is given, ACS (0x000D) whose control register is ``acs_ctrl``."""
    b = bytearray(size)
    if size >= 0x200:
        nxt = 0x140 if acs_ctrl is not None else 0
        b[0x100:0x104] = (0x0001 | (1 << 16) | (nxt << 20)).to_bytes(4, "little")
        if acs_ctrl is not None:
            b[0x140:0x144] = (0x000D | (1 << 16)).to_bytes(4, "little")
            b[0x144:0x146] = (0x5F).to_bytes(2, "little")  # capabilities
            b[0x146:0x148] = acs_ctrl.to_bytes(2, "little")
    return bytes(b)


def pcie_tree(root: Path, down_ctrl: int | None, config_size: int = 4096) -> Path:
    """Root port 00:01.0 → switch 01:00.0 → downstream ports 02:00.0 and 02:01.0 → GPUs 03:00.0, 04:00.0."""
    sysfs = root / "sys"
    top = sysfs / "devices" / "pci0000:00" / "0000:00:01.0" / "0000:01:00.0"
    paths = {
        "0000:00:01.0": top.parent,
        "0000:01:00.0": top,
        "0000:02:00.0": top / "0000:02:00.0",
        "0000:02:01.0": top / "0000:02:01.0",
        "0000:03:00.0": top / "0000:02:00.0" / "0000:03:00.0",
        "0000:04:00.0": top / "0000:02:01.0" / "0000:04:00.0",
    }
    bus = sysfs / "bus" / "pci" / "devices"
    bus.mkdir(parents=True)
    for bdf, path in paths.items():
        path.mkdir(parents=True, exist_ok=True)
        ctrl = down_ctrl if bdf.startswith("0000:02:") else 0x1D
        (path / "config").write_bytes(config_space(ctrl, config_size))
        os.symlink(path, bus / bdf)
    return sysfs


def test_acs_redirect_on_the_switch_ports_between_two_gpus(tmp_path: Path) -> None:
    sysfs = pcie_tree(tmp_path, down_ctrl=0x1D)  # SV | RR | CR | UF: what Linux sets with ACS on
    ports, why = read_acs(str(sysfs), GPUS)
    assert why is None
    assert [(p.bdf, p.gpu_indexes, p.acs_ctrl, p.redirect) for p in ports] == [
        ("0000:02:00.0", (0,), 0x1D, True),
        ("0000:02:01.0", (1,), 0x1D, True),
    ]  # the shared root port and switch upstream port are not between them


def test_acs_off_and_no_acs_capability(tmp_path: Path) -> None:
    ports, _ = read_acs(str(pcie_tree(tmp_path / "a", down_ctrl=0x01)), GPUS)  # source validation only
    assert [p.redirect for p in ports] == [False, False]
    ports, _ = read_acs(str(pcie_tree(tmp_path / "b", down_ctrl=None)), GPUS)
    assert [(p.acs_ctrl, p.redirect) for p in ports] == [(0, False), (0, False)]


def test_acs_unknown_without_root(tmp_path: Path) -> None:
    """A user without root reads only 64 bytes of config space: unknown, with the reason."""
    ports, _ = read_acs(str(pcie_tree(tmp_path, down_ctrl=0x1D, config_size=64)), GPUS)
    assert [(p.acs_ctrl, p.redirect) for p in ports] == [(None, None), (None, None)]
    assert all("needs root" in (p.unknown or "") for p in ports)


def test_parse_acs_survives_a_capability_loop() -> None:
    b = bytearray(4096)
    b[0x100:0x104] = (0x0001 | (0x100 << 20)).to_bytes(4, "little")  # points at itself
    assert parse_acs(bytes(b)) == (0, None)


@pytest.mark.parametrize(
    ("cmdline", "units", "group_type", "mode"),
    [
        ("ro quiet", None, None, "off"),
        ("intel_iommu=on iommu=pt", ["dmar0"], None, "passthrough"),
        ("intel_iommu=on", ["dmar0"], None, "translated"),
        ("amd_iommu=on", ["ivhd0"], "identity", "passthrough"),
        ("iommu=pt", ["ivhd0"], "DMA-FQ", "translated"),  # the group's type is what the kernel does
        ("intel_iommu=off", ["dmar0"], None, "off"),
    ],
)
def test_iommu_mode(
    tmp_path: Path, cmdline: str, units: list[str] | None, group_type: str | None, mode: str
) -> None:
    proc, sysfs = tmp_path / "proc", tmp_path / "sys"
    proc.mkdir()
    (proc / "cmdline").write_text(f"BOOT_IMAGE=/vmlinuz {cmdline}\n")
    (sysfs / "class" / "iommu").mkdir(parents=True)
    for u in units or ():
        (sysfs / "class" / "iommu" / u).mkdir()
    if group_type:
        g = sysfs / "bus" / "pci" / "devices" / "0000:03:00.0" / "iommu_group"
        g.mkdir(parents=True)
        (g / "type").write_text(group_type + "\n")
    got, evidence, got_units = read_iommu(str(proc), str(sysfs), GPUS)
    assert got == mode, evidence
    assert got_units == tuple(units or ())


def test_iommu_unknown_when_the_host_says_nothing(tmp_path: Path) -> None:
    (tmp_path / "proc").mkdir()
    (tmp_path / "sys" / "class").mkdir(parents=True)
    (tmp_path / "sys" / "class" / "iommu").write_text("")  # not a directory: unreadable
    mode, why, units = read_iommu(str(tmp_path / "proc"), str(tmp_path / "sys"), GPUS)
    assert mode is None and units is None
    assert "cmdline" not in why and "unreadable" in why


def test_nvml_p2p_write_and_atomics_per_pair(fake_host) -> None:
    """The real pynvml path asks each caps index; the fake answers write NOT_SUPPORTED (2) and
    atomics DISABLED_BY_REGKEY (3) for 0-1 while read is OK."""
    host = fake_host("rtx3090-2x")
    with open(host.state, "a") as f:
        f.write("p2p.0.1.0=0\np2p.0.1.1=2\np2p.0.1.3=3\n")  # read OK beside the pair-wide status
    snap = detect_host()
    (lk,) = snap.gpu_links
    assert (lk.p2p, lk.p2p_write, lk.p2p_atomics) == (True, False, False)
    again = snapshot_from_dict(json.loads(snap.to_json()))
    assert again == snap  # the interconnect facts survive the JSON round trip


def test_snapshot_round_trip_with_acs(tmp_path: Path) -> None:
    from hwprofile.host.interconnect import read_interconnect

    sysfs = pcie_tree(tmp_path, down_ctrl=0x1D)
    (tmp_path / "proc").mkdir()
    (tmp_path / "proc" / "cmdline").write_text("intel_iommu=on\n")
    ic = read_interconnect(str(tmp_path / "proc"), str(sysfs), GPUS)
    snap = HostSnapshot(gpus=GPUS, interconnect=ic)
    assert snapshot_from_dict(json.loads(snap.to_json())) == snap
    bad = json.loads(snap.to_json())
    bad["interconnect"]["iommu"] = "sometimes"
    with pytest.raises(ValueError, match="iommu"):
        snapshot_from_dict(bad)


def run(group: tuple[int, ...], p2p: bool, outcome: str, gbs: float = 10.0) -> Run:
    sizes = (
        SizeResult(32768, outcome != "wrong", 1e-4, 0.3),
        SizeResult(1 << 26, outcome != "wrong", 0.01, gbs),
    )
    return Run(group, p2p, outcome, "" if outcome == "ok" else "planted", sizes if outcome != "hang" else ())


def test_decide_from_the_recorded_runs() -> None:
    healthy = Report("f", "nccl", (run((0, 1), True, "ok", 20.0), run((0, 1), False, "ok", 9.0)))
    d = decide(healthy, [1, 0])
    assert (d.proven, d.disable_custom_all_reduce, d.nccl_p2p_disable, d.tp_unsafe, d.link_gbs) == (
        True,
        False,
        False,
        False,
        20.0,
    )
    broken_p2p = Report("f", "nccl", (run((0, 1), True, "wrong"), run((0, 1), False, "ok", 9.0)))
    d = decide(broken_p2p, [0, 1])
    assert (d.disable_custom_all_reduce, d.nccl_p2p_disable, d.tp_unsafe, d.link_gbs) == (
        True,
        True,
        False,
        9.0,
    )
    assert any("NCCL_P2P_DISABLE=1" in r for r in d.reasons)
    hopeless = Report("f", "nccl", (run((0, 1), True, "hang"), run((0, 1), False, "wrong")))
    d = decide(hopeless, [0, 1])
    assert d.proven is False and d.tp_unsafe and d.link_gbs is None
    assert decide(healthy, [2, 3]).proven is None  # another group: not checked
    assert decide(None, [0, 1]).proven is None
    assert decide(None, [0]).proven is True  # TP 1 needs no proof


def test_record_round_trip_per_host(tmp_path: Path) -> None:
    from hwprofile.plan.candidates import host_fingerprint

    host = HostSnapshot(hostname="h", gpus=GPUS)
    report = Report(
        host_fingerprint(host),
        "nccl",
        (run((0, 1), True, "ok"), run((0, 1), False, "hang")),
        "2026-12-04T20:00:00Z",
        "2.9.0",
    )
    assert load_interconnect(tmp_path, host) is None
    path = save_report(tmp_path, host, report)
    assert path == interconnect_path(tmp_path, host) and path.endswith(host_fingerprint(host) + ".json")
    assert load_interconnect(tmp_path, host) == report
    other = HostSnapshot(hostname="h", gpus=(GPUS[0]._replace(uuid="GPU-c"), GPUS[1]))
    os.makedirs(os.path.dirname(interconnect_path(tmp_path, other)), exist_ok=True)
    with open(interconnect_path(tmp_path, other), "w") as f:
        f.write(Path(path).read_text())
    # a record of other GPUs (copied here by hand) is read as it is; the planner ignores it (stale)
    from hwprofile.plan.interconnect import stale

    assert stale(load_interconnect(tmp_path, other), other, host_fingerprint(other)).startswith(
        "measured on other GPUs"
    )
    assert stale(report, host, host_fingerprint(host)) is None


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda d: d.update(schema="x"), "schema"),
        (lambda d: d["runs"][0].update(outcome="fine"), "outcome"),
        (lambda d: d["runs"][0]["sizes"][0].update(bus_gbs=float("nan")), "bus_gbs"),
        (lambda d: d["runs"][0].update(group=["0"]), "group"),
        (lambda d: d["runs"][0].update(p2p=1), "p2p"),
    ],
)
def test_a_damaged_record_is_refused_naming_the_field(change, message: str) -> None:
    doc = Report("f", "gloo", (run((0, 1), True, "ok"),)).to_dict()
    change(doc)
    with pytest.raises(ValueError, match=message):
        report_from_dict(doc, "x.json")


def test_a_plan_takes_the_recorded_decision_and_render_says_it(host_of, empty_root: Path) -> None:
    """A800 PCIe box, two TP-2 groups; the record says group 0,1 is wrong with P2P and exact
    without it, 2,3 hangs in both modes: 0,1 runs with NCCL_P2P_DISABLE=1 and without vLLM's custom
    all-reduce, 2,3 is flagged unsafe. Without a record the plan is what it was."""
    import jsonschema

    from hwprofile.plan.candidates import host_fingerprint
    from hwprofile.plan.types import Plan
    from hwprofile.render.translate import render_instance
    from hwprofile.render.versions import release

    host = host_of("a800-pcie-4x-2numa")
    PAIRS = ["layout.tensor_parallel_size=2"]  # the operator's pairs: the shipped TP 2 gives way here
    before = make_plan(host, empty_root, environ={}, sets=PAIRS)
    assert [i.gpus for i in before.instances] == [(0, 1), (2, 3)]
    assert all(not i.interconnect for i in before.instances)
    report = Report(
        host_fingerprint(host),
        "nccl",
        (
            run((0, 1), True, "wrong"),
            run((0, 1), False, "ok", 11.0),
            run((2, 3), True, "hang"),
            run((2, 3), False, "hang"),
        ),
    )
    save_report(empty_root, host, report)
    plan = make_plan(host, empty_root, environ={}, sets=PAIRS)
    a, b = plan.instances
    assert (a.interconnect["nccl_p2p_disable"], a.interconnect["disable_custom_all_reduce"]) == (True, True)
    assert a.interconnect["link_gbs"] == 11.0 and a.interconnect["source"] == interconnect_path(
        empty_root, host
    )
    assert b.interconnect["tp_unsafe"] is True
    assert any("smaller tensor_parallel_size" in w and "2,3" in w for w in plan.warnings)
    keys = {r.key: r for r in plan.reasons}
    assert "NCCL_P2P_DISABLE=1" in keys[f"instances.{a.name}.interconnect"].reason
    doc = plan.to_json()
    schema = json.loads(
        (Path(__file__).resolve().parent.parent / "schemas" / "hwprofile.plan-1.schema.json").read_text()
    )
    jsonschema.validate(doc, schema)
    assert Plan.from_json(json.loads(json.dumps(doc))).to_json() == doc
    r = render_instance(plan, a, release("0.32.0"), "vllm", None)
    assert r.env["NCCL_P2P_DISABLE"] == "1"
    assert ("--disable-custom-all-reduce", None) in r.args
    r0 = render_instance(before, before.instances[0], release("0.32.0"), "vllm", None)
    assert "NCCL_P2P_DISABLE" not in r0.env and ("--disable-custom-all-reduce", None) not in r0.args


def test_the_measured_bandwidth_replaces_the_datasheet_link() -> None:
    from hwprofile.plan import predict as pm
    from hwprofile.plan.interconnect import measured_link

    sheet = pm.link_of([("PXB", True)], [(4, 16), (4, 16)], None, 2)
    report = Report("f", "nccl", (run((0, 1), True, "wrong"), run((0, 1), False, "ok", 6.5)))
    got = measured_link(sheet, decide(report, (0, 1)))
    assert got.gbs == 6.5 and got.kind == sheet.kind and got.source.startswith("measured: 6.50 GB/s")
    assert pm.allreduce_ms(got, 2, 1 << 20) > pm.allreduce_ms(sheet, 2, 1 << 20)  # slower than the sheet
    assert measured_link(sheet, decide(None, (0, 1))) == sheet
