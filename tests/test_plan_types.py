"""The plan as frozen, typed data (hwprofile/plan/types.py): ``Plan.from_json(doc).to_json()`` is
``doc``, key order included, for real plans of every fixture host (GPU and CPU instances, draft,
ngram, no speculation, a datasheet without bandwidth), and the types are frozen."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from hwprofile.pipeline import make_plan
from hwprofile.plan import PlanRefused
from hwprofile.plan.types import ABSENT, InstancePlan, Plan

HOSTS = sorted(p.stem for p in (Path(__file__).resolve().parent / "fixtures" / "hosts").glob("*.yaml"))
CASES = [
    (None, []),
    ("Qwen/Qwen3-0.6B", []),
    ("Qwen/Qwen3-8B", ["speculative.method=ngram"]),
    ("Qwen/Qwen3-30B-A3B", ["speculative.method=none"]),
    ("Qwen/Qwen3-8B", ["layout.numa_bind=false"]),
]


def _plans(host, root):
    for model, sets in CASES:
        try:
            yield make_plan(host, root, model=model, sets=sets, environ={})
        except PlanRefused:
            continue


def _doc(plan):
    return plan.to_json() if isinstance(plan, Plan) else plan


@pytest.mark.parametrize("name", HOSTS)
def test_round_trip_is_exact(name, host_of, empty_root) -> None:
    checked = 0
    for plan in _plans(host_of(name), empty_root):
        doc = json.loads(json.dumps(_doc(plan)))
        typed = Plan.from_json(doc)
        assert json.dumps(typed.to_json()) == json.dumps(doc)  # key order too
        assert Plan.from_json(json.loads(json.dumps(typed.to_json()))) == typed
        checked += 1
    assert checked >= 1


def test_frozen_and_replace(host_of, empty_root) -> None:
    plan = Plan.from_json(
        json.loads(json.dumps(_doc(make_plan(host_of("rtx4090-1x"), empty_root, environ={}))))
    )
    inst = plan.instances[0]
    assert isinstance(inst, InstancePlan) and isinstance(inst.gpus, tuple)
    with pytest.raises(dataclasses.FrozenInstanceError):
        inst.engine.max_num_seqs = 1  # type: ignore[misc]
    smaller = dataclasses.replace(inst, engine=dataclasses.replace(inst.engine, max_num_seqs=1))
    new = dataclasses.replace(plan, instances=(smaller, *plan.instances[1:]))
    assert new.instances[0].engine.max_num_seqs == 1 and plan.instances[0].engine.max_num_seqs != 1
    assert new.to_json()["instances"][0]["engine"]["max_num_seqs"] == 1


def test_cpu_instance_keys(host_of, empty_root) -> None:
    plan = Plan.from_json(
        json.loads(
            json.dumps(_doc(make_plan(host_of("no-driver"), empty_root, model="Qwen/Qwen3-0.6B", environ={})))
        )
    )
    inst = plan.instances[0]
    assert inst.device == "cpu" and inst.gpu_uuids is ABSENT and "gpu_uuids" not in inst.to_json()
    assert list(inst.to_json()["engine"])[5] == "kv_cache_memory_bytes"


def test_unknown_keys_are_refused(host_of, empty_root) -> None:
    doc = json.loads(json.dumps(_doc(make_plan(host_of("rtx4090-1x"), empty_root, environ={}))))
    doc["instances"][0]["surprise"] = 1
    with pytest.raises(ValueError, match="surprise"):
        Plan.from_json(doc)


def test_settings_sections_are_typed_and_checked_when_read_back(host_of, empty_root) -> None:
    from hwprofile.config.settings import Supervise

    plan = make_plan(host_of("rtx4090-1x"), empty_root, sets=["supervise.max_restarts=0"], environ={})
    assert isinstance(plan.supervise, Supervise) and plan.supervise.max_restarts == 0  # an explicit 0
    doc = json.loads(json.dumps(plan.to_json()))
    assert Plan.from_json(doc).supervise == plan.supervise
    doc["supervise"]["ready_timeout"] = "soon"
    with pytest.raises(ValueError, match=r"supervise.ready_timeout: expected a number"):
        Plan.from_json(doc)
    doc["supervise"] = {"ready_timout": 10}
    with pytest.raises(ValueError, match="ready_timout"):
        Plan.from_json(doc)
