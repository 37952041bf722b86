"""A shipped profile's layout gives way to a candidate predicted at least 10 % better on the plan's
objective (plan/layout.py ``predicted_tp``, ``layout_gain``), an operator's never; a shipped replica
count never leaves a GPU idle; vLLM's custom all-reduce only over NVLink or PCIe P2P
(plan/interconnect.py ``custom_all_reduce``), rendered as ``--disable-custom-all-reduce`` otherwise.

The example snapshots (examples/hosts) and the config-only copy of the int4 Qwen3.8-27B
(examples/models) are planned as a newcomer would; the margin itself is moved around the ratio the
plan predicts, so the test follows the model rather than a number written here."""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import Any

import pytest

from hwprofile.host.snapshot import GpuLink, HostSnapshot
from hwprofile.host.snapshot_io import load_snapshot
from hwprofile.pipeline import make_plan
from hwprofile.plan import PlanRefused
from hwprofile.plan import predict as pm
from hwprofile.plan.interconnect import Report, Run, SizeResult, apply, custom_all_reduce
from hwprofile.render.translate import render_instance
from hwprofile.render.versions import release

ROOT = Path(__file__).resolve().parent.parent
HOSTS = ROOT / "examples" / "hosts"
INT4 = str(ROOT / "examples" / "models" / "qwen3.8-27b-int4")
LLAMA70 = "meta-llama/Llama-3.1-70B-Instruct"
lay = importlib.import_module("hwprofile.plan.layout")  # the module (hwprofile.plan exports the function)


def _plan(host: str, root: Path, model: str = INT4, sets: tuple[str, ...] = ()) -> Any:
    return make_plan(load_snapshot(HOSTS / f"{host}.json"), root, model=model, sets=list(sets), environ={})


def _reason(plan: Any, key: str) -> str:
    (why,) = [r.reason for r in plan.reasons if r.key == key]
    return why


def _layout(plan: Any) -> list[tuple[tuple[int, ...], int]]:
    """``[(GPUs, TP), ...]`` per TP group: a data-parallel server's ranks each count."""
    tp = [int(i.tensor_parallel_size) for i in plan.instances]
    return [
        (tuple(i.gpus[k : k + t]), t)
        for i, t in zip(plan.instances, tp, strict=True)
        for k in range(0, len(i.gpus), t)
    ]


def _group(plan: Any) -> dict[str, Any]:
    (g,) = plan.prediction["groups"]
    return g


# -- the margin, on the predictions alone ---------------------------------------------------------


def _pred(label: str, tp: int, cap: float = 0.0, tpot: float = 20.0, fits: bool = True) -> pm.Prediction:
    return pm.Prediction(
        label,
        tp,
        1,
        100.0,
        tpot,
        0.0,
        1,
        "datasheet",
        capacity_output_tokens_per_s=cap,
        fits=fits,
        why_not="" if fits else "does not fit",
    )


def test_throughput_gives_way_at_ten_per_cent_and_not_below() -> None:
    rule = _pred("1 x TP8", 8, cap=1000.0)
    ok, why = lay.layout_gain(_pred("4 x TP2", 2, cap=1100.0), rule, "throughput", (1000.0, 100.0))
    assert ok and "4 x TP2: 1100 output tok/s" in why and "1 x TP8: 1000 output tok/s" in why
    assert why.count("(datasheet)") == 2 and "at least the 10% margin" in why
    ok, why = lay.layout_gain(_pred("4 x TP2", 2, cap=1099.0), rule, "throughput", (1000.0, 100.0))
    assert not ok and "less than the 10% margin" in why
    # a shipped layout with no load within the targets gives way to one with any
    assert lay.layout_gain(_pred("1 x TP2", 2, cap=1.0), _pred("2 x TP1", 1), "throughput", (1000.0, 100.0))[
        0
    ]


def test_latency_compares_the_tpot() -> None:
    rule = _pred("2 x TP1", 1, tpot=40.0)
    assert lay.layout_gain(_pred("1 x TP2", 2, tpot=36.0), rule, "latency", (1000.0, 100.0))[0]
    ok, why = lay.layout_gain(_pred("1 x TP2", 2, tpot=36.5), rule, "latency", (1000.0, 100.0))
    assert not ok and "TPOT 36.5 ms" in why and "TPOT 40.0 ms" in why
    # throughput where the winner meets the targets at no load: how far from them at the workload (0.365x
    # the farther target against 0.4x: less than the margin)
    ok, why = lay.layout_gain(_pred("1 x TP2", 2, tpot=36.5), rule, "throughput", (1000.0, 100.0))
    assert not ok and "the farther target" in why


def test_no_load_within_the_targets_compares_how_far_from_them_as_predict_choose_ranks() -> None:
    """Where the winner meets the targets at no load, :func:`predict.choose` took the candidate closest to
    them at the workload: the shipped layout gives way where it is 10 % farther, whatever the TPOT."""
    rule = _pred("1 x TP4", 4, tpot=110.0)
    rule.ttft_ms = 9000.0  # 9x the TTFT target of 1000 ms
    best = _pred("4 x TP1", 1, tpot=140.0)
    best.ttft_ms = 1500.0  # 1.5x
    ok, why = lay.layout_gain(best, rule, "throughput", (1000.0, 100.0))
    assert ok and "4 x TP1: TTFT 1500 ms, TPOT 140.0 ms at the workload, 1.5x the farther target" in why
    assert "x6.00, at least the 10% margin" in why
    near = _pred("4 x TP1", 1, tpot=140.0)
    near.ttft_ms = 8500.0  # 8.5x against 9x: within the margin, the shipped layout stays
    assert not lay.layout_gain(near, rule, "throughput", (1000.0, 100.0))[0]


def test_a_shipped_layout_that_does_not_fit_gives_way() -> None:
    ok, why = lay.layout_gain(
        _pred("1 x TP2", 2, cap=10.0), _pred("2 x TP1", 1, fits=False), "throughput", (1000.0, 100.0)
    )
    assert ok and "2 x TP1 is not possible as configured (does not fit)" in why


# -- planned ---------------------------------------------------------------------------------------


def test_2x3090_int4_runs_tp2_with_both_predictions_in_the_reason(empty_root: Path) -> None:
    plan = _plan("rtx3090-2x", empty_root)
    assert plan.profile == "rtx3090-dual"
    assert _layout(plan) == [((0, 1), 2)]
    why = _reason(plan, "tensor_parallel_size")
    g = _group(plan)
    tp1 = next(c for c in g["candidates"] if c["tensor_parallel_size"] == 1)
    assert g["chosen_by"] == "prediction" and g["chosen"] == "1 x TP2"
    # both predictions, their sources and the shipped values (with the file and line) that give way
    assert "predicted 1 x TP2:" in why and f"against {tp1['layout']}:" in why
    assert why.count("(datasheet)") == 2 and "gives way" in why
    assert "layout.tensor_parallel_size=1 (builtin" in why and "rtx3090-dual.yaml:10" in why
    assert {i for inst in plan.instances for i in inst.gpus} == {0, 1}  # no GPU idle


@pytest.fixture(scope="module")
def h100_ratio(tmp_path_factory: pytest.TempPathFactory) -> float:
    """How much better the prediction holds its best layout than the shipped TP8 (Llama 70B, 8 x H100)."""
    plan = _plan("h100-sxm-8x", tmp_path_factory.mktemp("root"), LLAMA70)
    cands = {c["tensor_parallel_size"]: c for c in _group(plan)["candidates"]}
    best = max(c["capacity_output_tokens_per_s"] for c in cands.values() if c["fits"])
    assert cands[8]["capacity_output_tokens_per_s"] > 0 and best > cands[8]["capacity_output_tokens_per_s"]
    return best / cands[8]["capacity_output_tokens_per_s"]


def test_the_shipped_tp8_gives_way_above_the_margin_and_stays_below(
    h100_ratio: float, empty_root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(lay, "LAYOUT_MARGIN", h100_ratio - 1 - 0.02)
    moved = _plan("h100-sxm-8x", empty_root, LLAMA70)
    assert _group(moved)["chosen_by"] == "prediction" and moved.instances[0].tensor_parallel_size < 8
    assert "generic-nvlink.yaml" in _reason(moved, "tensor_parallel_size")
    monkeypatch.setattr(lay, "LAYOUT_MARGIN", h100_ratio - 1 + 0.02)
    kept = _plan("h100-sxm-8x", empty_root, LLAMA70)
    assert _layout(kept) == [(tuple(range(8)), 8)] and _group(kept)["chosen_by"] == "rule"
    why = _reason(kept, "layout.objective[0,1,2,3,4,5,6,7]")
    assert "less than the" in why and "the shipped value stays" in why and "1 x TP8:" in why


def test_an_operator_s_layout_never_gives_way(h100_ratio: float, empty_root: Path) -> None:
    assert h100_ratio >= 1.1  # the shipped TP8 does give way on this host (the test above)
    (empty_root / "overrides.d").mkdir()
    (empty_root / "overrides.d" / "10-site.yaml").write_text("layout:\n  strategy: tensor_parallel\n")
    p = _plan("h100-sxm-8x", empty_root, LLAMA70)
    assert _layout(p) == [(tuple(range(8)), 8)] and _group(p)["chosen_by"] == "rule"
    why = _reason(p, "layout.objective[0,1,2,3,4,5,6,7]")
    assert "an operator's layout never gives way" in why and "10-site.yaml" in why
    # --set on the 2 x 3090: TP1 stays, and the shipped replica count does not idle the second card
    p = _plan("rtx3090-2x", empty_root, sets=("layout.tensor_parallel_size=1",))
    assert _layout(p) == [((0,), 1), ((1,), 1)]
    assert "cli --set layout.tensor_parallel_size=1" in _reason(p, "layout.objective[0,1]")
    why = _reason(p, "layout.replicas")
    assert "shipped layout.replicas=1" in why and "never idles a GPU" in why and "[1]" in why


def _one_gpu(name: str) -> HostSnapshot:
    """The one-A100 example host with its card renamed (what detection says of another board)."""
    snap = load_snapshot(HOSTS / "a100-80g-pcie-1x.json")
    return snap._replace(gpus=tuple(g._replace(name=name) for g in snap.gpus))


SHIPPED = sorted(
    p.stem for p in (ROOT / "profiles").glob("*.yaml") if p.stem not in ("rules", "base", "cpu-only")
)


@pytest.mark.parametrize("profile", SHIPPED)
def _wide(profile: str) -> bool:
    """The profile's own file fixes a TP above 1, or the NUMA pairs that imply TP 2."""
    import yaml

    lay = yaml.safe_load((ROOT / "profiles" / f"{profile}.yaml").read_text()).get("layout") or {}
    tp = lay.get("tensor_parallel_size")
    return (isinstance(tp, int) and tp > 1) or lay.get("strategy") == "numa_pairs"


def test_the_profiles_include_one_that_fixes_a_wider_tp() -> None:
    assert [p for p in SHIPPED if _wide(p)] == ["a800-80g-pcie"]  # the case below is not empty


@pytest.mark.parametrize("profile", SHIPPED)
def test_a_shipped_tp_wider_than_the_host_gives_way(profile: str, empty_root: Path) -> None:
    """Each shipped profile, on one card: a TP (or a strategy implying one) wider than the host's GPUs
    gives way to what the host has, said with the profile's file and line; never a refusal."""
    plan = make_plan(
        _one_gpu("NVIDIA A800 80GB PCIe"), empty_root, profile=profile, model="Qwen/Qwen3-8B", environ={}
    )
    assert _layout(plan) == [((0,), 1)]
    why = _reason(plan, "tensor_parallel_size")
    assert ("gives way" in why) == _wide(profile), why
    if _wide(profile):
        assert f"{profile}.yaml:" in why and "gives way to 1: this host has 1 NVIDIA A800 80GB PCIe" in why


def test_a_strategy_implying_tp2_gives_way_if_shipped_and_is_refused_if_the_site_s(
    empty_root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (empty_root / "profiles").mkdir()
    (empty_root / "profiles" / "pairs.yaml").write_text(
        "description: NUMA pairs\nlayout:\n  strategy: numa_pairs\n"
    )
    host = _one_gpu("NVIDIA A800 80GB PCIe")
    with pytest.raises(PlanRefused, match="tensor_parallel_size=2 needs 2 GPUs of one model"):
        make_plan(host, empty_root, profile="pairs", model="Qwen/Qwen3-8B", environ={})
    monkeypatch.setattr(lay, "shipped", lambda r, key: True)  # as if a built-in profile set it
    plan = make_plan(host, empty_root, profile="pairs", model="Qwen/Qwen3-8B", environ={})
    assert _layout(plan) == [((0,), 1)]
    assert "the shipped strategy=numa_pairs (" in _reason(plan, "tensor_parallel_size")


def test_one_a800_plans_on_its_rule_s_profile_and_an_operator_s_tp2_is_refused(empty_root: Path) -> None:
    host = _one_gpu("NVIDIA A800 80GB PCIe")
    plan = make_plan(host, empty_root, model="Qwen/Qwen3-8B", environ={})
    assert plan.profile == "a800-80g-pcie" and _layout(plan) == [((0,), 1)]
    why = _reason(plan, "tensor_parallel_size")
    assert "the shipped tensor_parallel_size=2 (builtin profiles/a800-80g-pcie.yaml:" in why
    assert any("gives way to 1: this host has 1 NVIDIA A800 80GB PCIe" in w for w in plan.warnings)
    with pytest.raises(PlanRefused, match="tensor_parallel_size=2 needs 2 GPUs of one model") as e:
        make_plan(host, empty_root, model="Qwen/Qwen3-8B", sets=["layout.tensor_parallel_size=2"], environ={})
    assert "--set layout.tensor_parallel_size=1" in e.value.suggestions


def test_a_kept_shipped_tp1_on_2x3090_runs_two_instances_not_one_idle(
    empty_root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Where the shipped TP1 stays (a margin no candidate meets), the second card is a second
    instance with the reason; only an operator's replica count leaves it free, and says so."""
    monkeypatch.setattr(lay, "LAYOUT_MARGIN", 0.95)
    p = _plan("rtx3090-2x", empty_root, sets=("layout.objective=latency",))
    assert _layout(p) == [((0,), 1), ((1,), 1)] and _group(p)["chosen_by"] == "rule"
    assert "less than the 95% margin" in _reason(p, "layout.objective[0,1]")
    assert "never idles a GPU: 2 instances" in _reason(p, "layout.replicas")
    p = _plan("rtx3090-2x", empty_root, sets=("layout.objective=latency", "layout.replicas=1"))
    assert _layout(p) == [((0,), 1)] and "GPU(s) [1] stay free" in _reason(p, "layout.replicas")


# -- vLLM's custom all-reduce ----------------------------------------------------------------------


def _with_links(host: HostSnapshot, link: str, p2p: bool | None) -> HostSnapshot:
    n = len(host.gpus)
    links = tuple(GpuLink(a, b, link, p2p, p2p, p2p) for a in range(n) for b in range(a + 1, n))
    return host._replace(gpu_links=links)


def test_custom_all_reduce_only_over_nvlink_or_p2p() -> None:
    four = load_snapshot(HOSTS / "a800-pcie-4x.json")
    assert custom_all_reduce(_with_links(four, "NV12", True), [0, 1, 2, 3])[0] is True
    assert custom_all_reduce(_with_links(four, "PIX", True), [0, 1])[0] is True
    off, why = custom_all_reduce(_with_links(four, "PHB", False), [0, 1])
    assert off is False and "without P2P" in why and "0-1" in why
    off, why = custom_all_reduce(_with_links(four, "PIX", True), [0, 1, 2, 3])
    assert off is False and "two GPUs only" in why  # vLLM: not on more than two PCIe-only GPUs
    assert custom_all_reduce(_with_links(four, "PIX", None), [0, 1])[0] is None  # not read: vLLM decides
    assert custom_all_reduce(four, [0])[0] is None


def test_2x3090_renders_disable_custom_all_reduce_and_nvlink_does_not(empty_root: Path) -> None:
    plan = _plan("rtx3090-2x", empty_root)
    (inst,) = plan.instances
    assert inst.interconnect["disable_custom_all_reduce"] is True
    assert "without P2P" in _reason(plan, "instances[0].custom_all_reduce")
    assert "--disable-custom-all-reduce" in render_instance(plan, inst, release("0.33.0"), "vllm", None).argv
    nv = _plan("h100-sxm-8x", empty_root, LLAMA70)
    for i, inst in enumerate(nv.instances):
        assert _reason(nv, f"instances[{i}].custom_all_reduce").startswith("NVLink")
        assert (
            "--disable-custom-all-reduce"
            not in render_instance(nv, inst, release("0.33.0"), "vllm", None).argv
        )


def test_a_recorded_check_does_not_turn_it_back_on_without_p2p(empty_root: Path) -> None:
    """The interconnect check exact with P2P on does not override the driver's no-P2P report (vLLM
    trusts that report: VLLM_SKIP_P2P_CHECK=1 by default)."""
    plan = _plan("rtx3090-2x", empty_root)
    ok = Run((0, 1), True, "ok", "", (SizeResult(1 << 20, True, 0.001, 1.0),))
    (inst,) = apply(plan, Report("fp", "nccl", (ok,)), "recorded").instances
    assert (
        inst.interconnect["disable_custom_all_reduce"] is True and inst.interconnect["source"] == "recorded"
    )
    assert any("without P2P" in r for r in inst.interconnect["reasons"])
