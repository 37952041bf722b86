"""Refusal: the model cannot run here, and what would (a 4-bit checkpoint, a shorter context, a
bigger GPU, a smaller model of the same family, more tensor parallelism).

The smaller models come from the model catalog (``hwprofile/data/models.yaml``, read once per
process by :func:`hwprofile.model.catalog_family`, the target's family only)."""

from __future__ import annotations

from ..errors import RefusedError
from ..host.snapshot import HostSnapshot
from ..model import ModelFacts
from .memory import Fit, GiB


class PlanRefused(RefusedError):
    """The model cannot run on this host under these settings; ``suggestions`` say what would."""

    def __init__(self, message: str, suggestions: list[str]) -> None:
        super().__init__(message)
        self.message = message
        self.suggestions = suggestions

    def report(self) -> list[str]:
        """How every command prints a refused plan: the reason, then what would work."""
        more = ["What would work:", *(f"  - {s}" for s in self.suggestions)] if self.suggestions else []
        return [f"hwprofile: cannot plan: {self.message}", *more]


def suggestions(host: HostSnapshot, model: ModelFacts, tp: int, f: Fit, util: float) -> list[str]:
    """What would fit, for a model whose fit ``f`` (per GPU, at TP ``tp``) fails."""
    out: list[str] = []
    need = f.weights_bytes + f.draft_weights_bytes + f.activation_bytes + f.overhead_bytes + 2 * GiB
    fixed = f.budget_bytes - f.kv_cache_bytes  # everything but the KV cache
    if model.bits > 4:
        from ..model import variant_facts

        variant = model.quantized_variants.get(4)
        w4 = (
            variant_facts(model, variant, 4).weights_bytes if variant else model.weights_bytes_at_bits(4)
        ) / tp
        out.append(
            f"a 4-bit checkpoint ({variant or 'AWQ/GPTQ'}): ~{w4 / GiB:.1f} GiB of weights per GPU instead of {f.weights_bytes / GiB:.1f}"
            + (f" (--model {variant} or --set engine.weights_bits=4)" if variant else "")
        )
    if fixed < f.budget_bytes:
        out.append("a shorter context (--set engine.max_model_len=... or engine.min_model_len=...)")
    out.append(f"a GPU with at least {need / util / GiB:.0f} GiB, or more GPUs in tensor parallel")
    room = f.budget_bytes - f.activation_bytes - f.overhead_bytes - 2 * GiB
    smaller = smaller_models(model, room * tp)
    if smaller:
        out.append("a smaller model that fits: " + ", ".join(smaller))
    elif model.stack is not None and model.stack.state is not None:
        # a hybrid whose family has no smaller model in the catalog: what does fit, of another family
        other = smaller_models(model, room * tp, same_family=False)
        if other:
            out.append(
                f"nothing smaller of {model.model_type} in the catalog; of other families: "
                + ", ".join(other)
            )
    if len(host.usable_gpus) > tp:
        out.append(f"--set layout.tensor_parallel_size={tp * 2} (spread the weights over {tp * 2} GPUs)")
    return out


def smaller_models(model: ModelFacts, room_bytes: int, count: int = 3, same_family: bool = True) -> list[str]:
    """Up to ``count`` catalog models of the same family (any family: ``same_family`` False) whose
    weights (16-bit, or their 4-bit checkpoint) fit in ``room_bytes``, largest weights first. The
    same family parses only that family's configs (:func:`hwprofile.model.catalog_family`)."""
    from ..model import catalog_family, catalog_models

    fitting: list[tuple[int, str]] = []  # (weight bytes, checkpoint name)
    for m in catalog_family(model.model_type) if same_family else catalog_models():
        if m.params >= model.params:
            continue
        if m.weights_bytes <= room_bytes:
            fitting.append((m.weights_bytes, m.name))
        elif 4 in m.quantized_variants:
            w4 = m.weights_bytes_at_bits(4)
            if w4 <= room_bytes:
                fitting.append((w4, m.quantized_variants[4]))
    fitting.sort(key=lambda c: -c[0])  # stable: equal sizes keep catalog order
    return [f"{name} ({size / GiB:.1f} GiB)" for size, name in fitting[:count]]
