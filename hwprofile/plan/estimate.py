"""The decode-speed ceiling of an instance: memory bandwidth (datasheet table,
``hwprofile/data/gpus.yaml``) over the weight bytes read per token, with and without speculation."""

from __future__ import annotations

from typing import Any

from ..config.settings import Settings
from ..host.snapshot import Gpu
from ..model import ModelFacts
from . import gpufacts
from .memory import active_weights_bytes, expert_padding
from .types import Estimate, SpeculativeConfig


def estimate(
    gpu: Gpu,
    model: ModelFacts,
    draft: ModelFacts | None,
    tp: int,
    spec: SpeculativeConfig | None,
    settings: Settings,
) -> Estimate:
    """Batch-1 decode ceiling on ``gpu`` at TP ``tp`` (an upper bound: no compute or communication)."""
    row = gpufacts.lookup(gpu.name, gpu.memory_total_gib)
    bw = row.get("memory_bandwidth_gbs") if row else None
    out: dict[str, Any] = {"gpu_datasheet": row["name"] if row else None, "memory_bandwidth_gbs": bw}
    if not bw:
        out["note"] = "no bandwidth figure for this GPU in the datasheet table"
        return Estimate(**out)
    bytes_per_gpu = active_weights_bytes(model) / tp  # MoE: only the routed experts are read
    if model.num_experts:  # and their MXFP4 tile padding (plan/memory.py): a token's experts', or all
        routed = active_weights_bytes(model) < model.weights_bytes  # the active experts known
        bytes_per_gpu += expert_padding(model, tp) * (
            model.experts_per_token / model.num_experts if routed else 1
        )
    base = bw * 1e9 / bytes_per_gpu
    out["bytes_read_per_token_per_gpu"] = int(bytes_per_gpu)
    out["decode_tok_s_ceiling_batch1"] = round(base, 1)
    if spec:
        a = settings.speculative.assumed_acceptance
        k = int(spec.num_speculative_tokens)
        expected = (1 - a ** (k + 1)) / (1 - a)
        draft_bytes = (active_weights_bytes(draft) / tp) if draft else 0.0
        step_bytes = bytes_per_gpu + k * draft_bytes
        out["assumed_acceptance"] = a
        out["expected_tokens_per_step"] = round(expected, 2)
        out["decode_tok_s_ceiling_batch1_speculative"] = round(expected * bw * 1e9 / step_bytes, 1)
    out["basis"] = (
        "memory bandwidth / weight bytes read per token (batch 1, short context, no compute or communication cost; "
        "a mixture of experts reads its active parameters only: shared weights + the experts each token is routed to, "
        "with their MXFP4 tile padding)"
    )
    return Estimate(**out)
