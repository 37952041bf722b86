"""The attention backend vLLM runs a model's attention layers with, and the one way it changes a
decode step's cost that the performance model takes (plan/predict.py: ModelShape.attention_kernel).

vLLM picks the backend itself (``vllm/platforms/cuda.py`` ``_get_backend_priorities``, 0.26 to 0.33,
for attention that is not MLA): on a Blackwell datacenter part (compute capability 10.x) FlashInfer,
then FlashAttention, then Triton; on every other CUDA part FlashAttention, then FlashInfer, then
Triton, each taken where it supports the compute capability, the head size and the KV dtype:

- FLASH_ATTN: compute capability 8.0 or newer, head sizes up to 256 in steps of 8, float16 or
  bfloat16; an fp8 (e4m3) KV cache and attention sinks (gpt-oss) only with FlashAttention 3 on Hopper
  (9.x) (``flash_attn.py`` ``supports_kv_cache_dtype``, ``supports_sink``);
- FLASHINFER: compute capability 8.0 to 12.1, head sizes 64, 128, 256 and 512, float16 or bfloat16;
  sinks only on SM100 (``flashinfer.py``; ``flashinfer-python`` is a dependency of vLLM's CUDA wheel,
  0.26);
- TRITON_ATTN: anything else.

A backend asked for that cannot run the model is refused by vLLM at start ("Selected backend ... is not
valid"); the plan refuses it first (:attr:`Attention.refused`).

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
    (``engine.attention_backend``: rendered) or vLLM picks it (nothing rendered), and why; ``refused``:
    why vLLM would refuse the backend asked for ("" where it runs it)."""

    backend: str
    kernel: str
    asked: bool
    why: str
    refused: str = ""


class Need(NamedTuple):
    """What the model and engine ask of a backend: the largest head size, the KV cache dtype vLLM is
    given, the activation dtype, whether the attention has sinks (gpt-oss) and is MLA."""

    head: int
    kv_dtype: str = "auto"
    dtype: str = "auto"
    sinks: bool = False
    mla: bool = False
    compressed: bool = False  # DeepSeek V4's compressed sparse attention (plan/compressed.py)


def _major_minor(cc: str | None) -> tuple[int, int] | None:
    try:
        major, _, minor = (cc or "").partition(".")
        return int(major), int(minor or 0)
    except ValueError:
        return None


def _flash_attn(cc: tuple[int, int], need: Need) -> str:
    """Why FlashAttention cannot run this attention ("" where it can): FA2 from 8.0, FA3 on Hopper
    (fp8 KV in e4m3, attention sinks: ``flash_attn_supports_sinks``, FA3/FA4 only)."""
    if cc < (8, 0):
        return f"FlashAttention needs compute capability 8.0 (this GPU: {cc[0]}.{cc[1]})"
    if need.head > FA_MAX_HEAD or need.head % 8:
        return f"FlashAttention takes head sizes up to {FA_MAX_HEAD} in steps of 8 (this model: {need.head})"
    if need.kv_dtype in QUANTIZED_KV and (cc[0] != 9 or need.kv_dtype == "fp8_e5m2"):
        return "FlashAttention reads an fp8 (e4m3) KV cache only as FlashAttention 3 on Hopper"
    if need.sinks and cc[0] != 9:
        return "FlashAttention runs attention sinks only as FlashAttention 3 on Hopper"
    return ""


def _flashinfer(cc: tuple[int, int], need: Need) -> str:
    """Why FlashInfer cannot run this attention ("" where it can): compute capability 8.0 to 12.1
    (``supports_compute_capability``: 7.5 held back for a Turing bug), its head sizes, attention sinks
    only on SM100's TRT-LLM path."""
    if not (8, 0) <= cc <= (12, 1):
        return f"FlashInfer takes compute capability 8.0 to 12.1 (this GPU: {cc[0]}.{cc[1]})"
    if need.head not in FLASHINFER_HEADS:
        return (
            f"FlashInfer takes head sizes {', '.join(map(str, FLASHINFER_HEADS))} (this model: {need.head})"
        )
    if need.sinks and cc[0] != 10:
        return "FlashInfer runs attention sinks only on Blackwell (SM100)"
    return ""


def _supports(backend: str, cc: tuple[int, int], need: Need) -> str:
    """Why ``backend`` cannot run this attention ("" where it can, or where hwprofile cannot tell)."""
    if need.dtype == "float32" and backend in ("FLASH_ATTN", "FLASHINFER"):
        return f"{backend} computes in float16 and bfloat16 only"
    if backend == "FLASH_ATTN":
        return _flash_attn(cc, need)
    if backend == "FLASHINFER":
        return _flashinfer(cc, need)
    return ""  # TRITON_ATTN runs everything; FLEX_ATTENTION: not checked here


def _asked(asked: str, cc: str | None, need: Need) -> Attention:
    """``engine.attention_backend`` as vLLM takes it: a backend it cannot run makes it refuse to start
    ("Selected backend ... is not valid"), and an MLA model runs only vLLM's MLA backends."""
    kernel = "triton" if asked == "TRITON_ATTN" else "split"
    why = f"engine.attention_backend {asked}"
    if need.mla:
        return Attention(
            asked, kernel, True, why, "an MLA model runs vLLM's MLA backends only; leave it auto"
        )
    caps = _major_minor(cc)
    why_not = _supports(asked, caps, need) if caps is not None else ""
    return Attention(asked, kernel, True, why, why_not)


def pick(asked: str, cc: str | None, need: Need) -> Attention:
    """The attention backend of an instance: ``asked`` (``engine.attention_backend``) unless "auto",
    else the one vLLM picks for a GPU of compute capability ``cc`` (None: unknown) and what the model
    needs (:class:`Need`). MLA runs vLLM's MLA backends: their decode kernels split the latent cache
    like FlashAttention (kernel "split")."""
    if asked != "auto":
        return _asked(asked, cc, need)
    if need.compressed:
        return _compressed(cc)
    if need.mla:
        return Attention("auto", "split", False, "vLLM's MLA backend for this MLA model (its own pick)")
    caps = _major_minor(cc)
    if caps is None:
        return Attention(
            "auto",
            "split",
            False,
            "vLLM's own pick; the GPU's compute capability is unknown: costed as split-KV",
        )
    order = ("FLASHINFER", "FLASH_ATTN") if caps[0] == 10 else ("FLASH_ATTN", "FLASHINFER")
    skipped: list[str] = []
    for backend in order:
        why_not = _supports(backend, caps, need)
        if not why_not:
            passed = f" ({'; '.join(skipped)})" if skipped else ""
            return Attention("auto", "split", False, f"vLLM's own pick: {backend}{passed}")
        skipped.append(why_not)
    return Attention("auto", "triton", False, f"vLLM's own pick: TRITON_ATTN ({'; '.join(skipped)})")


def _compressed(cc: str | None) -> Attention:
    """DeepSeek V4's sparse attention: FlashMLA on SM90/SM100, FlashInfer's SM12x kernels; no
    backend of vLLM 0.33 runs it on another GPU (``models/deepseek_v4/nvidia/model.py``)."""
    caps = _major_minor(cc)
    why = "vLLM's DeepSeek V4 sparse attention (FlashMLA on SM90/SM100, FlashInfer on SM12x)"
    if caps is not None and caps[0] not in (9, 10, 12):
        return Attention("auto", "split", False, why, f"no vLLM backend runs it at compute capability {cc}")
    return Attention("auto", "split", False, why)


def head_size(model: ModelFacts) -> int:
    """The largest attention head size of ``model`` (vLLM picks one backend for every layer)."""
    sizes = [model.head_dim]
    if model.stack is not None:
        sizes += [a.head_dim for a in model.stack.attention.values() if a.head_dim]
    return max(sizes)


def need_of(model: ModelFacts, kv_dtype: str, dtype: str = "auto") -> Need:
    """What ``model`` asks of a backend (gpt-oss's attention has sinks: ``sinks`` in every layer)."""
    sinks = (model.model_type or "") == "gpt_oss"
    compressed = model.stack is not None and model.stack.compressed is not None
    return Need(head_size(model), kv_dtype, dtype, sinks, bool(model.kv_lora_rank) or compressed, compressed)


def of_instance(
    asked: str, cc: str | None, kv_dtype: str, model: ModelFacts, flag: bool = True, dtype: str = "auto"
) -> Attention:
    """:func:`pick` for ``model``; ``flag``: whether the release takes ``--attention-backend`` (where
    not, an asked backend is not rendered and vLLM picks its own: the prediction follows it)."""
    need = need_of(model, kv_dtype, dtype)
    if asked != "auto" and not flag:
        own = pick("auto", cc, need)
        return own._replace(
            why=f"engine.attention_backend {asked} not rendered (no --attention-backend in "
            f"this vLLM); {own.why}"
        )
    return pick(asked, cc, need)
