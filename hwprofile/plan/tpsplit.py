"""Which tensor-parallel degrees vLLM takes for a model (pure: the model's facts in, a reason or
None out): the attention heads a degree must divide, the short-conv state a rank keeps of its own
KV heads, the FP8 blocks or weight groups a rank's share of an MLP must hold whole."""

from __future__ import annotations

import math

from ..model import ModelFacts


def tp_ok(model: ModelFacts, tp: int, refine: bool = True) -> bool:
    """Whether vLLM takes tensor parallel ``tp`` for ``model`` (:func:`tp_refusal`)."""
    return tp_refusal(model, tp, refine) is None


def tp_refusal(model: ModelFacts, tp: int, refine: bool = True) -> str | None:
    """Why vLLM refuses ``model`` at tensor parallel ``tp``, or None: ``tp`` must divide the attention
    heads, and divide or be a multiple of the KV heads; at most the KV heads of every attention kind
    where each rank keeps a short-conv state of its own heads (Inkling's ``InklingConvState`` asserts
    it); whole FP8 blocks or weight groups on every rank (:func:`_grid_split`; ``refine``: the release refines an FP8
    MoE's blocks where they do not split)."""
    kv = model.num_kv_heads
    st = model.stack
    if st is not None and st.sconv is not None and any(a.num_kv_heads < tp for a in st.attention.values()):
        return f"its short-conv state splits the KV heads: at most one a rank ({kv} KV heads)"
    if not (model.num_heads % tp == 0 and (kv % tp == 0 or tp % kv == 0)):
        return f"it does not divide the {model.num_heads} attention heads ({kv} KV heads)"
    return _grid_split(model, tp, refine) if tp > 1 else None


def _grid_split(model: ModelFacts, tp: int, refine: bool) -> str | None:
    """A quantized checkpoint at ``tp`` (:class:`~hwprofile.model.tensor.QuantGrid`): vLLM refuses a
    rank's share of an MLP that is not whole blocks or groups (FP8: ``validate_fp8_block_shape``, the
    gate/up rows in ``block_n``, the down-projection's columns in ``block_k``; weight groups:
    ``verify_group_size_divides_partition``, AWQ/GPTQ's "input size is not aligned"), and of the routed
    experts too, unless the release refines an FP8 MoE's blocks to a finer grid
    (``refine_fp8_moe_block_shape``: the gcd of the blocks, the share and the hidden size, at least
    32; ``fp8`` checkpoints only, not compressed-tensors)."""
    grid = model.quant_grid
    if grid is None:
        return None
    bn, bk = grid.block
    check = "validate_fp8_block_shape" if grid.fp8 else "verify_group_size_divides_partition"
    for width in grid.mlp_widths:
        if width % tp or (width // tp) % bn or (width // tp) % bk:
            return (
                f"its {grid.what} do not split: an MLP {width} wide is {width / tp:g} a rank, "
                f"not whole {'blocks' if grid.fp8 else 'groups'} (vLLM's {check} refuses it)"
            )
    width = grid.expert_width
    share = width // tp
    if not width or (width % tp == 0 and share % bn == 0 and share % bk == 0):
        return None
    finer = math.gcd(bn, bk, share, model.hidden_size) if width % tp == 0 and grid.fp8 else 0
    refines = model.quant_method == "fp8" and finer >= 32
    if refine and refines:
        return None
    return (
        f"its {grid.what} do not split: each expert's {width} is {width / tp:g} a rank, not whole "
        f"{'blocks' if grid.fp8 else 'groups'} (vLLM's {check + '_moe' if grid.fp8 else check} refuses it"
        + ("; this release does not refine them" if refines else "")
        + ")"
    )
