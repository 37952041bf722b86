"""The first vLLM release that serves an architecture: a plan for an older release is refused,
naming the first one that has it (pure: the model's facts and the snapshot's vLLM version in).

Sources (../shared/facts/hybrid.md, checked against each release's ``model_executor/models``):
``Qwen3_5ForConditionalGeneration`` / ``qwen3_5`` (Qwen3.5, Qwen3.6, Qwen3.8) from vLLM 0.17.0;
0.16 refuses the architecture.
"""

from __future__ import annotations

from ..model import ModelFacts
from .refusal import PlanRefused
from .shape import _version

# model_type prefix (the text config's, as hwprofile reads it): (first release, what it is)
FIRST_RELEASE: dict[str, tuple[tuple[int, int, int], str]] = {
    "qwen3_5": ((0, 17, 0), "the qwen3_5 architecture (Qwen3.5 / Qwen3.6 / Qwen3.8: Gated DeltaNet hybrid)"),
}


def first_release(model: ModelFacts) -> tuple[tuple[int, int, int], str] | None:
    """The first vLLM release serving ``model``'s architecture, where hwprofile knows it."""
    mtype = model.model_type or ""
    for prefix, (since, what) in FIRST_RELEASE.items():
        if mtype.startswith(prefix):
            return since, what
    return None


def refuse_old_release(model: ModelFacts, vllm_version: str | None) -> None:
    """:class:`PlanRefused` where the snapshot's vLLM is older than the first release serving the
    model's architecture; nothing where either is unknown."""
    known = first_release(model)
    have = _version(vllm_version)
    if known is None or have is None:
        return
    since, what = known
    if have < since:
        first = ".".join(map(str, since))
        raise PlanRefused(
            f"{model.name}: vLLM {vllm_version} does not serve {what}; the first release that does is {first}",
            [f"vLLM >= {first}"],
        )


# 8-bit KV cache on hybrid models, by model family (the name or path, lower case): verified, or
# known to corrupt output, with the evidence. A hybrid family not listed is not verified: its KV
# stays in the model's dtype unless engine.kv_cache_dtype asks for fp8 outright.
FP8_KV_FAMILIES: tuple[tuple[str, bool, str], ...] = (
    (r"qwen3\.6", False, "corrupted output with fp8 KV on Qwen3.6 (vllm#26646)"),
    (r"qwen3\.8", True, "verified on Qwen3.8 by operators' needle tests to ~52k tokens and a published "
     "vLLM log at fp8 KV (docs/qwen3.8-27b.md)"),
)  # fmt: skip


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
