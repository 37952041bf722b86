"""Degrade steps go back through the planner as settings: seed 000's 82 °C rule (max_num_seqs
256 -> 192) as the A800 profile's first degrade step, fewer batched tokens, fewer proposals."""

from __future__ import annotations

from hwprofile.config.settings import Degrade
from hwprofile.pipeline import make_plan
from hwprofile.plan.degrade import degrade_sets

DEGRADE = {"max_num_seqs_factor": 0.75, "max_num_batched_tokens_factor": 0.75, "num_speculative_tokens_step": 1,
           "power_limit_factor": 0.85, "power_limit_hold_s": 60.0}  # fmt: skip


def test_seed_000_degrade_256_to_192_through_the_planner(host_of, empty_root) -> None:
    host = host_of("a800-pcie-4x-2numa")
    base_sets = ["engine.max_num_seqs=256"]  # seed 000 ran 256 sequences
    full = make_plan(host, empty_root, sets=base_sets, environ={})
    inst = full.instances[0]
    assert inst.engine.max_num_seqs == 256 and inst.speculative and inst.speculative.num_speculative_tokens == 5
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
    # the reasons say where the values came from
    reasons = {r["key"]: r for r in hot["reasons"]}
    assert "--set engine.max_num_seqs=192" in reasons["instances[0].engine.max_num_seqs"]["source"]
    # step 2 goes deeper; step 0 is the full profile
    sets2, _ = degrade_sets(inst, 2, Degrade(**DEGRADE))
    assert "engine.max_num_seqs=144" in sets2
    assert degrade_sets(inst, 0, Degrade(**DEGRADE)) == ([], [])
