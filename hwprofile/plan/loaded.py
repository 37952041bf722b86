"""Weights as vLLM loads them (pure: the model's facts, the settings, the speculative method and the
snapshot's vLLM version in; the model with ``weights_bytes`` as loaded out, reasons attached).

A checkpoint holds parts vLLM loads only sometimes (:class:`hwprofile.model.ModelFacts`
``vision_bytes`` and ``mtp_bytes``, estimated by :mod:`hwprofile.model.weights`):

- the vision tower (and an omni model's audio tower: ``_mark_tower_model``): not loaded under
  ``--language-model-only`` (vLLM >= 0.18,
  ``vllm_options.json``); hwprofile plans no image inputs, so ``engine.language_model_only: auto``
  turns it on for a model with a vision tower on a release that has the flag;
- the MTP layers: the target model skips the ``mtp.`` weights unless MTP speculation runs (vLLM's
  ``Qwen3_5ForConditionalGeneration.load_weights`` hands them to the drafter only).

MTP's drafter builds its own embedding and LM head at load (vllm#53887). vLLM deletes them after load
and points the drafter at the target's (read in 0.17.0 and 0.18.0 ``v1/spec_decode/eagle.py``, 0.32.0
``v1/spec_decode/llm_base_proposer.py``: ``_maybe_share_embeddings``/``_maybe_share_lm_head``, "Detected
MTP model. Sharing target model ..."), and its load profiler (``DeviceMemoryProfiler``: ``empty_cache``
then ``max_memory_allocated``) does not count what was freed: from 0.17 (the first release serving
qwen3_5) they cost nothing in the pool, only the load's peak (bf16, vocab x hidden each). Releases
before 0.17 are not verified here: their copy is counted.
"""

from __future__ import annotations

from ..config.settings import Settings
from ..host.snapshot import HostSnapshot
from ..model import ModelFacts
from ..release import Release, first_with, floor_of, release_of
from .context import PlanContext
from .memory import GiB, expert_padding
from .reasons import Reasons


def language_only(model: ModelFacts, settings: Settings, vllm_version: str | None) -> bool:
    """Whether the plan serves ``model`` without its vision tower (``--language-model-only``):
    ``engine.language_model_only`` on, or auto with a vision tower on a release that has the flag (an
    unknown release: the renderer's table decides, and says so where the flag is missing)."""
    choice = settings.engine.language_model_only
    if choice == "off" or not model.vision_bytes:
        return False
    if choice == "on":
        return True
    return release_of(vllm_version).language_model_only()


def mtp_head_bytes(model: ModelFacts, spec_method: str | None, vllm_version: str | None) -> int:
    """The MTP drafter's own embedding and LM head where the release keeps them (bf16, vocab x hidden
    each); 0 from 0.17 on (shared after load) and without MTP speculation."""
    if spec_method != "mtp" or not model.mtp_layers or release_of(vllm_version).mtp_head_shared():
        return 0  # (no release known: the newest behaviour, shared)
    return 2 * model.vocab_size * model.hidden_size * 2


# vLLM's MXFP4 MoE kernel by compute capability major (fused_moe/oracle/mxfp4.py, read in 0.32 and 0.33:
# the first backend of its priority list the GPU supports; Humming ahead of Marlin on SM90 only) and the
# tile mxfp4_round_up_hidden_size_and_intermediate_size rounds (intermediate per rank, hidden) up to.
# gpt-oss has its own list (_get_priority_backends_for_gpt_oss: the OAI Triton kernels on SM90, Marlin
# ahead of them on SM12x); on SM90 the Triton kernels only where vLLM bundles them (release facts
# ``bundled_triton_kernels``), Marlin before.
_MXFP4_MOE: dict[bool, dict[str, tuple[str, tuple[int, int]]]] = {
    True: {  # gpt-oss
        "8": ("Marlin", (128, 256)),
        "9": ("the OAI Triton kernels", (64, 1)),
        "10": ("FlashInfer TRT-LLM MXFP4 (bf16 activations)", (128, 256)),
        "12": ("Marlin", (128, 256)),
    },
    False: {
        "8": ("Marlin", (128, 256)),
        "9": ("Humming", (64, 1)),
        "10": ("FlashInfer TRT-LLM MXFP4 x MXFP8", (128, 256)),
        "12": ("DeepGEMM MXFP4", (128, 128)),
    },
}


def device_cc(host: HostSnapshot) -> str | None:
    """What :func:`expert_tile` keys the kernel on: the first usable GPU's compute capability (None:
    unread), or "cpu" on a host without one (the CPU plan holds the weights whole: no tile)."""
    gpus = host.usable_gpus
    return gpus[0].compute_capability if gpus else "cpu"


def loaded_on(ctx: PlanContext) -> tuple[str | None, tuple[str, ...] | None]:
    """What :func:`as_loaded` takes of the host: the first usable GPU's compute capability
    (:func:`device_cc`) and the kernel packages its snapshot lists; on GPUs, the sampler the release
    warms up, in a reason (``model.sampler``: :func:`hwprofile.plan.engine.sampler`)."""
    from .engine import sampler
    from .memory import sampler_label

    packages = ctx.host.software.kernel_packages
    cc = device_cc(ctx.host)
    if cc != "cpu":  # the CPU backend samples with its own kernels, and plans its RAM apart (plan/cpu.py)
        which, why = sampler(ctx.version, packages)
        ctx.add("model.sampler", sampler_label(which), f"vLLM's memory profile warms up {why}")
    return cc, packages


def expert_tile(
    model: ModelFacts,
    cc: str | None,
    r: Reasons,
    vllm_version: str | None = None,
    kernel_packages: tuple[str, ...] | None = None,
) -> ModelFacts:
    """``model`` with :attr:`~hwprofile.model.ModelFacts.expert_tile` set for the MXFP4 MoE kernel vLLM
    picks on a GPU of compute capability ``cc`` (its routed experts padded per rank to that tile:
    :func:`hwprofile.plan.memory.expert_padding`), the kernel and what it adds per TP degree in a reason.
    Unchanged for a model without such experts; unpadded, and said so, where ``cc`` is unknown."""
    if not model.mxfp4_expert_bytes or cc == "cpu":  # the CPU plan holds the weights whole
        return model
    major = (cc or "").split(".")[0]
    gpt_oss = model.model_type == "gpt_oss"
    kernel = _MXFP4_MOE[gpt_oss].get(major)
    if major == "9" and not gpt_oss and not release_of(vllm_version).humming_mxfp4_moe():
        kernel = ("Marlin (no Humming before vLLM " + floor_of("humming_mxfp4_moe") + ")", (128, 256))
    rel = release_of(vllm_version)
    own = next((p for p in kernel_packages or () if p.startswith("triton-kernels")), None)
    if major == "9" and gpt_oss and not rel.bundled_triton_kernels():
        if own and rel.torch_2_8():  # installed beside vLLM, as its gpt-oss recipe once asked
            kernel = (f"the OAI Triton kernels ({own} installed)", (64, 1))
        else:
            kernel = (
                "Marlin (no triton_kernels in vLLM before " + floor_of("bundled_triton_kernels") + ")",
                (128, 256),
            )
    if kernel is None:
        why = (
            f"compute capability {cc}: no MXFP4 MoE kernel of vLLM's list is read for it"
            if cc
            else "the GPU's compute capability is unknown"
        )
        r.add("model.expert_padding", "unknown", f"routed experts counted unpadded: {why}")
        return model
    name, tile = kernel
    kept, kept_why = _triton_copies(model, rel) if gpt_oss and "Triton" in name else (0, "")
    padded = model._replace(expert_tile=tile, expert_kernel_bytes=kept)
    grows = [
        f"TP{tp} {i} -> {-(-i // tile[0]) * tile[0]}: +{expert_padding(padded, tp) / GiB:.2f} GiB per GPU"
        for tp, i in ((t, model.moe_intermediate_size // t) for t in (1, 2, 4, 8))
        if model.moe_intermediate_size % tp == 0 and expert_padding(padded, tp)
    ]
    r.add(
        "model.expert_padding",
        f"{tile[0]} x {tile[1]}",
        f"routed MXFP4 experts on {name} (compute capability {cc}): vLLM rounds each rank's intermediate "
        f"size up to a multiple of {tile[0]}"
        + (f" and the hidden size to one of {tile[1]}" if tile[1] > 1 else "")
        + " (vLLM's mxfp4_round_up_hidden_size_and_intermediate_size): "
        + ("; ".join(grows) if grows else "no padding at TP 1, 2, 4 or 8")
        + kept_why,
    )
    return padded


def _triton_copies(model: ModelFacts, rel: Release) -> tuple[int, str]:
    """``(bytes, why)`` the OAI Triton kernels' weight processing keeps beside gpt-oss's checkpoint:
    the experts' biases converted to fp32 (two more bytes an element: gate_up's 2 x intermediate and
    down's hidden per expert and layer) and, before release facts ``triton_mxfp4_scales_freed``, the
    experts' block scales swizzled into a copy of their own while the checkpoint's stay (one E8M0 byte
    per 32 four-bit weights: a 17th of the experts' bytes)."""
    biases = 2 * model.num_experts * model.num_layers * (2 * model.moe_intermediate_size + model.hidden_size)
    scales = 0 if rel.triton_mxfp4_scales_freed() else model.mxfp4_expert_bytes // 17
    why = f"; the Triton kernels keep the experts' biases in fp32 (+{biases / GiB:.2f} GiB)"
    if scales:
        why += (
            f" and their block scales twice, the checkpoint's beside the swizzled copy, before vLLM "
            f"{floor_of('triton_mxfp4_scales_freed')} (+{scales / GiB:.2f} GiB)"
        )
    return biases + scales, why


def _vision(model: ModelFacts, settings: Settings, vllm_version: str | None) -> tuple[int, str]:
    """The vision tower's bytes not loaded (all, or none) and why."""
    if language_only(model, settings, vllm_version):
        return model.vision_bytes, (
            f"vision tower {model.vision_bytes / GiB:.2f} GiB not loaded (--language-model-only: "
            "engine.language_model_only; no image inputs planned)"
        )
    why = (
        "engine.language_model_only off"
        if settings.engine.language_model_only == "off"
        else f"vLLM {vllm_version} has no --language-model-only ({first_with('--language-model-only')}+)"
    )
    return 0, f"vision tower {model.vision_bytes / GiB:.2f} GiB loaded ({why})"


def as_loaded(
    model: ModelFacts,
    settings: Settings,
    spec_method: str | None,
    vllm_version: str | None,
    r: Reasons,
    cc: str | None = None,
    kernel_packages: tuple[str, ...] | None = None,
) -> ModelFacts:
    """``model`` with ``weights_bytes`` as vLLM loads it: without the vision tower under
    ``--language-model-only``, without the MTP layers unless MTP speculation runs, with the MTP
    drafter's own embedding and LM head where the release keeps them; and its MXFP4 experts' tile on
    a GPU of compute capability ``cc`` (:func:`expert_tile`; ``kernel_packages``: the host's, as its
    snapshot says them). Unchanged (and no reason) for a model with none of these."""
    if spec_method == "mtp" and model.mtp_mxfp4_expert_bytes:  # the MTP layers' experts padded alike
        both = (
            model.mxfp4_expert_bytes + model.mtp_mxfp4_expert_bytes
        )  # folded once: a second call adds nothing
        model = model._replace(mxfp4_expert_bytes=both, mtp_mxfp4_expert_bytes=0)
    model = expert_tile(model, cc, r, vllm_version, kernel_packages)
    if not model.vision_bytes and not model.mtp_bytes:
        return model
    weights = model.weights_bytes
    parts: list[str] = []
    if model.vision_bytes:
        dropped, said = _vision(model, settings, vllm_version)
        weights -= dropped
        parts.append(said)
    if model.mtp_bytes:
        if spec_method == "mtp":
            parts.append(f"MTP layer(s) {model.mtp_bytes / GiB:.2f} GiB loaded (MTP speculation runs)")
        else:
            weights -= model.mtp_bytes
            parts.append(
                f"MTP layer(s) {model.mtp_bytes / GiB:.2f} GiB not loaded (no MTP speculation: the target "
                "model skips the mtp. weights)"
            )
    head = mtp_head_bytes(model, spec_method, vllm_version)
    if head:
        weights += head
        parts.append(
            f"the MTP drafter's own bf16 embedding and LM head {head / GiB:.2f} GiB (vllm#53887; vLLM "
            f"{vllm_version} is older than {floor_of('mtp_head_shared')}, read to free them after load: counted)"
        )
    elif spec_method == "mtp" and model.mtp_layers:
        peak = 2 * model.vocab_size * model.hidden_size * 2
        parts.append(
            f"the MTP drafter's own bf16 embedding and LM head ({peak / GiB:.2f} GiB, vllm#53887): freed after "
            f"load and shared with the target's from vLLM {floor_of('mtp_head_shared')} "
            "(_maybe_share_embeddings/_maybe_share_lm_head), "
            "so only the load's peak holds them, not the pool"
        )
    r.add(
        "model.weights_bytes",
        weights,
        f"{weights / GiB:.2f} GiB as vLLM loads it, of the checkpoint's {model.weights_bytes / GiB:.2f} GiB: "
        + "; ".join(parts),
        ("engine", "language_model_only"),
    )
    return model._replace(weights_bytes=weights)
