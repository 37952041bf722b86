"""Refusal: the model cannot run here, and what would (a 4-bit checkpoint, a shorter context, a
bigger GPU, a smaller model of the same family, more tensor parallelism).

The smaller models come from the model catalog (``hwprofile/data/models.yaml``, read once per
process by :func:`hwprofile.model.catalog_family`, the target's family only)."""

from __future__ import annotations

from collections.abc import Callable

from ..errors import RefusedError
from ..host.snapshot import HostSnapshot
from ..model import ModelFacts
from .memory import Fit, GiB
from .tpsplit import tp_refusal


class PlanRefused(RefusedError):
    """The model cannot run on this host under these settings; ``suggestions`` say what would."""

    def __init__(self, message: str, suggestions: list[str], memory: dict[str, int] | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.suggestions = suggestions
        self.memory = memory  # the per-GPU memory fit it was refused on, where memory refused it

    def report(self) -> list[str]:
        """How every command prints a refused plan: the reason, then what would work."""
        more = ["What would work:", *(f"  - {s}" for s in self.suggestions)] if self.suggestions else []
        return [f"hwprofile: cannot plan: {self.message}", *more]


def suggestions(
    host: HostSnapshot,
    model: ModelFacts,
    tp: int,
    f: Fit,
    util: float,
    loaded: Callable[[ModelFacts], int] | None = None,
    refine: bool = True,
) -> list[str]:
    """What would fit, for a model whose fit ``f`` (per GPU, at TP ``tp``) fails. ``loaded`` sizes a
    checkpoint as this plan would load it (:func:`hwprofile.plan.loaded.as_loaded`: no vision tower
    under --language-model-only, no MTP layers without MTP); without it, the whole checkpoint.
    ``refine``: the release refines an FP8 MoE's blocks (:func:`hwprofile.plan.tpsplit.tp_refusal`)."""
    out: list[str] = []
    need = f.weights_bytes + f.draft_weights_bytes + f.activation_bytes + f.overhead_bytes + 2 * GiB
    fixed = f.budget_bytes - f.kv_cache_bytes  # everything but the KV cache
    if model.bits > 4:
        from ..model import variant_facts

        variant = model.quantized_variants.get(4)
        twin = None if variant else catalog_twin(model)
        four = variant or (twin.quantized_variants.get(4) if twin else None)
        base = model if variant else twin
        w4 = (
            (loaded or _whole)(variant_facts(base, four, 4))
            if base is not None and four
            else model.weights_bytes_at_bits(4)
        ) / tp
        if variant:
            how = f" (--model {variant} or --set engine.weights_bits=4)"
        elif twin is not None and four:
            how = f" (--model {four}: the catalog's 4-bit checkpoint of {twin.name}, whose architecture and size this checkpoint has)"
        else:
            how = ""
        if w4 + f.activation_bytes + f.overhead_bytes > f.budget_bytes:
            how += f"; not enough here either (the budget is {f.budget_bytes / GiB:.1f} GiB per GPU)"
        out.append(
            f"a 4-bit checkpoint ({four or 'AWQ/GPTQ'}): ~{w4 / GiB:.1f} GiB of weights per GPU instead of {f.weights_bytes / GiB:.1f}"
            + how
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
    out += _wider(model, tp, len(host.usable_gpus), refine)
    return out


def _wider(model: ModelFacts, tp: int, gpus: int, refine: bool) -> list[str]:
    """A wider tensor-parallel degree this host has that vLLM takes for ``model``; and why a wider one
    it has is no way out (its heads, its FP8 blocks)."""
    out: list[str] = []
    for t in (tp * 2, tp * 4, tp * 8):
        if t > gpus:
            break
        why = tp_refusal(model, t, refine)
        if why is None:
            return [*out, f"--set layout.tensor_parallel_size={t} (spread the weights over {t} GPUs)"]
        if not out:
            out.append(f"not tensor parallel {t}: {why}")
    return out


def _whole(checkpoint: ModelFacts) -> int:
    return checkpoint.weights_bytes


def catalog_twin(model: ModelFacts) -> ModelFacts | None:
    """The catalog model that ``model`` (a local or Hub checkpoint not in the catalog) is a copy of:
    same family, architecture, layer count, widths and vocabulary, parameters within 2 %; or None.
    Its 4-bit checkpoint is then what the refusal names, not a generic one."""
    from ..model import catalog_family

    for m in catalog_family(model.model_type):
        if (
            m.name != model.name
            and m.architecture == model.architecture
            and m.num_layers == model.num_layers
            and m.hidden_size == model.hidden_size
            and m.vocab_size == model.vocab_size
            and abs(m.params - model.params) <= 0.02 * max(m.params, 1)
        ):
            return m
    return None


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
