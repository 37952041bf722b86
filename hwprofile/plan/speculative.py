"""Speculative decoding: the method and the draft (asked for, the model's own MTP layers, a
catalog draft of the same family and vocabulary, or ngram prompt lookup), the per-instance
fallback to ngram when the draft does not fit beside the target, and the speculative config.

Catalog drafts come from the model catalog (``hwprofile/data/models.yaml``, read once per
process by :func:`hwprofile.model.catalog_family`, the target's family only)."""

from __future__ import annotations

from typing import Any

from ..model import ModelFacts
from ..model.tokenizer_check import TokenizerCheck, check_facts
from ..release import first_speculative, release_of
from .context import PlanContext
from .engine import fit_args
from .memory import Fit, GiB, fit, sequence_bytes
from .predict import target_miss
from .reasons import Reasons
from .refusal import PlanRefused
from .types import InstancePlan, InstancePrediction, Plan, SpeculativeConfig, _freeze


def heterogeneous_vocab_ok(vllm_version: str | None) -> bool:
    """vLLM 0.25+ runs a draft with another vocabulary (``use_heterogeneous_vocab``); older releases
    refuse it (facts: shared/facts/vllm-flags.md, speculative config)."""
    return release_of(vllm_version).heterogeneous_vocab()


def draft_candidates(model: ModelFacts, want_b: float) -> list[ModelFacts]:
    """Catalog models of the target's family at most a quarter its size, closest to ``want_b``
    billion parameters first."""
    from ..model import catalog_family

    out = [d for d in catalog_family(model.model_type) if d.params * 4 <= model.params]
    return sorted(out, key=lambda d: abs(d.params / 1e9 - want_b))


def choose_speculator(
    ctx: PlanContext, model: ModelFacts, draft: ModelFacts | None
) -> tuple[str | None, ModelFacts | None]:
    """``(method, draft)`` from ``speculative.method`` (and ``speculative.draft`` as ``draft``)."""
    method = ctx.settings.speculative.method
    src = ("speculative", "method")
    if method == "none":
        ctx.add("speculative.method", None, "speculative decoding is off", src)
        return None, None
    if method in ("ngram", "suffix"):
        ctx.add(
            "speculative.method",
            method,
            f"{method} asked for: proposals from the prompt, no draft model",
            src,
        )
        return method, None
    if method in ("eagle", "eagle3"):
        if draft is None:
            raise PlanRefused(
                f"speculative.method={method} needs speculative.draft (an EAGLE head for this model)",
                ["set speculative.draft to the EAGLE checkpoint", "or use speculative.method=ngram"],
            )
        ctx.add("speculative.method", method, f"{method} head {draft.name}", src)
        return method, draft
    if method == "mtp" or (method == "auto" and model.mtp_layers and draft is None):
        if not model.mtp_layers:
            raise PlanRefused(
                f"speculative.method=mtp, but {model.name} ships no multi-token-prediction layers",
                ["use speculative.method=draft_model or ngram"],
            )
        ctx.add(
            "speculative.method",
            "mtp",
            f"{model.name} ships {model.mtp_layers} MTP layer(s): no separate draft needed",
            src,
        )
        return "mtp", None
    # draft_model or auto
    if draft is not None:
        chosen = _given_draft(ctx, model, draft, heterogeneous_vocab_ok(ctx.version), method)
    else:
        chosen = _catalog_draft(model, method, ctx.settings.speculative.draft_params_b, ctx.reasons)
    return _draft_on_this_host(ctx, model, chosen, method)


LOCAL_SOURCES = ("dir", "hf-cache")  # a model whose files are on this host


def _draft_on_this_host(
    ctx: PlanContext, model: ModelFacts, chosen: tuple[str | None, ModelFacts | None], method: str
) -> tuple[str | None, ModelFacts | None]:
    """A target served from this host's files runs offline (``HF_HUB_OFFLINE=1``): a draft that is not
    on this host cannot be fetched at start, so the plan says so itself (ngram for ``auto``, a refusal
    for ``draft_model``) rather than leaving ``render`` and ``launch`` to run something else."""
    spec, draft = chosen
    if (
        spec != "draft_model"
        or draft is None
        or model.source not in LOCAL_SOURCES
        or draft.source in LOCAL_SOURCES
    ):
        return chosen
    fetch = f"hf download {draft.name}"
    msg = (
        f"the draft {draft.name} is not on this host and the target {model.name} is served from its files "
        "offline (HF_HUB_OFFLINE=1), so vLLM could not fetch it at start"
    )
    if method == "draft_model":
        raise PlanRefused(
            f"speculative.method=draft_model: {msg} ({fetch} first)",
            [f"download it first: {fetch}", "or use speculative.method=ngram"],
        )
    ctx.warn(f"{msg}: ngram prompt lookup planned instead; to use the draft: {fetch}, then plan again")
    ctx.add(
        "speculative.method",
        "ngram",
        f"{msg}; ngram proposals instead (to use it: {fetch})",
        ("speculative", "draft"),
    )
    return "ngram", None


def tokenizer_check(model: ModelFacts, draft: ModelFacts) -> TokenizerCheck:
    """The target's and the draft's tokenizers compared (:mod:`hwprofile.model.tokenizer_check`),
    from the facts the pipeline read into each (``ModelFacts.tokenizer``): nothing is read here."""
    return check_facts(model.tokenizer, draft.tokenizer)


def needs_vocab_mapping(model: ModelFacts, draft: ModelFacts | None) -> bool:
    """The draft runs with vLLM's heterogeneous-vocabulary mapping: another ``vocab_size``, or the
    same size with ids that mean other tokens (the planner only chooses this on vLLM 0.25+)."""
    if draft is None:
        return False
    return draft.vocab_size != model.vocab_size or tokenizer_check(model, draft).ids_differ


def _warn_if_same(ctx: PlanContext, model: ModelFacts, draft: ModelFacts) -> None:
    """Warn where the draft is the target itself (or the same architecture and size)."""
    if (draft.path == model.path and draft.name == model.name) or (
        draft.params == model.params
        and draft.num_layers == model.num_layers
        and draft.hidden_size == model.hidden_size
        and draft.vocab_size == model.vocab_size
    ):
        ctx.warn(
            f"the draft {draft.name} is the target itself (or the same architecture and size): each "
            "proposed token costs a whole target step, so speculation cannot be faster than none "
            "(only a test of the mechanism); use speculative.method=ngram or a much smaller draft"
        )


def _to_ngram(ctx: PlanContext, msg: str) -> tuple[str | None, ModelFacts | None]:
    """The draft refused for ``msg``: ngram proposals instead, with a warning."""
    ctx.warn(msg + "; falling back to ngram")
    ctx.add("speculative.method", "ngram", msg + "; ngram proposals instead", ("speculative", "draft"))
    return "ngram", None


def _mapped_vocab(
    ctx: PlanContext, model: ModelFacts, draft: ModelFacts, check: TokenizerCheck, hetero: str
) -> tuple[str | None, ModelFacts | None]:
    """A draft with the target's vocab_size but other token ids, on a vLLM that maps the two
    vocabularies (use_heterogeneous_vocab)."""
    ctx.add(
        "speculative.method",
        "draft_model",
        f"draft {draft.name}: {check.summary()}; the installed vLLM ({hetero}+) maps the two vocabularies "
        f"through their {check.common_tokens} common token strings (use_heterogeneous_vocab)",
        ("speculative", "draft"),
    )
    ctx.warn(
        f"the draft {draft.name} shares the target's vocab_size but not its tokens ({check.differing_ids} "
        f"of {check.shared_ids} ids differ): planned with use_heterogeneous_vocab, so the draft proposes only "
        f"the {check.common_tokens} tokens both have (the target's others are never proposed)"
    )
    return "draft_model", draft


def _other_tokenizer(
    ctx: PlanContext, model: ModelFacts, draft: ModelFacts, check: TokenizerCheck, hetero: str, method: str
) -> tuple[str | None, ModelFacts | None]:
    """A draft with the target's vocab_size but not its tokenizer, on a vLLM that passes ids unmapped:
    refused for ``draft_model``, ngram for ``auto``."""
    msg = (
        f"draft {draft.name} has the target's vocab_size ({model.vocab_size}) but not its tokenizer: "
        f"{check.summary()}; vLLM before {hetero} passes token ids between them unmapped, so the draft's "
        "proposals mean other text and are rejected"
    )
    if method == "draft_model":
        raise PlanRefused(
            f"speculative.method=draft_model: {msg}",
            [
                "a draft trained with the target's tokenizer (same family and release)",
                f"vLLM {hetero}+ (maps the vocabularies with use_heterogeneous_vocab)",
                "or speculative.method=ngram",
            ],
        )
    return _to_ngram(ctx, msg)


def _given_draft(
    ctx: PlanContext, model: ModelFacts, draft: ModelFacts, hetero_ok: bool, method: str
) -> tuple[str | None, ModelFacts | None]:
    """The draft from ``speculative.draft``, unless the installed vLLM refuses its vocabulary or its
    tokenizer is not the target's (then refused for ``draft_model``, ngram for ``auto``)."""
    _warn_if_same(ctx, model, draft)
    check = tokenizer_check(model, draft)
    hetero = first_speculative("heterogeneous_vocab")  # the first release mapping two vocabularies
    if draft.vocab_size != model.vocab_size and hetero_ok:
        shared = f" ({check.common_tokens} token strings in common)" if check.checked else ""
        ctx.add(
            "speculative.method",
            "draft_model",
            f"draft {draft.name} has vocab_size {draft.vocab_size}, the target {model.vocab_size}: the "
            f"installed vLLM ({hetero}+) runs it with use_heterogeneous_vocab (proposals mapped through the "
            f"shared tokens{shared})",
            ("speculative", "draft"),
        )
        return "draft_model", draft
    if draft.vocab_size != model.vocab_size:
        return _to_ngram(
            ctx,
            f"draft {draft.name} has vocab_size {draft.vocab_size} but the target has {model.vocab_size}: "
            f"vLLM before {hetero} refuses a draft whose vocabulary differs ({hetero}+ accepts it with "
            "use_heterogeneous_vocab)",
        )
    if check.ids_differ and hetero_ok:
        return _mapped_vocab(ctx, model, draft, check, hetero)
    if check.ids_differ:
        return _other_tokenizer(ctx, model, draft, check, hetero, method)
    if check.special_diffs:
        ctx.warn(
            f"the draft {draft.name} maps every shared id to the target's token, but "
            + "; ".join(check.special_diffs[:4])
            + ": proposals are valid, expect fewer accepted around those tokens (chat turns, ends)"
        )
    note = check.summary() if check.checked else f"tokenizers not compared: {check.why}"
    ctx.add(
        "speculative.method",
        "draft_model",
        f"draft {draft.name} ({draft.params / 1e9:.1f}B) shares the target's vocabulary "
        f"({model.vocab_size}); {note}",
        ("speculative", "draft"),
    )
    return "draft_model", draft


def _catalog_draft(
    model: ModelFacts, method: str, want_b: float, r: Reasons
) -> tuple[str | None, ModelFacts | None]:
    """The catalog draft closest to the profile's draft class; else ngram (``auto``) or a refusal
    (``draft_model``)."""
    rejected = []
    for cand in draft_candidates(model, want_b):
        if cand.params > 3 * want_b * 1e9:
            rejected.append(
                f"{cand.name} ({cand.params / 1e9:.1f}B) is far above the ~{want_b:g}B draft class"
            )
            continue
        if cand.vocab_size != model.vocab_size:
            rejected.append(f"{cand.name}: vocab_size {cand.vocab_size} != {model.vocab_size}")
            continue
        r.add(
            "speculative.method",
            "draft_model",
            f"catalog draft {cand.name} ({cand.params / 1e9:.1f}B, same family, same vocab_size {model.vocab_size}) "
            f"is the closest to the profile's ~{want_b:g}B draft class",
            ("speculative", "draft_params_b"),
        )
        return "draft_model", cand
    why = "; ".join(rejected[:3]) or f"no catalog draft of the {model.model_type or 'unknown'} family"
    if method == "draft_model":
        raise PlanRefused(
            f"speculative.method=draft_model but no compatible draft: {why}",
            ["set speculative.draft to a model with the same vocabulary", "or use speculative.method=ngram"],
        )
    r.add(
        "speculative.method",
        "ngram",
        f"no compatible draft model ({why}); ngram prompt lookup needs none",
        ("speculative", "method"),
    )
    return "ngram", None


def fit_beside_draft(
    ctx: PlanContext,
    total: int,
    util: float,
    model: ModelFacts,
    draft: ModelFacts | None,
    spec_method: str | None,
    tp: int,
    kv_bytes: int,
    eager: bool,
    key: str,
    name: str,
) -> tuple[Fit, ModelFacts | None, str | None]:
    """``(fit, draft, method)`` of one instance: with its draft where target and draft fit; ngram
    instead where only the target does; else the target's own (failing) fit, for the refusal."""
    settings = ctx.settings
    batched = settings.engine.max_num_batched_tokens
    seqs = settings.engine.max_num_seqs
    f = fit(
        total,
        util,
        model,
        draft,
        tp,
        kv_bytes,
        batched,
        seqs,
        **fit_args(settings, eager, ctx.version, ctx.host.software.kernel_packages),
    )
    if draft is None:
        return f, draft, spec_method
    # room for the shortest context the profile accepts (a KV cache of a few bytes "fits", and then the
    # plan is refused where the target alone would run)
    need = settings.engine.min_model_len
    if f.fits and f.kv_cache_bytes >= sequence_bytes(model, draft, tp, kv_bytes, need):
        return f, draft, spec_method
    no_draft = fit(
        total,
        util,
        model,
        None,
        tp,
        kv_bytes,
        batched,
        seqs,
        **fit_args(settings, eager, ctx.version, ctx.host.software.kernel_packages),
    )
    if no_draft.fits and no_draft.kv_cache_bytes >= sequence_bytes(model, None, tp, kv_bytes, need):
        ctx.warn(f"{name}: the draft {draft.name} does not fit beside the target; ngram speculation instead")
        ctx.add(
            f"{key}.speculative.method",
            "ngram",
            f"draft {draft.name} ({draft.weights_bytes / GiB:.1f} GiB) leaves less KV cache than one "
            f"{need}-token request (engine.min_model_len)",
        )
        return no_draft, None, "ngram"
    return no_draft, draft, spec_method  # refused (by the caller) on the target's own needs


def speculative_config(
    ctx: PlanContext,
    method: str | None,
    draft: ModelFacts | None,
    tp: int,
    key: str,
    model: ModelFacts | None = None,
) -> SpeculativeConfig | None:
    """The instance's speculative section: method, draft, k (fixed, or by batch size), ngram window;
    ``use_heterogeneous_vocab`` where the draft's ids are not the target's (``model``)."""
    settings = ctx.settings
    if method is None:
        return None
    k = settings.speculative.num_speculative_tokens
    ctx.add(
        f"{key}.speculative.num_speculative_tokens",
        k,
        f"{k} tokens proposed per step",
        ("speculative", "num_speculative_tokens"),
    )
    spec: dict[str, Any] = {
        "method": method,
        "model": draft.path or draft.name if draft else None,
        "num_speculative_tokens": k,
    }
    if draft is not None:
        spec["draft_tensor_parallel_size"] = tp
        ctx.add(
            f"{key}.speculative.draft_tensor_parallel_size",
            tp,
            # the V1 draft-model proposer (v1/spec_decode/draft_model.py, ValueError): the table's draft_model
            f"vLLM (>= {first_speculative('draft_model')}) requires the draft's TP to equal the target's",
        )
    if method == "draft_model" and model is not None and needs_vocab_mapping(model, draft):
        spec["use_heterogeneous_vocab"] = True
        ctx.add(
            f"{key}.speculative.use_heterogeneous_vocab",
            True,
            "the draft's token ids are not the target's: vLLM maps them through the shared tokens",
        )
    if method == "ngram":
        spec["prompt_lookup_max"] = settings.speculative.prompt_lookup_max
        spec["prompt_lookup_min"] = settings.speculative.prompt_lookup_min
    table = settings.speculative.by_batch_size
    if table:
        spec["num_speculative_tokens_per_batch_size"] = table
        ctx.add(
            f"{key}.speculative.num_speculative_tokens_per_batch_size",
            table,
            "k chosen by the running batch size (vLLM has no per-request k): fewer proposals as load grows",
            ("speculative", "by_batch_size"),
        )
    return SpeculativeConfig(**_freeze(spec))


def draft_cost(plan: Plan, inst: InstancePlan) -> float:
    """What one proposed token costs beside one target step, as a fraction of the target's: a draft
    model its parameters over the target's, MTP and EAGLE heads about one extra decoder layer of the
    target's, n-gram matching nothing. The one formula the daemon's k advice, ``watch`` and
    ``plan --advice-from`` use."""
    spec = inst.speculative
    method = spec.method if spec else None
    if method == "draft_model" and plan.draft and plan.draft.params and plan.model.params:
        return round(plan.draft.params / plan.model.params, 4)
    if method in ("mtp", "eagle", "eagle3") and plan.model.layers:
        return round(1 / plan.model.layers, 4)
    return 0.0


# A draft the profile's ``speculative.method: auto`` chose gives way to no speculation only where that is
# predicted this much better on the plan's objective (as the shipped layout and batching give way,
# plan/layout.py LAYOUT_MARGIN, plan/batching.py BATCHING_MARGIN); an operator's method or draft never.
DRAFT_MARGIN = 0.10


def draft_starves_kv(plan: Plan) -> bool:
    """Some instance running a draft cannot hold its share of the workload's requests in its KV cache
    (requests in flight x (input + output) tokens; a data-parallel server's over all its ranks' caches):
    the draft's weights and KV then make requests wait, and planning without it is worth predicting."""
    for inst in plan.instances:
        sp, pred = inst.speculative, inst.prediction
        if sp is None or sp.method != "draft_model" or not isinstance(pred, InstancePrediction):
            continue
        per_request = int(pred.workload["input_len"]) + int(pred.workload["output_len"])
        # a data-parallel server's requests spread over its ranks, each with its own KV cache
        if inst.memory.kv_tokens * inst.ranks < pred.concurrency * per_request:
            return True
    return False


def draft_misses_targets(plan: Plan, ttft_target_ms: float, tpot_target_ms: float) -> str | None:
    """What an instance running a draft misses of the targets at the workload (its predicted TTFT or
    TPOT over them), in words; None where every such instance meets them. A draft's verify and proposal
    steps grow with the batch while its gain per step does not: at a large batch it can make the very
    steps it was to shorten longer, and planning without it is worth predicting."""
    for inst in plan.instances:
        sp, pred = inst.speculative, inst.prediction
        if sp is None or sp.method != "draft_model" or not isinstance(pred, InstancePrediction):
            continue
        missed = [f"TTFT {pred.ttft_ms:.0f} ms over {ttft_target_ms:g}"] * (pred.ttft_ms > ttft_target_ms) + [
            f"TPOT {pred.tpot_ms:.1f} ms over {tpot_target_ms:g}"
        ] * (pred.tpot_ms > tpot_target_ms)
        if missed:
            return ", ".join(missed)
    return None


def _figures(
    preds: list[InstancePrediction], output_len: int, targets: tuple[float, float] | None = None
) -> tuple[float, float, str]:
    """(output tokens/s of all instances, the longest request's ms, both in words: the TTFT and TPOT of
    the instance with the longest request, or where ``targets`` are given the one farthest from them)."""
    out = sum(p.output_tokens_per_s for p in preds)

    def request(p: InstancePrediction) -> float:
        return p.ttft_ms + (output_len - 1) * p.tpot_ms

    req = max(request(p) for p in preds)
    worst = (
        max(preds, key=lambda p: target_miss(p.ttft_ms, p.tpot_ms, targets))
        if targets
        else max(preds, key=request)
    )
    words = f"TTFT {worst.ttft_ms:.0f} ms, TPOT {worst.tpot_ms:.1f} ms, {out:.0f} output tok/s"
    return out, req, words


def draft_gain(
    with_draft: list[InstancePrediction],
    without: list[InstancePrediction],
    objective: str,
    ttft_target_ms: float,
    tpot_target_ms: float,
    output_len: int,
) -> tuple[bool, str]:
    """Whether planning without the draft is predicted at least :data:`DRAFT_MARGIN` better on
    ``objective``, and the two predictions in words. ``throughput``: the output tokens/s of a plan
    within the targets at the workload (TTFT and TPOT of every instance), where only one is within
    them it wins; where neither is, the plan closer to them (its instance farthest from a target, the
    measure of the layout's and the batching's fallbacks), unless it loses more than the margin of
    output tokens/s; ``latency``: the longest request (TTFT + (output - 1) x TPOT)."""

    def within(preds: list[InstancePrediction]) -> bool:
        return all(p.ttft_ms <= ttft_target_ms and p.tpot_ms <= tpot_target_ms for p in preds)

    def miss(preds: list[InstancePrediction]) -> float:
        return max(target_miss(p.ttft_ms, p.tpot_ms, (ttft_target_ms, tpot_target_ms)) for p in preds)

    a_in, b_in = within(with_draft), within(without)
    closest = objective == "throughput" and not (a_in or b_in)
    goal = (ttft_target_ms, tpot_target_ms) if closest else None
    a_out, a_req, a_words = _figures(with_draft, output_len, goal)
    b_out, b_req, b_words = _figures(without, output_len, goal)
    targets = f"TTFT <= {ttft_target_ms:g} ms and TPOT <= {tpot_target_ms:g} ms"
    if objective == "throughput" and (a_in or b_in):
        if b_in and not a_in:
            better, how = True, f"only without the draft within {targets}"
        elif a_in and not b_in:
            better, how = False, f"only with the draft within {targets}"
        else:
            ratio = b_out / a_out if a_out > 0 else float("inf")
            better = b_out >= (1 + DRAFT_MARGIN) * a_out
            how = (
                f"output x{ratio:.2f}, {'at least' if better else 'less than'} the {DRAFT_MARGIN:.0%} margin"
            )
    elif closest:
        a_miss, b_miss = miss(with_draft), miss(without)
        better = b_miss <= (1 - DRAFT_MARGIN) * a_miss
        how = (
            f"{b_miss:.1f}x the farther target against {a_miss:.1f}x, {'at least' if better else 'less than'} "
            f"the {DRAFT_MARGIN:.0%} margin closer (neither within {targets})"
        )
    else:
        ratio = b_req / a_req if a_req > 0 else 0.0
        better = b_req <= (1 - DRAFT_MARGIN) * a_req
        how = f"the longest request x{ratio:.2f}, {'at least' if better else 'less than'} the {DRAFT_MARGIN:.0%} margin"
    # under throughput, a plan closer to the targets may not cost more than the margin of output tokens/s
    # (a plan of another shape, one data-parallel server where the draft ran separate ones, can)
    if closest and better and b_out < (1 - DRAFT_MARGIN) * a_out:
        better = False
        how += (
            f", but output x{b_out / a_out:.2f}: more than the margin lost, and the objective is throughput"
        )
    return better, f"predicted without it {b_words} against {a_words} with it ({how})"
