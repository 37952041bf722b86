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


class Fp8Blocks(NamedTuple):
    """An FP8 block-quantized checkpoint's blocks and the widths tensor parallelism splits under them
    (vLLM checks each rank's share is whole blocks: ``validate_fp8_block_shape``, ``_moe``)."""

    block: tuple[int, int]  # (block_n, block_k): output rows x input columns per scale
    mlp_widths: tuple[int, ...]  # dense MLPs' intermediate sizes (shared experts' too)
    expert_width: int  # the routed experts' intermediate size (0: none in FP8 blocks)
