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
from ..model import ModelFacts
from ..release import first_with, floor_of, release_of
from .memory import GiB
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


def as_loaded(
    model: ModelFacts, settings: Settings, spec_method: str | None, vllm_version: str | None, r: Reasons
) -> ModelFacts:
    """``model`` with ``weights_bytes`` as vLLM loads it: without the vision tower under
    ``--language-model-only``, without the MTP layers unless MTP speculation runs, with the MTP
    drafter's own embedding and LM head where the release keeps them. Unchanged (and no reason) for
    a model with neither part."""
    if not model.vision_bytes and not model.mtp_bytes:
        return model
    weights = model.weights_bytes
    parts: list[str] = []
    if model.vision_bytes:
        if language_only(model, settings, vllm_version):
            weights -= model.vision_bytes
            parts.append(
                f"vision tower {model.vision_bytes / GiB:.2f} GiB not loaded (--language-model-only: "
                "engine.language_model_only; no image inputs planned)"
            )
        else:
            why = (
                "engine.language_model_only off"
                if settings.engine.language_model_only == "off"
                else f"vLLM {vllm_version} has no --language-model-only ({first_with('--language-model-only')}+)"
            )
            parts.append(f"vision tower {model.vision_bytes / GiB:.2f} GiB loaded ({why})")
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
