"""The attention backend vLLM runs a model's attention layers with, and the one way it changes a
decode step's cost that the performance model takes (plan/predict.py: ModelShape.attention_kernel).

vLLM picks the backend itself (``vllm/platforms/cuda.py`` ``_get_backend_priorities``, 0.26 to 0.33,
for attention that is not MLA): on a Blackwell datacenter part (compute capability 10.x) FlashInfer,
then FlashAttention, then Triton; on every other CUDA part FlashAttention, then FlashInfer, then
Triton, each taken where it supports the compute capability, the head size and the KV dtype:

- FLASH_ATTN: compute capability 8.0 or newer, head sizes up to 256 in steps of 8, an fp8 KV cache
  only with FlashAttention 3 on Hopper (9.x) (``flash_attn.py`` ``supports_kv_cache_dtype``);
- FLASHINFER: compute capability 7.5 or newer, head sizes 64, 128, 256 and 512 (``flashinfer.py``
  ``get_supported_head_sizes``; ``flashinfer-python`` is a dependency of vLLM's CUDA wheel, 0.26);
- TRITON_ATTN: anything else.

``engine.attention_backend`` sets one (``--attention-backend``, 0.13+; ``VLLM_ATTENTION_BACKEND``
before).

What differs for the cost: FlashAttention and FlashInfer split a decoding sequence's context over
enough thread blocks to fill the GPU, so its KV streams at the card's bandwidth. vLLM's Triton
unified attention (``triton_unified_attention.py``) launches a fixed grid: in a step of decodes only
(one query per sequence, at most ``128 / KV heads`` sequences) 16 segments per sequence and KV head;
otherwise (a speculative verify's several queries, a prompt chunk in the step) one thread block per
block of queries and KV head, each reading that sequence's whole context. One sequence on a GPU with
one KV head then reads its KV with 16 or 2 thread blocks, far from the card's bandwidth."""

from __future__ import annotations

from typing import NamedTuple

from ..model import ModelFacts

FA_MAX_HEAD = 256  # FlashAttention 2/3: head sizes multiples of 8 up to 256
FLASHINFER_HEADS = (64, 128, 256, 512)
QUANTIZED_KV = ("fp8", "fp8_e4m3", "fp8_e5m2")


class Attention(NamedTuple):
    """The backend an instance's attention runs on, the decode kernel kind the step cost takes
    ("split": split-KV, the card's bandwidth; "triton": Triton's fixed grid), whether the plan sets it
    (``engine.attention_backend``: rendered) or vLLM picks it (nothing rendered), and why."""

    backend: str
    kernel: str
    asked: bool
    why: str


def _major_minor(cc: str | None) -> tuple[int, int] | None:
    try:
        major, _, minor = (cc or "").partition(".")
        return int(major), int(minor or 0)
    except ValueError:
        return None


def _supports(backend: str, cc: tuple[int, int], head: int, quantized_kv: bool) -> str:
    """Why ``backend`` cannot run this attention ("" where it can)."""
    if backend == "FLASH_ATTN":
        if cc < (8, 0):
            return f"FlashAttention needs compute capability 8.0 (this GPU: {cc[0]}.{cc[1]})"
        if head > FA_MAX_HEAD or head % 8:
            return f"FlashAttention takes head sizes up to {FA_MAX_HEAD} in steps of 8 (this model: {head})"
        if quantized_kv and cc[0] != 9:
            return "FlashAttention reads an fp8 KV cache only as FlashAttention 3 on Hopper"
        return ""
    if cc < (7, 5):
        return f"FlashInfer needs compute capability 7.5 (this GPU: {cc[0]}.{cc[1]})"
    if head not in FLASHINFER_HEADS:
        return f"FlashInfer takes head sizes {', '.join(map(str, FLASHINFER_HEADS))} (this model: {head})"
    return ""


def pick(asked: str, cc: str | None, kv_dtype: str, head_dim: int, mla: bool) -> Attention:
    """The attention backend of an instance: ``asked`` (``engine.attention_backend``) unless "auto",
    else the one vLLM picks for a GPU of compute capability ``cc`` (None: unknown), the KV cache dtype
    vLLM is given and the model's largest attention head size. MLA runs vLLM's MLA backends: their
    decode kernels split the latent cache like FlashAttention (kernel "split")."""
    kernel = "triton" if asked == "TRITON_ATTN" else "split"
    if asked != "auto":
        return Attention(asked, kernel, True, f"engine.attention_backend {asked}")
    if mla:
        return Attention("auto", "split", False, "vLLM's MLA backend for this MLA model (its own pick)")
    caps = _major_minor(cc)
    if caps is None:
        return Attention(
            "auto",
            "split",
            False,
            "vLLM's own pick; the GPU's compute capability is unknown: costed as split-KV",
        )
    quantized = kv_dtype in QUANTIZED_KV
    order = ("FLASHINFER", "FLASH_ATTN") if caps[0] == 10 else ("FLASH_ATTN", "FLASHINFER")
    skipped: list[str] = []
    for backend in order:
        why_not = _supports(backend, caps, head_dim, quantized)
        if not why_not:
            passed = f" ({'; '.join(skipped)})" if skipped else ""
            return Attention("auto", "split", False, f"vLLM's own pick: {backend}{passed}")
        skipped.append(why_not)
    return Attention("auto", "triton", False, f"vLLM's own pick: TRITON_ATTN ({'; '.join(skipped)})")


def head_size(model: ModelFacts) -> int:
    """The largest attention head size of ``model`` (vLLM picks one backend for every layer)."""
    sizes = [model.head_dim]
    if model.stack is not None:
        sizes += [a.head_dim for a in model.stack.attention.values() if a.head_dim]
    return max(sizes)


def of_instance(asked: str, cc: str | None, kv_dtype: str, model: ModelFacts, flag: bool = True) -> Attention:
    """:func:`pick` for ``model``; ``flag``: whether the release takes ``--attention-backend`` (where
    not, an asked backend is not rendered and vLLM picks its own: the prediction follows it)."""
    if asked != "auto" and not flag:
        own = pick("auto", cc, kv_dtype, head_size(model), bool(model.kv_lora_rank))
        return own._replace(
            why=f"engine.attention_backend {asked} not rendered (no --attention-backend in "
            f"this vLLM); {own.why}"
        )
    return pick(asked, cc, kv_dtype, head_size(model), bool(model.kv_lora_rank))
