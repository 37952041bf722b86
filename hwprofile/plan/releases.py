"""A plan for a release older than the first serving the model's architecture is refused, naming
the first one that has it (the floors: :data:`hwprofile.release.ARCHITECTURES`), and one for a release
that no longer serves it, naming the last (:data:`hwprofile.release.REMOVED`); what hwprofile knows
of hybrid model families (fp8 KV, the MTP method's name).
"""

from __future__ import annotations

from collections.abc import Callable

from ..model import ModelFacts
from ..release import LAST_SERVING, Unlisted, release_of
from .refusal import PlanRefused


def refuse_old_release(model: ModelFacts, vllm_version: str | None, warn: Callable[[str], None]) -> None:
    """:class:`PlanRefused` where the snapshot's vLLM is older than the first release serving the
    model's architecture, or past the last one (vLLM refuses an architecture it removed by name:
    :data:`hwprofile.release.REMOVED`); nothing where either is unknown. A release whose registry
    does not list the architecture refuses it too, unless its Transformers backend may serve it (an
    attention-only model: a warning then, ``warn``)."""
    rel = release_of(vllm_version)
    gone = rel.removed_architecture(model.architecture)
    if gone is not None:
        last = LAST_SERVING[gone]
        raise PlanRefused(
            f"{model.name}: vLLM {vllm_version} no longer serves "
            f"{gone.what.format(arch=model.architecture)}; the last release that does is {last} "
            f"({gone.source})",
            [f"vLLM <= {last}"],
        )
    floor = rel.missing_architecture(model.model_type)
    if floor is not None:
        raise PlanRefused(
            f"{model.name}: vLLM {vllm_version} does not serve {floor.what}; the first release that does "
            f"is {floor.text}",
            [f"vLLM >= {floor.text}"],
        )
    _refuse_unlisted(model, vllm_version, rel.unlisted_architecture(model.architecture), warn)


def _refuse_unlisted(
    model: ModelFacts, vllm_version: str | None, unlisted: Unlisted | None, warn: Callable[[str], None]
) -> None:
    if unlisted is None:
        return
    said = (
        f"vLLM {vllm_version}'s model registry does not list {model.architecture}: no release read up to "
        f"{unlisted.last_without} lists it, {unlisted.first_listed} does ({unlisted.source})"
    )
    state = model.stack is not None and model.stack.is_hybrid_state
    if unlisted.transformers_backend and not state:
        warn(f"{said}: it runs only through vLLM's Transformers backend, where transformers implements it")
        return
    why = (
        "recurrent state layers, which the Transformers backend does not run"
        if state
        else "no Transformers backend"
    )
    raise PlanRefused(f"{model.name}: {said}; {why}", [f"vLLM >= {unlisted.first_listed}"])


# 8-bit KV cache on hybrid models, by model family (the name or path, lower case): verified, or
# known to corrupt output, with the evidence. A hybrid family not listed is not verified: its KV
# stays in the model's dtype unless engine.kv_cache_dtype asks for fp8 outright.
FP8_KV_FAMILIES: tuple[tuple[str, bool, str], ...] = (
    (r"qwen3\.6", False, "corrupted output with fp8 KV on Qwen3.6 (vllm#26646)"),
    (
        r"qwen3\.8",
        True,
        "verified on Qwen3.8 by operators' needle tests to ~52k tokens and a published "
        "vLLM log at fp8 KV (docs/qwen3.8-27b.md)",
    ),
)


def fp8_kv_verdict(model: ModelFacts) -> tuple[bool, str] | None:
    """``(verified, evidence)`` for fp8 KV on ``model``'s family; None where hwprofile knows nothing."""
    import re

    text = f"{model.name} {model.path or ''}".lower()
    for pattern, ok, why in FP8_KV_FAMILIES:
        if re.search(pattern, text):
            return ok, why
    return None


# The MTP method's name for the qwen3_5 architecture: `mtp` in every release that serves it. Read in
# vLLM 0.17.0, 0.18.0 and 0.32.0 (vllm/config/speculative.py): `qwen3_5_mtp` is in MTPModelTypes but
# "method `%s` is deprecated and replaced with mtp"; the draft's model_type is rewritten to
# qwen3_5_mtp from the target's whichever name is given. hwprofile renders `mtp`.
MTP_METHOD_NAME = "mtp"
