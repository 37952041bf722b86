"""The planner: host snapshot + typed settings + model facts → a launch plan, every value with its
reason and where it came from.

It probes nothing and reads nothing from the host; the only files it reads are two tables shipped
in the package, each parsed once per process: the GPU datasheet table ``hwprofile/data/gpus.yaml``
(:mod:`.gpufacts`: FP8 support for the KV dtype, bandwidth for the estimate) and the model catalog
``hwprofile/data/models.yaml`` (through :func:`hwprofile.model.catalog_family`: catalog drafts and
the smaller models a refusal suggests).

One module per decision, in the order :func:`build_plan` takes them:

- :mod:`.checkpoint`: which checkpoint (``engine.weights_bits``; the 4-bit retry);
- :mod:`.speculative`: speculation method and draft; per instance, ngram when the draft does not fit;
- :mod:`.loaded`: the weights as vLLM loads them (no vision tower under ``--language-model-only``, the
  MTP layers only with MTP speculation);
- :mod:`.layout`: GPU groups, tensor parallel size, NUMA-aware partition, replicas, ports, NUMA binding;
  where the layout is ``auto``, the candidate ``layout.objective`` prefers (:mod:`.candidates`, every
  TP of a group predicted by :mod:`.predict`, the performance model: TTFT, TPOT, output tokens/s at the
  workload ``layout.workload_*``, from the datasheet, the snapshot's links and a host's calibration);
- :mod:`.gpu`: one GPU instance, from :mod:`.engine` (memory share, KV dtype, eager, context,
  sequences, tokens per step), :mod:`.memory` (the fit) and :mod:`.estimate` (decode ceiling);
- then each GPU instance's own prediction (:func:`.candidates.instance_prediction`);
- :mod:`.cpu`: the CPU instance when no GPU is usable;
- :mod:`.specpath`: a refusal where vLLM would pick another speculative method from a model's path;
- :mod:`.kvpin`: the KV pool pinned in bytes where an earlier start measured it (``supervise.pin_kv_pool``);
- :mod:`.refusal`: :class:`PlanRefused` and what would fit; :mod:`.reasons`: the reasons collector.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from ..config import Source
from ..config.schema import SETTINGS
from ..config.settings import Settings
from ..host.snapshot import Gpu, HostSnapshot
from ..model import ModelFacts
from .candidates import host_fingerprint, instance_prediction, workload
from .checkpoint import (
    calibration_for,
    choose_checkpoint,
    four_bit_fallback,
    model_summary,
    use_four_bit,
)
from .context import PlanContext
from .engine import AVERAGE_FILL
from .gpu import gpu_instance
from .hybridspec import by_load
from .interconnect import Report, by_links, stale
from .interconnect import apply as apply_interconnect
from .layout import RULE_KINDS, TP_SIZES, layout, shipped
from .layout import where as layout_where
from .loaded import as_loaded, loaded_on
from .moetune import moe_tuning
from .predict import Calibration
from .reasons import Reasons
from .refusal import PlanRefused
from .releases import refuse_old_release
from .shape import shape
from .specpath import check as check_speculative_paths
from .speculative import choose_speculator, draft_gain, draft_misses_targets, draft_starves_kv
from .types import ABSENT, Endpoint, HostSummary, InstancePlan, InstancePrediction, Plan, Reason

if TYPE_CHECKING:
    from .kvpin import KvRecord  # imported where supervise.pin_kv_pool is on

__all__ = [
    "AVERAGE_FILL",
    "SCHEMA",
    "TP_SIZES",
    "Calibration",
    "Plan",
    "PlanContext",
    "PlanRefused",
    "Reasons",
    "build_plan",
]

SCHEMA = "hwprofile.plan/1"


def _healthy_hosts(
    host: HostSnapshot, nodes: Sequence[HostSnapshot]
) -> tuple[HostSnapshot, tuple[HostSnapshot, ...], list[Reason], list[str]]:
    """``host`` and the other hosts of a multi-node plan without their faulted GPUs
    (:func:`_without_faulted`), with the reasons and warnings; refused where every GPU is faulted."""
    healthy, fault_reasons, fault_warnings = _without_faulted(host)
    others = []
    for k, node in enumerate(nodes, 1):  # the other hosts of a multi-node plan: their faulted GPUs too
        ok, why, warn = _without_faulted(node, k)
        others.append(ok)
        fault_reasons += why
        fault_warnings += warn
    if host.usable_gpus and not healthy.usable_gpus:
        raise PlanRefused(
            "every GPU reported a hardware fault at detection: " + "; ".join(fault_warnings),
            [
                "reset the GPUs (nvidia-smi -r, a reboot) or replace them, then plan again",
                "`hwprofile doctor` reads the faults live",
            ],
        )
    return healthy, tuple(others), fault_reasons, fault_warnings


def build_plan(
    host: HostSnapshot,
    settings: Settings,
    provenance: Mapping[tuple[str, ...], Source],
    profile: str,
    matched_because: list[str],
    model: ModelFacts,
    draft: ModelFacts | None,
    nodes: Sequence[HostSnapshot] = (),
    addresses: Sequence[str] = (),
    calibration: Calibration | None = None,
    kv_pools: Mapping[str, Sequence[KvRecord]] | None = None,
    interconnect: Report | None = None,
    interconnect_source: str = "interconnect record",
) -> Plan:
    """The plan for ``model`` (and ``draft``, from ``speculative.draft``) on ``host`` (and on
    ``nodes``, the other hosts of a multi-node plan, at ``addresses``: node 0's first); raises
    :class:`PlanRefused` with suggestions when nothing fits. ``provenance``: the layer that set each
    setting the layers set; every other setting is at its declared default (``settings`` holds it).
    ``kv_pools``: the KV pools vLLM measured on earlier starts (:mod:`.kvpin`), where
    ``supervise.pin_kv_pool`` is on: each GPU instance with one recorded is pinned to it.
    ``interconnect``: this host's recorded interconnect check (read from ``interconnect_source`` by
    the pipeline): where it is current (:func:`.interconnect.stale`), its measured link bandwidth
    feeds the predictions and its decision each TP instance (:func:`.interconnect.apply`); a stale
    one is ignored with the reason."""
    current, ic_reason = _current_interconnect(host, interconnect, interconnect_source)
    healthy, others, fault_reasons, fault_warnings = _healthy_hosts(host, nodes)

    build = functools.partial(
        _build_plan,
        healthy,
        provenance=provenance,
        profile=profile,
        matched_because=matched_because,
        model=model,
        draft=draft,
        nodes=others,
        addresses=addresses,
        calibration=calibration,
        interconnect=current,
    )  # the plan for these inputs, at the settings it is given
    try:
        plan = _draft_by_prediction(build(settings), settings, provenance, draft is not None, build)
    except PlanRefused as e:  # with fewer GPUs than the host has: say why they are fewer
        if fault_warnings:
            e.message = f"{e.message} ({'; '.join(fault_warnings)})"
            e.args = (e.message,)
        raise
    if settings.supervise.pin_kv_pool:  # off by default: .kvpin imported where it is on
        from .kvpin import pin as pin_kv_pools

        plan = pin_kv_pools(plan, kv_pools or {})
    plan = _with_faults(plan, fault_reasons, fault_warnings)
    return apply_interconnect(plan, current, interconnect_source, healthy, ic_reason)


def _with_faults(plan: Plan, reasons: list[Reason], warnings: list[str]) -> Plan:
    """``plan`` with the reasons and warnings for the GPUs left out as faulted (:func:`_without_faulted`)."""
    if not reasons:
        return plan
    return dataclasses.replace(
        plan,
        reasons=(*reasons, *plan.reasons),
        warnings=tuple(dict.fromkeys((*warnings, *plan.warnings))),
    )


def _draft_by_prediction(
    plan: Plan,
    settings: Settings,
    provenance: Mapping[tuple[str, ...], Source],
    given: bool,
    build: Callable[[Settings], Plan],
) -> Plan:
    """``plan``, or the plan without speculation where the draft a shipped ``speculative.method: auto``
    chose leaves the workload's requests waiting for KV (:func:`.speculative.draft_starves_kv`) or
    misses the targets at the workload (:func:`.speculative.draft_misses_targets`), and planning
    without it is predicted :data:`.speculative.DRAFT_MARGIN` better on ``layout.objective``
    (:func:`.speculative.draft_gain`); either way a reason says what was predicted. ``given``: the
    operator's own draft, never questioned; nor is a plan over several hosts (not predicted); a degrade
    step's plan is questioned for the KV only."""
    src = provenance.get(("speculative", "method"))
    if (
        given
        or settings.speculative.method != "auto"
        or (src is not None and src.kind not in RULE_KINDS)
        or plan.draft is None
        or plan.nodes > 1
    ):
        return plan
    lay = settings.layout
    where, name = layout_where(src), plan.draft.name
    # a degrade step (the daemon's layer) shrinks the batch below the workload on purpose: the targets it
    # then misses are its own doing, not the draft's (the KV the draft takes is questioned as ever)
    degraded = any(s.kind == "degrade" for s in provenance.values())
    if draft_starves_kv(plan):
        starved = f"the draft {name} leaves the workload's requests waiting for KV (its weights and its KV per token)"
    elif not degraded and (missed := draft_misses_targets(plan, lay.ttft_target_ms, lay.tpot_target_ms)):
        starved = f"with the draft {name} the plan misses the targets at the workload ({missed})"
    else:
        return plan
    off = dataclasses.replace(settings, speculative=dataclasses.replace(settings.speculative, method="none"))
    try:
        alt = build(off)
    except PlanRefused as e:
        return _kept(
            plan, name, f"{starved}; the draft stays: without it the plan is refused ({e.message})", where
        )
    with_draft = [i.prediction for i in plan.instances if isinstance(i.prediction, InstancePrediction)]
    without = [i.prediction for i in alt.instances if isinstance(i.prediction, InstancePrediction)]
    if (not_compared := _not_comparable(plan, alt, with_draft, without)) is not None:
        return _kept(plan, name, f"{starved}; the draft stays: not compared ({not_compared})", where)
    better, why = draft_gain(
        with_draft, without, lay.objective, lay.ttft_target_ms, lay.tpot_target_ms, lay.workload_output_len
    )
    if not better:
        return _kept(plan, name, f"{starved}; the draft stays: {why}", where)
    said = f"off: {starved}; speculative.method=auto ({where}) gives way to no speculation: {why}"
    reasons = tuple(
        Reason(r.key, r.value, said, where) if r.key == "speculative.method" else r for r in alt.reasons
    )
    return dataclasses.replace(alt, reasons=reasons)


def _not_comparable(
    plan: Plan, alt: Plan, with_draft: list[InstancePrediction], without: list[InstancePrediction]
) -> str | None:
    """Why the predictions of ``plan`` (``with_draft``) and of ``alt`` (``without``) cannot be set against
    each other, or None: every instance predicted on both sides, on one basis (:func:`basis`)."""
    if not with_draft or len(with_draft) != len(plan.instances) or len(without) != len(alt.instances):
        return "an instance is not predicted"
    if {basis(p) for p in with_draft} != {basis(p) for p in without}:
        return "one side is calibrated, the other the datasheet's: this host's bench ran another speculation"
    return None


def basis(p: InstancePrediction) -> str:
    """What ``p``'s figures rest on: "calibrated" (this host's bench: measured, or the model scaled by
    it, or a device fitted to it) or "datasheet"; two predictions are compared only on one basis."""
    return "calibrated" if "calibrat" in p.source else "datasheet"


def _kept(plan: Plan, draft: str, why: str, where: str) -> Plan:
    """``plan`` with the reason its ``draft`` stays (``speculative.by_prediction``)."""
    return dataclasses.replace(
        plan, reasons=(*plan.reasons, Reason("speculative.by_prediction", draft, why, where))
    )


def _without_faulted(host: HostSnapshot, node: int = 0) -> tuple[HostSnapshot, list[Reason], list[str]]:
    """``host`` without the GPUs that reported a fatal hardware fault at detection (uncorrectable ECC
    errors, retired pages or remapped rows pending a reset, a failed remap: :attr:`Gpu.faults`), with a
    reason and a warning for each: an instance is not launched onto one to be drained at once.
    ``node``: the host's rank in a multi-node plan (0: this host; the others are named)."""
    bad = {g.index: g.faults for g in host.gpus if not g.lost and g.faults}
    if not bad:
        return host, [], []
    key, who = (f"nodes[{node}].", f"node {node}: ") if node else ("", "")
    reasons = [
        Reason(
            f"{key}gpus[{i}].excluded",
            True,
            f"{who}GPU {i} reported a hardware fault at detection: "
            f"{'; '.join(f)}; not planned for (reset or replace it, then plan again)",
            "snapshot",
        )
        for i, f in sorted(bad.items())
    ]
    warnings = [
        f"{who}GPU {i} is faulted ({', '.join(x.split(':', 1)[0] for x in f)}) and not planned for"
        for i, f in sorted(bad.items())
    ]
    return host._replace(gpus=tuple(g for g in host.gpus if g.index not in bad)), reasons, warnings


def _current_interconnect(
    host: HostSnapshot, report: Report | None, source: str
) -> tuple[Report | None, Reason | None]:
    """``report`` where it still describes ``host``, else None; and the reason saying which (None
    where no check is recorded)."""
    if report is None:
        return None, None
    why = stale(report, host, host_fingerprint(host))
    if why:
        return None, Reason(
            "interconnect.measurement",
            None,
            f"ignored ({why}): the datasheet link is used; run `hwprofile doctor --interconnect` again",
            source,
        )
    at = f" at {report.measured_at}" if report.measured_at else ""
    return report, Reason(
        "interconnect.measurement",
        "measured",
        f"the interconnect check recorded{at} ({report.backend}"
        + (f", driver {report.driver_version}" if report.driver_version else "")
        + "): its measured link bandwidth replaces the datasheet's for the groups it covers",
        source,
    )


def _over_nodes(
    ctx: PlanContext,
    nodes: Sequence[HostSnapshot],
    addresses: Sequence[str],
    model: ModelFacts,
    chosen_draft: ModelFacts | None,
    spec_method: str | None,
) -> tuple[list[InstancePlan], Endpoint]:
    """Several hosts: one vLLM over as many as it needs (plan/nodes.py); its instances and endpoint."""
    from .nodes import plan_nodes  # a plan over several hosts only: imported when one is made

    settings, r = ctx.settings, ctx.reasons
    hosts = [ctx.host, *nodes]
    addrs = list(addresses) or [h.hostname or f"node{i}" for i, h in enumerate(hosts)]

    def one_host(h: HostSnapshot, s: Settings, m: ModelFacts) -> list[InstancePlan]:
        # plan/nodes.py sets the layout keys itself for a group over several hosts: they do not give way
        fixed = "" if s is settings else "the layout of a plan over several hosts (plan/nodes.py)"
        return [i for i, _ in _instances(ctx.on(host=h, settings=s), m, chosen_draft, spec_method, fixed)]

    group = plan_nodes(ctx, hosts, addrs, model, one_host)
    if group[0].nnodes is ABSENT:  # one node fits: that node's plan as it would be alone
        group, endpoint = shape(ctx, group)
        # the last try's candidates per group of GPUs (plan_nodes may have planned node 0 more than once)
        r.predictions[:] = list({(g["gpus"], g["gpu_name"]): g for g in r.predictions}.values())
        return _predicted(ctx, model, chosen_draft, group), endpoint
    r.predictions.clear()  # a group over several nodes: not predicted (its link is in the estimate)
    head = group[0]
    h = addrs[0] if head.server.host in ("0.0.0.0", "", "::", "127.0.0.1") else head.server.host
    endpoint = Endpoint(
        f"http://{h}:{head.server.port}",
        "vllm",
        (head.name,),
        f"node 0's API server in front of {head.nnodes} nodes",
    )
    return group, endpoint


def _four_bit_retry(
    ctx: PlanContext,
    model: ModelFacts,
    draft: ModelFacts | None,
    chosen_draft: ModelFacts | None,
    host_warnings: list[str],
) -> tuple[ModelFacts, list[tuple[InstancePlan, ModelFacts | None]]] | None:
    """The plan with the model's 4-bit checkpoint, where the model refused has one (None: it has none):
    the model as loaded and the instances with their drafts."""
    settings, r = ctx.settings, ctx.reasons
    variant = four_bit_fallback(model, settings, ctx.host.usable_gpus)
    if variant is None:
        return None
    # Start over with the 4-bit checkpoint: the first attempt's reasons and warnings are void.
    r.items.clear()
    r.predictions.clear()
    r.batching.clear()
    ctx.warnings[:] = host_warnings
    model = use_four_bit(model, variant, r)
    _own_calibration(ctx, model)
    # The draft the first attempt chose stays the candidate (the caller's own where it dropped it).
    retry_draft = chosen_draft if chosen_draft is not None else draft
    spec_method, chosen_draft = choose_speculator(ctx, model, retry_draft)
    spec_method, chosen_draft = by_load(ctx, model, spec_method, chosen_draft)
    model = as_loaded(model, settings, spec_method, ctx.version, r, *loaded_on(ctx))
    return model, _instances(ctx, model, chosen_draft, spec_method)


def _own_calibration(ctx: PlanContext, model: ModelFacts) -> None:
    """The calibration the predictions take (``reasons.calibration``): the one handed in where it
    measured ``model``, the checkpoint that runs, or one whose steps cost the same
    (:func:`.checkpoint.calibration_mismatch`); else none, with a reason and a warning: a bench of one
    model says nothing of another's steps (the datasheet predicts; a CPU, nothing)."""
    r = ctx.reasons
    cal = r.calibration = r.offered_calibration
    r.calibration_not_applied = None
    if cal is None:
        return
    operators = not shipped(r, ("speculative", "assumed_acceptance"))
    taken, why = calibration_for(cal, model_summary(model), operators)
    r.calibration = taken
    if taken is not None:
        _say_acceptance(ctx, taken)
        return
    r.calibration_not_applied = f"{cal.path}: {why}"
    again = f"`hwprofile bench --model {model.path or model.name} --calibrate`"
    ctx.add(
        "prediction.calibration",
        None,
        f"{cal.path} not applied: {why}; a bench of one model says nothing of another's steps. "
        f"To calibrate this host for this model: {again}",
    )
    ctx.warn(f"this host's calibration {cal.path} is not applied: {why}; run {again}")


def _say_acceptance(ctx: PlanContext, cal: Calibration) -> None:
    """A reason for the speculative acceptance ``cal`` measured: what an instance speculating by the
    bench's method and draft is predicted at (:func:`.estimate.acceptance_for`), or, where an operator
    set ``speculative.assumed_acceptance`` (``cal.acceptance_applies`` False), that it is not taken."""
    if cal.acceptance is None or cal.speculation is None:
        return
    method, k = cal.speculation
    ran = "its k table" if cal.speculation_table else f"k={k}"
    drafted = f" and {cal.speculation_model}" if cal.speculation_model else ""
    measured = (
        f"this host's bench ({cal.path}, {cal.created or 'undated'}) accepted a mean "
        f"{cal.acceptance_length or 0:.2f} tokens per step with {method}{drafted} at {ran} (vLLM's counters): "
        f"a per-token acceptance of {cal.acceptance:.3f}, on the bench's prompts"
    )
    if not cal.acceptance_applies:
        ctx.add(
            "speculative.assumed_acceptance",
            ctx.settings.speculative.assumed_acceptance,
            f"the operator's; {measured} (not taken: the operator's value stays)",
            ("speculative", "assumed_acceptance"),
        )
        return
    ctx.add(
        "speculative.assumed_acceptance",
        cal.acceptance,
        f"measured, for an instance that speculates by {method}{drafted}: {measured} (set "
        "speculative.assumed_acceptance to plan for other traffic); any other speculation: "
        f"{ctx.settings.speculative.assumed_acceptance}",
    )


def _build_plan(
    host: HostSnapshot,
    settings: Settings,
    provenance: Mapping[tuple[str, ...], Source],
    profile: str,
    matched_because: list[str],
    model: ModelFacts,
    draft: ModelFacts | None,
    nodes: Sequence[HostSnapshot],
    addresses: Sequence[str],
    calibration: Calibration | None,
    interconnect: Report | None = None,
) -> Plan:
    default = Source("default", "schema")
    r = Reasons({p: provenance.get(p, default) for p in SETTINGS})
    r.offered_calibration = calibration
    r.interconnect = interconnect
    host_warnings: list[str] = []
    if any(g.lost for g in host.gpus):
        host_warnings.append(f"GPU(s) {[g.index for g in host.gpus if g.lost]} are lost and not planned for")
    ctx = PlanContext(host, settings, r, list(host_warnings))

    model = choose_checkpoint(model, settings, r)
    _own_calibration(ctx, model)
    refuse_old_release(model, ctx.version, ctx.warn)
    spec_method, chosen_draft = choose_speculator(ctx, model, draft)
    spec_method, chosen_draft = by_load(ctx, model, spec_method, chosen_draft)
    model = as_loaded(model, settings, spec_method, ctx.version, r, *loaded_on(ctx))
    if nodes:  # several hosts: one vLLM over as many as it needs (plan/nodes.py)
        group, endpoint = _over_nodes(ctx, nodes, addresses, model, chosen_draft, spec_method)
        return _assemble(ctx, provenance, profile, matched_because, model, chosen_draft, group, endpoint)
    try:
        planned = _instances(ctx, model, chosen_draft, spec_method)
    except PlanRefused:
        retried = _four_bit_retry(ctx, model, draft, chosen_draft, host_warnings)
        if retried is None:
            raise
        model, planned = retried
    # The top-level draft is the one some instance runs (None when every instance dropped it).
    used_draft = next((d for _, d in planned if d is not None), None)
    instances, endpoint = shape(ctx, [inst for inst, _ in planned])
    instances = _predicted(ctx, model, used_draft, instances)
    return _assemble(ctx, provenance, profile, matched_because, model, used_draft, instances, endpoint)


def _assemble(
    ctx: PlanContext,
    provenance: Mapping[tuple[str, ...], Source],
    profile: str,
    matched_because: list[str],
    model: ModelFacts,
    used_draft: ModelFacts | None,
    instances: list[InstancePlan],
    endpoint: Endpoint,
) -> Plan:
    host, settings, r = ctx.host, ctx.settings, ctx.reasons
    gpus = host.usable_gpus
    # vLLM picks a speculative method from a model's path: the planned one must survive it (.specpath)
    check_speculative_paths(instances, model.path or model.name, r, ctx.version)
    _moe_kernels(ctx, model, instances)
    _power_lever(ctx, instances)
    instances = _custom_all_reduce(ctx, instances)
    return Plan(
        schema=SCHEMA,
        profile=profile,
        matched_because=tuple(matched_because),
        host=HostSummary(hostname=host.hostname, gpus=len(gpus), vllm_version=host.software.vllm_version),
        model=model_summary(model),
        draft=model_summary(used_draft) if used_draft else None,
        instances=tuple(instances),
        supervise=settings.supervise,
        logs=settings.logs,
        watch=settings.watch,
        degrade=settings.degrade,
        reasons=tuple(r.items),
        provenance={".".join(k): str(v) for k, v in sorted(provenance.items())},
        warnings=tuple(dict.fromkeys(ctx.warnings)),  # each once (the nodes of a group plan alike)
        endpoint=endpoint,
        prediction=_prediction_summary(ctx),
    )


def _custom_all_reduce(ctx: PlanContext, instances: list[InstancePlan]) -> list[InstancePlan]:
    """Each tensor-parallel GPU instance on this host: vLLM's custom all-reduce only over NVLink or P2P
    (.interconnect.by_links); where it cannot run, the instance's ``interconnect`` asks render for
    ``--disable-custom-all-reduce``. A group over several hosts is left to vLLM."""
    out = []
    for i, inst in enumerate(instances):
        if str(inst.device) != "cuda" or int(inst.tensor_parallel_size) < 2 or inst.nnodes is not ABSENT:
            out.append(inst)
            continue
        on, why, record = by_links(ctx.host, inst)
        ctx.add(f"instances[{i}].custom_all_reduce", on, why)
        out.append(dataclasses.replace(inst, interconnect=record) if record is not None else inst)
    return out


def _power_lever(ctx: PlanContext, instances: list[InstancePlan]) -> None:
    """What the daemon's first degrade step does on this host's GPUs: their power limit lowered."""
    host, settings = ctx.host, ctx.settings
    gpus = {g.index: g for g in host.usable_gpus}
    used = sorted({g for i in instances if str(i.device) == "cuda" for g in (i.gpus or ())})
    if not used:
        return
    f = settings.degrade.power_limit_factor
    if f <= 0:
        ctx.add(
            "degrade.power_limit_factor",
            f,
            "0: a hot card goes straight to the batch steps (the power limit is left alone)",
            ("degrade", "power_limit_factor"),
        )
        return
    each = sorted({(gpus[g].name, gpus[g].power_limit_watts) for g in used if g in gpus}, key=str)
    limits = "; ".join(
        f"{name}: {w:.0f} -> {w * f:.0f} W" if w else f"{name}: limit not read" for name, w in each
    )
    ctx.add(
        "degrade.power_limit_factor",
        f,
        f"a hot (not critical) card's power limit is lowered first ({limits}; "
        f"never below the card's minimum, which the daemon reads from NVML; root only), the batch steps after "
        f"degrade.power_limit_hold_s {settings.degrade.power_limit_hold_s:g} s if it is still hot; restored on "
        "recover and on exit",
        ("degrade", "power_limit_factor"),
    )


def _moe_kernels(ctx: PlanContext, model: ModelFacts, instances: list[InstancePlan]) -> None:
    """For a MoE model: the fused-MoE config vLLM will look up on each instance's GPU at its TP, whether
    the release (or VLLM_TUNED_CONFIG_FOLDER) has it, and the command that tunes it when not (.moetune)."""
    host = ctx.host
    said: set[str] = set()
    for i, inst in enumerate(instances):
        t = moe_tuning(
            model,
            inst.gpu_name,
            int(inst.tensor_parallel_size),
            str(inst.device),
            host.software,
            model.path or model.name,
        )
        if t is None:
            return
        state = {True: "tuned", False: "NOT tuned", None: "unknown"}[t.tuned]
        ctx.add(
            f"instances[{i}].kernels.fused_moe_config",
            t.file_name,
            f"{state}: {t.reason}" + (f"; to tune: {t.command}" if t.command and t.tuned is not True else ""),
        )
        if t.tuned is False and t.file_name not in said:
            said.add(t.file_name or "")
            ctx.warn(
                f"MoE kernel not tuned for {inst.gpu_name} at TP {inst.tensor_parallel_size}: {t.file_name} is "
                f"not shipped with vLLM {host.software.vllm_version} (default config: up to ~2x slower). "
                f"Tune it: {t.command}"
            )


def _speculation_pays(
    ctx: PlanContext,
    i: int,
    inst: InstancePlan,
    p: InstancePrediction,
    model: ModelFacts,
    total: int,
    rule_tp: int,
) -> None:
    """A hybrid that speculates: say whether speculation is predicted to pay here (its state cost is
    said in speculative.state_cost), against the same instance predicted without it."""
    r = ctx.reasons
    spec = inst.speculative
    assert spec is not None
    plain = instance_prediction(
        ctx.host,
        dataclasses.replace(inst, speculative=None),
        total,
        model,
        None,
        ctx.settings,
        r.calibration,
        rule_tp,
        r.interconnect,
    )
    if plain is None:
        return
    if basis(p) != basis(plain):  # the bench measured one of the two: not set against the other's model
        ctx.add(
            f"instances[{i}].speculative.predicted",
            None,
            f"{spec.method} k={spec.num_speculative_tokens}: not compared with no speculation (one is "
            f"calibrated, the other the datasheet's: this host's bench ran one of them)",
        )
        return
    pays = p.tpot_ms < plain.tpot_ms
    ctx.add(
        f"instances[{i}].speculative.predicted",
        pays,
        f"{spec.method} k={spec.num_speculative_tokens}: TPOT {p.tpot_ms:.1f} ms "
        f"predicted with it, {plain.tpot_ms:.1f} ms without, at {p.concurrency} request(s) in flight"
        + (
            ""
            if pays
            else " (it does not pay here: its draft steps read the MTP layer and the LM "
            "head each; set speculative.method=none or a smaller speculative.num_speculative_tokens)"
        ),
    )
    if not pays:
        ctx.warn(
            f"{inst.name}: {spec.method} speculation is predicted slower than none "
            f"(TPOT {p.tpot_ms:.1f} vs {plain.tpot_ms:.1f} ms)"
        )


def _predicted(
    ctx: PlanContext, model: ModelFacts, draft: ModelFacts | None, instances: list[InstancePlan]
) -> list[InstancePlan]:
    """Each GPU instance with its predicted TTFT, TPOT and output tokens/s at the workload; on a hybrid
    that speculates, whether speculation is predicted to pay (a reason; a warning where it does not)."""
    host, settings, r = ctx.host, ctx.settings, ctx.reasons
    total = sum(i.ranks for i in instances)
    rule_tp = instances[0].tensor_parallel_size if instances else 1
    out = []
    for i, inst in enumerate(instances):
        p = instance_prediction(
            host,
            inst,
            total,
            model,
            draft if inst.speculative else None,
            settings,
            r.calibration,
            rule_tp,
            r.interconnect,
        )
        if p is not None and inst.speculative is not None and inst.memory.state_sequences is not ABSENT:
            _speculation_pays(ctx, i, inst, p, model, total, rule_tp)
        out.append(dataclasses.replace(inst, prediction=p) if p is not None else inst)
    return out


def _prediction_summary(ctx: PlanContext) -> dict[str, Any]:
    host, lay, r = ctx.host, ctx.settings.layout, ctx.reasons
    cal = r.calibration
    return {
        "workload": workload(ctx.settings).to_json(),
        "objective": lay.objective,
        "ttft_target_ms": lay.ttft_target_ms,
        "tpot_target_ms": lay.tpot_target_ms,
        "calibration": {
            "fingerprint": host_fingerprint(host),
            "path": cal.path if cal else None,
            "created": cal.created if cal else None,
            "not_applied": r.calibration_not_applied,
        },
        "groups": tuple(r.predictions),
    }


def _instances(
    ctx: PlanContext, model: ModelFacts, draft: ModelFacts | None, spec_method: str | None, fixed: str = ""
) -> list[tuple[InstancePlan, ModelFacts | None]]:
    """``[(instance, the draft it runs), ...]``: the GPU layout's instances, else the CPU one (``fixed``:
    why the layout keys are the planner's own, plan/layout.py)."""
    host, settings = ctx.host, ctx.settings
    if not host.usable_gpus:
        # layout.replicas on a CPU host: that many CPU servers (or data-parallel ranks, by layout.shape)
        n = settings.layout.replicas if isinstance(settings.layout.replicas, int) else 1
        if n > 1:
            ctx.add("layout.replicas", n, f"{n} CPU instances asked for", ("layout", "replicas"))
        from .cpu import cpu_instance  # a CPU host's step only: imported when one is planned

        return [(cpu_instance(ctx, model, draft, spec_method, i, n), draft) for i in range(n)]
    groups = layout(ctx, model, draft, spec_method, fixed)

    def batching(
        gpus: list[Gpu],
    ) -> tuple[int, int, str] | None:  # what layout.objective chose for their group
        return next((b for grp, b in ctx.reasons.batching.items() if gpus[0].index in grp), None)

    return [
        gpu_instance(ctx, i, gpus, tp, model, draft, spec_method, batching(gpus))
        for i, (gpus, tp) in enumerate(groups)
    ]
