"""Issue 33, what plans take from the hardware beyond NVML's flags: the recorded interconnect check's
measured link bandwidth in the performance model (and a stale record ignored, with the reason);
vLLM's own cached P2P test read by detection and used by the plan; a GPU already faulted at
detection not planned for. Detection runs through the real pynvml path on the fake NVML."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest

from hwprofile.host.interconnect import read_vllm_p2p, vllm_cache_root
from hwprofile.host.snapshot import Gpu, HostSnapshot
from hwprofile.host.snapshot_io import snapshot_from_dict
from hwprofile.interconnect.store import save_report
from hwprofile.model import resolve_model
from hwprofile.pipeline import interconnect_path
from hwprofile.pipeline import make_plan as _make_plan
from hwprofile.plan.candidates import host_fingerprint, model_shape
from hwprofile.plan.interconnect import Report, Run, SizeResult, vllm_p2p
from hwprofile.plan.predict import ACT_BYTES

HOST = "a800-pcie-4x-2numa"  # four A800 PCIe, TP 2 twice: (0, 1) and (2, 3)
PAIRS = "layout.tensor_parallel_size=2"  # the operator's TP 2 (the profile's gives way to 4 x TP 1 here)


def make_plan(*args, sets=(), **kw):
    return _make_plan(*args, sets=[PAIRS, *sets], **kw)


def run(group: tuple[int, ...], p2p: bool, outcome: str, gbs: float) -> Run:
    sizes = (SizeResult(32768, True, 1e-4, 0.3), SizeResult(1 << 26, outcome == "ok", 0.01, gbs))
    return Run(group, p2p, outcome, "" if outcome == "ok" else "planted", sizes)


def allreduce_term(inst) -> dict:
    return next(t for t in inst.prediction.terms if t["term"].startswith("decode step: 2 all-reduces"))


def tp2_candidate(plan, gpus: tuple[int, ...]) -> dict:
    group = next(g for g in plan.prediction["groups"] if set(gpus) <= set(g["gpus"]))
    return next(c for c in group["candidates"] if c["tensor_parallel_size"] == 2)


# -- 1. the measured link bandwidth in the performance model ---------------------------------------


def test_the_measured_link_bandwidth_replaces_the_datasheet_in_the_predictions(
    host_of, empty_root: Path
) -> None:
    host = host_of(HOST)
    before = make_plan(host, empty_root, environ={})
    a0 = before.instances[0]
    assert a0.gpus == (0, 1) and a0.tensor_parallel_size == 2
    sheet = allreduce_term(a0)
    assert not sheet["source"].startswith("measured")
    # a slow link measured on 0,1 only (1.5 GB/s, far below PCIe gen 4 x16's datasheet figure)
    report = Report(
        host_fingerprint(host),
        "nccl",
        (run((0, 1), True, "ok", 1.5), run((0, 1), False, "ok", 1.2)),
        "2026-12-04T20:00:00Z",
        "2.9.0",
        driver_version=host.driver.version,
        iommu=host.interconnect.iommu,
    )
    save_report(empty_root, host, report)
    plan = make_plan(host, empty_root, environ={})
    a, b = plan.instances
    got = allreduce_term(a)
    assert got["source"].startswith("measured: 1.50 GB/s") and "was snapshot: PCIe" in got["source"]
    assert got["ms"] > sheet["ms"]  # the slower measured link costs more per step
    assert a.prediction.tpot_ms > a0.prediction.tpot_ms
    assert a.interconnect["link_source"] == "measured" and a.interconnect["link_gbs"] == 1.5
    # the group the check did not cover keeps the datasheet link, and says it was never proven
    assert not allreduce_term(b)["source"].startswith("measured")
    assert b.interconnect["proven"] is None and b.interconnect["link_source"] == "datasheet"
    # the layout's TP candidates of that group were predicted over the measured link too
    assert tp2_candidate(plan, (0, 1))["tpot_ms"] > tp2_candidate(before, (0, 1))["tpot_ms"]
    keys = {r.key: r for r in plan.reasons}
    note = keys["interconnect.measurement"]
    assert note.value == "measured" and note.source == interconnect_path(empty_root, host)
    assert "2026-12-04T20:00:00Z" in note.reason


@pytest.mark.parametrize(
    ("change", "why"),
    [
        ({"driver_version": "410.48"}, "measured under NVIDIA driver 410.48"),
        ({"iommu": "translated"}, "measured with the IOMMU translated"),
    ],
)
def test_a_stale_measurement_is_ignored_with_the_reason(host_of, empty_root: Path, change, why: str) -> None:
    host = host_of(HOST)
    assert host.driver.version and host.driver.version != "410.48"
    host = host._replace(interconnect=host.interconnect._replace(iommu="passthrough"))
    fields = {"driver_version": host.driver.version, "iommu": "passthrough", **change}
    report = Report(
        host_fingerprint(host),
        "nccl",
        (run((0, 1), True, "wrong", 0.0), run((0, 1), False, "ok", 1.5)),
        **fields,
    )
    save_report(empty_root, host, report)
    plan = make_plan(host, empty_root, environ={})
    note = {r.key: r for r in plan.reasons}["interconnect.measurement"]
    assert note.value is None and why in note.reason and "doctor --interconnect" in note.reason
    a = plan.instances[0]
    assert not a.interconnect  # neither the decision (no P2P off) nor the bandwidth of a stale record
    assert not allreduce_term(a)["source"].startswith("measured")


# -- 3. vLLM's own P2P test, as its custom all-reduce cached it -----------------------------------


def write_cache(root: Path, devices: str, pairs: dict[str, bool]) -> None:
    root.mkdir(parents=True, exist_ok=True)
    (root / f"gpu_p2p_access_cache_for_{devices}.json").write_text(json.dumps(pairs, indent=4))


def test_vllm_cache_root_as_vllm_resolves_it() -> None:
    assert vllm_cache_root({"VLLM_CACHE_ROOT": "/x/y"}) == "/x/y"
    assert vllm_cache_root({"XDG_CACHE_HOME": "/c"}) == "/c/vllm"
    assert vllm_cache_root({"HOME": "/h"}).endswith(os.path.join(".cache", "vllm"))


def test_detection_reads_vllms_p2p_cache_bounded_and_safe(tmp_path: Path) -> None:
    gpus = (Gpu(index=0, uuid="GPU-a"), Gpu(index=1, uuid="GPU-b"), Gpu(index=2, uuid="GPU-c"))
    root = tmp_path / "vllm"
    env = {"VLLM_CACHE_ROOT": str(root)}
    assert read_vllm_p2p(gpus, env)[2].startswith("no vLLM cache directory")
    write_cache(root, "0,1", {"0->0": True, "0->1": False, "1->0": False, "1->1": True})
    write_cache(root, "GPU-b,GPU-c", {"0->1": True, "1->0": True})  # UUIDs, as hwprofile renders them
    write_cache(root, "7,8", {"0->1": True})  # GPUs this host does not have
    write_cache(root, "1,2", {"0->5": True})  # a position outside the list: not such a document
    os.mkfifo(root / "gpu_p2p_access_cache_for_0,2.json")  # a FIFO must not hang detection
    got_root, caches, why = read_vllm_p2p(gpus, env)
    assert got_root == str(root) and why is None
    by = {c.file: c for c in caches}
    c01 = by["gpu_p2p_access_cache_for_0,1.json"]
    assert (
        c01.gpu_indexes == (0, 1)
        and c01.denied == ("0->1", "1->0")
        and c01.allowed == ()
        and c01.unknown is None
    )
    cbc = by["gpu_p2p_access_cache_for_GPU-b,GPU-c.json"]
    assert cbc.gpu_indexes == (1, 2) and set(cbc.allowed) == {"0->1", "1->0"}
    assert by["gpu_p2p_access_cache_for_7,8.json"].gpu_indexes is None
    assert "none of this host's GPUs" in by["gpu_p2p_access_cache_for_7,8.json"].unknown
    assert "expected" in by["gpu_p2p_access_cache_for_1,2.json"].unknown
    assert "not a regular file" in by["gpu_p2p_access_cache_for_0,2.json"].unknown
    host = HostSnapshot(gpus=gpus)._replace(
        interconnect=HostSnapshot().interconnect._replace(vllm_cache_root=got_root, vllm_p2p=caches)
    )
    again = snapshot_from_dict(json.loads(host.to_json()), "test")  # the contract holds it
    assert again.interconnect.vllm_p2p == caches
    ok, why01 = vllm_p2p(host, (0, 1))
    assert ok is False and "0->1, 1->0" in why01 and "gpu_p2p_access_cache_for_0,1.json" in why01
    assert vllm_p2p(host, (1, 2))[0] is True
    assert vllm_p2p(host, (0, 2))[0] is None  # its file was refused: nothing known


def test_the_plan_turns_vllms_p2p_denial_into_no_custom_all_reduce(host_of, empty_root: Path) -> None:
    """Detection through the fake NVML reads the cache from VLLM_CACHE_ROOT; the TP group whose pair
    vLLM found without P2P runs without its custom all-reduce, and render says so."""
    from hwprofile.host.detect import detect_host
    from hwprofile.render.translate import render_instance
    from hwprofile.render.versions import release

    host_of(HOST)
    root = Path(os.environ["VLLM_CACHE_ROOT"])  # the fixture's own, not this user's
    write_cache(root, "0,1", {"0->1": False, "1->0": False})
    write_cache(root, "2,3", {"0->1": True, "1->0": True})
    host = detect_host()
    assert len(host.interconnect.vllm_p2p) == 2
    plan = make_plan(host, empty_root, environ={})
    a, b = plan.instances
    assert a.interconnect["vllm_p2p"] is False and a.interconnect["disable_custom_all_reduce"] is True
    assert a.interconnect["nccl_p2p_disable"] is False  # NCCL finds its own way; only vLLM's kernel needs P2P
    assert b.interconnect["vllm_p2p"] is True and b.interconnect["disable_custom_all_reduce"] is False
    assert a.interconnect["proven"] is None  # the all-reduce check itself has not run here
    reason = {r.key: r for r in plan.reasons}[f"instances.{a.name}.interconnect"].reason
    assert "found no peer access" in reason
    r = render_instance(plan, a, release("0.32.0"), "vllm", None)
    assert ("--disable-custom-all-reduce", None) in r.args
    rb = render_instance(plan, b, release("0.32.0"), "vllm", None)
    assert ("--disable-custom-all-reduce", None) not in rb.args
    from hwprofile.cli.views import format_interconnect

    text = format_interconnect(host, Report("f", "nccl", ()), [], None)  # doctor --interconnect's view
    assert "vLLM P2P cache gpu_p2p_access_cache_for_0,1.json (GPUs 0,1): no P2P for 0->1, 1->0" in text
    assert "gpu_p2p_access_cache_for_2,3.json (GPUs 2,3): P2P between every pair" in text


# -- 4. a GPU faulted at detection is not launched onto -------------------------------------------


@pytest.mark.parametrize(
    ("state", "kind"),
    [
        ({"dev1.ecc_uncorrected": 3}, "ecc_uncorrectable"),
        ({"dev1.remap_pending": 1}, "row_remap_pending"),
        ({"dev1.retired_pending": 1}, "retired_pages_pending"),
        ({"dev1.remap_failure": 1}, "row_remap_failure"),
    ],
)
def test_a_gpu_faulted_at_detection_is_not_planned_for(fake_host, empty_root: Path, state, kind: str) -> None:
    from hwprofile.host.detect import detect_host

    fh = fake_host(HOST)
    healthy = detect_host()
    assert all(g.faults == () for g in healthy.gpus)
    assert [i.gpus for i in make_plan(healthy, empty_root, environ={}).instances] == [(0, 1), (2, 3)]
    fh.set_state(**state)
    host = detect_host()
    g1 = host.gpus[1]
    assert [f.split(":")[0] for f in g1.faults] == [kind]
    assert (
        snapshot_from_dict(json.loads(host.to_json()), "test").gpus[1].faults == g1.faults
    )  # saved and read back
    plan = make_plan(host, empty_root, environ={})
    planned = {g for i in plan.instances for g in i.gpus}
    assert 1 not in planned and planned  # the others still serve
    keys = {r.key: r for r in plan.reasons}
    assert kind in keys["gpus[1].excluded"].reason and keys["gpus[1].excluded"].source == "snapshot"
    assert any(w.startswith("GPU 1 is faulted") and kind in w for w in plan.warnings)
    from hwprofile.cli.views import format_host

    assert f"FAULT: GPU 1: {kind}" in format_host(host) and "FAULT: GPU 0" not in format_host(host)


def test_faulted_gpus_elsewhere_and_everywhere(host_of, empty_root: Path) -> None:
    """A faulted GPU on another node of a multi-node plan is left out too, and the refusal says why
    the node has fewer GPUs; a host whose every GPU is faulted is refused (never a CPU plan)."""
    from hwprofile.plan import PlanRefused

    host = host_of(HOST)
    host = host._replace(software=host.software._replace(vllm_version="0.32.0"))
    bad = host._replace(gpus=tuple(g._replace(ecc_uncorrected=2) if g.index == 3 else g for g in host.gpus))
    big = "Qwen/Qwen3-235B-A22B"  # two 4x A800 hosts at TP 4 each; not with three GPUs on one of them
    ok = _make_plan(
        host,
        empty_root,
        environ={},
        model=big,
        sets=["speculative.method=none"],
        nodes=[host],
        addresses=["10.0.0.1", "10.0.0.2"],
    )
    assert [i.gpus for i in ok.instances] == [(0, 1, 2, 3), (0, 1, 2, 3)]
    with pytest.raises(PlanRefused) as refused:
        _make_plan(
            host,
            empty_root,
            environ={},
            model=big,
            sets=["speculative.method=none"],
            nodes=[bad],
            addresses=["10.0.0.1", "10.0.0.2"],
        )
    assert "does not fit" in refused.value.message
    assert "(node 1: GPU 3 is faulted (ecc_uncorrectable) and not planned for)" in refused.value.message
    dead = host._replace(gpus=tuple(g._replace(remapped_rows_pending=True) for g in host.gpus))
    with pytest.raises(PlanRefused, match="every GPU reported a hardware fault") as e:
        make_plan(dead, empty_root, environ={})
    assert "GPU 0 is faulted (row_remap_pending)" in e.value.message


# -- 1b. four GPUs through host memory: a recorded run replaces the shared-host central value ---------


def test_a_recorded_four_gpu_run_replaces_the_host_shared_link_in_the_tp4_prefill(
    host_of, empty_root: Path
) -> None:
    """Issue 38: on four RTX 3090 without P2P the all-reduce goes through host memory shared by four
    GPUs, each under its own PCIe host bridge of an AMD EPYC (NODE): the datasheet gives it (2/n)^3 of
    the two-GPU share, banded up to 2/n (interconnect.host_share). What tells is a recorded ``hwprofile
    doctor --interconnect`` run of the four: its bus bandwidth becomes the link's central value (not
    shared again; its bandwidth band +-10 %, test_predict_steps.py) and the prompt's all-reduce time
    follows it."""
    host = host_of("rtx3090-4x")
    model = str(Path(__file__).resolve().parents[1] / "examples" / "models" / "qwen3.8-27b-fp8")
    sets = [
        "layout.tensor_parallel_size=4",
        "layout.replicas=1",
        "layout.workload_input_len=8192",
        "layout.workload_output_len=128",
        "layout.workload_concurrency=1",
        "engine.max_num_batched_tokens=8192",
        "engine.kv_cache_dtype=fp8",
    ]

    def plan_tp4():  # type: ignore[no-untyped-def]
        plan = _make_plan(host, empty_root, environ={}, sets=sets, model=model)
        inst = plan.instances[0]
        assert inst.tensor_parallel_size == 4 and inst.gpus == (0, 1, 2, 3)
        return inst

    before = plan_tp4()
    sheet = allreduce_term(before)
    assert "host memory" in sheet["source"] and not sheet["source"].startswith("measured")
    lo, hi = sheet["band_ms"]
    # the shared-host band: (2/n)^3 .. 2/n of the two-GPU share, beside the ring steps' latency (the
    # same at both ends: interconnect.HOST_STEP_US); across the EPYC's host bridges the slow end is central
    assert hi / lo > 1.5 and "different PCIe host bridges (NODE)" in sheet["source"]
    gbs = 0.5  # a measured rate below the datasheet's central one
    report = Report(
        host_fingerprint(host),
        "nccl",
        (run((0, 1, 2, 3), False, "ok", gbs),),
        "2026-12-05T02:00:00Z",
        "2.9.0",
        driver_version=host.driver.version,
        iommu=host.interconnect.iommu,
    )
    save_report(empty_root, host, report)
    after = plan_tp4()
    got = allreduce_term(after)
    assert got["source"].startswith(f"measured: {gbs:.2f} GB/s") and "host memory" in got["source"]
    assert after.interconnect["link_source"] == "measured" and after.interconnect["link_gbs"] == gbs
    glo, ghi = got["band_ms"]
    assert glo <= got["ms"] <= ghi
    # the prompt's all-reduces (8192 tokens x hidden per layer) over 2 GB/s instead of the shared share
    pre = next(t for t in after.prediction.terms if t["term"].startswith("prefill:"))
    pre0 = next(t for t in before.prediction.terms if t["term"].startswith("prefill:"))
    assert pre["ms"] > pre0["ms"] and after.prediction.ttft_ms > before.prediction.ttft_ms
    # taken as measured, not divided among the four again: at twice the bandwidth the prompt saves
    # the bandwidth part of its all-reduces at that bandwidth (2 per layer per chunk, 2 (n - 1) / n of
    # the chunk's activations each), not twice that
    root2 = empty_root / "faster"
    root2.mkdir()
    fields = {"driver_version": host.driver.version, "iommu": host.interconnect.iommu}
    runs = (run((0, 1, 2, 3), False, "ok", 2 * gbs),)
    save_report(
        root2, host, Report(host_fingerprint(host), "nccl", runs, "2026-12-05T02:00:00Z", "2.9.0", **fields)
    )
    fast = _make_plan(host, root2, environ={}, sets=sets, model=model).instances[0]
    pre2 = next(t for t in fast.prediction.terms if t["term"].startswith("prefill:"))
    chunks, chunk = (int(x) for x in re.findall(r"\d+", pre["term"])[:2])
    shape = model_shape(resolve_model(model, "model"), 1)
    saved = 2 * shape.layers * chunks * 2 * 3 / 4 * chunk * shape.hidden * ACT_BYTES / (2 * gbs * 1e9) * 1e3
    assert pre["ms"] - pre2["ms"] == pytest.approx(saved, rel=0.05)
