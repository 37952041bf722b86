"""Layout: which GPUs form which instance. GPUs grouped by model (never tensor parallel across
models), the tensor-parallel size per group, groups cut along NUMA nodes, the replica count, the
instances' ports, and each instance's NUMA binding."""

from __future__ import annotations

import dataclasses
import os
from typing import TYPE_CHECKING, Any

from ..config import ConfigError, Source
from ..host.snapshot import Gpu, HostSnapshot
from ..model import ModelFacts
from ..release import first_with, release_of
from .context import PlanContext
from .engine import cuda_total, fit_args, kv_cache_dtype
from .memory import GiB, fit, sequence_bytes
from .reasons import Reasons
from .refusal import PlanRefused
from .tpsplit import tp_ok, tp_refusal

if TYPE_CHECKING:
    from .predict import Prediction

TP_SIZES = (1, 2, 4, 8, 16, 32, 64)
ONE_NODE = "this host has one NUMA node (or none read): binding would change nothing, numactl is not needed"


def layout(
    ctx: PlanContext,
    model: ModelFacts,
    draft: ModelFacts | None,
    spec_method: str | None = None,
    fixed: str = "",
) -> list[tuple[list[Gpu], int]]:
    """``[(gpus, tp), ...]``: one entry per instance, at most ``layout.replicas`` of them. ``fixed``:
    why the planner itself set the layout keys (a plan over several hosts): nothing gives way then."""
    host, settings = ctx.host, ctx.settings
    groups = group_by_model(host.usable_gpus)
    if len(groups) > 1:
        ctx.warn(
            "mixed GPU models: "
            + "; ".join(f"{grp[0].name} x{len(grp)}" for grp in groups)
            + " — planned separately, never tensor parallel across models"
        )
    replicas = settings.layout.replicas
    strategy = settings.layout.strategy
    # A shipped profile's replica count never leaves a GPU idle: its cap gives way to one instance per
    # TP group (the candidates are predicted so); an operator's cap stays (below, with its reason).
    capped = isinstance(replicas, int) and strategy != "single"
    shipped_cap = capped and not fixed and shipped(ctx.reasons, ("layout", "replicas"))
    free = dataclasses.replace(settings, layout=dataclasses.replace(settings.layout, replicas="auto"))
    instances: list[tuple[list[Gpu], int]] = []
    for grp in groups:
        tp = choose_tp(ctx, grp, model, draft, strategy, fixed)
        lay = ctx.on(settings=free) if shipped_cap else ctx
        tp = predicted_tp(lay, grp, model, draft, spec_method, strategy, tp, fixed)
        parts = partition(host, grp, tp, ctx.warnings, nvlink=nvlinked(host, grp))
        instances += [(part, tp) for part in parts]
    if strategy == "single":
        replicas = 1
    if shipped_cap and isinstance(replicas, int) and replicas < len(instances):
        idle = [g.index for gpus, _ in instances[replicas:] for g in gpus]
        ctx.add(
            "layout.replicas",
            len(instances),
            f"the shipped layout.replicas={replicas} ({where(ctx.reasons.provenance.get(('layout', 'replicas')))}) would leave "
            f"GPU(s) {idle} idle, and a shipped value never idles a GPU: {len(instances)} instances, one per "
            f"TP={instances[0][1]} group (--set layout.replicas={replicas} keeps GPU(s) {idle} free)",
            ("layout", "replicas"),
        )
    elif isinstance(replicas, int) and replicas < len(instances):
        idle = [g.index for gpus, _ in instances[replicas:] for g in gpus]
        ctx.add(
            "layout.replicas",
            replicas,
            f"{replicas} instance(s) asked for; GPU(s) {idle} stay free",
            ("layout", "replicas"),
        )
        instances = instances[:replicas]
    elif isinstance(replicas, int) and replicas > len(instances):
        ctx.warn(f"{replicas} replicas asked for, but the GPUs allow {len(instances)}")
    check_ports(ctx, len(instances))
    return instances


def group_by_model(gpus: tuple[Gpu, ...]) -> list[list[Gpu]]:
    """GPUs of one model and memory size together, in first-seen order."""
    groups: dict[tuple[str | None, int], list[Gpu]] = {}
    for g in gpus:
        groups.setdefault((g.name, round((g.memory_total_bytes or 0) / GiB)), []).append(g)
    return list(groups.values())


def nvlinked(host: HostSnapshot, gpus: list[Gpu]) -> bool:
    """Every pair of ``gpus`` linked by NVLink (one GPU: it has active NVLink links)."""
    if len(gpus) < 2:
        return bool(gpus and gpus[0].nvlink_active_links)
    links = host.links()
    for i, a in enumerate(gpus):
        for b in gpus[i + 1 :]:
            lk = links.get((a.index, b.index))
            if not (lk and lk.link and lk.link.startswith("NV")):
                return False
    return True


def refine_fp8(ctx: PlanContext) -> bool:
    """Whether the snapshot's vLLM refines an FP8 MoE's blocks to fit a TP share (unknown: the newest)."""
    return release_of(ctx.version).fp8_moe_refine()


def partition(
    host: HostSnapshot, gpus: list[Gpu], tp: int, warnings: list[str], nvlink: bool = False
) -> list[list[Gpu]]:
    """Split into groups of ``tp``: GPUs of one NUMA node together, best-linked pairs first."""
    by_node: dict[int | None, list[Gpu]] = {}
    for g in sorted(gpus, key=lambda g: (g.numa_node if g.numa_node is not None else -1, g.index)):
        by_node.setdefault(g.numa_node, []).append(g)
    out: list[list[Gpu]] = []
    leftovers: list[Gpu] = []
    for node_gpus in by_node.values():
        while len(node_gpus) >= tp:
            out.append(node_gpus[:tp])
            node_gpus = node_gpus[tp:]
        leftovers += node_gpus
    while len(leftovers) >= tp:
        grp, leftovers = leftovers[:tp], leftovers[tp:]
        if not nvlink:
            warnings.append(
                f"GPUs {[g.index for g in grp]} share a tensor-parallel group across NUMA nodes (over PCIe)"
            )
        out.append(grp)
    if leftovers:
        warnings.append(
            f"GPU(s) {[g.index for g in leftovers]} left idle: not enough GPUs for another TP={tp} group"
        )
    return sorted(out, key=lambda grp: grp[0].index)


def _configured_tp(
    ctx: PlanContext,
    grp: list[Gpu],
    model: ModelFacts,
    want: int,
    usable: list[int],
    nvlink: bool,
    key: tuple[str, str] = ("layout", "tensor_parallel_size"),
    fixed: str = "",
) -> int:
    """The configured tensor-parallel size (``key`` set it: the TP itself, or the strategy that implies
    one), refused where the group or the model's heads cannot take it; a shipped profile's gives way to
    the largest the group and the heads take; an operator's, or one the planner fixed (``fixed``: a
    plan over several hosts), never."""
    said = None
    if want > len(grp):
        why: str | None = f"this host has {len(grp)} {grp[0].name}"
        fits = usable
        refusal = f"tensor_parallel_size={want} needs {want} GPUs of one model; {why}"
        instead = [f"--set layout.tensor_parallel_size={max(usable or [1])}"]
    else:
        why = tp_refusal(model, want, refine_fp8(ctx))
        fits = [t for t in usable if t < want]
        refusal = f"tensor_parallel_size={want} for {model.name}: {why}"
        instead = [f"--set layout.tensor_parallel_size={t}" for t in usable[-2:]]
    if why is not None:
        if not (fits and not fixed and shipped(ctx.reasons, key)):
            raise PlanRefused(refusal, instead)
        value = want if key[1] == "tensor_parallel_size" else ctx.settings.layout.strategy
        src = where(ctx.reasons.provenance.get(key))
        said = f"the shipped {key[1]}={value} ({src}) gives way to {fits[-1]}: {why}"
        ctx.warn(said)
        want = fits[-1]
    if want > ctx.settings.layout.max_pcie_tensor_parallel and not nvlink:
        ctx.warn(
            f"tensor parallel {want} over PCIe: vLLM disables its custom all-reduce beyond 2 GPUs without NVLink"
        )
    ctx.add(
        "tensor_parallel_size",
        want,
        (said or f"tensor parallel {want} as configured") + (" (NVLink)" if nvlink else " (PCIe)"),
        key,
    )
    return want


def _smallest_fitting_tp(
    ctx: PlanContext, grp: list[Gpu], model: ModelFacts, draft: ModelFacts | None, usable: list[int]
) -> int:
    """PCIe: the smallest TP that fits, at most the PCIe cap."""
    settings = ctx.settings
    cap_pcie = settings.layout.max_pcie_tensor_parallel
    gpu = grp[0]
    eager = settings.engine.enforce_eager
    need = settings.engine.min_model_len
    # the KV dtype the instance will get on this GPU (fp8_if_supported is FP8 only with FP8 hardware)
    _, kv_bytes, _ = kv_cache_dtype(settings.engine.kv_cache_dtype, gpu, model)
    for tp in [t for t in usable if t <= cap_pcie]:
        f = fit(
            cuda_total(gpu),
            settings.engine.gpu_memory_utilization,
            model,
            draft,
            tp,
            kv_bytes,
            settings.engine.max_num_batched_tokens,
            settings.engine.max_num_seqs,
            **fit_args(settings, eager, ctx.version, ctx.host.software.kernel_packages),
        )
        if f.fits and f.kv_cache_bytes >= sequence_bytes(model, draft, tp, model.dtype_bytes, need):
            why = "fits on one GPU" if tp == 1 else f"needs {tp} GPUs' memory"
            ctx.add(
                "tensor_parallel_size",
                tp,
                f"{model.name} {why}; PCIe-only GPUs: as little tensor parallelism as fits, the rest become replicas",
                ("layout", "tensor_parallel_size"),
            )
            return tp
    return max([t for t in usable if t <= cap_pcie] or [1])


def choose_tp(
    ctx: PlanContext,
    grp: list[Gpu],
    model: ModelFacts,
    draft: ModelFacts | None,
    strategy: str,
    fixed: str = "",
) -> int:
    """Tensor-parallel size for one group of same-model GPUs: as configured; all of them where
    NVLink joins them; else (PCIe) the smallest that fits, at most ``layout.max_pcie_tensor_parallel``."""
    host, settings = ctx.host, ctx.settings
    want = settings.layout.tensor_parallel_size
    nvlink = nvlinked(host, grp)
    cap_pcie = settings.layout.max_pcie_tensor_parallel
    usable = [t for t in TP_SIZES if t <= len(grp) and tp_ok(model, t, refine_fp8(ctx))]
    key = ("layout", "tensor_parallel_size")
    if strategy == "numa_pairs" and want == "auto":
        want, key = 2, ("layout", "strategy")
    if strategy == "replicas" and want == "auto":
        want, key = 1, ("layout", "strategy")
    if isinstance(want, int):
        return _configured_tp(ctx, grp, model, want, usable, nvlink, key, fixed)
    if nvlink and len(grp) > 1 and strategy in ("auto", "tensor_parallel"):
        tp = max(usable)
        ctx.add(
            "tensor_parallel_size",
            tp,
            f"all {len(grp)} GPUs are NVLink-connected: one tensor-parallel instance over {tp}"
            + _wider_refused(ctx, model, tp, len(grp)),
            ("layout", "tensor_parallel_size"),
        )
        return tp
    if strategy == "tensor_parallel":
        tp = max(usable)
        if tp > cap_pcie:
            ctx.warn(
                f"tensor parallel {tp} over PCIe: vLLM disables its custom all-reduce beyond 2 GPUs without NVLink"
            )
        ctx.add(
            "tensor_parallel_size",
            tp,
            f"strategy tensor_parallel: one instance over {tp} GPUs"
            + _wider_refused(ctx, model, tp, len(grp)),
            ("layout", "strategy"),
        )
        return tp
    return _smallest_fitting_tp(ctx, grp, model, draft, usable)


def _wider_refused(ctx: PlanContext, model: ModelFacts, tp: int, gpus: int) -> str:
    """Why the widest degree the group has is not taken, where vLLM would refuse it ("" otherwise)."""
    wider = max((t for t in TP_SIZES if tp < t <= gpus), default=None)
    why = tp_refusal(model, wider, refine_fp8(ctx)) if wider is not None else None
    return f" (not {wider}: {why})" if why else ""


def _rule_kept_why(
    ctx: PlanContext,
    grp: list[Gpu],
    strategy: str,
    label: str,
    best_tp: int | None,
    rule_tp: int,
    pinned: str,
    fixed: str,
    than: str,
    why: str,
) -> str:
    """Why the configured rule's TP (``label``) stays, and what the prediction (``why``) would choose."""
    configured = ctx.settings.layout.tensor_parallel_size
    head = (
        f"{label}: the shipped layout.tensor_parallel_size={configured} gave way (see tensor_parallel_size)"
        if configured not in ("auto", rule_tp)
        else f"{label} as layout.tensor_parallel_size says"
        if configured != "auto"
        else f"{label} as layout.strategy={strategy} says"
    )
    if len(grp) < 2:
        return f"one GPU: {label}"
    if best_tp is not None and best_tp != rule_tp and pinned:
        whose = "the planner's own layout" if fixed else "an operator's layout never gives way"
        return f"{head} ({pinned}: {whose}); the prediction would choose: {why}"
    if best_tp is not None and best_tp != rule_tp and than:
        return f"{head}; {than}, so the shipped value stays; the prediction would choose: {why}"
    if best_tp is not None and best_tp != rule_tp:
        return f"{head}; the prediction would choose: {why}"
    return f"{head}; the prediction agrees: {why}"


def _prediction_wins(ctx: PlanContext, tp: int, why: str) -> None:
    """The rule's ``tensor_parallel_size`` reason gives way to the prediction's."""
    r = ctx.reasons
    for i in range(len(r.items) - 1, -1, -1):
        if r.items[i].key == "tensor_parallel_size":
            del r.items[i]
            break
    ctx.add("tensor_parallel_size", tp, f"predicted: {why}", ("layout", "objective"))


def _group_batching(ctx: PlanContext, grp: list[Gpu], preds: list[Prediction], tp: int) -> tuple[int, str]:
    """The batching predicted for the chosen TP's candidate, kept for the group's instances: the row
    picked (-1: none) and why."""
    rows = next((p.batching for p in preds if p.tp == tp), [])
    pick, batching_why = predicted_batching(ctx, rows)
    if pick >= 0:
        ctx.reasons.batching[frozenset(g.index for g in grp)] = (
            rows[pick]["max_num_seqs"],
            rows[pick]["max_num_batched_tokens"],
            batching_why,
        )
    return pick, batching_why


def _group_predictions(
    ctx: PlanContext,
    grp: list[Gpu],
    model: ModelFacts,
    draft: ModelFacts | None,
    spec_method: str | None,
    rule_tp: int,
) -> list[Prediction]:
    """Every TP the group and the model's heads allow, predicted at the workload (plan/candidates.py);
    a TP over the PCIe cap without NVLink is predicted but not allowed."""
    from . import candidates

    host, settings, r = ctx.host, ctx.settings, ctx.reasons
    nvlink = nvlinked(host, grp)
    cap = settings.layout.max_pcie_tensor_parallel
    usable = [t for t in TP_SIZES if t <= len(grp) and tp_ok(model, t, refine_fp8(ctx))]
    parts = {t: partition(host, grp, t, [], nvlink=nvlink) for t in usable}
    allowed = {
        t: f"over layout.max_pcie_tensor_parallel ({cap}) without NVLink"
        for t in usable
        if t > cap and not nvlink
    }
    return candidates.predict_group(
        host, parts, model, draft, spec_method, settings, allowed, r.calibration, rule_tp, r.interconnect
    )


def predicted_tp(
    ctx: PlanContext,
    grp: list[Gpu],
    model: ModelFacts,
    draft: ModelFacts | None,
    spec_method: str | None,
    strategy: str,
    rule_tp: int,
    fixed: str = "",
) -> int:
    """Every TP of this group predicted at the workload (plan/candidates.py). Where neither the TP nor
    the strategy is set (both ``auto``), the candidate ``layout.objective`` prefers wins. Where a
    shipped profile (or the schema) fixes them, its TP gives way to a candidate predicted at least
    :data:`LAYOUT_MARGIN` better on the objective (as :func:`predicted_batching` treats the batching);
    where an operator set the TP, the strategy or the replica count, the configured rule's TP stays,
    and the prediction only says what it would have chosen."""
    from . import candidates
    from . import predict as pm

    settings, r = ctx.settings, ctx.reasons
    preds = _group_predictions(ctx, grp, model, draft, spec_method, rule_tp)
    if not preds:
        return rule_tp
    lay = settings.layout
    best, why = pm.choose(preds, lay.objective, lay.ttft_target_ms, lay.tpot_target_ms)
    best_tp = preds[best].tp if best >= 0 else None
    by_prediction = (
        settings.layout.tensor_parallel_size == "auto"
        and strategy == "auto"
        and len(grp) > 1
        and best_tp is not None
    )
    label = next((p.label for p in preds if p.tp == rule_tp), f"TP{rule_tp}")
    rule_pred = next((p for p in preds if p.tp == rule_tp), None)
    pinned = fixed or operator_layout(ctx)
    gives_way, than = False, ""
    if not by_prediction and not pinned and best_tp not in (None, rule_tp) and rule_pred is not None:
        gives_way, than = layout_gain(
            preds[best], rule_pred, lay.objective, (lay.ttft_target_ms, lay.tpot_target_ms)
        )
    if best_tp is not None and ((by_prediction and best_tp != rule_tp) or gives_way):
        if gives_way:
            why = f"{why}; {than}, so the shipped {shipped_layout(ctx)} ({label}) gives way"
        else:
            why = f"{why}; the rule alone would take {label}"
        tp = int(best_tp)
        _prediction_wins(ctx, tp, why)
    elif by_prediction:
        tp = rule_tp
        why = f"{why} (the rule agrees)"
    else:
        tp = rule_tp
        why = _rule_kept_why(ctx, grp, strategy, label, best_tp, rule_tp, pinned, fixed, than, why)
    chosen = next((p.label for p in preds if p.tp == tp), f"TP{tp}")
    ctx.add(f"layout.objective[{','.join(str(g.index) for g in grp)}]", chosen, why, ("layout", "objective"))
    pick, batching_why = _group_batching(ctx, grp, preds, tp)
    how = "prediction" if by_prediction or gives_way else "rule"
    candidates.record(r.predictions, grp, preds, tp, how, best_tp, why, pick, batching_why)
    return tp


# A shipped layout gives way only to a candidate predicted this much better on the objective: the
# model's own error is larger than a few per cent (as batching.BATCHING_MARGIN), an operator's never.
LAYOUT_MARGIN = 0.10
LAYOUT_KEYS = ("tensor_parallel_size", "strategy", "replicas")


def shipped(r: Reasons, key: tuple[str, ...]) -> bool:
    """``key`` holds a shipped profile's value or the schema's (:data:`RULE_KINDS`), not an operator's."""
    src = r.provenance.get(key)
    return src is None or src.kind in RULE_KINDS


def operator_layout(ctx: PlanContext) -> str:
    """The layout keys an operator set to a value other than ``auto`` (a file under the config root,
    --set, the environment, a degrade step), with their sources; "" where none."""
    out = []
    for k in LAYOUT_KEYS:
        v = getattr(ctx.settings.layout, k)
        if v != "auto" and not shipped(ctx.reasons, ("layout", k)):
            out.append(f"layout.{k}={v} set by {ctx.reasons.provenance.get(('layout', k))}")
    return "; ".join(out)


def where(src: Source | None) -> str:
    """A source in words, a shipped profile's file relative to the package (``builtin
    profiles/x.yaml:10``): the reason reads the same on every machine."""
    if src is None:
        return "default"
    if src.kind == "builtin" and src.file:
        return f"builtin profiles/{os.path.basename(src.file)}" + (f":{src.line}" if src.line else "")
    return str(src)


def shipped_layout(ctx: PlanContext) -> str:
    """The shipped layout keys that fix the TP, with their sources (e.g. ``layout.tensor_parallel_size=1
    (builtin profiles/x.yaml:10)``)."""
    lay, provenance = ctx.settings.layout, ctx.reasons.provenance
    keys = [k for k in LAYOUT_KEYS[:2] if getattr(lay, k) != "auto"]
    return ", ".join(f"layout.{k}={getattr(lay, k)} ({where(provenance.get(('layout', k)))})" for k in keys)


def _figure(p: Prediction, by: str, targets: tuple[float, float]) -> str:
    if by == "tpot":
        return f"{p.label}: TPOT {p.tpot_ms:.1f} ms at the workload ({p.source})"
    if by == "closest":
        return (
            f"{p.label}: TTFT {p.ttft_ms:.0f} ms, TPOT {p.tpot_ms:.1f} ms at the workload, "
            f"{_miss(p, targets):.1f}x the farther target ({p.source})"
        )
    if p.capacity_output_tokens_per_s <= 0:
        return f"{p.label}: no load within the targets ({p.source})"
    return f"{p.label}: {p.capacity_output_tokens_per_s:.0f} output tok/s within the targets ({p.source})"


def _miss(p: Prediction, targets: tuple[float, float]) -> float:
    from .predict import target_miss

    return target_miss(p.ttft_ms, p.tpot_ms, targets)


def layout_gain(
    best: Prediction, rule: Prediction, objective: str, targets: tuple[float, float]
) -> tuple[bool, str]:
    """Whether ``best`` (the objective's candidate, :func:`predict.choose`) is predicted at least
    :data:`LAYOUT_MARGIN` better than ``rule`` (the shipped layout's), and both figures with their
    sources, in words. ``throughput``: capacity within the targets (where the winner meets none at any
    load, as :func:`predict.choose` then ranks: how far from ``targets`` (TTFT, TPOT) at the
    workload); ``latency``: the TPOT at the workload. A rule candidate that does not fit or is not
    allowed always gives way."""
    none_within = best.capacity_output_tokens_per_s <= 0
    by = "tpot" if objective == "latency" else "closest" if none_within else "capacity"
    if not rule.fits:
        return (
            True,
            f"{rule.label} is not possible as configured ({rule.why_not}); {_figure(best, by, targets)}",
        )
    if by == "tpot":
        ratio = rule.tpot_ms / best.tpot_ms if best.tpot_ms > 0 else 0.0
        better = best.tpot_ms <= (1 - LAYOUT_MARGIN) * rule.tpot_ms
    elif by == "closest":
        ratio = _miss(rule, targets) / _miss(best, targets)
        better = _miss(best, targets) <= (1 - LAYOUT_MARGIN) * _miss(rule, targets)
    else:
        cap = rule.capacity_output_tokens_per_s
        ratio = best.capacity_output_tokens_per_s / cap if cap > 0 else float("inf")
        better = best.capacity_output_tokens_per_s >= (1 + LAYOUT_MARGIN) * cap
    gain = "" if ratio == float("inf") else f"x{ratio:.2f}, "
    verdict = "at least" if better else "less than"
    return better, (
        f"predicted {_figure(best, by, targets)} against {_figure(rule, by, targets)} "
        f"({gain}{verdict} the {LAYOUT_MARGIN:.0%} margin)"
    )


RULE_KINDS = (
    "builtin",
    "default",
)  # a shipped profile's value or the schema's: the prediction may replace it


def predicted_batching(ctx: PlanContext, rows: list[dict[str, Any]]) -> tuple[int, str]:
    """The batching row ``layout.objective`` takes for the chosen candidate (-1: the configured one
    stays), and why. Only where ``layout.batching`` is ``predicted`` and neither ``max_num_seqs`` nor
    ``max_num_batched_tokens`` was set by an operator (a file under the config root, --set, the
    environment, or a degrade step): a shipped profile's values are rules the prediction may replace."""
    from . import batching

    lay = ctx.settings.layout
    if not rows:
        return -1, "no batching predicted"
    if lay.batching != "predicted":
        return -1, "layout.batching=configured: the configured batching stays"
    for key in (("engine", "max_num_seqs"), ("engine", "max_num_batched_tokens")):
        src = ctx.reasons.provenance.get(key)
        if src is not None and src.kind not in RULE_KINDS:
            return -1, f"engine.{key[1]} is set by {src}: the configured batching stays"
    return batching.choose_batching(
        rows,
        lay.objective,
        lay.ttft_target_ms,
        lay.tpot_target_ms,
        lay.workload_output_len,
        lay.workload_input_len + lay.workload_output_len,
    )


def check_ports(ctx: PlanContext, count: int) -> None:
    """Instances take consecutive ports from server.port: the last must still be a port."""
    first = ctx.settings.server.port
    last = first + count - 1
    if last > 65_535:
        src = ctx.reasons.provenance.get(("server", "port"))
        raise ConfigError(
            f"server.port {first} ({src or 'default'}): {count} instances take ports {first}-{last}, "
            f"and ports end at 65535; set server.port to at most {65_536 - count} "
            "(or plan fewer instances with layout.replicas)"
        )


def numa_binding(ctx: PlanContext, gpus: list[Gpu], key: str, name: str) -> tuple[int | None, str | None]:
    """``(numa node, its cpus)`` an instance is bound to: the node all its GPUs share, else none
    (ranks on several known nodes are bound per rank where vLLM can)."""
    host, settings = ctx.host, ctx.settings
    nodes = {g.numa_node for g in gpus}
    numa = next(iter(nodes)) if len(nodes) == 1 else None
    src = ("layout", "numa_bind")
    if not settings.layout.numa_bind:
        ctx.add(f"{key}.numa_node", None, "NUMA binding is off", src)
        numa = None
    elif len(host.numa_nodes) <= 1:
        ctx.add(f"{key}.numa_node", None, ONE_NODE, src)
        numa = None
    elif numa is None and None not in nodes:
        ctx.add(
            f"{key}.numa_node",
            None,
            f"GPUs {[g.index for g in gpus]} span NUMA nodes {sorted(n for n in nodes if n is not None)}: each rank bound to its own "
            f"GPU's node where vLLM binds per rank ({first_with('--numa-bind-nodes')}+, --numa-bind-nodes), else not bound",
            src,
        )
    elif numa is None:
        ctx.warn(f"{name}: NUMA node unknown or mixed ({sorted(map(str, nodes))}); no binding")
        ctx.add(f"{key}.numa_node", None, "GPUs' NUMA node unknown or not shared: not bound", src)
    else:
        source = min(gpus, key=lambda g: g.memory_total_bytes or 0).numa_node_source
        ctx.add(
            f"{key}.numa_node",
            numa,
            f"GPU(s) {[g.index for g in gpus]} sit on NUMA node {numa}"
            + (f" (from {source})" if source else ""),
            src,
        )
    cpus = next((n.cpus for n in host.numa_nodes if n.id == numa), None) if numa is not None else None
    return numa, cpus
