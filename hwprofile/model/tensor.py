"""One parameter tensor of a model as the Hugging Face checkpoint names it (:class:`Tensor`), and the
parts of a model it belongs to: what hwprofile/model/weights.py lists layer by layer and
hwprofile/model/quant.py sizes under a checkpoint's quantization."""

from __future__ import annotations

from typing import NamedTuple

PARTS = ("decoder", "embed", "lm_head", "vision", "mtp")


class Tensor(NamedTuple):
    """One parameter tensor (``count`` copies of it: the experts of a layer)."""

    name: str  # the checkpoint's module name (what a quantization ignore list names)
    part: str  # one of PARTS
    rows: int  # output features (1 for a vector)
    cols: int  # input features (the vector's length for a vector)
    count: int = 1  # type: ignore[assignment]  # identical copies (routed experts); shadows tuple.count
    active: int = -1  # copies read per decoded token (-1: all of them)
    linear: bool = True  # a Linear weight a quantization method may quantize
    vector: bool = False  # a bias, norm, scale or other small non-matrix parameter
    replicated: bool = False  # whole on every tensor-parallel rank (vLLM's ReplicatedLinear), not split

    @property
    def params(self) -> int:
        return self.rows * self.cols * self.count

    @property
    def active_params(self) -> int:
        return self.rows * self.cols * (self.count if self.active < 0 else self.active)


class QuantGrid(NamedTuple):
    """A quantized checkpoint's scale grid and the MLP widths tensor parallelism splits under it: vLLM
    checks that each rank's share is whole blocks or groups (``validate_fp8_block_shape`` and its
    ``_moe`` twin for FP8 blocks, ``verify_group_size_divides_partition`` and the AWQ/GPTQ methods'
    own check for weight groups)."""

    block: tuple[int, int]  # (rows, columns) per scale: FP8's (block_n, block_k); (1, group) for groups
    mlp_widths: tuple[int, ...]  # dense MLPs' intermediate sizes (shared experts' too)
    expert_width: int  # the routed experts' intermediate size (0: none on the grid)
    fp8: bool  # FP8 blocks (else weight groups along the input)

    @property
    def what(self) -> str:
        bn, bk = self.block
        return f"FP8 blocks ({bn} x {bk})" if self.fp8 else f"weight groups of {bk}"
