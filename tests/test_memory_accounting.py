"""The KV cache as vLLM's memory profile sizes it (plan/memory.py ``fit``, plan/engine.py ``fit_args``
and ``cuda_total``): a share of the total CUDA reports, less the memory outside PyTorch vLLM counts,
the collectives' buffers where a group spans more than one GPU, and a refused plan that says its fit."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from hwprofile.config.schema import resolve_key
from hwprofile.config.settings import Settings
from hwprofile.host.snapshot import Gpu
from hwprofile.host.snapshot_io import load_snapshot
from hwprofile.model.resolve import resolve_model
from hwprofile.pipeline import make_plan
from hwprofile.plan.engine import RESERVED_UNREAD_BYTES, cuda_total, fit_args
from hwprofile.plan.memory import MiB, fit
from hwprofile.plan.refusal import PlanRefused

ROOT = Path(__file__).resolve().parent.parent
H100 = 85_520_809_984


def _settings(**layout: object) -> Settings:
    s = Settings.from_tree({})[0]
    return dataclasses.replace(s, layout=dataclasses.replace(s.layout, **layout))


def test_the_collectives_buffers_come_with_a_group_wider_than_one_gpu() -> None:
    """NCCL's and the custom all-reduce's buffers are allocated after vLLM's baseline and counted: with
    TP > 1, and on a TP 1 rank of a pipeline or of a TP group across nodes; an explicit 0 is honoured."""
    model = resolve_model("Qwen/Qwen3-8B", "model")
    s = _settings()
    mem = s.memory

    def overhead(settings: Settings, tp: int) -> int:
        args = fit_args(settings, True, "0.11.0", None)  # eager, a release before graphs are deducted
        return fit(H100, 0.9, model, None, tp, 2, 2048, 256, **args).overhead_bytes

    assert overhead(s, 1) == mem.non_torch_bytes + mem.margin_bytes
    assert overhead(s, 2) == overhead(s, 1) + mem.collective_bytes == overhead(s, 8)
    for grouped in (_settings(pipeline_parallel_size=2), _settings(nodes=2)):
        assert overhead(grouped, 1) == overhead(grouped, 2) == overhead(s, 2)
    none = dataclasses.replace(s, memory=dataclasses.replace(mem, collective_bytes=0))
    assert overhead(none, 2) == overhead(none, 1)


def test_the_budget_is_a_share_of_what_cuda_reports() -> None:
    """vLLM's gpu_memory_utilization is a share of cudaMemGetInfo's total: NVML's less the driver's
    reservation (NVML's memory v2); where NVML did not say it (v1), a reservation is assumed, not 0."""
    read = Gpu(0, memory_total_bytes=H100, memory_reserved_bytes=479 * MiB)
    assert read.cuda_total_bytes == cuda_total(read) == H100 - 479 * MiB
    unread = Gpu(0, memory_total_bytes=H100)
    assert unread.cuda_total_bytes is None and cuda_total(unread) == H100 - RESERVED_UNREAD_BYTES
    assert cuda_total(Gpu(0)) == 0


def test_the_plan_says_how_it_counted_the_total(empty_root: Path) -> None:
    host = load_snapshot(ROOT / "examples" / "hosts" / "h100-sxm-8x.json")
    plan = make_plan(host, empty_root, model="Qwen/Qwen3-8B", sets=["layout.replicas=1"], environ={})
    why = next(r.reason for r in plan.reasons if r.key.endswith("engine.gpu_memory_utilization"))
    assert "79.2 GiB" in why and "479 MiB the driver reserves" in why
    inst = plan.instances[0]
    assert inst.memory.budget_bytes == int((H100 - 479 * MiB) * inst.engine.gpu_memory_utilization)
    gpus = tuple(g._replace(memory_reserved_bytes=None) for g in host.gpus)
    unread = make_plan(host._replace(gpus=gpus), empty_root, model="Qwen/Qwen3-8B", environ={}, sets=[])
    why = next(r.reason for r in unread.reasons if r.key.endswith("engine.gpu_memory_utilization"))
    assert "512 MiB assumed reserved by the driver: NVML did not say" in why


def test_a_refusal_carries_the_fit_it_was_refused_on(empty_root: Path) -> None:
    host = load_snapshot(ROOT / "examples" / "hosts" / "rtx3060-12g-1x.json")
    with pytest.raises(PlanRefused) as e:
        make_plan(host, empty_root, model="Qwen/Qwen3-32B", sets=["engine.weights_bits=16"], environ={})
    memory = e.value.memory
    assert memory is not None and all(isinstance(v, int) for v in memory.values())
    assert memory["kv_cache_bytes"] < 0 and memory["weights_bytes"] > memory["budget_bytes"]


def test_the_renamed_context_setting_says_its_new_name() -> None:
    with pytest.raises(ValueError, match=r"renamed 'memory.non_torch_bytes': the CUDA context"):
        resolve_key("memory.cuda_context_bytes")
