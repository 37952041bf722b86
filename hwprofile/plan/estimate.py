"""The decode-speed ceiling of an instance: memory bandwidth (datasheet table,
``hwprofile/data/gpus.yaml``) over the weight bytes read per token, with and without speculation."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from ..config.settings import Settings
from ..host.snapshot import Gpu
from ..model import ModelFacts
from . import gpufacts
from .memory import active_weights_bytes, expert_padding
from .types import Estimate, SpeculativeConfig

if TYPE_CHECKING:
    from .predict import Calibration


def estimate(
    gpu: Gpu,
    model: ModelFacts,
    draft: ModelFacts | None,
    tp: int,
    spec: SpeculativeConfig | None,
    settings: Settings,
    calibration: Calibration | None = None,
) -> Estimate:
    """Batch-1 decode ceiling on ``gpu`` at TP ``tp`` (an upper bound: no compute or communication);
    speculating, at the acceptance the predictions take (:func:`acceptance_for`: this host's
    ``calibration`` measured it, else ``speculative.assumed_acceptance``), its source beside it."""
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
        drafted = (draft.path, draft.name) if draft is not None else ()
        a, source = acceptance_for(settings, spec.method, drafted, calibration)
        k = int(spec.num_speculative_tokens)
        expected = (1 - a ** (k + 1)) / (1 - a) if a < 1 else k + 1
        draft_bytes = (active_weights_bytes(draft) / tp) if draft else 0.0
        step_bytes = bytes_per_gpu + k * draft_bytes
        out["assumed_acceptance"] = a
        out["acceptance_source"] = source
        out["expected_tokens_per_step"] = round(expected, 2)
        out["decode_tok_s_ceiling_batch1_speculative"] = round(expected * bw * 1e9 / step_bytes, 1)
    out["basis"] = (
        "memory bandwidth / weight bytes read per token (batch 1, short context, no compute or communication cost; "
        "a mixture of experts reads its active parameters only: shared weights + the experts each token is routed to, "
        "with their MXFP4 tile padding)"
    )
    return Estimate(**out)


def acceptance_for(
    settings: Settings, method: str, draft: Sequence[str | None], cal: Calibration | None
) -> tuple[float, str]:
    """The per-token acceptance an instance that speculates by ``method`` (with the draft ``draft``
    names: its path and name; empty: none) is predicted at, and its source: what this host's calibration
    measured where its bench speculated by that method with that draft (plan._acceptance_of took it
    out where an operator set ``speculative.assumed_acceptance``); else that setting."""
    if (
        cal is not None
        and cal.acceptance is not None
        and cal.acceptance_applies
        and cal.speculation is not None
        and cal.speculation[0] == method
        and (cal.speculation_model is None or cal.speculation_model in draft)
    ):
        length = f"{cal.acceptance_length:.2f}" if cal.acceptance_length is not None else "?"
        return cal.acceptance, f"measured: {cal.path}, a mean acceptance length of {length} (vLLM's counters)"
    return settings.speculative.assumed_acceptance, "speculative.assumed_acceptance"
