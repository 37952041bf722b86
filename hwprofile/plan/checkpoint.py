"""Which checkpoint runs: the one asked for, its quantized variant when ``engine.weights_bits``
asks for fewer bits, or (``weights_bits: auto``) its 4-bit variant when the full-precision one
does not fit any GPU layout; and the model's description in the plan."""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

from ..config.settings import Settings
from ..host.snapshot import Gpu
from ..model import ModelFacts, variant_facts
from .reasons import Reasons
from .refusal import PlanRefused
from .types import ABSENT, ModelSummary

if TYPE_CHECKING:
    from .predict import Calibration


def choose_checkpoint(model: ModelFacts, settings: Settings, r: Reasons) -> ModelFacts:
    """Honour ``engine.weights_bits``: a catalog model switches to its quantized checkpoint; a local
    checkpoint cannot be re-quantized here."""
    bits = settings.engine.weights_bits
    if not isinstance(bits, int) or bits >= model.bits:
        return model
    variant = model.quantized_variants.get(bits)
    if variant:
        r.add(
            "model.name",
            variant,
            f"engine.weights_bits={bits}: the {bits}-bit checkpoint of {model.name}",
            ("engine", "weights_bits"),
        )
        return quantized(model, variant, bits)
    raise PlanRefused(
        f"engine.weights_bits={bits} asks for a {bits}-bit checkpoint, but {model.name} is {model.bits}-bit "
        "and hwprofile does not re-quantize weights",
        [
            f"point --model at a {bits}-bit (AWQ/GPTQ) checkpoint of this model",
            "or remove engine.weights_bits",
        ],
    )


def quantized(model: ModelFacts, variant: str, bits: int) -> ModelFacts:
    """The facts of ``model``'s ``bits``-bit checkpoint ``variant`` (:func:`hwprofile.model.variant_facts`)."""
    return variant_facts(model, variant, bits)


def four_bit_fallback(model: ModelFacts, settings: Settings, gpus: tuple[Gpu, ...]) -> str | None:
    """The 4-bit checkpoint to plan instead of ``model`` when ``model`` does not fit, or None:
    only with ``engine.weights_bits: auto``, on GPUs (4-bit AWQ checkpoints need GPU kernels: no
    automatic switch for the CPU backend), for a model above 4 bits that has a 4-bit variant."""
    variant = model.quantized_variants.get(4)
    if variant and gpus and model.bits > 4 and settings.engine.weights_bits == "auto":
        return variant
    return None


def use_four_bit(model: ModelFacts, variant: str, r: Reasons) -> ModelFacts:
    """Switch to the 4-bit ``variant`` (see :func:`four_bit_fallback`), with its reason."""
    r.add(
        "model.name",
        variant,
        f"{model.name} at {model.bits} bits does not fit this host; its 4-bit checkpoint {variant} does (engine.weights_bits: auto)",
        ("engine", "weights_bits"),
    )
    return quantized(model, variant, 4)


def model_summary(m: ModelFacts) -> ModelSummary:
    """A model's facts as the plan shows them."""
    return ModelSummary(
        name=m.name,
        source=m.source,
        path=m.path,
        architecture=m.architecture,
        params=m.params,
        weights_bytes=m.weights_bytes,
        weights_bytes_source=m.weights_bytes_source,
        bits=m.bits,
        quantization=m.quant_method,
        layers=m.num_layers,
        kv_heads=m.num_kv_heads,
        head_dim=m.head_dim,
        vocab_size=m.vocab_size,
        sliding_window=m.sliding_window,
        sliding_layers=m.sliding_layers,
        revision=m.revision or ABSENT,
        origin=m.origin or ABSENT,
    )


def calibration_mismatch(cal: Calibration, ours: ModelSummary) -> str | None:
    """Why ``cal`` (a bench of this host) does not describe a step of the model ``ours`` (the checkpoint
    that runs), or None where it does: the facts a step's cost follows, where the bench recorded them
    (:meth:`ModelSummary.cost_facts`), agree, whatever the model's name or path; else, where it named
    only the model, that is ``ours`` by path or name. A bench that names no model is taken as this one's."""
    if cal.model_facts:
        here = ours.cost_facts()
        differ = [f"{k} {v} there, {here.get(k)} here" for k, v in cal.model_facts if here.get(k) != v]
        return f"it measured {cal.model or 'another model'} ({'; '.join(differ)})" if differ else None
    if cal.model is not None and cal.model not in (ours.path, ours.name):
        return f"it measured {cal.model}"
    return None


def calibration_for(
    cal: Calibration, ours: ModelSummary, operators_acceptance: bool
) -> tuple[Calibration | None, str | None]:
    """``cal`` as a plan of ``ours`` takes it, and why not where it does not: (None, why) where it
    measured another model (:func:`calibration_mismatch`); its measured speculative acceptance not
    applied where an operator set ``speculative.assumed_acceptance`` (``operators_acceptance``: the
    bench is still modelled at what it measured)."""
    why = calibration_mismatch(cal, ours)
    if why is not None:
        return None, why
    if operators_acceptance and cal.acceptance is not None:
        return dataclasses.replace(cal, acceptance_applies=False), None
    return cal, None
