"""plan/predict.py's step memo (issue 34): the Gpu, ModelShape and Link records looked up by identity,
equal records sharing their steps, the same figures as the step computed afresh, and a bound on what
it holds."""

from __future__ import annotations

import dataclasses

from hwprofile.host.snapshot import Gpu
from hwprofile.model import resolve_model
from hwprofile.plan import candidates
from hwprofile.plan import predict as pm


def _records() -> tuple[pm.Gpu, pm.ModelShape, pm.Link]:
    gpu, _ = candidates.gpu_of(Gpu(0, "NVIDIA H100 80GB HBM3", memory_total_bytes=80 * 2**30))
    assert gpu is not None
    m = candidates.model_shape(resolve_model("Qwen/Qwen3-8B", "model"), 2)
    return gpu, m, pm.Link("nvlink", 300.0, 5.0, "test")


def test_equal_records_share_their_steps_and_the_figures_are_the_steps_own() -> None:
    pm._step_ms.cache_clear()
    gpu, m, link = _records()
    first = pm.step_ms(gpu, m, 2, link, 8, 1000.0)
    again = pm.step_ms(*(dataclasses.replace(r) for r in (gpu, m)), 2, dataclasses.replace(link), 8, 1000.0)
    assert again == first == pm._step_ms.fn(gpu, m, 2, link, 8, 1000.0, 0, 0.0, True)
    assert pm._step_ms.size == 1 and len(pm._step_ms.by_value) == 1 and len(pm._step_ms.by_id) == 2
    other = pm.step_ms(gpu, m, 2, dataclasses.replace(link, gbs=50.0), 8, 1000.0)
    assert other["allreduce_ms"] > first["allreduce_ms"]  # a slower link: not the faster one's step
    first["total_ms"] = -1.0  # step_ms gives the caller a dict of its own
    assert pm.step_ms(gpu, m, 2, link, 8, 1000.0)["total_ms"] > 0


def test_the_memo_starts_afresh_at_its_limit() -> None:
    pm._step_ms.cache_clear()
    gpu, m, link = _records()
    for context in range(pm._step_ms.LIMIT + 5):
        pm.step_ms(gpu, m, 1, link, 1, float(context))
    assert pm._step_ms.size <= pm._step_ms.LIMIT
    pm._step_ms.cache_clear()
    assert pm._step_ms.size == 0 and not pm._step_ms.by_id
