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
    it); divide a MoE's expert width; whole FP8 blocks or weight groups on every rank
    (:func:`_grid_split`; ``refine``: the release refines an FP8 MoE's blocks where they do not split)."""
    kv = model.num_kv_heads
    st = model.stack
    if st is not None and st.sconv is not None and any(a.num_kv_heads < tp for a in st.attention.values()):
        return f"its short-conv state splits the KV heads: at most one a rank ({kv} KV heads)"
    if not (model.num_heads % tp == 0 and (kv % tp == 0 or tp % kv == 0)):
        return f"it does not divide the {model.num_heads} attention heads ({kv} KV heads)"
    inter = model.moe_intermediate_size
    if model.num_experts and inter and inter % tp:
        return f"each expert's {inter} does not split {tp} ways (vLLM's FusedMoEConfig asserts it)"
    return _grid_split(model, tp, refine) if tp > 1 else None


def _grid_split(model: ModelFacts, tp: int, refine: bool) -> str | None:
    """A quantized checkpoint at ``tp`` (:class:`~hwprofile.model.tensor.QuantGrid`): vLLM refuses a
    rank's share of an MLP that is not whole blocks or groups (:func:`_mlp_split`), and of the routed
    experts too (:func:`_expert_split`)."""
    grid = model.quant_grid
    if grid is None:
        return None
    for width in grid.mlp_widths:
        why = _mlp_split(model, width, tp)
        if why:
            return why
    return _expert_split(model, grid.expert_width, tp, refine) if grid.expert_width else None


def _mlp_split(model: ModelFacts, width: int, tp: int) -> str | None:
    """A dense MLP ``width`` wide at ``tp``. FP8 (``validate_fp8_block_shape``): the down-projection's
    input share in ``block_k``, and the gate/up share in ``block_n`` for compressed-tensors (an ``fp8``
    checkpoint's merged gate/up is let through: ``_maybe_allow_fp8_block_shape_mismatch``). Weight
    groups: the down-projection's input share in whole groups (AWQ: "The input size is not aligned
    with the quantized weight shape"; compressed-tensors: ``verify_group_size_divides_partition``;
    GPTQ: Marlin refuses it, and a kernel that takes it would split a group's scale across ranks)."""
    grid = model.quant_grid
    assert grid is not None
    bn, bk = grid.block
    share = width // tp
    rows = bn if grid.fp8 and model.quant_method != "fp8" else 1
    if width % tp == 0 and share % bk == 0 and share % rows == 0:
        return None
    unit = "blocks" if grid.fp8 else "groups"
    check = "validate_fp8_block_shape" if grid.fp8 else "input-size check"
    return (
        f"its {grid.what} do not split: an MLP {width} wide is {width / tp:g} a rank, not whole {unit} "
        f"(vLLM's {check} refuses it)"
    )


def _expert_split(model: ModelFacts, width: int, tp: int, refine: bool) -> str | None:
    """The routed experts ``width`` wide at ``tp``. FP8 (``validate_fp8_block_shape_moe``) unless the
    release refines an ``fp8`` checkpoint's blocks to a finer grid (``refine_fp8_moe_block_shape``:
    the gcd of the blocks, the share and the hidden size, at least 32; not compressed-tensors). Weight
    groups: compressed-tensors refuses; AWQ and GPTQ fall back to the MoE WNA16 kernels, which halve
    the group down to 32 until it divides the share and the hidden size; others are not checked."""
    grid = model.quant_grid
    assert grid is not None
    bn, bk = grid.block
    share, hidden = width // tp, model.hidden_size
    if width % tp == 0 and share % bn == 0 and share % bk == 0:
        return None
    method = model.quant_method or ""
    if width % tp == 0 and not grid.fp8:
        if method.startswith(("awq", "gptq")):
            group = bk
            while group >= 32 and (share % group or hidden % group):  # MoeWNA16Method's halving
                group //= 2
            if group >= 32:
                return None
        elif not method.startswith("compressed"):
            return None  # no rule read for its MoE method
    finer = math.gcd(bn, bk, share, hidden) if width % tp == 0 and grid.fp8 else 0
    refines = model.quant_method == "fp8" and finer >= 32
    if refine and refines:
        return None
    unit = "blocks" if grid.fp8 else "groups"
    check = "validate_fp8_block_shape_moe" if grid.fp8 else f"{method} MoE method"
    return (
        f"its {grid.what} do not split: each expert's {width} is {width / tp:g} a rank, not whole {unit} "
        f"(vLLM's {check} refuses it" + ("; this release does not refine them" if refines else "") + ")"
    )
