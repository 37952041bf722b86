"""Degrade steps go back through the planner as settings: seed 000's 82 °C rule (max_num_seqs
256 -> 192) as the A800 profile's first degrade step, fewer batched tokens, fewer proposals."""

from __future__ import annotations

from hwprofile.config.settings import Degrade
from hwprofile.pipeline import make_plan
from hwprofile.plan.degrade import degrade_overrides, degrade_sets

DEGRADE = {
    "max_num_seqs_factor": 0.75,
    "max_num_batched_tokens_factor": 0.75,
    "num_speculative_tokens_step": 1,
    "power_limit_factor": 0.85,
    "power_limit_hold_s": 60.0,
}


def test_seed_000_degrade_256_to_192_through_the_planner(host_of, empty_root) -> None:
    host = host_of("a800-pcie-4x-2numa")
    base_sets = ["engine.max_num_seqs=256"]  # seed 000 ran 256 sequences
    full = make_plan(host, empty_root, sets=base_sets, environ={})
    inst = full.instances[0]
    assert (
        inst.engine.max_num_seqs == 256 and inst.speculative and inst.speculative.num_speculative_tokens == 5
    )
    assert full.to_json()["degrade"] == DEGRADE  # the schema defaults, carried by the plan
    assert full.degrade == Degrade(**DEGRADE)
    sets, why = degrade_sets(inst, 1, full.degrade)
    assert "engine.max_num_seqs=192" in sets and any("256 -> 192" in w for w in why)
    hot = make_plan(host, empty_root, sets=[*base_sets, *sets], environ={}).to_json()
    d = hot["instances"][0]
    assert d["engine"]["max_num_seqs"] == 192
    assert d["engine"]["max_num_batched_tokens"] == 6144
    assert d["speculative"]["num_speculative_tokens"] == 4
    assert d["speculative"]["num_speculative_tokens_per_batch_size"] == [[1, 8, 4], [9, 64, 2], [65, None, 1]]
    # as --set texts (what an operator would type to pin the step), the values come from --set
    reasons = {r["key"]: r for r in hot["reasons"]}
    assert "--set engine.max_num_seqs=192" in reasons["instances[0].engine.max_num_seqs"]["source"]
    # step 2 goes deeper; step 0 is the full profile
    sets2, _ = degrade_sets(inst, 2, Degrade(**DEGRADE))
    assert "engine.max_num_seqs=144" in sets2
    assert degrade_sets(inst, 0, Degrade(**DEGRADE)) == ([], [])


def test_a_degraded_value_names_the_degrade_layer_as_its_source_not_a_set(host_of, empty_root) -> None:
    """The daemon's degrade step is a typed layer of its own: the plan's provenance, reasons and explain
    say "degrade step 1 (GPU 3 ...)" for the values it set, and --set only for what the operator typed."""
    host = host_of("a800-pcie-4x-2numa")
    base_sets = ["engine.max_num_seqs=256"]
    full = make_plan(host, empty_root, sets=base_sets, environ={})
    inst = full.instances[0]
    because = "GPU 3 hot: 88 °C >= hot 82 °C"
    layer, why = degrade_overrides(inst, 1, full.degrade, because)
    assert layer is not None and layer.kind == "degrade"
    assert dict(layer.values)[("engine", "max_num_seqs")] == 192 and any("256 -> 192" in w for w in why)
    hot = make_plan(host, empty_root, sets=[*base_sets, layer], environ={})
    doc = hot.to_json()
    d = doc["instances"][0]
    # the same values as the --set texts give: the layer is the step, typed
    text = make_plan(host, empty_root, sets=[*base_sets, *degrade_sets(inst, 1, full.degrade)[0]], environ={})
    assert d["engine"] == text.to_json()["instances"][0]["engine"]
    assert d["speculative"] == text.to_json()["instances"][0]["speculative"]
    assert d["engine"]["max_num_seqs"] == 192 and d["speculative"]["num_speculative_tokens"] == 4
    reasons = {r["key"]: r for r in doc["reasons"]}
    src = reasons["instances[0].engine.max_num_seqs"]["source"]
    assert f"degrade step 1 ({because})" in src and "--set" not in src, src
    batched = reasons["instances[0].engine.max_num_batched_tokens"]["source"]
    assert "degrade step 1" in batched and "--set" not in batched, batched
    # the plan's provenance (daemon.json, plan --json) says the same; the full plan's says --set
    assert hot.provenance["engine.max_num_seqs"] == f"degrade step 1 ({because})", hot.provenance
    assert full.provenance["engine.max_num_seqs"].startswith("cli --set engine.max_num_seqs=256")
    assert degrade_overrides(inst, 0, full.degrade, because) == (None, [])


def test_a_band_without_speculation_stays_without_when_degraded(host_of, empty_root) -> None:
    host = host_of("a800-pcie-4x-2numa")
    table = "speculative.by_batch_size=[[1,32,5],[33,128,2],[129,null,0]]"
    full = make_plan(host, empty_root, sets=[table], environ={})
    layer, _ = degrade_overrides(full.instances[0], 2, full.degrade, "GPU 0 critical")
    assert layer is not None
    assert dict(layer.values)[("speculative", "by_batch_size")] == [[1, 32, 3], [33, 128, 1], [129, None, 0]]
    hot = make_plan(host, empty_root, sets=[table, layer], environ={}).to_json()["instances"][0]
    assert hot["speculative"]["num_speculative_tokens_per_batch_size"] == [
        [1, 32, 3],
        [33, 128, 1],
        [129, None, 0],
    ]
